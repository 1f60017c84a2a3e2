//! Which plugin and which NCCL this process runs: version, commit, and the SHA-256 of the loaded
//! plugin library and of the `libnccl` mapped in the process, found in `/proc/self/maps` (the files
//! the loader actually mapped, whatever `LD_LIBRARY_PATH` or `NCCL_NET_PLUGIN` said). Named in the
//! init INFO line and in every metrics snapshot, so `switchless nccl-tests summarize` and the
//! launchers' preflight can point at a rank that loaded something else.
//!
//! Hashed once per process (a few hundred MB of `libnccl` take well under a second with the CPU's
//! SHA instructions), on the first `init`.
#![forbid(unsafe_code)]

use std::io::Read as _;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::transport::metrics::Build;

/// This process's attestation (computed on the first call; `hash` false, `NCCL_SWITCHLESS_ATTEST=0`:
/// the files are not read and their digests say `off`).
pub fn build(hash: bool) -> Build {
    static BUILD: OnceLock<Build> = OnceLock::new();
    BUILD
        .get_or_init(|| {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
            // Any function of this library lies in its text mapping.
            let here = build as fn(bool) -> Build as usize;
            if hash {
                of(&maps, here, &|p| sha256_file(p))
            } else {
                of(&maps, here, &|_| Some("off".to_string()))
            }
        })
        .clone()
}

/// The attestation from a `/proc/<pid>/maps` text, the address of code of this library, and a
/// file hasher (`-` when a file cannot be read).
pub fn of(maps: &str, here: usize, hash: &dyn Fn(&str) -> Option<String>) -> Build {
    let plugin = mapped_file(maps, here).unwrap_or_default();
    let nccl = nccl_file(maps).unwrap_or_default();
    let h = |p: &str| {
        if p.is_empty() {
            "-".to_string()
        } else {
            hash(p).unwrap_or_else(|| "-".to_string())
        }
    };
    Build {
        version: crate::VERSION.to_string(),
        commit: crate::COMMIT.to_string(),
        plugin_sha256: h(&plugin),
        plugin_path: plugin,
        nccl_sha256: h(&nccl),
        nccl_path: nccl,
    }
}

/// One line of `/proc/<pid>/maps`: the address range and the file (empty for anonymous memory).
fn parse_line(line: &str) -> Option<(usize, usize, &str)> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let (a, b) = range.split_once('-')?;
    let start = usize::from_str_radix(a, 16).ok()?;
    let end = usize::from_str_radix(b, 16).ok()?;
    // perms, offset, dev, inode; then the path after padding.
    for _ in 0..4 {
        it.next()?;
    }
    let path = it.next().unwrap_or("").trim();
    Some((start, end, path))
}

/// The file mapped at `addr`, if a file is.
pub fn mapped_file(maps: &str, addr: usize) -> Option<String> {
    maps.lines()
        .filter_map(parse_line)
        .find(|&(s, e, p)| (s..e).contains(&addr) && p.starts_with('/'))
        .map(|(_, _, p)| p.to_string())
}

/// The `libnccl.so*` mapped in the process (not a `libnccl-net-*` plugin), if any.
pub fn nccl_file(maps: &str) -> Option<String> {
    maps.lines()
        .filter_map(parse_line)
        .map(|(_, _, p)| p)
        .find(|p| {
            p.starts_with('/')
                && p.rsplit('/')
                    .next()
                    .is_some_and(|base| base.starts_with("libnccl.so"))
        })
        .map(str::to_string)
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &str) -> Option<String> {
    // A library replaced on disk after it was loaded shows as `path (deleted)`: what is mapped is
    // no longer there to hash.
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Some(
        h.finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234   /usr/bin/all_reduce_perf
7f1000000000-7f1000200000 r-xp 00010000 08:01 555    /opt/nccl/lib/libnccl.so.2.30.7
7f2000000000-7f2000100000 r--p 00000000 08:01 777    /opt/plugins/libnccl-net-switchless.so
7f2000100000-7f2000400000 r-xp 00100000 08:01 777    /opt/plugins/libnccl-net-switchless.so
7f3000000000-7f3000001000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0      [stack]
";

    #[test]
    fn finds_the_library_at_an_address_and_the_nccl_beside_it() {
        assert_eq!(
            mapped_file(MAPS, 0x7f2000100abc).as_deref(),
            Some("/opt/plugins/libnccl-net-switchless.so")
        );
        assert_eq!(mapped_file(MAPS, 0x7f3000000010), None, "anonymous");
        assert_eq!(mapped_file(MAPS, 0x10), None);
        assert_eq!(
            nccl_file(MAPS).as_deref(),
            Some("/opt/nccl/lib/libnccl.so.2.30.7")
        );
        assert_eq!(nccl_file(&MAPS.replace("libnccl.so", "libfoo.so")), None);
        let b = of(MAPS, 0x7f2000100abc, &|p| Some(format!("h({p})")));
        assert_eq!(b.plugin_sha256, "h(/opt/plugins/libnccl-net-switchless.so)");
        assert_eq!(b.nccl_sha256, "h(/opt/nccl/lib/libnccl.so.2.30.7)");
        let none = of("", 1, &|_| Some("x".into()));
        assert_eq!(
            (none.plugin_sha256.as_str(), none.nccl_path.as_str()),
            ("-", "")
        );
        assert!(none.text().contains("nccl - sha256 -"));
    }

    #[test]
    fn hashes_a_file_as_sha256sum_does() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(p.to_str().unwrap()).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(sha256_file("/nonexistent/x"), None);
        // This test binary's own code is mapped from a file.
        let b = build(true);
        assert!(b.plugin_path.starts_with('/'), "{b:?}");
        assert_eq!(b.plugin_sha256.len(), 64);
    }

    /// `NCCL_SWITCHLESS_ATTEST=0`: no file is read, the digests say `off`.
    #[test]
    fn without_hashing_no_file_is_read() {
        let maps = "7f00-7f10 r-xp 00000000 08:01 42 /opt/p/libnccl-net-switchless.so\n\
                    7e00-7e10 r-xp 00000000 08:01 43 /opt/nccl/lib/libnccl.so.2\n";
        let b = of(maps, 0x7f05, &|_| Some("off".to_string()));
        assert_eq!(
            (b.plugin_sha256.as_str(), b.nccl_sha256.as_str()),
            ("off", "off")
        );
        assert!(b.text().contains("sha256 off"), "{}", b.text());
    }
}
