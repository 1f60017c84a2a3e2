//! `switchless doctor --fleet` on the generated multi-host trees (tests/fixtures/fabric/fleet-*,
//! made by gen.py): every cross-host finding kind by check id, object and severity, the cabling
//! matrix, the JSON schema, exit statuses, host naming, and a `--capture` of each host feeding it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use switchless::findings::Severity::{self, Error, Warning};
use switchless::tools::cli::doctor::fleet_hosts;
use switchless::tools::doctor::fleet::{self, FleetReport};

fn fleet_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fabric")
        .join(name)
}

fn nodes(name: &str) -> Vec<PathBuf> {
    (1..=4)
        .map(|n| fleet_dir(name).join(format!("node{n}")))
        .collect()
}

fn report(name: &str) -> FleetReport {
    fleet::diagnose(&fleet_hosts(&nodes(name)).unwrap())
}

fn findings(r: &FleetReport) -> Vec<(String, String, Severity)> {
    let mut v: Vec<_> = r
        .findings
        .iter()
        .map(|f| (f.check.clone(), f.object.clone(), f.severity))
        .collect();
    v.sort();
    v
}

fn want(list: &[(&str, &str, Severity)]) -> Vec<(String, String, Severity)> {
    let mut v: Vec<_> = list
        .iter()
        .map(|(c, o, s)| (c.to_string(), o.to_string(), *s))
        .collect();
    v.sort();
    v
}

/// (a, b, cables, usable paths, Mb/s) of every host pair.
fn matrix(r: &FleetReport) -> Vec<(String, String, usize, usize, u64)> {
    r.matrix
        .iter()
        .map(|c| {
            (
                c.a.clone(),
                c.b.clone(),
                c.cables,
                c.usable_paths,
                c.speed_mbps,
            )
        })
        .collect()
}

fn cell(a: &str, b: &str, c: usize, p: usize, s: u64) -> (String, String, usize, usize, u64) {
    (a.to_string(), b.to_string(), c, p, s)
}

#[test]
fn b300_full_mesh_is_clean_with_800_per_cable() {
    let r = report("fleet-b300-mesh4");
    assert_eq!(findings(&r), want(&[]));
    assert_eq!(r.exit_status, 0);
    let names: Vec<&str> = r.hosts.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["b300-1", "b300-2", "b300-3", "b300-4"]);
    assert_eq!(r.cables.len(), 12);
    // Two CX-8 cages per pair, two 400 Gb/s halves each.
    for c in &r.matrix {
        assert_eq!((c.cables, c.paths, c.usable_paths), (2, 4, 4), "{c:?}");
        assert_eq!(c.speed_mbps, 1_600_000, "{c:?}");
    }
    assert!(r.non_neighbours.is_empty());
    assert!(r.hosts.iter().all(|h| h.ends == 12 && h.nccl_devices == 6));
    // Per pair: each NCCL device's two halves carry, the other cage's stand by.
    assert_eq!(r.failover.len(), 6);
    let f = &r.failover[0];
    assert_eq!(f.object, "hosts b300-1 — b300-2");
    assert!(
        f.message.contains("4 usable paths;")
            && f.message.contains("on sl_eno6np0: eno6np0 10.112.1.1 -> 10.112.1.2, enp237s0f1np1 10.112.2.1 -> 10.112.2.2 carry; standby eno7np0 10.112.3.1 -> 10.112.3.2"),
        "{}",
        f.message
    );
}

#[test]
fn b300_planted_faults() {
    let r = report("fleet-b300-mesh4-faults");
    assert_eq!(
        findings(&r),
        want(&[
            ("duplicate-address", "address 192.168.10.13", Error),
            (
                "prefix-mismatch",
                "cable b300-1:eno8np0 10.113.1.1/30 — b300-3:eno6np0 10.113.1.2/24",
                Error
            ),
            (
                "gid-missing-one-end",
                "cable b300-2:eno9np0 10.123.3.1/30 — b300-3:eno9np0 10.123.3.2/30",
                Error
            ),
            (
                "mtu-mismatch",
                "cable b300-1:eno6np0 10.112.1.1/30 — b300-2:eno6np0 10.112.1.2/30",
                Warning
            ),
            (
                "end-down",
                "cable b300-2:enp23s0f1np1 10.124.2.1/30 — b300-4:enp220s0f1np1 10.124.2.2/30",
                Warning
            ),
            (
                "half-addressed",
                "cable b300-3:eno11np0+enp112s0f1np1 — b300-4:eno11np0",
                Warning
            ),
        ])
    );
    assert_eq!(r.exit_status, 2);
    let msg = |check: &str| {
        r.findings
            .iter()
            .find(|f| f.check == check)
            .map(|f| f.message.clone())
            .unwrap()
    };
    assert!(
        msg("mtu-mismatch").contains("MTU 9000/4000 bytes, active_mtu 4096/2048 bytes"),
        "{}",
        msg("mtu-mismatch")
    );
    assert!(msg("duplicate-address").contains("b300-3:eno1, b300-4:eno1"));
    assert!(msg("gid-missing-one-end").contains("b300-2's RDMA port mlx5_16 has no IPv4-mapped"));
    assert!(
        msg("half-addressed").contains("(unaddressed on b300-4: enp112s0f1np1)"),
        "{}",
        msg("half-addressed")
    );
    // Each faulty cable keeps its healthy half: 400 Gb/s instead of 800.
    assert_eq!(
        matrix(&r),
        [
            cell("b300-1", "b300-2", 2, 4, 1_600_000),
            cell("b300-1", "b300-3", 2, 3, 1_200_000),
            cell("b300-1", "b300-4", 2, 4, 1_600_000),
            cell("b300-2", "b300-3", 2, 3, 1_200_000),
            cell("b300-2", "b300-4", 2, 3, 1_200_000),
            cell("b300-3", "b300-4", 2, 3, 1_200_000),
        ]
    );
}

#[test]
fn gb10_ring_has_non_neighbours() {
    let r = report("fleet-gb10-ring4");
    assert_eq!(findings(&r), want(&[("non-neighbours", "fleet", Warning)]));
    assert_eq!(r.exit_status, 1);
    assert_eq!(
        r.non_neighbours,
        [
            ("spark-1".to_string(), "spark-3".to_string()),
            ("spark-2".to_string(), "spark-4".to_string())
        ]
    );
    let f = &r.findings[0];
    assert!(
        f.message
            .contains("spark-1–spark-3 (shared subnet 10.0.0.0/24, 10 Gb/s)"),
        "{}",
        f.message
    );
    assert!(f.message.contains("NCCL_SWITCHLESS_TCP_FALLBACK=1"));
    // Both functions of a GB10 cage: min(200 Gb/s port, 2 × 126 Gb/s PCIe Gen5 x4) = 200 Gb/s.
    assert_eq!(
        matrix(&r),
        [
            cell("spark-1", "spark-2", 1, 2, 200_000),
            cell("spark-1", "spark-3", 0, 0, 0),
            cell("spark-1", "spark-4", 1, 2, 200_000),
            cell("spark-2", "spark-3", 1, 2, 200_000),
            cell("spark-2", "spark-4", 0, 0, 0),
            cell("spark-3", "spark-4", 1, 2, 200_000),
        ]
    );
}

#[test]
fn gb10_planted_faults() {
    let r = report("fleet-gb10-ring4-faults");
    assert_eq!(
        findings(&r),
        want(&[
            ("duplicate-address", "address 192.168.102.10", Error),
            (
                "half-addressed",
                "cable spark-1:enP2p1s0f1np1+enp1s0f1np1 — spark-2:enp1s0f0np0",
                Warning
            ),
            ("no-far-end", "netdev spark-3:enp1s0f1np1", Warning),
            ("no-far-end", "netdev spark-4:enp1s0f0np0", Warning),
            ("non-neighbours", "fleet", Warning),
        ])
    );
    assert_eq!(r.exit_status, 2);
    let half = r
        .findings
        .iter()
        .find(|f| f.check == "half-addressed")
        .unwrap();
    assert!(
        half.message
            .contains("spark-1:enP2p1s0f1np1 192.168.101.10/24 faces nothing (unaddressed on spark-2: enP2p1s0f0np0)"),
        "{}",
        half.message
    );
    // One function of a GB10 cage: 126 Gb/s (its PCIe Gen5 x4), not the port's 200.
    assert_eq!(
        matrix(&r),
        [
            cell("spark-1", "spark-2", 1, 1, 126_030),
            cell("spark-1", "spark-3", 0, 0, 0),
            cell("spark-1", "spark-4", 1, 2, 200_000),
            cell("spark-2", "spark-3", 1, 1, 126_030),
            cell("spark-2", "spark-4", 0, 0, 0),
            cell("spark-3", "spark-4", 1, 1, 126_030),
        ]
    );
}

/// Every cross-host check id is produced by at least one fixture fleet.
#[test]
fn every_check_has_a_fixture() {
    let mut seen = std::collections::BTreeSet::new();
    for name in [
        "fleet-b300-mesh4",
        "fleet-b300-mesh4-faults",
        "fleet-gb10-ring4",
        "fleet-gb10-ring4-faults",
    ] {
        for f in report(name).findings {
            seen.insert(f.check);
        }
    }
    // Walkthrough 2's fabrics, built from plans (hosts named by the plan).
    for (name, hosts, plan) in [
        ("fleet-gb10-mesh3-swapped", &SPARKS[..], "gb10-mesh3"),
        ("fleet-gb10-mesh3-arpflux", &SPARKS[..], "gb10-mesh3"),
        ("fleet-gb10-mesh3-badaddr", &SPARKS[..], "gb10-mesh3"),
        (
            "fleet-b300-pair-swapped",
            &["b300-001", "b300-002"][..],
            "b300-pair",
        ),
    ] {
        let (_, v) = fleet_json(&hosts_of(name, hosts), Some(&plan_file(plan)));
        for f in v["findings"].as_array().unwrap() {
            seen.insert(f["check"].as_str().unwrap().to_string());
        }
    }
    use fleet::check::*;
    for c in [
        NO_FAR_END,
        PREFIX_MISMATCH,
        MTU_MISMATCH,
        END_DOWN,
        DUPLICATE_ADDRESS,
        HALF_ADDRESSED,
        GID_MISSING_ONE_END,
        NON_NEIGHBOURS,
        CABLE_MISWIRED,
        ARP_FLUX,
        PLANNED_CABLE,
    ] {
        assert!(seen.contains(c), "no fixture produces {c}");
    }
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchless"))
}

#[test]
fn cli_json_text_exit_status_and_names() {
    let out = bin()
        .args(["doctor", "--json", "--fleet"])
        .args(nodes("fleet-gb10-ring4-faults"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "switchless-fleet/1");
    assert_eq!(v["exit_status"], 2);
    assert_eq!(v["hosts"].as_array().unwrap().len(), 4);
    assert_eq!(v["hosts"][0]["name"], "spark-1");
    let c = &v["cables"][0];
    assert_eq!(c["a"]["host"], "spark-1");
    assert_eq!(c["b"]["host"], "spark-2");
    let p = &c["paths"][0];
    assert_eq!(p["a"]["kind"], "roce");
    assert_eq!(p["a"]["addr"], "192.168.100.10/24");
    assert_eq!(p["b"]["addr"], "192.168.100.11/24");
    assert_eq!(p["a"]["active_mtu"], 4096);
    assert_eq!(p["usable"], true);
    assert_eq!(v["matrix"][1]["cables"], 0);
    assert_eq!(v["non_neighbours"][0][0], "spark-1");
    assert_eq!(v["findings"][0]["severity"], "error");

    let out = bin()
        .args(["doctor", "--fleet"])
        .args(nodes("fleet-b300-mesh4"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Cabling matrix"), "{text}");
    assert!(text.contains("2 / 4 / 1600"), "{text}");
    assert!(text.contains("No cross-host findings: clean."), "{text}");

    // NAME=PATH names a host; a tree without a hostname file is named by its directory.
    let out = bin()
        .args(["doctor", "--json", "--fleet"])
        .arg(format!(
            "left={}",
            fleet_dir("fleet-gb10-ring4").join("node1").display()
        ))
        .arg(fleet_dir("gb10-2cable"))
        .arg(fleet_dir("gb10-2cable"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["left", "gb10-2cable", "gb10-2cable#2"]);

    let out = bin()
        .args(["doctor", "--fleet"])
        .arg(fleet_dir("fleet-gb10-ring4").join("node1"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least two hosts"));
    let out = bin()
        .args(["doctor", "--fleet", "/nonexistent/a", "/nonexistent/b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
}

/// A capture of each host (what the Slurm/ssh helper collects) gives the same fleet report, host
/// names included.
#[test]
fn captures_feed_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let mut caps = Vec::new();
    for (i, n) in nodes("fleet-gb10-ring4-faults").iter().enumerate() {
        let cap = dir.path().join(format!("cap{i}"));
        let out = bin()
            .args(["doctor", "--json", "--root"])
            .arg(n)
            .arg("--capture")
            .arg(&cap)
            .output()
            .unwrap();
        assert!(out.status.code().is_some());
        caps.push(cap);
    }
    let a = report("fleet-gb10-ring4-faults");
    let b = fleet::diagnose(&fleet_hosts(&caps).unwrap());
    assert_eq!(findings(&a), findings(&b));
    assert_eq!(matrix(&a), matrix(&b));
}

/// Host-local bridges (docker0: the same 172.17.0.1 on every host) and IPv4 link-local addresses
/// are not duplicates; the same address on a physical netdev is.
#[test]
fn duplicates_ignore_virtual_bridges_and_link_local() {
    use switchless::host::model::{NetAddr, Netdev};
    let mut hosts = fleet_hosts(&nodes("fleet-b300-mesh4")).unwrap();
    let nd = |name: &str, addr: &str, pci: Option<&str>| Netdev {
        name: name.into(),
        mtu: Some(1500),
        operstate: "up".into(),
        carrier: Some(true),
        mac: None,
        speed_mbps: None,
        phys_port_name: None,
        phys_switch_id: None,
        pci: pci.map(str::to_string),
        addrs: vec![NetAddr {
            addr: addr.parse().unwrap(),
            source: "fib_trie".into(),
            has_route: true,
        }],
        rdma: Vec::new(),
    };
    for h in hosts.iter_mut().take(2) {
        h.model.netdevs.push(nd("docker0", "172.17.0.1/16", None));
        h.model
            .netdevs
            .push(nd("usb0", "169.254.3.1/24", Some("0000:00:14.0")));
    }
    assert_eq!(findings(&fleet::diagnose(&hosts)), want(&[]));
    hosts[0]
        .model
        .netdevs
        .push(nd("eno2", "192.168.10.12/24", Some("0000:03:00.1")));
    assert_eq!(
        findings(&fleet::diagnose(&hosts)),
        want(&[("duplicate-address", "address 192.168.10.12", Error)])
    );
}

/// Two workstations on one 10GBase-T cable, one end left at MTU 1500: the finding speaks of TCP
/// (no jumbo frames, nothing dropped, no RoCE) and names the end to raise, with its value.
#[test]
fn mtu_mismatch_on_a_tcp_cable_names_the_low_end() {
    use switchless::host::model::NetAddr;
    let tcp = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fabric/tcp-2link");
    let mut hosts = fleet_hosts(&[
        PathBuf::from(format!("ws-a={}", tcp.display())),
        PathBuf::from(format!("ws-b={}", tcp.display())),
    ])
    .unwrap();
    let b = &mut hosts[1].model;
    for (name, addr) in [
        ("enp65s0f0", "10.10.0.2/30"),
        ("enp65s0f1", "10.10.0.6/30"),
        ("eno1", "192.168.10.12/24"),
    ] {
        let n = b.netdevs.iter_mut().find(|n| n.name == name).unwrap();
        n.addrs = vec![NetAddr {
            addr: addr.parse().unwrap(),
            source: "fib_trie".into(),
            has_route: true,
        }];
        if name == "enp65s0f0" {
            n.mtu = Some(1500);
        }
    }
    let r = fleet::diagnose(&hosts);
    let m: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.check == "mtu-mismatch")
        .collect();
    assert_eq!(m.len(), 1, "{:?}", r.findings);
    assert!(
        m[0].message.contains("MTU 9000/1500 bytes"),
        "{}",
        m[0].message
    );
    assert!(m[0].message.contains("no jumbo frames"), "{}", m[0].message);
    assert!(
        !m[0].message.contains("RoCE") && !m[0].message.contains("are dropped"),
        "{}",
        m[0].message
    );
    assert!(
        m[0].remedy
            .starts_with("on ws-b: ip link set dev enp65s0f0 mtu 9000"),
        "{}",
        m[0].remedy
    );
}

// ---------- walkthrough 2's fabrics, built from their plans (tests/fixtures/plan/*.plan.json) ----------

/// The host trees of a plan-built fleet, in server order.
fn hosts_of(name: &str, names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(|n| fleet_dir(name).join(n)).collect()
}

const SPARKS: [&str; 3] = ["spark-a", "spark-b", "spark-c"];

fn plan_file(name: &str) -> String {
    format!(
        "{}/tests/fixtures/plan/{name}.plan.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `doctor --fleet HOSTS --plan PLAN --json`: (exit status, JSON).
fn fleet_json(hosts: &[PathBuf], plan: Option<&str>) -> (i32, serde_json::Value) {
    let mut c = bin();
    c.env_clear()
        .args(["doctor", "--json", "--fleet"])
        .args(hosts);
    if let Some(p) = plan {
        c.args(["--plan", p]);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

/// (line, a, b, status) of the planned-cables table.
fn planned(v: &serde_json::Value) -> Vec<(u64, String, String, String)> {
    v["planned_cables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["line"].as_u64().unwrap(),
                c["a"].as_str().unwrap().to_string(),
                c["b"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_cables_file_against_a_healthy_mesh() {
    let (rc, v) = fleet_json(
        &hosts_of("fleet-gb10-mesh3", &SPARKS),
        Some(&plan_file("gb10-mesh3")),
    );
    assert_eq!(rc, 0, "{v:#}");
    let p = planned(&v);
    assert_eq!(p.len(), 3);
    assert!(p.iter().all(|c| c.3 == "ok"), "{p:?}");
    assert_eq!(p[0].1, "spark-a port 1");
    assert_eq!(p[0].2, "spark-b port 1");
}

#[test]
fn a_swapped_cable_is_named_by_the_macs_the_probe_saw() {
    // spark-a's two cables exchanged: every address as planned, no neighbour entry completes, and
    // the captures' --probe shows what each wire reaches.
    let hosts = hosts_of("fleet-gb10-mesh3-swapped", &SPARKS);
    let r = fleet::diagnose(&fleet_hosts(&hosts).unwrap());
    let mis: Vec<_> = findings(&r)
        .into_iter()
        .filter(|f| f.0 == "cable-miswired")
        .collect();
    assert_eq!(
        mis,
        want(&[
            (
                "cable-miswired",
                "cable spark-a:enP2p1s0f0np0+enp1s0f0np0 — spark-c:enP2p1s0f1np1+enp1s0f1np1",
                Error
            ),
            (
                "cable-miswired",
                "cable spark-a:enP2p1s0f1np1+enp1s0f1np1 — spark-b:enP2p1s0f0np0+enp1s0f0np0",
                Error
            ),
        ])
    );
    // The matrix counts the cables the MACs show, with nothing usable on the swapped ones; spark-b
    // and spark-c are no non-neighbours of spark-a.
    assert_eq!(
        matrix(&r),
        [
            cell("spark-a", "spark-b", 1, 0, 0),
            cell("spark-a", "spark-c", 1, 0, 0),
            cell("spark-b", "spark-c", 1, 2, 200_000),
        ]
    );
    assert!(r.non_neighbours.is_empty());
    // Against the plan: where each misplaced cable goes, port by port.
    let (rc, v) = fleet_json(&hosts, Some(&plan_file("gb10-mesh3")));
    assert_eq!(rc, 2);
    let detail: Vec<String> = v["planned_cables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{}: {}",
                c["status"].as_str().unwrap(),
                c["detail"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        detail[0],
        "wrong-port: spark-a port 1 (enp1s0f0np0) faces spark-c port 2 (enp1s0f1np1), planned spark-a port 1 — spark-b port 1"
    );
    assert!(detail[1].starts_with("ok: "), "{detail:?}");
    assert!(
        detail[2].starts_with("wrong-port: spark-a port 2 (enp1s0f1np1) faces spark-b port 1"),
        "{detail:?}"
    );
    // The text report has the table before the exit line.
    let out = bin()
        .env_clear()
        .args(["doctor", "--fleet"])
        .args(&hosts)
        .args(["--plan", &plan_file("gb10-mesh3")])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Planned cables ("), "{text}");
    assert!(
        text.contains("line 2  spark-a port 1 — spark-b port 1  WRONG PORT:"),
        "{text}"
    );

    // Without the probe (captured without --probe, right after boot) nothing shows the far ends:
    // the cables stay unverified, and nothing is blamed.
    let tmp = tempfile::tempdir().unwrap();
    let mut copies = Vec::new();
    for h in &hosts {
        let dst = tmp.path().join(h.file_name().unwrap());
        let st = Command::new("cp")
            .arg("-a")
            .arg(h)
            .arg(&dst)
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::remove_file(dst.join("switchless/probe.json")).unwrap();
        copies.push(dst);
    }
    let (_, v) = fleet_json(&copies, Some(&plan_file("gb10-mesh3")));
    let p = planned(&v);
    assert_eq!(
        p.iter().map(|c| c.3.as_str()).collect::<Vec<_>>(),
        ["unverified", "ok", "unverified"]
    );
    assert!(
        !v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["check"] == "cable-miswired"),
        "{v:#}"
    );
}

#[test]
fn a_dac_swapped_at_one_b300_shows_in_the_arp_macs() {
    // b300-002 keeps the kernel's ARP defaults: each far end answers for the planned address with
    // the other port's MAC (every ping passes). One finding per physical cable (both CX-8 halves).
    let hosts = hosts_of("fleet-b300-pair-swapped", &["b300-001", "b300-002"]);
    let r = fleet::diagnose(&fleet_hosts(&hosts).unwrap());
    let mis: Vec<String> = r
        .findings
        .iter()
        .filter(|f| f.check == "cable-miswired")
        .map(|f| f.object.clone())
        .collect();
    assert_eq!(
        mis,
        [
            "cable b300-001:eno6np0+enp237s0f1np1 — b300-002:eno7np0+enp151s0f1np1",
            "cable b300-001:eno7np0+enp151s0f1np1 — b300-002:eno6np0+enp237s0f1np1"
        ]
    );
    assert!(
        r.findings[0]
            .message
            .contains("the MAC that answered shows b300-002:eno7np0"),
        "{}",
        r.findings[0].message
    );
    assert_eq!(matrix(&r), [cell("b300-001", "b300-002", 8, 12, 4_800_000)]);
    let (_, v) = fleet_json(&hosts, Some(&plan_file("b300-pair")));
    let p = planned(&v);
    assert_eq!(p[0].3, "wrong-port");
    assert_eq!(p[1].3, "wrong-port");
    assert!(p[2..].iter().all(|c| c.3 == "ok"), "{p:?}");
}

#[test]
fn a_copied_address_invents_no_cable() {
    // spark-b's enP2p1s0f0np0 holds spark-c's 10.100.0.10/30: by address it would be a second
    // spark-a–spark-b cable; the neighbour MACs say spark-a's port 2 reaches spark-c.
    let hosts = hosts_of("fleet-gb10-mesh3-badaddr", &SPARKS);
    let r = fleet::diagnose(&fleet_hosts(&hosts).unwrap());
    assert_eq!(matrix(&r)[0], cell("spark-a", "spark-b", 1, 1, 126_030));
    assert!(!r.matrix[0].as_addressed);
    assert!(findings(&r).contains(&(
        "duplicate-address".to_string(),
        "address 10.100.0.10".to_string(),
        Error
    )));
    // The copy is not also blamed on the cable: one finding for one fault.
    assert!(
        !r.findings.iter().any(|f| f.check == "cable-miswired"),
        "{:#?}",
        r.findings
    );

    // Without MAC evidence (spark-a never resolved 10.100.0.10) the matrix can only go by the
    // addresses: spark-b's cage faces two of spark-a's, which is labelled and capped at one cable.
    let tmp = tempfile::tempdir().unwrap();
    let mut copies = Vec::new();
    for h in &hosts {
        let dst = tmp.path().join(h.file_name().unwrap());
        assert!(
            Command::new("cp")
                .arg("-a")
                .arg(h)
                .arg(&dst)
                .status()
                .unwrap()
                .success()
        );
        copies.push(dst);
    }
    let arp = copies[0].join("proc/4242/net/arp");
    let text = std::fs::read_to_string(&arp).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("10.100.0.10 "))
        .collect();
    std::fs::write(&arp, kept.join("\n") + "\n").unwrap();
    let r = fleet::diagnose(&fleet_hosts(&copies).unwrap());
    let ab = &r.matrix[0];
    assert_eq!((ab.cables, ab.as_addressed), (1, true), "{ab:?}");
    assert!(ab.speed_mbps <= 200_000, "{ab:?}");
    let text = switchless::tools::doctor::fleet_render::render_text(&r);
    assert!(
        text.contains("126 *") && text.contains("* as addressed"),
        "{text}"
    );
}

#[test]
fn arp_flux_between_the_functions_of_a_port() {
    let hosts = hosts_of("fleet-gb10-mesh3-arpflux", &SPARKS);
    let r = fleet::diagnose(&fleet_hosts(&hosts).unwrap());
    let f: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.check == "arp-flux")
        .collect();
    assert_eq!(f.len(), 1, "{:#?}", r.findings);
    assert_eq!(
        f[0].object,
        "cable spark-a:enp1s0f0np0 10.100.0.1/30 — spark-b:enp1s0f0np0 10.100.0.2/30"
    );
    assert!(
        f[0].message
            .contains("through the MAC of spark-b:enP2p1s0f0np0"),
        "{}",
        f[0].message
    );
    assert!(
        f[0].remedy
            .starts_with("on spark-b: sysctl -w net.ipv4.conf.enp1s0f0np0.arp_ignore=1"),
        "{}",
        f[0].remedy
    );
    // spark-b's own report says the same from its ARP settings.
    let b = r.hosts.iter().find(|h| h.name == "spark-b").unwrap();
    assert!(
        b.findings.iter().any(|f| f.check == "arp-flux-risk"),
        "{:#?}",
        b.findings
    );
}

/// Fleet remedies carry the values the fleet knows (walkthrough 2, A6): the idle function to
/// address, with the far end's subnet's other address and its MTU.
#[test]
fn half_addressed_remedy_is_pasteable() {
    let r = report("fleet-b300-mesh4-faults");
    let h = r
        .findings
        .iter()
        .find(|f| f.check == "half-addressed")
        .unwrap();
    assert_eq!(
        h.remedy,
        "on b300-4: ip link set dev enp112s0f1np1 up mtu 9000 && ip addr add 10.134.4.2/30 dev enp112s0f1np1"
    );
    // A /24 has no one other address: the subnet and the far end's are named instead.
    let r = report("fleet-gb10-ring4-faults");
    let h = r
        .findings
        .iter()
        .find(|f| f.check == "half-addressed")
        .unwrap();
    assert!(
        h.remedy.starts_with(
            "on spark-2: ip link set dev enP2p1s0f0np0 up mtu 9000 && ip addr add ADDR/24"
        ),
        "{}",
        h.remedy
    );
    assert!(
        h.remedy.contains("a free address of 192.168.101.0/24"),
        "{}",
        h.remedy
    );
}

/// Two workstations on one cable: each has one TCP NCCL device (the plugin's sl_<netdev>), which
/// the host table and the failover line name; counts are singular where they are one.
#[test]
fn a_tcp_pair_counts_its_tcp_devices() {
    let hosts = hosts_of("fleet-ws-pair", &["ws-a", "ws-b"]);
    let r = fleet::diagnose(&fleet_hosts(&hosts).unwrap());
    assert!(r.hosts.iter().all(|h| h.nccl_devices == 1), "{:?}", r.hosts);
    let text = switchless::tools::doctor::fleet_render::render_text(&r);
    assert!(text.contains("1 NCCL device  1 cable end"), "{text}");
    assert_eq!(r.failover.len(), 1);
    assert!(
        r.failover[0].message.contains("1 usable path;"),
        "{}",
        r.failover[0].message
    );
    assert!(
        r.failover[0].message.contains("on sl_enp5s0:"),
        "{}",
        r.failover[0].message
    );
}
