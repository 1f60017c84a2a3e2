//! Tests of the adapters through the real vtables (instantiated over in-memory mock backends), the panic
//! guard, and the C/Rust layout agreement.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::undocumented_unsafe_blocks
)]

use std::ffi::{CStr, c_int, c_void};
use std::os::fd::BorrowedFd;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::abi::{self, ncclResult_t as R};
use super::testsupport;
use super::vtables;
use crate::error::{Error, Result};
use crate::plugin::{
    Backend, CommInfo, CommRef, FlushBuf, Handle, NetAttr, Properties, RecvBuf, Region, Slot,
};

type Vp = *mut c_void;

// ----- mock backend --------------------------------------------------------------------------------------------

#[derive(Debug)]
pub struct MockListen {
    dev: usize,
    polls: u32,
}
#[derive(Debug)]
pub struct MockSend {
    dev: usize,
    traffic_class: Option<i32>,
}
#[derive(Debug)]
pub struct MockRecv {
    dev: usize,
}
#[derive(Debug)]
pub struct MockMr {
    region: Region,
}
#[derive(Debug)]
pub struct MockReq {
    polls: u32,
    sizes: Vec<usize>,
}

static OPENS: AtomicUsize = AtomicUsize::new(0);
static DROPS: AtomicUsize = AtomicUsize::new(0);
static CLOSES: AtomicUsize = AtomicUsize::new(0);
static LAST_ATTR: Mutex<Option<NetAttr>> = Mutex::new(None);

fn mock_devices() -> Vec<Properties> {
    let mut d0 = Properties::host(
        "mock0",
        Some("/sys/devices/pci0000:00/0000:00:02.0"),
        0x1122,
    )
    .unwrap();
    d0.speed_mbps = 200_000;
    d0.latency_us = 1.5;
    d0.reg_is_global = true;
    d0.rail_id = Some(3);
    let mut d1 = Properties::host("mock1", None, 0x3344).unwrap();
    d1.port = 2;
    d1.vdevs = vec![0, 1, 3, 4, 5];
    vec![d0, d1]
}

macro_rules! mock_backend {
    ($name:ident) => {
        #[derive(Debug)]
        pub struct $name {
            devices: Vec<Properties>,
        }

        impl Drop for $name {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }

        impl Backend for $name {
            type Listen = MockListen;
            type Send = MockSend;
            type Recv = MockRecv;
            type Mr = MockMr;
            type Request = MockReq;

            fn slot() -> &'static Slot<Self> {
                static SLOT: Slot<$name> = Slot::new();
                &SLOT
            }

            fn open() -> Result<Self> {
                OPENS.fetch_add(1, Ordering::SeqCst);
                Ok($name {
                    devices: mock_devices(),
                })
            }

            fn devices(&self) -> &[Properties] {
                &self.devices
            }

            fn listen(
                self: &Arc<Self>,
                _: &CommInfo,
                dev: usize,
                h: &mut Handle,
            ) -> Result<MockListen> {
                h[0] = 0xab;
                h[1] = dev as u8;
                Ok(MockListen { dev, polls: 0 })
            }

            fn connect(
                self: &Arc<Self>,
                info: &CommInfo,
                dev: usize,
                h: &mut Handle,
            ) -> Result<Option<MockSend>> {
                if h[0] != 0xab {
                    return Err(Error::Remote("handle magic mismatch".into()));
                }
                // First call: in progress, state kept in the persistent handle copy.
                h[100] += 1;
                Ok((h[100] >= 2).then_some(MockSend {
                    dev,
                    traffic_class: info.traffic_class,
                }))
            }

            fn accept(l: &mut MockListen) -> Result<Option<MockRecv>> {
                l.polls += 1;
                Ok((l.polls >= 2).then_some(MockRecv { dev: l.dev }))
            }

            fn reg_mr(comm: CommRef<'_, Self>, region: Region) -> Result<MockMr> {
                match comm {
                    CommRef::Send(s) => assert!(s.dev < 2),
                    CommRef::Recv(r) => assert!(r.dev < 2),
                }
                Ok(MockMr { region })
            }

            fn reg_mr_dmabuf(
                comm: CommRef<'_, Self>,
                region: Region,
                _: u64,
                _: BorrowedFd<'_>,
            ) -> Result<MockMr> {
                Self::reg_mr(comm, region)
            }

            fn dereg_mr(_: CommRef<'_, Self>, _: MockMr) -> Result<()> {
                Ok(())
            }

            fn isend(
                _: &MockSend,
                addr: usize,
                size: usize,
                tag: i32,
                mr: &MockMr,
            ) -> Result<Option<MockReq>> {
                if tag == 666 {
                    panic!("mock isend panics on tag 666");
                }
                if tag == -5 {
                    return Ok(None);
                }
                let (start, len) = (mr.region.mem.addr() as usize, mr.region.mem.len());
                if addr < start || addr + size > start + len {
                    return Err(Error::InvalidArgument(
                        "buffer outside its registration".into(),
                    ));
                }
                Ok(Some(MockReq {
                    polls: 0,
                    sizes: vec![size],
                }))
            }

            fn irecv(_: &MockRecv, bufs: &[RecvBuf<'_, MockMr>]) -> Result<Option<MockReq>> {
                Ok(Some(MockReq {
                    polls: 0,
                    sizes: bufs
                        .iter()
                        .map(|b| b.size.min(100) + b.tag as usize)
                        .collect(),
                }))
            }

            fn iflush(_: &MockRecv, _: &[FlushBuf<'_, MockMr>]) -> Result<Option<MockReq>> {
                Ok(None)
            }

            fn test(req: &mut MockReq, sizes: &mut [usize]) -> Result<bool> {
                req.polls += 1;
                if req.polls < 2 {
                    return Ok(false);
                }
                sizes.copy_from_slice(&req.sizes[..sizes.len()]);
                Ok(true)
            }

            fn close_send(_: MockSend) -> Result<()> {
                CLOSES.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }

            fn close_recv(_: MockRecv) -> Result<()> {
                CLOSES.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }

            fn close_listen(_: MockListen) -> Result<()> {
                CLOSES.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }

            fn set_net_attr(&self, _: &CommInfo, attr: &NetAttr) -> Result<()> {
                *LAST_ATTR.lock().unwrap() = Some(*attr);
                Ok(())
            }
        }
    };
}
mock_backend!(Mock);
mock_backend!(MockRc);

/// Mock tests share counters and slots: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

fn ok(r: R) {
    assert_eq!(
        r,
        R::ncclSuccess,
        "expected ncclSuccess, got {r:?}; log: {:?}",
        testsupport::take_log()
    );
}

// ----- one driver for every version ----------------------------------------------------------------------------

/// The version-specific calls, behind one interface so every version runs the same scenario.
trait Shape {
    fn init(&self) -> (R, Vp);
    fn finalize(&self, ctx: Vp) -> Option<R>;
    fn listen(&self, ctx: Vp, dev: c_int, h: &mut Handle) -> (R, Vp);
    fn connect(&self, ctx: Vp, dev: c_int, h: &mut Handle) -> (R, Vp);
    fn accept(&self, l: Vp) -> (R, Vp);
    fn reg_mr(&self, comm: Vp, addr: usize, size: usize) -> (R, Vp);
    fn isend(&self, s: Vp, addr: usize, size: usize, tag: c_int, mh: Vp) -> (R, Vp);
    fn irecv(
        &self,
        r: Vp,
        addrs: &[usize],
        sizes: &[usize],
        tags: &[c_int],
        mhs: &[Vp],
        preset: Vp,
    ) -> (R, Vp);
    fn common(&self) -> Common;
    /// (name, pciPath, guid, speed, port, latency, maxRecvs, ndevs/devs or None, rail, plane)
    fn props(&self, dev: c_int) -> (R, PropsSeen);
    fn max_vdevs(&self) -> usize;
}

#[derive(Debug, Default, Clone, PartialEq)]
struct PropsSeen {
    name: String,
    pci: Option<String>,
    guid: u64,
    speed: c_int,
    port: c_int,
    latency: f32,
    max_recvs: c_int,
    reg_is_global: Option<c_int>,
    vdevs: Option<Vec<c_int>>,
    max_p2p: Option<usize>,
    multi: Option<c_int>,
    rail_plane: Option<(i16, i16)>,
}

/// Fields with the same type in every version.
struct Common {
    devices: unsafe extern "C" fn(*mut c_int) -> R,
    dereg_mr: unsafe extern "C" fn(Vp, Vp) -> R,
    iflush: unsafe extern "C" fn(Vp, c_int, *mut Vp, *mut c_int, *mut Vp, *mut Vp) -> R,
    test: unsafe extern "C" fn(Vp, *mut c_int, *mut c_int) -> R,
    close_send: unsafe extern "C" fn(Vp) -> R,
    close_recv: unsafe extern "C" fn(Vp) -> R,
    close_listen: unsafe extern "C" fn(Vp) -> R,
}

fn cstr(p: *const std::ffi::c_char) -> Option<String> {
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

macro_rules! common {
    ($vt:expr) => {
        Common {
            devices: $vt.devices.unwrap(),
            dereg_mr: $vt.deregMr.unwrap(),
            iflush: $vt.iflush.unwrap(),
            test: $vt.test.unwrap(),
            close_send: $vt.closeSend.unwrap(),
            close_recv: $vt.closeRecv.unwrap(),
            close_listen: $vt.closeListen.unwrap(),
        }
    };
}

macro_rules! base_props {
    ($p:expr) => {
        PropsSeen {
            name: cstr($p.name).unwrap_or_default(),
            pci: cstr($p.pciPath),
            guid: $p.guid,
            speed: $p.speed,
            port: $p.port,
            latency: $p.latency,
            max_recvs: $p.maxRecvs,
            ..Default::default()
        }
    };
}

macro_rules! shape {
    ($t:ty, $props:ty, vdevs: $nv:expr,
     init: |$s0:ident| $init:expr,
     finalize: |$s1:ident, $c1:ident| $fin:expr,
     listen: |$s2:ident, $c2:ident, $d2:ident, $h2:ident, $o2:ident| $listen:expr,
     connect: |$s3:ident, $c3:ident, $d3:ident, $h3:ident, $o3:ident| $connect:expr,
     accept: |$s4:ident, $l4:ident, $o4:ident| $accept:expr,
     regmr: $rs:ty,
     isend: |$s5:ident, $sc5:ident, $a5:ident, $n5:ident, $t5:ident, $m5:ident, $o5:ident| $isend:expr,
     irecv: $irs:ty, |$s6:ident, $rc6:ident, $n6:ident, $d6:ident, $z6:ident, $t6:ident, $m6:ident, $o6:ident| $irecv:expr,
     props: |$pp:ident, $seen:ident| $extra:expr) => {
        impl Shape for $t {
            fn init(&self) -> (R, Vp) {
                let $s0 = self;
                $init
            }
            fn finalize(&self, $c1: Vp) -> Option<R> {
                let $s1 = self;
                $fin
            }
            fn listen(&self, $c2: Vp, $d2: c_int, $h2: &mut Handle) -> (R, Vp) {
                let $s2 = self;
                let mut $o2: Vp = null_mut();
                let r = $listen;
                (r, $o2)
            }
            fn connect(&self, $c3: Vp, $d3: c_int, $h3: &mut Handle) -> (R, Vp) {
                let $s3 = self;
                let mut $o3: Vp = null_mut();
                let r = $connect;
                (r, $o3)
            }
            fn accept(&self, $l4: Vp) -> (R, Vp) {
                let $s4 = self;
                let mut $o4: Vp = null_mut();
                let r = $accept;
                (r, $o4)
            }
            fn reg_mr(&self, comm: Vp, addr: usize, size: usize) -> (R, Vp) {
                let mut mh: Vp = null_mut();
                let r = unsafe { self.regMr.unwrap()(comm, addr as Vp, size as $rs, 1, &mut mh) };
                (r, mh)
            }
            fn isend(&self, $sc5: Vp, $a5: usize, $n5: usize, $t5: c_int, $m5: Vp) -> (R, Vp) {
                let $s5 = self;
                let mut $o5: Vp = 0x1 as Vp;
                let r = $isend;
                (r, $o5)
            }
            fn irecv(
                &self,
                $rc6: Vp,
                addrs: &[usize],
                sizes: &[usize],
                tags: &[c_int],
                mhs: &[Vp],
                preset: Vp,
            ) -> (R, Vp) {
                let $s6 = self;
                let $n6 = addrs.len() as c_int;
                let mut data: Vec<Vp> = addrs.iter().map(|&a| a as Vp).collect();
                let mut sz: Vec<$irs> = sizes.iter().map(|&s| s as $irs).collect();
                let mut tg = tags.to_vec();
                let mut mh = mhs.to_vec();
                let ($d6, $z6, $t6, $m6) = (
                    data.as_mut_ptr(),
                    sz.as_mut_ptr(),
                    tg.as_mut_ptr(),
                    mh.as_mut_ptr(),
                );
                let mut $o6: Vp = preset;
                let r = $irecv;
                (r, $o6)
            }
            fn common(&self) -> Common {
                common!(self)
            }
            fn props(&self, dev: c_int) -> (R, PropsSeen) {
                let mut $pp = <$props>::default();
                let r = unsafe { self.getProperties.unwrap()(dev, &mut $pp) };
                #[allow(unused_mut)]
                let mut $seen = base_props!($pp);
                $extra;
                (r, $seen)
            }
            fn max_vdevs(&self) -> usize {
                $nv
            }
        }
    };
}

shape!(abi::ncclNet_v6_t, abi::ncclNetProperties_v6_t, vdevs: 0,
    init: |s| (unsafe { s.init.unwrap()(Some(testsupport::c_logger())) }, null_mut()),
    finalize: |_s, _c| None,
    listen: |s, _c, d, h, o| unsafe { s.listen.unwrap()(d, h.as_mut_ptr().cast(), &mut o) },
    connect: |s, _c, d, h, o| unsafe { s.connect.unwrap()(d, h.as_mut_ptr().cast(), &mut o) },
    accept: |s, l, o| unsafe { s.accept.unwrap()(l, &mut o) },
    regmr: c_int,
    isend: |s, sc, a, n, t, m, o| unsafe { s.isend.unwrap()(sc, a as Vp, n as c_int, t, m, &mut o) },
    irecv: c_int, |s, rc, n, d, z, t, m, o| unsafe { s.irecv.unwrap()(rc, n, d, z, t, m, &mut o) },
    props: |p, _seen| { let _unused = p.guid; });

macro_rules! v7_like {
    ($t:ty, $props:ty, $rs:ty, $is:ty, |$pp:ident, $seen:ident| $extra:expr, vdevs: $nv:expr) => {
        shape!($t, $props, vdevs: $nv,
            init: |s| (unsafe { s.init.unwrap()(Some(testsupport::c_logger())) }, null_mut()),
            finalize: |_s, _c| None,
            listen: |s, _c, d, h, o| unsafe { s.listen.unwrap()(d, h.as_mut_ptr().cast(), &mut o) },
            connect: |s, _c, d, h, o| {
                let mut dh: *mut abi::ncclNetDeviceHandle_v7_t = null_mut();
                unsafe { s.connect.unwrap()(d, h.as_mut_ptr().cast(), &mut o, &mut dh) }
            },
            accept: |s, l, o| {
                let mut dh: *mut abi::ncclNetDeviceHandle_v7_t = null_mut();
                unsafe { s.accept.unwrap()(l, &mut o, &mut dh) }
            },
            regmr: $rs,
            isend: |s, sc, a, n, t, m, o| unsafe { s.isend.unwrap()(sc, a as Vp, n as $is, t, m, &mut o) },
            irecv: $is, |s, rc, n, d, z, t, m, o| unsafe { s.irecv.unwrap()(rc, n, d, z, t, m, &mut o) },
            props: |$pp, $seen| $extra);
    };
}
v7_like!(abi::ncclNet_v7_t, abi::ncclNetProperties_v7_t, c_int, c_int, |p, _s| {
    assert_eq!(p.netDeviceType, abi::ncclNetDeviceType::NCCL_NET_DEVICE_HOST);
}, vdevs: 0);
v7_like!(abi::ncclNet_v8_t, abi::ncclNetProperties_v8_t, usize, c_int, |p, s| {
    s.reg_is_global = Some(p.regIsGlobal);
}, vdevs: 0);
v7_like!(abi::ncclNet_v9_t, abi::ncclNetProperties_v9_t, usize, usize, |p, s| {
    s.reg_is_global = Some(p.regIsGlobal);
    s.vdevs = Some(p.vProps.devs[..p.vProps.ndevs as usize].to_vec());
    s.max_p2p = Some(p.maxP2pBytes);
}, vdevs: 4);

shape!(abi::ncclNet_v10_t, abi::ncclNetProperties_v10_t, vdevs: 4,
init: |s| (unsafe { s.init.unwrap()(Some(testsupport::c_logger()), None) }, null_mut()),
finalize: |_s, _c| None,
listen: |s, _c, d, h, o| unsafe { s.listen.unwrap()(d, h.as_mut_ptr().cast(), &mut o) },
connect: |s, _c, d, h, o| {
    let mut dh: *mut abi::ncclNetDeviceHandle_v7_t = null_mut();
    let mut cfg = abi::ncclNetCommConfig_v10_t { trafficClass: 106 };
    unsafe { s.connect.unwrap()(d, &mut cfg, h.as_mut_ptr().cast(), &mut o, &mut dh) }
},
accept: |s, l, o| {
    let mut dh: *mut abi::ncclNetDeviceHandle_v7_t = null_mut();
    unsafe { s.accept.unwrap()(l, &mut o, &mut dh) }
},
regmr: usize,
isend: |s, sc, a, n, t, m, o| unsafe { s.isend.unwrap()(sc, a as Vp, n, t, m, null_mut(), &mut o) },
irecv: usize, |s, rc, n, d, z, t, m, o| unsafe { s.irecv.unwrap()(rc, n, d, z, t, m, null_mut(), &mut o) },
props: |p, s| {
    s.reg_is_global = Some(p.regIsGlobal);
    s.vdevs = Some(p.vProps.devs[..p.vProps.ndevs as usize].to_vec());
    s.max_p2p = Some(p.maxP2pBytes);
});

macro_rules! v11_like {
    ($t:ty, $props:ty, $cfg:ty, vdevs: $nv:expr, |$pp:ident, $seen:ident| $extra:expr) => {
        shape!($t, $props, vdevs: $nv,
            init: |s| {
                let mut ctx: Vp = null_mut();
                let mut cfg = <$cfg>::default();
                cfg.trafficClass = abi::NCCL_NET_TRAFFIC_CLASS_UNDEF;
                let r = unsafe { s.init.unwrap()(&mut ctx, 0xc0ffee, &mut cfg, Some(testsupport::c_logger()), None) };
                (r, ctx)
            },
            finalize: |s, c| Some(unsafe { s.finalize.unwrap()(c) }),
            listen: |s, c, d, h, o| unsafe { s.listen.unwrap()(c, d, h.as_mut_ptr().cast(), &mut o) },
            connect: |s, c, d, h, o| {
                let mut dh: *mut abi::ncclNetDeviceHandle_v7_t = null_mut();
                unsafe { s.connect.unwrap()(c, d, h.as_mut_ptr().cast(), &mut o, &mut dh) }
            },
            accept: |s, l, o| {
                let mut dh: *mut abi::ncclNetDeviceHandle_v7_t = null_mut();
                unsafe { s.accept.unwrap()(l, &mut o, &mut dh) }
            },
            regmr: usize,
            isend: |s, sc, a, n, t, m, o| unsafe { s.isend.unwrap()(sc, a as Vp, n, t, m, null_mut(), &mut o) },
            irecv: usize, |s, rc, n, d, z, t, m, o| unsafe { s.irecv.unwrap()(rc, n, d, z, t, m, null_mut(), &mut o) },
            props: |$pp, $seen| $extra);
    };
}
v11_like!(abi::ncclNet_v11_t, abi::ncclNetProperties_v11_t, abi::ncclNetCommConfig_v11_t, vdevs: 4, |p, s| {
    s.reg_is_global = Some(p.regIsGlobal);
    s.vdevs = Some(p.vProps.devs[..p.vProps.ndevs as usize].to_vec());
    s.max_p2p = Some(p.maxP2pBytes);
    s.multi = Some(p.maxMultiRequestSize);
});
v11_like!(abi::ncclNet_v12_t, abi::ncclNetProperties_v12_t, abi::ncclNetCommConfig_v12_t, vdevs: 8, |p, s| {
    s.reg_is_global = Some(p.regIsGlobal);
    s.vdevs = Some(p.vProps.devs[..p.vProps.ndevs as usize].to_vec());
    s.max_p2p = Some(p.maxP2pBytes);
    s.multi = Some(p.maxMultiRequestSize);
    s.rail_plane = Some((p.railId, p.planeId));
});

/// The whole life of a connection pair through one version's vtable.
fn scenario(v: &dyn Shape, version: u32) {
    testsupport::take_log();
    let c = v.common();
    let (r, ctx) = v.init();
    ok(r);
    let mut n: c_int = -1;
    ok(unsafe { (c.devices)(&mut n) });
    assert_eq!(n, 2);

    // Properties, per version.
    let (r, p0) = v.props(0);
    ok(r);
    assert_eq!(p0.name, "mock0");
    assert_eq!(
        p0.pci.as_deref(),
        Some("/sys/devices/pci0000:00/0000:00:02.0")
    );
    assert_eq!(
        (p0.guid, p0.speed, p0.port, p0.latency, p0.max_recvs),
        (0x1122, 200_000, 1, 1.5, 8)
    );
    if version >= 8 {
        assert_eq!(p0.reg_is_global, Some(1));
    }
    if version >= 9 {
        assert_eq!(
            p0.vdevs.as_deref(),
            Some(&[0][..]),
            "physical device = {{1, {{dev}}}}"
        );
        assert_eq!(p0.max_p2p, Some(1 << 40));
    }
    if version >= 11 {
        assert_eq!(p0.multi, Some(1));
    }
    if version == 12 {
        assert_eq!(p0.rail_plane, Some((3, -1)));
    }
    let (r, p1) = v.props(1);
    if v.max_vdevs() == 0 || v.max_vdevs() >= 5 {
        ok(r);
        assert_eq!(p1.pci, None);
        if version == 12 {
            assert_eq!(p1.vdevs.as_deref(), Some(&[0, 1, 3, 4, 5][..]));
        }
    } else {
        assert_eq!(
            r,
            R::ncclInternalError,
            "5 fused devices do not fit v{version}'s vProps"
        );
    }
    assert_eq!(v.props(2).0, R::ncclInvalidArgument);
    assert_eq!(v.props(-1).0, R::ncclInvalidArgument);

    // listen / connect (retried with the same handle) / accept (retried).
    let mut h: Handle = [0; 128];
    let (r, l) = v.listen(ctx, 0, &mut h);
    ok(r);
    assert!(!l.is_null());
    assert_eq!(&h[..2], &[0xab, 0]);
    let mut hc = h;
    let (r, s) = v.connect(ctx, 0, &mut hc);
    ok(r);
    assert!(s.is_null(), "first connect is in progress");
    let (r, s) = v.connect(ctx, 0, &mut hc);
    ok(r);
    assert!(!s.is_null());
    let (r, rc) = v.accept(l);
    ok(r);
    assert!(rc.is_null());
    let (r, rc) = v.accept(l);
    ok(r);
    assert!(!rc.is_null());
    ok(unsafe { (c.close_listen)(l) });

    // Registration and transfers.
    let buf = vec![0u8; 4096];
    let base = buf.as_ptr() as usize;
    let (r, smr) = v.reg_mr(s, base, 4096);
    ok(r);
    let (r, rmr) = v.reg_mr(rc, base, 4096);
    ok(r);
    let (r, req) = v.isend(s, base, 1000, 7, smr);
    ok(r);
    assert!(!req.is_null());
    let (r, none) = v.isend(s, base, 1000, -5, smr);
    ok(r);
    assert!(none.is_null(), "a retry must leave a NULL request");
    let mut done: c_int = 0;
    let mut size: c_int = -1;
    ok(unsafe { (c.test)(req, &mut done, &mut size) });
    assert_eq!(done, 0);
    ok(unsafe { (c.test)(req, &mut done, &mut size) });
    assert_eq!((done, size), (1, 1000));

    // irecv entered with *request = NCCL_NET_OPTIONAL_RECV_COMPLETION is overwritten.
    let (r, rreq) = v.irecv(
        rc,
        &[base, base + 2048],
        &[2048, 50],
        &[1, 2],
        &[rmr, rmr],
        0x1 as Vp,
    );
    ok(r);
    assert!(!rreq.is_null() && rreq != 0x1 as Vp);
    let mut sizes = [-1 as c_int; 64];
    ok(unsafe { (c.test)(rreq, &mut done, sizes.as_mut_ptr()) });
    ok(unsafe { (c.test)(rreq, &mut done, sizes.as_mut_ptr()) });
    assert_eq!((done, &sizes[..3]), (1, &[101, 52, -1][..]));

    // iflush with nothing to wait for: NULL request.
    let mut data = [base as Vp];
    let mut fsz = [10 as c_int];
    let mut fmh = [rmr];
    let mut freq: Vp = 0x1 as Vp;
    ok(unsafe {
        (c.iflush)(
            rc,
            1,
            data.as_mut_ptr(),
            fsz.as_mut_ptr(),
            fmh.as_mut_ptr(),
            &mut freq,
        )
    });
    assert!(freq.is_null());

    // A send comm where a recv comm is required, and NULLs, are rejected.
    let (r, _) = v.irecv(s, &[base], &[10], &[0], &[rmr], 0x1 as Vp);
    assert_eq!(r, R::ncclInvalidArgument);
    assert_eq!(
        unsafe { (c.test)(null_mut(), &mut done, null_mut()) },
        R::ncclInvalidArgument
    );
    assert_eq!(unsafe { (c.devices)(null_mut()) }, R::ncclInvalidArgument);
    assert_eq!(unsafe { (c.close_recv)(s) }, R::ncclInvalidArgument);

    // A panic inside the backend becomes ncclInternalError and a WARN line.
    testsupport::take_log();
    let (r, _) = v.isend(s, base, 10, 666, smr);
    assert_eq!(r, R::ncclInternalError);
    let log = testsupport::take_log();
    assert!(
        log.iter().any(|l| l.level == 2
            && l.text.contains("isend")
            && l.text.contains("mock isend panics")),
        "{log:?}"
    );

    ok(unsafe { (c.dereg_mr)(s, smr) });
    ok(unsafe { (c.dereg_mr)(rc, rmr) });
    let before = CLOSES.load(Ordering::SeqCst);
    ok(unsafe { (c.close_send)(s) });
    ok(unsafe { (c.close_recv)(rc) });
    assert_eq!(CLOSES.load(Ordering::SeqCst), before + 2);
    if let Some(r) = v.finalize(ctx) {
        ok(r);
    }
    drop(buf);
}

#[test]
fn every_version_runs_the_same_scenario() {
    let _g = serial();
    scenario(&vtables::net_v6::<Mock>(), 6);
    scenario(&vtables::net_v7::<Mock>(), 7);
    scenario(&vtables::net_v8::<Mock>(), 8);
    scenario(&vtables::net_v9::<Mock>(), 9);
    scenario(&vtables::net_v10::<Mock>(), 10);
    scenario(&vtables::net_v11::<Mock>(), 11);
    scenario(&vtables::net_v12::<Mock>(), 12);
}

#[test]
fn shapes_that_must_be_null_or_set() {
    let v12 = vtables::net_v12::<Mock>();
    assert!(v12.finalize.is_some() && v12.setNetAttr.is_some());
    assert!(v12.makeVDevice.is_none() && v12.irecvConsumed.is_none());
    assert!(v12.getDeviceMr.is_some() && v12.regMrDmaBuf.is_some());
    let v11 = vtables::net_v11::<Mock>();
    assert!(v11.finalize.is_some() && v11.makeVDevice.is_none() && v11.irecvConsumed.is_none());
    assert!(vtables::net_v9::<Mock>().makeVDevice.is_none());
    for name in [v12.name, v11.name, vtables::net_v6::<Mock>().name] {
        assert_eq!(cstr(name).as_deref(), Some("switchless"));
    }
    let mut dptr: Vp = 0x1 as Vp;
    ok(unsafe { v12.getDeviceMr.unwrap()(null_mut(), null_mut(), &mut dptr) });
    assert!(dptr.is_null());
}

#[test]
fn per_communicator_contexts_share_one_backend_and_the_last_releases_it() {
    let _g = serial();
    let v = vtables::net_v12::<MockRc>();
    let (o0, d0) = (OPENS.load(Ordering::SeqCst), DROPS.load(Ordering::SeqCst));
    let (r, a) = Shape::init(&v);
    ok(r);
    let (r, b) = Shape::init(&v);
    ok(r);
    assert_ne!(a, b);
    assert_eq!(
        OPENS.load(Ordering::SeqCst),
        o0 + 1,
        "one backend for both contexts"
    );
    let mut n = 0;
    ok(unsafe { v.devices.unwrap()(&mut n) });
    assert_eq!(n, 2);

    // setNetAttr reaches the backend with UNDEF as None.
    let mut attr = abi::ncclNetAttr_v12_t {
        sendCommAttr: abi::ncclNetCommAttr_v12_t {
            maxConcurrentPeers: 4,
            minConcurrentPeers: -1,
            maxFlowsPerPeer: 2,
            minFlowsPerPeer: -1,
        },
        recvCommAttr: abi::ncclNetCommAttr_v12_t {
            maxConcurrentPeers: -1,
            minConcurrentPeers: -1,
            maxFlowsPerPeer: -1,
            minFlowsPerPeer: -1,
        },
        op: 0x10,
        algo: u32::MAX,
        proto: u32::MAX,
    };
    ok(unsafe { v.setNetAttr.unwrap()(a, &mut attr) });
    let got = LAST_ATTR.lock().unwrap().unwrap();
    assert_eq!(got.send.max_concurrent_peers, Some(4));
    assert_eq!(got.send.min_concurrent_peers, None);
    assert_eq!(got.recv.max_flows_per_peer, None);
    assert_eq!((got.op, got.algo), (Some(0x10), None));
    assert_eq!(
        unsafe { v.setNetAttr.unwrap()(a, null_mut()) },
        R::ncclInvalidArgument
    );

    ok(unsafe { v.finalize.unwrap()(a) });
    assert_eq!(
        DROPS.load(Ordering::SeqCst),
        d0,
        "one context still holds the backend"
    );
    ok(unsafe { v.finalize.unwrap()(b) });
    assert_eq!(
        DROPS.load(Ordering::SeqCst),
        d0 + 1,
        "the last finalize releases the backend"
    );
    ok(unsafe { v.devices.unwrap()(&mut n) });
    assert_eq!(n, 0, "no backend open: 0 devices");

    // A new communicator re-opens it.
    let (r, c) = Shape::init(&v);
    ok(r);
    assert_eq!(OPENS.load(Ordering::SeqCst), o0 + 2);
    ok(unsafe { v.finalize.unwrap()(c) });
    assert_eq!(
        unsafe { v.finalize.unwrap()(null_mut()) },
        R::ncclInvalidArgument
    );
    let mut ctx: Vp = 0x1 as Vp;
    assert_eq!(
        unsafe { v.init.unwrap()(null_mut(), 1, null_mut(), None, None) },
        R::ncclInvalidArgument
    );
    // NULL config is accepted (traffic class undefined).
    ok(unsafe { v.init.unwrap()(&mut ctx, 1, null_mut(), Some(testsupport::c_logger()), None) });
    ok(unsafe { v.finalize.unwrap()(ctx) });
}

#[test]
fn v10_connect_passes_its_config() {
    let _g = serial();
    let v = vtables::net_v10::<Mock>();
    let (r, ctx) = Shape::init(&v);
    ok(r);
    let mut h: Handle = [0; 128];
    let (r, l) = v.listen(ctx, 1, &mut h);
    ok(r);
    let (_, s) = v.connect(ctx, 1, &mut h);
    assert!(s.is_null());
    let (r, s) = v.connect(ctx, 1, &mut h);
    ok(r);
    // The config's traffic class (106) reached the backend's send comm.
    let tc = with_send::<Mock, _>(s, |m| m.traffic_class);
    assert_eq!(tc, Some(106));
    ok(unsafe { v.closeSend.unwrap()(s) });
    ok(unsafe { v.closeListen.unwrap()(l) });
}

/// A connected (send, recv) pair and its listen comm over the v12 vtable of `Mock`.
fn mock_pair(v: &abi::ncclNet_v12_t, ctx: Vp) -> (Vp, Vp, Vp) {
    let mut h: Handle = [0; 128];
    let (r, l) = v.listen(ctx, 0, &mut h);
    ok(r);
    let (mut s, mut rc): (Vp, Vp) = (null_mut(), null_mut());
    while s.is_null() {
        let (r, x) = v.connect(ctx, 0, &mut h);
        ok(r);
        s = x;
    }
    while rc.is_null() {
        let (r, x) = v.accept(l);
        ok(r);
        rc = x;
    }
    (s, rc, l)
}

/// Tests `req` until done.
fn finish(v: &abi::ncclNet_v12_t, req: Vp) {
    let mut done: c_int = 0;
    let mut sizes = [0 as c_int; 64];
    while done == 0 {
        ok(unsafe { v.test.unwrap()(req, &mut done, sizes.as_mut_ptr()) });
    }
}

#[test]
fn double_close_and_test_after_done_are_refused_without_a_dereference() {
    let _g = serial();
    let v = vtables::net_v12::<Mock>();
    let (r, ctx) = Shape::init(&v);
    ok(r);
    let (s, rc, l) = mock_pair(&v, ctx);
    let buf = [0u8; 64];
    let (r, mh) = v.reg_mr(s, buf.as_ptr() as usize, 64);
    ok(r);
    let (r, req) = v.isend(s, buf.as_ptr() as usize, 10, 1, mh);
    ok(r);
    finish(&v, req);
    // Every second use of a freed object is an error naming it, not a read of freed memory (Miri
    // reports one if the registry is bypassed).
    let mut done: c_int = 7;
    assert_eq!(
        unsafe { v.test.unwrap()(req, &mut done, null_mut()) },
        R::ncclInvalidArgument
    );
    assert_eq!(done, 0);
    let (r, _) = v.isend(s, buf.as_ptr() as usize, 10, 1, req);
    assert_eq!(r, R::ncclInvalidArgument, "a freed request is no mhandle");
    ok(unsafe { v.deregMr.unwrap()(s, mh) });
    assert_eq!(unsafe { v.deregMr.unwrap()(s, mh) }, R::ncclInvalidArgument);
    ok(unsafe { v.closeListen.unwrap()(l) });
    assert_eq!(unsafe { v.closeListen.unwrap()(l) }, R::ncclInvalidArgument);
    ok(unsafe { v.closeSend.unwrap()(s) });
    assert_eq!(unsafe { v.closeSend.unwrap()(s) }, R::ncclInvalidArgument);
    let (r, _) = v.isend(s, buf.as_ptr() as usize, 10, 1, mh);
    assert_eq!(r, R::ncclInvalidArgument, "isend on a closed comm");
    // A live object of another kind is refused too.
    assert_eq!(unsafe { v.closeRecv.unwrap()(ctx) }, R::ncclInvalidArgument);
    ok(unsafe { v.closeRecv.unwrap()(rc) });
    assert_eq!(unsafe { v.closeRecv.unwrap()(rc) }, R::ncclInvalidArgument);
    ok(unsafe { v.finalize.unwrap()(ctx) });
    assert_eq!(unsafe { v.finalize.unwrap()(ctx) }, R::ncclInvalidArgument);
    let log = testsupport::take_log();
    assert!(
        log.iter().any(|l| l.text.contains("is not a live")),
        "{log:?}"
    );
}

/// `test` on `req`: the result, and that `done` was cleared.
fn test_once(v: &abi::ncclNet_v12_t, req: Vp) -> R {
    let mut done: c_int = 7;
    let r = unsafe { v.test.unwrap()(req, &mut done, null_mut()) };
    if r != R::ncclSuccess {
        assert_eq!(done, 0, "a refused test reports not done");
    }
    r
}

#[test]
fn a_request_id_that_names_no_live_slot_is_refused() {
    let _g = serial();
    let v = vtables::net_v12::<Mock>();
    let (r, ctx) = Shape::init(&v);
    ok(r);
    let (s, rc, l) = mock_pair(&v, ctx);
    let buf = [0u8; 64];
    let (r, mh) = v.reg_mr(s, buf.as_ptr() as usize, 64);
    ok(r);
    // NULL, NCCL's 0x1 hint, and live objects of every other kind: none is a request.
    for bad in [null_mut(), 1 as Vp, s, rc, l, mh, ctx] {
        assert_eq!(test_once(&v, bad), R::ncclInvalidArgument, "{bad:p}");
    }
    let (r, req) = v.isend(s, buf.as_ptr() as usize, 10, 1, mh);
    ok(r);
    assert!(req as usize > 1, "never NULL nor the 0x1 hint");
    // The next slot, the next slab, and the same slot's other generations name no live request.
    let raw = req as usize;
    for bad in [
        raw ^ 1,
        raw + (1 << 8),
        raw + (1 << 28),
        raw - (1 << 28),
        usize::MAX,
    ] {
        assert_eq!(
            test_once(&v, bad as Vp),
            R::ncclInvalidArgument,
            "{bad:#x} next to {raw:#x}"
        );
    }
    // A request id is no mhandle and no comm (the registry refuses it without a dereference).
    let (r, _) = v.isend(s, buf.as_ptr() as usize, 10, 1, req);
    assert_eq!(r, R::ncclInvalidArgument);
    let (r, _) = v.isend(req, buf.as_ptr() as usize, 10, 1, mh);
    assert_eq!(r, R::ncclInvalidArgument);
    assert_eq!(unsafe { v.closeSend.unwrap()(req) }, R::ncclInvalidArgument);
    finish(&v, req);
    assert_eq!(
        test_once(&v, req),
        R::ncclInvalidArgument,
        "test after done"
    );
    ok(unsafe { v.deregMr.unwrap()(s, mh) });
    ok(unsafe { v.closeSend.unwrap()(s) });
    ok(unsafe { v.closeRecv.unwrap()(rc) });
    ok(unsafe { v.closeListen.unwrap()(l) });
    ok(unsafe { v.finalize.unwrap()(ctx) });
    let log = testsupport::take_log();
    assert!(
        log.iter().any(|l| l.text.contains("is not a live request")),
        "{log:?}"
    );
}

#[test]
fn a_request_of_a_closed_comm_stays_dead_when_its_slab_is_reused() {
    let _g = serial();
    let v = vtables::net_v12::<Mock>();
    let (r, ctx) = Shape::init(&v);
    ok(r);
    let buf = [0u8; 64];
    let (s, rc, l) = mock_pair(&v, ctx);
    let (r, mh) = v.reg_mr(s, buf.as_ptr() as usize, 64);
    ok(r);
    // NCCL aborts: the send comm closes with a request in flight.
    let (r, stale) = v.isend(s, buf.as_ptr() as usize, 10, 1, mh);
    ok(r);
    ok(unsafe { v.deregMr.unwrap()(s, mh) });
    ok(unsafe { v.closeSend.unwrap()(s) });
    assert_eq!(test_once(&v, stale), R::ncclInvalidArgument);
    // The next comm leases the same slab (and gets the same slot), one generation on.
    let mut h: Handle = [0; 128];
    let (r, l2) = v.listen(ctx, 0, &mut h);
    ok(r);
    let mut s2: Vp = null_mut();
    while s2.is_null() {
        let (r, x) = v.connect(ctx, 0, &mut h);
        ok(r);
        s2 = x;
    }
    let (r, mh2) = v.reg_mr(s2, buf.as_ptr() as usize, 64);
    ok(r);
    let (r, fresh) = v.isend(s2, buf.as_ptr() as usize, 10, 1, mh2);
    ok(r);
    let place = |p: Vp| p as usize & ((1 << 28) - 1);
    assert_eq!(place(fresh), place(stale), "same slab and slot reused");
    assert_ne!(fresh, stale);
    assert_eq!(test_once(&v, stale), R::ncclInvalidArgument);
    finish(&v, fresh);
    ok(unsafe { v.deregMr.unwrap()(s2, mh2) });
    ok(unsafe { v.closeSend.unwrap()(s2) });
    ok(unsafe { v.closeRecv.unwrap()(rc) });
    ok(unsafe { v.closeListen.unwrap()(l) });
    ok(unsafe { v.closeListen.unwrap()(l2) });
    ok(unsafe { v.finalize.unwrap()(ctx) });
}

#[test]
fn more_requests_than_nccl_promises_are_a_clear_error() {
    let _g = serial();
    let v = vtables::net_v12::<Mock>();
    let (r, ctx) = Shape::init(&v);
    ok(r);
    let (s, rc, l) = mock_pair(&v, ctx);
    let buf = [0u8; 64];
    let (r, mh) = v.reg_mr(s, buf.as_ptr() as usize, 64);
    ok(r);
    // The mock never says "retry": the slab is the limit (NCCL_NET_MAX_REQUESTS x maxRecvs = 256).
    let reqs: Vec<Vp> = (0..256)
        .map(|_| {
            let (r, req) = v.isend(s, buf.as_ptr() as usize, 10, 1, mh);
            ok(r);
            req
        })
        .collect();
    let (r, req) = v.isend(s, buf.as_ptr() as usize, 10, 1, mh);
    assert_eq!((r, req), (R::ncclInvalidUsage, null_mut()));
    let log = testsupport::take_log();
    assert!(
        log.iter().any(|l| l
            .text
            .contains("more than 256 requests in flight on one comm")),
        "{log:?}"
    );
    finish(&v, reqs[17]);
    // A retry (the mock's tag -5) gives the slot it took back.
    let (r, req) = v.isend(s, buf.as_ptr() as usize, 10, -5, mh);
    assert_eq!((r, req), (R::ncclSuccess, null_mut()));
    let (r, req) = v.isend(s, buf.as_ptr() as usize, 10, 1, mh);
    ok(r);
    assert!(!req.is_null(), "a completed request's slot is free again");
    finish(&v, req);
    for &q in reqs.iter().filter(|&&q| q != reqs[17]) {
        finish(&v, q);
    }
    ok(unsafe { v.deregMr.unwrap()(s, mh) });
    ok(unsafe { v.closeSend.unwrap()(s) });
    ok(unsafe { v.closeRecv.unwrap()(rc) });
    ok(unsafe { v.closeListen.unwrap()(l) });
    ok(unsafe { v.finalize.unwrap()(ctx) });
}

#[test]
fn registration_and_sends_on_one_comm_from_two_threads() {
    let _g = serial();
    let v = vtables::net_v12::<Mock>();
    let (r, ctx) = Shape::init(&v);
    ok(r);
    let (s, rc, l) = mock_pair(&v, ctx);
    let buf = [0u8; 4096];
    let base = buf.as_ptr() as usize;
    let (r, mh) = v.reg_mr(s, base, 4096);
    ok(r);
    let rounds = if cfg!(miri) { 20 } else { 2000 };
    let (su, mhu) = (s as usize, mh as usize);
    // The vtable holds a name pointer (not `Sync`): each thread gets the entry points it calls.
    let (reg, dereg) = (v.regMr.unwrap(), v.deregMr.unwrap());
    let (isend, test) = (v.isend.unwrap(), v.test.unwrap());
    std::thread::scope(|t| {
        // NCCL's service thread: regMr/deregMr on the comm the progress thread sends on.
        t.spawn(move || {
            for _ in 0..rounds {
                let mut m: Vp = null_mut();
                ok(unsafe { reg(su as Vp, base as Vp, 4096, 1, &mut m) });
                ok(unsafe { dereg(su as Vp, m) });
            }
        });
        // The progress thread: isend + test on the same comm.
        t.spawn(move || {
            for i in 0..rounds {
                let mut req: Vp = null_mut();
                let n = i % 4096;
                ok(unsafe { isend(su as Vp, base as Vp, n, 1, mhu as Vp, null_mut(), &mut req) });
                let (mut done, mut size) = (0, 0);
                while done == 0 {
                    ok(unsafe { test(req, &mut done, &mut size) });
                }
                assert_eq!(size as usize, n);
            }
        });
    });
    ok(unsafe { v.deregMr.unwrap()(s, mh) });
    ok(unsafe { v.closeSend.unwrap()(s) });
    ok(unsafe { v.closeRecv.unwrap()(rc) });
    ok(unsafe { v.closeListen.unwrap()(l) });
    ok(unsafe { v.finalize.unwrap()(ctx) });
}

fn with_send<B: Backend<Send = MockSend>, T>(p: Vp, f: impl FnOnce(&MockSend) -> T) -> T {
    let c = unsafe { super::guard::shared::<crate::plugin::Comm<B>>(p, "test") }.unwrap();
    match c.endpoint() {
        crate::plugin::Endpoint::Send(m) => f(m),
        crate::plugin::Endpoint::Recv(_) => panic!("not a send comm"),
    }
}

#[test]
fn negative_int_sizes_and_bad_memory_types_are_invalid_arguments() {
    let _g = serial();
    let v = vtables::net_v6::<Mock>();
    let (r, _) = Shape::init(&v);
    ok(r);
    let mut h: Handle = [0; 128];
    let (_, l) = v.listen(null_mut(), 0, &mut h);
    let _ = v.connect(null_mut(), 0, &mut h);
    let (_, s) = v.connect(null_mut(), 0, &mut h);
    let mut mh: Vp = null_mut();
    assert_eq!(
        unsafe { v.regMr.unwrap()(s, 0x1000 as Vp, -1, 1, &mut mh) },
        R::ncclInvalidArgument
    );
    assert_eq!(
        unsafe { v.regMr.unwrap()(s, 0x1000 as Vp, 10, 3, &mut mh) },
        R::ncclInvalidArgument
    );
    assert_eq!(
        unsafe { v.regMr.unwrap()(l, 0x1000 as Vp, 10, 1, &mut mh) },
        R::ncclInvalidArgument
    );
    assert!(mh.is_null());
    let mut req: Vp = null_mut();
    ok(unsafe { v.regMr.unwrap()(s, 0x1000 as Vp, 10, 1, &mut mh) });
    assert_eq!(
        unsafe { v.isend.unwrap()(s, 0x1000 as Vp, -5, 0, mh, &mut req) },
        R::ncclInvalidArgument
    );
    assert_eq!(
        unsafe { v.regMrDmaBuf.unwrap()(s, 0x1000 as Vp, 10, 4, 0, -1, &mut req) },
        R::ncclInvalidArgument
    );
    ok(unsafe { v.deregMr.unwrap()(s, mh) });
    ok(unsafe { v.closeSend.unwrap()(s) });
    ok(unsafe { v.closeListen.unwrap()(l) });
    let _ = null::<u8>();
}

// ----- guard ---------------------------------------------------------------------------------------------------

#[test]
fn guard_maps_errors_and_panics() {
    use super::guard::guard;
    assert_eq!(guard("t", || Ok(())), R::ncclSuccess);
    for (e, code) in [
        (Error::InvalidArgument("a".into()), 4),
        (Error::InvalidUsage("a".into()), 5),
        (Error::System("a".into()), 2),
        (Error::Remote("a".into()), 6),
        (Error::Timeout("a".into()), 2),
        (Error::Internal("a".into()), 3),
    ] {
        assert_eq!(guard("t", || Err(e.clone())).0, code, "{e}");
    }
    assert_eq!(guard("t", || panic!("boom {}", 1)), R::ncclInternalError);
    assert_eq!(
        guard("t", || std::panic::panic_any(42u8)),
        R::ncclInternalError
    );
    // A panic payload whose Drop panics too must not escape.
    struct Evil;
    impl Drop for Evil {
        fn drop(&mut self) {
            panic!("drop of the payload panics");
        }
    }
    assert_eq!(
        guard("t", || std::panic::panic_any(Evil)),
        R::ncclInternalError
    );
}

#[test]
fn guard_logs_one_warn_line_through_the_c_logger() {
    use super::guard::guard;
    use super::log::{Bridge, LoggerSlot};
    static SLOT: LoggerSlot = LoggerSlot::new();
    SLOT.set(Some(testsupport::c_logger()), None);
    testsupport::take_log();
    let r = tracing::subscriber::with_default(Bridge::new(&SLOT), || {
        guard("listen", || panic!("bad %s %n state\0here"))
    });
    assert_eq!(r, R::ncclInternalError);
    let lines = testsupport::take_log();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].level, 2);
    assert_eq!(
        lines[0].text,
        "switchless listen: internal error: panic: bad %s %n state\\0here"
    );
}

// ----- layout ----------------------------------------------------------------------------------------------------

/// bindgen's Rust types and the C compiler agree on `include/nccl_net_switchless.h`: this checks
/// bindgen, not NCCL (both sides read our header); `the_layout_is_nccls_own` checks NCCL.
#[test]
#[cfg_attr(
    miri,
    ignore = "calls the C layout table built by build.rs; Miri cannot call C"
)]
fn every_struct_and_field_has_the_same_layout_in_c_and_rust() {
    let c = testsupport::c_layout();
    let rust = testsupport::rust_layout();
    assert_eq!(c.len(), rust.len());
    assert!(
        c.len() > 250,
        "{} rows: the table should cover every field of every ABI struct",
        c.len()
    );
    for (row, (ty, field, size, align, offset)) in rust.iter().zip(&c) {
        assert_eq!((row.ty, row.field), (ty.as_str(), field.as_str()));
        assert_eq!(
            (row.size, row.align, row.offset),
            (*size, *align, *offset),
            "{ty}.{field}: Rust (size, align, offset) vs C"
        );
    }
}

/// NCCL's own layout: `tests/fixtures/nccl-abi/nccl-v2.30.7-1.tsv` holds the size of every
/// properties struct and vtable of v6..v12 (and of the structs they contain or take) and the offset
/// and size of every field, as the C compiler computed them from NCCL's headers at tag v2.30.7-1
/// (`layout.py --nccl-src`; each row cites its line in `src/include/plugin/net/net_vN.h` or
/// `src/include/nccl_device/net_device.h`). The Rust types the plugin is built with must match
/// every row, and have no field the table lacks. CI step 31 rederives the v6..v8 rows from the
/// `nccl_net.h` of Debian's libnccl-dev package.
#[test]
#[cfg_attr(
    miri,
    ignore = "pure layout constants; its quadratic table scan takes many minutes under Miri"
)]
fn the_layout_is_nccls_own() {
    const TABLE: &str = include_str!("../../tests/fixtures/nccl-abi/nccl-v2.30.7-1.tsv");
    let rust = testsupport::rust_layout();
    let mut types = std::collections::BTreeSet::new();
    let mut rows = 0;
    for line in TABLE.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 5, "table row {line:?}");
        let (ty, field, offset, size, at) = (f[0], f[1], f[2], f[3], f[4]);
        let offset: usize = offset.parse().unwrap();
        let size: usize = size.parse().unwrap();
        let field = if field == "*" { "" } else { field };
        let ours = rust
            .iter()
            .find(|r| r.ty == ty && r.field == field)
            .unwrap_or_else(|| panic!("{ty}.{field} (NCCL {at}) is missing from our header"));
        assert_eq!(
            (ours.offset, ours.size),
            (offset, size),
            "{ty}.{field}: ours (offset, size) vs NCCL's ({at})"
        );
        types.insert(ty);
        rows += 1;
    }
    for r in rust.iter().filter(|r| types.contains(r.ty)) {
        assert!(
            TABLE.lines().any(|l| l.starts_with(&format!(
                "{}\t{}\t",
                r.ty,
                if r.field.is_empty() { "*" } else { r.field }
            ))),
            "{}.{}: our header has a field NCCL's does not",
            r.ty,
            r.field
        );
    }
    for v in 6..=12 {
        for kind in ["ncclNetProperties", "ncclNet"] {
            let t = format!("{kind}_v{v}_t");
            assert!(types.contains(t.as_str()), "the table lacks {t}");
        }
    }
    assert!(rows > 290, "{rows} rows");
}
