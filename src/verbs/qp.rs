//! Reliable-connected queue pairs: creation, the INIT → RTR → RTS transitions for RoCE v2, and
//! posting RDMA writes (with or without immediate), RDMA reads and receives.

use super::call::{last_errno, rc_errno, system_error, verbs_call};
use super::cq::CompletionQueue;
use super::memory::ProtectionDomain;
use super::types::{Access, Mtu};
use crate::error::{Error, Result};
use rdma_sys::{
    ibv_post_recv, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask as M, ibv_qp_init_attr,
    ibv_qp_state, ibv_qp_type, ibv_recv_wr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode,
};
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// Most scatter/gather entries one work request may carry here.
pub const MAX_SGE: usize = 16;

/// Largest QP number / PSN (24 bits).
pub const MAX_QPN: u32 = 0x00ff_ffff;

/// Requested QP capacities (the device may grant more; see [`QueuePair::caps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    /// Largest inline payload in bytes.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }
}

/// One local scatter/gather element: `length` bytes at `addr` in the region with key `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A peer's memory: address and rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    pub addr: u64,
    pub rkey: u32,
}

/// Most writes posted by one `ibv_post_send` in [`QueuePair::post_rdma_writes`].
pub const CHAIN_MAX: usize = 8;

/// One RDMA write of [`QueuePair::post_rdma_writes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteReq {
    pub wr_id: u64,
    /// Source in registered memory; `None` writes 0 bytes (`num_sge = 0`, an immediate-only write).
    pub local: Option<Sge>,
    pub remote: RemoteAddr,
    /// Immediate in host order (sent in network order); consumes a receive at the peer.
    pub imm: Option<u32>,
    pub flags: SendFlags,
    /// Copy the payload into the work request (`IBV_SEND_INLINE`).
    pub inline: bool,
}

/// Attributes of the RTR transition (RoCE v2: `is_global = 1` with a GRH).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrParams {
    pub remote_qpn: u32,
    /// The peer's send PSN (our receive PSN).
    pub remote_psn: u32,
    /// The peer's GID.
    pub dgid: [u8; 16],
    /// Our GID index on the port given to [`QueuePair::to_init`].
    pub sgid_index: u8,
    /// Path MTU: at most the smaller active MTU of the two ports.
    pub path_mtu: Mtu,
    pub traffic_class: u8,
    /// Service level, 0..=15.
    pub sl: u8,
    pub hop_limit: u8,
    /// RNR NAK timer code, 0..=31.
    pub min_rnr_timer: u8,
    /// RDMA reads this QP answers at once (responder), ≥ 1 to serve reads.
    pub max_dest_rd_atomic: u8,
}

impl RtrParams {
    /// NCCL's IB transport's values (`net_ib` RTR/RTS): PSN 0, TC 0, SL 0, hop limit 255, RNR timer 12,
    /// one outstanding read.
    pub fn new(remote_qpn: u32, dgid: [u8; 16], sgid_index: u8, path_mtu: Mtu) -> RtrParams {
        RtrParams {
            remote_qpn,
            remote_psn: 0,
            dgid,
            sgid_index,
            path_mtu,
            traffic_class: 0,
            sl: 0,
            hop_limit: 255,
            min_rnr_timer: 12,
            max_dest_rd_atomic: 1,
        }
    }

    /// Applies `NCCL_IB_TC` / `NCCL_IB_SL` as NCCL does (`connect.cc`): the variable when set, else
    /// the communicator's traffic class (ABI v11+ `ncclNetCommConfig_t.trafficClass`, `None` when
    /// undefined), else 0. A communicator traffic class above 15 is not used as the SL.
    pub fn with_config(
        self,
        cfg: &crate::config::Config,
        comm_traffic_class: Option<u8>,
    ) -> RtrParams {
        RtrParams {
            traffic_class: cfg.ib_tc.or(comm_traffic_class).unwrap_or(0),
            sl: cfg
                .ib_sl
                .or(comm_traffic_class.filter(|t| *t <= 15))
                .unwrap_or(0),
            ..self
        }
    }

    /// Checks every field against its range; the error names the field, value and range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: u64, range: &str| {
            Err(Error::InvalidArgument(format!(
                "RTR {what} {v} is out of range {range}"
            )))
        };
        if self.remote_qpn > MAX_QPN {
            return bad("remote_qpn", self.remote_qpn.into(), "0..=0xffffff");
        }
        if self.remote_psn > MAX_QPN {
            return bad("remote_psn", self.remote_psn.into(), "0..=0xffffff");
        }
        if self.sl > 15 {
            return bad("sl", self.sl.into(), "0..=15");
        }
        if self.min_rnr_timer > 31 {
            return bad("min_rnr_timer", self.min_rnr_timer.into(), "0..=31");
        }
        if self.hop_limit == 0 {
            return bad("hop_limit", 0, "1..=255");
        }
        if self.dgid == [0; 16] {
            return Err(Error::InvalidArgument(
                "RTR dgid is all zeros; the peer's GID is needed".into(),
            ));
        }
        Ok(())
    }
}

/// Attributes of the RTS transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsParams {
    /// Our send PSN (the peer's `remote_psn`).
    pub psn: u32,
    /// Local ACK timeout exponent, 0..=31 (4.096 µs × 2^t; 0 = infinite).
    pub timeout: u8,
    /// Transport retries, 0..=7.
    pub retry_cnt: u8,
    /// RNR retries, 0..=7 (7 = infinite).
    pub rnr_retry: u8,
    /// RDMA reads this QP issues at once (initiator).
    pub max_rd_atomic: u8,
}

impl Default for RtsParams {
    /// NCCL's values: PSN 0, timeout 20, retry 7, RNR retry 7, one outstanding read.
    fn default() -> Self {
        RtsParams {
            psn: 0,
            timeout: crate::config::DEFAULT_IB_TIMEOUT,
            retry_cnt: crate::config::DEFAULT_IB_RETRY_CNT,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

impl RtsParams {
    /// Defaults with `NCCL_IB_TIMEOUT` / `NCCL_IB_RETRY_CNT` from the configuration.
    pub fn from_config(cfg: &crate::config::Config) -> RtsParams {
        RtsParams {
            timeout: cfg.ib_timeout,
            retry_cnt: cfg.ib_retry_cnt,
            ..RtsParams::default()
        }
    }

    /// Checks every field against its range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: u64, range: &str| {
            Err(Error::InvalidArgument(format!(
                "RTS {what} {v} is out of range {range}"
            )))
        };
        if self.psn > MAX_QPN {
            return bad("psn", self.psn.into(), "0..=0xffffff");
        }
        if self.timeout > 31 {
            return bad("timeout", self.timeout.into(), "0..=31");
        }
        if self.retry_cnt > 7 {
            return bad("retry_cnt", self.retry_cnt.into(), "0..=7");
        }
        if self.rnr_retry > 7 {
            return bad("rnr_retry", self.rnr_retry.into(), "0..=7");
        }
        Ok(())
    }
}

/// Options of a send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags {
    /// Generate a completion on the send CQ.
    pub signaled: bool,
    /// Wait for earlier RDMA reads to finish first (`IBV_SEND_FENCE`).
    pub fence: bool,
}

impl SendFlags {
    pub const SIGNALED: SendFlags = SendFlags {
        signaled: true,
        fence: false,
    };
    pub const UNSIGNALED: SendFlags = SendFlags {
        signaled: false,
        fence: false,
    };

    fn bits(self, inline: bool) -> u32 {
        let mut b = 0;
        if self.signaled {
            b |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if self.fence {
            b |= ibv_send_flags::IBV_SEND_FENCE.0;
        }
        if inline {
            b |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        b
    }
}

/// A reliable-connected queue pair (`IBV_QPT_RC`). Holds its PD and CQs, so they outlive it.
pub struct QueuePair {
    qp: NonNull<ibv_qp>,
    caps: QpCaps,
    /// Local port set by `to_init` (0 before).
    port: AtomicU8,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
}

// SAFETY: ibv_post_send/ibv_post_recv/ibv_modify_qp/ibv_destroy_qp are thread-safe (providers lock
// the queues); the struct's own state is an atomic.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("device", &self.device())
            .field("qp_num", &format_args!("{:#x}", self.qp_num()))
            .field("port", &self.port.load(Ordering::Relaxed))
            .field("caps", &self.caps)
            .finish()
    }
}

impl QueuePair {
    /// `ibv_create_qp` of an RC QP. `sq_sig_all` is off: each work request chooses.
    pub fn new_rc(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QueuePair> {
        let same_dev = |cq: &Arc<CompletionQueue>| Arc::ptr_eq(cq.context(), pd.context());
        if !same_dev(send_cq) || !same_dev(recv_cq) {
            return Err(Error::InvalidArgument(
                "the QP's completion queues belong to another device than its protection domain"
                    .into(),
            ));
        }
        if caps.max_send_sge as usize > MAX_SGE || caps.max_recv_sge as usize > MAX_SGE {
            return Err(Error::InvalidArgument(format!(
                "QP SGE counts {}/{} exceed {MAX_SGE}",
                caps.max_send_sge, caps.max_recv_sge
            )));
        }
        // SAFETY: ibv_qp_init_attr is plain old data; all-zero is valid (NULL srq/context).
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.as_ptr();
        init.recv_cq = recv_cq.as_ptr();
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = caps.max_send_wr;
        init.cap.max_recv_wr = caps.max_recv_wr;
        init.cap.max_send_sge = caps.max_send_sge;
        init.cap.max_recv_sge = caps.max_recv_sge;
        init.cap.max_inline_data = caps.max_inline_data;
        let dev = pd.context().name();
        let v = pd.context().lib();
        // SAFETY: live PD and CQs of the same device; `init` is fully initialised.
        let qp = unsafe {
            verbs_call!(
                ptr v.create_qp(pd.as_ptr(), &mut init),
                "{dev} RC send_wr {} recv_wr {} send_sge {} recv_sge {} inline {} bytes",
                caps.max_send_wr,
                caps.max_recv_wr,
                caps.max_send_sge,
                caps.max_recv_sge,
                caps.max_inline_data
            )
        }?;
        // ibv_create_qp writes the granted capacities back into `init.cap`.
        let granted = QpCaps {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge.min(MAX_SGE as u32),
            max_recv_sge: init.cap.max_recv_sge.min(MAX_SGE as u32),
            max_inline_data: init.cap.max_inline_data,
        };
        Ok(QueuePair {
            qp,
            caps: granted,
            port: AtomicU8::new(0),
            pd: Arc::clone(pd),
            send_cq: Arc::clone(send_cq),
            recv_cq: Arc::clone(recv_cq),
        })
    }

    /// The QP number the peer needs.
    /// The local port the QP was bound to by [`to_init`](Self::to_init) (0 before).
    pub fn port(&self) -> u8 {
        self.port.load(Ordering::Relaxed)
    }

    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP; qp_num is fixed at creation.
        unsafe { self.qp.as_ref() }.qp_num
    }

    /// The granted capacities.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    fn device(&self) -> &str {
        self.pd.context().name()
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: u32, what: &str) -> Result<()> {
        let mask_c = c_int::try_from(mask)
            .map_err(|_| Error::Internal(format!("QP attribute mask {mask:#x} out of range")))?;
        let (dev, qpn, port) = (
            self.device(),
            self.qp_num(),
            self.port.load(Ordering::Relaxed),
        );
        let v = self.pd.context().lib();
        // SAFETY: live QP; `attr` is initialised for every bit in `mask`.
        unsafe {
            verbs_call!(
                rc v.modify_qp(self.qp.as_ptr(), attr, mask_c),
                "{what} on {dev} port {port} QP {qpn:#x}"
            )
        }
    }

    /// RESET → INIT on local `port` (1-based) with remote `access` (normally [`Access::RDMA`]
    /// minus LOCAL_WRITE, which QPs ignore).
    pub fn to_init(&self, port: u8, access: Access) -> Result<()> {
        if port == 0 {
            return Err(Error::InvalidArgument(
                "port 0: ports are numbered from 1".into(),
            ));
        }
        self.port.store(port, Ordering::Relaxed);
        // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = access.0;
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_PKEY_INDEX.0
            | M::IBV_QP_PORT.0
            | M::IBV_QP_ACCESS_FLAGS.0;
        self.modify(&mut a, mask, "INIT")
    }

    /// INIT → RTR towards the peer's QP, over RoCE v2 (GRH with `dgid`, `sgid_index`).
    pub fn to_rtr(&self, p: &RtrParams) -> Result<()> {
        p.validate()?;
        let port = self.port.load(Ordering::Relaxed);
        if port == 0 {
            return Err(Error::InvalidArgument(
                "RTR before INIT: call to_init first".into(),
            ));
        }
        // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = p.path_mtu.to_ibv();
        a.dest_qp_num = p.remote_qpn;
        a.rq_psn = p.remote_psn;
        a.max_dest_rd_atomic = p.max_dest_rd_atomic;
        a.min_rnr_timer = p.min_rnr_timer;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid.raw = p.dgid;
        a.ah_attr.grh.sgid_index = p.sgid_index;
        a.ah_attr.grh.hop_limit = p.hop_limit;
        a.ah_attr.grh.traffic_class = p.traffic_class;
        a.ah_attr.grh.flow_label = 0;
        a.ah_attr.dlid = 0;
        a.ah_attr.sl = p.sl;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = port;
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_AV.0
            | M::IBV_QP_PATH_MTU.0
            | M::IBV_QP_DEST_QPN.0
            | M::IBV_QP_RQ_PSN.0
            | M::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | M::IBV_QP_MIN_RNR_TIMER.0;
        let what = format!(
            "RTR to QP {:#x} GID {} sgid_index {} MTU {} bytes",
            p.remote_qpn,
            super::types::Gid(p.dgid),
            p.sgid_index,
            p.path_mtu.bytes()
        );
        self.modify(&mut a, mask, &what)
    }

    /// RTR → RTS.
    pub fn to_rts(&self, p: &RtsParams) -> Result<()> {
        p.validate()?;
        // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = p.psn;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        a.max_rd_atomic = p.max_rd_atomic;
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_SQ_PSN.0
            | M::IBV_QP_TIMEOUT.0
            | M::IBV_QP_RETRY_CNT.0
            | M::IBV_QP_RNR_RETRY.0
            | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
        self.modify(&mut a, mask, "RTS")
    }

    /// Any state → ERR: outstanding work requests complete with `WR_FLUSH_ERR` (used at close).
    pub fn to_error(&self) -> Result<()> {
        // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, M::IBV_QP_STATE.0, "ERR")
    }

    fn sges(&self, local: &[Sge], max: u32, what: &str) -> Result<([ibv_sge; MAX_SGE], c_int)> {
        if local.len() > max as usize {
            return Err(Error::InvalidArgument(format!(
                "{what} with {} SGEs; this QP accepts at most {max}",
                local.len()
            )));
        }
        let mut out = [ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_SGE];
        for (o, s) in out.iter_mut().zip(local) {
            *o = ibv_sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            };
        }
        Ok((out, local.len() as c_int))
    }

    fn post_send_wr(&self, wr: &mut ibv_send_wr, what: &str) -> Result<()> {
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; `wr` is one fully initialised request (next = NULL) whose sg_list points to
        // an array alive for this call (providers copy it, or the inline bytes, before returning).
        let rc = unsafe { ibv_post_send(self.qp.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(system_error(
                format!(
                    "ibv_post_send({what} wr_id {} on {} QP {:#x})",
                    wr.wr_id,
                    self.device(),
                    self.qp_num()
                ),
                rc_errno(rc, last_errno()),
            ));
        }
        Ok(())
    }

    fn send_wr(
        wr_id: u64,
        opcode: u32,
        sge: &mut [ibv_sge; MAX_SGE],
        n: c_int,
        flags: u32,
        remote: RemoteAddr,
        imm: Option<u32>,
    ) -> ibv_send_wr {
        // SAFETY: ibv_send_wr is plain old data; all-zero is valid (NULL next).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.next = std::ptr::null_mut();
        wr.sg_list = if n > 0 {
            sge.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        };
        wr.num_sge = n;
        wr.opcode = opcode;
        wr.send_flags = flags;
        if let Some(imm) = imm {
            wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        wr.wr.rdma = rdma_sys::rdma_t {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        };
        wr
    }

    /// Posts an RDMA write of the `local` SGEs (registered memory) to `remote`, with immediate data
    /// `imm` (host order; consumes a receive at the peer) when given. An empty `local` writes 0
    /// bytes (an immediate-only notification).
    pub fn post_rdma_write(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: RemoteAddr,
        imm: Option<u32>,
        flags: SendFlags,
    ) -> Result<()> {
        let (mut sge, n) = self.sges(local, self.caps.max_send_sge, "RDMA write")?;
        let opcode = if imm.is_some() {
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            ibv_wr_opcode::IBV_WR_RDMA_WRITE
        };
        let mut wr = Self::send_wr(wr_id, opcode, &mut sge, n, flags.bits(false), remote, imm);
        self.post_send_wr(&mut wr, "RDMA write")
    }

    /// Posts an RDMA write whose payload is copied into the work request at post time
    /// (`IBV_SEND_INLINE`): no memory registration needed, `data` may be reused at once.
    /// `data.len()` must not exceed [`QpCaps::max_inline_data`].
    pub fn post_rdma_write_inline(
        &self,
        wr_id: u64,
        data: &[u8],
        remote: RemoteAddr,
        imm: Option<u32>,
        flags: SendFlags,
    ) -> Result<()> {
        if data.len() > self.caps.max_inline_data as usize {
            return Err(Error::InvalidArgument(format!(
                "inline RDMA write of {} bytes; this QP inlines at most {} bytes",
                data.len(),
                self.caps.max_inline_data
            )));
        }
        let mut sge = [ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_SGE];
        sge[0] = ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32, // ≤ max_inline_data (u32)
            lkey: 0,
        };
        let n = c_int::from(!data.is_empty());
        let opcode = if imm.is_some() {
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
        } else {
            ibv_wr_opcode::IBV_WR_RDMA_WRITE
        };
        let mut wr = Self::send_wr(wr_id, opcode, &mut sge, n, flags.bits(true), remote, imm);
        self.post_send_wr(&mut wr, "inline RDMA write")
    }

    /// Posts a chain of RDMA writes with one `ibv_post_send` (one doorbell per [`CHAIN_MAX`] writes),
    /// executed in order. A write with `inline` copies its payload (≤ [`QpCaps::max_inline_data`]
    /// bytes) into the work request at post time. On error, the writes before the failing one were
    /// posted (as with verbs' `bad_wr`); the error names the failing index.
    pub fn post_rdma_writes(&self, reqs: &[WriteReq]) -> Result<()> {
        for (c, chunk) in reqs.chunks(CHAIN_MAX).enumerate() {
            let mut sges = [ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; CHAIN_MAX];
            // SAFETY: ibv_send_wr is plain old data; all-zero is valid (NULL next and sg_list).
            let mut wrs: [ibv_send_wr; CHAIN_MAX] = unsafe { std::mem::zeroed() };
            for (i, r) in chunk.iter().enumerate() {
                let len = r.local.map_or(0, |l| l.length);
                if r.inline && len > self.caps.max_inline_data {
                    return Err(Error::InvalidArgument(format!(
                        "inline RDMA write of {len} bytes; this QP inlines at most {} bytes",
                        self.caps.max_inline_data
                    )));
                }
                if let Some(l) = r.local {
                    sges[i] = ibv_sge {
                        addr: l.addr,
                        length: l.length,
                        lkey: l.lkey,
                    };
                }
            }
            let n = chunk.len();
            let sg = sges.as_mut_ptr();
            for (i, r) in chunk.iter().enumerate() {
                let w = &mut wrs[i];
                w.wr_id = r.wr_id;
                w.sg_list = if r.local.is_some() {
                    // SAFETY: `i < n ≤ CHAIN_MAX`, so the offset stays inside `sges`, which is not
                    // touched again and outlives the post below.
                    unsafe { sg.add(i) }
                } else {
                    std::ptr::null_mut()
                };
                w.num_sge = c_int::from(r.local.is_some());
                w.opcode = if r.imm.is_some() {
                    ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    ibv_wr_opcode::IBV_WR_RDMA_WRITE
                };
                w.send_flags = r.flags.bits(r.inline && r.local.is_some());
                if let Some(imm) = r.imm {
                    w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                }
                w.wr.rdma = rdma_sys::rdma_t {
                    remote_addr: r.remote.addr,
                    rkey: r.remote.rkey,
                };
            }
            // Link the chain through one base pointer (no reference to `wrs` is made after this).
            let base = wrs.as_mut_ptr();
            for i in 0..n.saturating_sub(1) {
                // SAFETY: `i + 1 < n ≤ CHAIN_MAX`: both offsets are inside `wrs`; `next` is NULL
                // (zeroed) for the last request.
                unsafe { (*base.add(i)).next = base.add(i + 1) };
            }
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            // SAFETY: live QP; `wrs[..n]` is a NULL-terminated chain of initialised requests whose
            // SGE pointers point into `sges`; both arrays live until after the call (the provider
            // copies the requests, and inline payloads, before returning).
            let rc = unsafe { ibv_post_send(self.qp.as_ptr(), base, &mut bad) };
            if rc != 0 {
                let failed = if bad.is_null() {
                    0
                } else {
                    (bad as usize - base as usize) / std::mem::size_of::<ibv_send_wr>()
                };
                return Err(system_error(
                    format!(
                        "ibv_post_send(chain of {n} RDMA writes, write {} failed, on {} QP {:#x})",
                        c * CHAIN_MAX + failed,
                        self.device(),
                        self.qp_num()
                    ),
                    rc_errno(rc, last_errno()),
                ));
            }
        }
        Ok(())
    }

    /// Posts an RDMA read of `remote` into the `local` SGEs (registered with LOCAL_WRITE).
    pub fn post_rdma_read(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: RemoteAddr,
        flags: SendFlags,
    ) -> Result<()> {
        let (mut sge, n) = self.sges(local, self.caps.max_send_sge, "RDMA read")?;
        let mut wr = Self::send_wr(
            wr_id,
            ibv_wr_opcode::IBV_WR_RDMA_READ,
            &mut sge,
            n,
            flags.bits(false),
            remote,
            None,
        );
        self.post_send_wr(&mut wr, "RDMA read")
    }

    /// Posts a receive (consumed by the peer's write-with-immediate or send). `local` may be empty
    /// for immediate-only completions.
    pub fn post_recv(&self, wr_id: u64, local: &[Sge]) -> Result<()> {
        let (mut sge, n) = self.sges(local, self.caps.max_recv_sge, "receive")?;
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: if n > 0 {
                sge.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            num_sge: n,
        };
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; one initialised request whose SGE array is alive for the call (copied by
        // the provider).
        let rc = unsafe { ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(system_error(
                format!(
                    "ibv_post_recv(wr_id {wr_id} on {} QP {:#x})",
                    self.device(),
                    self.qp_num()
                ),
                rc_errno(rc, last_errno()),
            ));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp and destroyed once; the PD and CQs are held by this struct
        // and released only after this.
        let rc = unsafe { (self.pd.context().lib().destroy_qp)(self.qp.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "{}",
                system_error(
                    format!("ibv_destroy_qp({} QP {:#x})", self.device(), self.qp_num()),
                    rc_errno(rc, last_errno())
                )
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid() -> [u8; 16] {
        super::super::types::Gid::from_ipv4("10.0.0.2".parse().unwrap()).0
    }

    #[test]
    fn rtr_defaults_follow_nccl_and_validate() {
        let p = RtrParams::new(0x123, gid(), 1, Mtu::Mtu1024);
        assert_eq!(
            (
                p.remote_psn,
                p.hop_limit,
                p.min_rnr_timer,
                p.max_dest_rd_atomic
            ),
            (0, 255, 12, 1)
        );
        assert!(p.validate().is_ok());
        let cases: &[(RtrParams, &str)] = &[
            (
                RtrParams {
                    remote_qpn: 1 << 24,
                    ..p
                },
                "remote_qpn 16777216",
            ),
            (
                RtrParams {
                    remote_psn: u32::MAX,
                    ..p
                },
                "remote_psn",
            ),
            (RtrParams { sl: 16, ..p }, "sl 16 is out of range 0..=15"),
            (
                RtrParams {
                    min_rnr_timer: 32,
                    ..p
                },
                "min_rnr_timer",
            ),
            (RtrParams { hop_limit: 0, ..p }, "hop_limit"),
            (RtrParams { dgid: [0; 16], ..p }, "all zeros"),
        ];
        for (bad, needle) in cases {
            let m = bad.validate().unwrap_err().to_string();
            assert!(m.contains(needle), "{m}");
        }
    }

    #[test]
    fn rtr_traffic_class_and_sl_follow_nccl_precedence() {
        let p = RtrParams::new(1, gid(), 1, Mtu::Mtu4096);
        let unset = crate::config::Config::default();
        let q = p.with_config(&unset, None);
        assert_eq!((q.traffic_class, q.sl), (0, 0));
        let q = p.with_config(&unset, Some(106));
        assert_eq!((q.traffic_class, q.sl), (106, 0));
        let q = p.with_config(&unset, Some(3));
        assert_eq!((q.traffic_class, q.sl), (3, 3));
        let set = crate::config::Config {
            ib_tc: Some(41),
            ib_sl: Some(5),
            ..Default::default()
        };
        let q = p.with_config(&set, Some(106));
        assert_eq!((q.traffic_class, q.sl), (41, 5));
        assert!(q.validate().is_ok());
    }

    #[test]
    fn rts_defaults_and_config() {
        let d = RtsParams::default();
        assert_eq!(
            (d.psn, d.timeout, d.retry_cnt, d.rnr_retry, d.max_rd_atomic),
            (0, 20, 7, 7, 1)
        );
        assert!(d.validate().is_ok());
        let cfg = crate::config::Config {
            ib_timeout: 14,
            ib_retry_cnt: 3,
            ..Default::default()
        };
        let r = RtsParams::from_config(&cfg);
        assert_eq!((r.timeout, r.retry_cnt), (14, 3));
        for (bad, needle) in [
            (RtsParams { timeout: 32, ..d }, "timeout 32"),
            (RtsParams { retry_cnt: 8, ..d }, "retry_cnt 8"),
            (RtsParams { rnr_retry: 8, ..d }, "rnr_retry 8"),
            (RtsParams { psn: 1 << 24, ..d }, "psn"),
        ] {
            let m = bad.validate().unwrap_err().to_string();
            assert!(m.contains(needle), "{m}");
        }
    }

    #[test]
    fn send_flags_bits() {
        use rdma_sys::ibv_send_flags as F;
        assert_eq!(SendFlags::SIGNALED.bits(false), F::IBV_SEND_SIGNALED.0);
        assert_eq!(SendFlags::UNSIGNALED.bits(true), F::IBV_SEND_INLINE.0);
        assert_eq!(
            SendFlags {
                signaled: true,
                fence: true
            }
            .bits(true),
            F::IBV_SEND_SIGNALED.0 | F::IBV_SEND_FENCE.0 | F::IBV_SEND_INLINE.0
        );
    }

    #[test]
    fn work_request_layout() {
        let mut sge = [ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_SGE];
        sge[0] = ibv_sge {
            addr: 0x1000,
            length: 64,
            lkey: 9,
        };
        let wr = QueuePair::send_wr(
            7,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            &mut sge,
            1,
            SendFlags::SIGNALED.bits(false),
            RemoteAddr {
                addr: 0xdead_0000,
                rkey: 0x55,
            },
            Some(0x0102_0304),
        );
        assert_eq!(wr.wr_id, 7);
        assert_eq!(wr.num_sge, 1);
        // SAFETY: the fields written by send_wr.
        unsafe {
            assert_eq!(
                wr.imm_data_invalidated_rkey_union.imm_data,
                0x0102_0304u32.to_be()
            );
            assert_eq!(wr.wr.rdma.remote_addr, 0xdead_0000);
            assert_eq!(wr.wr.rdma.rkey, 0x55);
            assert_eq!((*wr.sg_list).lkey, 9);
        }
        // C layout of struct ibv_send_wr on LP64 (verbs.h): 128 bytes, wr.rdma at offset 40.
        assert_eq!(std::mem::size_of::<ibv_send_wr>(), 128);
        assert_eq!(std::mem::offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(std::mem::size_of::<rdma_sys::ibv_wc>(), 48);
    }
}
