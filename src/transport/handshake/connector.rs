//! The connector's side of the handshake as a state machine: TCP connect, hello, reply, ready.
//!
//! Sans-IO: it never touches a socket and never reads the clock. The driver (`io.rs`, or a test)
//! passes `now` in, opens the connections [`ConnectEvent::Open`] asks for, moves bytes through
//! [`ConnectMachine::frames`] and calls [`ConnectMachine::poll`] again by
//! [`ConnectMachine::poll_timeout`] at the latest.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use super::auth::{ConnKey, conn_nonce};
use super::frames::{Fault, Frames};
use super::listener::ipv4_mapped_gid;
use super::wire::{Hello, Message, PathRequest, SideParams, TAG_LEN, Tag};
use crate::error::{Error, Result};
use crate::route::handle::HandleRepr;
use crate::route::select::PathChoice;
use crate::route::types::LinkKind;

/// Longest a connector waits for a TCP connection to one target before trying the next one (the
/// last target gets the rest of the timeout, or, with none, as long as the kernel keeps trying). A
/// directly cabled peer answers in well under a millisecond, a soft-RoCE VM under TCG in a few.
pub const TARGET_BUDGET: Duration = Duration::from_secs(5);
/// With no connect timeout, how long the last target may take to answer a TCP connection (Linux
/// gives up a SYN after about 127 s with its default `tcp_syn_retries`, so this is only a backstop).
pub const LAST_TARGET_WAIT: Duration = Duration::from_secs(180);
/// The first wait before a connector opens a new connection after the acceptor closed or reset one
/// before its reply (a listener full of strangers' connections makes room that way); it doubles
/// with every retry up to [`RETRY_BACKOFF_MAX`]. Retries go on until the connect timeout, or, with
/// none, as long as NCCL calls `connect` (NCCL has no deadline).
pub const RETRY_BACKOFF: Duration = Duration::from_millis(20);
/// The longest wait between retries.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long a connector keeps trying while the only answers are rejects without its connection's
/// tag (a stale handle, or something answering for the address) before it fails.
pub const UNAUTHENTICATED_GIVE_UP: Duration = Duration::from_secs(60);

/// What [`ConnectMachine::poll`] asks of the driver or reports.
#[derive(Debug, PartialEq, Eq)]
pub enum ConnectEvent {
    /// Open a TCP connection to `addr` (from `bind` when set), dropping any earlier attempt; then
    /// report [`ConnectMachine::connected`] or [`ConnectMachine::connect_failed`].
    Open {
        addr: SocketAddrV4,
        bind: Option<Ipv4Addr>,
    },
    /// Nothing to do until bytes move or [`ConnectMachine::poll_timeout`] passes.
    Pending,
    /// The acceptor's params, reported once. Bring the QPs up, then call [`ConnectMachine::ready`].
    Reply(SideParams),
    /// Ready is sent: the handshake is complete and the connection belongs to the caller.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The next target is to be opened.
    Open,
    /// The driver is connecting to the current target.
    Connecting,
    /// The acceptor closed the connection before replying: a new one is opened at `retry_at`.
    Backoff,
    SendHello,
    AwaitReply,
    AwaitCaller,
    SendReady,
    Finished,
}

/// The connector's handshake.
#[derive(Debug)]
pub struct ConnectMachine {
    state: State,
    /// Where to connect, in order (routed link address, then the control address), with the source
    /// address to bind for each.
    targets: Vec<(SocketAddrV4, Option<Ipv4Addr>)>,
    /// The next target to open; the current one is `target - 1`.
    target: usize,
    /// When the connection attempt to the current target is given up for the next one (a target
    /// that drops SYNs would otherwise use up the whole timeout); the last target has the deadline.
    target_deadline: Instant,
    failures: Vec<String>,
    hello: Message,
    /// This connection's own nonce (the hello's), its key and the hello's tag.
    conn_nonce: u64,
    key: ConnKey,
    hello_tag: Tag,
    requests: Vec<PathRequest>,
    /// `None` (the default): time counts only while reaching a target ([`TARGET_BUDGET`] for each
    /// but the last); the wait for the peer's NCCL to accept is unbounded, as in NCCL.
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    peer: String,
    frames: Frames,
    /// Connections the acceptor closed before its reply so far (the backoff doubles each).
    retries: u32,
    /// When the next connection is opened ([`State::Backoff`]).
    retry_at: Instant,
    /// The listener's nonce (a retry derives a new connection key).
    listener_nonce: u64,
    /// Why the last connection was retried (named if the retry fails too).
    retried_because: Option<String>,
    /// When the first reject without this connection's tag came ([`UNAUTHENTICATED_GIVE_UP`]).
    unauthenticated_since: Option<Instant>,
}

/// Text of a peer's authenticated reject as logs show it: control characters escaped, so no line
/// of it passes for one of ours.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let esc: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            esc
        })
        .collect()
}

impl ConnectMachine {
    /// A handshake with the listener described by `handle` over `paths` (from
    /// [`crate::route::select()`]), with this side's params (one per path). It connects to the first
    /// path's peer address (bound to its local address), then, if that fails or does not answer
    /// within [`TARGET_BUDGET`] (at most half the timeout), to the handle's control address. With a
    /// `timeout`, each step fails that long after it started; with `None`, only reaching a target
    /// can fail.
    pub fn for_handle(
        now: Instant,
        handle: &HandleRepr,
        paths: &[PathChoice],
        mine: SideParams,
        timeout: impl Into<Option<Duration>>,
    ) -> Result<Self> {
        let first = paths
            .first()
            .ok_or_else(|| Error::InvalidArgument("connector started with no paths".into()))?;
        let mut targets = vec![(
            SocketAddrV4::new(first.remote.addr.addr(), handle.port),
            Some(first.local.addr.addr()),
        )];
        if let Some(c) = handle.control {
            if c != first.remote.addr.addr() {
                targets.push((SocketAddrV4::new(c, handle.port), None));
            }
        }
        let requests: Vec<PathRequest> = paths
            .iter()
            .map(|p| PathRequest {
                connector: p.local.addr,
                acceptor: p.remote.addr.addr(),
                kind: p.kind,
                relayed: false,
            })
            .collect();
        let peer = format!(
            "peer {} (port {})",
            handle
                .links
                .iter()
                .map(|l| l.addr.addr().to_string())
                .collect::<Vec<_>>()
                .join("/"),
            handle.port
        );
        Self::new(now, targets, handle.nonce, requests, mine, timeout, peer)
    }

    /// A handshake to explicit targets `(address, source address to bind)` of the listener whose
    /// handle carries `nonce`; `peer` names the listener in errors.
    pub fn new(
        now: Instant,
        targets: Vec<(SocketAddrV4, Option<Ipv4Addr>)>,
        nonce: u64,
        paths: Vec<PathRequest>,
        mine: SideParams,
        timeout: impl Into<Option<Duration>>,
        peer: String,
    ) -> Result<Self> {
        let timeout = timeout.into();
        if targets.is_empty() {
            return Err(Error::InvalidArgument(
                "connector has no address to connect to".into(),
            ));
        }
        let conn_nonce = conn_nonce()?;
        let key = ConnKey::derive(nonce, conn_nonce);
        let mut hello = Hello {
            nonce: conn_nonce,
            paths: paths.clone(),
            params: mine,
            tag: [0; TAG_LEN],
        };
        // Validates the counts now, not mid-handshake.
        hello.tag = key.hello_tag(&hello)?;
        let hello_tag = hello.tag;
        Ok(ConnectMachine {
            state: State::Open,
            targets,
            target: 0,
            target_deadline: now,
            failures: Vec::new(),
            hello: Message::Hello(hello),
            conn_nonce,
            key,
            hello_tag,
            requests: paths,
            deadline: timeout.map(|t| now + t),
            timeout,
            peer,
            frames: Frames::default(),
            retries: 0,
            retry_at: now,
            listener_nonce: nonce,
            retried_because: None,
            unauthenticated_since: None,
        })
    }

    /// Connections the acceptor closed before its reply, each retried with a new one.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// The secret the connection's fabrics get (derived from this connection's key).
    pub fn fabric_secret(&self) -> super::auth::ConnSecret {
        self.key.fabric_secret()
    }

    /// The listener, as errors name it.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The connection's bytes, for the driver to move.
    pub fn frames(&mut self) -> &mut Frames {
        &mut self.frames
    }

    /// The connection [`ConnectEvent::Open`] asked for is established.
    pub fn connected(&mut self) -> Result<()> {
        if self.state != State::Connecting {
            return Err(self.misuse("connected()"));
        }
        self.frames.queue(&self.hello)?;
        self.state = State::SendHello;
        Ok(())
    }

    /// The connection [`ConnectEvent::Open`] asked for failed (refused, unreachable, ...): the next
    /// poll opens the next target, or fails when none is left.
    pub fn connect_failed(&mut self, reason: impl std::fmt::Display) -> Result<()> {
        if self.state != State::Connecting {
            return Err(self.misuse("connect_failed()"));
        }
        self.failures
            .push(format!("{}: {reason}", self.current_target()));
        self.state = State::Open;
        Ok(())
    }

    /// The driver gave up on the connection (its socket failed): the handshake is over.
    pub fn abort(&mut self) {
        self.state = State::Finished;
    }

    /// When [`ConnectMachine::poll`] must run again even if no byte moves (`None`: only the caller
    /// can move it on, or it is finished).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Connecting => Some(
                self.deadline
                    .map_or(self.target_deadline, |d| self.target_deadline.min(d)),
            ),
            State::Backoff => Some(
                self.deadline
                    .map_or(self.retry_at, |d| self.retry_at.min(d)),
            ),
            State::Open | State::SendHello | State::AwaitReply | State::SendReady => self.deadline,
            State::AwaitCaller | State::Finished => None,
        }
    }

    /// Advances the handshake as far as the bytes received so far and `now` allow. An error ends it.
    pub fn poll(&mut self, now: Instant) -> Result<ConnectEvent> {
        let r = self.poll_inner(now);
        if r.is_err() {
            self.state = State::Finished;
        }
        r
    }

    fn poll_inner(&mut self, now: Instant) -> Result<ConnectEvent> {
        loop {
            if !matches!(self.state, State::AwaitCaller | State::Finished)
                && let Some(d) = self.deadline
                && now >= d
            {
                return Err(Error::Timeout(format!(
                    "connecting to {}: no progress within {} ms while {} (NCCL_SWITCHLESS_CONNECT_TIMEOUT)",
                    self.peer,
                    self.timeout.unwrap_or_default().as_millis(),
                    self.step_name()
                )));
            }
            // Each state returns an event, or `None` after moving to the next state.
            let event = match self.state {
                State::Open => Some(self.open_next(now)?),
                State::Connecting => self.connecting(now),
                State::Backoff if now < self.retry_at => Some(ConnectEvent::Pending),
                State::Backoff => {
                    self.state = State::Open;
                    None
                }
                State::SendHello => self.send_hello(now)?,
                State::AwaitReply => self.await_reply(now)?,
                State::AwaitCaller => Some(ConnectEvent::Pending),
                State::SendReady => self.send_ready()?,
                State::Finished => {
                    return Err(Error::Internal(
                        "connector polled after it finished or failed".into(),
                    ));
                }
            };
            if let Some(e) = event {
                return Ok(e);
            }
        }
    }

    fn open_next(&mut self, now: Instant) -> Result<ConnectEvent> {
        let Some(&(addr, bind)) = self.targets.get(self.target) else {
            let earlier = self
                .retried_because
                .as_ref()
                .map(|w| format!(" (before that: {w})"))
                .unwrap_or_default();
            return Err(Error::System(format!(
                "cannot open a TCP connection to {}: {}{earlier}",
                self.peer,
                self.failures.join("; ")
            )));
        };
        self.target += 1;
        self.target_deadline = match self.deadline {
            _ if self.target < self.targets.len() => now + self.target_budget(),
            Some(d) => d,
            // The last target, no deadline: the kernel's own connect timeout ends a silent one.
            None => now + LAST_TARGET_WAIT,
        };
        self.state = State::Connecting;
        Ok(ConnectEvent::Open { addr, bind })
    }

    fn connecting(&mut self, now: Instant) -> Option<ConnectEvent> {
        if now < self.target_deadline {
            return Some(ConnectEvent::Pending);
        }
        let waited = if self.target < self.targets.len() {
            self.target_budget()
        } else {
            self.timeout.unwrap_or(LAST_TARGET_WAIT)
        };
        self.failures.push(format!(
            "{}: no answer within {} ms",
            self.current_target(),
            waited.as_millis()
        ));
        self.state = State::Open;
        None
    }

    fn send_hello(&mut self, now: Instant) -> Result<Option<ConnectEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return self.closed_early(now, f, "sending the hello");
        }
        if !self.frames.flushed() {
            return Ok(Some(ConnectEvent::Pending));
        }
        self.frames.expect_frame();
        self.state = State::AwaitReply;
        Ok(None)
    }

    fn await_reply(&mut self, now: Instant) -> Result<Option<ConnectEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return self.closed_early(now, f, "waiting for the acceptor's reply");
        }
        let r = match self.frames.take_frame() {
            None => return Ok(Some(ConnectEvent::Pending)),
            Some(Message::Reply(r)) => r,
            Some(Message::Refuse(f)) if self.key.check_refuse(&self.hello_tag, &f) => {
                // Reached at a later target (the control address), the refusal is often about
                // where the connection came from: what failed first is the cause to name.
                let after = if self.failures.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (this connection reached it at {} after: {})",
                        self.current_target(),
                        self.failures.join("; ")
                    )
                };
                return Err(Error::Remote(format!(
                    "{} rejected the connection: {}{after}",
                    self.peer,
                    printable(&f.reason)
                )));
            }
            Some(Message::Reject(_) | Message::Refuse(_)) => return self.unauthenticated(now),
            Some(other) => {
                return Err(Error::Remote(format!(
                    "{} sent {} while a reply was expected",
                    self.peer,
                    other.name()
                )));
            }
        };
        if r.nonce != self.conn_nonce || !self.key.check_reply(&self.hello_tag, &r) {
            return Err(Error::Remote(format!(
                "{}: the reply is not authenticated by the handle's nonce for this connection: a different listener answered",
                self.peer
            )));
        }
        if r.params.paths.len() != self.requests.len() {
            return Err(Error::Remote(format!(
                "{} replied with params for {} paths, the hello asked for {}",
                self.peer,
                r.params.paths.len(),
                self.requests.len()
            )));
        }
        for (i, (req, par)) in self.requests.iter().zip(&r.params.paths).enumerate() {
            if req.kind == LinkKind::Roce && par.gid != ipv4_mapped_gid(req.acceptor) {
                return Err(Error::Remote(format!(
                    "{}: path {i}: the acceptor's RoCE GID {} is not the IPv4-mapped GID of the address this side dialed, ::ffff:{}",
                    self.peer,
                    std::net::Ipv6Addr::from(par.gid),
                    req.acceptor
                )));
            }
        }
        self.state = State::AwaitCaller;
        Ok(Some(ConnectEvent::Reply(r.params)))
    }

    /// The connection failed before the acceptor's reply. Closed or reset, it was the acceptor's
    /// doing (a listener that makes room for newer connections, or one out of descriptors): a new
    /// connection, with a new connector nonce, is opened after a backoff, from the first target.
    /// Anything else (a malformed frame) fails the handshake.
    fn closed_early(&mut self, now: Instant, f: Fault, step: &str) -> Result<Option<ConnectEvent>> {
        let closed = match &f {
            Fault::Closed => true,
            Fault::Io(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            ),
            Fault::Malformed(_) => false,
        };
        if !closed {
            return Err(f.into_error(&self.peer, step));
        }
        let why = f.into_error(&self.peer, step);
        self.retry(now, &why.to_string())?;
        Ok(None)
    }

    /// A reject without this connection's tag: it could come from anything that answers for the
    /// address (or a listener on a reused port, which never knew the handle), so it is not acted on
    /// and its text is not shown: a new connection is tried after a backoff. Only when nothing but
    /// such rejects came for [`UNAUTHENTICATED_GIVE_UP`] does the connector fail, with a fixed text.
    fn unauthenticated(&mut self, now: Instant) -> Result<Option<ConnectEvent>> {
        let since = *self.unauthenticated_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= UNAUTHENTICATED_GIVE_UP {
            return Err(Error::Remote(format!(
                "{}: refused for {} s with rejects not authenticated by the handle's nonce: a \
                 stale handle, or something other than the listener answering for its address \
                 (their text is not shown)",
                self.peer,
                UNAUTHENTICATED_GIVE_UP.as_secs()
            )));
        }
        self.retry(
            now,
            &format!(
                "{}: a reject not authenticated by the handle's nonce (not acted on; its text is \
                 not shown)",
                self.peer
            ),
        )?;
        Ok(None)
    }

    /// Starts over after `backoff`: a fresh connection nonce, key and hello, the targets in order.
    fn retry(&mut self, now: Instant, why: &str) -> Result<()> {
        let wait = RETRY_BACKOFF
            .saturating_mul(1u32 << self.retries.min(16))
            .min(RETRY_BACKOFF_MAX);
        self.retries = self.retries.saturating_add(1);
        let Message::Hello(mut hello) = self.hello.clone() else {
            return Err(Error::Internal("connector without a hello".into()));
        };
        self.conn_nonce = conn_nonce()?;
        self.key = ConnKey::derive(self.listener_nonce, self.conn_nonce);
        hello.nonce = self.conn_nonce;
        hello.tag = self.key.hello_tag(&hello)?;
        self.hello_tag = hello.tag;
        self.hello = Message::Hello(hello);
        self.frames = Frames::default();
        self.target = 0;
        self.failures.clear();
        self.retry_at = now + wait;
        self.state = State::Backoff;
        self.retried_because = Some(why.to_string());
        if self.retries == 1 {
            tracing::warn!(
                "NET/switchless: {why}; connecting again in {} ms with a new connection (retried \
                 until it gets in: a listener makes room for newer connections when strangers hold \
                 its places)",
                wait.as_millis()
            );
        } else {
            tracing::debug!(
                "NET/switchless: {why}; retry {} in {} ms",
                self.retries,
                wait.as_millis()
            );
        }
        Ok(())
    }

    fn send_ready(&mut self) -> Result<Option<ConnectEvent>> {
        if let Some(f) = self.frames.take_fault() {
            return Err(f.into_error(&self.peer, "sending ready"));
        }
        if !self.frames.flushed() {
            return Ok(Some(ConnectEvent::Pending));
        }
        self.state = State::Finished;
        Ok(Some(ConnectEvent::Done))
    }

    /// Tells the acceptor this side is ready (after [`ConnectEvent::Reply`]); keep polling until
    /// `Done`. The deadline restarts at `now`.
    pub fn ready(&mut self, now: Instant) -> Result<()> {
        if self.state != State::AwaitCaller {
            return Err(self.misuse("ready()"));
        }
        self.frames.queue(&Message::Ready)?;
        self.deadline = self.timeout.map(|t| now + t);
        self.state = State::SendReady;
        Ok(())
    }

    fn target_budget(&self) -> Duration {
        self.timeout
            .map_or(TARGET_BUDGET, |t| TARGET_BUDGET.min(t / 2))
    }

    fn current_target(&self) -> String {
        self.target
            .checked_sub(1)
            .and_then(|i| self.targets.get(i))
            .map(|t| t.0.to_string())
            .unwrap_or_default()
    }

    fn misuse(&self, call: &str) -> Error {
        Error::Internal(format!(
            "connector {call} called while {}",
            self.step_name()
        ))
    }

    fn step_name(&self) -> &'static str {
        match self.state {
            State::Open | State::Connecting | State::Backoff => "opening the TCP connection",
            State::SendHello => "sending the hello",
            State::AwaitReply => "waiting for the acceptor's reply",
            State::AwaitCaller => "waiting for the local QPs",
            State::SendReady => "sending ready",
            State::Finished => "finished",
        }
    }
}
