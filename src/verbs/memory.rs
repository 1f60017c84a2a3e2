//! Protection domains and memory regions (a page-aligned host buffer for tests is [`crate::sys::HostBuffer`]).

use super::call::{last_errno, rc_errno, system_error, verbs_call};
use super::context::Context;
use super::sym::optional_symbols;
use super::types::Access;
use crate::error::{Error, Result};
use rdma_sys::{ibv_mr, ibv_pd};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

/// A protection domain (`ibv_pd`). Holds its [`Context`].
pub struct ProtectionDomain {
    pd: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread (thread-safe verbs API).
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; `&ProtectionDomain` only exposes thread-safe verbs calls.
unsafe impl Sync for ProtectionDomain {}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.ctx.name())
            .finish()
    }
}

impl ProtectionDomain {
    /// `ibv_alloc_pd`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        let v = ctx.lib();
        // SAFETY: `ctx` is a live opened device.
        let pd = unsafe { verbs_call!(ptr v.alloc_pd(ctx.as_ptr()), "{}", ctx.name()) }?;
        Ok(Arc::new(ProtectionDomain {
            pd,
            ctx: Arc::clone(ctx),
        }))
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd, freed once; every MR and QP of this PD holds an Arc to
        // it, so none is alive. The Context (held by `self.ctx`) is dropped after this.
        let rc = unsafe { (self.ctx.lib().dealloc_pd)(self.pd.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "{}",
                system_error(
                    format!("ibv_dealloc_pd({})", self.ctx.name()),
                    rc_errno(rc, last_errno())
                )
            );
        }
    }
}

/// A registered memory region (`ibv_mr`). Holds its [`ProtectionDomain`].
pub struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    pd: Arc<ProtectionDomain>,
    dmabuf: bool,
}

// SAFETY: an ibv_mr is immutable after registration; keys and addresses may be read anywhere, and
// ibv_dereg_mr is thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("dmabuf", &self.dmabuf)
            .finish()
    }
}

impl MemoryRegion {
    /// Registers `len` bytes of host (or GPU, with peer-memory) memory at `addr` with `access`
    /// (normally [`Access::RDMA`]).
    ///
    /// # Safety
    /// `addr..addr+len` must stay mapped, and not be reused for anything the NIC must not touch,
    /// until this `MemoryRegion` is dropped: remote peers with the rkey, and local work requests with
    /// the lkey, read and write it by DMA.
    pub unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register an empty memory region (length 0)".into(),
            ));
        }
        let access_c = i32::try_from(access.0).map_err(|_| {
            Error::InvalidArgument(format!("access flags {:#x} out of range", access.0))
        })?;
        let v = pd.context().lib();
        // SAFETY: live PD; the caller guarantees the range stays valid for the MR's lifetime.
        let mr = unsafe {
            verbs_call!(
                ptr v.reg_mr(pd.as_ptr(), addr.cast(), len, access_c),
                "{} addr {:#x} len {len} bytes access {:#x}",
                pd.context().name(),
                addr as usize,
                access.0
            )
        }?;
        Ok(MemoryRegion {
            mr,
            pd: Arc::clone(pd),
            dmabuf: false,
        })
    }

    /// Registers `len` bytes at `offset` of a DMA-BUF (`ibv_reg_dmabuf_mr`), addressed by remote
    /// peers as `iova`. Fails with a clear error when libibverbs is older than rdma-core 34.
    /// The kernel takes its own reference on the DMA-BUF, so `fd` may be closed afterwards.
    pub fn register_dmabuf(
        pd: &Arc<ProtectionDomain>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: BorrowedFd<'_>,
        access: Access,
    ) -> Result<MemoryRegion> {
        let f = optional_symbols().reg_dmabuf_mr.ok_or_else(|| {
            Error::System(
                "DMA-BUF registration is unavailable: libibverbs lacks ibv_reg_dmabuf_mr@IBVERBS_1.12 \
                 (rdma-core 34 or newer is needed)"
                    .into(),
            )
        })?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "cannot register an empty DMA-BUF region (length 0)".into(),
            ));
        }
        let access_c = i32::try_from(access.0).map_err(|_| {
            Error::InvalidArgument(format!("access flags {:#x} out of range", access.0))
        })?;
        // SAFETY: `f` is ibv_reg_dmabuf_mr (signature checked in sym.rs); live PD; the fd is open for
        // the call (BorrowedFd) and the kernel pins the DMA-BUF itself, so no user memory is at risk.
        let p = unsafe { f(pd.as_ptr(), offset, len, iova, fd.as_raw_fd(), access_c) };
        let mr = super::call::check_ptr(
            format!(
                "ibv_reg_dmabuf_mr({} fd {} offset {offset} len {len} bytes)",
                pd.context().name(),
                fd.as_raw_fd()
            ),
            p,
        )?;
        Ok(MemoryRegion {
            mr,
            pd: Arc::clone(pd),
            dmabuf: true,
        })
    }

    fn raw(&self) -> &ibv_mr {
        // SAFETY: the MR is live while `self` is; libibverbs never changes these fields after reg.
        unsafe { self.mr.as_ref() }
    }

    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.raw().lkey
    }

    /// Remote key, for peers.
    pub fn rkey(&self) -> u32 {
        self.raw().rkey
    }

    /// Start address (for a DMA-BUF region, the address libibverbs reports).
    pub fn addr(&self) -> u64 {
        self.raw().addr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.raw().length
    }

    /// Never true (registration refuses empty ranges); for the `len` convention.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registered through DMA-BUF.
    pub fn is_dmabuf(&self) -> bool {
        self.dmabuf
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

/// Whether a device's kernel driver registers DMA-BUF memory, as [`probe_dmabuf`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DmabufSupport {
    /// The driver takes DMA-BUF registrations (the probe was refused only for its invalid fd).
    Supported,
    /// libibverbs has no `ibv_reg_dmabuf_mr` (rdma-core older than 34).
    NoLibrarySymbol,
    /// The provider or kernel driver refused the call itself (`errno` EOPNOTSUPP or EPROTONOSUPPORT).
    NotSupportedByDriver(i32),
}

impl DmabufSupport {
    /// Reads the errno of the probe registration (fd -1), as NCCL's IB transport does: only
    /// EOPNOTSUPP and EPROTONOSUPPORT mean "this driver has no DMA-BUF"; anything else (EBADF for the
    /// invalid fd, normally) means the driver got as far as looking at the fd.
    pub fn from_probe_errno(errno: i32) -> DmabufSupport {
        if errno == libc::EOPNOTSUPP || errno == libc::EPROTONOSUPPORT {
            DmabufSupport::NotSupportedByDriver(errno)
        } else {
            DmabufSupport::Supported
        }
    }

    pub fn is_supported(self) -> bool {
        self == DmabufSupport::Supported
    }

    /// For the init log: "supported", or why not.
    pub fn describe(self) -> String {
        match self {
            DmabufSupport::Supported => "supported".into(),
            DmabufSupport::NoLibrarySymbol => {
                "not supported: libibverbs lacks ibv_reg_dmabuf_mr (rdma-core 34 or newer is needed)".into()
            }
            DmabufSupport::NotSupportedByDriver(e) => format!(
                "not supported by the kernel driver or provider (probe registration: {})",
                std::io::Error::from_raw_os_error(e)
            ),
        }
    }
}

/// Asks `pd`'s device whether it registers DMA-BUF memory: `ibv_reg_dmabuf_mr` with fd -1 and
/// length 0 can never succeed, and the errno says whether the driver implements the call. A
/// library symbol alone is not enough: soft-RoCE (rxe) and older kernels refuse every DMA-BUF, and
/// NCCL would then fail its first GPU buffer registration instead of using peer memory.
pub fn probe_dmabuf(pd: &ProtectionDomain) -> DmabufSupport {
    let Some(f) = optional_symbols().reg_dmabuf_mr else {
        return DmabufSupport::NoLibrarySymbol;
    };
    // SAFETY: `f` is ibv_reg_dmabuf_mr (signature checked in sym.rs) on a live PD; fd -1 names no
    // file, so no memory is registered; errno is read right after the call.
    let p = unsafe { f(pd.as_ptr(), 0, 0, 0, -1, 0) };
    let errno = last_errno();
    match NonNull::new(p) {
        Some(mr) => {
            // Not expected (fd -1); a registration means the driver took the call, so release it.
            // SAFETY: `mr` was just returned by ibv_reg_dmabuf_mr and is deregistered once here.
            let rc = unsafe { (pd.context().lib().dereg_mr)(mr.as_ptr()) };
            if rc != 0 {
                tracing::warn!(
                    "{}",
                    system_error(
                        format!("ibv_dereg_mr({} DMA-BUF probe)", pd.context().name()),
                        rc_errno(rc, last_errno())
                    )
                );
            }
            DmabufSupport::Supported
        }
        None => DmabufSupport::from_probe_errno(errno),
    }
}

/// Runs [`probe_dmabuf`] on an opened device, in a protection domain of its own (released after).
pub fn probe_dmabuf_context(ctx: &Arc<Context>) -> Result<DmabufSupport> {
    let pd = ProtectionDomain::new(ctx)?;
    Ok(probe_dmabuf(&pd))
}

/// Opens RDMA device `name` and runs [`probe_dmabuf_context`] (for the CLI; the plugin probes the
/// contexts it keeps open).
pub fn probe_dmabuf_device(name: &str) -> Result<DmabufSupport> {
    probe_dmabuf_context(&Context::open(name)?)
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr/ibv_reg_dmabuf_mr and deregistered once; the PD is held.
        let rc = unsafe { (self.pd.context().lib().dereg_mr)(self.mr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "{}",
                system_error(
                    format!("ibv_dereg_mr({})", self.pd.context().name()),
                    rc_errno(rc, last_errno())
                )
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DmabufSupport;

    #[test]
    fn probe_errno_reads_like_nccl() {
        for e in [libc::EOPNOTSUPP, libc::EPROTONOSUPPORT] {
            assert_eq!(
                DmabufSupport::from_probe_errno(e),
                DmabufSupport::NotSupportedByDriver(e)
            );
        }
        // The invalid fd is what a DMA-BUF-capable driver complains about; other errors (a check
        // before the fd) do not prove the driver lacks DMA-BUF either.
        for e in [libc::EBADF, libc::EINVAL, libc::ENOMEM, 0] {
            assert!(
                DmabufSupport::from_probe_errno(e).is_supported(),
                "errno {e}"
            );
        }
        let d = DmabufSupport::NotSupportedByDriver(libc::EOPNOTSUPP).describe();
        assert!(d.starts_with("not supported by the kernel driver"), "{d}");
        assert!(d.contains("not supported"), "{d}");
        assert!(
            DmabufSupport::NoLibrarySymbol
                .describe()
                .contains("rdma-core 34")
        );
        assert_eq!(DmabufSupport::Supported.describe(), "supported");
    }
}
