//! A [`Fabric`] over TCP streams: Ethernet paths without RDMA carry the same receiver-driven
//! protocol ([`super::comm`]) as the verbs paths. Each path is several streams; an RDMA write
//! becomes frames (a 40-byte header, then the payload) spread over them, and per-path sequence
//! numbers let the receiver apply control-memory writes and immediates in order. The receiving side
//! treats the peer as untrusted: nothing is written outside a live registration. Host memory only.
//!
//! Files: [`config`] (sizing policy, options), [`frame`] (wire formats), [`auth`] (every stream
//! proves the connection secret), `dial` (one stream's challenge, hello and acknowledgement), `setup` (listeners, connector, acceptor), `revive` (failover and
//! failback of a path), `state` (what the fabric shares with its I/O workers), `pool` (the
//! process-wide I/O worker threads), `stream` (one stream's receive and send state machines),
//! `window` (a slow peer is not a dead peer: the user timeout and a closed window) and, here,
//! [`TcpFabric`]. Depends on `transport::{fabric, ctrl}` and `sys` (raw memory, sockets). The
//! design and its rules: `docs/guide/tcp.md`.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sync::lock;
use crate::sys::rawmem::{Lent, RawRegion};
use crate::sys::socket::{self as rawmem, Ready};
use crate::transport::ctrl::AtomicWords;
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, MemKind, PathInfo, PathKeys, Pinner, ReadWr, Registration, Revive,
    WcOpcode, WcStatus, WriteWr,
};
use frame::{FLAG_IMM, FrameRepr, OP_WRITE};
use state::{PathShared, Payload, Reg, RegMem, Shared, TxFrame, WrTrack};

pub mod auth;
pub mod config;
mod dial;
pub mod frame;
mod pool;
mod revive;
mod setup;
mod state;
mod stream;
mod window;

pub use config::{
    BufferPolicy, DEFAULT_MAX_IO_THREADS, MAX_FRAME_BYTES, MAX_IO_THREADS, MAX_STREAMS,
    MBPS_PER_STREAM, MIN_FRAME_BYTES, MIN_STREAMS, RELAY_FRAME_BYTES, TcpConfig,
    default_io_threads, per_path_streams, socket_buffer_bytes, streams_for_speed,
};
pub use dial::{
    DialStep, Dialed, MAX_PENDING_STREAMS, REDIAL_FOR, RelayVia, StreamDialer, TcpPathSpec,
    connect_start, connect_status,
};
pub use pool::io_threads;
pub use revive::{LinkCheck, MAX_REBUILD_GAP, MIN_REBUILD_GAP};
pub use setup::{TcpAcceptor, TcpConnector, listen, listen_at, loopback_pair};
pub use stream::{MAX_BUFFERED_CTRL, MAX_OUT_OF_ORDER};

/// The refusal of GPU memory on a TCP connection, with what NCCL decided and the remedy. The
/// plugin routes over TCP whatever the device advertises (a GB10's GPU has no GPU-direct RDMA, so
/// NCCL never registers GPU memory there, although its NIC passes the DMA-BUF probe); a GPU
/// registration is what shows that NCCL chose GPU-direct for this connection, and NCCL registers
/// its connection buffers right after connecting, so this still fails at set-up.
pub fn gpu_refusal(what: &str, addr: u64, len: usize, labels: &[String]) -> String {
    format!(
        "NCCL registered {what} at {addr:#x} ({len} bytes) on a connection whose paths are TCP \
         ({}); TCP streams carry host memory only. NCCL chose GPU-direct RDMA for this connection \
         (its device advertises NCCL_PTR_CUDA or NCCL_PTR_DMABUF, and NCCL judged the GPU close \
         enough to the NIC). Set NCCL_NET_GDR_LEVEL=LOC on every rank (NCCL then keeps its network \
         buffers in host memory, which TCP carries), or give both ends a RoCE port in a shared subnet",
        labels.join(", ")
    )
}

/// Writes up to this many bytes are copied when posted and sent as one frame.
pub const COPY_AT_POST_BYTES: usize = 4096;
/// How long `shutdown` tries to hand the close frames to the kernel.
const GOODBYE_WAIT: Duration = Duration::from_millis(200);

/// One endpoint of a TCP connection: implements [`Fabric`]. Build it with [`TcpFabric::connect`] /
/// [`TcpFabric::accept`] (or [`loopback_pair`] in tests).
pub struct TcpFabric {
    sh: Arc<Shared>,
    paths: Vec<PathInfo>,
    /// This endpoint's streams in the I/O pool, per path.
    io: Vec<Vec<pool::StreamHandle>>,
    ctrl: Vec<Arc<AtomicWords>>,
    /// Registration tokens -> keys (shared with the [`Pinner`] `regMr` uses without the fabric).
    tokens: Arc<Mutex<HashMap<u64, u32>>>,
    next_token: Arc<AtomicU64>,
    frame_bytes: usize,
    /// What rebuilding a failed path needs (`None` before the streams are connected).
    redial: Option<revive::Redial>,
    shut: bool,
}

/// Registers memory for one TCP endpoint without borrowing it: keys in the endpoint's shared table
/// (which its I/O workers read), so `regMr` and `deregMr` (which waits for a copy in progress) run
/// without the connection's lock.
struct TcpPinner {
    sh: Arc<Shared>,
    /// The paths' labels, for the refusal of GPU memory.
    labels: Vec<String>,
    tokens: Arc<Mutex<HashMap<u64, u32>>>,
    next_token: Arc<AtomicU64>,
    npaths: usize,
}

impl TcpPinner {
    /// A fresh key: 32 random bits (`getrandom`) per registration, so one key the peer sees (a CTS
    /// rkey, the records key) tells nothing about the others; never 0, never one in use.
    fn new_key(&self) -> Result<u32> {
        loop {
            let mut b = [0u8; 4];
            getrandom::fill(&mut b).map_err(|e| {
                Error::System(format!("reading random bytes for a TCP memory key: {e}"))
            })?;
            let k = u32::from_ne_bytes(b);
            if k != 0 && !self.sh.regs()?.contains_key(&k) {
                return Ok(k);
            }
        }
    }

    fn add_reg(&self, mem: RegMem) -> Result<Registration> {
        let key = self.new_key()?;
        self.sh.regs_mut()?.insert(
            key,
            Arc::new(Reg {
                mem,
                alive: RwLock::new(true),
            }),
        );
        let token = self.next_token.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.tokens, "TCP registration tokens")?.insert(token, key);
        Ok(Registration {
            keys: vec![
                PathKeys {
                    lkey: key,
                    rkey: key
                };
                self.npaths
            ],
            token,
            missing: 0,
        })
    }
}

impl Pinner for TcpPinner {
    fn register_dmabuf(
        &self,
        mem: &Lent,
        _offset: u64,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Registration> {
        Err(Error::InvalidUsage(gpu_refusal(
            "GPU memory exported as DMA-BUF (regMrDmaBuf)",
            mem.addr(),
            mem.len(),
            &self.labels,
        )))
    }

    fn register(&self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        if kind == MemKind::Cuda {
            return Err(Error::InvalidUsage(gpu_refusal(
                "GPU memory (NCCL_PTR_CUDA)",
                mem.addr(),
                mem.len(),
                &self.labels,
            )));
        }
        // The region keeps `mem`: the memory stays lent while a copy in flight holds the `Reg`.
        let region = RawRegion::new(mem)?;
        self.add_reg(RegMem::Raw(region))
    }

    fn deregister(&self, reg: &Registration) -> Result<()> {
        let key = lock(&self.tokens, "TCP registration tokens")?.remove(&reg.token);
        let Some(key) = key else {
            return Err(Error::InvalidArgument(format!(
                "deregistration of unknown TCP fabric registration {}",
                reg.token
            )));
        };
        let r = self.sh.regs_mut()?.remove(&key);
        // Outside the table's lock: waits for a copy in progress (at most one chunk).
        match r {
            Some(r) => r.kill(),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for TcpFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpFabric")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl TcpFabric {
    /// Number of streams of data path `path` (0 if there is no such path).
    pub fn streams(&self, path: usize) -> usize {
        self.sh.path(path).map_or(0, |p| p.streams.len())
    }

    /// Payload bytes handed to the kernel so far on each stream of `path`.
    pub fn stream_bytes(&self, path: usize) -> Vec<u64> {
        self.sh.path(path).map_or_else(
            |_| Vec::new(),
            |p| {
                p.streams
                    .iter()
                    .map(|s| s.sent_bytes.load(Ordering::Relaxed))
                    .collect()
            },
        )
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

    fn check_path(&self, path: usize) -> Result<Arc<PathShared>> {
        self.sh.path(path)
    }

    /// Refuses the peer's writes into data registrations from now on (a sending endpoint: its data
    /// registrations are send buffers; the peer writes only its control memory). A write there
    /// fails the path as a remote access error.
    pub fn refuse_peer_data_writes(&self) {
        self.sh.peer_data_writes.store(false, Ordering::Relaxed);
    }

    /// Registers for this endpoint without borrowing it (what [`Fabric::pinner`] returns).
    fn pinner_of(&self) -> TcpPinner {
        TcpPinner {
            sh: Arc::clone(&self.sh),
            labels: self.paths.iter().map(|p| p.label.clone()).collect(),
            tokens: Arc::clone(&self.tokens),
            next_token: Arc::clone(&self.next_token),
            npaths: self.paths.len(),
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

impl Fabric for TcpFabric {
    fn paths(&self) -> &[PathInfo] {
        &self.paths
    }

    fn register(&mut self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        self.pinner_of().register(mem, kind)
    }

    fn deregister(&mut self, reg: &Registration) -> Result<()> {
        self.pinner_of().deregister(reg)
    }

    fn register_dmabuf(
        &mut self,
        mem: &Lent,
        _offset: u64,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Registration> {
        Err(Error::InvalidUsage(gpu_refusal(
            "GPU memory exported as DMA-BUF (regMrDmaBuf)",
            mem.addr(),
            mem.len(),
            &self
                .paths
                .iter()
                .map(|p| p.label.clone())
                .collect::<Vec<_>>(),
        )))
    }

    fn pinner(&self) -> Option<Arc<dyn Pinner>> {
        Some(Arc::new(self.pinner_of()))
    }

    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem> {
        let block = Arc::new(AtomicWords::new(words.max(1)));
        let addr = block.addr();
        self.ctrl.push(Arc::clone(&block));
        let reg = self.pinner_of().add_reg(RegMem::Ctrl(block))?;
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
        if self.sh.stop.load(Ordering::Relaxed) || p.tx()?.error {
            flush(WcStatus::WR_FLUSH_ERR);
            return Ok(());
        }
        let len = wr.local.len as usize;
        let reg = self.sh.regs()?.get(&wr.local.lkey).cloned();
        let Some(reg) = reg.filter(|r| r.contains(wr.local.addr, len)) else {
            // Like a NIC: a bad local key or range fails the request and puts the path in error.
            let mut tx = p.tx()?;
            let index = tx.first_wr + tx.wrs.len() as u64;
            tx.wrs.push_back(WrTrack {
                wr_id: wr.wr_id,
                remaining: 1,
                signaled: true,
                ends: Vec::new(),
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
        // Each frame addresses remote + its offset: a range that wraps is refused whole.
        if wr.remote.addr.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument(format!(
                "write to remote {:#x} + {len} bytes wraps the address space",
                wr.remote.addr
            )));
        }
        let nstreams = p.streams.len();
        // A relayed path's frames fit a slot of the relay's staging memory.
        let frame_bytes = if p.relayed {
            frame_bytes.min(config::RELAY_FRAME_BYTES)
        } else {
            frame_bytes
        };
        let frame = if copied.is_some() || len == 0 {
            len.clamp(1, if p.relayed { frame_bytes } else { usize::MAX })
        } else {
            (len.div_ceil(nstreams).div_ceil(4096) * 4096).clamp(MIN_FRAME_BYTES, frame_bytes)
        };
        let nframes = len.div_ceil(frame).max(1);
        // Streams whose worker must be woken (its sender was idle), after the locks are released.
        let mut kick = [false; MAX_STREAMS];
        let mut tx = p.tx()?;
        let wr_index = tx.first_wr + tx.wrs.len() as u64;
        tx.wrs.push_back(WrTrack {
            wr_id: wr.wr_id,
            remaining: nframes as u32,
            signaled: wr.signaled,
            ends: Vec::new(),
        });
        let mut copied = copied;
        for k in 0..nframes {
            let off = k * frame;
            let flen = (len - off).min(frame);
            let last = k + 1 == nframes;
            let seq = tx.next_seq;
            tx.next_seq += 1;
            let hdr = FrameRepr {
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
            .to_bytes();
            let payload = match copied.as_mut() {
                // One frame takes the whole copy; a relayed path's may take it in slices.
                Some(v) if nframes == 1 => Payload::Bytes(std::mem::take(v)),
                Some(v) => Payload::Bytes(v[off..off + flen].to_vec()),
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
            let mut q = st.queue()?;
            q.frames.push_back(TxFrame {
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
        let mut rx = p.rx()?;
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
        // Sends the peer has acknowledged since the last call complete now.
        p.complete_acked();
        let mut cq = p.cq()?;
        let n = max.min(cq.len());
        out.extend(cq.drain(..n));
        if n == 0 {
            drop(cq);
            // The peer closed every stream in order and what landed is taken: receives still posted
            // can never complete (whatever flags the close frames had), so they fail now and the
            // next poll reports them.
            let closed = {
                let rx = p.rx()?;
                rx.peer_closed && !rx.error
            };
            if closed && !self.sh.stop.load(Ordering::Relaxed) {
                p.fail_rx(
                    "the peer closed every stream; receives still posted cannot complete",
                    false,
                );
            }
        }
        Ok(n)
    }

    fn path_health(&mut self, path: usize) -> Result<()> {
        self.health_of(path)
    }

    fn revive_path(&mut self, path: usize) -> Result<Revive> {
        self.revive(path)
    }

    fn stop_path(&mut self, path: usize) -> Result<()> {
        self.stop(path)
    }

    fn seal_path(&mut self, path: usize) -> Result<bool> {
        self.seal(path)
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.shut {
            return Ok(());
        }
        self.shut = true;
        // Listeners and reconnects under way close now.
        self.redial = None;
        self.sh.stop.store(true, Ordering::SeqCst);
        // 1. Take the streams out of their workers; after this no pool thread touches them (a
        //    frame a worker was in the middle of stays unfinished: no close frame follows it).
        let removed =
            pool::remove_streams(std::mem::take(&mut self.io).into_iter().flatten().collect());
        // 2. Say goodbye on every stream that is at a frame boundary: orderly when nothing was
        //    dropped, "dirty" when work requests were still outstanding (the peer then fails its
        //    receives instead of waiting for data that will never come).
        let until = Instant::now() + GOODBYE_WAIT;
        let paths = self.sh.all_paths()?;
        for p in &paths {
            // A poisoned send state cannot tell: say dirty, the peer then fails its receives.
            // (Work requests all handed to the kernel are not dropped: the drain below lets them go
            // out before the FIN.)
            let dirty = p.tx().map_or(true, |tx| {
                tx.error || tx.wrs.iter().any(|w| w.remaining > 0)
            });
            let hdr = FrameRepr::close(dirty).to_bytes();
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
        for p in &paths {
            p.close_streams();
        }
        for p in &paths {
            p.fail_tx(WcStatus::WR_FLUSH_ERR, None, "shut down");
            p.fail_rx("shut down", false);
        }
        // Closing a socket with unread received bytes makes the kernel send a reset, which also
        // discards what we handed it but it has not sent yet (the tail of a completed send). Read
        // and drop what has arrived (bounded), so the close is an orderly FIN after our data.
        let mut scratch = vec![0u8; 64 * 1024];
        for p in &paths {
            for st in &p.streams {
                for _ in 0..1024 {
                    match rawmem::recv_slice(&st.sock, &mut scratch) {
                        Ok(n) if n > 0 => {}
                        _ => break,
                    }
                }
            }
        }
        match removed? {
            0 => Ok(()),
            panicked => Err(Error::Internal(format!(
                "{panicked} TCP I/O pool threads panicked"
            ))),
        }
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
    use std::net::{IpAddr, SocketAddr};

    #[test]
    fn an_unconnected_endpoint_refuses_writes_and_holds_no_pool_thread() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        let spec = TcpPathSpec {
            local: lo,
            remote: SocketAddr::new(lo, 1),
            speed_mbps: 10_000,
            mtu: 0,
            label: String::new(),
            relay: None,
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
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn a_poisoned_path_lock_fails_closed_and_the_peer_sees_the_path_fail() {
        let cfg = TcpConfig {
            streams: Some(1),
            ..TcpConfig::default()
        };
        let (mut a, mut b) = loopback_pair(&[10_000], &cfg).unwrap();
        b.post_recv(0, 7).unwrap();
        let sh = Arc::clone(&a.sh);
        let _ = std::thread::spawn(move || {
            let p = sh.path(0).unwrap();
            let _g = p.tx.lock().unwrap();
            panic!("poison the send state");
        })
        .join();
        let mem = a.alloc_ctrl(1).unwrap();
        let wr = WriteWr {
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
        };
        assert_eq!(
            a.post_write(0, &wr).unwrap_err(),
            Error::Internal("TCP send state lock poisoned by an earlier panic".into())
        );
        // Shutting down cannot tell whether work was outstanding: the close is dirty, and the
        // peer's posted receive fails instead of waiting.
        a.shutdown().unwrap();
        let t = Instant::now();
        let c = loop {
            let mut out = Vec::new();
            b.poll(0, 1, &mut out).unwrap();
            if let Some(c) = out.pop() {
                break c;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the peer's receive never failed"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!((c.wr_id, c.status), (7, WcStatus::WR_FLUSH_ERR));
    }

    #[test]
    fn fabric_moves_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<TcpFabric>();
    }
}
