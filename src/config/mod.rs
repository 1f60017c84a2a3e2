//! Typed configuration read from the environment at `init`.
//!
//! One [`Config`] is built per plugin `init` by [`Config::from_env`]; [`Config::from_vars`] does the
//! same from any lookup function so tests never touch the process environment.
//!
//! Every variable is one row of the `variables!` table below: its name, default, accepted forms,
//! effect, parser and log form. [`Config`], its `Default`, [`VARIABLES`], [`Config::from_vars`],
//! [`Config::summary`] and the table in `docs/reference/environment.md` (generated, checked by a test) all
//! read that row, so adding a variable means adding a row (and its parser, if it is a new kind).
//!
//! NCCL-compatible variables keep NCCL's names, defaults and ranges (its IB transport's
//! `NCCL_PARAM`s in `src/transport/net_ib/`); ours start with `NCCL_SWITCHLESS_`. Where NCCL warns
//! and falls back to its default on a bad value, we fail closed: the whole configuration is refused
//! with one [`Error::InvalidUsage`] whose text names every bad variable, its value and the accepted
//! forms. An empty value counts as unset, as in NCCL.
#![forbid(unsafe_code)]

mod hca;
pub mod nccl;
mod table;
pub(crate) mod values;

pub use hca::{
    HCA_GRAMMAR, HcaEntry, HcaFilter, MAX_HCA_ENTRIES, MAX_HCA_NAME_LEN, MAX_PLANE, MAX_RAIL,
};
pub use table::{Variable, markdown};

use crate::error::{Error, Result};
use std::time::Duration;
use table::variables;
use values::{Reject, auto_or, auto_u8, bytes_in, duration_in, parse_bool, u8_in};

/// Prefix of the plugin's own variables.
pub const OWN_PREFIX: &str = "NCCL_SWITCHLESS_";

// The constants below are the bounds the rows' parsers check; the defaults equal the rows' (a test
// checks) for code that needs one without a `Config`.

/// Default `NCCL_IB_TIMEOUT` (4.096 µs × 2^20 ≈ 4.3 s per try).
pub const DEFAULT_IB_TIMEOUT: u8 = 20;
/// Default `NCCL_IB_RETRY_CNT`.
pub const DEFAULT_IB_RETRY_CNT: u8 = 7;
/// Default `NCCL_IB_QPS_PER_CONNECTION`.
pub const DEFAULT_QPS_PER_CONNECTION: u8 = 1;
/// Largest `NCCL_IB_QPS_PER_CONNECTION` (NCCL's `NCCL_IB_MAX_QPS`).
pub const MAX_QPS_PER_CONNECTION: u8 = 128;
/// Default `NCCL_SWITCHLESS_CONNECT_TIMEOUT`: none (NCCL retries `connect`/`accept` until they
/// succeed or it aborts, and has no deadline of its own).
pub const DEFAULT_CONNECT_TIMEOUT: Option<Duration> = None;
/// Shortest accepted connect timeout.
pub const MIN_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Longest accepted connect timeout.
pub const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Shortest accepted request timeout (shorter ones would fail healthy but slow transfers).
pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest accepted request timeout.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Shortest accepted `NCCL_SWITCHLESS_TCP_USER_TIMEOUT` (a busy host delays ACKs by milliseconds).
pub const MIN_TCP_USER_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest accepted `NCCL_SWITCHLESS_TCP_USER_TIMEOUT`.
pub const MAX_TCP_USER_TIMEOUT: Duration = Duration::from_secs(3600);
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

/// Shortest accepted `NCCL_SWITCHLESS_FAILBACK_BACKOFF`.
pub const MIN_FAILBACK_BACKOFF: Duration = Duration::from_millis(10);
/// Longest accepted `NCCL_SWITCHLESS_FAILBACK_BACKOFF`.
pub const MAX_FAILBACK_BACKOFF: Duration = Duration::from_secs(60);
/// Shortest accepted `NCCL_SWITCHLESS_METRICS_INTERVAL`.
pub const MIN_METRICS_INTERVAL: Duration = Duration::from_millis(100);
/// Longest accepted `NCCL_SWITCHLESS_METRICS_INTERVAL`.
pub const MAX_METRICS_INTERVAL: Duration = Duration::from_secs(3600);
/// Shortest accepted `NCCL_SWITCHLESS_FAILBACK_INTERVAL`.
pub const MIN_FAILBACK_INTERVAL: Duration = Duration::from_millis(100);
/// Longest accepted `NCCL_SWITCHLESS_FAILBACK_INTERVAL`.
pub const MAX_FAILBACK_INTERVAL: Duration = Duration::from_secs(3600);

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

    /// `auto`, `rdma` or `tcp`, any case.
    fn parse(s: &str) -> std::result::Result<TransportMode, Reject> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(TransportMode::Auto),
            "rdma" => Ok(TransportMode::Rdma),
            "tcp" => Ok(TransportMode::Tcp),
            _ => Err("unknown transport".into()),
        }
    }
}

/// Whether connections may go through a relay host (`NCCL_SWITCHLESS_RELAY`, docs/guide/relay.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelayMode {
    /// Relays for a peer no local cable reaches (a ring's non-neighbour), before the TCP fallback.
    #[default]
    Auto,
    /// Never: such a peer fails, or goes over the TCP fallback when that is on.
    Off,
    /// As `auto`, and a relay that cannot be found is an error instead of a fallback to
    /// `NCCL_SWITCHLESS_TCP_FALLBACK`.
    Always,
}

impl RelayMode {
    /// The value as written in the environment.
    pub fn as_str(self) -> &'static str {
        match self {
            RelayMode::Auto => "auto",
            RelayMode::Off => "off",
            RelayMode::Always => "always",
        }
    }

    /// `auto`, `off` or `always`, any case.
    fn parse(s: &str) -> std::result::Result<RelayMode, Reject> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(RelayMode::Auto),
            "off" => Ok(RelayMode::Off),
            "always" => Ok(RelayMode::Always),
            _ => Err("unknown relay mode".into()),
        }
    }
}

/// NCCL's distance classes between a GPU and a NIC, in NCCL's order (`topoPathTypeStr` in
/// `src/graph/topo.cc`): the values of `NCCL_NET_GDR_LEVEL`. NCCL uses GPU-direct for a NIC only
/// when its distance to the GPU is at most the level (default `P2C`, which on a host without C2C
/// behaves as `PXB`: the same PCIe switch hierarchy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathType {
    Loc,
    Nvl,
    Nvb,
    C2c,
    /// One PCIe bridge between them.
    Pix,
    /// Several PCIe bridges, no host bridge.
    Pxb,
    /// Through the CPU a C2C-attached GPU hangs off.
    P2c,
    Pxn,
    /// Through a PCIe host bridge (the CPU of one NUMA node).
    Phb,
    /// Across the CPUs' interconnect (another socket).
    Sys,
}

impl PathType {
    /// The names NCCL accepts, in order.
    pub const NAMES: [&'static str; 10] = [
        "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS",
    ];
    const ALL: [PathType; 10] = [
        PathType::Loc,
        PathType::Nvl,
        PathType::Nvb,
        PathType::C2c,
        PathType::Pix,
        PathType::Pxb,
        PathType::P2c,
        PathType::Pxn,
        PathType::Phb,
        PathType::Sys,
    ];

    /// The name as NCCL writes it.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// NCCL's `ncclGetLevel`: a name (compared case-sensitively, as NCCL does), or an old-style
    /// number 0..=5 (0 `LOC`, 1 `PIX`, 2 `PXB`, 3 `PHB`, 4 and above `SYS`).
    fn parse(s: &str) -> std::result::Result<PathType, Reject> {
        let t = s.trim();
        if let Some(i) = Self::NAMES.iter().position(|n| *n == t) {
            return Ok(Self::ALL[i]);
        }
        if t.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
            let n = values::parse_decimal_u64(t)?;
            return Ok(match n {
                0 => PathType::Loc,
                1 => PathType::Pix,
                2 => PathType::Pxb,
                3 => PathType::Phb,
                _ => PathType::Sys,
            });
        }
        Err("not a distance name NCCL knows (NCCL compares them in upper case)".into())
    }
}

/// PCIe relaxed ordering of data memory registrations (`NCCL_IB_PCI_RELAXED_ORDERING`, NCCL's
/// values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelaxedOrdering {
    /// `0`: never.
    Off,
    /// `1`: always; a registration the device refuses with it fails.
    On,
    /// `2` (NCCL's default): with it, and again without it where the device refuses it.
    #[default]
    Auto,
}

impl RelaxedOrdering {
    fn parse(s: &str) -> std::result::Result<RelaxedOrdering, Reject> {
        match values::parse_int_in(s, 0, 2)? {
            0 => Ok(RelaxedOrdering::Off),
            1 => Ok(RelaxedOrdering::On),
            _ => Ok(RelaxedOrdering::Auto),
        }
    }

    /// The value as NCCL writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            RelaxedOrdering::Off => "0",
            RelaxedOrdering::On => "1",
            RelaxedOrdering::Auto => "2",
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

/// How the init log writes an automatic-or-number value.
fn show_auto(v: &Option<u8>) -> String {
    v.map_or_else(|| "auto".to_string(), |v| v.to_string())
}

/// How the init log writes a duration.
fn show_ms(d: &Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// How the init log writes a boolean.
fn show_bool(b: &bool) -> String {
    u8::from(*b).to_string()
}

const FORM_AUTO_U8: &str = "-1 (automatic) or 0..=255, decimal or 0x hexadecimal";
const FORM_BOOL: &str = "0 or 1";

variables! {
    /// The plugin's configuration: one field per variable, each with its documented default.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Config {
        ib_hca: HcaFilter {
            name: "NCCL_IB_HCA",
            default: "",
            forms: HCA_GRAMMAR,
            parse: HcaFilter::parse_inner,
            show: |f| f.to_string(),
            doc: "Which RDMA devices/ports may be used (unset: every device and port); rail and plane ids \
                  reported to NCCL ≥ 2.30 (ABI v12). See below.",
        },
        ib_gid_index: Option<u8> {
            name: "NCCL_IB_GID_INDEX",
            default: "-1",
            forms: FORM_AUTO_U8,
            parse: |v| auto_u8(v, 255),
            show: show_auto,
            doc: "Fixed RoCE GID index for every port. `-1` (automatic): per connection, the GID whose \
                  subnet the peer's address is in.",
        },
        ib_tc: Option<u8> {
            name: "NCCL_IB_TC",
            default: "-1",
            forms: FORM_AUTO_U8,
            parse: |v| auto_u8(v, 255),
            show: show_auto,
            doc: "GRH traffic class of our QPs (DSCP × 4 + ECN). `-1`: NCCL's communicator traffic \
                  class, else 0.",
        },
        ib_sl: Option<u8> {
            name: "NCCL_IB_SL",
            default: "-1",
            forms: "-1 (automatic) or 0..=15",
            parse: |v| auto_u8(v, 15),
            show: show_auto,
            doc: "Service level of our QPs. `-1`: the communicator traffic class, else 0.",
        },
        ib_timeout: u8 {
            name: "NCCL_IB_TIMEOUT",
            default: "20",
            forms: "0..=31 (exponent: 4.096 us x 2^value; 0 means infinite)",
            parse: |v| u8_in(v, 0, 31),
            show: u8::to_string,
            doc: "QP local ACK timeout exponent: 4.096 µs × 2^value (`20`: ≈ 4.3 s per try); 0 means \
                  infinite.",
        },
        ib_retry_cnt: u8 {
            name: "NCCL_IB_RETRY_CNT",
            default: "7",
            forms: "0..=7",
            parse: |v| u8_in(v, 0, 7),
            show: u8::to_string,
            doc: "QP transport retries before a completion error: a dead link is reported after 4.096 µs × \
                  2^`NCCL_IB_TIMEOUT` × (retries + 1), ≈ 34.4 s with the defaults (20 and 7).",
        },
        ib_qps_per_connection: u8 {
            name: "NCCL_IB_QPS_PER_CONNECTION",
            default: "1",
            forms: "1..=128",
            parse: |v| u8_in(v, 1, MAX_QPS_PER_CONNECTION),
            show: u8::to_string,
            doc: "RC queue pairs per connection on each path.",
        },
        ib_pci_relaxed_ordering: RelaxedOrdering {
            name: "NCCL_IB_PCI_RELAXED_ORDERING",
            default: "2",
            forms: "0 (off), 1 (on) or 2 (automatic)",
            parse: RelaxedOrdering::parse,
            show: |r| r.as_str().to_string(),
            doc: "PCIe relaxed ordering (`IBV_ACCESS_RELAXED_ORDERING`) of data memory registrations: \
                  host, GPU and DMA-BUF alike (control memory never uses it). `2`: try it and register \
                  without it where the device refuses; `1`: always, a registration the device refuses \
                  with it fails; `0`: never.",
        },
        net_gdr_level: Option<PathType> {
            name: "NCCL_NET_GDR_LEVEL",
            default: "",
            forms: "LOC, NVL, NVB, C2C, PIX, PXB, P2C, PXN, PHB or SYS (upper case, as NCCL compares them), \
                    or NCCL's old numbers 0..=5 (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and 5 SYS)",
            parse: |v| PathType::parse(v).map(Some),
            show: |v| v.map_or_else(|| "default".to_string(), |l| l.as_str().to_string()),
            doc: "NCCL's own variable, read here too: how far from the GPU a NIC may be for GPU-direct. \
                  When a connection cannot use the device NCCL chose, a device that registers GPU memory \
                  prefers links within this distance of that device (same PCIe root port up to `PXB` and \
                  `P2C`, the same NUMA node for `PHB`, anywhere for `SYS`) and warns once per peer when \
                  only farther ones reach it; below `PIX` NCCL never uses GPU-direct (the remedy a GPU \
                  registration on a TCP connection names). Unset: NCCL's default (`P2C`, which is `PXB` without C2C).",
        },
        transport: TransportMode {
            name: "NCCL_SWITCHLESS_TRANSPORT",
            default: "auto",
            forms: "auto, rdma or tcp",
            parse: TransportMode::parse,
            show: |t| t.as_str().to_string(),
            doc: "`auto`: RDMA where a port reaches the peer; `rdma`: RDMA only; `tcp`: TCP sockets only \
                  (no RDMA device is opened). Any case.",
        },
        connect_timeout: Option<Duration> {
            name: "NCCL_SWITCHLESS_CONNECT_TIMEOUT",
            default: "0",
            forms: "0 (off: no deadline, as in NCCL) or 100ms..=60m: a number of milliseconds, or a number \
                    with the unit ms, s, m or h (e.g. 30s)",
            parse: |v| match v.trim() {
                "0" => Ok(None),
                _ => duration_in(v, MIN_CONNECT_TIMEOUT..=MAX_CONNECT_TIMEOUT).map(Some),
            },
            show: |d| d.as_ref().map_or_else(|| "off".to_string(), show_ms),
            doc: "Deadline for each step of setting up one connection (handshake, QP bring-up, TCP \
                  streams); past it the connection fails with a timeout naming the peer. `0` (the \
                  default): none, as NCCL has none: a connector still gives up on an address that does \
                  not answer, and a listener waits for its connector as long as NCCL calls accept.",
        },
        request_timeout: Option<Duration> {
            name: "NCCL_SWITCHLESS_REQUEST_TIMEOUT",
            default: "0",
            forms: "0 (off: wait forever) or 1s..=24h: a number of milliseconds, or a number with the \
                    unit ms, s, m or h (e.g. 300s)",
            parse: |v| match v.trim() {
                "0" => Ok(None),
                _ => duration_in(v, MIN_REQUEST_TIMEOUT..=MAX_REQUEST_TIMEOUT).map(Some),
            },
            show: |d| d.as_ref().map_or_else(|| "off".to_string(), show_ms),
            doc: "A send or receive that makes no progress for this long fails with `ncclSystemError` (a \
                  timeout) instead of waiting forever; `0`: off. A peer or cable that dies while this side \
                  has nothing in flight is otherwise never noticed (RC retries only run for posted work); \
                  NCCL's own transport also waits forever. Set it above the longest legitimate gap between \
                  a receive being posted and its data arriving (e.g. `300s`).",
        },
        tcp_streams: TcpStreams {
            name: "NCCL_SWITCHLESS_TCP_STREAMS",
            default: "auto",
            forms: "auto or 1..=64",
            parse: |v| {
                let n = auto_or(v, |v| u8_in(v, 1, MAX_TCP_STREAMS))?;
                Ok(n.map_or(TcpStreams::Auto, TcpStreams::Fixed))
            },
            show: |s| match s {
                TcpStreams::Auto => "auto".to_string(),
                TcpStreams::Fixed(n) => n.to_string(),
            },
            doc: "TCP streams per connection, spread over its paths (⌈n / paths⌉ each). `auto`: per path from \
                  its link speed, ⌈speed / 2.5 Gb/s⌉ clamped to 2..=16 (4 when the speed is unknown).",
        },
        tcp_threads: Option<u8> {
            name: "NCCL_SWITCHLESS_TCP_THREADS",
            default: "auto",
            forms: "auto or 1..=64 (threads)",
            parse: |v| auto_or(v, |v| u8_in(v, 1, MAX_TCP_THREADS)),
            show: show_auto,
            doc: "I/O threads of the one pool that drives every TCP stream of the process (all \
                  connections share it). `auto`: the CPUs the process may use, at most 8. Threads start \
                  with the first TCP connection and end when the last one closes.",
        },
        tcp_user_timeout: Option<Duration> {
            name: "NCCL_SWITCHLESS_TCP_USER_TIMEOUT",
            default: "30s",
            forms: "0 (off: the kernel's limit) or 1s..=60m: a number of milliseconds, or a number with \
                    the unit ms, s, m or h (e.g. 30s)",
            parse: |v| match v.trim() {
                "0" => Ok(None),
                _ => duration_in(v, MIN_TCP_USER_TIMEOUT..=MAX_TCP_USER_TIMEOUT).map(Some),
            },
            show: |d| d.as_ref().map_or_else(|| "off".to_string(), show_ms),
            doc: "A TCP data stream whose sent data stays unacknowledged this long fails \
                  (`TCP_USER_TIMEOUT`): its path fails over to a standby or surviving path, or, on the \
                  last path, the connection fails naming it. Catches a peer host that froze and a link \
                  that drops frames while its carrier stays up, which TCP alone retransmits for about 15 \
                  minutes. A peer that is alive but not reading (its receive window closed) is not \
                  cut off: the stream suspends its user timeout while the peer answers its window \
                  probes (docs/failover.md). `0`: the kernel's limit.",
        },
        tcp_fallback: bool {
            name: "NCCL_SWITCHLESS_TCP_FALLBACK",
            default: "0",
            forms: FORM_BOOL,
            parse: parse_bool,
            show: show_bool,
            doc: "`1`: a peer that no RoCE or TCP point-to-point link reaches (a ring or partial-mesh \
                  non-neighbour) is carried over TCP on any shared IPv4 subnet (a management LAN) or \
                  kernel route through a gateway (a forwarding neighbour, the default route), with one \
                  WARN per peer stating the bandwidth to expect. Set it on both ends: an acceptor without \
                  it refuses routed paths. `0`: such a connection fails at once with an error saying why. \
                  `1` together with `TRANSPORT=rdma` is refused as contradictory.",
        },
        relay: RelayMode {
            name: "NCCL_SWITCHLESS_RELAY",
            default: "auto",
            forms: "auto, off or always",
            parse: RelayMode::parse,
            show: |m| m.as_str().to_string(),
            doc: "`auto`: a peer that no point-to-point link reaches (a ring's non-neighbour) is reached \
                  through relays: each neighbour cabled to both ends forwards one path of the connection \
                  (TCP paths; docs/guide/relay.md), before `NCCL_SWITCHLESS_TCP_FALLBACK` is tried; every \
                  rank of a v11+ NCCL serves relays for its neighbours. On a mesh, a connection made after \
                  NCCL's `setNetAttr` hint says Ring or Tree with few peers also gets relay paths next to \
                  its direct TCP ones (never for alltoall or p2p; messages under 512 KiB stay direct). \
                  `off`: no relay paths, no relay service, and relayed paths in an incoming hello are \
                  refused. `always`: as `auto`, but when no relay reaches the peer the connection fails \
                  naming every neighbour asked, even with `TCP_FALLBACK=1`. Any case.",
        },
        min_chunk: u64 {
            name: "NCCL_SWITCHLESS_MIN_CHUNK",
            default: "128K",
            forms: "4K..=1G bytes: a number of bytes, or with the suffix K/KiB, M/MiB or G/GiB (powers of \
                    1024), e.g. 128K",
            parse: |v| bytes_in(v, MIN_MIN_CHUNK..=MAX_MIN_CHUNK),
            show: |n| format!("{n} bytes"),
            doc: "Smallest piece a message is split into when striped over several paths (`128K`: 131072 \
                  bytes); a message smaller than two chunks goes over one path. Suffixes in any case; \
                  `KB`/`MB` are refused as ambiguous.",
        },
        log_routes: bool {
            name: "NCCL_SWITCHLESS_LOG_ROUTES",
            default: "0",
            forms: FORM_BOOL,
            parse: parse_bool,
            show: show_bool,
            doc: "Log the whole route table (every local link, peer subnet, GID, PCI root) at INFO at \
                  init. Without it, one INFO line per connection.",
        },
        failover: bool {
            name: "NCCL_SWITCHLESS_FAILOVER",
            default: "1",
            forms: FORM_BOOL,
            parse: parse_bool,
            show: show_bool,
            doc: "`1`: when one path of a multi-path connection fails (a completion error, the port going \
                  down), its unacknowledged pieces and clear-to-send entries move to the surviving paths \
                  (one WARN names the path, the survivors and the bandwidth to expect) and the failed path \
                  is probed to rejoin (failback, INFO line); a request fails only when no path is left. \
                  `0`: a path's error fails the requests on it. See `docs/failover.md`.",
        },
        standby: bool {
            name: "NCCL_SWITCHLESS_STANDBY",
            default: "1",
            forms: FORM_BOOL,
            parse: parse_bool,
            show: show_bool,
            doc: "`1`: a connection whose NCCL device reaches the peer also sets up the peer's other \
                  paths (other cables, the other PCIe function or CX-8 half; for GPU memory only those \
                  within `NCCL_NET_GDR_LEVEL`) as standby: one queue pair each, no data until a carrying \
                  path fails, then one takes its place until it is back; the sending side registers \
                  memory on a standby path only when it first carries. `0` (or \
                  `NCCL_SWITCHLESS_FAILOVER=0`): only NCCL's device's paths. See `docs/failover.md`.",
        },
        failback_retries: u8 {
            name: "NCCL_SWITCHLESS_FAILBACK_RETRIES",
            default: "5",
            forms: "0..=100",
            parse: |v| u8_in(v, 0, 100),
            show: u8::to_string,
            doc: "Probes of a failed path with doubling backoff (from `FAILBACK_BACKOFF`) before probing \
                  settles at `FAILBACK_INTERVAL`; probing never stops while the connection lives.",
        },
        failback_backoff: Duration {
            name: "NCCL_SWITCHLESS_FAILBACK_BACKOFF",
            default: "100ms",
            forms: "10ms..=60s: a number of milliseconds, or a number with the unit ms, s or m",
            parse: |v| duration_in(v, MIN_FAILBACK_BACKOFF..=MAX_FAILBACK_BACKOFF),
            show: show_ms,
            doc: "Wait before the first probe of a failed path; doubles per retry.",
        },
        failback_interval: Duration {
            name: "NCCL_SWITCHLESS_FAILBACK_INTERVAL",
            default: "5s",
            forms: "100ms..=60m: a number of milliseconds, or a number with the unit ms, s or m",
            parse: |v| duration_in(v, MIN_FAILBACK_INTERVAL..=MAX_FAILBACK_INTERVAL),
            show: show_ms,
            doc: "Probe period of a failed path after the retries (the low steady probe rate).",
        },
        tuner: bool {
            name: "NCCL_SWITCHLESS_TUNER",
            default: "1",
            forms: FORM_BOOL,
            parse: parse_bool,
            show: show_bool,
            doc: "`1`: the tuner in this library (`ncclTunerPlugin_v2`…`v6`, which NCCL loads from the net \
                  plugin's library when `NCCL_TUNER_PLUGIN` is unset) adjusts NCCL's algorithm choice to the \
                  cabling: Ring only where some hosts share no cable, the model's Ring or Tree for all-reduce \
                  on meshes of 3+ hosts, nothing on 2 hosts or a switched network. `0`: it changes nothing. \
                  A user's `NCCL_ALGO`, `NCCL_PROTO` or `NCCL_TUNER_PLUGIN` always wins. See \
                  `docs/guide/tuner.md`.",
        },
        adaptive_weights: bool {
            name: "NCCL_SWITCHLESS_ADAPTIVE_WEIGHTS",
            default: "1",
            forms: FORM_BOOL,
            parse: parse_bool,
            show: show_bool,
            doc: "`1`: stripe shares follow each path's measured throughput (a slow or congested path gets \
                  proportionally less; every path keeps a 2 % probe share). `0`: shares by nominal link \
                  speed only.",
        },
        metrics_dir: Option<String> {
            name: "NCCL_SWITCHLESS_METRICS_DIR",
            default: "",
            forms: "empty (off) or an absolute directory path",
            parse: |v| match v.trim() {
                "" => Ok(None),
                d if d.starts_with('/') => Ok(Some(d.to_string())),
                _ => Err("not an absolute path".to_string()),
            },
            show: |d| d.clone().unwrap_or_else(|| "off".to_string()),
            doc: "Directory where each process writes its per-connection and per-path counters \
                  (`switchless-metrics-<host>-<pid>.json`, schema `switchless-metrics/1`) every \
                  `METRICS_INTERVAL`, read by `switchless watch --metrics-dir`. Empty (the default): no \
                  file and no thread; the counters are kept either way. See `docs/guide/metrics.md`.",
        },
        metrics_interval: Duration {
            name: "NCCL_SWITCHLESS_METRICS_INTERVAL",
            default: "1s",
            forms: "100ms..=60m: a number of milliseconds, or a number with the unit ms, s or m",
            parse: |v| duration_in(v, MIN_METRICS_INTERVAL..=MAX_METRICS_INTERVAL),
            show: show_ms,
            doc: "Period of the metrics snapshot (with `NCCL_SWITCHLESS_METRICS_DIR`); a last one is \
                  written when the plugin closes.",
        },
        attest: bool {
            name: "NCCL_SWITCHLESS_ATTEST",
            default: "1",
            forms: FORM_BOOL,
            parse: parse_bool,
            show: show_bool,
            doc: "`1`: the init INFO line and the metrics name the SHA-256 of the plugin library and of \
                  `libnccl` as mapped in the process (read once per process: tens of ms natively). `0`: \
                  they say `sha256 off`, for emulators (a TCG VM hashes at a few MB/s) or hosts where \
                  reading the libraries at init costs too much.",
        },
    }
}

/// NCCL's variables that merge physical devices into virtual ones: they act only through a
/// plugin's `makeVDevice`, which this plugin leaves NULL, so NCCL ignores them (NCCL
/// `src/graph/topo.cc`). Users copying NVIDIA's GB10 recipes set them.
pub const NCCL_MERGE_VARS: &[&str] = &[
    "NCCL_NET_MERGE_LEVEL",
    "NCCL_NET_FORCE_MERGE",
    "NCCL_IB_MERGE_NICS",
];

/// What a set merge variable (see [`NCCL_MERGE_VARS`]) does here: nothing, and why.
pub fn merge_var_note(name: &str, value: &str) -> String {
    format!(
        "{name}={value} has no effect: the switchless plugin offers NCCL no virtual devices \
         (makeVDevice is NULL), so NCCL uses its physical devices and ignores NCCL_NET_MERGE_LEVEL, \
         NCCL_NET_FORCE_MERGE and NCCL_IB_MERGE_NICS; the plugin itself stripes each connection over \
         every path to the peer (a GB10 port's two PCIe functions, a CX-8's two halves)"
    )
}

impl Config {
    /// Reads the process environment. Also warns (through `tracing`) about set `NCCL_SWITCHLESS_*`
    /// variables that this version does not know, which are usually typos, and about NCCL's device
    /// merge variables, which do nothing with this plugin ([`NCCL_MERGE_VARS`]).
    pub fn from_env() -> Result<Config> {
        for name in NCCL_MERGE_VARS {
            if let Ok(v) = std::env::var(name) {
                tracing::warn!("NET/switchless: {}", merge_var_note(name, &v));
            }
        }
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
    /// unset. Fails with one [`Error::InvalidUsage`] listing every bad variable, in table order.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut cfg = Config::default();
        let mut problems: Vec<String> = Vec::new();
        for var in Config::TABLE {
            // Present and non-blank values only; NCCL treats an empty value as unset.
            let Some(v) = get(var.name).filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            if let Err(why) = (var.set)(&mut cfg, &v) {
                problems.push(format!(
                    "{}={v:?} is invalid: {why}; accepted: {}",
                    var.name, var.forms
                ));
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

    /// One line naming every setting, for the init log. NCCL's variables keep their names, ours
    /// are shortened (`NCCL_SWITCHLESS_MIN_CHUNK` is `min_chunk`).
    pub fn summary(&self) -> String {
        Config::TABLE
            .iter()
            .map(|var| {
                let key = match var.name.strip_prefix(OWN_PREFIX) {
                    Some(own) => own.to_ascii_lowercase(),
                    None => var.name.to_string(),
                };
                format!("{key}={}", (var.show)(self))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `page` (the text of `docs/reference/environment.md`) with its generated table rebuilt from
/// [`Config::TABLE`]; `None` when the page lacks the generated region's marker lines.
pub fn documented(page: &str) -> Option<String> {
    table::splice(page, &markdown(Config::TABLE))
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
        assert_eq!(c.relay, RelayMode::Auto);
        assert_eq!(c.connect_timeout, None, "NCCL has no connect deadline");
        assert_eq!(c.tcp_streams, TcpStreams::Auto);
        assert_eq!(c.tcp_threads, None);
        assert!(!c.tcp_fallback);
        assert_eq!(c.min_chunk, 131072);
        assert!(!c.log_routes);
        assert_eq!(c.net_gdr_level, None);
    }

    #[test]
    fn gdr_level_reads_as_nccl_reads_it() {
        let level = |v: &str| cfg(&[("NCCL_NET_GDR_LEVEL", v)]).map(|c| c.net_gdr_level);
        assert_eq!(level("PHB").unwrap(), Some(PathType::Phb));
        assert_eq!(level("SYS").unwrap(), Some(PathType::Sys));
        assert_eq!(level("P2C").unwrap(), Some(PathType::P2c));
        assert_eq!(level("0").unwrap(), Some(PathType::Loc));
        assert_eq!(level("2").unwrap(), Some(PathType::Pxb));
        assert_eq!(level("3").unwrap(), Some(PathType::Phb));
        assert_eq!(level("9").unwrap(), Some(PathType::Sys));
        let e = err(&[("NCCL_NET_GDR_LEVEL", "phb")]);
        assert!(
            e.contains("NCCL_NET_GDR_LEVEL") && e.contains("upper case"),
            "{e}"
        );
        assert!(PathType::Pxb < PathType::Phb && PathType::Phb < PathType::Sys);
        assert_eq!(PathType::P2c.as_str(), "P2C");
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
            ("NCCL_SWITCHLESS_RELAY", "Always"),
            ("NCCL_SWITCHLESS_MIN_CHUNK", "1M"),
            ("NCCL_SWITCHLESS_LOG_ROUTES", "1"),
        ])
        .unwrap();
        assert_eq!(c.relay, RelayMode::Always);
        assert_eq!(c.ib_hca.rail_plane("mlx5_1", 1), (Some(1), Some(0)));
        assert!(!c.ib_hca.matches("mlx5_10", 1));
        assert_eq!(c.ib_gid_index, Some(3));
        assert_eq!(c.ib_tc, Some(104));
        assert_eq!(c.ib_sl, Some(5));
        assert_eq!(c.ib_timeout, 22);
        assert_eq!(c.ib_retry_cnt, 0);
        assert_eq!(c.ib_qps_per_connection, 128);
        assert_eq!(c.transport, TransportMode::Tcp);
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(5)));
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
    fn relaxed_ordering_takes_nccls_three_values() {
        assert_eq!(
            Config::default().ib_pci_relaxed_ordering,
            RelaxedOrdering::Auto
        );
        for (v, want) in [
            ("0", RelaxedOrdering::Off),
            ("1", RelaxedOrdering::On),
            ("2", RelaxedOrdering::Auto),
            ("0x1", RelaxedOrdering::On),
        ] {
            let c = cfg(&[("NCCL_IB_PCI_RELAXED_ORDERING", v)]).unwrap();
            assert_eq!(c.ib_pci_relaxed_ordering, want, "{v}");
        }
        assert!(
            cfg(&[("NCCL_IB_PCI_RELAXED_ORDERING", "0")])
                .unwrap()
                .summary()
                .contains("NCCL_IB_PCI_RELAXED_ORDERING=0")
        );
    }

    #[test]
    fn tcp_user_timeout_defaults_to_30_s_and_takes_0_for_off() {
        assert_eq!(
            Config::default().tcp_user_timeout,
            Some(Duration::from_secs(30))
        );
        let c = |v| cfg(&[("NCCL_SWITCHLESS_TCP_USER_TIMEOUT", v)]);
        assert_eq!(c("0").unwrap().tcp_user_timeout, None);
        assert_eq!(
            c("2s").unwrap().tcp_user_timeout,
            Some(Duration::from_secs(2))
        );
        let e = c("500ms").unwrap_err().to_string();
        assert!(
            e.contains("NCCL_SWITCHLESS_TCP_USER_TIMEOUT") && e.contains("1s..=60m"),
            "{e}"
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
            (
                "NCCL_IB_PCI_RELAXED_ORDERING",
                "3",
                "0 (off), 1 (on) or 2 (automatic)",
            ),
            (
                "NCCL_IB_PCI_RELAXED_ORDERING",
                "-1",
                "0 (off), 1 (on) or 2 (automatic)",
            ),
            (
                "NCCL_IB_PCI_RELAXED_ORDERING",
                "on",
                "0 (off), 1 (on) or 2 (automatic)",
            ),
            ("NCCL_IB_HCA", "mlx5_0:0", "1..=255"),
            ("NCCL_SWITCHLESS_TRANSPORT", "verbs", "auto, rdma or tcp"),
            ("NCCL_SWITCHLESS_RELAY", "on", "auto, off or always"),
            ("NCCL_SWITCHLESS_CONNECT_TIMEOUT", "50ms", "out of range"),
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
    #[cfg_attr(
        miri,
        ignore = "reads docs/ from the host filesystem; Miri isolates it"
    )]
    fn documentation_table_is_current() {
        // SWITCHLESS_UPDATE_DOCS=1 rewrites the page instead.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/environment.md");
        let page = std::fs::read_to_string(path).unwrap();
        let want = documented(&page)
            .expect("docs/reference/environment.md lacks the generated-table markers");
        if std::env::var_os("SWITCHLESS_UPDATE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
            return;
        }
        let first_difference = page
            .lines()
            .zip(want.lines())
            .find(|(have, want)| have != want);
        assert!(
            page == want,
            "docs/reference/environment.md is stale: run SWITCHLESS_UPDATE_DOCS=1 cargo test --lib config::; \
             first difference (page, table): {first_difference:?}"
        );
        for v in VARIABLES {
            assert!(
                page.contains(&format!("`{v}`")),
                "{v} missing from docs/reference/environment.md"
            );
        }
    }

    #[test]
    fn every_default_is_written_in_an_accepted_form() {
        // Config::default() parses each row's default and would quietly fall back on a typo.
        for var in Config::TABLE.iter().filter(|v| !v.default.is_empty()) {
            let c = cfg(&[(var.name, var.default)]);
            assert_eq!(c, Ok(Config::default()), "{}={:?}", var.name, var.default);
        }
        let c = Config::default();
        assert_eq!(c.ib_timeout, DEFAULT_IB_TIMEOUT);
        assert_eq!(c.ib_retry_cnt, DEFAULT_IB_RETRY_CNT);
        assert_eq!(c.ib_qps_per_connection, DEFAULT_QPS_PER_CONNECTION);
        assert_eq!(c.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(c.min_chunk, DEFAULT_MIN_CHUNK);
    }

    #[test]
    fn summary_names_every_setting_in_table_order() {
        let s = Config::default().summary();
        assert_eq!(
            s,
            "NCCL_IB_HCA=<all> NCCL_IB_GID_INDEX=auto NCCL_IB_TC=auto NCCL_IB_SL=auto NCCL_IB_TIMEOUT=20 \
             NCCL_IB_RETRY_CNT=7 NCCL_IB_QPS_PER_CONNECTION=1 NCCL_IB_PCI_RELAXED_ORDERING=2 NCCL_NET_GDR_LEVEL=default transport=auto connect_timeout=off \
             request_timeout=off tcp_streams=auto tcp_threads=auto tcp_user_timeout=30000 ms tcp_fallback=0 relay=auto min_chunk=131072 bytes \
             log_routes=0 failover=1 standby=1 failback_retries=5 failback_backoff=100 ms failback_interval=5000 ms \
             tuner=1 adaptive_weights=1 metrics_dir=off metrics_interval=1000 ms attest=1"
        );
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
