//! The outputs of a plan: a human table, JSON, `ip` commands, netplan YAML and systemd-networkd files.
//!
//! Every renderer verifies the plan first and states the guarantee it proved in its output.
#![forbid(unsafe_code)]

use std::fmt::Write as _;

use super::{Link, Plan, Verified};
use crate::error::{Error, Result};
use crate::tools::units::count;

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table per server (the default).
    Table,
    /// The whole plan as JSON (schema_version 1).
    Json,
    /// Per server an apply script (`ip` commands: link up with the MTU, the planned address as the
    /// only IPv4 one; idempotent) and a check script (pings, run once every server is configured).
    Ip,
    /// One netplan YAML file per server (persists across reboots), for `/etc/netplan/99-switchless.yaml`.
    Netplan,
    /// systemd-networkd `.network` files, one per interface, per server.
    Networkd,
    /// The rank order of the servers that puts NCCL's ring on the most cables per step: one line,
    /// comma-separated (names when the cables file names them), then `#` lines saying why.
    Order,
    /// One sysctl.d file per server, for `/etc/sysctl.d/90-switchless.conf`: on every planned
    /// interface `arp_ignore=1` and `arp_announce=2` (a GB10 port's two PCIe functions share one
    /// wire: without them each answers ARP for the other's address) and no IPv6 temporary addresses
    /// (they shift the RoCE GID table). netplan and networkd have no key for these.
    Sysctl,
}

/// One output file: a path relative to `--out DIR` and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutFile {
    pub path: String,
    pub text: String,
}

/// Renders `plan` (all servers, or only `server`) in `format`.
pub fn render(plan: &Plan, format: Format, server: Option<u32>) -> Result<Vec<OutFile>> {
    let verified = plan
        .verify()
        .map_err(|e| Error::Internal(format!("the plan broke its own guarantee: {e}")))?;
    if let Some(s) = server
        && (s == 0 || s > plan.servers)
    {
        return Err(Error::InvalidUsage(format!(
            "--server {s}: the plan has servers 1..={}",
            plan.servers
        )));
    }
    let servers: Vec<u32> = match server {
        Some(s) => vec![s],
        None => (1..=plan.servers).collect(),
    };
    let files = match format {
        Format::Table => vec![OutFile {
            path: match server {
                Some(s) => format!("{}.txt", plan.file_stem(s)),
                None => "plan.txt".into(),
            },
            text: table(plan, &servers, &verified),
        }],
        Format::Json => {
            let (p, path) = match server {
                Some(s) => (
                    plan.only_server(s),
                    format!("plan-{}.json", plan.file_stem(s)),
                ),
                None => (plan.clone(), "plan.json".into()),
            };
            vec![OutFile {
                path,
                text: p.to_json()?,
            }]
        }
        Format::Ip => servers
            .iter()
            .flat_map(|&s| {
                [
                    OutFile {
                        path: format!("{}.sh", plan.file_stem(s)),
                        text: ip_apply(plan, s, &verified),
                    },
                    OutFile {
                        path: format!("{}-check.sh", plan.file_stem(s)),
                        text: ip_check(plan, s, &verified),
                    },
                ]
            })
            .collect(),
        Format::Netplan => servers
            .iter()
            .map(|&s| OutFile {
                path: format!("{}.yaml", plan.file_stem(s)),
                text: netplan(plan, s, &verified),
            })
            .collect(),
        Format::Networkd => servers
            .iter()
            .flat_map(|&s| networkd(plan, s, &verified))
            .collect(),
        Format::Order => vec![OutFile {
            path: "order.txt".into(),
            text: order(plan),
        }],
        Format::Sysctl => servers
            .iter()
            .map(|&s| OutFile {
                path: format!("{}.conf", plan.file_stem(s)),
                text: sysctl(plan, s, &verified),
            })
            .collect(),
    };
    Ok(files)
}

/// What goes to stdout without `--out`: one file as is, several each under a `# ==> PATH <==` line.
pub fn to_stdout(files: &[OutFile]) -> String {
    if let [one] = files {
        return one.text.clone();
    }
    let mut out = String::new();
    for (i, f) in files.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "# ==> {} <==", f.path);
        out.push_str(&f.text);
    }
    out
}

/// The links of `server`, in port and function order.
fn sorted_links(plan: &Plan, server: u32) -> Vec<&Link> {
    let mut v: Vec<&Link> = plan.links_of(server).collect();
    v.sort_by_key(|l| {
        let port = l.side(server).map(|(me, _)| me.port).unwrap_or(0);
        (port, l.function)
    });
    v
}

fn header_lines(plan: &Plan, verified: &Verified) -> Vec<String> {
    let cables: std::collections::BTreeSet<(u32, u32)> = plan
        .links
        .iter()
        .map(|l| (l.ends[0].server, l.ends[0].port))
        .collect();
    vec![
        format!(
            "switchless plan: model {} ({}, up to {} each), {}, {}, {}",
            plan.model.name,
            count(plan.model.ports.len(), "port"),
            count(plan.model.max_functions() as usize, "interface"),
            count(plan.servers as usize, "server"),
            count(cables.len(), "cable"),
            count(plan.links.len(), "link")
        ),
        format!(
            "addressing: one /{} per link from {}; the lower-numbered server holds the lower address; MTU {} bytes",
            plan.prefix, plan.base, plan.mtu
        ),
        verified.sentence(plan.prefix),
    ]
    .into_iter()
    .chain((!plan.names.is_empty()).then(|| {
        format!(
            "servers: {}",
            plan.names
                .iter()
                .map(|(n, h)| format!("{n} = {h}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }))
    .collect()
}

fn table(plan: &Plan, servers: &[u32], verified: &Verified) -> String {
    let mut out = String::new();
    for l in header_lines(plan, verified) {
        let _ = writeln!(out, "{l}");
    }
    for &s in servers {
        let links = sorted_links(plan, s);
        let _ = writeln!(out, "\n{}: {}", plan.label(s), count(links.len(), "link"));
        if links.is_empty() {
            continue;
        }
        let rows: Vec<[String; 7]> = links
            .iter()
            .filter_map(|l| {
                let (me, peer) = l.side(s)?;
                Some([
                    me.port.to_string(),
                    me.interface.clone(),
                    me.address.to_string(),
                    format!("{} port {}", plan.label(peer.server), peer.port),
                    peer.interface.clone(),
                    peer.address.addr().to_string(),
                    format!("{} (link {}, line {})", l.subnet, l.id, l.line),
                ])
            })
            .collect();
        let head = [
            "port",
            "interface",
            "address",
            "peer",
            "peer interface",
            "peer address",
            "subnet",
        ];
        let mut widths = head.map(str::len);
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r.iter()) {
                *w = (*w).max(c.len());
            }
        }
        let line = |cells: &[&str]| {
            let mut t = String::from(" ");
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    let _ = write!(t, " {c}");
                } else {
                    let _ = write!(t, " {c:<w$}", w = widths[i]);
                }
            }
            t.push('\n');
            t
        };
        out.push_str(&line(&head));
        for r in &rows {
            let cells: Vec<&str> = r.iter().map(String::as_str).collect();
            out.push_str(&line(&cells));
        }
    }
    out
}

/// The apply script of server `s`: checks that every planned interface exists, then brings each up
/// with the plan's MTU and makes its planned address its only IPv4 address. Running it twice changes
/// nothing the second time.
fn ip_apply(plan: &Plan, s: u32, verified: &Verified) -> String {
    let links = sorted_links(plan, s);
    let sides: Vec<_> = links.iter().filter_map(|l| l.side(s)).collect();
    let stem = plan.file_stem(s);
    let label = plan.label(s);
    let mut out = String::new();
    let _ = writeln!(out, "#!/usr/bin/env bash");
    let _ = writeln!(
        out,
        "# switchless plan for {label}: run {stem}.sh as root there, then {stem}-check.sh once every server is done."
    );
    for l in header_lines(plan, verified) {
        let _ = writeln!(out, "# {l}");
    }
    let _ = writeln!(
        out,
        "# Not persistent (--format netplan or networkd is). A second run changes nothing."
    );
    let _ = writeln!(out, "set -euo pipefail");
    if let Some(name) = plan.name_of(s) {
        // A plan names its hosts: refuse to configure the wrong one by mistake.
        let _ = writeln!(
            out,
            "if [ \"${{SWITCHLESS_PLAN_ANY_HOST:-0}}\" != 1 ] && [ \"$(hostname -s)\" != {name} ] && [ \"$(hostname)\" != {name} ]; then"
        );
        let _ = writeln!(
            out,
            "  echo \"{stem}.sh: this host is $(hostname), not {name}, the plan's server {s}; SWITCHLESS_PLAN_ANY_HOST=1 runs it anyway\" >&2"
        );
        let _ = writeln!(out, "  exit 2");
        let _ = writeln!(out, "fi");
    }
    let names: Vec<&str> = sides.iter().map(|(me, _)| me.interface.as_str()).collect();
    let _ = writeln!(
        out,
        "# --- every planned interface must exist before anything changes ---"
    );
    let _ = writeln!(out, "missing=\"\"");
    let _ = writeln!(out, "for i in {}; do", names.join(" "));
    let _ = writeln!(
        out,
        "  ip link show dev \"$i\" > /dev/null 2>&1 || missing=\"$missing $i\""
    );
    let _ = writeln!(out, "done");
    let _ = writeln!(
        out,
        "[ -z \"$missing\" ] || {{ echo \"{stem}.sh: no such interface:$missing (is this {label}? is the NIC in Ethernet mode?)\" >&2; exit 2; }}"
    );
    let _ = writeln!(
        out,
        "# only_address IF ADDR: ADDR becomes the only IPv4 address of IF (IPv6 link-local stays)."
    );
    let _ = writeln!(out, "only_address() {{");
    let _ = writeln!(
        out,
        "  if [ \"$(ip -4 -o addr show dev \"$1\" | awk '{{print $4}}')\" != \"$2\" ]; then"
    );
    let _ = writeln!(out, "    ip -4 addr flush dev \"$1\"");
    let _ = writeln!(out, "    ip addr add \"$2\" dev \"$1\"");
    let _ = writeln!(out, "  fi");
    let _ = writeln!(out, "}}");
    let _ = writeln!(out, "# --- link up, MTU {} bytes ---", plan.mtu);
    for (me, _) in &sides {
        let _ = writeln!(out, "ip link set dev {} up mtu {}", me.interface, plan.mtu);
    }
    let _ = writeln!(
        out,
        "# --- ARP: each interface answers only for its own address (a GB10 port's two functions share a wire); no IPv6 temporary addresses ---"
    );
    for (me, _) in &sides {
        let _ = writeln!(
            out,
            "sysctl -qw {}",
            sysctl_settings(&me.interface).join(" ")
        );
    }
    let _ = writeln!(out, "# --- addresses ---");
    for (me, peer) in &sides {
        let _ = writeln!(
            out,
            "only_address {} {}  # port {} -> {} port {} {}",
            me.interface,
            me.address,
            me.port,
            plan.label(peer.server),
            peer.port,
            peer.interface
        );
    }
    let _ = writeln!(
        out,
        "echo \"{stem}.sh: {} configured; run {stem}-check.sh once every server is done\"",
        count(sides.len(), "interface")
    );
    out
}

/// The check script of server `s`: every planned peer answers a ping, and a full-MTU ping with
/// don't-fragment. Counts failures and exits 1 when any; `PING_COUNT` (default 3) packets per check.
fn ip_check(plan: &Plan, s: u32, verified: &Verified) -> String {
    let links = sorted_links(plan, s);
    let sides: Vec<_> = links.iter().filter_map(|l| l.side(s)).collect();
    let stem = plan.file_stem(s);
    let mut out = String::new();
    let _ = writeln!(out, "#!/usr/bin/env bash");
    let _ = writeln!(
        out,
        "# switchless plan checks for {}: run there once every server has applied its part.",
        plan.label(s)
    );
    for l in header_lines(plan, verified) {
        let _ = writeln!(out, "# {l}");
    }
    // Failures are counted, not fatal: every check runs and the summary says how many failed.
    let _ = writeln!(out, "set -uo pipefail");
    let _ = writeln!(out, "count=${{PING_COUNT:-3}}");
    let _ = writeln!(out, "failed=0");
    let _ = writeln!(out, "check() {{");
    let _ = writeln!(
        out,
        "  if \"$@\" > /dev/null 2>&1; then echo \"ok   $*\"; else echo \"FAIL $*\"; failed=$((failed + 1)); fi"
    );
    let _ = writeln!(out, "}}");
    // IPv4 (20 bytes) + ICMP (8 bytes) headers: the largest payload that fits the MTU unfragmented.
    let payload = plan.mtu.saturating_sub(28);
    let _ = writeln!(
        out,
        "# --- reachability, then {} bytes with don't-fragment ---",
        plan.mtu
    );
    for (me, peer) in &sides {
        let _ = writeln!(
            out,
            "check ping -I {} -c \"$count\" -W 1 {}",
            me.interface,
            peer.address.addr()
        );
        let _ = writeln!(
            out,
            "check ping -I {} -c \"$count\" -W 1 -M \"do\" -s {payload} {}",
            me.interface,
            peer.address.addr()
        );
    }
    let total = sides.len() * 2;
    let _ = writeln!(out, "if [ \"$failed\" -gt 0 ]; then");
    let _ = writeln!(
        out,
        "  echo \"{stem}-check.sh: $failed of {total} checks failed (has every peer applied its part? is each cable in its planned port?)\""
    );
    let _ = writeln!(out, "  exit 1");
    let _ = writeln!(out, "fi");
    let _ = writeln!(out, "echo \"{stem}-check.sh: all {total} checks passed\"");
    out
}

fn netplan(plan: &Plan, s: u32, verified: &Verified) -> String {
    let links = sorted_links(plan, s);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# switchless plan for {}: install as /etc/netplan/99-switchless.yaml (mode 600), then `netplan apply`.",
        plan.label(s)
    );
    let _ = writeln!(
        out,
        "# Only these interfaces, each with its own renderer: the host's global renderer (NetworkManager or networkd) stays;"
    );
    let _ = writeln!(
        out,
        "# 99- sorts after the distribution's files (00-installer-config, 01-network-manager-all, 50-cloud-init, 90-NM-*)."
    );
    let _ = writeln!(
        out,
        "# ARP and IPv6 settings (netplan has no key for them): also install `switchless plan ... --format sysctl`."
    );
    for l in header_lines(plan, verified) {
        let _ = writeln!(out, "# {l}");
    }
    let _ = writeln!(out, "network:");
    let _ = writeln!(out, "  version: 2");
    if links.is_empty() {
        let _ = writeln!(out, "  ethernets: {{}}");
        return out;
    }
    let _ = writeln!(out, "  ethernets:");
    for l in links {
        let Some((me, peer)) = l.side(s) else {
            continue;
        };
        let _ = writeln!(
            out,
            "    # port {}, link {} ({}): {} port {} {} {}",
            me.port,
            l.id,
            l.subnet,
            plan.label(peer.server),
            peer.port,
            peer.interface,
            peer.address.addr()
        );
        let _ = writeln!(out, "    {}:", yaml_key(&me.interface));
        let _ = writeln!(out, "      renderer: networkd");
        let _ = writeln!(out, "      dhcp4: false");
        let _ = writeln!(out, "      dhcp6: false");
        let _ = writeln!(out, "      optional: true");
        let _ = writeln!(out, "      mtu: {}", plan.mtu);
        let _ = writeln!(out, "      addresses:");
        let _ = writeln!(out, "        - {}", me.address);
    }
    out
}

/// The sysctl settings of one planned interface: ARP answered and announced only for its own
/// address, and no IPv6 temporary (privacy) addresses, which come and go and shift the RoCE GID
/// table's indices.
fn sysctl_settings(ifname: &str) -> [String; 3] {
    [
        format!("net.ipv4.conf.{ifname}.arp_ignore=1"),
        format!("net.ipv4.conf.{ifname}.arp_announce=2"),
        format!("net.ipv6.conf.{ifname}.use_tempaddr=0"),
    ]
}

/// The sysctl.d file of server `s` (applied at boot, and by systemd for each interface as it
/// appears).
fn sysctl(plan: &Plan, s: u32, verified: &Verified) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# switchless plan for {}: install as /etc/sysctl.d/90-switchless.conf (mode 644), then `sysctl --system`.",
        plan.label(s)
    );
    let _ = writeln!(
        out,
        "# arp_ignore=1, arp_announce=2: an interface answers ARP only for its own address, so a peer never learns"
    );
    let _ = writeln!(
        out,
        "# the MAC of the other PCIe function on the same wire; use_tempaddr=0: no IPv6 privacy addresses in the GID table."
    );
    for l in header_lines(plan, verified) {
        let _ = writeln!(out, "# {l}");
    }
    for l in sorted_links(plan, s) {
        let Some((me, _)) = l.side(s) else { continue };
        for kv in sysctl_settings(&me.interface) {
            let (k, v) = kv.split_once('=').unwrap_or((&kv, ""));
            let _ = writeln!(out, "{k} = {v}");
        }
    }
    out
}

/// An interface name as a YAML mapping key: plain when YAML reads it back as that string, quoted otherwise
/// (names like `0`, `1e3`, `true`, `null`, `no`, `.inf`).
fn yaml_key(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let special = matches!(
        lower.as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n" | "null" | "~"
    );
    let starts_with_letter = name.starts_with(|c: char| c.is_ascii_alphabetic());
    if special || !starts_with_letter {
        format!("\"{name}\"")
    } else {
        name.to_string()
    }
}

fn networkd(plan: &Plan, s: u32, verified: &Verified) -> Vec<OutFile> {
    sorted_links(plan, s)
        .into_iter()
        .filter_map(|l| {
            let (me, peer) = l.side(s)?;
            let mut t = String::new();
            let _ = writeln!(
                t,
                "# switchless plan for {}: install in /etc/systemd/network/, then `networkctl reload`.",
                plan.label(s)
            );
            let _ = writeln!(
                t,
                "# networkd uses the first file (by name) that matches an interface: 05- sorts before netplan's 10-netplan-*"
            );
            let _ = writeln!(
                t,
                "# and the distribution's catch-alls (80-*, 89-*, 99-*), so this one wins, for {} only.",
                me.interface
            );
            let _ = writeln!(
                t,
                "# networkd only runs when enabled (systemctl enable --now systemd-networkd), and NetworkManager must leave"
            );
            let _ = writeln!(
                t,
                "# this interface alone (nmcli device set {} managed no; persist it in NetworkManager.conf); see --format netplan.",
                me.interface
            );
            let _ = writeln!(
                t,
                "# ARP and IPv6 settings (networkd has no key for them): also install `switchless plan ... --format sysctl`."
            );
            for h in header_lines(plan, verified) {
                let _ = writeln!(t, "# {h}");
            }
            let _ = writeln!(
                t,
                "# port {}, link {} ({}): {} port {} {} {}",
                me.port,
                l.id,
                l.subnet,
                plan.label(peer.server),
                peer.port,
                peer.interface,
                peer.address.addr()
            );
            let _ = writeln!(t, "[Match]\nName={}\n", me.interface);
            let _ = writeln!(t, "[Link]\nMTUBytes={}\nRequiredForOnline=no\n", plan.mtu);
            let _ = writeln!(t, "[Network]\nDHCP=no\nAddress={}", me.address);
            Some(OutFile {
                path: format!("{}/05-switchless-{}.network", plan.file_stem(s), me.interface),
                text: t,
            })
        })
        .collect()
}

/// Cables between each pair of servers (index = server − 1): a cable is one port pair, whatever the
/// number of its functions.
pub fn cable_matrix(plan: &Plan) -> Vec<Vec<f64>> {
    let n = plan.servers as usize;
    let mut m = vec![vec![0.0; n]; n];
    let mut seen = std::collections::BTreeSet::new();
    for l in &plan.links {
        let [a, b] = &l.ends;
        if !seen.insert((a.server, a.port, b.server, b.port)) {
            continue;
        }
        let (i, j) = (a.server as usize - 1, b.server as usize - 1);
        if i < n && j < n && i != j {
            m[i][j] += 1.0;
            m[j][i] += 1.0;
        }
    }
    m
}

/// `--format order`: the host order for NCCL's ring (`crate::tuner::order`).
fn order(plan: &Plan) -> String {
    let r = crate::tuner::order::best_ring(&cable_matrix(plan));
    // Host names where the cables file names them (what launchers take), else server numbers.
    let label = |i: &usize| {
        let n = *i as u32 + 1;
        plan.name_of(n).map_or_else(|| n.to_string(), str::to_owned)
    };
    let names: Vec<String> = r.order.iter().map(label).collect();
    let mut s = format!("{}\n", names.join(","));
    s.push_str(
        "# NCCL numbers hosts by their first rank and its ring sends host n's bytes to host n+1 only, so the\n\
         # thinnest cable bundle between consecutive hosts is the ring's busbw: launch the ranks in this order.\n",
    );
    if r.bottleneck <= 0.0 {
        s.push_str(
            "# no order visits every server over cables: the ring needs a relay or TCP fallback\n",
        );
    } else if r.all_equal() {
        s.push_str(&format!(
            "# every order gives the ring {} cable(s) per step: any order is as good (given order kept)\n",
            r.bottleneck
        ));
    } else {
        let given = if r.given > 0.0 {
            format!("{} cable(s), ×{:.2}", r.given, r.gain())
        } else {
            "a step with no cable".to_owned()
        };
        s.push_str(&format!(
            "# thinnest step: {} cable(s) (servers in file order: {given}){}\n",
            r.bottleneck,
            if r.exhaustive {
                ""
            } else {
                "; found by local search"
            }
        ));
    }
    s
}
