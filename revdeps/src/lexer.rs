//! Tokens of the opam file format, each with its line and column.

use crate::error::SyntaxError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Relop {
    Eq,
    Neq,
    Lt,
    Leq,
    Gt,
    Geq,
}

impl Relop {
    pub fn as_str(self) -> &'static str {
        match self {
            Relop::Eq => "=",
            Relop::Neq => "!=",
            Relop::Lt => "<",
            Relop::Leq => "<=",
            Relop::Gt => ">",
            Relop::Geq => ">=",
        }
    }
    /// Does `ord` (left compared with right) satisfy this relation?
    pub fn holds(self, ord: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            Relop::Eq => ord == Equal,
            Relop::Neq => ord != Equal,
            Relop::Lt => ord == Less,
            Relop::Leq => ord != Greater,
            Relop::Gt => ord == Greater,
            Relop::Geq => ord != Less,
        }
    }
    /// The relation that holds exactly when this one does not.
    pub fn negate(self) -> Relop {
        match self {
            Relop::Eq => Relop::Neq,
            Relop::Neq => Relop::Eq,
            Relop::Lt => Relop::Geq,
            Relop::Leq => Relop::Gt,
            Relop::Gt => Relop::Leq,
            Relop::Geq => Relop::Lt,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvOp {
    PlusEq,
    EqPlus,
    ColonEq,
    EqColon,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Tok {
    Str(String),
    Ident(String),
    Int(i64),
    Bool(bool),
    Colon,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    LPar,
    RPar,
    Relop(Relop),
    EnvOp(EnvOp),
    And,
    Or,
    Not,
    Defined,
    Eof,
}

pub struct Lexer<'a> {
    src: &'a [u8],
    i: usize,
    line: u32,
    col: u32,
}

fn is_id_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'+'
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str) -> Self {
        Lexer {
            src: src.as_bytes(),
            i: 0,
            line: 1,
            col: 1,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.i).copied()
    }
    fn peek_at(&self, k: usize) -> Option<u8> {
        self.src.get(self.i + k).copied()
    }
    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        if c == b'\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }
    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            col: self.col,
        }
    }
    fn err(&self, pos: Pos, msg: impl Into<String>) -> SyntaxError {
        SyntaxError {
            line: pos.line,
            col: pos.col,
            msg: msg.into(),
        }
    }

    fn skip_blank(&mut self) -> Result<(), SyntaxError> {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\r' | b'\n') => {
                    self.bump();
                }
                Some(b'#') => {
                    while let Some(c) = self.peek() {
                        if c == b'\n' {
                            break;
                        }
                        self.bump();
                    }
                }
                Some(b'(') if self.peek_at(1) == Some(b'*') => {
                    let start = self.pos();
                    self.bump();
                    self.bump();
                    let mut depth = 1u32;
                    while depth > 0 {
                        match self.bump() {
                            None => return Err(self.err(start, "unterminated comment")),
                            Some(b'(') if self.peek() == Some(b'*') => {
                                self.bump();
                                depth += 1;
                            }
                            Some(b'*') if self.peek() == Some(b')') => {
                                self.bump();
                                depth -= 1;
                            }
                            _ => {}
                        }
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    /// The next token and where it starts.
    pub fn next_token(&mut self) -> Result<(Tok, Pos), SyntaxError> {
        self.skip_blank()?;
        let pos = self.pos();
        let Some(c) = self.peek() else {
            return Ok((Tok::Eof, pos));
        };
        let two = |l: &Self, a: u8| l.peek_at(1) == Some(a);
        let tok = match c {
            b'"' => return self.string(pos).map(|s| (Tok::Str(s), pos)),
            b'{' => self.one(Tok::LBrace),
            b'}' => self.one(Tok::RBrace),
            b'[' => self.one(Tok::LBracket),
            b']' => self.one(Tok::RBracket),
            b'(' => self.one(Tok::LPar),
            b')' => self.one(Tok::RPar),
            b'&' => self.one(Tok::And),
            b'|' => self.one(Tok::Or),
            b'?' => self.one(Tok::Defined),
            b'!' if two(self, b'=') => self.two(Tok::Relop(Relop::Neq)),
            b'!' => self.one(Tok::Not),
            b'<' if two(self, b'=') => self.two(Tok::Relop(Relop::Leq)),
            b'<' => self.one(Tok::Relop(Relop::Lt)),
            b'>' if two(self, b'=') => self.two(Tok::Relop(Relop::Geq)),
            b'>' => self.one(Tok::Relop(Relop::Gt)),
            b'=' if two(self, b'+') => self.two(Tok::EnvOp(EnvOp::EqPlus)),
            b'=' if two(self, b':') => self.two(Tok::EnvOp(EnvOp::EqColon)),
            b'=' => self.one(Tok::Relop(Relop::Eq)),
            b'+' if two(self, b'=') => self.two(Tok::EnvOp(EnvOp::PlusEq)),
            b':' if two(self, b'=') => self.two(Tok::EnvOp(EnvOp::ColonEq)),
            b':' => self.one(Tok::Colon),
            b'-' | b'0'..=b'9' if self.looks_like_int() => return self.int(pos),
            c if is_id_char(c) => self.ident(),
            c => {
                return Err(self.err(pos, format!("unexpected character {:?}", c as char)));
            }
        };
        Ok((tok, pos))
    }

    fn one(&mut self, t: Tok) -> Tok {
        self.bump();
        t
    }
    fn two(&mut self, t: Tok) -> Tok {
        self.bump();
        self.bump();
        t
    }

    /// An integer is `-?[0-9]+` not followed by an identifier character.
    fn looks_like_int(&self) -> bool {
        let mut k = usize::from(self.peek() == Some(b'-'));
        let start = k;
        while matches!(self.peek_at(k), Some(b'0'..=b'9')) {
            k += 1;
        }
        k > start && !self.peek_at(k).is_some_and(|c| is_id_char(c) || c == b':')
    }

    fn int(&mut self, pos: Pos) -> Result<(Tok, Pos), SyntaxError> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.bump();
        }
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.bump();
        }
        let s = std::str::from_utf8(&self.src[start..self.i]).unwrap_or("0");
        s.parse::<i64>()
            .map(|n| (Tok::Int(n), pos))
            .map_err(|_| self.err(pos, "integer out of range"))
    }

    /// Identifiers: `[A-Za-z0-9_+-]+` with optional `:` parts (`pkg:var`, `_:version`).
    fn ident(&mut self) -> Tok {
        let start = self.i;
        while self.peek().is_some_and(is_id_char) {
            self.bump();
        }
        // `pkg:var` only when an identifier character directly follows the colon.
        while self.peek() == Some(b':') && self.peek_at(1).is_some_and(is_id_char) {
            self.bump();
            while self.peek().is_some_and(is_id_char) {
                self.bump();
            }
        }
        let s = String::from_utf8_lossy(&self.src[start..self.i]).into_owned();
        match s.as_str() {
            "true" => Tok::Bool(true),
            "false" => Tok::Bool(false),
            _ => Tok::Ident(s),
        }
    }

    fn string(&mut self, pos: Pos) -> Result<String, SyntaxError> {
        let triple = self.peek_at(1) == Some(b'"') && self.peek_at(2) == Some(b'"');
        let n = if triple { 3 } else { 1 };
        for _ in 0..n {
            self.bump();
        }
        // Fast path: a plain string without escapes is one slice.
        if !triple {
            let rest = &self.src[self.i..];
            if let Some(end) = rest.iter().position(|&c| c == b'"' || c == b'\\') {
                if rest[end] == b'"' {
                    let body = &rest[..end];
                    let text = std::str::from_utf8(body)
                        .map_err(|_| self.err(pos, "string is not valid UTF-8"))?
                        .to_string();
                    match body.iter().rposition(|&c| c == b'\n') {
                        Some(nl) => {
                            self.line += body.iter().filter(|&&c| c == b'\n').count() as u32;
                            self.col = (body.len() - nl) as u32;
                        }
                        None => self.col += body.len() as u32,
                    }
                    self.i += end;
                    self.bump();
                    return Ok(text);
                }
            }
        }
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(c) = self.bump() else {
                return Err(self.err(pos, "unterminated string"));
            };
            match c {
                b'"' if !triple => break,
                b'"' if self.peek() == Some(b'"') && self.peek_at(1) == Some(b'"') => {
                    self.bump();
                    self.bump();
                    break;
                }
                b'\\' => {
                    let epos = self.pos();
                    match self.bump() {
                        Some(b'\\') => out.push(b'\\'),
                        Some(b'"') => out.push(b'"'),
                        Some(b'\'') => out.push(b'\''),
                        Some(b'n') => out.push(b'\n'),
                        Some(b'r') => out.push(b'\r'),
                        Some(b't') => out.push(b'\t'),
                        Some(b'b') => out.push(8),
                        Some(b' ') => out.push(b' '),
                        Some(b'\n') => {
                            while matches!(self.peek(), Some(b' ' | b'\t')) {
                                self.bump();
                            }
                        }
                        Some(b'\r') if self.peek() == Some(b'\n') => {
                            self.bump();
                            while matches!(self.peek(), Some(b' ' | b'\t')) {
                                self.bump();
                            }
                        }
                        Some(d @ b'0'..=b'9') => {
                            let mut v = u32::from(d - b'0');
                            for _ in 0..2 {
                                match self.bump() {
                                    Some(d @ b'0'..=b'9') => v = v * 10 + u32::from(d - b'0'),
                                    _ => return Err(self.err(epos, "bad decimal escape")),
                                }
                            }
                            out.push(
                                u8::try_from(v)
                                    .map_err(|_| self.err(epos, "bad decimal escape"))?,
                            );
                        }
                        Some(b'x') => {
                            let mut v = 0u8;
                            for _ in 0..2 {
                                match self.bump().and_then(|h| (h as char).to_digit(16)) {
                                    Some(h) => v = v * 16 + h as u8,
                                    None => return Err(self.err(epos, "bad hex escape")),
                                }
                            }
                            out.push(v);
                        }
                        _ => return Err(self.err(epos, "bad escape in string")),
                    }
                }
                c => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| self.err(pos, "string is not valid UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        let mut l = Lexer::new(s);
        let mut v = Vec::new();
        loop {
            let (t, _) = l.next_token().expect("lexes");
            if t == Tok::Eof {
                return v;
            }
            v.push(t);
        }
    }

    #[test]
    fn lexes_depends_line() {
        assert_eq!(
            toks(r#"depends: ["ocaml" {>= "4.08" & with-test} (* c *) ocaml:version] # x"#),
            vec![
                Tok::Ident("depends".into()),
                Tok::Colon,
                Tok::LBracket,
                Tok::Str("ocaml".into()),
                Tok::LBrace,
                Tok::Relop(Relop::Geq),
                Tok::Str("4.08".into()),
                Tok::And,
                Tok::Ident("with-test".into()),
                Tok::RBrace,
                Tok::Ident("ocaml:version".into()),
                Tok::RBracket,
            ]
        );
    }

    #[test]
    fn positions_after_multiline_strings() {
        let mut l = Lexer::new("a: \"x\ny\nzz\" b\n\"p\\nq\" c");
        let mut last = Vec::new();
        loop {
            let (t, p) = l.next_token().expect("lexes");
            if t == Tok::Eof {
                break;
            }
            last.push((t, p.line, p.col));
        }
        assert_eq!(last[2], (Tok::Str("x\ny\nzz".into()), 1, 4));
        assert_eq!(last[3], (Tok::Ident("b".into()), 3, 5));
        assert_eq!(last[4], (Tok::Str("p\nq".into()), 4, 1));
        assert_eq!(last[5], (Tok::Ident("c".into()), 4, 8));
    }

    #[test]
    fn strings_and_ints() {
        assert_eq!(
            toks(r#""a\"b\n" """x"y""" -12"#),
            vec![
                Tok::Str("a\"b\n".into()),
                Tok::Str("x\"y".into()),
                Tok::Int(-12)
            ]
        );
    }
}
