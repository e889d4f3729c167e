//! The CNF of one opam universe: literals, clauses and why each exists.
//!
//! Package variable `p` means "p is installed"; auxiliaries (Tseitin
//! variables for nested conjunctions, sequential-counter and conflict-class
//! variables) follow the packages. Every clause records its [`Origin`], which
//! `explain` turns into reasons; [`Encoding::heads`], [`Encoding::conflicts`]
//! and [`Encoding::classes`] index the clauses for `cone`'s walk.

use crate::formula::{resolve, Formula, RAtom};
use crate::phase1;
use crate::repository::{PkgId, Repository};
use crate::variant::{DepVars, Variant};
use batsat::{lbool, BasicSolver, Lit, SolverInterface, Var};
use rayon::prelude::*;

/// A literal: variable index (packages first, then auxiliaries) and sign.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L(pub u32, pub bool);

impl L {
    pub fn lit(self) -> Lit {
        // Variables are created in index order, so every index below `nvars` exists.
        Lit::new(Var::unsafe_from_idx(self.0), self.1)
    }
}

/// Why a clause exists, for explanations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Depends(PkgId),
    OneVersion(u32),
    Conflict(PkgId, PkgId),
    ConflictClass(PkgId),
}

/// The CNF of one universe: package variable `p` is "p is installed".
pub struct Encoding {
    pub nvars: u32,
    pub clauses: Vec<Vec<L>>,
    pub origins: Vec<Origin>,
    /// `available` evaluated for every package version.
    pub available: Vec<bool>,
    pub test: bool,
    /// Per variable, the dependency clauses it heads (`¬v ∨ options…`): what
    /// installing it obliges. Package variables come first, then auxiliaries.
    pub heads: Vec<Vec<u32>>,
    /// Per package, the available packages it conflicts with (either side declared).
    pub conflicts: Vec<Vec<PkgId>>,
    /// Per package, the conflict classes (indices) it belongs to.
    pub classes: Vec<Vec<u32>>,
}

impl Encoding {
    pub fn new(repo: &Repository, variant: &Variant, avail: &[bool], test: bool) -> Encoding {
        let n = repo.packages.len() as u32;
        let mut enc = Encoding {
            nvars: n,
            clauses: Vec::new(),
            origins: Vec::new(),
            available: avail.to_vec(),
            test,
            heads: vec![Vec::new(); n as usize],
            conflicts: vec![Vec::new(); n as usize],
            classes: vec![Vec::new(); n as usize],
        };
        // Dependencies and conflicts, resolved in parallel, encoded in order.
        let resolved: Vec<Option<(Formula<RAtom>, Vec<PkgId>)>> = (0..n)
            .into_par_iter()
            .map(|p| {
                if !avail[p as usize] {
                    return None;
                }
                let deps = phase1::resolved_depends(
                    repo,
                    variant,
                    p,
                    phase1::universe_dep_vars(repo, p, test, true),
                    false,
                );
                let e = phase1::env(repo, variant, p, DepVars::NONE);
                let cf = resolve(&repo.packages[p as usize].opam.conflicts, &e);
                let mut atoms = Vec::new();
                cf.atoms(&mut atoms);
                let mut conf: Vec<PkgId> = atoms
                    .iter()
                    .flat_map(|a| phase1::matching(repo, a))
                    .filter(|&q| q != p && avail[q as usize])
                    .collect();
                conf.sort_unstable();
                conf.dedup();
                Some((deps, conf))
            })
            .collect();
        for (p, r) in resolved.iter().enumerate() {
            let Some((deps, conf)) = r else { continue };
            let p = p as PkgId;
            enc.implies(repo, p, deps);
            for &q in conf {
                enc.push(vec![L(p, false), L(q, false)], Origin::Conflict(p, q));
                enc.conflicts[p as usize].push(q);
                enc.conflicts[q as usize].push(p);
            }
        }
        for c in enc.conflicts.iter_mut() {
            c.sort_unstable();
            c.dedup();
        }
        // At most one version per name.
        for name in 0..repo.names.len() as u32 {
            let vs: Vec<u32> = repo.versions(name).filter(|&p| avail[p as usize]).collect();
            let lits: Vec<L> = vs.iter().map(|&p| L(p, true)).collect();
            enc.at_most_one(&lits, Origin::OneVersion(name));
        }
        // Conflict classes: at most one name per class.
        let mut classes: std::collections::BTreeMap<
            &str,
            std::collections::BTreeMap<u32, Vec<PkgId>>,
        > = Default::default();
        for p in 0..n {
            if !avail[p as usize] {
                continue;
            }
            let pk = &repo.packages[p as usize];
            for c in &pk.opam.conflict_class {
                classes
                    .entry(c.as_str())
                    .or_default()
                    .entry(pk.name)
                    .or_default()
                    .push(p);
            }
        }
        for (ci, members) in classes.values().enumerate() {
            for ps in members.values() {
                for &p in ps {
                    enc.classes[p as usize].push(ci as u32);
                }
            }
            if members.len() < 2 {
                continue;
            }
            let mut uses = Vec::new();
            for ps in members.values() {
                let u = enc.fresh();
                for &p in ps {
                    enc.push(vec![L(p, false), L(u, true)], Origin::ConflictClass(p));
                }
                uses.push(L(u, true));
            }
            let first = members
                .values()
                .next()
                .and_then(|v| v.first())
                .copied()
                .unwrap_or(0);
            enc.at_most_one(&uses, Origin::ConflictClass(first));
        }
        enc
    }

    fn fresh(&mut self) -> u32 {
        self.nvars += 1;
        self.heads.push(Vec::new());
        self.nvars - 1
    }

    fn push(&mut self, c: Vec<L>, o: Origin) {
        if let (Origin::Depends(_), Some(h)) = (o, c.first()) {
            self.heads[h.0 as usize].push(self.clauses.len() as u32);
        }
        self.clauses.push(c);
        self.origins.push(o);
    }

    /// `p → f`, Tseitin-style: one clause per conjunct, auxiliaries for
    /// conjunctions nested in disjunctions.
    fn implies(&mut self, repo: &Repository, p: PkgId, f: &Formula<RAtom>) {
        match f {
            Formula::Empty => {}
            Formula::And(v) => v.iter().for_each(|x| self.implies(repo, p, x)),
            _ => {
                let mut c = vec![L(p, false)];
                if self.disjunct(repo, p, f, &mut c) {
                    self.push(c, Origin::Depends(p));
                }
            }
        }
    }

    /// Appends literals whose disjunction implies `f`; false if `f` is trivially true.
    fn disjunct(
        &mut self,
        repo: &Repository,
        p: PkgId,
        f: &Formula<RAtom>,
        out: &mut Vec<L>,
    ) -> bool {
        match f {
            Formula::Empty => false,
            Formula::Atom(a) => {
                out.extend(
                    phase1::matching(repo, a)
                        .filter(|&q| self.available[q as usize])
                        .map(|q| L(q, true)),
                );
                true
            }
            Formula::Or(v) => {
                for x in v {
                    if !self.disjunct(repo, p, x, out) {
                        return false;
                    }
                }
                true
            }
            Formula::And(v) => {
                let y = self.fresh();
                for x in v {
                    let mut c = vec![L(y, false)];
                    if self.disjunct(repo, p, x, &mut c) {
                        self.push(c, Origin::Depends(p));
                    }
                }
                out.push(L(y, true));
                true
            }
        }
    }

    /// Pairwise for a few literals, a sequential counter (Sinz 2005) beyond.
    fn at_most_one(&mut self, lits: &[L], o: Origin) {
        if lits.len() <= 6 {
            for i in 0..lits.len() {
                for j in i + 1..lits.len() {
                    self.push(vec![L(lits[i].0, false), L(lits[j].0, false)], o);
                }
            }
            return;
        }
        let n = lits.len();
        let s: Vec<u32> = (0..n - 1).map(|_| self.fresh()).collect();
        self.push(vec![L(lits[0].0, false), L(s[0], true)], o);
        for i in 1..n - 1 {
            self.push(vec![L(lits[i].0, false), L(s[i], true)], o);
            self.push(vec![L(s[i - 1], false), L(s[i], true)], o);
            self.push(vec![L(lits[i].0, false), L(s[i - 1], false)], o);
        }
        self.push(vec![L(lits[n - 1].0, false), L(s[n - 2], false)], o);
    }

    /// A fresh solver holding this CNF plus the given unit clauses; `prefer`
    /// marks package variables the search should try to install first.
    pub fn solver(&self, units: &[PkgId], prefer: &[bool]) -> BasicSolver {
        let mut s = BasicSolver::default();
        for v in 0..self.nvars {
            let pol = if (v as usize) < prefer.len() && prefer[v as usize] {
                lbool::TRUE
            } else {
                lbool::UNDEF
            };
            s.new_var(pol, true);
        }
        let mut buf = Vec::new();
        for c in &self.clauses {
            buf.clear();
            buf.extend(c.iter().map(|l| l.lit()));
            s.add_clause_reuse(&mut buf);
        }
        for &u in units {
            let mut c = vec![L(u, true).lit()];
            s.add_clause_reuse(&mut c);
        }
        s
    }
}

/// Is `pkg` installed in the solver's current model?
pub fn in_model(s: &BasicSolver, pkg: PkgId) -> bool {
    s.value_lit(L(pkg, true).lit()) == lbool::TRUE
}
