//! The `switchless` command line and what only it uses: the CLI's subcommands ([`cli`]), the doctor's
//! checks and report ([`doctor`]), the IP planner ([`plan`]), the nccl-tests parser ([`nccltests`]),
//! the ABI driver's modes ([`bench`](mod@bench)), the live counter view ([`watch`]) with the plugin's own counters ([`metrics`]) and how they all
//! write counts and units ([`units`]). Nothing in the plugin's data path imports this module.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod doctor;
pub mod metrics;
pub mod nccltests;
pub mod plan;
pub mod plot;
pub mod units;
pub mod watch;
