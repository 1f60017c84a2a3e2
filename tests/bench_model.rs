//! `switchless bench --model`: the modes over the model fabric in virtual time, ranks as threads.
//! Efficiencies land where the model's framing puts them, runs repeat exactly (same rows, same
//! trace digest), shared PCIe caps show, payloads are checked, bad specs say what is accepted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use switchless::tools::bench::model::{ModelOptions, run};
use switchless::tools::bench::summary::Pattern;
use switchless::tools::bench::{Mode, NetAttrMode, Options, report};

fn opts(mode: Mode, min: usize, max: usize) -> Options {
    Options {
        mode,
        min_bytes: min,
        max_bytes: max,
        step_factor: 4,
        iters: 8,
        warmup: 2,
        window: 8,
        channels: 2,
        chunk_bytes: 128 << 10,
        dev: None,
        timeout: Duration::from_secs(120),
        progress: false,
        breakdown: false,
        ahead: 2,
        rdma_packets: false,
        net_attr: NetAttrMode::Nccl,
    }
}

fn model(spec: &str, pcie: &str) -> ModelOptions {
    ModelOptions {
        spec: spec.into(),
        pcie: pcie.into(),
        mtu: 4096,
        pattern: Pattern::Simple,
        step_bytes: None,
        verify: None,
        latency_bytes: 8,
    }
}

/// The goodput share RoCE v2 framing leaves at MTU 4096: 4096 / (4096 + 82).
const FRAMING: f64 = 4096.0 / 4178.0;

#[test]
fn gb10_port_bandwidth_is_deterministic_and_near_the_framing_ceiling() {
    let o = opts(Mode::Bandwidth, 8, 2 << 20);
    let m = model("92.57G/1.2us,97.28G/1.2us", "");
    let a = run(&o, 2, &m).unwrap();
    assert_eq!(a.errors(), 0, "{:?}", a.first_error);
    let s = a.model.as_ref().unwrap();
    assert!(s.verify, "checks are on at this scale");
    assert!((s.sum_gbits_s - 189.85).abs() < 1e-9);
    let eff = a.efficiency.unwrap();
    assert!(eff <= FRAMING + 1e-9 && eff > 0.97, "efficiency {eff}");
    for r in &a.rows {
        assert_eq!(r.modelled_gbits_s, Some(189.85));
        assert!(r.efficiency.unwrap() <= FRAMING + 1e-9, "{r:?}");
    }
    // Latency: at least one modelled write, and reported at the top level too.
    assert!(
        s.latency_us >= s.rdma_write_us && s.rdma_write_us > 1.2,
        "{s:?}"
    );
    assert_eq!(a.latency_us, Some(s.latency_us));
    // A second run repeats exactly.
    let b = run(&o, 2, &m).unwrap();
    assert_eq!(a.rows, b.rows);
    assert_eq!(s.trace_hash, b.model.as_ref().unwrap().trace_hash);
    let j = report::json(&a).unwrap();
    assert!(
        j.contains("\"efficiency\"") && j.contains("\"latency_us\""),
        "{j}"
    );
    let t = report::table(&a);
    assert!(t.contains("model(Gb/s)") && t.contains("RDMA write"), "{t}");
}

#[test]
fn one_shared_root_caps_two_paths() {
    let o = opts(Mode::Bandwidth, 2 << 20, 2 << 20);
    let free = run(&o, 2, &model("200G/1us,200G/1us", "")).unwrap();
    let capped = run(&o, 2, &model("200G/1us@r0,200G/1us@r0", "r0=256G")).unwrap();
    let (ef, ec) = (free.efficiency.unwrap(), capped.efficiency.unwrap());
    assert!(ef > 0.97, "uncapped {ef}");
    // 256 of 400 Gb/s; the cap counts payload, so framing does not lower it further.
    assert!((ec - 0.64).abs() < 0.01, "capped {ec}");
}

#[test]
fn alltoall_and_allreduce_check_their_data_over_three_ranks() {
    for mode in [Mode::Alltoall, Mode::Allreduce] {
        let o = opts(mode, 1024, 256 << 10);
        let r = run(&o, 3, &model("100G/1us,100G/1us", "")).unwrap();
        assert_eq!(r.errors(), 0, "{mode:?}: {:?}", r.first_error);
        // three ranks as threads, all connecting at once: the same trace every run
        let again = run(&o, 3, &model("100G/1us,100G/1us", "")).unwrap();
        assert_eq!(r.rows, again.rows);
        assert_eq!(
            r.model.as_ref().unwrap().trace_hash,
            again.model.as_ref().unwrap().trace_hash
        );
        assert_eq!(r.nranks, 3);
        for row in &r.rows {
            let e = row.efficiency.unwrap();
            assert!(e > 0.0 && e <= 1.0, "{mode:?} {row:?}");
        }
    }
}

/// Relative error of a one-way time read from ns `Instant`s (0.5 ns in about 1 us).
const NS_ROUNDING: f64 = 1e-3;

#[test]
fn latency_mode_reports_the_ratio_to_one_rdma_write() {
    let o = opts(Mode::Latency, 8, 4096);
    let r = run(&o, 2, &model("400G/1us", "")).unwrap();
    let s = r.model.unwrap();
    assert_eq!(r.rows[0].time_us, s.latency_us);
    assert!(r.rows.iter().all(|x| x.efficiency.is_none()));
    // one write: 1 us + (8 + 82 + 16 + 4) B at 400 Gb/s = 2.2 ns
    assert!(
        (s.rdma_write_us - 1.0022).abs() < 1e-9,
        "{}",
        s.rdma_write_us
    );
    // The virtual clock reaches the bench as `Instant`s of ns resolution: a 2004.4 ns round trip
    // reads as 2004 or 2005 ns, so the mean may fall a few ps under the one-write floor.
    assert!(
        s.latency_ratio >= 1.0 - NS_ROUNDING && s.latency_ratio < 4.0,
        "{}",
        s.latency_ratio
    );
}

#[test]
fn a_small_message_costs_at_most_one_and_a_half_rdma_writes() {
    // The receive posted ahead (as NCCL's proxy does) hides the clear-to-send round trip, and the
    // message is one write with immediate: the bar is 1.5 modelled writes one way.
    for spec in [
        "400G/1us",
        "400G/1us,400G/1us",
        "92.57G/1.2us,97.28G/1.2us",
        "400G/1us,400G/1us,200G/1us",
    ] {
        let r = run(&opts(Mode::Latency, 8, 8), 2, &model(spec, "")).unwrap();
        assert_eq!(r.errors(), 0, "{spec}: {:?}", r.first_error);
        let s = r.model.unwrap();
        assert!(
            s.latency_ratio >= 1.0 - NS_ROUNDING && s.latency_ratio <= 1.5,
            "{spec}: {} us one way, {} us one write, ratio {}",
            s.latency_us,
            s.rdma_write_us,
            s.latency_ratio
        );
    }
}

#[test]
fn messages_too_small_to_split_still_fill_both_gb10_functions() {
    // 64 KiB with a 32 KiB minimum chunk makes one piece (the slower function's share is under
    // 32 KiB): a stream of them must still use both paths, not only the faster one.
    let o = opts(Mode::Bandwidth, 64 << 10, 64 << 10);
    let r = run(&o, 2, &model("92.57G/1.2us,97.28G/1.2us", "")).unwrap();
    assert_eq!(r.errors(), 0, "{:?}", r.first_error);
    let eff = r.efficiency.unwrap();
    assert!(eff > 0.9 && eff <= FRAMING + 1e-9, "efficiency {eff}");
}

#[test]
fn without_checks_nothing_is_copied_and_sizes_still_match() {
    let o = opts(Mode::Bandwidth, 1 << 20, 1 << 20);
    let mut m = model("400G/1us,400G/1us", "");
    m.verify = Some(false);
    let r = run(&o, 2, &m).unwrap();
    assert_eq!(r.errors(), 0);
    assert!(!r.model.unwrap().verify);
}

#[test]
fn bad_specs_name_what_is_accepted() {
    let o = opts(Mode::Bandwidth, 8, 8);
    for (spec, pcie, want) in [
        ("", "", "accepted"),
        ("400", "", "accepted"),
        ("400G/1 lightyear", "", "accepted"),
        ("400G@r0", "", "--pcie r0=RATE"),
        ("400G", "r0=1G", "no path"),
    ] {
        let e = run(&o, 2, &model(spec, pcie)).unwrap_err().to_string();
        assert!(e.contains(want), "{spec:?} {pcie:?}: {e}");
    }
    let mut m = model("400G", "");
    m.mtu = 9000;
    assert!(run(&o, 2, &m).unwrap_err().to_string().contains("4096"));
}

#[test]
fn per_host_roots_far_above_the_load_leave_alltoall_as_fast_as_without_them() {
    // Roots shared by every peer of a host, at 10× what one path carries (5× the load on 3
    // ranks, where each root serves two peers): alltoall on 3 and 4 ranks must run as fast as
    // without roots, above 0.9 at this size (0.995 at 48 MiB; mesh-collectives.md section 5: it
    // once ran at 0.466 and 0.451, serialised behind the shared stage's future bookings).
    let o = opts(Mode::Alltoall, 3 << 20, 3 << 20);
    for n in [3, 4] {
        let mut free = model("92.57G/1.2us,97.28G/1.2us", "");
        let mut rooted = model("92.57G/1.2us@fa,97.28G/1.2us@fb", "fa=1000G,fb=1000G");
        free.mtu = 0;
        rooted.mtu = 0;
        let ef = run(&o, n, &free).unwrap().efficiency.unwrap();
        let er = run(&o, n, &rooted).unwrap().efficiency.unwrap();
        assert!(ef > 0.9, "{n} ranks without roots: {ef}");
        assert!(er > 0.9, "{n} ranks with roots: {er}");
        assert!(
            (er / ef - 1.0).abs() < 0.01,
            "{n} ranks: {er} with roots, {ef} without"
        );
    }
}

/// Issue 36: an 8-byte message costs two work requests (its receive's clear-to-send, one write,
/// and its data, one write with immediate) and four packets with their acknowledgements, on one
/// path and on eight; the counts are the fabric's, printed in the report.
#[test]
fn an_eight_byte_message_costs_two_work_requests_and_four_packets() {
    for spec in [
        "400G/1us",
        "400G/1us,400G/1us,400G/1us,400G/1us,400G/1us,400G/1us,400G/1us,400G/1us",
    ] {
        let o = opts(Mode::Latency, 8, 8);
        let a = run(&o, 2, &model(spec, "")).unwrap();
        assert_eq!(a.errors(), 0, "{:?}", a.first_error);
        let c = &a.model.as_ref().unwrap().counters;
        assert_eq!(c.messages, 2 * (8 + 2), "{c:?}");
        let p = c.per_message;
        assert_eq!(p.work_requests, 2.0, "{c:?}");
        assert_eq!(p.imm_writes, 1.0, "{c:?}");
        assert_eq!(p.packets + p.acks, 4.0, "{c:?}");
        // Signaled: each data write, and a clear-to-send once per 16 on its path (the first
        // on each path of each rank's receive comm included).
        let npaths = c.paths.len() as f64;
        let m = c.messages as f64;
        let cts_signaled = (p.signaled - p.imm_writes) * m;
        assert!(
            cts_signaled <= 2.0 * npaths + m / 16.0 + 1e-9,
            "{cts_signaled} of {m}: {c:?}"
        );
        let per_path: f64 = c.paths.iter().map(|x| x.work_requests).sum();
        assert!((per_path - 2.0).abs() < 1e-9, "{c:?}");
        let t = report::table(&a);
        assert!(
            t.contains("per 8 B message (20 messages): 2.00 work requests"),
            "{t}"
        );
    }
}

/// Bandwidth streamed as NCCL's proxy posts it (one size): the report carries what each message
/// of the stream cost on the fabric; whole-message bandwidth and latency runs carry none.
#[test]
fn a_streamed_size_reports_what_each_of_its_messages_cost() {
    let mut o = opts(Mode::Bandwidth, 8, 8);
    o.iters = 40;
    o.warmup = 4;
    let mut m = model("400G/1us", "");
    m.pattern = Pattern::Ll;
    let r = run(&o, 2, &m).unwrap();
    assert_eq!(r.errors(), 0, "{:?}", r.first_error);
    let c = r.model.as_ref().unwrap().stream.clone().unwrap();
    assert_eq!(c.messages, 44, "{c:?}");
    // Receives posted as each completes: the sender waits for every entry, one write each.
    assert_eq!(c.per_message.work_requests, 2.0, "{c:?}");
    assert_eq!(c.per_message.packets + c.per_message.acks, 4.0, "{c:?}");
    let t = report::table(&r);
    assert!(
        t.contains("streamed, per 8 B message (44 messages): 2.00 work requests"),
        "{t}"
    );
    m.pattern = Pattern::Messages;
    let w = run(&o, 2, &m).unwrap();
    assert!(w.model.unwrap().stream.is_none());
    let l = run(&opts(Mode::Latency, 8, 8), 2, &model("400G/1us", "")).unwrap();
    assert!(l.model.unwrap().stream.is_none());
}

/// Issue 36 item 2: receives posted eight ahead (NCCL's steps) of a ping-pong, whose sender takes
/// one entry per round trip: the receiver holds new entries back while the sender has three or
/// more unused, and posts them two to a write. Fewer work requests and packets per message,
/// the same latency; posted one or two ahead, every entry still goes alone (the sender waits for
/// it).
#[test]
fn receives_posted_eight_ahead_share_clear_to_send_writes() {
    for spec in [
        "400G/1us",
        "400G/1us,400G/1us,400G/1us,400G/1us,400G/1us,400G/1us,400G/1us,400G/1us",
    ] {
        let mut o = opts(Mode::Latency, 8, 8);
        o.iters = 100;
        o.warmup = 10;
        let mut cost = Vec::new();
        for ahead in [1, 2, 8] {
            o.ahead = ahead;
            let r = run(&o, 2, &model(spec, "")).unwrap();
            assert_eq!(r.errors(), 0, "{:?}", r.first_error);
            let s = r.model.unwrap();
            let p = s.counters.per_message;
            cost.push((ahead, p.work_requests, p.packets + p.acks, s.latency_ratio));
        }
        for &(ahead, wr, packets, ratio) in &cost {
            assert!(ratio < 1.01, "{spec}: {cost:?}");
            if ahead < 8 {
                assert_eq!((wr, packets), (2.0, 4.0), "{spec}: {cost:?}");
            } else {
                // One data write each, mostly two messages' entries in one write (at most two:
                // one packet at any RoCE MTU); 2.00 / 4.00 without batching.
                assert!(wr < 1.7 && packets < 3.4, "{spec}: {cost:?}");
            }
        }
    }
}
