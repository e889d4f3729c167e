//! The POSIX `sh` scripts a step runs, the same text here and on an ssh host.
//!
//! A script speaks to the agent through lines that start with the step's
//! [`Marker`] (a random word, so no command's output can pass for one):
//! `MARKER item ID` is a listed item, `MARKER fatal MESSAGE` fails the
//! attempt for good, `MARKER failed MESSAGE` fails it retryably. Every
//! other line is the job's log. The marker goes to stderr where stdout
//! carries data (a tar), and to stdout otherwise; over `ssh -tt` both
//! reach the agent on one stream anyway.
//!
//! Scripts are one line each (`;`-joined): the remote login shell gets them
//! inside single quotes, and a shell of the csh family refuses a newline
//! there. Every path is quoted with [`shell_quote`].

use flotilla_core::pipeline::template::shell_quote as q;

/// The word that starts a line meant for the agent.
#[derive(Debug, Clone)]
pub struct Marker(String);

/// A line of a script meant for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control<'a> {
    /// One line of the listing command's stdout, as it was.
    Item(&'a str),
    /// The attempt cannot succeed, however often it is tried.
    Fatal(&'a str),
    /// The attempt failed; another may succeed.
    Failed(&'a str),
}

impl Marker {
    /// A fresh marker: `flotilla-` and 32 random hex digits.
    pub fn new() -> Self {
        Marker(format!("flotilla-{}", uuid::Uuid::new_v4().simple()))
    }

    /// The line's meaning for the agent, or `None` for a line of the log.
    pub fn parse<'a>(&self, line: &'a str) -> Option<Control<'a>> {
        let rest = line.strip_prefix(self.0.as_str())?.strip_prefix(' ')?;
        let (word, text) = rest.split_once(' ').unwrap_or((rest, ""));
        match word {
            "item" => Some(Control::Item(text)),
            "fatal" => Some(Control::Fatal(text)),
            "failed" => Some(Control::Failed(text)),
            _ => None,
        }
    }

    /// A command that prints `MARKER fatal MESSAGE` to stderr and exits.
    fn fatal(&self, message: &str) -> String {
        format!(
            "{{ printf '%s\\n' {} >&2; exit 3; }}",
            q(&format!("{} fatal {message}", self.0))
        )
    }

    /// A command that prints `MARKER failed MESSAGE` to stderr and exits
    /// with the status of the command before it.
    fn failed(&self, message: &str) -> String {
        format!(
            "{{ rc=$?; printf '%s\\n' {} >&2; exit \"$rc\"; }}",
            q(&format!("{} failed {message}", self.0))
        )
    }
}

impl Default for Marker {
    fn default() -> Self {
        Self::new()
    }
}

/// A path split into the directory it is in and its last component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathParts {
    /// The path without trailing slashes.
    pub path: String,
    /// `.` for a relative path of one component.
    pub parent: String,
    pub base: String,
}

/// `path` has no last component to name a tar entry or a temporary
/// directory after (`/`, `.`, `..`, empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` names no file or directory that can be moved")]
pub struct NoBaseName(pub String);

/// Splits `path` (trailing slashes ignored) into parent and last component.
pub fn split_path(path: &str) -> Result<PathParts, NoBaseName> {
    let trimmed = path.trim_end_matches('/');
    let (parent, base) = match trimmed.rfind('/') {
        Some(0) => ("/", &trimmed[1..]),
        Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
        None => (".", trimmed),
    };
    if base.is_empty() || base == "." || base == ".." {
        return Err(NoBaseName(path.to_string()));
    }
    Ok(PathParts {
        path: trimmed.to_string(),
        parent: parent.to_string(),
        base: base.to_string(),
    })
}

/// Where a received tar is unpacked before its entry is renamed into
/// place: `PARENT/.BASE.flotilla-recv`, beside the destination so the
/// rename stays on one file system.
pub fn receive_dir(dest: &PathParts) -> String {
    format!("{}/.{}.flotilla-recv", dest.parent, dest.base)
}

/// Runs `command`; every line of its stdout becomes `MARKER item LINE`,
/// its stderr stays the log, and the script exits with the command's
/// status (not `sed`'s). fd 3 is the script's stdout, fd 4 carries the
/// status out of the pipeline.
pub fn list(marker: &Marker, command: &str) -> String {
    format!(
        "exec 3>&1; rc=$( {{ {{ sh -c {} </dev/null 3>&- 4>&-; echo $? >&4; }} | sed 's/^/{} item /' >&3; }} 4>&1 ); exit \"${{rc:-1}}\"",
        q(command),
        marker.0
    )
}

/// What a stage writes, when it writes something.
#[derive(Debug, Clone, Copy)]
pub struct Out<'a> {
    pub path: &'a str,
    /// This attempt's temporary path, `$FLOTILLA_OUT` to the command.
    pub temp: &'a str,
    /// The prefix of every attempt's temporary path: the others (`PREFIX-*`)
    /// are removed after the rename.
    pub others: &'a str,
    pub dir: bool,
}

/// A stage: with `out`, its temporary path cleared (and made, for a
/// directory) before `command` runs and renamed to the final path after;
/// with `consume`, that path removed last. A non-zero exit of the command
/// is the script's exit status.
pub fn run(
    marker: &Marker,
    command: &str,
    out: Option<Out<'_>>,
    consume: Option<&str>,
    retry: bool,
) -> String {
    let mut parts = Vec::new();
    // On a retry: an earlier attempt that renamed its output into place and
    // consumed its input, but whose report was lost (its agent killed at
    // that moment), left the item done: running the command again would
    // fail for want of the input, so this attempt ends as that one did.
    if let (Some(o), Some(c), true) = (out, consume, retry) {
        let (path, input) = (q(o.path), q(c));
        parts.push(format!(
            "if [ ! -e {input} ] && [ ! -L {input} ] && {{ [ -e {path} ] || [ -L {path} ]; }}; then \
             echo {} >&2; exit 0; fi",
            q(&format!(
                "{} is in place and {c} consumed: an earlier attempt of this stage finished",
                o.path
            ))
        ));
    }
    if let Some(o) = out {
        let temp = q(o.temp);
        let mut prepare = format!("rm -rf {temp}");
        if let Ok(p) = split_path(o.temp) {
            if p.parent != "." && p.parent != "/" {
                prepare.push_str(&format!(" && mkdir -p {}", q(&p.parent)));
            }
        }
        if o.dir {
            prepare.push_str(&format!(" && mkdir {temp}"));
        }
        parts.push(format!(
            "{prepare} || {}",
            marker.failed(&format!("cannot prepare {} for the command", o.temp))
        ));
    }
    if let Some(o) = out {
        parts.push(format!("FLOTILLA_OUT={}; export FLOTILLA_OUT", q(o.temp)));
    }
    parts.push(format!("sh -c {} </dev/null || exit $?", q(command)));
    if let Some(o) = out {
        let temp = q(o.temp);
        let path = q(o.path);
        parts.push(format!(
            "if [ ! -e {temp} ] && [ ! -L {temp} ]; then {}; fi",
            marker.fatal(&format!(
                "the command exited 0 but wrote nothing at {}",
                o.temp
            ))
        ));
        parts.push(format!(
            "{{ rm -rf {path} && mv {temp} {path}; }} || {}",
            marker.failed(&format!("cannot rename {} to {}", o.temp, o.path))
        ));
        // Earlier attempts' leftovers (the glob is outside the quotes).
        parts.push(format!("rm -rf {}-* 2>/dev/null", q(o.others)));
    }
    if let Some(c) = consume {
        let remove = format!(
            "rm -rf {} || {}",
            q(c),
            marker.failed(&format!("cannot remove the consumed {c}"))
        );
        match out {
            // The file's checks refuse an `out` that is its own `{in}`;
            // two paths may still name one file (a link, a shared mount),
            // and the output just made is not deleted for it.
            Some(o) => parts.push(format!(
                "if [ {} -ef {} ]; then :; else {remove}; fi",
                q(c),
                q(o.path)
            )),
            None => parts.push(remove),
        }
    }
    parts.push("exit 0".into());
    parts.join("; ")
}

/// Writes a tar of `src` (one top entry, its last component; links stored
/// as links) to stdout. A missing `src` is fatal.
pub fn send(marker: &Marker, src: &PathParts) -> String {
    let path = q(&src.path);
    format!(
        "if [ ! -e {path} ] && [ ! -L {path} ]; then {}; fi; exec tar -C {} -cf - {}",
        marker.fatal(&format!("nothing to send: {} does not exist", src.path)),
        q(&src.parent),
        q(&src.base)
    )
}

/// Reads a tar from stdin into [`receive_dir`], checks it holds exactly
/// one top entry, and renames that entry to `dest`, replacing what was
/// there. Ownership is not restored (`-o`): the files belong to whoever
/// receives them.
pub fn receive(marker: &Marker, dest: &PathParts) -> String {
    let tmp = receive_dir(dest);
    let t = q(&tmp);
    [
        format!(
            "{{ rm -rf {t} && mkdir -p {t}; }} || {}",
            marker.failed(&format!("cannot make {tmp}"))
        ),
        format!(
            "tar -C {t} -x -o -f - || {}",
            marker.failed(&format!("cannot unpack into {tmp}"))
        ),
        format!(
            "n=0; for e in {t}/* {t}/.[!.]* {t}/..?*; do if [ -e \"$e\" ] || [ -L \"$e\" ]; then n=$((n+1)); top=$e; fi; done"
        ),
        format!(
            "if [ \"$n\" -ne 1 ]; then rm -rf {t}; {}; fi",
            marker.fatal("the moved tar does not hold exactly one top entry")
        ),
        format!(
            "{{ rm -rf {p} && mv \"$top\" {p} && rmdir {t}; }} || {}",
            marker.failed(&format!("cannot rename the received entry to {}", dest.path)),
            p = q(&dest.path)
        ),
        "exit 0".into(),
    ]
    .join("; ")
}

/// Removes `path`; nothing there is success too.
/// Reads paths from stdin, one a line, and names each that exists as
/// `MARKER item PATH`.
pub fn probe(marker: &Marker) -> String {
    format!(
        "while IFS= read -r p; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then printf '%s item %s\\n' {} \"$p\"; fi; done; exit 0",
        q(&marker.0)
    )
}

pub fn remove(marker: &Marker, path: &str) -> String {
    format!(
        "rm -rf {} || {}; exit 0",
        q(path),
        marker.failed(&format!("cannot remove {path}"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs `script` under `sh -c` in `dir`; (status, stdout, stderr).
    fn sh(script: &str, dir: &std::path::Path) -> (i32, String, String) {
        let o = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    #[test]
    fn paths_split_into_parent_and_base() {
        let p = |s| split_path(s).map(|p| (p.parent, p.base));
        assert_eq!(p("/a/b/c/"), Ok(("/a/b".into(), "c".into())));
        assert_eq!(p("/c"), Ok(("/".into(), "c".into())));
        assert_eq!(p("c"), Ok((".".into(), "c".into())));
        assert_eq!(p("x y/it's"), Ok(("x y".into(), "it's".into())));
        for bad in ["/", "", ".", "a/..", "//"] {
            assert!(split_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn marker_lines_are_told_from_log_lines() {
        let m = Marker::new();
        let line = |s: &str| format!("{} {s}", m.0);
        assert_eq!(m.parse(&line("item a b")), Some(Control::Item("a b")));
        assert_eq!(m.parse(&line("item ")), Some(Control::Item("")));
        assert_eq!(m.parse(&line("fatal why")), Some(Control::Fatal("why")));
        assert_eq!(m.parse(&line("failed why")), Some(Control::Failed("why")));
        assert_eq!(m.parse("item a"), None);
        assert_eq!(m.parse(&format!("{}x item a", m.0)), None);
        assert_eq!(Marker::new().parse(&line("item a")), None);
    }

    #[test]
    fn a_listing_keeps_the_commands_status_and_tags_only_stdout() {
        let dir = tempfile::tempdir().unwrap();
        let m = Marker::new();
        let (rc, out, err) = sh(
            &list(&m, "printf 'a\\n\\nb c\\n'; echo oops >&2; exit 7"),
            dir.path(),
        );
        assert_eq!(rc, 7);
        let items: Vec<_> = out.lines().map(|l| m.parse(l)).collect();
        assert_eq!(
            items,
            vec![
                Some(Control::Item("a")),
                Some(Control::Item("")),
                Some(Control::Item("b c"))
            ]
        );
        assert_eq!(err.trim(), "oops");
        let (rc, _, _) = sh(&list(&m, "true"), dir.path());
        assert_eq!(rc, 0);
    }

    #[test]
    fn a_stage_renames_its_temp_and_consumes_its_input() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let m = Marker::new();
        std::fs::write(d.join("in"), "x").unwrap();
        std::fs::create_dir_all(d.join("out dir")).unwrap();
        std::fs::write(d.join("out dir/old"), "old").unwrap();
        // An earlier attempt's leftover, removed after the rename.
        std::fs::create_dir_all(d.join("tmp/out dir.part-1")).unwrap();
        let out = Out {
            path: "out dir",
            temp: "tmp/out dir.part-2",
            others: "tmp/out dir.part",
            dir: true,
        };
        let (rc, _, err) = sh(
            &run(
                &m,
                "cp in \"$FLOTILLA_OUT/new\"",
                Some(out),
                Some("in"),
                false,
            ),
            d,
        );
        assert_eq!(rc, 0, "{err}");
        assert!(d.join("out dir/new").is_file());
        assert!(!d.join("out dir/old").exists());
        assert!(!d.join("tmp/out dir.part-2").exists());
        assert!(!d.join("tmp/out dir.part-1").exists(), "a leftover stays");
        assert!(!d.join("in").exists());
    }

    /// Review of 3877596, F6: an attempt run again after one that finished
    /// (output renamed into place, input consumed) but was never reported
    /// ends as that one did, without the command (which would fail for want
    /// of its input).
    #[test]
    fn a_stage_done_before_its_report_was_lost_is_not_run_again() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let m = Marker::new();
        let out = Out {
            path: "o",
            temp: "o.part-2",
            others: "o.part",
            dir: false,
        };
        std::fs::write(d.join("o"), "made").unwrap();
        // The stage's script, as a first attempt or as a retry.
        let consume = |retry| {
            sh(
                &run(
                    &m,
                    "cat in > \"$FLOTILLA_OUT\"",
                    Some(out),
                    Some("in"),
                    retry,
                ),
                d,
            )
        };
        // A first attempt runs its command whatever is there (an output
        // left by another run is no sign this one finished).
        let (rc, _, _) = consume(false);
        assert_ne!(rc, 0, "the command ran, and found no input");
        let (rc, _, err) = consume(true);
        assert_eq!(rc, 0, "{err}");
        assert!(
            err.contains("an earlier attempt of this stage finished"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(d.join("o")).unwrap(), "made");
        // With its input there, a retry runs as ever.
        std::fs::write(d.join("in"), "new").unwrap();
        let (rc, _, err) = consume(true);
        assert_eq!(rc, 0, "{err}");
        assert_eq!(std::fs::read_to_string(d.join("o")).unwrap(), "new");
        assert!(!d.join("in").exists());
    }

    /// Review of 3877596, F3: a consumed input that is the stage's own
    /// output (here reached through a link to its directory) is not
    /// deleted after the rename made it.
    #[test]
    fn a_stage_never_consumes_what_it_just_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let m = Marker::new();
        std::fs::create_dir_all(d.join("data")).unwrap();
        std::fs::write(d.join("data/x"), "old").unwrap();
        std::os::unix::fs::symlink(d.join("data"), d.join("alias")).unwrap();
        let out = Out {
            path: "data/x",
            temp: "data/x.part-1",
            others: "data/x.part",
            dir: false,
        };
        let (rc, _, err) = sh(
            &run(
                &m,
                "cat alias/x > \"$FLOTILLA_OUT\"; echo new >> \"$FLOTILLA_OUT\"",
                Some(out),
                Some("alias/x"),
                false,
            ),
            d,
        );
        assert_eq!(rc, 0, "{err}");
        assert_eq!(
            std::fs::read_to_string(d.join("data/x")).unwrap(),
            "oldnew\n"
        );
    }

    #[test]
    fn a_stage_that_writes_nothing_is_fatal_and_a_failing_one_keeps_its_status() {
        let dir = tempfile::tempdir().unwrap();
        let m = Marker::new();
        let out = Out {
            path: "o",
            temp: "o.tmp",
            others: "o.t",
            dir: false,
        };
        let (rc, _, err) = sh(&run(&m, "true", Some(out), None, false), dir.path());
        assert_ne!(rc, 0);
        assert_eq!(
            m.parse(err.trim()),
            Some(Control::Fatal(
                "the command exited 0 but wrote nothing at o.tmp"
            ))
        );
        let (rc, _, err) = sh(
            &run(
                &m,
                "echo x > o.tmp; exit 9",
                Some(out),
                Some("o.tmp"),
                false,
            ),
            dir.path(),
        );
        assert_eq!((rc, err.as_str()), (9, ""));
        assert!(!dir.path().join("o").exists());
    }
}
