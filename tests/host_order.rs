//! Host order for NCCL's ring: `switchless plan --format order` and `switchless doctor --fleet` (its
//! "Rank order" section and `--order`), over the plan fixtures and the generated fleets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use switchless::tools::cli::doctor::fleet_hosts;
use switchless::tools::doctor::fleet::{self, FleetReport};
use switchless::tools::doctor::fleet_order;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchless"))
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn nodes(name: &str) -> Vec<PathBuf> {
    (1..=4)
        .map(|n| fixture("fabric").join(name).join(format!("node{n}")))
        .collect()
}

fn report(name: &str) -> FleetReport {
    fleet::diagnose(&fleet_hosts(&nodes(name)).unwrap())
}

fn plan_order(cables: &str, model: &str) -> String {
    let out = bin()
        .args(["plan", "--model", model, "--format", "order"])
        .arg(fixture("plan").join(cables))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn plan_puts_the_ring_on_the_three_cable_pairs_of_a_332_mesh() {
    let text = plan_order("b300-4node-332.cables", "b300");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("1,2,4,3"), "{text}");
    assert!(
        text.contains("thinnest step: 3 cable(s) (servers in file order: 2 cable(s), ×1.50)"),
        "{text}"
    );
}

#[test]
fn plan_says_when_every_order_is_equal_and_uses_host_names() {
    let text = plan_order("b300-4node-named.cables", "b300");
    assert!(
        text.starts_with("b300-001,b300-002,b300-003,b300-004\n"),
        "{text}"
    );
    assert!(
        text.contains("every order gives the ring 2 cable(s) per step"),
        "{text}"
    );
    let text = plan_order("gb10-3ring.cables", "gb10");
    assert!(text.starts_with("1,2,3\n"), "{text}");
    assert!(text.contains("any order is as good"), "{text}");
}

#[test]
fn the_fleet_report_prints_the_order_and_the_tuners_inference() {
    let r = report("fleet-b300-mesh4");
    let o = fleet_order::order(&r);
    assert!(o.ring.all_equal());
    assert_eq!(o.names, vec!["b300-1", "b300-2", "b300-3", "b300-4"]);
    let hosts = fleet_hosts(&nodes("fleet-b300-mesh4")).unwrap();
    let text = fleet_order::render(&r, &hosts);
    assert!(
        text.contains("every order gives the ring the same 1600 Gb/s"),
        "{text}"
    );
    assert!(
        text.contains("every host: 6 cable(s): full mesh assumed, 2 per peer"),
        "{text}"
    );
    assert!(!text.contains("WARNING"), "{text}");

    // The CLI: the section after the report, and --order alone for launchers.
    let mut cmd = bin();
    cmd.arg("doctor")
        .arg("--fleet")
        .args(nodes("fleet-b300-mesh4"));
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Rank order for NCCL's ring"), "{text}");
    let out = bin()
        .arg("doctor")
        .arg("--fleet")
        .args(nodes("fleet-b300-mesh4"))
        .arg("--order")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "b300-1,b300-2,b300-3,b300-4\n"
    );
}

#[test]
fn a_fleet_whose_hosts_infer_differently_is_flagged() {
    // Three B300 mesh hosts and a GB10 addressed with /24 subnets: the B300s' tuners assume a full mesh
    // (6 cables, 3 peers), the GB10's changes nothing; and the GB10 shares no cable with them.
    let mut paths = nodes("fleet-b300-mesh4");
    paths.truncate(3);
    paths.push(nodes("fleet-gb10-ring4").remove(0));
    let hosts = fleet_hosts(&paths).unwrap();
    let r = fleet::diagnose(&hosts);
    let text = fleet_order::render(&r, &hosts);
    assert!(
        text.contains("  b300-1: 6 cable(s): full mesh assumed, 2 per peer"),
        "{text}"
    );
    assert!(text.contains("  spark-1: changes nothing"), "{text}");
    assert!(
        text.contains("WARNING: the hosts infer different fabrics"),
        "{text}"
    );
    assert!(
        text.contains("WARNING: a tuner assumes a full mesh but")
            && text.contains("share no cable"),
        "{text}"
    );
    assert!(
        text.contains("no order visits every host over cables"),
        "{text}"
    );
}
