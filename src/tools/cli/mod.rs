//! The `switchless` command line: [`Cli`] (clap derive) and its subcommands, each a module with clap
//! `Args` and `run(Args) -> ExitCode`. [`overview`] is what `switchless` alone prints; [`reference`](mod@reference)
//! renders `docs/reference/cli.md` from the same definitions.
#![forbid(unsafe_code)]

pub mod bench;
pub mod doctor;
pub mod nccl_tests;
pub mod plan;
pub mod reference;
pub mod route;
pub mod watch;

use clap::{CommandFactory, Parser, Subcommand};

pub fn long_version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let abis: Vec<String> = crate::ABI_VERSIONS
            .iter()
            .map(|v| format!("v{v}"))
            .collect();
        format!("{} (ncclNet ABI {})", crate::VERSION, abis.join(", "))
    })
}

#[derive(Debug, Parser)]
#[command(
    name = "switchless",
    version = long_version(),
    about = "NCCL network plugin for switchless RDMA meshes: diagnosis, IP plans, routes, benchmarks",
    after_help = "Examples (a first day on a new mesh):\n  \
switchless plan cables.txt --format json > plan.json         # one /30 per cable, checked\n  \
switchless plan cables.txt --format ip --out ip/             # apply ip/<server>.sh on each server\n  \
switchless doctor --plan plan.json --server auto             # on each server: ready for NCCL?\n  \
nccl-tests/srun-nccl-tests.sh -N 2 -i eno1 --dry-run         # what the benchmark would run\n\
Then set NCCL_NET_PLUGIN=switchless for the job. Every subcommand's --help has examples and its exit \
status; usage errors exit 2. Documentation: docs/ (the guide) and docs/reference/cli.md."
)]
pub struct Cli {
    /// More log output on stderr (-v: info, -vv: debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Diagnose this host's RoCE/Ethernet ports (or a captured tree with --root).
    Doctor(doctor::Args),
    /// Turn a cables file into a per-link IP plan.
    Plan(plan::Args),
    /// Show which links a connection between two hosts would use.
    Route(route::Args),
    /// Drive an ncclNet plugin through its ABI like NCCL's proxy does.
    Bench(Box<bench::Args>),
    /// Summarize nccl-tests output.
    NcclTests(nccl_tests::Args),
    /// Live Gb/s per NCCL device, PCIe function / CX-8 half and TCP link, from kernel counters.
    Watch(watch::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    #[command(after_help = "Examples:\n  \
switchless completions bash > /etc/bash_completion.d/switchless\n  \
switchless completions zsh > \"${fpath[1]}/_switchless\"\n\
Exit status: 0; 2 a usage error.")]
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

/// `switchless completions SHELL` and `switchless manpages DIR`: generated from the clap definition,
/// so they cannot drift from the options. `None` for every other subcommand.
pub fn generate(cmd: &Cmd) -> Option<std::process::ExitCode> {
    use std::process::ExitCode;
    match cmd {
        Cmd::Completions { shell } => {
            clap_complete::generate(*shell, &mut command(), "switchless", &mut std::io::stdout());
            Some(ExitCode::SUCCESS)
        }
        Cmd::Manpages { dir } => {
            let r = std::fs::create_dir_all(dir)
                .and_then(|()| clap_mangen::generate_to(command(), dir));
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

/// The clap command of [`Cli`] (what `--help`, the overview and the reference page render).
pub fn command() -> clap::Command {
    Cli::command()
}

/// What `switchless` with no arguments prints: each subcommand with its one-line description, and the
/// line that makes NCCL load the plugin. Built from [`Cli`], so it lists every subcommand there is.
pub fn overview() -> String {
    let cmd = command();
    let mut out = format!(
        "switchless {}: {}\n\nSubcommands:\n",
        crate::VERSION,
        cmd.get_about().map(|a| a.to_string()).unwrap_or_default()
    );
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        out.push_str(&format!("  {:<12}{about}\n", sub.get_name()));
    }
    out.push_str(
        "\nMake NCCL use the plugin (after `make install PREFIX=/usr/local`):\n  \
         export NCCL_NET_PLUGIN=/usr/local/lib/libnccl-net-switchless.so NCCL_NET=switchless\n\n\
         `switchless --help` shows a first day on a new mesh; `switchless SUBCOMMAND --help` shows \
         examples and exit statuses.\n",
    );
    out
}
