//! Failback of a verbs data path: a fresh RC queue pair (and CQ) replaces the failed one once its
//! port is ACTIVE again, agreed with the peer by the reconnect exchange of `transport::revive`
//! written into the peer's mailbox by RDMA write over a surviving path. Registrations stay (same
//! PD); only the QP and its CQ change, and the comm posts the receives again.
//!
//! The mailbox is one block of this connection's PDs: [`MSG_WORDS`] inbox words per data path (the
//! peer writes them) then as many outbox words (the source of this end's writes). Its address and
//! per-path rkey travel in the handshake's `PathParams` (`addr`, `rkey`); a peer that sends 0 there
//! predates failback, and its paths are never revived.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{
    CtrlBlock, DATA_QP_ACCESS, INLINE_BYTES, RemoteEnd, VerbsFabric, context, from_device_barrier,
    path_mtu, random_psn,
};
use crate::error::{Error, Result};
use crate::transport::fabric::{Completion, PathRole, RECV_DEPTH, Revive, SEND_QUEUE_DEPTH};
use crate::transport::revive::{BindKey, End, MSG_WORDS, Reviver, Todo};
use crate::verbs::cq::CompletionQueue;
use crate::verbs::memory::MemoryRegion;
use crate::verbs::qp::{
    QpCaps, QueuePair, RemoteAddr, RtrParams, RtsParams, SendFlags, Sge, WriteReq,
};
use crate::verbs::types::{Access, PortState};

/// Top byte of the `wr_id` of a mailbox write (the comm's kinds are 1..=4); the fabric takes
/// their completions out of what [`crate::transport::fabric::Fabric::poll`] returns.
const MAIL_KIND: u64 = 0x52;
/// Mailbox writes one path may have in flight; the send queue has this many slots beyond the
/// protocol's own ([`SEND_QUEUE_DEPTH`]).
pub(super) const MAIL_IN_FLIGHT: u32 = 4;
/// Completion-queue depth of a data path (sends, receives and the mailbox writes, with room).
pub(super) const DATA_CQ_DEPTH: u32 = (SEND_QUEUE_DEPTH + RECV_DEPTH + 64) as u32;

/// The capacities a data path's QP asks for.
pub(super) fn data_caps(max_inline_data: u32) -> QpCaps {
    QpCaps {
        max_send_wr: SEND_QUEUE_DEPTH as u32 + MAIL_IN_FLIGHT,
        max_recv_wr: RECV_DEPTH as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data,
    }
}

/// The peer as the handshake described it, for rebuilding a path.
#[derive(Debug)]
struct Peer {
    ends: Vec<RemoteEnd>,
    tuning: super::QpTuning,
    key: BindKey,
    side: crate::transport::revive::Side,
}

/// Failback state of one endpoint.
pub(super) struct Failback {
    /// Inbox then outbox words; MRs per PD (`None` for an endpoint without data paths' PDs yet).
    mbox: Option<CtrlBlock>,
    data: usize,
    peer: OnceLock<Peer>,
    revivers: Vec<Reviver>,
    /// The comm has written the path off (it probes it): the port-down grace no longer fails the
    /// connection for it.
    pub(super) written_off: Vec<bool>,
    in_flight: Vec<u32>,
    /// The comm's completions reaped from a path's CQ while making room for a mailbox write; the
    /// next `poll` of the path returns them first.
    pub(super) stash: Vec<VecDeque<Completion>>,
    /// When this end's fresh queue pair of a path was created (for the log line once it is ready).
    started: Vec<Option<Instant>>,
}

impl Failback {
    pub(super) fn empty() -> Failback {
        Failback {
            mbox: None,
            data: 0,
            peer: OnceLock::new(),
            revivers: Vec::new(),
            written_off: Vec::new(),
            in_flight: Vec::new(),
            stash: Vec::new(),
            started: Vec::new(),
        }
    }
}

fn mail_wr_id(path: usize) -> u64 {
    (MAIL_KIND << 56) | path as u64
}

/// Whether `wr_id` is a mailbox write's; returns the path it was about.
pub(super) fn mail_path(wr_id: u64) -> Option<usize> {
    (wr_id >> 56 == MAIL_KIND).then_some((wr_id & 0xffff) as usize)
}

/// One path's handshake parameters: QPN, PSN, GID, MTU, mailbox address and rkey.
type EndParams = (u32, u32, [u8; 16], u32, u64, u32);

/// The bytes of one end's handshake parameters that bind the reconnect messages.
fn binding(ends: &[EndParams]) -> Vec<u8> {
    let mut v = Vec::with_capacity(ends.len() * 40);
    for (qpn, psn, gid, mtu, addr, rkey) in ends {
        v.extend_from_slice(&qpn.to_be_bytes());
        v.extend_from_slice(&psn.to_be_bytes());
        v.extend_from_slice(gid);
        v.extend_from_slice(&mtu.to_be_bytes());
        v.extend_from_slice(&addr.to_be_bytes());
        v.extend_from_slice(&rkey.to_be_bytes());
    }
    v
}

impl VerbsFabric {
    /// Allocates the mailbox on every PD (after the data paths exist).
    pub(super) fn alloc_mailbox(&mut self) -> Result<()> {
        let data = self.local.len();
        let words = 2 * MSG_WORDS * data;
        let block: Box<[AtomicU64]> = (0..words).map(|_| AtomicU64::new(0)).collect();
        let ptr = block.as_ptr() as *mut u8;
        let mut mrs = Vec::with_capacity(self.doms.len());
        for d in &self.doms {
            let pd = d.pd();
            // SAFETY: the words live in the CtrlBlock that owns these MRs and are freed only after
            // them; the NIC writes the inbox and reads the outbox, the CPU uses atomics only. No
            // relaxed ordering: a message's words land in order (a torn one fails its tag anyway).
            mrs.push(unsafe { MemoryRegion::register(pd, ptr, words * 8, Access::RDMA) }?);
        }
        self.fb = Failback {
            mbox: Some(CtrlBlock {
                mrs,
                words: block,
                token: 0,
            }),
            data,
            peer: OnceLock::new(),
            revivers: Vec::new(),
            written_off: vec![false; data],
            in_flight: vec![0; data],
            stash: vec![VecDeque::new(); data],
            started: vec![None; data],
        };
        Ok(())
    }

    /// Address and rkey of this end's mailbox as the peer reaches it over data path `i`.
    pub fn mailbox(&self, i: usize) -> (u64, u32) {
        match (&self.fb.mbox, self.path_pd.get(i)) {
            (Some(b), Some(&pd)) => (b.base(), b.mrs[pd].rkey()),
            _ => (0, 0),
        }
    }

    /// Keeps what a rebuild needs from the handshake (called by `connect`).
    pub(super) fn remember_peer(
        &self,
        peer: &[RemoteEnd],
        tuning: &super::QpTuning,
        secret: &crate::transport::handshake::auth::ConnSecret,
    ) {
        let mine: Vec<_> = (0..self.local.len())
            .map(|i| {
                let l = &self.local[i];
                let (addr, rkey) = self.mailbox(i);
                (l.qpn, l.psn, l.gid, l.mtu, addr, rkey)
            })
            .collect();
        let theirs: Vec<_> = peer
            .iter()
            .map(|p| (p.qpn, p.psn, p.gid, p.mtu, p.mailbox, p.mailbox_rkey))
            .collect();
        let (key, side) = BindKey::derive(secret.bytes(), &binding(&mine), &binding(&theirs));
        let _ = self.fb.peer.set(Peer {
            ends: peer.to_vec(),
            tuning: *tuning,
            key,
            side,
        });
    }

    /// Whether the peer takes part in failback: connected, with a mailbox (an older version sends
    /// none and its paths are never revived).
    fn can_revive(&self) -> bool {
        self.fb.mbox.is_some()
            && self
                .fb
                .peer
                .get()
                .is_some_and(|p| p.ends.iter().all(|e| e.mailbox != 0))
    }

    fn ensure_revivers(&mut self) {
        if !self.fb.revivers.is_empty() {
            return;
        }
        if let Some(peer) = self.fb.peer.get() {
            let (key, side) = (peer.key.clone(), peer.side);
            self.fb.revivers = (0..self.fb.data)
                .map(|p| Reviver::new(p as u16, side, key.clone()))
                .collect();
        }
    }

    fn inbox(&self, path: usize) -> [u64; MSG_WORDS] {
        let mut m = [0u64; MSG_WORDS];
        if let Some(b) = &self.fb.mbox {
            for (i, w) in m.iter_mut().enumerate() {
                *w = b.words[path * MSG_WORDS + i].load(Ordering::Acquire);
            }
            from_device_barrier();
        }
        m
    }

    fn port_active(&self, path: usize) -> bool {
        let (ctx, port) = (self.cqs[path].context(), self.qps[path].port());
        ctx.drain_events();
        ctx.query_port(port)
            .is_ok_and(|p| p.state == PortState::Active)
    }

    /// Polls `path`'s CQ when its mailbox writes use all their slots (the comm may not poll an
    /// idle path): mailbox completions free slots, the comm's wait in the stash.
    fn reap(&mut self, path: usize) -> Result<()> {
        if self.fb.in_flight[path] < MAIL_IN_FLIGHT {
            return Ok(());
        }
        let mut got = Vec::new();
        self.cqs[path].poll(&mut got, 32)?;
        for c in &got {
            if mail_path(c.wr_id).is_some() {
                self.mail_done(path);
            } else {
                self.fb.stash[path].push_back(super::map_completion(c)?);
            }
        }
        Ok(())
    }

    /// Whether data path `path` may carry a mailbox write now.
    fn can_carry(&self, path: usize) -> bool {
        !self.fb.written_off[path]
            && !self.fb.revivers.get(path).is_some_and(Reviver::busy)
            && self.fb.in_flight[path] < MAIL_IN_FLIGHT
            && self.cqs[path]
                .context()
                .port_down_since(self.qps[path].port())
                .is_none()
    }

    /// Writes `msg` into the peer's inbox slot of `about` over a surviving data path. Nothing is
    /// sent when none can carry it (the next probe writes a newer copy).
    fn send_mail(&mut self, about: usize, msg: &[u64; MSG_WORDS]) -> Result<()> {
        for s in 0..self.fb.data {
            if s != about && !self.fb.written_off[s] {
                self.reap(s)?;
            }
        }
        let Some(peer) = self.fb.peer.get() else {
            return Ok(());
        };
        let Some(via) = (0..self.fb.data).find(|&s| s != about && self.can_carry(s)) else {
            tracing::debug!(
                "NET/switchless: no surviving path carries the reconnect message of path {about}"
            );
            return Ok(());
        };
        let Some(b) = &self.fb.mbox else {
            return Ok(());
        };
        let out = (self.fb.data + about) * MSG_WORDS;
        for (i, w) in msg.iter().enumerate() {
            b.words[out + i].store(*w, Ordering::Relaxed);
        }
        let lkey = b.mrs[self.path_pd[via]].lkey();
        let src = b.base() + 8 * out as u64;
        let dst = peer.ends[via].mailbox + (8 * about * MSG_WORDS) as u64;
        let req = WriteReq {
            wr_id: mail_wr_id(about),
            local: Some(Sge {
                addr: src,
                length: (8 * MSG_WORDS) as u32,
                lkey,
            }),
            remote: RemoteAddr {
                addr: dst,
                rkey: peer.ends[via].mailbox_rkey,
            },
            imm: None,
            flags: SendFlags::SIGNALED,
            inline: false,
        };
        // Release: the words stored above are what the NIC reads once the doorbell rings.
        std::sync::atomic::fence(Ordering::Release);
        self.qps[via].post_rdma_writes(std::slice::from_ref(&req))?;
        self.fb.in_flight[via] += 1;
        Ok(())
    }

    /// A mailbox write on `via` completed (success or not: a failed one is rewritten next probe).
    pub(super) fn mail_done(&mut self, via: usize) {
        if let Some(n) = self.fb.in_flight.get_mut(via) {
            *n = n.saturating_sub(1);
        }
    }

    /// Replaces data path `path`'s QP and CQ by fresh ones in INIT; returns the new end.
    fn fresh_qp(&mut self, path: usize) -> Result<End> {
        let port = self.qps[path].port();
        let inline = self.qps[path].caps().max_inline_data.min(INLINE_BYTES);
        let pd = self.doms[self.path_pd[path]].pd();
        let ctx = std::sync::Arc::clone(self.cqs[path].context());
        let cq = CompletionQueue::new(&ctx, DATA_CQ_DEPTH)?;
        let qp = QueuePair::new_rc(pd, &cq, &cq, data_caps(inline))?;
        qp.to_init(port, DATA_QP_ACCESS)?;
        let psn = random_psn()?;
        let qpn = qp.qp_num();
        // The old QP goes first, then its CQ (with its flushed completions).
        drop(std::mem::replace(&mut self.qps[path], qp));
        self.cqs[path] = cq;
        self.fb.in_flight[path] = 0;
        self.fb.stash[path].clear();
        let old = self.local[path].qpn;
        self.local[path].qpn = qpn;
        self.local[path].psn = psn;
        let label = &mut self.infos[path].label;
        *label = label.replace(&format!("qp {old:#x}"), &format!("qp {qpn:#x}"));
        Ok(End { qpn, psn })
    }

    /// Connects the fresh QP of `path` to the peer's fresh one (RTR, RTS).
    fn connect_fresh(&self, path: usize, to: End) -> Result<()> {
        let peer =
            self.fb.peer.get().ok_or_else(|| {
                Error::Internal("a path is rebuilt before the connection was".into())
            })?;
        let (me, them) = (&self.local[path], &peer.ends[path]);
        let sgid = u8::try_from(me.gid_index).map_err(|_| {
            Error::InvalidArgument(format!("GID index {} exceeds 255", me.gid_index))
        })?;
        let mut rtr = RtrParams::new(to.qpn, them.gid, sgid, path_mtu(me.mtu, them.mtu));
        rtr.remote_psn = to.psn;
        rtr.traffic_class = peer.tuning.traffic_class;
        rtr.sl = peer.tuning.sl;
        let what = format!("rebuilding path {path} ({})", self.infos[path].label);
        self.qps[path].to_rtr(&rtr).map_err(|e| context(e, &what))?;
        self.qps[path]
            .to_rts(&RtsParams {
                psn: me.psn,
                timeout: peer.tuning.timeout,
                retry_cnt: peer.tuning.retry_cnt,
                ..RtsParams::default()
            })
            .map_err(|e| context(e, &what))
    }

    /// `stop_path` and `seal_path` of the verbs fabric: data path `path`'s QP to the error state
    /// (idempotent), written off.
    pub(super) fn write_off(&mut self, path: usize) -> Result<()> {
        self.check_path(path)?;
        if self.infos[path].role != PathRole::Data || path >= self.fb.data {
            return Err(Error::InvalidArgument(format!(
                "path {path} is a loopback path; only data paths are stopped"
            )));
        }
        if let Some(w) = self.fb.written_off.get_mut(path) {
            *w = true;
        }
        self.qps[path].to_error()
    }

    /// [`crate::transport::fabric::Fabric::revive_path`] of the verbs fabric.
    pub(super) fn revive(&mut self, path: usize) -> Result<Revive> {
        self.check_path(path)?;
        if self.infos[path].role != PathRole::Data || path >= self.fb.data {
            return Err(Error::InvalidArgument(format!(
                "path {path} is a loopback path; only data paths are revived"
            )));
        }
        // Asked only about a path the comm wrote off: from now on its port staying down no
        // longer fails the connection (the other paths carry), revived or not.
        if let Some(w) = self.fb.written_off.get_mut(path) {
            *w = true;
        }
        if !self.can_revive() {
            return Ok(Revive::Down);
        }
        self.ensure_revivers();
        let active = self.port_active(path);
        let inbox = self.inbox(path);
        let mut out = Revive::Pending;
        for _ in 0..3 {
            let todo = self.fb.revivers[path].poll(active, &inbox);
            match todo {
                Todo::Down => {
                    out = Revive::Down;
                    break;
                }
                Todo::Create => {
                    let end = self.fresh_qp(path)?;
                    self.fb.revivers[path].created(end);
                    self.fb.started[path] = Some(Instant::now());
                    out = Revive::Rebuilt;
                    break;
                }
                Todo::Connect(to) => {
                    self.connect_fresh(path, to)?;
                    self.fb.revivers[path].connected(to);
                }
                Todo::Pending => {
                    out = Revive::Pending;
                    break;
                }
                Todo::Ready => {
                    out = Revive::Ready;
                    break;
                }
            }
        }
        if let Some(msg) = self.fb.revivers[path].outbox() {
            self.send_mail(path, &msg)?;
        }
        if out == Revive::Ready {
            self.fb.written_off[path] = false;
            let r = &self.fb.revivers[path];
            // The port's newest event (IBV_EVENT_PORT_ACTIVE, with its age): the time from the
            // port's return to the path carrying traffic again.
            let port = self.cqs[path].context().port_note(self.qps[path].port());
            tracing::info!(
                "NET/switchless: path {path} ({}) rebuilt: epoch {}, {} attempt(s), {:.1} ms from its fresh queue pair to both ends connected; {}",
                self.infos[path].label,
                r.epoch(),
                r.attempts(),
                self.fb.started[path].map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3),
                port.unwrap_or_else(|| "no port event seen".into())
            );
        }
        Ok(out)
    }

    /// [`crate::transport::fabric::Fabric::path_health`] of the verbs fabric: a port the device
    /// reported down, or a peer that started rebuilding the path, makes it unusable; its QP then
    /// goes to the error state at once, so none of its work lands late after the comm moved it.
    pub(super) fn data_path_health(&mut self, path: usize) -> Result<()> {
        self.check_path(path)?;
        if path >= self.fb.data {
            return Ok(());
        }
        let (ctx, port) = (self.cqs[path].context(), self.qps[path].port());
        // The events of the last millisecond (any comm on this device may have read them).
        ctx.drain_events_within(std::time::Duration::from_millis(1));
        let why = if ctx.port_down_since(port).is_some() {
            Some(format!(
                "{} port {port} went down (IBV_EVENT_PORT_ERR)",
                ctx.name()
            ))
        } else if self.can_revive() {
            // The peer's first offer may come before this end ever probed.
            self.ensure_revivers();
            let inbox = self.inbox(path);
            self.fb
                .revivers
                .get_mut(path)
                .is_some_and(|r| r.peer_restarted(&inbox))
                .then(|| "the peer is rebuilding this path".to_string())
        } else {
            None
        };
        match why {
            None => Ok(()),
            Some(w) => {
                // Only with a survivor to move the work to: the last path keeps its RC retries and
                // the real completion status (the comm never fails over from it).
                let survivor = (0..self.fb.data).any(|s| {
                    s != path
                        && !self.fb.written_off[s]
                        && self.cqs[s]
                            .context()
                            .port_down_since(self.qps[s].port())
                            .is_none()
                });
                if survivor {
                    let _ = self.qps[path].to_error();
                }
                Err(Error::System(format!(
                    "path {path} ({}): {w}",
                    self.infos[path].label
                )))
            }
        }
    }

    /// While usable: answers again a peer that still waits for this end's last ack (its ack was
    /// lost). Cheap: called with the periodic event drain.
    pub(super) fn answer_mail(&mut self) -> Result<()> {
        for path in 0..self.fb.revivers.len() {
            if self.fb.written_off[path] {
                continue;
            }
            let inbox = self.inbox(path);
            if let Some(msg) = self.fb.revivers[path].answer(&inbox) {
                self.send_mail(path, &msg)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wire::{WrKind, split_wr_id, wr_id};

    #[test]
    fn mailbox_writes_never_look_like_the_comms() {
        for p in [0usize, 1, 15] {
            let id = mail_wr_id(p);
            assert_eq!(mail_path(id), Some(p));
            assert_eq!(split_wr_id(id), None, "the comm would call it foreign");
        }
        for k in [WrKind::Send, WrKind::Cts, WrKind::Recv, WrKind::Flush] {
            assert_eq!(mail_path(wr_id(k, 255, u32::MAX)), None);
        }
    }

    #[test]
    fn both_ends_derive_one_key_from_the_handshake() {
        let a: Vec<EndParams> = vec![(0x11, 5, [1; 16], 4096, 0x1000, 7)];
        let b: Vec<EndParams> = vec![(0x22, 9, [2; 16], 4096, 0x2000, 8)];
        let s = [7u8; 32];
        let (ka, sa) = BindKey::derive(&s, &binding(&a), &binding(&b));
        let (kb, sb) = BindKey::derive(&s, &binding(&b), &binding(&a));
        assert_ne!(sa, sb);
        // Same key: a message from one end is accepted by the other.
        let mut ra = Reviver::new(0, sa, ka);
        let mut rb = Reviver::new(0, sb, kb);
        assert_eq!(ra.poll(true, &[0; MSG_WORDS]), Todo::Create);
        ra.created(End { qpn: 3, psn: 4 });
        let m = ra.outbox().unwrap_or([0; MSG_WORDS]);
        assert!(rb.peer_restarted(&m));
        assert!(data_caps(64).max_send_wr > SEND_QUEUE_DEPTH as u32);
    }
}
