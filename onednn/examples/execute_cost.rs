//! Per-call cost of `MatMul::execute` on small blocks (thread-per-block sizes),
//! against a peer measured in the same run: the same layer at M = 1024, where
//! fixed per-call costs are amortised. The k = n = 8, M = 1 row is almost
//! pure per-call overhead (wrapper + oneDNN dispatch).
//!
//! `cargo run --release -p onednn --example execute_cost`

use std::time::Instant;

use onednn::{DataType, Engine, MatMul, MatMulSpec, PostOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = Engine::cpu()?;
    for &(k, n) in &[(8usize, 8usize), (64, 64), (64, 256), (640, 640)] {
        let spec = MatMulSpec {
            k,
            n,
            data_type: DataType::F32,
            dst_type: DataType::F32,
            post_ops: vec![PostOp::BinaryAdd],
            threads: 1,
        };
        let w: Vec<f32> = (0..n * k).map(|i| (i % 13) as f32 * 0.01).collect();
        let b: Vec<f32> = vec![0.1; n];
        let mm = MatMul::new(&engine, spec, &w, Some(&b), 64)?;
        let mut rates = Vec::new();
        for m in [if k == 8 { 1 } else { 64usize }, 1024] {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
            let r = vec![0.5f32; m * n];
            let mut y = vec![0f32; m * n];
            mm.execute(&x, &mut y, Some(&r))?;
            let iters = (2e9 / (2.0 * (m * k * n) as f64)).clamp(10.0, 20000.0) as usize;
            let t = Instant::now();
            for _ in 0..iters {
                mm.execute(&x, &mut y, Some(&r))?;
            }
            let per_call = t.elapsed().as_secs_f64() / iters as f64;
            let gflops = 2.0 * (m * k * n) as f64 / per_call / 1e9;
            println!(
                "k {k:4} n {n:4} m {m:5}: {:8.2} us/call, {gflops:6.1} GFLOP/s, impl {}",
                per_call * 1e6,
                mm.prepare(m)?
            );
            rates.push(gflops);
        }
        println!(
            "  small-M efficiency vs M=1024: {:.2}x",
            rates[0] / rates[1]
        );
    }
    Ok(())
}
