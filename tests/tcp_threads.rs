//! No TCP helper thread outlives `shutdown()` / drop. Its own test binary: the thread count of the
//! process (/proc/self/task) must not be disturbed by tests running in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchless::transport::comm::{ProtocolConfig, connect_pair};
use switchless::transport::fabric::Fabric;
use switchless::transport::tcp::{TcpConfig, loopback_pair};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn shutdown_joins_every_helper_thread() {
    let before = threads();
    let cfg = TcpConfig {
        streams: Some(3),
        ..TcpConfig::default()
    };
    let (mut a, b) = loopback_pair(&[10_000, 10_000], &cfg).unwrap();
    // 2 paths × 3 streams × (sender + receiver) per endpoint.
    assert_eq!(a.helper_threads(), 12);
    assert_eq!(threads(), before + 24);
    a.shutdown().unwrap();
    assert_eq!(a.helper_threads(), 0);
    // `a`'s 12 threads are gone; some of `b`'s may have ended too (its receivers saw every stream
    // close), but none of them is joined yet.
    assert!(threads() <= before + 12, "{} threads", threads());
    assert!(b.helper_threads() == 12);
    drop(b);
    assert_eq!(threads(), before);
    drop(a);

    // Through the protocol: closing the comms (also with nothing sent) joins everything.
    let (a, b) = loopback_pair(&[10_000], &cfg).unwrap();
    let (s, r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    assert_eq!(threads(), before + 12);
    s.close().unwrap();
    drop(r);
    assert_eq!(threads(), before);
}
