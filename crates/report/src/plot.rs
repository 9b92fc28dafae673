//! SVG line plots (plotters' SVG backend only: no font or system library is
//! needed). Used for every reproduced figure: mmulab's points, error bars
//! where there is a spread, and the paper's line or points over them.

use plotters::prelude::*;
use std::path::Path;

#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Optional ± spread per point (same length as `points`).
    pub spread: Vec<f64>,
    /// Draw markers only (measured points) instead of a line (a fit or the
    /// paper's line).
    pub markers: bool,
}

impl Series {
    pub fn line(label: &str, points: Vec<(f64, f64)>) -> Series {
        Series {
            label: label.into(),
            points,
            spread: Vec::new(),
            markers: false,
        }
    }
    pub fn points(label: &str, points: Vec<(f64, f64)>, spread: Vec<f64>) -> Series {
        Series {
            label: label.into(),
            points,
            spread,
            markers: true,
        }
    }
}

pub struct LinePlot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {msg}")]
pub struct PlotError {
    path: String,
    msg: String,
}

impl LinePlot {
    pub fn new(title: &str, x_label: &str, y_label: &str) -> LinePlot {
        LinePlot {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: Vec::new(),
        }
    }

    pub fn add(&mut self, s: Series) -> &mut Self {
        self.series.push(s);
        self
    }

    pub fn write_svg(&self, path: &Path) -> Result<(), PlotError> {
        let err = |e: &dyn std::fmt::Display| PlotError {
            path: path.display().to_string(),
            msg: e.to_string(),
        };
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
        for s in &self.series {
            for (i, &(x, y)) in s.points.iter().enumerate() {
                let d = s.spread.get(i).copied().unwrap_or(0.0);
                x0 = x0.min(x);
                x1 = x1.max(x);
                y0 = y0.min(y - d);
                y1 = y1.max(y + d);
            }
        }
        if x0 > x1 {
            (x0, x1, y1) = (0.0, 1.0, 1.0);
        }
        if x0 == x1 {
            x1 = x0 + 1.0;
        }
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        let pad = (y1 - y0) * 0.08;
        let root = SVGBackend::new(path, (800, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, y0..(y1 + pad))
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .draw()
            .map_err(|e| err(&e))?;
        for (i, s) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            if s.markers {
                chart
                    .draw_series(
                        s.points
                            .iter()
                            .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
                    )
                    .map_err(|e| err(&e))?
                    .label(s.label.as_str())
                    .legend(move |(x, y)| Circle::new((x, y), 4, color.filled()));
                for (i, &(x, y)) in s.points.iter().enumerate() {
                    if let Some(&d) = s.spread.get(i) {
                        chart
                            .draw_series(LineSeries::new(vec![(x, y - d), (x, y + d)], color))
                            .map_err(|e| err(&e))?;
                    }
                }
            } else {
                chart
                    .draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(s.label.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
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
