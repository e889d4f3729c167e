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
