//! `switchless doctor`: diagnose this host's RDMA/Ethernet ports (or a captured tree with `--root`).
//!
//! Exit status: 0 clean (info findings only), 1 warnings, 2 errors (`findings::exit_status`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::findings::{Finding, Severity};
use crate::host::{self, Reader, reader};
use crate::tools::doctor;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Judges this host as the plugin would see it, including the NCCL_* and \
NCCL_SWITCHLESS_* variables of this shell.\n\
Examples:\n  \
switchless doctor                                            # this host, in this shell's environment\n  \
switchless doctor --json > doctor-$(hostname).json\n  \
switchless doctor --plan plan.json                           # also compare with the IP plan (--server auto)\n  \
switchless doctor --capture /tmp/doctor-capture              # attach the tree to a bug report\n  \
switchless doctor --plan plan.json --probe                   # also ping each planned far end once\n  \
switchless doctor --fleet a/ b/ c/ --plan plan.json          # captures of every host against the cables file\n\
Exit status: 0 healthy (info findings only); 1 warnings; 2 errors, or --root/--plan/--capture unusable."
)]
pub struct Args {
    /// Read kernel files under this directory instead of /.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Print the report as JSON (schema "switchless-doctor/1", see docs/guide/doctor.md).
    #[arg(long)]
    pub json: bool,
    /// Copy exactly the kernel files discovery reads into DIR (a tree that --root DIR reads back), to
    /// attach to a bug report. DIR must not exist or be empty.
    #[arg(long, value_name = "DIR")]
    pub capture: Option<PathBuf>,
    /// Also compare the host with its part of an IP plan (the JSON of `switchless plan --format json`).
    #[arg(long, value_name = "PLAN.json")]
    pub plan: Option<PathBuf>,
    /// Which server of the plan this host is: its number or name in the cables file, or `auto` (the
    /// server named like this host, else the one whose planned addresses it holds).
    #[arg(
        long,
        value_name = "N|NAME|auto",
        requires = "plan",
        default_value = "auto"
    )]
    pub server: String,
    /// Judge the cables between hosts: each PATH a tree captured with --capture on one host (or a
    /// --root tree), one per host, optionally named NAME=PATH (default: the tree's
    /// /proc/sys/kernel/hostname, else the directory name).
    /// With --plan: one line per planned cable (OK, wrong port and where it goes, down, half,
    /// unverified) as well.
    #[arg(long, value_name = "PATH", num_args = 1.., conflicts_with_all = ["capture", "server", "probe"])]
    pub fleet: Vec<PathBuf>,
    /// With --fleet: print only the rank order of the hosts that puts NCCL's ring on the fattest cables,
    /// comma-separated (what the nccl-tests launchers' --order auto uses). Exit status 1 when no order
    /// visits every host over cables.
    #[arg(long, requires = "fleet", conflicts_with = "json")]
    pub order: bool,
    /// Live host only: ping each cable's far end once (the plan's peer with --plan, else the other
    /// host of each /30 or /31) and record what answers on each wire; --capture keeps it for
    /// `doctor --fleet`, which then names the port behind each MAC.
    #[arg(long)]
    pub probe: bool,
}

/// Reads the plan file named by `--plan`.
fn load_plan(path: &std::path::Path) -> Result<crate::tools::plan::Plan, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--plan {}: cannot read: {e}", path.display()))?;
    crate::tools::plan::Plan::from_json(&text)
        .map_err(|e| format!("--plan {}: {e}", path.display()))
}

/// The server `--server` names: `auto`, a number or a host name of the plan.
fn which_server(
    plan: &crate::tools::plan::Plan,
    arg: &str,
    live: &[crate::tools::plan::LiveIface],
    hostname: Option<&str>,
) -> Result<u32, String> {
    if arg.eq_ignore_ascii_case("auto") {
        return crate::tools::plan::check::pick_server(plan, live, hostname);
    }
    plan.server_by_name(arg).ok_or_else(|| {
        let names: Vec<String> = plan
            .names
            .iter()
            .map(|(n, h)| format!("{n} = {h}"))
            .collect();
        format!(
            "--server {arg}: the plan names no such server (servers 1..={}{})",
            plan.servers,
            if names.is_empty() {
                String::new()
            } else {
                format!("; names: {}", names.join(", "))
            }
        )
    })
}

/// Netdev → planned peer address of this host's server (as `--server` picks it on `m`).
fn planned_peers(
    plan: &crate::tools::plan::Plan,
    server: &str,
    m: &host::model::HostModel,
) -> Result<BTreeMap<String, std::net::Ipv4Addr>, String> {
    let live = crate::tools::plan::LiveIface::from_model(m);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string());
    let n = which_server(plan, server, &live, hostname.as_deref())?;
    Ok(plan
        .links_of(n)
        .filter_map(|l| l.side(n))
        .map(|(me, peer)| (me.interface.clone(), peer.address.addr()))
        .collect())
}

/// `--root` is this host's own `/` (not a captured tree).
fn is_live_root(root: &Path) -> bool {
    std::fs::canonicalize(root).is_ok_and(|p| p == Path::new("/"))
}

/// DMA-BUF support of every RDMA device of the model that opens (devices that do not open are left
/// out: unknown).
fn live_dmabuf(model: &host::model::HostModel) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    for d in &model.rdma_devices {
        if let Ok(s) = crate::verbs::probe_dmabuf_device(&d.name) {
            out.insert(d.name.clone(), s.is_supported());
        }
    }
    out
}

/// Discovery plus every check, without printing (the plan checker extends `findings` here).
pub fn diagnose(args: &Args) -> Result<(doctor::Report, Option<usize>), String> {
    // On a live host, `ethtool -k <if>` supplies GRO/TSO of TCP links (no kernel file holds them);
    // --capture saves its output under ethtool-k/<if>.
    let rd = if args.capture.is_some() {
        Reader::recording(&args.root)
    } else {
        Reader::new(&args.root)
    }
    .with_tools(true);
    if !args.root.is_dir() {
        return Err(format!(
            "--root {}: not a directory (expected / or a tree captured with --capture)",
            args.root.display()
        ));
    }
    let plan = match &args.plan {
        Some(p) => Some(load_plan(p)?),
        None => None,
    };
    // The environment judged: a captured tree's own (written by --capture), else this shell's.
    let environment =
        match doctor::environ::Environment::captured(&rd).filter(|_| !is_live_root(&args.root)) {
            Some(e) => e?,
            None => doctor::environ::Environment::from_process(),
        };
    let env = &environment.vars;
    // --probe asks each far end once before discovery reads the neighbour table, so the table then
    // holds what answered.
    let probe = if args.probe {
        if !is_live_root(&args.root) {
            return Err(format!(
                "--probe pings from this host: it needs the live host (--root /), not {}",
                args.root.display()
            ));
        }
        let (m0, _) = host::discover(Path::new("/"));
        let peers = match &plan {
            Some(p) => planned_peers(p, &args.server, &m0)?,
            None => BTreeMap::new(),
        };
        Some(doctor::probe::run(
            &m0,
            &doctor::probe::targets(&m0, &peers),
        ))
    } else {
        match doctor::probe::Probe::captured(&rd) {
            Some(p) => Some(p?),
            None => None,
        }
    };
    let (model, mut findings) = host::discover_with(&rd);
    // Recorded so that a capture names its host for `doctor --fleet`.
    if args.capture.is_some() {
        let _ = rd.read("/proc/sys/kernel/hostname");
    }
    // The NCCL environment this shell would give the plugin: every value init would refuse is a
    // finding of its own, and so is a name nobody reads (a typo).
    let judged = doctor::env::judge(env);
    findings.extend(judged.findings);
    let config = judged.config;
    if let Some(cfg) = &config {
        findings.extend(doctor::env_checks(&model, cfg.ib_retry_cnt));
    }
    // DMA-BUF support is not in any kernel file: on the live host ask each RDMA driver, as the
    // plugin's init does; offline the devices show no DMA-BUF and the GPUDirect check stays silent.
    let dmabuf = if is_live_root(&args.root) {
        live_dmabuf(&model)
    } else {
        BTreeMap::new()
    };
    let filter = config
        .as_ref()
        .map(|c| c.ib_hca.clone())
        .unwrap_or_else(crate::config::HcaFilter::all);
    let rdma = match &config {
        Some(_) => model.nccl_devices(&|dev, port| filter.matches(dev, port), &|dev| {
            dmabuf.get(dev).copied().unwrap_or(false)
        }),
        None => Vec::new(),
    };
    let probed = !rdma.is_empty()
        && rdma
            .iter()
            .flat_map(|d| &d.members)
            .all(|m| dmabuf.contains_key(&m.rdma_dev));
    let view = doctor::NcclView::decide(&model, config.as_ref(), rdma);
    findings.extend(doctor::env::hca_checks(&model, env, config.as_ref(), &view));
    findings.extend(doctor::env::transport_checks(config.as_ref(), &view));
    findings.extend(doctor::nccl::checks(&model, &environment, config.as_ref()));
    if view.transport == "rdma" {
        findings.extend(doctor::gpu_direct_checks(&model, &view.devices, probed));
    }
    let facts = doctor::facts::Facts::read(&rd, &model);
    let mut extras = doctor::Extras {
        facts,
        dmabuf_probed: !dmabuf.is_empty(),
        ib_hca: config
            .as_ref()
            .and_then(|c| doctor::env::hca_selection(&model, env, &c.ib_hca)),
        host: rd
            .read("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty()),
        ..Default::default()
    };
    let live = crate::tools::plan::LiveIface::from_model(&model);
    let server = match &plan {
        None => None,
        Some(p) => match which_server(p, &args.server, &live, extras.host.as_deref()) {
            Ok(n) => Some((p, n)),
            Err(why) => {
                findings.push(Finding::new(
                    Severity::Error,
                    "plan-server-unknown",
                    "plan",
                    why,
                    "switchless doctor --plan PLAN.json --server N   # N: this host's number in the cables file",
                ));
                None
            }
        },
    };
    if let Some((plan, n)) = server {
        extras.server = Some(plan.label(n));
        extras.persist_sysctl = Some(format!(
            "switchless plan {} --model {} --format sysctl --server {n} > /etc/sysctl.d/90-switchless.conf",
            plan.cables_file.as_deref().unwrap_or("CABLES"),
            plan.model.name
        ));
        for l in plan.links_of(n) {
            if let Some((me, _)) = l.side(n) {
                extras.planned.insert(
                    me.interface.clone(),
                    doctor::PlannedIface {
                        address: me.address,
                        mtu: plan.mtu,
                    },
                );
            }
        }
        findings.extend(crate::tools::plan::check_host(plan, n, &live));
    }
    if let Some(p) = &probe {
        let label = |a: std::net::Ipv4Addr| -> Option<String> {
            let (plan, n) = server?;
            plan.links_of(n).find_map(|l| {
                let (_, peer) = l.side(n)?;
                (peer.address.addr() == a).then(|| {
                    format!(
                        "{} port {} {}",
                        plan.label(peer.server),
                        peer.port,
                        peer.interface
                    )
                })
            })
        };
        findings.extend(doctor::probe::findings(p, &label));
    }
    let captured = match &args.capture {
        Some(dir) => {
            if dir.exists()
                && std::fs::read_dir(dir)
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(true)
            {
                return Err(format!(
                    "--capture {}: the directory exists and is not empty (expected a new or empty directory)",
                    dir.display()
                ));
            }
            let n = reader::capture(&rd, dir)
                .and_then(|n| environment.write_capture(dir).map(|()| n + 1))
                .and_then(|n| match &probe {
                    Some(p) => p.write_capture(dir).map(|()| n + 1),
                    None => Ok(n),
                })
                .map_err(|e| format!("--capture {}: {e}", dir.display()))?;
            Some(n)
        }
        None => None,
    };
    Ok((doctor::build(&model, view, extras, findings), captured))
}

/// The hosts of `--fleet`: one discovered model per PATH, named NAME=PATH, by the tree's hostname
/// file, or by the directory name; repeated names get `#2`, `#3`.
pub fn fleet_hosts(paths: &[PathBuf]) -> Result<Vec<doctor::fleet::HostInput>, String> {
    let mut hosts: Vec<doctor::fleet::HostInput> = Vec::new();
    for p in paths {
        let text = p.to_string_lossy();
        let (name, dir) = match text.split_once('=') {
            Some((n, d)) if !n.is_empty() && !n.contains('/') => {
                (Some(n.to_string()), PathBuf::from(d))
            }
            _ => (None, p.clone()),
        };
        if !dir.is_dir() {
            return Err(format!(
                "--fleet {}: not a directory (expected a tree made by switchless doctor --capture on one host)",
                dir.display()
            ));
        }
        let rd = Reader::new(&dir);
        let name = name
            .or_else(|| {
                ["/proc/sys/kernel/hostname", "/etc/hostname"]
                    .iter()
                    .find_map(|f| rd.read(f).ok())
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
            })
            .or_else(|| {
                std::fs::canonicalize(&dir)
                    .ok()
                    .and_then(|d| d.file_name().map(|n| n.to_string_lossy().to_string()))
            })
            .unwrap_or_else(|| dir.display().to_string());
        let mut unique = name.clone();
        let mut k = 2;
        while hosts.iter().any(|h| h.name == unique) {
            unique = format!("{name}#{k}");
            k += 1;
        }
        let (model, discovery) = host::discover_with(&rd);
        let facts = doctor::facts::Facts::read(&rd, &model);
        let probe = match doctor::probe::Probe::captured(&rd) {
            Some(Ok(p)) => Some(p),
            Some(Err(e)) => return Err(format!("--fleet {}: {e}", dir.display())),
            None => None,
        };
        hosts.push(doctor::fleet::HostInput {
            name: unique,
            model,
            discovery,
            facts,
            probe,
        });
    }
    if hosts.len() < 2 {
        return Err("--fleet needs at least two hosts (one PATH per host)".to_string());
    }
    Ok(hosts)
}

fn run_fleet(args: &Args) -> ExitCode {
    let hosts = match fleet_hosts(&args.fleet) {
        Ok(h) => h,
        Err(msg) => {
            eprintln!("switchless doctor: command line: {msg}");
            return ExitCode::from(2);
        }
    };
    let mut report = doctor::fleet::diagnose(&hosts);
    if args.order {
        let o = doctor::fleet_order::order(&report);
        println!("{}", o.names.join(","));
        if o.ring.bottleneck <= 0.0 {
            eprintln!(
                "switchless doctor: no order of these hosts visits every host over cables (printed: the given order)"
            );
            return ExitCode::from(1);
        }
        return ExitCode::SUCCESS;
    }
    let planned = match &args.plan {
        None => None,
        Some(p) => match load_plan(p) {
            Ok(plan) => {
                let (cables, findings) = doctor::fleet_plan::judge(&hosts, &plan);
                report.findings.extend(findings);
                report
                    .findings
                    .sort_by_key(|f| std::cmp::Reverse(f.severity));
                report.exit_status = report
                    .exit_status
                    .max(crate::findings::exit_status(&report.findings));
                Some((p.display().to_string(), cables))
            }
            Err(msg) => {
                eprintln!("switchless doctor: command line: {msg}");
                return ExitCode::from(2);
            }
        },
    };
    if args.json {
        let mut v = match serde_json::to_value(&report) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("switchless doctor: cannot encode the fleet report as JSON: {e}");
                return ExitCode::from(2);
            }
        };
        if let (Some((_, cables)), Some(obj)) = (&planned, v.as_object_mut()) {
            obj.insert(
                "planned_cables".into(),
                serde_json::to_value(cables).unwrap_or_default(),
            );
        }
        match serde_json::to_string_pretty(&v) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("switchless doctor: cannot encode the fleet report as JSON: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        let text = doctor::fleet_render::render_text(&report);
        match &planned {
            // The planned cables come before the findings' exit line.
            Some((file, cables)) => {
                let (body, tail) = text.rsplit_once("\nexit status").unwrap_or((&text, ""));
                print!(
                    "{body}{}\nexit status{tail}",
                    doctor::fleet_render::render_planned(file, cables)
                );
            }
            None => print!("{text}"),
        }
        print!("{}", doctor::fleet_order::render(&report, &hosts));
    }
    ExitCode::from(report.exit_status)
}

pub fn run(args: Args) -> ExitCode {
    if !args.fleet.is_empty() {
        return run_fleet(&args);
    }
    match diagnose(&args) {
        Ok((report, captured)) => {
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("switchless doctor: cannot encode the report as JSON: {e}");
                        return ExitCode::from(2);
                    }
                }
            } else {
                print!("{}", doctor::render_text(&report));
            }
            if let (Some(n), Some(dir)) = (captured, &args.capture) {
                eprintln!(
                    "switchless doctor: captured {n} files under {} (replay with --root {0})",
                    dir.display()
                );
            }
            ExitCode::from(report.exit_status)
        }
        Err(msg) => {
            let f = Finding::new(
                Severity::Error,
                "usage",
                "command line",
                msg,
                "see switchless doctor --help",
            );
            eprintln!("switchless doctor: {}: {}", f.object, f.message);
            ExitCode::from(2)
        }
    }
}
