//! A self-check that needs no reference answer: every package phase 1
//! selects for a target (a superset of the answer) is backed by what
//! `--explain` says of it. For `--recursive`, the chain to the target must
//! have each step's version allowed by the depends it comes from, checked by
//! [`explain::check_step`] over the formula's OR/AND tree (phase 1 builds
//! the CNF instead); for the `--depopts` queries, some conjunction of the
//! depends must name the target with every such atom holding
//! ([`explain::direct_holds`], a restatement of `phase1::verifies`). Before
//! the fix for issue #10 this failed on cmdliner.1.3.0:
//! `satyrographos.0.0.2.11 -> opam-state.2.6.0~alpha1` is not allowed.

mod fixture;

use opam_revdeps::phase1::{self, Query, DEPOPTS, RECURSIVE, WITH_TEST_DEPOPTS};
use opam_revdeps::{explain, PkgId, Variant};

/// Checks every candidate of the union query whose id is in `slice`
/// (a range over the candidate list); the number checked.
fn self_check(compiler_version: &str, target: &str, slice: std::ops::Range<usize>) -> usize {
    let repo = fixture::repo();
    let v = Variant::debian12("ocaml-base-compiler", compiler_version);
    let t = repo.find(target).expect("target in fixture");
    let (tn, tv) = (repo.name(t), repo.version(t));
    let cands = phase1::phase1(repo, &v, t, Query::Union);
    let rev = phase1::reverse_graph(repo, &v);
    let parent = phase1::reverse_closure(&rev, t);
    let list = &cands.list[slice.start.min(cands.list.len())..slice.end.min(cands.list.len())];
    let mut bad = Vec::new();
    for c in list {
        let p = repo.display(c.pkg);
        if c.queries & RECURSIVE != 0 {
            match explain::recursive_steps(repo, &v, &parent, c.pkg) {
                None => bad.push(format!("{p}: no chain to {target}")),
                Some(steps) => bad.extend(steps.iter().filter(|s| !s.holds).map(|s| {
                    format!(
                        "{p}: step {} -> {}: {}",
                        repo.display(s.from),
                        repo.display(s.to),
                        s.reading
                    )
                })),
            }
        }
        for (flag, test) in [(DEPOPTS, false), (WITH_TEST_DEPOPTS, true)] {
            if c.queries & flag != 0 {
                let f =
                    phase1::resolved_depends(repo, &v, c.pkg, phase1::list_dep_vars(test), true);
                if !explain::direct_holds(&f, tn, tv) {
                    bad.push(format!(
                        "{p}: no conjunction of its depends holds for {target} (with-test {test})"
                    ));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{target} on {compiler_version}: {} of {} candidates fail:\n{}",
        bad.len(),
        list.len(),
        bad.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    list.len()
}

#[test]
fn cmdliner_chains_hold() {
    assert!(self_check("4.14.2", "cmdliner.1.3.0", 0..usize::MAX) > 4000);
}

#[test]
fn coq_chains_hold() {
    self_check("4.14.2", "coq.9.1.1", 0..usize::MAX);
    self_check("5.5.0", "coq.9.1.1", 0..usize::MAX);
}

#[test]
fn dune_chains_hold() {
    assert!(self_check("4.14.2", "dune.3.20.2", 0..usize::MAX) > 13_000);
}

/// The two statements of opam's edge rule agree everywhere: for every
/// package of the fixture and every version of every name its depends
/// mention, [`phase1::graph_edges`] (over the CNF, as opam computes it) has
/// the edge exactly when [`explain::check_edge`] (over the tree) allows it.
#[test]
fn cnf_and_tree_readings_agree_on_every_edge() {
    let repo = fixture::repo();
    let v = Variant::debian12("ocaml-base-compiler", "4.14.2");
    let mut checked = 0usize;
    let mut bad = Vec::new();
    for p in 0..repo.packages.len() as PkgId {
        let f = phase1::graph_formula(repo, &v, p);
        let edges = phase1::graph_edges(repo, &f);
        let mut atoms = Vec::new();
        f.atoms(&mut atoms);
        let mut names: Vec<&str> = atoms.iter().map(|g| g.atom.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            for q in repo.versions_of(name) {
                checked += 1;
                let (holds, reading) = explain::check_edge(&f, name, repo.version(q));
                if holds != edges.binary_search(&q).is_ok() {
                    bad.push(format!(
                        "{} -> {}: CNF edge {}, tree {reading}",
                        repo.display(p),
                        repo.display(q),
                        !holds
                    ));
                }
            }
        }
    }
    assert!(checked > 1_000_000, "{checked}");
    assert!(
        bad.is_empty(),
        "{} disagreements:\n{}",
        bad.len(),
        bad[..bad.len().min(20)].join("\n")
    );
}
