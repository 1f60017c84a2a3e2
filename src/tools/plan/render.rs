//! The outputs of a plan: a human table, JSON, `ip` commands, netplan YAML and systemd-networkd files.
//!
//! Every renderer verifies the plan first and states the guarantee it proved in its output.
#![forbid(unsafe_code)]

use std::fmt::Write as _;

use super::{Link, Plan, Verified};
use crate::error::{Error, Result};

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table per server (the default).
    Table,
    /// The whole plan as JSON (schema_version 1).
    Json,
    /// `ip` commands per server: link up with the MTU, flush, add, then ping checks.
    Ip,
    /// One netplan YAML file per server (persists across reboots).
    Netplan,
    /// systemd-networkd `.network` files, one per interface, per server.
    Networkd,
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
                Some(s) => format!("server{s}.txt"),
                None => "plan.txt".into(),
            },
            text: table(plan, &servers, &verified),
        }],
        Format::Json => {
            let (p, path) = match server {
                Some(s) => (plan.only_server(s), format!("plan-server{s}.json")),
                None => (plan.clone(), "plan.json".into()),
            };
            vec![OutFile {
                path,
                text: p.to_json()?,
            }]
        }
        Format::Ip => servers
            .iter()
            .map(|&s| OutFile {
                path: format!("server{s}.sh"),
                text: ip_commands(plan, s, &verified),
            })
            .collect(),
        Format::Netplan => servers
            .iter()
            .map(|&s| OutFile {
                path: format!("server{s}.yaml"),
                text: netplan(plan, s, &verified),
            })
            .collect(),
        Format::Networkd => servers
            .iter()
            .flat_map(|&s| networkd(plan, s, &verified))
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
            "switchless plan: model {} ({} ports, up to {} interfaces each), {} servers, {} cables, {} links",
            plan.model.name,
            plan.model.ports.len(),
            plan.model.max_functions(),
            plan.servers,
            cables.len(),
            plan.links.len()
        ),
        format!(
            "addressing: one /{} per link from {}; the lower-numbered server holds the lower address; MTU {} bytes",
            plan.prefix, plan.base, plan.mtu
        ),
        verified.sentence(plan.prefix),
    ]
}

fn table(plan: &Plan, servers: &[u32], verified: &Verified) -> String {
    let mut out = String::new();
    for l in header_lines(plan, verified) {
        let _ = writeln!(out, "{l}");
    }
    for &s in servers {
        let links = sorted_links(plan, s);
        let _ = writeln!(out, "\nserver {s}: {} links", links.len());
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
                    format!("server {} port {}", peer.server, peer.port),
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

fn ip_commands(plan: &Plan, s: u32, verified: &Verified) -> String {
    let links = sorted_links(plan, s);
    let mut out = String::new();
    let _ = writeln!(out, "## ===== server {s} =====");
    for l in header_lines(plan, verified) {
        let _ = writeln!(out, "# {l}");
    }
    let _ = writeln!(
        out,
        "# Not persistent: use --format netplan or networkd to keep this across reboots."
    );
    let sides: Vec<_> = links.iter().filter_map(|l| l.side(s)).collect();
    let _ = writeln!(out, "# --- link up, MTU {} bytes ---", plan.mtu);
    for (me, _) in &sides {
        let _ = writeln!(out, "ip link set dev {} up mtu {}", me.interface, plan.mtu);
    }
    let _ = writeln!(
        out,
        "# --- flush old IPv4 addresses (IPv6 link-local stays) ---"
    );
    for (me, _) in &sides {
        let _ = writeln!(out, "ip -4 addr flush dev {}", me.interface);
    }
    let _ = writeln!(out, "# --- add addresses ---");
    for (me, peer) in &sides {
        let _ = writeln!(
            out,
            "ip addr add {} dev {}  # port {} -> server {} port {} {}",
            me.address, me.interface, me.port, peer.server, peer.port, peer.interface
        );
    }
    // IPv4 (20 bytes) + ICMP (8 bytes) headers: the largest payload that fits the MTU unfragmented.
    let payload = plan.mtu.saturating_sub(28);
    let _ = writeln!(
        out,
        "# --- checks, once every server is configured: reachability, then {} bytes with don't-fragment ---",
        plan.mtu
    );
    for (me, peer) in &sides {
        let _ = writeln!(
            out,
            "ping -I {} -c 3 -W 1 {}",
            me.interface,
            peer.address.addr()
        );
        let _ = writeln!(
            out,
            "ping -I {} -c 3 -W 1 -M do -s {payload} {}",
            me.interface,
            peer.address.addr()
        );
    }
    out
}

fn netplan(plan: &Plan, s: u32, verified: &Verified) -> String {
    let links = sorted_links(plan, s);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# switchless plan for server {s}: install as /etc/netplan/60-switchless.yaml (mode 600), then `netplan apply`."
    );
    for l in header_lines(plan, verified) {
        let _ = writeln!(out, "# {l}");
    }
    let _ = writeln!(out, "network:");
    let _ = writeln!(out, "  version: 2");
    let _ = writeln!(out, "  renderer: networkd");
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
            "    # port {}, link {} ({}): server {} port {} {} {}",
            me.port,
            l.id,
            l.subnet,
            peer.server,
            peer.port,
            peer.interface,
            peer.address.addr()
        );
        let _ = writeln!(out, "    {}:", yaml_key(&me.interface));
        let _ = writeln!(out, "      dhcp4: false");
        let _ = writeln!(out, "      dhcp6: false");
        let _ = writeln!(out, "      optional: true");
        let _ = writeln!(out, "      mtu: {}", plan.mtu);
        let _ = writeln!(out, "      addresses:");
        let _ = writeln!(out, "        - {}", me.address);
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
                "# switchless plan for server {s}: install in /etc/systemd/network/, then `networkctl reload`."
            );
            for h in header_lines(plan, verified) {
                let _ = writeln!(t, "# {h}");
            }
            let _ = writeln!(
                t,
                "# port {}, link {} ({}): server {} port {} {} {}",
                me.port,
                l.id,
                l.subnet,
                peer.server,
                peer.port,
                peer.interface,
                peer.address.addr()
            );
            let _ = writeln!(t, "[Match]\nName={}\n", me.interface);
            let _ = writeln!(t, "[Link]\nMTUBytes={}\nRequiredForOnline=no\n", plan.mtu);
            let _ = writeln!(t, "[Network]\nDHCP=no\nAddress={}", me.address);
            Some(OutFile {
                path: format!("server{s}/10-switchless-{}.network", me.interface),
                text: t,
            })
        })
        .collect()
}
