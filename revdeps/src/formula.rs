//! Package formulas (`depends`, `depopts`, `conflicts`): atoms with filtered
//! version constraints, and their resolution against an environment.

use crate::error::SyntaxError;
use crate::filter::{Env, Filter};
use crate::lexer::{Pos, Relop};
use crate::parser::{Value, ValueKind};
use crate::version::{self, Version};
use std::fmt;

/// An and/or tree; `Empty` is the neutral element that opam drops from both.
#[derive(Clone, Debug, PartialEq)]
pub enum Formula<A> {
    Empty,
    Atom(A),
    And(Vec<Formula<A>>),
    Or(Vec<Formula<A>>),
}

impl<A> Formula<A> {
    /// opam's `ands`: empties vanish, a single child stands alone.
    pub fn and(items: Vec<Formula<A>>) -> Self {
        Self::nary(items, true)
    }
    pub fn or(items: Vec<Formula<A>>) -> Self {
        Self::nary(items, false)
    }
    fn nary(items: Vec<Formula<A>>, is_and: bool) -> Self {
        let mut v: Vec<Formula<A>> = items
            .into_iter()
            .filter(|f| !matches!(f, Formula::Empty))
            .collect();
        match v.len() {
            0 => Formula::Empty,
            1 => v.pop().expect("one element"),
            _ if is_and => Formula::And(v),
            _ => Formula::Or(v),
        }
    }

    /// Maps atoms to formulas, dropping what becomes empty (OpamFormula.map).
    pub fn map<B>(&self, f: &mut impl FnMut(&A) -> Formula<B>) -> Formula<B> {
        match self {
            Formula::Empty => Formula::Empty,
            Formula::Atom(a) => f(a),
            Formula::And(v) => Formula::and(v.iter().map(|x| x.map(f)).collect()),
            Formula::Or(v) => Formula::or(v.iter().map(|x| x.map(f)).collect()),
        }
    }

    pub fn atoms<'a>(&'a self, out: &mut Vec<&'a A>) {
        match self {
            Formula::Empty => {}
            Formula::Atom(a) => out.push(a),
            Formula::And(v) | Formula::Or(v) => v.iter().for_each(|x| x.atoms(out)),
        }
    }

    /// The clauses of the conjunctive normal form, as opam's
    /// `OpamFormula.cnf_of_formula` builds them: ORs distributed over ANDs
    /// with no simplification (duplicates and subsumed clauses stay), and
    /// `Empty` neutral in both. `(a & b) | c` gives `[[a, c], [b, c]]`.
    pub fn cnf(&self) -> Vec<Vec<&A>> {
        match self {
            Formula::Empty => Vec::new(),
            Formula::Atom(a) => vec![vec![a]],
            Formula::And(v) => v.iter().flat_map(|x| x.cnf()).collect(),
            Formula::Or(v) => {
                let mut acc: Vec<Vec<&A>> = Vec::new();
                for x in v {
                    let c = x.cnf();
                    if c.is_empty() {
                        continue;
                    }
                    if acc.is_empty() {
                        acc = c;
                        continue;
                    }
                    let mut next = Vec::with_capacity(acc.len() * c.len());
                    for a in &acc {
                        for b in &c {
                            next.push(a.iter().chain(b).copied().collect());
                        }
                    }
                    acc = next;
                }
                acc
            }
        }
    }

    /// Truth of the formula; `Empty` counts as true (as in OpamFormula.eval).
    pub fn eval(&self, f: &mut impl FnMut(&A) -> bool) -> bool {
        match self {
            Formula::Empty => true,
            Formula::Atom(a) => f(a),
            Formula::And(v) => v.iter().all(|x| x.eval(f)),
            Formula::Or(v) => v.iter().any(|x| x.eval(f)),
        }
    }
}

impl<A: fmt::Display> fmt::Display for Formula<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |f: &mut fmt::Formatter<'_>, v: &[Formula<A>], sep: &str| -> fmt::Result {
            write!(f, "(")?;
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    write!(f, " {sep} ")?;
                }
                write!(f, "{x}")?;
            }
            write!(f, ")")
        };
        match self {
            Formula::Empty => write!(f, "true"),
            Formula::Atom(a) => write!(f, "{a}"),
            Formula::And(v) => join(f, v, "&"),
            Formula::Or(v) => join(f, v, "|"),
        }
    }
}

/// One item of a filtered version constraint.
#[derive(Clone, Debug, PartialEq)]
pub enum Cstr {
    Filter(Filter),
    Constraint(Relop, Filter),
}

/// `"name" {constraints}` as written.
#[derive(Clone, Debug, PartialEq)]
pub struct FAtom {
    pub name: String,
    pub pos: Pos,
    pub cstr: Formula<Cstr>,
}

/// A version constraint after filters are evaluated.
pub type VFormula = Formula<(Relop, Version)>;

/// `"name" {version constraint}` after filters are evaluated.
#[derive(Clone, Debug, PartialEq)]
pub struct RAtom {
    pub name: String,
    pub pos: Pos,
    pub vf: VFormula,
}

impl RAtom {
    pub fn matches_version(&self, v: &str) -> bool {
        self.vf
            .eval(&mut |(op, c)| op.holds(version::compare(v, c.as_str())))
    }
}

impl fmt::Display for RAtom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.name)?;
        if !matches!(self.vf, Formula::Empty) {
            let mut atoms = Vec::new();
            self.vf.atoms(&mut atoms);
            if atoms.len() == 1 {
                write!(f, " {{{} \"{}\"}}", atoms[0].0.as_str(), atoms[0].1)?;
            } else {
                write!(f, " {{")?;
                fmt_vf(f, &self.vf)?;
                write!(f, "}}")?;
            }
        }
        Ok(())
    }
}

fn fmt_vf(f: &mut fmt::Formatter<'_>, vf: &VFormula) -> fmt::Result {
    match vf {
        Formula::Empty => Ok(()),
        Formula::Atom((op, v)) => write!(f, "{} \"{v}\"", op.as_str()),
        Formula::And(v) | Formula::Or(v) => {
            let sep = if matches!(vf, Formula::And(_)) {
                " & "
            } else {
                " | "
            };
            write!(f, "(")?;
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    write!(f, "{sep}")?;
                }
                fmt_vf(f, x)?;
            }
            write!(f, ")")
        }
    }
}

fn err(v: &Value, msg: &str) -> SyntaxError {
    SyntaxError {
        line: v.pos.line,
        col: v.pos.col,
        msg: msg.to_string(),
    }
}

/// Reads a package formula; a top-level list is a conjunction (`depends`)
/// or a disjunction (`conflicts`), as `list_is_and` says.
pub fn package_formula(v: &Value, list_is_and: bool) -> Result<Formula<FAtom>, SyntaxError> {
    match &v.kind {
        ValueKind::List(vs) => {
            let items = vs.iter().map(pkg_item).collect::<Result<Vec<_>, _>>()?;
            Ok(if list_is_and {
                Formula::and(items)
            } else {
                Formula::or(items)
            })
        }
        _ => pkg_item(v),
    }
}

fn pkg_item(v: &Value) -> Result<Formula<FAtom>, SyntaxError> {
    Ok(match &v.kind {
        ValueKind::String(name) => Formula::Atom(FAtom {
            name: name.clone(),
            pos: v.pos,
            cstr: Formula::Empty,
        }),
        ValueKind::Option(inner, opts) => match &inner.kind {
            ValueKind::String(name) => Formula::Atom(FAtom {
                name: name.clone(),
                pos: inner.pos,
                cstr: Formula::and(opts.iter().map(cstr_formula).collect::<Result<_, _>>()?),
            }),
            // `("a" | "b") {filter}` applies the options to every atom inside.
            ValueKind::Group(_) => {
                let f = pkg_item(inner)?;
                let extra: Vec<Formula<Cstr>> =
                    opts.iter().map(cstr_formula).collect::<Result<_, _>>()?;
                f.map(&mut |a: &FAtom| {
                    let mut all = vec![a.cstr.clone()];
                    all.extend(extra.iter().cloned());
                    Formula::Atom(FAtom {
                        name: a.name.clone(),
                        pos: a.pos,
                        cstr: Formula::and(all),
                    })
                })
            }
            _ => return Err(err(v, "expected a package name before '{'")),
        },
        ValueKind::And(a, b) => Formula::and(vec![pkg_item(a)?, pkg_item(b)?]),
        ValueKind::Or(a, b) => Formula::or(vec![pkg_item(a)?, pkg_item(b)?]),
        ValueKind::Group(vs) => Formula::and(vs.iter().map(pkg_item).collect::<Result<_, _>>()?),
        _ => return Err(err(v, "expected a package formula")),
    })
}

fn cstr_formula(v: &Value) -> Result<Formula<Cstr>, SyntaxError> {
    Ok(match &v.kind {
        ValueKind::PrefixRelop(op, a) => {
            Formula::Atom(Cstr::Constraint(*op, Filter::from_value(a)?))
        }
        ValueKind::And(a, b) => Formula::and(vec![cstr_formula(a)?, cstr_formula(b)?]),
        ValueKind::Or(a, b) => Formula::or(vec![cstr_formula(a)?, cstr_formula(b)?]),
        ValueKind::Group(vs) => {
            Formula::and(vs.iter().map(cstr_formula).collect::<Result<_, _>>()?)
        }
        ValueKind::Not(a) => negate(cstr_formula(a)?),
        _ => Formula::Atom(Cstr::Filter(Filter::from_value(v)?)),
    })
}

/// `!` over a constraint formula: De Morgan, relations and filters negated.
fn negate(f: Formula<Cstr>) -> Formula<Cstr> {
    match f {
        Formula::Empty => Formula::Atom(Cstr::Filter(Filter::Bool(false))),
        Formula::Atom(Cstr::Filter(x)) => Formula::Atom(Cstr::Filter(Filter::Not(Box::new(x)))),
        Formula::Atom(Cstr::Constraint(op, x)) => Formula::Atom(Cstr::Constraint(op.negate(), x)),
        Formula::And(v) => Formula::or(v.into_iter().map(negate).collect()),
        Formula::Or(v) => Formula::and(v.into_iter().map(negate).collect()),
    }
}

enum Tri {
    True,
    False,
    F(VFormula),
}

/// Evaluates the filters of one atom's constraint (OpamFilter.filter_constraints):
/// `None` when a filter drops the atom.
pub fn resolve_cstr(c: &Formula<Cstr>, env: &dyn Env) -> Option<VFormula> {
    resolve_cstr_or(c, env, false)
}

/// [`resolve_cstr`] with filters that come out undefined taken as `undefined`
/// (`eval_to_bool ~default`).
pub fn resolve_cstr_or(c: &Formula<Cstr>, env: &dyn Env, undefined: bool) -> Option<VFormula> {
    match tri(c, env, undefined) {
        Tri::True => Some(Formula::Empty),
        Tri::False => None,
        Tri::F(f) => Some(f),
    }
}

fn tri(c: &Formula<Cstr>, env: &dyn Env, undefined: bool) -> Tri {
    match c {
        Formula::Empty => Tri::True,
        Formula::Atom(Cstr::Filter(f)) => {
            if f.eval_bool(env, undefined) {
                Tri::True
            } else {
                Tri::False
            }
        }
        Formula::Atom(Cstr::Constraint(op, f)) => match f.eval_string(env) {
            Some(s) => Tri::F(Formula::Atom((*op, Version::new(s)))),
            // An undefined version variable cannot be compared: the atom is dropped.
            None => Tri::False,
        },
        Formula::And(v) => {
            let mut parts = Vec::new();
            for x in v {
                match tri(x, env, undefined) {
                    Tri::False => return Tri::False,
                    Tri::True => {}
                    Tri::F(f) => parts.push(f),
                }
            }
            if parts.is_empty() {
                Tri::True
            } else {
                Tri::F(Formula::and(parts))
            }
        }
        Formula::Or(v) => {
            let mut parts = Vec::new();
            for x in v {
                match tri(x, env, undefined) {
                    Tri::True => return Tri::True,
                    Tri::False => {}
                    Tri::F(f) => parts.push(f),
                }
            }
            if parts.is_empty() {
                Tri::False
            } else {
                Tri::F(Formula::or(parts))
            }
        }
    }
}

/// Resolves every atom's filters; dropped atoms vanish from the tree
/// (OpamFilter.filter_formula).
pub fn resolve(f: &Formula<FAtom>, env: &dyn Env) -> Formula<RAtom> {
    f.map(&mut |a: &FAtom| match resolve_cstr(&a.cstr, env) {
        Some(vf) => Formula::Atom(RAtom {
            name: a.name.clone(),
            pos: a.pos,
            vf,
        }),
        None => Formula::Empty,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::FVal;
    use crate::parser::{parse_file, Item};

    struct E;
    impl Env for E {
        fn resolve(&self, v: &str) -> Option<FVal> {
            match v {
                "with-test" | "post" => Some(FVal::B(false)),
                "build" => Some(FVal::B(true)),
                "version" => Some(FVal::S("1.2".into())),
                _ => None,
            }
        }
    }

    fn deps(src: &str) -> Formula<RAtom> {
        let items = parse_file(&format!("depends: {src}")).expect("parses");
        let Item::Field { value, .. } = &items[0] else {
            panic!()
        };
        resolve(&package_formula(value, true).expect("formula"), &E)
    }

    #[test]
    fn filtered_atoms_drop_out_of_or() {
        let f = deps(
            r#"[ "a" {>= "1" & < "2"} ("b" {with-test} | "c" {= version}) "d" {post} "e" {build}]"#,
        );
        assert_eq!(
            f.to_string(),
            r#"("a" {(>= "1" & < "2")} & "c" {= "1.2"} & "e")"#
        );
    }

    #[test]
    fn cnf_distributes_or_over_and() {
        let f = deps(r#"[ ("a" & "b" | "c" & ("d" | "e")) "f" ]"#);
        let names = |c: &Vec<&RAtom>| c.iter().map(|a| a.name.as_str()).collect::<String>();
        let got: Vec<String> = f.cnf().iter().map(names).collect();
        assert_eq!(got, ["ac", "ade", "bc", "bde", "f"]);
    }

    #[test]
    fn negated_constraint() {
        let f = deps(r#"[ "a" {!(>= "2")} ]"#);
        let Formula::Atom(a) = f else { panic!() };
        assert!(a.matches_version("1.9"));
        assert!(!a.matches_version("2"));
    }
}
