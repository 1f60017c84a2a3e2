//! Fuzz the descriptor a relay reads ahead of each verbs write of its client
//! (`transport::relay::staging`): whatever decodes encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::transport::relay::staging::{DESC_LEN, Descriptor};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = <&[u8; DESC_LEN]>::try_from(data.get(..DESC_LEN).unwrap_or(&[]))
        && let Ok(d) = Descriptor::parse(b)
    {
        assert_eq!(&d.to_bytes(), b);
    }
});
