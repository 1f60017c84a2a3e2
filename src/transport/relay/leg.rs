//! One relayed stream at the relay host: the client's connection (`a`) joined to the peer's (`b`),
//! forwarded both ways, store and forward. Each direction reads a whole frame (the TCP fabric's
//! 40-byte header, then its payload) into staging memory, then writes it on; the relay reads a
//! header only to know where the frame ends (magic, operation, length) and never looks at the
//! payload, the address, the key or the immediate: what lands where is the peer's to check. Before
//! the frames, the stream's opening passes through as bytes: the peer's challenge and
//! acknowledgement one way, the client's hello the other (`tcp::frame`), so the peer
//! authenticates the client end to end and the relay learns nothing of the connection's secret.
//! A stream to a second relay (a chain, `wire::Op::OpenRelay`) passes that relay's door exchange
//! through as bytes first ([`CHAIN_OPENING`]). An end of stream while the opening passes (after
//! every byte read so far went on) is passed on as an end of stream, so a second relay's refusal
//! reaches the client whole. Driven without blocking by the service thread (`super::service`), edge-triggered: a readiness
//! flag is cleared when its socket would block.
#![forbid(unsafe_code)]

use std::io;
use std::net::TcpStream;

use super::wire;
use crate::sys::socket as sock;
use crate::transport::tcp::frame::{
    ACK_LEN, CHALLENGE_LEN, FRAME_MAGIC, Frame, HEADER_LEN, HELLO_LEN, OP_ACK, OP_CLOSE, OP_WRITE,
};

/// Bytes a direction moves per turn before the service turns to other legs.
pub const TURN_BYTES: usize = 2 << 20;

/// Bytes of a path stream's opening that pass through as they are, by direction (client → peer,
/// peer → client): the client's hello; the peer's challenge, then its acknowledgement.
pub const PATH_OPENING: [usize; 2] = [HELLO_LEN, CHALLENGE_LEN + ACK_LEN];

/// … of a stream opened to a second relay's door: its door exchange (the client's request; the
/// door's challenge and verdict), then the path's opening.
pub const CHAIN_OPENING: [usize; 2] = [
    wire::REQUEST_LEN + HELLO_LEN,
    wire::CHALLENGE_LEN + wire::VERDICT_LEN + CHALLENGE_LEN + ACK_LEN,
];

/// Why a leg ends against its will: what the service counts and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegError {
    /// A socket failed or ended mid-frame (the side that broke, the error).
    Io(&'static str, String),
    /// What was sent is not a frame stream the relay forwards (its reason key and the detail).
    Violation(&'static str, String),
}

/// Staging memory held by frames in transit: a budget per service and per client.
pub trait Staging {
    /// Takes `n` bytes for a frame of this leg's client; `false`: wait (memory frees as frames
    /// go out).
    fn take(&mut self, n: usize) -> bool;
    /// Gives back `n` bytes taken before.
    fn give(&mut self, n: usize);
}

enum DirState {
    /// Reading a header (`got` bytes in), or, while `raw` > 0, the opening's bytes.
    Header { buf: [u8; HEADER_LEN], got: usize },
    /// Reading a frame's payload into `buf` (header included at its start); `held` staging bytes.
    Payload {
        buf: Vec<u8>,
        got: usize,
        held: usize,
    },
    /// Writing `buf` on; `off` bytes are out; `held` staging bytes go back when done; `frame`:
    /// a frame (not the opening's bytes).
    Write {
        buf: Vec<u8>,
        off: usize,
        held: usize,
        frame: bool,
    },
}

/// One direction: from side `src` to side `1 - src` (0 = the client, 1 = the peer).
struct Dir {
    src: usize,
    /// Bytes of the stream's opening still to pass through as they are.
    raw: usize,
    st: DirState,
    /// A close frame went through: the source's next event must be its end of stream.
    closed: bool,
    /// The source ended and everything before it went out: the destination's write side is shut.
    done: bool,
    /// Frames and bytes forwarded.
    frames: u64,
    bytes: u64,
}

impl Dir {
    /// Direction from side `src`, whose first `raw` bytes pass through unread.
    fn new(src: usize, raw: usize) -> Dir {
        Dir {
            src,
            raw,
            st: DirState::Header {
                buf: [0; HEADER_LEN],
                got: 0,
            },
            closed: false,
            done: false,
            frames: 0,
            bytes: 0,
        }
    }
}

/// A joined stream: both sockets, readiness, both directions.
pub struct Joined {
    pub socks: [TcpStream; 2],
    /// Readable / writable as last reported (cleared when a call would block).
    pub rd: [bool; 2],
    pub wr: [bool; 2],
    dirs: [Dir; 2],
    max_frame: usize,
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Waiting for readiness (or memory).
    Blocked,
    /// Its bytes for this turn are used up; more can be done at once.
    More,
    /// Both directions ended in order: the leg is done.
    Finished,
}

impl Joined {
    /// A stream joined now whose opening is `raw` bytes by direction (client → peer, peer →
    /// client: [`PATH_OPENING`] or [`CHAIN_OPENING`]); both sides may be ready (tried at once).
    pub fn new(a: TcpStream, b: TcpStream, max_frame: usize, raw: [usize; 2]) -> Joined {
        Joined {
            socks: [a, b],
            rd: [true; 2],
            wr: [true; 2],
            dirs: [Dir::new(0, raw[0]), Dir::new(1, raw[1])],
            max_frame,
        }
    }

    /// Frames and bytes forwarded so far, both directions.
    pub fn moved(&self) -> (u64, u64) {
        (
            self.dirs[0].frames + self.dirs[1].frames,
            self.dirs[0].bytes + self.dirs[1].bytes,
        )
    }

    /// Staging bytes the leg holds (given back by the caller when it drops the leg).
    pub fn held(&self) -> usize {
        self.dirs
            .iter()
            .map(|d| match &d.st {
                DirState::Payload { held, .. } | DirState::Write { held, .. } => *held,
                DirState::Header { .. } => 0,
            })
            .sum()
    }

    /// One turn of both directions.
    pub fn turn(&mut self, mem: &mut dyn Staging) -> Result<Turn, LegError> {
        let mut more = false;
        for d in 0..2 {
            more |= self.pump(d, mem)?;
        }
        if self.dirs.iter().all(|d| d.done) {
            return Ok(Turn::Finished);
        }
        Ok(if more { Turn::More } else { Turn::Blocked })
    }

    /// Moves direction `d` as far as readiness, memory and the turn's bytes allow; `true` when
    /// it stopped only for the turn's bytes.
    fn pump(&mut self, d: usize, mem: &mut dyn Staging) -> Result<bool, LegError> {
        let mut budget = TURN_BYTES;
        let (src, dst) = (self.dirs[d].src, 1 - self.dirs[d].src);
        let side = |s: usize| if s == 0 { "the client" } else { "the peer" };
        loop {
            if self.dirs[d].done {
                return Ok(false);
            }
            if budget == 0 {
                return Ok(true);
            }
            let dir = &mut self.dirs[d];
            match &mut dir.st {
                DirState::Header { buf, got } => {
                    if !self.rd[src] {
                        return Ok(false);
                    }
                    // The opening passes through as it comes; frames are read header first.
                    let want = if dir.raw > 0 {
                        dir.raw.min(HEADER_LEN)
                    } else {
                        HEADER_LEN
                    };
                    if *got < want {
                        match sock::recv_slice(&self.socks[src], &mut buf[*got..want]) {
                            Ok(0) if *got == 0 => {
                                // The source ended at a frame boundary, or in the opening after
                                // everything it sent went on (a second relay's refusal: its
                                // verdict, then its end): pass the end on, in order (a reset
                                // could drop what the destination has not read yet).
                                let _ = self.socks[dst].shutdown(std::net::Shutdown::Write);
                                dir.done = true;
                                return Ok(false);
                            }
                            Ok(0) => {
                                return Err(LegError::Io(
                                    side(src),
                                    format!("ended {got} bytes into a header"),
                                ));
                            }
                            Ok(n) => {
                                *got += n;
                                budget = budget.saturating_sub(n);
                            }
                            Err(e) if would_block(&e) => {
                                self.rd[src] = false;
                                return Ok(false);
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(LegError::Io(side(src), e.to_string())),
                        }
                        if dir.raw > 0 && *got > 0 {
                            let n = *got;
                            dir.raw -= n;
                            let bytes = buf[..n].to_vec();
                            dir.st = DirState::Write {
                                buf: bytes,
                                off: 0,
                                held: 0,
                                frame: false,
                            };
                            continue;
                        }
                        if *got < HEADER_LEN {
                            continue;
                        }
                    }
                    if dir.closed {
                        return Err(LegError::Violation(
                            "after close",
                            format!("{} sent a frame after its close frame", side(src)),
                        ));
                    }
                    let len = frame_len(buf, self.max_frame).map_err(|(k, w)| {
                        LegError::Violation(k, format!("{} sent {w}", side(src)))
                    })?;
                    if buf[2] == OP_CLOSE {
                        dir.closed = true;
                    }
                    if len > 0 && !mem.take(len) {
                        // Waits for memory with the header in hand (the service runs it again
                        // when memory frees).
                        return Ok(false);
                    }
                    let mut frame = vec![0u8; HEADER_LEN + len];
                    frame[..HEADER_LEN].copy_from_slice(buf);
                    dir.st = if len == 0 {
                        DirState::Write {
                            buf: frame,
                            off: 0,
                            held: 0,
                            frame: true,
                        }
                    } else {
                        DirState::Payload {
                            buf: frame,
                            got: HEADER_LEN,
                            held: len,
                        }
                    };
                }
                DirState::Payload { buf, got, held } => {
                    if !self.rd[src] {
                        return Ok(false);
                    }
                    let end = buf.len().min(*got + budget.max(1));
                    match sock::recv_slice(&self.socks[src], &mut buf[*got..end]) {
                        Ok(0) => {
                            return Err(LegError::Io(
                                side(src),
                                format!(
                                    "ended {} bytes into a {}-byte payload",
                                    *got - HEADER_LEN,
                                    buf.len() - HEADER_LEN
                                ),
                            ));
                        }
                        Ok(n) => {
                            *got += n;
                            budget = budget.saturating_sub(n);
                        }
                        Err(e) if would_block(&e) => {
                            self.rd[src] = false;
                            return Ok(false);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(LegError::Io(side(src), e.to_string())),
                    }
                    if *got == buf.len() {
                        // Stored whole: now forward it.
                        let (b, h) = (std::mem::take(buf), *held);
                        dir.st = DirState::Write {
                            buf: b,
                            off: 0,
                            held: h,
                            frame: true,
                        };
                    }
                }
                DirState::Write {
                    buf,
                    off,
                    held,
                    frame,
                } => {
                    if !self.wr[dst] {
                        return Ok(false);
                    }
                    match sock::send_slice(&self.socks[dst], &buf[*off..], false) {
                        Ok(n) => {
                            *off += n;
                            budget = budget.saturating_sub(n);
                        }
                        Err(e) if would_block(&e) => {
                            self.wr[dst] = false;
                            return Ok(false);
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(LegError::Io(side(dst), e.to_string())),
                    }
                    if *off == buf.len() {
                        let n = buf.len() as u64;
                        mem.give(*held);
                        dir.frames += u64::from(*frame);
                        dir.bytes += n;
                        dir.st = DirState::Header {
                            buf: [0; HEADER_LEN],
                            got: 0,
                        };
                    }
                }
            }
        }
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// The payload length of a frame header, or why the relay refuses it (a reason key and detail):
/// the TCP fabric's magic, an operation it defines, no payload but on a write, at most
/// `max_frame` bytes (a slot of staging memory). Nothing else of the header is looked at.
pub fn frame_len(h: &[u8; HEADER_LEN], max_frame: usize) -> Result<usize, (&'static str, String)> {
    let f = Frame::new_unchecked(&h[..]);
    if f.magic() != FRAME_MAGIC {
        return Err(("bad frame", format!("frame magic {:#06x}", f.magic())));
    }
    let len = f.payload_len() as usize;
    match f.op() {
        OP_WRITE if len > max_frame => Err((
            "oversized frame",
            format!("a frame of {len} bytes; a relay forwards at most {max_frame}"),
        )),
        OP_WRITE => Ok(len),
        OP_CLOSE | OP_ACK if len == 0 => Ok(0),
        op => Err((
            "bad frame",
            format!("frame operation {op} with {len} payload bytes"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tcp::frame::FrameRepr;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    struct Unbounded;
    impl Staging for Unbounded {
        fn take(&mut self, _: usize) -> bool {
            true
        }
        fn give(&mut self, _: usize) {}
    }

    /// A connected pair on 127.0.0.1: (the far end, the relay's end, non-blocking).
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let far = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (near, _) = l.accept().unwrap();
        near.set_nonblocking(true).unwrap();
        far.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (far, near)
    }

    /// Turns the leg (readiness taken as given) until `done` says so.
    fn turn_until(j: &mut Joined, done: impl Fn(&Joined) -> bool) {
        let t = Instant::now();
        while !done(j) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the leg never got there"
            );
            j.rd = [true; 2];
            j.wr = [true; 2];
            j.turn(&mut Unbounded).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A chain's opening passes through unread (a door request is no frame), frames follow; a
    /// second relay that answers and ends (a refusal, or a probe's answer) reaches the client as
    /// its bytes, then an orderly end of stream, not a reset.
    #[test]
    fn a_chains_door_exchange_passes_and_an_end_in_the_opening_arrives_in_order() {
        let (mut client, a) = pair();
        let (mut peer, b) = pair();
        let mut j = Joined::new(a, b, 1 << 19, CHAIN_OPENING);
        // Client → peer: a request and a hello (not frames), then a close frame.
        let opening: Vec<u8> = (0..CHAIN_OPENING[0]).map(|i| (i * 7) as u8).collect();
        client.write_all(&opening).unwrap();
        client
            .write_all(&FrameRepr::close(false).to_bytes())
            .unwrap();
        let mut got = vec![0u8; CHAIN_OPENING[0] + HEADER_LEN];
        let mut n = 0;
        let t = Instant::now();
        peer.set_nonblocking(true).unwrap();
        while n < got.len() {
            assert!(t.elapsed() < Duration::from_secs(20), "{n} bytes arrived");
            j.rd = [true; 2];
            j.wr = [true; 2];
            j.turn(&mut Unbounded).unwrap();
            match peer.read(&mut got[n..]) {
                Ok(k) => n += k,
                Err(e) if would_block(&e) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
        peer.set_nonblocking(false).unwrap();
        assert_eq!(&got[..CHAIN_OPENING[0]], &opening[..]);
        // Peer → client: a door's challenge and verdict (92 bytes of the opening), then its end.
        let answer: Vec<u8> = (0..wire::CHALLENGE_LEN + wire::VERDICT_LEN)
            .map(|i| i as u8 ^ 0x5a)
            .collect();
        peer.write_all(&answer[..10]).unwrap();
        turn_until(&mut j, |j| j.dirs[1].bytes >= 10);
        peer.write_all(&answer[10..]).unwrap();
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        turn_until(&mut j, |j| j.dirs[1].done);
        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(back, answer, "the verdict's bytes, then an orderly end");
        // The client hangs up too: the leg is done, in order.
        drop(client);
        drop(peer);
        let t = Instant::now();
        loop {
            assert!(t.elapsed() < Duration::from_secs(20), "never finished");
            j.rd = [true; 2];
            j.wr = [true; 2];
            if j.turn(&mut Unbounded).unwrap() == Turn::Finished {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(j.moved().0, 1, "one frame (the close) besides the opening");
    }

    #[test]
    fn only_the_framing_is_checked() {
        let w = FrameRepr {
            op: OP_WRITE,
            flags: 1,
            len: 4096,
            seq: 5,
            addr: 0xdead,
            rkey: 9,
            imm: 3,
            wr_len: 4096,
        };
        assert_eq!(frame_len(&w.to_bytes(), 1 << 19), Ok(4096));
        assert_eq!(frame_len(&FrameRepr::close(false).to_bytes(), 0), Ok(0));
        assert_eq!(frame_len(&FrameRepr::ack(3).to_bytes(), 0), Ok(0));
        let big = FrameRepr {
            len: (1 << 19) + 1,
            ..w
        };
        assert_eq!(
            frame_len(&big.to_bytes(), 1 << 19).unwrap_err().0,
            "oversized frame"
        );
        let mut b = w.to_bytes();
        b[0] = 0;
        assert_eq!(frame_len(&b, 1 << 19).unwrap_err().0, "bad frame");
        let mut b = FrameRepr::close(false).to_bytes();
        b[4] = 1;
        assert_eq!(frame_len(&b, 1 << 19).unwrap_err().0, "bad frame");
        let mut b = w.to_bytes();
        b[2] = 9;
        assert_eq!(frame_len(&b, 1 << 19).unwrap_err().0, "bad frame");
    }
}
