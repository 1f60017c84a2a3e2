//! The exported tuner tables `ncclTunerPlugin_v1` … `ncclTunerPlugin_v6`: thin adapters over
//! [`crate::tuner`], inside the same panic guard and logger as the net plugin. Which NCCL loads which
//! (`src/plugin/tuner.cc` and its predecessors `src/misc/tuner.cc`):
//!
//! | NCCL | looks for | from |
//! |---|---|---|
//! | 2.19, 2.20 | v1 | `NCCL_TUNER_PLUGIN` only |
//! | 2.21 | v2 | `NCCL_TUNER_PLUGIN`, `libnccl-tuner.so`, then the net plugin's library |
//! | 2.22, 2.23 | v3, v2 | same |
//! | 2.24–2.27 | v4, v3, v2 | same |
//! | 2.28, 2.29 | v5 … v2 | same (`NCCL_TUNER_PLUGIN=none`: no tuner) |
//! | 2.30 | v6 … v2 | same |
//!
//! v1 has no per-communicator context: one global state cannot tell communicators apart, and ranks
//! belonging to different communicators would decide differently for the same collective (a hang), so
//! v1 is exported, loads, and changes nothing (its INFO line says so). Every other version keeps one
//! [`Session`] per communicator, filed in the guard's registry like the net plugin's objects.

#![allow(non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};

use super::abi::{self, ncclResult_t as R};
use super::guard::{give, guard, out, shared, take};
use super::log;
use crate::error::{Error, Result};
use crate::plugin::{self, ActiveBackend, Object};
use crate::tuner::decide::Table;
use crate::tuner::fabric::{LocalView, Relay};
use crate::tuner::model::Constants;
use crate::tuner::{Session, Shape, TARGET_TUNING};

type Vp = *mut c_void;

/// The tuner's name (`ncclTuner_t.name`; NCCL logs it).
pub const NAME: &std::ffi::CStr = c"switchless";

/// What the tuner reads about the fabric: the net plugin in this process.
pub trait FabricSource: 'static {
    /// The devices of the open net plugin; `None` when none is open in this process.
    fn view() -> Option<LocalView>;
    /// Whether a relay reaches hosts that share no cable.
    fn relay() -> Relay {
        Relay::Unavailable
    }
}

/// The exported tables read the net plugin the exported `ncclNetPlugin_vN` tables drive.
#[derive(Debug)]
pub struct NetPlugin;

impl FabricSource for NetPlugin {
    fn view() -> Option<LocalView> {
        let b = plugin::live_backend::<ActiveBackend>().ok().flatten()?;
        let v = b.view();
        Some(LocalView::from_host(&v.devices, &v.links))
    }

    // The net plugin carries bytes only on the cables to the destination host: no relay.
}

const TUNER_MAGIC: u64 = 0x5357_4c5f_5455_4e45; // "SWL_TUNE"

/// One communicator's tuner context as NCCL holds it.
#[derive(Debug)]
pub struct TunerCtx {
    magic: u64,
    session: Session,
}

impl Object for TunerCtx {
    const WHAT: &'static str = "tuner context";
    const MAGIC: u64 = TUNER_MAGIC;
    fn is_valid(&self) -> bool {
        self.magic == TUNER_MAGIC
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

fn open<S: FabricSource>(n_ranks: usize, n_nodes: usize, consts: Option<&Constants>) -> TunerCtx {
    let view = S::view();
    TunerCtx {
        magic: TUNER_MAGIC,
        session: Session::open(
            Shape {
                ranks: n_ranks,
                nodes: n_nodes,
            },
            view.as_ref(),
            S::relay(),
            consts,
            &env,
        ),
    }
}

fn bytes(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn coll(c: abi::ncclFunc_t) -> i32 {
    i32::try_from(c.0).unwrap_or(i32::MAX)
}

// ----- v1 ----------------------------------------------------------------------------------------------------

/// v1 `init(nRanks, nNodes, logger)`: logs why v1 changes nothing.
unsafe extern "C" fn init_v1(n_ranks: usize, n_nodes: usize, logger: abi::ncclDebugLogger_t) -> R {
    guard("tuner init", || {
        log::install(logger);
        tracing::info!(
            target: TARGET_TUNING,
            "switchless tuner (v1, NCCL 2.19/2.20): nothing changed for this communicator of {n_ranks} ranks on \
             {n_nodes} hosts: the v1 interface has no per-communicator context, so decisions could differ \
             between ranks that belong to different communicators; use NCCL 2.21+ (v2+) or NCCL_ALGO"
        );
        Ok(())
    })
}

/// v1 `getCollInfo`: checks its out-pointers and leaves them (NCCL's choice).
unsafe extern "C" fn get_coll_info_v1(
    _coll: abi::ncclFunc_t,
    _n_bytes: usize,
    _coll_net: c_int,
    _nvls: c_int,
    _pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> R {
    guard("tuner getCollInfo", || {
        // SAFETY: NCCL passes valid int* out-parameters (checked for NULL and alignment, not written).
        unsafe {
            out(algorithm, "getCollInfo algorithm")?;
            out(protocol, "getCollInfo protocol")?;
            out(n_channels, "getCollInfo nChannels")?;
        }
        Ok(())
    })
}

/// v1 `destroy()`.
unsafe extern "C" fn destroy_v1() -> R {
    guard("tuner destroy", || Ok(()))
}

// ----- v2 … v6 ---------------------------------------------------------------------------------------------

/// v2–v4 `init(nRanks, nNodes, logger, context)`.
unsafe extern "C" fn init_v2<S: FabricSource>(
    n_ranks: usize,
    n_nodes: usize,
    logger: abi::ncclDebugLogger_t,
    context: *mut Vp,
) -> R {
    guard("tuner init", || {
        log::install(logger);
        // SAFETY: NCCL passes &comm->tunerContext (valid for writes) or, if misused, NULL (rejected).
        let slot = unsafe { out(context, "tuner init context")? };
        *slot = std::ptr::null_mut();
        give(slot, Box::new(open::<S>(n_ranks, n_nodes, None)))
    })
}

/// v5/v6 `init(context, commId, nRanks, nNodes, logger, nvlDomainInfo, constants)`. The constants are
/// read (to price with NCCL's own latencies), never written.
unsafe extern "C" fn init_v5<S: FabricSource>(
    context: *mut Vp,
    _comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    logger: abi::ncclDebugLogger_t,
    _nvl: *mut abi::ncclNvlDomainInfo_v5_t,
    constants: *mut abi::ncclTunerConstants_v5_t,
) -> R {
    guard("tuner init", || {
        log::install(logger);
        // SAFETY: as in init_v2.
        let slot = unsafe { out(context, "tuner init context")? };
        *slot = std::ptr::null_mut();
        // SAFETY: NULL or NCCL's comm->tunerConstants, valid for reads during the call.
        let consts = unsafe { constants.as_ref() }.map(from_abi);
        give(slot, Box::new(open::<S>(n_ranks, n_nodes, consts.as_ref())))
    })
}

/// NCCL's constants as the model's.
pub fn from_abi(c: &abi::ncclTunerConstants_v5_t) -> Constants {
    Constants {
        base_latencies: c.baseLatencies,
        hw_latencies: c.hwLatencies,
        ll_max_bws: c.llMaxBws,
        per_ch_max_tree_bws: c.perChMaxTreeBws,
    }
}

/// v2 `getCollInfo(context, collType, nBytes, collNetSupport, nvlsSupport, numPipeOps, algorithm,
/// protocol, nChannels)`: names an algorithm and protocol (both or neither) when the plan has one.
unsafe extern "C" fn get_coll_info_v2(
    context: Vp,
    coll_type: abi::ncclFunc_t,
    n_bytes: usize,
    _coll_net: c_int,
    _nvls: c_int,
    _pipe_ops: c_int,
    algorithm: *mut c_int,
    protocol: *mut c_int,
    n_channels: *mut c_int,
) -> R {
    guard("tuner getCollInfo", || {
        // SAFETY: context came from init_v2 and is not freed during the call.
        let ctx = unsafe { shared::<TunerCtx>(context, "getCollInfo context")? };
        // SAFETY: NCCL passes valid int* out-parameters.
        let (alg, pro, nch) = unsafe {
            (
                out(algorithm, "getCollInfo algorithm")?,
                out(protocol, "getCollInfo protocol")?,
                out(n_channels, "getCollInfo nChannels")?,
            )
        };
        if let Some((a, p, ch)) = ctx.session.plan().choose(coll(coll_type), bytes(n_bytes)) {
            *alg = c_int::try_from(a).map_err(|_| Error::Internal(format!("algorithm {a}")))?;
            *pro = c_int::try_from(p).map_err(|_| Error::Internal(format!("protocol {p}")))?;
            if let Some(c) = ch {
                *nch = c_int::try_from(c).unwrap_or(c_int::MAX);
            }
        }
        Ok(())
    })
}

/// The cost table of a v3+ call, after checking its shape and pointer.
///
/// # Safety
/// `table` is NULL or points to `algos` × `protos` contiguous floats valid for reads and writes during
/// the call (NCCL casts its `float[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS]` to `float**`).
unsafe fn cost_table<'a>(table: *mut *mut f32, algos: c_int, protos: c_int) -> Result<Table<'a>> {
    let shape = |n: c_int, what: &str| {
        usize::try_from(n)
            .ok()
            .filter(|n| (1..=16).contains(n))
            .ok_or_else(|| Error::InvalidArgument(format!("{what} {n}; accepted: 1..=16")))
    };
    let (a, p) = (shape(algos, "numAlgo")?, shape(protos, "numProto")?);
    let cells = table.cast::<f32>();
    if cells.is_null() || !cells.is_aligned() {
        return Err(Error::InvalidArgument(format!(
            "collCostTable ({cells:p}) is NULL or misaligned"
        )));
    }
    // SAFETY: non-NULL, aligned, and a × p ≤ 256 floats NCCL owns for the call (caller's contract).
    let cells = unsafe { std::slice::from_raw_parts_mut(cells, a * p) };
    Table::new(cells, a, p)
}

fn coll_info(
    context: Vp,
    coll_type: abi::ncclFunc_t,
    n_bytes: usize,
    table: *mut *mut f32,
    algos: c_int,
    protos: c_int,
    n_channels: *mut c_int,
) -> Result<()> {
    // SAFETY: context came from init and is not freed during the call.
    let ctx = unsafe { shared::<TunerCtx>(context, "getCollInfo context")? };
    // SAFETY: NCCL passes a valid int*.
    let nch = unsafe { out(n_channels, "getCollInfo nChannels")? };
    // SAFETY: NCCL's cost table for this call.
    let mut t = unsafe { cost_table(table, algos, protos)? };
    let o = ctx.session.adjust(coll(coll_type), bytes(n_bytes), &mut t);
    if let Some(c) = o.channels {
        *nch = c_int::try_from(c).unwrap_or(c_int::MAX);
    }
    Ok(())
}

/// v3 `getCollInfo(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, nChannels)`.
unsafe extern "C" fn get_coll_info_v3(
    context: Vp,
    coll_type: abi::ncclFunc_t,
    n_bytes: usize,
    _pipe_ops: c_int,
    table: *mut *mut f32,
    algos: c_int,
    protos: c_int,
    n_channels: *mut c_int,
) -> R {
    guard("tuner getCollInfo", || {
        coll_info(
            context, coll_type, n_bytes, table, algos, protos, n_channels,
        )
    })
}

/// v4–v6 `getCollInfo(…, regBuff, nChannels)`. `regBuff` (NCCL: both user buffers registered, or a
/// graph capture that registers them) changes nothing here: the cables bound Ring and Tree alike.
unsafe extern "C" fn get_coll_info_v4(
    context: Vp,
    coll_type: abi::ncclFunc_t,
    n_bytes: usize,
    _pipe_ops: c_int,
    table: *mut *mut f32,
    algos: c_int,
    protos: c_int,
    _reg_buff: c_int,
    n_channels: *mut c_int,
) -> R {
    guard("tuner getCollInfo", || {
        coll_info(
            context, coll_type, n_bytes, table, algos, protos, n_channels,
        )
    })
}

/// v2–v6 `destroy`/`finalize(context)`.
unsafe extern "C" fn destroy(context: Vp) -> R {
    guard("tuner finalize", || {
        // SAFETY: context came from init and NCCL finalizes it once.
        unsafe { take::<TunerCtx>(context, "tuner finalize context") }.map(drop)
    })
}

// ----- the tables --------------------------------------------------------------------------------------------

const fn name() -> *const c_char {
    NAME.as_ptr()
}

/// The v1 table.
pub const fn tuner_v1() -> abi::ncclTuner_v1_t {
    abi::ncclTuner_v1_t {
        name: name(),
        init: Some(init_v1),
        getCollInfo: Some(get_coll_info_v1),
        destroy: Some(destroy_v1),
    }
}

/// The v2 table over `S`.
pub const fn tuner_v2<S: FabricSource>() -> abi::ncclTuner_v2_t {
    abi::ncclTuner_v2_t {
        name: name(),
        init: Some(init_v2::<S>),
        getCollInfo: Some(get_coll_info_v2),
        destroy: Some(destroy),
    }
}

/// The v3 table over `S`.
pub const fn tuner_v3<S: FabricSource>() -> abi::ncclTuner_v3_t {
    abi::ncclTuner_v3_t {
        name: name(),
        init: Some(init_v2::<S>),
        getCollInfo: Some(get_coll_info_v3),
        destroy: Some(destroy),
    }
}

/// The v4 table over `S`.
pub const fn tuner_v4<S: FabricSource>() -> abi::ncclTuner_v4_t {
    abi::ncclTuner_v4_t {
        name: name(),
        init: Some(init_v2::<S>),
        getCollInfo: Some(get_coll_info_v4),
        destroy: Some(destroy),
    }
}

/// The v5 table over `S`.
pub const fn tuner_v5<S: FabricSource>() -> abi::ncclTuner_v5_t {
    abi::ncclTuner_v5_t {
        name: name(),
        init: Some(init_v5::<S>),
        getCollInfo: Some(get_coll_info_v4),
        finalize: Some(destroy),
    }
}

/// The v6 table over `S`. No `getChunkSize`: NCCL keeps its chunk size.
pub const fn tuner_v6<S: FabricSource>() -> abi::ncclTuner_v6_t {
    abi::ncclTuner_v6_t {
        name: name(),
        init: Some(init_v5::<S>),
        getCollInfo: Some(get_coll_info_v4),
        finalize: Some(destroy),
        getChunkSize: None,
    }
}

macro_rules! sync {
    ($($t:ident),*) => {$(
        // SAFETY: the tables are immutable statics; `name` points to a 'static C string literal and every
        // other field is a function pointer, so sharing them between threads is sound.
        unsafe impl Sync for abi::$t {}
    )*};
}
sync!(
    ncclTuner_v1_t,
    ncclTuner_v2_t,
    ncclTuner_v3_t,
    ncclTuner_v4_t,
    ncclTuner_v5_t,
    ncclTuner_v6_t
);

/// ABI v6 (NCCL 2.30).
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v6: abi::ncclTuner_v6_t = tuner_v6::<NetPlugin>();
/// ABI v5 (NCCL 2.28, 2.29).
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v5: abi::ncclTuner_v5_t = tuner_v5::<NetPlugin>();
/// ABI v4 (NCCL 2.24–2.27).
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v4: abi::ncclTuner_v4_t = tuner_v4::<NetPlugin>();
/// ABI v3 (NCCL 2.22, 2.23).
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v3: abi::ncclTuner_v3_t = tuner_v3::<NetPlugin>();
/// ABI v2 (NCCL 2.21).
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v2: abi::ncclTuner_v2_t = tuner_v2::<NetPlugin>();
/// ABI v1 (NCCL 2.19, 2.20; only through `NCCL_TUNER_PLUGIN`).
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v1: abi::ncclTuner_v1_t = tuner_v1();

#[cfg(test)]
mod tests {
    use std::ptr::{null_mut, without_provenance_mut};

    use super::*;
    use crate::ffi::testsupport::{self, LogLine};
    use crate::tuner::decide::IGNORE;
    use crate::tuner::fabric::tests::cables;
    use crate::tuner::model::{ALGO_PAT, ALGO_RING, ALGO_TREE, PROTO_LL, PROTO_SIMPLE};

    /// 4 × B300, 2 cables per pair (6 cables per host).
    struct B300Mesh4;
    impl FabricSource for B300Mesh4 {
        fn view() -> Option<LocalView> {
            Some(cables(6, 800.0, 2, None))
        }
    }

    /// GB10 ring of 4 (2 cables per host behind shared PCIe roots).
    struct Gb10Ring;
    impl FabricSource for Gb10Ring {
        fn view() -> Option<LocalView> {
            Some(cables(2, 200.0, 2, Some(126_000)))
        }
    }

    /// No switchless net plugin in the process.
    struct Nothing;
    impl FabricSource for Nothing {
        fn view() -> Option<LocalView> {
            None
        }
    }

    fn log() -> abi::ncclDebugLogger_t {
        Some(testsupport::c_logger())
    }

    /// Runs `f` with this thread's events going to the C test logger at INFO (as `NCCL_DEBUG=INFO`).
    fn with_info<T>(f: impl FnOnce() -> T) -> T {
        static SLOT: log::LoggerSlot = log::LoggerSlot::new();
        SLOT.set(Some(testsupport::c_logger()), Some("INFO"));
        tracing::subscriber::with_default(log::Bridge::new(&SLOT), f)
    }

    fn infos(lines: &[LogLine]) -> Vec<&LogLine> {
        lines.iter().filter(|l| l.level == 3).collect()
    }

    /// NCCL's table where it picks Ring/Simple; Tree and PAT valid, the rest ignored.
    fn table() -> [f32; 21] {
        let mut t = [IGNORE; 21];
        for p in 0..3 {
            t[ALGO_RING * 3 + p] = 200.0 + p as f32;
            t[ALGO_TREE * 3 + p] = 300.0 + p as f32;
            t[ALGO_PAT * 3 + p] = 400.0;
        }
        t[ALGO_RING * 3 + PROTO_SIMPLE] = 100.0;
        t
    }

    fn best(t: &mut [f32; 21]) -> (usize, usize) {
        Table::new(t, 7, 3).unwrap().best().unwrap()
    }

    const ALLREDUCE: abi::ncclFunc_t = abi::ncclFunc_t(4);

    /// init, one all-reduce of `bytes`, finalize through the table of `version`; returns the table after
    /// the call, the channel count and the log.
    fn drive<S: FabricSource>(version: u32, bytes: usize) -> ([f32; 21], c_int, Vec<LogLine>) {
        with_info(|| drive_in::<S>(version, bytes))
    }

    fn drive_in<S: FabricSource>(version: u32, bytes: usize) -> ([f32; 21], c_int, Vec<LogLine>) {
        testsupport::take_log();
        let mut t = table();
        let mut nch: c_int = 0;
        let tp = t.as_mut_ptr().cast::<*mut f32>();
        let mut ctx: Vp = null_mut();
        let mut consts = abi::ncclTunerConstants_v5_t::default();
        let c = Constants::nccl_defaults();
        consts.baseLatencies = c.base_latencies;
        consts.hwLatencies = c.hw_latencies;
        consts.llMaxBws = c.ll_max_bws;
        consts.perChMaxTreeBws = c.per_ch_max_tree_bws;
        // SAFETY: the arguments are what NCCL passes: valid out-pointers, a 7 × 3 table, a live context.
        unsafe {
            match version {
                3 => {
                    let v = tuner_v3::<S>();
                    assert_eq!(v.init.unwrap()(32, 4, log(), &mut ctx), R::ncclSuccess);
                    assert_eq!(
                        v.getCollInfo.unwrap()(ctx, ALLREDUCE, bytes, 1, tp, 7, 3, &mut nch),
                        R::ncclSuccess
                    );
                    assert_eq!(v.destroy.unwrap()(ctx), R::ncclSuccess);
                }
                4 => {
                    let v = tuner_v4::<S>();
                    assert_eq!(v.init.unwrap()(32, 4, log(), &mut ctx), R::ncclSuccess);
                    assert_eq!(
                        v.getCollInfo.unwrap()(ctx, ALLREDUCE, bytes, 1, tp, 7, 3, 0, &mut nch),
                        R::ncclSuccess
                    );
                    assert_eq!(v.destroy.unwrap()(ctx), R::ncclSuccess);
                }
                5 => {
                    let v = tuner_v5::<S>();
                    let mut nvl = abi::ncclNvlDomainInfo_v5_t::default();
                    assert_eq!(
                        v.init.unwrap()(&mut ctx, 7, 32, 4, log(), &mut nvl, &mut consts),
                        R::ncclSuccess
                    );
                    assert_eq!(
                        v.getCollInfo.unwrap()(ctx, ALLREDUCE, bytes, 1, tp, 7, 3, 1, &mut nch),
                        R::ncclSuccess
                    );
                    assert_eq!(v.finalize.unwrap()(ctx), R::ncclSuccess);
                }
                6 => {
                    let v = tuner_v6::<S>();
                    assert!(v.getChunkSize.is_none());
                    assert_eq!(
                        v.init.unwrap()(&mut ctx, 7, 32, 4, log(), null_mut(), null_mut()),
                        R::ncclSuccess
                    );
                    assert_eq!(
                        v.getCollInfo.unwrap()(ctx, ALLREDUCE, bytes, 1, tp, 7, 3, 0, &mut nch),
                        R::ncclSuccess
                    );
                    assert_eq!(v.finalize.unwrap()(ctx), R::ncclSuccess);
                }
                _ => unreachable!(),
            }
        }
        (t, nch, testsupport::take_log())
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "proptest-free but prices the model for four versions; slow under Miri"
    )]
    fn every_table_version_takes_tree_on_a_b300_mesh_and_logs_once() {
        for version in 3..=6 {
            let (mut t, nch, lines) = drive::<B300Mesh4>(version, 256 << 20);
            assert_eq!(best(&mut t), (ALGO_TREE, PROTO_SIMPLE), "v{version}");
            assert_eq!(nch, 20, "v{version}");
            let info = infos(&lines);
            assert_eq!(
                info.len(),
                2,
                "v{version}: the plan and the first change: {lines:?}"
            );
            assert!(info[0].text.contains("full mesh assumed"), "{:?}", info[0]);
            assert_eq!(info[0].flags, 0x41, "INIT | TUNING");
            assert!(
                info[1].text.contains("Ring/Simple → Tree/Simple"),
                "{:?}",
                info[1]
            );
        }
    }

    #[test]
    fn every_table_version_keeps_gb10_rings_off_tree_and_pat() {
        for version in 3..=6 {
            let (mut t, _, _) = drive::<Gb10Ring>(version, 4096);
            assert_eq!(best(&mut t).0, ALGO_RING, "v{version}");
            for a in [ALGO_TREE, ALGO_PAT] {
                for p in 0..3 {
                    assert_eq!(t[a * 3 + p], IGNORE, "v{version} {a}/{p}");
                }
            }
        }
    }

    #[test]
    fn no_net_plugin_changes_nothing() {
        for version in 3..=6 {
            let (t, nch, lines) = drive::<Nothing>(version, 256 << 20);
            assert_eq!(t, table(), "v{version}");
            assert_eq!(nch, 0);
            assert!(
                infos(&lines)
                    .iter()
                    .any(|l| l.text.contains("nothing changed")),
                "{lines:?}"
            );
        }
    }

    #[test]
    fn v2_names_tree_with_simple_and_v1_changes_nothing() {
        with_info(v2_and_v1);
    }

    fn v2_and_v1() {
        let v2 = tuner_v2::<B300Mesh4>();
        let v1 = tuner_v1();
        let mut ctx: Vp = null_mut();
        let (mut a, mut p, mut n): (c_int, c_int, c_int) = (-1, -1, 0);
        // SAFETY: NCCL's arguments.
        unsafe {
            assert_eq!(v2.init.unwrap()(32, 4, log(), &mut ctx), R::ncclSuccess);
            assert_eq!(
                v2.getCollInfo.unwrap()(ctx, ALLREDUCE, 1 << 30, 0, 0, 1, &mut a, &mut p, &mut n),
                R::ncclSuccess
            );
            assert_eq!((a, p, n), (ALGO_TREE as c_int, PROTO_SIMPLE as c_int, 20));
            (a, p, n) = (-1, -1, 0);
            assert_eq!(
                v2.getCollInfo.unwrap()(
                    ctx,
                    abi::ncclFunc_t(2),
                    1 << 30,
                    0,
                    0,
                    1,
                    &mut a,
                    &mut p,
                    &mut n
                ),
                R::ncclSuccess
            );
            assert_eq!((a, p, n), (-1, -1, 0), "all-gather is NCCL's");
            assert_eq!(v2.destroy.unwrap()(ctx), R::ncclSuccess);

            testsupport::take_log();
            assert_eq!(v1.init.unwrap()(32, 4, log()), R::ncclSuccess);
            assert_eq!(
                v1.getCollInfo.unwrap()(ALLREDUCE, 1 << 30, 0, 0, 1, &mut a, &mut p, &mut n),
                R::ncclSuccess
            );
            assert_eq!((a, p, n), (-1, -1, 0));
            assert_eq!(v1.destroy.unwrap()(), R::ncclSuccess);
        }
        let lines = testsupport::take_log();
        assert!(
            lines.iter().any(|l| l
                .text
                .contains("v1 interface has no per-communicator context")),
            "{lines:?}"
        );
        // A GB10 ring on v2: Ring, never Tree.
        let v2 = tuner_v2::<Gb10Ring>();
        // SAFETY: NCCL's arguments.
        unsafe {
            assert_eq!(v2.init.unwrap()(4, 4, log(), &mut ctx), R::ncclSuccess);
            assert_eq!(
                v2.getCollInfo.unwrap()(ctx, ALLREDUCE, 4096, 0, 0, 1, &mut a, &mut p, &mut n),
                R::ncclSuccess
            );
            assert_eq!((a, p), (ALGO_RING as c_int, PROTO_LL as c_int));
            assert_eq!(v2.destroy.unwrap()(ctx), R::ncclSuccess);
        }
    }

    #[test]
    fn bad_arguments_are_errors_never_crashes() {
        let v6 = tuner_v6::<B300Mesh4>();
        let mut ctx: Vp = null_mut();
        let mut t = table();
        let tp = t.as_mut_ptr().cast::<*mut f32>();
        let mut nch: c_int = 0;
        let bogus: Vp = without_provenance_mut(0x1000);
        // SAFETY: every pointer is either valid or one the adapters must refuse before using it.
        unsafe {
            let init = v6.init.unwrap();
            let get = v6.getCollInfo.unwrap();
            let fin = v6.finalize.unwrap();
            assert_eq!(
                init(null_mut(), 0, 32, 4, log(), null_mut(), null_mut()),
                R::ncclInvalidArgument
            );
            assert_eq!(
                init(&mut ctx, 0, 32, 4, log(), null_mut(), null_mut()),
                R::ncclSuccess
            );
            assert_eq!(
                get(ctx, ALLREDUCE, 1, 1, null_mut(), 7, 3, 0, &mut nch),
                R::ncclInvalidArgument
            );
            assert_eq!(
                get(ctx, ALLREDUCE, 1, 1, tp, 100, 3, 0, &mut nch),
                R::ncclInvalidArgument
            );
            assert_eq!(
                get(ctx, ALLREDUCE, 1, 1, tp, 7, -3, 0, &mut nch),
                R::ncclInvalidArgument
            );
            assert_eq!(
                get(ctx, ALLREDUCE, 1, 1, tp, 5, 3, 0, &mut nch),
                R::ncclInvalidArgument
            );
            assert_eq!(
                get(ctx, ALLREDUCE, 1, 1, tp, 7, 3, 0, null_mut()),
                R::ncclInvalidArgument
            );
            assert_eq!(
                get(null_mut(), ALLREDUCE, 1, 1, tp, 7, 3, 0, &mut nch),
                R::ncclInvalidArgument
            );
            assert_eq!(
                get(bogus, ALLREDUCE, 1, 1, tp, 7, 3, 0, &mut nch),
                R::ncclInvalidArgument
            );
            // Unknown collective types and absurd sizes are NCCL's to decide.
            assert_eq!(
                get(
                    ctx,
                    abi::ncclFunc_t(99),
                    usize::MAX,
                    -1,
                    tp,
                    7,
                    3,
                    0,
                    &mut nch
                ),
                R::ncclSuccess
            );
            assert_eq!(t, table());
            assert_eq!(fin(ctx), R::ncclSuccess);
            assert_eq!(fin(ctx), R::ncclInvalidArgument, "double finalize");
            assert_eq!(
                get(ctx, ALLREDUCE, 1, 1, tp, 7, 3, 0, &mut nch),
                R::ncclInvalidArgument,
                "after finalize"
            );
            assert_eq!(fin(bogus), R::ncclInvalidArgument);
        }
        let warns = testsupport::take_log()
            .into_iter()
            .filter(|l| l.level == 2)
            .count();
        assert!(warns >= 10, "each refusal is one WARN line");
    }

    /// NCCL's own tuner layout: `tests/fixtures/nccl-abi/nccl-tuner.tsv` holds the size of every tuner
    /// table and constants struct and the offset and size of every field, as the C compiler computed
    /// them from NCCL's headers (`layout.py --tuner-src`; v2..v6 from v2.30.7-1, v1 from v2.20.5-1; every
    /// release 2.19–2.30 checked against it when the table was made). Ours must match every row.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "pure layout constants; its table scan is slow under Miri"
    )]
    fn the_tuner_layout_is_nccls_own() {
        const TABLE: &str = include_str!("../../tests/fixtures/nccl-abi/nccl-tuner.tsv");
        let rust = testsupport::rust_layout();
        let mut types = std::collections::BTreeSet::new();
        for line in TABLE.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), 5, "table row {line:?}");
            let (ty, field, at) = (f[0], if f[1] == "*" { "" } else { f[1] }, f[4]);
            let (offset, size): (usize, usize) = (f[2].parse().unwrap(), f[3].parse().unwrap());
            let ours = rust
                .iter()
                .find(|r| r.ty == ty && r.field == field)
                .unwrap_or_else(|| panic!("{ty}.{field} (NCCL {at}) is missing from our header"));
            assert_eq!(
                (ours.offset, ours.size),
                (offset, size),
                "{ty}.{field} vs NCCL's ({at})"
            );
            types.insert(ty);
        }
        for r in rust.iter().filter(|r| types.contains(r.ty)) {
            let key = format!(
                "{}\t{}\t",
                r.ty,
                if r.field.is_empty() { "*" } else { r.field }
            );
            assert!(
                TABLE.lines().any(|l| l.starts_with(&key)),
                "{}.{}: not in NCCL's header",
                r.ty,
                r.field
            );
        }
        for v in 1..=6 {
            assert!(types.contains(format!("ncclTuner_v{v}_t").as_str()), "v{v}");
        }
        assert!(
            types.contains("ncclTunerConstants_v5_t") && types.contains("ncclNvlDomainInfo_v5_t")
        );
    }
}
