//! The kernels' PTX kept on disk between processes, so that NVRTC compiles
//! `kernels.cu` once per source, architecture and NVRTC version instead of
//! at every start (about a second on a 2-core Zen 4, 0.8-1.0 s for
//! `compute_80`: most of what a short encode spends before its first chunk
//! besides the CUDA context). The driver keeps its own cache of the machine
//! code it makes from PTX (`~/.nv/ComputeCache`); this is the step before.
//!
//! Where: `FLOTILLA_CUDA_KERNEL_CACHE` (a directory; `off` turns the cache
//! off), else `$XDG_CACHE_HOME/flotilla/cuda-kernels`, else
//! `$HOME/.cache/flotilla/cuda-kernels` (`%LOCALAPPDATA%` on Windows).
//!
//! An entry is `kernels-KEY.ptx`, KEY a SHA-256 of what the PTX depends on;
//! its first line names that key and the SHA-256 of the PTX after it, so a
//! truncated or altered entry is compiled again and rewritten, never
//! loaded. Entries are written under a temporary name and renamed into
//! place, so processes starting at once at worst compile twice. On Unix an
//! entry is used only if it and its directory belong to this process's user
//! and no one else may write them: the PTX runs on the GPU with this
//! process's data, and a job running as another user (`--job-user`) must
//! not be able to plant it. The cache is an optimisation: any failure to
//! read or write it falls back to compiling, and says why in [`Origin`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

/// Where the PTX handed back came from, for `tessera-encode backends`.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Read from this entry.
    Cached(PathBuf),
    /// Compiled in `secs`; stored at the path, or not, and why.
    Compiled {
        secs: f64,
        stored: std::result::Result<PathBuf, String>,
    },
    /// Compiled to machine code instead, uncached, and why (the driver
    /// refused the PTX: `cuda/nvrtc.rs`'s `compile_cubin`).
    MachineCode(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Cached(p) => write!(f, "read from the cache ({})", p.display()),
            Origin::Compiled { secs, stored } => {
                write!(f, "compiled by NVRTC in {secs:.2} s")?;
                match stored {
                    Ok(p) => write!(f, ", cached at {}", p.display()),
                    Err(why) => write!(f, ", not cached: {why}"),
                }
            }
            Origin::MachineCode(why) => write!(f, "compiled by NVRTC to machine code for {why}"),
        }
    }
}

/// The cache directory as the environment sets it; `Err` says why there is
/// none (turned off, or no home to put it in).
pub fn dir_from_env() -> std::result::Result<PathBuf, String> {
    match std::env::var_os("FLOTILLA_CUDA_KERNEL_CACHE") {
        Some(v) if v == "off" => return Err("FLOTILLA_CUDA_KERNEL_CACHE=off".into()),
        Some(v) if !v.is_empty() => return Ok(PathBuf::from(v)),
        _ => {}
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            if cfg!(windows) {
                std::env::var_os("LOCALAPPDATA").map(PathBuf::from)
            } else {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            }
        })
        .ok_or("no FLOTILLA_CUDA_KERNEL_CACHE, XDG_CACHE_HOME or HOME to keep it in")?;
    Ok(base.join("flotilla").join("cuda-kernels"))
}

const MAGIC: &str = "// flotilla kernels";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The PTX for `key_parts` (everything the PTX depends on: the source, the
/// options, the compiler's version): from `dir`'s entry when it holds a
/// sound one, else from `compile`, then stored there.
pub fn ptx_cached(
    dir: std::result::Result<&Path, String>,
    key_parts: &[&[u8]],
    compile: impl FnOnce() -> std::result::Result<String, String>,
) -> std::result::Result<(String, Origin), String> {
    let mut h = Sha256::new();
    for part in key_parts {
        // Lengths first, so that no two lists of parts hash alike.
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let key = hex(&h.finalize());
    let entry = dir.map(|d| d.join(format!("kernels-{}.ptx", &key[..32])));
    if let Ok(path) = &entry {
        if let Some(ptx) = read_entry(path, &key) {
            return Ok((ptx, Origin::Cached(path.clone())));
        }
    }
    let started = Instant::now();
    let ptx = compile()?;
    let secs = started.elapsed().as_secs_f64();
    let stored = entry.and_then(|path| {
        write_entry(&path, &key, &ptx)
            .map(|()| path.clone())
            .map_err(|e| format!("{}: {e}", path.display()))
    });
    Ok((ptx, Origin::Compiled { secs, stored }))
}

/// An entry is a few hundred kilobytes; anything much larger is not one.
const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// The entry's PTX if its header names `key` and the PTX's own hash, and
/// (Unix) its folder and the file opened are this user's and no one else's
/// to write. The folder is checked first and the file is checked by what
/// was opened (not looked up again), opened without following a link and
/// without waiting on a pipe, so nothing planted in a shared folder is read.
fn read_entry(path: &Path, key: &str) -> Option<String> {
    use std::io::Read;
    let dir = path.parent()?;
    if !std::fs::metadata(dir).is_ok_and(|m| m.is_dir() && private(&m)) {
        return None;
    }
    let f = open_entry(path).ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_ENTRY_BYTES || !private(&meta) {
        return None;
    }
    let mut text = String::new();
    f.take(MAX_ENTRY_BYTES).read_to_string(&mut text).ok()?;
    let (header, ptx) = text.split_once('\n')?;
    let mut words = header.strip_prefix(MAGIC)?.split_whitespace();
    let (k, sum) = (words.next()?, words.next()?);
    (k == key && sum == hex(&Sha256::digest(ptx.as_bytes()))).then(|| ptx.to_owned())
}

fn open_entry(path: &Path) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    o.open(path)
}

/// Owned by this process's user and writable by no one else (Unix).
#[cfg(unix)]
fn private(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    m.uid() == me && m.mode() & 0o022 == 0
}

#[cfg(not(unix))]
fn private(_: &std::fs::Metadata) -> bool {
    true
}

fn write_entry(path: &Path, key: &str, ptx: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    create_private_dir(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("kernels"),
        std::process::id()
    ));
    let text = format!(
        "{MAGIC} {key} {}\n{ptx}",
        hex(&Sha256::digest(ptx.as_bytes()))
    );
    // This user's alone whatever the umask (0664 under a umask of 002
    // would make every later read refuse it).
    let _ = std::fs::remove_file(&tmp);
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let written = o
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// `dir` and its parents, the new ones readable by this user alone (Unix).
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn compile_counting<'a>(
        calls: &'a Cell<u32>,
        ptx: &'a str,
    ) -> impl FnOnce() -> std::result::Result<String, String> + 'a {
        move || {
            calls.set(calls.get() + 1);
            Ok(ptx.to_owned())
        }
    }

    /// The entry a first start (nothing cached) compiled `ptx` into and
    /// stored; panics if it was not stored.
    fn stored_entry(dir: &Path, parts: &[&[u8]], calls: &Cell<u32>, ptx: &str) -> PathBuf {
        let (got, origin) = ptx_cached(Ok(dir), parts, compile_counting(calls, ptx)).unwrap();
        assert_eq!(got, ptx);
        match origin {
            Origin::Compiled {
                stored: Ok(path), ..
            } => path,
            other => panic!("not stored: {other:?}"),
        }
    }

    #[test]
    fn a_second_start_reads_what_the_first_compiled() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("flotilla").join("cuda-kernels");
        let calls = Cell::new(0);
        let parts: &[&[u8]] = &[b"__global__ void k() {}", b"compute_80", b"12.6"];
        let path = stored_entry(&cache, parts, &calls, ".entry k(");
        assert_eq!(calls.get(), 1);
        let (again, origin) =
            ptx_cached(Ok(&cache), parts, compile_counting(&calls, "other")).unwrap();
        assert_eq!(calls.get(), 1, "compiled again although cached");
        assert_eq!(
            (again.as_str(), origin),
            (".entry k(", Origin::Cached(path.clone()))
        );
        // Another architecture (or source, or NVRTC) is another entry.
        let (_, origin) = ptx_cached(
            Ok(&cache),
            &[parts[0], b"compute_75", parts[2]],
            compile_counting(&calls, ".entry k75("),
        )
        .unwrap();
        assert!(matches!(origin, Origin::Compiled { stored: Ok(p), .. } if p != path));
        assert_eq!(calls.get(), 2);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "cache directory mode {mode:o}");
            // The entry too, whatever the umask (under 002 a 0664 entry
            // was refused at every later start).
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "entry mode {mode:o}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn an_entry_that_is_a_link_or_a_pipe_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let calls = Cell::new(0);
        let parts: &[&[u8]] = &[b"source"];
        let path = stored_entry(dir.path(), parts, &calls, "ptx");
        // A sound entry elsewhere, linked to from the entry's name.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let (_, origin) =
            ptx_cached(Ok(dir.path()), parts, compile_counting(&calls, "ptx")).unwrap();
        assert!(
            matches!(origin, Origin::Compiled { .. }),
            "followed a link: {origin:?}"
        );
        // A pipe (opening it for reading would wait for a writer).
        std::fs::remove_file(&path).unwrap();
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (_, origin) =
            ptx_cached(Ok(dir.path()), parts, compile_counting(&calls, "ptx")).unwrap();
        assert!(
            matches!(origin, Origin::Compiled { stored: Ok(_), .. }),
            "{origin:?}"
        );
        // Replaced by a sound entry, which the next start reads.
        let (_, origin) =
            ptx_cached(Ok(dir.path()), parts, compile_counting(&calls, "ptx")).unwrap();
        assert_eq!(origin, Origin::Cached(path));
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn an_altered_or_truncated_entry_is_compiled_again_and_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let calls = Cell::new(0);
        let parts: &[&[u8]] = &[b"source", b"arch"];
        let path = stored_entry(dir.path(), parts, &calls, ".entry good(");
        let sound = std::fs::read_to_string(&path).unwrap();
        for bad in [
            sound.replace("good", "evil"),
            sound[..sound.len() - 3].to_owned(),
            sound.replacen(MAGIC, "// something else", 1),
            String::new(),
        ] {
            std::fs::write(&path, &bad).unwrap();
            let (ptx, origin) = ptx_cached(
                Ok(dir.path()),
                parts,
                compile_counting(&calls, ".entry good("),
            )
            .unwrap();
            assert_eq!(ptx, ".entry good(", "loaded a bad entry: {bad:?}");
            assert!(matches!(origin, Origin::Compiled { stored: Ok(_), .. }));
            assert_eq!(
                std::fs::read_to_string(&path).unwrap(),
                sound,
                "not rewritten"
            );
        }
        assert_eq!(calls.get(), 5);
    }

    #[cfg(unix)]
    #[test]
    fn an_entry_others_may_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let calls = Cell::new(0);
        let parts: &[&[u8]] = &[b"source"];
        let path = stored_entry(dir.path(), parts, &calls, "ptx");
        for (target, mode) in [(&path, 0o666), (&dir.path().to_path_buf(), 0o777)] {
            let before = std::fs::metadata(target).unwrap().permissions().mode();
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(mode)).unwrap();
            let (_, origin) =
                ptx_cached(Ok(dir.path()), parts, compile_counting(&calls, "ptx")).unwrap();
            assert!(
                matches!(origin, Origin::Compiled { .. }),
                "{} mode {mode:o}: {origin:?}",
                target.display()
            );
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(before)).unwrap();
        }
        // And once both are private again (the rewrite left the entry so),
        // it is read.
        let (_, origin) =
            ptx_cached(Ok(dir.path()), parts, compile_counting(&calls, "ptx")).unwrap();
        assert_eq!(origin, Origin::Cached(path));
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn without_a_cache_or_with_an_unwritable_one_it_compiles() {
        let calls = Cell::new(0);
        let (ptx, origin) =
            ptx_cached(Err("off".into()), &[b"s"], compile_counting(&calls, "ptx")).unwrap();
        assert_eq!(ptx, "ptx");
        assert!(
            matches!(&origin, Origin::Compiled { stored: Err(why), .. } if why == "off"),
            "{origin:?}"
        );
        // A file where the directory should be.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let (ptx, origin) =
            ptx_cached(Ok(&file), &[b"s"], compile_counting(&calls, "ptx")).unwrap();
        assert_eq!(ptx, "ptx");
        assert!(
            matches!(origin, Origin::Compiled { stored: Err(_), .. }),
            "{origin:?}"
        );
        // A refusal of the compiler is the caller's error, cached or not.
        let refused = ptx_cached(Ok(dir.path()), &[b"t"], || Err("NVRTC refused".into()));
        assert_eq!(refused.unwrap_err(), "NVRTC refused");
        assert_eq!(calls.get(), 2);
    }
}
