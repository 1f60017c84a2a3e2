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
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::error::{Error, Result};

/// Gigabits per gigabyte: nccl-tests' GB is 10^9 bytes, so GB/s × 8 = Gb/s exactly.
pub const GBIT_PER_GBYTE: f64 = 8.0;

/// GB/s (nccl-tests' unit) to Gb/s (link rates).
pub fn gbyte_to_gbit(gbyte_per_s: f64) -> f64 {
    gbyte_per_s * GBIT_PER_GBYTE
}

/// One placement (out-of-place or in-place) of one result row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Measurement {
    /// Time per operation, µs (CPU time with `-C 1`).
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s (10^9 bytes per second).
    pub algbw_gbyte_s: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbyte_s: f64,
    /// Wrong elements; `None` when nccl-tests printed `N/A` (validation off, `-c 0`).
    pub wrong: Option<u64>,
}

/// One result row: one message size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Line number (1-based) in its file.
    pub line: usize,
    /// Message size in bytes (nccl-tests' `size` column).
    pub size_bytes: u64,
    /// Elements (`count` column).
    pub count: u64,
    /// Data type (`float`, `bfloat16`, …).
    pub dtype: String,
    /// Reduction (`sum`, … or `none`).
    pub redop: String,
    /// Root rank (`-1` when the collective has none); `None` for old releases without the column.
    pub root: Option<i64>,
    pub out_of_place: Option<Measurement>,
    pub in_place: Option<Measurement>,
}

impl Row {
    /// The measurements present, labelled.
    pub fn placements(&self) -> impl Iterator<Item = (&'static str, &Measurement)> {
        [
            ("out-of-place", &self.out_of_place),
            ("in-place", &self.in_place),
        ]
        .into_iter()
        .filter_map(|(label, m)| m.as_ref().map(|m| (label, m)))
    }

    /// The lower busbw of the placements present, GB/s.
    pub fn min_busbw(&self) -> Option<f64> {
        self.placements()
            .map(|(_, m)| m.busbw_gbyte_s)
            .reduce(f64::min)
    }
}

/// One rank from the `# Using devices` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankDevice {
    pub rank: u32,
    pub host: String,
    pub device: u32,
    /// GPU name as CUDA reports it.
    pub gpu: String,
}

/// One nccl-tests invocation found in a file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// File the run came from.
    pub source: String,
    /// First line of the run.
    pub start_line: usize,
    /// Test binary name (`all_reduce_perf`), from `# Collective test starting/concluded:`.
    pub test: Option<String>,
    /// nccl-tests version (`# nccl-tests version 2.18.3 …`).
    pub nccl_tests_version: Option<String>,
    /// NCCL library version code as nccl-tests prints it (`nccl-library=22907`).
    pub nccl_library: Option<u32>,
    /// Ranks from `# Using devices`.
    pub ranks: Vec<RankDevice>,
    pub rows: Vec<Row>,
    /// `# Out of bounds values : N` (rows with wrong elements, counted by nccl-tests).
    pub out_of_bounds: Option<u64>,
    /// `# Avg bus bandwidth : X`, GB/s.
    pub avg_busbw_gbyte_s: Option<f64>,
    /// `# Collective test concluded:` was seen.
    pub concluded: bool,
    /// The row cut short at the end of the output (line number, text), if any.
    pub truncated_row: Option<(usize, String)>,
    /// `# error: …` lines nccl-tests printed.
    pub errors: Vec<String>,
}

impl Run {
    fn new(source: &str, line: usize) -> Self {
        Run {
            source: source.to_string(),
            start_line: line,
            test: None,
            nccl_tests_version: None,
            nccl_library: None,
            ranks: Vec::new(),
            rows: Vec::new(),
            out_of_bounds: None,
            avg_busbw_gbyte_s: None,
            concluded: false,
            truncated_row: None,
            errors: Vec::new(),
        }
    }

    /// Whether the footer (`# Avg bus bandwidth`) was printed: the run finished.
    pub fn complete(&self) -> bool {
        self.avg_busbw_gbyte_s.is_some()
    }

    /// Distinct hosts in `# Using devices`.
    pub fn hosts(&self) -> BTreeSet<&str> {
        self.ranks.iter().map(|r| r.host.as_str()).collect()
    }

    /// A display name: the test name, or `nccl-tests run`.
    pub fn name(&self) -> &str {
        self.test.as_deref().unwrap_or("nccl-tests run")
    }

    /// The row with the largest size.
    pub fn largest(&self) -> Option<&Row> {
        self.rows.iter().max_by_key(|r| r.size_bytes)
    }

    /// The highest busbw of any row and placement, GB/s.
    pub fn peak_busbw(&self) -> Option<f64> {
        self.rows
            .iter()
            .flat_map(|r| r.placements().map(|(_, m)| m.busbw_gbyte_s))
            .reduce(f64::max)
    }

    /// Mean busbw over the rows as printed (what the footer reports, up to rounding), GB/s.
    pub fn mean_busbw(&self) -> Option<f64> {
        let v: Vec<f64> = self
            .rows
            .iter()
            .flat_map(|r| r.placements().map(|(_, m)| m.busbw_gbyte_s))
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    /// Total wrong elements over all rows.
    pub fn wrong_total(&self) -> u64 {
        self.rows
            .iter()
            .flat_map(|r| r.placements().filter_map(|(_, m)| m.wrong))
            .sum()
    }
}

/// The process a NCCL log line came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Process {
    pub host: String,
    pub pid: u32,
}

/// What NCCL's log lines say about one process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcessEvidence {
    /// Networks named by `Using network X` / `Assigned NET plugin X to comm`.
    pub networks: BTreeSet<String>,
    /// External plugins NCCL loaded: name → ABI versions (`Loaded net plugin X (vN)`).
    pub loaded: BTreeMap<String, BTreeSet<u32>>,
}

/// Everything gathered from `NCCL INFO` / `NCCL WARN` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NcclLog {
    pub processes: BTreeMap<String, ProcessEvidence>,
    /// `NCCL version …` strings.
    pub nccl_versions: BTreeSet<String>,
    /// Values of NCCL_NET_PLUGIN NCCL reported.
    pub net_plugin_env: BTreeSet<String>,
    /// Paths NCCL loaded an external network plugin from.
    pub plugin_paths: BTreeSet<String>,
    /// Lines saying a plugin could not be found, loaded or initialized (deduplicated, first 20).
    pub plugin_failures: Vec<String>,
    /// `NCCL WARN` messages (deduplicated, first 20).
    pub warnings: Vec<String>,
    /// Number of NCCL log lines seen.
    pub lines: usize,
    /// INFO lines per `NET/<name>` prefix (`NET/IB`, `NET/Plugin`, the plugin's own `NET/switchless` lines).
    pub net_prefix_lines: BTreeMap<String, usize>,
    /// `Channel … via NET/<name>/<dev>…` connections per network name, and how many use GPUDirect RDMA
    /// (`/GDRDMA`): (connections, with GDRDMA).
    pub net_channels: BTreeMap<String, (usize, usize)>,
}

const MAX_KEPT: usize = 20;

fn push_unique(v: &mut Vec<String>, s: String) {
    if v.len() < MAX_KEPT && !v.contains(&s) {
        v.push(s);
    }
}

impl NcclLog {
    /// Adds another file's evidence.
    pub fn merge(&mut self, other: NcclLog) {
        for (k, p) in other.processes {
            let e = self.processes.entry(k).or_default();
            e.networks.extend(p.networks);
            for (name, abis) in p.loaded {
                e.loaded.entry(name).or_default().extend(abis);
            }
        }
        self.nccl_versions.extend(other.nccl_versions);
        self.net_plugin_env.extend(other.net_plugin_env);
        self.plugin_paths.extend(other.plugin_paths);
        for f in other.plugin_failures {
            push_unique(&mut self.plugin_failures, f);
        }
        for w in other.warnings {
            push_unique(&mut self.warnings, w);
        }
        self.lines += other.lines;
        for (k, v) in other.net_prefix_lines {
            *self.net_prefix_lines.entry(k).or_default() += v;
        }
        for (k, (n, g)) in other.net_channels {
            let e = self.net_channels.entry(k).or_default();
            e.0 += n;
            e.1 += g;
        }
    }

    /// Feeds one NCCL log line (`… NCCL INFO msg` or `… NCCL WARN msg`). Returns false if it is not one.
    fn feed(&mut self, line: &str) -> bool {
        if let Some(i) = line.find(" NCCL INFO ") {
            self.lines += 1;
            let proc_key = process_key(&line[..i]);
            self.info(proc_key, line[i + " NCCL INFO ".len()..].trim_end());
            true
        } else if let Some(i) = line.find(" NCCL WARN ") {
            self.lines += 1;
            push_unique(
                &mut self.warnings,
                line[i + " NCCL WARN ".len()..].trim().to_string(),
            );
            true
        } else {
            false
        }
    }

    fn info(&mut self, proc_key: String, msg: &str) {
        if let Some(rest) = msg.strip_prefix("NET/") {
            let name = rest.split([' ', ':']).next().unwrap_or("");
            *self
                .net_prefix_lines
                .entry(format!("NET/{name}"))
                .or_default() += 1;
        }
        if msg.starts_with("Channel ") {
            if let Some((_, via)) = msg.split_once(" via NET/") {
                let name = via.split('/').next().unwrap_or("").to_string();
                let e = self.net_channels.entry(name).or_default();
                e.0 += 1;
                if via.contains("/GDRDMA") {
                    e.1 += 1;
                }
            }
        }
        if let Some(name) = msg.strip_prefix("Using network ") {
            self.network(proc_key, name);
        } else if let Some(rest) = msg.strip_prefix("Assigned NET plugin ") {
            if let Some(name) = rest.strip_suffix(" to comm") {
                self.network(proc_key, name);
            }
        } else if let Some(rest) = msg.strip_prefix("NET/Plugin: Loaded net plugin ") {
            // "NAME (vN)"
            if let Some((name, ver)) = rest.rsplit_once(" (v") {
                let abi = ver.trim_end_matches(')').parse::<u32>().ok();
                let set = self
                    .processes
                    .entry(proc_key)
                    .or_default()
                    .loaded
                    .entry(name.trim().to_string())
                    .or_default();
                if let Some(abi) = abi {
                    set.insert(abi);
                }
            }
        } else if let Some(path) = msg
            .strip_prefix("Successfully loaded external network plugin ")
            .or_else(|| msg.strip_prefix("Successfully loaded external plugin "))
        {
            self.plugin_paths.insert(path.trim().to_string());
        } else if let Some(v) = msg
            .strip_prefix("NCCL_NET_PLUGIN set by environment to ")
            .or_else(|| msg.strip_prefix("NET/Plugin: Plugin name set by env to "))
        {
            self.net_plugin_env.insert(v.trim().to_string());
        } else if let Some(v) = msg.strip_prefix("NCCL version ") {
            self.nccl_versions.insert(v.trim().to_string());
        } else if msg.starts_with("Failed to initialize NET plugin ")
            || (msg.starts_with("External network plugin ") && msg.ends_with(" is unsupported"))
            || msg.starts_with("NET/Plugin: Could not find:")
        {
            push_unique(&mut self.plugin_failures, msg.to_string());
        } else if let Some(rest) = msg.strip_prefix("NET/Plugin: ") {
            // dlopen errors ("NET/Plugin: NAME: dlerror text"); the rest of NET/Plugin is benign version
            // probing ("Failed to find ncclNetPlugin_v11 symbol.") or bookkeeping.
            let benign = rest.starts_with("Failed to find ")
                || rest.starts_with("Loaded collnet plugin")
                || rest.starts_with("Closing ")
                || rest.starts_with("Using internal ")
                || rest.starts_with("Plugin name set by env");
            if !benign && rest.contains(": ") {
                push_unique(&mut self.plugin_failures, msg.to_string());
            }
        }
    }

    fn network(&mut self, proc_key: String, name: &str) {
        self.processes
            .entry(proc_key)
            .or_default()
            .networks
            .insert(name.trim().to_string());
    }

    /// Hosts with network evidence.
    pub fn hosts(&self) -> BTreeSet<&str> {
        self.processes
            .iter()
            .filter(|(_, p)| !p.networks.is_empty() || !p.loaded.is_empty())
            .map(|(k, _)| k.split_once(':').map_or(k.as_str(), |(h, _)| h))
            .collect()
    }
}

/// `host:pid` from the text before ` NCCL INFO` (`[launcher prefix] [timestamp] host:pid:tid [dev]`).
fn process_key(prefix: &str) -> String {
    let mut tokens: Vec<&str> = prefix.split_whitespace().collect();
    if tokens.last().is_some_and(|t| t.starts_with('[')) {
        tokens.pop();
    }
    if let Some(t) = tokens.last() {
        let parts: Vec<&str> = t.rsplitn(3, ':').collect();
        if parts.len() == 3 && parts[0].parse::<u64>().is_ok() && parts[1].parse::<u64>().is_ok() {
            return format!("{}:{}", parts[2], parts[1]);
        }
    }
    "unknown".to_string()
}

/// Splits a launcher's per-line prefix off: `srun -l` (`12: `, label `12`) or `mpirun --tag-output`
/// (`[1,0]<stdout>:`, label `1,0`). Lines without one have no label.
fn split_launcher_prefix(line: &str) -> (Option<&str>, &str) {
    let t = line.trim_start();
    // srun -l: digits then ": "
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && t[digits..].starts_with(": ") {
        return (Some(&t[..digits]), &t[digits + 2..]);
    }
    // mpirun --tag-output: "[job,rank]<stdout>:" or "<stderr>:"
    if t.starts_with('[') {
        for tag in ["]<stdout>:", "]<stderr>:"] {
            if let Some(i) = t.find(tag) {
                let inner = &t[1..i];
                if inner.split(',').all(|p| p.trim().parse::<u64>().is_ok()) {
                    let rest = &t[i + tag.len()..];
                    return (Some(inner), rest.strip_prefix(' ').unwrap_or(rest));
                }
            }
        }
    }
    (None, line)
}

/// The leading columns of a result table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lead {
    Size,
    Count,
    Type,
    Redop,
    Root,
}

/// Column positions inside one placement group.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    lead: Vec<Lead>,
    groups: usize,
    group_len: usize,
    time: usize,
    algbw: usize,
    busbw: usize,
    wrong: Option<usize>,
    /// Columns follow the placement groups (`timestamp`, RCCL's `algo proto nchannels`): rows may be longer.
    timestamp: bool,
    names: String,
}

impl Layout {
    fn columns(&self) -> usize {
        self.lead.len() + self.groups * self.group_len
    }
}

/// Parses a `#  size  count  type …` header. `Ok(None)` if the line is not a table header.
fn parse_header(body: &str) -> std::result::Result<Option<Layout>, String> {
    let tokens: Vec<&str> = body.split_whitespace().collect();
    if !(tokens.contains(&"size") && tokens.contains(&"algbw") && tokens.contains(&"busbw")) {
        return Ok(None);
    }
    let is_time = |t: &str| t == "time" || t == "cputime";
    let mut lead = Vec::new();
    let mut i = 0;
    while i < tokens.len() && !is_time(tokens[i]) {
        lead.push(match tokens[i] {
            "size" => Lead::Size,
            "count" => Lead::Count,
            "type" => Lead::Type,
            "redop" => Lead::Redop,
            "root" => Lead::Root,
            other => {
                return Err(format!(
                    "unknown leading column '{other}' (accepted: size, count, type, redop, root)"
                ));
            }
        });
        i += 1;
    }
    for needed in [Lead::Size, Lead::Count, Lead::Type] {
        if !lead.contains(&needed) {
            return Err(format!(
                "missing leading column {needed:?} (lower case) before 'time'"
            ));
        }
    }
    let mut groups: Vec<Vec<&str>> = Vec::new();
    let mut timestamp = false;
    let mut extra = false;
    while i < tokens.len() {
        if tokens[i] == "timestamp" {
            timestamp = true;
            if i + 1 != tokens.len() {
                return Err("'timestamp' must be the last column".into());
            }
            break;
        }
        if is_time(tokens[i]) {
            groups.push(Vec::new());
        }
        if let Some(g) = groups.last_mut() {
            g.push(tokens[i]);
        }
        i += 1;
    }
    let first = groups
        .first()
        .ok_or("no 'time' column after the leading columns")?
        .clone();
    // Columns after the last placement group (RCCL's `algo proto nchannels`) are allowed and ignored.
    if let Some(last) = groups.last_mut() {
        if last.len() > first.len() && last[..first.len()] == first[..] {
            extra = true;
            last.truncate(first.len());
        }
    }
    if groups.iter().any(|g| *g != first) {
        return Err("the out-of-place and in-place column groups differ".into());
    }
    if groups.len() > 2 {
        return Err(format!(
            "{} placement groups (accepted: 1 or 2: out-of-place, in-place)",
            groups.len()
        ));
    }
    let pos = |name: &str| first.iter().position(|t| *t == name);
    let algbw = pos("algbw").ok_or("no 'algbw' column in a placement group")?;
    let busbw = pos("busbw").ok_or("no 'busbw' column in a placement group")?;
    let wrong = pos("#wrong").or_else(|| pos("error"));
    Ok(Some(Layout {
        lead,
        groups: groups.len(),
        group_len: first.len(),
        time: 0,
        algbw,
        busbw,
        wrong,
        timestamp: timestamp || extra,
        names: tokens.join(" "),
    }))
}

fn num<T: std::str::FromStr>(tok: &str, col: &str) -> std::result::Result<T, String> {
    tok.parse::<T>()
        .map_err(|_| format!("column '{col}' is '{tok}', expected a number"))
}

fn float(tok: &str, col: &str, what: &str) -> std::result::Result<f64, String> {
    let v: f64 = num(tok, col)?;
    if v.is_nan() || v < 0.0 {
        return Err(format!(
            "column '{col}' ({what}) is '{tok}', expected a non-negative number"
        ));
    }
    Ok(v)
}

fn parse_row(layout: &Layout, line_no: usize, body: &str) -> std::result::Result<Row, String> {
    let tokens: Vec<&str> = body.split_whitespace().collect();
    let want = layout.columns();
    let ok_len = if layout.timestamp {
        tokens.len() >= want
    } else {
        tokens.len() == want
    };
    if !ok_len {
        return Err(format!(
            "expected {want} columns ({}), found {}",
            layout.names,
            tokens.len()
        ));
    }
    let mut row = Row {
        line: line_no,
        size_bytes: 0,
        count: 0,
        dtype: String::new(),
        redop: String::new(),
        root: None,
        out_of_place: None,
        in_place: None,
    };
    for (col, tok) in layout.lead.iter().zip(&tokens) {
        match col {
            Lead::Size => row.size_bytes = num(tok, "size")?,
            Lead::Count => row.count = num(tok, "count")?,
            Lead::Type => row.dtype = (*tok).to_string(),
            Lead::Redop => row.redop = (*tok).to_string(),
            Lead::Root => row.root = Some(num(tok, "root")?),
        }
    }
    for g in 0..layout.groups {
        let base = layout.lead.len() + g * layout.group_len;
        let what = if g == 0 && layout.groups == 2 {
            "out-of-place"
        } else {
            "in-place"
        };
        let time_us = float(tokens[base + layout.time], "time", what)?;
        let algbw = float(tokens[base + layout.algbw], "algbw", what)?;
        let busbw = float(tokens[base + layout.busbw], "busbw", what)?;
        let wrong = match layout.wrong {
            Some(w) if tokens[base + w] != "N/A" => {
                let v = float(tokens[base + w], "#wrong", what)?;
                if v.fract() != 0.0 || !v.is_finite() {
                    return Err(format!(
                        "column '#wrong' ({what}) is '{}', expected a whole number or N/A",
                        tokens[base + w]
                    ));
                }
                Some(v as u64)
            }
            _ => None,
        };
        let m = Measurement {
            time_us,
            algbw_gbyte_s: algbw,
            busbw_gbyte_s: busbw,
            wrong,
        };
        if what == "out-of-place" {
            row.out_of_place = Some(m);
        } else {
            row.in_place = Some(m);
        }
    }
    Ok(row)
}

/// What one file holds: nccl-tests runs and NCCL log evidence.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ParsedFile {
    pub source: String,
    pub runs: Vec<Run>,
    pub nccl: NcclLog,
}

struct Pending {
    line: usize,
    text: String,
    reason: String,
}

/// Parser state for one output stream: one launcher label (`srun -l` task, `mpirun` rank), or the
/// unlabelled lines. Separate streams keep the tables of processes that each print a whole run apart
/// (nccl-tests built without MPI=1).
#[derive(Default)]
struct Stream {
    run: Option<Run>,
    layout: Option<Layout>,
    footer: bool,
    pending: Option<Pending>,
}

/// Parses one file's text. `source` names it in messages.
///
/// Lines that are neither nccl-tests output nor NCCL log lines are ignored. A result row that does not
/// match its table's header is an error naming the line, unless nothing of that table follows it (the
/// output was cut off: the run is reported as truncated).
pub fn parse_text(source: &str, text: &str) -> Result<ParsedFile> {
    let mut out = ParsedFile {
        source: source.to_string(),
        ..ParsedFile::default()
    };
    let mut streams: BTreeMap<Option<String>, Stream> = BTreeMap::new();
    let mut finished: Vec<Run> = Vec::new();

    let malformed = |p: &Pending| {
        Error::InvalidUsage(format!(
            "{source}:{}: malformed nccl-tests result row ({}): `{}`",
            p.line,
            p.reason,
            p.text.trim()
        ))
    };

    for (idx, raw) in text.lines().enumerate() {
        let n = idx + 1;
        let raw = raw.trim_end_matches('\r');
        let (label, line) = split_launcher_prefix(raw);
        let key = label.map(str::to_string);
        if out.nccl.feed(raw) {
            // NCCL may log while nccl-tests is in the middle of a row: the row's first columns are then
            // glued to the log line and its remaining columns follow on a later line.
            if let Some(st) = streams.get_mut(&key) {
                if let (Some(l), false, None) = (st.layout.as_ref(), st.footer, st.pending.as_ref())
                {
                    if let Some(frag) = glued_row_fragment(line, l) {
                        st.pending = Some(Pending {
                            line: n,
                            text: frag,
                            reason: "row cut by a NCCL log line".to_string(),
                        });
                    }
                }
            }
            continue;
        }
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let st = streams.entry(key).or_default();
        if let Some(body) = t.strip_prefix('#') {
            let body_t = body.trim();
            // A new run starts at the version line, at the start line, or at the first parameter line.
            let starts_run = body_t.starts_with("nccl-tests version")
                || body_t.starts_with("Collective test starting:")
                || body_t.starts_with("nThread ");
            if starts_run {
                let continues = st.run.as_ref().is_some_and(|r| {
                    st.layout.is_none()
                        && r.rows.is_empty()
                        && !(body_t.starts_with("nccl-tests version")
                            && r.nccl_tests_version.is_some())
                        && !(body_t.starts_with("Collective test starting:") && r.test.is_some())
                });
                if !continues {
                    if let Some(p) = st.pending.take() {
                        return Err(malformed(&p));
                    }
                    finished.extend(st.run.take());
                    st.run = Some(Run::new(source, n));
                    st.layout = None;
                    st.footer = false;
                }
                let r = st.run.get_or_insert_with(|| Run::new(source, n));
                if let Some(rest) = body_t.strip_prefix("nccl-tests version") {
                    let mut it = rest.split_whitespace();
                    r.nccl_tests_version = it.next().map(str::to_string);
                    r.nccl_library = it
                        .find_map(|kv| kv.strip_prefix("nccl-library="))
                        .and_then(|v| v.parse().ok());
                } else if let Some(name) = body_t.strip_prefix("Collective test starting:") {
                    r.test = Some(name.trim().to_string());
                }
                continue;
            }
            if body_t.starts_with("Rank ") {
                if let (Some(r), Some(d)) = (st.run.as_mut(), parse_rank(body_t)) {
                    r.ranks.push(d);
                }
                continue;
            }
            match parse_header(body_t) {
                Ok(Some(l)) => {
                    if let Some(p) = st.pending.take() {
                        return Err(malformed(&p));
                    }
                    // A second table without a new preamble (old releases): a new run.
                    if st
                        .run
                        .as_ref()
                        .is_some_and(|r| !r.rows.is_empty() || st.footer)
                    {
                        finished.extend(st.run.take());
                    }
                    st.run.get_or_insert_with(|| Run::new(source, n));
                    st.layout = Some(l);
                    st.footer = false;
                    continue;
                }
                Ok(None) => {}
                Err(reason) => {
                    return Err(Error::InvalidUsage(format!(
                        "{source}:{n}: unrecognized nccl-tests table header ({reason}): `{t}`"
                    )));
                }
            }
            if let Some((key, value)) = body_t.split_once(':') {
                let key = key.trim();
                let value = value.trim();
                let Some(r) = st.run.as_mut() else { continue };
                match key {
                    "Out of bounds values" => {
                        if let Some(p) = st.pending.take() {
                            return Err(malformed(&p));
                        }
                        let v = value.split_whitespace().next().unwrap_or("");
                        r.out_of_bounds = Some(v.parse().map_err(|_| {
                            Error::InvalidUsage(format!(
                                "{source}:{n}: 'Out of bounds values' is '{v}', expected a whole number: `{t}`"
                            ))
                        })?);
                        st.footer = true;
                    }
                    "Avg bus bandwidth" => {
                        if let Some(p) = st.pending.take() {
                            return Err(malformed(&p));
                        }
                        let v = value.split_whitespace().next().unwrap_or("");
                        let bw: f64 = v.parse().map_err(|_| {
                            Error::InvalidUsage(format!(
                                "{source}:{n}: 'Avg bus bandwidth' is '{v}', expected a number in GB/s: `{t}`"
                            ))
                        })?;
                        r.avg_busbw_gbyte_s = Some(bw);
                        st.footer = true;
                    }
                    "Collective test concluded" => {
                        r.concluded = true;
                        if r.test.is_none() {
                            r.test = Some(value.to_string());
                        }
                        st.footer = true;
                    }
                    "error" => r.errors.push(value.to_string()),
                    _ => {}
                }
            }
            continue;
        }
        // Result rows start with a digit, inside a table whose footer has not been printed.
        let Some(l) = st.layout.as_ref() else {
            continue;
        };
        if st.footer || !t.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        // The rest of a row whose first columns came earlier (cut by a NCCL log line).
        if let Some(p) = st.pending.as_ref() {
            if let Ok(row) = parse_row(l, p.line, &format!("{} {t}", p.text)) {
                st.pending = None;
                if let Some(r) = st.run.as_mut() {
                    r.rows.push(row);
                }
                continue;
            }
        }
        match parse_row(l, n, t) {
            Ok(row) => {
                if let Some(p) = st.pending.take() {
                    return Err(malformed(&p));
                }
                if let Some(r) = st.run.as_mut() {
                    r.rows.push(row);
                }
            }
            Err(reason) => {
                if let Some(p) = st.pending.take() {
                    return Err(malformed(&p));
                }
                st.pending = Some(Pending {
                    line: n,
                    text: t.to_string(),
                    reason,
                });
            }
        }
    }
    for st in streams.into_values() {
        if let Some(mut r) = st.run {
            if let Some(p) = st.pending {
                r.truncated_row = Some((p.line, p.text));
            }
            finished.push(r);
        }
    }
    finished.sort_by_key(|r| r.start_line);
    out.runs = finished;
    Ok(out)
}

/// The leading row columns glued in front of a NCCL log line (`   1024   256  float  sum  -1host:1:2 [0] NCCL
/// INFO …`): the text before the `host:pid:tid` token, when it holds exactly the leading columns and
/// the last of them is the integer `root` column.
fn glued_row_fragment(line: &str, layout: &Layout) -> Option<String> {
    if layout.lead.last() != Some(&Lead::Root) {
        return None;
    }
    let i = line.find(" NCCL INFO ")?;
    let mut tokens: Vec<&str> = line[..i].split_whitespace().collect();
    if tokens.last().is_some_and(|t| t.starts_with('[')) {
        tokens.pop();
    }
    let origin = tokens.pop()?;
    if tokens.len() + 1 != layout.lead.len() || !tokens[0].starts_with(|c: char| c.is_ascii_digit())
    {
        return None;
    }
    let sign = usize::from(origin.starts_with('-'));
    let digits = origin[sign..]
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    if digits == 0 || sign + digits == origin.len() {
        return None;
    }
    let root = &origin[..sign + digits];
    Some(format!("{} {root}", tokens.join(" ")))
}

/// `Rank  0 Group  0 Pid 123 on host device  0 [0000:17:00] NVIDIA B300`
fn parse_rank(body: &str) -> Option<RankDevice> {
    let tokens: Vec<&str> = body.split_whitespace().collect();
    let at = |name: &str| tokens.iter().position(|t| *t == name);
    let rank = tokens.get(at("Rank")? + 1)?.parse().ok()?;
    let host = (*tokens.get(at("on")? + 1)?).to_string();
    let dev_i = at("device")?;
    let device = tokens.get(dev_i + 1)?.parse().ok()?;
    let gpu = tokens
        .get(dev_i + 2..)
        .map(|rest| {
            rest.iter()
                .skip_while(|t| t.starts_with('['))
                .copied()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Some(RankDevice {
        rank,
        host,
        device,
        gpu,
    })
}

/// Parses a bandwidth with an optional unit into GB/s: `787`, `787GB/s`, `787 GBps`, `6300Gb/s`,
/// `6300 Gbps`. No unit means GB/s, nccl-tests' unit.
pub fn parse_bandwidth(s: &str) -> Result<f64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E' || c == '+'))
        .unwrap_or(t.len());
    // 'e' may start an exponent but never a unit we accept; units start with G.
    let (num_s, unit) = t.split_at(split);
    let v: f64 = num_s.trim().parse().map_err(|_| {
        Error::InvalidUsage(format!(
            "bandwidth '{s}' does not start with a number (accepted: 787, 787GB/s, 6300Gb/s, 6300Gbps)"
        ))
    })?;
    if !v.is_finite() || v < 0.0 {
        return Err(Error::InvalidUsage(format!(
            "bandwidth '{s}' must be a finite non-negative number"
        )));
    }
    let factor = match unit.trim() {
        "" | "GB/s" | "GBps" | "GB/sec" => 1.0,
        "Gb/s" | "Gbps" | "Gbit/s" | "Gb/sec" => 1.0 / GBIT_PER_GBYTE,
        other => {
            return Err(Error::InvalidUsage(format!(
                "bandwidth unit '{other}' in '{s}' is not accepted (accepted: GB/s, GBps for gigabytes per second; Gb/s, Gbps, Gbit/s for gigabits per second; case matters: B is byte, b is bit)"
            )));
        }
    };
    Ok(v * factor)
}

/// Which busbw figure a target is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// The lower of out-of-place and in-place busbw at the largest message size.
    Largest,
    /// nccl-tests' `# Avg bus bandwidth` (mean over every size and placement).
    Avg,
    /// The highest busbw of any size and placement.
    Peak,
}

impl Metric {
    fn describe(self) -> &'static str {
        match self {
            Metric::Largest => "busbw at the largest size (lower of out-of-place and in-place)",
            Metric::Avg => "nccl-tests' Avg bus bandwidth",
            Metric::Peak => "peak busbw",
        }
    }

    /// The figure for one run, GB/s.
    pub fn value(self, run: &Run) -> Option<f64> {
        match self {
            Metric::Largest => run.largest().and_then(Row::min_busbw),
            Metric::Avg => run.avg_busbw_gbyte_s,
            Metric::Peak => run.peak_busbw(),
        }
    }
}

/// Options for [`summarize`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Options {
    /// Minimum busbw, GB/s.
    pub expect_busbw_gbyte_s: Option<f64>,
    pub metric: Metric,
    /// The network name the plugin reports to NCCL.
    pub plugin_name: String,
    /// Fail unless NCCL's log shows every process used the plugin.
    pub require_plugin: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            expect_busbw_gbyte_s: None,
            metric: Metric::Largest,
            plugin_name: "switchless".to_string(),
            require_plugin: false,
        }
    }
}

/// Whether NCCL used the plugin, from its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginStatus {
    /// Every process that named its network named the plugin.
    Used,
    /// Some process used another network (NCCL's internal `IB` or `Socket`, or another plugin).
    NotUsed,
    /// NCCL loaded the plugin but no line says which network the communicators used
    /// (`NCCL_DEBUG_SUBSYS` without INIT on NCCL < 2.27).
    LoadedOnly,
    /// No NCCL log lines name a network (NCCL_DEBUG was off, or the logs were not given).
    Unknown,
}

impl PluginStatus {
    fn word(self) -> &'static str {
        match self {
            PluginStatus::Used => "used",
            PluginStatus::NotUsed => "NOT used",
            PluginStatus::LoadedOnly => "loaded (use not confirmed)",
            PluginStatus::Unknown => "unknown",
        }
    }
}

/// The network plugin verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginReport {
    pub expected: String,
    pub status: PluginStatus,
    /// Network name → processes that used it.
    pub networks: BTreeMap<String, usize>,
    /// Processes (host:pid) with network evidence.
    pub processes: usize,
    pub hosts: Vec<String>,
    /// ABI versions NCCL loaded the plugin with.
    pub abi_versions: Vec<u32>,
}

/// The result of the target comparison for one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetCheck {
    pub run: usize,
    pub metric: Metric,
    pub measured_gbyte_s: Option<f64>,
    pub expected_gbyte_s: f64,
    pub ok: bool,
}

/// Everything `switchless nccl-tests summarize` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub runs: Vec<Run>,
    pub nccl: NcclLog,
    pub plugin: PluginReport,
    pub targets: Vec<TargetCheck>,
    /// Each reason the summary fails (wrong elements, truncation, below target, plugin not used).
    pub problems: Vec<String>,
    /// Observations that do not fail the check.
    pub notes: Vec<String>,
}

impl Summary {
    /// True when nothing failed.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

fn plugin_report(log: &NcclLog, expected: &str) -> PluginReport {
    let mut networks: BTreeMap<String, usize> = BTreeMap::new();
    let mut processes = 0;
    let mut abis = BTreeSet::new();
    let mut loaded_expected = false;
    for p in log.processes.values() {
        if !p.networks.is_empty() {
            processes += 1;
        }
        for n in &p.networks {
            *networks.entry(n.clone()).or_default() += 1;
        }
        for (name, v) in &p.loaded {
            if name.eq_ignore_ascii_case(expected) {
                loaded_expected = true;
                abis.extend(v.iter().copied());
            }
        }
    }
    let status = if networks.is_empty() {
        if loaded_expected {
            PluginStatus::LoadedOnly
        } else {
            PluginStatus::Unknown
        }
    } else if networks.keys().all(|n| n.eq_ignore_ascii_case(expected)) {
        PluginStatus::Used
    } else {
        PluginStatus::NotUsed
    };
    PluginReport {
        expected: expected.to_string(),
        status,
        networks,
        processes,
        hosts: log.hosts().into_iter().map(str::to_string).collect(),
        abi_versions: abis.into_iter().collect(),
    }
}

/// Builds the summary of parsed files. Fails if no file holds an nccl-tests result table.
pub fn summarize(files: Vec<ParsedFile>, opts: &Options) -> Result<Summary> {
    let mut runs = Vec::new();
    let mut nccl = NcclLog::default();
    let sources: Vec<String> = files.iter().map(|f| f.source.clone()).collect();
    for f in files {
        runs.extend(f.runs.into_iter().filter(|r| {
            !r.rows.is_empty() || r.complete() || r.truncated_row.is_some() || r.test.is_some()
        }));
        nccl.merge(f.nccl);
    }
    if runs.is_empty() {
        return Err(Error::InvalidUsage(format!(
            "no nccl-tests output in {} (expected a run: '# nccl-tests version …' or a result table header '#  size  count  type  redop  root  time  algbw  busbw  #wrong …')",
            sources.join(", ")
        )));
    }
    let plugin = plugin_report(&nccl, &opts.plugin_name);
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let mut targets = Vec::new();

    for (i, r) in runs.iter().enumerate() {
        let label = format!(
            "run {} ({}, {}:{})",
            i + 1,
            r.name(),
            r.source,
            r.start_line
        );
        if r.rows.is_empty() {
            problems.push(format!("{label}: no result rows"));
        }
        for row in &r.rows {
            for (place, m) in row.placements() {
                if let Some(w) = m.wrong.filter(|w| *w > 0) {
                    problems.push(format!(
                        "{label}: {w} wrong elements at size {} B ({place}, line {})",
                        row.size_bytes, row.line
                    ));
                }
            }
        }
        if let Some(oob) = r.out_of_bounds.filter(|v| *v > 0) {
            problems.push(format!(
                "{label}: nccl-tests reports {oob} out-of-bounds (wrong) results"
            ));
        }
        if !r.complete() {
            let what = match &r.truncated_row {
                Some((line, _)) => format!("output cut off inside the row at line {line}"),
                None => "no '# Avg bus bandwidth' footer".to_string(),
            };
            problems.push(format!(
                "{label}: incomplete run ({what}; {} complete rows): the test crashed, hung or was killed",
                r.rows.len()
            ));
        }
        for e in &r.errors {
            problems.push(format!("{label}: nccl-tests error: {e}"));
        }
        if let Some(expected) = opts.expect_busbw_gbyte_s {
            let measured = opts.metric.value(r);
            let ok = measured.is_some_and(|m| m >= expected);
            if !ok {
                problems.push(match measured {
                    Some(m) => format!(
                        "{label}: {} is {m:.2} GB/s ({:.1} Gb/s), below the expected {expected:.2} GB/s ({:.1} Gb/s)",
                        opts.metric.describe(),
                        gbyte_to_gbit(m),
                        gbyte_to_gbit(expected)
                    ),
                    None => format!(
                        "{label}: no {} to compare with the expected {expected:.2} GB/s",
                        opts.metric.describe()
                    ),
                });
            }
            targets.push(TargetCheck {
                run: i + 1,
                metric: opts.metric,
                measured_gbyte_s: measured,
                expected_gbyte_s: expected,
                ok,
            });
        }
        if let (Some(avg), Some(mean)) = (r.avg_busbw_gbyte_s, r.mean_busbw()) {
            // The footer averages unrounded values; rows print 2 decimals (or fewer when large).
            if (avg - mean).abs() > 0.01 * avg.max(1.0) {
                notes.push(format!(
                    "{label}: footer Avg bus bandwidth {avg} GB/s differs from the mean of the rows ({mean:.3} GB/s): rows missing from the output?"
                ));
            }
        }
        if r.ranks.len() > 1 && r.hosts().len() == 1 && runs.len() > 1 {
            notes.push(format!(
                "{label}: all {} ranks on one host ({}); several single-host runs in one job usually mean nccl-tests was built without MPI=1 and each process ran alone",
                r.ranks.len(),
                r.hosts().into_iter().next().unwrap_or("?")
            ));
        }
    }

    match plugin.status {
        PluginStatus::Used => {}
        PluginStatus::NotUsed => {
            let others: Vec<&str> = plugin
                .networks
                .keys()
                .filter(|n| !n.eq_ignore_ascii_case(&opts.plugin_name))
                .map(String::as_str)
                .collect();
            let msg = format!(
                "NCCL used network {} instead of the '{}' plugin (set NCCL_NET_PLUGIN={} and check the plugin load lines; NCCL_NET={} makes a fallback a hard error)",
                others.join(", "),
                opts.plugin_name,
                opts.plugin_name,
                opts.plugin_name
            );
            if opts.require_plugin {
                problems.push(msg);
            } else {
                notes.push(msg);
            }
        }
        PluginStatus::LoadedOnly | PluginStatus::Unknown => {
            if opts.require_plugin {
                problems.push(format!(
                    "cannot confirm NCCL used the '{}' plugin: no 'Using network' line (run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and pass the NCCL_DEBUG_FILE logs too)",
                    opts.plugin_name
                ));
            }
        }
    }
    for f in &nccl.plugin_failures {
        notes.push(format!("NCCL plugin loading: {f}"));
    }
    Ok(Summary {
        runs,
        nccl,
        plugin,
        targets,
        problems,
        notes,
    })
}

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

    const HEADER: &str = "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ";

    #[test]
    fn header_layout() {
        let l = parse_header(HEADER.trim_start_matches('#'))
            .unwrap()
            .unwrap();
        assert_eq!(l.lead.len(), 5);
        assert_eq!(l.groups, 2);
        assert_eq!(l.group_len, 4);
        assert_eq!(l.columns(), 13);
        assert_eq!((l.algbw, l.busbw, l.wrong), (1, 2, Some(3)));
        assert!(!l.timestamp);
    }

    #[test]
    fn header_per_iteration_and_timestamp() {
        let h = " size count type redop root time algbw busbw #wrong i_min i_max i_p99 i_cv% time algbw busbw #wrong i_min i_max i_p99 i_cv% timestamp";
        let l = parse_header(h).unwrap().unwrap();
        assert_eq!(l.group_len, 8);
        assert!(l.timestamp);
        let row = "1024 256 float sum -1 10.1 0.10 0.19 0 9.0 11.0 12.0 3.1 10.2 0.10 0.19 0 9.0 11.0 12.0 3.1 2026-11-29 10:00:00";
        let r = parse_row(&l, 7, row).unwrap();
        assert_eq!(r.in_place.unwrap().busbw_gbyte_s, 0.19);
        assert_eq!(r.out_of_place.unwrap().wrong, Some(0));
    }

    #[test]
    fn old_header_without_root_and_error_column() {
        let h = " size count type redop time algbw busbw error time algbw busbw error";
        let l = parse_header(h).unwrap().unwrap();
        let r = parse_row(
            &l,
            1,
            "8 2 float sum 30.11 0.00 0.00 2e+00 29.90 0.00 0.00 0e+00",
        )
        .unwrap();
        assert_eq!(r.root, None);
        assert_eq!(r.out_of_place.unwrap().wrong, Some(2));
    }

    #[test]
    fn trailing_columns_after_the_groups() {
        let h = " size count type redop root time algbw busbw #wrong time algbw busbw #wrong algo proto nchannels";
        let l = parse_header(h).unwrap().unwrap();
        assert_eq!((l.groups, l.group_len), (2, 4));
        let r = parse_row(
            &l,
            1,
            "2097152 524288 float sum -1 87.02 24.10 45.18 0 86.52 24.24 45.45 0 RING SIMPLE 32",
        )
        .unwrap();
        assert_eq!(r.in_place.unwrap().busbw_gbyte_s, 45.45);
    }

    #[test]
    fn old_release_without_version_line() {
        // nccl-tests 2.13-era output: no version line, 1-byte PCI ids, two runs in one file.
        let run = "# nThread 1 nGpus 1 minBytes 536870912 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid     65 on node-a device  0 [0x8a] NVIDIA A800-SXM4-80GB
#  Rank  1 Group  0 Pid     66 on node-b device  0 [0x8f] NVIDIA A800-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
   536870912     134217728     float     sum      -1    24942   21.52   21.52      0    24966   21.50   21.50      0
  1073741824     268435456     float     sum      -1    49507   21.69   21.69      0    49613   21.64   21.64      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 21.5875
#
";
        let text = format!("{run}{run}");
        let p = parse_text("old", &text).unwrap();
        assert_eq!(p.runs.len(), 2);
        for r in &p.runs {
            assert_eq!(r.rows.len(), 2);
            assert_eq!(r.ranks[1].host, "node-b");
            assert_eq!(r.ranks[1].gpu, "NVIDIA A800-SXM4-80GB");
            assert!(r.complete());
            assert_eq!(r.test, None);
        }
        assert_eq!(p.runs[1].start_line, 15);
    }

    #[test]
    fn bad_header_is_an_error() {
        let e = parse_header(" size count flavour time algbw busbw #wrong").unwrap_err();
        assert!(e.contains("flavour"), "{e}");
        assert_eq!(parse_header(" Using devices").unwrap(), None);
    }

    #[test]
    fn row_values_and_na() {
        let l = parse_header(HEADER.trim_start_matches('#'))
            .unwrap()
            .unwrap();
        let r = parse_row(
            &l,
            3,
            "   536870912     134217728     float     sum      -1  1.3e+05  4097.1  7681.2    N/A   1364826  393.37  737.57    N/A",
        )
        .unwrap();
        let o = r.out_of_place.unwrap();
        assert_eq!(o.time_us, 1.3e5);
        assert_eq!(o.wrong, None);
        assert_eq!(r.in_place.unwrap().time_us, 1364826.0);
        assert_eq!(r.root, Some(-1));
        let e = parse_row(&l, 3, "1 2 float sum -1 1 2 x 0 1 2 3 0").unwrap_err();
        assert!(e.contains("busbw") && e.contains("'x'"), "{e}");
        let e = parse_row(&l, 3, "1 2 float sum -1 1 2 3 0.5 1 2 3 0").unwrap_err();
        assert!(e.contains("#wrong"), "{e}");
        let e = parse_row(&l, 3, "1 2 float sum -1 1 2 -3 0 1 2 3 0").unwrap_err();
        assert!(e.contains("non-negative"), "{e}");
    }

    #[test]
    fn launcher_prefixes() {
        assert_eq!(split_launcher_prefix("0: # Avg"), (Some("0"), "# Avg"));
        assert_eq!(
            split_launcher_prefix(" 12:   1024  256"),
            (Some("12"), "  1024  256")
        );
        assert_eq!(
            split_launcher_prefix("[1,0]<stdout>:# Avg"),
            (Some("1,0"), "# Avg")
        );
        assert_eq!(
            split_launcher_prefix("[1,15]<stderr>: x"),
            (Some("1,15"), "x")
        );
        assert_eq!(
            split_launcher_prefix("   1024   256"),
            (None, "   1024   256")
        );
        assert_eq!(
            split_launcher_prefix("[abc]<stdout>:x"),
            (None, "[abc]<stdout>:x")
        );
    }

    #[test]
    fn process_keys() {
        assert_eq!(
            process_key("b300-001:3810159:3810159 [7]"),
            "b300-001:3810159"
        );
        assert_eq!(process_key("1: b300-002:11:12 [0]"), "b300-002:11");
        assert_eq!(
            process_key("[2026-11-29 10:00:00] spark-a:5:6 [0]"),
            "spark-a:5"
        );
        assert_eq!(process_key("garbage"), "unknown");
    }

    #[test]
    fn nccl_lines() {
        let mut log = NcclLog::default();
        assert!(log.feed("h1:10:11 [0] NCCL INFO NET/Plugin: Loaded net plugin switchless (v11)"));
        assert!(
            log.feed("h1:10:11 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v12 symbol.")
        );
        assert!(log.feed("h1:10:11 [0] NCCL INFO Assigned NET plugin switchless to comm"));
        assert!(log.feed("h2:20:21 [0] NCCL INFO Using network IB"));
        assert!(log.feed("h2:20:21 [0] NCCL INFO NET/Plugin: Could not find: switchless libnccl-net-switchless.so"));
        assert!(log.feed(
            "[2026-11-29 10:00:00] h2:20:21 [0] misc/socket.cc:50 NCCL WARN Net : Connect failed"
        ));
        assert!(!log.feed("#  Rank  0 Group  0 Pid 10 on h1 device  0"));
        assert!(
            log.feed("h1:10:11 [0] NCCL INFO NET/switchless : connection to h2 via enp1s0f0np0")
        );
        assert!(log.feed(
            "h1:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/switchless/0/GDRDMA"
        ));
        assert!(log.feed(
            "h1:10:11 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/switchless/1"
        ));
        assert_eq!(log.net_prefix_lines.get("NET/switchless"), Some(&1));
        assert_eq!(log.net_prefix_lines.get("NET/Plugin"), Some(&3));
        assert_eq!(log.net_channels.get("switchless"), Some(&(2, 1)));
        log.lines -= 3;
        assert_eq!(log.lines, 6);
        assert_eq!(log.plugin_failures.len(), 1, "{:?}", log.plugin_failures);
        assert_eq!(log.warnings, vec!["Net : Connect failed".to_string()]);
        let p = plugin_report(&log, "switchless");
        assert_eq!(p.status, PluginStatus::NotUsed);
        assert_eq!(p.networks.get("IB"), Some(&1));
        assert_eq!(p.abi_versions, vec![11]);
        assert_eq!(p.hosts, vec!["h1".to_string(), "h2".to_string()]);
    }

    #[test]
    fn plugin_status_used_loaded_unknown() {
        let mut log = NcclLog::default();
        assert_eq!(
            plugin_report(&log, "switchless").status,
            PluginStatus::Unknown
        );
        log.feed("h1:1:1 [0] NCCL INFO NET/Plugin: Loaded net plugin Switchless (v10)");
        assert_eq!(
            plugin_report(&log, "switchless").status,
            PluginStatus::LoadedOnly
        );
        log.feed("h1:1:1 [0] NCCL INFO Using network Switchless");
        assert_eq!(plugin_report(&log, "switchless").status, PluginStatus::Used);
    }

    #[test]
    fn bandwidth_units() {
        assert_eq!(parse_bandwidth("787").unwrap(), 787.0);
        assert_eq!(parse_bandwidth("787GB/s").unwrap(), 787.0);
        assert_eq!(parse_bandwidth("787 GBps").unwrap(), 787.0);
        assert_eq!(parse_bandwidth("184Gb/s").unwrap(), 23.0);
        assert_eq!(parse_bandwidth("6400 Gbps").unwrap(), 800.0);
        assert_eq!(parse_bandwidth("1e3").unwrap(), 1000.0);
        assert!(
            parse_bandwidth("787 gb/s")
                .unwrap_err()
                .to_string()
                .contains("case matters")
        );
        assert!(parse_bandwidth("fast").is_err());
        assert!(parse_bandwidth("-5").is_err());
        assert!(parse_bandwidth("10 MB/s").is_err());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(536870912), "512 MiB");
        assert_eq!(human_bytes(17179869184), "16 GiB");
        assert_eq!(human_bytes(1536), "1.50 KiB");
    }

    fn table(rows: &[&str], footer: bool) -> String {
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

    const GOOD: &str = "        1024           256     float     sum      -1    10.00    0.10    2.00      0    10.00    0.10    2.00      0";

    #[test]
    fn malformed_row_in_the_middle_names_the_line() {
        let text = table(
            &[
                GOOD,
                "        2048           512     float     sum      -1    10.00   garbage",
                GOOD,
            ],
            true,
        );
        let e = parse_text("f.log", &text).unwrap_err().to_string();
        assert!(e.contains("f.log:6:"), "{e}");
        assert!(e.contains("expected 13 columns"), "{e}");
        assert!(e.contains("garbage"), "{e}");
    }

    #[test]
    fn malformed_row_before_footer_is_an_error() {
        let text = table(
            &[
                GOOD,
                "        2048           512     float     sum      -1    10.00   x",
            ],
            true,
        );
        assert!(parse_text("f", &text).is_err());
    }

    #[test]
    fn cut_row_at_the_end_is_truncation() {
        let text = table(
            &[
                GOOD,
                "        2048           512     float     sum      -1    10.00",
            ],
            false,
        );
        let p = parse_text("f", &text).unwrap();
        assert_eq!(p.runs.len(), 1);
        let r = &p.runs[0];
        assert_eq!(r.rows.len(), 1);
        assert_eq!(r.truncated_row.as_ref().map(|t| t.0), Some(6));
        assert!(!r.complete());
        let s = summarize(vec![p], &Options::default()).unwrap();
        assert!(!s.passed());
        assert!(s.problems[0].contains("incomplete"), "{:?}", s.problems);
    }

    #[test]
    fn row_cut_by_a_nccl_log_line_is_rejoined() {
        let text = table(
            &[
                GOOD,
                "        2048           512     float     sum      -1host-a:12:13 [0] NCCL INFO Channel 04/1 : 0[0] -> 1[0] [send] via NET/switchless/1",
                "host-b:22:23 [0] NCCL INFO Channel 04/1 : 1[0] -> 0[0] [send] via NET/switchless/1",
                "    10.00    0.20    4.00      0    10.00    0.20    4.00      0",
                GOOD,
            ],
            true,
        );
        let p = parse_text("f", &text).unwrap();
        let r = &p.runs[0];
        assert_eq!(r.rows.len(), 3);
        assert_eq!(r.rows[1].size_bytes, 2048);
        assert_eq!(r.rows[1].line, 6);
        assert_eq!(r.rows[1].in_place.unwrap().busbw_gbyte_s, 4.0);
        assert_eq!(p.nccl.lines, 2);
    }

    #[test]
    fn interleaved_runs_of_separate_processes() {
        // nccl-tests built without MPI=1 under `srun -l`: every task prints its own whole run.
        let text = table(&[GOOD, GOOD], true);
        let mut mixed = String::new();
        for l in text.lines() {
            mixed.push_str(&format!("0: {l}\n1: {l}\n"));
        }
        let p = parse_text("f", &mixed).unwrap();
        assert_eq!(p.runs.len(), 2);
        for r in &p.runs {
            assert_eq!(r.rows.len(), 2);
            assert!(r.complete());
        }
        assert_eq!((p.runs[0].start_line, p.runs[1].start_line), (1, 2));
    }

    #[test]
    fn two_runs_in_one_file() {
        let mut text = table(&[GOOD], true);
        text.push_str(&table(&[GOOD, GOOD], true));
        let p = parse_text("f", &text).unwrap();
        assert_eq!(p.runs.len(), 2);
        assert_eq!(p.runs[1].rows.len(), 2);
        assert_eq!(p.runs[1].start_line, 10);
    }

    #[test]
    fn no_table_is_an_error_for_summarize() {
        let p = parse_text("x", "hello\nworld\n").unwrap();
        let e = summarize(vec![p], &Options::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no nccl-tests output in x"), "{e}");
    }

    #[test]
    fn target_metrics() {
        let text = table(
            &[
                "        1024           256     float     sum      -1    10.00    0.10    1.00      0    10.00    0.10    3.00      0",
                "        2048           512     float     sum      -1    10.00    0.10    5.00      0    10.00    0.10    4.00      0",
            ],
            true,
        );
        let p = parse_text("f", &text).unwrap();
        let r = &p.runs[0];
        assert_eq!(Metric::Largest.value(r), Some(4.0));
        assert_eq!(Metric::Peak.value(r), Some(5.0));
        assert_eq!(Metric::Avg.value(r), Some(2.0));
        let mut o = Options {
            expect_busbw_gbyte_s: Some(4.0),
            ..Options::default()
        };
        assert!(summarize(vec![p.clone()], &o).unwrap().passed());
        o.expect_busbw_gbyte_s = Some(4.01);
        let s = summarize(vec![p.clone()], &o).unwrap();
        assert!(!s.passed());
        assert!(
            s.problems[0].contains("below the expected 4.01 GB/s"),
            "{:?}",
            s.problems
        );
        o.metric = Metric::Avg;
        o.expect_busbw_gbyte_s = Some(2.0);
        assert!(summarize(vec![p], &o).unwrap().passed());
    }

    #[test]
    fn wrong_elements_fail() {
        let text = table(
            &[
                "        1024           256     float     sum      -1    10.00    0.10    1.00      0    10.00    0.10    3.00      7",
            ],
            true,
        );
        let s = summarize(vec![parse_text("f", &text).unwrap()], &Options::default()).unwrap();
        assert!(!s.passed());
        assert!(
            s.problems[0].contains("7 wrong elements at size 1024 B (in-place"),
            "{:?}",
            s.problems
        );
    }
}
