//! `host NAME = TARGET`: an agent by name, any agent with some labels,
//! or an ssh destination.
//!
//! An ssh host names its key, never a path: `key NAME` is a file in the
//! connecting agent's `--ssh-dir`/keys/, which its operator filled. A path
//! would let any client have the agent log in with whatever key the
//! agent's user can read (`~/.ssh/id_ed25519`, a host key).

use std::collections::BTreeMap;

use super::{bad, name_rule, valid_name, Line};
use crate::job::limits;
use crate::pipeline::lexer::{Logical, Word};
use crate::pipeline::spec::{HostDecl, HostTarget, Span, SshTarget};

pub(super) fn host(l: &Logical, w: &[Word], span: Span) -> Line<HostDecl> {
    let usage = "write `host NAME = agent AGENT`, `host NAME = agent labels K=V,…` or \
                 `host NAME = ssh://[USER@]HOST[:PORT] key NAME [via AGENT]`";
    let Some(name) = w.get(1) else {
        return bad(l.end_of(&w[0]), format!("`host` needs a name: {usage}"));
    };
    if let Some((n, _)) = name.text.split_once('=') {
        if valid_name(n) {
            return bad(l.pos(name.at), format!("put spaces around `=`: {usage}"));
        }
    }
    if !valid_name(&name.text) {
        return bad(l.pos(name.at), name_rule("host", &name.text));
    }
    match w.get(2) {
        Some(eq) if eq.text == "=" => {}
        Some(other) => {
            return bad(
                l.pos(other.at),
                format!("expected `=` after the host name: {usage}"),
            )
        }
        None => {
            return bad(
                l.end_of(name),
                format!("expected `=` after the host name: {usage}"),
            )
        }
    }
    let Some(kind) = w.get(3) else {
        return bad(
            l.end_of(&w[2]),
            format!("`host {}` has no target: {usage}", name.text),
        );
    };
    let target = if kind.text == "agent" {
        match w.get(4) {
            None => {
                return bad(
                    l.end_of(kind),
                    format!("`agent` needs an agent name: {usage}"),
                )
            }
            Some(a) if a.text == "labels" => {
                let Some(list) = w.get(5) else {
                    return bad(
                        l.end_of(a),
                        "`agent labels` needs K=V pairs, e.g. `agent labels gpu=h200,zone=a`",
                    );
                };
                if let Some(extra) = w.get(6) {
                    return bad(
                        l.pos(extra.at),
                        format!("unexpected `{}` after the labels: separate labels with `,` and no spaces", extra.text),
                    );
                }
                HostTarget::Labels {
                    labels: labels(l, list)?,
                }
            }
            Some(a) => {
                if !valid_agent_name(&a.text) {
                    return bad(
                        l.pos(a.at),
                        format!(
                            "bad agent name `{}`: 1 to 64 letters, digits, `-`, `_` or `.`",
                            a.text
                        ),
                    );
                }
                if let Some(extra) = w.get(5) {
                    return bad(
                        l.pos(extra.at),
                        format!("unexpected `{}` after the agent name", extra.text),
                    );
                }
                HostTarget::Agent {
                    name: a.text.clone(),
                }
            }
        }
    } else if kind.text.starts_with("ssh://") {
        HostTarget::Ssh(ssh(l, w, kind)?)
    } else {
        return bad(
            l.pos(kind.at),
            format!("unknown host target `{}`: {usage}", kind.text),
        );
    };
    Ok(HostDecl {
        name: name.text.clone(),
        target,
        span,
    })
}

/// An agent's name as the server registers it.
fn valid_agent_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn labels(l: &Logical, list: &Word) -> Line<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut at = list.at;
    for pair in list.text.split(',') {
        let here = l.pos(at);
        at += pair.chars().count() + 1;
        let Some((k, v)) = pair.split_once('=') else {
            return bad(
                here,
                format!("bad label `{pair}`: write K=V, e.g. `gpu=h200`"),
            );
        };
        if k.is_empty() {
            return bad(here, format!("label `{pair}` has an empty key"));
        }
        if k.len() > limits::MAX_LABEL_KEY_BYTES || v.len() > limits::MAX_LABEL_VALUE_BYTES {
            return bad(
                here,
                format!(
                    "label `{k}` is too long: keys are at most {} bytes, values at most {}",
                    limits::MAX_LABEL_KEY_BYTES,
                    limits::MAX_LABEL_VALUE_BYTES
                ),
            );
        }
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return bad(here, format!("label `{k}` is given twice"));
        }
    }
    if out.len() > limits::MAX_LABELS {
        return bad(
            l.pos(list.at),
            format!("at most {} labels", limits::MAX_LABELS),
        );
    }
    Ok(out)
}

fn ssh(l: &Logical, w: &[Word], url: &Word) -> Line<SshTarget> {
    let usage = "write `ssh://[USER@]HOST[:PORT] key NAME`, then optionally `via AGENT`";
    let rest = &url.text["ssh://".len()..];
    let here = l.pos(url.at);
    let (user, hostport) = match rest.split_once('@') {
        Some((u, hp)) => (Some(u), hp),
        None => (None, rest),
    };
    if let Some(u) = user {
        if u.is_empty()
            || u.starts_with('-')
            || !u
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return bad(
                here,
                format!(
                    "bad ssh user `{u}`: letters, digits, `.`, `_`, `-`, not starting with `-`"
                ),
            );
        }
    }
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let Some((h, after)) = v6.split_once(']') else {
            return bad(here, format!("`[` without `]` in `{}`: {usage}", url.text));
        };
        match after {
            "" => (h, None),
            p => match p.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return bad(here, format!("unexpected `{p}` after `]`: {usage}")),
            },
        }
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let host_ok = !host.is_empty()
        && !host.starts_with('-')
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c));
    if !host_ok {
        return bad(
            here,
            format!("bad ssh host `{host}` in `{}`: {usage}", url.text),
        );
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => {
                return bad(
                    here,
                    format!("bad ssh port `{p}`: a number from 1 to 65535"),
                )
            }
        },
    };
    let mut target = SshTarget {
        user: user.map(str::to_string),
        host: host.to_string(),
        port,
        key: None,
        via: None,
    };
    let mut i = 4;
    while i < w.len() {
        let key = &w[i];
        let Some(value) = w.get(i + 1) else {
            return bad(
                l.end_of(key),
                format!("`{}` needs a value: {usage}", key.text),
            );
        };
        match key.text.as_str() {
            "key" if target.key.is_none() => {
                if let Some(why) = key_name_error(&value.text) {
                    return bad(
                        l.pos(value.at),
                        format!("bad key `{}`: {why}; {KEYS_LIVE}", value.text),
                    );
                }
                target.key = Some(value.text.clone())
            }
            "via" if target.via.is_none() => {
                if !valid_agent_name(&value.text) {
                    return bad(
                        l.pos(value.at),
                        format!(
                            "bad agent name `{}`: 1 to 64 letters, digits, `-`, `_` or `.`",
                            value.text
                        ),
                    );
                }
                target.via = Some(value.text.clone())
            }
            "key" | "via" => {
                return bad(
                    l.pos(key.at),
                    format!("`{}` is given twice: keep one", key.text),
                )
            }
            other => {
                return bad(
                    l.pos(key.at),
                    format!("unknown ssh option `{other}`: {usage}"),
                )
            }
        }
        i += 2;
    }
    if target.key.is_none() {
        let last = w.last().expect("the URL is a word of the line");
        return bad(
            l.end_of(last),
            format!("an ssh host needs `key NAME`: {KEYS_LIVE}"),
        );
    }
    Ok(target)
}

/// Where keys are, for messages.
const KEYS_LIVE: &str = "a key is the name of a file in the connecting agent's --ssh-dir/keys/ \
                         (e.g. `key id_ed25519`), never a path";

/// The longest key name: a file name's limit on Linux.
const MAX_KEY_NAME_BYTES: usize = 255;

/// Why `name` is no key name, or `None`: a bare file name of letters,
/// digits, `.`, `_`, `-`, not starting with `.` (no `/`, `~`, `..`, and
/// nothing ssh would expand: `%` tokens, `${VAR}`).
fn key_name_error(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it is empty")
    } else if name.starts_with('~') {
        Some("it starts with `~`")
    } else if name.starts_with('.') {
        Some("it starts with `.`")
    } else if name.contains('/') {
        Some("it holds a `/`")
    } else if name.len() > MAX_KEY_NAME_BYTES {
        Some("it is longer than 255 bytes")
    } else if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        Some("it holds a character other than letters, digits, `.`, `_` and `-`")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::super::tests::{one, HEAD};
    use super::*;

    #[test]
    fn host_lines_and_their_mistakes() {
        one(
            &format!("host 9x = agent a\n{HEAD}stage s on h: x\n"),
            1,
            6,
            "bad host name `9x`",
        );
        one(
            &format!("host g=agent a\n{HEAD}stage s on h: x\n"),
            1,
            6,
            "spaces around `=`",
        );
        one(
            &format!("host g = docker a\n{HEAD}stage s on h: x\n"),
            1,
            10,
            "unknown host target",
        );
        one(
            &format!("host g = ssh://-oProxy@x\n{HEAD}stage s on h: x\n"),
            1,
            10,
            "bad ssh user",
        );
        one(
            &format!("host g = ssh://u@x:99999\n{HEAD}stage s on h: x\n"),
            1,
            10,
            "bad ssh port",
        );
        one(
            &format!("host g = ssh://x key\n{HEAD}stage s on h: x\n"),
            1,
            21,
            "`key` needs a value",
        );
        one(
            &format!("host g = ssh://u@x:22\n{HEAD}stage s on h: x\n"),
            1,
            22,
            "an ssh host needs `key NAME`",
        );
        one(
            &format!("host g = agent labels gpu\n{HEAD}stage s on h: x\n"),
            1,
            23,
            "bad label `gpu`",
        );
        one(
            &format!("host g = agent labels a=1,b=2,a=3\n{HEAD}stage s on h: x\n"),
            1,
            31,
            "`a` is given twice",
        );
    }

    #[test]
    fn ssh_targets_read() {
        let spec = parse(
            "t",
            &format!("host g = ssh://[::1]:2222 via a.b key id_ed25519\nhost k = ssh://x key k-1.pem\n{HEAD}stage s on h: x\n"),
        )
        .unwrap();
        let HostTarget::Ssh(t) = &spec.hosts["g"].target else {
            panic!()
        };
        assert_eq!(
            t,
            &SshTarget {
                user: None,
                host: "::1".into(),
                port: Some(2222),
                key: Some("id_ed25519".into()),
                via: Some("a.b".into()),
            }
        );
        let HostTarget::Ssh(t) = &spec.hosts["k"].target else {
            panic!()
        };
        assert_eq!(
            (t.user.as_deref(), t.host.as_str(), t.port, t.key.as_deref()),
            (None, "x", None, Some("k-1.pem"))
        );
    }

    /// Review C1: `key PATH` let any client have the agent log in with any
    /// key its user could read. A key is a bare name in the agent's
    /// --ssh-dir/keys/.
    #[test]
    fn a_key_is_a_bare_name_never_a_path() {
        for (key, why) in [
            ("~/.ssh/id_ed25519", "starts with `~`"),
            ("/etc/ssh/ssh_host_ed25519_key", "holds a `/`"),
            ("keys/../../id", "holds a `/`"),
            ("..", "starts with `.`"),
            (".hidden", "starts with `.`"),
            ("id'x", "other than letters"),
            ("%d", "other than letters"),
            ("${HOME}", "other than letters"),
        ] {
            let text = format!("host g = ssh://u@x key {key} via a\n{HEAD}stage s on h: x\n");
            let e = super::super::tests::errs(&text);
            assert_eq!(e.len(), 1, "{key}: {e:#?}");
            assert_eq!((e[0].0, e[0].1), (1, 24), "{key}: {e:#?}");
            assert!(e[0].2.contains(why), "{key}: {:?}", e[0].2);
            assert!(e[0].2.contains("--ssh-dir/keys/"), "{key}: {:?}", e[0].2);
        }
    }
}
