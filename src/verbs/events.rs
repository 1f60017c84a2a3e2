//! Asynchronous device events (`ibv_get_async_event`): a port going down or up, GID table changes,
//! and fatal QP, CQ or device errors.
//!
//! NCCL's IB transport blocks one detached thread per device in `ibv_get_async_event`. A thread that
//! outlives `finalize` crashes the process when NCCL `dlclose`s the plugin, so here the event fd is
//! made non-blocking when the device is opened and drained from the progress path instead
//! ([`super::Context::drain_events`]): no thread to start or stop. As in NCCL (with its default
//! `NCCL_IB_RETURN_ASYNC_EVENTS=1`), a fatal event on a connection's QP or CQ, or on the device, fails
//! that connection's requests; port and GID events are logged and remembered, so that an error on a
//! path can say what its port reported (see [`super::Context::port_note`]).

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::time::Instant;

/// What an event is about (which member of the C union `element` holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventScope {
    /// The whole device (`IBV_EVENT_DEVICE_FATAL`, and codes newer than this build knows).
    Device,
    Port(u8),
    /// A queue pair, by QP number.
    Qp(u32),
    /// A completion queue, by the address of its `ibv_cq` (compared, never dereferenced).
    Cq(usize),
    Srq,
    Wq,
}

impl EventScope {
    /// Which of a connection's paths the event names, given the paths' QP numbers and CQ addresses
    /// in path order (`None` for device and port events, or objects of other connections).
    pub fn path_of(self, qpns: &[u32], cqs: &[usize]) -> Option<usize> {
        match self {
            EventScope::Qp(n) => qpns.iter().position(|&q| q == n),
            EventScope::Cq(c) => cqs.iter().position(|&q| q == c),
            _ => None,
        }
    }
}

/// The union member an event code carries (verbs.h `struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementKind {
    None,
    Port,
    Qp,
    Cq,
    Srq,
    Wq,
}

/// One event as received (after it was acknowledged: nothing in it points into libibverbs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncEvent {
    pub device: String,
    /// The `ibv_event_type` value.
    pub code: u32,
    pub scope: EventScope,
    pub at: Instant,
}

/// `IBV_EVENT_PORT_ACTIVE`.
const PORT_ACTIVE: u32 = 9;
/// `IBV_EVENT_PORT_ERR`.
const PORT_ERR: u32 = 10;

/// Event codes (`enum ibv_event_type`, rdma-core `<infiniband/verbs.h>`) with their names, the union
/// member they carry, whether they are fatal for what they name (as NCCL's IB transport counts them),
/// and a short meaning.
const EVENTS: &[(u32, &str, ElementKind, bool, &str)] = &[
    (
        0,
        "IBV_EVENT_CQ_ERR",
        ElementKind::Cq,
        true,
        "completion queue overrun or error",
    ),
    (
        1,
        "IBV_EVENT_QP_FATAL",
        ElementKind::Qp,
        true,
        "the QP hit a fatal error",
    ),
    (
        2,
        "IBV_EVENT_QP_REQ_ERR",
        ElementKind::Qp,
        true,
        "invalid request on the QP",
    ),
    (
        3,
        "IBV_EVENT_QP_ACCESS_ERR",
        ElementKind::Qp,
        true,
        "remote access error on the QP",
    ),
    (
        4,
        "IBV_EVENT_COMM_EST",
        ElementKind::Qp,
        false,
        "communication established",
    ),
    (
        5,
        "IBV_EVENT_SQ_DRAINED",
        ElementKind::Qp,
        false,
        "send queue drained",
    ),
    (
        6,
        "IBV_EVENT_PATH_MIG",
        ElementKind::Qp,
        false,
        "path migrated",
    ),
    (
        7,
        "IBV_EVENT_PATH_MIG_ERR",
        ElementKind::Qp,
        false,
        "path migration failed",
    ),
    (
        8,
        "IBV_EVENT_DEVICE_FATAL",
        ElementKind::None,
        true,
        "the device hit a fatal error",
    ),
    (
        9,
        "IBV_EVENT_PORT_ACTIVE",
        ElementKind::Port,
        false,
        "the port came up",
    ),
    (
        10,
        "IBV_EVENT_PORT_ERR",
        ElementKind::Port,
        false,
        "the port went down",
    ),
    (
        11,
        "IBV_EVENT_LID_CHANGE",
        ElementKind::Port,
        false,
        "LID changed",
    ),
    (
        12,
        "IBV_EVENT_PKEY_CHANGE",
        ElementKind::Port,
        false,
        "P_Key table changed",
    ),
    (
        13,
        "IBV_EVENT_SM_CHANGE",
        ElementKind::Port,
        false,
        "subnet manager changed",
    ),
    (
        14,
        "IBV_EVENT_SRQ_ERR",
        ElementKind::Srq,
        false,
        "shared receive queue error",
    ),
    (
        15,
        "IBV_EVENT_SRQ_LIMIT_REACHED",
        ElementKind::Srq,
        false,
        "SRQ limit reached",
    ),
    (
        16,
        "IBV_EVENT_QP_LAST_WQE_REACHED",
        ElementKind::Qp,
        false,
        "last WQE reached",
    ),
    (
        17,
        "IBV_EVENT_CLIENT_REREGISTER",
        ElementKind::Port,
        false,
        "client re-register requested",
    ),
    (
        18,
        "IBV_EVENT_GID_CHANGE",
        ElementKind::Port,
        false,
        "the GID table changed (an address was added or removed)",
    ),
    (
        19,
        "IBV_EVENT_WQ_FATAL",
        ElementKind::Wq,
        false,
        "work queue error",
    ),
];

fn entry(code: u32) -> Option<&'static (u32, &'static str, ElementKind, bool, &'static str)> {
    EVENTS.iter().find(|e| e.0 == code)
}

/// The union member `code` carries; codes this build does not know carry nothing we read.
pub fn element_kind(code: u32) -> ElementKind {
    entry(code).map_or(ElementKind::None, |e| e.2)
}

impl AsyncEvent {
    /// `IBV_EVENT_…`, or `IBV_EVENT_<code>` for codes newer than this build.
    pub fn name(&self) -> String {
        entry(self.code).map_or_else(|| format!("IBV_EVENT_{}", self.code), |e| e.1.to_string())
    }

    /// Fatal for what it names (NCCL's IB transport fails the connection on these).
    pub fn is_fatal(&self) -> bool {
        entry(self.code).is_some_and(|e| e.3)
    }

    /// A port event that says the port is unusable.
    pub fn is_port_down(&self) -> bool {
        self.code == PORT_ERR
    }

    /// One line: "rxe_eth2 port 1: IBV_EVENT_PORT_ERR (the port went down)".
    pub fn describe(&self) -> String {
        let what = match self.scope {
            EventScope::Device => self.device.clone(),
            EventScope::Port(p) => format!("{} port {p}", self.device),
            EventScope::Qp(n) => format!("{} QP {n:#x}", self.device),
            EventScope::Cq(_) => format!("{} completion queue", self.device),
            EventScope::Srq => format!("{} shared receive queue", self.device),
            EventScope::Wq => format!("{} work queue", self.device),
        };
        match entry(self.code) {
            Some(e) => format!("{what}: {} ({})", e.1, e.4),
            None => format!(
                "{what}: {} (an event this build does not know)",
                self.name()
            ),
        }
    }

    /// [`describe`](Self::describe) plus how long ago it arrived.
    pub fn describe_age(&self, now: Instant) -> String {
        let age = now.saturating_duration_since(self.at).as_secs_f64();
        format!("{} {age:.2} s ago", self.describe())
    }
}

/// What a device reported lately: a bounded history, and the fatal events (kept until the context
/// is closed: a QP or CQ they name is unusable for good).
#[derive(Debug, Default)]
pub struct EventLog {
    recent: VecDeque<AsyncEvent>,
    fatal: Vec<AsyncEvent>,
}

/// Events kept per device for error messages.
const RECENT: usize = 64;
/// Fatal events kept per device (each names a QP/CQ that is then torn down; more are not useful).
const FATAL: usize = 256;

impl EventLog {
    pub fn push(&mut self, e: AsyncEvent) {
        if e.is_fatal() && self.fatal.len() < FATAL {
            self.fatal.push(e.clone());
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(e);
    }

    /// The first fatal event for the device, or one that arrived at or after `since` for one of
    /// `qpns` or of the CQs at `cqs` (QP numbers and CQ addresses are reused once their objects are
    /// destroyed, so older events name somebody else's).
    pub fn fatal_for(&self, qpns: &[u32], cqs: &[usize], since: Instant) -> Option<&AsyncEvent> {
        self.fatal.iter().find(|e| match e.scope {
            EventScope::Device => true,
            EventScope::Qp(n) => e.at >= since && qpns.contains(&n),
            EventScope::Cq(c) => e.at >= since && cqs.contains(&c),
            _ => false,
        })
    }

    /// The newest `IBV_EVENT_PORT_ACTIVE` or `IBV_EVENT_PORT_ERR` of `port` (other port events,
    /// such as the GID changes that follow a link going down, do not say whether it is up).
    pub fn last_up_down(&self, port: u8) -> Option<&AsyncEvent> {
        self.recent.iter().rev().find(|e| {
            e.scope == EventScope::Port(port) && (e.code == PORT_ACTIVE || e.code == PORT_ERR)
        })
    }

    /// The newest event about `port`.
    pub fn last_for_port(&self, port: u8) -> Option<&AsyncEvent> {
        self.recent
            .iter()
            .rev()
            .find(|e| e.scope == EventScope::Port(port))
    }
}

/// `struct ibv_async_event`, read through our own type: rdma-sys maps `event_type` onto a Rust enum,
/// and a code newer than its enum (rdma-core keeps adding them) would be undefined behaviour there.
#[repr(C)]
pub(crate) struct RawEvent {
    element: RawElement,
    event_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
union RawElement {
    ptr: *mut c_void,
    port_num: c_int,
}

impl RawEvent {
    pub(crate) fn zeroed() -> RawEvent {
        RawEvent {
            element: RawElement {
                ptr: std::ptr::null_mut(),
            },
            event_type: 0,
        }
    }

    pub(crate) fn code(&self) -> u32 {
        self.event_type
    }

    /// The event's scope.
    ///
    /// # Safety
    /// `self` was filled by `ibv_get_async_event` and not yet acknowledged (a QP it names is alive).
    pub(crate) unsafe fn scope(&self) -> EventScope {
        match element_kind(self.event_type) {
            ElementKind::None => EventScope::Device,
            ElementKind::Port => {
                // SAFETY: for port events libibverbs stores `port_num` (an int) in the union.
                let p = unsafe { self.element.port_num };
                EventScope::Port(u8::try_from(p).unwrap_or(0))
            }
            ElementKind::Qp => {
                // SAFETY: for QP events the union holds the `ibv_qp*`, alive until the event is
                // acknowledged (the caller's contract); only its `qp_num` field is read.
                let qp = unsafe { self.element.ptr }.cast::<rdma_sys::ibv_qp>();
                if qp.is_null() {
                    return EventScope::Device;
                }
                // SAFETY: `qp` is non-NULL and live (above); `addr_of!` reads the one u32 field
                // without forming a reference to the whole struct.
                EventScope::Qp(unsafe { std::ptr::addr_of!((*qp).qp_num).read() })
            }
            ElementKind::Cq => {
                // SAFETY: for CQ events the union holds the `ibv_cq*`; only its address is kept.
                EventScope::Cq(unsafe { self.element.ptr } as usize)
            }
            ElementKind::Srq => EventScope::Srq,
            ElementKind::Wq => EventScope::Wq,
        }
    }

    pub(crate) fn as_sys(&mut self) -> *mut rdma_sys::ibv_async_event {
        (self as *mut RawEvent).cast()
    }
}

/// Drains the pending events of device `device` (context `ctx`, non-blocking fd) into `log`; returns
/// the new ones.
///
/// # Safety
/// `ctx` is a live `ibv_context` whose async fd is non-blocking, for the whole call.
pub(crate) unsafe fn drain(
    v: &super::sym::Verbs,
    ctx: *mut rdma_sys::ibv_context,
    device: &str,
    log: &mut EventLog,
) -> Vec<AsyncEvent> {
    let mut out = Vec::new();
    // Bounded: a storm of events cannot hold the progress thread.
    for _ in 0..64 {
        let mut raw = RawEvent::zeroed();
        // SAFETY: live context (the caller's contract); `raw` has the layout of `struct
        // ibv_async_event` (checked in the tests) and is only read through our own types. The fd is
        // non-blocking, so this returns -1 with EAGAIN when nothing is pending.
        let rc = unsafe { (v.get_async_event)(ctx, raw.as_sys()) };
        if rc != 0 {
            break;
        }
        // SAFETY: filled by ibv_get_async_event just now and not yet acknowledged.
        let scope = unsafe { raw.scope() };
        // SAFETY: every event received is acknowledged exactly once (destroying a QP or CQ waits
        // for the acknowledgement of its events).
        unsafe { (v.ack_async_event)(raw.as_sys()) };
        let e = AsyncEvent {
            device: device.to_string(),
            code: raw.code(),
            scope,
            at: Instant::now(),
        };
        if e.is_fatal() || e.is_port_down() {
            tracing::warn!("NET/switchless: async event: {}", e.describe());
        } else {
            tracing::info!("NET/switchless: async event: {}", e.describe());
        }
        log.push(e.clone());
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(code: u32, scope: EventScope) -> AsyncEvent {
        AsyncEvent {
            device: "rxe_eth2".into(),
            code,
            scope,
            at: Instant::now(),
        }
    }

    #[test]
    fn raw_event_has_the_c_layout() {
        assert_eq!(
            std::mem::size_of::<RawEvent>(),
            std::mem::size_of::<rdma_sys::ibv_async_event>()
        );
        assert_eq!(
            std::mem::align_of::<RawEvent>(),
            std::mem::align_of::<rdma_sys::ibv_async_event>()
        );
        assert_eq!(std::mem::offset_of!(RawEvent, event_type), 8);
    }

    #[test]
    fn codes_match_verbs_h_and_carry_the_right_member() {
        use rdma_sys::ibv_event_type as T;
        for (t, kind) in [
            (T::IBV_EVENT_CQ_ERR, ElementKind::Cq),
            (T::IBV_EVENT_QP_FATAL, ElementKind::Qp),
            (T::IBV_EVENT_QP_ACCESS_ERR, ElementKind::Qp),
            (T::IBV_EVENT_DEVICE_FATAL, ElementKind::None),
            (T::IBV_EVENT_PORT_ACTIVE, ElementKind::Port),
            (T::IBV_EVENT_PORT_ERR, ElementKind::Port),
            (T::IBV_EVENT_GID_CHANGE, ElementKind::Port),
            (T::IBV_EVENT_SRQ_LIMIT_REACHED, ElementKind::Srq),
            (T::IBV_EVENT_WQ_FATAL, ElementKind::Wq),
        ] {
            assert_eq!(element_kind(t as u32), kind, "{t:?}");
            assert_eq!(ev(t as u32, EventScope::Device).name(), format!("{t:?}"));
        }
        assert_eq!(
            EVENTS.len(),
            rdma_sys::ibv_event_type::IBV_EVENT_WQ_FATAL as usize + 1
        );
        for (i, e) in EVENTS.iter().enumerate() {
            assert_eq!(e.0 as usize, i);
        }
        // A code newer than this build: named by number, read as device-wide, not fatal.
        assert_eq!(element_kind(20), ElementKind::None);
        let e = ev(20, EventScope::Device);
        assert_eq!(e.name(), "IBV_EVENT_20");
        assert!(!e.is_fatal());
        assert!(e.describe().contains("does not know"));
    }

    #[test]
    fn fatal_events_fail_only_what_they_name() {
        let mut log = EventLog::default();
        let t0 = Instant::now();
        log.push(ev(10, EventScope::Port(1)));
        log.push(ev(1, EventScope::Qp(0x11)));
        log.push(ev(0, EventScope::Cq(0x1000)));
        assert!(log.fatal_for(&[0x12], &[0x2000], t0).is_none());
        assert_eq!(
            log.fatal_for(&[0x12, 0x11], &[], t0).map(|e| e.describe()),
            Some("rxe_eth2 QP 0x11: IBV_EVENT_QP_FATAL (the QP hit a fatal error)".into())
        );
        assert_eq!(log.fatal_for(&[], &[0x1000], t0).map(|e| e.code), Some(0));
        // A connection created after those events: QP 0x11 and that CQ address are someone new.
        let later = Instant::now() + std::time::Duration::from_millis(1);
        assert!(log.fatal_for(&[0x11], &[0x1000], later).is_none());
        log.push(ev(8, EventScope::Device));
        // A dead device is dead for every connection, old or new.
        assert_eq!(log.fatal_for(&[], &[], later).map(|e| e.code), Some(8));
    }

    #[test]
    fn events_map_to_the_path_they_name() {
        let (qpns, cqs) = ([0x11, 0x12, 0x30], [0x1000, 0x2000, 0x3000]);
        assert_eq!(EventScope::Qp(0x12).path_of(&qpns, &cqs), Some(1));
        assert_eq!(EventScope::Cq(0x3000).path_of(&qpns, &cqs), Some(2));
        assert_eq!(EventScope::Qp(0x99).path_of(&qpns, &cqs), None);
        assert_eq!(EventScope::Port(1).path_of(&qpns, &cqs), None);
        assert_eq!(EventScope::Device.path_of(&qpns, &cqs), None);
    }

    #[test]
    fn port_history_keeps_the_newest_event_and_is_bounded() {
        let mut log = EventLog::default();
        log.push(ev(10, EventScope::Port(1)));
        log.push(ev(9, EventScope::Port(2)));
        let e = log.last_for_port(1).unwrap();
        assert!(e.is_port_down());
        assert_eq!(
            e.describe(),
            "rxe_eth2 port 1: IBV_EVENT_PORT_ERR (the port went down)"
        );
        // A GID change after the port went down: still down.
        log.push(ev(18, EventScope::Port(1)));
        assert_eq!(log.last_for_port(1).map(|e| e.code), Some(18));
        assert!(log.last_up_down(1).is_some_and(AsyncEvent::is_port_down));
        log.push(ev(9, EventScope::Port(1)));
        assert_eq!(log.last_for_port(1).map(|e| e.code), Some(9));
        assert!(log.last_up_down(1).is_some_and(|e| !e.is_port_down()));
        assert!(log.last_up_down(2).is_some_and(|e| e.code == 9));
        assert!(log.last_for_port(3).is_none());
        for _ in 0..RECENT * 2 {
            log.push(ev(18, EventScope::Port(2)));
        }
        assert_eq!(log.recent.len(), RECENT);
        // The port-1 events were pushed out of the bounded history; fatal ones are kept apart.
        assert!(log.last_for_port(1).is_none());
        let age = ev(10, EventScope::Port(1)).describe_age(Instant::now());
        assert!(age.ends_with(" s ago"), "{age}");
    }
}
