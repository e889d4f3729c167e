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

/// opam's character order inside non-numeric runs: `~` first, then letters,
/// then everything else.
fn compare_chars(a: u8, b: u8) -> Ordering {
    let class = |c: u8| match c {
        b'~' => 0,
        c if c.is_ascii_alphabetic() => 1,
        _ => 2,
    };
    class(a).cmp(&class(b)).then(a.cmp(&b))
}

fn skip_zeros(x: &[u8], mut i: usize, end: usize) -> usize {
    while i < end && x[i] == b'0' {
        i += 1;
    }
    i
}

/// OpamVersionCompare's `loop_lexical` over `x[xi..xl]` and `y[yi..yl]`.
fn loop_lexical(
    x: &[u8],
    y: &[u8],
    xl: usize,
    yl: usize,
    mut xi: usize,
    mut yi: usize,
) -> Ordering {
    loop {
        match (xi == xl, yi == yl) {
            (true, true) => return Ordering::Equal,
            (true, false) => {
                let ys = skip_zeros(y, yi, yl);
                return if ys == yl {
                    Ordering::Equal
                } else if y[ys] == b'~' {
                    Ordering::Greater
                } else {
                    Ordering::Less
                };
            }
            (false, true) => {
                let xs = skip_zeros(x, xi, xl);
                return if xs == xl {
                    Ordering::Equal
                } else if x[xs] == b'~' {
                    Ordering::Less
                } else {
                    Ordering::Greater
                };
            }
            (false, false) => match (x[xi].is_ascii_digit(), y[yi].is_ascii_digit()) {
                (true, true) => {
                    // Numeric runs, leading zeros skipped: longer is larger, then digit by digit.
                    xi = skip_zeros(x, xi, xl);
                    yi = skip_zeros(y, yi, yl);
                    let mut xn = xi;
                    while xn < xl && x[xn].is_ascii_digit() {
                        xn += 1;
                    }
                    let mut yn = yi;
                    while yn < yl && y[yn].is_ascii_digit() {
                        yn += 1;
                    }
                    let ord = (xn - xi)
                        .cmp(&(yn - yi))
                        .then_with(|| x[xi..xn].cmp(&y[yi..yn]));
                    if ord != Ordering::Equal {
                        return ord;
                    }
                    xi = xn;
                    yi = yn;
                }
                (true, false) => {
                    return if y[yi] == b'~' {
                        Ordering::Greater
                    } else {
                        Ordering::Less
                    }
                }
                (false, true) => {
                    return if x[xi] == b'~' {
                        Ordering::Less
                    } else {
                        Ordering::Greater
                    }
                }
                (false, false) => {
                    let ord = compare_chars(x[xi], y[yi]);
                    if ord != Ordering::Equal {
                        return ord;
                    }
                    xi += 1;
                    yi += 1;
                }
            },
        }
    }
}

/// opam's version comparison (OpamVersionCompare.compare, as in opam 2.1):
/// Debian's algorithm on the part before the last `-`, then on the part after
/// it — so `0.3.0-0` equals `0.3.0`, and `~` sorts before everything.
pub fn compare(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let rx = x.iter().rposition(|&c| c == b'-').unwrap_or(x.len());
    let ry = y.iter().rposition(|&c| c == b'-').unwrap_or(y.len());
    loop_lexical(x, y, rx, ry, 0, 0).then_with(|| {
        loop_lexical(
            x,
            y,
            x.len(),
            y.len(),
            (rx + 1).min(x.len()),
            (ry + 1).min(y.len()),
        )
    })
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
        // The part after the last `-` is a revision compared on its own.
        assert_eq!(compare("0.3.0-0", "0.3.0"), Ordering::Equal);
        lt("0.3.0", "0.3.0-1");
        lt("1.0-2", "1.0.1-1");
        assert_eq!(compare("", ""), Ordering::Equal);
        lt("", "0.1");
        lt("~", "");
    }
}
