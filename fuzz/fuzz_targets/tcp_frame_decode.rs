//! Fuzz the TCP fabric's stream decoders: the frame header, the stream hello, the challenge and the
//! acknowledgement, untrusted bytes from whatever connects to a TCP path's listener (or answers a
//! stream's connect).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::transport::tcp::frame::{
    Ack, AckRepr, ChallengeRepr, Frame, FrameRepr, Hello, HelloRepr,
};

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
        assert_eq!(&again[16..56], &data[16..56]);
        let v2 = Hello::new_checked(&again[..]).expect("an emitted hello has its length");
        assert_eq!(HelloRepr::parse(&v2).expect("an emitted hello parses"), h);
    }
    if let Ok(c) = ChallengeRepr::parse(data) {
        // Reserved 5..8.
        let again = c.to_bytes();
        assert_eq!(&again[..5], &data[..5]);
        assert_eq!(&again[8..], &data[8..24]);
        assert_eq!(ChallengeRepr::parse(&again).expect("an emitted challenge parses"), c);
    }
    if let Ok(a) = Ack::new_checked(data)
        && let Ok(r) = AckRepr::parse(&a)
    {
        // Reserved 4..8.
        let again = r.to_bytes();
        assert_eq!(&again[..4], &data[..4]);
        assert_eq!(&again[8..], &data[8..24]);
    }
});
