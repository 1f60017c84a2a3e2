//! [`VerbsFactory`]: the [`PathFactory`] of RoCE paths over ibverbs RC queue pairs (one CQ and QP per
//! path, connected RTR → RTS with the peer's parameters from the handshake), in one protection
//! domain per RDMA device shared by every connection, whose registration cache makes the same
//! buffer registered on many connections one MR (`regIsGlobal`).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::host::NcclDevice;
use crate::plugin::switchless::{
    ConnOptions, Connectable, HostView, PathFactory, PathPlan, PinnedReader, Switchless,
};
use crate::route::types::LinkKind;
use crate::transport::handshake::PathParams;
use crate::verbs::fabric::{QpTuning, RemoteEnd, VerbsFabric, VerbsPath};

/// The production factory: RoCE paths over ibverbs RC QPs.
#[derive(Debug)]
pub struct VerbsFactory {
    /// Opened devices by name, each with its protection domain and registration cache (made once
    /// at `init`, shared by every connection).
    domains: BTreeMap<String, Arc<crate::verbs::Domain>>,
    gid_index: Option<u8>,
}

impl PathFactory for VerbsFactory {
    type Fabric = VerbsFabric;

    fn slot() -> &'static crate::plugin::Slot<Switchless<Self>> {
        static SLOT: crate::plugin::Slot<Switchless<VerbsFactory>> = crate::plugin::Slot::new();
        &SLOT
    }

    fn open() -> Result<(Self, HostView)> {
        let config = Config::from_env()?;
        // Before any other verb: registered pages then stay safe across a fork() of the process
        // (kernels before 5.13 lack copy-on-fork for pinned memory). A missing library is reported
        // once, by the probe below.
        if let Err(e) = crate::verbs::fork_init() {
            tracing::debug!("NET/switchless: {e}");
        }
        let probe = crate::verbs::devices::probe();
        if probe.devices.is_empty() {
            return Err(Error::System(format!(
                "no RDMA device: {}; NCCL will use its internal transports",
                probe.why_none()
            )));
        }
        let mut contexts = BTreeMap::new();
        // Each device's GID tables in one library call, so that discovery does not read three
        // sysfs files per GID slot (2 × 1024 slots on an rxe pair: 2.9-4.1 s of init under TCG).
        let mut gid_tables = crate::host::reader::GidTables::new();
        for d in &probe.devices {
            let ctx = match crate::verbs::Context::open(&d.name) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("NET/switchless: cannot open RDMA device {}: {e}", d.name);
                    continue;
                }
            };
            match ctx.query_gid_table() {
                // Every port gets its list, an empty one too: it reads as "no GIDs", not from sysfs.
                Some(Ok(by_port)) => {
                    for (port, entries) in by_port {
                        let t = entries
                            .into_iter()
                            .map(|e| {
                                crate::host::model::GidEntry::from_library(
                                    e.index, e.gid, e.gid_type, e.ndev,
                                )
                            })
                            .collect();
                        gid_tables.insert((d.name.clone(), port), t);
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!("NET/switchless: {e}; reading {}'s GIDs from sysfs", d.name)
                }
                None => {}
            }
            contexts.insert(d.name.clone(), ctx);
        }
        let reader = crate::host::Reader::new(Path::new("/")).with_gid_tables(gid_tables);
        let (mut model, findings) = crate::host::discover_with(&reader);
        crate::host::log_findings(&findings);
        for (name, ctx) in &contexts {
            let ports: Vec<u8> = model
                .rdma_devices
                .iter()
                .filter(|m| &m.name == name)
                .flat_map(|m| m.ports.iter().map(|p| p.port))
                .collect();
            for port in ports {
                match ctx.query_port(port) {
                    Ok(info) => {
                        if let Some(mtu) = info.active_mtu {
                            model.set_active_mtu(name, port, mtu.bytes());
                        }
                    }
                    Err(e) => tracing::warn!("NET/switchless: {e}"),
                }
            }
        }
        // DMA-BUF: the library symbol is not enough (rxe and older kernels refuse every DMA-BUF):
        // ask each device's driver, once, as NCCL's IB transport does.
        let mut dmabuf_ok = BTreeMap::new();
        for (name, ctx) in &contexts {
            let ok = match crate::verbs::probe_dmabuf_context(ctx) {
                Ok(support) => {
                    tracing::info!("NET/switchless: {name}: DMA-BUF {}", support.describe());
                    support.is_supported()
                }
                Err(e) => {
                    tracing::warn!("NET/switchless: {name}: DMA-BUF left off, no probe: {e}");
                    false
                }
            };
            dmabuf_ok.insert(name.clone(), ok);
        }
        let dmabuf = |dev: &str| dmabuf_ok.get(dev).copied().unwrap_or(false);
        let filter =
            |dev: &str, port: u8| config.ib_hca.matches(dev, port) && contexts.contains_key(dev);
        let devices = model.nccl_devices(&filter, &dmabuf);
        if devices.is_empty() {
            let names: Vec<String> = probe.devices.iter().map(|d| d.name.clone()).collect();
            return Err(Error::System(format!(
                "no usable RoCE port among RDMA devices [{}]: a port must pass NCCL_IB_HCA, be ACTIVE, \
                 use Ethernet and hold an IPv4 RoCE v2 GID (run `switchless doctor`); NCCL will use its \
                 internal transports",
                names.join(", ")
            )));
        }
        let mut domains = BTreeMap::new();
        for (name, ctx) in &contexts {
            match crate::verbs::Domain::new(ctx, config.ib_pci_relaxed_ordering) {
                Ok(d) => {
                    domains.insert(name.clone(), d);
                }
                Err(e) => tracing::warn!("NET/switchless: {name}: no protection domain: {e}"),
            }
        }
        let links = model.local_links(&devices);
        let routes = model.routes();
        let gid_index = config.ib_gid_index;
        Ok((
            VerbsFactory { domains, gid_index },
            HostView {
                config,
                devices,
                links,
                routes,
            },
        ))
    }

    fn create(
        &self,
        paths: &[PathPlan],
        _peer: Option<&[PathParams]>,
        opts: &ConnOptions,
    ) -> Result<VerbsFabric> {
        let mut vp = Vec::with_capacity(paths.len());
        for p in paths {
            if p.kind != LinkKind::Roce {
                return Err(Error::InvalidUsage(format!(
                    "path {} -> {} is a TCP path; the verbs factory carries RoCE paths only \
                     (NetFactory carries TCP)",
                    p.local.addr, p.remote
                )));
            }
            let l = &p.local;
            let dev = l.rdma_dev.as_deref().ok_or_else(|| {
                Error::Internal(format!("RoCE link {} has no RDMA device", l.netdev))
            })?;
            let domain = self.domains.get(dev).ok_or_else(|| {
                Error::System(format!(
                    "RDMA device {dev} of {} was not opened at init",
                    l.netdev
                ))
            })?;
            let gid_index = match self.gid_index {
                Some(g) => u32::from(g),
                None => l.gid_index.ok_or_else(|| {
                    Error::System(format!(
                        "{} ({}) has no IPv4 RoCE v2 GID for {}",
                        l.netdev, dev, l.addr
                    ))
                })?,
            };
            vp.push(VerbsPath {
                domain: Arc::clone(domain),
                port: l.port,
                gid_index,
                active_mtu: l.active_mtu,
                speed_mbps: u64::from(l.speed_mbps),
                label: format!(
                    "{} {} {}:{} gid {}",
                    l.netdev, l.addr, dev, l.port, gid_index
                ),
            });
        }
        VerbsFabric::new(&vp, opts.loopback)
    }

    /// Each device's figure is the sum over the protection domains of its members' RDMA devices
    /// (each once). A domain shared by two NCCL devices (two ports of one RDMA device) is counted
    /// under each.
    fn pinned_reader(&self, devices: &[NcclDevice]) -> PinnedReader {
        let per_dev: Vec<Vec<Arc<crate::verbs::Domain>>> = devices
            .iter()
            .map(|d| {
                let mut doms: Vec<Arc<crate::verbs::Domain>> = Vec::new();
                for m in &d.members {
                    if let Some(dom) = self.domains.get(&m.rdma_dev) {
                        if !doms.iter().any(|x| Arc::ptr_eq(x, dom)) {
                            doms.push(Arc::clone(dom));
                        }
                    }
                }
                doms
            })
            .collect();
        Arc::new(move |i| {
            per_dev.get(i).map_or(0, |doms| {
                doms.iter()
                    .fold(0u64, |n, d| n.saturating_add(d.pinned_bytes()))
            })
        })
    }
}

impl Connectable for VerbsFabric {
    fn local_params(&self) -> Vec<PathParams> {
        self.local_ends()
            .iter()
            .enumerate()
            .map(|(i, e)| {
                // The reconnect mailbox of failback, reached over this path.
                let (addr, rkey) = self.mailbox(i);
                PathParams {
                    qpns: vec![e.qpn],
                    psn: e.psn,
                    gid: e.gid,
                    gid_index: e.gid_index,
                    mtu: e.mtu,
                    rkey,
                    addr,
                }
            })
            .collect()
    }

    fn connect_peer(&self, peer: &[PathParams], opts: &ConnOptions) -> Result<()> {
        let ends = peer
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let qpn = *p.qpns.first().ok_or_else(|| {
                    Error::Remote(format!("the peer sent no QP number for path {i}"))
                })?;
                Ok(RemoteEnd {
                    qpn,
                    psn: p.psn,
                    gid: p.gid,
                    mtu: p.mtu,
                    mailbox: p.addr,
                    mailbox_rkey: p.rkey,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let qp = opts.qp;
        let tuning = QpTuning {
            traffic_class: qp.traffic_class,
            sl: qp.sl,
            timeout: qp.timeout,
            retry_cnt: qp.retry_cnt,
        };
        self.connect(&ends, &tuning, &opts.secret)
    }

    fn path_mtu(&self, i: usize, peer: &PathParams) -> u32 {
        self.path_mtu_bytes(i, peer.mtu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::switchless::QpAttrs;

    /// `QpAttrs::from_config` (the seam) and `QpTuning::from_config` (verbs) state one precedence
    /// rule twice until verbs stops reading the configuration; they must agree.
    #[test]
    fn qp_attrs_follow_the_verbs_precedence() {
        for (tc, sl) in [
            (None, None),
            (Some(41), None),
            (None, Some(5)),
            (Some(106), Some(2)),
        ] {
            for comm in [None, Some(3), Some(15), Some(16), Some(106)] {
                let cfg = Config {
                    ib_tc: tc,
                    ib_sl: sl,
                    ib_timeout: 14,
                    ib_retry_cnt: 3,
                    ..Config::default()
                };
                let a = QpAttrs::from_config(&cfg, comm);
                let t = QpTuning::from_config(&cfg, comm);
                assert_eq!(
                    (a.traffic_class, a.sl, a.timeout, a.retry_cnt),
                    (t.traffic_class, t.sl, t.timeout, t.retry_cnt),
                    "NCCL_IB_TC {tc:?}, NCCL_IB_SL {sl:?}, communicator class {comm:?}"
                );
            }
        }
        let (a, t) = (QpAttrs::default(), QpTuning::default());
        assert_eq!(
            (a.traffic_class, a.sl, a.timeout, a.retry_cnt),
            (t.traffic_class, t.sl, t.timeout, t.retry_cnt)
        );
    }
}
