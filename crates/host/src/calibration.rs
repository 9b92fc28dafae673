//! The numbers a `host` timing preset is made from: the fitted line, the
//! baseline and every measured median, with the environment they hold for.
//! The simulator's preset is built from these by the machine layer; this
//! crate only measures (DESIGN.md: costs are inputs, results emerge).

use crate::environment::Environment;
use crate::options::Op;
use crate::report::{FitBasis, HostReport};
use serde::{Deserialize, Serialize};

/// One measured point, as the preset check compares against it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    pub responders: usize,
    pub median_ns: f64,
    pub mean_ns: f64,
    pub p10_ns: f64,
    pub p90_ns: f64,
}

/// The fitted line `intercept_ns + slope_ns · responders` (medians).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationFit {
    pub intercept_ns: f64,
    pub slope_ns: f64,
    pub r2: f64,
    pub basis: FitBasis,
}

/// What `preset_components` returns; serialisable to JSON and TOML.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostCalibration {
    /// Always "host".
    pub preset: String,
    /// Where the numbers come from, in words.
    pub source: String,
    pub op: Op,
    pub pages: usize,
    pub reps: usize,
    /// Median with no responder: the operation with a local flush only.
    pub baseline_ns: f64,
    /// `None` when no responder count could be measured (one usable core).
    pub fit: Option<CalibrationFit>,
    /// `fit.intercept_ns - baseline_ns`: what involving the first remote
    /// CPU adds (IPI send, remote dispatch and flush, acknowledgement).
    pub shootdown_fixed_ns: Option<f64>,
    /// The per-responder cost (`fit.slope_ns`), repeated for convenience.
    pub per_responder_ns: Option<f64>,
    /// Every measured point, the baseline (0 responders) first.
    pub points: Vec<CalibrationPoint>,
    /// Whether every point passed the consistency check.
    pub consistent: bool,
    pub environment: Environment,
}

impl HostCalibration {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("calibration serialises")
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("calibration serialises to TOML")
    }
}

/// The fitted numbers and the per-point medians of a run.
pub fn preset_components(report: &HostReport) -> HostCalibration {
    let b = &report.baseline;
    let fit = report.fit.map(|f| CalibrationFit {
        intercept_ns: f.intercept_ns,
        slope_ns: f.slope_ns,
        r2: f.r2,
        basis: f.basis,
    });
    let points = std::iter::once(b)
        .chain(&report.points)
        .map(|p| CalibrationPoint {
            responders: p.threads,
            median_ns: p.latency_ns.median,
            mean_ns: p.latency_ns.mean,
            p10_ns: p.latency_ns.p10,
            p90_ns: p.latency_ns.p90,
        })
        .collect();
    HostCalibration {
        preset: "host".into(),
        source: format!(
            "mmulab host shootdown: {}, {} page(s), {} reps per point, medians of the initiator latency",
            b.op, b.pages, b.reps
        ),
        op: b.op,
        pages: b.pages,
        reps: b.reps,
        baseline_ns: b.latency_ns.median,
        shootdown_fixed_ns: fit.map(|f| f.intercept_ns - b.latency_ns.median),
        per_responder_ns: fit.map(|f| f.slope_ns),
        fit,
        points,
        consistent: report.consistent(),
        environment: report.environment.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{point, sample_report};

    #[test]
    fn components_from_a_two_core_run() {
        let c = preset_components(&sample_report(vec![point(1, 9_000.0)]));
        assert_eq!(c.preset, "host");
        assert_eq!(c.baseline_ns, 1_000.0);
        let f = c.fit.unwrap();
        assert!((f.intercept_ns - 1_000.0).abs() < 1e-9 && (f.slope_ns - 8_000.0).abs() < 1e-9);
        assert!(c.shootdown_fixed_ns.unwrap().abs() < 1e-9);
        assert_eq!(c.points.len(), 2);
        assert_eq!(
            (c.points[0].responders, c.points[1].median_ns),
            (0, 9_000.0)
        );
        assert!(c.consistent);
    }

    #[test]
    fn components_from_a_many_core_run() {
        let pts = (1..=4)
            .map(|k| point(k, 20_000.0 + 3_000.0 * k as f64))
            .collect();
        let c = preset_components(&sample_report(pts));
        assert!((c.shootdown_fixed_ns.unwrap() - 19_000.0).abs() < 1e-6);
        assert!((c.per_responder_ns.unwrap() - 3_000.0).abs() < 1e-6);
    }

    #[test]
    fn no_responder_no_fit() {
        let c = preset_components(&sample_report(vec![]));
        assert!(c.fit.is_none() && c.shootdown_fixed_ns.is_none());
        assert_eq!(c.points.len(), 1);
    }

    #[test]
    fn serialises_to_toml_and_json_and_back() {
        let c = preset_components(&sample_report(vec![point(1, 9_000.0)]));
        let t = c.to_toml();
        assert!(t.contains("preset = \"host\""), "{t}");
        assert!(t.contains("[[points]]"), "{t}");
        let back: HostCalibration = toml::from_str(&t).unwrap();
        assert_eq!(back, c);
        let back: HostCalibration = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(back, c);
    }
}
