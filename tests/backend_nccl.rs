//! What a stock NCCL expects of the plugin beyond the ABI, driven as NCCL's proxy drives it (the
//! real backend over the in-memory fabric, `plugin::init` / `listen` / `connect` / `accept` and the
//! backend's own calls): ranks of one host connect over loopback paths, GPU memory stays within
//! `NCCL_NET_GDR_LEVEL` of NCCL's device, the device table outlives the last `finalize`, and a listen
//! comm NCCL never closes does not keep the backend alive.
//!
//! Host models: links on `eth*` netdevs in 127/8 (every address is local, so the handshake's
//! sockets connect), one NCCL device per link unless a test says otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use switchless::config::Config;
use switchless::host::{Member, NcclDevice};
use switchless::plugin::{
    self, Backend, CommInfo, Endpoint, HANDLE_SIZE, Handle, HostView, MemFactory, PtrSupport,
    RecvBuf, Region, Switchless,
};
use switchless::route::types::{KernelRoute, LinkKind, LocalLink};
use switchless::sys::Lent;
use switchless::transport::memfab::{MemFab, MemFabConfig};
use tracing::Level;

#[path = "support/logs.rs"]
mod logs;
use logs::Logs;

type B = Switchless<MemFactory>;

/// `plugin::init` and `MemFactory::install` are process-wide: those tests run one at a time, and
/// every view they install starts from the same device names (the first init sets the table).
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

const ROOT_A: &str = "pci0000:00/0000:00:01.0";
const ROOT_FAR: &str = "pci0000:80/0000:80:01.0";

fn link(id: usize, addr: &str, dev: Option<usize>, root: &str) -> LocalLink {
    LocalLink {
        id,
        kind: LinkKind::Roce,
        netdev: format!("eth{id}"),
        rdma_dev: Some(format!("mem{id}")),
        port: 1,
        addr: addr.parse().unwrap(),
        gid_index: Some(1),
        pci_root: root.into(),
        phys_port_id: id as u16,
        nccl_dev: dev,
        speed_mbps: 100_000,
        mtu: 9000,
        active_mtu: 4096,
        up: true,
    }
}

fn device(index: usize, name: &str, root: &str, numa: Option<i32>, ptr: u32) -> NcclDevice {
    NcclDevice {
        index,
        name: name.into(),
        members: vec![Member {
            rdma_dev: format!("mem{index}"),
            port: 1,
            netdev: Some(format!("eth{index}")),
            pci_bdf: None,
            pci_root: Some(root.into()),
            numa_node: numa,
            speed_mbps: 100_000,
            pcie_mbps: None,
        }],
        pci_path: String::new(),
        guid: 0x1000 + index as u64,
        speed_mbps: 100_000,
        port: 1,
        latency_us: 0.0,
        max_comms: 65536,
        max_recvs: 8,
        ptr_support: ptr,
        max_p2p_bytes: 1 << 40,
        rail_id: -1,
        plane_id: -1,
        phys_port_id: index as u16,
        peers: Vec::new(),
    }
}

fn route(dest: &str, ifname: &str) -> KernelRoute {
    KernelRoute {
        dest: dest.parse().unwrap(),
        gateway: None,
        ifname: ifname.into(),
        metric: 0,
    }
}

fn config(vars: &[(&str, &str)]) -> Config {
    Config::from_vars(|n| {
        vars.iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| v.to_string())
    })
    .unwrap()
}

/// Two devices, one link each on its own /30 (the far ends, .2, are no rank's): every peer this
/// node's ranks see is this host.
fn two_cables(config: Config) -> HostView {
    HostView {
        config,
        devices: vec![
            device(0, "sl_a", ROOT_A, Some(0), 1),
            device(1, "sl_b", ROOT_FAR, Some(1), 1),
        ],
        links: vec![
            link(0, "127.0.1.1/30", Some(0), ROOT_A),
            link(1, "127.0.2.1/30", Some(1), ROOT_FAR),
        ],
        routes: vec![route("127.0.1.0/30", "eth0"), route("127.0.2.0/30", "eth1")],
    }
}

fn boxed_pair(ctx: &plugin::Context<B>, dev: i32) -> (Box<plugin::Comm<B>>, Box<plugin::Comm<B>>) {
    let mut h: Handle = [0; HANDLE_SIZE];
    let mut listen = plugin::listen(ctx, dev, &mut h).unwrap();
    let mut mine = h;
    let (mut sc, mut rc) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while sc.is_none() || rc.is_none() {
        assert!(Instant::now() < deadline, "handshake did not finish");
        if sc.is_none() {
            sc = plugin::connect(ctx, None, dev, &mut mine).unwrap();
        }
        if rc.is_none() {
            rc = plugin::accept(&mut listen).unwrap();
        }
    }
    plugin::close_listen(*listen).unwrap();
    (sc.unwrap(), rc.unwrap())
}

/// One message of `size` bytes from `sc` to `rc`, checked byte for byte.
fn transfer(fab: &MemFab, sc: &mut plugin::Comm<B>, rc: &mut plugin::Comm<B>, size: usize) {
    let src = fab.alloc(size.max(1)).unwrap();
    let dst = fab.alloc(size.max(1)).unwrap();
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    fab.write(src, &data).unwrap();
    let region = |addr: u64| Region {
        mem: Lent::simulated(addr, size.max(1)),
        kind: PtrSupport::HOST,
    };
    let smr = plugin::reg_mr(sc, region(src)).unwrap();
    let rmr = plugin::reg_mr(rc, region(dst)).unwrap();
    let rreq = plugin::irecv(
        rc,
        &[RecvBuf {
            addr: dst as usize,
            size: size.max(1),
            tag: 1,
            mr: rmr.inner(),
        }],
    )
    .unwrap()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let sreq = loop {
        if let Some(r) = plugin::isend(sc, src as usize, size, 1, &smr).unwrap() {
            break r;
        }
        assert!(Instant::now() < deadline, "isend never found the CTS");
    };
    let mut sizes = [0usize; plugin::MAX_GROUPED_RECVS];
    let (mut s, mut r) = (false, false);
    while !(s && r) {
        assert!(Instant::now() < deadline, "requests did not complete");
        s = s || plugin::test::<B>(sreq, &mut sizes).unwrap().is_some();
        if !r && plugin::test::<B>(rreq, &mut sizes).unwrap().is_some() {
            assert_eq!(sizes[0], size);
            r = true;
        }
    }
    assert_eq!(fab.read(dst, size).unwrap(), data);
    plugin::dereg_mr(sc, *smr).unwrap();
    plugin::dereg_mr(rc, *rmr).unwrap();
}

#[test]
fn a_peer_on_this_host_connects_over_a_loopback_path() {
    let _g = serial();
    let fab = MemFab::new(MemFabConfig::default());
    MemFactory::new(fab.clone(), 0).install(two_cables(Config::default()));
    let ctx = plugin::init::<B>(CommInfo::default()).unwrap();
    // Today's plugin refused this peer ("connections from a node to itself ... are not supported").
    let ((mut sc, mut rc), logs) = Logs::capture(|| boxed_pair(&ctx, 1));
    let note = logs.find(Level::INFO, "the peer is this host");
    assert_eq!(note.len(), 1, "{:#?}", logs.all());
    assert!(
        note[0].contains(
            "loopback over RoCE to each port's own GID (HCA loopback) on eth1 127.0.2.1/30"
        ),
        "{}",
        note[0]
    );
    // NCCL's device 1 reaches its own address: one path, from 127.0.2.1 to 127.0.2.1.
    let line = logs.find(Level::INFO, "connected to");
    assert_eq!(line.len(), 1, "{:#?}", logs.all());
    assert!(
        line[0].contains("[0] eth1 mem1 127.0.2.1/30 -> 127.0.2.1 "),
        "{}",
        line[0]
    );
    // The same INFO line counts NCCL's channels per cable: eth1 carried one send and one receive.
    let acc = logs.find(Level::INFO, "accepted from");
    assert!(
        acc[0].contains("NCCL channels per cable so far"),
        "{}",
        acc[0]
    );
    assert!(acc[0].ends_with("eth1 1/1"), "{}", acc[0]);
    match (sc.endpoint(), rc.endpoint()) {
        (Endpoint::Send(s), Endpoint::Recv(r)) => {
            assert_eq!(s.path_labels().len(), 1);
            assert_eq!(r.path_labels().len(), 1);
        }
        _ => panic!("wrong comm kinds"),
    }
    transfer(&fab, &mut sc, &mut rc, 1 << 20);
    plugin::close_send(*sc).unwrap();
    plugin::close_recv(*rc).unwrap();
    plugin::finalize(ctx).unwrap();
}

#[test]
fn the_device_table_outlives_the_last_finalize() {
    let _g = serial();
    let fab = MemFab::new(MemFabConfig::default());
    MemFactory::new(fab.clone(), 0).install(two_cables(Config::default()));
    let ctx = plugin::init::<B>(CommInfo::default()).unwrap();
    let names = || -> Vec<String> {
        (0..plugin::devices::<B>().unwrap() as i32)
            .map(|d| {
                plugin::properties::<B>(d)
                    .unwrap()
                    .name
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    };
    assert_eq!(names(), ["sl_a", "sl_b"]);
    plugin::finalize(ctx).unwrap();
    assert_eq!(plugin::devices::<B>().unwrap(), 0, "backend released");

    // Before the next communicator: sl_a's port went down, a new port came up and sorts first.
    let mut v = two_cables(Config::default());
    v.devices = vec![
        device(0, "sl_c", ROOT_A, Some(0), 1),
        device(1, "sl_b", ROOT_FAR, Some(1), 1),
    ];
    v.links = vec![
        link(2, "127.0.3.1/30", Some(0), ROOT_A),
        link(1, "127.0.2.1/30", Some(1), ROOT_FAR),
    ];
    v.routes = vec![route("127.0.3.0/30", "eth2"), route("127.0.2.0/30", "eth1")];
    MemFactory::new(fab.clone(), 0).install(v);
    let (ctx, logs) = Logs::capture(|| plugin::init::<B>(CommInfo::default()).unwrap());
    // NCCL still holds two devices, sl_a then sl_b: same count, order and names.
    assert_eq!(names(), ["sl_a", "sl_b"]);
    assert_eq!(plugin::properties::<B>(0).unwrap().guid, 0x1000);
    assert_eq!(
        logs.find(
            Level::WARN,
            "device 0 (sl_a) is gone since the library was loaded"
        )
        .len(),
        1,
        "{:#?}",
        logs.all()
    );
    assert_eq!(logs.find(Level::WARN, "device sl_c appeared").len(), 1);
    // A connection NCCL places on the vanished device is routed over the links that reach the peer.
    let (mut sc, mut rc) = boxed_pair(&ctx, 0);
    transfer(&fab, &mut sc, &mut rc, 4096);
    // sl_b kept index 1: a connection there uses its link only.
    let ((s1, r1), logs) = Logs::capture(|| boxed_pair(&ctx, 1));
    assert!(
        logs.find(Level::INFO, "connected to")[0].contains("[0] eth1 mem1 127.0.2.1/30"),
        "{:#?}",
        logs.all()
    );
    for c in [sc, s1] {
        plugin::close_send(*c).unwrap();
    }
    for c in [rc, r1] {
        plugin::close_recv(*c).unwrap();
    }
    plugin::finalize(ctx).unwrap();
    // Put the first view back for the other tests of this binary.
    MemFactory::new(fab, 0).install(two_cables(Config::default()));
}

#[test]
fn a_listen_comm_nccl_never_closes_does_not_keep_the_backend() {
    let _g = serial();
    let fab = MemFab::new(MemFabConfig::default());
    MemFactory::new(fab, 0).install(two_cables(Config::default()));
    let ctx = plugin::init::<B>(CommInfo::default()).unwrap();
    let backend = Arc::downgrade(ctx.backend());
    // A connection still in set-up at teardown: NCCL frees only connected connections, so the listen
    // comm is never closed and the connect is never retried.
    let mut h: Handle = [0; HANDLE_SIZE];
    let listen = plugin::listen(&ctx, 0, &mut h).unwrap();
    let mut mine = h;
    assert!(plugin::connect(&ctx, None, 0, &mut mine).unwrap().is_none());
    assert_eq!(ctx.backend().connecting(), 1, "the connect is parked");
    plugin::finalize(ctx).unwrap();
    // The last finalize released the backend and, with it, the parked connection.
    assert!(
        backend.upgrade().is_none(),
        "the listen comm kept the backend"
    );
    assert_eq!(plugin::devices::<B>().unwrap(), 0);
    // A late accept on the stale listen comm is an error or "in progress", never a crash.
    let mut listen = listen;
    match plugin::accept(&mut listen) {
        Ok(None) => {}
        Ok(Some(_)) => panic!("accepted on a finalized plugin"),
        Err(e) => assert!(e.to_string().contains("finalized"), "{e}"),
    }
    drop(listen);
}

/// Three devices: NCCL's device 0 faces no peer (its only link is on its own /30), device 1 is under
/// the same PCIe root port as device 0, device 2 under another root (NUMA `far_numa`). The peer is
/// this node; it is reached from links 1 and 2 (127/8).
fn gdr_view(config: Config, ptr: u32, far_numa: i32, near_root: &str) -> HostView {
    HostView {
        config,
        devices: vec![
            device(0, "sl_gpu", ROOT_A, Some(0), ptr),
            device(1, "sl_near", near_root, Some(0), ptr),
            device(2, "sl_far", ROOT_FAR, Some(far_numa), ptr),
        ],
        links: vec![
            link(0, "10.9.9.1/30", Some(0), ROOT_A),
            link(1, "127.0.0.1/8", Some(1), near_root),
            link(2, "127.0.0.2/8", Some(2), ROOT_FAR),
        ],
        routes: vec![
            route("10.9.9.0/30", "eth0"),
            route("127.0.0.0/8", "eth1"),
            route("127.0.0.0/8", "eth2"),
        ],
    }
}

/// Connects on NCCL's device 0 and returns the local links of the paths (from the INFO line) and the
/// captured logs.
fn paths_on_dev0(b: &Arc<B>) -> (Vec<String>, Logs) {
    let (pair, logs) = Logs::capture(|| {
        let mut h: Handle = [0; HANDLE_SIZE];
        let mut l = b.listen(&CommInfo::default(), 0, &mut h).unwrap();
        let (mut s, mut r) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.is_none() || r.is_none() {
            assert!(Instant::now() < deadline);
            if s.is_none() {
                s = b.connect(&CommInfo::default(), 0, &mut h).unwrap();
            }
            if r.is_none() {
                r = B::accept(&mut l).unwrap();
            }
        }
        (s.unwrap(), r.unwrap())
    });
    let line = logs.find(Level::INFO, "connected to");
    assert_eq!(line.len(), 1, "{:#?}", logs.all());
    let links = ["eth0", "eth1", "eth2"]
        .iter()
        .filter(|n| line[0].contains(&format!("] {n} ")))
        .map(|n| n.to_string())
        .collect();
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
    (links, logs)
}

fn gdr_backend(vars: &[(&str, &str)], ptr: u32, far_numa: i32, near_root: &str) -> Arc<B> {
    let f = MemFactory::new(MemFab::new(MemFabConfig::default()), 1);
    Arc::new(Switchless::from_parts(f, gdr_view(config(vars), ptr, far_numa, near_root)).unwrap())
}

#[test]
fn gpu_memory_stays_within_the_gdr_level_of_nccls_device() {
    const GPU: u32 = 1 | 2;
    // Host memory only: every link that reaches the peer (today's behaviour for every device).
    let (links, _) = paths_on_dev0(&gdr_backend(&[], 1, 1, ROOT_A));
    assert_eq!(links, ["eth1", "eth2"]);
    // GPU memory, NCCL's default level (PXB): only the link under device 0's root port. Today's
    // plugin used both, putting GPU memory on a NIC under another root.
    let (links, logs) = paths_on_dev0(&gdr_backend(&[], GPU, 1, ROOT_A));
    assert_eq!(links, ["eth1"], "{:#?}", logs.all());
    assert!(connector_gdr_warnings(&logs).is_empty());
    // PHB: the same NUMA node counts as near; another node does not.
    let phb = [("NCCL_NET_GDR_LEVEL", "PHB")];
    assert_eq!(
        paths_on_dev0(&gdr_backend(&phb, GPU, 0, ROOT_A)).0,
        ["eth1", "eth2"]
    );
    assert_eq!(
        paths_on_dev0(&gdr_backend(&phb, GPU, 1, ROOT_A)).0,
        ["eth1"]
    );
    // SYS: anything; LOC: NCCL never uses GPU-direct.
    for level in ["SYS", "LOC"] {
        let v = [("NCCL_NET_GDR_LEVEL", level)];
        assert_eq!(
            paths_on_dev0(&gdr_backend(&v, GPU, 1, ROOT_A)).0,
            ["eth1", "eth2"],
            "{level}"
        );
    }
    // Only distant links reach the peer: they are used, with one WARN per peer naming the penalty
    // and the remedy.
    let b = gdr_backend(&[], GPU, 1, "pci0000:40/0000:40:01.0");
    let (links, logs) = paths_on_dev0(&b);
    assert_eq!(links, ["eth1", "eth2"]);
    let w = connector_gdr_warnings(&logs);
    assert_eq!(w.len(), 1, "{:#?}", logs.all());
    for want in [
        "NCCL chose device 0 (sl_gpu)",
        "no link within NCCL_NET_GDR_LEVEL=P2C (NCCL's default, PXB without C2C)",
        "eth1 127.0.0.1/8 (PCIe root pci0000:40/0000:40:01.0: through the CPU's host bridge (PHB))",
        "eth2 127.0.0.2/8 (PCIe root pci0000:80/0000:80:01.0: across the CPU interconnect",
        "well below the links' rate",
        "NCCL_TOPO_FILE",
        "NCCL_CROSS_NIC",
        "NCCL_NET_GDR_LEVEL=PHB or SYS",
    ] {
        assert!(w[0].contains(want), "{want:?} missing from: {}", w[0]);
    }
    let (_, logs) = paths_on_dev0(&b);
    assert!(
        connector_gdr_warnings(&logs).is_empty(),
        "one WARN per peer"
    );
}

/// The connecting side's GPU-direct warnings (the accepting side's say "accept from"; in these
/// one-host tests its end of a path is the peer's link).
fn connector_gdr_warnings(logs: &Logs) -> Vec<String> {
    logs.find(Level::WARN, "GPU-direct")
        .into_iter()
        .filter(|m| !m.contains("accept from"))
        .collect()
}

#[test]
fn channels_are_counted_per_cable_not_per_function() {
    use switchless::plugin::PathPlan;
    use switchless::plugin::switchless::report::CableCounts;
    let plan = |id: usize, phys: u16| {
        let mut l = link(id, &format!("127.0.{id}.1/30"), Some(0), ROOT_A);
        l.phys_port_id = phys;
        PathPlan {
            remote: l.addr.addr(),
            kind: l.kind,
            local: l,
            relay: None,
        }
    };
    let mut c = CableCounts::default();
    // A GB10 port: two PCIe functions (eth0, eth1) on one cage: one channel on one cable.
    c.add(&[plan(0, 3), plan(1, 3)], true);
    c.add(&[plan(0, 3), plan(1, 3)], false);
    // NCCL_IB_QPS_PER_CONNECTION repeats a link: still one channel.
    c.add(&[plan(2, 5), plan(2, 5)], true);
    // TCP links without a cage count per netdev.
    c.add(&[plan(4, u16::MAX), plan(5, u16::MAX)], false);
    assert_eq!(c.summary(), "eth0+eth1 1/1, eth2 1/0, eth4 0/1, eth5 0/1");
}

/// Connects on NCCL's device `conn` to a listener on device `acc` of the same backend; returns the
/// captured logs (the pair is closed).
fn pair_on(b: &Arc<B>, conn: usize, acc: usize) -> Logs {
    let (pair, logs) = Logs::capture(|| {
        let mut h: Handle = [0; HANDLE_SIZE];
        let mut l = b.listen(&CommInfo::default(), acc, &mut h).unwrap();
        let (mut s, mut r) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.is_none() || r.is_none() {
            assert!(Instant::now() < deadline);
            if s.is_none() {
                s = b.connect(&CommInfo::default(), conn, &mut h).unwrap();
            }
            if r.is_none() {
                r = B::accept(&mut l).unwrap();
            }
        }
        (s.unwrap(), r.unwrap())
    });
    B::close_send(pair.0).unwrap();
    B::close_recv(pair.1).unwrap();
    logs
}

/// The accepting side applies `NCCL_NET_GDR_LEVEL` to its own end of each path: NCCL decided
/// GPU-direct for the device it listens on, the connector chose the paths from its side. A path
/// ending here on a NIC under another root (and NUMA node) than the listening device is named in
/// one WARN per peer, with what the connection does with it. Before, only the connector looked.
#[test]
fn the_accepting_side_names_paths_beyond_its_gdr_level() {
    const GPU: u32 = 1 | 2;
    // Connector on device 1 (its link eth1 reaches the peer, under ROOT_A); on this one host the
    // path's other end is eth2 (under ROOT_FAR, another NUMA node), and the acceptor listens on
    // device 1 (sl_near, ROOT_A).
    let b = gdr_backend(&[], GPU, 1, ROOT_A);
    let logs = pair_on(&b, 1, 1);
    let w: Vec<String> = logs
        .find(Level::WARN, "GPU-direct")
        .into_iter()
        .filter(|m| m.contains("accept from"))
        .collect();
    assert_eq!(w.len(), 1, "{:#?}", logs.all());
    for want in [
        "NCCL chose device 1 (sl_near) on this side",
        "farther than NCCL_NET_GDR_LEVEL=P2C",
        "path [0] eth2 127.0.0.2/8 (RDMA device mem2, PCIe root pci0000:80/0000:80:01.0: across the CPU interconnect",
        "carries data: GPU memory NCCL registers on this connection is registered there",
        "NCCL_NET_GDR_LEVEL=PHB or SYS",
        "NCCL_NET_GDR_LEVEL=LOC",
    ] {
        assert!(w[0].contains(want), "{want:?} missing from: {}", w[0]);
    }
    // Once per peer.
    let again = pair_on(&b, 1, 1);
    assert!(
        again.find(Level::WARN, "accept from").is_empty(),
        "{:#?}",
        again.all()
    );
    // Within the level (the acceptor on device 2, eth2's own, or SYS, or host memory only): no
    // line.
    let quiet = |b: &Arc<B>, acc: usize| {
        let logs = pair_on(b, 1, acc);
        assert!(
            logs.find(Level::WARN, "accept from").is_empty(),
            "{:#?}",
            logs.all()
        );
    };
    quiet(&gdr_backend(&[], GPU, 1, ROOT_A), 2);
    quiet(
        &gdr_backend(&[("NCCL_NET_GDR_LEVEL", "SYS")], GPU, 1, ROOT_A),
        1,
    );
    quiet(
        &gdr_backend(&[("NCCL_NET_GDR_LEVEL", "LOC")], GPU, 1, ROOT_A),
        1,
    );
    quiet(&gdr_backend(&[], 1, 1, ROOT_A), 1);
    // PHB: the same NUMA node is near enough.
    quiet(
        &gdr_backend(&[("NCCL_NET_GDR_LEVEL", "PHB")], GPU, 0, ROOT_A),
        1,
    );
}

/// Below `PIX` NCCL keeps the accepting side's buffers in host memory and never flushes: the
/// receiving endpoint is built without loopback (flush) paths. Before, a device that advertises GPU
/// memory got them whatever `NCCL_NET_GDR_LEVEL` said.
#[test]
fn a_host_memory_only_acceptor_asks_for_no_flush_paths() {
    const GPU: u32 = 1 | 2;
    let loopback_of_acceptor = |vars: &[(&str, &str)], ptr: u32| {
        let b = gdr_backend(vars, ptr, 1, ROOT_A);
        pair_on(&b, 1, 1);
        let seen = b.factory().options_seen();
        let acc: Vec<bool> = seen
            .iter()
            .filter(|(a, _)| *a)
            .map(|(_, o)| o.loopback)
            .collect();
        let conn: Vec<bool> = seen
            .iter()
            .filter(|(a, _)| !*a)
            .map(|(_, o)| o.loopback)
            .collect();
        assert_eq!(conn, [false], "the connecting side never flushes");
        assert_eq!(acc.len(), 1, "{seen:?}");
        acc[0]
    };
    assert!(loopback_of_acceptor(&[], GPU));
    assert!(!loopback_of_acceptor(&[("NCCL_NET_GDR_LEVEL", "LOC")], GPU));
    assert!(!loopback_of_acceptor(&[("NCCL_NET_GDR_LEVEL", "0")], GPU));
    assert!(!loopback_of_acceptor(&[], 1), "host memory only device");
}
