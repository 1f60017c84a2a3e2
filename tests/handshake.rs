//! Handshake state machines over real TCP sockets on 127.0.0.1, single-threaded: every step is a
//! non-blocking poll, as NCCL drives it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use switchless::error::Error;
use switchless::route::types::{KernelRoute, LinkKind, LocalLink, RemoteLink};
use switchless::route::{HandleRepr, PathChoice};
use switchless::transport::handshake::{
    AcceptPoll, AcceptorView, ConnectPoll, Connector, Established, Incoming, Listener, Message,
    PathParams, PathRequest, SideParams, wire,
};

const LO: Ipv4Addr = Ipv4Addr::LOCALHOST;
const T: Duration = Duration::from_secs(10);

fn lo_link() -> LocalLink {
    LocalLink {
        id: 0,
        kind: LinkKind::Roce,
        netdev: "lo".into(),
        rdma_dev: Some("rxe_lo".into()),
        port: 1,
        addr: "127.0.0.1/8".parse().unwrap(),
        gid_index: Some(1),
        pci_root: "virtual".into(),
        phys_port_id: 0,
        nccl_dev: Some(0),
        speed_mbps: 10_000,
        mtu: 65536,
        active_mtu: 4096,
        up: true,
    }
}

fn view() -> AcceptorView {
    AcceptorView {
        links: vec![lo_link()],
        routes: vec![KernelRoute {
            dest: "127.0.0.0/8".parse().unwrap(),
            gateway: None,
            ifname: "lo".into(),
            metric: 0,
        }],
        ..AcceptorView::default()
    }
}

fn listener(timeout: Duration) -> Listener {
    Listener::bind(
        SocketAddrV4::new(LO, 0),
        switchless::route::handle::random_nonce().unwrap(),
        view(),
        timeout,
    )
    .unwrap()
}

fn handle_of(l: &Listener) -> HandleRepr {
    let (h, left_out) = l.handle(None).unwrap();
    assert!(left_out.is_empty());
    assert_eq!(h.nonce, l.nonce());
    assert_eq!(h.port, l.local_addr().unwrap().port());
    assert_eq!(
        h.links,
        vec![RemoteLink {
            addr: "127.0.0.1/8".parse().unwrap(),
            phys_port_id: 0,
            pci_root_id: 0,
            kind: LinkKind::Roce
        }]
    );
    h
}

fn paths_to(h: &HandleRepr) -> Vec<PathChoice> {
    vec![PathChoice {
        local: lo_link(),
        remote: h.links[0],
        kind: LinkKind::Roce,
        reason: "test".into(),
        via: None,
    }]
}

fn params(tag: u32, npaths: usize) -> SideParams {
    SideParams {
        paths: (0..npaths)
            .map(|i| PathParams {
                qpns: vec![tag * 100 + i as u32, tag * 100 + 50 + i as u32],
                psn: 0x12_3456,
                gid: [tag as u8; 16],
                gid_index: 3,
                mtu: 4096,
                rkey: 0xdead_0000 + tag,
                addr: 0x7fff_0000_0000 + u64::from(tag),
            })
            .collect(),
        extra: vec![tag as u8; 40],
    }
}

/// Polls `f` until it returns Some, failing after 10 s.
fn until<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(Instant::now() < end, "no progress within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn next_incoming(l: &mut Listener, c: &mut [&mut Connector]) -> Incoming {
    until(|| {
        for x in c.iter_mut() {
            assert!(matches!(x.poll().unwrap(), ConnectPoll::Pending));
        }
        l.poll().unwrap()
    })
}

/// Completes both sides once the acceptor has responded.
fn finish(
    c: &mut Connector,
    inc: &mut Incoming,
    expect_reply: &SideParams,
) -> (Established, Established) {
    let reply = until(|| match c.poll().unwrap() {
        ConnectPoll::Reply(p) => Some(p),
        ConnectPoll::Pending => {
            assert!(matches!(inc.poll().unwrap(), AcceptPoll::Pending));
            None
        }
        ConnectPoll::Done(_) => panic!("done before ready"),
    });
    assert_eq!(&reply, expect_reply);
    // Until ready() the acceptor must not complete.
    for _ in 0..20 {
        assert!(matches!(inc.poll().unwrap(), AcceptPoll::Pending));
        assert!(matches!(c.poll().unwrap(), ConnectPoll::Pending));
    }
    c.ready().unwrap();
    let mut ce = None;
    let mut ae = None;
    until(|| {
        if ce.is_none() {
            if let ConnectPoll::Done(e) = c.poll().unwrap() {
                ce = Some(e);
            }
        }
        if ae.is_none() {
            if let AcceptPoll::Done(e) = inc.poll().unwrap() {
                ae = Some(e);
            }
        }
        (ce.is_some() && ae.is_some()).then_some(())
    });
    (ce.unwrap(), ae.unwrap())
}

#[test]
fn happy_path_and_socket_kept_for_oob() {
    let mut l = listener(T);
    let h = handle_of(&l);
    // Through the real 128-byte encoding, as NCCL carries it.
    let h = HandleRepr::from_bytes(&h.to_bytes().unwrap()).unwrap();
    let mine = params(1, 1);
    let mut c = Connector::start(&h, &paths_to(&h), mine.clone(), T).unwrap();
    // ready() before the reply is a usage error that leaves the handshake intact.
    assert!(matches!(c.ready(), Err(Error::Internal(_))));
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    assert_eq!(inc.hello().params, mine);
    assert_eq!(inc.hello().nonce, h.nonce);
    assert_eq!(inc.paths().len(), 1);
    assert_eq!(inc.paths()[0].local.netdev, "lo");
    assert_eq!(inc.paths()[0].peer_params, mine.paths[0]);
    assert_eq!(
        inc.paths()[0].request,
        PathRequest {
            connector: "127.0.0.1/8".parse().unwrap(),
            acceptor: LO,
            kind: LinkKind::Roce
        }
    );
    // Responding twice is refused.
    let theirs = params(2, 1);
    inc.respond(theirs.clone()).unwrap();
    assert!(inc.respond(theirs.clone()).is_err());
    let (mut ce, mut ae) = finish(&mut c, &mut inc, &theirs);
    assert_eq!(ce.peer, ae.local);
    assert_eq!(ce.local, ae.peer);
    // The sockets are connected and nothing beyond the handshake was consumed.
    ce.stream.set_nonblocking(false).unwrap();
    ae.stream.set_nonblocking(false).unwrap();
    ce.stream.write_all(b"oob-1").unwrap();
    let mut b = [0u8; 5];
    ae.stream.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"oob-1");
    ae.stream.write_all(b"oob-2").unwrap();
    ce.stream.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"oob-2");
    // Polling a finished connector is an error, not a hang or panic.
    assert!(c.poll().is_err());
}

#[test]
fn bytes_sent_right_after_ready_are_not_swallowed() {
    let mut l = listener(T);
    let h = handle_of(&l);
    let mut c = Connector::start(&h, &paths_to(&h), params(1, 1), T).unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    inc.respond(params(2, 1)).unwrap();
    until(|| {
        let _ = inc.poll().unwrap();
        matches!(c.poll().unwrap(), ConnectPoll::Reply(_)).then_some(())
    });
    c.ready().unwrap();
    let mut ce = until(|| match c.poll().unwrap() {
        ConnectPoll::Done(e) => Some(e),
        _ => None,
    });
    ce.stream.write_all(b"first data").unwrap();
    let mut ae = until(|| match inc.poll().unwrap() {
        AcceptPoll::Done(e) => Some(e),
        AcceptPoll::Pending => None,
    });
    ae.stream.set_nonblocking(false).unwrap();
    let mut b = [0u8; 10];
    ae.stream.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"first data");
}

#[test]
fn several_connections_any_order() {
    let mut l = listener(T);
    let h = handle_of(&l);
    let mut cs: Vec<Connector> = (1..=4)
        .map(|tag| Connector::start(&h, &paths_to(&h), params(tag, 1), T).unwrap())
        .collect();
    let mut incs = Vec::new();
    while incs.len() < 4 {
        let mut refs: Vec<&mut Connector> = cs.iter_mut().collect();
        incs.push(next_incoming(&mut l, &mut refs));
    }
    // Answer in reverse order of arrival; each acceptor answers with tag+10 of its connector's tag.
    incs.reverse();
    for inc in incs.iter_mut() {
        let tag = inc.hello().params.paths[0].rkey - 0xdead_0000;
        inc.respond(params(tag + 10, 1)).unwrap();
    }
    for (i, c) in cs.iter_mut().enumerate() {
        let tag = i as u32 + 1;
        let inc = incs
            .iter_mut()
            .find(|x| x.hello().params.paths[0].rkey == 0xdead_0000 + tag)
            .unwrap();
        finish(c, inc, &params(tag + 10, 1));
    }
    assert_eq!(l.pending(), 0);
}

fn frame(ty: u8, version: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = b"SWHS".to_vec();
    f.push(version);
    f.push(ty);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn garbage_clients_are_dropped_and_a_good_client_still_succeeds() {
    let mut l = listener(T);
    let h = handle_of(&l);
    let port = l.local_addr().unwrap().port();
    let addr = SocketAddrV4::new(LO, port);
    let good_hello = Message::Hello(switchless::transport::handshake::Hello {
        nonce: h.nonce,
        paths: vec![PathRequest {
            connector: "127.0.0.1/8".parse().unwrap(),
            acceptor: LO,
            kind: LinkKind::Roce,
        }],
        params: params(1, 1),
    })
    .encode()
    .unwrap();
    let mut wrong_nonce = good_hello.clone();
    wrong_nonce[wire::HEADER_LEN] ^= 0xff;
    let mut wrong_magic = good_hello.clone();
    wrong_magic[0] = b'X';
    let mut wrong_version = good_hello.clone();
    wrong_version[4] = 9;
    let mut random = vec![0u8; 300];
    for (i, b) in random.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(97).wrapping_add(13);
    }
    let oversized = {
        let mut f = frame(1, 1, &[]);
        f[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        f
    };
    let truncated = good_hello[..good_hello.len() - 5].to_vec();
    let ready_first = frame(4, 1, &[]);
    let bad_len_inside = {
        // A hello whose path count says 16 but carries one path.
        let mut f = good_hello.clone();
        f[wire::HEADER_LEN + 8] = 16;
        f
    };
    // A hello asking for an acceptor address this node does not have.
    let wrong_addr = Message::Hello(switchless::transport::handshake::Hello {
        nonce: h.nonce,
        paths: vec![PathRequest {
            connector: "127.0.0.1/8".parse().unwrap(),
            acceptor: "127.0.0.2".parse().unwrap(),
            kind: LinkKind::Roce,
        }],
        params: params(1, 1),
    })
    .encode()
    .unwrap();

    let mut clients = Vec::new();
    let mut rejected = Vec::new();
    for bytes in [
        &wrong_magic,
        &wrong_version,
        &random,
        &oversized,
        &ready_first,
        &bad_len_inside,
    ] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(bytes).unwrap();
        clients.push(s);
    }
    for bytes in [&wrong_nonce, &wrong_addr] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(bytes).unwrap();
        rejected.push(s);
    }
    // Sends part of a hello then vanishes; another connects and says nothing.
    {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&truncated).unwrap();
    }
    let _silent = TcpStream::connect(addr).unwrap();

    // Let the listener see all of them before the good client arrives.
    until(|| {
        assert!(l.poll().unwrap().is_none());
        (l.pending() <= 3).then_some(())
    });
    let mut c = Connector::start(&h, &paths_to(&h), params(7, 1), T).unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    assert_eq!(inc.hello().params, params(7, 1));
    inc.respond(params(8, 1)).unwrap();
    finish(&mut c, &mut inc, &params(8, 1));

    // The dropped clients see EOF; the rejected ones get a reason first.
    for mut s in clients {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
        assert!(b.is_empty(), "garbage client got {b:?}");
    }
    let mut reasons = Vec::new();
    for mut s in rejected {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = Vec::new();
        s.read_to_end(&mut b).unwrap();
        match Message::decode(&b).unwrap() {
            Message::Reject(r) => reasons.push(r),
            m => panic!("expected a reject, got {m:?}"),
        }
    }
    assert!(reasons[0].contains("nonce"), "{}", reasons[0]);
    assert!(
        reasons[1].contains("127.0.0.2 is not an address of the acceptor's links"),
        "{}",
        reasons[1]
    );
    // Only the silent client remains.
    assert_eq!(l.pending(), 1);
}

#[test]
fn rejected_connector_fails_with_the_acceptors_reason() {
    let mut l = listener(T);
    let h = handle_of(&l);
    let req = PathRequest {
        connector: "127.0.0.1/8".parse().unwrap(),
        acceptor: "127.0.0.3".parse().unwrap(),
        kind: LinkKind::Roce,
    };
    let mut c = Connector::start_to(
        vec![(SocketAddrV4::new(LO, h.port), None)],
        h.nonce,
        vec![req],
        params(1, 1),
        T,
        "test peer".into(),
    )
    .unwrap();
    let e = until(|| {
        assert!(l.poll().unwrap().is_none());
        match c.poll() {
            Ok(ConnectPoll::Pending) => None,
            Ok(other) => panic!("{other:?}"),
            Err(e) => Some(e),
        }
    });
    assert!(matches!(e, Error::Remote(_)), "{e}");
    let t = e.to_string();
    assert!(
        t.contains("test peer rejected the connection") && t.contains("127.0.0.3"),
        "{t}"
    );

    // The acceptor's own refusal (e.g. QP creation failed) reaches the connector too.
    let mut c = Connector::start(&h, &paths_to(&h), params(1, 1), T).unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    inc.reject("cannot create QPs on rxe_lo: out of memory")
        .unwrap();
    let ie = until(|| match inc.poll() {
        Ok(AcceptPoll::Pending) => None,
        Ok(AcceptPoll::Done(_)) => panic!("done after reject"),
        Err(e) => Some(e),
    });
    assert!(ie.to_string().contains("refused the connection"), "{ie}");
    let e = until(|| match c.poll() {
        Ok(ConnectPoll::Pending) => None,
        Ok(other) => panic!("{other:?}"),
        Err(e) => Some(e),
    });
    assert!(e.to_string().contains("out of memory"), "{e}");
}

#[test]
fn acceptor_that_vanishes_mid_handshake_fails_the_connector() {
    let raw = TcpListener::bind((LO, 0)).unwrap();
    let port = raw.local_addr().unwrap().port();
    let mut h = handle_of(&listener(T));
    h.port = port;
    let mut c = Connector::start(&h, &paths_to(&h), params(1, 1), T).unwrap();
    let (mut s, _) = raw.accept().unwrap();
    let mut head = [0u8; wire::HEADER_LEN];
    // Wait for the hello header, then vanish.
    until(|| {
        assert!(matches!(c.poll().unwrap(), ConnectPoll::Pending));
        s.set_nonblocking(true).unwrap();
        s.read_exact(&mut head).ok()
    });
    assert_eq!(&head[..4], b"SWHS");
    drop(s);
    let e = until(|| c.poll().err());
    assert!(matches!(e, Error::Remote(_) | Error::System(_)), "{e}");
    assert!(
        e.to_string().contains("waiting for the acceptor's reply"),
        "{e}"
    );
}

#[test]
fn connector_that_vanishes_fails_the_acceptor() {
    let mut l = listener(T);
    let h = handle_of(&l);
    let mut c = Connector::start(&h, &paths_to(&h), params(1, 1), T).unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    drop(c);
    inc.respond(params(2, 1)).unwrap();
    let e = until(|| match inc.poll() {
        Ok(AcceptPoll::Pending) => None,
        Ok(AcceptPoll::Done(_)) => panic!("done without a connector"),
        Err(e) => Some(e),
    });
    assert!(e.to_string().contains("connector 127.0.0.1"), "{e}");
}

#[test]
fn deadlines() {
    // An acceptor that accepts and never answers.
    let raw = TcpListener::bind((LO, 0)).unwrap();
    let mut h = handle_of(&listener(T));
    h.port = raw.local_addr().unwrap().port();
    let mut c =
        Connector::start(&h, &paths_to(&h), params(1, 1), Duration::from_millis(300)).unwrap();
    let t0 = Instant::now();
    let e = until(|| c.poll().err());
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(
        e.to_string().contains("waiting for the acceptor's reply")
            && e.to_string().contains("127.0.0.1"),
        "{e}"
    );
    drop(raw);

    // A listener nobody connects to.
    let mut l = listener(Duration::from_millis(200));
    let e = until(|| l.poll().err());
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(
        e.to_string()
            .contains("no valid connection reached listening port"),
        "{e}"
    );

    // A connector whose acceptor never sends ready... i.e. an acceptor waiting for ready.
    let mut l = listener(Duration::from_millis(300));
    let h = handle_of(&l);
    let mut c = Connector::start(&h, &paths_to(&h), params(1, 1), T).unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    inc.respond(params(2, 1)).unwrap();
    // The connector gets the reply but never calls ready().
    until(|| {
        let _ = inc.poll().unwrap();
        matches!(c.poll().unwrap(), ConnectPoll::Reply(_)).then_some(())
    });
    let e = until(|| inc.poll().err());
    assert!(
        matches!(e, Error::Timeout(_)) && e.to_string().contains("waiting for its ready message"),
        "{e}"
    );
}

#[test]
fn refused_target_falls_back_to_the_next_and_all_refused_is_an_error() {
    let closed = TcpListener::bind((LO, 0)).unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut l = listener(T);
    let h = handle_of(&l);
    let req = PathRequest {
        connector: "127.0.0.1/8".parse().unwrap(),
        acceptor: LO,
        kind: LinkKind::Roce,
    };
    let mut c = Connector::start_to(
        vec![
            (SocketAddrV4::new(LO, closed_port), Some(LO)),
            (SocketAddrV4::new(LO, h.port), None),
        ],
        h.nonce,
        vec![req],
        params(1, 1),
        T,
        "peer".into(),
    )
    .unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    inc.respond(params(2, 1)).unwrap();
    finish(&mut c, &mut inc, &params(2, 1));

    let mut c = Connector::start_to(
        vec![(SocketAddrV4::new(LO, closed_port), None)],
        1,
        vec![req],
        params(1, 1),
        T,
        "peer X".into(),
    )
    .unwrap();
    let e = until(|| c.poll().err());
    assert!(matches!(e, Error::System(_)), "{e}");
    assert!(
        e.to_string()
            .contains("cannot open a TCP connection to peer X"),
        "{e}"
    );
}

#[test]
fn bad_params_are_refused_before_anything_is_sent() {
    let h = HandleRepr {
        nonce: 1,
        port: 9,
        control: None,
        links: vec![],
    };
    // No paths.
    assert!(Connector::start(&h, &[], params(1, 0), T).is_err());
    // Params for 2 paths but 1 path requested.
    let mut h2 = h.clone();
    h2.links.push(RemoteLink {
        addr: "127.0.0.1/8".parse().unwrap(),
        phys_port_id: 0,
        pci_root_id: 0,
        kind: LinkKind::Roce,
    });
    let e = Connector::start(&h2, &paths_to(&h2), params(1, 2), T).unwrap_err();
    assert!(e.to_string().contains("1 paths but 2 path params"), "{e}");
    // Oversized extra.
    let mut p = params(1, 1);
    p.extra = vec![0; wire::MAX_EXTRA + 1];
    assert!(
        Connector::start(&h2, &paths_to(&h2), p, T)
            .unwrap_err()
            .to_string()
            .contains("at most 1024")
    );
}

/// Measurement, not a check: `cargo test --release --test handshake -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_loopback_handshake_time() {
    let mut l = listener(T);
    let h = handle_of(&l);
    let n = 500;
    let t0 = Instant::now();
    for i in 0..n {
        let mut c = Connector::start(&h, &paths_to(&h), params(1, 1), T).unwrap();
        let mut inc = loop {
            let _ = c.poll().unwrap();
            if let Some(x) = l.poll().unwrap() {
                break x;
            }
        };
        inc.respond(params(2, 1)).unwrap();
        loop {
            let _ = inc.poll().unwrap();
            if let ConnectPoll::Reply(_) = c.poll().unwrap() {
                break;
            }
        }
        c.ready().unwrap();
        let mut done = (false, false);
        while done != (true, true) {
            if !done.0 {
                done.0 = matches!(c.poll().unwrap(), ConnectPoll::Done(_));
            }
            if !done.1 {
                done.1 = matches!(inc.poll().unwrap(), AcceptPoll::Done(_));
            }
        }
        let _ = i;
    }
    let per = t0.elapsed() / n;
    println!(
        "loopback handshake (connect, hello, reply, ready), busy-polled: {} us each over {n}",
        per.as_micros()
    );
}

#[test]
fn a_flood_of_silent_clients_does_not_lock_out_a_real_connector() {
    use switchless::transport::handshake::MAX_PENDING;
    let mut l = listener(T);
    let h = handle_of(&l);
    let addr = SocketAddrV4::new(LO, h.port);
    let silent: Vec<TcpStream> = (0..MAX_PENDING + 8)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    until(|| {
        assert!(l.poll().unwrap().is_none());
        (l.pending() == MAX_PENDING).then_some(())
    });
    // Give the kernel time to queue every silent connection, then check the cap holds.
    std::thread::sleep(Duration::from_millis(50));
    assert!(l.poll().unwrap().is_none());
    assert_eq!(l.pending(), MAX_PENDING);
    let mut c = Connector::start(&h, &paths_to(&h), params(3, 1), T).unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    inc.respond(params(4, 1)).unwrap();
    finish(&mut c, &mut inc, &params(4, 1));
    drop(silent);
}

#[test]
fn several_paths_keep_their_order_and_each_is_checked() {
    let mut l = listener(T);
    let h = handle_of(&l);
    let mut paths = paths_to(&h);
    paths.push(paths[0].clone());
    paths.push(paths[0].clone());
    let mine = params(5, 3);
    let mut c = Connector::start(&h, &paths, mine.clone(), T).unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    assert_eq!(inc.paths().len(), 3);
    for (i, p) in inc.paths().iter().enumerate() {
        assert_eq!(p.peer_params, mine.paths[i]);
    }
    // A reply for the wrong number of paths is refused locally.
    assert!(inc.respond(params(6, 2)).is_err());
    inc.respond(params(6, 3)).unwrap();
    finish(&mut c, &mut inc, &params(6, 3));

    // The third path names an address the acceptor does not have: rejected, naming path 2.
    let reqs = vec![
        PathRequest {
            connector: "127.0.0.1/8".parse().unwrap(),
            acceptor: LO,
            kind: LinkKind::Roce,
        },
        PathRequest {
            connector: "127.0.0.1/8".parse().unwrap(),
            acceptor: LO,
            kind: LinkKind::Roce,
        },
        PathRequest {
            connector: "127.0.0.1/8".parse().unwrap(),
            acceptor: "127.0.0.9".parse().unwrap(),
            kind: LinkKind::Roce,
        },
    ];
    let mut c = Connector::start_to(
        vec![(SocketAddrV4::new(LO, h.port), None)],
        h.nonce,
        reqs,
        params(5, 3),
        T,
        "p".into(),
    )
    .unwrap();
    let e = until(|| {
        assert!(l.poll().unwrap().is_none());
        c.poll().err()
    });
    assert!(
        e.to_string().contains("path 2 (127.0.0.1 -> 127.0.0.9)"),
        "{e}"
    );
}

#[test]
fn a_target_that_drops_syns_gives_way_to_the_next_one() {
    // A listener whose accept queue is full drops new SYNs (Linux, tcp_abort_on_overflow=0): a
    // connect to it neither completes nor fails. Fill one and keep the connections open.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddrV4::new(LO, 0).into()).unwrap();
    sock.listen(0).unwrap();
    let full: TcpListener = sock.into();
    let full_port = full.local_addr().unwrap().port();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&SocketAddrV4::new(LO, full_port).into());
        fillers.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));

    let mut l = listener(Duration::from_secs(20));
    let h = handle_of(&l);
    let req = PathRequest {
        connector: "127.0.0.1/8".parse().unwrap(),
        acceptor: LO,
        kind: LinkKind::Roce,
    };
    // A 4 s timeout: the first target gets half of it, then the control address answers.
    let t = Instant::now();
    let mut c = Connector::start_to(
        vec![
            (SocketAddrV4::new(LO, full_port), None),
            (SocketAddrV4::new(LO, h.port), None),
        ],
        h.nonce,
        vec![req],
        params(1, 1),
        Duration::from_secs(4),
        "peer".into(),
    )
    .unwrap();
    let mut inc = next_incoming(&mut l, &mut [&mut c]);
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_millis(3900),
        "the second target was tried after {waited:?}"
    );
    inc.respond(params(2, 1)).unwrap();
    finish(&mut c, &mut inc, &params(2, 1));
    drop(fillers);
}
