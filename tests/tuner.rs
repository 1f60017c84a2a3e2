//! The tuner tables of the built library, loaded the way NCCL loads them: `tests/c/nccl_tuner_loader.c`
//! (compiled here with the system C compiler) opens the net plugin by `NCCL_NET_PLUGIN=switchless`, then the
//! tuner from `NCCL_TUNER_PLUGIN`, `libnccl-tuner.so` or the net plugin's library as NCCL 2.21+ does, takes
//! NCCL's symbol (or the version asked for), and calls init, getCollInfo and destroy/finalize.
//!
//! Here the net plugin has no device (`NCCL_SWITCHLESS_TRANSPORT=rdma` on a host without RDMA), so every
//! version must leave NCCL's choices alone and say why; `.ci/steps/33-tuner.sh` gives the plugin cables in a
//! network namespace and checks the decisions end to end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn so_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libswitchless.so");
    assert!(
        p.exists(),
        "{} not found: cargo test builds the cdylib into deps/",
        p.display()
    );
    p
}

/// A directory with the library as `libnccl-net-switchless.so` and the compiled loader.
fn rig() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(so_path(), dir.path().join("libnccl-net-switchless.so")).unwrap();
    let loader = dir.path().join("loader");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("tests/c/nccl_tuner_loader.c"))
        .arg("-o")
        .arg(&loader)
        .arg("-ldl")
        .output()
        .expect("a C compiler (cc) is required");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, loader)
}

fn run(dir: &Path, loader: &Path, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(loader);
    cmd.env_clear()
        .env("LD_LIBRARY_PATH", dir)
        .env("NCCL_NET_PLUGIN", "switchless")
        .env("NCCL_SWITCHLESS_TRANSPORT", "rdma")
        .env("NCCL_DEBUG", "INFO")
        .env("SWL_NRANKS", "32")
        .env("SWL_NNODES", "4");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "loader {env:?} exited {:?}: {text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn calls(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("call ")).collect()
}

/// Every call returned success and left NCCL's pick.
fn untouched(text: &str) {
    let c = calls(text);
    assert_eq!(c.len(), 6, "{text}");
    for l in c {
        assert!(l.contains(" rc=0 "), "{l}");
        let nccl = l.split(" nccl=").nth(1).unwrap().split(' ').next().unwrap();
        assert!(l.contains(&format!(" pick={nccl} ")), "{l}");
        assert!(l.contains(" nch=0 "), "{l}");
    }
    assert!(text.contains("tuner finalize=0"), "{text}");
}

#[test]
fn every_version_loads_from_the_net_plugins_library_and_changes_nothing_without_cables() {
    let (dir, loader) = rig();
    for v in ["0", "1", "2", "3", "4", "5", "6"] {
        let text = run(dir.path(), &loader, &[("SWL_TUNER_VERSION", v)]);
        let want = if v == "0" { "6" } else { v };
        assert!(
            text.contains(&format!(
                "symbol=ncclTunerPlugin_v{want} name=switchless init=0"
            )),
            "v{v}: {text}"
        );
        assert!(
            text.contains("libnccl-net-switchless.so"),
            "found through the net plugin: {text}"
        );
        untouched(&text);
        let why = if v == "1" {
            "v1 interface has no per-communicator context"
        } else {
            "no switchless net plugin is open"
        };
        assert!(
            text.lines()
                .any(|l| l.starts_with("log INFO 41 ") && l.contains(why)),
            "v{v}: one INFO line (INIT|TUNING) saying why: {text}"
        );
        assert!(
            !text.contains("log WARN") || text.contains("no RDMA"),
            "v{v}: {text}"
        );
    }
}

#[test]
fn the_users_tuner_and_algorithm_choices_win() {
    let (dir, loader) = rig();
    // NCCL_TUNER_PLUGIN=none: NCCL loads no tuner.
    let text = run(dir.path(), &loader, &[("NCCL_TUNER_PLUGIN", "none")]);
    assert!(text.contains("tuner none"), "{text}");
    // Another tuner that NCCL cannot load: it falls back to the net plugin's library; this tuner stands down.
    let text = run(dir.path(), &loader, &[("NCCL_TUNER_PLUGIN", "my-tuner")]);
    untouched(&text);
    assert!(
        text.contains("NCCL_TUNER_PLUGIN=my-tuner names another tuner"),
        "{text}"
    );
    // This library named explicitly (NCCL 2.19/2.20 find a tuner only this way).
    let text = run(
        dir.path(),
        &loader,
        &[("NCCL_TUNER_PLUGIN", "libnccl-net-switchless.so")],
    );
    assert!(
        text.contains("symbol=ncclTunerPlugin_v6 name=switchless init=0"),
        "{text}"
    );
    assert!(text.contains("no switchless net plugin is open"), "{text}");
    // NCCL_ALGO / NCCL_PROTO set: the user's choice.
    for (k, v) in [("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "Simple")] {
        let text = run(dir.path(), &loader, &[(k, v)]);
        untouched(&text);
        assert!(
            text.contains(&format!("{k}={v} is set: the user's choice wins")),
            "{text}"
        );
    }
    // NCCL_SWITCHLESS_TUNER=0.
    let text = run(dir.path(), &loader, &[("NCCL_SWITCHLESS_TUNER", "0")]);
    untouched(&text);
    assert!(text.contains("NCCL_SWITCHLESS_TUNER=0"), "{text}");
}
