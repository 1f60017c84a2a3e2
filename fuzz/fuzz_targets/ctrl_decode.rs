//! Fuzz the comm protocol's decoders of what the peer writes or sends: the control-memory info of
//! the handshake, a clear-to-send slot (header and elements), a size record, an immediate, a key
//! update, and the TCP stream acknowledgement.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchless::transport::stripe::MAX_PATHS;
use switchless::transport::tcp::frame::{ACK_LEN, Ack, AckRepr};
use switchless::transport::wire::{
    self, CtrlInfo, CtsElem, ELEM_WORDS, Imm, KEY_WORDS, MAX_RECVS, SLOT_ELEMS, SLOT_HDR,
    SLOT_WORDS,
};

fn word(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    for (k, x) in w.iter_mut().enumerate() {
        *x = b.get(i * 8 + k).copied().unwrap_or(0);
    }
    u64::from_le_bytes(w)
}

fuzz_target!(|data: &[u8]| {
    // Control-memory info: whatever decodes re-encodes to the same bytes but the reserved 6..8.
    if let Ok(c) = CtrlInfo::from_bytes(data) {
        let again = c.to_bytes();
        assert_eq!(again.len(), data.len());
        assert_eq!(&again[..6], &data[..6]);
        assert_eq!(&again[8..], &data[8..]);
        assert_eq!(
            CtrlInfo::from_bytes(&again).expect("re-encoded info decodes"),
            c
        );
    }
    // A clear-to-send slot as the sender reads it: whatever it takes bounds `n`, and its elements
    // re-encode to an entry that is taken alike (unused bits aside, which the check also covers).
    let npaths = usize::from(data.first().copied().unwrap_or(0)) % (MAX_PATHS + 2);
    let mut w = [0u64; SLOT_WORDS];
    for (i, x) in w.iter_mut().enumerate() {
        *x = word(data, i);
    }
    let seq = w[0].wrapping_sub(1);
    let len = wire::slot_words_to_read(w[SLOT_HDR]);
    if let Ok(Some(n)) = wire::check_slot(&w[..len], seq, npaths) {
        assert!((1..=MAX_RECVS).contains(&n));
        let elems: Vec<CtsElem> = (0..n)
            .map(|e| {
                let b = SLOT_ELEMS + e * ELEM_WORDS;
                wire::decode_elem(&w[b..b + ELEM_WORDS])
            })
            .collect();
        let mut again = [0u64; SLOT_WORDS];
        let l = wire::encode_slot(seq, &elems, npaths, &mut again);
        assert_eq!(l, len);
        assert_eq!(wire::check_slot(&again[..l], seq, npaths).ok(), Some(Some(n)));
        assert_eq!(wire::slot_landed(&w), w[0]);
    }
    // A size record and an immediate: whatever decodes encodes back to the same word.
    let (rec, seq) = (word(data, 0), word(data, 1));
    if let Ok(size) = wire::decode_record(rec, seq) {
        assert_eq!(wire::encode_record(size, seq), rec);
    }
    let v = word(data, 2) as u32;
    if let Ok(imm) = Imm::decode(v) {
        assert_eq!(imm.encode(), v);
    }
    // A header's keyless-paths bits and a key update's keys: what decodes encodes back.
    let hdr = word(data, 3);
    assert_eq!(wire::with_keys_missing(hdr, wire::slot_keys_missing(hdr)), hdr);
    let kw: Vec<u64> = (0..KEY_WORDS - 1).map(|i| word(data, 4 + i)).collect();
    let mut rkeys = [0u32; MAX_RECVS];
    for (e, k) in rkeys.iter_mut().enumerate() {
        *k = wire::decode_key(&kw, e);
    }
    let mut out = [0u64; KEY_WORDS];
    wire::encode_keys(seq >> 1, &rkeys, &mut out);
    assert_eq!(&out[1..], &kw[..]);
    assert_eq!(out[0], (seq >> 1) + 1);
    // The TCP stream acknowledgement: only its magic is accepted (its tag is `tcp::auth`'s check).
    if let Ok(a) = Ack::new_checked(data)
        && let Ok(r) = AckRepr::parse(&a)
    {
        assert_eq!(&data[..4], &r.to_bytes()[..4]);
        assert!(data.len() >= ACK_LEN);
    }
});
