//! `switchless bench`: drives an ncclNet plugin through its C ABI like NCCL's proxy does, between
//! ranks that bootstrap over TCP, and prints nccl-tests-like tables (or JSON/CSV).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::values::{cli_bytes_usize, cli_seconds};
use crate::error::{Error, Result};
use crate::tools::bench as b;

/// `--timeout` when not given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// `--timeout` with `--model-mesh` when not given: a relay run at 256 MiB on 8 B300 hosts takes
/// minutes of real time (every relayed chunk is an event).
const MESH_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("modelled").args(["model", "model_mesh"])))]
#[command(after_help = "Examples:\n  \
switchless bench bandwidth --loopback -b 1M -e 64M           # in one process: no network, no plugin\n  \
switchless bench latency --rank 0 --bootstrap 0.0.0.0:29500  # on host A\n  \
switchless bench latency --rank 1 --bootstrap hostA:29500    # on host B\n  \
switchless bench allreduce --model-mesh cables.txt --model-kind b300 --algo tree -b 256M -e 256M --json\n\
Sizes: bytes or K/M/G (powers of 1024; 1M = 1048576 bytes). --timeout: 60, 10s, 2m or 1h (a bare number is seconds here, \
but milliseconds in the NCCL_SWITCHLESS_* variables: write the unit and it reads the same everywhere).\n\
Exit status: 0 every data check passed; 1 a data check failed or the run failed (the message says which rank and why); \
2 the report could not be written or a usage error.")]
pub struct Args {
    /// What to measure.
    #[arg(value_enum)]
    pub mode: b::Mode,
    /// This process's rank (0 listens for the bootstrap).
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    /// Number of ranks (default: the length of --hosts, else 2).
    #[arg(long)]
    pub nranks: Option<usize>,
    /// Rank 0's bootstrap address, HOST:PORT (rank 0 binds it; use 0.0.0.0:PORT there to listen on all).
    #[arg(long, conflicts_with = "hosts")]
    pub bootstrap: Option<String>,
    /// Comma-separated hosts, one per rank in rank order; rank 0 listens on its entry at --port.
    #[arg(long, value_delimiter = ',')]
    pub hosts: Vec<String>,
    /// Bootstrap TCP port with --hosts.
    #[arg(long, default_value_t = 29500)]
    pub port: u16,
    /// ncclNet plugin to load (default: libnccl-net-switchless.so next to this binary, in ../lib, or in
    /// ../lib/x86_64-linux-gnu or ../lib/aarch64-linux-gnu where the Debian package puts it).
    #[arg(long)]
    pub plugin: Option<PathBuf>,
    /// Run every rank in this process over the in-process loopback Net (no plugin, no network).
    #[arg(long)]
    pub loopback: bool,
    /// Smallest size: bytes, or with K, M or G (powers of 1024), e.g. 8 or 1M.
    #[arg(short = 'b', long, default_value = "8", value_parser = cli_bytes_usize)]
    pub min_bytes: usize,
    /// Largest size, in the forms of -b.
    #[arg(short = 'e', long, default_value = "1M", value_parser = cli_bytes_usize)]
    pub max_bytes: usize,
    /// Size multiplier between steps.
    #[arg(short = 'f', long, default_value_t = 4)]
    pub step_factor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed iterations per size.
    #[arg(short = 'w', long, default_value_t = 2)]
    pub warmup: usize,
    /// Bandwidth: messages in flight.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Allreduce: ring channels (default 2; with --model-mesh: 16 on B300, 4 on GB10, and for
    /// alltoall connections per peer, 2).
    #[arg(long)]
    pub channels: Option<usize>,
    /// Allreduce: largest single message, in the forms of -b.
    #[arg(long, default_value = "128K", value_parser = cli_bytes_usize)]
    pub chunk_bytes: usize,
    /// The communicator id passed to the plugin's `init` (decimal or 0x hexadecimal, not 0; the
    /// plugin derives its relay port from it). Default: a random id rank 0 draws and shares over
    /// the bootstrap, so each job is its own communicator as NCCL's commHash is. Give several jobs
    /// the same id to make them one communicator for the relays (a relay host that runs as a job
    /// of its own); every rank of a job that gives it must give rank 0's.
    #[arg(long, value_name = "ID", value_parser = crate::config::values::cli_comm_id,
          conflicts_with_all = ["loopback", "model", "model_mesh"])]
    pub comm_id: Option<u64>,
    /// Use this NCCL device for every connection (default: round-robin by peer and channel).
    #[arg(long)]
    pub dev: Option<usize>,
    /// `setNetAttr` hints (net ABI v11+): `nccl` gives the plugin NCCL's connect-time hint right
    /// before each connect and accept, as NCCL 2.30 does: a collective connection's for allreduce
    /// (op, algo, proto undefined; min(4, ranks) peers; --channels flows), a p2p connection's for
    /// alltoall, bandwidth and latency (NCCL's send/recv; the p2p op bits; min(8, ranks) peers;
    /// 1 flow). The switchless plugin's mesh policy adds relay paths to collective connections
    /// only. `none`: never call it (as NCCL before 2.28). Skipped where the plugin has none.
    #[arg(long, value_enum, default_value_t = b::NetAttrMode::Nccl)]
    pub net_attr: b::NetAttrMode,
    /// Time allowed for the bootstrap, connection set-up and each size (bandwidth: each window of
    /// messages, so a long run that keeps moving is never cut off), with the unit ms, s, m or h
    /// (e.g. 10s); a bare number is seconds here (milliseconds in NCCL_SWITCHLESS_* variables).
    /// Default 60s; 1h with --model-mesh, whose runs with relays take minutes of real time at
    /// 256 MiB.
    #[arg(long, value_parser = cli_seconds)]
    pub timeout: Option<Duration>,
    /// Print JSON instead of the table.
    #[arg(long, conflicts_with_all = ["csv", "nccl_tests"])]
    pub json: bool,
    /// Print CSV instead of the table.
    #[arg(long, conflicts_with = "nccl_tests")]
    pub csv: bool,
    /// Print the table in nccl-tests' layout (size count type redop root time algbw busbw #wrong, then
    /// its footer), test name `switchless bench MODE`: `switchless nccl-tests summarize` reads it.
    #[arg(long)]
    pub nccl_tests: bool,
    /// Also write the JSON report to this file (rank 0 writes the merged report; others their own).
    #[arg(long)]
    pub save_json: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long)]
    pub no_progress: bool,
    /// Latency: count and time the plugin calls of the timed round trips and read the thread's
    /// scheduler figures; every rank prints its own `# breakdown` line (JSON: each row's `breakdown`).
    #[arg(long)]
    pub breakdown: bool,
    /// Latency: receives each rank keeps posted ahead, as NCCL's proxy posts receives for the steps
    /// ahead (1: the lower rank posts the pong's receive just before its ping).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=8))]
    pub ahead: u16,
    /// Run every rank in this process over a rate-modelled fabric in virtual time: SPEC lists the
    /// paths of each connection as `RATE[/LATENCY][@ROOT]` items, e.g. 92.57G/1.2us,97.28G/1.2us or
    /// 200G/1us@r0,200G/1us@r0 (latency 1us when omitted; paths with one @ROOT share its --pcie cap).
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["loopback", "plugin", "bootstrap", "hosts"])]
    pub model: Option<String>,
    /// With --model: PCIe caps per root, ROOT=RATE items (payload rate per direction), e.g. r0=256G.
    #[arg(long, value_name = "CAPS", default_value = "", requires = "model")]
    pub pcie: String,
    /// With --model: RoCE MTU in bytes (256..4096; 0 = count payload only, no framing).
    #[arg(long, default_value_t = 4096, requires = "model")]
    pub mtu: u32,
    /// With --model: how bandwidth is posted, as NCCL's proxy does (simple: 512 KiB steps, ll: 64
    /// KiB, ll128: 600 KiB; `--window` in flight), or whole messages per timed batch (messages).
    #[arg(long, value_enum, default_value_t = b::summary::Pattern::Simple, requires = "model")]
    pub pattern: b::summary::Pattern,
    /// With --model: largest send of the pattern, bytes (overrides --pattern's step).
    #[arg(long, requires = "model")]
    pub step_bytes: Option<usize>,
    /// With --model or --model-mesh: copy and check payloads (auto: on when the largest size is at
    /// most 16 MiB).
    #[arg(long, value_enum, default_value_t = Verify::Auto, requires = "modelled")]
    pub verify: Verify,
    /// With --model: message size of the latency probe, bytes.
    #[arg(long, default_value_t = 8, requires = "model")]
    pub latency_bytes: usize,
    /// With --model: measure the protocol's CPU cost instead (real time, in-memory fabric without
    /// copies, both ends in one thread): CPU seconds per GB and cores for 800 Gb/s.
    #[arg(long, requires = "model")]
    pub cpu: bool,
    /// With --cpu: bytes moved per size.
    #[arg(long, default_value_t = 1 << 30, requires = "cpu")]
    pub cpu_bytes: u64,
    /// Run NCCL's own patterns (allreduce: the rank-order ring over every channel or the double
    /// binary tree; alltoall: the p2p schedule) with the real comms over a rate-modelled mesh built
    /// from a cables file (`switchless plan`'s format), one rank per host, in virtual time; reports
    /// busbw against the host's capacity (see docs/performance.md).
    #[arg(long, value_name = "CABLES", conflicts_with_all = ["model", "loopback", "plugin", "bootstrap", "hosts", "csv", "plot"])]
    pub model_mesh: Option<PathBuf>,
    /// With --model-mesh: the server model of every host (b300: 8 CX-8 ports of two 400 Gb/s
    /// halves, 8 ranks; gb10: 2 QSFP ports behind two PCIe Gen5 x4 links).
    #[arg(long, value_enum, requires = "model_mesh")]
    pub model_kind: Option<b::mesh::Kind>,
    /// With --model-mesh: relay paths through a third host (auto: ring and tree connections get
    /// one through every host cabled to both ends, alltoall only where no cable joins the pair;
    /// off: none, as today).
    #[arg(long, value_enum, default_value_t = b::mesh::Relay::Auto, requires = "model_mesh")]
    pub relay: b::mesh::Relay,
    /// With --model-mesh: the comms' stripe weights (adaptive: each path's measured throughput, the
    /// plugin's default; nominal: each path's nominal speed, a relay path the policy's split).
    #[arg(long, value_enum, default_value_t = b::mesh::Weights::Adaptive, requires = "model_mesh")]
    pub weights: b::mesh::Weights,
    /// With --model-mesh and allreduce: NCCL's algorithm.
    #[arg(long, value_enum, default_value_t = b::mesh::Algo::Ring, requires = "model_mesh")]
    pub algo: b::mesh::Algo,
    /// Also draw Gb/s against message size into this SVG file (rank 0).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// With --plot: overlay other runs, each a report saved with --save-json (same mode), one line
    /// per file (e.g. another plugin, or the run before a change).
    #[arg(long, value_name = "FILE.json", requires = "plot")]
    pub plot_with: Vec<PathBuf>,
}

/// A line of another run for --plot-with: the `field` of each row of a saved report, by size.
fn saved_series(path: &std::path::Path, field: &str) -> Result<crate::tools::plot::Series> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| crate::error::Error::io(format!("--plot-with {}", path.display()), e))?;
    let bad = |what: &str| {
        crate::error::Error::InvalidArgument(format!(
            "--plot-with {}: {what} (expected a report written by switchless bench --save-json)",
            path.display()
        ))
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
    let rows = v["rows"].as_array().ok_or_else(|| bad("no rows"))?;
    let mut points = Vec::new();
    for row in rows {
        match (row["size_bytes"].as_u64(), row[field].as_f64()) {
            (Some(x), Some(y)) => points.push((x, y)),
            _ => return Err(bad(&format!("a row without size_bytes or {field}"))),
        }
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let label = match v["plugin"].as_str() {
        Some(p) => format!("{stem} ({p})"),
        None => stem,
    };
    Ok(crate::tools::plot::Series {
        label,
        points,
        reference: false,
    })
}

/// Payload checks under --model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Verify {
    Auto,
    On,
    Off,
}

fn options(a: &Args) -> b::Options {
    b::Options {
        mode: a.mode,
        min_bytes: a.min_bytes,
        max_bytes: a.max_bytes,
        step_factor: a.step_factor,
        iters: a.iters,
        warmup: a.warmup,
        window: a.window,
        channels: a.channels.unwrap_or(2),
        chunk_bytes: a.chunk_bytes,
        dev: a.dev,
        timeout: a.timeout.unwrap_or(DEFAULT_TIMEOUT),
        progress: !a.no_progress,
        breakdown: a.breakdown,
        ahead: usize::from(a.ahead),
        // Set in `run_plugin`: an in-process or modelled run moves no packet on this host's NICs.
        rdma_packets: false,
        net_attr: a.net_attr,
    }
}

fn emit(a: &Args, r: &b::Report) -> Result<()> {
    if let Some(p) = &a.save_json {
        std::fs::write(p, b::report::json(r)?)
            .map_err(|e| Error::io(format!("writing {}", p.display()), e))?;
    }
    if r.rank == 0 {
        if a.json {
            println!("{}", b::report::json(r)?);
        } else if a.csv {
            print!("{}", b::report::csv(r));
        } else if a.nccl_tests {
            print!("{}", b::report::nccl_tests(r));
        } else {
            print!("{}", b::report::table(r));
        }
    } else {
        // The breakdown is per rank: the other ranks print their own (rank 0's is in its table).
        for row in &r.rows {
            if let Some(b) = &row.breakdown {
                println!("{}", b.line(r.rank, row.size_bytes));
            }
        }
        if r.errors() == 0 {
            println!(
                "rank {}: {} done, all data checks passed",
                r.rank,
                r.mode.name()
            );
        } else {
            println!(
                "rank {}: {} done, {} data checks FAILED",
                r.rank,
                r.mode.name(),
                r.errors()
            );
        }
    }
    Ok(())
}

fn bootstrap(a: &Args, nranks: usize, timeout: Duration) -> Result<b::Bootstrap> {
    let addr = match (&a.bootstrap, a.hosts.first()) {
        (Some(x), _) => x.clone(),
        (None, Some(h)) => format!("{h}:{}", a.port),
        (None, None) => {
            return Err(Error::InvalidUsage(
                "no bootstrap: give --bootstrap HOST:PORT (rank 0's address), --hosts H0,H1,... or --loopback".into(),
            ));
        }
    };
    if a.rank == 0 {
        b::Bootstrap::listen(&addr, nranks, timeout)
    } else {
        b::Bootstrap::join(&addr, a.rank, nranks, timeout)
    }
}

fn real(a: &Args, o: &b::Options, nranks: usize) -> Result<b::Report> {
    let mut boot = bootstrap(a, nranks, o.timeout)?;
    run_plugin(a, o, &mut boot)
}

/// Loads the plugin (`--plugin` or ours by default) through `ffi::loader` and runs the mode.
fn run_plugin(a: &Args, o: &b::Options, boot: &mut b::Bootstrap) -> Result<b::Report> {
    let t0 = std::time::Instant::now();
    let mut net = crate::ffi::loader::HostNet::load_default(a.plugin.as_deref())?;
    // one communicator id for the whole job, unique per job like NCCL's commHash
    let comm_id = boot.agree_comm_id(a.comm_id)?;
    b::Net::init(&mut net, comm_id)?;
    net.announce_network();
    let init_s = t0.elapsed().as_secs_f64();
    let o = b::Options {
        rdma_packets: true,
        ..o.clone()
    };
    let r = b::run(&net, boot, &o);
    let f = b::Net::finalize(&mut net);
    let mut r = r?;
    f?;
    if let Some(s) = r.setup.as_mut() {
        s.init_s = init_s;
    }
    Ok(r)
}

fn model_options(a: &Args, spec: &str) -> b::model::ModelOptions {
    b::model::ModelOptions {
        spec: spec.to_string(),
        pcie: a.pcie.clone(),
        mtu: a.mtu,
        pattern: a.pattern,
        step_bytes: a.step_bytes,
        verify: match a.verify {
            Verify::Auto => None,
            Verify::On => Some(true),
            Verify::Off => Some(false),
        },
        latency_bytes: a.latency_bytes,
    }
}

/// `--model SPEC --cpu`: the CPU cost table (or JSON).
fn cpu(a: &Args, spec: &str) -> Result<()> {
    use crate::transport::modelfab::link::{Framing, Topology};
    if a.mode != b::Mode::Bandwidth {
        return Err(Error::InvalidUsage(format!(
            "--cpu measures the bandwidth pattern; accepted: switchless bench bandwidth --model SPEC --cpu (got {})",
            a.mode.name()
        )));
    }
    let topo = Topology::parse(spec, &a.pcie, Framing::Ideal)?;
    let speeds: Vec<u64> = topo.paths.iter().map(|p| p.rate_bps / 1_000_000).collect();
    let sizes = b::modes::sizes(&options(a))?;
    let step = a
        .step_bytes
        .or(a.pattern.step_bytes())
        .unwrap_or(a.max_bytes);
    let r = b::cpu::run(
        spec,
        &speeds,
        &sizes,
        step,
        a.window,
        a.cpu_bytes,
        a.timeout.unwrap_or(DEFAULT_TIMEOUT),
    )?;
    if let Some(p) = &a.save_json {
        let j = serde_json::to_string_pretty(&r)
            .map_err(|e| Error::Internal(format!("JSON of the report: {e}")))?;
        std::fs::write(p, j).map_err(|e| Error::io(format!("writing {}", p.display()), e))?;
    }
    if a.json {
        let j = serde_json::to_string_pretty(&r)
            .map_err(|e| Error::Internal(format!("JSON of the report: {e}")))?;
        println!("{j}");
    } else {
        print!("{}", b::cpu::table(&r));
    }
    Ok(())
}

/// The --plot of a report: achieved rate per size and, under --model, the modelled rate.
fn plot(r: &b::Report, path: &std::path::Path, with: &[PathBuf]) -> Result<()> {
    use crate::tools::plot::{Plot, Series};
    let busbw = matches!(r.mode, b::Mode::Alltoall | b::Mode::Allreduce);
    let pts = |f: &dyn Fn(&b::Row) -> Option<f64>| -> Vec<(u64, f64)> {
        r.rows
            .iter()
            .filter_map(|row| f(row).map(|v| (row.size_bytes as u64, v)))
            .collect()
    };
    let (label, y) = if r.mode == b::Mode::Latency {
        ("one-way latency", "time (us)")
    } else if busbw {
        ("busbw", "bandwidth (Gb/s)")
    } else {
        ("algbw", "bandwidth (Gb/s)")
    };
    let mut series = vec![Series {
        label: label.into(),
        points: pts(&|row| {
            Some(match r.mode {
                b::Mode::Latency => row.time_us,
                _ if busbw => row.busbw_gbits_s,
                _ => row.algbw_gbits_s,
            })
        }),
        reference: false,
    }];
    let field = match r.mode {
        b::Mode::Latency => "time_us",
        _ if busbw => "busbw_gbits_s",
        _ => "algbw_gbits_s",
    };
    if !with.is_empty() {
        series[0].label = format!("this run: {label}");
    }
    for f in with {
        series.push(saved_series(f, field)?);
    }
    if r.mode != b::Mode::Latency && r.rows.iter().any(|x| x.modelled_gbits_s.is_some()) {
        series.push(Series {
            label: "sum of modelled path rates".into(),
            points: pts(&|row| row.modelled_gbits_s),
            reference: true,
        });
    }
    let title = match &r.model {
        Some(m) => format!("switchless bench {}: {}", r.mode.name(), m.spec),
        None => format!("switchless bench {}: {}", r.mode.name(), r.plugin),
    };
    crate::tools::plot::write(
        &Plot {
            title,
            y_label: y.into(),
            series,
            log_y: false,
        },
        path,
    )
}

fn go(a: &Args) -> Result<b::Report> {
    let o = options(a);
    let nranks = a
        .nranks
        .unwrap_or(if a.hosts.is_empty() { 2 } else { a.hosts.len() });
    if !a.hosts.is_empty() && a.hosts.len() != nranks {
        return Err(Error::InvalidUsage(format!(
            "--hosts lists {} hosts but --nranks is {nranks} (accepted: one host per rank)",
            a.hosts.len()
        )));
    }
    if let Some(spec) = &a.model {
        b::model::run(&o, nranks, &model_options(a, spec))
    } else if a.loopback {
        b::loopback::run_ranks(&o, nranks, b::loopback::LoopbackConfig::default())
    } else {
        real(a, &o, nranks)
    }
}

/// `--model-mesh CABLES`: the mesh report (or JSON).
fn mesh(a: &Args, cables: &std::path::Path) -> Result<b::mesh::MeshReport> {
    let collective = match a.mode {
        b::Mode::Allreduce => b::mesh::Collective::AllReduce,
        b::Mode::Alltoall => b::mesh::Collective::AllToAll,
        m => {
            return Err(Error::InvalidUsage(format!(
                "--model-mesh runs collectives; accepted: switchless bench allreduce|alltoall --model-mesh CABLES (got {})",
                m.name()
            )));
        }
    };
    let Some(kind) = a.model_kind else {
        return Err(Error::InvalidUsage(
            "--model-mesh needs --model-kind b300|gb10 (the server model of every host)".into(),
        ));
    };
    let model = b::mesh::MeshModel::load(kind, cables)?;
    if let Some(n) = a.nranks.filter(|&n| n != model.hosts) {
        return Err(Error::InvalidUsage(format!(
            "--nranks {n} but {} cables {} hosts (accepted: leave --nranks out, or give the number of hosts)",
            cables.display(),
            model.hosts
        )));
    }
    let mo = b::mesh::MeshOptions {
        collective,
        algo: a.algo,
        relay: a.relay,
        channels: a.channels,
        weights: a.weights,
        settle: true,
        verify: match a.verify {
            Verify::Auto => None,
            Verify::On => Some(true),
            Verify::Off => Some(false),
        },
    };
    let o = b::Options {
        timeout: a.timeout.unwrap_or(MESH_TIMEOUT),
        ..options(a)
    };
    let r = b::mesh::run(&o, &model, &mo)?;
    let j = || {
        serde_json::to_string_pretty(&r)
            .map_err(|e| Error::Internal(format!("JSON of the report: {e}")))
    };
    if let Some(p) = &a.save_json {
        std::fs::write(p, j()?).map_err(|e| Error::io(format!("writing {}", p.display()), e))?;
    }
    if a.json {
        println!("{}", j()?);
    } else {
        print!("{}", b::mesh::table(&r));
    }
    Ok(r)
}

pub fn run(args: Args) -> ExitCode {
    if let Some(cables) = &args.model_mesh {
        return match mesh(&args, cables) {
            Ok(r) if r.errors() > 0 => {
                eprintln!(
                    "switchless bench: {} data checks FAILED ({})",
                    r.errors(),
                    r.first_error.as_deref().unwrap_or("see the table")
                );
                ExitCode::from(1)
            }
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("switchless bench {} --model-mesh: {e}", args.mode.name());
                ExitCode::from(1)
            }
        };
    }
    if let (Some(spec), true) = (&args.model, args.cpu) {
        return match cpu(&args, spec) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("switchless bench --cpu: {e}");
                ExitCode::from(1)
            }
        };
    }
    match go(&args) {
        Ok(r) => {
            if let Err(e) = emit(&args, &r) {
                eprintln!("switchless bench: {e}");
                return ExitCode::from(2);
            }
            if let (Some(p), 0) = (&args.plot, r.rank) {
                if let Err(e) = plot(&r, p, &args.plot_with) {
                    eprintln!("switchless bench: {e}");
                    return ExitCode::from(2);
                }
            }
            if r.errors() > 0 {
                eprintln!(
                    "switchless bench: {} data checks FAILED ({})",
                    r.errors(),
                    r.first_error.as_deref().unwrap_or("see the table")
                );
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!(
                "switchless bench {} (rank {}): {e}",
                args.mode.name(),
                args.rank
            );
            ExitCode::from(1)
        }
    }
}
