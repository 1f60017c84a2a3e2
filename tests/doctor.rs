//! `switchless doctor` on the fixture trees: every finding by check id, object and severity, the exit
//! status, the JSON schema, and `--capture` replaying to the same report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use switchless::findings::Severity::{self, Error, Info, Warning};
use switchless::host;
use switchless::tools::doctor;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fabric")
        .join(name)
}

fn findings(name: &str) -> (Vec<(String, String, Severity)>, u8) {
    let (m, f) = host::discover(&fixture(name));
    let devs = m.nccl_devices(&|_, _| true, &|_| false);
    let r = doctor::report(&m, &devs, f);
    let mut v: Vec<_> = r
        .findings
        .iter()
        .map(|f| (f.check.clone(), f.object.clone(), f.severity))
        .collect();
    v.sort();
    (v, r.exit_status)
}

fn want(list: &[(&str, &str, Severity)]) -> Vec<(String, String, Severity)> {
    let mut v: Vec<_> = list
        .iter()
        .map(|(c, o, s)| (c.to_string(), o.to_string(), *s))
        .collect();
    v.sort();
    v
}

/// Findings every GB10 one-cable variant has: the uncabled QSFP port 1 and the management NIC.
const GB10_BASE: &[(&str, &str, Severity)] = &[
    ("link-down", "netdev enp1s0f1np1", Info),
    ("link-down", "netdev enP2p1s0f1np1", Info),
    ("address-without-rdma", "netdev enP7s7", Info),
];

fn gb10_with(extra: &[(&str, &str, Severity)]) -> Vec<(String, String, Severity)> {
    let mut v = GB10_BASE.to_vec();
    v.extend_from_slice(extra);
    want(&v)
}

#[test]
fn clean_hosts_exit_zero() {
    let (f, s) = findings("gb10-1cable");
    assert_eq!(f, gb10_with(&[]));
    assert_eq!(s, 0);

    let (f, s) = findings("gb10-2cable");
    assert_eq!(f, want(&[("address-without-rdma", "netdev enP7s7", Info)]));
    assert_eq!(s, 0);

    let (f, s) = findings("b300-2node");
    assert_eq!(f, want(&[("address-without-rdma", "netdev eno1", Info)]));
    assert_eq!(s, 0);

    // Cables 7 and 8 of server 1 are unused in the 4-node plan: cards 1 and 2.
    let (f, s) = findings("b300-4node");
    assert_eq!(
        f,
        want(&[
            ("address-without-rdma", "netdev eno1", Info),
            ("link-down", "netdev eno12np0", Info),
            ("link-down", "netdev enp57s0f1np1", Info),
            ("link-down", "netdev eno13np0", Info),
            ("link-down", "netdev enp95s0f1np1", Info),
        ])
    );
    assert_eq!(s, 0);
}

#[test]
fn real_soft_roce_capture_before_traffic() {
    // Captured right after the rxe devices came up: nothing in the neighbour table yet.
    let (f, s) = findings("captured/rxe-2vm-node0");
    assert_eq!(
        f,
        want(&[
            ("no-neighbour", "netdev eth0", Warning),
            ("no-neighbour", "netdev eth1", Warning),
        ])
    );
    assert_eq!(s, 1);
}

#[test]
fn mtu_1500_trap() {
    let (f, s) = findings("broken-mtu1500");
    assert_eq!(
        f,
        gb10_with(&[
            ("mtu-below-4200", "netdev enp1s0f0np0", Warning),
            ("mtu-below-4200", "netdev enP2p1s0f0np0", Warning),
        ])
    );
    assert_eq!(s, 1);
    let (m, _) = host::discover(&fixture("broken-mtu1500"));
    assert_eq!(m.rdma_port("rocep1s0f0", 1).unwrap().1.active_mtu, 1024);
}

#[test]
fn two_functions_in_one_subnet() {
    let (f, s) = findings("broken-same-subnet");
    assert_eq!(
        f,
        gb10_with(&[("same-subnet", "subnet 192.168.100.0/24", Error)])
    );
    assert_eq!(s, 2);
}

#[test]
fn overlapping_prefixes_blame_the_wider_netdev() {
    // enP2p1s0f0np0 holds 192.168.100.12/23, over enp1s0f0np0's 192.168.100.0/24. Its GID names it
    // as the holder (the narrower connected route does not make it enp1s0f0np0's too), and the
    // overlap is an error even without a plan.
    let (f, s) = findings("broken-overlap");
    assert_eq!(
        f,
        gb10_with(&[("same-subnet", "netdev enP2p1s0f0np0", Error)])
    );
    assert_eq!(s, 2);
    let (m, _) = host::discover(&fixture("broken-overlap"));
    let addrs = |n: &str| -> Vec<String> {
        m.netdev(n)
            .unwrap()
            .addrs
            .iter()
            .map(|a| a.addr.to_string())
            .collect()
    };
    assert_eq!(addrs("enp1s0f0np0"), ["192.168.100.10/24"]);
    assert_eq!(addrs("enP2p1s0f0np0"), ["192.168.100.12/23"]);
    let live = switchless::tools::plan::LiveIface::from_model(&m);
    let held = live.iter().find(|i| i.name == "enp1s0f0np0").unwrap();
    assert_eq!(held.addrs.len(), 1, "{held:?}");
}

#[test]
fn link_local_gids_only() {
    let (f, s) = findings("broken-link-local-gid");
    assert_eq!(
        f,
        // One finding per port: the idle half of the cable is said in the GID finding.
        gb10_with(&[("no-ipv4-roce-v2-gid", "roceP2p1s0f0 port 1", Warning)])
    );
    assert_eq!(s, 1);
    let (m, f) = host::discover(&fixture("broken-link-local-gid"));
    let r = doctor::report(&m, &m.nccl_devices(&|_, _| true, &|_| false), f);
    let g = r
        .findings
        .iter()
        .find(|f| f.check == "no-ipv4-roce-v2-gid")
        .unwrap();
    assert!(g.message.contains("only link-local GIDs"), "{}", g.message);
    assert!(
        g.message
            .contains("serves the same cable as rocep1s0f0 port 1"),
        "{}",
        g.message
    );
    // No placeholder to fill in: a command, and where the address comes from.
    assert!(!g.remedy.contains('<'), "{}", g.remedy);
    assert!(
        g.remedy
            .starts_with("ip link set dev enP2p1s0f0np0 up mtu 9000   # then its own /30"),
        "{}",
        g.remedy
    );
}

#[test]
fn second_pcie_function_idle() {
    let (f, s) = findings("broken-half-idle");
    assert_eq!(
        f,
        // The idle function is one finding (its link-down info is folded in).
        gb10_with(&[("multihost-function-idle", "roceP2p1s0f0 port 1", Warning)])
    );
    assert_eq!(s, 1);
}

#[test]
fn pcie_gen5_x2_instead_of_x4() {
    let (f, s) = findings("broken-pcie-x2");
    assert_eq!(
        f,
        gb10_with(&[
            ("pcie-link-degraded", "pci 0002:01:00.0", Warning),
            ("pcie-link-degraded", "pci 0002:01:00.1", Warning),
        ])
    );
    assert_eq!(s, 1);
}

#[test]
fn memlock_too_low() {
    let (f, s) = findings("broken-memlock");
    assert_eq!(
        f,
        gb10_with(&[("memlock-low", "process RLIMIT_MEMLOCK", Error)])
    );
    assert_eq!(s, 2);
}

#[test]
fn addressed_link_without_carrier() {
    let (f, s) = findings("broken-no-carrier");
    assert_eq!(
        f,
        // One finding: the cable fault, saying that half the cable idles (no "add an address": it has one).
        gb10_with(&[("link-down", "netdev enp1s0f0np0", Warning)])
    );
    assert_eq!(s, 1);
    let (m, f) = host::discover(&fixture("broken-no-carrier"));
    let r = doctor::report(&m, &m.nccl_devices(&|_, _| true, &|_| false), f);
    let g = r.findings.iter().find(|f| f.check == "link-down").unwrap();
    assert!(g.message.contains("serves the same cable"), "{}", g.message);
    assert!(
        g.remedy
            .starts_with("ip link set dev enp1s0f0np0 up; ethtool enp1s0f0np0"),
        "{}",
        g.remedy
    );
    assert!(!g.remedy.contains("ip addr add"), "{}", g.remedy);
}

#[test]
fn mellanox_netdev_with_address_but_no_rdma() {
    let (f, s) = findings("broken-address-without-rdma");
    assert_eq!(
        f,
        want(&[
            ("link-down", "netdev enP2p1s0f1np1", Info),
            ("address-without-rdma", "netdev enP7s7", Info),
            ("address-without-rdma", "netdev enp1s0f1np1", Warning),
        ])
    );
    assert_eq!(s, 1);
}

#[test]
fn subnet_with_no_other_host() {
    let (f, s) = findings("broken-no-neighbour");
    assert_eq!(
        f,
        gb10_with(&[("no-neighbour", "netdev enP2p1s0f0np0", Warning)])
    );
    assert_eq!(s, 1);
}

#[test]
fn no_neighbour_remedy_names_the_cable_peer() {
    let remedies = |name: &str| -> Vec<(String, String)> {
        let (m, f) = host::discover(&fixture(name));
        let r = doctor::report(&m, &m.nccl_devices(&|_, _| true, &|_| false), f);
        let mut v: Vec<_> = r
            .findings
            .iter()
            .filter(|f| f.check == "no-neighbour")
            .map(|f| (f.object.clone(), f.remedy.clone()))
            .collect();
        v.sort();
        v
    };
    // The rxe capture: 10.100.4.1/30 and 10.100.8.1/30, so each cable has exactly one peer to ping.
    let r = remedies("captured/rxe-2vm-node0");
    assert_eq!(r.len(), 2);
    assert!(
        r[0].1.starts_with("ping -c 3 -I eth0 10.100.4.2;"),
        "{}",
        r[0].1
    );
    assert!(
        r[1].1.starts_with("ping -c 3 -I eth1 10.100.8.2;"),
        "{}",
        r[1].1
    );
    // A /24 cable subnet (GB10 default addressing) has no single peer: the remedy says which subnet.
    let r = remedies("broken-no-neighbour");
    assert_eq!(r.len(), 1);
    assert!(
        r[0].1
            .starts_with("ping -c 3 -I enP2p1s0f0np0 <peer address in 192.168.101.0/24>;"),
        "{}",
        r[0].1
    );
    let p2p = |s: &str| host::nccl::point_to_point_peers(s.parse().unwrap());
    assert_eq!(p2p("10.0.0.4/31"), Some(vec!["10.0.0.5".parse().unwrap()]));
    assert_eq!(p2p("10.0.0.5/31"), Some(vec!["10.0.0.4".parse().unwrap()]));
    assert_eq!(p2p("10.0.0.6/30"), Some(vec!["10.0.0.5".parse().unwrap()]));
    // The network address of a /30 is not a host: both hosts may be the peer.
    let both = Some(vec![
        "10.0.0.5".parse().unwrap(),
        "10.0.0.6".parse().unwrap(),
    ]);
    assert_eq!(p2p("10.0.0.4/30"), both);
    assert_eq!(p2p("10.0.0.4/24"), None);
}

#[test]
fn gpu_direct_off_only_when_a_live_probe_found_no_way_to_register_gpu_memory() {
    let check = |name: &str, dmabuf: &dyn Fn(&str) -> bool, probed: bool| {
        let (m, _) = host::discover(&fixture(name));
        let devs = m.nccl_devices(&|_, _| true, dmabuf);
        doctor::gpu_direct_checks(&m, &devs, probed)
    };
    // GB10: GPU driver loaded, no peer-memory client; its drivers refused DMA-BUF on the live probe.
    let f = check("gb10-2cable", &|_| false, true);
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].check.as_str(), f[0].object.as_str(), f[0].severity),
        ("gpu-direct-off", "host", Warning)
    );
    assert!(
        f[0].message.contains("sl_enp1s0f0np0") && f[0].message.contains("through host memory"),
        "{}",
        f[0].message
    );
    assert!(f[0].remedy.contains("nvidia-peermem"), "{}", f[0].remedy);
    // The same host whose drivers take DMA-BUF: GPUDirect works.
    assert!(check("gb10-2cable", &|_| true, true).is_empty());
    // Offline (no probe): DMA-BUF is unknown, so nothing is claimed.
    assert!(check("gb10-2cable", &|_| false, false).is_empty());
    // B300 with nvidia_peermem: NCCL_PTR_CUDA without DMA-BUF.
    assert!(check("b300-2node", &|_| false, true).is_empty());
    // No GPU driver (a TCP-only host, the rxe lab): nothing to say.
    assert!(check("broken-no-rdma", &|_| false, true).is_empty());
    let (m, _) = host::discover(&fixture("captured/rxe-2vm-node0"));
    assert!(!m.gpu_driver);
    let devs = m.nccl_devices(&|_, _| true, &|_| false);
    assert!(!devs.is_empty());
    assert!(doctor::gpu_direct_checks(&m, &devs, true).is_empty());
}

#[test]
fn no_rdma_devices_at_all() {
    let (f, s) = findings("broken-no-rdma");
    assert_eq!(
        f,
        want(&[
            ("no-rdma-devices", "host", Error),
            ("address-without-rdma", "netdev enP7s7", Info),
        ])
    );
    assert_eq!(s, 2);
}

#[test]
fn ipv4_link_local_address() {
    let (f, s) = findings("broken-ipv4-link-local");
    assert_eq!(
        f,
        gb10_with(&[("ipv4-link-local-gid", "roceP2p1s0f0 port 1", Warning)])
    );
    assert_eq!(s, 1);
}

#[test]
fn address_without_connected_route() {
    let (f, s) = findings("broken-no-route");
    assert_eq!(
        f,
        gb10_with(&[("no-connected-route", "netdev enP2p1s0f0np0", Warning)])
    );
    assert_eq!(s, 1);
}

#[test]
fn odd_kernel_files() {
    let (f, s) = findings("broken-odd-files");
    assert_eq!(
        f,
        gb10_with(&[
            (
                "kernel-file",
                "file /sys/class/net/enp1s0f0np0/mtu",
                Warning
            ),
            (
                "kernel-file",
                "file /sys/class/infiniband/roceP2p1s0f0/ports/1/rate",
                Warning
            ),
        ])
    );
    assert_eq!(s, 1);
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchless"))
}

#[test]
fn cli_json_schema_and_exit_status() {
    let out = bin()
        .args(["doctor", "--json", "--root"])
        .arg(fixture("broken-same-subnet"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "switchless-doctor/1");
    assert_eq!(v["exit_status"], 2);
    let ports = v["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 4);
    let p = ports.iter().find(|p| p["device"] == "rocep1s0f0").unwrap();
    assert_eq!(p["netdev"], "enp1s0f0np0");
    assert_eq!(p["addresses"][0]["addr"], "192.168.100.10/24");
    assert_eq!(p["addresses"][0]["gid_index"], 3);
    assert_eq!(p["addresses"][0]["gid_type"], "RoCE v2");
    assert_eq!(p["mtu"], 9000);
    assert_eq!(p["active_mtu"], 4096);
    assert_eq!(p["pci_root"], "pci0000:00/0000:00:00.0");
    assert_eq!(p["pcie"]["current_width"], 4);
    assert_eq!(p["nccl_device"], "sl_enp1s0f0np0");
    let d = &v["nccl_devices"][0];
    assert_eq!(d["name"], "sl_enp1s0f0np0");
    assert_eq!(d["speed_mbps"], 200000);
    assert_eq!(d["guid"], "0x4cbb470300a1b2c0");
    assert_eq!(d["ptr_support"], 1);
    assert_eq!(d["max_recvs"], 8);
    assert_eq!(d["plane_id"], -1);
    let f = v["findings"].as_array().unwrap();
    assert_eq!(f[0]["severity"], "error");
    assert_eq!(f[0]["check"], "same-subnet");
    assert!(f[0]["remedy"].as_str().unwrap().len() > 10);

    let out = bin()
        .args(["doctor", "--root"])
        .arg(fixture("gb10-2cable"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("NCCL DEVICE"), "{text}");
    assert!(text.contains("roceP2p1s0f1"), "{text}");
    assert!(text.contains("Gen5 x4"), "{text}");
    let cpu = format!("cpu {} (this build); ", std::env::consts::ARCH);
    assert!(text.lines().any(|l| l.starts_with(&cpu)), "{text}");

    let out = bin()
        .args(["doctor", "--root"])
        .arg(fixture("broken-mtu1500"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));

    let out = bin()
        .args(["doctor", "--root", "/nonexistent/switchless"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
}

#[test]
fn cli_capture_replays_to_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("cap");
    let a = bin()
        .args(["doctor", "--json", "--root"])
        .arg(fixture("b300-4node"))
        .arg("--capture")
        .arg(&cap)
        .output()
        .unwrap();
    assert_eq!(a.status.code(), Some(0));
    let b = bin()
        .args(["doctor", "--json", "--root"])
        .arg(&cap)
        .output()
        .unwrap();
    assert_eq!(b.status.code(), Some(0));
    let mut va: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    let mut vb: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
    va["root"] = serde_json::Value::Null;
    vb["root"] = serde_json::Value::Null;
    assert_eq!(va, vb);
    // A second capture into a non-empty directory is refused.
    let c = bin()
        .args(["doctor", "--root"])
        .arg(fixture("b300-4node"))
        .arg("--capture")
        .arg(&cap)
        .output()
        .unwrap();
    assert_eq!(c.status.code(), Some(2));
}

#[test]
fn soft_roce_with_a_retry_count_of_seven_would_hang() {
    let (m, _) = host::discover(&fixture("captured/rxe-2vm-node0"));
    assert!(m.rdma_devices.iter().all(|d| d.software), "rxe is virtual");
    let f = doctor::env_checks(&m, 7);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].check, "soft-roce-infinite-retry");
    assert_eq!(f[0].severity, Warning);
    assert!(
        f[0].message.contains("rxe_eth0, rxe_eth1 are soft-RoCE"),
        "{}",
        f[0].message
    );
    assert!(f[0].remedy.contains("NCCL_IB_RETRY_CNT=6"));
    assert!(doctor::env_checks(&m, 6).is_empty());
    assert!(doctor::env_checks(&m, 0).is_empty());
    // Hardware NICs count 7 down like any other value.
    let (hw, _) = host::discover(&fixture("gb10-2cable"));
    assert!(hw.rdma_devices.iter().all(|d| !d.software));
    assert!(doctor::env_checks(&hw, 7).is_empty());
}

#[test]
fn cli_checks_the_nccl_environment() {
    let run = |retry: Option<&str>| {
        let mut c = bin();
        c.args(["doctor", "--json", "--root"])
            .arg(fixture("captured/rxe-2vm-node0"))
            .env_remove("NCCL_IB_RETRY_CNT");
        if let Some(v) = retry {
            c.env("NCCL_IB_RETRY_CNT", v);
        }
        let out = c.output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let checks: Vec<String> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["check"].as_str().unwrap().to_string())
            .collect();
        (out.status.code(), checks, v)
    };
    let (rc, checks, _) = run(None);
    assert_eq!(rc, Some(1));
    assert!(
        checks.contains(&"soft-roce-infinite-retry".to_string()),
        "{checks:?}"
    );
    let (_, checks, _) = run(Some("6"));
    assert!(
        !checks.contains(&"soft-roce-infinite-retry".to_string()),
        "{checks:?}"
    );
    // A value the plugin's init would refuse is an error naming it.
    let (rc, checks, v) = run(Some("9"));
    assert_eq!(rc, Some(2));
    assert!(checks.contains(&"nccl-env".to_string()), "{checks:?}");
    let msg = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "nccl-env")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("NCCL_IB_RETRY_CNT"), "{msg}");
}

/// `switchless doctor --json --root FIXTURE` in an environment of exactly `env`: (exit status, JSON).
fn doctor_env(name: &str, env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value) {
    let mut c = bin();
    c.env_clear()
        .args(["doctor", "--json", "--root"])
        .arg(fixture(name));
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{name} {env:?}: no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

/// The findings of a JSON report as (check, object, severity name).
fn json_findings(v: &serde_json::Value) -> Vec<(String, String, String)> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["check"].as_str().unwrap().to_string(),
                f["object"].as_str().unwrap().to_string(),
                f["severity"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn finding<'a>(v: &'a serde_json::Value, check: &str) -> &'a serde_json::Value {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} finding in {v:#}"))
}

#[test]
fn ib_hca_that_matches_nothing_is_an_error() {
    let (rc, v) = doctor_env("b300-4node", &[("NCCL_IB_HCA", "mlx5_O")]);
    assert_eq!(rc, Some(2));
    let f = finding(&v, "ib-hca-no-match");
    assert_eq!(f["severity"], "error");
    let msg = f["message"].as_str().unwrap();
    assert!(msg.contains("did you mean mlx5_0?"), "{msg}");
    // In auto mode the plugin then falls back to TCP on the point-to-point netdevs; the report says so.
    assert!(msg.contains("falls back to TCP"), "{msg}");
    assert_eq!(v["transport"]["transport"], "tcp");
    assert_eq!(v["ib_hca"]["selected"].as_array().unwrap().len(), 0);
    assert!(
        f["remedy"]
            .as_str()
            .unwrap()
            .starts_with("unset NCCL_IB_HCA"),
        "{f}"
    );
    // InfiniBand ports (the storage CX-7) are not offered: NCCL's IB transport keeps them.
    assert!(
        !msg.contains("mlx5_2,") && !msg.contains("mlx5_2 "),
        "{msg}"
    );
}

#[test]
fn ib_hca_prefix_match_and_half_a_cable_are_warnings() {
    // B300: mlx5_1 also selects mlx5_10..17 and drops mlx5_0, the other half of its CX-8 port.
    let (rc, v) = doctor_env("b300-4node", &[("NCCL_IB_HCA", "mlx5_1")]);
    assert_eq!(rc, Some(1));
    // One fault, one finding, one remedy: the device meant and the other half of its cable.
    let p = finding(&v, "ib-hca-prefix-match");
    let msg = p["message"].as_str().unwrap();
    assert!(
        msg.contains("also selects mlx5_10, mlx5_11, mlx5_12"),
        "{p}"
    );
    assert!(
        msg.contains("keeps mlx5_1 port 1 but drops mlx5_0 port 1"),
        "{p}"
    );
    assert!(
        p["remedy"]
            .as_str()
            .unwrap()
            .starts_with("export NCCL_IB_HCA==mlx5_0,mlx5_1   # exact names"),
        "{p}"
    );
    assert!(
        !v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["check"] == "ib-hca-splits-port"),
        "{v:#}"
    );
    // The remedy is clean: doctor says nothing more with it.
    let (rc, v2) = doctor_env("b300-4node", &[("NCCL_IB_HCA", "=mlx5_0,mlx5_1")]);
    assert_eq!(rc, Some(0), "{v2:#}");
    let sel: Vec<&str> = v["ib_hca"]["selected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(sel[..3], ["mlx5_1:1", "mlx5_10:1", "mlx5_11:1"]);
    // GB10: one PCIe function of the QSFP port.
    let (rc, v) = doctor_env("gb10-2cable", &[("NCCL_IB_HCA", "rocep1s0f0")]);
    assert_eq!(rc, Some(1));
    let s = finding(&v, "ib-hca-splits-port");
    assert_eq!(
        s["remedy"].as_str().unwrap().split("   #").next().unwrap(),
        "export NCCL_IB_HCA==roceP2p1s0f0,rocep1s0f0"
    );
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("but drops roceP2p1s0f0 port 1"),
        "{s}"
    );
    // The exact list of both functions is clean.
    let (rc, v) = doctor_env(
        "gb10-2cable",
        &[("NCCL_IB_HCA", "=rocep1s0f0,roceP2p1s0f0")],
    );
    assert_eq!(rc, Some(0), "{v:#}");
}

#[test]
fn bad_environment_values_are_one_finding_each_and_the_report_completes() {
    let (rc, v) = doctor_env(
        "b300-4node",
        &[
            ("NCCL_IB_HCA", ":1"),
            ("NCCL_SWITCHLESS_TRANSPORT", "ib"),
            ("NCCL_SWITCHLESS_CONNECT_TIMEOUT", "30"),
        ],
    );
    assert_eq!(rc, Some(2));
    assert_eq!(v["exit_status"], 2);
    assert!(!v["ports"].as_array().unwrap().is_empty());
    let env: Vec<_> = json_findings(&v)
        .into_iter()
        .filter(|(c, _, _)| c == "nccl-env")
        .map(|(_, o, s)| (o, s))
        .collect();
    let want = |o: &str| (o.to_string(), "error".to_string());
    assert_eq!(
        env,
        [
            want("NCCL_IB_HCA"),
            want("NCCL_SWITCHLESS_TRANSPORT"),
            want("NCCL_SWITCHLESS_CONNECT_TIMEOUT")
        ]
    );
    // Init would refuse: NCCL gets no device from the plugin.
    assert_eq!(v["transport"]["transport"], "none");
    assert_eq!(v["nccl_devices"].as_array().unwrap().len(), 0);
    let t = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["object"] == "NCCL_SWITCHLESS_CONNECT_TIMEOUT")
        .unwrap();
    assert!(
        t["remedy"]
            .as_str()
            .unwrap()
            .starts_with("export NCCL_SWITCHLESS_CONNECT_TIMEOUT=30s"),
        "{t}"
    );
}

#[test]
fn misspelled_variable_names_are_warnings_with_did_you_mean() {
    let (rc, v) = doctor_env(
        "gb10-2cable",
        &[
            ("NCCL_SWITCHLESS_TRANSPROT", "tcp"),
            ("NCCL_IB_DISABLE", "0"),
        ],
    );
    assert_eq!(rc, Some(1));
    let f = finding(&v, "nccl-env-unknown");
    assert_eq!(f["object"], "NCCL_SWITCHLESS_TRANSPROT");
    assert_eq!(f["severity"], "warning");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("did you mean NCCL_SWITCHLESS_TRANSPORT?"),
        "{f}"
    );
    assert_eq!(
        f["remedy"],
        "export NCCL_SWITCHLESS_TRANSPORT=tcp; unset NCCL_SWITCHLESS_TRANSPROT"
    );
    // NCCL's own IB variables are not typos.
    assert_eq!(
        json_findings(&v)
            .iter()
            .filter(|(c, _, _)| c == "nccl-env-unknown")
            .count(),
        1
    );
}

#[test]
fn transport_tcp_is_honoured() {
    // A healthy TCP-only host: no exit 2, the TCP devices the plugin would use are listed.
    for env in [&[][..], &[("NCCL_SWITCHLESS_TRANSPORT", "tcp")][..]] {
        let (rc, v) = doctor_env("tcp-2link", env);
        assert_eq!(rc, Some(0), "{env:?}: {v:#}");
        assert_eq!(v["transport"]["transport"], "tcp");
        let names: Vec<&str> = v["nccl_devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["sl_enp65s0f0", "sl_enp65s0f1"]);
        assert_eq!(finding(&v, "no-rdma-devices")["severity"], "info");
    }
    // A RoCE host with TRANSPORT=tcp: TCP devices on the same cables, no RoCE device.
    let (_, v) = doctor_env("b300-4node", &[("NCCL_SWITCHLESS_TRANSPORT", "tcp")]);
    assert_eq!(v["transport"]["transport"], "tcp");
    assert!(
        v["nccl_devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["members"].as_array().unwrap().is_empty())
    );
    // GB10 with /24 cable subnets has no point-to-point netdev: TRANSPORT=tcp cannot work there.
    let (rc, v) = doctor_env("gb10-2cable", &[("NCCL_SWITCHLESS_TRANSPORT", "tcp")]);
    assert_eq!(rc, Some(2));
    assert_eq!(finding(&v, "tcp-no-links")["severity"], "error");
    // Text: the devices come with the transport and why.
    let out = bin()
        .env_clear()
        .args(["doctor", "--root"])
        .arg(fixture("tcp-2link"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("NCCL devices over TCP ("), "{text}");
    assert!(
        text.contains("0 sl_enp65s0f0: 10 Gb/s, host memory only, peers 10.10.0.2"),
        "{text}"
    );
    // No empty RDMA table on a TCP-only host.
    assert!(text.contains("\nRDMA ports: none\n"), "{text}");
    assert!(!text.contains("PCIE ROOT"), "{text}");
}

/// The findings of `check` in a JSON report, as (object, severity, message, remedy).
fn all_of(v: &serde_json::Value, check: &str) -> Vec<(String, String, String, String)> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
            (s("object"), s("severity"), s("message"), s("remedy"))
        })
        .collect()
}

#[test]
fn nccl_socket_ifname_must_reach_every_node() {
    // On a cable (a /30): NCCL's bootstrap would reach one peer only; the remedy names the default
    // route's interface.
    let (rc, v) = doctor_env("tcp-2link", &[("NCCL_SOCKET_IFNAME", "enp65s0f0")]);
    assert_eq!(rc, Some(1));
    let f = all_of(&v, "nccl-socket-ifname");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].1, "warning");
    assert!(
        f[0].2
            .contains("selects only cables: enp65s0f0 (10.10.0.1/30)"),
        "{}",
        f[0].2
    );
    assert_eq!(
        f[0].3,
        "export NCCL_SOCKET_IFNAME==eno1   # the default route's interface, which reaches every node"
    );
    // A prefix that takes the management NIC and the cables: still said.
    let (_, v) = doctor_env("tcp-2link", &[("NCCL_SOCKET_IFNAME", "en")]);
    assert!(
        all_of(&v, "nccl-socket-ifname")[0]
            .2
            .contains("also selects cables")
    );
    // No such netdev: NCCL's init fails.
    let (_, v) = doctor_env("gb10-2cable", &[("NCCL_SOCKET_IFNAME", "eth0")]);
    let f = all_of(&v, "nccl-socket-ifname");
    assert!(
        f[0].2.contains("matches no netdev with an address"),
        "{}",
        f[0].2
    );
    assert!(f[0].3.contains("=enP7s7"), "{}", f[0].3);
    // The management interface: nothing to say.
    for ok in ["eno1", "=eno1", "^enp65"] {
        let (_, v) = doctor_env("tcp-2link", &[("NCCL_SOCKET_IFNAME", ok)]);
        assert!(all_of(&v, "nccl-socket-ifname").is_empty(), "{ok}");
    }
}

#[test]
fn nccl_net_and_the_plugin_library_are_judged() {
    let (rc, v) = doctor_env("gb10-2cable", &[("NCCL_NET", "IB")]);
    assert_eq!(rc, Some(1));
    let f = all_of(&v, "nccl-net-other");
    assert_eq!(f.len(), 1);
    assert!(
        f[0].2
            .contains("NCCL_NET=IB makes NCCL use its network named \"IB\""),
        "{}",
        f[0].2
    );
    assert_eq!(f[0].3, "export NCCL_NET=switchless   # or unset NCCL_NET");
    let (_, v) = doctor_env("gb10-2cable", &[("NCCL_NET", "Switchless")]);
    assert!(all_of(&v, "nccl-net-other").is_empty());

    // A plugin name NCCL finds nothing for: a warning; one it finds: an info naming the file.
    let (rc, v) = doctor_env("gb10-2cable", &[("NCCL_NET_PLUGIN", "foo")]);
    assert_eq!(rc, Some(1));
    let f = all_of(&v, "nccl-net-plugin");
    assert_eq!(f[0].1, "warning");
    assert!(
        f[0].2
            .contains("names nothing loadable: no libnccl-net-foo.so"),
        "{}",
        f[0].2
    );
    let lib = tempfile::tempdir().unwrap();
    let so = lib.path().join("libnccl-net-switchless.so");
    std::fs::write(&so, "").unwrap();
    let dir = lib.path().to_str().unwrap();
    let (rc, v) = doctor_env(
        "gb10-2cable",
        &[("NCCL_NET_PLUGIN", "switchless"), ("LD_LIBRARY_PATH", dir)],
    );
    assert_eq!(rc, Some(0), "{v:#}");
    let f = all_of(&v, "nccl-net-plugin");
    assert_eq!(f[0].1, "info");
    assert!(
        f[0].2.contains(&format!("loads {}", so.display())),
        "{}",
        f[0].2
    );
    let (_, v) = doctor_env("gb10-2cable", &[("NCCL_NET_PLUGIN", "none")]);
    assert_eq!(all_of(&v, "nccl-net-plugin")[0].1, "warning");
}

#[test]
fn a_fixed_gid_index_must_be_every_ports_ipv4_gid() {
    // GID 1 of every GB10 port is its link-local RoCE v2 GID: the plugin would use it everywhere.
    let (rc, v) = doctor_env("gb10-2cable", &[("NCCL_IB_GID_INDEX", "1")]);
    assert_eq!(rc, Some(2));
    let f = all_of(&v, "ib-gid-index-wrong");
    assert_eq!(f.len(), 1, "one finding for the variable");
    assert!(
        f[0].2.contains("rocep1s0f0 port 1: GID 1 is a link-local fe80:: GID, which NCCL treats as invalid; its IPv4 RoCE v2 GID is 3"),
        "{}",
        f[0].2
    );
    assert!(f[0].3.starts_with("unset NCCL_IB_GID_INDEX"), "{}", f[0].3);
    let (_, v) = doctor_env("gb10-2cable", &[("NCCL_IB_GID_INDEX", "3")]);
    assert!(all_of(&v, "ib-gid-index-wrong").is_empty());
}

#[test]
fn did_you_mean_covers_every_variable_nccl_or_the_plugin_reads() {
    let (rc, v) = doctor_env(
        "gb10-2cable",
        &[
            ("NCCL_SWITCHLES_TCP_STREAMS", "4"), // the prefix misspelt: silent before
            ("NCLL_IB_HCA", "=rocep1s0f0"),      // not even NCCL_*
            ("NCCL_CROS_NIC", "1"),              // NCCL's own variable
            ("NCCL_SOCKET_IFNAM", "enP7s7"),
            ("NCCL_SOME_FUTURE_KNOB", "1"), // far from everything: a newer NCCL's, no finding
            ("NCCL_CROSS_NIC", "0"),
            ("HOME", "/root"),
            ("TERM", "xterm"),
        ],
    );
    assert_eq!(rc, Some(1), "{v:#}");
    let f = all_of(&v, "nccl-env-unknown");
    let got: Vec<(&str, &str)> = f.iter().map(|x| (x.0.as_str(), x.3.as_str())).collect();
    assert_eq!(
        got,
        [
            (
                "NCCL_CROS_NIC",
                "export NCCL_CROSS_NIC=1; unset NCCL_CROS_NIC"
            ),
            (
                "NCCL_SOCKET_IFNAM",
                "export NCCL_SOCKET_IFNAME=enP7s7; unset NCCL_SOCKET_IFNAM"
            ),
            (
                "NCCL_SWITCHLES_TCP_STREAMS",
                "export NCCL_SWITCHLESS_TCP_STREAMS=4; unset NCCL_SWITCHLES_TCP_STREAMS"
            ),
            (
                "NCLL_IB_HCA",
                "export NCCL_IB_HCA==rocep1s0f0; unset NCLL_IB_HCA"
            ),
        ]
    );
    let cros = &f[0].2;
    assert!(
        cros.contains("NCCL_CROSS_NIC (which NCCL reads) keeps its value (\"0\"): did you mean NCCL_CROSS_NIC?"),
        "{cros}"
    );
    assert!(f[2].2.contains("(which the plugin reads)"), "{}", f[2].2);
}

#[test]
fn a_capture_keeps_the_environment_it_was_judged_in() {
    // Captured with NCCL_NET=IB set: the replay, in an empty environment, judges the same variables.
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("cap");
    let out = bin()
        .env_clear()
        .env("NCCL_NET", "IB")
        .env("SECRET_TOKEN", "s3cr3t")
        .args(["doctor", "--json", "--root"])
        .arg(fixture("gb10-2cable"))
        .arg("--capture")
        .arg(&cap)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let saved = std::fs::read_to_string(cap.join("switchless/environment.json")).unwrap();
    assert!(
        saved.contains("NCCL_NET") && !saved.contains("SECRET"),
        "{saved}"
    );
    let (rc, v) = doctor_env_at(&cap, &[]);
    assert_eq!(rc, Some(1));
    assert_eq!(all_of(&v, "nccl-net-other").len(), 1);
}

fn doctor_env_at(root: &Path, env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value) {
    let mut c = bin();
    c.env_clear().args(["doctor", "--json", "--root"]).arg(root);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
    )
}

#[test]
fn a_gb10_port_with_the_kernels_arp_defaults_risks_arp_flux() {
    // Both PCIe functions of cage 0 are addressed and answer ARP for any local address.
    let (rc, v) = doctor_env("broken-arp-flux", &[]);
    assert_eq!(rc, Some(1));
    let f = all_of(&v, "arp-flux-risk");
    assert_eq!(f.len(), 1, "one finding per wire: {f:?}");
    assert_eq!(f[0].0, "port enP2p1s0f0np0+enp1s0f0np0");
    assert!(f[0].2.contains("share one wire"), "{}", f[0].2);
    assert!(
        f[0].3.starts_with(
            "sysctl -w net.ipv4.conf.enP2p1s0f0np0.arp_ignore=1 net.ipv4.conf.enP2p1s0f0np0.arp_announce=2 \
             net.ipv4.conf.enp1s0f0np0.arp_ignore=1 net.ipv4.conf.enp1s0f0np0.arp_announce=2"
        ),
        "{}",
        f[0].3
    );
    assert!(
        f[0].3.contains("--model gb10 --format sysctl"),
        "{}",
        f[0].3
    );
    // Trees without the files (older captures) say nothing; a capture keeps the files.
    let (_, v) = doctor_env("gb10-1cable", &[]);
    assert!(all_of(&v, "arp-flux-risk").is_empty());
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("cap");
    let out = bin()
        .args(["doctor", "--root"])
        .arg(fixture("broken-arp-flux"))
        .arg("--capture")
        .arg(&cap)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        cap.join("proc/sys/net/ipv4/conf/enp1s0f0np0/arp_ignore")
            .is_file()
    );
    let (_, v) = doctor_env_at(&cap, &[]);
    assert_eq!(all_of(&v, "arp-flux-risk").len(), 1);
}

#[test]
fn an_infiniband_port_shows_no_derived_active_mtu() {
    // The B300's storage CX-7 in IB mode (ibo4): its IPoIB MTU is no RoCE frame size.
    let out = bin()
        .env_clear()
        .args(["doctor", "--root"])
        .arg(fixture("b300-2node"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text.lines().find(|l| l.contains(" ibo4 ")).unwrap();
    assert!(row.contains("4092/IB"), "{row}");
    assert!(!row.contains("4092/1024"), "{row}");
    // A device's far-end group is its peer set; railId stays -1 (docs/guide/doctor.md).
    assert!(
        text.contains(", peer set 0, ") && !text.contains(", rail "),
        "{text}"
    );
}

#[test]
fn a_bare_number_in_a_duration_variable_is_said_to_be_milliseconds() {
    // 300 means 300 ms in the environment (30 s would be "30s"): accepted, but said, since the
    // command line reads a bare number as seconds (walkthrough 2, A13).
    let (rc, v) = doctor_env(
        "gb10-2cable",
        &[("NCCL_SWITCHLESS_REQUEST_TIMEOUT", "3000")],
    );
    assert_eq!(rc, Some(1));
    let f = all_of(&v, "nccl-env-unit");
    assert_eq!(f.len(), 1);
    assert!(f[0].2.contains("is read as 3000 ms"), "{}", f[0].2);
    assert!(
        f[0].3.starts_with("export NCCL_SWITCHLESS_REQUEST_TIMEOUT=3000ms   # or NCCL_SWITCHLESS_REQUEST_TIMEOUT=3000s"),
        "{}",
        f[0].3
    );
    for quiet in ["0", "30s", "500ms"] {
        let (_, v) = doctor_env("gb10-2cable", &[("NCCL_SWITCHLESS_CONNECT_TIMEOUT", quiet)]);
        assert!(all_of(&v, "nccl-env-unit").is_empty(), "{quiet}");
    }
    // Refused values are nccl-env errors (with the seconds hint), not also this.
    let (_, v) = doctor_env("gb10-2cable", &[("NCCL_SWITCHLESS_CONNECT_TIMEOUT", "30")]);
    assert!(all_of(&v, "nccl-env-unit").is_empty());
    assert_eq!(all_of(&v, "nccl-env").len(), 1);
}

/// Review N4: a B300 with its 16 mesh cables plus 8 RoCE addresses on a storage /24 (here as
/// secondary addresses of 8 mesh netdevs, with their RoCE v2 GIDs): 25 links are up, the listen
/// handle keeps the 16 mesh cables and leaves out the storage RoCE links, which doctor names.
#[test]
fn more_roce_links_than_the_handle_holds_is_a_warning_naming_them() {
    use switchless::host::model::{GidAddr, NetAddr};
    let (mut m, f) = host::discover(&fixture("b300-2node"));
    let mut added = Vec::new();
    let mesh: Vec<(String, String, u8)> = m
        .netdevs
        .iter()
        .filter_map(|n| n.rdma.first().map(|(d, p)| (n.name.clone(), d.clone(), *p)))
        .take(8)
        .collect();
    assert_eq!(mesh.len(), 8);
    for (i, (nd, dev, port)) in mesh.iter().enumerate() {
        let addr: std::net::Ipv4Addr = format!("172.16.0.{}", 10 + i).parse().unwrap();
        let n = m.netdevs.iter_mut().find(|n| &n.name == nd).unwrap();
        n.addrs.push(NetAddr {
            addr: format!("{addr}/24").parse().unwrap(),
            source: "fib_trie".into(),
            has_route: true,
        });
        let p = m
            .rdma_devices
            .iter_mut()
            .find(|d| &d.name == dev)
            .unwrap()
            .ports
            .iter_mut()
            .find(|p| p.port == *port)
            .unwrap();
        let mut g = p.ipv4_v2_gids().next().unwrap().0.clone();
        g.index = 100 + i as u32;
        g.gid = addr.to_ipv6_mapped();
        g.addr = GidAddr::Ipv4Mapped(addr);
        p.gids.push(g);
        added.push(format!("{nd} {addr}/24"));
    }
    let devs = m.nccl_devices(&|_, _| true, &|_| false);
    let r = doctor::report(&m, &devs, f);
    let hit: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.check == "handle-links-over-limit")
        .collect();
    assert_eq!(hit.len(), 1, "{:?}", r.findings);
    assert_eq!(hit[0].severity, Warning);
    for a in &added {
        assert!(
            hit[0].message.contains(a),
            "{a} not named: {}",
            hit[0].message
        );
    }
    assert!(
        hit[0].message.contains("25 links are up"),
        "{}",
        hit[0].message
    );
    assert!(hit[0].remedy.contains("NCCL_IB_HCA"));
    // (The shared /24 also makes a same-subnet finding: the exit status is at least a warning's.)
    assert!(r.exit_status >= 1);
}
