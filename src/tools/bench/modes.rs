//! The bench modes, written against [`Net`] and driven like NCCL's proxy drives a plugin: listen
//! handles cross through the bootstrap, connect/accept are retried until non-NULL, every buffer
//! is registered on its comm, sends and receives are posted non-blocking (NULL = post again) and
//! polled with `test`. Every received byte is checked (unless a model run without payload copies
//! turns checks off). Time comes from a [`Clock`]: the wall clock, or virtual time under `--model`.
//! The connection and posting loops are in `super::conns`, the streaming bandwidth pattern in
//! `super::stream`.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::bootstrap::Bootstrap;
pub use super::checks::Spread;
use super::checks::{Local, check_size, fill_region, partner, scramble, verify_region};
use super::clock::{Clock, Group, WallClock};
pub use super::conns::SetupTimes;
use super::conns::{Conns, RecvOp, SendOp, close_all, connect_all, exchange};
use super::hints::{ConnKind, NetAttrMode, bench_hint};
use super::pattern;
use super::{latency, stream};
use crate::error::{Error, Result};
use crate::ffi::loader::net::{Net, Properties};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Ping-pong between rank pairs (0-1, 2-3, ...), per size; time = half the round trip.
    Latency,
    /// Stream from each even rank to the next odd one, `window` messages in flight.
    Bandwidth,
    /// Every rank sends a chunk to every other rank (nccl-tests' alltoall sizes).
    Alltoall,
    /// Ring all-reduce (sum of f32) on host memory: reduce-scatter then all-gather, over channels.
    Allreduce,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Latency => "latency",
            Mode::Bandwidth => "bandwidth",
            Mode::Alltoall => "alltoall",
            Mode::Allreduce => "allreduce",
        }
    }
}

/// Bench parameters (the CLI flags).
#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub min_bytes: usize,
    pub max_bytes: usize,
    /// Sizes grow by this factor (≥2).
    pub step_factor: usize,
    pub iters: usize,
    pub warmup: usize,
    /// Bandwidth: messages in flight.
    pub window: usize,
    /// Allreduce: ring channels (one connection each way per channel).
    pub channels: usize,
    /// Allreduce: largest message; each ring step's chunk is cut into slices of at most this.
    pub chunk_bytes: usize,
    /// Device for every connection; `None`: channel/peer round-robin (a locality hint to the plugin).
    pub dev: Option<usize>,
    /// Limit for connection setup and for each size; bandwidth: for each window of messages.
    pub timeout: Duration,
    /// Print a progress line (stderr, rank 0) on runs longer than 2 s.
    pub progress: bool,
    /// Latency: count and time the calls of the timed round trips on each rank (`Row::breakdown`).
    pub breakdown: bool,
    /// Latency: receives each rank keeps posted ahead (1: the pong's just before the ping).
    pub ahead: usize,
    /// Latency: read this host's RDMA port counters around the timed round trips
    /// (`Row::rdma_packets`); set for runs through a real plugin, not in-process ones.
    pub rdma_packets: bool,
    /// Whether `setNetAttr` gets NCCL's connect-time hint before each connect and accept.
    pub net_attr: NetAttrMode,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Latency,
            min_bytes: 8,
            max_bytes: 1 << 20,
            step_factor: 4,
            iters: 20,
            warmup: 2,
            window: 8,
            channels: 2,
            chunk_bytes: 128 << 10,
            dev: None,
            timeout: Duration::from_secs(60),
            progress: true,
            breakdown: false,
            ahead: 2,
            rdma_packets: false,
            net_attr: NetAttrMode::Nccl,
        }
    }
}

/// One line of the result table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub size_bytes: usize,
    /// Elements (f32 for allreduce, bytes otherwise).
    pub count: usize,
    pub iters: usize,
    /// Per operation, microseconds (latency: one way).
    pub time_us: f64,
    pub algbw_gbytes_s: f64,
    pub busbw_gbytes_s: f64,
    pub algbw_gbits_s: f64,
    pub busbw_gbits_s: f64,
    /// Failed data checks over all ranks.
    pub errors: u64,
    /// Under `--model`: the sum of the modelled path rates the row can use, Gb/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modelled_gbits_s: Option<f64>,
    /// Under `--model`: achieved / modelled (bandwidth: algbw; alltoall and allreduce: busbw).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<f64>,
    /// Latency mode: the spread of rank 0's one-way times (`time_us` is their mean), comparable
    /// with perftest's `t_min` / `t_typical` / `t_99` on a noisy host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_way_us: Option<Spread>,
    /// Latency with `--breakdown`: where this rank's time went (each rank reports its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<super::breakdown::Breakdown>,
    /// Latency through a real plugin: this rank's host's RDMA packets per timed round trip, from
    /// its ports' counters (every packet of those ports, not only the bench's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdma_packets: Option<super::rdma_counters::HostPackets>,
}

/// The result of a run (rank 0 holds the merged rows; other ranks their own view of them).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub mode: Mode,
    pub plugin: String,
    pub nranks: usize,
    pub rank: usize,
    pub channels: usize,
    pub devices: Vec<Properties>,
    pub rows: Vec<Row>,
    /// First data-check failure seen by any rank, if any.
    pub first_error: Option<String>,
    /// Wall time of this rank's connection set-up (listen, handle exchange, connect and accept of
    /// every connection, registration, up to the barrier after), per step; absent under `--model`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup: Option<SetupTimes>,
    /// Bytes this rank moved through the plugin (all sizes, warm-up and checks included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_bytes: Option<super::conns::Moved>,
    /// Under `--model`: the efficiency at the largest size (achieved / modelled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<f64>,
    /// Under `--model`: the one-way latency of a small message through the protocol, us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    /// Under `--model`: what was modelled and the summary figures (set by the `--model` runner).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<super::summary::ModelSummary>,
}

impl Report {
    /// Failed checks over all sizes and ranks.
    pub fn errors(&self) -> u64 {
        self.rows.iter().map(|r| r.errors).sum()
    }
}

/// The sizes a run covers.
pub fn sizes(o: &Options) -> Result<Vec<usize>> {
    if o.min_bytes == 0 || o.min_bytes > o.max_bytes {
        return Err(Error::InvalidUsage(format!(
            "sizes {} B..{} B (accepted: 1 <= min <= max)",
            o.min_bytes, o.max_bytes
        )));
    }
    if o.step_factor < 2 {
        return Err(Error::InvalidUsage(format!(
            "step factor {} (accepted: 2 or more)",
            o.step_factor
        )));
    }
    let mut v = vec![];
    let mut s = o.min_bytes;
    while s <= o.max_bytes {
        v.push(s);
        match s.checked_mul(o.step_factor) {
            Some(n) => s = n,
            None => break,
        }
    }
    Ok(v)
}

/// How a run is driven besides its [`Options`].
pub struct Drive<'a, C: Clock> {
    /// The clock every timed interval is measured with.
    pub clock: &'a C,
    /// Fill and check payload bytes (off only where payloads are not copied).
    pub verify: bool,
    /// Bandwidth as NCCL's proxy posts it: each size moved as sends of at most this many bytes,
    /// `window` of them in flight, timed in steady state (`super::stream`). `None`: `window`
    /// whole messages per timed batch.
    pub step_bytes: Option<usize>,
}

/// Runs the mode of `o` on this rank with the wall clock. Every rank must call it with the same
/// options.
pub fn run<N: Net>(net: &N, boot: &mut Bootstrap, o: &Options) -> Result<Report> {
    let d = Drive {
        clock: &WallClock,
        verify: true,
        step_bytes: None,
    };
    run_with(net, boot, o, &d)
}

/// Runs the mode of `o` on this rank as `d` says. Every rank must call it with the same options.
pub fn run_with<N: Net, C: Clock>(
    net: &N,
    boot: &mut impl Group,
    o: &Options,
    d: &Drive<'_, C>,
) -> Result<Report> {
    let clock = d.clock;
    let me = boot.rank();
    let n = boot.nranks();
    if n < 2 {
        return Err(Error::InvalidUsage(format!(
            "{} needs at least 2 ranks (got --nranks {n})",
            o.mode.name()
        )));
    }
    if o.iters == 0 || o.window == 0 || o.channels == 0 || o.chunk_bytes == 0 {
        return Err(Error::InvalidUsage(
            "--iters, --window, --channels and --chunk-bytes must be at least 1".into(),
        ));
    }
    let sizes = sizes(o)?;
    let max = *sizes.last().unwrap_or(&o.min_bytes);
    let ndev = net.devices()?;
    let devices = (0..ndev)
        .map(|d| net.get_properties(d))
        .collect::<Result<Vec<_>>>()?;
    let mut outs = vec![];
    let mut ins = vec![];
    let (send_bytes, recv_bytes);
    match o.mode {
        Mode::Latency | Mode::Bandwidth => {
            if let Some(p) = partner(me, n) {
                outs.push((p, 0));
                ins.push((p, 0));
            }
            let w = if o.mode == Mode::Bandwidth {
                o.window
            } else {
                o.ahead.max(1)
            };
            // bandwidth: one more byte for the ready token after the window's messages; streamed,
            // a slot of one step per message in flight
            let extra = usize::from(o.mode == Mode::Bandwidth);
            let bytes = match d.step_bytes {
                Some(step) if o.mode == Mode::Bandwidth => max.min(step.max(1)) * w + extra,
                _ => max * w + extra,
            };
            send_bytes = bytes;
            recv_bytes = bytes;
        }
        Mode::Alltoall => {
            for p in (0..n).filter(|&p| p != me) {
                outs.push((p, 0));
                ins.push((p, 0));
            }
            send_bytes = max / n + 1;
            recv_bytes = max / n + 1;
        }
        Mode::Allreduce => {
            for ch in 0..o.channels {
                outs.push(((me + 1) % n, ch));
                ins.push(((me + n - 1) % n, ch));
            }
            let per = max.div_ceil(4).div_ceil(n * o.channels) * 4;
            send_bytes = per;
            recv_bytes = per;
        }
    }
    // NCCL's connect-time hint of each connection (`--net-attr`). The all-reduce's rings are a
    // collective's connections. Bandwidth and latency between two ranks are what ncclSend/ncclRecv
    // do in NCCL (nccl-tests' sendrecv), and the alltoall is NCCL's p2p alltoall: p2p connections,
    // with one channel and one connection per peer, as the bench makes them.
    let kind = match o.mode {
        Mode::Allreduce => ConnKind::Collective {
            channels: o.channels,
        },
        Mode::Latency | Mode::Bandwidth | Mode::Alltoall => ConnKind::P2p {
            channels: 1,
            per_peer: 1,
        },
    };
    let hint = bench_hint(o.net_attr, kind, n);
    let mut c = connect_all(
        net,
        boot,
        &outs,
        &ins,
        send_bytes,
        recv_bytes,
        o.dev,
        o.timeout,
        hint.as_ref(),
    )?;
    let setup = c.setup;
    let start = Instant::now();
    let mut rows = vec![];
    let mut first_error = None;
    for (k, &size) in sizes.iter().enumerate() {
        let deadline = Instant::now() + o.timeout;
        let mut l = Local::new(d.verify);
        let (count, eff) = match o.mode {
            Mode::Latency => (
                size,
                match partner(me, n) {
                    Some(p) => {
                        let pp = latency::PingPong {
                            warmup: o.warmup,
                            iters: o.iters,
                            breakdown: o.breakdown,
                            ahead: o.ahead,
                            rdma_packets: o.rdma_packets,
                        };
                        latency::run(net, clock, &mut c, me, p, size, &pp, deadline, &mut l)?;
                        size
                    }
                    None => size,
                },
            ),
            Mode::Bandwidth => match d.step_bytes {
                Some(step) => {
                    let st = stream::Stream {
                        step_bytes: step,
                        window: o.window,
                        warmup: o.warmup,
                        iters: o.iters,
                    };
                    let (s, r) = match partner(me, n) {
                        Some(p) => (Some(c.send(p, 0)?), Some(c.recv(p, 0)?)),
                        None => (None, None),
                    };
                    let sides = stream::Sides {
                        me,
                        peer: partner(me, n),
                        send: s,
                        recv: r,
                    };
                    stream::run(net, clock, &mut c, &sides, size, &st, deadline, &mut l)?;
                    (size, size)
                }
                None => (
                    size,
                    run_bandwidth(net, clock, &mut c, me, n, size, o, deadline, &mut l)?,
                ),
            },
            Mode::Alltoall => {
                let chunk = (size / n).max(1);
                run_alltoall(net, clock, &mut c, me, n, chunk, o, deadline, &mut l)?;
                (chunk * n, chunk * n)
            }
            Mode::Allreduce => {
                let count = (size / 4).max(1);
                run_allreduce(net, clock, &mut c, me, n, count, o, deadline, &mut l)?;
                (count, count * 4)
            }
        };
        // merge: slowest rank's time, every rank's failures
        let mut blob = l.time_us.to_le_bytes().to_vec();
        blob.extend_from_slice(&l.errors.to_le_bytes());
        blob.extend_from_slice(l.first.as_deref().unwrap_or("").as_bytes());
        let all = boot.allgather(&blob)?;
        let mut t: f64 = 0.0;
        let mut errors = 0u64;
        for (r, b) in all.iter().enumerate() {
            if b.len() < 16 {
                return Err(Error::Remote(format!(
                    "rank {r} sent a {} B result (expected at least 16 B)",
                    b.len()
                )));
            }
            let mut tb = [0u8; 8];
            tb.copy_from_slice(&b[..8]);
            let mut eb = [0u8; 8];
            eb.copy_from_slice(&b[8..16]);
            t = t.max(f64::from_le_bytes(tb));
            let e = u64::from_le_bytes(eb);
            errors += e;
            if e > 0 && first_error.is_none() {
                first_error = Some(format!("rank {r}: {}", String::from_utf8_lossy(&b[16..])));
            }
        }
        let algbw = if t > 0.0 { eff as f64 / (t * 1e3) } else { 0.0 };
        let factor = match o.mode {
            Mode::Latency | Mode::Bandwidth => 1.0,
            Mode::Alltoall => (n - 1) as f64 / n as f64,
            Mode::Allreduce => 2.0 * (n - 1) as f64 / n as f64,
        };
        rows.push(Row {
            size_bytes: eff,
            count,
            iters: o.iters,
            time_us: t,
            algbw_gbytes_s: algbw,
            busbw_gbytes_s: algbw * factor,
            algbw_gbits_s: algbw * 8.0,
            busbw_gbits_s: algbw * factor * 8.0,
            errors,
            modelled_gbits_s: None,
            efficiency: None,
            one_way_us: l.spread.take(),
            breakdown: l.breakdown.take(),
            rdma_packets: l.packets.take(),
        });
        if o.progress && me == 0 && start.elapsed() > Duration::from_secs(2) {
            eprintln!(
                "progress: {} {eff} B done ({}/{}), {:.1} s elapsed",
                o.mode.name(),
                k + 1,
                sizes.len(),
                start.elapsed().as_secs_f64()
            );
        }
    }
    boot.barrier()?;
    let moved = c.moved;
    close_all(net, c)?;
    Ok(Report {
        mode: o.mode,
        plugin: net.name(),
        nranks: n,
        rank: me,
        channels: if o.mode == Mode::Allreduce {
            o.channels
        } else {
            1
        },
        devices,
        rows,
        first_error,
        setup: Some(setup),
        plugin_bytes: Some(moved),
        efficiency: None,
        latency_us: None,
        model: None,
    })
}

/// Bandwidth: each window of up to `window` messages is timed on the receiver from posting its
/// receives to the last one tested done; pattern fill, scrambling and verification run outside
/// those intervals. Before each window the sender sends a 1 B "ready" token (after filling the
/// window, before posting the window's sends), so the receiver starts its clock only when the
/// sender has the data ready; the token lands past the data slots and is checked too.
#[allow(clippy::too_many_arguments)]
fn run_bandwidth<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    me: usize,
    n: usize,
    size: usize,
    o: &Options,
    deadline: Instant,
    l: &mut Local,
) -> Result<usize> {
    let Some(p) = partner(me, n) else {
        return Ok(size);
    };
    let sender = me < p;
    let (s, r) = (c.send(p, 0)?, c.recv(p, 0)?);
    // the token slot: one byte after the largest window (see `run`'s buffer sizes)
    let tok = c.sends[s].buf.len().saturating_sub(1);
    let total_msgs = o.warmup + o.iters;
    let mut timed = Duration::ZERO;
    let mut m = 0;
    while m < total_msgs {
        let deadline = window_deadline(deadline, o.timeout);
        // a batch of up to `window` messages, not crossing the warmup boundary
        let end = if m < o.warmup { o.warmup } else { total_msgs };
        let batch = o.window.min(end - m);
        let seed = |i: usize| {
            pattern::seed(&[3, me.min(p) as u64, me.max(p) as u64, size as u64, i as u64])
        };
        let token_seed =
            pattern::seed(&[6, me.min(p) as u64, me.max(p) as u64, size as u64, m as u64]);
        if sender {
            // untimed: fill every message of the window and the token
            for j in 0..batch {
                fill_region(l, &c.sends[s].buf, j * size, size, seed(m + j))?;
            }
            fill_region(l, &c.sends[s].buf, tok, 1, token_seed)?;
            let mut ops = vec![SendOp {
                link: s,
                off: tok,
                len: 1,
                tag: me as i32,
            }];
            ops.extend((0..batch).map(|j| SendOp {
                link: s,
                off: j * size,
                len: size,
                tag: me as i32,
            }));
            exchange(net, clock, c, &ops, &[], deadline)?;
        } else {
            // untimed: scramble the window, wait for the sender's token and check it
            scramble(l, &c.recvs[r].buf, 0, batch * size)?;
            scramble(l, &c.recvs[r].buf, tok, 1)?;
            let got = exchange(
                net,
                clock,
                c,
                &[],
                &[RecvOp {
                    link: r,
                    bufs: vec![(tok, 1, p as i32)],
                }],
                deadline,
            )?;
            l.check(check_size(got[0][0], 1, "bandwidth ready token"));
            verify_region(
                l,
                &c.recvs[r].buf,
                tok,
                1,
                token_seed,
                &format!("bandwidth {size} B ready token before message {m} from rank {p}"),
            )?;
            // timed: post the window's receives .. all tested done
            let ops: Vec<RecvOp> = (0..batch)
                .map(|j| RecvOp {
                    link: r,
                    bufs: vec![(j * size, size, p as i32)],
                })
                .collect();
            let t0 = clock.now();
            let got = exchange(net, clock, c, &[], &ops, deadline)?;
            if m >= o.warmup {
                timed += clock.now().saturating_duration_since(t0);
            }
            // untimed: check every message
            for (j, g) in got.iter().enumerate() {
                l.check(check_size(g[0], size, "bandwidth"));
                verify_region(
                    l,
                    &c.recvs[r].buf,
                    j * size,
                    size,
                    seed(m + j),
                    &format!("bandwidth {size} B message {} from rank {p}", m + j),
                )?;
            }
        }
        m += batch;
    }
    if !sender {
        l.time_us = timed.as_secs_f64() * 1e6 / o.iters as f64;
    }
    // the receiver's ack ends the size on both sides (untimed): the sender does not start the
    // next size before every message of this one has landed
    let ack = pattern::seed(&[4, p as u64, size as u64]);
    let deadline = window_deadline(deadline, o.timeout);
    if sender {
        scramble(l, &c.recvs[r].buf, 0, 1)?;
        let got = exchange(
            net,
            clock,
            c,
            &[],
            &[RecvOp {
                link: r,
                bufs: vec![(0, 1, p as i32)],
            }],
            deadline,
        )?;
        l.check(check_size(got[0][0], 1, "bandwidth ack"));
        verify_region(
            l,
            &c.recvs[r].buf,
            0,
            1,
            pattern::seed(&[4, me as u64, size as u64]),
            "bandwidth ack",
        )?;
    } else {
        fill_region(l, &c.sends[s].buf, 0, 1, ack)?;
        exchange(
            net,
            clock,
            c,
            &[SendOp {
                link: s,
                off: 0,
                len: 1,
                tag: me as i32,
            }],
            &[],
            deadline,
        )?;
    }
    Ok(size)
}

/// The deadline of one window of a bandwidth run (and of its closing ack): `timeout` from now, or
/// the size's deadline if that is later. A long run that keeps completing windows is slow, not
/// stalled: a debug build checking every byte on a starved CPU moves 1 MiB messages at tens of ms
/// each, and 1500 of them outlast any one deadline for the whole size; a window that completes
/// nothing for `timeout` still fails the run.
fn window_deadline(size_deadline: Instant, timeout: Duration) -> Instant {
    Instant::now()
        .checked_add(timeout)
        .map_or(size_deadline, |t| t.max(size_deadline))
}

#[allow(clippy::too_many_arguments)]
fn run_alltoall<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    me: usize,
    n: usize,
    chunk: usize,
    o: &Options,
    deadline: Instant,
    l: &mut Local,
) -> Result<()> {
    let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    let mut total = Duration::ZERO;
    for it in 0..o.warmup + o.iters {
        let seed = |src: usize, dst: usize| {
            pattern::seed(&[5, src as u64, dst as u64, chunk as u64, it as u64])
        };
        let mut sends = vec![];
        let mut recvs = vec![];
        for &p in &peers {
            let s = c.send(p, 0)?;
            let r = c.recv(p, 0)?;
            fill_region(l, &c.sends[s].buf, 0, chunk, seed(me, p))?;
            scramble(l, &c.recvs[r].buf, 0, chunk)?;
            sends.push(SendOp {
                link: s,
                off: 0,
                len: chunk,
                tag: me as i32,
            });
            recvs.push(RecvOp {
                link: r,
                bufs: vec![(0, chunk, p as i32)],
            });
        }
        let t0 = clock.now();
        let got = exchange(net, clock, c, &sends, &recvs, deadline)?;
        if it >= o.warmup {
            total += clock.now().saturating_duration_since(t0);
        }
        for (k, &p) in peers.iter().enumerate() {
            let r = c.recv(p, 0)?;
            l.check(check_size(got[k][0], chunk, "alltoall"));
            verify_region(
                l,
                &c.recvs[r].buf,
                0,
                chunk,
                seed(p, me),
                &format!("alltoall {chunk} B chunk from rank {p} iter {it}"),
            )?;
        }
    }
    l.time_us = total.as_secs_f64() * 1e6 / o.iters as f64;
    Ok(())
}

/// Element range [lo, hi) of part `i` of `parts` equal parts of `count`.
fn part(count: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = count / parts;
    let rem = count % parts;
    let lo = i * base + i.min(rem);
    (lo, lo + base + usize::from(i < rem))
}

#[allow(clippy::too_many_arguments)]
fn run_allreduce<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    me: usize,
    n: usize,
    count: usize,
    o: &Options,
    deadline: Instant,
    l: &mut Local,
) -> Result<()> {
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let chans = o.channels;
    let slice_elems = (o.chunk_bytes / 4).max(1);
    let maxg = 8usize; // buffers per grouped irecv (NCCL IB reports maxRecvs 8)
    let mut data = vec![0f32; count];
    let mut total = Duration::ZERO;
    for it in 0..o.warmup + o.iters {
        for (i, v) in data.iter_mut().enumerate() {
            *v = pattern::reduce_input(me, i);
        }
        let t0 = clock.now();
        // 2(n-1) ring steps: reduce-scatter (reduce into data) then all-gather (copy into data)
        for step in 0..2 * (n - 1) {
            let (send_chunk, recv_chunk) = if step < n - 1 {
                ((me + n - step) % n, (me + n - step - 1) % n)
            } else {
                let s = step - (n - 1);
                ((me + 1 + n - s) % n, (me + n - s) % n)
            };
            let mut sends = vec![];
            let mut recvs = vec![];
            let mut layout = vec![]; // (channel, recv link, [(elem lo, elem hi, buf off)])
            for ch in 0..chans {
                let (clo, chi) = part(count, chans, ch);
                let (slo, shi) = part(chi - clo, n, send_chunk);
                let (rlo, rhi) = part(chi - clo, n, recv_chunk);
                let sl = c.send(next, ch)?;
                let rl = c.recv(prev, ch)?;
                {
                    let mut b = c.sends[sl].buf.lock()?;
                    pattern::put_f32s(
                        &mut b[..(shi - slo) * 4],
                        data[clo + slo..clo + shi].iter().copied(),
                    );
                }
                let mut off = 0;
                let mut tag = 0;
                while off < shi - slo {
                    let len = slice_elems.min(shi - slo - off);
                    sends.push(SendOp {
                        link: sl,
                        off: off * 4,
                        len: len * 4,
                        tag,
                    });
                    off += len;
                    tag += 1;
                }
                let mut pieces = vec![];
                let mut off = 0;
                while off < rhi - rlo {
                    let len = slice_elems.min(rhi - rlo - off);
                    pieces.push((off * 4, len * 4, pieces.len() as i32));
                    off += len;
                }
                for g in pieces.chunks(maxg) {
                    // tags restart per group, as the sender's do per group of maxg slices
                    let base = g.first().map(|p| p.2).unwrap_or(0);
                    recvs.push(RecvOp {
                        link: rl,
                        bufs: g.iter().map(|&(o, len, t)| (o, len, t - base)).collect(),
                    });
                }
                layout.push((rl, clo + rlo, rhi - rlo));
            }
            // sender tags restart per group of maxg slices too
            let mut per_link: HashMap<usize, i32> = HashMap::new();
            for s in &mut sends {
                let k = per_link.entry(s.link).or_insert(0);
                s.tag = *k % maxg as i32;
                *k += 1;
            }
            let got = exchange(net, clock, c, &sends, &recvs, deadline)?;
            let mut gi = 0;
            for (rl, lo, len) in layout {
                let mut want = len * 4;
                let groups = len.div_ceil(slice_elems).div_ceil(maxg);
                for _ in 0..groups {
                    for sz in &got[gi] {
                        want = want.saturating_sub(*sz);
                    }
                    gi += 1;
                }
                l.check(check_size(len * 4 - want, len * 4, "allreduce step"));
                let b = c.recvs[rl].buf.lock()?;
                for i in 0..len {
                    let v = pattern::get_f32(&b, i);
                    if step < n - 1 {
                        data[lo + i] += v;
                    } else {
                        data[lo + i] = v;
                    }
                }
            }
        }
        if it >= o.warmup {
            total += clock.now().saturating_duration_since(t0);
        }
        // without payload copies the sums are of whatever the buffers held: nothing to check
        let bad = data
            .iter()
            .enumerate()
            .find(|(i, v)| l.verify && **v != pattern::reduce_expected(n, *i));
        if let Some((i, v)) = bad {
            l.check(Err(Error::Remote(format!(
                "allreduce of {count} f32 iter {it}: element {i} is {v}, expected {}",
                pattern::reduce_expected(n, i)
            ))));
        }
    }
    l.time_us = total.as_secs_f64() * 1e6 / o.iters as f64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_exactly() {
        for count in [0usize, 1, 5, 17, 1000] {
            for parts in 1..6 {
                let mut next = 0;
                for i in 0..parts {
                    let (lo, hi) = part(count, parts, i);
                    assert_eq!(lo, next);
                    next = hi;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn the_spread_is_order_free_with_the_median_and_p99_of_the_samples() {
        assert_eq!(Spread::of(vec![]), None);
        // 1..=100 shuffled: min 1, median at index 49.5 -> 50 (rounded half up: 51), p99 at 98.01 -> 99
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        v.reverse();
        v.swap(3, 70);
        let w = Spread::of(v).unwrap();
        assert_eq!((w.min, w.median, w.p99, w.max), (1.0, 51.0, 99.0, 100.0));
        let one = Spread::of(vec![7.5]).unwrap();
        assert_eq!(
            (one.min, one.median, one.p99, one.max),
            (7.5, 7.5, 7.5, 7.5)
        );
        // a slow outlier moves the mean, not the median
        let w = Spread::of(vec![1.0, 1.0, 1.0, 1.0, 1000.0]).unwrap();
        assert_eq!((w.median, w.max), (1.0, 1000.0));
    }

    #[test]
    fn sizes_grow_and_reject_bad_input() {
        let o = Options {
            min_bytes: 8,
            max_bytes: 100,
            step_factor: 2,
            ..Options::default()
        };
        assert_eq!(sizes(&o).unwrap(), vec![8, 16, 32, 64]);
        assert!(
            sizes(&Options {
                min_bytes: 0,
                ..o.clone()
            })
            .is_err()
        );
        assert!(
            sizes(&Options {
                step_factor: 1,
                ..o
            })
            .is_err()
        );
    }
}
