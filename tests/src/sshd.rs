//! An sshd of a test's own on a loopback port, with its own host key, client key and home directory.
//!
//! Uses nothing but std, `tempfile` and `flotilla-core`, so the agent's
//! tests include this file as it is (`#[path]`) instead of depending on
//! this crate.
//!
//! The daemon is the system's `/usr/sbin/sshd` (openssh-server, installed
//! by `scripts/setup-debian.sh --test`): a test that needs it fails, not
//! skips, where it is missing. It accepts only the fixture's client key, as
//! the user the test runs as (root in CI: `PermitRootLogin
//! prohibit-password`). Sessions start in that user's real home; each
//! fixture's [`Sshd::home`] is a directory of its own for the test to
//! put a host's files under, so two fixtures standing for two hosts keep
//! distinct trees on this one machine.
//!
//! An agent reaches a host only with what its `--ssh-dir` holds:
//! [`Sshd::install_for`] puts the fixture's client key there as
//! `keys/`[`Sshd::key_name`] and its host key in `known_hosts`.

use std::fmt;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flotilla_core::pipeline::spec::SshTarget;

/// Where Debian's openssh-server puts the daemon.
pub const SSHD: &str = "/usr/sbin/sshd";

/// How long the daemon may take to accept its first login.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Why the fixture could not start.
#[derive(Debug)]
pub struct SshdError(String);

impl fmt::Display for SshdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SshdError {}

/// A running sshd; killed when dropped.
pub struct Sshd {
    name: String,
    dir: tempfile::TempDir,
    port: u16,
    user: String,
    child: Child,
}

impl Sshd {
    /// Starts an sshd named `name` (in messages and its directory's name)
    /// and waits until a login with the fixture's key runs `true`. The
    /// port comes from the kernel and is released for sshd to take; if
    /// another process takes it first, the start is tried again afresh.
    pub fn start(name: &str) -> Result<Sshd, SshdError> {
        if !Path::new(SSHD).is_file() {
            return Err(SshdError(format!(
                "{SSHD} is missing: install openssh-server (scripts/setup-debian.sh --test does)"
            )));
        }
        let user = current_user().map_err(|e| SshdError(format!("sshd {name}: who am I: {e}")))?;
        if user == "root" {
            // Privilege separation's chroot; the package makes it at boot.
            std::fs::create_dir_all("/run/sshd")
                .map_err(|e| SshdError(format!("sshd {name}: /run/sshd: {e}")))?;
        }
        let mut tries = Vec::new();
        for _ in 0..3 {
            let mut sshd = Self::spawn(name, &user)?;
            match sshd.wait_ready() {
                Ok(()) => return Ok(sshd),
                Err(e) => tries.push(e),
            }
        }
        Err(SshdError(format!(
            "sshd {name} did not start: {}",
            tries.join("; then: ")
        )))
    }

    /// A fresh directory (keys, config, home) and the daemon started on it.
    fn spawn(name: &str, user: &str) -> Result<Sshd, SshdError> {
        use std::os::unix::process::CommandExt;
        let err = |what: &str, e: &dyn fmt::Display| SshdError(format!("sshd {name}: {what}: {e}"));
        let dir = tempfile::Builder::new()
            .prefix(&format!("sshd-{name}-"))
            .tempdir()
            .map_err(|e| err("temp dir", &e))?;
        let d = dir.path();
        std::fs::create_dir(d.join("home")).map_err(|e| err("home dir", &e))?;
        keygen(&d.join("host_key")).map_err(|e| err("host key", &e))?;
        keygen(&d.join("client_key")).map_err(|e| err("client key", &e))?;
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys"))
            .map_err(|e| err("authorized_keys", &e))?;
        let port = free_port().map_err(|e| err("free port", &e))?;
        write_config(d, port).map_err(|e| err("sshd_config", &e))?;
        let log = std::fs::File::create(d.join("sshd.log")).map_err(|e| err("log", &e))?;
        let child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .map_err(|e| err("spawning sshd", &e))?;
        Ok(Sshd {
            name: name.to_string(),
            dir,
            port,
            user: user.to_string(),
            child,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The user logins are accepted for: the one the test runs as.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The client's private key.
    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("client_key")
    }

    /// This host's own directory for the test's files.
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The daemon's log so far (`LogLevel VERBOSE`), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// The name of the client key in an agent's `--ssh-dir`/keys/, as
    /// [`Sshd::install_for`] puts it there (`key NAME` in a pipeline).
    pub fn key_name(&self) -> String {
        format!("{}.key", self.name)
    }

    /// This host's line for an agent's `known_hosts`: its host key, for
    /// `[127.0.0.1]:PORT`.
    pub fn known_hosts_line(&self) -> String {
        let public = std::fs::read_to_string(self.dir.path().join("host_key.pub"))
            .expect("the fixture's host key was made at start");
        let mut words = public.split_whitespace();
        let (kind, key) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        format!("[127.0.0.1]:{} {kind} {key}\n", self.port)
    }

    /// Puts the client key into `ssh_dir/keys/`[`Sshd::key_name`] (0600,
    /// `keys/` made 0700 if missing); nothing about the host key.
    pub fn install_key(&self, ssh_dir: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let keys = ssh_dir.join("keys");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&keys)?;
        let to = keys.join(self.key_name());
        std::fs::copy(self.key_path(), &to)?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
    }

    /// Lets an agent started with `--ssh-dir ssh_dir` reach this host: the
    /// client key into `keys/`, the host key appended to `known_hosts`.
    pub fn install_for(&self, ssh_dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        self.install_key(ssh_dir)?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(ssh_dir.join("known_hosts"))?
            .write_all(self.known_hosts_line().as_bytes())
    }

    /// This daemon as a pipeline's ssh host, its key named as
    /// [`Sshd::install_for`] installs it.
    pub fn ssh_target(&self) -> SshTarget {
        SshTarget {
            user: Some(self.user.clone()),
            host: "127.0.0.1".into(),
            port: Some(self.port),
            key: Some(self.key_name()),
            via: None,
        }
    }

    /// `ssh` to this daemon with the fixture's key, host key unchecked,
    /// running `remote`; stdin from nowhere.
    pub fn ssh(&self, remote: &str) -> Command {
        let mut c = Command::new("ssh");
        c.arg("-F")
            .arg("/dev/null")
            .arg("-i")
            .arg(self.key_path())
            .arg("-p")
            .arg(self.port.to_string())
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "ConnectTimeout=5",
            ])
            .arg(format!("{}@127.0.0.1", self.user))
            .arg("--")
            .arg(remote)
            .stdin(Stdio::null());
        c
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("sshd exited ({status}): {}", self.log()));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                let out = self
                    .ssh("true")
                    .output()
                    .map_err(|e| format!("running ssh: {e} (install openssh-client)"))?;
                if out.status.success() {
                    return Ok(());
                }
                if start.elapsed() > START_TIMEOUT {
                    return Err(format!(
                        "a login with the fixture's key failed: {}; sshd's log: {}",
                        String::from_utf8_lossy(&out.stderr).trim(),
                        self.log()
                    ));
                }
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "port {} accepted nothing for {START_TIMEOUT:?}; sshd's log: {}",
                    self.port,
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ends the daemon's process group and reaps it.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl fmt::Debug for Sshd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sshd({} on 127.0.0.1:{})", self.name, self.port)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An ed25519 key pair at `path` and `path.pub`, without a passphrase.
fn keygen(path: &Path) -> Result<(), String> {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "flotilla-test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running ssh-keygen: {e} (install openssh-client)"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(())
}

fn write_config(dir: &Path, port: u16) -> std::io::Result<()> {
    let d = dir.display();
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "ListenAddress 127.0.0.1\n\
             Port {port}\n\
             HostKey {d}/host_key\n\
             PidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\n\
             StrictModes no\n\
             UsePAM no\n\
             PermitRootLogin prohibit-password\n\
             LogLevel VERBOSE\n\
             Subsystem sftp internal-sftp\n\
             AcceptEnv none\n"
        ),
    )
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn current_user() -> Result<String, String> {
    let out = Command::new("id")
        .arg("-un")
        .output()
        .map_err(|e| format!("running `id -un`: {e}"))?;
    let user = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || user.is_empty() {
        return Err("`id -un` named no user".into());
    }
    Ok(user)
}
