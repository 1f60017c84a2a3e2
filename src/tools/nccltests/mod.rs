//! Parser for NVIDIA nccl-tests output and its summary.
//!
//! Reads what `all_reduce_perf`, `all_gather_perf`, … print on stdout (possibly interleaved with NCCL's
//! `NCCL INFO` / `NCCL WARN` lines, possibly prefixed by `srun -l` labels or `mpirun --tag-output` tags)
//! and the per-process logs NCCL writes with `NCCL_DEBUG_FILE`.
//!
//! Format facts this parser relies on (NVIDIA/nccl-tests `src/util.cu`, 2.18–2.19):
//! * the result table header is a `#` line naming the columns `size count type redop root`, then per
//!   placement (out-of-place, in-place) `time algbw busbw #wrong` (plus `i_min i_max i_p99 i_cv%` with
//!   per-iteration timing, and a trailing `timestamp` with `-S 1`); older releases name the last column
//!   `error`; `time` reads `cputime` with `-C 1`;
//! * each row prints `size count type redop root` and then each placement's columns; `#wrong` is `N/A`
//!   when validation is off; bandwidths are in GB/s with 1 GB = 10^9 bytes (so 1 GB/s = 8 Gb/s);
//! * the footer is `# Out of bounds values : N OK|FAILED` (N counts result rows with wrong elements)
//!   and `# Avg bus bandwidth    : X` (the mean busbw over every row and both placements), then
//!   `# Collective test concluded: NAME`.
//!
//! NCCL's lines naming the network (NVIDIA/nccl 2.20–2.30, `src/init.cc`, `src/plugin/net.cc`,
//! `src/plugin/net/net_v*.cc`, `src/plugin/plugin_open.cc`): `Using network NAME` (every release),
//! `Assigned NET plugin NAME to comm` (2.27+), `NET/Plugin: Loaded net plugin NAME (vN)`,
//! `Successfully loaded external network plugin PATH` (2.28+), `NET/Plugin: Could not find: …`,
//! `Failed to initialize NET plugin NAME` (2.28+). Each log line starts `host:pid:tid [cudaDev] NCCL INFO`.
//!
//! Where to look: `model` (the parsed data and bandwidth units), `nccl_log` (NCCL's log lines and
//! launcher prefixes), `table` (nccl-tests' own lines: [`parse_text`]), `summary` ([`summarize`]:
//! plugin verdict, targets, problems), `render` ([`render_text`]). CLI-only: nothing in the plugin
//! uses it.
#![forbid(unsafe_code)]

#[cfg(test)]
mod fixtures;
mod model;
mod nccl_log;
mod render;
mod summary;
mod table;

pub use model::{
    GBIT_PER_GBYTE, Measurement, ParsedFile, RankDevice, Row, Run, gbyte_to_gbit, parse_bandwidth,
};
pub use nccl_log::{NcclLog, Process, ProcessEvidence};
pub use render::{human_bytes, render_text};
pub use summary::{Metric, Options, PluginReport, PluginStatus, Summary, TargetCheck, summarize};
pub use table::parse_text;
