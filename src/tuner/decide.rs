//! The decisions: one [`Plan`] per communicator, made at `init` from its [`Class`], applied to every cost
//! table NCCL shows the tuner ([`Plan::apply`], ABI v3+) or answered as an algorithm and protocol
//! ([`Plan::choose`], ABI v2, where NCCL shows no table).
//!
//! Rules, in order:
//! 1. Untouched classes (one or two hosts, a switched subnet, no cable, the tuner turned off, a user's
//!    `NCCL_ALGO`/`NCCL_PROTO`/`NCCL_TUNER_PLUGIN`): nothing is written, ever.
//! 2. Non-neighbours without a relay: Tree, NVLS-tree, PAT and CollNet entries are set to
//!    `NCCL_ALGO_PROTO_IGNORE` (NCCL then picks among the Ring entries), for every collective.
//! 3. Mesh: for all-reduce, when NCCL's cheapest entry is Ring, Tree or NVLS-tree with LL128 or Simple
//!    (the bandwidth protocols), the model's family for that protocol wins: the other family's entry
//!    gets NCCL's time scaled by the model's time ratio (so NCCL's estimate stays meaningful). LL is
//!    left to NCCL: its sizes are latency-bound, where the cabling does not matter.
//! 4. Channels (all-reduce decided by the model, plain Ring or Tree with Simple, sizes where NCCL would
//!    use all its channels anyway; NVLS-tree keeps NCCL's NVLS channel count): two per data path facing the busiest peer, as NCCL gives each NIC two channels
//!    (`src/graph/connect.cc`: rings and trees are duplicated); for Tree at least as many as NCCL's own
//!    per-channel Tree limit needs for the model's rate; a multiple of the paths per peer.
//!
//! Invariants (tested): an `IGNORE` entry is never made valid, a table is never left without a valid
//! entry, entries only of the collective's own cost table are written, and a plan reads only what is the
//! same on every host of a uniformly cabled fabric.
#![forbid(unsafe_code)]

use std::fmt::Write as _;

use super::fabric::{Class, Inputs};
use super::figures;
use super::model::{
    self, ALGO_COLLNET_CHAIN, ALGO_COLLNET_DIRECT, ALGO_NAMES, ALGO_NVLS_TREE, ALGO_PAT, ALGO_RING,
    ALGO_TREE, Constants, Family, Figure, Mesh, PROTO_LL, PROTO_LL128, PROTO_NAMES, PROTO_SIMPLE,
    Rates,
};
use crate::error::{Error, Result};

/// `ncclFuncAllReduce`.
pub const COLL_ALLREDUCE: i32 = 4;
/// Collective names by `ncclFunc_t` (2.19–2.30 share the first eight).
const COLL_NAMES: [&str; 8] = [
    "broadcast",
    "reduce",
    "all-gather",
    "reduce-scatter",
    "all-reduce",
    "send/recv",
    "send",
    "recv",
];

/// The value of an entry NCCL did not compute (`NCCL_ALGO_PROTO_IGNORE`).
pub const IGNORE: f32 = -1.0;
/// NCCL's `MAXCHANNELS`.
pub const MAX_CHANNELS: u32 = 64;
/// Channels per data path facing the peer: NCCL's duplication of every ring and tree channel.
pub const CHANNELS_PER_PATH: u32 = 2;
/// NCCL's `NCCL_MAX_NTHREADS` × `NCCL_SIMPLE_THREAD_THRESHOLD`: bytes per channel below which NCCL
/// itself drops channels for a Simple collective (`topoGetAlgoInfo`).
pub const BYTES_PER_FULL_CHANNEL: u64 = 640 * 64;

/// The name of a collective type.
pub fn coll_name(coll: i32) -> String {
    usize::try_from(coll)
        .ok()
        .and_then(|c| COLL_NAMES.get(c))
        .map_or_else(|| format!("collective {coll}"), |s| (*s).to_owned())
}

/// A cost table as NCCL passes it: `algos` × `protos` floats, row per algorithm.
#[derive(Debug)]
pub struct Table<'a> {
    cells: &'a mut [f32],
    algos: usize,
    protos: usize,
}

impl<'a> Table<'a> {
    /// A table of `algos` rows and `protos` columns over `cells`. NCCL 2.22–2.30 pass 6 or 7 algorithms
    /// and 3 protocols; a shape the tuner does not know is an error (it would index the wrong cells).
    pub fn new(cells: &'a mut [f32], algos: usize, protos: usize) -> Result<Table<'a>> {
        if !(6..=7).contains(&algos) || protos != 3 {
            return Err(Error::InvalidArgument(format!(
                "cost table of {algos} algorithms × {protos} protocols; accepted: 6 or 7 × 3 (NCCL 2.22-2.30)"
            )));
        }
        if cells.len() != algos * protos {
            return Err(Error::InvalidArgument(format!(
                "cost table has {} cells for {algos} × {protos}",
                cells.len()
            )));
        }
        Ok(Table {
            cells,
            algos,
            protos,
        })
    }

    /// The entry of (`algo`, `proto`), if in the table.
    pub fn get(&self, algo: usize, proto: usize) -> Option<f32> {
        (algo < self.algos && proto < self.protos).then(|| self.cells[algo * self.protos + proto])
    }

    fn set(&mut self, algo: usize, proto: usize, v: f32) {
        if algo < self.algos && proto < self.protos {
            self.cells[algo * self.protos + proto] = v;
        }
    }

    /// Whether NCCL computed the entry (`NCCL_ALGO_PROTO_IGNORE` is -1; NCCL skips every negative).
    pub fn valid(&self, algo: usize, proto: usize) -> bool {
        self.get(algo, proto)
            .is_some_and(|v| v >= 0.0 && v.is_finite())
    }

    /// NCCL's pick: the cheapest valid entry, first in row-major order on ties (`topoGetAlgoInfo`).
    pub fn best(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize, f32)> = None;
        for a in 0..self.algos {
            for p in 0..self.protos {
                if self.valid(a, p) {
                    let v = self.cells[a * self.protos + p];
                    if best.is_none_or(|(_, _, b)| v < b) {
                        best = Some((a, p, v));
                    }
                }
            }
        }
        best.map(|(a, p, _)| (a, p))
    }
}

/// What one `getCollInfo` did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    /// NCCL's pick before and the pick after, when they differ.
    pub changed: Option<((usize, usize), (usize, usize))>,
    /// Entries set to `IGNORE`.
    pub ignored: usize,
    /// The channel count returned (`None`: NCCL's).
    pub channels: Option<u32>,
}

/// A mesh the model prices.
#[derive(Debug, Clone)]
struct Priced {
    mesh: Mesh,
    rates: Rates,
    consts: Constants,
    /// Data paths facing one peer.
    paths_per_peer: u32,
}

impl Priced {
    /// The family the plan moves NCCL to for `proto` at `bytes`: the model's, except that Tree is chosen
    /// only when the cables favour it ([`model::tree_has_more_bandwidth`]); `None`: NCCL's choice.
    fn target(&self, proto: usize, bytes: u64) -> Option<Family> {
        match model::prefer(&self.consts, proto, &self.mesh, &self.rates, bytes) {
            Family::Tree
                if !model::tree_has_more_bandwidth(&self.consts, &self.mesh, &self.rates) =>
            {
                None
            }
            f => Some(f),
        }
    }

    /// "Tree from 1 KiB, Ring from 1 MiB" for `proto` (NCCL's choice where the plan has none).
    fn switch_text(&self, proto: usize) -> String {
        let mut out: Vec<(u64, Option<Family>)> = Vec::new();
        for shift in 10..=32u32 {
            let bytes = 1u64 << shift;
            let f = self.target(proto, bytes);
            if out.last().map(|(_, g)| *g) != Some(f) {
                out.push((bytes, f));
            }
        }
        out.iter()
            .map(|(b, f)| {
                format!(
                    "{} from {}",
                    f.map_or("NCCL's choice", Family::name),
                    model::size_text(*b)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[derive(Debug, Clone)]
enum Kind {
    Untouched,
    /// Ring only; priced as one pair of neighbour cables per ring edge (Tree rates unused).
    RingOnly(Box<Priced>),
    Model(Box<Priced>),
}

/// The decisions for one communicator.
#[derive(Debug, Clone)]
pub struct Plan {
    kind: Kind,
    summary: String,
}

impl Plan {
    /// A plan that changes nothing, with the reason.
    pub fn untouched(reason: impl Into<String>) -> Plan {
        Plan {
            kind: Kind::Untouched,
            summary: format!("switchless tuner: nothing changed: {}", reason.into()),
        }
    }

    /// The plan for `class`, priced with `consts` (NCCL's constants from v5+ `init`, else its defaults).
    pub fn new(class: &Class, consts: Option<&Constants>) -> Plan {
        let consts = consts
            .filter(|c| c.is_sane())
            .cloned()
            .unwrap_or_else(Constants::nccl_defaults);
        match class {
            Class::Untouched(why) => Plan::untouched(why.clone()),
            Class::NonNeighbours {
                inputs,
                per_neighbour,
            } => {
                let paths = paths(*per_neighbour, inputs);
                let mesh = Mesh {
                    nodes: inputs.nodes,
                    ranks: inputs.ranks,
                    pair_gbps: *per_neighbour as f64 * inputs.cable_gbps * model::FRAMING,
                    node_gbps: inputs.node_gbps,
                };
                // Along the cables each ring edge is one neighbour pair (figure 1.0 for any host count).
                let ring = Figure {
                    nodes: inputs.nodes,
                    ring: 1.0,
                    tree_pair: 0.0,
                    tree_node: 0.0,
                };
                let rates = mesh.rates(&ring);
                Plan {
                    kind: Kind::RingOnly(Box::new(Priced {
                        mesh,
                        rates,
                        consts,
                        paths_per_peer: paths,
                    })),
                    summary: format!(
                        "switchless tuner: {inputs}: fewer cables than other hosts, so some hosts are not \
                         neighbours and no relay reaches them: Ring only for every collective (Tree, \
                         NVLS-tree, PAT and CollNet set to ignored); all-reduce with Simple from {} on: {} \
                         channels (2 per path, {paths} path(s) per neighbour). The hosts must be ranked along \
                         the cables (`switchless plan` and `switchless doctor --fleet` print the order)",
                        model::size_text(u64::from(ring_channels(paths)) * BYTES_PER_FULL_CHANNEL),
                        ring_channels(paths)
                    ),
                }
            }
            Class::Mesh {
                inputs,
                per_peer,
                pair_gbps,
            } => {
                let Some(fig) = figures::lookup(inputs.nodes) else {
                    return Plan::untouched(format!(
                        "{inputs}: the model's figures cover {}..={} hosts",
                        figures::FIGURES.first().map_or(0, |f| f.nodes),
                        figures::FIGURES.last().map_or(0, |f| f.nodes)
                    ));
                };
                let mesh = Mesh {
                    nodes: inputs.nodes,
                    ranks: inputs.ranks,
                    pair_gbps: *pair_gbps,
                    node_gbps: inputs.node_gbps,
                };
                let rates = mesh.rates(fig);
                let priced = Priced {
                    mesh,
                    rates,
                    consts,
                    paths_per_peer: paths(*per_peer, inputs),
                };
                let summary = mesh_summary(inputs, &priced);
                Plan {
                    kind: Kind::Model(Box::new(priced)),
                    summary,
                }
            }
        }
    }

    /// The one INFO line of this communicator: the class, its inputs and every decision with its reason.
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// Per protocol (`PROTO_SIMPLE`, `PROTO_LL128`), where the plan moves an all-reduce NCCL puts on
    /// Ring or Tree: "Tree from 1 KiB", "NCCL's choice from …, Ring from 1 MiB"; `None` for plans without
    /// the model's choice.
    pub fn switch_text(&self, proto: usize) -> Option<String> {
        match &self.kind {
            Kind::Model(m) => Some(m.switch_text(proto)),
            _ => None,
        }
    }

    /// Whether the plan can change anything.
    pub fn is_untouched(&self) -> bool {
        matches!(self.kind, Kind::Untouched)
    }

    /// Applies the plan to NCCL's cost table of one collective (ABI v3+).
    pub fn apply(&self, coll: i32, bytes: u64, table: &mut Table<'_>) -> Outcome {
        let mut out = Outcome::default();
        let before = table.best();
        match &self.kind {
            Kind::Untouched => return out,
            Kind::RingOnly(m) => {
                let ring_left = (0..table.protos).any(|p| table.valid(ALGO_RING, p));
                if !ring_left {
                    return out;
                }
                for a in [
                    ALGO_TREE,
                    ALGO_NVLS_TREE,
                    ALGO_PAT,
                    ALGO_COLLNET_DIRECT,
                    ALGO_COLLNET_CHAIN,
                ] {
                    for p in 0..table.protos {
                        if table.valid(a, p) {
                            table.set(a, p, IGNORE);
                            out.ignored += 1;
                        }
                    }
                }
                if coll == COLL_ALLREDUCE && table.best() == Some((ALGO_RING, PROTO_SIMPLE)) {
                    out.channels = full_channels(ring_channels(m.paths_per_peer), bytes);
                }
            }
            Kind::Model(m) => {
                if coll != COLL_ALLREDUCE {
                    return out;
                }
                let Some((a, p)) = before else {
                    return out;
                };
                let Some(have) = Family::of_algo(a) else {
                    return out;
                };
                if p == PROTO_LL {
                    return out;
                }
                let want = m.target(p, bytes).unwrap_or(have);
                if want != have {
                    // NVLS-tree loads the nodes as Tree does: take whichever of the two NCCL rates cheaper.
                    let candidates: &[usize] = match want {
                        Family::Ring => &[ALGO_RING],
                        Family::Tree => &[ALGO_TREE, ALGO_NVLS_TREE],
                    };
                    let target = candidates
                        .iter()
                        .copied()
                        .filter(|&c| table.valid(c, p))
                        .min_by(|&x, &y| {
                            let (vx, vy) = (
                                table.get(x, p).unwrap_or(0.0),
                                table.get(y, p).unwrap_or(0.0),
                            );
                            vx.total_cmp(&vy)
                        });
                    if let Some(target) = target {
                        let t_have = model::time_us(&m.consts, have, p, &m.mesh, &m.rates, bytes);
                        let t_want = model::time_us(&m.consts, want, p, &m.mesh, &m.rates, bytes);
                        let nccl = table.get(a, p).unwrap_or(0.0);
                        let mut v = (f64::from(nccl) * t_want / t_have) as f32;
                        if !(v.is_finite() && v >= 0.0 && v < nccl) {
                            v = nccl * 0.999;
                        }
                        // Strictly below every other valid entry.
                        let floor = lowest_other(table, (target, p));
                        if floor.is_some_and(|f| v >= f) {
                            v = floor.unwrap_or(0.0) * 0.999;
                        }
                        table.set(target, p, v.max(0.0));
                    }
                }
                // Channels for plain Ring and Tree only: NCCL sizes NVLS-tree from its NVLS channels.
                let c = match table.best() {
                    Some((ALGO_RING, PROTO_SIMPLE)) => Some(ring_channels(m.paths_per_peer)),
                    Some((ALGO_TREE, PROTO_SIMPLE)) => Some(tree_channels(m)),
                    _ => None,
                };
                out.channels = c.and_then(|c| full_channels(c, bytes));
            }
        }
        let after = table.best();
        if let (Some(b), Some(a)) = (before, after) {
            if a != b {
                out.changed = Some((b, a));
            }
        }
        out
    }

    /// The algorithm and protocol to name for one collective when NCCL shows no table (ABI v2): the
    /// model's pick over Ring and Tree × LL, LL128, Simple, named only when it is Simple (NCCL then
    /// uses it without checking that the protocol is enabled; LL and LL128 stay NCCL's choice); on a
    /// fabric with non-neighbours, Ring with the model's better of LL and Simple (never LL128, which NCCL
    /// enables only on some paths).
    pub fn choose(&self, coll: i32, bytes: u64) -> Option<(usize, usize, Option<u32>)> {
        if coll != COLL_ALLREDUCE {
            return None;
        }
        match &self.kind {
            Kind::Untouched => None,
            Kind::RingOnly(m) => {
                let t = |p| model::time_us(&m.consts, Family::Ring, p, &m.mesh, &m.rates, bytes);
                let proto = if t(PROTO_SIMPLE) <= t(PROTO_LL) {
                    PROTO_SIMPLE
                } else {
                    PROTO_LL
                };
                let ch = (proto == PROTO_SIMPLE)
                    .then(|| full_channels(ring_channels(m.paths_per_peer), bytes))
                    .flatten();
                Some((ALGO_RING, proto, ch))
            }
            Kind::Model(m) => {
                let mut best: Option<(Family, usize, f64)> = None;
                for fam in [Family::Ring, Family::Tree] {
                    for p in [PROTO_LL, PROTO_LL128, PROTO_SIMPLE] {
                        let t = model::time_us(&m.consts, fam, p, &m.mesh, &m.rates, bytes);
                        if best.is_none_or(|(_, _, b)| t < b) {
                            best = Some((fam, p, t));
                        }
                    }
                }
                let (fam, p, _) = best?;
                if p != PROTO_SIMPLE || m.target(p, bytes) != Some(fam) {
                    return None;
                }
                let c = match fam {
                    Family::Ring => ring_channels(m.paths_per_peer),
                    Family::Tree => tree_channels(m),
                };
                Some((fam.algo(), PROTO_SIMPLE, full_channels(c, bytes)))
            }
        }
    }
}

fn paths(cables_per_peer: usize, inputs: &Inputs) -> u32 {
    u32::try_from(cables_per_peer.max(1) * inputs.paths_per_cable.max(1)).unwrap_or(u32::MAX)
}

fn ring_channels(paths_per_peer: u32) -> u32 {
    (CHANNELS_PER_PATH.saturating_mul(paths_per_peer)).clamp(2, MAX_CHANNELS)
}

/// Tree channels: two per path, and at least what NCCL's per-channel Tree limit needs to carry the
/// model's Tree rate (NCCL's Tree "busBw" is twice the algbw), rounded up to a multiple of the paths.
fn tree_channels(m: &Priced) -> u32 {
    let per_channel = m.consts.per_channel_tree_gbytes(m.mesh.nodes);
    let need = if per_channel > 0.0 {
        (2.0 * m.rates.tree_algbw / 8.0 / per_channel).ceil()
    } else {
        0.0
    };
    let need = if need.is_finite() && need > 0.0 {
        need.min(f64::from(MAX_CHANNELS)) as u32
    } else {
        0
    };
    let step = m.paths_per_peer.max(1);
    let c = need.max(CHANNELS_PER_PATH.saturating_mul(step));
    c.div_ceil(step).saturating_mul(step).clamp(2, MAX_CHANNELS)
}

/// `channels` when `bytes` is large enough that NCCL would run all its channels for a Simple
/// collective; `None` (NCCL's count) below.
fn full_channels(channels: u32, bytes: u64) -> Option<u32> {
    (bytes >= u64::from(channels) * BYTES_PER_FULL_CHANNEL).then_some(channels)
}

fn lowest_other(table: &Table<'_>, skip: (usize, usize)) -> Option<f32> {
    let mut low: Option<f32> = None;
    for a in 0..table.algos {
        for p in 0..table.protos {
            if (a, p) != skip && table.valid(a, p) {
                let v = table.cells[a * table.protos + p];
                low = Some(low.map_or(v, |l| l.min(v)));
            }
        }
    }
    low
}

fn mesh_summary(inputs: &Inputs, m: &Priced) -> String {
    let r = &m.rates;
    let mut s = format!(
        "switchless tuner: {inputs}: full mesh assumed ({:.1} cable(s) per peer, pair {:.0} Gb/s): model \
         all-reduce Ring busbw {:.0} Gb/s (one pair per ring edge), Tree algbw {:.0} Gb/s (busbw {:.0}); ",
        m.mesh.pair_gbps / inputs.cable_gbps / model::FRAMING,
        m.mesh.pair_gbps,
        r.ring_busbw,
        r.tree_algbw,
        r.tree_busbw
    );
    for p in [PROTO_SIMPLE, PROTO_LL128] {
        let _ = write!(
            s,
            "where NCCL picks Ring/Tree with {}: {}; ",
            PROTO_NAMES[p],
            m.switch_text(p)
        );
    }
    if !model::tree_has_more_bandwidth(&m.consts, &m.mesh, &m.rates) {
        s.push_str(
            "Tree is never forced (it moves less than Ring here; latency stays NCCL's call); ",
        );
    }
    let ring = ring_channels(m.paths_per_peer);
    let tree = tree_channels(m);
    let _ = write!(
        s,
        "LL and other collectives left to NCCL; Simple all-reduce channels: Ring {ring} from {}, Tree {tree} \
         from {} ({} path(s) per peer)",
        model::size_text(u64::from(ring) * BYTES_PER_FULL_CHANNEL),
        model::size_text(u64::from(tree) * BYTES_PER_FULL_CHANNEL),
        m.paths_per_peer
    );
    s
}

/// "Tree/Simple" for a cost-table cell.
pub fn cell_name((a, p): (usize, usize)) -> String {
    format!(
        "{}/{}",
        ALGO_NAMES.get(a).copied().unwrap_or("?"),
        PROTO_NAMES.get(p).copied().unwrap_or("?")
    )
}

#[cfg(test)]
mod tests {
    use super::super::fabric::tests::cables;
    use super::super::fabric::{Relay, classify};
    use super::*;
    use proptest::prelude::*;

    fn table7(f: impl Fn(usize, usize) -> f32) -> Vec<f32> {
        (0..21).map(|i| f(i / 3, i % 3)).collect()
    }

    /// A cost table where NCCL (thinking every NIC reaches every host) picks `pick`, with Tree and Ring
    /// valid for every protocol and the rest ignored.
    fn nccl_table(pick: (usize, usize)) -> Vec<f32> {
        table7(|a, p| {
            if (a, p) == pick {
                100.0
            } else if a == ALGO_RING
                || a == ALGO_TREE
                || a == ALGO_PAT
                || a == ALGO_NVLS_TREE && p == PROTO_SIMPLE
            {
                150.0 + (a * 3 + p) as f32
            } else {
                IGNORE
            }
        })
    }

    fn plan(
        nodes: usize,
        ranks: usize,
        n: usize,
        gbps: f64,
        paths: usize,
        shared: Option<u32>,
    ) -> Plan {
        Plan::new(
            &classify(
                nodes,
                ranks,
                &cables(n, gbps, paths, shared),
                Relay::Unavailable,
            ),
            None,
        )
    }

    #[test]
    fn b300_x2_is_untouched() {
        let p = plan(2, 16, 8, 800.0, 2, None);
        assert!(p.is_untouched());
        for bytes in [1u64, 1 << 20, 1 << 30] {
            for pick in [
                (ALGO_RING, PROTO_SIMPLE),
                (ALGO_TREE, PROTO_LL),
                (ALGO_RING, PROTO_LL128),
            ] {
                let mut cells = nccl_table(pick);
                let orig = cells.clone();
                let out = p.apply(
                    COLL_ALLREDUCE,
                    bytes,
                    &mut Table::new(&mut cells, 7, 3).unwrap(),
                );
                assert_eq!(out, Outcome::default());
                assert_eq!(cells, orig);
            }
            assert_eq!(p.choose(COLL_ALLREDUCE, bytes), None);
        }
        assert!(p.summary().contains("two hosts"), "{}", p.summary());
    }

    #[test]
    fn b300_x4_mesh_takes_tree_for_large_allreduce() {
        let p = plan(4, 32, 6, 800.0, 2, None);
        for bytes in [16u64 << 20, 256 << 20] {
            let mut cells = nccl_table((ALGO_RING, PROTO_SIMPLE));
            let out = p.apply(
                COLL_ALLREDUCE,
                bytes,
                &mut Table::new(&mut cells, 7, 3).unwrap(),
            );
            assert_eq!(
                out.changed,
                Some(((ALGO_RING, PROTO_SIMPLE), (ALGO_TREE, PROTO_SIMPLE))),
                "{bytes}"
            );
            let t = Table::new(&mut cells, 7, 3).unwrap();
            assert!(t.get(ALGO_TREE, PROTO_SIMPLE).unwrap() < 100.0);
            // Tree channels: 2 cables × 2 halves per peer; NCCL's 24 GB/s per Tree channel at 4+ nodes
            // needs ceil(2 · 196 / 24) = 17 → 20 (a multiple of 4 paths).
            assert_eq!(out.channels, Some(20));
        }
        // Other collectives and LL are NCCL's.
        let mut cells = nccl_table((ALGO_RING, PROTO_SIMPLE));
        let orig = cells.clone();
        assert_eq!(
            p.apply(2, 256 << 20, &mut Table::new(&mut cells, 7, 3).unwrap()),
            Outcome::default()
        );
        let mut ll = nccl_table((ALGO_RING, PROTO_LL));
        let ll_orig = ll.clone();
        assert_eq!(
            p.apply(
                COLL_ALLREDUCE,
                4096,
                &mut Table::new(&mut ll, 7, 3).unwrap()
            ),
            Outcome::default()
        );
        assert_eq!((cells, ll), (orig, ll_orig));
        // v2: Tree with Simple named where the model's best is Simple (from 512 MiB NCCL's Tree
        // correction no longer applies); at 256 MiB its best is Tree/LL128, which v2 cannot name safely.
        assert_eq!(
            p.choose(COLL_ALLREDUCE, 1 << 30),
            Some((ALGO_TREE, PROTO_SIMPLE, Some(20)))
        );
        assert_eq!(p.choose(COLL_ALLREDUCE, 256 << 20), None);
        assert!(p.summary().contains("full mesh"), "{}", p.summary());
    }

    #[test]
    fn gb10_ring4_never_gets_tree_or_pat() {
        let p = plan(4, 4, 2, 200.0, 2, Some(126_000));
        for coll in 0..5 {
            for bytes in [1u64, 64 << 10, 1 << 20, 256 << 20] {
                let mut cells = nccl_table((ALGO_TREE, PROTO_LL));
                let out = p.apply(coll, bytes, &mut Table::new(&mut cells, 7, 3).unwrap());
                let t = Table::new(&mut cells, 7, 3).unwrap();
                for a in [ALGO_TREE, ALGO_NVLS_TREE, ALGO_PAT] {
                    for pr in 0..3 {
                        assert!(
                            !t.valid(a, pr),
                            "coll {coll} {bytes}: {}",
                            cell_name((a, pr))
                        );
                    }
                }
                assert_eq!(t.best().map(|b| b.0), Some(ALGO_RING));
                assert!(out.ignored > 0);
            }
        }
        // A table with no Ring entry is left alone rather than emptied.
        let mut cells = table7(|a, p| {
            if a == ALGO_TREE && p == PROTO_SIMPLE {
                5.0
            } else {
                IGNORE
            }
        });
        let orig = cells.clone();
        p.apply(
            COLL_ALLREDUCE,
            1 << 20,
            &mut Table::new(&mut cells, 7, 3).unwrap(),
        );
        assert_eq!(cells, orig);
        assert_eq!(
            p.choose(COLL_ALLREDUCE, 1 << 20).map(|c| c.0),
            Some(ALGO_RING)
        );
        assert!(p.summary().contains("Ring only"), "{}", p.summary());
    }

    #[test]
    fn a_users_algo_choice_survives() {
        // NCCL_ALGO=Ring: NCCL hands the tuner a table whose Tree entries are ignored; the mesh plan never
        // makes them valid again.
        let p = plan(4, 32, 6, 800.0, 2, None);
        let mut cells = table7(|a, _| if a == ALGO_RING { 10.0 } else { IGNORE });
        let orig = cells.clone();
        let out = p.apply(
            COLL_ALLREDUCE,
            256 << 20,
            &mut Table::new(&mut cells, 7, 3).unwrap(),
        );
        assert_eq!(cells, orig);
        assert_eq!(out.changed, None);
    }

    #[test]
    fn nvls_tree_is_tree_for_the_model_and_keeps_nccls_channels() {
        // NCCL rates NVLS-tree cheapest among the tree family: the switch from Ring takes it, and the
        // channel count stays NCCL's (NVLS algorithms use NCCL's NVLS channels).
        let p = plan(4, 32, 6, 800.0, 2, None);
        let mut cells = nccl_table((ALGO_RING, PROTO_SIMPLE));
        cells[ALGO_NVLS_TREE * 3 + PROTO_SIMPLE] = 120.0;
        let out = p.apply(
            COLL_ALLREDUCE,
            256 << 20,
            &mut Table::new(&mut cells, 7, 3).unwrap(),
        );
        assert_eq!(
            out.changed,
            Some(((ALGO_RING, PROTO_SIMPLE), (ALGO_NVLS_TREE, PROTO_SIMPLE)))
        );
        assert_eq!(out.channels, None);
        // Already on NVLS-tree: left alone.
        let mut cells = nccl_table((ALGO_NVLS_TREE, PROTO_SIMPLE));
        let orig = cells.clone();
        let out = p.apply(
            COLL_ALLREDUCE,
            256 << 20,
            &mut Table::new(&mut cells, 7, 3).unwrap(),
        );
        assert_eq!((out.changed, out.channels), (None, None));
        assert_eq!(cells, orig);
    }

    #[test]
    fn gb10_mesh3_keeps_ring_for_large_allreduce() {
        let p = plan(3, 3, 2, 200.0, 2, Some(126_000));
        let mut cells = nccl_table((ALGO_TREE, PROTO_SIMPLE));
        let out = p.apply(
            COLL_ALLREDUCE,
            256 << 20,
            &mut Table::new(&mut cells, 7, 3).unwrap(),
        );
        assert_eq!(
            out.changed,
            Some(((ALGO_TREE, PROTO_SIMPLE), (ALGO_RING, PROTO_SIMPLE)))
        );
    }

    #[test]
    fn bad_table_shapes_are_refused() {
        let mut cells = vec![0.0f32; 21];
        assert!(Table::new(&mut cells, 7, 3).is_ok());
        assert!(Table::new(&mut cells[..18], 6, 3).is_ok());
        for (a, p) in [(8, 3), (7, 4), (0, 3), (5, 3), (7, 2)] {
            let n = a * p;
            let mut c = vec![0.0f32; n];
            assert!(Table::new(&mut c, a, p).is_err(), "{a}×{p}");
        }
        assert!(Table::new(&mut cells, 6, 3).is_err());
    }

    proptest! {
        #[test]
        fn never_revives_an_ignored_entry_nor_empties_the_table(
            cells in proptest::collection::vec(prop_oneof![Just(-1.0f32), 0.0f32..1e6], 21),
            coll in 0i32..8,
            bytes in any::<u64>(),
            which in 0usize..4,
        ) {
            let p = match which {
                0 => plan(4, 32, 6, 800.0, 2, None),
                1 => plan(4, 4, 2, 200.0, 2, Some(126_000)),
                2 => plan(3, 3, 2, 200.0, 2, Some(126_000)),
                _ => plan(8, 64, 7, 800.0, 2, None),
            };
            let mut c = cells.clone();
            let out = p.apply(coll, bytes, &mut Table::new(&mut c, 7, 3).unwrap());
            let had_valid = cells.iter().any(|v| *v >= 0.0);
            for (before, after) in cells.iter().zip(&c) {
                if *before < 0.0 {
                    prop_assert_eq!(*after, *before);
                }
                prop_assert!(after.is_finite());
            }
            if had_valid {
                prop_assert!(c.iter().any(|v| *v >= 0.0));
            }
            if let Some(ch) = out.channels {
                prop_assert!((2..=MAX_CHANNELS).contains(&ch));
            }
        }
    }
}
