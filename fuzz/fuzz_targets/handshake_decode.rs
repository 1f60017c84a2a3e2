//! Fuzz the handshake frame decoder: untrusted bytes from any TCP client.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::transport::handshake::{Message, wire};

fuzz_target!(|data: &[u8]| {
    // The header alone never allows more than MAX_PAYLOAD, and one that parses is canonical.
    let header = wire::Header::new_checked(data)
        .ok()
        .and_then(|h| wire::HeaderRepr::parse(&h).ok());
    if let Some(h) = header {
        assert!(h.payload_len <= wire::MAX_PAYLOAD);
        let mut out = [0u8; wire::HEADER_LEN];
        h.emit(&mut wire::Header::new_unchecked(&mut out[..]))
            .expect("a parsed header emits");
        assert_eq!(out[..], data[..wire::HEADER_LEN]);
    }
    let Ok(m) = Message::decode(data) else {
        return;
    };
    assert_eq!(header.map(|h| h.msg_type), Some(m.msg_type()));
    let bytes = m.encode().expect("a decoded message encodes");
    let again = Message::decode(&bytes).expect("an encoded message decodes");
    match (&m, &again) {
        // A reject reason is repaired UTF-8 (a bad byte becomes 3) and re-encoding truncates it to
        // MAX_REASON bytes on a character boundary: what comes back is a prefix, the same reason
        // when it fits, and stable from then on.
        (Message::Reject(r), Message::Reject(r2))
        | (
            Message::Refuse(wire::Refuse { reason: r, .. }),
            Message::Refuse(wire::Refuse { reason: r2, .. }),
        ) => {
            assert!(r.starts_with(r2.as_str()), "{r:?} -> {r2:?}");
            if r.len() <= wire::MAX_REASON {
                assert_eq!(r, r2);
            }
            let third = again.encode().expect("a decoded reject encodes");
            assert_eq!(Message::decode(&third).expect("it decodes"), again);
        }
        _ => {
            assert_eq!(bytes, data);
            assert_eq!(again, m);
        }
    }
});
