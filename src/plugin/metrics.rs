//! The process's metrics: every connection's counters (`transport::metrics`, written by its comm
//! on the data path) with what each of its paths is ([`Registry`]), and the snapshot file that
//! `switchless watch` reads ([`Exporter`]).
//!
//! * A connection is filed once, when it becomes ready (NCCL's service thread, not the data path).
//!   A closed connection's counters are folded into per-path totals at the next snapshot, so the
//!   totals cover the whole run while the registry stays bounded by the paths the process knows.
//! * With `NCCL_SWITCHLESS_METRICS_DIR` set, one thread (`swl-metrics`) writes
//!   `switchless-metrics-<host>-<pid>.json` there every `NCCL_SWITCHLESS_METRICS_INTERVAL`
//!   (a temporary file renamed over the old one: a reader never sees half a file), and a last one
//!   when the backend closes; the thread is joined then. Unset: no thread, no file. Each snapshot's
//!   per-path totals are also appended as one line to `….history.jsonl` (for `watch --plot` after
//!   the run), up to [`HISTORY_MAX_BYTES`] per process.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::route::types::LinkKind;
use crate::sync::lock;
use crate::transport::metrics::{
    Build, ConnSnap, DeviceSnap, MeterView, PathId, PathSnap, PathTotal, SNAPSHOT_SCHEMA, Snapshot,
};

use super::switchless::plan::PathPlan;

/// One live connection.
#[derive(Debug)]
struct Entry {
    id: u64,
    direction: &'static str,
    peer: String,
    dev: usize,
    paths: Vec<PathId>,
    view: MeterView,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    live: Vec<Entry>,
    /// Totals of closed connections per path.
    closed: BTreeMap<PathId, PathTotal>,
}

/// The connections of one backend and their counters. See the module docs.
#[derive(Debug, Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

/// What a path is called in the metrics: `verbs`, `tcp`, `relay` for a path through a relay
/// host (`transport::relay`, both ends), or `routed` when the peer's address is not on the local
/// link's subnet (the TCP fallback: the kernel forwards it through a gateway).
pub fn path_kind(p: &PathPlan) -> &'static str {
    if p.relay.is_some() {
        return "relay";
    }
    if !p.local.addr.contains(&p.remote) {
        return "routed";
    }
    match p.local.kind {
        LinkKind::Roce => "verbs",
        LinkKind::Tcp => "tcp",
    }
}

/// The identity of each planned path of a connection.
pub fn path_ids(direction: &str, peer: &str, dev: usize, plans: &[PathPlan]) -> Vec<PathId> {
    plans
        .iter()
        .map(|p| PathId {
            direction: direction.to_string(),
            peer: peer.to_string(),
            nccl_dev: dev,
            netdev: p.local.netdev.clone(),
            rdma_dev: p.local.rdma_dev.clone().unwrap_or_default(),
            pci_root: p.local.pci_root.clone(),
            local: p.local.addr.to_string(),
            remote: p.remote.to_string(),
            kind: path_kind(p).to_string(),
        })
        .collect()
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Files a connection that just became ready: `send` for `connect`, `recv` for `accept`; its
    /// paths in the comm's data-path order.
    pub fn add(
        &self,
        send: bool,
        peer: &str,
        dev: usize,
        plans: &[PathPlan],
        view: MeterView,
    ) -> Result<()> {
        let direction = if send { "send" } else { "recv" };
        let paths = path_ids(direction, peer, dev, plans);
        let mut g = lock(&self.inner, "metrics registry")?;
        // Without snapshots (no METRICS_DIR) this is where closed connections leave the list.
        fold_orphans(&mut g);
        let id = g.next_id;
        g.next_id += 1;
        g.live.push(Entry {
            id,
            direction,
            peer: peer.to_string(),
            dev,
            paths,
            view,
        });
        Ok(())
    }

    /// Live connections.
    pub fn live(&self) -> usize {
        self.inner.lock().map_or(0, |g| g.live.len())
    }

    /// Reads every connection now; folds those whose comm is gone into the closed totals.
    /// `devices` are NCCL's device names; `pinned(i)` the bytes pinned on device `i` now.
    pub fn snapshot(
        &self,
        devices: &[String],
        pinned: &dyn Fn(usize) -> u64,
        build: &Build,
        interval: Duration,
    ) -> Snapshot {
        let mut connections = Vec::new();
        let mut totals: BTreeMap<PathId, PathTotal> = BTreeMap::new();
        let mut regs: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
        if let Ok(mut g) = self.inner.lock() {
            let inner = &mut *g;
            fold_orphans(inner);
            for e in &inner.live {
                let r = e.view.read();
                let paths: Vec<PathSnap> = e
                    .paths
                    .iter()
                    .zip(&r.paths)
                    .map(|(id, p)| PathSnap::new(id.clone(), p))
                    .collect();
                for p in &paths {
                    totals
                        .entry(p.id.clone())
                        .or_insert_with(|| PathTotal {
                            id: p.id.clone(),
                            ..PathTotal::default()
                        })
                        .add(p, true);
                }
                let d = regs.entry(e.dev).or_default();
                d.0 += r.registrations;
                d.1 = d.1.saturating_add(r.registered_bytes);
                connections.push(ConnSnap {
                    id: e.id,
                    direction: e.direction.to_string(),
                    peer: e.peer.clone(),
                    nccl_dev: e.dev,
                    messages: r.messages,
                    bytes: r.bytes,
                    cts_waits: r.cts_waits,
                    cts_wait_ns: r.cts_wait_ns,
                    request_errors: r.request_errors,
                    registrations: r.registrations,
                    registered_bytes: r.registered_bytes,
                    paths,
                });
            }
            for (id, c) in &inner.closed {
                let t = totals.entry(id.clone()).or_insert_with(|| PathTotal {
                    id: id.clone(),
                    ..PathTotal::default()
                });
                merge(t, c);
            }
        }
        Snapshot {
            schema: SNAPSHOT_SCHEMA.to_string(),
            host: hostname(),
            pid: std::process::id(),
            time_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            last: false,
            build: build.clone(),
            devices: devices
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let (n, b) = regs.get(&i).copied().unwrap_or_default();
                    DeviceSnap {
                        nccl_dev: i,
                        name: name.clone(),
                        registrations: n,
                        registered_bytes: b,
                        pinned_bytes: pinned(i),
                    }
                })
                .collect(),
            connections,
            paths: totals.into_values().collect(),
        }
    }
}

/// Moves the connections whose comm is gone from the live list into the closed totals, with
/// their final values (the comm wrote its last word before it dropped its half).
fn fold_orphans(inner: &mut Inner) {
    let Inner { live, closed, .. } = inner;
    live.retain(|e| {
        if !e.view.orphaned() {
            return true;
        }
        let r = e.view.read();
        for (id, p) in e.paths.iter().zip(&r.paths) {
            closed
                .entry(id.clone())
                .or_insert_with(|| PathTotal {
                    id: id.clone(),
                    ..PathTotal::default()
                })
                .add(&PathSnap::new(id.clone(), p), false);
        }
        false
    });
}

/// Adds closed totals `c` to `t`.
fn merge(t: &mut PathTotal, c: &PathTotal) {
    t.connections_closed += c.connections_closed;
    t.standby += c.standby;
    t.sent_bytes = t.sent_bytes.wrapping_add(c.sent_bytes);
    t.received_bytes = t.received_bytes.wrapping_add(c.received_bytes);
    t.sent_pieces = t.sent_pieces.wrapping_add(c.sent_pieces);
    t.received_pieces = t.received_pieces.wrapping_add(c.received_pieces);
    t.failovers = t.failovers.wrapping_add(c.failovers);
    t.failbacks = t.failbacks.wrapping_add(c.failbacks);
    t.errors = t.errors.wrapping_add(c.errors);
    t.last_failover_unix_ms = t.last_failover_unix_ms.max(c.last_failover_unix_ms);
    t.last_failback_unix_ms = t.last_failback_unix_ms.max(c.last_failback_unix_ms);
}

/// This host's name (`/proc/sys/kernel/hostname`), or `unknown`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// The snapshot file of this process in `dir`.
pub fn snapshot_path(dir: &Path) -> PathBuf {
    dir.join(format!(
        "switchless-metrics-{}-{}.json",
        hostname(),
        std::process::id()
    ))
}

/// Most bytes of one process's history file; later snapshots are not appended (one WARN).
pub const HISTORY_MAX_BYTES: u64 = 64 << 20;

/// The history file next to a snapshot file.
pub fn history_path(snapshot: &Path) -> PathBuf {
    snapshot.with_extension("history.jsonl")
}

/// Appends `snap`'s path totals (no connections) as one line to `path`, unless the file reached
/// [`HISTORY_MAX_BYTES`]; whether it was appended.
pub fn append_history(path: &Path, snap: &Snapshot) -> Result<bool> {
    use std::io::Write as _;
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    if len >= HISTORY_MAX_BYTES {
        return Ok(false);
    }
    let mut line = Snapshot {
        connections: Vec::new(),
        devices: Vec::new(),
        ..snap.clone()
    };
    line.build = Build::default();
    let mut text = serde_json::to_vec(&line)
        .map_err(|e| Error::Internal(format!("encoding the metrics history: {e}")))?;
    text.push(b'\n');
    create(path, true)
        .and_then(|mut f| f.write_all(&text))
        .map_err(|e| Error::System(format!("appending to {}: {e}", path.display())))?;
    Ok(true)
}

/// Writes `snap` to `path` through a temporary file in the same directory and a rename.
pub fn write_snapshot(path: &Path, snap: &Snapshot) -> Result<()> {
    let text = serde_json::to_vec(snap)
        .map_err(|e| Error::Internal(format!("encoding the metrics snapshot: {e}")))?;
    let tmp = path.with_extension("json.tmp");
    // The directory may be shared: never follow a link planted at the temporary name (a stale one
    // is removed, the file created anew), and rename over the snapshot (a link there is replaced).
    let _ = std::fs::remove_file(&tmp);
    create(&tmp, false)
        .and_then(|mut f| {
            use std::io::Write as _;
            f.write_all(&text)
        })
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::System(format!("writing {}: {e}", path.display())))
}

/// Opens `path` for writing without following a symbolic link: a new file, or (`append`) an
/// existing one appended to.
fn create(path: &Path, append: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut o = std::fs::OpenOptions::new();
    o.custom_flags(libc::O_NOFOLLOW).mode(0o644);
    if append {
        o.append(true).create(true);
    } else {
        o.write(true).create_new(true);
    }
    o.open(path)
}

/// What the exporter thread and its owner share: the stop flag and its wake-up.
#[derive(Debug, Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

/// The snapshot thread. Dropping it writes the last snapshot and joins the thread.
#[derive(Debug)]
pub struct Exporter {
    stop: Arc<Stop>,
    thread: Option<crate::sys::thread::Joiner>,
    path: PathBuf,
}

impl Exporter {
    /// Starts writing `take()`'s snapshot into `dir` every `interval` (the directory is created
    /// when missing).
    pub fn start(
        dir: &Path,
        interval: Duration,
        take: impl Fn() -> Snapshot + Send + 'static,
    ) -> Result<Exporter> {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::InvalidUsage(format!(
                "NCCL_SWITCHLESS_METRICS_DIR={}: cannot create the directory: {e}",
                dir.display()
            ))
        })?;
        let path = snapshot_path(dir);
        let stop = Arc::new(Stop::default());
        let (s, p) = (Arc::clone(&stop), path.clone());
        // Started on one of NCCL's threads: not through std, which would keep the library mapped
        // after NCCL's dlclose until that thread exits (crate::sys::thread).
        let thread = crate::sys::thread::spawn("swl-metrics", move || run(&s, &p, interval, &take))
            .map_err(|e| Error::System(format!("starting the metrics thread: {e}")))?;
        tracing::info!(
            target: super::TARGET_INIT,
            "NET/switchless: metrics snapshot every {} ms in {}",
            interval.as_millis(),
            path.display()
        );
        Ok(Exporter {
            stop,
            thread: Some(thread),
            path,
        })
    }

    /// The file it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn run(stop: &Stop, path: &Path, interval: Duration, take: &dyn Fn() -> Snapshot) {
    let mut warned = false;
    let mut full = false;
    let history = history_path(path);
    let mut write = |last: bool| {
        let mut snap = take();
        snap.last = last;
        let r = write_snapshot(path, &snap).and_then(|()| {
            if full {
                return Ok(());
            }
            if !append_history(&history, &snap)? {
                full = true;
                tracing::warn!(
                    "NET/switchless: metrics: {} reached {} MiB; no more history is kept (the snapshot goes on)",
                    history.display(),
                    HISTORY_MAX_BYTES >> 20
                );
            }
            Ok(())
        });
        if let Err(e) = r {
            if !std::mem::replace(&mut warned, true) {
                tracing::warn!("NET/switchless: metrics: {e} (further failures are not logged)");
            }
        }
    };
    let Ok(mut stopped) = stop.stopped.lock() else {
        return;
    };
    loop {
        if *stopped {
            break;
        }
        drop(stopped);
        write(false);
        stopped = match stop.stopped.lock() {
            Ok(g) => g,
            Err(_) => return,
        };
        if *stopped {
            break;
        }
        stopped = match stop.wake.wait_timeout(stopped, interval) {
            Ok((g, _)) => g,
            Err(_) => return,
        };
    }
    drop(stopped);
    write(true);
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Ok(mut g) = self.stop.stopped.lock() {
            *g = true;
        }
        self.stop.wake.notify_all();
        if let Some(t) = self.thread.take() {
            t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::route::types::LocalLink;
    use crate::transport::metrics::Meter;

    fn plan(netdev: &str, addr: &str, remote: &str, kind: LinkKind) -> PathPlan {
        PathPlan {
            local: LocalLink {
                id: 0,
                kind,
                netdev: netdev.into(),
                rdma_dev: (kind == LinkKind::Roce).then(|| format!("r{netdev}")),
                port: 1,
                addr: addr.parse().unwrap(),
                gid_index: None,
                pci_root: "pci0000:00".into(),
                phys_port_id: 0,
                nccl_dev: Some(0),
                speed_mbps: 100_000,
                mtu: 9000,
                active_mtu: 4096,
                up: true,
            },
            remote: remote.parse().unwrap(),
            kind,
            relay: None,
        }
    }

    #[test]
    fn kinds_name_verbs_tcp_and_routed_paths() {
        assert_eq!(
            path_kind(&plan("a", "10.0.0.1/30", "10.0.0.2", LinkKind::Roce)),
            "verbs"
        );
        assert_eq!(
            path_kind(&plan("a", "10.0.0.1/30", "10.0.0.2", LinkKind::Tcp)),
            "tcp"
        );
        assert_eq!(
            path_kind(&plan("a", "10.0.0.1/30", "10.0.9.2", LinkKind::Tcp)),
            "routed"
        );
        // A relayed path, on the acceptor (its remote is the relay, on the link's subnet).
        let mut p = plan("a", "10.0.0.1/30", "10.0.0.2", LinkKind::Tcp);
        p.relay = Some(crate::transport::tcp::RelayVia {
            name: "10.0.0.2".into(),
            chained: false,
            dialer: None,
        });
        assert_eq!(path_kind(&p), "relay");
    }

    #[test]
    fn a_closed_connection_stays_in_the_totals_and_leaves_the_live_list() {
        let reg = Registry::new();
        let plans = [
            plan("a", "10.0.0.1/30", "10.0.0.2", LinkKind::Roce),
            plan("b", "10.0.1.1/30", "10.0.1.2", LinkKind::Roce),
        ];
        let mut m1 = Meter::new(2);
        let mut m2 = Meter::new(2);
        reg.add(true, "10.0.0.2", 0, &plans, m1.view()).unwrap();
        reg.add(true, "10.0.0.2", 0, &plans, m2.view()).unwrap();
        m1.sent(0, 1000);
        m1.sent(1, 500);
        m2.sent(0, 7);
        m1.registration(4096, true);
        let devs = ["d0".to_string()];
        // Pinned bytes are the fabric's figure, not a sum over the connections.
        let pinned = |i: usize| if i == 0 { 8192 } else { 0 };
        let s = reg.snapshot(&devs, &pinned, &Build::default(), Duration::from_secs(1));
        assert_eq!(s.devices[0].pinned_bytes, 8192);
        assert_eq!(s.connections.len(), 2);
        assert_eq!(s.paths.len(), 2);
        assert_eq!(s.paths[0].sent_bytes, 1007);
        assert_eq!(s.paths[0].connections_live, 2);
        assert_eq!(s.paths[1].sent_bytes, 500);
        assert_eq!(s.devices[0].registered_bytes, 4096);
        m1.sent(0, 1);
        drop(m1);
        let s = reg.snapshot(&devs, &|_| 0, &Build::default(), Duration::from_secs(1));
        assert_eq!(s.connections.len(), 1);
        assert_eq!(reg.live(), 1);
        assert_eq!(
            s.paths[0].sent_bytes, 1008,
            "the closed comm's last byte counts"
        );
        assert_eq!(
            (s.paths[0].connections_live, s.paths[0].connections_closed),
            (1, 1)
        );
        // Later snapshots keep it once (not again per snapshot).
        m2.sent(0, 2);
        let s = reg.snapshot(&devs, &|_| 0, &Build::default(), Duration::from_secs(1));
        assert_eq!(s.paths[0].sent_bytes, 1010);
        assert_eq!(s.devices[0].registered_bytes, 0);
    }

    #[test]
    fn closed_connections_leave_the_list_without_snapshots() {
        let reg = Registry::new();
        let plans = [plan("a", "10.0.0.1/30", "10.0.0.2", LinkKind::Tcp)];
        for i in 0..100u64 {
            let mut m = Meter::new(1);
            reg.add(true, "10.0.0.2", 0, &plans, m.view()).unwrap();
            m.sent(0, i);
        }
        // Each add folded the ones closed before it: one left (the last, now closed too).
        assert_eq!(reg.live(), 1);
        let s = reg.snapshot(&[], &|_| 0, &Build::default(), Duration::from_secs(1));
        assert_eq!(reg.live(), 0);
        assert_eq!(s.paths[0].sent_bytes, (0..100).sum::<u64>());
        assert_eq!(s.paths[0].connections_closed, 100);
    }

    #[test]
    fn the_exporter_writes_periodically_and_a_last_snapshot_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Arc::new(Registry::new());
        let mut m = Meter::new(1);
        reg.add(
            false,
            "10.0.0.2",
            0,
            &[plan("a", "10.0.0.1/30", "10.0.0.2", LinkKind::Tcp)],
            m.view(),
        )
        .unwrap();
        let r2 = Arc::clone(&reg);
        let ex = Exporter::start(dir.path(), Duration::from_millis(100), move || {
            r2.snapshot(&[], &|_| 0, &Build::default(), Duration::from_millis(100))
        })
        .unwrap();
        let path = ex.path().to_path_buf();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !path.exists() {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(10));
        }
        m.received(0, 12345, true);
        drop(m);
        drop(ex);
        let s: Snapshot = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(s.last);
        assert_eq!(s.schema, SNAPSHOT_SCHEMA);
        assert_eq!(s.pid, std::process::id());
        assert_eq!(s.paths[0].received_bytes, 12345);
        assert_eq!(s.paths[0].id.kind, "tcp");
        assert!(!path.with_extension("json.tmp").exists());
        let hist = std::fs::read_to_string(history_path(&path)).unwrap();
        let lines: Vec<Snapshot> = hist
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines.len() >= 2, "a periodic line and the last one");
        assert!(lines.last().unwrap().last);
        assert_eq!(lines.last().unwrap().paths[0].received_bytes, 12345);
    }

    #[test]
    fn a_link_planted_in_a_shared_directory_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let snap = Registry::new().snapshot(&[], &|_| 0, &Build::default(), Duration::from_secs(1));
        let path = dir.path().join("s.json");
        std::os::unix::fs::symlink(&victim, path.with_extension("json.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, history_path(&path)).unwrap();
        write_snapshot(&path, &snap).unwrap();
        assert!(append_history(&history_path(&path), &snap).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let back: Snapshot = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back.schema, SNAPSHOT_SCHEMA);
    }
}
