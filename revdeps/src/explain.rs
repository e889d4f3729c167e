//! Why one package version is in or out of the answer: which formula selects
//! it in phase 1, and whether (and why not) it is coinstallable in phase 2.

use crate::formula::{Formula, RAtom};
use crate::phase1::{self, Query, DEPOPTS, RECURSIVE, WITH_TEST_DEPOPTS};
use crate::phase2::{self, Encoding, Origin, L};
use crate::repository::{PkgId, Repository};
use crate::variant::Variant;
use batsat::{lbool, SolverInterface};
use std::fmt::Write;

/// A human-readable account of `pkg`'s fate for `query`.
pub fn explain(
    repo: &Repository,
    variant: &Variant,
    target: PkgId,
    pkg: PkgId,
    query: Query,
) -> String {
    let mut out = String::new();
    let (tn, tv) = (repo.name(target), repo.version(target));
    let p = &repo.packages[pkg as usize];
    let _ = writeln!(
        out,
        "{} ({}), target {}",
        repo.display(pkg),
        p.file,
        repo.display(target)
    );
    if pkg == target {
        let _ = writeln!(out, "  OUT: the target itself is never listed");
        return out;
    }
    let flags = query.flags();
    let mut selected = 0u8;
    for (flag, test, label) in [
        (DEPOPTS, false, "--depopts"),
        (WITH_TEST_DEPOPTS, true, "--with-test --depopts"),
    ] {
        if flags & flag == 0 {
            continue;
        }
        let f = phase1::resolved_depends(repo, variant, pkg, phase1::list_dep_vars(test), true);
        let mut atoms: Vec<&RAtom> = Vec::new();
        f.atoms(&mut atoms);
        let naming: Vec<&&RAtom> = atoms.iter().filter(|a| a.name == tn).collect();
        let ok = phase1::verifies(&f, tn, tv);
        if ok {
            selected |= flag;
        }
        let _ = write!(out, "  phase 1 {label}: ");
        if naming.is_empty() {
            let _ = writeln!(
                out,
                "no depends/depopts atom naming {tn} survives the filters"
            );
        } else {
            let list: Vec<String> = naming
                .iter()
                .map(|a| format!("{a} (line {})", a.pos.line))
                .collect();
            let verdict = if ok { "satisfied" } else { "not satisfied" };
            let _ = writeln!(out, "{} — {verdict} by {tn}.{tv}", list.join(", "));
        }
    }
    if flags & RECURSIVE != 0 {
        let rev = phase1::reverse_graph(repo, variant);
        let parent = phase1::reverse_closure(&rev, target);
        let _ = write!(out, "  phase 1 --recursive: ");
        if parent[pkg as usize].is_some() {
            selected |= RECURSIVE;
            let mut chain = vec![repo.display(pkg)];
            let mut cur = pkg;
            while let Some(q) = parent[cur as usize] {
                chain.push(repo.display(q));
                cur = q;
            }
            let _ = writeln!(
                out,
                "depends (through some OR branch) on {}",
                chain.join(" -> ")
            );
        } else {
            let _ = writeln!(
                out,
                "not in the reverse dependency closure of {}",
                repo.display(target)
            );
        }
    }
    if selected == 0 {
        let _ = writeln!(out, "  OUT: not a candidate of {query:?}");
        return out;
    }
    let Some(compiler) = repo
        .versions_of(&variant.compiler_name)
        .find(|&q| repo.version(q) == variant.compiler_version)
    else {
        let _ = writeln!(
            out,
            "  OUT: compiler {}.{} is not in the repository",
            variant.compiler_name, variant.compiler_version
        );
        return out;
    };
    let avail = phase2::available(repo, variant);
    let universes: Vec<bool> = [
        (selected & (DEPOPTS | RECURSIVE) != 0, false),
        (selected & WITH_TEST_DEPOPTS != 0, true),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, t)| t)
    .collect();
    let mut any = false;
    for test in universes {
        let label = if test { "with tests" } else { "without tests" };
        for (q, what) in [
            (pkg, "it"),
            (target, "the target"),
            (compiler, "the compiler"),
        ] {
            if !avail[q as usize] {
                let line = repo.packages[q as usize].opam.available_line;
                let missing = phase2::missing_depexts(repo, variant, q);
                let why = if missing.is_empty() {
                    format!("its `available` (line {line}) is false here")
                } else {
                    format!(
                        "it needs system packages this host lacks: {}",
                        missing.join(", ")
                    )
                };
                let _ = writeln!(
                    out,
                    "  phase 2 ({label}): {what} ({}) is not available: {why}",
                    repo.display(q)
                );
            }
        }
        if ![pkg, target, compiler].iter().all(|&q| avail[q as usize]) {
            continue;
        }
        let enc = Encoding::new(repo, variant, &avail, test);
        let mut s = enc.solver(&[], &[]);
        let assume = [L(target, true), L(compiler, true), L(pkg, true)];
        let lits: Vec<_> = assume.iter().map(|l| l.lit()).collect();
        if s.solve_limited(&lits) == lbool::TRUE {
            any = true;
            let witness: Vec<String> = (0..repo.packages.len() as PkgId)
                .filter(|&q| phase2::in_model(&s, q))
                .map(|q| repo.display(q))
                .collect();
            let _ = writeln!(
                out,
                "  phase 2 ({label}): coinstallable — with the target and the compiler in this installation of {} packages: {}",
                witness.len(),
                witness.join(" ")
            );
            continue;
        }
        let core: Vec<String> = s
            .unsat_core()
            .iter()
            .map(|l| repo.display(l.var().idx() as PkgId))
            .collect();
        let _ = writeln!(
            out,
            "  phase 2 ({label}): NOT coinstallable; the conflict involves {}",
            core.join(", ")
        );
        // Which pairs alone already fail?
        for (a, b) in [(pkg, target), (pkg, compiler)] {
            let l = |x: PkgId| L(x, true).lit();
            if s.solve_limited(&[l(a), l(b)]) != lbool::TRUE {
                let _ = writeln!(
                    out,
                    "    {} and {} cannot be installed together",
                    repo.display(a),
                    repo.display(b)
                );
            }
        }
        let direct: Vec<String> = enc
            .clauses
            .iter()
            .zip(&enc.origins)
            .filter_map(|(c, o)| match o {
                Origin::Conflict(a, b)
                    if (*a == pkg && (*b == target || *b == compiler))
                        || (*b == pkg && (*a == target || *a == compiler)) =>
                {
                    let _ = c;
                    Some(format!(
                        "{} conflicts with {}",
                        repo.display(*a),
                        repo.display(*b)
                    ))
                }
                _ => None,
            })
            .collect();
        for d in direct {
            let _ = writeln!(out, "    {d}");
        }
        explain_unsatisfiable_atoms(repo, variant, pkg, test, &avail, &mut out);
    }
    let _ = writeln!(out, "  {}", if any { "IN" } else { "OUT" });
    out
}

/// Dependencies of `pkg` that no available version satisfies.
fn explain_unsatisfiable_atoms(
    repo: &Repository,
    variant: &Variant,
    pkg: PkgId,
    test: bool,
    avail: &[bool],
    out: &mut String,
) {
    let f: Formula<RAtom> = phase1::resolved_depends(
        repo,
        variant,
        pkg,
        phase1::universe_dep_vars(repo, pkg, test, true),
        false,
    );
    let mut atoms = Vec::new();
    f.atoms(&mut atoms);
    for a in atoms {
        if !phase1::matching(repo, a).any(|q| avail[q as usize]) {
            let _ = writeln!(
                out,
                "    no available version of {a} (depends, line {})",
                a.pos.line
            );
            for q in phase1::matching(repo, a) {
                let missing = phase2::missing_depexts(repo, variant, q);
                if !missing.is_empty() {
                    let _ = writeln!(
                        out,
                        "      {} needs system packages this host lacks: {}",
                        repo.display(q),
                        missing.join(", ")
                    );
                }
            }
        }
    }
}
