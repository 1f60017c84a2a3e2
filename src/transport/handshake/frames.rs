//! The bytes of one handshake connection, without its socket: the frames queued to send and the one
//! frame being received. Each state machine owns one; whoever owns the socket (`io.rs`, or a test)
//! moves bytes between the two with [`Frames::transmit`] / [`Frames::sent`] and [`Frames::want`] /
//! [`Frames::received`].

use std::io;

use super::wire::{HEADER_LEN, Header, HeaderRepr, Message};
use crate::error::{Error, Result};

/// Why a connection cannot go on, as the socket side reported it or the decoder found it.
#[derive(Debug)]
pub(super) enum Fault {
    /// The peer closed the connection (end of file while a frame was expected).
    Closed,
    /// Reading or writing the socket failed.
    Io(io::Error),
    /// The peer sent a frame that does not decode.
    Malformed(Error),
}

impl Fault {
    /// The error to report: `who` is the peer, `step` what this side was doing.
    pub(super) fn into_error(self, who: &str, step: &str) -> Error {
        match self {
            Fault::Closed => Error::Remote(format!("{who} closed the connection while {step}")),
            Fault::Io(e) => Error::io(format!("{who}: {step}"), e),
            Fault::Malformed(e) => Error::Remote(format!("{who} while {step}: {e}")),
        }
    }
}

/// Outbound frames and the inbound frame of one connection.
#[derive(Debug, Default)]
pub struct Frames {
    tx: Vec<u8>,
    /// Bytes of `tx` already written.
    sent: usize,
    rx: Vec<u8>,
    /// The payload length of the frame in `rx`, once its header is complete and valid.
    rx_payload: Option<usize>,
    /// Whether the machine expects a frame. It asks for one at a time, only when the protocol has one
    /// coming, so nothing past the handshake is ever taken from the socket (it moves to the
    /// transport afterwards).
    reading: bool,
    frame: Option<Message>,
    fault: Option<Fault>,
}

impl Frames {
    /// Bytes to write to the socket now (empty when nothing is queued).
    pub fn transmit(&self) -> &[u8] {
        self.tx.get(self.sent..).unwrap_or_default()
    }

    /// `n` bytes of [`Frames::transmit`] were written.
    pub fn sent(&mut self, n: usize) {
        self.sent = self.sent.saturating_add(n).min(self.tx.len());
        if self.sent == self.tx.len() {
            self.tx.clear();
            self.sent = 0;
        }
    }

    /// How many bytes to read from the socket now: what the frame in progress still lacks (its header
    /// first), 0 when no frame is expected or one is waiting to be taken.
    pub fn want(&self) -> usize {
        if !self.reading || self.frame.is_some() || self.fault.is_some() {
            return 0;
        }
        let end = self.rx_payload.map_or(HEADER_LEN, |n| HEADER_LEN + n);
        end.saturating_sub(self.rx.len())
    }

    /// Bytes read from the socket. Takes at most [`Frames::want`] of them and returns how many it
    /// took; the rest belongs to whoever reads the socket next.
    pub fn received(&mut self, bytes: &[u8]) -> usize {
        let mut used = 0;
        while used < bytes.len() {
            let n = self.want().min(bytes.len() - used);
            if n == 0 {
                break;
            }
            self.rx.extend_from_slice(&bytes[used..used + n]);
            used += n;
            self.rx_progress();
        }
        used
    }

    /// The peer closed its end (a read returned end of file).
    pub fn closed(&mut self) {
        self.fail(Fault::Closed);
    }

    /// Reading or writing the socket failed.
    pub fn failed(&mut self, e: io::Error) {
        self.fail(Fault::Io(e));
    }

    fn fail(&mut self, f: Fault) {
        // The first fault is the one to report.
        if self.fault.is_none() {
            self.fault = Some(f);
        }
    }

    /// Parses the header once it is complete and decodes the frame once that is.
    fn rx_progress(&mut self) {
        if self.rx_payload.is_none() && self.rx.len() == HEADER_LEN {
            match HeaderRepr::parse(&Header::new_unchecked(&self.rx[..])) {
                Ok(h) => self.rx_payload = Some(h.payload_len),
                Err(e) => {
                    self.rx.clear();
                    self.fail(Fault::Malformed(e));
                    return;
                }
            }
        }
        if self.rx_payload.is_some() && self.want() == 0 {
            match Message::decode(&self.rx) {
                Ok(m) => self.frame = Some(m),
                Err(e) => self.fail(Fault::Malformed(e)),
            }
            self.rx.clear();
            self.rx_payload = None;
            self.reading = false;
        }
    }

    /// Queues one frame to send.
    pub(super) fn queue(&mut self, m: &Message) -> Result<()> {
        let f = m.encode()?;
        self.tx.extend_from_slice(&f);
        Ok(())
    }

    /// Whether every queued byte was written.
    pub(super) fn flushed(&self) -> bool {
        self.tx.is_empty()
    }

    /// Asks for the next frame from the peer.
    pub(super) fn expect_frame(&mut self) {
        self.reading = true;
    }

    /// The frame received, if it is complete.
    pub(super) fn take_frame(&mut self) -> Option<Message> {
        self.frame.take()
    }

    /// The fault, if the connection failed.
    pub(super) fn take_fault(&mut self) -> Option<Fault> {
        self.fault.take()
    }

    /// Whether a whole frame waits to be taken.
    pub(super) fn frame_ready(&self) -> bool {
        self.frame.is_some()
    }

    /// Whether the connection failed (and the fault is not taken yet).
    pub(super) fn faulted(&self) -> bool {
        self.fault.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_exactly_one_frame_in_any_chunking() {
        let ready = Message::Ready.encode().unwrap();
        let reject = Message::Reject("no".into()).encode().unwrap();
        let mut both = reject.clone();
        both.extend_from_slice(&ready);
        for chunk in 1..=both.len() {
            let mut f = Frames::default();
            assert_eq!(f.want(), 0, "nothing is read before a frame is expected");
            f.expect_frame();
            let mut used = 0;
            for c in both.chunks(chunk) {
                used += f.received(c);
            }
            // Only the reject was taken: the ready frame stays for the next reader.
            assert_eq!(used, reject.len(), "chunk {chunk}");
            assert_eq!(f.take_frame(), Some(Message::Reject("no".into())));
            assert_eq!(f.want(), 0);
        }
    }

    #[test]
    fn a_bad_header_fails_before_its_payload_is_read() {
        let mut f = Frames::default();
        f.expect_frame();
        let mut b = Message::Ready.encode().unwrap();
        b[0] = b'X';
        b.extend_from_slice(&[0; 100]);
        assert_eq!(f.received(&b), HEADER_LEN);
        assert_eq!(f.want(), 0);
        let e = f.take_fault().unwrap().into_error("peer", "reading");
        assert!(e.to_string().contains("not a switchless connector"), "{e}");
    }

    #[test]
    fn transmit_drains_in_pieces() {
        let mut f = Frames::default();
        f.queue(&Message::Ready).unwrap();
        assert!(!f.flushed());
        let all = f.transmit().to_vec();
        f.sent(5);
        assert_eq!(f.transmit(), &all[5..]);
        f.sent(1000);
        assert!(f.flushed() && f.transmit().is_empty());
    }
}
