//! Relay paths over real sockets on 127/8 (every address of it is this host's): a connector A on
//! 127.0.1.1/30, a relay host K on 127.0.1.2/30 and 127.0.2.1/30, a peer B on 127.0.2.2/30, and a
//! direct cable A–B on 127.0.3.0/30 where a test wants one (each test on addresses of its own;
//! chains of two relays, A–K1–K2–B, on three /30s in a line). K runs the relay service
//! (`transport::relay`); A probes it, then opens the path's streams through it; B accepts them
//! from K's address as any path's. The data is verified byte for byte; a relayed write completes
//! only on B's acknowledgement; a relay that dies costs its path, not a message, and no write lands
//! in a receive buffer after its receive completed (two peers sharing one receive pool).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchless::sys::HostBuffer;
use switchless::transport::comm::{
    FailoverConfig, ProtocolConfig, RecvBuf, RecvComm, Request, SendComm, WeightConfig,
    connect_pair,
};
use switchless::transport::fabric::{Fabric, MemKind};
use switchless::transport::handshake::auth::ConnSecret;
use switchless::transport::relay::{
    Bounds, CommKey, Hop, LinkList, ListState, Probe, ProbeState, RelayDialer, RelayLink,
    RelayService, RelayStats, ServiceConfig,
};
use switchless::transport::tcp::{
    RelayVia, TcpAcceptor, TcpConfig, TcpConnector, TcpFabric, TcpPathSpec, listen,
};

/// Bounds every loop: a hang fails here, not by a test timeout.
const DEADLINE: Duration = Duration::from_secs(60);

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn link(addr: &str) -> RelayLink {
    RelayLink {
        addr: addr.parse().unwrap(),
        netdev: "lo".into(),
        speed_mbps: 10_000,
    }
}

/// A relay host with links `addrs` serving communicator `comm` on `port`.
fn relay_host(port: u16, addrs: &[&str], comm: u64, bounds: Bounds) -> RelayService {
    relay_named("k", port, addrs, comm, bounds)
}

/// … named `host`.
fn relay_named(host: &str, port: u16, addrs: &[&str], comm: u64, bounds: Bounds) -> RelayService {
    let cfg = ServiceConfig {
        links: addrs.iter().map(|a| link(a)).collect(),
        bounds,
        tcp: TcpConfig::default(),
        host: host.into(),
        link_down: None,
        verbs: None,
    };
    let s = RelayService::start(port, cfg)
        .unwrap()
        .expect("the port is free");
    s.add_comm(comm).unwrap();
    s
}

/// Asks the relay at `relay` (from `local`) which of `targets` it reaches.
fn probe(local: &str, relay: SocketAddr, comm: u64, targets: &[&str]) -> ProbeState {
    finish(Probe::start(
        ip(local),
        relay,
        CommKey::new(comm),
        targets.iter().map(|t| ip(t)).collect(),
    ))
}

/// Asks, through the relay at `relay`, the second relay at `next` which of `targets` it reaches.
fn probe_chained(
    local: &str,
    relay: SocketAddr,
    next: &str,
    comm: u64,
    targets: &[&str],
) -> ProbeState {
    finish(Probe::start_chained(
        ip(local),
        relay,
        ip(next),
        CommKey::new(comm),
        targets.iter().map(|t| ip(t)).collect(),
    ))
}

fn finish(mut p: Probe) -> ProbeState {
    let t = Instant::now();
    loop {
        match p.poll() {
            ProbeState::Pending => assert!(t.elapsed() < DEADLINE, "the probe never ended"),
            s => return s.clone(),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn pcfg() -> ProtocolConfig {
    ProtocolConfig {
        failover: FailoverConfig {
            backoff: Duration::from_millis(20),
            probe_interval: Duration::from_millis(200),
            ..FailoverConfig::default()
        },
        weights: WeightConfig {
            adaptive: false,
            ..WeightConfig::default()
        },
        ..ProtocolConfig::default()
    }
}

/// One path of a test connection: A's and B's addresses, and the relay it goes through.
struct PathDef {
    a: &'static str,
    b: &'static str,
    /// The relay's door and its address on B's link.
    via: Option<(SocketAddr, &'static str)>,
}

/// Connects A to B over `paths` (the relayed ones through their relays, as communicator `comm`);
/// returns (connector, acceptor).
fn connect(paths: &[PathDef], comm: u64, streams: usize) -> (TcpFabric, TcpFabric) {
    connect_chained(paths, &vec![None; paths.len()], comm, streams)
}

/// … where `next[i]` names path `i`'s second relay (its address on the first relay's link, host
/// `k2`): a chain A → K → K2 → B, `via` naming K's door and K2's address on B's link.
fn connect_chained(
    paths: &[PathDef],
    next: &[Option<&str>],
    comm: u64,
    streams: usize,
) -> (TcpFabric, TcpFabric) {
    let (c, a) = start_chained(paths, next, comm, streams);
    set_up(c, a)
}

/// Starts both ends of [`connect_chained`]'s connection (the connector's streams are dialing)
/// without polling them.
fn start_chained(
    paths: &[PathDef],
    next: &[Option<&str>],
    comm: u64,
    streams: usize,
) -> (TcpConnector, TcpAcceptor) {
    let tcfg = TcpConfig {
        streams: Some(streams),
        connect_timeout: Some(Duration::from_secs(20)),
        ..TcpConfig::default()
    };
    let b_ip = |p: &PathDef| IpAddr::V4(ip(p.b));
    let listeners: Vec<_> = paths
        .iter()
        .map(|p| listen(b_ip(p), 10_000, &tcfg).unwrap())
        .collect();
    let mut cs = Vec::new();
    let mut acs = Vec::new();
    for ((p, l), next) in paths.iter().zip(&listeners).zip(next) {
        let (relay_c, relay_a, from) = match p.via {
            Some((door, k_on_b)) => {
                let found = switchless::transport::relay::Found {
                    local: ip(p.a),
                    relay: door,
                    target: ip(p.b),
                    via: ip(k_on_b),
                    speed_mbps: 10_000,
                    host: "k".into(),
                    next: next.map(|n| Hop {
                        addr: ip(n),
                        host: "k2".into(),
                    }),
                };
                let d = Arc::new(RelayDialer::new(&found, CommKey::new(comm)));
                (
                    Some(RelayVia {
                        name: found.name(),
                        chained: found.next.is_some(),
                        dialer: Some(d),
                    }),
                    Some(RelayVia {
                        name: found.name(),
                        chained: found.next.is_some(),
                        dialer: None,
                    }),
                    k_on_b,
                )
            }
            None => (None, None, p.a),
        };
        cs.push(TcpPathSpec {
            local: IpAddr::V4(ip(p.a)),
            remote: l.local_addr().unwrap(),
            speed_mbps: 10_000,
            mtu: 0,
            label: String::new(),
            relay: relay_c,
        });
        acs.push(TcpPathSpec {
            local: b_ip(p),
            remote: SocketAddr::new(IpAddr::V4(ip(from)), 0),
            speed_mbps: 10_000,
            mtu: 0,
            label: String::new(),
            relay: relay_a,
        });
    }
    let secret = ConnSecret::from_bytes([0x42; 32]);
    let c = TcpConnector::start(&cs, &secret, &tcfg).unwrap();
    let a = TcpAcceptor::new(&listeners, &acs, &secret, &tcfg).unwrap();
    (c, a)
}

/// Polls both ends until the connection is set up; returns (connector, acceptor).
fn set_up(mut c: TcpConnector, mut a: TcpAcceptor) -> (TcpFabric, TcpFabric) {
    let (mut fc, mut fa) = (None, None);
    let t = Instant::now();
    while fc.is_none() || fa.is_none() {
        assert!(t.elapsed() < DEADLINE, "set-up never finished");
        if fc.is_none() {
            fc = c.poll().unwrap();
        }
        if fa.is_none() {
            fa = a.poll().unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (fc.unwrap(), fa.unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Sends `sizes` one after another, `window` in flight, checking every byte; `at(m)` runs before
/// message `m` is posted.
fn stream(
    s: &mut SendComm<TcpFabric>,
    r: &mut RecvComm<TcpFabric>,
    sizes: &[usize],
    mut at: impl FnMut(usize),
) {
    let window = 4;
    let max = sizes.iter().copied().max().unwrap_or(1).max(1);
    let n = sizes.len();
    let mut src = HostBuffer::new(max * n).unwrap();
    for (m, &sz) in sizes.iter().enumerate() {
        src.write(m * max, &pattern(sz, m as u8)).unwrap();
    }
    let smh = s.reg_mr(&src.lend(), MemKind::Host).unwrap();
    let mut dst = HostBuffer::new(max * n).unwrap();
    dst.write(0, &vec![0xEE; max * n]).unwrap();
    let rmh = r.reg_mr(&dst.lend(), MemKind::Host).unwrap();
    let (mut rnext, mut snext, mut sent, mut got) = (0, 0, 0, 0);
    let mut rq: Vec<(usize, Request)> = Vec::new();
    let mut sq: Vec<Request> = Vec::new();
    let t = Instant::now();
    while sent < n || got < n {
        assert!(
            t.elapsed() < DEADLINE,
            "hang: {sent} of {n} sent, {got} received; paths up {:?} / {:?}",
            s.paths_up(),
            r.paths_up()
        );
        let now = Instant::now();
        while rnext < n && rq.len() < window {
            let b = RecvBuf {
                addr: dst.addr() + (rnext * max) as u64,
                size: max as u64,
                tag: 0,
                mh: &rmh,
            };
            match r.irecv(now, &[b]).unwrap() {
                Some(q) => {
                    rq.push((rnext, q));
                    rnext += 1;
                }
                None => break,
            }
        }
        while snext < n && sq.len() < window {
            at(snext);
            let addr = src.addr() + (snext * max) as u64;
            match s.isend(now, addr, sizes[snext] as u64, 0, &smh).unwrap() {
                Some(q) => {
                    sq.push(q);
                    snext += 1;
                }
                None => break,
            }
        }
        let mut k = 0;
        while k < rq.len() {
            if let Some(sz) = r.test(now, rq[k].1).unwrap() {
                assert_eq!(sz.as_slice(), &[sizes[rq[k].0] as u64]);
                rq.remove(k);
                got += 1;
            } else {
                k += 1;
            }
        }
        let mut k = 0;
        while k < sq.len() {
            if s.test(now, sq[k]).unwrap().is_some() {
                sq.remove(k);
                sent += 1;
            } else {
                k += 1;
            }
        }
        std::thread::yield_now();
    }
    for (m, &sz) in sizes.iter().enumerate() {
        assert!(
            dst.read(m * max, sz).unwrap() == pattern(sz, m as u8),
            "message {m} of {sz} bytes differs"
        );
    }
    s.dereg_mr(smh).unwrap();
    r.dereg_mr(rmh).unwrap();
}

const COMM: u64 = 0x5357_4c42_0000_0004;

#[test]
fn a_probe_finds_the_relay_that_reaches_the_peer_and_only_that() {
    let port = 24001;
    let k = relay_host(
        port,
        &["127.0.11.2/30", "127.0.12.1/30"],
        COMM,
        Bounds::default(),
    );
    let door = SocketAddr::from(([127, 0, 11, 2], port));
    // B advertises two addresses; the relay is cabled to one of them.
    match probe("127.0.11.1", door, COMM, &["127.0.13.2", "127.0.12.2"]) {
        ProbeState::Found(f) => {
            assert_eq!((f.target, f.via), (ip("127.0.12.2"), ip("127.0.12.1")));
            assert_eq!(f.local, ip("127.0.11.1"));
            assert_eq!(f.name(), "k (127.0.11.2)");
        }
        s => panic!("{s:?}"),
    }
    // A peer the relay is not cabled to, and a communicator it does not serve.
    let e = probe("127.0.11.1", door, COMM, &["127.0.13.2"]);
    assert!(
        matches!(&e, ProbeState::Failed(w) if w.contains("not at the far end")),
        "{e:?}"
    );
    let e = probe("127.0.11.1", door, 77, &["127.0.12.2"]);
    assert!(
        matches!(&e, ProbeState::Failed(w) if w.contains("serves no such communicator")),
        "{e:?}"
    );
    // Nothing listens: the probe retries, then gives up naming the relay.
    drop(k);
    let t = Instant::now();
    let e = probe("127.0.11.1", door, COMM, &["127.0.12.2"]);
    assert!(
        matches!(&e, ProbeState::Failed(w) if w.contains("nothing listens")),
        "{e:?}"
    );
    assert!(t.elapsed() >= Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn a_relayed_path_carries_verified_data_end_to_end() {
    let port = 24002;
    let k = relay_host(
        port,
        &["127.0.21.2/30", "127.0.22.1/30"],
        COMM,
        Bounds::default(),
    );
    let door = SocketAddr::from(([127, 0, 21, 2], port));
    let (a, b) = connect(
        &[PathDef {
            a: "127.0.21.1",
            b: "127.0.22.2",
            via: Some((door, "127.0.22.1")),
        }],
        COMM,
        3,
    );
    let label = a.paths()[0].label.clone();
    assert!(
        label.contains("127.0.22.2 via relay k (127.0.21.2)"),
        "{label}"
    );
    assert!(
        b.paths()[0].label.contains("relay k"),
        "{}",
        b.paths()[0].label
    );
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    let sizes = [0, 1, 4096, 65_537, 1 << 20, (3 << 20) + 77, 9 << 20];
    stream(&mut s, &mut r, &sizes, |_| {});
    let st = k.stats();
    assert_eq!(st.opened, 3, "{st:?}");
    s.close().unwrap();
    r.close().unwrap();
    let t = Instant::now();
    loop {
        let st = k.stats();
        if st.legs == 0 {
            // Every frame passed the relay; its staging is free again.
            let payload: usize = sizes.iter().sum();
            assert!(st.bytes as usize > payload, "{st:?}");
            assert_eq!(st.staging, 0, "{st:?}");
            assert!(
                st.staging_peak > 0 && st.staging_peak <= 3 * (512 << 10),
                "{st:?}"
            );
            assert_eq!(st.refusals(), 0, "{st:?}");
            break;
        }
        assert!(
            t.elapsed() < DEADLINE,
            "the relay's streams never ended: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `k`'s statistics once they are whole: the service publishes them every 50 ms, so with no
/// client connecting, three periods later they count everything that happened.
fn settled(k: &RelayService) -> RelayStats {
    std::thread::sleep(Duration::from_millis(150));
    k.stats()
}

/// A relay makes room for newer connections by dropping the oldest that has not sent its request
/// (here at one per client address): the stream it dropped dials again and the path carries
/// verified data (issue 30's ring of six failed its CI run when a burst of a neighbour's streams
/// and probes cost one). A probe and a link list the relay drops are asked again the same way.
#[test]
fn a_stream_or_probe_the_relay_drops_for_a_newer_connection_dials_again() {
    let port = 24006;
    let bounds = Bounds {
        pending_per_source: 1,
        ..Bounds::default()
    };
    let k = relay_host(port, &["127.0.26.2/30", "127.0.27.1/30"], COMM, bounds);
    let door = SocketAddr::from(([127, 0, 26, 2], port));
    let (a_ip, b_ip) = ("127.0.26.1", "127.0.27.2");
    // A client's connection is admitted (its challenge sent), then a newer one from the same
    // address takes its place before it sends its request; the client's next dial takes the
    // newer one's place in turn (it never sends a request).
    let evicted = |s: &RelayStats| s.refused.get("evicted").copied().unwrap_or(0);
    let squat = || {
        let st = settled(&k);
        let (admitted, gone) = (st.accepted, evicted(&st));
        let x = raw(a_ip, door);
        stats_once(&k, "the client's connection evicted", |s| {
            s.accepted == admitted + 1 && evicted(s) == gone + 1
        });
        x
    };
    let before = settled(&k).accepted;
    let p = Probe::start(ip(a_ip), door, CommKey::new(COMM), vec![ip(b_ip)]);
    stats_once(&k, "the probe admitted", |s| s.accepted == before + 1);
    let _x1 = squat();
    assert!(
        matches!(finish(p), ProbeState::Found(ref f) if f.target == ip(b_ip)),
        "a dropped probe is asked again and finds the peer"
    );
    let before = settled(&k).accepted;
    let mut l = LinkList::start(ip(a_ip), door, CommKey::new(COMM));
    stats_once(&k, "the list admitted", |s| s.accepted == before + 1);
    let _x2 = squat();
    let t = Instant::now();
    let listed = loop {
        match l.poll() {
            ListState::Pending => assert!(t.elapsed() < DEADLINE, "the list never ended"),
            s => break s.clone(),
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        listed,
        ListState::Done(vec![ip(b_ip)]),
        "a dropped list is asked again"
    );
    let before = settled(&k);
    let (c, a) = start_chained(
        &[PathDef {
            a: a_ip,
            b: b_ip,
            via: Some((door, "127.0.27.1")),
        }],
        &[None],
        COMM,
        1,
    );
    stats_once(&k, "the stream admitted", |s| {
        s.accepted == before.accepted + 1
    });
    let _x3 = squat();
    let (a, b) = set_up(c, a);
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    stream(&mut s, &mut r, &[1, 65_537, 3 << 20], |_| {});
    let st = k.stats();
    assert_eq!(
        st.opened, 1,
        "one stream joined, on its second dial: {st:?}"
    );
    // Each of the three clients' first connections and each squatter.
    assert_eq!(evicted(&st), 6, "{st:?}");
}

/// A peer two relays away (a ring of six: the opposite box): A–K1–K2–B in a line, K1 and K2
/// serving the communicator on its one port. A chained probe asks K2 through K1 and finds B; the
/// path's streams open K1's door to K2's (open to a relay), then K2's to B, and carry verified
/// data end to end; B takes them from K2's address on its link. A chained probe that K2 refuses
/// comes back through K1 as K2's verdict, in order.
#[test]
fn a_path_through_two_relays_finds_the_peer_and_carries_verified_data_end_to_end() {
    let port = 24041;
    let k1 = relay_named(
        "k1",
        port,
        &["127.0.111.2/30", "127.0.112.1/30"],
        COMM,
        Bounds::default(),
    );
    let k2 = relay_named(
        "k2",
        port,
        &["127.0.112.2/30", "127.0.113.1/30"],
        COMM,
        Bounds::default(),
    );
    let door = SocketAddr::from(([127, 0, 111, 2], port));
    // K1 reaches no address of B; K2, through K1, reaches one of them.
    let e = probe("127.0.111.1", door, COMM, &["127.0.113.2"]);
    assert!(
        matches!(&e, ProbeState::Failed(w) if w.contains("not at the far end")),
        "{e:?}"
    );
    match probe_chained(
        "127.0.111.1",
        door,
        "127.0.112.2",
        COMM,
        &["127.0.114.2", "127.0.113.2"],
    ) {
        ProbeState::Found(f) => {
            assert_eq!((f.target, f.via), (ip("127.0.113.2"), ip("127.0.113.1")));
            assert_eq!((f.local, f.relay), (ip("127.0.111.1"), door));
            assert_eq!(
                f.next,
                Some(Hop {
                    addr: ip("127.0.112.2"),
                    host: "k2".into()
                })
            );
            assert_eq!(f.name(), "k1 (127.0.111.2) > k2 (127.0.112.2)");
            assert_eq!(f.speed_mbps, 10_000);
        }
        s => panic!("{s:?}"),
    }
    // K2 refuses (B's other address is on none of its links): its verdict and its end come back
    // through K1, which passes both on in order.
    let e = probe_chained("127.0.111.1", door, "127.0.112.2", COMM, &["127.0.114.2"]);
    assert!(
        matches!(&e, ProbeState::Failed(w) if w.contains("relay 127.0.112.2:24041 through 127.0.111.2:24041 refused")
            && w.contains("not at the far end")),
        "{e:?}"
    );
    let (a, b) = connect_chained(
        &[PathDef {
            a: "127.0.111.1",
            b: "127.0.113.2",
            via: Some((door, "127.0.113.1")),
        }],
        &[Some("127.0.112.2")],
        COMM,
        3,
    );
    let label = a.paths()[0].label.clone();
    assert!(
        label.contains("127.0.113.2 via relays k (127.0.111.2) > k2 (127.0.112.2)"),
        "{label}"
    );
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    let sizes = [0, 1, 4096, 65_537, 1 << 20, (3 << 20) + 77, 9 << 20];
    stream(&mut s, &mut r, &sizes, |_| {});
    s.close().unwrap();
    r.close().unwrap();
    let t = Instant::now();
    loop {
        let (s1, s2) = (k1.stats(), k2.stats());
        if s1.legs == 0 && s2.legs == 0 {
            // Two chained probes and three streams through K1, each to K2's door; three streams
            // through K2 to B. Every frame passed both; at K2 one probe refused.
            assert_eq!((s1.opened, s1.chained), (5, 5), "{s1:?}");
            assert_eq!((s2.opened, s2.chained, s2.probes), (3, 0, 1), "{s2:?}");
            let payload: usize = sizes.iter().sum();
            assert!(s1.bytes as usize > payload && s2.bytes as usize > payload);
            assert_eq!((s1.staging, s2.staging), (0, 0));
            // At K1 the first probe, for an address of B on none of its links.
            assert_eq!(s1.refused.get("target not on a link"), Some(&1), "{s1:?}");
            assert_eq!(s1.refusals(), 1, "{s1:?}");
            assert_eq!(s2.refused.get("target not on a link"), Some(&1), "{s2:?}");
            assert_eq!(s2.refusals(), 1, "{s2:?}");
            break;
        }
        assert!(
            t.elapsed() < DEADLINE,
            "the relays' streams never ended: {s1:?} {s2:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A chained probe whose second relay is not up yet (its rank has not called `init`): the first
/// relay answers `unreachable`, and the probe asks again until the second serves, within its
/// patience; past it the probe fails naming the first relay's answer.
#[test]
fn a_chained_probe_waits_for_a_second_relay_that_comes_up_late() {
    let port = 24043;
    let _k1 = relay_named(
        "k1",
        port,
        &["127.0.131.2/30", "127.0.132.1/30"],
        COMM,
        Bounds::default(),
    );
    let door = SocketAddr::from(([127, 0, 131, 2], port));
    let key = CommKey::new(COMM);
    let late = |wait: Duration| {
        Probe::start_chained(
            ip("127.0.131.1"),
            door,
            ip("127.0.132.2"),
            key.clone(),
            vec![ip("127.0.133.2")],
        )
        .patience(wait)
    };
    let e = finish(late(Duration::from_millis(300)));
    assert!(
        matches!(&e, ProbeState::Failed(w) if w.contains("could not reach")),
        "{e:?}"
    );
    let k2 = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        relay_named(
            "k2",
            port,
            &["127.0.132.2/30", "127.0.133.1/30"],
            COMM,
            Bounds::default(),
        )
    });
    let found = finish(late(Duration::from_secs(10)));
    assert!(
        matches!(&found, ProbeState::Found(f) if f.via == ip("127.0.133.1")),
        "{found:?}"
    );
    drop(k2.join().unwrap());
}

/// A relayed write completes when the peer has it, not when the relay host's kernel does: with
/// B not reading, a small send stays incomplete although every byte left A and the relay;
/// once B reads, it completes. (Completed on the relay's TCP acknowledgement, as a direct path's
/// write does on its peer's, the sender would count it landed while it sat at the relay: a relay
/// that died then would lose it, and failover would not send it again.)
#[test]
fn a_relayed_write_completes_on_the_peers_acknowledgement_not_the_relays() {
    let port = 24003;
    let _k = relay_host(
        port,
        &["127.0.31.2/30", "127.0.32.1/30"],
        COMM,
        Bounds::default(),
    );
    let door = SocketAddr::from(([127, 0, 31, 2], port));
    let (mut a, mut b) = connect(
        &[PathDef {
            a: "127.0.31.1",
            b: "127.0.32.2",
            via: Some((door, "127.0.32.1")),
        }],
        COMM,
        1,
    );
    let mut src = HostBuffer::new(4096).unwrap();
    src.write(0, &pattern(4096, 3)).unwrap();
    let dst = HostBuffer::new(4096).unwrap();
    let sreg = a.register(&src.lend(), MemKind::Host).unwrap();
    let rreg = b.register(&dst.lend(), MemKind::Host).unwrap();
    b.hold_receiving(0, true);
    b.post_recv(0, 7).unwrap();
    let wr = switchless::transport::fabric::WriteWr {
        wr_id: 1,
        local: switchless::transport::fabric::LocalSeg {
            addr: src.addr(),
            len: 4096,
            lkey: sreg.keys[0].lkey,
        },
        remote: switchless::transport::fabric::RemoteSeg {
            addr: dst.addr(),
            rkey: rreg.keys[0].rkey,
        },
        imm: Some(9),
        signaled: true,
        inline: false,
    };
    a.post_write(0, &wr).unwrap();
    let mut out = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(400) {
        a.poll(0, 4, &mut out).unwrap();
        assert!(out.is_empty(), "completed before the peer read it: {out:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    b.hold_receiving(0, false);
    let t = Instant::now();
    while out.is_empty() {
        assert!(t.elapsed() < DEADLINE, "never completed");
        a.poll(0, 4, &mut out).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(out[0].status.is_success() && out[0].wr_id == 1, "{out:?}");
    let mut got = Vec::new();
    while got.is_empty() {
        b.poll(0, 4, &mut got).unwrap();
    }
    assert_eq!(
        (got[0].wr_id, got[0].imm, got[0].byte_len),
        (7, Some(9), 4096)
    );
    assert!(dst.read(0, 4096).unwrap() == pattern(4096, 3));
}

/// A GB10 ring's diagonal: A and B share no cable; two neighbours relay. The relay host of one
/// path dies mid-transfer: the connection fails over to the other relay, every message arrives
/// with its bytes. Then the other relay dies too: the connection fails, naming it.
#[test]
fn a_dead_relay_costs_its_path_and_the_last_one_fails_naming_the_relay() {
    let port = 24004;
    let k1 = relay_host(
        port,
        &["127.0.41.2/30", "127.0.42.1/30"],
        COMM,
        Bounds::default(),
    );
    let k3 = relay_host(
        port,
        &["127.0.43.2/30", "127.0.44.1/30"],
        COMM,
        Bounds::default(),
    );
    let (a, b) = connect(
        &[
            PathDef {
                a: "127.0.41.1",
                b: "127.0.42.2",
                via: Some((SocketAddr::from(([127, 0, 41, 2], port)), "127.0.42.1")),
            },
            PathDef {
                a: "127.0.43.1",
                b: "127.0.44.2",
                via: Some((SocketAddr::from(([127, 0, 43, 2], port)), "127.0.44.1")),
            },
        ],
        COMM,
        2,
    );
    let cfg = ProtocolConfig {
        request_timeout: Some(Duration::from_secs(3)),
        ..pcfg()
    };
    let (mut s, mut r) = connect_pair(a, b, cfg).unwrap();
    let mut k1 = Some(k1);
    let sizes = vec![512 << 10; 48];
    stream(&mut s, &mut r, &sizes, |m| {
        if m == 16 {
            drop(k1.take());
        }
    });
    assert_eq!(s.paths_up(), vec![false, true]);
    // The path through k3 alone carries on.
    stream(&mut s, &mut r, &[1 << 20; 8], |_| {});
    drop(k3);
    let now = Instant::now();
    let src = HostBuffer::new(1 << 20).unwrap();
    let dst = HostBuffer::new(1 << 20).unwrap();
    let smh = s.reg_mr(&src.lend(), MemKind::Host).unwrap();
    let rmh = r.reg_mr(&dst.lend(), MemKind::Host).unwrap();
    let rq = r
        .irecv(
            now,
            &[RecvBuf {
                addr: dst.addr(),
                size: 1 << 20,
                tag: 0,
                mh: &rmh,
            }],
        )
        .unwrap()
        .unwrap();
    // The receiver's clear-to-send goes out on the dead path: its receive fails, naming the
    // relay. The sender, which gets no clear-to-send, fails at the request timeout (as over a
    // direct path whose peer is gone), naming the relay among its paths.
    let t = Instant::now();
    let (mut sq, mut rerr, mut serr) = (None, None, None);
    while rerr.is_none() || serr.is_none() {
        assert!(
            t.elapsed() < DEADLINE,
            "the connection never failed: receiver {rerr:?}, sender {serr:?}"
        );
        let now = Instant::now();
        if rerr.is_none() {
            match r.test(now, rq) {
                Ok(None) => {}
                Ok(Some(_)) => panic!("a receive completed with every relay dead"),
                Err(e) => rerr = Some(e.to_string()),
            }
        }
        if serr.is_none() {
            match sq {
                None => match s.isend(now, src.addr(), 1 << 20, 0, &smh) {
                    Ok(q) => sq = q,
                    Err(e) => serr = Some(e.to_string()),
                },
                Some(q) => match s.test(now, q) {
                    Ok(None) => {}
                    Ok(Some(_)) => panic!("a send completed with every relay dead"),
                    Err(e) => serr = Some(e.to_string()),
                },
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for e in [rerr.unwrap(), serr.unwrap()] {
        assert!(e.contains("relay k (127.0.43.2)"), "{e}");
    }
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}

/// `k`'s statistics once `ok` holds (the service publishes them every 50 ms), or a failure naming
/// what they were at the deadline.
fn stats_once(k: &RelayService, what: &str, ok: impl Fn(&RelayStats) -> bool) -> RelayStats {
    let t = Instant::now();
    loop {
        let st = k.stats();
        if ok(&st) {
            return st;
        }
        assert!(t.elapsed() < DEADLINE, "{what}: {st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A relay path fails over and back like any path: a direct cable and a relayed path carry a
/// connection; the relay host goes away (its rank exits) and the direct path carries on; a relay
/// comes back on the same port and failback rebuilds the relayed path through it (a new stream
/// generation, opened at the relay's door again), which then carries data again, byte-exact.
#[test]
fn a_relayed_path_fails_over_and_back_when_its_relay_returns() {
    let port = 24005;
    let addrs = ["127.0.91.2/30", "127.0.92.1/30"];
    let k = relay_host(port, &addrs, COMM, Bounds::default());
    let (a, b) = connect(
        &[
            PathDef {
                a: "127.0.93.1",
                b: "127.0.93.2",
                via: None,
            },
            PathDef {
                a: "127.0.91.1",
                b: "127.0.92.2",
                via: Some((SocketAddr::from(([127, 0, 91, 2], port)), "127.0.92.1")),
            },
        ],
        COMM,
        2,
    );
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    stream(&mut s, &mut r, &[1 << 20; 8], |_| {});
    stats_once(&k, "the relayed path carried nothing", |st| st.frames > 0);
    drop(k);
    stream(&mut s, &mut r, &[1 << 20; 16], |_| {});
    assert_eq!(s.paths_up(), vec![true, false]);
    let k = relay_host(port, &addrs, COMM, Bounds::default());
    let t = Instant::now();
    while s.paths_up() != [true, true] || r.paths_up() != [true, true] {
        assert!(
            t.elapsed() < DEADLINE,
            "no failback: paths up {:?} / {:?}; relay {:?}",
            s.paths_up(),
            r.paths_up(),
            k.stats()
        );
        stream(&mut s, &mut r, &[64 << 10; 16], |_| {});
    }
    assert!(s.fabric().path_generation(1) >= 1);
    stats_once(&k, "the relay opened both streams again", |st| {
        st.opened == 2
    });
    let before: u64 = s.fabric().stream_bytes(1).iter().sum();
    stream(&mut s, &mut r, &[256 << 10; 64], |_| {});
    let after: u64 = s.fabric().stream_bytes(1).iter().sum();
    assert!(
        after > before + (1 << 20),
        "the relayed path carries data again ({before} -> {after} bytes)"
    );
    stats_once(&k, "the returned relay forwarded nothing", |st| {
        st.frames > 0
    });
}

/// The registry of relay services: one service per port per host (a second plugin instance on the
/// host finds the port taken and leaves it to the first), serving each communicator while one of
/// its registrations lives; a communicator that left is refused at the door while the others are
/// still served; the last registration stops the service.
#[test]
fn relay_services_live_and_die_with_their_communicators() {
    use switchless::transport::relay::{Relays, port_for};
    let cfg = ServiceConfig {
        links: vec![link("127.0.101.2/30"), link("127.0.102.1/30")],
        bounds: Bounds::default(),
        tcp: TcpConfig::default(),
        host: "k".into(),
        link_down: None,
        verbs: None,
    };
    // Two communicators whose ports are the same: one service serves both.
    let c1 = 0x1000u64;
    let c2 = (0x1001u64..)
        .find(|c| port_for(*c) == port_for(c1))
        .unwrap();
    let port = port_for(c1);
    let door = SocketAddr::from(([127, 0, 101, 2], port));
    let first = Relays::new(cfg.clone());
    let second = Relays::new(cfg);
    let t1 = first.register(c1).unwrap();
    let t1b = first.register(c1).unwrap();
    let t2 = first.register(c2).unwrap();
    assert!(t1.serving && t1b.serving && t2.serving);
    // Another rank of the host: the port is taken, it serves nothing.
    let other = second.register(c1).unwrap();
    assert!(!other.serving);
    assert!(second.stats().is_empty());
    let found = |c| {
        matches!(
            probe("127.0.101.1", door, c, &["127.0.102.2"]),
            ProbeState::Found(_)
        )
    };
    assert!(found(c1) && found(c2));
    drop(t1);
    assert!(found(c1), "c1 still has a registration");
    drop(t1b);
    let e = probe("127.0.101.1", door, c1, &["127.0.102.2"]);
    assert!(
        matches!(&e, ProbeState::Failed(w) if w.contains("serves no such communicator")),
        "{e:?}"
    );
    assert!(found(c2));
    // Counted (the shared statistics are refreshed every 50 ms).
    let t = Instant::now();
    loop {
        let st = &first.stats()[0];
        assert_eq!(st.0, port);
        if st.1.refused.get("unknown communicator") == Some(&1) {
            break;
        }
        assert!(t.elapsed() < DEADLINE, "{st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(t2);
    assert!(
        first.stats().is_empty(),
        "the last registration stops the service"
    );
    drop(other);
    let t = std::net::TcpListener::bind(door);
    assert!(t.is_ok(), "the port is free again: {t:?}");
}

#[path = "support/shared_pool.rs"]
mod shared_pool;

use shared_pool::Peer;

/// NCCL's p2p pool through a relay: two peers' messages (`support/shared_pool.rs`) striped over a
/// direct path and a relayed one, through one relay K or (`chain`) through two, A -> K1 -> K2 -> B
/// (both on the peer's own port). At message `kill_at` relay `which` of peer 0's connection (0: K
/// or K1, 1: K2) dies: what it held in staging is lost, every leg through it cut. Whichever leg
/// breaks, the path fails over; every message arrives once with exactly its bytes, and no
/// completed buffer changes before it is posted again.
fn shared_pool_through_a_dying_relay(
    chain: bool,
    which: usize,
    kill_at: usize,
    port: u16,
    net: u8,
) {
    let o =
        |x: u8, h: u8| -> &'static str { Box::leak(format!("127.{net}.{x}.{h}").into_boxed_str()) };
    let mut relays: Vec<Vec<Option<RelayService>>> = (0..2u8)
        .map(|p| {
            let port = port + u16::from(p);
            let host = |name: &str, a: u8, b: u8| {
                let links = [
                    format!("127.{net}.{}.2/30", 10 * p + a),
                    format!("127.{net}.{}.1/30", 10 * p + b),
                ];
                let links: Vec<&str> = links.iter().map(String::as_str).collect();
                Some(relay_named(name, port, &links, COMM, Bounds::default()))
            };
            if chain {
                vec![host("k1", 1, 4), host("k2", 4, 2)]
            } else {
                vec![host("k", 1, 2)]
            }
        })
        .collect();
    let mut peers: Vec<Peer<TcpFabric>> = (0..2u8)
        .map(|p| {
            let (a, b) = connect_chained(
                &[
                    PathDef {
                        a: o(10 * p + 3, 1),
                        b: o(10 * p + 3, 2),
                        via: None,
                    },
                    PathDef {
                        a: o(10 * p + 1, 1),
                        b: o(10 * p + 2, 2),
                        via: Some((
                            SocketAddr::new(IpAddr::V4(ip(o(10 * p + 1, 2))), port + u16::from(p)),
                            o(10 * p + 2, 1),
                        )),
                    },
                ],
                &[None, chain.then(|| o(10 * p + 4, 2))],
                COMM,
                2,
            );
            let label = &a.paths()[1].label;
            assert_eq!(label.contains("via relays k ("), chain, "{label}");
            let (s, r) = connect_pair(a, b, pcfg()).unwrap();
            Peer { s, r }
        })
        .collect();
    shared_pool::run(
        &mut peers,
        40,
        if chain { "chain" } else { "relay" },
        DEADLINE,
        |_, m, _| {
            if m == kill_at {
                drop(relays[0][which].take());
            }
        },
        |_, _| {},
    );
    let st = peers[0].s.fence_stats();
    assert!(st.stops > 0, "the relayed path never failed over: {st:?}");
    assert_eq!(peers[1].s.fence_stats().stops, 0, "peer 1's relays lived");
    if chain {
        let chained = relays[1][0].as_ref().map(|k| k.stats().chained);
        assert_eq!(
            chained,
            Some(2),
            "peer 1's streams went through both relays"
        );
    }
    for g in peers {
        g.s.close().unwrap();
        g.r.close().unwrap();
    }
}

#[test]
fn a_shared_receive_pool_gets_each_message_once_when_a_chains_second_relay_dies_mid_run() {
    shared_pool_through_a_dying_relay(true, 1, 20, 24014, 70);
}

#[test]
fn a_shared_receive_pool_gets_each_message_once_when_a_chains_first_relay_dies_early() {
    shared_pool_through_a_dying_relay(true, 0, 4, 24016, 80);
}

#[test]
fn a_shared_receive_pool_gets_each_message_once_when_a_relay_dies_early() {
    shared_pool_through_a_dying_relay(false, 0, 4, 24010, 50);
}

#[test]
fn a_shared_receive_pool_gets_each_message_once_when_a_relay_dies_mid_run() {
    shared_pool_through_a_dying_relay(false, 0, 20, 24012, 60);
}

// ---------------------------------------------------------------------------------------------------
// The relay door under a hostile neighbour
// ---------------------------------------------------------------------------------------------------

#[path = "support/logs.rs"]
mod logs;

/// Every thread's events (the relay service logs from its own thread), for the WARN limit.
fn global_logs() -> &'static logs::Logs {
    logs::Logs::global()
}

use std::io::{Read, Write};
use switchless::transport::relay::wire::{
    CHALLENGE_LEN as DOOR_CHALLENGE_LEN, ChallengeRepr, Code, Op, RequestRepr, VERDICT_LEN,
    VerdictRepr,
};
use switchless::transport::tcp::RELAY_FRAME_BYTES;
use switchless::transport::tcp::frame::{FrameRepr, HELLO_LEN, OP_WRITE};

/// A raw TCP connection from `from` to `to` (reads time out after 5 s).
fn raw(from: &str, to: SocketAddr) -> std::net::TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(IpAddr::V4(ip(from)), 0).into())
        .unwrap();
    s.connect(&to.into()).unwrap();
    let s: std::net::TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads the door's challenge.
fn challenge(s: &mut std::net::TcpStream) -> [u8; 16] {
    let mut b = [0u8; DOOR_CHALLENGE_LEN];
    s.read_exact(&mut b).unwrap();
    ChallengeRepr::parse(&b).unwrap().nonce
}

/// Reads the door's verdict.
fn verdict(s: &mut std::net::TcpStream) -> VerdictRepr {
    let mut b = [0u8; VERDICT_LEN];
    s.read_exact(&mut b).unwrap();
    VerdictRepr::parse(&b).unwrap()
}

/// Whether the other end closed or reset the connection (reads what is left first).
fn cut(s: &mut std::net::TcpStream) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

/// An open of `target` sealed by communicator `comm` for `challenge`.
fn open_req(comm: u64, challenge: &[u8; 16], target: SocketAddr) -> RequestRepr {
    let IpAddr::V4(t) = target.ip() else {
        unreachable!()
    };
    CommKey::new(comm).seal(
        RequestRepr {
            op: Op::Open,
            comm: 0,
            port: target.port(),
            targets: vec![t],
            nonce: [5; 16],
            tag: [0; 16],
        },
        challenge,
    )
}

/// Opens a relayed stream from `from` to `target` through `door`; the verdict must be `OK`.
fn opened(from: &str, door: SocketAddr, target: SocketAddr) -> std::net::TcpStream {
    let mut s = raw(from, door);
    let c = challenge(&mut s);
    s.write_all(&open_req(COMM, &c, target).to_bytes()).unwrap();
    let v = verdict(&mut s);
    assert_eq!(v.code, Code::Ok, "{v:?}");
    s
}

/// A hostile neighbour H (on its own link to K, 127.0.73.1) and a stranger on no link of K
/// (127.0.75.1) throw every bad input of issue 30 at K's relay door while A's relayed connection
/// through K moves verified data: each is refused (a verdict naming why, or the connection cut),
/// counted by reason, logged within the process's WARN limit; nothing past a bad frame reaches the
/// target; A's connection never notices.
#[test]
fn hostile_clients_at_the_relay_door_are_refused_counted_and_cost_nobody_else() {
    use switchless::transport::droplog::LINES_PER_INTERVAL;
    let logs = global_logs();
    let port = 24020;
    let bounds = Bounds {
        legs_per_source: 4,
        pending_per_source: 8,
        ..Bounds::default()
    };
    let k = relay_host(
        port,
        &["127.0.71.2/30", "127.0.72.1/30", "127.0.73.2/30"],
        COMM,
        bounds,
    );
    let door_a = SocketAddr::from(([127, 0, 71, 2], port));
    let door_h = SocketAddr::from(([127, 0, 73, 2], port));
    // A target on B's address that records what reaches it (a port H may name).
    let sink = std::net::TcpListener::bind("127.0.72.2:0").unwrap();
    let sink_at = sink.local_addr().unwrap();
    let got: Arc<std::sync::Mutex<Vec<Vec<u8>>>> = Arc::default();
    let g = Arc::clone(&got);
    std::thread::spawn(move || {
        for s in sink.incoming() {
            let Ok(mut s) = s else { return };
            let g = Arc::clone(&g);
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = s.read_to_end(&mut v);
                g.lock().unwrap().push(v);
            });
        }
    });
    let (a, b) = connect(
        &[PathDef {
            a: "127.0.71.1",
            b: "127.0.72.2",
            via: Some((door_a, "127.0.72.1")),
        }],
        COMM,
        3,
    );
    let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = Arc::clone(&done);
    let hostile = std::thread::spawn(move || {
        let h = "127.0.73.1";
        // A host on none of K's links: cut before it is sent anything.
        let mut x = raw("127.0.75.1", door_h);
        assert!(cut(&mut x), "a stranger got an answer");
        // A communicator K does not serve.
        let mut x = raw(h, door_h);
        let c = challenge(&mut x);
        x.write_all(&open_req(999, &c, sink_at).to_bytes()).unwrap();
        assert_eq!(verdict(&mut x).code, Code::UnknownComm);
        // A wrong tag (a recorded request answers no other challenge).
        let mut x = raw(h, door_h);
        let c = challenge(&mut x);
        let mut req = open_req(COMM, &c, sink_at);
        req.tag[0] ^= 1;
        x.write_all(&req.to_bytes()).unwrap();
        assert_eq!(verdict(&mut x).code, Code::BadTag);
        // Garbage.
        let mut x = raw(h, door_h);
        challenge(&mut x);
        x.write_all(&[0xA5; 116]).unwrap();
        assert_eq!(verdict(&mut x).code, Code::Malformed);
        // A target on none of K's links, and a system port of one on a link.
        let mut x = raw(h, door_h);
        let c = challenge(&mut x);
        x.write_all(&open_req(COMM, &c, "127.0.99.2:5000".parse().unwrap()).to_bytes())
            .unwrap();
        assert_eq!(verdict(&mut x).code, Code::NotALink);
        let mut x = raw(h, door_h);
        let c = challenge(&mut x);
        let mut req = open_req(COMM, &c, "127.0.72.2:1024".parse().unwrap());
        req.port = 22;
        x.write_all(&req.to_bytes()).unwrap();
        assert_eq!(verdict(&mut x).code, Code::Malformed);
        // Out of order: bytes before the verdict.
        let mut x = raw(h, door_h);
        let c = challenge(&mut x);
        let mut bytes = open_req(COMM, &c, sink_at).to_bytes().to_vec();
        bytes.extend_from_slice(&[1; 64]);
        x.write_all(&bytes).unwrap();
        assert_eq!(verdict(&mut x).code, Code::Malformed);
        // Oversized, after close, and not a frame: the stream is cut at the bad header, which never
        // reaches the target (the stream's opening, a hello's worth of bytes, passes first).
        let write = |len: u32| FrameRepr {
            op: OP_WRITE,
            flags: 0,
            len,
            seq: 0,
            addr: 0x1000,
            rkey: 1,
            imm: 0,
            wr_len: len,
        };
        let bad: Vec<Vec<u8>> = vec![
            write(RELAY_FRAME_BYTES as u32 + 1).to_bytes().to_vec(),
            [FrameRepr::close(false).to_bytes(), write(8).to_bytes()].concat(),
            vec![0x77; 40],
        ];
        for frames in &bad {
            let mut x = opened(h, door_h, sink_at);
            x.write_all(&[0; HELLO_LEN]).unwrap();
            x.write_all(frames).unwrap();
            assert!(cut(&mut x), "a bad frame did not cut the stream");
        }
        // Bounds: 4 relayed streams per client, the fifth is refused; 12 silent connections from
        // one address keep at most 8 waiting (the oldest go).
        let held: Vec<_> = (0..4).map(|_| opened(h, door_h, sink_at)).collect();
        let mut x = raw(h, door_h);
        let c = challenge(&mut x);
        x.write_all(&open_req(COMM, &c, sink_at).to_bytes())
            .unwrap();
        assert_eq!(verdict(&mut x).code, Code::Busy);
        drop(held);
        let mut silent: Vec<_> = (0..12).map(|_| raw(h, door_h)).collect();
        for x in &silent {
            x.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        }
        let (t, mut evicted) = (Instant::now(), 0);
        while evicted < 4 {
            assert!(t.elapsed() < DEADLINE, "silent connections never evicted");
            silent.retain_mut(|x| {
                let c = cut(x);
                evicted += usize::from(c);
                !c
            });
        }
        d.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    // A's connection through K moves verified data all along, and after.
    let mut rounds = 0;
    while !hostile.is_finished() || rounds < 2 {
        stream(&mut s, &mut r, &[1 << 20, 300_001, 4096, 2 << 20], |_| {});
        rounds += 1;
    }
    hostile.join().expect("the hostile client's expectations");
    assert!(done.load(std::sync::atomic::Ordering::SeqCst));
    stream(&mut s, &mut r, &[3 << 20; 4], |_| {});
    assert_eq!(s.paths_up(), vec![true]);
    // Nothing past a bad header reached the target: at most the opening and one close frame.
    let t = Instant::now();
    while got.lock().unwrap().len() < 3 {
        assert!(t.elapsed() < DEADLINE, "the target's streams never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    for v in got.lock().unwrap().iter() {
        assert!(
            v.len() <= HELLO_LEN + 40,
            "{} bytes reached the target",
            v.len()
        );
        assert!(
            v.iter().all(|&b| b == 0 || b == 0x54 || b == 0x57 || b < 3),
            "{v:?}"
        );
    }
    // Counted by reason.
    let t = Instant::now();
    let st = loop {
        let st = k.stats();
        if st.refused.get("evicted").copied().unwrap_or(0) >= 4 {
            break st;
        }
        assert!(t.elapsed() < DEADLINE, "{st:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    for (why, n) in [
        ("not a link", 1),
        ("unknown communicator", 1),
        ("bad tag", 1),
        ("target not on a link", 1),
        ("out of order", 1),
        ("oversized frame", 1),
        ("after close", 1),
        ("bad frame", 1),
        ("busy", 1),
    ] {
        assert_eq!(st.refused.get(why).copied(), Some(n), "{why}: {st:?}");
    }
    // Garbage and the system port, and the silent connections that hung up before a request.
    assert!(
        st.refused.get("malformed").copied().unwrap_or(0) >= 2,
        "{st:?}"
    );
    // A's three streams were joined and none of them refused or dropped.
    assert!(st.opened >= 3 + 3 + 4, "{st:?}");
    // WARN lines: some, within the process's limit, although there were far more refusals.
    let lines: Vec<String> = logs
        .find(tracing::Level::WARN, &format!("relay on port {port}"))
        .into_iter()
        .collect();
    assert!(!lines.is_empty(), "no WARN line");
    assert!(lines.len() <= LINES_PER_INTERVAL as usize, "{lines:#?}");
    assert!(st.refusals() > lines.len() as u64, "{st:?} {lines:#?}");
    s.close().unwrap();
    r.close().unwrap();
}

/// An open to a relay of communicator `comm` sealed for `challenge`: the relay door at `target`.
fn relay_req(comm: u64, challenge: &[u8; 16], target: SocketAddr) -> RequestRepr {
    let IpAddr::V4(t) = target.ip() else {
        unreachable!()
    };
    CommKey::new(comm).seal(
        RequestRepr {
            op: Op::OpenRelay,
            comm: 0,
            port: target.port(),
            targets: vec![t],
            nonce: [6; 16],
            tag: [0; 16],
        },
        challenge,
    )
}

/// A hostile neighbour H of K1 (127.0.121.1) asks K1 to open to relays it may not: another port
/// than the relay's own, a target on none of K1's links, the far end of H's own link or K1's own
/// address there, a wrong tag; and to a host on a link with no relay. Each is refused with a
/// verdict naming why and counted. An open to K2's door that K2 then refuses (garbage for a
/// request) gets K2's verdict through K1, then an orderly end. K1 keeps serving: a chained probe
/// through it finds B behind K2.
#[test]
fn hostile_opens_to_a_relay_are_refused_counted_and_the_relay_keeps_serving() {
    let port = 24042;
    let k1 = relay_named(
        "k1",
        port,
        &["127.0.121.2/30", "127.0.122.1/30", "127.0.123.1/30"],
        COMM,
        Bounds::default(),
    );
    let k2 = relay_named(
        "k2",
        port,
        &["127.0.122.2/30", "127.0.124.1/30"],
        COMM,
        Bounds::default(),
    );
    let h = "127.0.121.1";
    let door = SocketAddr::from(([127, 0, 121, 2], port));
    let at = |a: &str, p: u16| SocketAddr::new(IpAddr::V4(ip(a)), p);
    let ask = |req: &dyn Fn(&[u8; 16]) -> RequestRepr| {
        let mut x = raw(h, door);
        let c = challenge(&mut x);
        x.write_all(&req(&c).to_bytes()).unwrap();
        let v = verdict(&mut x);
        assert!(cut(&mut x), "a refusal left the connection open");
        v.code
    };
    // Another port than the relay's own (K2's address, a port a path listener might have).
    assert_eq!(
        ask(&|c| relay_req(COMM, c, at("127.0.122.2", port + 1))),
        Code::Malformed
    );
    // A target on none of K1's links; H itself; K1's own address on H's link.
    for t in ["127.0.99.2", h, "127.0.121.2"] {
        assert_eq!(
            ask(&|c| relay_req(COMM, c, at(t, port))),
            Code::NotALink,
            "{t}"
        );
    }
    // A wrong tag.
    assert_eq!(
        ask(&|c| {
            let mut r = relay_req(COMM, c, at("127.0.122.2", port));
            r.tag[3] ^= 0x10;
            r
        }),
        Code::BadTag
    );
    // A host on K1's link where no relay listens.
    assert_eq!(
        ask(&|c| relay_req(COMM, c, at("127.0.123.2", port))),
        Code::Unreachable
    );
    // Through K1 to K2's door, which refuses garbage: its verdict, then the end, through K1.
    let mut x = raw(h, door);
    let c = challenge(&mut x);
    x.write_all(&relay_req(COMM, &c, at("127.0.122.2", port)).to_bytes())
        .unwrap();
    assert_eq!(verdict(&mut x).code, Code::Ok);
    challenge(&mut x);
    x.write_all(&[0xA5; 116]).unwrap();
    assert_eq!(verdict(&mut x).code, Code::Malformed);
    let mut rest = [0u8; 1];
    assert_eq!(
        x.read(&mut rest).unwrap(),
        0,
        "an orderly end of stream after the verdict"
    );
    // Its leg at K1 ends when H hangs up too.
    drop(x);
    // K1 still serves.
    let found = probe_chained(h, door, "127.0.122.2", COMM, &["127.0.124.2"]);
    assert!(
        matches!(&found, ProbeState::Found(f) if f.via == ip("127.0.124.1")),
        "{found:?}"
    );
    let t = Instant::now();
    loop {
        let (s1, s2) = (k1.stats(), k2.stats());
        let want = [
            ("not the relay port", 1),
            ("target not on a link", 3),
            ("bad tag", 1),
            ("unreachable", 1),
        ];
        if s1.legs == 0
            && want
                .iter()
                .all(|(w, n)| s1.refused.get(w).copied() == Some(*n))
        {
            assert_eq!(s1.refusals(), 6, "{s1:?}");
            assert_eq!((s1.opened, s1.chained), (2, 2), "{s1:?}");
            assert_eq!(s2.refused.get("malformed"), Some(&1), "{s2:?}");
            assert_eq!(s2.probes, 1, "{s2:?}");
            break;
        }
        assert!(t.elapsed() < DEADLINE, "{s1:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Not a test: the relay's cost, for docs/guide/relay.md. One connection of one path (4 streams)
/// moves 1 GiB in 4 MiB messages directly, then through a relay on the same host: the ratio of the
/// two rates, the relay thread's CPU per 100 Gb/s forwarded, and its peak staging memory.
/// `cargo test --release --test relay -- --ignored --nocapture relay_cost`
#[test]
fn the_relay_counts_its_own_threads_cpu_not_its_starters() {
    // The starter has spent far more CPU than the new service thread will: the service's count
    // must not be the difference of two threads' clocks (it read 0 then).
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(200) {
        std::hint::black_box(t.elapsed());
    }
    let k = relay_host(
        24006,
        &["127.0.95.2/30", "127.0.96.1/30"],
        COMM,
        Bounds::default(),
    );
    // A few housekeeping ticks publish the count.
    let mut cpu = 0;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(60));
        cpu = k.stats().cpu_ns;
        if cpu > 0 {
            break;
        }
    }
    assert!(cpu > 0, "the relay thread's CPU read 0 after 6 s");
    assert!(
        cpu < 150_000_000,
        "an idle relay thread counted {cpu} ns: the starter's CPU?"
    );
}

#[test]
#[ignore = "a benchmark: run it by name in release mode"]
fn relay_cost() {
    const MSG: usize = 4 << 20;
    const N: usize = 256;
    let port = 24030;
    let k = relay_host(
        port,
        &["127.0.81.2/30", "127.0.82.1/30"],
        COMM,
        Bounds::default(),
    );
    let mut rate = Vec::new();
    for via in [
        None,
        Some((SocketAddr::from(([127, 0, 81, 2], port)), "127.0.82.1")),
    ] {
        let (a, b) = connect(
            &[PathDef {
                a: "127.0.81.1",
                b: if via.is_some() {
                    "127.0.82.2"
                } else {
                    "127.0.81.1"
                },
                via,
            }],
            COMM,
            4,
        );
        let (mut s, mut r) = connect_pair(a, b, pcfg()).unwrap();
        stream(&mut s, &mut r, &[MSG; 8], |_| {});
        let cpu0 = k.stats().cpu_ns;
        let t = Instant::now();
        stream(&mut s, &mut r, &[MSG; N], |_| {});
        let secs = t.elapsed().as_secs_f64();
        let gbps = (MSG * N) as f64 * 8.0 / secs / 1e9;
        rate.push(gbps);
        if via.is_some() {
            let st = k.stats();
            let cpu = (st.cpu_ns - cpu0) as f64 / 1e9 / secs;
            println!(
                "relayed: {gbps:.1} Gb/s; relay thread {:.2} cores busy = {:.2} cores per 100 Gb/s; \
                 peak staging {} KiB",
                cpu,
                cpu / gbps * 100.0,
                st.staging_peak >> 10
            );
        } else {
            println!("direct: {gbps:.1} Gb/s");
        }
        s.close().unwrap();
        r.close().unwrap();
    }
    println!("relayed / direct: {:.2}", rate[1] / rate[0]);
}

/// A list of K1's links (op 4): from A, the far ends of K1's other up links, in K1's order, never
/// A's own, one request per index until `NotALink`; each answer is authenticated. A request with
/// a wrong tag, of another communicator, or past the last link is refused and counted, and K1
/// keeps serving: the chained probe through the listed K2 finds B.
#[test]
fn a_relay_lists_its_other_links_far_ends_and_refuses_what_it_may_not() {
    let port = 24044;
    let k1 = relay_named(
        "k1",
        port,
        &["127.0.141.2/30", "127.0.142.1/30", "127.0.143.1/30"],
        COMM,
        Bounds::default(),
    );
    let _k2 = relay_named(
        "k2",
        port,
        &["127.0.142.2/30", "127.0.144.1/30"],
        COMM,
        Bounds::default(),
    );
    let door = SocketAddr::from(([127, 0, 141, 2], port));
    let list = |comm: u64| {
        let mut l = LinkList::start(ip("127.0.141.1"), door, CommKey::new(comm));
        let t = Instant::now();
        loop {
            match l.poll() {
                ListState::Pending => assert!(t.elapsed() < DEADLINE, "the list never ended"),
                s => return s.clone(),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    assert_eq!(
        list(COMM),
        ListState::Done(vec![ip("127.0.142.2"), ip("127.0.143.2")])
    );
    // Another communicator: refused, named.
    let e = list(COMM + 1);
    assert!(
        matches!(&e, ListState::Failed(w) if w.contains("serves no such communicator")),
        "{e:?}"
    );
    // By hand: index 1's answer is tagged and names K1's own address on that link; a wrong tag
    // and an index past the last are refused, each with its verdict and an end.
    let ask = |index: u16, wrong_tag: bool| {
        let mut x = raw("127.0.141.1", door);
        let c = challenge(&mut x);
        let mut req = CommKey::new(COMM).seal(
            RequestRepr {
                op: Op::List,
                comm: 0,
                port: index,
                targets: Vec::new(),
                nonce: [8; 16],
                tag: [0; 16],
            },
            &c,
        );
        if wrong_tag {
            req.tag[0] ^= 1;
        }
        x.write_all(&req.to_bytes()).unwrap();
        let v = verdict(&mut x);
        assert!(cut(&mut x), "a list's answer left the connection open");
        (v, req.tag)
    };
    let (v, tag) = ask(1, false);
    assert_eq!(
        (v.code, v.target, v.via, v.host.as_str()),
        (Code::Ok, ip("127.0.143.2"), ip("127.0.143.1"), "k1")
    );
    assert!(CommKey::new(COMM).check_verdict(&v, &tag));
    assert_eq!(ask(1, true).0.code, Code::BadTag);
    assert_eq!(ask(2, false).0.code, Code::NotALink);
    // A probe K1 refuses counts as answered (its door is up: worth asking for its list); one
    // to a host where nothing listens does not.
    let asked = |relay: SocketAddr| {
        let mut p = Probe::start(
            ip("127.0.141.1"),
            relay,
            CommKey::new(COMM),
            vec![ip("127.0.144.2")],
        )
        .patience(Duration::from_millis(100));
        let t = Instant::now();
        while *p.poll() == ProbeState::Pending {
            assert!(t.elapsed() < DEADLINE, "the probe never ended");
            std::thread::sleep(Duration::from_millis(1));
        }
        p.answered()
    };
    assert!(asked(door));
    assert!(!asked(SocketAddr::from(([127, 0, 141, 2], port + 1))));
    // K1 keeps serving: through the K2 it listed, B.
    match probe_chained("127.0.141.1", door, "127.0.142.2", COMM, &["127.0.144.2"]) {
        ProbeState::Found(f) => assert_eq!(f.via, ip("127.0.144.1")),
        s => panic!("{s:?}"),
    }
    // Stats are published every 50 ms: wait for the last refusal's.
    let t = Instant::now();
    let s = loop {
        let s = k1.stats();
        if s.refusals() >= 5 || t.elapsed() > DEADLINE {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Two lists of 2 answers, one by hand; the lists' ends and the hand's past the last; the
    // refused probe.
    assert_eq!(s.listed, 3, "{s:?}");
    assert_eq!(s.refused.get("no such link"), Some(&2), "{s:?}");
    assert_eq!(s.refused.get("unknown communicator"), Some(&1), "{s:?}");
    assert_eq!(s.refused.get("bad tag"), Some(&1), "{s:?}");
    assert_eq!(s.refused.get("target not on a link"), Some(&1), "{s:?}");
}
