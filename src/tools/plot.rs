//! SVG line plots of a rate against message size (log-scale x), for `switchless bench --plot` and
//! the performance page. Uses `plotters`' SVG backend (text as SVG `<text>`, no font files).
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
    let pts = p.series.iter().flat_map(|s| s.points.iter());
    let (mut xmin, mut xmax, mut ymax) = (u64::MAX, 1u64, 0f64);
    for &(x, y) in pts {
        xmin = xmin.min(x.max(1));
        xmax = xmax.max(x);
        ymax = ymax.max(y);
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
    let ymax = if ymax > 0.0 { ymax * 1.08 } else { 1.0 };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (800, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&p.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("message size (bytes, log scale)")
            .y_desc(p.y_label.as_str())
            .x_labels(((x1 - x0) as usize / 2).clamp(2, 14))
            .x_label_formatter(&|x| {
                if x.fract().abs() < 1e-9 && *x >= 0.0 {
                    size_text(1u64 << (*x as u32).min(62))
                } else {
                    String::new()
                }
            })
            .draw()
            .map_err(err)?;
        let mut k = 0;
        for s in &p.series {
            let style = if s.reference {
                ShapeStyle::from(&RGBColor(120, 120, 120)).stroke_width(1)
            } else {
                let c = COLORS[k % COLORS.len()];
                k += 1;
                ShapeStyle::from(&c).stroke_width(2)
            };
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (lx(x), y)).collect();
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
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// Renders `p` into the file `path`.
pub fn write(p: &Plot, path: &Path) -> Result<()> {
    let s = svg(p)?;
    std::fs::write(path, s).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
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
                ..p
            })
            .is_err()
        );
    }
}
