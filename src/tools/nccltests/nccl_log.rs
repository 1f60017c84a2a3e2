//! NCCL's log lines (`… NCCL INFO …` / `… NCCL WARN …`) and what they say about the network each
//! process used, plus the launcher prefixes (`srun -l`, `mpirun --tag-output`) in front of any line.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// The process a NCCL log line came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Process {
    pub host: String,
    pub pid: u32,
}

/// What NCCL's log lines say about one process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcessEvidence {
    /// Networks named by `Using network X` / `Assigned NET plugin X to comm`.
    pub networks: BTreeSet<String>,
    /// External plugins NCCL loaded: name → ABI versions (`Loaded net plugin X (vN)`).
    pub loaded: BTreeMap<String, BTreeSet<u32>>,
}

/// Everything gathered from `NCCL INFO` / `NCCL WARN` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NcclLog {
    pub processes: BTreeMap<String, ProcessEvidence>,
    /// `NCCL version …` strings.
    pub nccl_versions: BTreeSet<String>,
    /// Values of NCCL_NET_PLUGIN NCCL reported.
    pub net_plugin_env: BTreeSet<String>,
    /// Paths NCCL loaded an external network plugin from.
    pub plugin_paths: BTreeSet<String>,
    /// Lines saying a plugin could not be found, loaded or initialized (deduplicated, first 20).
    pub plugin_failures: Vec<String>,
    /// `NCCL WARN` messages (deduplicated, first 20).
    pub warnings: Vec<String>,
    /// Number of NCCL log lines seen.
    pub lines: usize,
    /// INFO lines per `NET/<name>` prefix (`NET/IB`, `NET/Plugin`, the plugin's own `NET/switchless` lines).
    pub net_prefix_lines: BTreeMap<String, usize>,
    /// `Channel … via NET/<name>/<dev>…` connections per network name, and how many use GPUDirect RDMA
    /// (`/GDRDMA`): (connections, with GDRDMA).
    pub net_channels: BTreeMap<String, (usize, usize)>,
    /// The plugin's attestation per process (`host:pid`): version, commit, SHA-256 of the plugin
    /// and of libnccl, from its init line (`NET/switchless: switchless V commit C plugin …`).
    pub builds: BTreeMap<String, crate::transport::metrics::Build>,
}

const MAX_KEPT: usize = 20;

fn push_unique(v: &mut Vec<String>, s: String) {
    if v.len() < MAX_KEPT && !v.contains(&s) {
        v.push(s);
    }
}

impl NcclLog {
    /// Adds another file's evidence.
    pub fn merge(&mut self, other: NcclLog) {
        for (k, p) in other.processes {
            let e = self.processes.entry(k).or_default();
            e.networks.extend(p.networks);
            for (name, abis) in p.loaded {
                e.loaded.entry(name).or_default().extend(abis);
            }
        }
        self.nccl_versions.extend(other.nccl_versions);
        self.net_plugin_env.extend(other.net_plugin_env);
        self.plugin_paths.extend(other.plugin_paths);
        for f in other.plugin_failures {
            push_unique(&mut self.plugin_failures, f);
        }
        for w in other.warnings {
            push_unique(&mut self.warnings, w);
        }
        self.lines += other.lines;
        for (k, v) in other.net_prefix_lines {
            *self.net_prefix_lines.entry(k).or_default() += v;
        }
        for (k, (n, g)) in other.net_channels {
            let e = self.net_channels.entry(k).or_default();
            e.0 += n;
            e.1 += g;
        }
        self.builds.extend(other.builds);
    }

    /// Feeds one NCCL log line (`… NCCL INFO msg` or `… NCCL WARN msg`). Returns false if it is not one.
    pub(super) fn feed(&mut self, line: &str) -> bool {
        if let Some(i) = line.find(" NCCL INFO ") {
            self.lines += 1;
            let proc_key = process_key(&line[..i]);
            self.info(proc_key, line[i + " NCCL INFO ".len()..].trim_end());
            true
        } else if let Some(i) = line.find(" NCCL WARN ") {
            self.lines += 1;
            push_unique(
                &mut self.warnings,
                line[i + " NCCL WARN ".len()..].trim().to_string(),
            );
            true
        } else {
            false
        }
    }

    fn info(&mut self, proc_key: String, msg: &str) {
        if let Some(rest) = msg.strip_prefix("NET/") {
            let name = rest.split([' ', ':']).next().unwrap_or("");
            *self
                .net_prefix_lines
                .entry(format!("NET/{name}"))
                .or_default() += 1;
        }
        if let Some(b) = msg
            .strip_prefix("NET/switchless: ")
            .and_then(crate::transport::metrics::Build::parse)
        {
            self.builds.insert(proc_key.clone(), b);
        }
        if msg.starts_with("Channel ") {
            if let Some((_, via)) = msg.split_once(" via NET/") {
                let name = via.split('/').next().unwrap_or("").to_string();
                let e = self.net_channels.entry(name).or_default();
                e.0 += 1;
                if via.contains("/GDRDMA") {
                    e.1 += 1;
                }
            }
        }
        if let Some(name) = msg.strip_prefix("Using network ") {
            self.network(proc_key, name);
        } else if let Some(rest) = msg.strip_prefix("Assigned NET plugin ") {
            if let Some(name) = rest.strip_suffix(" to comm") {
                self.network(proc_key, name);
            }
        } else if let Some(rest) = msg.strip_prefix("NET/Plugin: Loaded net plugin ") {
            // "NAME (vN)"
            if let Some((name, ver)) = rest.rsplit_once(" (v") {
                let abi = ver.trim_end_matches(')').parse::<u32>().ok();
                let set = self
                    .processes
                    .entry(proc_key)
                    .or_default()
                    .loaded
                    .entry(name.trim().to_string())
                    .or_default();
                if let Some(abi) = abi {
                    set.insert(abi);
                }
            }
        } else if let Some(path) = msg
            .strip_prefix("Successfully loaded external network plugin ")
            .or_else(|| msg.strip_prefix("Successfully loaded external plugin "))
        {
            self.plugin_paths.insert(path.trim().to_string());
        } else if let Some(v) = msg
            .strip_prefix("NCCL_NET_PLUGIN set by environment to ")
            .or_else(|| msg.strip_prefix("NET/Plugin: Plugin name set by env to "))
        {
            self.net_plugin_env.insert(v.trim().to_string());
        } else if let Some(v) = msg.strip_prefix("NCCL version ") {
            self.nccl_versions.insert(v.trim().to_string());
        } else if msg.starts_with("Failed to initialize NET plugin ")
            || (msg.starts_with("External network plugin ") && msg.ends_with(" is unsupported"))
            || msg.starts_with("NET/Plugin: Could not find:")
        {
            push_unique(&mut self.plugin_failures, msg.to_string());
        } else if let Some(rest) = msg.strip_prefix("NET/Plugin: ") {
            // dlopen errors ("NET/Plugin: NAME: dlerror text"); the rest of NET/Plugin is benign version
            // probing ("Failed to find ncclNetPlugin_v11 symbol.") or bookkeeping.
            let benign = rest.starts_with("Failed to find ")
                || rest.starts_with("Loaded collnet plugin")
                || rest.starts_with("Closing ")
                || rest.starts_with("Using internal ")
                || rest.starts_with("Plugin name set by env");
            if !benign && rest.contains(": ") {
                push_unique(&mut self.plugin_failures, msg.to_string());
            }
        }
    }

    fn network(&mut self, proc_key: String, name: &str) {
        self.processes
            .entry(proc_key)
            .or_default()
            .networks
            .insert(name.trim().to_string());
    }

    /// Hosts with network evidence.
    pub fn hosts(&self) -> BTreeSet<&str> {
        self.processes
            .iter()
            .filter(|(_, p)| !p.networks.is_empty() || !p.loaded.is_empty())
            .map(|(k, _)| k.split_once(':').map_or(k.as_str(), |(h, _)| h))
            .collect()
    }
}

/// `host:pid` from the text before ` NCCL INFO` (`[launcher prefix] [timestamp] host:pid:tid [dev]`).
fn process_key(prefix: &str) -> String {
    let mut tokens: Vec<&str> = prefix.split_whitespace().collect();
    if tokens.last().is_some_and(|t| t.starts_with('[')) {
        tokens.pop();
    }
    if let Some(t) = tokens.last() {
        let parts: Vec<&str> = t.rsplitn(3, ':').collect();
        if parts.len() == 3 && parts[0].parse::<u64>().is_ok() && parts[1].parse::<u64>().is_ok() {
            return format!("{}:{}", parts[2], parts[1]);
        }
    }
    "unknown".to_string()
}

/// Splits a launcher's per-line prefix off: `srun -l` (`12: `, label `12`) or `mpirun --tag-output`
/// (`[1,0]<stdout>:`, label `1,0`). Lines without one have no label.
pub(super) fn split_launcher_prefix(line: &str) -> (Option<&str>, &str) {
    let t = line.trim_start();
    // srun -l: digits then ": "
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && t[digits..].starts_with(": ") {
        return (Some(&t[..digits]), &t[digits + 2..]);
    }
    // mpirun --tag-output: "[job,rank]<stdout>:" or "<stderr>:"
    if t.starts_with('[') {
        for tag in ["]<stdout>:", "]<stderr>:"] {
            if let Some(i) = t.find(tag) {
                let inner = &t[1..i];
                if inner.split(',').all(|p| p.trim().parse::<u64>().is_ok()) {
                    let rest = &t[i + tag.len()..];
                    return (Some(inner), rest.strip_prefix(' ').unwrap_or(rest));
                }
            }
        }
    }
    (None, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_prefixes() {
        assert_eq!(split_launcher_prefix("0: # Avg"), (Some("0"), "# Avg"));
        assert_eq!(
            split_launcher_prefix(" 12:   1024  256"),
            (Some("12"), "  1024  256")
        );
        assert_eq!(
            split_launcher_prefix("[1,0]<stdout>:# Avg"),
            (Some("1,0"), "# Avg")
        );
        assert_eq!(
            split_launcher_prefix("[1,15]<stderr>: x"),
            (Some("1,15"), "x")
        );
        assert_eq!(
            split_launcher_prefix("   1024   256"),
            (None, "   1024   256")
        );
        assert_eq!(
            split_launcher_prefix("[abc]<stdout>:x"),
            (None, "[abc]<stdout>:x")
        );
    }

    #[test]
    fn process_keys() {
        assert_eq!(
            process_key("b300-001:3810159:3810159 [7]"),
            "b300-001:3810159"
        );
        assert_eq!(process_key("1: b300-002:11:12 [0]"), "b300-002:11");
        assert_eq!(
            process_key("[2026-11-29 10:00:00] spark-a:5:6 [0]"),
            "spark-a:5"
        );
        assert_eq!(process_key("garbage"), "unknown");
    }
}
