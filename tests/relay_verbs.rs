//! Relay paths over verbs on the in-process fabric: A's and B's connection ends run
//! `relay::staged::Staged` over one queue pair each, connected to the relay K's two queue pairs,
//! and K's `relay::forward::Forwarder` moves each write through its staging rings. The real comm
//! protocol runs on top: verified data of every size around the slot size (split writes, a
//! ring that wraps, writes waiting for credits), with queue pairs executing in a random
//! interleaving; a relay that holds writes and dies: no send completes whose bytes are not in
//! B's memory; a relay or a client that lies: the leg ends, naming why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use switchless::error::{Error, Result};
use switchless::sys::Lent;
use switchless::transport::comm::{
    ProtocolConfig, RecvBuf, RecvComm, Request, SendComm, connect_pair,
};
use switchless::transport::fabric::{
    Completion, CtrlMem, Fabric, LocalSeg, MemKind, PathInfo, ReadWr, Registration, RemoteSeg,
    Revive, WriteWr,
};
use switchless::transport::memfab::{EpId, InFlight, MemEndpoint, MemFab, MemFabConfig};
use switchless::transport::relay::forward::{Forwarder, StagingMem};
use switchless::transport::relay::staged::{Staged, StagedEnd, StagedLink};
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
    /// K's forwarder, unless a test handed it to a pump.
    k: Option<Forwarder<MemEndpoint, MemRing>>,
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

/// Puts K between A's and B's path `path`: stages it at both ends, builds K's forwarder over its
/// ends `k` ([to A, to B]) with two rings of `SLOTS` x `SLOT_BYTES` in `fab`, and attaches both
/// ends; returns K and A's end.
fn relay_between<X: Fabric, Y: Fabric>(
    fab: &MemFab,
    a: &mut Staged<X>,
    b: &mut Staged<Y>,
    path: usize,
    k: [MemEndpoint; 2],
) -> (Forwarder<MemEndpoint, MemRing>, StagedEnd) {
    let ea = a.stage(path, SLOTS).unwrap();
    let eb = b.stage(path, SLOTS).unwrap();
    let bytes = SLOTS as usize * SLOT_BYTES;
    let ring = || MemRing {
        fab: fab.clone(),
        addr: fab.alloc(bytes).unwrap(),
        len: bytes,
    };
    let mut k = Forwarder::new(k, [0, 0], [ring(), ring()], SLOTS, SLOT_BYTES, ea.credit).unwrap();
    k.peer(eb.credit).unwrap();
    let link = |ring, peer_lengths| StagedLink {
        ring,
        slots: SLOTS,
        slot_bytes: SLOT_BYTES,
        peer_lengths,
    };
    a.attach(path, link(k.ring(0).unwrap(), eb.lengths))
        .unwrap();
    b.attach(path, link(k.ring(1).unwrap(), ea.lengths))
        .unwrap();
    (k, ea)
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
    let (k, ea) = relay_between(&fab, &mut a, &mut b, 0, [ka, kb]);
    let (s, r) = connect_pair(a, b, pcfg()).unwrap();
    Rig {
        fab,
        s,
        r,
        k: Some(k),
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

/// Streams `sizes`, `window` in flight, 1 ms of virtual time per step (and of real time at
/// least, when K runs on a thread of its own); `at_step` runs first in each step and says
/// whether K polls in it. Stops when every message is through, or when both
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
            if let Some(Err(e)) = g.k.as_mut().map(|k| k.poll()) {
                out.relay_err = Some(e.to_string());
            }
        }
        let all = out.sent_ok.iter().all(|&x| x) && out.received.iter().all(|&c| c == 1);
        if all || (out.send_err.is_some() && out.recv_err.is_some()) {
            break;
        }
        g.fab.step();
        if g.k.is_none() {
            // K runs on a thread of its own (a pump, a relay service): the virtual clock must
            // not outrun it, or a loaded host's scheduler would look like a dead relay to the
            // request timeout.
            std::thread::sleep(Duration::from_millis(1));
        }
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
        let k = g.k.as_ref().unwrap();
        let (ab, ba) = (k.stats(0), k.stats(1));
        let payload: u64 = sizes.iter().map(|&s| s as u64).sum();
        assert!(
            ab.bytes >= payload,
            "seed {seed:?}: {ab:?} for {payload} bytes"
        );
        // A write larger than a slot crossed as several; every forward was credited.
        assert!(ab.forwarded > sizes.len() as u64, "{ab:?}");
        assert!(ba.forwarded > 0 && ba.credits > 0, "{ba:?}");
        assert_eq!(k.ended(), None);
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

/// One connection end whose paths come from several in-process endpoints (a direct path to B and
/// a path to K, as a verbs connection's queue pairs would): path `i` is path `map[i].1` of
/// endpoint `map[i].0`. Registrations are made on every endpoint and their keys picked per path;
/// control memory lives on endpoint 0 and is registered on the others.
struct Joined {
    parts: Vec<MemEndpoint>,
    map: Vec<(usize, usize)>,
    infos: Vec<PathInfo>,
    regs: HashMap<u64, Vec<Registration>>,
    next: u64,
}

impl Joined {
    fn new(parts: Vec<MemEndpoint>) -> Joined {
        let mut map = Vec::new();
        let mut infos = Vec::new();
        for (j, p) in parts.iter().enumerate() {
            for (k, info) in p.paths().iter().enumerate() {
                map.push((j, k));
                infos.push(info.clone());
            }
        }
        Joined {
            parts,
            map,
            infos,
            regs: HashMap::new(),
            next: 1,
        }
    }

    fn at(&mut self, path: usize) -> Result<(&mut MemEndpoint, usize)> {
        let &(j, k) = self
            .map
            .get(path)
            .ok_or_else(|| Error::InvalidArgument(format!("path {path}")))?;
        Ok((&mut self.parts[j], k))
    }

    fn combine(&mut self, regs: Vec<Registration>) -> Registration {
        let keys = self.map.iter().map(|&(j, k)| regs[j].keys[k]).collect();
        let token = self.next;
        self.next += 1;
        self.regs.insert(token, regs);
        Registration::new(keys, token)
    }
}

impl Fabric for Joined {
    fn paths(&self) -> &[PathInfo] {
        &self.infos
    }
    fn register(&mut self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        let regs = self
            .parts
            .iter_mut()
            .map(|p| p.register(mem, kind))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.combine(regs))
    }
    fn deregister(&mut self, reg: &Registration) -> Result<()> {
        let regs = self
            .regs
            .remove(&reg.token)
            .ok_or_else(|| Error::InvalidArgument("unknown registration".into()))?;
        for (p, r) in self.parts.iter_mut().zip(&regs) {
            p.deregister(r)?;
        }
        Ok(())
    }
    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem> {
        let c = self.parts[0].alloc_ctrl(words)?;
        let mut regs = vec![c.reg.clone()];
        for p in &mut self.parts[1..] {
            regs.push(p.register(&Lent::simulated(c.addr, words * 8), MemKind::Host)?);
        }
        let reg = self.combine(regs);
        self.regs.get_mut(&reg.token).unwrap()[0] = c.reg.clone();
        Ok(CtrlMem {
            addr: c.addr,
            words,
            reg,
        })
    }
    fn free_ctrl(&mut self, mem: &CtrlMem) -> Result<()> {
        let regs = self.regs.remove(&mem.reg.token).unwrap_or_default();
        for (p, r) in self.parts.iter_mut().zip(&regs).skip(1) {
            p.deregister(r)?;
        }
        let first = CtrlMem {
            reg: regs.first().cloned().unwrap_or_else(|| mem.reg.clone()),
            ..mem.clone()
        };
        self.parts[0].free_ctrl(&first)
    }
    fn ctrl_load(&self, addr: u64, order: Ordering) -> Result<u64> {
        self.parts[0].ctrl_load(addr, order)
    }
    fn ctrl_store(&self, addr: u64, value: u64, order: Ordering) -> Result<()> {
        self.parts[0].ctrl_store(addr, value, order)
    }
    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        let (p, k) = self.at(path)?;
        p.post_write(k, wr)
    }
    fn post_read(&mut self, path: usize, wr: &ReadWr) -> Result<()> {
        let (p, k) = self.at(path)?;
        p.post_read(k, wr)
    }
    fn path_device(&self, path: usize) -> usize {
        self.map.get(path).map_or(0, |m| m.0)
    }
    fn post_recv(&mut self, path: usize, wr_id: u64) -> Result<()> {
        let (p, k) = self.at(path)?;
        p.post_recv(k, wr_id)
    }
    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let (p, k) = self.at(path)?;
        p.poll(k, max, out)
    }
    fn shutdown(&mut self) -> Result<()> {
        for p in &mut self.parts {
            p.shutdown()?;
        }
        Ok(())
    }
    fn health(&mut self) -> Result<()> {
        for p in &mut self.parts {
            p.health()?;
        }
        Ok(())
    }
    fn path_health(&mut self, path: usize) -> Result<()> {
        let (p, k) = self.at(path)?;
        p.path_health(k)
    }
    fn stop_path(&mut self, path: usize) -> Result<()> {
        let (p, k) = self.at(path)?;
        p.stop_path(k)
    }
    fn seal_path(&mut self, path: usize) -> Result<bool> {
        let (p, k) = self.at(path)?;
        p.seal_path(k)
    }
    fn revive_path(&mut self, path: usize) -> Result<Revive> {
        let (p, k) = self.at(path)?;
        p.revive_path(k)
    }
}

/// A - B with a direct path (0) and a relay path through K (1).
struct Mixed {
    fab: MemFab,
    s: SendComm<Staged<Joined>>,
    r: RecvComm<Staged<Joined>>,
    k: Forwarder<MemEndpoint, MemRing>,
    /// A's end of the A-K link and B's end of the K-B link.
    a_k: EpId,
    k_b: EpId,
    now: Instant,
}

fn mixed(seed: Option<u64>) -> Mixed {
    let fab = MemFab::new(MemFabConfig {
        reorder_seed: seed,
        ..MemFabConfig::default()
    });
    let (a1, b1) = fab.pair(&[100_000], 0);
    let (a2, ka) = fab.pair(&[100_000], 0);
    let (kb, b2) = fab.pair(&[100_000], 0);
    let (a_k, k_b) = (a2.id(), b2.id());
    let mut a = Staged::new(Joined::new(vec![a1, a2]));
    let mut b = Staged::new(Joined::new(vec![b1, b2]));
    let (k, _) = relay_between(&fab, &mut a, &mut b, 1, [ka, kb]);
    let (s, r) = connect_pair(a, b, pcfg()).unwrap();
    Mixed {
        fab,
        s,
        r,
        k,
        a_k,
        k_b,
        now: Instant::now(),
    }
}

/// Streams `n` messages of `size` bytes through a receive pool of `pool` buffers reused in turn
/// (as NCCL reuses its buffers), guarding each completed receive's buffer until it is posted
/// again: a late write into it is a violation. K polls when `relay(step)` says so.
fn stream_reused(
    g: &mut Mixed,
    n: usize,
    size: usize,
    pool: usize,
    mut relay: impl FnMut(&mut Mixed, usize) -> bool,
) -> (Vec<u32>, usize) {
    let src = g.fab.alloc(n * size).unwrap();
    for m in 0..n {
        g.fab
            .write(src + (m * size) as u64, &pattern(size, m as u8))
            .unwrap();
    }
    let dst = g.fab.alloc(pool * size).unwrap();
    let smh =
        g.s.reg_mr(&Lent::simulated(src, n * size), MemKind::Host)
            .unwrap();
    let rmh =
        g.r.reg_mr(&Lent::simulated(dst, pool * size), MemKind::Host)
            .unwrap();
    let mut received = vec![0u32; n];
    let (mut rnext, mut snext, mut sent) = (0, 0, 0);
    let mut rq: Vec<(usize, Request, usize)> = Vec::new();
    let mut sq: Vec<Request> = Vec::new();
    let mut free = vec![true; pool];
    let mut steps = 0;
    for step in 0..40_000 {
        steps = step;
        let polls = relay(g, step);
        let now = g.now;
        while rnext < n {
            // Into a buffer whose last receive completed, as NCCL posts it again.
            let Some(k) = free.iter().position(|&f| f) else {
                break;
            };
            let at = dst + (k * size) as u64;
            g.fab.unguard(at);
            let b = RecvBuf {
                addr: at,
                size: size as u64,
                tag: 0,
                mh: &rmh,
            };
            let Some(q) = g.r.irecv(now, &[b]).unwrap() else {
                break;
            };
            free[k] = false;
            rq.push((rnext, q, k));
            rnext += 1;
        }
        while snext < n && sq.len() < 4 {
            let at = src + (snext * size) as u64;
            let Some(q) = g.s.isend(now, at, size as u64, 0, &smh).unwrap() else {
                break;
            };
            sq.push(q);
            snext += 1;
        }
        let mut i = 0;
        while i < rq.len() {
            if let Some(sz) = g.r.test(now, rq[i].1).unwrap() {
                let (m, _, k) = rq[i];
                assert_eq!(sz.as_slice(), &[size as u64], "message {m}");
                let at = dst + (k * size) as u64;
                assert!(
                    g.fab.read(at, size).unwrap() == pattern(size, m as u8),
                    "message {m}"
                );
                g.fab.guard(
                    at,
                    size,
                    &format!("buffer of message {m} (done at step {step})"),
                );
                free[k] = true;
                received[m] += 1;
                rq.remove(i);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < sq.len() {
            if g.s.test(now, sq[i]).unwrap().is_some() {
                sq.remove(i);
                sent += 1;
            } else {
                i += 1;
            }
        }
        if polls {
            // K's errors end its leg; the comms see the path fail.
            let _ = g.k.poll();
        }
        if sent == n && received.iter().all(|&c| c == 1) {
            break;
        }
        g.fab.step();
        g.now += Duration::from_millis(1);
    }
    (received, steps)
}

/// How the relay goes, at step `kill`.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// K dies: both its cables.
    Both,
    /// Its cable to A only (K still reaches B).
    ASide,
    /// Its cable to B only.
    BSide,
    /// Its cable to A, while the writes K is forwarding to B are held on the wire and land
    /// after this many more work requests, unless B's end is sealed first.
    AWithLateForwards(u64),
}

#[test]
fn a_relay_path_next_to_a_direct_one_fails_over_when_its_relay_dies_and_each_message_lands_once() {
    // With `hold`, K stopped forwarding `hold` steps before the cut, so it dies holding writes A
    // made into its staging ring, which only the direct path can deliver now. 3 receive buffers
    // reused in turn: a copy landing twice, or late into a reused buffer, is a guard violation.
    let mut late = (0, 0);
    for seed in [None, Some(3), Some(11)] {
        for (kill, hold) in [(2usize, 0usize), (6, 0), (15, 5), (45, 25)] {
            for cut in [
                Cut::Both,
                Cut::ASide,
                Cut::BSide,
                Cut::AWithLateForwards(1),
                Cut::AWithLateForwards(40),
            ] {
                let mut g = mixed(seed);
                let (a_k, k_b) = (g.a_k, g.k_b);
                let kb = EpId(k_b.0 - 1); // K's end of the K-B link
                let (received, steps) = stream_reused(&mut g, 40, 300_000, 3, |g, step| {
                    if step == kill {
                        match cut {
                            Cut::Both => {
                                g.fab.kill_path(a_k, 0);
                                g.fab.kill_path(k_b, 0);
                            }
                            Cut::ASide => g.fab.kill_path(a_k, 0),
                            Cut::BSide => g.fab.kill_path(k_b, 0),
                            Cut::AWithLateForwards(ops) => {
                                g.fab.kill_path(a_k, 0);
                                g.fab.fault_after(kb, 0, 0, false, InFlight::Delay { ops });
                            }
                        }
                    }
                    step + hold < kill || step > kill
                });
                let case = format!("seed {seed:?}, {cut:?} at step {kill}, holding for {hold}");
                assert!(received.iter().all(|&c| c == 1), "{case}: {received:?}");
                assert!(
                    g.fab.violations().is_empty(),
                    "{case}: {:?}",
                    g.fab.violations()
                );
                assert_eq!(g.s.paths_up(), vec![true, false], "{case}");
                assert_eq!(g.r.paths_up(), vec![true, false], "{case}");
                assert!(steps < 10_000, "{case}: {steps} steps");
                assert!(
                    g.k.stats(0).forwarded > 0,
                    "{case}: the relay path carried data"
                );
                assert!(g.k.ended().is_some(), "{case}: the leg ended");
                let st = g.fab.stats();
                late.0 += st.late_landed;
                late.1 += st.late_dropped;
                g.s.close().unwrap();
                g.r.close().unwrap();
            }
        }
    }
    // Forwards held on the wire met B's end both ways: landed before its seal (counted, not
    // sent again), and dropped after it.
    assert!(
        late.0 > 0 && late.1 > 0,
        "late forwards landed / dropped: {late:?}"
    );
}

#[test]
fn the_relays_forwarding_thread_carries_a_leg_closes_it_on_demand_and_reports_one_that_failed() {
    use switchless::transport::relay::pump::Pump;
    // A leg on the pump's thread: the comms here, K there.
    let mut g = rig(Some(9));
    let pump = Pump::start("swl-test-pump", 2).unwrap();
    pump.add(7, Box::new(g.k.take().unwrap())).unwrap();
    let sizes = sizes();
    let (out, dst, offs) = stream(&mut g, &sizes, 4, |_, _| false);
    assert!(
        out.sent_ok.iter().all(|&x| x) && out.received.iter().all(|&c| c == 1),
        "{out:?}"
    );
    check_landed(&g, &sizes, &out, dst, &offs);
    assert!(pump.moved() > sizes.len() as u64);
    assert_eq!(pump.legs(), 1);
    // The client went away: the service closes the leg; both ends' next messages fail.
    pump.close(7, "the client closed the door's connection")
        .unwrap();
    let (out, ..) = stream(&mut g, &[100_000], 1, |_, _| false);
    assert!(out.send_err.is_some() && out.recv_err.is_some(), "{out:?}");
    assert!(
        pump.take_ended().is_empty(),
        "closed on demand, not ended on its own"
    );
    for _ in 0..500 {
        if pump.legs() == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(pump.legs(), 0);

    // A leg whose cable to B goes: it ends on its own and is reported with its reason.
    let mut g = rig(None);
    let kb = EpId(g.ids[2].0);
    pump.add(8, Box::new(g.k.take().unwrap())).unwrap();
    g.fab.kill_path(kb, 0);
    let (out, ..) = stream(&mut g, &[100_000], 1, |_, _| false);
    assert!(out.send_err.is_some(), "{out:?}");
    let mut ended = Vec::new();
    for _ in 0..500 {
        ended = pump.take_ended();
        if !ended.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0].0, 8);
    assert!(ended[0].1.contains("relay leg ended"), "{ended:?}");
    assert_eq!(pump.legs(), 0);

    // At most two legs: a third is refused, naming the bound, and closed.
    let (mut a, mut b, mut c) = (rig(None), rig(None), rig(None));
    pump.add(1, Box::new(a.k.take().unwrap())).unwrap();
    pump.add(2, Box::new(b.k.take().unwrap())).unwrap();
    let e = pump.add(3, Box::new(c.k.take().unwrap())).unwrap_err();
    assert!(e.to_string().contains("2 verbs legs already"), "{e}");
    let (out, ..) = stream(&mut c, &[1000], 1, |_, _| false);
    assert!(
        out.send_err.is_some(),
        "the refused leg was closed: {out:?}"
    );
    drop(pump); // closes the two legs and joins the thread
    let (out, ..) = stream(&mut a, &[1000], 1, |_, _| false);
    assert!(out.send_err.is_some(), "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// A verbs leg set up through a real relay service's door (127/8), K's half made by a factory
// over the in-process fabric.
// ---------------------------------------------------------------------------------------------

mod door {
    use super::*;
    use std::collections::VecDeque;
    use std::io::{Read, Write};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
    use std::sync::{Arc, Mutex};
    use switchless::transport::relay::leg_setup::{
        Geometry, Offer, Peer, QpEnd, READY_LEN, Ready, Window,
    };
    use switchless::transport::relay::pump::PumpLeg;
    use switchless::transport::relay::wire::{
        CHALLENGE_LEN, ChallengeRepr, Code, Op, RequestRepr, VERDICT_LEN, VerdictRepr,
    };
    use switchless::transport::relay::{
        Bounds, CommKey, LegFactory, PendingLeg, RelayLink, RelayService, ServiceConfig,
    };
    use switchless::transport::tcp::TcpConfig;

    /// K's halves, made ahead: each the K ends of an A-K and a K-B pair.
    pub struct MemFactory {
        pub fab: MemFab,
        pub halves: Mutex<VecDeque<(MemEndpoint, MemEndpoint)>>,
    }

    struct Pending {
        k: Forwarder<MemEndpoint, MemRing>,
        ring: Geometry,
    }

    fn end() -> QpEnd {
        QpEnd {
            qpn: 0x11,
            psn: 0,
            gid: [0; 16],
            mtu: 4096,
        }
    }

    fn win(r: RemoteSeg) -> Window {
        Window {
            addr: r.addr,
            rkey: r.rkey,
        }
    }

    impl LegFactory for MemFactory {
        fn create(
            &self,
            _from: &RelayLink,
            _to: &RelayLink,
            offer: &Offer,
            ring: Geometry,
        ) -> Result<Box<dyn PendingLeg>> {
            let (ka, kb) = self
                .halves
                .lock()
                .unwrap()
                .pop_front()
                .ok_or_else(|| Error::System("no queue pairs left".into()))?;
            let bytes = ring.bytes() as usize;
            let mem = || MemRing {
                fab: self.fab.clone(),
                addr: self.fab.alloc(bytes).unwrap(),
                len: bytes,
            };
            let credit = RemoteSeg {
                addr: offer.credit.addr,
                rkey: offer.credit.rkey,
            };
            let k = Forwarder::new(
                [ka, kb],
                [0, 0],
                [mem(), mem()],
                ring.slots,
                ring.slot_bytes as usize,
                credit,
            )?;
            Ok(Box::new(Pending { k, ring }))
        }
    }

    impl PendingLeg for Pending {
        fn ready(&self) -> Ready {
            Ready {
                k_a: end(),
                ring_a: win(self.k.ring(0).unwrap()),
                k_b: end(),
                ring_b: win(self.k.ring(1).unwrap()),
                ring: self.ring,
            }
        }
        fn finish(self: Box<Self>, peer: &Peer) -> Result<Box<dyn PumpLeg>> {
            let mut k = self.k;
            k.peer(RemoteSeg {
                addr: peer.credit.addr,
                rkey: peer.credit.rkey,
            })?;
            Ok(Box::new(k))
        }
    }

    pub const COMM: u64 = 0x5eed_0f7e_1a00;

    pub fn relay(port: u16, factory: Option<Arc<dyn LegFactory>>) -> RelayService {
        relay_with(port, factory, None)
    }

    /// [`relay`] with a link check (`netdev -> Some(why)` while down).
    pub fn relay_with(
        port: u16,
        factory: Option<Arc<dyn LegFactory>>,
        link_down: Option<switchless::transport::relay::service::LinkDown>,
    ) -> RelayService {
        let link = |a: &str| RelayLink {
            addr: a.parse().unwrap(),
            netdev: "lo".into(),
            speed_mbps: 100_000,
        };
        let cfg = ServiceConfig {
            links: vec![link("127.0.61.2/30"), link("127.0.62.1/30")],
            bounds: Bounds::default(),
            tcp: TcpConfig::default(),
            host: "k".into(),
            link_down,
            verbs: factory,
        };
        let s = RelayService::start(port, cfg)
            .unwrap()
            .expect("a free port");
        s.add_comm(COMM).unwrap();
        s
    }

    fn read_exact(s: &mut TcpStream, n: usize) -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; n];
        s.read_exact(&mut b)?;
        Ok(b)
    }

    /// A's door exchange: an open-verbs request for B; the verdict.
    pub fn open(port: u16) -> (TcpStream, VerdictRepr) {
        let a = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 61, 1)), 0);
        a.bind(&from.into()).unwrap();
        let to = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 61, 2)), port);
        a.connect(&to.into()).unwrap();
        let mut a: TcpStream = a.into();
        a.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let c = read_exact(&mut a, CHALLENGE_LEN).unwrap();
        let c = ChallengeRepr::parse(c.as_slice().try_into().unwrap()).unwrap();
        let key = CommKey::new(COMM);
        let req = key.seal(
            RequestRepr {
                op: Op::OpenVerbs,
                comm: key.id(),
                port: 0,
                targets: vec![Ipv4Addr::new(127, 0, 62, 2)],
                nonce: [7; 16],
                tag: [0; 16],
            },
            &c.nonce,
        );
        a.write_all(&req.to_bytes()).unwrap();
        let v = read_exact(&mut a, VERDICT_LEN).unwrap();
        let v = VerdictRepr::parse(v.as_slice().try_into().unwrap()).unwrap();
        if v.code == Code::Ok {
            assert!(key.check_verdict(&v, &req.tag), "a verdict K sealed");
        }
        (a, v)
    }

    pub fn offer(a: &mut TcpStream, ring: Geometry, credit: RemoteSeg) -> std::io::Result<Ready> {
        let o = Offer {
            a: end(),
            ring,
            credit: win(credit),
        };
        a.write_all(&o.to_bytes())?;
        let r = read_exact(a, READY_LEN)?;
        Ready::parse(r.as_slice().try_into().unwrap())
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// Polls A's verbs leg set-up until K's ready (at most 30 s).
fn until_ready(
    leg: &mut switchless::transport::relay::verbs_client::VerbsLeg,
) -> switchless::transport::relay::leg_setup::Ready {
    use switchless::transport::relay::verbs_client::LegStep;
    let t = Instant::now();
    loop {
        match leg.poll().unwrap() {
            LegStep::Ready(r) => return r,
            LegStep::Pending => {
                assert!(t.elapsed() < Duration::from_secs(30), "no ready from K");
                std::thread::sleep(Duration::from_millis(1));
            }
            s => panic!("{s:?} before the ready"),
        }
    }
}

/// Attaches A's and B's staged path 0 to K's rings as `ready` gives them.
fn attach_ready<X: Fabric, Y: Fabric>(
    ready: &switchless::transport::relay::leg_setup::Ready,
    a: &mut Staged<X>,
    b: &mut Staged<Y>,
    ea: &StagedEnd,
    eb: &StagedEnd,
) {
    let link = |ring: switchless::transport::relay::leg_setup::Window, peer_lengths| StagedLink {
        ring: RemoteSeg {
            addr: ring.addr,
            rkey: ring.rkey,
        },
        slots: ready.ring.slots,
        slot_bytes: ready.ring.slot_bytes as usize,
        peer_lengths,
    };
    a.attach(0, link(ready.ring_a, eb.lengths)).unwrap();
    b.attach(0, link(ready.ring_b, ea.lengths)).unwrap();
}

/// Sends K B's end and credit word (`again`: a second peer message, refused), polls until K's
/// up (at most 30 s); the leg's control channel.
fn until_up(
    mut leg: switchless::transport::relay::verbs_client::VerbsLeg,
    b_end: switchless::transport::relay::leg_setup::QpEnd,
    eb: &StagedEnd,
    again: Option<&switchless::transport::relay::leg_setup::Peer>,
) -> std::net::TcpStream {
    use switchless::transport::relay::leg_setup::{Peer, Window};
    use switchless::transport::relay::verbs_client::LegStep;
    leg.peer(&Peer {
        b: b_end,
        credit: Window {
            addr: eb.credit.addr,
            rkey: eb.credit.rkey,
        },
    })
    .unwrap();
    if let Some(p) = again {
        assert!(leg.peer(p).is_err(), "a second peer message");
    }
    let t = Instant::now();
    while leg.poll().unwrap() != LegStep::Up {
        assert!(t.elapsed() < Duration::from_secs(30), "no up from K");
        std::thread::sleep(Duration::from_millis(1));
    }
    leg.into_control().unwrap()
}

/// Polls `f` every 2 ms for up to 10 s.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A leg set up through a real relay service's door on `port` (K's half from the in-process
/// fabric; `link_down`: the service's link check), A asking for `slots` slots of 64 KiB: the
/// service, the comms over the leg, A's control channel, K's verdict and ready.
fn door_rig(
    port: u16,
    slots: u32,
    link_down: Option<switchless::transport::relay::service::LinkDown>,
) -> (
    switchless::transport::relay::RelayService,
    Rig,
    std::net::TcpStream,
    switchless::transport::relay::wire::VerdictRepr,
    switchless::transport::relay::leg_setup::Ready,
) {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::sync::{Arc, Mutex};
    use switchless::transport::relay::CommKey;
    use switchless::transport::relay::leg_setup::{Geometry, Offer, Peer, QpEnd, Window};
    use switchless::transport::relay::verbs_client::{LegStep, VerbsLeg};

    let fab = MemFab::new(MemFabConfig::default());
    let (a, ka) = fab.pair(&[100_000], 0);
    let (kb, b) = fab.pair(&[100_000], 0);
    let factory = Arc::new(door::MemFactory {
        fab: fab.clone(),
        halves: Mutex::new([(ka, kb)].into()),
    });
    let k = door::relay_with(port, Some(factory), link_down);
    let (mut a, mut b) = (Staged::new(a), Staged::new(b));
    let ea = a.stage(0, slots).unwrap();
    let eb = b.stage(0, slots).unwrap();
    let offer = Offer {
        a: QpEnd {
            qpn: 0x11,
            psn: 0,
            gid: [0; 16],
            mtu: 4096,
        },
        ring: Geometry {
            slots,
            slot_bytes: 64 << 10,
        },
        credit: Window {
            addr: ea.credit.addr,
            rkey: ea.credit.rkey,
        },
    };
    let mut leg = VerbsLeg::start(
        Ipv4Addr::new(127, 0, 61, 1),
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 61, 2)), port),
        CommKey::new(door::COMM),
        Ipv4Addr::new(127, 0, 62, 2),
        offer,
    )
    .unwrap();
    let ready = until_ready(&mut leg);
    let verdict = leg.verdict().unwrap().clone();
    assert_eq!(leg.poll().unwrap(), LegStep::AwaitingPeer);
    attach_ready(&ready, &mut a, &mut b, &ea, &eb);
    // B's end and credit word, as A's handshake with B would bring them.
    let twice = Peer {
        b: offer.a,
        credit: offer.credit,
    };
    let ctl = until_up(leg, offer.a, &eb, Some(&twice));
    eventually("the leg is forwarding", || k.stats().verbs_legs == 1);
    let (s, r) = connect_pair(a, b, pcfg()).unwrap();
    let g = Rig {
        fab,
        s,
        r,
        k: None,
        ids: [EpId(0); 4],
        a_credit: ea.credit,
        now: Instant::now(),
    };
    (k, g, ctl, verdict, ready)
}

#[test]
fn a_verbs_leg_set_up_through_the_relays_door_carries_verified_data_and_ends_with_its_connection() {
    use switchless::transport::relay::wire::Code;

    // A asks for 256 slots of 64 KiB (16 MiB); the relay grants what its 4 MiB bound holds.
    let (k, mut g, ctl, v, ready) = door_rig(31_061, 256, None);
    assert_eq!(v.code, Code::Ok, "{v:?}");
    assert_eq!(v.target.to_string(), "127.0.62.2");
    assert_eq!(v.via.to_string(), "127.0.62.1");
    assert_eq!(v.host, "k");
    assert_eq!(ready.ring.slots, 64, "{ready:?}");
    let sizes = sizes();
    let (out, dst, offs) = stream(&mut g, &sizes, 4, |_, _| false);
    assert!(
        out.sent_ok.iter().all(|&x| x) && out.received.iter().all(|&c| c == 1),
        "{out:?}"
    );
    check_landed(&g, &sizes, &out, dst, &offs);
    let st = k.stats();
    assert_eq!((st.verbs_opened, st.verbs_ended), (1, 0), "{st:?}");

    // A's door connection closes: the relay ends the leg, and both ends fail their next message.
    drop(ctl);
    eventually("the leg is closed", || k.stats().verbs_legs == 0);
    let (out, ..) = stream(&mut g, &[100_000], 1, |_, _| false);
    assert!(out.send_err.is_some() && out.recv_err.is_some(), "{out:?}");
}

#[test]
fn a_verbs_leg_the_relay_cannot_make_or_a_malformed_set_up_is_refused_and_counted() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    use switchless::transport::relay::wire::Code;

    // A relay without verbs legs: refused by name (the raw verdict, and the client's error).
    let k = door::relay(31_062, None);
    let (_, v) = door::open(31_062);
    assert_eq!(v.code, Code::NoVerbs, "{v:?}");
    let at = std::net::SocketAddr::from(([127, 0, 61, 2], 31_062));
    let offer = switchless::transport::relay::leg_setup::Offer {
        a: switchless::transport::relay::leg_setup::QpEnd {
            qpn: 1,
            psn: 0,
            gid: [0; 16],
            mtu: 1024,
        },
        ring: switchless::transport::relay::leg_setup::Geometry {
            slots: 8,
            slot_bytes: 4096,
        },
        credit: switchless::transport::relay::leg_setup::Window {
            addr: 0x1000,
            rkey: 1,
        },
    };
    let mut leg = switchless::transport::relay::verbs_client::VerbsLeg::start(
        [127, 0, 61, 1].into(),
        at,
        switchless::transport::relay::CommKey::new(door::COMM),
        [127, 0, 62, 2].into(),
        offer,
    )
    .unwrap();
    let e = loop {
        match leg.poll() {
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => break e.to_string(),
        }
    };
    assert!(e.contains("refused: it relays over TCP only"), "{e}");
    eventually("counted", || k.stats().refused.get("no verbs") == Some(&2));
    drop(k);

    // A relay with them: a garbage offer ends the connection, counted; so does an offer whose
    // slots are larger than the relay's ring; and a factory out of queue pairs.
    let fab = MemFab::new(MemFabConfig::default());
    let (_, ka) = fab.pair(&[100_000], 0);
    let (kb, _) = fab.pair(&[100_000], 0);
    let factory = Arc::new(door::MemFactory {
        fab: fab.clone(),
        halves: Mutex::new([(ka, kb)].into()),
    });
    let k = door::relay(31_063, Some(factory));
    let (mut ctl, v) = door::open(31_063);
    assert_eq!(v.code, Code::Ok);
    ctl.write_all(&[0x55; switchless::transport::relay::leg_setup::OFFER_LEN])
        .unwrap();
    let mut rest = Vec::new();
    let _ = ctl.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no ready for a garbage offer");
    eventually("counted", || {
        k.stats().refused.get("verbs set-up") == Some(&1)
    });
    let (mut ctl, _) = door::open(31_063);
    let huge = switchless::transport::relay::leg_setup::Geometry {
        slots: 1,
        slot_bytes: 8 << 20,
    };
    assert!(
        door::offer(
            &mut ctl,
            huge,
            RemoteSeg {
                addr: 0x1000,
                rkey: 1
            }
        )
        .is_err()
    );
    eventually("counted", || {
        k.stats().refused.get("verbs set-up") == Some(&2)
    });
    // The one prepared half is used by this leg; the next finds none.
    let (mut ctl, _) = door::open(31_063);
    let ok = switchless::transport::relay::leg_setup::Geometry {
        slots: 8,
        slot_bytes: 64 << 10,
    };
    door::offer(
        &mut ctl,
        ok,
        RemoteSeg {
            addr: 0x1000,
            rkey: 1,
        },
    )
    .unwrap();
    let (mut ctl2, _) = door::open(31_063);
    assert!(
        door::offer(
            &mut ctl2,
            ok,
            RemoteSeg {
                addr: 0x1000,
                rkey: 1
            }
        )
        .is_err()
    );
    eventually("counted", || {
        k.stats().refused.get("verbs set-up") == Some(&3)
    });
    assert_eq!(k.stats().verbs_opened, 0);
    drop(ctl);
}

/// The soft-RoCE lab's device for the verbs branches: the first RDMA device, port 1, its first
/// IPv4 RoCE v2 GID. `None` on a host without RDMA devices (the build host).
fn lab_path() -> Option<(String, switchless::verbs::fabric::VerbsPath)> {
    use switchless::config::RelaxedOrdering;
    use switchless::verbs::fabric::VerbsPath;
    use switchless::verbs::{Context, Domain, GidType, device_names};
    let names = device_names().unwrap_or_default();
    let name = names.first()?.clone();
    let ctx = Context::open(&name).unwrap();
    let port = 1u8;
    let info = ctx.query_port(port).unwrap();
    let gid = ctx
        .gid_table(port)
        .unwrap()
        .into_iter()
        .find(|e| e.gid.ipv4().is_some() && e.gid_type == Some(GidType::RoceV2))
        .expect("an IPv4 RoCE v2 GID on the lab's device");
    let path = VerbsPath {
        domain: Domain::new(&ctx, RelaxedOrdering::Off).unwrap(),
        port,
        gid_index: gid.index,
        active_mtu: info.active_mtu.map_or(1024, |m| m.bytes()),
        speed_mbps: 10_000,
        label: format!("{name}:{port} gid {}", gid.index),
    };
    Some((name, path))
}

fn remote_end(e: &switchless::verbs::fabric::LocalEnd) -> switchless::verbs::fabric::RemoteEnd {
    switchless::verbs::fabric::RemoteEnd {
        qpn: e.qpn,
        psn: e.psn,
        gid: e.gid,
        mtu: e.mtu,
        mailbox: 0,
        mailbox_rkey: 0,
    }
}

/// Sends each of `sizes` from A to B over real memory, one at a time, verified byte for byte;
/// `k` (when K runs on this thread) is polled in between.
fn verbs_messages<F: Fabric, G: Fabric>(
    s: &mut SendComm<F>,
    r: &mut RecvComm<G>,
    mut k: Option<
        &mut Forwarder<switchless::verbs::fabric::VerbsFabric, switchless::sys::HostBuffer>,
    >,
    sizes: &[usize],
) {
    use switchless::sys::HostBuffer;
    let max = *sizes.iter().max().unwrap();
    let mut src = HostBuffer::new(max).unwrap();
    src.write(0, &pattern(max, 5)).unwrap();
    let dst = HostBuffer::new(max).unwrap();
    let smh = s.reg_mr(&src.lend(), MemKind::Host).unwrap();
    let rmh = r.reg_mr(&dst.lend(), MemKind::Host).unwrap();
    let t = Instant::now();
    let mut poll_k = || {
        if let Some(k) = k.as_deref_mut() {
            k.poll().unwrap();
        }
    };
    for (m, &size) in sizes.iter().enumerate() {
        let b = RecvBuf {
            addr: dst.addr(),
            size: size as u64,
            tag: 0,
            mh: &rmh,
        };
        let rq = loop {
            if let Some(q) = r.irecv(Instant::now(), &[b]).unwrap() {
                break q;
            }
        };
        let sq = loop {
            poll_k();
            if let Some(q) = s
                .isend(Instant::now(), src.addr(), size as u64, 0, &smh)
                .unwrap()
            {
                break q;
            }
        };
        let (mut sent, mut got) = (false, false);
        while !(sent && got) {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "message {m} of {size} bytes hangs"
            );
            poll_k();
            let now = Instant::now();
            if !sent && s.test(now, sq).unwrap().is_some() {
                sent = true;
            }
            if !got && let Some(sz) = r.test(now, rq).unwrap() {
                assert_eq!(sz.as_slice(), &[size as u64], "message {m}");
                got = true;
            }
        }
        assert!(
            dst.read(0, size).unwrap() == pattern(max, 5)[..size],
            "message {m} of {size} bytes"
        );
    }
    s.dereg_mr(smh).unwrap();
    r.dereg_mr(rmh).unwrap();
}

fn verbs_sizes(slot_bytes: usize) -> Vec<usize> {
    let p = slot_bytes - DESC_LEN;
    vec![0, 1, 4095, p, p + 1, 3 * p + 5, 1 << 20, (2 << 20) + 3]
}

/// The same leg over real verbs, where the host has an RDMA device (the soft-RoCE lab's VMs: CI
/// step 82 runs this binary there): A, K and B in this process, four RC queue pairs on the
/// device's IPv4 RoCE v2 GID (A's to K's first, K's second to B's: rxe carries a queue pair to
/// another on the same device like any other), K's rings in host memory, the real comm protocol
/// on top. Every size around the slot, verified byte for byte; K's counters show both directions
/// forwarded. On a host without RDMA devices (the build host) it checks nothing and says so.
#[test]
fn a_relay_leg_over_real_verbs_carries_verified_data_when_the_host_has_rdma() {
    use switchless::sys::HostBuffer;
    use switchless::transport::handshake::auth::ConnSecret;
    use switchless::verbs::fabric::{QpTuning, VerbsFabric};

    let Some((name, path)) = lab_path() else {
        println!("no RDMA device here: the verbs branch runs in the soft-RoCE lab");
        return;
    };
    let mk = || VerbsFabric::new(std::slice::from_ref(&path), false).unwrap();
    let (a, ka, kb, b) = (mk(), mk(), mk(), mk());
    let tuning = QpTuning::default();
    let secret = ConnSecret::from_bytes([3; 32]);
    let end = |f: &VerbsFabric| remote_end(&f.local_ends()[0]);
    a.connect(&[end(&ka)], &tuning, &secret).unwrap();
    ka.connect(&[end(&a)], &tuning, &secret).unwrap();
    kb.connect(&[end(&b)], &tuning, &secret).unwrap();
    b.connect(&[end(&kb)], &tuning, &secret).unwrap();

    let (slots, slot_bytes) = (16u32, 64usize << 10);
    let (mut a, mut b) = (Staged::new(a), Staged::new(b));
    let ea = a.stage(0, slots).unwrap();
    let eb = b.stage(0, slots).unwrap();
    let rings = [
        HostBuffer::new(slots as usize * slot_bytes).unwrap(),
        HostBuffer::new(slots as usize * slot_bytes).unwrap(),
    ];
    let mut k = Forwarder::new([ka, kb], [0, 0], rings, slots, slot_bytes, ea.credit).unwrap();
    k.peer(eb.credit).unwrap();
    let link = |ring, peer_lengths| StagedLink {
        ring,
        slots,
        slot_bytes,
        peer_lengths,
    };
    a.attach(0, link(k.ring(0).unwrap(), eb.lengths)).unwrap();
    b.attach(0, link(k.ring(1).unwrap(), ea.lengths)).unwrap();
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    let t = Instant::now();
    let sizes = verbs_sizes(slot_bytes);
    verbs_messages(&mut s, &mut r, Some(&mut k), &sizes);
    let (ab, ba) = (k.stats(0), k.stats(1));
    assert!(
        ab.forwarded > sizes.len() as u64 && ba.forwarded > 0,
        "{ab:?} {ba:?}"
    );
    s.close().unwrap();
    r.close().unwrap();
    println!(
        "relay leg over {name}: {} writes A->B ({} bytes), {} B->A, in {:.2} s",
        ab.forwarded,
        ab.bytes,
        ba.forwarded,
        t.elapsed().as_secs_f64()
    );
    // Counted by the lab's CI step: this branch ran where verbs exist.
    println!("RDMA-BRANCH relay_verbs::a_relay_leg_over_real_verbs_carries_verified_data");
}

/// The production K side on real verbs (`verbs::relay_leg::VerbsLegs`, the relay service's
/// factory): a relay service on 127/8 whose links map to the lab VM's RDMA device, A's set-up
/// through its door with `VerbsLeg` (A's queue pair end in the offer, K's ends in the ready, B's
/// in the peer message), K's queue pairs made and connected by the factory, forwarding on the
/// service's thread; the comm protocol's messages verified; the leg closed with A's door
/// connection. On a host without RDMA devices it checks nothing and says so.
#[test]
fn a_relay_services_verbs_leg_over_real_queue_pairs_when_the_host_has_rdma() {
    use std::collections::HashMap;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::Arc;
    use switchless::transport::handshake::auth::ConnSecret;
    use switchless::transport::relay::leg_setup::{Geometry, Offer, QpEnd, Window};
    use switchless::transport::relay::verbs_client::VerbsLeg;
    use switchless::transport::relay::{Bounds, CommKey, RelayLink, RelayService, ServiceConfig};
    use switchless::transport::tcp::TcpConfig;
    use switchless::verbs::fabric::{LocalEnd, QpTuning, VerbsFabric};
    use switchless::verbs::relay_leg::VerbsLegs;

    let Some((name, path)) = lab_path() else {
        println!("no RDMA device here: the verbs branch runs in the soft-RoCE lab");
        return;
    };
    let tuning = QpTuning::default();
    let legs = VerbsLegs::new(HashMap::from([("lo".to_string(), path.clone())]), tuning);
    let link = |a: &str| RelayLink {
        addr: a.parse().unwrap(),
        netdev: "lo".into(),
        speed_mbps: 10_000,
    };
    let comm = 0x7e1a_0000_5eedu64;
    let port = 31_071;
    let k = RelayService::start(
        port,
        ServiceConfig {
            links: vec![link("127.0.71.2/30"), link("127.0.72.1/30")],
            bounds: Bounds::default(),
            tcp: TcpConfig::default(),
            host: "k".into(),
            link_down: None,
            verbs: Some(Arc::new(legs)),
        },
    )
    .unwrap()
    .expect("a free port");
    k.add_comm(comm).unwrap();

    let mk = || VerbsFabric::new(std::slice::from_ref(&path), false).unwrap();
    let (a, b) = (mk(), mk());
    let qp_end = |e: &LocalEnd| QpEnd {
        qpn: e.qpn,
        psn: e.psn,
        gid: e.gid,
        mtu: e.mtu as u16,
    };
    let (end_a, end_b) = (qp_end(&a.local_ends()[0]), qp_end(&b.local_ends()[0]));
    let (mut a, mut b) = (Staged::new(a), Staged::new(b));
    let ea = a.stage(0, 16).unwrap();
    let eb = b.stage(0, 16).unwrap();
    let win = |r: RemoteSeg| Window {
        addr: r.addr,
        rkey: r.rkey,
    };
    let offer = Offer {
        a: end_a,
        ring: Geometry {
            slots: 16,
            slot_bytes: 64 << 10,
        },
        credit: win(ea.credit),
    };
    let mut leg = VerbsLeg::start(
        Ipv4Addr::new(127, 0, 71, 1),
        SocketAddr::from(([127, 0, 71, 2], port)),
        CommKey::new(comm),
        Ipv4Addr::new(127, 0, 72, 2),
        offer,
    )
    .unwrap();
    let t = Instant::now();
    let ready = until_ready(&mut leg);
    // A's queue pair to K's first, B's to K's second (B would read it from A's hello).
    let secret = ConnSecret::from_bytes([5; 32]);
    let to_remote = |q: &QpEnd| switchless::verbs::fabric::RemoteEnd {
        qpn: q.qpn,
        psn: q.psn,
        gid: q.gid,
        mtu: u32::from(q.mtu),
        mailbox: 0,
        mailbox_rkey: 0,
    };
    a.inner()
        .connect(&[to_remote(&ready.k_a)], &tuning, &secret)
        .unwrap();
    b.inner()
        .connect(&[to_remote(&ready.k_b)], &tuning, &secret)
        .unwrap();
    attach_ready(&ready, &mut a, &mut b, &ea, &eb);
    let ctl = until_up(leg, end_b, &eb, None);
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    let sizes = verbs_sizes(64 << 10);
    verbs_messages(&mut s, &mut r, None, &sizes);
    let st = k.stats();
    assert_eq!((st.verbs_opened, st.verbs_legs), (1, 1), "{st:?}");
    drop(ctl);
    eventually("the leg is closed", || k.stats().verbs_legs == 0);
    println!(
        "relay service's verbs leg over {name}: {} messages in {:.2} s",
        sizes.len(),
        t.elapsed().as_secs_f64()
    );
    // Counted by the lab's CI step: this branch ran where verbs exist.
    println!("RDMA-BRANCH relay_verbs::a_relay_services_verbs_leg_over_real_queue_pairs");
}

#[test]
fn staging_a_path_checks_its_path_its_slot_count_and_its_attachment() {
    let fab = MemFab::new(MemFabConfig::default());
    let (a, _b) = fab.pair(&[100_000], 0);
    let mut a = Staged::new(a);
    for (path, slots, want) in [
        (1usize, 8u32, "staging path 1; the connection has 1 paths"),
        (0, 0, "staged for 0 slots; accepted 1..=256"),
        (0, 257, "staged for 257 slots; accepted 1..=256"),
    ] {
        let e = a.stage(path, slots).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    let ea = a.stage(0, 8).unwrap();
    assert!(
        a.stage(0, 8)
            .unwrap_err()
            .to_string()
            .contains("staged already")
    );
    // A write before the relay is attached is refused; a ring larger than the descriptors
    // prepared for is too.
    let wr = WriteWr {
        wr_id: 1,
        local: LocalSeg {
            addr: 0,
            len: 0,
            lkey: 0,
        },
        remote: ea.lengths,
        imm: None,
        signaled: true,
        inline: false,
    };
    let e = a.post_write(0, &wr).unwrap_err().to_string();
    assert!(e.contains("before its relay is attached"), "{e}");
    let link = StagedLink {
        ring: ea.credit,
        slots: 9,
        slot_bytes: 4096,
        peer_lengths: ea.lengths,
    };
    let e = a.attach(0, link).unwrap_err().to_string();
    assert!(
        e.contains("ring has 9 slots; this end prepared descriptors for 8"),
        "{e}"
    );
}

#[test]
fn a_verbs_leg_whose_link_goes_down_is_cut_at_the_relay_and_both_ends_fail() {
    use std::io::Read;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    let down = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&down);
    let check: switchless::transport::relay::service::LinkDown = Arc::new(move |_: &str| {
        seen.load(std::sync::atomic::Ordering::Relaxed)
            .then(|| "carrier lost".to_string())
    });
    let (k, mut g, mut ctl, ..) = door_rig(31_064, 8, Some(check));
    let (out, ..) = stream(&mut g, &[300_000, 7], 2, |_, _| false);
    assert!(out.sent_ok.iter().all(|&x| x), "{out:?}");
    // The link to B goes down: the relay cuts the leg (its queue pairs would fail only after the
    // RC retries), A's control channel ends, and both ends fail their next message.
    down.store(true, std::sync::atomic::Ordering::Relaxed);
    eventually("the leg is cut", || {
        let st = k.stats();
        st.verbs_legs == 0 && st.refused.get("link down") == Some(&1)
    });
    let mut rest = Vec::new();
    let _ = ctl.read_to_end(&mut rest);
    assert!(rest.is_empty());
    let (out, ..) = stream(&mut g, &[100_000], 1, |_, _| false);
    assert!(out.send_err.is_some() && out.recv_err.is_some(), "{out:?}");
}
