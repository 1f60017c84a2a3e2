//! What the mutation fuzz tests (`tests/route_fuzz.rs`, `tests/handshake_fuzz.rs`) share: a tiny
//! deterministic generator and the iteration count (`SWITCHLESS_FUZZ_ITERS`, default 200 000).
#![allow(dead_code)]

/// xorshift64*: tiny deterministic generator for mutation choices.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Inputs per fuzz target.
pub fn iters() -> usize {
    std::env::var("SWITCHLESS_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}
