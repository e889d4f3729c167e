//! UTM on WGS84 as PROJ 9.8 computes it from EPSG:4326, operation for operation.
//!
//! So floors of its output agree with PROJ's to the bit.
//!
//! # Why a port and not PROJ itself
//!
//! A tile's pixels were laid out from `floor(easting / 10 m)` of PROJ's
//! easting, and on a central meridian that easting is 500 km give or take
//! 1e-10 m, PROJ landing either side by the last bit of `lon·π/180 − lon₀`.
//! Only PROJ's own operations in PROJ's own order give the same side, so any
//! independent transverse Mercator (Krüger, Karney, …), however accurate, puts
//! one tile column in sixty one pixel off (issue 10).
//!
//! Both ways were measured on the 1,808,000 corners of the 452,000 tiles of
//! `core/tests/data/` (every tile with an edge on a central meridian or a
//! zone boundary, all latitudes, and 20,000 random ones) against geotessera
//! 0.11.0, i.e. pyproj 3.8.0 with its bundled PROJ 9.8.1, on Linux x86-64:
//!
//! | | bit-identical corners | other 10 m pixel | per corner |
//! |---|---|---|---|
//! | this port (release build) | 100% | 0 | 0.19 µs |
//! | Debian 12's libproj 9.1.1, `proj_trans` from C (-O2) | 99.84% (worst 1.9e-9 m) | 0 | 0.35 µs |
//! | the Krüger series this file held before | 5.2% (worst 7.5e-9 m) | 106,636 | 0.60 µs |
//!
//! The port was chosen. It matches the PROJ geotessera actually runs to the
//! bit, while the libproj a Debian machine links is an older PROJ (9.1.1
//! predates 9.2's rewrite of the tmerc coefficients as `pj_auxlat_coeffs`)
//! whose agreement on the floors above is luck of the version, not a
//! contract; the maintained binding, `proj-sys` 0.27, wants PROJ ≥ 9.6.2 and
//! would otherwise build its bundled 9.6.2 from source (C++, SQLite, CMake);
//! and `flotilla-core` stays a pure-Rust leaf that the agent builds on Windows
//! and macOS without a C library. Should geotessera move to a PROJ whose UTM
//! differs, `core/tests/geotessera_reference.rs` fails once its reference is
//! made again (`core/tests/data/README.md`).
//!
//! # What is reproduced
//!
//! `Transformer.from_crs("EPSG:4326", "EPSG:326zz"/"EPSG:327zz",
//! always_xy=True)` is the pipeline `unitconvert xy_in=deg xy_out=rad` then
//! `utm zone=zz [south] ellps=WGS84`, which PROJ's proj.ini runs with the
//! Poder/Engsager algorithm (`tmerc_default_algo = poder_engsager`). Each step
//! below cites the PROJ 9.8.1 source it copies: `src/conversions/unitconvert.cpp`,
//! `src/fwd.cpp` (`fwd_prepare`, `fwd_finalize`), `src/adjlon.cpp`,
//! `src/ell_set.cpp` (`pj_calc_ellipsoid_params`), `src/latitudes.cpp`
//! (`pj_auxlat_coeffs`, `pj_clenshaw`, `pj_rectifying_radius`) and
//! `src/projections/tmerc.cpp` (`setup_exact`, `exact_e_fwd`, `clenS`, the
//! `utm` setup). The elementary functions are the platform's, as PROJ's are:
//! `sin`, `cos`, `atan2`, `hypot`, `tan`, `asin`, `log`, `log1p` go to the C
//! library, and `asinh` — which Rust implements itself — is glibc's own
//! algorithm on top of them ([`asinh`]). On Linux that is the same libm as
//! PROJ's; elsewhere the last bit may differ, but where a floor is at stake
//! (a central meridian) the side is decided by `λ − λ₀` alone, which is plain
//! IEEE arithmetic everywhere.

use std::f64::consts::PI;
use std::sync::OnceLock;

/// UTM central scale factor (`P->k0 = 0.9996` in PROJ's `utm` setup).
pub const UTM_K0: f64 = 0.9996;
/// UTM false easting, metres (`P->x0`).
pub const UTM_FALSE_EASTING: f64 = 500_000.0;
/// UTM false northing of the southern zones (EPSG 327zz), metres (`P->y0`).
pub const UTM_FALSE_NORTHING_SOUTH: f64 = 10_000_000.0;

/// WGS84 semi-major axis in metres (PROJ's `ellps=WGS84`: `a=6378137.0`).
const WGS84_A: f64 = 6_378_137.0;
/// WGS84 reciprocal flattening (`rf=298.257223563`).
const WGS84_RF: f64 = 298.257_223_563;
/// `DEG_TO_RAD` in `proj_internal.h`, the factor of `unitconvert xy_in=deg`;
/// the literal `.017453292519943296` is this double.
const DEG_TO_RAD: f64 = PI / 180.0;
/// `PJ_EPS_LAT`: how far past a pole `fwd_prepare` lets a latitude go.
const EPS_LAT: f64 = 1e-12;
/// `exact_e_fwd`'s domain: |Ce| up to 150°.
const MAX_CE: f64 = 2.623_395_162_778;
/// Order of the series (`PROJ_ETMERC_ORDER`, `AuxLat::ORDER`).
const ORDER: usize = 6;

/// `C[chi,phi]` of `pj_auxlat_coeffs` (geographic → conformal latitude): row
/// l holds the polynomial in n, of degree 5 − l, multiplying n^(l+1).
const GEOGRAPHIC_TO_CONFORMAL: [f64; 21] = [
    -2.0,
    2.0 / 3.0,
    4.0 / 3.0,
    -82.0 / 45.0,
    32.0 / 45.0,
    4642.0 / 4725.0,
    5.0 / 3.0,
    -16.0 / 15.0,
    -13.0 / 9.0,
    904.0 / 315.0,
    -1522.0 / 945.0,
    -26.0 / 15.0,
    34.0 / 21.0,
    8.0 / 5.0,
    -12686.0 / 2835.0,
    1237.0 / 630.0,
    -12.0 / 5.0,
    -24832.0 / 14175.0,
    -734.0 / 315.0,
    109598.0 / 31185.0,
    444337.0 / 155925.0,
];

/// `C[mu,chi]` of `pj_auxlat_coeffs` (conformal → rectifying latitude; the
/// Krüger α), laid out as [`GEOGRAPHIC_TO_CONFORMAL`].
const CONFORMAL_TO_RECTIFYING: [f64; 21] = [
    1.0 / 2.0,
    -2.0 / 3.0,
    5.0 / 16.0,
    41.0 / 180.0,
    -127.0 / 288.0,
    7891.0 / 37800.0,
    13.0 / 48.0,
    -3.0 / 5.0,
    557.0 / 1440.0,
    281.0 / 630.0,
    -1_983_433.0 / 1_935_360.0,
    61.0 / 240.0,
    -103.0 / 140.0,
    15061.0 / 26880.0,
    167_603.0 / 181_440.0,
    49561.0 / 161_280.0,
    -179.0 / 168.0,
    6_601_661.0 / 7_257_600.0,
    34729.0 / 80640.0,
    -3_418_889.0 / 1_995_840.0,
    212_378_941.0 / 319_334_400.0,
];

/// A UTM projection of WGS84: one zone's central meridian, scale 0.9996,
/// false easting 500 km and, south, false northing 10,000 km.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransverseMercator {
    /// Central meridian in radians, as PROJ's `utm` setup computes it.
    lam0: f64,
    false_easting: f64,
    false_northing: f64,
}

/// What `setup_exact` derives from the ellipsoid and k0, the same for every
/// UTM zone.
struct PoderEngsager {
    /// Meridian quadrant scaled by k0 (`Qn`), for a = 1.
    qn: f64,
    /// Northing at the origin latitude (`Zb`): −0.0 for UTM's φ₀ = 0, which
    /// PROJ still adds.
    zb: f64,
    /// Geographic → Gaussian (conformal) latitude (`cbg`).
    cbg: [f64; ORDER],
    /// Gaussian → transverse Mercator (`gtu`).
    gtu: [f64; ORDER],
}

fn poder_engsager() -> &'static PoderEngsager {
    static CONSTANTS: OnceLock<PoderEngsager> = OnceLock::new();
    CONSTANTS.get_or_init(|| {
        // ell_set.cpp: ellps_shape, then pj_calc_ellipsoid_params.
        let f = 1.0 / WGS84_RF;
        let es = 2.0 * f - f * f;
        let e = es.sqrt();
        let alpha = e.asin();
        // `pow(tan(alpha / 2), 2)`, which compilers emit as a product.
        let t = (alpha / 2.0).tan();
        let n = t * t;
        let cbg = auxlat_coeffs(n, &GEOGRAPHIC_TO_CONFORMAL);
        let gtu = auxlat_coeffs(n, &CONFORMAL_TO_RECTIFYING);
        let qn = UTM_K0 * rectifying_radius(n);
        // Z = pj_auxlat_convert(phi0 = 0, cbg); Zb = -Qn * convert(Z, gtu).
        let z = auxlat_convert(0.0, &cbg);
        let zb = -qn * auxlat_convert(z, &gtu);
        PoderEngsager { qn, zb, cbg, gtu }
    })
}

/// `pj_auxlat_coeffs` for a conversion involving the conformal latitude
/// (polynomials in n, not n²).
fn auxlat_coeffs(n: f64, coeffs: &[f64; 21]) -> [f64; ORDER] {
    let mut out = [0.0; ORDER];
    let mut d = n;
    let mut o = 0;
    for (l, slot) in out.iter_mut().enumerate() {
        let m = ORDER - l - 1;
        *slot = d * polyval(n, &coeffs[o..=o + m]);
        o += m + 1;
        d *= n;
    }
    out
}

/// `pj_polyval`: Σ p[i]·xⁱ by Horner's rule from the top.
fn polyval(x: f64, p: &[f64]) -> f64 {
    let (last, rest) = p.split_last().expect("a polynomial has a coefficient");
    rest.iter().rev().fold(*last, |y, &c| y * x + c)
}

/// `pj_rectifying_radius`: quarter meridian / (π/2 · a).
fn rectifying_radius(n: f64) -> f64 {
    polyval(n * n, &[1.0, 1.0 / 4.0, 1.0 / 64.0, 1.0 / 256.0]) / (1.0 + n)
}

/// `pj_clenshaw`: Σ F[k]·sin((2k+2)ζ) from sin ζ and cos ζ.
fn clenshaw(szeta: f64, czeta: f64, f: &[f64; ORDER]) -> f64 {
    let x = 2.0 * (czeta - szeta) * (czeta + szeta);
    let (mut u0, mut u1) = (0.0, 0.0);
    for &fk in f.iter().rev() {
        let t = x * u0 - u1 + fk;
        u1 = u0;
        u0 = t;
    }
    2.0 * szeta * czeta * u0
}

/// `pj_auxlat_convert(zeta, F, K)`.
fn auxlat_convert(zeta: f64, f: &[f64; ORDER]) -> f64 {
    zeta + clenshaw(zeta.sin(), zeta.cos(), f)
}

/// `clenS` in tmerc.cpp: the complex Clenshaw sum of `a` at the argument
/// given by its sin/cos and sinh/cosh parts; returns (real, imaginary).
fn clens(a: &[f64; ORDER], sin_r: f64, cos_r: f64, sinh_i: f64, cosh_i: f64) -> (f64, f64) {
    let r = 2.0 * cos_r * cosh_i;
    let i = -2.0 * sin_r * sinh_i;
    let (mut hr1, mut hi1, mut hi) = (0.0, 0.0, 0.0);
    let mut hr = a[ORDER - 1];
    for &ak in a[..ORDER - 1].iter().rev() {
        let (hr2, hi2) = (hr1, hi1);
        hr1 = hr;
        hi1 = hi;
        hr = -hr2 + r * hr1 - i * hi1 + ak;
        hi = -hi2 + i * hr1 + r * hi1;
    }
    let r = sin_r * cosh_i;
    let i = cos_r * sinh_i;
    (r * hr - i * hi, r * hi + i * hr)
}

/// `adjlon`: a longitude in radians into −π…π, leaving it alone within
/// 1e-12 of that range.
fn adjlon(lam: f64) -> f64 {
    if lam.abs() < PI + 1e-12 {
        return lam;
    }
    let shifted = lam + PI;
    let wrapped = shifted - 2.0 * PI * (shifted / (2.0 * PI)).floor();
    wrapped - PI
}

/// glibc's `asinh` (sysdeps/ieee754/dbl-64/s_asinh.c, from fdlibm), written
/// out because Rust's `f64::asinh` is a different formula and PROJ calls the C
/// library's. Its `log`/`log1p`/`sqrt` are the C library's (Rust's `ln`,
/// `ln_1p`, `sqrt`).
pub fn asinh(x: f64) -> f64 {
    const LN2: f64 = std::f64::consts::LN_2;
    let ix = ((x.to_bits() >> 32) as u32) & 0x7fff_ffff;
    if ix < 0x3e30_0000 {
        // |x| < 2⁻²⁸: asinh x = x to the last bit.
        return x;
    }
    let xa = x.abs();
    let w = if ix > 0x41b0_0000 {
        // |x| > 2²⁸ (or not finite).
        if ix >= 0x7ff0_0000 {
            return x + x;
        }
        xa.ln() + LN2
    } else if ix > 0x4000_0000 {
        // 2 < |x| ≤ 2²⁸.
        (2.0 * xa + 1.0 / ((xa * xa + 1.0).sqrt() + xa)).ln()
    } else {
        let t = xa * xa;
        (xa + t / (1.0 + (1.0 + t).sqrt())).ln_1p()
    };
    w.copysign(x)
}

impl TransverseMercator {
    /// UTM zone `zone` (1..=60) of EPSG 326zz, or with `south` of 327zz.
    pub fn utm(zone: u8, south: bool) -> Self {
        // tmerc.cpp, PJ_PROJECTION(utm): zone is 0-based there.
        let z = f64::from(zone) - 1.0;
        TransverseMercator {
            lam0: (z + 0.5) * PI / 30.0 - PI,
            false_easting: UTM_FALSE_EASTING,
            false_northing: if south { UTM_FALSE_NORTHING_SOUTH } else { 0.0 },
        }
    }

    /// Central meridian in degrees (rounded to the nearest degree: PROJ keeps
    /// it in radians, where it is not exact).
    pub fn central_meridian(&self) -> f64 {
        (self.lam0 / DEG_TO_RAD).round()
    }

    /// Projects (longitude, latitude) in degrees to (easting, northing) in
    /// metres, as PROJ's EPSG:4326 → EPSG:326zz/327zz with `always_xy`.
    /// Valid within 150° of the central meridian in the projection's sense
    /// (a UTM zone and far beyond); outside, both are infinite, as PROJ's
    /// `HUGE_VAL`. A latitude past ±90° by more than 1e-12 rad is NaN.
    pub fn forward(&self, lon_deg: f64, lat_deg: f64) -> (f64, f64) {
        // unitconvert: `point.xy.x *= Q->xy_factor`.
        let lam = lon_deg * DEG_TO_RAD;
        let mut phi = lat_deg * DEG_TO_RAD;

        // fwd_prepare (input in radians).
        if phi.abs() - std::f64::consts::FRAC_PI_2 > EPS_LAT {
            return (f64::NAN, f64::NAN);
        }
        phi = phi.clamp(-std::f64::consts::FRAC_PI_2, std::f64::consts::FRAC_PI_2);
        let lam = adjlon(adjlon(lam) - 0.0 - self.lam0);

        // exact_e_fwd.
        let q = poder_engsager();
        let cn = auxlat_convert(phi, &q.cbg);
        let (sin_cn, cos_cn) = (cn.sin(), cn.cos());
        let (sin_ce, cos_ce) = (lam.sin(), lam.cos());
        let cos_cn_cos_ce = cos_cn * cos_ce;
        let cn = sin_cn.atan2(cos_cn_cos_ce);
        let inv_denom_tan_ce = 1.0 / sin_cn.hypot(cos_cn_cos_ce);
        let tan_ce = sin_ce * cos_cn * inv_denom_tan_ce;
        let ce = asinh(tan_ce);
        let two_inv_denom_tan_ce = 2.0 * inv_denom_tan_ce;
        let two_inv_denom_tan_ce_square = two_inv_denom_tan_ce * inv_denom_tan_ce;
        let tmp_r = cos_cn_cos_ce * two_inv_denom_tan_ce_square;
        let sin_arg_r = sin_cn * tmp_r;
        let cos_arg_r = cos_cn_cos_ce * tmp_r - 1.0;
        let sinh_arg_i = tan_ce * two_inv_denom_tan_ce;
        let cosh_arg_i = two_inv_denom_tan_ce_square - 1.0;
        let (dcn, dce) = clens(&q.gtu, sin_arg_r, cos_arg_r, sinh_arg_i, cosh_arg_i);
        let cn = cn + dcn;
        let ce = ce + dce;
        if ce.abs() > MAX_CE {
            return (f64::INFINITY, f64::INFINITY);
        }
        let y = q.qn * cn + q.zb;
        let x = q.qn * ce;

        // fwd_finalize, PJ_IO_UNITS_CLASSIC: scale by a, then add the false
        // origin (fr_meter is 1).
        (
            x * WGS84_A + self.false_easting,
            y * WGS84_A + self.false_northing,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn central_meridian_on_equator_is_false_easting() {
        let (e, n) = TransverseMercator::utm(31, false).forward(3.0, 0.0);
        assert!((e - 500_000.0).abs() < 1e-9);
        assert!(n.abs() < 1e-9);
    }

    #[test]
    fn meridian_arc_to_pole_matches_quarter_meridian() {
        // The WGS84 quarter meridian (A·π/2) is 10,001,965.729 m; UTM scales
        // it by k0.
        let (_, n) = TransverseMercator::utm(31, false).forward(3.0, 90.0);
        assert!((n - 0.9996 * 10_001_965.729_230_8).abs() < 1e-3, "{n}");
    }

    #[test]
    fn known_point_matches_proj() {
        // On the central meridian the northing is k0 × the WGS84 meridian arc
        // from the equator, 4,984,944.378 m at 45°.
        let (e, n) = TransverseMercator::utm(31, false).forward(3.0, 45.0);
        assert!((e - 500_000.0).abs() < 1e-6);
        assert!((n - 0.9996 * 4_984_944.377_857_987).abs() < 2e-3, "{n}");
    }

    #[test]
    fn central_meridian_lands_where_proj_puts_it() {
        // pyproj 3.8.0 / PROJ 9.8.1, EPSG:4326 → EPSG:32746 (always_xy), of
        // geotessera's corner 93.05 − 0.05 at −73.3: the west corner of
        // grid_93.05_-73.35, which issue 10 found one column off.
        let (e, _) = TransverseMercator::utm(46, true).forward(93.05 - 0.05, -73.3);
        assert_eq!(e, 499_999.999_999_999_6, "{e:?}");
        assert_eq!(TransverseMercator::utm(46, true).central_meridian(), 93.0);
    }

    #[test]
    fn asinh_agrees_with_the_series_where_it_is_exact() {
        assert_eq!(asinh(1e-20), 1e-20);
        assert_eq!(asinh(-0.0).to_bits(), (-0.0f64).to_bits());
        for x in [0.3, 1.5, 3.0, 1e9] {
            assert!((asinh(x) - x.asinh()).abs() <= 4.0 * f64::EPSILON * x.asinh());
            assert_eq!(asinh(-x), -asinh(x));
        }
    }

    #[test]
    fn outside_the_domain_is_not_finite() {
        let (e, n) = TransverseMercator::utm(31, false).forward(3.0, 90.1);
        assert!(e.is_nan() && n.is_nan());
    }
}
