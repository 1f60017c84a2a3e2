//! Stable, bounded fuzzing of the relay door's decoders (`transport::relay::wire`): the challenge a
//! client reads from a relay, the request a relay reads from a neighbour, the verdict a client reads
//! back (cargo-fuzz runs the same property unbounded: `fuzz/fuzz_targets/relay_door_decode.rs`).
//! Seeded mutations of valid encodings; whatever decodes re-encodes to the same bytes (the
//! challenge's reserved bytes and a verdict's host name aside: ignored, and shown escaped); whatever
//! does not is an `Error::Remote`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;

use switchless::error::Error;
use switchless::transport::relay::CommKey;
use switchless::transport::relay::wire::{
    CHALLENGE_LEN, ChallengeRepr, Code, MAX_LINKS, MAX_TARGETS, Op, REQUEST_LEN, RequestRepr,
    VERDICT_LEN, VerdictRepr,
};

#[path = "support/fuzz.rs"]
mod fuzz;
use fuzz::{Rng, iters};

fn requests() -> Vec<[u8; REQUEST_LEN]> {
    let k = CommKey::new(42);
    let probe = RequestRepr {
        op: Op::Probe,
        comm: 0,
        port: 0,
        targets: (0..MAX_TARGETS as u8)
            .map(|i| Ipv4Addr::new(10, i, 0, 2))
            .collect(),
        nonce: [3; 16],
        tag: [0; 16],
    };
    let open = RequestRepr {
        op: Op::Open,
        port: 40_000,
        targets: vec![Ipv4Addr::new(10, 0, 2, 2)],
        ..probe.clone()
    };
    // An open to a relay (a chain's first hop): one target, the relay door's port.
    let open_relay = RequestRepr {
        op: Op::OpenRelay,
        port: 24_600,
        ..open.clone()
    };
    // A list of the relay's links (a chain's discovery): no target, the link's index as port.
    let list = RequestRepr {
        op: Op::List,
        port: 1,
        targets: Vec::new(),
        ..open.clone()
    };
    vec![
        k.seal(probe, &[1; 16]).to_bytes(),
        k.seal(open, &[2; 16]).to_bytes(),
        k.seal(open_relay, &[3; 16]).to_bytes(),
        k.seal(list, &[4; 16]).to_bytes(),
    ]
}

fn verdicts() -> Vec<[u8; VERDICT_LEN]> {
    let ok = VerdictRepr {
        code: Code::Ok,
        target: Ipv4Addr::new(10, 0, 2, 2),
        via: Ipv4Addr::new(10, 0, 2, 1),
        speed_mbps: 200_000,
        host: "spark-2".into(),
        tag: [9; 16],
    };
    vec![ok.to_bytes(), VerdictRepr::refusal(Code::Busy).to_bytes()]
}

/// One to three mutations: bit flips, interesting bytes, truncated-looking zero runs.
fn mutate(rng: &mut Rng, b: &mut [u8]) {
    for _ in 0..1 + rng.below(3) {
        let j = rng.below(b.len());
        match rng.below(4) {
            0 => b[j] ^= 1 << rng.below(8),
            1 => b[j] = [0, 1, 2, 3, 4, 6, 7, 16, 17, 0x7f, 0xff][rng.below(11)],
            2 => {
                // Header bytes (magic, version, op, counts) most of all.
                let h = rng.below(8);
                b[h] = rng.next() as u8;
            }
            _ => {
                let end = (j + 1 + rng.below(8)).min(b.len());
                b[j..end].fill(0);
            }
        }
    }
}

fn remote(e: &Error) {
    assert!(matches!(e, Error::Remote(_)), "{e:?}");
    assert!(e.to_string().contains("relay door: "), "{e}");
}

#[test]
fn mutated_requests_never_panic_and_reencode_exactly() {
    let seeds = requests();
    let mut rng = Rng(0x5eed_0001);
    let (mut ok, mut bad) = (0, 0);
    for i in 0..iters() {
        let mut b = seeds[i % seeds.len()];
        mutate(&mut rng, &mut b);
        match RequestRepr::parse(&b) {
            Ok(r) => {
                assert_eq!(r.to_bytes(), b, "{r:?}");
                // A list names no target and a link index; the others 1..=MAX_TARGETS.
                if r.op == Op::List {
                    assert!(r.targets.is_empty() && r.port < MAX_LINKS, "{r:?}");
                } else {
                    assert!(!r.targets.is_empty() && r.targets.len() <= MAX_TARGETS);
                }
                ok += 1;
            }
            Err(e) => {
                remote(&e);
                bad += 1;
            }
        }
    }
    assert!(ok > 0 && bad > 0, "{ok} decoded, {bad} refused");
}

#[test]
fn mutated_verdicts_and_challenges_never_panic_and_reencode_exactly() {
    let seeds = verdicts();
    let mut rng = Rng(0x5eed_0002);
    let (mut ok, mut bad) = (0, 0);
    for i in 0..iters() {
        let mut b = seeds[i % seeds.len()];
        mutate(&mut rng, &mut b);
        match VerdictRepr::parse(&b) {
            Ok(v) => {
                let again = v.to_bytes();
                // All but the host name, which is shown escaped (a peer's bytes).
                assert_eq!(again[..20], b[..20], "{v:?}");
                assert_eq!(again[52..], b[52..], "{v:?}");
                assert!(v.host.chars().all(|c| !c.is_control()), "{:?}", v.host);
                ok += 1;
            }
            Err(e) => {
                remote(&e);
                bad += 1;
            }
        }
        let mut c = ChallengeRepr { nonce: [7; 16] }.to_bytes();
        mutate(&mut rng, &mut c);
        match ChallengeRepr::parse(&c) {
            Ok(x) => {
                let again = x.to_bytes();
                assert_eq!(again[..5], c[..5]);
                assert_eq!(again[8..CHALLENGE_LEN], c[8..CHALLENGE_LEN]);
            }
            Err(e) => remote(&e),
        }
    }
    assert!(ok > 0 && bad > 0, "{ok} decoded, {bad} refused");
}

/// The descriptor a relay reads from each verbs write of its client (`relay::staging`): what
/// decodes re-encodes to the same bytes; what does not is an `Error::Remote` naming it.
#[test]
fn mutated_staging_descriptors_never_panic_and_reencode_exactly() {
    use switchless::transport::relay::staging::{DESC_LEN, Descriptor};
    let seeds: Vec<[u8; DESC_LEN]> = [None, Some(0), Some(u32::MAX)]
        .into_iter()
        .map(|imm| {
            Descriptor {
                len: 512 << 10,
                addr: 0x7f12_3456_7000,
                rkey: 0xabcd,
                imm,
            }
            .to_bytes()
        })
        .collect();
    let mut rng = Rng(0x5eed_0003);
    let (mut ok, mut bad) = (0, 0);
    for i in 0..iters() {
        let mut b = seeds[i % seeds.len()];
        mutate(&mut rng, &mut b);
        match Descriptor::parse(&b) {
            Ok(d) => {
                assert_eq!(d.to_bytes(), b, "{d:?}");
                ok += 1;
            }
            Err(e) => {
                assert!(matches!(e, Error::Remote(_)), "{e:?}");
                assert!(e.to_string().contains("relay staging descriptor: "), "{e}");
                bad += 1;
            }
        }
    }
    assert!(ok > 0 && bad > 0, "{ok} decoded, {bad} refused");
}

/// The set-up messages of a verbs leg (`relay::leg_setup`), read by a relay from its client and by
/// the client from the relay: what decodes re-encodes to the same bytes; what does not is an
/// `Error::Remote` naming the message.
#[test]
fn mutated_leg_setup_messages_never_panic_and_reencode_exactly() {
    use switchless::transport::relay::leg_setup::{
        Geometry, OFFER_LEN, Offer, PEER_LEN, Peer, QpEnd, READY_LEN, Ready, Window,
    };
    let end = |qpn| QpEnd {
        qpn,
        psn: 0x12_3456,
        gid: [0xfe; 16],
        mtu: 1024,
    };
    let win = |addr| Window { addr, rkey: 0x77 };
    let ring = Geometry {
        slots: 16,
        slot_bytes: 4096,
    };
    let offer = Offer {
        a: end(5),
        ring,
        credit: win(0x1000),
    }
    .to_bytes();
    let ready = Ready {
        k_a: end(6),
        ring_a: win(0x2000),
        k_b: end(7),
        ring_b: win(0x3000),
        ring,
    }
    .to_bytes();
    let peer = Peer {
        b: end(8),
        credit: win(0x4000),
    }
    .to_bytes();
    let mut rng = Rng(0x5eed_0004);
    let (mut ok, mut bad) = (0, 0);
    let mut seen = |r: Result<bool, Error>, what: &str| match r {
        Ok(same) => {
            assert!(same, "{what} did not re-encode to its bytes");
            ok += 1;
        }
        Err(e) => {
            assert!(matches!(e, Error::Remote(_)), "{e:?}");
            assert!(
                e.to_string().contains(&format!("relay leg {what}: ")),
                "{e}"
            );
            bad += 1;
        }
    };
    for i in 0..iters() {
        match i % 3 {
            0 => {
                let mut b: [u8; OFFER_LEN] = offer;
                mutate(&mut rng, &mut b);
                seen(Offer::parse(&b).map(|m| m.to_bytes() == b), "offer");
            }
            1 => {
                let mut b: [u8; READY_LEN] = ready;
                mutate(&mut rng, &mut b);
                seen(Ready::parse(&b).map(|m| m.to_bytes() == b), "ready");
            }
            _ => {
                let mut b: [u8; PEER_LEN] = peer;
                mutate(&mut rng, &mut b);
                seen(Peer::parse(&b).map(|m| m.to_bytes() == b), "peer");
            }
        }
    }
    assert!(ok > 0 && bad > 0, "{ok} decoded, {bad} refused");
}
