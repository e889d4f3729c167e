//! The typed pipeline file: hosts, the items command, and the steps, each
//! with the place in the file it came from.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::template::Template;

/// A place in a pipeline file: 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Span {
    pub line: u32,
    pub col: u32,
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A whole pipeline file, parsed and checked (see [`super::load`]): every
/// host a step names is declared, every template names only fields known
/// where it is used, names are unique.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineSpec {
    /// Declared hosts by name.
    pub hosts: BTreeMap<String, HostDecl>,
    /// The command that lists the items, one id per line.
    pub items: ItemsDecl,
    /// The steps, in file order. Never empty.
    pub steps: Vec<Step>,
}

/// `host NAME = TARGET`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostDecl {
    pub name: String,
    pub target: HostTarget,
    pub span: Span,
}

/// Where a host's commands run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostTarget {
    /// `agent NAME`: the agent registered under that name.
    Agent { name: String },
    /// `agent labels K=V,K=V`: any agent carrying all these labels. An item
    /// whose output is on one of them stays on that one for the later steps
    /// on this host (its output is there).
    Labels { labels: BTreeMap<String, String> },
    /// `ssh://[USER@]HOST[:PORT] key NAME [via AGENT]`: a machine reached
    /// over ssh by an agent that runs step jobs (`via` names which; without
    /// it, any). `key` names a file in that agent's `--ssh-dir`/keys/.
    Ssh(SshTarget),
}

/// An ssh destination, as an agent connects to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SshTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// A private key's file name in the connecting agent's `--ssh-dir`/keys/
    /// (a bare name, never a path: the parser refuses one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The agent that connects; any agent running step jobs when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

impl fmt::Display for SshTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ssh://")?;
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        f.write_str(&self.host)?;
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// `items on HOST: COMMAND`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemsDecl {
    pub host: String,
    /// Plain shell text: the items command has no template fields.
    pub command: String,
    pub span: Span,
}

/// One step of the pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    Stage(Stage),
    Move(Move),
    /// `limit N { STEPS }`: at most `n` items inside `steps` at once.
    Limit {
        n: u32,
        steps: Vec<Step>,
        span: Span,
    },
    /// `either { STEPS | STEPS | … }`: each item takes the first branch
    /// (in file order) whose first stage has room.
    Either {
        branches: Vec<Vec<Step>>,
        span: Span,
    },
}

/// `stage NAME on HOST [jobs N] [out PATH] [consume] [retries N]
/// [timeout DURATION]: COMMAND`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub name: String,
    pub host: String,
    /// Items running this stage at once (default 1).
    pub jobs: u32,
    /// The path the stage produces on its host. The command sees `{out}` as
    /// a temporary path beside it, renamed into place when it succeeds; a
    /// path ending in `/` is made as a directory before the command runs.
    pub out: Option<Template>,
    /// Delete the item's previous output (`{in}`) once this stage succeeded.
    pub consume: bool,
    /// Attempts after the first when the command fails (default 0).
    pub retries: u32,
    pub timeout_s: Option<u64>,
    pub command: Template,
    pub span: Span,
}

/// `move NAME to HOST:PATH`: the item's latest output is copied to PATH on
/// HOST (through the object store between agents, its size and sha256
/// checked on arrival), then removed where it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Move {
    pub name: String,
    pub host: String,
    pub path: Template,
    pub span: Span,
}

impl Step {
    pub fn span(&self) -> Span {
        match self {
            Step::Stage(s) => s.span,
            Step::Move(m) => m.span,
            Step::Limit { span, .. } | Step::Either { span, .. } => *span,
        }
    }
}
