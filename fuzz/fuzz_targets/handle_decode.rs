//! Fuzz the listen-handle decoder: untrusted bytes from a peer rank.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::route::HandleRepr;

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = HandleRepr::from_bytes(data) {
        // Whatever decodes re-encodes to the same bytes, except the connector's scratch (120..128).
        let again = repr.to_bytes().expect("a decoded handle encodes");
        assert_eq!(&again[..120], &data[..120]);
    }
});
