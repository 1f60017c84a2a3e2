//! The doctor's view of the environment NCCL and the plugin would run with: every bad value as its
//! own finding (as the plugin's init would refuse it), misspelled variable names, what
//! `NCCL_IB_HCA` really selects, and which NCCL devices the plugin would expose ([`NcclView`]: RoCE,
//! or TCP through the plugin's own `plugin::factory::net::tcp_host`).
//!
//! Depends on `config` (the one table of variables) and `host` (the model).

use std::collections::BTreeMap;

use serde::Serialize;

use super::registry::check;
use crate::config::{Config, HcaFilter, OWN_PREFIX, TransportMode, VARIABLES};
use crate::findings::{Finding, Severity};
use crate::host::model::HostModel;
use crate::host::nccl::NcclDevice;

/// The variables of an environment the doctor judges (the shell it runs in, a captured tree's, or a
/// test's list): every `NCCL_*` one, any other name within a typo of one NCCL or the plugin reads
/// (`NCLL_IB_HCA`), and the dynamic loader's `LD_PRELOAD` and `LD_LIBRARY_PATH` (which NCCL a
/// process gets). Nothing else is kept, so a capture of it holds no unrelated (secret) variable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct NcclEnv {
    vars: BTreeMap<String, String>,
}

/// The dynamic loader's variables the doctor reads.
pub const LOADER_VARS: [&str; 2] = ["LD_PRELOAD", "LD_LIBRARY_PATH"];

/// How many edits a name may be away from a known one to be taken for a typo of it: 1 up to 12
/// characters, 2 up to 24, 3 beyond (`NCCL_SWITCHLES_TCP_STREAMS` is 1 from the real name).
fn typo_budget(name: &str) -> usize {
    match name.len() {
        0..=12 => 1,
        13..=24 => 2,
        _ => 3,
    }
}

/// The known name `name` is a typo of, if any.
fn meant(name: &str) -> Option<&'static str> {
    nearest(name, crate::config::nccl::known_names(), typo_budget(name))
}

impl NcclEnv {
    /// The `NCCL_*` variables of this process (a value that is not Unicode is kept lossily, so the
    /// parser refuses it by name, as the plugin would).
    pub fn from_process() -> NcclEnv {
        NcclEnv::from_pairs(std::env::vars_os().filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            Some((k, v.to_string_lossy().into_owned()))
        }))
    }

    /// The entries of `pairs` the doctor judges (see [`NcclEnv`]).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> NcclEnv {
        NcclEnv {
            vars: pairs
                .into_iter()
                .filter(|(k, _)| {
                    k.starts_with("NCCL_")
                        || LOADER_VARS.contains(&k.as_str())
                        || (k.len() >= 6 && meant(k).is_some())
                })
                .collect(),
        }
    }

    /// A variable's value; `None` when unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// Present and not blank (NCCL treats a blank value as unset).
    fn set(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.trim().is_empty())
    }
}

/// A value as a shell word: plain when it needs no quoting, else in single quotes.
pub(crate) fn shell_word(v: &str) -> String {
    let plain = !v.is_empty()
        && v.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'_' | b'-' | b'.' | b'/' | b':' | b',' | b'=' | b'^' | b'+'
                )
        });
    if plain {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', "'\\''"))
    }
}

/// The configuration the plugin's init would build, and a finding per problem. `config` is `None`
/// when init would refuse the environment.
pub struct EnvJudgement {
    pub config: Option<Config>,
    pub findings: Vec<Finding>,
}

/// Judges every variable of the configuration table on its own (one finding per bad variable),
/// then the combination, then the names nobody reads.
pub fn judge(env: &NcclEnv) -> EnvJudgement {
    let mut findings = Vec::new();
    for var in Config::TABLE {
        let Some(value) = env.set(var.name) else {
            continue;
        };
        let alone = Config::from_vars(|n| (n == var.name).then(|| value.to_string()));
        let Err(e) = alone else { continue };
        let why = e.to_string();
        let why = why.strip_prefix("invalid configuration: ").unwrap_or(&why);
        let default = if var.default.is_empty() {
            "back to the default".to_string()
        } else {
            format!("back to the default, {}", var.default)
        };
        let fix = suggestion(var.name, value).map_or(String::new(), |s| {
            format!("export {}={}   # or ", var.name, shell_word(&s))
        });
        findings.push(Finding::new(
            Severity::Error,
            check::NCCL_ENV,
            var.name,
            format!("the plugin's init would refuse this environment: {why}"),
            format!("{fix}unset {}   # {default}", var.name),
        ));
    }
    let config = match Config::from_vars(|n| env.set(n).map(str::to_string)) {
        Ok(c) if findings.is_empty() => Some(c),
        Ok(_) => None,
        Err(e) => {
            if findings.is_empty() {
                // Every value is fine on its own: the combination is refused.
                let why = e.to_string();
                let why = why.strip_prefix("invalid configuration: ").unwrap_or(&why);
                findings.push(Finding::new(
                    Severity::Error,
                    check::NCCL_ENV,
                    "NCCL_SWITCHLESS_TRANSPORT",
                    format!("the plugin's init would refuse this environment: {why}"),
                    "unset NCCL_SWITCHLESS_TCP_FALLBACK   # RDMA only; or: export NCCL_SWITCHLESS_TRANSPORT=auto   # RDMA, TCP where no RDMA path",
                ));
            }
            None
        }
    };
    findings.extend(bare_durations(env));
    findings.extend(unknown_names(env));
    for name in crate::config::NCCL_MERGE_VARS {
        if let Some(v) = env.set(name) {
            findings.push(Finding::new(
                Severity::Warning,
                check::NCCL_ENV,
                *name,
                crate::config::merge_var_note(name, v),
                format!(
                    "unset {name}   # nothing to merge: every path to the peer is used already"
                ),
            ));
        }
    }
    EnvJudgement { config, findings }
}

/// A duration variable set to a bare number (not 0) that parses: read as milliseconds, while the
/// command line reads a bare number as seconds. Said, so that `300` meant as seconds is caught.
fn bare_durations(env: &NcclEnv) -> Vec<Finding> {
    let mut out = Vec::new();
    for var in Config::TABLE
        .iter()
        .filter(|v| v.forms.contains("a number of milliseconds"))
    {
        let Some(value) = env.set(var.name) else {
            continue;
        };
        let v = value.trim();
        if v == "0" || !v.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if Config::from_vars(|n| (n == var.name).then(|| v.to_string())).is_err() {
            continue; // refused: the nccl-env finding says so, with the same hint
        }
        out.push(Finding::new(
            Severity::Warning,
            check::NCCL_ENV_UNIT,
            var.name,
            format!(
                "{}={v} is read as {v} ms: in the environment a bare number is milliseconds (on the switchless \
                 command line, seconds), so a value meant as seconds is 1000 times too short",
                var.name
            ),
            format!(
                "export {0}={v}ms   # or {0}={v}s if seconds were meant: with a unit it reads the same everywhere",
                var.name
            ),
        ));
    }
    out
}

/// A value close to a refused one that parses, when the slip is a common one: a bare number meant
/// as seconds (`CONNECT_TIMEOUT=30`, read as 30 ms).
fn suggestion(name: &str, value: &str) -> Option<String> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seconds = format!("{v}s");
    Config::from_vars(|n| (n == name).then(|| seconds.clone()))
        .ok()
        .filter(|_| name.ends_with("_TIMEOUT"))
        .map(|_| seconds)
}

/// Optimal string alignment distance (Levenshtein plus adjacent transpositions), on bytes.
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// The known name nearest to `name` among `known`, when it is within `max` edits.
fn nearest<'a>(name: &str, known: impl Iterator<Item = &'a str>, max: usize) -> Option<&'a str> {
    known
        // The distance is at least the difference in length: skip those without computing it.
        .filter(|k| k.len().abs_diff(name.len()) <= max)
        .map(|k| (distance(name, k), k))
        .filter(|(d, _)| *d <= max)
        .min()
        .map(|(_, k)| k)
}

/// Set names nobody reads: any unknown `NCCL_SWITCHLESS_*` (with the nearest of the plugin's names,
/// or the list of them), and any other name within a typo of a variable NCCL or the plugin reads,
/// whatever part the typo is in (`NCCL_SWITCHLES_TCP_STREAMS`, `NCLL_IB_HCA`, `NCCL_CROS_NIC`). An
/// `NCCL_*` name far from every known one may be a newer NCCL's variable: no finding.
fn unknown_names(env: &NcclEnv) -> Vec<Finding> {
    let mut out = Vec::new();
    let known = |n: &str| crate::config::nccl::known_names().any(|k| k == n);
    for (name, value) in &env.vars {
        if known(name) || LOADER_VARS.contains(&name.as_str()) {
            continue;
        }
        let own = name.starts_with(OWN_PREFIX);
        let m = if own {
            nearest(
                name,
                VARIABLES
                    .iter()
                    .copied()
                    .filter(|v| v.starts_with(OWN_PREFIX)),
                4,
            )
        } else {
            meant(name)
        };
        let reader = |m: &str| {
            if VARIABLES.contains(&m) {
                "the plugin reads"
            } else {
                "NCCL reads"
            }
        };
        let (message, remedy) = match m {
            Some(m) => (
                format!(
                    "{name} is set but neither NCCL nor the plugin reads that name, so it is ignored and {m} \
                     (which {}) keeps its value{}: did you mean {m}?",
                    reader(m),
                    env.get(m)
                        .map_or(" (unset: the default)".to_string(), |v| format!(" ({v:?})"))
                ),
                format!("export {m}={}; unset {name}", shell_word(value)),
            ),
            None if own => (
                format!(
                    "{name} is set but no switchless variable has that name, so the plugin ignores it; \
                     the plugin reads {}",
                    VARIABLES
                        .iter()
                        .filter(|v| v.starts_with(OWN_PREFIX))
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                format!("unset {name}"),
            ),
            None => continue,
        };
        out.push(Finding::new(
            Severity::Warning,
            check::NCCL_ENV_UNKNOWN,
            name.as_str(),
            message,
            remedy,
        ));
    }
    out
}

/// A port can carry traffic: ACTIVE, netdev up, and (Ethernet) an IPv4 RoCE v2 GID.
pub(crate) fn usable(m: &HostModel, dev: &str, port: u8) -> bool {
    let Some((_, p)) = m.rdma_port(dev, port) else {
        return false;
    };
    let up = p
        .netdev
        .as_deref()
        .and_then(|n| m.netdev(n))
        .is_none_or(|n| n.is_up());
    p.is_active() && up && (!p.is_ethernet() || p.ipv4_v2_gids().next().is_some())
}

/// What NCCL would get from the plugin on this host: the devices and over which transport.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NcclView {
    /// `rdma` (RoCE ports), `tcp` (point-to-point netdevs) or `none` (init fails; NCCL falls back to
    /// its internal transports).
    pub transport: &'static str,
    /// Why this transport, in one sentence.
    pub why: String,
    #[serde(skip)]
    pub devices: Vec<NcclDevice>,
}

impl NcclView {
    /// As the plugin's init decides (`plugin::factory::net`): `NCCL_SWITCHLESS_TRANSPORT=tcp` takes
    /// TCP; otherwise the RoCE devices that pass `NCCL_IB_HCA`, and with `auto` the TCP devices when
    /// there is none. `rdma` are the RoCE devices already filtered; `config` is `None` when init
    /// refuses the environment.
    pub fn decide(m: &HostModel, config: Option<&Config>, rdma: Vec<NcclDevice>) -> NcclView {
        let Some(cfg) = config else {
            return NcclView {
                transport: "none",
                why: "the plugin's init refuses this environment (the nccl-env findings say why), so NCCL \
                      uses its internal transports"
                    .into(),
                devices: Vec::new(),
            };
        };
        let tcp = || crate::plugin::factory::net::tcp_host(m).1;
        let none_tcp = "no netdev has an up IPv4 address on a /30 or /31 subnet (a management LAN is never \
                        a data path)";
        match cfg.transport {
            TransportMode::Tcp => {
                let devices = tcp();
                let why = if devices.is_empty() {
                    format!("NCCL_SWITCHLESS_TRANSPORT=tcp, but {none_tcp}: init fails and NCCL uses its internal transports")
                } else {
                    "NCCL_SWITCHLESS_TRANSPORT=tcp: TCP sockets on every point-to-point netdev, no RDMA device is opened".into()
                };
                NcclView {
                    transport: if devices.is_empty() { "none" } else { "tcp" },
                    why,
                    devices,
                }
            }
            _ if !rdma.is_empty() => NcclView {
                transport: "rdma",
                why: "RoCE on every ACTIVE port with an IPv4 RoCE v2 GID that NCCL_IB_HCA lets through".into(),
                devices: rdma,
            },
            TransportMode::Rdma => NcclView {
                transport: "none",
                why: "NCCL_SWITCHLESS_TRANSPORT=rdma and no usable RoCE port: init fails and NCCL uses its \
                      internal transports"
                    .into(),
                devices: Vec::new(),
            },
            TransportMode::Auto => {
                let devices = tcp();
                let why = if devices.is_empty() {
                    format!("no usable RoCE port, and {none_tcp}: init fails and NCCL uses its internal transports")
                } else {
                    "no usable RoCE port: the plugin carries connections over TCP on the point-to-point netdevs".into()
                };
                NcclView {
                    transport: if devices.is_empty() { "none" } else { "tcp" },
                    why,
                    devices,
                }
            }
        }
    }
}

/// What `NCCL_IB_HCA` selects (for the report): the value and the RDMA ports it lets through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HcaSelection {
    pub value: String,
    /// `device:port` of every port the filter keeps, in model order.
    pub selected: Vec<String>,
}

/// What the filter lets through on this host.
pub fn hca_selection(m: &HostModel, env: &NcclEnv, filter: &HcaFilter) -> Option<HcaSelection> {
    let value = env.set("NCCL_IB_HCA")?.to_string();
    Some(HcaSelection {
        value,
        selected: m
            .ports()
            .filter(|(d, p)| filter.matches(&d.name, p.port))
            .map(|(d, p)| format!("{}:{}", d.name, p.port))
            .collect(),
    })
}

/// `NCCL_IB_HCA` against this host: a filter that selects no usable port (error), an entry that
/// selects more devices than the one it names by prefix matching, and a filter that keeps only some
/// of the functions serving one cable (warnings). Silent when the variable is unset, malformed
/// (the `nccl-env` finding covers it) or TCP is forced.
pub fn hca_checks(
    m: &HostModel,
    env: &NcclEnv,
    config: Option<&Config>,
    view: &NcclView,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let (Some(cfg), Some(value)) = (config, env.set("NCCL_IB_HCA")) else {
        return out;
    };
    let f = &cfg.ib_hca;
    if f.is_all() || cfg.transport == TransportMode::Tcp || m.rdma_devices.is_empty() {
        return out;
    }
    let obj = "NCCL_IB_HCA";
    let names: Vec<&str> = m.rdma_devices.iter().map(|d| d.name.as_str()).collect();
    // InfiniBand ports are left to NCCL's own IB transport: only RoCE ports count.
    let usable: Vec<(&str, u8)> = m
        .ports()
        .filter(|(d, p)| p.is_ethernet() && usable(m, &d.name, p.port))
        .map(|(d, p)| (d.name.as_str(), p.port))
        .collect();
    let kept: Vec<(&str, u8)> = usable
        .iter()
        .copied()
        .filter(|(d, p)| f.matches(d, *p))
        .collect();
    let quoted = shell_word(value);

    // Entries that name no device at all (a typo such as mlx5_O for mlx5_0).
    let mut typos = Vec::new();
    for e in f.entries() {
        let hits = names.iter().any(|n| {
            if f.is_exact() {
                *n == e.name
            } else {
                n.starts_with(e.name.as_str())
            }
        });
        if !hits {
            typos.push(match nearest(&e.name, names.iter().copied(), 2) {
                Some(n) => format!("{} (did you mean {n}?)", e.name),
                None => e.name.clone(),
            });
        }
    }

    if kept.is_empty() && !usable.is_empty() {
        let what = if typos.is_empty() {
            "selects no usable RoCE port".to_string()
        } else {
            format!("names no device of this host: {}", typos.join(", "))
        };
        let consequence = match view.transport {
            "tcp" => format!(
                "so the plugin falls back to TCP on {} netdev(s), far below RoCE bandwidth",
                view.devices.len()
            ),
            _ => "so the plugin exposes no device and NCCL falls back to its internal transports"
                .to_string(),
        };
        let all: Vec<String> = usable.iter().map(|(d, _)| d.to_string()).collect();
        out.push(Finding::new(
            Severity::Error,
            check::IB_HCA_NO_MATCH,
            obj,
            format!(
                "NCCL_IB_HCA={quoted} {what}, {consequence}; the usable RoCE devices are {}",
                dedup(all.clone()).join(", ")
            ),
            format!("unset NCCL_IB_HCA   # every port; or name the devices exactly: export NCCL_IB_HCA={}", shell_word(&format!("={}", dedup(all).join(",")))),
        ));
        return out;
    }
    if !typos.is_empty() {
        out.push(Finding::new(
            Severity::Warning,
            check::IB_HCA_NO_MATCH,
            obj,
            format!(
                "NCCL_IB_HCA={quoted}: these entries name no device of this host: {}",
                typos.join(", ")
            ),
            format!(
                "fix or drop them; the devices here are {}",
                names.join(", ")
            ),
        ));
    }

    // Prefix matching: an entry that is a device name and also selects longer names.
    let mut prefix = Vec::new();
    if !f.is_exact() {
        for e in f.entries() {
            if !names.contains(&e.name.as_str()) {
                continue;
            }
            let more: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| *n != e.name && n.starts_with(e.name.as_str()))
                .collect();
            if !more.is_empty() {
                prefix.push(format!(
                    "entry {} also {} {} (NCCL matches names by prefix unless the list starts with =)",
                    e.name,
                    if f.is_exclude() { "excludes" } else { "selects" },
                    more.join(", ")
                ));
            }
        }
    }

    // A cable (cage) whose functions the filter splits: half its bandwidth stays idle.
    let mut cages: BTreeMap<_, Vec<(&str, u8)>> = BTreeMap::new();
    for (d, p) in m.ports() {
        if usable.contains(&(d.name.as_str(), p.port)) {
            cages
                .entry(p.cage.clone())
                .or_default()
                .push((d.name.as_str(), p.port));
        }
    }
    let mut split = Vec::new();
    for members in cages.values() {
        let (k, dropped): (Vec<_>, Vec<_>) = members.iter().partition(|(d, p)| f.matches(d, *p));
        if !k.is_empty() && !dropped.is_empty() {
            split.push((k, dropped));
        }
    }
    if prefix.is_empty() && split.is_empty() {
        return out;
    }
    let port_list = |v: &[&(&str, u8)]| {
        v.iter()
            .map(|(d, p)| format!("{d} port {p}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let split_text: Vec<String> = split
        .iter()
        .map(|(k, d)| format!("keeps {} but drops {}", port_list(k), port_list(d)))
        .collect();
    // One fault, one remedy: the devices the entries name exactly, with the other functions of
    // their cables, as an exact list (or, for an exclude list, the exact names it meant).
    let remedy = if f.is_exclude() {
        let named: Vec<&str> = f
            .entries()
            .iter()
            .map(|e| e.name.as_str())
            .filter(|n| names.contains(n))
            .collect();
        format!(
            "export NCCL_IB_HCA={}   # exact names; or unset NCCL_IB_HCA (every port)",
            shell_word(&format!("^={}", named.join(",")))
        )
    } else {
        let mut wanted: Vec<String> = f
            .entries()
            .iter()
            .map(|e| e.name.clone())
            .filter(|n| names.contains(&n.as_str()))
            .collect();
        if f.is_exact() || wanted.is_empty() {
            wanted = kept.iter().map(|(d, _)| d.to_string()).collect();
        }
        for (k, dropped) in &split {
            if k.iter().any(|(d, _)| wanted.iter().any(|w| w == d)) {
                wanted.extend(dropped.iter().map(|(d, _)| d.to_string()));
            }
        }
        let mut wanted = dedup(wanted);
        wanted.sort_by_key(|n| names.iter().position(|x| x == n));
        format!(
            "export NCCL_IB_HCA={}   # exact names, both functions of each cable; or unset NCCL_IB_HCA (every port)",
            shell_word(&format!("={}", wanted.join(",")))
        )
    };
    // Named after the first problem: a prefix match (whose exact list also fixes a split) first.
    let id = if prefix.is_empty() {
        check::IB_HCA_SPLITS_PORT
    } else {
        check::IB_HCA_PREFIX_MATCH
    };
    let mut what = prefix;
    if !split_text.is_empty() {
        what.push(format!(
            "it {}: those functions serve the same cable, so its NCCL device gets only part of the cable's \
             bandwidth",
            split_text.join("; ")
        ));
    }
    out.push(Finding::new(
        Severity::Warning,
        id,
        obj,
        format!("NCCL_IB_HCA={quoted}: {}", what.join("; ")),
        remedy,
    ));
    out
}

/// `NCCL_SWITCHLESS_TRANSPORT=tcp` on a host without any point-to-point netdev: init fails.
pub fn transport_checks(config: Option<&Config>, view: &NcclView) -> Vec<Finding> {
    match config {
        Some(c) if c.transport == TransportMode::Tcp && view.devices.is_empty() => {
            vec![Finding::new(
                Severity::Error,
                check::TCP_NO_LINKS,
                "NCCL_SWITCHLESS_TRANSPORT",
                view.why.clone(),
                "unset NCCL_SWITCHLESS_TRANSPORT   # use the RDMA ports; or give each cable its own /30 (switchless plan --format ip)",
            )]
        }
        _ => Vec::new(),
    }
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    v.retain(|x| seen.insert(x.clone()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> NcclEnv {
        NcclEnv::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn merge_variables_are_said_to_do_nothing() {
        let j = judge(&env(&[
            ("NCCL_NET_MERGE_LEVEL", "PORT"),
            ("NCCL_IB_MERGE_NICS", "1"),
        ]));
        assert!(j.config.is_some());
        let objs: Vec<(&str, Severity)> = j
            .findings
            .iter()
            .map(|f| (f.object.as_str(), f.severity))
            .collect();
        assert_eq!(
            objs,
            [
                ("NCCL_NET_MERGE_LEVEL", Severity::Warning),
                ("NCCL_IB_MERGE_NICS", Severity::Warning)
            ]
        );
        assert!(j.findings[0].message.contains("makeVDevice is NULL"));
        assert!(j.findings[1].remedy.starts_with("unset NCCL_IB_MERGE_NICS"));
    }

    #[test]
    fn one_finding_per_bad_variable() {
        let j = judge(&env(&[
            ("NCCL_IB_SL", "99"),
            ("NCCL_IB_TC", "x"),
            ("NCCL_IB_HCA", ":1"),
            ("NCCL_SWITCHLESS_TRANSPORT", "ib"),
            ("PATH", "/bin"),
        ]));
        assert!(j.config.is_none());
        let objs: Vec<&str> = j.findings.iter().map(|f| f.object.as_str()).collect();
        assert_eq!(
            objs,
            [
                "NCCL_IB_HCA",
                "NCCL_IB_TC",
                "NCCL_IB_SL",
                "NCCL_SWITCHLESS_TRANSPORT"
            ]
        );
        assert!(
            j.findings
                .iter()
                .all(|f| f.check == "nccl-env" && f.severity == Severity::Error)
        );
        assert!(
            j.findings[0].message.contains("the device name is missing"),
            "{}",
            j.findings[0].message
        );
        assert_eq!(
            j.findings[0].remedy,
            "unset NCCL_IB_HCA   # back to the default"
        );
    }

    #[test]
    fn a_bare_timeout_suggests_seconds() {
        let j = judge(&env(&[("NCCL_SWITCHLESS_CONNECT_TIMEOUT", "30")]));
        assert_eq!(
            j.findings[0].remedy,
            "export NCCL_SWITCHLESS_CONNECT_TIMEOUT=30s   # or unset NCCL_SWITCHLESS_CONNECT_TIMEOUT   # back to the default, 0"
        );
    }

    #[test]
    fn contradiction_is_one_finding() {
        let j = judge(&env(&[
            ("NCCL_SWITCHLESS_TRANSPORT", "rdma"),
            ("NCCL_SWITCHLESS_TCP_FALLBACK", "1"),
        ]));
        assert_eq!(j.findings.len(), 1);
        assert!(j.findings[0].message.contains("contradicts"));
        assert!(j.config.is_none());
    }

    #[test]
    fn misspelled_names_say_what_was_meant() {
        let j = judge(&env(&[
            ("NCCL_SWITCHLESS_TRANSPROT", "tcp"),
            ("NCCL_IB_HCAS", "mlx5_0"),
            ("NCCL_IB_DISABLE", "0"),
            ("NCCL_IB_SOMETHING_NEW", "1"),
            ("NCCL_SWITCHLESS_ZZZZZZZZZZZZZZZZ", "1"),
        ]));
        assert!(j.config.is_some());
        let f: Vec<(&str, &str)> = j
            .findings
            .iter()
            .map(|f| (f.object.as_str(), f.remedy.as_str()))
            .collect();
        assert_eq!(
            f,
            [
                (
                    "NCCL_IB_HCAS",
                    "export NCCL_IB_HCA=mlx5_0; unset NCCL_IB_HCAS"
                ),
                (
                    "NCCL_SWITCHLESS_TRANSPROT",
                    "export NCCL_SWITCHLESS_TRANSPORT=tcp; unset NCCL_SWITCHLESS_TRANSPROT"
                ),
                (
                    "NCCL_SWITCHLESS_ZZZZZZZZZZZZZZZZ",
                    "unset NCCL_SWITCHLESS_ZZZZZZZZZZZZZZZZ"
                ),
            ]
        );
        assert!(
            j.findings[1]
                .message
                .contains("did you mean NCCL_SWITCHLESS_TRANSPORT?")
        );
        assert!(j.findings.iter().all(|f| f.severity == Severity::Warning));
    }

    #[test]
    fn distances() {
        assert_eq!(distance("TRANSPROT", "TRANSPORT"), 1);
        assert_eq!(distance("abc", "abc"), 0);
        assert_eq!(distance("", "ab"), 2);
        assert_eq!(distance("GID_IDX", "GID_INDEX"), 2);
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word("=mlx5_0,mlx5_1"), "=mlx5_0,mlx5_1");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
