//! CPU cost of one `irecv` + `isend` + `test` (both sides) round on the in-memory fabric, per message
//! size (0 B, 4 KiB, 1 MiB) and path count (1, 2, 4). Plain `std::time` harness (`harness = false`).
//!
//! `cargo bench --bench transport` measures; without `--bench` (as `cargo test --all-targets` runs it)
//! it does a few checked rounds of each case and exits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use switchless::sys::Lent;
use switchless::transport::comm::{
    MemHandle, ProtocolConfig, RecvBuf, RecvComm, SendComm, connect_pair,
};
use switchless::transport::fabric::MemKind;
use switchless::transport::memfab::{MemEndpoint, MemFab, MemFabConfig};

struct Case {
    fab: MemFab,
    s: SendComm<MemEndpoint>,
    r: RecvComm<MemEndpoint>,
    sa: u64,
    smh: MemHandle,
    ra: u64,
    rmh: MemHandle,
    size: u64,
}

fn setup(npaths: usize, size: usize, copy_data: bool) -> Case {
    let fab = MemFab::new(MemFabConfig {
        reorder_seed: None,
        copy_data,
        ..MemFabConfig::default()
    });
    let (a, b) = fab.pair(&vec![200_000; npaths], 0);
    let (mut s, mut r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    let len = size.max(1);
    let sa = fab.alloc(len).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    fab.write(sa, &data).unwrap();
    let ra = fab.alloc(len).unwrap();
    let smh = s.reg_mr(&Lent::simulated(sa, len), MemKind::Host).unwrap();
    let rmh = r.reg_mr(&Lent::simulated(ra, len), MemKind::Host).unwrap();
    Case {
        fab,
        s,
        r,
        sa,
        smh,
        ra,
        rmh,
        size: size as u64,
    }
}

fn round(c: &mut Case) {
    let rreq =
        c.r.irecv(
            Instant::now(),
            &[RecvBuf {
                addr: c.ra,
                size: c.size,
                tag: 1,
                mh: &c.rmh,
            }],
        )
        .unwrap()
        .expect("receive slot free");
    let sreq =
        c.s.isend(Instant::now(), c.sa, c.size, 1, &c.smh)
            .unwrap()
            .expect("clear-to-send arrived");
    while c.s.test(Instant::now(), sreq).unwrap().is_none() {}
    loop {
        if let Some(sz) = c.r.test(Instant::now(), rreq).unwrap() {
            assert_eq!(sz.as_slice()[0], c.size);
            break;
        }
    }
}

/// CPU time of this thread in ns (`/proc/thread-self/schedstat`, first field), if available: robust
/// to other processes competing for the cores, unlike wall time.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let measure = std::env::args().any(|a| a == "--bench");
    let budget = Duration::from_millis(150);
    println!("transport: one irecv + isend + test-until-done round on the in-memory fabric");
    println!("(median of 5 runs of 150 ms; cpu = this thread's on-CPU time, wall = elapsed)");
    println!(
        "{:>5} {:>6} {:>8} {:>10} {:>14} {:>15}",
        "paths", "size", "payload", "rounds", "cpu ns/round", "wall ns/round"
    );
    for &size in &[0usize, 4096, 1 << 20] {
        for &npaths in &[1usize, 2, 4] {
            for copy in [true, false] {
                if size == 0 && !copy {
                    continue;
                }
                let mut c = setup(npaths, size, copy);
                // Warm-up, and a correctness check of the data.
                for _ in 0..3 {
                    round(&mut c);
                }
                if copy && size > 0 {
                    let want = c.fab.read(c.sa, size).unwrap();
                    assert_eq!(c.fab.read(c.ra, size).unwrap(), want);
                }
                if !measure {
                    continue;
                }
                let mut wall = Vec::with_capacity(5);
                let mut cpu = Vec::with_capacity(5);
                let mut rounds = 0u64;
                for _ in 0..5 {
                    let mut n = 0u64;
                    let c0 = thread_cpu_ns();
                    let t0 = Instant::now();
                    while t0.elapsed() < budget {
                        for _ in 0..16 {
                            round(&mut c);
                        }
                        n += 16;
                    }
                    wall.push(t0.elapsed().as_nanos() as f64 / n as f64);
                    if let (Some(a), Some(b)) = (c0, thread_cpu_ns()) {
                        cpu.push((b - a) as f64 / n as f64);
                    }
                    rounds += n;
                }
                let label = match size {
                    0 => "0 B",
                    4096 => "4 KiB",
                    _ => "1 MiB",
                };
                let cpu = if cpu.is_empty() {
                    f64::NAN
                } else {
                    median(&mut cpu)
                };
                println!(
                    "{npaths:>5} {label:>6} {:>8} {rounds:>10} {cpu:>14.0} {:>15.0}",
                    if copy { "copied" } else { "no-copy" },
                    median(&mut wall)
                );
            }
        }
    }
    if !measure {
        println!("(smoke mode: pass --bench to measure)");
    }
}
