//! The process-wide pool of TCP I/O worker threads shared by every [`super::TcpFabric`].
//!
//! * Each worker runs a readiness loop ([`mio::Poll`], epoll on Linux, edge-triggered) over the
//!   streams assigned to it. A stream is registered by its file descriptor ([`SourceFd`]): the
//!   socket itself stays in the fabric's shared state, where `shutdown` needs it for the close frame
//!   and the final drain, so no descriptor is duplicated (one fd per stream, as before).
//! * Each stream is a small state machine per direction ([`StreamIo`]): sending resumes a partial
//!   frame (header, then payload) when the socket becomes writable, and `WRITABLE` interest is
//!   registered only while something is queued; receiving reads a header (possibly in pieces), then
//!   the payload straight into registered memory in chunks of at most [`CHUNK_BYTES`] bytes, taking the
//!   registration's lock for each chunk only (deregistration waits for one chunk copy at most).
//! * `post_*` queue frames and, when the stream's sender was idle, hand its id to the worker and
//!   wake it ([`mio::Waker`]); NCCL's thread never blocks in the kernel.
//! * Fairness: a stream gets at most [`TURN_BYTES`] per direction per turn; a stream still ready
//!   after its turn stays on the worker's run list and the next wait does not block.
//! * Lifecycle: workers start when a stream is added and none is idle (up to the pool size); a
//!   stream goes to the worker holding the fewest streams of the same path, then of the same
//!   fabric, then overall, so the streams of one path run on different threads (as far as the
//!   pool has threads). A worker whose last
//!   stream is removed exits and is joined by the remover: once every fabric is shut down, no pool
//!   thread is left (NCCL unloads the plugin after finalize; a thread running inside an unmapped
//!   library would crash the process).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::config::{MAX_IO_THREADS, default_io_threads};
use super::frame::{Frame, FrameRepr, HEADER_LEN};
use super::state::{Effect, Payload, Reg, RegMem, Shared, StreamShared, TxFrame};
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::sys::socket as rawmem;
use crate::transport::fabric::{Completion, WcOpcode, WcStatus};

/// Largest piece of a payload received into or sent from registered memory with the
/// registration's lock held (one `recv`/`send` call), bytes.
pub const CHUNK_BYTES: usize = 1 << 20;
/// Bytes a stream may move per direction before the worker turns to its other streams.
pub const TURN_BYTES: usize = 2 << 20;

/// Frames a receiver may hold out of order per path before it calls the peer broken.
const SEQ_WINDOW: u64 = 1 << 20;
/// Control-memory payload a receiver buffers out of order per path before it calls the peer broken.
const MAX_BUFFERED_CTRL: usize = 64 << 20;

const WAKE: Token = Token(0);
const POOL_LOCK: &str = "TCP I/O pool";
const INBOX: &str = "TCP I/O worker inbox";

/// Pool threads running now, process-wide (started and not yet joined).
pub fn io_threads() -> usize {
    LIVE.load(Ordering::SeqCst)
}

static LIVE: AtomicUsize = AtomicUsize::new(0);

static POOL: Mutex<Pool> = Mutex::new(Pool {
    workers: Vec::new(),
    size: 0,
    next_id: 1,
    next_serial: 0,
});

struct Pool {
    workers: Vec<WorkerSlot>,
    /// Most workers at once; fixed when the first worker starts, until the last one exits.
    size: usize,
    next_id: usize,
    next_serial: u64,
}

struct WorkerSlot {
    link: Arc<WorkerLink>,
    /// Streams assigned.
    load: usize,
    thread: JoinHandle<()>,
}

/// What the rest of the process holds of a worker: its waker and its inbox.
struct WorkerLink {
    serial: u64,
    /// The worker ended after a panic (also `Inbox::dead`, for a check without the lock).
    dead: AtomicBool,
    waker: Waker,
    inbox: Mutex<Inbox>,
}

/// Its critical sections only push and take (nothing in them panics), so it is never found
/// poisoned in practice; if it were, the worker would stop and its link count as dead.
#[derive(Default)]
struct Inbox {
    cmds: Vec<Cmd>,
    /// Streams whose sender was idle and now has frames queued.
    kicks: Vec<usize>,
    /// The worker ended after a panic; nothing is accepted any more.
    dead: bool,
}

enum Cmd {
    Add(Box<StreamIo>),
    Remove(usize, mpsc::Sender<()>),
    Exit,
    /// Unit tests only: the worker panics (the recovery path is tested in a process of its own).
    #[cfg(test)]
    Panic,
}

impl WorkerLink {
    /// Queues `cmd` and wakes the worker; `false` when the worker is dead.
    fn send(&self, cmd: Cmd) -> bool {
        {
            // Poisoned: as dead (see `Inbox`).
            let Ok(mut ib) = lock(&self.inbox, INBOX) else {
                return false;
            };
            if ib.dead {
                return false;
            }
            ib.cmds.push(cmd);
        }
        self.wake();
        true
    }

    fn wake(&self) {
        if let Err(e) = self.waker.wake() {
            tracing::error!("NET/switchless: waking TCP I/O worker {}: {e}", self.serial);
        }
    }
}

/// A fabric's hold on one of its streams in the pool.
pub(super) struct StreamHandle {
    link: Arc<WorkerLink>,
    id: usize,
}

impl StreamHandle {
    /// Tells the worker that frames were queued on a stream whose sender was idle.
    pub(super) fn kick(&self) {
        {
            let Ok(mut ib) = lock(&self.link.inbox, INBOX) else {
                return;
            };
            if ib.dead {
                return;
            }
            ib.kicks.push(self.id);
        }
        self.link.wake();
    }

    /// Serial number of the worker serving the stream.
    pub(super) fn worker(&self) -> u64 {
        self.link.serial
    }
}

/// Adds every stream of `sh` to the pool, appending one handle per stream to `out[path]` (so the
/// caller can remove what was added if this fails part-way). `threads`: the pool size to use if the
/// pool is starting (`None`: [`default_io_threads`]).
pub(super) fn add_streams(
    sh: &Arc<Shared>,
    threads: Option<usize>,
    out: &mut Vec<Vec<StreamHandle>>,
) -> Result<()> {
    let total: usize = sh.paths.iter().map(|p| p.streams.len()).sum();
    if total == 0 {
        return Ok(());
    }
    let mut pool = lock(&POOL, POOL_LOCK)?;
    if pool.workers.is_empty() {
        pool.size = threads
            .unwrap_or_else(default_io_threads)
            .clamp(1, MAX_IO_THREADS);
    }
    // Streams of this fabric, and of the current path, per worker serial.
    let mut mine: HashMap<u64, usize> = HashMap::new();
    for (p, path) in sh.paths.iter().enumerate() {
        if out.len() <= p {
            out.push(Vec::new());
        }
        let mut this_path: HashMap<u64, usize> = HashMap::new();
        for s in 0..path.streams.len() {
            let alive = |w: &&WorkerSlot| !w.link.dead.load(Ordering::SeqCst);
            let idle = pool.workers.iter().filter(alive).any(|w| w.load == 0);
            if !idle && pool.workers.len() < pool.size {
                match spawn_worker(pool.next_serial) {
                    Ok(w) => {
                        pool.next_serial += 1;
                        pool.workers.push(w);
                    }
                    Err(e) if pool.workers.is_empty() => return Err(e),
                    Err(e) => tracing::warn!(
                        "NET/switchless: {e}; the TCP pool carries on with {} threads",
                        pool.workers.len()
                    ),
                }
            }
            let Some(idx) = pool
                .workers
                .iter()
                .enumerate()
                .filter(|(_, w)| alive(w))
                .min_by_key(|(i, w)| {
                    let serial = w.link.serial;
                    (
                        this_path.get(&serial).copied().unwrap_or(0),
                        mine.get(&serial).copied().unwrap_or(0),
                        w.load,
                        *i,
                    )
                })
                .map(|(i, _)| i)
            else {
                return Err(Error::Internal(
                    "the TCP I/O pool has no working thread (they panicked or could not start)"
                        .into(),
                ));
            };
            let id = pool_next_id(&mut pool);
            let w = &mut pool.workers[idx];
            let io = StreamIo::new(Arc::clone(sh), p, s, id);
            if !w.link.send(Cmd::Add(Box::new(io))) {
                return Err(Error::Internal(format!(
                    "TCP I/O worker {} has stopped after a panic",
                    w.link.serial
                )));
            }
            w.load += 1;
            *mine.entry(w.link.serial).or_insert(0) += 1;
            *this_path.entry(w.link.serial).or_insert(0) += 1;
            out[p].push(StreamHandle {
                link: Arc::clone(&w.link),
                id,
            });
        }
    }
    Ok(())
}

fn pool_next_id(pool: &mut Pool) -> usize {
    let id = pool.next_id;
    pool.next_id = pool.next_id.wrapping_add(1).max(1);
    id
}

fn spawn_worker(serial: u64) -> Result<WorkerSlot> {
    let poll = Poll::new().map_err(|e| Error::io("creating a TCP I/O poller (epoll)", e))?;
    let waker = Waker::new(poll.registry(), WAKE)
        .map_err(|e| Error::io("creating a TCP I/O waker (eventfd)", e))?;
    let link = Arc::new(WorkerLink {
        serial,
        dead: AtomicBool::new(false),
        waker,
        inbox: Mutex::new(Inbox::default()),
    });
    let l2 = Arc::clone(&link);
    let thread = std::thread::Builder::new()
        .name(format!("swl-tcpio{serial}"))
        .spawn(move || worker_main(l2, poll))
        .map_err(|e| Error::io("starting a TCP I/O worker thread", e))?;
    LIVE.fetch_add(1, Ordering::SeqCst);
    Ok(WorkerSlot {
        link,
        load: 0,
        thread,
    })
}

/// Removes streams from their workers and waits until no worker touches them any more; workers left
/// without streams exit and are joined. Returns the number of workers found to have panicked; an
/// error (after the wait) when the pool's lock is poisoned, so that no worker could be joined.
pub(super) fn remove_streams(handles: Vec<StreamHandle>) -> Result<usize> {
    if handles.is_empty() {
        return Ok(0);
    }
    let (tx, rx) = mpsc::channel();
    let mut sent = 0;
    for h in &handles {
        if h.link.send(Cmd::Remove(h.id, tx.clone())) {
            sent += 1;
        }
    }
    drop(tx);
    for _ in 0..sent {
        // An error: every sender is gone (a worker that died dropped its commands), nothing to wait for.
        if rx.recv().is_err() {
            break;
        }
    }
    let idle: Vec<WorkerSlot> = {
        let mut pool = lock(&POOL, POOL_LOCK)?;
        for h in &handles {
            if let Some(w) = pool
                .workers
                .iter_mut()
                .find(|w| Arc::ptr_eq(&w.link, &h.link))
            {
                w.load = w.load.saturating_sub(1);
            }
        }
        let (idle, busy) = std::mem::take(&mut pool.workers)
            .into_iter()
            .partition(|w| w.load == 0);
        pool.workers = busy;
        idle
    };
    let mut panicked = 0;
    for w in idle {
        w.link.send(Cmd::Exit);
        let dead = lock(&w.link.inbox, INBOX).map_or(true, |ib| ib.dead);
        if w.thread.join().is_err() || dead {
            panicked += 1;
        }
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
    Ok(panicked)
}

// ---------------------------------------------------------------------------------------------------
// The worker
// ---------------------------------------------------------------------------------------------------

struct Worker {
    streams: HashMap<usize, StreamIo>,
    /// Streams with work left (ready and not yet blocked); the next wait does not block.
    run: Vec<usize>,
}

fn worker_main(link: Arc<WorkerLink>, mut poll: Poll) {
    let mut w = Worker {
        streams: HashMap::new(),
        run: Vec::new(),
    };
    let what =
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run(&link, &mut poll))) {
            Ok(Ok(())) => return,
            Ok(Err(e)) => format!("stopped: {e}"),
            Err(_) => "panicked".to_string(),
        };
    tracing::error!(
        "NET/switchless: TCP I/O worker {} {what}; failing its {} streams' paths",
        link.serial,
        w.streams.len()
    );
    // Refuse new commands and drop queued ones (their removal acknowledgements are released).
    link.dead.store(true, Ordering::SeqCst);
    let cmds = match lock(&link.inbox, INBOX) {
        Ok(mut ib) => {
            ib.dead = true;
            std::mem::take(&mut ib.cmds)
        }
        Err(_) => Vec::new(),
    };
    drop(cmds);
    let why = format!("its TCP I/O worker {what}");
    for st in w.streams.values() {
        let path = &st.sh.paths[st.p];
        path.fail_rx(&why, true);
        path.fail_tx(WcStatus::GENERAL_ERR, None, &why);
        path.close_streams();
    }
    for st in w.streams.values() {
        let _ = poll.registry().deregister(&mut SourceFd(&st.fd));
    }
}

impl Worker {
    /// The event loop, until [`Cmd::Exit`]; an error when the inbox lock is poisoned.
    fn run(&mut self, link: &WorkerLink, poll: &mut Poll) -> Result<()> {
        let mut events = Events::with_capacity(256);
        loop {
            let timeout = if self.run.is_empty() {
                None
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("NET/switchless: TCP I/O worker {}: poll: {e}", link.serial);
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            for ev in events.iter() {
                if ev.token() == WAKE {
                    continue;
                }
                if let Some(st) = self.streams.get_mut(&ev.token().0) {
                    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                        st.rx_ready = true;
                    }
                    if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                        st.tx_ready = true;
                    }
                    if !st.queued_to_run {
                        st.queued_to_run = true;
                        self.run.push(st.id);
                    }
                }
            }
            let (cmds, kicks) = {
                let mut ib = lock(&link.inbox, INBOX)?;
                (std::mem::take(&mut ib.cmds), std::mem::take(&mut ib.kicks))
            };
            for id in kicks {
                if let Some(st) = self.streams.get_mut(&id) {
                    st.tx_ready = true;
                    if !st.queued_to_run {
                        st.queued_to_run = true;
                        self.run.push(id);
                    }
                }
            }
            for cmd in cmds {
                match cmd {
                    Cmd::Add(st) => self.add(*st, poll),
                    Cmd::Remove(id, ack) => {
                        if let Some(st) = self.streams.remove(&id) {
                            let _ = poll.registry().deregister(&mut SourceFd(&st.fd));
                        }
                        let _ = ack.send(());
                    }
                    Cmd::Exit => return Ok(()),
                    #[cfg(test)]
                    Cmd::Panic => panic!("injected by a unit test"),
                }
            }
            for id in std::mem::take(&mut self.run) {
                let Some(st) = self.streams.get_mut(&id) else {
                    continue;
                };
                st.queued_to_run = false;
                st.service(poll);
                if st.rx_ready || st.tx_ready {
                    st.queued_to_run = true;
                    self.run.push(id);
                }
            }
        }
    }

    fn add(&mut self, mut st: StreamIo, poll: &mut Poll) {
        if let Err(e) =
            poll.registry()
                .register(&mut SourceFd(&st.fd), Token(st.id), Interest::READABLE)
        {
            let path = &st.sh.paths[st.p];
            let why = format!("stream {}: registering it with the I/O poller: {e}", st.s);
            path.fail_rx(&why, true);
            path.fail_tx(WcStatus::GENERAL_ERR, None, &why);
            path.close_streams();
            st.rx_done = true;
            st.tx_done = true;
        }
        // Bytes may have arrived before the registration: look once.
        st.rx_ready = true;
        st.tx_ready = true;
        st.queued_to_run = true;
        self.run.push(st.id);
        self.streams.insert(st.id, st);
    }
}

// ---------------------------------------------------------------------------------------------------
// One stream's state machines
// ---------------------------------------------------------------------------------------------------

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

struct StreamIo {
    sh: Arc<Shared>,
    p: usize,
    s: usize,
    id: usize,
    fd: RawFd,
    rx: RxPhase,
    rx_ready: bool,
    rx_done: bool,
    tx: TxPhase,
    tx_ready: bool,
    tx_done: bool,
    /// `WRITABLE` is part of the registered interest.
    want_write: bool,
    queued_to_run: bool,
}

impl StreamIo {
    fn new(sh: Arc<Shared>, p: usize, s: usize, id: usize) -> StreamIo {
        let fd = sh.paths[p].streams[s].sock.as_raw_fd();
        StreamIo {
            sh,
            p,
            s,
            id,
            fd,
            rx: RxPhase::header(),
            rx_ready: false,
            rx_done: false,
            tx: TxPhase::Idle,
            tx_ready: false,
            tx_done: false,
            want_write: false,
            queued_to_run: false,
        }
    }

    fn service(&mut self, poll: &Poll) {
        if self.rx_ready {
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
            let t = if self.tx_done || self.sh.stop.load(Ordering::Relaxed) {
                Turn::Idle
            } else {
                self.tx_turn()
            };
            self.tx_ready = t == Turn::More;
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
                            self.tx.frame().map(|f| f.wr),
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
        let sh = Arc::clone(&self.sh);
        let sock = &sh.paths[self.p].streams[self.s].sock;
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
                    return Ok(Turn::Blocked);
                }
                Err(RxErr::Io(e)) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => return Err(e),
            };
            budget = budget.saturating_sub(n);
        }
        Ok(Turn::More)
    }

    /// A complete header: checks it against this endpoint's registrations and sets up the payload.
    fn start_frame(&mut self, h: FrameRepr) -> std::result::Result<(), RxErr> {
        if h.is_close() {
            return Err(RxErr::Goodbye(h.is_dirty()));
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

    /// A frame has landed: files its ordered effects and applies every effect up to the first gap
    /// in the path's sequence.
    fn finish_frame(
        &self,
        h: FrameRepr,
        ctrl: Option<CtrlWrite>,
    ) -> std::result::Result<(), RxErr> {
        let path = &self.sh.paths[self.p];
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
        rx.pending.insert(h.seq, Effect { ctrl, imm });
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
        let path = &self.sh.paths[self.p];
        let s = self.s;
        let stopping = self.sh.stop.load(Ordering::Relaxed);
        match e {
            RxErr::Goodbye(false) => {
                // Orderly: everything the peer sent on this stream has been applied. Once every
                // stream said so, the peer is gone; our own writes can no longer be delivered, but
                // posted receives stay posted (as with RC when the peer destroys its QP).
                let all = match path.rx() {
                    Ok(mut rx) => {
                        rx.goodbyes += 1;
                        rx.goodbyes == path.streams.len()
                    }
                    Err(e) => {
                        path.poisoned(&e);
                        false
                    }
                };
                if all {
                    tracing::debug!(label = %path.label, "NET/switchless: TCP path {}: the peer closed", path.label);
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
        let sh = Arc::clone(&self.sh);
        let st = &sh.paths[self.p].streams[self.s];
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
        self.sh.paths[self.p].frame_sent(frame.wr);
        TxPhase::Idle
    }

    /// A send failed: the frame's work request fails (see [`TxErr`] for the status) and this
    /// direction ends.
    fn tx_abort(&mut self, st: &StreamShared, e: TxErr) {
        let wr = self.tx.frame().map(|f| {
            st.queued.fetch_sub(f.len() as u64, Ordering::Relaxed);
            f.wr
        });
        self.tx = TxPhase::Idle;
        self.tx_done = true;
        let path = &self.sh.paths[self.p];
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
        let path = &self.sh.paths[self.p];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::HostBuffer;
    use crate::transport::fabric::{Fabric, LocalSeg, MemKind, RemoteSeg, WriteWr};
    use crate::transport::tcp::{TcpConfig, loopback_pair};
    use std::time::Instant;

    const CHILD: &str = "SWITCHLESS_POOL_PANIC_CHILD";

    /// Runs [`worker_panic_in_its_own_process`] in a child process: a panicking worker fails every
    /// stream it serves, and other tests of this binary share the pool.
    #[test]
    fn a_worker_panic_fails_its_paths_and_leaves_the_process_running() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "transport::tcp::pool::tests::worker_panic_in_its_own_process",
                "--ignored",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
    }

    fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if let Some(v) = f() {
                return v;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{what}: nothing within 20 s");
    }

    #[test]
    #[ignore = "run by a_worker_panic_fails_its_paths_and_leaves_the_process_running in a child process"]
    fn worker_panic_in_its_own_process() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        assert_eq!(io_threads(), 0);
        let cfg = TcpConfig {
            streams: Some(1),
            io_threads: Some(2),
            ..TcpConfig::default()
        };
        let (mut a, mut b) = loopback_pair(&[10_000], &cfg).unwrap();
        b.post_recv(0, 7).unwrap();
        let victim = Arc::clone(&a.io[0][0].link);
        let serial = victim.serial;
        assert!(victim.send(Cmd::Panic));
        eventually("the worker to be marked dead", || {
            victim.dead.load(Ordering::SeqCst).then_some(())
        });
        // Its stream's path failed on this side: a write fails now or completes in error.
        let buf = HostBuffer::new(4096).unwrap();
        let reg = a.register(buf.addr(), 4096, MemKind::Host).unwrap();
        let wr = WriteWr {
            wr_id: 1,
            local: LocalSeg {
                addr: buf.addr(),
                len: 64,
                lkey: reg.keys[0].lkey,
            },
            remote: RemoteSeg { addr: 0, rkey: 0 },
            imm: Some(1),
            signaled: true,
            inline: false,
        };
        if a.post_write(0, &wr).is_ok() {
            let c = eventually("the write's completion", || {
                let mut out = Vec::new();
                a.poll(0, 1, &mut out).unwrap();
                out.pop()
            });
            assert_ne!(c.status, WcStatus::SUCCESS, "{c:?}");
        }
        // The far side's posted receive fails instead of waiting forever.
        let c = eventually("the peer's receive", || {
            let mut out = Vec::new();
            b.poll(0, 1, &mut out).unwrap();
            out.pop()
        });
        assert_eq!(c.wr_id, 7);
        assert_ne!(c.status, WcStatus::SUCCESS, "{c:?}");
        // New connections never land on the dead worker, and work.
        let (c2, d2) = loopback_pair(&[10_000, 10_000], &cfg).unwrap();
        for f in [&c2, &d2] {
            for p in 0..2 {
                assert!(!f.stream_workers(p).contains(&serial));
            }
        }
        // Closing everything joins every thread, the dead one included.
        drop((a, b, c2, d2));
        assert_eq!(io_threads(), 0);
    }
}
