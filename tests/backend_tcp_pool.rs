//! The TCP I/O pool through the real backend (`plugin::Switchless` over `NetFactory::tcp_only`):
//! `NCCL_SWITCHLESS_TCP_THREADS` bounds the pool threads of many connections, and once every comm
//! NCCL opened is closed no pool thread is left (NCCL unloads the plugin after finalize). Its own
//! test binary with one test: the pool is process-wide, so nothing may run beside it.
//!
//! Host model as in `tests/backend_tcp.rs`: two TCP links on `lo`, 127.0.0.1/30 and 127.0.0.2/30.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use switchless::plugin::Backend;
use switchless::transport::tcp::io_threads;

#[path = "support/tcp_backend.rs"]
mod support;
use support::*;

#[test]
fn tcp_threads_bound_the_pool_and_closing_every_comm_ends_it() {
    assert_eq!(io_threads(), 0);
    let b = backend(
        config(&[
            ("NCCL_SWITCHLESS_TRANSPORT", "tcp"),
            ("NCCL_SWITCHLESS_TCP_STREAMS", "8"),
            ("NCCL_SWITCHLESS_TCP_THREADS", "3"),
        ]),
        30,
    );
    // 6 connections × 2 paths × 4 streams, both ends in this process: 96 streams.
    let pairs: Vec<Pair> = (0..6).map(|_| establish(&b)).collect();
    let t = Instant::now();
    while io_threads() < 3 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(io_threads(), 3);
    for (s, r) in pairs {
        B::close_send(s).unwrap();
        B::close_recv(r).unwrap();
    }
    assert_eq!(io_threads(), 0, "pool threads left after every comm closed");
    drop(b);
    assert_eq!(io_threads(), 0);
}
