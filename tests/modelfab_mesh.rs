//! The model fabric over a mesh: wires per host pair, and relay paths whose writes cross a first
//! leg into the relay host's staging memory, wait there until whole (store and forward), then
//! cross the second leg; both legs take their wires' capacity and the relay host's staging root.
//! Expected times are computed from the model's stated formulas.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use switchless::sys::Lent;
use switchless::transport::comm::{ProtocolConfig, RecvBuf, connect_pair};
use switchless::transport::fabric::{
    Fabric, LocalSeg, MemKind, RemoteSeg, WcOpcode, WcStatus, WriteWr,
};
use switchless::transport::modelfab::link::{Framing, serialize_ps};
use switchless::transport::modelfab::{
    Mesh, MeshPath, MeshRoot, MeshWire, ModelEndpoint, ModelFab, RelayRule, Staging,
};

const G: u64 = 1_000_000_000;
const US: u64 = 1_000_000;

/// Hosts in a ring 0-1-2-3-0, one 100 Gb/s wire (one path) per neighbour pair, 1 us, payload only;
/// each host one staging root of `stage` b/s.
fn ring4(relay: RelayRule, slots: usize, stage: u64) -> Mesh {
    let wires = (0..4)
        .map(|i| MeshWire {
            hosts: [i, (i + 1) % 4],
            rate_bps: 100 * G,
            latency_ps: US,
        })
        .collect();
    let roots = (0..4)
        .map(|h| MeshRoot {
            host: h,
            name: format!("stage{h}"),
            cap_bps: stage,
        })
        .collect();
    let paths = (0..4)
        .map(|i| MeshPath {
            wire: i,
            root: [None, None],
            stage_root: [Some(i), Some((i + 1) % 4)],
            label: format!("w{i}"),
        })
        .collect();
    Mesh {
        hosts: 4,
        wires,
        paths,
        roots,
        framing: Framing::Ideal,
        relay,
        staging: Staging {
            slots,
            slot_bytes: 512 << 10,
        },
    }
}

struct Buf {
    addr: u64,
    lkey: u32,
    rkey: u32,
}

fn buf(f: &ModelFab, ep: &mut ModelEndpoint, len: usize, path: usize, fill: u8) -> Buf {
    let addr = f.alloc(len).unwrap();
    f.write(addr, &vec![fill; len]).unwrap();
    let r = ep
        .register(&Lent::simulated(addr, len), MemKind::Host)
        .unwrap();
    Buf {
        addr,
        lkey: r.keys[path].lkey,
        rkey: r.keys[path].rkey,
    }
}

fn write(from: &mut ModelEndpoint, path: usize, src: &Buf, dst: &Buf, len: usize) {
    from.post_write(
        path,
        &WriteWr {
            wr_id: 11,
            local: LocalSeg {
                addr: src.addr,
                len: len as u32,
                lkey: src.lkey,
            },
            remote: RemoteSeg {
                addr: dst.addr,
                rkey: dst.rkey,
            },
            imm: Some(3),
            signaled: true,
            inline: false,
        },
    )
    .unwrap();
}

/// Advances until `ep` has a completion on `path`; returns its time and the completion.
fn until(
    f: &ModelFab,
    ep: &mut ModelEndpoint,
    path: usize,
) -> (u64, switchless::transport::fabric::Completion) {
    loop {
        let t = f.advance().unwrap().expect("nothing in flight");
        let mut out = Vec::new();
        if ep.poll(path, 1, &mut out).unwrap() == 1 {
            return (t, out[0]);
        }
    }
}

#[test]
fn the_diagonal_is_reached_through_both_neighbours_and_only_through_relays() {
    let f = ModelFab::mesh(ring4(RelayRule::Unreachable, 4, 1000 * G), true, false).unwrap();
    let (a, b) = f.pair(0, 2).unwrap();
    assert_eq!(a.paths().len(), 2);
    assert!(a.paths()[0].label.contains("via host1"), "{:?}", a.paths());
    assert!(a.paths()[1].label.contains("via host3"), "{:?}", a.paths());
    assert!(
        b.paths()[0].label.contains("host2 relay via host1"),
        "{:?}",
        b.paths()
    );
    // neighbours: their wire only
    let (n, _) = f.pair(0, 1).unwrap();
    assert_eq!(n.paths().len(), 1);
    // relays off: the diagonal has no path, and the error says why
    let off = ModelFab::mesh(ring4(RelayRule::Off, 4, 1000 * G), true, false).unwrap();
    let e = off.pair(0, 2).err().unwrap().to_string();
    assert!(
        e.contains("share no cable") && e.contains("relays are off"),
        "{e}"
    );
    // a relay everywhere it can: 0-1 has no host cabled to both in a 4-ring
    let all = ModelFab::mesh(ring4(RelayRule::All, 4, 1000 * G), true, false).unwrap();
    assert_eq!(all.pair(0, 1).unwrap().0.paths().len(), 1);
    // uniform-only calls say so
    assert!(f.kill_path_at(0, 1).is_err() && f.set_rate_at(0, 1, G).is_err());
    assert!(f.topology().is_err());
}

#[test]
fn a_relayed_write_is_stored_and_forwarded_chunk_by_chunk() {
    let f = ModelFab::mesh(ring4(RelayRule::Unreachable, 4, 1000 * G), true, false).unwrap();
    let (mut a, mut b) = f.pair(0, 2).unwrap();
    let len = 1 << 20; // two 512 KiB chunks
    let src = buf(&f, &mut a, len, 0, 0x5a);
    let dst = buf(&f, &mut b, len, 0, 0);
    b.post_recv(0, 77).unwrap();
    write(&mut a, 0, &src, &dst, len);
    let t = serialize_ps(512 << 10, 100 * G);
    // chunk 1: leg 1 [0, t], in the relay at t + 1us, leg 2 [t + 1us, 2t + 1us]; chunk 2: leg 1
    // [t, 2t], in the relay at 2t + 1us, leg 2 [2t + 1us, 3t + 1us]; lands 1 us later
    let land = 3 * t + 2 * US;
    let (at, c) = until(&f, &mut b, 0);
    assert_eq!(at, land);
    assert_eq!(
        (c.wr_id, c.opcode, c.imm),
        (77, WcOpcode::RecvRdmaWithImm, Some(3))
    );
    assert_eq!(c.byte_len, len as u32);
    let mut got = vec![0u8; len];
    f.read_into(dst.addr, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 0x5a));
    // the sender's completion: acknowledged end to end, both legs' latencies after landing
    let (at, c) = until(&f, &mut a, 0);
    assert_eq!(at, land + 2 * US);
    assert!(c.status.is_success());
    assert_eq!(f.relayed_bytes().unwrap(), vec![0, len as u64, 0, 0]);
    assert_eq!(f.stats().unwrap().relayed_bytes, len as u64);
}

#[test]
fn staging_slots_bound_what_the_relay_holds() {
    // One slot: chunk 2 starts on leg 1 only when the relay host has leg 2's acknowledgement of
    // chunk 1 (its end plus two latencies).
    let f = ModelFab::mesh(ring4(RelayRule::Unreachable, 1, 1000 * G), false, false).unwrap();
    let (mut a, mut b) = f.pair(0, 2).unwrap();
    let len = 1 << 20;
    let src = buf(&f, &mut a, len, 0, 1);
    let dst = buf(&f, &mut b, len, 0, 0);
    b.post_recv(0, 1).unwrap();
    write(&mut a, 0, &src, &dst, len);
    let t = serialize_ps(512 << 10, 100 * G);
    let second_leg1 = (2 * t + US) + 2 * US;
    let land = second_leg1 + t + US + t + US;
    assert_eq!(until(&f, &mut b, 0).0, land);
}

#[test]
fn relay_legs_share_the_wires_and_the_relay_hosts_staging_root() {
    // A direct write 0 -> 1 and a relayed one 0 -> 1 -> 2 share wire 0-1: each gets half of it.
    let f = ModelFab::mesh(ring4(RelayRule::Unreachable, 4, 1000 * G), false, false).unwrap();
    let (mut d, mut d1) = f.pair(0, 1).unwrap();
    let (mut a, mut b) = f.pair(0, 2).unwrap();
    let len = 256 << 10;
    let (s1, t1) = (buf(&f, &mut d, len, 0, 0), buf(&f, &mut d1, len, 0, 0));
    let (s2, t2) = (buf(&f, &mut a, len, 0, 0), buf(&f, &mut b, len, 0, 0));
    d1.post_recv(0, 1).unwrap();
    b.post_recv(0, 2).unwrap();
    write(&mut d, 0, &s1, &t1, len);
    write(&mut a, 0, &s2, &t2, len);
    let t = serialize_ps(len as u64, 100 * G);
    // both at 50 G on wire 0-1 until both end at 2t; the direct write lands 1 us later
    assert_eq!(until(&f, &mut d1, 0).0, 2 * t + US);
    // the relayed one then crosses wire 1-2 alone: lands at 2t + 1us + t + 1us
    assert_eq!(until(&f, &mut b, 0).0, 3 * t + 2 * US);

    // A 25 Gb/s staging root at the relay host bounds both legs (payload in, then out).
    let f = ModelFab::mesh(ring4(RelayRule::Unreachable, 4, 25 * G), false, false).unwrap();
    let (mut a, mut b) = f.pair(0, 2).unwrap();
    let (s, d) = (buf(&f, &mut a, len, 0, 0), buf(&f, &mut b, len, 0, 0));
    b.post_recv(0, 1).unwrap();
    write(&mut a, 0, &s, &d, len);
    let slow = serialize_ps(len as u64, 25 * G);
    assert_eq!(until(&f, &mut b, 0).0, 2 * slow + 2 * US);
}

#[test]
fn a_bad_key_on_a_relay_path_fails_at_the_receiver_like_a_direct_one() {
    let f = ModelFab::mesh(ring4(RelayRule::Unreachable, 4, 1000 * G), true, false).unwrap();
    let (mut a, mut b) = f.pair(0, 2).unwrap();
    let len = 4096;
    let src = buf(&f, &mut a, len, 0, 9);
    // keys of path 1 (the relay through host 3) used on path 0 (through host 1)
    let dst = buf(&f, &mut b, len, 1, 0);
    b.post_recv(0, 1).unwrap();
    write(&mut a, 0, &src, &dst, len);
    let (_, c) = until(&f, &mut a, 0);
    assert_eq!(c.status, WcStatus::REM_ACCESS_ERR);
    let mut got = vec![1u8; len];
    f.read_into(dst.addr, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 0), "nothing written");
}

#[test]
fn the_protocol_streams_over_relay_paths_and_every_byte_arrives() {
    // The comms over the diagonal of the ring: two relay paths, data checked, rate as modelled:
    // each relay path's legs run at the wire's 100 Gb/s, 200 Gb/s in all, less what one message
    // at a time costs: a chunk's store-and-forward time (42 us) and the round trips per message.
    let f = ModelFab::mesh(ring4(RelayRule::Unreachable, 4, 1000 * G), true, false).unwrap();
    let (a, b) = f.pair(0, 2).unwrap();
    let (mut s, mut r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    let size = 4 << 20;
    let count = 12;
    let sa = f.alloc(size).unwrap();
    let ra = f.alloc(size).unwrap();
    let smh = s.reg_mr(&Lent::simulated(sa, size), MemKind::Host).unwrap();
    let rmh = r.reg_mr(&Lent::simulated(ra, size), MemKind::Host).unwrap();
    let base = Instant::now();
    let now = |f: &ModelFab| base + Duration::from_nanos(f.now_ps().unwrap() / 1000);
    let mut first_done = 0;
    for m in 0..count {
        let data: Vec<u8> = (0..size).map(|i| (i * 31 + m * 7) as u8).collect();
        f.write(sa, &data).unwrap();
        f.write(ra, &vec![0u8; size]).unwrap();
        let rq = loop {
            let rb = RecvBuf {
                addr: ra,
                size: size as u64,
                tag: 5,
                mh: &rmh,
            };
            if let Some(q) = r.irecv(now(&f), &[rb]).unwrap() {
                break q;
            }
            f.advance().unwrap();
        };
        let sq = loop {
            if let Some(q) = s.isend(now(&f), sa, size as u64, 5, &smh).unwrap() {
                break q;
            }
            f.advance().unwrap();
        };
        let (mut rd, mut sd) = (false, false);
        while !(rd && sd) {
            if !rd {
                if let Some(sz) = r.test(now(&f), rq).unwrap() {
                    assert_eq!(sz.as_slice(), &[size as u64]);
                    rd = true;
                }
            }
            if !sd && s.test(now(&f), sq).unwrap().is_some() {
                sd = true;
            }
            if !(rd && sd) {
                f.advance().unwrap().expect("deadlock");
            }
        }
        let mut got = vec![0u8; size];
        f.read_into(ra, &mut got).unwrap();
        assert!(got == data, "message {m} arrived wrong");
        if m == 1 {
            first_done = f.now_ps().unwrap();
        }
    }
    let secs = (f.now_ps().unwrap() - first_done) as f64 * 1e-12;
    let gbps = ((count - 2) * size * 8) as f64 / secs / 1e9;
    assert!(gbps > 120.0 && gbps <= 200.0, "{gbps} Gb/s over two relays");
    assert_eq!(f.relayed_bytes().unwrap()[0], 0);
    assert!(f.relayed_bytes().unwrap()[1] > 0 && f.relayed_bytes().unwrap()[3] > 0);
}
