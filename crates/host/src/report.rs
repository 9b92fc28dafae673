//! The results of a run (the JSON contract of `mmulab host shootdown
//! --json`), the least-squares fit over the responder counts, and the
//! human-readable table.

use crate::check::{Verdict, Violation};
use crate::environment::Environment;
use crate::interrupts::TlbCounts;
use crate::options::Op;
use mmulab_engine::{Histogram, LinearFit, Summary};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::Duration;

/// black89 §7.1, Fig. 2 (Encore Multimax, 16 × NS32332): "430 microseconds
/// for the first processor plus 55 microseconds for every additional
/// processor".
pub const BLACK89_INTERCEPT_US: f64 = 430.0;
pub const BLACK89_SLOPE_US: f64 = 55.0;

/// The outcome of one timed repetition (what the tester hands back).
#[derive(Clone, Debug)]
pub struct RepOutcome {
    /// The initiator's time in the operation.
    pub latency: Duration,
    /// TLB-shootdown interrupts taken per CPU during the operation (`None`:
    /// no `TLB` line in /proc/interrupts).
    pub tlb: Option<TlbCounts>,
    pub violation: Option<Violation>,
    /// Responders that had not faulted within the bound (mprotect/munmap):
    /// they were not running when the operation happened.
    pub missed_faults: usize,
}

/// The initiator's latency over the repetitions of a point, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyNs {
    pub median: f64,
    pub mean: f64,
    pub sd: f64,
    pub p10: f64,
    pub p90: f64,
}

impl From<Summary> for LatencyNs {
    fn from(s: Summary) -> LatencyNs {
        LatencyNs {
            median: s.median,
            mean: s.mean,
            sd: s.sd,
            p10: s.p10,
            p90: s.p90,
        }
    }
}

/// Violations kept per point (the count is always complete).
const VIOLATIONS_KEPT: usize = 5;

/// One point: a responder count (0 for the baseline).
///
/// The first six fields are the contract; the others add what a reader
/// needs to trust them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub threads: usize,
    pub op: Op,
    pub pages: usize,
    pub latency_ns: LatencyNs,
    /// TLB-shootdown interrupts taken on all CPUs during the timed
    /// operations of this point (summed over the repetitions); `null` when
    /// /proc/interrupts has no `TLB` line.
    pub tlb_interrupts: Option<u64>,
    pub verdict: Verdict,
    /// Timed repetitions.
    pub reps: usize,
    /// Repetitions whose check failed.
    pub inconsistent_reps: usize,
    /// Responder faults that did not come within the bound (the responder
    /// was not running when the operation happened; see README).
    pub missed_faults: usize,
    /// `tlb_interrupts` CPU by CPU.
    pub tlb_interrupts_per_cpu: Option<TlbCounts>,
    /// The first few failed checks, in words.
    pub violations: Vec<String>,
}

impl Point {
    /// Aggregates the repetitions of one point.
    pub fn from_outcomes(threads: usize, op: Op, pages: usize, outcomes: &[RepOutcome]) -> Point {
        let mut h = Histogram::new();
        let mut tlb: Option<TlbCounts> = Some(TlbCounts::default());
        let mut violations = Vec::new();
        let mut inconsistent_reps = 0;
        let mut missed_faults = 0;
        for (rep, o) in outcomes.iter().enumerate() {
            h.record(o.latency.as_nanos() as f64);
            match (&mut tlb, &o.tlb) {
                (Some(sum), Some(d)) => sum.accumulate(d),
                _ => tlb = None,
            }
            if let Some(v) = &o.violation {
                inconsistent_reps += 1;
                if violations.len() < VIOLATIONS_KEPT {
                    violations.push(format!("rep {rep}: {}", v.what));
                }
            }
            missed_faults += o.missed_faults;
        }
        let tlb = tlb.filter(|_| !outcomes.is_empty());
        Point {
            threads,
            op,
            pages,
            latency_ns: h.summary().into(),
            tlb_interrupts: tlb.as_ref().map(TlbCounts::total),
            verdict: if inconsistent_reps == 0 {
                Verdict::Consistent
            } else {
                Verdict::Inconsistent
            },
            reps: outcomes.len(),
            inconsistent_reps,
            missed_faults,
            tlb_interrupts_per_cpu: tlb,
            violations,
        }
    }
}

/// Which points the fit went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FitBasis {
    /// Two or more responder counts: the fit of black89 Fig. 2.
    Responders,
    /// A single responder count (a 2-core machine): the line through the
    /// baseline (0 responders) and that point. Exact, and an extrapolation
    /// for any other count.
    BaselineAndResponders,
}

/// The least-squares line of the initiator's median latency over the
/// number of responders: `intercept_ns + slope_ns · responders`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostFit {
    pub intercept_ns: f64,
    /// Per responder.
    pub slope_ns: f64,
    pub r2: f64,
    pub n: u64,
    pub basis: FitBasis,
    /// black89's line, for comparison: 430 µs + 55 µs per processor.
    pub black89_intercept_us: f64,
    pub black89_slope_us: f64,
}

impl HostFit {
    pub fn predict_ns(&self, responders: usize) -> f64 {
        self.intercept_ns + self.slope_ns * responders as f64
    }
}

/// Fits the medians over the responder counts (engine::LinearFit). With a
/// single responder count the baseline joins the fit; with none there is
/// no fit.
pub fn fit_points(points: &[Point], baseline: &Point) -> Option<HostFit> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.threads as f64, p.latency_ns.median))
        .collect();
    let distinct = {
        let mut xs: Vec<usize> = points.iter().map(|p| p.threads).collect();
        xs.sort_unstable();
        xs.dedup();
        xs.len()
    };
    let (fit, basis) = if distinct >= 2 {
        (LinearFit::fit(&pts)?, FitBasis::Responders)
    } else if distinct == 1 {
        let mut with_base = pts;
        with_base.push((0.0, baseline.latency_ns.median));
        (LinearFit::fit(&with_base)?, FitBasis::BaselineAndResponders)
    } else {
        return None;
    };
    Some(HostFit {
        intercept_ns: fit.intercept,
        slope_ns: fit.slope,
        r2: fit.r2,
        n: fit.n,
        basis,
        black89_intercept_us: BLACK89_INTERCEPT_US,
        black89_slope_us: BLACK89_SLOPE_US,
    })
}

/// The result of `mmulab host shootdown`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// One per responder count, ascending.
    pub points: Vec<Point>,
    /// 0 responders: no other thread touches the page.
    pub baseline: Point,
    pub fit: Option<HostFit>,
    pub environment: Environment,
    /// What the user must know to read the figures (threads that did not
    /// fit, missing TLB column, ...), in the order they arose.
    pub notes: Vec<String>,
}

impl HostReport {
    /// Every point, the baseline included, consistent.
    pub fn consistent(&self) -> bool {
        std::iter::once(&self.baseline)
            .chain(&self.points)
            .all(|p| p.verdict == Verdict::Consistent)
    }

    /// Pretty JSON, as `--json` prints it.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the report serialises")
    }
}

fn us(ns: f64) -> f64 {
    ns / 1000.0
}

/// The human-readable table: one row per point (the baseline first), the
/// fit beside black89's, the environment and the notes.
pub fn format_report(r: &HostReport) -> String {
    let mut s = String::new();
    let b = &r.baseline;
    let with_tlb =
        b.tlb_interrupts.is_some() || r.points.iter().any(|p| p.tlb_interrupts.is_some());
    let _ = writeln!(
        s,
        "mmulab host shootdown: black89 §5.1 tester, {} on {} page{}, {} timed reps per point; initiator latency in µs",
        b.op,
        b.pages,
        if b.pages == 1 { "" } else { "s" },
        b.reps
    );
    let _ = write!(
        s,
        "{:>9}  {:<8}  {:>5}  {:>9}  {:>17}  {:>8}  {:>8}",
        "threads", "op", "pages", "median", "mean ± sd", "p10", "p90"
    );
    if with_tlb {
        let _ = write!(s, "  {:>11}", "TLB IPIs/op");
    }
    let _ = writeln!(s, "  verdict");
    for (label, p) in std::iter::once(("0 (base)".to_string(), b))
        .chain(r.points.iter().map(|p| (p.threads.to_string(), p)))
    {
        let l = &p.latency_ns;
        let _ = write!(
            s,
            "{:>9}  {:<8}  {:>5}  {:>9.2}  {:>17}  {:>8.2}  {:>8.2}",
            label,
            p.op.name(),
            p.pages,
            us(l.median),
            format!("{:.2} ± {:.2}", us(l.mean), us(l.sd)),
            us(l.p10),
            us(l.p90),
        );
        if with_tlb {
            match p.tlb_interrupts {
                Some(n) if p.reps > 0 => {
                    let _ = write!(s, "  {:>11.2}", n as f64 / p.reps as f64);
                }
                _ => {
                    let _ = write!(s, "  {:>11}", "-");
                }
            }
        }
        let _ = write!(s, "  {}", p.verdict.name());
        if p.inconsistent_reps > 0 {
            let _ = write!(s, " ({} of {} reps)", p.inconsistent_reps, p.reps);
        }
        let _ = writeln!(s);
    }
    for p in std::iter::once(b).chain(&r.points) {
        for v in &p.violations {
            let _ = writeln!(s, "  ! {} responder(s): {v}", p.threads);
        }
    }
    let _ = writeln!(s);
    match &r.fit {
        Some(f) => {
            let basis = match f.basis {
                FitBasis::Responders => "least squares over the responder counts",
                FitBasis::BaselineAndResponders => {
                    "one responder count only: the line through the baseline and it"
                }
            };
            let _ = writeln!(
                s,
                "fit of the medians ({basis}): {:.2} µs + {:.2} µs per responder (r² {:.3})",
                us(f.intercept_ns),
                us(f.slope_ns),
                f.r2
            );
            let _ = writeln!(
                s,
                "black89 Fig. 2 (Encore Multimax, 1989):   {:.0} µs + {:.0} µs per processor",
                f.black89_intercept_us, f.black89_slope_us
            );
        }
        None => {
            let _ = writeln!(
                s,
                "no fit: no responder count was measured (black89 Fig. 2: {BLACK89_INTERCEPT_US:.0} µs + {BLACK89_SLOPE_US:.0} µs per processor)"
            );
        }
    }
    let _ = writeln!(s, "environment: {}", r.environment.summary_line());
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::environment::Environment;

    fn outcome(ns: u64, tlb: Option<u64>, bad: bool) -> RepOutcome {
        RepOutcome {
            latency: Duration::from_nanos(ns),
            tlb: tlb.map(|n| TlbCounts {
                cpus: vec![0, 1],
                counts: vec![0, n],
            }),
            violation: bad.then(|| Violation {
                responder: 0,
                what: "counter of responder 0 changed".into(),
            }),
            missed_faults: 0,
        }
    }

    pub(crate) fn point(threads: usize, median_ns: f64) -> Point {
        let mut p = Point::from_outcomes(
            threads,
            Op::Mprotect,
            1,
            &[outcome(median_ns as u64, Some(1), false)],
        );
        p.latency_ns.median = median_ns;
        p
    }

    pub(crate) fn sample_report(points: Vec<Point>) -> HostReport {
        let baseline = point(0, 1_000.0);
        HostReport {
            fit: fit_points(&points, &baseline),
            points,
            baseline,
            environment: Environment::unknown(),
            notes: vec!["a note".into()],
        }
    }

    #[test]
    fn aggregation_summarises_and_sums_interrupts() {
        let outs: Vec<_> = (1..=10)
            .map(|i| outcome(i * 1000, Some(1), false))
            .collect();
        let p = Point::from_outcomes(1, Op::Mprotect, 1, &outs);
        assert_eq!(p.latency_ns.median, 5500.0);
        assert_eq!(p.latency_ns.p10, 1000.0);
        assert_eq!(p.latency_ns.p90, 9000.0);
        assert_eq!(p.tlb_interrupts, Some(10));
        assert_eq!(p.tlb_interrupts_per_cpu.unwrap().counts, vec![0, 10]);
        assert_eq!(p.verdict, Verdict::Consistent);
    }

    #[test]
    fn one_bad_rep_makes_the_point_inconsistent() {
        let mut outs: Vec<_> = (0..9).map(|_| outcome(1000, Some(1), false)).collect();
        outs.push(outcome(1000, Some(1), true));
        let p = Point::from_outcomes(1, Op::Mprotect, 1, &outs);
        assert_eq!(p.verdict, Verdict::Inconsistent);
        assert_eq!(p.inconsistent_reps, 1);
        assert!(p.violations[0].starts_with("rep 9:"));
    }

    #[test]
    fn no_tlb_line_anywhere_gives_null() {
        let outs = [outcome(1000, None, false), outcome(1000, Some(1), false)];
        let p = Point::from_outcomes(1, Op::Mprotect, 1, &outs);
        assert_eq!(p.tlb_interrupts, None);
        let j = serde_json::to_value(&p).unwrap();
        assert!(j["tlb_interrupts"].is_null());
    }

    #[test]
    fn fit_recovers_intercept_and_slope_over_responders() {
        let pts: Vec<_> = (1..=12)
            .map(|k| point(k, 430_000.0 + 55_000.0 * k as f64))
            .collect();
        let f = fit_points(&pts, &point(0, 5_000.0)).unwrap();
        assert_eq!(f.basis, FitBasis::Responders);
        assert!((f.intercept_ns - 430_000.0).abs() < 1e-6);
        assert!((f.slope_ns - 55_000.0).abs() < 1e-6);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        assert_eq!(f.n, 12);
        assert!((f.predict_ns(3) - 595_000.0).abs() < 1e-6);
    }

    #[test]
    fn one_responder_count_fits_through_the_baseline() {
        let f = fit_points(&[point(1, 9_000.0)], &point(0, 1_000.0)).unwrap();
        assert_eq!(f.basis, FitBasis::BaselineAndResponders);
        assert!((f.intercept_ns - 1_000.0).abs() < 1e-9);
        assert!((f.slope_ns - 8_000.0).abs() < 1e-9);
        assert!(fit_points(&[], &point(0, 1_000.0)).is_none());
    }

    #[test]
    fn json_contract_keys_in_order() {
        let r = sample_report(vec![point(1, 9_000.0)]);
        let j = r.to_json();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        for k in ["points", "baseline", "fit", "environment"] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        let p = &v["points"][0];
        for k in [
            "threads",
            "op",
            "pages",
            "latency_ns",
            "tlb_interrupts",
            "verdict",
        ] {
            assert!(p.get(k).is_some(), "point lacks {k}");
        }
        for k in ["median", "mean", "sd", "p10", "p90"] {
            assert!(p["latency_ns"][k].is_number(), "latency_ns lacks {k}");
        }
        assert_eq!(p["op"], "mprotect");
        assert_eq!(p["verdict"], "consistent");
        assert_eq!(v["baseline"]["threads"], 0);
        // Key order of a point: the contract's, first.
        let at = |k: &str| j.find(&format!("\"{k}\"")).unwrap();
        assert!(
            at("threads") < at("op") && at("op") < at("pages") && at("pages") < at("latency_ns")
        );
        assert!(at("latency_ns") < at("tlb_interrupts") && at("tlb_interrupts") < at("verdict"));
        // Round trip.
        let back: HostReport = serde_json::from_str(&j).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn table_shows_every_column_and_black89() {
        let t = format_report(&sample_report(vec![point(1, 9_000.0)]));
        for want in [
            "threads",
            "median",
            "mean ± sd",
            "p10",
            "p90",
            "TLB IPIs/op",
            "verdict",
            "0 (base)",
            "consistent",
            "430 µs + 55 µs per processor",
            "1.00 µs + 8.00 µs per responder",
            "note: a note",
        ] {
            assert!(t.contains(want), "table lacks {want:?}:\n{t}");
        }
    }

    #[test]
    fn table_without_tlb_line_drops_the_column() {
        let mut r = sample_report(vec![point(1, 9_000.0)]);
        r.baseline.tlb_interrupts = None;
        r.points[0].tlb_interrupts = None;
        let t = format_report(&r);
        assert!(!t.contains("TLB IPIs"), "{t}");
    }

    #[test]
    fn table_shows_violations() {
        let mut r = sample_report(vec![point(1, 9_000.0)]);
        r.points[0].verdict = Verdict::Inconsistent;
        r.points[0].inconsistent_reps = 1;
        r.points[0].violations = vec!["rep 0: counter of responder 0 changed".into()];
        let t = format_report(&r);
        assert!(t.contains("inconsistent (1 of 1 reps)"), "{t}");
        assert!(t.contains("! 1 responder(s): rep 0: counter"), "{t}");
    }
}
