//! Cutting a tile's pixels with data into windows as the counts of its ranges arrive.

/// Pixels with data in the first window: `max(chunk, window / 4)`, at most
/// `window`; every later window has `window` (the last what is left). A
/// device idles from the start until the first window is read and its
/// first chunk gathered, and the host reads each later window while the
/// device computes the one before: so the first is small, and still takes
/// the device about as long as reading a whole window takes the host (on
/// the H200 a quarter window at 75,000 px/s is 55 ms). Windows regroup
/// pixels into chunks, so the bits may differ from other windows within
/// the tolerance `windowing_does_not_change_the_output` checks; they do not
/// depend on how the tile was counted.
pub(super) fn first_window(window: usize, chunk: usize) -> usize {
    let window = window.max(1);
    chunk.max(window / 4).clamp(1, window)
}

/// The ranges of a tile's `npix` pixels the counter counts, in raster
/// order: `first` pixels (the first window's, if every one has data), then
/// ranges twice as long each time up to four windows (counted on several
/// threads where the source can), so the first window waits only for its
/// own count and the counter soon runs far ahead of the reader.
pub(super) fn count_ranges(
    npix: usize,
    first: usize,
    window: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    let most = (4 * window).max(first).max(1);
    let mut len = first.clamp(1, most);
    let mut start = 0;
    std::iter::from_fn(move || {
        (start < npix).then(|| {
            let range = start..npix.min(start + len);
            start = range.end;
            len = (2 * len).min(most);
            range
        })
    })
}

/// Cuts a tile's pixels with data into windows (see [`first_window`]) as
/// the counts of its ranges arrive in raster order: the same windows
/// whatever the ranges.
pub(super) struct WindowCutter {
    first: usize,
    window: usize,
    /// Windows taken so far.
    taken: usize,
    /// Pixels with data counted and not yet in a window, ascending, and
    /// their S2 and S1 counts.
    pixels: Vec<u32>,
    counts: [Vec<u16>; 2],
}

/// A window's pixels (ascending, raster order) and their counts.
pub(super) struct CutWindow {
    pub(super) pixels: Vec<u32>,
    pub(super) counts: [Vec<u16>; 2],
}

impl WindowCutter {
    pub(super) fn new(window: usize, chunk: usize) -> Self {
        WindowCutter {
            first: first_window(window, chunk),
            window: window.max(1),
            taken: 0,
            pixels: Vec::new(),
            counts: [Vec::new(), Vec::new()],
        }
    }

    /// Pixels with data the next window takes, if the tile has them.
    fn want(&self) -> usize {
        if self.taken == 0 {
            self.first
        } else {
            self.window
        }
    }

    /// Whether the next window is whole (more counts may still add to it
    /// until it is).
    pub(super) fn ready(&self) -> bool {
        self.pixels.len() >= self.want()
    }

    /// The counts of pixels `start..start + counts[0].len()`: those with
    /// data join the queue.
    pub(super) fn add(&mut self, start: usize, counts: &[Vec<u16>; 2]) {
        for (k, (&s2, &s1)) in counts[0].iter().zip(&counts[1]).enumerate() {
            if s2 > 0 || s1 > 0 {
                self.pixels.push((start + k) as u32);
                self.counts[0].push(s2);
                self.counts[1].push(s1);
            }
        }
    }

    /// The next window (whole, or the rest once the tile is counted);
    /// `None` once every pixel with data is in one.
    pub(super) fn take(&mut self) -> Option<CutWindow> {
        if self.pixels.is_empty() {
            return None;
        }
        let n = self.want().min(self.pixels.len());
        self.taken += 1;
        let pixels = split_front(&mut self.pixels, n);
        let counts = [
            split_front(&mut self.counts[0], n),
            split_front(&mut self.counts[1], n),
        ];
        Some(CutWindow { pixels, counts })
    }
}

/// The first `n` elements of `v`, taken out of it.
fn split_front<T>(v: &mut Vec<T>, n: usize) -> Vec<T> {
    let rest = v.split_off(n);
    std::mem::replace(v, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts of `n` pixels where about one in `gap` has no data (and
    /// the others a few observations of one modality or both).
    fn counts_with_gaps(n: usize, gap: usize, seed: u64) -> [Vec<u16>; 2] {
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut s2, mut s1) = (vec![0u16; n], vec![0u16; n]);
        for (a, b) in s2.iter_mut().zip(&mut s1) {
            let r = next();
            if gap == 0 || r % gap as u64 != 0 {
                *a = (r >> 8) as u16 % 40;
                *b = (r >> 24) as u16 % 30 + u16::from(*a == 0);
            }
        }
        [s2, s1]
    }

    /// The windows the cutter makes from counts arriving in `ranges`.
    fn cut(
        counts: &[Vec<u16>; 2],
        ranges: &[std::ops::Range<usize>],
        window: usize,
        chunk: usize,
    ) -> Vec<Vec<u32>> {
        let mut cutter = WindowCutter::new(window, chunk);
        let mut windows = Vec::new();
        for r in ranges {
            cutter.add(
                r.start,
                &[counts[0][r.clone()].to_vec(), counts[1][r.clone()].to_vec()],
            );
            while cutter.ready() {
                let w = cutter.take().unwrap();
                // Each window's counts are its own pixels'.
                for (k, &p) in w.pixels.iter().enumerate() {
                    assert_eq!(w.counts[0][k], counts[0][p as usize]);
                    assert_eq!(w.counts[1][k], counts[1][p as usize]);
                }
                windows.push(w.pixels);
            }
        }
        while let Some(w) = cutter.take() {
            windows.push(w.pixels);
        }
        windows
    }

    /// Whatever ranges the tile is counted in, the windows are the pixels
    /// with data in raster order, cut after `first_window` and then every
    /// `window` pixels: so how an encode counts never changes its output.
    #[test]
    fn windows_are_the_same_whatever_ranges_the_tile_is_counted_in() {
        for (n, gap, window, chunk) in [
            (0, 0, 16384, 1024),
            (5, 0, 16384, 1024),
            (65536, 0, 16384, 1024),
            (65537, 3, 16384, 4096),
            (100, 2, 13, 8),
            (40, 1, 16384, 16384),
            (9, 0, 1, 1),
            (3000, 5, 64, 16),
        ] {
            let counts = counts_with_gaps(n, gap, n as u64 + 7);
            let active: Vec<u32> = (0..n as u32)
                .filter(|&p| counts[0][p as usize] > 0 || counts[1][p as usize] > 0)
                .collect();
            let first = first_window(window, chunk);
            let mut want = Vec::new();
            let mut at = 0;
            while at < active.len() {
                let len = if at == 0 { first } else { window };
                let end = active.len().min(at + len);
                want.push(active[at..end].to_vec());
                at = end;
            }
            let whole: Vec<_> = std::iter::once(0..n).filter(|r| !r.is_empty()).collect();
            let singles: Vec<_> = (0..n).map(|p| p..p + 1).collect();
            let odd: Vec<_> = (0..n).step_by(37).map(|a| a..n.min(a + 37)).collect();
            for (how, ranges) in [
                (
                    "as the encoder counts",
                    count_ranges(n, first, window).collect::<Vec<_>>(),
                ),
                ("whole", whole),
                ("a pixel at a time", singles),
                ("37 at a time", odd),
            ] {
                assert_eq!(
                    cut(&counts, &ranges, window, chunk),
                    want,
                    "({n}, {window}, {chunk}) {how}"
                );
            }
        }
        // A quarter window first, where the chunk is smaller; then whole windows.
        assert_eq!(first_window(16384, 1024), 4096);
        assert_eq!(first_window(13, 8), 8);
        assert_eq!(first_window(16384, 16384), 16384);
    }

    /// The counter's ranges cover the tile once, in order, the first as
    /// long as the first window, then doubling up to four windows.
    #[test]
    fn count_ranges_cover_the_tile_once_growing_from_the_first_window() {
        for (n, first, window) in [
            (0, 4096, 16384),
            (1, 4096, 16384),
            (65536, 4096, 16384),
            (1_210_000, 4096, 16384),
            (50, 1, 1),
            (10, 0, 0),
        ] {
            let ranges: Vec<_> = count_ranges(n, first, window).collect();
            let mut at = 0;
            for r in &ranges {
                assert_eq!(r.start, at, "({n}, {first}, {window}): {ranges:?}");
                assert!(r.end > r.start && r.len() <= (4 * window).max(first).max(1));
                at = r.end;
            }
            assert_eq!(at, n);
        }
        let r: Vec<_> = count_ranges(1_000_000, 4096, 16384)
            .take(6)
            .map(|r| r.len())
            .collect();
        assert_eq!(r, [4096, 8192, 16384, 32768, 65536, 65536]);
    }
}
