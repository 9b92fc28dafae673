//! Statistics: named counters, histograms (sample summaries) and
//! least-squares line fits. Summaries are computed from the full sample, so
//! percentiles are exact (nearest-rank on the sorted sample).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Named event counters. A `BTreeMap` so that iteration order, and hence
/// results output, is deterministic.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Counters(pub BTreeMap<String, u64>);

impl Counters {
    pub fn add(&mut self, name: &str, n: u64) {
        if let Some(v) = self.0.get_mut(name) {
            *v += n;
        } else {
            self.0.insert(name.to_string(), n);
        }
    }
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
    pub fn merge(&mut self, other: &Counters) {
        for (k, v) in &other.0 {
            self.add(k, *v);
        }
    }
}

/// A sample of values (cycles, µs, ns — the name of the histogram says which).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Histogram {
    samples: Vec<f64>,
}

/// What every histogram reports.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub n: u64,
    pub mean: f64,
    pub sd: f64,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
}

impl Histogram {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn record(&mut self, v: f64) {
        debug_assert!(v.is_finite(), "non-finite sample {v}");
        self.samples.push(v);
    }
    pub fn len(&self) -> usize {
        self.samples.len()
    }
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
    pub fn samples(&self) -> &[f64] {
        &self.samples
    }
    pub fn extend(&mut self, other: &Histogram) {
        self.samples.extend_from_slice(&other.samples);
    }
    pub fn summary(&self) -> Summary {
        summarize(&self.samples)
    }
}

/// Percentile by nearest rank on a sorted slice (p in 0..=100).
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(samples: &[f64]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    // Sample standard deviation (n - 1), as the papers' "mean ± sd" tables.
    let sd = if samples.len() > 1 {
        (samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = if sorted.len() % 2 == 1 {
        sorted[sorted.len() / 2]
    } else {
        (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
    };
    Summary {
        n: samples.len() as u64,
        mean,
        sd,
        median,
        p10: percentile_sorted(&sorted, 10.0),
        p90: percentile_sorted(&sorted, 90.0),
        min: sorted[0],
        max: sorted[sorted.len() - 1],
    }
}

/// Two-sided 95 % Student's t quantile for `df` degrees of freedom (the
/// standard table; exact to two decimals up to 30, then the normal limit).
pub fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13,
        2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04,
    ];
    assert!(df >= 1, "a t quantile needs at least one degree of freedom");
    match df {
        1..=30 => T[df - 1],
        31..=60 => 2.00,
        61..=120 => 1.98,
        _ => 1.96,
    }
}

/// The mean of `samples` and its 95 % confidence interval `(mean, low,
/// high)`; with fewer than two samples the interval is the mean itself.
pub fn mean_ci95(samples: &[f64]) -> (f64, f64, f64) {
    let s = summarize(samples);
    if samples.len() < 2 {
        return (s.mean, s.mean, s.mean);
    }
    let half = t95(samples.len() - 1) * s.sd / (samples.len() as f64).sqrt();
    (s.mean, s.mean - half, s.mean + half)
}

/// A least-squares line y = intercept + slope·x.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LinearFit {
    pub intercept: f64,
    pub slope: f64,
    pub r2: f64,
    pub n: u64,
}

impl LinearFit {
    /// Fits over the points; `None` with fewer than two distinct x values.
    pub fn fit(points: &[(f64, f64)]) -> Option<LinearFit> {
        let n = points.len() as f64;
        if points.len() < 2 {
            return None;
        }
        let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        if sxx == 0.0 {
            return None;
        }
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
        let slope = sxy / sxx;
        let intercept = my - slope * mx;
        let r2 = if syy == 0.0 {
            1.0
        } else {
            (sxy * sxy) / (sxx * syy)
        };
        Some(LinearFit {
            intercept,
            slope,
            r2,
            n: points.len() as u64,
        })
    }

    pub fn at(&self, x: f64) -> f64 {
        self.intercept + self.slope * x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_line_is_recovered() {
        let pts: Vec<_> = (1..=12)
            .map(|x| (x as f64, 430.0 + 55.0 * x as f64))
            .collect();
        let f = LinearFit::fit(&pts).unwrap();
        assert!((f.intercept - 430.0).abs() < 1e-9);
        assert!((f.slope - 55.0).abs() < 1e-9);
        assert!((f.r2 - 1.0).abs() < 1e-12);
    }

    #[test]
    fn noisy_line_has_r2_below_one() {
        let pts = [(1.0, 1.0), (2.0, 3.0), (3.0, 2.0), (4.0, 5.0)];
        let f = LinearFit::fit(&pts).unwrap();
        assert!(f.r2 < 1.0 && f.r2 > 0.0);
        assert!((f.slope - 1.1).abs() < 1e-9);
    }

    #[test]
    fn one_x_value_has_no_fit() {
        assert!(LinearFit::fit(&[(1.0, 2.0), (1.0, 3.0)]).is_none());
    }

    #[test]
    fn summary_of_known_sample() {
        let (m, lo, hi) = mean_ci95(&[1.0, 2.0, 3.0]);
        // sd 1, n 3: 4.30 / sqrt(3) = 2.483.
        assert!(
            (m - 2.0).abs() < 1e-12
                && (hi - m - 2.4826).abs() < 1e-3
                && (m - lo - 2.4826).abs() < 1e-3
        );
        assert_eq!(mean_ci95(&[5.0]), (5.0, 5.0, 5.0));
        let s = summarize(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        assert_eq!(s.median, 5.5);
        assert_eq!(s.p10, 1.0);
        assert_eq!(s.p90, 9.0);
        assert!((s.mean - 5.5).abs() < 1e-12);
        assert!((s.sd - 3.0276503540974917).abs() < 1e-12);
    }

    #[test]
    fn counters_merge() {
        let mut a = Counters::default();
        a.add("x", 2);
        let mut b = Counters::default();
        b.add("x", 3);
        b.add("y", 1);
        a.merge(&b);
        assert_eq!(a.get("x"), 5);
        assert_eq!(a.get("y"), 1);
    }
}
