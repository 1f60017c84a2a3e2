//! `switchless doctor --fleet … --plan plan.json`: the cables file against the captured fabric, one
//! line per planned cable: `OK`, `wrong port` (with the port it reaches, by the MACs the neighbour
//! tables and `--probe` saw), `down`, `half` (some of its functions idle), `not addressed as
//! planned`, or `unverified` (addressed as planned, but nothing has shown the far end yet).

use std::collections::BTreeMap;

use serde::Serialize;

use super::registry::check;
use super::wiring::{HostInput, Owners, Seen, seen};
use crate::findings::{Finding, Severity};
use crate::tools::plan::{LiveIface, Plan};

/// One planned cable and what the fleet shows of it.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedCable {
    /// The cables file's line.
    pub line: usize,
    /// `spark-a port 1`.
    pub a: String,
    pub b: String,
    /// `ok`, `wrong-port`, `down`, `half`, `not-addressed`, `missing`, `unverified`.
    pub status: &'static str,
    /// What the status rests on, in words.
    pub detail: String,
}

/// How one function (link) of a planned cable fares.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fn {
    Ok,
    Flux,
    Wrong(String),
    Down,
    NotAddressed(String),
    Missing(String),
    Unverified,
}

/// Which host of the fleet is server `s`: the one named like it, else the one holding most of its
/// planned addresses.
fn host_of(hosts: &[HostInput], plan: &Plan, s: u32) -> Option<usize> {
    if let Some(n) = plan.name_of(s) {
        let short = |x: &str| x.split('.').next().unwrap_or(x).to_string();
        if let Some(i) = hosts.iter().position(|h| short(&h.name) == short(n)) {
            return Some(i);
        }
    }
    hosts.iter().position(|h| {
        let live = LiveIface::from_model(&h.model);
        crate::tools::plan::check::pick_server(plan, &live, None) == Ok(s)
    })
}

/// `spark-c port 2`: a host's netdev as the plan numbers it.
fn port_label(
    hosts: &[HostInput],
    plan: &Plan,
    server_of: &BTreeMap<usize, u32>,
    h: usize,
    netdev: &str,
) -> String {
    let port = server_of
        .get(&h)
        .and_then(|s| plan.model.port_number_of(*s, netdev));
    match (server_of.get(&h), port) {
        (Some(s), Some(p)) => format!(
            "{} port {p} ({netdev})",
            plan.name_of(*s)
                .map_or_else(|| format!("server {s}"), str::to_string)
        ),
        _ => format!("{}:{netdev}", hosts[h].name),
    }
}

/// Judges every planned cable against the hosts; returns the lines and the findings only this view
/// can give (a planned cable no capture shows at all).
pub fn judge(hosts: &[HostInput], plan: &Plan) -> (Vec<PlannedCable>, Vec<Finding>) {
    let owners = Owners::of(hosts);
    let map: BTreeMap<u32, usize> = (1..=plan.servers)
        .filter_map(|s| host_of(hosts, plan, s).map(|h| (s, h)))
        .collect();
    let server_of: BTreeMap<usize, u32> = map.iter().map(|(s, h)| (*h, *s)).collect();
    let name = |s: u32| {
        plan.name_of(s)
            .map_or_else(|| format!("server {s}"), str::to_string)
    };
    // Links by cable: (line, lower end's server and port).
    let mut cables: BTreeMap<(usize, u32, u32), Vec<&crate::tools::plan::Link>> = BTreeMap::new();
    for l in &plan.links {
        cables
            .entry((l.line, l.ends[0].server, l.ends[0].port))
            .or_default()
            .push(l);
    }
    let mut out = Vec::new();
    let mut findings = Vec::new();
    for ((line, _, _), links) in cables {
        let (e0, e1) = (&links[0].ends[0], &links[0].ends[1]);
        let a = format!("{} port {}", name(e0.server), e0.port);
        let b = format!("{} port {}", name(e1.server), e1.port);
        let mut fns = Vec::new();
        for l in &links {
            let [x, y] = &l.ends;
            let st = match (map.get(&x.server), map.get(&y.server)) {
                (None, _) => Fn::Missing(format!("{} is not among the captures", name(x.server))),
                (_, None) => Fn::Missing(format!("{} is not among the captures", name(y.server))),
                (Some(&hx), Some(&hy)) => {
                    let nx = hosts[hx].model.netdev(&x.interface);
                    let ny = hosts[hy].model.netdev(&y.interface);
                    match (nx, ny) {
                        (None, _) => {
                            Fn::Missing(format!("{} has no {}", hosts[hx].name, x.interface))
                        }
                        (_, None) => {
                            Fn::Missing(format!("{} has no {}", hosts[hy].name, y.interface))
                        }
                        (Some(nx), Some(ny)) => {
                            let holds = |n: &crate::host::model::Netdev, a: ipnet::Ipv4Net| {
                                n.addrs.iter().any(|h| h.addr.addr() == a.addr())
                            };
                            if !holds(nx, x.address) || !holds(ny, y.address) {
                                let who = if holds(nx, x.address) {
                                    (&hosts[hy].name, &y.interface, y.address)
                                } else {
                                    (&hosts[hx].name, &x.interface, x.address)
                                };
                                Fn::NotAddressed(format!("{}:{} lacks {}", who.0, who.1, who.2))
                            } else if !nx.is_up() || !ny.is_up() {
                                Fn::Down
                            } else {
                                let sx = seen(
                                    hosts,
                                    &owners,
                                    hx,
                                    &x.interface,
                                    y.address.addr(),
                                    hy,
                                    &y.interface,
                                );
                                let sy = seen(
                                    hosts,
                                    &owners,
                                    hy,
                                    &y.interface,
                                    x.address.addr(),
                                    hx,
                                    &x.interface,
                                );
                                match (&sx, &sy) {
                                    (Seen::Elsewhere((h, n)), _) => Fn::Wrong(format!(
                                        "{} faces {}",
                                        port_label(hosts, plan, &server_of, hx, &x.interface),
                                        port_label(hosts, plan, &server_of, *h, n)
                                    )),
                                    (_, Seen::Elsewhere((h, n))) => Fn::Wrong(format!(
                                        "{} faces {}",
                                        port_label(hosts, plan, &server_of, hy, &y.interface),
                                        port_label(hosts, plan, &server_of, *h, n)
                                    )),
                                    (Seen::OtherFunction(_), _) | (_, Seen::OtherFunction(_)) => {
                                        Fn::Flux
                                    }
                                    (Seen::Holder, _) | (_, Seen::Holder) => Fn::Ok,
                                    _ => Fn::Unverified,
                                }
                            }
                        }
                    }
                }
            };
            fns.push(st);
        }
        let n = fns.len();
        let ok = fns
            .iter()
            .filter(|f| matches!(f, Fn::Ok | Fn::Flux))
            .count();
        let first = |p: fn(&Fn) -> Option<&String>| fns.iter().find_map(p).cloned();
        let (status, detail) = if let Some(w) = first(|f| match f {
            Fn::Wrong(w) => Some(w),
            _ => None,
        }) {
            ("wrong-port", format!("{w}, planned {a} — {b}"))
        } else if let Some(m) = first(|f| match f {
            Fn::Missing(m) => Some(m),
            _ => None,
        }) {
            ("missing", m)
        } else if ok == n {
            (
                "ok",
                format!(
                    "{ok} of {n} {} seen at the far end{}",
                    if n == 1 { "function" } else { "functions" },
                    if fns.contains(&Fn::Flux) {
                        " (one through the other function's MAC: arp-flux)"
                    } else {
                        ""
                    }
                ),
            )
        } else if ok > 0 {
            (
                "half",
                format!(
                    "{ok} of {n} functions seen at the far end; the others {}",
                    fns.iter()
                        .filter_map(|f| match f {
                            Fn::Down => Some("down".to_string()),
                            Fn::NotAddressed(m) => Some(m.clone()),
                            Fn::Unverified => Some("not seen yet".to_string()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        } else if let Some(m) = first(|f| match f {
            Fn::NotAddressed(m) => Some(m),
            _ => None,
        }) {
            ("not-addressed", m)
        } else if fns.iter().all(|f| *f == Fn::Down) {
            (
                "down",
                "every function is down at one end or both".to_string(),
            )
        } else {
            (
                "unverified",
                "addressed as planned and up, but no neighbour entry or probe shows the far end yet (run \
                 fleet-doctor.sh --probe)"
                    .to_string(),
            )
        };
        if matches!(status, "missing" | "not-addressed") {
            findings.push(Finding::new(
                Severity::Error,
                check::PLANNED_CABLE,
                format!("planned cable {a} — {b}"),
                format!("the cables file's line {line} plans this cable, but {detail}"),
                "switchless doctor --plan plan.json on that host names what to change (or capture the missing host)",
            ));
        }
        out.push(PlannedCable {
            line,
            a,
            b,
            status,
            detail,
        });
    }
    (out, findings)
}
