//! Bandwidth as NCCL's proxy posts it: a size is moved as sends of at most one step (SIMPLE: 512
//! KiB), with up to `window` (NCCL_STEPS = 8) of them in flight on each side, the receiver keeping
//! its receives posted ahead. Warm-up and timed messages form one continuous stream; the time is
//! taken at the receiver from the moment the warm-up bytes have all arrived to the last arrival, so
//! it is the steady-state rate. Each step lands in a slot of the window and is checked there.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::Instant;

use super::checks::{Local, check_size, fill_region, verify_region};
use super::clock::Clock;
use super::conns::{Conns, wait_tick};
use super::pattern;
use crate::error::Result;
use crate::ffi::loader::net::{Net, RecvBuf, Region};

/// The posting pattern.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stream {
    /// Largest send.
    pub(crate) step_bytes: usize,
    /// Sends (and receives) in flight.
    pub(crate) window: usize,
    /// Untimed messages first.
    pub(crate) warmup: usize,
    /// Timed messages.
    pub(crate) iters: usize,
}

/// Who this rank streams with: its partner and the links to it.
pub(crate) struct Sides {
    pub(crate) me: usize,
    pub(crate) peer: Option<usize>,
    pub(crate) send: Option<usize>,
    pub(crate) recv: Option<usize>,
}

/// The steps of one message of `size` bytes: (offset-free) lengths.
fn steps(size: usize, step: usize) -> Vec<usize> {
    let step = step.max(1);
    let mut v = Vec::with_capacity(size.div_ceil(step).max(1));
    let mut left = size;
    loop {
        v.push(left.min(step));
        left -= left.min(step);
        if left == 0 {
            return v;
        }
    }
}

/// Streams `size`-byte messages from the lower rank of the pair to the higher one; the receiver
/// sets `l.time_us` (per message).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<N: Net>(
    net: &N,
    clock: &impl Clock,
    c: &mut Conns<N>,
    sides: &Sides,
    size: usize,
    st: &Stream,
    deadline: Instant,
    l: &mut Local,
) -> Result<()> {
    let (Some(p), Some(s), Some(r)) = (sides.peer, sides.send, sides.recv) else {
        return Ok(());
    };
    let me = sides.me;
    let per_msg = steps(size, st.step_bytes);
    let k = per_msg.len();
    let total = (st.warmup + st.iters) * k;
    let warm = st.warmup * k;
    let slot = size.min(st.step_bytes.max(1));
    let w = st.window.max(1);
    let len_of = |j: usize| per_msg[j % k];
    let seed =
        |j: usize| pattern::seed(&[7, me.min(p) as u64, me.max(p) as u64, size as u64, j as u64]);
    let mut busy = vec![false; w];
    let mut q: VecDeque<(usize, N::Request)> = VecDeque::with_capacity(w);
    let (mut next, mut done) = (0usize, 0usize);
    let sender = me < p;
    let mut t_start = (warm == 0).then(|| clock.now());
    let mut t_end = None;
    while done < total {
        let mut progressed = false;
        while next < total && !busy[next % w] {
            let off = (next % w) * slot;
            let len = len_of(next);
            let req = if sender {
                let link = &mut c.sends[s];
                fill_region(l, &link.buf, off, len, seed(next))?;
                let region = Region::new(&link.buf, off, len)?;
                match (link.comm.as_mut(), link.mr.as_ref()) {
                    (Some(comm), Some(mr)) => net.isend(comm, &region, me as i32, mr)?,
                    _ => None,
                }
            } else {
                let link = &mut c.recvs[r];
                let region = Region::new(&link.buf, off, len)?;
                match (link.comm.as_mut(), link.mr.as_ref()) {
                    (Some(comm), Some(mr)) => {
                        let b = [RecvBuf {
                            region,
                            tag: p as i32,
                            mr,
                        }];
                        net.irecv(comm, &b)?
                    }
                    _ => None,
                }
            };
            let Some(req) = req else { break };
            busy[next % w] = true;
            q.push_back((next, req));
            next += 1;
            progressed = true;
        }
        let mut i = 0;
        while i < q.len() {
            let Some(sizes) = net.test(&mut q[i].1)? else {
                i += 1;
                continue;
            };
            let Some((j, _)) = q.remove(i) else { break };
            progressed = true;
            done += 1;
            if !sender {
                let got = sizes.first().copied().unwrap_or(0);
                l.check(check_size(got, len_of(j), "bandwidth step"));
                let off = (j % w) * slot;
                let what = format!("bandwidth {size} B step {j} from rank {p}");
                verify_region(l, &c.recvs[r].buf, off, len_of(j), seed(j), &what)?;
                if done == warm {
                    t_start = Some(clock.now());
                }
                if done == total {
                    t_end = Some(clock.now());
                }
            }
            busy[j % w] = false;
        }
        if done < total {
            wait_tick(clock, progressed, deadline, || {
                format!(
                    "bandwidth {size} B: {done} of {total} steps done, {} posted",
                    next
                )
            })?;
        }
    }
    if let (Some(a), Some(b)) = (t_start, t_end) {
        l.time_us = b.saturating_duration_since(a).as_secs_f64() * 1e6 / st.iters.max(1) as f64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_cover_the_message() {
        assert_eq!(steps(8, 512), vec![8]);
        assert_eq!(steps(1024, 512), vec![512, 512]);
        assert_eq!(steps(1100, 512), vec![512, 512, 76]);
        assert_eq!(steps(0, 512), vec![0]);
    }
}
