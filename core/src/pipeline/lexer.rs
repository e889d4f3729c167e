//! A pipeline file's statements as words: comments dropped, `\` lines
//! joined, each character traced back to its line and column.
//!
//! The rules, which the parser and the checks share (the checks re-read a
//! statement from its span to point into it):
//!
//! - A line ending in `\` continues on the next: the `\` becomes one space
//!   and the next line's leading blanks are dropped. The next line is joined
//!   whatever it holds (a `#` line too). A line whose first non-blank
//!   character is `#` is a comment and never continues.
//! - Words are separated by spaces and tabs. Outside a command, `#` starts a
//!   comment that runs to the end of the (joined) line, in a word too.
//! - The command colon: in an `items` or `stage` statement, the first word
//!   that ends in `:` followed by a blank or the end of the line ends the
//!   header (`on scan:`, `out /x/{id}/:`, or a `:` standing alone). The
//!   command is everything after that `:`, blanks trimmed, `#` included:
//!   the shell reads it. A `:` inside a word (`ssh://h:22`, `host:/path`,
//!   `/a:b`) never starts a command.

use super::spec::Span;

/// The file's physical lines (a trailing `\r` dropped, a leading byte
/// order mark too).
pub struct Source<'a> {
    lines: Vec<&'a str>,
}

/// One statement's text after joining `\` lines, with the place each of its
/// characters came from.
#[derive(Debug, Clone)]
pub struct Logical {
    pub chars: Vec<char>,
    /// `pos[i]` is where `chars[i]` is in the file (a joining space: the
    /// `\` it replaced).
    pos: Vec<Span>,
    /// Just past the last character.
    end: Span,
    /// The `\` of a last line that has no next line to continue on.
    pub dangling: Option<Span>,
}

/// A word of a statement's header and the index of its first character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Word {
    pub text: String,
    pub at: usize,
}

/// The text after the command colon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// Index of the `:`.
    pub colon: usize,
    /// Index of the command's first character (the end of the line when it
    /// is empty).
    pub start: usize,
    /// Trimmed.
    pub text: String,
}

/// A statement cut into words, up to its comment or its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub words: Vec<Word>,
    pub command: Option<Command>,
    /// Index of the `#` that starts a comment.
    pub comment: Option<usize>,
}

fn blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn col(i: usize) -> u32 {
    u32::try_from(i + 1).unwrap_or(u32::MAX)
}

impl<'a> Source<'a> {
    pub fn new(text: &'a str) -> Source<'a> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let lines = text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .collect();
        Source { lines }
    }

    /// Line `line` (1-based) as written; empty past the end.
    pub fn line_text(&self, line: u32) -> &'a str {
        (line as usize)
            .checked_sub(1)
            .and_then(|i| self.lines.get(i))
            .copied()
            .unwrap_or("")
    }

    /// The statements in file order, blank and comment lines skipped.
    pub fn statements(&self) -> Statements<'_, 'a> {
        Statements { src: self, next: 0 }
    }

    /// The statement that starts at `span` (its keyword), read again.
    pub fn statement_at(&self, span: Span) -> Option<Logical> {
        let idx = (span.line as usize).checked_sub(1)?;
        let line = self.lines.get(idx)?;
        let skip = (span.col as usize).checked_sub(1)?;
        if skip >= line.chars().count() {
            return None;
        }
        Some(self.logical(idx, skip).0)
    }

    /// The statement that starts at character `skip` of line index `idx`,
    /// and the index of the line after it.
    fn logical(&self, mut idx: usize, mut skip: usize) -> (Logical, usize) {
        let mut chars = Vec::new();
        let mut pos = Vec::new();
        let mut first = true;
        loop {
            let line_no = u32::try_from(idx + 1).unwrap_or(u32::MAX);
            let cs: Vec<char> = self.lines[idx].chars().collect();
            let mut start = skip.min(cs.len());
            if !first {
                while start < cs.len() && blank(cs[start]) {
                    start += 1;
                }
            }
            let cont = cs.len() > start && cs.last() == Some(&'\\');
            let stop = if cont { cs.len() - 1 } else { cs.len() };
            for (k, &c) in cs.iter().enumerate().take(stop).skip(start) {
                chars.push(c);
                pos.push(Span {
                    line: line_no,
                    col: col(k),
                });
            }
            let end = Span {
                line: line_no,
                col: col(cs.len()),
            };
            if cont {
                let backslash = Span {
                    line: line_no,
                    col: col(cs.len() - 1),
                };
                chars.push(' ');
                pos.push(backslash);
                if idx + 1 < self.lines.len() {
                    idx += 1;
                    skip = 0;
                    first = false;
                    continue;
                }
                let l = Logical {
                    chars,
                    pos,
                    end,
                    dangling: Some(backslash),
                };
                return (l, idx + 1);
            }
            let l = Logical {
                chars,
                pos,
                end,
                dangling: None,
            };
            return (l, idx + 1);
        }
    }
}

/// Iterator over a file's statements.
pub struct Statements<'s, 'a> {
    src: &'s Source<'a>,
    next: usize,
}

impl Iterator for Statements<'_, '_> {
    type Item = Logical;

    fn next(&mut self) -> Option<Logical> {
        while self.next < self.src.lines.len() {
            let t = self.src.lines[self.next].trim_start_matches(blank);
            if t.is_empty() || t.starts_with('#') {
                self.next += 1;
                continue;
            }
            let (l, next) = self.src.logical(self.next, 0);
            self.next = next;
            return Some(l);
        }
        None
    }
}

impl Logical {
    /// Where character `i` is; past the end, just after the last one.
    pub fn pos(&self, i: usize) -> Span {
        self.pos.get(i).copied().unwrap_or(self.end)
    }

    /// Just past the end of word `w`.
    pub fn end_of(&self, w: &Word) -> Span {
        self.pos(w.at + w.text.chars().count())
    }

    /// Cuts the statement into words (see the module's rules).
    pub fn header(&self) -> Header {
        let c = &self.chars;
        let n = c.len();
        let mut words: Vec<Word> = Vec::new();
        let mut i = 0;
        loop {
            while i < n && blank(c[i]) {
                i += 1;
            }
            if i >= n {
                return Header {
                    words,
                    command: None,
                    comment: None,
                };
            }
            if c[i] == '#' {
                return Header {
                    words,
                    command: None,
                    comment: Some(i),
                };
            }
            let at = i;
            while i < n && !blank(c[i]) && c[i] != '#' {
                i += 1;
            }
            let mut text: String = c[at..i].iter().collect();
            let takes_command = words
                .first()
                .is_some_and(|w| w.text == "stage" || w.text == "items");
            if takes_command && text.ends_with(':') && (i >= n || blank(c[i])) {
                text.pop();
                if !text.is_empty() {
                    words.push(Word { text, at });
                }
                let colon = i - 1;
                let mut s = i;
                while s < n && blank(c[s]) {
                    s += 1;
                }
                let mut e = n;
                while e > s && blank(c[e - 1]) {
                    e -= 1;
                }
                let text = c[s..e].iter().collect();
                return Header {
                    words,
                    command: Some(Command {
                        colon,
                        start: s,
                        text,
                    }),
                    comment: None,
                };
            }
            words.push(Word { text, at });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(line: u32, col: u32) -> Span {
        Span { line, col }
    }

    #[test]
    fn continuation_keeps_each_character_where_it_was() {
        let src = Source::new("# c\n\nstage a \\\n    on h: x \\\n  y\n");
        let stmts: Vec<Logical> = src.statements().collect();
        assert_eq!(stmts.len(), 1);
        let l = &stmts[0];
        let text: String = l.chars.iter().collect();
        assert_eq!(text, "stage a  on h: x  y");
        let h = l.header();
        let words: Vec<(&str, Span)> = h.words.iter().map(|w| (&*w.text, l.pos(w.at))).collect();
        assert_eq!(
            words,
            vec![
                ("stage", sp(3, 1)),
                ("a", sp(3, 7)),
                ("on", sp(4, 5)),
                ("h", sp(4, 8)),
            ]
        );
        let cmd = h.command.unwrap();
        assert_eq!(cmd.text, "x  y");
        assert_eq!(l.pos(cmd.colon), sp(4, 9));
        assert_eq!(l.pos(cmd.start), sp(4, 11));
        assert_eq!(l.pos(cmd.start + 3), sp(5, 3));
    }

    #[test]
    fn comments_colons_and_dangling_backslashes() {
        let src =
            Source::new("host a = ssh://u@h:22 # x: y\r\nitems on a : ls # kept\nstage s on h \\");
        let stmts: Vec<Logical> = src.statements().collect();
        let h = stmts[0].header();
        assert_eq!(h.words.len(), 4);
        assert_eq!(h.words[3].text, "ssh://u@h:22");
        assert_eq!(h.comment, Some(22));
        assert!(h.command.is_none());
        let h = stmts[1].header();
        assert_eq!(h.words.len(), 3);
        assert_eq!(h.command.unwrap().text, "ls # kept");
        assert_eq!(stmts[2].dangling, Some(sp(3, 14)));
        assert!(stmts[2].header().command.is_none());
        // Re-reading from a keyword gives the same words.
        let again = src.statement_at(sp(2, 1)).unwrap();
        assert_eq!(again.header(), stmts[1].header());
        assert!(src.statement_at(sp(9, 1)).is_none());
        assert!(src.statement_at(sp(1, 99)).is_none());
    }
}
