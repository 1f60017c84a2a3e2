//! [`MemFactory`]: a [`PathFactory`] over the in-process `transport::memfab`, so the real backend
//! ([`crate::plugin::Switchless`]) runs end to end in one process without RDMA hardware: real listen handles,
//! real routing, the real TCP handshake on 127.0.0.1, the real protocol; only the NIC is simulated.
//!
//! The connecting side creates both endpoints of a memfab pair, keeps its own and parks the other under
//! a token it sends as its "QP number"; the accepting side takes the parked endpoint named by the
//! connector's parameters. So both ends must live in one process (tests, benchmarks).
//!
//! The two sides are two simulated hosts: the connecting side's endpoints of one set of RDMA
//! devices (the paths' `rdma_dev` names) share one memfab device, the accepting side's another, so
//! the same buffer registered on many connections of one side is pinned once (the registration
//! cache, as over verbs).
//!
//! [`MemFactory::install`] sets the host view and fabric the next [`PathFactory::open`] uses, so tests
//! can also go through `plugin::init` and the core functions the FFI layer calls.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::host::NcclDevice;
use crate::plugin::switchless::{
    ConnOptions, Connectable, HostView, PathFactory, PathPlan, PinnedReader, Switchless,
};
use crate::sync::lock;
use crate::transport::fabric::{Fabric, forward_fabric};
use crate::transport::handshake::PathParams;
use crate::transport::memfab::{MemEndpoint, MemFab};

/// Builds memfab endpoints for the backend. See the module docs.
#[derive(Clone)]
pub struct MemFactory {
    fab: MemFab,
    loopbacks: usize,
    parked: Arc<Mutex<HashMap<u32, MemEndpoint>>>,
    next: Arc<AtomicU32>,
    /// Connections created (both sides), for tests.
    created: Arc<AtomicU32>,
    /// The options of each endpoint created, with whether it was the accepting side (tests).
    options: Arc<Mutex<Vec<(bool, ConnOptions)>>>,
    /// Each memfab device made so far and the RDMA device names of the paths it serves (for
    /// [`PathFactory::pinned_reader`]).
    devs: Arc<Mutex<Vec<MemDev>>>,
}

impl std::fmt::Debug for MemFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemFactory")
            .field("loopbacks", &self.loopbacks)
            .finish()
    }
}

/// A memfab device id and the RDMA device names of the paths it serves.
type MemDev = (u64, Vec<String>);

static INSTALLED: Mutex<Option<(MemFactory, HostView)>> = Mutex::new(None);

/// Endpoint options [`MemFactory::options_seen`] keeps.
const OPTIONS_KEPT: usize = 16;

impl MemFactory {
    /// A factory over `fab`; every endpoint gets `loopbacks` loopback paths.
    pub fn new(fab: MemFab, loopbacks: usize) -> MemFactory {
        MemFactory {
            fab,
            loopbacks,
            parked: Arc::new(Mutex::new(HashMap::new())),
            next: Arc::new(AtomicU32::new(1)),
            created: Arc::new(AtomicU32::new(0)),
            options: Arc::new(Mutex::new(Vec::new())),
            devs: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The options the newest endpoints (up to 16) were created with, oldest first: `(accepting
    /// side, options)`.
    pub fn options_seen(&self) -> Vec<(bool, ConnOptions)> {
        lock(&self.options, "memfab options").map_or_else(|_| Vec::new(), |v| v.clone())
    }

    /// The simulated fabric (allocate and inspect buffer memory through it).
    pub fn fab(&self) -> &MemFab {
        &self.fab
    }

    /// Endpoints created so far (connecting and accepting sides).
    pub fn created(&self) -> u32 {
        self.created.load(Ordering::Relaxed)
    }

    /// Endpoints waiting for their acceptor.
    pub fn parked(&self) -> usize {
        lock(&self.parked, "memfab park").map_or(0, |m| m.len())
    }

    /// Sets what the next [`PathFactory::open`] returns (a clone of `self` and `view`).
    pub fn install(&self, view: HostView) {
        if let Ok(mut g) = lock(&INSTALLED, "memfab factory") {
            *g = Some((self.clone(), view));
        }
    }
}

/// One memfab endpoint plus the token that names it in the handshake.
pub struct MemConn {
    ep: MemEndpoint,
    token: u32,
    /// Each data path's local address: its RoCE v2 GID is the IPv4-mapped address, as on a NIC.
    addrs: Vec<std::net::Ipv4Addr>,
}

impl PathFactory for MemFactory {
    type Fabric = MemConn;

    fn slot() -> &'static crate::plugin::Slot<Switchless<Self>> {
        static SLOT: crate::plugin::Slot<Switchless<MemFactory>> = crate::plugin::Slot::new();
        &SLOT
    }

    fn open() -> Result<(Self, HostView)> {
        lock(&INSTALLED, "memfab factory")?.clone().ok_or_else(|| {
            Error::System(
                "the in-memory fabric is not installed (MemFactory::install before init)".into(),
            )
        })
    }

    fn create(
        &self,
        paths: &[PathPlan],
        peer: Option<&[PathParams]>,
        opts: &ConnOptions,
    ) -> Result<MemConn> {
        self.created.fetch_add(1, Ordering::Relaxed);
        {
            // The newest few only: a factory creates thousands in the leak tests.
            let mut o = lock(&self.options, "memfab options")?;
            if o.len() >= OPTIONS_KEPT {
                o.remove(0);
            }
            o.push((peer.is_some(), *opts));
        }
        let addrs = paths.iter().map(|p| p.local.addr.addr()).collect();
        let mut names: Vec<&str> = paths
            .iter()
            .filter_map(|p| p.local.rdma_dev.as_deref())
            .collect();
        names.sort_unstable();
        names.dedup();
        let dev = |side: &str| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (side, &names).hash(&mut h);
            Some(h.finish())
        };
        match peer {
            None => {
                let speeds: Vec<u64> = paths
                    .iter()
                    .map(|p| u64::from(p.local.speed_mbps))
                    .collect();
                let (da, db) = (dev("connecting"), dev("accepting"));
                let (mine, theirs) = self.fab.pair_on(&speeds, self.loopbacks, da, db);
                {
                    let mut known = lock(&self.devs, "memfab devices")?;
                    for d in [da, db].into_iter().flatten() {
                        if !known.iter().any(|(k, _)| *k == d) {
                            known.push((d, names.iter().map(|n| n.to_string()).collect()));
                        }
                    }
                }
                let token = self.next.fetch_add(1, Ordering::Relaxed);
                lock(&self.parked, "memfab park")?.insert(token, theirs);
                Ok(MemConn {
                    ep: mine,
                    token,
                    addrs,
                })
            }
            Some(peer) => {
                let token = peer
                    .first()
                    .and_then(|p| p.qpns.first())
                    .copied()
                    .ok_or_else(|| Error::Remote("the peer sent no memfab token".into()))?;
                let ep = lock(&self.parked, "memfab park")?
                    .remove(&token)
                    .ok_or_else(|| {
                        Error::Remote(format!(
                            "memfab endpoint {token} is not parked in this process"
                        ))
                    })?;
                let data = ep.paths().len() - self.loopbacks;
                if data != paths.len() {
                    return Err(Error::Remote(format!(
                        "memfab endpoint {token} has {data} data paths; the hello asked for {}",
                        paths.len()
                    )));
                }
                Ok(MemConn { ep, token, addrs })
            }
        }
    }

    /// Both simulated hosts live in this process: a device's figure sums the memfab devices (of
    /// either side) whose paths use one of its members' RDMA devices.
    fn pinned_reader(&self, devices: &[NcclDevice]) -> PinnedReader {
        let members: Vec<Vec<String>> = devices
            .iter()
            .map(|d| d.members.iter().map(|m| m.rdma_dev.clone()).collect())
            .collect();
        let (fab, devs) = (self.fab.clone(), Arc::clone(&self.devs));
        Arc::new(move |i| {
            let Some(mine) = members.get(i) else {
                return 0;
            };
            let ids: Vec<u64> = lock(&devs, "memfab devices").map_or_else(
                |_| Vec::new(),
                |known| {
                    known
                        .iter()
                        .filter(|(_, names)| names.iter().any(|n| mine.contains(n)))
                        .map(|(id, _)| *id)
                        .collect()
                },
            );
            ids.into_iter()
                .fold(0u64, |n, id| n.saturating_add(fab.pinned_bytes_on(id)))
        })
    }
}

impl Connectable for MemConn {
    fn local_params(&self) -> Vec<PathParams> {
        let n = self
            .ep
            .paths()
            .iter()
            .filter(|p| p.role == crate::transport::fabric::PathRole::Data)
            .count();
        (0..n)
            .map(|i| PathParams {
                qpns: vec![self.token, i as u32],
                psn: 0,
                gid: self
                    .addrs
                    .get(i)
                    .map_or([0; 16], |a| a.to_ipv6_mapped().octets()),
                gid_index: 0,
                mtu: 4096,
                rkey: 0,
                addr: 0,
            })
            .collect()
    }

    fn connect_peer(&self, peer: &[PathParams], _opts: &ConnOptions) -> Result<()> {
        let ok = peer
            .iter()
            .all(|p| p.qpns.first().copied() == Some(self.token));
        if ok {
            Ok(())
        } else {
            Err(Error::Remote(format!(
                "peer parameters do not name memfab endpoint pair {}",
                self.token
            )))
        }
    }

    fn path_mtu(&self, _i: usize, peer: &PathParams) -> u32 {
        peer.mtu.min(4096)
    }
}

impl Fabric for MemConn {
    forward_fabric!(ep: paths, register, register_dmabuf, deregister, pinner, defer_paths,
        activate_path, keys_on, alloc_ctrl, free_ctrl, ctrl_load, ctrl_store, ctrl_read, ctrl_write,
        post_write, post_writes, post_read, prepare_flush, path_device, post_recv, poll, shutdown,
        health, path_note, path_health, stop_path, seal_path, revive_path);
}
