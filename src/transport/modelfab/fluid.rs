//! How transfers share the stages they cross (wires, PCIe roots): a fluid model. A transfer crosses
//! all its stages at once (cut through) at one rate, and the rates of the transfers in flight are
//! max-min fair (progressive filling): every transfer's rate rises together until a stage it
//! crosses is full; those transfers keep that rate and the others rise further. Rates are worked
//! out again, for the transfers that share a stage with it directly or through others, whenever a
//! transfer starts or ends or a stage's capacity changes. This is how a NIC port or a PCIe link
//! interleaving the packets of several flows shares its rate; a transfer ready now is never queued
//! behind one that starts later.
//!
//! A transfer puts a different number of bits through each stage (the wire counts framing, a PCIe
//! root only payload); rates are in bits per second of its largest stage and each stage is charged
//! in proportion. Integer arithmetic only (bits per second, picoseconds, bit-picoseconds of work
//! left), with every map iterated in a fixed order, so every machine computes the same times.
#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use super::link::PS_PER_S;

/// Fixed-point scale of the per-stage weights (bits on the stage / bits on the largest stage).
const ONE: u128 = 1 << 32;

/// What a transfer puts through one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stage<K> {
    pub(super) res: K,
    pub(super) bits: u64,
}

struct Flow<K, T> {
    /// (stage, weight × [`ONE`]) for the stages with bits.
    stages: Vec<(K, u128)>,
    /// Work left: bits of the largest stage × ps.
    left: u128,
    /// Bits per second of the largest stage.
    rate: u64,
    /// When `left` was last brought up to date.
    since: u64,
    /// Set from the fluid's counter when the rate changes (older heap entries, also those of an
    /// earlier transfer with the same id, are stale).
    version: u64,
    tag: T,
}

/// The transfers in flight and when each will end.
pub(super) struct Fluid<K, T> {
    flows: Vec<Option<Flow<K, T>>>,
    free: Vec<usize>,
    /// The transfers crossing each stage.
    on: BTreeMap<K, BTreeSet<usize>>,
    /// (end, flow, version); stale entries are skipped.
    ends: BinaryHeap<Reverse<(u64, usize, u64)>>,
    /// Versions handed out so far.
    versions: u64,
}

impl<K: Copy + Ord, T: Copy> Default for Fluid<K, T> {
    fn default() -> Self {
        Fluid {
            flows: Vec::new(),
            free: Vec::new(),
            on: BTreeMap::new(),
            ends: BinaryHeap::new(),
            versions: 0,
        }
    }
}

impl<K: Copy + Ord, T: Copy> Fluid<K, T> {
    /// Starts a transfer at `now`; `cap` gives each stage's capacity in bits per second. A
    /// transfer with no bits ends at `now`.
    pub(super) fn start(
        &mut self,
        now: u64,
        stages: &[Stage<K>],
        tag: T,
        cap: &impl Fn(&K) -> u64,
    ) -> usize {
        let largest = stages.iter().map(|s| s.bits).max().unwrap_or(0);
        let st: Vec<(K, u128)> = stages
            .iter()
            .filter(|s| s.bits > 0)
            .map(|s| (s.res, u128::from(s.bits) * ONE / u128::from(largest)))
            .collect();
        let flow = Flow {
            stages: st,
            left: u128::from(largest) * PS_PER_S,
            rate: 0,
            since: now,
            version: 0,
            tag,
        };
        let id = match self.free.pop() {
            Some(i) => {
                self.flows[i] = Some(flow);
                i
            }
            None => {
                self.flows.push(Some(flow));
                self.flows.len() - 1
            }
        };
        let res: Vec<K> = self.stages_of(id);
        if res.is_empty() {
            self.versions += 1;
            if let Some(f) = self.flows[id].as_mut() {
                f.version = self.versions;
            }
            self.ends.push(Reverse((now, id, self.versions)));
            return id;
        }
        for r in &res {
            self.on.entry(*r).or_default().insert(id);
        }
        self.rebalance(now, &res, cap);
        id
    }

    fn stages_of(&self, id: usize) -> Vec<K> {
        self.flows[id]
            .as_ref()
            .map(|f| f.stages.iter().map(|s| s.0).collect())
            .unwrap_or_default()
    }

    /// When the next transfer ends, if any is in flight.
    pub(super) fn next_end(&mut self) -> Option<u64> {
        while let Some(Reverse((t, id, v))) = self.ends.peek().copied() {
            if self.flows[id].as_ref().is_some_and(|f| f.version == v) {
                return Some(t);
            }
            self.ends.pop();
        }
        None
    }

    /// Ends the next transfer due at or before `t` (the earliest, then the lowest id), rebalancing
    /// the others; returns its tag.
    pub(super) fn pop_due(&mut self, t: u64, cap: &impl Fn(&K) -> u64) -> Option<T> {
        let end = self.next_end()?;
        if end > t {
            return None;
        }
        let Reverse((end, id, _)) = self.ends.pop()?;
        let res = self.stages_of(id);
        let flow = self.flows[id].take()?;
        self.free.push(id);
        for r in &res {
            if let Some(s) = self.on.get_mut(r) {
                s.remove(&id);
                if s.is_empty() {
                    self.on.remove(r);
                }
            }
        }
        self.rebalance(end, &res, cap);
        Some(flow.tag)
    }

    /// Works the rates out again for the transfers crossing any of `stages` (after their
    /// capacity changed).
    pub(super) fn recompute(&mut self, now: u64, stages: &[K], cap: &impl Fn(&K) -> u64) {
        self.rebalance(now, stages, cap);
    }

    /// The stages transfers cross now.
    pub(super) fn stages(&self) -> Vec<K> {
        self.on.keys().copied().collect()
    }

    /// Whether any transfer is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.flows.iter().all(Option::is_none)
    }

    /// Max-min fair rates (progressive filling) for every transfer connected to `seed` through
    /// shared stages; transfers whose rate changes get a new end.
    fn rebalance(&mut self, now: u64, seed: &[K], cap: &impl Fn(&K) -> u64) {
        // The connected part: stages and transfers reachable from the seed stages.
        let mut res: BTreeSet<K> = BTreeSet::new();
        let mut ids: BTreeSet<usize> = BTreeSet::new();
        let mut todo: Vec<K> = seed.to_vec();
        while let Some(r) = todo.pop() {
            if !res.insert(r) {
                continue;
            }
            for &id in self.on.get(&r).into_iter().flatten() {
                if ids.insert(id) {
                    if let Some(f) = &self.flows[id] {
                        todo.extend(f.stages.iter().map(|s| s.0).filter(|k| !res.contains(k)));
                    }
                }
            }
        }
        if ids.is_empty() {
            return;
        }
        let ids: Vec<usize> = ids.into_iter().collect();
        let mut rate: BTreeMap<usize, u128> = ids.iter().map(|&i| (i, 0)).collect();
        let mut frozen: BTreeSet<usize> = BTreeSet::new();
        let mut residual: BTreeMap<K, u128> = res
            .iter()
            .filter(|r| self.on.contains_key(r))
            .map(|r| (*r, u128::from(cap(r))))
            .collect();
        while frozen.len() < ids.len() {
            // Per stage: the weight of its transfers still rising, and how far they can rise.
            let mut best: Option<u128> = None;
            let mut weights: BTreeMap<K, u128> = BTreeMap::new();
            for &id in &ids {
                if frozen.contains(&id) {
                    continue;
                }
                if let Some(f) = &self.flows[id] {
                    for &(k, w) in &f.stages {
                        *weights.entry(k).or_insert(0) += w;
                    }
                }
            }
            let mut rise: BTreeMap<K, u128> = BTreeMap::new();
            for (k, w) in &weights {
                let r = residual.get(k).copied().unwrap_or(0) * ONE / (*w).max(1);
                rise.insert(*k, r);
                best = Some(best.map_or(r, |b| b.min(r)));
            }
            let Some(delta) = best else { break };
            for &id in &ids {
                if !frozen.contains(&id) {
                    *rate.entry(id).or_insert(0) += delta;
                }
            }
            for (k, w) in &weights {
                if let Some(x) = residual.get_mut(k) {
                    *x = x.saturating_sub(delta * w / ONE);
                }
            }
            // Transfers crossing a stage that is now full rise no further.
            for (k, r) in &rise {
                if *r == delta {
                    for &id in self.on.get(k).into_iter().flatten() {
                        frozen.insert(id);
                    }
                }
            }
        }
        for &id in &ids {
            let new = u64::try_from(rate.get(&id).copied().unwrap_or(0)).unwrap_or(u64::MAX);
            let Some(f) = self.flows[id].as_mut() else {
                continue;
            };
            let spent = u128::from(f.rate) * u128::from(now.saturating_sub(f.since));
            f.left = f.left.saturating_sub(spent);
            f.since = now;
            if new == f.rate && f.version > 0 {
                continue;
            }
            f.rate = new;
            self.versions += 1;
            f.version = self.versions;
            if new > 0 {
                let dt = u64::try_from(f.left.div_ceil(u128::from(new))).unwrap_or(u64::MAX);
                self.ends
                    .push(Reverse((now.saturating_add(dt), id, f.version)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1_000_000_000;

    fn caps(k: &u8) -> u64 {
        match k {
            0 => 256 * G,
            _ => 200 * G,
        }
    }

    fn drain(f: &mut Fluid<u8, u32>) -> Vec<(u64, u32)> {
        let mut out = vec![];
        while let Some(t) = f.next_end() {
            let tag = f.pop_due(t, &caps).unwrap();
            out.push((t, tag));
        }
        out
    }

    #[test]
    fn one_transfer_runs_at_its_slowest_stage() {
        let mut f = Fluid::default();
        // 200 kbit over the 256 G root (0) and a 200 G wire (1): 1 us
        f.start(
            0,
            &[
                Stage {
                    res: 0,
                    bits: 200_000,
                },
                Stage {
                    res: 1,
                    bits: 200_000,
                },
            ],
            7,
            &caps,
        );
        assert_eq!(drain(&mut f), vec![(1_000_000, 7)]);
        assert!(f.is_empty());
    }

    #[test]
    fn two_transfers_share_a_root_fairly_and_the_survivor_speeds_up() {
        let mut f = Fluid::default();
        // two 200 G wires (1, 2) behind one 256 G root (0): 128 each; 256 kbit and 128 kbit
        f.start(
            0,
            &[
                Stage {
                    res: 0,
                    bits: 256_000,
                },
                Stage {
                    res: 1,
                    bits: 256_000,
                },
            ],
            1,
            &caps,
        );
        f.start(
            0,
            &[
                Stage {
                    res: 0,
                    bits: 128_000,
                },
                Stage {
                    res: 2,
                    bits: 128_000,
                },
            ],
            2,
            &caps,
        );
        // the short one ends at 1 us; the long one has 128 kbit left, then runs at 200 G: 0.64 us
        assert_eq!(drain(&mut f), vec![(1_000_000, 2), (1_640_000, 1)]);
    }

    #[test]
    fn a_roomy_root_carries_both_at_their_wire_rate() {
        let big = |k: &u8| if *k == 0 { 1000 * G } else { 200 * G };
        let mut f: Fluid<u8, u32> = Fluid::default();
        f.start(
            0,
            &[
                Stage {
                    res: 0,
                    bits: 200_000,
                },
                Stage {
                    res: 1,
                    bits: 200_000,
                },
            ],
            1,
            &big,
        );
        f.start(
            0,
            &[
                Stage {
                    res: 0,
                    bits: 200_000,
                },
                Stage {
                    res: 2,
                    bits: 200_000,
                },
            ],
            2,
            &big,
        );
        let mut ends = vec![];
        while let Some(t) = f.next_end() {
            ends.push((t, f.pop_due(t, &big).unwrap()));
        }
        assert_eq!(ends, vec![(1_000_000, 1), (1_000_000, 2)]);
    }

    #[test]
    fn a_transfer_with_no_bits_ends_at_once_and_stages_are_charged_by_their_bits() {
        let mut f = Fluid::default();
        f.start(5, &[Stage { res: 1, bits: 0 }], 3, &caps);
        assert_eq!(drain(&mut f), vec![(5, 3)]);
        // 100 kbit on the root and 200 kbit on the wire (weight 1/2 on the root), and 156 kbit on
        // the root alone: both rise to 256 / 1.5 = 170.67 G, where the root is full; when the
        // second ends, the first has its wire's 200 G
        f.start(
            0,
            &[
                Stage {
                    res: 0,
                    bits: 100_000,
                },
                Stage {
                    res: 1,
                    bits: 200_000,
                },
            ],
            1,
            &caps,
        );
        f.start(
            0,
            &[Stage {
                res: 0,
                bits: 156_000,
            }],
            2,
            &caps,
        );
        assert_eq!(drain(&mut f), vec![(914_063, 2), (1_134_063, 1)]);
    }
}
