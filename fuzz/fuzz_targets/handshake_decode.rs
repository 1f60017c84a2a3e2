//! Fuzz the handshake frame decoder: untrusted bytes from any TCP client.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::transport::handshake::{Message, wire};

fuzz_target!(|data: &[u8]| {
    // The header alone never allocates more than MAX_PAYLOAD.
    if let Ok(h) = wire::Header::new_checked(data) {
        if let Ok(h) = wire::HeaderRepr::parse(&h) {
            assert!(h.payload_len <= wire::MAX_PAYLOAD);
        }
    }
    if let Ok(m) = Message::decode(data) {
        // Re-encoding and decoding gives the same message (reject reasons may be lossily repaired
        // UTF-8, so compare after one round).
        let bytes = m.encode().expect("a decoded message encodes");
        let again = Message::decode(&bytes).expect("an encoded message decodes");
        if !matches!(m, Message::Reject(_)) {
            assert_eq!(bytes, data);
        }
        let _ = again;
    }
});
