//! One TCP stream's state machines, driven by the I/O worker that holds the stream (`super::pool`)
//! when its socket is ready: the receiver reads a header (possibly in pieces), then places the
//! payload straight into registered memory in chunks of at most [`CHUNK_BYTES`] (or buffers it for
//! control memory) and applies the path's ordered effects in sequence order; the sender resumes a
//! partly sent frame, header then payload. One function per phase; nothing blocks (the sockets are
//! non-blocking), and a turn moves at most [`TURN_BYTES`] per direction.
#![forbid(unsafe_code)]

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Interest, Poll, Token};

use super::frame::{Frame, FrameRepr, HEADER_LEN};
use super::state::{
    Effect, NO_WR, PathShared, Payload, Reg, RegMem, Shared, StreamShared, TxFrame,
};
use super::window::{self, Verdict};
use crate::error::Error;
use crate::sys::socket as rawmem;
use crate::transport::fabric::{Completion, WcOpcode, WcStatus};

/// Largest piece of a payload received into or sent from registered memory with the
/// registration's lock held (one `recv`/`send` call), bytes.
pub const CHUNK_BYTES: usize = 1 << 20;
/// Bytes a stream may move per direction before the worker turns to its other streams.
pub const TURN_BYTES: usize = 2 << 20;

/// Sequence numbers a frame may be ahead of the next one to apply on its path.
const SEQ_WINDOW: u64 = 1 << 20;
/// Frames a receiver holds out of order per path (each an entry of about 100 bytes, whatever its
/// payload: data lands in place at once) before it calls the peer broken. A real sender is never
/// this far ahead: frames of a write are at least 4 KiB (64 KiB unless copied at post), a path
/// has at most 16 streams each with a few MiB of socket buffer, and small control writes are
/// bounded by the protocol's FIFO and request counts.
pub const MAX_OUT_OF_ORDER: usize = 16_384;
/// Control-memory payload a receiver buffers out of order per path before it calls the peer broken
/// (control writes are clear-to-send entries and size records, bytes each).
pub const MAX_BUFFERED_CTRL: usize = 4 << 20;

/// Where a stream's receiver is in the current frame.
enum RxPhase {
    /// Reading a header; `got` bytes of it are in `buf`.
    Header { buf: [u8; HEADER_LEN], got: usize },
    /// Placing a payload straight into registered data memory; `off` bytes are in place.
    Raw {
        h: FrameRepr,
        reg: Arc<Reg>,
        off: usize,
    },
    /// Buffering a payload bound for control memory (applied in sequence order when whole).
    Ctrl {
        h: FrameRepr,
        reg: Arc<Reg>,
        buf: Vec<u8>,
        got: usize,
    },
}

impl RxPhase {
    fn header() -> RxPhase {
        RxPhase::Header {
            buf: [0; HEADER_LEN],
            got: 0,
        }
    }
}

/// Bytes bound for control memory: the registration, the address and the bytes.
type CtrlWrite = (Arc<Reg>, u64, Vec<u8>);

/// What one receive did.
enum RxStep {
    /// `n` bytes arrived; the phase goes on.
    Partial(usize),
    /// The header is whole (its last `n` bytes arrived).
    Header(FrameRepr, usize),
    /// The payload is whole (its last `n` bytes arrived): the frame has landed.
    Landed(FrameRepr, Option<CtrlWrite>, usize),
}

/// Where a stream's sender is.
enum TxPhase {
    /// No frame in hand: the next one comes from the queue.
    Idle,
    /// Sending the header of `frame`; `off` bytes are with the kernel.
    Header { frame: TxFrame, off: usize },
    /// Sending the payload of `frame`; `off` bytes are with the kernel.
    Payload { frame: TxFrame, off: usize },
}

impl TxPhase {
    fn frame(&self) -> Option<&TxFrame> {
        match self {
            TxPhase::Idle => None,
            TxPhase::Header { frame, .. } | TxPhase::Payload { frame, .. } => Some(frame),
        }
    }
}

/// Why a sender stopped.
enum TxErr {
    Io(io::Error),
    /// The source was deregistered before it was sent (a local protection error).
    Deregistered(String),
    /// A broken invariant on this side (a poisoned lock, a raw payload from control memory).
    Internal(String),
}

/// Why a receiver stopped.
enum RxErr {
    Eof,
    /// The peer's close frame; `true` when it dropped work (not orderly).
    Goodbye(bool),
    Io(io::Error),
    Violation(String),
    /// A broken invariant on this side (a poisoned lock).
    Internal(Error),
}

impl RxErr {
    /// For logs.
    fn text(&self) -> String {
        match self {
            RxErr::Eof => "end of stream".into(),
            RxErr::Goodbye(dirty) => format!("close frame (dirty: {dirty})"),
            RxErr::Io(e) => e.to_string(),
            RxErr::Violation(w) => w.clone(),
            RxErr::Internal(e) => e.to_string(),
        }
    }

    /// The peer sent what the wire format refuses.
    fn violation(e: Error) -> RxErr {
        match e {
            Error::Remote(why) => RxErr::Violation(why),
            e => RxErr::Violation(e.to_string()),
        }
    }
}

/// How a direction's turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// The socket would block: wait for readiness.
    Blocked,
    /// Its share of this turn is used up; more can be done at once.
    More,
    /// Nothing to do (sender: queue empty) or this direction has ended.
    Idle,
}

pub(super) struct StreamIo {
    pub(super) sh: Arc<Shared>,
    /// The path generation this stream belongs to (a rebuilt path has new streams and state).
    pub(super) path: Arc<PathShared>,
    pub(super) s: usize,
    pub(super) id: usize,
    pub(super) fd: RawFd,
    rx: RxPhase,
    pub(super) rx_ready: bool,
    pub(super) rx_done: bool,
    /// Bytes were read since the last quick ACK (see `rx_turn`).
    rx_unacked: bool,
    /// Relayed paths: the peer's write frames that landed on this stream, and the count the last
    /// acknowledgement frame carried (see [`StreamIo::acknowledge`]).
    landed: u64,
    acked: u64,
    tx: TxPhase,
    pub(super) tx_ready: bool,
    pub(super) tx_done: bool,
    /// `WRITABLE` is part of the registered interest.
    want_write: bool,
    pub(super) queued_to_run: bool,
    /// When the window guard looks at this stream next (`super::window`): set while bytes the
    /// peer has not acknowledged may be in the kernel.
    pub(super) next_guard: Option<Instant>,
    /// The stream's user timeout is suspended: the peer's window is closed, the peer alive.
    suspended: bool,
}

impl StreamIo {
    pub(super) fn new(sh: Arc<Shared>, path: Arc<PathShared>, s: usize, id: usize) -> StreamIo {
        let fd = path.streams[s].sock.as_raw_fd();
        StreamIo {
            sh,
            path,
            s,
            id,
            fd,
            rx: RxPhase::header(),
            rx_ready: false,
            rx_done: false,
            rx_unacked: false,
            landed: 0,
            acked: 0,
            tx: TxPhase::Idle,
            tx_ready: false,
            tx_done: false,
            want_write: false,
            queued_to_run: false,
            next_guard: None,
            suspended: false,
        }
    }

    /// The window guard (`super::window`): a peer that stopped reading, but answers, keeps its
    /// stream; one that answers no window probe loses it. Called when [`StreamIo::next_guard`] is
    /// due; sets the next time, or none once nothing is outstanding.
    pub(super) fn guard(&mut self, now: Instant) {
        self.next_guard = None;
        let Some(timeout) = self.sh.user_timeout else {
            return;
        };
        if self.tx_done || self.sh.stop.load(Ordering::Relaxed) {
            return;
        }
        let path = Arc::clone(&self.path);
        let sock = &path.streams[self.s].sock;
        let Ok(info) = rawmem::tcp_info(sock) else {
            return;
        };
        match window::verdict(&info, self.suspended, timeout) {
            Verdict::Nothing => {}
            Verdict::Suspend => {
                if rawmem::set_user_timeout(sock, 0).is_ok() {
                    self.suspended = true;
                    tracing::debug!(
                        "NET/switchless: TCP path {} stream {}: the peer's receive window is closed \
                         and it answers: its user timeout is suspended (a slow peer is not a dead one)",
                        path.label,
                        self.s
                    );
                }
            }
            Verdict::Restore => self.restore_timeout(),
            Verdict::Dead(why) => {
                self.tx_done = true;
                self.tx_failed(
                    WcStatus::RETRY_EXC_ERR,
                    self.tx.frame().map(|f| f.wr).filter(|&w| w != NO_WR),
                    &format!("stream {}: {why}", self.s),
                );
                return;
            }
        }
        let outstanding = info.unacked > 0 || info.notsent_bytes > 0;
        if outstanding || self.suspended {
            self.next_guard = Some(now + window::guard_every(timeout));
        }
    }

    /// Puts the stream's user timeout back after [`StreamIo::guard`] suspended it.
    fn restore_timeout(&mut self) {
        if !self.suspended {
            return;
        }
        let ms = window::timeout_ms(self.sh.user_timeout);
        if rawmem::set_user_timeout(&self.path.streams[self.s].sock, ms).is_ok() {
            self.suspended = false;
        }
    }

    /// One turn of each direction that is ready; keeps `WRITABLE` interest while a frame waits.
    pub(super) fn service(&mut self, poll: &Poll) {
        if self.rx_ready && self.path.rx_held.load(Ordering::Relaxed) {
            // Held (tests): looked at again on the next turn, read once released.
        } else if self.rx_ready {
            let t = if self.rx_done || self.sh.stop.load(Ordering::Relaxed) {
                Turn::Idle
            } else {
                match self.rx_turn() {
                    Ok(t) => t,
                    Err(e) => {
                        self.rx_done = true;
                        self.rx_ended(e);
                        Turn::Idle
                    }
                }
            };
            self.rx_ready = t == Turn::More;
        }
        if self.tx_ready {
            let written = self.path.streams[self.s].written.load(Ordering::Relaxed);
            let t = if self.tx_done || self.sh.stop.load(Ordering::Relaxed) {
                Turn::Idle
            } else {
                self.tx_turn()
            };
            self.tx_ready = t == Turn::More;
            let wrote = self.path.streams[self.s].written.load(Ordering::Relaxed) != written;
            if wrote {
                // Bytes went to the kernel: the window opened (or was open).
                self.restore_timeout();
            }
            if (wrote || t == Turn::Blocked)
                && self.next_guard.is_none()
                && let Some(timeout) = self.sh.user_timeout
            {
                self.next_guard = Some(Instant::now() + window::guard_every(timeout));
            }
            // WRITABLE interest only while a frame waits for room.
            let want = match t {
                Turn::Blocked => true,
                Turn::More => self.want_write,
                Turn::Idle => false,
            };
            if want != self.want_write {
                let interest = if want {
                    Interest::READABLE | Interest::WRITABLE
                } else {
                    Interest::READABLE
                };
                match poll
                    .registry()
                    .reregister(&mut SourceFd(&self.fd), Token(self.id), interest)
                {
                    Ok(()) => self.want_write = want,
                    Err(e) => {
                        self.tx_done = true;
                        self.tx_failed(
                            WcStatus::RETRY_EXC_ERR,
                            self.tx.frame().map(|f| f.wr).filter(|&w| w != NO_WR),
                            &format!("stream {}: changing the I/O poller interest: {e}", self.s),
                        );
                    }
                }
            }
        }
    }

    // --- receiving ---

    /// Receives until the socket would block or the turn's bytes are used up.
    fn rx_turn(&mut self) -> std::result::Result<Turn, RxErr> {
        let path = Arc::clone(&self.path);
        let sock = &path.streams[self.s].sock;
        let mut budget = TURN_BYTES;
        while budget > 0 {
            let step = match &mut self.rx {
                RxPhase::Header { buf, got } => rx_header(sock, buf, got),
                RxPhase::Raw { h, reg, off } => rx_raw(sock, h, reg, off),
                RxPhase::Ctrl { h, reg, buf, got } => rx_ctrl(sock, h, reg, buf, got),
            };
            let n = match step {
                Ok(RxStep::Partial(n)) => n,
                Ok(RxStep::Header(h, n)) => {
                    self.start_frame(h)?;
                    n
                }
                Ok(RxStep::Landed(h, ctrl, n)) => {
                    self.rx = RxPhase::header();
                    self.finish_frame(h, ctrl)?;
                    n
                }
                Err(RxErr::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The sender's write completes only when our kernel acknowledges it (see
                    // `PathShared::complete_acked`). Left to the kernel, the ACK of a burst's tail
                    // waits for the delayed-ACK timer (tens of ms), so every small message or
                    // message tail would cost that much: acknowledge once the socket is drained.
                    if std::mem::take(&mut self.rx_unacked) {
                        // Only a cost if it fails: the kernel still acknowledges, later.
                        let _ = crate::sys::socket::quickack(sock);
                    }
                    self.acknowledge();
                    return Ok(Turn::Blocked);
                }
                Err(RxErr::Io(e)) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => return Err(e),
            };
            self.rx_unacked |= n > 0;
            budget = budget.saturating_sub(n);
        }
        self.acknowledge();
        Ok(Turn::More)
    }

    /// Relayed paths: tells the peer how many of its write frames landed on this stream (one
    /// acknowledgement frame per receive turn at most, ahead of the frames queued for sending; one
    /// still queued is updated instead). Its writes complete on it, end to end. Nothing is sent on
    /// a path the comm stopped.
    fn acknowledge(&mut self) {
        let path = Arc::clone(&self.path);
        if !path.relayed || self.landed == self.acked || path.stopped.load(Ordering::SeqCst) {
            return;
        }
        let st = &path.streams[self.s];
        let Ok(mut q) = st.queue() else {
            return; // Poisoned: the sender finds it so too and fails the path.
        };
        let hdr = FrameRepr::ack(self.landed).to_bytes();
        match q.frames.front_mut() {
            Some(f) if f.wr == NO_WR => f.hdr = hdr,
            _ => q.frames.push_front(TxFrame {
                hdr,
                payload: Payload::Bytes(Vec::new()),
                wr: NO_WR,
            }),
        }
        q.idle = false;
        self.acked = self.landed;
        // This worker serves the stream's sending side too: in this turn.
        self.tx_ready = true;
    }

    /// A complete header: checks it against this endpoint's registrations and sets up the payload.
    fn start_frame(&mut self, h: FrameRepr) -> std::result::Result<(), RxErr> {
        if h.is_close() {
            return Err(RxErr::Goodbye(h.is_dirty()));
        }
        if h.is_ack() {
            return self.peer_acknowledged(h.seq);
        }
        let len = h.len as usize;
        let reg = self.sh.regs().map_err(RxErr::Internal)?.get(&h.rkey).cloned().ok_or_else(|| {
            RxErr::Violation(format!(
                "peer wrote with rkey {:#x}, which names no registration of this endpoint (remote access error)",
                h.rkey
            ))
        })?;
        if !reg.contains(h.addr, len) {
            return Err(RxErr::Violation(format!(
                "peer wrote {len} bytes at {:#x}, outside the registration of rkey {:#x} (remote access error)",
                h.addr, h.rkey
            )));
        }
        if matches!(reg.mem, RegMem::Raw(_)) && !self.sh.peer_data_writes.load(Ordering::Relaxed) {
            return Err(RxErr::Violation(format!(
                "peer wrote {len} bytes at {:#x} into data registration rkey {:#x} of a sending endpoint, which is not remote-writable (remote access error)",
                h.addr, h.rkey
            )));
        }
        match &reg.mem {
            RegMem::Raw(_) if len == 0 => {
                self.rx = RxPhase::header();
                self.finish_frame(h, None)
            }
            RegMem::Raw(_) => {
                self.rx = RxPhase::Raw { h, reg, off: 0 };
                Ok(())
            }
            RegMem::Ctrl(_) if len == 0 => {
                self.rx = RxPhase::header();
                self.finish_frame(h, Some((reg, h.addr, Vec::new())))
            }
            RegMem::Ctrl(_) => {
                self.rx = RxPhase::Ctrl {
                    h,
                    reg,
                    buf: vec![0; len],
                    got: 0,
                };
                Ok(())
            }
        }
    }

    /// The peer's acknowledgement frame: `landed` of this stream's write frames are in place
    /// there. Only on a relayed path, never more than were sent, never going back.
    fn peer_acknowledged(&mut self, landed: u64) -> std::result::Result<(), RxErr> {
        let path = Arc::clone(&self.path);
        if !path.relayed {
            return Err(RxErr::Violation(
                "acknowledgement frame on a direct path (only relayed paths carry them)".into(),
            ));
        }
        let st = &path.streams[self.s];
        let sent = st.frames_out.load(Ordering::Acquire);
        let before = st.peer_landed.load(Ordering::Relaxed);
        if landed > sent || landed < before {
            return Err(RxErr::Violation(format!(
                "acknowledgement of {landed} write frames on stream {}; {sent} were sent and {before} \
                 acknowledged before",
                self.s
            )));
        }
        st.peer_landed.store(landed, Ordering::Release);
        self.rx = RxPhase::header();
        Ok(())
    }

    /// A frame has landed: files its ordered effects and applies every effect up to the first gap
    /// in the path's sequence.
    fn finish_frame(
        &mut self,
        h: FrameRepr,
        ctrl: Option<CtrlWrite>,
    ) -> std::result::Result<(), RxErr> {
        let path = &*self.path;
        let imm = h.completion();
        let mut rx = path.rx().map_err(RxErr::Internal)?;
        if rx.error {
            return Ok(());
        }
        if h.seq < rx.next_apply
            || h.seq >= rx.next_apply + SEQ_WINDOW
            || rx.pending.contains_key(&h.seq)
        {
            return Err(RxErr::Violation(format!(
                "frame sequence {} outside the window {}..{} or repeated",
                h.seq,
                rx.next_apply,
                rx.next_apply + SEQ_WINDOW
            )));
        }
        rx.buffered += ctrl.as_ref().map_or(0, |c| c.2.len());
        if rx.buffered > MAX_BUFFERED_CTRL {
            return Err(RxErr::Violation(format!(
                "more than {MAX_BUFFERED_CTRL} bytes of control writes held out of order"
            )));
        }
        if h.seq != rx.next_apply && rx.pending.len() >= MAX_OUT_OF_ORDER {
            return Err(RxErr::Violation(format!(
                "more than {MAX_OUT_OF_ORDER} frames held out of order (sequence {} still missing)",
                rx.next_apply
            )));
        }
        rx.pending.insert(h.seq, Effect { ctrl, imm });
        // Landed (its payload in place, its effect filed): counted for the acknowledgement of a
        // relayed path. The peer completes writes in posting order, so a write counted complete
        // there has every earlier frame of the path landed here too.
        self.landed += 1;
        loop {
            let next = rx.next_apply;
            let Some(eff) = rx.pending.remove(&next) else {
                break;
            };
            rx.next_apply += 1;
            if let Some((reg, addr, bytes)) = eff.ctrl {
                rx.buffered -= bytes.len();
                let alive = reg.alive().map_err(RxErr::Internal)?;
                if *alive && let RegMem::Ctrl(block) = &reg.mem {
                    // In sequence order, with release stores: a CTS index word lands after the CTS
                    // body an earlier frame of the path carried.
                    block
                        .store_bytes(block.offset_of(addr), &bytes)
                        .map_err(RxErr::Internal)?;
                }
            }
            // Every earlier frame of the path has landed: the immediate completes the receive only
            // after all data of the path's earlier writes is in place, as on RC.
            if let Some((imm, wr_len)) = eff.imm {
                let Some(wr_id) = rx.recvs.pop_front() else {
                    return Err(RxErr::Violation(
                        "peer wrote with an immediate but no receive is posted (RNR)".into(),
                    ));
                };
                path.complete(Completion {
                    wr_id,
                    status: WcStatus::SUCCESS,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: wr_len,
                    imm: Some(imm),
                });
            }
        }
        Ok(())
    }

    /// The receiving direction ended: what it means for the path.
    fn rx_ended(&self, e: RxErr) {
        let path = &*self.path;
        let s = self.s;
        let stopping = self.sh.stop.load(Ordering::Relaxed);
        // Counted before the path's fate below: a sealing comm waits for every stream's count.
        path.rx_ends.fetch_add(1, Ordering::SeqCst);
        if path.cut.load(Ordering::SeqCst) && !stopping {
            // Failed over: this stream has delivered what was queued (see `PathShared::cut`).
            tracing::debug!(label = %path.label, "NET/switchless: TCP path {} stream {s} drained after failover: {}", path.label, e.text());
            path.drained(s);
            return;
        }
        match e {
            RxErr::Goodbye(false) => {
                // Orderly: everything the peer sent on this stream has been applied. Once every
                // stream said so, the peer is gone; our own writes can no longer be delivered, and
                // posted receives fail once the completions that did land are taken
                // (`TcpFabric::poll`): nothing more can come, whatever the close frame's flags.
                let all = match path.rx() {
                    Ok(mut rx) => {
                        rx.goodbyes += 1;
                        let all = rx.goodbyes == path.streams.len();
                        rx.peer_closed |= all;
                        all
                    }
                    Err(e) => {
                        path.poisoned(&e);
                        false
                    }
                };
                if all {
                    tracing::debug!(label = %path.label, "NET/switchless: TCP path {}: the peer closed", path.label);
                    // Writes the peer's kernel acknowledged before its close frames are done (a
                    // receiver that got its last message closes before the sender's next poll,
                    // which would otherwise fail them); only the rest fail.
                    path.complete_acked();
                    path.fail_tx(
                        WcStatus::RETRY_EXC_ERR,
                        None,
                        "the peer closed the connection",
                    );
                }
            }
            _ if stopping => {}
            RxErr::Goodbye(true) => {
                let why = format!(
                    "stream {s}: the peer shut down with work requests outstanding (mid-transfer)"
                );
                path.fail_rx(&why, true);
                path.fail_tx(WcStatus::RETRY_EXC_ERR, None, &why);
                path.close_streams();
            }
            RxErr::Eof => {
                let why = format!(
                    "stream {s}: the peer closed it without a close frame (the peer process died or reset the connection)"
                );
                path.fail_rx(&why, true);
                path.fail_tx(WcStatus::RETRY_EXC_ERR, None, &why);
                path.close_streams();
            }
            RxErr::Io(e) => {
                path.fail_rx(&format!("stream {s}: receiving failed: {e}"), true);
                path.fail_tx(
                    WcStatus::RETRY_EXC_ERR,
                    None,
                    &format!("stream {s} broke while receiving: {e}"),
                );
                path.close_streams();
            }
            RxErr::Internal(e) => {
                let why = format!("stream {s}: {e}");
                path.fail_rx(&why, true);
                path.fail_tx(WcStatus::GENERAL_ERR, None, &why);
                path.close_streams();
            }
            RxErr::Violation(why) => {
                path.fail_rx(&format!("stream {s}: {why}; closing the path"), true);
                path.fail_tx(WcStatus::REM_OP_ERR, None, &why);
                path.close_streams();
            }
        }
    }

    // --- sending ---

    /// Sends queued frames until the queue is empty, the socket would block or the turn's bytes
    /// are used up.
    fn tx_turn(&mut self) -> Turn {
        let path = Arc::clone(&self.path);
        let st = &path.streams[self.s];
        let mut budget = TURN_BYTES;
        loop {
            if matches!(self.tx, TxPhase::Idle)
                && let Some(t) = self.tx_take(st)
            {
                return t;
            }
            if budget == 0 {
                return Turn::More;
            }
            let sent = match &mut self.tx {
                TxPhase::Idle => return Turn::Idle,
                TxPhase::Header { frame, off } => tx_header(st, frame, off),
                TxPhase::Payload { frame, off } => tx_payload(st, frame, off),
            };
            match sent {
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    // Release: `acked` reads it before asking the kernel what is unacknowledged.
                    st.written.fetch_add(n as u64, Ordering::Release);
                    self.tx_advance(st);
                }
                Err(TxErr::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return Turn::Blocked,
                Err(TxErr::Io(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.tx_abort(st, e);
                    return Turn::Idle;
                }
            }
        }
    }

    /// Idle phase: takes the next queued frame; `Some(Turn::Idle)` when there is none (the next
    /// post wakes the stream, see `post_write`) or the queue is unusable.
    fn tx_take(&mut self, st: &StreamShared) -> Option<Turn> {
        let mut q = match st.queue() {
            Ok(q) => q,
            Err(e) => {
                self.tx_done = true;
                self.tx_failed(
                    WcStatus::GENERAL_ERR,
                    None,
                    &format!("stream {}: {e}", self.s),
                );
                return Some(Turn::Idle);
            }
        };
        let Some(frame) = q.frames.pop_front() else {
            q.idle = true;
            return Some(Turn::Idle);
        };
        st.mid_frame.store(true, Ordering::Relaxed);
        self.tx = TxPhase::Header { frame, off: 0 };
        None
    }

    /// After a send: the payload follows a header that is all with the kernel, and a frame that
    /// is all with the kernel is done.
    fn tx_advance(&mut self, st: &StreamShared) {
        self.tx = match std::mem::replace(&mut self.tx, TxPhase::Idle) {
            TxPhase::Header { frame, off } if off == HEADER_LEN && frame.len() > 0 => {
                TxPhase::Payload { frame, off: 0 }
            }
            TxPhase::Header { frame, off } if off == HEADER_LEN => self.tx_sent(st, frame),
            TxPhase::Payload { frame, off } if off == frame.len() => self.tx_sent(st, frame),
            phase => phase,
        };
    }

    /// A frame is all with the kernel: its work request may complete.
    fn tx_sent(&self, st: &StreamShared, frame: TxFrame) -> TxPhase {
        let len = frame.len() as u64;
        st.queued.fetch_sub(len, Ordering::Relaxed);
        st.mid_frame.store(false, Ordering::Relaxed);
        st.sent_bytes.fetch_add(len, Ordering::Relaxed);
        if frame.wr == NO_WR {
            return TxPhase::Idle; // An acknowledgement: no work request of ours.
        }
        let end = if self.path.relayed {
            // Release: the peer's acknowledgement is checked against it (`peer_acknowledged`).
            st.frames_out.fetch_add(1, Ordering::Release) + 1
        } else {
            st.written.load(Ordering::Relaxed)
        };
        self.path.frame_sent(frame.wr, self.s, end);
        TxPhase::Idle
    }

    /// A send failed: the frame's work request fails (see [`TxErr`] for the status) and this
    /// direction ends.
    fn tx_abort(&mut self, st: &StreamShared, e: TxErr) {
        let wr = self
            .tx
            .frame()
            .map(|f| {
                st.queued.fetch_sub(f.len() as u64, Ordering::Relaxed);
                f.wr
            })
            .filter(|&w| w != NO_WR);
        self.tx = TxPhase::Idle;
        self.tx_done = true;
        let path = &*self.path;
        match e {
            TxErr::Deregistered(why) => {
                path.fail_tx(WcStatus::LOC_PROT_ERR, wr, &why);
                path.close_streams();
            }
            TxErr::Internal(why) => {
                self.tx_failed(
                    WcStatus::GENERAL_ERR,
                    wr,
                    &format!("stream {}: {why}", self.s),
                );
            }
            TxErr::Io(e) => self.tx_failed(
                WcStatus::RETRY_EXC_ERR,
                wr,
                &format!("stream {}: sending failed: {e}", self.s),
            ),
        }
    }

    fn tx_failed(&self, status: WcStatus, wr: Option<u64>, why: &str) {
        let path = &*self.path;
        if path.cut.load(Ordering::SeqCst) || path.stopped.load(Ordering::SeqCst) {
            // Failed over already: sending ends; receiving goes on (`PathShared::stop`) and, once
            // sealed, drains (`PathShared::cut`).
            return;
        }
        path.fail_tx(status, wr, why);
        path.fail_rx(why, false);
        path.close_streams();
    }
}

// ---------------------------------------------------------------------------------------------------
// One receive or send of each phase (no blocking: the socket is non-blocking)
// ---------------------------------------------------------------------------------------------------

fn unexpected_eof(what: String) -> RxErr {
    RxErr::Io(io::Error::new(io::ErrorKind::UnexpectedEof, what))
}

/// Header phase: receives what is missing of the header; a whole one is parsed.
fn rx_header(
    sock: &TcpStream,
    buf: &mut [u8; HEADER_LEN],
    got: &mut usize,
) -> std::result::Result<RxStep, RxErr> {
    match rawmem::recv_slice(sock, &mut buf[*got..]).map_err(RxErr::Io)? {
        // At a frame boundary: the peer closed without a close frame.
        0 if *got == 0 => Err(RxErr::Eof),
        0 => Err(unexpected_eof(format!(
            "stream ended {got} bytes into a {HEADER_LEN}-byte header"
        ))),
        n => {
            *got += n;
            if *got < HEADER_LEN {
                return Ok(RxStep::Partial(n));
            }
            let h = FrameRepr::parse(&Frame::new_unchecked(&buf[..])).map_err(RxErr::violation)?;
            Ok(RxStep::Header(h, n))
        }
    }
}

/// Data phase: receives one chunk of the payload straight into the registered memory.
fn rx_raw(
    sock: &TcpStream,
    h: &FrameRepr,
    reg: &Reg,
    off: &mut usize,
) -> std::result::Result<RxStep, RxErr> {
    let len = h.len as usize;
    let RegMem::Raw(region) = &reg.mem else {
        return Err(RxErr::Violation("raw payload into control memory".into()));
    };
    let n = {
        // One chunk under the registration's lock: deregistration waits for it.
        let alive = reg.alive().map_err(RxErr::Internal)?;
        if !*alive {
            return Err(RxErr::Violation(format!(
                "target {:#x}+{len} bytes was deregistered during the write",
                h.addr
            )));
        }
        let chunk = (len - *off).min(CHUNK_BYTES);
        region
            .recv_into(sock, h.addr + *off as u64, chunk)
            .map_err(RxErr::Io)?
    };
    if n == 0 {
        return Err(unexpected_eof(format!(
            "stream ended {off} bytes into a {len}-byte payload"
        )));
    }
    *off += n;
    Ok(if *off == len {
        RxStep::Landed(*h, None, n)
    } else {
        RxStep::Partial(n)
    })
}

/// Control phase: receives the payload into a buffer; the frame's ordered effect applies it.
fn rx_ctrl(
    sock: &TcpStream,
    h: &FrameRepr,
    reg: &Arc<Reg>,
    buf: &mut Vec<u8>,
    got: &mut usize,
) -> std::result::Result<RxStep, RxErr> {
    let n = rawmem::recv_slice(sock, &mut buf[*got..]).map_err(RxErr::Io)?;
    if n == 0 {
        return Err(unexpected_eof(format!(
            "stream ended {got} bytes into a {}-byte block",
            buf.len()
        )));
    }
    *got += n;
    if *got < buf.len() {
        return Ok(RxStep::Partial(n));
    }
    let write = (Arc::clone(reg), h.addr, std::mem::take(buf));
    Ok(RxStep::Landed(*h, Some(write), n))
}

/// Header phase: sends what is left of the header (with `MSG_MORE` when a payload follows).
fn tx_header(
    st: &StreamShared,
    frame: &TxFrame,
    off: &mut usize,
) -> std::result::Result<usize, TxErr> {
    let n = rawmem::send_slice(&st.sock, &frame.hdr[*off..], frame.len() > 0).map_err(TxErr::Io)?;
    *off += n;
    Ok(n)
}

/// Payload phase: sends from the copy taken when posted, or one chunk from registered memory.
fn tx_payload(
    st: &StreamShared,
    frame: &TxFrame,
    off: &mut usize,
) -> std::result::Result<usize, TxErr> {
    let n = match &frame.payload {
        Payload::Bytes(b) => rawmem::send_slice(&st.sock, &b[*off..], false).map_err(TxErr::Io)?,
        Payload::Raw { reg, addr, len } => {
            let RegMem::Raw(region) = &reg.mem else {
                return Err(TxErr::Internal("raw payload from control memory".into()));
            };
            // One chunk under the registration's lock: deregistration waits for it.
            let alive = reg.alive().map_err(|e| TxErr::Internal(e.to_string()))?;
            if !*alive {
                return Err(TxErr::Deregistered(format!(
                    "source {addr:#x}+{len} bytes was deregistered before it was sent (local protection error)"
                )));
            }
            let chunk = (len - *off).min(CHUNK_BYTES);
            region
                .send_from(&st.sock, addr + *off as u64, chunk, false)
                .map_err(TxErr::Io)?
        }
    };
    *off += n;
    Ok(n)
}
