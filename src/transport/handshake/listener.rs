//! The acceptor's side of the handshake as state machines: [`ListenMachine`] serves any number of
//! incoming connections until one sends a valid hello, which becomes an [`AcceptMachine`]: reply (or
//! reject), then wait for ready.
//!
//! Sans-IO, like the connector: no socket, no clock. The listener keeps each pending connection's
//! driver handle `C` (the socket in `io.rs`, a test's pipe) without touching it, so that the policy
//! of which connections to keep lives here: [`ListenMachine::admit`] for each new connection,
//! `check_hello` for each hello.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::frames::Frames;
use super::wire::{Hello, Message, PathParams, PathRequest, Reply, SideParams};
use crate::error::{Error, Result};
use crate::route::handle::HandleRepr;
use crate::route::select::{Reach, check_incoming};
use crate::route::types::{KernelRoute, LocalLink};

/// Incoming connections a listener keeps in progress at once; when full, the oldest is closed to make
/// room (a real connector finishes its hello within milliseconds, a stuck or hostile one does not).
pub const MAX_PENDING: usize = 32;

/// What the acceptor checks incoming paths against: this node's links and kernel routes.
#[derive(Debug, Clone, Default)]
pub struct AcceptorView {
    pub links: Vec<LocalLink>,
    pub routes: Vec<KernelRoute>,
    /// Whether routed TCP paths are accepted (`NCCL_SWITCHLESS_TCP_FALLBACK=1`, see
    /// [`crate::route::check_incoming`]).
    pub reach: Reach,
}

/// One path of an incoming connection, resolved on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedPath {
    /// This node's link the connector addressed.
    pub local: LocalLink,
    /// The connector's request (its address, this node's address, kind).
    pub request: PathRequest,
    /// The connector's params for this path.
    pub peer_params: PathParams,
}

/// A connection that has not sent a valid hello yet.
#[derive(Debug)]
struct Pending<C> {
    io: C,
    peer: SocketAddr,
    frames: Frames,
    deadline: Instant,
    /// Set when a reject is queued: send it, then drop the connection.
    rejecting: bool,
}

enum Advance {
    Keep,
    Drop,
    Hello(Hello, Vec<AcceptedPath>),
}

/// The listening side: every connection in progress and the wait for the first valid one.
#[derive(Debug)]
pub struct ListenMachine<C> {
    /// The listening port (for the handle and for errors).
    port: u16,
    nonce: u64,
    view: AcceptorView,
    timeout: Duration,
    pending: Vec<Pending<C>>,
    /// Set on the first poll: no valid hello by then is an error.
    deadline: Option<Instant>,
}

impl<C> ListenMachine<C> {
    /// A listener on `port` whose handle carries `nonce`; `timeout` bounds each incoming handshake
    /// and the wait for the first valid connector (counted from the first poll or admission).
    pub fn new(port: u16, nonce: u64, view: AcceptorView, timeout: Duration) -> Self {
        ListenMachine {
            port,
            nonce,
            view,
            timeout,
            pending: Vec::new(),
            deadline: None,
        }
    }

    /// The handle to publish: the port and nonce, every link of the view that is up, and `control`
    /// as the fallback address. Also returns links that did not fit (log them).
    pub fn handle(&self, control: Option<Ipv4Addr>) -> (HandleRepr, Vec<LocalLink>) {
        HandleRepr::from_local(&self.view.links, self.port, control, self.nonce)
    }

    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Incoming connections in progress.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// A new connection from `peer`; `io` is the driver's handle for it. Every connection comes in
    /// here, so a per-connection admission rule belongs here too. The rule today is the cap: with
    /// [`MAX_PENDING`] in progress, the oldest is evicted and returned for the driver to close.
    #[must_use = "the evicted connection is to be closed"]
    pub fn admit(&mut self, now: Instant, io: C, peer: SocketAddr) -> Option<C> {
        self.arm(now);
        let evicted = if self.pending.len() >= MAX_PENDING {
            (0..self.pending.len())
                .min_by_key(|&i| self.pending[i].deadline)
                .map(|oldest| {
                    let old = self.pending.swap_remove(oldest);
                    tracing::warn!(peer = %old.peer, "handshake: {MAX_PENDING} connections pending; closing the oldest");
                    old.io
                })
        } else {
            None
        };
        let mut frames = Frames::default();
        frames.expect_frame();
        self.pending.push(Pending {
            io,
            peer,
            frames,
            deadline: now + self.timeout,
            rejecting: false,
        });
        evicted
    }

    /// Every connection in progress with its bytes, for the driver to move.
    pub fn connections(&mut self) -> impl Iterator<Item = (&mut C, &mut Frames)> {
        self.pending.iter_mut().map(|p| (&mut p.io, &mut p.frames))
    }

    /// When [`ListenMachine::poll`] must run again even if no byte moves.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending
            .iter()
            .map(|p| p.deadline)
            .chain(self.deadline)
            .min()
    }

    /// Advances every pending connection. Returns the first whose hello is valid and whose paths
    /// all check out, with its driver handle; bad ones are logged and dropped (after a reject
    /// message when the peer speaks the protocol). Errors only when no valid hello arrived within
    /// the timeout.
    pub fn poll(&mut self, now: Instant) -> Result<Option<(C, AcceptMachine)>> {
        let deadline = self.arm(now);
        let mut i = 0;
        while i < self.pending.len() {
            match self.advance(i, now) {
                Advance::Keep => i += 1,
                Advance::Drop => {
                    self.pending.swap_remove(i);
                }
                Advance::Hello(hello, paths) => {
                    let p = self.pending.swap_remove(i);
                    // Each valid connection restarts the wait for the next one.
                    self.deadline = Some(now + self.timeout);
                    let m = AcceptMachine::new(now, p.peer, p.frames, hello, paths, self.timeout);
                    return Ok(Some((p.io, m)));
                }
            }
        }
        if now >= deadline {
            return Err(Error::Timeout(format!(
                "no valid connection reached listening port {} within {} ms ({} in progress): the peer never connected or could not route here; check its log",
                self.port,
                self.timeout.as_millis(),
                self.pending.len()
            )));
        }
        Ok(None)
    }

    fn arm(&mut self, now: Instant) -> Instant {
        *self.deadline.get_or_insert(now + self.timeout)
    }

    fn advance(&mut self, i: usize, now: Instant) -> Advance {
        let timeout = self.timeout;
        let p = &mut self.pending[i];
        let peer = p.peer;
        if now >= p.deadline {
            tracing::warn!(%peer, "handshake: dropped a connection that sent no valid hello within {} ms", timeout.as_millis());
            return Advance::Drop;
        }
        if p.rejecting {
            // Sent or failed: either way the connection is done.
            let failed = p.frames.take_fault().is_some();
            return if failed || p.frames.flushed() {
                Advance::Drop
            } else {
                Advance::Keep
            };
        }
        if let Some(f) = p.frames.take_fault() {
            tracing::warn!(%peer, "handshake: dropped connection: {}", f.into_error("connector", "reading its hello"));
            return Advance::Drop;
        }
        let hello = match p.frames.take_frame() {
            None => return Advance::Keep,
            Some(Message::Hello(h)) => h,
            Some(other) => {
                tracing::warn!(%peer, "handshake: dropped a connection that sent {} instead of a hello", other.name());
                return Advance::Drop;
            }
        };
        match check_hello(self.nonce, &self.view, &hello) {
            Ok(paths) => Advance::Hello(hello, paths),
            Err(reason) => {
                let p = &mut self.pending[i];
                tracing::warn!(%peer, "handshake: rejected connection: {reason}");
                if p.frames.queue(&Message::Reject(reason)).is_err() {
                    return Advance::Drop;
                }
                p.rejecting = true;
                Advance::Keep
            }
        }
    }
}

/// Whether a hello may go on: its nonce is this listener's and every path checks out on this node.
/// The reason, when not, goes back to the connector.
fn check_hello(
    nonce: u64,
    view: &AcceptorView,
    hello: &Hello,
) -> std::result::Result<Vec<AcceptedPath>, String> {
    if hello.nonce != nonce {
        return Err(format!(
            "nonce {:#x} does not match this listener's {nonce:#x} (stale handle or a different listener on a reused port)",
            hello.nonce
        ));
    }
    let mut paths = Vec::with_capacity(hello.paths.len());
    for (n, (req, par)) in hello.paths.iter().zip(&hello.params.paths).enumerate() {
        let l = check_incoming(
            &view.links,
            &view.routes,
            req.acceptor,
            req.connector.addr(),
            req.kind,
            view.reach,
        )
        .map_err(|reason| {
            format!(
                "path {n} ({} -> {}): {reason}",
                req.connector.addr(),
                req.acceptor
            )
        })?;
        paths.push(AcceptedPath {
            local: l.clone(),
            request: *req,
            peer_params: par.clone(),
        });
    }
    Ok(paths)
}

/// What [`AcceptMachine::poll`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptEvent {
    /// Nothing to do until bytes move or [`AcceptMachine::poll_timeout`] passes.
    Pending,
    /// Ready arrived: the handshake is complete and the connection belongs to the caller.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IState {
    AwaitCaller,
    SendReply,
    AwaitReady,
    SendReject,
    Finished,
}

/// An incoming connection whose hello checked out. Answer it with [`AcceptMachine::respond`] (or
/// [`AcceptMachine::reject`]) and poll it until `Done`.
#[derive(Debug)]
pub struct AcceptMachine {
    peer: SocketAddr,
    /// The connector, as errors name it.
    who: String,
    hello: Hello,
    paths: Vec<AcceptedPath>,
    frames: Frames,
    state: IState,
    deadline: Instant,
    timeout: Duration,
    reject_reason: Option<String>,
}

impl AcceptMachine {
    fn new(
        now: Instant,
        peer: SocketAddr,
        frames: Frames,
        hello: Hello,
        paths: Vec<AcceptedPath>,
        timeout: Duration,
    ) -> Self {
        AcceptMachine {
            peer,
            who: format!("connector {peer}"),
            hello,
            paths,
            frames,
            state: IState::AwaitCaller,
            deadline: now + timeout,
            timeout,
            reject_reason: None,
        }
    }

    /// The connector's TCP address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
    pub fn hello(&self) -> &Hello {
        &self.hello
    }
    /// The paths, resolved to this node's links, in the connector's order.
    pub fn paths(&self) -> &[AcceptedPath] {
        &self.paths
    }

    /// The connection's bytes, for the driver to move.
    pub fn frames(&mut self) -> &mut Frames {
        &mut self.frames
    }

    /// Sends this side's params (one per path, same order). The deadline restarts at `now`.
    pub fn respond(&mut self, now: Instant, mine: SideParams) -> Result<()> {
        if self.state != IState::AwaitCaller {
            return Err(Error::Internal(format!(
                "respond() called in state {:?}",
                self.state
            )));
        }
        if mine.paths.len() != self.paths.len() {
            return Err(Error::Internal(format!(
                "respond() with params for {} paths, the connector asked for {}",
                mine.paths.len(),
                self.paths.len()
            )));
        }
        self.frames.queue(&Message::Reply(Reply {
            nonce: self.hello.nonce,
            params: mine,
        }))?;
        self.state = IState::SendReply;
        self.deadline = now + self.timeout;
        Ok(())
    }

    /// Refuses the connection with a reason the connector reports (e.g. QP creation failed here).
    /// Poll until it returns the error carrying the reason. The deadline restarts at `now`.
    pub fn reject(&mut self, now: Instant, reason: &str) -> Result<()> {
        if self.state == IState::Finished {
            return Err(Error::Internal(
                "incoming connection used after it completed".into(),
            ));
        }
        self.frames.queue(&Message::Reject(reason.to_string()))?;
        self.reject_reason = Some(reason.to_string());
        self.state = IState::SendReject;
        self.deadline = now + self.timeout;
        Ok(())
    }

    /// When [`AcceptMachine::poll`] must run again even if no byte moves (`None` while the caller
    /// has to respond, or when finished).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            IState::SendReply | IState::AwaitReady | IState::SendReject => Some(self.deadline),
            IState::AwaitCaller | IState::Finished => None,
        }
    }

    /// Advances as far as the bytes received so far and `now` allow. An error ends it.
    pub fn poll(&mut self, now: Instant) -> Result<AcceptEvent> {
        let r = self.poll_inner(now);
        if r.is_err() {
            self.state = IState::Finished;
        }
        r
    }

    fn poll_inner(&mut self, now: Instant) -> Result<AcceptEvent> {
        loop {
            if self.poll_timeout().is_some() && now >= self.deadline {
                return Err(Error::Timeout(format!(
                    "accepting from {}: no progress within {} ms while {} (NCCL_SWITCHLESS_CONNECT_TIMEOUT)",
                    self.who,
                    self.timeout.as_millis(),
                    self.step_name()
                )));
            }
            // Each state returns an event, or `None` after moving to the next state.
            let event = match self.state {
                IState::AwaitCaller => Some(AcceptEvent::Pending),
                IState::SendReply => self.send_reply()?,
                IState::SendReject => self.send_reject()?,
                IState::AwaitReady => self.await_ready()?,
                IState::Finished => {
                    return Err(Error::Internal(
                        "incoming connection polled after it finished".into(),
                    ));
                }
            };
            if let Some(e) = event {
                return Ok(e);
            }
        }
    }

    fn send_reply(&mut self) -> Result<Option<AcceptEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return Err(f.into_error(&self.who, self.step_name()));
        }
        if !self.frames.flushed() {
            return Ok(Some(AcceptEvent::Pending));
        }
        self.frames.expect_frame();
        self.state = IState::AwaitReady;
        Ok(None)
    }

    fn send_reject(&mut self) -> Result<Option<AcceptEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return Err(f.into_error(&self.who, self.step_name()));
        }
        if !self.frames.flushed() {
            return Ok(Some(AcceptEvent::Pending));
        }
        let reason = self.reject_reason.take().unwrap_or_default();
        Err(Error::System(format!(
            "refused the connection from {}: {reason}",
            self.who
        )))
    }

    fn await_ready(&mut self) -> Result<Option<AcceptEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return Err(f.into_error(&self.who, self.step_name()));
        }
        match self.frames.take_frame() {
            None => Ok(Some(AcceptEvent::Pending)),
            Some(Message::Ready) => {
                self.state = IState::Finished;
                Ok(Some(AcceptEvent::Done))
            }
            Some(other) => Err(Error::Remote(format!(
                "{} sent {} instead of ready",
                self.who,
                other.name()
            ))),
        }
    }

    fn step_name(&self) -> &'static str {
        match self.state {
            IState::AwaitCaller => "waiting for the local QPs",
            IState::SendReply => "sending the reply",
            IState::AwaitReady => "waiting for its ready message",
            IState::SendReject => "sending a reject",
            IState::Finished => "finished",
        }
    }
}
