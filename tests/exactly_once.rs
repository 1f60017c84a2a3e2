//! Exactly-once delivery under failover, as NCCL's p2p uses the plugin: two peers send to one host,
//! whose receives share one pool of buffers, each buffer posted again (for either peer) as soon as
//! its receive completed. A path of one peer's connection fails at any point, and what was in
//! flight on it is dropped, lands with its completion lost (the write is there, the sender is told
//! it failed), or is held on the wire and lands later. Whatever the fault: every message arrives
//! once with exactly the sender's bytes (checked when its receive completes), and no write lands in
//! a buffer whose receive has completed until that buffer is posted again (the memfab's guard
//! records every write into a guarded range, late ones included).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

use std::time::{Duration, Instant};

use proptest::prelude::*;
use switchless::sys::Lent;
use switchless::transport::comm::{
    MemHandle, ProtocolConfig, RecvBuf, RecvComm, Request, SendComm, connect_pair,
};
use switchless::transport::fabric::MemKind;
use switchless::transport::memfab::{EpId, InFlight, MemEndpoint, MemFab, MemFabConfig};
use switchless::transport::stripe::StripeParams;

#[path = "support/shared_pool.rs"]
mod shared_pool;

use shared_pool::content;

fn pcfg() -> ProtocolConfig {
    ProtocolConfig {
        stripe: StripeParams {
            min_chunk: 4096,
            align: 128,
        },
        ..ProtocolConfig::default()
    }
}

/// One peer: its connection to the receiving host, and its ring of send buffers.
struct Peer {
    s: SendComm<MemEndpoint>,
    r: RecvComm<MemEndpoint>,
    sid: EpId,
    smh: MemHandle,
    rmh: MemHandle,
    /// Send buffers (`ring` of them, `slot` bytes each), reused once their send completed.
    src: u64,
    ring_free: Vec<bool>,
    /// Its messages (global indices) in order, and how many were handed to `isend`.
    msgs: Vec<usize>,
    next_send: usize,
    /// The buffer the next `isend` uses, already holding that message's bytes.
    staged: Option<usize>,
    sq: Vec<(usize, Request, usize)>,
    rq: Vec<(usize, Request, usize)>,
    /// "NCCL's next operation on this connection": a receive posted once the peer's last message
    /// arrived while its sender still waits (it never completes; it makes the receiver's comm
    /// called, as the next collective would).
    next_op: Option<Request>,
    spare: u64,
    spare_mh: MemHandle,
}

/// What a case does.
#[derive(Debug, Clone)]
struct Case {
    npaths: usize,
    /// Per message: the peer (0 or 1) and its size.
    plan: Vec<(usize, usize)>,
    /// Buffers in the shared receive pool.
    pool: usize,
    /// Send buffers per peer.
    ring: usize,
    /// The fault: peer, path, after how many executed work requests, cut mid-write, mode.
    fault_peer: usize,
    fault_path: usize,
    fault_at: u64,
    partial: bool,
    mode: InFlight,
    seed: Option<u64>,
    /// The last data path stands by (the connector's choice): it carries, and both sides
    /// register on it, only once the fault makes it take over.
    standby: bool,
    /// A second fault on the same peer, armed when the first has struck: this path, after this
    /// many more executed work requests (so it can strike while the standby path is activated,
    /// its key updates in flight).
    second: Option<(usize, u64)>,
    /// Each peer hands a send to `isend` only every this many steps (1: every step): a slow
    /// sender, holding the receiver's entries unused, so that the receiver holds new ones back
    /// and posts several in one write.
    send_gap: usize,
}

/// What a run saw.
#[derive(Debug)]
struct Seen {
    /// Writes that landed in a completed receive's buffer.
    violations: Vec<String>,
    /// Messages whose bytes were not the sender's when their receive completed.
    corrupt: Vec<String>,
    /// Whether the fault fired (and the second one, if any), and writes landed with lost
    /// completions or late.
    fired: bool,
    second_fired: bool,
    landed_lost: u64,
    late_landed: u64,
    late_dropped: u64,
    steps: usize,
    /// What the fence settled: pieces (send comms) and clear-to-send entries (receive comms)
    /// found landed, and sent again.
    pieces_landed: u64,
    pieces_resent: u64,
    cts_landed: u64,
    cts_resent: u64,
    /// Receiving side, per peer: data registrations with keys on the standby path, once
    /// registered (before any traffic) and at the end.
    standby_regs_before: Vec<usize>,
    standby_regs_after: Vec<usize>,
    /// Key updates the receivers posted, pieces the senders held for one.
    key_updates: u64,
    keyless_pieces: u64,
    /// Receiving side: clear-to-send entries posted and the writes that carried them.
    cts_entries: u64,
    cts_writes: u64,
}

const SLOT: usize = 48 << 10;

fn run(c: &Case) -> Seen {
    let fab = MemFab::new(MemFabConfig {
        reorder_seed: c.seed,
        copy_data: true,
        ..MemFabConfig::default()
    });
    let pool = fab.alloc(c.pool * SLOT).unwrap();
    let mut peers: Vec<Peer> = (0..2)
        .map(|_| {
            let (a, b) = fab.pair(&vec![100_000; c.npaths], 0);
            let sid = a.id();
            let (mut s, mut r) = if c.standby {
                let mut s = SendComm::new(a, pcfg()).unwrap();
                s.set_standby(&[c.npaths - 1]).unwrap();
                let mut r = RecvComm::new(b, pcfg()).unwrap();
                let (si, ri) = (s.local_info(), r.local_info());
                s.connect(ri).unwrap();
                r.connect(si).unwrap();
                (s, r)
            } else {
                connect_pair(a, b, pcfg()).unwrap()
            };
            let src = fab.alloc(c.ring * SLOT).unwrap();
            let smh = s
                .reg_mr(&Lent::simulated(src, c.ring * SLOT), MemKind::Host)
                .unwrap();
            // One pool, registered on both receiving comms (NCCL registers its p2p buffers on
            // each connection).
            let rmh = r
                .reg_mr(&Lent::simulated(pool, c.pool * SLOT), MemKind::Host)
                .unwrap();
            let spare = fab.alloc(SLOT).unwrap();
            let spare_mh = r
                .reg_mr(&Lent::simulated(spare, SLOT), MemKind::Host)
                .unwrap();
            Peer {
                s,
                r,
                sid,
                smh,
                rmh,
                src,
                ring_free: vec![true; c.ring],
                msgs: Vec::new(),
                next_send: 0,
                staged: None,
                sq: Vec::new(),
                rq: Vec::new(),
                next_op: None,
                spare,
                spare_mh,
            }
        })
        .collect();
    for (m, &(p, _)) in c.plan.iter().enumerate() {
        peers[p].msgs.push(m);
    }
    let standby_regs = |fab: &MemFab, peers: &[Peer]| -> Vec<usize> {
        peers
            .iter()
            .map(|p| fab.registrations_on(p.r.fabric().id(), c.npaths - 1))
            .collect()
    };
    let standby_regs_before = standby_regs(&fab, &peers);
    let n = c.plan.len();
    let fid = peers[c.fault_peer].sid;
    fab.fault_after(fid, c.fault_path, c.fault_at, c.partial, c.mode);

    let mut second = c.second;
    let mut fired_first = false;
    let mut slot_free = vec![true; c.pool];
    let mut received = vec![0u32; n];
    let mut sent = vec![0u32; n];
    let mut corrupt = Vec::new();
    let mut next_post = 0;
    let mut now = Instant::now();
    let mut steps = 0;
    for step in 0..20_000 {
        steps = step;
        if !fired_first && !fab.kill_pending() {
            fired_first = true;
            if let Some((path, ops)) = second.take() {
                fab.fault_after(fid, path, ops, c.partial, c.mode);
            }
        }
        // Receives in message order, each into the first free pool buffer (for either peer).
        while next_post < n {
            let Some(k) = slot_free.iter().position(|&f| f) else {
                break;
            };
            let (p, _) = c.plan[next_post];
            let addr = pool + (k * SLOT) as u64;
            // Posted again: from now on writes into it are expected.
            fab.unguard(addr);
            let peer = &mut peers[p];
            let b = RecvBuf {
                addr,
                size: SLOT as u64,
                tag: 0,
                mh: &peer.rmh,
            };
            match peer.r.irecv(now, &[b]).unwrap() {
                Some(q) => {
                    peer.rq.push((next_post, q, k));
                    slot_free[k] = false;
                    next_post += 1;
                }
                None => break,
            }
        }
        for peer in peers.iter_mut().filter(|_| step % c.send_gap == 0) {
            while peer.next_send < peer.msgs.len() {
                let m = peer.msgs[peer.next_send];
                let size = c.plan[m].1;
                let e = match peer.staged {
                    Some(e) => e,
                    None => {
                        let Some(e) = peer.ring_free.iter().position(|&f| f) else {
                            break;
                        };
                        fab.write(peer.src + (e * SLOT) as u64, &content(m, size))
                            .unwrap();
                        peer.ring_free[e] = false;
                        peer.staged = Some(e);
                        e
                    }
                };
                let addr = peer.src + (e * SLOT) as u64;
                match peer.s.isend(now, addr, size as u64, 0, &peer.smh).unwrap() {
                    Some(q) => {
                        peer.sq.push((m, q, e));
                        peer.staged = None;
                        peer.next_send += 1;
                        if c.send_gap > 1 {
                            break; // one send per turn
                        }
                    }
                    None => break,
                }
            }
        }
        for peer in peers.iter_mut() {
            let mut i = 0;
            while i < peer.rq.len() {
                let (m, q, k) = peer.rq[i];
                match peer.r.test(now, q).unwrap() {
                    Some(sz) => {
                        let size = c.plan[m].1;
                        assert_eq!(sz.as_slice(), &[size as u64], "message {m}");
                        let addr = pool + (k * SLOT) as u64;
                        // At completion: exactly the sender's bytes (a late write may only land
                        // after this, which the guard below records).
                        if fab.read(addr, size).unwrap() != content(m, size) {
                            corrupt.push(format!(
                                "message {m} ({size} bytes, peer {}) in pool buffer {k}",
                                c.plan[m].0
                            ));
                        }
                        received[m] += 1;
                        fab.guard(
                            addr,
                            SLOT,
                            &format!(
                                "pool buffer {k}, whose receive of message {m} (peer {}) completed at step {step}",
                                c.plan[m].0
                            ),
                        );
                        slot_free[k] = true;
                        peer.rq.remove(i);
                    }
                    None => i += 1,
                }
            }
            let mut i = 0;
            while i < peer.sq.len() {
                let (m, q, e) = peer.sq[i];
                match peer.s.test(now, q).unwrap() {
                    Some(sz) => {
                        assert_eq!(sz, c.plan[m].1 as u64, "message {m}");
                        sent[m] += 1;
                        peer.ring_free[e] = true;
                        peer.sq.remove(i);
                    }
                    None => i += 1,
                }
            }
            let recv_done = peer.msgs.iter().all(|&m| received[m] > 0);
            let send_done = peer.msgs.iter().all(|&m| sent[m] > 0);
            if recv_done && !send_done && peer.next_op.is_none() {
                let b = RecvBuf {
                    addr: peer.spare,
                    size: SLOT as u64,
                    tag: 0,
                    mh: &peer.spare_mh,
                };
                peer.next_op = peer.r.irecv(now, &[b]).unwrap();
            }
            if let Some(q) = peer.next_op {
                assert!(
                    peer.r.test(now, q).unwrap().is_none(),
                    "a receive with no send completed"
                );
            }
        }
        if received.iter().all(|&x| x == 1) && sent.iter().all(|&x| x == 1) {
            break;
        }
        fab.step();
        now += Duration::from_millis(1);
    }
    assert!(
        received.iter().all(|&x| x == 1) && sent.iter().all(|&x| x == 1),
        "{c:?}: hang after {steps} steps: received {received:?}, sent {sent:?}; paths up {:?} {:?}",
        peers.iter().map(|p| p.s.paths_up()).collect::<Vec<_>>(),
        peers.iter().map(|p| p.r.paths_up()).collect::<Vec<_>>(),
    );
    // Whatever the fault still holds on the wire lands now (unless its target's end is sealed).
    // The first fault may strike in the last step (then the second was never armed).
    let armed = c.second.is_some() && second.is_none();
    let fired = fired_first || !fab.kill_pending();
    let second_fired = armed && !fab.kill_pending();
    fab.deliver_late();
    let st = fab.stats();
    let sum = |f: &dyn Fn(&Peer) -> u64| peers.iter().map(f).sum::<u64>();
    let seen = Seen {
        standby_regs_before,
        standby_regs_after: standby_regs(&fab, &peers),
        key_updates: sum(&|p| p.r.fence_stats().keys),
        keyless_pieces: sum(&|p| p.s.fence_stats().keys),
        pieces_landed: sum(&|p| p.s.fence_stats().landed),
        pieces_resent: sum(&|p| p.s.fence_stats().resent),
        cts_landed: sum(&|p| p.r.fence_stats().landed),
        cts_resent: sum(&|p| p.r.fence_stats().resent),
        cts_entries: sum(&|p| p.r.cts_stats().entries),
        cts_writes: sum(&|p| p.r.cts_stats().writes),
        violations: fab.violations(),
        corrupt,
        fired,
        second_fired,
        landed_lost: st.landed_lost,
        late_landed: st.late_landed,
        late_dropped: st.late_dropped,
        steps,
    };
    for peer in peers {
        let Peer {
            mut s,
            mut r,
            smh,
            rmh,
            spare_mh,
            ..
        } = peer;
        s.dereg_mr(smh).unwrap();
        r.dereg_mr(rmh).unwrap();
        r.dereg_mr(spare_mh).unwrap();
        s.close().unwrap();
        r.close().unwrap();
    }
    assert_eq!(fab.live_keys(), 0, "registrations leaked");
    seen
}

fn check(c: &Case) -> Seen {
    let seen = run(c);
    assert!(
        seen.violations.is_empty() && seen.corrupt.is_empty(),
        "{c:?}: {} message(s) with wrong bytes at completion {:?}; {} write(s) into completed receives' buffers: {:?}",
        seen.corrupt.len(),
        seen.corrupt,
        seen.violations.len(),
        seen.violations
    );
    seen
}

/// Two peers, alternating, one-piece and striped messages, a pool of 2 buffers.
fn plan(n: usize) -> Vec<(usize, usize)> {
    (0..n)
        .map(|m| (m % 2, [1000, 40_000, 9000, 0, 30_000][m % 5]))
        .collect()
}

fn case(mode: InFlight, fault_at: u64, seed: Option<u64>) -> Case {
    Case {
        npaths: 2,
        plan: plan(24),
        pool: 2,
        ring: 4,
        fault_peer: 0,
        fault_path: 0,
        fault_at,
        partial: false,
        mode,
        seed,
        standby: false,
        second: None,
        send_gap: 1,
    }
}

/// A path's acknowledgements lost: its writes landed, the sender is told they failed. Nothing it
/// sends again may land in a buffer the receiver already completed and posted again.
#[test]
fn writes_whose_completions_were_lost_are_not_sent_again() {
    let (mut lost, mut landed, mut cts) = (0, 0, 0);
    for at in 0..60 {
        for seed in [None, Some(7)] {
            let s = check(&case(InFlight::LandLost, at, seed));
            assert!(s.fired);
            lost += s.landed_lost;
            landed += s.pieces_landed;
            cts += s.cts_landed;
        }
    }
    // The fence found them landed: pieces and clear-to-send entries, none sent twice.
    assert!(
        lost > 0 && landed > 0 && cts > 0,
        "writes landed with lost completions {lost}, pieces found landed {landed}, \
         clear-to-send entries found landed {cts}"
    );
}

/// A path's writes held on the wire after the fault, landing later: none of them lands after the
/// receive it belongs to completed.
#[test]
fn writes_held_on_a_dead_path_never_land_in_a_completed_receive() {
    let (mut landed_late, mut dropped, mut resent, mut cts) = (0, 0, 0, 0);
    for at in 0..60 {
        for ops in [0, 3, 40] {
            let s = check(&case(InFlight::Delay { ops }, at, Some(11)));
            assert!(s.fired);
            landed_late += s.late_landed;
            dropped += s.late_dropped;
            resent += s.pieces_resent;
            cts += s.cts_resent;
        }
    }
    // Held writes both landed (before the receiver sealed its end) and were dropped (after);
    // what was missing was sent again once.
    assert!(
        landed_late > 0 && dropped > 0 && resent > 0 && cts > 0,
        "held writes landed {landed_late}, dropped {dropped}; pieces sent again {resent}, \
         clear-to-send entries posted again {cts}"
    );
}

/// A cable pulled (what was in flight dropped), including mid-write.
#[test]
fn a_pulled_cable_delivers_each_message_once_into_a_shared_pool() {
    for at in 0..60 {
        let mut c = case(InFlight::Drop, at, Some(3));
        c.partial = at % 2 == 0;
        assert!(check(&c).fired);
    }
}

/// A slow sender with receives posted far ahead: the receiver holds entries back and posts
/// several in one write, and a fault at any point (dropped, landed with the completion lost,
/// held and landing late, cut mid-write) finds batched entries in flight. Every message still
/// arrives once, nothing lands in a completed receive, and the entries were batched.
#[test]
fn entries_batched_in_one_write_stay_exactly_once_whatever_the_fault() {
    let (mut entries, mut writes, mut resent, mut landed) = (0, 0, 0, 0);
    for at in 0..48 {
        for mode in [
            InFlight::Drop,
            InFlight::LandLost,
            InFlight::Delay { ops: 3 },
        ] {
            let mut c = case(mode, at, Some(13));
            c.pool = 12;
            c.ring = 2;
            c.send_gap = 6;
            c.partial = at % 2 == 1;
            let s = check(&c);
            assert!(s.fired, "{c:?}");
            entries += s.cts_entries;
            writes += s.cts_writes;
            resent += s.cts_resent;
            landed += s.cts_landed;
        }
    }
    assert!(
        writes * 5 < entries * 4 && resent > 0 && landed > 0,
        "{entries} clear-to-send entries in {writes} writes; the fence found {landed} landed \
         and posted {resent} again"
    );
    eprintln!(
        "{entries} clear-to-send entries in {writes} writes; the fence found {landed} landed \
         and posted {resent} again"
    );
}

/// One carrying and one standby path per peer; peer 0's carrying path fails at any point, with
/// receives posted before it in flight (their clear-to-send entries without the standby path's
/// keys: matched and unmatched by the sender), into one pool the two peers reuse. The receiving
/// side registers on the standby path only at the failover, hands the keys over in key updates,
/// and every message still arrives once with its bytes, nothing landing in a completed receive.
#[test]
fn the_receiver_registers_a_standby_path_at_failover_and_hands_its_keys_over() {
    let (mut updates, mut held, mut runs) = (0, 0, 0);
    // Two work requests per message now (one clear-to-send write, one data write at least): a
    // fault past 40 may strike after the last message that needs the standby path.
    for at in 0..40 {
        for mode in [
            InFlight::Drop,
            InFlight::LandLost,
            InFlight::Delay { ops: 3 },
        ] {
            let mut c = case(mode, at, Some(5));
            c.standby = true;
            c.partial = at % 2 == 1;
            let s = check(&c);
            assert!(s.fired);
            // Pool and spare buffer: nothing on the standby path before the failover (2 before
            // this change), both on it after, on the failed-over connection only.
            assert_eq!(s.standby_regs_before, vec![0, 0], "{c:?}");
            assert_eq!(s.standby_regs_after, vec![2, 0], "{c:?}");
            updates += s.key_updates;
            held += s.keyless_pieces;
            runs += 1;
        }
    }
    // Three paths, path 2 standing by: path 0 fails, path 2 is activated beside path 1 (which
    // has the keys), then path 1 or the activated path 2 fails 0..40 work requests later, with
    // key updates and held pieces in flight.
    let mut second_fired = 0;
    for at in 0..30 {
        for (path, ops) in [(1, 0), (1, 5), (1, 20), (2, 0), (2, 3), (2, 12)] {
            let mut c = case(InFlight::Drop, at, Some(5));
            c.npaths = 3;
            c.standby = true;
            c.second = Some((path, ops));
            let s = check(&c);
            assert!(s.fired);
            second_fired += usize::from(s.second_fired);
            assert_eq!(s.standby_regs_before, vec![0, 0], "{c:?}");
            updates += s.key_updates;
            held += s.keyless_pieces;
            runs += 1;
        }
    }
    assert!(
        second_fired > 150,
        "the second fault struck in {second_fired} of 180 runs"
    );
    // Receives posted before the failover got their keys late, and the sender held pieces
    // for them (a receive in flight across the failover, not only new ones).
    assert!(
        updates > 0 && held > 0,
        "{runs} runs: {updates} key updates posted, {held} pieces held for a key"
    );
    eprintln!("{runs} runs: {updates} key updates posted, {held} pieces held for a key");
}

fn mode() -> impl Strategy<Value = InFlight> {
    prop_oneof![
        Just(InFlight::Drop),
        Just(InFlight::LandLost),
        (0u64..200).prop_map(|ops| InFlight::Delay { ops }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Kill points, what becomes of the work in flight, delays, sizes, the peers' interleaving and
    /// the pool's size: every message once with its bytes, no write into a completed receive.
    #[test]
    fn no_write_lands_in_a_completed_receive_whatever_the_fault(
        npaths in 2usize..=3,
        plan in proptest::collection::vec(
            (0usize..2, prop_oneof![Just(0usize), 1usize..4096, 4096usize..=SLOT]), 4..32),
        pool in prop_oneof![1usize..=3, 4usize..=12],
        ring in 1usize..=4,
        fault_peer in 0usize..2,
        fault_path in 0usize..3,
        // Per mille of a floor under the fewest work requests the plan executes (1.25 per
        // message; at least one data write, and a clear-to-send write for at most two entries:
        // 1.5), so the fault always fires.
        fault_permille in 0u64..1000,
        partial in any::<bool>(),
        mode in mode(),
        seed in proptest::option::weighted(0.8, 1u64..1000),
        standby in any::<bool>(),
        // With 3 paths, one standing by: a second fault on a carrying path or the activated
        // standby one, up to 40 work requests after the first (during the activation).
        second in proptest::option::of((1usize..3, 0u64..40)),
        // A slow sender (the receiver holds entries back and posts several in one write).
        send_gap in prop_oneof![Just(1usize), 2usize..8],
    ) {
        let fault_at = fault_permille * 5 * plan.len() as u64 / 4000;
        let c = Case {
            npaths,
            plan,
            pool,
            ring,
            fault_peer,
            fault_path: fault_path % npaths,
            fault_at,
            partial,
            mode,
            seed,
            standby,
            second: second.filter(|_| standby && npaths == 3),
            send_gap,
        };
        let seen = run(&c);
        prop_assert!(seen.fired, "the fault never fired in {} steps: {c:?}", seen.steps);
        prop_assert!(
            seen.violations.is_empty() && seen.corrupt.is_empty(),
            "wrong bytes at completion {:?}; writes into completed receives' buffers: {:?}",
            seen.corrupt,
            seen.violations
        );
    }
}

/// A buffer and its registration.
type Buf = (u64, MemHandle);
/// The fabric, the comms, the sender's endpoint, a buffer each side.
type Pair2 = (
    MemFab,
    SendComm<MemEndpoint>,
    RecvComm<MemEndpoint>,
    EpId,
    Buf,
    Buf,
);

/// A pair with two paths for the hostile-peer tests, a 48 KiB buffer each side.
fn pair2() -> Pair2 {
    let fab = MemFab::new(MemFabConfig::default());
    let (a, b) = fab.pair(&[100_000, 100_000], 0);
    let sid = a.id();
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    let src = fab.alloc(SLOT).unwrap();
    let dst = fab.alloc(SLOT).unwrap();
    let smh = s
        .reg_mr(&Lent::simulated(src, SLOT), MemKind::Host)
        .unwrap();
    let rmh = r
        .reg_mr(&Lent::simulated(dst, SLOT), MemKind::Host)
        .unwrap();
    (fab, s, r, sid, (src, smh), (dst, rmh))
}

/// The fence's words come from the peer: a receiver that answers a stop with a snapshot behind
/// the receive it posted (here: a slot never used) fails the send, naming the lie; nothing is
/// sent again on its word.
#[test]
fn a_lying_fence_snapshot_fails_the_send_and_names_it() {
    use switchless::transport::wire::{FIFO_DEPTH, FenceLayout, RECV_SNAP_WORDS, SLOT_WORDS};
    let (fab, mut s, mut r, sid, (src, smh), (dst, rmh)) = pair2();
    let now = Instant::now();
    let b = RecvBuf {
        addr: dst,
        size: SLOT as u64,
        tag: 0,
        mh: &rmh,
    };
    let _rq = r.irecv(now, &[b]).unwrap().unwrap();
    // Path 0's cable goes with the first write of the send: its piece there is parked.
    fab.kill_after(sid, 0, 0, false);
    let sq = s.isend(now, src, 40_000, 0, &smh).unwrap().unwrap();
    assert_eq!(s.test(now, sq).unwrap(), None);
    assert_eq!(s.paths_up(), vec![false, true]);
    // The "receiver" forges, in the sender's inbox area of path 1: an ack of every stop, and a
    // snapshot saying slot 0 was never used.
    let l = FenceLayout {
        npaths: 2,
        snap: RECV_SNAP_WORDS,
    };
    let inbox = s.local_info().addr + 8 * (FIFO_DEPTH * SLOT_WORDS) as u64;
    let area = inbox + 8 * l.area(1) as u64;
    fab.write(area + 8 * FenceLayout::SNAP as u64, &[0u8; 8])
        .unwrap();
    fab.write(area + 8 * FenceLayout::ACK as u64, &u64::MAX.to_le_bytes())
        .unwrap();
    let e = s.test(now, sq).unwrap_err().to_string();
    assert!(
        e.contains("failover snapshot") && e.contains("hostile"),
        "{e}"
    );
    assert_eq!(s.fence_stats().resent, 0);
}

/// A forged stop request (a `req` word naming path 1) costs this connection that path, not data:
/// both ends fail over from it and every message still arrives once with its bytes.
#[test]
fn a_forged_stop_request_costs_a_path_not_data() {
    use switchless::transport::wire::{FIFO_DEPTH, MAX_RECVS};
    let (fab, mut s, mut r, _sid, (src, smh), (dst, rmh)) = pair2();
    let mut now = Instant::now();
    let inbox = r.local_info().addr + 8 * (FIFO_DEPTH * MAX_RECVS) as u64;
    // Area of path 0, `req` word of path 1.
    fab.write(inbox + 8, &7u64.to_le_bytes()).unwrap();
    for m in 0..6 {
        let data = content(m, 40_000);
        fab.write(src, &data).unwrap();
        let b = RecvBuf {
            addr: dst,
            size: SLOT as u64,
            tag: 0,
            mh: &rmh,
        };
        let rq = r.irecv(now, &[b]).unwrap().unwrap();
        let mut sq = None;
        let (mut sent, mut got) = (false, false);
        for _ in 0..100 {
            if sq.is_none() {
                sq = s.isend(now, src, 40_000, 0, &smh).unwrap();
            }
            if let Some(q) = sq.filter(|_| !sent) {
                sent = s.test(now, q).unwrap().is_some();
            }
            if !got {
                got = r.test(now, rq).unwrap().is_some();
            }
            if sent && got {
                break;
            }
            now += Duration::from_millis(1);
        }
        assert!(sent && got, "message {m}");
        assert_eq!(fab.read(dst, 40_000).unwrap(), data, "message {m}");
    }
    assert_eq!(r.paths_up(), vec![true, false]);
    assert_eq!(s.paths_up(), vec![true, false]);
}

/// The key area and the header's keyless-paths bits come from the peer: a receiver whose entry
/// claims to lack every path's keys gets nothing written until a key update for that very entry
/// (its sequence number) lands; an update naming another sequence (a stale or forged one) moves
/// nothing; each path's pieces go once its own update is there, with the keys it carries.
#[test]
fn a_sender_writes_nothing_on_a_path_before_the_entrys_own_key_update() {
    use switchless::transport::wire::{
        FIFO_DEPTH, FenceLayout, KEY_WORDS, MAX_RECVS, RECV_SNAP_WORDS, SLOT_HDR, SLOT_IDX,
        SLOT_WORDS, encode_keys, key_area, key_area_words, slot_check, slot_entry_words,
        slot_keys_missing, with_keys_missing,
    };
    let (fab, mut s, mut r, sid, (src, smh), (dst, rmh)) = pair2();
    let mut now = Instant::now();
    let data = content(9, 40_000);
    fab.write(src, &data).unwrap();
    let b = RecvBuf {
        addr: dst,
        size: SLOT as u64,
        tag: 0,
        mh: &rmh,
    };
    let rq = r.irecv(now, &[b]).unwrap().unwrap();
    // The entry (slot 0, sequence 0) landed; the "receiver" rewrites its header: no keys.
    let fifo = s.local_info().addr;
    let word = |at: u64| u64::from_le_bytes(fab.read(at, 8).unwrap().try_into().unwrap());
    assert_eq!(word(fifo + 8 * SLOT_IDX as u64), 1);
    let hdr_at = fifo + 8 * SLOT_HDR as u64;
    assert_eq!(slot_keys_missing(word(hdr_at)), 0, "no path deferred here");
    fab.write(hdr_at, &with_keys_missing(word(hdr_at), 0xff).to_le_bytes())
        .unwrap();
    // ... and seals it with the check word of the words it now holds (a whole entry).
    let check_at = fifo + 8 * (slot_entry_words(1) - 1) as u64;
    let entry: Vec<u64> = (0..slot_entry_words(1) - 1)
        .map(|i| word(fifo + 8 * i as u64))
        .collect();
    fab.write(check_at, &slot_check(&entry).to_le_bytes())
        .unwrap();
    let sq = s.isend(now, src, 40_000, 0, &smh).unwrap().unwrap();
    let keys_at = fifo
        + 8 * (FIFO_DEPTH * SLOT_WORDS
            + FenceLayout {
                npaths: 2,
                snap: RECV_SNAP_WORDS,
            }
            .words()) as u64;
    assert!(s.local_info().words as usize * 8 >= (keys_at - fifo) as usize + 8 * key_area_words(2));
    let update = |k: usize, seq: u64| {
        let mut rkeys = [0u32; MAX_RECVS];
        rkeys[0] = rmh.registration().keys[k].rkey;
        let mut w = [0u64; KEY_WORDS];
        encode_keys(seq, &rkeys, &mut w);
        let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
        fab.write(keys_at + 8 * key_area(k, 0) as u64, &bytes)
            .unwrap();
    };
    let mut spin = |s: &mut SendComm<MemEndpoint>, r: &mut RecvComm<MemEndpoint>, n: usize| {
        let mut done = (None, None);
        for _ in 0..n {
            if done.0.is_none() {
                done.0 = s.test(now, sq).unwrap();
            }
            if done.1.is_none() {
                done.1 = r.test(now, rq).unwrap();
            }
            fab.step();
            now += Duration::from_millis(1);
        }
        done
    };
    assert_eq!(spin(&mut s, &mut r, 20), (None, None));
    assert_eq!(fab.path_bytes(sid, 0) + fab.path_bytes(sid, 1), 0);
    // An update for the slot's next use (sequence 32) is not this entry's.
    update(0, FIFO_DEPTH as u64);
    update(1, FIFO_DEPTH as u64);
    assert_eq!(spin(&mut s, &mut r, 20), (None, None));
    assert_eq!(fab.path_bytes(sid, 0) + fab.path_bytes(sid, 1), 0);
    // Path 0's own update: its piece goes, path 1's still waits.
    update(0, 0);
    assert_eq!(spin(&mut s, &mut r, 20), (None, None));
    assert!(fab.path_bytes(sid, 0) > 0);
    assert_eq!(fab.path_bytes(sid, 1), 0);
    update(1, 0);
    let (sent, got) = spin(&mut s, &mut r, 20);
    assert_eq!(sent, Some(40_000));
    assert_eq!(got.unwrap().as_slice(), &[40_000]);
    assert_eq!(fab.read(dst, 40_000).unwrap(), data);
    assert!(fab.path_bytes(sid, 1) > 0);
    assert_eq!(s.fence_stats().keys, 2, "both pieces held for a key");
}
