//! Lab diagnostic: opens RDMA device `argv[1]`, then prints every asynchronous event it reads (the
//! plugin's non-blocking drain) for `argv[2]` seconds (default 5). Run it while a netdev goes down
//! and up: rxe reports IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE.
use std::time::{Duration, Instant};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(dev) = args.get(1) else {
        eprintln!("usage: async_events DEVICE [SECONDS]");
        return std::process::ExitCode::from(2);
    };
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let ctx = match switchless::verbs::Context::open(dev) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("async_events: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let end = Instant::now() + Duration::from_secs(secs);
    let mut n = 0;
    while Instant::now() < end {
        for e in ctx.drain_events() {
            n += 1;
            println!("event: {}", e.describe());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("events: {n}; port 1 note: {:?}", ctx.port_note(1));
    std::process::ExitCode::SUCCESS
}
