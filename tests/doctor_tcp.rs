//! `switchless doctor` on point-to-point TCP links (netdevs without RDMA): which links count, each
//! TCP check by (check id, object, severity) on the fixture trees, missing sources, odd files, the
//! JSON fields, and `--capture` replaying (including the `ethtool -k` text).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use switchless::findings::Severity::{self, Info, Warning};
use switchless::host::{self, reader::Reader};
use switchless::tools::doctor;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fabric")
        .join(name)
}

type Found = Vec<(String, String, Severity)>;

fn findings_at(root: &Path) -> (Found, u8) {
    let (m, f) = host::discover(root);
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

fn findings(name: &str) -> (Found, u8) {
    findings_at(&fixture(name))
}

/// What the TCP host has with no tuning problem: no RDMA at all (a supported setup: the plugin
/// carries it over TCP, so only an info), and three addressed netdevs.
const TCP_BASE: &[(&str, &str, Severity)] = &[
    ("no-rdma-devices", "host", Info),
    ("address-without-rdma", "netdev eno1", Info),
    ("address-without-rdma", "netdev enp65s0f0", Info),
    ("address-without-rdma", "netdev enp65s0f1", Info),
];

fn tcp_with(extra: &[(&str, &str, Severity)]) -> Found {
    let mut v: Found = TCP_BASE
        .iter()
        .chain(extra)
        .map(|(c, o, s)| (c.to_string(), o.to_string(), *s))
        .collect();
    v.sort();
    v
}

fn tcp_only(f: &Found) -> Found {
    f.iter()
        .filter(|(c, _, _)| c.starts_with("tcp-"))
        .cloned()
        .collect()
}

#[test]
fn healthy_tcp_host_has_no_tcp_findings() {
    let (f, s) = findings("tcp-2link");
    assert_eq!(f, tcp_with(&[]));
    assert!(tcp_only(&f).is_empty());
    assert_eq!(s, 0); // a healthy TCP host: no-rdma-devices is an info there

    let (m, _) = host::discover(&fixture("tcp-2link"));
    let names: Vec<_> = m.tcp_links.iter().map(|t| t.netdev.as_str()).collect();
    // eno1 (192.168.10.11/24 with a gateway, MTU 1500, 1 queue, GRO off) is not point-to-point.
    assert_eq!(names, ["enp65s0f0", "enp65s0f1"]);
    let t = &m.tcp_links[0];
    assert_eq!(t.addr.to_string(), "10.10.0.1/30");
    assert_eq!(t.point_to_point, "/30");
    assert_eq!(t.speed_mbps, Some(10_000));
    assert_eq!(t.mtu, Some(9000));
    assert_eq!(t.rx_queues, Some(8));
    assert_eq!(t.streams, 4);
    let feat = t.features.as_ref().unwrap();
    assert_eq!(feat.source, "/ethtool-k/enp65s0f0");
    assert!(feat.gro.unwrap().on && feat.tso.unwrap().on);
    let b = m.tcp_buffers.unwrap();
    assert_eq!(b.rmem_max, Some(64 << 20));
    assert_eq!(b.wmem_max, Some(64 << 20));
    assert_eq!(b.tcp_rmem_max, Some(64 << 20));
    assert_eq!(b.tcp_wmem_max, Some(64 << 20));
}

#[test]
fn mtu_1500_on_tcp_links() {
    let (f, s) = findings("broken-tcp-mtu1500");
    assert_eq!(
        f,
        tcp_with(&[
            ("tcp-mtu-below-9000", "netdev enp65s0f0", Warning),
            ("tcp-mtu-below-9000", "netdev enp65s0f1", Warning),
        ])
    );
    assert_eq!(s, 1);
    let (m, f) = host::discover(&fixture("broken-tcp-mtu1500"));
    let r = doctor::report(&m, &[], f);
    let g = r
        .findings
        .iter()
        .find(|f| f.check == "tcp-mtu-below-9000")
        .unwrap();
    assert!(g.message.contains("MTU 1500 bytes"), "{}", g.message);
    assert!(g.message.contains("10000 Mb/s"), "{}", g.message);
    assert!(g.remedy.contains("mtu 9000"), "{}", g.remedy);
}

#[test]
fn gro_or_tso_off() {
    let (f, _) = findings("broken-tcp-offload");
    assert_eq!(
        f,
        tcp_with(&[
            ("tcp-offload-off", "netdev enp65s0f0", Warning),
            ("tcp-offload-off", "netdev enp65s0f1", Warning),
        ])
    );
    let (m, f) = host::discover(&fixture("broken-tcp-offload"));
    let r = doctor::report(&m, &[], f);
    let msg = |obj: &str| {
        r.findings
            .iter()
            .find(|f| f.check == "tcp-offload-off" && f.object == obj)
            .unwrap()
            .message
            .clone()
    };
    let a = msg("netdev enp65s0f0");
    assert!(a.contains("GRO off") && !a.contains("TSO off"), "{a}");
    let b = msg("netdev enp65s0f1");
    assert!(
        b.contains("TSO off [fixed]") && !b.contains("GRO off"),
        "{b}"
    );
}

#[test]
fn too_few_receive_queues() {
    let (f, _) = findings("broken-tcp-queues");
    assert_eq!(
        f,
        tcp_with(&[("tcp-rx-queues-low", "netdev enp65s0f0", Warning)])
    );
    let (m, f) = host::discover(&fixture("broken-tcp-queues"));
    let r = doctor::report(&m, &[], f);
    let g = r
        .findings
        .iter()
        .find(|f| f.check == "tcp-rx-queues-low")
        .unwrap();
    assert!(g.message.contains("1 receive queue"), "{}", g.message);
    assert!(g.message.contains("4 streams"), "{}", g.message);
    assert!(g.remedy.contains("ethtool -L enp65s0f0 combined 4"));
}

#[test]
fn small_socket_buffer_limits() {
    let (f, _) = findings("broken-tcp-buffers");
    assert_eq!(
        f,
        tcp_with(&[("tcp-socket-buffers-low", "host TCP buffer limits", Warning)])
    );
    let (m, f) = host::discover(&fixture("broken-tcp-buffers"));
    let r = doctor::report(&m, &[], f);
    let g = r
        .findings
        .iter()
        .find(|f| f.check == "tcp-socket-buffers-low")
        .unwrap();
    // 10 Gb/s, 4 streams, 100 µs: the transport's 256 KiB floor.
    assert!(
        g.message.contains("262144 bytes (0.25 MiB)"),
        "{}",
        g.message
    );
    assert!(g.message.contains("rmem_max 212992 bytes"), "{}", g.message);
    assert!(g.message.contains("enp65s0f0"), "{}", g.message);
    assert!(
        g.remedy.contains("net.core.rmem_max=262144"),
        "{}",
        g.remedy
    );
}

/// Copies a fixture (symlinks kept) into a temporary directory to vary one file.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let st = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", fixture(name).display()))
        .arg(d.path())
        .status()
        .unwrap();
    assert!(st.success());
    d
}

#[test]
fn autotuning_ceiling_or_core_maximum_is_enough() {
    // Debian's defaults: net.core.rmem_max 208 KiB, but autotuning reaches 6 MiB / 4 MiB. The
    // transport keeps autotuning then, so nothing is wrong.
    let d = copy_fixture("broken-tcp-buffers");
    let w = |p: &str, s: &str| std::fs::write(d.path().join(p), s).unwrap();
    w("proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t6291456\n");
    w("proc/sys/net/ipv4/tcp_wmem", "4096\t16384\t4194304\n");
    assert_eq!(findings_at(d.path()).0, tcp_with(&[]));
    // Small autotuning ceilings but a large net.core maximum: explicit buffers get the size.
    w("proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t212992\n");
    w("proc/sys/net/core/rmem_max", "1048576\n");
    w("proc/sys/net/core/wmem_max", "1048576\n");
    assert_eq!(findings_at(d.path()).0, tcp_with(&[]));
    // Only wmem_max small: still short.
    w("proc/sys/net/core/wmem_max", "212992\n");
    assert_eq!(
        findings_at(d.path()).0,
        tcp_with(&[("tcp-socket-buffers-low", "host TCP buffer limits", Warning)])
    );
}

#[test]
fn missing_sources_skip_their_check() {
    // Every TCP problem at once, then the sources removed one by one.
    let d = copy_fixture("tcp-2link");
    let p = d.path();
    for (link, nd) in [("enp65s0f0", 0), ("enp65s0f1", 1)] {
        let dir = format!("sys/devices/pci0000:40/0000:40:01.1/0000:41:00.{nd}/net/{link}");
        std::fs::write(p.join(&dir).join("mtu"), "1500\n").unwrap();
        for q in 1..8 {
            std::fs::remove_dir_all(p.join(&dir).join(format!("queues/rx-{q}"))).unwrap();
        }
        std::fs::write(
            p.join("ethtool-k").join(link),
            "Features for x:\ntcp-segmentation-offload: off\ngeneric-receive-offload: off\n",
        )
        .unwrap();
    }
    std::fs::write(p.join("proc/sys/net/core/rmem_max"), "4096\n").unwrap();
    std::fs::write(p.join("proc/sys/net/ipv4/tcp_rmem"), "4096 4096 4096\n").unwrap();
    let all = tcp_only(&findings_at(p).0);
    assert_eq!(all.len(), 7, "{all:?}"); // 2 MTU + 2 offload + 2 queues + 1 buffers
    std::fs::remove_dir_all(p.join("ethtool-k")).unwrap();
    let f = tcp_only(&findings_at(p).0);
    assert!(f.iter().all(|(c, _, _)| c != "tcp-offload-off"), "{f:?}");
    assert_eq!(f.len(), 5);
    std::fs::remove_file(p.join("proc/sys/net/ipv4/tcp_wmem")).unwrap();
    let f = tcp_only(&findings_at(p).0);
    assert!(
        f.iter().all(|(c, _, _)| c != "tcp-socket-buffers-low"),
        "{f:?}"
    );
    for nd in 0..2 {
        std::fs::remove_dir_all(p.join(format!(
            "sys/devices/pci0000:40/0000:40:01.1/0000:41:00.{nd}/net/enp65s0f{nd}/queues"
        )))
        .unwrap();
    }
    let (f, _) = findings_at(p);
    assert_eq!(
        tcp_only(&f),
        tcp_with(&[
            ("tcp-mtu-below-9000", "netdev enp65s0f0", Warning),
            ("tcp-mtu-below-9000", "netdev enp65s0f1", Warning),
        ])
        .into_iter()
        .filter(|(c, _, _)| c.starts_with("tcp-"))
        .collect::<Vec<_>>()
    );
    // No kernel-file warning for sources that are simply absent.
    assert!(f.iter().all(|(c, _, _)| c != "kernel-file"), "{f:?}");
}

#[test]
fn odd_tcp_files_are_kernel_file_warnings() {
    let d = copy_fixture("tcp-2link");
    let p = d.path();
    std::fs::write(p.join("proc/sys/net/core/rmem_max"), "lots\n").unwrap();
    std::fs::write(p.join("proc/sys/net/ipv4/tcp_wmem"), "4096\n").unwrap();
    std::fs::write(p.join("ethtool-k/enp65s0f1"), "no features here\n").unwrap();
    let (f, _) = findings_at(p);
    assert_eq!(
        f,
        tcp_with(&[
            ("kernel-file", "file /proc/sys/net/core/rmem_max", Warning),
            ("kernel-file", "file /proc/sys/net/ipv4/tcp_wmem", Warning),
            ("kernel-file", "file /ethtool-k/enp65s0f1", Warning),
        ])
    );
}

#[test]
fn only_slash_30_and_31_subnets_are_tcp_links() {
    // Management NICs on a /24 with a gateway (enP7s7, eno1) are never TCP links; RoCE netdevs are not.
    for name in [
        "gb10-2cable",
        "b300-2node",
        "b300-4node",
        "captured/rxe-2vm-node0",
    ] {
        let (m, _) = host::discover(&fixture(name));
        assert!(m.tcp_links.is_empty(), "{name}: {:?}", m.tcp_links);
        assert!(m.tcp_buffers.is_none(), "{name}");
    }
    // A function without RDMA on a /24 that holds one neighbour today (a two-node LAN, the soft-RoCE
    // lab's management hub) is not a cable: the plugin's TCP paths use /30 and /31 only, and doctor
    // follows the same rule. Adding a second neighbour changes nothing.
    let d = copy_fixture("broken-address-without-rdma");
    let (m, _) = host::discover(d.path());
    assert!(m.tcp_links.is_empty(), "{:?}", m.tcp_links);
    assert!(tcp_only(&findings("broken-address-without-rdma").0).is_empty());
    let arp = d.path().join("proc/4242/net/arp");
    let mut s = std::fs::read_to_string(&arp).unwrap();
    s.push_str(
        "192.168.102.12   0x1         0x2         4c:bb:47:a2:c3:ee     *        enp1s0f1np1\n",
    );
    std::fs::write(&arp, s).unwrap();
    let (m, _) = host::discover(d.path());
    assert!(m.tcp_links.is_empty(), "{:?}", m.tcp_links);
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchless"))
}

#[test]
fn cli_json_and_text_show_tcp_links() {
    let out = bin()
        .args(["doctor", "--json", "--root"])
        .arg(fixture("broken-tcp-queues"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &v["tcp_links"];
    assert_eq!(t.as_array().unwrap().len(), 2);
    assert_eq!(t[0]["netdev"], "enp65s0f0");
    assert_eq!(t[0]["addr"], "10.10.0.1/30");
    assert_eq!(t[0]["point_to_point"], "/30");
    assert_eq!(t[0]["speed_mbps"], 10000);
    assert_eq!(t[0]["rx_queues"], 1);
    assert_eq!(t[0]["streams"], 4);
    assert_eq!(t[0]["features"]["gro"]["on"], true);
    assert_eq!(v["tcp_buffers"]["rmem_max"], 67108864);
    assert_eq!(v["tcp_buffers"]["tcp_wmem_max"], 67108864);

    let out = bin()
        .args(["doctor", "--root"])
        .arg(fixture("broken-tcp-queues"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("TCP point-to-point links:"), "{text}");
    assert!(
        text.contains("enp65s0f0 10.10.0.1/30 (/30): 10000 Mb/s, MTU 9000 bytes, 1 rx queues for 4 streams, GRO on, TSO on"),
        "{text}"
    );

    // A RoCE-only host's JSON has an empty list and a null buffer object.
    let out = bin()
        .args(["doctor", "--json", "--root"])
        .arg(fixture("gb10-2cable"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tcp_links"].as_array().unwrap().len(), 0);
    assert!(v["tcp_buffers"].is_null());
}

#[test]
fn capture_of_a_tcp_host_replays_identically() {
    for name in [
        "broken-tcp-offload",
        "broken-tcp-queues",
        "broken-tcp-buffers",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cap = dir.path().join("cap");
        let a = bin()
            .args(["doctor", "--json", "--root"])
            .arg(fixture(name))
            .arg("--capture")
            .arg(&cap)
            .output()
            .unwrap();
        assert_eq!(a.status.code(), Some(1), "{name}");
        // The ethtool text, the queue directories and the sysctls are in the capture.
        assert!(cap.join("ethtool-k/enp65s0f0").is_file(), "{name}");
        assert!(cap.join("proc/sys/net/ipv4/tcp_rmem").is_file(), "{name}");
        assert!(
            cap.join("sys/class/net/enp65s0f0/queues/rx-0").is_dir(),
            "{name}"
        );
        // Not read for eno1 (not a TCP link), so not captured.
        assert!(!cap.join("ethtool-k/eno1").exists(), "{name}");
        let b = bin()
            .args(["doctor", "--json", "--root"])
            .arg(&cap)
            .output()
            .unwrap();
        let mut va: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
        let mut vb: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
        va["root"] = serde_json::Value::Null;
        vb["root"] = serde_json::Value::Null;
        assert_eq!(va, vb, "{name}");
    }
}

#[test]
fn live_tool_output_is_captured_as_a_file() {
    // On a live host (root /) the tool runs only when allowed, and its output is captured at the
    // logical path. `echo` stands in for ethtool.
    let r = Reader::recording(Path::new("/"));
    assert!(r.tool_output("/ethtool-k/x", &["echo", "hi"]).is_err());
    let r = Reader::recording(Path::new("/")).with_tools(true);
    let text = r
        .tool_output("/ethtool-k/x", &["echo", "generic-receive-offload: off"])
        .unwrap();
    assert_eq!(text, "generic-receive-offload: off");
    assert!(
        r.tool_output("/ethtool-k/y", &["false"]).is_err(),
        "a failing tool is an error"
    );
    assert!(
        r.tool_output("/ethtool-k/z", &["/nonexistent/ethtool"])
            .is_err()
    );
    let out = tempfile::tempdir().unwrap();
    let n = host::reader::capture(&r, out.path()).unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        std::fs::read_to_string(out.path().join("ethtool-k/x")).unwrap(),
        "generic-receive-offload: off\n"
    );
    let replay = Reader::new(out.path());
    assert_eq!(
        replay
            .tool_output("/ethtool-k/x", &["must-not-run"])
            .unwrap(),
        "generic-receive-offload: off"
    );
}

#[test]
fn default_memlock_is_no_error_on_a_host_carried_over_tcp() {
    // Ubuntu's 8 MiB limit on a host without RDMA: the TCP transport registers nothing, so the
    // report stays healthy (the preflight passes) and the limit is only an info.
    let (f, s) = findings("tcp-memlock-8m");
    assert_eq!(
        f,
        tcp_with(&[("memlock-low", "process RLIMIT_MEMLOCK", Info)])
    );
    assert_eq!(s, 0);
    let out = bin()
        .env_remove("NCCL_SWITCHLESS_TRANSPORT")
        .args(["doctor", "--root"])
        .arg(fixture("tcp-memlock-8m"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("verdict: healthy"), "{text}");
    assert!(
        text.contains("8388608 bytes (8 MiB) soft")
            && text.contains("registers no memory with RDMA"),
        "{text}"
    );

    // With RoCE the limit stays an error.
    let (m, f) = host::discover(&fixture("broken-memlock"));
    let r = doctor::report(&m, &m.nccl_devices(&|_, _| true, &|_| false), f);
    let ml = r
        .findings
        .iter()
        .find(|f| f.check == "memlock-low")
        .unwrap();
    assert_eq!(ml.severity, Severity::Error);
    // The remedy names the knobs a Slurm job's limit comes from.
    assert!(
        ml.remedy.contains("LimitMEMLOCK=infinity")
            && ml.remedy.contains("PropagateResourceLimitsExcept=MEMLOCK"),
        "{}",
        ml.remedy
    );
}
