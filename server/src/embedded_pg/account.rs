//! A user of this host (the password and group databases) and whether it may pass through a directory.
//!
//! Run as root, `flotilla up` starts PostgreSQL as `postgres` and jobs as
//! the job user; both must reach their directories inside the data
//! directory through its parents. flotilla does not open those parents up
//! (it used to add `o+x` to every one, `/root` included): it checks them
//! and, when one is closed, says which and what to do.

use std::path::{Path, PathBuf};

/// A user and its groups, as the kernel checks its access.
#[derive(Debug, Clone)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, the primary one included.
    pub groups: Vec<u32>,
}

impl Account {
    /// The user `name`, or `None` if there is none.
    pub fn lookup(name: &str) -> std::io::Result<Option<Account>> {
        use nix::unistd::{getgrouplist, User};
        let Some(user) = User::from_name(name)? else {
            return Ok(None);
        };
        let cname = std::ffi::CString::new(name)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let groups = getgrouplist(&cname, user.gid)?
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        Ok(Some(Account {
            name: user.name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            groups,
        }))
    }

    /// The first of `path` and its parents that this user may not pass
    /// through (no search bit for its class: owner, group or other; ACLs
    /// are not read), with its mode; `None` when it reaches `path`.
    pub fn first_closed(&self, path: &Path) -> std::io::Result<Option<(PathBuf, u32)>> {
        use std::os::unix::fs::MetadataExt;
        // From the root down: the first closed one is the one to fix.
        let mut dirs: Vec<&Path> = path.ancestors().collect();
        dirs.reverse();
        for dir in dirs {
            let meta = std::fs::metadata(dir)?;
            let mode = meta.mode() & 0o7777;
            let search = if meta.uid() == self.uid {
                0o100
            } else if meta.gid() == self.gid || self.groups.contains(&meta.gid()) {
                0o010
            } else {
                0o001
            };
            if mode & search == 0 {
                return Ok(Some((dir.to_path_buf(), mode)));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_closed_parent_is_named() {
        let nobody = Account {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        };
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let a = dir.path().join("a");
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(
            nobody.first_closed(&inner).unwrap(),
            Some((a.clone(), 0o700))
        );
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(nobody.first_closed(&inner).unwrap(), None);
    }
}
