//! `ffi::loader`: loading ncclNet plugins by path through the C ABI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use switchless::ffi::loader::HostNet;
use switchless::tools::bench::Net;

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

#[test]
fn our_plugin_loads_and_inits_or_says_why() {
    let mut net = HostNet::load(&our_plugin()).unwrap();
    assert!(net.name().starts_with("switchless"), "{}", net.name());
    match net.init(1) {
        Ok(()) => {
            // a host with RDMA devices (the VM lab): the plugin must report them
            let n = net.devices().unwrap();
            assert!(n >= 1);
            let p = net.get_properties(0).unwrap();
            assert!(p.max_recvs >= 1 && p.max_p2p_bytes > 0, "{p:?}");
            net.finalize().unwrap();
        }
        Err(e) => {
            // this build host has no RDMA: init must fail with a reason, not crash
            let s = e.to_string();
            assert!(s.contains("init returned ncclSystemError"), "{s}");
        }
    }
}
