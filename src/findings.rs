//! Findings: what `switchless doctor` (and `doctor --plan`) report. One shared format for every check.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// Check id of every finding about an unreadable or unparsable kernel file (discovery's own).
pub const CHECK_KERNEL_FILE: &str = "kernel-file";

/// How bad a finding is. Ordered: `Info < Warning < Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One diagnosis: a stable check id, the object it is about (a netdev, an RDMA port, a PCI function, a
/// link of the plan), what is wrong, and a one-line remedy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub severity: Severity,
    /// Stable identifier of the check, kebab-case, e.g. `mtu-below-4200`.
    pub check: String,
    /// The object the finding is about, e.g. `netdev enp1s0f0np0` or `mlx5_0 port 1`.
    pub object: String,
    /// What is wrong, with the observed values and their units.
    pub message: String,
    /// One line saying what to do about it.
    pub remedy: String,
}

impl Finding {
    pub fn new(
        severity: Severity,
        check: impl Into<String>,
        object: impl Into<String>,
        message: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        Finding {
            severity,
            check: check.into(),
            object: object.into(),
            message: message.into(),
            remedy: remedy.into(),
        }
    }
}

/// Exit status of a diagnosis: 0 when clean (info only), 1 with warnings, 2 with errors.
pub fn exit_status(findings: &[Finding]) -> u8 {
    match findings.iter().map(|f| f.severity).max() {
        Some(Severity::Error) => 2,
        Some(Severity::Warning) => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_is_worst_severity() {
        let f = |s| Finding::new(s, "c", "o", "m", "r");
        assert_eq!(exit_status(&[]), 0);
        assert_eq!(exit_status(&[f(Severity::Info)]), 0);
        assert_eq!(exit_status(&[f(Severity::Info), f(Severity::Warning)]), 1);
        assert_eq!(exit_status(&[f(Severity::Error), f(Severity::Warning)]), 2);
    }
}
