//! `switchless doctor`: the checks over the host model ([`checks`](mod@checks), [`tcp`]), over the environment
//! NCCL would see ([`env`](mod@env): the plugin's variables; [`nccl`]: NCCL's own, read with what the
//! loader makes of them, [`environ`]), every check id with its meaning ([`registry`]), the report
//! ([`report`], JSON) and its text (`render`).

pub mod checks;
pub mod env;
pub mod environ;
pub mod facts;
pub mod fleet;
pub mod fleet_order;
pub mod fleet_plan;
pub mod fleet_render;
pub mod nccl;
pub mod probe;
pub mod registry;
mod render;
mod report;
pub mod tcp;
pub mod traps;
pub mod wiring;

pub use checks::{
    MEMLOCK_ERROR_BELOW, Planned, PlannedIface, checks, env_checks, gpu_direct_checks,
};
pub use env::{NcclEnv, NcclView};
pub use registry::check;
pub use render::render_text;
pub use report::{AddrRow, Extras, PortRow, Report, SCHEMA, Verdict, build, report};
