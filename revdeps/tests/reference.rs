//! Every query and the union match opam 2.1.2's reference answers exactly,
//! line for line and in the same order, for every target in the fixtures
//! and in `tests/reference`.

mod fixture;

use opam_revdeps::{revdeps, Query, Variant};

fn check(compiler_version: &str, target: &str, query: Query, file: &str) {
    let compiler = format!("ocaml-base-compiler.{compiler_version}");
    let want = fixture::reference(&compiler, target, file);
    check_against(compiler_version, target, query, file, want);
}

/// Against the answers kept in `tests/reference` (see its README).
fn check_local(compiler_version: &str, target: &str) {
    let compiler = format!("ocaml-base-compiler.{compiler_version}");
    for (query, file) in [
        (Query::Depopts, "depopts.txt"),
        (Query::Recursive, "recursive.txt"),
        (Query::WithTestDepopts, "with-test-depopts.txt"),
        (Query::Union, "union.txt"),
    ] {
        let want = fixture::local_reference(&compiler, target, file);
        check_against(compiler_version, target, query, file, want);
    }
}

fn check_against(
    compiler_version: &str,
    target: &str,
    query: Query,
    file: &str,
    mut want: Vec<String>,
) {
    let repo = fixture::repo();
    let variant = Variant::debian12("ocaml-base-compiler", compiler_version);
    let t = repo.find(target).expect("target in fixture");
    let got = revdeps(repo, &variant, t, query, 2);
    // The CLI never lists the target; opam's --recursive does.
    want.retain(|l| l != target);
    if got != want {
        let extra: Vec<_> = got.iter().filter(|l| !want.contains(l)).take(20).collect();
        let missing: Vec<_> = want.iter().filter(|l| !got.contains(l)).take(20).collect();
        panic!(
            "{target} on {compiler_version}, {file}: {} lines, want {}\n  extra: {extra:?}\n  missing: {missing:?}",
            got.len(),
            want.len()
        );
    }
}

#[test]
fn coq_4_14_2() {
    check("4.14.2", "coq.9.1.1", Query::Depopts, "depopts.txt");
    check("4.14.2", "coq.9.1.1", Query::Recursive, "recursive.txt");
    check(
        "4.14.2",
        "coq.9.1.1",
        Query::WithTestDepopts,
        "with-test-depopts.txt",
    );
    check("4.14.2", "coq.9.1.1", Query::Union, "union.txt");
}

#[test]
fn coq_5_5_0() {
    check("5.5.0", "coq.9.1.1", Query::Depopts, "depopts.txt");
    check("5.5.0", "coq.9.1.1", Query::Recursive, "recursive.txt");
    check(
        "5.5.0",
        "coq.9.1.1",
        Query::WithTestDepopts,
        "with-test-depopts.txt",
    );
    check("5.5.0", "coq.9.1.1", Query::Union, "union.txt");
}

#[test]
fn dune_4_14_2_union() {
    check("4.14.2", "dune.3.20.2", Query::Union, "union.txt");
}

#[test]
fn dune_4_14_2_depopts() {
    check("4.14.2", "dune.3.20.2", Query::Depopts, "depopts.txt");
}

#[test]
fn dune_4_14_2_recursive() {
    check("4.14.2", "dune.3.20.2", Query::Recursive, "recursive.txt");
}

#[test]
fn dune_4_14_2_with_test_depopts() {
    check(
        "4.14.2",
        "dune.3.20.2",
        Query::WithTestDepopts,
        "with-test-depopts.txt",
    );
}

/// Issue #10: satyrographos.0.0.2.11 and .13 name opam-state in both
/// branches of an OR, with ranges that exclude the opam-state on the way to
/// cmdliner; opam lists neither.
#[test]
fn cmdliner_4_14_2() {
    check_local("4.14.2", "cmdliner.1.3.0");
}

// Targets that other packages depend on through OR branches, or through
// several atoms of one name; what each leans on is in tests/reference/README.md.

#[test]
fn opam_state_4_14_2() {
    check_local("4.14.2", "opam-state.2.5.2");
}

#[test]
fn protocol_9p_4_14_2() {
    check_local("4.14.2", "protocol-9p.2.1.0");
}

#[test]
fn cohttp_lwt_jsoo_4_14_2() {
    check_local("4.14.2", "cohttp-lwt-jsoo.6.3.0");
}

#[test]
fn alt_ergo_free_4_14_2() {
    check_local("4.14.2", "alt-ergo-free.2.4.3");
}

#[test]
fn memprof_limits_4_14_2() {
    check_local("4.14.2", "memprof-limits.0.3.0");
}

#[test]
fn lablgtk3_4_14_2() {
    check_local("4.14.2", "lablgtk3.3.1.5-1");
}

#[test]
fn cmdliner_2_1_1_4_14_2() {
    check_local("4.14.2", "cmdliner.2.1.1");
}
