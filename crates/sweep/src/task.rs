//! Running one task and what it leaves: a record of tidy metrics (name,
//! value, unit) and the oracle's verdict. A record depends only on the
//! plan and the task (its `wall_s` aside), so any process on any machine
//! writes the same one.

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use mmulab_experiment::Results;
use serde::{Deserialize, Serialize};

use crate::plan::{Kind, Sweep, Task};

/// One metric of one task. Values are kept as the text the CSV shows
/// (integers as integers, floats in Rust's shortest round-trip form), so
/// that merging never re-formats a number.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metric(pub String, pub String, pub String);

impl Metric {
    pub fn name(&self) -> &str {
        &self.0
    }
    pub fn value(&self) -> &str {
        &self.1
    }
    pub fn unit(&self) -> &str {
        &self.2
    }
}

/// What a task left in a `parts/*.jsonl` file: one JSON line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task's index in the plan.
    pub task: usize,
    pub id: String,
    /// `consistent` or `inconsistent`.
    pub oracle: String,
    pub metrics: Vec<Metric>,
    /// The first violation, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The watchdog's report of a CPU spinning past its bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<String>,
    /// The task panicked (a simulator bug): the message. Such a record
    /// has no metrics and is run again by `--resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// The raw outcome, when the sweep names `raw` histograms (the paper
    /// reproductions read it; the merge does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<mmulab_experiment::sweep::Raw>,
    /// Host time the task took: for `sweep status`, never in results.
    pub wall_s: f64,
}

impl TaskRecord {
    /// Equal in everything that reaches the merged results.
    pub fn same_result(&self, o: &TaskRecord) -> bool {
        (
            self.task,
            &self.id,
            &self.oracle,
            &self.metrics,
            &self.note,
            &self.liveness,
            &self.failed,
            &self.raw,
        ) == (
            o.task,
            &o.id,
            &o.oracle,
            &o.metrics,
            &o.note,
            &o.liveness,
            &o.failed,
            &o.raw,
        )
    }
}

/// The unit a metric's name implies (`*_cycles`, `*_us`, `*_ns`).
fn unit_of(name: &str) -> &'static str {
    if name.ends_with("_cycles") {
        "cycles"
    } else if name.ends_with("_us") {
        "us"
    } else if name.ends_with("_ns") {
        "ns"
    } else {
        ""
    }
}

fn float(v: f64) -> String {
    // Debug is the shortest text that parses back to the same f64 (and
    // keeps a `.0` on whole numbers, so a float column reads as floats).
    format!("{v:?}")
}

struct Metrics {
    list: Vec<Metric>,
    seen: BTreeSet<String>,
}

impl Metrics {
    fn push(&mut self, name: String, value: String, unit: &str) {
        // Two metrics of one name would make the tidy table ambiguous.
        assert!(
            self.seen.insert(name.clone()),
            "metric `{name}` produced twice by one task"
        );
        self.list.push(Metric(name, value, unit.to_string()));
    }
    fn count(&mut self, name: &str, v: u64) {
        self.push(name.to_string(), v.to_string(), "count");
    }
}

/// The tidy metrics of one seed's results.
fn run_metrics(r: &Results) -> Vec<Metric> {
    let mut m = Metrics {
        list: Vec::new(),
        seen: BTreeSet::new(),
    };
    m.push(
        "simulated_cycles".into(),
        r.simulated_cycles.to_string(),
        "cycles",
    );
    m.count("oracle.violations", r.oracle.violations);
    m.count("oracle.checked_uses", r.oracle.checked_uses);
    m.count("oracle.stale_uses_in_window", r.oracle.stale_uses_in_window);
    m.count("oracle.use_after_free", r.oracle.use_after_free);
    m.count("liveness_failures", r.liveness.len() as u64);
    for (k, v) in &r.counters.0 {
        m.count(k, *v);
    }
    for (k, s) in &r.histograms {
        let unit = unit_of(k);
        m.push(format!("{k}.n"), s.n.to_string(), "count");
        for (stat, v) in [
            ("mean", s.mean),
            ("sd", s.sd),
            ("median", s.median),
            ("p10", s.p10),
            ("p90", s.p90),
            ("min", s.min),
            ("max", s.max),
        ] {
            m.push(format!("{k}.{stat}"), float(v), unit);
        }
    }
    for (k, v) in &r.workload.figures {
        m.push(format!("workload.{k}"), float(*v), unit_of(k));
    }
    m.list
}

/// The tidy metrics of a raw outcome whose figures and counters are the
/// whole result (a Mirage read-writers run: its throughput, simulated
/// length and counters; a swtlb trap pass: each setup's seconds, counting
/// cycles and misses by type).
fn raw_metrics(raw: &mmulab_experiment::sweep::Raw) -> Vec<Metric> {
    let mut m = Metrics {
        list: Vec::new(),
        seen: BTreeSet::new(),
    };
    for (k, v) in &raw.figures {
        let unit = match k.as_str() {
            "read_write_instr_per_s" => "instr/s",
            "simulated_s" => "s",
            k if k.ends_with("tlb_seconds") => "s",
            k => unit_of(k),
        };
        m.push(k.clone(), float(*v), unit);
    }
    for (k, v) in &raw.counters.0 {
        m.count(k, *v);
    }
    m.list
}

struct Outcome {
    oracle: String,
    metrics: Vec<Metric>,
    note: Option<String>,
    liveness: Option<String>,
    raw: Option<mmulab_experiment::sweep::Raw>,
}

fn run_one(sweep: &Sweep, task: Task) -> Outcome {
    match sweep.kind {
        Kind::Run => {
            let spec = sweep.points[task.point]
                .spec
                .as_ref()
                .expect("run sweeps validate a spec for every point");
            let out = mmulab_experiment::sweep::run_seed_of(sweep, task);
            let raw = sweep
                .raw
                .as_ref()
                .map(|h| mmulab_experiment::sweep::Raw::of(&out, h));
            // Wall time is zeroed: it lands in `host`, which no metric reads.
            let r = mmulab_experiment::run::merge(spec, vec![out], 0.0);
            let note = r.oracle.first.first().map(|v| {
                format!(
                    "{} thread {} used a stale translation of {:#x} at {} after `{}` by {}",
                    v.cpu, v.thread, v.va, v.time, v.op, v.op_cpu
                )
            });
            let liveness = r.liveness.first().map(|l| {
                format!(
                    "{} spun from {} to {} waiting for {}",
                    l.failure.cpu, l.failure.since, l.failure.at, l.failure.waiting_for
                )
            });
            Outcome {
                oracle: r.oracle.verdict.clone(),
                metrics: run_metrics(&r),
                note,
                liveness,
                raw,
            }
        }
        Kind::MirageReadWriters | Kind::SwtlbTrap => {
            // The same raw outcome the reproduction reads; a run past the
            // simulator's event bound (a livelock) panics into a failed
            // record, named by the merge.
            let raw =
                mmulab_experiment::sweep::raw_of(sweep, task).unwrap_or_else(|e| panic!("{e}"));
            Outcome {
                oracle: raw.verdict.clone(),
                metrics: raw_metrics(&raw),
                note: None,
                liveness: None,
                raw: sweep.raw.as_ref().map(|_| raw),
            }
        }
        Kind::Check => {
            let protocol = match sweep.points[task.point].values.get("protocol") {
                Some(toml::Value::String(p)) => p.clone(),
                _ => unreachable!("check sweeps validate `protocol` on every point"),
            };
            let r = mmulab_experiment::check::check_one(&protocol, task.seed);
            let mut m = Metrics {
                list: Vec::new(),
                seen: BTreeSet::new(),
            };
            m.count("violations", r.violations);
            m.count("lock_order_violations", r.lock_order);
            m.count("liveness_failures", u64::from(r.liveness.is_some()));
            m.count("timed_out", u64::from(r.timed_out));
            m.count("checked_uses", r.checked);
            m.count("shootdowns", r.shootdowns);
            let verdict = if r.violations == 0 {
                "consistent"
            } else {
                "inconsistent"
            };
            Outcome {
                oracle: verdict.to_string(),
                metrics: m.list,
                note: r.first,
                liveness: r.liveness,
                raw: None,
            }
        }
    }
}

/// Runs one task. A panic (a simulator bug) becomes a failed record, so
/// that one bad seed does not take the sweep's other tasks with it.
pub fn run_task(sweep: &Sweep, task: Task) -> TaskRecord {
    let t0 = Instant::now();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| run_one(sweep, task)));
    let wall_s = t0.elapsed().as_secs_f64();
    match outcome {
        Ok(o) => TaskRecord {
            task: task.index,
            id: task.id(),
            oracle: o.oracle,
            metrics: o.metrics,
            note: o.note,
            liveness: o.liveness,
            failed: None,
            raw: o.raw,
            wall_s,
        },
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into());
            TaskRecord {
                task: task.index,
                id: task.id(),
                oracle: String::new(),
                metrics: Vec::new(),
                note: None,
                liveness: None,
                failed: Some(msg),
                raw: None,
                wall_s,
            }
        }
    }
}
