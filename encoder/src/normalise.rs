//! Band standardisation with upstream's per-band training statistics.

/// Per-band standardisation `x' = (x - mean) / (std + 1e-9)`, upstream's
/// training statistics.
pub const S2_MEAN: [f64; 10] = [
    1633.0042, 1341.1090, 1539.5536, 3054.8269, 3117.4658, 2004.1648, 2694.7275, 2945.1504,
    2266.6079, 1657.3094,
];
pub const S2_STD: [f64; 10] = [
    1999.4603, 2014.7549, 1929.2201, 1754.2493, 1649.9807, 1936.8988, 1748.6041, 1708.6991,
    1207.5250, 1108.6046,
];
pub const S1_ASC_MEAN: [f64; 2] = [5909.3921, 3405.0322];
pub const S1_ASC_STD: [f64; 2] = [1507.1750, 1531.2615];
pub const S1_DESC_MEAN: [f64; 2] = [5816.1382, 3277.7576];
pub const S1_DESC_STD: [f64; 2] = [1554.6475, 1546.4733];

/// One standardised value.
pub(crate) fn standardise(x: f64, mean: f64, std: f64) -> f32 {
    ((x - mean) / (std + 1e-9)) as f32
}

/// The (mean, std) pairs of one S1 orbit direction (VV, VH).
pub(crate) fn s1_stats(ascending: bool) -> ([f64; 2], [f64; 2]) {
    if ascending {
        (S1_ASC_MEAN, S1_ASC_STD)
    } else {
        (S1_DESC_MEAN, S1_DESC_STD)
    }
}

/// Readings a 16-bit value can take: a table of one band's standardised
/// values holds this many.
const READINGS: usize = 1 << 16;

/// [`standardise`] of every 16-bit reading of each band, band-major:
/// `table[k * 65536 + v]` for band `k` and reading `v` (an S2 u16, or the
/// bits of an S1 i16). The same f32 the formula gives, looked up instead
/// of computed: gathering a tile's tokens spent a third of the host's time
/// in an encode on that one f64 division per value.
fn table(mean: &[f64], std: &[f64], signed: bool) -> Vec<f32> {
    let mut t = Vec::with_capacity(mean.len() * READINGS);
    for (&m, &s) in mean.iter().zip(std) {
        t.extend((0..READINGS).map(|v| {
            let x = if signed {
                v as u16 as i16 as f64
            } else {
                v as f64
            };
            standardise(x, m, s)
        }));
    }
    t
}

/// The S2 bands' table (10 x 65,536 values, 2.6 MB, built on first use).
pub(crate) fn s2_table() -> &'static [f32] {
    static T: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    T.get_or_init(|| table(&S2_MEAN, &S2_STD, false))
}

/// One S1 orbit direction's table (VV, VH; i16 readings by their bits).
pub(crate) fn s1_table(ascending: bool) -> &'static [f32] {
    static ASC: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    static DESC: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    let (mean, std) = s1_stats(ascending);
    if ascending { &ASC } else { &DESC }.get_or_init(|| table(&mean, &std, true))
}

/// A band's standardised value of reading `v` from a table of [`s2_table`]
/// or [`s1_table`].
#[inline]
pub(crate) fn lookup(table: &[f32], band: usize, v: u16) -> f32 {
    table[band * READINGS + v as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_hold_what_the_formula_gives_for_every_reading() {
        let s2 = s2_table();
        for k in 0..10 {
            for v in 0..=u16::MAX {
                let want = standardise(v as f64, S2_MEAN[k], S2_STD[k]);
                assert_eq!(
                    lookup(s2, k, v).to_bits(),
                    want.to_bits(),
                    "band {k} reading {v}"
                );
            }
        }
        for asc in [true, false] {
            let (mean, std) = s1_stats(asc);
            for k in 0..2 {
                for v in i16::MIN..=i16::MAX {
                    let want = standardise(v as f64, mean[k], std[k]);
                    let got = lookup(s1_table(asc), k, v as u16);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "S1 {asc} band {k} reading {v}"
                    );
                }
            }
        }
    }
}
