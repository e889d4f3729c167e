//! Job kinds, the specs clients submit for them, and job states.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::api::FieldError;

/// Where a job is in its life. Every transition is one SQL statement guarded
/// by the current state (and lease token), see the server's `queue` module.
///
/// `queued → leased → running → succeeded | failed | cancelled`; a job whose
/// lease expired or whose attempt failed retryably goes to `retrying` (queued
/// again after a back-off) until it runs out of attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum JobState {
    Queued,
    Leased,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Retrying,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Queued,
        JobState::Leased,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Retrying,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Leased => "leased",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Retrying => "retrying",
        }
    }

    /// A final state: nothing will happen to the job any more.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown job state `{0}`")]
pub struct UnknownJobState(pub String);

impl FromStr for JobState {
    type Err = UnknownJobState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownJobState(s.to_string()))
    }
}

/// What a job does. The `kind` tag is the JSON field clients send.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum JobSpec {
    /// A shell command run by `sh -c` (`cmd /C` on Windows).
    Command(CommandJob),
    /// One step of an opam reverse-dependency run: phase 1 (plan) or one
    /// shard of phase 2 (solve). Made by the server for a revdeps run.
    Revdeps(RevdepsJob),
    /// Encode one TESSERA tile for one year. Made by the server for an ROI.
    Tile(TileJob),
    /// One job of a pipeline run: list its items, run a stage for one item,
    /// or one half of a move. Made by the server for a pipeline run.
    Step(StepJob),
}

/// What the dashboard and other callers who may not see secrets show in
/// place of a secret value.
pub const REDACTED: &str = "(secret)";

impl CommandJob {
    /// The same job with the values of its secret variables replaced by
    /// [`REDACTED`].
    pub fn redacted(mut self) -> Self {
        for name in &self.secret_env {
            if let Some(v) = self.env.get_mut(name) {
                *v = REDACTED.to_string();
            }
        }
        self
    }
}

impl JobSpec {
    /// The outputs an attempt must upload before it may succeed, and the
    /// only names it may upload: a command job's `outputs`, a tile job's
    /// two arrays, nothing for a revdeps step (its answer is the result).
    pub fn declared_outputs(&self) -> Vec<String> {
        match self {
            JobSpec::Command(c) => c.outputs.clone(),
            JobSpec::Tile(t) => t.tile.output_names().to_vec(),
            JobSpec::Revdeps(_) => Vec::new(),
            JobSpec::Step(s) => match s.action {
                StepAction::Send { .. } => vec![StepJob::SENT_OUTPUT.to_string()],
                _ => Vec::new(),
            },
        }
    }

    /// The spec as it may be shown to someone who may not see secrets.
    pub fn redacted(self) -> Self {
        match self {
            JobSpec::Command(c) => JobSpec::Command(c.redacted()),
            other => other,
        }
    }

    /// The kind of job this spec describes (its name is what the `jobs.kind`
    /// column stores and is matched against the kinds an agent runs).
    pub fn kind(&self) -> JobKind {
        match self {
            JobSpec::Command(_) => JobKind::Command,
            JobSpec::Revdeps(_) => JobKind::Revdeps,
            JobSpec::Tile(_) => JobKind::Tile,
            JobSpec::Step(_) => JobKind::Step,
        }
    }
}

/// The kinds of job, as the `kind` tag of a [`JobSpec`], the `jobs.kind`
/// column and the kinds an agent registers name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum JobKind {
    Command,
    Revdeps,
    Tile,
    Step,
}

impl JobKind {
    pub const ALL: [JobKind; 4] = [
        JobKind::Command,
        JobKind::Revdeps,
        JobKind::Tile,
        JobKind::Step,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Command => "command",
            JobKind::Revdeps => "revdeps",
            JobKind::Tile => "tile",
            JobKind::Step => "step",
        }
    }
}

impl fmt::Display for JobKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown job kind `{0}`: the kinds are command, revdeps, tile and step")]
pub struct UnknownJobKind(pub String);

impl FromStr for JobKind {
    type Err = UnknownJobKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownJobKind(s.to_string()))
    }
}

/// A shell command with its environment, working directory and declared
/// output files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommandJob {
    pub command: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names in `env` whose values are secret: the API shows them only to
    /// the job's submitter and admins, and the dashboard never.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub secret_env: BTreeSet<String>,
    /// Working directory on the agent; relative paths are taken under the
    /// agent's per-job work directory, which is also the default.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Wall-clock limit of one attempt; the process tree is terminated when
    /// it runs out.
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// Files the command produces, relative to its working directory. Each is
    /// uploaded to the object store (size and sha256 recorded) before the job
    /// is reported succeeded; a missing one fails the attempt.
    #[serde(default)]
    pub outputs: Vec<String>,
}

/// One job of a pipeline run, on one host: the agent that takes it runs it
/// itself ([`StepHost::Local`]) or over ssh ([`StepHost::Ssh`]). Every
/// command runs under `sh -c` (remotely `ssh -tt HOST sh -c …`, so that
/// the remote side gets the hang-up when the job is stopped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepJob {
    pub run_id: uuid::Uuid,
    /// The item's id (empty for [`StepAction::List`]).
    pub item: String,
    /// The step's name in the pipeline file (`items` for the listing).
    pub step: String,
    pub host: StepHost,
    pub action: StepAction,
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

impl StepJob {
    /// The output a [`StepAction::Send`] uploads: a tar of the path.
    pub const SENT_OUTPUT: &'static str = "move.tar";
}

/// Where a step's commands run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum StepHost {
    /// On the agent that took the job.
    Local,
    /// On an ssh host the agent connects to.
    Ssh(crate::pipeline::spec::SshTarget),
}

/// What a step job does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum StepAction {
    /// Run `command`; its stdout, one item id per line, is the result
    /// ([`StepItems`]).
    List { command: String },
    /// A stage for one item. `command` is expanded already, `{out}` being
    /// `"$FLOTILLA_OUT"`. With `out`: the agent sets `FLOTILLA_OUT` to this
    /// attempt's own temporary path (`out.temp-JOB-ATTEMPT`), removes it,
    /// makes its parent (and the path itself when `out.dir`), runs the
    /// command, fails the attempt when the path does not exist afterwards,
    /// and otherwise renames it to `out.path` (replacing what was there)
    /// and removes other attempts' leftovers. With `consume`: that path is
    /// removed after the rename.
    Run {
        command: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        out: Option<StepOut>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        consume: Option<String>,
    },
    /// The first half of a move: `path` (a file or a directory) packed as a
    /// tar with one entry named as its last component, uploaded as
    /// [`StepJob::SENT_OUTPUT`].
    Send { path: String },
    /// The second half: the sending job's tar (`GET jobs/{id}/moved` on
    /// the agent protocol), its size and sha256 checked against `size` and
    /// `sha256`, unpacked beside `path` under a temporary name and renamed
    /// to `path`.
    Receive {
        size: u64,
        sha256: String,
        path: String,
    },
    /// Removes `path` (the source of a move that arrived).
    Remove { path: String },
    /// Which of `paths` exist (the outputs a run of the same file may have
    /// left, so that each item resumes after the furthest): a
    /// [`StepProbe`] result. The paths reach the shell on its stdin, one a
    /// line, however many there are.
    Probe { paths: Vec<String> },
}

/// The result of a [`StepAction::Probe`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepProbe {
    pub exist: Vec<String>,
}

/// Where a stage's output goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepOut {
    /// The final path.
    pub path: String,
    /// The prefix of what the command writes to: each attempt writes
    /// `TEMP-JOB-ATTEMPT` (the command's `$FLOTILLA_OUT`, which `{out}`
    /// expands to), beside `path`, renamed to it on success.
    pub temp: String,
    /// Make `temp` as a directory before the command runs (the pipeline's
    /// `out` ended in `/`).
    pub dir: bool,
}

/// The result of a [`StepAction::List`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepItems {
    pub items: Vec<String>,
}

/// One tile of one year of a dataset. The agent fetches the dataset's
/// checkpoint (cached by `checkpoint_sha256`) and the tile's inputs
/// (`GET jobs/{id}/checkpoint` and `jobs/{id}/inputs/{file}`, or by running
/// `fetch_command`), encodes them with its device profile and uploads
/// `grid_X_Y.npy` (int8 (H,W,128)) and `grid_X_Y_scales.npy` (f32 (H,W)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TileJob {
    pub dataset: String,
    pub year: i32,
    /// The tile's name, `grid_{lon:.2f}_{lat:.2f}`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub tile: crate::grid::TileId,
    /// The checkpoint's sha256: the agent's cache key.
    pub checkpoint_sha256: String,
    /// A shell command that writes the tile's inputs into `$FLOTILLA_OUT`
    /// (with `$FLOTILLA_TILE` and `$FLOTILLA_YEAR` set); without one the
    /// inputs come from the object store through the server.
    #[serde(default)]
    pub fetch_command: Option<String>,
}

impl TileJob {
    /// The input files of a tile in the geotessera preprocessing layout:
    /// what the agent downloads (`GET jobs/{id}/inputs/{file}`) or expects
    /// a fetch command to write.
    pub const INPUT_FILES: [&'static str; 7] = [
        "bands.npy",
        "masks.npy",
        "doys.npy",
        "sar_ascending.npy",
        "sar_ascending_doy.npy",
        "sar_descending.npy",
        "sar_descending_doy.npy",
    ];
}

/// A step of a revdeps run. The agent reads the opam repository at `repo`
/// (`PATH[:REV]`, a git object database or a directory, on the agent's
/// host).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RevdepsJob {
    pub run_id: uuid::Uuid,
    pub repo: String,
    /// `name.version`.
    pub target: String,
    pub variant: RevdepsVariant,
    pub query: RevdepsQuery,
    pub step: RevdepsStep,
}

/// The switch the question is asked in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RevdepsVariant {
    /// The invariant compiler, `name.version`, e.g. `ocaml-base-compiler.4.14.2`.
    pub compiler: String,
    pub arch: String,
    pub os: String,
    pub os_family: String,
    pub os_distribution: String,
    pub os_version: String,
    pub opam_version: String,
    /// System packages the host's package manager cannot provide: a
    /// package whose `depexts` name one is unavailable, as opam 2.1 finds
    /// on such a host. `None`: the bundled list of Debian 12 (main) where
    /// the host is Debian 12, none elsewhere (every system package taken
    /// as available; [`RevdepsVariant::depexts_note`] says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_depexts: Option<Vec<String>>,
}

impl RevdepsVariant {
    /// Whether the bundled Debian 12 list of missing system packages is
    /// this host's when it gives none.
    pub fn is_debian_12(&self) -> bool {
        // As `opam-revdeps` decides for its own --missing-depexts default.
        self.os_family == "debian" && self.os_distribution == "debian" && self.os_version == "12"
    }

    /// What a step says about system packages when the run gave no list
    /// for a host other than Debian 12; `None` otherwise.
    pub fn depexts_note(&self) -> Option<String> {
        (self.missing_depexts.is_none() && !self.is_debian_12()).then(|| {
            format!(
                "depexts: no list of the system packages {} {} lacks was given \
                 (missing_depexts), so every one is taken as available; \
                 `opam-revdeps --list-host-depexts` names those to check on such a host",
                self.os_distribution, self.os_version
            )
        })
    }

    /// `compiler` on the host opam-repo-ci's Debian 12 workers report, and
    /// the one the reference answers in `shared/fixtures/opam` were made on:
    /// `arch=x86_64 os=linux os-family=debian os-distribution=debian
    /// os-version=12`, opam 2.1.2.
    pub fn debian_12(compiler: impl Into<String>) -> Self {
        RevdepsVariant {
            compiler: compiler.into(),
            arch: "x86_64".into(),
            os: "linux".into(),
            os_family: "debian".into(),
            os_distribution: "debian".into(),
            os_version: "12".into(),
            opam_version: "2.1.2".into(),
            missing_depexts: None,
        }
    }
}

/// Which of opam's reverse-dependency questions a run asks (the queries
/// opam-repo-ci runs, each `opam list --depends-on TARGET --coinstallable-with
/// TARGET,COMPILER --all-versions` with these flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum RevdepsQuery {
    /// The union of the three below, without the target itself.
    #[default]
    Union,
    /// `--depopts`.
    Depopts,
    /// `--recursive`.
    Recursive,
    /// `--with-test --depopts`.
    WithTestDepopts,
}

impl RevdepsQuery {
    pub const ALL: [RevdepsQuery; 4] = [
        RevdepsQuery::Union,
        RevdepsQuery::Depopts,
        RevdepsQuery::Recursive,
        RevdepsQuery::WithTestDepopts,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RevdepsQuery::Union => "union",
            RevdepsQuery::Depopts => "depopts",
            RevdepsQuery::Recursive => "recursive",
            RevdepsQuery::WithTestDepopts => "with-test-depopts",
        }
    }
}

impl fmt::Display for RevdepsQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown revdeps query `{0}`: use union, depopts, recursive or with-test-depopts")]
pub struct UnknownRevdepsQuery(pub String);

impl FromStr for RevdepsQuery {
    type Err = UnknownRevdepsQuery;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RevdepsQuery::ALL
            .into_iter()
            .find(|q| q.as_str() == s)
            .ok_or_else(|| UnknownRevdepsQuery(s.to_string()))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum RevdepsStep {
    /// Phase 1: answer the candidates, in the query's answer order, as a
    /// [`RevdepsPlan`] result.
    Plan,
    /// Phase 2 on one contiguous slice of the plan's candidates; answers a
    /// [`RevdepsShardResult`].
    Solve {
        shard: u32,
        candidates: Vec<RevdepsCandidate>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RevdepsCandidate {
    /// `name.version`.
    pub pkg: String,
    /// Which queries selected it (the revdeps crate's query bits).
    pub queries: u8,
}

/// Result of a plan step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RevdepsPlan {
    pub candidates: Vec<RevdepsCandidate>,
    pub load_ms: u64,
    pub phase1_ms: u64,
}

/// Result of a solve step: the candidates that are coinstallable with the
/// target, in the order they were given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RevdepsShardResult {
    pub found: Vec<String>,
    pub load_ms: u64,
    pub phase2_ms: u64,
}

/// Why an attempt failed, as the agent classes it. The class decides whether
/// the job is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// Worth another attempt (non-zero exit, lost input, full disk, …).
    Retryable,
    /// Will fail again whatever we do (bad spec, missing output declared).
    Fatal,
    /// Ran past its timeout; retried like `Retryable`.
    TimedOut,
    /// Stopped because a cancel was requested.
    Cancelled,
    /// Lost to its agent, not to the job: the agent shut down or restarted
    /// under it. Retried like `Retryable`; a step job (one attempt unless
    /// its stage says `retries`) gets that attempt back, up to
    /// [`limits::MAX_INTERRUPTIONS`] times, so that restarting an agent
    /// does not fail a pipeline's items. An expired lease counts the same.
    Interrupted,
}

/// Limits the server enforces on submitted jobs. Every string and list a
/// client sends has one, so a submission's size is bounded by what it is
/// for and not only by the request body limit.
pub mod limits {
    pub const MAX_ATTEMPTS: u32 = 100;
    /// Attempts a step job gets back for being interrupted (its agent shut
    /// down, restarted or went silent); past these an interruption counts,
    /// so a job that brings its agent down does not loop for ever.
    pub const MAX_INTERRUPTIONS: u32 = 3;
    pub const MAX_TIMEOUT_S: u64 = 7 * 24 * 3600;
    pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
    pub const MAX_OUTPUTS: usize = 256;
    pub const MAX_LABELS: usize = 64;
    /// A label key and value. Kubernetes allows 63-character names behind a
    /// 253-character DNS prefix and 63-character values; labels here are
    /// matched the same way (exact key and value), so these are generous.
    pub const MAX_LABEL_KEY_BYTES: usize = 128;
    pub const MAX_LABEL_VALUE_BYTES: usize = 256;
    /// A command job's environment. Linux caps each `NAME=value` string at
    /// 128 KiB (MAX_ARG_STRLEN) and argv with the environment at 2 MiB
    /// (ARG_MAX, with the default 8 MiB stack); these stay well inside both.
    pub const MAX_ENV_VARS: usize = 256;
    pub const MAX_ENV_NAME_BYTES: usize = 256;
    pub const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;
    pub const MAX_ENV_BYTES: usize = 256 * 1024;
    /// Slots of an agent's capacity one job may occupy.
    pub const MAX_COST: u32 = 1024;
    /// A submitter's name (fair-share account) and an ROI's name.
    pub const MAX_NAME_BYTES: usize = 200;
    /// A job's working directory, a revdeps run's repository path.
    pub const MAX_PATH_BYTES: usize = 1024;
    /// A `name.version` (a revdeps target or compiler).
    pub const MAX_NAME_VERSION_BYTES: usize = 256;
    pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;
}

/// A label every agent carries, set by the server at registration: its
/// name. A job with this label runs on that agent only (a pipeline step
/// whose host is that agent, or where an item's output is). Lists of agents
/// leave it out.
pub const AGENT_NAME_LABEL: &str = "flotilla.agent";

/// The label an agent carries when it reaches ssh hosts for pipeline
/// steps (started with `--ssh-dir`); every step job on an ssh host
/// requires it, so no other agent takes one.
pub const SSH_LABEL: (&str, &str) = ("flotilla.ssh", "1");

/// Checks a submission's labels: at most [`limits::MAX_LABELS`], each key
/// non-empty, keys and values within their limits and free of control
/// characters (a NUL would reach PostgreSQL's jsonb, which refuses it).
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if labels.len() > limits::MAX_LABELS {
        return Err(FieldError::at(
            "labels",
            format_args!(
                "has {} keys; at most {} are allowed",
                labels.len(),
                limits::MAX_LABELS
            ),
        ));
    }
    for (k, v) in labels {
        if k.is_empty() {
            return Err(FieldError::at("labels", "has an empty key"));
        }
        check_text(
            &format!("labels.{k}"),
            k,
            "key",
            limits::MAX_LABEL_KEY_BYTES,
        )?;
        check_text(
            &format!("labels.{k}"),
            v,
            "value",
            limits::MAX_LABEL_VALUE_BYTES,
        )?;
    }
    Ok(())
}

/// Checks a command job's environment: at most [`limits::MAX_ENV_VARS`]
/// variables, names without `=` or NUL, values without NUL, each within its
/// limit and all of them within [`limits::MAX_ENV_BYTES`].
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if env.len() > limits::MAX_ENV_VARS {
        return Err(FieldError::at(
            "env",
            format_args!(
                "has {} variables; at most {} are allowed",
                env.len(),
                limits::MAX_ENV_VARS
            ),
        ));
    }
    let mut total = 0;
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(FieldError::at(
                "env",
                format_args!("has a bad variable name {k:?}"),
            ));
        }
        let field = format!("env.{k}");
        if k.len() > limits::MAX_ENV_NAME_BYTES {
            return Err(FieldError::at(
                field,
                format_args!(
                    "has a name longer than {} bytes",
                    limits::MAX_ENV_NAME_BYTES
                ),
            ));
        }
        if v.len() > limits::MAX_ENV_VALUE_BYTES {
            return Err(FieldError::at(
                field,
                format_args!("is longer than {} bytes", limits::MAX_ENV_VALUE_BYTES),
            ));
        }
        if v.contains('\0') {
            return Err(FieldError::at(field, "contains a NUL byte"));
        }
        total += k.len() + v.len() + 2;
    }
    if total > limits::MAX_ENV_BYTES {
        return Err(FieldError::at(
            "env",
            format_args!(
                "is {total} bytes in all; at most {} are allowed",
                limits::MAX_ENV_BYTES
            ),
        ));
    }
    Ok(())
}

/// Checks a name (a submitter, an ROI): 1 to [`limits::MAX_NAME_BYTES`]
/// bytes, not only blanks, no control characters.
pub fn check_name(field: &str, name: &str) -> Result<(), FieldError> {
    if name.trim().is_empty() || name.len() > limits::MAX_NAME_BYTES {
        return Err(FieldError::at(
            field,
            format_args!("must be 1 to {} bytes", limits::MAX_NAME_BYTES),
        ));
    }
    check_text(field, name, "", limits::MAX_NAME_BYTES)
}

/// `text` (the `what` of `field`, e.g. a label's key) is at most `max`
/// bytes and holds no control character: PostgreSQL's text and jsonb refuse
/// NUL, which would otherwise answer 500 instead of naming the field.
pub fn check_text(field: &str, text: &str, what: &str, max: usize) -> Result<(), FieldError> {
    let (long, control) = if what.is_empty() {
        ("is".to_string(), "contains a".to_string())
    } else {
        (format!("has a {what}"), format!("has a {what} with a"))
    };
    if text.len() > max {
        return Err(FieldError::at(
            field,
            format_args!("{long} longer than {max} bytes"),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(FieldError::at(
            field,
            format_args!("{control} control character"),
        ));
    }
    Ok(())
}

/// Checks a declared output path: relative, `/`-separated, no `..`, no
/// empty or `.` components, printable. Returns what is wrong.
pub fn check_output_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("is empty".into());
    }
    if path.len() > 1024 {
        return Err("is longer than 1024 bytes".into());
    }
    if path.starts_with('/') || path.contains('\\') || path.contains(':') {
        return Err("must be a relative path with `/` separators".into());
    }
    if path.chars().any(|c| c.is_control()) {
        return Err("contains a control character".into());
    }
    for part in path.split('/') {
        match part {
            "" => return Err("has an empty component (`//` or a trailing `/`)".into()),
            "." | ".." => return Err(format!("has a `{part}` component")),
            // The local object store keeps an upload's parts as `NAME#N`
            // and refuses such names (it answered 500 before, job after job).
            _ if part
                .rsplit_once('#')
                .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
            {
                return Err(format!("has a component `{part}` ending in `#` and digits"))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_paths_are_checked() {
        assert!(check_output_path("out/result.txt").is_ok());
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "a//b",
            "a/",
            "./a",
            "c:\\x",
            "a\nb",
            "part#1",
            "dir#22/file",
        ] {
            assert!(check_output_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn labels_are_bounded_and_free_of_nul() {
        assert!(check_labels(&map(&[("gpu", "h100"), ("os", "linux")])).is_ok());
        let many: BTreeMap<_, _> = (0..=limits::MAX_LABELS)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        let long_key = "k".repeat(limits::MAX_LABEL_KEY_BYTES + 1);
        let long_value = "v".repeat(limits::MAX_LABEL_VALUE_BYTES + 1);
        for (labels, field) in [
            (many, "labels"),
            (map(&[("", "x")]), "labels"),
            (map(&[(long_key.as_str(), "x")]), ""),
            (map(&[("k", long_value.as_str())]), "labels.k"),
            (map(&[("k", "a\0b")]), "labels.k"),
            (map(&[("a\0b", "v")]), "labels.a\0b"),
        ] {
            let err = check_labels(&labels).unwrap_err();
            if !field.is_empty() {
                assert_eq!(err.field, field, "{err}");
            }
            assert!(err.message.contains(&format!("`{}`", err.field)), "{err}");
        }
    }

    #[test]
    fn env_is_bounded_and_free_of_nul() {
        assert!(check_env(&map(&[("A", "1"), ("B", "two words")])).is_ok());
        let many: BTreeMap<_, _> = (0..=limits::MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert_eq!(check_env(&many).unwrap_err().field, "env");
        let big = "x".repeat(limits::MAX_ENV_VALUE_BYTES + 1);
        assert_eq!(
            check_env(&map(&[("BIG", big.as_str())])).unwrap_err().field,
            "env.BIG"
        );
        // Each value within its limit, all of them together over the total.
        let each = "x".repeat(limits::MAX_ENV_VALUE_BYTES);
        let total: BTreeMap<_, _> = (0..limits::MAX_ENV_BYTES / limits::MAX_ENV_VALUE_BYTES + 1)
            .map(|i| (format!("V{i}"), each.clone()))
            .collect();
        let err = check_env(&total).unwrap_err();
        assert_eq!(err.field, "env");
        assert!(err.message.contains("in all"), "{err}");
        // L11: NUL in a value reached jsonb and answered 500.
        let err = check_env(&map(&[("A", "x\0y")])).unwrap_err();
        assert_eq!(err.field, "env.A");
        assert!(err.message.contains("NUL"), "{err}");
        for bad in ["", "A=B", "A\0"] {
            assert_eq!(check_env(&map(&[(bad, "v")])).unwrap_err().field, "env");
        }
        let long_name = "N".repeat(limits::MAX_ENV_NAME_BYTES + 1);
        assert!(check_env(&map(&[(long_name.as_str(), "v")])).is_err());
    }

    #[test]
    fn names_are_bounded_and_printable() {
        assert!(check_name("submitter", "alice").is_ok());
        for bad in [
            "".to_string(),
            "   ".to_string(),
            "a\0b".to_string(),
            "a\nb".to_string(),
            "n".repeat(limits::MAX_NAME_BYTES + 1),
        ] {
            let err = check_name("submitter", &bad).unwrap_err();
            assert_eq!(err.field, "submitter");
            assert!(err.message.starts_with("`submitter` "), "{err}");
        }
    }

    #[test]
    fn spec_parses_with_kind_tag_and_rejects_unknown_kind() {
        let spec: JobSpec = serde_json::from_str(r#"{"kind":"command","command":"true"}"#).unwrap();
        assert_eq!(spec.kind(), JobKind::Command);
        let err = serde_json::from_str::<JobSpec>(r#"{"kind":"nope","command":"true"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `nope`"), "{err}");
    }

    #[test]
    fn states_round_trip() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), s);
        }
        assert!("done".parse::<JobState>().is_err());
        for k in JobKind::ALL {
            assert_eq!(k.as_str().parse::<JobKind>().unwrap(), k);
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        for q in RevdepsQuery::ALL {
            assert_eq!(q.as_str().parse::<RevdepsQuery>().unwrap(), q);
            assert_eq!(serde_json::to_value(q).unwrap(), q.as_str());
        }
        assert!("pipeline".parse::<JobKind>().is_err());
        assert!("all".parse::<RevdepsQuery>().is_err());
    }
}
