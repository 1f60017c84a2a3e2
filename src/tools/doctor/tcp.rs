//! The doctor's checks of point-to-point TCP links (MTU, offloads, receive queues, socket buffers),
//! over what `host::tcp` discovered.

use super::registry::check;
use crate::findings::{Finding, Severity};
use crate::host::model::HostModel;
use crate::transport::tcp::config::{TcpConfig, socket_buffer_bytes, streams_for_speed};

/// MTU a point-to-point TCP link should have, bytes (jumbo frames).
pub const JUMBO_MTU: u32 = 9000;

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
    fn buffer_sizes_follow_the_transport() {
        // 10 Gb/s: 4 streams, 100 µs → 62 500 bytes, raised to the 256 KiB floor.
        assert_eq!(wanted_buffer_bytes(10_000), 256 * 1024);
        // 400 Gb/s: 16 streams → 400000 × 100 / 64 = 625 000 → 626 688 (4 KiB multiple).
        assert_eq!(wanted_buffer_bytes(400_000), 626_688);
    }
}
