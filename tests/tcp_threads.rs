//! The TCP fabric's I/O threads: a process-wide pool, never more threads than its size however many
//! streams are open, the streams of one path on different threads, and no thread left once every
//! endpoint is shut down or dropped. Its own test binary with one test: the thread count of the
//! process (/proc/self/task) and the pool's count must not be disturbed by tests running in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use switchless::transport::comm::{ProtocolConfig, connect_pair};
use switchless::transport::fabric::Fabric;
use switchless::transport::tcp::{TcpConfig, default_io_threads, io_threads, loopback_pair};

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
fn pool_threads_are_bounded_shared_and_joined() {
    let before = threads();
    assert_eq!(io_threads(), 0);
    assert!((1..=8).contains(&default_io_threads()));

    // 1. One pair, 2 paths × 3 streams per endpoint = 12 streams, pool of 4: 4 threads, and the
    //    streams of each path on 3 different threads.
    let cfg = TcpConfig {
        streams: Some(3),
        io_threads: Some(4),
        ..TcpConfig::default()
    };
    let (mut a, b) = loopback_pair(&[10_000, 10_000], &cfg).unwrap();
    assert_eq!(io_threads(), 4);
    assert_eq!(settles(|n| n == before + 4), before + 4);
    for f in [&a, &b] {
        for p in 0..2 {
            let mut w = f.stream_workers(p);
            assert_eq!(w.len(), 3);
            w.sort_unstable();
            w.dedup();
            assert_eq!(w.len(), 3, "the streams of path {p} share threads");
        }
        assert_eq!(f.helper_threads(), 4);
    }
    a.shutdown().unwrap();
    assert_eq!(a.helper_threads(), 0);
    // `b`'s streams still hold every worker.
    assert_eq!(io_threads(), 4);
    drop(b);
    assert_eq!(io_threads(), 0);
    assert_eq!(settles(|n| n == before), before);
    drop(a);

    // 2. Many endpoints: 16 pairs × 1 path × 4 streams = 128 streams on at most 3 threads; dropping
    //    them all leaves none.
    let cfg = TcpConfig {
        streams: Some(4),
        io_threads: Some(3),
        ..TcpConfig::default()
    };
    let mut pairs = Vec::new();
    for _ in 0..16 {
        pairs.push(loopback_pair(&[10_000], &cfg).unwrap());
        assert!(io_threads() <= 3, "{} pool threads", io_threads());
    }
    assert_eq!(io_threads(), 3);
    assert_eq!(settles(|n| n == before + 3), before + 3);
    // They all work at once: a small write on every pair.
    {
        use switchless::transport::fabric::{LocalSeg, MemKind, RemoteSeg, WcStatus, WriteWr};
        use switchless::verbs::rawmem::HostBuffer;
        let src = HostBuffer::new(64).unwrap();
        src.write(0, &[7; 64]).unwrap();
        let dsts: Vec<HostBuffer> = (0..pairs.len())
            .map(|_| HostBuffer::new(64).unwrap())
            .collect();
        for ((a, b), dst) in pairs.iter_mut().zip(&dsts) {
            let ra = a.register(src.addr(), 64, MemKind::Host).unwrap();
            let rb = b.register(dst.addr(), 64, MemKind::Host).unwrap();
            b.post_recv(0, 5).unwrap();
            a.post_write(
                0,
                &WriteWr {
                    wr_id: 1,
                    local: LocalSeg {
                        addr: src.addr(),
                        len: 64,
                        lkey: ra.keys[0].lkey,
                    },
                    remote: RemoteSeg {
                        addr: dst.addr(),
                        rkey: rb.keys[0].rkey,
                    },
                    imm: Some(9),
                    signaled: true,
                    inline: false,
                },
            )
            .unwrap();
        }
        let t = std::time::Instant::now();
        for ((_, b), dst) in pairs.iter_mut().zip(&dsts) {
            let mut out = Vec::new();
            while out.is_empty() && t.elapsed() < std::time::Duration::from_secs(30) {
                b.poll(0, 1, &mut out).unwrap();
                std::thread::yield_now();
            }
            assert_eq!(out.len(), 1);
            assert_eq!((out[0].status, out[0].imm), (WcStatus::SUCCESS, Some(9)));
            assert_eq!(dst.read(0, 64).unwrap(), vec![7; 64]);
        }
        // Every stream of a path runs on its own thread where the pool allows (3 of 4 streams).
        let mut w = pairs[0].0.stream_workers(0);
        w.sort_unstable();
        w.dedup();
        assert_eq!(w.len(), 3);
        drop(pairs);
    }
    assert_eq!(io_threads(), 0);
    assert_eq!(settles(|n| n == before), before);

    // 3. Through the protocol: closing the comms (also with nothing sent) joins everything.
    let cfg = TcpConfig {
        streams: Some(3),
        ..TcpConfig::default()
    };
    let (a, b) = loopback_pair(&[10_000], &cfg).unwrap();
    let (s, r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    let n = io_threads();
    assert!(
        n >= 1 && n <= default_io_threads().min(6),
        "{n} pool threads"
    );
    assert_eq!(settles(|t| t == before + n), before + n);
    s.close().unwrap();
    drop(r);
    assert_eq!(io_threads(), 0);
    assert_eq!(settles(|n| n == before), before);
}
