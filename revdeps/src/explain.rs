//! Why one package version is in or out of the answer: which formula selects
//! it in phase 1, and whether (and why not) it is coinstallable in phase 2.

use crate::encoding::{in_model, Encoding, Origin, L};
use crate::formula::{Formula, RAtom};
use crate::phase1::{self, GraphAtom, Query, DEPOPTS, RECURSIVE, WITH_TEST_DEPOPTS};
use crate::phase2;
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
        if let Some(steps) = recursive_steps(repo, variant, &parent, pkg) {
            selected |= RECURSIVE;
            let mut chain = vec![repo.display(pkg)];
            chain.extend(steps.iter().map(|s| repo.display(s.to)));
            let _ = writeln!(out, "depends on {}", chain.join(" -> "));
            for s in &steps {
                let _ = writeln!(
                    out,
                    "    {} -> {}: {}",
                    repo.display(s.from),
                    repo.display(s.to),
                    s.reading
                );
            }
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
                .filter(|&q| in_model(&s, q))
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

/// One step `from -> to` of a `--recursive` chain, checked against opam's
/// rule for graph edges.
#[derive(Clone, Debug)]
pub struct Step {
    pub from: PkgId,
    pub to: PkgId,
    /// Whether `to`'s version is allowed, as opam's graph reads `from`'s depends.
    pub holds: bool,
    /// The atoms naming `to`'s package, how they are read, and the verdict.
    pub reading: String,
}

/// The chain from `pkg` to the target through the reverse closure
/// ([`phase1::reverse_closure`]'s `parent`), each step checked by
/// [`check_step`]; `None` when `pkg` is not in the closure.
pub fn recursive_steps(
    repo: &Repository,
    variant: &Variant,
    parent: &[Option<PkgId>],
    pkg: PkgId,
) -> Option<Vec<Step>> {
    parent[pkg as usize]?;
    let mut steps = Vec::new();
    let mut cur = pkg;
    while let Some(q) = parent[cur as usize] {
        steps.push(check_step(repo, variant, cur, q));
        cur = q;
    }
    Some(steps)
}

/// Whether `from`'s depends give the `--recursive` graph an edge to `to`.
///
/// This restates opam's rule ([`phase1::graph_edges`], from
/// `OpamCudf.strong_and_weak_deps`) over the formula's own OR/AND tree,
/// without building the CNF, so that the two can check each other:
///
/// - if every way of satisfying the formula needs `to`'s name (the CNF has
///   a clause naming it alone), `to`'s version must satisfy the constraint
///   the tree puts on the name: at an AND every constrained branch's, at
///   an OR some branch's;
/// - otherwise the name is optional, and one bound of one atom naming it
///   must allow the version (opam splits `{>= "1" & < "2"}` into two atoms
///   and, for an optional name, lets either give edges).
///
/// Atoms that opam drops after making the CNF (`{post}`) count as clauses
/// that vanish, as in [`GraphAtom`].
pub fn check_step(repo: &Repository, variant: &Variant, from: PkgId, to: PkgId) -> Step {
    let f = phase1::graph_formula(repo, variant, from);
    let (holds, reading) = check_edge(&f, repo.name(to), repo.version(to));
    Step {
        from,
        to,
        holds,
        reading,
    }
}

/// [`check_step`] on `from`'s graph formula ([`phase1::graph_formula`]):
/// whether `name.version` is allowed, and how the atoms naming it read.
pub fn check_edge(f: &Formula<GraphAtom>, name: &str, version: &str) -> (bool, String) {
    let (required, _) = required(f, name, version);
    let mut atoms: Vec<&GraphAtom> = Vec::new();
    f.atoms(&mut atoms);
    let naming: Vec<&&GraphAtom> = atoms
        .iter()
        .filter(|g| g.kept && g.atom.name == name)
        .collect();
    let holds = match required {
        Some(ok) => ok,
        None => naming.iter().any(|g| {
            let mut bounds = Vec::new();
            g.atom.vf.atoms(&mut bounds);
            bounds.is_empty()
                || bounds
                    .iter()
                    .any(|(op, c)| op.holds(crate::version::compare(version, c.as_str())))
        }),
    };
    let list: Vec<String> = naming
        .iter()
        .map(|g| format!("{} (line {})", g.atom, g.atom.pos.line))
        .collect();
    let how = if required.is_some() {
        "needed on every branch, so the version must satisfy the constraints as the ORs and ANDs combine them"
    } else {
        "optional (some OR branch does without it), so one bound of one atom must allow the version"
    };
    let reading = format!(
        "{}; {how}: {} {}",
        if list.is_empty() {
            format!("no atom names {name}")
        } else {
            list.join(", ")
        },
        if holds { "allowed" } else { "NOT allowed" },
        version
    );
    (holds, reading)
}

/// Over the CNF of `f`, without building it: whether some clause names only
/// `name` (after dropped atoms leave it) and, if so, whether `version` is in
/// the intersection of what those clauses allow (`Some(in)`), and whether
/// some clause holds only dropped atoms.
fn required(f: &Formula<GraphAtom>, name: &str, version: &str) -> (Option<bool>, bool) {
    match f {
        Formula::Empty => (None, false),
        Formula::Atom(g) if !g.kept => (None, true),
        Formula::Atom(g) if g.atom.name == name => (Some(g.atom.matches_version(version)), false),
        Formula::Atom(_) => (None, false),
        // The clauses of an AND are its branches' clauses.
        Formula::And(v) => {
            v.iter()
                .map(|x| required(x, name, version))
                .fold((None, false), |(i, d), (xi, xd)| {
                    let i = match (i, xi) {
                        (Some(a), Some(b)) => Some(a && b),
                        (a, b) => a.or(b),
                    };
                    (i, d || xd)
                })
        }
        // A clause of an OR joins one clause of each branch. It names only
        // `name` if each part does or is all dropped, and one part does.
        Formula::Or(v) => {
            let parts: Vec<(Option<bool>, bool)> = v
                .iter()
                .filter(|x| !matches!(x, Formula::Empty))
                .map(|x| required(x, name, version))
                .collect();
            let firm: Vec<&(Option<bool>, bool)> = parts.iter().filter(|p| !p.1).collect();
            if firm.is_empty() {
                // Every branch can drop out; any single branch's clause must hold.
                let i = parts.iter().filter_map(|p| p.0).reduce(|a, b| a && b);
                (i, true)
            } else if firm.iter().any(|p| p.0.is_none()) {
                (None, false)
            } else {
                (Some(firm.iter().any(|p| p.0 == Some(true))), false)
            }
        }
    }
}

/// opam's `OpamFormula.verifies` for `--depends-on` restated over the tree:
/// some conjunction of the disjunctive normal form names `name`, and every
/// atom of it naming `name` allows `version`. An independent check of
/// [`phase1::verifies`].
pub fn direct_holds(f: &Formula<RAtom>, name: &str, version: &str) -> bool {
    // (some conjunction has its `name` atoms all true, one with at least one)
    fn go(f: &Formula<RAtom>, name: &str, version: &str) -> (bool, bool) {
        match f {
            Formula::Empty => (true, false),
            Formula::Atom(a) if a.name == name => {
                let t = a.matches_version(version);
                (t, t)
            }
            Formula::Atom(_) => (true, false),
            Formula::And(v) => {
                let r: Vec<(bool, bool)> = v.iter().map(|x| go(x, name, version)).collect();
                let all = r.iter().all(|x| x.0);
                (all, all && r.iter().any(|x| x.1))
            }
            Formula::Or(v) => v
                .iter()
                .map(|x| go(x, name, version))
                .fold((false, false), |a, b| (a.0 || b.0, a.1 || b.1)),
        }
    }
    go(f, name, version).1
}
