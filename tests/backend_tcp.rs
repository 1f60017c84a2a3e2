//! The real backend (`plugin::Switchless`) over the production factory's TCP side
//! (`plugin::NetFactory::tcp_only`), end to end in one process on 127.0.0.1: listen
//! handles, routing, the handshake, then the TCP streams connecting after it (the acceptor's ports and
//! nonce travel in the handshake; both sides finish in `Connectable::poll_ready` while NCCL's calls
//! return "in progress"), then the transport protocol over real sockets.
//!
//! Host model (`tests/support/tcp_backend.rs`): two TCP links on `lo`, 127.0.0.1/30 and 127.0.0.2/30
//! (point-to-point subnets), and a kernel route 127.0.0.0/30 dev lo; a node reaches its "peer"
//! (itself) over two paths.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/logs.rs"]
mod logs;

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchless::error::Error;
use switchless::plugin::NetFactory;
use switchless::plugin::{
    Backend, CommInfo, HANDLE_SIZE, Handle, HostView, PtrSupport, RecvBuf, Region, Switchless,
};
use switchless::route::types::{KernelRoute, LinkKind};
use switchless::sys::HostBuffer;

#[path = "support/bounds.rs"]
mod bounds;
#[path = "support/tcp_backend.rs"]
mod support;
use support::*;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// Sends `sizes` one after another and checks every byte that arrives.
fn transfer(pair: &mut Pair, sizes: &[usize]) {
    let cap = sizes.iter().copied().max().unwrap_or(0).max(1);
    // Host buffers: the TCP workers write `dst` while no Rust reference to its bytes exists.
    let mut src = HostBuffer::new(cap).unwrap();
    let mut dst = HostBuffer::new(cap).unwrap();
    let region = |b: &HostBuffer| Region {
        mem: b.lend(),
        kind: PtrSupport::HOST,
    };
    let smr = B::reg_mr(switchless::plugin::CommRef::Send(&pair.0), region(&src)).unwrap();
    let rmr = B::reg_mr(switchless::plugin::CommRef::Recv(&pair.1), region(&dst)).unwrap();
    for (k, &size) in sizes.iter().enumerate() {
        let data = pattern(size, k as u8);
        src.write(0, &data).unwrap();
        dst.write(0, &vec![0xee; cap]).unwrap();
        let dst_addr = dst.addr() as usize;
        let mut rreq = B::irecv(
            &pair.1,
            &[RecvBuf {
                addr: dst_addr,
                size: cap,
                tag: 9,
                mr: &rmr,
            }],
        )
        .unwrap()
        .expect("a receive can be posted");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut sreq = loop {
            if let Some(r) = B::isend(&pair.0, src.addr() as usize, size, 9, &smr).unwrap() {
                break r;
            }
            assert!(Instant::now() < deadline, "isend never found the CTS");
        };
        let mut sizes_out = [usize::MAX; 8];
        let (mut sdone, mut rdone) = (false, false);
        while !(sdone && rdone) {
            assert!(Instant::now() < deadline, "requests did not complete");
            if !sdone && B::test(&mut sreq, &mut sizes_out[..1]).unwrap() {
                assert_eq!(sizes_out[0], size);
                sdone = true;
            }
            if !rdone && B::test(&mut rreq, &mut sizes_out[..1]).unwrap() {
                assert_eq!(sizes_out[0], size, "received size");
                rdone = true;
            }
        }
        assert!(
            dst.read(0, size).unwrap() == data,
            "payload of {size} bytes"
        );
    }
    B::dereg_mr(switchless::plugin::CommRef::Send(&pair.0), smr).unwrap();
    B::dereg_mr(switchless::plugin::CommRef::Recv(&pair.1), rmr).unwrap();
}

#[test]
fn tcp_paths_carry_data_through_the_backend() {
    let b = backend(
        config(&[
            ("NCCL_SWITCHLESS_TRANSPORT", "tcp"),
            ("NCCL_SWITCHLESS_TCP_STREAMS", "6"),
        ]),
        30,
    );
    assert_eq!(b.devices().len(), 1);
    assert_eq!(b.devices()[0].ptr_support, PtrSupport::HOST);
    let mut pair = establish(&b);
    let labels = pair.0.path_labels();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(
        labels.iter().all(|l| l.contains("3 streams")),
        "6 streams per connection over 2 paths: {labels:?}"
    );
    assert_eq!(pair.1.path_labels().len(), 2);
    transfer(&mut pair, &[0, 1, 4096, 1 << 20, (3 << 20) + 77]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
}

#[test]
fn many_tcp_connections_interleave() {
    let b = backend(config(&[("NCCL_SWITCHLESS_TRANSPORT", "tcp")]), 30);
    let mut pairs: Vec<Pair> = (0..3).map(|_| establish(&b)).collect();
    for p in &mut pairs {
        transfer(p, &[100, 1 << 16]);
    }
    for (s, r) in pairs {
        B::close_send(s).unwrap();
        B::close_recv(r).unwrap();
    }
}

/// `auto` routes RoCE first and falls back to TCP on point-to-point links when no RoCE pair
/// qualifies. Two RoCE links on their own /30 are added to the fixture: up, `auto` picks them (and
/// this TCP-only factory, which opened no RDMA device, refuses to carry them); down, the connection
/// falls back to the two TCP links and carries data; `tcp` carries TCP over all four.
#[test]
fn auto_falls_back_from_roce_to_tcp_point_to_point_links() {
    let with_roce = |transport: &str, up: bool| {
        let config = config(&[("NCCL_SWITCHLESS_TRANSPORT", transport)]);
        let mut v = view(config.clone(), 30);
        // Two ends on one /30, as the TCP links: the node reaches itself from one to the other.
        for (id, addr) in [(2, "127.0.0.5/30"), (3, "127.0.0.6/30")] {
            let mut roce = link(id, addr);
            roce.kind = LinkKind::Roce;
            roce.rdma_dev = Some(format!("rxe{id}"));
            roce.gid_index = Some(1);
            roce.up = up;
            v.links.push(roce);
        }
        v.routes.push(KernelRoute {
            dest: "127.0.0.4/30".parse().unwrap(),
            gateway: None,
            ifname: "lo".into(),
            metric: 0,
        });
        Arc::new(Switchless::from_parts(NetFactory::tcp_only(config), v).unwrap())
    };
    // Up: RoCE is chosen first.
    let b = with_roce("auto", true);
    let mut h: Handle = [0; HANDLE_SIZE];
    let mut l = b.listen(&CommInfo::default(), 0, &mut h).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let e = loop {
        assert!(
            Instant::now() < deadline,
            "connect neither failed nor finished"
        );
        match b.connect(&CommInfo::default(), 0, &mut h) {
            Err(e) => break e,
            Ok(Some(c)) => panic!("auto connected although a RoCE pair was up: {c:?}"),
            Ok(None) => {}
        }
        let _ = B::accept(&mut l);
    };
    assert!(
        e.to_string().contains("a RoCE path was chosen"),
        "auto with an up RoCE pair: {e}"
    );
    // Down: TCP over the two point-to-point TCP links only.
    let b = with_roce("auto", false);
    let mut pair = establish(&b);
    for labels in [pair.0.path_labels(), pair.1.path_labels()] {
        assert_eq!(labels.len(), 2, "{labels:?}");
        assert!(
            labels
                .iter()
                .all(|l| l.starts_with("tcp") && !l.contains("127.0.0.5")),
            "{labels:?}"
        );
    }
    transfer(&mut pair, &[12345]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
    // `tcp` carries TCP on the RoCE links' netdevs too, never RDMA.
    let b = with_roce("tcp", true);
    let mut pair = establish(&b);
    let labels = pair.0.path_labels();
    assert_eq!(labels.len(), 4, "{labels:?}");
    assert!(labels.iter().all(|l| l.starts_with("tcp")), "{labels:?}");
    transfer(&mut pair, &[12345]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
}

#[test]
fn a_wide_subnet_is_no_tcp_data_path_without_fallback() {
    // 127.0.0.x/8 stands for a management LAN: not point-to-point.
    for transport in ["tcp", "auto"] {
        let b = backend(config(&[("NCCL_SWITCHLESS_TRANSPORT", transport)]), 8);
        let mut h: Handle = [0; HANDLE_SIZE];
        let _l = b.listen(&CommInfo::default(), 0, &mut h).unwrap();
        // At once: the first call fails without I/O (no TCP pair qualifies); a connect that waited
        // for the listener would wait for it (no connect deadline by default).
        let t = Instant::now();
        let e = b.connect(&CommInfo::default(), 0, &mut h).unwrap_err();
        assert!(
            t.elapsed() < bounds::AT_ONCE,
            "fails at once: {:?}",
            t.elapsed()
        );
        assert!(matches!(e, Error::InvalidUsage(_)), "{transport}: {e}");
        assert!(e.to_string().contains("127.0.0."), "{e}");
        assert_eq!(b.connecting(), 0);
    }
    // With the fallback the same subnet carries the connection.
    let b = backend(
        config(&[
            ("NCCL_SWITCHLESS_TRANSPORT", "tcp"),
            ("NCCL_SWITCHLESS_TCP_FALLBACK", "1"),
        ]),
        8,
    );
    let mut pair = establish(&b);
    transfer(&mut pair, &[1 << 20]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
}

#[test]
fn the_fallback_keeps_point_to_point_links_alone() {
    // With the fallback on and a point-to-point link present, the wide subnet is not added.
    let b = backend(
        config(&[
            ("NCCL_SWITCHLESS_TRANSPORT", "tcp"),
            ("NCCL_SWITCHLESS_TCP_FALLBACK", "1"),
        ]),
        30,
    );
    let mut pair = establish(&b);
    assert_eq!(pair.0.path_labels().len(), 2);
    transfer(&mut pair, &[777]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
}

/// Two nodes that share no subnet: A has 127.0.1.1/30, B has 127.0.2.2/30, and each has a kernel
/// route to the other's subnet through a neighbour (127.0.1.2, 127.0.2.1) — a ring non-neighbour
/// seen through its routing table. On this host all of 127/8 is local, so the sockets connect.
fn routed_backend(me: &str, gw: &str, far: &str, vars: &[(&str, &str)]) -> Arc<B> {
    let config = config(vars);
    let mine: ipnet::Ipv4Net = me.parse().unwrap();
    let view = HostView {
        config: config.clone(),
        devices: vec![device()],
        links: vec![link(0, me)],
        routes: vec![
            KernelRoute {
                dest: mine.trunc(),
                gateway: None,
                ifname: "lo".into(),
                metric: 0,
            },
            KernelRoute {
                dest: far.parse().unwrap(),
                gateway: Some(gw.parse().unwrap()),
                ifname: "lo".into(),
                metric: 0,
            },
        ],
    };
    Arc::new(Switchless::from_parts(NetFactory::tcp_only(config), view).unwrap())
}

/// `a` connects to a listener of `b`; returns what `a`'s connect finally said (accept is driven too).
fn connect_across(a: &Arc<B>, b: &Arc<B>) -> Result<Pair, Error> {
    let mut h: Handle = [0; HANDLE_SIZE];
    let mut l = b.listen(&CommInfo::default(), 0, &mut h).unwrap();
    let (mut s, mut r) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.is_none() || r.is_none() {
        assert!(Instant::now() < deadline, "set-up did not finish");
        if s.is_none() {
            s = a.connect(&CommInfo::default(), 0, &mut h)?;
        }
        if r.is_none() {
            r = B::accept(&mut l).unwrap();
        }
    }
    B::close_listen(l).unwrap();
    Ok((s.unwrap(), r.unwrap()))
}

#[test]
fn the_fallback_reaches_a_non_neighbour_through_a_kernel_route() {
    let tcp = ("NCCL_SWITCHLESS_TRANSPORT", "tcp");
    let fb = ("NCCL_SWITCHLESS_TCP_FALLBACK", "1");
    let a = routed_backend("127.0.1.1/30", "127.0.1.2", "127.0.2.0/30", &[tcp, fb]);
    let b = routed_backend("127.0.2.2/30", "127.0.2.1", "127.0.1.0/30", &[tcp, fb]);
    let mut pair = connect_across(&a, &b).unwrap();
    let labels = pair.0.path_labels();
    assert_eq!(labels.len(), 1, "{labels:?}");
    assert!(labels[0].contains("127.0.2.2"), "{labels:?}");
    transfer(&mut pair, &[0, 3, 1 << 20, (1 << 21) + 5]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
    // And back, B to A.
    let mut pair = connect_across(&b, &a).unwrap();
    transfer(&mut pair, &[4096]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
}

#[test]
fn a_routed_path_needs_the_fallback_on_both_ends() {
    let tcp = ("NCCL_SWITCHLESS_TRANSPORT", "tcp");
    let fb = ("NCCL_SWITCHLESS_TCP_FALLBACK", "1");
    let b_plain = routed_backend("127.0.2.2/30", "127.0.2.1", "127.0.1.0/30", &[tcp]);
    // Connector without the fallback: the clear no-path error at once, naming the routed peer.
    let a_plain = routed_backend("127.0.1.1/30", "127.0.1.2", "127.0.2.0/30", &[tcp]);
    // At once: no routed pair without the fallback, decided without I/O; waiting for the peer
    // would wait for it (no connect deadline by default).
    let t = Instant::now();
    let e = connect_across(&a_plain, &b_plain).expect_err("no path");
    assert!(t.elapsed() < bounds::AT_ONCE, "{:?}", t.elapsed());
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
    assert!(
        e.to_string().contains("no local link reaches the peer"),
        "{e}"
    );
    assert!(e.to_string().contains("127.0.2.2/30"), "{e}");
    // Connector with it, acceptor without: the acceptor's reject reaches the connector.
    let a = routed_backend("127.0.1.1/30", "127.0.1.2", "127.0.2.0/30", &[tcp, fb]);
    let e = connect_across(&a, &b_plain).expect_err("rejected");
    let t = e.to_string();
    assert!(
        t.contains("NCCL_SWITCHLESS_TCP_FALLBACK=1 on the acceptor too"),
        "{t}"
    );
    assert_eq!(a.connecting(), 0);
    // Without a route the fallback finds nothing either, and says so.
    let lonely = routed_backend("127.0.1.1/30", "127.0.1.2", "127.0.9.0/30", &[tcp, fb]);
    let e = connect_across(&lonely, &b_plain).expect_err("no route");
    assert!(
        e.to_string()
            .contains("found no shared IPv4 subnet or kernel route"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("the kernel has no route to 127.0.2.2"),
        "{e}"
    );
}

#[test]
fn the_fallback_warning_names_gateways_and_the_bandwidth_to_expect() {
    use switchless::plugin::switchless::report::fallback_warning;
    use switchless::route::{KindFilter, Reach, RouteOptions, select};
    let mut a = link(0, "10.0.0.1/30");
    a.netdev = "to2".into();
    let routes = vec![
        KernelRoute {
            dest: "10.0.0.0/30".parse().unwrap(),
            gateway: None,
            ifname: "to2".into(),
            metric: 0,
        },
        KernelRoute {
            dest: "0.0.0.0/0".parse().unwrap(),
            gateway: Some("10.0.0.2".parse().unwrap()),
            ifname: "to2".into(),
            metric: 0,
        },
    ];
    let peer = vec![switchless::route::types::RemoteLink {
        addr: "10.0.5.2/30".parse().unwrap(),
        phys_port_id: 0,
        pci_root_id: 0,
        kind: LinkKind::Tcp,
    }];
    let opts = RouteOptions {
        kinds: KindFilter::Tcp,
        reach: Reach::Routed,
        ..RouteOptions::default()
    };
    let sel = select(std::slice::from_ref(&a), &routes, &peer, &opts).unwrap();
    let w = fallback_warning("peer 10.0.5.2", &sel);
    assert!(
        w.contains("to2 10.0.0.1/30 -> 10.0.5.2/30 via 10.0.0.2 (10000 Mb/s link)"),
        "{w}"
    );
    assert!(w.contains("expect at most 10.0 Gb/s"), "{w}");
    assert!(w.contains("forwarding host's CPU"), "{w}");
    // A link whose speed the kernel does not report (virtio, some management ports): no "0.0 Gb/s".
    a.speed_mbps = 0;
    let sel = select(std::slice::from_ref(&a), &routes, &peer, &opts).unwrap();
    let w = fallback_warning("peer 10.0.5.2", &sel);
    assert!(w.contains("(link speed unknown)"), "{w}");
    assert!(!w.contains("0.0 Gb/s"), "{w}");
    // What a timeout over that path will add: the gateway to check.
    let h = switchless::plugin::switchless::report::routed_hint(&sel.paths);
    assert!(
        h.contains("via 10.0.0.2 (for 10.0.0.1 -> 10.0.5.2)") && h.contains("ip_forward=1"),
        "{h}"
    );
    // On-link paths need no such hint.
    let on_link = vec![switchless::route::types::RemoteLink {
        addr: "10.0.0.2/30".parse().unwrap(),
        ..peer[0]
    }];
    let sel = select(std::slice::from_ref(&a), &routes, &on_link, &opts).unwrap();
    assert_eq!(sel.paths[0].via, None);
    assert_eq!(
        switchless::plugin::switchless::report::routed_hint(&sel.paths),
        ""
    );
}

/// A backend whose one TCP link is `me` (a /30 whose far end advertises nothing here) and whose device
/// advertises `ptr_support`.
fn lone_backend(me: &str, ptr_support: u32, vars: &[(&str, &str)]) -> Arc<B> {
    let config = config(vars);
    let mine: ipnet::Ipv4Net = me.parse().unwrap();
    let mut dev = device();
    dev.ptr_support = ptr_support;
    let view = HostView {
        config: config.clone(),
        devices: vec![dev],
        links: vec![link(0, me)],
        routes: vec![KernelRoute {
            dest: mine.trunc(),
            gateway: None,
            ifname: "lo".into(),
            metric: 0,
        }],
    };
    Arc::new(Switchless::from_parts(NetFactory::tcp_only(config), view).unwrap())
}

#[test]
fn a_peer_on_this_host_connects_over_tcp_to_the_links_own_address() {
    // Two ranks of one host advertise the same addresses; the /30's far end (127.0.5.6) is no
    // rank's. NCCL connects them over the network when P2P and SHM are off.
    let b = lone_backend("127.0.5.5/30", 1, &[]);
    let mut pair = establish(&b);
    let labels = pair.0.path_labels();
    assert_eq!(labels.len(), 1, "{labels:?}");
    assert!(labels[0].contains("127.0.5.5"), "{labels:?}");
    transfer(&mut pair, &[0, 7, 1 << 20]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
}

#[test]
fn a_peer_on_this_host_with_a_management_subnet_connects_over_the_point_to_point_link() {
    // As in netns and on real nodes: the handle also advertises the management /24, which TCP
    // selection never uses for data; it must not hide that the peer is this host (before: "no local
    // link reaches the peer ... which is this link's own address").
    for transport in ["tcp", "auto"] {
        let config = config(&[("NCCL_SWITCHLESS_TRANSPORT", transport)]);
        let view = HostView {
            config: config.clone(),
            devices: vec![device()],
            links: vec![link(0, "127.0.9.1/24"), link(1, "127.0.5.5/30")],
            routes: ["127.0.9.0/24", "127.0.5.4/30"]
                .iter()
                .map(|d| KernelRoute {
                    dest: d.parse().unwrap(),
                    gateway: None,
                    ifname: "lo".into(),
                    metric: 0,
                })
                .collect(),
        };
        let b: Arc<B> =
            Arc::new(Switchless::from_parts(NetFactory::tcp_only(config), view).unwrap());
        let mut pair = establish(&b);
        let labels = pair.0.path_labels();
        assert_eq!(labels.len(), 1, "{transport}: {labels:?}");
        assert!(labels[0].contains("127.0.5.5"), "{transport}: {labels:?}");
        transfer(&mut pair, &[7, 1 << 20]);
        B::close_send(pair.0).unwrap();
        B::close_recv(pair.1).unwrap();
    }
}

/// Drives `a`'s connect to a listener of `b` and `b`'s accept; returns both outcomes (the first
/// error each side reported).
fn try_across(
    a: &Arc<B>,
    b: &Arc<B>,
) -> (
    Result<<B as Backend>::Send, Error>,
    Result<<B as Backend>::Recv, Error>,
) {
    let mut h: Handle = [0; HANDLE_SIZE];
    let mut l = b.listen(&CommInfo::default(), 0, &mut h).unwrap();
    let (mut s, mut r) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.is_none() || r.is_none() {
        assert!(
            Instant::now() < deadline,
            "set-up neither finished nor failed"
        );
        if s.is_none() {
            match a.connect(&CommInfo::default(), 0, &mut h) {
                Ok(Some(c)) => s = Some(Ok(c)),
                Ok(None) => {}
                Err(e) => s = Some(Err(e)),
            }
        }
        if r.is_none() {
            match B::accept(&mut l) {
                Ok(Some(c)) => r = Some(Ok(c)),
                Ok(None) => {}
                Err(e) => r = Some(Err(e)),
            }
        }
        if matches!(s, Some(Err(_))) && r.is_none() {
            // The connector gave up before sending a hello: nothing will arrive.
            r = Some(Err(Error::Timeout("no hello".into())));
        }
    }
    (s.unwrap(), r.unwrap())
}

/// GB10 (review N2): the NIC advertises GPU memory (it passes the DMA-BUF probe) but its GPU has
/// no GPU-direct RDMA, so NCCL never registers GPU memory there. A device advertising CUDA or
/// DMA-BUF therefore connects over TCP, as connector and as acceptor, and moves host memory; only a
/// GPU registration on such a connection, which shows that NCCL did choose GPU-direct, is refused,
/// naming the connection's paths and the remedy.
#[test]
fn a_device_advertising_gpu_memory_connects_over_tcp_and_refuses_only_gpu_registrations() {
    use switchless::plugin::CommRef;
    let host = lone_backend("127.0.6.2/30", 1, &[]);
    for ptr in [1 | 2, 1 | 4, 1 | 2 | 4] {
        let gpu = lone_backend("127.0.6.1/30", ptr, &[]);
        for (a, b) in [(&gpu, &host), (&host, &gpu)] {
            let (s, r) = try_across(a, b);
            let mut pair = (s.unwrap(), r.unwrap());
            transfer(&mut pair, &[4096, 1 << 20]);
            let buf = HostBuffer::new(1 << 16).unwrap();
            let cuda = Region {
                mem: buf.lend(),
                kind: PtrSupport::CUDA,
            };
            let e = B::reg_mr(CommRef::Recv(&pair.1), cuda).unwrap_err();
            assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
            let m = e.to_string();
            for want in [
                "NCCL registered GPU memory (NCCL_PTR_CUDA)",
                "on a connection whose paths are TCP",
                "127.0.6",
                "NCCL_NET_GDR_LEVEL=LOC",
            ] {
                assert!(m.contains(want), "{want:?} missing from: {m}");
            }
            let null = std::fs::File::open("/dev/null").unwrap();
            let dmabuf = Region {
                mem: buf.lend(),
                kind: PtrSupport::DMABUF,
            };
            let e = B::reg_mr_dmabuf(CommRef::Send(&pair.0), dmabuf, 0, null.as_fd())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("DMA-BUF") && e.contains("NCCL_NET_GDR_LEVEL=LOC"),
                "{e}"
            );
            // The connection is unharmed: host memory still moves.
            transfer(&mut pair, &[4096]);
            B::close_send(pair.0).unwrap();
            B::close_recv(pair.1).unwrap();
        }
    }
}

/// A communicator's relay service (issue 30): `init` with NCCL's communicator id (ABI v11+) makes
/// the backend serve relays on its point-to-point links at `port_for(id)`, and dropping what `init`
/// kept (at `finalize`) stops it. No id (the v6–v10 legacy context) or `NCCL_SWITCHLESS_RELAY=off`:
/// no service.
#[test]
fn the_relay_service_lives_from_init_to_finalize() {
    let id = 0x5357_5445_5354_0000 | u64::from(std::process::id());
    let port = switchless::transport::relay::port_for(id);
    let taken = || std::net::TcpListener::bind(("127.0.0.1", port)).is_err();
    assert!(!taken(), "port {port} is in use before the test");
    let comm = CommInfo {
        comm_id: Some(id),
        traffic_class: None,
    };
    let b = backend(config(&[]), 30);
    let guard = b.attach(&comm).unwrap();
    assert!(guard.is_some(), "no relay service for a v11+ communicator");
    assert!(taken(), "the relay service does not listen on port {port}");
    drop(guard);
    assert!(!taken(), "the relay service still listens after finalize");

    assert!(b.attach(&CommInfo::default()).unwrap().is_none());
    let off = backend(config(&[("NCCL_SWITCHLESS_RELAY", "off")]), 30);
    assert!(off.attach(&comm).unwrap().is_none());
    assert!(!taken());
}

/// A peer no cable reaches, with `NCCL_SWITCHLESS_RELAY=always`: every neighbour's relay is asked
/// (here the far end of 127.0.0.1/30, where no relay listens), and the connection fails naming
/// it and why, without taking the TCP fallback that is on.
#[test]
fn relay_always_fails_naming_every_neighbour_asked_without_falling_back() {
    use switchless::route::handle::{Handle as HandleView, HandleRepr};
    use switchless::route::types::RemoteLink;
    let b = backend(
        config(&[
            ("NCCL_SWITCHLESS_RELAY", "always"),
            ("NCCL_SWITCHLESS_TCP_FALLBACK", "1"),
        ]),
        30,
    );
    let repr = HandleRepr {
        nonce: 7,
        port: 40000,
        control: None,
        links: vec![RemoteLink {
            addr: "10.99.0.2/30".parse().unwrap(),
            phys_port_id: 0,
            pci_root_id: 0,
            kind: LinkKind::Tcp,
        }],
    };
    let mut h: Handle = [0; HANDLE_SIZE];
    repr.emit(&mut HandleView::new_unchecked(&mut h[..]))
        .unwrap();
    let comm = CommInfo {
        comm_id: Some(0x5357_5445_5354_0001),
        traffic_class: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let e = loop {
        assert!(Instant::now() < deadline, "connect did not fail");
        match b.connect(&comm, 0, &mut h) {
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Ok(Some(_)) => panic!("connected to a peer nothing reaches"),
            Err(e) => break e.to_string(),
        }
    };
    let port = switchless::transport::relay::port_for(0x5357_5445_5354_0001);
    assert!(e.contains("no local link reaches the peer"), "{e}");
    assert_eq!(e.matches("invalid configuration").count(), 1, "{e}");
    assert!(e.contains(&format!("relay 127.0.0.2:{port}")), "{e}");
    assert!(
        e.contains("NCCL_SWITCHLESS_RELAY=always allows no fallback"),
        "{e}"
    );
}

/// A host of a three-host full mesh on 127/8: one TCP point-to-point link per neighbour (each its
/// own /30, routed on `lo`).
fn mesh_backend(links: &[&str], vars: &[(&str, &str)]) -> Arc<B> {
    let config = config(vars);
    let view = HostView {
        config: config.clone(),
        devices: vec![device()],
        links: links.iter().enumerate().map(|(i, a)| link(i, a)).collect(),
        routes: links
            .iter()
            .map(|a| KernelRoute {
                dest: a.parse::<ipnet::Ipv4Net>().unwrap().trunc(),
                gateway: None,
                ifname: "lo".into(),
                metric: 0,
            })
            .collect(),
    };
    Arc::new(Switchless::from_parts(NetFactory::tcp_only(config), view).unwrap())
}

/// The send connections' paths of `b` as (kind, weight in Mb/s, bytes sent), sorted by kind.
fn path_weights(b: &Arc<B>) -> Vec<(String, u64, u64)> {
    let mut v: Vec<(String, u64, u64)> = b
        .metrics_snapshot()
        .connections
        .iter()
        .filter(|c| c.direction == "send")
        .flat_map(|c| c.paths.iter())
        .map(|p| (p.id.kind.clone(), p.weight_mbps, p.sent_bytes))
        .collect();
    v.sort();
    v
}

/// Communicator `tag` of this test process (the relay port is derived from the id: one per test).
fn mesh_comm(tag: u64) -> CommInfo {
    CommInfo {
        comm_id: Some(tag << 16 | u64::from(std::process::id() & 0xffff)),
        traffic_class: None,
    }
}

/// A transfer hint: all-reduce over `algo` (`BIT(NCCL_ALGO_*)`), `proto` if named, `peers`
/// concurrent peers each way.
fn coll_hint(algo: u32, proto: Option<u32>, peers: i32) -> switchless::plugin::NetAttr {
    let few = switchless::plugin::CommAttr {
        max_concurrent_peers: Some(peers),
        ..Default::default()
    };
    switchless::plugin::NetAttr {
        send: few,
        recv: few,
        op: Some(1 << 4), // all-reduce
        algo: Some(algo),
        proto,
    }
}

/// `a` connects to a listener of `b` for communicator `comm`.
fn connect_comm(a: &Arc<B>, b: &Arc<B>, comm: &CommInfo) -> Pair {
    let mut h: Handle = [0; HANDLE_SIZE];
    let mut l = b.listen(comm, 0, &mut h).unwrap();
    let (mut s, mut r) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.is_none() || r.is_none() {
        assert!(Instant::now() < deadline, "set-up did not finish");
        if s.is_none() {
            s = a.connect(comm, 0, &mut h).unwrap();
        }
        if r.is_none() {
            r = B::accept(&mut l).unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    B::close_listen(l).unwrap();
    (s.unwrap(), r.unwrap())
}

/// Issue 30 item 3, the mesh policy: on a full mesh of three hosts A, K, B (one cable per pair),
/// a connection A → B whose communicator's latest `setNetAttr` hint says Ring (collective op,
/// Simple, one peer each way) gets a relay path through K next to its direct one, and moves
/// verified data over both, as does NCCL's own connect-time hint of a collective connection (no
/// op, algo or proto; at most 4 peers); an alltoall (p2p) hint, no hint, or
/// `NCCL_SWITCHLESS_RELAY=off` on A: the direct path only.
#[test]
fn a_ring_hint_on_a_full_mesh_adds_a_relay_path_an_alltoall_hint_does_not() {
    use switchless::plugin::{CommAttr, NetAttr};
    let comm = mesh_comm(0x5357_4d45_5348);
    let tcp = ("NCCL_SWITCHLESS_TRANSPORT", "tcp");
    // A's weights held at their start, so the split and the floor read exactly (they adapt from
    // there by default; the failback test below runs with adaptive weights).
    let nominal = ("NCCL_SWITCHLESS_ADAPTIVE_WEIGHTS", "0");
    let a = mesh_backend(&["127.0.1.1/30", "127.0.3.1/30"], &[tcp, nominal]);
    let k = mesh_backend(&["127.0.1.2/30", "127.0.2.1/30"], &[tcp]);
    let b = mesh_backend(&["127.0.2.2/30", "127.0.3.2/30"], &[tcp]);
    let a_off = mesh_backend(
        &["127.0.1.1/30", "127.0.3.1/30"],
        &[tcp, ("NCCL_SWITCHLESS_RELAY", "off")],
    );
    // One relay service per host (init of the communicator).
    let guards: Vec<_> = [&a, &k, &b]
        .iter()
        .map(|x| x.attach(&comm).unwrap())
        .collect();
    assert!(guards.iter().all(Option::is_some));
    let ring = coll_hint(1 << 1, Some(1 << 2), 1); // NCCL_ALGO_RING, NCCL_PROTO_SIMPLE
    let alltoall = NetAttr {
        send: CommAttr {
            max_concurrent_peers: Some(16),
            ..CommAttr::default()
        },
        recv: ring.recv,
        op: Some(1 << 8),
        algo: None,
        proto: None,
    };

    // No hint yet: direct only.
    let pair = connect_comm(&a, &b, &comm);
    assert_eq!(pair.0.path_labels().len(), 1, "{:?}", pair.0.path_labels());
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();

    // Ring: the direct path and one through K.
    a.set_net_attr(&comm, &ring).unwrap();
    // Every thread's events (tests run in parallel: a scoped capture can miss a callsite).
    let logs = logs::Logs::global();
    let mut pair = connect_comm(&a, &b, &comm);
    // Each end's INFO line names the relay; a TCP path shows no RoCE fields (GID, root, QPs).
    // Every connection of this test binary is TCP, so no line of any test may show them.
    for (verb, relay) in [
        ("connected to peer 127.0.2.2/30", "-> 127.0.2.2 via relay"),
        (
            "accepted from connector 127.0.3.1",
            "-> 127.0.2.1 via relay 127.0.2.1",
        ),
    ] {
        let lines = logs.find(tracing::Level::INFO, verb);
        assert!(lines.iter().any(|l| l.contains(relay)), "{lines:?}");
        for l in &lines {
            assert!(l.contains(" tcp 127.0."), "{l}");
            for roce in [" gid ", " root ", " qp "] {
                assert!(!l.contains(roce), "{l}");
            }
        }
    }
    let labels = pair.0.path_labels();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(
        labels
            .iter()
            .any(|l| l.contains("127.0.3.2") && !l.contains("relay")),
        "{labels:?}"
    );
    assert!(labels.iter().any(|l| l.contains("relay")), "{labels:?}");
    assert_eq!(pair.1.path_labels().len(), 2, "{:?}", pair.1.path_labels());
    // Below the 512 KiB floor: the direct path alone.
    transfer(
        &mut pair,
        &[0, 100, 64 << 10, 300 << 10, (512 << 10) - 4096],
    );
    let after_small = path_weights(&a);
    eprintln!("after small: {after_small:?}");
    // The split as stripe weights: the relay path half the direct one (10 Gb/s links here).
    assert_eq!(after_small[0].1, 5_000, "{after_small:?}");
    assert_eq!(after_small[1].1, 10_000, "{after_small:?}");
    assert_eq!(
        after_small[0].2, 0,
        "relay carried a small message: {after_small:?}"
    );
    assert!(after_small[1].2 > 0, "{after_small:?}");
    // From the floor on: both paths.
    transfer(&mut pair, &[1 << 20, (4 << 20) + 77]);
    let after_big = path_weights(&a);
    eprintln!("after big: {after_big:?}");
    assert!(after_big[0].2 > 0, "relay carried nothing: {after_big:?}");
    assert!(after_big[1].2 > after_small[1].2, "{after_big:?}");
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();

    // The hint NCCL itself gives right before it connects a collective (ring, tree) connection
    // (`populateCommNetAttrs`, NCCL 2.30 net.cc): op, algo and proto undefined, min(4, ranks)
    // peers, its channels as flows. NCCL names the algorithm only per transfer, after connecting.
    let coll = CommAttr {
        max_concurrent_peers: Some(3),
        min_concurrent_peers: Some(1),
        max_flows_per_peer: Some(2),
        min_flows_per_peer: Some(1),
    };
    let collective_connect = NetAttr {
        send: coll,
        recv: coll,
        op: None,
        algo: None,
        proto: None,
    };
    a.set_net_attr(&comm, &collective_connect).unwrap();
    let mut pair = connect_comm(&a, &b, &comm);
    let labels = pair.0.path_labels();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(labels.iter().any(|l| l.contains("relay")), "{labels:?}");
    let before = path_weights(&a);
    transfer(&mut pair, &[(2 << 20) + 5]);
    let after = path_weights(&a);
    assert!(after[0].2 > before[0].2, "relay carried nothing: {after:?}");
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();

    // Alltoall: direct only, even after a ring hint earlier.
    a.set_net_attr(&comm, &alltoall).unwrap();
    let pair = connect_comm(&a, &b, &comm);
    assert_eq!(pair.0.path_labels().len(), 1, "{:?}", pair.0.path_labels());
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();

    // RELAY=off on A: never, whatever the hint.
    a_off.set_net_attr(&comm, &ring).unwrap();
    assert!(a_off.attach(&comm).unwrap().is_none());
    let pair = connect_comm(&a_off, &b, &comm);
    assert_eq!(pair.0.path_labels().len(), 1, "{:?}", pair.0.path_labels());
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
    drop(guards);
}

/// The send connections' paths of `b` as (kind, state).
fn path_states(b: &Arc<B>) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = b
        .metrics_snapshot()
        .connections
        .iter()
        .filter(|c| c.direction == "send")
        .flat_map(|c| c.paths.iter())
        .map(|p| (p.id.kind.clone(), p.state.clone()))
        .collect();
    v.sort();
    v
}

/// A mesh connection's relay path fails over when its relay host leaves (K's communicator is
/// finalized: its relay service stops and cuts the legs) and back when it returns (K's `init`
/// again, same port): the direct path carries on meanwhile, then both carry verified data again.
#[test]
fn a_mesh_relay_path_fails_back_when_its_relay_host_returns() {
    let comm = mesh_comm(0x5357_4642_4143);
    let vars = [
        ("NCCL_SWITCHLESS_TRANSPORT", "tcp"),
        ("NCCL_SWITCHLESS_FAILBACK_INTERVAL", "200ms"),
        ("NCCL_SWITCHLESS_FAILBACK_BACKOFF", "50ms"),
    ];
    let a = mesh_backend(&["127.0.4.1/30", "127.0.6.1/30"], &vars);
    let k = mesh_backend(&["127.0.4.2/30", "127.0.5.1/30"], &vars);
    let b = mesh_backend(&["127.0.5.2/30", "127.0.6.2/30"], &vars);
    let ga = a.attach(&comm).unwrap();
    let gb = b.attach(&comm).unwrap();
    let gk = k.attach(&comm).unwrap();
    a.set_net_attr(&comm, &coll_hint(1 << 0, None, 2)) // NCCL_ALGO_TREE
        .unwrap();
    let mut pair = connect_comm(&a, &b, &comm);
    assert_eq!(pair.0.path_labels().len(), 2, "{:?}", pair.0.path_labels());
    transfer(&mut pair, &[1 << 20, 2 << 20]);
    let up = vec![
        ("relay".to_string(), "up".to_string()),
        ("tcp".into(), "up".into()),
    ];
    assert_eq!(path_states(&a), up);
    // K leaves: its relay service stops, the relay path goes down, the direct one carries on.
    drop(gk);
    let t = Instant::now();
    while path_states(&a)[0].1 == "up" {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{:?}",
            path_states(&a)
        );
        transfer(&mut pair, &[1 << 20]);
    }
    transfer(&mut pair, &[1 << 20, 3 << 20]);
    // K returns: failback rebuilds the path through it.
    let gk = k.attach(&comm).unwrap();
    assert!(gk.is_some());
    let t = Instant::now();
    while path_states(&a) != up {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no failback: {:?}",
            path_states(&a)
        );
        transfer(&mut pair, &[1 << 20]);
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = path_weights(&a)[0].2;
    transfer(&mut pair, &[2 << 20, 4 << 20, 4 << 20]);
    let after = path_weights(&a)[0].2;
    assert!(
        after > before,
        "the relay path carries nothing after failback: {before} -> {after}"
    );
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
    drop((ga, gb, gk));
}

/// The mesh policy with a neighbour that serves no relay (its rank did not `init` the
/// communicator): the extra relay path is given up after `MESH_PROBE_WAIT` (1 s), not the 10 s a
/// peer no cable reaches waits for its relays, and the connection goes direct.
#[test]
fn a_mesh_neighbour_without_a_relay_costs_a_second_not_ten() {
    let comm = mesh_comm(0x5357_4e4f_524c);
    let tcp = ("NCCL_SWITCHLESS_TRANSPORT", "tcp");
    let a = mesh_backend(&["127.0.7.1/30", "127.0.9.1/30"], &[tcp]);
    let b = mesh_backend(&["127.0.8.2/30", "127.0.9.2/30"], &[tcp]);
    let (ga, gb) = (a.attach(&comm).unwrap(), b.attach(&comm).unwrap());
    a.set_net_attr(&comm, &coll_hint(1 << 1, None, 1)).unwrap();
    let t = Instant::now();
    let pair = connect_comm(&a, &b, &comm);
    let took = t.elapsed();
    assert_eq!(pair.0.path_labels().len(), 1, "{:?}", pair.0.path_labels());
    // 1 s of patience plus set-up; the 10 s of a cable-less peer's probes would be far above.
    assert!(took < Duration::from_secs(6), "connect took {took:?}");
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
    drop((ga, gb));
}

/// A communicator's `setNetAttr` hint lives as long as the communicator: `finalize` of its last
/// context (the guard `attach` returned, dropped) forgets it, so a later communicator that gets the
/// same id starts with no hint (direct paths only), as any new communicator does. Two contexts of
/// one id (two ranks of a process, as NCCL's commHash is shared by a process's GPUs) share the
/// hint until the last one finalizes.
#[test]
fn finalize_of_a_communicators_last_context_forgets_its_hint() {
    let comm = mesh_comm(0x5357_4649_4e41);
    let tcp = ("NCCL_SWITCHLESS_TRANSPORT", "tcp");
    let a = mesh_backend(&["127.0.10.1/30", "127.0.12.1/30"], &[tcp]);
    let k = mesh_backend(&["127.0.10.2/30", "127.0.11.1/30"], &[tcp]);
    let b = mesh_backend(&["127.0.11.2/30", "127.0.12.2/30"], &[tcp]);
    let (gk, gb) = (k.attach(&comm).unwrap(), b.attach(&comm).unwrap());
    let ring = coll_hint(1 << 1, Some(1 << 2), 1); // NCCL_ALGO_RING, NCCL_PROTO_SIMPLE
    let paths = |what: &str| {
        let pair = connect_comm(&a, &b, &comm);
        let n = pair.0.path_labels().len();
        eprintln!("{what}: {:?}", pair.0.path_labels());
        B::close_send(pair.0).unwrap();
        B::close_recv(pair.1).unwrap();
        n
    };
    let (ga1, ga2) = (a.attach(&comm).unwrap(), a.attach(&comm).unwrap());
    assert!(ga1.is_some() && ga2.is_some());
    assert_eq!(paths("no hint"), 1);
    a.set_net_attr(&comm, &ring).unwrap();
    assert_eq!(a.hinted_comms(), 1);
    assert_eq!(paths("ring hint"), 2, "the ring hint added no relay path");
    drop(ga1);
    assert_eq!(
        paths("one context finalized"),
        2,
        "the other context lost its hint"
    );
    drop(ga2);
    assert_eq!(a.hinted_comms(), 0, "finalize kept the hint");
    // A new communicator with the same id: no hint of the finalized one.
    let ga3 = a.attach(&comm).unwrap();
    assert_eq!(
        paths("after finalize"),
        1,
        "the finalized communicator's ring hint outlived it"
    );
    drop((ga3, gk, gb));
}

/// Issue 30, a peer two relays away: a ring of six hosts n1 … n6 on 127/8 (one /30 per
/// neighbour pair), each serving relays; n1 connects to the opposite host n4, which no cable
/// and no neighbour's relay reaches. n1 asks its neighbours n2 and n6 for their other links
/// (door op 4), probes n3 through n2 and n5 through n6, and gets two relayed paths, each through
/// two relays; the INFO lines name both relays of each, n4 takes each path's streams from the
/// second relay's address on its link, and verified data of several sizes (4 MiB included)
/// crosses. When n3 (the second relay of one chain) leaves, that path fails over to the other
/// chain, and back once n3 returns (failback dials through both relays again). With
/// `NCCL_SWITCHLESS_RELAY=off` on n1 the connection fails with the no-cable error.
///
/// n3-n4 is 127.0.0.0/30 (n3 127.0.0.1, n4 127.0.0.2; n4's control address, as its first link):
/// on 127/8 the kernel sends n1's handshake from 127.0.0.1, which a relayed hello must claim
/// (from loopback, an unclaimed source is refused: `check_source`).
#[test]
fn the_opposite_host_of_a_ring_of_six_connects_through_two_relays() {
    let comm = mesh_comm(0x5357_4855_5032);
    let tcp = ("NCCL_SWITCHLESS_TRANSPORT", "tcp");
    let vars = [
        tcp,
        ("NCCL_SWITCHLESS_FAILBACK_INTERVAL", "200ms"),
        ("NCCL_SWITCHLESS_FAILBACK_BACKOFF", "50ms"),
    ];
    let ring = [
        ["127.0.161.1/30", "127.0.166.2/30"], // n1: to n2, to n6
        ["127.0.161.2/30", "127.0.162.1/30"], // n2
        ["127.0.162.2/30", "127.0.0.1/30"],   // n3
        ["127.0.0.2/30", "127.0.164.1/30"],   // n4
        ["127.0.164.2/30", "127.0.165.1/30"], // n5
        ["127.0.165.2/30", "127.0.166.1/30"], // n6
    ];
    let hosts: Vec<Arc<B>> = ring.iter().map(|l| mesh_backend(l, &vars)).collect();
    let mut guards: Vec<_> = hosts.iter().map(|h| h.attach(&comm).unwrap()).collect();
    assert!(guards.iter().all(Option::is_some));
    let logs = logs::Logs::global();
    let mut pair = connect_comm(&hosts[0], &hosts[3], &comm);
    let labels = pair.0.path_labels();
    assert_eq!(labels.len(), 2, "{labels:?}");
    // Each names both relays: `via relays <host> (K1's address) > <host> (K2's on K1's link)`.
    for (to, k1, k2) in [
        (
            "-> 127.0.0.2 via relays ",
            "(127.0.161.2) > ",
            "(127.0.162.2)",
        ),
        (
            "-> 127.0.164.1 via relays ",
            "(127.0.166.1) > ",
            "(127.0.165.1)",
        ),
    ] {
        assert!(
            labels
                .iter()
                .any(|l| l.contains(to) && l.contains(k1) && l.contains(k2)),
            "{to}{k1}{k2}: {labels:?}"
        );
    }
    let found = logs.find(tracing::Level::INFO, "relay(s) two hops away");
    assert!(
        found
            .iter()
            .any(|l| l.contains("127.0.162.2 through 127.0.161.2")
                && l.contains("127.0.165.1 through 127.0.166.1")),
        "{found:?}"
    );
    let connected = logs.find(tracing::Level::INFO, "connected to peer 127.0.0.2/30");
    assert!(
        connected
            .iter()
            .any(|l| l.contains(" > ") && l.contains("via relays")),
        "{connected:?}"
    );
    // n4 takes each path from the second relay's address on its link.
    let accepted = logs.find(tracing::Level::INFO, "accepted from connector");
    assert!(
        accepted
            .iter()
            .any(|l| l.contains("via relay 127.0.0.1") && l.contains("via relay 127.0.164.2")),
        "{accepted:?}"
    );
    assert_eq!(pair.1.path_labels().len(), 2, "{:?}", pair.1.path_labels());
    transfer(
        &mut pair,
        &[0, 1, 4096, 65_537, 1 << 20, (3 << 20) + 77, 4 << 20],
    );
    // Both chains carried bytes (the large messages are striped over both).
    let sent = path_weights(&hosts[0]);
    assert!(sent.len() == 2 && sent.iter().all(|p| p.2 > 0), "{sent:?}");
    // n3 leaves (finalize: its relay service stops and cuts its legs): the chain through it
    // goes down, the other carries on.
    let up = |h: &Arc<B>| path_states(h).iter().filter(|p| p.1 == "up").count();
    assert_eq!(up(&hosts[0]), 2, "{:?}", path_states(&hosts[0]));
    guards[2] = None;
    let t = Instant::now();
    while up(&hosts[0]) == 2 {
        assert!(t.elapsed() < Duration::from_secs(20), "no failover");
        transfer(&mut pair, &[1 << 20]);
    }
    transfer(&mut pair, &[1 << 20, 4 << 20]);
    // n3 returns: failback rebuilds the path through n2 and n3.
    guards[2] = hosts[2].attach(&comm).unwrap();
    assert!(guards[2].is_some());
    let t = Instant::now();
    while up(&hosts[0]) != 2 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no failback: {:?}",
            path_states(&hosts[0])
        );
        transfer(&mut pair, &[1 << 20]);
        std::thread::sleep(Duration::from_millis(20));
    }
    transfer(&mut pair, &[4 << 20, 4 << 20]);
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();

    // Relays off on n1: the no-cable error, as before.
    let off = mesh_backend(&ring[0], &[tcp, ("NCCL_SWITCHLESS_RELAY", "off")]);
    let mut h: Handle = [0; HANDLE_SIZE];
    let l = hosts[3].listen(&comm, 0, &mut h).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let e = loop {
        assert!(Instant::now() < deadline, "connect did not fail");
        match off.connect(&comm, 0, &mut h) {
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Ok(Some(_)) => panic!("connected with relays off to a peer no cable reaches"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(e.contains("no local link reaches the peer"), "{e}");
    B::close_listen(l).unwrap();
    drop(guards);
}
