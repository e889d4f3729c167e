//! The CUDA path: every Linear is one cuBLAS SGEMM over the whole chunk, the
//! rest (bias and epilogues, LayerNorm, softmax, attention pooling) are small
//! kernels compiled once by NVRTC; attention's two products are strided
//! batched SGEMMs, one per head, over all pixels of the chunk.
//!
//! cudarc loads libcuda, libcublas and libnvrtc at run time
//! (`dynamic-loading`), so this file builds on every machine; [`available`]
//! says whether this one has the libraries and a GPU, and `auto` only picks
//! CUDA when it does.
//!
//! Status: written against the description of the model and the other
//! backends, built on machines without a GPU, and NOT yet run on one; the
//! fixture tests (`tests/fixtures.rs`) include this backend and skip it where
//! [`available`] is false. Layout conventions are in each function: every
//! activation is row-major (rows = tokens), and cuBLAS (column-major) sees a
//! row-major (r × c) matrix as its transpose.
//!
//! Determinism: one stream, a fixed kernel and GEMM order, and reductions in
//! a fixed tree order per block, so the same chunk gives the same bits on the
//! same GPU and library versions; thread counts do not apply.

use std::sync::{Arc, Mutex};

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};

use super::{Backend, SequenceBatch};
use crate::error::{EncodeError, Result};
use crate::model::{self, Backbone, LayerNorm, Linear, Modality, StudentWeights};

const NAME: &str = "cuda";

/// Threads per block of the row kernels (LayerNorm, softmax, pooling); a
/// power of two for the tree reductions.
const ROW_THREADS: u32 = 256;

/// The kernels besides the GEMMs. Reductions are tree reductions in shared
/// memory over a fixed number of threads, so their order never changes.
const KERNELS: &str = r#"
// bias and residual may be null (no add).
extern "C" __global__ void bias_epilogue(float* y, const float* bias, const float* residual,
                                         int rows, int cols, int relu) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)rows * cols;
    if (i >= total) return;
    float v = bias ? y[i] + bias[i % cols] : y[i];
    if (relu) v = fmaxf(v, 0.0f);
    if (residual) v += residual[i];
    y[i] = v;
}

// One block per row of `cols`; gamma/beta may be null (no affine).
extern "C" __global__ void layer_norm(float* x, const float* gamma, const float* beta,
                                      int cols, float eps) {
    extern __shared__ double red[];
    float* row = x + (long long)blockIdx.x * cols;
    double s = 0.0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += (double)row[j];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    double mean = red[0] / cols;
    __syncthreads();
    double q = 0.0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        double c = (double)row[j] - mean;
        q += c * c;
    }
    red[threadIdx.x] = q;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    double inv = 1.0 / sqrt(red[0] / cols + (double)eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = (float)(((double)row[j] - mean) * inv);
        if (gamma) v = v * gamma[j] + beta[j];
        row[j] = v;
    }
}

// One block per row of `cols` (cols <= blockDim.x * many); in place.
extern "C" __global__ void softmax_rows(float* x, int cols) {
    extern __shared__ float fred[];
    float* row = x + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
    fred[threadIdx.x] = m;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) fred[threadIdx.x] = fmaxf(fred[threadIdx.x], fred[threadIdx.x + k]);
        __syncthreads();
    }
    m = fred[0];
    __syncthreads();
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float e = expf(row[j] - m);
        row[j] = e;
        s += e;
    }
    fred[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) fred[threadIdx.x] += fred[threadIdx.x + k];
        __syncthreads();
    }
    float inv = 1.0f / fred[0];
    for (int j = threadIdx.x; j < cols; j += blockDim.x) row[j] *= inv;
}

// Attention pooling: one block per pixel; h is (pixels, len, d), out (pixels, d).
// Shared memory: len floats of weights.
extern "C" __global__ void attention_pool(const float* h, const float* w, float b,
                                          float* out, int len, int d) {
    extern __shared__ float weights[];
    const float* hp = h + (long long)blockIdx.x * len * d;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        float s = b;
        for (int j = 0; j < d; ++j) s += hp[(long long)t * d + j] * w[j];
        weights[t] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int t = 0; t < len; ++t) m = fmaxf(m, weights[t]);
        float s = 0.0f;
        for (int t = 0; t < len; ++t) { weights[t] = expf(weights[t] - m); s += weights[t]; }
        float inv = 1.0f / s;
        for (int t = 0; t < len; ++t) weights[t] *= inv;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < len; ++t) acc += weights[t] * hp[(long long)t * d + j];
        out[(long long)blockIdx.x * d + j] = acc;
    }
}
"#;

/// Whether this machine can run the CUDA backend: the driver, cuBLAS and
/// NVRTC libraries load and at least one GPU answers.
pub fn available() -> bool {
    // SAFETY: only probes whether the shared libraries can be opened.
    let libs = unsafe {
        cudarc::driver::sys::is_culib_present()
            && cudarc::cublas::sys::is_culib_present()
            && cudarc::nvrtc::sys::is_culib_present()
    };
    libs && matches!(CudaContext::device_count(), Ok(n) if n > 0)
}

/// The name of GPU 0, for device profiles.
pub fn device_name() -> Option<String> {
    if !available() {
        return None;
    }
    CudaContext::new(0).ok()?.name().ok()
}

fn err(what: &str, e: impl std::fmt::Debug) -> EncodeError {
    EncodeError::backend(NAME, format!("{what}: {e:?}"))
}

struct DeviceLinear {
    in_dim: usize,
    out_dim: usize,
    /// (out, in) row-major, as in the checkpoint.
    weight: CudaSlice<f32>,
    bias: CudaSlice<f32>,
}

struct DeviceNorm {
    dim: usize,
    affine: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    eps: f32,
}

struct DeviceLayer {
    in_proj: DeviceLinear,
    out_proj: DeviceLinear,
    linear1: DeviceLinear,
    linear2: DeviceLinear,
    norm1: DeviceNorm,
    norm2: DeviceNorm,
}

struct DeviceBackbone {
    d: usize,
    nhead: usize,
    ffn: usize,
    embed0: DeviceLinear,
    embed2: DeviceLinear,
    layers: Vec<DeviceLayer>,
    pool_w: CudaSlice<f32>,
    pool_b: f32,
    doy: model::DoyEncoding,
}

struct Kernels {
    bias_epilogue: CudaFunction,
    layer_norm: CudaFunction,
    softmax_rows: CudaFunction,
    attention_pool: CudaFunction,
}

/// Everything that touches the GPU; one caller at a time (one stream).
struct Gpu {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
    s2: DeviceBackbone,
    s1: DeviceBackbone,
    fc1: DeviceLinear,
    norm1: DeviceNorm,
    fc2: DeviceLinear,
    out_norm: DeviceNorm,
}

pub struct CudaBackend {
    gpu: Mutex<Gpu>,
    d: usize,
    repr_dim: usize,
}

impl CudaBackend {
    pub fn new(weights: Arc<StudentWeights>) -> Result<Self> {
        if !available() {
            return Err(EncodeError::backend(
                NAME,
                "no usable GPU: libcuda, libcublas or libnvrtc did not load, or no device answered",
            ));
        }
        let ctx = CudaContext::new(0).map_err(|e| err("opening GPU 0", e))?;
        let stream = ctx.default_stream();
        let blas =
            CudaBlas::new(stream.clone()).map_err(|e| err("creating the cuBLAS handle", e))?;
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS).map_err(|e| err("compiling kernels", e))?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| err("loading kernels", e))?;
        let f = |name: &str| module.load_function(name).map_err(|e| err(name, e));
        let k = Kernels {
            bias_epilogue: f("bias_epilogue")?,
            layer_norm: f("layer_norm")?,
            softmax_rows: f("softmax_rows")?,
            attention_pool: f("attention_pool")?,
        };
        let ffn = weights.config.dim_feedforward;
        let up = Upload { stream: &stream };
        let gpu = Gpu {
            s2: up.backbone(&weights.s2, ffn)?,
            s1: up.backbone(&weights.s1, ffn)?,
            fc1: up.linear(&weights.head.fc1)?,
            norm1: up.norm(&weights.head.norm1)?,
            fc2: up.linear(&weights.head.fc2)?,
            out_norm: up.norm(&weights.head.out_norm)?,
            stream,
            blas,
            k,
        };
        Ok(CudaBackend {
            gpu: Mutex::new(gpu),
            d: weights.config.d_model(),
            repr_dim: weights.config.repr_dim,
        })
    }
}

struct Upload<'a> {
    stream: &'a Arc<CudaStream>,
}

impl Upload<'_> {
    fn slice(&self, v: &[f32]) -> Result<CudaSlice<f32>> {
        self.stream
            .clone_htod(v)
            .map_err(|e| err("uploading weights", e))
    }
    fn linear(&self, l: &Linear) -> Result<DeviceLinear> {
        Ok(DeviceLinear {
            in_dim: l.in_dim,
            out_dim: l.out_dim,
            weight: self.slice(&l.weight)?,
            bias: self.slice(&l.bias)?,
        })
    }
    fn norm(&self, n: &LayerNorm) -> Result<DeviceNorm> {
        Ok(DeviceNorm {
            dim: n.dim,
            affine: match &n.affine {
                Some((w, b)) => Some((self.slice(w)?, self.slice(b)?)),
                None => None,
            },
            eps: n.eps,
        })
    }
    fn backbone(&self, b: &Backbone, ffn: usize) -> Result<DeviceBackbone> {
        let mut layers = Vec::with_capacity(b.layers.len());
        for l in &b.layers {
            layers.push(DeviceLayer {
                in_proj: self.linear(&l.in_proj)?,
                out_proj: self.linear(&l.out_proj)?,
                linear1: self.linear(&l.linear1)?,
                linear2: self.linear(&l.linear2)?,
                norm1: self.norm(&l.norm1)?,
                norm2: self.norm(&l.norm2)?,
            });
        }
        Ok(DeviceBackbone {
            d: b.d_model,
            nhead: b.nhead,
            ffn,
            embed0: self.linear(&b.embed0)?,
            embed2: self.linear(&b.embed2)?,
            layers,
            pool_w: self.slice(&b.pool.weight)?,
            pool_b: b.pool.bias[0],
            doy: model::DoyEncoding::new(b.d_model),
        })
    }
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| EncodeError::backend(NAME, format!("{what} {v} exceeds i32")))
}

impl Gpu {
    fn alloc(&self, n: usize) -> Result<CudaSlice<f32>> {
        self.stream
            .alloc_zeros::<f32>(n)
            .map_err(|e| err("allocating GPU memory", e))
    }

    /// `y (m, out) = epilogue(x (m, in) · Wᵀ + b)`, all row-major. cuBLAS
    /// computes the column-major `yᵀ (out, m) = W · xᵀ`: W's row-major
    /// storage is Wᵀ column-major (so `transa = T`, lda = in), x's is xᵀ
    /// (`transb = N`, ldb = in).
    fn linear(
        &self,
        l: &DeviceLinear,
        x: &CudaSlice<f32>,
        m: usize,
        y: &mut CudaSlice<f32>,
        relu: bool,
        residual: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: to_i32(l.out_dim, "out")?,
            n: to_i32(m, "rows")?,
            k: to_i32(l.in_dim, "in")?,
            alpha: 1.0f32,
            lda: to_i32(l.in_dim, "in")?,
            ldb: to_i32(l.in_dim, "in")?,
            beta: 0.0f32,
            ldc: to_i32(l.out_dim, "out")?,
        };
        // SAFETY: x holds m·in, W out·in, y m·out values (allocated so by the callers).
        unsafe { self.blas.gemm(cfg, &l.weight, x, y) }.map_err(|e| err("sgemm", e))?;
        self.epilogue(y, Some(&l.bias), m, l.out_dim, relu, residual)
    }

    /// In place on the (rows, cols) `y`: add `bias` (per column), then ReLU
    /// if asked, then add `residual` — one pass of the `bias_epilogue` kernel.
    fn epilogue(
        &self,
        y: &mut CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        rows: usize,
        cols: usize,
        relu: bool,
        residual: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        let total = rows * cols;
        let launch = LaunchConfig::for_num_elems(u32::try_from(total).map_err(|_| {
            EncodeError::backend(NAME, format!("{total} activations exceed one launch"))
        })?);
        let (rows, cols) = (to_i32(rows, "rows")?, to_i32(cols, "cols")?);
        let relu = i32::from(relu);
        // A null pointer for an absent bias or residual: the kernel skips the add.
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(&self.k.bias_epilogue);
        b.arg(y);
        match bias {
            Some(bias) => b.arg(bias),
            None => b.arg(&null),
        };
        match residual {
            Some(r) => b.arg(r),
            None => b.arg(&null),
        };
        b.arg(&rows).arg(&cols).arg(&relu);
        // SAFETY: the kernel's arguments match its signature above.
        unsafe { b.launch(launch) }.map_err(|e| err("bias_epilogue", e))?;
        Ok(())
    }

    fn layer_norm(&self, n: &DeviceNorm, x: &mut CudaSlice<f32>, rows: usize) -> Result<()> {
        let launch = LaunchConfig {
            grid_dim: (u32::try_from(rows).unwrap_or(u32::MAX), 1, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: ROW_THREADS * 8,
        };
        let cols = to_i32(n.dim, "dim")?;
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(&self.k.layer_norm);
        b.arg(x);
        match &n.affine {
            Some((g, be)) => {
                b.arg(g).arg(be);
            }
            None => {
                b.arg(&null).arg(&null);
            }
        }
        b.arg(&cols).arg(&n.eps);
        // SAFETY: arguments match the kernel; one block per row of `cols`.
        unsafe { b.launch(launch) }.map_err(|e| err("layer_norm", e))?;
        Ok(())
    }

    /// Multi-head self-attention of `px` pixels' sequences of `len` over the
    /// packed (px·len, 3d) `qkv`, into (px·len, d) `attn`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        qkv: &CudaSlice<f32>,
        attn: &mut CudaSlice<f32>,
        scores: &mut CudaSlice<f32>,
        px: usize,
        len: usize,
        d: usize,
        nhead: usize,
    ) -> Result<()> {
        let hd = d / nhead;
        let d3 = 3 * d;
        let scale = 1.0 / (hd as f32).sqrt();
        let batch = to_i32(px, "pixels")?;
        for h in 0..nhead {
            // Scores S (len × len, row-major) = Q Kᵀ. Column-major: Sᵀ = K Qᵀ;
            // K's row-major storage (ld 3d) is Kᵀ column-major, so transa = T;
            // Q's is Qᵀ, transb = N.
            let q = qkv.slice(h * hd..);
            let k = qkv.slice(d + h * hd..);
            let cfg = StridedBatchedConfig {
                gemm: GemmConfig {
                    transa: cublasOperation_t::CUBLAS_OP_T,
                    transb: cublasOperation_t::CUBLAS_OP_N,
                    m: to_i32(len, "len")?,
                    n: to_i32(len, "len")?,
                    k: to_i32(hd, "head dim")?,
                    alpha: scale,
                    lda: to_i32(d3, "3d")?,
                    ldb: to_i32(d3, "3d")?,
                    beta: 0.0f32,
                    ldc: to_i32(len, "len")?,
                },
                batch_size: batch,
                stride_a: (len * d3) as i64,
                stride_b: (len * d3) as i64,
                stride_c: (len * len) as i64,
            };
            // SAFETY: every pixel's K and Q lie inside qkv (px·len rows of 3d); scores holds px·len².
            unsafe { self.blas.gemm_strided_batched(cfg, &k, &q, scores) }
                .map_err(|e| err("attention scores", e))?;
            let launch = LaunchConfig {
                grid_dim: (u32::try_from(px * len).unwrap_or(u32::MAX), 1, 1),
                block_dim: (ROW_THREADS, 1, 1),
                shared_mem_bytes: ROW_THREADS * 4,
            };
            let cols = to_i32(len, "len")?;
            let mut b = self.stream.launch_builder(&self.k.softmax_rows);
            b.arg(&mut *scores).arg(&cols);
            // SAFETY: arguments match the kernel; px·len rows of len.
            unsafe { b.launch(launch) }.map_err(|e| err("softmax_rows", e))?;
            // O (len × hd, row-major, ld d) = P V. Column-major: Oᵀ = Vᵀ Pᵀ;
            // V's storage (ld 3d) is Vᵀ (transa = N), P's is Pᵀ (transb = N).
            let v = qkv.slice(2 * d + h * hd..);
            let mut o = attn.slice_mut(h * hd..);
            let cfg = StridedBatchedConfig {
                gemm: GemmConfig {
                    transa: cublasOperation_t::CUBLAS_OP_N,
                    transb: cublasOperation_t::CUBLAS_OP_N,
                    m: to_i32(hd, "head dim")?,
                    n: to_i32(len, "len")?,
                    k: to_i32(len, "len")?,
                    alpha: 1.0f32,
                    lda: to_i32(d3, "3d")?,
                    ldb: to_i32(len, "len")?,
                    beta: 0.0f32,
                    ldc: to_i32(d, "d")?,
                },
                batch_size: batch,
                stride_a: (len * d3) as i64,
                stride_b: (len * len) as i64,
                stride_c: (len * d) as i64,
            };
            // SAFETY: V and O lie inside qkv and attn for every pixel.
            unsafe { self.blas.gemm_strided_batched(cfg, &v, &*scores, &mut o) }
                .map_err(|e| err("attention values", e))?;
        }
        Ok(())
    }

    fn backbone(&self, bb: &DeviceBackbone, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        let (px, len, d) = (batch.n, batch.len, bb.d);
        let m = px * len;
        let values = self
            .stream
            .clone_htod(batch.values)
            .map_err(|e| err("uploading inputs", e))?;
        // The day-of-year encoding in f64 on the host, as the CPU backends do.
        let mut pe_host = vec![0f32; m * d];
        for (row, &doy) in pe_host.chunks_exact_mut(d).zip(batch.doys) {
            bb.doy.encode(doy, row);
        }
        let pe = self
            .stream
            .clone_htod(&pe_host)
            .map_err(|e| err("uploading inputs", e))?;
        let mut t = self.alloc(m * d)?;
        let mut h = self.alloc(m * d)?;
        let mut qkv = self.alloc(m * 3 * d)?;
        let mut attn = self.alloc(m * d)?;
        let mut ff = self.alloc(m * bb.ffn)?;
        let mut scores = self.alloc(px * len * len)?;
        self.linear(&bb.embed0, &values, m, &mut t, true, None)?;
        self.linear(&bb.embed2, &t, m, &mut h, false, Some(&pe))?;
        for l in &bb.layers {
            self.linear(&l.in_proj, &h, m, &mut qkv, false, None)?;
            self.attention(&qkv, &mut attn, &mut scores, px, len, d, bb.nhead)?;
            self.linear(&l.out_proj, &attn, m, &mut t, false, Some(&h))?;
            self.layer_norm(&l.norm1, &mut t, m)?;
            std::mem::swap(&mut t, &mut h);
            self.linear(&l.linear1, &h, m, &mut ff, true, None)?;
            self.linear(&l.linear2, &ff, m, &mut t, false, Some(&h))?;
            self.layer_norm(&l.norm2, &mut t, m)?;
            std::mem::swap(&mut t, &mut h);
        }
        let mut pooled = self.alloc(px * d)?;
        let launch = LaunchConfig {
            grid_dim: (u32::try_from(px).unwrap_or(u32::MAX), 1, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: u32::try_from(len * 4).unwrap_or(u32::MAX),
        };
        let (len_i, d_i) = (to_i32(len, "len")?, to_i32(d, "d")?);
        let mut b = self.stream.launch_builder(&self.k.attention_pool);
        b.arg(&h)
            .arg(&bb.pool_w)
            .arg(&bb.pool_b)
            .arg(&mut pooled)
            .arg(&len_i)
            .arg(&d_i);
        // SAFETY: arguments match the kernel; one block per pixel, len floats of shared memory.
        unsafe { b.launch(launch) }.map_err(|e| err("attention_pool", e))?;
        self.stream
            .clone_dtoh(&pooled)
            .map_err(|e| err("downloading features", e))
    }

    fn head(&self, s2: &[f32], s1: &[f32], n: usize, d: usize) -> Result<Vec<f32>> {
        let mut z = vec![0f32; n * 2 * d];
        for i in 0..n {
            z[i * 2 * d..i * 2 * d + d].copy_from_slice(&s2[i * d..(i + 1) * d]);
            z[i * 2 * d + d..(i + 1) * 2 * d].copy_from_slice(&s1[i * d..(i + 1) * d]);
        }
        let z = self
            .stream
            .clone_htod(&z)
            .map_err(|e| err("uploading features", e))?;
        let mut y = self.alloc(n * self.fc1.out_dim)?;
        self.linear(&self.fc1, &z, n, &mut y, false, None)?;
        self.layer_norm(&self.norm1, &mut y, n)?;
        // ReLU after the norm.
        self.epilogue(&mut y, None, n, self.fc1.out_dim, true, None)?;
        let mut out = self.alloc(n * self.fc2.out_dim)?;
        self.linear(&self.fc2, &y, n, &mut out, false, None)?;
        self.layer_norm(&self.out_norm, &mut out, n)?;
        self.stream
            .clone_dtoh(&out)
            .map_err(|e| err("downloading embeddings", e))
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        batch.check(NAME)?;
        let gpu = self
            .gpu
            .lock()
            .map_err(|_| EncodeError::backend(NAME, "a previous GPU call panicked"))?;
        let bb = match modality {
            Modality::S2 => &gpu.s2,
            Modality::S1 => &gpu.s1,
        };
        gpu.backbone(bb, batch)
    }

    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        let gpu = self
            .gpu
            .lock()
            .map_err(|_| EncodeError::backend(NAME, "a previous GPU call panicked"))?;
        let out = gpu.head(s2, s1, n, self.d)?;
        debug_assert_eq!(out.len(), n * self.repr_dim);
        Ok(out)
    }
}
