//! NCCL's p2p receive pool under a fault, over any fabric: two peers send 256 KiB messages (message
//! `m` from peer `m % 2`) to one host whose receives share 3 buffers, each posted again (for either
//! peer) as soon as its receive completed. Every message must arrive once with exactly its bytes
//! (checked at completion), and a completed buffer must be unchanged when it is posted again and
//! at the end: no write landed after its receive completed. The caller strikes the fault.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use switchless::sys::HostBuffer;
use switchless::transport::comm::{RecvBuf, RecvComm, Request, SendComm};
use switchless::transport::fabric::{Fabric, MemKind};

/// One sending peer: its connection to the pool's host.
pub struct Peer<F: Fabric> {
    pub s: SendComm<F>,
    pub r: RecvComm<F>,
}

/// Message `m`'s bytes: distinct per message, so a copy of one landing in another's buffer shows.
pub fn content(m: usize, len: usize) -> Vec<u8> {
    let mut x = (m as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub const SIZE: usize = 256 << 10;
const RING: usize = 4;
const POOL: usize = 3;

/// Runs `n` messages through the pool. `label` prefixes every failure. `strike(peers, m, now)`
/// runs right after peer 0 handed message `m` to its path(s); `tick(peers, now)` once a round.
/// Fails after `deadline` (a hang fails here, not by a test timeout). Deregisters what it
/// registered; the caller checks its fault's counters and closes the comms.
pub fn run<F: Fabric>(
    peers: &mut [Peer<F>],
    n: usize,
    label: &str,
    deadline: Duration,
    mut strike: impl FnMut(&mut [Peer<F>], usize, Instant),
    mut tick: impl FnMut(&mut [Peer<F>], Instant),
) {
    assert_eq!(peers.len(), 2, "the pool takes two peers");
    let pool = HostBuffer::new(POOL * SIZE).unwrap();
    let rmh: Vec<_> = peers
        .iter_mut()
        .map(|g| g.r.reg_mr(&pool.lend(), MemKind::Host).unwrap())
        .collect();
    let mut src: Vec<HostBuffer> = (0..2)
        .map(|_| HostBuffer::new(RING * SIZE).unwrap())
        .collect();
    let smh: Vec<_> = peers
        .iter_mut()
        .zip(&src)
        .map(|(g, b)| g.s.reg_mr(&b.lend(), MemKind::Host).unwrap())
        .collect();
    let spare: Vec<HostBuffer> = (0..2).map(|_| HostBuffer::new(SIZE).unwrap()).collect();
    let spare_mh: Vec<_> = peers
        .iter_mut()
        .zip(&spare)
        .map(|(g, b)| g.r.reg_mr(&b.lend(), MemKind::Host).unwrap())
        .collect();
    let mut next_op: [Option<Request>; 2] = [None, None];
    let msgs: Vec<Vec<usize>> = (0..2).map(|p| (p..n).step_by(2).collect()).collect();
    let mut next_send = [0usize; 2];
    let mut staged: [Option<usize>; 2] = [None, None];
    let mut ring_free = [[true; RING]; 2];
    let mut sq: [Vec<(usize, Request, usize)>; 2] = [Vec::new(), Vec::new()];
    let mut rq: [Vec<(usize, Request, usize)>; 2] = [Vec::new(), Vec::new()];
    let mut slot_free = [true; POOL];
    let mut last: [Option<usize>; POOL] = [None; POOL];
    let (mut received, mut sent) = (vec![0u32; n], vec![0u32; n]);
    let mut next_post = 0;
    let t = Instant::now();
    while received.iter().any(|&x| x != 1) || sent.iter().any(|&x| x != 1) {
        assert!(
            t.elapsed() < deadline,
            "{label}: hang: received {received:?}, sent {sent:?}; paths up {:?} {:?}",
            peers.iter().map(|g| g.s.paths_up()).collect::<Vec<_>>(),
            peers.iter().map(|g| g.r.paths_up()).collect::<Vec<_>>()
        );
        let now = Instant::now();
        tick(peers, now);
        while next_post < n {
            let Some(k) = slot_free.iter().position(|&f| f) else {
                break;
            };
            // Posted again: it still holds its last message, exactly.
            if let Some(m) = last[k] {
                assert!(
                    pool.read(k * SIZE, SIZE).unwrap() == content(m, SIZE),
                    "{label}: pool buffer {k} changed after its receive of message {m} completed"
                );
            }
            let p = next_post % 2;
            let b = RecvBuf {
                addr: pool.addr() + (k * SIZE) as u64,
                size: SIZE as u64,
                tag: 0,
                mh: &rmh[p],
            };
            match peers[p].r.irecv(now, &[b]).unwrap() {
                Some(q) => {
                    rq[p].push((next_post, q, k));
                    slot_free[k] = false;
                    next_post += 1;
                }
                None => break,
            }
        }
        for p in 0..2 {
            while next_send[p] < msgs[p].len() {
                let m = msgs[p][next_send[p]];
                let e = match staged[p] {
                    Some(e) => e,
                    None => {
                        let Some(e) = ring_free[p].iter().position(|&f| f) else {
                            break;
                        };
                        src[p].write(e * SIZE, &content(m, SIZE)).unwrap();
                        ring_free[p][e] = false;
                        staged[p] = Some(e);
                        e
                    }
                };
                let addr = src[p].addr() + (e * SIZE) as u64;
                match peers[p]
                    .s
                    .isend(now, addr, SIZE as u64, 0, &smh[p])
                    .unwrap()
                {
                    Some(q) => {
                        sq[p].push((m, q, e));
                        staged[p] = None;
                        next_send[p] += 1;
                    }
                    None => break,
                }
                if p == 0 {
                    strike(peers, m, now);
                }
            }
            let mut i = 0;
            while i < rq[p].len() {
                let (m, q, k) = rq[p][i];
                if let Some(sz) = peers[p].r.test(now, q).unwrap() {
                    assert_eq!(sz.as_slice(), &[SIZE as u64], "{label}: message {m}");
                    assert!(
                        pool.read(k * SIZE, SIZE).unwrap() == content(m, SIZE),
                        "{label}: message {m} (peer {p}) in pool buffer {k} is not the sender's"
                    );
                    received[m] += 1;
                    last[k] = Some(m);
                    slot_free[k] = true;
                    rq[p].remove(i);
                } else {
                    i += 1;
                }
            }
            let mut i = 0;
            while i < sq[p].len() {
                let (m, q, e) = sq[p][i];
                if peers[p].s.test(now, q).unwrap().is_some() {
                    sent[m] += 1;
                    ring_free[p][e] = true;
                    sq[p].remove(i);
                } else {
                    i += 1;
                }
            }
            // A sender still waits once every receive of its peer completed (the fence's answer
            // is due: a piece landed with its acknowledgement lost): NCCL's next operation on
            // the connection calls the receiver; so does this receive, which never completes.
            let all_in = msgs[p].iter().all(|&m| received[m] > 0);
            if all_in && !sq[p].is_empty() && next_op[p].is_none() {
                let b = RecvBuf {
                    addr: spare[p].addr(),
                    size: SIZE as u64,
                    tag: 0,
                    mh: &spare_mh[p],
                };
                next_op[p] = peers[p].r.irecv(now, &[b]).unwrap();
            }
            if let Some(q) = next_op[p] {
                assert!(peers[p].r.test(now, q).unwrap().is_none());
            }
        }
        std::thread::yield_now();
    }
    // Whatever was still on its way has had time to land.
    std::thread::sleep(Duration::from_millis(100));
    for (k, m) in last.iter().enumerate() {
        if let Some(m) = *m {
            assert!(
                pool.read(k * SIZE, SIZE).unwrap() == content(m, SIZE),
                "{label}: pool buffer {k} changed after its receive of message {m} completed"
            );
        }
    }
    for ((g, (s, r)), x) in peers.iter_mut().zip(smh.into_iter().zip(rmh)).zip(spare_mh) {
        g.s.dereg_mr(s).unwrap();
        g.r.dereg_mr(r).unwrap();
        g.r.dereg_mr(x).unwrap();
    }
}
