//! Stable, bounded fuzzing of the TCP fabric's stream decoders, the frame header, the stream hello,
//! the challenge and the acknowledgement (cargo-fuzz runs the same property unbounded:
//! `fuzz/fuzz_targets/tcp_frame_decode.rs`):
//! seeded mutations of valid encodings; whatever decodes re-encodes to the same bytes (reserved
//! bytes aside, which are ignored when parsed and zero when emitted); whatever does not is an
//! `Error::Remote`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchless::error::Error;
use switchless::transport::tcp::frame::{
    ACK_LEN, Ack, AckRepr, CHALLENGE_LEN, ChallengeRepr, FLAG_DIRTY, FLAG_IMM, Frame, FrameRepr,
    HEADER_LEN, HELLO_LEN, Hello, HelloRepr, OP_CLOSE, OP_WRITE,
};
use switchless::transport::tcp::{MAX_FRAME_BYTES, MAX_STREAMS};

#[path = "support/fuzz.rs"]
mod fuzz;
use fuzz::{Rng, iters};

fn headers() -> Vec<FrameRepr> {
    let write = FrameRepr {
        op: OP_WRITE,
        flags: FLAG_IMM,
        len: 1234,
        seq: 99,
        addr: 0xdead_beef_0000,
        rkey: 7,
        imm: 0x1234_5678,
        wr_len: 4321,
    };
    vec![
        write,
        // A frame before a write's last one: the immediate travels without its flag.
        FrameRepr {
            flags: 0,
            len: 64 << 10,
            seq: 3,
            ..write
        },
        FrameRepr {
            len: MAX_FRAME_BYTES as u32,
            ..write
        },
        FrameRepr::close(false),
        FrameRepr::close(true),
    ]
}

fn hellos() -> Vec<HelloRepr> {
    vec![
        HelloRepr {
            npaths: 1,
            path: 0,
            nstreams: 1,
            stream: 0,
            generation: 0,
            conn: 5,
            nonce: [1; 16],
            tag: [2; 16],
        },
        HelloRepr {
            npaths: 16,
            path: 15,
            nstreams: MAX_STREAMS as u8,
            stream: MAX_STREAMS as u8 - 1,
            generation: u32::MAX,
            conn: u64::MAX - 7,
            nonce: [0xff; 16],
            tag: [0; 16],
        },
    ]
}

/// One to three mutations aimed at the fields the decoders check.
fn mutate(rng: &mut Rng, b: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        match rng.below(7) {
            0 if !b.is_empty() => {
                let j = rng.below(b.len());
                b[j] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let j = rng.below(b.len().min(HEADER_LEN));
                b[j] = [0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 0x54, 0x57, 0xff][rng.below(13)];
            }
            2 if b.len() >= 8 => {
                // The payload length around the receiver's limit.
                let len = [
                    0,
                    1,
                    MAX_FRAME_BYTES as u32,
                    MAX_FRAME_BYTES as u32 + 1,
                    u32::MAX,
                ][rng.below(5)];
                b[4..8].copy_from_slice(&len.to_le_bytes());
            }
            3 if b.len() >= 4 => {
                // Operation and flags, each valid or not.
                b[2] = [OP_WRITE, OP_CLOSE, 0, 3][rng.below(4)];
                b[3] = [0, FLAG_IMM, FLAG_DIRTY, 3][rng.below(4)];
            }
            4 => b.truncate(rng.below(b.len() + 1)),
            5 if b.len() >= 16 => {
                // Reserved bytes of the header (36..40) or of the hello (13..16), or the
                // hello's generation (9..13).
                let j = [36, 37, 38, 39, 9, 12, 13, 15][rng.below(8)];
                if j < b.len() {
                    b[j] = rng.next() as u8;
                }
            }
            _ => b.push(rng.next() as u8),
        }
    }
}

#[test]
fn mutated_headers_never_panic_and_reencode_exactly() {
    let seeds: Vec<Vec<u8>> = headers().iter().map(|h| h.to_bytes().to_vec()).collect();
    let mut rng = Rng(0x5357_5443_0000_0001);
    let (mut ok, mut err) = (0usize, 0usize);
    for i in 0..iters() {
        let mut b = if i % 10 == 0 {
            (0..rng.below(48)).map(|_| rng.next() as u8).collect()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        mutate(&mut rng, &mut b);
        match Frame::new_checked(&b[..]).and_then(|f| FrameRepr::parse(&f)) {
            Ok(h) => {
                ok += 1;
                let again = h.to_bytes();
                assert_eq!(&again[..36], &b[..36]);
                assert_eq!(&again[36..], &[0; 4]);
                let f = Frame::new_checked(&again[..]).unwrap();
                assert_eq!(FrameRepr::parse(&f).unwrap(), h);
                assert!(h.len as usize <= MAX_FRAME_BYTES);
                assert!(!h.is_close() || h.len == 0);
            }
            Err(e) => {
                err += 1;
                assert!(matches!(e, Error::Remote(_)), "{e}");
            }
        }
    }
    assert!(ok > 100 && err > 100, "ok {ok} err {err}");
}

#[test]
fn mutated_hellos_never_panic_and_reencode_exactly() {
    let seeds: Vec<Vec<u8>> = hellos().iter().map(|h| h.to_bytes().to_vec()).collect();
    let mut rng = Rng(0x5357_5453_0000_0001);
    let (mut ok, mut err) = (0usize, 0usize);
    for i in 0..iters() {
        let mut b = if i % 10 == 0 {
            (0..rng.below(32)).map(|_| rng.next() as u8).collect()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        mutate(&mut rng, &mut b);
        // Stream index and count, each valid or not.
        if b.len() >= 9 && rng.below(4) == 0 {
            b[7] = [0, 1, 2, 16, 17, 0xff][rng.below(6)];
            b[8] = [0, 1, 15, 16, 0xff][rng.below(5)];
        }
        match Hello::new_checked(&b[..]).and_then(|v| HelloRepr::parse(&v)) {
            Ok(h) => {
                ok += 1;
                let again = h.to_bytes();
                assert_eq!(&again[..13], &b[..13]);
                assert_eq!(&again[13..16], &[0; 3]);
                assert_eq!(&again[16..HELLO_LEN], &b[16..HELLO_LEN]);
                let v = Hello::new_checked(&again[..]).unwrap();
                assert_eq!(HelloRepr::parse(&v).unwrap(), h);
                assert!((1..=MAX_STREAMS).contains(&usize::from(h.nstreams)));
                assert!(h.stream < h.nstreams);
            }
            Err(e) => {
                err += 1;
                assert!(matches!(e, Error::Remote(_)), "{e}");
            }
        }
    }
    assert!(ok > 100 && err > 100, "ok {ok} err {err}");
}

/// The stream challenge and acknowledgement: whatever decodes re-encodes to the same bytes
/// (reserved bytes aside); whatever does not is an `Error::Remote`.
#[test]
fn mutated_challenges_and_acks_never_panic_and_reencode_exactly() {
    let seeds: Vec<Vec<u8>> = vec![
        ChallengeRepr { nonce: [9; 16] }.to_bytes().to_vec(),
        AckRepr { tag: [7; 16] }.to_bytes().to_vec(),
    ];
    let mut rng = Rng(0x5357_5443_0000_0002);
    let (mut ok, mut err) = (0usize, 0usize);
    for i in 0..iters() {
        let mut b = if i % 10 == 0 {
            (0..rng.below(32)).map(|_| rng.next() as u8).collect()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        mutate(&mut rng, &mut b);
        if b.len() >= 5 && rng.below(4) == 0 {
            b[4] = [0, 1, 2, 3, 0xff][rng.below(5)];
        }
        match ChallengeRepr::parse(&b) {
            Ok(c) => {
                ok += 1;
                let again = c.to_bytes();
                assert_eq!(&again[..5], &b[..5]);
                assert_eq!(&again[5..8], &[0; 3]);
                assert_eq!(&again[8..], &b[8..CHALLENGE_LEN]);
                assert_eq!(ChallengeRepr::parse(&again).unwrap(), c);
            }
            Err(e) => {
                err += 1;
                assert!(matches!(e, Error::Remote(_)), "{e}");
            }
        }
        match Ack::new_checked(&b[..]).and_then(|a| AckRepr::parse(&a)) {
            Ok(a) => {
                ok += 1;
                let again = a.to_bytes();
                assert_eq!(&again[..4], &b[..4]);
                assert_eq!(&again[4..8], &[0; 4]);
                assert_eq!(&again[8..], &b[8..ACK_LEN]);
                assert_eq!(
                    AckRepr::parse(&Ack::new_checked(&again[..]).unwrap()).unwrap(),
                    a
                );
            }
            Err(e) => {
                err += 1;
                assert!(matches!(e, Error::Remote(_)), "{e}");
            }
        }
    }
    assert!(ok > 100 && err > 100, "ok {ok} err {err}");
}

/// The cargo-fuzz seed files stay valid as the formats evolve.
#[test]
fn fuzz_seed_files_decode() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/tcp_frame_decode");
    let (mut frames, mut hellos, mut challenges, mut acks) = (0, 0, 0, 0);
    for entry in std::fs::read_dir(dir).unwrap() {
        let b = std::fs::read(entry.unwrap().path()).unwrap();
        match &b[..4] {
            b"SWTS" => {
                let h = HelloRepr::parse(&Hello::new_checked(&b[..]).unwrap()).unwrap();
                assert_eq!(&h.to_bytes()[..], &b[..]);
                hellos += 1;
            }
            b"SWTC" => {
                let c = ChallengeRepr::parse(&b).unwrap();
                assert_eq!(&c.to_bytes()[..], &b[..]);
                challenges += 1;
            }
            b"SWTA" => {
                let a = AckRepr::parse(&Ack::new_checked(&b[..]).unwrap()).unwrap();
                assert_eq!(&a.to_bytes()[..], &b[..]);
                acks += 1;
            }
            _ => {
                assert_eq!(b.len(), HEADER_LEN);
                let h = FrameRepr::parse(&Frame::new_checked(&b[..]).unwrap()).unwrap();
                assert_eq!(&h.to_bytes()[..], &b[..]);
                frames += 1;
            }
        }
    }
    assert_eq!((frames, hellos, challenges, acks), (3, 1, 1, 1));
}
