//! The thread-per-block forward pass shared by the `cpu` and `onednn` backends.
//!
//! Each thread carries its own block of pixels through every layer, over
//! any kernel for the Linear layers. A backend supplies only a [`LinearKernel`] (how `x W^T + b` is computed,
//! with an [`Epilogue`] it may fuse); attention, LayerNorm, the day-of-year
//! encoding, pooling, the head's order of operations and the block scheduler
//! live here once.
//!
//! Determinism: a batch is cut into blocks of `block_pixels` whatever the
//! thread count, each block is computed by one thread with single-threaded
//! GEMMs, and threads only decide who computes which block. So the bits do
//! not depend on the number of threads.

use std::sync::Arc;

use gemm::Parallelism;

use super::{Backend, SequenceBatch};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::model::{self, Backbone, LayerNorm, Linear, Modality, StudentWeights};
use crate::profile::DeviceProfile;

/// What happens to `x W^T + b` before it is stored.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Epilogue<'a> {
    None,
    Relu,
    /// Add this (m, n) tensor elementwise (a residual).
    Add(&'a [f32]),
}

/// Which epilogue a layer is always called with, so a kernel can fuse it
/// when the layer is built (oneDNN post-ops are fixed at creation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fused {
    None,
    Relu,
    Add,
}

impl Epilogue<'_> {
    // Only kernels that fuse at build time (onednn) ask.
    #[cfg_attr(not(all(feature = "onednn", target_os = "linux")), allow(dead_code))]
    pub(crate) fn kind(&self) -> Fused {
        match self {
            Epilogue::None => Fused::None,
            Epilogue::Relu => Fused::Relu,
            Epilogue::Add(_) => Fused::Add,
        }
    }
}

/// Where a layer's output goes, known when the layer is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feeds {
    /// Only the next Linear (embedding.0 into embedding.2, linear1 into
    /// linear2), always through [`LinearKernel::forward_pair`]: a kernel
    /// whose GEMMs read bf16 may hand it over in bf16, never writing it in f32.
    NextLinear,
    /// Anything else (a residual, attention, LayerNorm, the caller).
    Other,
}

/// Builds one layer's kernel: (checkpoint name of the layer, its weights,
/// the epilogue it is always called with, where its output goes).
/// Called from several threads at once (the layers are built in parallel).
pub(crate) type MakeKernel<'a, L> = dyn Fn(&str, &Linear, Fused, Feeds) -> Result<L> + Sync + 'a;

/// One Linear layer on some GEMM: `out (m, n) = epilogue(x (m, k) W^T + b)`.
/// Called from many threads at once, each on its own block, with one
/// single-threaded GEMM per call.
pub(crate) trait LinearKernel: Send + Sync {
    fn forward(&self, x: &[f32], m: usize, out: &mut [f32], epilogue: Epilogue<'_>) -> Result<()>;

    /// Two Linears in a row, `first` built with [`Feeds::NextLinear`]:
    /// `out = epilogues.1(epilogues.0(x W1^T + b1) W2^T + b2)`. The
    /// intermediate (m rows of `first`'s width) goes through `mid` here; a
    /// kernel may keep it elsewhere (oneDNN in bf16 keeps it in bf16).
    fn forward_pair(
        first: &Self,
        second: &Self,
        x: &[f32],
        m: usize,
        mid: &mut [f32],
        out: &mut [f32],
        epilogues: (Epilogue<'_>, Epilogue<'_>),
    ) -> Result<()>
    where
        Self: Sized,
    {
        first.forward(x, m, mid, epilogues.0)?;
        second.forward(mid, m, out, epilogues.1)
    }
}

/// Multi-head self-attention of a block, where a backend has its own
/// (oneDNN's batched bf16 matmuls); otherwise [`attention_f32`] on the `gemm`
/// crate in f32. Called from many threads at once, each on its own block.
pub(crate) trait AttentionKernel: Send + Sync {
    /// Reads `b` pixels' sequences of `len` tokens as packed (b·len, 3d)
    /// `qkv` (q, k, v side by side, heads within each), writes the heads'
    /// outputs side by side into (b·len, d) `attn`.
    fn attend(
        &self,
        qkv: &[f32],
        attn: &mut [f32],
        b: usize,
        len: usize,
        d: usize,
        nh: usize,
    ) -> Result<()>;
}

/// Applies an epilogue the kernel did not fuse: ReLU or the residual add, in place on `out`.
pub(crate) fn apply_epilogue(out: &mut [f32], epilogue: Epilogue<'_>) {
    match epilogue {
        Epilogue::None => {}
        Epilogue::Relu => {
            for v in out {
                *v = v.max(0.0);
            }
        }
        Epilogue::Add(r) => {
            for (v, r) in out.iter_mut().zip(r) {
                *v += r;
            }
        }
    }
}

struct BlockLayer<L> {
    in_proj: L,
    out_proj: L,
    linear1: L,
    linear2: L,
    norm1: LayerNorm,
    norm2: LayerNorm,
}

struct BlockBackbone<L> {
    d: usize,
    nhead: usize,
    ffn: usize,
    embed0: L,
    embed2: L,
    layers: Vec<BlockLayer<L>>,
    pool_w: Vec<f32>,
    pool_b: f32,
    doy: model::DoyEncoding,
}

/// One Linear to build: its checkpoint name, its weights, the epilogue it
/// is always called with and where its output goes.
struct LinearJob<'w> {
    name: String,
    linear: &'w mut Linear,
    fused: Fused,
    feeds: Feeds,
}

/// A backbone's Linears in the order [`BlockBackbone::assemble`] takes
/// their kernels: each layer's in_proj, out_proj, linear1, linear2, then
/// embedding.0 and embedding.2.
fn backbone_jobs<'w>(prefix: &str, b: &'w mut Backbone) -> Vec<LinearJob<'w>> {
    let mut jobs = Vec::with_capacity(4 * b.layers.len() + 2);
    for (i, l) in b.layers.iter_mut().enumerate() {
        let at = |name: &str| format!("{prefix}.transformer_encoder.layers.{i}.{name}");
        jobs.extend(
            [
                (
                    at("self_attn.in_proj"),
                    &mut l.in_proj,
                    Fused::None,
                    Feeds::Other,
                ),
                (
                    at("self_attn.out_proj"),
                    &mut l.out_proj,
                    Fused::Add,
                    Feeds::Other,
                ),
                (
                    at("linear1"),
                    &mut l.linear1,
                    Fused::Relu,
                    Feeds::NextLinear,
                ),
                (at("linear2"), &mut l.linear2, Fused::Add, Feeds::Other),
            ]
            .map(|(name, linear, fused, feeds)| LinearJob {
                name,
                linear,
                fused,
                feeds,
            }),
        );
    }
    jobs.push(LinearJob {
        name: format!("{prefix}.embedding.0"),
        linear: &mut b.embed0,
        fused: Fused::Relu,
        feeds: Feeds::NextLinear,
    });
    jobs.push(LinearJob {
        name: format!("{prefix}.embedding.2"),
        linear: &mut b.embed2,
        fused: Fused::Add,
        feeds: Feeds::Other,
    });
    jobs
}

/// Every job's kernel from `make`, in the jobs' order, built on rayon's
/// threads: creating a kernel (oneDNN's JIT and the packing of its weights,
/// the faults on its fresh pages) is most of a backend's start-up, and the
/// layers are independent. Each matrix is emptied once its kernel is built
/// (see [`build`]), so at most one layer per thread is held twice.
fn build_all<L: Send>(make: &MakeKernel<'_, L>, jobs: Vec<LinearJob<'_>>) -> Result<Vec<L>> {
    use rayon::prelude::*;
    jobs.into_par_iter()
        .map(|j| build(make, &j.name, j.linear, j.fused, j.feeds))
        .collect()
}

impl<L: LinearKernel> BlockBackbone<L> {
    /// The backbone from `b`'s norms and pooling and its Linears' kernels,
    /// taken from `kernels` in [`backbone_jobs`]' order.
    fn assemble(b: &Backbone, ffn: usize, kernels: &mut impl Iterator<Item = L>) -> Result<Self> {
        let mut next = || {
            kernels.next().ok_or_else(|| {
                crate::error::EncodeError::Invalid("fewer kernels built than Linears".into())
            })
        };
        let mut layers = Vec::with_capacity(b.layers.len());
        for l in &b.layers {
            layers.push(BlockLayer {
                in_proj: next()?,
                out_proj: next()?,
                linear1: next()?,
                linear2: next()?,
                norm1: l.norm1.clone(),
                norm2: l.norm2.clone(),
            });
        }
        Ok(BlockBackbone {
            d: b.d_model,
            nhead: b.nhead,
            ffn,
            embed0: next()?,
            embed2: next()?,
            layers,
            pool_w: b.pool.weight.clone(),
            pool_b: b.pool.bias[0],
            doy: model::DoyEncoding::new(b.d_model),
        })
    }
}

/// `l`'s kernel from `make`, then `l`'s f32 matrix emptied: every kernel
/// packs or copies what it computes with, so a model loaded for a block
/// backend holds each matrix twice only while that one layer is built,
/// not the whole model twice (the Large student's f32 matrices are 175 MB).
fn build<L>(
    make: &MakeKernel<'_, L>,
    name: &str,
    l: &mut Linear,
    fused: Fused,
    feeds: Feeds,
) -> Result<L> {
    let kernel = make(name, l, fused, feeds)?;
    l.weight = Vec::new();
    Ok(kernel)
}

/// Per-thread activations for one block of `rows` tokens.
struct Workspace {
    h: Vec<f32>,
    t: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    ff: Vec<f32>,
    scores: Vec<f32>,
}

impl Workspace {
    fn new(rows: usize, len: usize, d: usize, ffn: usize) -> Self {
        Workspace {
            h: vec![0.0; rows * d],
            t: vec![0.0; rows * d],
            qkv: vec![0.0; rows * 3 * d],
            attn: vec![0.0; rows * d],
            ff: vec![0.0; rows * ffn],
            scores: vec![0.0; len * len],
        }
    }
}

pub(crate) fn softmax_in_place(row: &mut [f32]) {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    let inv = 1.0 / s;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// Multi-head self-attention of `b` pixels' sequences of `len`: reads the
/// packed (b·len, 3d) `qkv`, writes the heads' outputs side by side into
/// (b·len, d) `attn`. Q·K^T and P·V are single-threaded `gemm` calls that
/// read each head in place through strides.
pub(crate) fn attention_f32(
    qkv: &[f32],
    attn: &mut [f32],
    scores: &mut [f32],
    b: usize,
    len: usize,
    d: usize,
    nh: usize,
) {
    let hd = d / nh;
    let d3 = 3 * d;
    let scale = 1.0 / (hd as f32).sqrt();
    assert!(qkv.len() >= b * len * d3 && attn.len() >= b * len * d && scores.len() >= len * len);
    for p in 0..b {
        let base = p * len * d3;
        for j in 0..nh {
            let q = qkv[base + j * hd..].as_ptr();
            let k = qkv[base + d + j * hd..].as_ptr();
            let v = qkv[base + 2 * d + j * hd..].as_ptr();
            // SAFETY: q, k, v address len rows of hd at stride 3d inside qkv
            // (length checked above); scores is len x len.
            unsafe {
                gemm::gemm(
                    len,
                    len,
                    hd,
                    scores.as_mut_ptr(),
                    1,
                    len as isize,
                    false,
                    q,
                    1,
                    d3 as isize,
                    k,
                    d3 as isize,
                    1,
                    0.0f32,
                    scale,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
            for row in scores[..len * len].chunks_exact_mut(len) {
                softmax_in_place(row);
            }
            let o = attn[p * len * d + j * hd..].as_mut_ptr();
            // SAFETY: o addresses len rows of hd at stride d inside attn; v as above.
            unsafe {
                gemm::gemm(
                    len,
                    hd,
                    len,
                    o,
                    1,
                    d as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    len as isize,
                    v,
                    1,
                    d3 as isize,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
        }
    }
}

impl<L: LinearKernel> BlockBackbone<L> {
    /// Carry `b` pixels (sequences of `len`) through the whole backbone;
    /// writes (b, d) pooled features to `out`.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        attention_kernel: Option<&dyn AttentionKernel>,
        b: usize,
        len: usize,
        values: &[f32],
        doys: &[f32],
        ws: &mut Workspace,
        out: &mut [f32],
    ) -> Result<()> {
        let d = self.d;
        let m = b * len;
        let md = m * d;
        // The day-of-year encoding goes in as the residual of embedding.2.
        for (row, &doy) in ws.attn[..md].chunks_exact_mut(d).zip(doys) {
            self.doy.encode(doy, row);
        }
        L::forward_pair(
            &self.embed0,
            &self.embed2,
            values,
            m,
            &mut ws.t[..md],
            &mut ws.h[..md],
            (Epilogue::Relu, Epilogue::Add(&ws.attn[..md])),
        )?;
        for l in &self.layers {
            l.in_proj
                .forward(&ws.h[..md], m, &mut ws.qkv[..3 * md], Epilogue::None)?;
            match attention_kernel {
                Some(k) => k.attend(&ws.qkv, &mut ws.attn, b, len, d, self.nhead)?,
                None => attention_f32(&ws.qkv, &mut ws.attn, &mut ws.scores, b, len, d, self.nhead),
            }
            l.out_proj.forward(
                &ws.attn[..md],
                m,
                &mut ws.t[..md],
                Epilogue::Add(&ws.h[..md]),
            )?;
            l.norm1.apply_rows(&mut ws.t[..md]);
            std::mem::swap(&mut ws.t, &mut ws.h);
            L::forward_pair(
                &l.linear1,
                &l.linear2,
                &ws.h[..md],
                m,
                &mut ws.ff[..m * self.ffn],
                &mut ws.t[..md],
                (Epilogue::Relu, Epilogue::Add(&ws.h[..md])),
            )?;
            l.norm2.apply_rows(&mut ws.t[..md]);
            std::mem::swap(&mut ws.t, &mut ws.h);
        }
        // Attention pooling over time.
        let mut w = vec![0f32; len];
        for p in 0..b {
            let hp = &ws.h[p * len * d..(p + 1) * len * d];
            for (t, row) in hp.chunks_exact(d).enumerate() {
                w[t] = row
                    .iter()
                    .zip(&self.pool_w)
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    + self.pool_b;
            }
            softmax_in_place(&mut w);
            let o = &mut out[p * d..(p + 1) * d];
            o.fill(0.0);
            for (t, row) in hp.chunks_exact(d).enumerate() {
                for (o, h) in o.iter_mut().zip(row) {
                    *o += w[t] * h;
                }
            }
        }
        Ok(())
    }
}

/// A whole backend made of thread-per-block backbones and head over kernel `L`.
pub(crate) struct BlockBackend<L> {
    name: &'static str,
    /// The model's sizes and the head's two LayerNorms: all this backend
    /// reads of the checkpoint's weights once its kernels are built (it
    /// holds no `Arc` of them, so an `Encoder::load`ed model's f32 matrices
    /// are freed once the kernels have packed or copied them).
    config: ModelConfig,
    head_norm1: LayerNorm,
    head_out_norm: LayerNorm,
    s2: BlockBackbone<L>,
    s1: BlockBackbone<L>,
    fc1: L,
    fc2: L,
    block_pixels: usize,
    /// `threads` workers kept for the backend's life (`None`: one thread,
    /// the caller's). Threads spawned per call took their thread-local
    /// buffers with them (each block's workspace and oneDNN's scratchpad
    /// and bf16 conversion buffers, tens of MB): every call faulted them
    /// in afresh, about 4 % of a bf16 encode here and more where AMX makes
    /// the GEMMs fast.
    pool: Option<rayon::ThreadPool>,
    /// The backend's own attention, if it has one (see [`AttentionKernel`]).
    attention: Option<Box<dyn AttentionKernel>>,
}

thread_local! {
    /// This worker's block workspace, kept between blocks and calls (see
    /// [`BlockBackend::pool`]); grown when a block needs more.
    static WORKSPACE: std::cell::RefCell<Option<Workspace>> = const { std::cell::RefCell::new(None) };
}

impl Workspace {
    /// Whether this workspace holds a block of `rows` tokens of sequences
    /// of `len` at widths `d` and `ffn` (every use slices what it needs).
    fn holds(&self, rows: usize, len: usize, d: usize, ffn: usize) -> bool {
        self.h.len() >= rows * d
            && self.qkv.len() >= rows * 3 * d
            && self.ff.len() >= rows * ffn
            && self.scores.len() >= len * len
    }
}

/// Run `f` on this thread's workspace, made or grown to hold a block of
/// `rows` tokens of sequences of `len` (widths `d`, `ffn`).
fn with_workspace<R>(
    rows: usize,
    len: usize,
    d: usize,
    ffn: usize,
    f: impl FnOnce(&mut Workspace) -> R,
) -> R {
    WORKSPACE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut ws) => {
            if !ws.as_ref().is_some_and(|w| w.holds(rows, len, d, ffn)) {
                // The old one goes first: both at once may not fit.
                *ws = None;
                *ws = Some(Workspace::new(rows, len, d, ffn));
            }
            match ws.as_mut() {
                Some(w) => f(w),
                None => f(&mut Workspace::new(rows, len, d, ffn)),
            }
        }
        // A block inside a block (nothing does this) gets its own.
        Err(_) => f(&mut Workspace::new(rows, len, d, ffn)),
    })
}

impl<L: LinearKernel> BlockBackend<L> {
    /// Builds every Linear of the model with `make` (called once per layer, at load).
    pub(crate) fn new(
        name: &'static str,
        weights: Arc<StudentWeights>,
        profile: &DeviceProfile,
        make: &MakeKernel<'_, L>,
        attention: Option<Box<dyn AttentionKernel>>,
    ) -> Result<Self> {
        let ffn = weights.config.dim_feedforward;
        let threads = profile.threads.max(1);
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |i| format!("{name}-{i}"))
                    .build()
                    .map_err(|e| {
                        crate::error::EncodeError::backend(
                            name,
                            format!("starting {threads} threads: {e}"),
                        )
                    })?,
            )
        } else {
            None
        };
        // The weights are ours to empty as the kernels are built (see
        // [`build`]) when the caller handed over the only reference, as
        // `Encoder::load` does; otherwise a copy is (only tests share them).
        let mut weights = Arc::try_unwrap(weights).unwrap_or_else(|shared| (*shared).clone());
        let w = &mut weights;
        let mut jobs = backbone_jobs("s2_backbone", &mut w.s2);
        jobs.extend(backbone_jobs("s1_backbone", &mut w.s1));
        jobs.extend([
            LinearJob {
                name: "dim_reducer.0".into(),
                linear: &mut w.head.fc1,
                fused: Fused::None,
                feeds: Feeds::Other,
            },
            LinearJob {
                name: "dim_reducer.4".into(),
                linear: &mut w.head.fc2,
                fused: Fused::None,
                feeds: Feeds::Other,
            },
        ]);
        let mut kernels = build_all(make, jobs)?.into_iter();
        let s2 = BlockBackbone::assemble(&w.s2, ffn, &mut kernels)?;
        let s1 = BlockBackbone::assemble(&w.s1, ffn, &mut kernels)?;
        let (Some(fc1), Some(fc2), None) = (kernels.next(), kernels.next(), kernels.next()) else {
            return Err(crate::error::EncodeError::Invalid(
                "the kernels built are not one a Linear".into(),
            ));
        };
        Ok(BlockBackend {
            pool,
            attention,
            name,
            s2,
            s1,
            fc1,
            fc2,
            block_pixels: profile.block_pixels.max(1),
            config: w.config,
            head_norm1: w.head.norm1.clone(),
            head_out_norm: w.head.out_norm.clone(),
        })
    }

    /// Run `work(first_pixel, pixels, out_block)` over blocks of
    /// `block_pixels`, `out` holding `width` values per pixel, on the
    /// backend's workers. The blocks themselves never depend on the thread
    /// count, nor a block's bits on which worker takes it. The first error
    /// (in block order) is returned.
    fn for_blocks<F>(&self, width: usize, out: &mut [f32], work: F) -> Result<()>
    where
        F: Fn(usize, usize, &mut [f32]) -> Result<()> + Sync,
    {
        use rayon::prelude::*;
        let bp = self.block_pixels;
        let blocks: Vec<(usize, &mut [f32])> = out
            .chunks_mut(bp * width)
            .enumerate()
            .map(|(i, o)| (i * bp, o))
            .collect();
        match &self.pool {
            Some(pool) if blocks.len() > 1 => {
                let results: Vec<Result<()>> = pool.install(|| {
                    blocks
                        .into_par_iter()
                        // One block per task: a worker takes the next as it
                        // finishes one.
                        .with_max_len(1)
                        .map(|(start, o)| work(start, o.len() / width, o))
                        .collect()
                });
                results.into_iter().collect()
            }
            _ => {
                for (start, o) in blocks {
                    work(start, o.len() / width, o)?;
                }
                Ok(())
            }
        }
    }
}

impl<L: LinearKernel> Backend for BlockBackend<L> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>> {
        let bb = match modality {
            Modality::S2 => &self.s2,
            Modality::S1 => &self.s1,
        };
        let (len, bands, d) = (batch.len, batch.bands, bb.d);
        batch.check(self.name)?;
        let mut out = vec![0f32; batch.n * d];
        let rows = self.block_pixels.min(batch.n) * len;
        self.for_blocks(d, &mut out, |start, b, o| {
            // Each worker has its own workspace (no cache lines shared
            // between threads), kept from block to block.
            with_workspace(rows, len, d, bb.ffn, |ws| {
                let v = &batch.values[start * len * bands..(start + b) * len * bands];
                let doys = &batch.doys[start * len..(start + b) * len];
                bb.block(self.attention.as_deref(), b, len, v, doys, ws, o)
            })
        })?;
        Ok(out)
    }

    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>> {
        let d = self.config.d_model();
        let r = self.config.repr_dim;
        let mut out = vec![0f32; n * r];
        self.for_blocks(r, &mut out, |start, b, o| {
            let mut z = vec![0f32; b * 2 * d];
            let pixels = start * d..(start + b) * d;
            super::interleave_features(&mut z, &s2[pixels.clone()], &s1[pixels], d);
            let mut y = vec![0f32; b * 4 * d];
            self.fc1.forward(&z, b, &mut y, Epilogue::None)?;
            self.head_norm1.apply_rows(&mut y);
            apply_epilogue(&mut y, Epilogue::Relu);
            self.fc2.forward(&y, b, o, Epilogue::None)?;
            self.head_out_norm.apply_rows(o);
            Ok(())
        })?;
        Ok(out)
    }
}
