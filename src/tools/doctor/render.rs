//! The doctor's report as text: the port table, the NCCL devices and the findings.

use std::fmt::Write as _;

use super::report::Report;
use crate::findings::Severity;
use crate::host::model::PcieLink;
use crate::host::nccl::ptr_support_names;

fn fmt_short(speed: Option<f32>, width: Option<u32>) -> String {
    let g = speed
        .map(|s| format!("Gen{}", PcieLink::gen_of(s)))
        .unwrap_or_else(|| "Gen?".into());
    let w = width
        .map(|w| format!("x{w}"))
        .unwrap_or_else(|| "x?".into());
    format!("{g} {w}")
}

/// The CPU architecture of this build and how it reads memory the NIC wrote (AArch64: a barrier
/// instruction; the verbs data path is the same code on every architecture otherwise).
pub fn cpu_line() -> String {
    format!(
        "cpu {} (this build); NIC writes are read with: {}",
        std::env::consts::ARCH,
        crate::verbs::fabric::FROM_DEVICE_BARRIER
    )
}

/// The human-readable report.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", r.verdict.line());
    let _ = writeln!(
        out,
        "host {} (root {}), switchless {}{}",
        r.host.as_deref().unwrap_or("unknown"),
        r.root,
        r.version,
        r.plan_server.as_deref().map_or(String::new(), |s| format!(
            ", checked against the plan as {s}"
        ))
    );
    let _ = writeln!(out, "{}", cpu_line());
    let _ = writeln!(out);
    let header = [
        "DEVICE",
        "PORT",
        "NETDEV",
        "STATE",
        "ADDRESS",
        "GID",
        "MTU/ACTIVE",
        "PCIE ROOT",
        "PCIE LINK",
        "NCCL DEVICE",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for p in &r.ports {
        let addr = if p.addresses.is_empty() {
            "-".to_string()
        } else {
            p.addresses
                .iter()
                .map(|a| a.addr.clone())
                .collect::<Vec<_>>()
                .join(",")
        };
        let gid = if p.addresses.is_empty() {
            "-".to_string()
        } else {
            p.addresses
                .iter()
                .map(|a| {
                    format!(
                        "{} {}",
                        a.gid_index.map(|i| i.to_string()).unwrap_or_default(),
                        a.gid_type.clone().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        let link = p
            .pcie
            .map(|l| {
                format!(
                    "{} (max {})",
                    fmt_short(l.current_speed_gts, l.current_width),
                    fmt_short(l.max_speed_gts, l.max_width)
                )
            })
            .unwrap_or_else(|| "-".to_string());
        rows.push(vec![
            p.device.clone(),
            p.port.to_string(),
            p.netdev.clone().unwrap_or_else(|| "-".into()),
            format!(
                "{}/{}",
                p.state,
                p.operstate.clone().unwrap_or_else(|| "-".into())
            ),
            addr,
            gid,
            format!(
                "{}/{}",
                p.mtu.map(|m| m.to_string()).unwrap_or_else(|| "?".into()),
                // An InfiniBand port's active MTU is not derived from its IPoIB netdev's MTU, and
                // NCCL's IB transport, not the plugin, uses it.
                if p.link_layer == "InfiniBand" {
                    "IB".to_string()
                } else {
                    p.active_mtu.to_string()
                }
            ),
            p.pci_root.clone().unwrap_or_else(|| "-".into()),
            link,
            p.nccl_device.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    let ncol = header.len();
    let widths: Vec<usize> = (0..ncol)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    // A TCP-only host has no RDMA port: say so instead of an empty table.
    if r.ports.is_empty() {
        rows.clear();
        let _ = writeln!(out, "RDMA ports: none");
    }
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    let _ = writeln!(out);
    if let Some(h) = &r.ib_hca {
        let _ = writeln!(
            out,
            "NCCL_IB_HCA={} selects: {}",
            h.value,
            if h.selected.is_empty() {
                "no RDMA port".to_string()
            } else {
                h.selected.join(", ")
            }
        );
    }
    if r.nccl_devices.is_empty() {
        let _ = writeln!(out, "NCCL devices: none ({})", r.transport.why);
    } else if r.transport.transport == "tcp" {
        let _ = writeln!(out, "NCCL devices over TCP ({}):", r.transport.why);
        for d in &r.nccl_devices {
            let peers: Vec<String> = d.peers.iter().map(|p| p.to_string()).collect();
            let _ = writeln!(
                out,
                "  {} {}: {} Gb/s, host memory only, peers {}",
                d.index,
                d.name,
                d.speed_mbps / 1000,
                if peers.is_empty() {
                    "-".to_string()
                } else {
                    peers.join(", ")
                }
            );
        }
    } else {
        let _ = writeln!(out, "NCCL devices:");
        for d in &r.nccl_devices {
            let members: Vec<String> = d
                .members
                .iter()
                .map(|m| {
                    format!(
                        "{}:{}({})",
                        m.rdma_dev,
                        m.port,
                        m.netdev.clone().unwrap_or_default()
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "  {} {}: {} Gb/s, guid 0x{:016x} port {}, peer set {}, ptr {}, members {}",
                d.index,
                d.name,
                d.speed_mbps / 1000,
                d.guid,
                d.port,
                d.rail_id,
                ptr_support_names(d.ptr_support).join("|"),
                members.join(" + ")
            );
        }
    }
    if !r.tcp_links.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "TCP point-to-point links:");
        for t in &r.tcp_links {
            let toggle = |v: Option<crate::host::model::Toggle>| match v {
                Some(t) if t.on => "on",
                Some(_) => "off",
                None => "?",
            };
            let feat = t
                .features
                .as_ref()
                .map(|f| format!("GRO {}, TSO {}", toggle(f.gro), toggle(f.tso)))
                .unwrap_or_else(|| "GRO/TSO unchecked".into());
            let _ = writeln!(
                out,
                "  {} {} ({}): {}, MTU {} bytes, {} rx queues for {} streams, {}",
                t.netdev,
                t.addr,
                t.point_to_point,
                t.speed_mbps
                    .map(|s| format!("{s} Mb/s"))
                    .unwrap_or_else(|| "speed unknown".into()),
                t.mtu.map(|m| m.to_string()).unwrap_or_else(|| "?".into()),
                t.rx_queues
                    .map(|q| q.to_string())
                    .unwrap_or_else(|| "?".into()),
                t.streams,
                feat
            );
        }
        if let Some(b) = r.tcp_buffers {
            let v = |x: Option<u64>| x.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
            let _ = writeln!(
                out,
                "  socket buffer limits (bytes): rmem_max {}, wmem_max {}, tcp_rmem max {}, tcp_wmem max {}",
                v(b.rmem_max),
                v(b.wmem_max),
                v(b.tcp_rmem_max),
                v(b.tcp_wmem_max)
            );
        }
    }
    let _ = writeln!(out);
    if r.findings.is_empty() {
        let _ = writeln!(out, "No findings: clean.");
    } else {
        for f in &r.findings {
            let sev = match f.severity {
                Severity::Info => "info",
                Severity::Warning => "WARNING",
                Severity::Error => "ERROR",
            };
            let _ = writeln!(
                out,
                "{sev} [{}] {}: {}\n    remedy: {}",
                f.check, f.object, f.message, f.remedy
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line names the architecture the binary was built for and that architecture's barrier:
    /// on AArch64 (run under qemu-user in CI, natively on a GB10) the `dmb oshld`.
    #[test]
    fn the_report_names_the_cpu_architecture_and_its_barrier() {
        let line = cpu_line();
        if cfg!(target_arch = "aarch64") {
            assert!(line.starts_with("cpu aarch64 "), "{line}");
            assert!(line.contains("dmb oshld"), "{line}");
        } else if cfg!(target_arch = "x86_64") {
            assert!(line.starts_with("cpu x86_64 "), "{line}");
            assert!(line.contains("compiler fence"), "{line}");
            assert!(!line.contains("dmb"), "{line}");
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/fabric/gb10-2cable");
        let (m, f) = crate::host::discover(&root);
        let devs = m.nccl_devices(&|_, _| true, &|_| false);
        let text = render_text(&crate::tools::doctor::report(&m, &devs, f));
        assert_eq!(text.lines().nth(2), Some(line.as_str()), "{text}");
    }
}
