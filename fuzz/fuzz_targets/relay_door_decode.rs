//! Fuzz the relay door's decoders (`transport::relay::wire`): the challenge and verdict a client
//! reads from a relay, the request a relay reads from any neighbour that connects to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::transport::relay::wire::{
    CHALLENGE_LEN, ChallengeRepr, REQUEST_LEN, RequestRepr, VERDICT_LEN, VerdictRepr,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = <&[u8; REQUEST_LEN]>::try_from(data.get(..REQUEST_LEN).unwrap_or(&[]))
        && let Ok(r) = RequestRepr::parse(b)
    {
        // Strict: reserved bytes and unused target slots are zero, so the bytes come back.
        assert_eq!(&r.to_bytes(), b);
    }
    if let Ok(b) = <&[u8; VERDICT_LEN]>::try_from(data.get(..VERDICT_LEN).unwrap_or(&[]))
        && let Ok(v) = VerdictRepr::parse(b)
    {
        // All but the host name, which is shown escaped (a peer's bytes).
        let again = v.to_bytes();
        assert_eq!(again[..20], b[..20]);
        assert_eq!(again[52..], b[52..]);
        assert!(v.host.chars().all(|c| !c.is_control()));
    }
    if let Ok(b) = <&[u8; CHALLENGE_LEN]>::try_from(data.get(..CHALLENGE_LEN).unwrap_or(&[]))
        && let Ok(c) = ChallengeRepr::parse(b)
    {
        assert_eq!(c.to_bytes()[8..], b[8..]);
    }
});
