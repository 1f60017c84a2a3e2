//! Completion queues and completions.

use super::call::{last_errno, rc_errno, system_error, verbs_call};
use super::context::Context;
use crate::error::{Error, Result};
use rdma_sys::{ibv_cq, ibv_poll_cq, ibv_wc};
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

/// Status of a completion (`enum ibv_wc_status`): the transport's type, whose numbering and texts are
/// libibverbs' (`ibv_wc_status_str`; a test below checks the two agree).
pub use crate::transport::fabric::WcStatus;

/// What completed (`enum ibv_wc_opcode`). Only meaningful when the status is success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    /// A receive consumed by a send.
    Recv,
    /// A receive consumed by an RDMA write with immediate.
    RecvRdmaWithImm,
    Other(u32),
}

impl WcOpcode {
    pub fn from_ibv(v: u32) -> WcOpcode {
        use rdma_sys::ibv_wc_opcode as O;
        match v {
            O::IBV_WC_SEND => WcOpcode::Send,
            O::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            O::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            O::IBV_WC_RECV => WcOpcode::Recv,
            O::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Other(other),
        }
    }
}

/// `IBV_WC_WITH_IMM`.
const WC_WITH_IMM: u32 = 1 << 1;

/// The opcode of a failed completion, which verbs leaves undefined.
pub const UNREPORTED_OPCODE: u32 = u32::MAX;

/// One work completion. On error only `wr_id`, `status`, `qp_num` and `vendor_err` carry what the
/// provider reported; `opcode` is `Other(UNREPORTED_OPCODE)`, `byte_len` 0 and `imm_data` `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred.
    pub byte_len: u32,
    /// Immediate data in host byte order, when the completion carries one.
    pub imm_data: Option<u32>,
    /// Local QP number.
    pub qp_num: u32,
    pub vendor_err: u32,
}

impl Completion {
    /// `Ok(self)` on success, else an error naming the wr_id, the QP and the status text, with the
    /// usual cause of the common failures.
    pub fn ok(self) -> Result<Completion> {
        if self.status.is_success() {
            return Ok(self);
        }
        let cause = match self.status {
            WcStatus::RETRY_EXC_ERR => {
                "; the peer did not acknowledge: no path to its GID from this port (wrong port/GID for \
                 the peer's subnet), a dead link, or the peer's QP is gone"
            }
            WcStatus::RNR_RETRY_EXC_ERR => "; the peer had no receive posted",
            WcStatus::REM_ACCESS_ERR => {
                "; the peer refused the access (wrong rkey or address outside its region)"
            }
            WcStatus::WR_FLUSH_ERR => "; flushed because the queue pair is in the error state",
            _ => "",
        };
        let msg = format!(
            "work request {} on QP {:#x} completed with {} (vendor error {:#x}){cause}",
            self.wr_id, self.qp_num, self.status, self.vendor_err
        );
        Err(if self.status == WcStatus::REM_ACCESS_ERR {
            Error::Remote(msg)
        } else {
            Error::System(msg)
        })
    }

    fn from_wc(wc: &ibv_wc) -> Completion {
        if wc.status != rdma_sys::ibv_wc_status::IBV_WC_SUCCESS {
            // On error only wr_id, status, qp_num and vendor_err are defined (ibv_poll_cq(3)); the
            // provider may leave the rest stale, so none of it is read.
            return Completion {
                wr_id: wc.wr_id,
                status: WcStatus(wc.status),
                opcode: WcOpcode::Other(UNREPORTED_OPCODE),
                byte_len: 0,
                imm_data: None,
                qp_num: wc.qp_num,
                vendor_err: wc.vendor_err,
            };
        }
        let imm_data = (wc.wc_flags & WC_WITH_IMM != 0).then(|| {
            // SAFETY: with IBV_WC_WITH_IMM the union holds imm_data; any u32 is valid anyway.
            u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
        });
        Completion {
            wr_id: wc.wr_id,
            status: WcStatus(wc.status),
            opcode: WcOpcode::from_ibv(wc.opcode),
            byte_len: wc.byte_len,
            imm_data,
            qp_num: wc.qp_num,
            vendor_err: wc.vendor_err,
        }
    }
}

/// A completion queue (`ibv_cq`). Holds its [`Context`].
pub struct CompletionQueue {
    cq: NonNull<ibv_cq>,
    ctx: Arc<Context>,
    depth: u32,
}

// SAFETY: ibv_poll_cq and ibv_destroy_cq are thread-safe (providers lock the CQ).
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.ctx.name())
            .field("depth", &self.depth)
            .finish()
    }
}

/// Completions read per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

impl CompletionQueue {
    /// `ibv_create_cq` with at least `depth` entries (no completion channel: polled).
    pub fn new(ctx: &Arc<Context>, depth: u32) -> Result<Arc<CompletionQueue>> {
        let cqe = c_int::try_from(depth)
            .ok()
            .filter(|&d| d > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("CQ depth {depth}: accepted 1..={}", c_int::MAX))
            })?;
        let v = ctx.lib();
        // SAFETY: live context; no channel, no user context.
        let cq = unsafe {
            verbs_call!(
                ptr v.create_cq(ctx.as_ptr(), cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0),
                "{} depth {depth}",
                ctx.name()
            )
        }?;
        // SAFETY: live CQ; `cqe` is the actual size the provider chose.
        let actual = u32::try_from(unsafe { cq.as_ref() }.cqe).unwrap_or(depth);
        Ok(Arc::new(CompletionQueue {
            cq,
            ctx: Arc::clone(ctx),
            depth: actual,
        }))
    }

    /// Actual number of entries.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }

    /// Polls up to `max` completions, appending them to `out`; returns how many were added
    /// (0 when the queue is empty). Failed completions are returned, not turned into errors:
    /// check [`Completion::status`] or call [`Completion::ok`]. Err only if polling itself fails.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut total = 0;
        while total < max {
            let want = (max - total).min(POLL_BATCH);
            // Zeroed, not uninitialised: a provider may fill only the fields that are defined for a
            // completion's status, and every field is read as plain data below.
            // SAFETY: ibv_wc is plain old data (integers and a union of integers); all-zero is valid.
            let mut wcs: [ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
            // SAFETY: live CQ; `wcs` has room for `want` ≤ POLL_BATCH entries; the provider writes the
            // first `n` of them. (`want` fits c_int: ≤ 32.)
            let n = unsafe { ibv_poll_cq(self.as_ptr(), want as c_int, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(system_error(
                    format!("ibv_poll_cq({})", self.ctx.name()),
                    rc_errno(n, last_errno()),
                ));
            }
            let n = n as usize;
            for wc in wcs.get(..n).unwrap_or(&[]) {
                out.push(Completion::from_wc(wc));
            }
            total += n;
            if n < want {
                break;
            }
        }
        Ok(total)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq, destroyed once; every QP using it holds an Arc, so none is
        // alive. The Context is held by `self.ctx` and dropped after.
        let rc = unsafe { (self.ctx.lib().destroy_cq)(self.cq.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "{}",
                system_error(
                    format!("ibv_destroy_cq({})", self.ctx.name()),
                    rc_errno(rc, last_errno())
                )
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_completion_reads_only_the_fields_verbs_defines() {
        // SAFETY: ibv_wc is plain old data; all-zero is valid.
        let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
        wc.wr_id = 7;
        wc.status = rdma_sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
        wc.qp_num = 0x11;
        wc.vendor_err = 0x22;
        // Stale values a provider may leave behind on error.
        wc.opcode = rdma_sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
        wc.byte_len = 4096;
        wc.wc_flags = WC_WITH_IMM;
        let c = Completion::from_wc(&wc);
        assert_eq!(c.wr_id, 7);
        assert_eq!((c.qp_num, c.vendor_err), (0x11, 0x22));
        assert_eq!(c.opcode, WcOpcode::Other(UNREPORTED_OPCODE));
        assert_eq!((c.byte_len, c.imm_data), (0, None));
        assert!(c.ok().is_err());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "calls libibverbs (ibv_wc_status_str); Miri cannot call C"
    )]
    fn status_texts_agree_with_libibverbs() {
        // Every status libibverbs knows (0..=21; 22 and up are tag-matching or unknown).
        for s in 0..=21u32 {
            // SAFETY: ibv_wc_status_str accepts any value and returns a static string.
            let p = unsafe { rdma_sys::ibv_wc_status_str(s) };
            assert!(!p.is_null());
            // SAFETY: non-NULL pointer to a static NUL-terminated string inside libibverbs.
            let lib = unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap();
            assert_eq!(WcStatus(s).text(), lib, "status {s}");
        }
        assert_eq!(WcStatus(9999).text(), "unknown");
        assert_eq!(
            WcStatus::RETRY_EXC_ERR.to_string(),
            "transport retry counter exceeded (status 12)"
        );
    }

    fn wc(status: u32, opcode: u32, flags: u32, imm_be: u32) -> ibv_wc {
        // SAFETY: ibv_wc is plain old data; all-zero is valid.
        let mut w: ibv_wc = unsafe { std::mem::zeroed() };
        w.wr_id = 42;
        w.status = status;
        w.opcode = opcode;
        w.wc_flags = flags;
        w.byte_len = 1 << 20;
        w.qp_num = 0x11;
        w.imm_data_invalidated_rkey_union.imm_data = imm_be;
        w
    }

    #[test]
    fn completions_decode_imm_in_host_order() {
        let c = Completion::from_wc(&wc(0, 129, WC_WITH_IMM, 0xdead_beef_u32.to_be()));
        assert_eq!(c.imm_data, Some(0xdead_beef));
        assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(c.byte_len, 1 << 20);
        assert!(c.ok().is_ok());
        let c = Completion::from_wc(&wc(0, 1, 0, 7));
        assert_eq!(c.imm_data, None);
        assert_eq!(c.opcode, WcOpcode::RdmaWrite);
    }

    #[test]
    fn failed_completions_explain() {
        let e = Completion::from_wc(&wc(12, 0, 0, 0)).ok().unwrap_err();
        let m = e.to_string();
        assert!(m.contains("work request 42 on QP 0x11"), "{m}");
        assert!(
            m.contains("transport retry counter exceeded (status 12)"),
            "{m}"
        );
        assert!(m.contains("no path to its GID"), "{m}");
        assert!(matches!(
            Completion::from_wc(&wc(10, 0, 0, 0)).ok(),
            Err(Error::Remote(_))
        ));
        assert_eq!(WcOpcode::from_ibv(77), WcOpcode::Other(77));
    }
}
