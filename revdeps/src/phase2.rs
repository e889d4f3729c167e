//! Phase 2: coinstallability of phase 1's candidates with the target and compiler.
//!
//! Each universe (with or without tests) is encoded once as CNF
//! ([`crate::encoding`]); every worker builds its own SAT solver from it and
//! asks, per candidate, "T, the compiler and this candidate at their exact
//! versions, all constraints respected?" under an assumption. A model found
//! for one candidate also proves every other candidate it installs.

use crate::phase1::{self, Candidate, DEPOPTS, RECURSIVE, WITH_TEST_DEPOPTS};
use crate::repository::{PkgId, Repository};
use crate::variant::{DepVars, Variant};
use batsat::{lbool, SolverInterface};
use rayon::prelude::*;
use std::sync::atomic::AtomicBool;

use crate::encoding::Encoding;

/// opam's universe for `--coinstallable-with` (OpamSolver.coinstallable_subset):
/// available packages only, dependencies with `build` and `post` true.
pub fn available(repo: &Repository, variant: &Variant) -> Vec<bool> {
    (0..repo.packages.len() as PkgId)
        .into_par_iter()
        .map(|p| {
            let e = phase1::env(repo, variant, p, DepVars::NONE);
            let o = &repo.packages[p as usize].opam;
            o.available.eval_bool(&e, false) && missing_depexts(repo, variant, p).is_empty()
        })
        .collect()
}

/// The system packages `p` needs on this host that the host cannot provide.
pub fn missing_depexts<'a>(repo: &'a Repository, variant: &Variant, p: PkgId) -> Vec<&'a str> {
    let o = &repo.packages[p as usize].opam;
    if variant.missing_depexts.is_empty() || o.depexts.is_empty() {
        return Vec::new();
    }
    let e = phase1::env(repo, variant, p, DepVars::NONE);
    o.depexts
        .iter()
        .filter(|(_, f)| f.eval_bool(&e, false))
        .flat_map(|(names, _)| names.iter())
        .filter(|n| variant.missing_depexts.contains(n.as_str()))
        .map(String::as_str)
        .collect()
}

/// Every system package selected by some package's `depexts` on this host.
pub fn host_depexts(repo: &Repository, variant: &Variant) -> std::collections::BTreeSet<String> {
    let mut all = std::collections::BTreeSet::new();
    for p in 0..repo.packages.len() as PkgId {
        let e = phase1::env(repo, variant, p, DepVars::NONE);
        for (names, f) in &repo.packages[p as usize].opam.depexts {
            if f.eval_bool(&e, false) {
                all.extend(names.iter().cloned());
            }
        }
    }
    all
}

/// The part of the available universe a question about `pkgs` can touch:
/// everything their (and the roots') dependencies reach over any OR branch.
/// Packages outside it can always stay uninstalled, so encoding only this
/// part gives the same answers; it is skipped when the candidates already
/// cover much of the repository, where the walk would cost more than it saves.
fn universe_scope(
    repo: &Repository,
    variant: &Variant,
    avail: &[bool],
    test: bool,
    pkgs: &[PkgId],
    roots: [PkgId; 2],
) -> Vec<bool> {
    if pkgs.len() * 4 > repo.packages.len() {
        return avail.to_vec();
    }
    let mut seen = vec![false; avail.len()];
    let mut frontier: Vec<PkgId> = pkgs
        .iter()
        .copied()
        .chain(roots)
        .filter(|&p| avail[p as usize])
        .collect();
    for &p in &frontier {
        seen[p as usize] = true;
    }
    while !frontier.is_empty() {
        let next: Vec<Vec<PkgId>> = frontier
            .par_iter()
            .map(|&p| {
                let f = phase1::resolved_depends(
                    repo,
                    variant,
                    p,
                    phase1::universe_dep_vars(repo, p, test, true),
                    false,
                );
                let mut atoms = Vec::new();
                f.atoms(&mut atoms);
                atoms
                    .iter()
                    .flat_map(|a| phase1::matching(repo, a))
                    .filter(|&q| avail[q as usize])
                    .collect()
            })
            .collect();
        frontier.clear();
        for q in next.into_iter().flatten() {
            if !seen[q as usize] {
                seen[q as usize] = true;
                frontier.push(q);
            }
        }
    }
    seen
}

fn report((r, st): (Vec<bool>, crate::cone::Stats), test: bool) -> Vec<bool> {
    if std::env::var_os("OPAM_REVDEPS_STATS").is_some() {
        eprintln!("phase 2 (with-test {test}): {} candidates, {st:?}", r.len());
    }
    r
}

/// Phase 2 over a slice of phase 1's candidates: those that are coinstallable
/// with the target and the compiler, in the universe of each query that
/// selected them. Sorted as given.
pub fn phase2(
    repo: &Repository,
    variant: &Variant,
    target: PkgId,
    candidates: &[Candidate],
    jobs: usize,
) -> Vec<PkgId> {
    let Some(compiler) = repo
        .versions_of(&variant.compiler_name)
        .find(|&p| repo.version(p) == variant.compiler_version)
    else {
        return Vec::new();
    };
    let stats = std::env::var_os("OPAM_REVDEPS_STATS").is_some();
    let t = std::time::Instant::now();
    let avail = available(repo, variant);
    if stats {
        eprintln!("phase 2: availability in {:.3}s", t.elapsed().as_secs_f64());
    }
    let mut ok = vec![false; candidates.len()];
    // Without tests: `--depopts` and `--recursive`; then with tests:
    // `--with-test --depopts`, for those the first pass did not already prove.
    for test in [false, true] {
        let queries = if test {
            WITH_TEST_DEPOPTS
        } else {
            DEPOPTS | RECURSIVE
        };
        let idx: Vec<usize> = (0..candidates.len())
            .filter(|&i| candidates[i].queries & queries != 0 && !ok[i])
            .collect();
        if idx.is_empty() {
            continue;
        }
        let t = std::time::Instant::now();
        let pkgs: Vec<PkgId> = idx.iter().map(|&i| candidates[i].pkg).collect();
        let scope = universe_scope(repo, variant, &avail, test, &pkgs, [target, compiler]);
        let enc = Encoding::new(repo, variant, &scope, test);
        if stats {
            eprintln!(
                "phase 2: encoding (with-test {test}) in {:.3}s",
                t.elapsed().as_secs_f64()
            );
        }
        let known: Vec<AtomicBool> = (0..repo.packages.len())
            .map(|_| AtomicBool::new(false))
            .collect();
        let found = crate::cone::coinstallable(&enc, repo, target, compiler, &pkgs, &known, jobs);
        for (k, r) in report(found, test).into_iter().enumerate() {
            ok[idx[k]] |= r;
        }
    }
    candidates
        .iter()
        .zip(ok)
        .filter(|(_, b)| *b)
        .map(|(c, _)| c.pkg)
        .collect()
}

/// Can all of `pkgs` be installed together (at their exact versions) in the
/// universe of this variant, with or without tests? The general question
/// phase 2 asks three packages at a time.
pub fn installable_together(
    repo: &Repository,
    variant: &Variant,
    pkgs: &[PkgId],
    test: bool,
) -> bool {
    let avail = available(repo, variant);
    if pkgs.iter().any(|&p| !avail[p as usize]) {
        return false;
    }
    let enc = Encoding::new(repo, variant, &avail, test);
    let mut s = enc.solver(pkgs, &[]);
    s.solve_limited(&[]) == lbool::TRUE
}
