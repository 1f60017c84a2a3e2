//! Port maps: which netdevs sit behind each numbered front-panel port of a server model.
//!
//! Two maps are built in:
//!
//! * `b300` (NVIDIA DGX B300): 8 ConnectX-8 OSFP ports, numbered 1..8 left to right as seen from outside the
//!   chassis. Each port shows two Ethernet netdevs (PCI functions 0 and 1 of one card, 400G each). The physical
//!   order maps onto the mst card index as 1→7, 2→4, 3→6, 4→5, 5→0, 6→3, 7→1, 8→2 (found on a B300 mesh by plugging
//!   cables one at a time).
//! * `gb10` (DGX Spark and other GB10 boxes): 2 QSFP ports of one ConnectX-7 in multi-host mode; each port shows
//!   one function on each of the two PCIe x4 roots (domains 0000 and 0002). NVIDIA's GB10 forum guidance pairs
//!   `enp1s0f0np0` with `enP2p1s0f0np0` for one cable; the DGX Spark playbooks pair `enp1s0f1np1` with
//!   `enP2p1s0f1np1` for the other.
//!
//! Anything else comes from a map file (see [`PortMap::parse`]).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One numbered port and the netdevs behind it, in function order (index 0 first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortEntry {
    pub port: u32,
    pub interfaces: Vec<String>,
}

/// A server model: its name and its ports, sorted by port number.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortMap {
    /// `b300`, `gb10`, or the `name =` of a map file (its file name when it has none).
    pub name: String,
    /// Ports sorted by number, each with at least one interface.
    pub ports: Vec<PortEntry>,
    /// Ports one server names differently (`server 2 port 1 = enp6s0` in a map file): by server,
    /// sorted by port; a port not listed there is the model's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub servers: BTreeMap<u32, Vec<PortEntry>>,
    /// Where the map came from, for error messages (`built-in map b300`, `port map FILE`).
    #[serde(skip)]
    pub origin: String,
}

impl PartialEq for PortMap {
    /// Two maps are equal when they name the same ports and interfaces; where they came from does not matter.
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.ports == other.ports && self.servers == other.servers
    }
}
impl Eq for PortMap {}

/// DGX B300: physical port (1-based, left to right) → mst card index (`pciconf<N>`), as measured on a B300 mesh.
const B300_PORT_TO_CARD: [usize; 8] = [7, 4, 6, 5, 0, 3, 1, 2];

/// DGX B300: mst card index → (function 0 netdev, function 1 netdev), from the `mst status -v` listing of a DGX B300.
const B300_CARD_IFACES: [(&str, &str); 8] = [
    ("eno10np0", "enp23s0f1np1"),
    ("eno12np0", "enp57s0f1np1"),
    ("eno13np0", "enp95s0f1np1"),
    ("eno11np0", "enp112s0f1np1"),
    ("eno7np0", "enp151s0f1np1"),
    ("eno9np0", "enp185s0f1np1"),
    ("eno8np0", "enp220s0f1np1"),
    ("eno6np0", "enp237s0f1np1"),
];

/// GB10 / DGX Spark: QSFP port → (root 0 function, root 2 function).
const GB10_PORTS: [(&str, &str); 2] = [
    ("enp1s0f0np0", "enP2p1s0f0np0"),
    ("enp1s0f1np1", "enP2p1s0f1np1"),
];

/// Names `--model` accepts besides a file path.
pub const BUILTIN_MODELS: &[&str] = &["b300", "gb10"];

impl PortMap {
    /// The built-in map for DGX B300.
    pub fn b300() -> PortMap {
        let ports = B300_PORT_TO_CARD
            .iter()
            .enumerate()
            .map(|(i, &card)| {
                let (f0, f1) = B300_CARD_IFACES[card];
                PortEntry {
                    port: i as u32 + 1,
                    interfaces: vec![f0.to_string(), f1.to_string()],
                }
            })
            .collect();
        PortMap {
            name: "b300".into(),
            ports,
            servers: BTreeMap::new(),
            origin: "built-in map b300".into(),
        }
    }

    /// The built-in map for GB10 (DGX Spark, and the Dell/ASUS boxes on the same board).
    pub fn gb10() -> PortMap {
        let ports = GB10_PORTS
            .iter()
            .enumerate()
            .map(|(i, (a, b))| PortEntry {
                port: i as u32 + 1,
                interfaces: vec![a.to_string(), b.to_string()],
            })
            .collect();
        PortMap {
            name: "gb10".into(),
            ports,
            servers: BTreeMap::new(),
            origin: "built-in map gb10".into(),
        }
    }

    /// A built-in map by name (`b300`, `gb10`; `dgx-b300`, `spark`, `dgx-spark` as aliases), case-insensitive.
    pub fn builtin(name: &str) -> Option<PortMap> {
        match name.to_ascii_lowercase().as_str() {
            "b300" | "dgx-b300" => Some(PortMap::b300()),
            "gb10" | "spark" | "dgx-spark" => Some(PortMap::gb10()),
            _ => None,
        }
    }

    /// The built-in model whose interfaces a host has the most of (`names`: its netdevs); `None`
    /// when the host has none of any built-in model's interfaces.
    pub fn builtin_like(names: &[&str]) -> Option<PortMap> {
        [PortMap::b300(), PortMap::gb10()]
            .into_iter()
            .map(|m| {
                let hits = m
                    .ports
                    .iter()
                    .flat_map(|p| &p.interfaces)
                    .filter(|i| names.contains(&i.as_str()))
                    .count();
                (hits, m)
            })
            .filter(|(hits, _)| *hits > 0)
            .max_by_key(|(hits, _)| *hits)
            .map(|(_, m)| m)
    }

    /// `--model`: a built-in name, or else the path of a map file.
    pub fn load(model: &str) -> Result<PortMap> {
        if let Some(m) = PortMap::builtin(model) {
            return Ok(m);
        }
        let text = std::fs::read_to_string(model).map_err(|e| {
            Error::InvalidUsage(format!(
                "--model {model}: not a built-in model ({}) and not a readable map file: {e}",
                BUILTIN_MODELS.join(", ")
            ))
        })?;
        PortMap::parse(model, &text)
    }

    /// Parses a map file. `source` names it in messages.
    ///
    /// Format, one entry per line; `#` starts a comment; blank lines are ignored; whitespace is free:
    ///
    /// ```text
    /// name = my-server          # optional; the model name shown in plans
    /// 1 = ens1f0np0 ens1f1np1   # port 1: function 0, function 1
    /// 2 = ens2f0np0             # port 2: one interface
    /// server 2 port 1 = enp6s0  # server 2 names its port 1 differently
    /// ```
    ///
    /// Ports are whole numbers 1..=65535; each lists one or more interface names (1..15 bytes of ASCII letters,
    /// digits, `.`, `_`, `-`), separated by spaces or commas. Every error is collected, each as `FILE:LINE: what`.
    pub fn parse(source: &str, text: &str) -> Result<PortMap> {
        let mut errors = Vec::new();
        let mut name: Option<String> = None;
        let mut ports: BTreeMap<u32, (usize, Vec<String>)> = BTreeMap::new();
        let mut seen_if: BTreeMap<String, usize> = BTreeMap::new();
        let mut per_server: BTreeMap<u32, Vec<(u32, Vec<String>)>> = BTreeMap::new();
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let Some((key, value)) = content.split_once('=') else {
                errors.push(format!(
                    "{source}:{line}: `{content}` has no `=`; expected `PORT = IFNAME [IFNAME...]` or `name = MODEL`"
                ));
                continue;
            };
            let key = key.trim();
            let value = value.trim();
            // `server N port P = IF...`: a port one server names differently.
            let words: Vec<&str> = key.split_whitespace().collect();
            if words
                .first()
                .is_some_and(|w| w.eq_ignore_ascii_case("server"))
            {
                let (server, port) = match words.as_slice() {
                    [_, n, p, q] if p.eq_ignore_ascii_case("port") => (
                        n.parse::<u32>().ok().filter(|n| *n >= 1),
                        q.parse::<u32>().ok().filter(|q| (1..=65535).contains(q)),
                    ),
                    _ => (None, None),
                };
                let (Some(server), Some(port)) = (server, port) else {
                    errors.push(format!(
                        "{source}:{line}: `{key}` is not `server N port P` (N a server number from 1, P a port 1..=65535)"
                    ));
                    continue;
                };
                let ifaces: Vec<String> = value
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                if ifaces.is_empty() {
                    errors.push(format!(
                        "{source}:{line}: server {server} port {port} lists no interface"
                    ));
                    continue;
                }
                let mut ok = true;
                for ifname in &ifaces {
                    if let Err(why) = check_ifname(ifname) {
                        errors.push(format!("{source}:{line}: {why}"));
                        ok = false;
                    }
                }
                let e = per_server.entry(server).or_default();
                if e.iter().any(|(p, _): &(u32, Vec<String>)| *p == port) {
                    errors.push(format!(
                        "{source}:{line}: server {server} port {port} is already defined"
                    ));
                } else if ok {
                    e.push((port, ifaces));
                }
                continue;
            }
            if key.eq_ignore_ascii_case("name") {
                if value.is_empty() || value.split_whitespace().count() != 1 {
                    errors.push(format!(
                        "{source}:{line}: `name =` needs one word, got `{value}`"
                    ));
                } else if name.is_some() {
                    errors.push(format!("{source}:{line}: `name` is given twice"));
                } else {
                    name = Some(value.to_string());
                }
                continue;
            }
            let port = match key.parse::<u32>() {
                Ok(p) if (1..=65535).contains(&p) => p,
                _ => {
                    errors.push(format!(
                        "{source}:{line}: `{key}` is not a port number; ports are whole numbers 1..=65535"
                    ));
                    continue;
                }
            };
            let ifaces: Vec<String> = value
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if ifaces.is_empty() {
                errors.push(format!(
                    "{source}:{line}: port {port} lists no interface; expected `{port} = IFNAME [IFNAME...]`"
                ));
                continue;
            }
            let mut ok = true;
            for ifname in &ifaces {
                if let Err(why) = check_ifname(ifname) {
                    errors.push(format!("{source}:{line}: {why}"));
                    ok = false;
                } else if let Some(first) = seen_if.get(ifname) {
                    errors.push(format!(
                        "{source}:{line}: interface {ifname} is already listed at line {first}; each interface belongs to one port"
                    ));
                    ok = false;
                } else {
                    seen_if.insert(ifname.clone(), line);
                }
            }
            if let Some((first, _)) = ports.get(&port) {
                errors.push(format!(
                    "{source}:{line}: port {port} is already defined at line {first}"
                ));
                continue;
            }
            if ok {
                ports.insert(port, (line, ifaces));
            }
        }
        if errors.is_empty() && ports.is_empty() {
            errors.push(format!(
                "{source}: defines no port; expected lines `PORT = IFNAME [IFNAME...]`"
            ));
        }
        if !errors.is_empty() {
            return Err(collected(source, "port map", errors));
        }
        let default_name = std::path::Path::new(source)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "custom".into());
        let map = PortMap {
            name: name.unwrap_or(default_name),
            ports: ports
                .into_iter()
                .map(|(port, (_, interfaces))| PortEntry { port, interfaces })
                .collect(),
            servers: per_server
                .into_iter()
                .map(|(s, mut v)| {
                    v.sort_by_key(|(p, _)| *p);
                    (
                        s,
                        v.into_iter()
                            .map(|(port, interfaces)| PortEntry { port, interfaces })
                            .collect(),
                    )
                })
                .collect(),
            origin: format!("port map {source}"),
        };
        map.validate()
            .map_err(|why| collected(source, "port map", vec![format!("{source}: {why}")]))?;
        Ok(map)
    }

    /// The interfaces behind `port` of `server`: its own line (`server N port P = …`) when the map
    /// has one, else the model's.
    pub fn port_of(&self, server: u32, port: u32) -> Option<&[String]> {
        self.servers
            .get(&server)
            .and_then(|v| v.iter().find(|p| p.port == port))
            .map(|p| p.interfaces.as_slice())
            .or_else(|| self.port(port))
    }

    /// The port `ifname` is behind on `server` (its own lines first).
    pub fn port_number_of(&self, server: u32, ifname: &str) -> Option<u32> {
        let own = self.servers.get(&server);
        own.and_then(|v| v.iter().find(|p| p.interfaces.iter().any(|i| i == ifname)))
            .or_else(|| {
                self.ports.iter().find(|p| {
                    p.interfaces.iter().any(|i| i == ifname)
                        && !own.is_some_and(|v| v.iter().any(|o| o.port == p.port))
                })
            })
            .map(|p| p.port)
    }

    /// The interfaces behind `port`, or `None` when the map has no such port.
    pub fn port(&self, port: u32) -> Option<&[String]> {
        self.ports
            .iter()
            .find(|p| p.port == port)
            .map(|p| p.interfaces.as_slice())
    }

    /// Every port entry of the model and of its servers' own lines.
    fn all_entries(&self) -> impl Iterator<Item = &PortEntry> {
        self.ports.iter().chain(self.servers.values().flatten())
    }

    /// The highest port number (the address stride; see `address`).
    pub fn max_port(&self) -> u32 {
        self.all_entries().map(|p| p.port).max().unwrap_or(0)
    }

    /// The most interfaces any port has.
    pub fn max_functions(&self) -> u32 {
        self.all_entries()
            .map(|p| p.interfaces.len() as u32)
            .max()
            .unwrap_or(0)
    }

    /// The port numbers, compactly: `1-8`, `1, 2, 4-6`.
    pub fn port_list(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        let nums: Vec<u32> = self.ports.iter().map(|p| p.port).collect();
        let mut i = 0;
        while i < nums.len() {
            let start = nums[i];
            let mut end = start;
            while i + 1 < nums.len() && nums[i + 1] == end + 1 {
                i += 1;
                end = nums[i];
            }
            out.push(if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            });
            i += 1;
        }
        out.join(", ")
    }

    /// Checks a map read back from JSON: ports sorted and unique, interfaces valid and unique (on each
    /// server, its own lines with the model's ports they leave).
    pub fn validate(&self) -> std::result::Result<(), String> {
        for (s, own) in &self.servers {
            let mut names = BTreeSet::new();
            let mut last = 0;
            for p in own {
                if p.port <= last {
                    return Err(format!(
                        "server {s}'s ports must be unique and sorted; port {} follows {last}",
                        p.port
                    ));
                }
                last = p.port;
                if p.interfaces.is_empty() {
                    return Err(format!("server {s} port {} lists no interface", p.port));
                }
            }
            let effective = own.iter().chain(
                self.ports
                    .iter()
                    .filter(|p| !own.iter().any(|o| o.port == p.port)),
            );
            for p in effective {
                for i in &p.interfaces {
                    check_ifname(i)?;
                    if !names.insert(i.as_str()) {
                        return Err(format!("server {s} would use interface {i} for two ports"));
                    }
                }
            }
        }
        let mut last = 0;
        let mut names = BTreeSet::new();
        if self.ports.is_empty() {
            return Err("model has no port".into());
        }
        for p in &self.ports {
            if p.port <= last {
                return Err(format!(
                    "model ports must be unique and sorted; port {} follows {last}",
                    p.port
                ));
            }
            last = p.port;
            if p.interfaces.is_empty() {
                return Err(format!("model port {} lists no interface", p.port));
            }
            for i in &p.interfaces {
                check_ifname(i)?;
                if !names.insert(i.as_str()) {
                    return Err(format!("model lists interface {i} twice"));
                }
            }
        }
        Ok(())
    }
}

/// Interface names this tool accepts: 1 to 15 bytes (Linux's limit) of ASCII letters, digits, `.`, `_` and `-`,
/// other than `.` and `..`. Linux allows more, but these names go verbatim into shell commands and YAML.
pub(crate) fn check_ifname(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not an accepted interface name (1 to 15 bytes of ASCII letters, digits, `.`, `_`, `-`)"
        ))
    }
}

/// One error listing every collected problem: `FILE: N errors in the WHAT:` then one per line.
pub(crate) fn collected(source: &str, what: &str, errors: Vec<String>) -> Error {
    let n = errors.len();
    let plural = if n == 1 { "error" } else { "errors" };
    Error::InvalidUsage(format!(
        "{source}: {n} {plural} in the {what}:\n  {}",
        errors.join("\n  ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b300_follows_seed_002() {
        let m = PortMap::b300();
        assert_eq!(m.ports.len(), 8);
        assert_eq!(m.port(1).unwrap(), ["eno6np0", "enp237s0f1np1"]);
        assert_eq!(m.port(2).unwrap(), ["eno7np0", "enp151s0f1np1"]);
        assert_eq!(m.port(5).unwrap(), ["eno10np0", "enp23s0f1np1"]);
        assert_eq!(m.port(8).unwrap(), ["eno13np0", "enp95s0f1np1"]);
        assert_eq!(m.max_port(), 8);
        assert_eq!(m.max_functions(), 2);
        assert!(m.validate().is_ok());
    }

    #[test]
    fn gb10_pairs_functions_of_one_port() {
        let m = PortMap::builtin("DGX-Spark").unwrap();
        assert_eq!(m.port(1).unwrap(), ["enp1s0f0np0", "enP2p1s0f0np0"]);
        assert_eq!(m.port(2).unwrap(), ["enp1s0f1np1", "enP2p1s0f1np1"]);
        assert_eq!(m.port_list(), "1-2");
    }

    #[test]
    fn parses_map_file() {
        let m = PortMap::parse(
            "m.map",
            "# test\nname = box\n 1 = a0 a1 # x\n\n4=b0,b1\n2 = c0\n",
        )
        .unwrap();
        assert_eq!(m.name, "box");
        assert_eq!(m.port_list(), "1-2, 4");
        assert_eq!(m.port(4).unwrap(), ["b0", "b1"]);
        assert_eq!(m.max_port(), 4);
    }

    #[test]
    fn map_file_errors_name_file_and_line() {
        let e = PortMap::parse(
            "m.map",
            "1 = a\nx = b\n1 = c\n2 = a\n3 =\n4 = way-too-long-name0\nnonsense\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("m.map: 6 errors"), "{e}");
        assert!(e.contains("m.map:2: `x` is not a port number"), "{e}");
        assert!(
            e.contains("m.map:3: port 1 is already defined at line 1"),
            "{e}"
        );
        assert!(
            e.contains("m.map:4: interface a is already listed at line 1"),
            "{e}"
        );
        assert!(e.contains("m.map:5: port 3 lists no interface"), "{e}");
        assert!(
            e.contains("m.map:6: `way-too-long-name0` is not an accepted"),
            "{e}"
        );
        assert!(e.contains("m.map:7: `nonsense` has no `=`"), "{e}");
    }

    #[test]
    fn empty_map_is_an_error() {
        let e = PortMap::parse("e.map", "# nothing\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("e.map: defines no port"), "{e}");
    }
}
