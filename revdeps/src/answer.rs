//! The order answers are printed in, as in the reference files: opam's `-s`
//! order for a single query, bytewise (`sort`) for the union.

use crate::phase1::Query;
use crate::repository::{PkgId, Repository};
use std::cmp::Ordering;

/// The name order of opam 2.1.2's `-s` listings, as the reference files show
/// it: by first letter ignoring case, names starting with a capital before
/// the others (`GT` before `gapi-ocaml`), then ignoring case (`GenArrayIter`
/// before `GT`), then bytewise.
pub fn compare_names(a: &str, b: &str) -> Ordering {
    let first = |s: &str| {
        s.bytes()
            .next()
            .map(|c| (c.to_ascii_lowercase(), c.is_ascii_lowercase()))
    };
    first(a)
        .cmp(&first(b))
        .then_with(|| a.to_ascii_lowercase().cmp(&b.to_ascii_lowercase()))
        .then_with(|| a.cmp(b))
}

/// `name.version` lines in the order of the reference answer for `query`.
pub fn lines(repo: &Repository, query: Query, pkgs: &[PkgId]) -> Vec<String> {
    match query {
        Query::Union => {
            let mut v: Vec<String> = pkgs.iter().map(|&p| repo.display(p)).collect();
            v.sort();
            v.dedup();
            v
        }
        _ => {
            let mut ids = pkgs.to_vec();
            ids.sort_by(|&a, &b| {
                compare_names(repo.name(a), repo.name(b)).then_with(|| {
                    repo.packages[a as usize]
                        .version
                        .cmp(&repo.packages[b as usize].version)
                })
            });
            ids.dedup();
            ids.iter().map(|&p| repo.display(p)).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opam_name_order() {
        let mut v = vec![
            "bz2",
            "CamelCase",
            "FPauth-core",
            "FPauth",
            "ezxmlm",
            "intPQueue",
            "interval_intel",
            "gen",
            "GT",
            "GenArrayIter",
            "faad",
            "ANSITerminal",
            "aarch64-esperanto",
        ];
        v.sort_by(|a, b| compare_names(a, b));
        assert_eq!(
            v,
            vec![
                "ANSITerminal",
                "aarch64-esperanto",
                "bz2",
                "CamelCase",
                "ezxmlm",
                "FPauth",
                "FPauth-core",
                "faad",
                "GenArrayIter",
                "GT",
                "gen",
                "interval_intel",
                "intPQueue"
            ]
        );
    }
}
