//! The built plugin, loaded the way NCCL loads it: `dlopen(path, RTLD_NOW | RTLD_LOCAL)` of the cdylib this
//! `cargo test` run built (`target/<profile>/deps/libswitchless.so`: `cargo test` does not refresh
//! `target/<profile>/libswitchless.so`), then `dlsym("ncclNetPlugin_vN")`.
//!
//! The test process also links the rlib (for the C test logger and the device probe); the two copies do not
//! share statics, so every plugin call below goes through the dlopen'ed vtables only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::undocumented_unsafe_blocks,
    clippy::manual_dangling_ptr
)]

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, c_int, c_void};
use std::path::PathBuf;
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

use switchless::ffi::abi::{self, ncclResult_t as R};
use switchless::ffi::testsupport::{self, LogLine};
use switchless::verbs::devices::probe;

const SYMBOLS: [&str; 7] = [
    "ncclNetPlugin_v6",
    "ncclNetPlugin_v7",
    "ncclNetPlugin_v8",
    "ncclNetPlugin_v9",
    "ncclNetPlugin_v10",
    "ncclNetPlugin_v11",
    "ncclNetPlugin_v12",
];

/// The tuner tables NCCL looks up in the net plugin's library (`tests/tuner.rs` drives them).
const TUNER_SYMBOLS: [&str; 6] = [
    "ncclTunerPlugin_v1",
    "ncclTunerPlugin_v2",
    "ncclTunerPlugin_v3",
    "ncclTunerPlugin_v4",
    "ncclTunerPlugin_v5",
    "ncclTunerPlugin_v6",
];

/// dlopen/dlclose counts are per process: tests that load the library run one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

fn so_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libswitchless.so");
    assert!(
        p.exists(),
        "{} not found: cargo test builds the cdylib into deps/",
        p.display()
    );
    p
}

struct Lib(*mut c_void);

impl Lib {
    fn open() -> Lib {
        let path = CString::new(so_path().into_os_string().into_encoded_bytes()).unwrap();
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen failed: {}", dlerror());
        Lib(h)
    }

    fn sym<T>(&self, name: &str) -> &'static T {
        let c = CString::new(name).unwrap();
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!p.is_null(), "dlsym({name}) failed: {}", dlerror());
        unsafe { &*p.cast::<T>() }
    }

    fn close(self) {
        assert_eq!(
            unsafe { libc::dlclose(self.0) },
            0,
            "dlclose: {}",
            dlerror()
        );
    }
}

fn dlerror() -> String {
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        String::new()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Whether the library is still mapped in this process.
fn is_loaded() -> bool {
    let path = CString::new(so_path().into_os_string().into_encoded_bytes()).unwrap();
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        false
    } else {
        unsafe { libc::dlclose(h) };
        true
    }
}

fn warns(lines: &[LogLine]) -> Vec<&LogLine> {
    lines.iter().filter(|l| l.level == 2).collect()
}

#[test]
fn exports_exactly_the_vtables_and_tuner_tables() {
    let path = so_path();
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&path)
        .output()
        .expect("nm (binutils) is required: apt-get install binutils");
    assert!(
        out.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .collect();
    let want: BTreeSet<String> = SYMBOLS
        .iter()
        .chain(&TUNER_SYMBOLS)
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, want, "dynamic symbols of {}", path.display());

    // The C test helpers are linked into the rlib only, never into the plugin.
    let all = std::process::Command::new("nm")
        .arg(&path)
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&all.stdout);
    assert!(
        !all.contains("swl_test_logger")
            && !all.contains("swl_shared_logger")
            && !all.contains("swl_layout_rows")
    );
}

#[test]
fn every_version_resolves_and_is_named_switchless() {
    let _g = serial();
    let lib = Lib::open();
    for s in SYMBOLS {
        // Every vtable starts with `const char* name`.
        let name = *lib.sym::<*const std::ffi::c_char>(s);
        assert_eq!(unsafe { CStr::from_ptr(name) }, c"switchless", "{s}");
    }
    let v12 = lib.sym::<abi::ncclNet_v12_t>("ncclNetPlugin_v12");
    assert!(v12.init.is_some() && v12.finalize.is_some() && v12.setNetAttr.is_some());
    assert!(v12.makeVDevice.is_none() && v12.irecvConsumed.is_none());
    let v6 = lib.sym::<abi::ncclNet_v6_t>("ncclNetPlugin_v6");
    assert!(v6.init.is_some() && v6.closeListen.is_some());
    lib.close();
}

/// Calls init of one version; returns (result, ctx for v11+).
fn init(lib: &Lib, version: u32) -> (R, *mut c_void) {
    let log = Some(testsupport::c_logger());
    let sym = format!("ncclNetPlugin_v{version}");
    unsafe {
        match version {
            6 => (
                lib.sym::<abi::ncclNet_v6_t>(&sym).init.unwrap()(log),
                null_mut(),
            ),
            7 => (
                lib.sym::<abi::ncclNet_v7_t>(&sym).init.unwrap()(log),
                null_mut(),
            ),
            8 => (
                lib.sym::<abi::ncclNet_v8_t>(&sym).init.unwrap()(log),
                null_mut(),
            ),
            9 => (
                lib.sym::<abi::ncclNet_v9_t>(&sym).init.unwrap()(log),
                null_mut(),
            ),
            10 => (
                lib.sym::<abi::ncclNet_v10_t>(&sym).init.unwrap()(log, None),
                null_mut(),
            ),
            11 | 12 => {
                let mut ctx: *mut c_void = 0x1 as *mut c_void;
                let mut cfg = abi::ncclNetCommConfig_v12_t { trafficClass: -1 };
                let r = if version == 11 {
                    let mut c11 = abi::ncclNetCommConfig_v11_t { trafficClass: -1 };
                    lib.sym::<abi::ncclNet_v11_t>(&sym).init.unwrap()(
                        &mut ctx, 7, &mut c11, log, None,
                    )
                } else {
                    lib.sym::<abi::ncclNet_v12_t>(&sym).init.unwrap()(
                        &mut ctx, 7, &mut cfg, log, None,
                    )
                };
                (r, ctx)
            }
            _ => unreachable!(),
        }
    }
}

fn devices(lib: &Lib, version: u32) -> (R, c_int) {
    let sym = format!("ncclNetPlugin_v{version}");
    let mut n: c_int = -1;
    let f = match version {
        6 => lib.sym::<abi::ncclNet_v6_t>(&sym).devices,
        7 => lib.sym::<abi::ncclNet_v7_t>(&sym).devices,
        8 => lib.sym::<abi::ncclNet_v8_t>(&sym).devices,
        9 => lib.sym::<abi::ncclNet_v9_t>(&sym).devices,
        10 => lib.sym::<abi::ncclNet_v10_t>(&sym).devices,
        11 => lib.sym::<abi::ncclNet_v11_t>(&sym).devices,
        _ => lib.sym::<abi::ncclNet_v12_t>(&sym).devices,
    };
    (unsafe { f.unwrap()(&mut n) }, n)
}

#[test]
fn init_reports_the_host_rdma_state_in_every_version() {
    let _g = serial();
    let host = probe();
    let lib = Lib::open();
    for version in [6, 7, 8, 9, 10, 11, 12] {
        testsupport::take_log();
        let (r, ctx) = init(&lib, version);
        let lines = testsupport::take_log();
        let (rd, n) = devices(&lib, version);
        assert_eq!(rd, R::ncclSuccess);
        if host.devices.is_empty() {
            // No RDMA here: init fails so NCCL falls back, with exactly one WARN line saying why.
            assert_eq!(r, R::ncclSystemError, "v{version} init; log {lines:?}");
            let w = warns(&lines);
            assert_eq!(
                w.len(),
                1,
                "v{version}: exactly one WARN line expected, got {lines:?}"
            );
            assert_eq!(lines.len(), 1, "v{version}: nothing else logged: {lines:?}");
            assert_eq!(w[0].flags, !0u64, "WARN uses NCCL_ALL");
            assert!(
                w[0].text.contains("no RDMA device") && w[0].text.contains(&host.why_none()),
                "v{version}: {:?} should say why ({})",
                w[0].text,
                host.why_none()
            );
            if version >= 11 {
                assert!(ctx.is_null(), "a failed init leaves *ctx NULL");
            }
            assert_eq!(n, 0, "v{version}: devices() after a failed init");
        } else {
            assert_eq!(
                r,
                R::ncclSuccess,
                "v{version} init with RDMA devices; log {lines:?}"
            );
            assert!(warns(&lines).is_empty(), "{lines:?}");
            assert_eq!(n as usize, host.devices.len());
            if version >= 11 {
                let sym = format!("ncclNetPlugin_v{version}");
                let fin = if version == 11 {
                    lib.sym::<abi::ncclNet_v11_t>(&sym).finalize
                } else {
                    lib.sym::<abi::ncclNet_v12_t>(&sym).finalize
                };
                assert_eq!(unsafe { fin.unwrap()(ctx) }, R::ncclSuccess);
            }
        }
    }
    if !host.devices.is_empty() {
        rdma_branch("init_reports_the_host_rdma_state_in_every_version");
    }
    lib.close();
}

/// Printed when a test took its branch for a host with RDMA devices: the soft-RoCE lab's CI step runs
/// this binary in its VMs and counts these lines, so a branch that stopped running there fails CI.
fn rdma_branch(test: &str) {
    println!("RDMA-BRANCH abi::{test}");
}

#[test]
fn properties_of_a_missing_device_are_an_invalid_argument() {
    let _g = serial();
    let lib = Lib::open();
    let v12 = lib.sym::<abi::ncclNet_v12_t>("ncclNetPlugin_v12");
    let mut p = abi::ncclNetProperties_v12_t::default();
    // init points the plugin's log at our logger (before any init, events go to stderr).
    let (init_r, ctx) = init(&lib, 12);
    testsupport::take_log();
    let r = unsafe { v12.getProperties.unwrap()(1000, &mut p) };
    assert_eq!(r, R::ncclInvalidArgument);
    let lines = testsupport::take_log();
    assert_eq!(warns(&lines).len(), 1, "{lines:?}");
    assert!(
        lines[0].text.contains("device 1000 does not exist"),
        "{lines:?}"
    );
    assert_eq!(
        unsafe { v12.devices.unwrap()(null_mut()) },
        R::ncclInvalidArgument
    );
    let host_has_rdma = !probe().devices.is_empty();
    assert_eq!(init_r == R::ncclSuccess, host_has_rdma, "init {init_r:?}");
    if host_has_rdma {
        assert_eq!(unsafe { v12.finalize.unwrap()(ctx) }, R::ncclSuccess);
        rdma_branch("properties_of_a_missing_device_are_an_invalid_argument");
    }
    lib.close();
}

#[test]
fn load_init_finalize_unload_twice() {
    let _g = serial();
    let host_has_rdma = !probe().devices.is_empty();
    for round in 0..2 {
        assert!(
            !is_loaded(),
            "round {round}: the library must not be mapped before dlopen"
        );
        let lib = Lib::open();
        let v12 = lib.sym::<abi::ncclNet_v12_t>("ncclNetPlugin_v12");
        testsupport::take_log();
        let (r, ctx) = init(&lib, 12);
        let lines = testsupport::take_log();
        if host_has_rdma {
            assert_eq!(r, R::ncclSuccess, "{lines:?}");
            assert!(warns(&lines).is_empty(), "round {round}: {lines:?}");
            assert_eq!(unsafe { v12.finalize.unwrap()(ctx) }, R::ncclSuccess);
        } else {
            // Each fresh load logs its one WARN line through the logger given to this load's init.
            assert_eq!(r, R::ncclSystemError);
            assert_eq!(warns(&lines).len(), 1, "round {round}: {lines:?}");
        }
        lib.close();
        assert!(
            !is_loaded(),
            "round {round}: after dlclose the library is still mapped: something (a thread, a TLS \
             destructor) keeps it alive"
        );
    }
    if host_has_rdma {
        rdma_branch("load_init_finalize_unload_twice");
    }
}
