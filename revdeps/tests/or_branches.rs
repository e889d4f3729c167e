//! Issue #10: how OR branches, their version constraints and the other atoms
//! of a branch give the `--recursive` graph its edges. opam 2.1.2 reads the
//! CNF of a package's depends (`OpamCudf.strong_and_weak_deps`): a clause
//! naming one package only is strong and the strong clauses of a name
//! intersect; the bounds of a name that only ever shares clauses with
//! others (optional) each count alone; a name strong anywhere ignores the rest.

mod fixture;

use opam_revdeps::phase1::{self, Query};
use opam_revdeps::{explain, PkgId, Repository, Source, Variant};

fn variant() -> Variant {
    Variant::debian12("ocaml-base-compiler", "4.14.2")
}

/// `from`'s graph edges to versions of `name`, as `name.version` lines.
fn edges_to(repo: &Repository, from: &str, name: &str) -> Vec<String> {
    let p = repo.find(from).expect("package in fixture");
    phase1::graph_edges(repo, &phase1::graph_formula(repo, &variant(), p))
        .into_iter()
        .filter(|&q| repo.name(q) == name)
        .map(|q| repo.display(q))
        .collect()
}

fn versions(repo: &Repository, name: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
    repo.versions_of(name)
        .filter(|&q| keep(repo.version(q)))
        .map(|q| repo.display(q))
        .collect()
}

/// satyrographos.0.0.2.11 depends on
/// `("opam-format" {>= "2.0.4" & < "2.2"} & "opam-state" {>= "2.0.4" & < "2.2"} & "ocaml" {< "4.12.0"}
///  | "opam-format" {>= "2.1.0" & < "2.2"} & "opam-state" {>= "2.1.0" & < "2.2"} & "ocaml" {>= "4.12.0"})`.
/// opam-state is in both branches, so it is required, within [2.0.4, 2.2):
/// no edge to opam-state.2.6.0~alpha1, the way to cmdliner the tool used to
/// take, and satyrographos is not in cmdliner.1.3.0's answer.
#[test]
fn a_name_in_every_branch_keeps_its_ranges() {
    let repo = fixture::repo();
    let in_range = |v: &str| {
        opam_revdeps::version::compare(v, "2.0.4").is_ge()
            && opam_revdeps::version::compare(v, "2.2").is_lt()
    };
    for s in ["satyrographos.0.0.2.11", "satyrographos.0.0.2.13"] {
        assert_eq!(
            edges_to(repo, s, "opam-state"),
            versions(repo, "opam-state", in_range),
            "{s}"
        );
        let step = explain::check_step(
            repo,
            &variant(),
            repo.find(s).expect("in fixture"),
            repo.find("opam-state.2.6.0~alpha1").expect("in fixture"),
        );
        assert!(!step.holds, "{}", step.reading);
    }
    let cmdliner = repo.find("cmdliner.1.3.0").expect("in fixture");
    let cands = phase1::phase1(repo, &variant(), cmdliner, Query::Union);
    for c in &cands.list {
        assert!(
            !repo.name(c.pkg).starts_with("satyrographos"),
            "{} is a candidate",
            repo.display(c.pkg)
        );
    }
}

/// Two atoms of one name in the same conjunction are two strong clauses:
/// their ranges intersect, even when one has no constraint at all.
#[test]
fn atoms_of_one_name_intersect() {
    let repo = fixture::repo();
    // "protocol-9p" {= "0.11.2"} and "protocol-9p"
    assert_eq!(
        edges_to(repo, "protocol-9p-tool.0.11.3", "protocol-9p"),
        ["protocol-9p.0.11.2"]
    );
    // "lwt" {>= "5.5.0"} and "lwt"
    assert_eq!(
        edges_to(repo, "cohttp-server-lwt-unix.6.0.0", "lwt"),
        versions(repo, "lwt", |v| opam_revdeps::version::compare(v, "5.5.0")
            .is_ge())
    );
}

/// A name that some branch does without is optional, and each bound of its
/// atoms gives edges alone: prooftree.0.14's
/// `"coq" {>= "8.11" & < "8.17"} | "coq-core" {>= "8.17"}` reaches every
/// coq version (opam lists prooftree.0.14 for coq.9.1.1).
#[test]
fn an_optional_name_takes_each_bound_alone() {
    let repo = fixture::repo();
    assert_eq!(
        edges_to(repo, "prooftree.0.14", "coq"),
        versions(repo, "coq", |_| true)
    );
    let step = explain::check_step(
        repo,
        &variant(),
        repo.find("prooftree.0.14").expect("in fixture"),
        repo.find("coq.9.1.1").expect("in fixture"),
    );
    assert!(step.holds, "{}", step.reading);
}

/// A tiny repository, one `name.version` → `depends` a line.
fn synthetic(pkgs: &[(&str, &str)]) -> (tempdir::Dir, Repository) {
    let dir = tempdir::Dir::new();
    for (nv, depends) in pkgs {
        let (n, _) = nv.split_once('.').expect("name.version");
        let d = dir.path().join("packages").join(n).join(nv);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("opam"),
            format!("opam-version: \"2.0\"\ndepends: [ {depends} ]\n"),
        )
        .expect("write opam");
    }
    let repo = Repository::load(&Source::parse(dir.path().to_str().expect("utf-8")))
        .expect("synthetic repository loads");
    (dir, repo)
}

mod tempdir {
    pub struct Dir(std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
                "or-branches-{}-{}",
                std::process::id(),
                N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("scratch dir");
            Dir(p)
        }
        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn edges(repo: &Repository, from: &str) -> Vec<String> {
    let p = repo.find(from).expect("synthetic package");
    let mut v: Vec<String> = phase1::graph_edges(repo, &phase1::graph_formula(repo, &variant(), p))
        .into_iter()
        .map(|q: PkgId| repo.display(q))
        .collect();
    v.sort();
    v
}

/// The rules on made-up packages, one at a time.
#[test]
fn strong_and_weak_clauses() {
    let (_d, repo) = synthetic(&[
        ("a.1", ""),
        ("a.2", ""),
        ("a.3", ""),
        ("b.1", ""),
        ("c.1", ""),
        // a in both branches: required, in [2, 3) or = 3; b and c optional.
        ("x.1", r#"("a" {>= "2" & < "3"} & "b" | "a" {= "3"} & "c")"#),
        // a strong at the top: its optional atom adds nothing.
        ("y.1", r#""a" {>= "3"} ("a" {< "2"} | "b")"#),
        // a optional: each bound alone (>= 2 gives 2 and 3, < 2 gives 1).
        ("z.1", r#"("a" {>= "2" & < "2"} | "b")"#),
        // post is evaluated after the CNF: of (b | a >= 2) & (b | a < 3) &
        // (c | a >= 2) & (c | a < 3), the first two lose b and make a strong.
        ("w.1", r#"("b" {post} & "c" | "a" {>= "2" & < "3"})"#),
    ]);
    assert_eq!(edges(&repo, "x.1"), ["a.2", "a.3", "b.1", "c.1"]);
    assert_eq!(edges(&repo, "y.1"), ["a.3", "b.1"]);
    assert_eq!(edges(&repo, "z.1"), ["a.1", "a.2", "a.3", "b.1"]);
    assert_eq!(edges(&repo, "w.1"), ["a.2", "c.1"]);
    // The tree reading (explain) agrees on each.
    let v = variant();
    for (from, to, want) in [
        ("x.1", "a.1", false),
        ("x.1", "a.3", true),
        ("y.1", "a.1", false),
        ("y.1", "a.3", true),
        ("z.1", "a.1", true),
        ("w.1", "a.1", false),
        ("w.1", "a.2", true),
        ("w.1", "b.1", false),
        ("w.1", "c.1", true),
    ] {
        let s = explain::check_step(
            &repo,
            &v,
            repo.find(from).expect("from"),
            repo.find(to).expect("to"),
        );
        assert_eq!(s.holds, want, "{from} -> {to}: {}", s.reading);
    }
}
