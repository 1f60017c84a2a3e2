//! Point-to-point TCP links and their tuning, for `switchless doctor`.
//!
//! A **TCP link** is what the TCP transport uses as a path: a [`LinkKind::Tcp`] local link (an IPv4
//! address on a PCI netdev that no RDMA port holds as a RoCE v2 GID), on a netdev with no RDMA device
//! at all. It is **point-to-point** when its connected subnet is a /30 or /31: the rule the plugin's
//! TCP data paths use, so doctor tunes exactly the links the transport would carry data on.
//!
//! What is read for those links (all through the [`Reader`], so `--root` and `--capture` work):
//! * `/sys/class/net/<if>/queues/` (listing): the `rx-N` entries are the active receive queues.
//! * `/proc/sys/net/core/{rmem,wmem}_max`, `/proc/sys/net/ipv4/tcp_{rmem,wmem}` (third field):
//!   socket buffer limits, read only when the host has a TCP link.
//! * GRO / TSO: no kernel file holds netdev features (they come from the ethtool ioctl/netlink). Under
//!   a root other than `/` the text of `ethtool -k <if>` is read from `/ethtool-k/<if>`; on a live host
//!   `switchless doctor` runs `ethtool -k <if>` (when the binary exists) and `--capture` saves its
//!   output there. Without that source (no ethtool, the plugin's own discovery, an older capture) the
//!   offload check is skipped. Every other missing source also skips its check silently.

use ipnet::Ipv4Net;
use serde::Serialize;

use super::model::{HostModel, NetAddr};
use super::reader::Reader;
use crate::findings::{Finding, Severity};
use crate::route::types::LinkKind;
use crate::transport::tcp::{TcpConfig, socket_buffer_bytes, streams_for_speed};

/// Check ids of the TCP link checks (documented in docs/readme/fabric.md).
pub mod check {
    pub const TCP_MTU_BELOW_9000: &str = "tcp-mtu-below-9000";
    pub const TCP_OFFLOAD_OFF: &str = "tcp-offload-off";
    pub const TCP_RX_QUEUES_LOW: &str = "tcp-rx-queues-low";
    pub const TCP_SOCKET_BUFFERS_LOW: &str = "tcp-socket-buffers-low";
}

/// MTU a point-to-point TCP link should have, bytes (jumbo frames).
pub const JUMBO_MTU: u32 = 9000;

/// One feature line of `ethtool -k`: `on`/`off`, and `[fixed]` (the driver cannot change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Toggle {
    pub on: bool,
    pub fixed: bool,
}

/// GRO and TSO of a netdev, from the text of `ethtool -k`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Features {
    /// The logical path the text was read from (`/ethtool-k/<if>`).
    pub source: String,
    /// `generic-receive-offload`.
    pub gro: Option<Toggle>,
    /// `tcp-segmentation-offload`.
    pub tso: Option<Toggle>,
}

/// A point-to-point TCP link (one per netdev: its first point-to-point address).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TcpLink {
    pub netdev: String,
    /// Address with the prefix of its connected subnet.
    pub addr: Ipv4Net,
    /// Why it is point-to-point: "/30" or "/31".
    pub point_to_point: String,
    /// What the link can carry, Mb/s: min(netdev speed, PCIe bandwidth); None when unknown.
    pub speed_mbps: Option<u32>,
    /// Netdev MTU, bytes.
    pub mtu: Option<u32>,
    pub up: bool,
    /// Active receive queues (`queues/rx-N` entries); None when unreadable.
    pub rx_queues: Option<u32>,
    /// Streams the TCP transport opens per path at this speed (`streams_for_speed`).
    pub streams: usize,
    /// GRO/TSO; None when no source was available.
    pub features: Option<Features>,
}

/// Socket buffer limits, bytes; None when the file is missing or unparsable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BufferLimits {
    /// `net.core.rmem_max`: cap of an explicit `SO_RCVBUF`.
    pub rmem_max: Option<u64>,
    /// `net.core.wmem_max`: cap of an explicit `SO_SNDBUF`.
    pub wmem_max: Option<u64>,
    /// Third field of `net.ipv4.tcp_rmem`: ceiling of receive autotuning.
    pub tcp_rmem_max: Option<u64>,
    /// Third field of `net.ipv4.tcp_wmem`: ceiling of send autotuning.
    pub tcp_wmem_max: Option<u64>,
}

/// Why the subnet of `a` on `n` is point-to-point, or None.
pub fn point_to_point(a: &NetAddr) -> Option<&'static str> {
    // An address without its connected route is not (yet) usable as a cable end.
    if !a.has_route || !crate::route::point_to_point(a.addr) {
        return None;
    }
    Some(if a.addr.prefix_len() == 31 {
        "/31"
    } else {
        "/30"
    })
}

/// Parses the text of `ethtool -k <if>` ("generic-receive-offload: on", "…: off \[fixed\]").
pub fn parse_features(source: &str, text: &str) -> Features {
    let get = |key: &str| -> Option<Toggle> {
        text.lines().find_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            if k.trim() != key {
                return None;
            }
            let v = v.trim();
            let on = match v.split_whitespace().next()? {
                "on" => true,
                "off" => false,
                _ => return None,
            };
            Some(Toggle {
                on,
                fixed: v.contains("[fixed]"),
            })
        })
    };
    Features {
        source: source.to_string(),
        gro: get("generic-receive-offload"),
        tso: get("tcp-segmentation-offload"),
    }
}

fn warn_file(findings: &mut Vec<Finding>, path: &str, what: String) {
    findings.push(Finding::new(
        Severity::Warning,
        super::discover::CHECK_KERNEL_FILE,
        format!("file {path}"),
        what,
        "check that the file is readable (containers may hide /proc/sys); replace a hand-edited capture file with the tool's output",
    ));
}

/// Finds the point-to-point TCP links of `model` and reads their tuning into `model.tcp_links` and
/// `model.tcp_buffers`. Unparsable files become `kernel-file` warnings in `findings`.
pub fn read_tcp(reader: &Reader, model: &mut HostModel, findings: &mut Vec<Finding>) {
    let mut out: Vec<TcpLink> = Vec::new();
    for l in model.local_links(&[]) {
        if l.kind != LinkKind::Tcp || out.iter().any(|t| t.netdev == l.netdev) {
            continue;
        }
        let Some(n) = model.netdev(&l.netdev) else {
            continue;
        };
        if !n.rdma.is_empty() {
            continue;
        }
        let Some(a) = n.addrs.iter().find(|a| a.addr == l.addr) else {
            continue;
        };
        let Some(why) = point_to_point(a) else {
            continue;
        };
        let rx_queues = reader
            .list(&format!("/sys/class/net/{}/queues", n.name))
            .ok()
            .map(|v| v.iter().filter(|q| q.starts_with("rx-")).count())
            .and_then(|c| u32::try_from(c).ok());
        let src = format!("/ethtool-k/{}", n.name);
        let features = match reader.tool_output(&src, &["ethtool", "-k", &n.name]) {
            Ok(text) => {
                let f = parse_features(&src, &text);
                if f.gro.is_none() && f.tso.is_none() {
                    warn_file(
                        findings,
                        &src,
                        format!(
                            "{src} has no \"generic-receive-offload: on|off\" or \"tcp-segmentation-offload: on|off\" line; expected the output of ethtool -k {}",
                            n.name
                        ),
                    );
                    None
                } else {
                    Some(f)
                }
            }
            Err(_) => None,
        };
        let speed = (l.speed_mbps > 0).then_some(l.speed_mbps);
        out.push(TcpLink {
            netdev: n.name.clone(),
            addr: a.addr,
            point_to_point: why.to_string(),
            speed_mbps: speed,
            mtu: n.mtu,
            up: n.is_up(),
            rx_queues,
            streams: streams_for_speed(u64::from(l.speed_mbps)),
            features,
        });
    }
    if !out.is_empty() {
        let mut sysctl = |path: &str, field_max: bool| -> Option<u64> {
            let s = reader.read(path).ok()?;
            let v = if field_max {
                s.split_whitespace().nth(2)
            } else {
                s.split_whitespace().next()
            };
            match v.and_then(|v| v.parse::<u64>().ok()) {
                Some(v) => Some(v),
                None => {
                    let want = if field_max {
                        "three byte counts (min default max), e.g. \"4096 131072 6291456\""
                    } else {
                        "a byte count, e.g. \"212992\""
                    };
                    warn_file(
                        findings,
                        path,
                        format!("{path} holds {s:?}; expected {want}"),
                    );
                    None
                }
            }
        };
        model.tcp_buffers = Some(BufferLimits {
            rmem_max: sysctl("/proc/sys/net/core/rmem_max", false),
            wmem_max: sysctl("/proc/sys/net/core/wmem_max", false),
            tcp_rmem_max: sysctl("/proc/sys/net/ipv4/tcp_rmem", true),
            tcp_wmem_max: sysctl("/proc/sys/net/ipv4/tcp_wmem", true),
        });
    }
    model.tcp_links = out;
}

/// Socket buffer size the TCP transport wants on a path of `speed_mbps` (default RTT and streams).
pub fn wanted_buffer_bytes(speed_mbps: u32) -> u64 {
    let speed = u64::from(speed_mbps);
    socket_buffer_bytes(speed, TcpConfig::default().rtt_us, streams_for_speed(speed)) as u64
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / f64::from(1u32 << 20))
}

fn opt_bytes(v: Option<u64>) -> String {
    v.map(|b| format!("{b} bytes"))
        .unwrap_or_else(|| "unknown".to_string())
}

/// Every TCP link check over the model.
pub fn checks(m: &HostModel) -> Vec<Finding> {
    let mut f = Vec::new();
    for t in &m.tcp_links {
        let obj = format!("netdev {}", t.netdev);
        let what = format!(
            "point-to-point TCP link {} ({}, {}, {})",
            t.netdev,
            t.addr,
            t.point_to_point,
            t.speed_mbps
                .map(|s| format!("{s} Mb/s"))
                .unwrap_or_else(|| "speed unknown".into())
        );
        if let Some(mtu) = t.mtu.filter(|m| *m < JUMBO_MTU) {
            f.push(Finding::new(
                Severity::Warning,
                check::TCP_MTU_BELOW_9000,
                obj.clone(),
                format!(
                    "{what} has MTU {mtu} bytes, below {JUMBO_MTU} bytes: {:.1}× the packets of jumbo frames for the same data, and per-packet CPU is what limits TCP on 10GBase-T",
                    f64::from(JUMBO_MTU) / f64::from(mtu.max(1))
                ),
                format!("ip link set {} mtu {JUMBO_MTU} on both ends of the cable (persist it in netplan / NetworkManager)", t.netdev),
            ));
        }
        if let Some(feat) = &t.features {
            let off: Vec<String> = [("GRO", feat.gro), ("TSO", feat.tso)]
                .into_iter()
                .filter_map(|(n, v)| {
                    v.filter(|v| !v.on)
                        .map(|v| format!("{n} off{}", if v.fixed { " [fixed]" } else { "" }))
                })
                .collect();
            if !off.is_empty() {
                f.push(Finding::new(
                    Severity::Warning,
                    check::TCP_OFFLOAD_OFF,
                    obj.clone(),
                    format!("{what}: {} (from {}): without generic receive offload and TCP segmentation offload the kernel handles every MTU-sized packet, so the CPU limits throughput", off.join(", "), feat.source),
                    format!("ethtool -K {} gro on tso on (a [fixed] feature needs another driver or firmware)", t.netdev),
                ));
            }
        }
        if let (Some(q), Some(speed)) = (t.rx_queues, t.speed_mbps) {
            let need = streams_for_speed(u64::from(speed));
            if (q as usize) < need {
                f.push(Finding::new(
                    Severity::Warning,
                    check::TCP_RX_QUEUES_LOW,
                    obj.clone(),
                    format!("{what} has {q} receive queue(s); the TCP transport opens {need} streams per path at {speed} Mb/s and RSS needs at least one queue (and core) per stream, so streams share a core"),
                    format!("ethtool -L {} combined {need} (or rx {need}), and let irqbalance spread the queue interrupts over cores", t.netdev),
                ));
            }
        }
    }
    if let (Some(b), Some(fast)) = (
        m.tcp_buffers,
        m.tcp_links
            .iter()
            .filter_map(|t| t.speed_mbps.map(|s| (s, t)))
            .rev()
            .max_by_key(|(s, _)| *s),
    ) {
        let (speed, link) = fast;
        let want = wanted_buffer_bytes(speed);
        let covers = |a: Option<u64>, c: Option<u64>| match (a, c) {
            (Some(a), Some(c)) => Some(a >= want && c >= want),
            _ => None,
        };
        // The transport keeps autotuning when the tcp_rmem/tcp_wmem maxima cover the size, and sets
        // both buffers explicitly otherwise (capped at rmem_max/wmem_max).
        let auto = covers(b.tcp_rmem_max, b.tcp_wmem_max);
        let explicit = covers(b.rmem_max, b.wmem_max);
        if auto == Some(false) && explicit == Some(false) {
            f.push(Finding::new(
                Severity::Warning,
                check::TCP_SOCKET_BUFFERS_LOW,
                "host TCP buffer limits",
                format!(
                    "a TCP stream on {} ({speed} Mb/s, {} streams, {} µs RTT assumed) needs socket buffers of {want} bytes ({}) for the bandwidth-delay product, but autotuning stops at net.ipv4.tcp_rmem {} / tcp_wmem {} and explicit buffers are capped at net.core.rmem_max {} / wmem_max {}",
                    link.netdev,
                    streams_for_speed(u64::from(speed)),
                    TcpConfig::default().rtt_us,
                    mib(want),
                    opt_bytes(b.tcp_rmem_max),
                    opt_bytes(b.tcp_wmem_max),
                    opt_bytes(b.rmem_max),
                    opt_bytes(b.wmem_max),
                ),
                format!("sysctl -w net.core.rmem_max={want} net.core.wmem_max={want} (persist in /etc/sysctl.d/90-switchless.conf), or raise the third field of net.ipv4.tcp_rmem/tcp_wmem to at least {want}"),
            ));
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ethtool_k() {
        let t = "Features for eth0:\nrx-checksumming: on\ntcp-segmentation-offload: off\n\ttx-tcp-segmentation: off\ngeneric-receive-offload: off [fixed]\n";
        let f = parse_features("/ethtool-k/eth0", t);
        assert_eq!(
            f.tso,
            Some(Toggle {
                on: false,
                fixed: false
            })
        );
        assert_eq!(
            f.gro,
            Some(Toggle {
                on: false,
                fixed: true
            })
        );
        let f = parse_features("x", "generic-receive-offload: on\n");
        assert_eq!(
            f.gro,
            Some(Toggle {
                on: true,
                fixed: false
            })
        );
        assert_eq!(f.tso, None);
        assert_eq!(parse_features("x", "garbage").gro, None);
    }

    #[test]
    fn buffer_sizes_follow_the_transport() {
        // 10 Gb/s: 4 streams, 100 µs → 62 500 bytes, raised to the 256 KiB floor.
        assert_eq!(wanted_buffer_bytes(10_000), 256 * 1024);
        // 400 Gb/s: 16 streams → 400000 × 100 / 64 = 625 000 → 626 688 (4 KiB multiple).
        assert_eq!(wanted_buffer_bytes(400_000), 626_688);
    }
}
