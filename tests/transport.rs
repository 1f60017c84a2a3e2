//! The data protocol over the in-memory fabric: grouped receives, tags, truncation, limits, striping,
//! zero-byte messages, flush, errors, timeouts, teardown and data integrity.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

use std::time::{Duration, Instant};

use proptest::prelude::*;
use switchless::error::Error;
use switchless::sys::Lent;
use switchless::transport::comm::{
    FailoverConfig, FlushBuf, MemHandle, ProtocolConfig, RecvBuf, RecvComm, Request, SendComm,
    Sizes, connect_pair,
};
use switchless::transport::fabric::{MemKind, WcStatus};
use switchless::transport::memfab::{EpId, MemEndpoint, MemFab, MemFabConfig};
use switchless::transport::stripe::StripeParams;
use switchless::transport::wire::{MAX_RECVS, MAX_REQUESTS, MAX_SEND_REQUESTS};

struct Rig {
    fab: MemFab,
    s: SendComm<MemEndpoint>,
    r: RecvComm<MemEndpoint>,
    sid: EpId,
    rid: EpId,
    /// The virtual time handed to the comms: it moves only by [`Rig::advance`], so a test reaches a
    /// request timeout without sleeping.
    now: Instant,
}

fn rig_with(speeds: &[u64], loopbacks: usize, fcfg: MemFabConfig, pcfg: ProtocolConfig) -> Rig {
    let fab = MemFab::new(fcfg);
    let (a, b) = fab.pair(speeds, loopbacks);
    let (sid, rid) = (a.id(), b.id());
    let (s, r) = connect_pair(a, b, pcfg).unwrap();
    Rig {
        fab,
        s,
        r,
        sid,
        rid,
        now: Instant::now(),
    }
}

/// Protocol defaults with failover off: a path's error fails the requests on it.
fn no_failover() -> ProtocolConfig {
    ProtocolConfig {
        failover: FailoverConfig {
            enabled: false,
            ..FailoverConfig::default()
        },
        ..ProtocolConfig::default()
    }
}

fn rig(npaths: usize) -> Rig {
    rig_with(
        &vec![100_000; npaths],
        0,
        MemFabConfig::default(),
        ProtocolConfig::default(),
    )
}

/// One path (and `loopbacks` loopback paths) with a 250 ms request timeout.
fn timing_out_rig(loopbacks: usize) -> Rig {
    let pcfg = ProtocolConfig {
        request_timeout: Some(Duration::from_millis(250)),
        ..ProtocolConfig::default()
    };
    rig_with(&[100_000], loopbacks, MemFabConfig::default(), pcfg)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

impl Rig {
    /// The time handed to the comms.
    fn now(&self) -> Instant {
        self.now
    }
    /// Moves the virtual clock forward.
    fn advance(&mut self, by: Duration) {
        self.now += by;
    }
    fn send_buf(&mut self, data: &[u8]) -> (u64, MemHandle) {
        let addr = self.fab.alloc(data.len().max(1)).unwrap();
        self.fab.write(addr, data).unwrap();
        let mh = self
            .s
            .reg_mr(&Lent::simulated(addr, data.len().max(1)), MemKind::Host)
            .unwrap();
        (addr, mh)
    }
    fn recv_buf(&mut self, len: usize, kind: MemKind) -> (u64, MemHandle) {
        let addr = self.fab.alloc(len.max(1)).unwrap();
        self.fab.write(addr, &vec![0xEE; len.max(1)]).unwrap();
        let mh = self
            .r
            .reg_mr(&Lent::simulated(addr, len.max(1)), kind)
            .unwrap();
        (addr, mh)
    }
    /// irecv of one buffer, which must be taken (a free slot).
    fn irecv1(&mut self, addr: u64, size: u64, tag: u32, mh: &MemHandle) -> Request {
        let b = RecvBuf {
            addr,
            size,
            tag,
            mh,
        };
        self.r.irecv(self.now(), &[b]).unwrap().unwrap()
    }
    /// isend, retrying while the CTS has not arrived (stepping the fabric in reorder mode).
    fn isend(&mut self, addr: u64, size: u64, tag: u32, mh: &MemHandle) -> Request {
        for _ in 0..10_000 {
            if let Some(req) = self.s.isend(self.now(), addr, size, tag, mh).unwrap() {
                return req;
            }
            self.fab.step();
        }
        panic!("isend never got a clear-to-send");
    }
    fn wait_send(&mut self, req: Request) -> u64 {
        for _ in 0..10_000 {
            if let Some(n) = self.s.test(self.now(), req).unwrap() {
                return n;
            }
        }
        panic!("send never completed");
    }
    fn wait_recv(&mut self, req: Request) -> Sizes {
        for _ in 0..10_000 {
            if let Some(s) = self.r.test(self.now(), req).unwrap() {
                return s;
            }
        }
        panic!("receive never completed");
    }
}

#[test]
fn one_message_one_path() {
    let mut g = rig(1);
    let data = pattern(10_000, 1);
    let (sa, smh) = g.send_buf(&data);
    let (ra, rmh) = g.recv_buf(16_384, MemKind::Host);
    let rreq = g.irecv1(ra, 16_384, 3, &rmh);
    let sreq = g.isend(sa, 10_000, 3, &smh);
    assert_eq!(g.wait_send(sreq), 10_000);
    assert_eq!(g.wait_recv(rreq).as_slice(), &[10_000]);
    assert_eq!(g.fab.read(ra, 10_000).unwrap(), data);
    // Bytes past the message are untouched.
    assert_eq!(g.fab.read(ra + 10_000, 16).unwrap(), vec![0xEE; 16]);
}

#[test]
fn grouped_receive_matches_by_tag_and_reports_sizes_per_buffer() {
    let mut g = rig(2);
    let tags = [5u32, 6, 7];
    let sizes = [1000usize, 0, 70_000];
    let mut rbufs = Vec::new();
    for _ in 0..3 {
        rbufs.push(g.recv_buf(80_000, MemKind::Host));
    }
    let bufs: Vec<RecvBuf> = (0..3)
        .map(|i| RecvBuf {
            addr: rbufs[i].0,
            size: 80_000,
            tag: tags[i],
            mh: &rbufs[i].1,
        })
        .collect();
    let rreq = g.r.irecv(g.now(), &bufs).unwrap().unwrap();
    // Send in a different order than the buffers: 7, 5, 6.
    let mut sreqs = Vec::new();
    let mut datas = Vec::new();
    for i in [2usize, 0, 1] {
        let data = pattern(sizes[i], i as u8);
        let (sa, smh) = g.send_buf(&data);
        sreqs.push(g.isend(sa, sizes[i] as u64, tags[i], &smh));
        datas.push((i, data));
    }
    for (req, (i, _)) in sreqs.into_iter().zip(&datas) {
        assert_eq!(g.wait_send(req), sizes[*i] as u64);
    }
    assert_eq!(g.wait_recv(rreq).as_slice(), &[1000, 0, 70_000]);
    for (i, data) in &datas {
        assert_eq!(&g.fab.read(rbufs[*i].0, sizes[*i]).unwrap(), data);
    }
}

#[test]
fn send_with_unposted_tag_waits() {
    let mut g = rig(1);
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    let rreq = g.irecv1(ra, 64, 1, &rmh);
    let (sa, smh) = g.send_buf(&[1; 8]);
    assert_eq!(g.s.isend(g.now(), sa, 8, 2, &smh).unwrap(), None);
    let req = g.s.isend(g.now(), sa, 8, 1, &smh).unwrap().unwrap();
    g.wait_send(req);
    assert_eq!(g.wait_recv(rreq).as_slice(), &[8]);
}

#[test]
fn no_clear_to_send_means_retry() {
    let mut g = rig(2);
    let (sa, smh) = g.send_buf(&[1; 8]);
    for _ in 0..3 {
        assert_eq!(g.s.isend(g.now(), sa, 8, 0, &smh).unwrap(), None);
    }
}

#[test]
fn send_larger_than_receive_is_an_error_naming_both_sizes() {
    let mut g = rig(1);
    let (ra, rmh) = g.recv_buf(100, MemKind::Host);
    g.irecv1(ra, 100, 0, &rmh);
    let (sa, smh) = g.send_buf(&[0; 101]);
    let err = g.s.isend(g.now(), sa, 101, 0, &smh).unwrap_err();
    assert!(matches!(err, Error::InvalidUsage(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("101 bytes") && msg.contains("100 bytes"),
        "{msg}"
    );
}

#[test]
fn smaller_send_reports_actual_size() {
    let mut g = rig(3);
    let (ra, rmh) = g.recv_buf(1 << 20, MemKind::Host);
    let rreq = g.irecv1(ra, 1 << 20, 0, &rmh);
    let data = pattern(300_001, 9);
    let (sa, smh) = g.send_buf(&data);
    let sreq = g.isend(sa, 300_001, 0, &smh);
    g.wait_send(sreq);
    assert_eq!(g.wait_recv(rreq).as_slice(), &[300_001]);
    assert_eq!(g.fab.read(ra, 300_001).unwrap(), data);
}

#[test]
fn thirty_two_outstanding_receives_then_retry() {
    let mut g = rig(2);
    let (ra, rmh) = g.recv_buf(64 * MAX_REQUESTS, MemKind::Host);
    let mut rreqs = Vec::new();
    for i in 0..MAX_REQUESTS {
        let b = RecvBuf {
            addr: ra + 64 * i as u64,
            size: 64,
            tag: 0,
            mh: &rmh,
        };
        rreqs.push(
            g.r.irecv(g.now(), &[b])
                .unwrap()
                .expect("32 receives must be accepted"),
        );
    }
    assert_eq!(g.r.outstanding(), MAX_REQUESTS);
    let extra = RecvBuf {
        addr: ra,
        size: 64,
        tag: 0,
        mh: &rmh,
    };
    assert_eq!(
        g.r.irecv(g.now(), &[extra]).unwrap(),
        None,
        "the 33rd receive must be refused (retry)"
    );
    let mut sreqs = Vec::new();
    let datas: Vec<Vec<u8>> = (0..MAX_REQUESTS).map(|i| pattern(64, i as u8)).collect();
    let (sa, smh) = g.send_buf(&datas.concat());
    for i in 0..MAX_REQUESTS {
        sreqs.push(g.isend(sa + 64 * i as u64, 64, 0, &smh));
    }
    // Test in post order, as NCCL does; the plugin may complete them in any order.
    for (i, req) in rreqs.into_iter().enumerate() {
        assert_eq!(g.wait_recv(req).as_slice(), &[64]);
        assert_eq!(g.fab.read(ra + 64 * i as u64, 64).unwrap(), datas[i]);
    }
    for req in sreqs {
        assert_eq!(g.wait_send(req), 64);
    }
    assert!(g.r.irecv(g.now(), &[extra]).unwrap().is_some());
}

#[test]
fn sender_accepts_max_requests_times_max_recvs() {
    let mut g = rig(1);
    let (ra, rmh) = g.recv_buf(8 * MAX_SEND_REQUESTS, MemKind::Host);
    let mut rreqs = Vec::new();
    for i in 0..MAX_REQUESTS {
        let bufs: Vec<RecvBuf> = (0..MAX_RECVS)
            .map(|j| RecvBuf {
                addr: ra + 8 * (i * MAX_RECVS + j) as u64,
                size: 8,
                tag: j as u32,
                mh: &rmh,
            })
            .collect();
        rreqs.push(g.r.irecv(g.now(), &bufs).unwrap().unwrap());
    }
    let (sa, smh) = g.send_buf(&[7; 8]);
    let mut sreqs = Vec::new();
    for i in 0..MAX_SEND_REQUESTS {
        sreqs.push(g.isend(sa, 8, (i % MAX_RECVS) as u32, &smh));
    }
    assert_eq!(g.s.outstanding(), MAX_SEND_REQUESTS);
    for r in sreqs {
        g.wait_send(r);
    }
    for r in rreqs {
        assert_eq!(g.wait_recv(r).as_slice(), &[8; MAX_RECVS]);
    }
    assert_eq!(
        g.fab.read(ra, 8 * MAX_SEND_REQUESTS).unwrap(),
        vec![7; 8 * MAX_SEND_REQUESTS]
    );
}

#[test]
fn striping_follows_link_speed() {
    // 4 paths at 100, 200, 300, 400 Gb/s (in Mb/s); 1 MiB splits 1:2:3:4 (within 128 bytes).
    let mut g = rig_with(
        &[100_000, 200_000, 300_000, 400_000],
        0,
        MemFabConfig::default(),
        ProtocolConfig::default(),
    );
    let len = 1usize << 20;
    let data = pattern(len, 4);
    let (sa, smh) = g.send_buf(&data);
    let (ra, rmh) = g.recv_buf(len, MemKind::Host);
    let rreq = g.irecv1(ra, len as u64, 0, &rmh);
    let before: Vec<u64> = (0..4).map(|p| g.fab.path_bytes(g.sid, p)).collect();
    let sreq = g.isend(sa, len as u64, 0, &smh);
    g.wait_send(sreq);
    g.wait_recv(rreq);
    assert_eq!(g.fab.read(ra, len).unwrap(), data);
    let record = 8; // the size record rides on the fastest path
    for p in 0..4 {
        let sent = g.fab.path_bytes(g.sid, p) - before[p] - if p == 3 { record } else { 0 };
        let ideal = len as u64 * (p as u64 + 1) / 10;
        assert!(
            sent.abs_diff(ideal) < 128,
            "path {p}: {sent} bytes, ideal {ideal}"
        );
    }
}

/// A mesh connection's relay paths carry no piece of a message under their floor, however fast
/// they are (the adaptive weights may rate them above the direct path); from the floor on every
/// path carries; and with the direct path dead a small message still goes, on the floored paths.
#[test]
fn paths_with_a_minimum_message_carry_only_messages_from_it() {
    const FLOOR: u64 = 512 << 10;
    let mut g = rig_with(
        &[100_000, 400_000, 400_000],
        0,
        MemFabConfig::default(),
        ProtocolConfig::default(),
    );
    let e = g.s.set_min_message(&[1, 3], FLOOR).unwrap_err();
    assert!(
        e.to_string()
            .contains("path 3: the connection has 3 data paths"),
        "{e}"
    );
    g.s.set_min_message(&[1, 2], FLOOR).unwrap();
    let send = |g: &mut Rig, len: usize, seed: u8| -> Vec<u64> {
        let data = pattern(len, seed);
        let (sa, smh) = g.send_buf(&data);
        let (ra, rmh) = g.recv_buf(len, MemKind::Host);
        let rreq = g.irecv1(ra, len as u64, 0, &rmh);
        let before: Vec<u64> = (0..3).map(|p| g.fab.path_bytes(g.sid, p)).collect();
        let sreq = g.isend(sa, len as u64, 0, &smh);
        // Both ends progress together (a failover's fence needs both).
        let (mut sent, mut got) = (false, false);
        for _ in 0..10_000 {
            sent = sent || g.s.test(g.now(), sreq).unwrap().is_some();
            got = got || g.r.test(g.now(), rreq).unwrap().is_some();
            if sent && got {
                break;
            }
            g.fab.step();
        }
        assert!(sent && got, "{len} B: send done {sent}, receive done {got}");
        assert_eq!(g.fab.read(ra, len).unwrap(), data);
        (0..3)
            .map(|p| g.fab.path_bytes(g.sid, p) - before[p])
            .collect()
    };
    for len in [4096, 256 << 10, (512 << 10) - 1] {
        let sent = send(&mut g, len, 1);
        assert_eq!(&sent[1..], &[0, 0], "{len} B: {sent:?}");
    }
    for len in [512 << 10, 4 << 20] {
        let sent = send(&mut g, len, 2);
        assert!(sent.iter().all(|&b| b > 0), "{len} B: {sent:?}");
    }
    // Only the floored paths left: small messages go on them.
    g.fab.kill_path(g.sid, 0);
    let sent = send(&mut g, 4096, 3);
    assert_eq!(sent[0], 0, "{sent:?}");
    assert!(sent[1] + sent[2] >= 4096, "{sent:?}");
}

#[test]
fn small_messages_use_one_path() {
    let mut g = rig(4);
    let (ra, rmh) = g.recv_buf(4096, MemKind::Host);
    let (sa, smh) = g.send_buf(&pattern(4096, 0));
    let before = g.fab.stats();
    let rreq = g.irecv1(ra, 4096, 0, &rmh);
    let sreq = g.isend(sa, 4096, 0, &smh);
    g.wait_send(sreq);
    g.wait_recv(rreq);
    let after = g.fab.stats();
    // One clear-to-send write (index, header, element and check word together) + data with the
    // immediate (one piece in one write: no size record).
    assert_eq!(after.writes - before.writes, 2);
    assert_eq!(after.imm_writes - before.imm_writes, 1);
    // The clear-to-send (80 bytes for one buffer) is inline; 4 KiB of data is not.
    assert_eq!(after.inline_writes - before.inline_writes, 1);
    // Two batches (doorbells): the clear-to-send and the data write.
    assert_eq!(after.batches - before.batches, 2);
}

#[test]
fn zero_byte_messages() {
    let mut g = rig(2);
    let (ra, rmh) = g.recv_buf(16, MemKind::Host);
    let (sa, smh) = g.send_buf(&[]);
    for _ in 0..5 {
        let rreq = g.irecv1(ra, 0, 1, &rmh);
        let sreq = g.isend(sa, 0, 1, &smh);
        assert_eq!(g.wait_send(sreq), 0);
        assert_eq!(g.wait_recv(rreq).as_slice(), &[0]);
    }
    assert_eq!(g.fab.read(ra, 16).unwrap(), vec![0xEE; 16]);
}

#[test]
fn requests_are_never_null_or_the_ll_marker() {
    let mut g = rig(1);
    let (ra, rmh) = g.recv_buf(8, MemKind::Host);
    let (sa, smh) = g.send_buf(&[1; 8]);
    for _ in 0..100 {
        let rreq = g.irecv1(ra, 8, 0, &rmh);
        let sreq = g.isend(sa, 8, 0, &smh);
        assert!(rreq.to_raw() > 1 && sreq.to_raw() > 1);
        assert_eq!(Request::from_raw(rreq.to_raw()), rreq);
        g.wait_send(sreq);
        g.wait_recv(rreq);
        // A request reported done is released: testing it again is an error.
        assert!(matches!(
            g.r.test(g.now(), rreq),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            g.s.test(g.now(), sreq),
            Err(Error::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        g.r.test(g.now(), Request::from_raw(1)),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn bad_arguments_are_rejected_with_what_is_accepted() {
    let mut g = rig(1);
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    let e = g.r.irecv(g.now(), &[]).unwrap_err();
    assert!(e.to_string().contains("1..=8"), "{e}");
    let nine: Vec<RecvBuf> = (0..9)
        .map(|_| RecvBuf {
            addr: ra,
            size: 8,
            tag: 0,
            mh: &rmh,
        })
        .collect();
    assert!(matches!(
        g.r.irecv(g.now(), &nine),
        Err(Error::InvalidArgument(_))
    ));
    let e =
        g.r.irecv(
            g.now(),
            &[RecvBuf {
                addr: ra + 60,
                size: 8,
                tag: 0,
                mh: &rmh,
            }],
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("outside its memory registration"),
        "{e}"
    );
    let (sa, smh) = g.send_buf(&[0; 16]);
    assert!(matches!(
        g.s.isend(g.now(), sa, 17, 0, &smh),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn flush_reads_through_every_loopback_for_gpu_buffers_only() {
    let mut g = rig_with(
        &[100_000, 100_000],
        2,
        MemFabConfig::default(),
        ProtocolConfig::default(),
    );
    let (ga, gmh) = g.recv_buf(4096, MemKind::Cuda);
    let (ha, hmh) = g.recv_buf(4096, MemKind::Host);
    // Host memory: nothing to flush.
    assert_eq!(
        g.r.iflush(
            g.now(),
            &[FlushBuf {
                addr: ha,
                size: 4096,
                mh: &hmh
            }]
        )
        .unwrap(),
        None
    );
    // GPU memory with no data: nothing to flush.
    assert_eq!(
        g.r.iflush(
            g.now(),
            &[FlushBuf {
                addr: ga,
                size: 0,
                mh: &gmh
            }]
        )
        .unwrap(),
        None
    );
    let before = g.fab.stats().reads;
    let req =
        g.r.iflush(
            g.now(),
            &[
                FlushBuf {
                    addr: ha,
                    size: 10,
                    mh: &hmh,
                },
                FlushBuf {
                    addr: ga,
                    size: 100,
                    mh: &gmh,
                },
            ],
        )
        .unwrap()
        .expect("GPU data needs a flush");
    assert!(g.wait_recv(req).as_slice().is_empty());
    assert_eq!(
        g.fab.stats().reads - before,
        2,
        "one read per loopback path"
    );
    // A fabric without loopback paths needs no flush.
    let mut g2 = rig(1);
    let (ga2, gmh2) = g2.recv_buf(64, MemKind::Cuda);
    assert_eq!(
        g2.r.iflush(
            g2.now(),
            &[FlushBuf {
                addr: ga2,
                size: 64,
                mh: &gmh2
            }]
        )
        .unwrap(),
        None
    );
}

#[test]
fn flush_read_error_fails_the_flush() {
    let mut g = rig_with(
        &[100_000],
        1,
        MemFabConfig::default(),
        ProtocolConfig::default(),
    );
    let (ga, gmh) = g.recv_buf(64, MemKind::Cuda);
    g.fab.fail_next(g.rid, 1, WcStatus::LOC_PROT_ERR);
    let req =
        g.r.iflush(
            g.now(),
            &[FlushBuf {
                addr: ga,
                size: 64,
                mh: &gmh,
            }],
        )
        .unwrap()
        .unwrap();
    let err = g.r.test(g.now(), req).unwrap_err();
    assert!(matches!(err, Error::System(_)), "{err}");
    assert!(err.to_string().contains("loopback0"), "{err}");
}

#[test]
fn completion_error_fails_only_affected_requests_and_names_the_path() {
    let mut g = rig(1);
    let (ra, rmh) = g.recv_buf(128, MemKind::Host);
    let (sa, smh) = g.send_buf(&[3; 64]);
    // One good round first.
    let rr = g.irecv1(ra, 64, 0, &rmh);
    let sr = g.isend(sa, 64, 0, &smh);
    g.wait_send(sr);
    g.wait_recv(rr);
    // Now the sender's path fails with a transport retry error.
    g.fab.fail_next(g.sid, 0, WcStatus::RETRY_EXC_ERR);
    let rr = g.irecv1(ra, 64, 0, &rmh);
    let sr = g.isend(sa, 64, 0, &smh);
    let err = g.s.test(g.now(), sr).unwrap_err();
    assert!(matches!(err, Error::Remote(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("memfab ep0 path0") && msg.contains("transport retry counter exceeded"),
        "{msg}"
    );
    // The receiver saw nothing: pending, and the call returns (no busy loop).
    assert_eq!(g.r.test(g.now(), rr).unwrap(), None);
}

#[test]
fn local_errors_are_system_errors() {
    let mut g = rig(2);
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    let (sa, smh) = g.send_buf(&[3; 64]);
    g.irecv1(ra, 64, 0, &rmh);
    g.fab.fail_next(g.sid, 0, WcStatus::LOC_PROT_ERR);
    g.fab.fail_next(g.sid, 1, WcStatus::LOC_PROT_ERR);
    let sr = g.isend(sa, 64, 0, &smh);
    assert!(matches!(g.s.test(g.now(), sr), Err(Error::System(_))));
}

#[test]
fn cts_write_error_fails_the_receive() {
    let mut g = rig(1);
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    g.fab.fail_next(g.rid, 0, WcStatus::REM_ACCESS_ERR);
    let rr = g.irecv1(ra, 64, 0, &rmh);
    let err = g.r.test(g.now(), rr).unwrap_err();
    assert!(err.to_string().contains("clear-to-send"), "{err}");
}

#[test]
fn silent_peer_leaves_requests_pending_until_the_timeout() {
    let mut g = timing_out_rig(0);
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    let (sa, smh) = g.send_buf(&[3; 64]);
    g.fab.stall(g.sid, true);
    let rr = g.irecv1(ra, 64, 0, &rmh);
    let sr = g.isend(sa, 64, 0, &smh);
    assert_eq!(g.r.test(g.now(), rr).unwrap(), None);
    assert_eq!(g.s.test(g.now(), sr).unwrap(), None);
    // At the deadline the requests still wait: only a wait longer than the timeout fails.
    g.advance(Duration::from_millis(250));
    assert_eq!(g.r.test(g.now(), rr).unwrap(), None);
    assert_eq!(g.s.test(g.now(), sr).unwrap(), None);
    g.advance(Duration::from_millis(150));
    let e = g.r.test(g.now(), rr).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(e.to_string().contains("no progress for 400 ms"), "{e}");
    // The error says where the receive stood: its entry left this side, no data came.
    assert!(
        e.to_string().contains("its clear-to-send went on path 0")
            || e.to_string().contains("its clear-to-send landed on path 0"),
        "{e}"
    );
    assert!(e.to_string().contains("pieces seen 0"), "{e}");
    let e = g.s.test(g.now(), sr).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(e.to_string().contains("no progress for 400 ms"), "{e}");
}

#[test]
fn sender_without_clear_to_send_times_out() {
    let mut g = timing_out_rig(0);
    let (sa, smh) = g.send_buf(&[3; 64]);
    assert_eq!(g.s.isend(g.now(), sa, 64, 0, &smh).unwrap(), None);
    // The stall counts from the first isend that found no clear-to-send, not from each retry.
    g.advance(Duration::from_millis(250));
    assert_eq!(g.s.isend(g.now(), sa, 64, 0, &smh).unwrap(), None);
    g.advance(Duration::from_millis(150));
    let e = g.s.isend(g.now(), sa, 64, 0, &smh).unwrap_err();
    assert!(
        matches!(e, Error::Timeout(_)) && e.to_string().contains("clear-to-send"),
        "{e}"
    );
    assert!(e.to_string().contains("no progress for 400 ms"), "{e}");
    // No receive was ever posted: the error says the head's slot is empty, not torn.
    assert!(e.to_string().contains("slot 0 never written"), "{e}");
}

/// A receive whose clear-to-send is still held back when it times out says so in its error: the
/// sender held three entries unused, so the fourth waited to go with the next one (batching), and
/// the sender never used the three.
#[test]
fn a_timed_out_receive_says_its_clear_to_send_was_held_back() {
    let mut g = timing_out_rig(0);
    let mut reqs = Vec::new();
    for _ in 0..3 {
        let (ra, rmh) = g.recv_buf(64, MemKind::Host);
        let rr = g.irecv1(ra, 64, 0, &rmh);
        // The entries land: their completions give the receiver its round trip.
        assert_eq!(g.r.test(g.now(), rr).unwrap(), None);
        reqs.push((rr, rmh));
    }
    // Well past twice the round trip with no data: the sender holds all three unused.
    g.advance(Duration::from_millis(10));
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    let held = g.irecv1(ra, 64, 0, &rmh);
    assert_eq!(g.r.test(g.now(), held).unwrap(), None);
    g.advance(Duration::from_millis(300));
    let e = g.r.test(g.now(), held).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(
        e.to_string().contains(
            "its clear-to-send is held back with 0 other(s), the sender holding 3 unused"
        ),
        "{e}"
    );
}

/// Security review finding 18: a receive that timed out leaves its clear-to-send live at the
/// sender, so its FIFO slot must not be used again: the comm is dead after the timeout, and the next
/// `irecv` (which took the freed slot and wrote a new entry beside the live one) fails with the
/// timeout's error.
#[test]
fn a_timed_out_receive_ends_the_comm_instead_of_reusing_its_slot() {
    let mut g = timing_out_rig(0);
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    let post = |g: &mut Rig| {
        g.r.irecv(
            g.now(),
            &[RecvBuf {
                addr: ra,
                size: 64,
                tag: 0,
                mh: &rmh,
            }],
        )
    };
    let req = post(&mut g).unwrap().unwrap();
    assert_eq!(g.r.test(g.now(), req).unwrap(), None);
    g.advance(Duration::from_millis(300));
    let e = g.r.test(g.now(), req).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    let e = post(&mut g).unwrap_err();
    assert!(
        matches!(&e, Error::Timeout(m) if m.contains("FIFO sequence 0")),
        "the next receive must fail with the timeout, not reuse the slot: {e}"
    );
}

#[test]
fn a_flush_that_never_completes_times_out() {
    let mut g = timing_out_rig(1);
    let (ga, gmh) = g.recv_buf(64, MemKind::Cuda);
    // The receiver's own loopback read stays queued.
    g.fab.stall(g.rid, true);
    let req =
        g.r.iflush(
            g.now(),
            &[FlushBuf {
                addr: ga,
                size: 64,
                mh: &gmh,
            }],
        )
        .unwrap()
        .unwrap();
    assert_eq!(g.r.test(g.now(), req).unwrap(), None);
    g.advance(Duration::from_millis(250));
    assert_eq!(g.r.test(g.now(), req).unwrap(), None);
    g.advance(Duration::from_millis(1));
    let e = g.r.test(g.now(), req).unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(
        e.to_string()
            .contains("flush read made no progress for 251 ms"),
        "{e}"
    );
}

#[test]
fn path_errors_and_timeouts_carry_what_the_device_said_about_the_port() {
    const NOTE: &str = "rxe_eth2 port 1: IBV_EVENT_PORT_ERR (the port went down) 0.12 s ago";
    // A completion error: the note follows the status (failover off: the error reaches the request).
    let mut g = rig_with(
        &[100_000, 100_000],
        0,
        MemFabConfig::default(),
        no_failover(),
    );
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    let (sa, smh) = g.send_buf(&[3; 64]);
    g.fab.set_path_note(g.sid, 0, Some(NOTE));
    g.fab.fail_next(g.sid, 0, WcStatus::RETRY_EXC_ERR);
    g.irecv1(ra, 64, 0, &rmh);
    let sr = g.isend(sa, 64, 0, &smh);
    let msg = g.s.test(g.now(), sr).unwrap_err().to_string();
    assert!(
        msg.contains(&format!(
            "transport retry counter exceeded (status 12); {NOTE}"
        )),
        "{msg}"
    );
    // A request timeout: each path listed with its note; a path without one is listed bare.
    let pcfg = ProtocolConfig {
        request_timeout: Some(Duration::from_millis(150)),
        ..ProtocolConfig::default()
    };
    let mut g = rig_with(&[100_000, 100_000], 0, MemFabConfig::default(), pcfg);
    g.fab.set_path_note(g.sid, 1, Some(NOTE));
    let (sa, smh) = g.send_buf(&[3; 64]);
    assert_eq!(g.s.isend(g.now(), sa, 64, 0, &smh).unwrap(), None);
    g.advance(Duration::from_millis(250));
    let msg = g.s.isend(g.now(), sa, 64, 0, &smh).unwrap_err().to_string();
    assert!(msg.contains("[0] memfab ep0 path0 -> ep1, [1]"), "{msg}");
    assert!(
        msg.contains(&format!("[1] memfab ep0 path1 -> ep1 ({NOTE})")),
        "{msg}"
    );
    // Cleared: no note, no parentheses.
    g.fab.set_path_note(g.sid, 1, None);
    let msg = g.s.isend(g.now(), sa, 64, 0, &smh).unwrap_err().to_string();
    assert!(!msg.contains("IBV_EVENT"), "{msg}");
}

#[test]
fn a_sender_waiting_for_clear_to_send_hears_what_the_devices_reported() {
    // No request timeout: only the fabric's health check can end the wait (verbs: the port stayed
    // down past the RC retry budget).
    let mut g = rig(1);
    let (sa, smh) = g.send_buf(&[3; 64]);
    assert_eq!(g.s.isend(g.now(), sa, 64, 0, &smh).unwrap(), None);
    g.fab
        .set_health_error(g.sid, Some("rxe_eth2 port 1 has been down for 1.2 s"));
    // Asked at most once per millisecond of the caller's clock: not yet.
    assert_eq!(g.s.isend(g.now(), sa, 64, 0, &smh).unwrap(), None);
    g.advance(Duration::from_millis(1));
    let e = g.s.isend(g.now(), sa, 64, 0, &smh).unwrap_err();
    assert!(matches!(e, Error::System(_)), "{e}");
    assert!(e.to_string().contains("has been down for 1.2 s"), "{e}");
    g.fab.set_health_error(g.sid, None);
    g.advance(Duration::from_millis(1));
    assert_eq!(g.s.isend(g.now(), sa, 64, 0, &smh).unwrap(), None);
}

#[test]
fn without_timeout_a_silent_peer_never_errors() {
    let mut g = rig(1);
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    g.fab.stall(g.sid, true);
    let rr = g.irecv1(ra, 64, 0, &rmh);
    let (sa, smh) = g.send_buf(&[3; 64]);
    let sr = g.isend(sa, 64, 0, &smh);
    for _ in 0..1000 {
        assert_eq!(g.r.test(g.now(), rr).unwrap(), None);
        assert_eq!(g.s.test(g.now(), sr).unwrap(), None);
        // A day of virtual time in all: no timeout means none.
        g.advance(Duration::from_secs(87));
    }
    // The link comes back: everything completes.
    g.fab.stall(g.sid, false);
    g.wait_send(sr);
    assert_eq!(g.wait_recv(rr).as_slice(), &[64]);
}

#[test]
fn close_with_requests_outstanding_releases_everything() {
    let mut g = rig_with(
        &[100_000, 100_000],
        1,
        MemFabConfig::default(),
        ProtocolConfig::default(),
    );
    let keys_before = g.fab.live_keys();
    let (ra, rmh) = g.recv_buf(4096, MemKind::Cuda);
    let (sa, smh) = g.send_buf(&[1; 4096]);
    g.fab.stall(g.sid, true);
    let mut pending = Vec::new();
    for i in 0..10 {
        let rr = g.irecv1(ra, 4096, 0, &rmh);
        let sr = g.isend(sa, 4096, 0, &smh);
        pending.push((rr, sr, i));
    }
    g.r.iflush(
        g.now(),
        &[FlushBuf {
            addr: ra,
            size: 4096,
            mh: &rmh,
        }],
    )
    .unwrap()
    .unwrap();
    assert_eq!(g.s.outstanding(), 10);
    g.s.dereg_mr(smh).unwrap();
    g.r.dereg_mr(rmh).unwrap();
    let Rig { fab, s, r, .. } = g;
    s.close().unwrap();
    r.close().unwrap();
    // Control memory of both comms and both user registrations are gone.
    assert!(
        fab.live_keys() < keys_before,
        "{} keys left of {keys_before}",
        fab.live_keys()
    );
    assert_eq!(fab.live_keys(), 0);
}

#[test]
fn reordered_delivery_across_paths_keeps_data_intact() {
    for seed in 1..20u64 {
        let pcfg = ProtocolConfig {
            stripe: StripeParams {
                min_chunk: 1024,
                align: 128,
            },
            ..ProtocolConfig::default()
        };
        let fcfg = MemFabConfig {
            reorder_seed: Some(seed),
            copy_data: true,
            ..MemFabConfig::default()
        };
        let mut g = rig_with(&[100_000, 50_000, 100_000, 25_000], 0, fcfg, pcfg);
        let len = 20_000usize;
        let (ra, rmh) = g.recv_buf(len * 4, MemKind::Host);
        let datas: Vec<Vec<u8>> = (0..4)
            .map(|i| pattern(len - i * 1000, seed as u8 + i as u8))
            .collect();
        let mut rreqs = Vec::new();
        for i in 0..4 {
            let b = RecvBuf {
                addr: ra + (i * len) as u64,
                size: len as u64,
                tag: 0,
                mh: &rmh,
            };
            rreqs.push(g.r.irecv(g.now(), &[b]).unwrap().unwrap());
        }
        let mut sreqs = Vec::new();
        for d in &datas {
            let (sa, smh) = g.send_buf(d);
            sreqs.push(g.isend(sa, d.len() as u64, 0, &smh));
        }
        for (i, r) in rreqs.into_iter().enumerate() {
            assert_eq!(g.wait_recv(r).as_slice(), &[datas[i].len() as u64]);
            assert_eq!(
                g.fab.read(ra + (i * len) as u64, datas[i].len()).unwrap(),
                datas[i],
                "seed {seed}"
            );
        }
        for r in sreqs {
            g.wait_send(r);
        }
    }
}

#[test]
fn receives_stay_posted() {
    let mut g = rig(2);
    let depth = g.fab.posted_recvs(g.rid, 0);
    assert_eq!(depth, MAX_REQUESTS * MAX_RECVS);
    let (ra, rmh) = g.recv_buf(1 << 18, MemKind::Host);
    let (sa, smh) = g.send_buf(&pattern(1 << 18, 0));
    for _ in 0..3 {
        let rr = g.irecv1(ra, 1 << 18, 0, &rmh);
        let sr = g.isend(sa, 1 << 18, 0, &smh);
        g.wait_send(sr);
        g.wait_recv(rr);
    }
    assert_eq!(g.fab.posted_recvs(g.rid, 0), depth);
    assert_eq!(g.fab.posted_recvs(g.rid, 1), depth);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Patterns over random sizes, 1–4 paths of random speeds, grouped receives, reordering.
    #[test]
    fn data_integrity(
        speeds in proptest::collection::vec(1_000u64..400_000, 1..=4),
        sizes in proptest::collection::vec(0usize..150_000, 1..=4),
        slack in 0usize..5000,
        seed in proptest::option::of(1u64..1000),
        min_chunk in 512u64..65_536,
    ) {
        let pcfg = ProtocolConfig { stripe: StripeParams { min_chunk, align: 128 }, ..ProtocolConfig::default() };
        let mut g = rig_with(&speeds, 0, MemFabConfig { reorder_seed: seed, copy_data: true, ..MemFabConfig::default() }, pcfg);
        let n = sizes.len();
        let cap = 150_000 + slack;
        let mut rb = Vec::new();
        for _ in 0..n {
            rb.push(g.recv_buf(cap, MemKind::Host));
        }
        let bufs: Vec<RecvBuf> = (0..n).map(|i| RecvBuf { addr: rb[i].0, size: cap as u64, tag: 10 + i as u32, mh: &rb[i].1 }).collect();
        let rr = g.r.irecv(g.now(), &bufs).unwrap().unwrap();
        let mut sreqs = Vec::new();
        let mut datas = Vec::new();
        for (i, &sz) in sizes.iter().enumerate().rev() {
            let d = pattern(sz, i as u8 * 17 + 1);
            let (sa, smh) = g.send_buf(&d);
            sreqs.push(g.isend(sa, sz as u64, 10 + i as u32, &smh));
            datas.push((i, d));
        }
        let got = g.wait_recv(rr);
        let want: Vec<u64> = sizes.iter().map(|&s| s as u64).collect();
        prop_assert_eq!(got.as_slice(), &want[..]);
        for (i, d) in &datas {
            prop_assert_eq!(&g.fab.read(rb[*i].0, d.len()).unwrap(), d);
            prop_assert_eq!(g.fab.read(rb[*i].0 + d.len() as u64, 8).unwrap(), vec![0xEE; 8]);
        }
        for r in sreqs {
            g.wait_send(r);
        }
    }
}

#[test]
fn more_flushes_than_requests_is_an_error_not_a_silent_none() {
    let mut g = rig_with(
        &[100_000],
        1,
        MemFabConfig::default(),
        ProtocolConfig::default(),
    );
    let (ga, gmh) = g.recv_buf(64, MemKind::Cuda);
    g.fab.stall(g.rid, true);
    for _ in 0..MAX_REQUESTS {
        assert!(
            g.r.iflush(
                g.now(),
                &[FlushBuf {
                    addr: ga,
                    size: 64,
                    mh: &gmh
                }]
            )
            .unwrap()
            .is_some()
        );
    }
    let e =
        g.r.iflush(
            g.now(),
            &[FlushBuf {
                addr: ga,
                size: 64,
                mh: &gmh,
            }],
        )
        .unwrap_err();
    assert!(matches!(e, Error::Internal(_)), "{e}");
}

#[test]
fn corrupt_clear_to_send_entries_are_rejected() {
    use switchless::transport::wire::{self, CtsElem, SLOT_HDR, SLOT_WORDS};
    let mut g = rig(2);
    let fifo = g.s.local_info().addr;
    let (sa, smh) = g.send_buf(&[0; 8]);
    // Writes entry 0 whole (its check word matching) with header `hdr`.
    let put = |g: &mut Rig, hdr: u64| {
        let mut w = [0u64; SLOT_WORDS];
        let len = wire::encode_slot(0, &[CtsElem::default()], 2, &mut w);
        w[SLOT_HDR] = hdr;
        w[len - 1] = wire::slot_check(&w[..len - 1]);
        for (k, x) in w.iter().enumerate().take(len) {
            g.fab.write(fifo + 8 * k as u64, &x.to_le_bytes()).unwrap();
        }
        len
    };
    // A whole entry whose header is garbage.
    put(&mut g, 0xdead_be01);
    let e = g.s.isend(g.now(), sa, 8, 0, &smh).unwrap_err();
    assert!(
        matches!(e, Error::Remote(_)) && e.to_string().contains("magic"),
        "{e}"
    );
    // Right magic, 9 buffers.
    put(&mut g, 9u64 | (2 << 8) | (0x5C75 << 32));
    let e = g.s.isend(g.now(), sa, 8, 0, &smh).unwrap_err();
    assert!(e.to_string().contains("accepted: 1..=8"), "{e}");
    // Right magic, wrong path count.
    put(&mut g, 1u64 | (3 << 8) | (0x5C75 << 32));
    let e = g.s.isend(g.now(), sa, 8, 0, &smh).unwrap_err();
    assert!(e.to_string().contains("3 data paths"), "{e}");
    // A valid header whose check word does not match (a torn or forged entry): never taken, the
    // send waits for a whole one.
    let len = put(&mut g, 1u64 | (2 << 8) | (0x5C75 << 32));
    g.fab
        .write(fifo + 8 * (len as u64 - 1), &7u64.to_le_bytes())
        .unwrap();
    assert!(g.s.isend(g.now(), sa, 8, 0, &smh).unwrap().is_none());
}

#[test]
fn control_info_exchange_is_checked() {
    let fab = MemFab::new(MemFabConfig::default());
    let (a, b) = fab.pair(&[1, 1], 0);
    let mut s = SendComm::new(a, ProtocolConfig::default()).unwrap();
    let r = RecvComm::new(b, ProtocolConfig::default()).unwrap();
    let mut info = r.local_info();
    info.rkeys.pop();
    let e = s.connect(info).unwrap_err();
    assert!(e.to_string().contains("1 data paths"), "{e}");
    let mut info = r.local_info();
    info.words = 3;
    assert!(matches!(s.connect(info), Err(Error::Remote(_))));
    // Not connected: isend is refused.
    let addr = fab.alloc(8).unwrap();
    let mh = s.reg_mr(&Lent::simulated(addr, 8), MemKind::Host).unwrap();
    assert!(matches!(
        s.isend(Instant::now(), addr, 8, 0, &mh),
        Err(Error::InvalidArgument(_))
    ));
}

/// Sender and receiver on two threads (as two processes would be), pipelined 8 deep, over 3 paths.
#[test]
fn two_threads_pipelined() {
    use std::collections::VecDeque;
    use std::time::Instant;
    const N: usize = 600;
    const DEPTH: usize = 8;
    const CAP: usize = 48 * 1024;
    const POOL: usize = 1 << 20;
    let pcfg = ProtocolConfig {
        stripe: StripeParams {
            min_chunk: 4096,
            align: 128,
        },
        ..ProtocolConfig::default()
    };
    let fab = MemFab::new(MemFabConfig::default());
    let (a, b) = fab.pair(&[100_000, 200_000, 100_000], 0);
    let (mut s, mut r) = connect_pair(a, b, pcfg).unwrap();
    let size = |i: usize| (i * 7919) % CAP;
    let off = |i: usize| (i * 4099) % (POOL - CAP);
    let pool = pattern(POOL, 77);
    let sa = fab.alloc(POOL).unwrap();
    fab.write(sa, &pool).unwrap();
    let smh = s.reg_mr(&Lent::simulated(sa, POOL), MemKind::Host).unwrap();
    let ra = fab.alloc(CAP * DEPTH).unwrap();
    let rmh = r
        .reg_mr(&Lent::simulated(ra, CAP * DEPTH), MemKind::Host)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);

    let sender = std::thread::spawn(move || {
        let mut q = VecDeque::new();
        let mut next = 0;
        let mut done = 0;
        while done < N {
            assert!(Instant::now() < deadline, "sender stuck at {done}/{N}");
            if next < N && q.len() < DEPTH {
                if let Some(req) = s
                    .isend(
                        Instant::now(),
                        sa + off(next) as u64,
                        size(next) as u64,
                        0,
                        &smh,
                    )
                    .unwrap()
                {
                    q.push_back((req, next));
                    next += 1;
                }
            }
            if let Some(&(req, i)) = q.front() {
                if let Some(n) = s.test(Instant::now(), req).unwrap() {
                    assert_eq!(n, size(i) as u64);
                    q.pop_front();
                    done += 1;
                }
            }
        }
        s.close().unwrap();
    });

    let mut q = VecDeque::new();
    let mut next = 0;
    let mut done = 0;
    while done < N {
        assert!(Instant::now() < deadline, "receiver stuck at {done}/{N}");
        if next < N && q.len() < DEPTH {
            let slot = next % DEPTH;
            let buf = RecvBuf {
                addr: ra + (slot * CAP) as u64,
                size: CAP as u64,
                tag: 0,
                mh: &rmh,
            };
            if let Some(req) = r.irecv(Instant::now(), &[buf]).unwrap() {
                q.push_back((req, next));
                next += 1;
            }
        }
        if let Some(&(req, i)) = q.front() {
            if let Some(sizes) = r.test(Instant::now(), req).unwrap() {
                assert_eq!(sizes.as_slice(), &[size(i) as u64]);
                let got = fab.read(ra + ((i % DEPTH) * CAP) as u64, size(i)).unwrap();
                assert!(
                    got == pool[off(i)..off(i) + size(i)],
                    "message {i} corrupted"
                );
                q.pop_front();
                done += 1;
            }
        }
    }
    sender.join().unwrap();
    r.close().unwrap();
}

#[test]
fn dmabuf_registration_is_gpu_memory_and_gets_flushed() {
    use std::os::fd::AsFd;
    let mut g = rig_with(
        &[100_000],
        1,
        MemFabConfig::default(),
        ProtocolConfig::default(),
    );
    let addr = g.fab.alloc(4096).unwrap();
    let file = tempfile::tempfile().unwrap();
    let mh =
        g.r.reg_mr_dmabuf(&Lent::simulated(addr, 4096), 0, file.as_fd())
            .unwrap();
    drop(file); // NCCL closes the fd right after regMrDmaBuf.
    assert_eq!(mh.kind(), MemKind::Cuda);
    let (sa, smh) = g.send_buf(&pattern(4096, 5));
    let rr =
        g.r.irecv(
            g.now(),
            &[RecvBuf {
                addr,
                size: 4096,
                tag: 0,
                mh: &mh,
            }],
        )
        .unwrap()
        .unwrap();
    let sr = g.isend(sa, 4096, 0, &smh);
    g.wait_send(sr);
    assert_eq!(g.wait_recv(rr).as_slice(), &[4096]);
    let f =
        g.r.iflush(
            g.now(),
            &[FlushBuf {
                addr,
                size: 4096,
                mh: &mh,
            }],
        )
        .unwrap()
        .expect("GPU memory is flushed");
    g.wait_recv(f);
    assert_eq!(g.fab.read(addr, 4096).unwrap(), pattern(4096, 5));
    g.r.dereg_mr(mh).unwrap();
}

/// Captures WARN events (a minimal `tracing` subscriber; no extra dependency).
mod capture {
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    #[derive(Clone, Default)]
    pub struct Warns(pub Arc<Mutex<Vec<String>>>);

    struct Text(String);
    impl Visit for Text {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={:?} ", field.name(), value));
        }
    }

    impl Subscriber for Warns {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, e: &Event<'_>) {
            if *e.metadata().level() == Level::WARN {
                let mut t = Text(String::new());
                e.record(&mut t);
                self.0.lock().unwrap().push(t.0);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

#[test]
fn one_warning_per_failed_path_naming_path_and_status() {
    let warns = capture::Warns::default();
    let w2 = warns.clone();
    tracing::subscriber::with_default(w2, || {
        // Failover off: every request on the failed path fails (tests/failover.rs: with it on).
        let mut g = rig_with(
            &[100_000, 100_000],
            0,
            MemFabConfig::default(),
            no_failover(),
        );
        let (ra, rmh) = g.recv_buf(1 << 20, MemKind::Host);
        let (sa, smh) = g.send_buf(&pattern(1 << 20, 1));
        for _ in 0..3 {
            g.irecv1(ra, 1 << 20, 0, &rmh);
        }
        g.fab.fail_next(g.sid, 1, WcStatus::REM_ACCESS_ERR);
        let sreqs: Vec<Request> = (0..3).map(|_| g.isend(sa, 1 << 20, 0, &smh)).collect();
        // The first fails with the injected status, the later ones with flush errors: all fail.
        for sr in sreqs {
            assert!(matches!(
                g.s.test(g.now(), sr),
                Err(Error::Remote(_)) | Err(Error::System(_))
            ));
        }
    });
    let w = warns.0.lock().unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("memfab ep0 path1") && w[0].contains("remote access error"),
        "{}",
        w[0]
    );
}

#[test]
fn works_through_a_boxed_dyn_fabric() {
    use switchless::transport::fabric::Fabric;
    let fab = MemFab::new(MemFabConfig::default());
    let (a, b) = fab.pair(&[1, 1], 0);
    let a: Box<dyn Fabric + Send> = Box::new(a);
    let b: Box<dyn Fabric + Send> = Box::new(b);
    let (mut s, mut r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    let sa = fab.alloc(100).unwrap();
    fab.write(sa, &pattern(100, 3)).unwrap();
    let ra = fab.alloc(100).unwrap();
    let smh = s.reg_mr(&Lent::simulated(sa, 100), MemKind::Host).unwrap();
    let rmh = r.reg_mr(&Lent::simulated(ra, 100), MemKind::Host).unwrap();
    let rr = r
        .irecv(
            Instant::now(),
            &[RecvBuf {
                addr: ra,
                size: 100,
                tag: 0,
                mh: &rmh,
            }],
        )
        .unwrap()
        .unwrap();
    let sr = s.isend(Instant::now(), sa, 100, 0, &smh).unwrap().unwrap();
    assert_eq!(s.test(Instant::now(), sr).unwrap(), Some(100));
    assert_eq!(
        r.test(Instant::now(), rr).unwrap().unwrap().as_slice(),
        &[100]
    );
    assert_eq!(fab.read(ra, 100).unwrap(), pattern(100, 3));
    // Comms move to another thread (NCCL's progress thread).
    std::thread::spawn(move || drop((s, r))).join().unwrap();
}

/// Issue 36: the clear-to-send is one write whose words may land in any order. Landed word by
/// word in a random order, over nothing (slot 0's first use) and over the slot's previous entry
/// (its use 32 receives later), the entry is never taken before its last word is in place; then
/// it is, and the message arrives whole.
fn torn_clear_to_send_landing(order_seed: u64) {
    use switchless::transport::wire::{FIFO_DEPTH, SLOT_WORDS};
    let mut g = rig(2);
    let fifo = g.s.local_info().addr;
    let (ra, rmh) = g.recv_buf(64, MemKind::Host);
    let data = pattern(64, 9);
    let (sa, smh) = g.send_buf(&data);
    let read_slot = |g: &Rig| -> Vec<u64> {
        let b = g.fab.read(fifo, 8 * SLOT_WORDS).unwrap();
        b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let mut rng = order_seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut old = vec![0u64; SLOT_WORDS];
    for i in 0..=FIFO_DEPTH {
        g.fab.write(ra, &[0xEE; 64]).unwrap();
        let rreq = g.irecv1(ra, 64, 0, &rmh);
        if i % FIFO_DEPTH == 0 {
            // The entry the receiver wrote, taken back to what the slot held before it, then
            // landed again one word at a time in a random order.
            let new = read_slot(&g);
            let len = (0..SLOT_WORDS).rev().find(|&k| new[k] != old[k]).unwrap() + 1;
            for (k, w) in old.iter().enumerate().take(len) {
                g.fab.write(fifo + 8 * k as u64, &w.to_le_bytes()).unwrap();
            }
            // Words equal to the older ones (same buffer, unused keys) need not land.
            let mut order: Vec<usize> = (0..len).filter(|&k| new[k] != old[k]).collect();
            let n = order.len();
            for k in (1..n).rev() {
                order.swap(k, (next() % (k as u64 + 1)) as usize);
            }
            for (j, &k) in order.iter().enumerate() {
                assert!(
                    g.s.isend(g.now(), sa, 64, 0, &smh).unwrap().is_none(),
                    "taken with {j} of its {n} new words landed (order {order:?})"
                );
                g.fab
                    .write(fifo + 8 * k as u64, &new[k].to_le_bytes())
                    .unwrap();
            }
            old = new;
        }
        let sreq = g.isend(sa, 64, 0, &smh);
        g.wait_send(sreq);
        let s = g.wait_recv(rreq);
        assert_eq!(s.as_slice(), &[64]);
        assert_eq!(g.fab.read(ra, 64).unwrap(), data, "message {i}");
    }
}

#[test]
fn a_clear_to_send_landing_word_by_word_is_taken_only_whole() {
    for seed in 1..=24 {
        torn_clear_to_send_landing(seed * 0x9e37_79b9);
    }
}
