//! The two halves of a move: a path sent as a tar, and a tar received.
//!
//! A received tar is checked, then unpacked in the path's place.
//!
//! The tar is a file in the attempt's agent-side directory
//! ([`super::agent_side`]), never in the attempt's own: the job's user
//! could plant a link there for the agent to write through. Over ssh both
//! halves stream through `ssh -T`, with the host's own `tar` (scripts in
//! [`super::script`]), the tar handed to `ssh` as its open stdout or
//! stdin. Here, when jobs run as the agent's own user, the `tar` crate
//! packs and unpacks in this process; with `--job-user` the same scripts
//! as over ssh run as that user instead, the tar handed over open the same
//! way, so the agent (root) neither reads what the job could not nor
//! leaves root-owned files where the job's later stages must write.
//!
//! A tar holds exactly one top entry, named as the sent path's last
//! component; links are stored as links, never followed.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use flotilla_core::job::{FailureClass, StepJob};
use flotilla_core::protocol::{Complete, Fail};
use tokio_util::sync::CancellationToken;

use crate::server_api::CallError;

use super::agent_side;
use super::place::{run_script, Io, Place};
use super::script::{self, Marker, PathParts};
use super::{ended, JobContext};

/// Where the tar of a send is written before its upload.
const SENT_FILE: &str = "send.tar";
/// Where the tar of a receive is downloaded before it is unpacked.
const MOVED_FILE: &str = "moved.tar";

/// Packs `path` at `place` into the attempt's agent-side directory and
/// uploads it as [`StepJob::SENT_OUTPUT`].
pub async fn send(
    ctx: &JobContext,
    place: &Place,
    marker: &Marker,
    path: &str,
    timeout: Option<Duration>,
) -> Result<Complete, Fail> {
    let src = parts(ctx, path)?;
    let tar = ctx.agent_dir.join(SENT_FILE);
    if in_process(ctx, place) {
        let from = ctx.job_dir.join(&src.path);
        if std::fs::symlink_metadata(&from).is_err() {
            return Err(ctx.fail(
                FailureClass::Fatal,
                format!("nothing to send: {path} does not exist"),
            ));
        }
        let (to, base, stop) = (tar.clone(), src.base.clone(), ctx.stop.clone());
        let packed = tokio::task::spawn_blocking(move || pack(&from, &base, &to, &stop))
            .await
            .expect("packing does not panic");
        if let Err(e) = packed {
            return Err(stopped_or(
                ctx,
                FailureClass::Retryable,
                format!("packing {path}: {e}"),
            ));
        }
    } else {
        let file = agent_side::create(&tar)
            .map_err(|e| ctx.fail(FailureClass::Retryable, format!("cannot make the tar: {e}")))?;
        let io = Io {
            stdin: None,
            stdout: Some(file),
        };
        let script = script::send(marker, &src);
        let end = run_script(ctx, place, marker, &script, io, timeout, |_| Ok(()))
            .await
            .map_err(|e| ctx.fail(FailureClass::Fatal, e.to_string()))?;
        ended(ctx, place, end, timeout)?;
    }
    let name = StepJob::SENT_OUTPUT;
    let view = tokio::select! {
        r = ctx.upload(name, &tar) => r,
        _ = ctx.stop.cancelled() => return Err(ctx.fail(FailureClass::Cancelled, "stopped")),
    };
    let view = view.map_err(|e| {
        let class = match &e {
            CallError::Local { .. } => FailureClass::Fatal,
            _ => FailureClass::Retryable,
        };
        ctx.fail(class, format!("uploading the tar of {path}: {e}"))
    })?;
    ctx.note(format!(
        "sent {path} from {}: {} bytes, sha256 {}",
        place.describe(),
        view.size,
        view.sha256
    ))
    .await;
    Ok(ctx.complete(Some(0), vec![name.to_string()], None))
}

/// Downloads the sending job's tar, checks its size and sha256, and
/// unpacks its entry at `path` on `place`, replacing what was there.
pub async fn receive(
    ctx: &JobContext,
    place: &Place,
    marker: &Marker,
    (size, sha256): (u64, &str),
    path: &str,
    timeout: Option<Duration>,
) -> Result<Complete, Fail> {
    let dest = parts(ctx, path)?;
    let tar = ctx.agent_dir.join(MOVED_FILE);
    let got = tokio::select! {
        r = ctx.api.download(ctx.lease, "moved", &tar) => r,
        _ = ctx.stop.cancelled() => return Err(ctx.fail(FailureClass::Cancelled, "stopped")),
    };
    let (got_size, got_sha) = got.map_err(|e| {
        let class = if e.is_permanent() {
            FailureClass::Fatal
        } else {
            FailureClass::Retryable
        };
        ctx.fail(class, format!("downloading the moved tar: {e}"))
    })?;
    if got_size != size || !got_sha.eq_ignore_ascii_case(sha256) {
        return Err(ctx.fail(
            FailureClass::Retryable,
            format!(
                "the moved tar is not what was sent: {got_size} bytes with sha256 {got_sha} \
                 arrived, {size} bytes with sha256 {sha256} were sent"
            ),
        ));
    }
    if in_process(ctx, place) {
        let (from, to, stop) = (tar.clone(), ctx.job_dir.join(&dest.path), ctx.stop.clone());
        let unpacked = tokio::task::spawn_blocking(move || unpack(&from, &to, &stop))
            .await
            .expect("unpacking does not panic");
        match unpacked {
            Ok(()) => {}
            Err(UnpackError::Refused(why)) => {
                return Err(ctx.fail(FailureClass::Fatal, format!("the moved tar: {why}")))
            }
            Err(UnpackError::Io(e)) => {
                return Err(stopped_or(
                    ctx,
                    FailureClass::Retryable,
                    format!("unpacking at {path}: {e}"),
                ))
            }
        }
    } else {
        let file = agent_side::open(&tar).map_err(|e| {
            ctx.fail(
                FailureClass::Retryable,
                format!("cannot read the moved tar: {e}"),
            )
        })?;
        let io = Io {
            stdin: Some(file),
            stdout: None,
        };
        let script = script::receive(marker, &dest);
        let end = run_script(ctx, place, marker, &script, io, timeout, |_| Ok(()))
            .await
            .map_err(|e| ctx.fail(FailureClass::Fatal, e.to_string()))?;
        ended(ctx, place, end, timeout)?;
    }
    ctx.note(format!(
        "received {path} on {}: {size} bytes, sha256 {sha256}",
        place.describe()
    ))
    .await;
    Ok(ctx.complete(Some(0), Vec::new(), None))
}

/// Packing and unpacking happen in this process: here, as the agent's
/// own user.
fn in_process(ctx: &JobContext, place: &Place) -> bool {
    matches!(place, Place::Local) && ctx.run_as.user.is_none()
}

fn parts(ctx: &JobContext, path: &str) -> Result<PathParts, Fail> {
    script::split_path(path).map_err(|e| ctx.fail(FailureClass::Fatal, e.to_string()))
}

/// `Cancelled` when the job was stopped (which is what broke the packing
/// or unpacking), else `class` with `message`.
fn stopped_or(ctx: &JobContext, class: FailureClass, message: String) -> Fail {
    if ctx.stop.is_cancelled() {
        ctx.fail(FailureClass::Cancelled, "stopped")
    } else {
        ctx.fail(class, message)
    }
}

/// Writes a tar of `src` to `dest` (made anew, not through a link), with
/// one top entry `base`; links are stored as links. Breaks off with an
/// error once `stop` fires.
pub fn pack(src: &Path, base: &str, dest: &Path, stop: &CancellationToken) -> io::Result<()> {
    let file = agent_side::create(dest)?;
    let mut b = tar::Builder::new(Stoppable {
        inner: io::BufWriter::with_capacity(1 << 20, file),
        stop,
    });
    b.follow_symlinks(false);
    append_tree(&mut b, src, Path::new(base), dest)?;
    let mut w = b.into_inner()?;
    w.flush()?;
    w.inner.into_inner().map_err(|e| e.into_error())?.sync_all()
}

/// `path` as `name`, and for a directory (not a link to one) everything
/// under it, in name order so the same tree gives the same tar. `skip` is
/// the tar being written, should the sent tree hold the agent's work
/// directory.
fn append_tree<W: Write>(
    b: &mut tar::Builder<W>,
    path: &Path,
    name: &Path,
    skip: &Path,
) -> io::Result<()> {
    if path == skip {
        return Ok(());
    }
    b.append_path_with_name(path, name)?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        let mut children = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<Vec<_>>>()?;
        children.sort();
        for child in children {
            append_tree(b, &path.join(&child), &name.join(&child), skip)?;
        }
    }
    Ok(())
}

/// Why a received tar was not unpacked.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The tar is not one a send makes: it would be refused again.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Unpacks `tar` (one top entry) beside `dest` into
/// [`script::receive_dir`], then renames its entry to `dest`, replacing
/// what was there. An entry whose name is absolute or holds `..` is
/// refused before anything is written.
pub fn unpack(tar: &Path, dest: &Path, stop: &CancellationToken) -> Result<(), UnpackError> {
    let dest_text = dest.to_string_lossy();
    let parts = script::split_path(&dest_text).map_err(|e| UnpackError::Refused(e.to_string()))?;
    let top = top_entry(tar)?;
    let tmp = PathBuf::from(script::receive_dir(&parts));
    remove_any(&tmp)?;
    std::fs::create_dir_all(&tmp)?;
    let mut archive = tar::Archive::new(Stoppable {
        inner: io::BufReader::with_capacity(1 << 20, agent_side::open(tar)?),
        stop,
    });
    archive.set_overwrite(true);
    archive.set_preserve_mtime(true);
    archive.unpack(&tmp)?;
    remove_any(dest)?;
    std::fs::rename(tmp.join(top), dest)?;
    std::fs::remove_dir(&tmp)?;
    Ok(())
}

/// The one top entry's name, after checking every entry's name stays
/// under it.
fn top_entry(tar: &Path) -> Result<std::ffi::OsString, UnpackError> {
    let mut archive = tar::Archive::new(agent_side::open(tar)?);
    let mut top: Option<std::ffi::OsString> = None;
    for entry in archive.entries_with_seek()? {
        let entry = entry?;
        let name = entry.path()?;
        let mut components = name.components();
        let first = match components.next() {
            Some(Component::Normal(first)) => first.to_os_string(),
            _ => {
                return Err(UnpackError::Refused(format!(
                    "entry {} is not a relative name",
                    name.display()
                )))
            }
        };
        if components.any(|c| !matches!(c, Component::Normal(_))) {
            return Err(UnpackError::Refused(format!(
                "entry {} leaves its directory",
                name.display()
            )));
        }
        match &top {
            None => top = Some(first),
            Some(t) if *t == first => {}
            Some(t) => {
                return Err(UnpackError::Refused(format!(
                    "it holds more than one top entry ({} and {})",
                    Path::new(t).display(),
                    Path::new(&first).display()
                )))
            }
        }
    }
    top.ok_or_else(|| UnpackError::Refused("it is empty".into()))
}

/// Removes a file, link or tree; nothing there is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    let removed = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    };
    match removed {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// A reader or writer that fails once `stop` fires, so a long pack or
/// unpack on a blocking thread ends soon after its job is stopped.
struct Stoppable<'a, T> {
    inner: T,
    stop: &'a CancellationToken,
}

impl<T> Stoppable<'_, T> {
    fn check(&self) -> io::Result<()> {
        if self.stop.is_cancelled() {
            // Not `Interrupted`: `write_all` and `read_exact` retry that.
            return Err(io::Error::other("the job was stopped"));
        }
        Ok(())
    }
}

impl<T: Read> Read for Stoppable<'_, T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        self.inner.read(buf)
    }
}

impl<T: Write> Write for Stoppable<'_, T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check()?;
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path) {
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/c.txt"), "deep").unwrap();
        std::fs::write(root.join("top.bin"), [0u8, 1, 2, 255, b'\r', b'\n']).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
    }

    #[test]
    fn a_tree_packs_and_unpacks_to_the_same_tree_links_kept_as_links() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        tree(&d.join("src"));
        let stop = CancellationToken::new();
        pack(&d.join("src"), "src", &d.join("t.tar"), &stop).unwrap();
        std::fs::create_dir_all(d.join("dst/old")).unwrap();
        unpack(&d.join("t.tar"), &d.join("dst"), &stop).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.join("dst/a/b/c.txt")).unwrap(),
            "deep"
        );
        assert_eq!(
            std::fs::read(d.join("dst/top.bin")).unwrap(),
            [0u8, 1, 2, 255, b'\r', b'\n']
        );
        assert_eq!(
            std::fs::read_link(d.join("dst/link")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert!(!d.join("dst/old").exists());
        assert!(!d.join(".dst.flotilla-recv").exists());
    }

    #[test]
    fn a_file_packs_under_its_own_name_and_lands_under_the_destination_name() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("one.txt"), "1").unwrap();
        let stop = CancellationToken::new();
        pack(&d.join("one.txt"), "one.txt", &d.join("t.tar"), &stop).unwrap();
        assert_eq!(top_entry(&d.join("t.tar")).unwrap(), "one.txt");
        unpack(&d.join("t.tar"), &d.join("sub/two.txt"), &stop).unwrap();
        assert_eq!(std::fs::read_to_string(d.join("sub/two.txt")).unwrap(), "1");
    }

    #[test]
    fn tars_that_escape_or_hold_two_entries_are_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let stop = CancellationToken::new();
        let write = |names: &[&str]| {
            let mut b = tar::Builder::new(Vec::new());
            for n in names {
                let mut h = tar::Header::new_gnu();
                h.set_size(1);
                h.set_mode(0o644);
                // `set_path` refuses `..`; the raw name field does not.
                h.as_old_mut().name[..n.len()].copy_from_slice(n.as_bytes());
                h.set_cksum();
                b.append(&h, &b"x"[..]).unwrap();
            }
            std::fs::write(d.join("bad.tar"), b.into_inner().unwrap()).unwrap();
        };
        for names in [&["x/../../evil"][..], &["/abs"], &["a", "b"]] {
            write(names);
            let e = unpack(&d.join("bad.tar"), &d.join("dst"), &stop).unwrap_err();
            assert!(matches!(e, UnpackError::Refused(_)), "{names:?}: {e}");
            assert!(!d.join(".dst.flotilla-recv").exists());
            assert!(!d.join("evil").exists());
        }
    }

    #[test]
    fn a_stopped_pack_breaks_off() {
        let dir = tempfile::tempdir().unwrap();
        tree(&dir.path().join("src"));
        let stop = CancellationToken::new();
        stop.cancel();
        let e = pack(
            &dir.path().join("src"),
            "src",
            &dir.path().join("t.tar"),
            &stop,
        )
        .unwrap_err();
        assert!(e.to_string().contains("stopped"), "{e}");
    }
}
