//! The files under `deploy/` that start our binaries: each is read as the
//! system it is for reads it, and the command line it gives is one the
//! binary accepts (a flag renamed or dropped fails here, not on a worker at
//! boot). The binaries take the command line with `--help` added last:
//! clap refuses an unknown flag or a flag without its value before it
//! reaches the `--help`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

/// Our binary for an installed path (`/usr/local/bin/flotilla-agent`).
fn ours(installed: &str) -> PathBuf {
    let name = Path::new(installed)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_else(|| panic!("{installed}: no file name"));
    assert!(
        installed.starts_with("/usr/local/bin/"),
        "{installed}: the binaries are installed in /usr/local/bin"
    );
    flotilla_e2e::binary(name)
}

/// Runs `argv` (its first word an installed path) with `--help` added.
fn accepts(file: &str, argv: &[String]) {
    let out = Command::new(ours(&argv[0]))
        .args(&argv[1..])
        .arg("--help")
        .output()
        .expect("running the binary");
    assert!(
        out.status.success(),
        "{file}: the binary refuses {argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A systemd unit's `ExecStart=`, its continuation lines joined.
fn exec_start(unit: &str) -> Vec<String> {
    let text = std::fs::read_to_string(deploy(unit)).expect("reading the unit");
    let mut line = String::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if let Some(start) = l.strip_prefix("ExecStart=") {
            line.push_str(start);
            while line.ends_with('\\') {
                line.pop();
                line.push_str(lines.next().expect("a continuation line"));
            }
            break;
        }
    }
    assert!(!line.is_empty(), "{unit}: no ExecStart=");
    line.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn systemd_units_start_the_binaries_with_flags_they_take() {
    for unit in [
        "systemd/flotilla-agent.service",
        "systemd/flotilla-server.service",
        "systemd/flotilla-server@.service",
    ] {
        let argv = exec_start(unit);
        accepts(unit, &argv);
    }
}

#[test]
fn the_launchd_daemon_is_a_property_list_that_starts_the_agent() {
    let file = "launchd/org.flotilla.agent.plist";
    // Python's plistlib reads the XML property list format as launchd does
    // and is as strict about it (a `--` in an XML comment is refused, as it
    // must be).
    let out = Command::new("python3")
        .arg("-c")
        .arg(
            "import json, plistlib, sys\n\
             print(json.dumps(plistlib.load(open(sys.argv[1], 'rb'))))",
        )
        .arg(deploy(file))
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "{file} is not a property list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plist: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(plist["Label"], "org.flotilla.agent", "{plist}");
    let argv: Vec<String> = plist["ProgramArguments"]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no ProgramArguments"))
        .iter()
        .map(|a| a.as_str().expect("a string").to_owned())
        .collect();
    assert!(argv[0].ends_with("/flotilla-agent"), "{argv:?}");
    accepts(file, &argv);
    assert!(
        plist["EnvironmentVariables"]["FLOTILLA_SERVER"].is_string(),
        "the server comes from the environment: {plist}"
    );
    // Not root: without --job-user (Linux only) the jobs run as this user.
    let user = plist["UserName"].as_str().unwrap_or("root");
    assert_ne!(user, "root", "{file}: the agent must not run as root here");
    // launchd's SIGKILL must not come before the agent has stopped its
    // jobs: the kill grace (10 s by default) and reporting them.
    assert!(
        plist["ExitTimeOut"].as_u64().is_some_and(|t| t >= 30),
        "{plist}"
    );
    assert_eq!(plist["KeepAlive"]["SuccessfulExit"], false, "{plist}");
}

/// The FreeBSD rc.d script run by `sh` against a stand-in for rc.subr that
/// prints the command `run_rc_command` would start (after the script's
/// precmd): (status, stdout, stderr). Like rc.subr, it takes a set
/// `${name}_user` as the account to start the command as (with `su -m`):
/// daemon(8) must start as root to write its pid file and drop to the
/// agent's account itself, so the stand-in refuses one.
fn rc_d(env: &[(&str, &str)]) -> (bool, Vec<String>, String) {
    let dir = flotilla_e2e::scratch("e2e-rcd-");
    let subr = dir.path().join("rc.subr");
    std::fs::write(
        &subr,
        "load_rc_config() { :; }\n\
         err() { shift; echo \"$*\" >&2; exit 1; }\n\
         run_rc_command() {\n\
             [ \"$1\" = start ] || exit 2\n\
             eval _user=\\${${name}_user}\n\
             if [ -n \"$_user\" ]; then\n\
                 echo \"rc.subr would start the command as $_user (su -m), not as root\" >&2\n\
                 exit 3\n\
             fi\n\
             $start_precmd || exit 1\n\
             printf '%s\\n' $command $command_args\n\
         }\n",
    )
    .unwrap();
    let script = std::fs::read_to_string(deploy("freebsd/flotilla_agent")).unwrap();
    assert!(
        script.contains(". /etc/rc.subr"),
        "the script reads rc.subr"
    );
    let script = script.replace(". /etc/rc.subr", &format!(". {}", subr.display()));
    let path = dir.path().join("flotilla_agent");
    std::fs::write(&path, script).unwrap();
    let out = Command::new("sh")
        .arg(&path)
        .arg("start")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().copied())
        .output()
        .expect("running sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_freebsd_rc_script_starts_the_agent_under_daemon_with_flags_it_takes() {
    let dir = flotilla_e2e::scratch("e2e-rcd-token-");
    let token = dir.path().join("agent.token");
    std::fs::write(&token, "t").unwrap();
    let token = token.to_str().unwrap();

    let (ok, words, err) = rc_d(&[
        ("flotilla_agent_server", "https://flotilla.example:8470"),
        ("flotilla_agent_token_file", token),
        ("flotilla_agent_ca_file", "/usr/local/etc/flotilla/ca.pem"),
        ("flotilla_agent_args", "--capacity 8 --label gpu=none"),
    ]);
    assert!(ok, "{err}");
    assert_eq!(words[0], "/usr/sbin/daemon", "{words:?}");
    let at = words
        .iter()
        .position(|w| w.ends_with("/flotilla-agent"))
        .unwrap_or_else(|| panic!("no agent in {words:?}"));
    // daemon(8): restarted when it exits, as the unprivileged user.
    let supervisor = &words[..at];
    assert!(supervisor.contains(&"-r".to_owned()), "{supervisor:?}");
    let user = supervisor
        .iter()
        .position(|w| w == "-u")
        .map(|i| &words[i + 1]);
    assert_eq!(user.map(String::as_str), Some("flotilla"), "{supervisor:?}");
    let agent = &words[at..];
    for (flag, value) in [
        ("--server", "https://flotilla.example:8470"),
        ("--token-file", token),
        ("--ca-file", "/usr/local/etc/flotilla/ca.pem"),
        ("--capacity", "8"),
    ] {
        let i = agent.iter().position(|w| w == flag);
        assert_eq!(
            i.map(|i| agent[i + 1].as_str()),
            Some(value),
            "{flag}: {agent:?}"
        );
    }
    accepts("freebsd/flotilla_agent", agent);

    // No CA file: no --ca-file at all, not one without its value. Another
    // account: daemon drops to it.
    let (ok, words, err) = rc_d(&[
        ("flotilla_agent_server", "https://flotilla.example:8470"),
        ("flotilla_agent_token_file", token),
        ("flotilla_agent_account", "worker"),
    ]);
    assert!(ok, "{err}");
    assert!(!words.contains(&"--ca-file".to_owned()), "{words:?}");
    let user = words.iter().position(|w| w == "-u").map(|i| &words[i + 1]);
    assert_eq!(user.map(String::as_str), Some("worker"), "{words:?}");
    let at = words
        .iter()
        .position(|w| w.ends_with("/flotilla-agent"))
        .unwrap();
    accepts("freebsd/flotilla_agent", &words[at..]);

    // What is missing is said, with what to run.
    let (ok, _, err) = rc_d(&[("flotilla_agent_token_file", token)]);
    assert!(!ok);
    assert!(err.contains("sysrc flotilla_agent_server="), "{err}");
    let (ok, _, err) = rc_d(&[
        ("flotilla_agent_server", "https://flotilla.example:8470"),
        ("flotilla_agent_token_file", "/nowhere/agent.token"),
    ]);
    assert!(!ok);
    assert!(
        err.contains("/nowhere/agent.token") && err.contains("flotilla tokens create"),
        "{err}"
    );
}
