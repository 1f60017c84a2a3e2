//! Typed configuration read from the environment at `init`.
//!
//! One [`Config`] is built per plugin `init` by [`Config::from_env`]; [`Config::from_vars`] does the
//! same from any lookup function so tests never touch the process environment.
//!
//! NCCL-compatible variables keep NCCL's names, defaults and ranges (nccl-net-abi.md §3.9,
//! `src/transport/net_ib/connect.cc` `NCCL_PARAM`s); ours start with `NCCL_SWITCHLESS_`.
//! Where NCCL warns and falls back to its default on a bad value, we fail closed: the whole
//! configuration is refused with one [`Error::InvalidUsage`] whose text names every bad variable,
//! its value and the accepted forms. An empty value counts as unset, as in NCCL.
//!
//! The table of variables for users is `docs/readme/config.md`.
#![forbid(unsafe_code)]

mod hca;
mod values;

pub use hca::{
    HCA_GRAMMAR, HcaEntry, HcaFilter, MAX_HCA_ENTRIES, MAX_HCA_NAME_LEN, MAX_PLANE, MAX_RAIL,
};

use crate::error::{Error, Result};
use std::time::Duration;
use values::{parse_bool, parse_bytes, parse_duration, parse_int_in};

/// Prefix of the plugin's own variables.
pub const OWN_PREFIX: &str = "NCCL_SWITCHLESS_";

/// Every variable [`Config`] reads, in documentation order.
pub const VARIABLES: &[&str] = &[
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_TC",
    "NCCL_IB_SL",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_SWITCHLESS_TRANSPORT",
    "NCCL_SWITCHLESS_CONNECT_TIMEOUT",
    "NCCL_SWITCHLESS_REQUEST_TIMEOUT",
    "NCCL_SWITCHLESS_TCP_STREAMS",
    "NCCL_SWITCHLESS_TCP_THREADS",
    "NCCL_SWITCHLESS_TCP_FALLBACK",
    "NCCL_SWITCHLESS_MIN_CHUNK",
    "NCCL_SWITCHLESS_LOG_ROUTES",
];

/// Default `NCCL_IB_TIMEOUT` (4.096 µs × 2^20 ≈ 4.3 s per try).
pub const DEFAULT_IB_TIMEOUT: u8 = 20;
/// Default `NCCL_IB_RETRY_CNT`.
pub const DEFAULT_IB_RETRY_CNT: u8 = 7;
/// Default `NCCL_IB_QPS_PER_CONNECTION`.
pub const DEFAULT_QPS_PER_CONNECTION: u8 = 1;
/// Largest `NCCL_IB_QPS_PER_CONNECTION` (NCCL's `NCCL_IB_MAX_QPS`).
pub const MAX_QPS_PER_CONNECTION: u8 = 128;
/// Default `NCCL_SWITCHLESS_CONNECT_TIMEOUT`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Shortest accepted connect timeout.
pub const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Longest accepted connect timeout.
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Largest `NCCL_SWITCHLESS_TCP_STREAMS`.
pub const MAX_TCP_STREAMS: u8 = 64;
/// Largest `NCCL_SWITCHLESS_TCP_THREADS` (the TCP I/O pool's size).
pub const MAX_TCP_THREADS: u8 = 64;
/// Default `NCCL_SWITCHLESS_MIN_CHUNK`, bytes (128 KiB).
pub const DEFAULT_MIN_CHUNK: u64 = 128 << 10;
/// Smallest accepted `NCCL_SWITCHLESS_MIN_CHUNK`, bytes (4 KiB).
pub const MIN_MIN_CHUNK: u64 = 4 << 10;
/// Largest accepted `NCCL_SWITCHLESS_MIN_CHUNK`, bytes (1 GiB).
pub const MAX_MIN_CHUNK: u64 = 1 << 30;

/// Which data transport to use (`NCCL_SWITCHLESS_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportMode {
    /// RDMA when a usable RDMA port reaches the peer, TCP otherwise (only with `TCP_FALLBACK=1`).
    #[default]
    Auto,
    /// RDMA only; a peer without an RDMA path is an error.
    Rdma,
    /// TCP sockets only (no RDMA devices are opened).
    Tcp,
}

impl TransportMode {
    /// The value as written in the environment.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportMode::Auto => "auto",
            TransportMode::Rdma => "rdma",
            TransportMode::Tcp => "tcp",
        }
    }
}

/// TCP streams per connection (`NCCL_SWITCHLESS_TCP_STREAMS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TcpStreams {
    /// One stream per path to the peer (per local link that reaches it).
    #[default]
    Auto,
    /// This many streams, 1..=64, spread over the paths.
    Fixed(u8),
}

/// The plugin's configuration. Every field has the documented default; see `docs/readme/config.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `NCCL_IB_HCA`: devices and ports we may use, and their rail/plane ids.
    pub ib_hca: HcaFilter,
    /// `NCCL_IB_GID_INDEX`: a fixed GID index, or `None` (-1, default) to pick the GID in the
    /// subnet shared with the peer.
    pub ib_gid_index: Option<u8>,
    /// `NCCL_IB_TC`: GRH traffic class, or `None` (-1, default: NCCL's communicator traffic class, else 0).
    pub ib_tc: Option<u8>,
    /// `NCCL_IB_SL`: service level 0..=15, or `None` (-1, default: communicator traffic class, else 0).
    pub ib_sl: Option<u8>,
    /// `NCCL_IB_TIMEOUT`: QP local ACK timeout exponent (4.096 µs × 2^t), 0..=31 (0 = infinite).
    pub ib_timeout: u8,
    /// `NCCL_IB_RETRY_CNT`: QP transport retries, 0..=7.
    pub ib_retry_cnt: u8,
    /// `NCCL_IB_QPS_PER_CONNECTION`: RC QPs per connection per path, 1..=128.
    pub ib_qps_per_connection: u8,
    /// `NCCL_SWITCHLESS_TRANSPORT`.
    pub transport: TransportMode,
    /// `NCCL_SWITCHLESS_CONNECT_TIMEOUT`: deadline for one connection's set-up.
    pub connect_timeout: Duration,
    /// `NCCL_SWITCHLESS_REQUEST_TIMEOUT`: a send or receive that makes no progress for this long fails
    /// with a timeout instead of waiting forever (a peer or link that died while this side had
    /// nothing in flight). `None` (the default, `0`): wait forever, like NCCL's own transport.
    pub request_timeout: Option<Duration>,
    /// `NCCL_SWITCHLESS_TCP_STREAMS`.
    pub tcp_streams: TcpStreams,
    /// `NCCL_SWITCHLESS_TCP_THREADS`: I/O worker threads of the process-wide pool that drives every
    /// TCP stream, 1..=64; `None` (`auto`, the default): the CPUs this process may use, at most 8.
    pub tcp_threads: Option<u8>,
    /// `NCCL_SWITCHLESS_TCP_FALLBACK`: with `transport = Auto`, carry a connection over TCP when no
    /// RDMA path reaches the peer (default `false`: such a connection fails with a clear error).
    pub tcp_fallback: bool,
    /// `NCCL_SWITCHLESS_MIN_CHUNK`: smallest piece, in bytes, a message is split into when striped
    /// over several paths; smaller messages go over one path.
    pub min_chunk: u64,
    /// `NCCL_SWITCHLESS_LOG_ROUTES`: log the full route table at INFO (default: only one line per connection).
    pub log_routes: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ib_hca: HcaFilter::all(),
            ib_gid_index: None,
            ib_tc: None,
            ib_sl: None,
            ib_timeout: DEFAULT_IB_TIMEOUT,
            ib_retry_cnt: DEFAULT_IB_RETRY_CNT,
            ib_qps_per_connection: DEFAULT_QPS_PER_CONNECTION,
            transport: TransportMode::Auto,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: None,
            tcp_streams: TcpStreams::Auto,
            tcp_threads: None,
            tcp_fallback: false,
            min_chunk: DEFAULT_MIN_CHUNK,
            log_routes: false,
        }
    }
}

/// Accepted forms, quoted in errors.
const FORM_AUTO_U8: &str = "-1 (automatic) or 0..=255, decimal or 0x hexadecimal";
const FORM_SL: &str = "-1 (automatic) or 0..=15";
const FORM_TIMEOUT: &str = "0..=31 (exponent: 4.096 us x 2^value; 0 means infinite)";
const FORM_RETRY: &str = "0..=7";
const FORM_QPS: &str = "1..=128";
const FORM_TRANSPORT: &str = "auto, rdma or tcp";
const FORM_CONNECT_TIMEOUT: &str =
    "100ms..=60m: a number of milliseconds, or a number with the unit ms, s or m (e.g. 30s)";
const FORM_REQUEST_TIMEOUT: &str = "0 (off: wait forever) or 1s..=24h: a number of milliseconds, or a number with the unit ms, s or m (e.g. 300s)";
/// Shortest accepted request timeout (shorter ones would fail healthy but slow transfers).
pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest accepted request timeout.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
const FORM_STREAMS: &str = "auto or 1..=64";
const FORM_THREADS: &str = "auto or 1..=64 (threads)";
const FORM_BOOL: &str = "0 or 1";
const FORM_MIN_CHUNK: &str = "4K..=1G bytes: a number of bytes, or with the suffix K/KiB, M/MiB or G/GiB (powers of 1024), e.g. 128K";

impl Config {
    /// Reads the process environment. Also warns (through `tracing`) about set `NCCL_SWITCHLESS_*`
    /// variables that this version does not know, which are usually typos.
    pub fn from_env() -> Result<Config> {
        let unknown =
            unknown_own_vars(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()));
        for name in unknown {
            tracing::warn!(
                "{name} is set but is not a switchless variable; known: {}",
                VARIABLES
                    .iter()
                    .filter(|v| v.starts_with(OWN_PREFIX))
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Config::from_vars(|name| match std::env::var(name) {
            Ok(v) => Some(v),
            // Not Unicode: hand the lossy text to the parser, which will refuse it by name.
            Err(std::env::VarError::NotUnicode(os)) => Some(os.to_string_lossy().into_owned()),
            Err(std::env::VarError::NotPresent) => None,
        })
    }

    /// Builds the configuration from `get(name)`, which returns a variable's value or `None` when
    /// unset. Fails with one [`Error::InvalidUsage`] listing every bad variable.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut cfg = Config::default();
        let mut problems: Vec<String> = Vec::new();
        // Present and non-blank values only; NCCL treats an empty value as unset.
        let value = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let mut bad = |name: &str, v: &str, why: &str, forms: &str| {
            problems.push(format!("{name}={v:?} is invalid: {why}; accepted: {forms}"));
        };

        if let Some(v) = value("NCCL_IB_HCA") {
            match HcaFilter::parse_inner(&v) {
                Ok(f) => cfg.ib_hca = f,
                Err(why) => bad("NCCL_IB_HCA", &v, &why, HCA_GRAMMAR),
            }
        }
        for (name, slot, hi, forms) in [
            (
                "NCCL_IB_GID_INDEX",
                &mut cfg.ib_gid_index,
                255,
                FORM_AUTO_U8,
            ),
            ("NCCL_IB_TC", &mut cfg.ib_tc, 255, FORM_AUTO_U8),
            ("NCCL_IB_SL", &mut cfg.ib_sl, 15, FORM_SL),
        ] {
            if let Some(v) = value(name) {
                match parse_int_in(&v, -1, hi) {
                    Ok(-1) => *slot = None,
                    Ok(n) => *slot = u8::try_from(n).ok(),
                    Err(why) => bad(name, &v, &why, forms),
                }
            }
        }
        for (name, slot, lo, hi, forms) in [
            ("NCCL_IB_TIMEOUT", &mut cfg.ib_timeout, 0, 31, FORM_TIMEOUT),
            ("NCCL_IB_RETRY_CNT", &mut cfg.ib_retry_cnt, 0, 7, FORM_RETRY),
            (
                "NCCL_IB_QPS_PER_CONNECTION",
                &mut cfg.ib_qps_per_connection,
                1,
                i64::from(MAX_QPS_PER_CONNECTION),
                FORM_QPS,
            ),
        ] {
            if let Some(v) = value(name) {
                match parse_int_in(&v, lo, hi).map(u8::try_from) {
                    Ok(Ok(n)) => *slot = n,
                    Ok(Err(_)) => bad(name, &v, "out of range", forms),
                    Err(why) => bad(name, &v, &why, forms),
                }
            }
        }

        if let Some(v) = value("NCCL_SWITCHLESS_TRANSPORT") {
            match v.trim().to_ascii_lowercase().as_str() {
                "auto" => cfg.transport = TransportMode::Auto,
                "rdma" => cfg.transport = TransportMode::Rdma,
                "tcp" => cfg.transport = TransportMode::Tcp,
                _ => bad(
                    "NCCL_SWITCHLESS_TRANSPORT",
                    &v,
                    "unknown transport",
                    FORM_TRANSPORT,
                ),
            }
        }
        if let Some(v) = value("NCCL_SWITCHLESS_REQUEST_TIMEOUT") {
            const VAR: &str = "NCCL_SWITCHLESS_REQUEST_TIMEOUT";
            if v.trim() == "0" {
                cfg.request_timeout = None;
            } else {
                match parse_duration(&v) {
                    Ok(d) if (MIN_REQUEST_TIMEOUT..=MAX_REQUEST_TIMEOUT).contains(&d) => {
                        cfg.request_timeout = Some(d)
                    }
                    Ok(d) => bad(
                        VAR,
                        &v,
                        &format!("{} ms is out of range", d.as_millis()),
                        FORM_REQUEST_TIMEOUT,
                    ),
                    Err(why) => bad(VAR, &v, &why, FORM_REQUEST_TIMEOUT),
                }
            }
        }
        if let Some(v) = value("NCCL_SWITCHLESS_CONNECT_TIMEOUT") {
            match parse_duration(&v) {
                Ok(d) if (MIN_CONNECT_TIMEOUT..=MAX_CONNECT_TIMEOUT).contains(&d) => {
                    cfg.connect_timeout = d
                }
                Ok(d) => bad(
                    "NCCL_SWITCHLESS_CONNECT_TIMEOUT",
                    &v,
                    &format!("{} ms is out of range", d.as_millis()),
                    FORM_CONNECT_TIMEOUT,
                ),
                Err(why) => bad(
                    "NCCL_SWITCHLESS_CONNECT_TIMEOUT",
                    &v,
                    &why,
                    FORM_CONNECT_TIMEOUT,
                ),
            }
        }
        if let Some(v) = value("NCCL_SWITCHLESS_TCP_STREAMS") {
            if v.trim().eq_ignore_ascii_case("auto") {
                cfg.tcp_streams = TcpStreams::Auto;
            } else {
                match parse_int_in(&v, 1, i64::from(MAX_TCP_STREAMS)).map(u8::try_from) {
                    Ok(Ok(n)) => cfg.tcp_streams = TcpStreams::Fixed(n),
                    Ok(Err(_)) => bad(
                        "NCCL_SWITCHLESS_TCP_STREAMS",
                        &v,
                        "out of range",
                        FORM_STREAMS,
                    ),
                    Err(why) => bad("NCCL_SWITCHLESS_TCP_STREAMS", &v, &why, FORM_STREAMS),
                }
            }
        }
        if let Some(v) = value("NCCL_SWITCHLESS_TCP_THREADS") {
            const VAR: &str = "NCCL_SWITCHLESS_TCP_THREADS";
            if v.trim().eq_ignore_ascii_case("auto") {
                cfg.tcp_threads = None;
            } else {
                match parse_int_in(&v, 1, i64::from(MAX_TCP_THREADS)).map(u8::try_from) {
                    Ok(Ok(n)) => cfg.tcp_threads = Some(n),
                    Ok(Err(_)) => bad(VAR, &v, "out of range", FORM_THREADS),
                    Err(why) => bad(VAR, &v, &why, FORM_THREADS),
                }
            }
        }
        for (name, slot) in [
            ("NCCL_SWITCHLESS_TCP_FALLBACK", &mut cfg.tcp_fallback),
            ("NCCL_SWITCHLESS_LOG_ROUTES", &mut cfg.log_routes),
        ] {
            if let Some(v) = value(name) {
                match parse_bool(&v) {
                    Ok(b) => *slot = b,
                    Err(why) => bad(name, &v, &why, FORM_BOOL),
                }
            }
        }
        if let Some(v) = value("NCCL_SWITCHLESS_MIN_CHUNK") {
            match parse_bytes(&v) {
                Ok(n) if (MIN_MIN_CHUNK..=MAX_MIN_CHUNK).contains(&n) => cfg.min_chunk = n,
                Ok(n) => bad(
                    "NCCL_SWITCHLESS_MIN_CHUNK",
                    &v,
                    &format!("{n} bytes is out of range"),
                    FORM_MIN_CHUNK,
                ),
                Err(why) => bad("NCCL_SWITCHLESS_MIN_CHUNK", &v, &why, FORM_MIN_CHUNK),
            }
        }
        if cfg.transport == TransportMode::Rdma && cfg.tcp_fallback {
            problems.push(
                "NCCL_SWITCHLESS_TRANSPORT=rdma contradicts NCCL_SWITCHLESS_TCP_FALLBACK=1; \
                 accepted: TRANSPORT=auto with TCP_FALLBACK=1, or TRANSPORT=rdma with TCP_FALLBACK=0"
                    .into(),
            );
        }

        if problems.is_empty() {
            Ok(cfg)
        } else {
            Err(Error::InvalidUsage(problems.join("; ")))
        }
    }

    /// One line naming every setting, for the init log.
    pub fn summary(&self) -> String {
        let opt = |v: Option<u8>| v.map_or_else(|| "auto".to_string(), |v| v.to_string());
        format!(
            "NCCL_IB_HCA={} NCCL_IB_GID_INDEX={} NCCL_IB_TC={} NCCL_IB_SL={} NCCL_IB_TIMEOUT={} \
             NCCL_IB_RETRY_CNT={} NCCL_IB_QPS_PER_CONNECTION={} transport={} connect_timeout={} ms \
             request_timeout={} tcp_streams={} tcp_threads={} tcp_fallback={} min_chunk={} bytes \
             log_routes={}",
            self.ib_hca,
            opt(self.ib_gid_index),
            opt(self.ib_tc),
            opt(self.ib_sl),
            self.ib_timeout,
            self.ib_retry_cnt,
            self.ib_qps_per_connection,
            self.transport.as_str(),
            self.connect_timeout.as_millis(),
            self.request_timeout
                .map_or_else(|| "off".to_string(), |d| format!("{} ms", d.as_millis())),
            match self.tcp_streams {
                TcpStreams::Auto => "auto".to_string(),
                TcpStreams::Fixed(n) => n.to_string(),
            },
            opt(self.tcp_threads),
            u8::from(self.tcp_fallback),
            self.min_chunk,
            u8::from(self.log_routes),
        )
    }
}

/// The names among `names` that start with `NCCL_SWITCHLESS_` but are not in [`VARIABLES`]
/// (likely typos), sorted.
pub fn unknown_own_vars(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with(OWN_PREFIX) && !VARIABLES.contains(&n.as_str()))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(|k| m.get(k).cloned())
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        match cfg(pairs) {
            Err(Error::InvalidUsage(m)) => m,
            other => panic!("expected InvalidUsage for {pairs:?}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_nccl() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert!(c.ib_hca.is_all());
        assert_eq!(c.ib_gid_index, None);
        assert_eq!(c.ib_tc, None);
        assert_eq!(c.ib_sl, None);
        assert_eq!(c.ib_timeout, 20);
        assert_eq!(c.ib_retry_cnt, 7);
        assert_eq!(c.ib_qps_per_connection, 1);
        assert_eq!(c.transport, TransportMode::Auto);
        assert_eq!(c.connect_timeout, Duration::from_secs(30));
        assert_eq!(c.tcp_streams, TcpStreams::Auto);
        assert_eq!(c.tcp_threads, None);
        assert!(!c.tcp_fallback);
        assert_eq!(c.min_chunk, 131072);
        assert!(!c.log_routes);
    }

    #[test]
    fn empty_values_count_as_unset() {
        let all: Vec<(&str, &str)> = VARIABLES.iter().map(|v| (*v, "")).collect();
        assert_eq!(cfg(&all).unwrap(), Config::default());
        let blank: Vec<(&str, &str)> = VARIABLES.iter().map(|v| (*v, "  ")).collect();
        assert_eq!(cfg(&blank).unwrap(), Config::default());
    }

    #[test]
    fn every_variable_set() {
        let c = cfg(&[
            ("NCCL_IB_HCA", "=mlx5_0:1:0:0,mlx5_1:1:1:0"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_TC", "0x68"),
            ("NCCL_IB_SL", "5"),
            ("NCCL_IB_TIMEOUT", "22"),
            ("NCCL_IB_RETRY_CNT", "0"),
            ("NCCL_IB_QPS_PER_CONNECTION", "128"),
            ("NCCL_SWITCHLESS_TRANSPORT", "TCP"),
            ("NCCL_SWITCHLESS_CONNECT_TIMEOUT", "5s"),
            ("NCCL_SWITCHLESS_REQUEST_TIMEOUT", "300s"),
            ("NCCL_SWITCHLESS_TCP_STREAMS", "8"),
            ("NCCL_SWITCHLESS_TCP_THREADS", "3"),
            ("NCCL_SWITCHLESS_TCP_FALLBACK", "1"),
            ("NCCL_SWITCHLESS_MIN_CHUNK", "1M"),
            ("NCCL_SWITCHLESS_LOG_ROUTES", "1"),
        ])
        .unwrap();
        assert_eq!(c.ib_hca.rail_plane("mlx5_1", 1), (Some(1), Some(0)));
        assert!(!c.ib_hca.matches("mlx5_10", 1));
        assert_eq!(c.ib_gid_index, Some(3));
        assert_eq!(c.ib_tc, Some(104));
        assert_eq!(c.ib_sl, Some(5));
        assert_eq!(c.ib_timeout, 22);
        assert_eq!(c.ib_retry_cnt, 0);
        assert_eq!(c.ib_qps_per_connection, 128);
        assert_eq!(c.transport, TransportMode::Tcp);
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.request_timeout, Some(Duration::from_secs(300)));
        assert_eq!(c.tcp_streams, TcpStreams::Fixed(8));
        assert_eq!(c.tcp_threads, Some(3));
        assert!(c.tcp_fallback);
        assert_eq!(c.min_chunk, 1 << 20);
        assert!(c.log_routes);
        let s = c.summary();
        assert!(s.contains("NCCL_IB_HCA==mlx5_0:1:0:0,mlx5_1:1:1:0"), "{s}");
        assert!(s.contains("connect_timeout=5000 ms"), "{s}");
        assert!(s.contains("tcp_threads=3"), "{s}");
    }

    #[test]
    fn minus_one_means_automatic() {
        let c = cfg(&[
            ("NCCL_IB_GID_INDEX", "-1"),
            ("NCCL_IB_TC", "-1"),
            ("NCCL_IB_SL", "-1"),
        ])
        .unwrap();
        assert_eq!((c.ib_gid_index, c.ib_tc, c.ib_sl), (None, None, None));
        assert_eq!(
            cfg(&[("NCCL_SWITCHLESS_TCP_STREAMS", "auto")])
                .unwrap()
                .tcp_streams,
            TcpStreams::Auto
        );
        let c = cfg(&[("NCCL_SWITCHLESS_TCP_THREADS", "AUTO")]).unwrap();
        assert_eq!(c.tcp_threads, None);
        assert!(c.summary().contains("tcp_threads=auto"));
        assert_eq!(
            cfg(&[("NCCL_SWITCHLESS_TCP_THREADS", "64")])
                .unwrap()
                .tcp_threads,
            Some(64)
        );
    }

    #[test]
    fn bad_values_fail_closed_naming_variable_value_and_forms() {
        let cases: &[(&str, &str, &str)] = &[
            ("NCCL_IB_GID_INDEX", "256", "0..=255"),
            ("NCCL_IB_GID_INDEX", "-2", "0..=255"),
            ("NCCL_IB_GID_INDEX", "abc", "0..=255"),
            ("NCCL_IB_TC", "99999999999999999999", "too large"),
            ("NCCL_IB_TC", "010", "octal"),
            ("NCCL_IB_SL", "16", "0..=15"),
            ("NCCL_IB_TIMEOUT", "32", "0..=31"),
            ("NCCL_IB_TIMEOUT", "-1", "0..=31"),
            ("NCCL_IB_TIMEOUT", "20 s", "0..=31"),
            ("NCCL_IB_RETRY_CNT", "8", "0..=7"),
            ("NCCL_IB_QPS_PER_CONNECTION", "0", "1..=128"),
            ("NCCL_IB_QPS_PER_CONNECTION", "129", "1..=128"),
            ("NCCL_IB_HCA", "mlx5_0:0", "1..=255"),
            ("NCCL_SWITCHLESS_TRANSPORT", "verbs", "auto, rdma or tcp"),
            ("NCCL_SWITCHLESS_CONNECT_TIMEOUT", "0", "100ms"),
            ("NCCL_SWITCHLESS_CONNECT_TIMEOUT", "2h", "unit"),
            ("NCCL_SWITCHLESS_CONNECT_TIMEOUT", "61m", "out of range"),
            (
                "NCCL_SWITCHLESS_CONNECT_TIMEOUT",
                "99999999999999999999s",
                "too large",
            ),
            ("NCCL_SWITCHLESS_TCP_STREAMS", "0", "auto or 1..=64"),
            ("NCCL_SWITCHLESS_TCP_STREAMS", "65", "auto or 1..=64"),
            (
                "NCCL_SWITCHLESS_TCP_THREADS",
                "0",
                "auto or 1..=64 (threads)",
            ),
            (
                "NCCL_SWITCHLESS_TCP_THREADS",
                "65",
                "auto or 1..=64 (threads)",
            ),
            (
                "NCCL_SWITCHLESS_TCP_THREADS",
                "-1",
                "auto or 1..=64 (threads)",
            ),
            (
                "NCCL_SWITCHLESS_TCP_THREADS",
                "many",
                "auto or 1..=64 (threads)",
            ),
            ("NCCL_SWITCHLESS_TCP_FALLBACK", "2", "0 or 1"),
            ("NCCL_SWITCHLESS_LOG_ROUTES", "maybe", "0 or 1"),
            ("NCCL_SWITCHLESS_MIN_CHUNK", "1K", "out of range"),
            ("NCCL_SWITCHLESS_MIN_CHUNK", "2G", "out of range"),
            ("NCCL_SWITCHLESS_MIN_CHUNK", "128KB", "ambiguous"),
            ("NCCL_SWITCHLESS_MIN_CHUNK", "-4K", "4K..=1G"),
        ];
        for (name, value, needle) in cases {
            let m = err(&[(name, value)]);
            assert!(m.contains(&format!("{name}={value:?}")), "{m}");
            assert!(m.contains(needle), "{name}={value}: {m}");
            assert!(m.contains("accepted:"), "{m}");
        }
    }

    #[test]
    fn several_bad_variables_give_one_error_naming_each() {
        let m = err(&[
            ("NCCL_IB_SL", "99"),
            ("NCCL_IB_TC", "x"),
            ("NCCL_IB_HCA", "^"),
        ]);
        for name in ["NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_HCA"] {
            assert!(m.contains(name), "{m}");
        }
    }

    #[test]
    fn rdma_only_with_fallback_is_a_contradiction() {
        let m = err(&[
            ("NCCL_SWITCHLESS_TRANSPORT", "rdma"),
            ("NCCL_SWITCHLESS_TCP_FALLBACK", "1"),
        ]);
        assert!(m.contains("contradicts"), "{m}");
    }

    #[test]
    fn whitespace_around_values_is_ignored() {
        let c = cfg(&[
            ("NCCL_IB_TIMEOUT", " 18 "),
            ("NCCL_SWITCHLESS_TRANSPORT", " rdma\t"),
            ("NCCL_SWITCHLESS_MIN_CHUNK", " 64 K "),
        ])
        .unwrap();
        assert_eq!(c.ib_timeout, 18);
        assert_eq!(c.transport, TransportMode::Rdma);
        assert_eq!(c.min_chunk, 64 << 10);
    }

    #[test]
    fn typos_of_own_variables_are_found() {
        let names = [
            "NCCL_SWITCHLESS_TRANSPROT",
            "NCCL_SWITCHLESS_TRANSPORT",
            "NCCL_IB_HCA",
            "PATH",
        ];
        assert_eq!(
            unknown_own_vars(names.iter().map(|s| s.to_string())),
            vec!["NCCL_SWITCHLESS_TRANSPROT".to_string()]
        );
    }

    #[test]
    fn documentation_lists_every_variable() {
        let doc = include_str!("../../docs/readme/config.md");
        for v in VARIABLES {
            assert!(
                doc.contains(&format!("`{v}`")),
                "{v} missing from docs/readme/config.md"
            );
        }
    }

    proptest! {
        #[test]
        fn never_panics_on_any_value(idx in 0..VARIABLES.len(), value in ".*") {
            let name = VARIABLES[idx];
            let r = Config::from_vars(|k| (k == name).then(|| value.clone()));
            if let Err(e) = r {
                let is_usage = matches!(e, Error::InvalidUsage(_));
                prop_assert!(is_usage);
                prop_assert!(e.to_string().contains(name));
            }
        }

        #[test]
        fn never_panics_on_numberish_values(idx in 0..VARIABLES.len(), value in "[-+ ]?(0x)?[0-9a-fA-F]{0,25}[ kKmMgGsib]{0,3}") {
            let name = VARIABLES[idx];
            let _ = Config::from_vars(|k| (k == name).then(|| value.clone()));
        }
    }

    #[test]
    fn request_timeout_is_off_by_default_and_checked() {
        assert_eq!(cfg(&[]).unwrap().request_timeout, None);
        assert_eq!(
            cfg(&[("NCCL_SWITCHLESS_REQUEST_TIMEOUT", "0")])
                .unwrap()
                .request_timeout,
            None
        );
        assert_eq!(
            cfg(&[("NCCL_SWITCHLESS_REQUEST_TIMEOUT", "2500")])
                .unwrap()
                .request_timeout,
            Some(Duration::from_millis(2500))
        );
        for bad in ["500ms", "25h", "-1", "soon", "10 parsecs"] {
            let e = cfg(&[("NCCL_SWITCHLESS_REQUEST_TIMEOUT", bad)]).unwrap_err();
            let m = e.to_string();
            assert!(m.contains("NCCL_SWITCHLESS_REQUEST_TIMEOUT"), "{m}");
            assert!(m.contains(bad), "{m}");
            assert!(m.contains("1s..=24h"), "{m}");
        }
    }
}
