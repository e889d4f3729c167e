//! Attempts' scratch directories: one per attempt, removed after it, the last few failed ones kept.
//!
//! A failed attempt's directory is what one looks at to see why it failed,
//! so the most recent [`WorkDirs::keep_failed`] are kept; older ones, and
//! every successful attempt's, are removed. Agents used to keep every failed
//! attempt's directory, and a job failing in a loop filled the disk.
//!
//! Each attempt also has an agent-side directory
//! ([`WorkDirs::agent_side_for_attempt`]) for the files the agent itself
//! writes and reads for the job. The attempt's own directory belongs to
//! the job's user, who could plant a link there for the agent (root) to
//! follow; the agent-side one is the agent's, 0700, and removed whenever
//! the attempt ends, failed or not.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use uuid::Uuid;

/// [`WorkDirs::keep_failed`] unless configured: enough to compare the last
/// attempts of a job that keeps failing.
pub const DEFAULT_KEEP_FAILED: usize = 3;

pub struct WorkDirs {
    /// `WORKDIR/jobs`.
    root: PathBuf,
    /// `WORKDIR/agent-side`.
    agent_side: PathBuf,
    keep_failed: usize,
    /// Failed attempts' directories still on disk, oldest first.
    failed: Mutex<VecDeque<PathBuf>>,
}

impl WorkDirs {
    /// The attempts' directories under `root`, their agent-side ones
    /// under `agent_side`. Those left from before (a restart, a crash)
    /// count as failed, by age; agent-side ones from before are removed.
    pub fn new(root: PathBuf, agent_side: PathBuf, keep_failed: usize) -> Self {
        let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| {
                let t = e.metadata().and_then(|m| m.modified());
                (t.unwrap_or(std::time::UNIX_EPOCH), e.path())
            })
            .collect();
        found.sort();
        for old in std::fs::read_dir(&agent_side)
            .into_iter()
            .flatten()
            .flatten()
        {
            remove(&old.path());
        }
        let dirs = WorkDirs {
            root,
            agent_side,
            keep_failed,
            failed: Mutex::new(found.into_iter().map(|(_, p)| p).collect()),
        };
        for old in dirs.beyond_bound() {
            remove(&old);
        }
        dirs
    }

    /// How many failed attempts' directories are kept.
    pub fn keep_failed(&self) -> usize {
        self.keep_failed
    }

    /// The directory of `attempt` of `job` (made by the kind that needs it).
    pub fn for_attempt(&self, job: Uuid, attempt: u32) -> PathBuf {
        self.root.join(format!("{job}-{attempt}"))
    }

    /// The agent-side directory of `attempt` of `job`: only the agent's
    /// user may enter it (made, 0700, by the kind that needs it).
    pub fn agent_side_for_attempt(&self, job: Uuid, attempt: u32) -> PathBuf {
        self.agent_side.join(format!("{job}-{attempt}"))
    }

    /// After the attempt: its directory is removed if it succeeded, else
    /// kept as one of the last failed ones, the oldest beyond the bound
    /// removed; its agent-side directory is removed either way. On a
    /// blocking thread: a job's tree may be large.
    pub async fn finished(&self, dir: &Path, succeeded: bool) {
        let mut doomed = if succeeded {
            vec![dir.to_path_buf()]
        } else {
            self.failed().push_back(dir.to_path_buf());
            self.beyond_bound()
        };
        if let Some(name) = dir.file_name() {
            doomed.push(self.agent_side.join(name));
        }
        let _ = tokio::task::spawn_blocking(move || doomed.iter().for_each(|d| remove(d))).await;
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, VecDeque<PathBuf>> {
        self.failed
            .lock()
            .expect("work directory list lock is never poisoned")
    }

    /// Takes the oldest failed directories beyond the bound off the list.
    fn beyond_bound(&self) -> Vec<PathBuf> {
        let mut failed = self.failed();
        let excess = failed.len().saturating_sub(self.keep_failed);
        failed.drain(..excess).collect()
    }
}

fn remove(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove an attempt's directory")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Makes an attempt's directory with a file in it, as a job would.
    fn attempt(dirs: &WorkDirs, i: u32) -> PathBuf {
        let d = dirs.for_attempt(Uuid::from_u128(1), i);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/out"), b"output").unwrap();
        d
    }

    /// M10: twenty failed attempts left twenty directories.
    #[tokio::test]
    async fn only_the_last_failed_attempts_directories_are_kept() {
        let root = tempfile::tempdir().unwrap();
        let (jobs, side) = (root.path().join("jobs"), root.path().join("agent-side"));
        let dirs = WorkDirs::new(jobs.clone(), side.clone(), 3);
        for i in 1..=20 {
            let d = attempt(&dirs, i);
            std::fs::create_dir_all(dirs.agent_side_for_attempt(Uuid::from_u128(1), i)).unwrap();
            dirs.finished(&d, false).await;
        }
        let last: Vec<String> = (18..=20)
            .map(|i| format!("{}-{i}", Uuid::from_u128(1)))
            .collect();
        assert_eq!(entries(&jobs), last);
        assert!(entries(&side).is_empty(), "agent-side directories go");

        let ok = attempt(&dirs, 21);
        dirs.finished(&ok, true).await;
        assert_eq!(entries(&jobs), last, "a success's directory goes");
        // A kind that made no directory.
        dirs.finished(&dirs.for_attempt(Uuid::from_u128(2), 1), true)
            .await;
    }

    #[tokio::test]
    async fn with_none_kept_every_directory_goes() {
        let root = tempfile::tempdir().unwrap();
        let jobs = root.path().join("jobs");
        let dirs = WorkDirs::new(jobs.clone(), root.path().join("agent-side"), 0);
        let d = attempt(&dirs, 1);
        dirs.finished(&d, false).await;
        assert!(entries(&jobs).is_empty());
    }

    #[test]
    fn at_start_directories_from_before_are_cut_to_the_bound() {
        let root = tempfile::tempdir().unwrap();
        let side = tempfile::tempdir().unwrap();
        for i in 0..5u64 {
            let d = root.path().join(format!("old-{i}"));
            std::fs::create_dir(&d).unwrap();
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i);
            std::fs::File::open(&d).unwrap().set_modified(t).unwrap();
            std::fs::create_dir(side.path().join(format!("old-{i}"))).unwrap();
        }
        let _dirs = WorkDirs::new(root.path().to_path_buf(), side.path().to_path_buf(), 2);
        assert_eq!(entries(root.path()), ["old-3", "old-4"]);
        assert!(entries(side.path()).is_empty(), "every agent-side one goes");
    }
}
