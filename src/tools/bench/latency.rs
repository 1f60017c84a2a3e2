//! Latency as NCCL's proxy runs a ping-pong: the lower rank of a pair sends a ping and waits for
//! the pong; the higher one answers. Receives are posted ahead, as NCCL's proxy posts a receive as
//! soon as its buffer is free, independently of its sends: the higher rank posts the receive for
//! the next ping right after posting its pong, not after the pong's send completes, so the next
//! ping finds its clear-to-send already there. The time is the lower rank's round trip (both its
//! requests done), halved. Fill, scramble and checks run outside the timed interval.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use super::checks::{Local, check_size, fill_region, scramble, verify_region};
use super::clock::Clock;
use super::conns::{Conns, wait_tick};
use super::pattern;
use crate::error::{Error, Result};
use crate::ffi::loader::net::{Net, RecvBuf, Region};

/// How many round trips.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PingPong {
    /// Untimed round trips first.
    pub(crate) warmup: usize,
    /// Timed round trips.
    pub(crate) iters: usize,
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
    // The higher rank's receive for the next ping, posted ahead.
    let mut ahead = None;
    if !lower {
        scramble(l, &c.recvs[r].buf, 0, size)?;
        ahead = Some(post_recv(net, clock, c, r, size, p, deadline)?);
    }
    for it in 0..total {
        let ping = seed(1, me.min(p), me.max(p), it);
        let pong = seed(2, me.max(p), me.min(p), it);
        let (my_seed, peer_seed) = if lower { (ping, pong) } else { (pong, ping) };
        let what = format!("latency {size} B from rank {p} iter {it}");
        fill_region(l, &c.sends[s].buf, 0, size, my_seed)?;
        if lower {
            scramble(l, &c.recvs[r].buf, 0, size)?;
            let t0 = clock.now();
            let rq = post_recv(net, clock, c, r, size, p, deadline)?;
            let sq = post_send(net, clock, c, s, size, me, deadline)?;
            let got = wait_all(net, clock, Some(rq), Some(sq), deadline, &what)?;
            if it >= pp.warmup {
                let rtt = clock.now().saturating_duration_since(t0);
                total_t += rtt;
                one_way.push(rtt.as_secs_f64() * 1e6 / 2.0);
            }
            l.check(check_size(got, size, "latency"));
        } else {
            let Some(rq) = ahead.take() else {
                return Err(Error::Internal(
                    "latency: the next receive was not posted".into(),
                ));
            };
            let got = wait_all(net, clock, Some(rq), None, deadline, &what)?;
            let sq = post_send(net, clock, c, s, size, me, deadline)?;
            l.check(check_size(got, size, "latency"));
            verify_region(l, &c.recvs[r].buf, 0, size, peer_seed, &what)?;
            if it + 1 < total {
                scramble(l, &c.recvs[r].buf, 0, size)?;
                ahead = Some(post_recv(net, clock, c, r, size, p, deadline)?);
            }
            wait_all(net, clock, None, Some(sq), deadline, &what)?;
            continue;
        }
        verify_region(l, &c.recvs[r].buf, 0, size, peer_seed, &what)?;
    }
    if lower {
        l.time_us = total_t.as_secs_f64() * 1e6 / pp.iters.max(1) as f64 / 2.0;
        l.spread = super::checks::Spread::of(one_way);
    }
    Ok(())
}

fn gone() -> Error {
    Error::Internal("connection used after close".into())
}

/// Posts a receive of `size` bytes tagged `tag` on receive link `r`, retried until non-NULL.
fn post_recv<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    r: usize,
    size: usize,
    tag: usize,
    deadline: Instant,
) -> Result<N::Request> {
    loop {
        let link = &mut c.recvs[r];
        let mr = link.mr.as_ref().ok_or_else(gone)?;
        let b = [RecvBuf {
            region: Region::new(&link.buf, 0, size)?,
            tag: tag as i32,
            mr,
        }];
        if let Some(q) = net.irecv(link.comm.as_mut().ok_or_else(gone)?, &b)? {
            return Ok(q);
        }
        wait_tick(clock, false, deadline, || {
            format!("latency {size} B: irecv stays NULL")
        })?;
    }
}

/// Posts a send of `size` bytes tagged `tag` on send link `s`, retried until non-NULL.
fn post_send<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    s: usize,
    size: usize,
    tag: usize,
    deadline: Instant,
) -> Result<N::Request> {
    loop {
        let link = &mut c.sends[s];
        let mr = link.mr.as_ref().ok_or_else(gone)?;
        let region = Region::new(&link.buf, 0, size)?;
        if let Some(q) = net.isend(
            link.comm.as_mut().ok_or_else(gone)?,
            &region,
            tag as i32,
            mr,
        )? {
            return Ok(q);
        }
        wait_tick(clock, false, deadline, || {
            format!("latency {size} B: isend stays NULL (no clear-to-send)")
        })?;
    }
}

/// Tests the given receive and send until both are done; the received size (0 without a receive).
fn wait_all<N: Net>(
    net: &N,
    clock: &impl Clock,
    mut rq: Option<N::Request>,
    mut sq: Option<N::Request>,
    deadline: Instant,
    what: &str,
) -> Result<usize> {
    let mut got = 0;
    while rq.is_some() || sq.is_some() {
        let mut progressed = false;
        if let Some(q) = rq.as_mut() {
            if let Some(sz) = net.test(q)? {
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
            if net.test(q)?.is_some() {
                sq = None;
                progressed = true;
            }
        }
        if rq.is_some() || sq.is_some() {
            wait_tick(clock, progressed, deadline, || {
                format!("{what}: still pending")
            })?;
        }
    }
    Ok(got)
}
