//! Fuzz what a relay and its client read of each other for a verbs leg
//! (`transport::relay::staging`, `transport::relay::leg_setup`): the descriptor ahead of each write
//! and the set-up messages. Whatever decodes encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::transport::relay::leg_setup::{
    OFFER_LEN, Offer, PEER_LEN, Peer, READY_LEN, Ready, UP_LEN, parse_up, up_bytes,
};
use switchless::transport::relay::staging::{DESC_LEN, Descriptor};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = <&[u8; DESC_LEN]>::try_from(data.get(..DESC_LEN).unwrap_or(&[]))
        && let Ok(d) = Descriptor::parse(b)
    {
        assert_eq!(&d.to_bytes(), b);
    }
    if let Ok(b) = <&[u8; OFFER_LEN]>::try_from(data.get(..OFFER_LEN).unwrap_or(&[]))
        && let Ok(m) = Offer::parse(b)
    {
        assert_eq!(&m.to_bytes(), b);
    }
    if let Ok(b) = <&[u8; READY_LEN]>::try_from(data.get(..READY_LEN).unwrap_or(&[]))
        && let Ok(m) = Ready::parse(b)
    {
        assert_eq!(&m.to_bytes(), b);
    }
    if let Ok(b) = <&[u8; PEER_LEN]>::try_from(data.get(..PEER_LEN).unwrap_or(&[]))
        && let Ok(m) = Peer::parse(b)
    {
        assert_eq!(&m.to_bytes(), b);
    }
    if let Ok(b) = <&[u8; UP_LEN]>::try_from(data.get(..UP_LEN).unwrap_or(&[]))
        && parse_up(b).is_ok()
    {
        assert_eq!(&up_bytes(), b);
    }
});
