//! `switchless doctor --plan plan.json --server N`: the plan checker's findings join doctor's report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_switchless");

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn plan_json(dir: &std::path::Path) -> std::path::PathBuf {
    let out = Command::new(BIN)
        .args([
            "plan",
            &fixture("plan/b300-2node.cables"),
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = dir.join("plan.json");
    std::fs::write(&p, out.stdout).unwrap();
    p
}

fn doctor_json(args: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(BIN)
        .arg("doctor")
        .args(args)
        .arg("--json")
        .env_remove("NCCL_IB_HCA")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap(), v)
}

#[test]
fn plan_findings_join_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = plan_json(tmp.path());
    let root = fixture("fabric/b300-2node");
    let (plain_rc, plain) = doctor_json(&["--root", &root]);
    let (rc, with_plan) = doctor_json(&[
        "--root",
        &root,
        "--plan",
        plan.to_str().unwrap(),
        "--server",
        "1",
    ]);
    let checks = |v: &serde_json::Value| -> Vec<(String, String)> {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["check"].as_str().unwrap().to_string(),
                    f["object"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert!(!checks(&plain).iter().any(|(c, _)| c.starts_with("plan-")));
    let planned = checks(&with_plan);
    // The fixture uses the seed's 10.1ab.k.x addresses, the plan its own scheme: none of the 16
    // planned addresses is there and the seed's are extra. That is one headline finding (the host
    // follows another addressing plan) naming every interface, not 16 + 16 findings.
    let missing: Vec<_> = planned
        .iter()
        .filter(|(c, _)| c.starts_with("plan-"))
        .collect();
    assert_eq!(
        missing,
        [&("plan-addressing-differs".to_string(), "plan".to_string())],
        "{planned:?}"
    );
    let head = with_plan["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "plan-addressing-differs")
        .unwrap();
    let msg = head["message"].as_str().unwrap();
    assert!(msg.contains("none of the 16 addresses"), "{msg}");
    assert!(msg.contains("eno6np0 planned 10.100.0.1/30, has "), "{msg}");
    // The remedy is the command that writes and runs this server's apply script.
    let remedy = head["remedy"].as_str().unwrap();
    assert!(
        remedy.starts_with("switchless plan ")
            && remedy.contains(
                "b300-2node.cables --model b300 --format ip --server 1 --out ip/ && ip/server1.sh"
            ),
        "{remedy}"
    );
    assert_eq!(with_plan["plan_server"], "server 1");
    assert!(
        with_plan["verdict"]["first_to_fix"]
            .as_str()
            .unwrap()
            .starts_with("[plan-addressing-differs]")
    );
    assert_eq!(rc, 2, "missing planned addresses are errors");
    assert!(plain_rc < 2);
}

#[test]
fn plan_errors_name_the_file() {
    let out = Command::new(BIN)
        .args([
            "doctor",
            "--root",
            &fixture("fabric/b300-2node"),
            "--plan",
            "/nonexistent/plan.json",
            "--server",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/plan.json"), "{err}");

    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, "{not json").unwrap();
    let out = Command::new(BIN)
        .args(["doctor", "--root", &fixture("fabric/b300-2node")])
        .args(["--plan", bad.to_str().unwrap(), "--server", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.json"));
}

#[test]
fn server_auto_says_why_it_cannot_tell() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = plan_json(tmp.path());
    // No host name in the tree and none of the plan's addresses: auto cannot tell, and says so.
    let (rc, v) = doctor_json(&[
        "--root",
        &fixture("fabric/b300-2node"),
        "--plan",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(rc, 2);
    let f = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "plan-server-unknown")
        .unwrap();
    assert!(
        f["message"].as_str().unwrap().contains("--server auto"),
        "{f}"
    );
    // A GB10 host against a B300 plan: one headline naming the model the host looks like.
    let (rc, v) = doctor_json(&[
        "--root",
        &fixture("fabric/gb10-2cable"),
        "--plan",
        plan.to_str().unwrap(),
        "--server",
        "2",
    ]);
    assert_eq!(rc, 2);
    let f = &v["findings"][0];
    assert_eq!(f["check"], "plan-model-mismatch");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("this host looks like model gb10"),
        "{f}"
    );
    assert!(
        f["remedy"].as_str().unwrap().contains("--model gb10"),
        "{f}"
    );
}

#[test]
fn server_requires_plan_and_bad_hca_is_a_finding() {
    let out = Command::new(BIN)
        .args(["doctor", "--server", "1"])
        .output()
        .unwrap();
    // A usage error (exit status 2, naming the missing option), not any failure (a panic is 101).
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--plan <PLAN.json>"), "{err}");
    let out = Command::new(BIN)
        .args(["doctor", "--root", &fixture("fabric/b300-2node")])
        .env("NCCL_IB_HCA", "mlx5_0:0")
        .output()
        .unwrap();
    // A malformed NCCL_IB_HCA is an nccl-env finding like any other variable: the report completes.
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ERROR [nccl-env] NCCL_IB_HCA:"), "{text}");
    assert!(text.contains("DEVICE"), "{text}");
}

#[test]
fn a_captured_probe_says_the_planned_peers_do_not_answer() {
    // spark-a of the swapped mesh, captured with --probe: its planned far ends stay silent while
    // other MACs answer on each wire. One finding per netdev (the empty neighbour table is the same
    // fault), naming the planned peer.
    let root = fixture("fabric/fleet-gb10-mesh3-swapped/spark-a");
    let plan = fixture("plan/gb10-mesh3.plan.json");
    let (rc, v) = doctor_json(&["--root", &root, "--plan", &plan]);
    assert_eq!(rc, 2);
    let f: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "probe-no-answer")
        .collect();
    assert_eq!(f.len(), 4, "{v:#}");
    let one = f
        .iter()
        .find(|f| f["object"] == "netdev enp1s0f0np0")
        .unwrap();
    let msg = one["message"].as_str().unwrap();
    assert!(
        msg.contains(
            "10.100.0.2 (server 2 (spark-b) port 1 enp1s0f0np0) did not answer a ping, but"
        ),
        "{msg}"
    );
    assert!(
        one["remedy"]
            .as_str()
            .unwrap()
            .starts_with("ethtool -p enp1s0f0np0 10")
    );
    assert!(
        !v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["check"] == "no-neighbour"),
        "{v:#}"
    );
    // --probe pings from the live host only.
    let out = Command::new(BIN)
        .args(["doctor", "--probe", "--root", &root])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--probe pings from this host"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
