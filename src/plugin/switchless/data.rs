//! The data calls: the two ends of a connection ([`SendEnd`], [`RecvEnd`]), their requests ([`Req`]),
//! and `regMr`/`isend`/`irecv`/`iflush`/`test`/`close`, each delegated to
//! [`crate::transport::comm`]'s `SendComm`/`RecvComm`.
#![forbid(unsafe_code)]

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{Connectable, PathFactory, Switchless};
use crate::error::{Error, Result};
use crate::plugin::{CommRef, FlushBuf, PtrSupport, RecvBuf, Region};
use crate::sync::lock;
use crate::transport::comm::{self, MemHandle, RecvComm, Registrar, SendComm};
use crate::transport::fabric::MemKind;
use crate::transport::wire::MAX_RECVS;

/// A comm shared between its NCCL object and its in-flight requests; `None` once closed.
type Shared<T> = Arc<Mutex<Option<T>>>;

/// One end of a connection: its comm, shared with the end's in-flight requests; `None` once closed.
pub struct End<C> {
    comm: Shared<C>,
}

/// The sending end of a connection (`sendComm`).
pub type SendEnd<F> = End<SendComm<F>>;

/// The receiving end of a connection (`recvComm`).
pub type RecvEnd<F> = End<RecvComm<F>>;

/// What an [`End`] needs of its comm.
pub trait EndComm: Sized {
    /// The end's name in `Debug` output.
    const NAME: &'static str;
    /// The labels of the comm's paths (data paths, then loopbacks).
    fn path_labels(&self) -> Vec<String>;
    /// Stops the comm and releases what it holds.
    fn close(self) -> Result<()>;
}

impl<F: Connectable> EndComm for SendComm<F> {
    const NAME: &'static str = "SendEnd";
    fn path_labels(&self) -> Vec<String> {
        labels(self.fabric())
    }
    fn close(self) -> Result<()> {
        // The comm's own (inherent) close.
        SendComm::close(self)
    }
}

impl<F: Connectable> EndComm for RecvComm<F> {
    const NAME: &'static str = "RecvEnd";
    fn path_labels(&self) -> Vec<String> {
        labels(self.fabric())
    }
    fn close(self) -> Result<()> {
        // The comm's own (inherent) close.
        RecvComm::close(self)
    }
}

fn labels<F: Connectable>(fab: &F) -> Vec<String> {
    fab.paths().iter().map(|p| p.label.clone()).collect()
}

impl<C: EndComm> std::fmt::Debug for End<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(C::NAME)
            .field("paths", &self.path_labels())
            .finish()
    }
}

impl<C: EndComm> End<C> {
    /// The end of a connected comm.
    pub(super) fn new(comm: C) -> End<C> {
        End {
            comm: Arc::new(Mutex::new(Some(comm))),
        }
    }

    /// The labels of the connection's paths (data paths, then loopbacks); empty once closed.
    pub fn path_labels(&self) -> Vec<String> {
        self.comm
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(C::path_labels))
            .unwrap_or_default()
    }

    /// `closeSend`, `closeRecv`: stops the comm; its requests fail from then on.
    pub(super) fn close(self) -> Result<()> {
        let taken = lock(&self.comm, "comm")?.take();
        taken.map_or(Ok(()), C::close)
    }
}

impl<F: Connectable> SendEnd<F> {
    /// `isend`.
    pub(super) fn isend(
        &self,
        addr: usize,
        size: usize,
        tag: i32,
        mr: &MemHandle,
    ) -> Result<Option<Req<F>>> {
        let mut g = lock(&self.comm, "comm")?;
        let sc = g.as_mut().ok_or_else(|| closed("isend"))?;
        Ok(sc
            .isend(Instant::now(), addr as u64, size as u64, tag as u32, mr)?
            .map(|r| Req::Send(Arc::clone(&self.comm), r)))
    }
}

impl<F: Connectable> RecvEnd<F> {
    /// `irecv`.
    pub(super) fn irecv<'a>(&self, bufs: &[RecvBuf<'a, MemHandle>]) -> Result<Option<Req<F>>> {
        let conv = |b: &RecvBuf<'a, MemHandle>| comm::RecvBuf {
            addr: b.addr as u64,
            size: b.size as u64,
            tag: b.tag as u32,
            mh: b.mr,
        };
        with_converted(bufs, conv, |v| {
            let mut g = lock(&self.comm, "comm")?;
            let rc = g.as_mut().ok_or_else(|| closed("irecv"))?;
            Ok(rc
                .irecv(Instant::now(), v)?
                .map(|r| Req::Recv(Arc::clone(&self.comm), r)))
        })
    }

    /// `iflush`.
    pub(super) fn iflush<'a>(&self, bufs: &[FlushBuf<'a, MemHandle>]) -> Result<Option<Req<F>>> {
        let conv = |b: &FlushBuf<'a, MemHandle>| comm::FlushBuf {
            addr: b.addr as u64,
            size: b.size as u64,
            mh: b.mr,
        };
        with_converted(bufs, conv, |v| {
            let mut g = lock(&self.comm, "comm")?;
            let rc = g.as_mut().ok_or_else(|| closed("iflush"))?;
            Ok(rc
                .iflush(Instant::now(), v)?
                .map(|r| Req::Recv(Arc::clone(&self.comm), r)))
        })
    }
}

/// Runs `f` on NCCL's buffers converted by `conv`, on the stack (no allocation per request) for up
/// to `MAX_RECVS` buffers; more go to `f` as they are, for the comm to refuse by name.
fn with_converted<'a, T, U: Copy, R>(
    bufs: &'a [T],
    conv: impl Fn(&'a T) -> U,
    f: impl FnOnce(&[U]) -> Result<R>,
) -> Result<R> {
    let Some(first) = bufs.first() else {
        return f(&[]);
    };
    if bufs.len() > MAX_RECVS {
        let v: Vec<U> = bufs.iter().map(conv).collect();
        return f(&v);
    }
    let mut arr = [conv(first); MAX_RECVS];
    for (a, b) in arr.iter_mut().zip(bufs) {
        *a = conv(b);
    }
    f(&arr[..bufs.len()])
}

/// An in-flight request: its comm and the comm's request handle.
pub enum Req<F: Connectable> {
    /// From `isend`.
    Send(Shared<SendComm<F>>, comm::Request),
    /// From `irecv` or `iflush`.
    Recv(Shared<RecvComm<F>>, comm::Request),
}

impl<F: Connectable> Req<F> {
    /// `test`: whether the request is complete, with its byte counts in `sizes`.
    pub(super) fn test(&mut self, sizes: &mut [usize]) -> Result<bool> {
        match self {
            Req::Send(c, r) => {
                let mut g = lock(c, "comm")?;
                let sc = g.as_mut().ok_or_else(|| closed("test"))?;
                match sc.test(Instant::now(), *r)? {
                    Some(n) => {
                        if let Some(s) = sizes.first_mut() {
                            *s = n as usize;
                        }
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
            Req::Recv(c, r) => {
                let mut g = lock(c, "comm")?;
                let rc = g.as_mut().ok_or_else(|| closed("test"))?;
                match rc.test(Instant::now(), *r)? {
                    Some(got) => {
                        for (o, s) in sizes.iter_mut().zip(got.as_slice()) {
                            *o = *s as usize;
                        }
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
        }
    }
}

impl<P: PathFactory> Switchless<P> {
    /// `regMr`. When the fabric has a `Pinner` the pin (the slow part: `ibv_reg_mr` walks and
    /// pins every page) runs without the comm's lock, which `isend`/`test` take on NCCL's progress
    /// thread; the lock is held only to file the result.
    pub(super) fn register(comm: CommRef<'_, Self>, region: Region) -> Result<MemHandle> {
        let kind = mem_kind(&region);
        let mem = &region.mem;
        let Some(pinner) = with_registrar(comm, "regMr", |r| Ok(r.pinner()))? else {
            return with_registrar(comm, "regMr", |r| r.reg_mr(mem, kind));
        };
        let (addr, len) = (mem.addr(), mem.len() as u64);
        comm::check_range(addr, len)?;
        let reg = pinner.register(mem, kind)?;
        with_registrar(comm, "regMr", |r| r.adopt(addr, len, kind, reg.clone())).inspect_err(|_| {
            // Closed meanwhile (or refused): nothing holds the registration but us.
            let _ = pinner.deregister(&reg);
        })
    }

    /// `regMrDmaBuf`.
    pub(super) fn register_dmabuf(
        comm: CommRef<'_, Self>,
        region: Region,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<MemHandle> {
        let mem = &region.mem;
        let Some(pinner) = with_registrar(comm, "regMrDmaBuf", |r| Ok(r.pinner()))? else {
            return with_registrar(comm, "regMrDmaBuf", |r| r.reg_mr_dmabuf(mem, offset, fd));
        };
        // As `regMr`: the registration on every device (`ibv_reg_dmabuf_mr`, the slow part)
        // runs without the comm's lock, which NCCL's progress thread needs on every call.
        let (addr, len) = (mem.addr(), mem.len() as u64);
        comm::check_range(addr, len)?;
        let reg = pinner.register_dmabuf(mem, offset, fd)?;
        with_registrar(comm, "regMrDmaBuf", |r| {
            r.adopt(addr, len, MemKind::Cuda, reg.clone())
        })
        .inspect_err(|_| {
            let _ = pinner.deregister(&reg);
        })
    }

    /// `deregMr`: unpins outside the comm's lock when the fabric has a `Pinner`.
    pub(super) fn deregister(comm: CommRef<'_, Self>, mr: MemHandle) -> Result<()> {
        let pinner = with_registrar(comm, "deregMr", |r| match r.pinner() {
            Some(p) if r.forget(&mr) => Ok(Some(p)),
            _ => r.dereg_mr(mr.clone()).map(|()| None),
        })?;
        match pinner {
            Some(p) => p.deregister(mr.registration()),
            None => Ok(()),
        }
    }
}

fn mem_kind(r: &Region) -> MemKind {
    if r.kind.0 & (PtrSupport::CUDA.0 | PtrSupport::DMABUF.0) != 0 {
        MemKind::Cuda
    } else {
        MemKind::Host
    }
}

fn closed(what: &str) -> Error {
    Error::InvalidArgument(format!("{what} on a comm that is already closed"))
}

/// Runs a registration call `what` on either comm, or fails when NCCL already closed it.
fn with_registrar<P: PathFactory, R>(
    comm: CommRef<'_, Switchless<P>>,
    what: &str,
    f: impl FnOnce(&mut dyn Registrar) -> Result<R>,
) -> Result<R> {
    match comm {
        CommRef::Send(s) => f(lock(&s.comm, "comm")?
            .as_mut()
            .ok_or_else(|| closed(what))?),
        CommRef::Recv(r) => f(lock(&r.comm, "comm")?
            .as_mut()
            .ok_or_else(|| closed(what))?),
    }
}
