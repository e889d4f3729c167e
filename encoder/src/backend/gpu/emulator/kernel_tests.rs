//! `kernels.cu`'s kernels on the emulated GPU against the same arithmetic on the host.

use super::{EmuBuf, EmuHalf, EmulatedDevice};
use crate::backend::gpu::device::{bf16_bits, bf16_value};
use crate::backend::gpu::{Arg, Device, GemmMath, Kernel, Launch};

/// (rows, cols) of values with a spread of magnitudes and signs.
fn rows_of(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.01 * (1 + i % 5) as f32)
        .collect()
}

#[test]
fn warp_row_kernels_match_the_host_on_every_row_of_a_ragged_launch() {
    // 13 rows: a block holds 8, so the second block has 5 live warps
    // and 3 past the end, which must compute along and write nothing.
    let (rows, cols) = (13usize, 37usize);
    let x = rows_of(rows, cols);
    let dev = EmulatedDevice::new(GemmMath::F32);
    let launch = Launch::warp_rows(rows, "rows").unwrap();
    assert_eq!(launch.grid, 2);
    // LayerNorm, no affine: against the same formula in f64 on the host.
    let mut buf = EmuBuf::new(x.clone());
    let mut args = [
        Arg::Out(&mut buf),
        Arg::Null,
        Arg::Null,
        Arg::I32(rows as i32),
        Arg::I32(cols as i32),
        Arg::F32(1e-5),
    ];
    dev.launch(Kernel::LayerNorm, launch, &mut args).unwrap();
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
        for (j, &x) in row.iter().enumerate() {
            let want = ((x as f64 - mean) / (var + 1e-5).sqrt()) as f32;
            let got = buf.data[r * cols + j];
            assert!(
                (got - want).abs() <= 1e-6,
                "row {r} col {j}: {got} vs {want}"
            );
        }
    }
    // Residual + bias + LayerNorm in one launch: the same bits as the
    // epilogue followed by LayerNorm.
    let residual = EmuBuf::new(rows_of(rows, cols).iter().map(|v| v * 0.5).collect());
    let bias = EmuBuf::new((0..cols).map(|j| j as f32 * 0.1).collect());
    let gamma = EmuBuf::new((0..cols).map(|j| 1.0 + j as f32 * 0.01).collect());
    let beta = EmuBuf::new((0..cols).map(|j| j as f32 * -0.02).collect());
    let mut fused_half = EmuHalf::new(vec![0; rows * cols]);
    let affine = Some((&gamma, &beta));
    let (fused, split) = fused_and_split(
        &dev,
        &x,
        (rows, cols),
        (&bias, &residual),
        affine,
        Some(&mut fused_half),
    );
    assert_eq!(f32_bits(&fused, rows * cols), f32_bits(&split, rows * cols));
    // The bf16 copy is the f32 result rounded to nearest even.
    let rounded: Vec<u16> = fused.data[..rows * cols]
        .iter()
        .map(|&v| bf16_bits(v))
        .collect();
    assert_eq!(&fused_half.data[..rows * cols], &rounded[..]);
    // Softmax: each row sums to 1 and matches the host's.
    let sm = softmax_on(&dev, &x, rows, cols, None);
    // Into bf16 only: the f32 scores stay as they were.
    let mut probs = EmuHalf::new(vec![0; rows * cols]);
    let scores = softmax_on(&dev, &x, rows, cols, Some(&mut probs));
    assert_eq!(&scores.data[..rows * cols], &x[..]);
    let rounded: Vec<u16> = sm.data[..rows * cols]
        .iter()
        .map(|&v| bf16_bits(v))
        .collect();
    assert_eq!(&probs.data[..rows * cols], &rounded[..]);
    // The epilogue into bf16 only (keep 0) leaves y alone.
    let mut y = EmuBuf::new(x.clone());
    let mut yh = EmuHalf::new(vec![0; rows * cols]);
    let mut args = [
        Arg::Out(&mut y),
        Arg::In(&bias),
        Arg::Null,
        Arg::HalfOut(&mut yh),
        Arg::I32(rows as i32),
        Arg::I32(cols as i32),
        Arg::I32(1),
        Arg::I32(0),
    ];
    let seg = Launch::row_segments(rows, cols, "blocks").unwrap();
    dev.launch(Kernel::BiasEpilogue, seg, &mut args).unwrap();
    assert_eq!(&y.data[..rows * cols], &x[..]);
    for (i, (&h, &v)) in yh.data.iter().zip(&x).enumerate() {
        assert_eq!(
            h,
            bf16_bits((v + bias.data[i % cols]).max(0.0)),
            "element {i}"
        );
    }
    check_softmax(&x, &sm.data, rows, cols);
}

/// The bits of `b`'s first `n` floats.
fn f32_bits(b: &EmuBuf, n: usize) -> Vec<u32> {
    b.data[..n].iter().map(|v| v.to_bits()).collect()
}

/// `norm(x + bias + residual)` over copies of `x` (rows, cols) two ways:
/// one `residual_layer_norm` launch (also into `half` if given), and
/// `bias_epilogue` then `layer_norm`; `affine` is (gamma, beta).
fn fused_and_split(
    dev: &EmulatedDevice,
    x: &[f32],
    (rows, cols): (usize, usize),
    (bias, residual): (&EmuBuf, &EmuBuf),
    affine: Option<(&EmuBuf, &EmuBuf)>,
    half: Option<&mut EmuHalf>,
) -> (EmuBuf, EmuBuf) {
    let launch = Launch::warp_rows(rows, "rows").unwrap();
    let gamma_beta = || match affine {
        Some((g, b)) => (Arg::In(g), Arg::In(b)),
        None => (Arg::Null, Arg::Null),
    };
    let (gamma, beta) = gamma_beta();
    let mut fused = EmuBuf::new(x.to_vec());
    let mut args = [
        Arg::Out(&mut fused),
        Arg::In(bias),
        Arg::In(residual),
        gamma,
        beta,
        half.map_or(Arg::Null, Arg::HalfOut),
        Arg::I32(rows as i32),
        Arg::I32(cols as i32),
        Arg::F32(1e-5),
    ];
    dev.launch(Kernel::ResidualLayerNorm, launch, &mut args)
        .unwrap();
    let mut split = EmuBuf::new(x.to_vec());
    let mut args = [
        Arg::Out(&mut split),
        Arg::In(bias),
        Arg::In(residual),
        Arg::Null,
        Arg::I32(rows as i32),
        Arg::I32(cols as i32),
        Arg::I32(0),
        Arg::I32(1),
    ];
    let seg = Launch::row_segments(rows, cols, "blocks").unwrap();
    dev.launch(Kernel::BiasEpilogue, seg, &mut args).unwrap();
    let (gamma, beta) = gamma_beta();
    let mut args = [
        Arg::Out(&mut split),
        gamma,
        beta,
        Arg::I32(rows as i32),
        Arg::I32(cols as i32),
        Arg::F32(1e-5),
    ];
    dev.launch(Kernel::LayerNorm, launch, &mut args).unwrap();
    (fused, split)
}

/// `softmax_rows` over a copy of `x` (rows, cols) as the GPU path
/// launches it; with `half`, into that in bf16.
fn softmax_on(
    dev: &EmulatedDevice,
    x: &[f32],
    rows: usize,
    cols: usize,
    half: Option<&mut EmuHalf>,
) -> EmuBuf {
    let (launch, group) = Launch::softmax_rows(rows, cols, "rows").unwrap();
    let mut buf = EmuBuf::new(x.to_vec());
    let mut args = [
        Arg::Out(&mut buf),
        half.map_or(Arg::Null, Arg::HalfOut),
        Arg::I32(rows as i32),
        Arg::I32(cols as i32),
        Arg::I32(group as i32),
    ];
    dev.launch(Kernel::SoftmaxRows, launch, &mut args).unwrap();
    buf
}

/// Each row of `got` is the softmax of `x`'s, against the host in f64.
fn check_softmax(x: &[f32], got: &[f32], rows: usize, cols: usize) {
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        for (j, &x) in row.iter().enumerate() {
            let want = ((x as f64 - m).exp() / z) as f32;
            let g = got[r * cols + j];
            assert!(
                (g - want).abs() <= 1e-6,
                "softmax of {cols} columns, row {r} col {j}: {g} vs {want}"
            );
        }
    }
}

#[test]
fn softmax_groups_of_every_width_cover_every_row() {
    // Groups of 1, 2, 4, 8, 16 and 32 lanes (the register path), rows
    // wider than a warp's registers (the loop path), and a row count
    // that leaves dead groups in the last block.
    let dev = EmulatedDevice::new(GemmMath::F32);
    let rows = 45;
    for (cols, group) in [
        (3, 1),
        (9, 2),
        (30, 4),
        (64, 8),
        (100, 16),
        (256, 32),
        (300, 32),
    ] {
        let (launch, g) = Launch::softmax_rows(rows, cols, "rows").unwrap();
        assert_eq!(g, group, "{cols} columns");
        assert_eq!(
            launch.grid as usize,
            rows.div_ceil(launch.block as usize / group as usize)
        );
        let x = rows_of(rows, cols);
        let mut probs = EmuHalf::new(vec![0; rows * cols]);
        let scores = softmax_on(&dev, &x, rows, cols, Some(&mut probs));
        assert_eq!(&scores.data[..rows * cols], &x[..], "{cols} columns");
        let sm = softmax_on(&dev, &x, rows, cols, None);
        check_softmax(&x, &sm.data, rows, cols);
        let rounded: Vec<u16> = sm.data[..rows * cols]
            .iter()
            .map(|&v| bf16_bits(v))
            .collect();
        assert_eq!(&probs.data[..rows * cols], &rounded[..], "{cols} columns");
    }
}

#[test]
fn residual_layer_norm_of_a_wide_row_matches_the_split_launches() {
    // Past 1,024 columns the row no longer fits a warp's registers and
    // the kernel takes its loop: the same bits either way.
    let dev = EmulatedDevice::new(GemmMath::F32);
    for (rows, cols) in [(11usize, 640usize), (11, 1030)] {
        let x = rows_of(rows, cols);
        let residual = EmuBuf::new(x.iter().map(|v| v * -0.3 + 1.0).collect());
        let bias = EmuBuf::new((0..cols).map(|j| (j % 7) as f32 * 0.1).collect());
        let (fused, split) =
            fused_and_split(&dev, &x, (rows, cols), (&bias, &residual), None, None);
        let n = rows * cols;
        assert!(f32_bits(&fused, n) == f32_bits(&split, n), "{cols} columns");
    }
}

#[test]
fn doy_encoding_kernel_matches_the_host_encoding() {
    let d = 64;
    let doys: Vec<f32> = (0..367)
        .map(|i| i as f32)
        .chain([0.5, 365.25, 1e4])
        .collect();
    let rows = doys.len();
    let mut out = EmuBuf::new(vec![0.0; rows * d]);
    let doys_buf = EmuBuf::new(doys.clone());
    let launch = Launch {
        grid: (rows * d / 2).div_ceil(1024) as u32,
        block: 1024,
        shared_bytes: 0,
    };
    let mut args = [
        Arg::Out(&mut out),
        Arg::In(&doys_buf),
        Arg::I32(rows as i32),
        Arg::I32(d as i32),
        Arg::Null,
        Arg::I32(0),
    ];
    let dev = EmulatedDevice::new(GemmMath::F32);
    dev.launch(Kernel::DoyEncoding, launch, &mut args).unwrap();
    // From the table the GPU path keeps: the same bits, whole days
    // copied and the rest (a fraction, a day past the table, a
    // negative one) computed.
    let doys_table: Vec<f32> = doys.iter().copied().chain([-3.0, 367.0]).collect();
    let rows_t = doys_table.len();
    let table = crate::backend::gpu::doy_table(&dev, d).unwrap();
    let mut from_table = EmuBuf::new(vec![0.0; rows_t * d]);
    let mut computed = EmuBuf::new(vec![0.0; rows_t * d]);
    let doys_buf = EmuBuf::new(doys_table.clone());
    crate::backend::gpu::doy_encoding(&dev, &doys_buf, &mut from_table, rows_t, d, Some(&table))
        .unwrap();
    crate::backend::gpu::doy_encoding(&dev, &doys_buf, &mut computed, rows_t, d, None).unwrap();
    let bits = |b: &EmuBuf| {
        b.data[..rows_t * d]
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert!(bits(&from_table) == bits(&computed));
    // And the table is what is read: a changed entry shows.
    let mut marked = EmuBuf::new(table.data[..table.len()].to_vec());
    marked.data[5 * d + 1] = 42.0;
    crate::backend::gpu::doy_encoding(&dev, &doys_buf, &mut from_table, rows_t, d, Some(&marked))
        .unwrap();
    assert_eq!(from_table.data[5 * d + 1], 42.0);
    assert_eq!(
        from_table.data[rows_t * d - 1],
        computed.data[rows_t * d - 1]
    );
    let host = crate::model::DoyEncoding::new(d);
    let mut want = vec![0f32; d];
    for (r, &doy) in doys.iter().enumerate() {
        host.encode(doy, &mut want);
        for (j, (&got, &w)) in out.data[r * d..(r + 1) * d].iter().zip(&want).enumerate() {
            // The same double-precision formula, rounded to float: equal
            // but for the last bit of a libm that rounds differently.
            assert!(
                (got - w).abs() <= f32::EPSILON * w.abs().max(1e-3),
                "doy {doy}, channel {j}: {got} vs {w}"
            );
        }
    }
}

/// `attention_mma` (tensor cores, the running softmax over blocks of
/// keys) against attention computed in f64 from the same bf16 Q, K and
/// V: one (pixels, len, d, heads) case per edge: a head of 16 (one k
/// step), of 80, of 20 (padded to 32, read a value at a time: not a
/// multiple of 8), of 12 in a d of 36, the widest, 160 (the published
/// models'); a sequence shorter than one block of keys, ones that end
/// inside a later block (so the maximum is rescaled), more query rows
/// than one block holds.
/// Allowed: 2⁻⁷ of the head's largest |V| (the weights and the output
/// are each rounded to bf16 once, 2⁻⁹ apiece); a fragment read from the
/// wrong lane or register is off by the size of V itself.
#[test]
fn attention_mma_matches_exact_attention() {
    let dev = EmulatedDevice::new(GemmMath::Bf16);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
    };
    for (px, len, d, nh) in [
        (2, 8, 32, 2),
        (1, 70, 80, 1),
        (2, 130, 40, 2),
        (1, 64, 320, 2),
        (1, 100, 36, 3),
    ] {
        let hd = d / nh;
        let qkv: Vec<u16> = (0..px * len * 3 * d)
            .map(|_| bf16_bits(rnd() as f32))
            .collect();
        let x = |p: usize, t: usize, part: usize, h: usize, c: usize| {
            bf16_value(qkv[(p * len + t) * 3 * d + part * d + h * hd + c]) as f64
        };
        let input = EmuHalf::new(qkv.clone());
        let mut out = EmuHalf::new(vec![0xffff; px * len * d]);
        let launch = Launch::attention_mma(px, len, nh, hd).unwrap().unwrap();
        let mut args = [
            Arg::HalfIn(&input),
            Arg::HalfOut(&mut out),
            Arg::I32(len as i32),
            Arg::I32(d as i32),
            Arg::I32(nh as i32),
            Arg::F32(1.0 / (hd as f32).sqrt()),
        ];
        dev.launch(Kernel::AttentionMma, launch, &mut args).unwrap();
        let scale = 1.0 / (hd as f64).sqrt();
        let mut worst = 0f64;
        for p in 0..px {
            for h in 0..nh {
                let vmax = (0..len)
                    .flat_map(|t| (0..hd).map(move |c| (t, c)))
                    .map(|(t, c)| x(p, t, 2, h, c).abs())
                    .fold(0.0, f64::max);
                for i in 0..len {
                    let s: Vec<f64> = (0..len)
                        .map(|j| {
                            (0..hd)
                                .map(|c| x(p, i, 0, h, c) * x(p, j, 1, h, c))
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for c in 0..hd {
                        let want = (0..len).map(|j| w[j] * x(p, j, 2, h, c)).sum::<f64>() / sum;
                        let got = bf16_value(out.data[(p * len + i) * d + h * hd + c]) as f64;
                        let err = (got - want).abs() / vmax;
                        assert!(
                            err <= 1.0 / 128.0,
                            "({px}, {len}, {d}, {nh}): pixel {p} head {h} row {i} col {c}: \
                             {got} against {want}"
                        );
                        worst = worst.max(err);
                    }
                }
            }
        }
        eprintln!("attention_mma ({px}, {len}, {d}, {nh}): worst error {worst:.2e} of max |V|");
    }
}
