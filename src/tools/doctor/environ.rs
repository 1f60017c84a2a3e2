//! The environment NCCL would run in, as the doctor keeps it: the variables it judges
//! ([`NcclEnv`]), the library `NCCL_NET_PLUGIN` resolves to, and the NCCL libraries the dynamic
//! loader would put ahead of a program's own (`LD_PRELOAD`, `/etc/ld.so.preload`, `libnccl.so*` in
//! `LD_LIBRARY_PATH`). Read from this shell and this machine, or from a tree's
//! `/switchless/environment.json`, which `doctor --capture` writes so that a replay judges the same
//! environment.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::env::NcclEnv;
use crate::host::Reader;

/// Where a capture keeps the environment (a logical path of the tree).
pub const CAPTURED: &str = "/switchless/environment.json";

/// One NCCL library the loader would load before a program's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclLib {
    pub path: String,
    /// `LD_PRELOAD`, `/etc/ld.so.preload` or `LD_LIBRARY_PATH`.
    pub via: String,
}

/// The environment the doctor judges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Environment {
    pub vars: NcclEnv,
    /// The file `NCCL_NET_PLUGIN` names as NCCL would find it; `None` when unset or not found.
    pub net_plugin: Option<String>,
    /// NCCL libraries ahead of a program's own, in the loader's order.
    pub nccl_libs: Vec<NcclLib>,
    /// `this shell` or `captured`.
    #[serde(skip)]
    pub source: String,
}

/// Standard library directories the loader searches after `LD_LIBRARY_PATH` and its cache.
const SYSTEM_DIRS: [&str; 8] = [
    "/usr/local/lib",
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib",
];

/// A `libnccl.so`, `libnccl.so.2` or `libnccl.so.2.28.3` file name (not `libnccl-net-*`).
pub fn is_nccl_lib(name: &str) -> bool {
    name == "libnccl.so" || name.starts_with("libnccl.so.")
}

impl Environment {
    /// This process's environment, with the loader's view resolved on this machine.
    pub fn from_process() -> Environment {
        Environment::resolve(NcclEnv::from_process())
    }

    /// `vars` with `NCCL_NET_PLUGIN` and the NCCL libraries resolved on this machine.
    pub fn resolve(vars: NcclEnv) -> Environment {
        let lib_path: Vec<String> = vars
            .get("LD_LIBRARY_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|d| !d.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let net_plugin = vars
            .get("NCCL_NET_PLUGIN")
            .filter(|v| !v.trim().is_empty())
            .and_then(|v| find_plugin(v.trim(), &lib_path));
        let mut nccl_libs = Vec::new();
        let preloads = vars
            .get("LD_PRELOAD")
            .map(|p| {
                p.split([':', ' '])
                    .filter(|e| !e.is_empty())
                    .map(|e| (e.to_string(), "LD_PRELOAD"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let global: Vec<(String, &str)> = std::fs::read_to_string("/etc/ld.so.preload")
            .map(|t| {
                t.split_whitespace()
                    .map(|e| (e.to_string(), "/etc/ld.so.preload"))
                    .collect()
            })
            .unwrap_or_default();
        for (e, via) in preloads.into_iter().chain(global) {
            let name = Path::new(&e)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if is_nccl_lib(&name) {
                nccl_libs.push(NcclLib {
                    path: e,
                    via: via.to_string(),
                });
            }
        }
        for d in &lib_path {
            let Ok(entries) = std::fs::read_dir(d) else {
                continue;
            };
            let mut found: Vec<String> = entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| is_nccl_lib(n))
                .collect();
            found.sort();
            // The soname the programs ask for (libnccl.so.2) when present, else the first.
            if let Some(n) = found
                .iter()
                .find(|n| n.as_str() == "libnccl.so.2")
                .or(found.first())
            {
                nccl_libs.push(NcclLib {
                    path: format!("{}/{n}", d.trim_end_matches('/')),
                    via: "LD_LIBRARY_PATH".to_string(),
                });
            }
        }
        Environment {
            vars,
            net_plugin,
            nccl_libs,
            source: "this shell".into(),
        }
    }

    /// The environment captured in the tree `rd` reads, if it holds one.
    pub fn captured(rd: &Reader) -> Option<Result<Environment, String>> {
        let text = rd.read(CAPTURED).ok()?;
        Some(
            serde_json::from_str::<Environment>(&text)
                .map(|mut e| {
                    e.source = "captured".into();
                    e
                })
                .map_err(|e| format!("{CAPTURED}: {e}")),
        )
    }

    /// Writes the environment into a capture directory at [`CAPTURED`].
    pub fn write_capture(&self, dir: &Path) -> std::io::Result<()> {
        let p = dir.join(CAPTURED.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(p, text + "\n")
    }
}

/// The file NCCL loads for `NCCL_NET_PLUGIN=value`: `libnccl-net-VALUE.so`, then VALUE itself, each
/// as a path when it holds a `/`, else searched in `LD_LIBRARY_PATH`, the loader's cache
/// (`ldconfig -p`) and the system directories. `none` loads nothing.
fn find_plugin(value: &str, lib_path: &[String]) -> Option<String> {
    if value.eq_ignore_ascii_case("none") {
        return None;
    }
    let candidates = [format!("libnccl-net-{value}.so"), value.to_string()];
    let cache = ldconfig_cache();
    for c in &candidates {
        if c.contains('/') {
            if Path::new(c).is_file() {
                return Some(c.clone());
            }
            continue;
        }
        for d in lib_path.iter().map(String::as_str).chain(SYSTEM_DIRS) {
            let p = Path::new(d).join(c);
            if p.is_file() {
                return Some(p.display().to_string());
            }
        }
        if let Some(p) = cache.iter().find(|(n, _)| n == c).map(|(_, p)| p.clone()) {
            return Some(p);
        }
    }
    None
}

/// `(name, path)` of the loader's cache, from `ldconfig -p` (empty when it cannot run).
fn ldconfig_cache() -> Vec<(String, String)> {
    let out = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|p| {
            std::process::Command::new(p)
                .arg("-p")
                .env("LC_ALL", "C")
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
                .filter(|o| o.status.success())
        });
    let Some(out) = out else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(' ')?;
            let path = rest.rsplit_once("=> ")?.1.trim();
            Some((name.to_string(), path.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "reads the host filesystem")]
    fn finds_the_plugin_and_the_nccl_libraries() {
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnccl-net-switchless.so"), "").unwrap();
        std::fs::write(lib.join("libnccl.so.2"), "").unwrap();
        std::fs::write(lib.join("libnccl.so.2.28.3"), "").unwrap();
        let vars = NcclEnv::from_pairs([
            ("NCCL_NET_PLUGIN".to_string(), "switchless".to_string()),
            ("LD_LIBRARY_PATH".to_string(), lib.display().to_string()),
            (
                "LD_PRELOAD".to_string(),
                "/opt/shim/libnccl.so.2.27.1:/usr/lib/libfoo.so".to_string(),
            ),
        ]);
        let e = Environment::resolve(vars);
        assert_eq!(
            e.net_plugin.as_deref(),
            Some(lib.join("libnccl-net-switchless.so").to_str().unwrap())
        );
        let libs: Vec<(&str, &str)> = e
            .nccl_libs
            .iter()
            .map(|l| (l.path.as_str(), l.via.as_str()))
            .collect();
        assert_eq!(libs[0], ("/opt/shim/libnccl.so.2.27.1", "LD_PRELOAD"));
        assert_eq!(
            libs[1],
            (
                lib.join("libnccl.so.2").to_str().unwrap(),
                "LD_LIBRARY_PATH"
            )
        );
        let e = Environment::resolve(NcclEnv::from_pairs([(
            "NCCL_NET_PLUGIN".to_string(),
            "no-such-plugin-here".to_string(),
        )]));
        assert_eq!(e.net_plugin, None);
        // Through a capture and back.
        let out = tempfile::tempdir().unwrap();
        e.write_capture(out.path()).unwrap();
        let back = Environment::captured(&Reader::new(out.path()))
            .unwrap()
            .unwrap();
        assert_eq!(back.vars, e.vars);
        assert_eq!(back.source, "captured");
    }
}
