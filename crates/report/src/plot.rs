//! SVG line plots (plotters' SVG backend only: no font or system library is
//! needed). Used for every reproduced figure: mmulab's points with their
//! CI bars, fitted lines, and the paper's data as a series of its own,
//! with markers, so that a single paper point is never invisible. Each SVG
//! gets a CSV of its plotted data beside it.

use plotters::prelude::*;
use std::path::Path;

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// A line through the points (a fit, a model curve).
    Line,
    /// mmulab's points: filled circles with error bars.
    Measured,
    /// The paper's points: black triangles joined by a dashed-looking thin
    /// line, so one point alone still shows.
    Paper,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Optional (low, high) per point (same length as `points`, or empty).
    pub bars: Vec<(f64, f64)>,
    pub style: Style,
}

impl Series {
    pub fn line(label: &str, points: Vec<(f64, f64)>) -> Series {
        Series {
            label: label.into(),
            points,
            bars: Vec::new(),
            style: Style::Line,
        }
    }

    /// Measured points with a symmetric ± spread per point (or none).
    pub fn points(label: &str, points: Vec<(f64, f64)>, spread: Vec<f64>) -> Series {
        let bars = points
            .iter()
            .zip(&spread)
            .map(|(&(_, y), &d)| (y - d, y + d))
            .collect();
        Series {
            label: label.into(),
            points,
            bars,
            style: Style::Measured,
        }
    }

    /// Measured points with a (low, high) interval per point.
    pub fn with_ci(label: &str, points: Vec<(f64, f64)>, bars: Vec<(f64, f64)>) -> Series {
        Series {
            label: label.into(),
            points,
            bars,
            style: Style::Measured,
        }
    }

    /// The paper's published points (read off its figure or text).
    pub fn paper(label: &str, points: Vec<(f64, f64)>) -> Series {
        Series {
            label: label.into(),
            points,
            bars: Vec::new(),
            style: Style::Paper,
        }
    }
}

pub struct LinePlot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// `None`: a log2 x axis when every positive x doubles; `Some` forces.
    pub log2_x: Option<bool>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {msg}")]
pub struct PlotError {
    path: String,
    msg: String,
}

/// True when the x values, sorted and deduplicated, double at each step
/// (2, 4, 8, ...): such sweeps read best on a log2 axis.
pub fn x_doubles(xs: &[f64]) -> bool {
    let mut v: Vec<f64> = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v.len() >= 3 && v[0] > 0.0 && v.windows(2).all(|w| (w[1] / w[0] - 2.0).abs() < 1e-9)
}

impl LinePlot {
    pub fn new(title: &str, x_label: &str, y_label: &str) -> LinePlot {
        LinePlot {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: Vec::new(),
            log2_x: None,
        }
    }

    pub fn add(&mut self, s: Series) -> &mut Self {
        self.series.push(s);
        self
    }

    fn uses_log2(&self) -> bool {
        let xs: Vec<f64> = self
            .series
            .iter()
            .filter(|s| s.style == Style::Measured)
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        let positive = self
            .series
            .iter()
            .all(|s| s.points.iter().all(|p| p.0 > 0.0));
        self.log2_x.unwrap_or_else(|| x_doubles(&xs)) && positive
    }

    /// The plotted data, one line per point: series, x, y, low, high.
    pub fn to_csv(&self) -> String {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(["series", "style", "x", "y", "y_low", "y_high"])
            .expect("in-memory CSV");
        for s in &self.series {
            let style = match s.style {
                Style::Line => "line",
                Style::Measured => "mmulab",
                Style::Paper => "paper",
            };
            for (i, &(x, y)) in s.points.iter().enumerate() {
                let (lo, hi) = s.bars.get(i).map_or((String::new(), String::new()), |b| {
                    (b.0.to_string(), b.1.to_string())
                });
                w.write_record([
                    s.label.clone(),
                    style.into(),
                    x.to_string(),
                    y.to_string(),
                    lo,
                    hi,
                ])
                .expect("in-memory CSV");
            }
        }
        String::from_utf8(w.into_inner().expect("in-memory CSV")).expect("UTF-8")
    }

    /// Writes the SVG at `path` and its data at `path` with `.csv`.
    pub fn write_svg(&self, path: &Path) -> Result<(), PlotError> {
        let err = |e: &dyn std::fmt::Display| PlotError {
            path: path.display().to_string(),
            msg: e.to_string(),
        };
        for s in &self.series {
            assert!(
                s.bars.is_empty() || s.bars.len() == s.points.len(),
                "{}: {} bars for {} points",
                s.label,
                s.bars.len(),
                s.points.len()
            );
        }
        std::fs::write(path.with_extension("csv"), self.to_csv()).map_err(|e| err(&e))?;
        let log2 = self.uses_log2();
        let tx = |x: f64| if log2 { x.log2() } else { x };
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
        for s in &self.series {
            for (i, &(x, y)) in s.points.iter().enumerate() {
                let (lo, hi) = s.bars.get(i).copied().unwrap_or((y, y));
                x0 = x0.min(tx(x));
                x1 = x1.max(tx(x));
                y0 = y0.min(lo.min(y));
                y1 = y1.max(hi.max(y));
            }
        }
        if x0 > x1 {
            (x0, x1, y1) = (0.0, 1.0, 1.0);
        }
        if x0 == x1 {
            (x0, x1) = (x0 - 0.5, x1 + 0.5);
        }
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        // Room around the extreme points, so markers at the edges show.
        let xpad = (x1 - x0) * 0.04;
        let ypad = (y1 - y0) * 0.08;
        let root = SVGBackend::new(path, (800, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (x0 - xpad)..(x1 + xpad),
                (y0 - ypad.min(y0.abs()))..(y1 + ypad),
            )
            .map_err(|e| err(&e))?;
        let x_desc = if log2 {
            format!("{} (log2 scale)", self.x_label)
        } else {
            self.x_label.clone()
        };
        let x_fmt = |v: &f64| -> String {
            if !log2 {
                return crate::repro::fmt_num(*v);
            }
            if (v - v.round()).abs() < 1e-6 {
                crate::repro::fmt_num(2f64.powf(v.round()))
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc(x_desc.as_str())
            .y_desc(self.y_label.as_str())
            .x_label_formatter(&x_fmt)
            .draw()
            .map_err(|e| err(&e))?;
        let mut palette = 0;
        for s in &self.series {
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (tx(x), y)).collect();
            match s.style {
                Style::Paper => {
                    let color = BLACK;
                    if pts.len() > 1 {
                        chart
                            .draw_series(LineSeries::new(pts.clone(), color.mix(0.4)))
                            .map_err(|e| err(&e))?;
                    }
                    chart
                        .draw_series(
                            pts.iter()
                                .map(|&(x, y)| TriangleMarker::new((x, y), 7, color.filled())),
                        )
                        .map_err(|e| err(&e))?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| TriangleMarker::new((x, y), 7, color.filled()));
                }
                Style::Measured => {
                    let color = Palette99::pick(palette).to_rgba();
                    palette += 1;
                    for (i, &(x, _)) in pts.iter().enumerate() {
                        if let Some(&(lo, hi)) = s.bars.get(i) {
                            chart
                                .draw_series(std::iter::once(PathElement::new(
                                    vec![(x, lo), (x, hi)],
                                    color.stroke_width(2),
                                )))
                                .map_err(|e| err(&e))?;
                        }
                    }
                    chart
                        .draw_series(
                            pts.iter()
                                .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
                        )
                        .map_err(|e| err(&e))?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| Circle::new((x, y), 4, color.filled()));
                }
                Style::Line => {
                    let color = Palette99::pick(palette).to_rgba();
                    palette += 1;
                    chart
                        .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                        .map_err(|e| err(&e))?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
                }
            }
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubling_x_gets_a_log2_axis() {
        assert!(x_doubles(&[2.0, 4.0, 8.0, 16.0]));
        assert!(!x_doubles(&[1.0, 2.0, 3.0]));
        assert!(!x_doubles(&[2.0, 4.0]));
    }

    #[test]
    fn a_single_paper_point_is_drawn_and_listed() {
        let dir = std::env::temp_dir().join(format!("mmulab-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = LinePlot::new("t", "processors", "µs");
        p.add(Series::with_ci(
            "mmulab",
            vec![(32.0, 2000.0), (64.0, 3900.0), (128.0, 7700.0)],
            vec![(1900.0, 2100.0), (3800.0, 4000.0), (7600.0, 7800.0)],
        ));
        p.add(Series::paper("paper: ~6 ms at 100", vec![(100.0, 6000.0)]));
        let svg = dir.join("x-fig1.svg");
        p.write_svg(&svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("paper: ~6 ms at 100"));
        assert!(text.contains("log2 scale"));
        // The triangle marker is a polygon in plotters' SVG.
        assert!(text.contains("<polygon"), "no marker drawn");
        let csv = std::fs::read_to_string(dir.join("x-fig1.csv")).unwrap();
        assert!(
            csv.lines()
                .any(|l| l.starts_with("paper: ~6 ms at 100,paper,100,6000"))
        );
        assert_eq!(csv.lines().count(), 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
