//! libibverbs, loaded at run time: `dlopen("libibverbs.so.1")` once per process and one table of the
//! exported functions the verbs layer calls, resolved with `dlvsym` at the versions NCCL's own
//! `ibvwrap` pins (`IBVERBS_1.1` for the classic verbs). The plugin and the `switchless` binary
//! therefore carry no `DT_NEEDED` on libibverbs: they load on a host without rdma-core and serve TCP
//! paths there; the first verbs call then fails with an error naming the package to install.
//!
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are inline in `<infiniband/verbs.h>` (calls
//! through the context's ops) and need nothing here. Two symbols newer than the baseline are
//! optional ([`OptionalSymbols`]): without them DMA-BUF registration is off and GID types come from
//! sysfs.

use rdma_sys::{
    __be64, _compat_ibv_port_attr, ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq,
    ibv_device, ibv_device_attr, ibv_gid, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// `struct ibv_gid_entry` (rdma-core ≥ 32, `<infiniband/verbs.h>`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GidEntryRaw {
    pub gid: [u8; 16],
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `ibv_reg_dmabuf_mr` (IBVERBS_1.12, rdma-core ≥ 34).
pub(crate) type RegDmabufMrFn = unsafe extern "C" fn(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr;

/// `_ibv_query_gid_ex` (IBVERBS_1.11, rdma-core ≥ 32).
pub(crate) type QueryGidExFn = unsafe extern "C" fn(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut GidEntryRaw,
    flags: u32,
    entry_size: usize,
) -> c_int;

/// `_ibv_query_gid_table` (IBVERBS_1.11, rdma-core ≥ 32): every populated GID of every port of
/// a device in one call; the entry count, or a negative errno.
pub(crate) type QueryGidTableFn = unsafe extern "C" fn(
    context: *mut ibv_context,
    entries: *mut GidEntryRaw,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize;

/// The optional symbols found in the loaded libibverbs.
#[derive(Debug, Clone, Copy)]
pub struct OptionalSymbols {
    pub(crate) reg_dmabuf_mr: Option<RegDmabufMrFn>,
    pub(crate) query_gid_ex: Option<QueryGidExFn>,
    pub(crate) query_gid_table: Option<QueryGidTableFn>,
}

impl OptionalSymbols {
    /// `ibv_reg_dmabuf_mr` is available (DMA-BUF registration possible).
    pub fn has_dmabuf(&self) -> bool {
        self.reg_dmabuf_mr.is_some()
    }

    /// `_ibv_query_gid_ex` is available (GID types from the library, not sysfs).
    pub fn has_query_gid_ex(&self) -> bool {
        self.query_gid_ex.is_some()
    }

    /// `_ibv_query_gid_table` is available (discovery reads each GID table in one call).
    pub fn has_query_gid_table(&self) -> bool {
        self.query_gid_table.is_some()
    }

    /// One line for the init log.
    pub fn describe(&self) -> String {
        let yn = |b: bool| if b { "found" } else { "absent" };
        format!(
            "ibv_reg_dmabuf_mr@IBVERBS_1.12 {}{}, _ibv_query_gid_ex@IBVERBS_1.11 {}{}, \
             _ibv_query_gid_table@IBVERBS_1.11 {}{}",
            yn(self.has_dmabuf()),
            if self.has_dmabuf() {
                ""
            } else {
                " (no DMA-BUF registration)"
            },
            yn(self.has_query_gid_ex()),
            if self.has_query_gid_ex() {
                ""
            } else {
                " (GID types read from sysfs)"
            },
            yn(self.has_query_gid_table()),
            if self.has_query_gid_table() {
                ""
            } else {
                " (GID tables read from sysfs, one file per slot)"
            },
        )
    }
}

/// The soname NCCL loads too.
const LIBIBVERBS: &CStr = c"libibverbs.so.1";
/// The version of every classic verb (what `ibvwrap` in NCCL asks for).
const BASE: &CStr = c"IBVERBS_1.1";

/// What to install when the library is missing (Debian/Ubuntu name first).
pub const PACKAGE_HINT: &str =
    "install the libibverbs1 package (rdma-core on RHEL, SUSE and Fedora)";

/// Looks `name@version` up in `handle`; `None` if absent.
///
/// # Safety
/// `handle` is a live `dlopen` handle or `RTLD_DEFAULT`.
unsafe fn lookup(handle: *mut c_void, name: &CStr, version: &CStr) -> Option<*mut c_void> {
    // SAFETY: both strings are NUL-terminated; `handle` is valid per this function's contract.
    let p = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Declares [`Verbs`] (one function pointer per classic verb) and its loader from one list:
/// field, symbol, C signature (rdma-sys's bindgen types of the same `<infiniband/verbs.h>`).
/// The symbols newer than the baseline, `None` where this rdma-core lacks them.
///
/// # Safety
/// `handle` is a live `dlopen` handle of libibverbs, kept open for the life of the process.
unsafe fn load_optional(handle: *mut c_void) -> OptionalSymbols {
    // SAFETY: live handle (contract); NUL-terminated literals.
    let dmabuf = unsafe { lookup(handle, c"ibv_reg_dmabuf_mr", c"IBVERBS_1.12") };
    // SAFETY: as above.
    let gid_ex = unsafe { lookup(handle, c"_ibv_query_gid_ex", c"IBVERBS_1.11") };
    // SAFETY: as above.
    let gid_table = unsafe { lookup(handle, c"_ibv_query_gid_table", c"IBVERBS_1.11") };
    OptionalSymbols {
        // SAFETY: `struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *, uint64_t, size_t, uint64_t,
        // int, int)` in rdma-core's verbs.h, the signature of RegDmabufMrFn.
        reg_dmabuf_mr: dmabuf
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, RegDmabufMrFn>(p) }),
        // SAFETY: `int _ibv_query_gid_ex(struct ibv_context *, uint32_t, uint32_t,
        // struct ibv_gid_entry *, uint32_t, size_t)` in verbs.h, the signature of QueryGidExFn.
        query_gid_ex: gid_ex
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, QueryGidExFn>(p) }),
        // SAFETY: `ssize_t _ibv_query_gid_table(struct ibv_context *, struct ibv_gid_entry *,
        // size_t, uint32_t, size_t)` in verbs.h, the signature of QueryGidTableFn.
        query_gid_table: gid_table
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, QueryGidTableFn>(p) }),
    }
}

macro_rules! verbs_table {
    ($( $field:ident = $sym:literal : fn($($arg:ty),*) $(-> $ret:ty)? ; )*) => {
        /// The exported libibverbs functions the verbs layer calls, resolved once.
        pub(crate) struct Verbs {
            $( pub(crate) $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
            pub(crate) optional: OptionalSymbols,
        }

        /// Resolves every classic verb in `handle`; the first one missing is the error.
        ///
        /// # Safety
        /// `handle` is a live `dlopen` handle of libibverbs, kept open for the life of the process.
        unsafe fn load(handle: *mut c_void) -> std::result::Result<Verbs, String> {
            Ok(Verbs {
                $( $field: {
                    // SAFETY: live handle (contract); NUL-terminated literals.
                    let p = unsafe { lookup(handle, $sym, BASE) }.ok_or_else(|| {
                        format!("{} has no {}@IBVERBS_1.1", LIBIBVERBS.to_string_lossy(), $sym.to_string_lossy())
                    })?;
                    // SAFETY: the symbol of this name at IBVERBS_1.1 has exactly this C signature in
                    // rdma-core's verbs.h (the argument types are bindgen's output of that header).
                    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(p) }
                }, )*
                // SAFETY: live handle (contract).
                optional: unsafe { load_optional(handle) },
            })
        }
    };
}

verbs_table! {
    get_device_list = c"ibv_get_device_list": fn(*mut c_int) -> *mut *mut ibv_device;
    free_device_list = c"ibv_free_device_list": fn(*mut *mut ibv_device);
    get_device_name = c"ibv_get_device_name": fn(*mut ibv_device) -> *const c_char;
    get_device_guid = c"ibv_get_device_guid": fn(*mut ibv_device) -> __be64;
    open_device = c"ibv_open_device": fn(*mut ibv_device) -> *mut ibv_context;
    close_device = c"ibv_close_device": fn(*mut ibv_context) -> c_int;
    query_device = c"ibv_query_device": fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    query_port = c"ibv_query_port": fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int;
    query_gid = c"ibv_query_gid": fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
    alloc_pd = c"ibv_alloc_pd": fn(*mut ibv_context) -> *mut ibv_pd;
    dealloc_pd = c"ibv_dealloc_pd": fn(*mut ibv_pd) -> c_int;
    reg_mr = c"ibv_reg_mr": fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    dereg_mr = c"ibv_dereg_mr": fn(*mut ibv_mr) -> c_int;
    create_cq = c"ibv_create_cq": fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
    destroy_cq = c"ibv_destroy_cq": fn(*mut ibv_cq) -> c_int;
    create_qp = c"ibv_create_qp": fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    modify_qp = c"ibv_modify_qp": fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    destroy_qp = c"ibv_destroy_qp": fn(*mut ibv_qp) -> c_int;
    get_async_event = c"ibv_get_async_event": fn(*mut ibv_context, *mut ibv_async_event) -> c_int;
    ack_async_event = c"ibv_ack_async_event": fn(*mut ibv_async_event);
    fork_init = c"ibv_fork_init": fn() -> c_int;
}

fn open(soname: &CStr) -> std::result::Result<Verbs, String> {
    // SAFETY: NUL-terminated soname; RTLD_NOW resolves the library's own dependencies now, so a
    // broken installation fails here and not in the middle of a verb.
    let handle = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated message owned by libdl, read at once.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            "not found".to_string()
        } else {
            // SAFETY: non-NULL and NUL-terminated (above); copied before any other dl call.
            unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(format!(
            "{} cannot be loaded ({why})",
            soname.to_string_lossy()
        ));
    }
    // SAFETY: a live handle; it is never closed, so the resolved addresses stay valid for the
    // life of the process (NCCL's ibvwrap keeps its handle the same way).
    unsafe { load(handle) }
}

/// The loaded library, or why it could not be loaded (the error names the package to install).
pub(crate) fn verbs() -> Result<&'static Verbs> {
    static LIB: OnceLock<std::result::Result<Verbs, String>> = OnceLock::new();
    LIB.get_or_init(|| open(LIBIBVERBS))
        .as_ref()
        .map_err(|why| unavailable(why))
}

fn unavailable(why: &str) -> Error {
    Error::System(format!("RDMA is unavailable: {why}; {PACKAGE_HINT}"))
}

/// The optional symbols of the loaded library (none when it is not loaded).
pub fn optional_symbols() -> &'static OptionalSymbols {
    const NONE: OptionalSymbols = OptionalSymbols {
        reg_dmabuf_mr: None,
        query_gid_ex: None,
        query_gid_table: None,
    };
    verbs().map_or(&NONE, |v| &v.optional)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "calls dlvsym; Miri cannot call C")]
    fn absent_symbols_resolve_to_none() {
        // SAFETY: RTLD_DEFAULT is always a valid handle.
        let p = unsafe { lookup(libc::RTLD_DEFAULT, c"ibv_reg_dmabuf_mr", c"IBVERBS_99.0") };
        assert!(p.is_none());
        // SAFETY: as above.
        let p = unsafe { lookup(libc::RTLD_DEFAULT, c"no_such_verbs_symbol", c"IBVERBS_1.1") };
        assert!(p.is_none());
    }

    #[test]
    fn entry_layout_matches_verbs_h() {
        assert_eq!(std::mem::size_of::<GidEntryRaw>(), 32);
        assert_eq!(
            std::mem::size_of::<GidEntryRaw>(),
            std::mem::size_of::<rdma_sys::ibv_gid_entry>()
        );
    }

    /// This host and CI build against rdma-core 44 (Debian bookworm): the library loads at run time
    /// and has every classic verb and the optional symbols.
    #[test]
    #[cfg_attr(miri, ignore = "loads libibverbs with dlopen; Miri cannot call C")]
    fn bookworm_rdma_core_loads_with_its_optional_symbols() {
        assert!(verbs().is_ok());
        let s = optional_symbols();
        assert!(s.has_dmabuf(), "{}", s.describe());
        assert!(s.has_query_gid_ex(), "{}", s.describe());
        assert!(s.has_query_gid_table(), "{}", s.describe());
        assert!(
            s.describe()
                .contains("ibv_reg_dmabuf_mr@IBVERBS_1.12 found")
        );
        let none = OptionalSymbols {
            reg_dmabuf_mr: None,
            query_gid_ex: None,
            query_gid_table: None,
        };
        assert!(none.describe().contains("no DMA-BUF"));
        assert!(none.describe().contains("GID types read from sysfs"));
        assert!(none.describe().contains("one file per slot"));
    }

    #[test]
    #[cfg_attr(miri, ignore = "calls dlopen; Miri cannot call C")]
    fn a_missing_library_is_an_error_naming_the_package() {
        let Err(why) = open(c"libswitchless-no-such-verbs.so.1") else {
            panic!("a library that does not exist loaded");
        };
        assert!(
            why.starts_with("libswitchless-no-such-verbs.so.1 cannot be loaded ("),
            "{why}"
        );
        let m = unavailable(&why).to_string();
        assert!(m.contains("libibverbs1") && m.contains("rdma-core"), "{m}");
    }
}
