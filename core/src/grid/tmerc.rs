//! Transverse Mercator on WGS84 by the Krüger series to order n⁶ (Karney 2011), as PROJ's `tmerc` computes UTM.
//!
//! PROJ's default `tmerc` algorithm ("poder/engsager") is the same sixth-order
//! Krüger series; both are accurate to nanometres within a zone and stay
//! sub-millimetre several degrees outside it, so tile footprints computed here
//! agree with PROJ (and geotessera, which calls it) to well under a millimetre.
//!
//! Reference: C. F. F. Karney, "Transverse Mercator with an accuracy of a few
//! nanometers", J. Geodesy 85 (2011) 475–485, eqs. (7)–(11), (35).

/// WGS84 semi-major axis in metres (EPSG:7030).
const WGS84_A: f64 = 6_378_137.0;
/// WGS84 flattening (EPSG:7030).
const WGS84_F: f64 = 1.0 / 298.257_223_563;
/// UTM central scale factor.
pub const UTM_K0: f64 = 0.9996;
/// UTM false easting, metres.
pub const UTM_FALSE_EASTING: f64 = 500_000.0;
/// UTM false northing of the southern zones (EPSG 327zz), metres.
pub const UTM_FALSE_NORTHING_SOUTH: f64 = 10_000_000.0;

/// A transverse Mercator projection of WGS84 about one central meridian.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransverseMercator {
    lon0_deg: f64,
    k0: f64,
    false_easting: f64,
    false_northing: f64,
}

/// Series constants that depend only on the ellipsoid.
struct Krueger {
    /// First eccentricity.
    e: f64,
    /// Rectifying radius A (Karney eq. 14).
    rect_radius: f64,
    /// α₁…α₆ (Karney eq. 35).
    alpha: [f64; 6],
}

fn krueger() -> Krueger {
    let f = WGS84_F;
    let n = f / (2.0 - f);
    let (n2, n3) = (n * n, n * n * n);
    let (n4, n5, n6) = (n2 * n2, n2 * n3, n3 * n3);
    let rect_radius = WGS84_A / (1.0 + n) * (1.0 + n2 / 4.0 + n4 / 64.0 + n6 / 256.0);
    let alpha = [
        n / 2.0 - 2.0 / 3.0 * n2 + 5.0 / 16.0 * n3 + 41.0 / 180.0 * n4 - 127.0 / 288.0 * n5
            + 7891.0 / 37800.0 * n6,
        13.0 / 48.0 * n2 - 3.0 / 5.0 * n3 + 557.0 / 1440.0 * n4 + 281.0 / 630.0 * n5
            - 1_983_433.0 / 1_935_360.0 * n6,
        61.0 / 240.0 * n3 - 103.0 / 140.0 * n4
            + 15061.0 / 26880.0 * n5
            + 167_603.0 / 181_440.0 * n6,
        49561.0 / 161_280.0 * n4 - 179.0 / 168.0 * n5 + 6_601_661.0 / 7_257_600.0 * n6,
        34729.0 / 80640.0 * n5 - 3_418_889.0 / 1_995_840.0 * n6,
        212_378_941.0 / 319_334_400.0 * n6,
    ];
    Krueger {
        e: (f * (2.0 - f)).sqrt(),
        rect_radius,
        alpha,
    }
}

impl TransverseMercator {
    /// UTM zone `zone` (1..=60); `south` adds the 10,000 km false northing of
    /// EPSG 327zz.
    pub fn utm(zone: u8, south: bool) -> Self {
        TransverseMercator {
            lon0_deg: f64::from(zone) * 6.0 - 183.0,
            k0: UTM_K0,
            false_easting: UTM_FALSE_EASTING,
            false_northing: if south { UTM_FALSE_NORTHING_SOUTH } else { 0.0 },
        }
    }

    /// Central meridian in degrees.
    pub fn central_meridian(&self) -> f64 {
        self.lon0_deg
    }

    /// Projects (longitude, latitude) in degrees to (easting, northing) in
    /// metres. Valid for |longitude − central meridian| < 90°.
    pub fn forward(&self, lon_deg: f64, lat_deg: f64) -> (f64, f64) {
        let k = krueger();
        let mut dlon = lon_deg - self.lon0_deg;
        // Keep the difference in [-180, 180) so zone 1 and 60 work across ±180°.
        dlon -= 360.0 * ((dlon + 180.0) / 360.0).floor();
        let lam = dlon.to_radians();
        let phi = lat_deg.to_radians();
        let (sin_lam, cos_lam) = lam.sin_cos();

        // Conformal latitude as its tangent τ′ (Karney eqs. 7–9); this form
        // stays accurate near the poles where tan φ is huge.
        let (xip, etap) = if phi.abs() >= std::f64::consts::FRAC_PI_2 {
            (phi.signum() * std::f64::consts::FRAC_PI_2, 0.0)
        } else {
            let tau = phi.tan();
            let sigma = (k.e * (k.e * tau / tau.hypot(1.0)).atanh()).sinh();
            let taup = tau * sigma.hypot(1.0) - sigma * tau.hypot(1.0);
            // Gauss–Schreiber (spherical transverse Mercator) of the conformal
            // sphere, eq. 10.
            (taup.atan2(cos_lam), (sin_lam / taup.hypot(cos_lam)).asinh())
        };

        // Krüger series, eq. 11.
        let mut xi = xip;
        let mut eta = etap;
        for (j, a) in k.alpha.iter().enumerate() {
            let m = 2.0 * (j as f64 + 1.0);
            let (s, c) = (m * xip).sin_cos();
            xi += a * s * (m * etap).cosh();
            eta += a * c * (m * etap).sinh();
        }
        (
            self.false_easting + self.k0 * k.rect_radius * eta,
            self.false_northing + self.k0 * k.rect_radius * xi,
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
}
