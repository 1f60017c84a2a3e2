//! `switchless route`: which links a connection to a peer would use, and why — the plugin's own
//! routing code (`route::select`) run on two hosts' kernel files. By default it decides as the
//! plugin's `connect` does in this shell's environment (`NCCL_SWITCHLESS_TRANSPORT`,
//! `NCCL_SWITCHLESS_TCP_FALLBACK`, `NCCL_IB_HCA`); `--kinds` asks for one kind of path instead.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use ipnet::Ipv4Net;

use crate::config::{Config, TransportMode};
use crate::host::{self, HostModel, NcclDevice};
use crate::route::handle::advertised;
use crate::route::select::Selection;
use crate::route::types::{LinkKind, LocalLink, RemoteLink};
use crate::route::{KindFilter, Reach, RouteOptions, select};
use crate::tools::units;

/// Path kinds, as `--kinds` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kinds {
    /// What the plugin does in this shell's environment: RoCE where both ends have it, else TCP on
    /// point-to-point (/30, /31) links; wider subnets only with NCCL_SWITCHLESS_TCP_FALLBACK=1.
    Plugin,
    /// RoCE on both ends (the verbs transport).
    Roce,
    /// Any IPv4 pair, carried as TCP.
    Tcp,
    /// Every pair, management LANs too; RoCE where both ends are RoCE.
    Any,
}

#[derive(Debug, clap::Args)]
#[command(
    group(clap::ArgGroup::new("the_peer").required(true).args(["peer_root", "peer"])),
    after_help = "Examples:\n  \
switchless route --peer-root peer-capture/                   # a tree captured on the peer (doctor --capture)\n  \
switchless route --peer 10.100.0.2/30,10.100.0.6/30          # the peer's link addresses, with their prefix\n  \
switchless route --peer-root peer/ --dev sl_enp1s0f1np1      # as for NCCL's device of that name (or its index)\n\
Give the peer one way: --peer-root or --peer. By default the paths are the plugin's in this shell's \
environment (NCCL_SWITCHLESS_TRANSPORT, NCCL_SWITCHLESS_TCP_FALLBACK, NCCL_IB_HCA); links it would not \
use are listed under \"not used\" with the reason.\n\
Exit status: 0 a route was found; 1 no path reaches the peer (the message says why) or the peer's tree could \
not be read; 2 a usage error or an environment the plugin would refuse."
)]
pub struct Args {
    /// Read this host's kernel files under this directory instead of /.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// The peer's kernel files (a tree captured on the peer with `switchless doctor --capture`).
    #[arg(long, conflicts_with = "peer")]
    pub peer_root: Option<PathBuf>,
    /// The peer's link addresses instead of its tree, comma-separated, e.g. 10.0.0.2/30,10.0.1.2/30
    /// (taken as RoCE links).
    #[arg(long, value_delimiter = ',', value_parser = parse_peer)]
    pub peer: Vec<Ipv4Net>,
    /// The NCCL device NCCL would pass to connect (a locality hint): its index, or its name as
    /// `switchless doctor` prints it (e.g. sl_enp1s0f1np1).
    #[arg(long, value_name = "INDEX|NAME")]
    pub dev: Option<String>,
    /// Which path kinds to consider: the plugin's choice (default), or one kind.
    #[arg(long, value_enum, default_value = "plugin")]
    pub kinds: Kinds,
    /// Also paths the kernel routes through a gateway (a forwarding neighbour, the default route),
    /// as NCCL_SWITCHLESS_TCP_FALLBACK=1 does: TCP only.
    #[arg(long)]
    pub routed: bool,
    /// At most this many paths.
    #[arg(long, default_value_t = crate::route::select::DEFAULT_MAX_PATHS)]
    pub max_paths: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One `--peer` entry: an address with its prefix length.
fn parse_peer(s: &str) -> Result<Ipv4Net, String> {
    s.trim().parse().map_err(|_| {
        if s.trim().parse::<std::net::Ipv4Addr>().is_ok() {
            format!("{s} has no prefix length; write ADDRESS/PREFIX as the peer's interface holds it, e.g. {s}/30")
        } else {
            format!("{s} is not ADDRESS/PREFIX; expected e.g. 10.100.0.2/30")
        }
    })
}

/// The links and NCCL devices the plugin's init would build on `model` with `cfg`: the RoCE ports
/// that pass `NCCL_IB_HCA` (unless TCP is forced), else every address as a TCP link with one device
/// per point-to-point netdev (`plugin::factory::net::tcp_host`).
pub fn plugin_links(model: &HostModel, cfg: &Config) -> (Vec<LocalLink>, Vec<NcclDevice>) {
    if cfg.transport != TransportMode::Tcp {
        let devices = model.nccl_devices(&|d, p| cfg.ib_hca.matches(d, p), &|_| false);
        if !devices.is_empty() {
            return (model.local_links(&devices), devices);
        }
    }
    crate::plugin::factory::net::tcp_host(model)
}

/// NCCL's device by `--dev`: an index, or a device name.
fn pick_dev(arg: &str, devices: &[NcclDevice]) -> Result<usize, String> {
    if let Ok(i) = arg.trim().parse::<usize>() {
        return Ok(i);
    }
    devices
        .iter()
        .find(|d| d.name == arg.trim())
        .map(|d| d.index)
        .ok_or_else(|| {
            let names: Vec<String> = devices
                .iter()
                .map(|d| format!("{} {}", d.index, d.name))
                .collect();
            format!(
                "--dev {arg}: no NCCL device of this host has that index or name; its devices are {}",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )
        })
}

/// The plugin's routing (`plugin::switchless::connect`), without the GPU-memory rules: `rdma` =
/// RoCE pairs; `tcp` = TCP on point-to-point links; `auto` = RoCE, else TCP on point-to-point links;
/// then, with the fallback, TCP over any shared subnet or kernel route.
fn plugin_select(
    links: &[LocalLink],
    model: &HostModel,
    peer: &[RemoteLink],
    cfg: &Config,
    fallback: bool,
    opts: &RouteOptions,
) -> crate::error::Result<Selection> {
    let routes = model.routes();
    let p2p: Vec<LocalLink> = links
        .iter()
        .filter(|l| crate::route::point_to_point(l.addr))
        .cloned()
        .collect();
    let with = |kinds| RouteOptions {
        kinds,
        reach: Reach::OnLink,
        ..*opts
    };
    let first = match cfg.transport {
        TransportMode::Rdma => select(links, &routes, peer, &with(KindFilter::Roce)),
        TransportMode::Tcp => select(&p2p, &routes, peer, &with(KindFilter::Tcp)),
        TransportMode::Auto => match select(links, &routes, peer, &with(KindFilter::Roce)) {
            Ok(s) => Ok(s),
            Err(e) if p2p.is_empty() => Err(e),
            Err(_) => select(&p2p, &routes, peer, &with(KindFilter::Tcp)),
        },
    };
    match first {
        Ok(s) => Ok(s),
        Err(e) if !fallback => Err(e),
        Err(_) => select(
            links,
            &routes,
            peer,
            &RouteOptions {
                reach: Reach::Routed,
                ..with(KindFilter::Tcp)
            },
        ),
    }
}

/// Links that reach the peer on-link but that the plugin leaves out (a management LAN), with why.
fn unused_wide(
    links: &[LocalLink],
    peer: &[RemoteLink],
    sel: &Selection,
    fallback: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for l in links {
        if sel.paths.iter().any(|p| p.local.id == l.id)
            || crate::route::point_to_point(l.addr)
            || l.kind == LinkKind::Roce
        {
            continue;
        }
        for r in peer.iter().filter(|r| l.addr.contains(&r.addr.addr())) {
            out.push(format!(
                "{} {} -> {}: a /{} subnet is not a data path: the plugin carries data on RoCE ports and on /30 or \
                 /31 cables only{}",
                l.netdev,
                l.addr,
                r.addr.addr(),
                l.addr.prefix_len(),
                if fallback {
                    ""
                } else {
                    " (NCCL_SWITCHLESS_TCP_FALLBACK=1 uses it when no cable reaches the peer)"
                }
            ));
        }
    }
    out
}

/// One path as text: the netdev MTU for TCP (RoCE adds its active MTU).
fn path_text(p: &crate::route::select::PathChoice) -> String {
    let l = &p.local;
    let mut parts = Vec::new();
    if let (Some(d), Some(g)) = (&l.rdma_dev, l.gid_index) {
        parts.push(format!("{d} port {} GID {g}", l.port));
    }
    if let Some(d) = l.nccl_dev {
        parts.push(format!("NCCL dev {d}"));
    }
    if !l.pci_root.is_empty() {
        parts.push(format!("PCIe root {}", l.pci_root));
    }
    parts.push(match (p.kind, l.mtu) {
        (LinkKind::Roce, m) => format!("MTU {m} bytes, RoCE active MTU {} bytes", l.active_mtu),
        (LinkKind::Tcp, 0) => "MTU unknown".to_string(),
        (LinkKind::Tcp, m) => format!("MTU {m} bytes"),
    });
    format!(
        "{} {} ({}) -> {}{} ({})",
        l.netdev,
        l.addr,
        parts.join(", "),
        p.remote.addr.addr(),
        p.via.map_or(String::new(), |g| format!(" via {g}")),
        match p.kind {
            LinkKind::Roce => "RoCE",
            LinkKind::Tcp => "TCP",
        }
    )
}

fn render(sel: &Selection, peer: &[RemoteLink], how: &str, unused: &[String]) -> String {
    let mut out = String::new();
    let peer_addrs: Vec<String> = peer.iter().map(|r| r.addr.to_string()).collect();
    let _ = writeln!(
        out,
        "{} to the peer ({}), {how}:",
        units::count(sel.paths.len(), "path"),
        peer_addrs.join(", ")
    );
    for (i, p) in sel.paths.iter().enumerate() {
        let _ = writeln!(out, "  path {i}: {}\n          {}", path_text(p), p.reason);
    }
    if sel.same_host {
        let _ = writeln!(
            out,
            "the peer is this host: every path is a loopback to the link's own address"
        );
    }
    if let Some(o) = &sel.dev_override {
        let _ = writeln!(out, "NCCL device {} overridden: {}", o.requested, o.reason);
    }
    if !sel.skipped.is_empty() || !unused.is_empty() {
        let _ = writeln!(out, "not used:");
        for s in &sel.skipped {
            let _ = match s.remote {
                Some(r) => writeln!(out, "  {} -> {r}: {}", s.local, s.reason),
                None => writeln!(out, "  {}: {}", s.local, s.reason),
            };
        }
        for u in unused {
            let _ = writeln!(out, "  {u}");
        }
    }
    out
}

pub fn run(args: Args) -> ExitCode {
    let env = crate::tools::doctor::NcclEnv::from_process();
    let cfg = match Config::from_vars(|n| {
        env.get(n)
            .filter(|v| !v.trim().is_empty())
            .map(str::to_string)
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "switchless route: the plugin's init would refuse this environment: {e} (switchless doctor \
                 says the same per variable)"
            );
            return ExitCode::from(2);
        }
    };
    let (model, _) = host::discover(&args.root);
    let (local, devices) = match args.kinds {
        Kinds::Plugin => plugin_links(&model, &cfg),
        _ => {
            let devices = model.nccl_devices(&|_, _| true, &|_| false);
            (model.local_links(&devices), devices)
        }
    };
    let peer: Vec<RemoteLink> = match &args.peer_root {
        Some(p) => {
            let (pm, _) = host::discover(p);
            let pl = match args.kinds {
                Kinds::Plugin => plugin_links(&pm, &cfg).0,
                _ => pm.local_links(&pm.nccl_devices(&|_, _| true, &|_| false)),
            };
            match advertised(&pl) {
                Ok(v) => v,
                Err(e) => return fail(args.json, &format!("peer {}: {e}", p.display())),
            }
        }
        None => args
            .peer
            .iter()
            .map(|a| RemoteLink {
                addr: *a,
                phys_port_id: 0,
                pci_root_id: 0,
                kind: LinkKind::Roce,
            })
            .collect(),
    };
    let nccl_dev = match args.dev.as_deref().map(|d| pick_dev(d, &devices)) {
        None => None,
        Some(Ok(i)) => Some(i),
        Some(Err(e)) => {
            eprintln!("switchless route: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = RouteOptions {
        nccl_dev,
        kinds: match args.kinds {
            Kinds::Roce => KindFilter::Roce,
            Kinds::Tcp => KindFilter::Tcp,
            Kinds::Any | Kinds::Plugin => KindFilter::Any,
        },
        max_paths: args.max_paths,
        reach: if args.routed {
            Reach::Routed
        } else {
            Reach::OnLink
        },
    };
    let fallback = cfg.tcp_fallback || args.routed;
    let (result, how) = match args.kinds {
        Kinds::Plugin => (
            plugin_select(&local, &model, &peer, &cfg, fallback, &opts),
            format!(
                "as the plugin chooses (NCCL_SWITCHLESS_TRANSPORT={}, TCP fallback {})",
                cfg.transport.as_str(),
                if fallback { "on" } else { "off" }
            ),
        ),
        k => (
            select(&local, &model.routes(), &peer, &opts),
            format!(
                "{} pairs only (--kinds)",
                match k {
                    Kinds::Roce => "RoCE",
                    Kinds::Tcp => "TCP",
                    _ => "any",
                }
            ),
        ),
    };
    match result {
        Ok(sel) => {
            let unused = if args.kinds == Kinds::Plugin {
                unused_wide(&local, &peer, &sel, fallback)
            } else {
                Vec::new()
            };
            if args.json {
                let v = serde_json::json!({ "peer": peer, "selection": sel, "not_used": unused });
                match serde_json::to_string_pretty(&v) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(false, &format!("encoding JSON: {e}")),
                }
            } else {
                print!("{}", render(&sel, &peer, &how, &unused));
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(args.json, &e.to_string()),
    }
}

/// An error on stderr (JSON on stdout with `--json`): one clause per line, so a long "why" with
/// every local link reads as a list.
fn fail(json: bool, msg: &str) -> ExitCode {
    if json {
        println!("{}", serde_json::json!({ "error": msg }));
    } else {
        eprintln!("switchless route: {}", readable(msg));
    }
    ExitCode::from(1)
}

/// A routing error as lines: its clauses (`; `) one per line, and a list of local subnets one
/// subnet per line.
fn readable(msg: &str) -> String {
    let msg = msg.strip_prefix("invalid configuration: ").unwrap_or(msg);
    let mut out = Vec::new();
    for clause in msg.split("; ") {
        match clause.split_once("local subnets: ") {
            Some((head, list)) => {
                let (list, tail) = list.split_once(". ").unwrap_or((list, ""));
                out.push(format!("{head}local subnets:"));
                let items: Vec<&str> = list.split("), ").collect();
                let n = items.len();
                out.extend(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, s)| format!("    {s}{}", if i + 1 < n { ")" } else { "" })),
                );
                if !tail.is_empty() {
                    out.push(tail.to_string());
                }
            }
            None => out.push(clause.to_string()),
        }
    }
    out.join("\n  ")
}
