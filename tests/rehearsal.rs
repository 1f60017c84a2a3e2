//! Rehearsing a first day without the hardware: `tests/fixtures/fabric/gen.py --plan PLAN.json --out
//! DIR` writes one healthy tree per server of a plan, which `doctor --root DIR/HOST --plan` and
//! `doctor --fleet DIR/*` then judge as they would the real hosts. Used by the fleet and plan tests
//! to plant one mistake at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub const BIN: &str = env!("CARGO_BIN_EXE_switchless");

/// Plans `cables` (extra `plan` arguments in `args`) into DIR/plan.json and writes the trees under
/// DIR/fx; returns (plan path, the host trees in server order).
pub fn rehearse(dir: &Path, cables: &str, args: &[&str]) -> (PathBuf, Vec<PathBuf>) {
    let c = dir.join("cables.txt");
    std::fs::write(&c, cables).unwrap();
    let out = Command::new(BIN)
        .arg("plan")
        .arg(&c)
        .args(args)
        .args(["--format", "json"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = dir.join("plan.json");
    std::fs::write(&plan, &out.stdout).unwrap();
    let fx = dir.join("fx");
    let generator = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fabric/gen.py");
    let out = Command::new("python3")
        .arg(generator)
        .arg("--plan")
        .arg(&plan)
        .arg("--out")
        .arg(&fx)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&plan).unwrap()).unwrap();
    let n = v["server_count"].as_u64().unwrap();
    let hosts = (1..=n)
        .map(|s| {
            let name = v["server_names"][s.to_string()]
                .as_str()
                .map_or_else(|| format!("server{s}"), str::to_string);
            fx.join(name)
        })
        .collect();
    (plan, hosts)
}

fn doctor(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .env_clear()
        .arg("doctor")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

pub const GB10_MESH3: &str =
    "spark-a-1 > spark-b-1\nspark-b-2 > spark-c-1\nspark-c-2 > spark-a-2\n";
pub const B300_PAIR: &str = "server 1 = b300-001\nserver 2 = b300-002\n\
b300-001-1 > b300-002-1, b300-001-2 > b300-002-2, b300-001-3 > b300-002-3, b300-001-4 > b300-002-4\n\
b300-001-5 > b300-002-5, b300-001-6 > b300-002-6, b300-001-7 > b300-002-7, b300-001-8 > b300-002-8\n";

#[test]
fn a_plan_rehearses_healthy_on_every_host_and_across_them() {
    let ws_map = tempfile::tempdir().unwrap();
    let map = ws_map.path().join("ws.map");
    std::fs::write(&map, "name = ws10g\n1 = enp5s0\n").unwrap();
    let map = map.to_str().unwrap().to_string();
    let cases: [(&str, Vec<&str>); 3] = [
        (GB10_MESH3, vec![]),
        (B300_PAIR, vec![]),
        (
            "server 1 = ws-a\nserver 2 = ws-b\nws-a-1 > ws-b-1\n",
            vec!["--model", map.as_str()],
        ),
    ];
    for (cables, args) in cases {
        let d = tempfile::tempdir().unwrap();
        let (plan, hosts) = rehearse(d.path(), cables, &args);
        for h in &hosts {
            let (rc, text) = doctor(&[
                "--root",
                h.to_str().unwrap(),
                "--plan",
                plan.to_str().unwrap(),
            ]);
            assert_eq!(rc, 0, "{}:\n{text}", h.display());
            assert!(text.starts_with("verdict: healthy"), "{text}");
            assert!(text.contains("[plan-host-matches]"), "{text}");
        }
        let mut args = vec!["--fleet".to_string()];
        args.extend(hosts.iter().map(|h| h.display().to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (rc, text) = doctor(&args);
        assert_eq!(rc, 0, "{text}");
        assert!(text.contains("No cross-host findings: clean."), "{text}");
    }
}

#[test]
fn workstations_with_different_nic_names_rehearse_healthy() {
    let d = tempfile::tempdir().unwrap();
    let map = d.path().join("ws.map");
    std::fs::write(&map, "name = ws10g\n1 = enp5s0\nserver 2 port 1 = enp6s0\n").unwrap();
    let (plan, hosts) = rehearse(
        d.path(),
        "server 1 = ws-a\nserver 2 = ws-b\nws-a-1 > ws-b-1\n",
        &["--model", map.to_str().unwrap()],
    );
    for h in &hosts {
        let (rc, text) = doctor(&[
            "--root",
            h.to_str().unwrap(),
            "--plan",
            plan.to_str().unwrap(),
        ]);
        assert_eq!(rc, 0, "{text}");
    }
    let (rc, text) = doctor(&[
        "--root",
        hosts[1].to_str().unwrap(),
        "--plan",
        plan.to_str().unwrap(),
    ]);
    assert!(text.contains("enp6s0"), "{rc} {text}");
}
