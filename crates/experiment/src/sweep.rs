//! Sweep files and the plan they expand to: points (a `--set` value for
//! each key) crossed with seeds, one task per (point, seed).
//!
//! ```toml
//! base = "black89/fig2.toml"          # a spec file, or an embedded experiment
//! seeds = { start = 1, count = 20 }
//! chunk = 20                          # tasks per Slurm array task (optional)
//! [grid]                              # the cartesian product of these lists
//! protocol = ["mach", "svr42", "global"]
//! [[point]]                           # explicit points, each crossed with the grid
//! "machine.cpus" = 4
//! "workload.children" = 3
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

use crate::Spec;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use toml::Value;

/// Why a sweep file could not be read or expanded: bad input (a key, a
/// value, a base that is not there) or a file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot read or write {path}: {err}")]
    Io { path: String, err: std::io::Error },
}

fn invalid(s: impl Into<String>) -> PlanError {
    PlanError::Invalid(s.into())
}

/// The most tasks one sweep may hold: a typo in `seeds.count` should be
/// an error, not a manifest of billions of lines.
pub const MAX_TASKS: u64 = 10_000_000;

/// The default `chunk` of a `check` sweep: an array task of 1,000 seeds
/// runs for seconds, far above Slurm's start-up cost per task.
pub const CHECK_CHUNK: u64 = 1000;

/// Keys no grid may set: each task runs exactly one seed, drawn from
/// `seeds`.
const RESERVED: [(&str, &str); 2] = [
    (
        "seed",
        "the seeds come from `seeds = { start, count }`, one task each",
    ),
    ("runs", "each task runs one seed; use `seeds.count`"),
];

/// What each task runs: which simulator, and how a point's keys reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// One seed of the base spec with the point's `--set` values (the
    /// multiprocessor simulator: `mmulab run`'s specs).
    Run,
    /// One seed of `mmulab check`'s swarm (every parameter drawn from the
    /// seed) under the point's protocol: the only key is `protocol`.
    Check,
    /// One run of fleisch89 §8's two conflicting read-writers on the
    /// Mirage simulator (`mmulab_mirage::spec::ReadWritersRun`): the base
    /// is a Fig. 8 spec (`fleisch89/paper-data/fig8.toml`), a point sets
    /// `delta_ticks` and may set `loop_s`, `stagger_s`,
    /// `third_site_library` and `preset`; the seed draws the processes'
    /// start phases.
    #[serde(rename = "mirage-read-writers")]
    MirageReadWriters,
    /// One trap-driven pass of uhlig94's software-managed TLB simulator
    /// (`crate::reproduce::uhlig94::TrapRun`): the base is
    /// `uhlig94/paper-data/shape.toml` (OS models, stand-ins), a point
    /// sets `os` and `workload` and may set `lower` (the pass's partition
    /// points); the seed draws the stand-in's references.
    #[serde(rename = "swtlb-trap")]
    SwtlbTrap,
}

impl Kind {
    /// The name a sweep file's `kind` gives it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::Check => "check",
            Kind::MirageReadWriters => "mirage-read-writers",
            Kind::SwtlbTrap => "swtlb-trap",
        }
    }

    /// Whether a task runs a base spec (every kind but `check`).
    pub fn has_base(self) -> bool {
        self != Kind::Check
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seeds {
    pub start: u64,
    pub count: u64,
}

/// A sweep file as written.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base: Option<String>,
    #[serde(default = "default_kind")]
    kind: Kind,
    seeds: Seeds,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunk: Option<u64>,
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    grid: toml::Table,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    point: Vec<toml::Table>,
    /// Keep each task's raw outcome in its record (counters, the
    /// workload's figures, and the samples of the histograms named here):
    /// what the paper reproductions compute their rows from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    raw: Option<Vec<String>>,
    /// What `--quick` changes: `seeds`, `chunk`, grid lists (replaced or
    /// added, key by key) and the `[[quick.point]]` list (replacing
    /// `[[point]]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quick: Option<Quick>,
}

/// A sweep file's `[quick]` table.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Quick {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seeds: Option<Seeds>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunk: Option<u64>,
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    grid: toml::Table,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    point: Option<Vec<toml::Table>>,
}

fn default_kind() -> Kind {
    Kind::Run
}

/// The base spec, as read.
#[derive(Clone, Debug)]
pub struct Base {
    /// Where it came from (a path, or `experiments/NAME.toml` embedded).
    pub origin: String,
    pub text: String,
    pub sha256: String,
}

/// One point of the grid: a value for each of its keys.
#[derive(Clone, Debug)]
pub struct Point {
    pub values: BTreeMap<String, Value>,
    /// The validated spec (run sweeps; `None` for the other kinds).
    pub spec: Option<Spec>,
    /// The validated run (`mirage-read-writers` sweeps; `None` for the
    /// other kinds).
    pub read_writers: Option<mmulab_mirage::spec::ReadWritersRun>,
    /// The validated pass (`swtlb-trap` sweeps; `None` for the other
    /// kinds).
    pub trap: Option<crate::reproduce::uhlig94::TrapRun>,
}

impl Point {
    /// The point's values as `--set` arguments.
    pub fn sets(&self) -> Vec<String> {
        self.values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }

    /// How a value appears in a CSV column: strings bare, the rest as
    /// TOML writes them; empty when the point does not set the key.
    pub fn column(&self, key: &str) -> String {
        match self.values.get(key) {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        }
    }
}

/// One (point, seed) pair. Its index in the plan is its identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    pub index: usize,
    pub point: usize,
    pub seed: u64,
}

impl Task {
    /// The stable id: `p<point>-s<seed>`.
    pub fn id(&self) -> String {
        format!("p{}-s{}", self.point, self.seed)
    }
}

/// A validated sweep: every point's spec has been built, so no task can
/// fail on its input.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub kind: Kind,
    pub base: Option<Base>,
    /// The CSV's key columns: every key any point sets, sorted.
    pub columns: Vec<String>,
    pub points: Vec<Point>,
    pub seeds: Seeds,
    /// Tasks per Slurm array task.
    pub chunk: u64,
    /// Records keep each task's raw outcome, with the samples of these
    /// histograms (`raw = [...]`).
    pub raw: Option<Vec<String>>,
    /// The hash of the expanded plan (base text, points, seeds, chunk):
    /// two files that expand to the same tasks hash the same.
    pub sha256: String,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Flattens nested tables into dotted keys (`[grid.machine] cpus = […]`
/// is `"machine.cpus" = […]`).
fn flatten(
    prefix: &str,
    table: &toml::Table,
    out: &mut BTreeMap<String, Value>,
    what: &str,
) -> Result<(), PlanError> {
    for (k, v) in table {
        if k.is_empty() || k.split('.').any(str::is_empty) {
            return Err(invalid(format!("{what}: empty key component in `{k}`")));
        }
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(t) => flatten(&key, t, out, what)?,
            v => {
                if out.insert(key.clone(), v.clone()).is_some() {
                    return Err(invalid(format!("{what}: `{key}` is set twice")));
                }
            }
        }
    }
    Ok(())
}

/// A value a `--set` can carry and a CSV cell can show.
fn check_value(what: &str, key: &str, v: &Value) -> Result<(), PlanError> {
    let bad = match v {
        Value::Table(_) => true,
        Value::Array(a) => a.iter().any(|x| matches!(x, Value::Table(_))),
        _ => false,
    };
    if bad {
        return Err(invalid(format!(
            "{what}.{key}: a table value; set its keys one by one (\"{key}.NAME\")"
        )));
    }
    Ok(())
}

impl Sweep {
    /// Loads a sweep file. `base` is looked for beside the sweep file,
    /// then in the working folder, then among the embedded experiments.
    pub fn load(path: &Path) -> Result<Sweep, PlanError> {
        Sweep::load_quick(path, false)
    }

    /// [`Sweep::load`], with the file's `[quick]` table applied when
    /// `quick` is set (`mmulab sweep --quick`, `mmulab reproduce --quick`).
    pub fn load_quick(path: &Path, quick: bool) -> Result<Sweep, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|err| PlanError::Io {
            path: path.display().to_string(),
            err,
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let origin = path.display().to_string();
        Sweep::parse_with(&text, &origin, quick, &|name| read_base(name, dir, &origin))
    }

    /// Parses sweep text; `origin` names it in errors, `dir` is where a
    /// relative `base` is looked for first.
    pub fn parse(text: &str, origin: &str, dir: &Path) -> Result<Sweep, PlanError> {
        Sweep::parse_with(text, origin, false, &|name| read_base(name, dir, origin))
    }

    /// Parses sweep text, reading its `base` with `read_base` (the
    /// reproductions read it from their experiments folder); `quick`
    /// applies the `[quick]` table.
    pub fn parse_with(
        text: &str,
        origin: &str,
        quick: bool,
        read_base: &dyn Fn(&str) -> Result<Base, PlanError>,
    ) -> Result<Sweep, PlanError> {
        let file: SweepFile = toml::from_str(text)
            .map_err(|e| invalid(format!("{origin}: {}", e.to_string().trim())))?;
        let SweepFile {
            base,
            kind,
            mut seeds,
            mut chunk,
            mut grid,
            mut point,
            raw,
            quick: quick_table,
        } = file;
        if let (true, Some(q)) = (quick, quick_table) {
            seeds = q.seeds.unwrap_or(seeds);
            chunk = q.chunk.or(chunk);
            if let Some(p) = q.point {
                point = p;
            }
            // Key by key: a quick list replaces the grid's list of the
            // same (dotted) key, or adds one.
            let mut flat = BTreeMap::new();
            flatten("", &q.grid, &mut flat, "quick.grid")
                .map_err(|e| invalid(format!("{origin}: {e}")))?;
            let mut full = BTreeMap::new();
            flatten("", &grid, &mut full, "grid").map_err(|e| invalid(format!("{origin}: {e}")))?;
            full.extend(flat);
            grid = full.into_iter().collect();
        }
        if seeds.count == 0 {
            return Err(invalid(format!(
                "{origin}: seeds.count: must be at least 1"
            )));
        }
        if seeds.start.checked_add(seeds.count).is_none() {
            return Err(invalid(format!(
                "{origin}: seeds: start {} + count {} overflows",
                seeds.start, seeds.count
            )));
        }
        if chunk == Some(0) {
            return Err(invalid(format!("{origin}: chunk: must be at least 1")));
        }

        // The grid's keys and lists, and the explicit points.
        let mut flat = BTreeMap::new();
        flatten("", &grid, &mut flat, "grid")?;
        let mut lists: Vec<(String, Vec<Value>)> = Vec::new();
        for (k, v) in flat {
            let Value::Array(values) = v else {
                return Err(invalid(format!(
                    "{origin}: grid.{k}: expected a list of values, got a {}",
                    v.type_str()
                )));
            };
            if values.is_empty() {
                return Err(invalid(format!("{origin}: grid.{k}: an empty list")));
            }
            for v in &values {
                check_value("grid", &k, v)?;
            }
            lists.push((k, values));
        }
        let mut explicit = Vec::new();
        for (i, t) in point.iter().enumerate() {
            let mut p = BTreeMap::new();
            flatten("", t, &mut p, &format!("point {i}"))?;
            for (k, v) in &p {
                check_value(&format!("point {i}"), k, v)?;
                if lists.iter().any(|(g, _)| g == k) {
                    return Err(invalid(format!(
                        "{origin}: point {i} and the grid both set `{k}`"
                    )));
                }
            }
            explicit.push(p);
        }
        if explicit.is_empty() {
            explicit.push(BTreeMap::new());
        }
        let keys: BTreeSet<&String> = lists
            .iter()
            .map(|(k, _)| k)
            .chain(explicit.iter().flat_map(|p| p.keys()))
            .collect();
        for k in &keys {
            if let Some((_, why)) = RESERVED.iter().find(|(r, _)| r == k) {
                return Err(invalid(format!("{origin}: `{k}` cannot be swept: {why}")));
            }
            if kind == Kind::Check && k.as_str() != "protocol" {
                return Err(invalid(format!(
                    "{origin}: `{k}`: a check sweep draws every parameter but `protocol` from the seed"
                )));
            }
        }
        let columns: Vec<String> = keys.into_iter().cloned().collect();

        // Every explicit point crossed with the grid, the grid's first key
        // slowest.
        let combos: u64 = lists.iter().map(|(_, v)| v.len() as u64).product();
        let n_points = combos.saturating_mul(explicit.len() as u64);
        let tasks = n_points.saturating_mul(seeds.count);
        if tasks > MAX_TASKS {
            return Err(invalid(format!(
                "{origin}: {n_points} points x {} seeds = {tasks} tasks, more than {MAX_TASKS}",
                seeds.count
            )));
        }
        let mut values = Vec::with_capacity(n_points as usize);
        for p in &explicit {
            for c in 0..combos {
                let mut v = p.clone();
                let mut rest = c;
                for (k, list) in lists.iter().rev() {
                    let n = list.len() as u64;
                    v.insert(k.clone(), list[(rest % n) as usize].clone());
                    rest /= n;
                }
                values.push(v);
            }
        }
        let mut seen = BTreeMap::new();
        for (i, v) in values.iter().enumerate() {
            let shown = Value::Table(v.clone().into_iter().collect()).to_string();
            if let Some(j) = seen.insert(shown.clone(), i) {
                return Err(invalid(format!(
                    "{origin}: points {j} and {i} are the same ({})",
                    shown.trim().replace('\n', ", ")
                )));
            }
        }

        let base = match (kind, base) {
            (Kind::Check, Some(_)) => {
                return Err(invalid(format!(
                    "{origin}: base: a check sweep draws its specs from the seed; remove `base`"
                )));
            }
            (Kind::Check, None) => None,
            (Kind::Run, None) => {
                return Err(invalid(format!(
                    "{origin}: base: missing (a spec file, or an embedded experiment such as \"black89/fig2\")"
                )));
            }
            (Kind::MirageReadWriters, None) => {
                return Err(invalid(format!(
                    "{origin}: base: missing (a Fig. 8 spec, such as \"fleisch89/paper-data/fig8.toml\")"
                )));
            }
            (Kind::SwtlbTrap, None) => {
                return Err(invalid(format!(
                    "{origin}: base: missing (uhlig94's stand-ins and OS models, \"uhlig94/paper-data/shape.toml\")"
                )));
            }
            (_, Some(b)) => Some(read_base(&b)?),
        };

        // Validate every point before any task runs.
        let mut points = Vec::with_capacity(values.len());
        for (i, v) in values.into_iter().enumerate() {
            let mut point = Point {
                values: v,
                spec: None,
                read_writers: None,
                trap: None,
            };
            match (&base, kind) {
                (Some(b), Kind::SwtlbTrap) => {
                    let run =
                        crate::reproduce::uhlig94::TrapRun::of(&b.origin, &b.text, &point.values)
                            .map_err(|e| {
                            invalid(format!(
                                "{origin}: point {i} ({}): {e}",
                                point.sets().join(", ")
                            ))
                        })?;
                    point.trap = Some(run);
                }
                (Some(b), Kind::MirageReadWriters) => {
                    let run =
                        mmulab_mirage::spec::ReadWritersRun::of(&b.origin, &b.text, &point.values)
                            .map_err(|e| {
                                invalid(format!(
                                    "{origin}: point {i} ({}): {e}",
                                    point.sets().join(", ")
                                ))
                            })?;
                    point.read_writers = Some(run);
                }
                (Some(b), Kind::Run) => {
                    let spec = Spec::parse(&b.text, &point.sets(), &b.origin).map_err(|e| {
                        invalid(format!(
                            "{origin}: point {i} ({}): {e}",
                            point.sets().join(", ")
                        ))
                    })?;
                    point.spec = Some(spec);
                }
                _ => {
                    let p = match point.values.get("protocol") {
                        Some(Value::String(p)) => p.clone(),
                        None => {
                            return Err(invalid(format!(
                                "{origin}: protocol: a check sweep needs `protocol` in its grid or points"
                            )));
                        }
                        Some(v) => {
                            return Err(invalid(format!(
                                "{origin}: point {i}: protocol: expected a string, got {v}"
                            )));
                        }
                    };
                    if mmulab_protocols::find(&p).is_none() {
                        return Err(invalid(format!(
                            "{origin}: point {i}: protocol: unknown protocol `{p}` (known: {})",
                            mmulab_protocols::names().join(", ")
                        )));
                    }
                }
            }
            points.push(point);
        }

        if kind == Kind::MirageReadWriters {
            // fleisch89's work budget (its specs' `MAX_WORK`): a typo in
            // `seeds.count` or a loop's length is refused, not run for
            // years.
            let per_seed: f64 = points
                .iter()
                .filter_map(|p| p.read_writers.as_ref())
                .map(|r| r.work())
                .sum();
            let work = per_seed * seeds.count as f64;
            let budget = mmulab_mirage::spec::MAX_WORK as f64;
            if work > budget {
                return Err(invalid(format!(
                    "{origin}: about {work:.1e} simulated operations ({} points x {} seeds, each its loop_s x {:.0e} a second), above the budget of {budget:.0e} (fleisch89's specs' budget)",
                    points.len(),
                    seeds.count,
                    mmulab_mirage::spec::EVENTS_PER_SECOND
                )));
            }
        }
        let chunk = chunk.unwrap_or(match kind {
            Kind::Run | Kind::MirageReadWriters | Kind::SwtlbTrap => seeds.count,
            Kind::Check => CHECK_CHUNK,
        });
        let mut sweep = Sweep {
            kind,
            base,
            columns,
            points,
            seeds,
            chunk,
            raw,
            sha256: String::new(),
        };
        sweep.sha256 = sha256_hex(sweep.canonical_json().as_bytes());
        Ok(sweep)
    }

    /// What the plan hash covers.
    fn canonical_json(&self) -> String {
        let points: Vec<BTreeMap<&String, String>> = self
            .points
            .iter()
            .map(|p| p.values.iter().map(|(k, v)| (k, v.to_string())).collect())
            .collect();
        let mut v = serde_json::json!({
            "kind": self.kind,
            "base_sha256": self.base.as_ref().map(|b| &b.sha256),
            "points": points,
            "seeds": self.seeds,
            "chunk": self.chunk,
        });
        if let Some(r) = &self.raw {
            v["raw"] = serde_json::json!(r);
        }
        v.to_string()
    }

    /// The sweep as a file that expands to the same plan, its base read
    /// from `base` (a path relative to the file): what a results folder
    /// keeps, so that its shards never read the user's (maybe edited)
    /// files.
    pub fn to_toml(&self, base: &str) -> String {
        let point = self
            .points
            .iter()
            .map(|p| p.values.clone().into_iter().collect())
            .collect();
        let file = SweepFile {
            base: self.base.as_ref().map(|_| base.to_string()),
            kind: self.kind,
            seeds: self.seeds,
            chunk: Some(self.chunk),
            grid: toml::Table::new(),
            point,
            raw: self.raw.clone(),
            quick: None,
        };
        toml::to_string(&file).expect("a sweep serialises")
    }

    pub fn task_count(&self) -> usize {
        self.points.len() * self.seeds.count as usize
    }

    /// Task `index`: points in order, each point's seeds in order.
    pub fn task(&self, index: usize) -> Task {
        assert!(index < self.task_count(), "task {index} out of range");
        let per = self.seeds.count as usize;
        Task {
            index,
            point: index / per,
            seed: self.seeds.start + (index % per) as u64,
        }
    }

    /// The array tasks of the Slurm backend: as many as keep each at
    /// least `chunk` tasks long (one when the sweep is shorter).
    pub fn shard_count(&self) -> u64 {
        (self.task_count() as u64 / self.chunk).max(1)
    }
}

/// The tasks of shard `i` of `n`: contiguous, sizes differing by at most
/// one, together every task exactly once.
pub fn shard_range(tasks: usize, i: u64, n: u64) -> Range<usize> {
    assert!(n >= 1 && i < n, "shard {i}/{n}");
    let at = |k: u64| ((k as u128 * tasks as u128) / n as u128) as usize;
    at(i)..at(i + 1)
}

/// One task's raw outcome: what a paper reproduction computes its rows
/// from. Floats travel as their shortest exact text, so that a record
/// read back from a Slurm array task's file is the same bits as one
/// computed in this process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Raw {
    pub seed: u64,
    /// Simulated cycles at the end of the run.
    pub end_cycles: u64,
    pub timed_out: bool,
    /// The oracle's violations.
    pub violations: u64,
    pub counters: mmulab_engine::Counters,
    /// The samples of the histograms the sweep's `raw` names, in the
    /// order recorded (a histogram with no samples is absent).
    #[serde(with = "exact::samples")]
    pub samples: BTreeMap<String, Vec<f64>>,
    /// The workload's figures.
    #[serde(with = "exact::figures")]
    pub figures: BTreeMap<String, f64>,
    /// The workload's verdict.
    pub verdict: String,
}

impl Raw {
    /// The raw outcome of one seed, keeping the samples of `hists`.
    pub fn of(out: &crate::run::SeedOutcome, hists: &[String]) -> Raw {
        Raw {
            seed: out.seed,
            end_cycles: out.sim.end.0,
            timed_out: out.sim.timed_out,
            violations: out.sim.oracle.violations,
            counters: out.sim.counters.clone(),
            samples: hists
                .iter()
                .filter_map(|h| {
                    out.sim
                        .hists
                        .get(h)
                        .map(|x| (h.clone(), x.samples().to_vec()))
                })
                .collect(),
            figures: out.workload.figures.clone().into_iter().collect(),
            verdict: out.workload.verdict.clone(),
        }
    }

    /// A histogram's samples (empty when it has none).
    pub fn samples(&self, name: &str) -> &[f64] {
        self.samples.get(name).map_or(&[], Vec::as_slice)
    }
}

/// Serde helpers writing floats as Rust's shortest exact text.
mod exact {
    fn text(v: f64) -> String {
        format!("{v:?}")
    }
    fn parse<E: serde::de::Error>(s: &str) -> Result<f64, E> {
        s.parse()
            .map_err(|_| E::custom(format!("`{s}` is not a number")))
    }
    pub mod samples {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};
        use std::collections::BTreeMap;
        pub fn serialize<S: Serializer>(
            m: &BTreeMap<String, Vec<f64>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            let t: BTreeMap<&String, Vec<String>> = m
                .iter()
                .map(|(k, v)| (k, v.iter().map(|&x| super::text(x)).collect()))
                .collect();
            t.serialize(s)
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<BTreeMap<String, Vec<f64>>, D::Error> {
            let t = BTreeMap::<String, Vec<String>>::deserialize(d)?;
            t.into_iter()
                .map(|(k, v)| {
                    let v = v
                        .iter()
                        .map(|x| super::parse(x))
                        .collect::<Result<_, _>>()?;
                    Ok((k, v))
                })
                .collect()
        }
    }
    pub mod figures {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};
        use std::collections::BTreeMap;
        pub fn serialize<S: Serializer>(
            m: &BTreeMap<String, f64>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            let t: BTreeMap<&String, String> =
                m.iter().map(|(k, &v)| (k, super::text(v))).collect();
            t.serialize(s)
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<BTreeMap<String, f64>, D::Error> {
            let t = BTreeMap::<String, String>::deserialize(d)?;
            t.into_iter()
                .map(|(k, v)| Ok((k, super::parse(&v)?)))
                .collect()
        }
    }
}

/// The raw outcome of one run of fleisch89 §8's read-writers: its
/// throughput and simulated length as figures
/// (`read_write_instr_per_s`, `simulated_s`), its counters (messages,
/// faults, interrupts, Δ sleeps). Mirage's oracle checks every event of
/// the run (a violation stops it), so a run that ends is consistent.
pub fn raw_of_read_writers(seed: u64, r: &mmulab_mirage::runs::ReadWritersResult) -> Raw {
    Raw {
        seed,
        // The Mirage simulator counts time in ns, not cycles: its length
        // is the `simulated_s` figure.
        end_cycles: 0,
        timed_out: false,
        violations: 0,
        counters: r.counters.clone(),
        samples: BTreeMap::new(),
        figures: [
            ("read_write_instr_per_s".to_string(), r.instr_per_s),
            ("simulated_s".to_string(), r.end_ns as f64 / 1e9),
        ]
        .into(),
        verdict: "consistent".into(),
    }
}

/// Runs one task of a sweep that is not a check sweep and returns its
/// raw outcome (keeping the samples of the sweep's `raw` histograms):
/// what a reproduction reads, on whichever backend ran it. A run the
/// simulator could not finish (Mirage's event bound) is an error.
pub fn raw_of(sweep: &Sweep, task: Task) -> Result<Raw, String> {
    match sweep.kind {
        Kind::Run => {
            let hists = sweep.raw.clone().unwrap_or_default();
            Ok(Raw::of(&run_seed_of(sweep, task), &hists))
        }
        Kind::MirageReadWriters => {
            let run = sweep.points[task.point]
                .read_writers
                .as_ref()
                .expect("read-writers sweeps validate a run for every point");
            run.run(task.seed)
                .map(|r| raw_of_read_writers(task.seed, &r))
                .map_err(|e| format!("task {}: {e}", task.id()))
        }
        Kind::SwtlbTrap => {
            let run = sweep.points[task.point]
                .trap
                .as_ref()
                .expect("swtlb-trap sweeps validate a pass for every point");
            run.run(task.seed)
                .map_err(|e| format!("task {}: {e}", task.id()))
        }
        Kind::Check => Err(format!(
            "task {}: a check sweep's tasks have no raw outcome",
            task.id()
        )),
    }
}

/// Runs one task of a run sweep: one seed of its point's spec.
pub fn run_seed_of(sweep: &Sweep, task: Task) -> crate::run::SeedOutcome {
    let mut spec = sweep.points[task.point]
        .spec
        .clone()
        .expect("run sweeps validate a spec for every point");
    spec.seed = task.seed;
    spec.runs = 1;
    crate::run::run_seed(&spec, task.seed)
}

/// A base spec from its text.
pub fn base_of(origin: String, text: String) -> Base {
    Base {
        origin,
        sha256: sha256_hex(text.as_bytes()),
        text,
    }
}

fn read_base(name: &str, dir: &Path, origin: &str) -> Result<Base, PlanError> {
    let beside = dir.join(name);
    let (origin_of, text) = if beside.is_file() {
        let text = std::fs::read_to_string(&beside).map_err(|err| PlanError::Io {
            path: beside.display().to_string(),
            err,
        })?;
        (beside.display().to_string(), text)
    } else if Path::new(name).is_file() {
        let text = std::fs::read_to_string(name).map_err(|err| PlanError::Io {
            path: name.to_string(),
            err,
        })?;
        (name.to_string(), text)
    } else if let Some((rel, text)) = crate::spec::embedded(Path::new(name)) {
        (format!("experiments/{rel}"), text)
    } else {
        return Err(invalid(format!(
            "{origin}: base: no spec `{name}` beside the sweep file, in the working folder or among the embedded experiments"
        )));
    };
    Ok(Base {
        origin: origin_of,
        sha256: sha256_hex(text.as_bytes()),
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str =
        "protocol = \"global\"\n[machine]\ncpus = 4\n[workload]\nkind = \"tester\"\nchildren = 2\n";

    fn parse(text: &str) -> Result<Sweep, PlanError> {
        // A folder per call: tests run in parallel, and a base being
        // rewritten while another test reads it reads as empty.
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("mmulab-plan-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("base.toml"), BASE).unwrap();
        let s = Sweep::parse(text, "s.toml", &dir);
        std::fs::remove_dir_all(&dir).unwrap();
        s
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    #[test]
    fn grid_is_the_cartesian_product_first_key_slowest() {
        let s = parse(
            "base = \"base.toml\"\nseeds = { start = 5, count = 2 }\n[grid]\n\"machine.cpus\" = [4, 8]\nprotocol = [\"mach\", \"global\", \"svr42\"]\n",
        )
        .unwrap();
        assert_eq!(s.columns, ["machine.cpus", "protocol"]);
        let shown: Vec<String> = s.points.iter().map(|p| p.sets().join(" ")).collect();
        assert_eq!(
            shown,
            [
                "machine.cpus=4 protocol=\"mach\"",
                "machine.cpus=4 protocol=\"global\"",
                "machine.cpus=4 protocol=\"svr42\"",
                "machine.cpus=8 protocol=\"mach\"",
                "machine.cpus=8 protocol=\"global\"",
                "machine.cpus=8 protocol=\"svr42\"",
            ]
        );
        assert_eq!(s.task_count(), 12);
        assert_eq!(s.task(3).id(), "p1-s6");
        assert_eq!(s.points[5].spec.as_ref().unwrap().machine.cpus, 8);
        assert_eq!(s.points[5].spec.as_ref().unwrap().protocol, "svr42");
    }

    #[test]
    fn points_cross_the_grid_and_nested_tables_are_dotted_keys() {
        let s = parse(
            "base = \"base.toml\"\nseeds = { start = 1, count = 1 }\n[grid.machine]\ncpus = [4, 8]\n[[point]]\nprotocol = \"mach\"\n[[point]]\nprotocol = \"global\"\n\"workload.children\" = 1\n",
        )
        .unwrap();
        assert_eq!(s.columns, ["machine.cpus", "protocol", "workload.children"]);
        assert_eq!(s.points.len(), 4);
        assert_eq!(s.points[0].column("workload.children"), "");
        assert_eq!(s.points[3].column("workload.children"), "1");
        assert_eq!(s.points[3].column("protocol"), "global");
    }

    #[test]
    fn the_canonical_copy_expands_to_the_same_plan() {
        let s = parse(
            "base = \"base.toml\"\nseeds = { start = 1, count = 3 }\nchunk = 2\n[grid]\n\"machine.cpus\" = [4, 8]\n",
        )
        .unwrap();
        let copy = parse(&s.to_toml("base.toml")).unwrap();
        assert_eq!(copy.sha256, s.sha256);
        assert_eq!(copy.task_count(), s.task_count());
        let other = parse(
            "base = \"base.toml\"\nseeds = { start = 1, count = 3 }\nchunk = 2\n[grid]\n\"machine.cpus\" = [4, 16]\n",
        )
        .unwrap();
        assert_ne!(other.sha256, s.sha256);
    }

    #[test]
    fn bad_keys_and_values_are_named() {
        let e = err(
            "base = \"base.toml\"\nseeds = { start = 1, count = 2 }\n[grid]\n\"machine.cpuz\" = [4]\n",
        );
        assert!(e.contains("point 0") && e.contains("cpuz"), "{e}");
        let e = err(
            "base = \"base.toml\"\nseeds = { start = 1, count = 2 }\n[grid]\n\"machine.cpus\" = [4, 0]\n",
        );
        assert!(
            e.contains("point 1 (machine.cpus=0)") && e.contains("machine.cpus: must be"),
            "{e}"
        );
        let e = err("base = \"base.toml\"\nseeds = { start = 1, count = 2 }\n[grid]\nseed = [4]\n");
        assert!(e.contains("`seed` cannot be swept"), "{e}");
        let e = err("base = \"base.toml\"\nseedz = { start = 1, count = 2 }\n");
        assert!(e.contains("seedz"), "{e}");
        let e = err("base = \"base.toml\"\nseeds = { start = 1, count = 0 }\n");
        assert!(e.contains("seeds.count"), "{e}");
        let e = err("base = \"nope.toml\"\nseeds = { start = 1, count = 1 }\n");
        assert!(e.contains("no spec `nope.toml`"), "{e}");
        let e = err(
            "base = \"base.toml\"\nseeds = { start = 1, count = 1 }\n[grid]\n\"machine.cpus\" = 4\n",
        );
        assert!(e.contains("grid.machine.cpus: expected a list"), "{e}");
        let e = err(
            "base = \"base.toml\"\nseeds = { start = 1, count = 1 }\n[grid]\n\"machine.cpus\" = [4, 4]\n",
        );
        assert!(e.contains("points 0 and 1 are the same"), "{e}");
        let e = err(
            "kind = \"check\"\nseeds = { start = 1, count = 1 }\n[grid]\nprotocol = [\"mach\", \"nope\"]\n",
        );
        assert!(
            e.contains("point 1: protocol: unknown protocol `nope`"),
            "{e}"
        );
        let e = err(
            "kind = \"check\"\nseeds = { start = 1, count = 1 }\n[grid]\n\"machine.cpus\" = [2]\nprotocol = [\"mach\"]\n",
        );
        assert!(e.contains("`machine.cpus`: a check sweep"), "{e}");
        let e = err(
            "base = \"base.toml\"\nseeds = { start = 1, count = 100000 }\n[grid]\na = [1,2,3,4,5,6,7,8,9,10]\nb = [1,2,3,4,5,6,7,8,9,10,11]\n",
        );
        assert!(e.contains("more than"), "{e}");
    }

    #[test]
    fn embedded_experiments_serve_as_base() {
        let s = parse(
            "base = \"black89/fig2\"\nseeds = { start = 1, count = 1 }\n[grid]\n\"workload.children\" = [1, 2]\n",
        )
        .unwrap();
        assert_eq!(
            s.base.as_ref().unwrap().origin,
            "experiments/black89/fig2.toml"
        );
    }

    #[test]
    fn quick_replaces_seeds_grid_lists_and_points_only_when_asked() {
        let text = "base = \"base.toml\"\nseeds = { start = 1, count = 20 }\nraw = [\"h\"]\n[grid]\nprotocol = [\"mach\", \"global\"]\n\"workload.children\" = [1, 2, 3]\n[[point]]\n\"machine.cpus\" = 4\n[[point]]\n\"machine.cpus\" = 8\n[quick]\nseeds = { start = 1, count = 3 }\n[quick.grid]\n\"workload.children\" = [2]\n\"kernel.hz\" = [50]\n[[quick.point]]\n\"machine.cpus\" = 8\n";
        let dir = std::env::temp_dir().join(format!("mmulab-plan-quick-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("base.toml"), BASE).unwrap();
        let full =
            Sweep::parse_with(text, "s.toml", false, &|n| read_base(n, &dir, "s.toml")).unwrap();
        let quick =
            Sweep::parse_with(text, "s.toml", true, &|n| read_base(n, &dir, "s.toml")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((full.points.len(), full.seeds.count), (12, 20));
        assert_eq!(
            full.columns,
            ["machine.cpus", "protocol", "workload.children"]
        );
        assert_eq!((quick.points.len(), quick.seeds.count), (2, 3));
        assert_eq!(
            quick.columns,
            ["kernel.hz", "machine.cpus", "protocol", "workload.children"]
        );
        let shown: Vec<String> = quick.points.iter().map(|p| p.sets().join(" ")).collect();
        assert_eq!(
            shown,
            [
                "kernel.hz=50 machine.cpus=8 protocol=\"mach\" workload.children=2",
                "kernel.hz=50 machine.cpus=8 protocol=\"global\" workload.children=2",
            ]
        );
        assert_eq!(quick.raw.as_deref(), Some(&["h".to_string()][..]));
        // The expanded copy keeps `raw` and needs no [quick].
        let copy = parse(&quick.to_toml("base.toml")).unwrap();
        assert_eq!(copy.sha256, quick.sha256);
    }

    #[test]
    fn kinds_are_named_as_sweep_files_write_them() {
        for k in [
            Kind::Run,
            Kind::Check,
            Kind::MirageReadWriters,
            Kind::SwtlbTrap,
        ] {
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.name())
            );
        }
    }

    #[test]
    fn read_writers_sweeps_validate_a_mirage_run_per_point() {
        let s = parse(
            "kind = \"mirage-read-writers\"\nbase = \"fleisch89/paper-data/fig8.toml\"\nseeds = { start = 0, count = 2 }\n[grid]\ndelta_ticks = [1, 600]\n\"loop_s\" = [1.0]\n",
        )
        .unwrap();
        assert_eq!(s.columns, ["delta_ticks", "loop_s"]);
        assert_eq!(s.task_count(), 4);
        let run = s.points[1].read_writers.as_ref().unwrap();
        assert_eq!(
            (run.delta_ticks, run.loop_s, run.stagger_s),
            (600, 1.0, 0.5)
        );
        assert!(s.points[1].spec.is_none());
        // The task's raw outcome is the Mirage run's, seed for seed.
        let t = s.task(3);
        assert_eq!((t.point, t.seed), (1, 1));
        let raw = raw_of(&s, t).unwrap();
        assert_eq!(
            raw.figures["read_write_instr_per_s"],
            run.run(1).unwrap().instr_per_s
        );
        assert!(raw.counters.get("messages_page") > 0);
        let e = err(
            "kind = \"mirage-read-writers\"\nbase = \"fleisch89/paper-data/fig8.toml\"\nseeds = { start = 0, count = 1 }\n[grid]\n\"machine.cpus\" = [2]\n",
        );
        assert!(
            e.contains("point 0 (machine.cpus=2)") && e.contains("not a key of a read-writers run"),
            "{e}"
        );
        let e = err("kind = \"mirage-read-writers\"\nseeds = { start = 0, count = 1 }\n");
        assert!(e.contains("base: missing"), "{e}");
    }

    #[test]
    fn swtlb_trap_sweeps_validate_a_pass_per_point() {
        let head = "kind = \"swtlb-trap\"\nbase = \"uhlig94/paper-data/shape.toml\"\nseeds = { start = 1, count = 1 }\n[grid]\n";
        let s = parse(&format!(
            "{head}os = [\"mach3\"]\nworkload = [\"IOzone\"]\nlower = [[4, 8]]\n"
        ))
        .unwrap();
        assert_eq!(s.columns, ["lower", "os", "workload"]);
        let raw = raw_of(&s, s.task(0)).unwrap();
        // One pass, two partition points: each its own metrics.
        for p in ["lower4.", "lower8."] {
            assert!(
                raw.figures.contains_key(&format!("{p}tlb_seconds")),
                "{raw:?}"
            );
            assert!(
                raw.counters.0.contains_key(&format!("{p}misses.L1U")),
                "{raw:?}"
            );
        }
        assert_eq!(raw.verdict, "none");
        // Partition points x placements, in that order, in one pass.
        let s = parse(&format!(
            "{head}os = [\"mach3\"]\nworkload = [\"IOzone\"]\n[[point]]\nlower = [4, 8]\nplacement = [\"B\", \"D\"]\n"
        ))
        .unwrap();
        let trap = s.points[0].trap.as_ref().unwrap();
        assert_eq!(trap.lowers(), [4, 8]);
        let raw = raw_of(&s, s.task(0)).unwrap();
        let names: Vec<&String> = raw
            .figures
            .keys()
            .filter(|k| k.ends_with("tlb_seconds"))
            .collect();
        assert_eq!(
            names,
            [
                "lower4.B.tlb_seconds",
                "lower4.D.tlb_seconds",
                "lower8.B.tlb_seconds",
                "lower8.D.tlb_seconds"
            ]
        );
        let e = err(&format!(
            "{head}os = [\"mach3\"]\nworkload = [\"mab\"]\nplacement = [[\"E\"]]\n"
        ));
        assert!(e.contains("placement: expected distinct policies"), "{e}");
        let e = err(&format!("{head}os = [\"mach3\"]\n"));
        assert!(
            e.contains("point 0 (os=\"mach3\"): workload: missing"),
            "{e}"
        );
        let e = err(&format!(
            "{head}os = [\"mach3\"]\nworkload = [\"mab\"]\nlower = [-1]\n"
        ));
        assert!(
            e.contains("lower: expected distinct partition points"),
            "{e}"
        );
    }

    #[test]
    fn raw_outcomes_travel_as_exact_text() {
        let r = Raw {
            seed: 3,
            end_cycles: 10,
            timed_out: false,
            violations: 0,
            counters: Default::default(),
            samples: [("h".to_string(), vec![0.1 + 0.2, 1e300, -0.0, 5.0])].into(),
            figures: [("f".to_string(), std::f64::consts::PI / 7.0)].into(),
            verdict: "consistent".into(),
        };
        let back: Raw = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(back.samples("h")[2].is_sign_negative());
    }

    #[test]
    fn shards_cover_every_task_once_in_order() {
        for tasks in [0usize, 1, 5, 16, 301] {
            for n in 1..=7u64 {
                let mut next = 0;
                for i in 0..n {
                    let r = shard_range(tasks, i, n);
                    assert_eq!(r.start, next, "{tasks} tasks, shard {i}/{n}");
                    assert!(r.len() <= tasks.div_ceil(n as usize));
                    next = r.end;
                }
                assert_eq!(next, tasks);
            }
        }
    }

    #[test]
    fn check_sweeps_chunk_at_least_a_thousand_seeds() {
        let s = parse(
            "kind = \"check\"\nseeds = { start = 1, count = 2500 }\n[grid]\nprotocol = [\"mach\", \"global\"]\n",
        )
        .unwrap();
        assert_eq!(s.chunk, CHECK_CHUNK);
        assert_eq!(s.shard_count(), 5);
        for i in 0..5 {
            assert!(shard_range(s.task_count(), i, 5).len() >= 1000);
        }
    }
}
