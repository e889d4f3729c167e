//! The two ways a reverse-dependency tool goes wrong, each shown on real
//! packages of the fixture: matching dependencies by name alone, and asking
//! whether a candidate installs on its own instead of together with the target.

mod fixture;

use opam_revdeps::phase1::{self, Query};
use opam_revdeps::phase2::installable_together;
use opam_revdeps::{revdeps, Variant};

fn variant() -> Variant {
    Variant::debian12("ocaml-base-compiler", "4.14.2")
}

/// prooftree.0.14 names coq in its depends, but only as
/// `"coq" {< "8.17" & >= "8.11"}` (next to `"coq-core" {>= "8.17"}`):
/// coq.9.1.1 does not satisfy it, so it is no `--depends-on coq.9.1.1`
/// candidate. Matching by name would list it.
#[test]
fn name_only_matching_is_wrong() {
    let repo = fixture::repo();
    let v = variant();
    let coq = repo.find("coq.9.1.1").expect("coq.9.1.1");
    let prooftree = repo.find("prooftree.0.14").expect("prooftree.0.14");
    let f = phase1::resolved_depends(repo, &v, prooftree, phase1::list_dep_vars(false), true);
    let mut atoms = Vec::new();
    f.atoms(&mut atoms);
    assert!(
        atoms.iter().any(|a| a.name == "coq"),
        "prooftree names coq: a name-only match would take it"
    );
    assert!(!phase1::verifies(&f, "coq", "9.1.1"));
    assert!(!phase1::depends_on(repo, &v, coq, false).contains(&prooftree));
    // It is still in the answer, but only through --recursive (its coq atom
    // under a disjunction gives the graph an edge to coq.9.1.1), as in opam's.
    let cands = phase1::phase1(repo, &v, coq, Query::Union);
    let c = cands
        .list
        .iter()
        .find(|c| c.pkg == prooftree)
        .expect("recursive candidate");
    assert_eq!(c.queries, phase1::RECURSIVE);

    // The other direction: mirage-runtime.4.10.0 depends on `"dune" {>= "2.9.0"}`
    // and `"dune" {>= "3.22"} | "lwt" {< "6"}`; dune.3.20.2 verifies it through
    // the lwt branch (opam evaluates the disjunctive normal form).
    let dune = repo.find("dune.3.20.2").expect("dune.3.20.2");
    let mirage = repo
        .find("mirage-runtime.4.10.0")
        .expect("mirage-runtime.4.10.0");
    assert!(phase1::depends_on(repo, &v, dune, false).contains(&mirage));
}

/// zenon.0.8.5 has coq only in `depopts` and `coq-core` in `conflicts`; it
/// installs fine on its own (and with coq-free installations), so a check of
/// the candidate alone keeps it. coq.9.1.1 needs coq-core.9.1.1, so no
/// installation holds both: opam leaves it out, and so must we.
#[test]
fn solving_the_candidate_alone_is_wrong() {
    let repo = fixture::repo();
    let v = variant();
    let coq = repo.find("coq.9.1.1").expect("coq.9.1.1");
    let zenon = repo.find("zenon.0.8.5").expect("zenon.0.8.5");
    let compiler = repo.find("ocaml-base-compiler.4.14.2").expect("compiler");
    let cands = phase1::phase1(repo, &v, coq, Query::Depopts);
    assert!(
        cands.list.iter().any(|c| c.pkg == zenon),
        "zenon is a --depopts candidate"
    );
    assert!(
        installable_together(repo, &v, &[compiler, zenon], false),
        "alone it installs"
    );
    assert!(
        installable_together(repo, &v, &[coq, compiler], false),
        "the target installs"
    );
    assert!(
        !installable_together(repo, &v, &[coq, compiler, zenon], false),
        "but not together"
    );
    let answer = revdeps(repo, &v, coq, Query::Union, 2);
    assert!(!answer.contains(&"zenon.0.8.5".to_string()));
    assert!(answer.contains(&"zenon_modulo.0.5.0".to_string()));
}
