//! opam version strings and their Debian-like order (`~` sorts before everything).

use std::cmp::Ordering;
use std::fmt;

/// A package version, kept as its string; ordered by opam's version order
/// (OpamVersionCompare, the Debian algorithm), so `1.0~beta < 1.0 < 1.0a < 1.0.1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version(String);

impl Version {
    pub fn new(s: impl Into<String>) -> Self {
        Version(s.into())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(&self.0, &other.0)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Weight of a character in a non-digit run: `~` below the end of the run,
/// letters at their code, everything else after all letters (dpkg's `order`).
fn weight(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(b'~') => -1,
        Some(c) if c.is_ascii_alphabetic() => c as i32,
        Some(c) => c as i32 + 256,
    }
}

/// opam's version comparison (OpamVersionCompare.compare).
pub fn compare(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0usize, 0usize);
    while i < a.len() || j < b.len() {
        // Non-digit prefixes, compared character by character.
        let si = i;
        while i < a.len() && !a[i].is_ascii_digit() {
            i += 1;
        }
        let sj = j;
        while j < b.len() && !b[j].is_ascii_digit() {
            j += 1;
        }
        let (pa, pb) = (&a[si..i], &b[sj..j]);
        let n = pa.len().max(pb.len());
        for k in 0..n {
            let ord = weight(pa.get(k).copied()).cmp(&weight(pb.get(k).copied()));
            if ord != Ordering::Equal {
                return ord;
            }
        }
        // Digit runs, compared numerically without overflow.
        let si = i;
        while i < a.len() && a[i].is_ascii_digit() {
            i += 1;
        }
        let sj = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        let da = strip_zeros(&a[si..i]);
        let db = strip_zeros(&b[sj..j]);
        let ord = da.len().cmp(&db.len()).then_with(|| da.cmp(db));
        if ord != Ordering::Equal {
            return ord;
        }
    }
    Ordering::Equal
}

fn strip_zeros(d: &[u8]) -> &[u8] {
    let k = d.iter().take_while(|&&c| c == b'0').count();
    &d[k..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lt(a: &str, b: &str) {
        assert_eq!(compare(a, b), Ordering::Less, "{a} < {b}");
        assert_eq!(compare(b, a), Ordering::Greater, "{b} > {a}");
    }

    #[test]
    fn debian_order() {
        lt("1.0~beta", "1.0");
        lt("25.0~beta", "25.0");
        lt("1.0", "1.0a");
        lt("1.0a", "1.0.1");
        lt("1.0", "1.0.0");
        lt("0.9", "0.10");
        lt("1.0~~", "1.0~");
        lt("a", "b");
        lt("1.2.3", "v0.16.0");
        lt("1.0-EAC1", "1.0+x");
        lt("1.0~draft.2", "1.0-EAC1");
        assert_eq!(compare("01", "1"), Ordering::Equal);
        assert_eq!(compare("", ""), Ordering::Equal);
        lt("", "0.1");
        lt("~", "");
    }
}
