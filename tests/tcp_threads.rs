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
        use switchless::sys::HostBuffer;
        use switchless::transport::fabric::{LocalSeg, MemKind, RemoteSeg, WcStatus, WriteWr};
        let mut src = HostBuffer::new(64).unwrap();
        src.write(0, &[7; 64]).unwrap();
        let dsts: Vec<HostBuffer> = (0..pairs.len())
            .map(|_| HostBuffer::new(64).unwrap())
            .collect();
        for ((a, b), dst) in pairs.iter_mut().zip(&dsts) {
            let ra = a
                .register(&src.lend_range(0, 64).unwrap(), MemKind::Host)
                .unwrap();
            let rb = b
                .register(&dst.lend_range(0, 64).unwrap(), MemKind::Host)
                .unwrap();
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

    // 3. One thread for everything: a pair streaming 64 MiB over 4 streams and a pair exchanging
    //    small writes with immediates in both directions share a pool of 1; all of it lands.
    {
        use switchless::sys::HostBuffer;
        use switchless::transport::fabric::{
            Completion, LocalSeg, MemKind, RemoteSeg, WcOpcode, WcStatus, WriteWr,
        };
        let cfg = TcpConfig {
            streams: Some(4),
            io_threads: Some(1),
            ..TcpConfig::default()
        };
        let (mut a, mut b) = loopback_pair(&[10_000], &cfg).unwrap();
        let (mut c, mut d) = loopback_pair(&[10_000], &cfg).unwrap();
        assert_eq!(io_threads(), 1);
        assert_eq!(settles(|n| n == before + 1), before + 1);
        let n = 4 << 20;
        let mut src = HostBuffer::new(n).unwrap();
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
        src.write(0, &data).unwrap();
        let mut dst = HostBuffer::new(n).unwrap();
        let ra = a
            .register(&src.lend_range(0, n).unwrap(), MemKind::Host)
            .unwrap();
        let rb = b
            .register(&dst.lend_range(0, n).unwrap(), MemKind::Host)
            .unwrap();
        let small = HostBuffer::new(64).unwrap();
        let (rc, rd) = (
            c.register(&small.lend_range(0, 64).unwrap(), MemKind::Host)
                .unwrap(),
            d.register(&small.lend_range(0, 64).unwrap(), MemKind::Host)
                .unwrap(),
        );
        let wr = |wr_id: u64, src: u64, len: u32, lkey: u32, dst: u64, rkey: u32, imm| WriteWr {
            wr_id,
            local: LocalSeg {
                addr: src,
                len,
                lkey,
            },
            remote: RemoteSeg { addr: dst, rkey },
            imm,
            signaled: true,
            inline: false,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let wait = |f: &mut switchless::transport::tcp::TcpFabric| -> Completion {
            let mut out = Vec::new();
            while out.is_empty() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "a completion never came"
                );
                f.poll(0, 1, &mut out).unwrap();
                std::thread::yield_now();
            }
            out[0]
        };
        for k in 0..16u64 {
            b.post_recv(0, 100 + k).unwrap();
            a.post_write(
                0,
                &wr(
                    k,
                    src.addr(),
                    n as u32,
                    ra.keys[0].lkey,
                    dst.addr(),
                    rb.keys[0].rkey,
                    Some(k as u32),
                ),
            )
            .unwrap();
            // While the big write is in flight: small ping-pongs on the other pair.
            for j in 0..4u64 {
                d.post_recv(0, j).unwrap();
                c.post_write(
                    0,
                    &wr(
                        j,
                        small.addr(),
                        8,
                        rc.keys[0].lkey,
                        small.addr() + 8,
                        rd.keys[0].rkey,
                        Some(1),
                    ),
                )
                .unwrap();
                let got = wait(&mut d);
                assert_eq!(
                    (got.wr_id, got.status, got.opcode),
                    (j, WcStatus::SUCCESS, WcOpcode::RecvRdmaWithImm)
                );
                assert_eq!(wait(&mut c).status, WcStatus::SUCCESS);
                c.post_recv(0, j).unwrap();
                d.post_write(
                    0,
                    &wr(
                        j,
                        small.addr(),
                        8,
                        rd.keys[0].lkey,
                        small.addr() + 16,
                        rc.keys[0].rkey,
                        Some(2),
                    ),
                )
                .unwrap();
                assert_eq!(wait(&mut c).imm, Some(2));
                assert_eq!(wait(&mut d).status, WcStatus::SUCCESS);
            }
            let got = wait(&mut b);
            assert_eq!(
                (got.wr_id, got.status, got.imm),
                (100 + k, WcStatus::SUCCESS, Some(k as u32))
            );
            assert_eq!(wait(&mut a).wr_id, k);
            assert!(dst.read(0, n).unwrap() == data, "round {k}");
            dst.write(0, &vec![0; n]).unwrap();
        }
        drop((a, b, c, d));
    }
    assert_eq!(io_threads(), 0);
    assert_eq!(settles(|n| n == before), before);

    // 4. Through the protocol: closing the comms (also with nothing sent) joins everything.
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
