//! `stage NAME on HOST [options]: COMMAND` and `move NAME to HOST:PATH`.

use super::{
    bad, command_text, name_rule, number, path, template, valid_name, Line, MAX_JOBS, MAX_RETRIES,
    OPTIONS,
};
use crate::job::limits;
use crate::pipeline::lexer::{Header, Logical, Word};
use crate::pipeline::spec::{Move, Span, Stage};

pub(super) fn stage(l: &Logical, h: &Header, span: Span) -> Line<Stage> {
    let w = &h.words;
    let usage = "write `stage NAME on HOST [options]: COMMAND`";
    let Some(name) = w.get(1) else {
        return bad(l.end_of(&w[0]), format!("`stage` needs a name: {usage}"));
    };
    if !valid_name(&name.text) {
        return bad(l.pos(name.at), name_rule("stage", &name.text));
    }
    match w.get(2) {
        Some(on) if on.text == "on" => {}
        Some(other) => {
            return bad(
                l.pos(other.at),
                format!("expected `on` after the stage name: {usage}"),
            )
        }
        None => {
            return bad(
                l.end_of(name),
                format!("stage `{}` needs `on HOST`: {usage}", name.text),
            )
        }
    }
    let Some(host) = w.get(3) else {
        return bad(
            l.end_of(&w[2]),
            format!("stage `{}` needs a host after `on`: {usage}", name.text),
        );
    };
    if !valid_name(&host.text) {
        return bad(l.pos(host.at), name_rule("host", &host.text));
    }
    let mut jobs = None;
    let mut out = None;
    let mut consume = None;
    let mut retries = None;
    let mut timeout = None;
    let mut i = 4;
    while i < w.len() {
        let key = &w[i];
        let seen = match key.text.as_str() {
            "jobs" => jobs.is_some(),
            "out" => out.is_some(),
            "consume" => consume.is_some(),
            "retries" => retries.is_some(),
            "timeout" => timeout.is_some(),
            other => {
                let hint = if h.command.is_none() {
                    "; if this is the command, put `: ` before it"
                } else {
                    ""
                };
                return bad(
                    l.pos(key.at),
                    format!("unknown option `{other}`{hint}: {OPTIONS}"),
                );
            }
        };
        if seen {
            return bad(
                l.pos(key.at),
                format!(
                    "`{}` is given twice in stage `{}`: keep one",
                    key.text, name.text
                ),
            );
        }
        let value = w.get(i + 1);
        match key.text.as_str() {
            "jobs" => jobs = Some(number(l, value, key, "`jobs`", 1, MAX_JOBS)?),
            "retries" => retries = Some(number(l, value, key, "`retries`", 0, MAX_RETRIES)?),
            "timeout" => timeout = Some(duration(l, value, key)?),
            "out" => {
                let Some(p) = value else {
                    return bad(
                        l.end_of(key),
                        "`out` needs a path, e.g. `out /scratch/NAME/{id}`",
                    );
                };
                out = Some(path(l, &p.text, p.at, "the `out` path")?);
            }
            _ => {
                consume = Some(true);
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    let text = command_text(l, h, &format!("the command of stage `{}`", name.text))?;
    let start = h.command.as_ref().map_or(0, |c| c.start);
    let command = template(l, &text, start)?;
    Ok(Stage {
        name: name.text.clone(),
        host: host.text.clone(),
        jobs: jobs.unwrap_or(1),
        out,
        consume: consume.unwrap_or(false),
        retries: retries.unwrap_or(0),
        timeout_s: timeout,
        command,
        span,
    })
}

pub(super) fn mv(l: &Logical, w: &[Word], span: Span) -> Line<Move> {
    let usage = "write `move NAME to HOST:PATH`";
    let Some(name) = w.get(1) else {
        return bad(l.end_of(&w[0]), format!("`move` needs a name: {usage}"));
    };
    if !valid_name(&name.text) {
        return bad(l.pos(name.at), name_rule("move", &name.text));
    }
    match w.get(2) {
        Some(to) if to.text == "to" => {}
        Some(other) => {
            return bad(
                l.pos(other.at),
                format!("expected `to` after the move name: {usage}"),
            )
        }
        None => {
            return bad(
                l.end_of(name),
                format!("move `{}` needs `to HOST:PATH`: {usage}", name.text),
            )
        }
    }
    let Some(dest) = w.get(3) else {
        return bad(
            l.end_of(&w[2]),
            format!("move `{}` needs a destination: {usage}", name.text),
        );
    };
    let Some((host, p)) = dest.text.split_once(':') else {
        let hint = if w.get(4).is_some_and(|x| x.text.starts_with(':')) {
            " (no space before the `:`)"
        } else {
            ""
        };
        return bad(
            l.pos(dest.at),
            format!("the destination `{}` has no `:`{hint}: {usage}", dest.text),
        );
    };
    if p.starts_with("//") {
        return bad(
            l.pos(dest.at),
            "a move goes to a declared host, not a URL: declare `host NAME = ssh://…` and write `move X to NAME:/path`",
        );
    }
    if !valid_name(host) {
        return bad(l.pos(dest.at), name_rule("host", host));
    }
    let path_at = dest.at + host.chars().count() + 1;
    if p.is_empty() {
        let hint = if w.get(4).is_some() {
            " (no space after the `:`)"
        } else {
            ""
        };
        return bad(
            l.pos(path_at),
            format!("the move has no path after `{host}:`{hint}: {usage}"),
        );
    }
    if let Some(extra) = w.get(4) {
        return bad(
            l.pos(extra.at),
            format!("unexpected `{}` after the destination: {usage}", extra.text),
        );
    }
    let path = path(l, p, path_at, "the move's path")?;
    Ok(Move {
        name: name.text.clone(),
        host: host.to_string(),
        path,
        span,
    })
}

/// `90s`, `15m`, `2h`, `1d` or plain seconds: 1 s to [`limits::MAX_TIMEOUT_S`].
fn duration(l: &Logical, w: Option<&Word>, key: &Word) -> Line<u64> {
    let usage = "a whole number with an optional unit `s`, `m`, `h` or `d` (e.g. `90s`, `15m`, `2h`), at most 7 days";
    let Some(w) = w else {
        return bad(
            l.end_of(key),
            format!("`timeout` needs a duration: {usage}"),
        );
    };
    let t = w.text.as_str();
    let (digits, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c),
        _ => (t, 's'),
    };
    let mult = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => 0,
    };
    let secs = (mult > 0 && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse::<u64>().ok())
        .flatten()
        .and_then(|n| n.checked_mul(mult));
    match secs {
        Some(s) if (1..=limits::MAX_TIMEOUT_S).contains(&s) => Ok(s),
        _ => bad(l.pos(w.at), format!("bad timeout `{t}`: {usage}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::super::tests::{one, HEAD};
    use crate::pipeline::spec::Step;

    #[test]
    fn missing_colon_before_the_command() {
        one(&format!("{HEAD}stage s on h jobs 2\n"), 3, 20, "missing");
        one(
            &format!("{HEAD}stage s on h jobs 2 echo hi\n"),
            3,
            21,
            "put `: ` before it",
        );
        one(
            &format!("{HEAD}stage s on h:echo hi\n"),
            3,
            12,
            "a command starts after a `:`",
        );
        one(&format!("{HEAD}stage s on h:\n"), 3, 13, "empty");
    }

    #[test]
    fn options_bad_numbers_duplicates_and_unknowns() {
        one(
            &format!("{HEAD}stage s on h jobs 0: x\n"),
            3,
            19,
            "bad number `0` for `jobs`",
        );
        one(
            &format!("{HEAD}stage s on h jobs 10001: x\n"),
            3,
            19,
            "1 to 10000",
        );
        one(
            &format!("{HEAD}stage s on h retries 101: x\n"),
            3,
            22,
            "`retries`",
        );
        one(
            &format!("{HEAD}stage s on h jobs 99999999999999999999999: x\n"),
            3,
            19,
            "bad number",
        );
        one(
            &format!("{HEAD}stage s on h jobs: x\n"),
            3,
            18,
            "needs a number",
        );
        one(
            &format!("{HEAD}stage s on h jobs 2 jobs 3: x\n"),
            3,
            21,
            "`jobs` is given twice",
        );
        one(
            &format!("{HEAD}stage s on h consume consume: x\n"),
            3,
            22,
            "`consume` is given twice",
        );
        one(
            &format!("{HEAD}stage s on h job 2: x\n"),
            3,
            14,
            "unknown option `job`",
        );
        one(
            &format!("{HEAD}stage s on h timeout 8d: x\n"),
            3,
            22,
            "bad timeout `8d`",
        );
        one(
            &format!("{HEAD}stage s on h timeout 5w: x\n"),
            3,
            22,
            "bad timeout",
        );
        one(
            &format!("{HEAD}stage s on h timeout 0: x\n"),
            3,
            22,
            "bad timeout",
        );
        one(
            &format!("{HEAD}stage s on h out: x\n"),
            3,
            17,
            "`out` needs a path",
        );
        one(
            &format!("{HEAD}limit 0 {{\nstage s on h: x\n}}\n"),
            3,
            7,
            "bad number `0` for `limit`",
        );
        one(
            &format!("{HEAD}limit x {{\nstage s on h: x\n}}\n"),
            3,
            7,
            "bad number `x`",
        );
    }

    #[test]
    fn options_and_durations_read() {
        let spec = parse(
            "t",
            &format!("{HEAD}stage s on h timeout 2h retries 3 consume out /x/{{id}}/: x {{out}}\nstage t on h timeout 90: x\n"),
        )
        .unwrap();
        let Step::Stage(s) = &spec.steps[0] else {
            panic!()
        };
        assert_eq!((s.timeout_s, s.retries, s.consume), (Some(7200), 3, true));
        assert_eq!(s.out.as_ref().unwrap().text, "/x/{id}/");
        let Step::Stage(t) = &spec.steps[1] else {
            panic!()
        };
        assert_eq!(t.timeout_s, Some(90));
        for (d, s) in [
            ("15m", 900),
            ("1d", 86_400),
            ("7d", 604_800),
            ("604800", 604_800),
        ] {
            let spec = parse("t", &format!("{HEAD}stage s on h timeout {d}: x\n")).unwrap();
            let Step::Stage(st) = &spec.steps[0] else {
                panic!()
            };
            assert_eq!(st.timeout_s, Some(s));
        }
    }

    #[test]
    fn moves_and_templates() {
        one(
            &format!("{HEAD}stage s on h out /x/{{id}}: x\nmove m to h /x\n"),
            4,
            11,
            "has no `:`",
        );
        one(
            &format!("{HEAD}stage s on h out /x/{{id}}: x\nmove m to h: /x\n"),
            4,
            13,
            "no space after",
        );
        one(
            &format!("{HEAD}stage s on h out /x/{{id}}: x\nmove m to ssh://u@x:/p\n"),
            4,
            11,
            "not a URL",
        );
        one(
            &format!("{HEAD}stage s on h out /x/{{bad}}: x\n"),
            3,
            21,
            "unknown template field `{bad}`",
        );
        one(
            &format!("{HEAD}stage s on h: echo \\\n  {{nope}}\n"),
            4,
            3,
            "`{nope}`",
        );
        one(
            &format!("{HEAD}stage s on h: x\nmove m to h:/y/{{x}}\n"),
            4,
            16,
            "`{x}`",
        );
    }
}
