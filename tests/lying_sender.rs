//! A receive comm against a lying sender (security review findings 14 and 15): the "sender" is a raw
//! in-memory fabric endpoint driven by the test, which reads the clear-to-send the receiver wrote
//! and then posts whatever writes and immediates it likes. Every lie must fail the receive with a
//! `Remote` error naming what was wrong, never complete it and never panic; the sender's own
//! checks of a lying receiver (a CTS that wraps the address space, control memory that wraps) too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use switchless::error::Error;
use switchless::sys::Lent;
use switchless::transport::comm::{
    FailoverConfig, MemHandle, ProtocolConfig, RecvBuf, RecvComm, Request, SendComm, connect_pair,
};
use switchless::transport::fabric::{
    CtrlMem, Fabric, LocalSeg, MemKind, RemoteSeg, WcStatus, WriteWr,
};
use switchless::transport::memfab::{MemEndpoint, MemFab, MemFabConfig};
use switchless::transport::wire::{
    self, CtrlInfo, CtsElem, ELEM_WORDS, FIFO_DEPTH, FenceLayout, Imm, MAX_RECVS, RECV_SNAP_WORDS,
    SLOT_ELEMS, SLOT_IDX, SLOT_WORDS,
};

/// The receiver's posted buffer, in a registration twice its size (so a write past the posted size
/// still lands in registered memory, and only the protocol's check can catch it).
const POSTED: usize = 4096;

struct Liar {
    fab: MemFab,
    /// The lying sender's endpoint: one data path.
    ep: MemEndpoint,
    fifo: CtrlMem,
    /// Its record source word and its data source buffer, registered on its endpoint.
    src: u64,
    lkey: u32,
    r: RecvComm<MemEndpoint>,
    rmh: MemHandle,
    rbuf: u64,
    peer: CtrlInfo,
    now: Instant,
}

fn protocol(failover: bool) -> ProtocolConfig {
    let mut p = ProtocolConfig::default();
    if !failover {
        p.failover = FailoverConfig {
            enabled: false,
            ..p.failover
        };
    }
    p
}

fn liar(failover: bool) -> Liar {
    let fab = MemFab::new(MemFabConfig::default());
    let (mut ep, b) = fab.pair(&[100_000], 0);
    let mut r = RecvComm::new(b, protocol(failover)).unwrap();
    // The FIFO, then the inbox the receiver writes its failover fence words into, then the key
    // area (its key updates for standby paths; none here).
    let inbox = FenceLayout {
        npaths: 1,
        snap: RECV_SNAP_WORDS,
    };
    let fifo = ep
        .alloc_ctrl(FIFO_DEPTH * SLOT_WORDS + inbox.words() + wire::key_area_words(1))
        .unwrap();
    r.connect(CtrlInfo {
        addr: fifo.addr,
        words: fifo.words as u32,
        rkeys: vec![fifo.reg.keys[0].rkey],
        standby: 0,
    })
    .unwrap();
    let src = fab.alloc(2 * POSTED).unwrap();
    fab.write(src, &vec![0xA5; 2 * POSTED]).unwrap();
    let reg = ep
        .register(&Lent::simulated(src, 2 * POSTED), MemKind::Host)
        .unwrap();
    let rbuf = fab.alloc(2 * POSTED).unwrap();
    let rmh = r
        .reg_mr(&Lent::simulated(rbuf, 2 * POSTED), MemKind::Host)
        .unwrap();
    let peer = r.local_info();
    Liar {
        fab,
        lkey: reg.keys[0].lkey,
        ep,
        fifo,
        src,
        r,
        rmh,
        rbuf,
        peer,
        now: Instant::now(),
    }
}

impl Liar {
    /// Posts a receive of one `POSTED`-byte buffer; returns it and the clear-to-send the receiver
    /// wrote into the liar's FIFO (slot `seq % FIFO_DEPTH`).
    fn post(&mut self, seq: u64) -> (Request, CtsElem) {
        let req = self
            .r
            .irecv(
                self.now,
                &[RecvBuf {
                    addr: self.rbuf,
                    size: POSTED as u64,
                    tag: 7,
                    mh: &self.rmh,
                }],
            )
            .unwrap()
            .unwrap();
        let base = (seq as usize % FIFO_DEPTH) * SLOT_WORDS;
        let mut w = [0u64; SLOT_WORDS];
        for (k, x) in w.iter_mut().enumerate() {
            *x = self
                .ep
                .ctrl_load(self.fifo.word(base + k), Ordering::Acquire)
                .unwrap();
        }
        assert_eq!(w[SLOT_IDX], seq + 1, "the receiver wrote its clear-to-send");
        assert_eq!(
            wire::check_slot(&w, seq, 1).unwrap(),
            Some(1),
            "in one whole write"
        );
        let w = &w[SLOT_ELEMS..SLOT_ELEMS + ELEM_WORDS];
        (req, wire::decode_elem(w))
    }

    /// A write of `len` bytes from the liar's buffer to `addr` (the receiver's `rkey`), with `imm`.
    fn write(&mut self, addr: u64, rkey: u32, len: u32, imm: Option<u32>) {
        let wr = WriteWr {
            wr_id: 1,
            local: LocalSeg {
                addr: self.src,
                len,
                lkey: self.lkey,
            },
            remote: RemoteSeg { addr, rkey },
            imm,
            signaled: true,
            inline: false,
        };
        self.ep.post_write(0, &wr).unwrap();
    }

    /// Writes a size record for buffer 0 of `slot` (what the real sender does before its immediate).
    fn record(&mut self, slot: usize, size: u64, seq: u64) {
        let word = self.fab.alloc(8).unwrap();
        self.fab
            .write(word, &wire::encode_record(size, seq).to_le_bytes())
            .unwrap();
        let reg = self
            .ep
            .register(&Lent::simulated(word, 8), MemKind::Host)
            .unwrap();
        let wr = WriteWr {
            wr_id: 2,
            local: LocalSeg {
                addr: word,
                len: 8,
                lkey: reg.keys[0].lkey,
            },
            remote: RemoteSeg {
                addr: self.peer.addr + 8 * (slot * MAX_RECVS) as u64,
                rkey: self.peer.rkeys[0],
            },
            imm: None,
            signaled: false,
            inline: false,
        };
        self.ep.post_write(0, &wr).unwrap();
    }

    /// Tests `req` until it is done or fails (the writes land within a few polls).
    fn outcome(&mut self, req: Request) -> Result<u64, Error> {
        for _ in 0..100 {
            if let Some(sizes) = self.r.test(self.now, req)? {
                return Ok(sizes.as_slice()[0]);
            }
        }
        panic!("the receive neither completed nor failed");
    }
}

fn imm(slot: usize, elem: usize, npieces: usize, piece: usize, seq: u64, len_is_size: bool) -> u32 {
    Imm {
        slot,
        elem,
        npieces,
        piece,
        seq16: seq as u16,
        len_is_size,
    }
    .encode()
}

fn remote(e: Result<u64, Error>, what: &str) -> String {
    match e {
        Err(Error::Remote(m)) => {
            assert!(m.contains(what), "{m}");
            m
        }
        other => panic!("expected a Remote error naming {what:?}, got {other:?}"),
    }
}

/// The harness itself: an honest message through it completes with its size.
#[test]
fn an_honest_sender_through_the_harness_completes() {
    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.write(el.addr, el.rkeys[0], 100, Some(imm(0, 0, 1, 0, 0, true)));
    assert_eq!(g.outcome(req).unwrap(), 100);
}

/// Finding 15: more bytes than the receiver posted (one-write message: the write's length).
#[test]
fn a_write_larger_than_the_posted_buffer_fails_the_receive() {
    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.write(
        el.addr,
        el.rkeys[0],
        2 * POSTED as u32,
        Some(imm(0, 0, 1, 0, 0, true)),
    );
    remote(
        g.outcome(req),
        "8192 bytes into a receive buffer of 4096 bytes",
    );
}

/// Finding 15: a size record claiming more than was posted.
#[test]
fn a_size_record_larger_than_the_posted_buffer_fails_the_receive() {
    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.record(0, 1 << 20, 0);
    g.write(el.addr, el.rkeys[0], 16, Some(imm(0, 0, 1, 0, 0, false)));
    remote(
        g.outcome(req),
        "1048576 bytes into a receive buffer of 4096 bytes",
    );
}

/// Finding 15: a record of another FIFO sequence (stale or replayed).
#[test]
fn a_size_record_of_another_sequence_fails_the_receive() {
    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.record(0, 16, 5);
    g.write(el.addr, el.rkeys[0], 16, Some(imm(0, 0, 1, 0, 0, false)));
    remote(
        g.outcome(req),
        "size record carries sequence 0x5; expected 0x0",
    );
}

/// Finding 15: an immediate naming a buffer the receiver did not post (the wire has no tag: the
/// sender matched it; the receiver sees only slot and buffer) or a sequence out of the window.
#[test]
fn an_immediate_for_an_unposted_buffer_or_sequence_fails_the_receive() {
    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.write(el.addr, el.rkeys[0], 16, Some(imm(0, 1, 1, 0, 0, true)));
    remote(
        g.outcome(req),
        "slot 0 buffer 1 sequence 0x0 matches no posted receive",
    );

    let mut g = liar(true);
    let (req, el) = g.post(0);
    g.write(el.addr, el.rkeys[0], 16, Some(imm(0, 0, 1, 0, 7, true)));
    remote(
        g.outcome(req),
        "slot 0 buffer 0 sequence 0x7 matches no posted receive",
    );

    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.write(el.addr, el.rkeys[0], 16, Some(imm(3, 0, 1, 0, 0, true)));
    remote(
        g.outcome(req),
        "slot 3 buffer 0 sequence 0x0 matches no posted receive",
    );
}

/// Finding 15: an earlier message's immediate sent again after its receive completed. Without
/// failover it is an error; with failover it is a late copy of a piece that was moved, ignored,
/// and the slot's next use still completes with the right size.
#[test]
fn a_replayed_immediate_is_refused_or_ignored_as_a_late_copy() {
    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.write(el.addr, el.rkeys[0], 64, Some(imm(0, 0, 1, 0, 0, true)));
    assert_eq!(g.outcome(req).unwrap(), 64);
    let (req, _) = g.post(1);
    g.write(el.addr, el.rkeys[0], 64, Some(imm(0, 0, 1, 0, 0, true)));
    remote(
        g.outcome(req),
        "slot 0 buffer 0 sequence 0x0 matches no posted receive",
    );

    let mut g = liar(true);
    let (req, el) = g.post(0);
    g.write(el.addr, el.rkeys[0], 64, Some(imm(0, 0, 1, 0, 0, true)));
    assert_eq!(g.outcome(req).unwrap(), 64);
    let (req, el1) = g.post(1);
    g.write(el.addr, el.rkeys[0], 64, Some(imm(0, 0, 1, 0, 0, true)));
    g.write(el1.addr, el1.rkeys[0], 32, Some(imm(1, 0, 1, 0, 1, true)));
    assert_eq!(g.outcome(req).unwrap(), 32);
}

/// Finding 15: pieces that disagree on the piece count, and a piece sent twice without failover.
#[test]
fn inconsistent_or_duplicate_pieces_fail_the_receive() {
    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.write(el.addr, el.rkeys[0], 16, Some(imm(0, 0, 2, 0, 0, false)));
    g.write(
        el.addr + 16,
        el.rkeys[0],
        16,
        Some(imm(0, 0, 3, 1, 0, false)),
    );
    remote(g.outcome(req), "3 pieces announced, 2 before");

    let mut g = liar(false);
    let (req, el) = g.post(0);
    g.write(el.addr, el.rkeys[0], 16, Some(imm(0, 0, 2, 0, 0, false)));
    g.write(el.addr, el.rkeys[0], 16, Some(imm(0, 0, 2, 0, 0, false)));
    remote(g.outcome(req), "piece 0 of slot 0 buffer 0 arrived twice");
}

/// A write outside the buffer's registration is refused by the fabric (as a NIC checks the rkey's
/// range): the liar gets a remote access error, nothing lands, the receive stays posted.
#[test]
fn a_write_outside_the_registration_lands_nothing() {
    let mut g = liar(false);
    let (req, el) = g.post(0);
    let before = g.fab.read(g.rbuf, 2 * POSTED).unwrap();
    g.write(
        el.addr + 2 * POSTED as u64,
        el.rkeys[0],
        16,
        Some(imm(0, 0, 1, 0, 0, true)),
    );
    let mut out = Vec::new();
    let mut status = None;
    for _ in 0..100 {
        out.clear();
        g.ep.poll(0, 8, &mut out).unwrap();
        if let Some(c) = out.first() {
            status = Some(c.status);
            break;
        }
    }
    assert_eq!(status, Some(WcStatus::REM_ACCESS_ERR));
    assert_eq!(g.r.test(g.now, req).unwrap(), None, "still posted");
    assert_eq!(g.fab.read(g.rbuf, 2 * POSTED).unwrap(), before);
}

/// Finding 14: a clear-to-send whose buffer address plus size wraps the address space fails the
/// send with a `Remote` error (it panicked in debug builds, poisoning the comm, and wrapped in
/// release builds).
#[test]
fn a_clear_to_send_that_wraps_the_address_space_fails_the_send() {
    let fab = MemFab::new(MemFabConfig::default());
    let (a, b) = fab.pair(&[100_000, 100_000], 0);
    let (mut s, _r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    let fifo = s.local_info().addr;
    let src = fab.alloc(128 << 10).unwrap();
    let smh = s
        .reg_mr(&Lent::simulated(src, 128 << 10), MemKind::Host)
        .unwrap();
    let el = CtsElem {
        addr: u64::MAX - 100,
        size: 256 << 10,
        tag: 0,
        rkeys: [1; switchless::transport::stripe::MAX_PATHS],
    };
    let mut words = [0u64; SLOT_WORDS];
    let len = wire::encode_slot(0, &[el], 2, &mut words);
    for (k, w) in words.iter().enumerate().take(len) {
        fab.write(fifo + 8 * k as u64, &w.to_le_bytes()).unwrap();
    }
    let e = s
        .isend(Instant::now(), src, 128 << 10, 0, &smh)
        .unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("wraps the address space")),
        "{e}"
    );
    // The comm is not poisoned: the next call gives the same clear error, not a panic's.
    let e = s
        .isend(Instant::now(), src, 128 << 10, 0, &smh)
        .unwrap_err();
    assert!(e.to_string().contains("wraps"), "{e}");
}

/// Finding 14: control memory (a FIFO or record array) whose end wraps is refused at connect.
#[test]
fn control_memory_that_wraps_is_refused_at_connect() {
    let fab = MemFab::new(MemFabConfig::default());
    let (a, b) = fab.pair(&[100_000], 0);
    let mut s = SendComm::new(a, ProtocolConfig::default()).unwrap();
    let mut r = RecvComm::new(b, ProtocolConfig::default()).unwrap();
    let mut info = r.local_info();
    info.addr = u64::MAX - 7;
    let e = s.connect(info).unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("wraps the address space")),
        "{e}"
    );
    let mut info = s.local_info();
    info.addr = (u64::MAX - 8 * 100) & !7;
    let e = r.connect(info).unwrap_err();
    assert!(
        matches!(&e, Error::Remote(m) if m.contains("wraps the address space")),
        "{e}"
    );
}

impl Liar {
    /// Posts receives 0..3, lets the first one's signaled clear-to-send completion be polled 1 ms
    /// later (the receiver's round trip: 1 ms), then, 3 ms on with none of them taken (the
    /// sender holds three unused), posts `held` more, which the receiver holds back.
    fn hold_back(&mut self, held: usize) -> (Vec<(Request, CtsElem)>, Vec<Request>) {
        let taken: Vec<_> = (0..3).map(|seq| self.post(seq)).collect();
        self.now += Duration::from_millis(1);
        assert!(self.r.test(self.now, taken[0].0).unwrap().is_none());
        self.now += Duration::from_millis(3);
        let mut reqs = Vec::new();
        for seq in 3..3 + held as u64 {
            let b = [RecvBuf {
                addr: self.rbuf,
                size: POSTED as u64,
                tag: 7,
                mh: &self.rmh,
            }];
            reqs.push(self.r.irecv(self.now, &b).unwrap().unwrap());
            assert!(!self.landed(seq), "entry {seq} held back");
        }
        (taken, reqs)
    }

    /// Whether the entry of `seq` is whole in the liar's FIFO.
    fn landed(&self, seq: u64) -> bool {
        let base = (seq as usize % FIFO_DEPTH) * SLOT_WORDS;
        let mut w = [0u64; SLOT_WORDS];
        for (k, x) in w.iter_mut().enumerate() {
            *x = self
                .ep
                .ctrl_load(self.fifo.word(base + k), Ordering::Acquire)
                .unwrap();
        }
        wire::check_slot(&w, seq, 1).unwrap() == Some(1)
    }
}

/// Issue 36: while the sender holds three unused entries, the receiver holds new ones back and
/// posts them in one write over their consecutive slots once two are held, or alone once the
/// sender takes one. A
/// sender that claims data for an entry held back cannot have read it: the receive fails with a
/// `Remote` error, never completes.
#[test]
fn entries_held_back_go_in_one_write_and_cannot_be_claimed_before() {
    let stats = |g: &Liar| {
        let c = g.r.cts_stats();
        (c.entries, c.writes)
    };
    // Two held (the most one write takes): both go at once, in one write.
    let mut g = liar(false);
    let (_taken, mut held) = g.hold_back(1);
    assert_eq!(stats(&g), (3, 3));
    let b = [RecvBuf {
        addr: g.rbuf,
        size: POSTED as u64,
        tag: 7,
        mh: &g.rmh,
    }];
    held.push(g.r.irecv(g.now, &b).unwrap().unwrap());
    assert!(g.landed(3) && g.landed(4), "the held entries were posted");
    assert_eq!(stats(&g), (5, 4));
    drop(held);

    // The sender takes entry 0 (its message arrives): two unused left, the held one goes.
    let mut g = liar(false);
    let (taken, held) = g.hold_back(1);
    let el = taken[0].1;
    g.write(el.addr, el.rkeys[0], 16, Some(imm(0, 0, 1, 0, 0, true)));
    assert_eq!(g.outcome(taken[0].0).unwrap(), 16);
    assert!(g.landed(3), "the held entry was posted");
    assert_eq!(stats(&g), (4, 4));
    drop(held);

    let mut g = liar(false);
    let (taken, held) = g.hold_back(1);
    let el = taken[0].1;
    g.write(el.addr, el.rkeys[0], 16, Some(imm(3, 0, 1, 0, 3, true)));
    remote(
        g.outcome(held[0]),
        "slot 3 (FIFO sequence 3) whose clear-to-send was not sent yet",
    );
}
