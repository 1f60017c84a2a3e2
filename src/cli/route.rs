//! `switchless route` (not yet implemented).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Read kernel files under this directory instead of /.
    #[arg(long, default_value = "/")]
    pub root: std::path::PathBuf,
}

pub fn run(_args: Args) -> ExitCode {
    eprintln!("switchless route: not implemented yet");
    ExitCode::from(2)
}
