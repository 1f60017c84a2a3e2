//! nccl-tests output fixtures (tests/fixtures/nccl-tests/, written by make_fixtures.py in nccl-tests'
//! exact printf formats) through the parser and the `switchless nccl-tests summarize` command.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use switchless::tools::nccltests::{self, Metric, Options, PluginStatus};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nccl-tests")
        .join(name)
}

fn parse(name: &str) -> nccltests::ParsedFile {
    let p = fixture(name);
    let text = std::fs::read_to_string(&p).unwrap();
    nccltests::parse_text(name, &text).unwrap()
}

fn summarize(names: &[&str], opts: &Options) -> nccltests::Summary {
    nccltests::summarize(names.iter().map(|n| parse(n)).collect(), opts).unwrap()
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchless"))
        .arg("nccl-tests")
        .arg("summarize")
        .args(args)
        .current_dir(fixture(""))
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const B300: &str = "b300-2node-all_reduce-switchless.log";
const GB10: &str = "gb10-2node-all_reduce-switchless.log";
const GB10_LOG_A: &str = "gb10-2node-logs/nccl.spark-a.4242.log";
const GB10_LOG_B: &str = "gb10-2node-logs/nccl.spark-b.5151.log";

#[test]
fn b300_two_nodes_switchless_matches_the_seed_summary() {
    let f = parse(B300);
    assert_eq!(f.runs.len(), 1);
    let r = &f.runs[0];
    assert_eq!(r.test.as_deref(), Some("all_reduce_perf"));
    assert_eq!(r.nccl_tests_version.as_deref(), Some("2.18.3"));
    assert_eq!(r.nccl_library, Some(22907));
    assert_eq!(r.ranks.len(), 16);
    assert_eq!(
        r.hosts().into_iter().collect::<Vec<_>>(),
        vec!["b300-001", "b300-002"]
    );
    assert_eq!(r.ranks[15].gpu, "NVIDIA B300 SXM6 AC");
    // six sizes, 512 MiB … 16 GiB, one of them cut by a NCCL INFO line and rejoined
    let sizes: Vec<u64> = r.rows.iter().map(|x| x.size_bytes).collect();
    assert_eq!(
        sizes,
        vec![512 << 20, 1 << 30, 2 << 30, 4 << 30, 8 << 30, 16 << 30]
    );
    let cut = &r.rows[3];
    assert_eq!(cut.out_of_place.unwrap().busbw_gbyte_s, 794.62);
    assert_eq!(cut.in_place.unwrap().time_us, 10138.2);
    assert_eq!(r.avg_busbw_gbyte_s, Some(787.211));
    assert_eq!(r.out_of_bounds, Some(0));
    assert!(r.concluded && r.complete());
    assert_eq!(r.wrong_total(), 0);
    // the footer is the mean of the rows (up to their 2-decimal rounding)
    assert!((r.mean_busbw().unwrap() - 787.211).abs() < 0.01);
    assert_eq!(Metric::Largest.value(r), Some(798.02));
    assert_eq!(Metric::Peak.value(r), Some(798.80));

    let s = summarize(&[B300], &Options::default());
    assert_eq!(s.plugin.status, PluginStatus::Used);
    assert_eq!(s.plugin.networks.get("switchless"), Some(&2));
    assert_eq!(s.plugin.abi_versions, vec![11]);
    assert_eq!(s.nccl.net_channels.get("switchless"), Some(&(2, 2)));
    assert_eq!(s.plugin.hosts, vec!["b300-001", "b300-002"]);
    assert!(
        s.nccl
            .plugin_paths
            .contains("/usr/local/lib/libnccl-net-switchless.so")
    );
    assert!(s.passed(), "{:?}", s.problems);
}

#[test]
fn b300_target_in_both_units() {
    let over = Options {
        expect_busbw_gbyte_s: Some(nccltests::parse_bandwidth("6297Gb/s").unwrap()),
        metric: Metric::Avg,
        ..Options::default()
    };
    assert!(summarize(&[B300], &over).passed());
    let under = Options {
        expect_busbw_gbyte_s: Some(nccltests::parse_bandwidth("788GB/s").unwrap()),
        metric: Metric::Avg,
        ..Options::default()
    };
    let s = summarize(&[B300], &under);
    assert!(!s.passed());
    assert_eq!(s.targets.len(), 1);
    assert!(!s.targets[0].ok);
    assert_eq!(s.targets[0].measured_gbyte_s, Some(787.211));
}

#[test]
fn gb10_two_nodes_with_debug_files() {
    let s = summarize(
        &[GB10, GB10_LOG_A, GB10_LOG_B],
        &Options {
            expect_busbw_gbyte_s: Some(nccltests::parse_bandwidth("185Gb/s").unwrap()),
            require_plugin: true,
            ..Options::default()
        },
    );
    assert!(s.passed(), "{:?}", s.problems);
    assert_eq!(s.runs.len(), 1, "log files hold no runs");
    let r = &s.runs[0];
    assert_eq!(r.rows.len(), 15);
    assert_eq!(r.ranks.len(), 2);
    let largest = Metric::Largest.value(r).unwrap();
    assert_eq!(largest, 23.28);
    // ~186 Gb/s: both PCIe functions of the cable carry traffic
    let gbit = nccltests::gbyte_to_gbit(largest);
    assert!((185.0..=190.0).contains(&gbit), "{gbit}");
    assert_eq!(r.avg_busbw_gbyte_s, Some(18.1907));
    assert_eq!(s.plugin.status, PluginStatus::Used);
    assert_eq!(s.plugin.processes, 2);
    // the plugin's per-connection route lines and NCCL's channel lines from the NCCL_DEBUG_FILE logs
    assert_eq!(s.nccl.net_prefix_lines.get("NET/switchless"), Some(&4));
    assert_eq!(s.nccl.net_channels.get("switchless"), Some(&(4, 4)));
    assert_eq!(
        s.nccl.nccl_versions.iter().collect::<Vec<_>>(),
        vec!["2.28.9+cuda13.0"]
    );
    // without the logs the plugin use is unknown, and --require-plugin fails
    let s = summarize(
        &[GB10],
        &Options {
            require_plugin: true,
            ..Options::default()
        },
    );
    assert_eq!(s.plugin.status, PluginStatus::Unknown);
    assert!(!s.passed());
}

#[test]
fn gb10_one_function_only_is_below_target() {
    // 93 Gb/s per function: a run that only reaches one function's rate fails a 185 Gb/s target.
    let text = std::fs::read_to_string(fixture(GB10)).unwrap();
    let halved = text.replace("23.28", "11.64");
    let f = nccltests::parse_text("halved", &halved).unwrap();
    let s = nccltests::summarize(
        vec![f],
        &Options {
            expect_busbw_gbyte_s: Some(nccltests::parse_bandwidth("185Gb/s").unwrap()),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(!s.passed());
    assert!(
        s.problems[0].contains("11.64 GB/s (93.1 Gb/s)"),
        "{:?}",
        s.problems
    );
}

#[test]
fn wrong_elements_and_out_of_bounds_fail() {
    let s = summarize(&["b300-2node-all_reduce-wrong.log"], &Options::default());
    let r = &s.runs[0];
    assert_eq!(r.out_of_bounds, Some(2));
    // nccl-tests prints #wrong with %6g: 4194304 reads back as 4.1943e+06
    assert_eq!(r.rows[1].in_place.unwrap().wrong, Some(4_194_300));
    assert_eq!(r.rows[3].out_of_place.unwrap().wrong, Some(131_072));
    assert!(!s.passed());
    assert_eq!(s.problems.len(), 3, "{:?}", s.problems);
    assert!(s.problems.iter().any(|p| p.contains("2 out-of-bounds")));
}

#[test]
fn internal_ib_instead_of_switchless_is_detected() {
    let s = summarize(
        &["b300-2node-all_reduce-ib-fallback.log"],
        &Options::default(),
    );
    assert_eq!(s.plugin.status, PluginStatus::NotUsed);
    assert_eq!(s.plugin.networks.get("IB"), Some(&2));
    assert!(
        s.nccl
            .plugin_failures
            .iter()
            .any(|f| f.contains("Could not find: switchless libnccl-net-switchless.so"))
    );
    assert_eq!(s.runs[0].nccl_tests_version.as_deref(), Some("2.19.6"));
    // reported, but only a failure when the plugin is required
    assert!(s.passed());
    let s = summarize(
        &["b300-2node-all_reduce-ib-fallback.log"],
        &Options {
            require_plugin: true,
            ..Options::default()
        },
    );
    assert!(!s.passed());
    assert!(
        s.problems[0].contains("NCCL used network IB"),
        "{:?}",
        s.problems
    );
    // The remedy follows the cause NCCL logged ("Could not find"): a path, not NCCL_NET_PLUGIN.
    assert!(
        s.problems[0].contains("LD_LIBRARY_PATH") && s.problems[0].contains("full path"),
        "{:?}",
        s.problems
    );
    assert!(
        !s.problems[0].contains("set NCCL_NET_PLUGIN=switchless"),
        "{:?}",
        s.problems
    );
}

#[test]
fn truncated_run_is_incomplete() {
    let s = summarize(
        &["gb10-2node-all_gather-truncated.log"],
        &Options::default(),
    );
    let r = &s.runs[0];
    assert_eq!(r.test.as_deref(), Some("all_gather_perf"));
    assert_eq!(r.rows.len(), 3);
    assert_eq!(r.truncated_row.as_ref().unwrap().0, 15);
    assert!(!r.complete());
    assert_eq!(s.nccl.warnings.len(), 1);
    assert!(!s.passed());
    assert!(s.problems[0].contains("incomplete run"), "{:?}", s.problems);
}

#[test]
fn mpirun_tags_and_no_nccl_debug() {
    let s = summarize(&["b300-4node-alltoall-nodebug.log"], &Options::default());
    let r = &s.runs[0];
    assert_eq!(r.ranks.len(), 32);
    assert_eq!(r.hosts().len(), 4);
    assert_eq!(r.rows.len(), 3);
    assert_eq!(r.rows[0].count, 8_388_608);
    assert_eq!(r.rows[0].redop, "none");
    assert_eq!(r.avg_busbw_gbyte_s, Some(369.483));
    assert_eq!(s.plugin.status, PluginStatus::Unknown);
    assert!(s.passed());
}

#[test]
fn garbage_row_names_the_line() {
    let text = std::fs::read_to_string(fixture("garbage-row.log")).unwrap();
    let e = nccltests::parse_text("garbage-row.log", &text)
        .unwrap_err()
        .to_string();
    assert!(e.contains("garbage-row.log:13:"), "{e}");
    assert!(e.contains("expected 13 columns"), "{e}");
    // On the command line a damaged file is no "invalid configuration".
    let (code, _, err) = cli(&["garbage-row.log"]);
    assert_eq!(code, 2);
    assert!(err.contains("garbage-row.log:13: malformed"), "{err}");
    assert!(!err.contains("invalid configuration"), "{err}");
}

#[test]
fn cli_exit_codes_and_output() {
    let (rc, out, _) = cli(&[B300, "--expect-busbw", "780", "--metric", "avg"]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("Avg bus bandwidth (nccl-tests footer): 787.211 GB/s = 6297.7 Gb/s"),
        "{out}"
    );
    assert!(out.contains("765.14 GB/s = 6121.1 Gb/s"), "{out}");
    assert!(out.contains("network plugin 'switchless': used"), "{out}");
    assert!(out.ends_with("result: PASS\n"), "{out}");

    let (rc, out, _) = cli(&[B300, "--expect-busbw", "6400Gb/s"]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("BELOW"), "{out}");

    let (rc, _, err) = cli(&["garbage-row.log"]);
    assert_eq!(rc, 2);
    assert!(err.contains("garbage-row.log:13:"), "{err}");

    let (rc, _, err) = cli(&["does-not-exist.log"]);
    assert_eq!(rc, 2);
    assert!(err.contains("does-not-exist.log"), "{err}");

    let (rc, _, err) = cli(&[B300, "--expect-busbw", "787 gb/s"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("case matters"), "{err}");

    let (rc, out, _) = cli(&["gb10-2node-all_gather-truncated.log"]);
    assert_eq!(rc, 1);
    assert!(out.contains("incomplete run"), "{out}");
}

#[test]
fn cli_json() {
    let (rc, out, _) = cli(&[GB10, GB10_LOG_A, GB10_LOG_B, "--json", "--require-plugin"]);
    assert_eq!(rc, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["plugin"]["status"], "used");
    assert_eq!(v["runs"][0]["avg_busbw_gbyte_s"], 18.1907);
    assert_eq!(v["runs"][0]["rows"][14]["size_bytes"], 17179869184u64);
    assert_eq!(v["runs"][0]["rows"][14]["in_place"]["busbw_gbyte_s"], 23.28);
    assert_eq!(v["problems"].as_array().unwrap().len(), 0);
}

/// --plot: one SVG, a bus-bandwidth panel over a log-scale latency panel, one line per run (two
/// logs overlaid), units on the axes.
#[test]
fn cli_plot_overlays_runs() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("runs.svg");
    let (rc, _, err) = cli(&[B300, GB10, "--plot", svg.to_str().unwrap()]);
    assert_eq!(rc, 0, "{err}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg"), "{}", &s[..40]);
    for want in [
        "nccl-tests bus bandwidth (out-of-place)",
        "busbw (GB/s, 10^9 bytes/s)",
        "time (us) (log scale)",
        "message size (bytes, log scale)",
        "b300-2node-all_reduce-switchless.log: all_reduce_perf",
        "gb10-2node-all_reduce-switchless.log: all_reduce_perf",
        "1 GiB",
    ] {
        assert!(s.contains(want), "plot lacks {want}");
    }
    // A log without a result table has nothing to draw: a clear error, exit 2.
    let (rc, _, err) = cli(&[GB10_LOG_A, "--plot", svg.to_str().unwrap()]);
    assert_eq!(rc, 2);
    assert!(
        err.contains("--plot") && err.contains("no result rows"),
        "{err}"
    );
}

mod fuzz {
    use proptest::prelude::*;
    use switchless::tools::nccltests;

    /// Lines that look like nccl-tests output, NCCL log lines, launcher prefixes and junk, in any order.
    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("# nccl-tests version 2.18.3 nccl-headers=22907 nccl-library=22907".to_string()),
            Just("# Collective test starting: all_reduce_perf".to_string()),
            Just("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong".to_string()),
            Just(" size count type redop time algbw busbw error".to_string()),
            Just("# Out of bounds values : 0 OK".to_string()),
            Just("# Avg bus bandwidth    : 787.211 ".to_string()),
            Just("# Avg bus bandwidth    : x".to_string()),
            Just("# Collective test concluded: all_reduce_perf".to_string()),
            Just("#  Rank  0 Group  0 Pid   4242 on    spark-a device  0 [000f:01:00] NVIDIA GB10".to_string()),
            Just("0: h:1:2 [0] NCCL INFO Using network switchless".to_string()),
            Just("   1024   256  float  sum  -1h:1:2 [0] NCCL INFO Channel 00/0".to_string()),
            Just("[1,0]<stdout>:     1024   256  float  sum  -1  10.0  0.1  0.1  0  10.0  0.1  0.1  0".to_string()),
            "[ -~]{0,80}",
            "[0-9 .e+N/A-]{0,60}",
            any::<String>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn parser_never_panics(lines in proptest::collection::vec(line(), 0..40)) {
            let text = lines.join("\n");
            if let Ok(f) = nccltests::parse_text("fuzz", &text) {
                if let Ok(s) = nccltests::summarize(vec![f], &nccltests::Options::default()) {
                    let _ = nccltests::render_text(&s);
                    prop_assert!(serde_json::to_string(&s).is_ok());
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Lines in nccl-tests' and NCCL's own formats

/// `snprintf(fmt, ...)` of the C library: the format strings below are copied verbatim from the
/// sources (cited at each), so the lines are what those programs print, not what make_fixtures.py
/// thinks they print.
macro_rules! c_fmt {
    ($fmt:literal $(, $arg:expr)*) => {{
        let mut buf = vec![0u8; 1024];
        // SAFETY: buf has 1024 bytes, the format is a NUL-terminated literal whose conversions
        // match the argument types, and every string argument is a NUL-terminated CStr.
        let n = unsafe {
            libc::snprintf(buf.as_mut_ptr().cast(), buf.len(), concat!($fmt, "\0").as_ptr().cast() $(, $arg)*)
        };
        assert!(n >= 0 && (n as usize) < buf.len());
        buf.truncate(n as usize);
        String::from_utf8(buf).unwrap()
    }};
}

/// nccl-tests v2.19.6 src/util.cu:487-492 (getFloatStr), through the C library as there.
fn float_str(value: f64, width: usize) -> String {
    let w = width as libc::c_int;
    for f in [c"%*.2f", c"%*.1f", c"%*.0f"] {
        let mut buf = vec![0u8; width + 1];
        // SAFETY: buf holds width + 1 bytes, as nccl-tests' str does; the format takes (int, double).
        let n = unsafe { libc::snprintf(buf.as_mut_ptr().cast(), width + 1, f.as_ptr(), w, value) };
        if n as usize <= width {
            buf.truncate(n as usize);
            return String::from_utf8(buf).unwrap();
        }
    }
    let e = if width >= 7 { c"%*.1e" } else { c"%*.0e" };
    let mut buf = vec![0u8; width + 1];
    // SAFETY: as above; snprintf truncates to width bytes and terminates.
    unsafe { libc::snprintf(buf.as_mut_ptr().cast(), width + 1, e.as_ptr(), w, value) };
    let end = buf.iter().position(|&b| b == 0).unwrap();
    buf.truncate(end);
    String::from_utf8(buf).unwrap()
}

/// A two-process all_reduce_perf run as nccl-tests v2.19.6 prints it, with NCCL 2.30.7's INFO and
/// WARN lines (src/debug.cc) among it: the parser must read every number and every line kind.
#[test]
fn lines_in_nccl_and_nccl_tests_own_formats_parse() {
    let (host_a, host_b) = (c"node-a", c"node-b");
    let mut log = String::new();
    // NCCL v2.30.7-1 src/debug.cc:330 (hostname, pid, tid) and :354 (INFO with the cudaDev).
    let info = |host: &std::ffi::CStr, pid: i32, msg: &std::ffi::CStr| {
        c_fmt!("%s:%d:%d ", host.as_ptr(), pid, pid + 7)
            + &c_fmt!("[%d] NCCL INFO %s\n", 0 as libc::c_int, msg.as_ptr())
    };
    for (host, pid) in [(host_a, 4100), (host_b, 5200)] {
        log += &info(host, pid, c"NET/Plugin: Loaded net plugin switchless (v12)");
        log += &info(host, pid, c"Using network switchless");
    }
    // nccl-tests v2.19.6 src/util.cu:623-625 (writeDeviceReport), :640, :667, :687.
    log += &c_fmt!(
        "# nccl-tests version %s nccl-headers=%d nccl-library=%d\n",
        c"2.19.6".as_ptr(),
        23007 as libc::c_int,
        23007 as libc::c_int
    );
    log += &c_fmt!(
        "# Collective test starting: %s\n",
        c"all_reduce_perf".as_ptr()
    );
    log += &c_fmt!(
        "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: %d validation: %d graph: %d unalign: %d\n",
        1 as libc::c_int,
        1 as libc::c_int,
        (1i64 << 20) as libc::c_long,
        (4i64 << 20) as libc::c_long,
        2 as libc::c_long,
        c"factor".as_ptr(),
        1 as libc::c_int,
        20 as libc::c_int,
        1 as libc::c_int,
        1 as libc::c_int,
        0 as libc::c_int,
        0 as libc::c_int
    );
    log += "#\n";
    log += "# Using devices\n";
    for (rank, host, pid) in [(0, host_a, 4100), (1, host_b, 5200)] {
        log += &c_fmt!(
            "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n",
            rank as libc::c_int,
            0 as libc::c_int,
            pid as libc::c_int,
            host.as_ptr(),
            0 as libc::c_int,
            0 as libc::c_uint,
            0x17 as libc::c_uint,
            0 as libc::c_uint,
            c"NVIDIA GB10".as_ptr()
        );
    }
    // :743, :756-759 (writeResultHeader, no per-iteration timing, no timestamps).
    log += "#\n";
    let e = c"".as_ptr();
    log += &c_fmt!(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
        e,
        e,
        e,
        e,
        e
    );
    log += &c_fmt!(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n",
        c"size".as_ptr(),
        c"count".as_ptr(),
        c"type".as_ptr(),
        c"redop".as_ptr(),
        c"root".as_ptr(),
        c"time".as_ptr(),
        c"algbw".as_ptr(),
        c"busbw".as_ptr(),
        c"#wrong".as_ptr(),
        c"time".as_ptr(),
        c"algbw".as_ptr(),
        c"busbw".as_ptr(),
        c"#wrong".as_ptr(),
        0 as libc::c_int,
        e
    );
    log += &c_fmt!(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n",
        c"(B)".as_ptr(),
        c"(elements)".as_ptr(),
        e,
        e,
        e,
        c"(us)".as_ptr(),
        c"(GB/s)".as_ptr(),
        c"(GB/s)".as_ptr(),
        e,
        c"(us)".as_ptr(),
        c"(GB/s)".as_ptr(),
        c"(GB/s)".as_ptr(),
        e,
        0 as libc::c_int,
        e
    );
    // Rows: :455-457 (preamble, root through sprintf "%6i"), :499-508 (body, twice), :471 ("\n").
    // busbw = algbw for 2 ranks (factor 2 * (n - 1) / n = 1).
    let rows: [(u64, f64, f64); 3] = [
        (1 << 20, 1.25, 1.5),
        (2 << 20, 12.5, 12.75),
        (4 << 20, 19.875, 20.0),
    ];
    for (size, oop, ip) in rows {
        let root = c_fmt!("%6i", -1 as libc::c_int);
        let root = std::ffi::CString::new(root).unwrap();
        log += &c_fmt!(
            "%12li  %12li  %8s  %6s  %6s",
            size as libc::c_long,
            (size / 4) as libc::c_long,
            c"float".as_ptr(),
            c"sum".as_ptr(),
            root.as_ptr()
        );
        for bw in [oop, ip] {
            let time = std::ffi::CString::new(float_str(size as f64 / 1e3 / bw, 7)).unwrap();
            let alg = std::ffi::CString::new(float_str(bw, 6)).unwrap();
            let bus = std::ffi::CString::new(float_str(bw, 6)).unwrap();
            log += &c_fmt!(
                "  %7s  %6s  %6s  %6g",
                time.as_ptr(),
                alg.as_ptr(),
                bus.as_ptr(),
                0.0f64
            );
        }
        log += "\n";
    }
    // A NCCL WARN while the test runs: debug.cc:321 (default timestamp), :330, :342-343.
    let mut ts = vec![0u8; 64];
    let tm = libc::tm {
        tm_sec: 11,
        tm_min: 3,
        tm_hour: 14,
        tm_mday: 28,
        tm_mon: 10,
        tm_year: 126,
        tm_wday: 6,
        tm_yday: 331,
        tm_isdst: 0,
        tm_gmtoff: 0,
        tm_zone: std::ptr::null(),
    };
    // SAFETY: ts has 64 bytes; the format is a NUL-terminated literal; tm is a valid struct tm.
    let n = unsafe { libc::strftime(ts.as_mut_ptr().cast(), ts.len(), c"[%F %T] ".as_ptr(), &tm) };
    ts.truncate(n);
    log += &String::from_utf8(ts).unwrap();
    log += &c_fmt!(
        "%s:%d:%d ",
        host_b.as_ptr(),
        5200 as libc::c_int,
        5207 as libc::c_int
    );
    log += &c_fmt!(
        "[%d] %s:%d (%s) NCCL WARN %s\n",
        0 as libc::c_int,
        c"transport/net.cc".as_ptr(),
        1290 as libc::c_int,
        c"netSendProxyProgress".as_ptr(),
        c"NET/switchless : a path failed".as_ptr()
    );
    // :777-780 (writeResultFooter, no -c check), then the run's end.
    log += &c_fmt!(
        "# %-20s : %d %s\n",
        c"Out of bounds values".as_ptr(),
        0 as libc::c_int,
        c"OK".as_ptr()
    );
    let avg = (1.25 + 1.5 + 12.5 + 12.75 + 19.875 + 20.0) / 6.0;
    log += &c_fmt!("# %-20s : %g %s\n", c"Avg bus bandwidth".as_ptr(), avg, e);
    log += "#\n";
    log += &c_fmt!(
        "# Collective test concluded: %s\n",
        c"all_reduce_perf".as_ptr()
    );

    let f = nccltests::parse_text("printf.log", &log).unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_eq!(f.runs.len(), 1, "{log}");
    let r = &f.runs[0];
    assert_eq!(r.test.as_deref(), Some("all_reduce_perf"));
    assert_eq!(r.nccl_tests_version.as_deref(), Some("2.19.6"));
    assert_eq!(r.nccl_library, Some(23007));
    assert_eq!(r.ranks.len(), 2);
    assert_eq!(
        r.hosts().into_iter().collect::<Vec<_>>(),
        vec!["node-a", "node-b"]
    );
    assert_eq!(r.ranks[1].gpu, "NVIDIA GB10");
    let sizes: Vec<u64> = r.rows.iter().map(|x| x.size_bytes).collect();
    assert_eq!(sizes, vec![1 << 20, 2 << 20, 4 << 20], "{log}");
    // getFloatStr's widths: 1.25 -> "  1.25", 19.875 -> " 19.88" (two decimals fit in 6).
    assert_eq!(r.rows[0].out_of_place.unwrap().busbw_gbyte_s, 1.25);
    assert_eq!(r.rows[2].out_of_place.unwrap().busbw_gbyte_s, 19.88);
    assert_eq!(r.rows[2].in_place.unwrap().busbw_gbyte_s, 20.0);
    assert_eq!(r.wrong_total(), 0);
    let printed_avg: f64 = c_fmt!("%g", avg).parse().unwrap();
    assert_eq!(r.avg_busbw_gbyte_s, Some(printed_avg));
    assert_eq!(r.out_of_bounds, Some(0));
    assert!(r.concluded && r.complete(), "{r:?}");
    assert_eq!(f.nccl.processes.len(), 2, "{:?}", f.nccl);
    for p in f.nccl.processes.values() {
        assert!(p.networks.contains("switchless"), "{p:?}");
        assert_eq!(
            p.loaded
                .get("switchless")
                .map(|v| v.iter().copied().collect::<Vec<_>>()),
            Some(vec![12])
        );
    }
    assert_eq!(f.nccl.warnings.len(), 1, "{:?}", f.nccl.warnings);
    assert!(
        f.nccl.warnings[0].contains("a path failed"),
        "{:?}",
        f.nccl.warnings
    );
    let s = nccltests::summarize(vec![f], &Options::default()).unwrap();
    assert_eq!(s.plugin.status, PluginStatus::Used);
}
