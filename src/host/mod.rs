//! Host discovery from kernel files through a root directory, the host model, NCCL device grouping, doctor.
//!
//! Entry points:
//! * [`discover()`] / [`discover_with`]: read the host (under `root`, `/` on a live host) into a
//!   [`HostModel`] plus warnings about missing or odd kernel files.
//! * [`HostModel::nccl_devices`]: the devices the plugin exposes to NCCL (multi-host functions and
//!   split-cage halves merged).
//! * [`HostModel::local_links`] / [`HostModel::routes`]: the local side of routing.
//! * [`tcp`]: point-to-point TCP links (no RDMA) and their tuning: MTU, GRO/TSO, receive queues,
//!   socket buffer limits.
//! * [`reader::capture`]: copy exactly the files discovery read into a tree `--root` reads back.
#![forbid(unsafe_code)]

mod ctx;
pub mod discover;
pub mod links;
pub mod model;
pub mod nccl;
mod parse;
mod procfs;
pub mod reader;
mod sysfs;
pub mod tcp;

use std::path::Path;

use crate::findings::Finding;

pub use discover::discover_with;
pub use model::HostModel;
pub use nccl::{DmabufFilter, HcaFilter, Member, NcclDevice};
pub use reader::Reader;

/// Reads the host under `root` (`/` on a live host). Never fails: unreadable or odd kernel files
/// become `kernel-file` warnings naming the file.
pub fn discover(root: &Path) -> (HostModel, Vec<Finding>) {
    discover_with(&Reader::new(root))
}

/// Logs findings through `tracing` (the plugin's bridge to NCCL's logger, NET subsystem): errors and
/// warnings at WARN, info at INFO, one line each with the check id, object, message and remedy.
pub fn log_findings(findings: &[Finding]) {
    use crate::findings::Severity;
    for f in findings {
        match f.severity {
            Severity::Error | Severity::Warning => tracing::warn!(
                check = %f.check,
                "{}: {} (remedy: {})",
                f.object,
                f.message,
                f.remedy
            ),
            Severity::Info => tracing::info!(
                check = %f.check,
                "{}: {} (remedy: {})",
                f.object,
                f.message,
                f.remedy
            ),
        }
    }
}
