//! CPU cost of one `irecv` + `isend` + `test` (both sides) round on the in-memory fabric, per message
//! size (0 B, 4 KiB, 1 MiB) and path count (1, 2, 4). Plain `std::time` harness (`harness = false`).
//!
//! `cargo bench --bench transport` measures; without `--bench` (as `cargo test --all-targets` runs it)
//! it does a few checked rounds of each case and exits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

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
    });
    let (a, b) = fab.pair(&vec![200_000; npaths], 0);
    let (mut s, mut r) = connect_pair(a, b, ProtocolConfig::default()).unwrap();
    let len = size.max(1);
    let sa = fab.alloc(len).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    fab.write(sa, &data).unwrap();
    let ra = fab.alloc(len).unwrap();
    let smh = s.reg_mr(sa, len as u64, MemKind::Host).unwrap();
    let rmh = r.reg_mr(ra, len as u64, MemKind::Host).unwrap();
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
        c.r.irecv(&[RecvBuf {
            addr: c.ra,
            size: c.size,
            tag: 1,
            mh: &c.rmh,
        }])
        .unwrap()
        .expect("receive slot free");
    let sreq =
        c.s.isend(c.sa, c.size, 1, &c.smh)
            .unwrap()
            .expect("clear-to-send arrived");
    while c.s.test(sreq).unwrap().is_none() {}
    loop {
        if let Some(sz) = c.r.test(rreq).unwrap() {
            assert_eq!(sz.as_slice()[0], c.size);
            break;
        }
    }
}

fn main() {
    let measure = std::env::args().any(|a| a == "--bench");
    let budget = Duration::from_millis(150);
    println!("transport round (irecv + isend + test until both done), in-memory fabric");
    println!(
        "{:>7} {:>6} {:>10} {:>12} {:>14}",
        "paths", "size", "copy", "rounds", "ns/round"
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
                // Five timed runs; the median resists the noise of a shared machine.
                let mut runs = Vec::with_capacity(5);
                let mut rounds = 0u64;
                for _ in 0..5 {
                    let mut n = 0u64;
                    let t0 = Instant::now();
                    while t0.elapsed() < budget {
                        for _ in 0..16 {
                            round(&mut c);
                        }
                        n += 16;
                    }
                    runs.push(t0.elapsed().as_nanos() as f64 / n as f64);
                    rounds += n;
                }
                runs.sort_by(|a, b| a.total_cmp(b));
                let (ns, best) = (runs[2], runs[0]);
                let label = match size {
                    0 => "0 B".to_string(),
                    4096 => "4 KiB".to_string(),
                    _ => "1 MiB".to_string(),
                };
                println!(
                    "{npaths:>7} {label:>6} {:>10} {rounds:>12} {ns:>14.0} {best:>12.0}",
                    if copy { "data" } else { "no-copy" }
                );
            }
        }
    }
    if !measure {
        println!("(smoke mode: pass --bench to measure)");
    }
}
