//! `switchless bench bandwidth --model SPEC --cpu`: what the protocol costs the CPU per byte. One
//! thread drives a send comm and a receive comm over the in-memory fabric (no payload copies, work
//! requests executed when posted) with the pattern's steps and window, in real time, so every CPU
//! cycle is protocol work (posting, CTS, completions) or the loop around it. From the thread's CPU
//! time per GB follows the number of cores a host needs to send and receive 800 Gb/s each way.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sys::rawmem::Lent;
use crate::transport::comm::{
    self, MemHandle, ProtocolConfig, RecvBuf, RecvComm, Request, SendComm,
};
use crate::transport::fabric::MemKind;
use crate::transport::memfab::{MemEndpoint, MemFab, MemFabConfig};

/// The line rate the core count is given for, Gb/s per direction.
pub const TARGET_GBITS_S: f64 = 800.0;

/// One size's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuRow {
    pub size_bytes: usize,
    /// Steps (sends) moved.
    pub steps: usize,
    pub bytes: u64,
    /// Wall time, s, and the rate the one thread reached.
    pub wall_s: f64,
    pub gbits_s: f64,
    /// CPU time of the thread (both ends of the connection), s.
    pub cpu_s: f64,
    pub cpu_s_per_gb: f64,
    /// `cpu_s_per_gb` × GB/s at [`TARGET_GBITS_S`], for sending and receiving that rate.
    pub cores_for_target: f64,
}

/// The `--cpu` report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CpuReport {
    pub spec: String,
    pub paths: usize,
    pub step_bytes: usize,
    pub window: usize,
    pub target_gbits_s: f64,
    /// Where the CPU time came from.
    pub cpu_clock: String,
    pub rows: Vec<CpuRow>,
}

use crate::sys::clock::thread_cpu_ns;

struct Ends {
    s: SendComm<MemEndpoint>,
    r: RecvComm<MemEndpoint>,
    sa: u64,
    smh: MemHandle,
    ra: u64,
    rmh: MemHandle,
}

fn ends(speeds_mbps: &[u64], bytes: usize) -> Result<Ends> {
    let fab = MemFab::new(MemFabConfig {
        reorder_seed: None,
        copy_data: false,
        ..MemFabConfig::default()
    });
    let (a, b) = fab.pair(speeds_mbps, 0);
    let (mut s, mut r) = comm::connect_pair(a, b, ProtocolConfig::default())?;
    let sa = fab.alloc(bytes)?;
    let ra = fab.alloc(bytes)?;
    let smh = s.reg_mr(&Lent::simulated(sa, bytes), MemKind::Host)?;
    let rmh = r.reg_mr(&Lent::simulated(ra, bytes), MemKind::Host)?;
    Ok(Ends {
        s,
        r,
        sa,
        smh,
        ra,
        rmh,
    })
}

/// Streams `count` steps of `step` bytes, `window` in flight each side, in this thread.
fn stream(e: &mut Ends, step: usize, count: usize, window: usize, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let mut rq: Vec<(usize, Request)> = Vec::with_capacity(window);
    let mut sq: Vec<(usize, Request)> = Vec::with_capacity(window);
    let (mut rnext, mut snext, mut rdone, mut sdone) = (0, 0, 0, 0);
    let mut rbusy = vec![false; window];
    let mut sbusy = vec![false; window];
    while rdone < count || sdone < count {
        let now = Instant::now();
        if now > deadline {
            return Err(Error::Timeout(format!(
                "--cpu: {rdone} of {count} steps received within {} s",
                limit.as_secs()
            )));
        }
        while rnext < count && !rbusy[rnext % window] {
            let off = ((rnext % window) * step) as u64;
            let b = [RecvBuf {
                addr: e.ra + off,
                size: step as u64,
                tag: 1,
                mh: &e.rmh,
            }];
            let Some(q) = e.r.irecv(now, &b)? else { break };
            rbusy[rnext % window] = true;
            rq.push((rnext, q));
            rnext += 1;
        }
        while snext < count && !sbusy[snext % window] {
            let off = ((snext % window) * step) as u64;
            let Some(q) = e.s.isend(now, e.sa + off, step as u64, 1, &e.smh)? else {
                break;
            };
            sbusy[snext % window] = true;
            sq.push((snext, q));
            snext += 1;
        }
        let mut i = 0;
        while i < rq.len() {
            if e.r.test(now, rq[i].1)?.is_some() {
                rbusy[rq[i].0 % window] = false;
                rq.swap_remove(i);
                rdone += 1;
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < sq.len() {
            if e.s.test(now, sq[i].1)?.is_some() {
                sbusy[sq[i].0 % window] = false;
                sq.swap_remove(i);
                sdone += 1;
            } else {
                i += 1;
            }
        }
    }
    Ok(())
}

/// Measures each size (moved as steps of at most `step` bytes): `bytes_per_size` bytes each, after
/// a warm-up of a tenth of that.
pub fn run(
    spec: &str,
    speeds_mbps: &[u64],
    sizes: &[usize],
    step: usize,
    window: usize,
    bytes_per_size: u64,
    limit: Duration,
) -> Result<CpuReport> {
    let window = window.max(1);
    let mut rows = Vec::new();
    let clock_ok = thread_cpu_ns().is_some();
    for &size in sizes {
        let st = size.min(step.max(1)).max(1);
        let mut e = ends(speeds_mbps, st * window)?;
        let steps = usize::try_from(bytes_per_size / st as u64)
            .unwrap_or(usize::MAX)
            .max(window);
        stream(&mut e, st, (steps / 10).max(window), window, limit)?;
        let (c0, t0) = (thread_cpu_ns(), Instant::now());
        stream(&mut e, st, steps, window, limit)?;
        let wall = t0.elapsed().as_secs_f64();
        let cpu = match (c0, thread_cpu_ns()) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e9,
            _ => wall,
        };
        let bytes = (steps * st) as u64;
        let gb = bytes as f64 / 1e9;
        let per_gb = cpu / gb;
        rows.push(CpuRow {
            size_bytes: size,
            steps,
            bytes,
            wall_s: wall,
            gbits_s: gb * 8.0 / wall.max(1e-12),
            cpu_s: cpu,
            cpu_s_per_gb: per_gb,
            // a host sends and receives the target rate: one send side and one receive side's work,
            // which is what the thread did per byte
            cores_for_target: per_gb * TARGET_GBITS_S / 8.0,
        });
        e.s.close()?;
        e.r.close()?;
    }
    Ok(CpuReport {
        spec: spec.to_string(),
        paths: speeds_mbps.len(),
        step_bytes: step,
        window,
        target_gbits_s: TARGET_GBITS_S,
        cpu_clock: if clock_ok {
            "thread CPU time (CLOCK_THREAD_CPUTIME_ID)".into()
        } else {
            "wall time (no thread CPU clock)".into()
        },
        rows,
    })
}

/// The `--cpu` table.
pub fn table(r: &CpuReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# switchless bench --cpu: {} ({} paths), in-memory fabric without copies, one thread for both ends, steps of at most {} B, {} in flight; CPU from {}",
        r.spec, r.paths, r.step_bytes, r.window, r.cpu_clock
    );
    let _ = writeln!(
        s,
        "# {:>12} {:>8} {:>10} {:>12} {:>12} {:>14}",
        "size(B)", "steps", "cpu(s)", "rate(Gb/s)", "cpu(s/GB)", "cores@800Gb/s"
    );
    for row in &r.rows {
        let _ = writeln!(
            s,
            "  {:>12} {:>8} {:>10.3} {:>12.1} {:>12.5} {:>14.3}",
            row.size_bytes,
            row.steps,
            row.cpu_s,
            row.gbits_s,
            row.cpu_s_per_gb,
            row.cores_for_target
        );
    }
    s
}
