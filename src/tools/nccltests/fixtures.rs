//! Test input shared by the parser and summary tests: a result table header and a run around rows.
#![forbid(unsafe_code)]

/// A result table header with both placements.
pub(super) const HEADER: &str = "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ";

/// A result row that matches [`HEADER`].
pub(super) const GOOD: &str = "        1024           256     float     sum      -1    10.00    0.10    2.00      0    10.00    0.10    2.00      0";

/// A complete run (version, start line, header, `rows`, and with `footer` the footer lines).
pub(super) fn table(rows: &[&str], footer: bool) -> String {
    let mut s = String::from(
        "# nccl-tests version 2.18.3 nccl-headers=22907 nccl-library=22907\n# Collective test starting: all_reduce_perf\n#\n",
    );
    s.push_str(HEADER);
    s.push('\n');
    for r in rows {
        s.push_str(r);
        s.push('\n');
    }
    if footer {
        s.push_str("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 2 \n#\n# Collective test concluded: all_reduce_perf\n");
    }
    s
}
