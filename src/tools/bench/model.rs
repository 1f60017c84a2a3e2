//! `switchless bench MODE --model SPEC`: every rank a thread, every connection the real comms over
//! the model fabric ([`crate::transport::modelfab`]), time virtual. Adds to the report the modelled
//! rates, the efficiency per size and a one-way small-message latency against the modelled one-way
//! time of one RDMA write.
#![forbid(unsafe_code)]

use super::clock::{Group, VirtualClock};
use super::inproc::InProcHub;
use super::modes::{Drive, Mode, Options, Report, run_with};
use super::summary::{Counters, ModelSummary, PathSummary, Pattern};
use crate::error::{Error, Result};
use crate::transport::comm::ProtocolConfig;
use crate::transport::modelfab::link::{Framing, Topology};
use crate::transport::modelfab::{ModelFab, ModelFabConfig};

/// What to model.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// `RATE[/LATENCY][@ROOT],...`
    pub spec: String,
    /// `ROOT=RATE,...` (may be empty).
    pub pcie: String,
    /// RoCE MTU (0: payload only, no framing).
    pub mtu: u32,
    pub pattern: Pattern,
    /// Overrides the pattern's step.
    pub step_bytes: Option<usize>,
    /// Copy and check payloads; `None`: when the largest size is at most [`VERIFY_MAX_BYTES`].
    pub verify: Option<bool>,
    /// Size of the latency probe's messages (bytes).
    pub latency_bytes: usize,
}

/// Payload checks are on by default up to this largest size.
pub const VERIFY_MAX_BYTES: usize = 16 << 20;

fn framing_text(f: Framing) -> String {
    match f {
        Framing::RoceV2 { mtu } => format!("RoCE v2 over IPv4, MTU {mtu}"),
        Framing::Ideal => "payload only".into(),
    }
}

/// Runs `o.mode` with `nranks` ranks on one fresh model fabric; returns rank 0's report, the
/// trace digest and the fabric's per-path counts.
fn run_once(
    o: &Options,
    nranks: usize,
    topo: &Topology,
    verify: bool,
    step: Option<usize>,
) -> Result<(Report, u64, Vec<crate::transport::modelfab::PathStats>)> {
    let fab = ModelFab::new(ModelFabConfig {
        topology: topo.clone(),
        copy_data: verify,
        trace: false,
    })?;
    let vc = VirtualClock::new(fab.clone(), nranks);
    let hub = InProcHub::new(fab.clone());
    let cfg = ProtocolConfig::default();
    let rank_run = |mut vr: super::clock::VirtualRank| -> Result<Report> {
        let clock = vr.clock();
        let net = hub.net(vr.rank(), clock.clone(), cfg);
        let d = Drive {
            clock: &clock,
            verify,
            step_bytes: step,
        };
        let r = run_with(&net, &mut vr, o, &d);
        if let Err(e) = &r {
            vr.abort(&e.to_string());
        }
        r
    };
    let reports = std::thread::scope(|s| {
        let hs: Vec<_> = (1..nranks)
            .map(|r| {
                let vr = vc.rank(r);
                s.spawn(move || rank_run(vr))
            })
            .collect();
        let root = rank_run(vc.rank(0));
        let mut first_err = root.as_ref().err().cloned();
        for h in hs {
            match h.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(Error::Internal("a model rank thread panicked".into()));
                }
            }
        }
        match (root, first_err) {
            // the root's own error first; else another rank's
            (Err(e), _) | (Ok(_), Some(e)) => Err(e),
            (Ok(r), None) => Ok(r),
        }
    })?;
    Ok((reports, fab.trace_hash()?, fab.stats()?.paths))
}

/// Runs `o.mode` under the model and a latency probe; fills the model columns and summary.
pub fn run(o: &Options, nranks: usize, mo: &ModelOptions) -> Result<Report> {
    let framing = Framing::from_mtu(mo.mtu)?;
    let topo = Topology::parse(&mo.spec, &mo.pcie, framing)?;
    let verify = mo.verify.unwrap_or(o.max_bytes <= VERIFY_MAX_BYTES);
    let step = mo.step_bytes.or(mo.pattern.step_bytes());
    if step == Some(0) || mo.latency_bytes == 0 {
        return Err(Error::InvalidUsage(
            "--step-bytes and --latency-bytes must be at least 1".into(),
        ));
    }
    let (mut rep, hash, main_paths) = run_once(o, nranks, &topo, verify, step)?;
    // The stream's messages are all the main run moves (nothing else crosses the fabric).
    let stream =
        (o.mode == Mode::Bandwidth && step.is_some() && o.min_bytes == o.max_bytes).then(|| {
            let messages = (o.warmup + o.iters) as u64;
            Counters::from_stats(o.min_bytes, messages, &main_paths)
        });
    let sum = topo.sum_rate_bps() as f64 / 1e9;
    let capacity = match o.mode {
        Mode::Latency => None,
        Mode::Bandwidth | Mode::Allreduce => Some(sum),
        // every rank sends to all n-1 others over their own cables
        Mode::Alltoall => Some(sum * (nranks - 1) as f64),
    };
    for row in rep.rows.iter_mut() {
        row.modelled_gbits_s = capacity;
        let got = match o.mode {
            Mode::Bandwidth => row.algbw_gbits_s,
            _ => row.busbw_gbits_s,
        };
        row.efficiency = capacity.map(|c| got / c);
    }
    let efficiency = rep.rows.last().and_then(|r| r.efficiency);
    // The main run is the probe itself: a two-rank ping-pong of the probe's size only.
    let main_is_probe = o.mode == Mode::Latency
        && nranks == 2
        && o.min_bytes == mo.latency_bytes
        && o.max_bytes == mo.latency_bytes;
    let (latency_us, counters) = if main_is_probe {
        // Each rank sends one message per round trip, warm-up included.
        let messages = 2 * (o.warmup + o.iters) as u64;
        (
            rep.rows.first().map_or(0.0, |r| r.time_us),
            Counters::from_stats(mo.latency_bytes, messages, &main_paths),
        )
    } else {
        let probe = Options {
            mode: Mode::Latency,
            min_bytes: mo.latency_bytes,
            max_bytes: mo.latency_bytes,
            iters: 20,
            warmup: 2,
            progress: false,
            ..o.clone()
        };
        let (p, _, paths) = run_once(&probe, 2, &topo, true, None)?;
        let messages = 2 * (probe.warmup + probe.iters) as u64;
        let first = p.rows.first().map_or(0.0, |r| r.time_us);
        // A latency run that starts at the probe's size reports its own first row, as before.
        let lat = if o.mode == Mode::Latency && o.min_bytes == mo.latency_bytes {
            rep.rows.first().map_or(first, |r| r.time_us)
        } else {
            first
        };
        (
            lat,
            Counters::from_stats(mo.latency_bytes, messages, &paths),
        )
    };
    let floor = topo.best_write_ps(mo.latency_bytes as u64) as f64 / 1e6;
    rep.plugin = "switchless comms over the model fabric (virtual time)".into();
    rep.efficiency = efficiency;
    rep.setup = None; // set-up takes no modelled time
    rep.latency_us = Some(latency_us);
    rep.model = Some(ModelSummary {
        spec: mo.spec.clone(),
        pcie: mo.pcie.clone(),
        paths: topo
            .paths
            .iter()
            .map(|p| PathSummary {
                rate_gbits_s: p.rate_bps as f64 / 1e9,
                latency_us: p.latency_ps as f64 / 1e6,
                root: p.root.clone(),
            })
            .collect(),
        sum_gbits_s: sum,
        framing: framing_text(framing),
        pattern: mo.pattern,
        step_bytes: step,
        window: o.window,
        verify,
        efficiency,
        latency_us,
        latency_bytes: mo.latency_bytes,
        rdma_write_us: floor,
        latency_ratio: if floor > 0.0 { latency_us / floor } else { 0.0 },
        trace_hash: format!("{hash:016x}"),
        counters,
        stream,
    });
    Ok(rep)
}
