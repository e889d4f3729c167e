//! The interface every compute backend implements, and how one is chosen.
//!
//! A backend runs the two pieces of the model that carry the FLOPs: a
//! backbone over a batch of pixels that share one sequence length, and the
//! head over pooled features. Grouping, gathering and output are shared
//! (`encode/`), so a new backend only implements [`Backend`] and adds
//! itself to [`create`]. Here too: which backends run on this machine
//! ([`unavailable_reason`]), the device name profiles are keyed by
//! ([`device_name`]), and the profile constructors that need it.
//!
//! - `choice.rs`: [`BackendChoice`], the backends' names.
//! - `reference.rs`: candle, the yardstick.
//! - `block.rs`: the thread-per-block forward pass over a GEMM kernel, shared by
//!   `pure_rust.rs` (the `cpu` backend: the `gemm` crate) and `onednn.rs`
//!   (pre-packed oneDNN matmuls; the `onednn` feature, Linux only).
//! - `gpu/`: the GPU path written once over a device interface (`device.rs`,
//!   kernels in `kernels.cu`); `cuda/` is its real device (the `cuda`
//!   feature), the tests' `emulator/` runs it on the CPU.

mod block;
pub(crate) mod choice;
#[cfg(any(
    test,
    all(feature = "cuda", any(target_os = "linux", target_os = "windows"))
))]
mod gpu;
#[cfg(all(feature = "onednn", target_os = "linux"))]
pub mod onednn;
pub mod pure_rust;
pub mod reference;

use std::path::Path;
use std::sync::Arc;

pub use choice::BackendChoice;
#[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
pub use gpu::cuda;

use crate::error::{EncodeError, Result};
use crate::model::{Modality, StudentWeights};
use crate::profile::{DeviceProfile, Dtype};

/// `n` pixels' sequences of one length, ready for a backbone.
#[derive(Debug, Clone, Copy)]
pub struct SequenceBatch<'a> {
    pub n: usize,
    pub len: usize,
    pub bands: usize,
    /// (n, len, bands) standardised band values.
    pub values: &'a [f32],
    /// (n, len) raw days of year.
    pub doys: &'a [f32],
}

impl SequenceBatch<'_> {
    /// The value and day arrays hold exactly n × len (× bands) entries.
    pub fn check(&self, backend: &str) -> Result<()> {
        if self.values.len() != self.n * self.len * self.bands
            || self.doys.len() != self.n * self.len
        {
            return Err(EncodeError::backend(
                backend,
                format!(
                    "batch of {} x {} x {} has {} values and {} days",
                    self.n,
                    self.len,
                    self.bands,
                    self.values.len(),
                    self.doys.len()
                ),
            ));
        }
        Ok(())
    }
}

/// A backbone begun by [`Backend::backbone_begin`], for
/// [`Backend::backbone_end`]: its result, or (a device that computes apart
/// from the host) the backend's own ticket for where the device will leave
/// it.
#[derive(Debug)]
pub struct PendingBackbone(Pending);

#[derive(Debug)]
enum Pending {
    Done(Vec<f32>),
    OnDevice(Box<dyn std::any::Any + Send>),
}

impl PendingBackbone {
    /// A result computed already.
    pub fn done(features: Vec<f32>) -> Self {
        PendingBackbone(Pending::Done(features))
    }

    /// A device's ticket, which only the backend that made it reads.
    #[cfg_attr(not(any(test, feature = "cuda")), allow(dead_code))]
    pub(crate) fn on_device(ticket: Box<dyn std::any::Any + Send>) -> Self {
        PendingBackbone(Pending::OnDevice(ticket))
    }

    /// The result, or the device's ticket.
    #[cfg_attr(not(any(test, feature = "cuda")), allow(dead_code))]
    pub(crate) fn into_parts(self) -> std::result::Result<Vec<f32>, Box<dyn std::any::Any + Send>> {
        match self.0 {
            Pending::Done(features) => Ok(features),
            Pending::OnDevice(ticket) => Err(ticket),
        }
    }
}

/// A head begun ([`Backend::head_kept_begin`]), to hand to
/// [`Backend::head_end`]: the same kind of result as a backbone's, computed
/// already or a device's ticket.
pub type PendingHead = PendingBackbone;

/// How many backbones a caller may have begun and not yet ended: one
/// computing, one queued behind it (so a device never waits between
/// chunks for the host to take a result and hand over the next chunk).
pub const BACKBONES_IN_FLIGHT: usize = 2;

/// A compute backend. Implementations must be deterministic: the same batch
/// gives the same bits whatever the thread count, so the reduction order may
/// depend on the profile's block size but never on the number of threads.
pub trait Backend: Send + Sync {
    /// Short name (`reference`, `cpu`, ...).
    fn name(&self) -> &'static str;
    /// Run one backbone: returns (n, d_model) pooled features.
    fn backbone(&self, modality: Modality, batch: &SequenceBatch<'_>) -> Result<Vec<f32>>;
    /// Begin [`Backend::backbone`] on `batch`, whose buffers the caller may
    /// reuse once this returns; [`Backend::backbone_end`] gives the result.
    /// Up to [`BACKBONES_IN_FLIGHT`] may be begun and not ended, ended in
    /// the order begun. A backend that computes on the calling thread (the
    /// default) computes here; a GPU queues the work and returns, so the
    /// caller prepares and begins the next while this one runs.
    fn backbone_begin(
        &self,
        modality: Modality,
        batch: &SequenceBatch<'_>,
    ) -> Result<PendingBackbone> {
        self.backbone(modality, batch).map(PendingBackbone::done)
    }
    /// The (n, d_model) pooled features of a [`Backend::backbone_begin`],
    /// once the device has them.
    fn backbone_end(&self, pending: PendingBackbone) -> Result<Vec<f32>> {
        pending.into_parts().map_err(|_| {
            EncodeError::backend(
                self.name(),
                "a device's backbone was handed to a backend that began none",
            )
        })
    }
    /// Run the head on `n` pixels' pooled S2 and S1 features (each (n, d)):
    /// returns (n, repr_dim).
    fn head(&self, s2: &[f32], s1: &[f32], n: usize) -> Result<Vec<f32>>;
    /// Where this backend keeps a window's pooled features where it
    /// computes them (a GPU: in device memory, so they never cross to the
    /// host and back for the head): window slots for one encode, its own
    /// while it holds them. With them, the caller begins each backbone
    /// with [`Backend::backbone_begin_kept`] and runs each window's head
    /// with [`Backend::head_kept`]; without (`None`: the backend keeps
    /// nothing), with [`Backend::backbone_begin`] and [`Backend::head`].
    fn kept_windows(&self) -> Result<Option<KeptWindows>> {
        Ok(None)
    }
    /// [`Backend::backbone_begin`] whose pooled features stay with the
    /// backend, in `place`'s window at its rows; [`Backend::backbone_end`]
    /// then gives no features (an empty `Vec`), only that the pass is done.
    fn backbone_begin_kept(
        &self,
        _modality: Modality,
        _batch: &SequenceBatch<'_>,
        _place: &KeptRows<'_>,
    ) -> Result<PendingBackbone> {
        Err(keeps_nothing(self.name()))
    }
    /// The head over the first `n` rows of window `slot`, each row's S2
    /// and S1 features left there by kept backbones begun since the slot's
    /// last head: returns (n, repr_dim). Begun and ended at once.
    fn head_kept(&self, slot: usize, n: usize) -> Result<Vec<f32>> {
        let pending = self.head_kept_begin(slot, n)?;
        self.head_end(pending)
    }
    /// Begin [`Backend::head_kept`]; [`Backend::head_end`] gives its
    /// result. A GPU queues the head and the copy of its result and
    /// returns, so the caller can queue the next window's chunks behind it
    /// before it waits; a backend computing on the caller's thread runs it
    /// here ([`PendingHead::done`]). A caller (one encode) has at most one
    /// head begun and not ended; backbones may be begun meanwhile, and
    /// other encodes on the same backend have their own.
    fn head_kept_begin(&self, _slot: usize, _n: usize) -> Result<PendingHead> {
        Err(keeps_nothing(self.name()))
    }
    /// The (n, repr_dim) result of a [`Backend::head_kept_begin`], once
    /// the host has it.
    fn head_end(&self, pending: PendingHead) -> Result<Vec<f32>> {
        pending.into_parts().map_err(|_| {
            EncodeError::backend(
                self.name(),
                "a device's head was handed to a backend that began none",
            )
        })
    }
}

/// Where a kept backbone ([`Backend::backbone_begin_kept`]) leaves each
/// pixel's pooled features: row `rows[i]` of window `slot` (one of the
/// encode's [`KeptWindows`]), a window of `pixels` rows; every chunk of a
/// window names the same `pixels`.
#[derive(Debug, Clone, Copy)]
pub struct KeptRows<'a> {
    pub slot: usize,
    pub pixels: usize,
    pub rows: &'a [u32],
}

/// How many windows' features one encode has kept at once: windows take
/// its slots in turn, so the next window's first chunk may be begun (and
/// fill its slot) before this window's head has read this one.
pub const KEPT_WINDOWS: usize = 2;

/// The window slots one encode keeps its features in, leased from a
/// backend that keeps them ([`Backend::kept_windows`]). Each encode has
/// its own, so encodes running at once on one backend (an agent runs
/// several tile jobs on one encoder) never write each other's windows;
/// dropped, the slots go back to the backend for a later encode.
#[derive(Debug)]
pub struct KeptWindows {
    slots: [usize; KEPT_WINDOWS],
    pool: Arc<SlotPool>,
}

impl KeptWindows {
    /// The slot window number `window` of the encode uses.
    pub fn slot(&self, window: usize) -> usize {
        self.slots[window % KEPT_WINDOWS]
    }

    /// The slots leased, in the order windows take them.
    pub fn slots(&self) -> [usize; KEPT_WINDOWS] {
        self.slots
    }
}

impl Drop for KeptWindows {
    fn drop(&mut self) {
        if let Ok(mut free) = self.pool.free.lock() {
            free.extend(self.slots);
        }
    }
}

/// A backend's window slots: those no encode holds are leased again
/// before new numbers are handed out, so a backend holds as many as
/// encodes have run at once.
#[derive(Debug, Default)]
pub struct SlotPool {
    free: std::sync::Mutex<Vec<usize>>,
    next: std::sync::atomic::AtomicUsize,
}

impl SlotPool {
    /// [`KEPT_WINDOWS`] slots no other encode holds.
    pub fn lease(self: &Arc<Self>) -> KeptWindows {
        let mut slots = [0; KEPT_WINDOWS];
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        for s in &mut slots {
            *s = free
                .pop()
                .unwrap_or_else(|| self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        }
        KeptWindows {
            slots,
            pool: self.clone(),
        }
    }

    /// How many slots were ever leased: every slot number is below it.
    pub fn issued(&self) -> usize {
        self.next.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl KeptRows<'_> {
    /// There is a row for each of the `n` pixels of the batch, and every
    /// row is inside the window.
    pub fn check(&self, backend: &str, n: usize) -> Result<()> {
        let fail = |what: String| Err(EncodeError::backend(backend, what));
        if self.rows.len() != n {
            return fail(format!(
                "{} rows for a batch of {n} pixels",
                self.rows.len()
            ));
        }
        if let Some(&r) = self.rows.iter().find(|&&r| r as usize >= self.pixels) {
            return fail(format!("row {r} of a window of {} pixels", self.pixels));
        }
        Ok(())
    }
}

fn keeps_nothing(backend: &str) -> EncodeError {
    EncodeError::backend(
        backend,
        "keeps no features: its backbones hand them back for `head`",
    )
}

/// Whether `FLOTILLA_CUDA_HOST_FEATURES` is set: the GPU backend then
/// hands each backbone's pooled features back to the host and takes them
/// up again for the head, as it did before it kept them (to compare), and
/// `host-rate`'s simulated device does the same.
pub(crate) fn features_on_host() -> bool {
    static SET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SET.get_or_init(|| std::env::var_os("FLOTILLA_CUDA_HOST_FEATURES").is_some())
}

impl BackendChoice {
    /// The concrete backend `Auto` resolves to in this build on this machine.
    pub fn resolve(self) -> BackendChoice {
        match self {
            BackendChoice::Auto => [BackendChoice::Cuda, BackendChoice::Onednn]
                .into_iter()
                .find(|&b| unavailable_reason(b).is_none())
                .unwrap_or(BackendChoice::Cpu),
            c => c,
        }
    }

    /// Backends this build can run on this machine.
    pub fn available() -> Vec<BackendChoice> {
        Self::CONCRETE
            .into_iter()
            .filter(|&b| unavailable_reason(b).is_none())
            .collect()
    }
}

/// The CUDA backend is compiled in and this machine has a GPU it can use
/// (checked once per process, see `cuda::probe`).
pub fn cuda_usable() -> bool {
    unavailable_reason(BackendChoice::Cuda).is_none()
}

/// Why this build or machine cannot run `choice` (`None`: it can). For
/// CUDA, the library or driver that is missing.
pub fn unavailable_reason(choice: BackendChoice) -> Option<String> {
    match choice {
        BackendChoice::Auto | BackendChoice::Reference | BackendChoice::Cpu => None,
        BackendChoice::Onednn => (!cfg!(all(feature = "onednn", target_os = "linux")))
            .then(|| not_built(choice).to_string()),
        BackendChoice::Cuda => {
            #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
            {
                cuda::probe().err()
            }
            #[cfg(not(all(feature = "cuda", any(target_os = "linux", target_os = "windows"))))]
            {
                Some(not_built(choice).to_string())
            }
        }
    }
}

/// Why `choice` computes here in another precision than `dtype` asks
/// (`None`: in `dtype`): onednn asked for bf16 where the oneDNN in use has
/// no native bf16 matmul on this CPU computes in f32.
pub fn precision_note(choice: BackendChoice, dtype: Dtype) -> Option<String> {
    #[cfg(all(feature = "onednn", target_os = "linux"))]
    if choice.resolve() == BackendChoice::Onednn
        && dtype == Dtype::Bf16
        && !onednn::bf16_supported()
    {
        return Some(format!(
            "bf16 asked, but {} has no native bf16 matmul on this CPU (it needs AVX512-BF16 \
             or AMX): computing in f32",
            onednn::describe()
        ));
    }
    let _ = (choice, dtype);
    None
}

/// Build the chosen backend over shared weights.
pub fn create(
    choice: BackendChoice,
    weights: Arc<StudentWeights>,
    profile: &DeviceProfile,
) -> Result<Box<dyn Backend>> {
    let choice = choice.resolve();
    // The probe's trial device waits for a CUDA backend to take it; a
    // process that builds another (an agent told to run onednn on a GPU
    // box) lets its cuBLAS handles, workspaces and module go.
    #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
    if choice != BackendChoice::Cuda {
        cuda::release_trial_device();
    }
    match choice {
        BackendChoice::Reference => {
            if profile.dtype != Dtype::F32 {
                return Err(profile.dtype.unsupported("reference", &[Dtype::F32]));
            }
            Ok(Box::new(reference::ReferenceBackend::new(
                weights,
                profile.threads,
            )?))
        }
        BackendChoice::Cpu => Ok(Box::new(pure_rust::CpuBackend::new(weights, profile)?)),
        #[cfg(all(feature = "onednn", target_os = "linux"))]
        BackendChoice::Onednn => Ok(Box::new(onednn::OnednnBackend::new(weights, profile)?)),
        #[cfg(not(all(feature = "onednn", target_os = "linux")))]
        BackendChoice::Onednn => Err(not_built(BackendChoice::Onednn)),
        #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
        BackendChoice::Cuda => Ok(Box::new(cuda::CudaBackend::new(weights, profile)?)),
        #[cfg(not(all(feature = "cuda", any(target_os = "linux", target_os = "windows"))))]
        BackendChoice::Cuda => Err(not_built(BackendChoice::Cuda)),
        BackendChoice::Auto => unreachable!("resolve() never returns Auto"),
    }
}

/// The name profiles are keyed by for `choice` on this machine: GPU 0's
/// name for cuda (where a GPU answers), else the CPU model.
pub fn device_name(choice: BackendChoice) -> String {
    #[cfg(all(feature = "cuda", any(target_os = "linux", target_os = "windows")))]
    if choice == BackendChoice::Cuda {
        if let Some(gpu) = cuda::device_name() {
            return gpu;
        }
    }
    let _ = choice;
    cpu_model().unwrap_or_else(|| format!("{} cpu", std::env::consts::ARCH))
}

/// What `choice` computes with here, for `tessera-encode backends` and the
/// agent's registration: oneDNN's version and the ISA it dispatches to
/// (Debian's 2.6 stops at `avx512_core_bf16` unless told otherwise, issue
/// 16), the vector ISA the `gemm` crate and candle pick at run time for the
/// CPU backends, the GPU's name for cuda.
pub fn isa(choice: BackendChoice) -> String {
    match choice.resolve() {
        #[cfg(all(feature = "onednn", target_os = "linux"))]
        BackendChoice::Onednn => onednn::describe(),
        BackendChoice::Cuda => format!("GPU {}", device_name(BackendChoice::Cuda)),
        _ => cpu_vector_isa().to_string(),
    }
}

/// Threads [`interleave_features`] copies on, at most.
const INTERLEAVE_THREADS: usize = 4;

/// `z` (n, 2d) = each pixel's S2 features then its S1 features, from `s2`
/// and `s1` (n, d each): the head's input. A window's worth (84 MB for the
/// Large model) is copied on up to [`INTERLEAVE_THREADS`] threads: on a GPU
/// this runs between a window's last backbone and its head, and one
/// thread's copy bandwidth is a fraction of the machine's. Up to 1,024
/// pixels (a CPU backend's block, say) are copied on the calling thread.
pub(crate) fn interleave_features(z: &mut [f32], s2: &[f32], s1: &[f32], d: usize) {
    let n = z.len() / (2 * d).max(1);
    let copy = |z: &mut [f32], first: usize| {
        for (i, row) in z.chunks_exact_mut(2 * d).enumerate() {
            let p = first + i;
            row[..d].copy_from_slice(&s2[p * d..(p + 1) * d]);
            row[d..].copy_from_slice(&s1[p * d..(p + 1) * d]);
        }
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(INTERLEAVE_THREADS)
        .min(n.div_ceil(1024))
        .max(1);
    if threads == 1 {
        return copy(z, 0);
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        for (k, part) in z.chunks_mut(per * 2 * d).enumerate() {
            s.spawn(move || copy(part, k * per));
        }
    });
}

/// The widest f32 vector ISA this CPU offers of those the `gemm` crate
/// dispatches to.
fn cpu_vector_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return "avx2+fma";
        }
        "sse2"
    }
    #[cfg(target_arch = "aarch64")]
    {
        "neon"
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}

/// `/proc/cpuinfo`'s "model name".
fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The profile constructors for this machine: they name its device
/// ([`device_name`]), which `profile.rs` (data only) leaves to the backends.
impl DeviceProfile {
    /// Untuned starting point for a backend on this machine.
    pub fn default_for(backend: BackendChoice) -> Self {
        Self::untuned(backend, device_name(backend))
    }

    /// The profile stored in `file` for this machine's device and `backend`,
    /// or the default. `backend` is a [`BackendChoice`] or its name (parsed
    /// here, for callers that hold a name).
    pub fn resolve<B>(file: Option<&Path>, backend: B) -> Result<Self>
    where
        B: TryInto<BackendChoice>,
        EncodeError: From<B::Error>,
    {
        let backend = backend.try_into()?;
        Self::stored_or_untuned(file, backend, device_name(backend))
    }
}

fn not_built(c: BackendChoice) -> EncodeError {
    EncodeError::backend(
        c.name(),
        format!(
            "not available in this build (enable the `{}` cargo feature)",
            c.name()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_prefers_cuda_then_onednn() {
        let want = if cuda_usable() {
            BackendChoice::Cuda
        } else if cfg!(all(feature = "onednn", target_os = "linux")) {
            BackendChoice::Onednn
        } else {
            BackendChoice::Cpu
        };
        assert_eq!(BackendChoice::Auto.resolve(), want);
        assert!(BackendChoice::available().contains(&want));
    }

    /// Split over threads (3,001 pixels: up to 4 parts, the last short),
    /// every row is each pixel's S2 features then its S1 features.
    #[test]
    fn features_interleave_on_threads_as_on_one() {
        let (n, d) = (3001, 5);
        let s2: Vec<f32> = (0..n * d).map(|i| i as f32).collect();
        let s1: Vec<f32> = (0..n * d).map(|i| -(i as f32) - 1.0).collect();
        let mut z = vec![f32::NAN; n * 2 * d];
        interleave_features(&mut z, &s2, &s1, d);
        for p in 0..n {
            assert_eq!(
                &z[p * 2 * d..p * 2 * d + d],
                &s2[p * d..(p + 1) * d],
                "pixel {p}"
            );
            assert_eq!(
                &z[p * 2 * d + d..(p + 1) * 2 * d],
                &s1[p * d..(p + 1) * d],
                "pixel {p}"
            );
        }
    }
}
