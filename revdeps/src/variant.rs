//! The variant a question is asked for (compiler, host variables) and the
//! variable environment a package's filters are evaluated in.

use crate::filter::{Env, FVal};
use std::collections::BTreeSet;

/// The switch a question is asked in: its invariant compiler and the host variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    /// The compiler package, e.g. `ocaml-base-compiler`.
    pub compiler_name: String,
    /// Its exact version, e.g. `4.14.2`.
    pub compiler_version: String,
    pub arch: String,
    pub os: String,
    pub os_family: String,
    pub os_distribution: String,
    pub os_version: String,
    pub opam_version: String,
    /// System packages the host's package manager cannot provide; a package
    /// whose selected `depexts` name one is unavailable (opam 2.1 checks
    /// depexts when it builds the solver's universe).
    pub missing_depexts: BTreeSet<String>,
}

/// System packages that Debian 12 (bookworm, main) does not have among those
/// opam-repository 97014be's packages ask for on Debian, as `apt-cache
/// show` answered on a Debian 12 host (see `data/README.md`).
pub const DEBIAN12_MISSING_DEPEXTS: &str = include_str!("../data/debian-12-missing-depexts.txt");

/// Parses a list of system package names, one a line, `#` comments allowed.
pub fn parse_name_list(s: &str) -> BTreeSet<String> {
    s.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

impl Variant {
    /// The host of the reference fixtures: Debian 12 on x86_64, opam 2.1.2.
    pub fn debian12(compiler_name: &str, compiler_version: &str) -> Self {
        Variant {
            compiler_name: compiler_name.to_string(),
            compiler_version: compiler_version.to_string(),
            arch: "x86_64".into(),
            os: "linux".into(),
            os_family: "debian".into(),
            os_distribution: "debian".into(),
            os_version: "12".into(),
            opam_version: "2.1.2".into(),
            missing_depexts: parse_name_list(DEBIAN12_MISSING_DEPEXTS),
        }
    }

    fn global(&self, var: &str) -> Option<FVal> {
        let s = match var {
            "arch" => &self.arch,
            "os" => &self.os,
            "os-family" => &self.os_family,
            "os-distribution" => &self.os_distribution,
            "os-version" => &self.os_version,
            "opam-version" => &self.opam_version,
            _ => return None,
        };
        Some(FVal::S(s.clone()))
    }
}

/// Values of opam's dependency variables (`build`, `post`, `with-test`,
/// `with-doc`, `dev`); `None` leaves one undefined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DepVars {
    pub build: Option<bool>,
    pub post: Option<bool>,
    pub test: Option<bool>,
    pub doc: Option<bool>,
    pub dev: Option<bool>,
}

impl DepVars {
    /// None defined: for `available` and `conflicts`.
    pub const NONE: DepVars = DepVars {
        build: None,
        post: None,
        test: None,
        doc: None,
        dev: None,
    };
}

/// The environment of one package's filters in the switch (OpamPackageVar.resolve_switch):
/// global host variables, the package's own variables, and other packages'
/// variables as in a switch where they are not installed.
pub struct PkgEnv<'a> {
    pub variant: &'a Variant,
    pub name: &'a str,
    pub version: &'a str,
    pub deps: DepVars,
}

impl PkgEnv<'_> {
    fn own(&self, var: &str) -> Option<FVal> {
        match var {
            "name" => Some(FVal::S(self.name.to_string())),
            "version" => Some(FVal::S(self.version.to_string())),
            "installed" | "pinned" => Some(FVal::B(false)),
            _ => None,
        }
    }
}

impl Env for PkgEnv<'_> {
    fn resolve(&self, var: &str) -> Option<FVal> {
        let b = |x: Option<bool>| x.map(FVal::B);
        match var {
            "build" => return b(self.deps.build),
            "post" => return b(self.deps.post),
            "with-test" => return b(self.deps.test),
            "with-doc" => return b(self.deps.doc),
            "dev" => return b(self.deps.dev),
            "name" | "version" => return self.own(var),
            _ => {}
        }
        if let Some(v) = self.variant.global(var) {
            return Some(v);
        }
        let (pkgs, v) = var.rsplit_once(':')?;
        let mut result: Option<bool> = None;
        for p in pkgs.split('+') {
            let val = if p == "_" || p == self.name {
                self.own(v)?
            } else {
                match v {
                    // Not installed in the switch (OpamPackageVar: installed=false, enable="disable").
                    "installed" => FVal::B(false),
                    "enable" => FVal::S("disable".into()),
                    _ => return None,
                }
            };
            if pkgs.contains('+') {
                let FVal::B(x) = val else { return None };
                result = Some(result.unwrap_or(true) && x);
            } else {
                return Some(val);
            }
        }
        result.map(FVal::B)
    }
}
