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

/// [`Bf16::from_f32`] without branches, so that a loop of it vectorises:
/// the same bits for every input (NaN included).
#[inline(always)]
fn round_bits(bits: u32) -> u16 {
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    (if bits & 0x7fff_ffff > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    }) as u16
}

#[inline(always)]
fn round_slice(src: &[f32], dst: &mut [Bf16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = Bf16(round_bits(s.to_bits()));
    }
}

/// The loop compiled for AVX-512 (16 lanes), chosen at run time: the
/// encoder's bf16 backend converts every GEMM input, several MB a block,
/// and the scalar form with its NaN branch took a fifth of the time the
/// encoder spends outside oneDNN.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn round_slice_avx512(src: &[f32], dst: &mut [Bf16]) {
    round_slice(src, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn round_slice_avx2(src: &[f32], dst: &mut [Bf16]) {
    round_slice(src, dst)
}

/// Converts `src` into `dst`, rounding as [`Bf16::from_f32`] does (the
/// same bits), in the widest vectors this CPU has. Panics if the lengths
/// differ (a caller bug, not an input error).
pub fn f32_to_bf16(src: &[f32], dst: &mut [Bf16]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "f32_to_bf16: src and dst lengths must match"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU has AVX-512 F and BW (checked just above).
            return unsafe { round_slice_avx512(src, dst) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { round_slice_avx2(src, dst) };
        }
    }
    round_slice(src, dst)
}

/// [`f32_to_bf16`] into `dst`, resized to `src`'s length (a buffer kept
/// between calls allocates only when it grows).
pub fn f32_to_bf16_into(src: &[f32], dst: &mut Vec<Bf16>) {
    dst.resize(src.len(), Bf16(0));
    f32_to_bf16(src, dst)
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
    let mut out = Vec::new();
    f32_to_bf16_into(src, &mut out);
    out
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

    /// The vectorised slice conversion gives the scalar conversion's bits
    /// on every class of input: ties both ways, subnormals, infinities,
    /// the largest finite values, NaNs with payloads and signs, and every
    /// length's tail (the vector loop's remainder).
    #[test]
    fn slice_conversion_matches_the_scalar_bits() {
        let mut bits: Vec<u32> = vec![
            0,
            0x8000_0000,
            1,
            0x8000_0001,
            0x007f_ffff,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_7fff,
            0x3f81_7fff,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0xff80_0001,
            0x7fc0_0000,
            0xffff_ffff,
            0x7fff_ffff,
            0x7f80_8000,
        ];
        // A spread of ordinary values, by a multiplicative walk over the bits.
        let mut x: u32 = 0x1234_5678;
        for _ in 0..10_000 {
            x = x.wrapping_mul(2_654_435_761).wrapping_add(0x9e37_79b9);
            bits.push(x);
        }
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        for len in [0, 1, 7, 15, 16, 17, 33, src.len()] {
            let mut dst = vec![Bf16(0xdead); len];
            f32_to_bf16(&src[..len], &mut dst);
            for (i, (&s, &d)) in src[..len].iter().zip(&dst).enumerate() {
                assert_eq!(d, Bf16::from_f32(s), "element {i} ({:#010x})", s.to_bits());
            }
        }
        assert_eq!(to_bf16_vec(&src[..5]).len(), 5);
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
