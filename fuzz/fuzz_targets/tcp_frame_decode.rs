//! Fuzz the TCP fabric's stream decoders: the frame header and the stream hello, untrusted bytes
//! from whatever connects to a TCP path's listener.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::transport::tcp::frame::{Frame, FrameRepr, Hello, HelloRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = Frame::new_checked(data)
        && let Ok(h) = FrameRepr::parse(&f)
    {
        // Whatever decodes re-encodes to the same bytes; the reserved 36..40 are ignored when
        // parsed and zero when emitted.
        let again = h.to_bytes();
        assert_eq!(&again[..36], &data[..36]);
        assert_eq!(&again[36..], &[0; 4]);
        let f2 = Frame::new_checked(&again[..]).expect("an emitted header has its length");
        assert_eq!(FrameRepr::parse(&f2).expect("an emitted header parses"), h);
    }
    if let Ok(v) = Hello::new_checked(data)
        && let Ok(h) = HelloRepr::parse(&v)
    {
        // The same for the hello, whose reserved bytes are 13..16 (9..13: the generation).
        let again = h.to_bytes();
        assert_eq!(&again[..13], &data[..13]);
        assert_eq!(&again[13..16], &[0; 3]);
        assert_eq!(&again[16..24], &data[16..24]);
        let v2 = Hello::new_checked(&again[..]).expect("an emitted hello has its length");
        assert_eq!(HelloRepr::parse(&v2).expect("an emitted hello parses"), h);
    }
});
