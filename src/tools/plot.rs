//! SVG line plots of a rate against message size (log-scale x), for `switchless bench --plot` and
//! the performance page, and of rates over time ([`time_svg`], `switchless watch --plot`). Uses `plotters`' SVG backend (text as SVG `<text>`, no font files).
#![forbid(unsafe_code)]

use std::path::Path;

use plotters::prelude::*;

use crate::error::{Error, Result};

/// One line: a label and (size in bytes, value) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(u64, f64)>,
    /// Drawn dashed-looking (thin, grey) as a reference line (e.g. the modelled rate).
    pub reference: bool,
}

/// A plot: title, y-axis label (with its unit) and lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Log-scale y (latency over sizes spanning decades); points ≤ 0 are left out.
    pub log_y: bool,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

fn err(e: impl std::fmt::Display) -> Error {
    Error::System(format!("plot: {e}"))
}

/// A byte count for the x axis: 8 B, 64 KiB, 4 MiB.
pub fn size_text(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Renders `p` into an SVG string.
pub fn svg(p: &Plot) -> Result<String> {
    svg_panels(std::slice::from_ref(p))
}

/// Renders the plots stacked top to bottom in one SVG (e.g. bandwidth over latency).
pub fn svg_panels(plots: &[Plot]) -> Result<String> {
    if plots.is_empty() {
        return Err(Error::InvalidArgument("plot: no panels".into()));
    }
    let n = u32::try_from(plots.len()).unwrap_or(u32::MAX);
    let mut out = String::new();
    {
        let root =
            SVGBackend::with_string(&mut out, (800, 480u32.saturating_mul(n))).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        for (p, area) in plots.iter().zip(root.split_evenly((plots.len(), 1))) {
            draw(p, &area)?;
        }
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// A log10 axis value as text: 1, 10, 100, 0.1 …
fn decade_text(v: f64) -> String {
    let x = 10f64.powf(v);
    if x >= 1.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

fn draw(p: &Plot, root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> Result<()> {
    // y is log10(value) on a linear axis under log_y, as x is log2(size)
    let ty = |y: f64| if p.log_y { y.log10() } else { y };
    let keep = |y: f64| !p.log_y || y > 0.0;
    let pts = p
        .series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(_, y)| keep(*y));
    let (mut xmin, mut xmax) = (u64::MAX, 1u64);
    let (mut ymin, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in pts {
        xmin = xmin.min(x.max(1));
        xmax = xmax.max(x);
        ymin = ymin.min(ty(y));
        ymax = ymax.max(ty(y));
    }
    if xmin == u64::MAX {
        return Err(Error::InvalidArgument("plot: no points".into()));
    }
    // x is log2(size) on a linear axis: ticks land on powers of two, labelled as sizes
    let lx = |x: u64| (x.max(1) as f64).log2();
    let (x0, x1) = (
        lx(xmin).floor(),
        lx(xmax).ceil().max(lx(xmin).floor() + 1.0),
    );
    let (y0, y1) = if p.log_y {
        (ymin.floor(), ymax.ceil().max(ymin.floor() + 1.0))
    } else {
        (0.0, if ymax > 0.0 { ymax * 1.08 } else { 1.0 })
    };
    let mut chart = ChartBuilder::on(root)
        .caption(&p.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    let y_fmt = |y: &f64| {
        if !p.log_y {
            format!("{y}")
        } else if y.fract().abs() < 1e-9 {
            decade_text(*y)
        } else {
            String::new()
        }
    };
    let y_desc = if p.log_y {
        format!("{} (log scale)", p.y_label)
    } else {
        p.y_label.clone()
    };
    let mut mesh = chart.configure_mesh();
    mesh.x_desc("message size (bytes, log scale)")
        .y_desc(y_desc.as_str())
        .x_labels(((x1 - x0) as usize / 2).clamp(2, 14))
        .x_label_formatter(&|x| {
            if x.fract().abs() < 1e-9 && *x >= 0.0 {
                size_text(1u64 << (*x as u32).min(62))
            } else {
                String::new()
            }
        });
    if p.log_y {
        mesh.y_labels(((y1 - y0) as usize * 2 + 1).clamp(3, 20))
            .y_label_formatter(&y_fmt);
    }
    mesh.draw().map_err(err)?;
    let mut k = 0;
    for s in &p.series {
        let style = if s.reference {
            ShapeStyle::from(&RGBColor(120, 120, 120)).stroke_width(1)
        } else {
            let c = COLORS[k % COLORS.len()];
            k += 1;
            ShapeStyle::from(&c).stroke_width(2)
        };
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|(_, y)| keep(*y))
            .map(|&(x, y)| (lx(x), ty(y)))
            .collect();
        let color = style.color;
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(err)?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        if !s.reference {
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, style.filled())))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// One line over time: a label and (seconds, value) points.
#[derive(Debug, Clone, PartialEq)]
pub struct TimeSeries {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Renders lines over time (linear axes from 0) into an SVG string.
pub fn time_svg(title: &str, y_label: &str, series: &[TimeSeries]) -> Result<String> {
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut xmax, mut ymax, mut any) = (0f64, 0f64, false);
    for &(x, y) in pts {
        xmax = xmax.max(x);
        ymax = ymax.max(y);
        any = true;
    }
    if !any {
        return Err(Error::InvalidArgument("plot: no points".into()));
    }
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (900, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..xmax.max(1.0), 0f64..(ymax * 1.08).max(1.0))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time since the first snapshot (s)")
            .y_desc(y_label)
            .draw()
            .map_err(err)?;
        for (k, s) in series.iter().enumerate() {
            let c = COLORS[k % COLORS.len()];
            let style = ShapeStyle::from(&c).stroke_width(2);
            chart
                .draw_series(LineSeries::new(s.points.clone(), style))
                .map_err(err)?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// Renders `p` into the file `path`.
pub fn write(p: &Plot, path: &Path) -> Result<()> {
    write_panels(std::slice::from_ref(p), path)
}

/// Renders the plots stacked into the file `path`.
pub fn write_panels(plots: &[Plot], path: &Path) -> Result<()> {
    let s = svg_panels(plots)?;
    std::fs::write(path, s).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri perturbs float math (log, powf), so the axis labels differ"
    )]
    fn a_plot_has_its_title_axes_and_legend() {
        let p = Plot {
            title: "bandwidth".into(),
            y_label: "Gb/s".into(),
            series: vec![
                Series {
                    label: "achieved".into(),
                    points: vec![(8, 0.1), (1 << 20, 150.0), (4 << 20, 180.0)],
                    reference: false,
                },
                Series {
                    label: "modelled".into(),
                    points: vec![(8, 189.85), (4 << 20, 189.85)],
                    reference: true,
                },
            ],
            log_y: false,
        };
        let s = svg(&p).unwrap();
        assert!(s.starts_with("<svg"), "{}", &s[..40]);
        for want in [
            "bandwidth",
            "Gb/s",
            "achieved",
            "modelled",
            "log scale",
            "1 MiB",
        ] {
            assert!(s.contains(want), "missing {want}");
        }
        assert!(
            svg(&Plot {
                series: vec![],
                ..p.clone()
            })
            .is_err()
        );
        // Two panels in one SVG; log-scale y labels its decades and drops points ≤ 0.
        let lat = Plot {
            title: "latency".into(),
            y_label: "time (us)".into(),
            series: vec![Series {
                label: "run".into(),
                points: vec![(8, 0.0), (64, 12.0), (1 << 20, 2500.0)],
                reference: false,
            }],
            log_y: true,
        };
        let s = svg_panels(&[p, lat]).unwrap();
        for want in [
            "bandwidth",
            "latency",
            "time (us) (log scale)",
            "\n1000\n",
            "\n10\n",
        ] {
            assert!(s.contains(want), "missing {want}");
        }
        assert!(s.contains("height=\"960\""), "{}", &s[..120]);
    }
}
