//! Templates of commands and paths: `{id}`, `{out}`, `{in}` and
//! `{STAGE.out}` filled in per item, values shell-quoted where needed.
//!
//! `{{` and `}}` are literal braces; `${…}` is left to the shell whole
//! (parameter expansion); a `{` that does not start a field name followed
//! by `}` (a brace group `{ a; }`, a brace expansion `{a,b}`) is literal.

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

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    Text(String),
    /// A field, with its offset in the template's text in characters (for
    /// the column of an error).
    Field {
        field: Field,
        offset: u32,
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
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            match c {
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
                    if !lit.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Field {
                        field,
                        offset: i as u32,
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
            Part::Field { field, offset } => Some((field, *offset)),
            Part::Text(_) => None,
        })
    }

    /// Fills in the fields with `value`; `shell` quotes each value for
    /// `sh` where it holds anything but plain path characters. `Err` names
    /// the first field `value` has no value for.
    pub fn expand(
        &self,
        value: impl Fn(&Field) -> Option<String>,
        shell: bool,
    ) -> Result<String, Field> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field { field, .. } => {
                    let v = value(field).ok_or_else(|| field.clone())?;
                    if shell {
                        out.push_str(&shell_quote(&v));
                    } else {
                        out.push_str(&v);
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
