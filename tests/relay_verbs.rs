//! Relay paths over verbs on the in-process fabric: A's and B's connection ends run
//! `relay::staged::Staged` over one queue pair each, connected to the relay K's two queue pairs,
//! and K's `relay::forward::Forwarder` moves each write through its staging rings. The real comm
//! protocol runs on top: verified data of every size around the slot size (split writes, a
//! ring that wraps, writes waiting for credits), with queue pairs executing in a random
//! interleaving; a relay that holds writes and dies: no send completes whose bytes are not in
//! B's memory; a relay or a client that lies: the leg ends, naming why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use switchless::error::Result;
use switchless::sys::Lent;
use switchless::transport::comm::{
    ProtocolConfig, RecvBuf, RecvComm, Request, SendComm, connect_pair,
};
use switchless::transport::fabric::{Fabric, LocalSeg, MemKind, RemoteSeg, WriteWr};
use switchless::transport::memfab::{EpId, MemEndpoint, MemFab, MemFabConfig};
use switchless::transport::relay::forward::{Forwarder, StagingMem};
use switchless::transport::relay::staged::{Staged, StagedLink};
use switchless::transport::relay::staging::{DESC_LEN, Descriptor};
use switchless::transport::stripe::StripeParams;

/// A staging ring in the in-process fabric's memory.
struct MemRing {
    fab: MemFab,
    addr: u64,
    len: usize,
}

impl StagingMem for MemRing {
    fn lent(&self) -> Lent {
        Lent::simulated(self.addr, self.len)
    }
    fn read_desc(&self, offset: usize) -> Result<[u8; DESC_LEN]> {
        let v = self.fab.read(self.addr + offset as u64, DESC_LEN)?;
        let mut d = [0u8; DESC_LEN];
        d.copy_from_slice(&v);
        Ok(d)
    }
}

type End = Staged<MemEndpoint>;

struct Rig {
    fab: MemFab,
    s: SendComm<End>,
    r: RecvComm<End>,
    k: Forwarder<MemEndpoint, MemRing>,
    /// A's end and K's end of the A-K link; K's end and B's end of the K-B link.
    ids: [EpId; 4],
    /// A's credit word (for the test that plays a lying relay).
    a_credit: RemoteSeg,
    now: Instant,
}

const SLOTS: u32 = 8;
const SLOT_BYTES: usize = 64 << 10;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn pcfg() -> ProtocolConfig {
    ProtocolConfig {
        stripe: StripeParams {
            min_chunk: 4096,
            align: 128,
        },
        request_timeout: Some(Duration::from_secs(5)),
        ..ProtocolConfig::default()
    }
}

/// A - K - B, one staged path; `seed` runs queue pairs in a random interleaving.
fn rig(seed: Option<u64>) -> Rig {
    let fab = MemFab::new(MemFabConfig {
        reorder_seed: seed,
        ..MemFabConfig::default()
    });
    let (a, ka) = fab.pair(&[100_000], 0);
    let (kb, b) = fab.pair(&[100_000], 0);
    let ids = [a.id(), ka.id(), kb.id(), b.id()];
    let (mut a, mut b) = (Staged::new(a), Staged::new(b));
    let ea = a.stage(0, SLOTS).unwrap();
    let eb = b.stage(0, SLOTS).unwrap();
    let bytes = SLOTS as usize * SLOT_BYTES;
    let ring = |fab: &MemFab| MemRing {
        fab: fab.clone(),
        addr: fab.alloc(bytes).unwrap(),
        len: bytes,
    };
    let mut k = Forwarder::new(
        [ka, kb],
        [0, 0],
        [ring(&fab), ring(&fab)],
        SLOTS,
        SLOT_BYTES,
        ea.credit,
    )
    .unwrap();
    k.peer(eb.credit).unwrap();
    let link = |ring, peer_lengths| StagedLink {
        ring,
        slots: SLOTS,
        slot_bytes: SLOT_BYTES,
        peer_lengths,
    };
    a.attach(0, link(k.ring(0).unwrap(), eb.lengths)).unwrap();
    b.attach(0, link(k.ring(1).unwrap(), ea.lengths)).unwrap();
    let (s, r) = connect_pair(a, b, pcfg()).unwrap();
    Rig {
        fab,
        s,
        r,
        k,
        ids,
        a_credit: ea.credit,
        now: Instant::now(),
    }
}

/// What a run did: per message, whether its send completed and whether its receive did; the
/// first errors of each side and of the relay.
#[derive(Debug, Default)]
struct Outcome {
    sent_ok: Vec<bool>,
    received: Vec<u32>,
    send_err: Option<String>,
    recv_err: Option<String>,
    relay_err: Option<String>,
    steps: usize,
}

/// Streams `sizes`, `window` in flight, 1 ms of virtual time per step; `at_step` runs first in
/// each step and says whether K polls in it. Stops when every message is through, or when both
/// sides have failed.
fn stream(
    g: &mut Rig,
    sizes: &[usize],
    window: usize,
    mut at_step: impl FnMut(&mut Rig, usize) -> bool,
) -> (Outcome, u64, Vec<usize>) {
    let total: usize = sizes.iter().sum::<usize>().max(1);
    let max = sizes.iter().copied().max().unwrap_or(0).max(1);
    let src = g.fab.alloc(max).unwrap();
    g.fab.write(src, &pattern(max, 5)).unwrap();
    let dst = g.fab.alloc(total).unwrap();
    let smh =
        g.s.reg_mr(&Lent::simulated(src, max), MemKind::Host)
            .unwrap();
    let rmh =
        g.r.reg_mr(&Lent::simulated(dst, total), MemKind::Host)
            .unwrap();
    let mut offs = Vec::new();
    let mut o = 0;
    for &sz in sizes {
        offs.push(o);
        o += sz;
    }
    let n = sizes.len();
    let mut out = Outcome {
        sent_ok: vec![false; n],
        received: vec![0; n],
        ..Outcome::default()
    };
    let (mut rnext, mut snext) = (0, 0);
    let mut rq: Vec<(usize, Request)> = Vec::new();
    let mut sq: Vec<(usize, Request)> = Vec::new();
    for step in 0..60_000 {
        out.steps = step;
        let relay_polls = at_step(g, step);
        let now = g.now;
        if out.recv_err.is_none() {
            while rnext < n && rq.len() < window {
                let b = RecvBuf {
                    addr: dst + offs[rnext] as u64,
                    size: sizes[rnext] as u64,
                    tag: 0,
                    mh: &rmh,
                };
                match g.r.irecv(now, &[b]) {
                    Ok(Some(q)) => {
                        rq.push((rnext, q));
                        rnext += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        out.recv_err.get_or_insert(e.to_string());
                        break;
                    }
                }
            }
        }
        if out.send_err.is_none() {
            while snext < n && sq.len() < window {
                match g.s.isend(now, src, sizes[snext] as u64, 0, &smh) {
                    Ok(Some(q)) => {
                        sq.push((snext, q));
                        snext += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        out.send_err.get_or_insert(e.to_string());
                        break;
                    }
                }
            }
        }
        let mut k = 0;
        while out.recv_err.is_none() && k < rq.len() {
            match g.r.test(now, rq[k].1) {
                Ok(Some(sz)) => {
                    let m = rq[k].0;
                    assert_eq!(sz.as_slice(), &[sizes[m] as u64], "message {m}");
                    out.received[m] += 1;
                    rq.remove(k);
                }
                Ok(None) => k += 1,
                Err(e) => {
                    out.recv_err = Some(e.to_string());
                }
            }
        }
        let mut k = 0;
        while out.send_err.is_none() && k < sq.len() {
            match g.s.test(now, sq[k].1) {
                Ok(Some(sz)) => {
                    assert_eq!(sz, sizes[sq[k].0] as u64);
                    out.sent_ok[sq[k].0] = true;
                    sq.remove(k);
                }
                Ok(None) => k += 1,
                Err(e) => {
                    out.send_err = Some(e.to_string());
                }
            }
        }
        if relay_polls && out.relay_err.is_none() {
            if let Err(e) = g.k.poll() {
                out.relay_err = Some(e.to_string());
            }
        }
        let all = out.sent_ok.iter().all(|&x| x) && out.received.iter().all(|&c| c == 1);
        if all || (out.send_err.is_some() && out.recv_err.is_some()) {
            break;
        }
        g.fab.step();
        g.now += Duration::from_millis(1);
    }
    (out, dst, offs)
}

/// Every message whose send completed has all its bytes in B's memory; none arrived twice.
fn check_landed(g: &Rig, sizes: &[usize], out: &Outcome, dst: u64, offs: &[usize]) {
    let max = sizes.iter().copied().max().unwrap_or(0);
    let data = pattern(max, 5);
    for (m, &sz) in sizes.iter().enumerate() {
        assert!(out.received[m] <= 1, "message {m} received twice");
        if out.sent_ok[m] || out.received[m] == 1 {
            let got = g.fab.read(dst + offs[m] as u64, sz).unwrap();
            assert!(
                got == data[..sz],
                "message {m} of {sz} bytes: its send or receive completed, its bytes are not all \
                 in B's memory ({out:?})"
            );
        }
    }
}

fn sizes() -> Vec<usize> {
    let p = SLOT_BYTES - DESC_LEN;
    vec![
        0,
        1,
        100,
        4095,
        p - 1,
        p,
        p + 1,
        2 * p + 7,
        1 << 20,
        (4 << 20) + 3,
        64 << 10,
        8,
        3 * p,
        (2 << 20) - 1,
    ]
}

#[test]
fn a_relay_path_over_verbs_carries_verified_data_of_every_size_through_the_staging_rings() {
    for seed in [None, Some(1), Some(0x5eed), Some(77)] {
        let mut g = rig(seed);
        let sizes = sizes();
        let (out, dst, offs) = stream(&mut g, &sizes, 4, |_, _| true);
        assert!(
            out.sent_ok.iter().all(|&x| x) && out.received.iter().all(|&c| c == 1),
            "seed {seed:?}: {out:?}"
        );
        check_landed(&g, &sizes, &out, dst, &offs);
        // Both directions crossed K: A's data one way, B's clear-to-send entries the other.
        let (ab, ba) = (g.k.stats(0), g.k.stats(1));
        let payload: u64 = sizes.iter().map(|&s| s as u64).sum();
        assert!(
            ab.bytes >= payload,
            "seed {seed:?}: {ab:?} for {payload} bytes"
        );
        // A write larger than a slot crossed as several; every forward was credited.
        assert!(ab.forwarded > sizes.len() as u64, "{ab:?}");
        assert!(ba.forwarded > 0 && ba.credits > 0, "{ba:?}");
        assert_eq!(g.k.ended(), None);
        g.s.close().unwrap();
        g.r.close().unwrap();
    }
}

#[test]
fn a_relay_that_holds_writes_and_dies_completes_no_send_whose_bytes_are_not_at_b() {
    for kill_at in [2usize, 8, 20, 35] {
        let mut g = rig(Some(kill_at as u64));
        let sizes: Vec<usize> = (0..24).map(|i| (i * 97_531) % (3 << 20) + 1).collect();
        let (a_k, k_b) = (g.ids[0], g.ids[3]);
        // K stops forwarding at `kill_at` (it holds what A wrote into staging), then dies 50
        // steps later: both its cables go.
        let (out, dst, offs) = stream(&mut g, &sizes, 4, |g, step| {
            if step == kill_at + 50 {
                g.fab.kill_path(a_k, 0);
                g.fab.kill_path(k_b, 0);
            }
            step < kill_at
        });
        check_landed(&g, &sizes, &out, dst, &offs);
        let done = out.sent_ok.iter().filter(|&&x| x).count();
        assert!(
            done < sizes.len(),
            "kill at {kill_at}: every send completed though K died holding writes: {out:?}"
        );
        assert!(
            out.send_err.is_some() && out.recv_err.is_some(),
            "kill at {kill_at}: both sides fail (the only path is gone), within the bound: {out:?}"
        );
        assert!(out.steps < 20_000, "kill at {kill_at}: {out:?}");
    }
}

#[test]
fn a_relay_that_credits_writes_never_sent_fails_the_path_naming_it() {
    let mut g = rig(None);
    let sizes = vec![200_000; 6];
    let a_credit = g.a_credit;
    let (out, dst, offs) = stream(&mut g, &sizes, 2, |g, step| {
        if step == 2 {
            // A lying relay: a credit far above what A sent.
            g.fab.write(a_credit.addr, &1000u64.to_ne_bytes()).unwrap();
        }
        step >= 2
    });
    check_landed(&g, &sizes, &out, dst, &offs);
    let e = out.send_err.clone().unwrap_or_default();
    assert!(e.contains("credited 1000 writes"), "{out:?}");
}

/// K's forwarder between two bare endpoints (no comm): A's raw end, B's raw end, and B's
/// registered buffer.
struct Bare {
    fab: MemFab,
    a: MemEndpoint,
    k: Forwarder<MemEndpoint, MemRing>,
    ring_a: RemoteSeg,
    /// A source buffer registered on A's end.
    src: (u64, u32),
    /// B's registered buffer: address, length, key.
    b_buf: (u64, usize, u32),
    _b: MemEndpoint,
}

fn bare() -> Bare {
    let fab = MemFab::new(MemFabConfig::default());
    let (mut a, ka) = fab.pair(&[100_000], 0);
    let (kb, mut b) = fab.pair(&[100_000], 0);
    let credit = a.alloc_ctrl(1).unwrap();
    let a_credit = RemoteSeg {
        addr: credit.addr,
        rkey: credit.reg.keys[0].rkey,
    };
    let bytes = SLOTS as usize * SLOT_BYTES;
    let ring = || MemRing {
        fab: fab.clone(),
        addr: fab.alloc(bytes).unwrap(),
        len: bytes,
    };
    let k = Forwarder::new(
        [ka, kb],
        [0, 0],
        [ring(), ring()],
        SLOTS,
        SLOT_BYTES,
        a_credit,
    )
    .unwrap();
    let src = fab.alloc(4096).unwrap();
    fab.write(src, &pattern(4096, 9)).unwrap();
    let sreg = a
        .register(&Lent::simulated(src, 4096), MemKind::Host)
        .unwrap();
    let dst = fab.alloc(8192).unwrap();
    // B registers only the first 4 KiB of its 8 KiB.
    let breg = b
        .register(&Lent::simulated(dst, 4096), MemKind::Host)
        .unwrap();
    for _ in 0..4 {
        b.post_recv(0, 7).unwrap();
    }
    Bare {
        ring_a: k.ring(0).unwrap(),
        fab,
        a,
        k,
        src: (src, sreg.keys[0].lkey),
        b_buf: (dst, 4096, breg.keys[0].rkey),
        _b: b,
    }
}

impl Bare {
    /// A's write into staging slot `seq` (descriptor `desc`, then `len` payload bytes with
    /// immediate `imm`), as a client that skips its staged end would post it.
    fn post(&mut self, seq: u64, desc: Descriptor, len: u32, imm: u32) {
        let slot = self.ring_a.addr + (seq % u64::from(SLOTS)) * SLOT_BYTES as u64;
        let d = self.fab.alloc(DESC_LEN).unwrap();
        self.fab.write(d, &desc.to_bytes()).unwrap();
        let dreg = self
            .a
            .register(&Lent::simulated(d, DESC_LEN), MemKind::Host)
            .unwrap();
        let wr = |local, remote, imm| WriteWr {
            wr_id: 1,
            local,
            remote,
            imm,
            signaled: true,
            inline: false,
        };
        let wrs = [
            wr(
                LocalSeg {
                    addr: d,
                    len: DESC_LEN as u32,
                    lkey: dreg.keys[0].lkey,
                },
                RemoteSeg {
                    addr: slot,
                    rkey: self.ring_a.rkey,
                },
                None,
            ),
            wr(
                LocalSeg {
                    addr: self.src.0,
                    len,
                    lkey: self.src.1,
                },
                RemoteSeg {
                    addr: slot + DESC_LEN as u64,
                    rkey: self.ring_a.rkey,
                },
                Some(imm),
            ),
        ];
        self.a.post_writes(0, &wrs).unwrap();
    }

    fn to_b(&self, off: u64, len: u32) -> Descriptor {
        Descriptor {
            len,
            addr: self.b_buf.0 + off,
            rkey: self.b_buf.2,
            imm: Some(42),
        }
    }

    fn a_statuses(&mut self) -> Vec<String> {
        let mut got = Vec::new();
        self.a.poll(0, 64, &mut got).unwrap();
        got.iter().map(|c| c.status.to_string()).collect()
    }
}

#[test]
fn a_client_that_writes_out_of_order_or_outside_bs_buffer_ends_the_leg_and_lands_nothing() {
    // A healthy write first: forwarded into B's buffer, credited.
    let mut t = bare();
    t.post(0, t.to_b(0, 1000), 1000, 0);
    t.k.poll().unwrap();
    t.k.poll().unwrap();
    assert_eq!(t.fab.read(t.b_buf.0, 1000).unwrap(), pattern(1000, 9));
    assert_eq!(t.k.stats(0).forwarded, 1);
    // A replay of sequence 0: out of order.
    t.post(0, t.to_b(0, 1000), 1000, 0);
    let e = t.k.poll().unwrap_err().to_string();
    assert!(e.contains("out of order"), "{e}");
    assert!(t.k.ended().is_some_and(|w| w.contains("out of order")));
    // The leg is over: K's queue pairs are in the error state, A's next write fails.
    t.a_statuses();
    t.post(1, t.to_b(0, 8), 8, 1);
    assert!(
        t.a_statuses().iter().any(|s| s.contains("retry")),
        "A's write after the end"
    );
    assert!(t.k.poll().is_err(), "an ended leg stays ended");

    // A descriptor naming bytes past B's registration: B's NIC refuses the forward, the leg
    // ends naming it, and nothing lands outside B's registered buffer.
    let mut t = bare();
    t.fab.write(t.b_buf.0 + 4096, &[0xee; 4096]).unwrap();
    t.post(0, t.to_b(4000, 1000), 1000, 0);
    let mut err = None;
    for _ in 0..4 {
        if let Err(e) = t.k.poll() {
            err = Some(e.to_string());
            break;
        }
    }
    let e = err.expect("the forward past B's registration fails");
    assert!(
        e.contains("forwarded write") && e.contains("remote access error"),
        "{e}"
    );
    assert_eq!(
        t.fab.read(t.b_buf.0 + 4096, 4096).unwrap(),
        vec![0xee; 4096]
    );
    assert_eq!(t.fab.read(t.b_buf.0 + 4000, 96).unwrap(), vec![0; 96]);

    // A length that is not its descriptor's.
    let mut t = bare();
    t.post(0, t.to_b(0, 999), 1000, 0);
    let e = t.k.poll().unwrap_err().to_string();
    assert!(e.contains("its descriptor says 999"), "{e}");
}
