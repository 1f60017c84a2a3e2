//! `switchless doctor --probe`: on the live host, each cable's far end is asked once. Per addressed
//! point-to-point netdev (a RoCE port or a TCP link on a /30 or /31): a ping to each far address of
//! its subnet (the plan's peer under `--plan`), and a ping to the IPv6 all-nodes address, after which
//! the neighbour table holds the MAC of whatever answers on that wire, whichever subnet it is in.
//! The result is kept in a tree at [`CAPTURED`] (`--capture`), where `doctor --fleet` names the host
//! and port behind each MAC. Never run by discovery or the plugin: only on request.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::registry::check;
use crate::findings::{Finding, Severity};
use crate::host::{HostModel, Reader};

/// Where a capture keeps the probe (a logical path of the tree).
pub const CAPTURED: &str = "/switchless/probe.json";

/// One far address pinged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pinged {
    pub addr: Ipv4Addr,
    pub answered: bool,
}

/// What one netdev's wire showed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wire {
    pub pinged: Vec<Pinged>,
    /// MACs that answered on this wire (neighbour entries after the pings), this host's own left out.
    pub far_macs: Vec<String>,
}

/// The probe of one host, by netdev.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    pub wires: BTreeMap<String, Wire>,
}

/// The netdevs to probe and the far addresses of each: every up netdev with a point-to-point
/// address (its other host), or the planned peers given in `planned` (netdev → peer) instead.
pub fn targets(
    m: &HostModel,
    planned: &BTreeMap<String, Ipv4Addr>,
) -> BTreeMap<String, Vec<Ipv4Addr>> {
    let mut out: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
    for n in m.netdevs.iter().filter(|n| n.is_up() && n.name != "lo") {
        let mut peers: Vec<Ipv4Addr> = n
            .addrs
            .iter()
            .filter_map(|a| crate::route::point_to_point_peers(a.addr))
            .flatten()
            .collect();
        if let Some(p) = planned.get(&n.name) {
            peers = vec![*p];
        }
        if !peers.is_empty() {
            out.insert(n.name.clone(), peers);
        }
    }
    for (n, p) in planned {
        if m.netdev(n).is_some_and(|d| d.is_up()) {
            out.entry(n.clone()).or_insert_with(|| vec![*p]);
        }
    }
    out
}

fn quiet(cmd: &mut Command) -> Option<std::process::Output> {
    cmd.env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
}

/// MACs of the neighbour entries of `ifname` (IPv4 and IPv6), from `ip -j neigh show dev IF`.
fn neighbour_macs(ifname: &str) -> Vec<String> {
    let Some(out) = quiet(Command::new("ip").args(["-j", "neigh", "show", "dev", ifname])) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["lladdr"].as_str())
                .map(str::to_ascii_lowercase)
                .collect()
        })
        .unwrap_or_default()
}

/// Pings every target once (one second each, all wires at once) and reads what answered.
pub fn run(m: &HostModel, targets: &BTreeMap<String, Vec<Ipv4Addr>>) -> Probe {
    let own: Vec<String> = m
        .netdevs
        .iter()
        .filter_map(|n| n.mac.as_deref().map(str::to_ascii_lowercase))
        .collect();
    let wires = std::thread::scope(|s| {
        let handles: Vec<_> = targets
            .iter()
            .map(|(ifname, peers)| {
                let own = &own;
                s.spawn(move || {
                    let pinged = peers
                        .iter()
                        .map(|p| Pinged {
                            addr: *p,
                            answered: quiet(Command::new("ping").args([
                                "-n",
                                "-q",
                                "-c",
                                "1",
                                "-W",
                                "1",
                                "-I",
                                ifname,
                                &p.to_string(),
                            ]))
                            .is_some_and(|o| o.status.success()),
                        })
                        .collect();
                    // Whatever is on the wire answers the all-nodes address, whichever subnet it is in.
                    let _ = quiet(Command::new("ping").args([
                        "-6", "-n", "-q", "-c", "2", "-W", "1", "-I", ifname, "ff02::1",
                    ]));
                    let mut far_macs: Vec<String> = neighbour_macs(ifname)
                        .into_iter()
                        .filter(|mac| !own.contains(mac))
                        .collect();
                    far_macs.sort();
                    far_macs.dedup();
                    (ifname.clone(), Wire { pinged, far_macs })
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    Probe { wires }
}

impl Probe {
    /// The probe kept in the tree `rd` reads, if any.
    pub fn captured(rd: &Reader) -> Option<Result<Probe, String>> {
        let text = rd.read(CAPTURED).ok()?;
        Some(serde_json::from_str(&text).map_err(|e| format!("{CAPTURED}: {e}")))
    }

    /// Writes the probe into a capture directory at [`CAPTURED`].
    pub fn write_capture(&self, dir: &Path) -> std::io::Result<()> {
        let p = dir.join(CAPTURED.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(p, text + "\n")
    }
}

/// The single-host findings of a probe: a far address that did not answer (`probe-no-answer`),
/// saying whether anything answered on that wire at all. `peer_of` names a planned peer
/// (`server 2 port 1`) by address, when a plan is known.
pub fn findings(probe: &Probe, peer_of: &dyn Fn(Ipv4Addr) -> Option<String>) -> Vec<Finding> {
    let mut out = Vec::new();
    for (ifname, w) in &probe.wires {
        for p in w.pinged.iter().filter(|p| !p.answered) {
            let who = peer_of(p.addr).map_or(String::new(), |s| format!(" ({s})"));
            let (message, remedy) = if w.far_macs.is_empty() {
                (
                    format!(
                        "{ifname}: {}{who} did not answer a ping, and nothing else answered on this wire: no cable, \
                         the far end down, or its port not up",
                        p.addr
                    ),
                    format!(
                        "ethtool {ifname}   # 'Link detected'; then the far end: ip link, its address"
                    ),
                )
            } else {
                (
                    format!(
                        "{ifname}: {}{who} did not answer a ping, but {} did on this wire: the cable reaches another \
                         port than planned, or the far end holds another address (fleet-doctor.sh --plan \
                         --probe names that port)",
                        p.addr,
                        w.far_macs.join(", ")
                    ),
                    format!(
                        "ethtool -p {ifname} 10   # blinks this port's LED for 10 s: follow the cable; then \
                         nccl-tests/fleet-doctor.sh --plan PLAN --probe -H HOSTS"
                    ),
                )
            };
            out.push(Finding::new(
                Severity::Error,
                check::PROBE_NO_ANSWER,
                format!("netdev {ifname}"),
                message,
                remedy,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unanswered_far_ends_say_whether_anything_answered() {
        let mut p = Probe::default();
        p.wires.insert(
            "a".into(),
            Wire {
                pinged: vec![Pinged {
                    addr: Ipv4Addr::new(10, 100, 0, 2),
                    answered: false,
                }],
                far_macs: vec!["4c:bb:47:b3:b2:c1".into()],
            },
        );
        p.wires.insert(
            "b".into(),
            Wire {
                pinged: vec![Pinged {
                    addr: Ipv4Addr::new(10, 100, 0, 6),
                    answered: false,
                }],
                far_macs: vec![],
            },
        );
        p.wires.insert(
            "c".into(),
            Wire {
                pinged: vec![Pinged {
                    addr: Ipv4Addr::new(10, 100, 0, 10),
                    answered: true,
                }],
                far_macs: vec![],
            },
        );
        let f = findings(&p, &|a| {
            (a == Ipv4Addr::new(10, 100, 0, 2)).then(|| "server 2 port 1".into())
        });
        assert_eq!(f.len(), 2);
        assert!(
            f[0].message
                .contains("10.100.0.2 (server 2 port 1) did not answer"),
            "{}",
            f[0].message
        );
        assert!(
            f[0].message.contains("4c:bb:47:b3:b2:c1 did on this wire"),
            "{}",
            f[0].message
        );
        assert!(
            f[1].message.contains("nothing else answered"),
            "{}",
            f[1].message
        );
    }
}
