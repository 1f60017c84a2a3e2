//! What a stock NCCL expects of the plugin beyond the ABI, driven as NCCL's proxy drives it (the
//! real backend over the in-memory fabric, `plugin::init` / `listen` / `connect` / `accept` and the
//! backend's own calls): ranks of one host connect over loopback paths.
//!
//! Host models: links on `eth*` netdevs in 127/8 (every address is local, so the handshake's
//! sockets connect), one NCCL device per link unless a test says otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use switchless::config::Config;
use switchless::host::{Member, NcclDevice};
use switchless::plugin::{
    self, CommInfo, Endpoint, HANDLE_SIZE, Handle, HostView, MemFactory, PtrSupport, RecvBuf,
    Region, Switchless,
};
use switchless::route::types::{KernelRoute, LinkKind, LocalLink};
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

fn device(index: usize, name: &str, root: &str, ptr: u32) -> NcclDevice {
    NcclDevice {
        index,
        name: name.into(),
        members: vec![Member {
            rdma_dev: format!("mem{index}"),
            port: 1,
            netdev: Some(format!("eth{index}")),
            pci_bdf: None,
            pci_root: Some(root.into()),
            speed_mbps: 100_000,
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

/// Two devices, one link each on its own /30 (the far ends, .2, are no rank's): every peer this
/// node's ranks see is this host.
fn two_cables(config: Config) -> HostView {
    HostView {
        config,
        devices: vec![device(0, "sl_a", ROOT_A, 1), device(1, "sl_b", ROOT_FAR, 1)],
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
        addr: addr as usize,
        size: size.max(1),
        kind: PtrSupport::HOST,
    };
    let smr = plugin::reg_mr(sc, region(src)).unwrap();
    let rmr = plugin::reg_mr(rc, region(dst)).unwrap();
    let mut rreq = plugin::irecv(
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
    let mut sreq = loop {
        if let Some(r) = plugin::isend(sc, src as usize, size, 1, &smr).unwrap() {
            break r;
        }
        assert!(Instant::now() < deadline, "isend never found the CTS");
    };
    let mut sizes = [0usize; plugin::MAX_GROUPED_RECVS];
    let (mut s, mut r) = (false, false);
    while !(s && r) {
        assert!(Instant::now() < deadline, "requests did not complete");
        s = s || plugin::test(&mut sreq, &mut sizes).unwrap().is_some();
        if !r && plugin::test(&mut rreq, &mut sizes).unwrap().is_some() {
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
