//! The `switchless` command line: doctor, plan, route, bench, nccl-tests, watch (defined in
//! `tools::cli`).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use switchless::tools::cli::{self, Cli, Cmd};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => tracing::Level::WARN,
        1 => tracing::Level::INFO,
        _ => tracing::Level::DEBUG,
    };
    switchless::ffi::log::install_stderr(level);
    if let Some(rc) = cli.cmd.as_ref().and_then(cli::generate) {
        return rc;
    }
    match cli.cmd {
        // No subcommand: a short overview on stderr, exit 2 as clap does for a missing subcommand.
        None => {
            eprint!("{}", cli::overview());
            ExitCode::from(2)
        }
        Some(Cmd::Doctor(a)) => cli::doctor::run(a),
        Some(Cmd::Plan(a)) => cli::plan::run(a),
        Some(Cmd::Route(a)) => cli::route::run(a),
        Some(Cmd::Bench(a)) => cli::bench::run(*a),
        Some(Cmd::NcclTests(a)) => cli::nccl_tests::run(a),
        Some(Cmd::Watch(a)) => cli::watch::run(a),
        Some(Cmd::Completions { .. } | Cmd::Manpages { .. }) => ExitCode::SUCCESS,
    }
}
