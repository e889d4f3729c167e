//! Prints this machine's oneDNN GEMM rate at 1 and 2 threads: `dnnl_sgemm`,
//! and this crate's pre-packed `MatMul` in f32 (and bf16 where the CPU has it).
//!
//! `cargo run --release -p onednn --example sgemm_rate [threads...]`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: Vec<usize> = match std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<Vec<_>, _>>()?
    {
        t if t.is_empty() => vec![1, 2],
        t => t,
    };
    let v = onednn::version();
    let (m, k, n) = onednn::RATE_SHAPE;
    println!(
        "oneDNN {}.{}.{} (cpu runtime {}), isa {}, bf16 native: {}; problem {m}x{k}x{n}",
        v.major,
        v.minor,
        v.patch,
        v.cpu_runtime,
        onednn::effective_isa(),
        onednn::bf16_supported()
    );
    for &t in &threads {
        let sgemm = onednn::sgemm_rate(t)?;
        let matmul = onednn::matmul_rate(t, onednn::DataType::F32)?;
        print!(
            "threads {t}: sgemm {sgemm:.1} GFLOP/s, matmul f32 {matmul:.1} GFLOP/s ({:.2}x sgemm)",
            matmul / sgemm
        );
        if onednn::bf16_supported() {
            let bf16 = onednn::matmul_rate(t, onednn::DataType::Bf16)?;
            print!(
                ", matmul bf16 {bf16:.1} GFLOP/s ({:.2}x sgemm)",
                bf16 / sgemm
            );
        }
        println!();
    }
    Ok(())
}
