//! Checks a live host against its part of a plan (`switchless doctor --plan plan.json --server N`).
//!
//! The check ids (`plan-*`) are registered, with their severity and meaning, in
//! `tools::doctor::registry`. [`pick_server`] finds which server of the plan a host is
//! (`--server auto`).
//!
//! [`live_from_ip_json`] turns the output of `ip -j addr show` into [`LiveIface`]s.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::{End, Link, Plan};
use crate::error::{Error, Result};
use crate::findings::{Finding, Severity};

/// What the host shows for one network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveIface {
    pub name: String,
    /// IPv4 addresses with their prefix lengths.
    pub addrs: Vec<Ipv4Net>,
    /// Bytes.
    pub mtu: u32,
    /// Operationally up (carrier present).
    pub up: bool,
    /// The netdev has an RDMA port (RoCE), so its MTU also sets RoCE's active MTU; false for a
    /// TCP link (and for `ip -j addr show` input, which cannot tell).
    pub rdma: bool,
}

impl LiveIface {
    /// The host's interfaces as [`check_host`] reads them: every netdev with its IPv4 addresses (prefix
    /// from the connected route), MTU and up state. `doctor --plan` feeds this instead of
    /// `ip -j addr show` output, so `--root` trees can be checked against a plan too.
    pub fn from_model(m: &crate::host::HostModel) -> Vec<LiveIface> {
        m.netdevs
            .iter()
            .map(|n| LiveIface {
                name: n.name.clone(),
                addrs: n.addrs.iter().map(|a| a.addr).collect(),
                mtu: n.mtu.unwrap_or(0),
                up: n.is_up(),
                rdma: !n.rdma.is_empty(),
            })
            .collect()
    }
}

/// `ip -j addr show` output, as far as [`live_from_ip_json`] reads it.
#[derive(Debug, serde::Deserialize)]
struct IpLink {
    ifname: Option<String>,
    #[serde(default)]
    mtu: u32,
    #[serde(default)]
    operstate: String,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    addr_info: Vec<IpAddrInfo>,
}

#[derive(Debug, serde::Deserialize)]
struct IpAddrInfo {
    #[serde(default)]
    family: String,
    /// An IPv4 or IPv6 address, by `family`.
    local: Option<String>,
    prefixlen: Option<u8>,
}

/// Reads the interfaces from the JSON of `ip -j addr show` (iproute2): name, IPv4 addresses, MTU in bytes, and
/// whether it is up (operstate `UP`, or `UNKNOWN` with the `LOWER_UP` flag, as dummy and some drivers report).
pub fn live_from_ip_json(text: &str) -> Result<Vec<LiveIface>> {
    let links: Vec<IpLink> = serde_json::from_str(text).map_err(|e| {
        Error::InvalidUsage(format!(
            "`ip -j addr show` output: {e}; expected a JSON array of interfaces"
        ))
    })?;
    let mut out = Vec::new();
    for l in links {
        let Some(name) = l.ifname else { continue };
        let mut addrs = Vec::new();
        for a in &l.addr_info {
            if a.family != "inet" {
                continue;
            }
            if let (Some(local), Some(p)) = (&a.local, a.prefixlen) {
                let net = local
                    .parse::<Ipv4Addr>()
                    .map_err(|e| e.to_string())
                    .and_then(|ip| Ipv4Net::new(ip, p).map_err(|e| e.to_string()))
                    .map_err(|e| {
                        Error::InvalidUsage(format!(
                            "`ip -j addr show` output: {name}: inet address {local}/{p}: {e}"
                        ))
                    })?;
                addrs.push(net);
            }
        }
        let lower_up = l.flags.iter().any(|f| f == "LOWER_UP");
        let up = l.operstate == "UP" || (l.operstate == "UNKNOWN" && lower_up);
        out.push(LiveIface {
            name,
            addrs,
            mtu: l.mtu,
            up,
            rdma: false,
        });
    }
    Ok(out)
}

fn netdev(name: &str) -> String {
    format!("netdev {name}")
}

/// Compares the live host with the part of `plan` for `server` and reports every difference.
pub fn check_host(plan: &Plan, server: u32, live: &[LiveIface]) -> Vec<Finding> {
    let mut out = Vec::new();
    if server == 0 || server > plan.servers {
        out.push(Finding::new(
            Severity::Error,
            "plan-server-unknown",
            "plan",
            format!(
                "server {server} is not in the plan, which has servers 1..={}",
                plan.servers
            ),
            "--server N with the number this host has in the cables file",
        ));
        return out;
    }
    let mut mine: Vec<(&End, &End, &Link)> = plan
        .links_of(server)
        .filter_map(|l| l.side(server).map(|(me, peer)| (me, peer, l)))
        .collect();
    mine.sort_by_key(|(me, _, l)| (me.port, l.function));
    if mine.is_empty() {
        out.push(Finding::new(
            Severity::Warning,
            "plan-no-links",
            "plan",
            format!(
                "the plan gives server {server} no link: no cable in the cables file reaches it"
            ),
            "add its cables to the cables file and regenerate the plan",
        ));
    }
    let by_name: BTreeMap<&str, &LiveIface> =
        live.iter().rev().map(|i| (i.name.as_str(), i)).collect();
    let planned_here: BTreeMap<&str, (&End, &End, &Link)> = mine
        .iter()
        .map(|&(me, peer, l)| (me.interface.as_str(), (me, peer, l)))
        .collect();
    let mut all_addrs: BTreeMap<Ipv4Addr, (&Link, &End)> = BTreeMap::new();
    let mut subnets: BTreeMap<Ipv4Addr, &Link> = BTreeMap::new();
    for l in &plan.links {
        subnets.insert(l.subnet.network(), l);
        for e in &l.ends {
            all_addrs.insert(e.address.addr(), (l, e));
        }
    }
    let mut accounted: BTreeSet<(&str, Ipv4Addr)> = BTreeSet::new();

    for &(me, peer, l) in &mine {
        let ip = me.address.addr();
        let where_ = format!(
            "port {}, link {} to server {} port {} {}",
            me.port, l.id, peer.server, peer.port, peer.interface
        );
        let iface = by_name.get(me.interface.as_str()).copied();
        match iface {
            None => out.push(Finding::new(
                Severity::Error,
                "plan-interface-missing",
                netdev(&me.interface),
                format!(
                    "{} ({where_}) does not exist on this host",
                    me.interface
                ),
                format!(
                    "check the model's port map (plan model {}), that the NIC is in Ethernet mode and its driver is loaded",
                    plan.model.name
                ),
            )),
            Some(i) => {
                if !i.up {
                    out.push(Finding::new(
                        Severity::Error,
                        "plan-link-down",
                        netdev(&i.name),
                        format!("{} ({where_}) is down", i.name),
                        format!(
                            "ip link set dev {} up   # if it stays down, check that the cable in port {} reaches server {} port {}",
                            i.name, me.port, peer.server, peer.port
                        ),
                    ));
                }
                if i.mtu != plan.mtu {
                    let sev = if i.mtu < plan.mtu {
                        Severity::Error
                    } else {
                        Severity::Warning
                    };
                    out.push(Finding::new(
                        sev,
                        "plan-mtu-mismatch",
                        netdev(&i.name),
                        format!(
                            "{} has MTU {} bytes; the plan says {} bytes ({})",
                            i.name,
                            i.mtu,
                            plan.mtu,
                            mtu_consequence(i)
                        ),
                        format!(
                            "ip link set dev {} mtu {}   # and on the peer; persist it: {}",
                            i.name, plan.mtu, persist(plan, server)
                        ),
                    ));
                }
            }
        }
        // Where is the planned address?
        if let Some(i) = iface
            && let Some(a) = i.addrs.iter().find(|a| a.addr() == ip)
        {
            accounted.insert((i.name.as_str(), ip));
            if a.prefix_len() != me.address.prefix_len() {
                out.push(Finding::new(
                    Severity::Error,
                    "plan-prefix-mismatch",
                    netdev(&i.name),
                    format!(
                        "{} holds {a}; the plan says {} ({where_}); a wider prefix overlaps other links' subnets",
                        i.name, me.address
                    ),
                    format!(
                        "ip addr del {a} dev {0} && ip addr add {1} dev {0}",
                        i.name, me.address
                    ),
                ));
            }
            continue;
        }
        let elsewhere = live
            .iter()
            .find(|o| o.name != me.interface && o.addrs.iter().any(|a| a.addr() == ip));
        match elsewhere {
            Some(o) => {
                accounted.insert((o.name.as_str(), ip));
                match planned_here.get(o.name.as_str()) {
                    Some((o_me, o_peer, o_link)) if o_peer.server != peer.server => {
                        out.push(Finding::new(
                            Severity::Error,
                            "plan-cable-wrong-peer",
                            netdev(&o.name),
                            format!(
                                "{} holds {}, planned for {} ({where_}), but the plan cables {} (port {}, link {}) to server {}: a cable is in the wrong port, or the addresses were set by hand to follow the cables",
                                o.name, me.address, me.interface, o.name, o_me.port, o_link.id, o_peer.server
                            ),
                            format!(
                                "cable server {server} port {} to server {} port {} as the plan says (or fix the cables file and regenerate the plan), then apply it: {}",
                                me.port, peer.server, peer.port, apply(plan, server)
                            ),
                        ));
                    }
                    _ => out.push(Finding::new(
                        Severity::Error,
                        "plan-address-on-wrong-interface",
                        netdev(&o.name),
                        format!(
                            "{} holds {}, planned for {} ({where_})",
                            o.name, me.address, me.interface
                        ),
                        format!(
                            "ip addr del {0} dev {1} && ip addr add {0} dev {2}   # if cables were swapped between ports, swap them back",
                            me.address, o.name, me.interface
                        ),
                    )),
                }
            }
            None if iface.is_some() => out.push(Finding::new(
                Severity::Error,
                "plan-address-missing",
                netdev(&me.interface),
                format!(
                    "{} lacks its planned address {} ({where_}, peer address {})",
                    me.interface,
                    me.address,
                    peer.address.addr()
                ),
                format!(
                    "ip addr add {} dev {}   # or apply the whole part: {}",
                    me.address,
                    me.interface,
                    apply(plan, server)
                ),
            )),
            None => {} // the missing interface is reported already
        }
    }

    for i in live {
        for a in &i.addrs {
            let ip = a.addr();
            if accounted.contains(&(i.name.as_str(), ip)) {
                continue;
            }
            if let Some((l, e)) = all_addrs.get(&ip) {
                if e.server == server {
                    out.push(Finding::new(
                        Severity::Error,
                        "plan-address-on-wrong-interface",
                        netdev(&i.name),
                        format!(
                            "{} also holds {a}, planned for {} (link {}); an address belongs on one interface only",
                            i.name, e.interface, l.id
                        ),
                        format!("ip addr del {a} dev {}", i.name),
                    ));
                } else {
                    out.push(Finding::new(
                        Severity::Error,
                        "plan-address-of-other-server",
                        netdev(&i.name),
                        format!(
                            "{} holds {a}, which the plan gives to server {} ({}, link {}); this host is server {server}",
                            i.name, e.server, e.interface, l.id
                        ),
                        format!(
                            "ip addr del {a} dev {}   # if this host is server {server}; otherwise check --server",
                            i.name
                        ),
                    ));
                }
                continue;
            }
            let net = Ipv4Net::new(ip, plan.prefix)
                .map(|n| n.network())
                .unwrap_or(ip);
            if let Some(l) = subnets.get(&net) {
                out.push(Finding::new(
                    Severity::Error,
                    "plan-address-stray",
                    netdev(&i.name),
                    format!(
                        "{} holds {a}, inside link {}'s subnet {} but neither of its planned addresses ({}, {})",
                        i.name, l.id, l.subnet, l.ends[0].address, l.ends[1].address
                    ),
                    format!("ip addr del {a} dev {}   # then apply the plan: {}", i.name, apply(plan, server)),
                ));
                continue;
            }
            let in_base = plan.base.contains(&ip);
            if in_base {
                out.push(Finding::new(
                    Severity::Warning,
                    "plan-address-unplanned",
                    netdev(&i.name),
                    format!(
                        "{} holds {a}, inside the plan's range {} but in no planned link (left over from an older plan?)",
                        i.name, plan.base
                    ),
                    format!("ip addr del {a} dev {}", i.name),
                ));
            } else if planned_here.contains_key(i.name.as_str()) {
                out.push(Finding::new(
                    Severity::Warning,
                    "plan-extra-address",
                    netdev(&i.name),
                    format!(
                        "{} carries {a} besides its planned address; a second subnet on a mesh port can make peers pick a GID that does not reach them",
                        i.name
                    ),
                    format!(
                        "ip addr del {a} dev {}   # unless something else needs it",
                        i.name
                    ),
                ));
            }
        }
    }

    let out = headlines(plan, server, live, &mine, out);
    let mut out = one_per_netdev(&mine, out);
    if !out.iter().any(|f| f.severity > Severity::Info) {
        out.push(Finding::new(
            Severity::Info,
            "plan-host-matches",
            "plan",
            format!(
                "{} of server {server} {} up with MTU {} bytes and {} planned /{} {}",
                match mine.len() {
                    1 => "the one planned interface".to_string(),
                    n => format!("all {n} planned interfaces"),
                },
                if mine.len() == 1 { "is" } else { "are" },
                plan.mtu,
                if mine.len() == 1 { "its" } else { "their" },
                plan.prefix,
                if mine.len() == 1 {
                    "address"
                } else {
                    "addresses"
                }
            ),
            "nothing to do",
        ));
    }
    out
}

/// A planned interface that holds a wrong address instead of its planned one is one fault: the
/// finding about the wrong address (another server's, a stray, an unplanned or an extra one) says
/// the planned one is missing too, and its remedy swaps them (`ip addr del X && ip addr add Y`).
fn one_per_netdev(mine: &[(&End, &End, &Link)], out: Vec<Finding>) -> Vec<Finding> {
    const WRONG: [&str; 4] = [
        "plan-address-of-other-server",
        "plan-address-stray",
        "plan-address-unplanned",
        "plan-extra-address",
    ];
    let missing: Vec<String> = out
        .iter()
        .filter(|f| f.check == "plan-address-missing")
        .map(|f| f.object.clone())
        .collect();
    let mut swapped: BTreeSet<String> = BTreeSet::new();
    let mut kept = Vec::with_capacity(out.len());
    for mut f in out {
        if WRONG.contains(&f.check.as_str())
            && missing.contains(&f.object)
            && !swapped.contains(&f.object)
        {
            let name = f.object.trim_start_matches("netdev ").to_string();
            let del = f
                .remedy
                .split("   #")
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            if let Some((me, _, _)) = mine.iter().find(|(me, _, _)| me.interface == name) {
                f.message = format!(
                    "{}; its planned address {} is missing",
                    f.message, me.address
                );
                f.remedy = format!(
                    "{del} && ip addr add {} dev {name}   # the plan's address",
                    me.address
                );
                swapped.insert(f.object.clone());
            }
        }
        kept.push(f);
    }
    kept.retain(|f| !(f.check == "plan-address-missing" && swapped.contains(&f.object)));
    kept
}

/// What a wrong MTU costs on `i`: RoCE negotiates its frame size from it; TCP takes the smaller
/// MTU of the two ends per connection and only loses jumbo frames.
fn mtu_consequence(i: &LiveIface) -> String {
    if i.rdma {
        let active = crate::host::model::roce_active_mtu(i.mtu);
        format!(
            "RoCE runs at active_mtu {active} bytes here, and at the smaller of the two ends' values; \
             4096-byte RoCE frames need an MTU of 4200 bytes or more on both ends"
        )
    } else {
        "a TCP link: TCP agrees on the smaller MTU of the two ends per connection, so the cable carries \
         no jumbo frames: more packets and CPU per byte, nothing is dropped"
            .to_string()
    }
}

/// The command that writes and applies this server's part of the plan.
fn apply(plan: &Plan, server: u32) -> String {
    let cables = plan.cables_file.as_deref().unwrap_or("CABLES");
    let model = format!(" --model {}", plan.model.name);
    let stem = plan.file_stem(server);
    format!(
        "switchless plan {cables}{model} --format ip --server {server} --out ip/ && ip/{stem}.sh"
    )
}

/// The command that writes this server's persistent configuration.
fn persist(plan: &Plan, server: u32) -> String {
    let cables = plan.cables_file.as_deref().unwrap_or("CABLES");
    let model = format!(" --model {}", plan.model.name);
    format!("switchless plan {cables}{model} --format netplan --server {server} --out netplan/")
}

/// Folds the per-interface findings that all say one thing into one headline: no planned interface
/// exists (the plan is for another model), or no planned address is there while the interfaces hold
/// others (the host follows another addressing plan).
fn headlines(
    plan: &Plan,
    server: u32,
    live: &[LiveIface],
    mine: &[(&End, &End, &Link)],
    out: Vec<Finding>,
) -> Vec<Finding> {
    let count = |id: &str| out.iter().filter(|f| f.check == id).count();
    let n = mine.len();
    if n >= 2 && count("plan-interface-missing") == n {
        let names: Vec<&str> = live.iter().map(|i| i.name.as_str()).collect();
        let guess = super::PortMap::builtin_like(&names).filter(|m| m.name != plan.model.name);
        let planned: Vec<&str> = mine
            .iter()
            .take(3)
            .map(|(me, _, _)| me.interface.as_str())
            .collect();
        // Every other plan finding follows from the wrong model (an address of the plan found on
        // this host's own interface is no fault of the interface): the headline stands alone.
        drop(out);
        return vec![Finding::new(
            Severity::Error,
            "plan-model-mismatch",
            "plan",
            format!(
                "none of the {n} interfaces the plan (model {}) gives server {server} exists on this host (e.g. {}){}",
                plan.model.name,
                planned.join(", "),
                match &guess {
                    Some(g) => format!(": this host looks like model {}", g.name),
                    None => String::new(),
                }
            ),
            match &guess {
                Some(g) => format!(
                    "switchless plan {} --model {} --format json > plan.json   # a plan for this model",
                    plan.cables_file.as_deref().unwrap_or("CABLES"),
                    g.name
                ),
                None => {
                    "regenerate the plan with --model FILE, a map of this host's ports".to_string()
                }
            },
        )];
    }
    let present = n - count("plan-interface-missing");
    let missing = count("plan-address-missing");
    let others = count("plan-extra-address") + count("plan-address-unplanned");
    if n >= 2 && present >= 2 && missing == present && others > 0 {
        let by_name: BTreeMap<&str, &LiveIface> =
            live.iter().map(|i| (i.name.as_str(), i)).collect();
        let detail: Vec<String> = mine
            .iter()
            .filter_map(|(me, _, _)| {
                let i = by_name.get(me.interface.as_str())?;
                let has: Vec<String> = i.addrs.iter().map(|a| a.to_string()).collect();
                Some(format!(
                    "{} planned {}, has {}",
                    me.interface,
                    me.address,
                    if has.is_empty() {
                        "none".to_string()
                    } else {
                        has.join(" ")
                    }
                ))
            })
            .collect();
        let mut rest: Vec<Finding> = out
            .into_iter()
            .filter(|f| {
                !matches!(
                    f.check.as_str(),
                    "plan-address-missing" | "plan-extra-address" | "plan-address-unplanned"
                )
            })
            .collect();
        rest.insert(
            0,
            Finding::new(
                Severity::Error,
                "plan-addressing-differs",
                "plan",
                format!(
                    "none of the {missing} addresses the plan gives server {server} is on this host, whose planned interfaces hold {others} other address(es): the host follows another addressing plan ({})",
                    detail.join("; ")
                ),
                apply(plan, server),
            ),
        );
        return rest;
    }
    out
}

/// Which server of `plan` this host is (`--server auto`): the one whose name is `hostname`, else the
/// one whose planned addresses the host holds the most of. An error says why none fits.
pub fn pick_server(
    plan: &Plan,
    live: &[LiveIface],
    hostname: Option<&str>,
) -> std::result::Result<u32, String> {
    if let Some(h) = hostname {
        let short = h.split('.').next().unwrap_or(h);
        if let Some(s) =
            (1..=plan.servers).find(|s| plan.name_of(*s).is_some_and(|n| n == h || n == short))
        {
            return Ok(s);
        }
    }
    let held: BTreeSet<Ipv4Addr> = live
        .iter()
        .flat_map(|i| i.addrs.iter().map(|a| a.addr()))
        .collect();
    let mut score: BTreeMap<u32, usize> = BTreeMap::new();
    for l in &plan.links {
        for e in &l.ends {
            if held.contains(&e.address.addr()) {
                *score.entry(e.server).or_default() += 1;
            }
        }
    }
    let best = score.values().copied().max().unwrap_or(0);
    let top: Vec<u32> = score
        .iter()
        .filter(|(_, c)| **c == best)
        .map(|(s, _)| *s)
        .collect();
    match top.as_slice() {
        [s] if best > 0 => Ok(*s),
        _ if best > 0 => Err(format!(
            "--server auto: this host holds planned addresses of servers {} equally; give --server N",
            top.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        _ => Err(format!(
            "--server auto: this host ({}) is not named in the plan and holds none of its addresses; give \
             --server N, or name the servers in the cables file (`server 1 = HOSTNAME`)",
            hostname.unwrap_or("host name unknown")
        )),
    }
}
