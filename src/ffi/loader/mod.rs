//! The host side of the ncclNet ABI: loads any ncclNet plugin `.so` by path (`dlopen(RTLD_NOW |
//! RTLD_LOCAL)`, as NCCL does), finds `ncclNetPlugin_v12` and implements [`net::Net`] over its
//! function pointers, so `switchless bench` drives a plugin the way NCCL's proxy does.
//!
//! The plugin's handles stay opaque (`*mut c_void` inside newtypes); buffers are
//! [`net::SharedBuf`]s whose allocation never moves, so the addresses the plugin keeps between
//! `isend`/`irecv` and the completing `test` stay valid.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::ptr;

use crate::ffi::abi;
pub mod debug_file;
pub mod net;

use crate::error::{Error, Result};
pub use net::{
    CommRef, HANDLE_SIZE, Handle, Net, PTR_HOST, Properties, RecvBuf, Region, SharedBuf,
};

/// The file name NCCL loads for `NCCL_NET_PLUGIN=switchless`.
pub const PLUGIN_FILE: &str = "libnccl-net-switchless.so";

/// `NCCL_PROXY_MAX_SUBS`: entries of the sizes array `test` may fill for a grouped receive.
const MAX_SUBS: usize = 64;

/// Where `switchless bench` looks for our plugin when no path is given: next to the running binary,
/// in `../lib` (`make install`), in `../lib/<multiarch>` (the Debian package: `/usr/bin/switchless`
/// and `/usr/lib/aarch64-linux-gnu/`), or cargo's output name next to the binary.
pub fn default_plugin_candidates() -> Vec<PathBuf> {
    let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    else {
        return vec![PathBuf::from(PLUGIN_FILE)];
    };
    plugin_candidates_in(&dir)
}

/// The candidates for a binary in `dir`. Debian's multiarch directory is `<arch>-linux-gnu` for both
/// architectures the plugin is packaged for (x86_64, aarch64).
fn plugin_candidates_in(dir: &Path) -> Vec<PathBuf> {
    let lib = dir.join("../lib");
    vec![
        dir.join(PLUGIN_FILE),
        lib.join(PLUGIN_FILE),
        lib.join(format!("{}-linux-gnu", std::env::consts::ARCH))
            .join(PLUGIN_FILE),
        dir.join("libswitchless.so"),
    ]
}

/// The first existing default candidate.
pub fn default_plugin() -> Result<PathBuf> {
    let c = default_plugin_candidates();
    c.iter().find(|p| p.exists()).cloned().ok_or_else(|| {
        let list: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
        Error::InvalidUsage(format!(
            "no plugin found (looked for {}); pass --plugin PATH",
            list.join(", ")
        ))
    })
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, valid until the next
    // dl* call on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn result_name(r: abi::ncclResult_t) -> &'static str {
    match r.0 {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => "an unknown ncclResult_t",
    }
}

/// A loaded plugin and its v12 vtable, plus the per-communicator context of `init`.
pub struct HostNet {
    lib: *mut c_void,
    vt: *const abi::ncclNet_v12_t,
    path: PathBuf,
    ctx: *mut c_void,
    inited: bool,
    log: bool,
    sink: debug_file::DebugSink,
}

/// A `listenComm`.
pub struct HostListen(*mut c_void);
/// A `sendComm`.
pub struct HostSend(*mut c_void);
/// A `recvComm`.
pub struct HostRecv(*mut c_void);
/// An `mhandle` from `regMr`.
pub struct HostMr(*mut c_void);
/// A request from `isend`/`irecv` and the number of buffers it carries.
pub struct HostRequest {
    req: *mut c_void,
    n: usize,
}

impl HostNet {
    /// `dlopen`s `path` and resolves `ncclNetPlugin_v12`.
    pub fn load(path: &Path) -> Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            Error::InvalidUsage(format!(
                "plugin path {} contains a NUL byte",
                path.display()
            ))
        })?;
        // SAFETY: `c` is a valid NUL-terminated path; dlopen runs the library's constructors, which
        // is what loading a plugin means.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(Error::System(format!(
                "dlopen {}: {}",
                path.display(),
                dlerror_text()
            )));
        }
        // SAFETY: `lib` is a live handle and the symbol name is NUL-terminated.
        let sym = unsafe { libc::dlsym(lib, c"ncclNetPlugin_v12".as_ptr()) };
        if sym.is_null() {
            // SAFETY: `lib` came from dlopen above and nothing from it is in use.
            unsafe { libc::dlclose(lib) };
            return Err(Error::InvalidUsage(format!(
                "{} has no ncclNetPlugin_v12 symbol (switchless bench drives ABI v12 plugins; NCCL 2.30+)",
                path.display()
            )));
        }
        let log = std::env::var("NCCL_DEBUG")
            .map(|v| matches!(v.to_ascii_uppercase().as_str(), "INFO" | "TRACE"))
            .unwrap_or(false);
        let net = HostNet {
            lib,
            vt: sym.cast(),
            path: path.to_path_buf(),
            ctx: ptr::null_mut(),
            inited: false,
            log,
            sink: debug_file::DebugSink::from_env(),
        };
        // NCCL's line for a plugin it loaded (src/plugin/net/net_v12.cc); to the debug file only,
        // where the per-process logs of a job are read.
        net.host_log(
            3,
            &format!("NET/Plugin: Loaded net plugin {} (v12)", net.network_name()),
        );
        Ok(net)
    }

    /// Loads `--plugin PATH` or the default.
    pub fn load_default(path: Option<&Path>) -> Result<Self> {
        match path {
            Some(p) => Self::load(p),
            None => Self::load(&default_plugin()?),
        }
    }

    /// The loaded file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn vt(&self) -> &abi::ncclNet_v12_t {
        // SAFETY: `vt` points at the plugin's static vtable, which lives as long as the library
        // stays loaded, i.e. as long as `self`.
        unsafe { &*self.vt }
    }

    /// The network name in the plugin's vtable (what NCCL prints as `Using network NAME`).
    pub fn network_name(&self) -> String {
        let n = self.vt().name;
        if n.is_null() {
            "(unnamed)".to_string()
        } else {
            // SAFETY: `name` is the plugin's static NUL-terminated name string.
            unsafe { CStr::from_ptr(n) }.to_string_lossy().into_owned()
        }
    }

    /// Writes a line of the host's own to `NCCL_DEBUG_FILE` at `ncclDebugLogLevel` `level` (2 WARN,
    /// 3 INFO): WARN always, the rest with NCCL_DEBUG=INFO (or TRACE). Nothing without the file.
    pub fn host_log(&self, level: i32, text: &str) {
        if self.log || level <= 2 || level == 4 {
            self.sink.line(level_name(level), text);
        }
    }

    /// After a successful `init`: NCCL's line naming the network its communicators use
    /// (`Using network NAME`, src/init.cc), to the debug file only (see `load`).
    pub fn announce_network(&self) {
        self.host_log(3, &format!("Using network {}", self.network_name()));
    }

    /// The plugin's log lines, from every thread (WARN always, the rest with NCCL_DEBUG=INFO): to
    /// `NCCL_DEBUG_FILE` in NCCL's format when it is set, else to stderr.
    fn drain_log(&self) {
        if self.sink.to_file() {
            let (lines, dropped) = plugin_log_records(self.log);
            for (level, text) in lines {
                self.sink.line(level, &text);
            }
            if dropped > 0 {
                self.sink.line("WARN", &dropped_line(dropped));
            }
        } else {
            for l in plugin_log_lines(self.log) {
                eprintln!("{l}");
            }
        }
    }

    fn check(&self, call: &str, r: abi::ncclResult_t) -> Result<()> {
        self.drain_log();
        if r.0 == 0 {
            return Ok(());
        }
        let msg = format!("{call} returned {} ({})", result_name(r), r.0);
        Err(match r.0 {
            4 => Error::InvalidArgument(msg),
            5 => Error::InvalidUsage(msg),
            6 => Error::Remote(msg),
            8 => Error::Timeout(msg),
            3 => Error::Internal(msg),
            _ => Error::System(msg),
        })
    }

    fn missing(&self, f: &str) -> Error {
        Error::InvalidUsage(format!(
            "plugin {} leaves {f} NULL in ncclNetPlugin_v12",
            self.path.display()
        ))
    }

    fn comm_ptr(comm: &CommRef<'_, Self>) -> *mut c_void {
        match comm {
            CommRef::Send(s) => s.0,
            CommRef::Recv(r) => r.0,
        }
    }
}

/// The logger a [`HostNet`] hands to the plugin's `init`: one process-wide buffer, so the lines
/// the plugin logs on its own threads (the TCP I/O workers: stream failures, a peer's protocol
/// violations) are printed too, not only those of the thread that calls the plugin.
pub fn logger() -> crate::ffi::log::LoggerFn {
    crate::ffi::testsupport::shared_logger()
}

/// The plugin's log lines captured since the last call, from every thread, as the bench prints
/// them: WARN (and ABORT) always, the rest when `all`; then one line naming how many were lost
/// when the capture buffer filled.
pub fn plugin_log_lines(all: bool) -> Vec<String> {
    let (lines, dropped) = plugin_log_records(all);
    let mut out: Vec<String> = lines
        .into_iter()
        .map(|(level, text)| format!("NCCL {level} (plugin): {text}"))
        .collect();
    if dropped > 0 {
        out.push(format!("NCCL WARN (bench): {}", dropped_line(dropped)));
    }
    out
}

/// The captured lines as (level name, text), filtered as [`plugin_log_lines`] does, and how many
/// were lost.
fn plugin_log_records(all: bool) -> (Vec<(&'static str, String)>, u64) {
    let (lines, dropped) = crate::ffi::testsupport::take_shared_log();
    let out = lines
        .into_iter()
        .filter(|l| all || l.level <= 2 || l.level == 4)
        .map(|l| (level_name(l.level), l.text.trim_end().to_string()))
        .collect();
    (out, dropped)
}

fn dropped_line(dropped: u64) -> String {
    format!("{dropped} plugin log lines were lost: the capture buffer (1 MiB) was full")
}

/// `ncclDebugLogLevel` as NCCL prints it.
fn level_name(level: i32) -> &'static str {
    match level {
        2 => "WARN",
        3 => "INFO",
        4 => "ABORT",
        5 => "TRACE",
        _ => "LOG",
    }
}

impl Drop for HostNet {
    fn drop(&mut self) {
        if self.inited {
            let _ = net::Net::finalize(self);
        }
        // Like NCCL, unload only once the context is finalized: the plugin's threads are gone then.
        if !self.inited {
            // SAFETY: `lib` came from dlopen; no pointer into the library is used after this.
            unsafe { libc::dlclose(self.lib) };
        }
    }
}

fn region_ptr(r: &Region) -> Result<*mut c_void> {
    let (base, _) = r.buf.raw_parts()?;
    Ok(base.wrapping_add(r.offset).cast())
}

impl net::Net for HostNet {
    type ListenComm = HostListen;
    type SendComm = HostSend;
    type RecvComm = HostRecv;
    type Mr = HostMr;
    type Request = HostRequest;

    fn name(&self) -> String {
        format!("{} ({})", self.network_name(), self.path.display())
    }

    fn init(&mut self, comm_id: u64) -> Result<()> {
        let f = self.vt().init.ok_or_else(|| self.missing("init"))?;
        let mut config = abi::ncclNetCommConfig_v12_t { trafficClass: -1 };
        let mut ctx: *mut c_void = ptr::null_mut();
        // SAFETY: the arguments follow ncclNet_v12_t.init: an out pointer, a config that outlives
        // the call, a real C-variadic logger and no profiler.
        let r = unsafe { f(&mut ctx, comm_id, &mut config, Some(logger()), None) };
        self.check("init", r)?;
        self.ctx = ctx;
        self.inited = true;
        Ok(())
    }

    fn devices(&self) -> Result<usize> {
        let f = self.vt().devices.ok_or_else(|| self.missing("devices"))?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out pointer.
        self.check("devices", unsafe { f(&mut n) })?;
        usize::try_from(n).map_err(|_| Error::Remote(format!("devices reported {n} devices")))
    }

    fn get_properties(&self, dev: usize) -> Result<Properties> {
        let f = self
            .vt()
            .getProperties
            .ok_or_else(|| self.missing("getProperties"))?;
        let mut p = abi::ncclNetProperties_v12_t::default();
        // SAFETY: `p` is a zeroed properties struct of the v12 layout the function fills.
        self.check("getProperties", unsafe { f(dev as c_int, &mut p) })?;
        let s = |c: *mut c_char| {
            if c.is_null() {
                String::new()
            } else {
                // SAFETY: the plugin returns NUL-terminated strings it owns for its lifetime.
                unsafe { CStr::from_ptr(c) }.to_string_lossy().into_owned()
            }
        };
        Ok(Properties {
            name: s(p.name),
            pci_path: s(p.pciPath),
            guid: p.guid,
            ptr_support: p.ptrSupport,
            speed_mbps: p.speed,
            port: p.port,
            latency_us: p.latency,
            max_comms: p.maxComms,
            max_recvs: p.maxRecvs,
            max_p2p_bytes: p.maxP2pBytes,
        })
    }

    fn listen(&self, dev: usize) -> Result<(Handle, HostListen)> {
        let f = self.vt().listen.ok_or_else(|| self.missing("listen"))?;
        let mut h = [0u8; HANDLE_SIZE];
        let mut l: *mut c_void = ptr::null_mut();
        // SAFETY: `h` has NCCL_NET_HANDLE_MAXSIZE writable bytes; `l` is an out pointer.
        self.check("listen", unsafe {
            f(self.ctx, dev as c_int, h.as_mut_ptr().cast(), &mut l)
        })?;
        if l.is_null() {
            return Err(Error::Internal(
                "listen succeeded with a NULL listenComm".into(),
            ));
        }
        Ok((h, HostListen(l)))
    }

    fn connect(&self, dev: usize, handle: &mut Handle) -> Result<Option<HostSend>> {
        let f = self.vt().connect.ok_or_else(|| self.missing("connect"))?;
        let mut s: *mut c_void = ptr::null_mut();
        let mut devh: *mut abi::ncclNetDeviceHandle_v12_t = ptr::null_mut();
        // SAFETY: `handle` is the caller's private 128-byte copy, the same on every retry, as NCCL
        // passes it; `devh` is a pointer to NULL (host device).
        self.check("connect", unsafe {
            f(
                self.ctx,
                dev as c_int,
                handle.as_mut_ptr().cast(),
                &mut s,
                &mut devh,
            )
        })?;
        Ok((!s.is_null()).then_some(HostSend(s)))
    }

    fn set_net_attr(&self, attr: &net::NetAttr) -> Result<bool> {
        // NULL in a v12 vtable is allowed (NCCL checks it before every call): nothing to call.
        let Some(f) = self.vt().setNetAttr else {
            return Ok(false);
        };
        let mut raw = crate::ffi::props::attr_out_v12(attr);
        // SAFETY: `self.ctx` is the context `init` returned (or NULL before it, which the plugin
        // rejects); `raw` is a v12 attribute struct that outlives the call, which only reads it.
        self.check("setNetAttr", unsafe { f(self.ctx, &mut raw) })?;
        Ok(true)
    }

    fn accept(&self, listen: &mut HostListen) -> Result<Option<HostRecv>> {
        let f = self.vt().accept.ok_or_else(|| self.missing("accept"))?;
        let mut r: *mut c_void = ptr::null_mut();
        let mut devh: *mut abi::ncclNetDeviceHandle_v12_t = ptr::null_mut();
        // SAFETY: `listen.0` came from listen and is not closed yet; out pointers are valid.
        self.check("accept", unsafe { f(listen.0, &mut r, &mut devh) })?;
        Ok((!r.is_null()).then_some(HostRecv(r)))
    }

    fn reg_mr(&self, comm: CommRef<'_, Self>, buf: &SharedBuf) -> Result<HostMr> {
        let f = self.vt().regMr.ok_or_else(|| self.missing("regMr"))?;
        let (p, len) = buf.raw_parts()?;
        let mut mh: *mut c_void = ptr::null_mut();
        // SAFETY: `p..p+len` is the buffer's allocation, which never moves and outlives the
        // registration (the bench deregisters before dropping the buffer).
        self.check("regMr", unsafe {
            f(Self::comm_ptr(&comm), p.cast(), len, net::PTR_HOST, &mut mh)
        })?;
        Ok(HostMr(mh))
    }

    fn dereg_mr(&self, comm: CommRef<'_, Self>, mr: HostMr) -> Result<()> {
        let f = self.vt().deregMr.ok_or_else(|| self.missing("deregMr"))?;
        // SAFETY: `mr.0` came from regMr on this comm.
        self.check("deregMr", unsafe { f(Self::comm_ptr(&comm), mr.0) })
    }

    fn isend(
        &self,
        comm: &mut HostSend,
        data: &Region,
        tag: i32,
        mr: &HostMr,
    ) -> Result<Option<HostRequest>> {
        let f = self.vt().isend.ok_or_else(|| self.missing("isend"))?;
        let data_ptr = region_ptr(data)?;
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: the region lies inside a registered buffer (Region::new checked the bounds) that
        // stays alive and untouched until test reports completion.
        self.check("isend", unsafe {
            f(
                comm.0,
                data_ptr,
                data.len,
                tag,
                mr.0,
                ptr::null_mut(),
                &mut req,
            )
        })?;
        Ok((!req.is_null()).then_some(HostRequest { req, n: 1 }))
    }

    fn irecv(
        &self,
        comm: &mut HostRecv,
        bufs: &[RecvBuf<'_, Self>],
    ) -> Result<Option<HostRequest>> {
        let f = self.vt().irecv.ok_or_else(|| self.missing("irecv"))?;
        if bufs.is_empty() || bufs.len() > MAX_SUBS {
            return Err(Error::Internal(format!(
                "irecv of {} buffers (accepted: 1..{MAX_SUBS})",
                bufs.len()
            )));
        }
        let mut data: Vec<*mut c_void> = bufs
            .iter()
            .map(|b| region_ptr(&b.region))
            .collect::<Result<_>>()?;
        let mut sizes: Vec<usize> = bufs.iter().map(|b| b.region.len).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.tag).collect();
        let mut mhs: Vec<*mut c_void> = bufs.iter().map(|b| b.mr.0).collect();
        let mut phs: Vec<*mut c_void> = vec![ptr::null_mut(); bufs.len()];
        let mut req: *mut c_void = ptr::null_mut();
        // SAFETY: the five arrays hold n entries each and outlive the call (NCCL's arrays are
        // per-call too); each region lies in a registered buffer that stays alive until completion.
        self.check("irecv", unsafe {
            f(
                comm.0,
                bufs.len() as c_int,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                phs.as_mut_ptr(),
                &mut req,
            )
        })?;
        Ok((!req.is_null()).then_some(HostRequest { req, n: bufs.len() }))
    }

    fn test(&self, req: &mut HostRequest) -> Result<Option<Vec<usize>>> {
        let f = self.vt().test.ok_or_else(|| self.missing("test"))?;
        let mut done: c_int = 0;
        let mut sizes = [0 as c_int; MAX_SUBS];
        // SAFETY: `req.req` is a live request (never tested after done); `sizes` has
        // NCCL_PROXY_MAX_SUBS entries as NCCL provides.
        self.check("test", unsafe { f(req.req, &mut done, sizes.as_mut_ptr()) })?;
        if done == 0 {
            return Ok(None);
        }
        req.req = ptr::null_mut();
        Ok(Some(
            sizes[..req.n]
                .iter()
                .map(|&s| usize::try_from(s).unwrap_or(0))
                .collect(),
        ))
    }

    fn close_send(&self, comm: HostSend) -> Result<()> {
        let f = self
            .vt()
            .closeSend
            .ok_or_else(|| self.missing("closeSend"))?;
        // SAFETY: `comm.0` came from connect and is closed once (the value is consumed).
        self.check("closeSend", unsafe { f(comm.0) })
    }

    fn close_recv(&self, comm: HostRecv) -> Result<()> {
        let f = self
            .vt()
            .closeRecv
            .ok_or_else(|| self.missing("closeRecv"))?;
        // SAFETY: `comm.0` came from accept and is closed once.
        self.check("closeRecv", unsafe { f(comm.0) })
    }

    fn close_listen(&self, listen: HostListen) -> Result<()> {
        let f = self
            .vt()
            .closeListen
            .ok_or_else(|| self.missing("closeListen"))?;
        // SAFETY: `listen.0` came from listen and is closed once.
        self.check("closeListen", unsafe { f(listen.0) })
    }

    fn finalize(&mut self) -> Result<()> {
        if !self.inited {
            return Ok(());
        }
        let f = self.vt().finalize.ok_or_else(|| self.missing("finalize"))?;
        // SAFETY: `ctx` came from init and is finalized once.
        let r = unsafe { f(self.ctx) };
        self.inited = false;
        self.ctx = ptr::null_mut();
        self.check("finalize", r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Security audit 2, finding 6: the bench handed the plugin a logger that kept lines per thread
    /// and printed only its own thread's, so every line the plugin's TCP I/O threads logged (a
    /// peer's protocol violation ending a path, a stream failure) was lost. The logger it hands over
    /// now keeps one buffer for the process: a WARN from another thread reaches the bench's output.
    #[test]
    #[cfg_attr(miri, ignore = "calls the C logger")]
    fn a_warn_logged_on_another_thread_reaches_the_bench_output() {
        let f = logger();
        std::thread::spawn(move || {
            // SAFETY: the logger is C-variadic with the ncclDebugLogger_t signature; "%s" takes
            // the one NUL-terminated string passed, and every pointer lives for the call.
            unsafe {
                f(
                    abi::ncclDebugLogLevel::NCCL_LOG_WARN,
                    !0,
                    c"stream.rs".as_ptr(),
                    7,
                    c"%s".as_ptr(),
                    c"NET/switchless: TCP path 0: peer wrote outside the registration".as_ptr(),
                )
            }
        })
        .join()
        .unwrap();
        let lines = plugin_log_lines(false);
        assert!(
            lines.iter().any(|l| l
                == "NCCL WARN (plugin): NET/switchless: TCP path 0: peer wrote outside the registration"),
            "{lines:?}"
        );
    }

    /// The Debian package's layout: `/usr/bin/switchless` finds
    /// `/usr/lib/<multiarch>/libnccl-net-switchless.so` with no `--plugin`.
    #[test]
    fn a_packaged_cli_finds_the_plugin_in_the_multiarch_directory() {
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("usr/bin");
        let lib = root
            .path()
            .join("usr/lib")
            .join(format!("{}-linux-gnu", std::env::consts::ARCH));
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(PLUGIN_FILE), b"").unwrap();
        let found: Vec<PathBuf> = plugin_candidates_in(&bin)
            .into_iter()
            .filter(|p| p.exists())
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0].canonicalize().unwrap(),
            lib.join(PLUGIN_FILE).canonicalize().unwrap()
        );
    }
}
