//! The kernels compiled by NVRTC: PTX through the on-disk cache, or machine code as a fallback.

use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{CompileError, Ptx};

use crate::backend::gpu::{kernel_cache, KERNELS};

/// The kernels as PTX, once per process: for `compute_80` where the GPU
/// has bf16 tensor cores (`attention_mma`'s `mma.sync` needs it; the driver
/// compiles the PTX on for the GPU's own architecture), else for NVRTC's
/// default architecture (`attention_mma` is then a stub the backend never
/// launches). NVRTC compiles them only when the on-disk cache
/// (`kernel_cache.rs`) has none for this source, architecture and NVRTC.
pub(super) fn kernels_ptx(tensor_cores: bool) -> std::result::Result<Ptx, String> {
    static PTX: [OnceLock<std::result::Result<Ptx, String>>; 2] =
        [OnceLock::new(), OnceLock::new()];
    PTX[tensor_cores as usize]
        .get_or_init(|| {
            let arch = tensor_cores.then_some("compute_80");
            let nvrtc = nvrtc_version()?;
            let dir = kernel_cache::dir_from_env();
            let (ptx, origin) = kernel_cache::ptx_cached(
                dir.as_deref().map_err(Clone::clone),
                &[
                    KERNELS.as_bytes(),
                    arch.unwrap_or("default").as_bytes(),
                    nvrtc.as_bytes(),
                ],
                || compile_kernels(arch).map(|p| p.to_src()),
            )?;
            if let Ok(mut o) = KERNELS_ORIGIN.lock() {
                *o = Some(origin);
            }
            Ok(Ptx::from_src(ptx))
        })
        .clone()
}

/// How this process got its kernels (the last compiled or read).
pub(super) static KERNELS_ORIGIN: Mutex<Option<kernel_cache::Origin>> = Mutex::new(None);

/// Where this process's kernels came from (the NVRTC cache, or compiled in
/// how long), once a device was built: for `tessera-encode backends` and
/// the encode's report.
pub fn kernels_report() -> Option<String> {
    KERNELS_ORIGIN
        .lock()
        .ok()?
        .as_ref()
        .map(|o| format!("CUDA kernels {o}"))
}

/// NVRTC's version, part of the kernel cache's key (another NVRTC may
/// write other PTX, or PTX an older driver cannot load).
fn nvrtc_version() -> std::result::Result<String, String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to locals; the caller has checked that
    // libnvrtc loads (probe), as compiling needs anyway.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("asking NVRTC's version: {status:?}"));
    }
    Ok(format!("NVRTC {major}.{minor}"))
}

/// [`compile_cubin`] once per process (the probe and every backend a
/// `tune` sweep builds load it; GPU 0's architecture does not change).
pub(super) fn kernels_cubin(major: i32, minor: i32) -> std::result::Result<Vec<u8>, String> {
    static CUBIN: OnceLock<std::result::Result<Vec<u8>, String>> = OnceLock::new();
    CUBIN.get_or_init(|| compile_cubin(major, minor)).clone()
}

/// The kernels as machine code (a CUBIN) for compute capability
/// `major.minor`, for a driver that refuses NVRTC's PTX.
fn compile_cubin(major: i32, minor: i32) -> std::result::Result<Vec<u8>, String> {
    let src = std::ffi::CString::new(KERNELS).map_err(|_| "a NUL in the kernels' source")?;
    let prog = cudarc::nvrtc::result::create_program(&src, None)
        .map_err(|e| format!("NVRTC: creating a program: {e:?}"))?;
    let arch = format!("--gpu-architecture=sm_{major}{minor}");
    // SAFETY: `prog` is live until destroyed at the end, and every pointer
    // handed to NVRTC points at memory that outlives the call.
    let built = unsafe {
        match cudarc::nvrtc::result::compile_program(prog, &[arch.as_str()]) {
            Err(e) => {
                let log: String = cudarc::nvrtc::result::get_program_log(prog)
                    .map(|l| {
                        l.iter()
                            .map(|&c| c as u8 as char)
                            .filter(|&c| c != '\0')
                            .collect()
                    })
                    .unwrap_or_default();
                Err(format!(
                    "NVRTC refused the kernels for sm_{major}{minor} ({e:?}):\n{log}"
                ))
            }
            Ok(()) => {
                let mut size = 0usize;
                let sized = cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size);
                let mut cubin = vec![0u8; size];
                let got = if sized == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                    cudarc::nvrtc::sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                } else {
                    sized
                };
                match got {
                    cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS if size > 0 => Ok(cubin),
                    status => Err(format!("NVRTC gave no machine code ({status:?})")),
                }
            }
        }
    };
    // SAFETY: not used after this.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    built
}

fn compile_kernels(arch: Option<&'static str>) -> std::result::Result<Ptx, String> {
    let opts = cudarc::nvrtc::CompileOptions {
        arch,
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts).map_err(|e| match e {
        CompileError::CompileError { log, .. } => {
            format!("NVRTC refused the kernels:\n{}", log.to_string_lossy())
        }
        other => format!("NVRTC: {other:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::Kernel;

    /// NVRTC needs no GPU, so the kernels are compiled by the real NVRTC
    /// wherever libnvrtc loads: `scripts/test.sh` fetches CUDA 12.6's from
    /// PyPI, puts it on `LD_LIBRARY_PATH` and sets `FLOTILLA_REQUIRE_NVRTC`,
    /// which makes its absence a failure. Every kernel must come out as a
    /// PTX entry under its plain name, which is what `load_function` asks for.
    /// The PTX's kernels as (name, body up to the next kernel or function).
    fn ptx_entries(src: &str) -> impl Iterator<Item = (&str, &str)> {
        src.split("\n.")
            .filter_map(|part| {
                let part = part.strip_prefix("visible .").unwrap_or(part);
                part.strip_prefix("entry ")
            })
            .filter_map(|entry| Some((entry.split('(').next()?, entry)))
    }

    #[test]
    fn kernels_compile_with_nvrtc() {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            assert!(
                std::env::var_os("FLOTILLA_REQUIRE_NVRTC").is_none(),
                "FLOTILLA_REQUIRE_NVRTC is set but libnvrtc did not load"
            );
            eprintln!("libnvrtc did not load: kernel compilation not checked");
            return;
        }
        // NVRTC's default architecture (GPUs before sm_80: `attention_mma`
        // a stub) and compute_80 (tensor cores), as `kernels_ptx` compiles.
        for arch in [None, Some("compute_80")] {
            let ptx = compile_kernels(arch)
                .unwrap_or_else(|e| panic!("{arch:?}: NVRTC refuses the kernels: {e}"));
            let src = ptx.to_src();
            for k in Kernel::ALL {
                assert!(
                    src.contains(&format!(".entry {}(", k.name())),
                    "{arch:?}: no PTX entry {}",
                    k.name()
                );
            }
            // Arrays the compiler could not keep in registers (an index
            // it cannot resolve) would go to local memory, slow on a GPU.
            // Allowed: `doy_encoding`'s (the quadrant double `sincos`
            // returns through memory; its slow path for huge arguments is
            // a function of its own, which no day reaches).
            let local: Vec<&str> = ptx_entries(&src)
                .filter(|(name, body)| *name != "doy_encoding" && body.contains(".local"))
                .map(|(name, _)| name)
                .collect();
            assert!(
                local.is_empty(),
                "{arch:?}: kernels using local memory: {local:?}"
            );
            let mma = ptx_entries(&src).any(|(name, body)| {
                name == "attention_mma"
                    && body.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
            });
            assert_eq!(mma, arch.is_some(), "{arch:?}: mma.sync in the PTX: {mma}");
        }
        // Through the on-disk cache as `kernels_ptx` goes: compiled once,
        // then the same PTX read back, in a fraction of the time.
        let cache = tempfile::tempdir().expect("a temporary directory");
        let version = nvrtc_version().expect("NVRTC's version");
        let parts: &[&[u8]] = &[KERNELS.as_bytes(), b"compute_80", version.as_bytes()];
        let through_cache = || {
            let started = std::time::Instant::now();
            let (ptx, origin) = kernel_cache::ptx_cached(Ok(cache.path()), parts, || {
                compile_kernels(Some("compute_80")).map(|p| p.to_src())
            })
            .expect("compute_80 compiles");
            (ptx, origin, started.elapsed())
        };
        let (compiled, first, t_compiled) = through_cache();
        let (cached, second, t_cached) = through_cache();
        assert!(
            matches!(first, kernel_cache::Origin::Compiled { stored: Ok(_), .. }),
            "{first}"
        );
        assert!(
            matches!(second, kernel_cache::Origin::Cached(_)),
            "{second}"
        );
        assert_eq!(compiled, cached, "the cache gave back other PTX");
        eprintln!("{version}, compute_80: compiled in {t_compiled:?}, read from the cache in {t_cached:?}");
        // And on to an H100/H200's machine code, where ptxas says what each
        // kernel needs: `attention_mma` keeps its running output in
        // registers, and spilling them would undo the point of it.
        let src = std::ffi::CString::new(KERNELS).expect("no NUL in the kernels");
        let prog = cudarc::nvrtc::result::create_program(&src, None).expect("an NVRTC program");
        // SAFETY: prog is a live program; the options are plain strings.
        let compiled = unsafe {
            cudarc::nvrtc::result::compile_program(
                prog,
                &["--gpu-architecture=sm_90", "--ptxas-options=-v"],
            )
        };
        // SAFETY: as above; the log is read once compilation has returned.
        let log = unsafe { cudarc::nvrtc::result::get_program_log(prog) }.expect("NVRTC's log");
        // SAFETY: prog is not used after this.
        let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
        let log: String = log
            .iter()
            .map(|&c| c as u8 as char)
            .filter(|&c| c != '\0')
            .collect();
        assert!(compiled.is_ok(), "sm_90: {compiled:?}\n{log}");
        let mma = log
            .split("Compiling entry function 'attention_mma'")
            .nth(1)
            .and_then(|rest| rest.split("Compiling entry function").next())
            .unwrap_or_else(|| panic!("ptxas said nothing of attention_mma:\n{log}"));
        eprintln!("attention_mma on sm_90:{mma}");
        assert!(
            mma.contains(" 0 bytes spill stores"),
            "attention_mma spills:{mma}"
        );
        // The machine code a driver that refuses the PTX gets instead: an
        // ELF image naming every kernel (and a GPU NVRTC does not know is
        // an error that says so, not an empty image).
        let cubin = kernels_cubin(9, 0).expect("sm_90 machine code");
        assert_eq!(kernels_cubin(9, 0), Ok(cubin.clone()), "not kept");
        assert_eq!(&cubin[..4], b"\x7fELF", "not an ELF image");
        for k in Kernel::ALL {
            assert!(
                cubin
                    .windows(k.name().len())
                    .any(|w| w == k.name().as_bytes()),
                "no {} in the machine code",
                k.name()
            );
        }
        let refused = compile_cubin(1, 0).expect_err("sm_10 is no GPU NVRTC builds for");
        assert!(refused.contains("sm_10"), "{refused}");
    }
}
