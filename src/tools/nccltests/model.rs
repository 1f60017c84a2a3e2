//! The parsed data: runs, their rows and measurements, the ranks that ran them, what one file
//! holds, and the bandwidth units (nccl-tests' GB/s, link rates' Gb/s).
#![forbid(unsafe_code)]

use std::collections::BTreeSet;

use serde::Serialize;

use super::nccl_log::NcclLog;
use crate::error::{Error, Result};

/// Gigabits per gigabyte: nccl-tests' GB is 10^9 bytes, so GB/s × 8 = Gb/s exactly.
pub const GBIT_PER_GBYTE: f64 = 8.0;

/// GB/s (nccl-tests' unit) to Gb/s (link rates).
pub fn gbyte_to_gbit(gbyte_per_s: f64) -> f64 {
    gbyte_per_s * GBIT_PER_GBYTE
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
    pub(super) fn new(source: &str, line: usize) -> Self {
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

/// What one file holds: nccl-tests runs and NCCL log evidence.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ParsedFile {
    pub source: String,
    pub runs: Vec<Run>,
    pub nccl: NcclLog,
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
