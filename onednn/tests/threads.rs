//! One primitive executed from several threads at once gives what one thread gives.
//!
//! Per-thread thread counts stay per thread.

mod common;

use std::sync::Arc;

use common::data;
use onednn::{max_threads, DataType, Engine, MatMul, MatMulSpec, PostOp, ThreadScope};

#[test]
fn concurrent_execute_matches_single_thread() {
    concurrent_execute_matches_single_caller(1);
}

#[test]
fn concurrent_execute_with_openmp_teams_matches_single_thread() {
    // Each caller gets its own 2-thread OpenMP team.
    concurrent_execute_matches_single_caller(2);
}

fn concurrent_execute_matches_single_caller(threads: usize) {
    let engine = Engine::cpu().unwrap();
    let (k, n) = (64, 96);
    let w = data(n * k, 1);
    let b = data(n, 2);
    let spec = MatMulSpec {
        k,
        n,
        data_type: DataType::F32,
        dst_type: DataType::F32,
        post_ops: vec![PostOp::BinaryAdd, PostOp::Relu],
        threads,
    };
    let mm = Arc::new(MatMul::new(&engine, spec, &w, Some(&b), 128).unwrap());
    // Different M per thread (thread-per-block with ragged last blocks), and
    // two threads sharing an M so the same cached primitive runs concurrently.
    let ms = [128usize, 128, 64, 200];
    let inputs: Vec<(Vec<f32>, Vec<f32>)> = ms
        .iter()
        .enumerate()
        .map(|(i, &m)| (data(m * k, 10 + i as u64), data(m * n, 20 + i as u64)))
        .collect();
    let single: Vec<Vec<f32>> = ms
        .iter()
        .zip(&inputs)
        .map(|(&m, (x, r))| {
            let mut y = vec![0f32; m * n];
            mm.execute(x, &mut y, Some(r)).unwrap();
            y
        })
        .collect();

    let inputs = Arc::new(inputs);
    let handles: Vec<_> = ms
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            let mm = Arc::clone(&mm);
            let inputs = Arc::clone(&inputs);
            std::thread::spawn(move || {
                let (x, r) = &inputs[i];
                let mut y = vec![0f32; m * n];
                let mut first: Option<Vec<f32>> = None;
                for _ in 0..100 {
                    mm.execute(x, &mut y, Some(r)).unwrap();
                    match &first {
                        None => first = Some(y.clone()),
                        Some(f) => assert!(
                            agree(f, &y, threads),
                            "thread {i}: results changed between runs"
                        ),
                    }
                }
                y
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let y = h.join().expect("worker panicked");
        assert!(
            agree(&y, &single[i], threads),
            "thread {i} (m = {}) differs from the single-thread result",
            ms[i]
        );
    }
}

/// With one oneDNN thread per call the kernels are deterministic, so results
/// must be bit-identical; with a team, a K split could in principle sum in
/// another order, so allow f32 rounding.
fn agree(a: &[f32], b: &[f32], threads: usize) -> bool {
    if threads == 1 {
        a == b
    } else {
        common::max_abs_diff(a, b) < 1e-5
    }
}

#[test]
fn thread_scope_is_per_thread_and_restores() {
    let openmp = onednn::version().cpu_runtime == 2;
    // A fresh std thread starts from the process-wide default (OMP_NUM_THREADS or the core count).
    let before = max_threads();
    {
        let _scope = ThreadScope::new(before + 1);
        if openmp {
            assert_eq!(max_threads(), before + 1);
        }
        let other = std::thread::spawn(max_threads).join().unwrap();
        assert_eq!(other, before, "another thread's count changed");
    }
    assert_eq!(max_threads(), before);
}
