//! `switchless bench allreduce|alltoall --model-mesh CABLES --model-kind b300|gb10`: NCCL's own
//! patterns (`super::nccl`: the rank-order ring over every channel, the double binary tree, the
//! p2p alltoall schedule) run by the real comms over a mesh model fabric built from a cables file
//! (`transport::modelfab::Mesh`), one rank per host, in virtual time; and [`modelled_busbw`], the
//! same as a library call (for the tuner's threshold table).
//!
//! Per host model:
//!
//! * **B300**: every cable joins two ConnectX-8 800G cages, each two 400 Gb/s halves: a 400 Gb/s
//!   wire and a path each (RoCE v2 framing at MTU 4096, 1 us). A connection's own data moves
//!   between the GPU and its NIC over the NIC's PCIe Gen6 switch (≥ 800 Gb/s: not modelled); bytes
//!   a host relays go to and from host memory over the NIC's host link, **assumed** PCIe Gen5 x16
//!   ≈ 400 Gb/s per direction per NIC (`../shared/reviews/mesh-collectives.md` §2). NCCL runs 8
//!   ranks per host; the model runs the network side, one rank per host (the NVLink part inside a
//!   host is not modelled), and counts 8 ranks per host where NCCL's bus bandwidth does (the tree).
//! * **GB10**: every cable is one 200 Gb/s QSFP wire shared by the port's two PCIe functions (a
//!   path each, 1.2 us); all four functions of the NIC sit behind the two PCIe Gen5 x4 links
//!   (92.57 and 97.28 Gb/s of payload, perftest figures), which carry a host's own data and what it
//!   relays alike. One rank per host.
//!
//! Figures, all per host, Gb/s: `busbw_gbps` as nccl-tests computes it (ring: algbw × 2(n-1)/n,
//! which equals what each ring edge carries whatever n; tree: algbw × 2(n-1)/n with n = NCCL's
//! ranks, 8 per B300 host; alltoall: algbw × (n-1)/n over hosts, the host's inter-host send rate);
//! `capacity_gbps` the host's: B300 its cabled ports' wire rate (800 Gb/s each), GB10 its NIC's two
//! x4 links (189.85 Gb/s, which both ports share); `efficiency` = busbw / capacity.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::checks::Local;
use super::clock::{Clock, Group, VirtualClock, VirtualRank};
use super::conns::{Conns, close_all, connect_all};
use super::hints::{ConnKind, bench_hint};
use super::inproc::InProcHub;
use super::modes::{Options, sizes};
use super::nccl::{self, NCCL_STEPS, Plan};
use super::{Net, pattern, pipeline};
use crate::error::{Error, Result};
use crate::tools::plan::PortMap;
use crate::tools::plan::cables;
use crate::transport::comm::{ProtocolConfig, WeightConfig};
use crate::transport::modelfab::link::{DEFAULT_MTU, Framing};
use crate::transport::modelfab::{
    Mesh, MeshPath, MeshRoot, MeshWire, ModelFab, RelayRule, Staging,
};

/// The server model of every host of the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// DGX B300: 8 ConnectX-8 ports (800G, two 400 Gb/s halves each), 8 GPUs.
    B300,
    /// GB10 / DGX Spark: one ConnectX-7, 2 QSFP ports (200 Gb/s) behind two PCIe Gen5 x4 links.
    Gb10,
}

/// NCCL's all-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Algo {
    /// Rank-order ring over every channel.
    Ring,
    /// Double binary tree.
    Tree,
}

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Tree => "tree",
        }
    }
}

/// Relay paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Relay {
    /// As the plugin's policy will: ring and tree connections get one through every host cabled
    /// to both ends where the cables to the peer, not the host's NIC, are the limit (B300 meshes;
    /// not a GB10's, whose two x4 links one peer's cable fills); alltoall only where no cable
    /// joins the pair; pairs no cable joins always.
    Auto,
    /// None: a pair no cable joins cannot connect (today).
    Off,
}

/// How the comms weigh a connection's paths when they stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Weights {
    /// Each path's measured throughput (the comms' default, `NCCL_SWITCHLESS_ADAPTIVE_WEIGHTS=1`).
    Adaptive,
    /// Each path's nominal speed: a relay path keeps the policy's starting split.
    Nominal,
}

/// The collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Collective {
    AllReduce,
    AllToAll,
}

/// B300 cage half and GB10 port line rates, b/s.
const B300_WIRE_BPS: u64 = 400_000_000_000;
const GB10_WIRE_BPS: u64 = 200_000_000_000;
/// Assumed CX-8 host link (PCIe Gen5 x16) per direction, b/s of payload.
const B300_HOST_LINK_BPS: u64 = 400_000_000_000;
/// The GB10 NIC's two PCIe Gen5 x4 links, b/s of payload (perftest figures).
const GB10_X4_BPS: [u64; 2] = [92_570_000_000, 97_280_000_000];

/// A mesh of hosts of one kind, from a cables file.
#[derive(Debug, Clone)]
pub struct MeshModel {
    pub kind: Kind,
    /// The cables file, as named.
    pub source: String,
    pub hosts: usize,
    pub cables: usize,
    /// Relay rule unset ([`RelayRule::Off`]); a run sets it.
    pub mesh: Mesh,
    /// Per host (the mean over hosts where they differ), Gb/s.
    pub capacity_gbps: f64,
    /// NCCL's ranks per host.
    pub ranks_per_host: usize,
}

impl MeshModel {
    /// Builds the model from cables-file text (`source` names it in errors); the format is
    /// `switchless plan`'s, ports numbered as the kind's port map numbers them.
    pub fn from_cables(kind: Kind, source: &str, text: &str) -> Result<MeshModel> {
        let map = match kind {
            Kind::B300 => PortMap::b300(),
            Kind::Gb10 => PortMap::gb10(),
        };
        let c = cables::parse(source, text, &map, None)?;
        let hosts = c.servers as usize;
        let mut wires = Vec::new();
        let mut paths = Vec::new();
        let mut roots: Vec<MeshRoot> = Vec::new();
        let mut ports = vec![0usize; hosts];
        let root = |roots: &mut Vec<MeshRoot>, host: usize, name: String, cap: u64| -> usize {
            match roots.iter().position(|r| r.host == host && r.name == name) {
                Some(i) => i,
                None => {
                    roots.push(MeshRoot {
                        host,
                        name,
                        cap_bps: cap,
                    });
                    roots.len() - 1
                }
            }
        };
        for cable in &c.cables {
            let (a, b) = (cable.a.server as usize - 1, cable.b.server as usize - 1);
            ports[a] += 1;
            ports[b] += 1;
            let name = format!("{} > {}", cable.a, cable.b);
            match kind {
                Kind::B300 => {
                    let ra = root(
                        &mut roots,
                        a,
                        format!("port {} host link", cable.a.port),
                        B300_HOST_LINK_BPS,
                    );
                    let rb = root(
                        &mut roots,
                        b,
                        format!("port {} host link", cable.b.port),
                        B300_HOST_LINK_BPS,
                    );
                    for half in 0..2 {
                        wires.push(MeshWire {
                            hosts: [a, b],
                            rate_bps: B300_WIRE_BPS,
                            latency_ps: 1_000_000,
                        });
                        paths.push(MeshPath {
                            wire: wires.len() - 1,
                            root: [None, None],
                            stage_root: [Some(ra), Some(rb)],
                            label: format!("{name} f{half}"),
                        });
                    }
                }
                Kind::Gb10 => {
                    wires.push(MeshWire {
                        hosts: [a, b],
                        rate_bps: GB10_WIRE_BPS,
                        latency_ps: 1_200_000,
                    });
                    for (f, cap) in GB10_X4_BPS.iter().enumerate() {
                        let ra = root(&mut roots, a, format!("PCIe x4 #{f}"), *cap);
                        let rb = root(&mut roots, b, format!("PCIe x4 #{f}"), *cap);
                        paths.push(MeshPath {
                            wire: wires.len() - 1,
                            root: [Some(ra), Some(rb)],
                            stage_root: [Some(ra), Some(rb)],
                            label: format!("{name} f{f}"),
                        });
                    }
                }
            }
        }
        let capacity_gbps = match kind {
            Kind::B300 => ports.iter().sum::<usize>() as f64 * 800.0 / hosts as f64,
            Kind::Gb10 => GB10_X4_BPS.iter().sum::<u64>() as f64 / 1e9,
        };
        let mesh = Mesh {
            hosts,
            wires,
            paths,
            roots,
            framing: Framing::RoceV2 { mtu: DEFAULT_MTU },
            relay: RelayRule::Off,
            staging: Staging::default(),
        };
        mesh.validate()?;
        Ok(MeshModel {
            kind,
            source: source.to_string(),
            hosts,
            cables: c.cables.len(),
            mesh,
            capacity_gbps,
            ranks_per_host: match kind {
                Kind::B300 => 8,
                Kind::Gb10 => 1,
            },
        })
    }

    /// Reads and builds from a cables file.
    pub fn load(kind: Kind, path: &std::path::Path) -> Result<MeshModel> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("--model-mesh {}", path.display()), e))?;
        MeshModel::from_cables(kind, &path.display().to_string(), &text)
    }
}

/// How to run a mesh model.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    pub collective: Collective,
    pub algo: Algo,
    pub relay: Relay,
    /// Channels (ring: one connection to the next host each; tree: half on each tree), or
    /// connections per peer (alltoall); `None`: the kind's default.
    pub channels: Option<usize>,
    /// Copy and check payloads; `None`: when the largest size is at most 16 MiB.
    pub verify: Option<bool>,
    pub weights: Weights,
    /// Where connections have relay paths and the weights are adaptive: warm up beyond `-w`
    /// until the weights have had two of their 5 ms windows (at most [`WARMUP_MAX`] operations),
    /// so the timed operations see them settled, as a long job would.
    pub settle: bool,
}

impl MeshOptions {
    /// NCCL-like channel counts. B300 ring and tree: 16, one search channel per NIC (8),
    /// duplicated (`src/graph/connect.cc:460`; the doubling for sm90+ stops at 16, `480-483`).
    /// GB10: 4 (a search channel per port, duplicated). Alltoall: 2 connections per peer (NCCL
    /// cuts the per-peer channels until all peers fit one round, `src/graph/paths.cc:993-1001`).
    fn channels(&self, kind: Kind) -> usize {
        self.channels.unwrap_or(match (self.collective, kind) {
            (Collective::AllToAll, _) => 2,
            (Collective::AllReduce, Kind::B300) => 16,
            (Collective::AllReduce, Kind::Gb10) => 4,
        })
    }
}

/// One size.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MeshRow {
    /// All-reduce: the buffer; alltoall: each host's send buffer (bytes to every host, itself
    /// included, as nccl-tests counts it).
    pub size_bytes: usize,
    /// Per operation, the slowest host, us.
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    pub efficiency: f64,
    /// Bytes relay hosts forwarded, as a share of the bytes the hosts sent.
    pub relayed_share: f64,
    /// Failed data checks over all hosts.
    pub errors: u64,
}

/// A mesh run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MeshReport {
    pub mode: &'static str,
    /// All-reduce only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algo: Option<Algo>,
    pub kind: Kind,
    pub cables_file: String,
    pub hosts: usize,
    pub cables: usize,
    /// NCCL's ranks per host (the model runs one per host).
    pub ranks_per_host: usize,
    pub relay: Relay,
    pub weights: Weights,
    /// Connections that got relay paths, of all connections made.
    pub relayed_connections: usize,
    pub connections: usize,
    pub channels: usize,
    pub verify: bool,
    pub rows: Vec<MeshRow>,
    /// At the largest size.
    pub busbw_gbps: f64,
    pub capacity_gbps: f64,
    pub efficiency: f64,
    /// At the largest size: what each host forwarded as a relay, Gb/s.
    pub relayed_gbps: Vec<f64>,
    pub trace_hash: String,
    /// First data-check failure, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

impl MeshReport {
    pub fn errors(&self) -> u64 {
        self.rows.iter().map(|r| r.errors).sum()
    }
}

/// One rank's plan for one size: NCCL's pattern for the collective.
fn plan(
    coll: Collective,
    algo: Algo,
    kind: Kind,
    me: usize,
    n: usize,
    channels: usize,
    size: usize,
) -> Plan {
    match (coll, algo) {
        (Collective::AllReduce, Algo::Ring) => nccl::ring_allreduce(me, n, channels, size / 4),
        (Collective::AllReduce, Algo::Tree) => nccl::tree_allreduce(me, n, channels, size / 4),
        (Collective::AllToAll, _) => nccl::alltoall(me, n, channels, size / n, p2p_chunk(kind)),
    }
}

/// NCCL's p2p chunk: 128 KiB, doubled on GB-class Arm hosts (`src/init.cc:829-834`).
fn p2p_chunk(kind: Kind) -> usize {
    match kind {
        Kind::B300 => nccl::P2P_NET_CHUNK_BYTES,
        Kind::Gb10 => 2 * nccl::P2P_NET_CHUNK_BYTES,
    }
}

/// Warm-up operations at most, beyond `-w`, while waiting for the stripe weights to settle.
pub const WARMUP_MAX: usize = 32;

/// Per size: time per operation (us), failed checks, first failure.
type Measured = Vec<(f64, u64, Option<String>)>;

#[allow(clippy::too_many_arguments)]
fn rank_run<N: Net>(
    net: &N,
    vr: &mut VirtualRank,
    clock: &impl Clock,
    o: &Options,
    mo: &MeshOptions,
    kind: Kind,
    channels: usize,
    verify: bool,
    fab: &ModelFab,
    settle: bool,
    relayed: &mut Vec<Vec<u64>>,
) -> Result<Measured> {
    let (me, n) = (vr.rank(), vr.nranks());
    let sz = sizes(o)?;
    let max = *sz.last().unwrap_or(&o.min_bytes);
    let slot = match mo.collective {
        Collective::AllReduce => nccl::STEP_BYTES,
        Collective::AllToAll => p2p_chunk(kind),
    };
    let links = plan(mo.collective, mo.algo, kind, me, n, channels, max);
    // NCCL's connect-time hint, as with a plugin (the in-process fabric takes none; its relays
    // follow --relay).
    let conn_kind = match mo.collective {
        Collective::AllReduce => ConnKind::Collective { channels },
        Collective::AllToAll => ConnKind::P2p {
            channels,
            per_peer: channels,
        },
    };
    let hint = bench_hint(o.net_attr, conn_kind, n);
    let mut c = connect_all(
        net,
        vr,
        &links.sends,
        &links.recvs,
        NCCL_STEPS * slot,
        NCCL_STEPS * slot,
        None,
        o.timeout,
        hint.as_ref(),
    )?;
    let mut out = Vec::new();
    for &size in &sz {
        let p = plan(mo.collective, mo.algo, kind, me, n, channels, size);
        let mut l = Local::new(verify);
        let mut data = vec![0f32; if verify { p.count } else { 0 }];
        let deadline = Instant::now() + o.timeout;
        let mut total = Duration::ZERO;
        // One operation: fresh inputs, NCCL's steps, the result checked.
        let one = |it: usize, c: &mut Conns<N>, data: &mut Vec<f32>, l: &mut Local| -> Result<()> {
            for (i, v) in data.iter_mut().enumerate() {
                *v = pattern::reduce_input(me, i);
            }
            pipeline::run(net, clock, c, &p, me, slot, data, it, deadline, l)?;
            let bad = data
                .iter()
                .enumerate()
                .find(|(i, v)| **v != pattern::reduce_expected(n, *i));
            if let Some((i, v)) = bad {
                l.check(Err(Error::Remote(format!(
                    "all-reduce of {} f32 iter {it}: element {i} is {v}, expected {}",
                    p.count,
                    pattern::reduce_expected(n, i)
                ))));
            }
            Ok(())
        };
        // Warm up: at least `o.warmup` operations, and (`settle`) on until the comms' adaptive
        // stripe weights have had two of their windows (5 ms of busy time each) or WARMUP_MAX
        // operations; the ranks agree after each (the slowest's clock), so all of them start
        // the timed operations together.
        let settle = if settle {
            2 * WeightConfig::default().window
        } else {
            Duration::ZERO
        };
        let start = clock.now();
        let mut it = 0;
        loop {
            if it >= o.warmup {
                let mine = clock.now().saturating_duration_since(start);
                let mine = u64::try_from(mine.as_nanos()).unwrap_or(u64::MAX);
                let all = vr.allgather(&mine.to_le_bytes())?;
                let least = all
                    .iter()
                    .map(|b| {
                        let mut x = [0u8; 8];
                        x.copy_from_slice(&b[..8]);
                        u64::from_le_bytes(x)
                    })
                    .min()
                    .unwrap_or(0);
                if u128::from(least) >= settle.as_nanos() || it >= o.warmup.max(WARMUP_MAX) {
                    break;
                }
            }
            one(it, &mut c, &mut data, &mut l)?;
            it += 1;
        }
        let before = if me == 0 {
            fab.relayed_bytes()?
        } else {
            vec![]
        };
        for _ in 0..o.iters {
            let t0 = clock.now();
            one(it, &mut c, &mut data, &mut l)?;
            total += clock.now().saturating_duration_since(t0);
            it += 1;
        }
        let mine = total.as_secs_f64() * 1e6 / o.iters as f64;
        let mut blob = mine.to_le_bytes().to_vec();
        blob.extend_from_slice(&l.errors.to_le_bytes());
        blob.extend_from_slice(l.first.as_deref().unwrap_or("").as_bytes());
        let all = vr.allgather(&blob)?;
        let (mut t, mut errors, mut first) = (0f64, 0u64, None);
        for (r, b) in all.iter().enumerate() {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[..8]);
            t = t.max(f64::from_le_bytes(x));
            x.copy_from_slice(&b[8..16]);
            let e = u64::from_le_bytes(x);
            errors += e;
            if e > 0 && first.is_none() {
                first = Some(format!("rank {r}: {}", String::from_utf8_lossy(&b[16..])));
            }
        }
        if me == 0 {
            // every rank has finished this size: the relay counters hold all of it
            let after = fab.relayed_bytes()?;
            relayed.push(after.iter().zip(&before).map(|(a, b)| a - b).collect());
        }
        out.push((t, errors, first));
    }
    vr.barrier()?;
    close_all(net, c)?;
    Ok(out)
}

/// Runs the collective on the mesh model; sizes, iterations and the timeout come from `o`.
pub fn run(o: &Options, model: &MeshModel, mo: &MeshOptions) -> Result<MeshReport> {
    let n = model.hosts;
    let channels = mo.channels(model.kind);
    if channels == 0 {
        return Err(Error::InvalidUsage("--channels must be at least 1".into()));
    }
    if mo.collective == Collective::AllReduce && mo.algo == Algo::Tree && channels % 2 == 1 {
        return Err(Error::InvalidUsage(format!(
            "--channels {channels} with the tree: NCCL's trees take half the channels each; accepted: an even number"
        )));
    }
    if o.iters == 0 {
        return Err(Error::InvalidUsage("--iters must be at least 1".into()));
    }
    let sz = sizes(o)?;
    let verify = mo
        .verify
        .unwrap_or(o.max_bytes <= super::model::VERIFY_MAX_BYTES);
    let mut mesh = model.mesh.clone();
    mesh.relay = match (mo.relay, mo.collective) {
        (Relay::Off, _) => RelayRule::Off,
        (Relay::Auto, Collective::AllReduce) => RelayRule::Needed,
        (Relay::Auto, Collective::AllToAll) => RelayRule::Unreachable,
    };
    // Which connections the pattern makes, and which of them get relay paths.
    let mut connections = 0;
    let mut relayed_connections = 0;
    for me in 0..n {
        let p = plan(
            mo.collective,
            mo.algo,
            model.kind,
            me,
            n,
            channels,
            o.max_bytes,
        );
        for &(peer, _) in &p.sends {
            connections += 1;
            let direct = mesh.paths_between(me, peer).len();
            let relays = if mesh.relays_for(me, peer) {
                mesh.relay_hosts(me, peer).len()
            } else {
                0
            };
            if direct + relays == 0 {
                return Err(Error::InvalidUsage(format!(
                    "{}: hosts {} and {} share no cable and {}: NCCL's {} needs that connection (today it fails, or goes over TCP with NCCL_SWITCHLESS_TCP_FALLBACK=1, which the model does not run); accepted: --relay auto",
                    model.source,
                    me + 1,
                    peer + 1,
                    if mesh.relay == RelayRule::Off {
                        "relays are off"
                    } else {
                        "no host is cabled to both"
                    },
                    mode_name(mo)
                )));
            }
            relayed_connections += usize::from(relays > 0);
        }
    }
    let settle = mo.settle && mo.weights == Weights::Adaptive && relayed_connections > 0;
    // Every size on a fresh fabric and fresh comms, so its figure does not depend on the sizes
    // run before it (the stripe weights would carry over).
    let mut results: Measured = Vec::new();
    let mut relayed: Vec<Vec<u64>> = Vec::new();
    let mut digest = 0xcbf2_9ce4_8422_2325u64;
    for &size in &sz {
        let o1 = Options {
            min_bytes: size,
            max_bytes: size,
            ..o.clone()
        };
        let fab = ModelFab::mesh(mesh.clone(), verify, false)?;
        let vc = VirtualClock::new(fab.clone(), n);
        let hub = InProcHub::new(fab.clone());
        let cfg = ProtocolConfig {
            weights: WeightConfig {
                adaptive: mo.weights == Weights::Adaptive,
                ..WeightConfig::default()
            },
            ..ProtocolConfig::default()
        };
        let measured = std::thread::scope(|s| {
            let run_rank = |mut vr: VirtualRank, relayed: &mut Vec<Vec<u64>>| -> Result<Measured> {
                let clock = vr.clock();
                let net = hub.net(vr.rank(), clock.clone(), cfg);
                let r = rank_run(
                    &net, &mut vr, &clock, &o1, mo, model.kind, channels, verify, &fab, settle,
                    relayed,
                );
                if let Err(e) = &r {
                    vr.abort(&e.to_string());
                }
                r
            };
            let hs: Vec<_> = (1..n)
                .map(|r| {
                    let vr = vc.rank(r);
                    s.spawn(move || run_rank(vr, &mut Vec::new()))
                })
                .collect();
            let root = run_rank(vc.rank(0), &mut relayed);
            let mut first_err = root.as_ref().err().cloned();
            for h in hs {
                match h.join() {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        first_err.get_or_insert(e);
                    }
                    Err(_) => {
                        first_err
                            .get_or_insert(Error::Internal("a model rank thread panicked".into()));
                    }
                }
            }
            match (root, first_err) {
                (Err(e), _) | (Ok(_), Some(e)) => Err(e),
                (Ok(r), None) => Ok(r),
            }
        })?;
        results.extend(measured);
        for b in fab.trace_hash()?.to_le_bytes() {
            digest ^= u64::from(b);
            digest = digest.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let hosts_f = n as f64;
    let nccl_ranks = (model.ranks_per_host * n) as f64;
    let mut rows = Vec::new();
    let mut first_error = None;
    for (k, (&size, (t, errors, first))) in sz.iter().zip(&results).enumerate() {
        let moved = match mo.collective {
            Collective::AllReduce => size,
            // each host sends size / n to every host (itself included)
            Collective::AllToAll => size / n * n,
        };
        let algbw = if *t > 0.0 {
            moved as f64 * 8.0 / (t * 1e3)
        } else {
            0.0
        };
        let factor = match (mo.collective, mo.algo) {
            (Collective::AllReduce, Algo::Ring) => 2.0 * (hosts_f - 1.0) / hosts_f,
            (Collective::AllReduce, Algo::Tree) => 2.0 * (nccl_ranks - 1.0) / nccl_ranks,
            (Collective::AllToAll, _) => (hosts_f - 1.0) / hosts_f,
        };
        // bytes the hosts sent per operation: ring 2(n-1)/n of the buffer each, tree 2(n-1)/n over
        // all hosts, alltoall (n-1)/n of it
        let sent_per_op = match (mo.collective, mo.algo) {
            (Collective::AllReduce, Algo::Ring) => moved as f64 * 2.0 * (hosts_f - 1.0),
            (Collective::AllReduce, Algo::Tree) => moved as f64 * 2.0 * (hosts_f - 1.0),
            (Collective::AllToAll, _) => moved as f64 * (hosts_f - 1.0),
        };
        // relay counters cover the timed operations
        let ops = o.iters as f64;
        let relayed_bytes: u64 = relayed.get(k).map_or(0, |v| v.iter().sum());
        rows.push(MeshRow {
            size_bytes: moved,
            time_us: *t,
            algbw_gbps: algbw,
            busbw_gbps: algbw * factor,
            efficiency: algbw * factor / model.capacity_gbps,
            relayed_share: relayed_bytes as f64 / ops / sent_per_op.max(1.0),
            errors: *errors,
        });
        if first_error.is_none() {
            first_error.clone_from(first);
        }
    }
    let last = rows
        .last()
        .cloned()
        .ok_or_else(|| Error::Internal("no sizes".into()))?;
    let relayed_gbps = relayed
        .last()
        .map(|v| {
            v.iter()
                .map(|&b| b as f64 / o.iters as f64 * 8.0 / (last.time_us * 1e3))
                .collect()
        })
        .unwrap_or_default();
    Ok(MeshReport {
        mode: match mo.collective {
            Collective::AllReduce => "allreduce",
            Collective::AllToAll => "alltoall",
        },
        algo: (mo.collective == Collective::AllReduce).then_some(mo.algo),
        kind: model.kind,
        cables_file: model.source.clone(),
        hosts: n,
        cables: model.cables,
        ranks_per_host: model.ranks_per_host,
        relay: mo.relay,
        weights: mo.weights,
        relayed_connections,
        connections,
        channels,
        verify,
        busbw_gbps: last.busbw_gbps,
        capacity_gbps: model.capacity_gbps,
        efficiency: last.efficiency,
        rows,
        relayed_gbps,
        trace_hash: format!("{digest:016x}"),
        first_error,
    })
}

fn mode_name(mo: &MeshOptions) -> &'static str {
    match (mo.collective, mo.algo) {
        (Collective::AllToAll, _) => "alltoall",
        (Collective::AllReduce, Algo::Ring) => "ring",
        (Collective::AllReduce, Algo::Tree) => "tree",
    }
}

/// What the model says a collective reaches on a mesh, for a caller such as a tuner building
/// its threshold table.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Figure {
    /// Per host, Gb/s (see the module docs).
    pub busbw_gbps: f64,
    pub capacity_gbps: f64,
    pub efficiency: f64,
    /// Per operation, us.
    pub time_us: f64,
}

/// The modelled bus bandwidth of one collective of `bytes` on `model`: NCCL's pattern (`algo`
/// for all-reduce; ignored for alltoall) run by the real comms in virtual time, the kind's
/// channel count, no payload copies, one warm-up (more until adaptive weights settle where there
/// are relay paths) and two timed operations. Deterministic: the
/// same figure on every machine. Takes from milliseconds (small sizes) to tens of seconds (256 MiB
/// on 8 B300 hosts) of real time. Fails where a connection the pattern needs has no path
/// (relays off on a ring of GB10 boxes).
pub fn modelled_busbw(
    model: &MeshModel,
    collective: Collective,
    algo: Algo,
    bytes: usize,
    relay: Relay,
) -> Result<Figure> {
    let o = Options {
        min_bytes: bytes,
        max_bytes: bytes,
        iters: 2,
        warmup: 1,
        progress: false,
        timeout: Duration::from_secs(3600),
        ..Options::default()
    };
    let mo = MeshOptions {
        collective,
        algo,
        relay,
        channels: None,
        verify: Some(false),
        weights: Weights::Adaptive,
        settle: true,
    };
    let r = run(&o, model, &mo)?;
    let row = r
        .rows
        .last()
        .ok_or_else(|| Error::Internal("no row".into()))?;
    Ok(Figure {
        busbw_gbps: row.busbw_gbps,
        capacity_gbps: r.capacity_gbps,
        efficiency: row.efficiency,
        time_us: row.time_us,
    })
}

/// The table for people.
pub fn table(r: &MeshReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let what = match r.algo {
        Some(a) => format!("{} ({})", r.mode, a.name()),
        None => r.mode.to_string(),
    };
    let _ = writeln!(
        s,
        "# switchless bench {what} on a modelled mesh: {} {:?} hosts, {} cables ({}), {} channel(s), relay {:?}",
        r.hosts, r.kind, r.cables, r.cables_file, r.channels, r.relay
    );
    let _ = writeln!(
        s,
        "#  one rank per host (NCCL runs {} per host); {} of {} connections have relay paths; stripe weights {:?}; payload checks {}; time is virtual (trace {})",
        r.ranks_per_host,
        r.relayed_connections,
        r.connections,
        r.weights,
        if r.verify { "on" } else { "off" },
        r.trace_hash
    );
    let _ = writeln!(
        s,
        "#  capacity per host {:.2} Gb/s; busbw per host as nccl-tests computes it",
        r.capacity_gbps
    );
    let _ = writeln!(
        s,
        "{:>12} {:>12} {:>14} {:>14} {:>10} {:>9} {:>7}",
        "size(B)", "time(us)", "algbw(Gb/s)", "busbw(Gb/s)", "busbw/cap", "relayed", "errors"
    );
    for row in &r.rows {
        let _ = writeln!(
            s,
            "{:>12} {:>12.1} {:>14.1} {:>14.1} {:>10.3} {:>9.3} {:>7}",
            row.size_bytes,
            row.time_us,
            row.algbw_gbps,
            row.busbw_gbps,
            row.efficiency,
            row.relayed_share,
            row.errors
        );
    }
    if r.relayed_gbps.iter().any(|&g| g > 0.0) {
        let per: Vec<String> = r
            .relayed_gbps
            .iter()
            .enumerate()
            .map(|(h, g)| format!("host {} {g:.1}", h + 1))
            .collect();
        let _ = writeln!(
            s,
            "#  forwarded as a relay at the largest size (Gb/s): {}",
            per.join(", ")
        );
    }
    s
}
