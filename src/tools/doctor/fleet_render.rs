//! Text form of the `--fleet` report: hosts, the cabling matrix (host × host), cables with their
//! paths, findings. The JSON form is the serde encoding of [`FleetReport`].

use std::fmt::Write as _;

use super::fleet::{End, FleetReport};
use crate::findings::Severity;

fn gbps(mbps: u64) -> String {
    crate::tools::units::gbps_number(mbps)
}

fn end_text(e: &End) -> String {
    let dev = match (&e.rdma_dev, e.port) {
        (Some(d), Some(p)) => format!(" ({d}:{p})"),
        _ => String::new(),
    };
    let mtu = match (e.mtu, e.active_mtu) {
        (Some(m), Some(a)) => format!("MTU {m}/{a}"),
        (Some(m), None) => format!("MTU {m}"),
        _ => "MTU ?".to_string(),
    };
    format!(
        "{} {}{dev} {} {mtu} {}",
        e.addr,
        e.netdev,
        if e.up { "up" } else { "DOWN" },
        serde_json::to_value(e.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    )
}

/// Left-aligned columns, two spaces apart.
fn table(rows: &[Vec<String>], indent: &str, out: &mut String) {
    let ncol = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncol)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        let _ = writeln!(out, "{indent}{}", cells.join("  ").trim_end());
    }
}

/// The human-readable fleet report.
pub fn render_text(r: &FleetReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Fleet of {} hosts:", r.hosts.len());
    let rows: Vec<Vec<String>> = r
        .hosts
        .iter()
        .map(|h| {
            vec![
                h.name.clone(),
                crate::tools::units::count(h.nccl_devices, "NCCL device"),
                crate::tools::units::count(h.ends, "cable end"),
                format!("single-host doctor exit {}", h.exit_status),
                h.root.clone(),
            ]
        })
        .collect();
    table(&rows, "  ", &mut out);

    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Cabling matrix (cables / usable paths / Gb/s; - no cable):"
    );
    let names: Vec<&str> = r.hosts.iter().map(|h| h.name.as_str()).collect();
    let mut rows = vec![
        std::iter::once(String::new())
            .chain(names.iter().map(|n| n.to_string()))
            .collect::<Vec<_>>(),
    ];
    for a in &names {
        let mut row = vec![a.to_string()];
        for b in &names {
            if a == b {
                row.push("·".to_string());
                continue;
            }
            let cell = r
                .matrix
                .iter()
                .find(|c| (c.a == *a && c.b == *b) || (c.a == *b && c.b == *a));
            row.push(match cell {
                Some(c) if c.cables > 0 => format!(
                    "{} / {} / {}{}",
                    c.cables,
                    c.usable_paths,
                    gbps(c.speed_mbps),
                    if c.as_addressed { " *" } else { "" }
                ),
                _ => "-".to_string(),
            });
        }
        rows.push(row);
    }
    table(&rows, "  ", &mut out);
    if r.matrix.iter().any(|c| c.as_addressed) {
        let _ = writeln!(
            out,
            "  * as addressed: a cage faces two cages by address only (a copied address?); counted and rated \
             by what the cages carry"
        );
    }

    let _ = writeln!(out);
    if r.cables.is_empty() {
        let _ = writeln!(out, "Cables: none found");
    } else {
        let _ = writeln!(out, "Cables:");
    }
    for c in &r.cables {
        let usable = c.paths.iter().filter(|p| p.usable).count();
        let _ = writeln!(
            out,
            "  {}:{} — {}:{}: {} ({usable} usable), {} Gb/s",
            c.a.host,
            c.a.netdevs.join("+"),
            c.b.host,
            c.b.netdevs.join("+"),
            crate::tools::units::count(c.paths.len(), "path"),
            gbps(c.speed_mbps)
        );
        let rows: Vec<Vec<String>> = c
            .paths
            .iter()
            .map(|p| {
                vec![
                    end_text(&p.a),
                    "<->".to_string(),
                    end_text(&p.b),
                    if p.usable { "" } else { "(not usable)" }.to_string(),
                ]
            })
            .collect();
        table(&rows, "    ", &mut out);
    }

    if !r.failover.is_empty() {
        let _ = writeln!(
            out,
            "\nFailover (per host pair: carrying paths, then standby):"
        );
        for f in &r.failover {
            let _ = writeln!(out, "  [{}] {}: {}", f.check, f.object, f.message);
        }
    }

    let _ = writeln!(out);
    if r.findings.is_empty() {
        let _ = writeln!(out, "No cross-host findings: clean.");
    }
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
    let _ = writeln!(
        out,
        "\nexit status {} (worst of the cross-host findings and each host's single-host doctor)",
        r.exit_status
    );
    out
}

/// The planned-cables table of `--fleet --plan`: one line per cable of the cables file.
pub fn render_planned(plan_file: &str, cables: &[super::fleet_plan::PlannedCable]) -> String {
    let mut out = String::new();
    let ok = cables.iter().filter(|c| c.status == "ok").count();
    let _ = writeln!(
        out,
        "\nPlanned cables ({plan_file}: {}, {ok} OK):",
        crate::tools::units::count(cables.len(), "cable")
    );
    let rows: Vec<Vec<String>> = cables
        .iter()
        .map(|c| {
            vec![
                format!("line {}", c.line),
                format!("{} — {}", c.a, c.b),
                format!("{}:", c.status.to_ascii_uppercase().replace('-', " ")),
                c.detail.clone(),
            ]
        })
        .collect();
    table(&rows, "  ", &mut out);
    out
}
