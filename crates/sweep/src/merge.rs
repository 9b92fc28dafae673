//! The merge: every task's record, in task order, into `results.csv`
//! (one row per task and metric) and `summary.csv` (per point and metric,
//! statistics over the seeds). It reads only the manifest and the part
//! files, so its bytes depend on the plan alone, never on which process,
//! thread or machine ran a task.

use std::collections::BTreeMap;

use mmulab_engine::stats::{percentile_sorted, t95};
use mmulab_experiment::check::{CheckReport, FailingSeed};

use crate::SweepError;
use crate::plan::Kind;
use crate::store::{Manifest, OutDir, Records, TaskStatus, write_atomic};
use crate::task::TaskRecord;

/// The oracle column of a task whose simulator has no translation oracle.
pub const NO_ORACLE: &str = "none";

/// What a merge wrote.
#[derive(Debug)]
pub struct Merged {
    pub tasks: usize,
    pub points: usize,
    pub results_rows: usize,
    pub summary_rows: usize,
    /// Tasks whose oracle verdict is not `consistent`.
    pub inconsistent: usize,
    /// Tasks of a simulator with no translation oracle (oracle `none`:
    /// uhlig94's software-TLB passes count misses and check nothing).
    pub unchecked: usize,
    /// Tasks whose watchdog reported a liveness failure.
    pub liveness_failures: usize,
    /// The first inconsistent task: its id and first violation.
    pub first_inconsistent: Option<(String, String)>,
    /// Check sweeps: `mmulab check`'s report for each point (protocol).
    pub check: Vec<CheckReport>,
}

fn csv_err(path: &std::path::Path) -> impl Fn(csv::Error) -> SweepError + '_ {
    move |e| SweepError::Io {
        path: path.display().to_string(),
        err: std::io::Error::other(e),
    }
}

/// The command that replays one task.
pub fn replay(m: &Manifest, dir: &OutDir, task: usize) -> String {
    let t = &m.tasks[task];
    let p = &m.points[t.point];
    match m.kind {
        Kind::Run => {
            let mut s = format!("mmulab run {}", dir.path.join("base.toml").display());
            for set in &p.set {
                s.push_str(&format!(" --set '{set}'"));
            }
            s.push_str(&format!(" --set seed={} --set runs=1", t.seed));
            s
        }
        Kind::MirageReadWriters | Kind::SwtlbTrap => format!(
            "mmulab sweep {} --out DIR (a sweep of this point alone: {}, seeds = {{ start = {}, count = 1 }})",
            dir.path.join("sweep.toml").display(),
            p.set.join(", "),
            t.seed
        ),
        Kind::Check => format!(
            "mmulab check --protocol {} --start {} --seeds 1",
            p.values.get("protocol").map_or("?", String::as_str),
            t.seed
        ),
    }
}

/// Updates the manifest's per-task status from the part files.
pub fn refresh_status(m: &mut Manifest, r: &Records) {
    for (i, t) in m.tasks.iter_mut().enumerate() {
        t.status = if r.done.contains_key(&i) {
            TaskStatus::Done
        } else if r.failed.contains_key(&i) {
            TaskStatus::Failed
        } else {
            TaskStatus::Pending
        };
    }
}

/// Merges a folder whose every task is done.
pub fn merge(dir: &OutDir) -> Result<Merged, SweepError> {
    let mut m = dir.manifest()?;
    let records = dir.records(&m)?;
    refresh_status(&mut m, &records);
    dir.write_manifest(&m)?;
    if let Some((&i, r)) = records.failed.iter().next() {
        return Err(SweepError::TasksFailed(format!(
            "{} task(s) panicked; the first, {}: {}\n  replay: {}",
            records.failed.len(),
            r.id,
            r.failed.as_deref().unwrap_or(""),
            replay(&m, dir, i)
        )));
    }
    let pending = m.tasks.len() - records.done.len();
    if pending > 0 {
        let first = (0..m.tasks.len())
            .find(|i| !records.done.contains_key(i))
            .expect("some task is pending");
        return Err(SweepError::Incomplete(format!(
            "{pending} of {} tasks are not done (the first: {}); finish them with `mmulab sweep {}/sweep.toml --out {} --resume`",
            m.tasks.len(),
            m.tasks[first].id,
            dir.path.display(),
            dir.path.display()
        )));
    }
    let tasks: Vec<&TaskRecord> = (0..m.tasks.len()).map(|i| &records.done[&i]).collect();

    let results_path = dir.path.join("results.csv");
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header = m.columns.clone();
    header.extend(["seed", "metric", "value", "unit", "oracle"].map(String::from));
    w.write_record(&header).map_err(csv_err(&results_path))?;
    let mut results_rows = 0;
    for (i, r) in tasks.iter().enumerate() {
        let t = &m.tasks[i];
        let p = &m.points[t.point];
        let seed = t.seed.to_string();
        for metric in &r.metrics {
            let mut row: Vec<&str> = m.columns.iter().map(|c| p.values[c].as_str()).collect();
            row.extend([
                seed.as_str(),
                metric.name(),
                metric.value(),
                metric.unit(),
                r.oracle.as_str(),
            ]);
            w.write_record(&row).map_err(csv_err(&results_path))?;
            results_rows += 1;
        }
    }
    let bytes = w.into_inner().expect("writing to memory");
    write_atomic(&results_path, &bytes)?;

    let summary_path = dir.path.join("summary.csv");
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header = m.columns.clone();
    header.extend(
        [
            "metric",
            "unit",
            "n",
            "mean",
            "sd",
            "ci95_low",
            "ci95_high",
            "median",
            "p5",
            "p10",
            "p25",
            "p75",
            "p90",
            "p95",
            "min",
            "max",
            "oracle",
        ]
        .map(String::from),
    );
    w.write_record(&header).map_err(csv_err(&summary_path))?;
    let mut summary_rows = 0;
    let per_point = m.seeds.count as usize;
    for (pi, p) in m.points.iter().enumerate() {
        let seeds = &tasks[pi * per_point..(pi + 1) * per_point];
        debug_assert!(seeds.iter().all(|r| m.tasks[r.task].point == pi));
        let verdict = if seeds.iter().any(|r| r.oracle == "inconsistent") {
            "inconsistent"
        } else if seeds.iter().all(|r| r.oracle == "consistent") {
            "consistent"
        } else {
            NO_ORACLE
        };
        let mut by_metric: BTreeMap<&str, (&str, Vec<f64>)> = BTreeMap::new();
        for r in seeds {
            for metric in &r.metrics {
                let e = by_metric
                    .entry(metric.name())
                    .or_insert((metric.unit(), Vec::new()));
                if e.0 != metric.unit() {
                    return Err(SweepError::Invalid(format!(
                        "metric {} has unit `{}` in one seed and `{}` in {}",
                        metric.name(),
                        e.0,
                        metric.unit(),
                        r.id
                    )));
                }
                let v: f64 = metric.value().parse().map_err(|_| {
                    SweepError::Invalid(format!(
                        "{}: metric {} has value `{}`, not a number",
                        r.id,
                        metric.name(),
                        metric.value()
                    ))
                })?;
                if v.is_finite() {
                    e.1.push(v);
                }
            }
        }
        for (name, (unit, mut values)) in by_metric {
            if unit == "count" {
                // A counter that never fired is absent from a seed's
                // record: it counted zero there.
                values.resize(seeds.len(), 0.0);
            }
            let s = Moments::of(&values);
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let pct = |q: f64| percentile_sorted(&sorted, q);
            let median = match sorted.len() {
                0 => 0.0,
                n if n % 2 == 1 => sorted[n / 2],
                n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
            };
            let mut row: Vec<String> = m.columns.iter().map(|c| p.values[c].clone()).collect();
            row.push(name.to_string());
            row.push(unit.to_string());
            row.push(values.len().to_string());
            for v in [
                s.mean,
                s.sd,
                s.ci95.0,
                s.ci95.1,
                median,
                pct(5.0),
                pct(10.0),
                pct(25.0),
                pct(75.0),
                pct(90.0),
                pct(95.0),
                sorted.first().copied().unwrap_or(0.0),
                sorted.last().copied().unwrap_or(0.0),
            ] {
                // No finite sample: no statistic (an empty cell, not a 0).
                row.push(if values.is_empty() {
                    String::new()
                } else {
                    format!("{v:?}")
                });
            }
            row.push(verdict.to_string());
            w.write_record(&row).map_err(csv_err(&summary_path))?;
            summary_rows += 1;
        }
    }
    let bytes = w.into_inner().expect("writing to memory");
    write_atomic(&summary_path, &bytes)?;

    let inconsistent: Vec<&&TaskRecord> = tasks
        .iter()
        .filter(|r| r.oracle != "consistent" && r.oracle != NO_ORACLE)
        .collect();
    let check = if m.kind == Kind::Check {
        check_reports(&m, dir, &tasks)
    } else {
        Vec::new()
    };
    Ok(Merged {
        tasks: tasks.len(),
        points: m.points.len(),
        results_rows,
        summary_rows,
        inconsistent: inconsistent.len(),
        unchecked: tasks.iter().filter(|r| r.oracle == NO_ORACLE).count(),
        liveness_failures: tasks.iter().filter(|r| r.liveness.is_some()).count(),
        first_inconsistent: inconsistent
            .first()
            .map(|r| (r.id.clone(), r.note.clone().unwrap_or_default())),
        check,
    })
}

/// Mean, sample sd and the t-based 95 % interval of the mean. Sums are
/// taken about the first value, so that seeds that all agree give that
/// value exactly and an sd of 0 (a plain sum/n leaves rounding noise).
struct Moments {
    mean: f64,
    sd: f64,
    ci95: (f64, f64),
}

impl Moments {
    fn of(v: &[f64]) -> Moments {
        let Some(&shift) = v.first() else {
            return Moments {
                mean: 0.0,
                sd: 0.0,
                ci95: (0.0, 0.0),
            };
        };
        let n = v.len() as f64;
        let mean = shift + v.iter().map(|x| x - shift).sum::<f64>() / n;
        if v.len() < 2 {
            return Moments {
                mean,
                sd: 0.0,
                ci95: (mean, mean),
            };
        }
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let half = t95(v.len() - 1) * sd / n.sqrt();
        Moments {
            mean,
            sd,
            ci95: (mean - half, mean + half),
        }
    }
}

/// `mmulab check`'s report, one per protocol of a check sweep.
fn check_reports(m: &Manifest, dir: &OutDir, tasks: &[&TaskRecord]) -> Vec<CheckReport> {
    let per_point = m.seeds.count as usize;
    m.points
        .iter()
        .enumerate()
        .map(|(pi, p)| {
            let seeds = &tasks[pi * per_point..(pi + 1) * per_point];
            let get = |r: &TaskRecord, name: &str| -> u64 {
                r.metrics
                    .iter()
                    .find(|x| x.name() == name)
                    .and_then(|x| x.value().parse().ok())
                    .unwrap_or(0)
            };
            let sum = |name: &str| seeds.iter().map(|r| get(r, name)).sum::<u64>();
            let first = seeds
                .iter()
                .find(|r| get(r, "violations") > 0 || r.liveness.is_some())
                .map(|r| FailingSeed {
                    seed: m.tasks[r.task].seed,
                    violations: get(r, "violations"),
                    liveness: r.liveness.clone(),
                    first_violation: r.note.clone(),
                    replay: replay(m, dir, r.task),
                });
            CheckReport {
                protocol: p.values.get("protocol").cloned().unwrap_or_default(),
                seeds: m.seeds.count,
                start: m.seeds.start,
                violations: sum("violations"),
                lock_order_violations: sum("lock_order_violations"),
                seeds_with_violations: seeds.iter().filter(|r| get(r, "violations") > 0).count()
                    as u64,
                liveness_failures: sum("liveness_failures"),
                timeouts: sum("timed_out"),
                checked_uses: sum("checked_uses"),
                shootdowns: sum("shootdowns"),
                first_failing: first,
                // The tasks' own time, summed: a merge has no one wall clock.
                wall_s: seeds.iter().map(|r| r.wall_s).sum(),
                // A merge covers every task of the sweep.
                interrupted: false,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Moments;

    #[test]
    fn equal_seeds_give_their_value_and_no_spread() {
        // Regression: sum/n gave 430.26666666666654 ± 1.2e-13 for twenty
        // seeds of 430.26666666666665.
        let v = vec![430.266_666_666_666_65; 20];
        let m = Moments::of(&v);
        assert_eq!(m.mean, v[0]);
        assert_eq!(m.sd, 0.0);
        assert_eq!(m.ci95, (v[0], v[0]));
    }

    #[test]
    fn moments_match_the_textbook_values() {
        let m = Moments::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m.mean, 5.0);
        assert!((m.sd - 2.138_089_935).abs() < 1e-9, "{}", m.sd);
        // t(7) = 2.36
        let half = 2.36 * m.sd / 8f64.sqrt();
        assert!((m.ci95.0 - (5.0 - half)).abs() < 1e-12);
    }
}
