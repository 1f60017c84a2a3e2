//! Every `switchless bench` mode run in-process over the loopback Net (threads as ranks): the
//! orchestration (handle exchange, connect/accept retries, NULL isends, grouped receives, ring
//! steps) and the data checks, including that a corrupted transfer is detected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use switchless::tools::bench::loopback::{LoopbackConfig, run_ranks};
use switchless::tools::bench::{Mode, NetAttrMode, Options, report};

fn opts(mode: Mode) -> Options {
    Options {
        mode,
        min_bytes: 4,
        max_bytes: 4096,
        step_factor: 8,
        iters: 3,
        warmup: 1,
        window: 4,
        channels: 2,
        chunk_bytes: 256,
        dev: None,
        timeout: Duration::from_secs(30),
        progress: false,
        breakdown: false,
        ahead: 2,
        rdma_packets: false,
        net_attr: NetAttrMode::Nccl,
    }
}

fn clean(mode: Mode, nranks: usize) {
    let o = opts(mode);
    let r = run_ranks(&o, nranks, LoopbackConfig::default()).unwrap();
    assert_eq!(r.nranks, nranks);
    assert_eq!(r.rows.len(), 4, "sizes 4, 32, 256, 2048 B");
    assert_eq!(r.errors(), 0, "{:?}", r.first_error);
    for row in &r.rows {
        assert!(
            row.time_us > 0.0,
            "{mode:?} {} B has no time",
            row.size_bytes
        );
        assert!(row.algbw_gbytes_s > 0.0);
        assert!((row.algbw_gbits_s - 8.0 * row.algbw_gbytes_s).abs() < 1e-9);
    }
}

#[test]
fn latency_2_and_3_ranks() {
    clean(Mode::Latency, 2);
    clean(Mode::Latency, 3); // rank 2 has no partner and must still finish
}

#[test]
fn latency_with_receives_posted_1_to_3_ahead_and_a_breakdown() {
    for ahead in [1, 2, 3] {
        let o = Options {
            ahead,
            breakdown: true,
            iters: 5,
            ..opts(Mode::Latency)
        };
        let r = run_ranks(&o, 2, LoopbackConfig::default()).unwrap();
        assert_eq!(r.errors(), 0, "ahead {ahead}: {:?}", r.first_error);
        for row in &r.rows {
            let b = row.breakdown.as_ref().expect("a breakdown per row");
            // Timed round trips only; each posts one send, and one receive `ahead - 1` pongs ahead
            // (none past the last round trip) on rank 0.
            assert_eq!(b.round_trips, 5, "ahead {ahead}");
            assert_eq!(
                b.irecv_calls,
                5 - (ahead as u64 - 1),
                "ahead {ahead}: {b:?}"
            );
            assert!(b.isend_calls >= 5, "ahead {ahead}: {b:?}");
            assert!(b.test_calls >= 5, "ahead {ahead}: {b:?}");
            assert!(b.loop_us >= b.test_us, "ahead {ahead}: {b:?}");
        }
        let t = report::table(&r);
        assert!(t.contains("# breakdown at 4 B (rank 0"), "{t}");
    }
    // Off: no breakdown.
    let r = run_ranks(&opts(Mode::Latency), 2, LoopbackConfig::default()).unwrap();
    assert!(r.rows.iter().all(|row| row.breakdown.is_none()));
}

#[test]
fn bandwidth_2_and_4_ranks() {
    clean(Mode::Bandwidth, 2);
    clean(Mode::Bandwidth, 4);
}

#[test]
fn alltoall_3_ranks() {
    clean(Mode::Alltoall, 3);
}

#[test]
fn allreduce_2_3_4_ranks() {
    for n in [2, 3, 4] {
        clean(Mode::Allreduce, n);
    }
}

#[test]
fn allreduce_busbw_factor_and_many_grouped_slices() {
    // 16 KiB over 3 ranks x 2 channels with 64 B slices: ~14 slices per step and channel, so
    // several grouped irecvs of up to 8 buffers each.
    let o = Options {
        min_bytes: 16384,
        max_bytes: 16384,
        chunk_bytes: 64,
        ..opts(Mode::Allreduce)
    };
    let r = run_ranks(&o, 3, LoopbackConfig::default()).unwrap();
    assert_eq!(r.errors(), 0, "{:?}", r.first_error);
    let row = &r.rows[0];
    assert_eq!(row.count, 4096);
    assert!((row.busbw_gbytes_s - row.algbw_gbytes_s * 4.0 / 3.0).abs() < 1e-9);
}

fn corrupted(mode: Mode, nranks: usize) {
    let cfg = LoopbackConfig {
        corrupt_message: Some(7),
        ..LoopbackConfig::default()
    };
    let r = run_ranks(&opts(mode), nranks, cfg).unwrap();
    assert!(
        r.errors() >= 1,
        "{mode:?}: a corrupted message went unnoticed"
    );
    let e = r.first_error.clone().unwrap();
    assert!(
        e.contains("data check failed") || e.contains("expected"),
        "{mode:?}: {e}"
    );
    let t = report::table(&r);
    assert!(t.contains("FAILED"), "{t}");
}

/// A bandwidth run on a slow wire that keeps moving outlasts `--timeout` and still completes: the
/// timeout bounds each window of messages, not the whole size. (CI step 66 failed this way: the
/// debug build checks every byte of 1500 MiB-sized messages, tens of ms each on a starved CPU, and
/// the deadline for the whole size cut off a run that never stopped moving.) A wire that moves
/// nothing within the timeout still fails the run.
#[test]
fn a_slow_bandwidth_run_that_keeps_moving_outlasts_the_timeout() {
    let o = Options {
        min_bytes: 4096,
        max_bytes: 4096,
        iters: 40,
        warmup: 0,
        window: 2,
        timeout: Duration::from_secs(1),
        ..opts(Mode::Bandwidth)
    };
    // 100 ms per message: a window (the ready token, then its 2 messages, all sent at once) takes
    // about 100 ms, the 20 windows about 2 s.
    let slow = LoopbackConfig {
        latency: Duration::from_millis(100),
        isend_null_every: 0,
        ..LoopbackConfig::default()
    };
    let t = Instant::now();
    let r = run_ranks(&o, 2, slow.clone()).unwrap();
    let took = t.elapsed();
    assert!(
        took > o.timeout,
        "the run must outlast the timeout to test it ({took:?})"
    );
    assert_eq!(r.errors(), 0, "{:?}", r.first_error);
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.rows[0].iters, 40);

    // A window that waits longer than the timeout is a stall: the run fails, and soon.
    let stalled = LoopbackConfig {
        latency: Duration::from_secs(3),
        ..slow
    };
    let t = Instant::now();
    let e = run_ranks(&o, 2, stalled).unwrap_err().to_string();
    assert!(e.contains("transfers still pending"), "{e}");
    assert!(
        t.elapsed() < Duration::from_millis(2900),
        "the stall was not caught before the first message would have landed ({:?})",
        t.elapsed()
    );
}

#[test]
fn a_corrupted_transfer_is_detected_in_every_mode() {
    corrupted(Mode::Latency, 2);
    corrupted(Mode::Bandwidth, 2);
    corrupted(Mode::Alltoall, 3);
    corrupted(Mode::Allreduce, 3);
}

#[test]
fn without_nulls_and_with_a_fixed_device() {
    let cfg = LoopbackConfig {
        connect_nulls: 0,
        isend_null_every: 0,
        devices: 1,
        ..LoopbackConfig::default()
    };
    let o = Options {
        dev: Some(0),
        ..opts(Mode::Alltoall)
    };
    let r = run_ranks(&o, 4, cfg).unwrap();
    assert_eq!(r.errors(), 0);
    assert_eq!(r.devices.len(), 1);
}

#[test]
fn bad_options_are_errors() {
    let o = Options {
        dev: Some(5),
        timeout: Duration::from_secs(3),
        ..opts(Mode::Latency)
    };
    let e = run_ranks(&o, 2, LoopbackConfig::default()).unwrap_err();
    assert!(e.to_string().contains("--dev 5"), "{e}");
    let o = Options {
        min_bytes: 64,
        max_bytes: 8,
        ..opts(Mode::Latency)
    };
    assert!(run_ranks(&o, 2, LoopbackConfig::default()).is_err());
    let e = run_ranks(&opts(Mode::Allreduce), 1, LoopbackConfig::default()).unwrap_err();
    assert!(e.to_string().contains("at least 2 ranks"), "{e}");
}

#[test]
fn json_and_csv_carry_units_and_rows() {
    let r = run_ranks(&opts(Mode::Latency), 2, LoopbackConfig::default()).unwrap();
    let j: serde_json::Value = serde_json::from_str(&report::json(&r).unwrap()).unwrap();
    assert_eq!(j["mode"], "latency");
    assert_eq!(j["rows"].as_array().unwrap().len(), 4);
    assert!(j["rows"][0]["time_us"].as_f64().unwrap() > 0.0);
    // the spread of the one-way times brackets their mean
    for row in j["rows"].as_array().unwrap() {
        let w = &row["one_way_us"];
        let f = |k: &str| {
            w[k].as_f64()
                .unwrap_or_else(|| panic!("one_way_us.{k} in {row}"))
        };
        let mean = row["time_us"].as_f64().unwrap();
        assert!(
            f("min") <= f("median") && f("median") <= f("p99") && f("p99") <= f("max"),
            "{w}"
        );
        assert!(
            f("min") <= mean && mean <= f("max"),
            "mean {mean} outside {w}"
        );
    }
    let c = report::csv(&r);
    assert!(c.starts_with("mode,nranks,channels,size_B,"));
    assert_eq!(c.lines().count(), 5);
    let t = report::table(&r);
    assert!(t.contains("size(B)") && t.contains("algbw(GB/s)") && t.contains("busbw(Gb/s)"));
    assert!(
        t.contains("# one-way us at 4 B (rank 0, per round trip / 2): min "),
        "{t}"
    );
    // set-up time per step: the steps add up to the total (each is one lap of the same clock)
    let s = &j["setup"];
    let steps: f64 = [
        "listen_s",
        "exchange_s",
        "connect_s",
        "register_s",
        "barrier_s",
    ]
    .iter()
    .map(|k| s[k].as_f64().unwrap())
    .sum();
    let total = s["total_s"].as_f64().unwrap();
    assert!(total > 0.0 && (steps - total).abs() < 1e-3, "{s}");
    assert!(t.contains("connection set-up") && t.contains("connect/accept"));
    // No plugin was loaded: no init time, and no line for it.
    assert_eq!(s["init_s"].as_f64(), Some(0.0), "{s}");
    assert!(!t.contains("plugin load and init"), "{t}");
}

/// Bandwidth verifies outside its timed windows: a corruption of any delivered message (data or
/// the 1 B ready token, warmup or timed, first or later window) is still counted.
#[test]
fn bandwidth_catches_corruption_of_any_message() {
    // deliveries count from 1; per size: token + 1 (warmup), token + 3 (timed), 1 ack = 7; 4 sizes
    for k in 1..=28u64 {
        let cfg = LoopbackConfig {
            corrupt_message: Some(k),
            ..LoopbackConfig::default()
        };
        let r = run_ranks(&opts(Mode::Bandwidth), 2, cfg).unwrap();
        assert!(
            r.errors() >= 1,
            "bandwidth: corrupted message {k} went unnoticed"
        );
    }
}

/// `--nccl-tests`: the run in nccl-tests' layout reads back through `switchless nccl-tests summarize`'s
/// parser with every size, busbw and #wrong as the bench measured them, named `switchless bench MODE`;
/// a corrupted transfer makes the summary fail on wrong elements.
#[test]
fn the_nccl_tests_layout_reads_back_through_summarize() {
    use switchless::tools::nccltests::{self, Options as SumOptions};
    for (mode, dtype, redop) in [
        (Mode::Allreduce, "float", "sum"),
        (Mode::Alltoall, "uint8", "none"),
        (Mode::Bandwidth, "uint8", "none"),
    ] {
        let r = run_ranks(&opts(mode), 3, LoopbackConfig::default()).unwrap();
        let text = report::nccl_tests(&r);
        let parsed = nccltests::parse_text("bench.out", &text).unwrap();
        assert_eq!(parsed.runs.len(), 1, "{text}");
        let run = &parsed.runs[0];
        assert_eq!(
            run.test.as_deref(),
            Some(format!("switchless bench {}", mode.name()).as_str())
        );
        assert!(run.complete() && run.concluded, "{text}");
        assert_eq!(run.out_of_bounds, Some(0));
        assert_eq!(run.rows.len(), r.rows.len());
        for (got, want) in run.rows.iter().zip(&r.rows) {
            assert_eq!(got.size_bytes, want.size_bytes as u64);
            assert_eq!(got.count, want.count as u64);
            assert_eq!((got.dtype.as_str(), got.redop.as_str()), (dtype, redop));
            let m = got.out_of_place.unwrap();
            assert!(got.in_place.is_none());
            assert!(
                (m.busbw_gbyte_s - want.busbw_gbytes_s).abs() < 1e-4,
                "{text}"
            );
            assert!(
                (m.algbw_gbyte_s - want.algbw_gbytes_s).abs() < 1e-4,
                "{text}"
            );
            assert_eq!(m.wrong, Some(0));
        }
        let mean = run.mean_busbw().unwrap();
        assert!(
            (run.avg_busbw_gbyte_s.unwrap() - mean).abs() < 1e-4,
            "{text}"
        );
        let sum = nccltests::summarize(vec![parsed], &SumOptions::default()).unwrap();
        assert!(sum.passed(), "{:?}", sum.problems);
    }

    let cfg = LoopbackConfig {
        corrupt_message: Some(9),
        ..LoopbackConfig::default()
    };
    let r = run_ranks(&opts(Mode::Bandwidth), 2, cfg).unwrap();
    assert!(r.errors() >= 1);
    let text = report::nccl_tests(&r);
    assert!(text.contains("# Out of bounds values : 1 FAILED"), "{text}");
    assert!(text.contains("# data checks: 1 FAILED; first: "), "{text}");
    let parsed = nccltests::parse_text("bench.out", &text).unwrap();
    assert_eq!(parsed.runs[0].wrong_total(), r.errors());
    let sum = nccltests::summarize(vec![parsed], &SumOptions::default()).unwrap();
    assert!(!sum.passed());
    assert!(
        sum.problems.iter().any(|p| p.contains("wrong")),
        "{:?}",
        sum.problems
    );
}

/// `--net-attr nccl`: right before every `connect` and `accept` call of a rank comes a
/// `setNetAttr` with NCCL's connect-time hint of the mode's connections (a collective's for the
/// all-reduce's rings, a p2p one for the rest); `--net-attr none`: no `setNetAttr` at all.
#[test]
fn every_connect_and_accept_follows_nccls_connect_time_hint() {
    use switchless::tools::bench::hints::{ConnKind, connect_hint};
    use switchless::tools::bench::loopback::{LoopbackFabric, SetupCall, run_ranks_on};
    let n = 4;
    for mode in [
        Mode::Allreduce,
        Mode::Alltoall,
        Mode::Bandwidth,
        Mode::Latency,
    ] {
        let o = opts(mode);
        let want = match mode {
            Mode::Allreduce => connect_hint(ConnKind::Collective { channels: 2 }, n),
            _ => connect_hint(
                ConnKind::P2p {
                    channels: 1,
                    per_peer: 1,
                },
                n,
            ),
        };
        let f = LoopbackFabric::new(LoopbackConfig::default());
        run_ranks_on(&o, n, f.clone()).unwrap();
        let calls = f.setup_calls();
        let (mut conns, mut hints) = (0, 0);
        for r in 0..n as u64 {
            let mine: Vec<&SetupCall> = calls
                .iter()
                .filter(|(id, _)| *id == r)
                .map(|(_, c)| c)
                .collect();
            for (i, c) in mine.iter().enumerate() {
                match c {
                    SetupCall::Connect | SetupCall::Accept => {
                        conns += 1;
                        assert!(i > 0, "{mode:?} rank {r}: {c:?} with no hint before it");
                        assert_eq!(
                            mine[i - 1],
                            &SetupCall::NetAttr(want),
                            "{mode:?} rank {r} call {i}"
                        );
                    }
                    SetupCall::NetAttr(h) => {
                        hints += 1;
                        assert_eq!(h, &want);
                    }
                }
            }
        }
        assert!(conns >= 2 * n, "{mode:?}: {conns} connect/accept calls");
        assert_eq!(hints, conns, "{mode:?}: one hint per connect/accept call");

        let none = Options {
            net_attr: NetAttrMode::None,
            ..opts(mode)
        };
        let f = LoopbackFabric::new(LoopbackConfig::default());
        run_ranks_on(&none, n, f.clone()).unwrap();
        let calls = f.setup_calls();
        assert!(calls.iter().any(|(_, c)| *c == SetupCall::Connect));
        assert!(
            !calls
                .iter()
                .any(|(_, c)| matches!(c, SetupCall::NetAttr(_))),
            "{mode:?}: --net-attr none called setNetAttr"
        );
    }
}
