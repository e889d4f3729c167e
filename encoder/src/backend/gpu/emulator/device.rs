//! [`Device`] on the emulated GPU: copies, cuBLAS's SGEMM contract in f32, launches.

use std::ffi::{c_void, CString};

use super::{err, EmuBuf, EmuHalf, EmuStaging, EmulatedDevice};
use crate::backend::gpu::device::{bf16_bits, bf16_value, HalfGemmOut};
use crate::backend::gpu::{Arg, Device, Epilogue, Gemm, GemmMath, Kernel, Launch};
use crate::error::Result;

/// `x` as a TF32 tensor core sees it: the low 13 of 23 mantissa bits
/// dropped. Truncation, the cruder of the two conversions a GPU may use
/// (the other rounds to nearest), so precision measured here is a floor.
fn tf32(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & !0x1fff)
}

/// `x` rounded to bfloat16 (8 bits of significand) to nearest, ties to
/// even, as cuBLAS's `CUBLAS_COMPUTE_32F_FAST_16BF` converts its f32
/// inputs; NaN stays NaN.
fn bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    bf16_value(bf16_bits(x))
}

/// Fill `dst` with vectors of `k` floats from the column-major `src`
/// (leading dimension `ld`): vector i is column i of `src` when `columns`,
/// else row i.
fn gather(dst: &mut [f32], src: &[f32], k: usize, ld: usize, columns: bool) {
    if k == 0 {
        return;
    }
    for (i, v) in dst.chunks_exact_mut(k).enumerate() {
        for (l, x) in v.iter_mut().enumerate() {
            *x = if columns {
                src[l + i * ld]
            } else {
                src[i + l * ld]
            };
        }
    }
}

/// cuBLAS's column-major strided batched GEMM ([`Gemm`]) over f32 slices
/// starting at each matrix, with `round` applied to every element of A and
/// B as it is read (the tensor cores' input conversion), dot products in
/// f32.
fn gemm_f32(g: &Gemm, am: &[f32], bm: &[f32], cm: &mut [f32], round: fn(f32) -> f32) {
    // op(A) as m rows of k, op(B) as n columns of k, then dot products.
    let mut ar = vec![0f32; g.m * g.k];
    let mut bc = vec![0f32; g.n * g.k];
    for p in 0..g.batch {
        let (ao, bo, co) = (p * g.stride_a, p * g.stride_b, p * g.stride_c);
        // op(A)'s row i is A's column i when transposed; op(B)'s
        // column j is B's column j unless transposed.
        gather(&mut ar, &am[ao..], g.k, g.lda, g.trans_a);
        gather(&mut bc, &bm[bo..], g.k, g.ldb, !g.trans_b);
        ar.iter_mut()
            .chain(bc.iter_mut())
            .for_each(|x| *x = round(*x));
        for j in 0..g.n {
            let bj = &bc[j * g.k..(j + 1) * g.k];
            for i in 0..g.m {
                let ai = &ar[i * g.k..(i + 1) * g.k];
                let dot: f32 = ai.iter().zip(bj).map(|(x, y)| x * y).sum();
                let ci = &mut cm[co + i + j * g.ldc];
                *ci = if g.beta == 0.0 {
                    g.alpha * dot
                } else {
                    g.alpha * dot + g.beta * *ci
                };
            }
        }
    }
}

impl Device for EmulatedDevice {
    type Buf = EmuBuf;
    type Half = EmuHalf;
    type Staging = EmuStaging;

    fn math(&self) -> GemmMath {
        self.math
    }

    fn bind(&self) -> Result<()> {
        Ok(())
    }

    fn upload_half(&self, host: &[u16]) -> Result<EmuHalf> {
        Ok(EmuHalf::new(host.to_vec()))
    }

    /// NaN, so reading what nothing wrote shows.
    fn alloc_half(&self, n: usize) -> Result<EmuHalf> {
        Ok(EmuHalf::new(vec![0x7fc0; n]))
    }

    fn half_len(buf: &EmuHalf) -> usize {
        buf.len()
    }

    /// The f32 path's arithmetic on the bf16 values (exact in f32): so a
    /// model run on bf16 buffers gives the bits of the same model run on
    /// f32 buffers whose GEMMs round their inputs to bf16.
    unsafe fn gemm_half_unchecked(
        &self,
        g: &Gemm,
        a: (&EmuHalf, usize),
        b: (&EmuHalf, usize),
        c: HalfGemmOut<'_, EmuBuf, EmuHalf>,
    ) -> Result<()> {
        let widen = |h: &EmuHalf, off: usize| -> Vec<f32> {
            h.data[off..].iter().map(|&v| bf16_value(v)).collect()
        };
        let (am, bm) = (widen(a.0, a.1), widen(b.0, b.1));
        match c {
            HalfGemmOut::F32(buf, off) => gemm_f32(g, &am, &bm, &mut buf.data[off..], |x| x),
            HalfGemmOut::Bf16(buf, off) => {
                // Through f32 (beta · C read back from bf16, as cuBLAS does),
                // rounded on the way out.
                let mut tmp: Vec<f32> = buf.data[off..].iter().map(|&v| bf16_value(v)).collect();
                gemm_f32(g, &am, &bm, &mut tmp, |x| x);
                for (o, v) in buf.data[off..].iter_mut().zip(&tmp) {
                    *o = bf16_bits(*v);
                }
            }
        }
        Ok(())
    }

    /// The product as `gemm_half` computes it, then `+ bias[row]` and
    /// ReLU in f32, then one rounding: `bias_epilogue`'s arithmetic (the
    /// f32 bias; `bias_half` is for GPUs that take only that).
    unsafe fn gemm_half_bias_unchecked(
        &self,
        g: &Gemm,
        a: (&EmuHalf, usize),
        b: (&EmuHalf, usize),
        ep: &Epilogue<'_, EmuBuf, EmuHalf>,
        mut c: HalfGemmOut<'_, EmuBuf, EmuHalf>,
    ) -> Result<bool> {
        if !self.fuse_bias {
            return Ok(false);
        }
        // The f32 product as `gemm_half` computes it (beta is 0: C unread).
        let mut tmp = EmuBuf::new(vec![0f32; (g.n - 1) * g.ldc + g.m]);
        // SAFETY: the caller checked A and B, and tmp holds C's extent.
        unsafe { self.gemm_half_unchecked(g, a, b, HalfGemmOut::F32(&mut tmp, 0))? };
        // In `bias_epilogue`'s order, so fused and unfused give the same
        // bits here (cuBLASLt may add the residual first).
        let value = |i: usize| {
            let v = tmp.data[i] + ep.bias.data[i % g.ldc];
            let v = if ep.relu { v.max(0.0) } else { v };
            match ep.residual {
                Some(r) => v + r.data[i],
                None => v,
            }
        };
        for j in 0..g.n {
            for i in j * g.ldc..j * g.ldc + g.m {
                match &mut c {
                    HalfGemmOut::F32(buf, off) => buf.data[*off + i] = value(i),
                    HalfGemmOut::Bf16(buf, off) => buf.data[*off + i] = bf16_bits(value(i)),
                }
            }
        }
        Ok(true)
    }

    fn upload(&self, host: &[f32]) -> Result<EmuBuf> {
        Ok(EmuBuf::new(host.to_vec()))
    }

    /// NaN, so a kernel or GEMM that reads what nothing wrote shows it.
    fn alloc(&self, n: usize) -> Result<EmuBuf> {
        Ok(EmuBuf::new(vec![f32::NAN; n]))
    }

    fn len(buf: &EmuBuf) -> usize {
        buf.len()
    }

    fn upload_staged_with(
        &self,
        n: usize,
        buf: &mut EmuBuf,
        fill: &mut dyn FnMut(&mut [f32]),
    ) -> Result<EmuStaging> {
        if n > buf.len() {
            return Err(err(format!(
                "copying {n} floats into a buffer of {}",
                buf.len()
            )));
        }
        // Staging starts as NaN, like memory nobody wrote.
        let mut host = vec![f32::NAN; n];
        fill(&mut host);
        buf.data[..n].copy_from_slice(&host);
        Ok(EmuStaging { data: Vec::new() })
    }

    fn download_begin(&self, buf: &EmuBuf, n: usize) -> Result<EmuStaging> {
        if n > buf.len() {
            return Err(err(format!(
                "reading {n} floats of a buffer of {}",
                buf.len()
            )));
        }
        Ok(EmuStaging {
            data: buf.data[..n].to_vec(),
        })
    }

    fn download_wait(_: &EmuStaging) -> Result<()> {
        Ok(())
    }

    fn download_end(&self, staging: EmuStaging, n: usize) -> Result<Vec<f32>> {
        if n != staging.data.len() {
            return Err(err(format!(
                "taking {n} floats of a download of {}",
                staging.data.len()
            )));
        }
        Ok(staging.data)
    }

    fn release(&self, _: EmuStaging) {}

    /// Every call has finished when it returns.
    fn marker(&self) -> Result<EmuStaging> {
        Ok(EmuStaging { data: Vec::new() })
    }

    /// Reads past a buffer land in its canary (NaN) or panic; never UB.
    unsafe fn gemm_unchecked(
        &self,
        g: &Gemm,
        a: (&EmuBuf, usize),
        b: (&EmuBuf, usize),
        c: (&mut EmuBuf, usize),
    ) -> Result<()> {
        let round: fn(f32) -> f32 = match self.math {
            GemmMath::F32 => |x| x,
            GemmMath::Tf32 => tf32,
            GemmMath::Bf16 => bf16,
        };
        gemm_f32(
            g,
            &a.0.data[a.1..],
            &b.0.data[b.1..],
            &mut c.0.data[c.1..],
            round,
        );
        Ok(())
    }

    /// The emulator runs `mma.sync` from PTX's fragment layouts.
    fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    fn launch(
        &self,
        kernel: Kernel,
        launch: Launch,
        args: &mut [Arg<'_, EmuBuf, EmuHalf>],
    ) -> Result<()> {
        let n = args.len();
        let mut ptrs = vec![std::ptr::null_mut::<c_void>(); n];
        let mut ints = vec![0i32; n];
        let mut floats = vec![0f32; n];
        let mut tags = Vec::with_capacity(n + 1);
        for (i, a) in args.iter_mut().enumerate() {
            tags.push(match a {
                // The kernel only reads an `In` buffer; the pointer is
                // mutable because C's `const float*` and `float*` share a
                // representation.
                Arg::In(b) => {
                    ptrs[i] = b.data.as_ptr().cast_mut().cast();
                    b'c'
                }
                Arg::Out(b) => {
                    ptrs[i] = b.data.as_mut_ptr().cast();
                    b'p'
                }
                Arg::HalfOut(b) => {
                    ptrs[i] = b.data.as_mut_ptr().cast();
                    b'q'
                }
                Arg::HalfIn(b) => {
                    ptrs[i] = b.data.as_ptr().cast_mut().cast();
                    b'b'
                }
                Arg::Null => b'n',
                Arg::I32(v) => {
                    ints[i] = *v;
                    b'i'
                }
                Arg::F32(v) => {
                    floats[i] = *v;
                    b'f'
                }
            });
        }
        let mut slots: Vec<*mut c_void> = (0..n)
            .map(|i| match tags[i] {
                b'c' | b'p' | b'b' | b'q' | b'n' => {
                    (&mut ptrs[i]) as *mut *mut c_void as *mut c_void
                }
                b'i' => (&mut ints[i]) as *mut i32 as *mut c_void,
                _ => (&mut floats[i]) as *mut f32 as *mut c_void,
            })
            .collect();
        let tags = CString::new(tags).map_err(|e| err(e.to_string()))?;
        let name = CString::new(kernel.name()).map_err(|e| err(e.to_string()))?;
        // SAFETY: every slot points at a live value of its tag's type, and
        // the pointers at the buffers above.
        unsafe { self.kernels.call(&name, launch, &mut slots, &tags) }?;
        for (i, a) in args.iter().enumerate() {
            let intact = match a {
                Arg::In(b) => b.canary_intact(),
                Arg::Out(b) => b.canary_intact(),
                Arg::HalfOut(b) => b.canary_intact(),
                Arg::HalfIn(b) => b.canary_intact(),
                _ => true,
            };
            if !intact {
                return Err(err(format!(
                    "{} wrote past the end of argument {i}",
                    kernel.name()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6.
        assert_eq!(bf16(1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        // Just above halfway rounds up.
        assert_eq!(bf16(1.0 + 1.0 / 256.0 + 1.0 / 65536.0), 1.0 + 1.0 / 128.0);
        assert_eq!(bf16(-2.5), -2.5);
        assert!(bf16(f32::NAN).is_nan());
        assert_eq!(bf16(f32::INFINITY), f32::INFINITY);
    }

    /// `bias_epilogue` on `y` (no bias, no residual), launched as
    /// `gpu/ops.rs` launches it.
    fn epilogue(
        y: &mut EmuBuf,
        rows: i32,
        cols: i32,
        relu: Arg<'_, EmuBuf, EmuHalf>,
    ) -> Result<()> {
        let launch = Launch::row_segments(rows as usize, cols as usize, "blocks")?;
        let mut args = [
            Arg::Out(y),
            Arg::Null,
            Arg::Null,
            Arg::Null,
            Arg::I32(rows),
            Arg::I32(cols),
            relu,
            Arg::I32(1),
        ];
        EmulatedDevice::new(GemmMath::F32).launch(Kernel::BiasEpilogue, launch, &mut args)
    }

    #[test]
    fn emulator_refuses_wrong_argument_types() {
        let mut y = EmuBuf::new(vec![1.0; 8]);
        // `relu` is an int; a float in its place is refused.
        let e = epilogue(&mut y, 2, 4, Arg::F32(1.0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("takes (pccqiiii), was given (pnnniifi)"), "{e}");
        let launch = Launch {
            grid: 1,
            block: 32,
            shared_bytes: 0,
        };
        let e = EmulatedDevice::new(GemmMath::F32)
            .launch(Kernel::BiasEpilogue, launch, &mut [Arg::Out(&mut y)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("was given (p)"), "{e}");
        // A buffer the kernel writes cannot be passed as read-only.
        let ro = EmuBuf::new(vec![1.0; 8]);
        let mut args = [
            Arg::In(&ro),
            Arg::Null,
            Arg::Null,
            Arg::Null,
            Arg::I32(2),
            Arg::I32(4),
            Arg::I32(0),
            Arg::I32(1),
        ];
        let e = EmulatedDevice::new(GemmMath::F32)
            .launch(Kernel::BiasEpilogue, launch, &mut args)
            .unwrap_err()
            .to_string();
        assert!(e.contains("was given (cnnniiii)"), "{e}");
        // Nor a bf16 buffer where the kernel takes floats.
        let mut h = EmuHalf::new(vec![0; 8]);
        let mut args = [
            Arg::HalfOut(&mut h),
            Arg::Null,
            Arg::Null,
            Arg::Null,
            Arg::I32(2),
            Arg::I32(4),
            Arg::I32(0),
            Arg::I32(1),
        ];
        let e = EmulatedDevice::new(GemmMath::F32)
            .launch(Kernel::BiasEpilogue, launch, &mut args)
            .unwrap_err()
            .to_string();
        assert!(e.contains("was given (qnnniiii)"), "{e}");
    }

    #[test]
    fn emulator_catches_a_kernel_writing_past_a_buffer() {
        let mut y = EmuBuf::new(vec![-1.0; 8]);
        let ok = epilogue(&mut y, 2, 4, Arg::I32(1));
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(&y.data[..8], &[0.0; 8], "ReLU of -1 is 0");
        // Told the buffer holds 3 rows of 4, the kernel writes past its 8
        // floats (ReLU turns the NaN canary into 0).
        let e = epilogue(&mut y, 3, 4, Arg::I32(1)).unwrap_err().to_string();
        assert!(e.contains("wrote past the end of argument 0"), "{e}");
    }

    #[test]
    fn gemm_past_a_buffer_is_refused() {
        let dev = EmulatedDevice::new(GemmMath::F32);
        let (a, b) = (EmuBuf::new(vec![1.0; 6]), EmuBuf::new(vec![1.0; 6]));
        let mut c = EmuBuf::new(vec![0.0; 4]);
        let g = Gemm {
            trans_a: false,
            trans_b: false,
            m: 2,
            n: 2,
            k: 3,
            alpha: 1.0,
            lda: 2,
            ldb: 3,
            beta: 0.0,
            ldc: 2,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        };
        dev.gemm(&g, (&a, 0), (&b, 0), (&mut c, 0)).unwrap();
        assert_eq!(&c.data[..4], &[3.0; 4]);
        let e = dev
            .gemm(&g, (&a, 1), (&b, 0), (&mut c, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("A needs 6 floats, its buffer has 5"), "{e}");
        let e = dev
            .gemm(
                &Gemm {
                    batch: 2,
                    stride_c: 4,
                    ..g
                },
                (&a, 0),
                (&b, 0),
                (&mut c, 0),
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("C needs 8 floats, its buffer has 4"), "{e}");
        let e = dev
            .gemm(&Gemm { lda: 1, ..g }, (&a, 0), (&b, 0), (&mut c, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("lda 1 is below 2"), "{e}");
        // A fused GEMM's residual: f32 C only, holding C's extent.
        let dev = EmulatedDevice::new(GemmMath::Bf16);
        let (ah, bh) = (EmuHalf::new(vec![0x3f80; 6]), EmuHalf::new(vec![0x3f80; 6]));
        let bias = EmuBuf::new(vec![0.5; 2]);
        let residual = EmuBuf::new(vec![10.0, 20.0, 30.0, 40.0]);
        let ep = |residual| Epilogue {
            bias: &bias,
            bias_half: None,
            relu: false,
            residual,
        };
        assert!(dev
            .gemm_half_bias(
                &g,
                (&ah, 0),
                (&bh, 0),
                &ep(Some(&residual)),
                HalfGemmOut::F32(&mut c, 0)
            )
            .unwrap());
        assert_eq!(&c.data[..4], &[13.5, 23.5, 33.5, 43.5]);
        let short = EmuBuf::new(vec![1.0; 3]);
        let mut ch = EmuHalf::new(vec![0; 4]);
        for (what, r, out) in [
            ("short", &short, HalfGemmOut::F32(&mut c, 0)),
            ("bf16 C", &residual, HalfGemmOut::Bf16(&mut ch, 0)),
        ] {
            let e = dev
                .gemm_half_bias(&g, (&ah, 0), (&bh, 0), &ep(Some(r)), out)
                .unwrap_err()
                .to_string();
            assert!(e.contains("residual only with an f32 C"), "{what}: {e}");
        }
    }
}
