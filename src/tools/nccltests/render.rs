//! The human-readable report of a [`Summary`].
#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::model::gbyte_to_gbit;
use super::summary::{PluginStatus, Summary};

/// Bytes in binary units for display (`512 MiB`).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn bw(v: f64) -> String {
    format!("{v:.2} GB/s = {:.1} Gb/s", gbyte_to_gbit(v))
}

/// The human-readable report.
pub fn render_text(s: &Summary) -> String {
    let mut o = String::new();
    for (i, r) in s.runs.iter().enumerate() {
        let hosts = r.hosts();
        let _ = writeln!(
            o,
            "run {}: {} ({}:{}){}{}",
            i + 1,
            r.name(),
            r.source,
            r.start_line,
            r.nccl_tests_version
                .as_ref()
                .map(|v| format!(", nccl-tests {v}"))
                .unwrap_or_default(),
            r.nccl_library
                .map(|v| format!(", NCCL {}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
                .unwrap_or_default(),
        );
        if !r.ranks.is_empty() {
            let gpus: BTreeSet<&str> = r.ranks.iter().map(|d| d.gpu.as_str()).collect();
            let _ = writeln!(
                o,
                "  {} ranks on {} host(s): {} ({})",
                r.ranks.len(),
                hosts.len(),
                hosts.iter().copied().collect::<Vec<_>>().join(", "),
                gpus.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
        let _ = writeln!(
            o,
            "  {:>22}  {:<9} {:>34}  {:>34}  {:>7}",
            "size", "placement", "algbw", "busbw", "#wrong"
        );
        for row in &r.rows {
            let size = format!("{} ({})", row.size_bytes, human_bytes(row.size_bytes));
            for (k, (place, m)) in row.placements().enumerate() {
                let _ = writeln!(
                    o,
                    "  {:>22}  {:<12} {:>31}  {:>34}  {:>7}",
                    if k == 0 { size.as_str() } else { "" },
                    place,
                    bw(m.algbw_gbyte_s),
                    bw(m.busbw_gbyte_s),
                    m.wrong.map_or("N/A".to_string(), |w| w.to_string())
                );
            }
        }
        if let Some((line, text)) = &r.truncated_row {
            let _ = writeln!(o, "  (cut off at line {line}: `{}`)", text.trim());
        }
        match r.avg_busbw_gbyte_s {
            Some(avg) => {
                let _ = writeln!(
                    o,
                    "  Avg bus bandwidth (nccl-tests footer): {avg} GB/s = {:.1} Gb/s",
                    gbyte_to_gbit(avg)
                );
            }
            None => {
                let _ = writeln!(o, "  Avg bus bandwidth: missing (run incomplete)");
            }
        }
        if let Some((row, v)) = r
            .largest()
            .and_then(|row| row.min_busbw().map(|v| (row, v)))
        {
            let _ = writeln!(
                o,
                "  busbw at the largest size, {}: {}",
                human_bytes(row.size_bytes),
                bw(v)
            );
        }
        if let Some(p) = r.peak_busbw() {
            let _ = writeln!(o, "  peak busbw: {}", bw(p));
        }
        let _ = writeln!(
            o,
            "  wrong elements: {}; out of bounds values: {}",
            r.wrong_total(),
            r.out_of_bounds.map_or("missing".to_string(), |v| format!(
                "{v} {}",
                if v == 0 { "OK" } else { "FAILED" }
            ))
        );
    }
    let p = &s.plugin;
    let mut line = format!("network plugin '{}': {}", p.expected, p.status.word());
    if !p.networks.is_empty() {
        let nets: Vec<String> = p
            .networks
            .iter()
            .map(|(n, c)| format!("{n} on {c} process(es)"))
            .collect();
        let _ = write!(
            line,
            " (NCCL used {}; {} host(s): {})",
            nets.join(", "),
            p.hosts.len(),
            p.hosts.join(", ")
        );
    }
    if !p.abi_versions.is_empty() {
        let v: Vec<String> = p.abi_versions.iter().map(|v| format!("v{v}")).collect();
        let _ = write!(line, "; loaded with ncclNet ABI {}", v.join(", "));
    }
    if p.status == PluginStatus::Unknown {
        line.push_str(
            " (no NCCL log lines name a network: NCCL_DEBUG was off or its NCCL_DEBUG_FILE logs were not given)",
        );
    }
    let _ = writeln!(o, "{line}");
    if !s.nccl.plugin_paths.is_empty() {
        let _ = writeln!(
            o,
            "  plugin file: {}",
            s.nccl
                .plugin_paths
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let own = format!("NET/{}", p.expected);
    if let Some((_, n)) = s
        .nccl
        .net_prefix_lines
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(&own))
    {
        let _ = writeln!(o, "  plugin log lines ({own}): {n}");
    }
    for (net, (n, gdr)) in &s.nccl.net_channels {
        let _ = writeln!(
            o,
            "  NET/{net} channel connections: {n}, with GPUDirect RDMA: {gdr}{}",
            if *gdr < *n {
                " (the others stage through host memory)"
            } else {
                ""
            }
        );
    }
    if !s.nccl.nccl_versions.is_empty() {
        let _ = writeln!(
            o,
            "  NCCL: {}",
            s.nccl
                .nccl_versions
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for t in &s.targets {
        let _ = writeln!(
            o,
            "target (run {}): {} {} expected >= {}: {}",
            t.run,
            t.metric.describe(),
            t.measured_gbyte_s.map_or("missing".to_string(), bw),
            bw(t.expected_gbyte_s),
            if t.ok { "OK" } else { "BELOW" }
        );
    }
    for w in s.nccl.warnings.iter().take(5) {
        let _ = writeln!(o, "NCCL WARN: {w}");
    }
    for n in &s.notes {
        let _ = writeln!(o, "note: {n}");
    }
    for p in &s.problems {
        let _ = writeln!(o, "problem: {p}");
    }
    let _ = writeln!(o, "result: {}", if s.passed() { "PASS" } else { "FAIL" });
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(536870912), "512 MiB");
        assert_eq!(human_bytes(17179869184), "16 GiB");
        assert_eq!(human_bytes(1536), "1.50 KiB");
    }
}
