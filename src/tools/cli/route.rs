//! `switchless route`: which links a connection to a peer would use, and why — the plugin's own
//! routing code (`route::select`) run on two hosts' kernel files.

use std::path::PathBuf;
use std::process::ExitCode;

use ipnet::Ipv4Net;

use crate::host;
use crate::route::handle::advertised;
use crate::route::types::{LinkKind, RemoteLink};
use crate::route::{KindFilter, Reach, RouteOptions, render_text, select};

/// Path kinds, as `--kinds` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kinds {
    /// RoCE on both ends (the verbs transport).
    Roce,
    /// Any IPv4 pair, carried as TCP.
    Tcp,
    /// Everything; RoCE where both ends are RoCE.
    Any,
}

#[derive(Debug, clap::Args)]
#[command(
    group(clap::ArgGroup::new("the_peer").required(true).args(["peer_root", "peer"])),
    after_help = "Examples:\n  \
switchless route --peer-root peer-capture/                   # a tree captured on the peer (doctor --capture)\n  \
switchless route --peer 10.100.0.2/30,10.100.0.6/30          # the peer's link addresses, with their prefix\n\
Give the peer one way: --peer-root or --peer.\n\
Exit status: 0 a route was found; 1 no path reaches the peer (the message says why) or the peer's tree could \
not be read; 2 a usage error."
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
    /// The NCCL device NCCL would pass to connect (a locality hint).
    #[arg(long)]
    pub dev: Option<usize>,
    /// Which path kinds the transport can use.
    #[arg(long, value_enum, default_value = "any")]
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

pub fn run(args: Args) -> ExitCode {
    let (model, _) = host::discover(&args.root);
    let devices = model.nccl_devices(&|_, _| true, &|_| false);
    let local = model.local_links(&devices);
    let routes = model.routes();
    let peer: Vec<RemoteLink> = match &args.peer_root {
        Some(p) => {
            let (pm, _) = host::discover(p);
            let pd = pm.nccl_devices(&|_, _| true, &|_| false);
            match advertised(&pm.local_links(&pd)) {
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
    let opts = RouteOptions {
        nccl_dev: args.dev,
        kinds: match args.kinds {
            Kinds::Roce => KindFilter::Roce,
            Kinds::Tcp => KindFilter::Tcp,
            Kinds::Any => KindFilter::Any,
        },
        max_paths: args.max_paths,
        reach: if args.routed {
            Reach::Routed
        } else {
            Reach::OnLink
        },
    };
    match select(&local, &routes, &peer, &opts) {
        Ok(sel) => {
            if args.json {
                let v = serde_json::json!({ "peer": peer, "selection": sel });
                match serde_json::to_string_pretty(&v) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(false, &format!("encoding JSON: {e}")),
                }
            } else {
                print!("{}", render_text(&sel, &peer));
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(args.json, &e.to_string()),
    }
}

fn fail(json: bool, msg: &str) -> ExitCode {
    if json {
        println!("{}", serde_json::json!({ "error": msg }));
    } else {
        eprintln!("switchless route: {msg}");
    }
    ExitCode::from(1)
}
