//! The `extern "C"` entry points, generic over the backend and over the few argument shapes that differ
//! between ABI versions. Each is a thin shell: check pointers, convert, call `plugin`, write results, all
//! inside [`guard`]. The vtables in `vtables.rs` pick one instance per field.

use std::ffi::{c_int, c_void};
use std::os::fd::BorrowedFd;

use super::abi::{self, ncclResult_t as R};
use super::guard::{array, give, guard, live, object, out, shared, shared_in, take};
use super::log;
use super::props::{AttrIn, CSize, ConfigIn, PropsOut};
use crate::error::{Error, Result};
use crate::plugin::{
    self, Backend, Comm, CommInfo, Context, FlushBuf, Handle, Listen, MAX_GROUPED_RECVS, Mr,
    PtrSupport, RecvBuf, Region, RequestId,
};
use crate::sys::rawmem::Lent;

type Vp = *mut c_void;
type DevHandle = *mut abi::ncclNetDeviceHandle_v7_t;

// ----- init / finalize / devices / properties ---------------------------------------------------------------

/// v6–v9 `init(logger)`.
pub unsafe extern "C" fn init_v6<B: Backend>(logger: abi::ncclDebugLogger_t) -> R {
    guard("init", || {
        log::install(logger);
        plugin::init_legacy::<B>().map(drop)
    })
}

/// v10 `init(logger, profiler)`. The profiler callback is not used.
pub unsafe extern "C" fn init_v10<B: Backend>(
    logger: abi::ncclDebugLogger_t,
    _prof: abi::ncclProfilerCallback_t,
) -> R {
    guard("init", || {
        log::install(logger);
        plugin::init_legacy::<B>().map(drop)
    })
}

/// v11+ `init(ctx, commId, config, logger, profiler)`: one context per communicator.
pub unsafe extern "C" fn init_v11<B: Backend, C: ConfigIn>(
    ctx: *mut Vp,
    comm_id: u64,
    config: *mut C,
    logger: abi::ncclDebugLogger_t,
    _prof: abi::ncclProfilerCallback_t,
) -> R {
    guard("init", || {
        log::install(logger);
        // SAFETY: NCCL passes &comm->netContext (valid for writes) or, if misused, NULL (rejected).
        let ctx = unsafe { out(ctx, "init ctx")? };
        *ctx = std::ptr::null_mut();
        // SAFETY: NULL or NCCL's config struct, valid during the call.
        let traffic_class = unsafe { config.as_ref() }.and_then(ConfigIn::traffic_class);
        let c = plugin::init::<B>(CommInfo {
            comm_id: Some(comm_id),
            traffic_class,
        })?;
        give(ctx, Box::new(c))?;
        Ok(())
    })
}

/// v11+ `finalize(ctx)`: frees the context; the last one releases the backend.
pub unsafe extern "C" fn finalize<B: Backend>(ctx: Vp) -> R {
    guard("finalize", || {
        // SAFETY: ctx came from init_v11 and NCCL finalizes it once.
        let c = unsafe { take::<Context<B>>(ctx, "finalize ctx")? };
        plugin::finalize(*c)
    })
}

/// `devices(ndev)`: 0 when init failed.
pub unsafe extern "C" fn devices<B: Backend>(ndev: *mut c_int) -> R {
    guard("devices", || {
        // SAFETY: NCCL passes a valid int*.
        let ndev = unsafe { out(ndev, "devices ndev")? };
        let n = plugin::devices::<B>()?;
        *ndev = c_int::try_from(n)
            .map_err(|_| Error::Internal(format!("{n} devices do not fit a C int")))?;
        Ok(())
    })
}

/// `getProperties(dev, props)` for every version's struct.
pub unsafe extern "C" fn get_properties<B: Backend, P: PropsOut>(dev: c_int, props: *mut P) -> R {
    guard("getProperties", || {
        // SAFETY: NCCL passes a valid props struct of this version.
        let props = unsafe { out(props, "getProperties props")? };
        let p = plugin::properties::<B>(dev)?;
        props.fill(dev, &p)
    })
}

// ----- connection set-up ---------------------------------------------------------------------------------------

/// The 128-byte handle.
///
/// # Safety
/// `handle` is NULL or valid for reads and writes of `NCCL_NET_HANDLE_MAXSIZE` bytes during the call.
unsafe fn handle<'a>(handle: Vp, what: &str) -> Result<&'a mut Handle> {
    // SAFETY: forwarded; `Handle` is a byte array (alignment 1).
    unsafe { out(handle.cast::<Handle>(), what) }
}

fn do_listen<B: Backend>(ctx: &Context<B>, dev: c_int, h: Vp, listen_comm: *mut Vp) -> Result<()> {
    // SAFETY: NCCL passes a valid void** for the listen comm.
    let lc = unsafe { out(listen_comm, "listen listenComm")? };
    *lc = std::ptr::null_mut();
    // SAFETY: NCCL passes its 128-byte handle buffer.
    let h = unsafe { handle(h, "listen handle")? };
    give(lc, plugin::listen(ctx, dev, h)?)?;
    Ok(())
}

/// v6–v10 `listen(dev, handle, listenComm)`.
pub unsafe extern "C" fn listen_v6<B: Backend>(dev: c_int, h: Vp, listen_comm: *mut Vp) -> R {
    guard("listen", || {
        do_listen(&*plugin::legacy_context::<B>()?, dev, h, listen_comm)
    })
}

/// v11+ `listen(ctx, dev, handle, listenComm)`.
pub unsafe extern "C" fn listen_v11<B: Backend>(
    ctx: Vp,
    dev: c_int,
    h: Vp,
    listen_comm: *mut Vp,
) -> R {
    guard("listen", || {
        // SAFETY: ctx came from init_v11 and is alive until finalize.
        let ctx = unsafe { shared::<Context<B>>(ctx, "listen ctx")? };
        do_listen(ctx, dev, h, listen_comm)
    })
}

fn do_connect<B: Backend>(
    ctx: &Context<B>,
    info: Option<CommInfo>,
    dev: c_int,
    h: Vp,
    send_comm: *mut Vp,
) -> Result<()> {
    // SAFETY: NCCL passes a valid void** for the send comm.
    let sc = unsafe { out(send_comm, "connect sendComm")? };
    *sc = std::ptr::null_mut();
    // SAFETY: the private copy of the handle, valid for the whole connect (NCCL keeps it until connect returns a comm).
    let h = unsafe { handle(h, "connect handle")? };
    if let Some(c) = plugin::connect(ctx, info, dev, h)? {
        give(sc, c)?;
    }
    Ok(())
}

/// v6 `connect(dev, handle, sendComm)`.
pub unsafe extern "C" fn connect_v6<B: Backend>(dev: c_int, h: Vp, send_comm: *mut Vp) -> R {
    guard("connect", || {
        do_connect(&*plugin::legacy_context::<B>()?, None, dev, h, send_comm)
    })
}

/// v7–v9 `connect(dev, handle, sendComm, sendDevComm)`. Host devices: the device handle is ignored.
pub unsafe extern "C" fn connect_v7<B: Backend>(
    dev: c_int,
    h: Vp,
    send_comm: *mut Vp,
    _dev_comm: *mut DevHandle,
) -> R {
    guard("connect", || {
        do_connect(&*plugin::legacy_context::<B>()?, None, dev, h, send_comm)
    })
}

/// v10 `connect(dev, config, handle, sendComm, sendDevComm)`.
pub unsafe extern "C" fn connect_v10<B: Backend>(
    dev: c_int,
    config: *mut abi::ncclNetCommConfig_v10_t,
    h: Vp,
    send_comm: *mut Vp,
    _dev_comm: *mut DevHandle,
) -> R {
    guard("connect", || {
        // SAFETY: NULL or NCCL's config, valid during the call.
        let traffic_class = unsafe { config.as_ref() }.and_then(ConfigIn::traffic_class);
        let info = CommInfo {
            comm_id: None,
            traffic_class,
        };
        do_connect(
            &*plugin::legacy_context::<B>()?,
            Some(info),
            dev,
            h,
            send_comm,
        )
    })
}

/// v11+ `connect(ctx, dev, handle, sendComm, sendDevComm)`.
pub unsafe extern "C" fn connect_v11<B: Backend>(
    ctx: Vp,
    dev: c_int,
    h: Vp,
    send_comm: *mut Vp,
    _dev_comm: *mut DevHandle,
) -> R {
    guard("connect", || {
        // SAFETY: ctx came from init_v11 and is alive until finalize.
        let ctx = unsafe { shared::<Context<B>>(ctx, "connect ctx")? };
        do_connect(ctx, None, dev, h, send_comm)
    })
}

fn do_accept<B: Backend>(listen_comm: Vp, recv_comm: *mut Vp) -> Result<()> {
    // SAFETY: NCCL passes a valid void** for the recv comm.
    let rc = unsafe { out(recv_comm, "accept recvComm")? };
    *rc = std::ptr::null_mut();
    // SAFETY: a listen comm from listen, not yet closed.
    let l = unsafe { object::<Listen<B>>(listen_comm, "accept listenComm")? };
    if let Some(c) = plugin::accept(l)? {
        give(rc, c)?;
    }
    Ok(())
}

/// v6 `accept(listenComm, recvComm)`.
pub unsafe extern "C" fn accept_v6<B: Backend>(listen_comm: Vp, recv_comm: *mut Vp) -> R {
    guard("accept", || do_accept::<B>(listen_comm, recv_comm))
}

/// v7+ `accept(listenComm, recvComm, recvDevComm)`.
pub unsafe extern "C" fn accept_v7<B: Backend>(
    listen_comm: Vp,
    recv_comm: *mut Vp,
    _dev_comm: *mut DevHandle,
) -> R {
    guard("accept", || do_accept::<B>(listen_comm, recv_comm))
}

// ----- registration ----------------------------------------------------------------------------------------------

/// NCCL's buffer as a [`Region`]: the one place a bare address becomes lent memory.
///
/// # Safety
/// `data..data+size` is a buffer NCCL registers: host or device memory that stays allocated until
/// the matching `deregMr` (NCCL's `regMr` contract, the same as `ibv_reg_mr`'s), which NCCL calls
/// only once no request using the buffer is in flight.
unsafe fn region(data: Vp, size: usize, kind: c_int) -> Result<Region> {
    let kind = u32::try_from(kind)
        .ok()
        .filter(|k| [PtrSupport::HOST.0, PtrSupport::CUDA.0, PtrSupport::DMABUF.0].contains(k))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "memory type {kind}; accepted: NCCL_PTR_HOST (1), NCCL_PTR_CUDA (2), NCCL_PTR_DMABUF (4)"
            ))
        })?;
    // SAFETY: the caller's contract is `Lent::from_raw`'s: NCCL keeps the buffer allocated and
    // writable until deregMr, which releases every registration made from it.
    let mem = unsafe { Lent::from_raw(data.cast(), size)? };
    Ok(Region {
        mem,
        kind: PtrSupport(kind),
    })
}

/// `regMr(comm, data, size, type, mhandle)`; `size` is `int` up to v7.
pub unsafe extern "C" fn reg_mr<B: Backend, S: CSize>(
    comm: Vp,
    data: Vp,
    size: S,
    kind: c_int,
    mhandle: *mut Vp,
) -> R {
    guard("regMr", || {
        // SAFETY: NCCL passes a valid void** for the handle.
        let mh = unsafe { out(mhandle, "regMr mhandle")? };
        *mh = std::ptr::null_mut();
        // SAFETY: a send or recv comm of ours, alive until closeSend/closeRecv (the progress thread may
        // use it meanwhile: shared access only).
        let comm = unsafe { shared::<Comm<B>>(comm, "regMr comm")? };
        // SAFETY: `data` is the buffer NCCL registers (regMr's contract, see `region`).
        let region = unsafe { region(data, size.bytes()?, kind)? };
        give(mh, plugin::reg_mr(comm, region)?)?;
        Ok(())
    })
}

/// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)` (same in every version).
pub unsafe extern "C" fn reg_mr_dmabuf<B: Backend>(
    comm: Vp,
    data: Vp,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut Vp,
) -> R {
    guard("regMrDmaBuf", || {
        // SAFETY: NCCL passes a valid void** for the handle.
        let mh = unsafe { out(mhandle, "regMrDmaBuf mhandle")? };
        *mh = std::ptr::null_mut();
        // SAFETY: as in regMr.
        let comm = unsafe { shared::<Comm<B>>(comm, "regMrDmaBuf comm")? };
        if fd < 0 {
            return Err(Error::InvalidArgument(format!(
                "regMrDmaBuf fd {fd}; a DMA-BUF file descriptor >= 0 is required"
            )));
        }
        // SAFETY: NCCL keeps `fd` open for the duration of this call (it closes it right after).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        // SAFETY: as in regMr: NCCL's DMA-BUF mapping at `data` lives until deregMr.
        let region = unsafe { region(data, size, kind)? };
        give(mh, plugin::reg_mr_dmabuf(comm, region, offset, fd)?)?;
        Ok(())
    })
}

/// `deregMr(comm, mhandle)`.
pub unsafe extern "C" fn dereg_mr<B: Backend>(comm: Vp, mhandle: Vp) -> R {
    guard("deregMr", || {
        // SAFETY: as in regMr.
        let comm = unsafe { shared::<Comm<B>>(comm, "deregMr comm")? };
        // SAFETY: an mhandle from regMr*, deregistered once.
        let mr = unsafe { take::<Mr<B>>(mhandle, "deregMr mhandle")? };
        plugin::dereg_mr(comm, *mr)
    })
}

/// `getDeviceMr`: host devices have no device-side handle; always NULL.
pub unsafe extern "C" fn get_device_mr(_comm: Vp, _mhandle: Vp, dptr: *mut Vp) -> R {
    guard("getDeviceMr", || {
        // SAFETY: NCCL passes a valid void**.
        *unsafe { out(dptr, "getDeviceMr dptr_mhandle")? } = std::ptr::null_mut();
        Ok(())
    })
}

// ----- data path -------------------------------------------------------------------------------------------------

fn do_isend<B: Backend>(
    send_comm: Vp,
    data: Vp,
    size: usize,
    tag: c_int,
    mhandle: Vp,
    request: *mut Vp,
) -> Result<()> {
    // SAFETY: NCCL passes a valid void** for the request.
    let req = unsafe { out(request, "isend request")? };
    *req = std::ptr::null_mut();
    let live = live()?;
    // SAFETY: a send comm of ours, alive until closeSend; the service thread may register on it
    // meanwhile: shared access only.
    let comm = unsafe { shared_in::<Comm<B>>(&live, send_comm, "isend sendComm")? };
    // SAFETY: an mhandle from regMr*, alive until deregMr.
    let mr = unsafe { shared_in::<Mr<B>>(&live, mhandle, "isend mhandle")? };
    drop(live);
    give_request(req, plugin::isend(comm, data as usize, size, tag, mr)?)
}

/// Writes a posted request's id into NCCL's `void* request` (left NULL for "retry"/"nothing to wait
/// for"). NCCL never dereferences it; `test` hands it back to the slab.
fn give_request(slot: &mut Vp, id: Option<RequestId>) -> Result<()> {
    if let Some(id) = id {
        let raw = usize::try_from(id.to_raw()).map_err(|_| {
            Error::Internal(format!(
                "request id {:#x} does not fit a pointer",
                id.to_raw()
            ))
        })?;
        *slot = std::ptr::without_provenance_mut(raw);
    }
    Ok(())
}

/// v6–v9 `isend(sendComm, data, size, tag, mhandle, request)`; `size` is `int` up to v8.
pub unsafe extern "C" fn isend_v6<B: Backend, S: CSize>(
    send_comm: Vp,
    data: Vp,
    size: S,
    tag: c_int,
    mhandle: Vp,
    request: *mut Vp,
) -> R {
    guard("isend", || {
        do_isend::<B>(send_comm, data, size.bytes()?, tag, mhandle, request)
    })
}

/// v10+ `isend(…, mhandle, phandle, request)`. The profiler handle is not used.
pub unsafe extern "C" fn isend_v10<B: Backend>(
    send_comm: Vp,
    data: Vp,
    size: usize,
    tag: c_int,
    mhandle: Vp,
    _phandle: Vp,
    request: *mut Vp,
) -> R {
    guard("isend", || {
        do_isend::<B>(send_comm, data, size, tag, mhandle, request)
    })
}

fn count(n: c_int, what: &str) -> Result<usize> {
    usize::try_from(n)
        .ok()
        .filter(|&n| (1..=MAX_GROUPED_RECVS).contains(&n))
        .ok_or_else(|| {
            Error::InvalidArgument(format!("{what} n = {n}; accepted: 1..={MAX_GROUPED_RECVS}"))
        })
}

#[allow(clippy::too_many_arguments)]
fn do_irecv<B: Backend, S: CSize>(
    recv_comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut S,
    tags: *mut c_int,
    mhandles: *mut Vp,
    request: *mut Vp,
) -> Result<()> {
    // SAFETY: NCCL passes a valid void**. It may hold NCCL_NET_OPTIONAL_RECV_COMPLETION (0x1): always
    // overwritten below.
    let req = unsafe { out(request, "irecv request")? };
    *req = std::ptr::null_mut();
    let n = count(n, "irecv")?;
    // SAFETY: NCCL passes arrays of n elements each.
    let (data, sizes, tags, mhs) = unsafe {
        (
            array(data, n, "irecv data")?,
            array(sizes, n, "irecv sizes")?,
            array(tags, n, "irecv tags")?,
            array(mhandles, n, "irecv mhandles")?,
        )
    };
    let live = live()?;
    // SAFETY: as in isend, for a recv comm.
    let comm = unsafe { shared_in::<Comm<B>>(&live, recv_comm, "irecv recvComm")? };
    let buf = |i: usize| -> Result<RecvBuf<'_, B::Mr>> {
        // SAFETY: mhandles from regMr*, alive until deregMr.
        let mr = unsafe { shared_in::<Mr<B>>(&live, mhs[i], "irecv mhandle")? };
        Ok(RecvBuf {
            addr: data[i] as usize,
            size: sizes[i].bytes()?,
            tag: tags[i],
            mr: mr.inner(),
        })
    };
    // On the stack: no allocation per request.
    let mut bufs = [buf(0)?; MAX_GROUPED_RECVS];
    for (i, b) in bufs.iter_mut().enumerate().take(n).skip(1) {
        *b = buf(i)?;
    }
    drop(live);
    give_request(req, plugin::irecv(comm, &bufs[..n])?)
}

/// v6–v9 `irecv(recvComm, n, data, sizes, tags, mhandles, request)`; sizes are `int` up to v8.
pub unsafe extern "C" fn irecv_v6<B: Backend, S: CSize>(
    recv_comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut S,
    tags: *mut c_int,
    mhandles: *mut Vp,
    request: *mut Vp,
) -> R {
    guard("irecv", || {
        do_irecv::<B, S>(recv_comm, n, data, sizes, tags, mhandles, request)
    })
}

/// v10+ `irecv(…, mhandles, phandles, request)`.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn irecv_v10<B: Backend>(
    recv_comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut Vp,
    _phandles: *mut Vp,
    request: *mut Vp,
) -> R {
    guard("irecv", || {
        do_irecv::<B, usize>(recv_comm, n, data, sizes, tags, mhandles, request)
    })
}

/// `iflush(recvComm, n, data, sizes, mhandles, request)` (same in every version). A NULL request means
/// "nothing to wait for".
pub unsafe extern "C" fn iflush<B: Backend>(
    recv_comm: Vp,
    n: c_int,
    data: *mut Vp,
    sizes: *mut c_int,
    mhandles: *mut Vp,
    request: *mut Vp,
) -> R {
    guard("iflush", || {
        // SAFETY: NCCL passes a valid void**.
        let req = unsafe { out(request, "iflush request")? };
        *req = std::ptr::null_mut();
        let n = count(n, "iflush")?;
        // SAFETY: NCCL passes arrays of n elements each.
        let (data, sizes, mhs) = unsafe {
            (
                array(data, n, "iflush data")?,
                array(sizes, n, "iflush sizes")?,
                array(mhandles, n, "iflush mhandles")?,
            )
        };
        let live = live()?;
        // SAFETY: as in isend, for a recv comm.
        let comm = unsafe { shared_in::<Comm<B>>(&live, recv_comm, "iflush recvComm")? };
        let buf = |i: usize| -> Result<FlushBuf<'_, B::Mr>> {
            // SAFETY: mhandles from regMr*, alive until deregMr.
            let mr = unsafe { shared_in::<Mr<B>>(&live, mhs[i], "iflush mhandle")? };
            Ok(FlushBuf {
                addr: data[i] as usize,
                size: sizes[i].bytes()?,
                mr: mr.inner(),
            })
        };
        // On the stack: no allocation per request.
        let mut bufs = [buf(0)?; MAX_GROUPED_RECVS];
        for (i, b) in bufs.iter_mut().enumerate().take(n).skip(1) {
            *b = buf(i)?;
        }
        drop(live);
        give_request(req, plugin::iflush(comm, &bufs[..n])?)
    })
}

/// `test(request, done, sizes)`: a completed request is freed; `sizes` (may be NULL) gets one int per
/// buffer. The request is an id the slab checks (any value is safe: it is never dereferenced).
pub unsafe extern "C" fn test<B: Backend>(request: Vp, done: *mut c_int, sizes: *mut c_int) -> R {
    guard("test", || {
        // SAFETY: NCCL passes a valid int*.
        let done = unsafe { out(done, "test done")? };
        *done = 0;
        if request.is_null() {
            return Err(Error::InvalidArgument(
                "test request is NULL; expected a request from isend/irecv/iflush".into(),
            ));
        }
        let id = RequestId::from_raw(request.addr() as u64);
        let mut counts = [0usize; MAX_GROUPED_RECVS];
        let Some(n) = plugin::test::<B>(id, &mut counts)? else {
            return Ok(());
        };
        if !sizes.is_null() {
            for (i, &c) in counts[..n].iter().enumerate() {
                let c = c_int::try_from(c).map_err(|_| {
                    Error::Internal(format!(
                        "completed size {c} bytes does not fit test()'s int"
                    ))
                })?;
                // SAFETY: NCCL's sizes array has NCCL_PROXY_MAX_SUBS (64) ints for a receive and one for a
                // send; n <= 64 for a receive, 1 for a send.
                unsafe { sizes.add(i).write(c) };
            }
        }
        *done = 1;
        Ok(())
    })
}

// ----- teardown and hints ----------------------------------------------------------------------------------------

/// `closeSend(sendComm)`.
pub unsafe extern "C" fn close_send<B: Backend>(send_comm: Vp) -> R {
    guard("closeSend", || {
        // SAFETY: a comm of ours; checked to be a send comm before ownership is taken.
        if !unsafe { shared::<Comm<B>>(send_comm, "closeSend sendComm")? }.is_send() {
            return Err(Error::InvalidArgument(
                "closeSend was given a recv comm".into(),
            ));
        }
        // SAFETY: a send comm of ours, closed once.
        plugin::close_send(*unsafe { take::<Comm<B>>(send_comm, "closeSend sendComm")? })
    })
}

/// `closeRecv(recvComm)`.
pub unsafe extern "C" fn close_recv<B: Backend>(recv_comm: Vp) -> R {
    guard("closeRecv", || {
        // SAFETY: a comm of ours; checked to be a recv comm before ownership is taken.
        if unsafe { shared::<Comm<B>>(recv_comm, "closeRecv recvComm")? }.is_send() {
            return Err(Error::InvalidArgument(
                "closeRecv was given a send comm".into(),
            ));
        }
        // SAFETY: a recv comm of ours, closed once.
        plugin::close_recv(*unsafe { take::<Comm<B>>(recv_comm, "closeRecv recvComm")? })
    })
}

/// `closeListen(listenComm)`.
pub unsafe extern "C" fn close_listen<B: Backend>(listen_comm: Vp) -> R {
    guard("closeListen", || {
        // SAFETY: a listen comm of ours, closed once.
        plugin::close_listen(*unsafe { take::<Listen<B>>(listen_comm, "closeListen listenComm")? })
    })
}

/// v11+ `setNetAttr(ctx, attr)`.
pub unsafe extern "C" fn set_net_attr<B: Backend, A: AttrIn>(ctx: Vp, attr: *mut A) -> R {
    guard("setNetAttr", || {
        // SAFETY: ctx came from init_v11 and is alive until finalize.
        let ctx = unsafe { shared::<Context<B>>(ctx, "setNetAttr ctx")? };
        // SAFETY: NCCL passes a valid attr struct during the call.
        let attr = unsafe { out(attr, "setNetAttr netAttr")? };
        plugin::set_net_attr(ctx, &attr.attr())
    })
}
