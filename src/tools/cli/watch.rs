//! `switchless watch`: live Gb/s per NCCL device, member and TCP link from the kernel's counters
//! (see `tools::watch`), and per peer and path from the plugin's own counters (`tools::metrics`,
//! `--metrics-dir`), as a table, JSON, Prometheus/OpenMetrics text or an SVG plot. Exit status: 0,
//! 1 when `--check-builds` finds processes running different plugins or NCCLs, 2 on a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::host::{self, Reader};
use crate::tools::metrics;
use crate::tools::watch::{self, Watch};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
switchless watch                                  # beside a running job: Gb/s per device, function and link\n  \
switchless watch --once --json                    # one interval as JSON (schema switchless-watch/1)\n  \
switchless watch --interval 5 --imbalance 10      # flag siblings more than 10 % apart\n  \
switchless watch --metrics-dir /run/switchless    # plus Gb/s per peer and path from the plugin (NCCL_SWITCHLESS_METRICS_DIR)\n  \
switchless watch --metrics-dir D --prometheus /var/lib/node_exporter/switchless.prom   # for the textfile collector\n  \
switchless watch --metrics-dir D --plot run.svg   # Gb/s per path over time of a finished run\n\
Exit status: 0; 1 --check-builds found processes with another plugin or NCCL; 2 a usage error or unreadable counters.")]
pub struct Args {
    /// Read kernel files under this directory instead of / (the counters are read again every interval).
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Seconds between two readings (0.05..=3600).
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    pub interval: f64,
    /// Print one interval and exit.
    #[arg(long)]
    pub once: bool,
    /// Print this many intervals and exit (default: until interrupted).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// JSON, one object per interval and line (schema "switchless-watch/1").
    #[arg(long)]
    pub json: bool,
    /// Flag siblings of one device whose rates differ by more than PCT percent of the busier one.
    #[arg(long, default_value_t = watch::DEFAULT_IMBALANCE_PCT, value_name = "PCT")]
    pub imbalance: f64,
    /// Also read the plugin's snapshots in DIR (what the ranks write with
    /// NCCL_SWITCHLESS_METRICS_DIR; default: that variable when set).
    #[arg(long, value_name = "DIR")]
    pub metrics_dir: Option<PathBuf>,
    /// Write the plugin's counters in the Prometheus text format to FILE every interval (through a
    /// temporary file and a rename; for node_exporter's textfile collector: FILE ends in .prom).
    #[arg(long, value_name = "FILE")]
    pub prometheus: Option<PathBuf>,
    /// With --prometheus: write OpenMetrics 1.0 text instead (`# EOF`, counter families without _total).
    #[arg(long, requires = "prometheus")]
    pub openmetrics: bool,
    /// Draw Gb/s per path over time from the snapshots' history in the metrics directory into
    /// FILE (SVG) and exit.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Exit 1 when the processes in the metrics directory run different plugins or NCCLs (after
    /// one interval; the mismatches are printed either way).
    #[arg(long)]
    pub check_builds: bool,
}

pub fn run(args: Args) -> ExitCode {
    if !(0.05..=3600.0).contains(&args.interval) {
        eprintln!(
            "switchless watch: --interval {}: expected seconds in 0.05..=3600",
            args.interval
        );
        return ExitCode::from(2);
    }
    if !(0.0..=100.0).contains(&args.imbalance) {
        eprintln!(
            "switchless watch: --imbalance {}: expected a percentage in 0..=100",
            args.imbalance
        );
        return ExitCode::from(2);
    }
    if !args.root.is_dir() {
        eprintln!(
            "switchless watch: --root {}: not a directory",
            args.root.display()
        );
        return ExitCode::from(2);
    }
    let mdir = args.metrics_dir.clone().or_else(|| {
        std::env::var_os("NCCL_SWITCHLESS_METRICS_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    if mdir.is_none() && (args.prometheus.is_some() || args.plot.is_some() || args.check_builds) {
        eprintln!(
            "switchless watch: --prometheus, --plot and --check-builds read the plugin's snapshots: give \
             --metrics-dir DIR (or set NCCL_SWITCHLESS_METRICS_DIR)"
        );
        return ExitCode::from(2);
    }
    if let Some(d) = &mdir {
        if !d.is_dir() {
            eprintln!(
                "switchless watch: --metrics-dir {}: not a directory",
                d.display()
            );
            return ExitCode::from(2);
        }
    }
    if let (Some(out), Some(d)) = (&args.plot, &mdir) {
        return match metrics::plot_history(d, out) {
            Ok(n) => {
                println!("switchless watch: {n} path(s) drawn into {}", out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("switchless watch: --plot: {e}");
                ExitCode::from(2)
            }
        };
    }
    let rd = Reader::new(&args.root);
    let (model, _) = host::discover_with(&rd);
    let w = Watch::new(&model);
    let count = if args.once { Some(1) } else { args.count };
    let read_metrics = |d: &PathBuf| match metrics::read_dir(d) {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("switchless watch: {e}");
            None
        }
    };
    let mut prev = w.sample(&rd);
    let mut mprev = mdir.as_ref().and_then(read_metrics);
    let mut t0 = Instant::now();
    let mut n = 0u64;
    let mut mismatched = false;
    while count.is_none_or(|c| n < c) {
        std::thread::sleep(Duration::from_secs_f64(args.interval));
        let cur = w.sample(&rd);
        let mcur = mdir.as_ref().and_then(read_metrics);
        let t1 = Instant::now();
        let mut r = w.report(
            &prev,
            &cur,
            t1.duration_since(t0).as_secs_f64(),
            args.imbalance,
        );
        if let (Some(d), Some((now, bad))) = (&mdir, &mcur) {
            let before = mprev.as_ref().map(|(b, _)| b.as_slice()).unwrap_or(&[]);
            let kernel = |id: &crate::transport::metrics::PathId| watch::kernel_gbps(&r, id);
            let m = metrics::report(d, before, now, bad.clone(), &kernel);
            mismatched |= !m.mismatches.is_empty();
            if let Some(p) = &args.prometheus {
                let fmt = if args.openmetrics {
                    metrics::Format::OpenMetrics
                } else {
                    metrics::Format::Prometheus
                };
                if let Err(e) = metrics::write_atomic(p, &metrics::exposition(&m, fmt)) {
                    eprintln!("switchless watch: --prometheus: {e}");
                    return ExitCode::from(2);
                }
            }
            r.plugin = Some(m);
        }
        if args.json {
            match serde_json::to_string(&r) {
                Ok(s) => println!("{s}"),
                Err(e) => {
                    eprintln!("switchless watch: cannot encode JSON: {e}");
                    return ExitCode::from(2);
                }
            }
        } else {
            if n > 0 {
                println!();
            }
            print!("{}", watch::render_text(&r));
            if let Some(m) = &r.plugin {
                print!("{}", metrics::render_text(m));
            }
        }
        prev = cur;
        mprev = mcur;
        t0 = t1;
        n += 1;
    }
    if args.check_builds && mismatched {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
