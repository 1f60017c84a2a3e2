//! Send and receive comms: the receiver-driven data protocol over any [`Fabric`].
//!
//! See `docs/readme/transport.md` and the [`super`] module docs for the protocol. In short:
//!
//! 1. `irecv` writes a clear-to-send (CTS) entry into the sender's FIFO slot `seq % 32` with two RDMA
//!    writes on one path: the body (buffers, sizes, tags, rkeys per path), then the word `seq + 1`.
//! 2. `isend` acquire-loads that word; when it reads `seq + 1` it decodes the body, matches the tag,
//!    checks the size and writes the data striped over the data paths. On the first path of the stripe
//!    it then writes the size record into the receiver's record array with an immediate; every other
//!    path's last data write carries the immediate.
//! 3. The receiver counts immediates per buffer (each names its slot, buffer, the number of paths and
//!    the sequence number); when all arrived it reads the size record.
#![forbid(unsafe_code)]

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, LocalSeg, MemKind, PathRole, RECV_DEPTH, ReadWr, Registration,
    RemoteSeg, SEND_QUEUE_DEPTH, WcOpcode, WcStatus, WriteWr,
};
use crate::transport::stripe::{Chunk, MAX_PATHS, StripeParams, stripe};
use crate::transport::wire::{
    self, CtrlInfo, CtsElem, FIFO_DEPTH, Imm, MAX_RECVS, MAX_REQUESTS, MAX_SEND_REQUESTS, SLOT_HDR,
    SLOT_IDX, SLOT_WORDS, WrKind,
};

/// Largest single RDMA write the protocol posts (1 GiB; IB allows up to 2 GiB).
pub const MAX_WR_BYTES: u64 = 1 << 30;
/// Largest message (the size record's 48 bits).
pub const MAX_MESSAGE_BYTES: u64 = wire::RECORD_SIZE_MASK;
const POLL_BATCH: usize = 16;

/// Protocol knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolConfig {
    /// Writes of at most this many bytes are marked [`WriteWr::inline`] (size records, CTS entries,
    /// tiny messages). Default 64 bytes; 0 disables the hint.
    pub inline_max: u32,
    /// Striping (minimum chunk, alignment).
    pub stripe: StripeParams,
    /// A request still pending after this long fails in `test` with [`Error::Timeout`], and an `isend`
    /// that has found no clear-to-send for this long fails likewise. `None` waits forever (NCCL's own
    /// behaviour: a slow peer is not an error).
    pub request_timeout: Option<Duration>,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        ProtocolConfig {
            inline_max: 64,
            stripe: StripeParams::default(),
            request_timeout: None,
        }
    }
}

/// A registered buffer (NCCL's `mhandle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemHandle {
    addr: u64,
    len: u64,
    kind: MemKind,
    reg: Registration,
}

impl MemHandle {
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the registration is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Host or GPU memory.
    pub fn kind(&self) -> MemKind {
        self.kind
    }
    /// Keys per path.
    pub fn registration(&self) -> &Registration {
        &self.reg
    }

    fn check_covers(&self, addr: u64, len: u64, what: &str) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let ok = crate::transport::ctrl::Span::new(self.addr, self.len).contains(addr, len);
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what} buffer {addr:#x}+{len} bytes is outside its memory registration {:#x}+{} bytes",
                self.addr, self.len
            )))
        }
    }
}

/// A request handle. [`Request::to_raw`] is never 0 nor 1 (`NCCL_NET_OPTIONAL_RECV_COMPLETION`), so the
/// FFI layer may store it in NCCL's `void** request` directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request(u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqKind {
    Send = 1,
    Recv = 2,
    Flush = 3,
}

impl Request {
    fn new(kind: ReqKind, index: usize, generation: u32) -> Request {
        Request((u64::from(generation) << 32) | ((kind as u64) << 16) | index as u64)
    }
    fn parts(self) -> (u64, usize, u32) {
        (
            (self.0 >> 16) & 0xffff,
            (self.0 & 0xffff) as usize,
            (self.0 >> 32) as u32,
        )
    }
    /// The value to hand to NCCL (≥ 2^32).
    pub fn to_raw(self) -> u64 {
        self.0
    }
    /// Rebuilds a request from [`Request::to_raw`]; the comm checks it in `test`.
    pub fn from_raw(raw: u64) -> Request {
        Request(raw)
    }
}

/// Sizes received by a grouped receive, one per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sizes {
    n: usize,
    sizes: [u64; MAX_RECVS],
}

impl Sizes {
    /// The sizes, in buffer order (empty for a flush).
    pub fn as_slice(&self) -> &[u64] {
        &self.sizes[..self.n]
    }
}

/// One buffer of a grouped receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvBuf<'a> {
    /// Address.
    pub addr: u64,
    /// Size in bytes (the largest message it accepts).
    pub size: u64,
    /// Tag (NCCL: the sender's rank).
    pub tag: u32,
    /// Registration covering the buffer.
    pub mh: &'a MemHandle,
}

/// One buffer named in a flush.
#[derive(Debug, Clone, Copy)]
pub struct FlushBuf<'a> {
    /// Address.
    pub addr: u64,
    /// Bytes received into it.
    pub size: u64,
    /// Registration covering the buffer.
    pub mh: &'a MemHandle,
}

fn next_generation(g: u32) -> u32 {
    match g.wrapping_add(1) {
        0 => 1,
        x => x,
    }
}

/// State shared by both comm types: the fabric, path tables, completion buffer, warnings.
struct Core<F: Fabric> {
    fab: F,
    cfg: ProtocolConfig,
    /// Fabric indices of the data paths, in data-path order.
    data: Vec<usize>,
    /// Fabric indices of the loopback paths.
    loops: Vec<usize>,
    speeds: Vec<u64>,
    labels: Vec<String>,
    warned: Vec<bool>,
    cqe: Vec<Completion>,
    ctrl: Vec<CtrlMem>,
    /// Registrations NCCL has not released yet (by token): `close` releases them, so a comm closed
    /// with registrations still live leaks nothing.
    regs: std::collections::HashMap<u64, Registration>,
    closed: bool,
}

/// The methods both comm types share: the fabric, and registration (NCCL `regMr`, `regMrDmaBuf`,
/// `deregMr`), all delegated to [`Core`].
macro_rules! registration_methods {
    () => {
        /// The fabric (e.g. for statistics in tests).
        pub fn fabric(&self) -> &F {
            &self.core.fab
        }

        /// The fabric, mutably (e.g. to finish a transport's connection set-up before first use).
        pub fn fabric_mut(&mut self) -> &mut F {
            &mut self.core.fab
        }

        /// Registers memory on every path (NCCL `regMr`).
        pub fn reg_mr(&mut self, addr: u64, len: u64, kind: MemKind) -> Result<MemHandle> {
            self.core.register(addr, len, kind, None)
        }

        /// Registers GPU memory exported as DMA-BUF (NCCL `regMrDmaBuf`); `fd` need only live for
        /// the call. The handle has kind [`MemKind::Cuda`].
        pub fn reg_mr_dmabuf(
            &mut self,
            addr: u64,
            len: u64,
            offset: u64,
            fd: BorrowedFd<'_>,
        ) -> Result<MemHandle> {
            self.core
                .register(addr, len, MemKind::Cuda, Some((offset, fd)))
        }

        /// Releases a registration (NCCL `deregMr`).
        pub fn dereg_mr(&mut self, mh: MemHandle) -> Result<()> {
            self.core.deregister(&mh)
        }
    };
}

/// Registration as NCCL sees it (`regMr`, `regMrDmaBuf`, `deregMr`), the same on both comm types, so
/// callers holding either can register through one `&mut dyn Registrar`.
pub trait Registrar {
    /// Registers memory on every path (NCCL `regMr`).
    fn reg_mr(&mut self, addr: u64, len: u64, kind: MemKind) -> Result<MemHandle>;
    /// Registers GPU memory exported as DMA-BUF (NCCL `regMrDmaBuf`).
    fn reg_mr_dmabuf(
        &mut self,
        addr: u64,
        len: u64,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<MemHandle>;
    /// Releases a registration (NCCL `deregMr`).
    fn dereg_mr(&mut self, mh: MemHandle) -> Result<()>;
}

/// Implements [`Registrar`] for a comm type through its inherent methods.
macro_rules! impl_registrar {
    ($comm:ident) => {
        impl<F: Fabric> Registrar for $comm<F> {
            fn reg_mr(&mut self, addr: u64, len: u64, kind: MemKind) -> Result<MemHandle> {
                $comm::reg_mr(self, addr, len, kind)
            }
            fn reg_mr_dmabuf(
                &mut self,
                addr: u64,
                len: u64,
                offset: u64,
                fd: BorrowedFd<'_>,
            ) -> Result<MemHandle> {
                $comm::reg_mr_dmabuf(self, addr, len, offset, fd)
            }
            fn dereg_mr(&mut self, mh: MemHandle) -> Result<()> {
                $comm::dereg_mr(self, mh)
            }
        }
    };
}
impl_registrar!(SendComm);
impl_registrar!(RecvComm);

impl<F: Fabric> Core<F> {
    fn new(fab: F, cfg: ProtocolConfig) -> Result<Core<F>> {
        let paths = fab.paths();
        let data: Vec<usize> = (0..paths.len())
            .filter(|&i| paths[i].role == PathRole::Data)
            .collect();
        let loops = (0..paths.len())
            .filter(|&i| paths[i].role == PathRole::Loopback)
            .collect();
        if data.is_empty() || data.len() > MAX_PATHS {
            return Err(Error::InvalidArgument(format!(
                "a connection has {} data paths; accepted: 1..={MAX_PATHS}",
                data.len()
            )));
        }
        let speeds = data.iter().map(|&i| paths[i].speed_mbps).collect();
        let labels = paths.iter().map(|p| p.label.clone()).collect();
        Ok(Core {
            warned: vec![false; paths.len()],
            fab,
            cfg,
            data,
            loops,
            speeds,
            labels,
            cqe: Vec::with_capacity(POLL_BATCH),
            ctrl: Vec::new(),
            regs: std::collections::HashMap::new(),
            closed: false,
        })
    }

    /// The data paths' labels, for errors about the connection as a whole (a request timeout).
    fn paths_text(&self) -> String {
        let l: Vec<String> = self
            .data
            .iter()
            .enumerate()
            .map(|(i, &p)| match self.fab.path_note(p) {
                Some(n) => format!("[{i}] {} ({n})", self.labels[p]),
                None => format!("[{i}] {}", self.labels[p]),
            })
            .collect();
        l.join(", ")
    }

    fn deregister(&mut self, mh: &MemHandle) -> Result<()> {
        self.regs.remove(&mh.reg.token);
        self.fab.deregister(&mh.reg)
    }

    fn alloc(&mut self, words: usize) -> Result<CtrlMem> {
        let m = self.fab.alloc_ctrl(words)?;
        self.ctrl.push(m.clone());
        Ok(m)
    }

    fn info(&self, m: &CtrlMem) -> CtrlInfo {
        CtrlInfo {
            addr: m.addr,
            words: m.words as u32,
            rkeys: self.data.iter().map(|&p| m.reg.keys[p].rkey).collect(),
        }
    }

    fn check_peer(&self, peer: &CtrlInfo, need_words: usize, what: &str) -> Result<()> {
        if peer.rkeys.len() != self.data.len() {
            return Err(Error::Remote(format!(
                "peer's {what} lists keys for {} data paths; this connection has {}",
                peer.rkeys.len(),
                self.data.len()
            )));
        }
        if (peer.words as usize) < need_words || peer.addr % 8 != 0 {
            return Err(Error::Remote(format!(
                "peer's {what} is {} words at {:#x}; at least {need_words} words, 8-byte aligned, expected",
                peer.words, peer.addr
            )));
        }
        Ok(())
    }

    /// Turns an error completion into an error, logging once per path.
    fn completion_error(&mut self, path: usize, c: &Completion, what: &str) -> Error {
        let label = &self.labels[path];
        let mut msg = format!("{what} on path {path} ({label}) failed: {}", c.status);
        if let Some(n) = self.fab.path_note(path) {
            msg.push_str(&format!("; {n}"));
        }
        if !self.warned[path] && c.status != WcStatus::WR_FLUSH_ERR {
            self.warned[path] = true;
            tracing::warn!(path, label = %label, status = %c.status, "NET/switchless: {msg}");
        } else {
            tracing::debug!("NET/switchless: {msg}");
        }
        if c.status.is_remote() {
            Error::Remote(msg)
        } else {
            Error::System(msg)
        }
    }

    fn register(
        &mut self,
        addr: u64,
        len: u64,
        kind: MemKind,
        dmabuf: Option<(u64, BorrowedFd<'_>)>,
    ) -> Result<MemHandle> {
        let ulen = usize::try_from(len).map_err(|_| {
            Error::InvalidArgument(format!(
                "registration of {len} bytes exceeds the address space"
            ))
        })?;
        addr.checked_add(len).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "registration {addr:#x}+{len} bytes wraps the address space"
            ))
        })?;
        let reg = match dmabuf {
            None => self.fab.register(addr, ulen, kind)?,
            Some((offset, fd)) => self.fab.register_dmabuf(addr, ulen, offset, fd)?,
        };
        if reg.keys.len() != self.fab.paths().len() {
            let err = Error::Internal(format!(
                "fabric returned keys for {} paths; it has {}",
                reg.keys.len(),
                self.fab.paths().len()
            ));
            let _ = self.fab.deregister(&reg);
            return Err(err);
        }
        self.regs.insert(reg.token, reg.clone());
        Ok(MemHandle {
            addr,
            len,
            kind,
            reg,
        })
    }

    /// Polls every path once (bounded), handing each completion to `f`.
    fn poll_all(
        &mut self,
        mut f: impl FnMut(&mut Core<F>, usize, Completion) -> Result<()>,
    ) -> Result<()> {
        let npaths = self.fab.paths().len();
        for path in 0..npaths {
            // Bounded: at most the queue depth worth of completions per call.
            for _ in 0..(SEND_QUEUE_DEPTH + RECV_DEPTH) / POLL_BATCH + 1 {
                let mut buf = std::mem::take(&mut self.cqe);
                buf.clear();
                let got = self.fab.poll(path, POLL_BATCH, &mut buf);
                let got = match got {
                    Ok(n) => n,
                    Err(e) => {
                        self.cqe = buf;
                        return Err(e);
                    }
                };
                let mut res = Ok(());
                for c in buf.iter() {
                    if let Err(e) = f(self, path, *c) {
                        res = Err(e);
                        break;
                    }
                }
                self.cqe = buf;
                res?;
                if got < POLL_BATCH {
                    break;
                }
            }
        }
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let mut first: Option<Error> = None;
        // 1. Stop the paths: nothing new is placed in our memory after this.
        if let Err(e) = self.fab.shutdown() {
            first.get_or_insert(e);
        }
        // 2. Drain what completed (flush errors of outstanding requests), bounded.
        let _ = self.poll_all(|_, _, _| Ok(()));
        // 3. Free control memory, newest first.
        while let Some(m) = self.ctrl.pop() {
            if let Err(e) = self.fab.free_ctrl(&m) {
                first.get_or_insert(e);
            }
        }
        // 4. Release registrations NCCL did not deregister before closing.
        for (_, reg) in std::mem::take(&mut self.regs) {
            if let Err(e) = self.fab.deregister(&reg) {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn timed_out(posted: Option<Instant>, limit: Option<Duration>) -> Option<Duration> {
    match (posted, limit) {
        (Some(t), Some(l)) if t.elapsed() > l => Some(t.elapsed()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------------
// Send side
// ---------------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct SendReq {
    in_use: bool,
    generation: u32,
    /// Signaled completions still expected.
    pending: u32,
    size: u64,
    tag: u32,
    error: Option<Error>,
    posted: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct CurSlot {
    seq: u64,
    n: usize,
    elems: [CtsElem; MAX_RECVS],
    matched: u8,
}

/// The sending side of a connection (NCCL's `sendComm`).
pub struct SendComm<F: Fabric> {
    core: Core<F>,
    fifo: CtrlMem,
    rec_src: CtrlMem,
    peer: Option<CtrlInfo>,
    head: u64,
    cur: Option<CurSlot>,
    reqs: Vec<SendReq>,
    free: Vec<usize>,
    rotate: usize,
    chunks: Vec<Chunk>,
    batch: Vec<WriteWr>,
    stalled_since: Option<Instant>,
}

impl<F: Fabric> SendComm<F> {
    /// Allocates the CTS FIFO and the record sources. Call [`SendComm::local_info`], exchange, then
    /// [`SendComm::connect`].
    pub fn new(fab: F, cfg: ProtocolConfig) -> Result<SendComm<F>> {
        let mut core = Core::new(fab, cfg)?;
        let fifo = core.alloc(FIFO_DEPTH * SLOT_WORDS)?;
        let rec_src = core.alloc(FIFO_DEPTH * MAX_RECVS)?;
        let mut reqs = Vec::with_capacity(MAX_SEND_REQUESTS);
        reqs.resize_with(MAX_SEND_REQUESTS, || SendReq {
            generation: 1,
            ..SendReq::default()
        });
        Ok(SendComm {
            core,
            fifo,
            rec_src,
            peer: None,
            head: 0,
            cur: None,
            reqs,
            free: (0..MAX_SEND_REQUESTS).rev().collect(),
            rotate: 0,
            chunks: Vec::with_capacity(MAX_PATHS),
            batch: Vec::with_capacity(2),
            stalled_since: None,
        })
    }

    /// What the receiver needs: the CTS FIFO's address and keys.
    pub fn local_info(&self) -> CtrlInfo {
        self.core.info(&self.fifo)
    }

    /// Accepts the receiver's [`RecvComm::local_info`] (its size-record array).
    pub fn connect(&mut self, peer: CtrlInfo) -> Result<()> {
        self.core
            .check_peer(&peer, FIFO_DEPTH * MAX_RECVS, "size-record array")?;
        self.peer = Some(peer);
        Ok(())
    }

    registration_methods!();

    /// Tries to load the CTS entry at the FIFO head; `false` if it has not arrived.
    fn load_slot(&mut self) -> Result<bool> {
        let slot = (self.head % FIFO_DEPTH as u64) as usize;
        let base = slot * SLOT_WORDS;
        let fab = &self.core.fab;
        // The NIC wrote this word after the body (same path, in order): acquire pairs with that.
        let idx = fab.ctrl_load(self.fifo.word(base + SLOT_IDX), Ordering::Acquire)?;
        if idx != self.head + 1 {
            return Ok(false);
        }
        let hdr = fab.ctrl_load(self.fifo.word(base + SLOT_HDR), Ordering::Relaxed)?;
        let n = wire::decode_slot_header(hdr, self.core.data.len())?;
        let mut elems = [CtsElem::default(); MAX_RECVS];
        let mut w = [0u64; MAX_RECVS * wire::ELEM_WORDS];
        let w = &mut w[..n * wire::ELEM_WORDS];
        fab.ctrl_read(self.fifo.word(base + wire::SLOT_ELEMS), w)?;
        for (el, ew) in elems.iter_mut().zip(w.chunks_exact(wire::ELEM_WORDS)) {
            *el = wire::decode_elem(ew);
        }
        self.cur = Some(CurSlot {
            seq: self.head,
            n,
            elems,
            matched: 0,
        });
        Ok(true)
    }

    /// Posts a send of `size` bytes at `data` with `tag` (NCCL `isend`). `Ok(None)` means "call again
    /// later": the receiver's clear-to-send has not arrived, no buffer of it carries `tag` yet, or all
    /// [`MAX_SEND_REQUESTS`] requests are in use.
    pub fn isend(
        &mut self,
        data: u64,
        size: u64,
        tag: u32,
        mh: &MemHandle,
    ) -> Result<Option<Request>> {
        let Some(peer) = self.peer.as_ref() else {
            return Err(Error::InvalidArgument(
                "isend on a send comm that is not connected".into(),
            ));
        };
        let peer_addr = peer.addr;
        let mut peer_rkeys = [0u32; MAX_PATHS];
        peer_rkeys[..peer.rkeys.len()].copy_from_slice(&peer.rkeys);
        if self.core.closed {
            return Err(Error::InvalidArgument("isend on a closed send comm".into()));
        }
        mh.check_covers(data, size, "send")?;
        if size > MAX_MESSAGE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "send of {size} bytes; at most {MAX_MESSAGE_BYTES} bytes accepted"
            )));
        }
        let Some(&idx) = self.free.last() else {
            return Ok(None);
        };
        if self.cur.is_none() && !self.load_slot()? {
            // Nothing to poll for while no clear-to-send arrives: ask the devices what they saw.
            self.core.fab.health()?;
            let since = *self.stalled_since.get_or_insert_with(Instant::now);
            if let Some(waited) = timed_out(Some(since), self.core.cfg.request_timeout) {
                return Err(Error::Timeout(format!(
                    "send of {size} bytes (tag {tag}) made no progress for {} ms (NCCL_SWITCHLESS_REQUEST_TIMEOUT): no clear-to-send from the receiver (FIFO sequence {}) on path(s) {}",
                    waited.as_millis(),
                    self.head,
                    self.core.paths_text()
                )));
            }
            return Ok(None);
        }
        self.stalled_since = None;
        let Some(cur) = self.cur.as_mut() else {
            return Err(Error::Internal("CTS slot vanished".into()));
        };
        let Some(e) = (0..cur.n).find(|&e| cur.matched & (1 << e) == 0 && cur.elems[e].tag == tag)
        else {
            tracing::trace!(
                tag,
                seq = cur.seq,
                "isend: no buffer of the posted receive carries this tag yet"
            );
            return Ok(None);
        };
        let el = cur.elems[e];
        if size > el.size {
            return Err(Error::InvalidUsage(format!(
                "send of {size} bytes with tag {tag} exceeds the posted receive buffer of {} bytes \
                 (message truncated); a receive must be at least as large as the send",
                el.size
            )));
        }
        let seq = cur.seq;
        cur.matched |= 1 << e;
        if cur.matched.count_ones() as usize == cur.n {
            self.cur = None;
            self.head += 1;
        }

        let slot = (seq % FIFO_DEPTH as u64) as usize;
        let rec_word = slot * MAX_RECVS + e;
        let rec_remote = peer_addr + 8 * rec_word as u64;
        stripe(
            size,
            &self.core.speeds,
            self.core.cfg.stripe,
            self.rotate,
            &mut self.chunks,
        );
        self.rotate = self.rotate.wrapping_add(1);

        self.free.pop();
        let r = &mut self.reqs[idx];
        r.in_use = true;
        r.pending = 0;
        r.size = size;
        r.tag = tag;
        r.error = None;
        r.posted = self.core.cfg.request_timeout.map(|_| Instant::now());
        let generation = r.generation;
        let id = wire::wr_id(WrKind::Send, idx, generation);
        let npaths = self.chunks.len();
        let imm = Imm {
            slot,
            elem: e,
            npaths,
            seq16: seq as u16,
        }
        .encode();
        self.core.fab.ctrl_store(
            self.rec_src.word(rec_word),
            wire::encode_record(size, seq),
            Ordering::Release,
        )?;

        // One batch per path (one doorbell on verbs): its data pieces, then, on the first path of the
        // stripe, the size record. The last work request of each batch carries the immediate and is
        // the only signaled one.
        let mut posted = 0u32;
        let mut result = Ok(());
        for (ci, c) in self.chunks.iter().enumerate() {
            let path = self.core.data[c.path];
            let lkey = mh.reg.keys[path].lkey;
            let rkey = el.rkeys[c.path];
            let carries_record = ci == 0;
            self.batch.clear();
            let mut off = 0u64;
            while off < c.len {
                let len = (c.len - off).min(MAX_WR_BYTES);
                let with_imm = off + len == c.len && !carries_record;
                self.batch.push(WriteWr {
                    wr_id: id,
                    local: LocalSeg {
                        addr: data + c.offset + off,
                        len: len as u32,
                        lkey,
                    },
                    remote: RemoteSeg {
                        addr: el.addr + c.offset + off,
                        rkey,
                    },
                    imm: with_imm.then_some(imm),
                    signaled: with_imm,
                    inline: len <= u64::from(self.core.cfg.inline_max),
                });
                off += len;
            }
            if carries_record {
                self.batch.push(WriteWr {
                    wr_id: id,
                    local: LocalSeg {
                        addr: self.rec_src.word(rec_word),
                        len: 8,
                        lkey: self.rec_src.reg.keys[path].lkey,
                    },
                    remote: RemoteSeg {
                        addr: rec_remote,
                        rkey: peer_rkeys[c.path],
                    },
                    imm: Some(imm),
                    signaled: true,
                    inline: 8 <= self.core.cfg.inline_max,
                });
            }
            result = self.core.fab.post_writes(path, &self.batch);
            if result.is_err() {
                break;
            }
            posted += 1;
        }
        let r = &mut self.reqs[idx];
        r.pending = posted;
        if let Err(err) = result {
            self.release(idx);
            return Err(err);
        }
        Ok(Some(Request::new(ReqKind::Send, idx, generation)))
    }

    fn release(&mut self, idx: usize) {
        let r = &mut self.reqs[idx];
        r.in_use = false;
        r.generation = next_generation(r.generation);
        r.error = None;
        self.free.push(idx);
    }

    fn progress(&mut self) -> Result<()> {
        let reqs = &mut self.reqs;
        self.core.poll_all(|core, path, c| {
            let Some((WrKind::Send, idx, generation)) = wire::split_wr_id(c.wr_id) else {
                return Err(Error::Internal(format!(
                    "send comm got a completion with foreign wr_id {:#x} on path {path}",
                    c.wr_id
                )));
            };
            let Some(r) = reqs
                .get_mut(idx)
                .filter(|r| r.in_use && r.generation == generation)
            else {
                return Ok(()); // a request already failed and released
            };
            if !c.status.is_success() {
                let what = format!("send of {} bytes (tag {})", r.size, r.tag);
                let err = core.completion_error(path, &c, &what);
                r.error.get_or_insert(err);
            } else if c.opcode == WcOpcode::RdmaWrite {
                r.pending = r.pending.saturating_sub(1);
            }
            Ok(())
        })
    }

    /// Polls completions and reports whether `req` is done: `Some(bytes sent)`. A done or failed
    /// request is released; testing it again is an error.
    pub fn test(&mut self, req: Request) -> Result<Option<u64>> {
        let (kind, idx, generation) = req.parts();
        let valid = kind == ReqKind::Send as u64
            && self
                .reqs
                .get(idx)
                .is_some_and(|r| r.in_use && r.generation == generation);
        if !valid {
            return Err(Error::InvalidArgument(format!(
                "test of request {:#x}, which is not an outstanding send of this comm",
                req.0
            )));
        }
        self.progress()?;
        let r = &mut self.reqs[idx];
        if let Some(err) = r.error.take() {
            self.release(idx);
            return Err(err);
        }
        if r.pending == 0 {
            let size = r.size;
            self.release(idx);
            return Ok(Some(size));
        }
        if let Some(waited) = timed_out(r.posted, self.core.cfg.request_timeout) {
            let msg = format!(
                "send of {} bytes (tag {}) made no progress for {} ms (NCCL_SWITCHLESS_REQUEST_TIMEOUT): the peer does not answer on path(s) {}",
                r.size,
                r.tag,
                waited.as_millis(),
                self.core.paths_text()
            );
            self.release(idx);
            return Err(Error::Timeout(msg));
        }
        Ok(None)
    }

    /// Number of send requests outstanding.
    pub fn outstanding(&self) -> usize {
        MAX_SEND_REQUESTS - self.free.len()
    }

    /// Tears down (NCCL `closeSend`), also with requests outstanding: stops the paths, drains their
    /// completions, frees control memory, then drops the fabric.
    pub fn close(mut self) -> Result<()> {
        self.core.close()
    }
}

// ---------------------------------------------------------------------------------------------------
// Receive side
// ---------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
struct ElemState {
    posted: u64,
    /// Immediates expected (0: none seen yet).
    expected: u8,
    got: u8,
    done: bool,
    size: u64,
}

#[derive(Debug, Default)]
struct RecvReq {
    in_use: bool,
    generation: u32,
    seq: u64,
    n: usize,
    elems: [ElemState; MAX_RECVS],
    cts_pending: u8,
    error: Option<Error>,
    posted: Option<Instant>,
}

#[derive(Debug, Default)]
struct FlushReq {
    in_use: bool,
    generation: u32,
    pending: u32,
    error: Option<Error>,
    posted: Option<Instant>,
}

/// The receiving side of a connection (NCCL's `recvComm`).
pub struct RecvComm<F: Fabric> {
    core: Core<F>,
    shadow: CtrlMem,
    records: CtrlMem,
    scratch: CtrlMem,
    peer: Option<CtrlInfo>,
    head: u64,
    slots: Vec<RecvReq>,
    flushes: Vec<FlushReq>,
    flush_free: Vec<usize>,
    /// A failure that concerns every request (a receive queue error, a protocol violation).
    fatal: Option<Error>,
    slot_words: [u64; SLOT_WORDS],
}

impl<F: Fabric> RecvComm<F> {
    /// Allocates the CTS shadow, the size records and the flush scratch words, and posts
    /// [`RECV_DEPTH`] receives on every data path.
    pub fn new(fab: F, cfg: ProtocolConfig) -> Result<RecvComm<F>> {
        let mut core = Core::new(fab, cfg)?;
        let shadow = core.alloc(FIFO_DEPTH * SLOT_WORDS)?;
        let records = core.alloc(FIFO_DEPTH * MAX_RECVS)?;
        let scratch = core.alloc(MAX_REQUESTS)?;
        for k in 0..core.data.len() {
            let path = core.data[k];
            for _ in 0..RECV_DEPTH {
                core.fab
                    .post_recv(path, wire::wr_id(WrKind::Recv, path, 0))?;
            }
        }
        let mut slots = Vec::with_capacity(FIFO_DEPTH);
        slots.resize_with(FIFO_DEPTH, || RecvReq {
            generation: 1,
            ..RecvReq::default()
        });
        let mut flushes = Vec::with_capacity(MAX_REQUESTS);
        flushes.resize_with(MAX_REQUESTS, || FlushReq {
            generation: 1,
            ..FlushReq::default()
        });
        Ok(RecvComm {
            core,
            shadow,
            records,
            scratch,
            peer: None,
            head: 0,
            slots,
            flushes,
            flush_free: (0..MAX_REQUESTS).rev().collect(),
            fatal: None,
            slot_words: [0; SLOT_WORDS],
        })
    }

    /// What the sender needs: the size-record array's address and keys.
    pub fn local_info(&self) -> CtrlInfo {
        self.core.info(&self.records)
    }

    /// Accepts the sender's [`SendComm::local_info`] (its CTS FIFO).
    pub fn connect(&mut self, peer: CtrlInfo) -> Result<()> {
        self.core
            .check_peer(&peer, FIFO_DEPTH * SLOT_WORDS, "CTS FIFO")?;
        self.peer = Some(peer);
        Ok(())
    }

    registration_methods!();

    /// Posts a grouped receive of 1..=[`MAX_RECVS`] buffers (NCCL `irecv`). `Ok(None)` means "call
    /// again later": the FIFO slot this receive needs is still held by an older request.
    pub fn irecv(&mut self, bufs: &[RecvBuf<'_>]) -> Result<Option<Request>> {
        let Some(peer) = self.peer.as_ref() else {
            return Err(Error::InvalidArgument(
                "irecv on a recv comm that is not connected".into(),
            ));
        };
        if self.core.closed {
            return Err(Error::InvalidArgument("irecv on a closed recv comm".into()));
        }
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error::InvalidArgument(format!(
                "irecv of {n} buffers; accepted: 1..={MAX_RECVS}"
            )));
        }
        for b in bufs {
            b.mh.check_covers(b.addr, b.size, "receive")?;
        }
        let slot = (self.head % FIFO_DEPTH as u64) as usize;
        if self.slots[slot].in_use {
            return Ok(None);
        }
        let npaths = self.core.data.len();
        let mut elems = [CtsElem::default(); MAX_RECVS];
        for (el, b) in elems.iter_mut().zip(bufs) {
            el.addr = b.addr;
            el.size = b.size;
            el.tag = b.tag;
            for (k, &p) in self.core.data.iter().enumerate() {
                el.rkeys[k] = b.mh.reg.keys[p].rkey;
            }
        }
        let seq = self.head;
        let base = slot * SLOT_WORDS;
        wire::encode_slot_body(&elems[..n], npaths, &mut self.slot_words);
        let body = wire::slot_body_words(n);
        let inline_max = self.core.cfg.inline_max;
        let fab = &mut self.core.fab;
        fab.ctrl_write(
            self.shadow.word(base + SLOT_HDR),
            &self.slot_words[SLOT_HDR..SLOT_HDR + body],
        )?;
        fab.ctrl_store(
            self.shadow.word(base + SLOT_IDX),
            seq + 1,
            Ordering::Release,
        )?;

        let k = (seq % npaths as u64) as usize;
        let path = self.core.data[k];
        let lkey = self.shadow.reg.keys[path].lkey;
        let rkey = peer.rkeys[k];
        let r = &mut self.slots[slot];
        let id = wire::wr_id(WrKind::Cts, slot, r.generation);
        // Body first, then the index word on the same path: the sender sees the index only after the
        // body is in place.
        fab.post_writes(
            path,
            &[
                WriteWr {
                    wr_id: id,
                    local: LocalSeg {
                        addr: self.shadow.word(base + SLOT_HDR),
                        len: (8 * body) as u32,
                        lkey,
                    },
                    remote: RemoteSeg {
                        addr: peer.addr + 8 * (base + SLOT_HDR) as u64,
                        rkey,
                    },
                    imm: None,
                    signaled: false,
                    inline: 8 * body as u32 <= inline_max,
                },
                WriteWr {
                    wr_id: id,
                    local: LocalSeg {
                        addr: self.shadow.word(base + SLOT_IDX),
                        len: 8,
                        lkey,
                    },
                    remote: RemoteSeg {
                        addr: peer.addr + 8 * (base + SLOT_IDX) as u64,
                        rkey,
                    },
                    imm: None,
                    signaled: true,
                    inline: 8 <= inline_max,
                },
            ],
        )?;
        r.in_use = true;
        r.seq = seq;
        r.n = n;
        for (st, b) in r.elems.iter_mut().zip(bufs) {
            *st = ElemState {
                posted: b.size,
                ..ElemState::default()
            };
        }
        r.cts_pending = 1;
        r.error = None;
        r.posted = self.core.cfg.request_timeout.map(|_| Instant::now());
        self.head += 1;
        Ok(Some(Request::new(ReqKind::Recv, slot, r.generation)))
    }

    /// Flushes GPU-direct receives (NCCL `iflush`): one RDMA read per loopback path from the last
    /// non-empty GPU buffer. `Ok(None)` means "nothing to flush" (no GPU buffer received data, or the
    /// fabric has no loopback path); it is not a retry. More than [`MAX_REQUESTS`] flushes outstanding
    /// is an [`Error::Internal`] (never a silent `None`, which NCCL would take as done).
    pub fn iflush(&mut self, bufs: &[FlushBuf<'_>]) -> Result<Option<Request>> {
        if self.core.closed {
            return Err(Error::InvalidArgument(
                "iflush on a closed recv comm".into(),
            ));
        }
        let Some(target) = bufs
            .iter()
            .rev()
            .find(|b| b.size > 0 && b.mh.kind == MemKind::Cuda)
        else {
            return Ok(None);
        };
        target.mh.check_covers(target.addr, 1, "flush")?;
        if self.core.loops.is_empty() {
            return Ok(None);
        }
        let Some(idx) = self.flush_free.pop() else {
            return Err(Error::Internal(format!(
                "more than {MAX_REQUESTS} flushes outstanding on one recv comm"
            )));
        };
        let generation = self.flushes[idx].generation;
        let id = wire::wr_id(WrKind::Flush, idx, generation);
        let mut posted = 0;
        let mut result = Ok(());
        for &lp in &self.core.loops {
            let wr = ReadWr {
                wr_id: id,
                local: LocalSeg {
                    addr: self.scratch.word(idx),
                    len: 1,
                    lkey: self.scratch.reg.keys[lp].lkey,
                },
                remote: RemoteSeg {
                    addr: target.addr,
                    rkey: target.mh.reg.keys[lp].rkey,
                },
            };
            result = self.core.fab.post_read(lp, &wr);
            if result.is_err() {
                break;
            }
            posted += 1;
        }
        let f = &mut self.flushes[idx];
        f.in_use = true;
        f.pending = posted;
        f.error = None;
        f.posted = self.core.cfg.request_timeout.map(|_| Instant::now());
        if let Err(e) = result {
            self.release_flush(idx);
            return Err(e);
        }
        Ok(Some(Request::new(ReqKind::Flush, idx, generation)))
    }

    fn release_flush(&mut self, idx: usize) {
        let f = &mut self.flushes[idx];
        f.in_use = false;
        f.generation = next_generation(f.generation);
        f.error = None;
        self.flush_free.push(idx);
    }

    fn release_slot(&mut self, slot: usize) {
        let r = &mut self.slots[slot];
        r.in_use = false;
        r.generation = next_generation(r.generation);
        r.error = None;
    }

    fn progress(&mut self) -> Result<()> {
        let slots = &mut self.slots;
        let flushes = &mut self.flushes;
        let records = &self.records;
        let fatal = &mut self.fatal;
        self.core.poll_all(|core, path, c| {
            let Some((kind, idx, generation)) = wire::split_wr_id(c.wr_id) else {
                return Err(Error::Internal(format!(
                    "recv comm got a completion with foreign wr_id {:#x} on path {path}",
                    c.wr_id
                )));
            };
            match kind {
                WrKind::Cts => {
                    let Some(r) = slots
                        .get_mut(idx)
                        .filter(|r| r.in_use && r.generation == generation)
                    else {
                        return Ok(());
                    };
                    if c.status.is_success() {
                        r.cts_pending = r.cts_pending.saturating_sub(1);
                    } else {
                        let err = core.completion_error(path, &c, "clear-to-send write");
                        r.error.get_or_insert(err);
                    }
                }
                WrKind::Flush => {
                    let Some(f) = flushes
                        .get_mut(idx)
                        .filter(|f| f.in_use && f.generation == generation)
                    else {
                        return Ok(());
                    };
                    if c.status.is_success() {
                        f.pending = f.pending.saturating_sub(1);
                    } else {
                        let err = core.completion_error(path, &c, "flush read");
                        f.error.get_or_insert(err);
                    }
                }
                WrKind::Recv => {
                    if !c.status.is_success() {
                        let err = core.completion_error(path, &c, "receive of an immediate");
                        fatal.get_or_insert(err);
                        return Ok(());
                    }
                    if !core.closed {
                        core.fab.post_recv(path, c.wr_id)?;
                    }
                    if let Err(err) = Self::on_imm(core.fab_ref(), records, slots, &c) {
                        tracing::warn!(path, label = %core.labels[path], "NET/switchless: {err}");
                        fatal.get_or_insert(err);
                    }
                }
                WrKind::Send => {
                    return Err(Error::Internal(format!(
                        "recv comm got a send completion (wr_id {:#x}) on path {path}",
                        c.wr_id
                    )));
                }
            }
            Ok(())
        })
    }

    fn on_imm(fab: &F, records: &CtrlMem, slots: &mut [RecvReq], c: &Completion) -> Result<()> {
        let Some(v) = c.imm else {
            return Err(Error::Remote(
                "write-with-immediate completion without an immediate".into(),
            ));
        };
        let imm = Imm::decode(v)?;
        let r = &mut slots[imm.slot];
        if !r.in_use || (r.seq as u16) != imm.seq16 || imm.elem >= r.n {
            return Err(Error::Remote(format!(
                "immediate for slot {} buffer {} sequence {:#x} matches no posted receive",
                imm.slot, imm.elem, imm.seq16
            )));
        }
        let st = &mut r.elems[imm.elem];
        if st.done || (st.expected != 0 && st.expected as usize != imm.npaths) {
            return Err(Error::Remote(format!(
                "inconsistent immediates for slot {} buffer {}: {} paths announced, {} seen before",
                imm.slot, imm.elem, imm.npaths, st.expected
            )));
        }
        st.expected = imm.npaths as u8;
        st.got += 1;
        if st.got as usize == st.expected as usize {
            let word = fab.ctrl_load(
                records.word(imm.slot * MAX_RECVS + imm.elem),
                Ordering::Acquire,
            )?;
            let size = wire::decode_record(word, r.seq)?;
            if size > st.posted {
                return Err(Error::Remote(format!(
                    "peer sent {size} bytes into a receive buffer of {} bytes",
                    st.posted
                )));
            }
            st.size = size;
            st.done = true;
        }
        Ok(())
    }

    /// Polls completions and reports whether `req` (a receive or a flush) is done: the received sizes
    /// per buffer (empty for a flush). A done or failed request is released; testing it again is an
    /// error.
    pub fn test(&mut self, req: Request) -> Result<Option<Sizes>> {
        let (kind, idx, generation) = req.parts();
        let valid = match kind {
            k if k == ReqKind::Recv as u64 => self
                .slots
                .get(idx)
                .is_some_and(|r| r.in_use && r.generation == generation),
            k if k == ReqKind::Flush as u64 => self
                .flushes
                .get(idx)
                .is_some_and(|f| f.in_use && f.generation == generation),
            _ => false,
        };
        if !valid {
            return Err(Error::InvalidArgument(format!(
                "test of request {:#x}, which is not an outstanding receive or flush of this comm",
                req.0
            )));
        }
        self.progress()?;
        if kind == ReqKind::Flush as u64 {
            let f = &mut self.flushes[idx];
            if let Some(e) = f.error.take() {
                self.release_flush(idx);
                return Err(e);
            }
            if f.pending == 0 {
                self.release_flush(idx);
                return Ok(Some(Sizes::default()));
            }
            if let Some(w) = timed_out(f.posted, self.core.cfg.request_timeout) {
                self.release_flush(idx);
                return Err(Error::Timeout(format!(
                    "flush read made no progress for {} ms (NCCL_SWITCHLESS_REQUEST_TIMEOUT)",
                    w.as_millis()
                )));
            }
            return Ok(None);
        }
        let r = &mut self.slots[idx];
        if let Some(e) = r.error.take().or_else(|| self.fatal.clone()) {
            self.release_slot(idx);
            return Err(e);
        }
        if r.cts_pending == 0 && r.elems[..r.n].iter().all(|e| e.done) {
            let mut s = Sizes {
                n: r.n,
                sizes: [0; MAX_RECVS],
            };
            for (d, e) in s.sizes.iter_mut().zip(&r.elems[..r.n]) {
                *d = e.size;
            }
            self.release_slot(idx);
            return Ok(Some(s));
        }
        if let Some(w) = timed_out(r.posted, self.core.cfg.request_timeout) {
            let msg = format!(
                "receive of {} buffers (FIFO sequence {}) made no progress for {} ms (NCCL_SWITCHLESS_REQUEST_TIMEOUT): the peer does not answer on path(s) {}",
                r.n,
                r.seq,
                w.as_millis(),
                self.core.paths_text()
            );
            self.release_slot(idx);
            return Err(Error::Timeout(msg));
        }
        Ok(None)
    }

    /// Number of receive requests outstanding.
    pub fn outstanding(&self) -> usize {
        self.slots.iter().filter(|r| r.in_use).count()
    }

    /// Tears down (NCCL `closeRecv`), also with requests outstanding: stops the paths, drains their
    /// completions, frees control memory, then drops the fabric.
    pub fn close(mut self) -> Result<()> {
        self.core.close()
    }
}

impl<F: Fabric> Core<F> {
    fn fab_ref(&self) -> &F {
        &self.fab
    }
}

/// Builds a connected pair from two fabric endpoints in one process (tests, benchmarks, and any
/// transport whose handshake has already exchanged nothing but the paths).
pub fn connect_pair<F: Fabric, G: Fabric>(
    send_fab: F,
    recv_fab: G,
    cfg: ProtocolConfig,
) -> Result<(SendComm<F>, RecvComm<G>)> {
    let mut s = SendComm::new(send_fab, cfg)?;
    let mut r = RecvComm::new(recv_fab, cfg)?;
    let si = s.local_info();
    let ri = r.local_info();
    s.connect(ri)?;
    r.connect(si)?;
    Ok((s, r))
}

impl<F: Fabric> Drop for SendComm<F> {
    fn drop(&mut self) {
        let _ = self.core.close();
    }
}

impl<F: Fabric> Drop for RecvComm<F> {
    fn drop(&mut self) {
        let _ = self.core.close();
    }
}
