//! Phase 1: one pass over the repository — which package versions depend on
//! the target (`--depends-on`, version-aware), and the reverse closure for
//! `--recursive`. The result is the sorted candidate list phase 2 checks.

use crate::formula::{resolve, Formula, RAtom};
use crate::lexer::Relop;
use crate::repository::{PkgId, Repository};
use crate::variant::{DepVars, PkgEnv, Variant};
use rayon::prelude::*;

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
    let all = repo.versions_of(&a.name);
    // A single bound is a contiguous run of the (sorted) versions: no scan.
    let (lo, hi, neq) = match &a.vf {
        Formula::Empty => (all.start, all.end, false),
        Formula::Atom((op, c)) => {
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
        _ => (all.start, all.end, false),
    };
    let simple = matches!(a.vf, Formula::Empty | Formula::Atom(_));
    all.filter(move |&q| {
        if simple {
            (lo..hi).contains(&q) != neq
        } else {
            a.matches_version(repo.version(q))
        }
    })
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

/// Edges of opam's dependency graph for one atom. opam turns
/// `"a" {>= "1" & < "2"}` into the CUDF atoms `a >= 1` and `a < 2`
/// (OpamFilter.atomise_extended) before dose builds the graph from every
/// atom of the CNF, so each version constraint contributes its own edges.
pub fn graph_targets(repo: &Repository, a: &RAtom) -> Vec<PkgId> {
    let mut leaves = Vec::new();
    a.vf.atoms(&mut leaves);
    if leaves.len() <= 1 {
        return matching(repo, a).collect();
    }
    let mut out: Vec<PkgId> = leaves
        .iter()
        .flat_map(|(op, c)| {
            let single = RAtom {
                name: a.name.clone(),
                pos: a.pos,
                vf: Formula::Atom((*op, c.clone())),
            };
            matching(repo, &single).collect::<Vec<_>>()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The `--recursive` graph's edges from one package's dependency formula.
/// On the fixture, opam 2.1.2's graph has an edge for every version allowed
/// by any single bound of an atom that sits inside a disjunction
/// (`("coq" {>= "8.11" & < "8.17"} | …)` reaches coq.9.1.1: prooftree.0.14
/// and why3-coq.1.8.2 are in its coq answers), but only the versions inside
/// the whole range for an atom outside any disjunction (`"ctypes" {>= "0.4.0"
/// & < "0.12.0"}` does not reach ctypes.0.21.1: memcpy.0.2.0 is not in its
/// dune answer). This rule reproduces every reference answer exactly.
fn graph_edges(repo: &Repository, f: &Formula<RAtom>, under_or: bool, out: &mut Vec<PkgId>) {
    match f {
        Formula::Empty => {}
        Formula::Atom(a) if under_or => out.extend(graph_targets(repo, a)),
        Formula::Atom(a) => out.extend(matching(repo, a)),
        Formula::And(v) => v.iter().for_each(|x| graph_edges(repo, x, under_or, out)),
        Formula::Or(v) => v.iter().for_each(|x| graph_edges(repo, x, true, out)),
    }
}

/// The reverse-dependency table of the `--recursive` graph: for each package,
/// the versions whose hard dependencies (any OR branch) it can satisfy.
pub fn reverse_graph(repo: &Repository, variant: &Variant) -> Vec<Vec<PkgId>> {
    let fwd: Vec<Vec<PkgId>> = (0..repo.packages.len() as PkgId)
        .into_par_iter()
        .map(|p| {
            // OpamSwitchState.reverse_dependencies: universe without tests, build, no post.
            let f = resolved_depends(
                repo,
                variant,
                p,
                universe_dep_vars(repo, p, false, false),
                false,
            );
            let mut out: Vec<PkgId> = Vec::new();
            graph_edges(repo, &f, false, &mut out);
            out.sort_unstable();
            out.dedup();
            out
        })
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
