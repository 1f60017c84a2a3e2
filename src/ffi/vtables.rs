//! The exported vtables `ncclNetPlugin_v6` … `ncclNetPlugin_v12`: one `const fn` per version picks the
//! generic entry points of `adapters` for the version's argument shapes. Nothing else differs by version.

#![allow(non_upper_case_globals)]

use std::ffi::{c_char, c_int};

use super::abi;
use super::adapters as a;
use crate::plugin::{ActiveBackend, Backend};

/// The plugin's name (`ncclNet_t.name`; what `NCCL_NET=switchless` matches).
pub const NAME: &std::ffi::CStr = c"switchless";

const fn name() -> *const c_char {
    NAME.as_ptr()
}

/// The v6 vtable over backend `B`.
pub const fn net_v6<B: Backend>() -> abi::ncclNet_v6_t {
    abi::ncclNet_v6_t {
        name: name(),
        init: Some(a::init_v6::<B>),
        devices: Some(a::devices::<B>),
        getProperties: Some(a::get_properties::<B, abi::ncclNetProperties_v6_t>),
        listen: Some(a::listen_v6::<B>),
        connect: Some(a::connect_v6::<B>),
        accept: Some(a::accept_v6::<B>),
        regMr: Some(a::reg_mr::<B, c_int>),
        regMrDmaBuf: Some(a::reg_mr_dmabuf::<B>),
        deregMr: Some(a::dereg_mr::<B>),
        isend: Some(a::isend_v6::<B, c_int>),
        irecv: Some(a::irecv_v6::<B, c_int>),
        iflush: Some(a::iflush::<B>),
        test: Some(a::test::<B>),
        closeSend: Some(a::close_send::<B>),
        closeRecv: Some(a::close_recv::<B>),
        closeListen: Some(a::close_listen::<B>),
    }
}

/// Fills the fields v7 through v12 share (besides init/getProperties/listen/connect/makeVDevice and the
/// v11 additions) from one list.
macro_rules! vtable {
    ($t:ident, $B:ty, $props:ty, regmr: $rs:ty, send: $isend:expr, recv: $irecv:expr,
     init: $init:expr, listen: $listen:expr, connect: $connect:expr $(, $extra:ident : $val:expr)* $(,)?) => {
        abi::$t {
            name: name(),
            init: Some($init),
            devices: Some(a::devices::<$B>),
            getProperties: Some(a::get_properties::<$B, $props>),
            listen: Some($listen),
            connect: Some($connect),
            accept: Some(a::accept_v7::<$B>),
            regMr: Some(a::reg_mr::<$B, $rs>),
            regMrDmaBuf: Some(a::reg_mr_dmabuf::<$B>),
            deregMr: Some(a::dereg_mr::<$B>),
            isend: Some($isend),
            irecv: Some($irecv),
            iflush: Some(a::iflush::<$B>),
            test: Some(a::test::<$B>),
            closeSend: Some(a::close_send::<$B>),
            closeRecv: Some(a::close_recv::<$B>),
            closeListen: Some(a::close_listen::<$B>),
            getDeviceMr: Some(a::get_device_mr),
            // Only for device-side (UNPACK) networking; NCCL calls it after test() already reported done.
            irecvConsumed: None,
            $($extra: $val,)*
        }
    };
}

/// The v7 vtable over backend `B`.
pub const fn net_v7<B: Backend>() -> abi::ncclNet_v7_t {
    vtable!(ncclNet_v7_t, B, abi::ncclNetProperties_v7_t, regmr: c_int,
        send: a::isend_v6::<B, c_int>, recv: a::irecv_v6::<B, c_int>,
        init: a::init_v6::<B>, listen: a::listen_v6::<B>, connect: a::connect_v7::<B>)
}

/// The v8 vtable over backend `B`.
pub const fn net_v8<B: Backend>() -> abi::ncclNet_v8_t {
    vtable!(ncclNet_v8_t, B, abi::ncclNetProperties_v8_t, regmr: usize,
        send: a::isend_v6::<B, c_int>, recv: a::irecv_v6::<B, c_int>,
        init: a::init_v6::<B>, listen: a::listen_v6::<B>, connect: a::connect_v7::<B>)
}

/// The v9 vtable over backend `B`. No virtual devices: NCCL then uses the physical ones only.
pub const fn net_v9<B: Backend>() -> abi::ncclNet_v9_t {
    vtable!(ncclNet_v9_t, B, abi::ncclNetProperties_v9_t, regmr: usize,
        send: a::isend_v6::<B, usize>, recv: a::irecv_v6::<B, usize>,
        init: a::init_v6::<B>, listen: a::listen_v6::<B>, connect: a::connect_v7::<B>,
        makeVDevice: None)
}

/// The v10 vtable over backend `B`.
pub const fn net_v10<B: Backend>() -> abi::ncclNet_v10_t {
    vtable!(ncclNet_v10_t, B, abi::ncclNetProperties_v10_t, regmr: usize,
        send: a::isend_v10::<B>, recv: a::irecv_v10::<B>,
        init: a::init_v10::<B>, listen: a::listen_v6::<B>, connect: a::connect_v10::<B>,
        makeVDevice: None)
}

/// The v11 vtable over backend `B`.
pub const fn net_v11<B: Backend>() -> abi::ncclNet_v11_t {
    vtable!(ncclNet_v11_t, B, abi::ncclNetProperties_v11_t, regmr: usize,
        send: a::isend_v10::<B>, recv: a::irecv_v10::<B>,
        init: a::init_v11::<B, abi::ncclNetCommConfig_v11_t>, listen: a::listen_v11::<B>,
        connect: a::connect_v11::<B>,
        makeVDevice: None,
        finalize: Some(a::finalize::<B>),
        setNetAttr: Some(a::set_net_attr::<B, abi::ncclNetAttr_v11_t>))
}

/// The v12 vtable over backend `B`.
pub const fn net_v12<B: Backend>() -> abi::ncclNet_v12_t {
    vtable!(ncclNet_v12_t, B, abi::ncclNetProperties_v12_t, regmr: usize,
        send: a::isend_v10::<B>, recv: a::irecv_v10::<B>,
        init: a::init_v11::<B, abi::ncclNetCommConfig_v12_t>, listen: a::listen_v11::<B>,
        connect: a::connect_v11::<B>,
        makeVDevice: None,
        finalize: Some(a::finalize::<B>),
        setNetAttr: Some(a::set_net_attr::<B, abi::ncclNetAttr_v12_t>))
}

macro_rules! sync {
    ($($t:ident),*) => {$(
        // SAFETY: the vtables are immutable statics; `name` points to a 'static C string literal and every
        // other field is a function pointer, so sharing them between threads is sound.
        unsafe impl Sync for abi::$t {}
    )*};
}
sync!(
    ncclNet_v6_t,
    ncclNet_v7_t,
    ncclNet_v8_t,
    ncclNet_v9_t,
    ncclNet_v10_t,
    ncclNet_v11_t,
    ncclNet_v12_t
);

/// ABI v12 (NCCL 2.30+).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v12: abi::ncclNet_v12_t = net_v12::<ActiveBackend>();
/// ABI v11 (NCCL 2.28, 2.29).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v11: abi::ncclNet_v11_t = net_v11::<ActiveBackend>();
/// ABI v10 (NCCL 2.26, 2.27).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v10: abi::ncclNet_v10_t = net_v10::<ActiveBackend>();
/// ABI v9 (NCCL 2.24, 2.25).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v9: abi::ncclNet_v9_t = net_v9::<ActiveBackend>();
/// ABI v8 (NCCL 2.20 – 2.23).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v8: abi::ncclNet_v8_t = net_v8::<ActiveBackend>();
/// ABI v7 (NCCL 2.19).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v7: abi::ncclNet_v7_t = net_v7::<ActiveBackend>();
/// ABI v6 (NCCL 2.18 and older releases that know v6).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v6: abi::ncclNet_v6_t = net_v6::<ActiveBackend>();
