//! One discovery in progress ([`Ctx`]): reads kernel files through the [`Reader`] and turns a missing
//! or odd file into a `kernel-file` warning naming it.

use super::reader::Reader;
use crate::findings::{CHECK_KERNEL_FILE, Finding, Severity};

/// One discovery in progress: the reader and the warnings about kernel files found so far.
pub(super) struct Ctx<'a> {
    pub(super) r: &'a Reader,
    pub(super) findings: Vec<Finding>,
}

impl Ctx<'_> {
    pub(super) fn warn_file(&mut self, path: &str, what: impl std::fmt::Display) {
        self.findings.push(Finding::new(
            Severity::Warning,
            CHECK_KERNEL_FILE,
            format!("file {path}"),
            format!("{what}"),
            "check that the driver is loaded and the file is readable (containers may hide sysfs entries)",
        ));
    }

    /// A file the model needs: missing or unreadable gives a warning.
    pub(super) fn req(&mut self, path: &str) -> Option<String> {
        match self.r.read(path) {
            Ok(s) => Some(s),
            Err(e) => {
                self.warn_file(path, format!("cannot read {path}: {e}"));
                None
            }
        }
    }

    /// An optional file: absent on many hosts (phys_switch_id, speed while down…).
    pub(super) fn opt(&self, path: &str) -> Option<String> {
        self.r.read(path).ok()
    }

    pub(super) fn parse<T: std::str::FromStr>(
        &mut self,
        path: &str,
        s: &str,
        accepted: &str,
    ) -> Option<T> {
        match s.trim().parse::<T>() {
            Ok(v) => Some(v),
            Err(_) => {
                self.warn_file(path, format!("{path} holds {s:?}; expected {accepted}"));
                None
            }
        }
    }
}
