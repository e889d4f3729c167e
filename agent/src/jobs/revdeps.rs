//! Revdeps jobs: phase 1 (plan) or a phase-2 shard (solve) of an opam reverse-dependency run.
//!
//! Steps run with the `opam-revdeps` library on a blocking thread. Loaded
//! repositories are kept per `PATH@COMMIT` (the revision resolved at each
//! step, so a `git pull` is seen at once), so the shards an agent takes
//! after its first do not read 18,000 opam files again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use flotilla_core::job::{
    FailureClass, RevdepsCandidate, RevdepsJob, RevdepsPlan, RevdepsQuery, RevdepsShardResult,
    RevdepsStep,
};
use flotilla_core::protocol::{Complete, Fail};
use opam_revdeps::{answer, phase1, phase2, Candidate, Query, Repository, Source, Variant};

use super::JobContext;

/// Repositories loaded by this agent, by resolved source
/// ([`Source::cache_key`]): the [`REPOS_KEPT`] most recently used. Keyed by
/// commit, so every new commit a run names is another whole parsed
/// repository; kept without bound, a long-lived agent's memory grew with
/// each one. A job still running on an evicted one keeps it (an `Arc`)
/// until it ends.
#[derive(Default)]
pub struct RepoCache {
    loaded: Mutex<Loaded>,
}

#[derive(Default)]
struct Loaded {
    /// Each with the count of uses at its last use.
    repos: HashMap<String, (Arc<Repository>, u64)>,
    /// Uses so far.
    uses: u64,
}

impl Loaded {
    /// The next use's count.
    fn tick(&mut self) -> u64 {
        self.uses += 1;
        self.uses
    }
}

/// Repositories kept loaded: a run's plan and its shards name one commit,
/// and two let a run on a new commit start while the last one finishes.
pub const REPOS_KEPT: usize = 2;

impl RepoCache {
    /// The repository and how long loading took (0 when cached).
    fn get(&self, spec: &str) -> Result<(Arc<Repository>, u64), String> {
        let source = Source::parse(spec)
            .resolved()
            .map_err(|e| format!("resolving the opam repository {spec}: {e}"))?;
        let key = source.cache_key();
        {
            let mut loaded = self.lock();
            let now = loaded.tick();
            if let Some((r, used)) = loaded.repos.get_mut(&key) {
                *used = now;
                return Ok((r.clone(), 0));
            }
        }
        let start = Instant::now();
        let repo = Repository::load(&source)
            .map_err(|e| format!("loading the opam repository {spec}: {e}"))?;
        if !repo.errors.is_empty() {
            tracing::warn!(
                files = repo.errors.len(),
                "opam files that did not parse were skipped"
            );
        }
        let repo = Arc::new(repo);
        let mut loaded = self.lock();
        let now = loaded.tick();
        loaded.repos.insert(key, (repo.clone(), now));
        while loaded.repos.len() > REPOS_KEPT {
            let Some(oldest) = loaded
                .repos
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            loaded.repos.remove(&oldest);
        }
        drop(loaded);
        Ok((repo, start.elapsed().as_millis() as u64))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.loaded
            .lock()
            .expect("repository cache lock is never poisoned")
    }
}

/// The library's query for the contract's (one per variant, no fallback).
fn query(q: RevdepsQuery) -> Query {
    match q {
        RevdepsQuery::Union => Query::Union,
        RevdepsQuery::Depopts => Query::Depopts,
        RevdepsQuery::Recursive => Query::Recursive,
        RevdepsQuery::WithTestDepopts => Query::WithTestDepopts,
    }
}

fn variant(job: &RevdepsJob) -> Result<Variant, String> {
    let (name, version) = job
        .variant
        .compiler
        .split_once('.')
        .ok_or_else(|| format!("compiler `{}` is not name.version", job.variant.compiler))?;
    let mut v = Variant::debian12(name, version);
    v.arch = job.variant.arch.clone();
    v.os = job.variant.os.clone();
    v.os_family = job.variant.os_family.clone();
    v.os_distribution = job.variant.os_distribution.clone();
    v.os_version = job.variant.os_version.clone();
    v.opam_version = job.variant.opam_version.clone();
    // The bundled list is Debian 12's: another host gets the one the run
    // gave, or none.
    v.missing_depexts = match &job.variant.missing_depexts {
        Some(names) => names.iter().cloned().collect(),
        None if job.variant.is_debian_12() => v.missing_depexts,
        None => Default::default(),
    };
    Ok(v)
}

/// What a step found.
enum Found {
    Plan(RevdepsPlan),
    Shard {
        candidates: usize,
        result: RevdepsShardResult,
    },
}

impl Found {
    /// The line the job's log ends with.
    fn summary(&self) -> String {
        match self {
            Found::Plan(p) => format!(
                "phase 1: {} candidates (repository loaded in {} ms, phase 1 took {} ms)",
                p.candidates.len(),
                p.load_ms,
                p.phase1_ms
            ),
            Found::Shard { candidates, result } => format!(
                "phase 2: {} of {candidates} candidates found (repository loaded in {} ms, \
                 phase 2 took {} ms)",
                result.found.len(),
                result.load_ms,
                result.phase2_ms
            ),
        }
    }

    fn into_json(self) -> Result<serde_json::Value, String> {
        match self {
            Found::Plan(p) => serde_json::to_value(p),
            Found::Shard { result, .. } => serde_json::to_value(result),
        }
        .map_err(|e| e.to_string())
    }
}

/// Runs a revdeps step on a blocking thread, with as many solver threads as
/// the job's cost. The solver cannot be interrupted: on stop the result is
/// dropped when it arrives. All failures of the step itself are fatal: the
/// same input fails the same way.
pub async fn run(
    ctx: &JobContext,
    repos: &Arc<RepoCache>,
    spec: &RevdepsJob,
) -> Result<Complete, Fail> {
    let what = match &spec.step {
        RevdepsStep::Plan => "phase 1 (plan)".to_string(),
        RevdepsStep::Solve { candidates, .. } => {
            format!("a phase-2 shard of {} candidates", candidates.len())
        }
    };
    ctx.note(format!(
        "revdeps: {what} for {} ({} query, {}) in {} on {} threads",
        spec.target, spec.query, spec.variant.compiler, spec.repo, ctx.cost
    ))
    .await;
    if let Some(note) = spec.variant.depexts_note() {
        ctx.note(note).await;
    }
    let work = {
        let (repos, spec, threads) = (repos.clone(), spec.clone(), ctx.cost as usize);
        tokio::task::spawn_blocking(move || step(&repos, &spec, threads))
    };
    let found = tokio::select! {
        _ = ctx.stop.cancelled() => return Err(ctx.fail(FailureClass::Cancelled, "stopped")),
        r = work => match r {
            Ok(Ok(found)) => found,
            Ok(Err(message)) => return Err(ctx.fail(FailureClass::Fatal, message)),
            Err(e) => {
                return Err(ctx.fail(
                    FailureClass::Retryable,
                    format!("the revdeps step panicked: {e}"),
                ))
            }
        }
    };
    ctx.note(found.summary()).await;
    let result = found
        .into_json()
        .map_err(|message| ctx.fail(FailureClass::Fatal, message))?;
    Ok(ctx.complete(None, vec![], Some(result)))
}

/// Runs one step to what it found, or a message for `fail`.
fn step(cache: &RepoCache, job: &RevdepsJob, threads: usize) -> Result<Found, String> {
    let (repo, load_ms) = cache.get(&job.repo)?;
    let variant = variant(job)?;
    let q = query(job.query);
    let target = repo
        .find(&job.target)
        .map_err(|e| format!("target {}: {e}", job.target))?;
    match &job.step {
        RevdepsStep::Plan => {
            let start = Instant::now();
            let cands = phase1(&repo, &variant, target, q);
            // Hand out candidates in the answer's order, so that shards
            // answered in order concatenate into the answer.
            let ids: Vec<_> = cands.list.iter().map(|c| c.pkg).collect();
            let ordered = answer::lines(&repo, q, &ids);
            let by_name: HashMap<String, u8> = cands
                .list
                .iter()
                .map(|c| (repo.display(c.pkg), c.queries))
                .collect();
            let candidates = ordered
                .into_iter()
                .map(|pkg| RevdepsCandidate {
                    queries: by_name.get(&pkg).copied().unwrap_or(0),
                    pkg,
                })
                .collect();
            let plan = RevdepsPlan {
                candidates,
                load_ms,
                phase1_ms: start.elapsed().as_millis() as u64,
            };
            Ok(Found::Plan(plan))
        }
        RevdepsStep::Solve { candidates, .. } => {
            let start = Instant::now();
            let mut list = Vec::with_capacity(candidates.len());
            for c in candidates {
                let pkg = repo
                    .find(&c.pkg)
                    .map_err(|e| format!("candidate {}: {e}", c.pkg))?;
                list.push(Candidate {
                    pkg,
                    queries: c.queries,
                });
            }
            // phase2 works on candidates sorted by package id; answer in the
            // order we were given.
            let mut sorted = list.clone();
            sorted.sort_by_key(|c| c.pkg);
            let found: std::collections::HashSet<_> =
                phase2(&repo, &variant, target, &sorted, threads.max(1))
                    .into_iter()
                    .collect();
            let found = list
                .iter()
                .filter(|c| found.contains(&c.pkg))
                .map(|c| repo.display(c.pkg))
                .collect();
            let result = RevdepsShardResult {
                found,
                load_ms,
                phase2_ms: start.elapsed().as_millis() as u64,
            };
            Ok(Found::Shard {
                candidates: candidates.len(),
                result,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use flotilla_core::job::{RevdepsJob, RevdepsQuery, RevdepsStep, RevdepsVariant};

    use super::RepoCache;

    fn job_on(variant: RevdepsVariant) -> RevdepsJob {
        RevdepsJob {
            run_id: uuid::Uuid::nil(),
            repo: "/r".into(),
            target: "a.1".into(),
            variant,
            query: RevdepsQuery::Union,
            step: RevdepsStep::Plan,
        }
    }

    /// The bundled list of missing system packages is Debian 12's: another
    /// host without a list of its own checks none (and says so), and a
    /// list given is the one used.
    #[test]
    fn the_bundled_missing_depexts_are_debian_12s_only() {
        let debian = RevdepsVariant::debian_12("ocaml-base-compiler.4.14.2");
        let bundled = super::variant(&job_on(debian.clone())).unwrap();
        assert!(bundled.missing_depexts.len() > 10, "{bundled:?}");
        assert_eq!(debian.depexts_note(), None);

        let alpine = RevdepsVariant {
            os_distribution: "alpine".into(),
            os_family: "alpine".into(),
            os_version: "3.20".into(),
            ..debian.clone()
        };
        assert!(super::variant(&job_on(alpine.clone()))
            .unwrap()
            .missing_depexts
            .is_empty());
        let note = alpine.depexts_note().expect("a note for alpine");
        assert!(
            note.contains("alpine 3.20") && note.contains("missing_depexts"),
            "{note}"
        );

        let given = RevdepsVariant {
            missing_depexts: Some(vec!["gmp-dev".into()]),
            ..alpine
        };
        let v = super::variant(&job_on(given.clone())).unwrap();
        assert_eq!(
            v.missing_depexts.into_iter().collect::<Vec<_>>(),
            ["gmp-dev"]
        );
        assert_eq!(given.depexts_note(), None);
        // Debian 12 with a list of its own takes that list.
        let own = RevdepsVariant {
            missing_depexts: Some(vec![]),
            ..debian
        };
        assert!(super::variant(&job_on(own))
            .unwrap()
            .missing_depexts
            .is_empty());
    }

    fn git(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .status()
            .expect("git runs")
            .success();
        assert!(ok, "git {args:?}");
    }

    fn add_package(dir: &Path, name: &str) {
        let p = dir.join(format!("packages/{name}/{name}.1"));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("opam"), "opam-version: \"2.0\"\n").unwrap();
        git(dir, &["add", "."]);
        git(dir, &["commit", "-q", "-m", name]);
    }

    /// An empty git repository at DIR/opam-repository (a bare-looking
    /// path: a git repository without a checkout of `packages/` at its
    /// root would be read as a directory otherwise).
    fn new_repo(dir: &Path) -> std::path::PathBuf {
        let repo = dir.join("opam-repository");
        std::fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q"]);
        repo
    }

    /// A repository at `HEAD` is read again after a commit: the cache is
    /// keyed on the commit, not on the path (it answered from the old tree
    /// before).
    #[test]
    fn a_new_commit_is_loaded_not_served_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let repo = new_repo(dir.path());
        add_package(&repo, "a");
        let spec = format!("{}:HEAD", repo.display());
        let cache = RepoCache::default();
        let (first, _) = cache.get(&spec).unwrap();
        assert_eq!(first.packages.len(), 1);
        let (again, ms) = cache.get(&spec).unwrap();
        assert_eq!((again.packages.len(), ms), (1, 0), "served from the cache");
        // The checkout itself (a directory with `packages/`), cached too.
        let dir_spec = repo.display().to_string();
        assert_eq!(cache.get(&dir_spec).unwrap().0.packages.len(), 1);
        add_package(&repo, "b");
        let (after, _) = cache.get(&spec).unwrap();
        assert_eq!(after.packages.len(), 2, "the new commit is read");
        assert_eq!(cache.get(&dir_spec).unwrap().0.packages.len(), 2);
    }

    /// Only the most recently used repositories stay loaded: one commit
    /// after another, the cache holds the last [`super::REPOS_KEPT`], and
    /// one used again is kept over an older one (it grew by one per
    /// commit before).
    #[test]
    fn only_the_most_recently_used_repositories_stay_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let repo = new_repo(dir.path());
        let cache = RepoCache::default();
        let (mut commits, mut loaded) = (Vec::new(), Vec::new());
        for name in ["a", "b", "c", "d"] {
            add_package(&repo, name);
            let head = Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["rev-parse", "HEAD"])
                .output()
                .unwrap();
            let spec = format!(
                "{}:{}",
                repo.display(),
                String::from_utf8(head.stdout).unwrap().trim()
            );
            loaded.push(cache.get(&spec).unwrap().0);
            commits.push(spec);
        }
        assert_eq!(cache.lock().repos.len(), super::REPOS_KEPT);
        // The last two are served as loaded; the first is read again.
        let same =
            |i: usize| std::sync::Arc::ptr_eq(&cache.get(&commits[i]).unwrap().0, &loaded[i]);
        assert!(same(3) && same(2), "the last two were loaded again");
        assert!(!same(0), "the first was still loaded");
        // Loading the first evicted the least recently used (commit 3,
        // used before commit 2), not commit 2.
        let kept: Vec<usize> = {
            let loaded = cache.lock();
            let mut n: Vec<usize> = loaded
                .repos
                .values()
                .map(|(r, _)| r.packages.len())
                .collect();
            n.sort();
            n
        };
        assert_eq!(kept, vec![1, 3]);
    }
}
