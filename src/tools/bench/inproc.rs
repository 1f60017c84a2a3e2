//! An in-process [`Net`] over the real comms (`SendComm` / `RecvComm`) and an in-process fabric:
//! the model fabric (virtual time, `switchless bench --model`) or the in-memory fabric (real time).
//! Ranks are threads; rank `r` is host `r`. `connect` builds the comm pair and hands the receiving
//! side to the listener's `accept`. Buffers are copied between the bench's [`SharedBuf`]s and the
//! fabric's memory around each transfer (no copies when the fabric copies none).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::clock::Clock;
use crate::error::{Error, Result};
use crate::ffi::loader::net::{
    CommRef, HANDLE_SIZE, Handle, Net, PTR_HOST, Properties, RecvBuf, Region, SharedBuf,
};
use crate::sync::lock;
use crate::sys::rawmem::Lent;
use crate::transport::comm::{self, MemHandle, ProtocolConfig, RecvComm, Request, SendComm};
use crate::transport::fabric::{Fabric, MemKind};
use crate::transport::memfab::{MemEndpoint, MemFab};
use crate::transport::modelfab::{ModelEndpoint, ModelFab};
use crate::transport::wire::MAX_RECVS;

const MAGIC: &[u8; 8] = b"SWLMODEL";

/// A fabric that connects hosts of one process and owns their memory.
pub trait InProcFabric: Send + Sync {
    /// One endpoint.
    type Ep: Fabric + Send + 'static;
    /// A connection from host `a` to host `b`: (a's endpoint, b's endpoint).
    fn pair(&self, a: usize, b: usize) -> Result<(Self::Ep, Self::Ep)>;
    /// `len` bytes of data memory.
    fn alloc(&self, len: usize) -> Result<u64>;
    /// Whether payload bytes move (else nothing is copied in or out).
    fn copies(&self) -> bool;
    /// CPU write into fabric memory.
    fn write(&self, addr: u64, data: &[u8]) -> Result<()>;
    /// CPU read from fabric memory.
    fn read_into(&self, addr: u64, out: &mut [u8]) -> Result<()>;
    /// Path rates in Mb/s (for `getProperties`).
    fn speed_mbps(&self) -> u64;
}

impl InProcFabric for ModelFab {
    type Ep = ModelEndpoint;
    fn pair(&self, a: usize, b: usize) -> Result<(ModelEndpoint, ModelEndpoint)> {
        ModelFab::pair(self, a, b)
    }
    fn alloc(&self, len: usize) -> Result<u64> {
        ModelFab::alloc(self, len)
    }
    fn copies(&self) -> bool {
        ModelFab::copies(self).unwrap_or(false)
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        ModelFab::write(self, addr, data)
    }
    fn read_into(&self, addr: u64, out: &mut [u8]) -> Result<()> {
        ModelFab::read_into(self, addr, out)
    }
    fn speed_mbps(&self) -> u64 {
        self.nominal_mbps().unwrap_or(0)
    }
}

/// The in-memory fabric with fixed path speeds (Mb/s) for every connection.
#[derive(Clone)]
pub struct MemFabric {
    pub fab: MemFab,
    pub speeds_mbps: Vec<u64>,
    pub copies: bool,
}

impl InProcFabric for MemFabric {
    type Ep = MemEndpoint;
    fn pair(&self, _a: usize, _b: usize) -> Result<(MemEndpoint, MemEndpoint)> {
        Ok(self.fab.pair(&self.speeds_mbps, 0))
    }
    fn alloc(&self, len: usize) -> Result<u64> {
        self.fab.alloc(len)
    }
    fn copies(&self) -> bool {
        self.copies
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.fab.write(addr, data)
    }
    fn read_into(&self, addr: u64, out: &mut [u8]) -> Result<()> {
        let v = self.fab.read(addr, out.len())?;
        out.copy_from_slice(&v);
        Ok(())
    }
    fn speed_mbps(&self) -> u64 {
        self.speeds_mbps.iter().sum()
    }
}

type Shared<T> = Arc<Mutex<T>>;

struct Listens<E: Fabric> {
    next: u64,
    /// Listen id -> (listening host, the receiving comm once a connect built it).
    open: HashMap<u64, (usize, Option<RecvComm<E>>)>,
}

/// One rank's [`Net`] over an [`InProcFabric`]; every rank of a run shares the listen table
/// (`InProcNet::new` of a clone).
pub struct InProcNet<F: InProcFabric, C: Clock> {
    fab: Arc<F>,
    host: usize,
    clock: C,
    cfg: ProtocolConfig,
    listens: Shared<Listens<F::Ep>>,
}

/// The listen table all ranks of a run share.
pub struct InProcHub<F: InProcFabric> {
    fab: Arc<F>,
    listens: Shared<Listens<F::Ep>>,
}

impl<F: InProcFabric> InProcHub<F> {
    pub fn new(fab: F) -> Self {
        InProcHub {
            fab: Arc::new(fab),
            listens: Arc::new(Mutex::new(Listens {
                next: 1,
                open: HashMap::new(),
            })),
        }
    }

    /// The Net of host `host`, timing with `clock`.
    pub fn net<C: Clock>(&self, host: usize, clock: C, cfg: ProtocolConfig) -> InProcNet<F, C> {
        InProcNet {
            fab: self.fab.clone(),
            host,
            clock,
            cfg,
            listens: self.listens.clone(),
        }
    }
}

pub struct InListen(u64);
pub struct InSend<E: Fabric> {
    comm: Shared<SendComm<E>>,
    /// The (address, length) whose bytes are already in fabric memory for a send that was refused
    /// (NULL): its retry need not copy them again.
    staged: Option<(u64, usize)>,
}
pub struct InRecv<E: Fabric>(Shared<RecvComm<E>>);
pub struct InMr {
    addr: u64,
    mh: MemHandle,
    buf: SharedBuf,
}

/// A request: the comm it belongs to (NCCL's `test` names only the request).
pub enum InRequest<E: Fabric> {
    Send(Shared<SendComm<E>>, Request),
    /// With, per buffer, the fabric address and the bench's region to copy into on completion.
    Recv(Shared<RecvComm<E>>, Request, Vec<(u64, Region)>),
    Done,
}

fn offset_addr(mr: &InMr, r: &Region) -> Result<u64> {
    if !mr.buf.same(&r.buf) {
        return Err(Error::InvalidArgument(
            "in-process net: a buffer with the mhandle of another buffer".into(),
        ));
    }
    Ok(mr.addr + r.offset as u64)
}

impl<F: InProcFabric, C: Clock> Net for InProcNet<F, C> {
    type ListenComm = InListen;
    type SendComm = InSend<F::Ep>;
    type RecvComm = InRecv<F::Ep>;
    type Mr = InMr;
    type Request = InRequest<F::Ep>;

    fn name(&self) -> String {
        "switchless-inproc".into()
    }
    fn init(&mut self, _comm_id: u64) -> Result<()> {
        Ok(())
    }
    fn devices(&self) -> Result<usize> {
        Ok(1)
    }
    fn get_properties(&self, dev: usize) -> Result<Properties> {
        Ok(Properties {
            name: format!("inproc{dev}"),
            pci_path: String::new(),
            guid: dev as u64,
            ptr_support: PTR_HOST,
            speed_mbps: i32::try_from(self.fab.speed_mbps()).unwrap_or(i32::MAX),
            port: 1,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: MAX_RECVS as i32,
            max_p2p_bytes: comm::MAX_WR_BYTES as usize,
        })
    }
    fn listen(&self, _dev: usize) -> Result<(Handle, InListen)> {
        let mut g = lock(&self.listens, "in-process listens")?;
        let id = g.next;
        g.next += 1;
        g.open.insert(id, (self.host, None));
        let mut h = [0u8; HANDLE_SIZE];
        h[..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&id.to_le_bytes());
        Ok((h, InListen(id)))
    }
    fn connect(&self, _dev: usize, handle: &mut Handle) -> Result<Option<InSend<F::Ep>>> {
        if &handle[..8] != MAGIC {
            return Err(Error::Remote(
                "in-process net: the handle is not from an in-process listen".into(),
            ));
        }
        let mut idb = [0u8; 8];
        idb.copy_from_slice(&handle[8..16]);
        let id = u64::from_le_bytes(idb);
        let mut g = lock(&self.listens, "in-process listens")?;
        let Some((host, slot)) = g.open.get_mut(&id) else {
            return Err(Error::Remote(format!("in-process net: no listen {id}")));
        };
        if slot.is_some() {
            return Err(Error::Remote(format!(
                "in-process net: listen {id} is already connected"
            )));
        }
        let (a, b) = self.fab.pair(self.host, *host)?;
        let (s, r) = comm::connect_pair(a, b, self.cfg)?;
        *slot = Some(r);
        Ok(Some(InSend {
            comm: Arc::new(Mutex::new(s)),
            staged: None,
        }))
    }
    fn accept(&self, listen: &mut InListen) -> Result<Option<InRecv<F::Ep>>> {
        let mut g = lock(&self.listens, "in-process listens")?;
        let ready = g.open.get(&listen.0).is_some_and(|(_, r)| r.is_some());
        if !ready {
            return Ok(None);
        }
        let r = g.open.remove(&listen.0).and_then(|(_, r)| r);
        Ok(r.map(|r| InRecv(Arc::new(Mutex::new(r)))))
    }
    fn reg_mr(&self, comm: CommRef<'_, Self>, buf: &SharedBuf) -> Result<InMr> {
        let addr = self.fab.alloc(buf.len())?;
        // The fabric's own memory, not the bench's buffer: bytes are copied in and out around
        // each transfer.
        let mem = Lent::simulated(addr, buf.len());
        let mh = match comm {
            CommRef::Send(s) => lock(&s.comm, "send comm")?.reg_mr(&mem, MemKind::Host)?,
            CommRef::Recv(r) => lock(&r.0, "recv comm")?.reg_mr(&mem, MemKind::Host)?,
        };
        Ok(InMr {
            addr,
            mh,
            buf: buf.clone(),
        })
    }
    fn dereg_mr(&self, comm: CommRef<'_, Self>, mr: InMr) -> Result<()> {
        match comm {
            CommRef::Send(s) => lock(&s.comm, "send comm")?.dereg_mr(mr.mh),
            CommRef::Recv(r) => lock(&r.0, "recv comm")?.dereg_mr(mr.mh),
        }
    }
    fn isend(
        &self,
        comm: &mut InSend<F::Ep>,
        data: &Region,
        tag: i32,
        mr: &InMr,
    ) -> Result<Option<InRequest<F::Ep>>> {
        let addr = offset_addr(mr, data)?;
        let tag = u32::try_from(tag)
            .map_err(|_| Error::InvalidArgument(format!("in-process net: tag {tag} < 0")))?;
        // NCCL retries a NULL isend with the same bytes: copy them once.
        if self.fab.copies() && data.len > 0 && comm.staged != Some((addr, data.len)) {
            let b = data.buf.lock()?;
            self.fab
                .write(addr, &b[data.offset..data.offset + data.len])?;
            comm.staged = Some((addr, data.len));
        }
        let req = lock(&comm.comm, "send comm")?.isend(
            self.clock.now(),
            addr,
            data.len as u64,
            tag,
            &mr.mh,
        )?;
        if req.is_some() {
            comm.staged = None;
        }
        Ok(req.map(|q| InRequest::Send(comm.comm.clone(), q)))
    }
    fn irecv(
        &self,
        comm: &mut InRecv<F::Ep>,
        bufs: &[RecvBuf<'_, Self>],
    ) -> Result<Option<InRequest<F::Ep>>> {
        let mut rb = Vec::with_capacity(bufs.len());
        let mut copy = Vec::with_capacity(bufs.len());
        for b in bufs {
            let addr = offset_addr(b.mr, &b.region)?;
            let tag = u32::try_from(b.tag).map_err(|_| {
                Error::InvalidArgument(format!("in-process net: tag {} < 0", b.tag))
            })?;
            rb.push(comm::RecvBuf {
                addr,
                size: b.region.len as u64,
                tag,
                mh: &b.mr.mh,
            });
            copy.push((addr, b.region.clone()));
        }
        let mut r = lock(&comm.0, "recv comm")?;
        let req = r.irecv(self.clock.now(), &rb)?;
        Ok(req.map(|q| InRequest::Recv(comm.0.clone(), q, copy)))
    }
    fn test(&self, req: &mut InRequest<F::Ep>) -> Result<Option<Vec<usize>>> {
        let now = self.clock.now();
        let out = match req {
            InRequest::Send(s, q) => lock(s, "send comm")?
                .test(now, *q)?
                .map(|n| vec![n as usize]),
            InRequest::Recv(r, q, copy) => {
                let Some(sizes) = lock(r, "recv comm")?.test(now, *q)? else {
                    return Ok(None);
                };
                let sizes: Vec<usize> = sizes.as_slice().iter().map(|&n| n as usize).collect();
                if self.fab.copies() {
                    for ((addr, region), &n) in copy.iter().zip(&sizes) {
                        let mut b = region.buf.lock()?;
                        let n = n.min(region.len);
                        self.fab
                            .read_into(*addr, &mut b[region.offset..region.offset + n])?;
                    }
                }
                Some(sizes)
            }
            InRequest::Done => {
                return Err(Error::InvalidArgument(
                    "in-process net: test of a request that already completed".into(),
                ));
            }
        };
        if out.is_some() {
            *req = InRequest::Done;
        }
        Ok(out)
    }
    fn close_send(&self, comm: InSend<F::Ep>) -> Result<()> {
        match Arc::try_unwrap(comm.comm) {
            Ok(m) => m
                .into_inner()
                .map_err(|_| Error::Internal("send comm lock poisoned".into()))?
                .close(),
            // a request still holds it: dropping the last handle closes it
            Err(_) => Ok(()),
        }
    }
    fn close_recv(&self, comm: InRecv<F::Ep>) -> Result<()> {
        match Arc::try_unwrap(comm.0) {
            Ok(m) => m
                .into_inner()
                .map_err(|_| Error::Internal("recv comm lock poisoned".into()))?
                .close(),
            Err(_) => Ok(()),
        }
    }
    fn close_listen(&self, listen: InListen) -> Result<()> {
        lock(&self.listens, "in-process listens")?
            .open
            .remove(&listen.0);
        Ok(())
    }
    fn finalize(&mut self) -> Result<()> {
        Ok(())
    }
}
