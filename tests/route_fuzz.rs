//! Stable, bounded fuzzing of the listen-handle decoder (cargo-fuzz runs the same property unbounded:
//! `fuzz/fuzz_targets/handle_decode.rs`). Seeded mutations of valid handles plus random bytes; a fixed
//! seed keeps CI deterministic, `SWITCHLESS_FUZZ_ITERS` raises the count.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchless::route::HandleRepr;
use switchless::route::types::{LinkKind, RemoteLink};

#[path = "support/fuzz.rs"]
mod fuzz;
use fuzz::{Rng, iters};

fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for n in [0usize, 1, 2, 8, 16] {
        let links = (0..n)
            .map(|i| RemoteLink {
                addr: format!("10.{i}.0.{}/{}", 1 + i, 24 + i % 9)
                    .parse()
                    .unwrap(),
                phys_port_id: (i / 2) as u16,
                pci_root_id: (i % 4) as u16,
                kind: if i % 3 == 0 {
                    LinkKind::Tcp
                } else {
                    LinkKind::Roce
                },
            })
            .collect();
        let control = (n % 2 == 1).then(|| "192.0.2.1".parse().unwrap());
        let repr = HandleRepr {
            nonce: 0x0123_4567_89ab_cdef ^ n as u64,
            port: 40_000 + n as u16,
            control,
            links,
        };
        out.push(repr.to_bytes().unwrap().to_vec());
    }
    out
}

fn mutate(rng: &mut Rng, b: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2 if !b.is_empty() => {
                // Interesting values in the count / flags / ids bytes.
                let i = [2, 3, 12, 13, 22, 23, 114, 119][rng.below(8)].min(b.len() - 1);
                b[i] = [0, 1, 15, 16, 17, 32, 33, 0x40, 0x80, 0xff][rng.below(10)];
            }
            3 => b.truncate(rng.below(b.len() + 1)),
            4 => b.push(rng.next() as u8),
            _ => {}
        }
    }
}

#[test]
fn mutated_and_random_handles_never_panic_and_reencode_exactly() {
    let seeds = seeds();
    for s in &seeds {
        assert!(HandleRepr::from_bytes(s).is_ok());
    }
    let mut rng = Rng(0x5357_4c48_0000_0001);
    let (mut ok, mut err) = (0usize, 0usize);
    for i in 0..iters() {
        let mut b = if i % 10 == 0 {
            (0..rng.below(200)).map(|_| rng.next() as u8).collect()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        mutate(&mut rng, &mut b);
        match HandleRepr::from_bytes(&b) {
            Ok(repr) => {
                ok += 1;
                let again = repr.to_bytes().unwrap();
                // Everything but the connector's scratch bytes (120..128) re-encodes exactly.
                assert_eq!(&again[..120], &b[..120], "input {b:02x?}");
                assert_eq!(&again[120..], &[0u8; 8]);
            }
            Err(e) => {
                err += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    // Both outcomes occur: the mutator reaches past the magic and version checks.
    assert!(ok > 100 && err > 100, "ok {ok} err {err}");
}
