//! An in-memory network with a virtual clock for the handshake state machines (the idea of quinn's
//! test `Pair`): a connection is two byte queues, a listener is a [`ListenMachine`] over the
//! acceptor ends, and time moves only when a test moves it, usually to the next `poll_timeout`.
//! Nothing here sleeps or opens a socket. The drivers here mirror `src/transport/handshake/io.rs`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::rc::Rc;
use std::time::{Duration, Instant};

use switchless::error::Result;
use switchless::transport::handshake::{
    AcceptEvent, AcceptMachine, AcceptorView, ConnectEvent, ConnectMachine, Frames, ListenMachine,
    MAX_PENDING_PROCESS, PendingBudget,
};

#[derive(Debug, Default)]
struct Pipe {
    /// Bytes written by side 0 (the connector) and side 1 (the acceptor), not yet read.
    bytes: [VecDeque<u8>; 2],
    closed: [bool; 2],
}

/// One end of an in-memory connection; dropping it closes that end, as closing a socket does.
#[derive(Debug)]
pub struct End {
    pipe: Rc<RefCell<Pipe>>,
    side: usize,
    /// The address of the other end.
    pub peer: SocketAddr,
}

impl End {
    /// Writes raw bytes (for clients that are not a [`ConnectMachine`]).
    pub fn write(&self, b: &[u8]) {
        self.pipe.borrow_mut().bytes[self.side].extend(b);
    }

    /// Takes every byte the other end wrote so far.
    pub fn take(&self) -> Vec<u8> {
        self.pipe.borrow_mut().bytes[1 - self.side]
            .drain(..)
            .collect()
    }

    /// Bytes written by the other end and not read yet.
    pub fn unread(&self) -> usize {
        self.pipe.borrow().bytes[1 - self.side].len()
    }

    /// Whether the other end closed.
    pub fn peer_closed(&self) -> bool {
        self.pipe.borrow().closed[1 - self.side]
    }
}

impl Drop for End {
    fn drop(&mut self) {
        self.pipe.borrow_mut().closed[self.side] = true;
    }
}

fn pipe(connector: SocketAddr, acceptor: SocketAddr) -> (End, End) {
    let p = Rc::new(RefCell::new(Pipe::default()));
    (
        End {
            pipe: Rc::clone(&p),
            side: 0,
            peer: acceptor,
        },
        End {
            pipe: p,
            side: 1,
            peer: connector,
        },
    )
}

/// Moves bytes between an end and a machine's frames, at most `chunk` bytes per read (small values
/// split headers and payloads). Returns whether anything happened.
pub fn pump(end: &End, f: &mut Frames, chunk: usize) -> bool {
    let mut moved = false;
    let tx = f.transmit().to_vec();
    if !tx.is_empty() {
        end.write(&tx);
        f.sent(tx.len());
        moved = true;
    }
    loop {
        let want = f.want().min(chunk);
        if want == 0 {
            return moved;
        }
        let mut p = end.pipe.borrow_mut();
        let inbound = &mut p.bytes[1 - end.side];
        if inbound.is_empty() {
            if p.closed[1 - end.side] {
                drop(p);
                f.closed();
                return true;
            }
            return moved;
        }
        let n = want.min(inbound.len());
        let b: Vec<u8> = inbound.drain(..n).collect();
        drop(p);
        assert_eq!(
            f.received(&b),
            n,
            "frames took fewer bytes than they wanted"
        );
        moved = true;
    }
}

/// What a connector finds at an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// The net's listener.
    Listener,
    /// Accepts and hands the connection to the test (`Net::raw`), which plays the acceptor.
    Raw,
    /// Refuses the connection.
    Refuses,
    /// Drops SYNs: the connect neither completes nor fails.
    DropsSyns,
}

/// A connector and its end of the connection.
#[derive(Debug)]
pub struct Conn {
    pub m: ConnectMachine,
    pub end: Option<End>,
    /// Every address it was told to open, with the virtual time it was told.
    pub opened: Vec<(SocketAddrV4, Instant)>,
}

/// An accepted connection with a valid hello and its end.
#[derive(Debug)]
pub struct Inc {
    pub m: AcceptMachine,
    pub end: Option<End>,
}

pub struct Net {
    /// The virtual clock.
    pub now: Instant,
    /// Bytes per read (see [`pump`]).
    pub chunk: usize,
    pub hosts: HashMap<SocketAddrV4, Host>,
    pub listener: ListenMachine<End>,
    /// Where the listener is.
    pub listen_addr: SocketAddrV4,
    /// Connections made but not yet admitted by the listener (the kernel's accept queue).
    backlog: Vec<End>,
    /// Acceptor ends of connections to [`Host::Raw`] addresses, in order.
    pub raw: VecDeque<End>,
    next_port: u16,
}

impl Net {
    /// A net with a listener at `listen_addr` (`timeout`: `None` for none, as the plugin's default).
    pub fn new(
        listen_addr: SocketAddrV4,
        nonce: u64,
        view: AcceptorView,
        timeout: impl Into<Option<Duration>>,
    ) -> Self {
        // A budget of its own: tests run in parallel, and the process's would couple them.
        Self::with_budget(
            listen_addr,
            nonce,
            view,
            timeout,
            PendingBudget::new(MAX_PENDING_PROCESS),
        )
    }

    /// [`Net::new`] whose listener counts against `budget` (several nets sharing one play the
    /// listeners of one process).
    pub fn with_budget(
        listen_addr: SocketAddrV4,
        nonce: u64,
        view: AcceptorView,
        timeout: impl Into<Option<Duration>>,
        budget: std::sync::Arc<PendingBudget>,
    ) -> Self {
        let mut hosts = HashMap::new();
        hosts.insert(listen_addr, Host::Listener);
        Net {
            now: Instant::now(),
            chunk: usize::MAX,
            hosts,
            listener: ListenMachine::with_budget(listen_addr.port(), nonce, view, timeout, budget),
            listen_addr,
            backlog: Vec::new(),
            raw: VecDeque::new(),
            next_port: 40000,
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Moves the clock to the earliest of `timeouts` (never backwards); false if there is none.
    pub fn jump(&mut self, timeouts: &[Option<Instant>]) -> bool {
        match timeouts.iter().flatten().min() {
            Some(&t) => {
                self.now = self.now.max(t);
                true
            }
            None => false,
        }
    }

    /// Connects a new client end to `addr` as a connector at 127.0.0.1 would (the listener admits
    /// it on its next poll). `None` unless a listener or raw host is there.
    pub fn dial(&mut self, addr: SocketAddrV4) -> Option<End> {
        self.dial_from(addr, Ipv4Addr::LOCALHOST)
    }

    /// [`Net::dial`] from source address `src`.
    pub fn dial_from(&mut self, addr: SocketAddrV4, src: Ipv4Addr) -> Option<End> {
        let port = self.next_port;
        self.next_port += 1;
        let me = SocketAddr::V4(SocketAddrV4::new(src, port));
        let (c, a) = pipe(me, SocketAddr::V4(addr));
        match self.hosts.get(&addr) {
            Some(Host::Listener) => self.backlog.push(a),
            Some(Host::Raw) => self.raw.push_back(a),
            _ => return None,
        }
        Some(c)
    }

    /// The connections the listener has not admitted yet (tests that admit by hand).
    pub fn take_backlog(&mut self) -> Vec<End> {
        std::mem::take(&mut self.backlog)
    }

    /// A connector; its first connection is opened at once, as `Connector::start` does.
    pub fn connector(&mut self, m: ConnectMachine) -> Result<Conn> {
        let mut c = Conn {
            m,
            end: None,
            opened: Vec::new(),
        };
        while let ConnectEvent::Open { addr, .. } = c.m.poll(self.now)? {
            self.open(&mut c, addr)?;
        }
        Ok(c)
    }

    fn open(&mut self, c: &mut Conn, addr: SocketAddrV4) -> Result<()> {
        c.end = None;
        c.opened.push((addr, self.now));
        match self.hosts.get(&addr).copied() {
            Some(Host::Listener | Host::Raw) => {
                c.end = self.dial(addr);
                c.m.connected()
            }
            Some(Host::DropsSyns) => Ok(()),
            Some(Host::Refuses) | None => c.m.connect_failed("Connection refused (os error 111)"),
        }
    }

    /// Polls a connector as `Connector::poll` does: bytes, then the machine, until nothing moves.
    pub fn poll_connector(&mut self, c: &mut Conn) -> Result<ConnectEvent> {
        loop {
            let moved = match &c.end {
                Some(e) => pump(e, c.m.frames(), self.chunk),
                None => false,
            };
            match c.m.poll(self.now)? {
                ConnectEvent::Open { addr, .. } => self.open(c, addr)?,
                ConnectEvent::Pending if moved => {}
                ev => return Ok(ev),
            }
        }
    }

    /// Polls the listener as `Listener::poll` does: the connections in progress first, then admits
    /// the backlog (a refused one is closed), then bytes and the machine until nothing moves.
    pub fn poll_listener(&mut self) -> Result<Option<Inc>> {
        if let Some(inc) = self.advance_listener()? {
            return Ok(Some(inc));
        }
        let chunk = self.chunk;
        for a in std::mem::take(&mut self.backlog) {
            let peer = a.peer;
            drop(self.listener.admit(self.now, a, peer, |e, f| {
                pump(e, f, chunk);
            }));
        }
        self.advance_listener()
    }

    fn advance_listener(&mut self) -> Result<Option<Inc>> {
        loop {
            let mut moved = false;
            let chunk = self.chunk;
            for (end, frames) in self.listener.connections() {
                moved |= pump(end, frames, chunk);
            }
            if let Some((end, m)) = self.listener.poll(self.now)? {
                return Ok(Some(Inc { m, end: Some(end) }));
            }
            if !moved {
                for (end, frames) in self.listener.connections() {
                    pump(end, frames, chunk);
                }
                return Ok(None);
            }
        }
    }

    /// Polls an incoming connection as `Incoming::poll` does.
    pub fn poll_incoming(&mut self, i: &mut Inc) -> Result<AcceptEvent> {
        loop {
            let moved = match &i.end {
                Some(e) => pump(e, i.m.frames(), self.chunk),
                None => false,
            };
            match i.m.poll(self.now)? {
                AcceptEvent::Pending if moved => {}
                ev => return Ok(ev),
            }
        }
    }
}
