//! The environment a job's processes start from: a short allowlist of the agent's own variables, never the rest.
//!
//! A job's child starts from an empty environment (`env_clear`), then gets
//! [`BaseEnv`], then the job's own variables. Nothing else the agent was
//! started with reaches it: not `FLOTILLA_*` (the agent's token file path,
//! server, encoder profile), not `AWS_*`, not `DATABASE_URL`, not whatever a
//! service manager or a shell exported. An operator who wants a variable in
//! every job names it with `--pass-env NAME`.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};

/// Variables every job keeps from the agent: what a shell needs to find
/// programs and to format text and time as the host does. `LC_*` are matched
/// by prefix.
pub const ALLOWED: &[&str] = &["PATH", "LANG", "TZ", "TERM"];

/// What `cmd.exe` and most Windows programs cannot start without. Windows
/// names are matched without regard to case.
#[cfg(windows)]
const ALLOWED_WINDOWS: &[&str] = &[
    "SYSTEMROOT",
    "SYSTEMDRIVE",
    "WINDIR",
    "COMSPEC",
    "PATHEXT",
    "TEMP",
    "TMP",
    "USERPROFILE",
];

/// Variables that name the user a process runs as; a job gets those of the
/// user it runs as (the agent's own without `--job-user`).
pub const USER_VARS: &[&str] = &["HOME", "USER", "LOGNAME", "SHELL"];

/// The variables a job's process starts with, before the job's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BaseEnv {
    vars: BTreeMap<OsString, OsString>,
}

/// Who a job runs as, for [`USER_VARS`]; `None` fields are left out.
#[derive(Debug, Clone, Default)]
pub struct UserVars {
    pub home: Option<OsString>,
    pub user: Option<OsString>,
    pub shell: Option<OsString>,
}

impl BaseEnv {
    /// From the agent's own environment: [`ALLOWED`], `LC_*` and `pass`;
    /// then [`USER_VARS`] from `user`, or from the agent's own environment
    /// when jobs run as the agent's user.
    pub fn from_agent(pass: &[String], user: Option<&UserVars>) -> Self {
        Self::from_vars(std::env::vars_os(), pass, user)
    }

    /// [`BaseEnv::from_agent`] over the given variables (for tests).
    pub fn from_vars(
        agent: impl IntoIterator<Item = (OsString, OsString)>,
        pass: &[String],
        user: Option<&UserVars>,
    ) -> Self {
        let keep = |name: &OsStr| {
            let Some(name) = name.to_str() else {
                return false;
            };
            allowed_on_this_os(name)
                || name.starts_with("LC_")
                || pass.iter().any(|p| p == name)
                || (user.is_none() && USER_VARS.contains(&name))
        };
        let mut vars: BTreeMap<OsString, OsString> =
            agent.into_iter().filter(|(k, _)| keep(k)).collect();
        if let Some(u) = user {
            let mut set = |k: &str, v: &Option<OsString>| {
                if let Some(v) = v {
                    vars.insert(k.into(), v.clone());
                }
            };
            set("HOME", &u.home);
            set("USER", &u.user);
            set("LOGNAME", &u.user);
            set("SHELL", &u.shell);
        }
        BaseEnv { vars }
    }

    /// The variables, for `Command::envs`.
    pub fn iter(&self) -> impl Iterator<Item = (&OsString, &OsString)> {
        self.vars.iter()
    }

    /// One variable's value.
    pub fn get(&self, name: &str) -> Option<&OsStr> {
        self.vars.get(OsStr::new(name)).map(OsString::as_os_str)
    }
}

#[cfg(not(windows))]
fn allowed_on_this_os(name: &str) -> bool {
    ALLOWED.contains(&name)
}

#[cfg(windows)]
fn allowed_on_this_os(name: &str) -> bool {
    ALLOWED
        .iter()
        .chain(ALLOWED_WINDOWS)
        .any(|a| a.eq_ignore_ascii_case(name))
}

/// Checks a `--pass-env` name: a variable name, not `NAME=value` (which
/// would put a value on the agent's command line).
pub fn parse_pass_env(name: &str) -> Result<String, String> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(format!(
            "`{name}` is not a variable name (give the name only; the value comes from the \
             agent's environment)"
        ));
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_env() -> Vec<(OsString, OsString)> {
        [
            ("PATH", "/usr/bin:/bin"),
            ("LANG", "C.UTF-8"),
            ("LC_TIME", "en_GB.UTF-8"),
            ("TZ", "UTC"),
            ("TERM", "xterm"),
            ("HOME", "/root"),
            ("USER", "root"),
            ("LOGNAME", "root"),
            ("SHELL", "/bin/bash"),
            ("FLOTILLA_AGENT_TOKEN_FILE", "/etc/flotilla/agent.token"),
            ("FLOTILLA_SERVER", "http://server:8470"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("DATABASE_URL", "postgres://u:p@db/x"),
            ("SSH_AUTH_SOCK", "/tmp/ssh-xyz/agent.1"),
            ("HTTP_PROXY", "http://proxy:3128"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
    }

    fn names(env: &BaseEnv) -> Vec<&str> {
        env.iter().map(|(k, _)| k.to_str().unwrap()).collect()
    }

    #[test]
    fn a_job_sees_only_allowlisted_variables() {
        let env = BaseEnv::from_vars(agent_env(), &[], None);
        assert_eq!(
            names(&env),
            ["HOME", "LANG", "LC_TIME", "LOGNAME", "PATH", "SHELL", "TERM", "TZ", "USER"]
        );
    }

    #[test]
    fn pass_env_adds_named_variables_only() {
        let env = BaseEnv::from_vars(agent_env(), &["HTTP_PROXY".into(), "NOT_SET".into()], None);
        assert_eq!(env.get("HTTP_PROXY"), Some(OsStr::new("http://proxy:3128")));
        assert_eq!(env.get("NOT_SET"), None);
        assert_eq!(env.get("AWS_SECRET_ACCESS_KEY"), None);
    }

    #[test]
    fn a_job_user_gets_its_own_home_and_name() {
        let user = UserVars {
            home: Some("/nonexistent".into()),
            user: Some("flotilla-job".into()),
            shell: Some("/usr/sbin/nologin".into()),
        };
        let env = BaseEnv::from_vars(agent_env(), &[], Some(&user));
        assert_eq!(env.get("HOME"), Some(OsStr::new("/nonexistent")));
        assert_eq!(env.get("USER"), Some(OsStr::new("flotilla-job")));
        assert_eq!(env.get("LOGNAME"), Some(OsStr::new("flotilla-job")));
        assert_eq!(env.get("SHELL"), Some(OsStr::new("/usr/sbin/nologin")));
        assert_eq!(env.get("FLOTILLA_SERVER"), None);
    }

    #[test]
    fn pass_env_names_are_names() {
        assert!(parse_pass_env("HTTP_PROXY").is_ok());
        assert!(parse_pass_env("A=b").is_err());
        assert!(parse_pass_env("").is_err());
    }
}
