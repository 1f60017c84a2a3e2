//! A [`Fabric`] over TCP: the second kind of path (Ethernet links without RDMA, seed 003), carrying
//! the same receiver-driven protocol ([`super::comm`]) as the verbs paths. Nothing above the
//! [`Fabric`] trait knows which kind of path it runs on.
//!
//! # How one-sided operations are emulated
//!
//! * Each data path is `S` TCP streams between the two link addresses ([`streams_for_speed`], or an
//!   explicit count). Each stream is full duplex: both endpoints write to each other over it.
//! * An RDMA write becomes one or more **frames** (header `{seq, remote addr, rkey, len, imm,
//!   write length}` + payload). Large writes are cut into frames of at most
//!   [`TcpConfig::frame_bytes`] and the frames are spread over the path's streams (least queued bytes
//!   first), so one message uses every stream.
//! * Every frame carries a **per-path sequence number**. The receiving side places payload bound for
//!   data memory as soon as it arrives (from the socket straight into the registered memory, no
//!   intermediate copy), but applies the *ordered effects* — a write into control memory (CTS entries,
//!   size records) and the completion of a write with immediate — strictly in sequence order, after
//!   every earlier frame of that path has landed. That is exactly the RC guarantee the protocol relies
//!   on ("the immediate arrives after all data of the preceding writes on the same path"; the CTS index
//!   word lands after the CTS body), while data frames on different streams still move in parallel.
//! * The receiving I/O worker treats the peer as untrusted: the rkey must name a live registration of this
//!   endpoint and `[addr, addr+len)` must lie inside it; a violation logs a warning, fails the path and
//!   closes its streams (the peer then sees its writes fail). Nothing is ever written outside a
//!   registration: placement holds the registration's lock while copying one chunk (one `recv` of at
//!   most 1 MiB), and deregistration waits for that chunk only, never for a whole frame.
//! * The sender's completion is produced when the last byte of the work request has been handed to
//!   the kernel (the source may then be reused), and completions of one path are produced in posting
//!   order. A broken stream fails the work request in flight with `RETRY_EXC_ERR` and flushes every
//!   later one with `WR_FLUSH_ERR`; the receiving side flushes its posted receives, so both ends'
//!   requests fail instead of hanging.
//!
//! * Closing: [`Fabric::shutdown`] sends a close frame on every stream that is at a frame boundary.
//!   An orderly close (nothing outstanding) leaves the peer's posted receives posted, as with RC;
//!   a close with work outstanding ("dirty"), or a stream that ends without a close frame, fails
//!   the peer's posted receives. What has arrived is read and dropped before the sockets close, so
//!   the kernel sends FIN after our data rather than a reset that would discard it.
//!
//! # Threads
//!
//! No thread per stream: a small process-wide pool of I/O worker threads (module `pool`), shared by
//! every `TcpFabric` of the process, drives all streams with an event loop (`mio`, epoll): each
//! stream is a non-blocking state machine per direction, resumed when its socket is ready. `post_*`
//! only enqueue (and wake the stream's worker when its sender was idle) and `poll` only drains a
//! queue: NCCL's progress thread never blocks in the kernel.
//!
//! * Pool size: [`TcpConfig::io_threads`] (`NCCL_SWITCHLESS_TCP_THREADS`), by default
//!   [`default_io_threads`] = the CPUs this process may use, 1..=8: a worker only copies between
//!   sockets and memory, so more workers than CPUs add context switches, not bandwidth, and 8 cores
//!   of copies cover the TCP links a host drives while leaving CPUs to NCCL. The size in effect when
//!   the pool starts holds until it empties.
//! * Assignment: a stream goes to the worker holding the fewest streams of its path, then of
//!   its fabric, then overall; a new worker starts (up to the pool size) when none is idle. So the
//!   streams of one path run on different threads, and the pool never has more threads than streams.
//! * Lifecycle: workers start when the first stream is added; [`Fabric::shutdown`] (also run on
//!   drop) takes the fabric's streams out of their workers and waits until no worker touches them;
//!   a worker left without streams exits and is joined there. After the last fabric is shut down no
//!   pool thread is left ([`io_threads`] = 0): NCCL unloads the plugin after finalize, and a thread
//!   still running inside the unmapped library would crash the process.
//!
//! # Memory
//!
//! Registered data memory is raw process memory given by NCCL; the raw copies live in
//! [`crate::sys`] (the only place with `unsafe`). Control memory is `AtomicU64` words owned
//! by the fabric, written by the receiving I/O worker with release stores and read by the protocol with
//! the ordering it asks for. GPU memory is not accepted: a TCP path carries host memory only
//! (`NCCL_PTR_HOST`; NCCL stages GPU buffers through host memory).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::{Error, Result};
use crate::sys::rawmem::RawRegion;
use crate::sys::socket::{self as rawmem, Ready};
use crate::transport::ctrl::AtomicWords;
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, MemKind, PathInfo, PathKeys, PathRole, ReadWr, Registration,
    WcOpcode, WcStatus, WriteWr,
};

mod pool;

pub use pool::{DEFAULT_MAX_IO_THREADS, MAX_IO_THREADS, default_io_threads, io_threads};

/// Streams per path: at least this many (one stream never fills a 10 Gb/s link, seed 003).
pub const MIN_STREAMS: usize = 2;
/// Streams per path: at most this many.
pub const MAX_STREAMS: usize = 16;
/// Link speed one stream is expected to carry, in Mb/s (seed 003: one stream stayed under 2.2 Gb/s
/// on 10GBase-T).
pub const MBPS_PER_STREAM: u64 = 2500;
/// Writes up to this many bytes are copied when posted and sent as one frame.
pub const COPY_AT_POST_BYTES: usize = 4096;
/// Frame payloads are at least this large (unless the write is smaller).
pub const MIN_FRAME_BYTES: usize = 64 * 1024;
/// Largest frame payload a receiver accepts, bytes.
pub const MAX_FRAME_BYTES: usize = 16 << 20;
/// Frames a receiver may hold out of order per path before it calls the peer broken.
const SEQ_WINDOW: u64 = 1 << 20;
/// Control-memory payload a receiver buffers out of order per path before it calls the peer broken.
const MAX_BUFFERED_CTRL: usize = 64 << 20;

const FRAME_MAGIC: u16 = 0x5754;
const OP_WRITE: u8 = 1;
/// Last frame of a stream, sent by `shutdown`: the sender is going away.
const OP_CLOSE: u8 = 2;
const FLAG_IMM: u8 = 1;
/// On [`OP_CLOSE`]: work requests were still outstanding (dropped), the close is not orderly.
const FLAG_DIRTY: u8 = 2;
/// How long `shutdown` tries to hand the close frames to the kernel.
const GOODBYE_WAIT: Duration = Duration::from_millis(200);
const HDR_LEN: usize = 40;
const HELLO_MAGIC: [u8; 4] = *b"SWTS";
const ACK_MAGIC: [u8; 4] = *b"SWTA";
const HELLO_VERSION: u8 = 1;
const HELLO_LEN: usize = 24;

/// Number of TCP streams for a path of `speed_mbps` Mb/s: one per [`MBPS_PER_STREAM`], clamped to
/// [`MIN_STREAMS`]..=[`MAX_STREAMS`]; an unknown speed (0) gets 4 (a 10 Gb/s link).
pub fn streams_for_speed(speed_mbps: u64) -> usize {
    if speed_mbps == 0 {
        return 4;
    }
    (speed_mbps.div_ceil(MBPS_PER_STREAM) as usize).clamp(MIN_STREAMS, MAX_STREAMS)
}

/// Streams per path for a per-connection total (`NCCL_SWITCHLESS_TCP_STREAMS=n`, which the config
/// layer defines per connection and spreads over the paths): ⌈total / paths⌉, clamped to
/// 1..=[`MAX_STREAMS`]. Put the result in [`TcpConfig::streams`].
pub fn per_path_streams(total: usize, npaths: usize) -> usize {
    total.div_ceil(npaths.max(1)).clamp(1, MAX_STREAMS)
}

/// Socket buffer size, in bytes, that keeps one stream of a path busy: twice the stream's share of
/// the bandwidth-delay product, `2 × (speed_mbps × 10⁶ / 8 B/s) × (rtt_us × 10⁻⁶ s) / streams`
/// = `speed_mbps × rtt_us / (4 × streams)` bytes, at least 256 KiB, rounded up to 4 KiB. (Twice: the
/// kernel counts its bookkeeping in the buffer, and a window must cover the ACK delay too.)
pub fn socket_buffer_bytes(speed_mbps: u64, rtt_us: u64, streams: usize) -> usize {
    let streams = streams.max(1) as u64;
    let bytes = (speed_mbps.saturating_mul(rtt_us) / (4 * streams)).max(256 * 1024);
    (bytes.div_ceil(4096) * 4096).min(1 << 30) as usize
}

/// What to do with `SO_SNDBUF` / `SO_RCVBUF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferPolicy {
    /// Compute [`socket_buffer_bytes`]; leave the kernel's autotuning on when its maximum
    /// (`net.ipv4.tcp_rmem`/`tcp_wmem`, third field) already covers that size, otherwise set both
    /// buffers explicitly (the kernel then caps them at `net.core.rmem_max`/`wmem_max`; a warning
    /// names the sysctl to raise).
    Auto,
    /// Set both buffers to this many bytes (turns autotuning off for these sockets).
    Fixed(usize),
}

/// Options of the TCP fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Streams per path. `None`: [`streams_for_speed`] (the connector decides; the acceptor takes the
    /// count from the connector). The config layer maps `NCCL_SWITCHLESS_TCP_STREAMS` here.
    pub streams: Option<usize>,
    /// Round-trip time assumed for buffer sizing, µs (default 100 µs: a back-to-back cable plus the
    /// hosts' interrupt and scheduling delay).
    pub rtt_us: u64,
    /// Socket buffer policy.
    pub buffers: BufferPolicy,
    /// Largest frame payload in bytes (default 512 KiB; 64 KiB..=16 MiB).
    pub frame_bytes: usize,
    /// Deadline for connecting and accepting every stream.
    pub connect_timeout: Duration,
    /// I/O worker threads of the process-wide pool (1..=[`MAX_IO_THREADS`]); `None`:
    /// [`default_io_threads`]. Used when the pool starts (its first stream); the config layer maps
    /// `NCCL_SWITCHLESS_TCP_THREADS` here.
    pub io_threads: Option<usize>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            streams: None,
            rtt_us: 100,
            buffers: BufferPolicy::Auto,
            frame_bytes: 512 * 1024,
            connect_timeout: Duration::from_secs(10),
            io_threads: None,
        }
    }
}

impl TcpConfig {
    fn check(&self) -> Result<()> {
        if let Some(s) = self.streams
            && !(1..=MAX_STREAMS).contains(&s)
        {
            return Err(Error::InvalidUsage(format!(
                "{s} TCP streams per path; accepted: 1..={MAX_STREAMS}"
            )));
        }
        if !(MIN_FRAME_BYTES..=MAX_FRAME_BYTES).contains(&self.frame_bytes) {
            return Err(Error::InvalidUsage(format!(
                "TCP frame size {} bytes; accepted: {MIN_FRAME_BYTES}..={MAX_FRAME_BYTES} bytes",
                self.frame_bytes
            )));
        }
        if let Some(t) = self.io_threads
            && !(1..=MAX_IO_THREADS).contains(&t)
        {
            return Err(Error::InvalidUsage(format!(
                "{t} TCP I/O threads; accepted: 1..={MAX_IO_THREADS}"
            )));
        }
        if let BufferPolicy::Fixed(b) = self.buffers
            && !(4096..=1 << 30).contains(&b)
        {
            return Err(Error::InvalidUsage(format!(
                "TCP socket buffer of {b} bytes; accepted: 4096..=1073741824 bytes"
            )));
        }
        Ok(())
    }
}

/// One TCP path as the route layer chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpPathSpec {
    /// The local link address every stream binds to (so the kernel sends over that link's netdev).
    pub local: IpAddr,
    /// Connector: the peer's listener (its link address and port). Acceptor: the peer's link address
    /// (the port is ignored); accepted streams must come from it unless it is unspecified.
    pub remote: SocketAddr,
    /// Link speed, Mb/s (0: unknown). Stripe weight and default stream count.
    pub speed_mbps: u64,
    /// Netdev MTU in bytes (0: unknown); below 9000 a warning is logged.
    pub mtu: u32,
    /// Netdev names etc. for logs (may be empty).
    pub label: String,
}

/// Binds a listener for one path on `local` (port chosen by the kernel), with the socket buffers of
/// `cfg` already applied (accepted sockets inherit them, which the TCP window scale needs).
pub fn listen(local: IpAddr, speed_mbps: u64, cfg: &TcpConfig) -> Result<TcpListener> {
    listen_at(SocketAddr::new(local, 0), speed_mbps, cfg)
}

/// Like [`listen`] on a chosen port (tools and tests that have no handshake to carry the port).
pub fn listen_at(addr: SocketAddr, speed_mbps: u64, cfg: &TcpConfig) -> Result<TcpListener> {
    cfg.check()?;
    let local = addr.ip();
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| Error::io(format!("TCP listener socket for {local}"), e))?;
    let streams = cfg.streams.unwrap_or_else(|| streams_for_speed(speed_mbps));
    apply_buffers(&sock, speed_mbps, streams, cfg)?;
    sock.set_reuse_address(true)
        .map_err(|e| Error::io("SO_REUSEADDR", e))?;
    sock.bind(&addr.into())
        .map_err(|e| Error::io(format!("binding a TCP listener to {addr}"), e))?;
    sock.listen(128)
        .map_err(|e| Error::io(format!("listening on {local}"), e))?;
    Ok(sock.into())
}

fn sysctl_max(path: &str) -> Option<usize> {
    let s = std::fs::read_to_string(path).ok()?;
    s.split_whitespace().last()?.parse().ok()
}

fn apply_buffers(sock: &Socket, speed_mbps: u64, streams: usize, cfg: &TcpConfig) -> Result<()> {
    let want = match cfg.buffers {
        BufferPolicy::Fixed(b) => b,
        BufferPolicy::Auto => {
            let want = socket_buffer_bytes(speed_mbps, cfg.rtt_us, streams);
            let auto_r = sysctl_max("/proc/sys/net/ipv4/tcp_rmem").unwrap_or(0);
            let auto_w = sysctl_max("/proc/sys/net/ipv4/tcp_wmem").unwrap_or(0);
            if auto_r >= want && auto_w >= want {
                return Ok(());
            }
            let cap = sysctl_max("/proc/sys/net/core/rmem_max").unwrap_or(0);
            if cap < want {
                tracing::warn!(
                    "NET/switchless: TCP socket buffers of {want} bytes wanted (bandwidth-delay product), \
                     but net.core.rmem_max is {cap} bytes; raise net.core.rmem_max/wmem_max"
                );
            }
            want
        }
    };
    sock.set_send_buffer_size(want)
        .map_err(|e| Error::io(format!("SO_SNDBUF {want} bytes"), e))?;
    sock.set_recv_buffer_size(want)
        .map_err(|e| Error::io(format!("SO_RCVBUF {want} bytes"), e))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------------------------------

enum RegMem {
    Raw(RawRegion),
    Ctrl(Arc<AtomicWords>),
}

struct Reg {
    mem: RegMem,
    /// `false` once deregistered; copies into or out of the region hold the read lock.
    alive: RwLock<bool>,
}

impl Reg {
    fn contains(&self, addr: u64, len: usize) -> bool {
        match &self.mem {
            RegMem::Raw(r) => r.contains(addr, len),
            RegMem::Ctrl(c) => c.contains(addr, len),
        }
    }
}

enum Payload {
    /// Copied when posted (small writes and control-memory sources).
    Bytes(Vec<u8>),
    /// Sent from registered memory by the stream's I/O worker.
    Raw {
        reg: Arc<Reg>,
        addr: u64,
        len: usize,
    },
}

struct Frame {
    hdr: [u8; HDR_LEN],
    payload: Payload,
    /// Index of the work request on its path (completion ordering).
    wr: u64,
}

impl Frame {
    fn len(&self) -> usize {
        match &self.payload {
            Payload::Bytes(b) => b.len(),
            Payload::Raw { len, .. } => *len,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    op: u8,
    flags: u8,
    len: u32,
    seq: u64,
    addr: u64,
    rkey: u32,
    imm: u32,
    wr_len: u32,
}

impl Header {
    fn encode(&self) -> [u8; HDR_LEN] {
        let mut h = [0u8; HDR_LEN];
        h[0..2].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        h[2] = self.op;
        h[3] = self.flags;
        h[4..8].copy_from_slice(&self.len.to_le_bytes());
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.addr.to_le_bytes());
        h[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        h[28..32].copy_from_slice(&self.imm.to_le_bytes());
        h[32..36].copy_from_slice(&self.wr_len.to_le_bytes());
        h
    }

    fn decode(h: &[u8; HDR_LEN]) -> std::result::Result<Header, String> {
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let magic = u16::from_le_bytes([h[0], h[1]]);
        if magic != FRAME_MAGIC {
            return Err(format!(
                "frame magic {magic:#06x}, expected {FRAME_MAGIC:#06x}"
            ));
        }
        let allowed = match h[2] {
            OP_WRITE => FLAG_IMM,
            OP_CLOSE => FLAG_DIRTY,
            op => {
                return Err(format!(
                    "frame operation {op}, accepted: {OP_WRITE} (write) or {OP_CLOSE} (close)"
                ));
            }
        };
        if h[3] & !allowed != 0 {
            return Err(format!(
                "frame flags {:#04x} for operation {}, accepted: 0 or {allowed}",
                h[3], h[2]
            ));
        }
        let hd = Header {
            op: h[2],
            flags: h[3],
            len: u32_at(4),
            seq: u64_at(8),
            addr: u64_at(16),
            rkey: u32_at(24),
            imm: u32_at(28),
            wr_len: u32_at(32),
        };
        if hd.op == OP_CLOSE && hd.len != 0 {
            return Err(format!("close frame with {} payload bytes", hd.len));
        }
        if hd.len as usize > MAX_FRAME_BYTES {
            return Err(format!(
                "frame of {} bytes; at most {MAX_FRAME_BYTES} bytes accepted",
                hd.len
            ));
        }
        Ok(hd)
    }
}

struct WrTrack {
    wr_id: u64,
    remaining: u32,
    signaled: bool,
}

#[derive(Default)]
struct TxState {
    next_seq: u64,
    /// Index of `wrs[0]`.
    first_wr: u64,
    wrs: VecDeque<WrTrack>,
    error: bool,
}

struct Effect {
    ctrl: Option<(Arc<Reg>, u64, Vec<u8>)>,
    imm: Option<(u32, u32)>,
}

#[derive(Default)]
struct RxState {
    next_apply: u64,
    pending: BTreeMap<u64, Effect>,
    buffered: usize,
    recvs: VecDeque<u64>,
    /// Streams that ended with an orderly close frame.
    goodbyes: usize,
    error: bool,
}

/// Frames waiting for a stream's worker.
#[derive(Default)]
struct TxQueue {
    frames: VecDeque<Frame>,
    /// The worker found the queue empty and waits to be woken for the next frame.
    idle: bool,
}

struct StreamShared {
    sock: TcpStream,
    q: Mutex<TxQueue>,
    queued: AtomicU64,
    sent_bytes: AtomicU64,
    /// A frame was started on this stream and not finished (no close frame may follow it).
    mid_frame: AtomicBool,
}

struct PathShared {
    label: String,
    streams: Vec<StreamShared>,
    tx: Mutex<TxState>,
    rx: Mutex<RxState>,
    cq: Mutex<VecDeque<Completion>>,
}

struct Shared {
    stop: AtomicBool,
    paths: Vec<PathShared>,
    regs: RwLock<HashMap<u32, Arc<Reg>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read_lock<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write_lock<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

impl PathShared {
    fn complete(&self, c: Completion) {
        lock(&self.cq).push_back(c);
    }

    fn close_streams(&self) {
        // The workers see the hang-up as readiness and end both directions.
        for s in &self.streams {
            let _ = s.sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Fails the sending side: the work request with index `culprit` (the oldest outstanding one when
    /// `None`) completes with `status`, every other outstanding one with `WR_FLUSH_ERR` (in posting
    /// order); queued frames are dropped and the path stays in error.
    fn fail_tx(&self, status: WcStatus, culprit: Option<u64>, why: &str) {
        let mut tx = lock(&self.tx);
        if !tx.error {
            tx.error = true;
            if status != WcStatus::WR_FLUSH_ERR && !tx.wrs.is_empty() {
                tracing::warn!(label = %self.label, "NET/switchless: TCP path {}: {why}", self.label);
            }
        }
        let culprit = culprit.unwrap_or(tx.first_wr);
        while let Some(w) = tx.wrs.pop_front() {
            let index = tx.first_wr;
            tx.first_wr += 1;
            let st = if index == culprit {
                status
            } else {
                WcStatus::WR_FLUSH_ERR
            };
            self.complete(Completion::without_data(w.wr_id, st, WcOpcode::RdmaWrite));
        }
        drop(tx);
        for s in &self.streams {
            lock(&s.q).frames.clear();
            s.queued.store(0, Ordering::Relaxed);
        }
    }

    /// Fails the receiving side: posted receives complete with `WR_FLUSH_ERR`, later ones too.
    fn fail_rx(&self, why: &str, warn: bool) {
        let mut rx = lock(&self.rx);
        if !rx.error && warn {
            tracing::warn!(label = %self.label, "NET/switchless: TCP path {}: {why}", self.label);
        }
        rx.error = true;
        rx.pending.clear();
        rx.buffered = 0;
        while let Some(wr_id) = rx.recvs.pop_front() {
            self.complete(Completion::without_data(
                wr_id,
                WcStatus::WR_FLUSH_ERR,
                WcOpcode::RecvRdmaWithImm,
            ));
        }
    }

    /// A frame of work request `wr` was handed to the kernel.
    fn frame_sent(&self, wr: u64) {
        let mut tx = lock(&self.tx);
        if tx.error || wr < tx.first_wr {
            return;
        }
        let i = (wr - tx.first_wr) as usize;
        if let Some(w) = tx.wrs.get_mut(i) {
            w.remaining = w.remaining.saturating_sub(1);
        }
        while tx.wrs.front().is_some_and(|w| w.remaining == 0) {
            if let Some(w) = tx.wrs.pop_front() {
                tx.first_wr += 1;
                if w.signaled {
                    self.complete(Completion::without_data(
                        w.wr_id,
                        WcStatus::SUCCESS,
                        WcOpcode::RdmaWrite,
                    ));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The fabric
// ---------------------------------------------------------------------------------------------------

/// One endpoint of a TCP connection: implements [`Fabric`]. Build it with [`TcpFabric::connect`] /
/// [`TcpFabric::accept`] (or [`loopback_pair`] in tests).
pub struct TcpFabric {
    sh: Arc<Shared>,
    paths: Vec<PathInfo>,
    /// This endpoint's streams in the I/O pool, per path.
    io: Vec<Vec<pool::StreamHandle>>,
    ctrl: Vec<Arc<AtomicWords>>,
    tokens: HashMap<u64, u32>,
    next_key: u32,
    next_token: u64,
    frame_bytes: usize,
    shut: bool,
}

impl std::fmt::Debug for TcpFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpFabric")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl TcpFabric {
    /// Builds the endpoint from connected streams (`streams[path]`), one entry of `specs` per path.
    fn from_streams(
        specs: &[TcpPathSpec],
        streams: Vec<Vec<TcpStream>>,
        cfg: &TcpConfig,
        role: &str,
        pre: Option<TcpFabric>,
    ) -> Result<TcpFabric> {
        let mut paths = Vec::with_capacity(specs.len());
        let mut shared = Vec::with_capacity(specs.len());
        for (i, (spec, socks)) in specs.iter().zip(streams).enumerate() {
            let peer = socks
                .first()
                .and_then(|s| s.peer_addr().ok())
                .map_or_else(|| spec.remote.to_string(), |a| a.ip().to_string());
            let label = format!(
                "tcp{i} {}{}{} -> {peer} ({} streams, MTU {} bytes)",
                spec.label,
                if spec.label.is_empty() { "" } else { " " },
                spec.local,
                socks.len(),
                spec.mtu
            );
            if role.is_empty() {
                // Not connected yet (`TcpFabric::unconnected`): no log line, no warning.
            } else if spec.mtu != 0 && spec.mtu < 9000 && !spec.local.is_loopback() {
                tracing::warn!(
                    "NET/switchless: TCP path {label}: MTU {} bytes is below 9000; \
                     jumbo frames (ip link set <dev> mtu 9000 on both ends) cut the per-packet CPU cost",
                    spec.mtu
                );
            }
            if !role.is_empty() {
                tracing::info!(
                    "NET/switchless: TCP path {label} ({role}): speed {} Mb/s, frame {} bytes",
                    spec.speed_mbps,
                    cfg.frame_bytes
                );
            }
            paths.push(PathInfo {
                label: label.clone(),
                speed_mbps: spec.speed_mbps,
                role: PathRole::Data,
            });
            shared.push(PathShared {
                label,
                streams: socks
                    .into_iter()
                    .map(|sock| StreamShared {
                        sock,
                        q: Mutex::new(TxQueue::default()),
                        queued: AtomicU64::new(0),
                        sent_bytes: AtomicU64::new(0),
                        mid_frame: AtomicBool::new(false),
                    })
                    .collect(),
                tx: Mutex::new(TxState::default()),
                rx: Mutex::new(RxState::default()),
                cq: Mutex::new(VecDeque::new()),
            });
        }
        let sh = Arc::new(Shared {
            stop: AtomicBool::new(false),
            paths: shared,
            regs: RwLock::new(HashMap::new()),
        });
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos())
            | 1;
        let mut fab = TcpFabric {
            sh: Arc::clone(&sh),
            paths,
            io: Vec::new(),
            ctrl: Vec::new(),
            tokens: HashMap::new(),
            next_key: seed,
            next_token: 0,
            frame_bytes: cfg.frame_bytes,
            shut: false,
        };
        // Before any receiver runs: the peer may write into adopted memory at once.
        if let Some(pre) = pre {
            fab.adopt(pre)?;
        }
        if let Err(e) = pool::add_streams(&sh, cfg.io_threads, &mut fab.io) {
            let _ = fab.shutdown();
            return Err(e);
        }
        Ok(fab)
    }

    /// An endpoint whose streams are not connected yet: memory can be registered, control memory
    /// allocated and receives posted (what the protocol does before the handshake); nothing can be
    /// sent. Give it to [`TcpConnector::adopting`] / [`TcpAcceptor::adopting`]: the endpoint their
    /// `poll` returns takes all of it over (same addresses and keys) before its streams join the I/O pool.
    pub fn unconnected(specs: &[TcpPathSpec], cfg: &TcpConfig) -> Result<TcpFabric> {
        check_specs(specs)?;
        let none = specs.iter().map(|_| Vec::new()).collect();
        TcpFabric::from_streams(specs, none, cfg, "", None)
    }

    /// Takes over what `pre` (from [`TcpFabric::unconnected`], same paths) holds: registrations
    /// (same keys), control memory (same addresses), posted receives and completions. `self` must be
    /// freshly connected (no registration of its own, no stream in the I/O pool yet).
    fn adopt(&mut self, mut pre: TcpFabric) -> Result<()> {
        if pre.paths.len() != self.paths.len() {
            return Err(Error::Internal(format!(
                "adopting a TCP endpoint of {} paths into one of {}",
                pre.paths.len(),
                self.paths.len()
            )));
        }
        if pre.io.iter().any(|v| !v.is_empty()) || !self.tokens.is_empty() {
            return Err(Error::Internal(
                "TCP adopt: the old endpoint must be unconnected and the new one unused".into(),
            ));
        }
        {
            let mut from = write_lock(&pre.sh.regs);
            let mut to = write_lock(&self.sh.regs);
            to.extend(from.drain());
        }
        self.ctrl.append(&mut pre.ctrl);
        self.tokens = std::mem::take(&mut pre.tokens);
        self.next_key = pre.next_key;
        self.next_token = pre.next_token;
        for (old, new) in pre.sh.paths.iter().zip(&self.sh.paths) {
            let recvs = std::mem::take(&mut lock(&old.rx).recvs);
            lock(&new.rx).recvs.extend(recvs);
            let cqes = std::mem::take(&mut *lock(&old.cq));
            lock(&new.cq).extend(cqes);
        }
        Ok(())
    }

    /// Connects every path and waits for the acceptor: [`TcpConnector::start`] then
    /// [`TcpConnector::poll`] until done (at most [`TcpConfig::connect_timeout`]).
    pub fn connect(specs: &[TcpPathSpec], nonce: u64, cfg: &TcpConfig) -> Result<TcpFabric> {
        let mut c = TcpConnector::start(specs, nonce, cfg)?;
        loop {
            if let Some(f) = c.poll()? {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Accepts every path's streams: [`TcpAcceptor::new`] then [`TcpAcceptor::poll`] until done (at
    /// most [`TcpConfig::connect_timeout`]).
    pub fn accept(
        listeners: &[TcpListener],
        specs: &[TcpPathSpec],
        nonce: u64,
        cfg: &TcpConfig,
    ) -> Result<TcpFabric> {
        let mut a = TcpAcceptor::new(listeners, specs, nonce, cfg)?;
        loop {
            if let Some(f) = a.poll()? {
                return Ok(f);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Number of streams of data path `path` (0 if there is no such path).
    pub fn streams(&self, path: usize) -> usize {
        self.sh.paths.get(path).map_or(0, |p| p.streams.len())
    }

    /// Payload bytes handed to the kernel so far on each stream of `path`.
    pub fn stream_bytes(&self, path: usize) -> Vec<u64> {
        self.sh.paths.get(path).map_or_else(Vec::new, |p| {
            p.streams
                .iter()
                .map(|s| s.sent_bytes.load(Ordering::Relaxed))
                .collect()
        })
    }

    /// Number of distinct pool threads serving this endpoint's streams (0 after
    /// [`Fabric::shutdown`]). The threads are shared with other endpoints; see [`io_threads`].
    pub fn helper_threads(&self) -> usize {
        let mut w: Vec<u64> = self.io.iter().flatten().map(|h| h.worker()).collect();
        w.sort_unstable();
        w.dedup();
        w.len()
    }

    /// The pool thread (a serial number, unique in the process) serving each stream of `path`.
    pub fn stream_workers(&self, path: usize) -> Vec<u64> {
        self.io
            .get(path)
            .map_or_else(Vec::new, |v| v.iter().map(|h| h.worker()).collect())
    }

    fn check_path(&self, path: usize) -> Result<&PathShared> {
        self.sh.paths.get(path).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "TCP path {path}; this endpoint has paths 0..{}",
                self.paths.len()
            ))
        })
    }

    fn new_key(&mut self) -> u32 {
        loop {
            self.next_key = self
                .next_key
                .wrapping_mul(0x9e37_79b9)
                .wrapping_add(0x7f4a_7c15);
            let k = self.next_key;
            if k != 0 && !read_lock(&self.sh.regs).contains_key(&k) {
                return k;
            }
        }
    }

    fn add_reg(&mut self, mem: RegMem) -> Registration {
        let key = self.new_key();
        write_lock(&self.sh.regs).insert(
            key,
            Arc::new(Reg {
                mem,
                alive: RwLock::new(true),
            }),
        );
        self.next_token += 1;
        self.tokens.insert(self.next_token, key);
        Registration {
            keys: vec![
                PathKeys {
                    lkey: key,
                    rkey: key
                };
                self.paths.len()
            ],
            token: self.next_token,
        }
    }

    fn ctrl_block(&self, addr: u64, len: usize) -> Result<(&AtomicWords, usize)> {
        if addr % 8 != 0 {
            return Err(Error::Internal(format!("unaligned control word {addr:#x}")));
        }
        self.ctrl
            .iter()
            .find(|b| b.contains(addr, len))
            .map(|b| (&**b, ((addr - b.addr()) / 8) as usize))
            .ok_or_else(|| {
                Error::Internal(format!(
                    "control memory {addr:#x}+{len} bytes is not allocated by this TCP fabric"
                ))
            })
    }
}

/// The connecting side of a TCP connection set-up, driven without blocking (NCCL calls `connect`
/// again and again): [`TcpConnector::start`] opens every stream (the TCP three-way handshake is done
/// by the peer's kernel, so it needs no help from the peer's application; an unreachable peer fails
/// here at once) and sends each stream's hello; [`TcpConnector::poll`] collects the acceptor's
/// acknowledgements and returns the fabric when all have arrived.
pub struct TcpConnector {
    specs: Vec<TcpPathSpec>,
    cfg: TcpConfig,
    socks: Vec<Vec<(TcpStream, [u8; 8], usize)>>,
    deadline: Instant,
    pre: Option<TcpFabric>,
}

impl TcpConnector {
    /// Connects `streams` TCP connections per path (from [`TcpConfig::streams`] or
    /// [`streams_for_speed`]), each bound to `spec.local` and connected to `spec.remote`, and
    /// announces each with `nonce` (the value the acceptor expects, from the handshake), the path
    /// index and the stream count. Blocks only for the TCP handshakes (bounded by
    /// [`TcpConfig::connect_timeout`]).
    pub fn start(specs: &[TcpPathSpec], nonce: u64, cfg: &TcpConfig) -> Result<TcpConnector> {
        cfg.check()?;
        check_specs(specs)?;
        let deadline = Instant::now() + cfg.connect_timeout;
        let mut all = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let n = cfg
                .streams
                .unwrap_or_else(|| streams_for_speed(spec.speed_mbps));
            let mut socks = Vec::with_capacity(n);
            for s in 0..n {
                let sock = connect_stream(spec, i, s, n, specs.len(), nonce, cfg, deadline)?;
                socks.push((sock, [0u8; 8], 0));
            }
            all.push(socks);
        }
        Ok(TcpConnector {
            specs: specs.to_vec(),
            cfg: cfg.clone(),
            socks: all,
            deadline,
            pre: None,
        })
    }

    /// The endpoint [`TcpConnector::poll`] returns takes over `pre` (see [`TcpFabric::unconnected`]).
    pub fn adopting(mut self, pre: TcpFabric) -> TcpConnector {
        self.pre = Some(pre);
        self
    }

    /// Reads the acknowledgements that have arrived; `Ok(Some(fabric))` once every stream is
    /// acknowledged, `Ok(None)` to call again, an error when the acceptor closed a stream (wrong
    /// nonce or path) or the deadline passed.
    pub fn poll(&mut self) -> Result<Option<TcpFabric>> {
        let mut complete = true;
        for (i, socks) in self.socks.iter_mut().enumerate() {
            for (s, (sock, ack, got)) in socks.iter_mut().enumerate() {
                while *got < ack.len() {
                    match rawmem::recv_slice(sock, &mut ack[*got..]) {
                        Ok(0) => {
                            return Err(Error::Remote(format!(
                                "TCP path {i} stream {s} to {}: the acceptor closed the stream before \
                                 acknowledging it (it did not accept our nonce, path index or count; see its log)",
                                self.specs[i].remote
                            )));
                        }
                        Ok(n) => *got += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            return Err(Error::Remote(format!(
                                "TCP path {i} stream {s} to {}: the acceptor did not acknowledge the stream: {e}",
                                self.specs[i].remote
                            )));
                        }
                    }
                }
                if *got < ack.len() {
                    complete = false;
                } else if ack[0..4] != ACK_MAGIC {
                    return Err(Error::Remote(format!(
                        "TCP path {i} stream {s}: acknowledgement {:02x?}, expected \"SWTA\"",
                        &ack[0..4]
                    )));
                }
            }
        }
        if !complete {
            if Instant::now() >= self.deadline {
                return Err(Error::Timeout(format!(
                    "TCP connect: the acceptor did not acknowledge every stream within {} ms",
                    self.cfg.connect_timeout.as_millis()
                )));
            }
            return Ok(None);
        }
        let socks = std::mem::take(&mut self.socks)
            .into_iter()
            .map(|v| v.into_iter().map(|(s, _, _)| s).collect())
            .collect();
        TcpFabric::from_streams(&self.specs, socks, &self.cfg, "connector", self.pre.take())
            .map(Some)
    }
}

/// The accepting side of a TCP connection set-up, driven without blocking (NCCL calls `accept`
/// again and again): every [`TcpAcceptor::poll`] accepts the streams that have arrived on the
/// listeners, checks their hellos and acknowledges them, and returns the fabric once every path has
/// all its streams.
pub struct TcpAcceptor {
    listeners: Vec<TcpListener>,
    specs: Vec<TcpPathSpec>,
    cfg: TcpConfig,
    nonce: u64,
    slots: Vec<Vec<Option<TcpStream>>>,
    /// Accepted connections whose hello is still arriving: (socket, peer, path, bytes, count, since).
    pending: Vec<PendingHello>,
    deadline: Instant,
    pre: Option<TcpFabric>,
}

struct PendingHello {
    sock: TcpStream,
    from: SocketAddr,
    path: usize,
    buf: [u8; HELLO_LEN],
    got: usize,
    since: Instant,
}

/// Connections whose hello has not fully arrived that an acceptor keeps at once; more are closed.
pub const MAX_PENDING_STREAMS: usize = 64;
/// Time a connection gets to deliver its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

impl TcpAcceptor {
    /// Takes one listener per path (from [`listen`]; `listeners[i]` serves path `i`). Streams must
    /// carry `nonce`, the right path index and count and, unless `specs[path].remote` is
    /// unspecified, come from the path's peer address; anything else is closed and logged, not fatal.
    pub fn new(
        listeners: &[TcpListener],
        specs: &[TcpPathSpec],
        nonce: u64,
        cfg: &TcpConfig,
    ) -> Result<TcpAcceptor> {
        cfg.check()?;
        check_specs(specs)?;
        if listeners.len() != specs.len() {
            return Err(Error::InvalidArgument(format!(
                "{} listeners for {} TCP paths; one listener per path is required",
                listeners.len(),
                specs.len()
            )));
        }
        let listeners = listeners
            .iter()
            .map(|l| {
                let l = l
                    .try_clone()
                    .map_err(|e| Error::io("duplicating a TCP listener", e))?;
                l.set_nonblocking(true)
                    .map_err(|e| Error::io("making a TCP listener non-blocking", e))?;
                Ok(l)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(TcpAcceptor {
            listeners,
            specs: specs.to_vec(),
            cfg: cfg.clone(),
            nonce,
            slots: (0..specs.len()).map(|_| Vec::new()).collect(),
            pending: Vec::new(),
            deadline: Instant::now() + cfg.connect_timeout,
            pre: None,
        })
    }

    /// The endpoint [`TcpAcceptor::poll`] returns takes over `pre` (see [`TcpFabric::unconnected`]).
    pub fn adopting(mut self, pre: TcpFabric) -> TcpAcceptor {
        self.pre = Some(pre);
        self
    }

    /// Accepts what has arrived; `Ok(Some(fabric))` when every path is complete, `Ok(None)` to call
    /// again, [`Error::Timeout`] (naming the missing streams) after [`TcpConfig::connect_timeout`].
    pub fn poll(&mut self) -> Result<Option<TcpFabric>> {
        // 1. New connections: check the peer address, then wait for the hello without blocking.
        for (i, l) in self.listeners.iter().enumerate() {
            loop {
                let (sock, from) = match l.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Error::io(format!("accepting on TCP path {i}"), e)),
                };
                let want = self.specs[i].remote.ip();
                if !want.is_unspecified() && from.ip() != want {
                    tracing::warn!(
                        "NET/switchless: TCP path {i}: connection from {from} rejected: the path's peer is {want}"
                    );
                    continue;
                }
                if self.pending.len() >= MAX_PENDING_STREAMS {
                    tracing::warn!(
                        "NET/switchless: TCP path {i}: connection from {from} rejected: {MAX_PENDING_STREAMS} connections already wait for their hello"
                    );
                    continue;
                }
                self.pending.push(PendingHello {
                    sock,
                    from,
                    path: i,
                    buf: [0; HELLO_LEN],
                    got: 0,
                    since: Instant::now(),
                });
            }
        }
        // 2. Hellos that have arrived: check, acknowledge, file.
        let mut k = 0;
        while k < self.pending.len() {
            let ph = &mut self.pending[k];
            let mut verdict: Option<std::result::Result<(), String>> = None;
            while ph.got < HELLO_LEN {
                match rawmem::recv_slice(&ph.sock, &mut ph.buf[ph.got..]) {
                    Ok(0) => {
                        verdict = Some(Err("closed before its hello was complete".into()));
                        break;
                    }
                    Ok(n) => ph.got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        verdict = Some(Err(format!("reading the stream hello: {e}")));
                        break;
                    }
                }
            }
            if verdict.is_none() {
                if ph.got == HELLO_LEN {
                    verdict = Some(Ok(()));
                } else if ph.since.elapsed() > HELLO_TIMEOUT {
                    verdict = Some(Err(format!(
                        "no complete hello within {} s",
                        HELLO_TIMEOUT.as_secs()
                    )));
                }
            }
            let Some(verdict) = verdict else {
                k += 1;
                continue;
            };
            let ph = self.pending.swap_remove(k);
            let (i, from) = (ph.path, ph.from);
            let checked =
                verdict.and_then(|()| check_hello(&ph.buf, i, self.specs.len(), self.nonce));
            let (s, n) = match checked {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(
                        "NET/switchless: TCP path {i}: connection from {from} rejected: {e}"
                    );
                    continue;
                }
            };
            let slot = &mut self.slots[i];
            if slot.is_empty() {
                slot.resize_with(n, || None);
            }
            if slot.len() != n || slot[s].is_some() {
                tracing::warn!(
                    "NET/switchless: TCP path {i}: stream {s} of {n} from {from} conflicts with streams already accepted; closed"
                );
                continue;
            }
            let mut sock = ph.sock;
            let mut ack = [0u8; 8];
            ack[0..4].copy_from_slice(&ACK_MAGIC);
            // 8 bytes into an empty socket buffer: never blocks.
            let sent = sock.set_nodelay(true).and_then(|()| sock.write_all(&ack));
            if let Err(e) = sent {
                tracing::warn!(
                    "NET/switchless: TCP path {i}: acknowledging stream {s} to {from}: {e}"
                );
                continue;
            }
            slot[s] = Some(sock);
        }
        let complete = self
            .slots
            .iter()
            .all(|s| !s.is_empty() && s.iter().all(Option::is_some));
        if !complete {
            if Instant::now() >= self.deadline {
                let missing: Vec<String> = self
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let have = s.iter().filter(|x| x.is_some()).count();
                        format!("path {i}: {have} of {} streams", s.len().max(1))
                    })
                    .collect();
                return Err(Error::Timeout(format!(
                    "accepting TCP streams for {} ms: {}",
                    self.cfg.connect_timeout.as_millis(),
                    missing.join(", ")
                )));
            }
            return Ok(None);
        }
        let streams = std::mem::take(&mut self.slots)
            .into_iter()
            .map(|s| s.into_iter().flatten().collect())
            .collect();
        TcpFabric::from_streams(&self.specs, streams, &self.cfg, "acceptor", self.pre.take())
            .map(Some)
    }
}

fn check_specs(specs: &[TcpPathSpec]) -> Result<()> {
    if specs.is_empty() || specs.len() > crate::transport::stripe::MAX_PATHS {
        return Err(Error::InvalidArgument(format!(
            "{} TCP paths; accepted: 1..={}",
            specs.len(),
            crate::transport::stripe::MAX_PATHS
        )));
    }
    Ok(())
}

fn hello(
    nonce: u64,
    npaths: usize,
    path: usize,
    nstreams: usize,
    stream: usize,
) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[0..4].copy_from_slice(&HELLO_MAGIC);
    h[4] = HELLO_VERSION;
    h[5] = npaths as u8;
    h[6] = path as u8;
    h[7] = nstreams as u8;
    h[8] = stream as u8;
    h[16..24].copy_from_slice(&nonce.to_le_bytes());
    h
}

#[allow(clippy::too_many_arguments)]
fn connect_stream(
    spec: &TcpPathSpec,
    path: usize,
    stream: usize,
    nstreams: usize,
    npaths: usize,
    nonce: u64,
    cfg: &TcpConfig,
    deadline: Instant,
) -> Result<TcpStream> {
    let what = format!(
        "TCP path {path} stream {stream}: connecting from {} to {}",
        spec.local, spec.remote
    );
    let sock = Socket::new(
        Domain::for_address(spec.remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| Error::io(&what, e))?;
    sock.set_tcp_nodelay(true)
        .map_err(|e| Error::io(format!("{what}: TCP_NODELAY"), e))?;
    apply_buffers(&sock, spec.speed_mbps, nstreams, cfg)?;
    sock.bind(&SocketAddr::new(spec.local, 0).into())
        .map_err(|e| {
            Error::System(format!(
                "{what}: binding to the local link address failed: {e}; the address must be configured on this host"
            ))
        })?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::Timeout(format!("{what}: connect deadline passed")));
    }
    sock.connect_timeout(&spec.remote.into(), left).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) => {
                "; the peer is not on the subnet of the local link (no route): on a switchless mesh \
                 only the cable's far end is reachable from a link address"
            }
            Some(libc::ECONNREFUSED) => "; nothing listens there (the peer's listener is closed)",
            _ => "",
        };
        if e.kind() == io::ErrorKind::TimedOut {
            Error::Timeout(format!("{what}: {e}"))
        } else {
            Error::System(format!("{what} failed: {e}{hint}"))
        }
    })?;
    let mut tcp: TcpStream = sock.into();
    tcp.write_all(&hello(nonce, npaths, path, nstreams, stream))
        .map_err(|e| Error::io(format!("{what}: sending the stream hello"), e))?;
    Ok(tcp)
}

/// Checks a complete stream hello; returns (stream, stream count).
fn check_hello(
    h: &[u8; HELLO_LEN],
    path: usize,
    npaths_want: usize,
    nonce: u64,
) -> std::result::Result<(usize, usize), String> {
    if h[0..4] != HELLO_MAGIC {
        return Err(format!(
            "hello magic {:02x?}, expected \"SWTS\": not a switchless TCP stream",
            &h[0..4]
        ));
    }
    if h[4] != HELLO_VERSION {
        return Err(format!(
            "hello version {}, this plugin speaks {HELLO_VERSION}",
            h[4]
        ));
    }
    let mut nb = [0u8; 8];
    nb.copy_from_slice(&h[16..24]);
    if u64::from_le_bytes(nb) != nonce {
        return Err("hello nonce does not match this connection".into());
    }
    let (npaths, p, n, s) = (h[5] as usize, h[6] as usize, h[7] as usize, h[8] as usize);
    if npaths != npaths_want || p != path {
        return Err(format!(
            "hello names path {p} of {npaths}; this listener serves path {path} of {npaths_want}"
        ));
    }
    if !(1..=MAX_STREAMS).contains(&n) || s >= n {
        return Err(format!(
            "hello names stream {s} of {n}; accepted: 1..={MAX_STREAMS} streams"
        ));
    }
    Ok((s, n))
}

/// Two connected endpoints on 127.0.0.1 with one path per entry of `speeds_mbps` (tests, benchmarks).
pub fn loopback_pair(speeds_mbps: &[u64], cfg: &TcpConfig) -> Result<(TcpFabric, TcpFabric)> {
    let lo = IpAddr::from([127, 0, 0, 1]);
    let listeners = speeds_mbps
        .iter()
        .map(|&s| listen(lo, s, cfg))
        .collect::<Result<Vec<_>>>()?;
    let mut conn_specs = Vec::new();
    let mut acc_specs = Vec::new();
    for (l, &speed) in listeners.iter().zip(speeds_mbps) {
        let port = l
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?
            .port();
        conn_specs.push(TcpPathSpec {
            local: lo,
            remote: SocketAddr::new(lo, port),
            speed_mbps: speed,
            mtu: 0,
            label: String::new(),
        });
        acc_specs.push(TcpPathSpec {
            local: lo,
            remote: SocketAddr::new(lo, 0),
            speed_mbps: speed,
            mtu: 0,
            label: String::new(),
        });
    }
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    let c = cfg.clone();
    let t = std::thread::spawn(move || TcpFabric::connect(&conn_specs, nonce, &c));
    let acc = TcpFabric::accept(&listeners, &acc_specs, nonce, cfg);
    let con = t
        .join()
        .map_err(|_| Error::Internal("TCP connect thread panicked".into()))?;
    Ok((con?, acc?))
}

impl Fabric for TcpFabric {
    fn paths(&self) -> &[PathInfo] {
        &self.paths
    }

    fn register(&mut self, addr: u64, len: usize, kind: MemKind) -> Result<Registration> {
        if kind == MemKind::Cuda {
            return Err(Error::InvalidArgument(format!(
                "GPU memory at {addr:#x} ({len} bytes) on a TCP path; TCP paths accept host memory only \
                 (NCCL_PTR_HOST: NCCL stages GPU buffers through host memory)"
            )));
        }
        let region = RawRegion::new(addr, len)?;
        Ok(self.add_reg(RegMem::Raw(region)))
    }

    fn deregister(&mut self, reg: &Registration) -> Result<()> {
        let Some(key) = self.tokens.remove(&reg.token) else {
            return Err(Error::InvalidArgument(format!(
                "deregistration of unknown TCP fabric registration {}",
                reg.token
            )));
        };
        let r = write_lock(&self.sh.regs).remove(&key);
        if let Some(r) = r {
            // Waits for a copy in progress (one chunk of at most 1 MiB); after this no I/O worker
            // touches the memory.
            *write_lock(&r.alive) = false;
        }
        Ok(())
    }

    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem> {
        let block = Arc::new(AtomicWords::new(words.max(1)));
        let addr = block.addr();
        self.ctrl.push(Arc::clone(&block));
        let reg = self.add_reg(RegMem::Ctrl(block));
        Ok(CtrlMem { addr, words, reg })
    }

    fn free_ctrl(&mut self, mem: &CtrlMem) -> Result<()> {
        self.deregister(&mem.reg)?;
        self.ctrl.retain(|b| b.addr() != mem.addr);
        Ok(())
    }

    fn ctrl_load(&self, addr: u64, order: Ordering) -> Result<u64> {
        let (b, w) = self.ctrl_block(addr, 8)?;
        Ok(b.words()[w].load(order))
    }

    fn ctrl_store(&self, addr: u64, value: u64, order: Ordering) -> Result<()> {
        let (b, w) = self.ctrl_block(addr, 8)?;
        b.words()[w].store(value, order);
        Ok(())
    }

    fn ctrl_read(&self, addr: u64, out: &mut [u64]) -> Result<()> {
        let (b, w) = self.ctrl_block(addr, 8 * out.len())?;
        for (o, src) in out.iter_mut().zip(&b.words()[w..]) {
            *o = src.load(Ordering::Relaxed);
        }
        Ok(())
    }

    fn ctrl_write(&self, addr: u64, words: &[u64]) -> Result<()> {
        let (b, w) = self.ctrl_block(addr, 8 * words.len())?;
        for (dst, &v) in b.words()[w..].iter().zip(words) {
            dst.store(v, Ordering::Relaxed);
        }
        Ok(())
    }

    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        let frame_bytes = self.frame_bytes;
        let p = self.check_path(path)?;
        if p.streams.is_empty() {
            return Err(Error::InvalidUsage(format!(
                "RDMA write on TCP path {path} before its streams are connected; accepted: writes on \
                 an endpoint returned by TcpConnector/TcpAcceptor::poll"
            )));
        }
        let flush = |status: WcStatus| {
            p.complete(Completion::without_data(
                wr.wr_id,
                status,
                WcOpcode::RdmaWrite,
            ))
        };
        if self.sh.stop.load(Ordering::Relaxed) || lock(&p.tx).error {
            flush(WcStatus::WR_FLUSH_ERR);
            return Ok(());
        }
        let len = wr.local.len as usize;
        let reg = read_lock(&self.sh.regs).get(&wr.local.lkey).cloned();
        let Some(reg) = reg.filter(|r| r.contains(wr.local.addr, len)) else {
            // Like a NIC: a bad local key or range fails the request and puts the path in error.
            let mut tx = lock(&p.tx);
            let index = tx.first_wr + tx.wrs.len() as u64;
            tx.wrs.push_back(WrTrack {
                wr_id: wr.wr_id,
                remaining: 1,
                signaled: true,
            });
            drop(tx);
            p.fail_tx(
                WcStatus::LOC_PROT_ERR,
                Some(index),
                &format!(
                    "write source {:#x}+{len} bytes is not covered by lkey {:#x} (local protection error)",
                    wr.local.addr, wr.local.lkey
                ),
            );
            return Ok(());
        };
        // Small writes and control-memory sources are copied now; large ones are sent from memory.
        let copied = match &reg.mem {
            RegMem::Ctrl(b) => {
                let mut v = vec![0u8; len];
                b.load_bytes(b.offset_of(wr.local.addr), &mut v)?;
                Some(v)
            }
            RegMem::Raw(r) if len <= COPY_AT_POST_BYTES => {
                let mut v = vec![0u8; len];
                r.read(wr.local.addr, &mut v)
                    .map_err(|e| Error::Internal(format!("copying a small write: {e}")))?;
                Some(v)
            }
            RegMem::Raw(_) => None,
        };
        let nstreams = p.streams.len();
        let frame = if copied.is_some() || len == 0 {
            len.max(1)
        } else {
            (len.div_ceil(nstreams).div_ceil(4096) * 4096).clamp(MIN_FRAME_BYTES, frame_bytes)
        };
        let nframes = len.div_ceil(frame).max(1);
        // Streams whose worker must be woken (its sender was idle), after the locks are released.
        let mut kick = [false; MAX_STREAMS];
        let mut tx = lock(&p.tx);
        let wr_index = tx.first_wr + tx.wrs.len() as u64;
        tx.wrs.push_back(WrTrack {
            wr_id: wr.wr_id,
            remaining: nframes as u32,
            signaled: wr.signaled,
        });
        let mut copied = copied;
        for k in 0..nframes {
            let off = k * frame;
            let flen = (len - off).min(frame);
            let last = k + 1 == nframes;
            let seq = tx.next_seq;
            tx.next_seq += 1;
            let hdr = Header {
                op: OP_WRITE,
                flags: if last && wr.imm.is_some() {
                    FLAG_IMM
                } else {
                    0
                },
                len: flen as u32,
                seq,
                addr: wr.remote.addr + off as u64,
                rkey: wr.remote.rkey,
                imm: wr.imm.unwrap_or(0),
                wr_len: wr.local.len,
            }
            .encode();
            let payload = match copied.take() {
                Some(v) => Payload::Bytes(v),
                None => Payload::Raw {
                    reg: Arc::clone(&reg),
                    addr: wr.local.addr + off as u64,
                    len: flen,
                },
            };
            // Least queued bytes first.
            let s = p
                .streams
                .iter()
                .enumerate()
                .min_by_key(|(i, st)| (st.queued.load(Ordering::Relaxed), (*i + k) % nstreams))
                .map_or(0, |(i, _)| i);
            let st = &p.streams[s];
            st.queued.fetch_add(flen as u64, Ordering::Relaxed);
            let mut q = lock(&st.q);
            q.frames.push_back(Frame {
                hdr,
                payload,
                wr: wr_index,
            });
            if q.idle {
                q.idle = false;
                kick[s] = true;
            }
        }
        drop(tx);
        if let Some(handles) = self.io.get(path) {
            for (h, _) in handles.iter().zip(kick).filter(|(_, k)| *k) {
                h.kick();
            }
        }
        Ok(())
    }

    fn post_read(&mut self, path: usize, _wr: &ReadWr) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "RDMA read on TCP path {path}: a TCP fabric has no loopback paths and carries host memory \
             only, so nothing needs a flush read"
        )))
    }

    fn post_recv(&mut self, path: usize, wr_id: u64) -> Result<()> {
        let p = self.check_path(path)?;
        let mut rx = lock(&p.rx);
        if rx.error || self.sh.stop.load(Ordering::Relaxed) {
            drop(rx);
            p.complete(Completion::without_data(
                wr_id,
                WcStatus::WR_FLUSH_ERR,
                WcOpcode::RecvRdmaWithImm,
            ));
        } else {
            rx.recvs.push_back(wr_id);
        }
        Ok(())
    }

    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let p = self.check_path(path)?;
        let mut cq = lock(&p.cq);
        let n = max.min(cq.len());
        out.extend(cq.drain(..n));
        Ok(n)
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.shut {
            return Ok(());
        }
        self.shut = true;
        self.sh.stop.store(true, Ordering::SeqCst);
        // 1. Take the streams out of their workers; after this no pool thread touches them (a
        //    frame a worker was in the middle of stays unfinished: no close frame follows it).
        let panicked =
            pool::remove_streams(std::mem::take(&mut self.io).into_iter().flatten().collect());
        // 2. Say goodbye on every stream that is at a frame boundary: orderly when nothing was
        //    dropped, "dirty" when work requests were still outstanding (the peer then fails its
        //    receives instead of waiting for data that will never come).
        let until = Instant::now() + GOODBYE_WAIT;
        for p in &self.sh.paths {
            let dirty = {
                let tx = lock(&p.tx);
                tx.error || !tx.wrs.is_empty()
            };
            let hdr = Header {
                op: OP_CLOSE,
                flags: if dirty { FLAG_DIRTY } else { 0 },
                len: 0,
                seq: 0,
                addr: 0,
                rkey: 0,
                imm: 0,
                wr_len: 0,
            }
            .encode();
            for st in &p.streams {
                if st.mid_frame.load(Ordering::Relaxed) {
                    continue;
                }
                let mut off = 0;
                while off < hdr.len() && Instant::now() < until {
                    match rawmem::send_slice(&st.sock, &hdr[off..], false) {
                        Ok(n) => off += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            let _ = rawmem::wait_fd(&st.sock, Ready::Write, 10);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            }
        }
        // 3. Close the streams.
        for p in &self.sh.paths {
            p.close_streams();
        }
        for p in &self.sh.paths {
            p.fail_tx(WcStatus::WR_FLUSH_ERR, None, "shut down");
            p.fail_rx("shut down", false);
        }
        // Closing a socket with unread received bytes makes the kernel send a reset, which also
        // discards what we handed it but it has not sent yet (the tail of a completed send). Read
        // and drop what has arrived (bounded), so the close is an orderly FIN after our data.
        let mut scratch = vec![0u8; 64 * 1024];
        for p in &self.sh.paths {
            for st in &p.streams {
                for _ in 0..1024 {
                    match rawmem::recv_slice(&st.sock, &mut scratch) {
                        Ok(n) if n > 0 => {}
                        _ => break,
                    }
                }
            }
        }
        if panicked > 0 {
            return Err(Error::Internal(format!(
                "{panicked} TCP I/O pool threads panicked"
            )));
        }
        Ok(())
    }
}

impl Drop for TcpFabric {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_count_follows_link_speed() {
        assert_eq!(streams_for_speed(1_000), 2);
        assert_eq!(streams_for_speed(10_000), 4);
        assert_eq!(streams_for_speed(25_000), 10);
        assert_eq!(streams_for_speed(100_000), 16);
        assert_eq!(streams_for_speed(0), 4);
    }

    #[test]
    fn per_connection_totals_become_per_path_counts() {
        assert_eq!(per_path_streams(8, 2), 4);
        assert_eq!(per_path_streams(5, 2), 3);
        assert_eq!(per_path_streams(1, 4), 1);
        assert_eq!(per_path_streams(64, 1), 16);
        assert_eq!(per_path_streams(3, 0), 3);
    }

    #[test]
    fn buffer_follows_bandwidth_delay_product() {
        // 10 Gb/s, 100 µs, 4 streams: BDP 125 000 bytes, per stream 31 250, doubled 62 500 → floor.
        assert_eq!(socket_buffer_bytes(10_000, 100, 4), 256 * 1024);
        // 100 Gb/s, 1 ms, 2 streams: 100e9/8 × 1e-3 / 2 × 2 = 12.5 MB → rounded to 4 KiB.
        assert_eq!(
            socket_buffer_bytes(100_000, 1000, 2),
            12_500_000usize.div_ceil(4096) * 4096
        );
    }

    #[test]
    fn headers_round_trip_and_garbage_is_rejected() {
        let h = Header {
            op: OP_WRITE,
            flags: FLAG_IMM,
            len: 1234,
            seq: 99,
            addr: 0xdead_beef_0000,
            rkey: 7,
            imm: 0x1234_5678,
            wr_len: 4321,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(Header::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = h.encode();
        bad[2] = 9;
        assert!(Header::decode(&bad).unwrap_err().contains("operation"));
        let mut bad = h.encode();
        bad[3] = 6;
        assert!(Header::decode(&bad).unwrap_err().contains("flags"));
        let close = Header {
            op: OP_CLOSE,
            flags: FLAG_DIRTY,
            len: 0,
            seq: 0,
            addr: 0,
            rkey: 0,
            imm: 0,
            wr_len: 0,
        };
        assert_eq!(Header::decode(&close.encode()).unwrap(), close);
        let mut bad = close.encode();
        bad[3] = FLAG_IMM;
        assert!(Header::decode(&bad).unwrap_err().contains("flags"));
        let mut bad = close.encode();
        bad[4] = 1;
        assert!(Header::decode(&bad).unwrap_err().contains("close frame"));
        let mut bad = h.encode();
        bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Header::decode(&bad).unwrap_err().contains("at most"));
    }

    #[test]
    fn config_is_checked() {
        let mut c = TcpConfig {
            streams: Some(0),
            ..TcpConfig::default()
        };
        assert!(c.check().unwrap_err().to_string().contains("1..=16"));
        c.streams = Some(17);
        assert!(c.check().is_err());
        c.streams = Some(16);
        assert!(c.check().is_ok());
        c.frame_bytes = 1;
        assert!(c.check().unwrap_err().to_string().contains("frame size"));
        let mut c = TcpConfig {
            io_threads: Some(0),
            ..TcpConfig::default()
        };
        assert!(c.check().unwrap_err().to_string().contains("1..=64"));
        c.io_threads = Some(65);
        assert!(c.check().is_err());
        c.io_threads = Some(64);
        assert!(c.check().is_ok());
    }

    #[test]
    fn pool_size_follows_the_configuration() {
        assert_eq!(MAX_IO_THREADS, usize::from(crate::config::MAX_TCP_THREADS));
        let n = default_io_threads();
        assert!((1..=DEFAULT_MAX_IO_THREADS).contains(&n));
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(n, cpus.min(DEFAULT_MAX_IO_THREADS));
    }

    #[test]
    fn an_unconnected_endpoint_refuses_writes_and_holds_no_pool_thread() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        let spec = TcpPathSpec {
            local: lo,
            remote: SocketAddr::new(lo, 1),
            speed_mbps: 10_000,
            mtu: 0,
            label: String::new(),
        };
        let mut f = TcpFabric::unconnected(&[spec], &TcpConfig::default()).unwrap();
        assert_eq!(f.helper_threads(), 0);
        let mem = f.alloc_ctrl(2).unwrap();
        let err = f
            .post_write(
                0,
                &WriteWr {
                    wr_id: 1,
                    local: crate::transport::fabric::LocalSeg {
                        addr: mem.addr,
                        len: 8,
                        lkey: mem.reg.keys[0].lkey,
                    },
                    remote: crate::transport::fabric::RemoteSeg { addr: 8, rkey: 1 },
                    imm: None,
                    signaled: true,
                    inline: false,
                },
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("before its streams are connected"),
            "{err}"
        );
        f.post_recv(0, 3).unwrap();
        f.shutdown().unwrap();
    }

    #[test]
    fn fabric_moves_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<TcpFabric>();
    }
}
