//! `mmulab reproduce uhlig94`: software-managed TLBs (Uhlig et al., TOCS 1994).
//!
//! Rows by basis (docs/papers/uhlig94.md gives each and why):
//! * `arithmetic`: the paper's derived tables recomputed from its own published numbers
//!   (`experiments/uhlig94/paper-data/tables.toml`): Table VI is Table V's counts × Table
//!   III's cycles × 60 ns, cell by cell, to the printed digit; so are Table II's ratios,
//!   Table VII and §4.2's shares. No simulation: they check the transcription and the
//!   paper's sums, never the model.
//! * `emergent`: synthetic stand-ins for Table I's benchmarks run on `mmulab-swtlb`'s OS
//!   models and R2000 TLB (`paper-data/shape.toml`, three seeds averaged), judged where the
//!   simulated number is not an input read back: the ratios between systems (Tables II, V,
//!   §4.2.1), the order of Table VIII's placements, Figs. 6, 8, 10, 12-14's claims, and
//!   the partition points set by the page-table layout (`mmulab_swtlb::layout`: Fig. 5's
//!   knees, Figs. 7 and 9's optima, the stand-ins' Table IX static optima; the live PTE
//!   counts in their notes are computed from the layout's addresses). In the full run,
//!   real programs traced under Valgrind lackey (gzip, dd, syscall microbenchmarks) drive
//!   the same models; `--quick` never captures.
//! * `input`: rows that follow from a configuration (Mach's copy-on-write Modify misses,
//!   compress's stride);
//! * `calibrated`: Table IX's dynamic column on the stand-ins, whose hill-climbing
//!   threshold was chosen on them (`[calibration]` of shape.toml).

use std::collections::BTreeMap;
use std::path::Path;

use mmulab_engine::mean_ci95;
use mmulab_report::{Experiments, LinePlot, ReproRow, ReproTable, RowKind, Series};
use mmulab_swtlb::costs::CostPreset;
use mmulab_swtlb::layout::{TaskSpan, live_ptes};
use mmulab_swtlb::os::{AFS_TASK, OsKind, OsModel, OsParams, SysRef, UNIX_SERVER, X_SERVER};
use mmulab_swtlb::r2000;
use mmulab_swtlb::sim::{DynamicPartition, Outcome, Placement, TlbSetup, simulate_trap};
use mmulab_swtlb::tlb::Repl;
use mmulab_swtlb::workload::{
    APP_TASK, CapturedEvents, Event, FIRST_TOKEN_SERVER, Workload, token_ring,
};
use mmulab_swtlb::{MissType, simulate_direct};
use rayon::prelude::*;

use crate::spec::SpecError;

mod captures;
mod design_space;
mod paper_tables;
mod stages;
mod trap_run;

use captures::*;
use design_space::*;
use paper_tables::*;
use stages::*;
use trap_run::*;
pub use trap_run::{SYSTEMS, TrapRun};

/// The simulated rows' inputs.
struct Shape {
    seeds: Vec<u64>,
    real_slots: usize,
    quick_scale: f64,
    os: BTreeMap<&'static str, OsParams>,
    workloads: BTreeMap<String, Workload>,
    dynamic: DynamicPartition,
    ring_servers: Vec<u16>,
    ring_pages: u64,
    ring_rounds: u64,
    capture: CaptureCfg,
    /// `[calibration]`: each fitted spec key and the artefact it was fitted to.
    calibration: BTreeMap<String, String>,
    paper: toml::Table,
    origin: String,
}

/// `[capture]` of shape.toml: which Table I workloads the full run captures under
/// Valgrind lackey (`--quick` never captures).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CaptureCfg {
    /// Capture at all (tests turn it off: a capture takes seconds).
    enabled: bool,
    /// Workloads to capture, of `compress`, `IOzone`, `ousterhout`, `mab`.
    workloads: Vec<String>,
    /// Iterations of each ousterhout microbenchmark.
    ousterhout_iterations: u32,
    /// Megabytes dd writes and reads back (IOzone; the paper's Table I: 10 MB).
    iozone_mb: u32,
}

fn from_toml<T: serde::de::DeserializeOwned>(v: toml::Value, what: &str) -> Result<T, SpecError> {
    v.try_into()
        .map_err(|e: toml::de::Error| invalid(format!("{what}: {e}")))
}

impl Shape {
    fn load(src: &Experiments, rel: &str, quick: bool) -> Result<Shape, SpecError> {
        let origin = src.origin(rel);
        let text = src
            .read(rel)
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
        Shape::parse(&text, &origin, quick)
    }

    /// shape.toml's text; `origin` names it in errors.
    fn parse(text: &str, origin: &str, quick: bool) -> Result<Shape, SpecError> {
        let origin = origin.to_string();
        let mut doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| invalid(format!("{origin}: {e}")))?;
        let known = [
            "seeds",
            "real_slots",
            "quick_scale",
            "os",
            "workloads",
            "dynamic",
            "token_ring",
            "capture",
            "calibration",
            "paper",
        ];
        if let Some(k) = doc.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(invalid(format!(
                "{origin}: {k}: unknown key (expected one of {known:?})"
            )));
        }
        let top = Keys {
            t: &doc,
            origin: origin.clone(),
        };
        let mut seeds: Vec<u64> = top.nums("seeds")?.into_iter().map(|s| s as u64).collect();
        if seeds.is_empty() {
            return Err(invalid(format!("{origin}: seeds: need at least one")));
        }
        if quick {
            // --quick: the first seed only (scaled references would inflate the share of
            // compulsory misses, which several claims are about).
            seeds.truncate(1);
        }
        let real_slots = top.num("real_slots")? as usize;
        let quick_scale = top.num("quick_scale")?;
        let scale = if quick { quick_scale } else { 1.0 };
        if !(scale > 0.0 && scale <= 1.0) {
            return Err(invalid(format!("{origin}: quick_scale: must be in (0, 1]")));
        }
        let mut os = BTreeMap::new();
        let os_t = top.sub("os")?;
        if let Some(k) = os_t.t.keys().find(|k| OsKind::from_key(k).is_none()) {
            return Err(invalid(format!(
                "{origin}: os.{k}: unknown OS (ultrix, osf1, mach3, afsin, afsout)"
            )));
        }
        for kind in OsKind::ALL {
            let mut base = toml::Table::try_from(OsParams::preset(kind)).expect("serialise");
            if let Some(toml::Value::Table(over)) = os_t.t.get(kind.key()) {
                for (k, v) in over {
                    if !base.contains_key(k) {
                        return Err(invalid(format!(
                            "{origin}: os.{}.{k}: unknown key",
                            kind.key()
                        )));
                    }
                    base.insert(k.clone(), v.clone());
                }
            }
            let what = format!("{origin}: os.{}", kind.key());
            let p: OsParams = from_toml(toml::Value::Table(base), &what)?;
            p.validate(&what).map_err(invalid)?;
            os.insert(kind.key(), p);
        }
        let mut workloads = BTreeMap::new();
        for (name, v) in top.sub("workloads")?.t {
            let mut t = match v {
                toml::Value::Table(t) => t.clone(),
                _ => {
                    return Err(invalid(format!(
                        "{origin}: workloads.{name}: expected a table"
                    )));
                }
            };
            t.insert("name".into(), toml::Value::String(name.clone()));
            let what = format!("{origin}: workloads.{name}");
            let mut w: Workload = from_toml(toml::Value::Table(t), &what)?;
            w.refs = ((w.refs as f64 * scale) as u64).max(1000);
            w.validate(&what).map_err(invalid)?;
            workloads.insert(name.clone(), w);
        }
        for need in ALL_WORKLOADS {
            if !workloads.contains_key(need) {
                return Err(invalid(format!(
                    "{origin}: workloads.{need}: missing (a Table I stand-in the rows need)"
                )));
            }
        }
        let dynamic: DynamicPartition =
            from_toml(top.get("dynamic")?.clone(), &format!("{origin}: dynamic"))?;
        let ring = top.sub("token_ring")?;
        let ring_servers: Vec<u16> = ring
            .nums("servers")?
            .into_iter()
            .map(|s| s as u16)
            .collect();
        if ring_servers.is_empty() || ring_servers.iter().any(|&s| s == 0 || s > 64) {
            return Err(invalid(format!(
                "{origin}: token_ring.servers: 1-64 servers each"
            )));
        }
        let ring_pages = ring.num("pages")? as u64;
        let ring_rounds = ((ring.num("rounds")? * scale) as u64).max(10);
        let capture: CaptureCfg =
            from_toml(top.get("capture")?.clone(), &format!("{origin}: capture"))?;
        if let Some(w) = capture
            .workloads
            .iter()
            .find(|w| !CAPTURABLE.contains(&w.as_str()))
        {
            return Err(invalid(format!(
                "{origin}: capture.workloads: `{w}` cannot be captured (compress, IOzone, ousterhout, mab)"
            )));
        }
        let calibration: BTreeMap<String, String> = from_toml(
            top.get("calibration")?.clone(),
            &format!("{origin}: calibration"),
        )?;
        for key in calibration.keys() {
            let mut t = &doc;
            let parts: Vec<&str> = key.split('.').collect();
            for part in &parts[..parts.len() - 1] {
                t = t.get(*part).and_then(|v| v.as_table()).ok_or_else(|| {
                    invalid(format!("{origin}: calibration: `{key}` is not set here"))
                })?;
            }
            if !t.contains_key(*parts.last().expect("split gives one")) {
                return Err(invalid(format!(
                    "{origin}: calibration: `{key}` is not set here"
                )));
            }
        }
        let paper = match doc.remove("paper") {
            Some(toml::Value::Table(t)) => t,
            _ => {
                return Err(invalid(format!(
                    "{origin}: paper: missing table of the paper's numbers"
                )));
            }
        };
        Ok(Shape {
            seeds,
            real_slots,
            quick_scale,
            os,
            workloads,
            dynamic,
            ring_servers,
            ring_pages,
            ring_rounds,
            capture,
            calibration,
            paper,
            origin,
        })
    }

    fn paper(&self) -> Keys<'_> {
        Keys {
            t: &self.paper,
            origin: format!("{}: paper", self.origin),
        }
    }

    fn costs(&self, os: OsKind) -> CostPreset {
        CostPreset::decstation3100_1994(os.cost_column())
    }

    fn stream(&self, os: OsKind, events: &[Event], seed: u64) -> Vec<SysRef> {
        OsModel::new(os, self.os[os.key()].clone(), seed).expand(events)
    }

    /// Seconds (mean over seeds, summed over `workloads`) and summed outcomes, one per
    /// setup, in trap mode (the Tapeworm way: one pass, every configuration).
    fn run(
        &self,
        os: OsKind,
        workloads: &[&str],
        setups: &[TlbSetup],
        costs: &CostPreset,
    ) -> Result<Vec<Agg>, SpecError> {
        let jobs: Vec<(&str, u64)> = workloads
            .iter()
            .flat_map(|w| self.seeds.iter().map(move |s| (*w, *s)))
            .collect();
        let results: Vec<Vec<Outcome>> = jobs
            .par_iter()
            .map(|(w, seed)| {
                let ev = self.workloads[*w].generate(*seed);
                let s = self.stream(os, &ev, *seed);
                simulate_trap(&s, os, setups, costs, *seed, self.real_slots).map(|(o, _)| o)
            })
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(format!("{}: {e}", self.origin)))?;
        Ok(aggregate(&results, setups.len(), self.seeds.len(), costs))
    }
}

/// One seed's outcome, summed over the workloads run.
#[derive(Clone, Debug, Default)]
struct SeedAgg {
    seconds: f64,
    /// fn. 8's counting overhead, included in `seconds`.
    extra_seconds: f64,
    counts: [f64; 6],
    secs_by_type: [f64; 6],
}

/// Outcomes of one setup: the mean over seeds (each summed over workloads), and each
/// seed's.
#[derive(Clone, Debug, Default)]
struct Agg {
    seconds: f64,
    extra_seconds: f64,
    counts: [f64; 6],
    secs_by_type: [f64; 6],
    per_seed: Vec<SeedAgg>,
}

impl Agg {
    /// The mean of `f` over seeds and its 95 % CI (`None` with one seed).
    fn ci(&self, f: impl Fn(&SeedAgg) -> f64) -> (f64, Option<(f64, f64)>) {
        let xs: Vec<f64> = self.per_seed.iter().map(f).collect();
        let (m, lo, hi) = mean_ci95(&xs);
        (m, (xs.len() > 1).then_some((lo, hi)))
    }
}

/// `results[j]` is seed `j % seeds`'s outcome of one workload (workloads outer, seeds
/// inner, as [`Shape::run`] orders its jobs); one [`Agg`] per setup.
fn aggregate(results: &[Vec<Outcome>], n: usize, seeds: usize, costs: &CostPreset) -> Vec<Agg> {
    (0..n)
        .map(|i| {
            let mut per_seed = vec![SeedAgg::default(); seeds];
            for (j, r) in results.iter().enumerate() {
                let s = &mut per_seed[j % seeds];
                s.seconds += r[i].seconds(costs);
                s.extra_seconds += r[i].extra_cycles * costs.ns_per_cycle * 1e-9;
                for t in MissType::ALL {
                    s.counts[t.index()] += r[i].count(t) as f64;
                    s.secs_by_type[t.index()] += r[i].seconds_of(t, costs);
                }
            }
            let k = seeds as f64;
            let mut a = Agg::default();
            for s in &per_seed {
                a.seconds += s.seconds / k;
                a.extra_seconds += s.extra_seconds / k;
                for t in 0..6 {
                    a.counts[t] += s.counts[t] / k;
                    a.secs_by_type[t] += s.secs_by_type[t] / k;
                }
            }
            a.per_seed = per_seed;
            a
        })
        .collect()
}

/// The mean over seeds of `f(a) / f(b)` (seed by seed: the two ran the same events) and
/// its 95 % CI where seeds repeat.
fn seed_ratio(a: &Agg, b: &Agg, f: impl Fn(&SeedAgg) -> f64) -> (f64, Option<(f64, f64)>) {
    let xs: Vec<f64> = a
        .per_seed
        .iter()
        .zip(&b.per_seed)
        .map(|(x, y)| f(x) / f(y).max(1e-12))
        .collect();
    let (m, lo, hi) = mean_ci95(&xs);
    (m, (xs.len() > 1).then_some((lo, hi)))
}

/// Sets the CI of `r` where there is one.
fn with_ci(r: ReproRow, ci: Option<(f64, f64)>) -> ReproRow {
    match ci {
        Some((lo, hi)) => r.ci(lo, hi),
        None => r,
    }
}

/// Measured points over `xs` with their CI bars (none with one seed).
fn ci_series(name: &str, xs: &[usize], aggs: &[Agg], f: impl Fn(&SeedAgg) -> f64) -> Series {
    let mut pts = Vec::new();
    let mut bars = Vec::new();
    for (x, a) in xs.iter().zip(aggs) {
        let (m, ci) = a.ci(&f);
        pts.push((*x as f64, m));
        bars.push(ci.unwrap_or((m, m)));
    }
    Series::with_ci(name, pts, bars)
}

/// The tasks whose pages `os` touches on a stand-in, as `layout.rs` spans: the
/// application (the stand-ins' default segment sizes), under Mach 3.0 the Unix server
/// (§4.2.2; with Mach3+AFSin's cache-manager data), under Mach3+AFSout the AFS task
/// (§4.2.3), and the X server where the workload makes display calls (Table IV). The
/// servers' sizes are `OsParams::preset`'s; the stack is the two pages the models touch.
fn live_tasks(os: OsKind, display: bool) -> Vec<TaskSpan> {
    let p = OsParams::preset(os);
    let w = Workload::named("live");
    let mut t = vec![TaskSpan {
        task: APP_TASK,
        text: w.text_pages,
        data: w.data_pages,
        stack: 2,
    }];
    if os.is_mach() {
        let afs_in = if os == OsKind::Mach3AfsIn {
            p.afs_data_pages
        } else {
            0
        };
        t.push(TaskSpan {
            task: UNIX_SERVER,
            text: p.server_text_pages,
            data: p.server_data_pages + afs_in,
            stack: 2,
        });
    }
    if os == OsKind::Mach3AfsOut {
        t.push(TaskSpan {
            task: AFS_TASK,
            text: p.server_text_pages / 2,
            data: p.afs_data_pages,
            stack: 2,
        });
    }
    if display {
        t.push(TaskSpan {
            task: X_SERVER,
            text: p.x_text_pages,
            data: p.x_data_pages,
            stack: 2,
        });
    }
    t
}

/// How many L2 PTEs `os` keeps live on a stand-in: computed by `layout::live_ptes` from
/// the addresses the kernel's per-entry structures and [`live_tasks`] occupy (no count is
/// written down; with the MIPS layout it comes to the kernel's two and three per task).
fn live_l2(os: OsKind, display: bool) -> usize {
    live_ptes(&live_tasks(os, display), 0, false).0
}

/// The L2 and L3 PTEs a stand-in keeps live under Mach 3.0 (Table IX's runs, policy B),
/// computed by `layout::live_ptes` over [`live_tasks`] and Mach's mapped kernel data pool.
fn live_lower_b(w: &Workload) -> (usize, usize) {
    let display = w.display_fraction > 0.0;
    let p = OsParams::preset(OsKind::Mach3);
    live_ptes(
        &live_tasks(OsKind::Mach3, display),
        p.kernel_data_pages,
        true,
    )
}

/// Fig. 5's knee: the first lower-slot count of `lowers` at which the L2
/// miss time `l2` (one value per count) falls to 5 % of its largest value,
/// or `none` when it never does.
fn l2_knee(lowers: &[usize], l2: &[f64], none: usize) -> usize {
    let max = l2.iter().cloned().fold(0.0, f64::max);
    lowers
        .iter()
        .zip(l2)
        .find(|(_, v)| **v <= 0.05 * max)
        .map(|(l, _)| *l)
        .unwrap_or(none)
}

/// The first partition point of `lowers` that holds `n` L2 PTEs.
fn first_holding(lowers: &[usize], n: usize) -> usize {
    lowers.iter().copied().find(|&l| l >= n).unwrap_or(n)
}

const CEILING_NOTE: &str = "under D an L2 miss beyond the first needs a random fill to have evicted that L2 PTE \
     since its last use; with k = 8 live L2 PTEs (Mach 3.0's count, fn. 7) among 64 slots a fill evicts one with \
     probability k/64, so D adds at most k/(64-2k) L2 (+ L3) misses per fill: \
     D/A <= 1 + k/(64-2k) x (L2 + L3 cycles) / (A's cycles per fill)";

/// The most D can cost over A when D's only extra misses are L2 PTEs (and the L3 misses
/// under them) evicted by random fills: `fills` L1U+L1K+L2+L3 misses costing `a_seconds`
/// at A.
fn d_over_a_ceiling(fills: f64, a_seconds: f64, costs: &CostPreset) -> f64 {
    // Mach 3.0's live L2 PTEs as the layout gives them (8: fn. 7 and §5.2.1).
    let k = live_l2(OsKind::Mach3, false) as f64;
    let extra_per_fill =
        k / (64.0 - 2.0 * k) * (costs.cycles_of(MissType::L2) + costs.cycles_of(MissType::L3));
    let a_cycles = a_seconds / (costs.ns_per_cycle * 1e-9);
    1.0 + extra_per_fill * fills / a_cycles.max(1.0)
}

/// Where Table IX's rows go and what they are.
struct Table9 {
    /// The rows' artefact ("Table IX", or a captured trace's own).
    art: String,
    /// The dynamic column is `calibrated` (its threshold was chosen on these runs).
    dynamic_fitted: bool,
    /// The live L2 and L3 PTEs of a stand-in as `layout.rs` computes them (shown in the
    /// static optimum's note). `None` for a captured trace, whose processes come and go.
    live_lower: Option<(usize, usize)>,
    workload: String,
    note: String,
}

/// Table IX's rows for one workload: `r` holds policy B at each of `lowers` and then the
/// dynamic setup; `paper` is the paper's fixed, static, static point, dynamic.
fn table9_rows(
    table: &mut ReproTable,
    t9: &Table9,
    r: &[Agg],
    lowers: &[usize],
    paper: &[f64],
    optimum_tol: f64,
) {
    let at8 = lowers.iter().position(|&l| l == 8).expect("8");
    let fixed = r[at8].seconds;
    let si = (0..lowers.len()).fold(0, |b, i| if r[i].seconds < r[b].seconds { i } else { b });
    let stat = r[si].seconds;
    // Table IX leaves out fn. 8's counting cost ("it should be noted, however, that
    // there is an additional cost"): judged without it, shown with it.
    let dynamic_agg = &r[lowers.len()];
    let dyn_with = dynamic_agg.seconds;
    let (dynamic, dyn_ci) = dynamic_agg.ci(|s| s.seconds - s.extra_seconds);
    let w = t9.workload.as_str();
    let (fixed_m, fixed_ci) = r[at8].ci(|s| s.seconds);
    debug_assert!((fixed_m - fixed).abs() <= 1e-9 * fixed.abs().max(1.0));
    table.push(with_ci(
        ReproRow::plot_only(
            &t9.art,
            "fixed partition time",
            paper.first().copied(),
            fixed,
            &t9.note,
        )
        .unit("s")
        .at("workload", w)
        .at("lower_slots", 8)
        .at("policy", "B")
        .emergent(),
        fixed_ci,
    ));
    table.push(with_ci(
        ReproRow::plot_only(
            &t9.art,
            "static optimum time",
            paper.get(1).copied(),
            stat,
            &format!("at {} lower slots", lowers[si]),
        )
        .unit("s")
        .at("workload", w)
        .at("policy", "B")
        .emergent(),
        r[si].ci(|s| s.seconds).1,
    ));
    let paper_point = paper.get(2).copied().unwrap_or(f64::NAN);
    let how = format!(
        "the partition point of least TLB time over {}..{} lower slots (step 2), policy B (L2 and L3 PTEs lower)",
        lowers[0],
        lowers[lowers.len() - 1]
    );
    let optimum = ReproRow::numeric(
        &t9.art,
        "static optimum",
        paper_point,
        lowers[si] as f64,
        optimum_tol,
    )
    .unit("lower slots")
    .at("workload", w)
    .at("policy", "B");
    table.push(match t9.live_lower {
        Some((l2, l3)) => optimum.emergent().with_note(&format!(
            "{how}; the layout (layout.rs: MIPS segments, the kernel's stack and u-area, two kseg2 regions of kernel data) needs {l2} L2 and {l3} L3 PTEs live, {} in all",
            l2 + l3
        )),
        None => optimum.emergent().with_note(&how),
    });
    let dyn_row = |r: ReproRow| {
        if t9.dynamic_fitted {
            r.calibrated(&["dynamic.threshold"])
        } else {
            r.emergent()
        }
    };
    table.push(with_ci(
        dyn_row(
            ReproRow::plot_only(
                &t9.art,
                "dynamic partitioning time",
                paper.get(3).copied(),
                dynamic,
                &format!(
                    "hill climbing; {dyn_with:.3} s with fn. 8's 7 cycles per L1U miss to count"
                ),
            )
            .unit("s")
            .at("workload", w)
            .at("policy", "B"),
        ),
        dyn_ci,
    ));
    table.push(dyn_row(
        ReproRow::claim(
            &t9.art,
            "dynamic vs fixed and static",
            Some(dynamic / stat),
            dynamic < fixed && dynamic <= stat * 1.25,
            &format!(
                "dynamic partitioning beats the fixed partition and comes within 25% of the static optimum (dynamic / static shown; fixed {fixed:.3} s, static {stat:.3} s, dynamic {dynamic:.3} s){}",
                if t9.dynamic_fitted {
                    "; dynamic.threshold was chosen on these stand-ins"
                } else {
                    "; dynamic.threshold was chosen on the stand-ins, not on this trace"
                }
            ),
        )
        .unit("ratio")
        .at("workload", w)
        .at("policy", "B"),
    ));
}

/// Table VIII's rows at P = 8: `r` holds the outcomes of A, B, C and D.
fn table8_rows(
    table: &mut ReproTable,
    art: &str,
    workload: &str,
    r: &[Agg],
    costs: &CostPreset,
    note: &str,
    shape: &Shape,
) -> Result<(), SpecError> {
    let p8 = shape.paper().sub("table8_cost_s")?;
    let c8: Vec<f64> = r.iter().map(|a| a.seconds).collect();
    let a = &r[0];
    for (i, name) in ["A", "B", "C", "D"].iter().enumerate() {
        let by_type: Vec<String> = [MissType::L1U, MissType::L1K, MissType::L2, MissType::L3]
            .iter()
            .map(|t| {
                format!(
                    "{} {:.0} ({:.2} s)",
                    t.name(),
                    r[i].counts[t.index()],
                    r[i].secs_by_type[t.index()]
                )
            })
            .collect();
        table.push(with_ci(
            ReproRow::plot_only(
                art,
                "TLB time",
                Some(p8.num(name)?),
                c8[i],
                &format!("{note}; {}", by_type.join(", ")),
            )
            .unit("s")
            .at("workload", workload)
            .at("policy", *name)
            .at("lower_slots", 8)
            .emergent(),
            r[i].ci(|s| s.seconds).1,
        ));
    }
    // Every miss fills the TLB (Modify alone does not).
    let fills: f64 = a.counts[..4].iter().sum::<f64>() + a.counts[MissType::Invalid.index()];
    let ceiling = d_over_a_ceiling(fills, a.seconds, costs);
    let claim = |q: &str, v: f64, holds: bool, text: &str| {
        ReproRow::claim(art, q, Some(v), holds, text)
            .unit("ratio")
            .at("workload", workload)
            .at("lower_slots", 8)
            .emergent()
    };
    table.push(claim(
        "D / A",
        c8[3] / c8[0],
        c8[3] > c8[0] && c8[3] > c8[1] && c8[3] > c8[2],
        &format!(
            "no partitioning (D) is the worst placement (paper: by far, 11.92 / 1.91 = 6.2x); D/A ceiling here {ceiling:.2} (next row)"
        ),
    ));
    table.push(
        ReproRow::plot_only(
            art,
            "D / A ceiling from mixing",
            None,
            ceiling,
            &format!(
                "{CEILING_NOTE}; A here: {:.0} cycles per fill",
                a.seconds / (costs.ns_per_cycle * 1e-9) / fills.max(1.0)
            ),
        )
        .unit("ratio")
        .at("workload", workload)
        .at("lower_slots", 8)
        .emergent(),
    );
    table.push(claim(
        "A cheapest",
        c8[1].min(c8[2]) / c8[0],
        c8[0] < c8[1] && c8[0] < c8[2],
        "with the partition held at 8, the baseline placement A wins (paper A 1.91 < C 2.46, B 3.92); min(B, C) / A shown",
    ));
    table.push(claim(
        "C / B",
        c8[2] / c8[1],
        c8[2] < c8[1],
        "paper: C 2.46 < B 3.92 (C adds L1K PTEs to B's crowded 8 lower slots: it can win only where mapped kernel data is hot enough to survive there and not among the upper slots' L1U fills)",
    ));
    Ok(())
}

fn setup_at(lower: usize, placement: Placement) -> TlbSetup {
    TlbSetup {
        lower,
        placement,
        ..TlbSetup::default()
    }
}

fn argmin(xs: &[usize], ys: &[f64]) -> usize {
    let mut best = 0;
    for i in 1..ys.len() {
        if ys[i] < ys[best] * (1.0 - 1e-9) {
            best = i;
        }
    }
    xs[best]
}

const ALL_WORKLOADS: [&str; 7] = [
    "compress",
    "IOzone",
    "jpeg_play",
    "mab",
    "mpeg_play",
    "ousterhout",
    "video_play",
];

/// The `workload` condition of rows over the whole suite.
const SUITE: &str = "all seven (stand-ins)";

fn stand_in(w: &str) -> String {
    format!("{w} (stand-in)")
}

/// The cost presets this reproduction uses, for `mmulab list`: (name, what it models,
/// where its numbers come from). `decstation3100-1994` is not a machine preset of
/// `presets/` (those configure the multiprocessor simulator); it is `mmulab-swtlb`'s
/// [`CostPreset::decstation3100_1994`], one column per OS. Nothing in it is fitted: its
/// calibration set is empty (shape.toml's `[calibration]` names the one fitted input).
pub fn presets() -> Vec<(String, String, String)> {
    use mmulab_swtlb::costs::CostColumn;
    let cols = [CostColumn::Ultrix, CostColumn::Osf1, CostColumn::Mach3]
        .map(|c| {
            let p = CostPreset::decstation3100_1994(c);
            let v: Vec<String> = p
                .cycles
                .iter()
                .map(|c| c.map_or("-".into(), |v| format!("{v:.0}")))
                .collect();
            format!(
                "{} {}",
                p.name
                    .trim_start_matches("decstation3100-1994 (")
                    .trim_end_matches(')'),
                v.join("/")
            )
        })
        .join(", ");
    vec![(
        "decstation3100-1994".into(),
        format!(
            "uhlig94's software-managed R2000 TLB (64 slots, 8 lower), miss cycles L1U/L1K/L2/L3/Modify/Invalid at 60 ns: {cols} (AFS variants: Mach 3.0's)"
        ),
        "uhlig94 Table III (median cycles), §5.1 vectors, fn. 8".into(),
    )]
}

/// Fig. 5's sweep file: the mab stand-in under OSF/1, Mach 3.0 and
/// Mach3+AFSout, one pass over 4-16 lower slots each.
pub const FIG5: &str = "uhlig94/fig5.sweep.toml";
/// Fig. 7's sweep file: ousterhout under the three Mach systems, and
/// compress, video_play and mpeg_play under Mach 3.0, one pass over
/// 4-30 lower slots (even) each.
pub const FIG7: &str = "uhlig94/fig7.sweep.toml";

/// Table VIII and Fig. 8's sweep file: ousterhout under Mach 3.0, one pass
/// over the four placements at 8 lower slots (Table VIII), and one pass
/// over 4-32 lower slots (even) for each of placements A, B and C (Fig. 8).
pub const FIG8: &str = "uhlig94/fig8.sweep.toml";

/// A sweep of partition passes (`lower` lists) run through the engine.
struct Passes {
    rel: &'static str,
    run: super::SweepRun,
    /// The pass's partition points (the same list at every point).
    lowers: Vec<usize>,
}

impl Passes {
    /// Checks the sweep file `rel` (kind, keys, seeds, one `lower` list).
    fn check(
        rel: &'static str,
        sweep: &crate::sweep::Sweep,
        shape: &Shape,
    ) -> Result<Vec<usize>, SpecError> {
        check_pass_sweep(rel, sweep, shape, &["lower", "os", "workload"])?;
        let lists: Vec<&toml::Value> = sweep.points.iter().map(|p| &p.values["lower"]).collect();
        let lowers: Option<Vec<usize>> = match lists[0] {
            toml::Value::Array(a) => a
                .iter()
                .map(|v| v.as_integer().map(|l| l as usize))
                .collect(),
            _ => None,
        };
        match lowers {
            Some(l) if lists.iter().all(|v| *v == lists[0]) => Ok(l),
            _ => Err(invalid(format!(
                "{rel}: `lower` is one list of partition points, the same at every point (the figure's x axis)"
            ))),
        }
    }

    fn run(
        src: &Experiments,
        rel: &'static str,
        quick: bool,
        backend: &dyn super::Backend,
        shape: &Shape,
    ) -> Result<Passes, SpecError> {
        let run = super::run_sweep(src, rel, quick, backend)?;
        let lowers = Passes::check(rel, &run.sweep, shape)?;
        Ok(Passes { rel, run, lowers })
    }

    /// The setups' outcomes of `os` on `w` (one per partition point), as
    /// `Shape::run` aggregates them.
    fn aggs(&self, os: OsKind, w: &str, shape: &Shape) -> Result<Vec<Agg>, SpecError> {
        let at = [
            ("os", toml::Value::from(os.key())),
            ("workload", toml::Value::from(w)),
        ];
        pass_aggs(&self.run, self.rel, &at, os, shape)
    }
}

/// The setups' outcomes of the one point of `run` at `at` (a pass under
/// `os`), in the pass's setup order, aggregated over the seeds as
/// `Shape::run` aggregates them.
fn pass_aggs(
    run: &super::SweepRun,
    rel: &str,
    at: &[(&str, toml::Value)],
    os: OsKind,
    shape: &Shape,
) -> Result<Vec<Agg>, SpecError> {
    let i = run
        .point(at)
        .ok_or_else(|| invalid(format!("{rel}: no point {at:?}")))?;
    let trap = run.sweep.points[i]
        .trap
        .as_ref()
        .ok_or_else(|| invalid(format!("{rel}: not a swtlb-trap sweep")))?;
    if trap.os != os {
        return Err(invalid(format!(
            "{rel}: point {i} is not under {}",
            os.key()
        )));
    }
    let results = run
        .of_point(i)
        .iter()
        .map(|raw| {
            trap.prefixes
                .iter()
                .map(|p| outcome_of(raw, p))
                .collect::<Result<Vec<Outcome>, SpecError>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(aggregate(
        &results,
        trap.prefixes.len(),
        shape.seeds.len(),
        &shape.costs(os),
    ))
}

/// Checks that a uhlig94 sweep runs shape.toml's stand-ins and seeds over
/// `columns`: its rows sit beside the other stages', which take their
/// seeds from there.
fn check_pass_sweep(
    rel: &str,
    sweep: &crate::sweep::Sweep,
    shape: &Shape,
    columns: &[&str],
) -> Result<(), SpecError> {
    let want_seeds =
        (shape.seeds[0]..shape.seeds[0] + shape.seeds.len() as u64).collect::<Vec<_>>();
    let seeds: Vec<u64> = (sweep.seeds.start..sweep.seeds.start + sweep.seeds.count).collect();
    if sweep.kind != crate::sweep::Kind::SwtlbTrap
        || sweep.columns != columns
        || seeds != shape.seeds
        || shape.seeds != want_seeds
    {
        return Err(invalid(format!(
            "{rel}: this sweep runs `kind = \"swtlb-trap\"` over {columns:?} with shape.toml's seeds ({:?}); this one is `{}` over {:?} with seeds {seeds:?}",
            shape.seeds,
            sweep.kind.name(),
            sweep.columns
        )));
    }
    if shape.quick_scale != 1.0 {
        return Err(invalid(format!(
            "{rel}: shape.toml's quick_scale is {} but the sweep's passes run the stand-ins unscaled; keep quick_scale = 1.0",
            shape.quick_scale
        )));
    }
    Ok(())
}

pub fn reproduce(
    src: &Experiments,
    quick: bool,
    out: Option<&Path>,
    backend: &dyn super::Backend,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<ReproTable, SpecError> {
    let mut table = ReproTable::default();
    progress("Tables II, V, VI, VII and §4.2 from the paper's published counts and costs");
    exact_rows(src, TABLES, &mut table)?;
    let shape = Shape::load(src, SHAPE, quick)?;
    // Every sweep file checked before the first stage runs.
    check_pass_sweep(
        SYSTEMS,
        &super::load_sweep(src, SYSTEMS, quick)?,
        &shape,
        &["os", "workload"],
    )?;
    for rel in [FIG5, FIG7] {
        Passes::check(rel, &super::load_sweep(src, rel, quick)?, &shape)?;
    }
    check_pass_sweep(
        FIG8,
        &super::load_sweep(src, FIG8, quick)?,
        &shape,
        &["lower", "os", "placement", "workload"],
    )?;
    table.calibration.extend(shape.calibration.clone());
    table.seeds(shape.seeds[0], shape.seeds.len() as u64);
    let paper = PaperNumbers::load(src, TABLES)?;
    let pk = shape.paper();
    let ratio_tol = pk.num("ratio_tolerance_pct")?;
    let optimum_tol = pk.num("optimum_tolerance_pct")?;
    let suite: Vec<&str> = ALL_WORKLOADS.to_vec();
    // (file stem, plot)
    let mut plots: Vec<(&str, LinePlot)> = Vec::new();

    let cx = Cx {
        src,
        quick,
        backend,
        progress,
        shape: &shape,
        paper: &paper,
        ratio_tol,
        optimum_tol,
        suite: &suite,
    };
    systems(&cx, &mut table, &mut plots)?;
    fig5(&cx, &mut table, &mut plots)?;
    fig7(&cx, &mut table, &mut plots)?;
    fig8(&cx, &mut table, &mut plots)?;
    fig9(&cx, &mut table, &mut plots)?;
    fig10(&cx, &mut table, &mut plots)?;
    table9_fig11(&cx, &mut table, &mut plots)?;
    figs12_14(&cx, &mut table, &mut plots)?;
    if quick {
        quick_skips_captures(&shape, &mut table, progress);
    } else {
        captured_rows(&shape, &mut table, progress)?;
    }
    table.not_reproduced(
        "Table III",
        "the handler cycles per miss type are the decstation3100-1994 cost preset's input (read from the paper, never predicted); Tables VI and VII recompute from them",
    );
    table.not_reproduced(
        "Table X",
        "other processors' TLB sizes, from their manuals: not a measurement of the study",
    );

    if let Some(out) = out {
        std::fs::create_dir_all(out).map_err(|err| SpecError::Io {
            path: out.display().to_string(),
            err,
        })?;
        for (name, p) in &plots {
            p.write_svg(&out.join(format!("uhlig94-{name}.svg")))
                .map_err(|e| invalid(e.to_string()))?;
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmulab_report::Basis;

    fn dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/uhlig94/paper-data")
    }

    /// A folder `ROOT/uhlig94/paper-data` for edited copies; `ROOT` is laid out as
    /// experiments/ is.
    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir()
            .join(format!("uhlig94-{tag}-{}", std::process::id()))
            .join("uhlig94/paper-data");
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn root(d: &Path) -> &Path {
        d.parent().unwrap().parent().unwrap()
    }

    fn edited(d: &Path) -> Experiments {
        Experiments::Dir(root(d).to_path_buf())
    }

    #[test]
    fn exact_rows_match_the_printed_digits() {
        let mut t = ReproTable::default();
        exact_rows(&Experiments::Embedded, TABLES, &mut t).unwrap();
        let bad: Vec<_> = t.rows.iter().filter(|r| r.within != Some(true)).collect();
        assert!(bad.is_empty(), "{bad:#?}");
        assert!(t.rows.iter().all(|r| r.basis == Basis::Arithmetic));
        // 29 Table VI cells, 5 totals, 5 percentages.
        let t6 = t.rows.iter().filter(|r| r.artefact == "Table VI").count();
        assert_eq!(t6, 29 + 5 + 5);
        // The two rows whose printed sums are one off are shown both ways.
        let off: Vec<_> = t
            .rows
            .iter()
            .filter(|r| r.artefact == "Table V" && r.mmulab != r.paper)
            .map(|r| r.conditions["os"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(off, ["OSF/1", "Mach3"]);
    }

    #[test]
    fn bad_input_names_file_and_key() {
        let d = scratch("bad");
        let text = std::fs::read_to_string(dir().join("tables.toml")).unwrap();
        std::fs::write(
            d.join("tables.toml"),
            text.replace("table5_total =", "table5_totl ="),
        )
        .unwrap();
        let e = exact_rows(&edited(&d), TABLES, &mut ReproTable::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tables.toml") && e.contains("table5_total"),
            "{e}"
        );
        // Each edit of shape.toml, and what its error must name.
        let shape = std::fs::read_to_string(dir().join("shape.toml")).unwrap();
        let cases: [(&str, &str, [&str; 2]); 5] = [
            (
                "[os.osf1]\n",
                "[os.osf1]\nkernel_mapped_fractoin = 0.5\n",
                ["shape.toml", "os.osf1.kernel_mapped_fractoin"],
            ),
            (
                "syscall_every = 4000",
                "syscall_every = \"x\"",
                ["workloads.compress", "syscall_every"],
            ),
            (
                "workloads = [\"compress\", \"IOzone\", \"ousterhout\"]",
                "workloads = [\"compress\", \"video_play\"]",
                ["capture.workloads", "video_play"],
            ),
            (
                "iozone_mb = 10",
                "iozone_mb = 10\nspeed = 2",
                ["capture", "speed"],
            ),
            (
                "\"dynamic.threshold\" =",
                "\"dynamic.thresold\" =",
                ["calibration", "dynamic.thresold"],
            ),
        ];
        for (from, to, names) in cases {
            assert!(shape.contains(from), "shape.toml no longer has `{from}`");
            std::fs::write(d.join("shape.toml"), shape.replace(from, to)).unwrap();
            let e = Shape::load(&edited(&d), SHAPE, true)
                .err()
                .unwrap()
                .to_string();
            assert!(names.iter().all(|n| e.contains(n)), "{to}: {e}");
        }
        std::fs::remove_dir_all(root(&d)).ok();
    }

    /// A capture that cannot run (no Valgrind, no gcc) is named in `not_reproduced` and
    /// skipped, never an error; with Valgrind and gcc present the captured ousterhout runs
    /// and its system calls reach the Unix server.
    #[test]
    fn captured_workloads_run_or_are_named_and_skipped() {
        let mut shape = Shape::load(&Experiments::Embedded, SHAPE, true).unwrap();
        shape.capture.workloads = vec!["ousterhout".into()];
        shape.capture.ousterhout_iterations = 5;
        let mut t = ReproTable::default();
        captured_rows(&shape, &mut t, &|_| {}).unwrap();
        let skipped = t
            .not_reproduced
            .iter()
            .find(|n| n.artefact == "Tables V-VI (captured ousterhout)");
        let ours: Vec<_> = t
            .rows
            .iter()
            .filter(|r| r.artefact.contains("captured ousterhout"))
            .collect();
        if let Some(n) = skipped {
            assert!(n.reason.starts_with("not captured: "), "{n:?}");
            assert!(ours.is_empty());
        } else {
            assert!(
                ours.iter()
                    .any(|r| r.artefact == "Table VIII (captured ousterhout)")
            );
            let mach = ours
                .iter()
                .find(|r| r.quantity == "TLB time" && r.conditions["os"] == "Mach3")
                .unwrap();
            assert!(mach.note.contains("2 processes"), "{}", mach.note);
            assert!(ours.iter().all(|r| r.basis == Basis::Emergent), "{ours:#?}");
        }
        // mab is never captured by default, and says why.
        let mab = t
            .not_reproduced
            .iter()
            .find(|n| n.artefact == "Tables V-VI (captured mab)")
            .unwrap();
        assert!(mab.reason.contains("9 minutes"), "{}", mab.reason);
    }

    /// `--quick` captures nothing and names each artefact the full run's captures give.
    #[test]
    fn quick_names_every_capture_and_runs_none() {
        let shape = Shape::load(&Experiments::Embedded, SHAPE, true).unwrap();
        let mut t = ReproTable::default();
        quick_skips_captures(&shape, &mut t, &|_| {});
        assert!(t.rows.is_empty());
        let quick: Vec<&str> = t
            .not_reproduced
            .iter()
            .filter(|n| n.reason == QUICK_SKIPS)
            .map(|n| n.artefact.as_str())
            .collect();
        assert_eq!(
            quick,
            [
                "Tables V-VI (captured compress)",
                "Tables V-VI (captured IOzone)",
                "Table IX (captured IOzone)",
                "Tables V-VI (captured ousterhout)",
                "Table IX (captured ousterhout)",
                "Table VIII (captured ousterhout)",
            ]
        );
    }

    #[test]
    fn reproduce_runs_end_to_end_on_small_stand_ins() {
        let d = scratch("small");
        let out = root(&d).join("out");
        std::fs::copy(dir().join("tables.toml"), d.join("tables.toml")).unwrap();
        let shape = std::fs::read_to_string(dir().join("shape.toml")).unwrap();
        let shape = shape
            .replace("refs = 1000000", "refs = 20000")
            .replace("rounds = 300", "rounds = 20")
            .replace("enabled = true", "enabled = false");
        std::fs::write(d.join("shape.toml"), shape).unwrap();
        for rel in [SYSTEMS, FIG5, FIG7, FIG8] {
            let name = rel.strip_prefix("uhlig94/").unwrap();
            std::fs::copy(dir().join("..").join(name), root(&d).join(rel)).unwrap();
        }
        let t = reproduce(&edited(&d), true, Some(&out), &super::super::Local, &|_| {}).unwrap();
        assert!(t.rows.len() > 150, "{} rows", t.rows.len());
        for r in &t.rows {
            if r.basis == Basis::Arithmetic && r.kind == RowKind::Numeric {
                assert_eq!(r.within, Some(true), "{r:?}");
            }
            if r.basis == Basis::Calibrated {
                assert_eq!(
                    (r.artefact.as_str(), r.conditions["policy"].as_str()),
                    ("Table IX", Some("B")),
                    "{r:?}"
                );
                assert_eq!(r.calibrates, ["dynamic.threshold"]);
            }
        }
        assert_eq!(
            t.calibration,
            BTreeMap::from([(
                "dynamic.threshold".to_string(),
                "Table IX / dynamic vs fixed and static".to_string()
            )])
        );
        // The contract holds: every row has a basis, no emergent row of a fitted artefact.
        let prov = mmulab_report::Provenance {
            mmulab_version: "test".into(),
            git_commit: "test".into(),
        };
        let report = mmulab_report::ReproReport::new("uhlig94", t, true, &prov).unwrap();
        assert!(
            report.headline.emergent_judged > 20,
            "{:?}",
            report.headline
        );
        for f in [
            "uhlig94-fig5.svg",
            "uhlig94-fig5.csv",
            "uhlig94-fig7.svg",
            "uhlig94-fig7-applications.svg",
            "uhlig94-fig8.svg",
            "uhlig94-fig9.svg",
            "uhlig94-fig11.svg",
            "uhlig94-fig13.svg",
            "uhlig94-fig14.svg",
        ] {
            assert!(out.join(f).exists(), "{f}");
        }
        std::fs::remove_dir_all(root(&d)).ok();
    }

    /// `cargo test -p mmulab-experiment --release uhlig94_print -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn uhlig94_print() {
        let quick = std::env::var("UHLIG94_FULL").is_err();
        let out = std::env::var("UHLIG94_OUT")
            .ok()
            .map(std::path::PathBuf::from);
        let t = reproduce(
            &Experiments::Embedded,
            quick,
            out.as_deref(),
            &super::super::Local,
            &|s| eprintln!("{s}"),
        )
        .unwrap();
        for r in &t.rows {
            println!("{r:?}");
        }
    }
}
