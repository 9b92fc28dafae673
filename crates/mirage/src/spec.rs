//! The experiment specs of `experiments/fleisch89/paper-data/*.toml`, one
//! per table or figure, with the paper's numbers beside the parameters.
//! They are reproduce-only (`mmulab reproduce fleisch89` reads them; they
//! are not `mmulab run` specs), hence `paper-data/`. Unknown keys are
//! errors that name the key (serde's `deny_unknown_fields`); impossible
//! values are errors that name the key too.

use crate::Error;
use mmulab_report::Experiments;
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table3Spec {
    pub artefact: String,
    pub preset: String,
    pub tolerance_pct: f64,
    pub paper: Table3Paper,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table3Paper {
    pub using_site_ms: f64,
    pub library_site_ms: f64,
    pub total_ms: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorstCaseSpec {
    pub artefact: String,
    pub preset: String,
    pub trials: u64,
    pub quick_trials: u64,
    pub seeds: u64,
    pub quick_seeds: u64,
    pub count_tolerance_pct: f64,
    pub rate_tolerance_pct: f64,
    pub paper: WorstCasePaper,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorstCasePaper {
    pub messages_per_cycle: u64,
    pub page_messages_per_cycle: u64,
    pub short_messages_per_cycle: u64,
    pub request_interrupts_per_cycle: u64,
    pub input_interrupts_per_cycle: u64,
    pub local_faults_per_cycle: u64,
    pub raw_communication_ms_per_cycle: f64,
    pub budget_ms_per_cycle: f64,
    pub bound_cycles_per_s: f64,
    pub single_site_no_yield_cycles_per_s: f64,
    pub single_site_yield_cycles_per_s: f64,
    pub single_site_yield_speedup: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig7Spec {
    pub artefact: String,
    pub preset: String,
    pub deltas: Vec<u32>,
    pub quick_deltas: Vec<u32>,
    pub trials: u64,
    pub quick_trials: u64,
    pub seeds: u64,
    pub quick_seeds: u64,
    pub rate_tolerance_pct: f64,
    pub crossing_tolerance_ticks: u32,
    pub paper: Fig7Paper,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig7Paper {
    pub yield_at_delta2_cycles_per_s: f64,
    pub max_at_delta2_cycles_per_s: f64,
    pub ms_per_cycle_at_delta2: f64,
    pub yield_gain_at_delta2_pct: f64,
    pub crossing_delta: u32,
    pub expected_at_delta0_cycles_per_s: f64,
    pub sleeps_per_cycle_at_delta2: f64,
    pub sleep_ms_at_delta2: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig8Spec {
    pub artefact: String,
    pub preset: String,
    pub deltas: Vec<u32>,
    pub quick_deltas: Vec<u32>,
    pub loop_s: f64,
    pub quick_loop_s: f64,
    pub third_site_library: bool,
    pub stagger_s: f64,
    pub seeds: u64,
    pub quick_seeds: u64,
    pub rate_tolerance_pct: f64,
    pub peak_delta_tolerance_pct: f64,
    pub paper: Fig8Paper,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig8Paper {
    pub peak_per_s: f64,
    pub peak_delta: u32,
    pub contention_below_delta: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NSiteSpec {
    pub artefact: String,
    pub preset: String,
    pub sites: Vec<u64>,
    pub quick_sites: Vec<u64>,
    pub delta_ticks: u32,
    pub rounds: u64,
    pub quick_rounds: u64,
}

/// Parses one spec from TOML text; `file` names it in errors.
pub fn parse<T: for<'de> Deserialize<'de>>(file: &str, text: &str) -> Result<T, Error> {
    toml::from_str(text).map_err(|e| Error::Spec {
        file: file.into(),
        message: e.to_string(),
    })
}

/// Where the specs live under the experiments: `fleisch89/paper-data/`.
pub const DIR: &str = "fleisch89/paper-data";

/// Loads `fleisch89/paper-data/NAME` from the experiments.
pub fn load<T: for<'de> Deserialize<'de>>(src: &Experiments, name: &str) -> Result<T, Error> {
    let rel = format!("{DIR}/{name}");
    let text = src.read(&rel).map_err(|e| Error::Spec {
        file: src.origin(&rel),
        message: e.to_string(),
    })?;
    parse(name, &text)
}

fn invalid(file: &str, key: &str, message: &str) -> Error {
    Error::Invalid {
        file: file.into(),
        key: key.into(),
        message: message.into(),
    }
}

fn check_positive(file: &str, key: &str, v: f64) -> Result<(), Error> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(invalid(file, key, &format!("must be positive, got {v}")))
    }
}

fn check_tolerance(file: &str, key: &str, v: f64) -> Result<(), Error> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(invalid(file, key, &format!("must be >= 0, got {v}")))
    }
}

fn check_nonempty<T>(file: &str, key: &str, v: &[T]) -> Result<(), Error> {
    if v.is_empty() {
        Err(invalid(file, key, "must not be empty"))
    } else {
        Ok(())
    }
}

fn check_preset(file: &str, name: &str) -> Result<(), Error> {
    match crate::sim::Preset::by_name(name) {
        Some(_) => Ok(()),
        None => Err(invalid(
            file,
            "preset",
            &format!("unknown preset {name:?} (known: vax-locus-1989)"),
        )),
    }
}

/// Trials must leave a steady state after the warm-up quarter.
fn check_trials(file: &str, key: &str, v: u64) -> Result<(), Error> {
    if v >= 8 {
        Ok(())
    } else {
        Err(invalid(file, key, &format!("must be at least 8, got {v}")))
    }
}

impl Table3Spec {
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        check_preset(file, &self.preset)?;
        check_tolerance(file, "tolerance_pct", self.tolerance_pct)?;
        check_positive(file, "paper.total_ms", self.paper.total_ms)
    }
}

impl WorstCaseSpec {
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        check_preset(file, &self.preset)?;
        check_trials(file, "trials", self.trials)?;
        check_trials(file, "quick_trials", self.quick_trials)?;
        check_positive(file, "seeds", self.seeds as f64)?;
        check_positive(file, "quick_seeds", self.quick_seeds as f64)?;
        check_tolerance(file, "count_tolerance_pct", self.count_tolerance_pct)?;
        check_tolerance(file, "rate_tolerance_pct", self.rate_tolerance_pct)
    }
}

impl Fig7Spec {
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        check_preset(file, &self.preset)?;
        check_nonempty(file, "deltas", &self.deltas)?;
        check_nonempty(file, "quick_deltas", &self.quick_deltas)?;
        check_trials(file, "trials", self.trials)?;
        check_trials(file, "quick_trials", self.quick_trials)?;
        check_positive(file, "seeds", self.seeds as f64)?;
        check_positive(file, "quick_seeds", self.quick_seeds as f64)?;
        check_tolerance(file, "rate_tolerance_pct", self.rate_tolerance_pct)
    }
}

impl Fig8Spec {
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        check_preset(file, &self.preset)?;
        check_nonempty(file, "deltas", &self.deltas)?;
        check_nonempty(file, "quick_deltas", &self.quick_deltas)?;
        check_positive(file, "loop_s", self.loop_s)?;
        check_positive(file, "quick_loop_s", self.quick_loop_s)?;
        check_tolerance(file, "stagger_s", self.stagger_s)?;
        check_positive(file, "seeds", self.seeds as f64)?;
        check_positive(file, "quick_seeds", self.quick_seeds as f64)?;
        check_tolerance(file, "rate_tolerance_pct", self.rate_tolerance_pct)?;
        check_tolerance(
            file,
            "peak_delta_tolerance_pct",
            self.peak_delta_tolerance_pct,
        )
    }
}

impl NSiteSpec {
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        check_preset(file, &self.preset)?;
        check_nonempty(file, "sites", &self.sites)?;
        if let Some(n) = self
            .sites
            .iter()
            .chain(&self.quick_sites)
            .find(|n| **n < 2 || **n > 64)
        {
            return Err(invalid(
                file,
                "sites",
                &format!("each must be in 2..=64, got {n}"),
            ));
        }
        if self.delta_ticks == 0 {
            // At Δ = 0 a site's read copy is taken before its process runs:
            // the N-site token ring livelocks (the thrashing Δ exists for).
            return Err(invalid(
                file,
                "delta_ticks",
                "must be at least 1 (Δ = 0 thrashes the ring)",
            ));
        }
        check_trials(file, "rounds", self.rounds)?;
        check_trials(file, "quick_rounds", self.quick_rounds)
    }
}
