//! Every `--help` of the `switchless` binary explains itself: at least one example and the exit status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_help_has_an_example_and_the_exit_status() {
    for cmd in [
        &[][..],
        &["doctor"],
        &["plan"],
        &["route"],
        &["bench"],
        &["nccl-tests"],
        &["nccl-tests", "summarize"],
    ] {
        let text = help(cmd);
        assert!(
            text.contains("Example") || text.contains("A first day"),
            "{cmd:?} --help has no example:\n{text}"
        );
        assert!(
            text.contains("xit status"),
            "{cmd:?} --help does not give the exit status:\n{text}"
        );
        // Each example line names the binary, so it can be pasted.
        assert!(text.contains("  switchless "), "{cmd:?}:\n{text}");
    }
}

#[test]
fn units_are_accepted_in_the_forms_the_help_writes() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_switchless"))
            .args(args)
            .output()
            .unwrap()
    };
    // bench: sizes with K/M/G and durations with a unit; a loopback run needs no network.
    let out = run(&[
        "bench",
        "latency",
        "--loopback",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "1",
        "-w",
        "0",
        "--timeout",
        "10s",
        "--no-progress",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1024"));
    let out = run(&[
        "bench",
        "latency",
        "--loopback",
        "--timeout",
        "1h",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1",
        "-w",
        "0",
        "--no-progress",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["bench", "latency", "-b", "1MB"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ambiguous"));
    // plan --mtu 9k is 9216 bytes (K is 1024 everywhere).
    let cables = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/plan/b300-2node.cables"
    );
    let out = run(&["plan", cables, "--mtu", "9k"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("MTU 9216 bytes"));
    // route: the peer can be given two ways, and both are named when neither is.
    let out = run(&["route"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--peer-root") && err.contains("--peer <"),
        "{err}"
    );
    let out = run(&["route", "--peer", "10.1.1.2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("e.g. 10.1.1.2/30"));
}

#[test]
fn every_subcommand_found_by_walking_the_cli_has_an_example() {
    // Walks clap's definition, so a subcommand added later is checked without editing this test.
    let commands = switchless::tools::cli::reference::commands();
    assert!(commands.len() >= 7, "{}", commands.len());
    for (path, _) in commands {
        let text = help(&path[1..].iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            text.contains("\nExample"),
            "`{}` --help has no Example section:\n{text}",
            path.join(" ")
        );
    }
}

#[test]
fn no_arguments_print_the_overview_and_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .output()
        .unwrap();
    // Exit 2 as clap gives for a missing subcommand; the overview goes to stderr like clap's usage.
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8(out.stderr).unwrap();
    for sub in ["doctor", "plan", "route", "bench", "nccl-tests"] {
        assert!(
            text.contains(&format!("  {sub} ")),
            "{sub} missing:\n{text}"
        );
    }
    assert!(text.contains("NCCL_NET_PLUGIN="), "{text}");
    assert!(text.contains("libnccl-net-switchless.so"), "{text}");
}

#[test]
fn bench_comm_id_takes_decimal_or_hex_and_refuses_the_rest() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_switchless"))
            .args(args)
            .output()
            .unwrap()
    };
    for bad in ["0", "abc", "0x", "-5", "18446744073709551616"] {
        let out = run(&[
            "bench",
            "latency",
            &format!("--comm-id={bad}"),
            "--bootstrap",
            "127.0.0.1:1",
        ]);
        assert_eq!(out.status.code(), Some(2), "--comm-id {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--comm-id") && err.contains("accepted: a communicator id from 1 to"),
            "--comm-id {bad}: {err}"
        );
    }
    // An id means a plugin run: with --loopback (no plugin) it is a usage error.
    let out = run(&["bench", "latency", "--loopback", "--comm-id", "0x5357beef"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}
