//! The pipeline file's text into a [`PipelineSpec`], with every syntax
//! error found (a bad line is reported and skipped; the next is read).
//!
//! Grammar, one statement per line (see [`super::lexer`] for comments, `\`
//! continuations, words and the command colon):
//!
//! ```text
//! host NAME = agent AGENT
//! host NAME = agent labels K=V[,K=V...]
//! host NAME = ssh://[USER@]HOST[:PORT] key NAME [via AGENT]
//! items on HOST: COMMAND
//! stage NAME on HOST [jobs N] [out PATH] [consume] [retries N] [timeout D]: COMMAND
//! move NAME to HOST:PATH
//! limit N {
//! either {
//! |
//! }
//! ```
//!
//! - The header of `items` and `stage` ends at the first word ending in `:`
//!   that is followed by a blank or the end of the line (`on scan:`,
//!   `out /x/{id}/:`, a lone `:`); the rest of the line is the command. So
//!   an `out` path may hold `:` anywhere but at its end, and a command
//!   starts after `: ` (`on h:ls` is a host named `h:ls`, an error).
//! - Options come in any order, each at most once. `jobs` 1..=10000
//!   (default 1), `retries` 0..=100 (default 0), `timeout` a whole number
//!   with an optional unit `s`, `m`, `h` or `d`, 1 s to 7 days.
//! - In `move NAME to HOST:PATH` the first `:` splits host from path.
//! - `{`, `}` and `|`: `limit` and `either` open a block with a `{` ending
//!   their line; `}` alone on a line closes it; `|` alone on a line starts
//!   the next branch of an `either` (two or more, none empty).
//! - Names (hosts, stages, moves): `[A-Za-z_][A-Za-z0-9_-]*`, at most 64
//!   bytes; agent names as the server takes them: 1 to 64 of letters,
//!   digits, `-`, `_`, `.`. Keywords are lower case.
//! - Hosts may be declared anywhere (they are global), `items` once at the
//!   top level, at least one stage.
//! - Each statement's span is where its keyword is.
//!
//! This file reads lines, blocks and `items`; `parse/host.rs` reads host
//! declarations, `parse/step.rs` stage and move lines.

use std::collections::BTreeMap;

use super::error::{PipelineError, PipelineErrors};
use super::lexer::{Header, Logical, Source, Word};
use super::spec::{HostDecl, ItemsDecl, PipelineSpec, Span, Step};
use super::template::Template;
use crate::job::limits;

mod host;
mod step;

/// The largest file read: pipelines are a few dozen lines; this bounds the
/// work a submitted file can cause.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;
/// Statements (non-blank, non-comment lines after joining) in one file.
pub const MAX_STATEMENTS: usize = 10_000;
/// How deep `limit` and `either` blocks nest; the checks and the plan
/// recurse once per level.
pub const MAX_DEPTH: usize = 32;
/// Errors reported before giving up: past this the rest is noise.
pub const MAX_ERRORS: usize = 100;
/// A host, stage or move name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// An `out` or move path, in bytes: Linux's PATH_MAX.
pub const MAX_PATH_BYTES: usize = 4096;
pub const MAX_JOBS: u32 = 10_000;
/// Branches of one `either`: the engine asks each for room, for every
/// waiting item, on every pass.
pub const MAX_BRANCHES: usize = 64;
pub const MAX_RETRIES: u32 = 100;
pub const MAX_LIMIT: u32 = 1_000_000;

/// Parses `text`; `file` names it in errors. Names are not resolved here
/// (hosts may be declared after their use): see [`super::check`].
pub fn parse(file: &str, text: &str) -> Result<PipelineSpec, PipelineErrors> {
    let src = Source::new(text);
    let mut p = Parser {
        file,
        src: &src,
        errors: Vec::new(),
        hosts: BTreeMap::new(),
        items: None,
        items_seen: false,
        stage_seen: false,
        stopped: false,
        root: Vec::new(),
        stack: Vec::new(),
    };
    if text.len() > MAX_FILE_BYTES {
        p.error(
            Span { line: 1, col: 1 },
            format!(
                "the file is {} bytes; a pipeline file is at most {MAX_FILE_BYTES} bytes (1 MiB)",
                text.len()
            ),
        );
        return Err(PipelineErrors(p.errors));
    }
    p.run();
    p.finish()
}

/// A syntax error on the line being read: where and what.
struct Bad {
    at: Span,
    message: String,
}

type Line<T> = Result<T, Bad>;

fn bad<T>(at: Span, message: impl Into<String>) -> Line<T> {
    Err(Bad {
        at,
        message: message.into(),
    })
}

/// An open `{` block.
enum Frame {
    Limit {
        n: u32,
        span: Span,
        open: Span,
        steps: Vec<Step>,
        /// A statement was read in it (one with an error too: then it is
        /// not reported empty as well).
        filled: bool,
    },
    Either {
        span: Span,
        open: Span,
        branches: Vec<Vec<Step>>,
        /// A statement was read in the current branch.
        filled: bool,
    },
    /// A block whose opening line had an error: read to keep `{` and `}`
    /// paired, its steps dropped.
    Broken { open: Span, steps: Vec<Step> },
}

impl Frame {
    fn open(&self) -> Span {
        match self {
            Frame::Limit { open, .. } | Frame::Either { open, .. } | Frame::Broken { open, .. } => {
                *open
            }
        }
    }
}

struct Parser<'f, 's, 'a> {
    file: &'f str,
    src: &'s Source<'a>,
    errors: Vec<PipelineError>,
    hosts: BTreeMap<String, HostDecl>,
    items: Option<ItemsDecl>,
    items_seen: bool,
    stage_seen: bool,
    /// Reading stopped early (too many errors or statements).
    stopped: bool,
    root: Vec<Step>,
    stack: Vec<Frame>,
}

/// A name of a host, stage or move: `[A-Za-z_][A-Za-z0-9_-]*`, at most
/// [`MAX_NAME_BYTES`] (the characters a template's `{STAGE.out}` takes).
pub fn valid_name(s: &str) -> bool {
    s.len() <= MAX_NAME_BYTES
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn name_rule(what: &str, name: &str) -> String {
    let hint = if name.contains(':') {
        " (a command starts after a `:` followed by a space)"
    } else {
        ""
    };
    format!(
        "bad {what} name `{name}`: a name is a letter or `_`, then letters, digits, `_` or `-`, \
         at most {MAX_NAME_BYTES} bytes{hint}"
    )
}

const STATEMENTS: &str = "a statement is `host`, `items`, `stage`, `move`, `limit N {`, \
                          `either {`, `|` or `}`";

const OPTIONS: &str = "the options are `jobs N`, `out PATH`, `consume`, `retries N` and \
                       `timeout DURATION`";

impl Parser<'_, '_, '_> {
    fn error(&mut self, at: Span, message: String) {
        self.errors.push(PipelineError {
            file: self.file.to_string(),
            span: at,
            message,
            line_text: self.src.line_text(at.line).to_string(),
        });
    }

    fn run(&mut self) {
        let mut count = 0usize;
        for l in self.src.statements() {
            if self.errors.len() >= MAX_ERRORS {
                self.error(
                    l.pos(0),
                    format!("{MAX_ERRORS} errors already; fix those and read again"),
                );
                self.stopped = true;
                return;
            }
            count += 1;
            if count > MAX_STATEMENTS {
                self.error(
                    l.pos(0),
                    format!("more than {MAX_STATEMENTS} statements: split the pipeline"),
                );
                self.stopped = true;
                return;
            }
            let h = l.header();
            if h.words.is_empty() {
                // A statement starts with a character that is neither blank
                // nor `#`, so it has a first word.
                continue;
            }
            if !matches!(h.words[0].text.as_str(), "}" | "|") {
                if let Some(Frame::Limit { filled, .. } | Frame::Either { filled, .. }) =
                    self.stack.last_mut()
                {
                    *filled = true;
                }
            }
            if let Err(b) = self.statement(&l, &h) {
                self.error(b.at, b.message);
                // A line that meant to open a block (a `limit` or `either`
                // line, or any with a `{` word) still opens one, so that its
                // `}` is not reported as stray.
                let opens = matches!(h.words[0].text.as_str(), "limit" | "either")
                    || h.words.iter().any(|w| w.text == "{");
                if opens {
                    self.stack.push(Frame::Broken {
                        open: b.at,
                        steps: Vec::new(),
                    });
                }
            }
            if let Some(d) = l.dangling {
                self.error(
                    d,
                    "the last line ends in `\\` but no line follows it: remove the `\\`".into(),
                );
            }
        }
    }

    fn finish(mut self) -> Result<PipelineSpec, PipelineErrors> {
        if self.stopped {
            // What was not read may hold the `}`, `items` or stage missed.
            self.stack.clear();
            self.items_seen = true;
            self.stage_seen = true;
        }
        while let Some(f) = self.stack.pop() {
            if matches!(f, Frame::Broken { .. }) {
                // Its line is reported already; a missing `}` may be why.
                continue;
            }
            self.error(
                f.open(),
                "this `{` is never closed: add a line holding only `}`".into(),
            );
        }
        let at = Span { line: 1, col: 1 };
        if !self.items_seen {
            self.error(
                at,
                "the file has no `items` line: add one, e.g. `items on HOST: ls /data`".into(),
            );
        }
        if !self.stage_seen {
            self.error(
                at,
                "the file has no `stage`: add one, e.g. `stage NAME on HOST: COMMAND {id}`".into(),
            );
        }
        match self.items {
            Some(items) if self.errors.is_empty() => Ok(PipelineSpec {
                hosts: self.hosts,
                items,
                steps: self.root,
            }),
            _ => {
                self.errors.sort_by_key(|e| e.span);
                Err(PipelineErrors(self.errors))
            }
        }
    }

    fn steps(&mut self) -> &mut Vec<Step> {
        match self.stack.last_mut() {
            None => &mut self.root,
            Some(Frame::Limit { steps, .. } | Frame::Broken { steps, .. }) => steps,
            Some(Frame::Either { branches, .. }) => branches
                .last_mut()
                .expect("an either frame always has a branch it is reading"),
        }
    }

    fn statement(&mut self, l: &Logical, h: &Header) -> Line<()> {
        let w = &h.words;
        let kw = &w[0];
        let span = l.pos(kw.at);
        self.items_seen |= kw.text == "items";
        self.stage_seen |= kw.text == "stage";
        if let Some(i) = l.chars[..h.comment.unwrap_or(l.chars.len())]
            .iter()
            .position(|c| c.is_control() && *c != '\t')
        {
            return bad(
                l.pos(i),
                format!(
                    "control character U+{:04X} in the file: only printable text and tabs are read",
                    l.chars[i] as u32
                ),
            );
        }
        match kw.text.as_str() {
            "host" => {
                let decl = host::host(l, w, span)?;
                if let Some(first) = self.hosts.get(&decl.name) {
                    return bad(
                        l.pos(w[1].at),
                        format!(
                            "host `{}` is declared twice (first at line {}): give this one \
                             another name",
                            decl.name, first.span.line
                        ),
                    );
                }
                self.hosts.insert(decl.name.clone(), decl);
                Ok(())
            }
            "items" => self.items(l, h, span),
            "stage" => {
                let s = step::stage(l, h, span)?;
                self.steps().push(Step::Stage(s));
                Ok(())
            }
            "move" => {
                let m = step::mv(l, w, span)?;
                self.steps().push(Step::Move(m));
                Ok(())
            }
            "limit" => {
                let open = block_open(l, w, 3, "limit N {")?;
                let n = number(l, w.get(1), kw, "`limit`", 1, MAX_LIMIT)?;
                self.open(
                    open,
                    Frame::Limit {
                        n,
                        span,
                        open,
                        steps: Vec::new(),
                        filled: false,
                    },
                )
            }
            "either" => {
                let open = block_open(l, w, 2, "either {")?;
                self.open(
                    open,
                    Frame::Either {
                        span,
                        open,
                        branches: vec![Vec::new()],
                        filled: false,
                    },
                )
            }
            "}" => self.close(l, w, span),
            "|" => self.bar(l, w, span),
            other => {
                let lower = other.to_ascii_lowercase();
                let known = ["host", "items", "stage", "move", "limit", "either"];
                if known.contains(&lower.as_str()) {
                    bad(
                        span,
                        format!(
                            "unknown statement `{other}`: keywords are lower case, write `{lower}`"
                        ),
                    )
                } else if other.starts_with('{') || other.starts_with('}') || other.starts_with('|')
                {
                    bad(
                        span,
                        format!("unexpected `{other}`: `{{` ends a `limit` or `either` line; `}}` and `|` stand alone on their line"),
                    )
                } else {
                    bad(span, format!("unknown statement `{other}`: {STATEMENTS}"))
                }
            }
        }
    }

    fn open(&mut self, open: Span, frame: Frame) -> Line<()> {
        if self.stack.len() >= MAX_DEPTH {
            return bad(
                open,
                format!("blocks nest at most {MAX_DEPTH} deep: flatten this pipeline"),
            );
        }
        self.stack.push(frame);
        Ok(())
    }

    fn close(&mut self, l: &Logical, w: &[Word], span: Span) -> Line<()> {
        let Some(frame) = self.stack.pop() else {
            return bad(span, "stray `}`: no `limit` or `either` block is open here");
        };
        let step = match frame {
            Frame::Limit {
                n,
                span: ls,
                steps,
                filled,
                ..
            } => {
                if !filled {
                    self.error(ls, "this `limit` block holds no steps: put stages or moves in it, or remove it".into());
                }
                Some(Step::Limit { n, steps, span: ls })
            }
            Frame::Either {
                span: es,
                branches,
                filled,
                ..
            } => {
                if !filled {
                    self.error(
                        span,
                        "empty branch: each branch of an `either` needs at least one step".into(),
                    );
                }
                if branches.len() < 2 {
                    self.error(
                        es,
                        "this `either` has one branch: separate two or more branches with a line holding only `|`".into(),
                    );
                }
                Some(Step::Either { branches, span: es })
            }
            Frame::Broken { .. } => None,
        };
        if let Some(s) = step {
            self.steps().push(s);
        }
        if let Some(extra) = w.get(1) {
            return bad(
                l.pos(extra.at),
                "`}` stands alone on its line: move what follows to the next line",
            );
        }
        Ok(())
    }

    fn bar(&mut self, l: &Logical, w: &[Word], span: Span) -> Line<()> {
        match self.stack.last_mut() {
            Some(Frame::Either {
                branches, filled, ..
            }) => {
                let empty = !*filled;
                if branches.len() == MAX_BRANCHES {
                    return bad(
                        span,
                        format!(
                            "more than {MAX_BRANCHES} branches in one `either`: split the \
                             choice over fewer, or over hosts with `agent labels`"
                        ),
                    );
                }
                branches.push(Vec::new());
                *filled = false;
                if empty {
                    return bad(
                        span,
                        "empty branch: each branch of an `either` needs at least one step",
                    );
                }
            }
            Some(Frame::Broken { .. }) => {}
            _ => return bad(
                span,
                "stray `|`: a line holding only `|` separates the branches of an `either { … }`",
            ),
        }
        if let Some(extra) = w.get(1) {
            return bad(
                l.pos(extra.at),
                "`|` stands alone on its line: move what follows to the next line",
            );
        }
        Ok(())
    }

    fn items(&mut self, l: &Logical, h: &Header, span: Span) -> Line<()> {
        let w = &h.words;
        let usage = "write `items on HOST: COMMAND`";
        if self
            .stack
            .iter()
            .any(|f| !matches!(f, Frame::Broken { .. }))
        {
            return bad(
                span,
                "`items` belongs at the top level, not inside a `limit` or `either` block",
            );
        }
        match w.get(1) {
            Some(on) if on.text == "on" => {}
            Some(other) => {
                return bad(
                    l.pos(other.at),
                    format!("expected `on` after `items`: {usage}"),
                )
            }
            None => return bad(l.end_of(&w[0]), format!("`items` needs `on HOST`: {usage}")),
        }
        let Some(host) = w.get(2) else {
            return bad(l.end_of(&w[1]), format!("`items on` needs a host: {usage}"));
        };
        if !valid_name(&host.text) {
            return bad(l.pos(host.at), name_rule("host", &host.text));
        }
        if let Some(extra) = w.get(3) {
            let hint = if h.command.is_none() {
                "; if this is the command, put `: ` before it"
            } else {
                ""
            };
            return bad(
                l.pos(extra.at),
                format!("unexpected `{}` after the host{hint}: {usage}", extra.text),
            );
        }
        let command = command_text(l, h, "the items command")?;
        if let Some(first) = &self.items {
            return bad(
                span,
                format!(
                    "a second `items` line (the first is at line {}): a pipeline lists its items once",
                    first.span.line
                ),
            );
        }
        self.items = Some(ItemsDecl {
            host: host.text.clone(),
            command,
            span,
        });
        Ok(())
    }
}

/// The `{` that must end a block line of `len` words.
fn block_open(l: &Logical, w: &[Word], len: usize, usage: &str) -> Line<Span> {
    match w.iter().position(|x| x.text == "{") {
        Some(i) if i + 1 < w.len() => bad(
            l.pos(w[i + 1].at),
            format!(
                "unexpected `{}` after `{{`: put the steps on the lines after it",
                w[i + 1].text
            ),
        ),
        Some(i) if w.len() == len => Ok(l.pos(w[i].at)),
        Some(_) if w.len() > len => bad(
            l.pos(w[len - 1].at),
            format!("unexpected `{}`: write `{usage}`", w[len - 1].text),
        ),
        Some(i) => bad(
            l.pos(w[i].at),
            format!("something is missing before `{{`: write `{usage}`"),
        ),
        None => {
            if let Some(x) = w
                .iter()
                .find(|x| x.text.starts_with('{') || x.text.ends_with('{'))
            {
                bad(
                    l.pos(x.at),
                    format!("the `{{` is a word of its own: write `{usage}`"),
                )
            } else {
                bad(
                    l.end_of(&w[w.len() - 1]),
                    format!(
                        "missing `{{`: write `{usage}`, the steps on the lines after it, then `}}`"
                    ),
                )
            }
        }
    }
}

/// A whole number in `lo..=hi`, the word after `key`.
fn number(l: &Logical, w: Option<&Word>, key: &Word, what: &str, lo: u32, hi: u32) -> Line<u32> {
    let Some(w) = w else {
        return bad(
            l.end_of(key),
            format!("{what} needs a number from {lo} to {hi}"),
        );
    };
    let n = w
        .text
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| w.text.parse::<u64>().ok())
        .flatten();
    match n {
        Some(n) if (lo as u64..=hi as u64).contains(&n) => Ok(n as u32),
        _ => bad(
            l.pos(w.at),
            format!(
                "bad number `{}` for {what}: a whole number from {lo} to {hi}",
                w.text
            ),
        ),
    }
}

/// The command after the colon: there, not empty, within the limit.
fn command_text(l: &Logical, h: &Header, what: &str) -> Line<String> {
    let Some(c) = &h.command else {
        let last = h.words.last().expect("a statement has its keyword");
        return bad(
            l.end_of(last),
            format!("{what} is missing: end the line with `: COMMAND` (a `:`, a space, then the command)"),
        );
    };
    if c.text.is_empty() {
        return bad(
            l.pos(c.colon),
            format!("{what} is empty: put the command after the `:`"),
        );
    }
    if c.text.len() > limits::MAX_COMMAND_BYTES {
        return bad(
            l.pos(c.start),
            format!(
                "{what} is {} bytes; at most {} are allowed",
                c.text.len(),
                limits::MAX_COMMAND_BYTES
            ),
        );
    }
    Ok(c.text.clone())
}

/// A template whose first character is at index `at` of the statement.
fn template(l: &Logical, text: &str, at: usize) -> Line<Template> {
    Template::parse(text).map_err(|e| Bad {
        at: l.pos(at + e.offset as usize),
        message: e.message,
    })
}

fn path(l: &Logical, text: &str, at: usize, what: &str) -> Line<Template> {
    if text.len() > MAX_PATH_BYTES {
        return bad(
            l.pos(at),
            format!(
                "{what} is {} bytes; at most {MAX_PATH_BYTES} are allowed",
                text.len()
            ),
        );
    }
    template(l, text, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn errs(text: &str) -> Vec<(u32, u32, String)> {
        match parse("t.pipeline", text) {
            Ok(_) => Vec::new(),
            Err(e) => {
                e.0.into_iter()
                    .map(|e| (e.span.line, e.span.col, e.message))
                    .collect()
            }
        }
    }

    /// The one error of `text`, at `line:col`, whose message holds `needle`.
    #[track_caller]
    pub(super) fn one(text: &str, line: u32, col: u32, needle: &str) {
        let e = errs(text);
        assert_eq!(e.len(), 1, "{e:#?}");
        assert_eq!((e[0].0, e[0].1), (line, col), "{e:#?}");
        assert!(e[0].2.contains(needle), "{:?} lacks {needle:?}", e[0].2);
    }

    pub(super) const HEAD: &str = "host h = agent a1\nitems on h: ls\n";

    #[test]
    fn a_small_file_parses() {
        let spec = parse(
            "t",
            "host h = agent a1\nitems on h: ls\nstage s on h: echo {id}\n",
        )
        .unwrap();
        assert_eq!(spec.items.command, "ls");
        assert_eq!(spec.steps.len(), 1);
        let Step::Stage(s) = &spec.steps[0] else {
            panic!()
        };
        assert_eq!(
            (s.jobs, s.retries, s.consume, s.timeout_s),
            (1, 0, false, None)
        );
        assert_eq!(s.span, Span { line: 3, col: 1 });
    }

    /// An `either` of B branches before another of B made B x B plan
    /// entries (review of 3877596, F5): at most 64 branches now, and the
    /// plan shares what follows a block (plan.rs checks the sharing).
    #[test]
    fn an_either_has_at_most_64_branches() {
        let either = |n: usize, tag: &str| {
            let branches: Vec<String> = (0..n)
                .map(|i| format!("stage {tag}{i} on h: x\n"))
                .collect();
            format!("either {{\n{}}}\n", branches.join("|\n"))
        };
        let fine = format!(
            "{HEAD}{}{}",
            either(MAX_BRANCHES, "a"),
            either(MAX_BRANCHES, "b")
        );
        parse("t", &fine).unwrap();
        // The 65th branch's `|`: line 3 opens the block, each branch is a
        // stage and a `|`.
        one(
            &format!("{HEAD}{}", either(MAX_BRANCHES + 1, "a")),
            3 + 2 * MAX_BRANCHES as u32,
            1,
            "more than 64 branches",
        );
    }

    #[test]
    fn unknown_statements_and_blocks() {
        one(
            &format!("{HEAD}stag s on h: x\nstage s on h: x\n"),
            3,
            1,
            "unknown statement `stag`",
        );
        one(
            &format!("{HEAD}Stage s on h: x\nstage s on h: x\n"),
            3,
            1,
            "lower case",
        );
        // An unclosed `{` points at the `{`.
        one(
            &format!("{HEAD}limit 2 {{\nstage s on h: x\n"),
            3,
            9,
            "never closed",
        );
        one(&format!("{HEAD}stage s on h: x\n}}\n"), 4, 1, "stray `}`");
        one(&format!("{HEAD}stage s on h: x\n|\n"), 4, 1, "stray `|`");
        one(
            &format!("{HEAD}limit 2\nstage s on h: x\n}}\n"),
            3,
            8,
            "missing `{`",
        );
        one(
            &format!("{HEAD}limit 2{{\nstage s on h: x\n}}\n"),
            3,
            7,
            "a word of its own",
        );
        one(
            &format!("{HEAD}either {{\nstage s on h: x\n}}\n"),
            3,
            1,
            "one branch",
        );
        one(
            &format!("{HEAD}either {{\nstage s on h: x\n|\n}}\n"),
            6,
            1,
            "empty branch",
        );
        one(
            &format!("{HEAD}either {{\n|\nstage s on h: x\n}}\n"),
            4,
            1,
            "empty branch",
        );
        one(
            &format!("{HEAD}stage t on h: x\nlimit 2 {{\n}}\n"),
            4,
            1,
            "holds no steps",
        );
        one(
            &format!("{HEAD}limit 2 {{ stage s on h: x\n}}\nstage t on h: y\n"),
            3,
            11,
            "unexpected `stage`",
        );
        // A broken block line still pairs with its `}`.
        one(
            &format!("{HEAD}limit -1 {{\nstage s on h: x\n}}\nstage t on h: y\n"),
            3,
            7,
            "bad number",
        );
    }

    #[test]
    fn hosts_and_items() {
        let t = "host h = agent a1\nhost h = agent a2\nitems on h: ls\nstage s on h: x\n";
        one(t, 2, 6, "declared twice (first at line 1)");
        one(
            "host h = agent a1\nitems on h: ls\nitems on h: ls\nstage s on h: x\n",
            3,
            1,
            "a second `items`",
        );
        one("host h = agent a1\nstage s on h: x\n", 1, 1, "no `items`");
        one(HEAD, 1, 1, "no `stage`");
        one(
            &format!("{HEAD}limit 2 {{\nitems on h: ls\nstage s on h: x\n}}\n"),
            4,
            1,
            "top level",
        );
    }

    #[test]
    fn limits_hold() {
        let deep = format!(
            "{HEAD}{}stage s on h: x\n{}",
            "limit 2 {\n".repeat(33),
            "}\n".repeat(33)
        );
        one(&deep, 35, 9, "nest at most 32");
        let many = format!("{HEAD}{}", "stage s on h: x\n".repeat(MAX_STATEMENTS));
        one(
            &many,
            MAX_STATEMENTS as u32 + 1,
            1,
            "more than 10000 statements",
        );
        let big = format!(
            "{HEAD}stage s on h: {}\n",
            "x".repeat(limits::MAX_COMMAND_BYTES + 1)
        );
        one(&big, 3, 15, "at most 65536");
        let huge = "#".repeat(MAX_FILE_BYTES + 1);
        one(&huge, 1, 1, "at most 1048576 bytes");
        let noisy = "nope\n".repeat(500);
        let e = errs(&noisy);
        assert_eq!(e.len(), MAX_ERRORS + 1);
        one(&format!("{HEAD}stage s on h: a\u{0}b\n"), 3, 16, "U+0000");
        one(
            &format!("{HEAD}stage s on h: x \\"),
            3,
            17,
            "no line follows",
        );
    }
}
