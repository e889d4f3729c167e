//! What the solver needs from one opam file: dependency formulas, conflicts,
//! conflict classes, availability and whether it is a development package.

use crate::error::FileError;
use crate::filter::Filter;
use crate::formula::{package_formula, FAtom, Formula};
use crate::parser::{parse_file, Item, Value, ValueKind};

#[derive(Clone, Debug)]
pub struct OpamData {
    pub depends: Formula<FAtom>,
    pub depopts: Formula<FAtom>,
    pub conflicts: Formula<FAtom>,
    pub conflict_class: Vec<String>,
    /// `available:`, `true` when absent.
    pub available: Filter,
    /// opam's `is_dev_package`: a version-control `url` without checksum;
    /// its `{dev}` dependencies count in the solver's universe.
    pub dev: bool,
    /// `depexts`: system package names and the filter selecting them.
    pub depexts: Vec<(Vec<String>, Filter)>,
    /// Lines of the fields, for explanations (0 when absent).
    pub depends_line: u32,
    pub depopts_line: u32,
    pub conflicts_line: u32,
    pub available_line: u32,
}

impl OpamData {
    /// Parses an opam file; `file` names it in errors.
    pub fn parse(file: &str, src: &str) -> Result<OpamData, FileError> {
        let items = parse_file(src).map_err(|e| FileError::syntax(file, e))?;
        let mut d = OpamData {
            depends: Formula::Empty,
            depopts: Formula::Empty,
            conflicts: Formula::Empty,
            conflict_class: Vec::new(),
            available: Filter::Bool(true),
            dev: false,
            depexts: Vec::new(),
            depends_line: 0,
            depopts_line: 0,
            conflicts_line: 0,
            available_line: 0,
        };
        for item in &items {
            match item {
                Item::Field { pos, name, value } => {
                    let field_err = |e: crate::error::SyntaxError| FileError::Field {
                        file: file.to_string(),
                        line: e.line,
                        field: name.clone(),
                        msg: e.msg,
                    };
                    match name.as_str() {
                        "depends" => {
                            d.depends = package_formula(value, true).map_err(field_err)?;
                            d.depends_line = pos.line;
                        }
                        "depopts" => {
                            d.depopts = package_formula(value, true).map_err(field_err)?;
                            d.depopts_line = pos.line;
                        }
                        "conflicts" => {
                            d.conflicts = package_formula(value, false).map_err(field_err)?;
                            d.conflicts_line = pos.line;
                        }
                        "conflict-class" => {
                            d.conflict_class =
                                string_list(value).ok_or_else(|| FileError::Field {
                                    file: file.to_string(),
                                    line: pos.line,
                                    field: name.clone(),
                                    msg: "expected a list of package names".into(),
                                })?;
                        }
                        "depexts" => d.depexts = depexts(value).map_err(field_err)?,
                        "available" => {
                            d.available = available(value).map_err(field_err)?;
                            d.available_line = pos.line;
                        }
                        _ => {}
                    }
                }
                Item::Section { kind, items, .. } if kind == "url" => d.dev = is_dev_url(items),
                Item::Section { .. } => {}
            }
        }
        Ok(d)
    }
}

/// `available: [ filter ]` (opam 1.2 style list) or `available: filter`.
fn available(v: &Value) -> Result<Filter, crate::error::SyntaxError> {
    match &v.kind {
        ValueKind::List(vs) => {
            let mut f: Option<Filter> = None;
            for x in vs {
                let g = Filter::from_value(x)?;
                f = Some(match f {
                    None => g,
                    Some(f) => Filter::And(Box::new(f), Box::new(g)),
                });
            }
            Ok(f.unwrap_or(Filter::Bool(true)))
        }
        _ => Filter::from_value(v),
    }
}

/// `depexts: [ ["pkg" "pkg2"] {filter} … ]`; opam 1.2's tag lists select nothing.
fn depexts(v: &Value) -> Result<Vec<(Vec<String>, Filter)>, crate::error::SyntaxError> {
    let ValueKind::List(items) = &v.kind else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for it in items {
        let (names, filter) = match &it.kind {
            ValueKind::Option(inner, opts) => {
                let mut f: Option<Filter> = None;
                for o in opts {
                    let g = Filter::from_value(o)?;
                    f = Some(match f {
                        None => g,
                        Some(f) => Filter::And(Box::new(f), Box::new(g)),
                    });
                }
                (inner.as_ref(), f.unwrap_or(Filter::Bool(true)))
            }
            _ => (it, Filter::Bool(true)),
        };
        if let Some(names) = string_list(names) {
            out.push((names, filter));
        }
    }
    Ok(out)
}

fn string_list(v: &Value) -> Option<Vec<String>> {
    match &v.kind {
        ValueKind::String(s) => Some(vec![s.clone()]),
        ValueKind::List(vs) => vs
            .iter()
            .map(|x| match &x.kind {
                ValueKind::String(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// OpamPackageVar.is_dev_package: the url's backend is not plain http and
/// there is no checksum.
fn is_dev_url(items: &[Item]) -> bool {
    let mut url: Option<(&str, &str)> = None;
    let mut checksum = false;
    for it in items {
        if let Item::Field { name, value, .. } = it {
            match (name.as_str(), &value.kind) {
                ("checksum", ValueKind::String(_)) => checksum = true,
                ("checksum", ValueKind::List(l)) if !l.is_empty() => checksum = true,
                (
                    k @ ("src" | "archive" | "http" | "git" | "hg" | "darcs" | "local"),
                    ValueKind::String(s),
                ) => {
                    url = Some((k, s));
                }
                _ => {}
            }
        }
    }
    let Some((field, u)) = url else { return false };
    if checksum {
        return false;
    }
    match field {
        "git" | "hg" | "darcs" | "local" => true,
        "http" => false,
        _ => !is_http_backend(u),
    }
}

/// OpamUrl.parse: `git+…`, `hg+…`, `darcs+…`, `git://`, `file://` and local
/// paths are not http; neither is an http(s) url ending in `.git`.
fn is_http_backend(u: &str) -> bool {
    let (scheme, rest) = match u.split_once("://") {
        Some(x) => x,
        None => return false,
    };
    let (vc, transport) = match scheme.split_once('+') {
        Some((a, b)) => (Some(a), b),
        None => (None, scheme),
    };
    match vc {
        Some("http" | "https") => true,
        Some(_) => false,
        None => match transport {
            "http" | "https" | "ftp" => !rest.trim_end_matches('/').ends_with(".git"),
            _ => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_packages() {
        let dev = |s: &str| OpamData::parse("t", s).expect("parses").dev;
        assert!(dev(r#"url { src: "git+https://github.com/a/b" }"#));
        assert!(!dev(r#"url { src: "https://github.com/a/b.tar.gz" }"#));
        assert!(!dev(
            r#"url { src: "git+https://github.com/a/b#v1" checksum: "sha256=00" }"#
        ));
        assert!(!dev("opam-version: \"2.0\""));
    }

    #[test]
    fn reports_file_and_line() {
        let e = OpamData::parse(
            "packages/a/a.1/opam",
            "opam-version: \"2.0\"\ndepends: [ \"x\" {>= } ]",
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("packages/a/a.1/opam:2:"), "{e}");
    }
}
