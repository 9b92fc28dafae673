//! Paper reproductions: `mmulab reproduce PAPER`. Each reads its specs from
//! `experiments/PAPER/`, where the paper's numbers sit in a `[paper]`
//! table beside the spec, runs them, and returns the shared rows. The
//! grids of black89 Fig. 2, balan92 Figs. 1-4, romanescu10 Figs. 7-8,
//! fleisch89 Fig. 8 and uhlig94's Tables II/V/VI and VIII and Figs. 5, 7
//! and 8 are
//! sweep files (`experiments/PAPER/*.sweep.toml`, the format of
//! `mmulab sweep`), whose tasks a [`Backend`] runs ([`run_sweep`]): this
//! process's threads, or a Slurm job array:
//!
//! - `black89/fig2.sweep.toml`
//! - `balan92/fig1-basic.sweep.toml`, `fig2-lazy.sweep.toml`,
//!   `fig3-immediate.sweep.toml`, `fig4-fork.sweep.toml`
//! - `romanescu10/fig7-single-unmap.sweep.toml`,
//!   `fig8-multiple-unmap.sweep.toml`
//! - `fleisch89/fig8.sweep.toml` (`kind = "mirage-read-writers"`: each
//!   task one run of the Mirage simulator, [`fleisch89`])
//! - `uhlig94/systems.sweep.toml`, `fig5.sweep.toml`, `fig7.sweep.toml`,
//!   `fig8.sweep.toml`
//!   (`kind = "swtlb-trap"`: each task one trap-driven pass of the
//!   software-TLB simulator, [`uhlig94::TrapRun`])
//!
//! A sweep file's `kind` says which simulator runs its tasks
//! ([`crate::sweep::Kind`]; [`crate::sweep::raw_of`] runs one task of any
//! kind and returns its raw outcome, whatever the backend).

pub mod balan92;
pub mod black89;
pub mod fleisch89;
pub mod romanescu10;
pub mod uhlig94;

use std::collections::BTreeMap;

use mmulab_report::Experiments;
use rayon::prelude::*;

use crate::spec::{Spec, SpecError};
use crate::sweep::{PlanError, Raw, Sweep};

/// Where a reproduction's sweeps run: [`Local`] (this machine's cores),
/// or a Slurm job array (`mmulab_sweep::slurm::Backend`, from
/// `mmulab reproduce --backend slurm`).
pub trait Backend: Sync {
    /// Runs every task of `sweep` (loaded from the sweep file `rel`, e.g.
    /// `balan92/fig1-basic.sweep.toml`) and returns the tasks' raw
    /// outcomes in task order. The outcomes depend only on the plan and
    /// the task, never on the backend.
    fn run(&self, rel: &str, sweep: &Sweep) -> Result<Vec<Raw>, SpecError>;
}

/// The local backend: every task on this machine's cores (rayon's pool),
/// in this process.
pub struct Local;

impl Backend for Local {
    fn run(&self, rel: &str, sweep: &Sweep) -> Result<Vec<Raw>, SpecError> {
        (0..sweep.task_count())
            .into_par_iter()
            .with_max_len(1)
            .map(|i| crate::sweep::raw_of(sweep, sweep.task(i)))
            .collect::<Result<Vec<Raw>, String>>()
            .map_err(|e| SpecError::Invalid(format!("{rel}: {e}")))
    }
}

fn spec_error(e: PlanError) -> SpecError {
    match e {
        PlanError::Invalid(s) => SpecError::Invalid(s),
        PlanError::Io { path, err } => SpecError::Io { path, err },
    }
}

/// Loads a reproduction's sweep file `rel` (e.g.
/// `balan92/fig1-basic.sweep.toml`) from the experiments, its `base`
/// read beside it; `quick` applies its `[quick]` table. The same file
/// runs by hand: `mmulab sweep experiments/REL [--quick]`.
pub fn load_sweep(src: &Experiments, rel: &str, quick: bool) -> Result<Sweep, SpecError> {
    let origin = src.origin(rel);
    let text = src
        .read(rel)
        .map_err(|e| SpecError::Invalid(e.to_string()))?;
    let folder = rel.rsplit_once('/').map_or("", |(d, _)| d);
    let read_base = |name: &str| {
        let brel = if folder.is_empty() {
            name.to_string()
        } else {
            format!("{folder}/{name}")
        };
        let text = src
            .read(&brel)
            .map_err(|e| PlanError::Invalid(format!("{origin}: base: {e}")))?;
        Ok(crate::sweep::base_of(src.origin(&brel), text))
    };
    let sweep = Sweep::parse_with(&text, &origin, quick, &read_base).map_err(spec_error)?;
    if !sweep.kind.has_base() || sweep.raw.is_none() {
        return Err(SpecError::Invalid(format!(
            "{origin}: a reproduction's sweep file runs its base (no `kind`, or a simulator's kind such as \"mirage-read-writers\") and names the histograms its rows read (`raw = [...]`, maybe empty)"
        )));
    }
    Ok(sweep)
}

/// A reproduction's sweep and its tasks' raw outcomes, in task order.
pub struct SweepRun {
    pub sweep: Sweep,
    pub raw: Vec<Raw>,
}

/// Loads the sweep file `rel` and runs it on `backend`.
pub fn run_sweep(
    src: &Experiments,
    rel: &str,
    quick: bool,
    backend: &dyn Backend,
) -> Result<SweepRun, SpecError> {
    let sweep = load_sweep(src, rel, quick)?;
    let raw = backend.run(rel, &sweep)?;
    assert_eq!(
        raw.len(),
        sweep.task_count(),
        "a backend returns every task"
    );
    Ok(SweepRun { sweep, raw })
}

impl SweepRun {
    /// The index of the one point whose values include every `(key,
    /// value)` of `at`; `None` when there is none.
    pub fn point(&self, at: &[(&str, toml::Value)]) -> Option<usize> {
        let mut found = self
            .sweep
            .points
            .iter()
            .enumerate()
            .filter(|(_, p)| at.iter().all(|(k, v)| p.values.get(*k) == Some(v)));
        let first = found.next().map(|(i, _)| i);
        assert!(
            found.next().is_none(),
            "{at:?} names more than one point of the sweep"
        );
        first
    }

    /// The outcomes of point `i`, in seed order.
    pub fn of_point(&self, i: usize) -> &[Raw] {
        let per = self.sweep.seeds.count as usize;
        &self.raw[i * per..(i + 1) * per]
    }

    /// The outcomes (in seed order) of the one point whose values include
    /// every `(key, value)` of `at`. Panics when no point matches: the
    /// reproduction asked for a point its sweep file lacks.
    pub fn at(&self, at: &[(&str, toml::Value)]) -> &[Raw] {
        let i = self
            .point(at)
            .unwrap_or_else(|| panic!("no point {at:?} in the sweep"));
        self.of_point(i)
    }

    /// The values `key` takes, in the order the points first take them.
    pub fn values(&self, key: &str) -> Vec<toml::Value> {
        let mut v: Vec<toml::Value> = Vec::new();
        for p in &self.sweep.points {
            if let Some(x) = p.values.get(key)
                && !v.contains(x)
            {
                v.push(x.clone());
            }
        }
        v
    }

    /// [`SweepRun::values`] of an integer key.
    pub fn integers(&self, key: &str) -> Vec<u64> {
        self.values(key)
            .iter()
            .map(|v| {
                v.as_integer()
                    .unwrap_or_else(|| panic!("`{key}`: {v} is not an integer"))
                    as u64
            })
            .collect()
    }

    /// A point's spec (validated when the sweep was loaded).
    pub fn spec(&self, i: usize) -> &Spec {
        self.sweep.points[i].spec.as_ref().expect("run sweep")
    }
}

/// A spec file with its `[paper]` table split off.
pub struct PaperSpec {
    pub text: String,
    pub paper: toml::Table,
    pub origin: String,
}

impl PaperSpec {
    /// Loads `rel` (e.g. `black89/fig2.toml`) from the experiments.
    pub fn load(src: &Experiments, rel: &str) -> Result<PaperSpec, SpecError> {
        let origin = src.origin(rel);
        let text = src
            .read(rel)
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| SpecError::Invalid(format!("{origin}: {e}")))?;
        let paper = match table.remove("paper") {
            Some(toml::Value::Table(t)) => t,
            _ => {
                return Err(SpecError::Invalid(format!(
                    "{origin}: paper: missing table of the paper's numbers"
                )));
            }
        };
        Ok(PaperSpec {
            text: toml::to_string(&table).expect("serialise"),
            paper,
            origin,
        })
    }

    /// The spec's own fitted inputs: `[paper.calibration]`, each spec key
    /// (e.g. `workload.jobs`) to the artefact (or `artefact / quantity`)
    /// it was fitted to. Empty when the spec fitted nothing.
    pub fn calibration(&self) -> Result<BTreeMap<String, String>, SpecError> {
        let Some(v) = self.paper.get("calibration") else {
            return Ok(BTreeMap::new());
        };
        let t = v.as_table().ok_or_else(|| {
            SpecError::Invalid(format!(
                "{}: paper.calibration: expected a table",
                self.origin
            ))
        })?;
        t.iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|a| (k.clone(), a.to_string()))
                    .ok_or_else(|| {
                        SpecError::Invalid(format!(
                            "{}: paper.calibration.{k}: expected an artefact name",
                            self.origin
                        ))
                    })
            })
            .collect()
    }

    pub fn spec(&self, sets: &[String]) -> Result<Spec, SpecError> {
        Spec::parse(&self.text, sets, &self.origin)
    }

    pub fn number(&self, key: &str) -> Result<f64, SpecError> {
        match self.paper.get(key) {
            Some(toml::Value::Float(f)) => Ok(*f),
            Some(toml::Value::Integer(i)) => Ok(*i as f64),
            _ => Err(SpecError::Invalid(format!(
                "{}: paper.{key}: expected a number",
                self.origin
            ))),
        }
    }

    pub fn list(&self, key: &str) -> Result<Vec<u64>, SpecError> {
        match self.paper.get(key) {
            Some(toml::Value::Array(a)) => a
                .iter()
                .map(|v| v.as_integer().map(|i| i as u64))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    SpecError::Invalid(format!("{}: paper.{key}: expected integers", self.origin))
                }),
            _ => Err(SpecError::Invalid(format!(
                "{}: paper.{key}: expected a list",
                self.origin
            ))),
        }
    }
}
