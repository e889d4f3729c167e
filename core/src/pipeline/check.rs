//! What a parsed pipeline must satisfy before any host is contacted: hosts
//! declared, names unique, every template field has a value where it is
//! used and lives on the host that reads it, every move and `consume` has
//! an output to act on.
//!
//! The checks walk the steps in file order with the item's state: its
//! latest output (the `{in}` of the next step) and which stage outputs were
//! moved away or deleted. An `either` is walked once per branch from the
//! same state; after it, the latest output is any of the branches' last
//! ones, so a step that reads `{in}` must agree with all of them.
//!
//! Errors point into the statement: the checks read it again from its span
//! (see [`super::lexer`]) to find the column of a host, an option or a
//! field inside a command.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;

use super::error::{PipelineError, PipelineErrors};
use super::lexer::{Header, Logical, Source, Word};
use super::parse::MAX_ERRORS;
use super::spec::{Move, PipelineSpec, Span, Stage, Step};
use super::template::{Field, Template};

/// Checks `spec`, parsed from `text` (named `file` in errors).
pub fn check(file: &str, text: &str, spec: &PipelineSpec) -> Result<(), PipelineErrors> {
    let mut c = Checker {
        file,
        src: Source::new(text),
        spec,
        errors: Vec::new(),
        stages: HashMap::new(),
        moves: HashSet::new(),
        order: 0,
        cache: None,
    };
    c.items();
    let mut names = HashMap::new();
    c.index(&spec.steps, &mut Vec::new(), &mut names);
    c.order = 0;
    let mut st = State {
        latest: Rc::new(BTreeSet::from([Latest::Nothing])),
        gone: BTreeMap::new(),
        added: Vec::new(),
    };
    c.walk(&spec.steps, &mut st, &mut Vec::new());
    if c.errors.is_empty() {
        return Ok(());
    }
    c.errors.sort_by_key(|e| e.span);
    Err(PipelineErrors(c.errors))
}

/// The item's latest output on one way through the earlier `either`s.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Latest<'a> {
    /// No step before made one.
    Nothing,
    /// Step `by` (a stage with `out`, or a move) left it on `host`, at
    /// `path` (its template's text).
    Out {
        by: &'a str,
        host: &'a str,
        path: &'a str,
        line: u32,
    },
    /// Stage `by` deleted it with `consume` and made none.
    Consumed { by: &'a str, line: u32 },
}

/// The item's state along the walk. An `either`'s branches each start
/// from the state before it without copying it (a wide `either` after many
/// steps would make that quadratic): `latest` is shared, and what a branch
/// adds to `gone` is logged in `added` and taken back after it.
#[derive(Debug)]
struct State<'a> {
    /// One entry per distinct way through the `either`s so far.
    latest: Rc<BTreeSet<Latest<'a>>>,
    /// Stage outputs no longer where `{STAGE.out}` says, and why.
    gone: BTreeMap<&'a str, String>,
    /// The keys of `gone`, in the order they were added.
    added: Vec<&'a str>,
}

fn only<'a>(l: Latest<'a>) -> Rc<BTreeSet<Latest<'a>>> {
    Rc::new(BTreeSet::from([l]))
}

/// Whether two path templates name one place: their text with `//` as `/`
/// and no trailing `/` (a directory `out` ends in one).
fn same_path(a: &str, b: &str) -> bool {
    fn plain(p: &str) -> String {
        let mut s = String::with_capacity(p.len());
        for c in p.chars() {
            if !(c == '/' && s.ends_with('/')) {
                s.push(c);
            }
        }
        if s.len() > 1 {
            s.truncate(s.trim_end_matches('/').len().max(1));
        }
        s
    }
    plain(a) == plain(b)
}

/// The either branches a step is inside, outermost first: the `either`'s
/// span and the branch's index.
type Chain = Vec<(Span, usize)>;

struct StageInfo<'a> {
    stage: &'a Stage,
    order: usize,
    chain: Chain,
}

/// A place inside a statement, found by reading it again.
#[derive(Debug, Clone, Copy)]
struct Loc {
    /// The statement's span (its keyword).
    span: Span,
    keyword: &'static str,
    piece: Piece,
}

#[derive(Debug, Clone, Copy)]
enum Piece {
    Keyword,
    /// The statement's n-th word.
    Word(usize),
    /// A stage option's keyword.
    Option(&'static str),
    /// A character of a stage option's value.
    OptionValue(&'static str, u32),
    /// A character of the command.
    Command(u32),
    /// The host of `move X to HOST:PATH`.
    MoveHost,
    /// A character of its path.
    MovePath(u32),
}

fn stage_loc(s: &Stage, piece: Piece) -> Loc {
    Loc {
        span: s.span,
        keyword: "stage",
        piece,
    }
}

fn move_loc(m: &Move, piece: Piece) -> Loc {
    Loc {
        span: m.span,
        keyword: "move",
        piece,
    }
}

/// The index of a stage option's keyword among the stage's words.
fn option_index(w: &[Word], name: &str) -> Option<usize> {
    let mut i = 4;
    while i < w.len() {
        if w[i].text == name {
            return Some(i);
        }
        i += if w[i].text == "consume" { 1 } else { 2 };
    }
    None
}

struct Checker<'a> {
    file: &'a str,
    src: Source<'a>,
    spec: &'a PipelineSpec,
    errors: Vec<PipelineError>,
    /// The first stage of each name.
    stages: HashMap<&'a str, StageInfo<'a>>,
    moves: HashSet<&'a str>,
    /// The next stage or move's place in file order.
    order: usize,
    /// The statement read last, for the next error on it.
    cache: Option<(Span, Logical, Header)>,
}

impl<'a> Checker<'a> {
    fn error(&mut self, loc: Loc, message: String) {
        if self.errors.len() >= MAX_ERRORS {
            return;
        }
        let span = self.resolve(loc).unwrap_or(loc.span);
        self.errors.push(PipelineError {
            file: self.file.to_string(),
            span,
            message,
            line_text: self.src.line_text(span.line).to_string(),
        });
    }

    fn resolve(&mut self, loc: Loc) -> Option<Span> {
        if self.cache.as_ref().is_none_or(|(s, _, _)| *s != loc.span) {
            let l = self.src.statement_at(loc.span)?;
            let h = l.header();
            self.cache = Some((loc.span, l, h));
        }
        let (_, l, h) = self.cache.as_ref()?;
        let w = &h.words;
        if w.first()?.text != loc.keyword {
            return None;
        }
        Some(match loc.piece {
            Piece::Keyword => l.pos(w[0].at),
            Piece::Word(i) => l.pos(w.get(i)?.at),
            Piece::Option(name) => l.pos(w[option_index(w, name)?].at),
            Piece::OptionValue(name, off) => {
                let v = w.get(option_index(w, name)? + 1)?;
                l.pos(v.at + off as usize)
            }
            Piece::Command(off) => l.pos(h.command.as_ref()?.start + off as usize),
            Piece::MoveHost => l.pos(w.get(3)?.at),
            Piece::MovePath(off) => {
                let d = w.get(3)?;
                let (host, _) = d.text.split_once(':')?;
                l.pos(d.at + host.chars().count() + 1 + off as usize)
            }
        })
    }

    fn host(&mut self, name: &str, loc: Loc) {
        if !self.spec.hosts.contains_key(name) {
            self.error(
                loc,
                format!(
                    "unknown host `{name}`: declare it with `host {name} = agent NAME` or \
                     `host {name} = ssh://user@host key NAME`"
                ),
            );
        }
    }

    /// The items line: its host, and no fields (its command is run as
    /// written, before there are items).
    fn items(&mut self) {
        let items = &self.spec.items;
        let loc = |piece| Loc {
            span: items.span,
            keyword: "items",
            piece,
        };
        self.host(&items.host, loc(Piece::Word(2)));
        if let Ok(t) = Template::parse(&items.command) {
            for (f, off) in t.fields() {
                self.error(
                    loc(Piece::Command(off)),
                    format!(
                        "`{f}` in the items command: it is plain shell text, run before there are \
                         items, so no field has a value there"
                    ),
                );
            }
        }
    }

    /// Numbers the stages and moves in file order, records where each
    /// stage is, and checks names.
    fn index(
        &mut self,
        steps: &'a [Step],
        chain: &mut Chain,
        names: &mut HashMap<&'a str, (&'static str, u32)>,
    ) {
        for step in steps {
            match step {
                Step::Stage(s) => {
                    self.name(&s.name, "stage", s.span, names);
                    self.stages.entry(&s.name).or_insert(StageInfo {
                        stage: s,
                        order: self.order,
                        chain: chain.clone(),
                    });
                    self.order += 1;
                }
                Step::Move(m) => {
                    self.name(&m.name, "move", m.span, names);
                    self.moves.insert(&m.name);
                    self.order += 1;
                }
                Step::Limit { steps, .. } => self.index(steps, chain, names),
                Step::Either { branches, span } => {
                    for (k, b) in branches.iter().enumerate() {
                        chain.push((*span, k));
                        self.index(b, chain, names);
                        chain.pop();
                    }
                }
            }
        }
    }

    fn name(
        &mut self,
        name: &'a str,
        kind: &'static str,
        span: Span,
        names: &mut HashMap<&'a str, (&'static str, u32)>,
    ) {
        let loc = Loc {
            span,
            keyword: kind,
            piece: Piece::Word(1),
        };
        if name == "items" {
            self.error(
                loc,
                format!(
                    "a {kind} cannot be named `items`: that name is the items list's (the first \
                     column of every item's progress); pick another"
                ),
            );
        } else if let Some((k, line)) = names.get(name) {
            let msg = format!(
                "{kind} name `{name}` is used twice (first by the {k} at line {line}): stage and \
                 move names are unique in a file, across `either` branches too"
            );
            self.error(loc, msg);
        } else {
            names.insert(name, (kind, span.line));
        }
    }

    fn walk(&mut self, steps: &'a [Step], st: &mut State<'a>, chain: &mut Chain) {
        for step in steps {
            match step {
                Step::Stage(s) => {
                    let order = self.order;
                    self.order += 1;
                    self.stage(s, st, chain, order);
                    if s.consume {
                        self.remove(
                            st,
                            format!(
                                "stage `{}` (line {}) deletes it with `consume`",
                                s.name, s.span.line
                            ),
                        );
                    }
                    if s.out.is_some() {
                        st.latest = only(Latest::Out {
                            by: &s.name,
                            host: &s.host,
                            path: s.out.as_ref().map_or("", |t| t.text.as_str()),
                            line: s.span.line,
                        });
                    } else if s.consume {
                        st.latest = only(Latest::Consumed {
                            by: &s.name,
                            line: s.span.line,
                        });
                    }
                }
                Step::Move(m) => {
                    let order = self.order;
                    self.order += 1;
                    self.mv(m, st, chain, order);
                    self.remove(
                        st,
                        format!(
                            "move `{}` (line {}) moves it to host `{}`",
                            m.name, m.span.line, m.host
                        ),
                    );
                    st.latest = only(Latest::Out {
                        by: &m.name,
                        host: &m.host,
                        path: &m.path.text,
                        line: m.span.line,
                    });
                }
                Step::Limit { steps, .. } => self.walk(steps, st, chain),
                Step::Either { branches, span } => {
                    let before = Rc::clone(&st.latest);
                    let mark = st.added.len();
                    let mut latest = BTreeSet::new();
                    let mut unchanged = false;
                    let mut gone = Vec::new();
                    for (k, b) in branches.iter().enumerate() {
                        st.latest = Rc::clone(&before);
                        chain.push((*span, k));
                        self.walk(b, st, chain);
                        chain.pop();
                        if Rc::ptr_eq(&st.latest, &before) {
                            unchanged = true;
                        } else {
                            latest.extend(st.latest.iter().cloned());
                        }
                        for key in st.added.drain(mark..) {
                            if let Some(why) = st.gone.remove(key) {
                                gone.push((key, why));
                            }
                        }
                    }
                    if unchanged {
                        latest.extend(before.iter().cloned());
                    }
                    st.latest = Rc::new(latest);
                    for (key, why) in gone {
                        if !st.gone.contains_key(key) {
                            st.gone.insert(key, why);
                            st.added.push(key);
                        }
                    }
                }
            }
        }
    }

    /// The latest output is moved or deleted: stages that made it no
    /// longer have it.
    fn remove(&self, st: &mut State<'a>, why: String) {
        for l in st.latest.iter() {
            if let Latest::Out { by, .. } = l {
                if !st.gone.contains_key(by) {
                    st.gone.insert(by, why.clone());
                    st.added.push(by);
                }
            }
        }
    }

    /// Whether hosts `a` and `b` are one machine as far as the file says:
    /// the same agent by name, or the same ssh user, host and port.
    /// (Label sets, and file systems shared between machines, cannot be
    /// told from the file.)
    fn same_place(&self, a: &str, b: &str) -> bool {
        use super::spec::HostTarget;
        let (Some(a), Some(b)) = (self.spec.hosts.get(a), self.spec.hosts.get(b)) else {
            return false;
        };
        match (&a.target, &b.target) {
            (HostTarget::Agent { name: x }, HostTarget::Agent { name: y }) => x == y,
            (HostTarget::Ssh(x), HostTarget::Ssh(y)) => {
                x.user == y.user && x.host == y.host && x.port.unwrap_or(22) == y.port.unwrap_or(22)
            }
            _ => false,
        }
    }

    fn stage(&mut self, s: &'a Stage, st: &State<'a>, chain: &Chain, order: usize) {
        self.host(&s.host, stage_loc(s, Piece::Word(3)));
        let user = format!("stage `{}`", s.name);
        for (f, off) in s.command.fields() {
            let loc = stage_loc(s, Piece::Command(off));
            match f {
                Field::Id => {}
                Field::Out if s.out.is_none() => self.error(
                    loc,
                    format!(
                        "`{{out}}` in stage `{}`, which declares no `out`: add `out PATH` before \
                         the `:` (e.g. `out /scratch/{}/{{id}}`)",
                        s.name, s.name
                    ),
                ),
                Field::Out => {}
                Field::In => self.input(st, loc, &user, Some(&s.host)),
                Field::StageOut(n) => {
                    self.stage_out(n, loc, &user, order, chain, st, Some(&s.host))
                }
            }
        }
        if let Some(out) = &s.out {
            let what = format!("the `out` path of stage `{}`", s.name);
            let at = |off| stage_loc(s, Piece::OptionValue("out", off));
            self.path(out, &what, at, st, chain, order);
            self.absolute_on_agents(out, &s.host, &what, at(0));
        }
        if s.consume {
            let loc = stage_loc(s, Piece::Option("consume"));
            if st.latest.contains(&Latest::Nothing) {
                let msg = if st.latest.len() == 1 {
                    let why = if order == 0 {
                        "it is the first step"
                    } else {
                        "no step before it produces an output"
                    };
                    format!(
                        "`consume` in stage `{}` has nothing to delete: {why} (`consume` deletes \
                         `{{in}}`, the previous step's output); remove `consume`",
                        s.name
                    )
                } else {
                    format!(
                        "`consume` in stage `{}` has nothing to delete for items that took a \
                         branch without an output: give every branch of the `either` before it a \
                         stage with `out`, or remove `consume`",
                        s.name
                    )
                };
                return self.error(loc, msg);
            }
            let mut msgs = Vec::new();
            for l in st.latest.iter() {
                match l {
                    Latest::Consumed { by, line } => msgs.push(format!(
                        "`consume` in stage `{}` has nothing to delete: stage `{by}` (line {line}) \
                         deleted the previous output already; remove one `consume`",
                        s.name
                    )),
                    Latest::Out { by, host, .. } if *host != s.host => msgs.push(format!(
                        "`consume` in stage `{}` would delete `{{in}}` on host `{host}` (the \
                         output of `{by}`), but the stage runs on `{}`: `move` the output to \
                         `{}` first, or remove `consume`",
                        s.name, s.host, s.host
                    )),
                    // Its own output would be what it deletes.
                    Latest::Out { by, path, .. }
                        if s.out.as_ref().is_some_and(|o| same_path(&o.text, path)) =>
                    {
                        msgs.push(format!(
                            "`consume` in stage `{}` would delete its own output: its `out` is \
                             the path of `{by}`'s output, `{{in}}`. Give it another `out`, or \
                             remove `consume`",
                            s.name
                        ))
                    }
                    _ => {}
                }
            }
            if let Some(m) = msgs.into_iter().next() {
                self.error(loc, m);
            }
        }
    }

    fn mv(&mut self, m: &'a Move, st: &State<'a>, chain: &Chain, order: usize) {
        self.host(&m.host, move_loc(m, Piece::MoveHost));
        let what = format!("the path of move `{}`", m.name);
        self.path(
            &m.path,
            &what,
            |off| move_loc(m, Piece::MovePath(off)),
            st,
            chain,
            order,
        );
        self.absolute_on_agents(&m.path, &m.host, &what, move_loc(m, Piece::MovePath(0)));
        let loc = move_loc(m, Piece::Keyword);
        if st.latest.contains(&Latest::Nothing) {
            let msg = if st.latest.len() == 1 {
                format!(
                    "move `{}` has nothing to move: no stage before it declares `out`",
                    m.name
                )
            } else {
                format!(
                    "move `{}` has nothing to move for items that took a branch without an \
                     output: give every branch of the `either` before it a stage with `out`",
                    m.name
                )
            };
            return self.error(loc, msg);
        }
        let mut msgs = Vec::new();
        for l in st.latest.iter() {
            match l {
                Latest::Consumed { by, line } => msgs.push((
                    loc,
                    format!(
                        "move `{}` has nothing to move: stage `{by}` (line {line}) deleted the \
                         output with `consume`",
                        m.name
                    ),
                )),
                Latest::Out { by, host, .. } if *host == m.host => msgs.push((
                    move_loc(m, Piece::MoveHost),
                    format!(
                        "move `{}` moves to host `{host}`, where the output of `{by}` already \
                         is: remove the move, or move to another host",
                        m.name
                    ),
                )),
                // Two names for one place, and the same path: the move
                // would copy the output onto itself, then remove its source,
                // which is the copy.
                Latest::Out { by, host, path, .. }
                    if same_path(path, &m.path.text) && self.same_place(host, &m.host) =>
                {
                    msgs.push((
                        move_loc(m, Piece::MoveHost),
                        format!(
                            "move `{}` moves to host `{}`, the same place as host `{host}` where \
                             the output of `{by}` is, and to the same path: it would delete the \
                             output once copied. Move to another path, or remove the move",
                            m.name, m.host
                        ),
                    ))
                }
                _ => {}
            }
        }
        if let Some((loc, msg)) = msgs.into_iter().next() {
            self.error(loc, msg);
        }
    }

    /// An `out` path or a move's path: holds `{id}`, no `{out}`, and its
    /// other fields have values (the path is text, so they may be on any
    /// host).
    fn path(
        &mut self,
        t: &Template,
        what: &str,
        at: impl Fn(u32) -> Loc,
        st: &State<'a>,
        chain: &Chain,
        order: usize,
    ) {
        if !t.fields().any(|(f, _)| *f == Field::Id) {
            self.error(
                at(0),
                format!(
                    "{what} has no `{{id}}`: every item would write the same place; put `{{id}}` \
                     in it (e.g. `/scratch/NAME/{{id}}`)"
                ),
            );
        }
        for (f, off) in t.fields() {
            match f {
                Field::Id => {}
                Field::Out => self.error(
                    at(off),
                    format!(
                        "`{{out}}` in {what}: a path cannot name itself; build it from `{{id}}`"
                    ),
                ),
                Field::In => self.input(st, at(off), what, None),
                Field::StageOut(n) => self.stage_out(n, at(off), what, order, chain, st, None),
            }
        }
    }

    /// On an agent host a relative path would be taken in the attempt's
    /// scratch directory, which is removed when the attempt ends: the
    /// output would vanish. (On an ssh host it is the remote home, which
    /// stays.) A path that starts with `{in}` or `{STAGE.out}` is as
    /// absolute as that output.
    fn absolute_on_agents(&mut self, t: &Template, host: &str, what: &str, loc: Loc) {
        let on_agent = matches!(
            self.spec.hosts.get(host).map(|h| &h.target),
            Some(super::spec::HostTarget::Agent { .. } | super::spec::HostTarget::Labels { .. })
        );
        let relative = match t.parts.first() {
            Some(super::template::Part::Text(text)) => !text.starts_with('/'),
            Some(super::template::Part::Field { field, .. }) => *field == Field::Id,
            None => false,
        };
        if on_agent && relative {
            self.error(
                loc,
                format!(
                    "{what} is relative, and host `{host}` is an agent: relative paths there are \
                     in the attempt's scratch directory, removed when it ends; give an absolute \
                     path (e.g. `/scratch/NAME/{{id}}`)"
                ),
            );
        }
    }

    /// `{in}` used by `user`; `host`, where a command reads it.
    fn input(&mut self, st: &State<'a>, loc: Loc, user: &str, host: Option<&str>) {
        if st.latest.contains(&Latest::Nothing) {
            let msg = if st.latest.len() == 1 {
                format!(
                    "`{{in}}` in {user} has no value: no step before it produces an output (a \
                     stage with `out`, or a `move`)"
                )
            } else {
                format!(
                    "`{{in}}` in {user} has no value for items that took a branch without an \
                     output: give every branch of the `either` before it a stage with `out`"
                )
            };
            return self.error(loc, msg);
        }
        let mut away = Vec::new();
        for l in st.latest.iter() {
            match l {
                Latest::Consumed { by, line } => {
                    return self.error(
                        loc,
                        format!(
                            "`{{in}}` in {user} has no value: stage `{by}` (line {line}) deleted \
                             the previous output with `consume` and made none"
                        ),
                    )
                }
                Latest::Out { by, host: h, .. } if host.is_some_and(|x| x != *h) => {
                    away.push(format!("`{by}` on host `{h}`"))
                }
                _ => {}
            }
        }
        if let Some(h) = host.filter(|_| !away.is_empty()) {
            self.error(
                loc,
                format!(
                    "`{{in}}` in {user} is the output of {}, but {user} runs on `{h}`: add \
                     `move NAME to {h}:/PATH/{{id}}` before it",
                    away.join(" or ")
                ),
            );
        }
    }

    /// `{n.out}` used by `user` (the step numbered `order`); `host`, where
    /// a command reads it.
    #[allow(clippy::too_many_arguments)]
    fn stage_out(
        &mut self,
        n: &str,
        loc: Loc,
        user: &str,
        order: usize,
        chain: &Chain,
        st: &State<'a>,
        host: Option<&str>,
    ) {
        let field = format!("`{{{n}.out}}`");
        let Some(info) = self.stages.get(n) else {
            let msg = if self.moves.contains(n) {
                format!(
                    "{field} in {user}: `{n}` is a move, not a stage; what it moved is `{{in}}` \
                     of the step right after it"
                )
            } else {
                format!("{field} in {user}: no stage is named `{n}`")
            };
            return self.error(loc, msg);
        };
        let line = info.stage.span.line;
        let prefix = info.chain.len() <= chain.len() && chain[..info.chain.len()] == info.chain[..];
        let d = info
            .chain
            .iter()
            .zip(chain)
            .take_while(|(a, b)| a == b)
            .count();
        let msg = if info.order == order {
            format!("{field} in stage `{n}` names its own output: write `{{out}}`")
        } else if info.stage.out.is_none() {
            format!("{field} in {user}: stage `{n}` (line {line}) declares no `out`")
        } else if !prefix && d < chain.len() && info.chain[d].0 == chain[d].0 {
            format!(
                "{field} in {user}: stage `{n}` is in another branch of the `either` at line {}; \
                 an item takes one branch only",
                chain[d].0.line
            )
        } else if info.order > order {
            format!(
                "{field} in {user}: stage `{n}` comes later (line {line}); a step can use only \
                 the outputs of stages before it"
            )
        } else if !prefix {
            format!(
                "{field} in {user}: stage `{n}` is inside a branch of the `either` at line {}, \
                 which not every item takes; right after the `either`, use `{{in}}` (the output \
                 of whichever branch the item took)",
                info.chain[d].0.line
            )
        } else if let Some(why) = st.gone.get(n) {
            format!("{field} in {user}: the output of stage `{n}` is no longer there: {why}")
        } else {
            match host {
                Some(h) if h != info.stage.host => format!(
                    "{field} in {user} is on host `{}`, where stage `{n}` ran, but {user} runs \
                     on `{h}`: run it on `{}`, or `move` the output to `{h}` and use `{{in}}`",
                    info.stage.host, info.stage.host
                ),
                _ => return,
            }
        };
        self.error(loc, msg);
    }
}

#[cfg(test)]
mod tests {
    use super::super::load;

    fn errs(text: &str) -> Vec<(u32, u32, String)> {
        match load("t.pipeline", text) {
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
    fn one(text: &str, line: u32, col: u32, needle: &str) {
        let e = errs(text);
        assert_eq!(e.len(), 1, "{e:#?}");
        assert_eq!((e[0].0, e[0].1), (line, col), "{e:#?}");
        assert!(e[0].2.contains(needle), "{:?} lacks {needle:?}", e[0].2);
        // One message, not a source line's indentation carried into it.
        assert!(!e[0].2.contains("   "), "{:?}", e[0].2);
    }

    const HEAD: &str = "host a = agent a1\nhost b = agent b1\nitems on a: ls\n";

    #[test]
    fn a_valid_pipeline_passes() {
        let t = format!(
            "{HEAD}stage s on a out /x/{{id}}: make {{out}}\nmove m to b:/y/{{id}}\n\
             stage t on b consume out /z/{{id}}: f {{in}} {{out}}\nstage u on b: g {{t.out}} {{id}}\n"
        );
        assert_eq!(errs(&t), vec![]);
    }

    /// Relative `out` and move paths vanish with the attempt's scratch
    /// directory on an agent; on an ssh host they are in the remote home.
    #[test]
    fn relative_paths_are_refused_on_agents() {
        one(
            &format!("{HEAD}stage s on a out res/{{id}}: make {{out}}\n"),
            4,
            18,
            "is relative, and host `a` is an agent",
        );
        one(
            &format!("{HEAD}stage s on a out /x/{{id}}: make {{out}}\nmove m to b:{{id}}.copy\n"),
            5,
            13,
            "the path of move `m` is relative",
        );
        let ssh = "host a = ssh://u@h key k\nhost b = agent b1\nitems on a: ls\n";
        assert_eq!(
            errs(&format!("{ssh}stage s on a out res/{{id}}: make {{out}}\n")),
            vec![]
        );
    }

    #[test]
    fn unknown_hosts() {
        one("host a = agent a1\nitems on gpu: ls\nstage s on a: x\n", 2, 10, "unknown host `gpu`: declare it with `host gpu = agent NAME` or `host gpu = ssh://user@host key NAME`");
        one(
            &format!("{HEAD}stage s on gpu: x\n"),
            4,
            12,
            "unknown host `gpu`",
        );
        one(
            &format!("{HEAD}stage s on a out /x/{{id}}: x\nmove m to gpu:/x/{{id}}\n"),
            5,
            11,
            "unknown host `gpu`",
        );
    }

    #[test]
    fn names_twice_and_items() {
        one(
            &format!("{HEAD}stage s on a: x\neither {{\nstage t on a: x\n|\nstage s on a: y\n}}\n"),
            8,
            7,
            "stage name `s` is used twice (first by the stage at line 4)",
        );
        one(
            &format!("{HEAD}stage items on a: x\n"),
            4,
            7,
            "cannot be named `items`",
        );
        one(
            &format!("{HEAD}stage s on a out /x/{{id}}: x\nmove s to b:/x/{{id}}\n"),
            5,
            6,
            "move name `s` is used twice",
        );
    }

    #[test]
    fn out_fields() {
        one(
            &format!("{HEAD}stage s on a: cp x {{out}}\n"),
            4,
            20,
            "`{out}` in stage `s`, which declares no `out`",
        );
        one(
            &format!("{HEAD}stage s on a out /x/{{id}}/{{out}}: x\n"),
            4,
            26,
            "`{out}` in the `out` path of stage `s`",
        );
        one(
            &format!("{HEAD}stage s on a out /x/{{id}}: x\nmove m to b:/y/{{id}}/{{out}}\n"),
            5,
            21,
            "`{out}` in the path of move `m`",
        );
        one(
            "host a = agent a1\nitems on a: ls {out}\nstage s on a: x\n",
            2,
            16,
            "`{out}` in the items command",
        );
        // Not a field: shell text.
        assert_eq!(
            errs("host a = agent a1\nitems on a: ls {a,b} ${X}\nstage s on a: x\n"),
            vec![]
        );
    }

    #[test]
    fn paths_need_the_id() {
        one(
            &format!("{HEAD}stage s on a out /x/y: x\n"),
            4,
            18,
            "has no `{id}`: every item would write the same place",
        );
        one(
            &format!("{HEAD}stage s on a out /x/{{id}}: x\nmove m to b:/y\n"),
            5,
            13,
            "the path of move `m` has no `{id}`",
        );
    }

    #[test]
    fn inputs_need_an_earlier_output_on_the_same_host() {
        one(
            &format!("{HEAD}stage s on a: cat {{in}}\n"),
            4,
            19,
            "`{in}` in stage `s` has no value",
        );
        one(
            &format!("{HEAD}stage s on a: x\nstage t on a: cat {{in}}\n"),
            5,
            19,
            "no value",
        );
        one(&format!("{HEAD}stage s on a out /x/{{id}}: x\nstage t on b: cat {{in}}\n"), 5, 19, "`{in}` in stage `t` is the output of `s` on host `a`, but stage `t` runs on `b`: add `move NAME to b:/PATH/{id}`");
        // A move's output is on its destination.
        one(&format!("{HEAD}stage s on a out /x/{{id}}: x\nmove m to b:/x/{{id}}\nstage t on a: cat {{in}}\n"), 6, 19, "the output of `m` on host `b`");
        // After an either every branch's last output must be on the host.
        let t = format!(
            "host c = agent c1\n{HEAD}either {{\nstage s on a out /x/{{id}}: x\n|\nstage t on c out /x/{{id}}: x\nmove m to b:/x/{{id}}\n}}\nstage u on b: cat {{in}}\n"
        );
        one(
            &t,
            11,
            19,
            "`{in}` in stage `u` is the output of `s` on host `a`, but stage `u` runs on `b`",
        );
        let t = format!("{HEAD}either {{\nstage s on a out /x/{{id}}: x\n|\nstage t on a: x\n}}\nstage u on a: cat {{in}}\n");
        one(&t, 9, 19, "for items that took a branch without an output");
        let t = format!("{HEAD}stage s on a out /x/{{id}}: x\nstage t on a consume: x\nstage u on a: cat {{in}}\n");
        one(&t, 6, 19, "stage `t` (line 5) deleted the previous output");
    }

    #[test]
    fn stage_outputs() {
        let p = format!("{HEAD}stage s on a out /x/{{id}}: x\n");
        one(
            &format!("{p}stage t on a: {{s.out}} {{t.out}}\n"),
            5,
            23,
            "names its own output",
        );
        one(
            &format!("{p}stage t on a: {{nope.out}}\n"),
            5,
            15,
            "no stage is named `nope`",
        );
        one(
            &format!("{p}stage t on a: {{u.out}}\nstage u on a out /u/{{id}}: x\n"),
            5,
            15,
            "stage `u` comes later (line 6)",
        );
        one(
            &format!("{p}stage t on a: x\nstage u on a: {{t.out}}\n"),
            6,
            15,
            "stage `t` (line 5) declares no `out`",
        );
        one(
            &format!("{p}move m to b:/m/{{id}}\nstage t on b: {{m.out}}\n"),
            6,
            15,
            "`m` is a move, not a stage",
        );
        one(
            &format!("{p}stage t on b: {{s.out}}\n"),
            5,
            15,
            "`{s.out}` in stage `t` is on host `a`, where stage `s` ran, but stage `t` runs on `b`",
        );
        one(
            &format!("{p}move m to b:/m/{{id}}\nstage t on a: {{s.out}}\n"),
            6,
            15,
            "no longer there: move `m` (line 5) moves it to host `b`",
        );
        let e = format!("{p}either {{\nstage t on a out /t/{{id}}: x\n|\nstage u on a: {{t.out}}\n}}\nstage v on a: {{t.out}}\n");
        let got = errs(&e);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert_eq!((got[0].0, got[0].1), (8, 15));
        assert!(
            got[0]
                .2
                .contains("another branch of the `either` at line 5"),
            "{}",
            got[0].2
        );
        assert_eq!((got[1].0, got[1].1), (10, 15));
        assert!(got[1].2.contains("use `{in}`"), "{}", got[1].2);
        // Inside the same branch, and from before the either, it is fine;
        // in a path it may be on any host.
        let ok = format!("{p}either {{\nstage t on a out /t/{{id}}: x\nstage u on a: {{t.out}} {{s.out}}\n|\nstage w on b out {{s.out}}.{{id}}: x\n}}\n");
        assert_eq!(errs(&ok), vec![]);
    }

    #[test]
    fn what_a_branch_moves_away_is_gone_after_the_either_but_not_beside_it() {
        let t = format!(
            "{HEAD}stage s on a out /x/{{id}}: x\neither {{\nmove m to b:/m/{{id}}\n|\n\
             stage t on a: cat {{s.out}}\n}}\nstage u on a: cat {{s.out}}\n"
        );
        one(
            &t,
            10,
            19,
            "the output of stage `s` is no longer there: move `m` (line 6) moves it",
        );
    }

    #[test]
    fn consume_needs_an_output_on_its_host() {
        one(
            &format!("{HEAD}stage s on a consume: x\n"),
            4,
            14,
            "`consume` in stage `s` has nothing to delete: it is the first step",
        );
        one(
            &format!("{HEAD}stage s on a: x\nstage t on a jobs 2 consume: x\n"),
            5,
            21,
            "has nothing to delete",
        );
        one(
            &format!("{HEAD}stage s on a out /x/{{id}}: x\nstage t on b consume: x\n"),
            5,
            14,
            "would delete `{in}` on host `a`",
        );
    }

    #[test]
    fn moves_need_something_to_move_elsewhere() {
        one(
            &format!("{HEAD}stage s on a: x\nmove m to b:/x/{{id}}\n"),
            5,
            1,
            "move `m` has nothing to move: no stage before it declares `out`",
        );
        one(
            &format!("{HEAD}stage s on a out /x/{{id}}: x\nmove m to a:/y/{{id}}\n"),
            5,
            11,
            "moves to host `a`, where the output of `s` already is",
        );
    }

    /// Review of 3877596, F3: a move between two names of one machine, to
    /// the path the output is at, copied it onto itself and then removed
    /// its source, the copy: every item `done`, nothing on disk. Likewise a
    /// `consume` whose `out` is its own `{in}`.
    #[test]
    fn nothing_deletes_the_output_it_makes() {
        let alias = "host a = agent n1\nhost b = agent n1\nitems on a: ls\n";
        one(
            &format!("{alias}stage s on a out /d/{{id}}: x\nmove m to b:/d/{{id}}\n"),
            5,
            11,
            "the same place as host `a`",
        );
        // Another path on the same machine is a copy, as the OCR example
        // makes; another machine, the same path, a move.
        assert_eq!(
            errs(&format!(
                "{alias}stage s on a out /d/{{id}}: x\nmove m to b:/e/{{id}}\n"
            )),
            vec![]
        );
        assert_eq!(
            errs(&format!(
                "{HEAD}stage s on a out /d/{{id}}: x\nmove m to b:/d/{{id}}\n"
            )),
            vec![]
        );
        // A directory `out` and the same path without its `/`.
        one(
            &format!("{alias}stage s on a out /d//{{id}}/: x\nmove m to b:/d/{{id}}\n"),
            5,
            11,
            "the same place as host `a`",
        );
        let ssh = "host a = ssh://me@box key k\nhost b = ssh://me@box:22 key k2\nitems on a: ls\n";
        one(
            &format!("{ssh}stage s on a out /d/{{id}}: x\nmove m to b:/d/{{id}}\n"),
            5,
            11,
            "the same place",
        );
        one(
            &format!(
                "{HEAD}stage s on a out /d/{{id}}: x\nstage t on a consume out /d/{{id}}: y\n"
            ),
            5,
            14,
            "would delete its own output",
        );
    }

    #[test]
    fn every_error_is_reported_in_file_order() {
        let t = format!("{HEAD}stage s on z: cat {{in}} {{out}}\nmove m to a:/x\n");
        let e = errs(&t);
        let at: Vec<(u32, u32)> = e.iter().map(|e| (e.0, e.1)).collect();
        assert_eq!(
            at,
            vec![(4, 12), (4, 19), (4, 24), (5, 1), (5, 13)],
            "{e:#?}"
        );
    }
}
