//! `switchless plan`: turn a cables file into a per-link IP plan (see `docs/guide/plan.md`).
#![forbid(unsafe_code)]

use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use ipnet::Ipv4Net;

use crate::error::{Error, Result};
use crate::tools::plan::render::{self, Format};
use crate::tools::plan::{self, Options, PortMap, cables};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
switchless plan cables.txt                                   # the table, every server\n  \
switchless plan cables.txt --format json > plan.json         # for doctor --plan\n  \
switchless plan cables.txt --model gb10 --format netplan --out netplan/\n\
Cables file lines: `SERVER-PORT > SERVER-PORT` (e.g. `1-1 > 2-1`, or by host name `b300-001-1 > b300-002-1`), \
`server N = HOSTNAME` to pin a name to a number, `model = gb10` for the model, `#` comments, several per line \
with commas.\n\
Outputs are named by host when the file names hosts (b300-001.sh, b300-001-check.sh, b300-001.yaml).\n\
Map file lines (custom --model FILE): `PORT = IFNAME [IFNAME...]`, optional `name = MODEL`.\n\
Exit status: 0 the plan was written (warnings go to stderr); 2 an error in the cables file, the map or an option.")]
pub struct Args {
    /// The cables file (`-` reads standard input).
    pub cables: PathBuf,
    /// Server model: `b300` (DGX B300, 8 ports × 2 interfaces), `gb10` (DGX Spark, 2 ports × 2 functions),
    /// or the path of a port map file. Default: the cables file's `model = NAME` line, else the only
    /// built-in model with the ports it uses, else GB10 for hosts named like `spark*`; otherwise it asks.
    #[arg(long)]
    pub model: Option<String>,
    /// Number of servers (default: the highest server the cables file names).
    #[arg(long)]
    pub servers: Option<u32>,
    /// The range the link subnets are taken from.
    #[arg(long, default_value = plan::DEFAULT_BASE, value_parser = parse_base)]
    pub base: Ipv4Net,
    /// Prefix length of each link: 30 (4 addresses per link) or 31 (2 per link, RFC 3021).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u8).range(30..=31))]
    pub prefix: u8,
    /// Interface MTU: bytes (1280..=9978), or with K (1024), e.g. 9000 or 9k (9216 bytes).
    #[arg(long, default_value = "9000", value_parser = parse_mtu)]
    pub mtu: u32,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Print only this server's part: its number, or its host name when the cables file names hosts.
    #[arg(long, value_name = "N|NAME")]
    pub server: Option<String>,
    /// Write files into this directory (one per server for ip/netplan, one per interface for networkd)
    /// instead of standard output.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn parse_mtu(s: &str) -> std::result::Result<u32, String> {
    let n = crate::config::values::cli_bytes(s)?;
    u32::try_from(n).map_err(|_| format!("{n} bytes is not an MTU; accepted: 1280..=9978 bytes"))
}

fn parse_base(s: &str) -> std::result::Result<Ipv4Net, String> {
    s.parse().map_err(|_| {
        format!(
            "`{s}` is not an IPv4 range; expected NETWORK/PREFIX, e.g. {}",
            plan::DEFAULT_BASE
        )
    })
}

pub fn run(args: Args) -> ExitCode {
    match execute(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A mistake in the cables file, the map or an option is no "invalid configuration".
            match e {
                Error::InvalidUsage(m) => eprintln!("switchless plan: {m}"),
                e => eprintln!("switchless plan: {e}"),
            }
            ExitCode::from(2)
        }
    }
}

/// The model of a plan: `--model`, else the cables file's `model =` line, else what the file's ports
/// and host names leave: a port above 2 fits only the B300, hosts named `spark*`/`gb10*` are GB10s.
/// Anything else is ambiguous (both built-in models have ports 1 and 2): an error asking for it.
/// Returns the model and, when inferred, a note saying why.
fn resolve_model(arg: Option<&str>, source: &str, text: &str) -> Result<(PortMap, Option<String>)> {
    if let Some(m) = arg {
        return Ok((PortMap::load(m)?, None));
    }
    if let Some((line, m)) = cables::declared_model(text) {
        // A map file named in the cables file is found next to it.
        let dir = std::path::Path::new(source)
            .parent()
            .filter(|_| source != "<stdin>");
        let path = match dir {
            Some(d)
                if PortMap::builtin(&m).is_none() && !std::path::Path::new(&m).is_absolute() =>
            {
                d.join(&m).display().to_string()
            }
            _ => m.clone(),
        };
        let map = PortMap::load(&path)
            .map_err(|e| Error::InvalidUsage(format!("{source}:{line}: model = {m}: {e}")))?;
        return Ok((map, None));
    }
    let (max_port, names) = cables::hardware_hints(text);
    let b300_ports = PortMap::b300().max_port();
    let gb10_ports = PortMap::gb10().max_port();
    if max_port > gb10_ports && max_port <= b300_ports {
        return Ok((
            PortMap::b300(),
            Some(format!(
                "model b300 (DGX B300): the cables file uses port {max_port}, which only the b300 map has; \
                 --model chooses another"
            )),
        ));
    }
    let spark = names.iter().find(|n| {
        let n = n.to_ascii_lowercase();
        n.contains("spark") || n.contains("gb10")
    });
    if let (Some(n), true) = (spark, max_port <= gb10_ports) {
        return Ok((
            PortMap::gb10(),
            Some(format!(
                "model gb10 (DGX Spark): the cables file names host {n} and uses ports 1-{gb10_ports} only; \
                 --model chooses another"
            )),
        ));
    }
    Err(Error::InvalidUsage(format!(
        "{source}: which server model? The file uses ports up to {max_port}, which {}; give --model gb10 \
         (DGX Spark / GB10: 2 QSFP ports, 2 PCIe functions each), --model b300 (DGX B300: 8 OSFP ports, 2 \
         halves each) or --model FILE (a port map), or add a line `model = gb10` to the cables file",
        if max_port > b300_ports {
            "no built-in model has"
        } else {
            "both built-in models have"
        }
    )))
}

fn execute(args: &Args) -> Result<()> {
    let (name, text) = if args.cables.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Error::io("reading the cables file from standard input", e))?;
        ("<stdin>".to_string(), s)
    } else {
        let name = args.cables.display().to_string();
        let text = std::fs::read_to_string(&args.cables)
            .map_err(|e| Error::InvalidUsage(format!("cannot read the cables file {name}: {e}")))?;
        (name, text)
    };
    let (map, note) = match resolve_model(args.model.as_deref(), &name, &text) {
        Ok(m) => m,
        Err(ask) => {
            // The file's own mistakes come first (checked against the map with the most ports).
            cables::parse(&name, &text, &PortMap::b300(), args.servers)?;
            return Err(ask);
        }
    };
    if let Some(n) = note {
        eprintln!("switchless plan: {n}");
    }
    if let Some(n) = args.servers
        && n < 2
    {
        return Err(Error::InvalidUsage(format!(
            "--servers {n}: a mesh needs at least 2 servers"
        )));
    }
    let cables = cables::parse(&name, &text, &map, args.servers)?;
    let built = plan::build(
        &cables,
        &map,
        &Options {
            base: args.base,
            prefix: args.prefix,
            mtu: args.mtu,
        },
    )?;
    let mut built = built;
    if name != "<stdin>" {
        built.plan.cables_file = Some(name.clone());
    }
    for w in &built.warnings {
        eprintln!("switchless plan: warning: {w}");
    }
    let server = match &args.server {
        None => None,
        Some(s) => Some(built.plan.server_by_name(s).ok_or_else(|| {
            Error::InvalidUsage(format!(
                "--server {s}: the cables file names no such host (servers 1..={}{})",
                built.plan.servers,
                if built.plan.names.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; names: {}",
                        built
                            .plan
                            .names
                            .values()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            ))
        })?),
    };
    let files = render::render(&built.plan, args.format, server)?;
    match &args.out {
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(render::to_stdout(&files).as_bytes())
                .map_err(|e| Error::io("writing to standard output", e))?;
        }
        Some(dir) => {
            for f in &files {
                let path = dir.join(&f.path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
                }
                std::fs::write(&path, &f.text)
                    .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
                if f.path.ends_with(".sh") {
                    // The apply and check scripts are run as they are.
                    use std::os::unix::fs::PermissionsExt as _;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                        .map_err(|e| Error::io(format!("chmod 755 {}", path.display()), e))?;
                }
                if args.format == Format::Netplan {
                    // netplan warns about configuration files other users can read.
                    use std::os::unix::fs::PermissionsExt as _;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                        .map_err(|e| Error::io(format!("chmod 600 {}", path.display()), e))?;
                }
                eprintln!("switchless plan: wrote {}", path.display());
            }
        }
    }
    Ok(())
}
