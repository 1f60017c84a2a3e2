//! Bounds shared by the tests that check a call returns "at once" (it decides without I/O or waiting).
#![allow(dead_code)]

use std::time::Duration;

/// A call that must not wait for a peer or a deadline finishes well within this on any host: it
/// only bounds a call that would otherwise wait (NCCL's connect has no deadline by default, so a
/// wrong wait would last until the test harness gives up). No loaded host reaches it by accident.
pub const AT_ONCE: Duration = Duration::from_secs(15);
