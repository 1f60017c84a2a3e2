//! Stable, bounded fuzzing of the handshake decoder and its header view (cargo-fuzz runs the same
//! properties unbounded: `fuzz/fuzz_targets/handshake_decode.rs`), plus round trips of generated
//! messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use switchless::route::types::LinkKind;
use switchless::transport::handshake::{
    Hello, Message, PathParams, PathRequest, Reply, SideParams, wire,
};

#[path = "support/fuzz.rs"]
mod fuzz;
use fuzz::{Rng, iters};

fn pp(i: u32, nq: usize) -> PathParams {
    PathParams {
        qpns: (0..nq as u32).map(|q| 0x100 + q + i).collect(),
        psn: i & 0xff_ffff,
        gid: [i as u8; 16],
        gid_index: i % 8,
        mtu: 4096,
        rkey: i.wrapping_mul(7),
        addr: u64::from(i) << 20,
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for n in [1usize, 2, 16] {
        let paths = (0..n)
            .map(|i| PathRequest {
                connector: format!("10.{i}.0.1/30").parse().unwrap(),
                acceptor: format!("10.{i}.0.2").parse().unwrap(),
                kind: if i % 2 == 0 {
                    LinkKind::Roce
                } else {
                    LinkKind::Tcp
                },
                // Kind byte 2: a TCP path through a relay host.
                relayed: i % 4 == 3,
            })
            .collect();
        let params = SideParams {
            paths: (0..n).map(|i| pp(i as u32, 1 + i % 4)).collect(),
            extra: vec![7; n * 10],
        };
        v.push(
            Message::Hello(Hello {
                nonce: 99 + n as u64,
                paths,
                params: params.clone(),
                tag: [n as u8; wire::TAG_LEN],
            })
            .encode()
            .unwrap(),
        );
        v.push(
            Message::Reply(Reply {
                nonce: 5,
                params,
                tag: [3; wire::TAG_LEN],
            })
            .encode()
            .unwrap(),
        );
    }
    v.push(
        Message::Reject("path 0 (10.0.0.1 -> 10.0.0.2): down".into())
            .encode()
            .unwrap(),
    );
    v.push(
        Message::Refuse(wire::Refuse {
            reason: "cannot create QPs: out of memory".into(),
            tag: [9; wire::TAG_LEN],
        })
        .encode()
        .unwrap(),
    );
    v.push(Message::Ready.encode().unwrap());
    v
}

#[test]
fn mutated_frames_never_panic_and_reencode_exactly() {
    let seeds = seeds();
    let mut rng = Rng(0x5357_4853_0000_0001);
    let (mut ok, mut err, mut headers) = (0usize, 0usize, 0usize);
    for i in 0..iters() {
        let mut b = if i % 10 == 0 {
            (0..rng.below(300)).map(|_| rng.next() as u8).collect()
        } else {
            seeds[rng.below(seeds.len())].clone()
        };
        for _ in 0..1 + rng.below(3) {
            match rng.below(6) {
                0 if !b.is_empty() => {
                    let j = rng.below(b.len());
                    b[j] ^= 1 << rng.below(8);
                }
                1 if !b.is_empty() => {
                    let j = rng.below(b.len().min(40));
                    b[j] = [0, 1, 2, 3, 4, 5, 16, 17, 32, 33, 0xff][rng.below(11)];
                }
                2 if b.len() >= wire::HEADER_LEN => {
                    // Make the header length agree with a truncated or extended payload.
                    let cut = rng.below(b.len() + 8);
                    b.resize(cut.max(wire::HEADER_LEN), 0);
                    let len = (b.len() - wire::HEADER_LEN) as u32;
                    wire::Header::new_unchecked(&mut b[..]).set_payload_len(len);
                }
                3 => b.truncate(rng.below(b.len() + 1)),
                4 if b.len() >= wire::HEADER_LEN => {
                    let big = [wire::MAX_PAYLOAD as u32 + 1, u32::MAX, 0x8000_0000][rng.below(3)];
                    b[wire::field::LEN].copy_from_slice(&big.to_be_bytes());
                }
                _ => b.push(rng.next() as u8),
            }
        }
        let header = match wire::Header::new_checked(&b[..]) {
            Ok(h) => wire::HeaderRepr::parse(&h).ok(),
            Err(_) => {
                assert!(b.len() < wire::HEADER_LEN);
                None
            }
        };
        if let Some(h) = header {
            headers += 1;
            assert!(h.payload_len <= wire::MAX_PAYLOAD);
            // A header that parses is canonical: its Repr emits the same 12 bytes.
            let mut out = [0u8; wire::HEADER_LEN];
            h.emit(&mut wire::Header::new_unchecked(&mut out[..]))
                .unwrap();
            assert_eq!(out[..], b[..wire::HEADER_LEN]);
        }
        match Message::decode(&b) {
            Ok(m) => {
                ok += 1;
                // A frame decodes only behind a header that parses, of the message's type.
                assert_eq!(header.map(|h| h.msg_type), Some(m.msg_type()));
                let again = m.encode().unwrap();
                if !matches!(m, Message::Reject(_) | Message::Refuse(_)) {
                    assert_eq!(again, b);
                }
                assert_eq!(Message::decode(&again).unwrap(), m);
            }
            Err(e) => {
                err += 1;
                assert!(
                    e.to_string()
                        .starts_with("remote error: malformed handshake message"),
                    "{e}"
                );
            }
        }
    }
    assert!(ok > 100 && err > 100, "ok {ok} err {err}");
    // Most inputs get past the header, so the payload decoder is exercised too.
    assert!(headers > ok + 100, "headers {headers} ok {ok}");
}

#[test]
fn header_fields_sit_where_the_layout_says() {
    use wire::{Header, HeaderRepr, MsgType, field};
    let mut b = [0xaau8; wire::HEADER_LEN];
    HeaderRepr {
        msg_type: MsgType::Reject,
        payload_len: 0x0102,
    }
    .emit(&mut Header::new_unchecked(&mut b[..]))
    .unwrap();
    assert_eq!(
        b,
        [b'S', b'W', b'H', b'S', wire::VERSION, 3, 0, 0, 0, 0, 1, 2]
    );
    assert_eq!((field::VERSION, field::TYPE), (4, 5));
    assert_eq!((field::RESERVED, field::LEN), (6..8, 8..12));
    let h = Header::new_checked(&b[..]).unwrap();
    assert_eq!(
        (h.magic(), h.version(), h.msg_type(), h.reserved()),
        (*b"SWHS", wire::VERSION, 3, 0)
    );
    assert_eq!(h.payload_len(), 0x0102);
    assert_eq!(
        HeaderRepr::parse(&h).unwrap(),
        HeaderRepr {
            msg_type: MsgType::Reject,
            payload_len: 0x0102
        }
    );
    // Short buffers are refused by the view, before any field is read; so is a payload too large
    // to emit.
    assert!(Header::new_checked(&b[..11]).is_err());
    let e = HeaderRepr {
        msg_type: MsgType::Ready,
        payload_len: wire::MAX_PAYLOAD + 1,
    }
    .emit(&mut Header::new_unchecked(&mut b[..]))
    .unwrap_err();
    assert!(matches!(e, switchless::error::Error::Internal(_)), "{e}");
    // Every parse error is the peer's fault.
    for (i, v) in [(0usize, b'X'), (4, 1), (5, 0), (5, 6), (6, 1), (8, 1)] {
        let mut c = b;
        c[i] = v;
        let e = HeaderRepr::parse(&Header::new_unchecked(&c[..])).unwrap_err();
        assert!(matches!(e, switchless::error::Error::Remote(_)), "{e}");
    }
}

fn arb_params(n: usize) -> impl Strategy<Value = SideParams> {
    (
        proptest::collection::vec(
            (
                proptest::collection::vec(0u32..0x100_0000, 0..=32),
                0u32..0x100_0000,
                any::<[u8; 16]>(),
                0u32..=0xffff,
                256u32..=65536,
                any::<u32>(),
                any::<u64>(),
            )
                .prop_map(|(qpns, psn, gid, gid_index, mtu, rkey, addr)| PathParams {
                    qpns,
                    psn,
                    gid,
                    gid_index,
                    mtu,
                    rkey,
                    addr,
                }),
            n,
        ),
        proptest::collection::vec(any::<u8>(), 0..=1024),
    )
        .prop_map(|(paths, extra)| SideParams { paths, extra })
}

fn arb_hello() -> impl Strategy<Value = Message> {
    (1usize..=16).prop_flat_map(|n| {
        (
            any::<u64>(),
            proptest::collection::vec((any::<u32>(), 0u8..=32, any::<u32>(), any::<bool>()), n),
            arb_params(n),
        )
            .prop_map(|(nonce, reqs, params)| {
                let paths = reqs
                    .into_iter()
                    .map(|(a, p, b, tcp)| PathRequest {
                        connector: ipnet::Ipv4Net::new(a.into(), p).unwrap(),
                        acceptor: b.into(),
                        kind: if tcp { LinkKind::Tcp } else { LinkKind::Roce },
                        relayed: false,
                    })
                    .collect();
                Message::Hello(Hello {
                    nonce,
                    paths,
                    params,
                    tag: [nonce as u8; wire::TAG_LEN],
                })
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn hello_round_trips(m in arb_hello()) {
        let b = m.encode().unwrap();
        prop_assert!(b.len() - wire::HEADER_LEN <= wire::MAX_PAYLOAD);
        prop_assert_eq!(Message::decode(&b).unwrap(), m);
    }

    #[test]
    fn reply_round_trips(nonce in any::<u64>(), params in (1usize..=16).prop_flat_map(arb_params)) {
        let m = Message::Reply(Reply { nonce, params, tag: [nonce as u8; wire::TAG_LEN] });
        prop_assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
    }

    #[test]
    fn reject_round_trips(reason in ".{0,300}") {
        let m = Message::Reject(reason);
        prop_assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
    }

    #[test]
    fn refuse_round_trips(reason in ".{0,300}", t in any::<u8>()) {
        let m = Message::Refuse(wire::Refuse { reason, tag: [t; wire::TAG_LEN] });
        prop_assert_eq!(Message::decode(&m.encode().unwrap()).unwrap(), m);
    }
}

#[test]
fn largest_hello_fits_the_payload_bound() {
    let n = wire::MAX_PATHS;
    let paths = (0..n)
        .map(|i| PathRequest {
            connector: "10.0.0.1/30".parse().unwrap(),
            acceptor: format!("10.0.0.{i}").parse().unwrap(),
            kind: LinkKind::Roce,
            relayed: false,
        })
        .collect();
    let params = SideParams {
        paths: (0..n)
            .map(|i| pp(i as u32, wire::MAX_QPS_PER_PATH))
            .collect(),
        extra: vec![0; wire::MAX_EXTRA],
    };
    let b = Message::Hello(Hello {
        nonce: 1,
        paths,
        params,
        tag: [0xa5; wire::TAG_LEN],
    })
    .encode()
    .unwrap();
    assert!(
        b.len() <= wire::HEADER_LEN + wire::MAX_PAYLOAD,
        "{} bytes",
        b.len()
    );
}

#[test]
fn specific_malformed_frames_name_the_problem() {
    let hello = seeds()[0].clone();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (hello[..5].to_vec(), "needs 12"),
        (
            {
                let mut b = hello.clone();
                b[5] = 9;
                b
            },
            "message type 9",
        ),
        (
            {
                let mut b = hello.clone();
                b[0] = b'X';
                b
            },
            "not a switchless connector",
        ),
        (
            {
                let mut b = hello.clone();
                b[4] = 9;
                b
            },
            "version 9, this plugin speaks version 2",
        ),
        (
            {
                let mut b = hello.clone();
                b[wire::field::LEN].copy_from_slice(&u32::MAX.to_be_bytes());
                b
            },
            "payload length 4294967295 bytes, at most 8192",
        ),
        (
            {
                let mut b = hello.clone();
                b[6] = 1;
                b
            },
            "reserved header bytes",
        ),
        (
            {
                let mut b = hello.clone();
                b.push(0);
                b
            },
            "header says",
        ),
        (
            {
                let mut b = hello.clone();
                b[wire::HEADER_LEN + 8] = 0;
                b
            },
            "0 paths",
        ),
        (
            {
                let mut b = hello.clone();
                b[wire::HEADER_LEN + 8] = 17;
                b
            },
            "path count is 17, at most 16",
        ),
        (
            {
                let mut b = hello.clone();
                b[wire::HEADER_LEN + 9 + 4] = 33;
                b
            },
            "prefix length 33",
        ),
        (
            {
                let mut b = hello.clone();
                b[wire::HEADER_LEN + 9 + 9] = 4;
                b
            },
            "kind 4, accepted 0 (RoCE), 1 (TCP), 2 (TCP through a relay) or 3 (RoCE through a \
             relay)",
        ),
        (
            {
                let mut b = hello.clone();
                b[wire::HEADER_LEN + 9 + 10] = 33;
                b
            },
            "QP count of path 0 is 33, at most 32",
        ),
        (
            {
                let mut b = hello.clone();
                b[wire::HEADER_LEN + 9 + 11] = 1;
                b
            },
            "exceeds 24 bits",
        ),
    ];
    for (b, needle) in cases {
        let e = Message::decode(&b).unwrap_err().to_string();
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
}

/// The fuzz target's oracle for rejects: a reason of invalid UTF-8 is repaired (each bad byte becomes
/// U+FFFD, 3 bytes), so re-encoding truncates it to a prefix on a character boundary, which is then
/// stable.
#[test]
fn a_reject_of_bad_utf8_reencodes_to_a_stable_prefix() {
    let n = wire::MAX_REASON;
    let mut f = vec![0u8; wire::HEADER_LEN];
    wire::HeaderRepr {
        msg_type: wire::MsgType::Reject,
        payload_len: 2 + n,
    }
    .emit(&mut wire::Header::new_unchecked(&mut f[..]))
    .unwrap();
    f.extend_from_slice(&(n as u16).to_be_bytes());
    f.extend(std::iter::repeat_n(0xffu8, n));
    let m = Message::decode(&f).unwrap();
    let Message::Reject(r) = &m else {
        panic!("{m:?}")
    };
    assert_eq!(r.len(), 3 * n);
    let again = Message::decode(&m.encode().unwrap()).unwrap();
    let Message::Reject(r2) = &again else {
        panic!("{again:?}")
    };
    assert!(r.starts_with(r2.as_str()));
    assert_eq!(r2.len(), n / 3 * 3);
    assert_eq!(Message::decode(&again.encode().unwrap()).unwrap(), again);
}

/// The cargo-fuzz seed files stay valid as the formats evolve.
#[test]
fn fuzz_seed_files_decode() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let mut n = 0;
    for entry in std::fs::read_dir(dir.join("handshake_decode")).unwrap() {
        let b = std::fs::read(entry.unwrap().path()).unwrap();
        let m = Message::decode(&b).unwrap();
        assert_eq!(m.encode().unwrap(), b);
        n += 1;
    }
    for entry in std::fs::read_dir(dir.join("handle_decode")).unwrap() {
        let b = std::fs::read(entry.unwrap().path()).unwrap();
        let h = switchless::route::HandleRepr::from_bytes(&b).unwrap();
        assert_eq!(&h.to_bytes().unwrap()[..], &b[..]);
        n += 1;
    }
    assert_eq!(n, 6);
}
