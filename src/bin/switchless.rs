//! The `switchless` command line: doctor, plan, route, bench, nccl-tests, watch.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use switchless::tools::cli;

fn long_version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let abis: Vec<String> = switchless::ABI_VERSIONS
            .iter()
            .map(|v| format!("v{v}"))
            .collect();
        format!("{} (ncclNet ABI {})", switchless::VERSION, abis.join(", "))
    })
}

#[derive(Debug, Parser)]
#[command(
    name = "switchless",
    version = long_version(),
    about = "NCCL network plugin for switchless RDMA meshes: diagnosis, IP plans, routes, benchmarks",
    after_help = "A first day on a new mesh:\n  \
switchless plan cables.txt --format json > plan.json         # one /30 per cable, checked\n  \
switchless plan cables.txt --format ip --out ip/             # apply ip/<server>.sh on each server\n  \
switchless doctor --plan plan.json --server auto             # on each server: ready for NCCL?\n  \
nccl-tests/srun-nccl-tests.sh -N 2 -i eno1 --dry-run         # what the benchmark would run\n\
Then set NCCL_NET_PLUGIN=switchless for the job. Every subcommand's --help has examples and its exit \
status; usage errors exit 2. Documentation: README.md."
)]
struct Cli {
    /// More log output on stderr (-v: info, -vv: debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Diagnose this host's RoCE/Ethernet ports (or a captured tree with --root).
    Doctor(cli::doctor::Args),
    /// Turn a cables file into a per-link IP plan.
    Plan(cli::plan::Args),
    /// Show which links a connection between two hosts would use.
    Route(cli::route::Args),
    /// Drive an ncclNet plugin through its ABI like NCCL's proxy does.
    Bench(Box<cli::bench::Args>),
    /// Summarize nccl-tests output.
    NcclTests(cli::nccl_tests::Args),
    /// Live Gb/s per NCCL device, PCIe function / CX-8 half and TCP link, from kernel counters.
    Watch(cli::watch::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (switchless.1 and switchless-SUBCOMMAND.1) into DIR (packaging).
    #[command(hide = true)]
    Manpages {
        #[arg(value_name = "DIR")]
        dir: std::path::PathBuf,
    },
}

/// `switchless completions SHELL` and `switchless manpages DIR`: generated from this clap definition,
/// so they cannot drift from the options.
fn generate(cmd: &Cmd) -> Option<ExitCode> {
    use clap::CommandFactory;
    match cmd {
        Cmd::Completions { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "switchless",
                &mut std::io::stdout(),
            );
            Some(ExitCode::SUCCESS)
        }
        Cmd::Manpages { dir } => {
            let r = std::fs::create_dir_all(dir)
                .and_then(|()| clap_mangen::generate_to(Cli::command(), dir));
            Some(match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("switchless manpages {}: {e}", dir.display());
                    ExitCode::from(2)
                }
            })
        }
        _ => None,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => tracing::Level::WARN,
        1 => tracing::Level::INFO,
        _ => tracing::Level::DEBUG,
    };
    switchless::ffi::log::install_stderr(level);
    if let Some(rc) = generate(&cli.cmd) {
        return rc;
    }
    match cli.cmd {
        Cmd::Doctor(a) => cli::doctor::run(a),
        Cmd::Plan(a) => cli::plan::run(a),
        Cmd::Route(a) => cli::route::run(a),
        Cmd::Bench(a) => cli::bench::run(*a),
        Cmd::NcclTests(a) => cli::nccl_tests::run(a),
        Cmd::Watch(a) => cli::watch::run(a),
        Cmd::Completions { .. } | Cmd::Manpages { .. } => ExitCode::SUCCESS,
    }
}
