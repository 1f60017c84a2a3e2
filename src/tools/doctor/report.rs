//! The doctor's report: the port table, the NCCL devices the plugin would expose and the findings,
//! as one serializable document (`--json`, schema `switchless-doctor/1`).

use serde::Serialize;

use super::checks::Planned;
use super::checks::checks;
use super::env::{HcaSelection, NcclView};
use super::registry::check;
use crate::config::Config;
use crate::findings::{Finding, Severity, exit_status};
use crate::host::model::{HostModel, PcieLink};
use crate::host::nccl::NcclDevice;

/// One row of the port table.
#[derive(Debug, Clone, Serialize)]
pub struct PortRow {
    pub device: String,
    pub port: u8,
    pub netdev: Option<String>,
    /// "ACTIVE", "DOWN", … (port state) and the netdev's operstate.
    pub state: String,
    pub operstate: Option<String>,
    pub addresses: Vec<AddrRow>,
    pub mtu: Option<u32>,
    pub active_mtu: u32,
    /// Where `active_mtu` comes from: `derived` from the netdev MTU (kernel files), or `verbs`.
    pub active_mtu_source: String,
    /// `Ethernet` (RoCE) or `InfiniBand` (left to NCCL's own IB transport).
    pub link_layer: String,
    pub rate_mbps: Option<u32>,
    pub pci: Option<String>,
    pub pci_root: Option<String>,
    pub numa_node: Option<i32>,
    pub pcie: Option<PcieLink>,
    /// Name of the NCCL device this port belongs to.
    pub nccl_device: Option<String>,
    pub phys_port_id: Option<u16>,
}

/// An address of a port with its GID.
#[derive(Debug, Clone, Serialize)]
pub struct AddrRow {
    /// "a.b.c.d/len".
    pub addr: String,
    pub gid_index: Option<u32>,
    pub gid_type: Option<String>,
}

/// The one-line answer at the top of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// `healthy` (info findings only), `warnings` or `errors`.
    pub status: &'static str,
    pub errors: usize,
    pub warnings: usize,
    /// The first finding to fix: the worst one, `[check] object: remedy`.
    pub first_to_fix: Option<String>,
}

impl Verdict {
    fn of(findings: &[Finding]) -> Verdict {
        let count = |s| findings.iter().filter(|f| f.severity == s).count();
        let (errors, warnings) = (count(Severity::Error), count(Severity::Warning));
        Verdict {
            status: match (errors, warnings) {
                (0, 0) => "healthy",
                (0, _) => "warnings",
                _ => "errors",
            },
            errors,
            warnings,
            first_to_fix: findings
                .iter()
                .find(|f| f.severity > Severity::Info)
                .map(|f| format!("[{}] {}: {}", f.check, f.object, f.remedy)),
        }
    }

    /// `healthy`, `2 warnings` or `1 error, 3 warnings`, then what to fix first.
    pub fn line(&self) -> String {
        let n = |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
        let head = match (self.errors, self.warnings) {
            (0, 0) => return "verdict: healthy (no errors, no warnings)".to_string(),
            (0, w) => format!("verdict: usable, {}", n(w, "warning")),
            (e, 0) => format!("verdict: NOT READY, {}", n(e, "error")),
            (e, w) => format!("verdict: NOT READY, {}, {}", n(e, "error"), n(w, "warning")),
        };
        match &self.first_to_fix {
            Some(f) => format!("{head}; first to fix: {f}"),
            None => head,
        }
    }
}

/// What the report knows beyond the host model.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// What `NCCL_IB_HCA` selects (unset: `None`).
    pub ib_hca: Option<HcaSelection>,
    /// The planned address of each netdev (`--plan`), to fill remedies in.
    pub planned: Planned,
    /// This host's name (`/proc/sys/kernel/hostname` under the root), to tell reports apart.
    pub host: Option<String>,
    /// Which server of the plan this host was checked as (`--plan`), e.g. `server 2 (b300-002)`.
    pub server: Option<String>,
    /// Facts beyond the model (ARP settings, …) for the trap checks; empty: those checks are silent.
    pub facts: super::facts::Facts,
    /// The live host's RDMA drivers were asked about DMA-BUF (`gpu-direct-off` judges GPU-direct).
    pub dmabuf_probed: bool,
    /// How to persist the plan's sysctl settings on this host (`--plan`: the exact `switchless plan`
    /// command), for remedies; `None`: a generic one.
    pub persist_sysctl: Option<String>,
}

/// The whole report (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Schema version of this document: "switchless-doctor/1".
    pub schema: &'static str,
    /// The switchless version that wrote it.
    pub version: &'static str,
    /// The host's name; null when the tree does not hold it.
    pub host: Option<String>,
    /// The plan's server this host was checked as (`--plan`); null without a plan.
    pub plan_server: Option<String>,
    pub root: String,
    /// The verdict: healthy, warnings or errors, and the first thing to fix.
    pub verdict: Verdict,
    pub ports: Vec<PortRow>,
    /// Which transport the plugin would use here, and why.
    pub transport: NcclView,
    /// What `NCCL_IB_HCA` selects; null when it is unset.
    pub ib_hca: Option<HcaSelection>,
    /// The devices of `transport` (TCP devices have no members).
    pub nccl_devices: Vec<NcclDevice>,
    /// Point-to-point TCP links (netdevs without RDMA) with their tuning.
    pub tcp_links: Vec<crate::host::model::TcpLink>,
    /// Socket buffer limits; null when the host has no TCP link.
    pub tcp_buffers: Option<crate::host::model::BufferLimits>,
    pub findings: Vec<Finding>,
    pub exit_status: u8,
}

pub const SCHEMA: &str = "switchless-doctor/1";

/// Builds the report with the default environment: `devices` are the RoCE devices; without any,
/// the TCP devices the plugin would fall back to (see [`NcclView::decide`]).
pub fn report(m: &HostModel, devices: &[NcclDevice], findings: Vec<Finding>) -> Report {
    let view = NcclView::decide(m, Some(&Config::default()), devices.to_vec());
    build(m, view, Extras::default(), findings)
}

/// Builds the report: port rows, the devices of `view`, and the findings (discovery's and the
/// environment's first, then every check over the model).
pub fn build(m: &HostModel, view: NcclView, extras: Extras, mut findings: Vec<Finding>) -> Report {
    findings.extend(checks(m, &view, &extras.planned));
    let persist = extras.persist_sysctl.clone().unwrap_or_else(|| {
        let names: Vec<&str> = m.netdevs.iter().map(|n| n.name.as_str()).collect();
        let model_arg = crate::tools::plan::PortMap::builtin_like(&names)
            .map_or(String::new(), |p| format!(" --model {}", p.name));
        format!(
            "switchless plan CABLES{model_arg} --format sysctl --server N > /etc/sysctl.d/90-switchless.conf"
        )
    });
    findings.extend(super::traps::checks(
        m,
        &extras.facts,
        &persist,
        extras.dmabuf_probed,
    ));
    let mut findings = merge_duplicates(one_per_fault(findings));
    let devices = &view.devices;
    // Worst first; stable within a severity.
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let cages = m.cages();
    let mut ports = Vec::new();
    for (d, p) in m.ports() {
        let nd = p.netdev.as_deref().and_then(|n| m.netdev(n));
        let pf = d.pci.as_deref().and_then(|b| m.pci(b));
        let mut addresses = Vec::new();
        for (g, a) in p.ipv4_v2_gids() {
            let net = nd
                .and_then(|n| n.addrs.iter().find(|x| x.addr.addr() == a))
                .map(|x| x.addr.to_string())
                .unwrap_or_else(|| format!("{a}/32"));
            addresses.push(AddrRow {
                addr: net,
                gid_index: Some(g.index),
                gid_type: Some(g.gid_type.as_str().to_string()),
            });
        }
        ports.push(PortRow {
            device: d.name.clone(),
            port: p.port,
            netdev: p.netdev.clone(),
            state: p.state_name.clone(),
            operstate: nd.map(|n| n.operstate.clone()),
            addresses,
            mtu: nd.and_then(|n| n.mtu),
            active_mtu: p.active_mtu,
            active_mtu_source: p.active_mtu_source.clone(),
            link_layer: p.link_layer.clone(),
            rate_mbps: p.rate_mbps,
            pci: d.pci.clone(),
            pci_root: pf.map(|f| f.root.clone()),
            numa_node: pf.and_then(|f| f.numa_node),
            pcie: pf.map(|f| f.link),
            nccl_device: devices
                .iter()
                .find(|x| {
                    x.members
                        .iter()
                        .any(|mm| mm.rdma_dev == d.name && mm.port == p.port)
                })
                .map(|x| x.name.clone()),
            phys_port_id: cages
                .iter()
                .position(|c| *c == p.cage)
                .and_then(|i| u16::try_from(i).ok()),
        });
    }
    let exit_status = exit_status(&findings);
    Report {
        schema: SCHEMA,
        version: crate::VERSION,
        host: extras.host,
        plan_server: extras.server,
        verdict: Verdict::of(&findings),
        root: m.root.clone(),
        ports,
        nccl_devices: devices.to_vec(),
        ib_hca: extras.ib_hca,
        transport: view,
        tcp_links: m.tcp_links.clone(),
        tcp_buffers: m.tcp_buffers,
        findings,
        exit_status,
    }
}

/// A netdev whose MTU differs from the plan is one fault: `plan-mtu-mismatch` (which says what the
/// MTU costs, RoCE or TCP) stands for it, and the generic MTU findings of that netdev go. So does an
/// overlapping prefix (`same-subnet` on a netdev) that a plan finding about its address explains,
/// and an empty neighbour table (`no-neighbour`) where `--probe` found the far end silent.
fn one_per_fault(findings: Vec<Finding>) -> Vec<Finding> {
    let planned_mtu: Vec<String> = findings
        .iter()
        .filter(|f| f.check == "plan-mtu-mismatch")
        .map(|f| f.object.clone())
        .collect();
    let gen1: Vec<String> = findings
        .iter()
        .filter(|f| f.check == check::PCIE_GEN1_X1)
        .map(|f| f.object.clone())
        .collect();
    let probed: Vec<String> = findings
        .iter()
        .filter(|f| f.check == check::PROBE_NO_ANSWER)
        .map(|f| f.object.clone())
        .collect();
    let planned_addr: Vec<String> = findings
        .iter()
        .filter(|f| f.check.starts_with("plan-address") || f.check == "plan-prefix-mismatch")
        .map(|f| f.object.clone())
        .collect();
    findings
        .into_iter()
        .filter(|f| {
            !((f.check == check::MTU_BELOW_4200 || f.check == check::TCP_MTU_BELOW_9000)
                && planned_mtu.contains(&f.object))
                && !(f.check == check::SAME_SUBNET && planned_addr.contains(&f.object))
                && !(f.check == check::NO_NEIGHBOUR && probed.contains(&f.object))
                && !(f.check == check::PCIE_LINK_DEGRADED && gen1.contains(&f.object))
        })
        .collect()
}

/// One finding per (check, object): a second one about the same thing adds its message to the
/// first (a netdev with two addresses in the same trouble), and an exact repeat goes.
fn merge_duplicates(findings: Vec<Finding>) -> Vec<Finding> {
    let mut out: Vec<Finding> = Vec::with_capacity(findings.len());
    for f in findings {
        match out
            .iter_mut()
            .find(|o| o.check == f.check && o.object == f.object)
        {
            Some(o) => {
                if !o.message.contains(&f.message) {
                    o.message = format!("{}; also: {}", o.message, f.message);
                }
                if !o.remedy.contains(&f.remedy) {
                    o.remedy = format!("{}; {}", o.remedy, f.remedy);
                }
                o.severity = o.severity.max(f.severity);
            }
            None => out.push(f),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planned_mtu_fault_is_one_finding_per_netdev() {
        let f = |c: &str, o: &str| Finding::new(Severity::Warning, c, o, "m", "r");
        let kept = one_per_fault(vec![
            f("plan-mtu-mismatch", "netdev a"),
            f(check::MTU_BELOW_4200, "netdev a"),
            f(check::TCP_MTU_BELOW_9000, "netdev a"),
            f(check::MTU_BELOW_4200, "netdev b"),
        ]);
        let ids: Vec<(&str, &str)> = kept
            .iter()
            .map(|f| (f.check.as_str(), f.object.as_str()))
            .collect();
        assert_eq!(
            ids,
            [
                ("plan-mtu-mismatch", "netdev a"),
                (check::MTU_BELOW_4200, "netdev b")
            ]
        );
    }
}
