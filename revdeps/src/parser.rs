//! The opam file grammar: items, sections and values, parsed with positions.

use crate::error::SyntaxError;
use crate::lexer::{EnvOp, Lexer, Pos, Relop, Tok};

/// Nesting deeper than this is rejected rather than risking the stack.
const MAX_DEPTH: u32 = 200;

#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub pos: Pos,
    pub kind: ValueKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ValueKind {
    Bool(bool),
    Int(i64),
    String(String),
    Ident(String),
    Relop(Relop, Box<Value>, Box<Value>),
    PrefixRelop(Relop, Box<Value>),
    And(Box<Value>, Box<Value>),
    Or(Box<Value>, Box<Value>),
    Not(Box<Value>),
    Defined(Box<Value>),
    List(Vec<Value>),
    Group(Vec<Value>),
    Option(Box<Value>, Vec<Value>),
    EnvBinding(Box<Value>, EnvOp, Box<Value>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Field {
        pos: Pos,
        name: String,
        value: Value,
    },
    Section {
        pos: Pos,
        kind: String,
        name: Option<String>,
        items: Vec<Item>,
    },
}

/// Parses a whole opam file into its items.
pub fn parse_file(src: &str) -> Result<Vec<Item>, SyntaxError> {
    let mut p = Parser::new(src)?;
    let items = p.items(0)?;
    match &p.tok {
        Tok::Eof => Ok(items),
        t => Err(p.err(format!("unexpected {}", describe(t)))),
    }
}

struct Parser<'a> {
    lex: Lexer<'a>,
    tok: Tok,
    pos: Pos,
}

fn is_atom(v: &Value) -> bool {
    matches!(
        v.kind,
        ValueKind::String(_) | ValueKind::Ident(_) | ValueKind::Int(_) | ValueKind::Bool(_)
    )
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Eof => "end of file".into(),
        Tok::Str(s) => format!("string {s:?}"),
        Tok::Ident(s) => format!("identifier {s}"),
        t => format!("{t:?}"),
    }
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Result<Self, SyntaxError> {
        let mut lex = Lexer::new(src);
        let (tok, pos) = lex.next_token()?;
        Ok(Parser { lex, tok, pos })
    }

    fn advance(&mut self) -> Result<Tok, SyntaxError> {
        let (tok, pos) = self.lex.next_token()?;
        self.pos = pos;
        Ok(std::mem::replace(&mut self.tok, tok))
    }

    fn err(&self, msg: impl Into<String>) -> SyntaxError {
        SyntaxError {
            line: self.pos.line,
            col: self.pos.col,
            msg: msg.into(),
        }
    }

    fn expect(&mut self, t: Tok) -> Result<(), SyntaxError> {
        if self.tok == t {
            self.advance()?;
            Ok(())
        } else {
            Err(self.err(format!(
                "expected {}, found {}",
                describe(&t),
                describe(&self.tok)
            )))
        }
    }

    fn items(&mut self, depth: u32) -> Result<Vec<Item>, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.err("sections nested too deeply"));
        }
        let mut items = Vec::new();
        while let Tok::Ident(_) = &self.tok {
            let pos = self.pos;
            let Tok::Ident(name) = self.advance()? else {
                unreachable!("checked by the loop condition")
            };
            match &self.tok {
                Tok::Colon => {
                    self.advance()?;
                    let value = self.value(depth)?;
                    items.push(Item::Field { pos, name, value });
                }
                Tok::Str(_) | Tok::LBrace => {
                    let sname = match self.advance()? {
                        Tok::Str(s) => {
                            self.expect(Tok::LBrace)?;
                            Some(s)
                        }
                        _ => None,
                    };
                    let sub = self.items(depth + 1)?;
                    self.expect(Tok::RBrace)?;
                    items.push(Item::Section {
                        pos,
                        kind: name,
                        name: sname,
                        items: sub,
                    });
                }
                t => {
                    return Err(self.err(format!(
                        "expected ':' or a section after {name}, found {}",
                        describe(t)
                    )))
                }
            }
        }
        Ok(items)
    }

    /// value := or-expression, where options `v {…}` bind tightest, then
    /// prefix operators, relations, `&`, and `|` loosest (opam-file-format's precedences).
    fn value(&mut self, depth: u32) -> Result<Value, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.err("value nested too deeply"));
        }
        self.or_expr(depth + 1)
    }

    fn or_expr(&mut self, depth: u32) -> Result<Value, SyntaxError> {
        let mut l = self.and_expr(depth)?;
        while self.tok == Tok::Or {
            self.advance()?;
            let r = self.and_expr(depth)?;
            l = Value {
                pos: l.pos,
                kind: ValueKind::Or(Box::new(l), Box::new(r)),
            };
        }
        Ok(l)
    }

    fn and_expr(&mut self, depth: u32) -> Result<Value, SyntaxError> {
        let mut l = self.rel_expr(depth)?;
        while self.tok == Tok::And {
            self.advance()?;
            let r = self.rel_expr(depth)?;
            l = Value {
                pos: l.pos,
                kind: ValueKind::And(Box::new(l), Box::new(r)),
            };
        }
        Ok(l)
    }

    /// Relations hold between plain atoms only (`atom RELOP atom` in
    /// opam-file-format), so `{>= "1" < "2"}` is two prefix relations.
    fn rel_expr(&mut self, depth: u32) -> Result<Value, SyntaxError> {
        let l = self.unary(depth)?;
        if !is_atom(&l) {
            return Ok(l);
        }
        match self.tok {
            Tok::Relop(op) => {
                self.advance()?;
                let r = self.plain_atom()?;
                Ok(Value {
                    pos: l.pos,
                    kind: ValueKind::Relop(op, Box::new(l), Box::new(r)),
                })
            }
            Tok::EnvOp(op) => {
                self.advance()?;
                let r = self.plain_atom()?;
                Ok(Value {
                    pos: l.pos,
                    kind: ValueKind::EnvBinding(Box::new(l), op, Box::new(r)),
                })
            }
            _ => Ok(l),
        }
    }

    fn plain_atom(&mut self) -> Result<Value, SyntaxError> {
        let pos = self.pos;
        let kind = match &self.tok {
            Tok::Str(_) | Tok::Ident(_) | Tok::Int(_) | Tok::Bool(_) => match self.advance()? {
                Tok::Str(s) => ValueKind::String(s),
                Tok::Ident(s) => ValueKind::Ident(s),
                Tok::Int(n) => ValueKind::Int(n),
                Tok::Bool(b) => ValueKind::Bool(b),
                _ => unreachable!("matched above"),
            },
            t => {
                return Err(self.err(format!(
                    "expected a string, identifier, integer or boolean, found {}",
                    describe(t)
                )))
            }
        };
        Ok(Value { pos, kind })
    }

    fn unary(&mut self, depth: u32) -> Result<Value, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.err("value nested too deeply"));
        }
        let pos = self.pos;
        match self.tok {
            Tok::Not => {
                self.advance()?;
                let v = self.unary(depth + 1)?;
                Ok(Value {
                    pos,
                    kind: ValueKind::Not(Box::new(v)),
                })
            }
            Tok::Defined => {
                self.advance()?;
                let v = self.unary(depth + 1)?;
                Ok(Value {
                    pos,
                    kind: ValueKind::Defined(Box::new(v)),
                })
            }
            Tok::Relop(op) => {
                self.advance()?;
                let v = self.plain_atom()?;
                Ok(Value {
                    pos,
                    kind: ValueKind::PrefixRelop(op, Box::new(v)),
                })
            }
            _ => self.optioned(depth),
        }
    }

    fn optioned(&mut self, depth: u32) -> Result<Value, SyntaxError> {
        let mut v = self.atom(depth)?;
        while self.tok == Tok::LBrace {
            self.advance()?;
            let opts = self.values(depth + 1, Tok::RBrace)?;
            v = Value {
                pos: v.pos,
                kind: ValueKind::Option(Box::new(v), opts),
            };
        }
        Ok(v)
    }

    fn atom(&mut self, depth: u32) -> Result<Value, SyntaxError> {
        let pos = self.pos;
        let kind = match &self.tok {
            Tok::Str(_) | Tok::Ident(_) | Tok::Int(_) | Tok::Bool(_) => match self.advance()? {
                Tok::Str(s) => ValueKind::String(s),
                Tok::Ident(s) => ValueKind::Ident(s),
                Tok::Int(n) => ValueKind::Int(n),
                Tok::Bool(b) => ValueKind::Bool(b),
                _ => unreachable!("matched above"),
            },
            Tok::LBracket => {
                self.advance()?;
                ValueKind::List(self.values(depth + 1, Tok::RBracket)?)
            }
            Tok::LPar => {
                self.advance()?;
                ValueKind::Group(self.values(depth + 1, Tok::RPar)?)
            }
            t => {
                let msg = format!("expected a value, found {}", describe(t));
                return Err(self.err(msg));
            }
        };
        Ok(Value { pos, kind })
    }

    /// Values up to the closing token, which is consumed.
    fn values(&mut self, depth: u32, close: Tok) -> Result<Vec<Value>, SyntaxError> {
        let mut vs = Vec::new();
        while self.tok != close {
            if self.tok == Tok::Eof {
                return Err(self.err(format!("expected {}, found end of file", describe(&close))));
            }
            vs.push(self.value(depth)?);
        }
        self.advance()?;
        Ok(vs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_sections_and_precedence() {
        let src = r#"
opam-version: "2.0"
depends: [
  "ocaml" {>= "4.08"}
  ("a" | "b" {with-test & < "2"})
]
available: os != "win32" & arch = "x86_64" | os = "linux"
url { src: "https://x/y.tgz" checksum: ["md5=0"] }
extra-source "p" { src: "q" }
"#;
        let items = parse_file(src).expect("parses");
        assert_eq!(items.len(), 5);
        let Item::Field { value, .. } = &items[2] else {
            panic!()
        };
        assert!(matches!(value.kind, ValueKind::Or(..)));
        let Item::Field { value, pos, .. } = &items[1] else {
            panic!()
        };
        assert_eq!(pos.line, 3);
        let ValueKind::List(l) = &value.kind else {
            panic!()
        };
        assert!(matches!(l[0].kind, ValueKind::Option(..)));
        assert!(matches!(l[1].kind, ValueKind::Group(..)));
    }

    #[test]
    fn errors_carry_lines() {
        let e = parse_file("a: \"x\"\nb: [\n\"y\" {").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(parse_file("a: ]").is_err());
        assert!(parse_file(&"[".repeat(100_000)).is_err());
        assert!(parse_file(&format!("a: {}", "!".repeat(100_000))).is_err());
    }
}
