//! The experiment specs of `experiments/fleisch89/paper-data/*.toml`, one
//! per table or figure, with the paper's numbers beside the parameters.
//! They are reproduce-only (`mmulab reproduce fleisch89` reads them; they
//! are not `mmulab run` specs), hence `paper-data/`. Unknown keys are
//! errors that name the key (serde's `deny_unknown_fields`); impossible
//! values are errors that name the key too.

use std::collections::BTreeMap;

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
/// Fig. 8's setup and the paper's numbers. The Δ swept and the seeds are
/// the sweep file's (`experiments/fleisch89/fig8.sweep.toml`), whose base
/// this is: each of its tasks is one [`ReadWritersRun`].
pub struct Fig8Spec {
    pub artefact: String,
    pub preset: String,
    pub loop_s: f64,
    pub third_site_library: bool,
    pub stagger_s: f64,
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
        message: clip_lines(&e.to_string()),
    })
}

/// The most characters of one line of a parse error: the line of the spec
/// it quotes is cut, as every echo of input is (issue 24).
const ECHO_CHARS: usize = 200;

fn clip_lines(msg: &str) -> String {
    msg.split('\n')
        .map(|l| {
            let n = l.chars().count();
            if n <= ECHO_CHARS {
                l.to_string()
            } else {
                let head: String = l.chars().take(ECHO_CHARS).collect();
                format!("{head}… ({n} characters)")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
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

/// Loads and checks every spec of `fleisch89/paper-data/` (ranges and the
/// work budget), so that `reproduce fleisch89` refuses a bad one before
/// anything runs, not after the stages before it.
pub fn check_all(src: &Experiments) -> Result<(), Error> {
    load::<Table3Spec>(src, "table3.toml")?.validate("table3.toml")?;
    load::<WorstCaseSpec>(src, "worst-case.toml")?.validate("worst-case.toml")?;
    load::<Fig7Spec>(src, "fig7.toml")?.validate("fig7.toml")?;
    load::<Fig8Spec>(src, "fig8.toml")?.validate("fig8.toml")?;
    load::<NSiteSpec>(src, "nsite.toml")?.validate("nsite.toml")
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

/// The most simulated operations a spec may ask for: 10^12, the default
/// of the other specs' `--max-work` (`mmulab_experiment::budget`), about
/// nine hours of simulation on one core. A fleisch89 spec above it is
/// refused before anything runs, naming the key that drives it.
pub const MAX_WORK: u64 = 1_000_000_000_000;

/// Simulated operations per ping-pong cycle, per §7.2 trial, per token
/// round and site: an upper bound of the events one costs (its 9 messages,
/// their interrupts, faults and timers, §7.2), for the work estimate.
const EVENTS_PER_CYCLE: u64 = 64;

/// Simulated operations per simulated second of the read-writers' loop: a
/// VAX 11/750 executes under 10^6 instructions a second, and each is at
/// most one operation of the simulation.
pub const EVENTS_PER_SECOND: f64 = 1e6;

/// The most seeds (or trials, rounds) one spec key may ask for, and the
/// longest list of Δ or site counts: far above any figure's, below what
/// would only spin.
const MAX_COUNT: u64 = 1_000_000;
const MAX_LIST: usize = 1_000;

/// The largest Δ, in clock ticks: one simulated day at 60 ticks a second
/// (Fig. 8's axis ends at 1,200).
const MAX_DELTA_TICKS: u32 = 60 * 86_400;

/// The longest read-writers' loop, simulated seconds (Fig. 8 uses 10).
const MAX_LOOP_S: f64 = 3_600.0;

// One read-writers run, the longest loop, stays within the work budget
// (a sweep of many is bounded by its task count, `mmulab sweep`'s).
const _: () = assert!(MAX_LOOP_S * EVENTS_PER_SECOND <= MAX_WORK as f64);

fn check_count(file: &str, key: &str, v: u64) -> Result<(), Error> {
    if v <= MAX_COUNT {
        Ok(())
    } else {
        Err(invalid(
            file,
            key,
            &format!("must be at most {MAX_COUNT}, got {v}"),
        ))
    }
}

fn check_deltas(file: &str, key: &str, v: &[u32]) -> Result<(), Error> {
    check_nonempty(file, key, v)?;
    if v.len() > MAX_LIST {
        return Err(invalid(
            file,
            key,
            &format!("at most {MAX_LIST} values, got {}", v.len()),
        ));
    }
    match v.iter().find(|d| **d > MAX_DELTA_TICKS) {
        Some(d) => Err(invalid(
            file,
            key,
            &format!("each Δ must be at most {MAX_DELTA_TICKS} ticks (a simulated day), got {d}"),
        )),
        None => Ok(()),
    }
}

/// Refuses an estimate above [`MAX_WORK`], naming the key that drives it
/// and the product (`how`) it came from.
fn check_work(file: &str, key: &str, work: f64, how: &str) -> Result<(), Error> {
    if work <= MAX_WORK as f64 {
        Ok(())
    } else {
        Err(invalid(
            file,
            key,
            &format!(
                "about {work:.1e} simulated operations ({how}), above the budget of {:.0e} (the other specs' --max-work default)",
                MAX_WORK as f64
            ),
        ))
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
        for (k, v) in [
            ("trials", self.trials),
            ("quick_trials", self.quick_trials),
            ("seeds", self.seeds),
            ("quick_seeds", self.quick_seeds),
        ] {
            check_count(file, k, v)?;
        }
        check_tolerance(file, "count_tolerance_pct", self.count_tolerance_pct)?;
        check_tolerance(file, "rate_tolerance_pct", self.rate_tolerance_pct)?;
        // A distributed and two single-site runs per seed.
        let check = |key: &str, trials: u64, seeds: u64| {
            check_work(
                file,
                key,
                3.0 * (trials * seeds * EVENTS_PER_CYCLE) as f64,
                &format!("3 runs x {trials} trials x {seeds} seeds x {EVENTS_PER_CYCLE} each"),
            )
        };
        check("trials", self.trials, self.seeds)?;
        check("quick_trials", self.quick_trials, self.quick_seeds)
    }
}

impl Fig7Spec {
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        check_preset(file, &self.preset)?;
        check_deltas(file, "deltas", &self.deltas)?;
        check_deltas(file, "quick_deltas", &self.quick_deltas)?;
        check_trials(file, "trials", self.trials)?;
        check_trials(file, "quick_trials", self.quick_trials)?;
        check_positive(file, "seeds", self.seeds as f64)?;
        check_positive(file, "quick_seeds", self.quick_seeds as f64)?;
        for (k, v) in [
            ("trials", self.trials),
            ("quick_trials", self.quick_trials),
            ("seeds", self.seeds),
            ("quick_seeds", self.quick_seeds),
        ] {
            check_count(file, k, v)?;
        }
        check_tolerance(file, "rate_tolerance_pct", self.rate_tolerance_pct)?;
        // Each Δ with and without yield.
        let check = |key: &str, deltas: usize, trials: u64, seeds: u64| {
            check_work(
                file,
                key,
                2.0 * deltas as f64 * (trials * seeds * EVENTS_PER_CYCLE) as f64,
                &format!(
                    "2 x {deltas} Δ x {trials} trials x {seeds} seeds x {EVENTS_PER_CYCLE} each"
                ),
            )
        };
        check("trials", self.deltas.len(), self.trials, self.seeds)?;
        check(
            "quick_trials",
            self.quick_deltas.len(),
            self.quick_trials,
            self.quick_seeds,
        )
    }
}

impl Fig8Spec {
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        check_preset(file, &self.preset)?;
        check_loop(file, "loop_s", self.loop_s)?;
        check_stagger(file, "stagger_s", self.stagger_s)?;
        check_tolerance(file, "rate_tolerance_pct", self.rate_tolerance_pct)?;
        check_tolerance(
            file,
            "peak_delta_tolerance_pct",
            self.peak_delta_tolerance_pct,
        )
    }
}

/// A read-writers' loop: positive, at most [`MAX_LOOP_S`]. One run is then
/// at most 3.6e9 simulated operations, below [`MAX_WORK`].
fn check_loop(file: &str, key: &str, v: f64) -> Result<(), Error> {
    check_positive(file, key, v)?;
    check_at_most_a_loop(file, key, v)
}

fn check_stagger(file: &str, key: &str, v: f64) -> Result<(), Error> {
    check_tolerance(file, key, v)?;
    check_at_most_a_loop(file, key, v)
}

fn check_at_most_a_loop(file: &str, key: &str, v: f64) -> Result<(), Error> {
    if v > MAX_LOOP_S {
        return Err(invalid(
            file,
            key,
            &format!("must be at most {MAX_LOOP_S} simulated seconds, got {v}"),
        ));
    }
    Ok(())
}

/// One run of §8's two conflicting read-writers (Fig. 8's program): a
/// task of a fleisch89 sweep file (`kind = "mirage-read-writers"`, e.g.
/// `experiments/fleisch89/fig8.sweep.toml`). Its base is a Fig. 8 spec
/// ([`Fig8Spec`], `paper-data/fig8.toml`), which gives `preset`, `loop_s`,
/// `third_site_library` and `stagger_s`; a point sets `delta_ticks` and
/// may set any of the others ([`ReadWritersRun::KEYS`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ReadWritersRun {
    pub preset: String,
    pub delta_ticks: u32,
    pub loop_s: f64,
    pub third_site_library: bool,
    pub stagger_s: f64,
}

impl ReadWritersRun {
    /// The keys a sweep point may set.
    pub const KEYS: [&'static str; 5] = [
        "delta_ticks",
        "loop_s",
        "preset",
        "stagger_s",
        "third_site_library",
    ];

    /// The run of `base` (a Fig. 8 spec's text; `file` names it) with a
    /// point's `values`. Errors name the key.
    pub fn of(
        file: &str,
        base: &str,
        values: &BTreeMap<String, toml::Value>,
    ) -> Result<ReadWritersRun, Error> {
        let s: Fig8Spec = parse(file, base)?;
        s.validate(file)?;
        let mut run = ReadWritersRun {
            preset: s.preset,
            delta_ticks: 0,
            loop_s: s.loop_s,
            third_site_library: s.third_site_library,
            stagger_s: s.stagger_s,
        };
        let mut delta = None;
        for (k, v) in values {
            let bad = |what: &str| {
                invalid(
                    file,
                    k,
                    &format!("expected {what}, got {}", clip_lines(&v.to_string())),
                )
            };
            let number = || match v {
                toml::Value::Float(f) => Some(*f),
                toml::Value::Integer(i) => Some(*i as f64),
                _ => None,
            };
            match k.as_str() {
                "delta_ticks" => {
                    let d = v
                        .as_integer()
                        .filter(|d| (0..=i64::from(MAX_DELTA_TICKS)).contains(d))
                        .ok_or_else(|| {
                            bad(&format!(
                                "a whole number of ticks in 0..={MAX_DELTA_TICKS} (a simulated day)"
                            ))
                        })?;
                    delta = Some(d as u32);
                }
                "loop_s" => {
                    run.loop_s = number().ok_or_else(|| bad("a number of seconds"))?;
                    check_loop(file, k, run.loop_s)?;
                }
                "stagger_s" => {
                    run.stagger_s = number().ok_or_else(|| bad("a number of seconds"))?;
                    check_stagger(file, k, run.stagger_s)?;
                }
                "third_site_library" => {
                    run.third_site_library = v.as_bool().ok_or_else(|| bad("true or false"))?;
                }
                "preset" => {
                    run.preset = v
                        .as_str()
                        .ok_or_else(|| bad("a preset's name"))?
                        .to_string();
                    check_preset(file, &run.preset)?;
                }
                _ => {
                    return Err(invalid(
                        file,
                        k,
                        &format!(
                            "not a key of a read-writers run (its keys: {})",
                            Self::KEYS.join(", ")
                        ),
                    ));
                }
            }
        }
        run.delta_ticks = delta.ok_or_else(|| {
            invalid(
                file,
                "delta_ticks",
                "missing: the sweep's grid or points set Δ (in ticks of 1/60 s)",
            )
        })?;
        Ok(run)
    }

    /// The simulated operations one run may take, for a sweep's work
    /// budget: its loop's seconds x [`EVENTS_PER_SECOND`].
    pub fn work(&self) -> f64 {
        self.loop_s * EVENTS_PER_SECOND
    }

    /// Runs it with `seed` (which draws the processes' start phases).
    pub fn run(&self, seed: u64) -> Result<crate::runs::ReadWritersResult, String> {
        let p = crate::sim::Preset::by_name(&self.preset).expect("validated preset");
        let setup = crate::runs::ReadWritersSetup {
            third_site_library: self.third_site_library,
            stagger_s: self.stagger_s,
        };
        crate::runs::read_writers_run(&p, self.delta_ticks, self.loop_s, &setup, seed)
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
        if self.delta_ticks > MAX_DELTA_TICKS {
            return Err(invalid(
                file,
                "delta_ticks",
                &format!(
                    "must be at most {MAX_DELTA_TICKS} ticks (a simulated day), got {}",
                    self.delta_ticks
                ),
            ));
        }
        if self.sites.len() > MAX_LIST || self.quick_sites.len() > MAX_LIST {
            return Err(invalid(
                file,
                "sites",
                &format!("at most {MAX_LIST} values"),
            ));
        }
        check_trials(file, "rounds", self.rounds)?;
        check_trials(file, "quick_rounds", self.quick_rounds)?;
        check_count(file, "rounds", self.rounds)?;
        check_count(file, "quick_rounds", self.quick_rounds)?;
        // Each round passes the token through every site.
        let check = |key: &str, sites: &[u64], rounds: u64| {
            let total: u64 = sites.iter().sum();
            check_work(
                file,
                key,
                (total * rounds * EVENTS_PER_CYCLE) as f64,
                &format!("{total} sites in all x {rounds} rounds x {EVENTS_PER_CYCLE} each"),
            )
        };
        check("rounds", &self.sites, self.rounds)?;
        check("quick_rounds", &self.quick_sites, self.quick_rounds)
    }
}
