//! The rate-modelled fabric in virtual time, driven by the real protocol (SendComm / RecvComm): a
//! path moves N bytes in latency + wire bytes × 8 / rate, the sender's completion comes one latency
//! later, paths on one PCIe root share its cap, unequal paths are filled in proportion, and two runs
//! of the same program give the same event trace. Every expected time is computed from the model's
//! stated formulas, so a clock or pacing error fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use switchless::sys::Lent;
use switchless::transport::comm::{
    MemHandle, ProtocolConfig, RecvBuf, RecvComm, Request, SendComm, connect_pair,
};
use switchless::transport::fabric::{Fabric, LocalSeg, MemKind, RemoteSeg, WcOpcode, WriteWr};
use switchless::transport::modelfab::link::{Framing, Topology, serialize_ps};
use switchless::transport::modelfab::{ModelEndpoint, ModelFab, ModelFabConfig};

fn fab(spec: &str, caps: &str, framing: Framing, trace: bool) -> ModelFab {
    ModelFab::new(ModelFabConfig {
        topology: Topology::parse(spec, caps, framing).unwrap(),
        copy_data: true,
        trace,
    })
    .unwrap()
}

#[test]
fn one_write_lands_after_latency_plus_wire_time_and_completes_one_latency_later() {
    let f = fab("100G/2us", "", Framing::default(), true);
    let (mut a, mut b) = f.pair(0, 1).unwrap();
    let len = 1 << 20;
    let src = f.alloc(len).unwrap();
    let dst = f.alloc(len).unwrap();
    f.write(src, &vec![7u8; len]).unwrap();
    let ra = a
        .register(&Lent::simulated(src, len), MemKind::Host)
        .unwrap();
    let rb = b
        .register(&Lent::simulated(dst, len), MemKind::Host)
        .unwrap();
    b.post_recv(0, 9).unwrap();
    a.post_write(
        0,
        &WriteWr {
            wr_id: 1,
            local: LocalSeg {
                addr: src,
                len: len as u32,
                lkey: ra.keys[0].lkey,
            },
            remote: RemoteSeg {
                addr: dst,
                rkey: rb.keys[0].rkey,
            },
            imm: Some(5),
            signaled: true,
            inline: false,
        },
    )
    .unwrap();
    // 1 MiB at MTU 4096: 256 packets of 82 B framing, RETH 16, ImmDt 4.
    let wire = (1u64 << 20) + 256 * 82 + 16 + 4;
    let land = 2_000_000 + serialize_ps(wire, 100_000_000_000);
    assert_eq!(f.advance().unwrap(), Some(land));
    let mut out = Vec::new();
    assert_eq!(a.poll(0, 4, &mut out).unwrap(), 0, "no ACK yet");
    assert_eq!(b.poll(0, 4, &mut out).unwrap(), 1);
    assert_eq!(out[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(out[0].byte_len, len as u32);
    let mut got = vec![0u8; len];
    f.read_into(dst, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 7));
    assert_eq!(f.advance().unwrap(), Some(land + 2_000_000));
    out.clear();
    assert_eq!(a.poll(0, 4, &mut out).unwrap(), 1);
    assert!(out[0].status.is_success());
    assert_eq!(f.advance().unwrap(), None, "nothing left in flight");
}

struct Pair {
    f: ModelFab,
    s: SendComm<ModelEndpoint>,
    r: RecvComm<ModelEndpoint>,
    sa: u64,
    smh: MemHandle,
    ra: u64,
    rmh: MemHandle,
}

fn pair(f: ModelFab, slots: usize, size: usize) -> Pair {
    let (a, b) = f.pair(0, 1).unwrap();
    let (mut s, mut r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    let len = slots * size;
    let sa = f.alloc(len).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    f.write(sa, &data).unwrap();
    let ra = f.alloc(len).unwrap();
    let smh = s.reg_mr(&Lent::simulated(sa, len), MemKind::Host).unwrap();
    let rmh = r.reg_mr(&Lent::simulated(ra, len), MemKind::Host).unwrap();
    Pair {
        f,
        s,
        r,
        sa,
        smh,
        ra,
        rmh,
    }
}

fn at(ps: u64) -> Instant {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(Instant::now) + Duration::from_nanos(ps / 1000)
}

/// Streams `count` messages of `size` bytes, `window` in flight, both sides in this thread; returns
/// the virtual time (ps) at which each receive completed.
fn stream(p: &mut Pair, size: usize, count: usize, window: usize) -> Vec<u64> {
    let mut done_at = vec![0u64; count];
    let mut rq: Vec<(usize, Request)> = vec![];
    let mut sq: Vec<(usize, Request)> = vec![];
    let (mut rnext, mut snext, mut rdone, mut sdone) = (0, 0, 0, 0);
    while rdone < count || sdone < count {
        let now = at(p.f.now_ps().unwrap());
        let mut progress = false;
        while rnext < count && rq.len() < window {
            let slot = (rnext % window) * size;
            let buf = RecvBuf {
                addr: p.ra + slot as u64,
                size: size as u64,
                tag: 1,
                mh: &p.rmh,
            };
            match p.r.irecv(now, &[buf]).unwrap() {
                Some(q) => {
                    rq.push((rnext, q));
                    rnext += 1;
                    progress = true;
                }
                None => break,
            }
        }
        while snext < count && sq.len() < window {
            let slot = (snext % window) * size;
            match p
                .s
                .isend(now, p.sa + slot as u64, size as u64, 1, &p.smh)
                .unwrap()
            {
                Some(q) => {
                    sq.push((snext, q));
                    snext += 1;
                    progress = true;
                }
                None => break,
            }
        }
        let mut k = 0;
        while k < rq.len() {
            if let Some(sz) = p.r.test(now, rq[k].1).unwrap() {
                assert_eq!(sz.as_slice(), &[size as u64]);
                done_at[rq[k].0] = p.f.now_ps().unwrap();
                rq.remove(k);
                rdone += 1;
                progress = true;
            } else {
                k += 1;
            }
        }
        let mut k = 0;
        while k < sq.len() {
            if p.s.test(now, sq[k].1).unwrap().is_some() {
                sq.remove(k);
                sdone += 1;
                progress = true;
            } else {
                k += 1;
            }
        }
        if !progress {
            assert!(
                p.f.advance().unwrap().is_some(),
                "deadlock: nothing in flight"
            );
        }
    }
    done_at
}

#[test]
fn a_message_through_the_protocol_costs_cts_then_one_data_write() {
    let f = fab("50G/1.5us", "", Framing::default(), false);
    let size = 256 * 1024;
    let mut p = pair(f.clone(), 1, size);
    let t = stream(&mut p, size, 1, 1)[0];
    let topo = f.topology().unwrap();
    let rate = 50_000_000_000;
    // The receive is posted first: its clear-to-send (one write: index, header, one element,
    // check word) reaches the sender; the sender then writes the data, one piece in one write,
    // with the immediate (its length is the size: no size record).
    let entry = 8 * (1 + 1 + 7 + 1);
    let cts = serialize_ps(topo.framing.wire_bytes(entry, false), rate) + 1_500_000;
    let data = serialize_ps(topo.framing.wire_bytes(size as u64, true), rate) + 1_500_000;
    assert_eq!(t, cts + data);
    let mut got = vec![0u8; size];
    f.read_into(p.ra, &mut got).unwrap();
    let want: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    assert!(got == want, "payload arrived intact");
}

/// Writes delivered for one message of `size` bytes whose receive was posted first: those of the
/// clear-to-send (before the send) and those of the send itself.
fn writes_per_message(spec: &str, size: usize) -> (u64, u64) {
    let f = fab(spec, "", Framing::default(), false);
    let mut p = pair(f.clone(), 1, size);
    let now = at(0);
    let buf = RecvBuf {
        addr: p.ra,
        size: size as u64,
        tag: 1,
        mh: &p.rmh,
    };
    let rq = p.r.irecv(now, &[buf]).unwrap().unwrap();
    while f.advance().unwrap().is_some() {}
    let cts = f.stats().unwrap().writes;
    let sq =
        p.s.isend(now, p.sa, size as u64, 1, &p.smh)
            .unwrap()
            .unwrap();
    let (mut rdone, mut sdone) = (false, false);
    while !(rdone && sdone) {
        let now = at(f.now_ps().unwrap());
        if !rdone {
            if let Some(sz) = p.r.test(now, rq).unwrap() {
                assert_eq!(sz.as_slice(), &[size as u64]);
                rdone = true;
            }
        }
        if !sdone {
            sdone = p.s.test(now, sq).unwrap().is_some();
        }
        if !(rdone && sdone) {
            assert!(
                f.advance().unwrap().is_some(),
                "deadlock: nothing in flight"
            );
        }
    }
    let mut got = vec![0u8; size];
    f.read_into(p.ra, &mut got).unwrap();
    let want: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    assert!(got == want, "payload arrived intact");
    (cts, f.stats().unwrap().writes - cts)
}

#[test]
fn a_small_message_whose_receive_was_posted_first_is_one_write() {
    // The clear-to-send: one write (issue 36). The send: the data write with the immediate, its
    // length the size (no size record), on one or on several paths.
    for spec in ["400G/1us", "400G/1us,400G/1us", "92.57G/1.2us,97.28G/1.2us"] {
        for size in [1, 8, 4096, 60 * 1024] {
            assert_eq!(writes_per_message(spec, size), (1, 1), "{spec} {size} B");
        }
    }
    // Empty: the record alone carries the immediate.
    assert_eq!(writes_per_message("400G/1us", 0), (1, 1));
    // Split over two paths: a data write per piece, and the size record after piece 0.
    assert_eq!(writes_per_message("400G/1us,400G/1us", 1 << 20), (1, 3));
}

/// Steady-state receive rate in Gb/s of the second half of a stream.
fn steady_gbps(done: &[u64], size: usize) -> f64 {
    let h = done.len() / 2;
    let dt = (done[done.len() - 1] - done[h - 1]) as f64 * 1e-12;
    ((done.len() - h) * size * 8) as f64 / dt / 1e9
}

#[test]
fn a_stream_runs_at_the_line_rate_less_framing() {
    let f = fab("100G/1us", "", Framing::default(), false);
    let size = 512 * 1024;
    let mut p = pair(f, 8, size);
    let g = steady_gbps(&stream(&mut p, size, 64, 8), size);
    let framing = 4096.0 / (4096.0 + 82.0);
    // Per 512 KiB message also a 8 B record and a CTS in the other direction: well under 0.1 %.
    assert!(
        (g / (100.0 * framing) - 1.0).abs() < 1e-3,
        "{g} Gb/s, want {}",
        100.0 * framing
    );
    let f = fab("100G/1us", "", Framing::Ideal, false);
    let mut p = pair(f, 8, size);
    let g = steady_gbps(&stream(&mut p, size, 64, 8), size);
    assert!((g / 100.0 - 1.0).abs() < 1e-3, "{g} Gb/s");
}

#[test]
fn two_paths_on_one_root_share_its_cap() {
    let size = 4 << 20;
    let free = fab("200G/1us,200G/1us", "", Framing::Ideal, false);
    let capped = fab("200G/1us@r0,200G/1us@r0", "r0=256G", Framing::Ideal, false);
    let split = fab(
        "200G/1us@r0,200G/1us@r1",
        "r0=256G,r1=256G",
        Framing::Ideal,
        false,
    );
    let g = |f: ModelFab| {
        let mut p = pair(f, 4, size);
        steady_gbps(&stream(&mut p, size, 24, 4), size)
    };
    let (gf, gc, gs) = (g(free), g(capped), g(split));
    assert!((gf / 400.0 - 1.0).abs() < 2e-3, "uncapped {gf} Gb/s");
    assert!(
        (gc / 256.0 - 1.0).abs() < 2e-3,
        "one shared 256G root: {gc} Gb/s"
    );
    assert!((gs / 400.0 - 1.0).abs() < 2e-3, "a root each: {gs} Gb/s");
}

#[test]
fn unequal_paths_carry_shares_in_proportion_to_their_rates() {
    let f = fab("400G/1us,400G/1us,200G/1us", "", Framing::Ideal, false);
    let size = 4 << 20;
    let mut p = pair(f.clone(), 4, size);
    let g = steady_gbps(&stream(&mut p, size, 24, 4), size);
    assert!((g / 1000.0 - 1.0).abs() < 2e-3, "{g} Gb/s of 1000");
    let by_path: Vec<u64> = (0..3)
        .map(|i| f.path_bytes(p.s.fabric(), i).unwrap())
        .collect();
    let total: u64 = by_path.iter().sum();
    for (i, share) in [0.4, 0.4, 0.2].iter().enumerate() {
        let got = by_path[i] as f64 / total as f64;
        assert!((got - share).abs() < 1e-3, "path {i}: {got}");
    }
}

#[test]
fn two_runs_give_the_same_event_trace() {
    let run = || {
        let f = fab("92.57G/1.2us,97.28G/1.2us", "", Framing::default(), true);
        let mut p = pair(f.clone(), 8, 300_000);
        let done = stream(&mut p, 300_000, 20, 8);
        (f.trace().unwrap(), f.trace_hash().unwrap(), done)
    };
    let (t1, h1, d1) = run();
    let (t2, h2, d2) = run();
    assert!(t1.len() > 100, "{} events", t1.len());
    assert_eq!(t1, t2);
    assert_eq!(h1, h2);
    assert_eq!(d1, d2);
    // A different rate gives a different trace.
    let f = fab("92.57G/1.2us,97.29G/1.2us", "", Framing::default(), true);
    let mut p = pair(f.clone(), 8, 300_000);
    stream(&mut p, 300_000, 20, 8);
    assert_ne!(f.trace_hash().unwrap(), h1);
}

#[test]
fn without_copies_only_control_memory_is_written() {
    let f = ModelFab::new(ModelFabConfig {
        topology: Topology::parse("100G", "", Framing::Ideal).unwrap(),
        copy_data: false,
        trace: false,
    })
    .unwrap();
    let size = 64 * 1024;
    let mut p = pair(f.clone(), 2, size);
    stream(&mut p, size, 4, 2);
    let mut got = vec![1u8; 16];
    f.read_into(p.ra, &mut got).unwrap();
    assert_eq!(
        got,
        vec![1u8; 16],
        "no backing store: the buffer is left alone"
    );
    // Per message: the data (one write, no size record) and its clear-to-send (one write of
    // index, header, one element and check word: 80 bytes).
    assert_eq!(f.stats().unwrap().bytes, 4 * size as u64 + 4 * 80);
}

/// Posts one write of `len` bytes from `from` to `to` on path 0, with an immediate when `imm`.
fn post(f: &ModelFab, from: &mut ModelEndpoint, to: &mut ModelEndpoint, len: usize, imm: bool) {
    let src = f.alloc(len).unwrap();
    let dst = f.alloc(len).unwrap();
    let rs = from
        .register(&Lent::simulated(src, len), MemKind::Host)
        .unwrap();
    let rd = to
        .register(&Lent::simulated(dst, len), MemKind::Host)
        .unwrap();
    if imm {
        to.post_recv(0, 1).unwrap();
    }
    from.post_write(
        0,
        &WriteWr {
            wr_id: 1,
            local: LocalSeg {
                addr: src,
                len: len as u32,
                lkey: rs.keys[0].lkey,
            },
            remote: RemoteSeg {
                addr: dst,
                rkey: rd.keys[0].rkey,
            },
            imm: imm.then_some(7),
            signaled: false,
            inline: false,
        },
    )
    .unwrap();
}

#[test]
fn a_write_is_not_queued_behind_later_reservations_of_a_shared_root() {
    // Host 0 queues eight 1 MiB writes to host 1: its wire is busy for eight wire times, and each
    // write needs host 1's root (10× the wire's rate) only for a tenth of its wire time. A write
    // from host 2 to host 1 on its own idle wire then lands after its own wire time: the root has
    // room between host 0's writes. (The model once booked a shared stage as one "busy until"
    // time, so host 2 waited for all eight: alltoall on 3+ ranks ran at half speed.)
    let f = fab("100G/1us@r", "r=1000G", Framing::default(), false);
    let (mut a01, mut b01) = f.pair(0, 1).unwrap();
    let (mut a21, mut b21) = f.pair(2, 1).unwrap();
    let len = 1 << 20;
    for _ in 0..8 {
        post(&f, &mut a01, &mut b01, len, false);
    }
    post(&f, &mut a21, &mut b21, len, true);
    let wire = Framing::default().wire_bytes(len as u64, true);
    let land = 1_000_000 + serialize_ps(wire, 100_000_000_000);
    let mut out = Vec::new();
    while out.is_empty() {
        let t = f.advance().unwrap().expect("host 2's write never landed");
        b21.poll(0, 4, &mut out).unwrap();
        if !out.is_empty() {
            assert_eq!(t, land, "host 2's write waited for host 0's");
        }
    }
}
