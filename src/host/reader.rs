//! Every kernel file discovery reads goes through one [`Reader`]: it maps logical paths
//! (`/sys/class/net/eth0/mtu`) under a root directory and can record what it read, so that
//! [`capture`] can copy exactly those files (and the symlinks on the way) into a tree that a later
//! `--root` reads back. Facts no kernel file holds (a netdev's GRO/TSO) come from a tool's output
//! ([`Reader::tool_output`]), kept under a logical path and captured as a file there. GID tables the
//! plugin already read through libibverbs in one call ([`Reader::with_gid_tables`]) replace the
//! per-slot sysfs files.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::sync;

/// How a recorded path was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// The file's contents were read.
    File,
    /// The directory was listed.
    Dir,
    /// The path was resolved (symlinks followed) or probed for existence.
    Resolve,
}

/// Reads kernel files under a root directory (`/` on a live host).
#[derive(Debug)]
pub struct Reader {
    root: PathBuf,
    record: Option<Mutex<BTreeSet<(String, Access)>>>,
    /// On a live host: run tools whose output no kernel file holds (see [`Reader::tool_output`]).
    run_tools: bool,
    /// Tool outputs produced on a live host, by logical path; [`capture`] writes them as files.
    synthetic: Mutex<BTreeMap<String, String>>,
    /// GID tables by (device, port), read elsewhere (see [`Reader::with_gid_tables`]).
    gid_tables: GidTables,
}

/// The populated GID entries of RDMA ports by (device, port), as `ibv_query_gid_table` returns them.
pub type GidTables = BTreeMap<(String, u8), Vec<super::model::GidEntry>>;

/// Most symlinks followed while resolving one path (the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

impl Reader {
    /// A reader of the files under `root`.
    pub fn new(root: &Path) -> Self {
        Reader {
            root: root.to_path_buf(),
            record: None,
            run_tools: false,
            synthetic: Mutex::new(BTreeMap::new()),
            gid_tables: BTreeMap::new(),
        }
    }

    /// Lets [`Reader::tool_output`] run its tool on a live host (`root` = `/`). Off by default, so
    /// the plugin's discovery at `init` never forks a process; `switchless doctor` turns it on.
    pub fn with_tools(mut self, run: bool) -> Self {
        self.run_tools = run;
        self
    }

    /// GID tables already read (the plugin's one `ibv_query_gid_table` call per device): discovery
    /// takes a listed port's entries from here instead of reading `gids/N`, `gid_attrs/types/N` and
    /// `gid_attrs/ndevs/N` for each of its slots (1024 on rxe: a few seconds of `init` under
    /// emulation). Ports not listed are read from sysfs as usual.
    pub fn with_gid_tables(mut self, tables: GidTables) -> Self {
        self.gid_tables = tables;
        self
    }

    /// The GID entries of `dev` port `port` given by [`Reader::with_gid_tables`], if any.
    pub fn gid_table(&self, dev: &str, port: u8) -> Option<&[super::model::GidEntry]> {
        self.gid_tables
            .get(&(dev.to_string(), port))
            .map(Vec::as_slice)
    }

    /// Output of a tool for facts no kernel file holds (e.g. `ethtool -k <if>`: GRO/TSO), stored
    /// under a logical path such as `/ethtool-k/<if>`. Under a root other than `/` (a capture or a
    /// fixture) the file at that path is read. On a live host the tool (`argv`, run with `LC_ALL=C`,
    /// no shell) is run when [`Reader::with_tools`] allowed it, and its output is kept so that
    /// [`capture`] writes it at the logical path; otherwise this fails with `Unsupported`.
    pub fn tool_output(&self, logical: &str, argv: &[&str]) -> io::Result<String> {
        if !self.is_live() {
            return self.read(logical);
        }
        let cached = self.tool_cache()?.get(logical).cloned();
        if let Some(s) = cached {
            return Ok(s);
        }
        if !self.run_tools {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{logical}: running tools is off for this reader"),
            ));
        }
        let (prog, args) = argv
            .split_first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
        let out = std::process::Command::new(prog)
            .args(args)
            .env("LC_ALL", "C")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{} exited with {}",
                argv.join(" "),
                out.status
            )));
        }
        let s = String::from_utf8_lossy(&out.stdout)
            .trim_end_matches(['\n', '\0'])
            .to_string();
        self.note(logical, Access::File);
        self.tool_cache()?.insert(logical.to_string(), s.clone());
        Ok(s)
    }

    /// Tool outputs kept by [`Reader::tool_output`] on a live host, by logical path.
    pub fn synthetic(&self) -> io::Result<Vec<(String, String)>> {
        Ok(self
            .tool_cache()?
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    /// The tool-output cache; a poisoned lock (a panic while it was held) fails the read.
    fn tool_cache(&self) -> io::Result<MutexGuard<'_, BTreeMap<String, String>>> {
        sync::lock(&self.synthetic, "tool output cache").map_err(io::Error::other)
    }

    /// A reader that also records every path it is asked for (see [`Reader::recorded`]).
    pub fn recording(root: &Path) -> Self {
        Reader {
            root: root.to_path_buf(),
            record: Some(Mutex::new(BTreeSet::new())),
            run_tools: false,
            synthetic: Mutex::new(BTreeMap::new()),
            gid_tables: BTreeMap::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The paths read so far, in order, with how they were used (empty unless recording). A
    /// poisoned record (a panic while it was held) is an error: a capture from it would miss files.
    pub fn recorded(&self) -> io::Result<Vec<(String, Access)>> {
        match &self.record {
            Some(m) => Ok(sync::lock(m, "read record")
                .map_err(io::Error::other)?
                .iter()
                .cloned()
                .collect()),
            None => Ok(Vec::new()),
        }
    }

    fn note(&self, logical: &str, access: Access) {
        // A poisoned record is not written; recorded() then fails, so nothing is lost silently.
        if let Some(Ok(mut g)) = self.record.as_ref().map(|m| sync::lock(m, "read record")) {
            g.insert((logical.to_string(), access));
        }
    }

    fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    /// The host path of a logical path, with its symlinks resolved inside the root (so an absolute
    /// link target such as `/proc/123` stays under the root).
    fn host_path(&self, logical: &str) -> io::Result<PathBuf> {
        if self.is_live() {
            return Ok(PathBuf::from(logical));
        }
        let resolved = resolve_in_root(&self.root, logical, &mut |_, _| Ok(()))?;
        Ok(join_logical(&self.root, &resolved))
    }

    /// The contents of a file, trimmed of its trailing newline.
    pub fn read(&self, logical: &str) -> io::Result<String> {
        self.note(logical, Access::File);
        let p = self.host_path(logical)?;
        let s = std::fs::read_to_string(p)?;
        Ok(s.trim_end_matches(['\n', '\0']).to_string())
    }

    /// The names in a directory, sorted.
    pub fn list(&self, logical: &str) -> io::Result<Vec<String>> {
        self.note(logical, Access::Dir);
        let p = self.host_path(logical)?;
        let mut names = Vec::new();
        for e in std::fs::read_dir(p)? {
            let e = e?;
            if let Some(n) = e.file_name().to_str() {
                names.push(n.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The logical path with every symlink resolved (like `realpath`, inside the root).
    pub fn resolve(&self, logical: &str) -> io::Result<String> {
        self.note(logical, Access::Resolve);
        resolve_in_root(&self.root, logical, &mut |_, _| Ok(()))
    }

    /// Whether the path exists (following symlinks).
    pub fn exists(&self, logical: &str) -> bool {
        self.note(logical, Access::Resolve);
        match self.host_path(logical) {
            Ok(p) => p.exists(),
            Err(_) => false,
        }
    }
}

fn join_logical(root: &Path, logical: &str) -> PathBuf {
    root.join(logical.trim_start_matches('/'))
}

/// One step of a resolution: a symlink met at `logical` pointing at `target`.
type OnLink<'a> = dyn FnMut(&str, &str) -> io::Result<()> + 'a;

/// Resolves `logical` component by component inside `root`, calling `on_link(link, target)` for every
/// symlink met. Absolute targets are taken relative to the root. Returns the resolved logical path.
fn resolve_in_root(root: &Path, logical: &str, on_link: &mut OnLink<'_>) -> io::Result<String> {
    let mut todo: Vec<String> = Vec::new();
    push_components(&mut todo, logical);
    let mut cur: Vec<String> = Vec::new();
    let mut links = 0usize;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                cur.pop();
                continue;
            }
            _ => {}
        }
        cur.push(c);
        let lp = format!("/{}", cur.join("/"));
        let hp = join_logical(root, &lp);
        let meta = match std::fs::symlink_metadata(&hp) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound && todo.is_empty() => {
                // The last component may be missing; the caller's open reports it.
                return Ok(lp);
            }
            Err(e) => return Err(e),
        };
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_LINKS {
                return Err(io::Error::other(format!(
                    "too many symbolic links resolving {logical}"
                )));
            }
            let target = std::fs::read_link(&hp)?;
            let t = target.to_string_lossy().to_string();
            on_link(&lp, &t)?;
            cur.pop();
            if t.starts_with('/') {
                cur.clear();
            }
            push_components(&mut todo, &t);
        }
    }
    Ok(format!("/{}", cur.join("/")))
}

/// Pushes the components of `path` so that popping yields them in order.
fn push_components(todo: &mut Vec<String>, path: &str) {
    let comps: Vec<String> = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().to_string()),
            Component::ParentDir => Some("..".to_string()),
            _ => None,
        })
        .collect();
    for c in comps.into_iter().rev() {
        todo.push(c);
    }
}

/// Relative form of an absolute link target, seen from the directory of `link` (both logical).
fn relative_target(link: &str, target: &str) -> String {
    if !target.starts_with('/') {
        return target.to_string();
    }
    let from: Vec<&str> = link
        .trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let from = &from[..from.len().saturating_sub(1)];
    let to: Vec<&str> = target
        .trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_string(); from.len() - common];
    parts.extend(to[common..].iter().map(|s| s.to_string()));
    if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    }
}

/// Copies the files `reader` recorded from its root into `dest`, recreating every symlink met on the
/// way as a relative link, so that a [`Reader`] on `dest` reads the same contents. Returns the number
/// of files copied. Files that could not be read on the source are skipped (a replay reads them as
/// missing).
pub fn capture(reader: &Reader, dest: &Path) -> std::io::Result<usize> {
    let root = reader.root().to_path_buf();
    std::fs::create_dir_all(dest)?;
    let mut copied = 0usize;
    // Tool outputs (live host only) become plain files at their logical paths.
    let synthetic = reader.synthetic()?;
    for (logical, content) in &synthetic {
        let dp = join_logical(dest, logical);
        if let Some(parent) = dp.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&dp, format!("{content}\n"))?;
        copied += 1;
    }
    for (logical, access) in reader.recorded()? {
        if synthetic.iter().any(|(l, _)| *l == logical) {
            continue;
        }
        let mut mk_link = |link: &str, target: &str| -> io::Result<()> {
            let dp = join_logical(dest, link);
            if std::fs::symlink_metadata(&dp).is_ok() {
                return Ok(());
            }
            if let Some(parent) = dp.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::os::unix::fs::symlink(relative_target(link, target), &dp)
        };
        let resolved = match resolve_in_root(&root, &logical, &mut mk_link) {
            Ok(r) => r,
            Err(_) => continue,
        };
        let src = join_logical(&root, &resolved);
        let dst = join_logical(dest, &resolved);
        let meta = match std::fs::metadata(&src) {
            Ok(m) => m,
            Err(_) => continue,
        };
        match access {
            Access::File if meta.is_file() => {
                if let Ok(bytes) = std::fs::read(&src) {
                    if let Some(parent) = dst.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    std::fs::write(&dst, bytes)?;
                    copied += 1;
                }
            }
            Access::Dir if meta.is_dir() => {
                std::fs::create_dir_all(&dst)?;
                // Keep the listing: recreate symlinked entries (their targets are captured when read)
                // and subdirectories; plain files appear when discovery reads them.
                for e in std::fs::read_dir(&src)?.flatten() {
                    let name = e.file_name();
                    let ep = src.join(&name);
                    let dp = dst.join(&name);
                    let Ok(m) = std::fs::symlink_metadata(&ep) else {
                        continue;
                    };
                    if m.file_type().is_symlink() {
                        if std::fs::symlink_metadata(&dp).is_err() {
                            let t = std::fs::read_link(&ep)?;
                            let child = format!(
                                "{}/{}",
                                resolved.trim_end_matches('/'),
                                name.to_string_lossy()
                            );
                            std::os::unix::fs::symlink(
                                relative_target(&child, &t.to_string_lossy()),
                                &dp,
                            )?;
                        }
                    } else if m.is_dir() {
                        std::fs::create_dir_all(&dp)?;
                    }
                }
            }
            Access::Resolve if meta.is_dir() => {
                std::fs::create_dir_all(&dst)?;
            }
            Access::Resolve if meta.is_file() && std::fs::symlink_metadata(&dst).is_err() => {
                if let Some(parent) = dst.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&dst, std::fs::read(&src).unwrap_or_default())?;
                copied += 1;
            }
            _ => {}
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "writes a temp dir on the host filesystem; Miri isolates it"
    )]
    fn a_poisoned_record_fails_closed() {
        let rd = Reader::recording(Path::new("/nonexistent"));
        rd.note("/a", Access::File);
        let _ = std::thread::scope(|s| {
            s.spawn(|| {
                let _g = rd.record.as_ref().map(|m| m.lock());
                panic!("poison the record");
            })
            .join()
        });
        rd.note("/b", Access::File); // skipped, not a panic
        let e = rd.recorded().unwrap_err();
        assert!(e.to_string().contains("read record lock poisoned"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        assert!(capture(&rd, dir.path()).is_err());
    }

    #[test]
    fn relative_targets() {
        assert_eq!(relative_target("/proc/self", "/proc/42"), "42");
        assert_eq!(
            relative_target("/sys/class/net/x", "/sys/devices/virtual/net/x"),
            "../../devices/virtual/net/x"
        );
        assert_eq!(relative_target("/a/b", "c/d"), "c/d");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "writes a temp dir on the host filesystem; Miri isolates it"
    )]
    fn resolves_links_inside_root_and_records() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("sys/devices/pci0000:00/0000:00:01.0/net/eth0")).unwrap();
        std::fs::write(
            r.join("sys/devices/pci0000:00/0000:00:01.0/net/eth0/mtu"),
            "9000\n",
        )
        .unwrap();
        std::fs::create_dir_all(r.join("sys/class/net")).unwrap();
        std::os::unix::fs::symlink(
            "../../devices/pci0000:00/0000:00:01.0/net/eth0",
            r.join("sys/class/net/eth0"),
        )
        .unwrap();
        std::fs::create_dir_all(r.join("proc/77")).unwrap();
        std::fs::write(r.join("proc/77/limits"), "x\n").unwrap();
        // An absolute link must stay inside the root.
        std::os::unix::fs::symlink("/proc/77", r.join("proc/self")).unwrap();

        let rd = Reader::recording(r);
        assert_eq!(rd.read("/sys/class/net/eth0/mtu").unwrap(), "9000");
        assert_eq!(
            rd.resolve("/sys/class/net/eth0/..").unwrap(),
            "/sys/devices/pci0000:00/0000:00:01.0/net"
        );
        assert_eq!(rd.read("/proc/self/limits").unwrap(), "x");
        assert!(rd.read("/sys/class/net/eth0/nope").is_err());
        assert!(rd.exists("/sys/class/net/eth0"));
        assert!(!rd.exists("/sys/module/nvidia_peermem"));

        let out = tempfile::tempdir().unwrap();
        let n = capture(&rd, out.path()).unwrap();
        assert_eq!(n, 2);
        let link = std::fs::read_link(out.path().join("sys/class/net/eth0")).unwrap();
        assert_eq!(
            link.to_str().unwrap(),
            "../../devices/pci0000:00/0000:00:01.0/net/eth0"
        );
        assert_eq!(
            std::fs::read_link(out.path().join("proc/self"))
                .unwrap()
                .to_str()
                .unwrap(),
            "77"
        );
        let replay = Reader::new(out.path());
        assert_eq!(replay.read("/sys/class/net/eth0/mtu").unwrap(), "9000");
        assert_eq!(replay.read("/proc/self/limits").unwrap(), "x");
    }
}
