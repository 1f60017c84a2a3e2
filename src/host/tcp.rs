//! Point-to-point TCP links and their tuning: discovery (the checks are `tools::doctor::tcp`).
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

use super::model::{BufferLimits, Features, HostModel, NetAddr, TcpLink, Toggle};
use super::reader::Reader;
use crate::findings::{Finding, Severity};
use crate::route::types::LinkKind;
use crate::transport::tcp::config::streams_for_speed;

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
        crate::findings::CHECK_KERNEL_FILE,
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
}
