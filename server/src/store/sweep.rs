//! What the store and the server's disk keep that nothing will read again,
//! removed once it is older than a grace period:
//!
//! - superseded checkpoints: `datasets/{name}/checkpoint-{sha256}` objects
//!   that no dataset points at (each `PUT …/checkpoint` writes a new one and
//!   repoints the dataset; agents fetch only the current one);
//! - a local store's staged uploads: object_store's `LocalFileSystem` writes
//!   every upload to `{key}#{n}` beside its key and renames it into place
//!   when it is complete, so a server killed mid-upload leaves the staging
//!   file behind, which no listing shows (`#` and digits is no key a job can
//!   name: `check_output_path` refuses it);
//! - upload spools: the temporary files an upload is parsed from
//!   (`tiles::sandbox::spool`), left in the temporary directory by a kill.
//!
//! The grace period (a day by default) keeps what may still be in use: an
//! upload in progress (its staging file is written to as the body comes),
//! a checkpoint an agent is fetching as it is superseded. An S3 store's
//! incomplete multipart uploads are S3's to expire, with a lifecycle rule
//! (`AbortIncompleteMultipartUpload`, see the README): object_store cannot
//! list them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::TryStreamExt;
use object_store::ObjectStore;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// The prefixes of the server's upload spools in the temporary directory.
pub const SPOOL_PREFIXES: [&str; 2] = ["flotilla-checkpoint-", "flotilla-manifest-"];

/// When and what a sweep removes.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// The directory of a local store (its staging files are swept); `None`
    /// for S3.
    pub local_root: Option<PathBuf>,
    /// How long after it was last written a leftover goes.
    pub grace: Duration,
    /// How often a sweep runs.
    pub interval: Duration,
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep {
            local_root: None,
            grace: Duration::from_secs(24 * 3600),
            interval: Duration::from_secs(3600),
        }
    }
}

/// What one sweep removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub checkpoints: u64,
    pub staged: u64,
    pub spools: u64,
}

/// The least --sweep-after may be: an upload's spool is read for up to 10
/// minutes after its last byte (a manifest import), a staged upload written
/// to at least every minute (the body-stall limit).
pub const LEAST_GRACE: Duration = Duration::from_secs(3600);

/// A minute after start, then every `interval` until `shutdown`: one sweep,
/// logged when it removed anything; a failed sweep is logged and tried
/// again next time. A sweep in progress stops at shutdown.
pub async fn run(
    db: PgPool,
    store: Arc<dyn ObjectStore>,
    sweep: Sweep,
    shutdown: CancellationToken,
) {
    let mut wait = sweep.interval.min(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = sweep.interval;
        let done = tokio::select! {
            _ = shutdown.cancelled() => return,
            done = once(&db, store.as_ref(), &sweep) => done,
        };
        match done {
            Ok(r) if r == SweepReport::default() => {}
            Ok(r) => tracing::info!(
                checkpoints = r.checkpoints,
                staged = r.staged,
                spools = r.spools,
                "swept leftovers from the store"
            ),
            Err(e) => tracing::warn!(error = %e, "sweeping the store"),
        }
    }
}

/// One sweep now: each part on its own, so one that fails does not keep
/// the others from running (the first error is returned after them).
pub async fn once(
    db: &PgPool,
    store: &dyn ObjectStore,
    sweep: &Sweep,
) -> anyhow::Result<SweepReport> {
    let cutoff = SystemTime::now()
        .checked_sub(sweep.grace)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let mut report = SweepReport::default();
    let mut first_error: Option<anyhow::Error> = None;
    match checkpoints_now(db, store, cutoff).await {
        Ok(n) => report.checkpoints = n,
        Err(e) => first_error = Some(e),
    }
    let root = sweep.local_root.clone();
    let (staged, spooled) = tokio::task::spawn_blocking(move || {
        let staged = match &root {
            Some(root) => staged_uploads(root, cutoff),
            None => Ok(0),
        };
        (staged, spools(&std::env::temp_dir(), cutoff))
    })
    .await?;
    for (part, n) in [(&mut report.staged, staged), (&mut report.spools, spooled)] {
        match n {
            Ok(n) => *part = n,
            Err(e) => {
                first_error.get_or_insert(e.into());
            }
        }
    }
    match first_error {
        None => Ok(report),
        Some(e) => {
            tracing::warn!(?report, "a part of the sweep failed; the rest ran");
            Err(e)
        }
    }
}

/// The checkpoint pass, alone under `datasets::CHECKPOINTS_LOCK` (skipped
/// while an upload holds it; the next sweep tries again).
async fn checkpoints_now(
    db: &PgPool,
    store: &dyn ObjectStore,
    cutoff: SystemTime,
) -> anyhow::Result<u64> {
    use crate::tiles::datasets;
    let mut tx = db.begin().await?;
    let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(datasets::CHECKPOINTS_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !free {
        return Ok(0);
    }
    let current = datasets::checkpoint_keys(&mut tx).await?;
    let deleted = superseded_checkpoints(store, &current, cutoff).await?;
    tx.commit().await?;
    Ok(deleted)
}

/// Deletes `datasets/*/checkpoint-*` objects not in `current` and last
/// modified before `cutoff`; returns how many.
pub async fn superseded_checkpoints(
    store: &dyn ObjectStore,
    current: &HashSet<String>,
    cutoff: SystemTime,
) -> object_store::Result<u64> {
    let cutoff: chrono::DateTime<chrono::Utc> = cutoff.into();
    let prefix = object_store::path::Path::from("datasets");
    let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
    let mut deleted = 0;
    for o in objects {
        let key = o.location.to_string();
        let parts: Vec<&str> = key.split('/').collect();
        let is_checkpoint = parts.len() == 3 && parts[2].starts_with("checkpoint-");
        if !is_checkpoint || current.contains(&key) || o.last_modified >= cutoff {
            continue;
        }
        match store.delete(&o.location).await {
            Ok(()) => {
                tracing::info!(%key, "deleted a superseded checkpoint");
                deleted += 1;
            }
            // Another server's sweep took it.
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// Whether `name` is a `LocalFileSystem` staging file: `{key}#{digits}`.
fn is_staging(name: &str) -> bool {
    name.rsplit_once('#')
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn modified_before(meta: &std::fs::Metadata, cutoff: SystemTime) -> bool {
    meta.modified().is_ok_and(|m| m < cutoff)
}

/// Removes staging files under `root` last modified before `cutoff`;
/// returns how many. Symbolic links are not followed.
pub fn staged_uploads(root: &Path, cutoff: SystemTime) -> std::io::Result<u64> {
    let mut removed = 0;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            // Removed meanwhile (retention, a finished upload's directory).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            // Not the server's to read: nothing of its uploads is there.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!(dir = %dir.display(), "the store sweep cannot read this directory");
                continue;
            }
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if meta.is_file()
                && is_staging(&entry.file_name().to_string_lossy())
                && modified_before(&meta, cutoff)
                // A copy in progress: `LocalFileSystem::copy` hard-links
                // the source to `KEY#N` (keeping the source's age), then
                // renames it; a crashed upload's file has one link.
                && std::os::unix::fs::MetadataExt::nlink(&meta) == 1
            {
                remove(&entry.path(), "a staged upload left by a crash")?;
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// Removes the server's upload spools in `dir` (its files named with
/// [`SPOOL_PREFIXES`]) last modified before `cutoff`; returns how many.
pub fn spools(dir: &Path, cutoff: SystemTime) -> std::io::Result<u64> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !SPOOL_PREFIXES.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        // Another user's, or gone meanwhile: not ours to sweep.
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() && modified_before(&meta, cutoff) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(path = %entry.path().display(), "deleted an upload spool left by a kill");
                    removed += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

fn remove(path: &Path, what: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "deleted {what}");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::local::LocalFileSystem;
    use object_store::PutPayload;

    const HOUR: Duration = Duration::from_secs(3600);

    fn aged(path: &Path, age: Duration) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - age).unwrap();
    }

    #[tokio::test]
    async fn only_old_checkpoints_no_dataset_points_at_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        let keys = [
            "datasets/a/checkpoint-old",
            "datasets/a/checkpoint-current",
            "datasets/a/checkpoint-new",
            "datasets/a/notes.txt",
            "datasets/b/checkpoint-old",
            "jobs/x/1/checkpoint-old",
        ];
        for k in keys {
            store
                .put(&k.into(), PutPayload::from_static(b"x"))
                .await
                .unwrap();
        }
        for k in keys {
            if !k.ends_with("-new") {
                aged(&dir.path().join(k), 2 * HOUR);
            }
        }
        let current: HashSet<String> = ["datasets/a/checkpoint-current".to_string()].into();
        let cutoff = SystemTime::now() - HOUR;
        assert_eq!(
            superseded_checkpoints(&store, &current, cutoff)
                .await
                .unwrap(),
            2
        );
        let mut left: Vec<String> = store
            .list(None)
            .map_ok(|o| o.location.to_string())
            .try_collect()
            .await
            .unwrap();
        left.sort();
        assert_eq!(
            left,
            [
                "datasets/a/checkpoint-current",
                "datasets/a/checkpoint-new",
                "datasets/a/notes.txt",
                "jobs/x/1/checkpoint-old"
            ]
        );
    }

    #[test]
    fn only_old_staging_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join("jobs/x/1");
        std::fs::create_dir_all(&job).unwrap();
        for name in ["out.bin#1", "out.bin#2", "out.bin", "notes#v2", "log#"] {
            std::fs::write(job.join(name), b"x").unwrap();
        }
        for name in ["out.bin#1", "out.bin", "notes#v2", "log#"] {
            aged(&job.join(name), 2 * HOUR);
        }
        // A copy in progress: the source hard-linked to `KEY#0`, as old.
        std::fs::hard_link(job.join("out.bin"), job.join("copy.bin#0")).unwrap();
        assert!(is_staging("out.bin#12") && !is_staging("a#b1") && !is_staging("a#"));
        assert_eq!(
            staged_uploads(dir.path(), SystemTime::now() - HOUR).unwrap(),
            1
        );
        let mut left: Vec<String> = std::fs::read_dir(&job)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["copy.bin#0", "log#", "notes#v2", "out.bin", "out.bin#2"]
        );
    }

    #[test]
    fn only_old_spools_of_ours_go() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "flotilla-manifest-abc",
            "flotilla-checkpoint-def",
            "flotilla-manifest-fresh",
            "someone-elses",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
            if !name.ends_with("fresh") {
                aged(&dir.path().join(name), 2 * HOUR);
            }
        }
        assert_eq!(spools(dir.path(), SystemTime::now() - HOUR).unwrap(), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["flotilla-manifest-fresh", "someone-elses"]);
    }
}
