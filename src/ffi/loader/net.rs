//! The `Net` trait: the ncclNet v12 calls NCCL's proxy makes, in safe Rust, with the plugin's
//! handles as opaque associated types. `switchless bench`'s modes are written against it; the loader
//! ([`super`]) implements it over a loaded plugin, `tools::bench::loopback` in-process for tests.
#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
pub use crate::plugin::{CommAttr, NetAttr};

/// `NCCL_NET_HANDLE_MAXSIZE`: the size of the blob `listen` writes and `connect` reads.
pub const HANDLE_SIZE: usize = 128;

/// The opaque connection handle (`ncclNetHandle_t`, 128 bytes).
pub type Handle = [u8; HANDLE_SIZE];

/// `NCCL_PTR_HOST`: the `type` argument of `regMr` for host memory.
pub const PTR_HOST: i32 = 0x1;

/// The fields of `ncclNetProperties_v12_t` the bench reports and uses.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Properties {
    pub name: String,
    pub pci_path: String,
    pub guid: u64,
    /// `NCCL_PTR_*` bits.
    pub ptr_support: i32,
    /// Port speed in Mb/s (megabits per second).
    pub speed_mbps: i32,
    pub port: i32,
    /// Latency in microseconds (0: NCCL's default).
    pub latency_us: f32,
    pub max_comms: i32,
    /// Most buffers one grouped `irecv` may carry.
    pub max_recvs: i32,
    /// Largest single isend/irecv, in bytes.
    pub max_p2p_bytes: usize,
}

/// Host memory shared between the bench and the plugin. The allocation never moves or changes size,
/// so [`SharedBuf::raw_parts`] stays valid for the life of the buffer: the C side may read and write
/// it between `isend`/`irecv` and the `test` that reports completion, while the bench touches it only
/// outside that window.
#[derive(Debug, Clone)]
pub struct SharedBuf {
    bytes: Arc<Mutex<Box<[u8]>>>,
    /// The allocation's length, fixed at creation (so reading it needs no lock).
    len: usize,
}

impl SharedBuf {
    /// A zeroed buffer of `len` bytes (at least 1 byte is allocated so the pointer is never dangling).
    pub fn new(len: usize) -> Self {
        let len = len.max(1);
        SharedBuf {
            bytes: Arc::new(Mutex::new(vec![0u8; len].into_boxed_slice())),
            len,
        }
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: see [`SharedBuf::new`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Locks the bytes for reading or writing by the bench; [`Error::Internal`] if a panic poisoned
    /// the lock (the bytes may be half-written).
    pub fn lock(&self) -> Result<MutexGuard<'_, Box<[u8]>>> {
        crate::sync::lock(&self.bytes, "shared buffer")
    }

    /// The address and length, for passing to a C plugin.
    pub fn raw_parts(&self) -> Result<(*mut u8, usize)> {
        let mut g = self.lock()?;
        Ok((g.as_mut_ptr(), g.len()))
    }

    /// Whether two values name the same allocation.
    pub fn same(&self, other: &SharedBuf) -> bool {
        Arc::ptr_eq(&self.bytes, &other.bytes)
    }
}

/// A byte range of a [`SharedBuf`].
#[derive(Debug, Clone)]
pub struct Region {
    pub buf: SharedBuf,
    pub offset: usize,
    pub len: usize,
}

impl Region {
    /// `len` bytes at `offset`; an error if that runs past the buffer.
    pub fn new(buf: &SharedBuf, offset: usize, len: usize) -> Result<Self> {
        let total = buf.len();
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(Error::Internal(format!(
                "region {offset}+{len} B runs past a {total} B buffer"
            )));
        }
        Ok(Region {
            buf: buf.clone(),
            offset,
            len,
        })
    }
}

/// The send or the receive side of a connection, for `regMr`/`deregMr` (which take either).
pub enum CommRef<'a, N: Net + ?Sized> {
    Send(&'a N::SendComm),
    Recv(&'a N::RecvComm),
}

/// One buffer of a grouped receive.
pub struct RecvBuf<'a, N: Net + ?Sized> {
    pub region: Region,
    pub tag: i32,
    pub mr: &'a N::Mr,
}

/// The ncclNet v12 calls of NCCL's proxy, one method per call. `Ok(None)` from `connect`, `accept`,
/// `isend` and `irecv` is NCCL's NULL result: "not yet, call again".
pub trait Net {
    type ListenComm;
    type SendComm;
    type RecvComm;
    type Mr;
    type Request;

    /// The plugin's `name`.
    fn name(&self) -> String;
    /// `init(&ctx, commId, config, logger, profiler)`; the implementation keeps `ctx`.
    fn init(&mut self, comm_id: u64) -> Result<()>;
    /// `devices(&ndev)`.
    fn devices(&self) -> Result<usize>;
    /// `getProperties(dev, &props)`.
    fn get_properties(&self, dev: usize) -> Result<Properties>;
    /// `listen(ctx, dev, handle, &listenComm)`.
    fn listen(&self, dev: usize) -> Result<(Handle, Self::ListenComm)>;
    /// `connect(ctx, dev, handle, &sendComm, &devHandle)`. `handle` is the same private copy on
    /// every retry (NCCL IB keeps its connect state in it).
    fn connect(&self, dev: usize, handle: &mut Handle) -> Result<Option<Self::SendComm>>;
    /// `setNetAttr(ctx, &netAttr)` (v11+; `None` fields go out as `NCCL_NET_ATTR_UNDEF`).
    /// `Ok(false)`: the plugin has no `setNetAttr` (the field may be NULL), so nothing was called.
    fn set_net_attr(&self, attr: &NetAttr) -> Result<bool> {
        let _ = attr;
        Ok(false)
    }
    /// `accept(listenComm, &recvComm, &devHandle)`.
    fn accept(&self, listen: &mut Self::ListenComm) -> Result<Option<Self::RecvComm>>;
    /// `regMr(comm, data, size, NCCL_PTR_HOST, &mhandle)` over a whole buffer.
    fn reg_mr(&self, comm: CommRef<'_, Self>, buf: &SharedBuf) -> Result<Self::Mr>;
    /// `deregMr(comm, mhandle)`.
    fn dereg_mr(&self, comm: CommRef<'_, Self>, mr: Self::Mr) -> Result<()>;
    /// `isend(sendComm, data, size, tag, mhandle, phandle=NULL, &request)`.
    fn isend(
        &self,
        comm: &mut Self::SendComm,
        data: &Region,
        tag: i32,
        mr: &Self::Mr,
    ) -> Result<Option<Self::Request>>;
    /// `irecv(recvComm, n, data[], sizes[], tags[], mhandles[], phandles=NULL, &request)`.
    fn irecv(
        &self,
        comm: &mut Self::RecvComm,
        bufs: &[RecvBuf<'_, Self>],
    ) -> Result<Option<Self::Request>>;
    /// `test(request, &done, sizes)`: `Some(sizes)` once done (one entry per buffer; one for a send).
    /// After `Some` the request belongs to the plugin again and must not be tested again.
    fn test(&self, req: &mut Self::Request) -> Result<Option<Vec<usize>>>;
    /// `closeSend(sendComm)`.
    fn close_send(&self, comm: Self::SendComm) -> Result<()>;
    /// `closeRecv(recvComm)`.
    fn close_recv(&self, comm: Self::RecvComm) -> Result<()>;
    /// `closeListen(listenComm)`.
    fn close_listen(&self, listen: Self::ListenComm) -> Result<()>;
    /// `finalize(ctx)`.
    fn finalize(&mut self) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_buffer_fails_closed() {
        let b = SharedBuf::new(4);
        b.lock().unwrap()[0] = 1;
        let b2 = b.clone();
        let _ = std::thread::spawn(move || {
            let _g = b2.lock();
            panic!("poison the buffer");
        })
        .join();
        assert_eq!(b.len(), 4);
        assert!(matches!(b.lock(), Err(Error::Internal(_))));
        assert!(b.raw_parts().is_err());
        assert!(Region::new(&b, 0, 4).is_ok());
    }
}
