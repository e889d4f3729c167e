//! Phase 1: one pass over the repository — which package versions depend on
//! the target (`--depends-on`, version-aware), and the reverse closure for
//! `--recursive`. The result is the sorted candidate list phase 2 checks.

use crate::formula::{resolve, resolve_cstr, resolve_cstr_or, FAtom, Formula, RAtom, VFormula};
use crate::lexer::Relop;
use crate::repository::{PkgId, Repository};
use crate::variant::{DepVars, PkgEnv, Variant};
use crate::version::Version;
use rayon::prelude::*;
use std::collections::HashMap;

/// Which of opam-repo-ci's reverse-dependency queries to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Query {
    /// The union of the three below, without the target.
    Union,
    /// `--depends-on T --depopts`
    Depopts,
    /// `--depends-on T --recursive`
    Recursive,
    /// `--depends-on T --with-test --depopts`
    WithTestDepopts,
}

impl Query {
    /// The flags a candidate needs for this query.
    pub fn flags(self) -> u8 {
        match self {
            Query::Union => DEPOPTS | RECURSIVE | WITH_TEST_DEPOPTS,
            Query::Depopts => DEPOPTS,
            Query::Recursive => RECURSIVE,
            Query::WithTestDepopts => WITH_TEST_DEPOPTS,
        }
    }
}

/// Candidate of `--depends-on T --depopts`.
pub const DEPOPTS: u8 = 1;
/// Candidate of `--depends-on T --recursive`.
pub const RECURSIVE: u8 = 2;
/// Candidate of `--depends-on T --with-test --depopts`.
pub const WITH_TEST_DEPOPTS: u8 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub pkg: PkgId,
    /// Which queries selected it (bits `DEPOPTS`, `RECURSIVE`, `WITH_TEST_DEPOPTS`).
    pub queries: u8,
}

/// Phase 1's answer: candidates sorted by package id (name, then version),
/// the target itself excluded.
#[derive(Clone, Debug)]
pub struct Candidates {
    pub target: PkgId,
    pub query: Query,
    pub list: Vec<Candidate>,
}

/// Dependency variables of `opam list --depends-on` (build, no post, no doc, no dev).
pub fn list_dep_vars(test: bool) -> DepVars {
    DepVars {
        build: Some(true),
        post: Some(false),
        test: Some(test),
        doc: Some(false),
        dev: Some(false),
    }
}

/// Dependency variables of the solver's universe (OpamSwitchState.universe):
/// `with-test` for every package when asked, `dev` for development packages,
/// `build`/`post` as the solver call sets them.
pub fn universe_dep_vars(repo: &Repository, pkg: PkgId, test: bool, post: bool) -> DepVars {
    DepVars {
        build: Some(true),
        post: Some(post),
        test: Some(test),
        doc: Some(false),
        dev: Some(repo.packages[pkg as usize].opam.dev),
    }
}

pub fn env<'a>(
    repo: &'a Repository,
    variant: &'a Variant,
    pkg: PkgId,
    deps: DepVars,
) -> PkgEnv<'a> {
    PkgEnv {
        variant,
        name: repo.name(pkg),
        version: repo.version(pkg),
        deps,
    }
}

/// `depends` (and `depopts` when asked) with filters resolved.
pub fn resolved_depends(
    repo: &Repository,
    variant: &Variant,
    pkg: PkgId,
    deps: DepVars,
    depopts: bool,
) -> Formula<RAtom> {
    let p = &repo.packages[pkg as usize];
    let e = env(repo, variant, pkg, deps);
    let d = resolve(&p.opam.depends, &e);
    if depopts {
        Formula::and(vec![d, resolve(&p.opam.depopts, &e)])
    } else {
        d
    }
}

/// OpamFormula.verifies: the formula in disjunctive normal form, each
/// conjunction cut down to its atoms naming the target (conjunctions left
/// with none vanish); true if one that remains holds for the target's version.
/// So `"dune" {>= "2.9"} & ("dune" {>= "3.22"} | "lwt")` is verified by
/// dune 3.20.2 (through the `lwt` branch), while a package whose only dune
/// atom excludes the version is not — matching by version, not by name.
pub fn verifies(f: &Formula<RAtom>, name: &str, version: &str) -> bool {
    // Each conjunction as the list of its target atoms' truth values.
    fn dnf(f: &Formula<RAtom>, name: &str, version: &str) -> Vec<Vec<bool>> {
        match f {
            Formula::Empty => vec![vec![]],
            Formula::Atom(a) if a.name == name => vec![vec![a.matches_version(version)]],
            Formula::Atom(_) => vec![vec![]],
            Formula::Or(v) => {
                let mut out: Vec<Vec<bool>> = Vec::new();
                for x in v {
                    for c in dnf(x, name, version) {
                        if !out.contains(&c) {
                            out.push(c);
                        }
                    }
                }
                out
            }
            Formula::And(v) => {
                let mut acc: Vec<Vec<bool>> = vec![vec![]];
                for x in v {
                    let d = dnf(x, name, version);
                    let mut next: Vec<Vec<bool>> = Vec::new();
                    for a in &acc {
                        for b in &d {
                            // Only the conjunction's truth and emptiness matter.
                            let mut c: Vec<bool> = a.iter().chain(b).copied().collect();
                            c.sort_unstable();
                            c.dedup();
                            if !next.contains(&c) {
                                next.push(c);
                            }
                        }
                    }
                    acc = next;
                }
                acc
            }
        }
    }
    dnf(f, name, version)
        .iter()
        .any(|c| !c.is_empty() && c.iter().all(|&b| b))
}

/// `opam list --depends-on T --all-versions --depopts [--with-test]` before
/// the coinstallability filter.
pub fn depends_on(repo: &Repository, variant: &Variant, target: PkgId, test: bool) -> Vec<PkgId> {
    let (tn, tv) = (repo.name(target), repo.version(target));
    (0..repo.packages.len() as PkgId)
        .into_par_iter()
        .filter(|&p| {
            verifies(
                &resolved_depends(repo, variant, p, list_dep_vars(test), true),
                tn,
                tv,
            )
        })
        .collect()
}

/// Package versions matching an atom, ascending.
pub fn matching<'a>(repo: &'a Repository, a: &'a RAtom) -> impl Iterator<Item = PkgId> + 'a {
    let simple = match &a.vf {
        Formula::Empty => Some(None),
        Formula::Atom(b) => Some(Some(b)),
        _ => None,
    };
    let run = simple.map(|b| bound_run(repo, &a.name, b));
    repo.versions_of(&a.name).filter(move |&q| match run {
        Some((lo, hi, neq)) => (lo..hi).contains(&q) != neq,
        None => a.matches_version(repo.version(q)),
    })
}

/// Versions of `name` allowed by one bound (all of them for `None`), ascending.
fn bound_matches<'a>(
    repo: &'a Repository,
    name: &'a str,
    bound: Option<&'a (Relop, Version)>,
) -> impl Iterator<Item = PkgId> + 'a {
    let (lo, hi, neq) = bound_run(repo, name, bound);
    repo.versions_of(name)
        .filter(move |q| (lo..hi).contains(q) != neq)
}

/// A single bound is a contiguous run of one name's (sorted) versions, or
/// all but such a run for `!=`: `(start, end, complement)`, found without a scan.
fn bound_run(
    repo: &Repository,
    name: &str,
    bound: Option<&(Relop, Version)>,
) -> (PkgId, PkgId, bool) {
    let all = repo.versions_of(name);
    let Some((op, c)) = bound else {
        return (all.start, all.end, false);
    };
    let (lo, hi) = bound_range(repo, all.clone(), c.as_str());
    match op {
        Relop::Lt => (all.start, lo, false),
        Relop::Leq => (all.start, hi, false),
        Relop::Eq => (lo, hi, false),
        Relop::Geq => (lo, all.end, false),
        Relop::Gt => (hi, all.end, false),
        Relop::Neq => (lo, hi, true),
    }
}

/// Within `range` (one name's versions, ascending), the first version not
/// below `c` and the first above it.
fn bound_range(repo: &Repository, range: std::ops::Range<PkgId>, c: &str) -> (PkgId, PkgId) {
    // First id in `range` for which `pred` fails (`pred` holds on a prefix).
    let first_not = |pred: &dyn Fn(PkgId) -> bool| {
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    };
    let lo = first_not(&|q| crate::version::compare(repo.version(q), c).is_lt());
    let hi = first_not(&|q| crate::version::compare(repo.version(q), c).is_le());
    (lo, hi)
}

/// An atom of a package's `depends` as the `--recursive` graph sees it.
///
/// opam builds the graph from the switch's universe
/// (`OpamSwitchState.universe`), where `partial_filter_formula` has already
/// resolved every filter variable but `build` and `post`; the CNF is made
/// from that (`OpamSolver.opam2cudf`, `preresolve_deps`), and only then are
/// `build` (true) and `post` (false) evaluated on its atoms, anything still
/// undefined counting as false. So `"ocaml" {post}` is an atom with
/// `kept: false`: it gives the CNF its shape, then leaves every clause it
/// is in; an atom whose filter is false whatever `build` and `post` are
/// (`{with-test}` here) is gone before the CNF is made.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphAtom {
    pub atom: RAtom,
    pub kept: bool,
}

/// One package's `depends` as the `--recursive` graph sees it (no depopts:
/// the query does not ask for them; no tests, no docs; `dev` for
/// development packages).
pub fn graph_formula(repo: &Repository, variant: &Variant, pkg: PkgId) -> Formula<GraphAtom> {
    let p = &repo.packages[pkg as usize];
    let vars = |build, post| DepVars {
        build: Some(build),
        post: Some(post),
        test: Some(false),
        doc: Some(false),
        dev: Some(p.opam.dev),
    };
    let last = env(repo, variant, pkg, vars(true, false));
    p.opam.depends.map(&mut |a: &FAtom| {
        let atom = |vf| RAtom {
            name: a.name.clone(),
            pos: a.pos,
            vf,
        };
        if let Some(vf) = resolve_cstr(&a.cstr, &last) {
            return Formula::Atom(GraphAtom {
                atom: atom(vf),
                kept: true,
            });
        }
        // Still in the CNF if some value of `build`/`post` (or of a variable
        // left undefined) makes the filter hold.
        let open = [(true, true), (false, true), (false, false)]
            .into_iter()
            .any(|(b, p)| {
                resolve_cstr_or(&a.cstr, &env(repo, variant, pkg, vars(b, p)), true).is_some()
            });
        if open {
            Formula::Atom(GraphAtom {
                atom: atom(Formula::Empty),
                kept: false,
            })
        } else {
            Formula::Empty
        }
    })
}

/// One atom of the CNF opam's graph is built from: a name and the versions
/// its one version bound allows, or `None` for an atom whose filter drops
/// it after the CNF is made.
type Leaf<'a> = Option<(&'a str, Vec<PkgId>)>;

/// `OpamFilter.atomise_extended`: `"a" {>= "1" & < "2"}` becomes the atoms
/// `a >= 1` and `a < 2` under the same AND (an OR of bounds, under an OR).
/// Each atom of the result indexes `leaves`, so that what it matches is
/// found once however many CNF clauses repeat it.
fn atomise<'a>(
    repo: &Repository,
    f: &'a Formula<GraphAtom>,
    leaves: &mut Vec<Leaf<'a>>,
) -> Formula<usize> {
    fn leaf<'a>(leaves: &mut Vec<Leaf<'a>>, l: Leaf<'a>) -> Formula<usize> {
        leaves.push(l);
        Formula::Atom(leaves.len() - 1)
    }
    fn bounds<'a>(
        repo: &Repository,
        name: &'a str,
        vf: &VFormula,
        leaves: &mut Vec<Leaf<'a>>,
    ) -> Formula<usize> {
        let all = |v: &[VFormula], leaves: &mut Vec<Leaf<'a>>| -> Vec<Formula<usize>> {
            v.iter().map(|x| bounds(repo, name, x, leaves)).collect()
        };
        match vf {
            Formula::Empty => leaf(
                leaves,
                Some((name, bound_matches(repo, name, None).collect())),
            ),
            Formula::Atom(b) => leaf(
                leaves,
                Some((name, bound_matches(repo, name, Some(b)).collect())),
            ),
            Formula::And(v) => Formula::And(all(v, leaves)),
            Formula::Or(v) => Formula::Or(all(v, leaves)),
        }
    }
    match f {
        Formula::Empty => Formula::Empty,
        Formula::Atom(g) if !g.kept => leaf(leaves, None),
        Formula::Atom(g) => bounds(repo, &g.atom.name, &g.atom.vf, leaves),
        Formula::And(v) => Formula::And(v.iter().map(|x| atomise(repo, x, leaves)).collect()),
        Formula::Or(v) => Formula::Or(v.iter().map(|x| atomise(repo, x, leaves)).collect()),
    }
}

/// The versions one package's dependency formula gives `--recursive` graph
/// edges to. This is opam 2.1.2's rule, `OpamCudf.dependency_set` (through
/// `strong_and_weak_deps`, src/solver/opamCudf.ml; used by
/// `OpamCudf.Graph.of_universe` for `OpamSolver.reverse_dependencies`),
/// applied to the CNF of the atomised formula:
///
/// - a clause naming a single package name (`a >= 1`, or `a >= 1 | a < 0.5`)
///   is *strong*: the name's edges are the versions allowed by the clause,
///   intersected over all its strong clauses;
/// - a clause naming several (an OR between different packages) is *weak*:
///   each of its names not strong anywhere gets an edge to every version
///   allowed by any one of its bounds in such a clause.
///
/// An OR therefore does not make its atoms weak on its own. In
/// `("opam-state" {>= "2.0.4" & < "2.2"} & "ocaml" {< "4.12"} |
/// "opam-state" {>= "2.1.0" & < "2.2"} & "ocaml" {>= "4.12"})` every branch
/// names opam-state, so the CNF holds the strong clauses
/// `opam-state >= 2.0.4 | opam-state >= 2.1.0` and
/// `opam-state < 2.2 | opam-state < 2.2`: opam-state gets edges to 2.0.4 up
/// to 2.2 only (and ocaml, strong as well, to every version). A name that
/// some branch does without (`"coq" {>= "8.11" & < "8.17"} | "coq-core"`)
/// is weak, and then each bound counts alone: coq ≥ 8.11 gives an edge to
/// coq.9.1.1 although 9.1.1 is outside the atom's range (prooftree.0.14 is
/// in opam's answers for coq.9.1.1). A name strong anywhere ignores its weak
/// clauses (`"dune" {>= "2.9"} & ("dune" {>= "3.22"} | "lwt")`: dune ≥ 2.9).
pub fn graph_edges(repo: &Repository, f: &Formula<GraphAtom>) -> Vec<PkgId> {
    let mut leaves: Vec<Leaf> = Vec::new();
    let cnf = atomise(repo, f, &mut leaves);
    let mut strong: HashMap<&str, Vec<PkgId>> = HashMap::new();
    let mut weak: HashMap<&str, Vec<PkgId>> = HashMap::new();
    for clause in cnf.cnf() {
        // Every name of the clause, with the versions its bounds allow
        // (possibly none); atoms dropped after the CNF leave the clause.
        let mut by_name: Vec<(&str, Vec<PkgId>)> = Vec::new();
        for &(name, ref versions) in clause.iter().filter_map(|&&i| leaves[i].as_ref()) {
            match by_name.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => {
                    v.extend(versions);
                    v.sort_unstable();
                    v.dedup();
                }
                None => by_name.push((name, versions.clone())),
            }
        }
        match by_name.len() {
            // Only dropped atoms: the clause is gone.
            0 => {}
            1 => {
                let (name, versions) = by_name.pop().expect("one name");
                match strong.get_mut(name) {
                    Some(cur) => cur.retain(|q| versions.binary_search(q).is_ok()),
                    None => {
                        strong.insert(name, versions);
                    }
                }
                weak.remove(name);
            }
            _ => {
                for (name, versions) in by_name {
                    if !strong.contains_key(name) {
                        weak.entry(name).or_default().extend(versions);
                    }
                }
            }
        }
    }
    let mut out: Vec<PkgId> = strong
        .into_values()
        .chain(weak.into_values())
        .flatten()
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The reverse-dependency table of the `--recursive` graph: for each package,
/// the versions that have a graph edge to it ([`graph_edges`]), available or not.
pub fn reverse_graph(repo: &Repository, variant: &Variant) -> Vec<Vec<PkgId>> {
    let fwd: Vec<Vec<PkgId>> = (0..repo.packages.len() as PkgId)
        .into_par_iter()
        .map(|p| graph_edges(repo, &graph_formula(repo, variant, p)))
        .collect();
    let mut rev = vec![Vec::new(); repo.packages.len()];
    for (p, succ) in fwd.iter().enumerate() {
        for &q in succ {
            rev[q as usize].push(p as PkgId);
        }
    }
    rev
}

/// The transitive reverse closure of `target`, with each member's parent
/// (the package it depends on that led there) for explanations.
pub fn reverse_closure(rev: &[Vec<PkgId>], target: PkgId) -> Vec<Option<PkgId>> {
    let mut parent: Vec<Option<PkgId>> = vec![None; rev.len()];
    let mut seen = vec![false; rev.len()];
    seen[target as usize] = true;
    let mut queue = std::collections::VecDeque::from([target]);
    while let Some(q) = queue.pop_front() {
        for &p in &rev[q as usize] {
            if !seen[p as usize] {
                seen[p as usize] = true;
                parent[p as usize] = Some(q);
                queue.push_back(p);
            }
        }
    }
    parent
}

/// Phase 1 for one query.
pub fn phase1(repo: &Repository, variant: &Variant, target: PkgId, query: Query) -> Candidates {
    let flags = query.flags();
    let mut q = vec![0u8; repo.packages.len()];
    if flags & DEPOPTS != 0 {
        for p in depends_on(repo, variant, target, false) {
            q[p as usize] |= DEPOPTS;
        }
    }
    if flags & WITH_TEST_DEPOPTS != 0 {
        for p in depends_on(repo, variant, target, true) {
            q[p as usize] |= WITH_TEST_DEPOPTS;
        }
    }
    if flags & RECURSIVE != 0 {
        let rev = reverse_graph(repo, variant);
        for (p, parent) in reverse_closure(&rev, target).iter().enumerate() {
            if parent.is_some() {
                q[p] |= RECURSIVE;
            }
        }
    }
    let list = q
        .iter()
        .enumerate()
        .filter(|&(p, &f)| f != 0 && p as PkgId != target)
        .map(|(p, &f)| Candidate {
            pkg: p as PkgId,
            queries: f,
        })
        .collect();
    Candidates {
        target,
        query,
        list,
    }
}
