//! A step attempt's agent-side directory and the agent's own files in it.
//!
//! Those files are opened there without following links.
//!
//! With `--job-user` the attempt's own directory belongs to the job's user,
//! and every job of that user can write into every attempt's directory: a
//! link planted there as `send.tar` would have the agent (root) write a
//! tar over whatever it points to. So the agent keeps its own files (the
//! probe's path list, the tars of a move) in
//! `WORKDIR/agent-side/{job}-{attempt}` ([`JobContext::agent_dir`]): its
//! own, 0700, removed when the attempt ends. Files there are made with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` and read with `O_NOFOLLOW`, and handed to
//! a step's process as open files, never by name.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::JobContext;

/// Makes the attempt's agent-side directory (and `WORKDIR/agent-side`),
/// 0700; either one already there must be a directory of the agent's own
/// user, not a link.
pub fn make(ctx: &JobContext) -> io::Result<()> {
    let dir = &ctx.agent_dir;
    if let Some(parent) = dir.parent() {
        private_dir(parent)?;
    }
    private_dir(dir)
}

fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(io::Error::other(format!(
            "{} is not a directory of the agent's own user",
            dir.display()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Makes `path` anew (nothing may be there, not even a link), readable and
/// writable by the agent only, open for reading and writing.
pub fn create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Opens `path` for reading, refusing a link.
pub fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_never_reached_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("sentinel");
        std::fs::write(&target, "unchanged").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("planted")).unwrap();
        assert!(create(&dir.path().join("planted")).is_err());
        assert!(open(&dir.path().join("planted")).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "unchanged");
        let made = dir.path().join("made");
        create(&made).unwrap();
        assert_eq!(std::fs::metadata(&made).unwrap().mode() & 0o777, 0o600);
        assert!(create(&made).is_err(), "made anew only");
        open(&made).unwrap();
    }

    #[test]
    fn a_linked_directory_is_not_taken_for_the_agents_own() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        assert!(private_dir(&dir.path().join("link")).is_err());
        private_dir(&dir.path().join("a/b")).unwrap();
        let mode = std::fs::metadata(dir.path().join("a/b")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
