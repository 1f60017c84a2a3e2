//! `switchless plan`: cables file + port maps → per-link IP plan, its outputs, and checking a host against it.
//!
//! * [`model`]: port maps (built-in DGX B300 and GB10, or a map file).
//! * [`cables`]: the cables file (`S-P > S-P`, the format of the B300 mesh generator).
//! * [`address`]: the addressing scheme (one /30 or /31 per logical link, slot from the lower end).
//! * [`build`] turns both into a [`Plan`]; [`Plan::verify`] proves its guarantees before anything is printed.
//! * [`render`]: table, JSON, `ip` commands, netplan and systemd-networkd outputs.
//! * [`check`]: compares a live host with its part of a plan (`switchless doctor --plan`).
#![forbid(unsafe_code)]

pub mod address;
pub mod cables;
pub mod check;
pub mod model;
pub mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use address::Scheme;
use cables::Cables;
pub use check::{LiveIface, check_host, live_from_ip_json};
pub use model::PortMap;

/// The JSON schema version [`Plan::to_json`] writes and [`Plan::from_json`] accepts.
pub const SCHEMA_VERSION: u32 = 1;

/// Default `--base`.
pub const DEFAULT_BASE: &str = "10.100.0.0/16";

/// One end of a logical link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    pub server: u32,
    pub port: u32,
    pub interface: String,
    /// The interface's address with the link's prefix length, e.g. `10.100.0.1/30`.
    pub address: Ipv4Net,
}

/// A logical link: one interface pair of one cable, with its own subnet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// The link's slot in the addressing scheme: unique, stable across edits of the cables file.
    pub id: u64,
    /// The line of the cables file that names the cable.
    pub line: usize,
    /// Which interface of each port (0 = the first the port map lists, e.g. np0).
    pub function: u32,
    pub subnet: Ipv4Net,
    /// `ends[0]` is the lower-numbered server; it holds the lower address.
    pub ends: [End; 2],
}

impl Link {
    /// This link's end on `server`, and the other end.
    pub fn side(&self, server: u32) -> Option<(&End, &End)> {
        if self.ends[0].server == server {
            Some((&self.ends[0], &self.ends[1]))
        } else if self.ends[1].server == server {
            Some((&self.ends[1], &self.ends[0]))
        } else {
            None
        }
    }
}

/// A whole IP plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub model: PortMap,
    pub base: Ipv4Net,
    /// 30 or 31.
    pub prefix: u8,
    /// Interface MTU in bytes.
    pub mtu: u32,
    /// Servers are numbered 1..=servers.
    pub servers: u32,
    /// Sorted by id.
    pub links: Vec<Link>,
    /// The cables file the plan was made from, as given on the command line (for remedies that
    /// regenerate a part of the plan); `None` when unknown.
    pub cables_file: Option<String>,
    /// Host names of servers that the cables file names (`server 1 = b300-001`); servers without a
    /// name are known by number only.
    pub names: BTreeMap<u32, String>,
}

/// Options of [`build`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub base: Ipv4Net,
    pub prefix: u8,
    /// Bytes.
    pub mtu: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            base: Ipv4Net::new(Ipv4Addr::new(10, 100, 0, 0), 16).unwrap_or_default(),
            prefix: 30,
            mtu: 9000,
        }
    }
}

/// Accepted `--mtu` range in bytes: IPv6's minimum to the mlx5 driver's maximum.
pub const MTU_RANGE: std::ops::RangeInclusive<u32> = 1280..=9978;

/// What [`Plan::verify`] proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verified {
    pub links: usize,
    /// Distinct, non-overlapping link subnets (equals `links`).
    pub distinct_subnets: usize,
    /// Distinct host addresses (equals `2 × links`).
    pub distinct_addresses: usize,
}

impl Verified {
    /// The guarantee in one sentence, for the outputs.
    pub fn sentence(&self, prefix: u8) -> String {
        use crate::tools::units::count;
        format!(
            "verified: {} in {} distinct /{prefix} {}, {}; no two links share a subnet, no address is used twice, both ends of every link are in its subnet",
            count(self.links, "link"),
            self.distinct_subnets,
            crate::tools::units::plural(self.distinct_subnets, "subnet"),
            count(self.distinct_addresses, "distinct address")
        )
    }
}

/// A plan and the warnings met while building it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub plan: Plan,
    /// Things that are legal but probably not meant (a server without cables, a low MTU …).
    pub warnings: Vec<String>,
}

/// Builds the plan of a validated cables file (see [`address`] for the scheme), then verifies it.
pub fn build(cables: &Cables, map: &PortMap, opts: &Options) -> Result<Built> {
    if !MTU_RANGE.contains(&opts.mtu) {
        return Err(Error::InvalidUsage(format!(
            "--mtu {}: accepted are {}..={} bytes",
            opts.mtu,
            MTU_RANGE.start(),
            MTU_RANGE.end()
        )));
    }
    let scheme = Scheme::new(opts.base, opts.prefix, map.max_port(), map.max_functions())?;
    let mut warnings = Vec::new();
    let mut pending = Vec::new();
    for c in &cables.cables {
        let (Some(ia), Some(ib)) = (
            map.port_of(c.a.server, c.a.port),
            map.port_of(c.b.server, c.b.port),
        ) else {
            return Err(Error::Internal(format!(
                "cable at line {} names a port the map lacks after validation",
                c.line
            )));
        };
        let n = ia.len().min(ib.len());
        if ia.len() != ib.len() {
            warnings.push(format!(
                "line {}: server {} port {} has {} interface(s) but server {} port {} has {}; only the first {n} of each are paired, the rest get no address",
                c.line,
                c.a.server,
                c.a.port,
                ia.len(),
                c.b.server,
                c.b.port,
                ib.len()
            ));
        }
        for f in 0..n {
            pending.push((
                scheme.slot(c.a.server, c.a.port, f as u32),
                c,
                f,
                ia[f].clone(),
                ib[f].clone(),
            ));
        }
    }
    let slots_end = pending.iter().map(|p| p.0 + 1).max().unwrap_or(0);
    if slots_end.saturating_mul(scheme.block()) > scheme.capacity() {
        let n = pending.len() as u64;
        let hint = match scheme.prefix_needed(slots_end) {
            Some(p) => format!("give --base a /{p} or larger range"),
            None => "no IPv4 range is large enough".into(),
        };
        return Err(Error::InvalidUsage(format!(
            "--base {} holds {} addresses, too few: {n} links need {} addresses ({} per /{}), and the scheme places them by lower server and port (slot = ((server-1)*{} + port-1)*{} + function), so the highest slot, {}, ends at address offset {}; {hint}",
            scheme.base,
            scheme.capacity(),
            n * scheme.block(),
            scheme.block(),
            scheme.prefix,
            scheme.ports,
            scheme.functions,
            slots_end - 1,
            slots_end * scheme.block()
        )));
    }
    let mut links = Vec::with_capacity(pending.len());
    for (slot, c, f, if_a, if_b) in pending {
        let Some(subnet) = scheme.subnet(slot) else {
            return Err(Error::Internal(format!(
                "slot {slot} lies outside {}",
                scheme.base
            )));
        };
        let (lo, hi) = scheme.hosts(subnet);
        links.push(Link {
            id: slot,
            line: c.line,
            function: f as u32,
            subnet,
            ends: [
                End {
                    server: c.a.server,
                    port: c.a.port,
                    interface: if_a,
                    address: lo,
                },
                End {
                    server: c.b.server,
                    port: c.b.port,
                    interface: if_b,
                    address: hi,
                },
            ],
        });
    }
    links.sort_by_key(|l| l.id);
    let with_cables: BTreeSet<u32> = links
        .iter()
        .flat_map(|l| [l.ends[0].server, l.ends[1].server])
        .collect();
    for s in 1..=cables.servers {
        if !with_cables.contains(&s) {
            warnings.push(format!("server {s} has no cable"));
        }
    }
    if opts.mtu < 4200 {
        warnings.push(format!(
            "--mtu {} bytes: RoCE negotiates active_mtu 4096 only with an interface MTU of 4200 bytes or more",
            opts.mtu
        ));
    }
    if !is_private(opts.base) {
        warnings.push(format!(
            "--base {} is not inside the private ranges 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16",
            opts.base
        ));
    }
    let plan = Plan {
        model: map.clone(),
        base: opts.base,
        prefix: opts.prefix,
        mtu: opts.mtu,
        servers: cables.servers,
        links,
        cables_file: None,
        names: cables.names.clone(),
    };
    plan.verify()
        .map_err(|e| Error::Internal(format!("the plan broke its own guarantee: {e}")))?;
    Ok(Built { plan, warnings })
}

fn is_private(net: Ipv4Net) -> bool {
    ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
        .iter()
        .filter_map(|s| s.parse::<Ipv4Net>().ok())
        .any(|p| p.contains(&net))
}

impl Plan {
    /// Proves the plan's guarantees: every link subnet is a /prefix inside the base range, no two overlap, both
    /// ends hold distinct usable addresses of their link's subnet (the lower server the lower address), no address
    /// and no (server, interface) is used twice, link ids are unique.
    pub fn verify(&self) -> std::result::Result<Verified, String> {
        if self.prefix != 30 && self.prefix != 31 {
            return Err(format!("prefix {} is neither 30 nor 31", self.prefix));
        }
        if self.base.addr() != self.base.network() || self.base.prefix_len() > self.prefix {
            return Err(format!(
                "base {} is not a network address of /{} or larger",
                self.base, self.prefix
            ));
        }
        if self.servers < 2 {
            return Err(format!("{} servers; a plan needs 2 or more", self.servers));
        }
        if !MTU_RANGE.contains(&self.mtu) {
            return Err(format!("MTU {} bytes is outside {MTU_RANGE:?}", self.mtu));
        }
        self.model.validate()?;
        let mut ids = BTreeSet::new();
        let mut subnets: BTreeMap<u32, &Link> = BTreeMap::new();
        let mut addrs: BTreeMap<Ipv4Addr, u64> = BTreeMap::new();
        let mut ifaces: BTreeMap<(u32, &str), u64> = BTreeMap::new();
        for l in &self.links {
            if !ids.insert(l.id) {
                return Err(format!("link id {} is used twice", l.id));
            }
            if l.subnet.prefix_len() != self.prefix || l.subnet.addr() != l.subnet.network() {
                return Err(format!(
                    "link {}: subnet {} is not a /{} network",
                    l.id, l.subnet, self.prefix
                ));
            }
            if !self.base.contains(&l.subnet) {
                return Err(format!(
                    "link {}: subnet {} lies outside base {}",
                    l.id, l.subnet, self.base
                ));
            }
            // All subnets have one prefix length and are aligned, so distinct networks never overlap.
            if let Some(other) = subnets.insert(u32::from(l.subnet.network()), l) {
                return Err(format!(
                    "links {} and {} share subnet {}",
                    other.id, l.id, l.subnet
                ));
            }
            let [a, b] = &l.ends;
            if a.server >= b.server {
                return Err(format!(
                    "link {}: ends must list the lower server first (got {} then {})",
                    l.id, a.server, b.server
                ));
            }
            for e in &l.ends {
                if e.server == 0 || e.server > self.servers {
                    return Err(format!(
                        "link {}: server {} is outside 1..={}",
                        l.id, e.server, self.servers
                    ));
                }
                model::check_ifname(&e.interface).map_err(|m| format!("link {}: {m}", l.id))?;
                if e.address.prefix_len() != self.prefix || e.address.trunc() != l.subnet {
                    return Err(format!(
                        "link {}: address {} of server {} is not in subnet {}",
                        l.id, e.address, e.server, l.subnet
                    ));
                }
                let host = e.address.addr();
                if self.prefix == 30 && (host == l.subnet.network() || host == l.subnet.broadcast())
                {
                    return Err(format!(
                        "link {}: {} is the network or broadcast address of {}",
                        l.id, e.address, l.subnet
                    ));
                }
                if let Some(other) = addrs.insert(host, l.id) {
                    return Err(format!(
                        "address {host} is used by links {other} and {}",
                        l.id
                    ));
                }
                if let Some(other) = ifaces.insert((e.server, e.interface.as_str()), l.id) {
                    return Err(format!(
                        "interface {} of server {} carries links {other} and {}",
                        e.interface, e.server, l.id
                    ));
                }
            }
            if a.address.addr() >= b.address.addr() {
                return Err(format!(
                    "link {}: the lower server {} must hold the lower address ({} vs {})",
                    l.id, a.server, a.address, b.address
                ));
            }
        }
        Ok(Verified {
            links: self.links.len(),
            distinct_subnets: subnets.len(),
            distinct_addresses: addrs.len(),
        })
    }

    /// The host name of `server`, when the cables file names it.
    pub fn name_of(&self, server: u32) -> Option<&str> {
        self.names.get(&server).map(String::as_str)
    }

    /// `server 3` or `server 3 (b300-003)`, for messages.
    pub fn label(&self, server: u32) -> String {
        match self.name_of(server) {
            Some(n) => format!("server {server} ({n})"),
            None => format!("server {server}"),
        }
    }

    /// The base name of a server's output files: its host name, else `server<N>`.
    pub fn file_stem(&self, server: u32) -> String {
        match self.name_of(server) {
            Some(n) => n.to_string(),
            None => format!("server{server}"),
        }
    }

    /// The server named `name` (a host name of the cables file, or a number).
    pub fn server_by_name(&self, name: &str) -> Option<u32> {
        match name.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => self
                .names
                .iter()
                .find(|(_, v)| v.as_str() == name || v.split('.').next() == Some(name))
                .map(|(k, _)| *k),
        }
    }

    /// The links with an end on `server`.
    pub fn links_of(&self, server: u32) -> impl Iterator<Item = &Link> {
        self.links.iter().filter(move |l| l.side(server).is_some())
    }

    /// The plan restricted to the links of one server (same servers, model, range and scheme).
    pub fn only_server(&self, server: u32) -> Plan {
        Plan {
            links: self.links_of(server).cloned().collect(),
            ..self.clone()
        }
    }

    /// The scheme parameters of this plan's model and range.
    pub fn scheme(&self) -> Result<Scheme> {
        Scheme::new(
            self.base,
            self.prefix,
            self.model.max_port(),
            self.model.max_functions(),
        )
    }

    /// The plan as JSON (schema in `docs/guide/plan.md`), verified first. Ends with a newline.
    pub fn to_json(&self) -> Result<String> {
        let doc = self.doc()?;
        let mut s = serde_json::to_string_pretty(&doc)
            .map_err(|e| Error::Internal(format!("serializing the plan: {e}")))?;
        s.push('\n');
        Ok(s)
    }

    fn doc(&self) -> Result<PlanDoc> {
        let verified = self
            .verify()
            .map_err(|e| Error::Internal(format!("the plan broke its own guarantee: {e}")))?;
        let scheme = self.scheme()?;
        let servers = (1..=self.servers)
            .map(|s| ServerDoc {
                server: s,
                interfaces: {
                    let mut v: Vec<IfaceDoc> = self
                        .links_of(s)
                        .filter_map(|l| {
                            let (me, peer) = l.side(s)?;
                            Some(IfaceDoc {
                                interface: me.interface.clone(),
                                port: me.port,
                                function: l.function,
                                address: me.address,
                                subnet: l.subnet,
                                link: l.id,
                                peer: PeerDoc {
                                    server: peer.server,
                                    port: peer.port,
                                    interface: peer.interface.clone(),
                                    address: peer.address.addr(),
                                },
                            })
                        })
                        .collect();
                    v.sort_by_key(|a| (a.port, a.function));
                    v
                },
            })
            .collect();
        Ok(PlanDoc {
            schema_version: SCHEMA_VERSION,
            generator: format!("switchless {}", crate::VERSION),
            model: self.model.clone(),
            addressing: AddressingDoc {
                base: self.base,
                prefix: self.prefix,
                addresses_per_link: scheme.block(),
                ports_per_server: scheme.ports,
                functions_per_port: scheme.functions,
                rule: scheme.rule(),
            },
            mtu: self.mtu,
            server_count: self.servers,
            servers,
            links: self.links.clone(),
            verified,
            cables_file: self.cables_file.clone(),
            server_names: self.names.clone(),
        })
    }

    /// Reads a plan written by [`Plan::to_json`]. Checks the schema version, every guarantee of
    /// [`Plan::verify`], and that the derived sections (`servers`, `verified`) agree with `links`.
    pub fn from_json(text: &str) -> Result<Plan> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::InvalidUsage(format!("plan JSON: {e}")))?;
        match value.get("schema_version").and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(SCHEMA_VERSION) => {}
            Some(v) => {
                return Err(Error::InvalidUsage(format!(
                    "plan JSON: schema_version {v} is not supported; this switchless reads schema_version {SCHEMA_VERSION}"
                )));
            }
            None => {
                return Err(Error::InvalidUsage(format!(
                    "plan JSON: no numeric `schema_version`; expected a file written by `switchless plan --format json` (schema_version {SCHEMA_VERSION})"
                )));
            }
        }
        let doc: PlanDoc = serde_json::from_value(value)
            .map_err(|e| Error::InvalidUsage(format!("plan JSON: {e}")))?;
        let mut links = doc.links.clone();
        links.sort_by_key(|l| l.id);
        let mut model = doc.model.clone();
        model.origin = format!("model {} of the plan", model.name);
        let plan = Plan {
            model,
            base: doc.addressing.base,
            prefix: doc.addressing.prefix,
            mtu: doc.mtu,
            servers: doc.server_count,
            links,
            cables_file: doc.cables_file.clone(),
            names: doc.server_names.clone(),
        };
        plan.verify()
            .map_err(|e| Error::InvalidUsage(format!("plan JSON: {e}")))?;
        let derived = plan.doc()?;
        if derived.servers != doc.servers {
            return Err(Error::InvalidUsage(
                "plan JSON: the `servers` section disagrees with `links` (edited by hand?); regenerate it with `switchless plan --format json`".into(),
            ));
        }
        if derived.verified != doc.verified {
            return Err(Error::InvalidUsage(format!(
                "plan JSON: `verified` says {:?} but the links give {:?}",
                doc.verified, derived.verified
            )));
        }
        Ok(plan)
    }
}

/// The JSON document (schema_version 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PlanDoc {
    schema_version: u32,
    generator: String,
    model: PortMap,
    addressing: AddressingDoc,
    mtu: u32,
    server_count: u32,
    servers: Vec<ServerDoc>,
    links: Vec<Link>,
    verified: Verified,
    /// The cables file, when the CLI knew it (absent in older plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cables_file: Option<String>,
    /// Host names by server number, when the cables file names hosts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    server_names: BTreeMap<u32, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct AddressingDoc {
    base: Ipv4Net,
    prefix: u8,
    addresses_per_link: u64,
    ports_per_server: u32,
    functions_per_port: u32,
    rule: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ServerDoc {
    server: u32,
    interfaces: Vec<IfaceDoc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct IfaceDoc {
    interface: String,
    port: u32,
    function: u32,
    address: Ipv4Net,
    subnet: Ipv4Net,
    link: u64,
    peer: PeerDoc,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PeerDoc {
    server: u32,
    port: u32,
    interface: String,
    address: Ipv4Addr,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(text: &str) -> Plan {
        let map = PortMap::b300();
        let c = cables::parse("c.txt", text, &map, None).unwrap();
        build(&c, &map, &Options::default()).unwrap().plan
    }

    #[test]
    fn lower_server_gets_lower_address() {
        let p = plan_of("2-3 > 1-1\n");
        assert_eq!(p.links.len(), 2);
        let l = &p.links[0];
        assert_eq!(l.ends[0].server, 1);
        assert_eq!(l.ends[0].interface, "eno6np0");
        assert_eq!(l.ends[0].address.to_string(), "10.100.0.1/30");
        assert_eq!(l.ends[1].interface, "eno8np0");
        assert_eq!(l.ends[1].address.to_string(), "10.100.0.2/30");
        assert_eq!(p.links[1].ends[1].interface, "enp220s0f1np1");
        assert_eq!(p.links[1].subnet.to_string(), "10.100.0.4/30");
    }

    #[test]
    fn verify_catches_broken_plans() {
        let good = plan_of("1-1 > 2-1\n1-2 > 2-2\n");
        let mut p = good.clone();
        p.links[1].subnet = p.links[0].subnet;
        assert!(p.verify().is_err());
        let mut p = good.clone();
        p.links[1].ends[1].address = p.links[0].ends[1].address;
        assert!(p.verify().unwrap_err().contains("not in subnet"));
        let mut p = good.clone();
        p.links.swap(0, 1);
        p.links[0].id = p.links[1].id;
        assert!(p.verify().unwrap_err().contains("used twice"));
        let mut p = good.clone();
        p.links[0].ends.swap(0, 1);
        assert!(p.verify().unwrap_err().contains("lower server first"));
        let mut p = good;
        p.links[0].ends[0].address = "10.100.0.0/30".parse().unwrap();
        assert!(p.verify().unwrap_err().contains("network or broadcast"));
    }

    #[test]
    fn range_too_small_says_how_much_is_needed() {
        let map = PortMap::b300();
        let c = cables::parse("c.txt", "1-8 > 2-8\n", &map, None).unwrap();
        let opts = Options {
            base: "10.1.0.0/28".parse().unwrap(),
            ..Options::default()
        };
        let e = build(&c, &map, &opts).unwrap_err().to_string();
        assert!(e.contains("--base 10.1.0.0/28 holds 16 addresses"), "{e}");
        assert!(e.contains("2 links need 8 addresses"), "{e}");
        assert!(
            e.contains("highest slot, 15, ends at address offset 64"),
            "{e}"
        );
        assert!(e.contains("give --base a /26 or larger range"), "{e}");
    }
}
