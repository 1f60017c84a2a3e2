//! The plugin as NCCL's proxy drives it: the `ncclNetPlugin_v12` entry points over the real backend
//! (`Switchless<MemFactory>`: routing, the handshake on 127.0.0.1, the protocol; the NIC is the
//! in-memory fabric), called through raw pointers from two threads like NCCL's service and progress
//! threads. Plain `std::time` harness (`harness = false`); reports, never asserts a speed.
//!
//! * `round`: CPU time of one `irecv` + `isend` + `test`-until-done (both sides) round, 0 B and 4 KiB,
//!   two paths: what the FFI layer and the backend add on top of the protocol (`benches/transport.rs`).
//! * `stall`: wall time of 1000 such rounds while a second thread calls `regMr` + `deregMr` of 1 GiB
//!   on the same send comm in a loop; the fabric pins at 250 ns per 4 KiB page (1 GiB: 65 ms), as
//!   `ibv_reg_mr` would. Also the longest single round.
//! * `pinned`: the bytes registered when one 64 MiB buffer is registered on 8 send comms.
//!
//! `cargo bench --bench plugin` measures; without `--bench` (as `cargo test --all-targets` runs it)
//! it does a few checked rounds with small buffers and exits. `--rounds N` runs only N rounds of 0 B
//! (after 3 warm-up rounds) and exits: for instruction counts under `valgrind --tool=callgrind`, where
//! the difference between two N is the cost of the rounds alone (set-up and teardown cancel).
//! `--idle-recv N` / `--idle-send N` likewise: N `test` calls on a posted receive whose data has not
//! come, N on a posted send whose data write has not executed (the fabric stalled), each inside one
//! round: what NCCL's proxy pays for every poll of a request still in flight.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use switchless::config::Config;
use switchless::ffi::abi::{self, ncclResult_t};
use switchless::ffi::vtables;
use switchless::host::{Member, NcclDevice};
use switchless::plugin::{HostView, MemFactory, Switchless};
use switchless::route::types::{KernelRoute, LinkKind, LocalLink};
use switchless::transport::memfab::{MemFab, MemFabConfig};

type B = Switchless<MemFactory>;
type Vp = *mut c_void;

const NCCL_PTR_HOST: c_int = 1;
const PIN_NS_PER_PAGE: u64 = 250;

fn ok(r: ncclResult_t, what: &str) {
    assert_eq!(r, ncclResult_t::ncclSuccess, "{what}");
}

/// One device with two links on lo (127.0.0.1/8 and 127.0.0.2/8): a connection to "the peer" (this
/// process) has two paths, 127.0.0.1 -> 127.0.0.2 and 127.0.0.2 -> 127.0.0.1.
fn view() -> HostView {
    let link = |id: usize, addr: &str| LocalLink {
        id,
        kind: LinkKind::Roce,
        netdev: "lo".into(),
        rdma_dev: Some("mem0".into()),
        port: 1,
        addr: addr.parse().unwrap(),
        gid_index: Some(1),
        pci_root: format!("pci000{id}:00"),
        phys_port_id: 0,
        nccl_dev: Some(0),
        speed_mbps: 100_000,
        mtu: 9000,
        active_mtu: 4096,
        up: true,
    };
    let dev = NcclDevice {
        index: 0,
        name: "sl_lo".into(),
        members: vec![Member {
            rdma_dev: "mem0".into(),
            port: 1,
            netdev: Some("lo".into()),
            pci_bdf: None,
            pci_root: None,
            speed_mbps: 100_000,
            pcie_mbps: None,
            numa_node: None,
        }],
        pci_path: String::new(),
        guid: 0x1000,
        speed_mbps: 100_000,
        port: 1,
        latency_us: 0.0,
        max_comms: 65536,
        max_recvs: 8,
        ptr_support: 1,
        max_p2p_bytes: 1 << 40,
        rail_id: -1,
        plane_id: -1,
        phys_port_id: 0,
        peers: Vec::new(),
    };
    HostView {
        config: Config::default(),
        devices: vec![dev],
        links: vec![link(0, "127.0.0.1/8"), link(1, "127.0.0.2/8")],
        routes: vec![KernelRoute {
            dest: "127.0.0.0/8".parse().unwrap(),
            gateway: None,
            ifname: "lo".into(),
            metric: 0,
        }],
    }
}

/// The v12 vtable over the memfab backend, and one initialized context.
struct Plugin {
    net: abi::ncclNet_v12_t,
    ctx: Vp,
}

impl Plugin {
    fn open() -> Plugin {
        let net = vtables::net_v12::<B>();
        let mut ctx: Vp = std::ptr::null_mut();
        let mut cfg = abi::ncclNetCommConfig_v12_t { trafficClass: -1 };
        // SAFETY: valid out-pointer and config; no logger.
        ok(
            unsafe { net.init.unwrap()(&mut ctx, 1, &mut cfg, None, None) },
            "init",
        );
        Plugin { net, ctx }
    }

    /// A connected (send comm, recv comm) pair, as NCCL's connect/accept retry loop makes it.
    fn pair(&self) -> (Vp, Vp) {
        let n = &self.net;
        let mut handle = [0u8; 128];
        let mut lc: Vp = std::ptr::null_mut();
        // SAFETY: live context, 128-byte handle, valid out-pointer.
        ok(
            unsafe { n.listen.unwrap()(self.ctx, 0, handle.as_mut_ptr().cast(), &mut lc) },
            "listen",
        );
        let mut mine = handle;
        let (mut sc, mut rc): (Vp, Vp) = (std::ptr::null_mut(), std::ptr::null_mut());
        let deadline = Instant::now() + Duration::from_secs(30);
        while sc.is_null() || rc.is_null() {
            assert!(Instant::now() < deadline, "connect/accept did not finish");
            if sc.is_null() {
                let mut dev = std::ptr::null_mut();
                // SAFETY: NCCL's private handle copy, valid out-pointers.
                ok(
                    unsafe {
                        n.connect.unwrap()(self.ctx, 0, mine.as_mut_ptr().cast(), &mut sc, &mut dev)
                    },
                    "connect",
                );
            }
            if rc.is_null() {
                let mut dev = std::ptr::null_mut();
                // SAFETY: the live listen comm, valid out-pointers.
                ok(
                    unsafe { n.accept.unwrap()(lc, &mut rc, &mut dev) },
                    "accept",
                );
            }
        }
        // SAFETY: accepted: NCCL closes the listen comm.
        ok(unsafe { n.closeListen.unwrap()(lc) }, "closeListen");
        (sc, rc)
    }

    fn reg(&self, comm: Vp, addr: u64, len: usize) -> Vp {
        let mut mh: Vp = std::ptr::null_mut();
        // SAFETY: a live comm; the address is memfab's (the fabric checks it; nothing dereferences it).
        ok(
            unsafe { self.net.regMr.unwrap()(comm, addr as Vp, len, NCCL_PTR_HOST, &mut mh) },
            "regMr",
        );
        mh
    }

    fn dereg(&self, comm: Vp, mh: Vp) {
        // SAFETY: a live comm and its live mhandle.
        ok(unsafe { self.net.deregMr.unwrap()(comm, mh) }, "deregMr");
    }

    /// One round: irecv, isend (each posted again while NULL), then test both until done.
    fn round(&self, c: &Conn) {
        let rreq = self.post_recv(c);
        let sreq = self.post_send(c);
        assert_eq!(self.finish(sreq, rreq), c.size, "received size");
    }

    /// One `test` of `req`: the first size once it is done.
    fn test_once(&self, req: Vp) -> Option<usize> {
        let mut done = 0;
        let mut sizes = [0 as c_int; 64];
        // SAFETY: a live request; `sizes` has 64 ints.
        ok(
            unsafe { self.net.test.unwrap()(req, &mut done, sizes.as_mut_ptr()) },
            "test",
        );
        (done != 0).then_some(sizes[0] as usize)
    }

    /// Posts a receive of the connection's buffer (retried while the slot is busy).
    fn post_recv(&self, c: &Conn) -> Vp {
        let mut rreq: Vp = std::ptr::null_mut();
        while rreq.is_null() {
            let mut data = [c.ra as Vp];
            let mut sizes = [c.size];
            let mut tags: [c_int; 1] = [7];
            let mut mhs = [c.rmh];
            let mut ph = [std::ptr::null_mut()];
            // SAFETY: arrays of one element each; live comm and mhandle.
            ok(
                unsafe {
                    self.net.irecv.unwrap()(
                        c.rc,
                        1,
                        data.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mhs.as_mut_ptr(),
                        ph.as_mut_ptr(),
                        &mut rreq,
                    )
                },
                "irecv",
            );
        }
        rreq
    }

    /// Posts a send of the connection's buffer (retried until the clear-to-send is there).
    fn post_send(&self, c: &Conn) -> Vp {
        let mut sreq: Vp = std::ptr::null_mut();
        while sreq.is_null() {
            // SAFETY: live comm and mhandle.
            ok(
                unsafe {
                    self.net.isend.unwrap()(
                        c.sc,
                        c.sa as Vp,
                        c.size,
                        7,
                        c.smh,
                        std::ptr::null_mut(),
                        &mut sreq,
                    )
                },
                "isend",
            );
        }
        sreq
    }

    /// Tests the send, then the receive, until both are done: the size received.
    fn finish(&self, sreq: Vp, rreq: Vp) -> usize {
        let (mut sd, mut rd) = (None, None);
        while sd.is_none() || rd.is_none() {
            if sd.is_none() {
                sd = self.test_once(sreq);
            }
            if rd.is_none() {
                rd = self.test_once(rreq);
            }
        }
        rd.unwrap_or(0)
    }

    fn close(&self, c: Conn) {
        self.dereg(c.sc, c.smh);
        self.dereg(c.rc, c.rmh);
        // SAFETY: live comms, closed once.
        ok(unsafe { self.net.closeSend.unwrap()(c.sc) }, "closeSend");
        // SAFETY: as above.
        ok(unsafe { self.net.closeRecv.unwrap()(c.rc) }, "closeRecv");
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // SAFETY: the context from init, finalized once.
        ok(unsafe { self.net.finalize.unwrap()(self.ctx) }, "finalize");
    }
}

/// A connection with one registered buffer on each side.
struct Conn {
    sc: Vp,
    rc: Vp,
    sa: u64,
    ra: u64,
    smh: Vp,
    rmh: Vp,
    size: usize,
}

fn conn(p: &Plugin, fab: &MemFab, size: usize) -> Conn {
    let (sc, rc) = p.pair();
    let len = size.max(1);
    let sa = fab.alloc(len).unwrap();
    let ra = fab.alloc(len).unwrap();
    Conn {
        smh: p.reg(sc, sa, len),
        rmh: p.reg(rc, ra, len),
        sc,
        rc,
        sa,
        ra,
        size,
    }
}

/// CPU time of this thread in ns (`/proc/thread-self/schedstat`, first field), if available.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn bench_round(p: &Plugin, fab: &MemFab, measure: bool) {
    println!(
        "round: one irecv + isend + test-until-done round through the v12 entry points, 2 paths"
    );
    println!("(median of 5 runs of 200 ms; cpu = this thread's on-CPU time)");
    println!("{:>6} {:>10} {:>14}", "size", "rounds", "cpu ns/round");
    for size in [0usize, 4096] {
        let c = conn(p, fab, size);
        for _ in 0..3 {
            p.round(&c);
        }
        if measure {
            let mut cpu = Vec::new();
            let mut rounds = 0u64;
            for _ in 0..5 {
                let mut n = 0u64;
                let c0 = thread_cpu_ns();
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_millis(200) {
                    for _ in 0..16 {
                        p.round(&c);
                    }
                    n += 16;
                }
                if let (Some(a), Some(b)) = (c0, thread_cpu_ns()) {
                    cpu.push((b - a) as f64 / n as f64);
                }
                rounds += n;
            }
            let cpu = if cpu.is_empty() {
                f64::NAN
            } else {
                median(&mut cpu)
            };
            let label = if size == 0 { "0 B" } else { "4 KiB" };
            println!("{label:>6} {rounds:>10} {cpu:>14.0}");
        }
        p.close(c);
    }
}

fn bench_stall(p: &Plugin, fab: &MemFab, measure: bool) {
    let (rounds, big) = if measure {
        (1000, 1usize << 30)
    } else {
        (20, 1 << 20)
    };
    println!(
        "stall: {rounds} rounds of 4 KiB while another thread registers and deregisters {} MiB \
         on the same send comm ({PIN_NS_PER_PAGE} ns per 4 KiB page pinned)",
        big >> 20
    );
    let c = conn(p, fab, 4096);
    let big_addr = fab.alloc(big).unwrap();
    let quiet = {
        let t0 = Instant::now();
        for _ in 0..rounds {
            p.round(&c);
        }
        t0.elapsed()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let regs = Arc::new(AtomicU64::new(0));
    let reg_time = Arc::new(AtomicU64::new(0));
    let th = {
        let (stop, regs, reg_time) = (Arc::clone(&stop), Arc::clone(&regs), Arc::clone(&reg_time));
        let net = p.net;
        let sc = c.sc as usize;
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let mut mh: Vp = std::ptr::null_mut();
                // SAFETY: the send comm stays open until this thread is joined; memfab address.
                ok(
                    unsafe {
                        net.regMr.unwrap()(sc as Vp, big_addr as Vp, big, NCCL_PTR_HOST, &mut mh)
                    },
                    "regMr",
                );
                // SAFETY: the mhandle just registered on that comm.
                ok(unsafe { net.deregMr.unwrap()(sc as Vp, mh) }, "deregMr");
                reg_time.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                regs.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Let the registration loop start.
    while regs.load(Ordering::Relaxed) == 0 && !th.is_finished() {
        std::thread::yield_now();
    }
    let mut worst = Duration::ZERO;
    let t0 = Instant::now();
    for _ in 0..rounds {
        let r0 = Instant::now();
        p.round(&c);
        worst = worst.max(r0.elapsed());
    }
    let busy = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    th.join().unwrap();
    let n = regs.load(Ordering::Relaxed).max(1);
    println!(
        "  quiet: {:.1} ms; while registering: {:.1} ms (longest round {:.2} ms); \
         {} registrations, {:.1} ms each",
        quiet.as_secs_f64() * 1e3,
        busy.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3,
        n,
        reg_time.load(Ordering::Relaxed) as f64 / n as f64 / 1e6
    );
    p.close(c);
}

fn bench_pinned(p: &Plugin, fab: &MemFab, measure: bool) {
    let (conns, len) = if measure {
        (8, 64usize << 20)
    } else {
        (2, 1 << 20)
    };
    let buf = fab.alloc(len).unwrap();
    let before = fab.stats();
    let pairs: Vec<(Vp, Vp)> = (0..conns).map(|_| p.pair()).collect();
    let mhs: Vec<Vp> = pairs.iter().map(|&(sc, _)| p.reg(sc, buf, len)).collect();
    let after = fab.stats();
    println!(
        "pinned: one {} MiB buffer registered on {conns} send comms: {} registration(s) pinned, \
         {} MiB pinned",
        len >> 20,
        after.pins - before.pins,
        (after.pinned_bytes - before.pinned_bytes) >> 20
    );
    for (&(sc, rc), mh) in pairs.iter().zip(mhs) {
        p.dereg(sc, mh);
        // SAFETY: live comms, closed once.
        ok(unsafe { p.net.closeSend.unwrap()(sc) }, "closeSend");
        // SAFETY: as above.
        ok(unsafe { p.net.closeRecv.unwrap()(rc) }, "closeRecv");
    }
}

/// `--rounds N`: N rounds of 0 B on one connection, nothing else.
fn rounds_only(p: &Plugin, fab: &MemFab, n: u64) {
    let c = conn(p, fab, 0);
    for _ in 0..3 {
        p.round(&c);
    }
    for _ in 0..n {
        p.round(&c);
    }
    p.close(c);
    println!("rounds: {n} rounds of 0 B");
}

/// `--idle-recv NR` / `--idle-send NS`: on one connection of 0 B, NR `test` calls on a receive
/// whose data has not come (no send posted yet), then NS on a send whose data write waits in the
/// stalled fabric.
fn idle_tests(p: &Plugin, fab: &MemFab, nr: u64, ns: u64) {
    let c = conn(p, fab, 0);
    for _ in 0..3 {
        p.round(&c);
    }
    // The receiving side: its clear-to-send went out, nothing came back.
    let rreq = p.post_recv(&c);
    for _ in 0..nr {
        assert!(
            p.test_once(rreq).is_none(),
            "a receive without a send completed"
        );
    }
    let sreq = p.post_send(&c);
    p.finish(sreq, rreq);
    // The sending side: the clear-to-send is there, the data write is posted and not executed.
    let (a, b) = fab.newest_pair().unwrap();
    let rreq = p.post_recv(&c);
    fab.stall(a, true);
    fab.stall(b, true);
    let sreq = p.post_send(&c);
    for _ in 0..ns {
        assert!(
            p.test_once(sreq).is_none(),
            "a send in a stalled fabric completed"
        );
    }
    fab.stall(a, false);
    fab.stall(b, false);
    p.finish(sreq, rreq);
    p.close(c);
    println!("idle tests: {nr} on a receive, {ns} on a send");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let measure = args.iter().any(|a| a == "--bench");
    let rounds = args.iter().position(|a| a == "--rounds").map(|i| {
        args.get(i + 1)
            .and_then(|n| n.parse::<u64>().ok())
            .expect("--rounds N")
    });
    let count = |flag: &str| {
        args.iter().position(|a| a == flag).map(|i| {
            args.get(i + 1)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{flag} N"))
        })
    };
    let (idle_recv, idle_send) = (count("--idle-recv"), count("--idle-send"));
    let fab = MemFab::new(MemFabConfig {
        copy_data: false,
        pin_ns_per_page: PIN_NS_PER_PAGE,
        ..MemFabConfig::default()
    });
    MemFactory::new(fab.clone(), 0).install(view());
    let p = Plugin::open();
    if let Some(n) = rounds {
        rounds_only(&p, &fab, n);
        return;
    }
    if idle_recv.is_some() || idle_send.is_some() {
        idle_tests(&p, &fab, idle_recv.unwrap_or(0), idle_send.unwrap_or(0));
        return;
    }
    bench_round(&p, &fab, measure);
    bench_stall(&p, &fab, measure);
    bench_pinned(&p, &fab, measure);
    drop(p);
    if !measure {
        println!("(smoke mode: pass --bench to measure)");
    }
}
