//! What this CPU and this libdnnl build can do.
//!
//! bf16 support, oneDNN's ISA, version and threading runtime.

use crate::sys;

/// Whether bf16 matmuls run natively here: the CPU reports AMX-BF16 or
/// AVX512-BF16 (cpuid, confirmed by the kernel's /proc/cpuinfo flags, which
/// are absent when the OS has not enabled the state), *and* libdnnl's
/// dispatcher agrees (its effective ISA includes avx512_core_bf16).
///
/// Where this is false oneDNN may still accept a bf16 matmul, but runs it
/// emulated or on the reference implementation, which is far slower than f32.
/// Detected once per process (it reads /proc/cpuinfo).
pub fn bf16_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let features = CpuFeatures::detect();
        (features.avx512_bf16 || features.amx_bf16) && dnnl_isa_has_bf16()
    })
}

/// The bf16-related CPU features, as seen by cpuid and by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFeatures {
    pub avx512_bf16: bool,
    pub amx_bf16: bool,
}

impl CpuFeatures {
    pub fn detect() -> Self {
        let (cpuid_avx512_bf16, cpuid_amx_bf16) = cpuid_bf16();
        // The kernel only lists a flag it has enabled (AMX also needs XFD/permission
        // support); if /proc/cpuinfo is unreadable, trust cpuid.
        let flags = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("flags"))
                    .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            });
        let has_flag = |name: &str| flags.as_ref().is_none_or(|f| f.iter().any(|x| x == name));
        CpuFeatures {
            avx512_bf16: cpuid_avx512_bf16 && has_flag("avx512_bf16"),
            amx_bf16: cpuid_amx_bf16 && has_flag("amx_bf16"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
// `__cpuid_count` became a safe fn in Rust 1.87; the workspace allows 1.85.
#[allow(unused_unsafe)]
fn cpuid_bf16() -> (bool, bool) {
    use std::arch::x86_64::__cpuid_count;
    // SAFETY: cpuid is available on every x86_64 CPU.
    let max_leaf = unsafe { __cpuid_count(0, 0) }.eax;
    if max_leaf < 7 {
        return (false, false);
    }
    // SAFETY: leaf 7 exists (checked above).
    let leaf7 = unsafe { __cpuid_count(7, 0) };
    // Intel SDM vol. 2A, CPUID leaf 07H: sub-leaf 0 EDX bit 22 = AMX-BF16;
    // sub-leaf 1 EAX bit 5 = AVX512_BF16 (valid when sub-leaf 0 EAX >= 1).
    let amx_bf16 = leaf7.edx & (1 << 22) != 0;
    let avx512_bf16 = leaf7.eax >= 1 && {
        // SAFETY: sub-leaf 1 exists (sub-leaf 0 EAX reports the max sub-leaf).
        let sub1 = unsafe { __cpuid_count(7, 1) };
        sub1.eax & (1 << 5) != 0
    };
    (avx512_bf16, amx_bf16)
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_bf16() -> (bool, bool) {
    (false, false)
}

fn dnnl_isa_has_bf16() -> bool {
    let isa = effective_isa_raw();
    isa & sys::dnnl_cpu_isa_avx512_core_bf16 == sys::dnnl_cpu_isa_avx512_core_bf16
}

fn effective_isa_raw() -> i32 {
    // SAFETY: no arguments; reads libdnnl's dispatcher state.
    unsafe { sys::dnnl_get_effective_cpu_isa() }
}

/// The instruction set oneDNN dispatches to on this machine, e.g. "avx2", "avx512_core_amx".
pub fn effective_isa() -> &'static str {
    let isa = effective_isa_raw();
    let has = |mask: i32| isa & mask == mask;
    if has(sys::dnnl_cpu_isa_avx512_core_amx) {
        "avx512_core_amx"
    } else if has(sys::dnnl_cpu_isa_avx512_core_bf16) {
        "avx512_core_bf16"
    } else if has(sys::dnnl_cpu_isa_avx512_core) {
        "avx512_core"
    } else if has(sys::dnnl_cpu_isa_avx2) {
        "avx2"
    } else {
        "pre-avx2"
    }
}

/// libdnnl's version and CPU threading runtime, as the library reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub major: i32,
    pub minor: i32,
    pub patch: i32,
    /// `DNNL_RUNTIME_*`: 1 sequential, 2 OpenMP, 4 TBB, 8 threadpool.
    pub cpu_runtime: u32,
}

pub fn version() -> Version {
    // SAFETY: returns a pointer to a static struct inside libdnnl.
    let v = unsafe { &*sys::dnnl_version() };
    Version {
        major: v.major,
        minor: v.minor,
        patch: v.patch,
        cpu_runtime: v.cpu_runtime,
    }
}
