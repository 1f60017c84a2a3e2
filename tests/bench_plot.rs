//! `switchless bench --plot` with `--plot-with`: several runs overlaid in one SVG (this run plus
//! saved reports), and a clear error for a file that is not a saved report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args([
            "bench",
            "bandwidth",
            "--loopback",
            "-b",
            "8",
            "-e",
            "4096",
            "-n",
            "2",
            "-w",
            "1",
        ])
        .arg("--no-progress")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn plot_overlays_saved_runs() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n).to_str().unwrap().to_string();
    assert!(bench(&["--save-json", &p("before.json")]).status.success());
    let out = bench(&["--plot", &p("runs.svg"), "--plot-with", &p("before.json")]);
    assert!(out.status.success(), "{out:?}");
    let svg = std::fs::read_to_string(p("runs.svg")).unwrap();
    for want in [
        "this run: algbw",
        "before (",
        "bandwidth (Gb/s)",
        "message size (bytes, log scale)",
    ] {
        assert!(svg.contains(want), "plot lacks {want}");
    }

    std::fs::write(p("junk.json"), "{\"rows\": 3}").unwrap();
    let out = bench(&["--plot", &p("x.svg"), "--plot-with", &p("junk.json")]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--plot-with") && err.contains("--save-json"),
        "{err}"
    );
}
