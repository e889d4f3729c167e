//! The unprivileged user a job's processes run as (`--job-user`): looked up once, switched to in each child.
//!
//! The agent runs as root and each child switches, between fork and exec, to
//! the user's supplementary groups, group and user, in that order (groups
//! and group first: after `setuid` they can no longer be changed), then
//! enters its work directory as that user. The standard library's
//! `CommandExt::uid` cannot be used: it drops every supplementary group and
//! runs `pre_exec` hooks only after `setuid`, when `setgroups` is refused.
//!
//! Only Linux is supported; elsewhere [`JobUser::lookup`] says so.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use super::env::UserVars;

/// Why `--job-user` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JobUserError {
    #[error("--job-user {0}: no such user (make one, e.g. `useradd --system --no-create-home --shell /usr/sbin/nologin {0}`)")]
    NoSuchUser(String),
    #[error("--job-user {name}: looking it up: {detail}")]
    Lookup { name: String, detail: String },
    #[error("--job-user {0} is root; name an unprivileged user")]
    IsRoot(String),
    #[error(
        "--job-user needs the agent to run as root, to switch to that user for each job; \
         start the agent as root, or leave out --job-user to run jobs as the agent's own user"
    )]
    NotRoot,
    #[error("--job-user is supported on Linux only")]
    Unsupported,
    #[error(
        "--job-user {user} cannot reach {path}: {blocker} (mode {mode:03o}) does not let it \
         pass; choose a --workdir whose parent directories others may enter (o+x), e.g. under \
         /var/lib"
    )]
    Unreachable {
        user: String,
        path: PathBuf,
        blocker: PathBuf,
        mode: u32,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A user from the password database, with its groups, as jobs run.
#[derive(Debug, Clone)]
pub struct JobUser {
    name: String,
    uid: u32,
    gid: u32,
    /// Supplementary groups (`getgrouplist`), the primary one included.
    groups: Vec<u32>,
    home: PathBuf,
    shell: PathBuf,
}

impl JobUser {
    /// Looks `name` up; fails unless this process is root and `name` is not.
    #[cfg(target_os = "linux")]
    pub fn lookup(name: &str) -> Result<Self, JobUserError> {
        use nix::unistd::{getgrouplist, Gid, User};
        if !nix::unistd::geteuid().is_root() {
            return Err(JobUserError::NotRoot);
        }
        let lookup = |detail: String| JobUserError::Lookup {
            name: name.to_string(),
            detail,
        };
        let user = User::from_name(name)
            .map_err(|e| lookup(e.to_string()))?
            .ok_or_else(|| JobUserError::NoSuchUser(name.to_string()))?;
        if user.uid.is_root() {
            return Err(JobUserError::IsRoot(name.to_string()));
        }
        let cname = std::ffi::CString::new(name).map_err(|e| lookup(e.to_string()))?;
        let groups = getgrouplist(&cname, user.gid)
            .map_err(|e| lookup(format!("its groups: {e}")))?
            .into_iter()
            .map(Gid::as_raw)
            .collect();
        Ok(JobUser {
            name: user.name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            groups,
            home: user.dir,
            shell: user.shell,
        })
    }

    /// Looks `name` up; fails unless this process is root and `name` is not.
    #[cfg(not(target_os = "linux"))]
    pub fn lookup(_name: &str) -> Result<Self, JobUserError> {
        Err(JobUserError::Unsupported)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// `HOME`, `USER`, `LOGNAME` and `SHELL` for the job's environment.
    pub fn vars(&self) -> UserVars {
        UserVars {
            home: Some(self.home.clone().into_os_string()),
            user: Some(OsString::from(&self.name)),
            shell: Some(self.shell.clone().into_os_string()),
        }
    }

    /// Hands `dir` (made by the agent) to the user: owned by it and its
    /// group, mode 0700, so other users (the agent's own files aside) see
    /// nothing of it.
    pub fn give_dir(&self, dir: &Path) -> Result<(), JobUserError> {
        let io = |source| JobUserError::Io {
            path: dir.to_path_buf(),
            source,
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::os::unix::fs::chown(dir, Some(self.uid), Some(self.gid)).map_err(io)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        }
        #[cfg(not(unix))]
        let _ = io;
        Ok(())
    }

    /// Checks that the user may pass through `path` and each of its
    /// parents (the search bit of its class: owner, group or other; ACLs
    /// are not read). The first one that stops it is the error.
    #[cfg(unix)]
    pub fn check_reachable(&self, path: &Path) -> Result<(), JobUserError> {
        use std::os::unix::fs::MetadataExt;
        for dir in path.ancestors() {
            let meta = std::fs::metadata(dir).map_err(|source| JobUserError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            let mode = meta.mode() & 0o7777;
            let search = if meta.uid() == self.uid {
                0o100
            } else if meta.gid() == self.gid || self.groups.contains(&meta.gid()) {
                0o010
            } else {
                0o001
            };
            if mode & search == 0 {
                return Err(JobUserError::Unreachable {
                    user: self.name.clone(),
                    path: path.to_path_buf(),
                    blocker: dir.to_path_buf(),
                    mode,
                });
            }
        }
        Ok(())
    }

    /// Makes the child switch to this user and then enter `workdir` (as the
    /// user, so a directory it may not enter fails the spawn).
    #[cfg(target_os = "linux")]
    pub(super) fn apply(
        &self,
        cmd: &mut tokio::process::Command,
        workdir: &Path,
    ) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;

        use nix::unistd::{chdir, setgid, setgroups, setuid, Gid, Uid};
        // Everything the child needs is made here, before the fork: between
        // fork and exec only async-signal-safe calls are allowed, so no
        // allocation.
        let groups: Vec<Gid> = self.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        let dir = std::ffi::CString::new(workdir.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the hook only makes system calls (setgroups, setgid,
        // setuid, chdir) on data prepared above; it allocates nothing and
        // takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                setgroups(&groups)?;
                setgid(gid)?;
                setuid(uid)?;
                chdir(dir.as_c_str())?;
                Ok(())
            });
        }
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn apply(
        &self,
        _cmd: &mut tokio::process::Command,
        _workdir: &Path,
    ) -> io::Result<()> {
        // `lookup` never makes a JobUser here.
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            JobUserError::Unsupported.to_string(),
        ))
    }
}
