//! The operator's `--ssh-dir`: the only keys, known hosts and ssh settings the agent's `ssh` uses.
//!
//! A pipeline is written by a client, who must not be able to borrow what
//! the agent's own user can reach: its `~/.ssh` keys, its ssh-agent, its
//! `~/.ssh/config`, a host key file. So an agent reaches ssh hosts only
//! when started with `--ssh-dir DIR`, and then only with what its operator
//! put there:
//!
//! - `DIR/keys/NAME`: the private keys a pipeline may name (`key NAME`, a
//!   bare file name, checked by the parser and again here); a link or
//!   anything but a regular file is refused.
//! - `DIR/known_hosts`: the hosts it may reach. A host not in it is
//!   refused, unless the agent was started with `--ssh-accept-new`, which
//!   adds a host's key the first time it is seen.
//! - `DIR/ssh_config`: written by the agent at start ([`CONFIG`]) and
//!   given to every `ssh` it runs with `-F`, so neither the agent user's
//!   `~/.ssh/config` nor `/etc/ssh/ssh_config` is read, no agent socket or
//!   forwarding is used, and no password is asked for.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The settings every `ssh` of the agent runs under; `{KNOWN_HOSTS}` and
/// `{CHECK}` are filled in. Each line shuts a way a pipeline could use
/// more than its named key on a known host: identities other than `-i`
/// (`IdentitiesOnly`), the agent's ssh-agent (`IdentityAgent none`, and
/// not forwarded), X11, passwords and keyboard prompts (`BatchMode` too),
/// proxies, local commands, and host keys from anywhere but
/// `DIR/known_hosts`.
const CONFIG: &str = "\
# Written by flotilla-agent when it starts; every ssh it runs reads this
# file and no other (-F). Edits are overwritten at the next start.
Host *
  IdentitiesOnly yes
  IdentityAgent none
  ForwardAgent no
  ForwardX11 no
  PasswordAuthentication no
  KbdInteractiveAuthentication no
  ProxyCommand none
  PermitLocalCommand no
  UserKnownHostsFile \"{KNOWN_HOSTS}\"
  StrictHostKeyChecking {CHECK}
  GlobalKnownHostsFile /dev/null
";

/// The agent's `--ssh-dir`, checked and with its `ssh_config` written.
#[derive(Debug, Clone)]
pub struct SshDir {
    /// Absolute.
    dir: PathBuf,
    accept_new: bool,
}

/// Why `--ssh-dir` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SshDirError {
    #[error("--ssh-dir {}: {what}: {source}", dir.display())]
    Io {
        dir: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "--ssh-dir {}: the path holds `{bad}`, which ssh would read as part of its own syntax \
         (quotes, escapes, `%` tokens, `${{}}` variables); choose another directory",
        dir.display()
    )]
    BadPath { dir: PathBuf, bad: char },
}

/// Why `key NAME` names no usable key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "the key `{name}` is not a bare file name in the agent's --ssh-dir/keys/ (letters, \
         digits, `.`, `_`, `-`, not starting with `.`)"
    )]
    BadName { name: String },
    #[error("no key `{name}` at {}: {source}", path.display())]
    Missing {
        name: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the key {} is a symbolic link or not a regular file; keys are read only as files of their own", path.display())]
    NotAFile { path: PathBuf },
}

impl SshDir {
    /// Takes `dir`: made (0700) with `keys/` if missing, made absolute, and
    /// its `ssh_config` written (to a temporary name, then renamed:
    /// several agents may share one directory and start together).
    pub fn prepare(dir: &Path, accept_new: bool) -> Result<SshDir, SshDirError> {
        let io_err = |what| {
            let dir = dir.to_path_buf();
            move |source| SshDirError::Io { dir, what, source }
        };
        check_path(dir)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("keys"))
            .map_err(io_err("cannot make it and its keys/"))?;
        let dir = dir.canonicalize().map_err(io_err("cannot resolve it"))?;
        check_path(&dir)?;
        let keys = dir.join("keys");
        let mode = std::fs::metadata(&keys)
            .map_err(io_err("cannot read keys/"))?
            .mode();
        if mode & 0o077 != 0 {
            tracing::warn!(
                dir = %keys.display(),
                mode = format!("{:03o}", mode & 0o777),
                "the ssh keys directory is open to its group or others; `chmod 700` it",
            );
        }
        let ssh = SshDir { dir, accept_new };
        ssh.write_config()
            .map_err(io_err("cannot write its ssh_config"))?;
        Ok(ssh)
    }

    /// `DIR/ssh_config`, for `ssh -F`.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    /// `DIR/known_hosts`.
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.join("known_hosts")
    }

    /// Whether hosts not in `known_hosts` are added on first sight.
    pub fn accepts_new_hosts(&self) -> bool {
        self.accept_new
    }

    /// The key file `DIR/keys/NAME`: a regular file, not a link; one its
    /// group or others may read is warned about (ssh itself refuses it).
    pub fn key(&self, name: &str) -> Result<PathBuf, KeyError> {
        if !valid_key_name(name) {
            return Err(KeyError::BadName { name: name.into() });
        }
        let path = self.dir.join("keys").join(name);
        let meta = std::fs::symlink_metadata(&path).map_err(|source| KeyError::Missing {
            name: name.into(),
            path: path.clone(),
            source,
        })?;
        if !meta.file_type().is_file() {
            return Err(KeyError::NotAFile { path });
        }
        if meta.mode() & 0o077 != 0 {
            tracing::warn!(
                key = %path.display(),
                mode = format!("{:03o}", meta.mode() & 0o777),
                "an ssh key is readable by its group or others (ssh refuses such a key); \
                 `chmod 600` it",
            );
        }
        Ok(path)
    }

    fn write_config(&self) -> io::Result<()> {
        let text = CONFIG
            .replace("{KNOWN_HOSTS}", &self.known_hosts().to_string_lossy())
            .replace(
                "{CHECK}",
                if self.accept_new { "accept-new" } else { "yes" },
            );
        let path = self.config_file();
        let tmp = self
            .dir
            .join(format!(".ssh_config.{}", uuid::Uuid::new_v4().simple()));
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
            std::fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

/// Refuses a directory whose path ssh would not take as it is in
/// `ssh_config` and `-i` (both are expanded).
fn check_path(dir: &Path) -> Result<(), SshDirError> {
    match dir
        .to_string_lossy()
        .chars()
        .find(|c| matches!(c, '"' | '\\' | '%' | '$') || c.is_control())
    {
        Some(bad) => Err(SshDirError::BadPath {
            dir: dir.to_path_buf(),
            bad,
        }),
        None => Ok(()),
    }
}

/// The parser's rule for `key NAME` (core's `parse/host.rs`), again here:
/// the server is trusted, but a key name is joined to a directory path.
fn valid_key_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_shuts_everything_but_the_named_key_and_known_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let ssh = SshDir::prepare(&dir.path().join("ssh"), false).unwrap();
        let text = std::fs::read_to_string(ssh.config_file()).unwrap();
        for line in [
            "IdentitiesOnly yes",
            "IdentityAgent none",
            "ForwardAgent no",
            "ProxyCommand none",
            "StrictHostKeyChecking yes",
            "GlobalKnownHostsFile /dev/null",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
        assert!(text.contains(&format!(
            "UserKnownHostsFile \"{}\"",
            ssh.known_hosts().display()
        )));
        // ssh itself reads it so: `ssh -G` prints the settings it would use.
        let out = std::process::Command::new("ssh")
            .arg("-G")
            .arg("-F")
            .arg(ssh.config_file())
            .arg("somewhere")
            .output()
            .unwrap();
        let seen = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in [
            "identitiesonly yes",
            "identityagent none",
            "stricthostkeychecking true",
            "passwordauthentication no",
        ] {
            assert!(seen.contains(line), "ssh -G lacks {line}: {seen}");
        }
        let known = format!("userknownhostsfile {}", ssh.known_hosts().display());
        assert!(seen.contains(&known), "ssh -G lacks {known}: {seen}");
        let ssh = SshDir::prepare(&dir.path().join("ssh"), true).unwrap();
        let text = std::fs::read_to_string(ssh.config_file()).unwrap();
        assert!(text.contains("StrictHostKeyChecking accept-new"), "{text}");
        let mode = std::fs::metadata(dir.path().join("ssh/keys"))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn keys_are_bare_names_of_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let ssh = SshDir::prepare(dir.path(), false).unwrap();
        let keys = dir.path().join("keys");
        std::fs::write(keys.join("good"), "k").unwrap();
        std::fs::set_permissions(keys.join("good"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::os::unix::fs::symlink("/etc/ssh/ssh_host_ed25519_key", keys.join("link")).unwrap();
        std::fs::create_dir(keys.join("sub")).unwrap();
        assert_eq!(ssh.key("good").unwrap(), keys.join("good"));
        for (name, want) in [
            ("link", "symbolic link"),
            ("sub", "not a regular file"),
            ("gone", "no key `gone`"),
            ("../keys/good", "not a bare file name"),
            ("~root", "not a bare file name"),
            (".good", "not a bare file name"),
            ("", "not a bare file name"),
        ] {
            let e = ssh.key(name).unwrap_err().to_string();
            assert!(e.contains(want), "{name}: {e}");
        }
    }

    #[test]
    fn a_directory_ssh_would_expand_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = SshDir::prepare(&dir.path().join("a%d"), false).unwrap_err();
        assert!(matches!(e, SshDirError::BadPath { bad: '%', .. }), "{e}");
    }
}
