//! The plugin's own counters for `switchless watch`: the snapshot files every process writes under
//! `NCCL_SWITCHLESS_METRICS_DIR` (`transport::metrics::Snapshot`), summed per peer and path over the
//! processes of the host, turned into rates between two reads ([`report`]), a table
//! ([`render_text`]), the Prometheus text format for node_exporter's textfile collector or
//! OpenMetrics ([`exposition`]), and the series of a finished run for a plot ([`series`]).
//!
//! Names follow Prometheus conventions: prefix `switchless_`, base units in the name (`_bytes`,
//! `_seconds`, `_bits_per_second`), `_total` on counters, one label set per path (`host`, `peer`,
//! `direction`, `nccl_dev`, `netdev`, `rdma_dev`, `pci_root`, `local`, `remote`, `kind`).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::transport::metrics::{Build, PathId, PathTotal, SNAPSHOT_SCHEMA, Snapshot};

/// The snapshots found in `dir` (files `switchless-metrics-*.json`), oldest process first, and
/// one line per file that could not be read.
pub fn read_dir(dir: &Path) -> Result<(Vec<Snapshot>, Vec<String>)> {
    let rd = std::fs::read_dir(dir).map_err(|e| {
        Error::InvalidUsage(format!("--metrics-dir {}: cannot read: {e}", dir.display()))
    })?;
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        if !name.starts_with("switchless-metrics-") || !name.ends_with(".json") {
            continue;
        }
        let p = ent.path();
        match std::fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Snapshot>(&b).map_err(|e| e.to_string()))
        {
            Ok(s) if s.schema == SNAPSHOT_SCHEMA => out.push(s),
            Ok(s) => bad.push(format!(
                "{}: schema {:?}, this watch reads {SNAPSHOT_SCHEMA}",
                p.display(),
                s.schema
            )),
            Err(e) => bad.push(format!("{}: {e}", p.display())),
        }
    }
    out.sort_by(|a, b| (&a.host, a.pid).cmp(&(&b.host, b.pid)));
    Ok((out, bad))
}

/// A path summed over the processes of one host.
type Key = (String, PathId);

fn sum_paths(snaps: &[Snapshot]) -> BTreeMap<Key, PathTotal> {
    let mut m: BTreeMap<Key, PathTotal> = BTreeMap::new();
    for s in snaps {
        for p in &s.paths {
            let t = m
                .entry((s.host.clone(), p.id.clone()))
                .or_insert_with(|| PathTotal {
                    id: p.id.clone(),
                    ..PathTotal::default()
                });
            t.connections_live += p.connections_live;
            t.connections_closed += p.connections_closed;
            t.carrying += p.carrying;
            t.down += p.down;
            t.standby += p.standby;
            t.weight_mbps = t.weight_mbps.saturating_add(p.weight_mbps);
            t.sent_bytes = t.sent_bytes.wrapping_add(p.sent_bytes);
            t.received_bytes = t.received_bytes.wrapping_add(p.received_bytes);
            t.sent_pieces = t.sent_pieces.wrapping_add(p.sent_pieces);
            t.received_pieces = t.received_pieces.wrapping_add(p.received_pieces);
            t.failovers = t.failovers.wrapping_add(p.failovers);
            t.failbacks = t.failbacks.wrapping_add(p.failbacks);
            t.errors = t.errors.wrapping_add(p.errors);
            t.last_failover_unix_ms = t.last_failover_unix_ms.max(p.last_failover_unix_ms);
            t.last_failback_unix_ms = t.last_failback_unix_ms.max(p.last_failback_unix_ms);
        }
    }
    m
}

/// One NCCL device of one host, summed over its processes (each process pins its own memory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceRow {
    pub host: String,
    pub nccl_dev: usize,
    pub name: String,
    /// Live registrations (`regMr`) and the bytes NCCL asked to register.
    pub registrations: u64,
    pub registered_bytes: u64,
    /// Bytes the fabric holds pinned on the device now (a shared range once, whole pages).
    pub pinned_bytes: u64,
}

fn sum_devices(snaps: &[Snapshot]) -> Vec<DeviceRow> {
    let mut m: BTreeMap<(String, usize, String), DeviceRow> = BTreeMap::new();
    for s in snaps {
        for d in &s.devices {
            let r = m
                .entry((s.host.clone(), d.nccl_dev, d.name.clone()))
                .or_insert_with(|| DeviceRow {
                    host: s.host.clone(),
                    nccl_dev: d.nccl_dev,
                    name: d.name.clone(),
                    ..DeviceRow::default()
                });
            r.registrations = r.registrations.saturating_add(d.registrations);
            r.registered_bytes = r.registered_bytes.saturating_add(d.registered_bytes);
            r.pinned_bytes = r.pinned_bytes.saturating_add(d.pinned_bytes);
        }
    }
    m.into_values().collect()
}

/// One path in a report.
#[derive(Debug, Clone, Serialize)]
pub struct PathRow {
    pub host: String,
    #[serde(flatten)]
    pub total: PathTotal,
    /// Gb/s (10^9 bit/s) of data the path carried between the two reads (sent for `send`, received
    /// for `recv`); None on the first read or when no process wrote between them.
    pub gbps: Option<f64>,
    /// Its share of the peer's rate in that direction, percent.
    pub share_pct: Option<f64>,
    /// The kernel's rate of the path's netdev (or RDMA port) in that direction, Gb/s, when `watch`
    /// read it (everything on that netdev, all processes and peers).
    pub kernel_gbps: Option<f64>,
}

/// One process: which plugin and NCCL it runs, and whether it still writes.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessRow {
    pub host: String,
    pub pid: u32,
    pub time_unix_ms: u64,
    /// The plugin closed (its last snapshot).
    pub last: bool,
    pub build: Build,
}

/// The plugin's side of one `watch` interval (`--json`: the `plugin` member).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub dir: String,
    pub processes: Vec<ProcessRow>,
    pub paths: Vec<PathRow>,
    /// Per NCCL device, summed over the host's processes.
    pub devices: Vec<DeviceRow>,
    /// Files that could not be read.
    pub unreadable: Vec<String>,
    /// Processes whose plugin or NCCL differs from the most common one (attestation).
    pub mismatches: Vec<String>,
}

/// The rates between two reads of the directory (`before` empty: totals only). `kernel` gives the
/// kernel's Gb/s of a netdev or RDMA device for a direction (`send`/`recv`), when known.
pub fn report(
    dir: &Path,
    before: &[Snapshot],
    now: &[Snapshot],
    unreadable: Vec<String>,
    kernel: &dyn Fn(&PathId) -> Option<f64>,
) -> Report {
    let b = sum_paths(now);
    // Seconds between the two reads of each process (by its own clock), and which moved.
    let dt: BTreeMap<(String, u32), f64> = now
        .iter()
        .filter_map(|s| {
            let p = before.iter().find(|o| o.host == s.host && o.pid == s.pid)?;
            let d = s.time_unix_ms.checked_sub(p.time_unix_ms)?;
            (d > 0).then(|| ((s.host.clone(), s.pid), d as f64 / 1e3))
        })
        .collect();
    // Per path: the sum of each process's rate, each over its own interval (processes write on
    // their own clocks: one read a snapshot later than another moved more bytes in a longer
    // window). A path new to a process moved all of its bytes in that process's interval.
    let rate = |host: &str, id: &PathId| -> Option<f64> {
        let moved = |x: &PathTotal| {
            if id.direction == "send" {
                x.sent_bytes
            } else {
                x.received_bytes
            }
        };
        let mut sum = None;
        for s in now.iter().filter(|s| s.host == host) {
            let Some(t) = s.paths.iter().find(|p| p.id == *id) else {
                continue;
            };
            let Some(w) = dt.get(&(s.host.clone(), s.pid)) else {
                continue;
            };
            let old = before
                .iter()
                .find(|o| o.host == s.host && o.pid == s.pid)
                .and_then(|o| o.paths.iter().find(|p| p.id == *id))
                .map_or(0, moved);
            let Some(d) = moved(t).checked_sub(old) else {
                continue;
            };
            *sum.get_or_insert(0.0) += d as f64 * 8.0 / 1e9 / w;
        }
        sum
    };
    let mut paths: Vec<PathRow> = b
        .iter()
        .map(|((host, id), t)| {
            let gbps = rate(host, id);
            PathRow {
                host: host.clone(),
                total: t.clone(),
                gbps,
                share_pct: None,
                kernel_gbps: kernel(id),
            }
        })
        .collect();
    // Shares within (host, direction, peer).
    let mut sums: BTreeMap<(String, String, String), f64> = BTreeMap::new();
    for p in &paths {
        if let Some(g) = p.gbps {
            *sums
                .entry((
                    p.host.clone(),
                    p.total.id.direction.clone(),
                    p.total.id.peer.clone(),
                ))
                .or_default() += g;
        }
    }
    for p in &mut paths {
        let s = sums
            .get(&(
                p.host.clone(),
                p.total.id.direction.clone(),
                p.total.id.peer.clone(),
            ))
            .copied()
            .unwrap_or(0.0);
        p.share_pct = p.gbps.filter(|_| s > 0.0).map(|g| g / s * 100.0);
    }
    let builds: Vec<(String, u32, Build)> = now
        .iter()
        .map(|s| (s.host.clone(), s.pid, s.build.clone()))
        .collect();
    Report {
        dir: dir.display().to_string(),
        processes: now
            .iter()
            .map(|s| ProcessRow {
                host: s.host.clone(),
                pid: s.pid,
                time_unix_ms: s.time_unix_ms,
                last: s.last,
                build: s.build.clone(),
            })
            .collect(),
        paths,
        devices: sum_devices(now),
        unreadable,
        mismatches: mismatches(&builds),
    }
}

/// One line per process whose plugin (version, commit, library hash) or NCCL (library hash)
/// differs from what most processes run; empty when all agree. Processes are named `host:pid`.
pub fn mismatches(builds: &[(String, u32, Build)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: &str, key: &dyn Fn(&Build) -> String| {
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for (_, _, b) in builds {
            *count.entry(key(b)).or_default() += 1;
        }
        if count.len() < 2 {
            return;
        }
        // The most common value; a tie goes to the first in order (stable, named in the line).
        let Some((common, n)) = count.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) else {
            return;
        };
        for (host, pid, b) in builds {
            let k = key(b);
            if &k != common {
                out.push(format!(
                    "{host}:{pid} runs {what} {k}, {n} of {} process(es) run {common}",
                    builds.len()
                ));
            }
        }
    };
    check("plugin", &|b| {
        format!(
            "{} (commit {}, sha256 {})",
            b.version, b.commit, b.plugin_sha256
        )
    });
    check("NCCL", &|b| {
        format!("{} (sha256 {})", b.nccl_path, b.nccl_sha256)
    });
    out
}

fn g(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "?".into())
}

/// `12.3 GB` style total (10^9 bytes).
fn gb(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / 1e9)
}

/// MiB (2^20 bytes), three decimals.
fn mib(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / f64::from(1u32 << 20))
}

/// The text form: one line per path, grouped by host, direction and peer.
pub fn render_text(r: &Report) -> String {
    let mut rows: Vec<Vec<String>> = vec![
        [
            "DIR",
            "PEER",
            "PATH",
            "KIND",
            "Gb/s",
            "SHARE",
            "KERNEL",
            "WEIGHT",
            "STATE",
            "FAILOVERS",
            "ERRORS",
            "TOTAL GB",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    ];
    for p in &r.paths {
        let t = &p.total;
        let dev = if t.id.rdma_dev.is_empty() {
            t.id.netdev.clone()
        } else {
            format!("{}/{}", t.id.netdev, t.id.rdma_dev)
        };
        let state = if t.connections_live == 0 {
            "closed".to_string()
        } else if t.down > 0 {
            format!("down {}/{}", t.down, t.connections_live)
        } else if t.carrying == 0 && t.standby > 0 {
            "standby".to_string()
        } else {
            "up".to_string()
        };
        let moved = if t.id.direction == "send" {
            t.sent_bytes
        } else {
            t.received_bytes
        };
        rows.push(vec![
            t.id.direction.clone(),
            t.id.peer.clone(),
            format!("{dev} {} -> {}", t.id.local, t.id.remote),
            t.id.kind.clone(),
            g(p.gbps),
            p.share_pct
                .map(|s| format!("{s:.0}%"))
                .unwrap_or_else(|| "?".into()),
            g(p.kernel_gbps),
            format!("{:.1}", t.weight_mbps as f64 / 1000.0),
            state,
            format!("{}/{}", t.failovers, t.failbacks),
            t.errors.to_string(),
            gb(moved),
        ]);
    }
    let ncol = rows[0].len();
    let widths: Vec<usize> = (0..ncol)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plugin counters from {} ({} process(es)); Gb/s = 10^9 bit/s of data per path (sent for send, \
         received for recv), SHARE of the peer's rate, KERNEL = the netdev's rate in that direction \
         (all traffic), WEIGHT = stripe weight Gb/s, FAILOVERS = failovers/failbacks, TOTAL GB = 10^9 bytes",
        r.dir,
        r.processes.len()
    );
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if (4..).contains(&i) && i != 8 {
                    format!("{c:>w$}", w = widths[i])
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    if r.paths.is_empty() {
        let _ = writeln!(
            out,
            "no plugin connection yet (are the ranks run with NCCL_SWITCHLESS_METRICS_DIR={}?)",
            r.dir
        );
    }
    for d in r
        .devices
        .iter()
        .filter(|d| d.registrations > 0 || d.pinned_bytes > 0)
    {
        let _ = writeln!(
            out,
            "device {} ({}) on {}: {} registrations, {} MiB registered, {} MiB pinned",
            d.nccl_dev,
            d.name,
            d.host,
            d.registrations,
            mib(d.registered_bytes),
            mib(d.pinned_bytes)
        );
    }
    for u in &r.unreadable {
        let _ = writeln!(out, "unreadable: {u}");
    }
    for m in &r.mismatches {
        let _ = writeln!(out, "MISMATCH {m}");
    }
    out
}

/// Which exposition format [`exposition`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (node_exporter's textfile collector reads this).
    Prometheus,
    /// OpenMetrics 1.0 text (`# EOF` at the end, counter families named without `_total`).
    OpenMetrics,
}

/// A label value with `\`, `"` and newlines escaped.
fn esc(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let v: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
        .collect();
    format!("{{{}}}", v.join(","))
}

/// Families in order, each with its samples.
struct Families {
    fmt: Format,
    out: String,
}

impl Families {
    /// Starts a family `name` (without `_total` for counters) of `kind` (`counter`, `gauge`,
    /// `info`-like gauges are plain gauges).
    fn family(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
        if samples.is_empty() {
            return;
        }
        let (fam, sample) = match (self.fmt, kind) {
            (Format::Prometheus, "counter") => (format!("{name}_total"), format!("{name}_total")),
            (Format::OpenMetrics, "counter") => (name.to_string(), format!("{name}_total")),
            _ => (name.to_string(), name.to_string()),
        };
        let _ = writeln!(self.out, "# HELP {fam} {help}");
        let _ = writeln!(self.out, "# TYPE {fam} {kind}");
        if self.fmt == Format::OpenMetrics {
            if let Some(unit) = unit_of(name) {
                let _ = writeln!(self.out, "# UNIT {fam} {unit}");
            }
        }
        for (l, v) in samples {
            let _ = writeln!(self.out, "{sample}{l} {}", num(*v));
        }
    }
}

/// The OpenMetrics unit of a family whose name ends in it.
fn unit_of(name: &str) -> Option<&'static str> {
    ["bytes", "seconds"]
        .into_iter()
        .find(|u| name.ends_with(&format!("_{u}")))
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The report as Prometheus or OpenMetrics text: per path (summed over the host's processes)
/// bytes, pieces, failovers, failbacks, errors, stripe weight, connections by state and the
/// times of the last failover and failback; per NCCL device registrations, registered and pinned
/// bytes; per process the build (`switchless_build_info`).
pub fn exposition(r: &Report, fmt: Format) -> String {
    let mut f = Families {
        fmt,
        out: String::new(),
    };
    let path_labels = |p: &PathRow| {
        let t = &p.total.id;
        let dev = t.nccl_dev.to_string();
        labels(&[
            ("host", &p.host),
            ("peer", &t.peer),
            ("direction", &t.direction),
            ("nccl_dev", &dev),
            ("netdev", &t.netdev),
            ("rdma_dev", &t.rdma_dev),
            ("pci_root", &t.pci_root),
            ("local", &t.local),
            ("remote", &t.remote),
            ("kind", &t.kind),
        ])
    };
    let per_path = |v: &dyn Fn(&PathTotal) -> Option<f64>| -> Vec<(String, f64)> {
        r.paths
            .iter()
            .filter_map(|p| v(&p.total).map(|x| (path_labels(p), x)))
            .collect()
    };
    type Counter<'a> = (&'a str, &'a str, &'a dyn Fn(&PathTotal) -> u64);
    let counters: [Counter<'_>; 7] = [
        (
            "switchless_path_sent_bytes",
            "Data bytes whose send on the path completed.",
            &|t| t.sent_bytes,
        ),
        (
            "switchless_path_received_bytes",
            "Data bytes that arrived on the path.",
            &|t| t.received_bytes,
        ),
        (
            "switchless_path_sent_pieces",
            "Stripe pieces sent on the path.",
            &|t| t.sent_pieces,
        ),
        (
            "switchless_path_received_pieces",
            "Stripe pieces received on the path.",
            &|t| t.received_pieces,
        ),
        (
            "switchless_path_failovers",
            "Times the path failed and its work moved to the survivors.",
            &|t| t.failovers,
        ),
        (
            "switchless_path_failbacks",
            "Times the path came back after a failover.",
            &|t| t.failbacks,
        ),
        (
            "switchless_path_errors",
            "Error completions on the path.",
            &|t| t.errors,
        ),
    ];
    for (name, help, v) in counters {
        f.family(name, "counter", help, &per_path(&|t| Some(v(t) as f64)));
    }
    f.family(
        "switchless_path_stripe_weight_bits_per_second",
        "gauge",
        "Stripe weight of the path in the last message, summed over live connections.",
        &per_path(&|t| Some(t.weight_mbps as f64 * 1e6)),
    );
    let mut conns = Vec::new();
    for p in &r.paths {
        let l = path_labels(p);
        let t = &p.total;
        for (state, n) in [
            ("live", t.connections_live),
            ("carrying", t.carrying),
            ("down", t.down),
            ("standby", t.standby),
            ("closed", t.connections_closed),
        ] {
            let mut l = l.clone();
            l.pop();
            l.push_str(&format!(",state=\"{state}\"}}"));
            conns.push((l, n as f64));
        }
    }
    f.family(
        "switchless_path_connections",
        "gauge",
        "Connections using the path, by state: live, carrying and down (live ones now), standby (live, or closed as one), closed.",
        &conns,
    );
    f.family(
        "switchless_path_last_failover_timestamp_seconds",
        "gauge",
        "Unix time of the path's last failover.",
        &per_path(&|t| t.last_failover_unix_ms.map(|ms| ms as f64 / 1e3)),
    );
    f.family(
        "switchless_path_last_failback_timestamp_seconds",
        "gauge",
        "Unix time of the path's last failback.",
        &per_path(&|t| t.last_failback_unix_ms.map(|ms| ms as f64 / 1e3)),
    );
    type Gauge<'a> = (&'a str, &'a str, &'a dyn Fn(&DeviceRow) -> u64);
    let gauges: [Gauge<'_>; 3] = [
        (
            "switchless_device_registrations",
            "Live registrations (regMr) on the NCCL device.",
            &|d| d.registrations,
        ),
        (
            "switchless_device_registered_bytes",
            "Bytes NCCL registered on the device, summed per registration.",
            &|d| d.registered_bytes,
        ),
        (
            "switchless_device_pinned_bytes",
            "Bytes pinned on the device now: a range shared by several registrations once, in whole pages.",
            &|d| d.pinned_bytes,
        ),
    ];
    for (name, help, v) in gauges {
        let samples: Vec<(String, f64)> = r
            .devices
            .iter()
            .map(|d| {
                let dev = d.nccl_dev.to_string();
                (
                    labels(&[("host", &d.host), ("nccl_dev", &dev), ("device", &d.name)]),
                    v(d) as f64,
                )
            })
            .collect();
        f.family(name, "gauge", help, &samples);
    }
    let info: Vec<(String, f64)> = r
        .processes
        .iter()
        .map(|p| {
            let pid = p.pid.to_string();
            (
                labels(&[
                    ("host", &p.host),
                    ("pid", &pid),
                    ("version", &p.build.version),
                    ("commit", &p.build.commit),
                    ("plugin_sha256", &p.build.plugin_sha256),
                    ("nccl_sha256", &p.build.nccl_sha256),
                ]),
                1.0,
            )
        })
        .collect();
    f.family(
        "switchless_build_info",
        "gauge",
        "The plugin and NCCL a process runs (1 per process).",
        &info,
    );
    if fmt == Format::OpenMetrics {
        f.out.push_str("# EOF\n");
    }
    f.out
}

/// Writes `text` to `path` through a temporary file and a rename (the textfile collector must
/// never read half a file).
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    // Never through a link planted at the temporary name: removed, then created anew.
    let _ = std::fs::remove_file(&tmp);
    let create = || {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o644)
            .open(&tmp)
    };
    create()
        .and_then(|mut f| {
            use std::io::Write as _;
            f.write_all(text.as_bytes())
        })
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::System(format!("writing {}: {e}", path.display())))
}

/// One point of a path's series: seconds since the first snapshot and Gb/s since the previous.
pub type Point = (f64, f64);

/// Gb/s per path over time from a sequence of directory reads (one process's history lines, each
/// a read of its own).
pub fn series(reads: &[Vec<Snapshot>]) -> BTreeMap<String, Vec<Point>> {
    let mut out: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    let t0 = reads
        .iter()
        .flat_map(|r| r.iter().map(|s| s.time_unix_ms))
        .min()
        .unwrap_or(0);
    for w in reads.windows(2) {
        let r = report(Path::new(""), &w[0], &w[1], Vec::new(), &|_| None);
        let t = w[1].iter().map(|s| s.time_unix_ms).max().unwrap_or(t0);
        for p in r.paths {
            let Some(gbps) = p.gbps else { continue };
            let id = &p.total.id;
            let name = format!(
                "{} {} {} {} -> {}",
                p.host, id.direction, id.netdev, id.local, id.remote
            );
            out.entry(name)
                .or_default()
                .push(((t.saturating_sub(t0)) as f64 / 1e3, gbps));
        }
    }
    out
}

/// Draws Gb/s per path over time from every `*.history.jsonl` in `dir` into the SVG `out`; the
/// number of lines drawn. Each process's paths are drawn on their own (`host pid direction …`).
pub fn plot_history(dir: &Path, out: &Path) -> Result<usize> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| Error::InvalidUsage(format!("{}: cannot read: {e}", dir.display())))?;
    let mut lines = Vec::new();
    let mut files: Vec<_> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".history.jsonl"))
        .collect();
    files.sort();
    let mut t_first = u64::MAX;
    let mut per_file = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Error::System(format!("reading {}: {e}", f.display())))?;
        let reads: Vec<Vec<Snapshot>> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Snapshot>(l).ok())
            .map(|s| vec![s])
            .collect();
        if let Some(t) = reads.iter().flatten().map(|s| s.time_unix_ms).min() {
            t_first = t_first.min(t);
        }
        per_file.push(reads);
    }
    for reads in &per_file {
        let offset = reads
            .iter()
            .flatten()
            .map(|s| s.time_unix_ms)
            .min()
            .unwrap_or(t_first)
            .saturating_sub(t_first) as f64
            / 1e3;
        let pid = reads.first().and_then(|r| r.first()).map_or(0, |s| s.pid);
        for (name, pts) in series(reads) {
            lines.push(crate::tools::plot::TimeSeries {
                label: format!("pid {pid} {name}"),
                points: pts.into_iter().map(|(t, g)| (t + offset, g)).collect(),
            });
        }
    }
    if lines.is_empty() {
        return Err(Error::InvalidUsage(format!(
            "no history with two snapshots in {} (files *.history.jsonl, written by ranks run with \
             NCCL_SWITCHLESS_METRICS_DIR)",
            dir.display()
        )));
    }
    let svg = crate::tools::plot::time_svg(
        "switchless: data per path (plugin counters)",
        "Gb/s (10^9 bit/s)",
        &lines,
    )?;
    std::fs::write(out, svg)
        .map_err(|e| Error::System(format!("writing {}: {e}", out.display())))?;
    Ok(lines.len())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn path(dir: &str, netdev: &str, sent: u64, received: u64) -> PathTotal {
        PathTotal {
            id: PathId {
                direction: dir.into(),
                peer: "10.0.0.2".into(),
                nccl_dev: 0,
                netdev: netdev.into(),
                rdma_dev: String::new(),
                pci_root: "pci0000:00".into(),
                local: "10.0.0.1/30".into(),
                remote: "10.0.0.2".into(),
                kind: "tcp".into(),
            },
            connections_live: 1,
            carrying: 1,
            sent_bytes: sent,
            received_bytes: received,
            ..PathTotal::default()
        }
    }

    fn snap(pid: u32, t: u64, paths: Vec<PathTotal>) -> Snapshot {
        Snapshot {
            schema: SNAPSHOT_SCHEMA.into(),
            host: "h".into(),
            pid,
            time_unix_ms: t,
            interval_ms: 1000,
            last: false,
            build: Build {
                version: "0.1.0".into(),
                commit: "abc".into(),
                plugin_sha256: "p1".into(),
                nccl_sha256: "n1".into(),
                ..Build::default()
            },
            devices: Vec::new(),
            connections: Vec::new(),
            paths,
        }
    }

    #[test]
    fn rates_and_shares_per_path_summed_over_processes() {
        let a = vec![
            snap(
                1,
                1000,
                vec![path("send", "a", 0, 0), path("send", "b", 0, 0)],
            ),
            snap(2, 1000, vec![path("send", "a", 0, 0)]),
        ];
        let b = vec![
            snap(
                1,
                2000,
                vec![
                    path("send", "a", 1_000_000_000, 0),
                    path("send", "b", 1_000_000_000, 0),
                ],
            ),
            snap(2, 2000, vec![path("send", "a", 1_000_000_000, 0)]),
        ];
        let r = report(Path::new("d"), &a, &b, Vec::new(), &|_| Some(1.5));
        assert_eq!(r.paths.len(), 2);
        assert_eq!(r.paths[0].gbps, Some(16.0), "2 GB in 1 s on path a");
        assert_eq!(r.paths[1].gbps, Some(8.0));
        let share = r.paths[0].share_pct.unwrap();
        assert!((share - 66.666).abs() < 0.01, "{share}");
        assert!(r.mismatches.is_empty());
        let text = render_text(&r);
        assert!(text.contains("16.000"), "{text}");
    }

    #[test]
    fn each_process_rate_counts_over_its_own_interval() {
        // Both processes send 1 GB/s; the second was read 100 ms earlier in its writing cycle
        // (1.2 s between its snapshots, 1.3 s for the first). Summing the bytes over the longest
        // interval said 15.38 Gb/s.
        let a = vec![
            snap(1, 1000, vec![path("send", "a", 0, 0)]),
            snap(2, 1100, vec![path("send", "a", 100_000_000, 0)]),
        ];
        let b = vec![
            snap(1, 2300, vec![path("send", "a", 1_300_000_000, 0)]),
            snap(2, 2300, vec![path("send", "a", 1_300_000_000, 0)]),
        ];
        let r = report(Path::new("d"), &a, &b, Vec::new(), &|_| None);
        let g = r.paths[0].gbps.unwrap();
        assert!((g - 16.0).abs() < 1e-9, "{g}");
    }

    #[test]
    fn device_figures_are_summed_over_processes_and_exported() {
        use crate::transport::metrics::DeviceSnap;
        let dev = |registrations, registered_bytes, pinned_bytes| DeviceSnap {
            nccl_dev: 0,
            name: "sl0".into(),
            registrations,
            registered_bytes,
            pinned_bytes,
        };
        let mut a = snap(1, 1000, Vec::new());
        a.devices = vec![dev(2, 2 << 20, 1 << 20)];
        let mut b = snap(2, 1000, Vec::new());
        b.devices = vec![dev(1, 4096, 8192)];
        let r = report(Path::new("d"), &[], &[a, b], Vec::new(), &|_| None);
        assert_eq!(r.devices.len(), 1);
        let d = &r.devices[0];
        assert_eq!(
            (d.registrations, d.registered_bytes, d.pinned_bytes),
            (3, (2 << 20) + 4096, (1 << 20) + 8192)
        );
        let text = exposition(&r, Format::Prometheus);
        assert!(
            text.contains("# TYPE switchless_device_pinned_bytes gauge"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "switchless_device_pinned_bytes{{host=\"h\",nccl_dev=\"0\",device=\"sl0\"}} {}",
                (1 << 20) + 8192
            )),
            "{text}"
        );
        let om = exposition(&r, Format::OpenMetrics);
        assert!(
            om.contains("# UNIT switchless_device_pinned_bytes bytes"),
            "{om}"
        );
        assert!(
            render_text(&r).contains("3 registrations, 2.004 MiB registered, 1.008 MiB pinned")
        );
    }

    #[test]
    fn a_process_with_another_plugin_or_nccl_is_named() {
        let mut c = snap(3, 0, Vec::new());
        c.build.plugin_sha256 = "p2".into();
        let mut d = snap(4, 0, Vec::new());
        d.build.nccl_sha256 = "n2".into();
        let v = [snap(1, 0, Vec::new()), snap(2, 0, Vec::new()), c, d];
        let builds: Vec<_> = v
            .iter()
            .map(|s| (s.host.clone(), s.pid, s.build.clone()))
            .collect();
        let m = mismatches(&builds);
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m[0].starts_with("h:3 runs plugin 0.1.0 (commit abc, sha256 p2)"),
            "{m:?}"
        );
        assert!(m[1].starts_with("h:4 runs NCCL"), "{m:?}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(num(3.0), "3");
        assert_eq!(num(0.5), "0.5");
    }
}
