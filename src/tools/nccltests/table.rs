//! nccl-tests' own lines: the result table (header, rows, footer), the run preamble and the
//! `# Using devices` block, split by launcher label into one stream per process.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use super::model::{Measurement, ParsedFile, RankDevice, Row, Run};
use super::nccl_log::{NcclLog, split_launcher_prefix};
use crate::error::{Error, Result};

/// The leading columns of a result table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lead {
    Size,
    Count,
    Type,
    Redop,
    Root,
}

/// Column positions inside one placement group.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    lead: Vec<Lead>,
    groups: usize,
    group_len: usize,
    time: usize,
    algbw: usize,
    busbw: usize,
    wrong: Option<usize>,
    /// Columns follow the placement groups (`timestamp`, RCCL's `algo proto nchannels`): rows may be longer.
    timestamp: bool,
    names: String,
}

impl Layout {
    fn columns(&self) -> usize {
        self.lead.len() + self.groups * self.group_len
    }
}

/// Parses a `#  size  count  type …` header. `Ok(None)` if the line is not a table header.
fn parse_header(body: &str) -> std::result::Result<Option<Layout>, String> {
    let tokens: Vec<&str> = body.split_whitespace().collect();
    if !(tokens.contains(&"size") && tokens.contains(&"algbw") && tokens.contains(&"busbw")) {
        return Ok(None);
    }
    let is_time = |t: &str| t == "time" || t == "cputime";
    let mut lead = Vec::new();
    let mut i = 0;
    while i < tokens.len() && !is_time(tokens[i]) {
        lead.push(match tokens[i] {
            "size" => Lead::Size,
            "count" => Lead::Count,
            "type" => Lead::Type,
            "redop" => Lead::Redop,
            "root" => Lead::Root,
            other => {
                return Err(format!(
                    "unknown leading column '{other}' (accepted: size, count, type, redop, root)"
                ));
            }
        });
        i += 1;
    }
    for needed in [Lead::Size, Lead::Count, Lead::Type] {
        if !lead.contains(&needed) {
            return Err(format!(
                "missing leading column {needed:?} (lower case) before 'time'"
            ));
        }
    }
    let mut groups: Vec<Vec<&str>> = Vec::new();
    let mut timestamp = false;
    let mut extra = false;
    while i < tokens.len() {
        if tokens[i] == "timestamp" {
            timestamp = true;
            if i + 1 != tokens.len() {
                return Err("'timestamp' must be the last column".into());
            }
            break;
        }
        if is_time(tokens[i]) {
            groups.push(Vec::new());
        }
        if let Some(g) = groups.last_mut() {
            g.push(tokens[i]);
        }
        i += 1;
    }
    let first = groups
        .first()
        .ok_or("no 'time' column after the leading columns")?
        .clone();
    // Columns after the last placement group (RCCL's `algo proto nchannels`) are allowed and ignored.
    if let Some(last) = groups.last_mut() {
        if last.len() > first.len() && last[..first.len()] == first[..] {
            extra = true;
            last.truncate(first.len());
        }
    }
    if groups.iter().any(|g| *g != first) {
        return Err("the out-of-place and in-place column groups differ".into());
    }
    if groups.len() > 2 {
        return Err(format!(
            "{} placement groups (accepted: 1 or 2: out-of-place, in-place)",
            groups.len()
        ));
    }
    let pos = |name: &str| first.iter().position(|t| *t == name);
    let algbw = pos("algbw").ok_or("no 'algbw' column in a placement group")?;
    let busbw = pos("busbw").ok_or("no 'busbw' column in a placement group")?;
    let wrong = pos("#wrong").or_else(|| pos("error"));
    Ok(Some(Layout {
        lead,
        groups: groups.len(),
        group_len: first.len(),
        time: 0,
        algbw,
        busbw,
        wrong,
        timestamp: timestamp || extra,
        names: tokens.join(" "),
    }))
}

fn num<T: std::str::FromStr>(tok: &str, col: &str) -> std::result::Result<T, String> {
    tok.parse::<T>()
        .map_err(|_| format!("column '{col}' is '{tok}', expected a number"))
}

fn float(tok: &str, col: &str, what: &str) -> std::result::Result<f64, String> {
    let v: f64 = num(tok, col)?;
    if v.is_nan() || v < 0.0 {
        return Err(format!(
            "column '{col}' ({what}) is '{tok}', expected a non-negative number"
        ));
    }
    Ok(v)
}

fn parse_row(layout: &Layout, line_no: usize, body: &str) -> std::result::Result<Row, String> {
    let tokens: Vec<&str> = body.split_whitespace().collect();
    let want = layout.columns();
    let ok_len = if layout.timestamp {
        tokens.len() >= want
    } else {
        tokens.len() == want
    };
    if !ok_len {
        return Err(format!(
            "expected {want} columns ({}), found {}",
            layout.names,
            tokens.len()
        ));
    }
    let mut row = Row {
        line: line_no,
        size_bytes: 0,
        count: 0,
        dtype: String::new(),
        redop: String::new(),
        root: None,
        out_of_place: None,
        in_place: None,
    };
    for (col, tok) in layout.lead.iter().zip(&tokens) {
        match col {
            Lead::Size => row.size_bytes = num(tok, "size")?,
            Lead::Count => row.count = num(tok, "count")?,
            Lead::Type => row.dtype = (*tok).to_string(),
            Lead::Redop => row.redop = (*tok).to_string(),
            Lead::Root => row.root = Some(num(tok, "root")?),
        }
    }
    for g in 0..layout.groups {
        let base = layout.lead.len() + g * layout.group_len;
        // nccl-tests prints out-of-place first; a table with one group (`switchless bench
        // --nccl-tests`, which has no in-place variant) has only that one.
        let what = if g == 0 { "out-of-place" } else { "in-place" };
        let time_us = float(tokens[base + layout.time], "time", what)?;
        let algbw = float(tokens[base + layout.algbw], "algbw", what)?;
        let busbw = float(tokens[base + layout.busbw], "busbw", what)?;
        let wrong = match layout.wrong {
            Some(w) if tokens[base + w] != "N/A" => {
                let v = float(tokens[base + w], "#wrong", what)?;
                if v.fract() != 0.0 || !v.is_finite() {
                    return Err(format!(
                        "column '#wrong' ({what}) is '{}', expected a whole number or N/A",
                        tokens[base + w]
                    ));
                }
                Some(v as u64)
            }
            _ => None,
        };
        let m = Measurement {
            time_us,
            algbw_gbyte_s: algbw,
            busbw_gbyte_s: busbw,
            wrong,
        };
        if what == "out-of-place" {
            row.out_of_place = Some(m);
        } else {
            row.in_place = Some(m);
        }
    }
    Ok(row)
}

/// A row whose text did not parse, kept until the next line shows whether the output was cut there.
struct Pending {
    line: usize,
    text: String,
    reason: String,
}

/// Parser state for one output stream: one launcher label (`srun -l` task, `mpirun` rank), or the
/// unlabelled lines. Separate streams keep the tables of processes that each print a whole run apart
/// (nccl-tests built without MPI=1).
#[derive(Default)]
struct Stream {
    run: Option<Run>,
    layout: Option<Layout>,
    footer: bool,
    pending: Option<Pending>,
}

/// What one line of nccl-tests output is (NCCL's log lines and blank lines are sorted out before).
enum Kind<'a> {
    /// `# nccl-tests version …`, `# Collective test starting: …` or `# nThread …`: a run's preamble.
    Preamble(&'a str),
    /// `# Rank  0 Group …`, from the `# Using devices` block.
    Rank(&'a str),
    /// A result table header.
    Header(Layout),
    /// `# key : value`: the footer, `# error: …`, and lines this parser ignores.
    Field(&'a str, &'a str),
    /// A line starting with a digit: a result row, or the rest of one.
    Row,
    /// Any other line (other comments, the program's other output).
    Other,
}

/// Classifies a trimmed, non-blank line. An unrecognized table header is an error (its reason).
fn classify(t: &str) -> std::result::Result<Kind<'_>, String> {
    let Some(body) = t.strip_prefix('#') else {
        return Ok(if t.starts_with(|c: char| c.is_ascii_digit()) {
            Kind::Row
        } else {
            Kind::Other
        });
    };
    let body = body.trim();
    // A new run starts at the version line, at the start line, or at the first parameter line.
    if body.starts_with("nccl-tests version")
        || body.starts_with("Collective test starting:")
        || body.starts_with("nThread ")
    {
        return Ok(Kind::Preamble(body));
    }
    if body.starts_with("Rank ") {
        return Ok(Kind::Rank(body));
    }
    if let Some(layout) = parse_header(body)? {
        return Ok(Kind::Header(layout));
    }
    Ok(match body.split_once(':') {
        Some((key, value)) => Kind::Field(key.trim(), value.trim()),
        None => Kind::Other,
    })
}

/// What every stream's handlers share: the file's name and the runs already complete.
struct Parsed<'a> {
    source: &'a str,
    finished: Vec<Run>,
}

impl Parsed<'_> {
    /// A pending row is an error once a line that cannot continue it arrives.
    fn no_pending(&self, pending: &mut Option<Pending>) -> Result<()> {
        match pending.take() {
            Some(p) => Err(Error::InvalidUsage(format!(
                "{}:{}: malformed nccl-tests result row ({}): `{}`",
                self.source,
                p.line,
                p.reason,
                p.text.trim()
            ))),
            None => Ok(()),
        }
    }
}

impl Stream {
    /// NCCL may log while nccl-tests is in the middle of a row: the row's first columns are then glued
    /// to the log line and its remaining columns follow on a later line.
    fn nccl_line(&mut self, n: usize, line: &str) {
        if let (Some(l), false, None) = (self.layout.as_ref(), self.footer, self.pending.as_ref()) {
            if let Some(frag) = glued_row_fragment(line, l) {
                self.pending = Some(Pending {
                    line: n,
                    text: frag,
                    reason: "row cut by a NCCL log line".to_string(),
                });
            }
        }
    }

    fn preamble(&mut self, cx: &mut Parsed, n: usize, body: &str) -> Result<()> {
        let continues = self.run.as_ref().is_some_and(|r| {
            self.layout.is_none()
                && r.rows.is_empty()
                && !(body.starts_with("nccl-tests version") && r.nccl_tests_version.is_some())
                && !(body.starts_with("Collective test starting:") && r.test.is_some())
        });
        if !continues {
            cx.no_pending(&mut self.pending)?;
            cx.finished.extend(self.run.take());
            self.run = Some(Run::new(cx.source, n));
            self.layout = None;
            self.footer = false;
        }
        let r = self.run.get_or_insert_with(|| Run::new(cx.source, n));
        if let Some(rest) = body.strip_prefix("nccl-tests version") {
            let mut it = rest.split_whitespace();
            r.nccl_tests_version = it.next().map(str::to_string);
            r.nccl_library = it
                .find_map(|kv| kv.strip_prefix("nccl-library="))
                .and_then(|v| v.parse().ok());
        } else if let Some(name) = body.strip_prefix("Collective test starting:") {
            r.test = Some(name.trim().to_string());
        }
        Ok(())
    }

    fn rank(&mut self, body: &str) {
        if let (Some(r), Some(d)) = (self.run.as_mut(), parse_rank(body)) {
            r.ranks.push(d);
        }
    }

    fn header(&mut self, cx: &mut Parsed, n: usize, layout: Layout) -> Result<()> {
        cx.no_pending(&mut self.pending)?;
        // A second table without a new preamble (old releases): a new run.
        if self
            .run
            .as_ref()
            .is_some_and(|r| !r.rows.is_empty() || self.footer)
        {
            cx.finished.extend(self.run.take());
        }
        self.run.get_or_insert_with(|| Run::new(cx.source, n));
        self.layout = Some(layout);
        self.footer = false;
        Ok(())
    }

    /// `# key : value` line `t` (line `n`).
    fn field(&mut self, cx: &Parsed, n: usize, t: &str, key: &str, value: &str) -> Result<()> {
        let Some(r) = self.run.as_mut() else {
            return Ok(());
        };
        let first = value.split_whitespace().next().unwrap_or("");
        let not_a = |what: &str| {
            Error::InvalidUsage(format!(
                "{}:{n}: '{key}' is '{first}', expected {what}: `{t}`",
                cx.source
            ))
        };
        match key {
            "Out of bounds values" => {
                cx.no_pending(&mut self.pending)?;
                r.out_of_bounds = Some(first.parse().map_err(|_| not_a("a whole number"))?);
                self.footer = true;
            }
            "Avg bus bandwidth" => {
                cx.no_pending(&mut self.pending)?;
                let bw: f64 = first.parse().map_err(|_| not_a("a number in GB/s"))?;
                r.avg_busbw_gbyte_s = Some(bw);
                self.footer = true;
            }
            "Collective test concluded" => {
                r.concluded = true;
                if r.test.is_none() {
                    r.test = Some(value.to_string());
                }
                self.footer = true;
            }
            "error" => r.errors.push(value.to_string()),
            _ => {}
        }
        Ok(())
    }

    /// A line starting with a digit: a result row inside a table whose footer has not been printed.
    fn row(&mut self, cx: &Parsed, n: usize, t: &str) -> Result<()> {
        let Some(l) = self.layout.as_ref() else {
            return Ok(());
        };
        if self.footer {
            return Ok(());
        }
        // The rest of a row whose first columns came earlier (cut by a NCCL log line).
        if let Some(p) = self.pending.as_ref() {
            if let Ok(row) = parse_row(l, p.line, &format!("{} {t}", p.text)) {
                self.pending = None;
                if let Some(r) = self.run.as_mut() {
                    r.rows.push(row);
                }
                return Ok(());
            }
        }
        match parse_row(l, n, t) {
            Ok(row) => {
                cx.no_pending(&mut self.pending)?;
                if let Some(r) = self.run.as_mut() {
                    r.rows.push(row);
                }
            }
            Err(reason) => {
                cx.no_pending(&mut self.pending)?;
                self.pending = Some(Pending {
                    line: n,
                    text: t.to_string(),
                    reason,
                });
            }
        }
        Ok(())
    }

    /// The stream's last run, with the row it was cut off in.
    fn finish(self) -> Option<Run> {
        let mut r = self.run?;
        if let Some(p) = self.pending {
            r.truncated_row = Some((p.line, p.text));
        }
        Some(r)
    }
}

/// Parses one file's text. `source` names it in messages.
///
/// Lines that are neither nccl-tests output nor NCCL log lines are ignored. A result row that does not
/// match its table's header is an error naming the line, unless nothing of that table follows it (the
/// output was cut off: the run is reported as truncated).
pub fn parse_text(source: &str, text: &str) -> Result<ParsedFile> {
    let mut nccl = NcclLog::default();
    let mut streams: BTreeMap<Option<String>, Stream> = BTreeMap::new();
    let mut cx = Parsed {
        source,
        finished: Vec::new(),
    };
    for (idx, raw) in text.lines().enumerate() {
        let n = idx + 1;
        let raw = raw.trim_end_matches('\r');
        let (label, line) = split_launcher_prefix(raw);
        let key = label.map(str::to_string);
        if nccl.feed(raw) {
            if let Some(st) = streams.get_mut(&key) {
                st.nccl_line(n, line);
            }
            continue;
        }
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let st = streams.entry(key).or_default();
        let kind = classify(t).map_err(|reason| {
            Error::InvalidUsage(format!(
                "{source}:{n}: unrecognized nccl-tests table header ({reason}): `{t}`"
            ))
        })?;
        match kind {
            Kind::Preamble(body) => st.preamble(&mut cx, n, body)?,
            Kind::Rank(body) => st.rank(body),
            Kind::Header(layout) => st.header(&mut cx, n, layout)?,
            Kind::Field(key, value) => st.field(&cx, n, t, key, value)?,
            Kind::Row => st.row(&cx, n, t)?,
            Kind::Other => {}
        }
    }
    let mut runs = cx.finished;
    runs.extend(streams.into_values().filter_map(Stream::finish));
    runs.sort_by_key(|r| r.start_line);
    Ok(ParsedFile {
        source: source.to_string(),
        runs,
        nccl,
    })
}

/// The leading row columns glued in front of a NCCL log line (`   1024   256  float  sum  -1host:1:2 [0] NCCL
/// INFO …`): the text before the `host:pid:tid` token, when it holds exactly the leading columns and
/// the last of them is the integer `root` column.
fn glued_row_fragment(line: &str, layout: &Layout) -> Option<String> {
    if layout.lead.last() != Some(&Lead::Root) {
        return None;
    }
    let i = line.find(" NCCL INFO ")?;
    let mut tokens: Vec<&str> = line[..i].split_whitespace().collect();
    if tokens.last().is_some_and(|t| t.starts_with('[')) {
        tokens.pop();
    }
    let origin = tokens.pop()?;
    if tokens.len() + 1 != layout.lead.len() || !tokens[0].starts_with(|c: char| c.is_ascii_digit())
    {
        return None;
    }
    let sign = usize::from(origin.starts_with('-'));
    let digits = origin[sign..]
        .bytes()
        .take_while(u8::is_ascii_digit)
        .count();
    if digits == 0 || sign + digits == origin.len() {
        return None;
    }
    let root = &origin[..sign + digits];
    Some(format!("{} {root}", tokens.join(" ")))
}

/// `Rank  0 Group  0 Pid 123 on host device  0 [0000:17:00] NVIDIA B300`
fn parse_rank(body: &str) -> Option<RankDevice> {
    let tokens: Vec<&str> = body.split_whitespace().collect();
    let at = |name: &str| tokens.iter().position(|t| *t == name);
    let rank = tokens.get(at("Rank")? + 1)?.parse().ok()?;
    let host = (*tokens.get(at("on")? + 1)?).to_string();
    let dev_i = at("device")?;
    let device = tokens.get(dev_i + 1)?.parse().ok()?;
    let gpu = tokens
        .get(dev_i + 2..)
        .map(|rest| {
            rest.iter()
                .skip_while(|t| t.starts_with('['))
                .copied()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Some(RankDevice {
        rank,
        host,
        device,
        gpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::nccltests::fixtures::{GOOD, HEADER, table};

    #[test]
    fn header_layout() {
        let l = parse_header(HEADER.trim_start_matches('#'))
            .unwrap()
            .unwrap();
        assert_eq!(l.lead.len(), 5);
        assert_eq!(l.groups, 2);
        assert_eq!(l.group_len, 4);
        assert_eq!(l.columns(), 13);
        assert_eq!((l.algbw, l.busbw, l.wrong), (1, 2, Some(3)));
        assert!(!l.timestamp);
    }

    #[test]
    fn header_per_iteration_and_timestamp() {
        let h = " size count type redop root time algbw busbw #wrong i_min i_max i_p99 i_cv% time algbw busbw #wrong i_min i_max i_p99 i_cv% timestamp";
        let l = parse_header(h).unwrap().unwrap();
        assert_eq!(l.group_len, 8);
        assert!(l.timestamp);
        let row = "1024 256 float sum -1 10.1 0.10 0.19 0 9.0 11.0 12.0 3.1 10.2 0.10 0.19 0 9.0 11.0 12.0 3.1 2026-11-29 10:00:00";
        let r = parse_row(&l, 7, row).unwrap();
        assert_eq!(r.in_place.unwrap().busbw_gbyte_s, 0.19);
        assert_eq!(r.out_of_place.unwrap().wrong, Some(0));
    }

    #[test]
    fn old_header_without_root_and_error_column() {
        let h = " size count type redop time algbw busbw error time algbw busbw error";
        let l = parse_header(h).unwrap().unwrap();
        let r = parse_row(
            &l,
            1,
            "8 2 float sum 30.11 0.00 0.00 2e+00 29.90 0.00 0.00 0e+00",
        )
        .unwrap();
        assert_eq!(r.root, None);
        assert_eq!(r.out_of_place.unwrap().wrong, Some(2));
    }

    #[test]
    fn trailing_columns_after_the_groups() {
        let h = " size count type redop root time algbw busbw #wrong time algbw busbw #wrong algo proto nchannels";
        let l = parse_header(h).unwrap().unwrap();
        assert_eq!((l.groups, l.group_len), (2, 4));
        let r = parse_row(
            &l,
            1,
            "2097152 524288 float sum -1 87.02 24.10 45.18 0 86.52 24.24 45.45 0 RING SIMPLE 32",
        )
        .unwrap();
        assert_eq!(r.in_place.unwrap().busbw_gbyte_s, 45.45);
    }

    #[test]
    fn old_release_without_version_line() {
        // nccl-tests 2.13-era output: no version line, 1-byte PCI ids, two runs in one file.
        let run = "# nThread 1 nGpus 1 minBytes 536870912 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid     65 on node-a device  0 [0x8a] NVIDIA A800-SXM4-80GB
#  Rank  1 Group  0 Pid     66 on node-b device  0 [0x8f] NVIDIA A800-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
   536870912     134217728     float     sum      -1    24942   21.52   21.52      0    24966   21.50   21.50      0
  1073741824     268435456     float     sum      -1    49507   21.69   21.69      0    49613   21.64   21.64      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 21.5875
#
";
        let text = format!("{run}{run}");
        let p = parse_text("old", &text).unwrap();
        assert_eq!(p.runs.len(), 2);
        for r in &p.runs {
            assert_eq!(r.rows.len(), 2);
            assert_eq!(r.ranks[1].host, "node-b");
            assert_eq!(r.ranks[1].gpu, "NVIDIA A800-SXM4-80GB");
            assert!(r.complete());
            assert_eq!(r.test, None);
        }
        assert_eq!(p.runs[1].start_line, 15);
    }

    #[test]
    fn bad_header_is_an_error() {
        let e = parse_header(" size count flavour time algbw busbw #wrong").unwrap_err();
        assert!(e.contains("flavour"), "{e}");
        assert_eq!(parse_header(" Using devices").unwrap(), None);
    }

    #[test]
    fn row_values_and_na() {
        let l = parse_header(HEADER.trim_start_matches('#'))
            .unwrap()
            .unwrap();
        let r = parse_row(
            &l,
            3,
            "   536870912     134217728     float     sum      -1  1.3e+05  4097.1  7681.2    N/A   1364826  393.37  737.57    N/A",
        )
        .unwrap();
        let o = r.out_of_place.unwrap();
        assert_eq!(o.time_us, 1.3e5);
        assert_eq!(o.wrong, None);
        assert_eq!(r.in_place.unwrap().time_us, 1364826.0);
        assert_eq!(r.root, Some(-1));
        let e = parse_row(&l, 3, "1 2 float sum -1 1 2 x 0 1 2 3 0").unwrap_err();
        assert!(e.contains("busbw") && e.contains("'x'"), "{e}");
        let e = parse_row(&l, 3, "1 2 float sum -1 1 2 3 0.5 1 2 3 0").unwrap_err();
        assert!(e.contains("#wrong"), "{e}");
        let e = parse_row(&l, 3, "1 2 float sum -1 1 2 -3 0 1 2 3 0").unwrap_err();
        assert!(e.contains("non-negative"), "{e}");
    }

    #[test]
    fn malformed_row_in_the_middle_names_the_line() {
        let text = table(
            &[
                GOOD,
                "        2048           512     float     sum      -1    10.00   garbage",
                GOOD,
            ],
            true,
        );
        let e = parse_text("f.log", &text).unwrap_err().to_string();
        assert!(e.contains("f.log:6:"), "{e}");
        assert!(e.contains("expected 13 columns"), "{e}");
        assert!(e.contains("garbage"), "{e}");
    }

    #[test]
    fn malformed_row_before_footer_is_an_error() {
        let text = table(
            &[
                GOOD,
                "        2048           512     float     sum      -1    10.00   x",
            ],
            true,
        );
        assert!(parse_text("f", &text).is_err());
    }

    #[test]
    fn row_cut_by_a_nccl_log_line_is_rejoined() {
        let text = table(
            &[
                GOOD,
                "        2048           512     float     sum      -1host-a:12:13 [0] NCCL INFO Channel 04/1 : 0[0] -> 1[0] [send] via NET/switchless/1",
                "host-b:22:23 [0] NCCL INFO Channel 04/1 : 1[0] -> 0[0] [send] via NET/switchless/1",
                "    10.00    0.20    4.00      0    10.00    0.20    4.00      0",
                GOOD,
            ],
            true,
        );
        let p = parse_text("f", &text).unwrap();
        let r = &p.runs[0];
        assert_eq!(r.rows.len(), 3);
        assert_eq!(r.rows[1].size_bytes, 2048);
        assert_eq!(r.rows[1].line, 6);
        assert_eq!(r.rows[1].in_place.unwrap().busbw_gbyte_s, 4.0);
        assert_eq!(p.nccl.lines, 2);
    }

    #[test]
    fn interleaved_runs_of_separate_processes() {
        // nccl-tests built without MPI=1 under `srun -l`: every task prints its own whole run.
        let text = table(&[GOOD, GOOD], true);
        let mut mixed = String::new();
        for l in text.lines() {
            mixed.push_str(&format!("0: {l}\n1: {l}\n"));
        }
        let p = parse_text("f", &mixed).unwrap();
        assert_eq!(p.runs.len(), 2);
        for r in &p.runs {
            assert_eq!(r.rows.len(), 2);
            assert!(r.complete());
        }
        assert_eq!((p.runs[0].start_line, p.runs[1].start_line), (1, 2));
    }

    #[test]
    fn two_runs_in_one_file() {
        let mut text = table(&[GOOD], true);
        text.push_str(&table(&[GOOD, GOOD], true));
        let p = parse_text("f", &text).unwrap();
        assert_eq!(p.runs.len(), 2);
        assert_eq!(p.runs[1].rows.len(), 2);
        assert_eq!(p.runs[1].start_line, 10);
    }
}
