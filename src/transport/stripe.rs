//! Striping arithmetic: how one message is split over the data paths of a connection.
//!
//! Rules (pure function, property-tested):
//!
//! * The chunks cover `[0, size)` exactly, in order, without overlap.
//! * Paths are taken fastest first (weight = link speed in Mb/s; unknown speed counts as 1); among
//!   equal speeds the order rotates with `rotate` (the caller passes a message counter) so that
//!   messages too small to split still spread over equally fast paths.
//! * Chunk boundaries are multiples of `align` (NCCL IB aligns to 128 bytes for LL/LL128), and each
//!   chunk differs from its speed-proportional share `size × w / Σw` by less than `align`.
//! * When the message is split, every chunk is at least `min_chunk` bytes: slow paths are dropped
//!   (slowest first) until that holds. Messages smaller than `2 × min_chunk` therefore use one path.
//! * A zero-byte message is one chunk of length 0 on the first path of the order.
#![forbid(unsafe_code)]

/// One piece of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Data path index.
    pub path: usize,
    /// Offset in the message, in bytes.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Striping parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeParams {
    /// Smallest chunk when a message is split over several paths, in bytes (≥ 1).
    pub min_chunk: u64,
    /// Alignment of chunk boundaries, in bytes (≥ 1).
    pub align: u64,
}

impl Default for StripeParams {
    fn default() -> Self {
        StripeParams {
            min_chunk: 32 * 1024,
            align: 128,
        }
    }
}

/// Maximum number of data paths the arithmetic handles (and the protocol supports).
pub const MAX_PATHS: usize = 8;

/// Splits `size` bytes over paths with the given speeds (Mb/s), writing the chunks into `out`
/// (cleared first) in offset order. `speeds` must have 1..=[`MAX_PATHS`] entries; extra entries are
/// ignored and an empty slice yields no chunk.
pub fn stripe(
    size: u64,
    speeds: &[u64],
    params: StripeParams,
    rotate: usize,
    out: &mut Vec<Chunk>,
) {
    out.clear();
    let n = speeds.len().min(MAX_PATHS);
    if n == 0 {
        return;
    }
    let min_chunk = params.min_chunk.max(1);
    let align = params.align.max(1);
    let weight = |i: usize| speeds[i].max(1);

    // Path order: fastest first; ties in rotated index order.
    let mut order = [0usize; MAX_PATHS];
    for (i, slot) in order.iter_mut().enumerate().take(n) {
        *slot = i;
    }
    let rot = rotate % n;
    let key = |i: usize| (std::cmp::Reverse(weight(i)), (i + n - rot) % n);
    order[..n].sort_unstable_by_key(|&i| key(i));

    if size == 0 {
        out.push(Chunk {
            path: order[0],
            offset: 0,
            len: 0,
        });
        return;
    }

    let mut k = usize::try_from(size / min_chunk)
        .unwrap_or(usize::MAX)
        .clamp(1, n);
    loop {
        out.clear();
        let total: u128 = order[..k].iter().map(|&i| u128::from(weight(i))).sum();
        let mut cum: u128 = 0;
        let mut prev: u64 = 0;
        for (j, &p) in order[..k].iter().enumerate() {
            cum += u128::from(weight(p));
            let end = if j + 1 == k {
                size
            } else {
                let ideal = u128::from(size) * cum / total;
                // ideal ≤ size, so the conversion cannot fail.
                let ideal = u64::try_from(ideal).unwrap_or(size);
                (ideal / align * align).max(prev)
            };
            out.push(Chunk {
                path: p,
                offset: prev,
                len: end - prev,
            });
            prev = end;
        }
        if k == 1 || out.iter().all(|c| c.len >= min_chunk) {
            return;
        }
        k -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(size: u64, speeds: &[u64], min_chunk: u64, align: u64, rotate: usize) -> Vec<Chunk> {
        let mut v = Vec::new();
        stripe(
            size,
            speeds,
            StripeParams { min_chunk, align },
            rotate,
            &mut v,
        );
        v
    }

    #[test]
    fn equal_paths_split_evenly() {
        let c = run(1 << 20, &[100_000; 4], 32 * 1024, 128, 0);
        assert_eq!(c.len(), 4);
        assert!(c.iter().all(|c| c.len == 256 * 1024));
        assert_eq!(
            c.iter().map(|c| c.path).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
    }

    #[test]
    fn small_message_uses_one_path_and_rotates() {
        let a = run(4096, &[100_000; 2], 32 * 1024, 128, 0);
        let b = run(4096, &[100_000; 2], 32 * 1024, 128, 1);
        assert_eq!(a.len(), 1);
        assert_eq!(b.len(), 1);
        assert_ne!(a[0].path, b[0].path);
    }

    #[test]
    fn unequal_speeds_prefer_fast_path() {
        let c = run(4096, &[25_000, 100_000], 32 * 1024, 128, 1);
        assert_eq!(
            c,
            vec![Chunk {
                path: 1,
                offset: 0,
                len: 4096
            }]
        );
        let c = run(1 << 20, &[100_000, 300_000], 1024, 128, 0);
        assert_eq!(c[0].path, 1);
        assert_eq!(c[0].len, 786_432);
        assert_eq!(c[1].len, 262_144);
    }

    #[test]
    fn slow_path_dropped_below_min_chunk() {
        // 2 paths, 100:1 — the slow share would be ~ 1 KiB < 32 KiB.
        let c = run(128 * 1024, &[100_000, 1_000], 32 * 1024, 128, 0);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].path, 0);
    }

    #[test]
    fn zero_bytes_is_one_empty_chunk() {
        let c = run(0, &[1, 1, 1], 1, 1, 2);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].len, 0);
        assert_eq!(c[0].path, 2);
    }

    #[test]
    fn no_paths_no_chunks() {
        assert!(run(10, &[], 1, 1, 0).is_empty());
    }
}
