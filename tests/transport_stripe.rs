//! Property tests of the striping arithmetic over 1–8 paths with unequal speeds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

use proptest::prelude::*;
use switchless::transport::stripe::{MAX_PATHS, StripeParams, stripe};

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn chunks_cover_exactly_proportionally_and_respect_min_chunk(
        size in prop_oneof![0u64..10_000, 0u64..(1 << 30), Just(0u64), 0u64..(1 << 44)],
        speeds in proptest::collection::vec(prop_oneof![Just(0u64), 1u64..1_000_000], 1..=MAX_PATHS),
        min_chunk in prop_oneof![Just(1u64), 1u64..100_000, Just(32_768u64)],
        align in prop_oneof![Just(1u64), Just(128u64), 1u64..4096],
        rotate in 0usize..64,
    ) {
        let mut chunks = Vec::new();
        stripe(size, &speeds, StripeParams { min_chunk, align }, rotate, &mut chunks);
        prop_assert!(!chunks.is_empty());
        prop_assert!(chunks.len() <= speeds.len());

        // Exact cover, in order, no overlap.
        let mut next = 0u64;
        for c in &chunks {
            prop_assert_eq!(c.offset, next);
            next += c.len;
        }
        prop_assert_eq!(next, size);

        // Distinct paths.
        let mut seen = [false; MAX_PATHS];
        for c in &chunks {
            prop_assert!(c.path < speeds.len());
            prop_assert!(!seen[c.path]);
            seen[c.path] = true;
        }

        let w = |p: usize| speeds[p].max(1);
        // The chosen paths are the fastest ones.
        let slowest_chosen = chunks.iter().map(|c| w(c.path)).min().unwrap();
        for p in 0..speeds.len() {
            if !seen[p] {
                prop_assert!(w(p) <= slowest_chosen, "path {} (weight {}) skipped for a slower one", p, w(p));
            }
        }

        if chunks.len() > 1 {
            // Minimum chunk, boundaries aligned, proportional within one alignment unit.
            let total: u128 = chunks.iter().map(|c| u128::from(w(c.path))).sum();
            for (i, c) in chunks.iter().enumerate() {
                prop_assert!(c.len >= min_chunk.max(1), "chunk {} of {} bytes < min {}", i, c.len, min_chunk);
                if i > 0 {
                    prop_assert_eq!(c.offset % align.max(1), 0);
                }
                let ideal = u128::from(size) * u128::from(w(c.path)) / total;
                let diff = (u128::from(c.len)).abs_diff(ideal);
                prop_assert!(diff <= u128::from(align.max(1)), "chunk {} len {} ideal {}", i, c.len, ideal);
            }
        } else if size >= 2 * min_chunk.max(1) && speeds.len() > 1 {
            // Only a dominating path justifies a single chunk for a large message: the second
            // fastest path's share would be under the minimum chunk (plus alignment slack).
            let mut ws: Vec<u64> = (0..speeds.len()).map(w).collect();
            ws.sort_unstable_by(|a, b| b.cmp(a));
            let share2 = u128::from(size) * u128::from(ws[1]) / (u128::from(ws[0]) + u128::from(ws[1]));
            prop_assert!(share2 < u128::from(min_chunk.max(1)) + u128::from(align.max(1)),
                "size {} split over one path though the second path's share is {}", size, share2);
        }
        if size < 2 * min_chunk.max(1) {
            prop_assert_eq!(chunks.len(), 1, "small messages use one path");
        }
    }
}
