//! Authentication of every TCP stream, at set-up and at each rebuild (failback).
//!
//! Both ends hold the connection's [`ConnSecret`] from the authenticated handshake; nothing derived
//! from it that would let a stranger in travels in clear. When the acceptor accepts a stream it
//! sends a random 16-byte challenge; the connector answers with its hello: the connection id (a
//! one-way value of the secret, public), path, stream, stream count, generation, a random
//! 16-byte connector nonce and a tag, BLAKE3 keyed with a key derived from the secret, over all of
//! these and the challenge. The acceptor's acknowledgement carries a tag over the same values under
//! another label, so the connector knows it reached its peer. Tags are compared in constant time
//! (`subtle`). A recording of a hello is worth nothing on another connection (another challenge),
//! and its generation cannot be changed without the secret.

use subtle::ConstantTimeEq;

use super::frame::{AckRepr, HelloRepr, NONCE_LEN, TAG_LEN};
use crate::error::{Error, Result};
use crate::transport::handshake::auth::ConnSecret;

/// BLAKE3 `derive_key` context of the stream key.
const KEY_CONTEXT: &str = "switchless 2027-01 tcp stream key v1";
/// BLAKE3 `derive_key` context of the connection id.
const ID_CONTEXT: &str = "switchless 2027-01 tcp connection id v1";

/// A stream tag.
pub type StreamTag = [u8; TAG_LEN];
/// A challenge or connector nonce.
pub type StreamNonce = [u8; NONCE_LEN];

/// The key one connection's streams are authenticated with (derived from its [`ConnSecret`]).
#[derive(Clone)]
pub struct StreamKey {
    key: [u8; 32],
    conn: u64,
}

impl std::fmt::Debug for StreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material; the connection id is public.
        write!(f, "StreamKey(conn {:#018x})", self.conn)
    }
}

impl StreamKey {
    /// The stream key of the connection whose secret is `secret`.
    pub fn new(secret: &ConnSecret) -> StreamKey {
        let id = blake3::derive_key(ID_CONTEXT, secret.bytes());
        let mut c = [0u8; 8];
        c.copy_from_slice(&id[..8]);
        StreamKey {
            key: blake3::derive_key(KEY_CONTEXT, secret.bytes()),
            conn: u64::from_le_bytes(c),
        }
    }

    /// The connection id every hello names (public: it tells connections apart, it lets nobody in).
    pub fn conn_id(&self) -> u64 {
        self.conn
    }

    fn tag(&self, label: &[u8], h: &HelloRepr, challenge: &StreamNonce) -> StreamTag {
        let mut m = blake3::Hasher::new_keyed(&self.key);
        m.update(label);
        m.update(&self.conn.to_le_bytes());
        m.update(&[h.npaths, h.path, h.nstreams, h.stream]);
        m.update(&h.generation.to_le_bytes());
        m.update(challenge);
        m.update(&h.nonce);
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&m.finalize().as_bytes()[..TAG_LEN]);
        t
    }

    /// `h` with this connection's id and the tag that answers `challenge` (what a connector sends;
    /// tests that play a peer by hand use it too).
    pub fn seal(&self, mut h: HelloRepr, challenge: &StreamNonce) -> HelloRepr {
        h.conn = self.conn;
        h.tag = self.tag(b"hello", &h, challenge);
        h
    }

    /// Checks a hello that answers `challenge`: the connection id, then the tag (constant time).
    /// The errors name what is wrong and nothing secret.
    pub fn check_hello(&self, h: &HelloRepr, challenge: &StreamNonce) -> Result<()> {
        if h.conn != self.conn {
            return Err(Error::Remote(format!(
                "hello for connection {:#018x}, this listener serves {:#018x} (a stream of another \
                 connection, or a stranger)",
                h.conn, self.conn
            )));
        }
        let want = self.tag(b"hello", h, challenge);
        if !bool::from(want.ct_eq(&h.tag)) {
            return Err(Error::Remote(
                "hello not authenticated by the connection secret (a replayed or forged stream)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The acknowledgement of the (checked) hello `h` that answered `challenge`.
    pub fn ack(&self, h: &HelloRepr, challenge: &StreamNonce) -> AckRepr {
        AckRepr {
            tag: self.tag(b"ack", h, challenge),
        }
    }

    /// Whether `ack` acknowledges hello `h` sent in answer to `challenge` (constant time).
    pub fn check_ack(&self, ack: &AckRepr, h: &HelloRepr, challenge: &StreamNonce) -> bool {
        bool::from(self.tag(b"ack", h, challenge).ct_eq(&ack.tag))
    }
}

/// 16 random bytes from the OS (a challenge or a connector nonce).
pub fn random_nonce() -> Result<StreamNonce> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n)
        .map_err(|e| Error::System(format!("reading random bytes for a TCP stream nonce: {e}")))?;
    Ok(n)
}

/// A random connection secret (tests, tools, [`super::loopback_pair`]).
pub fn random_secret() -> Result<ConnSecret> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)
        .map_err(|e| Error::System(format!("reading random bytes for a secret: {e}")))?;
    Ok(ConnSecret::from_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> HelloRepr {
        HelloRepr {
            npaths: 2,
            path: 1,
            nstreams: 4,
            stream: 3,
            generation: 7,
            conn: 0,
            nonce: [5; NONCE_LEN],
            tag: [0; TAG_LEN],
        }
    }

    #[test]
    fn a_tag_binds_the_secret_the_challenge_and_every_field() {
        let k = StreamKey::new(&ConnSecret::from_bytes([1; 32]));
        let ch = [9u8; NONCE_LEN];
        let h = k.seal(hello(), &ch);
        k.check_hello(&h, &ch).unwrap();
        let e = k.check_hello(&h, &[8; NONCE_LEN]).unwrap_err().to_string();
        assert!(e.contains("not authenticated"), "{e}");
        let other = StreamKey::new(&ConnSecret::from_bytes([2; 32]));
        let e = other.check_hello(&h, &ch).unwrap_err().to_string();
        assert!(e.contains("for connection"), "{e}");
        let fields: [fn(&mut HelloRepr); 6] = [
            |h| h.npaths ^= 1,
            |h| h.path ^= 1,
            |h| h.stream ^= 1,
            |h| h.nstreams ^= 1,
            |h| h.generation = u32::MAX,
            |h| h.nonce[15] ^= 1,
        ];
        for (i, f) in fields.iter().enumerate() {
            let mut x = h;
            f(&mut x);
            assert!(k.check_hello(&x, &ch).is_err(), "field {i} is not covered");
        }
        let ack = k.ack(&h, &ch);
        assert!(k.check_ack(&ack, &h, &ch));
        assert!(!k.check_ack(&ack, &h, &[0; NONCE_LEN]));
        assert_ne!(ack.tag, h.tag, "the ack is not the hello's tag sent back");
        assert_eq!(
            format!("{k:?}"),
            format!("StreamKey(conn {:#018x})", k.conn_id())
        );
    }
}
