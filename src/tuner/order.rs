//! Host order: NCCL numbers nodes in the order their first rank appears and its ring sends node n's
//! bytes to node n + 1, the same for every channel (`src/init.cc` node numbering, `src/graph/connect.cc`
//! `connectRings`). On a switchless fabric the ring's busbw is therefore the thinnest cable bundle
//! between consecutive hosts in rank order, and the launcher's host order decides it. [`best_ring`]
//! finds the order whose thinnest step is fattest.
#![forbid(unsafe_code)]

/// Hosts up to which every order is tried (9! / 1 orders with the first host fixed: 40 320 at 9, 362 880
/// at 10); larger fleets are improved by exchanging pairs of hosts until nothing improves.
pub const EXHAUSTIVE_UP_TO: usize = 10;

/// The result of [`best_ring`].
#[derive(Debug, Clone, PartialEq)]
pub struct RingOrder {
    /// Host indices in rank order (the first is always host 0).
    pub order: Vec<usize>,
    /// Capacity of the thinnest step of `order` (the ring's busbw), in the unit of the matrix.
    pub bottleneck: f64,
    /// The thinnest step of the given order (0, 1, 2, …).
    pub given: f64,
    /// The worst order's thinnest step (every order is equal when it equals `bottleneck`).
    pub worst: f64,
    /// Whether every order was tried.
    pub exhaustive: bool,
}

impl RingOrder {
    /// Every order gives the ring the same rate.
    pub fn all_equal(&self) -> bool {
        self.exhaustive && self.worst == self.bottleneck
    }

    /// The best order's rate over the given order's (infinite when the given order has a step with no
    /// cable).
    pub fn gain(&self) -> f64 {
        self.bottleneck / self.given
    }
}

/// The thinnest step of the ring through `order` (including the step back to the first host).
pub fn bottleneck(cap: &[Vec<f64>], order: &[usize]) -> f64 {
    let n = order.len();
    (0..n)
        .map(|i| {
            let (a, b) = (order[i], order[(i + 1) % n]);
            cap.get(a).and_then(|r| r.get(b)).copied().unwrap_or(0.0)
        })
        .fold(f64::INFINITY, f64::min)
}

/// The ring order whose thinnest step is fattest; ties keep the order closest to the given one
/// (lexicographically smallest), so a fabric where every order is equal keeps 0, 1, 2, …. `cap[a][b]` is
/// what host a can send to host b (0 where no cable joins them). Fewer than 3 hosts: the given order.
pub fn best_ring(cap: &[Vec<f64>]) -> RingOrder {
    let n = cap.len();
    let given: Vec<usize> = (0..n).collect();
    let g = if n >= 2 { bottleneck(cap, &given) } else { 0.0 };
    if n < 3 {
        return RingOrder {
            order: given,
            bottleneck: g,
            given: g,
            worst: g,
            exhaustive: true,
        };
    }
    if n <= EXHAUSTIVE_UP_TO {
        let mut rest: Vec<usize> = (1..n).collect();
        let mut best = (g, given.clone());
        let mut worst = g;
        // Lexicographic permutations of the hosts after host 0: the first best found is the smallest.
        loop {
            let order: Vec<usize> = std::iter::once(0).chain(rest.iter().copied()).collect();
            let b = bottleneck(cap, &order);
            if b > best.0 {
                best = (b, order);
            }
            worst = worst.min(b);
            if !next_permutation(&mut rest) {
                break;
            }
        }
        // The given order is the first permutation: a tie never replaces it.
        return RingOrder {
            order: best.1,
            bottleneck: best.0,
            given: g,
            worst,
            exhaustive: true,
        };
    }
    // Local search: exchange two hosts (never host 0) while the thinnest step grows.
    let mut order = given;
    let mut b = g;
    loop {
        let mut improved = false;
        for i in 1..n {
            for j in (i + 1)..n {
                order.swap(i, j);
                let nb = bottleneck(cap, &order);
                if nb > b {
                    b = nb;
                    improved = true;
                } else {
                    order.swap(i, j);
                }
            }
        }
        if !improved {
            break;
        }
    }
    RingOrder {
        order,
        bottleneck: b,
        given: g,
        worst: f64::NAN,
        exhaustive: false,
    }
}

/// Advances `v` to its next lexicographic permutation; false after the last.
fn next_permutation(v: &mut [usize]) -> bool {
    let n = v.len();
    if n < 2 {
        return false;
    }
    let mut i = n - 1;
    while i > 0 && v[i - 1] >= v[i] {
        i -= 1;
    }
    if i == 0 {
        return false;
    }
    let mut j = n - 1;
    while v[j] <= v[i - 1] {
        j -= 1;
    }
    v.swap(i - 1, j);
    v[i..].reverse();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(n: usize, pairs: &[((usize, usize), f64)]) -> Vec<Vec<f64>> {
        let mut m = vec![vec![0.0; n]; n];
        for &((a, b), c) in pairs {
            m[a][b] = c;
            m[b][a] = c;
        }
        m
    }

    #[test]
    fn the_332_mesh_wants_the_three_cable_pairs() {
        // 4 × B300, 8 cables each: 3 to two peers and 2 to the third (shared/reviews/mesh-collectives.md
        // §4.1): ring 0,1,2,3 runs on 2-cable steps, 0,1,3,2 on 3-cable steps (+50 %).
        let m = matrix(
            4,
            &[
                ((0, 1), 3.0),
                ((1, 3), 3.0),
                ((3, 2), 3.0),
                ((2, 0), 3.0),
                ((0, 3), 2.0),
                ((1, 2), 2.0),
            ],
        );
        let r = best_ring(&m);
        assert_eq!(r.order, vec![0, 1, 3, 2]);
        assert_eq!((r.bottleneck, r.given, r.worst), (3.0, 2.0, 2.0));
        assert!((r.gain() - 1.5).abs() < 1e-12);
        assert!(!r.all_equal());
    }

    #[test]
    fn a_uniform_mesh_keeps_the_given_order() {
        let m = matrix(
            4,
            &[
                ((0, 1), 2.0),
                ((0, 2), 2.0),
                ((0, 3), 2.0),
                ((1, 2), 2.0),
                ((1, 3), 2.0),
                ((2, 3), 2.0),
            ],
        );
        let r = best_ring(&m);
        assert_eq!(r.order, vec![0, 1, 2, 3]);
        assert!(r.all_equal());
        assert_eq!(r.gain(), 1.0);
    }

    #[test]
    fn a_ring_of_four_is_followed_and_the_wrong_order_has_no_cable() {
        // GB10 ring 0-2-1-3-0 (cabled in that order): rank order 0,1,2,3 steps over non-neighbours.
        let m = matrix(
            4,
            &[((0, 2), 1.0), ((2, 1), 1.0), ((1, 3), 1.0), ((3, 0), 1.0)],
        );
        let r = best_ring(&m);
        assert_eq!(r.order, vec![0, 2, 1, 3]);
        assert_eq!(r.given, 0.0);
        assert!(r.gain().is_infinite());
    }

    #[test]
    fn large_fleets_use_local_search_and_small_ones_are_trivial() {
        let n = 12;
        let mut m = vec![vec![1.0; n]; n];
        // A fat cycle 0-2-4-…-10-1-3-…-11-0.
        let cyc: Vec<usize> = (0..n).step_by(2).chain((1..n).step_by(2)).collect();
        for i in 0..n {
            let (a, b) = (cyc[i], cyc[(i + 1) % n]);
            m[a][b] = 4.0;
            m[b][a] = 4.0;
        }
        let r = best_ring(&m);
        assert!(!r.exhaustive);
        assert!(r.bottleneck >= r.given);
        assert_eq!(best_ring(&matrix(2, &[((0, 1), 5.0)])).order, vec![0, 1]);
        assert_eq!(best_ring(&[]).order, Vec::<usize>::new());
        let mut v = vec![0, 1, 2];
        let mut count = 1;
        while next_permutation(&mut v) {
            count += 1;
        }
        assert_eq!(count, 6);
    }
}
