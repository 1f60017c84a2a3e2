//! Counters of one connection and its data paths, kept by its comm on the data path and read by
//! the metrics exporter (`plugin::metrics`) from another thread.
//!
//! * One writer at a time: the comm, which every NCCL call reaches only under its lock (`&mut`).
//!   [`Meter`] (the writing half) is not `Clone` and writes through `&mut self`, so an increment is
//!   a relaxed load and a relaxed store of the same word (plain moves on x86-64 and AArch64: no
//!   locked read-modify-write, no fence, no allocation, no system call). A reader on another thread
//!   ([`MeterView`]) loads each word relaxed: it sees every value some time after it was stored,
//!   never a torn one; the words of one reading are not one atomic snapshot (a byte count may be a
//!   message ahead of the message count), which rates over seconds do not notice.
//! * Counters only grow (wrapping at 2^64); gauges (weight, state, registrations) are set.
//! * Times are nanoseconds since a process-wide [`epoch`] taken from the caller's `now` (the comm
//!   reads no clock); [`unix_ms`] turns them into wall-clock time for a snapshot.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One word with a single writer (see the module docs).
#[derive(Debug, Default)]
struct Word(AtomicU64);

impl Word {
    /// Adds `n` (wrapping). Correct only with one writer at a time: [`Meter`] guarantees it.
    #[inline]
    fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    #[inline]
    fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }

    #[inline]
    fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Where a data path stands (the `state` word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathState {
    /// Usable.
    #[default]
    Up,
    /// Failed over from; probed for failback.
    Down,
    /// Probed: this end rebuilt, waiting for the peer's end.
    Rebuilding,
}

impl PathState {
    /// The word's value.
    fn code(self) -> u64 {
        match self {
            PathState::Up => 0,
            PathState::Down => 1,
            PathState::Rebuilding => 2,
        }
    }

    fn from_code(v: u64) -> PathState {
        match v {
            0 => PathState::Up,
            1 => PathState::Down,
            _ => PathState::Rebuilding,
        }
    }

    /// `up`, `down` or `rebuilding`.
    pub fn as_str(self) -> &'static str {
        match self {
            PathState::Up => "up",
            PathState::Down => "down",
            PathState::Rebuilding => "rebuilding",
        }
    }
}

#[derive(Debug, Default)]
struct PathWords {
    sent_bytes: Word,
    received_bytes: Word,
    sent_pieces: Word,
    received_pieces: Word,
    weight_mbps: Word,
    state: Word,
    /// 1 while the path takes new work.
    carrying: Word,
    /// 1 while the path is a standby (carries only in place of a failed path).
    standby: Word,
    failovers: Word,
    failbacks: Word,
    /// Nanoseconds since [`epoch`] + 1 of the last failover; 0: never.
    last_failover: Word,
    last_failback: Word,
    errors: Word,
}

#[derive(Debug, Default)]
struct ConnWords {
    paths: Box<[PathWords]>,
    messages: Word,
    bytes: Word,
    cts_waits: Word,
    cts_wait_ns: Word,
    request_errors: Word,
    registrations: Word,
    registered_bytes: Word,
}

/// One data path's counters, read at one time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathReading {
    /// Bytes of data pieces whose completion said they landed (sending side).
    pub sent_bytes: u64,
    /// Bytes of data pieces that arrived (receiving side; see `RecvComm`).
    pub received_bytes: u64,
    /// Data pieces sent (one per path a message was striped over).
    pub sent_pieces: u64,
    /// Data pieces received.
    pub received_pieces: u64,
    /// The stripe weight the path had in the last message striped, Mb/s (0: it carries nothing).
    pub weight_mbps: u64,
    pub state: PathState,
    /// The path takes new work (up and carrying, or a standby standing in).
    pub carrying: bool,
    /// The path is a standby: it carries only while it stands in for a failed path.
    pub standby: bool,
    /// Times the path was marked down and its work moved to the survivors.
    pub failovers: u64,
    /// Times it came back and carried again.
    pub failbacks: u64,
    /// When it last failed over / came back: nanoseconds since [`epoch`].
    pub last_failover_ns: Option<u64>,
    pub last_failback_ns: Option<u64>,
    /// Error completions on the path (flushed work requests after a failure not counted).
    pub errors: u64,
}

/// A connection's counters, read at one time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnReading {
    pub paths: Vec<PathReading>,
    /// Messages completed (sends; receive buffers).
    pub messages: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Times `isend` found no clear-to-send and waited for the receiver (sending side).
    pub cts_waits: u64,
    /// Time spent in those waits, nanoseconds.
    pub cts_wait_ns: u64,
    /// Requests that failed (counted by the plugin layer).
    pub request_errors: u64,
    /// Registrations (NCCL `regMr`) live on the comm, and their bytes.
    pub registrations: u64,
    pub registered_bytes: u64,
}

/// The writing half, owned by one comm. See the module docs.
#[derive(Debug)]
pub struct Meter {
    w: Arc<ConnWords>,
}

/// The reading half: any number, on any thread.
#[derive(Debug, Clone)]
pub struct MeterView {
    w: Arc<ConnWords>,
}

/// The process-wide origin of metric times, and the wall-clock time it was taken at.
pub fn epoch() -> (Instant, SystemTime) {
    static EPOCH: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    *EPOCH.get_or_init(|| (Instant::now(), SystemTime::now()))
}

/// `now` as nanoseconds since [`epoch`] (0 for an earlier `now`).
pub fn since_epoch_ns(now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(epoch().0).as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds since [`epoch`] as milliseconds since the Unix epoch.
pub fn unix_ms(ns: u64) -> u64 {
    let t = epoch().1 + Duration::from_nanos(ns);
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Meter {
    /// Counters for `npaths` data paths, all up and carrying.
    pub fn new(npaths: usize) -> Meter {
        let paths: Box<[PathWords]> = (0..npaths).map(|_| PathWords::default()).collect();
        for p in paths.iter() {
            p.carrying.set(1);
        }
        // Take the epoch now, before any time is measured against it.
        let _ = epoch();
        Meter {
            w: Arc::new(ConnWords {
                paths,
                ..ConnWords::default()
            }),
        }
    }

    /// A reader of these counters.
    pub fn view(&self) -> MeterView {
        MeterView {
            w: Arc::clone(&self.w),
        }
    }

    #[inline]
    fn path(&self, k: usize) -> Option<&PathWords> {
        self.w.paths.get(k)
    }

    /// A piece of `bytes` sent on data path `k` landed.
    #[inline]
    pub fn sent(&mut self, k: usize, bytes: u64) {
        if let Some(p) = self.path(k) {
            p.sent_bytes.add(bytes);
            p.sent_pieces.add(1);
        }
    }

    /// `bytes` of a piece arrived on data path `k`; `piece` counts it as a piece (a message's first
    /// piece may be counted in two steps: its record, then its bytes).
    #[inline]
    pub fn received(&mut self, k: usize, bytes: u64, piece: bool) {
        if let Some(p) = self.path(k) {
            p.received_bytes.add(bytes);
            p.received_pieces.add(u64::from(piece));
        }
    }

    /// `n` messages of `bytes` in all completed.
    #[inline]
    pub fn messages(&mut self, n: u64, bytes: u64) {
        self.w.messages.add(n);
        self.w.bytes.add(bytes);
    }

    /// `isend` waited `waited` for the receiver's clear-to-send.
    #[inline]
    pub fn cts_wait(&mut self, waited: Duration) {
        self.w.cts_waits.add(1);
        self.w
            .cts_wait_ns
            .add(u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The stripe weight of data path `k` in the message just striped, Mb/s.
    #[inline]
    pub fn weight(&mut self, k: usize, mbps: u64) {
        if let Some(p) = self.path(k) {
            p.weight_mbps.set(mbps);
        }
    }

    /// An error completion on data path `k`.
    pub fn error(&mut self, k: usize) {
        if let Some(p) = self.path(k) {
            p.errors.add(1);
        }
    }

    /// A request failed.
    pub fn request_error(&mut self) {
        self.w.request_errors.add(1);
    }

    /// Data path `k` was marked down at `now`.
    pub fn failover(&mut self, k: usize, now: Instant) {
        if let Some(p) = self.path(k) {
            p.failovers.add(1);
            p.last_failover.set(since_epoch_ns(now).saturating_add(1));
            p.state.set(PathState::Down.code());
            p.weight_mbps.set(0);
        }
    }

    /// Data path `k` is being rebuilt (failback in progress).
    pub fn rebuilding(&mut self, k: usize) {
        if let Some(p) = self.path(k) {
            p.state.set(PathState::Rebuilding.code());
        }
    }

    /// Data path `k` came back at `now`.
    pub fn failback(&mut self, k: usize, now: Instant) {
        if let Some(p) = self.path(k) {
            p.failbacks.add(1);
            p.last_failback.set(since_epoch_ns(now).saturating_add(1));
            p.state.set(PathState::Up.code());
        }
    }

    /// Whether data path `k` takes new work (a path that stops carrying has weight 0).
    pub fn carrying(&mut self, k: usize, carrying: bool) {
        if let Some(p) = self.path(k) {
            p.carrying.set(u64::from(carrying));
            if !carrying {
                p.weight_mbps.set(0);
            }
        }
    }

    /// Whether data path `k` is a standby.
    pub fn standby(&mut self, k: usize, standby: bool) {
        if let Some(p) = self.path(k) {
            p.standby.set(u64::from(standby));
        }
    }

    /// A registration of `bytes` was filed (`+`) or released.
    pub fn registration(&mut self, bytes: u64, filed: bool) {
        let w = &self.w;
        if filed {
            w.registrations.add(1);
            w.registered_bytes.add(bytes);
        } else {
            w.registrations.set(w.registrations.get().saturating_sub(1));
            w.registered_bytes
                .set(w.registered_bytes.get().saturating_sub(bytes));
        }
    }

    /// Every registration was released (the comm closed).
    pub fn registrations_cleared(&mut self) {
        self.w.registrations.set(0);
        self.w.registered_bytes.set(0);
    }

    /// The counters now (tests, and the comm's own accessors).
    pub fn read(&self) -> ConnReading {
        read(&self.w)
    }
}

impl MeterView {
    /// The counters now.
    pub fn read(&self) -> ConnReading {
        read(&self.w)
    }

    /// Number of data paths.
    pub fn paths(&self) -> usize {
        self.w.paths.len()
    }

    /// Whether the comm that writes these counters is gone (only views hold them).
    pub fn orphaned(&self) -> bool {
        Arc::strong_count(&self.w) == 1
    }
}

fn read(w: &ConnWords) -> ConnReading {
    let when = |v: u64| (v != 0).then(|| v - 1);
    ConnReading {
        paths: w
            .paths
            .iter()
            .map(|p| PathReading {
                sent_bytes: p.sent_bytes.get(),
                received_bytes: p.received_bytes.get(),
                sent_pieces: p.sent_pieces.get(),
                received_pieces: p.received_pieces.get(),
                weight_mbps: p.weight_mbps.get(),
                state: PathState::from_code(p.state.get()),
                carrying: p.carrying.get() != 0,
                standby: p.standby.get() != 0,
                failovers: p.failovers.get(),
                failbacks: p.failbacks.get(),
                last_failover_ns: when(p.last_failover.get()),
                last_failback_ns: when(p.last_failback.get()),
                errors: p.errors.get(),
            })
            .collect(),
        messages: w.messages.get(),
        bytes: w.bytes.get(),
        cts_waits: w.cts_waits.get(),
        cts_wait_ns: w.cts_wait_ns.get(),
        request_errors: w.request_errors.get(),
        registrations: w.registrations.get(),
        registered_bytes: w.registered_bytes.get(),
    }
}

// ---- The snapshot file: what the plugin writes and `switchless watch` reads. ----

/// Schema name of a [`Snapshot`].
pub const SNAPSHOT_SCHEMA: &str = "switchless-metrics/1";

/// What one data path is, fixed for the life of its connection: together with the direction, the
/// key under which `switchless watch` sums a path over connections and processes.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct PathId {
    /// `send` (this process's `connect`) or `recv` (its `accept`).
    pub direction: String,
    /// The peer's address on the handshake connection.
    pub peer: String,
    /// NCCL's device index of the connection.
    pub nccl_dev: usize,
    /// Local netdev of the path.
    pub netdev: String,
    /// Local RDMA device (`rocep1s0f0`); empty for a TCP path.
    pub rdma_dev: String,
    /// PCIe root of the local function.
    pub pci_root: String,
    /// Local address with its prefix.
    pub local: String,
    /// The peer's address the path reaches.
    pub remote: String,
    /// `verbs`, `tcp`, `relay` (through a relay host) or `routed` (the TCP fallback through a
    /// gateway that forwards).
    pub kind: String,
}

/// One data path of a live connection.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PathSnap {
    #[serde(flatten)]
    pub id: PathId,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub sent_pieces: u64,
    pub received_pieces: u64,
    /// Stripe weight in the last message striped, Mb/s (0 when it carries nothing).
    pub weight_mbps: u64,
    /// `up`, `down` or `rebuilding`.
    pub state: String,
    pub carrying: bool,
    pub standby: bool,
    pub failovers: u64,
    pub failbacks: u64,
    /// Wall-clock time of the last failover / failback, ms since the Unix epoch.
    pub last_failover_unix_ms: Option<u64>,
    pub last_failback_unix_ms: Option<u64>,
    pub errors: u64,
}

/// One live connection.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ConnSnap {
    /// Process-local id (in connection order).
    pub id: u64,
    pub direction: String,
    pub peer: String,
    pub nccl_dev: usize,
    pub messages: u64,
    pub bytes: u64,
    pub cts_waits: u64,
    pub cts_wait_ns: u64,
    pub request_errors: u64,
    pub registrations: u64,
    pub registered_bytes: u64,
    pub paths: Vec<PathSnap>,
}

/// One path identity summed over every connection of the process, live and closed.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct PathTotal {
    #[serde(flatten)]
    pub id: PathId,
    pub connections_live: u64,
    pub connections_closed: u64,
    /// Live connections on which the path carries / is down now.
    pub carrying: u64,
    pub down: u64,
    /// Connections on which the path is a standby (live ones now, closed ones when they closed).
    pub standby: u64,
    /// Sum of the live connections' stripe weights, Mb/s.
    pub weight_mbps: u64,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    pub sent_pieces: u64,
    pub received_pieces: u64,
    pub failovers: u64,
    pub failbacks: u64,
    pub last_failover_unix_ms: Option<u64>,
    pub last_failback_unix_ms: Option<u64>,
    pub errors: u64,
}

impl PathTotal {
    /// Adds one connection's path.
    pub fn add(&mut self, p: &PathSnap, live: bool) {
        if live {
            self.connections_live += 1;
            self.carrying += u64::from(p.carrying);
            self.down += u64::from(p.state != "up");
            self.weight_mbps = self.weight_mbps.saturating_add(p.weight_mbps);
        } else {
            self.connections_closed += 1;
        }
        self.standby += u64::from(p.standby);
        self.sent_bytes = self.sent_bytes.wrapping_add(p.sent_bytes);
        self.received_bytes = self.received_bytes.wrapping_add(p.received_bytes);
        self.sent_pieces = self.sent_pieces.wrapping_add(p.sent_pieces);
        self.received_pieces = self.received_pieces.wrapping_add(p.received_pieces);
        self.failovers = self.failovers.wrapping_add(p.failovers);
        self.failbacks = self.failbacks.wrapping_add(p.failbacks);
        self.errors = self.errors.wrapping_add(p.errors);
        self.last_failover_unix_ms = self.last_failover_unix_ms.max(p.last_failover_unix_ms);
        self.last_failback_unix_ms = self.last_failback_unix_ms.max(p.last_failback_unix_ms);
    }
}

/// Registrations of one NCCL device, summed over its live connections.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceSnap {
    pub nccl_dev: usize,
    pub name: String,
    pub registrations: u64,
    /// Bytes NCCL registered (`regMr` lengths; the registration cache pins a shared range once).
    pub registered_bytes: u64,
    /// Bytes the fabric holds pinned on the device now: each cached range's whole pages once,
    /// whichever connections share it, plus pins kept outside the cache; 0 over TCP. Absent in
    /// snapshots of older plugins (read as 0).
    #[serde(default)]
    pub pinned_bytes: u64,
}

/// Which plugin and NCCL a process runs (attestation).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Build {
    pub version: String,
    pub commit: String,
    /// Path and SHA-256 of the loaded plugin library and of the `libnccl` in the process.
    pub plugin_path: String,
    pub plugin_sha256: String,
    pub nccl_path: String,
    pub nccl_sha256: String,
}

impl Build {
    /// The words of the init INFO line: `switchless V commit C plugin PATH sha256 H nccl PATH
    /// sha256 H` (`-` for what is unknown; a path with a space cannot be read back).
    pub fn text(&self) -> String {
        let d = |s: &str| {
            if s.is_empty() {
                "-".to_string()
            } else {
                s.to_string()
            }
        };
        format!(
            "switchless {} commit {} plugin {} sha256 {} nccl {} sha256 {}",
            d(&self.version),
            d(&self.commit),
            d(&self.plugin_path),
            d(&self.plugin_sha256),
            d(&self.nccl_path),
            d(&self.nccl_sha256)
        )
    }

    /// Reads [`Build::text`] back from the start of `s` (what follows is ignored).
    pub fn parse(s: &str) -> Option<Build> {
        let w: Vec<&str> = s.split_whitespace().take(12).collect();
        let shape = [
            "switchless",
            "",
            "commit",
            "",
            "plugin",
            "",
            "sha256",
            "",
            "nccl",
            "",
            "sha256",
            "",
        ];
        if w.len() < 12 || w.iter().zip(shape).any(|(a, b)| !b.is_empty() && *a != b) {
            return None;
        }
        let u = |s: &str| {
            if s == "-" {
                String::new()
            } else {
                s.to_string()
            }
        };
        Some(Build {
            version: u(w[1]),
            commit: u(w[3]),
            plugin_path: u(w[5]),
            plugin_sha256: w[7].to_string(),
            nccl_path: u(w[9]),
            nccl_sha256: w[11].to_string(),
        })
    }
}

/// One process's counters at one time (`NCCL_SWITCHLESS_METRICS_DIR`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub schema: String,
    pub host: String,
    pub pid: u32,
    /// When it was taken, ms since the Unix epoch.
    pub time_unix_ms: u64,
    pub interval_ms: u64,
    /// The last snapshot of the process (the plugin closed).
    pub last: bool,
    pub build: Build,
    pub devices: Vec<DeviceSnap>,
    pub connections: Vec<ConnSnap>,
    pub paths: Vec<PathTotal>,
}

impl PathSnap {
    /// A path's reading under its identity.
    pub fn new(id: PathId, r: &PathReading) -> PathSnap {
        PathSnap {
            id,
            sent_bytes: r.sent_bytes,
            received_bytes: r.received_bytes,
            sent_pieces: r.sent_pieces,
            received_pieces: r.received_pieces,
            weight_mbps: r.weight_mbps,
            state: r.state.as_str().to_string(),
            carrying: r.carrying,
            standby: r.standby,
            failovers: r.failovers,
            failbacks: r.failbacks,
            last_failover_unix_ms: r.last_failover_ns.map(unix_ms),
            last_failback_unix_ms: r.last_failback_ns.map(unix_ms),
            errors: r.errors,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn counters_add_gauges_set_and_a_view_on_another_thread_sees_them() {
        let mut m = Meter::new(2);
        let v = m.view();
        m.sent(0, 100);
        m.sent(0, 50);
        m.sent(7, 1); // no such path: ignored
        m.received(1, 30, true);
        m.received(1, 8, false);
        m.messages(2, 150);
        m.weight(1, 40_000);
        m.cts_wait(Duration::from_micros(3));
        m.registration(4096, true);
        m.registration(1024, true);
        m.registration(1024, false);
        let r = std::thread::spawn(move || v.read()).join().unwrap();
        assert_eq!(r.paths[0].sent_bytes, 150);
        assert_eq!(r.paths[0].sent_pieces, 2);
        assert_eq!(r.paths[1].received_bytes, 38);
        assert_eq!(r.paths[1].received_pieces, 1);
        assert_eq!(r.paths[1].weight_mbps, 40_000);
        assert_eq!((r.messages, r.bytes), (2, 150));
        assert_eq!((r.cts_waits, r.cts_wait_ns), (1, 3000));
        assert_eq!((r.registrations, r.registered_bytes), (1, 4096));
        assert!(
            r.paths
                .iter()
                .all(|p| p.carrying && p.state == PathState::Up)
        );
    }

    #[test]
    fn failover_and_failback_keep_their_times() {
        let t0 = epoch().0;
        let mut m = Meter::new(2);
        m.weight(1, 10);
        m.failover(1, t0 + Duration::from_millis(5));
        m.carrying(1, false);
        let r = m.read();
        assert_eq!(r.paths[1].state, PathState::Down);
        assert_eq!(r.paths[1].failovers, 1);
        assert_eq!(r.paths[1].last_failover_ns, Some(5_000_000));
        assert_eq!(r.paths[1].last_failback_ns, None);
        assert_eq!(r.paths[1].weight_mbps, 0);
        assert!(!r.paths[1].carrying);
        m.rebuilding(1);
        assert_eq!(m.read().paths[1].state, PathState::Rebuilding);
        m.failback(1, t0 + Duration::from_millis(9));
        m.carrying(1, true);
        let r = m.read();
        assert_eq!(r.paths[1].state, PathState::Up);
        assert_eq!(r.paths[1].failbacks, 1);
        assert_eq!(r.paths[1].last_failback_ns, Some(9_000_000));
        // A time before the epoch (a test's stepped clock) is the epoch itself.
        if let Some(before) = t0.checked_sub(Duration::from_millis(1)) {
            assert_eq!(since_epoch_ns(before), 0);
        }
        assert!(unix_ms(0) > 1_600_000_000_000);
    }

    #[test]
    fn the_attestation_words_read_back() {
        let b = Build {
            version: "0.1.0".into(),
            commit: "0123456789ab".into(),
            plugin_path: "/opt/p.so".into(),
            plugin_sha256: "aa".into(),
            nccl_path: String::new(),
            nccl_sha256: "-".into(),
        };
        let t = b.text();
        assert_eq!(
            t,
            "switchless 0.1.0 commit 0123456789ab plugin /opt/p.so sha256 aa nccl - sha256 -"
        );
        assert_eq!(Build::parse(&format!("{t} initialized devices=2")), Some(b));
        assert_eq!(Build::parse("switchless 0.1.0 initialized"), None);
        assert_eq!(Build::parse(&t.replace("commit", "c")), None);
    }

    #[test]
    fn a_view_outlives_the_meter_and_knows_it() {
        let m = Meter::new(1);
        let v = m.view();
        assert!(!v.orphaned());
        drop(m);
        assert!(v.orphaned());
        assert_eq!(v.paths(), 1);
    }
}
