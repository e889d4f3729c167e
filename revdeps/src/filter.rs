//! Filters (`{with-test & os = "linux"}`, `available:`) and their evaluation
//! with opam's three-valued logic (`undefined` absorbs unless `&`/`|` decide).

use crate::error::SyntaxError;
use crate::lexer::Relop;
use crate::parser::{Value, ValueKind};
use crate::version;

#[derive(Clone, Debug, PartialEq)]
pub enum Filter {
    Bool(bool),
    Str(String),
    /// A variable as written: `os`, `_:version`, `ocaml:native`, `a+b:installed`.
    Ident(String),
    Op(Relop, Box<Filter>, Box<Filter>),
    And(Box<Filter>, Box<Filter>),
    Or(Box<Filter>, Box<Filter>),
    Not(Box<Filter>),
    Defined(Box<Filter>),
}

/// A filter's value: opam's `FBool`, `FString` or `FUndef`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FVal {
    B(bool),
    S(String),
    Undef,
}

impl FVal {
    fn as_string(&self) -> Option<String> {
        match self {
            FVal::B(b) => Some(b.to_string()),
            FVal::S(s) => Some(s.clone()),
            FVal::Undef => None,
        }
    }
    fn as_bool(&self) -> Option<bool> {
        match self {
            FVal::B(b) => Some(*b),
            FVal::S(s) if s == "true" => Some(true),
            FVal::S(s) if s == "false" => Some(false),
            _ => None,
        }
    }
}

/// Where variables get their values.
pub trait Env {
    /// The value of a variable as written in the file, or `None` if undefined.
    fn resolve(&self, var: &str) -> Option<FVal>;
}

fn err(v: &Value, msg: &str) -> SyntaxError {
    SyntaxError {
        line: v.pos.line,
        col: v.pos.col,
        msg: msg.to_string(),
    }
}

impl Filter {
    /// Reads a filter expression.
    pub fn from_value(v: &Value) -> Result<Filter, SyntaxError> {
        Ok(match &v.kind {
            ValueKind::Bool(b) => Filter::Bool(*b),
            ValueKind::String(s) => Filter::Str(s.clone()),
            ValueKind::Int(n) => Filter::Str(n.to_string()),
            ValueKind::Ident(s) => Filter::Ident(s.clone()),
            ValueKind::Relop(op, a, b) => Filter::Op(
                *op,
                Box::new(Self::from_value(a)?),
                Box::new(Self::from_value(b)?),
            ),
            ValueKind::And(a, b) => Filter::And(
                Box::new(Self::from_value(a)?),
                Box::new(Self::from_value(b)?),
            ),
            ValueKind::Or(a, b) => Filter::Or(
                Box::new(Self::from_value(a)?),
                Box::new(Self::from_value(b)?),
            ),
            ValueKind::Not(a) => Filter::Not(Box::new(Self::from_value(a)?)),
            ValueKind::Defined(a) => Filter::Defined(Box::new(Self::from_value(a)?)),
            ValueKind::Group(vs) if vs.len() == 1 => Self::from_value(&vs[0])?,
            _ => return Err(err(v, "expected a filter expression")),
        })
    }

    /// Evaluates with opam's semantics (OpamFilter.eval).
    pub fn eval(&self, env: &dyn Env) -> FVal {
        match self {
            Filter::Bool(b) => FVal::B(*b),
            Filter::Str(s) => expand_string(s, env),
            Filter::Ident(v) => env.resolve(v).unwrap_or(FVal::Undef),
            Filter::Op(op, a, b) => {
                let (a, b) = (a.eval(env), b.eval(env));
                match (a.as_string(), b.as_string()) {
                    (Some(a), Some(b)) => FVal::B(op.holds(version::compare(&a, &b))),
                    _ => FVal::Undef,
                }
            }
            Filter::And(a, b) => logop2(a.eval(env), b.eval(env), false),
            Filter::Or(a, b) => logop2(a.eval(env), b.eval(env), true),
            Filter::Not(a) => match a.eval(env).as_bool() {
                Some(b) => FVal::B(!b),
                None => FVal::Undef,
            },
            Filter::Defined(a) => FVal::B(a.eval(env) != FVal::Undef),
        }
    }

    /// `eval_to_bool ~default`: undefined or non-boolean gives `default`.
    pub fn eval_bool(&self, env: &dyn Env, default: bool) -> bool {
        self.eval(env).as_bool().unwrap_or(default)
    }

    /// `eval_to_string`: `None` when undefined.
    pub fn eval_string(&self, env: &dyn Env) -> Option<String> {
        self.eval(env).as_string()
    }

    /// Variables this filter mentions.
    pub fn variables<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Filter::Ident(v) => out.push(v),
            Filter::Op(_, a, b) | Filter::And(a, b) | Filter::Or(a, b) => {
                a.variables(out);
                b.variables(out);
            }
            Filter::Not(a) | Filter::Defined(a) => a.variables(out),
            Filter::Bool(_) | Filter::Str(_) => {}
        }
    }
}

impl std::fmt::Display for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Filter::Bool(b) => write!(f, "{b}"),
            Filter::Str(s) => write!(f, "{s:?}"),
            Filter::Ident(v) => write!(f, "{v}"),
            Filter::Op(op, a, b) => write!(f, "{a} {} {b}", op.as_str()),
            Filter::And(a, b) => write!(f, "({a} & {b})"),
            Filter::Or(a, b) => write!(f, "({a} | {b})"),
            Filter::Not(a) => write!(f, "!{a}"),
            Filter::Defined(a) => write!(f, "?{a}"),
        }
    }
}

/// `&` and `|` with an absorbing value: `false & undef = false`, `true | undef = true`.
fn logop2(a: FVal, b: FVal, absorb: bool) -> FVal {
    let (x, y) = (a.as_bool(), b.as_bool());
    if x == Some(absorb) || y == Some(absorb) {
        return FVal::B(absorb);
    }
    match (x, y) {
        (Some(x), Some(y)) => FVal::B(if absorb { x || y } else { x && y }),
        _ => FVal::Undef,
    }
}

/// Expands `%{var}%` in a string; an undefined variable makes the string undefined.
fn expand_string(s: &str, env: &dyn Env) -> FVal {
    if !s.contains("%{") {
        return FVal::S(s.to_string());
    }
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("%{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(j) = after.find("}%") else {
            out.push_str(&rest[i..]);
            return FVal::S(out);
        };
        match env.resolve(&after[..j]).as_ref().and_then(FVal::as_string) {
            Some(v) => out.push_str(&v),
            None => return FVal::Undef,
        }
        rest = &after[j + 2..];
    }
    out.push_str(rest);
    FVal::S(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parser::{parse_file, Item};

    struct E;
    impl Env for E {
        fn resolve(&self, v: &str) -> Option<FVal> {
            match v {
                "os" => Some(FVal::S("linux".into())),
                "with-test" => Some(FVal::B(false)),
                _ => None,
            }
        }
    }

    fn f(src: &str) -> Filter {
        let items = parse_file(&format!("x: {src}")).expect("parses");
        let Item::Field { value, .. } = &items[0] else {
            panic!()
        };
        Filter::from_value(value).expect("filter")
    }

    #[test]
    fn three_valued() {
        assert_eq!(f(r#"os = "linux""#).eval(&E), FVal::B(true));
        assert_eq!(f("unknown & with-test").eval(&E), FVal::B(false));
        assert_eq!(f("unknown | !with-test").eval(&E), FVal::B(true));
        assert_eq!(f("unknown | with-test").eval(&E), FVal::Undef);
        assert_eq!(f("!unknown").eval(&E), FVal::Undef);
        assert_eq!(f("?unknown").eval(&E), FVal::B(false));
        assert_eq!(f(r#"os = "linu%{os}%""#).eval(&E), FVal::B(false));
        assert!(!f("unknown").eval_bool(&E, false));
    }
}
