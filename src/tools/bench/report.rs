//! Result output: an nccl-tests-like table (units in every header), JSON and CSV.
#![forbid(unsafe_code)]

use std::fmt::Write as _;

use super::modes::Report;
use crate::error::{Error, Result};

/// The table, with a comment header naming the plugin, ranks and devices.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# switchless bench {}: {} ranks, {} channel(s), plugin {}",
        r.mode.name(),
        r.nranks,
        r.channels,
        r.plugin
    );
    for (i, d) in r.devices.iter().enumerate() {
        let _ = writeln!(
            s,
            "#  dev {i}: {} speed {} Mb/s, port {}, ptr {}, maxRecvs {}, maxP2pBytes {} B, pci {}",
            d.name,
            d.speed_mbps,
            d.port,
            crate::host::nccl::ptr_support_names(u32::try_from(d.ptr_support).unwrap_or(0))
                .join("|"),
            d.max_recvs,
            d.max_p2p_bytes,
            d.pci_path
        );
    }
    if let Some(t) = &r.setup {
        let _ = writeln!(
            s,
            "#  connection set-up (this rank, wall time): {:.3} s = listen {:.3} + handle exchange {:.3} + connect/accept {:.3} + regMr {:.3} + barrier {:.3}",
            t.total_s, t.listen_s, t.exchange_s, t.connect_s, t.register_s, t.barrier_s
        );
        if t.init_s > 0.0 {
            let _ = writeln!(
                s,
                "#  before it: plugin load and init (device discovery) {:.3} s",
                t.init_s
            );
        }
    }
    if let Some(m) = &r.model {
        let _ = writeln!(s, "#  model: {}", super::summary::describe(m));
        let _ = writeln!(
            s,
            "#  pattern {:?}{}, {} in flight, payload checks {}; time is virtual (trace {})",
            m.pattern,
            m.step_bytes
                .map(|b| format!(" (steps of at most {b} B)"))
                .unwrap_or_default(),
            m.window,
            if m.verify { "on" } else { "off (no copies)" },
            m.trace_hash
        );
        let _ = writeln!(
            s,
            "#  one-way latency of {} B: {:.3} us; one modelled RDMA write: {:.3} us; ratio {:.2}",
            m.latency_bytes, m.latency_us, m.rdma_write_us, m.latency_ratio
        );
        let _ = writeln!(s, "#  {}", m.counters.text());
        if let Some(c) = &m.stream {
            let _ = writeln!(s, "#  streamed, {}", c.text());
        }
    }
    let model = r.model.is_some() && r.rows.iter().any(|x| x.efficiency.is_some());
    let time = match r.mode {
        super::modes::Mode::Latency => "time(us,1-way)",
        _ => "time(us)",
    };
    let _ = write!(
        s,
        "# {:>12} {:>10} {:>6} {:>14} {:>12} {:>12} {:>12} {:>12} {:>7}",
        "size(B)",
        "count",
        "iters",
        time,
        "algbw(GB/s)",
        "busbw(GB/s)",
        "algbw(Gb/s)",
        "busbw(Gb/s)",
        "errors"
    );
    let _ = if model {
        writeln!(s, " {:>12} {:>6}", "model(Gb/s)", "eff")
    } else {
        writeln!(s)
    };
    for row in &r.rows {
        let _ = write!(
            s,
            "  {:>12} {:>10} {:>6} {:>14.2} {:>12.4} {:>12.4} {:>12.4} {:>12.4} {:>7}",
            row.size_bytes,
            row.count,
            row.iters,
            row.time_us,
            row.algbw_gbytes_s,
            row.busbw_gbytes_s,
            row.algbw_gbits_s,
            row.busbw_gbits_s,
            row.errors
        );
        let _ = match (model, row.modelled_gbits_s, row.efficiency) {
            (true, Some(m), Some(e)) => writeln!(s, " {m:>12.2} {e:>6.4}"),
            _ => writeln!(s),
        };
    }
    for row in &r.rows {
        if let Some(w) = &row.one_way_us {
            let _ = writeln!(
                s,
                "# one-way us at {} B (rank 0, per round trip / 2): min {:.2} median {:.2} p99 {:.2} max {:.2}",
                row.size_bytes, w.min, w.median, w.p99, w.max
            );
        }
        if let Some(b) = &row.breakdown {
            let _ = writeln!(s, "{}", b.line(r.rank, row.size_bytes));
        }
        if let Some(p) = &row.rdma_packets {
            let _ = writeln!(s, "{}", p.line(r.rank, row.size_bytes));
        }
    }
    let _ = writeln!(
        s,
        "# data checks: {}",
        match (&r.first_error, r.errors()) {
            (_, 0) => "all passed".to_string(),
            (Some(e), n) => format!("{n} FAILED; first: {e}"),
            (None, n) => format!("{n} FAILED"),
        }
    );
    s
}

/// The run as nccl-tests prints one (NVIDIA/nccl-tests `src/util.cu`, 2.18): a start line naming the
/// test, the column header, one row per size (out-of-place only: the bench has no in-place
/// variant), then the footer (`# Out of bounds values`, `# Avg bus bandwidth`, `# Collective test
/// concluded`). `switchless nccl-tests summarize` and other nccl-tests tooling read a bench run
/// like a run of nccl-tests; the test name says what ran (`switchless bench allreduce`), and the
/// comment lines of [`table`] (plugin, devices, set-up) come first. `#wrong` is the row's failed
/// data checks; the footer counts rows with any, and the average is over the rows, as nccl-tests
/// computes it. Sizes are bytes; bandwidths GB/s (10^9 bytes per second), nccl-tests' unit.
pub fn nccl_tests(r: &Report) -> String {
    let mut s = String::new();
    let full = table(r);
    // The bench's own comment header (everything before its column header).
    for line in full.lines().take_while(|l| !l.contains("size(B)")) {
        let _ = writeln!(s, "{line}");
    }
    let name = format!("switchless bench {}", r.mode.name());
    let (dtype, redop) = match r.mode {
        super::modes::Mode::Allreduce => ("float", "sum"),
        _ => ("uint8", "none"),
    };
    let _ = writeln!(s, "# Collective test starting: {name}");
    let _ = writeln!(s, "#");
    let _ = writeln!(
        s,
        "# {:>10} {:>12} {:>8} {:>6} {:>6} {:>10} {:>9} {:>9} {:>6}",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
    );
    let _ = writeln!(
        s,
        "# {:>10} {:>12} {:>8} {:>6} {:>6} {:>10} {:>9} {:>9} {:>6}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    let mut wrong_rows = 0usize;
    for row in &r.rows {
        if row.errors > 0 {
            wrong_rows += 1;
        }
        let _ = writeln!(
            s,
            "  {:>10} {:>12} {:>8} {:>6} {:>6} {:>10.2} {:>9.4} {:>9.4} {:>6}",
            row.size_bytes,
            row.count,
            dtype,
            redop,
            -1,
            row.time_us,
            row.algbw_gbytes_s,
            row.busbw_gbytes_s,
            row.errors
        );
    }
    // The bench's verdict line, with the first failure's text (nccl-tests has no such line).
    if let Some(line) = full.lines().find(|l| l.starts_with("# data checks:")) {
        let _ = writeln!(s, "{line}");
    }
    let avg = if r.rows.is_empty() {
        0.0
    } else {
        r.rows.iter().map(|x| x.busbw_gbytes_s).sum::<f64>() / r.rows.len() as f64
    };
    let _ = writeln!(
        s,
        "# Out of bounds values : {wrong_rows} {}",
        if wrong_rows == 0 { "OK" } else { "FAILED" }
    );
    let _ = writeln!(s, "# Avg bus bandwidth    : {avg:.6} ");
    let _ = writeln!(s, "#");
    let _ = writeln!(s, "# Collective test concluded: {name}");
    s
}

/// The whole report as JSON.
pub fn json(r: &Report) -> Result<String> {
    serde_json::to_string_pretty(r).map_err(|e| Error::Internal(format!("JSON of the report: {e}")))
}

/// One CSV line per size, with a header line.
pub fn csv(r: &Report) -> String {
    let mut s = String::from(
        "mode,nranks,channels,size_B,count,iters,time_us,algbw_GB_s,busbw_GB_s,algbw_Gb_s,busbw_Gb_s,errors\n",
    );
    for row in &r.rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{:.3},{:.6},{:.6},{:.6},{:.6},{}",
            r.mode.name(),
            r.nranks,
            r.channels,
            row.size_bytes,
            row.count,
            row.iters,
            row.time_us,
            row.algbw_gbytes_s,
            row.busbw_gbytes_s,
            row.algbw_gbits_s,
            row.busbw_gbits_s,
            row.errors
        );
    }
    s
}
