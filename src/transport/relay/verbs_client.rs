//! A's side of a verbs leg's set-up through a relay (door op 5, docs/guide/relay.md "Verbs legs"):
//! [`VerbsLeg`] runs the door exchange ([`Door`]), sends A's offer and reads K's ready, then,
//! once A's handshake with B has given B's end ([`VerbsLeg::peer`]), sends the peer message and
//! reads K's up. The connection then stays open as the leg's control channel
//! ([`VerbsLeg::into_control`]): closing it ends the leg at K. Driven without blocking.
#![forbid(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::client::{Door, DoorPoll};
use super::leg_setup::{Offer, Peer, READY_LEN, Ready, UP_LEN, parse_up};
use super::wire::{CommKey, NONCE_LEN, Op, RequestRepr, VerdictRepr};
use crate::error::{Error, Result};
use crate::sys::socket::{self as sock, Fill};

/// How long K may take to answer each set-up message.
pub const SETUP_WAIT: Duration = Duration::from_secs(10);

/// What one poll of a [`VerbsLeg`] gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegStep {
    /// Call again.
    Pending,
    /// K answered the offer (returned once): its queue pair ends and rings, the ring granted.
    /// Next: [`VerbsLeg::peer`] once B's end is known.
    Ready(Ready),
    /// Waiting for [`VerbsLeg::peer`].
    AwaitingPeer,
    /// K's queue pairs are connected: the leg forwards.
    Up,
}

enum State {
    Door(Box<Door>),
    Send {
        sock: TcpStream,
        bytes: Vec<u8>,
        sent: usize,
    },
    Read {
        sock: TcpStream,
        buf: Vec<u8>,
        got: usize,
    },
    AwaitingPeer(TcpStream),
    Up(TcpStream),
    Gone,
}

/// A's set-up of one verbs leg (module docs).
pub struct VerbsLeg {
    /// `relay 10.0.0.2:24611`, for errors.
    what: String,
    offer: Offer,
    state: State,
    verdict: Option<VerdictRepr>,
    ready: Option<Ready>,
    /// When the message now awaited was asked for.
    asked: Instant,
}

impl std::fmt::Debug for VerbsLeg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsLeg")
            .field("what", &self.what)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl VerbsLeg {
    /// Connects from `local` (A's address on the A-K link) to K's door at `relay` and asks for a
    /// verbs leg to `target` (B's address on the K-B link), offering `offer`.
    pub fn start(
        local: Ipv4Addr,
        relay: SocketAddr,
        key: CommKey,
        target: Ipv4Addr,
        offer: Offer,
    ) -> Result<VerbsLeg> {
        let req = RequestRepr {
            op: Op::OpenVerbs,
            comm: key.id(),
            port: 0,
            targets: vec![target],
            nonce: [0; NONCE_LEN],
            tag: [0; NONCE_LEN],
        };
        let sock = super::client::bound_socket(local)?;
        let door = Door::start(sock, relay, key, req)?;
        Ok(VerbsLeg {
            what: format!("relay {relay}"),
            offer,
            state: State::Door(Box::new(door)),
            verdict: None,
            ready: None,
            asked: Instant::now(),
        })
    }

    /// K's verdict, once in (its host name, its address on B's link, the link's speed).
    pub fn verdict(&self) -> Option<&VerdictRepr> {
        self.verdict.as_ref()
    }

    /// K's ready, once in.
    pub fn ready(&self) -> Option<&Ready> {
        self.ready.as_ref()
    }

    /// B's end and credit word, from the handshake's reply: sent to K.
    pub fn peer(&mut self, peer: &Peer) -> Result<()> {
        match std::mem::replace(&mut self.state, State::Gone) {
            State::AwaitingPeer(sock) => {
                self.state = State::Send {
                    sock,
                    bytes: peer.to_bytes().to_vec(),
                    sent: 0,
                };
                self.asked = Instant::now();
                Ok(())
            }
            other => {
                self.state = other;
                Err(Error::InvalidUsage(format!(
                    "{}: the peer message before the relay's ready, or twice",
                    self.what
                )))
            }
        }
    }

    /// The leg's control channel, once up: the leg lives while it is open.
    pub fn into_control(self) -> Result<TcpStream> {
        match self.state {
            State::Up(s) => Ok(s),
            _ => Err(Error::InvalidUsage(format!(
                "{}: the verbs leg is not up",
                self.what
            ))),
        }
    }

    /// Advances as far as the socket allows. An error names the relay and the step.
    pub fn poll(&mut self) -> Result<LegStep> {
        loop {
            match std::mem::replace(&mut self.state, State::Gone) {
                State::Door(mut door) => match door.poll()? {
                    DoorPoll::Pending => {
                        self.state = State::Door(door);
                        return Ok(LegStep::Pending);
                    }
                    DoorPoll::Done(v, sock) => {
                        self.verdict = Some(v);
                        self.state = State::Send {
                            sock,
                            bytes: self.offer.to_bytes().to_vec(),
                            sent: 0,
                        };
                        self.asked = Instant::now();
                    }
                    DoorPoll::NoService => {
                        return Err(Error::Remote(format!(
                            "{}: no relay service listens there",
                            self.what
                        )));
                    }
                    DoorPoll::Dropped(why) => return Err(Error::Remote(why)),
                },
                State::Send {
                    sock,
                    bytes,
                    mut sent,
                } => {
                    match sock::drain(&sock, &bytes, &mut sent) {
                        Ok(true) => {}
                        Ok(false) => {
                            self.state = State::Send { sock, bytes, sent };
                            return self.waiting();
                        }
                        Err(e) => {
                            return Err(Error::System(format!(
                                "{}: sending the verbs leg's set-up: {e}",
                                self.what
                            )));
                        }
                    }
                    let n = if self.ready.is_none() {
                        READY_LEN
                    } else {
                        UP_LEN
                    };
                    self.state = State::Read {
                        sock,
                        buf: vec![0; n],
                        got: 0,
                    };
                }
                State::Read {
                    sock,
                    mut buf,
                    mut got,
                } => {
                    match sock::fill(&sock, &mut buf, &mut got) {
                        Ok(Fill::Whole) => {}
                        Ok(Fill::Pending) => {
                            self.state = State::Read { sock, buf, got };
                            return self.waiting();
                        }
                        Ok(Fill::Closed) => {
                            return Err(Error::Remote(format!(
                                "{}: closed the verbs leg's set-up (it refused the {} message, \
                                 or could not make its queue pairs)",
                                self.what,
                                if self.ready.is_none() {
                                    "offer"
                                } else {
                                    "peer"
                                }
                            )));
                        }
                        Err(e) => {
                            return Err(Error::System(format!(
                                "{}: reading the verbs leg's set-up: {e}",
                                self.what
                            )));
                        }
                    }
                    if self.ready.is_none() {
                        let bytes: &[u8; READY_LEN] = buf
                            .as_slice()
                            .try_into()
                            .map_err(|_| Error::Internal("ready length".into()))?;
                        let r = Ready::parse(bytes).map_err(|e| e.context(&self.what))?;
                        r.answers(&self.offer).map_err(|e| e.context(&self.what))?;
                        self.ready = Some(r);
                        self.state = State::AwaitingPeer(sock);
                        return Ok(LegStep::Ready(r));
                    }
                    let bytes: &[u8; UP_LEN] = buf
                        .as_slice()
                        .try_into()
                        .map_err(|_| Error::Internal("up length".into()))?;
                    parse_up(bytes).map_err(|e| e.context(&self.what))?;
                    self.state = State::Up(sock);
                    return Ok(LegStep::Up);
                }
                State::AwaitingPeer(s) => {
                    self.state = State::AwaitingPeer(s);
                    return Ok(LegStep::AwaitingPeer);
                }
                State::Up(s) => {
                    self.state = State::Up(s);
                    return Ok(LegStep::Up);
                }
                State::Gone => {
                    return Err(Error::Internal(format!(
                        "{}: the verbs leg's set-up used after it failed",
                        self.what
                    )));
                }
            }
        }
    }

    /// Pending, unless K took longer than [`SETUP_WAIT`] to answer.
    fn waiting(&self) -> Result<LegStep> {
        if self.asked.elapsed() > SETUP_WAIT {
            return Err(Error::Remote(format!(
                "{}: no answer to the verbs leg's set-up within {} s",
                self.what,
                SETUP_WAIT.as_secs()
            )));
        }
        Ok(LegStep::Pending)
    }
}
