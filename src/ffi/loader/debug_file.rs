//! `NCCL_DEBUG_FILE` for the host: where NCCL writes its log when it is set (NCCL expands `%h` to the
//! host name up to its first dot, `%p` to the pid, `%%` to `%`), the bench writes the plugin's lines
//! and its own, each prefixed `HOST:PID:TID [DEV] NCCL LEVEL ` (NVIDIA/nccl `src/debug.cc`). A bench
//! run then leaves the per-process logs an NCCL job leaves, which `switchless nccl-tests summarize`
//! reads. Without the variable nothing is written here (the loader prints to stderr).

use std::fs::File;
use std::io::Write as _;

/// The debug file of one process, if `NCCL_DEBUG_FILE` names one.
#[derive(Debug)]
pub struct DebugSink {
    /// `None`: no debug file.
    file: Option<File>,
    /// `HOST:PID` of the line prefix.
    who: String,
}

/// The host name as NCCL prints it: up to the first dot.
fn short_host() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let h = h.trim();
    let h = h.split('.').next().unwrap_or("");
    if h.is_empty() {
        "localhost".to_string()
    } else {
        h.to_string()
    }
}

/// `NCCL_DEBUG_FILE`'s path with NCCL's substitutions; an unknown `%x` stays as written.
pub fn expand(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The calling thread's id, as NCCL's prefix shows it.
fn tid() -> i64 {
    // SAFETY: gettid takes no arguments, has no preconditions and cannot fail.
    i64::from(unsafe { libc::gettid() })
}

impl DebugSink {
    /// From the environment: `NCCL_DEBUG_FILE` if set and it opens for appending (else none, with
    /// one line on stderr saying why; the plugin's lines then go to stderr).
    pub fn from_env() -> DebugSink {
        let host = short_host();
        let pid = std::process::id();
        let who = format!("{host}:{pid}");
        let Some(pattern) = std::env::var("NCCL_DEBUG_FILE")
            .ok()
            .filter(|p| !p.is_empty())
        else {
            return DebugSink { file: None, who };
        };
        let path = expand(&pattern, &host, pid);
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(f) => DebugSink { file: Some(f), who },
            Err(e) => {
                eprintln!(
                    "switchless bench: NCCL_DEBUG_FILE={pattern}: cannot open {path}: {e}; logging to stderr"
                );
                DebugSink { file: None, who }
            }
        }
    }

    /// Whether lines go to a file.
    pub fn to_file(&self) -> bool {
        self.file.is_some()
    }

    /// Writes one line at `level` (`WARN`, `INFO`, …) to the file; nothing without one.
    pub fn line(&self, level: &str, text: &str) {
        if let Some(f) = &self.file {
            let l = format!(
                "{}:{} [0] NCCL {level} {}\n",
                self.who,
                tid(),
                text.trim_end()
            );
            // One write per line: with O_APPEND the lines of several processes do not interleave.
            let _ = (&*f).write_all(l.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutions_are_nccls() {
        assert_eq!(
            expand("/o/nccl.all_reduce.%h.%p.log", "swl-n1", 42),
            "/o/nccl.all_reduce.swl-n1.42.log"
        );
        assert_eq!(expand("a%%b%x%", "h", 1), "a%b%x%");
        assert_eq!(expand("plain", "h", 1), "plain");
    }

    #[test]
    fn lines_carry_nccls_prefix() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("log");
        let sink = DebugSink {
            file: Some(File::create(&path).unwrap()),
            who: "swl-n2:77".into(),
        };
        assert!(sink.to_file());
        sink.line("INFO", "NET/Plugin: Loaded net plugin switchless (v12)\n");
        sink.line("WARN", "NET/switchless : something");
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let t = tid();
        assert_eq!(
            lines[0],
            format!("swl-n2:77:{t} [0] NCCL INFO NET/Plugin: Loaded net plugin switchless (v12)")
        );
        assert!(lines[1].ends_with("[0] NCCL WARN NET/switchless : something"));
    }
}
