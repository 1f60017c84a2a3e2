//! `ffi::loader`: loading ncclNet plugins by path through the C ABI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use switchless::ffi::loader::HostNet;
use switchless::tools::bench::Net;
use switchless::verbs::devices::probe;

/// The cdylib cargo built for this test run (`target/<profile>/deps/libswitchless.so`, next to the
/// test binary; `target/<profile>/libswitchless.so` may be stale or missing under `cargo test`).
fn our_plugin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    for p in [
        dir.join("libswitchless.so"),
        dir.join("../libswitchless.so"),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!("no libswitchless.so near {}", dir.display());
}

#[test]
fn a_missing_file_is_a_clear_error() {
    let e = HostNet::load(Path::new("/nonexistent/libnccl-net-x.so"))
        .err()
        .unwrap();
    let s = e.to_string();
    assert!(s.contains("dlopen /nonexistent/libnccl-net-x.so"), "{s}");
}

#[test]
fn a_library_without_the_v12_symbol_is_rejected() {
    let e = HostNet::load(Path::new("libc.so.6")).err().unwrap();
    assert!(e.to_string().contains("no ncclNetPlugin_v12"), "{e}");
}

/// Init follows the host: with RDMA devices (the soft-RoCE lab runs this binary in its VMs) it
/// succeeds and reports as many devices as the probe finds; without, it fails with NCCL's system
/// error. Either outcome on the wrong host fails.
#[test]
fn our_plugin_inits_exactly_when_the_host_has_rdma() {
    let host = probe();
    let mut net = HostNet::load(&our_plugin()).unwrap();
    assert!(net.name().starts_with("switchless"), "{}", net.name());
    let r = net.init(1);
    if host.devices.is_empty() {
        let e = r.expect_err("init succeeded on a host without RDMA devices");
        let s = e.to_string();
        assert!(s.contains("init returned ncclSystemError"), "{s}");
    } else {
        r.unwrap_or_else(|e| panic!("init failed on a host with {:?}: {e}", host.devices));
        let n = net.devices().unwrap();
        assert_eq!(
            n,
            host.devices.len(),
            "devices() vs the probe {:?}",
            host.devices
        );
        let p = net.get_properties(0).unwrap();
        assert!(p.max_recvs >= 1 && p.max_p2p_bytes > 0, "{p:?}");
        net.finalize().unwrap();
        // Counted by the lab's CI step: this branch ran where verbs exist.
        println!("RDMA-BRANCH bench_host::our_plugin_inits_exactly_when_the_host_has_rdma");
    }
}

/// `set_net_attr` calls the plugin's v12 `setNetAttr` (not the trait's "no such field" default):
/// before `init` there is no context, and our plugin refuses the NULL one by name.
#[test]
fn set_net_attr_reaches_our_plugins_set_net_attr() {
    let net = HostNet::load(&our_plugin()).unwrap();
    let hint = switchless::tools::bench::hints::connect_hint(
        switchless::tools::bench::hints::ConnKind::Collective { channels: 2 },
        4,
    );
    let e = net
        .set_net_attr(&hint)
        .expect_err("setNetAttr took a NULL ctx");
    let s = e.to_string();
    assert!(s.contains("setNetAttr returned ncclInvalidArgument"), "{s}");
}
