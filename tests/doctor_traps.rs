//! The traps DGX Spark and B300 owners report, as doctor findings from fixture trees (gen.py's
//! `trap-*`): each read from kernel files or captured tool outputs, each with its remedy, and each
//! kept by `--capture` so that the replay finds it again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fabric")
        .join(name)
}

/// `switchless doctor --json --root ROOT` in exactly `env`: (exit status, JSON).
fn doctor(root: &Path, env: &[(&str, &str)]) -> (i32, serde_json::Value) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_switchless"));
    c.env_clear().args(["doctor", "--json", "--root"]).arg(root);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

/// The (check, object, severity) of every finding that is not an info about an unused port or a
/// management NIC (which every GB10 fixture has).
fn notable(v: &serde_json::Value) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            !(f["severity"] == "info"
                && (f["check"] == "link-down" || f["check"] == "address-without-rdma"))
        })
        .map(|f| {
            (
                f["check"].as_str().unwrap().to_string(),
                f["object"].as_str().unwrap().to_string(),
                f["severity"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn one<'a>(v: &'a serde_json::Value, check: &str) -> &'a serde_json::Value {
    let all: Vec<_> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check)
        .collect();
    assert_eq!(all.len(), 1, "{check}: {v:#}");
    all[0]
}

fn s<'a>(f: &'a serde_json::Value, k: &str) -> &'a str {
    f[k].as_str().unwrap()
}

/// Captures `name` with `--capture`, then replays the capture: the same notable findings.
fn replays(name: &str, files: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("cap");
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .env_clear()
        .args(["doctor", "--json", "--root"])
        .arg(fixture(name))
        .arg("--capture")
        .arg(&cap)
        .output()
        .unwrap();
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for f in files {
        assert!(cap.join(f).is_file(), "{name}: the capture lacks {f}");
    }
    let (_, b) = doctor(&cap, &[]);
    assert_eq!(notable(&a), notable(&b), "{name}");
}

#[test]
fn ipv6_privacy_addresses_move_the_gid_index() {
    let (rc, v) = doctor(&fixture("trap-ipv6-gid-index"), &[]);
    assert_eq!(rc, 1);
    let t = |c: &str, o: &str, sv: &str| (c.to_string(), o.to_string(), sv.to_string());
    assert_eq!(
        notable(&v),
        [
            t("gid-index-differs", "host", "info"),
            t("ipv6-temporary-address", "netdev enP2p1s0f0np0", "warning"),
        ]
    );
    let f = one(&v, "ipv6-temporary-address");
    assert!(
        s(f, "message").contains("2001:db8:100:0:9c3e:21d4:77a0:15b8, use_tempaddr=2"),
        "{f}"
    );
    assert!(
        s(f, "message").contains("now roceP2p1s0f0 port 1 GID 7"),
        "{f}"
    );
    assert!(
        s(f, "remedy").starts_with("sysctl -w net.ipv6.conf.enP2p1s0f0np0.use_tempaddr=0"),
        "{f}"
    );
    assert!(s(f, "remedy").contains("--format sysctl"), "{f}");
    let f = one(&v, "gid-index-differs");
    assert!(
        s(f, "message").contains("7 on roceP2p1s0f0 port 1, 3 on roceP2p1s0f1 port 1"),
        "{f}"
    );
    // The global index some guides set gives that function an IPv6 GID: the job would hang there.
    let (rc, v) = doctor(
        &fixture("trap-ipv6-gid-index"),
        &[("NCCL_IB_GID_INDEX", "3")],
    );
    assert_eq!(rc, 2);
    let f = one(&v, "ib-gid-index-wrong");
    assert!(
        s(f, "message").contains(
            "roceP2p1s0f0 port 1: GID 3 is the IPv6 address 2001:db8:100:0:4ebb:47ff:fea1:b2c2; its IPv4 RoCE v2 GID is 7"
        ),
        "{f}"
    );
    assert!(!s(f, "message").contains("rocep1s0f0 port 1:"), "{f}");
    replays(
        "trap-ipv6-gid-index",
        &[
            "proc/4242/net/if_inet6",
            "proc/sys/net/ipv6/conf/enP2p1s0f0np0/use_tempaddr",
        ],
    );
}

#[test]
fn a_slot_without_power_throttles_the_nic() {
    let (rc, v) = doctor(&fixture("trap-slot-power"), &[]);
    assert_eq!(rc, 1);
    assert_eq!(
        notable(&v),
        [(
            "pcie-slot-power".to_string(),
            "pci 0000:01:00.0".to_string(),
            "warning".to_string()
        )]
    );
    let f = one(&v, "pcie-slot-power");
    assert!(
        s(f, "message").contains("lspci -vv shows SlotPowerLimit 0W"),
        "{f}"
    );
    assert!(
        s(f, "message").contains("Detected insufficient power on the PCIe slot (27W)"),
        "{f}"
    );
    assert!(s(f, "remedy").contains("unplug it for 30 s"), "{f}");
    replays("trap-slot-power", &["lspci-vv/0000:01:00.0", "dmesg"]);
}

#[test]
fn old_firmware_reports_pcie_gen1_x1() {
    let (rc, v) = doctor(&fixture("trap-pcie-gen1-x1"), &[]);
    assert_eq!(rc, 1);
    // One finding for the function (not also pcie-link-degraded).
    assert_eq!(
        notable(&v),
        [(
            "pcie-gen1-x1".to_string(),
            "pci 0000:01:00.0".to_string(),
            "warning".to_string()
        )]
    );
    let f = one(&v, "pcie-gen1-x1");
    assert!(s(f, "remedy").contains("NCCL_TOPO_FILE"), "{f}");
    replays("trap-pcie-gen1-x1", &[]);
}

#[test]
fn network_manager_dhcp_on_a_cabled_port() {
    let (rc, v) = doctor(&fixture("trap-nm-dhcp"), &[]);
    assert_eq!(rc, 1);
    // Only the cabled fabric port: the management NIC's profile and the unmanaged function are fine.
    assert_eq!(
        notable(&v),
        [(
            "nm-manages-fabric-port".to_string(),
            "netdev enp1s0f0np0".to_string(),
            "warning".to_string()
        )]
    );
    let f = one(&v, "nm-manages-fabric-port");
    assert!(
        s(f, "message").contains("profile \"Wired connection 1\""),
        "{f}"
    );
    assert!(
        s(f, "remedy").starts_with("nmcli device set enp1s0f0np0 managed no"),
        "{f}"
    );
    assert!(
        s(f, "remedy").contains("unmanaged-devices=interface-name:enp1s0f0np0"),
        "{f}"
    );
    replays("trap-nm-dhcp", &["nmcli-device"]);
}

#[test]
fn a_preloaded_nccl_shim_wins_over_the_programs_nccl() {
    // The tree keeps the environment it was captured in: LD_PRELOAD names a libnccl.
    let (rc, v) = doctor(&fixture("trap-nccl-shim"), &[]);
    assert_eq!(rc, 1);
    let f = one(&v, "nccl-shim");
    assert_eq!(s(f, "severity"), "warning");
    assert!(
        s(f, "message").contains("/opt/nccl-shim/libnccl.so.2.27.3 (LD_PRELOAD)"),
        "{f}"
    );
    assert!(
        s(f, "message").contains("Duplicate NCCL runtime found"),
        "{f}"
    );
    assert!(s(f, "remedy").starts_with("unset LD_PRELOAD"), "{f}");
    // In a live shell: LD_PRELOAD and a libnccl in an LD_LIBRARY_PATH directory.
    let lib = tempfile::tempdir().unwrap();
    std::fs::write(lib.path().join("libnccl.so.2"), "").unwrap();
    let (_, v) = doctor(
        &fixture("gb10-1cable"),
        &[
            ("LD_PRELOAD", "/opt/x/libnccl.so.2.28.3"),
            ("LD_LIBRARY_PATH", lib.path().to_str().unwrap()),
        ],
    );
    let shims: Vec<(&str, &str)> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "nccl-shim")
        .map(|f| (s(f, "object"), s(f, "severity")))
        .collect();
    assert_eq!(
        shims,
        [("LD_PRELOAD", "warning"), ("LD_LIBRARY_PATH", "info")]
    );
    replays("trap-nccl-shim", &["switchless/environment.json"]);
}

#[test]
fn no_gpu_direct_path_without_nvidia_peermem() {
    let (rc, v) = doctor(&fixture("trap-peermem"), &[]);
    assert_eq!(rc, 1);
    let f = one(&v, "peermem-missing");
    assert_eq!(s(f, "severity"), "warning");
    assert!(s(f, "message").contains("the proprietary one"), "{f}");
    assert!(s(f, "remedy").starts_with("modprobe nvidia-peermem"), "{f}");
    // GB10 shares host memory with its GPU: no GPU-direct expected, no finding.
    let (_, v) = doctor(&fixture("gb10-2cable"), &[]);
    assert!(
        !v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["check"] == "peermem-missing")
    );
    replays(
        "trap-peermem",
        &["proc/driver/nvidia/version", "proc/sys/kernel/osrelease"],
    );
}

#[test]
fn every_trap_is_on_the_findings_page() {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference/doctor-findings.md"),
    )
    .unwrap();
    for id in [
        "arp-flux-risk",
        "gid-index-differs",
        "ib-gid-index-wrong",
        "ipv6-temporary-address",
        "pcie-slot-power",
        "pcie-gen1-x1",
        "nm-manages-fabric-port",
        "nccl-shim",
        "peermem-missing",
        "probe-no-answer",
        "cable-miswired",
        "arp-flux",
    ] {
        assert!(
            page.contains(&format!("`{id}`")),
            "{id} is not on the findings page"
        );
    }
}
