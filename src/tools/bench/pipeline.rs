//! Runs a [`Plan`] of network steps on one rank as NCCL's proxy drives a plugin: each connection's
//! buffer holds `NCCL_STEPS` slots; a receive is posted as soon as its slot is free (the step
//! `NCCL_STEPS` before it received and passed on), a send as soon as the receives it needs have
//! completed and its slot is free (the send `NCCL_STEPS` before it completed); every request is
//! polled with `test`. Data moves through the slots: receives add into or store the rank's f32
//! array, sends copy out of it, byte patterns are filled and checked (all skipped without checks).
#![forbid(unsafe_code)]

use std::time::Instant;

use super::checks::{Local, check_size};
use super::clock::Clock;
use super::conns::{Conns, wait_tick};
use super::nccl::{Data, NCCL_STEPS, Plan};
use super::pattern;
use crate::error::{Error, Result};
use crate::ffi::loader::net::{Net, RecvBuf, Region};

/// The seed of a pattern step in iteration `iter`.
fn seed(src: usize, dst: usize, index: u64, iter: usize) -> u64 {
    pattern::seed(&[9, src as u64, dst as u64, index, iter as u64])
}

/// Runs `plan` once. `data` is the rank's f32 array (`plan.count` elements; may be empty without
/// checks); `slot` the bytes of one slot of every connection's buffer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    plan: &Plan,
    me: usize,
    slot: usize,
    data: &mut [f32],
    iter: usize,
    deadline: Instant,
    l: &mut Local,
) -> Result<()> {
    let verify = l.verify && data.len() >= plan.count;
    let sends: Vec<usize> = plan
        .sends
        .iter()
        .map(|&(p, ch)| c.send(p, ch))
        .collect::<Result<_>>()?;
    let recvs: Vec<usize> = plan
        .recvs
        .iter()
        .map(|&(p, ch)| c.recv(p, ch))
        .collect::<Result<_>>()?;
    // Steps per connection, in order.
    let mut sq: Vec<Vec<usize>> = vec![Vec::new(); sends.len()];
    let mut rq: Vec<Vec<usize>> = vec![Vec::new(); recvs.len()];
    let mut users = vec![0usize; plan.steps.len()];
    // each step's place in its connection's order (its slot is that modulo NCCL_STEPS)
    let mut pos = vec![0usize; plan.steps.len()];
    for (i, s) in plan.steps.iter().enumerate() {
        if s.bytes > slot {
            return Err(Error::Internal(format!(
                "a step of {} B in slots of {slot} B",
                s.bytes
            )));
        }
        if s.send {
            pos[i] = sq[s.link].len();
            sq[s.link].push(i);
            for &d in &s.deps {
                users[d] += 1;
            }
        } else {
            pos[i] = rq[s.link].len();
            rq[s.link].push(i);
        }
    }
    let n = plan.steps.len();
    let mut req: Vec<Option<N::Request>> = (0..n).map(|_| None).collect();
    // the steps posted and not yet done
    let mut posted: Vec<usize> = Vec::new();
    let mut done = vec![false; n];
    let mut staged = vec![false; n];
    let mut left = n;
    let (mut snext, mut rnext) = (vec![0usize; sends.len()], vec![0usize; recvs.len()]);
    let gone = || Error::Internal("connection used after close".into());
    while left > 0 {
        let mut progressed = false;
        for (li, q) in rq.iter().enumerate() {
            while let Some(&s) = q.get(rnext[li]) {
                let k = rnext[li];
                // the slot is free once the step NCCL_STEPS back arrived and was passed on
                if k >= NCCL_STEPS {
                    let old = q[k - NCCL_STEPS];
                    if !done[old] || users[old] > 0 {
                        break;
                    }
                }
                let link = &mut c.recvs[recvs[li]];
                let mr = link.mr.as_ref().ok_or_else(gone)?;
                let peer = plan.recvs[li].0;
                let b = [RecvBuf {
                    region: Region::new(&link.buf, (k % NCCL_STEPS) * slot, plan.steps[s].bytes)?,
                    tag: peer as i32,
                    mr,
                }];
                match net.irecv(link.comm.as_mut().ok_or_else(gone)?, &b)? {
                    Some(r) => {
                        req[s] = Some(r);
                        posted.push(s);
                        rnext[li] += 1;
                        progressed = true;
                    }
                    None => break,
                }
            }
        }
        for (li, q) in sq.iter().enumerate() {
            while let Some(&s) = q.get(snext[li]) {
                let k = snext[li];
                let step = &plan.steps[s];
                if k >= NCCL_STEPS && !done[q[k - NCCL_STEPS]] {
                    break;
                }
                if step.deps.iter().any(|&d| !done[d]) {
                    break;
                }
                let link = &mut c.sends[sends[li]];
                let off = (k % NCCL_STEPS) * slot;
                if !staged[s] {
                    // copy into the slot once; a refused isend is posted again with these bytes
                    if verify {
                        let mut b = link.buf.lock()?;
                        let out = &mut b[off..off + step.bytes];
                        match step.data {
                            Data::Elems { lo, .. } => pattern::put_f32s(
                                out,
                                data[lo..lo + step.bytes / 4].iter().copied(),
                            ),
                            Data::Pattern { src, dst, index } => {
                                pattern::fill(out, seed(src, dst, index, iter))
                            }
                        }
                    }
                    for &d in &step.deps {
                        users[d] -= 1;
                    }
                    staged[s] = true;
                }
                let mr = link.mr.as_ref().ok_or_else(gone)?;
                let region = Region::new(&link.buf, off, step.bytes)?;
                match net.isend(link.comm.as_mut().ok_or_else(gone)?, &region, me as i32, mr)? {
                    Some(r) => {
                        req[s] = Some(r);
                        posted.push(s);
                        snext[li] += 1;
                        progressed = true;
                    }
                    None => break,
                }
            }
        }
        let mut i = 0;
        while i < posted.len() {
            let s = posted[i];
            let Some(r) = req[s].as_mut() else {
                posted.swap_remove(i);
                continue;
            };
            let Some(sizes) = net.test(r)? else {
                i += 1;
                continue;
            };
            // order among the posted does not matter: each is tested every pass
            posted.swap_remove(i);
            req[s] = None;
            done[s] = true;
            left -= 1;
            progressed = true;
            let step = &plan.steps[s];
            if step.send {
                continue;
            }
            l.check(check_size(
                sizes.first().copied().unwrap_or(0),
                step.bytes,
                "pipelined step",
            ));
            if !verify {
                continue;
            }
            let off = (pos[s] % NCCL_STEPS) * slot;
            let b = c.recvs[recvs[step.link]].buf.lock()?;
            let got = &b[off..off + step.bytes];
            match step.data {
                Data::Elems { lo, add } => {
                    for (i, v) in data[lo..lo + step.bytes / 4].iter_mut().enumerate() {
                        let x = pattern::get_f32(got, i);
                        *v = if add { *v + x } else { x };
                    }
                }
                Data::Pattern { src, dst, index } => {
                    let what = format!("{} B step {index:#x} from rank {src}", step.bytes);
                    l.check(pattern::verify(got, seed(src, dst, index, iter), &what));
                }
            }
        }
        if left > 0 {
            wait_tick(clock, progressed, deadline, || {
                format!("rank {me}: {left} of {n} pipelined steps still pending")
            })?;
        }
    }
    Ok(())
}
