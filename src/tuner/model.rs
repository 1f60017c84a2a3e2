//! The analytic model of NCCL's all-reduce on a switchless fabric: what Ring and Tree move between nodes
//! when every byte rides the cables to its destination (`shared/reviews/mesh-collectives.md` §3), and
//! NCCL's own latency and protocol model around it, so that the two algorithms can be compared at a size.
//!
//! * Node level: NCCL's ring sends node n's bytes to node n+1 only (`src/graph/connect.cc` `connectRings`),
//!   so its busbw is one pair's rate; its double binary tree (`src/graph/trees.cc` `ncclGetDtree`, its
//!   arithmetic re-derived in [`dtree_parents`]) carries λ/2 per direction on each edge of each tree, so a
//!   pair used by both trees, or a node with many tree edges, bounds λ (the tree's algbw).
//! * Around it, NCCL 2.30's cost model (`src/graph/tuning.cc` `ncclTopoTuneModel`, `ncclTopoGetAlgoTime`):
//!   per-protocol efficiency, latency from the tuning constants, the tree correction at medium sizes.
//!   The model replaces only NCCL's belief that every NIC reaches every node at full speed.
//!
//! All rates are Gb/s on the wire unless a name says GB/s (NCCL's unit: `time = lat + bytes / (1000 · GB/s)` µs).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

/// Cost-table rows (NCCL's `NCCL_ALGO_*`).
pub const ALGO_TREE: usize = 0;
/// Ring.
pub const ALGO_RING: usize = 1;
/// CollNet direct (in-network reduction; never available without a switch).
pub const ALGO_COLLNET_DIRECT: usize = 2;
/// CollNet chain.
pub const ALGO_COLLNET_CHAIN: usize = 3;
/// NVLink SHARP (single node, or with CollNet).
pub const ALGO_NVLS: usize = 4;
/// NVLink SHARP inside the node, NCCL's double binary tree between nodes.
pub const ALGO_NVLS_TREE: usize = 5;
/// PAT (all-gather and reduce-scatter with one GPU per node; NCCL 2.23+).
pub const ALGO_PAT: usize = 6;
/// Algorithm names in row order (NCCL's spelling).
pub const ALGO_NAMES: [&str; 7] = [
    "Tree",
    "Ring",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
];

/// Cost-table columns (NCCL's `NCCL_PROTO_*`).
pub const PROTO_LL: usize = 0;
/// LL128.
pub const PROTO_LL128: usize = 1;
/// Simple.
pub const PROTO_SIMPLE: usize = 2;
/// Protocol names in column order.
pub const PROTO_NAMES: [&str; 3] = ["LL", "LL128", "Simple"];

/// RoCE goodput at MTU 4096 over the line rate (headers per 4 KiB packet; the review's §2 factor).
pub const FRAMING: f64 = 0.980;

/// Measured over nominal PCIe rate of a GB10 NIC function (Gen5 x4, 126 Gb/s nominal; 92.57 and
/// 97.28 Gb/s measured, `shared/reviews/mesh-collectives.md` §2): what a PCIe root carries in the model.
pub const PCIE_EFFICIENCY: f64 = 0.753;

/// NCCL's latency and per-channel constants (`ncclTunerConstants_v5_t`), as doubles.
#[derive(Debug, Clone, PartialEq)]
pub struct Constants {
    /// µs, `[algo][proto]`.
    pub base_latencies: [[f64; 3]; 7],
    /// µs, `[NVLINK, PCI, NET][algo][proto]`.
    pub hw_latencies: [[[f64; 3]; 7]; 3],
    /// GB/s, `[compcap][scale]` (scale: 1 node, 2 nodes, 4+ nodes).
    pub ll_max_bws: [[f64; 3]; 4],
    /// GB/s per channel, `[compcap][scale]`.
    pub per_ch_max_tree_bws: [[f64; 3]; 4],
}

const HW_NVLINK: usize = 0;
const HW_NET: usize = 2;
/// `NCCL_HOPPER_COMPCAP_IDX` and `NCCL_BLACKWELL_COMPCAP_IDX`: the GPUs of the fabrics this targets.
const COMPCAPS_SM90_PLUS: [usize; 2] = [2, 3];

impl Constants {
    /// NCCL 2.30.7's defaults (`ncclTunerConstantsDefaults`, `src/graph/tuning.cc:148-225`); earlier
    /// releases' Tree/Ring latencies are the same. Entries of algorithms the model never prices are 0.
    pub fn nccl_defaults() -> Constants {
        let mut base = [[0.0; 3]; 7];
        base[ALGO_TREE] = [6.8, 14.0, 8.4];
        base[ALGO_RING] = [6.6, 14.0, 8.4];
        base[ALGO_PAT] = [8.0, 8.0, 8.0];
        let mut hw = [[[0.0; 3]; 7]; 3];
        hw[HW_NVLINK][ALGO_TREE] = [0.6, 1.25, 4.0];
        hw[HW_NVLINK][ALGO_RING] = [0.6, 1.9, 3.4];
        hw[1][ALGO_TREE] = [1.0, 1.9, 4.0];
        hw[1][ALGO_RING] = [1.0, 2.5, 5.7];
        hw[HW_NET][ALGO_TREE] = [5.0, 8.5, 14.0];
        hw[HW_NET][ALGO_RING] = [2.7, 4.0, 14.0];
        Constants {
            base_latencies: base,
            hw_latencies: hw,
            ll_max_bws: [
                [39.0, 39.0, 20.4],
                [87.7, 22.5, 19.0],
                [141.0, 45.0, 35.0],
                [282.0, 90.0, 70.0],
            ],
            per_ch_max_tree_bws: [
                [26.5, 18.5, 10.0],
                [24.0, 23.6, 17.8],
                [38.7, 41.4, 36.0],
                [70.0, 42.8, 24.0],
            ],
        }
    }

    /// Whether every number is finite and non-negative and the Ring and Tree latencies the model reads
    /// are positive (NCCL hands the plugin its table to edit; a broken or empty one is not priced with).
    pub fn is_sane(&self) -> bool {
        let ok = |x: &f64| x.is_finite() && *x >= 0.0;
        let priced = [ALGO_TREE, ALGO_RING].iter().all(|&a| {
            self.base_latencies[a].iter().all(|x| *x > 0.0)
                && self.hw_latencies[HW_NET][a].iter().all(|x| *x > 0.0)
        });
        priced
            && self.base_latencies.iter().flatten().all(ok)
            && self.hw_latencies.iter().flatten().flatten().all(ok)
            && self.ll_max_bws.iter().flatten().all(ok)
            && self.per_ch_max_tree_bws.iter().flatten().all(ok)
    }

    /// NCCL's tuning scale of `nodes` (`index2` in `ncclTopoTuneModel`).
    fn scale(nodes: usize) -> usize {
        match nodes {
            0 | 1 => 0,
            2 => 1,
            _ => 2,
        }
    }

    /// The smallest per-channel Tree bandwidth NCCL assumes on sm90+ at this scale, GB/s.
    pub fn per_channel_tree_gbytes(&self, nodes: usize) -> f64 {
        let s = Self::scale(nodes);
        COMPCAPS_SM90_PLUS
            .iter()
            .map(|&c| self.per_ch_max_tree_bws[c][s])
            .fold(f64::INFINITY, f64::min)
    }
}

/// NCCL's empirical Tree all-reduce correction at medium sizes, `[proto][log2(bytes / 64)]`
/// (`treeCorrectionFactor`, `src/graph/tuning.cc:623-629`; applied for indices 0..23).
const TREE_CORRECTION: [[f64; 24]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.0, 1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9,
        0.9, 0.9, 0.9, 1.0, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8,
        0.7, 0.7, 0.8, 0.9, 0.9, 0.9,
    ],
];

/// ⌊log2 n⌋ (NCCL's `log2i`), 0 for n ≤ 1.
fn log2i(n: u64) -> u32 {
    if n <= 1 { 0 } else { 63 - n.leading_zeros() }
}

// ---- NCCL's double binary tree over nodes ----------------------------------------------------------------

/// The parent of `r` in NCCL's binary tree over `n` nodes rooted at 0 (`None` for the root): clear the
/// lowest set bit of `r` and set the next one up; when that lands past the last node, only clear.
fn btree_parent(n: usize, r: usize) -> Option<usize> {
    if r == 0 || r >= n {
        return None;
    }
    let bit = r & r.wrapping_neg();
    let up = (r ^ bit) | (bit << 1);
    Some(if up >= n { r ^ bit } else { up })
}

/// Parents of every node in NCCL's two trees (`ncclGetDtree`): tree 0 is the binary tree; tree 1 is
/// its mirror (`n - 1 - r`) when `n` is even and its shift by one when `n` is odd.
pub fn dtree_parents(n: usize) -> [Vec<Option<usize>>; 2] {
    let t0: Vec<Option<usize>> = (0..n).map(|r| btree_parent(n, r)).collect();
    let t1: Vec<Option<usize>> = (0..n)
        .map(|r| {
            if n % 2 == 0 {
                btree_parent(n, n - 1 - r).map(|u| n - 1 - u)
            } else {
                btree_parent(n, (r + n - 1) % n).map(|u| (u + 1) % n)
            }
        })
        .collect();
    [t0, t1]
}

/// How NCCL's two trees load the node pairs and nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeLoads {
    /// Node pairs (low, high) with the number of trees that use them (1 or 2).
    pub pairs: BTreeMap<(usize, usize), u32>,
    /// Tree edges at each node, over both trees.
    pub degree: Vec<u32>,
}

impl TreeLoads {
    /// The loads of NCCL's double binary tree over `n` nodes.
    pub fn of(n: usize) -> TreeLoads {
        let mut pairs = BTreeMap::new();
        let mut degree = vec![0u32; n];
        for tree in dtree_parents(n) {
            for (r, p) in tree.iter().enumerate() {
                if let Some(p) = *p {
                    *pairs.entry((r.min(p), r.max(p))).or_insert(0) += 1;
                    degree[r] += 1;
                    degree[p] += 1;
                }
            }
        }
        TreeLoads { pairs, degree }
    }

    /// The most trees on one pair.
    pub fn max_pair_use(&self) -> u32 {
        self.pairs.values().copied().max().unwrap_or(0)
    }

    /// The most tree edges at one node.
    pub fn max_degree(&self) -> u32 {
        self.degree.iter().copied().max().unwrap_or(0)
    }
}

// ---- Figures: the node-level result of each algorithm, normalised ------------------------------------------

/// What bounds a node's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bound {
    /// Its cables (each NIC has its own PCIe path: B300, where a CX-8 is its GPU's PCIe switch).
    Cables,
    /// Its NIC's PCIe links, shared by every cable (GB10: two Gen5 x4 functions for both cages).
    Nic,
}

/// Ring and Tree all-reduce on a uniform full mesh of `nodes`, as fractions of what bounds them. The
/// tuner reads these from the generated table (`figures.rs`), never from [`Figure::analytic`]
/// directly, so a rate-modelled mesh can replace the numbers without touching the decisions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// Hosts.
    pub nodes: usize,
    /// Ring busbw / min(pair rate, node rate).
    pub ring: f64,
    /// Tree algbw / pair rate, as the pairs bound it.
    pub tree_pair: f64,
    /// Tree algbw / node rate, as the nodes bound it.
    pub tree_node: f64,
}

impl Figure {
    /// The analytic figures (`shared/reviews/mesh-collectives.md` §3): the ring's edge carries its
    /// busbw; the tree carries λ/2 per direction on each tree edge.
    pub fn analytic(nodes: usize) -> Figure {
        let t = TreeLoads::of(nodes);
        let per = |n: u32| {
            if n == 0 {
                f64::INFINITY
            } else {
                2.0 / f64::from(n)
            }
        };
        Figure {
            nodes,
            ring: 1.0,
            tree_pair: per(t.max_pair_use()),
            tree_node: per(t.max_degree()),
        }
    }
}

/// A switchless fabric as the model sees it: every node joined to every other by the same cables.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mesh {
    /// Hosts (NCCL's nNodes).
    pub nodes: usize,
    /// Ranks (NCCL's nRanks).
    pub ranks: usize,
    /// Goodput of the cables between one pair of nodes, per direction, Gb/s.
    pub pair_gbps: f64,
    /// What one node can send (and receive) through its NIC's PCIe, Gb/s, when that binds ([`Bound::Nic`]).
    pub node_gbps: Option<f64>,
}

/// Ring and Tree all-reduce on a [`Mesh`], Gb/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Ring busbw (the rate on each ring edge).
    pub ring_busbw: f64,
    /// Ring algbw = busbw · ranks / (2 (ranks − 1)).
    pub ring_algbw: f64,
    /// Tree algbw (λ).
    pub tree_algbw: f64,
    /// Tree busbw = λ · 2 (ranks − 1) / ranks.
    pub tree_busbw: f64,
}

impl Mesh {
    /// Ring and Tree rates from `fig` (the figures of `self.nodes` nodes).
    pub fn rates(&self, fig: &Figure) -> Rates {
        let node = self.node_gbps.unwrap_or(f64::INFINITY);
        let ring_busbw = fig.ring * self.pair_gbps.min(node);
        let tree_algbw = (fig.tree_pair * self.pair_gbps).min(fig.tree_node * node);
        let r = self.ranks.max(2) as f64;
        Rates {
            ring_busbw,
            ring_algbw: ring_busbw * r / (2.0 * (r - 1.0)),
            tree_algbw,
            tree_busbw: tree_algbw * 2.0 * (r - 1.0) / r,
        }
    }
}

// ---- NCCL's cost model around the rates -----------------------------------------------------------------

/// The two algorithms the model compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Ring (NCCL's `Ring`).
    Ring,
    /// NCCL's double binary tree between nodes (`Tree`, and `NVLSTree`, whose node-level loads are Tree's).
    Tree,
}

impl Family {
    /// The cost-table row of the plain algorithm.
    pub fn algo(self) -> usize {
        match self {
            Family::Ring => ALGO_RING,
            Family::Tree => ALGO_TREE,
        }
    }

    /// The family of a cost-table row, if the model prices it.
    pub fn of_algo(a: usize) -> Option<Family> {
        match a {
            ALGO_RING => Some(Family::Ring),
            ALGO_TREE | ALGO_NVLS_TREE => Some(Family::Tree),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ring => "Ring",
            Family::Tree => "Tree",
        }
    }
}

/// Latency of an all-reduce of `family` with `proto` (µs), as NCCL 2.30 computes it for nNodes > 1
/// (`ncclTopoTuneModel`): NVLink inside the node, net between nodes, Intel/Arm CPUs (1 µs net overhead),
/// the net device's own latency 0, and the Simple ring's plateau factor 1.4 (sm80+) at sizes where it
/// applies; `latCount` = 1 (one collective per launch).
pub fn latency_us(c: &Constants, family: Family, proto: usize, nodes: usize, ranks: usize) -> f64 {
    let nodes = nodes.max(1);
    let ranks = ranks.max(nodes);
    let ppn = ranks / nodes;
    let a = family.algo();
    let base = c.base_latencies[a][proto];
    let net_tree = c.hw_latencies[HW_NET][ALGO_TREE][proto];
    match family {
        Family::Ring => {
            let net_overhead = if proto == PROTO_SIMPLE { 3.0 } else { 1.0 };
            let intra = c.hw_latencies[HW_NVLINK][ALGO_RING][proto].max(net_overhead);
            let inter = if ppn == 1 {
                net_tree
            } else {
                c.hw_latencies[HW_NET][ALGO_RING][proto]
            };
            let steps = 2 * (ranks - 1);
            let inter_steps = if nodes == 1 { 0 } else { 2 * (nodes - 1) };
            let lat = base + (steps - inter_steps) as f64 * intra + inter_steps as f64 * inter;
            if proto == PROTO_SIMPLE && nodes > 1 {
                lat * 1.4
            } else {
                lat
            }
        }
        Family::Tree => {
            let intra = c.hw_latencies[HW_NVLINK][ALGO_TREE][proto];
            base + 2.0 * ((ppn - 1) as f64 * intra + f64::from(log2i(nodes as u64)) * net_tree)
        }
    }
}

/// NCCL's bandwidth (GB/s, algbw) of an all-reduce of `family` with `proto` when the true node-level
/// rates are `rates`: the per-protocol factors of `ncclTopoTuneModel` (Ring LL ½ capped at llMaxBw,
/// LL128 0.92; Tree 0.92, LL 1/3.8 capped, LL128 120/128) and the Tree correction at `bytes`.
pub fn bandwidth_gbytes(
    c: &Constants,
    family: Family,
    proto: usize,
    nodes: usize,
    rates: &Rates,
    bytes: u64,
) -> f64 {
    // Non-AMD CPUs: llMaxBws row 0 between nodes.
    let ll_max = c.ll_max_bws[0][Constants::scale(nodes)];
    match family {
        Family::Ring => {
            let bus = rates.ring_busbw / 8.0;
            let bus = match proto {
                PROTO_LL => (bus * 0.5).min(ll_max),
                PROTO_LL128 => bus * 0.92,
                _ => bus,
            };
            bus * rates.ring_algbw / rates.ring_busbw.max(f64::MIN_POSITIVE)
        }
        Family::Tree => {
            // NCCL's Tree "busBw" is twice its algbw.
            let bus = 2.0 * rates.tree_algbw / 8.0 * 0.92;
            let bus = match proto {
                PROTO_LL => (bus / 3.8).min(ll_max),
                PROTO_LL128 => bus * 120.0 / 128.0,
                _ => bus,
            };
            let idx = log2i(bytes >> 6) as usize;
            let corr = if (bytes >> 6) > 0 && idx < 23 {
                TREE_CORRECTION[proto.min(2)][idx]
            } else {
                1.0
            };
            bus * 0.5 * corr
        }
    }
}

/// Time of one all-reduce of `bytes` in µs, as NCCL's `ncclTopoGetAlgoTime` would give it with the true
/// rates.
pub fn time_us(
    c: &Constants,
    family: Family,
    proto: usize,
    mesh: &Mesh,
    rates: &Rates,
    bytes: u64,
) -> f64 {
    let bw = bandwidth_gbytes(c, family, proto, mesh.nodes, rates, bytes);
    if bw <= 0.0 || !bw.is_finite() {
        return f64::INFINITY;
    }
    latency_us(c, family, proto, mesh.nodes, mesh.ranks) + bytes as f64 / (1000.0 * bw)
}

/// The family the model prefers for an all-reduce of `bytes` with `proto` (ties go to Ring, NCCL's
/// bandwidth algorithm).
pub fn prefer(c: &Constants, proto: usize, mesh: &Mesh, rates: &Rates, bytes: u64) -> Family {
    let ring = time_us(c, Family::Ring, proto, mesh, rates, bytes);
    let tree = time_us(c, Family::Tree, proto, mesh, rates, bytes);
    if tree < ring {
        Family::Tree
    } else {
        Family::Ring
    }
}

/// Whether Tree moves more than Ring at sizes where bandwidth decides (Simple, past NCCL's Tree correction):
/// the cables favour Tree. The tuner moves NCCL from Ring to Tree only then; where Tree would win only by
/// its lower latency, the choice stays NCCL's.
pub fn tree_has_more_bandwidth(c: &Constants, mesh: &Mesh, rates: &Rates) -> bool {
    let big = 1u64 << 40;
    bandwidth_gbytes(c, Family::Tree, PROTO_SIMPLE, mesh.nodes, rates, big)
        > bandwidth_gbytes(c, Family::Ring, PROTO_SIMPLE, mesh.nodes, rates, big)
}

/// The sizes (powers of two from 1 KiB to 4 GiB) at which the preferred family changes for `proto`, as
/// (first size, family from there on); the first entry is the family at 1 KiB.
pub fn switch_points(
    c: &Constants,
    proto: usize,
    mesh: &Mesh,
    rates: &Rates,
) -> Vec<(u64, Family)> {
    let mut out: Vec<(u64, Family)> = Vec::new();
    for shift in 10..=32u32 {
        let bytes = 1u64 << shift;
        let f = prefer(c, proto, mesh, rates, bytes);
        if out.last().map(|(_, g)| *g) != Some(f) {
            out.push((bytes, f));
        }
    }
    out
}

/// Bytes as NCCL users write sizes: `1 KiB`, `16 MiB`, `4 GiB`.
pub fn size_text(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("GiB", 30), ("MiB", 20), ("KiB", 10), ("B", 0)];
    for (name, shift) in UNITS {
        if bytes >= (1u64 << shift) && bytes % (1u64 << shift) == 0 {
            return format!("{} {name}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(n: usize) -> Vec<((usize, usize), u32)> {
        TreeLoads::of(n).pairs.into_iter().collect()
    }

    #[test]
    fn the_trees_are_nccls() {
        // shared/reviews/mesh-collectives.md §1.2 (ported from NCCL v2.30.7-1 src/graph/trees.cc there):
        // N=3: {0,2}×2, {1,2}, {0,1}; N=4: {1,2}×2, {0,2}, {2,3}, {1,3}, {0,1}; N=8: 12 of 28 pairs,
        // {1,2} and {5,6} in both trees.
        assert_eq!(pairs(3), vec![((0, 1), 1), ((0, 2), 2), ((1, 2), 1)]);
        assert_eq!(
            pairs(4),
            vec![
                ((0, 1), 1),
                ((0, 2), 1),
                ((1, 2), 2),
                ((1, 3), 1),
                ((2, 3), 1)
            ]
        );
        let p8 = TreeLoads::of(8);
        assert_eq!(p8.pairs.len(), 12);
        let both: Vec<_> = p8
            .pairs
            .iter()
            .filter(|(_, m)| **m == 2)
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(both, vec![(1, 2), (5, 6)]);
        // NCCL's illustration of the 14-rank btree (trees.cc): 8's children are 4 and 12, 13's parent is 12.
        let t = dtree_parents(14);
        assert_eq!(t[0][4], Some(8));
        assert_eq!(t[0][12], Some(8));
        assert_eq!(t[0][13], Some(12));
        assert_eq!(t[0][8], Some(0));
        // Every node but the root has a parent in both trees, and no edge is a self-loop.
        for n in 2..=64 {
            for tree in dtree_parents(n) {
                assert_eq!(tree.iter().filter(|p| p.is_none()).count(), 1, "n={n}");
                for (r, p) in tree.iter().enumerate() {
                    assert_ne!(Some(r), *p);
                    assert!(p.is_none_or(|p| p < n));
                }
            }
        }
    }

    fn b300(nodes: usize, cables_per_pair: f64) -> Mesh {
        Mesh {
            nodes,
            ranks: 8 * nodes,
            pair_gbps: cables_per_pair * 800.0 * FRAMING,
            node_gbps: None,
        }
    }

    #[test]
    fn the_reviews_table_comes_out() {
        // §4.1: B300 ×4 (2 cables per pair) ring busbw 1569, tree busbw 3039 (algbw 1569); ×8 (1 per pair)
        // ring 784, tree busbw 1544 (algbw 784).
        let r4 = b300(4, 2.0).rates(&Figure::analytic(4));
        assert!((r4.ring_busbw - 1568.0).abs() < 1.0, "{r4:?}");
        assert!((r4.tree_algbw - 1568.0).abs() < 1.0, "{r4:?}");
        assert!((r4.tree_busbw - 3038.0).abs() < 2.0, "{r4:?}");
        let r8 = b300(8, 1.0).rates(&Figure::analytic(8));
        assert!((r8.ring_busbw - 784.0).abs() < 1.0, "{r8:?}");
        assert!((r8.tree_busbw - 1544.0).abs() < 2.0, "{r8:?}");
        // §4.2: GB10 3-mesh, NIC-bound at 189.85 Gb/s: ring 1.00, tree 0.89 of the node.
        let gb10 = Mesh {
            nodes: 3,
            ranks: 3,
            pair_gbps: 200.0 * FRAMING,
            node_gbps: Some(189.85),
        };
        let r = gb10.rates(&Figure::analytic(3));
        assert!((r.ring_busbw / 189.85 - 1.0).abs() < 1e-9);
        assert!((r.tree_busbw / 189.85 - 0.889).abs() < 0.001, "{r:?}");
    }

    #[test]
    fn latencies_follow_nccls_formula() {
        let c = Constants::nccl_defaults();
        // B300 ×4: 32 ranks, 8 per node. Ring Simple: 8.4 + 56 · 3.4 + 6 · 14 = 282.8, × 1.4 plateau.
        let ring = latency_us(&c, Family::Ring, PROTO_SIMPLE, 4, 32);
        assert!((ring - 282.8 * 1.4).abs() < 1e-9, "{ring}");
        // Tree Simple: 8.4 + 2 · (7 · 4.0 + 2 · 14) = 120.4.
        let tree = latency_us(&c, Family::Tree, PROTO_SIMPLE, 4, 32);
        assert!((tree - 120.4).abs() < 1e-9, "{tree}");
        // One GPU per node (GB10): the ring's inter-node steps use the net Tree latency.
        let ring1 = latency_us(&c, Family::Ring, PROTO_SIMPLE, 3, 3);
        assert!((ring1 - (8.4 + 4.0 * 14.0) * 1.4).abs() < 1e-9, "{ring1}");
    }

    #[test]
    fn tree_wins_large_allreduce_on_a_b300_mesh_and_ring_on_a_gb10_mesh() {
        let c = Constants::nccl_defaults();
        for (nodes, per_pair) in [(3, 4.0), (4, 2.0), (8, 1.0)] {
            let m = b300(nodes, per_pair);
            let r = m.rates(&Figure::analytic(nodes));
            for bytes in [16u64 << 20, 256 << 20] {
                assert_eq!(
                    prefer(&c, PROTO_SIMPLE, &m, &r, bytes),
                    Family::Tree,
                    "B300 ×{nodes}"
                );
            }
        }
        let gb10 = Mesh {
            nodes: 3,
            ranks: 3,
            pair_gbps: 200.0 * FRAMING,
            node_gbps: Some(2.0 * 126.0 * PCIE_EFFICIENCY),
        };
        let r = gb10.rates(&Figure::analytic(3));
        assert_eq!(prefer(&c, PROTO_SIMPLE, &gb10, &r, 256 << 20), Family::Ring);
        let pts = switch_points(&c, PROTO_SIMPLE, &gb10, &r);
        assert_eq!(pts.last().map(|p| p.1), Some(Family::Ring), "{pts:?}");
        // Tree wins there only by latency at small sizes: never by bandwidth.
        assert!(!tree_has_more_bandwidth(&c, &gb10, &r));
        let m = b300(4, 2.0);
        assert!(tree_has_more_bandwidth(
            &c,
            &m,
            &m.rates(&Figure::analytic(4))
        ));
    }

    #[test]
    fn constants_and_sizes() {
        let c = Constants::nccl_defaults();
        assert!(c.is_sane());
        assert_eq!(c.per_channel_tree_gbytes(4), 24.0);
        assert_eq!(c.per_channel_tree_gbytes(2), 41.4);
        let mut bad = c.clone();
        bad.base_latencies[1][2] = f64::NAN;
        assert!(!bad.is_sane());
        let mut zero = c.clone();
        zero.hw_latencies[HW_NET][ALGO_TREE][PROTO_SIMPLE] = 0.0;
        assert!(!zero.is_sane());
        assert_eq!(size_text(1 << 20), "1 MiB");
        assert_eq!(size_text(3 << 10), "3 KiB");
        assert_eq!(size_text(1000), "1000 B");
        assert_eq!(log2i(0), 0);
        assert_eq!(log2i(1 << 20), 20);
    }
}
