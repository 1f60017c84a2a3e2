//! The verdict over parsed files: which network NCCL used, the target comparison, and every
//! problem (wrong elements, truncation, below target, plugin not used) and note.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::model::{ParsedFile, Row, Run, gbyte_to_gbit};
use super::nccl_log::NcclLog;
use crate::error::{Error, Result};

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
    pub(super) fn describe(self) -> &'static str {
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
    pub(super) fn word(self) -> &'static str {
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
            // The remedy follows the cause NCCL logged: a library it could not find is a path
            // problem, not a missing NCCL_NET_PLUGIN.
            let not_found = nccl
                .plugin_failures
                .iter()
                .any(|f| f.starts_with("NET/Plugin: Could not find:"));
            let fix = if not_found {
                format!(
                    "NCCL could not find libnccl-net-{0}.so: put its directory on LD_LIBRARY_PATH of every rank, \
                     run ldconfig after make install, or set NCCL_NET_PLUGIN to its full path",
                    opts.plugin_name
                )
            } else if nccl.plugin_failures.is_empty() && nccl.net_plugin_env.is_empty() {
                format!(
                    "set NCCL_NET_PLUGIN={} for every rank (no plugin was asked for) and check the plugin load lines",
                    opts.plugin_name
                )
            } else {
                "the plugin load lines below say why it was not used".to_string()
            };
            let msg = format!(
                "NCCL used network {} instead of the '{}' plugin ({fix}; NCCL_NET={} makes a fallback a hard error)",
                others.join(", "),
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
    // Attestation: every rank must run the same plugin and the same libnccl.
    let builds: Vec<(String, u32, crate::transport::metrics::Build)> = nccl
        .builds
        .iter()
        .map(|(k, b)| {
            let (host, pid) = k.rsplit_once(':').unwrap_or((k.as_str(), "0"));
            (host.to_string(), pid.parse().unwrap_or(0), b.clone())
        })
        .collect();
    for m in crate::tools::metrics::mismatches(&builds) {
        problems.push(format!(
            "{m}: a rank loaded another library (check LD_LIBRARY_PATH, NCCL_NET_PLUGIN and the install on that node)"
        ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::nccltests::fixtures::{GOOD, table};
    use crate::tools::nccltests::table::parse_text;

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
    fn a_rank_with_another_plugin_build_fails_the_summary() {
        let text = table(&[GOOD], true);
        let init = |host: &str, sha: &str| {
            format!(
                "{host}:7:7 [0] NCCL INFO NET/switchless: switchless 0.1.0 commit abc plugin /p.so sha256 {sha} \
                 nccl /n.so sha256 n1 initialized comm_id=0x1 devices=2\n"
            )
        };
        let same = format!("{}{}{text}", init("h1", "p1"), init("h2", "p1"));
        let s = summarize(vec![parse_text("f", &same).unwrap()], &Options::default()).unwrap();
        assert_eq!(s.nccl.builds.len(), 2);
        assert!(s.passed(), "{:?}", s.problems);
        let other = format!(
            "{}{}{}{text}",
            init("h1", "p1"),
            init("h2", "p1"),
            init("h3", "p2")
        );
        let s = summarize(vec![parse_text("f", &other).unwrap()], &Options::default()).unwrap();
        assert!(!s.passed());
        assert!(
            s.problems[0].starts_with("h3:7 runs plugin 0.1.0 (commit abc, sha256 p2), 2 of 3"),
            "{:?}",
            s.problems
        );
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
