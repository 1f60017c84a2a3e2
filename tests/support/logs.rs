//! Captures the plugin's `tracing` events on the calling thread (what NCCL's logger would print), so
//! a test can check the one INFO or WARN line a behaviour promises.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The events seen, as (level, message).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<(Level, String)>>>);

impl Logs {
    /// Runs `f` with this thread's events recorded.
    pub fn capture<T>(f: impl FnOnce() -> T) -> (T, Logs) {
        let logs = Logs::default();
        let out = tracing::subscriber::with_default(logs.clone(), f);
        (out, logs)
    }

    /// Every thread's events, from the first call on, for the whole test binary (the one global
    /// subscriber). Use it where the event may come from another thread, or where tests run in
    /// parallel: a callsite first hit on a thread with no subscriber may be cached as
    /// uninteresting and never reach a scoped one ([`Logs::capture`]).
    pub fn global() -> &'static Logs {
        static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
        LOGS.get_or_init(|| {
            let l = Logs::default();
            tracing::subscriber::set_global_default(l.clone()).expect("one global subscriber");
            l
        })
    }

    /// Messages at `level` that contain `needle`.
    pub fn find(&self, level: Level, needle: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, m)| *l == level && m.contains(needle))
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Every message, for assertion failures.
    pub fn all(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(l, m)| format!("{l} {m}"))
            .collect()
    }
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Logs {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), m.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
