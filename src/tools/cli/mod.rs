//! Subcommands of the `switchless` binary. Each module has clap `Args` and `run(Args) -> ExitCode`.
#![forbid(unsafe_code)]

pub mod bench;
pub mod doctor;
pub mod nccl_tests;
pub mod plan;
pub mod route;
pub mod watch;
