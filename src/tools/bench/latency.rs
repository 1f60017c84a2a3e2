//! Latency as NCCL's proxy runs a ping-pong: the lower rank of a pair sends a ping and waits for
//! the pong; the higher one answers. Receives are posted ahead, as NCCL's proxy posts a receive as
//! soon as its buffer is free, independently of its sends: the higher rank posts the receive for
//! the next ping right after posting its pong, not after the pong's send completes, so the next
//! ping finds its clear-to-send already there. The time is the lower rank's round trip (both its
//! requests done), halved. Fill, scramble and checks run outside the timed interval.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use super::breakdown::{Call, Recorder};
use super::checks::{Local, check_size, fill_region, scramble, verify_region};
use super::clock::Clock;
use super::conns::{Conns, wait_tick};
use super::pattern;
use super::rdma_counters;
use crate::error::{Error, Result};
use crate::ffi::loader::net::{Net, RecvBuf, Region};

/// How many round trips.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PingPong {
    /// Untimed round trips first.
    pub(crate) warmup: usize,
    /// Timed round trips.
    pub(crate) iters: usize,
    /// Count and time the calls of the timed round trips (`--breakdown`) into `Local::breakdown`.
    pub(crate) breakdown: bool,
    /// Receives each rank keeps posted (≥ 1), each in its own slot of the receive buffer.
    pub(crate) ahead: usize,
    /// Read this host's RDMA port counters at the start and end of the timed round trips into
    /// `Local::packets`.
    pub(crate) rdma_packets: bool,
}

/// Runs `size`-byte ping-pongs between `me` and `p` on channel 0; the lower rank sets `l.time_us`
/// (one way, the mean) and `l.spread`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    me: usize,
    p: usize,
    size: usize,
    pp: &PingPong,
    deadline: Instant,
    l: &mut Local,
) -> Result<()> {
    let (s, r) = (c.send(p, 0)?, c.recv(p, 0)?);
    let lower = me < p;
    let total = pp.warmup + pp.iters;
    let seed = |dir: u64, from: usize, to: usize, it: usize| {
        pattern::seed(&[dir, from as u64, to as u64, size as u64, it as u64])
    };
    let mut total_t = Duration::ZERO;
    let mut one_way = Vec::with_capacity(pp.iters);
    let mut rec = Recorder::new(pp.breakdown);
    let depth = pp.ahead.max(1);
    // Receives posted and not yet done, oldest first: (request, message number). Message j lands in
    // slot j % depth of the receive buffer.
    let mut posted: VecDeque<(N::Request, usize)> = VecDeque::with_capacity(depth);
    let mut next_recv = 0; // the next message number to post a receive for
    let mut post_upto = |c: &mut Conns<N>,
                         l: &Local,
                         rec: &mut Recorder,
                         posted: &mut VecDeque<(N::Request, usize)>,
                         upto: usize|
     -> Result<()> {
        while next_recv < total.min(upto + 1) {
            let off = (next_recv % depth) * size;
            scramble(l, &c.recvs[r].buf, off, size)?;
            let q = post_recv(net, clock, c, r, off, size, p, deadline, rec)?;
            posted.push_back((q, next_recv));
            next_recv += 1;
        }
        Ok(())
    };
    if !lower {
        // The higher rank's receives for the first pings, posted ahead.
        post_upto(c, l, &mut rec, &mut posted, depth - 1)?;
    }
    let counters = || {
        pp.rdma_packets
            .then(|| rdma_counters::snapshot(Path::new(rdma_counters::SYSFS_INFINIBAND)))
    };
    let mut before = None;
    for it in 0..total {
        if it == pp.warmup {
            before = counters();
            rec.start();
        }
        let ping = seed(1, me.min(p), me.max(p), it);
        let pong = seed(2, me.max(p), me.min(p), it);
        let (my_seed, peer_seed) = if lower { (ping, pong) } else { (pong, ping) };
        let what = format!("latency {size} B from rank {p} iter {it}");
        fill_region(l, &c.sends[s].buf, 0, size, my_seed)?;
        let (rq, j) = if lower {
            let t0 = clock.now();
            // Depth 1: the receive for the pong just before the ping. Deeper: the ping first, then
            // the receive `depth - 1` pongs ahead, whose clear-to-send travels while this round
            // trip is under way, as NCCL's proxy keeps receives posted for the steps ahead.
            if depth == 1 {
                post_upto(c, l, &mut rec, &mut posted, it)?;
            }
            let sq = post_send(net, clock, c, s, size, me, deadline, &mut rec)?;
            post_upto(c, l, &mut rec, &mut posted, it + depth - 1)?;
            let (rq, j) = posted.pop_front().ok_or_else(not_posted)?;
            let got = wait_all(net, clock, Some(rq), Some(sq), deadline, &what, &mut rec)?;
            if it >= pp.warmup {
                let rtt = clock.now().saturating_duration_since(t0);
                total_t += rtt;
                one_way.push(rtt.as_secs_f64() * 1e6 / 2.0);
            }
            rec.round_trip();
            l.check(check_size(got, size, "latency"));
            (None, j)
        } else {
            let (rq, j) = posted.pop_front().ok_or_else(not_posted)?;
            let got = wait_all(net, clock, Some(rq), None, deadline, &what, &mut rec)?;
            let sq = post_send(net, clock, c, s, size, me, deadline, &mut rec)?;
            l.check(check_size(got, size, "latency"));
            (Some(sq), j)
        };
        if j != it {
            return Err(Error::Internal(format!(
                "latency: receive {j} completed in round trip {it}"
            )));
        }
        verify_region(
            l,
            &c.recvs[r].buf,
            (j % depth) * size,
            size,
            peer_seed,
            &what,
        )?;
        if let Some(sq) = rq {
            // The higher rank: its slot is free again; its receive for the ping `depth` ahead
            // goes out while the pong travels.
            post_upto(c, l, &mut rec, &mut posted, it + depth)?;
            wait_all(net, clock, None, Some(sq), deadline, &what, &mut rec)?;
            rec.round_trip();
        }
    }
    if lower {
        l.time_us = total_t.as_secs_f64() * 1e6 / pp.iters.max(1) as f64 / 2.0;
        l.spread = super::checks::Spread::of(one_way);
    }
    l.breakdown = rec.finish();
    if let (Some(b), Some(a)) = (before, counters()) {
        l.packets = rdma_counters::HostPackets::between(&b, &a, pp.iters as u64);
    }
    Ok(())
}

fn not_posted() -> Error {
    Error::Internal("latency: the next receive was not posted".into())
}

fn gone() -> Error {
    Error::Internal("connection used after close".into())
}

/// Posts a receive of `size` bytes at `off` tagged `tag` on receive link `r`, retried until non-NULL.
#[allow(clippy::too_many_arguments)]
fn post_recv<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    r: usize,
    off: usize,
    size: usize,
    tag: usize,
    deadline: Instant,
    rec: &mut Recorder,
) -> Result<N::Request> {
    loop {
        let link = &mut c.recvs[r];
        let mr = link.mr.as_ref().ok_or_else(gone)?;
        let b = [RecvBuf {
            region: Region::new(&link.buf, off, size)?,
            tag: tag as i32,
            mr,
        }];
        let comm = link.comm.as_mut().ok_or_else(gone)?;
        if let Some(q) = rec.time(Call::Irecv, || net.irecv(comm, &b))? {
            return Ok(q);
        }
        rec.time(Call::Idle, || {
            wait_tick(clock, false, deadline, || {
                format!("latency {size} B: irecv stays NULL")
            })
        })?;
    }
}

/// Posts a send of `size` bytes tagged `tag` on send link `s`, retried until non-NULL.
#[allow(clippy::too_many_arguments)]
fn post_send<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    s: usize,
    size: usize,
    tag: usize,
    deadline: Instant,
    rec: &mut Recorder,
) -> Result<N::Request> {
    loop {
        let link = &mut c.sends[s];
        let mr = link.mr.as_ref().ok_or_else(gone)?;
        let region = Region::new(&link.buf, 0, size)?;
        let comm = link.comm.as_mut().ok_or_else(gone)?;
        if let Some(q) = rec.time(Call::Isend, || net.isend(comm, &region, tag as i32, mr))? {
            return Ok(q);
        }
        rec.time(Call::Idle, || {
            wait_tick(clock, false, deadline, || {
                format!("latency {size} B: isend stays NULL (no clear-to-send)")
            })
        })?;
    }
}

/// Tests the given receive and send until both are done; the received size (0 without a receive).
#[allow(clippy::too_many_arguments)]
fn wait_all<N: Net>(
    net: &N,
    clock: &impl Clock,
    mut rq: Option<N::Request>,
    mut sq: Option<N::Request>,
    deadline: Instant,
    what: &str,
    rec: &mut Recorder,
) -> Result<usize> {
    let mut got = 0;
    while rq.is_some() || sq.is_some() {
        let mut progressed = false;
        if let Some(q) = rq.as_mut() {
            if let Some(sz) = rec.time(Call::Test, || net.test(q))? {
                if sz.len() != 1 {
                    return Err(Error::Remote(format!(
                        "test reported {} sizes for a receive of one buffer",
                        sz.len()
                    )));
                }
                got = sz[0];
                rq = None;
                progressed = true;
            }
        }
        if let Some(q) = sq.as_mut() {
            if rec.time(Call::Test, || net.test(q))?.is_some() {
                sq = None;
                progressed = true;
            }
        }
        if rq.is_some() || sq.is_some() {
            rec.time(Call::Idle, || {
                wait_tick(clock, progressed, deadline, || {
                    format!("{what}: still pending")
                })
            })?;
        }
    }
    Ok(got)
}
