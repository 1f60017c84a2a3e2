//! The reconnect exchange of failback, sans-IO: how the two ends of a failed path agree on the
//! fresh queue pairs that replace the old ones. The verbs fabric drives it (`crate::verbs`); this
//! module only decides, from the port state and the last message the peer left, what to do next.
//!
//! Each end has, per data path, a mailbox of [`MSG_WORDS`] words in its control memory that the
//! peer writes over a surviving path (an RDMA write; its address and keys travel in the
//! authenticated handshake). A message is a *state*, not a queue entry: the newest one overwrites
//! the last, so a lost write is made good by the next probe's, and a duplicate changes nothing.
//!
//! * Every rebuild of a path has an **epoch** (1 for the first). An end that starts one offers a
//!   fresh queue pair ([`Stage::Offer`]: its QPN and PSN); an end that sees the peer offer an epoch
//!   beyond its own joins it ([`Reviver::peer_restarted`] makes it give up its old queue pair).
//! * An end that has its fresh queue pair and the peer's offer for the same epoch connects it
//!   (RTR, RTS) and answers [`Stage::Ack`] naming the peer's QPN. It is **ready** once the peer's
//!   ack names its own QPN: both ends are then connected to each other's fresh queue pairs, with
//!   their receives posted.
//! * A ready end keeps answering an ack it sees again with a newer sequence number (the peer
//!   missed the answer), so neither side waits on a lost last message.
//! * The port going down mid-way, or an ack naming another queue pair, restarts at the next epoch
//!   with a fresh queue pair (the old one may hold receives or be connected to the wrong QPN).
//!
//! Messages carry a version and a 128-bit keyed BLAKE3 tag over their words, keyed by a
//! [`BindKey`] both ends derive from the connection's secret (from the handshake's key, never on
//! the wire) and the handshake parameters; a message with
//! another version, another key, another path or from this end itself is ignored and counted.
#![forbid(unsafe_code)]

/// Words of one message (one mailbox slot).
pub const MSG_WORDS: usize = 6;
/// Version of the message layout; a peer speaking another one is refused (its path is not revived).
pub const VERSION: u16 = 1;
/// "RV": marks a revive message in the top half of word 0.
const MAGIC: u16 = 0x5256;
/// BLAKE3 `derive_key` context of the binding key.
const KEY_CONTEXT: &str = "switchless 2026-12 failback reconnect v1 binding key";

/// Which end of the connection: the two ends must differ (a message from this end's own side is
/// refused), and agree on who is which (see [`BindKey::derive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The end whose handshake parameters sort first.
    Low,
    /// The other end.
    High,
}

impl Side {
    fn code(self) -> u8 {
        match self {
            Side::Low => 1,
            Side::High => 2,
        }
    }
}

/// The key that tags one connection's reconnect messages.
#[derive(Clone)]
pub struct BindKey([u8; 32]);

impl std::fmt::Debug for BindKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BindKey(..)")
    }
}

impl BindKey {
    /// The key and this end's side from the connection's `secret` (the handshake's
    /// `ConnSecret`: someone who recorded the handshake does not have it), this end's handshake
    /// parameters `mine` and the peer's `theirs` (opaque bytes, the same two byte strings at both
    /// ends, swapped): the lower of the two goes first into the key, so both ends derive the same
    /// key and opposite sides.
    pub fn derive(secret: &[u8; 32], mine: &[u8], theirs: &[u8]) -> (BindKey, Side) {
        let (side, first, second) = if mine <= theirs {
            (Side::Low, mine, theirs)
        } else {
            (Side::High, theirs, mine)
        };
        let mut h = blake3::Hasher::new_derive_key(KEY_CONTEXT);
        h.update(secret);
        h.update(&(first.len() as u64).to_be_bytes());
        h.update(first);
        h.update(second);
        (BindKey(*h.finalize().as_bytes()), side)
    }

    fn tag(&self, words: &[u64; 4]) -> [u64; 2] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        for w in words {
            h.update(&w.to_le_bytes());
        }
        let b = h.finalize();
        let b = b.as_bytes();
        let mut t = [0u64; 2];
        for (i, t) in t.iter_mut().enumerate() {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[8 * i..8 * i + 8]);
            *t = u64::from_le_bytes(x);
        }
        t
    }
}

/// A queue pair's end as the peer needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// QP number (24-bit).
    pub qpn: u32,
    /// First packet sequence number (24-bit).
    pub psn: u32,
}

/// What a message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The sender has a fresh queue pair for the epoch (INIT, receives posted).
    Offer,
    /// The sender's fresh queue pair is connected (RTS) to the QPN the message names.
    Ack,
}

/// One decoded message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg {
    pub stage: Stage,
    pub epoch: u32,
    /// Bumped on every write: tells a new copy of the same state from the old one.
    pub seq: u32,
    /// The sender's fresh queue pair.
    pub end: End,
    /// [`Stage::Ack`]: the receiver's QPN the sender connected to (0 in an offer).
    pub peer_qpn: u32,
}

/// What the driver does next for the path (one [`Reviver::poll`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Todo {
    /// The port is down: nothing to do until the next probe.
    Down,
    /// Create a fresh queue pair (INIT) replacing the old one, then [`Reviver::created`].
    Create,
    /// Connect the fresh queue pair to the peer's (RTR, RTS), then [`Reviver::connected`].
    Connect(End),
    /// Waiting for the peer's message.
    Pending,
    /// Both ends are connected: the path carries traffic again.
    Ready,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Usable at epoch `done`.
    Idle,
    /// An attempt at `epoch` without a fresh queue pair yet.
    Waiting { epoch: u32 },
    /// Fresh queue pair `local` offered for `epoch`.
    Offered { epoch: u32, local: End },
    /// `local` connected to `peer`; waiting for the peer's ack.
    Connected { epoch: u32, local: End, peer: End },
}

/// The reconnect state of one data path at one end.
#[derive(Debug, Clone)]
pub struct Reviver {
    path: u16,
    side: Side,
    key: BindKey,
    /// Epoch of the newest completed rebuild (0: the handshake's queue pairs).
    done: u32,
    phase: Phase,
    seq: u32,
    /// What this end last sent (also what it answers again when the peer asks).
    last: Option<Msg>,
    /// Sequence number of the peer's message this end last answered while idle.
    answered: u32,
    refused: u64,
    attempts: u32,
    /// The ack of the epoch just completed is still to be written.
    flush: bool,
}

impl Reviver {
    /// The state of data path `path` at the `side` end of a connection keyed `key`.
    pub fn new(path: u16, side: Side, key: BindKey) -> Reviver {
        Reviver {
            path,
            side,
            key,
            done: 0,
            phase: Phase::Idle,
            seq: 0,
            last: None,
            answered: 0,
            refused: 0,
            attempts: 0,
            flush: false,
        }
    }

    /// Epoch of the newest completed rebuild.
    pub fn epoch(&self) -> u32 {
        self.done
    }

    /// Messages ignored so far (bad tag, version, path or side): a torn read counts too.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Attempts started (each with a fresh queue pair).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether a rebuild is under way (or its last ack is still to be written).
    pub fn busy(&self) -> bool {
        self.phase != Phase::Idle || self.flush
    }

    /// Decodes and checks the peer's mailbox slot; `None` for an empty, foreign or forged one.
    pub fn read(&mut self, inbox: &[u64; MSG_WORDS]) -> Option<Msg> {
        if inbox.iter().all(|&w| w == 0) {
            return None;
        }
        let m = self.decode(inbox);
        if m.is_none() {
            self.refused += 1;
        }
        m
    }

    fn decode(&self, w: &[u64; MSG_WORDS]) -> Option<Msg> {
        let head = w[0];
        if (head >> 48) as u16 != MAGIC || (head >> 32) as u16 != VERSION {
            return None;
        }
        let stage = match (head >> 24) as u8 {
            1 => Stage::Offer,
            2 => Stage::Ack,
            _ => return None,
        };
        let from = (head >> 16) as u8;
        if from == self.side.code() || !(1..=2).contains(&from) || head as u16 != self.path {
            return None;
        }
        let body = [w[0], w[1], w[2], w[3]];
        let t = self.key.tag(&body);
        // Constant time in the tag's bytes, as the handshake checks its tags.
        if ((t[0] ^ w[4]) | (t[1] ^ w[5])) != 0 {
            return None;
        }
        Some(Msg {
            stage,
            epoch: (w[1] >> 32) as u32,
            seq: w[1] as u32,
            end: End {
                qpn: (w[2] >> 32) as u32,
                psn: w[2] as u32,
            },
            peer_qpn: w[3] as u32,
        })
    }

    fn encode(&self, m: &Msg, side: Side) -> [u64; MSG_WORDS] {
        let stage: u64 = match m.stage {
            Stage::Offer => 1,
            Stage::Ack => 2,
        };
        let head = (u64::from(MAGIC) << 48)
            | (u64::from(VERSION) << 32)
            | (stage << 24)
            | (u64::from(side.code()) << 16)
            | u64::from(self.path);
        let body = [
            head,
            (u64::from(m.epoch) << 32) | u64::from(m.seq),
            (u64::from(m.end.qpn) << 32) | u64::from(m.end.psn),
            u64::from(m.peer_qpn),
        ];
        let t = self.key.tag(&body);
        [body[0], body[1], body[2], body[3], t[0], t[1]]
    }

    /// Whether the peer has started a rebuild this end has not joined (its old queue pair is then
    /// connected to one the peer has given up): the path must fail over, then be probed.
    pub fn peer_restarted(&mut self, inbox: &[u64; MSG_WORDS]) -> bool {
        !self.busy() && self.read(inbox).is_some_and(|m| m.epoch > self.done)
    }

    /// One step of the rebuild; starts one when the path was usable. `port_active`: the path's port
    /// is ACTIVE now; `inbox`: the peer's mailbox slot of the path as last seen.
    pub fn poll(&mut self, port_active: bool, inbox: &[u64; MSG_WORDS]) -> Todo {
        let msg = self.read(inbox);
        if self.phase == Phase::Idle {
            self.start(self.done.saturating_add(1));
        }
        // The peer is ahead: join its epoch (a connected queue pair cannot be offered again).
        if let Some(m) = msg {
            let cur = self.attempt_epoch();
            if m.epoch > cur {
                self.phase = match self.phase {
                    Phase::Offered { local, .. } => Phase::Offered {
                        epoch: m.epoch,
                        local,
                    },
                    _ => Phase::Waiting { epoch: m.epoch },
                };
            }
        }
        if !port_active {
            if let Phase::Offered { epoch, .. } | Phase::Connected { epoch, .. } = self.phase {
                // The fresh queue pair holds receives or a connection that may not survive: the
                // next attempt starts from a fresh one.
                self.start(epoch.saturating_add(1));
            }
            return Todo::Down;
        }
        let cur = msg.filter(|m| m.epoch == self.attempt_epoch());
        match self.phase {
            Phase::Idle => Todo::Pending,
            Phase::Waiting { .. } => Todo::Create,
            Phase::Offered { .. } => match cur {
                Some(m) => Todo::Connect(m.end),
                None => Todo::Pending,
            },
            Phase::Connected { epoch, local, peer } => match cur {
                Some(m) if m.end != peer || (m.stage == Stage::Ack && m.peer_qpn != local.qpn) => {
                    // The peer moved to another queue pair within the epoch: start over.
                    self.start(epoch.saturating_add(1));
                    Todo::Create
                }
                Some(m) if m.stage == Stage::Ack => {
                    self.done = epoch;
                    self.phase = Phase::Idle;
                    self.answered = m.seq;
                    // This end's ack goes out once more: the peer may not have seen it yet.
                    self.last = Some(Msg {
                        stage: Stage::Ack,
                        epoch,
                        seq: 0,
                        end: local,
                        peer_qpn: peer.qpn,
                    });
                    self.flush = true;
                    Todo::Ready
                }
                _ => Todo::Pending,
            },
        }
    }

    fn start(&mut self, epoch: u32) {
        self.phase = Phase::Waiting { epoch };
    }

    fn attempt_epoch(&self) -> u32 {
        match self.phase {
            Phase::Idle => self.done,
            Phase::Waiting { epoch }
            | Phase::Offered { epoch, .. }
            | Phase::Connected { epoch, .. } => epoch,
        }
    }

    /// The fresh queue pair exists (after [`Todo::Create`]).
    pub fn created(&mut self, local: End) {
        if let Phase::Waiting { epoch } = self.phase {
            self.attempts = self.attempts.saturating_add(1);
            self.phase = Phase::Offered { epoch, local };
        }
    }

    /// The fresh queue pair is connected to `peer` (after [`Todo::Connect`]).
    pub fn connected(&mut self, peer: End) {
        if let Phase::Offered { epoch, local } = self.phase {
            self.phase = Phase::Connected { epoch, local, peer };
        }
    }

    /// The message to write into the peer's mailbox now, if any (each call is a new copy: its
    /// sequence number is bumped).
    pub fn outbox(&mut self) -> Option<[u64; MSG_WORDS]> {
        let (stage, epoch, end, peer_qpn) = match self.phase {
            Phase::Idle if self.flush => {
                self.flush = false;
                let mut last = self.last?;
                self.seq = self.seq.wrapping_add(1);
                last.seq = self.seq;
                self.last = Some(last);
                return Some(self.encode(&last, self.side));
            }
            Phase::Idle | Phase::Waiting { .. } => return None,
            Phase::Offered { epoch, local } => (Stage::Offer, epoch, local, 0),
            Phase::Connected { epoch, local, peer } => (Stage::Ack, epoch, local, peer.qpn),
        };
        self.seq = self.seq.wrapping_add(1);
        let m = Msg {
            stage,
            epoch,
            seq: self.seq,
            end,
            peer_qpn,
        };
        self.last = Some(m);
        Some(self.encode(&m, self.side))
    }

    /// While usable: the ack to write again when the peer's mailbox shows it still waiting for
    /// this end's (its ack of the completed epoch with a sequence number not yet answered).
    pub fn answer(&mut self, inbox: &[u64; MSG_WORDS]) -> Option<[u64; MSG_WORDS]> {
        if self.busy() {
            return None;
        }
        let m = self.read(inbox)?;
        let mut last = self.last?;
        if m.stage != Stage::Ack || m.epoch != self.done || m.seq == self.answered {
            return None;
        }
        self.answered = m.seq;
        self.seq = self.seq.wrapping_add(1);
        last.seq = self.seq;
        self.last = Some(last);
        Some(self.encode(&last, self.side))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: [u64; MSG_WORDS] = [0; MSG_WORDS];
    const SECRET: [u8; 32] = [0x5a; 32];

    fn pair() -> (Reviver, Reviver) {
        let (ka, sa) = BindKey::derive(&SECRET, b"end a", b"end b");
        let (kb, sb) = BindKey::derive(&SECRET, b"end b", b"end a");
        assert_ne!(sa, sb);
        (Reviver::new(1, sa, ka), Reviver::new(1, sb, kb))
    }

    /// One end's probe as a driver does it: poll, act, poll again after each action, then write.
    fn probe(
        r: &mut Reviver,
        active: bool,
        inbox: &[u64; MSG_WORDS],
        qpn: u32,
    ) -> (Todo, Option<[u64; MSG_WORDS]>) {
        let mut todo = r.poll(active, inbox);
        for _ in 0..3 {
            match todo {
                Todo::Create => {
                    r.created(End { qpn, psn: qpn + 7 });
                    // The comm posts receives after `Rebuilt`, then calls again.
                    break;
                }
                Todo::Connect(peer) => {
                    r.connected(peer);
                    todo = r.poll(active, inbox);
                }
                _ => break,
            }
        }
        (todo, r.outbox())
    }

    #[test]
    fn both_ends_agree_whoever_notices_first() {
        let (mut a, mut b) = pair();
        let (mut box_a, mut box_b) = (EMPTY, EMPTY); // box_a: what b wrote for a.
        let (t, out) = probe(&mut a, true, &box_a, 0x100);
        assert_eq!(t, Todo::Create);
        box_b = out.unwrap_or(box_b);
        // b had not noticed: the offer tells it to fail over.
        assert!(b.peer_restarted(&box_b));
        let (t, out) = probe(&mut b, true, &box_b, 0x200);
        assert_eq!(t, Todo::Create);
        box_a = out.unwrap_or(box_a);
        let (t, out) = probe(&mut b, true, &box_b, 0x200);
        assert_eq!(t, Todo::Pending, "b connected, waits for a's ack");
        box_a = out.unwrap_or(box_a);
        let (t, out) = probe(&mut a, true, &box_a, 0x100);
        assert_eq!(t, Todo::Ready, "b's ack names a's queue pair");
        box_b = out.unwrap_or(box_b);
        let (t, _) = probe(&mut b, true, &box_b, 0x200);
        assert_eq!(t, Todo::Ready);
        assert_eq!((a.epoch(), b.epoch()), (1, 1));
        assert_eq!((a.refused(), b.refused()), (0, 0));
        assert!(!a.peer_restarted(&box_a) && !b.peer_restarted(&box_b));
    }

    #[test]
    fn lost_and_duplicated_messages_and_a_late_peer() {
        let (mut a, mut b) = pair();
        let (mut box_a, mut box_b) = (EMPTY, EMPTY);
        // a probes five times before b answers at all (late peer); its writes are lost twice.
        for i in 0..5 {
            let (_, out) = probe(&mut a, true, &box_a, 0x100);
            if i >= 2 {
                box_b = out.unwrap_or(box_b);
            }
        }
        assert_eq!(
            a.attempts(),
            1,
            "one fresh queue pair however often it probes"
        );
        let dup = box_b;
        let (t, _) = probe(&mut b, true, &box_b, 0x200);
        assert_eq!(t, Todo::Create);
        // b's offer is lost; its next probe connects (a's offer is there) and writes an ack.
        let (t, out) = probe(&mut b, true, &dup, 0x200);
        assert_eq!(t, Todo::Pending);
        box_a = out.unwrap_or(box_a);
        let (t, out) = probe(&mut a, true, &box_a, 0x100);
        assert_eq!(t, Todo::Ready);
        // a's ack is lost: b keeps asking (a new copy each probe), a answers the new copy once.
        let _ = out;
        let (t, out) = probe(&mut b, true, &box_b, 0x200);
        assert_eq!(t, Todo::Pending);
        box_a = out.unwrap_or(box_a);
        let again = a.answer(&box_a);
        assert!(again.is_some());
        assert!(a.answer(&box_a).is_none(), "a duplicate is answered once");
        box_b = again.unwrap_or(box_b);
        let (t, _) = probe(&mut b, true, &box_b, 0x200);
        assert_eq!(t, Todo::Ready);
        // A duplicate of the old ack after both are done changes nothing.
        assert!(!b.peer_restarted(&box_b));
        assert_eq!((a.epoch(), b.epoch()), (1, 1));
    }

    #[test]
    fn wrong_key_version_path_or_side_is_refused() {
        let (mut a, _) = pair();
        let (kx, sx) = BindKey::derive(&SECRET, b"end b", b"someone else");
        let mut forger = Reviver::new(1, sx, kx);
        let _ = forger.poll(true, &EMPTY);
        forger.created(End { qpn: 9, psn: 9 });
        let forged = forger.outbox().unwrap_or(EMPTY);
        assert_ne!(forged, EMPTY);
        assert!(!a.peer_restarted(&forged));
        assert_eq!(a.poll(true, &forged), Todo::Create);
        a.created(End { qpn: 1, psn: 1 });
        assert_eq!(
            a.poll(true, &forged),
            Todo::Pending,
            "never connects to a forged end"
        );
        // Its own message reflected back, one for another path, another version, a torn copy.
        let own = a.outbox().unwrap_or(EMPTY);
        assert_eq!(a.poll(true, &own), Todo::Pending);
        let (_, mut b) = pair();
        let (kb, sb) = (b.key.clone(), b.side);
        let mut other_path = Reviver::new(2, sb, kb);
        let _ = other_path.poll(true, &EMPTY);
        other_path.created(End { qpn: 5, psn: 5 });
        let wrong_path = other_path.outbox().unwrap_or(EMPTY);
        assert_eq!(a.poll(true, &wrong_path), Todo::Pending);
        let _ = b.poll(true, &EMPTY);
        b.created(End { qpn: 5, psn: 5 });
        let good = b.outbox().unwrap_or(EMPTY);
        let mut v2 = good;
        v2[0] ^= 1 << 33;
        let mut torn = good;
        torn[2] ^= 1;
        assert_eq!(a.poll(true, &v2), Todo::Pending);
        assert_eq!(a.poll(true, &torn), Todo::Pending);
        assert_eq!(a.refused(), 7);
        assert_eq!(a.poll(true, &good), Todo::Connect(End { qpn: 5, psn: 5 }));
    }

    #[test]
    fn port_down_mid_way_restarts_with_a_fresh_queue_pair_at_the_next_epoch() {
        let (mut a, mut b) = pair();
        let (mut box_a, mut box_b) = (EMPTY, EMPTY);
        assert_eq!(a.poll(false, &box_a), Todo::Down);
        assert!(
            a.outbox().is_none(),
            "nothing to offer while the port is down"
        );
        let (_, out) = probe(&mut a, true, &box_a, 0x100);
        box_b = out.unwrap_or(box_b);
        // The port flaps: a's offered queue pair is given up, epoch 2 starts.
        assert_eq!(a.poll(false, &box_a), Todo::Down);
        let (t, out) = probe(&mut a, true, &box_a, 0x101);
        assert_eq!(t, Todo::Create);
        assert_eq!(a.attempts(), 2);
        // b saw only the epoch-1 offer; it connects to it and acks epoch 1.
        let (_, out_b) = probe(&mut b, true, &box_b, 0x200);
        box_a = out_b.unwrap_or(box_a);
        let (_, out_b) = probe(&mut b, true, &box_b, 0x200);
        box_a = out_b.unwrap_or(box_a);
        // a ignores the stale epoch; b then sees a's epoch-2 offer and starts over with a fresh QP.
        let (t, _) = probe(&mut a, true, &box_a, 0x101);
        assert_eq!(t, Todo::Pending);
        box_b = out.unwrap_or(box_b);
        let (t, out_b) = probe(&mut b, true, &box_b, 0x201);
        assert_eq!(t, Todo::Create);
        box_a = out_b.unwrap_or(box_a);
        let (t, out) = probe(&mut a, true, &box_a, 0x101);
        assert_eq!(t, Todo::Pending);
        box_b = out.unwrap_or(box_b);
        let (t, out_b) = probe(&mut b, true, &box_b, 0x201);
        assert_eq!(t, Todo::Ready);
        box_a = out_b.unwrap_or(box_a);
        let (t, _) = probe(&mut a, true, &box_a, 0x101);
        assert_eq!(t, Todo::Ready);
        assert_eq!((a.epoch(), b.epoch()), (2, 2));
    }

    /// Probes both ends in turn, each only until it is ready (the comm stops probing a usable path).
    fn run(
        a: &mut Reviver,
        b: &mut Reviver,
        box_a: &mut [u64; MSG_WORDS],
        box_b: &mut [u64; MSG_WORDS],
        qa: u32,
        qb: u32,
    ) {
        let (mut ra, mut rb) = (false, false);
        for _ in 0..8 {
            if !ra {
                let (t, o) = probe(a, true, box_a, qa);
                ra = t == Todo::Ready;
                *box_b = o.unwrap_or(*box_b);
            }
            if !rb {
                let (t, o) = probe(b, true, box_b, qb);
                rb = t == Todo::Ready;
                *box_a = o.unwrap_or(*box_a);
            }
        }
        assert!(ra && rb, "both ends ready");
    }

    #[test]
    fn a_second_failure_starts_the_next_epoch_and_the_peer_joins() {
        let (mut a, mut b) = pair();
        let (mut box_a, mut box_b) = (EMPTY, EMPTY);
        run(&mut a, &mut b, &mut box_a, &mut box_b, 0x100, 0x200);
        assert_eq!((a.epoch(), b.epoch()), (1, 1));
        // Now b notices a failure first.
        let (t, o) = probe(&mut b, true, &box_b, 0x300);
        assert_eq!(t, Todo::Create);
        box_a = o.unwrap_or(box_a);
        assert!(a.peer_restarted(&box_a));
        run(&mut a, &mut b, &mut box_a, &mut box_b, 0x400, 0x300);
        assert_eq!((a.epoch(), b.epoch()), (2, 2));
        assert_eq!((a.attempts(), b.attempts()), (2, 2));
    }

    /// Someone who recorded the handshake knows both ends' parameters but not the connection's
    /// secret: a message tagged with a key derived from the right parameters and another secret
    /// is refused.
    #[test]
    fn a_tag_made_without_the_connection_secret_is_refused() {
        let (mut a, _) = pair();
        let (kx, sx) = BindKey::derive(&[0u8; 32], b"end b", b"end a");
        assert_eq!(sx, Side::High, "the forger picks the right side");
        let mut forger = Reviver::new(1, sx, kx);
        let _ = forger.poll(true, &EMPTY);
        forger.created(End { qpn: 9, psn: 9 });
        let forged = forger.outbox().unwrap_or(EMPTY);
        assert_ne!(forged, EMPTY);
        assert!(!a.peer_restarted(&forged), "a forged offer starts nothing");
        assert_eq!(a.refused(), 1);
        // The genuine peer's message is taken.
        let (_, mut b) = pair();
        let _ = b.poll(true, &EMPTY);
        b.created(End { qpn: 5, psn: 5 });
        let good = b.outbox().unwrap_or(EMPTY);
        assert!(a.peer_restarted(&good));
    }

    #[test]
    fn keys_are_symmetric_and_sides_opposite() {
        let (k1, s1) = BindKey::derive(&SECRET, b"x", b"y");
        let (k2, s2) = BindKey::derive(&SECRET, b"y", b"x");
        assert_eq!(k1.0, k2.0);
        assert_eq!((s1, s2), (Side::Low, Side::High));
        assert_ne!(BindKey::derive(&SECRET, b"x", b"z").0.0, k1.0);
        assert_ne!(BindKey::derive(&[0; 32], b"x", b"y").0.0, k1.0);
        assert_eq!(format!("{k1:?}"), "BindKey(..)");
    }
}
