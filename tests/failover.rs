//! Failover and failback over the in-memory fabric: a path killed at any point (before, during or
//! after a clear-to-send, mid-write, during failback) costs bandwidth, not the requests: every
//! message is delivered exactly once with the right bytes, nothing hangs (a bounded number of steps
//! on a virtual clock), nothing leaks; one WARN names the failed path, the survivors and the
//! bandwidth to expect; a request fails only when no path is left.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use switchless::error::Error;
use switchless::sys::Lent;
use switchless::transport::comm::{
    FailoverConfig, ProtocolConfig, RecvBuf, RecvComm, Request, SendComm, connect_pair,
};
use switchless::transport::fabric::MemKind;
use switchless::transport::memfab::{EpId, MemEndpoint, MemFab, MemFabConfig};
use switchless::transport::stripe::StripeParams;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Tests share the process; the leak test measures it alone.
static PROCESS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    PROCESS.read().unwrap_or_else(|e| e.into_inner())
}

struct Rig {
    fab: MemFab,
    s: SendComm<MemEndpoint>,
    r: RecvComm<MemEndpoint>,
    sid: EpId,
    now: Instant,
    /// Whether the fabric copies payload bytes (then every byte is checked).
    copies: bool,
}

fn pcfg() -> ProtocolConfig {
    ProtocolConfig {
        stripe: StripeParams {
            min_chunk: 4096,
            align: 128,
        },
        ..ProtocolConfig::default()
    }
}

fn rig(npaths: usize, fcfg: MemFabConfig, pcfg: ProtocolConfig) -> Rig {
    let fab = MemFab::new(fcfg);
    let (a, b) = fab.pair(&vec![100_000; npaths], 0);
    let sid = a.id();
    let (s, r) = connect_pair(a, b, pcfg).unwrap();
    Rig {
        fab,
        s,
        r,
        sid,
        now: Instant::now(),
        copies: fcfg.copy_data,
    }
}

/// [`rig`] whose sender marks `standby` data paths standby before the pair exchanges its control
/// info (what the plugin's connect does with the paths outside NCCL's device).
fn rig_standby(npaths: usize, standby: &[usize], fcfg: MemFabConfig, pcfg: ProtocolConfig) -> Rig {
    let fab = MemFab::new(fcfg);
    let (a, b) = fab.pair(&vec![100_000; npaths], 0);
    let sid = a.id();
    let mut s = SendComm::new(a, pcfg).unwrap();
    s.set_standby(standby).unwrap();
    let mut r = RecvComm::new(b, pcfg).unwrap();
    let (si, ri) = (s.local_info(), r.local_info());
    s.connect(ri).unwrap();
    r.connect(si).unwrap();
    Rig {
        fab,
        s,
        r,
        sid,
        now: Instant::now(),
        copies: fcfg.copy_data,
    }
}

/// What one run did.
#[derive(Debug, Default)]
struct Outcome {
    /// Receive completions per message (each must be exactly 1).
    received: Vec<u32>,
    /// Loop steps taken.
    steps: usize,
    /// Step at which the kill happened and the first step after it at which a receive completed.
    kill_step: Option<usize>,
    first_done_after_kill: Option<usize>,
}

/// Streams `sizes` (one message each, `window` in flight), tag 0, both sides in this thread; the
/// virtual clock moves 1 ms per step. `at_step` runs before each step (faults, restores). Checks
/// every byte when the fabric copies.
fn stream(
    g: &mut Rig,
    sizes: &[usize],
    window: usize,
    at_step: impl FnMut(&mut Rig, usize),
) -> Outcome {
    let total: usize = sizes.iter().sum::<usize>().max(1);
    let max = sizes.iter().copied().max().unwrap_or(0).max(1);
    let src = g.fab.alloc(max).unwrap();
    g.fab.write(src, &pattern(max, 7)).unwrap();
    let dst = g.fab.alloc(total).unwrap();
    stream_in(g, src, dst, sizes, window, at_step)
}

/// [`stream`] between buffers already allocated: `src` holds `pattern(max size, 7)`, `dst` has
/// room for every message (the memfab keeps data regions until it is dropped).
fn stream_in(
    g: &mut Rig,
    src: u64,
    dst: u64,
    sizes: &[usize],
    window: usize,
    mut at_step: impl FnMut(&mut Rig, usize),
) -> Outcome {
    let total: usize = sizes.iter().sum::<usize>().max(1);
    let max = sizes.iter().copied().max().unwrap_or(0).max(1);
    let copies = g.copies;
    let data = pattern(max, 7);
    let smh =
        g.s.reg_mr(&Lent::simulated(src, max), MemKind::Host)
            .unwrap();
    let rmh =
        g.r.reg_mr(&Lent::simulated(dst, total), MemKind::Host)
            .unwrap();
    let mut offs = Vec::with_capacity(sizes.len());
    let mut o = 0;
    for &sz in sizes {
        offs.push(o);
        o += sz;
    }
    let n = sizes.len();
    let mut out = Outcome {
        received: vec![0; n],
        ..Outcome::default()
    };
    let (mut rnext, mut snext) = (0, 0);
    let mut rq: Vec<(usize, Request)> = Vec::new();
    let mut sq: Vec<(usize, Request)> = Vec::new();
    let mut sent = 0;
    let mut killed_before = g.fab.kill_pending();
    // Bounded: a hang fails here, not by a test timeout.
    for step in 0..40_000 {
        at_step(g, step);
        if killed_before && !g.fab.kill_pending() && out.kill_step.is_none() {
            out.kill_step = Some(step);
        }
        killed_before = g.fab.kill_pending();
        out.steps = step;
        let now = g.now;
        while rnext < n && rq.len() < window {
            let b = RecvBuf {
                addr: dst + offs[rnext] as u64,
                size: sizes[rnext] as u64,
                tag: 0,
                mh: &rmh,
            };
            match g.r.irecv(now, &[b]).unwrap() {
                Some(q) => {
                    rq.push((rnext, q));
                    rnext += 1;
                }
                None => break,
            }
        }
        while snext < n && sq.len() < window {
            match g.s.isend(now, src, sizes[snext] as u64, 0, &smh).unwrap() {
                Some(q) => {
                    sq.push((snext, q));
                    snext += 1;
                }
                None => break,
            }
        }
        let mut k = 0;
        while k < rq.len() {
            if let Some(sz) = g.r.test(now, rq[k].1).unwrap() {
                let m = rq[k].0;
                assert_eq!(sz.as_slice(), &[sizes[m] as u64], "message {m}");
                out.received[m] += 1;
                if out.kill_step.is_some() && out.first_done_after_kill.is_none() {
                    out.first_done_after_kill = Some(step);
                }
                // A released request is gone: testing it again is an error, not a second
                // completion.
                assert!(g.r.test(now, rq[k].1).is_err());
                rq.remove(k);
            } else {
                k += 1;
            }
        }
        let mut k = 0;
        while k < sq.len() {
            if let Some(sz) = g.s.test(now, sq[k].1).unwrap() {
                assert_eq!(sz, sizes[sq[k].0] as u64);
                sq.remove(k);
                sent += 1;
            } else {
                k += 1;
            }
        }
        if sent == n && out.received.iter().all(|&c| c == 1) {
            break;
        }
        g.fab.step();
        g.now += Duration::from_millis(1);
    }
    assert!(
        sent == n && out.received.iter().all(|&c| c == 1),
        "hang: {sent} of {n} sends done, receives {:?}, paths up {:?} / {:?}",
        out.received,
        g.s.paths_up(),
        g.r.paths_up()
    );
    if copies {
        for m in 0..n {
            let got = g.fab.read(dst + offs[m] as u64, sizes[m]).unwrap();
            assert!(got == data[..sizes[m]], "message {m} of {} bytes", sizes[m]);
        }
    }
    g.s.dereg_mr(smh).unwrap();
    g.r.dereg_mr(rmh).unwrap();
    out
}

fn close(g: Rig) {
    let Rig { fab, s, r, .. } = g;
    s.close().unwrap();
    r.close().unwrap();
    assert_eq!(fab.live_keys(), 0, "registrations leaked");
}

/// Captures WARN and INFO events (a minimal `tracing` subscriber).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<(tracing::Level, String)>>>);

struct Text(String);
impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl tracing::Subscriber for Logs {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        let l = *e.metadata().level();
        if l <= tracing::Level::INFO {
            let mut t = Text(String::new());
            e.record(&mut t);
            self.0.lock().unwrap().push((l, t.0));
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Logs {
    fn at(&self, level: tracing::Level) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| *l == level)
            .map(|(_, t)| t.clone())
            .collect()
    }
}

#[test]
fn a_path_killed_mid_stream_costs_bandwidth_not_messages() {
    let _p = shared();
    let logs = Logs::default();
    let l2 = logs.clone();
    let (out, up) = tracing::subscriber::with_default(l2, || {
        // Reordered delivery: work is in flight on both paths when the cable goes.
        let fcfg = MemFabConfig {
            reorder_seed: Some(5),
            copy_data: true,
            ..MemFabConfig::default()
        };
        let mut g = rig(2, fcfg, pcfg());
        let sizes = vec![1 << 20; 16];
        // After 40 work requests: CTS entries and data of the first messages are in flight.
        g.fab.kill_after(g.sid, 0, 40, false);
        let out = stream(&mut g, &sizes, 8, |_, _| {});
        let (k, d) = (out.kill_step.unwrap(), out.first_done_after_kill.unwrap());
        eprintln!(
            "kill at step {k}, next receive completed at step {d} (1 ms of virtual time each)"
        );
        assert!(d - k <= 2, "steps {k} to {d}");
        let up = (g.s.paths_up(), g.r.paths_up());
        close(g);
        (out, up)
    });
    assert_eq!(up.0, vec![false, true]);
    assert_eq!(up.1, vec![false, true]);
    let w = logs.at(tracing::Level::WARN);
    // One WARN per side (each sees the path fail), naming the path, the survivor and the bandwidth.
    assert_eq!(w.len(), 2, "{w:?}");
    for line in &w {
        assert!(
            line.contains("path [0] memfab ep")
                && line.contains("failing over to [1] memfab ep")
                && line.contains("expect about 100.00 Gb/s (was 200.00 Gb/s)"),
            "{line}"
        );
    }
    assert!(out.received.iter().all(|&c| c == 1));
}

#[test]
fn a_write_cut_mid_way_lands_again_whole_on_the_survivor() {
    let _p = shared();
    // Every kill point over the first few hundred work requests, with the write under way half
    // landed: the CTS writes, data writes and size records of both directions all get hit.
    for seed in [None, Some(3)] {
        for at in 0..120u64 {
            let fcfg = MemFabConfig {
                reorder_seed: seed,
                copy_data: true,
                ..MemFabConfig::default()
            };
            let mut g = rig(3, fcfg, pcfg());
            let sizes: Vec<usize> = (0..10).map(|i| [0, 100, 20_000, 70_001][i % 4]).collect();
            g.fab.kill_after(g.sid, (at % 3) as usize, at, true);
            stream(&mut g, &sizes, 4, |_, _| {});
            close(g);
        }
    }
}

#[test]
fn the_last_path_failing_fails_the_request_with_its_error() {
    let _p = shared();
    let mut g = rig(2, MemFabConfig::default(), pcfg());
    let src = g.fab.alloc(64).unwrap();
    let dst = g.fab.alloc(64).unwrap();
    let smh =
        g.s.reg_mr(&Lent::simulated(src, 64), MemKind::Host)
            .unwrap();
    let rmh =
        g.r.reg_mr(&Lent::simulated(dst, 64), MemKind::Host)
            .unwrap();
    g.fab.kill_path(g.sid, 0);
    g.fab.kill_path(g.sid, 1);
    let b = RecvBuf {
        addr: dst,
        size: 64,
        tag: 0,
        mh: &rmh,
    };
    // The clear-to-send fails over from path 0 to path 1, which fails too: nothing left.
    let mut err = None;
    let rr = g.r.irecv(g.now, &[b]).unwrap().unwrap();
    for _ in 0..10 {
        match g.r.test(g.now, rr) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("a receive with every path dead completed"),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("the receive fails");
    assert!(matches!(err, Error::System(_)), "{err}");
    assert!(
        err.to_string().contains("path 1 (memfab ep1 path1")
            && err.to_string().contains("Work Request Flushed Error"),
        "{err}"
    );
    assert_eq!(g.r.paths_up(), vec![false, true], "the last path stays");
    let _ = (smh, src);
}

#[test]
fn failover_off_keeps_the_old_behaviour() {
    let _p = shared();
    let off = ProtocolConfig {
        failover: FailoverConfig {
            enabled: false,
            ..FailoverConfig::default()
        },
        ..pcfg()
    };
    let mut g = rig(2, MemFabConfig::default(), off);
    let src = g.fab.alloc(1 << 20).unwrap();
    let dst = g.fab.alloc(1 << 20).unwrap();
    let smh =
        g.s.reg_mr(&Lent::simulated(src, 1 << 20), MemKind::Host)
            .unwrap();
    let rmh =
        g.r.reg_mr(&Lent::simulated(dst, 1 << 20), MemKind::Host)
            .unwrap();
    let b = RecvBuf {
        addr: dst,
        size: 1 << 20,
        tag: 0,
        mh: &rmh,
    };
    let rr = g.r.irecv(g.now, &[b]).unwrap().unwrap();
    g.fab.kill_path(g.sid, 1);
    let sr = g.s.isend(g.now, src, 1 << 20, 0, &smh).unwrap().unwrap();
    assert!(g.s.test(g.now, sr).is_err());
    assert!(g.r.test(g.now, rr).is_err());
    assert_eq!(g.s.paths_up(), vec![true, true]);
}

#[test]
fn a_path_comes_back_and_carries_traffic_again() {
    let _p = shared();
    let logs = Logs::default();
    let l2 = logs.clone();
    tracing::subscriber::with_default(l2, || {
        let mut g = rig(2, MemFabConfig::default(), pcfg());
        let sizes = vec![256 << 10; 40];
        let sid = g.sid;
        g.fab.kill_path(sid, 0);
        stream(&mut g, &sizes, 2, |_, _| {});
        assert_eq!(g.s.paths_up(), vec![false, true]);
        // Down for 3 s of virtual time, probed with backoff (100, 200, 400, 800 ms, ...) under
        // traffic; then the cable is back and the next probe rebuilds the path.
        let more = vec![16 << 10; 8000];
        let mut bytes_at_restore = 0;
        stream(&mut g, &more, 1, |g, step| {
            if step == 3000 {
                assert_eq!(g.s.paths_up(), vec![false, true]);
                g.fab.restore_path(sid, 0);
                bytes_at_restore = g.fab.path_bytes(sid, 0);
            }
        });
        assert_eq!(g.s.paths_up(), vec![true, true]);
        assert_eq!(g.r.paths_up(), vec![true, true]);
        assert!(
            g.fab.path_bytes(sid, 0) > bytes_at_restore + (1 << 20),
            "path 0 carries data again"
        );
        close(g);
    });
    let info = logs.at(tracing::Level::INFO);
    let back: Vec<&String> = info.iter().filter(|l| l.contains("is back")).collect();
    assert_eq!(back.len(), 2, "{info:?}");
    assert!(
        back[0].contains("path [0] memfab ep") && back[0].contains("2 paths, about 200.00 Gb/s"),
        "{}",
        back[0]
    );
}

/// A standby path carries nothing while the carrying path is up; when that one's cable is pulled
/// mid-run the standby path takes over (one WARN per side names it), every message arrives once
/// with its bytes; when the cable is back the original carries again and the standby stands by.
#[test]
fn a_standby_path_takes_over_and_stands_by_again() {
    let _p = shared();
    let logs = Logs::default();
    let l2 = logs.clone();
    tracing::subscriber::with_default(l2, || {
        let fcfg = MemFabConfig {
            copy_data: true,
            ..MemFabConfig::default()
        };
        let mut g = rig_standby(2, &[1], fcfg, pcfg());
        let sid = g.sid;
        assert_eq!(g.s.paths_carrying(), vec![true, false]);
        assert_eq!(g.r.paths_carrying(), vec![true, false]);
        let out = stream(&mut g, &[1 << 20; 8], 4, |_, _| {});
        assert!(out.received.iter().all(|&c| c == 1));
        assert_eq!(g.fab.path_bytes(sid, 1), 0, "the standby path carried data");
        // Cable 0 pulled after 22 work requests (3 a message: clear-to-send, data, record), half
        // way through the 16 messages: messages are in flight on it.
        g.fab.kill_after(sid, 0, 22, true);
        let out = stream(&mut g, &[1 << 20; 16], 8, |_, _| {});
        assert!(out.received.iter().all(|&c| c == 1));
        let (k, d) = (out.kill_step.unwrap(), out.first_done_after_kill.unwrap());
        eprintln!("standby: kill at step {k}, next receive completed at step {d} (1 ms each)");
        assert!(d - k <= 2, "steps {k} to {d}");
        assert_eq!(g.s.paths_carrying(), vec![false, true]);
        assert!(
            g.fab.path_bytes(sid, 1) >= 8 << 20,
            "the standby path took over"
        );
        // Back after 2 s of virtual time: the next probe rebuilds path 0.
        let more = vec![16 << 10; 4000];
        stream(&mut g, &more, 1, |g, step| {
            if step == 2000 {
                g.fab.restore_path(sid, 0);
            }
        });
        assert_eq!(g.s.paths_carrying(), vec![true, false]);
        assert_eq!(g.r.paths_carrying(), vec![true, false]);
        let standby_bytes = g.fab.path_bytes(sid, 1);
        stream(&mut g, &[1 << 20; 4], 2, |_, _| {});
        assert_eq!(
            g.fab.path_bytes(sid, 1),
            standby_bytes,
            "standby carried after failback"
        );
        close(g);
    });
    let w = logs.at(tracing::Level::WARN);
    assert_eq!(w.len(), 2, "{w:?}");
    for line in &w {
        assert!(
            line.contains("path [0] memfab ep")
                && line.contains("failing over to standby [1] memfab ep")
                && line.contains("expect about 100.00 Gb/s (was 100.00 Gb/s)"),
            "{line}"
        );
    }
    let info = logs.at(tracing::Level::INFO);
    let back: Vec<&String> = info.iter().filter(|l| l.contains("is back")).collect();
    assert_eq!(back.len(), 2, "{info:?}");
    assert!(
        back.iter().any(|l| l.contains("standby [1] memfab ep")
            && l.contains("stands by again")
            && l.contains("1 paths, about 100.00 Gb/s")),
        "{back:?}"
    );
}

/// Comm-level version of the backend's 1000-cycle leak test, with failures: every cycle connects,
/// moves messages, kills a path in two of three cycles (at a different point each time), restores
/// it in some, and closes. Keys go back to zero each cycle and resident memory does not grow.
#[test]
fn thousand_cycles_with_failures_leak_nothing() {
    let _alone = PROCESS.write().unwrap_or_else(|e| e.into_inner());
    fn rss_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
    let fab = MemFab::new(MemFabConfig::default());
    let sizes = [8192, 0, 50_000];
    let src = fab.alloc(50_000).unwrap();
    fab.write(src, &pattern(50_000, 7)).unwrap();
    let dst = fab.alloc(58_192).unwrap();
    let cycle = |i: usize| {
        let (a, b) = fab.pair(&[100_000, 100_000], 0);
        let sid = a.id();
        let (s, r) = connect_pair(a, b, pcfg()).unwrap();
        let mut g = Rig {
            fab: fab.clone(),
            s,
            r,
            sid,
            now: Instant::now(),
            copies: true,
        };
        if i % 3 != 0 {
            g.fab.kill_after(sid, i % 2, (i % 17) as u64, i % 2 == 0);
        }
        stream_in(&mut g, src, dst, &sizes, 2, |g, step| {
            if i % 5 == 0 && step == 1 {
                g.fab.restore_path(sid, i % 2);
            }
        });
        let Rig { s, r, .. } = g;
        s.close().unwrap();
        r.close().unwrap();
        assert_eq!(fab.live_keys(), 0, "cycle {i}");
    };
    for i in 0..20 {
        cycle(i);
    }
    let rss = rss_kib();
    for i in 0..1000 {
        cycle(i);
    }
    let grown = rss_kib().saturating_sub(rss);
    // The fabric keeps its (emptied) regions and endpoints: a few hundred bytes per cycle.
    assert!(
        grown < 4096,
        "resident memory grew by {grown} KiB over 1000 cycles"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// 2–4 paths, 0 B–64 MiB messages (large ones rare, without payload copies), up to 16
    /// outstanding, a random path killed at a random point (maybe mid-write), sometimes restored
    /// later (failback under traffic), with 0–2 of the paths standby: every message exactly once,
    /// bytes checked, no hang, no leak.
    #[test]
    fn any_kill_point_delivers_every_message_exactly_once(
        npaths in 2usize..=4,
        big in proptest::bool::weighted(0.08),
        sizes in proptest::collection::vec(
            prop_oneof![Just(0usize), 1usize..4096, 4096usize..300_000], 1..24),
        window in 1usize..=16,
        kill_path in 0usize..4,
        kill_at in 0u64..400,
        partial in any::<bool>(),
        seed in proptest::option::of(1u64..1000),
        restore_at in proptest::option::of(0usize..40),
        standby in 0usize..3,
    ) {
        let _p = shared();
        let mut sizes = sizes;
        if big {
            // 8–64 MiB: a few of them, bytes not copied (sizes and exactly-once still checked).
            sizes.truncate(3);
            for (i, s) in sizes.iter_mut().enumerate() {
                *s = (8 << 20) << (i % 4);
            }
        }
        let fcfg = MemFabConfig {
            reorder_seed: seed,
            copy_data: !big,
            ..MemFabConfig::default()
        };
        // The last `standby` paths (0..=npaths-1 of them) are standby: a kill of a carrying path
        // hands its work to one of them.
        let standby: Vec<usize> = (npaths - standby.min(npaths - 1)..npaths).collect();
        let mut g = rig_standby(npaths, &standby, fcfg, pcfg());
        let kp = kill_path % npaths;
        g.fab.kill_after(g.sid, kp, kill_at, partial);
        let sid = g.sid;
        let out = stream(&mut g, &sizes, window, |g, step| {
            if restore_at == Some(step) {
                g.fab.restore_path(sid, kp);
            }
        });
        prop_assert!(out.received.iter().all(|&c| c == 1));
        close(g);
    }
}

#[test]
fn a_health_error_about_one_path_fails_over_instead_of_failing_the_send() {
    let _p = shared();
    let mut g = rig(2, MemFabConfig::default(), pcfg());
    let src = g.fab.alloc(64).unwrap();
    let smh =
        g.s.reg_mr(&Lent::simulated(src, 64), MemKind::Host)
            .unwrap();
    // Waiting for a clear-to-send: the device reports trouble, and path 0's cable is out. (The
    // devices are asked at most once per millisecond of the caller's clock.)
    assert_eq!(g.s.isend(g.now, src, 64, 0, &smh).unwrap(), None);
    g.fab
        .set_health_error(g.sid, Some("rxe_eth2 port 1 has been down for 1.2 s"));
    g.fab.kill_path(g.sid, 0);
    g.now += Duration::from_millis(1);
    assert_eq!(g.s.isend(g.now, src, 64, 0, &smh).unwrap(), None);
    assert_eq!(g.s.paths_up(), vec![false, true]);
    // With one path left the same report concerns the connection: the send fails as before.
    g.now += Duration::from_millis(1);
    let e = g.s.isend(g.now, src, 64, 0, &smh).unwrap_err();
    assert!(e.to_string().contains("has been down for 1.2 s"), "{e}");
}

/// `iflush` across failover (GB300, pre-Hopper GPUs, `NCCL_NET_FORCE_FLUSH`): a device whose data
/// path died between the data and the flush is left out (or, found dead by its flush read, marked
/// down), and the flush completes on the devices left; it fails only when none is.
/// A GPU receive's flush reads only through devices a receive may have written through: not a
/// standby path's device while it stands by (the receiving side has not registered there; it did
/// read there when it registered everywhere at once), and that device once failover made it
/// carry.
#[test]
fn a_flush_skips_a_standby_device_until_it_carries() {
    use switchless::transport::comm::FlushBuf;
    let _p = shared();
    let fab = MemFab::new(MemFabConfig::default());
    // Data path i and loopback path 2 + i are device i; data path 1 stands by.
    let (a, b) = fab.pair(&[100_000, 100_000], 2);
    let (sid, rid) = (a.id(), b.id());
    let mut s = SendComm::new(a, pcfg()).unwrap();
    s.set_standby(&[1]).unwrap();
    let mut r = RecvComm::new(b, pcfg()).unwrap();
    let (si, ri) = (s.local_info(), r.local_info());
    s.connect(ri).unwrap();
    r.connect(si).unwrap();
    let len = 64 << 10;
    let src = fab.alloc(len).unwrap();
    fab.write(src, &pattern(len, 3)).unwrap();
    let dst = fab.alloc(len).unwrap();
    let smh = s.reg_mr(&Lent::simulated(src, len), MemKind::Host).unwrap();
    let rmh = r.reg_mr(&Lent::simulated(dst, len), MemKind::Cuda).unwrap();
    assert_eq!(fab.registrations_on(rid, 1), 0, "eager on the standby path");
    let mut now = Instant::now();
    let mut one = |s: &mut SendComm<MemEndpoint>, r: &mut RecvComm<MemEndpoint>| {
        let b = RecvBuf {
            addr: dst,
            size: len as u64,
            tag: 0,
            mh: &rmh,
        };
        let rq = r.irecv(now, &[b]).unwrap().unwrap();
        let (mut sq, mut sent, mut got) = (None, false, false);
        for _ in 0..1000 {
            if sq.is_none() {
                sq = s.isend(now, src, len as u64, 0, &smh).unwrap();
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
            fab.step();
            now += Duration::from_millis(1);
        }
        assert!(sent && got);
        let f = FlushBuf {
            addr: dst,
            size: len as u64,
            mh: &rmh,
        };
        let reads = fab.stats().reads;
        let q = r
            .iflush(now, &[f])
            .unwrap()
            .expect("GPU data needs a flush");
        while r.test(now, q).unwrap().is_none() {}
        fab.stats().reads - reads
    };
    assert_eq!(one(&mut s, &mut r), 1, "device 0's read only");
    assert_eq!(fab.path_bytes(sid, 1), 0);
    // Cable 0 pulled: the standby path carries, both sides register there, the flush reads on
    // its device (device 0 has no usable data path any more).
    fab.kill_path(sid, 0);
    assert_eq!(one(&mut s, &mut r), 1, "device 1's read");
    assert!(fab.path_bytes(sid, 1) > 0);
    assert_eq!(r.paths_up(), vec![false, true]);
    assert_eq!(fab.registrations_on(rid, 1), 1);
    s.dereg_mr(smh).unwrap();
    r.dereg_mr(rmh).unwrap();
}

#[test]
fn a_flush_goes_on_without_a_dead_device_and_fails_only_with_none_left() {
    use switchless::transport::comm::FlushBuf;
    let _p = shared();
    let fab = MemFab::new(MemFabConfig::default());
    // Data path i and loopback path 2 + i are device i.
    let (a, b) = fab.pair(&[100_000, 100_000], 2);
    let (sid, rid) = (a.id(), b.id());
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    let len = 64 << 10;
    let src = fab.alloc(len).unwrap();
    fab.write(src, &pattern(len, 3)).unwrap();
    let dst = fab.alloc(len).unwrap();
    let smh = s.reg_mr(&Lent::simulated(src, len), MemKind::Host).unwrap();
    let rmh = r.reg_mr(&Lent::simulated(dst, len), MemKind::Cuda).unwrap();
    let now = Instant::now();
    let b = RecvBuf {
        addr: dst,
        size: len as u64,
        tag: 0,
        mh: &rmh,
    };
    let rq = r.irecv(now, &[b]).unwrap().unwrap();
    let sq = s.isend(now, src, len as u64, 0, &smh).unwrap().unwrap();
    assert_eq!(s.test(now, sq).unwrap(), Some(len as u64));
    assert!(r.test(now, rq).unwrap().is_some());
    assert!(
        fab.path_bytes(sid, 0) > 0 && fab.path_bytes(sid, 1) > 0,
        "striped"
    );
    let flush = |r: &mut RecvComm<MemEndpoint>| {
        let f = FlushBuf {
            addr: dst,
            size: len as u64,
            mh: &rmh,
        };
        let q = r.iflush(now, &[f])?.expect("GPU data needs a flush");
        loop {
            if let Some(sz) = r.test(now, q)? {
                return Ok::<_, Error>(sz);
            }
        }
    };
    // Cable 0 pulled and device 0's loopback dead, before the receiver noticed: its flush read
    // fails, device 0's data path is marked down, the read on device 1 completes the flush.
    fab.kill_path(sid, 0);
    fab.kill_path(rid, 2);
    let reads = fab.stats().reads;
    assert!(flush(&mut r).unwrap().as_slice().is_empty());
    assert_eq!(r.paths_up(), vec![false, true]);
    assert_eq!(fab.stats().reads - reads, 1, "device 1's read");
    // Device 0 left out from now on.
    let reads = fab.stats().reads;
    assert!(flush(&mut r).is_ok());
    assert_eq!(fab.stats().reads - reads, 1);
    // The last device's loopback dead too: the flush fails, naming it.
    fab.kill_path(rid, 3);
    let e = flush(&mut r).unwrap_err().to_string();
    assert!(e.contains("loopback1") && e.contains("flush read"), "{e}");
    s.dereg_mr(smh).unwrap();
    r.dereg_mr(rmh).unwrap();
}

/// Review S1: what an idle poll costs. NCCL's progress thread calls `test` on a receive whose data
/// has not come, and `isend` while no clear-to-send has, in a tight loop (here 1000 calls each,
/// 1 µs apart). Each `Fabric::health` / `path_health` call was a `read(2)` of the verbs async event
/// fd; they now run at most once per millisecond of the caller's clock.
#[test]
fn an_idle_poll_asks_about_path_health_at_a_bounded_rate() {
    let _p = shared();
    let fab = MemFab::new(MemFabConfig::default());
    let (a, b) = fab.pair(&[100_000, 100_000], 0);
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    let buf = fab.alloc(4096).unwrap();
    let smh = s
        .reg_mr(&Lent::simulated(buf, 4096), MemKind::Host)
        .unwrap();
    let rmh = r
        .reg_mr(&Lent::simulated(buf, 4096), MemKind::Host)
        .unwrap();
    let mut now = Instant::now();
    // An idle send: no clear-to-send.
    let before = fab.stats();
    for _ in 0..1000 {
        assert_eq!(s.isend(now, buf, 64, 0, &smh).unwrap(), None);
        now += Duration::from_micros(1);
    }
    let mid = fab.stats();
    // An idle receive: its clear-to-send is out, no data comes (the tag matches no send).
    let b = RecvBuf {
        addr: buf,
        size: 4096,
        tag: 9,
        mh: &rmh,
    };
    let q = r.irecv(now, &[b]).unwrap().unwrap();
    let mid2 = fab.stats();
    for _ in 0..1000 {
        assert!(r.test(now, q).unwrap().is_none());
        now += Duration::from_micros(1);
    }
    let after = fab.stats();
    let send = (
        mid.health_calls - before.health_calls,
        mid.path_health_calls - before.path_health_calls,
    );
    let recv = (
        after.health_calls - mid2.health_calls,
        after.path_health_calls - mid2.path_health_calls,
    );
    eprintln!(
        "per 1000 idle rounds over 2 paths (1 ms): isend without clear-to-send: {} health + {} \
         path_health calls; test of a receive: {} + {}",
        send.0, send.1, recv.0, recv.1
    );
    assert!(
        send.0 + send.1 <= 4 && recv.0 + recv.1 <= 4,
        "{send:?} {recv:?}"
    );
}

/// Review C6: a standby path that carries nothing and fails costs no bandwidth; with hundreds of
/// connections on a cable that is only standby, a WARN each would flood the log. It is an INFO
/// line; the carrying path failing later still WARNs (and finds no standby to take over).
#[test]
fn a_standby_path_that_fails_while_standing_by_is_an_info_line() {
    let _p = shared();
    let logs = Logs::default();
    let l2 = logs.clone();
    tracing::subscriber::with_default(l2, || {
        let mut g = rig_standby(3, &[2], MemFabConfig::default(), pcfg());
        let sid = g.sid;
        g.fab.kill_path(sid, 2);
        let out = stream(&mut g, &[64 << 10; 8], 4, |_, _| {});
        assert!(out.received.iter().all(|&c| c == 1));
        assert_eq!(g.s.paths_up(), vec![true, true, false]);
        assert_eq!(g.r.paths_up(), vec![true, true, false]);
        close(g);
    });
    assert!(
        logs.at(tracing::Level::WARN).is_empty(),
        "{:?}",
        logs.at(tracing::Level::WARN)
    );
    let info = logs.at(tracing::Level::INFO);
    assert!(
        info.iter()
            .any(|l| l.contains("standby path [2] memfab ep") && l.contains("failed")),
        "{info:?}"
    );
}

/// The sending side registers on a standby path only at its first use (issue 27 S3): until
/// failover its device pins nothing of the connection's buffers; the failover registers every
/// live buffer there and the moved and later messages arrive with their bytes; a registration
/// made concurrently through the pinner (NCCL's `regMr` outside the comm's lock) is keyed there
/// whichever side of the activation it files on; and releasing registrations that never met the
/// standby path leaves nothing behind.
#[test]
fn a_standby_path_registers_only_at_its_first_use() {
    let _p = shared();
    let fcfg = MemFabConfig {
        copy_data: true,
        ..MemFabConfig::default()
    };
    let mut g = rig_standby(2, &[1], fcfg, pcfg());
    let sid = g.sid;
    let rid = g.r.fabric().id();
    let base_keys = g.fab.live_keys();
    // A registration that never sees failover: nothing on the standby path, released clean.
    let spare = g.fab.alloc(1 << 16).unwrap();
    let mh =
        g.s.reg_mr(&Lent::simulated(spare, 1 << 16), MemKind::Host)
            .unwrap();
    assert_eq!(g.fab.registrations_on(sid, 0), 1);
    assert_eq!(
        g.fab.registrations_on(sid, 1),
        0,
        "eager on the standby path"
    );
    g.s.dereg_mr(mh).unwrap();
    assert_eq!(
        g.fab.live_keys(),
        base_keys,
        "a released registration left keys"
    );
    // Before failover: traffic, and still nothing pinned for the standby path.
    // Both sides: the receiving side hands no standby keys over in its clear-to-send entries.
    let mut seen_before = Vec::new();
    stream(&mut g, &[1 << 20; 8], 4, |g, _| {
        seen_before.push((
            g.fab.registrations_on(sid, 1),
            g.fab.registrations_on(rid, 0),
            g.fab.registrations_on(rid, 1),
        ));
    });
    assert!(
        seen_before.iter().all(|&s| s == (0, 1, 0)),
        "(sender on standby, receiver on carrying, receiver on standby): {seen_before:?}"
    );
    // A registration filed through the pinner before the failover, adopted after it.
    let early = g.fab.alloc(1 << 16).unwrap();
    g.fab.write(early, &pattern(1 << 16, 3)).unwrap();
    let pinner = g.s.pinner().expect("memfab pins without the comm");
    let early_reg = pinner
        .register(&Lent::simulated(early, 1 << 16), MemKind::Host)
        .unwrap();
    assert!(!early_reg.has(1), "the standby path was keyed at once");
    // Cable 0 pulled mid-run (22 work requests, 3 a message): the standby path takes over and is
    // registered at that moment.
    g.fab.kill_after(sid, 0, 22, true);
    let mut seen_after = Vec::new();
    let mut recv_after = Vec::new();
    let out = stream(&mut g, &[1 << 20; 16], 8, |g, step| {
        seen_after.push((step, g.fab.registrations_on(sid, 1)));
        recv_after.push((step, g.fab.registrations_on(rid, 1)));
    });
    assert!(out.received.iter().all(|&c| c == 1));
    assert_eq!(g.s.paths_carrying(), vec![false, true]);
    assert!(
        g.fab.path_bytes(sid, 1) >= 8 << 20,
        "the standby path took over"
    );
    let kill = out.kill_step.unwrap();
    assert!(
        seen_after.iter().any(|&(s, n)| s > kill && n == 2),
        "the stream's buffer and the pinner's early one on the standby path: {seen_after:?}"
    );
    // The receiving side: its stream buffer, on the standby path only from the failover on (the
    // step whose start records the kill runs after the one in which it happened);
    // the receives posted before it (8 in flight) got the keys in key updates.
    assert!(
        recv_after.iter().all(|&(s, n)| n == usize::from(s >= kill)),
        "receiver's registrations on the standby path (kill at step {kill}): {recv_after:?}"
    );
    assert!(g.r.fence_stats().keys > 0, "{:?}", g.r.fence_stats());
    assert!(g.s.fence_stats().keys > 0, "{:?}", g.s.fence_stats());
    eprintln!(
        "receiving side, registrations on the standby path: before failover {:?}, after {:?}; key updates {}, pieces held for a key {}",
        seen_before.last().map(|s| s.2),
        recv_after.last().map(|s| s.1),
        g.r.fence_stats().keys,
        g.s.fence_stats().keys
    );
    // The early registration, filed now: it has the standby path's keys and carries a message.
    let early_mh = g.s.adopt(early, 1 << 16, MemKind::Host, early_reg).unwrap();
    assert!(early_mh.registration().has(1), "{early_mh:?}");
    // One registered after the activation gets the standby path's keys at once.
    let late = g.fab.alloc(1 << 16).unwrap();
    let late_reg = pinner
        .register(&Lent::simulated(late, 1 << 16), MemKind::Host)
        .unwrap();
    assert!(late_reg.has(1));
    pinner.deregister(&late_reg).unwrap();
    let dst = g.fab.alloc(1 << 16).unwrap();
    let rmh =
        g.r.reg_mr(&Lent::simulated(dst, 1 << 16), MemKind::Host)
            .unwrap();
    let now = g.now;
    let rq =
        g.r.irecv(
            now,
            &[RecvBuf {
                addr: dst,
                size: 1 << 16,
                tag: 0,
                mh: &rmh,
            }],
        )
        .unwrap()
        .unwrap();
    let (mut sq, mut sent, mut got) = (None, false, None);
    for _ in 0..1000 {
        if sq.is_none() {
            sq = g.s.isend(now, early, 1 << 16, 0, &early_mh).unwrap();
        }
        if let (Some(q), false) = (sq, sent) {
            sent = g.s.test(now, q).unwrap().is_some();
        }
        if got.is_none() {
            got = g.r.test(now, rq).unwrap();
        }
        if sent && got.is_some() {
            break;
        }
        g.fab.step();
    }
    assert!(sent);
    assert_eq!(got.unwrap().as_slice(), &[1 << 16]);
    assert_eq!(g.fab.read(dst, 1 << 16).unwrap(), pattern(1 << 16, 3));
    g.s.dereg_mr(early_mh).unwrap();
    g.r.dereg_mr(rmh).unwrap();
    assert_eq!(g.fab.registrations_on(sid, 1), 0, "released on both paths");
    assert_eq!(g.fab.registrations_on(rid, 1), 0, "released on both paths");
    close(g);
}
