//! `switchless bench allreduce|alltoall --model-mesh CABLES --model-kind b300|gb10`: NCCL's
//! patterns over a mesh model built from the cables fixtures of tests/fixtures/mesh/. Every
//! payload byte is checked at these sizes; runs repeat exactly; the figures land where the node-
//! level analysis (mesh-collectives.md) puts them where it can (a ring in rank order uses one
//! pair's cables; a GB10 is bound by its NIC's two x4 links); relays reach the ring's diagonal;
//! a pair no cable joins without relays is a clear error; the library call gives the CLI's figure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use switchless::tools::bench::Options;
use switchless::tools::bench::mesh::{
    Algo, Collective, Kind, MeshModel, MeshOptions, MeshReport, Relay, Weights, modelled_busbw, run,
};

fn model(kind: Kind, name: &str) -> MeshModel {
    MeshModel::load(
        kind,
        Path::new(&format!("tests/fixtures/mesh/{name}.cables")),
    )
    .unwrap()
}

fn opts(size: usize) -> Options {
    Options {
        min_bytes: size,
        max_bytes: size,
        iters: 2,
        warmup: 1,
        progress: false,
        timeout: Duration::from_secs(600),
        ..Options::default()
    }
}

fn mesh(collective: Collective, algo: Algo, relay: Relay, channels: usize) -> MeshOptions {
    MeshOptions {
        collective,
        algo,
        relay,
        channels: Some(channels),
        verify: None,
        weights: Weights::Adaptive,
        // tests run in debug builds at small sizes: -w only
        settle: false,
    }
}

fn ok(r: &MeshReport) {
    assert_eq!(r.errors(), 0, "{:?}", r.first_error);
    assert!(r.verify, "payload checks are on at these sizes");
}

#[test]
fn the_fixtures_make_the_issue_30_topologies() {
    let m = model(Kind::B300, "b300-x4-12");
    assert_eq!((m.hosts, m.cables, m.ranks_per_host), (4, 12, 8));
    // 6 cabled ports of 800 Gb/s per host; every cable two 400 Gb/s halves, a path each
    assert_eq!(m.capacity_gbps, 4800.0);
    assert_eq!(m.mesh.wires.len(), 24);
    assert_eq!(m.mesh.paths_between(0, 1).len(), 4);
    let m = model(Kind::B300, "b300-x8-28");
    assert_eq!((m.hosts, m.cables, m.capacity_gbps), (8, 28, 5600.0));
    let m = model(Kind::B300, "b300-x4-332");
    assert_eq!((m.hosts, m.cables, m.capacity_gbps), (4, 16, 6400.0));
    assert_eq!(m.mesh.paths_between(0, 1).len(), 6);
    assert_eq!(m.mesh.paths_between(0, 2).len(), 4);
    // GB10: a 200 Gb/s wire per cable, both PCIe functions over it; the NIC's two x4 links
    let m = model(Kind::Gb10, "gb10-x4-ring");
    assert_eq!((m.hosts, m.cables, m.ranks_per_host), (4, 4, 1));
    assert!((m.capacity_gbps - 189.85).abs() < 1e-9);
    assert_eq!(m.mesh.paths_between(0, 1).len(), 2);
    assert!(m.mesh.paths_between(0, 2).is_empty());
    assert_eq!(m.mesh.relay_hosts(0, 2), vec![1, 3]);
    let m = model(Kind::Gb10, "gb10-x3-mesh");
    assert_eq!((m.hosts, m.cables), (3, 3));
}

#[test]
fn a_rank_order_ring_uses_one_pairs_cables_and_relays_add_the_others() {
    // Three B300, one cable per pair: the ring in rank order reaches one pair's cable, half of a
    // host's two (less framing and the pipeline at this size); with relays each connection also
    // crosses the other host, over the cables the ring leaves idle.
    let m = model(Kind::B300, "b300-x3-3");
    assert_eq!(m.capacity_gbps, 1600.0);
    let o = opts(8 << 20);
    let off = run(
        &o,
        &m,
        &mesh(Collective::AllReduce, Algo::Ring, Relay::Off, 2),
    )
    .unwrap();
    ok(&off);
    assert_eq!(off.relayed_connections, 0);
    assert!(
        off.efficiency > 0.4 && off.efficiency <= 0.4902,
        "{}",
        off.efficiency
    );
    let on = run(
        &o,
        &m,
        &mesh(Collective::AllReduce, Algo::Ring, Relay::Auto, 2),
    )
    .unwrap();
    ok(&on);
    assert_eq!((on.relayed_connections, on.connections), (6, 6));
    assert!(on.rows[0].relayed_share > 0.1, "{:?}", on.rows[0]);
    assert!(
        on.efficiency > 1.15 * off.efficiency,
        "relay on {} vs off {}",
        on.efficiency,
        off.efficiency
    );
    assert!(
        on.relayed_gbps.iter().all(|&g| g > 0.0),
        "{:?}",
        on.relayed_gbps
    );
    // the same run again: the same figures and event trace
    let again = run(
        &o,
        &m,
        &mesh(Collective::AllReduce, Algo::Ring, Relay::Auto, 2),
    )
    .unwrap();
    assert_eq!(on.rows, again.rows);
    assert_eq!(on.trace_hash, again.trace_hash);
}

#[test]
fn relays_lift_the_ring_on_four_b300_with_two_cables_per_pair() {
    // Issue 30's B300 x4 (12 cables): without relays the rank-order ring uses 1/3 of a host's
    // cables (0.33 of the node at 256 MiB, docs/performance.md); with relays every connection
    // also goes through both other hosts (policy split: 1/2 direct, 1/4 through each), over
    // the cables the ring leaves idle. At 16 MiB on 4 channels (a debug build runs it in
    // seconds) the gain is x1.5 where 256 MiB gives x1.94: the store-and-forward hop costs a
    // chunk's time per ring step, which the short pipeline of a small operation does not hide.
    let m = model(Kind::B300, "b300-x4-12");
    let o = opts(16 << 20);
    let off = run(
        &o,
        &m,
        &mesh(Collective::AllReduce, Algo::Ring, Relay::Off, 4),
    )
    .unwrap();
    let on = run(
        &o,
        &m,
        &mesh(Collective::AllReduce, Algo::Ring, Relay::Auto, 4),
    )
    .unwrap();
    ok(&off);
    ok(&on);
    assert!(
        off.efficiency > 0.25 && off.efficiency < 0.34,
        "relay off: {}",
        off.efficiency
    );
    assert_eq!((on.relayed_connections, on.connections), (16, 16));
    assert!(
        on.efficiency > 1.3 * off.efficiency,
        "relay on {} vs off {}",
        on.efficiency,
        off.efficiency
    );
    // what the relays forward is what the ring sends beyond its direct paths
    let share = on.rows[0].relayed_share;
    assert!(share > 0.3 && share < 0.6, "relayed share {share}");
}

#[test]
fn the_gb10_ring_reaches_its_diagonal_only_through_relays() {
    let m = model(Kind::Gb10, "gb10-x4-ring");
    let o = opts(1 << 20);
    // today: the tree's and alltoall's diagonal connections have no path
    for (c, a, what) in [
        (Collective::AllToAll, Algo::Ring, "alltoall"),
        (Collective::AllReduce, Algo::Tree, "tree"),
    ] {
        let e = run(&o, &m, &mesh(c, a, Relay::Off, 2))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("hosts 1 and 3 share no cable")
                && e.contains(what)
                && e.contains("--relay auto"),
            "{e}"
        );
    }
    // with relays every byte arrives: alltoall through both neighbours, the tree's {1,3} and
    // {2,4} connections likewise; neighbours go direct
    let a2a = run(
        &o,
        &m,
        &mesh(Collective::AllToAll, Algo::Ring, Relay::Auto, 2),
    )
    .unwrap();
    ok(&a2a);
    // 4 hosts x 3 peers x 2 channels, the diagonal ones relayed
    assert_eq!((a2a.relayed_connections, a2a.connections), (8, 24));
    assert!(
        a2a.efficiency > 0.3 && a2a.efficiency < 0.76,
        "{}",
        a2a.efficiency
    );
    let tree = run(
        &o,
        &m,
        &mesh(Collective::AllReduce, Algo::Tree, Relay::Auto, 2),
    )
    .unwrap();
    ok(&tree);
    assert!(tree.relayed_connections > 0 && tree.efficiency > 0.0);
    // the ring needs no relay: the same with and without
    let r_off = run(
        &o,
        &m,
        &mesh(Collective::AllReduce, Algo::Ring, Relay::Off, 2),
    )
    .unwrap();
    let r_on = run(
        &o,
        &m,
        &mesh(Collective::AllReduce, Algo::Ring, Relay::Auto, 2),
    )
    .unwrap();
    ok(&r_off);
    assert_eq!(r_on.relayed_connections, 0);
    assert_eq!(r_off.trace_hash, r_on.trace_hash);
}

#[test]
fn relays_never_touch_a_gb10_3_mesh_whose_nic_one_cable_fills() {
    // A GB10's two x4 links carry 189.85 Gb/s; one peer's cable already carries that much, so a
    // relayed byte (twice through the relay's links) could only take room: the policy adds none,
    // and the run is the same event for event. The ring fills the NIC.
    let m = model(Kind::Gb10, "gb10-x3-mesh");
    let o = opts(2 << 20);
    for (c, a) in [
        (Collective::AllReduce, Algo::Ring),
        (Collective::AllReduce, Algo::Tree),
        (Collective::AllToAll, Algo::Ring),
    ] {
        let off = run(&o, &m, &mesh(c, a, Relay::Off, 2)).unwrap();
        let on = run(&o, &m, &mesh(c, a, Relay::Auto, 2)).unwrap();
        ok(&off);
        ok(&on);
        assert_eq!(on.relayed_connections, 0, "{c:?} {a:?}");
        assert_eq!(off.trace_hash, on.trace_hash, "{c:?} {a:?}");
        // not worse with relays on (the same run, so the same figure)
        assert!(
            on.efficiency >= off.efficiency * 0.999,
            "{c:?} {a:?}: on {} off {}",
            on.efficiency,
            off.efficiency
        );
        if a == Algo::Ring {
            // the ring, and alltoall over both cables, fill the NIC's two x4 links. Alltoall
            // is the shared-stage check (mesh-collectives.md section 5): each host's two roots
            // serve both peers at once; when a root served one write at a time this read 0.31.
            assert!(
                off.efficiency > 0.9 && off.efficiency <= 1.0,
                "{c:?}: {}",
                off.efficiency
            );
        }
    }
}

#[test]
fn the_tree_counts_nccls_ranks_per_host_in_its_bus_bandwidth() {
    // B300: 8 ranks per host, so a 4-host tree's busbw is algbw x 2(32-1)/32, not x 2(4-1)/4
    let m = model(Kind::B300, "b300-x4-12");
    let r = run(
        &opts(2 << 20),
        &m,
        &mesh(Collective::AllReduce, Algo::Tree, Relay::Off, 2),
    )
    .unwrap();
    ok(&r);
    let row = &r.rows[0];
    assert!(
        (row.busbw_gbps / row.algbw_gbps - 62.0 / 32.0).abs() < 1e-9,
        "{row:?}"
    );
    assert_eq!(r.ranks_per_host, 8);
}

#[test]
fn the_library_call_gives_the_runs_figure_and_says_when_there_is_no_path() {
    let m = model(Kind::Gb10, "gb10-x4-ring");
    let f = modelled_busbw(&m, Collective::AllReduce, Algo::Ring, 4 << 20, Relay::Off).unwrap();
    let o = Options {
        iters: 2,
        warmup: 1,
        ..opts(4 << 20)
    };
    let mut mo = mesh(Collective::AllReduce, Algo::Ring, Relay::Off, 4);
    mo.verify = Some(false);
    let r = run(&o, &m, &mo).unwrap();
    assert_eq!(f.busbw_gbps, r.busbw_gbps);
    assert_eq!(f.efficiency, r.efficiency);
    assert!((f.capacity_gbps - 189.85).abs() < 1e-9);
    let e = modelled_busbw(&m, Collective::AllToAll, Algo::Ring, 1 << 20, Relay::Off)
        .unwrap_err()
        .to_string();
    assert!(e.contains("share no cable"), "{e}");
}

#[test]
fn the_cli_reports_busbw_capacity_and_efficiency_and_rejects_what_it_cannot_run() {
    let bin = env!("CARGO_BIN_EXE_switchless");
    let out = Command::new(bin)
        .args([
            "bench",
            "alltoall",
            "--model-mesh",
            "tests/fixtures/mesh/gb10-x4-ring.cables",
            "--model-kind",
            "gb10",
            "-b",
            "1M",
            "-e",
            "1M",
            "-n",
            "1",
            "-w",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in ["busbw_gbps", "capacity_gbps", "efficiency"] {
        assert!(j[k].as_f64().is_some(), "{k} missing: {j}");
    }
    let eff = j["efficiency"].as_f64().unwrap();
    let want = j["busbw_gbps"].as_f64().unwrap() / j["capacity_gbps"].as_f64().unwrap();
    assert!((eff - want).abs() < 1e-12);
    assert_eq!(j["relay"], "auto");
    for (args, want) in [
        (
            vec![
                "latency",
                "--model-mesh",
                "tests/fixtures/mesh/gb10-x3-mesh.cables",
                "--model-kind",
                "gb10",
            ],
            "accepted: switchless bench allreduce|alltoall",
        ),
        (
            vec![
                "allreduce",
                "--model-mesh",
                "tests/fixtures/mesh/gb10-x3-mesh.cables",
            ],
            "--model-kind b300|gb10",
        ),
        (
            vec![
                "allreduce",
                "--model-mesh",
                "tests/fixtures/mesh/b300-x4-12.cables",
                "--model-kind",
                "gb10",
            ],
            "port 3",
        ),
        (
            vec![
                "allreduce",
                "--model-mesh",
                "tests/fixtures/mesh/gb10-x3-mesh.cables",
                "--model-kind",
                "gb10",
                "--nranks",
                "4",
            ],
            "--nranks 4 but",
        ),
        (
            vec![
                "allreduce",
                "--model-mesh",
                "no/such.cables",
                "--model-kind",
                "gb10",
            ],
            "no/such.cables",
        ),
    ] {
        let out = Command::new(bin).arg("bench").args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
