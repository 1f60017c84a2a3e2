//! The nccl-tests launchers (`nccl-tests/*.sh`) without a cluster: their dry runs, and runs through
//! stand-in `srun` / `mpirun` commands that behave as the real ones do where it matters here (mpirun
//! gives a rank only the variables named with `-x`; pyxis shows a container only its mounts).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script(name: &str) -> PathBuf {
    repo().join("nccl-tests").join(name)
}

fn write_exe(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A launcher run in a clean environment (`PATH` with `bin` first, `HOME`, then `env`) from `cwd`:
/// (exit status, stdout, stderr).
fn launch(
    cwd: &Path,
    bin: Option<&Path>,
    env: &[(&str, &str)],
    args: &[&str],
) -> (i32, String, String) {
    let path = match bin {
        Some(b) => format!(
            "{}:{}",
            b.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        None => std::env::var("PATH").unwrap_or_default(),
    };
    let mut c = Command::new("bash");
    c.env_clear()
        .env("PATH", path)
        .env("HOME", cwd)
        .current_dir(cwd)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A plugin prefix with the library the launchers look for.
fn plugin_dir(tmp: &Path) -> PathBuf {
    let p = tmp.join("prefix");
    std::fs::create_dir_all(p.join("lib")).unwrap();
    std::fs::write(p.join("lib/libnccl-net-switchless.so"), "").unwrap();
    p
}

/// A stand-in `all_reduce_perf` that records the environment its rank got, then prints a passing
/// run of the fixtures.
fn fake_tests(tmp: &Path) -> PathBuf {
    let d = tmp.join("nccl-tests-bin");
    let fixture = repo().join("tests/fixtures/nccl-tests/b300-2node-all_reduce-switchless.log");
    write_exe(
        &d.join("all_reduce_perf"),
        &format!(
            "#!/bin/sh\nenv > \"$SWITCHLESS_LOG_DIR/rank-env.$$\"\ncat {}\n",
            fixture.display()
        ),
    );
    d
}

/// A stand-in mpirun: a rank gets only PATH plus what `-x NAME=VALUE` (or `-x NAME`, from here)
/// names, as on a remote host reached over ssh; runs the command once.
const FAKE_MPIRUN: &str = r#"#!/usr/bin/env bash
envs=("PATH=$PATH")
while [ $# -gt 0 ] && [ "$1" != bash ]; do
  case "$1" in
    -x) case "$2" in *=*) envs+=("$2") ;; *) envs+=("$2=${!2-}") ;; esac; shift 2 ;;
    --mca) shift 3 ;;
    -np | -H | --map-by | --bind-to) shift 2 ;;
    *) shift ;;
  esac
done
exec env -i "${envs[@]}" "$@"
"#;

#[test]
fn mpirun_forwards_every_nccl_variable_of_the_shell() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let caller = [
        ("NCCL_NET", "switchless"),
        ("NCCL_SWITCHLESS_TCP_FALLBACK", "1"),
        ("NCCL_CROSS_NIC", "1"),
        ("NCCL_IB_HCA", "=mlx5_0,mlx5_1"),
        ("UNRELATED", "x"),
    ];
    let mpirun = script("mpirun-nccl-tests.sh");
    let mpirun = mpirun.to_str().unwrap();
    // The dry run names each one with -x (pasteable elsewhere: with its value).
    let (rc, out, err) = launch(
        t,
        None,
        &caller,
        &[
            mpirun,
            "-H",
            "spark-a,spark-b",
            "-g",
            "1",
            "-o",
            "out",
            "--dry-run",
        ],
    );
    assert_eq!(rc, 0, "{err}");
    for want in [
        "-x NCCL_NET=switchless",
        "-x NCCL_SWITCHLESS_TCP_FALLBACK=1",
        "-x NCCL_CROSS_NIC=1",
        "-x NCCL_IB_HCA==mlx5_0\\,mlx5_1",
    ] {
        assert!(out.contains(want), "dry run lacks {want}:\n{out}");
    }
    assert!(!out.contains("UNRELATED"), "{out}");
    // The launcher's own settings win over the shell's (its --quiet beats NCCL_DEBUG=INFO here).
    let (_, out, _) = launch(
        t,
        None,
        &[("NCCL_DEBUG", "INFO")],
        &[
            mpirun,
            "-H",
            "a,b",
            "-g",
            "1",
            "--quiet",
            "-o",
            "out",
            "--dry-run",
        ],
    );
    assert!(out.contains("-x NCCL_DEBUG=WARN"), "{out}");
    assert!(!out.contains("-x NCCL_DEBUG=INFO"), "{out}");

    // Through a stand-in mpirun that gives a rank only what -x names: the variables arrive.
    let bin = t.join("bin");
    write_exe(&bin.join("mpirun"), FAKE_MPIRUN);
    let tests = fake_tests(t);
    let prefix = plugin_dir(t);
    let (rc, out, err) = launch(
        t,
        Some(&bin),
        &[
            caller[0],
            caller[1],
            caller[2],
            ("SWITCHLESS_BIN", env!("CARGO_BIN_EXE_switchless")),
        ],
        &[
            mpirun,
            "-H",
            "a,b",
            "-g",
            "1",
            "--no-preflight",
            "--plugin-dir",
            prefix.to_str().unwrap(),
            "--nccl-tests-dir",
            tests.to_str().unwrap(),
            "-o",
            "run",
        ],
    );
    assert_eq!(rc, 0, "{out}\n{err}");
    let envs: Vec<PathBuf> = std::fs::read_dir(t.join("run"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("rank-env.")
        })
        .collect();
    assert_eq!(envs.len(), 1, "{envs:?}");
    let rank = std::fs::read_to_string(&envs[0]).unwrap();
    for want in [
        "NCCL_NET=switchless",
        "NCCL_SWITCHLESS_TCP_FALLBACK=1",
        "NCCL_CROSS_NIC=1",
        "NCCL_NET_PLUGIN=switchless",
    ] {
        assert!(
            rank.lines().any(|l| l == want),
            "the rank lacks {want}:\n{rank}"
        );
    }
}

#[test]
fn srun_dry_run_shows_the_shell_nccl_variables() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let prefix = plugin_dir(t);
    let (rc, out, err) = launch(
        t,
        None,
        &[("NCCL_CROSS_NIC", "1"), ("NCCL_SOCKET_IFNAME", "eno1")],
        &[
            script("srun-nccl-tests.sh").to_str().unwrap(),
            "-N",
            "2",
            "-g",
            "1",
            "--plugin-dir",
            prefix.to_str().unwrap(),
            "-o",
            "out",
            "--dry-run",
        ],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("export NCCL_CROSS_NIC=1"), "{out}");
    // Set by the launcher (-i defaults to NCCL_SOCKET_IFNAME): once, not twice.
    assert_eq!(
        out.matches("export NCCL_SOCKET_IFNAME=eno1").count(),
        1,
        "{out}"
    );
}

/// A stand-in srun with pyxis: the command sees only what `--container-mounts` mounts, so every
/// `--plan` argument must lie under a mount's destination (else it fails as doctor would: cannot
/// read); then runs the command on two "nodes".
const FAKE_SRUN: &str = r#"#!/usr/bin/env bash
mounts=""
while [ $# -gt 0 ] && [ "$1" != bash ]; do
  case "$1" in --container-mounts=*) mounts="${1#--container-mounts=}" ;; esac
  shift
done
prev=""
for a in "$@"; do
  p=""
  case "$a" in --plan=*) p="${a#--plan=}" ;; esac
  [ "$prev" = --plan ] && p="$a"
  prev="$a"
  [ -n "$p" ] || continue
  ok=0
  IFS=, read -r -a list <<< "$mounts"
  for m in "${list[@]}"; do
    dst="${m#*:}"; dst="${dst%%:*}"
    case "$p" in "$dst"/*) ok=1 ;; esac
  done
  if [ "$ok" = 0 ]; then
    echo "switchless preflight: node=node1 FAIL: switchless doctor: command line: --plan $p: cannot read: not mounted in the container"
    exit 1
  fi
done
rc=0
for n in node1 node2; do SLURMD_NODENAME=$n "$@" || rc=$?; done
exit "$rc"
"#;

#[test]
fn srun_preflight_reads_the_plan_inside_the_container() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let prefix = plugin_dir(t);
    // The plan lives outside every mount (as /shared/plan.json in the help's example).
    let shared = t.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let plan = shared.join("plan.json");
    let json = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(["plan", "-", "--model", "b300", "--format", "json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().unwrap().write_all(b"1-1 > 2-1\n")?;
            c.wait_with_output()
        })
        .unwrap();
    std::fs::write(&plan, json.stdout).unwrap();
    let srun = script("srun-nccl-tests.sh");
    let plan_arg = format!("--preflight-arg=--plan={}", plan.display());
    let common = [
        srun.to_str().unwrap(),
        "-N",
        "2",
        "-g",
        "8",
        "--plugin-dir",
        prefix.to_str().unwrap(),
        "-i",
        "eno1",
        plan_arg.as_str(),
    ];
    // The dry run shows the copy into the output directory and the preflight reading the copy.
    let mut args = common.to_vec();
    args.extend(["-o", "out", "--dry-run"]);
    let (rc, out, err) = launch(t, None, &[], &args);
    assert_eq!(rc, 0, "{err}");
    let out_dir = t.join("out");
    let staged = out_dir.join("preflight-plan.json");
    assert!(
        out.contains(&format!("cp -- {} {}", plan.display(), staged.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("rank.sh --preflight --plan={}", staged.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("--container-mounts={0}:{0}", out_dir.display())),
        "{out}"
    );
    assert!(!out_dir.exists(), "a dry run creates nothing");

    // Run through the stand-in srun: the preflight's doctor reads the plan (checks this host
    // against it) instead of failing on an unreadable file.
    let bin = t.join("bin");
    write_exe(&bin.join("srun"), FAKE_SRUN);
    let tests = fake_tests(t);
    let mut args = common.to_vec();
    let root = format!(
        "--preflight-arg=--root={}",
        repo().join("tests/fixtures/fabric/b300-2node").display()
    );
    args.extend([
        root.as_str(),
        "--preflight-arg=--server=1",
        "--nccl-tests-dir",
        tests.to_str().unwrap(),
        "-o",
        "run",
    ]);
    let (rc, out, err) = launch(
        t,
        Some(&bin),
        &[("SWITCHLESS_BIN", env!("CARGO_BIN_EXE_switchless"))],
        &args,
    );
    assert!(!out.contains("cannot read"), "{out}\n{err}");
    assert!(t.join("run/preflight-plan.json").is_file());
    // The fixture follows another addressing scheme than this plan: the preflight reports that,
    // which it can only do having read the plan.
    assert!(out.contains("plan-addressing-differs"), "{out}\n{err}");
    assert_eq!(rc, 2, "{out}\n{err}");

    // A plan that is not there stops a real run before anything starts, naming it.
    let missing = format!("--preflight-arg=--plan={}", t.join("nope.json").display());
    let mut args = common.to_vec();
    args[9] = missing.as_str();
    args.extend(["-o", "run2"]);
    let (rc, _, err) = launch(t, Some(&bin), &[], &args);
    assert_eq!(rc, 2);
    assert!(
        err.contains("cannot read") && err.contains("nope.json"),
        "{err}"
    );
}

#[test]
fn srun_in_a_container_passes_the_rdma_devices() {
    // pyxis/enroot's Mellanox hook needs MELLANOX_VISIBLE_DEVICES; the launcher sets it (yours wins),
    // and not without a container.
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let prefix = plugin_dir(t);
    let srun = script("srun-nccl-tests.sh");
    let base = [
        srun.to_str().unwrap(),
        "-N",
        "2",
        "--plugin-dir",
        prefix.to_str().unwrap(),
        "-o",
        "out",
        "--dry-run",
    ];
    let (rc, out, err) = launch(t, None, &[], &base);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("export MELLANOX_VISIBLE_DEVICES=all"), "{out}");
    let (_, out, _) = launch(t, None, &[("MELLANOX_VISIBLE_DEVICES", "0,1")], &base);
    assert!(
        out.contains("export MELLANOX_VISIBLE_DEVICES=0\\,1"),
        "{out}"
    );
    let (_, out, _) = launch(t, None, &[], &[&base[..], &["--no-container"]].concat());
    assert!(!out.contains("MELLANOX_VISIBLE_DEVICES"), "{out}");
}

/// `fleet-doctor.sh --plan --probe` over a stand-in ssh: every host captured with --probe, then the
/// cables file against the captures, one line per planned cable.
#[test]
fn fleet_doctor_checks_the_cables_file_against_the_fabric() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let bin = t.join("bin");
    write_exe(
        &bin.join("ssh"),
        "#!/usr/bin/env bash\n# stand-in ssh: HOST CMD -> run CMD here with FAKE_HOST=HOST\nFAKE_HOST=\"$1\" exec bash -c \"$2\"\n",
    );
    // The remote switchless captures the fixture tree named by the host, noting whether it was asked
    // to probe (a tree cannot be probed: the fixture holds the probe already).
    let fixtures = repo().join("tests/fixtures/fabric/fleet-gb10-mesh3-swapped");
    let remote = t.join("remote-switchless");
    write_exe(
        &remote,
        &format!(
            "#!/usr/bin/env bash\nargs=()\nfor a in \"$@\"; do\n  if [ \"$a\" = --probe ]; then touch {0}/probed-$FAKE_HOST; else args+=(\"$a\"); fi\ndone\nexec {1} \"${{args[0]}}\" --root {2}/$FAKE_HOST \"${{args[@]:1}}\"\n",
            t.display(),
            env!("CARGO_BIN_EXE_switchless"),
            fixtures.display()
        ),
    );
    let plan = repo().join("tests/fixtures/plan/gb10-mesh3.plan.json");
    let (rc, out, err) = launch(
        t,
        Some(&bin),
        &[],
        &[
            script("fleet-doctor.sh").to_str().unwrap(),
            "-H",
            "spark-a,spark-b,spark-c",
            "-o",
            "fleet",
            "--plan",
            plan.to_str().unwrap(),
            "--probe",
            "--bin",
            remote.to_str().unwrap(),
            "--local-bin",
            env!("CARGO_BIN_EXE_switchless"),
        ],
    );
    assert_eq!(rc, 2, "{out}\n{err}");
    for h in ["spark-a", "spark-b", "spark-c"] {
        assert!(
            t.join(format!("probed-{h}")).exists(),
            "{h} was not asked to probe"
        );
        assert!(t.join(format!("fleet/{h}/switchless/probe.json")).is_file());
    }
    assert!(out.contains("Planned cables ("), "{out}");
    assert!(
        out.contains("spark-a port 1 — spark-b port 1  WRONG PORT:  spark-a port 1 (enp1s0f0np0) faces spark-c port 2"),
        "{out}"
    );
    // A plan that is not there is refused before anything is captured.
    let (rc, _, err) = launch(
        t,
        Some(&bin),
        &[],
        &[
            script("fleet-doctor.sh").to_str().unwrap(),
            "-H",
            "a,b",
            "-o",
            "fleet2",
            "--plan",
            "nope.json",
        ],
    );
    assert_eq!(rc, 2);
    assert!(err.contains("--plan nope.json: cannot read"), "{err}");
    assert!(!t.join("fleet2").exists());
}

/// A dry run rehearses on an admin box: no plugin needed (a note says the real run would stop), and
/// it shows the summary step with its --expect-busbw (walkthrough 2, A10).
#[test]
fn a_dry_run_needs_no_plugin_and_shows_the_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (rc, out, err) = launch(
        t,
        None,
        &[],
        &[
            script("srun-nccl-tests.sh").to_str().unwrap(),
            "-N",
            "3",
            "-g",
            "1",
            "-b",
            "1M",
            "-e",
            "8G",
            "--plugin-dir",
            "/shared/switchless",
            "-o",
            "out",
            "--expect-busbw",
            "185Gb/s",
            "--dry-run",
        ],
    );
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains(
            "# note: --plugin-dir /shared/switchless has no lib/libnccl-net-switchless.so here"
        ),
        "{out}"
    );
    let out_dir = t.join("out");
    assert!(
        out.contains(&format!(
            "switchless nccl-tests summarize {0}/all_reduce.out {0}/nccl.all_reduce.*.log --require-plugin --expect-busbw 185Gb/s",
            out_dir.display()
        )),
        "{out}"
    );
    assert!(
        out.contains("all_reduce_perf -b 1M -e 8G -f 2 -g 1"),
        "{out}"
    );
    // The real run stops before anything starts.
    let (rc, _, err) = launch(
        t,
        None,
        &[],
        &[
            script("srun-nccl-tests.sh").to_str().unwrap(),
            "--plugin-dir",
            "/shared/switchless",
            "-o",
            "out",
        ],
    );
    assert_eq!(rc, 2);
    assert!(
        err.contains("has no lib/libnccl-net-switchless.so"),
        "{err}"
    );
    assert!(!out_dir.exists());
}

/// A stand-in srun that applies `--export=ALL,K=V,...` and runs the command on three "nodes",
/// and before node3 replaces the plugin library (`$SWAP_LIB`) with other bytes: node3 has a
/// stale build.
const FAKE_SRUN_STALE: &str = r#"#!/usr/bin/env bash
while [ $# -gt 0 ] && [ "$1" != bash ]; do
  case "$1" in
    --export=*) IFS=, read -r -a kv <<< "${1#--export=}"; for x in "${kv[@]}"; do [ "$x" = ALL ] || export "${x?}"; done ;;
  esac
  shift
done
rc=0
for n in node1 node2 node3; do
  [ "$n" = node3 ] && echo "an older build" > "$SWAP_LIB"
  SLURMD_NODENAME=$n "$@" || rc=$?
done
exit "$rc"
"#;

#[test]
fn the_preflight_names_a_node_with_another_plugin_build() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let prefix = plugin_dir(t);
    let lib = prefix.join("lib/libnccl-net-switchless.so");
    std::fs::write(&lib, "this build").unwrap();
    let bin = t.join("bin");
    write_exe(&bin.join("srun"), FAKE_SRUN_STALE);
    let tests = fake_tests(t);
    let srun = script("srun-nccl-tests.sh");
    let args = [
        srun.to_str().unwrap(),
        "-N",
        "3",
        "-g",
        "1",
        "--no-container",
        "--plugin-dir",
        prefix.to_str().unwrap(),
        "-i",
        "eno1",
        "--nccl-tests-dir",
        tests.to_str().unwrap(),
        "-o",
        "run",
    ];
    let run = |swap: &str| {
        launch(
            t,
            Some(&bin),
            &[
                ("SWAP_LIB", swap),
                // A doctor that passes: the test is about the libraries.
                ("SWITCHLESS_BIN", "/bin/true"),
            ],
            &args,
        )
    };
    let (rc, out, err) = run(lib.to_str().unwrap());
    assert_eq!(rc, 2, "{out}\n{err}");
    let want = format!(
        "node3: plugin {} has sha256 {}",
        lib.display(),
        // sha256("an older build\n")
        sha256_hex(b"an older build\n")
    );
    assert!(err.contains(&want), "{err}");
    assert!(err.contains("2 of 3 node(s) have"), "{err}");
    assert!(!err.contains("node1:"), "{err}");
    // The same library everywhere: the preflight passes this check.
    std::fs::write(&lib, "this build").unwrap();
    let (_, out, err) = run(t.join("elsewhere").to_str().unwrap());
    assert!(!err.contains("do not run the same plugin"), "{out}\n{err}");
    assert!(out.contains("node=node3 attest plugin="), "{out}");
}

fn sha256_hex(b: &[u8]) -> String {
    let mut c = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    c.stdin.take().unwrap().write_all(b).unwrap();
    let o = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}
