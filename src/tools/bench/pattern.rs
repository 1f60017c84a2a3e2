//! Verification data: every transfer carries bytes derived from (seed, offset), so the receiver can
//! check each byte without a copy of the sender's buffer; all-reduce inputs are small integers in
//! f32, whose sums are exact.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};

/// A seed naming one transfer: who sent it, to whom, which size, iteration and slot.
pub fn seed(parts: &[u64]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        h ^= *p;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

fn word(seed: u64, index: u64) -> u64 {
    // splitmix64 of (seed, index)
    let mut z = seed.wrapping_add(index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `out` with the pattern of `seed`.
pub fn fill(out: &mut [u8], seed: u64) {
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let w = word(seed, i as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// Checks that `got` holds the pattern of `seed`; the error names the first wrong byte.
pub fn verify(got: &[u8], seed: u64, what: &str) -> Result<()> {
    for (i, chunk) in got.chunks(8).enumerate() {
        let w = word(seed, i as u64).to_le_bytes();
        if chunk != &w[..chunk.len()] {
            let j = chunk
                .iter()
                .zip(w.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let off = i * 8 + j;
            return Err(Error::Remote(format!(
                "data check failed for {what}: byte {off} of {} B is {:#04x}, expected {:#04x}",
                got.len(),
                chunk[j],
                w[j]
            )));
        }
    }
    Ok(())
}

/// All-reduce input of `rank` at element `i`: an integer in 1..=16 (exact in f32; 16 ranks of
/// them sum to at most 256).
pub fn reduce_input(rank: usize, i: usize) -> f32 {
    (((rank * 7 + i * 13) % 16) + 1) as f32
}

/// The expected all-reduce result at element `i` over `nranks` ranks.
pub fn reduce_expected(nranks: usize, i: usize) -> f32 {
    (0..nranks).map(|r| reduce_input(r, i)).sum()
}

/// Writes f32 values as little-endian bytes.
pub fn put_f32s(out: &mut [u8], vals: impl Iterator<Item = f32>) {
    for (c, v) in out.chunks_exact_mut(4).zip(vals) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// Reads f32 value `i` of little-endian bytes.
pub fn get_f32(b: &[u8], i: usize) -> f32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[i * 4..i * 4 + 4]);
    f32::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_verify_passes_and_a_flip_fails() {
        for len in [0usize, 1, 7, 8, 9, 4096 + 3] {
            let mut b = vec![0u8; len];
            fill(&mut b, 42);
            verify(&b, 42, "t").unwrap();
            if len > 0 {
                b[len / 2] ^= 0x10;
                let e = verify(&b, 42, "t").unwrap_err().to_string();
                assert!(e.contains(&format!("byte {}", len / 2)), "{e}");
            }
        }
    }

    #[test]
    fn seeds_differ() {
        assert_ne!(seed(&[0, 1, 8, 0]), seed(&[1, 0, 8, 0]));
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        fill(&mut a, seed(&[0, 1]));
        fill(&mut b, seed(&[1, 0]));
        assert_ne!(a, b);
        assert!(verify(&a, seed(&[1, 0]), "t").is_err());
    }

    #[test]
    fn reduce_is_exact() {
        assert_eq!(reduce_expected(3, 0), 1.0 + 8.0 + 15.0);
        let mut b = vec![0u8; 16];
        put_f32s(&mut b, (0..4).map(|i| i as f32 + 0.5));
        assert_eq!(get_f32(&b, 3), 3.5);
    }
}
