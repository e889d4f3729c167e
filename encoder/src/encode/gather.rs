//! A window's chunks: pixels grouped by sequence length, their tokens gathered on threads.

use std::collections::BTreeMap;

use crate::model::Modality;
use crate::sequence::{bin_len, Gatherer};
use crate::tile::TileInputs;

/// Chunks of tokens the gatherer sends ahead of the backend.
pub(super) const GATHER_AHEAD: usize = 2;

/// One chunk of a window to gather: pixels (positions in the window) of
/// one modality whose sequences have `len` tokens.
pub(super) struct ChunkPlan {
    modality: Modality,
    len: usize,
    members: Vec<u32>,
}

/// A gathered chunk: `members`' tokens, (n, len, bands) standardised
/// values and (n, len) days of year.
pub(super) struct ChunkTokens {
    pub(super) modality: Modality,
    pub(super) len: usize,
    pub(super) members: Vec<u32>,
    pub(super) values: Vec<f32>,
    pub(super) doys: Vec<f32>,
}

/// The chunks of a window whose pixels have `counts` (S2, S1; one per
/// pixel, in window order): per modality (S2, then S1), its pixels grouped
/// by sequence length, each group cut into chunks of `chunk`.
pub(super) fn plan_window(counts: &[Vec<u16>; 2], chunk: usize) -> Vec<ChunkPlan> {
    let mut plans = Vec::new();
    for (mi, m) in [Modality::S2, Modality::S1].into_iter().enumerate() {
        let mut by_len: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for (i, &c) in counts[mi].iter().enumerate() {
            by_len
                .entry(bin_len(c as usize))
                .or_default()
                .push(i as u32);
        }
        for (len, members) in by_len {
            plans.extend(members.chunks(chunk).map(|part| ChunkPlan {
                modality: m,
                len,
                members: part.to_vec(),
            }));
        }
    }
    plans
}

/// Pixels each gathering thread takes at least: below this a chunk is
/// gathered on one thread (a CPU backend's chunks, tens to hundreds of
/// pixels, always are: its cores are busy computing).
const GATHER_PIXELS_PER_THREAD: usize = 1024;

/// Threads that gather one chunk: enough that a GPU's chunks of thousands
/// of pixels are ready before it wants them (one thread gathered about
/// 65,000 px/s on the 2-core dev VM, below what an H200 should encode),
/// leaving a core each to the reader and the thread feeding the device.
fn gather_threads(pixels: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (pixels / GATHER_PIXELS_PER_THREAD).clamp(1, cores.saturating_sub(2).clamp(1, 8))
}

/// Gather `plan`'s tokens from the window `part` into `spare`'s buffers
/// (resized; their old contents are overwritten), on [`gather_threads`]
/// threads, each filling its own pixels' part of the buffers.
pub(super) fn gather_chunk(
    part: &TileInputs,
    plan: ChunkPlan,
    spare: (Vec<f32>, Vec<f32>),
) -> ChunkTokens {
    let threads = gather_threads(plan.members.len());
    gather_chunk_on(part, plan, spare, threads)
}

/// [`gather_chunk`] on `threads` threads.
fn gather_chunk_on(
    part: &TileInputs,
    plan: ChunkPlan,
    spare: (Vec<f32>, Vec<f32>),
    threads: usize,
) -> ChunkTokens {
    let (mut values, mut doys) = spare;
    let bands = plan.modality.bands();
    let (n, len) = (plan.members.len(), plan.len);
    values.resize(n * len * bands, 0.0);
    doys.resize(n * len, 0.0);
    let gather = |members: &[u32], values: &mut [f32], doys: &mut [f32]| {
        let mut g = Gatherer::new(part, plan.modality);
        let tokens = values
            .chunks_exact_mut(len * bands)
            .zip(doys.chunks_exact_mut(len));
        for (&i, (v, d)) in members.iter().zip(tokens) {
            g.gather(i as usize, len, v, d);
        }
    };
    if threads <= 1 {
        gather(&plan.members, &mut values, &mut doys);
    } else {
        let per = n.div_ceil(threads);
        std::thread::scope(|s| {
            let parts = plan
                .members
                .chunks(per)
                .zip(values.chunks_mut(per * len * bands))
                .zip(doys.chunks_mut(per * len));
            for ((members, v), d) in parts {
                s.spawn(move || gather(members, v, d));
            }
        });
    }
    ChunkTokens {
        modality: plan.modality,
        len,
        members: plan.members,
        values,
        doys,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::source::TileSource;
    use crate::synth::SynthTile;

    #[test]
    fn a_chunk_gathered_on_several_threads_is_the_chunk_gathered_on_one() {
        let tile = TileInputs::synthetic(&SynthTile {
            height: 7,
            width: 45,
            s2_frames: 40,
            s1_asc_frames: 12,
            s1_desc_frames: 9,
            clear: 0.6,
            seed: 5,
        });
        let counts = tile
            .valid_counts(0..tile.pixels(), &AtomicBool::new(false))
            .unwrap();
        let mut chunks = 0;
        for plan in plan_window(&counts, 1 << 20) {
            let copy = |p: &ChunkPlan| ChunkPlan {
                modality: p.modality,
                len: p.len,
                members: p.members.clone(),
            };
            let one = gather_chunk_on(&tile, copy(&plan), Default::default(), 1);
            // Spare buffers with stale contents must not show through.
            let stale = (vec![f32::NAN; 7], vec![1.0; 99999]);
            let three = gather_chunk_on(&tile, copy(&plan), stale, 3);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&one.values),
                bits(&three.values),
                "{:?} len {}",
                plan.modality,
                plan.len
            );
            assert_eq!(bits(&one.doys), bits(&three.doys));
            assert_eq!(
                one.values.len(),
                plan.members.len() * plan.len * plan.modality.bands()
            );
            assert!(one.values.iter().all(|v| v.is_finite()));
            chunks += 1;
        }
        // Both modalities, several bins each.
        assert!(chunks >= 4, "{chunks}");
    }
}
