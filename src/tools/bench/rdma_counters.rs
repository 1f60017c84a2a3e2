//! Packets this host's RDMA devices sent and received while the latency bench's timed round trips
//! ran, from the ports' own counters: rxe's `hw_counters/sent_pkts` and `rcvd_pkts`, else the
//! standard `counters/port_xmit_packets` and `port_rcv_packets` (a NIC's: every packet of the port,
//! not only this job's), with RNR NAKs and retransmissions where the device counts them. Issue 36:
//! packets per message stay measured on real devices, not only in the model.
#![forbid(unsafe_code)]

use std::path::Path;

/// Where the kernel lists RDMA devices.
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// Counter files that count RNR NAKs (sent or received, or retries exhausted by them).
const RNR: [&str; 3] = ["send_rnr_err", "rcvd_rnr_err", "rnr_nak_retry_err"];
/// Counter files that count retransmissions (a requester's retries, a responder's duplicates).
const RETRIES: [&str; 3] = [
    "completer_retry_err",
    "duplicate_request",
    "local_ack_timeout_err",
];

/// One port's counts at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortCounts {
    /// `<device>/<port>`.
    pub port: String,
    pub sent: u64,
    pub rcvd: u64,
    pub rnr: u64,
    pub retries: u64,
}

/// Reads every port of every device under `root` (the sysfs class directory). A port without
/// packet counters is left out; a device directory that cannot be read is skipped (the figure is
/// a measurement aid, never a reason to fail a run).
pub fn snapshot(root: &Path) -> Vec<PortCounts> {
    let mut out = Vec::new();
    let Ok(devs) = std::fs::read_dir(root) else {
        return out;
    };
    let mut devs: Vec<_> = devs.flatten().map(|e| e.file_name()).collect();
    devs.sort();
    for dev in devs {
        let dev = dev.to_string_lossy().into_owned();
        let Ok(ports) = std::fs::read_dir(root.join(&dev).join("ports")) else {
            continue;
        };
        let mut ports: Vec<_> = ports.flatten().map(|e| e.file_name()).collect();
        ports.sort();
        for port in ports {
            let port = port.to_string_lossy().into_owned();
            let dir = root.join(&dev).join("ports").join(&port);
            let read = |sub: &str, f: &str| -> Option<u64> {
                std::fs::read_to_string(dir.join(sub).join(f))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            let (sent, rcvd) = match (
                read("hw_counters", "sent_pkts"),
                read("hw_counters", "rcvd_pkts"),
            ) {
                (Some(s), Some(r)) => (s, r),
                _ => match (
                    read("counters", "port_xmit_packets"),
                    read("counters", "port_rcv_packets"),
                ) {
                    (Some(s), Some(r)) => (s, r),
                    _ => continue,
                },
            };
            let sum = |names: &[&str]| -> u64 {
                names
                    .iter()
                    .filter_map(|f| read("hw_counters", f))
                    .fold(0u64, u64::wrapping_add)
            };
            out.push(PortCounts {
                port: format!("{dev}/{port}"),
                sent,
                rcvd,
                rnr: sum(&RNR),
                retries: sum(&RETRIES),
            });
        }
    }
    out
}

/// One port's packets per round trip over the timed interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PortRate {
    pub port: String,
    pub sent: f64,
    pub rcvd: f64,
}

/// This host's RDMA packets per timed round trip (both directions of the port counters), with
/// the RNR NAKs and retransmissions counted meanwhile (totals, not per round trip).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HostPackets {
    pub round_trips: u64,
    pub sent_per_round_trip: f64,
    pub rcvd_per_round_trip: f64,
    pub rnr_naks: u64,
    pub retries: u64,
    pub ports: Vec<PortRate>,
}

impl HostPackets {
    /// The difference of two snapshots over `round_trips`; `None` when no port was in both.
    pub fn between(
        before: &[PortCounts],
        after: &[PortCounts],
        round_trips: u64,
    ) -> Option<HostPackets> {
        let n = round_trips.max(1) as f64;
        let mut h = HostPackets {
            round_trips,
            sent_per_round_trip: 0.0,
            rcvd_per_round_trip: 0.0,
            rnr_naks: 0,
            retries: 0,
            ports: Vec::new(),
        };
        for a in after {
            let Some(b) = before.iter().find(|b| b.port == a.port) else {
                continue; // a port that came up meanwhile: no baseline
            };
            // Counters only grow; a reset (driver reload) reads as 0 rather than a wrap.
            let d = |x: u64, y: u64| y.saturating_sub(x);
            let (s, r) = (d(b.sent, a.sent), d(b.rcvd, a.rcvd));
            h.rnr_naks += d(b.rnr, a.rnr);
            h.retries += d(b.retries, a.retries);
            h.sent_per_round_trip += s as f64 / n;
            h.rcvd_per_round_trip += r as f64 / n;
            h.ports.push(PortRate {
                port: a.port.clone(),
                sent: s as f64 / n,
                rcvd: r as f64 / n,
            });
        }
        (!h.ports.is_empty()).then_some(h)
    }

    /// One report line.
    pub fn line(&self, rank: usize, size: usize) -> String {
        let ports: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("{} {:.2}/{:.2}", p.port, p.sent, p.rcvd))
            .collect();
        format!(
            "# RDMA packets per round trip at {size} B (rank {rank}'s host, port counters, all \
             traffic of its ports, {} round trips): sent {:.2}, received {:.2} ({}); RNR NAKs {}, \
             retries {}",
            self.round_trips,
            self.sent_per_round_trip,
            self.rcvd_per_round_trip,
            ports.join(", "),
            self.rnr_naks,
            self.retries
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(root: &Path, dev: &str, p: &str, files: &[(&str, u64)]) {
        for (f, v) in files {
            let path = root.join(dev).join("ports").join(p).join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn rxe_and_standard_counters_give_packets_per_round_trip() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let rxe = |s, r, rnr, dup| {
            [
                ("hw_counters/sent_pkts", s),
                ("hw_counters/rcvd_pkts", r),
                ("hw_counters/send_rnr_err", rnr),
                ("hw_counters/duplicate_request", dup),
            ]
        };
        port(root, "rxe_eth1", "1", &rxe(100, 90, 0, 0));
        port(
            root,
            "mlx5_0",
            "1",
            &[
                ("counters/port_xmit_packets", 1000),
                ("counters/port_rcv_packets", 1000),
            ],
        );
        // A port with no packet counters is left out.
        port(root, "odd0", "1", &[("hw_counters/other", 5)]);
        let before = snapshot(root);
        assert_eq!(before.len(), 2, "{before:?}");
        port(root, "rxe_eth1", "1", &rxe(100 + 4 * 50, 90 + 4 * 50, 1, 2));
        port(
            root,
            "mlx5_0",
            "1",
            &[
                ("counters/port_xmit_packets", 1100),
                ("counters/port_rcv_packets", 1050),
            ],
        );
        let after = snapshot(root);
        let h = HostPackets::between(&before, &after, 50).unwrap();
        assert_eq!(h.ports.len(), 2);
        let rxe = h.ports.iter().find(|p| p.port == "rxe_eth1/1").unwrap();
        assert_eq!((rxe.sent, rxe.rcvd), (4.0, 4.0));
        let mlx = h.ports.iter().find(|p| p.port == "mlx5_0/1").unwrap();
        assert_eq!((mlx.sent, mlx.rcvd), (2.0, 1.0));
        assert_eq!((h.sent_per_round_trip, h.rcvd_per_round_trip), (6.0, 5.0));
        assert_eq!((h.rnr_naks, h.retries), (1, 2));
        assert!(
            h.line(0, 8).contains("sent 6.00, received 5.00"),
            "{}",
            h.line(0, 8)
        );
    }

    #[test]
    fn no_devices_or_garbage_gives_nothing_not_an_error() {
        let t = tempfile::tempdir().unwrap();
        assert!(snapshot(&t.path().join("absent")).is_empty());
        port(
            t.path(),
            "rxe0",
            "1",
            &[("hw_counters/sent_pkts", 1), ("hw_counters/rcvd_pkts", 1)],
        );
        std::fs::write(
            t.path().join("rxe0/ports/1/hw_counters/sent_pkts"),
            "garbage",
        )
        .unwrap();
        assert!(snapshot(t.path()).is_empty());
        assert!(HostPackets::between(&[], &[], 10).is_none());
    }
}
