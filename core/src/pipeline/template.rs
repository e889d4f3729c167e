//! Templates of commands and paths: `{id}`, `{out}`, `{in}` and
//! `{STAGE.out}` filled in per item, values shell-quoted where needed.
//!
//! `{{` and `}}` are literal braces; `${…}` is left to the shell whole
//! (parameter expansion); a `{` that does not start a field name followed
//! by `}` (a brace group `{ a; }`, a brace expansion `{a,b}`) is literal.
//!
//! In a command, a value is quoted for where its field stands: bare, it
//! becomes one word (single quotes where needed); inside the author's `'…'`
//! or `"…"` it is escaped for those quotes, so that `"{id}"` or `'{in}'`
//! never lets a `$(…)` or a quote in an item's name reach the shell as code.
//! Where the quotes cannot be told by reading (inside backquotes, after a
//! `case` inside `$(…)`, whose patterns' `)` close nothing, or after bash's
//! `$'…'`), a field is refused at its column instead.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A field a template names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// The item's id.
    Id,
    /// The stage's own output (a temporary path until it succeeds).
    Out,
    /// The item's latest output before this step: the last stage's `out`
    /// or the last move's destination.
    In,
    /// An earlier stage's output on the item's path.
    StageOut(String),
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Id => f.write_str("{id}"),
            Field::Out => f.write_str("{out}"),
            Field::In => f.write_str("{in}"),
            Field::StageOut(s) => write!(f, "{{{s}.out}}"),
        }
    }
}

/// The shell quotes a field stands in, as `sh` reads the text before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Quoting {
    /// In none: the value is made one word.
    #[default]
    Bare,
    /// Inside `'…'`.
    Single,
    /// Inside `"…"`.
    Double,
}

/// What a field is filled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fill {
    /// A value, quoted for where the field stands.
    Text(String),
    /// The shell variable of this name (its value is only known where the
    /// command runs), referred to as the field's place needs.
    Var(&'static str),
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    Text(String),
    /// A field, with its offset in the template's text in characters (for
    /// the column of an error), and the quotes it stands in.
    Field {
        field: Field,
        offset: u32,
        #[serde(default)]
        quoting: Quoting,
    },
}

/// A parsed template and the text it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    pub text: String,
    pub parts: Vec<Part>,
}

/// A template that does not parse: what is wrong, and where in its text
/// (characters from its start).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TemplateError {
    pub offset: u32,
    pub message: String,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl Template {
    /// Parses `text`. A `{NAME}` or `{NAME.out}` whose NAME is not `id`,
    /// `out` or `in` (or, with `.out`, any stage name) is an error naming it.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let chars: Vec<char> = text.chars().collect();
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut quoting = Quoting::Bare;
        // Command substitutions, `$(…)` and `` `…` ``, begin unquoted
        // whatever quotes they stand in (not single ones, where they are
        // text): the quotes they stood in, and for `$(…)` the parentheses
        // open inside, come back at their end.
        let mut outer: Vec<(Quoting, Option<usize>)> = Vec::new();
        // The first construct after which the quotes a field stands in
        // cannot be told by reading (its column, and what it is and what to
        // do instead): every field after it is refused rather than quoted
        // wrongly.
        let mut unreadable: Option<(usize, &str)> = None;
        let word = |c: char| c.is_alphanumeric() || c == '_';
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            // A `case` inside `$(…)`: its patterns' `)` close no
            // parenthesis of this count.
            if unreadable.is_none()
                && quoting == Quoting::Bare
                && outer.iter().any(|(_, sub)| sub.is_some())
                && chars[i..].starts_with(&['c', 'a', 's', 'e'])
                && (i == 0 || !word(chars[i - 1]))
                && chars.get(i + 4).is_none_or(|&n| !word(n))
            {
                unreadable = Some((
                    i,
                    "a `case` inside `$(…)`: its patterns' `)` hide which quotes the field is \
                     in; move the `case` into a script of its own, or out of `$(…)`",
                ));
            }
            // bash's `$'…'` (sh is bash on some hosts): a backslash escapes
            // its quote, which plain sh does not read so.
            if unreadable.is_none()
                && quoting == Quoting::Bare
                && c == '$'
                && chars.get(i + 1) == Some(&'\'')
            {
                unreadable = Some((
                    i,
                    "a `$'…'`: bash and sh read its quotes differently; write the text in '…' \
                     or \"…\" instead",
                ));
            }
            // A backslash, read first, as `sh` does: outside quotes it
            // takes whatever follows as text (a quote, a parenthesis that
            // then closes nothing), inside "…" only `$`, a backquote, `"`
            // and itself; inside '…' it is text. A field right after one
            // would lose its quoting's first character: refused.
            if c == '\\' && quoting != Quoting::Single {
                let next = chars.get(i + 1).copied();
                if next == Some('{') && chars.get(i + 2).copied().is_some_and(is_name_start) {
                    return Err(TemplateError {
                        offset: i as u32 + 1,
                        message: "a field right after `\\`: the backslash would take the \
                                  first character of its quoted value; remove it (write `{{` \
                                  for a literal brace)"
                            .into(),
                    });
                }
                let taken = match (quoting, next) {
                    (Quoting::Bare, Some(_)) => 2,
                    (Quoting::Double, Some(n)) if "$`\"\\".contains(n) => 2,
                    _ => 1,
                };
                lit.extend(&chars[i..i + taken]);
                i += taken;
                continue;
            }
            if quoting != Quoting::Single {
                let next = chars.get(i + 1).copied();
                let taken = match (c, outer.last_mut()) {
                    ('$', _) if next == Some('(') => {
                        outer.push((quoting, Some(0)));
                        quoting = Quoting::Bare;
                        2
                    }
                    ('(', Some((_, Some(depth)))) if quoting == Quoting::Bare => {
                        *depth += 1;
                        1
                    }
                    (')', Some((_, Some(depth)))) if quoting == Quoting::Bare => {
                        match depth.checked_sub(1) {
                            Some(d) => *depth = d,
                            None => quoting = outer.pop().map_or(Quoting::Bare, |(q, _)| q),
                        }
                        1
                    }
                    ('`', Some((_, None))) => {
                        quoting = outer.pop().map_or(Quoting::Bare, |(q, _)| q);
                        1
                    }
                    ('`', _) => {
                        outer.push((quoting, None));
                        quoting = Quoting::Bare;
                        1
                    }
                    _ => 0,
                };
                if taken > 0 {
                    lit.extend(&chars[i..i + taken]);
                    i += taken;
                    continue;
                }
            }
            match c {
                // The shell's quotes, followed as `sh` reads them (the
                // backslash is taken above).
                '\'' if quoting != Quoting::Double => {
                    quoting = match quoting {
                        Quoting::Single => Quoting::Bare,
                        _ => Quoting::Single,
                    };
                    lit.push(c);
                    i += 1;
                }
                '"' if quoting != Quoting::Single => {
                    quoting = match quoting {
                        Quoting::Double => Quoting::Bare,
                        _ => Quoting::Double,
                    };
                    lit.push(c);
                    i += 1;
                }
                '{' if chars.get(i + 1) == Some(&'{') => {
                    lit.push('{');
                    i += 2;
                }
                '}' if chars.get(i + 1) == Some(&'}') => {
                    lit.push('}');
                    i += 2;
                }
                '$' if chars.get(i + 1) == Some(&'{') => {
                    // `${…}` belongs to the shell, nested braces included.
                    let mut depth = 0usize;
                    let mut j = i + 1;
                    while j < chars.len() {
                        match chars[j] {
                            '{' => depth += 1,
                            '}' => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    let end = (j + 1).min(chars.len());
                    // Quotes inside `${…}` (`${f%'}'}`) hide where it ends
                    // from this count: the fields after it are refused.
                    if unreadable.is_none()
                        && chars[i..end].iter().any(|c| matches!(c, '\'' | '"' | '\\'))
                    {
                        unreadable = Some((
                            i,
                            "a `${…}` holding quotes or a backslash: where it ends cannot be \
                             told by counting braces; set a variable in a script of its own \
                             instead",
                        ));
                    }
                    lit.extend(&chars[i..end]);
                    i = end;
                }
                '{' if chars.get(i + 1).copied().is_some_and(is_name_start) => {
                    let mut j = i + 1;
                    while j < chars.len() && (is_name_char(chars[j]) || chars[j] == '.') {
                        j += 1;
                    }
                    if chars.get(j) != Some(&'}') {
                        // Not a field (`{a,b}`, `{a b}`): shell text.
                        lit.push('{');
                        i += 1;
                        continue;
                    }
                    let name: String = chars[i + 1..j].iter().collect();
                    let field = match name.as_str() {
                        "id" => Field::Id,
                        "out" => Field::Out,
                        "in" => Field::In,
                        n => match n.strip_suffix(".out") {
                            Some(stage)
                                if !stage.is_empty()
                                    && !stage.contains('.')
                                    && stage.chars().next().is_some_and(is_name_start) =>
                            {
                                Field::StageOut(stage.to_string())
                            }
                            _ => {
                                return Err(TemplateError {
                                    offset: i as u32,
                                    message: format!(
                                        "unknown template field `{{{n}}}`: the fields are {{id}}, \
                                         {{out}}, {{in}} and {{STAGE.out}} (write `{{{{` for a \
                                         literal brace)"
                                    ),
                                })
                            }
                        },
                    };
                    if let Some((at, what)) = unreadable {
                        return Err(TemplateError {
                            offset: i as u32,
                            message: format!("`{{{name}}}` after {what} (column {})", at + 1),
                        });
                    }
                    // Inside backquotes the shell reads `\`` and `\\` before
                    // any quote, so no quoting of a value is sure there.
                    if outer.iter().any(|(_, sub)| sub.is_none()) {
                        return Err(TemplateError {
                            offset: i as u32,
                            message: format!(
                                "`{{{name}}}` inside backquotes: write `$(…)` instead of \
                                 `…` around it, so that its value can be quoted safely"
                            ),
                        });
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Field {
                        field,
                        offset: i as u32,
                        quoting,
                    });
                    i = j + 1;
                }
                c => {
                    lit.push(c);
                    i += 1;
                }
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Text(lit));
        }
        Ok(Template {
            text: text.to_string(),
            parts,
        })
    }

    /// The fields it names, with their offsets, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&Field, u32)> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field { field, offset, .. } => Some((field, *offset)),
            Part::Text(_) => None,
        })
    }

    /// Fills in the fields with `value`; `shell` quotes each value for
    /// `sh` as its place needs: bare, where it holds anything but plain path
    /// characters; inside the author's quotes, escaped for them. `Err`
    /// names the first field `value` has no value for.
    pub fn expand(
        &self,
        value: impl Fn(&Field) -> Option<String>,
        shell: bool,
    ) -> Result<String, Field> {
        self.fill(|f| value(f).map(Fill::Text), shell)
    }

    /// [`Self::expand`], where a field may also stand for a shell variable
    /// (`Fill::Var`), referred to as its place needs: `"${V}"` bare, `${V}`
    /// inside "…", `'"${V}"'` inside '…'.
    pub fn fill(
        &self,
        value: impl Fn(&Field) -> Option<Fill>,
        shell: bool,
    ) -> Result<String, Field> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field { field, quoting, .. } => {
                    let v = match value(field).ok_or_else(|| field.clone())? {
                        Fill::Text(v) => v,
                        Fill::Var(name) => {
                            out.push_str(&match (shell, quoting) {
                                (false, _) | (true, Quoting::Double) => format!("${{{name}}}"),
                                (true, Quoting::Bare) => format!("\"${{{name}}}\""),
                                (true, Quoting::Single) => format!("'\"${{{name}}}\"'"),
                            });
                            continue;
                        }
                    };
                    match (shell, quoting) {
                        (false, _) => out.push_str(&v),
                        (true, Quoting::Bare) => out.push_str(&shell_quote(&v)),
                        // Inside '…' only a `'` ends the quotes: it is
                        // closed, given escaped, and opened again.
                        (true, Quoting::Single) => out.push_str(&v.replace('\'', r"'\''")),
                        // Inside "…" these four keep their meaning.
                        (true, Quoting::Double) => {
                            for c in v.chars() {
                                if matches!(c, '\\' | '"' | '$' | '`') {
                                    out.push('\\');
                                }
                                out.push(c);
                            }
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// `s` as one `sh` word: as it is when it holds only characters no shell
/// treats specially, else in single quotes (a `'` inside as `'\''`).
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_escapes_and_shell_text() {
        let t = Template::parse("cp {in} {out}/x.{id} ${HOME} {{lit}} { a; } {a,b}").unwrap();
        let fields: Vec<_> = t.fields().map(|(f, o)| (f.clone(), o)).collect();
        assert_eq!(
            fields,
            vec![(Field::In, 3), (Field::Out, 8), (Field::Id, 16)]
        );
        let s = t
            .expand(
                |f| match f {
                    Field::Id => Some("it's".into()),
                    Field::In => Some("/a b".into()),
                    Field::Out => Some("/o".into()),
                    Field::StageOut(_) => None,
                },
                true,
            )
            .unwrap();
        assert_eq!(s, r"cp '/a b' /o/x.'it'\''s' ${HOME} {lit} { a; } {a,b}");
    }

    /// Review of 3877596, F4: `"{id}"` and `'{id}'` (quoting by reflex)
    /// put the value inside the author's quotes, where single quotes of our
    /// own are literal (in "…") or end theirs (in '…'): a `$(…)` in an item's
    /// name ran. Each form must give the value back as it is, and run
    /// nothing.
    #[test]
    fn a_value_inside_the_commands_own_quotes_stays_text() {
        let dir = std::env::temp_dir().join(format!("flotilla-quoting-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = Template::parse(
            r#"printf '%s\n' {id} "{id}" '{id}' "a \"{id}\" b" 'x'{id}"y" "$(printf %s "{id}")" "$( (printf %s {id}) )" \"{id}\""#,
        )
        .unwrap();
        let quotings: Vec<_> = t
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Field { quoting, .. } => Some(*quoting),
                Part::Text(_) => None,
            })
            .collect();
        use Quoting::*;
        assert_eq!(
            quotings,
            [Bare, Double, Single, Double, Bare, Double, Bare, Bare]
        );
        for id in [
            "$(touch PWNED)",
            "`touch PWNED`",
            "it's",
            r#"a"b\c"#,
            r"x\",
            "${HOME}",
            "'; touch PWNED; '",
            "\"; touch PWNED; \"",
        ] {
            let cmd = t.expand(|_| Some(id.to_string()), true).unwrap();
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .current_dir(&dir)
                .output()
                .unwrap();
            assert!(out.status.success(), "{id:?}: {cmd}");
            let lines: Vec<String> = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect();
            assert_eq!(
                lines,
                [
                    id.to_string(),
                    id.to_string(),
                    id.to_string(),
                    format!("a \"{id}\" b"),
                    format!("x{id}y"),
                    id.to_string(),
                    id.to_string(),
                    format!("\"{id}\""),
                ],
                "{id:?}: {cmd}"
            );
            assert!(!dir.join("PWNED").exists(), "{id:?} ran: {cmd}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
        // In backquotes no quoting is sure: refused, pointing at `$(…)`.
        let e = Template::parse("echo \"`cat {in}`\"").unwrap_err();
        assert_eq!(e.offset, 11);
        assert!(e.message.contains("$(…)"), "{}", e.message);
        // A quote in a path template is only text.
        assert!(Template::parse("/data/it's/{id}").is_ok());
        // After a `case` in `$(…)` a pattern's `)` would end the count of
        // parentheses: the field is refused, not quoted as if outside.
        let e = Template::parse("echo \"$(case a in a) echo x;; esac) {id}\"").unwrap_err();
        assert!(e.message.contains("`case` inside `$(…)`"), "{}", e.message);
        // A `case` outside any `$(…)`, or a word holding `case`, is text.
        assert!(Template::parse("case {id} in a) echo \"$(cat {in})\";; esac").is_ok());
        assert!(Template::parse("echo \"$(showcase {id})\"").is_ok());
        // A variable in each place: `$FLOTILLA_OUT`'s value, however
        // quoted the field is.
        let t =
            Template::parse(r#"printf '%s\n' {out} "{out}" '{out}' "a {out}b" x{out}"#).unwrap();
        let cmd = t.fill(|_| Some(Fill::Var("FLOTILLA_OUT")), true).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .env("FLOTILLA_OUT", "/tmp/a b/$(x)'")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "/tmp/a b/$(x)'\n/tmp/a b/$(x)'\n/tmp/a b/$(x)'\na /tmp/a b/$(x)'b\nx/tmp/a b/$(x)'\n",
            "{cmd}"
        );
        // A backslash outside quotes takes the next character, a
        // parenthesis too: `\(` inside `$(…)` closes nothing.
        let t = Template::parse(r#"echo "$(echo \( {id})""#).unwrap();
        assert!(t.parts.iter().any(|p| matches!(
            p,
            Part::Field {
                quoting: Quoting::Bare,
                ..
            }
        )));
        assert!(Template::parse(r"echo \{id}").is_err());
        assert!(Template::parse(r"echo \\{id}").is_ok());
        let e = Template::parse(r"echo ${f%'}'} {id}").unwrap_err();
        assert!(e.message.contains("${…}"), "{}", e.message);
        assert!(Template::parse(r"echo ${HOME} {id}").is_ok());
        // bash's `$'…'`, where `\'` does not end the quotes.
        let e = Template::parse(r"echo $'it\'s {id}'").unwrap_err();
        assert!(e.message.contains("$'…'"), "{}", e.message);
    }

    #[test]
    fn stage_outputs_and_unknown_fields() {
        let t = Template::parse("{split.out}/p").unwrap();
        assert_eq!(
            t.fields().next().map(|(f, _)| f.clone()),
            Some(Field::StageOut("split".into()))
        );
        let e = Template::parse("echo {nope}").unwrap_err();
        assert_eq!(e.offset, 5);
        assert!(e.message.contains("{nope}"), "{}", e.message);
        assert!(Template::parse("{a.b.out}").is_err());
        // A field with no value is named.
        let t = Template::parse("{id}").unwrap();
        assert_eq!(t.expand(|_| None, true), Err(Field::Id));
    }
}
