//! `switchless watch`: live Gb/s per NCCL device, member and TCP link from the kernel's counters
//! (see `tools::watch`). Exit status: 0, or 2 on a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::host::{self, Reader};
use crate::tools::watch::{self, Watch};

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
switchless watch                                  # beside a running job: Gb/s per device, function and link\n  \
switchless watch --once --json                    # one interval as JSON (schema switchless-watch/1)\n  \
switchless watch --interval 5 --imbalance 10      # flag siblings more than 10 % apart\n\
Exit status: 0; 2 a usage error or unreadable counters.")]
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
    let rd = Reader::new(&args.root);
    let (model, _) = host::discover_with(&rd);
    let w = Watch::new(&model);
    let count = if args.once { Some(1) } else { args.count };
    let mut prev = w.sample(&rd);
    let mut t0 = Instant::now();
    let mut n = 0u64;
    while count.is_none_or(|c| n < c) {
        std::thread::sleep(Duration::from_secs_f64(args.interval));
        let cur = w.sample(&rd);
        let t1 = Instant::now();
        let r = w.report(
            &prev,
            &cur,
            t1.duration_since(t0).as_secs_f64(),
            args.imbalance,
        );
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
        }
        prev = cur;
        t0 = t1;
        n += 1;
    }
    ExitCode::SUCCESS
}
