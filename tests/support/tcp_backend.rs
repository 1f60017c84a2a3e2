//! The backend-over-TCP fixture shared by `tests/backend_tcp.rs` and `tests/backend_tcp_pool.rs`
//! (separate binaries: the TCP I/O pool is process-wide, so the pool test runs alone).
//!
//! Host model: two TCP links on `lo`, 127.0.0.1/PREFIX and 127.0.0.2/PREFIX, and a kernel route
//! 127.0.0.0/PREFIX dev lo; a node reaches its "peer" (itself) over two paths.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use switchless::config::Config;
use switchless::host::NcclDevice;
use switchless::plugin::NetFactory;
use switchless::plugin::{Backend, CommInfo, HANDLE_SIZE, Handle, HostView, Switchless};
use switchless::route::types::{KernelRoute, LinkKind, LocalLink};

pub type B = Switchless<NetFactory>;

pub fn link(id: usize, addr: &str) -> LocalLink {
    LocalLink {
        id,
        kind: LinkKind::Tcp,
        netdev: "lo".into(),
        rdma_dev: None,
        port: 0,
        addr: addr.parse().unwrap(),
        gid_index: None,
        pci_root: format!("pci000{id}:00"),
        phys_port_id: u16::MAX,
        nccl_dev: Some(0),
        speed_mbps: 10_000,
        mtu: 65536,
        active_mtu: 0,
        up: true,
    }
}

pub fn device() -> NcclDevice {
    NcclDevice {
        index: 0,
        name: "sl_lo".into(),
        members: Vec::new(),
        pci_path: String::new(),
        guid: 1,
        speed_mbps: 10_000,
        port: 1,
        latency_us: 0.0,
        max_comms: 65536,
        max_recvs: 8,
        ptr_support: 1,
        max_p2p_bytes: 1 << 40,
        rail_id: -1,
        plane_id: -1,
        phys_port_id: 0,
        peers: Vec::new(),
    }
}

pub fn view(config: Config, prefix: u8) -> HostView {
    HostView {
        config,
        devices: vec![device()],
        links: vec![
            link(0, &format!("127.0.0.1/{prefix}")),
            link(1, &format!("127.0.0.2/{prefix}")),
        ],
        routes: vec![KernelRoute {
            dest: format!("127.0.0.0/{prefix}").parse().unwrap(),
            gateway: None,
            ifname: "lo".into(),
            metric: 0,
        }],
    }
}

pub fn config(vars: &[(&str, &str)]) -> Config {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    Config::from_vars(|n| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())).unwrap()
}

pub fn backend(config: Config, prefix: u8) -> Arc<B> {
    let f = NetFactory::tcp_only(config.clone());
    Arc::new(Switchless::from_parts(f, view(config, prefix)).unwrap())
}

pub type Pair = (<B as Backend>::Send, <B as Backend>::Recv);

/// Drives connect and accept (NCCL's contract: call again on None) until both return comms.
pub fn establish(b: &Arc<B>) -> Pair {
    let mut h: Handle = [0; HANDLE_SIZE];
    let mut l = b.listen(&CommInfo::default(), 0, &mut h).unwrap();
    let mut mine = h;
    let (mut s, mut r) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut calls, mut accepts) = (0, 0);
    while s.is_none() || r.is_none() {
        assert!(Instant::now() < deadline, "set-up did not finish");
        if s.is_none() {
            s = b.connect(&CommInfo::default(), 0, &mut mine).unwrap();
            calls += 1;
        }
        if r.is_none() {
            r = B::accept(&mut l).unwrap();
            accepts += 1;
        }
    }
    assert!(calls >= 2 && accepts >= 2, "connect/accept must not block");
    assert_eq!(b.connecting(), 0);
    B::close_listen(l).unwrap();
    (s.unwrap(), r.unwrap())
}
