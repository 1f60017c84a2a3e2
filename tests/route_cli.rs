//! `switchless route` on the fabric fixtures (kernel-file trees of real host layouts).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn route(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .arg("route")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const GB10: &str = "tests/fixtures/fabric/gb10-1cable";
const B300: &str = "tests/fixtures/fabric/b300-2node";

#[test]
fn gb10_one_cable_uses_both_pcie_functions() {
    let (rc, out, err) = route(&[
        "--root",
        GB10,
        "--peer",
        "192.168.100.11/24,192.168.101.11/24",
        "--dev",
        "0",
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.starts_with(
            "2 paths to the peer (192.168.100.11/24, 192.168.101.11/24), as the plugin chooses"
        ),
        "{out}"
    );
    assert!(
        out.contains("enP2p1s0f0np0 192.168.101.10/24") && out.contains("-> 192.168.101.11 (RoCE)"),
        "{out}"
    );
    assert!(
        out.contains("enp1s0f0np0 192.168.100.10/24") && out.contains("-> 192.168.100.11 (RoCE)"),
        "{out}"
    );
    assert!(
        out.contains("PCIe root pci0002:00") && out.contains("PCIe root pci0000:00"),
        "{out}"
    );
}

#[test]
fn json_output_has_the_paths() {
    let (rc, out, err) = route(&[
        "--root",
        GB10,
        "--peer",
        "192.168.100.11/24,192.168.101.11/24",
        "--json",
    ]);
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let paths = v["selection"]["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 2);
    let remotes: Vec<&str> = paths
        .iter()
        .map(|p| p["remote"]["addr"].as_str().unwrap())
        .collect();
    assert!(
        remotes.contains(&"192.168.100.11/24") && remotes.contains(&"192.168.101.11/24"),
        "{remotes:?}"
    );
    assert_eq!(paths[0]["kind"], "roce");
}

#[test]
fn b300_nccl_device_override_is_explained() {
    // Find which address NCCL device 0 holds, then ask for a peer reachable only through another card.
    let (rc, out, _) = route(&[
        "--root",
        B300,
        "--peer",
        "10.112.1.2/30,10.112.9.2/30",
        "--dev",
        "0",
        "--json",
    ]);
    assert_eq!(rc, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let paths = v["selection"]["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 1);
    let dev0_remote = paths[0]["remote"]["addr"].as_str().unwrap().to_string();
    let other = if dev0_remote == "10.112.1.2/30" {
        "10.112.9.2/30"
    } else {
        "10.112.1.2/30"
    };
    let (rc, out, err) = route(&["--root", B300, "--peer", other, "--dev", "0"]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("NCCL device 0 overridden: NCCL chose device 0"),
        "{out}"
    );
}

#[test]
fn unreachable_peer_fails_with_exit_1_and_the_same_host_loops_back() {
    let (rc, out, err) = route(&["--root", B300, "--peer", "10.200.0.2/30"]);
    assert_eq!(rc, 1);
    assert!(out.is_empty());
    assert!(
        err.contains("no local link reaches the peer: it advertises 10.200.0.2/30 (Roce)"),
        "{err}"
    );
    assert!(err.contains("10.112.1.0/30 on eno6np0 (Roce, up)"), "{err}");
    // Two ranks of one host: a loopback on every link (RoCE to the port's own GID).
    let (rc, out, err) = route(&["--root", GB10, "--peer-root", GB10]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("the peer is this host: every path is a loopback"),
        "{out}"
    );
    let (rc, out, _) = route(&["--root", GB10, "--peer-root", GB10, "--json"]);
    assert_eq!(rc, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["selection"]["same_host"], true);
    for p in v["selection"]["paths"].as_array().unwrap() {
        assert_eq!(
            p["local"]["addr"].as_str().unwrap().split('/').next(),
            p["remote"]["addr"].as_str().unwrap().split('/').next(),
            "{p}"
        );
    }
}

#[test]
fn peer_is_required() {
    let (rc, _, err) = route(&["--root", GB10]);
    assert_eq!(rc, 2);
    assert!(err.contains("--peer"), "{err}");
}

#[test]
fn routed_takes_the_default_route_only_when_asked() {
    // A peer on no local subnet: on-link routing refuses it; --routed follows the fixture's default
    // route (via 192.168.10.1 on the management NIC eno1) as TCP.
    let peer = ["--root", B300, "--peer", "10.250.0.2/30", "--kinds", "tcp"];
    let (rc, _, err) = route(&peer);
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("no local link reaches the peer"), "{err}");
    let (rc, out, err) = route(&[&peer[..], &["--routed"]].concat());
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.starts_with("1 path to the peer (10.250.0.2/30), TCP pairs only (--kinds):"),
        "{out}"
    );
    assert!(
        out.contains("eno1 ") && out.contains("-> 10.250.0.2 via 192.168.10.1 (TCP)"),
        "{out}"
    );
    assert!(out.contains("0.0.0.0/0 via 192.168.10.1 dev eno1"), "{out}");
    // RoCE is never routed.
    let (rc, _, err) = route(&[
        "--root",
        B300,
        "--peer",
        "10.250.0.2/30",
        "--kinds",
        "roce",
        "--routed",
    ]);
    assert_eq!(rc, 1);
    assert!(err.contains("RoCE needs a cable"), "{err}");
}

const TCP: &str = "tests/fixtures/fabric/tcp-2link";

/// By default `route` shows what the plugin would do: a workstation's management /24 reaches the
/// peer too, but it is no data path (listed under "not used" with the reason); `--kinds any` still
/// shows every pair. TCP paths show the netdev MTU, not "MTU 0 B".
#[test]
fn the_default_is_the_plugins_choice() {
    let peer = ["--root", TCP, "--peer", "192.168.10.22/24,10.10.0.2/30"];
    let (rc, out, err) = route(&peer);
    assert_eq!(rc, 0, "{err}");
    assert!(out.starts_with("1 path to the peer"), "{out}");
    assert!(
        out.contains("path 0: enp65s0f0 10.10.0.1/30 (NCCL dev 0, PCIe root pci0000:40/0000:40:01.1, MTU 9000 bytes) -> 10.10.0.2 (TCP)"),
        "{out}"
    );
    assert!(!out.contains("MTU 0"), "{out}");
    assert!(
        out.contains(
            "not used:\n  eno1 192.168.10.11/24 -> 192.168.10.22: a /24 subnet is not a data path"
        ),
        "{out}"
    );
    let (rc, out, _) = route(&[&peer[..], &["--kinds", "any"]].concat());
    assert_eq!(rc, 0);
    assert!(out.starts_with("2 paths to the peer"), "{out}");
    // With the fallback on (as the plugin with NCCL_SWITCHLESS_TCP_FALLBACK=1) the /24 is no longer
    // said to be unused when no cable reaches the peer.
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(["route", "--root", TCP, "--peer", "192.168.10.22/24"])
        .env("NCCL_SWITCHLESS_TCP_FALLBACK", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("eno1 192.168.10.11/24") && text.contains("TCP fallback on"),
        "{text}"
    );
    // An environment the plugin refuses is a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(["route", "--root", TCP, "--peer", "10.10.0.2/30"])
        .env("NCCL_SWITCHLESS_TRANSPORT", "ib")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// `--dev` takes the device name doctor prints, or its index; a wrong one lists the devices.
#[test]
fn dev_by_name_or_index() {
    let peer = ["--root", TCP, "--peer", "10.10.0.6/30"];
    let (rc, by_name, err) = route(&[&peer[..], &["--dev", "sl_enp65s0f1"]].concat());
    assert_eq!(rc, 0, "{err}");
    let (_, by_index, _) = route(&[&peer[..], &["--dev", "1"]].concat());
    assert_eq!(by_name, by_index);
    let (rc, _, err) = route(&[&peer[..], &["--dev", "sl_eth9"]].concat());
    assert_eq!(rc, 2);
    assert!(
        err.contains("--dev sl_eth9: no NCCL device")
            && err.contains("0 sl_enp65s0f0, 1 sl_enp65s0f1"),
        "{err}"
    );
}

/// No path: the reason reads as a list, one local subnet per line.
#[test]
fn no_path_error_is_a_list() {
    let (rc, _, err) = route(&["--root", B300, "--peer", "10.200.0.2/30"]);
    assert_eq!(rc, 1);
    assert!(err.lines().count() >= 17, "{err}");
    assert!(err.lines().all(|l| l.len() < 200), "{err}");
    assert!(
        err.contains("\n      10.112.1.0/30 on eno6np0 (Roce, up)\n"),
        "{err}"
    );
}
