//! Registration beside the data path, on the real backend (what the .so exports: verbs where the host
//! has RDMA devices, else TCP), as NCCL's proxy drives it: the `ncclNetPlugin_v12` entry points called
//! through raw pointers from two threads, like NCCL's progress thread (isend/irecv/test) and its
//! service thread (regMr/deregMr). One process is both ranks: a same-host connection (RDMA loopback on
//! the port's own GID), so it runs in one lab VM.
//!
//! * stall: wall time of `ROUNDS` rounds (irecv + isend of 4 KiB + test until done) on one connection,
//!   first alone, then while a second thread registers and deregisters `BIG_MIB` MiB on the same send
//!   comm in a loop; the longest single round of each.
//! * pinned: the kernel's pinned-page count (`VmPin` in /proc/self/status, which `ib_umem_get`
//!   charges) after one 64 MiB buffer is registered on 8 send comms.
//!
//! Usage: `regstall [ROUNDS] [BIG_MIB]` (default 1000, 256). Prints `REGSTALL key=value ...` lines. The
//! lab runs it with `lab/run.sh --payload DIR --checks payload` (see docs/guide/lab.md). Reports,
//! never asserts a speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use switchless::ffi::abi::{self, ncclResult_t};
use switchless::ffi::vtables::ncclNetPlugin_v12 as NET;

type Vp = *mut c_void;
const NCCL_PTR_HOST: c_int = 1;

fn ok(r: ncclResult_t, what: &str) {
    assert_eq!(r, ncclResult_t::ncclSuccess, "{what}");
}

/// Page-aligned zeroed host memory, freed on drop.
struct Mem {
    p: *mut u8,
    layout: Layout,
}

impl Mem {
    fn new(len: usize) -> Mem {
        let layout = Layout::from_size_align(len.max(1), 4096).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        assert!(!p.is_null(), "out of memory for {len} bytes");
        Mem { p, layout }
    }
    fn addr(&self) -> Vp {
        self.p.cast()
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout; every registration of it was released before.
        unsafe { dealloc(self.p, self.layout) };
    }
}

fn init() -> Vp {
    let mut ctx: Vp = std::ptr::null_mut();
    let mut cfg = abi::ncclNetCommConfig_v12_t { trafficClass: -1 };
    // SAFETY: valid out-pointer and config; no logger (the plugin logs to stderr).
    ok(
        unsafe { NET.init.unwrap()(&mut ctx, 1, &mut cfg, None, None) },
        "init",
    );
    ctx
}

/// A connected (send comm, recv comm) pair to this same process, as NCCL's retry loop makes it.
fn pair(ctx: Vp) -> (Vp, Vp) {
    let mut handle = [0u8; 128];
    let mut lc: Vp = std::ptr::null_mut();
    // SAFETY: live context, 128-byte handle, valid out-pointer.
    ok(
        unsafe { NET.listen.unwrap()(ctx, 0, handle.as_mut_ptr().cast(), &mut lc) },
        "listen",
    );
    let (mut sc, mut rc): (Vp, Vp) = (std::ptr::null_mut(), std::ptr::null_mut());
    let deadline = Instant::now() + Duration::from_secs(120);
    while sc.is_null() || rc.is_null() {
        assert!(Instant::now() < deadline, "connect/accept did not finish");
        let mut dev = std::ptr::null_mut();
        if sc.is_null() {
            // SAFETY: NCCL's private handle copy, valid out-pointers.
            ok(
                unsafe {
                    NET.connect.unwrap()(ctx, 0, handle.as_mut_ptr().cast(), &mut sc, &mut dev)
                },
                "connect",
            );
        }
        if rc.is_null() {
            // SAFETY: the live listen comm, valid out-pointers.
            ok(
                unsafe { NET.accept.unwrap()(lc, &mut rc, &mut dev) },
                "accept",
            );
        }
    }
    // SAFETY: accepted: closed once.
    ok(unsafe { NET.closeListen.unwrap()(lc) }, "closeListen");
    (sc, rc)
}

fn reg(comm: Vp, m: &Mem, len: usize) -> Vp {
    reg_at(comm, m.addr() as usize, len)
}

/// `regMr` of `[addr, addr+len)`, memory the caller keeps allocated until it is deregistered.
fn reg_at(comm: Vp, addr: usize, len: usize) -> Vp {
    let mut mh: Vp = std::ptr::null_mut();
    // SAFETY: a live comm; the caller keeps the memory allocated until the deregistration.
    ok(
        unsafe { NET.regMr.unwrap()(comm, addr as Vp, len, NCCL_PTR_HOST, &mut mh) },
        "regMr",
    );
    mh
}

fn dereg(comm: Vp, mh: Vp) {
    // SAFETY: a live comm and its live mhandle.
    ok(unsafe { NET.deregMr.unwrap()(comm, mh) }, "deregMr");
}

struct Conn {
    sc: Vp,
    rc: Vp,
    sbuf: Mem,
    rbuf: Mem,
    smh: Vp,
    rmh: Vp,
}

const SIZE: usize = 4096;

fn conn(ctx: Vp) -> Conn {
    let (sc, rc) = pair(ctx);
    let (sbuf, rbuf) = (Mem::new(SIZE), Mem::new(SIZE));
    let smh = reg(sc, &sbuf, SIZE);
    let rmh = reg(rc, &rbuf, SIZE);
    Conn {
        sc,
        rc,
        sbuf,
        rbuf,
        smh,
        rmh,
    }
}

/// One round: irecv, isend (each posted again while NULL), then test both until done.
fn round(c: &Conn) {
    let mut rreq: Vp = std::ptr::null_mut();
    while rreq.is_null() {
        let mut data = [c.rbuf.addr()];
        let mut sizes = [SIZE];
        let mut tags: [c_int; 1] = [7];
        let mut mhs = [c.rmh];
        let mut ph = [std::ptr::null_mut()];
        // SAFETY: arrays of one element each; live comm and mhandle.
        ok(
            unsafe {
                NET.irecv.unwrap()(
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
    let mut sreq: Vp = std::ptr::null_mut();
    while sreq.is_null() {
        // SAFETY: live comm and mhandle.
        ok(
            unsafe {
                NET.isend.unwrap()(
                    c.sc,
                    c.sbuf.addr(),
                    SIZE,
                    7,
                    c.smh,
                    std::ptr::null_mut(),
                    &mut sreq,
                )
            },
            "isend",
        );
    }
    let (mut sd, mut rd) = (0, 0);
    let mut sizes = [0 as c_int; 64];
    while sd == 0 || rd == 0 {
        if sd == 0 {
            // SAFETY: a live request; `sizes` has 64 ints.
            ok(
                unsafe { NET.test.unwrap()(sreq, &mut sd, sizes.as_mut_ptr()) },
                "test",
            );
        }
        if rd == 0 {
            // SAFETY: as above.
            ok(
                unsafe { NET.test.unwrap()(rreq, &mut rd, sizes.as_mut_ptr()) },
                "test",
            );
            if rd != 0 {
                assert_eq!(sizes[0] as usize, SIZE, "received size");
            }
        }
    }
}

fn close(c: Conn) {
    dereg(c.sc, c.smh);
    dereg(c.rc, c.rmh);
    // SAFETY: live comms, closed once.
    ok(unsafe { NET.closeSend.unwrap()(c.sc) }, "closeSend");
    // SAFETY: as above.
    ok(unsafe { NET.closeRecv.unwrap()(c.rc) }, "closeRecv");
}

/// Runs `rounds` rounds; (total, longest round).
fn rounds(c: &Conn, rounds: usize) -> (Duration, Duration) {
    let mut worst = Duration::ZERO;
    let t0 = Instant::now();
    for _ in 0..rounds {
        let r0 = Instant::now();
        round(c);
        worst = worst.max(r0.elapsed());
    }
    (t0.elapsed(), worst)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn stall(ctx: Vp, n: usize, big: usize) {
    let c = conn(ctx);
    rounds(&c, 20); // warm-up: clear-to-send credits, caches
    let (quiet, quiet_worst) = rounds(&c, n);
    // Freed after the registering thread is joined.
    let big_mem = Mem::new(big);
    let stop = Arc::new(AtomicBool::new(false));
    let regs = Arc::new(AtomicU64::new(0));
    let reg_ns = Arc::new(AtomicU64::new(0));
    let th = {
        let (stop, regs, reg_ns) = (Arc::clone(&stop), Arc::clone(&regs), Arc::clone(&reg_ns));
        let (sc, at) = (c.sc as usize, big_mem.addr() as usize);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let mh = reg_at(sc as Vp, at, big);
                dereg(sc as Vp, mh);
                reg_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                regs.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // The loop is running once its first registration is done.
    while regs.load(Ordering::Relaxed) == 0 && !th.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (busy, busy_worst) = rounds(&c, n);
    stop.store(true, Ordering::Relaxed);
    th.join().unwrap();
    drop(big_mem);
    let k = regs.load(Ordering::Relaxed).max(1);
    println!(
        "REGSTALL rounds={n} size={SIZE} big_mib={} quiet_ms={:.1} quiet_longest_ms={:.2} \
         busy_ms={:.1} busy_longest_ms={:.2} registrations={k} reg_dereg_ms={:.1} ratio={:.2}",
        big >> 20,
        ms(quiet),
        ms(quiet_worst),
        ms(busy),
        ms(busy_worst),
        reg_ns.load(Ordering::Relaxed) as f64 / k as f64 / 1e6,
        busy.as_secs_f64() / quiet.as_secs_f64().max(1e-9)
    );
    close(c);
}

/// `VmPin` of this process in KiB (what `ib_umem_get` charges for pinned pages).
fn vm_pin_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmPin:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn pinned(ctx: Vp) {
    const CONNS: usize = 8;
    const LEN: usize = 64 << 20;
    let pairs: Vec<(Vp, Vp)> = (0..CONNS).map(|_| pair(ctx)).collect();
    let buf = Mem::new(LEN);
    let before = vm_pin_kib();
    let mhs: Vec<Vp> = pairs.iter().map(|&(sc, _)| reg(sc, &buf, LEN)).collect();
    let after = vm_pin_kib();
    match (before, after) {
        (Some(b), Some(a)) => println!(
            "REGSTALL pinned: one {} MiB buffer on {CONNS} send comms: VmPin grew {} MiB",
            LEN >> 20,
            a.saturating_sub(b) >> 10
        ),
        _ => println!("REGSTALL pinned: /proc/self/status has no VmPin line"),
    }
    for (&(sc, rc), mh) in pairs.iter().zip(mhs) {
        dereg(sc, mh);
        // SAFETY: live comms, closed once.
        ok(unsafe { NET.closeSend.unwrap()(sc) }, "closeSend");
        // SAFETY: as above.
        ok(unsafe { NET.closeRecv.unwrap()(rc) }, "closeRecv");
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(1000, |a| a.parse().expect("ROUNDS"));
    let big_mib: usize = args.next().map_or(256, |a| a.parse().expect("BIG_MIB"));
    let ctx = init();
    stall(ctx, n, big_mib << 20);
    pinned(ctx);
    // SAFETY: the context from init, finalized once.
    ok(unsafe { NET.finalize.unwrap()(ctx) }, "finalize");
}
