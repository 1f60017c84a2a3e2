//! `switchless watch` on copies of the fixture trees whose counters change between two reads:
//! Gb/s from RDMA port counters (4-byte words) and netdev statistics (bytes), the idle-sibling and
//! imbalance flags, the JSON schema, and the command line re-reading the files every interval.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use switchless::host::{self, Reader};
use switchless::tools::watch::{Source, Watch};

fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fabric")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join(name);
    let st = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&dst)
        .status()
        .unwrap();
    assert!(st.success());
    (dir, dst)
}

/// Writes an RDMA port's data counters (4-byte words) through the tree's class link.
fn set_port(root: &Path, dev: &str, xmit_words: u64, rcv_words: u64) {
    let rd = Reader::new(root);
    let p = rd
        .resolve(&format!("/sys/class/infiniband/{dev}/ports/1"))
        .unwrap();
    let d = root.join(p.trim_start_matches('/')).join("counters");
    std::fs::create_dir_all(&d).unwrap();
    write_atomic(&d.join("port_xmit_data"), xmit_words);
    write_atomic(&d.join("port_rcv_data"), rcv_words);
}

/// Replaces a counter file at once, as sysfs reads never see a half-written value.
fn write_atomic(path: &Path, v: u64) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{v}\n")).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn set_netdev(root: &Path, netdev: &str, tx: u64, rx: u64) {
    let rd = Reader::new(root);
    let p = rd.resolve(&format!("/sys/class/net/{netdev}")).unwrap();
    let d = root.join(p.trim_start_matches('/')).join("statistics");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("tx_bytes"), format!("{tx}\n")).unwrap();
    std::fs::write(d.join("rx_bytes"), format!("{rx}\n")).unwrap();
}

#[test]
fn gb10_rates_and_an_idle_function() {
    let (_d, root) = copy_fixture("gb10-2cable");
    for dev in ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"] {
        set_port(&root, dev, 1000, 2000);
    }
    let rd = Reader::new(&root);
    let (m, _) = host::discover_with(&rd);
    let w = Watch::new(&m);
    let a = w.sample(&rd);
    // One second later: cage 0's functions 12.5 GB (100 Gb) sent and 6.25 GB received each; cage 1
    // only through its domain-0 function.
    let gb = 12_500_000_000u64 / 4;
    set_port(&root, "rocep1s0f0", 1000 + gb, 2000 + gb / 2);
    set_port(&root, "roceP2p1s0f0", 1000 + gb, 2000 + gb / 2);
    set_port(&root, "rocep1s0f1", 1000 + gb, 2000 + gb);
    let b = w.sample(&rd);
    let r = w.report(&a, &b, 1.0, 25.0);
    assert_eq!(r.schema, "switchless-watch/1");
    assert_eq!(r.devices.len(), 2);
    let d0 = &r.devices[0];
    assert_eq!(d0.name, "sl_enp1s0f0np0");
    assert_eq!(d0.tx_gbps, Some(200.0));
    assert_eq!(d0.rx_gbps, Some(100.0));
    assert_eq!(d0.members[0].tx_gbps, Some(100.0));
    assert_eq!(d0.members[0].source, Source::PortCounters);
    assert_eq!(
        d0.members[0].faces,
        ["192.168.100.11".parse::<std::net::Ipv4Addr>().unwrap()]
    );
    let d1 = &r.devices[1];
    assert_eq!(d1.members[1].rdma.as_deref(), Some("roceP2p1s0f1:1"));
    assert_eq!(d1.members[1].tx_gbps, Some(0.0));
    let kinds: Vec<(&str, &str)> = r
        .flags
        .iter()
        .map(|f| (f.kind, f.device.as_str()))
        .collect();
    assert_eq!(kinds, [("idle-beside-busy", "sl_enp1s0f1np1")]);
    assert!(
        r.flags[0]
            .message
            .contains("roceP2p1s0f1:1 (enP2p1s0f1np1)")
    );

    // Imbalance: 100 against 60 Gb/s is 40% apart, over 25% but under 50%.
    set_port(
        &root,
        "roceP2p1s0f1",
        1000 + gb * 6 / 10,
        2000 + gb * 6 / 10,
    );
    let c = w.sample(&rd);
    let r = w.report(&a, &c, 1.0, 25.0);
    let kinds: Vec<&str> = r.flags.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, ["imbalance"]);
    assert!(r.flags[0].message.contains("40% apart (threshold 25%)"));
    assert!(w.report(&a, &c, 1.0, 50.0).flags.is_empty());

    // A counter that went backwards (driver reset) gives no rate, not a huge one.
    set_port(&root, "rocep1s0f0", 10, 10);
    let e = w.sample(&rd);
    let r = w.report(&b, &e, 1.0, 25.0);
    assert_eq!(r.devices[0].members[0].tx_gbps, None);
    assert_eq!(r.devices[0].tx_gbps, None);
}

#[test]
fn tcp_links_and_ports_without_data_counters_use_netdev_statistics() {
    let (_d, root) = copy_fixture("tcp-2link");
    set_netdev(&root, "enp65s0f0", 0, 0);
    set_netdev(&root, "enp65s0f1", 0, 0);
    let rd = Reader::new(&root);
    let (m, _) = host::discover_with(&rd);
    let w = Watch::new(&m);
    let a = w.sample(&rd);
    set_netdev(&root, "enp65s0f0", 1_250_000_000, 625_000_000);
    let b = w.sample(&rd);
    let r = w.report(&a, &b, 2.0, 25.0);
    assert!(r.devices.is_empty());
    let names: Vec<&str> = r
        .tcp_links
        .iter()
        .map(|t| t.netdev.as_deref().unwrap())
        .collect();
    assert_eq!(names, ["enp65s0f0", "enp65s0f1"]);
    assert_eq!(r.tcp_links[0].tx_gbps, Some(5.0));
    assert_eq!(r.tcp_links[0].rx_gbps, Some(2.5));
    assert_eq!(r.tcp_links[0].source, Source::NetdevStatistics);
    assert_eq!(r.tcp_links[0].speed_mbps, 10000);

    // rdma_rxe: no counters/ directory; the port's netdev carries the RoCE packets.
    let (_d, root) = copy_fixture("gb10-1cable");
    set_netdev(&root, "enp1s0f0np0", 0, 0);
    let rd = Reader::new(&root);
    let (m, _) = host::discover_with(&rd);
    let w = Watch::new(&m);
    let a = w.sample(&rd);
    set_netdev(&root, "enp1s0f0np0", 125_000_000, 0);
    let b = w.sample(&rd);
    let r = w.report(&a, &b, 1.0, 25.0);
    let m0 = &r.devices[0].members[0];
    assert_eq!(m0.source, Source::NetdevStatistics);
    assert_eq!(m0.tx_gbps, Some(1.0));
    // The sibling has no counter at all: unknown, and no flag from an unknown.
    let m1 = &r.devices[0].members[1];
    assert_eq!(m1.source, Source::None);
    assert_eq!(m1.tx_gbps, None);
    assert!(r.flags.is_empty());
}

/// The command line re-reads the files every interval: a writer bumps the counters while it runs.
#[test]
fn cli_reads_the_counters_again_every_interval() {
    let (_d, root) = copy_fixture("gb10-2cable");
    for dev in ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"] {
        set_port(&root, dev, 0, 0);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (root, stop) = (root.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut v = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                v += 1_000_000;
                set_port(&root, "rocep1s0f0", v, v);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args([
            "watch",
            "--json",
            "--interval",
            "0.3",
            "--count",
            "2",
            "--root",
        ])
        .arg(&root)
        .output()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["schema"], "switchless-watch/1");
        let m = &v["devices"][0]["members"][0];
        assert_eq!(m["rdma"], "rocep1s0f0:1");
        assert!(m["tx_gbps"].as_f64().unwrap() > 0.0, "{l}");
        assert_eq!(v["devices"][0]["members"][1]["tx_gbps"], 0.0);
        assert_eq!(v["flags"][0]["kind"], "idle-beside-busy");
    }

    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(["watch", "--once", "--interval", "0.05", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("TX Gb/s"), "{text}");
    assert!(text.contains("0 sl_enp1s0f0np0"), "{text}");
    assert!(text.contains("192.168.100.11"), "{text}");

    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(["watch", "--once", "--interval", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected seconds"));
}

/// A snapshot file as a rank writes it (`NCCL_SWITCHLESS_METRICS_DIR`): one send path on
/// `enp1s0f0np0` with `sent` bytes at `t_ms`, its plugin's hash `sha`.
fn write_snapshot(dir: &Path, pid: u32, t_ms: u64, sent: u64, sha: &str) {
    use switchless::transport::metrics::{Build, PathId, PathTotal, SNAPSHOT_SCHEMA, Snapshot};
    let s = Snapshot {
        schema: SNAPSHOT_SCHEMA.into(),
        host: "node1".into(),
        pid,
        time_unix_ms: t_ms,
        interval_ms: 100,
        last: false,
        build: Build {
            version: "0.1.0".into(),
            commit: "abc".into(),
            plugin_sha256: sha.into(),
            nccl_sha256: "n".into(),
            ..Build::default()
        },
        devices: vec![switchless::transport::metrics::DeviceSnap {
            nccl_dev: 0,
            name: "rocep1s0f0".into(),
            registrations: 2,
            registered_bytes: 2 << 20,
            pinned_bytes: 1 << 20,
        }],
        connections: Vec::new(),
        paths: vec![PathTotal {
            id: PathId {
                direction: "send".into(),
                peer: "192.168.100.12".into(),
                nccl_dev: 0,
                netdev: "enp1s0f0np0".into(),
                rdma_dev: "rocep1s0f0".into(),
                pci_root: "pci0000:00".into(),
                local: "192.168.100.11/31".into(),
                remote: "192.168.100.12".into(),
                kind: "verbs".into(),
            },
            connections_live: 1,
            carrying: 1,
            sent_bytes: sent,
            ..PathTotal::default()
        }],
    };
    let p = dir.join(format!("switchless-metrics-node1-{pid}.json"));
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&s).unwrap()).unwrap();
    std::fs::rename(tmp, p).unwrap();
}

#[test]
fn cli_merges_the_plugin_snapshots_and_writes_prometheus_text() {
    let (_d, root) = copy_fixture("gb10-1cable");
    let m = tempfile::tempdir().unwrap();
    write_snapshot(m.path(), 10, 1_000, 0, "p1");
    write_snapshot(m.path(), 11, 1_000, 0, "p1");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two ranks send 1 GB per second each (by their snapshots' own clocks) on the same path.
    let writer = {
        let stop = stop.clone();
        let dir = m.path().to_path_buf();
        std::thread::spawn(move || {
            let mut t = 1_000;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                t += 100;
                for pid in [10, 11] {
                    write_snapshot(&dir, pid, t, (t - 1_000) * 1_000_000, "p1");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        })
    };
    let prom = m.path().join("out.prom");
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(["watch", "--json", "--interval", "0.3", "--count", "1"])
        .arg("--root")
        .arg(&root)
        .arg("--metrics-dir")
        .arg(m.path())
        .arg("--prometheus")
        .arg(&prom)
        .output()
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["plugin"]["paths"][0];
    assert_eq!(p["netdev"], "enp1s0f0np0");
    // 2 × 1 GB/s = 16 Gb/s, whatever the (snapshot) interval.
    let g = p["gbps"].as_f64().unwrap();
    assert!((g - 16.0).abs() < 0.01, "{p}");
    assert_eq!(p["share_pct"], 100.0);
    assert_eq!(v["plugin"]["processes"].as_array().unwrap().len(), 2);
    // Per device, summed over the two ranks: registered twice the pinned bytes each.
    let d = &v["plugin"]["devices"][0];
    assert_eq!(
        (d["registered_bytes"].as_u64(), d["pinned_bytes"].as_u64()),
        (Some(4 << 20), Some(2 << 20)),
        "{d}"
    );
    let text = std::fs::read_to_string(&prom).unwrap();
    assert!(
        text.contains("# TYPE switchless_path_sent_bytes_total counter"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("switchless_path_sent_bytes_total{host=\"node1\",peer=\"192.168.100.12\",direction=\"send\"")),
        "{text}"
    );
    assert!(
        text.contains("# TYPE switchless_device_pinned_bytes gauge"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l
            == "switchless_device_pinned_bytes{host=\"node1\",nccl_dev=\"0\",device=\"rocep1s0f0\"} 2097152"),
        "{text}"
    );

    // A third rank with another plugin build: reported, and --check-builds fails.
    write_snapshot(m.path(), 12, 1_000, 0, "p2");
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(["watch", "--once", "--interval", "0.05", "--check-builds"])
        .arg("--root")
        .arg(&root)
        .arg("--metrics-dir")
        .arg(m.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("MISMATCH node1:12 runs plugin 0.1.0 (commit abc, sha256 p2)"),
        "{text}"
    );
    // --prometheus without a metrics directory is a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(["watch", "--once", "--prometheus", "x.prom"])
        .env_remove("NCCL_SWITCHLESS_METRICS_DIR")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
