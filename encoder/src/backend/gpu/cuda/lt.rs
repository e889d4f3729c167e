//! cuBLASLt GEMMs with fused epilogues: a plan per shape, its algorithm timed among candidates.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result as ltr;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{sys as drv, CudaSlice, CudaStream, DevicePtr};

use super::context::probe;
use super::CudaDevice;
use crate::backend::gpu::Device;

/// cuBLASLt's handle, its workspace, and a plan per GEMM shape.
///
/// Written on cudarc's raw cuBLASLt calls rather than its `Matmul` trait,
/// which takes one element type for A, B, C and the bias: here A and B are
/// bf16, C bf16 or f32, and the bias stays f32 (rounding it to bf16 would
/// change the bits against `bias_epilogue`).
pub(super) struct Lt {
    pub(super) handle: lt::cublasLtHandle_t,
    pub(super) workspace: CudaSlice<u8>,
    /// By shape; `None`: cuBLASLt has no algorithm for it (asked once).
    pub(super) plans: Mutex<HashMap<LtKey, Option<LtPlan>>>,
    /// The algorithm timing kept, by shape class ([`LtKey::class`]): a
    /// chunk of another size in the class (a window's last, say) takes it
    /// if cuBLASLt accepts it for its shape, instead of timing again (each
    /// timing waits for the GPU, draining the chunks queued ahead).
    pub(super) timed: Mutex<HashMap<LtKey, lt::cublasLtMatmulAlgo_t>>,
}

impl LtKey {
    /// Shapes that share a timed algorithm: the same but for `n` (a
    /// chunk's rows), which is rounded up to a power of two.
    pub(super) fn class(&self) -> LtKey {
        LtKey {
            n: self.n.next_power_of_two(),
            ..*self
        }
    }
}

// SAFETY: the handle and the plans' descriptors are host objects used
// under the model's lock (one caller at a time) and the plans' mutex.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct LtKey {
    pub(super) trans_a: bool,
    pub(super) trans_b: bool,
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) lda: usize,
    pub(super) ldb: usize,
    pub(super) ldc: usize,
    pub(super) out_bf16: bool,
    pub(super) relu: bool,
    /// The bias in bf16 (else f32).
    pub(super) bias_bf16: bool,
    /// C (beta 1) is a residual added to the product, D another buffer.
    pub(super) residual: bool,
}

/// A matmul descriptor with its epilogue, the three layouts and the
/// algorithm for them: cuBLASLt's heuristic's first, until the first call
/// times its candidates and keeps the fastest.
pub(super) struct LtPlan {
    pub(super) desc: lt::cublasLtMatmulDesc_t,
    pub(super) a: lt::cublasLtMatrixLayout_t,
    pub(super) b: lt::cublasLtMatrixLayout_t,
    pub(super) c: lt::cublasLtMatrixLayout_t,
    pub(super) algo: lt::cublasLtMatmulAlgo_t,
    /// The heuristic's candidates, best first by its estimate, still to be
    /// timed (empty once timed, or with one candidate or tuning off).
    pub(super) candidates: Vec<lt::cublasLtMatmulAlgo_t>,
    /// The heuristic's own first pick where `algo` is another (its class's
    /// timed algorithm, or a timed candidate): tried once before a call
    /// the algorithm is refused for sends the shape unfused.
    pub(super) fallback: Option<lt::cublasLtMatmulAlgo_t>,
}

/// Candidates asked of cuBLASLt's heuristic per GEMM shape. Its first pick
/// ran the Large model's GEMMs at about 550 TFLOP/s on an H200 where
/// cuBLAS reaches 660-760 at these shapes; timing a few on the real
/// buffers, once per shape, is how PyTorch's TunableOp closes such gaps.
const LT_CANDIDATES: usize = 8;

/// Timed calls per candidate (after one untimed).
const LT_TIMED_RUNS: usize = 3;

/// A candidate replaces the heuristic's pick only below this share of its
/// time.
const LT_CLEAR_GAIN: f32 = 0.95;

/// What the timing of each shape's candidates found, for the encode's
/// report ([`gemm_tuning_report`]).
pub(super) static TUNING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// One line per GEMM shape whose cuBLASLt candidates were timed in this
/// process: the heuristic's first pick's time and the one kept.
pub fn gemm_tuning_report() -> Vec<String> {
    TUNING.lock().map(|t| t.clone()).unwrap_or_default()
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: created by `Lt::plan`, destroyed once, here.
        unsafe {
            let _ = ltr::destroy_matrix_layout(self.a);
            let _ = ltr::destroy_matrix_layout(self.b);
            let _ = ltr::destroy_matrix_layout(self.c);
            let _ = ltr::destroy_matmul_desc(self.desc);
        }
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        if let Ok(mut plans) = self.plans.lock() {
            plans.clear();
        }
        // SAFETY: created in `Lt::new`, destroyed once, here.
        let _ = unsafe { ltr::destroy_handle(self.handle) };
    }
}

/// Hopper wants 32 MiB of workspace for its best cuBLASLt kernels.
pub(super) const LT_WORKSPACE: usize = 32 << 20;

impl Lt {
    pub(super) fn new(stream: &Arc<CudaStream>) -> std::result::Result<Self, String> {
        // An operator's way back to the unfused path, should a cuBLASLt
        // version misbehave.
        if std::env::var_os("FLOTILLA_CUDA_UNFUSED").is_some() {
            return Err("FLOTILLA_CUDA_UNFUSED is set".into());
        }
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { lt::is_culib_present() } {
            return Err("libcublasLt did not load".into());
        }
        let handle = ltr::create_handle().map_err(|e| format!("cublasLtCreate: {e:?}"))?;
        // SAFETY: a workspace cuBLASLt may overwrite as it likes.
        let workspace = unsafe { stream.alloc::<u8>(LT_WORKSPACE) }
            .map_err(|e| format!("cuBLASLt workspace: {e:?}"))?;
        Ok(Lt {
            handle,
            workspace,
            plans: Mutex::new(HashMap::new()),
            timed: Mutex::new(HashMap::new()),
        })
    }

    /// Descriptor, layouts and algorithm for `key`, the bias at `bias`
    /// (the heuristic sees its alignment); `Err` when cuBLASLt has none.
    pub(super) fn plan(
        &self,
        key: &LtKey,
        bias: u64,
    ) -> std::result::Result<LtPlan, lt::cublasStatus_t> {
        let status = |e: ltr::CublasError| e.0;
        let bf16 = lt::cudaDataType_t::CUDA_R_16BF;
        let f32t = lt::cudaDataType_t::CUDA_R_32F;
        let dims = |trans: bool, rows: usize, cols: usize| {
            if trans {
                (cols as u64, rows as u64)
            } else {
                (rows as u64, cols as u64)
            }
        };
        let (ar, ac) = dims(key.trans_a, key.m, key.k);
        let (br, bc) = dims(key.trans_b, key.k, key.n);
        let desc = ltr::create_matmul_desc(lt::cublasComputeType_t::CUBLAS_COMPUTE_32F, f32t)
            .map_err(status)?;
        let mut plan = LtPlan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            algo: lt::cublasLtMatmulAlgo_t { data: [0; 8] },
            candidates: Vec::new(),
            fallback: None,
        };
        plan.a = ltr::create_matrix_layout(bf16, ar, ac, key.lda as i64).map_err(status)?;
        plan.b = ltr::create_matrix_layout(bf16, br, bc, key.ldb as i64).map_err(status)?;
        let out = if key.out_bf16 { bf16 } else { f32t };
        plan.c = ltr::create_matrix_layout(out, key.m as u64, key.n as u64, key.ldc as i64)
            .map_err(status)?;
        let epilogue = if key.relu {
            lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS
        } else {
            lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
        };
        // cublasOperation_t: 0 = N, 1 = T.
        let op = |t: bool| i32::from(t);
        // SAFETY: each attribute gets a value of its documented type and size.
        unsafe {
            set_attr(
                plan.desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSA,
                &op(key.trans_a),
            )?;
            set_attr(
                plan.desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSB,
                &op(key.trans_b),
            )?;
            set_attr(plan.desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
            let bias_type = if key.bias_bf16 { bf16 } else { f32t };
            set_attr(
                plan.desc,
                Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                &bias_type,
            )?;
            set_attr(plan.desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
        }
        let pref = ltr::create_matmul_pref().map_err(status)?;
        // SAFETY: as above; the preference is destroyed right after.
        let found = unsafe {
            let size = LT_WORKSPACE;
            ltr::set_matmul_pref_attribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&size) as *const usize as *const _,
                std::mem::size_of::<usize>(),
            )
            .map_err(status)
            .and_then(|()| {
                // SAFETY: all-zero bits are a valid (empty) result, and
                // cuBLASLt writes at most LT_CANDIDATES of them.
                let mut results =
                    vec![std::mem::zeroed::<lt::cublasLtMatmulHeuristicResult_t>(); LT_CANDIDATES];
                let mut count: std::ffi::c_int = 0;
                let code = lt::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.c,
                    plan.c,
                    pref,
                    LT_CANDIDATES as std::ffi::c_int,
                    results.as_mut_ptr(),
                    &mut count,
                );
                if code != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                    return Err(code);
                }
                results.truncate(usize::try_from(count).unwrap_or(0));
                Ok(results)
            })
        };
        // SAFETY: created above, not used again.
        let _ = unsafe { ltr::destroy_matmul_pref(pref) };
        let algos: Vec<_> = found?
            .into_iter()
            .filter(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        let Some(first) = algos.first() else {
            return Err(lt::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED);
        };
        plan.algo = *first;
        // An operator's way to the heuristic's pick alone.
        if algos.len() < 2 || std::env::var_os("FLOTILLA_CUDA_NO_GEMM_TUNING").is_some() {
            return Ok(plan);
        }
        let timed = self
            .timed
            .lock()
            .ok()
            .and_then(|t| t.get(&key.class()).copied());
        match timed {
            // Timed for its class: that algorithm, if it suits this shape
            // (else the heuristic's first; no second timing).
            Some(algo) => {
                // SAFETY: an all-zero result is valid for cuBLASLt to fill.
                let mut result =
                    unsafe { std::mem::zeroed::<lt::cublasLtMatmulHeuristicResult_t>() };
                // SAFETY: live descriptors; `algo` came from the heuristic
                // for a shape of this class.
                let ok = unsafe {
                    lt::cublasLtMatmulAlgoCheck(
                        self.handle,
                        plan.desc,
                        plan.a,
                        plan.b,
                        plan.c,
                        plan.c,
                        &algo,
                        &mut result,
                    )
                };
                if ok == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && result.workspaceSize <= LT_WORKSPACE
                    && algo.data != first.data
                {
                    plan.fallback = Some(*first);
                    plan.algo = algo;
                }
            }
            None => plan.candidates = algos,
        }
        Ok(plan)
    }
}

pub(super) type Attr = lt::cublasLtMatmulDescAttributes_t;

/// Set one attribute of a matmul descriptor to `value`.
///
/// # Safety
/// `T` is the attribute's documented type.
pub(super) unsafe fn set_attr<T>(
    desc: lt::cublasLtMatmulDesc_t,
    attr: Attr,
    value: &T,
) -> std::result::Result<(), lt::cublasStatus_t> {
    // SAFETY: the caller's; the value is read during the call only.
    unsafe {
        ltr::set_matmul_desc_attribute(
            desc,
            attr,
            value as *const T as *const _,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| e.0)
}

impl CudaDevice {
    /// The fastest of `candidates` for `key`'s GEMM, each called by `run`
    /// once untimed and [`LT_TIMED_RUNS`] times between two events on the
    /// stream (a candidate that fails is passed over); `None` if none ran
    /// or the events failed. Reports to [`TUNING`].
    pub(super) fn fastest(
        &self,
        key: &LtKey,
        candidates: &[lt::cublasLtMatmulAlgo_t],
        run: &dyn Fn(&lt::cublasLtMatmulAlgo_t) -> std::result::Result<(), lt::cublasStatus_t>,
    ) -> Option<lt::cublasLtMatmulAlgo_t> {
        let ctx = self.stream.context();
        let timing = Some(drv::CUevent_flags::CU_EVENT_DEFAULT);
        let (start, end) = (ctx.new_event(timing).ok()?, ctx.new_event(timing).ok()?);
        let mut times = Vec::with_capacity(candidates.len());
        for (i, algo) in candidates.iter().enumerate() {
            if run(algo).is_err() {
                continue;
            }
            start.record(&self.stream).ok()?;
            let ran = (0..LT_TIMED_RUNS).all(|_| run(algo).is_ok());
            end.record(&self.stream).ok()?;
            let ms = start.elapsed_ms(&end).ok()?;
            if ran {
                times.push((i, ms / LT_TIMED_RUNS as f32));
            }
        }
        let &(mut best, mut best_ms) = times.iter().min_by(|x, y| x.1.total_cmp(&y.1))?;
        let first_ms = times.iter().find(|(i, _)| *i == 0).map(|&(_, ms)| ms);
        // Another than the heuristic's pick only for a clear gain: which of
        // two algorithms within timing noise wins would change from run to
        // run, and with it the bits (another summation order).
        if let Some(f) = first_ms.filter(|&f| best_ms > f * LT_CLEAR_GAIN) {
            (best, best_ms) = (0, f);
        }
        let first = first_ms.map_or("failed".to_string(), |ms| format!("{ms:.3} ms"));
        if let Ok(mut t) = TUNING.lock() {
            t.push(format!(
                "cuBLASLt {}x{}x{}{}{}: heuristic's first {first}, kept candidate {} of {} at \
                 {best_ms:.3} ms ({:.0} TFLOP/s)",
                key.m,
                key.n,
                key.k,
                if key.relu { " relu" } else { "" },
                if key.residual { " +residual" } else { "" },
                best + 1,
                candidates.len(),
                2.0 * key.m as f64 * key.n as f64 * key.k as f64 / (best_ms as f64 * 1e9),
            ));
        }
        Some(candidates[best])
    }
}

/// Whether GEMMs with bias and ReLU fused run here, for `tessera-encode
/// backends`: cuBLASLt's answer for a bf16 Linear of the Large model (640
/// in, 1,920 out, 262,144 rows) with an f32 bias and with a bf16 one.
pub fn fused_epilogue_report() -> String {
    if let Err(why) = probe() {
        return format!("no GPU: {why}");
    }
    let dev = match CudaDevice::build() {
        Ok(dev) => dev,
        Err(why) => return why,
    };
    let Some(lt) = &dev.lt else {
        return "unfused: no cuBLASLt (libcublasLt did not load, or FLOTILLA_CUDA_UNFUSED is set): \
                bias and ReLU run as kernels"
            .into();
    };
    let bias = match dev.alloc(2048) {
        Ok(b) => b,
        Err(e) => return e.to_string(),
    };
    let (ptr, _r) = bias.device_ptr(&dev.stream);
    let key = LtKey {
        trans_a: true,
        trans_b: false,
        m: 1920,
        n: 262_144,
        k: 640,
        lda: 640,
        ldb: 640,
        ldc: 1920,
        out_bf16: true,
        relu: false,
        bias_bf16: false,
        residual: false,
    };
    let answer = |key: &LtKey| match lt.plan(key, ptr) {
        Ok(_) => "yes".to_string(),
        Err(status) => format!("no ({status:?})"),
    };
    format!(
        "cuBLASLt bias epilogue, bf16 out: f32 bias {}; bf16 bias {}",
        answer(&key),
        answer(&LtKey {
            bias_bf16: true,
            ..key
        })
    )
}
