//! Per-candidate SAT instances cut down to the candidate's dependency cone.
//!
//! A package outside the cone of {target, compiler, candidate} (everything
//! their dependency clauses can reach, over every OR branch) can always be
//! left uninstalled: nothing inside needs it, and conflicts only forbid. So
//! the question "is there an installation with all three?" is asked of a
//! small solver holding only the cone, not of the whole universe — a solver
//! over the universe has to assign every one of its variables on every call,
//! which is what made the global instance slow (≈5 ms a call on dune).
//! Variables that the target and the compiler already force false (level-0
//! propagation of the universe) are cut from the cone before the search.

use crate::encoding::{Encoding, L};
use crate::repository::{PkgId, Repository};
use batsat::{lbool, BasicSolver, Lit, SolverInterface, Var};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Level-0 consequences of installing the target and the compiler:
/// `Some(dead)` per variable, or `None` if the two cannot be installed together.
pub fn level0(enc: &Encoding, target: PkgId, compiler: PkgId) -> Option<Vec<bool>> {
    if !enc.available[target as usize] || !enc.available[compiler as usize] {
        return None;
    }
    let mut s = enc.solver(&[target, compiler], &[]);
    if !s.simplify() || !s.is_ok() {
        return None;
    }
    Some(
        (0..enc.nvars)
            .map(|v| s.value_lvl_0(L(v, true).lit()) == lbool::FALSE)
            .collect(),
    )
}

/// Reusable per-thread buffers: local variable numbers by global variable.
struct Scratch {
    local: Vec<u32>,
    order: Vec<u32>,
}

const NONE: u32 = u32::MAX;

impl Scratch {
    fn new(n: u32) -> Self {
        Scratch {
            local: vec![NONE; n as usize],
            order: Vec::new(),
        }
    }
    fn visit(&mut self, v: u32) -> bool {
        if self.local[v as usize] != NONE {
            return false;
        }
        self.local[v as usize] = self.order.len() as u32;
        self.order.push(v);
        true
    }
    fn clear(&mut self) {
        for &v in &self.order {
            self.local[v as usize] = NONE;
        }
        self.order.clear();
    }
}

fn lit(v: u32, sign: bool) -> Lit {
    // Local variables are created in index order before any clause is added.
    Lit::new(Var::unsafe_from_idx(v), sign)
}

/// The cone instance of `roots`; `None` when a root is already dead.
fn build(
    enc: &Encoding,
    repo: &Repository,
    dead: &[bool],
    prefer: &[bool],
    roots: &[PkgId],
    sc: &mut Scratch,
) -> Option<BasicSolver> {
    sc.clear();
    for &r in roots {
        if dead[r as usize] {
            return None;
        }
        sc.visit(r);
    }
    let mut i = 0;
    while i < sc.order.len() {
        let v = sc.order[i];
        i += 1;
        for &ci in &enc.heads[v as usize] {
            for l in &enc.clauses[ci as usize][1..] {
                if l.1 && !dead[l.0 as usize] {
                    sc.visit(l.0);
                }
            }
        }
    }
    let npk = repo.packages.len() as u32;
    let mut s = BasicSolver::default();
    for &v in &sc.order {
        // Leaning towards installing other candidates makes each installation
        // found prove more of them at once.
        let pol = if prefer.get(v as usize).copied().unwrap_or(false) {
            lbool::TRUE
        } else {
            lbool::UNDEF
        };
        s.new_var(pol, true);
    }
    let mut buf: Vec<Lit> = Vec::new();
    let mut pkgs: Vec<u32> = Vec::new();
    for (li, &v) in sc.order.iter().enumerate() {
        if v < npk {
            pkgs.push(v);
        }
        for &ci in &enc.heads[v as usize] {
            buf.clear();
            buf.push(lit(li as u32, false));
            for l in &enc.clauses[ci as usize][1..] {
                if l.1 && !dead[l.0 as usize] {
                    buf.push(lit(sc.local[l.0 as usize], true));
                }
            }
            s.add_clause_reuse(&mut buf);
        }
        if v < npk {
            for &q in &enc.conflicts[v as usize] {
                let lq = sc.local[q as usize];
                if lq != NONE && q > v {
                    buf.clear();
                    buf.push(lit(li as u32, false));
                    buf.push(lit(lq, false));
                    s.add_clause_reuse(&mut buf);
                }
            }
        }
    }
    // One version per name; pairwise, these groups are small inside a cone.
    pkgs.sort_unstable_by_key(|&p| repo.packages[p as usize].name);
    for g in
        pkgs.chunk_by(|&a, &b| repo.packages[a as usize].name == repo.packages[b as usize].name)
    {
        at_most_one(
            &mut s,
            &g.iter().map(|&p| sc.local[p as usize]).collect::<Vec<_>>(),
            &mut buf,
        );
    }
    // Conflict classes: one name per class.
    let mut by_class: Vec<(u32, u32, u32)> = Vec::new();
    for &p in &pkgs {
        for &c in &enc.classes[p as usize] {
            by_class.push((c, repo.packages[p as usize].name, sc.local[p as usize]));
        }
    }
    by_class.sort_unstable();
    for g in by_class.chunk_by(|a, b| a.0 == b.0) {
        let names: Vec<&[(u32, u32, u32)]> = g.chunk_by(|a, b| a.1 == b.1).collect();
        if names.len() < 2 {
            continue;
        }
        let mut uses = Vec::new();
        for members in names {
            let u = s.new_var(lbool::UNDEF, true).idx();
            for m in members {
                buf.clear();
                buf.push(lit(m.2, false));
                buf.push(lit(u, true));
                s.add_clause_reuse(&mut buf);
            }
            uses.push(u);
        }
        at_most_one(&mut s, &uses, &mut buf);
    }
    for &r in roots {
        buf.clear();
        buf.push(lit(sc.local[r as usize], true));
        s.add_clause_reuse(&mut buf);
    }
    Some(s)
}

fn at_most_one(s: &mut BasicSolver, vs: &[u32], buf: &mut Vec<Lit>) {
    if vs.len() <= 8 {
        for i in 0..vs.len() {
            for j in i + 1..vs.len() {
                buf.clear();
                buf.push(lit(vs[i], false));
                buf.push(lit(vs[j], false));
                s.add_clause_reuse(buf);
            }
        }
        return;
    }
    // Sequential counter (Sinz 2005).
    let n = vs.len();
    let aux: Vec<u32> = (0..n - 1)
        .map(|_| s.new_var(lbool::UNDEF, true).idx())
        .collect();
    let mut add = |a: Lit, b: Lit| {
        buf.clear();
        buf.push(a);
        buf.push(b);
        s.add_clause_reuse(buf);
    };
    add(lit(vs[0], false), lit(aux[0], true));
    for i in 1..n - 1 {
        add(lit(vs[i], false), lit(aux[i], true));
        add(lit(aux[i - 1], false), lit(aux[i], true));
        add(lit(vs[i], false), lit(aux[i - 1], false));
    }
    add(lit(vs[n - 1], false), lit(aux[n - 2], false));
}

/// Counters of one run, for the progress line.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub solves: usize,
    pub satisfiable: usize,
    pub harvested: usize,
}

/// Coinstallability of each of `pkgs` with `target` and `compiler` in the
/// universe `enc`, on `jobs` threads. `known` marks packages already proven
/// coinstallable and receives every candidate a found installation contains.
#[allow(clippy::too_many_arguments)]
pub fn coinstallable(
    enc: &Encoding,
    repo: &Repository,
    target: PkgId,
    compiler: PkgId,
    pkgs: &[PkgId],
    known: &[AtomicBool],
    jobs: usize,
) -> (Vec<bool>, Stats) {
    // Level-0 pruning pays for itself only over many candidates; without it
    // the cones are larger but the answers the same.
    let dead = if pkgs.len() >= 1000 {
        match level0(enc, target, compiler) {
            Some(d) => d,
            None => return (vec![false; pkgs.len()], Stats::default()),
        }
    } else if enc.available[target as usize] && enc.available[compiler as usize] {
        vec![false; enc.nvars as usize]
    } else {
        return (vec![false; pkgs.len()], Stats::default());
    };
    let mut wanted = vec![false; repo.packages.len()];
    for &p in pkgs {
        wanted[p as usize] = true;
    }
    let next = AtomicUsize::new(0);
    let solves = AtomicUsize::new(0);
    let sats = AtomicUsize::new(0);
    let harvested = AtomicUsize::new(0);
    let result: Vec<AtomicBool> = (0..pkgs.len()).map(|_| AtomicBool::new(false)).collect();
    let work = || {
        let mut sc = Scratch::new(enc.nvars);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= pkgs.len() {
                break;
            }
            let p = pkgs[i];
            if !enc.available[p as usize] {
                continue;
            }
            if known[p as usize].load(Ordering::Relaxed) {
                result[i].store(true, Ordering::Relaxed);
                continue;
            }
            let Some(mut s) = build(enc, repo, &dead, &wanted, &[target, compiler, p], &mut sc)
            else {
                continue;
            };
            solves.fetch_add(1, Ordering::Relaxed);
            if s.solve_limited(&[]) == lbool::TRUE {
                sats.fetch_add(1, Ordering::Relaxed);
                result[i].store(true, Ordering::Relaxed);
                for (li, &v) in sc.order.iter().enumerate() {
                    if (v as usize) < wanted.len()
                        && wanted[v as usize]
                        && s.value_lit(lit(li as u32, true)) == lbool::TRUE
                        && !known[v as usize].swap(true, Ordering::Relaxed)
                    {
                        harvested.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    };
    let jobs = jobs.max(1).min(pkgs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 1..jobs {
            scope.spawn(work);
        }
        work();
    });
    let stats = Stats {
        solves: solves.into_inner(),
        satisfiable: sats.into_inner(),
        harvested: harvested.into_inner(),
    };
    (result.into_iter().map(|b| b.into_inner()).collect(), stats)
}
