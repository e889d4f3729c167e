//! One multiplexed ssh master connection per host, and the `ssh` command lines that use it.
//!
//! The master is started by the `openssh` crate (`SessionBuilder::connect`,
//! process-mux: the system's `ssh -M -f -N`), which gives its control socket
//! ([`openssh::Session::control_socket`]). Every command of a job then runs
//! as a local `ssh -S SOCKET … HOST -- sh -c 'SCRIPT'` under the agent's
//! process machinery, like a local command: its own process group, its
//! timeout, its lines in the job's log, and a stop that kills the local
//! `ssh`, whose hang-up ends the remote side (`-tt`: the remote command
//! has a terminal, and loses it). Transfers use `-T` instead: a terminal
//! would mangle the tar going through it.
//!
//! Every `ssh`, master or not, reads the agent's `--ssh-dir`/ssh_config
//! and nothing else (`-F`, [`super::ssh_dir`]), logs in with the key the
//! pipeline named from `--ssh-dir`/keys/ only, and reaches only hosts in
//! `--ssh-dir`/known_hosts. An agent without `--ssh-dir` reaches none.
//!
//! A master that died (the host rebooted, the network went) is noticed by
//! `ssh -O check` before each job and replaced. Masters exit on their own
//! [`CONTROL_PERSIST`] after their last use, so an agent killed without
//! closing them leaves none behind for long.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::pipeline::spec::SshTarget;
use flotilla_core::pipeline::template::shell_quote as q;
use openssh::{ControlPersist, KnownHosts, Session, SessionBuilder};

use super::ssh_dir::{KeyError, SshDir};

/// How long connecting may take: a host that does not answer in this long
/// fails the attempt (retryably) rather than holding it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Keepalives on the master: a silent peer is given up after three missed
/// ones (ssh's default `ServerAliveCountMax`), 45 s, so the jobs using it
/// fail instead of hanging on a dead connection.
const SERVER_ALIVE: Duration = Duration::from_secs(15);

/// A master with no client for this long exits (10 min): one left behind by
/// an agent that was killed does not stay forever, and a busy one is reused.
const CONTROL_PERSIST: usize = 600;

/// The longest control socket path: `sun_path` is 108 bytes on Linux (104
/// on the BSDs), with its terminating NUL.
const MAX_SOCKET_PATH: usize = 103;

/// Why no master connection could be had.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error(
        "this agent reaches no ssh hosts; start it with --ssh-dir DIR holding keys/ and \
         known_hosts"
    )]
    NoSshDir,
    #[error(
        "{target} names no key: write `key NAME` for a key file in the agent's --ssh-dir/keys/"
    )]
    NoKey { target: String },
    #[error("{target}: {source}")]
    Key {
        target: String,
        #[source]
        source: KeyError,
    },
    #[error(
        "cannot connect to {target}: its host key is not one {} holds ({reason}); add the \
         host's key there (`ssh-keyscan -p PORT HOST >> {}`), or start the agent with \
         --ssh-accept-new to take a new host's key on first sight",
        known_hosts.display(), known_hosts.display()
    )]
    HostKey {
        target: String,
        known_hosts: PathBuf,
        /// ssh's own words.
        reason: String,
    },
    #[error("cannot make the ssh control directory {}: {source}", path.display())]
    ControlDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the ssh control directory {} is too long a path for a socket in it; give the agent a \
         shorter work directory", path.display()
    )]
    ControlDirTooLong { path: PathBuf },
    #[error("cannot connect to {target}: {reason}")]
    Connect {
        target: String,
        /// The crate's error and what ssh said (its source).
        reason: String,
    },
}

impl SshError {
    /// Whether trying again cannot help until the agent's operator or the
    /// pipeline changes something.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            SshError::NoSshDir
                | SshError::NoKey { .. }
                | SshError::Key { .. }
                | SshError::HostKey { .. }
                | SshError::ControlDirTooLong { .. }
        )
    }
}

/// One host's master connection, when there is one.
type Slot = tokio::sync::Mutex<Option<Arc<Session>>>;

/// The agent's master connections, one per [`SshTarget`], made when a job
/// first needs one.
pub struct SshSessions {
    /// Holds the masters' control directories (`.ssh-connection*/master`).
    control_dir: PathBuf,
    /// The operator's `--ssh-dir`: keys, known hosts, ssh_config; `None`:
    /// this agent reaches no ssh host.
    ssh_dir: Option<SshDir>,
    /// One slot per target; a slot's own lock is held while its master is
    /// checked or made, so jobs for one host wait for one connection while
    /// jobs for other hosts go on.
    hosts: std::sync::Mutex<HashMap<SshTarget, Arc<Slot>>>,
}

impl SshSessions {
    /// Sessions whose sockets live under `dir` (the agent's
    /// `WORKDIR/ssh`), made when the first connection is, with the keys
    /// and known hosts of `ssh_dir` (none without it). Masters an earlier
    /// agent process left there are closed now.
    pub fn new(dir: &Path, ssh_dir: Option<SshDir>) -> Self {
        let control_dir = dir.join("ctl");
        close_leftovers(&control_dir);
        SshSessions {
            control_dir,
            ssh_dir,
            hosts: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// `--ssh-dir`/ssh_config, which every `ssh` command line reads (`-F`);
    /// `None` when the agent reaches no ssh host.
    pub fn config_file(&self) -> Option<PathBuf> {
        self.ssh_dir.as_ref().map(SshDir::config_file)
    }

    /// A live master connection to `target`: the one there is, or a new
    /// one when there is none or it died.
    pub async fn connect(&self, target: &SshTarget) -> Result<Arc<Session>, SshError> {
        let ssh_dir = self.ssh_dir.as_ref().ok_or(SshError::NoSshDir)?;
        let key = match &target.key {
            None => {
                return Err(SshError::NoKey {
                    target: target.to_string(),
                })
            }
            Some(name) => ssh_dir.key(name).map_err(|source| SshError::Key {
                target: target.to_string(),
                source,
            })?,
        };
        let slot = self
            .hosts
            .lock()
            .expect("the hosts map's lock is never poisoned")
            .entry(target.clone())
            .or_default()
            .clone();
        let mut slot = slot.lock().await;
        if let Some(session) = slot.as_ref() {
            match session.check().await {
                Ok(()) => return Ok(session.clone()),
                Err(e) => {
                    tracing::info!(%target, error = %e, "ssh master connection gone; reconnecting")
                }
            }
        }
        *slot = None;
        let session = Arc::new(self.open(ssh_dir, &key, target).await?);
        *slot = Some(session.clone());
        Ok(session)
    }

    async fn open(
        &self,
        ssh_dir: &SshDir,
        key: &Path,
        target: &SshTarget,
    ) -> Result<Session, SshError> {
        let dir_error = |source| SshError::ControlDir {
            path: self.control_dir.clone(),
            source,
        };
        make_private_dir(&self.control_dir).map_err(dir_error)?;
        // `DIR/.ssh-connectionXXXXXX/master`, as the crate names it.
        if self.control_dir.as_os_str().len() + "/.ssh-connectionXXXXXX/master".len()
            > MAX_SOCKET_PATH
        {
            return Err(SshError::ControlDirTooLong {
                path: self.control_dir.clone(),
            });
        }
        let mut b = SessionBuilder::default();
        b.control_directory(&self.control_dir)
            // Not `clean_history_control_directory`: it removes the live
            // sockets of the other hosts' masters too.
            .config_file(ssh_dir.config_file())
            // The crate passes this on the command line, over the file's.
            .known_hosts_check(if ssh_dir.accepts_new_hosts() {
                KnownHosts::Add
            } else {
                KnownHosts::Strict
            })
            // The crate can set the variable but not remove it; empty is
            // "no agent" to ssh (and the file says `IdentityAgent none`).
            .ssh_auth_sock("")
            .keyfile(key)
            .connect_timeout(CONNECT_TIMEOUT)
            .server_alive_interval(SERVER_ALIVE)
            .control_persist(ControlPersist::IdleFor(
                NonZeroUsize::new(CONTROL_PERSIST).expect("CONTROL_PERSIST is not 0"),
            ));
        if let Some(user) = &target.user {
            b.user(user.clone());
        }
        if let Some(port) = target.port {
            b.port(port);
        }
        let session = b.connect(&target.host).await.map_err(|e| {
            // The crate's message is generic; ssh's words are its source.
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                reason = format!("{reason}: {}", s.to_string().trim());
                source = s.source();
            }
            if reason.contains("Host key verification failed")
                || reason.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
            {
                SshError::HostKey {
                    target: target.to_string(),
                    known_hosts: ssh_dir.known_hosts(),
                    reason,
                }
            } else {
                SshError::Connect {
                    target: target.to_string(),
                    reason,
                }
            }
        })?;
        tracing::info!(%target, socket = %session.control_socket().display(), "ssh master connected");
        Ok(session)
    }
}

/// Asks each master left in `control_dir` by an earlier process to exit,
/// and removes their directories.
fn close_leftovers(control_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(control_dir) else {
        return;
    };
    for e in entries.flatten() {
        let socket = e.path().join("master");
        if socket.exists() {
            let _ = std::process::Command::new("ssh")
                .args(["-F", "/dev/null", "-S"])
                .arg(&socket)
                .args(["-O", "exit", "none"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(e.path());
    }
}

fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// How a remote command is attached to the local `ssh`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tty {
    /// `-tt`: a terminal on the remote side, so that stopping the local
    /// `ssh` hangs up the remote process group. Its output arrives on one
    /// stream, lines ending in `\r\n`.
    Yes,
    /// `-T`: plain pipes, byte for byte, for data.
    No,
}

/// A shell command line (for `sh -c`) that runs `script` under `sh -c` on
/// `host` through the master at `socket`. `-F CONFIG` (the agent's
/// `--ssh-dir`/ssh_config): no user's ssh configuration can add a
/// `RemoteCommand`, a `RequestTTY` or a proxy; `-p 9` (the discard port,
/// as the openssh crate does): if the master is gone, `ssh` fails instead
/// of opening a connection of its own; `LogLevel=ERROR` drops "Shared
/// connection to … closed." from every job's log.
pub fn command_line(config: &Path, socket: &Path, host: &str, tty: Tty, script: &str) -> String {
    let flag = match tty {
        Tty::Yes => "-tt",
        Tty::No => "-T",
    };
    // The remote login shell reads one string: `sh -c 'SCRIPT'`.
    let remote = format!("sh -c {}", q(script));
    format!(
        "exec ssh -F {} -S {} -o ControlMaster=no -o BatchMode=yes -o LogLevel=ERROR \
         -p 9 {flag} {} -- {}",
        q(&config.to_string_lossy()),
        q(&socket.to_string_lossy()),
        q(host),
        q(&remote)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remote_script_survives_two_shells() {
        // The local `sh -c` sees LINE; ssh hands the remote shell its last
        // word, which must run SCRIPT verbatim. Checked with a local `sh`
        // standing in for the remote one.
        let script = "printf '%s|' \"it's\" '$HOME' \"a  b\"";
        let line = command_line(
            Path::new("/srv/ssh dir/ssh_config"),
            Path::new("/tmp/x y/master"),
            "host",
            Tty::Yes,
            script,
        );
        let words = shell_words(&line);
        assert_eq!(
            &words[..4],
            ["exec", "ssh", "-F", "/srv/ssh dir/ssh_config"].map(String::from)
        );
        assert!(words.contains(&"/tmp/x y/master".to_string()));
        let remote = words.last().unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(remote)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's|$HOME|a  b|");
    }

    /// The words `sh` splits `line` into.
    fn shell_words(line: &str) -> Vec<String> {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "set -- {}; for w; do printf '%s\\0' \"$w\"; done",
                line.trim_start_matches("exec ")
            ))
            .output()
            .unwrap();
        let mut words = vec!["exec".to_string()];
        words.extend(
            out.stdout
                .split(|b| *b == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned()),
        );
        words
    }
}
