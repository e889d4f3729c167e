//! With `threads: 1` oneDNN starts no OpenMP workers, however many std threads
//! call it; with `threads: 2` it does. (Own test binary: it counts this
//! process's OS threads, which other tests running alongside would disturb.)

mod common;

use std::sync::Arc;

use common::data;
use onednn::{DataType, Engine, MatMul, MatMulSpec};

fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

fn layer(threads: usize) -> (MatMul, Vec<f32>) {
    let (m, k, n) = (512, 256, 256);
    let spec = MatMulSpec {
        k,
        n,
        data_type: DataType::F32,
        dst_type: DataType::F32,
        post_ops: vec![],
        threads,
    };
    let mm = MatMul::new(&Engine::cpu().unwrap(), spec, &data(n * k, 1), None, m).unwrap();
    (mm, data(m * k, 2))
}

#[test]
fn single_threaded_calls_start_no_openmp_workers() {
    if onednn::version().cpu_runtime != 2 {
        println!(
            "SKIP: libdnnl is not built with OpenMP (cpu runtime {})",
            onednn::version().cpu_runtime
        );
        return;
    }
    let (mm, x) = layer(1);
    let mm = Arc::new(mm);
    let x = Arc::new(x);
    let base = os_threads();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (mm, x) = (Arc::clone(&mm), Arc::clone(&x));
            std::thread::spawn(move || {
                let mut y = vec![0f32; 512 * 256];
                let mut most = 0;
                for _ in 0..20 {
                    mm.execute(&x[..], &mut y, None).unwrap();
                    most = most.max(os_threads());
                }
                most
            })
        })
        .collect();
    let most = workers
        .into_iter()
        .map(|w| w.join().unwrap())
        .max()
        .unwrap();
    println!("threads: {base} before, at most {most} while 2 std threads ran threads=1 GEMMs");
    assert!(
        most <= base + 2,
        "OpenMP workers appeared: {base} -> {most}"
    );

    // The same layer with 2 threads, called from this thread, does start a worker
    // (if the machine has 2 cores for libgomp to use).
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let (mm2, x2) = layer(2);
        let mut y = vec![0f32; 512 * 256];
        mm2.execute(&x2, &mut y, None).unwrap();
        let after = os_threads();
        println!("threads after a threads=2 GEMM: {after}");
        assert!(
            after > base,
            "a threads=2 GEMM started no OpenMP worker ({base} -> {after})"
        );
    }
}
