//! `switchless nccl-tests summarize FILE...`: summarize NVIDIA nccl-tests output.
//!
//! Exit status: 0 when every run completed with no wrong elements and met the target; 1 when a run has
//! wrong elements, is incomplete, is below `--expect-busbw`, or (with `--require-plugin`) NCCL did not
//! use the plugin; 2 when the input cannot be read or holds a malformed table.
#![forbid(unsafe_code)]

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::error::{Error, Result};
use crate::tools::nccltests::{self, Metric, Options, ParsedFile};

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
switchless nccl-tests summarize all_reduce.out nccl.all_reduce.*.log --require-plugin\n\
Exit status: that of the subcommand (see switchless nccl-tests summarize --help).")]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Summarize nccl-tests output (stdout, with or without NCCL INFO lines) and NCCL_DEBUG_FILE logs.
    Summarize(SummarizeArgs),
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
switchless nccl-tests summarize out/all_reduce.out out/nccl.all_reduce.*.log --require-plugin --expect-busbw 6000Gb/s\n\
Exit status: 0 every run complete, no wrong elements, target met; 1 wrong elements, an incomplete run, busbw below --expect-busbw, or (--require-plugin) plugin use not confirmed; 2 unreadable file or malformed table.\nBandwidths: nccl-tests' GB is 10^9 bytes, so 1 GB/s = 8 Gb/s.")]
pub struct SummarizeArgs {
    /// nccl-tests output files and NCCL_DEBUG_FILE logs (`-` reads standard input).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Minimum bus bandwidth; a bare number is GB/s (nccl-tests' unit), or give a unit: 787GB/s, 6300Gb/s.
    #[arg(long, value_name = "BANDWIDTH", value_parser = parse_bw)]
    pub expect_busbw: Option<f64>,

    /// Figure compared with --expect-busbw: busbw at the largest size (lower of out-of-place and
    /// in-place), nccl-tests' Avg bus bandwidth, or the peak busbw.
    #[arg(long, value_enum, default_value = "largest")]
    pub metric: Metric,

    /// Network name the plugin reports to NCCL (`Using network NAME`).
    #[arg(long, default_value = "switchless", value_name = "NAME")]
    pub plugin_name: String,

    /// Fail unless NCCL's INFO lines show every process used the plugin.
    #[arg(long)]
    pub require_plugin: bool,

    /// Print the summary as JSON (bandwidths in GB/s, fields named *_gbyte_s).
    #[arg(long)]
    pub json: bool,

    /// Also write an SVG: bus bandwidth and time per operation against message size (log-scale x),
    /// one line per run (every FILE and every test in it), out-of-place figures.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// The --plot of the parsed files: a bus-bandwidth panel over a latency panel, one line per run.
fn plot(parsed: &[ParsedFile], path: &std::path::Path) -> Result<()> {
    use crate::tools::plot::{Plot, Series};
    let mut bw = Vec::new();
    let mut lat = Vec::new();
    for f in parsed {
        let file = std::path::Path::new(&f.source)
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| f.source.clone());
        for r in &f.runs {
            let mut label = match &r.test {
                Some(t) => format!("{file}: {t}"),
                None => file.clone(),
            };
            if f.runs.len() > 1 {
                label = format!("{label} (line {})", r.start_line);
            }
            let pick = |g: &dyn Fn(&nccltests::Measurement) -> f64| -> Vec<(u64, f64)> {
                r.rows
                    .iter()
                    .filter_map(|row| row.out_of_place.as_ref().map(|m| (row.size_bytes, g(m))))
                    .collect()
            };
            bw.push(Series {
                label: label.clone(),
                points: pick(&|m| m.busbw_gbyte_s),
                reference: false,
            });
            lat.push(Series {
                label,
                points: pick(&|m| m.time_us),
                reference: false,
            });
        }
    }
    if bw.iter().all(|s| s.points.is_empty()) {
        return Err(Error::InvalidArgument(
            "--plot: no result rows to draw".into(),
        ));
    }
    crate::tools::plot::write_panels(
        &[
            Plot {
                title: "nccl-tests bus bandwidth (out-of-place)".into(),
                y_label: "busbw (GB/s, 10^9 bytes/s)".into(),
                series: bw,
                log_y: false,
            },
            Plot {
                title: "nccl-tests time per operation (out-of-place)".into(),
                y_label: "time (us)".into(),
                series: lat,
                log_y: true,
            },
        ],
        path,
    )
}

fn parse_bw(s: &str) -> std::result::Result<f64, String> {
    nccltests::parse_bandwidth(s).map_err(|e| e.to_string())
}

fn read(path: &PathBuf) -> Result<(String, String)> {
    let mut bytes = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io("reading standard input", e))?;
        return Ok((
            "<stdin>".to_string(),
            String::from_utf8_lossy(&bytes).into_owned(),
        ));
    }
    let name = path.display().to_string();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| Error::io(format!("reading {name}"), e))?;
    Ok((name, String::from_utf8_lossy(&bytes).into_owned()))
}

fn summarize(a: &SummarizeArgs) -> Result<(String, bool)> {
    let mut parsed: Vec<ParsedFile> = Vec::new();
    for f in &a.files {
        let (name, text) = read(f)?;
        parsed.push(nccltests::parse_text(&name, &text)?);
    }
    if let Some(p) = &a.plot {
        plot(&parsed, p).map_err(|e| e.context(format!("--plot {}", p.display())))?;
    }
    let opts = Options {
        expect_busbw_gbyte_s: a.expect_busbw,
        metric: a.metric,
        plugin_name: a.plugin_name.clone(),
        require_plugin: a.require_plugin,
    };
    let s = nccltests::summarize(parsed, &opts)?;
    let text = if a.json {
        let mut j = serde_json::to_string_pretty(&s)
            .map_err(|e| Error::Internal(format!("serializing the summary: {e}")))?;
        j.push('\n');
        j
    } else {
        nccltests::render_text(&s)
    };
    Ok((text, s.passed()))
}

pub fn run(args: Args) -> ExitCode {
    match args.cmd {
        Cmd::Summarize(a) => match summarize(&a) {
            Ok((text, passed)) => {
                print!("{text}");
                if passed {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                // A damaged input file is not a configuration problem: say what it is.
                match e {
                    crate::error::Error::InvalidUsage(m) => {
                        eprintln!("switchless nccl-tests summarize: {m}")
                    }
                    e => eprintln!("switchless nccl-tests summarize: {e}"),
                }
                ExitCode::from(2)
            }
        },
    }
}
