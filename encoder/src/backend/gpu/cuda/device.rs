//! [`Device`] on CUDA: copies, cuBLAS and cuBLASLt GEMMs, kernel launches.

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cublasStatus_t, cudaDataType_t,
};
use cudarc::cublas::{Gemm as _, GemmConfig, StridedBatchedConfig};
use cudarc::cublaslt::result as ltr;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::lt::{set_attr, Attr, LtKey, LT_WORKSPACE, TUNING};
use super::staging::{check_download, check_upload, CudaStaging, STAGING_KEPT};
use super::{err, CudaDevice, NAME};
use crate::backend::gpu::device::HalfGemmOut;
use crate::backend::gpu::{Arg, Device, Epilogue, Gemm, GemmMath, Kernel, Launch};
use crate::error::{EncodeError, Result};

impl CudaDevice {
    /// `cublasGemmStridedBatchedEx` of `g` (its sizes in `cfg`) on raw
    /// device pointers of the given data types, computing as `compute`
    /// says (f32 accumulation in every use here).
    ///
    /// # Safety
    /// Every problem's A, B and C lie in memory the pointers own, of their
    /// types (what [`Device::gemm`] and [`Device::gemm_half`] check).
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_ex(
        &self,
        g: &Gemm,
        cfg: &GemmConfig<f32>,
        a: (u64, cudaDataType_t),
        b: (u64, cudaDataType_t),
        c: (u64, cudaDataType_t),
        compute: cublasComputeType_t,
    ) -> Result<()> {
        // SAFETY: the handle is live and bound to this stream; the pointers
        // are the caller's; alpha and beta outlive the call, which only
        // enqueues work that reads them at once.
        let status = unsafe {
            cudarc::cublas::sys::cublasGemmStridedBatchedEx(
                *self.blas.handle(),
                cfg.transa,
                cfg.transb,
                cfg.m,
                cfg.n,
                cfg.k,
                (&cfg.alpha) as *const f32 as *const _,
                a.0 as *const _,
                a.1,
                cfg.lda,
                g.stride_a as i64,
                b.0 as *const _,
                b.1,
                cfg.ldb,
                g.stride_b as i64,
                (&cfg.beta) as *const f32 as *const _,
                c.0 as *mut _,
                c.1,
                cfg.ldc,
                g.stride_c as i64,
                int(g.batch)?,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(err("cublasGemmStridedBatchedEx", status));
        }
        Ok(())
    }

    /// `g`'s sizes as cuBLAS takes them.
    fn config(g: &Gemm) -> Result<GemmConfig<f32>> {
        Ok(GemmConfig {
            transa: op(g.trans_a),
            transb: op(g.trans_b),
            m: int(g.m)?,
            n: int(g.n)?,
            k: int(g.k)?,
            alpha: g.alpha,
            lda: int(g.lda)?,
            ldb: int(g.ldb)?,
            beta: g.beta,
            ldc: int(g.ldc)?,
        })
    }
}

fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| EncodeError::backend(NAME, format!("SGEMM size {v} exceeds i32")))
}

fn op(trans: bool) -> cublasOperation_t {
    if trans {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// A null device pointer, for an absent optional buffer.
static NULL: u64 = 0;

impl Device for CudaDevice {
    type Staging = CudaStaging;
    type Buf = CudaSlice<f32>;
    type Half = CudaSlice<u16>;

    fn math(&self) -> GemmMath {
        self.math
    }

    /// cuBLAS and frees use the calling thread's current context; the
    /// copies and launches bind it themselves, but a GEMM or a free may
    /// come first on a thread.
    fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| err("binding the GPU context", e))
    }

    fn upload(&self, host: &[f32]) -> Result<Self::Buf> {
        self.stream
            .clone_htod(host)
            .map_err(|e| err("copying to the GPU", e))
    }

    fn alloc(&self, n: usize) -> Result<Self::Buf> {
        // SAFETY: the GPU path writes every buffer before it reads it
        // (`Scratch`), which the emulator checks by filling new ones with NaN.
        unsafe { self.stream.alloc::<f32>(n) }.map_err(|e| err("allocating GPU memory", e))
    }

    fn len(buf: &Self::Buf) -> usize {
        buf.len()
    }

    fn upload_staged_with(
        &self,
        n: usize,
        buf: &mut Self::Buf,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<CudaStaging> {
        check_upload(n, buf.len())?;
        self.staged(n, |pinned| {
            fill(pinned);
            self.stream
                .memcpy_htod(&*pinned, &mut buf.slice_mut(..n))
                .map_err(|e| err("copying to the GPU", e))
        })
    }

    fn download_begin(&self, buf: &Self::Buf, n: usize) -> Result<CudaStaging> {
        check_download(n, buf.len())?;
        self.staged(n, |pinned| {
            self.stream
                .memcpy_dtoh(&buf.slice(..n), pinned)
                .map_err(|e| err("copying from the GPU", e))
        })
    }

    fn download_wait(staging: &CudaStaging) -> Result<()> {
        staging
            .done
            .synchronize()
            .map_err(|e| err("waiting for the GPU", e))
    }

    fn download_end(&self, staging: CudaStaging, n: usize) -> Result<Vec<f32>> {
        Self::download_wait(&staging)?;
        let out = staging
            .host
            .as_slice()
            .map_err(|e| err("reaching page-locked memory", e))?
            .get(..n)
            .map(<[f32]>::to_vec)
            .ok_or_else(|| {
                EncodeError::backend(
                    NAME,
                    format!("taking {n} floats of a download of {}", staging.host.len()),
                )
            })?;
        self.release(staging);
        Ok(out)
    }

    fn marker(&self) -> Result<CudaStaging> {
        // The event alone, recorded after what was queued.
        self.staged(0, |_| Ok(()))
    }

    fn release(&self, staging: CudaStaging) {
        if let Ok(mut kept) = self.staging.lock() {
            if kept.len() < STAGING_KEPT {
                kept.push(staging);
            }
        }
    }

    unsafe fn gemm_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Buf, usize),
        b: (&Self::Buf, usize),
        c: (&mut Self::Buf, usize),
    ) -> Result<()> {
        self.bind()?;
        let cfg = Self::config(g)?;
        let (av, bv) = (a.0.slice(a.1..), b.0.slice(b.1..));
        let mut cv = c.0.slice_mut(c.1..);
        if self.math == GemmMath::Bf16 {
            // f32 matrices in and out, bf16 tensor-core products:
            // CUBLAS_COMPUTE_32F_FAST_16BF rounds A and B to bf16 as it
            // reads them and accumulates in f32 (the head's few GEMMs; the
            // backbones keep bf16 copies and use gemm_half).
            let f = cudaDataType_t::CUDA_R_32F;
            let (ap, _ra) = av.device_ptr(&self.stream);
            let (bp, _rb) = bv.device_ptr(&self.stream);
            let (cp, _rc) = cv.device_ptr_mut(&self.stream);
            // SAFETY: the caller checked every problem inside the views.
            return unsafe {
                self.gemm_ex(
                    g,
                    &cfg,
                    (ap, f),
                    (bp, f),
                    (cp, f),
                    cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF,
                )
            };
        }
        // SAFETY: the caller checked every problem's A, B and C inside the
        // views (`Device::gemm`).
        let r = unsafe {
            if g.batch == 1 {
                self.blas.gemm(cfg, &av, &bv, &mut cv)
            } else {
                let cfg = StridedBatchedConfig {
                    gemm: cfg,
                    batch_size: int(g.batch)?,
                    stride_a: g.stride_a as i64,
                    stride_b: g.stride_b as i64,
                    stride_c: g.stride_c as i64,
                };
                self.blas.gemm_strided_batched(cfg, &av, &bv, &mut cv)
            }
        };
        r.map_err(|e| err("sgemm", e))
    }

    unsafe fn gemm_half_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        c: HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<()> {
        self.bind()?;
        let cfg = Self::config(g)?;
        let h = cudaDataType_t::CUDA_R_16BF;
        let (av, bv) = (a.0.slice(a.1..), b.0.slice(b.1..));
        let (ap, _ra) = av.device_ptr(&self.stream);
        let (bp, _rb) = bv.device_ptr(&self.stream);
        let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F;
        match c {
            HalfGemmOut::F32(buf, off) => {
                let mut cv = buf.slice_mut(off..);
                let (cp, _rc) = cv.device_ptr_mut(&self.stream);
                let f = cudaDataType_t::CUDA_R_32F;
                // SAFETY: `Device::gemm_half` checked every problem inside the views.
                unsafe { self.gemm_ex(g, &cfg, (ap, h), (bp, h), (cp, f), compute) }
            }
            HalfGemmOut::Bf16(buf, off) => {
                let mut cv = buf.slice_mut(off..);
                let (cp, _rc) = cv.device_ptr_mut(&self.stream);
                // SAFETY: as above.
                unsafe { self.gemm_ex(g, &cfg, (ap, h), (bp, h), (cp, h), compute) }
            }
        }
    }

    unsafe fn gemm_half_bias_unchecked(
        &self,
        g: &Gemm,
        a: (&Self::Half, usize),
        b: (&Self::Half, usize),
        ep: &Epilogue<'_, Self::Buf, Self::Half>,
        c: HalfGemmOut<'_, Self::Buf, Self::Half>,
    ) -> Result<bool> {
        let Some(lt) = &self.lt else {
            return Ok(false);
        };
        // cuBLASLt's epilogue is relu(A·B + C + bias): with a residual in
        // C, not the bias-ReLU-then-residual asked for.
        if ep.relu && ep.residual.is_some() {
            return Ok(false);
        }
        self.bind()?;
        let key = LtKey {
            trans_a: g.trans_a,
            trans_b: g.trans_b,
            m: g.m,
            n: g.n,
            k: g.k,
            lda: g.lda,
            ldb: g.ldb,
            ldc: g.ldc,
            out_bf16: matches!(c, HalfGemmOut::Bf16(..)),
            relu: ep.relu,
            bias_bf16: false,
            residual: ep.residual.is_some(),
        };
        let mut plans = lt
            .plans
            .lock()
            .map_err(|_| err("cuBLASLt plans", "a previous call panicked"))?;
        // The f32 bias if cuBLASLt takes it with this C, else the bf16 copy.
        let biases = [
            (key, Some(ep.bias.device_ptr(&self.stream).0)),
            (
                LtKey {
                    bias_bf16: true,
                    ..key
                },
                ep.bias_half.map(|h| h.device_ptr(&self.stream).0),
            ),
        ];
        let mut chosen = None;
        for (key, ptr) in biases {
            let Some(ptr) = ptr else { continue };
            // No algorithm for a shape: asked once, then unfused or the next bias.
            let plan = plans.entry(key).or_insert_with(|| lt.plan(&key, ptr).ok());
            if plan.is_some() {
                chosen = Some((key, ptr));
                break;
            }
        }
        let Some((key, biasp)) = chosen else {
            return Ok(false);
        };
        let Some(plan) = plans.get_mut(&key).and_then(Option::as_mut) else {
            return Ok(false);
        };
        let (av, bv) = (a.0.slice(a.1..), b.0.slice(b.1..));
        let (ap, _ra) = av.device_ptr(&self.stream);
        let (bp, _rb) = bv.device_ptr(&self.stream);
        // The stream orders every use (event tracking is off), so only the
        // address is kept.
        let dp = match c {
            HalfGemmOut::F32(buf, off) => buf.slice_mut(off..).device_ptr_mut(&self.stream).0,
            HalfGemmOut::Bf16(buf, off) => buf.slice_mut(off..).device_ptr_mut(&self.stream).0,
        };
        // With a residual, C is it (beta 1) and D the output; else C is D,
        // unread (beta 0).
        let (cp, beta) = match ep.residual {
            Some(r) => (r.device_ptr(&self.stream).0, 1f32),
            None => (dp, 0f32),
        };
        let (wp, _rw) = lt.workspace.device_ptr(&self.stream);
        let alpha = g.alpha;
        let (desc, la, lb, lc) = (plan.desc, plan.a, plan.b, plan.c);
        // SAFETY: the caller checked A, B, C (and the residual) inside the
        // views and the bias's length; the plan was made for this shape;
        // alpha and beta are read during the call, which only enqueues the
        // work; a candidate only writes D, which the kept one rewrites.
        let run = |algo: &lt::cublasLtMatmulAlgo_t| unsafe {
            set_attr(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &biasp)?;
            ltr::matmul(
                lt.handle,
                desc,
                (&alpha) as *const f32 as *const _,
                (&beta) as *const f32 as *const _,
                ap as *const _,
                la,
                bp as *const _,
                lb,
                cp as *const _,
                lc,
                dp as *mut _,
                lc,
                algo,
                wp as *mut _,
                LT_WORKSPACE,
                self.stream.cu_stream() as *mut _,
            )
            .map_err(|e| e.0)
        };
        let timing = !plan.candidates.is_empty();
        if timing {
            let candidates = std::mem::take(&mut plan.candidates);
            if let Some(best) = self.fastest(&key, &candidates, &run) {
                if best.data != plan.algo.data {
                    plan.fallback = Some(plan.algo);
                }
                plan.algo = best;
            }
        }
        use lt::cublasStatus_t as S;
        // What a call may refuse an algorithm for (it then enqueued
        // nothing); any other failure is no algorithm's fault.
        let refusal = |status: S| {
            matches!(
                status,
                S::CUBLAS_STATUS_NOT_SUPPORTED
                    | S::CUBLAS_STATUS_INVALID_VALUE
                    | S::CUBLAS_STATUS_ARCH_MISMATCH
            )
        };
        let mut called = run(&plan.algo);
        if let (Err(status), Some(first)) = (called, plan.fallback) {
            if refusal(status) {
                // The timed algorithm refused where the heuristic's own pick
                // may not be: that, from now on, before unfused.
                plan.fallback = None;
                plan.algo = first;
                called = run(&plan.algo);
                if let Ok(mut t) = TUNING.lock() {
                    t.push(format!(
                        "cuBLASLt {}x{}x{}: the timed algorithm refused ({status:?}); the heuristic's \
                         first {}",
                        key.m,
                        key.n,
                        key.k,
                        if called.is_ok() { "from now on" } else { "refused too" },
                    ));
                }
            }
        }
        if let Err(status) = called {
            // The heuristic offered this plan but the call refused it (or
            // every timed candidate failed): this shape runs unfused from
            // now on, the bf16 bias's plan tried first, rather than the
            // encode failing. A refused call enqueued nothing, so D is as
            // the caller left it. Any other failure (a dead context after
            // a kernel's fault, say) is the error it is.
            if !refusal(status) {
                return Err(err("cublasLtMatmul", status));
            }
            plans.insert(key, None);
            if let Ok(mut t) = TUNING.lock() {
                t.push(format!(
                    "cuBLASLt {}x{}x{}{}{}: the call failed ({status:?}); unfused from now on",
                    key.m,
                    key.n,
                    key.k,
                    if key.relu { " relu" } else { "" },
                    if key.residual { " +residual" } else { "" },
                ));
            }
            return Ok(false);
        }
        if timing {
            if let Ok(mut timed) = lt.timed.lock() {
                timed.insert(key.class(), plan.algo);
            }
        }
        Ok(true)
    }

    fn upload_half(&self, host: &[u16]) -> Result<Self::Half> {
        self.stream
            .clone_htod(host)
            .map_err(|e| err("copying to the GPU", e))
    }

    fn alloc_half(&self, n: usize) -> Result<Self::Half> {
        // SAFETY: as `alloc`: written before read.
        unsafe { self.stream.alloc::<u16>(n) }.map_err(|e| err("allocating GPU memory", e))
    }

    fn half_len(buf: &Self::Half) -> usize {
        buf.len()
    }

    fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    fn launch(
        &self,
        kernel: Kernel,
        launch: Launch,
        args: &mut [Arg<'_, Self::Buf, Self::Half>],
    ) -> Result<()> {
        let mut b = self.stream.launch_builder(&self.kernels[kernel as usize]);
        for a in args.iter_mut() {
            match a {
                Arg::In(buf) => b.arg(*buf),
                Arg::Out(buf) => b.arg(&mut **buf),
                Arg::HalfOut(buf) => b.arg(&mut **buf),
                Arg::HalfIn(buf) => b.arg(*buf),
                Arg::Null => b.arg(&NULL),
                Arg::I32(v) => b.arg(&*v),
                Arg::F32(v) => b.arg(&*v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (launch.grid, 1, 1),
            block_dim: (launch.block, 1, 1),
            shared_mem_bytes: launch.shared_bytes,
        };
        // SAFETY: the callers in gpu/ops.rs and gpu/forward.rs pass the kernel's arguments in its
        // signature's order and types (the emulator checks both), and size
        // the grid and shared memory as each kernel's comment says.
        unsafe { b.launch(cfg) }.map_err(|e| err(kernel.name(), e))?;
        Ok(())
    }
}
