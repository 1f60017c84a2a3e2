//! No TCP helper thread outlives `shutdown()` / drop. Its own test binary: the thread count of the
//! process (/proc/self/task) must not be disturbed by tests running in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchless::transport::comm::{ProtocolConfig, connect_pair};
use switchless::transport::fabric::Fabric;
use switchless::transport::tcp::{TcpConfig, loopback_pair};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Waits (at most 2 s) until the thread count satisfies `ok`: a thread that was joined can stay
/// listed in /proc/self/task for a moment while the kernel reaps it. A leaked thread never goes.
fn settles(ok: impl Fn(usize) -> bool) -> usize {
    let t = std::time::Instant::now();
    loop {
        let n = threads();
        if ok(n) || t.elapsed() > std::time::Duration::from_secs(2) {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
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
    assert_eq!(settles(|n| n == before + 24), before + 24);
    a.shutdown().unwrap();
    assert_eq!(a.helper_threads(), 0);
    // `a`'s 12 threads are gone; some of `b`'s may have ended too (its receivers saw every stream
    // close), but none of them is joined yet.
    let n = settles(|n| n <= before + 12);
    assert!(n <= before + 12, "{n} threads");
    assert!(b.helper_threads() == 12);
    drop(b);
    assert_eq!(settles(|n| n == before), before);
    drop(a);

    // Through the protocol: closing the comms (also with nothing sent) joins everything.
    let (a, b) = loopback_pair(&[10_000], &cfg).unwrap();
    let (s, r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    assert_eq!(settles(|n| n == before + 12), before + 12);
    s.close().unwrap();
    drop(r);
    assert_eq!(settles(|n| n == before), before);
}
