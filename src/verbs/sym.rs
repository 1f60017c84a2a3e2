//! Verbs symbols newer than the `IBVERBS_1.1` baseline, resolved at run time with `dlvsym` so the
//! plugin loads on older rdma-core (linking them directly would make `dlopen` of the plugin fail;
//! rust-stack.md §0.3). Absent symbols degrade: no DMA-BUF registration; GID types from sysfs.

use rdma_sys::{ibv_context, ibv_mr, ibv_pd};
use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

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

/// The optional symbols found in the loaded libibverbs.
#[derive(Debug, Clone, Copy)]
pub struct OptionalSymbols {
    pub(crate) reg_dmabuf_mr: Option<RegDmabufMrFn>,
    pub(crate) query_gid_ex: Option<QueryGidExFn>,
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

    /// One line for the init log.
    pub fn describe(&self) -> String {
        let yn = |b: bool| if b { "found" } else { "absent" };
        format!(
            "ibv_reg_dmabuf_mr@IBVERBS_1.12 {}{}, _ibv_query_gid_ex@IBVERBS_1.11 {}{}",
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
        )
    }
}

/// The soname we look in first (already loaded: we link it).
const LIBIBVERBS: &CStr = c"libibverbs.so.1";

/// Looks `name@version` up in `handle`; `None` if absent.
///
/// # Safety
/// `handle` is a live `dlopen` handle or `RTLD_DEFAULT`.
unsafe fn lookup(handle: *mut c_void, name: &CStr, version: &CStr) -> Option<*mut c_void> {
    // SAFETY: both strings are NUL-terminated; `handle` is valid per this function's contract.
    let p = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn resolve() -> OptionalSymbols {
    // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to an already-loaded library (or NULL);
    // the name is NUL-terminated.
    let handle = unsafe { libc::dlopen(LIBIBVERBS.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    let (h, close) = if handle.is_null() {
        (libc::RTLD_DEFAULT, false)
    } else {
        (handle, true)
    };
    // SAFETY: `h` is the handle just obtained or RTLD_DEFAULT.
    let dmabuf = unsafe { lookup(h, c"ibv_reg_dmabuf_mr", c"IBVERBS_1.12") };
    // SAFETY: as above.
    let gid_ex = unsafe { lookup(h, c"_ibv_query_gid_ex", c"IBVERBS_1.11") };
    let syms = OptionalSymbols {
        // SAFETY: the symbol of this name and version has this C signature in rdma-core's verbs.h
        // (`struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int)`).
        reg_dmabuf_mr: dmabuf
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, RegDmabufMrFn>(p) }),
        // SAFETY: `int _ibv_query_gid_ex(struct ibv_context *, uint32_t, uint32_t,
        // struct ibv_gid_entry *, uint32_t, size_t)` in rdma-core's verbs.h.
        query_gid_ex: gid_ex
            .map(|p| unsafe { std::mem::transmute::<*mut c_void, QueryGidExFn>(p) }),
    };
    if close {
        // SAFETY: drops the reference our RTLD_NOLOAD dlopen took; the library stays loaded because
        // this object links it (DT_NEEDED), so the resolved addresses stay valid.
        unsafe { libc::dlclose(handle) };
    }
    syms
}

/// The optional symbols, resolved once per process.
pub fn optional_symbols() -> &'static OptionalSymbols {
    static SYMS: OnceLock<OptionalSymbols> = OnceLock::new();
    SYMS.get_or_init(resolve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
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

    /// This host and CI build against rdma-core 44 (Debian bookworm), which has both symbols.
    #[test]
    fn bookworm_rdma_core_has_both() {
        let s = optional_symbols();
        assert!(s.has_dmabuf(), "{}", s.describe());
        assert!(s.has_query_gid_ex(), "{}", s.describe());
        assert!(
            s.describe()
                .contains("ibv_reg_dmabuf_mr@IBVERBS_1.12 found")
        );
        let none = OptionalSymbols {
            reg_dmabuf_mr: None,
            query_gid_ex: None,
        };
        assert!(none.describe().contains("no DMA-BUF"));
        assert!(none.describe().contains("sysfs"));
    }
}
