//! `switchless watch`: Gb/s sent and received per NCCL device, per member (PCIe function / CX-8
//! half) and per point-to-point TCP link, from the kernel's counters read twice. Reads files only
//! (through a [`Reader`], so `--root` trees work): it never opens a device, so it runs beside a job
//! without touching it.
//!
//! Counters, first found wins per RDMA port:
//! * `/sys/class/infiniband/<dev>/ports/<p>/counters/port_{xmit,rcv}_data`: 4-byte words (mlx5).
//! * otherwise the port's netdev `statistics/{tx,rx}_bytes` (soft-RoCE rdma_rxe has no port data
//!   counters; its RoCE packets pass through the netdev, headers included).
//!
//! and `hw_counters/{sent_pkts,rcvd_pkts}` (rdma_rxe) as packets/s where present. TCP links use the
//! netdev statistics. Depends on `host` (discovery, NCCL devices).

use std::net::Ipv4Addr;

use serde::Serialize;

use crate::host::{HostModel, NcclDevice, Reader};

/// Default imbalance threshold between siblings of one device, percent.
pub const DEFAULT_IMBALANCE_PCT: f64 = 25.0;
/// A member is idle when it moves less than this share of its busiest sibling's rate.
pub const IDLE_SHARE: f64 = 0.05;
/// Below this rate (Mb/s, sent + received) a device is not busy: no sibling flags.
pub const BUSY_MBPS: f64 = 1.0;

/// Where one counter pair comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// `counters/port_{xmit,rcv}_data` × 4 bytes.
    PortCounters,
    /// The netdev's `statistics/{tx,rx}_bytes`.
    NetdevStatistics,
    /// No readable counter.
    None,
}

/// One thing watched: an RDMA port (a device member) or a TCP link's netdev.
#[derive(Debug, Clone)]
struct Target {
    device: Option<usize>,
    rdma: Option<(String, u8)>,
    netdev: Option<String>,
    faces: Vec<Ipv4Addr>,
    speed_mbps: u32,
}

/// The counters of one target at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    pub tx_bytes: Option<u64>,
    pub rx_bytes: Option<u64>,
    pub tx_pkts: Option<u64>,
    pub rx_pkts: Option<u64>,
}

/// One sample: a reading of every target.
#[derive(Debug, Clone)]
pub struct Sample {
    readings: Vec<(Source, Reading)>,
}

/// What `watch` reads, fixed at start: the targets of the host model.
#[derive(Debug, Clone)]
pub struct Watch {
    devices: Vec<NcclDevice>,
    targets: Vec<Target>,
}

/// Rates of one member or TCP link.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `rdma_dev:port` of an RDMA member; None for a TCP link.
    pub rdma: Option<String>,
    pub netdev: Option<String>,
    /// Gb/s (10^9 bit/s); None when a counter is missing or went backwards (reset).
    pub tx_gbps: Option<f64>,
    pub rx_gbps: Option<f64>,
    /// Packets/s from `hw_counters` (rdma_rxe), when present.
    pub tx_pps: Option<f64>,
    pub rx_pps: Option<f64>,
    pub source: Source,
    /// The far addresses this member or link faces.
    pub faces: Vec<Ipv4Addr>,
    /// What it can carry, Mb/s.
    pub speed_mbps: u32,
}

/// One NCCL device (one cable) and its members.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceRow {
    pub index: usize,
    pub name: String,
    pub tx_gbps: Option<f64>,
    pub rx_gbps: Option<f64>,
    pub faces: Vec<Ipv4Addr>,
    pub speed_mbps: u32,
    pub members: Vec<Row>,
}

/// A flag raised on one sample.
#[derive(Debug, Clone, Serialize)]
pub struct Flag {
    /// `idle-beside-busy` or `imbalance`.
    pub kind: &'static str,
    pub device: String,
    pub message: String,
}

/// One interval's report (`--json`: schema `switchless-watch/1`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    /// Seconds between the two readings.
    pub interval_s: f64,
    pub devices: Vec<DeviceRow>,
    pub tcp_links: Vec<Row>,
    /// Imbalance threshold between siblings, percent.
    pub imbalance_pct: f64,
    pub flags: Vec<Flag>,
    /// The plugin's counters per peer and path (`--metrics-dir`), null without.
    pub plugin: Option<crate::tools::metrics::Report>,
}

pub const SCHEMA: &str = "switchless-watch/1";

fn read_u64(r: &Reader, path: &str) -> Option<u64> {
    r.read(path).ok()?.trim().parse().ok()
}

impl Watch {
    /// The targets of a host: every member of every NCCL device, then every TCP link.
    pub fn new(model: &HostModel) -> Self {
        let devices = model.nccl_devices(&|_, _| true, &|_| false);
        let mut targets = Vec::new();
        for d in &devices {
            for m in &d.members {
                targets.push(Target {
                    device: Some(d.index),
                    rdma: Some((m.rdma_dev.clone(), m.port)),
                    netdev: m.netdev.clone(),
                    faces: m
                        .netdev
                        .as_deref()
                        .map(|n| model.far_addresses(n))
                        .unwrap_or_default(),
                    speed_mbps: m.speed_mbps,
                });
            }
        }
        for t in &model.tcp_links {
            targets.push(Target {
                device: None,
                rdma: None,
                netdev: Some(t.netdev.clone()),
                faces: model.far_addresses(&t.netdev),
                speed_mbps: t.speed_mbps.unwrap_or(0),
            });
        }
        Watch { devices, targets }
    }

    /// Reads every counter now (the files are read again on every call).
    pub fn sample(&self, r: &Reader) -> Sample {
        let readings = self
            .targets
            .iter()
            .map(|t| {
                let mut rd = Reading::default();
                let mut src = Source::None;
                if let Some((dev, port)) = &t.rdma {
                    let base = format!("/sys/class/infiniband/{dev}/ports/{port}");
                    let x = read_u64(r, &format!("{base}/counters/port_xmit_data"));
                    let y = read_u64(r, &format!("{base}/counters/port_rcv_data"));
                    if x.is_some() || y.is_some() {
                        src = Source::PortCounters;
                        rd.tx_bytes = x.and_then(|v| v.checked_mul(4));
                        rd.rx_bytes = y.and_then(|v| v.checked_mul(4));
                    }
                    rd.tx_pkts = read_u64(r, &format!("{base}/hw_counters/sent_pkts"));
                    rd.rx_pkts = read_u64(r, &format!("{base}/hw_counters/rcvd_pkts"));
                }
                if src == Source::None {
                    if let Some(n) = &t.netdev {
                        let base = format!("/sys/class/net/{n}/statistics");
                        let x = read_u64(r, &format!("{base}/tx_bytes"));
                        let y = read_u64(r, &format!("{base}/rx_bytes"));
                        if x.is_some() || y.is_some() {
                            src = Source::NetdevStatistics;
                            rd.tx_bytes = x;
                            rd.rx_bytes = y;
                        }
                    }
                }
                (src, rd)
            })
            .collect();
        Sample { readings }
    }

    /// The rates between two samples `dt_s` seconds apart, and the flags they raise.
    pub fn report(&self, a: &Sample, b: &Sample, dt_s: f64, imbalance_pct: f64) -> Report {
        let rate = |x: Option<u64>, y: Option<u64>, scale: f64| -> Option<f64> {
            let d = y?.checked_sub(x?)?;
            (dt_s > 0.0).then(|| d as f64 * scale / dt_s)
        };
        let gbit = 8.0 / 1e9;
        let rows: Vec<Row> = self
            .targets
            .iter()
            .zip(a.readings.iter().zip(&b.readings))
            .map(|(t, ((_, ra), (src, rb)))| Row {
                rdma: t.rdma.as_ref().map(|(d, p)| format!("{d}:{p}")),
                netdev: t.netdev.clone(),
                tx_gbps: rate(ra.tx_bytes, rb.tx_bytes, gbit),
                rx_gbps: rate(ra.rx_bytes, rb.rx_bytes, gbit),
                tx_pps: rate(ra.tx_pkts, rb.tx_pkts, 1.0),
                rx_pps: rate(ra.rx_pkts, rb.rx_pkts, 1.0),
                source: *src,
                faces: t.faces.clone(),
                speed_mbps: t.speed_mbps,
            })
            .collect();
        let mut devices = Vec::new();
        let mut tcp_links = Vec::new();
        for (t, row) in self.targets.iter().zip(rows) {
            match t.device {
                Some(i) => {
                    if devices.last().is_none_or(|d: &DeviceRow| d.index != i) {
                        let Some(d) = self.devices.iter().find(|d| d.index == i) else {
                            continue;
                        };
                        devices.push(DeviceRow {
                            index: i,
                            name: d.name.clone(),
                            tx_gbps: Some(0.0),
                            rx_gbps: Some(0.0),
                            faces: d.peers.clone(),
                            speed_mbps: d.speed_mbps,
                            members: Vec::new(),
                        });
                    }
                    if let Some(d) = devices.last_mut() {
                        d.tx_gbps = sum(d.tx_gbps, row.tx_gbps);
                        d.rx_gbps = sum(d.rx_gbps, row.rx_gbps);
                        d.members.push(row);
                    }
                }
                None => tcp_links.push(row),
            }
        }
        let flags = devices
            .iter()
            .flat_map(|d| sibling_flags(d, imbalance_pct))
            .collect();
        Report {
            schema: SCHEMA,
            interval_s: dt_s,
            devices,
            tcp_links,
            imbalance_pct,
            flags,
            plugin: None,
        }
    }
}

fn sum(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? + b?)
}

/// Sent + received, Mb/s (None when either is unknown).
fn total_mbps(r: &Row) -> Option<f64> {
    Some((r.tx_gbps? + r.rx_gbps?) * 1000.0)
}

fn member_name(r: &Row) -> String {
    match (&r.rdma, &r.netdev) {
        (Some(a), Some(n)) => format!("{a} ({n})"),
        (Some(a), None) => a.clone(),
        (None, Some(n)) => n.clone(),
        (None, None) => "?".into(),
    }
}

/// Idle member beside a busy sibling; siblings apart by more than `imbalance_pct`.
fn sibling_flags(d: &DeviceRow, imbalance_pct: f64) -> Vec<Flag> {
    let mut out = Vec::new();
    let known: Vec<(&Row, f64)> = d
        .members
        .iter()
        .filter_map(|m| total_mbps(m).map(|t| (m, t)))
        .collect();
    if known.len() < 2 {
        return out;
    }
    let Some(&(busiest, top)) = known.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
        return out;
    };
    if top < BUSY_MBPS {
        return out;
    }
    let mut active = Vec::new();
    for &(m, t) in &known {
        if t < top * IDLE_SHARE {
            out.push(Flag {
                kind: "idle-beside-busy",
                device: d.name.clone(),
                message: format!(
                    "{} moves {:.3} Gb/s while its sibling {} moves {:.3} Gb/s (sent + received): half of the \
                     cable is idle (a function unaddressed at the far end, or routes that skip it; see \
                     switchless doctor --fleet)",
                    member_name(m),
                    t / 1000.0,
                    member_name(busiest),
                    top / 1000.0
                ),
            });
        } else {
            active.push((m, t));
        }
    }
    if let Some(&(low, lt)) = active.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        let spread = (top - lt) / top * 100.0;
        if active.len() >= 2 && spread > imbalance_pct {
            out.push(Flag {
                kind: "imbalance",
                device: d.name.clone(),
                message: format!(
                    "{} moves {:.3} Gb/s, {} {:.3} Gb/s: {spread:.0}% apart (threshold {imbalance_pct:.0}%); \
                     the stripe should split a device's traffic evenly over its members",
                    member_name(busiest),
                    top / 1000.0,
                    member_name(low),
                    lt / 1000.0
                ),
            });
        }
    }
    out
}

fn g(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "?".into())
}

fn faces_text(v: &[Ipv4Addr]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn source_text(s: Source) -> &'static str {
    match s {
        Source::PortCounters => "port counters",
        Source::NetdevStatistics => "netdev statistics",
        Source::None => "no counters",
    }
}

fn pps(r: &Row) -> String {
    match (r.tx_pps, r.rx_pps) {
        (Some(t), Some(x)) => format!("{t:.0}/{x:.0} pkt/s"),
        _ => String::new(),
    }
}

/// The text form of one report: a table of devices with their members, TCP links, then flags.
pub fn render_text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut rows: Vec<Vec<String>> = vec![
        [
            "DEVICE / MEMBER",
            "TX Gb/s",
            "RX Gb/s",
            "OF Gb/s",
            "FACES",
            "SOURCE",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    ];
    let of = |m: u32| {
        let g = f64::from(m) / 1000.0;
        if g.fract() == 0.0 {
            format!("{g:.0}")
        } else {
            format!("{g:.1}")
        }
    };
    for d in &r.devices {
        rows.push(vec![
            format!("{} {}", d.index, d.name),
            g(d.tx_gbps),
            g(d.rx_gbps),
            of(d.speed_mbps),
            faces_text(&d.faces),
            String::new(),
        ]);
        for m in &d.members {
            rows.push(vec![
                format!("  {}", member_name(m)),
                g(m.tx_gbps),
                g(m.rx_gbps),
                of(m.speed_mbps),
                faces_text(&m.faces),
                format!("{} {}", source_text(m.source), pps(m))
                    .trim_end()
                    .to_string(),
            ]);
        }
    }
    for t in &r.tcp_links {
        rows.push(vec![
            format!("tcp {}", member_name(t)),
            g(t.tx_gbps),
            g(t.rx_gbps),
            of(t.speed_mbps),
            faces_text(&t.faces),
            source_text(t.source).to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "interval {:.2} s; Gb/s = 10^9 bit/s sent (TX) and received (RX); OF = its share of the device's rate \
         (a GB10 function: 100 of its cable's 200 Gb/s; alone, its PCIe Gen5 x4 link carries up to 126)",
        r.interval_s
    );
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if (1..=3).contains(&i) {
                    format!("{c:>w$}", w = widths[i])
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    if r.devices.is_empty() && r.tcp_links.is_empty() {
        let _ = writeln!(
            out,
            "nothing to watch: no NCCL device and no point-to-point TCP link (see switchless doctor)"
        );
    }
    for f in &r.flags {
        let _ = writeln!(out, "FLAG [{}] {}: {}", f.kind, f.device, f.message);
    }
    out
}

/// The kernel's rate of a plugin path's local port in its direction (`send`: TX, `recv`: RX), Gb/s:
/// the RDMA port when the path names one, else its netdev.
pub fn kernel_gbps(r: &Report, id: &crate::transport::metrics::PathId) -> Option<f64> {
    let pick = |row: &Row| {
        if id.direction == "send" {
            row.tx_gbps
        } else {
            row.rx_gbps
        }
    };
    let rows = r
        .devices
        .iter()
        .flat_map(|d| d.members.iter())
        .chain(&r.tcp_links);
    let mut by_netdev = None;
    for row in rows {
        if !id.rdma_dev.is_empty()
            && row
                .rdma
                .as_deref()
                .is_some_and(|a| a.split(':').next() == Some(id.rdma_dev.as_str()))
        {
            return pick(row);
        }
        if by_netdev.is_none() && row.netdev.as_deref() == Some(id.netdev.as_str()) {
            by_netdev = Some(pick(row));
        }
    }
    by_netdev.flatten()
}
