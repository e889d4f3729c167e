//! A job's declared output, opened as the job left it: never through a symbolic link it planted.
//!
//! With `--job-user` the agent is root and the job is not, so the agent must
//! not read on the job's behalf what the job itself could not: otherwise
//! `ln -s /etc/flotilla/agent.token out` with `out` declared as an output
//! has the agent upload its own token. Every component of the path, from
//! `/` down, is opened relative to the one before with `O_NOFOLLOW`, and
//! only a regular file is accepted. The upload then reads that open file
//! through `/proc/self/fd`, so nothing can be swapped in between.

use std::io;
use std::path::{Path, PathBuf};

/// An output opened without following links; keep it alive while
/// [`OpenedOutput::path`] is read.
pub struct OpenedOutput {
    #[cfg(target_os = "linux")]
    _file: std::fs::File,
    path: PathBuf,
}

impl OpenedOutput {
    /// A path that names exactly the opened file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Opens `path` (absolute) without following any symbolic link on the way;
/// fails unless it is a regular file.
#[cfg(target_os = "linux")]
pub fn open_without_links(path: &Path) -> io::Result<OpenedOutput> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::path::Component;

    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;

    let invalid = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: {why}", path.display()),
        )
    };
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(p) => parts.push(p),
            _ => return Err(invalid("not an absolute path without `..`")),
        }
    }
    if !path.is_absolute() || parts.is_empty() {
        return Err(invalid("not an absolute path to a file"));
    }
    let open = |dir: Option<&OwnedFd>, name: &std::ffi::OsStr, flags: OFlag| {
        let fd =
            openat(dir.map(AsRawFd::as_raw_fd), name, flags, Mode::empty()).map_err(
                |e| match e {
                    nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => invalid(
                        "a component is a symbolic link or not a directory; outputs are read \
                     without following links",
                    ),
                    e => io::Error::new(
                        io::Error::from(e).kind(),
                        format!("{}: {e}", path.display()),
                    ),
                },
            )?;
        // SAFETY: `openat` just returned this descriptor and nothing else owns it.
        Ok::<_, io::Error>(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut dir = open(None, std::ffi::OsStr::new("/"), dir_flags)?;
    let (last, dirs) = parts.split_last().expect("checked non-empty above");
    for part in dirs {
        dir = open(Some(&dir), part, dir_flags)?;
    }
    // O_NONBLOCK: a FIFO planted as an output must not hang the agent; it is
    // refused just below, and a regular file ignores the flag.
    let file = open(
        Some(&dir),
        last,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
    )?;
    let file = std::fs::File::from(file);
    if !file.metadata()?.is_file() {
        return Err(invalid("not a regular file"));
    }
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    Ok(OpenedOutput { _file: file, path })
}

/// Elsewhere jobs run as the agent's own user (`--job-user` is Linux only),
/// so the path is read as it is.
#[cfg(not(target_os = "linux"))]
pub fn open_without_links(path: &Path) -> io::Result<OpenedOutput> {
    Ok(OpenedOutput {
        path: path.to_path_buf(),
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_opens_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().canonicalize().unwrap().join("out.txt");
        std::fs::write(&f, "result").unwrap();
        let opened = open_without_links(&f).unwrap();
        assert_eq!(std::fs::read_to_string(opened.path()).unwrap(), "result");
    }

    #[test]
    fn links_are_not_followed_anywhere_on_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("secret"), "token").unwrap();
        std::os::unix::fs::symlink(root.join("secret"), root.join("out")).unwrap();
        std::fs::create_dir(root.join("real")).unwrap();
        std::fs::write(root.join("real/out"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("linked")).unwrap();
        assert!(open_without_links(&root.join("out")).is_err());
        assert!(open_without_links(&root.join("linked/out")).is_err());
        assert!(open_without_links(&root.join("real/out")).is_ok());
    }

    #[test]
    fn only_regular_files_are_outputs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(open_without_links(&root.join("fifo")).is_err());
        assert!(open_without_links(&root).is_err());
    }
}
