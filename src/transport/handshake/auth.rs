//! Authentication of one handshake connection: the key both ends derive, and the tags of the hello
//! and the reply.
//!
//! The listener's 64-bit nonce (in the handle NCCL hands to the connector) is the only secret, and
//! it never goes on the wire. The connector draws a nonce of its own per connection; both ends derive
//! the connection's key from the two with BLAKE3's `derive_key`. The hello carries a keyed hash of
//! its payload, the reply one of the hello's tag and its own payload, each truncated to
//! [`TAG_LEN`] bytes and compared in constant time (`subtle`). So a client without the handle cannot
//! make a hello the listener takes, an answer from any other listener fails at the connector, and a
//! hello replayed to another listener (another secret) or to the same one again (the listener keeps
//! the nonces it has seen) is refused. An acceptor that refuses an authenticated hello tags its
//! reject the same way; the connector acts on no other.

use subtle::ConstantTimeEq;

use super::wire::{Hello, Refuse, Reply, TAG_LEN, Tag, truncate_reason};
use crate::error::Result;

/// BLAKE3 `derive_key` context: names what the key is for, so no other use of the nonce collides.
const CONTEXT: &str = "switchless 2026-06 handshake v2 connection key";

/// The key of one connection (listener nonce × connector nonce).
#[derive(Clone)]
pub struct ConnKey([u8; 32]);

impl std::fmt::Debug for ConnKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.write_str("ConnKey(..)")
    }
}

/// A secret of one connection handed to its fabrics (derived from the [`ConnKey`], so a fabric
/// never holds the handshake's own key): the verbs reconnect mailbox keys its tags with it, so
/// someone who recorded the handshake still cannot forge a reconnect message. Never printed.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnSecret([u8; 32]);

impl std::fmt::Debug for ConnSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnSecret(..)")
    }
}

impl ConnSecret {
    /// The secret's bytes (to key a MAC with).
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A secret from raw bytes (tests and tools).
    pub fn from_bytes(b: [u8; 32]) -> ConnSecret {
        ConnSecret(b)
    }
}

/// BLAKE3 `derive_key` context of [`ConnSecret`].
const SECRET_CONTEXT: &str = "switchless 2026-12 connection fabric secret v1";

impl ConnKey {
    /// The secret this connection's fabrics get (see [`ConnSecret`]).
    pub fn fabric_secret(&self) -> ConnSecret {
        ConnSecret(blake3::derive_key(SECRET_CONTEXT, &self.0))
    }

    /// The key of the connection the connector numbered `conn_nonce` to the listener whose handle
    /// carries `listener_nonce`.
    pub fn derive(listener_nonce: u64, conn_nonce: u64) -> ConnKey {
        let mut m = [0u8; 16];
        m[..8].copy_from_slice(&listener_nonce.to_be_bytes());
        m[8..].copy_from_slice(&conn_nonce.to_be_bytes());
        ConnKey(blake3::derive_key(CONTEXT, &m))
    }

    fn tag(&self, label: &[u8], parts: &[&[u8]]) -> Tag {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(label);
        for p in parts {
            h.update(p);
        }
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        t
    }

    /// The tag a hello carries.
    pub fn hello_tag(&self, h: &Hello) -> Result<Tag> {
        Ok(self.tag(b"hello", &[&h.body()?]))
    }

    /// The tag a reply to the hello tagged `hello_tag` carries.
    pub fn reply_tag(&self, hello_tag: &Tag, r: &Reply) -> Result<Tag> {
        Ok(self.tag(b"reply", &[hello_tag, &r.body()?]))
    }

    /// The tag of an authenticated reject (`reason` as it goes on the wire, [`truncate_reason`])
    /// of the hello tagged `hello_tag`.
    pub fn refuse_tag(&self, hello_tag: &Tag, reason: &str) -> Tag {
        self.tag(b"refuse", &[hello_tag, truncate_reason(reason).as_bytes()])
    }

    /// An authenticated reject of the hello tagged `hello_tag`.
    pub fn refuse(&self, hello_tag: &Tag, reason: &str) -> Refuse {
        Refuse {
            reason: truncate_reason(reason).to_string(),
            tag: self.refuse_tag(hello_tag, reason),
        }
    }

    /// Whether `f` is an authenticated reject of the hello tagged `hello_tag` (constant time).
    pub fn check_refuse(&self, hello_tag: &Tag, f: &Refuse) -> bool {
        bool::from(self.refuse_tag(hello_tag, &f.reason).ct_eq(&f.tag))
    }

    /// Whether `h` carries the right tag (constant time in the tag's bytes).
    pub fn check_hello(&self, h: &Hello) -> bool {
        self.hello_tag(h).is_ok_and(|t| bool::from(t.ct_eq(&h.tag)))
    }

    /// Whether `r` carries the right tag for the hello tagged `hello_tag`.
    pub fn check_reply(&self, hello_tag: &Tag, r: &Reply) -> bool {
        self.reply_tag(hello_tag, r)
            .is_ok_and(|t| bool::from(t.ct_eq(&r.tag)))
    }
}

/// A hello with its tag set for the listener whose handle carries `listener_nonce`: what a connector
/// sends (tests and tools that build hellos by hand use it too).
pub fn seal_hello(mut h: Hello, listener_nonce: u64) -> Result<Hello> {
    h.tag = ConnKey::derive(listener_nonce, h.nonce).hello_tag(&h)?;
    Ok(h)
}

/// A random connector nonce.
pub fn conn_nonce() -> Result<u64> {
    crate::route::handle::random_nonce()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::handshake::wire::{PathParams, PathRequest, SideParams};

    fn hello(nonce: u64) -> Hello {
        Hello {
            nonce,
            paths: vec![PathRequest {
                connector: "10.0.0.2/30".parse().unwrap(),
                acceptor: "10.0.0.1".parse().unwrap(),
                kind: crate::route::types::LinkKind::Tcp,
                relayed: false,
            }],
            params: SideParams {
                paths: vec![PathParams {
                    mtu: 9000,
                    ..PathParams::default()
                }],
                extra: vec![1, 2, 3],
            },
            tag: [0; TAG_LEN],
        }
    }

    #[test]
    fn a_tag_binds_the_secret_the_connector_nonce_and_every_byte() {
        let h = seal_hello(hello(7), 0x5383).unwrap();
        assert!(ConnKey::derive(0x5383, 7).check_hello(&h));
        assert!(
            !ConnKey::derive(0x5384, 7).check_hello(&h),
            "other listener"
        );
        assert!(
            !ConnKey::derive(0x5383, 8).check_hello(&h),
            "other connector nonce"
        );
        let mut changed = h.clone();
        changed.params.extra[0] ^= 1;
        assert!(
            !ConnKey::derive(0x5383, 7).check_hello(&changed),
            "one byte"
        );
        let mut claimed = h.clone();
        claimed.paths[0].connector = "10.0.0.1/30".parse().unwrap();
        assert!(!ConnKey::derive(0x5383, 7).check_hello(&claimed), "address");
        // The secret is nowhere in the frame.
        let bytes = crate::transport::handshake::Message::Hello(h)
            .encode()
            .unwrap();
        assert!(!bytes.windows(8).any(|w| w == 0x5383u64.to_be_bytes()));
    }

    #[test]
    fn a_reply_tag_binds_the_hello() {
        let k = ConnKey::derive(1, 2);
        let h = seal_hello(hello(2), 1).unwrap();
        let mut r = Reply {
            nonce: 2,
            params: h.params.clone(),
            tag: [0; TAG_LEN],
        };
        r.tag = k.reply_tag(&h.tag, &r).unwrap();
        assert!(k.check_reply(&h.tag, &r));
        assert!(!k.check_reply(&[0; TAG_LEN], &r));
        assert!(!ConnKey::derive(1, 3).check_reply(&h.tag, &r));
        assert_eq!(format!("{k:?}"), "ConnKey(..)");
    }
}
