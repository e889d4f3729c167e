//! The bfloat16 element type and f32 <-> bf16 conversion.
//!
//! Round to nearest even, as oneDNN's own reorders do.

/// A bfloat16 value: the top 16 bits of an IEEE f32.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Rounds to nearest, ties to even; NaN stays a (quiet) NaN.
    pub fn from_f32(x: f32) -> Self {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x0040);
        }
        let round = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }

    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl std::fmt::Debug for Bf16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}bf16", self.to_f32())
    }
}

/// Converts `src` into `dst` element by element. Panics if the lengths differ
/// (a caller bug, not an input error).
pub fn f32_to_bf16(src: &[f32], dst: &mut [Bf16]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "f32_to_bf16: src and dst lengths must match"
    );
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = Bf16::from_f32(s);
    }
}

/// Converts `src` into `dst` element by element. Panics if the lengths differ.
pub fn bf16_to_f32(src: &[Bf16], dst: &mut [f32]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "bf16_to_f32: src and dst lengths must match"
    );
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Allocating form of [`f32_to_bf16`].
pub fn to_bf16_vec(src: &[f32]) -> Vec<Bf16> {
    src.iter().map(|&x| Bf16::from_f32(x)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even() {
        assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
        // 1 + 2^-8 is exactly halfway between 1.0 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).0, 0x3f80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
        assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0).0, 0x3f82);
        assert_eq!(Bf16::from_f32(-2.5).to_f32(), -2.5);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(Bf16::from_f32(f32::INFINITY).to_f32(), f32::INFINITY);
        // The largest finite f32 rounds to infinity in bf16, as IEEE rounding says.
        assert_eq!(Bf16::from_f32(f32::MAX).to_f32(), f32::INFINITY);
    }

    #[test]
    fn relative_error_is_within_half_ulp() {
        for i in 1..10_000 {
            let x = (i as f32) * 0.123_456_7 - 600.0;
            let y = Bf16::from_f32(x).to_f32();
            assert!((x - y).abs() <= x.abs() * (1.0 / 256.0), "{x} -> {y}");
        }
    }
}
