//! opam reverse dependencies, exact and fast: for a target `T = name.version`
//! and a variant (compiler, host variables), the union of opam 2.1.2's
//! `opam list -s --depends-on T --coinstallable-with T,COMPILER --all-versions`
//! with `--depopts`, `--recursive` and `--with-test --depopts`, without T.
//!
//! # Layout
//!
//! - [`lexer`]: tokens of the opam file format, with line and column.
//! - [`parser`]: items, sections and values of an opam file.
//! - [`filter`]: filters and opam's three-valued evaluation of them.
//! - [`formula`]: package formulas with filtered version constraints, and their resolution.
//! - [`version`]: opam's Debian-like version order.
//! - [`package`]: the fields the question needs from one opam file.
//! - [`repository`]: every package version, read from a directory or a git object database.
//! - [`variant`]: the compiler and host variables, and a package's variable environment.
//! - [`phase1`]: one pass over the repository: candidates by version-aware
//!   matching, the reverse-dependency table and its closure for `--recursive`.
//! - [`phase2`]: coinstallability per candidate with a SAT solver under
//!   assumptions, in parallel; shardable over slices of the candidate list.
//! - [`encoding`]: a universe as CNF (`Encoding`, literals `L`, each clause's `Origin`).
//! - [`cone`]: one small SAT instance per candidate, cut to its dependency cone.
//! - [`explain`]: why one package is in or out of the answer.
//! - [`answer`]: the order answers are printed in.
//! - [`error`]: errors with file and line.
//!
//! # How opam 2.1.2 answers, and where that is reproduced
//!
//! - `--depends-on` ([`phase1::verifies`]): the package's `depends` and
//!   `depopts`, filtered with `build`, no `post`, `with-test` as asked, no
//!   `with-doc`/`dev` and the variant's variables, put in disjunctive normal
//!   form; each conjunction keeps only its atoms naming the target, and one
//!   of them must hold for the target's version.
//! - `--recursive` ([`phase1::reverse_graph`]): the reverse closure of the
//!   dependency graph over every package, available or not, with opam's
//!   edges ([`phase1::graph_edges`]: `OpamCudf.strong_and_weak_deps` over
//!   the CNF of `depends`): a package that every OR branch names keeps the
//!   ranges the branches give it, atoms of one name intersect, and only a
//!   package that some branch does without gets edges from each of its
//!   bounds alone.
//! - `--coinstallable-with T,COMPILER` ([`phase2`]): some installation of
//!   available packages holds T, the compiler and the candidate at their
//!   versions, with `depends` (`build` and `post` true, `with-test` for every
//!   package when asked, `dev` for development packages), one version per
//!   name, `conflicts` and `conflict-class`. "Available" is the `available`
//!   filter and, as opam 2.1 checks system dependencies, no `depexts` the
//!   host lacks ([`Variant::missing_depexts`]).
//! - Versions compare as in opam 2.1 ([`version`]); answers print in the
//!   reference files' order ([`answer`]).
//!
//! The orchestrator's calls, in order:
//!
//! ```no_run
//! use opam_revdeps::{phase1, phase2, Query, Repository, Source, Variant};
//! let repo = Repository::load(&Source::parse("/path/to/opam-repository:HEAD"))?;
//! let variant = Variant::debian12("ocaml-base-compiler", "4.14.2");
//! let target = repo.find("coq.9.1.1")?;
//! let cands = phase1(&repo, &variant, target, Query::Union);
//! // Any slice of `cands.list` can be checked on its own, e.g. on another machine.
//! let (a, b) = cands.list.split_at(cands.list.len() / 2);
//! let mut found = phase2(&repo, &variant, target, a, 2);
//! found.extend(phase2(&repo, &variant, target, b, 2));
//! let lines = opam_revdeps::answer::lines(&repo, Query::Union, &found);
//! # Ok::<(), opam_revdeps::error::Error>(())
//! ```

pub mod answer;
pub mod cone;
pub mod encoding;
pub mod error;
pub mod explain;
pub mod filter;
pub mod formula;
pub mod lexer;
pub mod package;
pub mod parser;
pub mod phase1;
pub mod phase2;
pub mod repository;
pub mod variant;
pub mod version;

pub use phase1::{phase1, Candidate, Candidates, Query};
pub use phase2::phase2;
pub use repository::{PkgId, Repository, Source};
pub use variant::Variant;

/// Both phases for one query, in the order of the reference answers.
pub fn revdeps(
    repo: &Repository,
    variant: &Variant,
    target: PkgId,
    query: Query,
    jobs: usize,
) -> Vec<String> {
    let cands = phase1(repo, variant, target, query);
    let found = phase2(repo, variant, target, &cands.list, jobs);
    answer::lines(repo, query, &found)
}
