//! `mmulab reproduce black89`: Fig. 2 (basic cost of a shootdown) and the
//! §8 extrapolation, on the `encore-multimax-1989` preset. The costs in the
//! preset are components; the line emerges from queueing, sending,
//! delivery and spinning in the model.

use std::path::Path;

use mmulab_engine::{Clock, LinearFit, mean_ci95, stats::summarize};
use mmulab_report::{Experiments, LinePlot, ReproRow, ReproTable, Series};
use rayon::prelude::*;

use super::PaperSpec;
use crate::run::run_seed;
use crate::spec::SpecError;

/// One point of a sweep: x, mean, sd, samples.
#[derive(Clone, Debug)]
pub struct Point {
    pub x: u64,
    pub mean_us: f64,
    pub sd_us: f64,
    /// The 95 % confidence interval of the mean.
    pub ci_us: (f64, f64),
    pub n: usize,
}

impl Point {
    /// The mean, sd and CI of one point's samples (µs).
    fn of(x: u64, v: &[f64]) -> Point {
        let s = summarize(v);
        let (_, lo, hi) = mean_ci95(v);
        Point {
            x,
            mean_us: s.mean,
            sd_us: s.sd,
            ci_us: (lo, hi),
            n: v.len(),
        }
    }
}

fn initiator_points(
    ps: &PaperSpec,
    xs: &[u64],
    runs: u64,
    sets: impl Fn(u64) -> Vec<String> + Sync,
) -> Result<Vec<Point>, SpecError> {
    let specs: Vec<_> = xs
        .iter()
        .map(|&x| ps.spec(&sets(x)).map(|s| (x, s)))
        .collect::<Result<_, _>>()?;
    let jobs: Vec<(u64, u64)> = specs
        .iter()
        .flat_map(|(x, s)| (0..runs).map(move |r| (*x, s.seed + r)))
        .collect();
    let samples: Vec<(u64, Option<f64>)> = jobs
        .par_iter()
        .map(|&(x, seed)| {
            let spec = &specs.iter().find(|(sx, _)| *sx == x).expect("spec").1;
            let out = run_seed(spec, seed);
            assert_eq!(
                out.sim.oracle.violations, 0,
                "black89 sweep x={x} seed={seed}: the oracle found violations"
            );
            let clock = Clock::new(spec.costs.clock_hz);
            let v = out
                .sim
                .hists
                .get("shootdown.user.initiator_cycles")
                .and_then(|h| h.samples().first().copied());
            (x, v.map(|c| clock.us_f64(c)))
        })
        .collect();
    Ok(xs
        .iter()
        .map(|&x| {
            let v: Vec<f64> = samples
                .iter()
                .filter(|(sx, _)| *sx == x)
                .filter_map(|(_, v)| *v)
                .collect();
            Point::of(x, &v)
        })
        .collect())
}

/// [`initiator_points`] from a sweep of `workload.children` = `xs`: each
/// seed's first initiator sample.
fn sweep_points(run: &super::SweepRun, xs: &[u64]) -> Vec<Point> {
    xs.iter()
        .map(|&x| {
            let i = run
                .point(&[("workload.children", toml::Value::Integer(x as i64))])
                .expect("a swept child count");
            let clock = Clock::new(run.spec(i).costs.clock_hz);
            let v: Vec<f64> = run
                .of_point(i)
                .iter()
                .filter_map(|out| {
                    assert_eq!(
                        out.violations, 0,
                        "black89 sweep x={x} seed={}: the oracle found violations",
                        out.seed
                    );
                    out.samples("shootdown.user.initiator_cycles")
                        .first()
                        .map(|&c| clock.us_f64(c))
                })
                .collect();
            Point::of(x, &v)
        })
        .collect()
}

pub fn reproduce(
    src: &Experiments,
    quick: bool,
    out: Option<&Path>,
    backend: &dyn super::Backend,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<ReproTable, SpecError> {
    let mut table = ReproTable::default();
    table
        .calibration
        .extend(crate::preset::load("encore-multimax-1989")?.calibration);

    // Fig. 2.
    progress("Fig. 2: the tester with 1-15 children");
    let fig2 = PaperSpec::load(src, "black89/fig2.toml")?;
    // The children and seeds are experiments/black89/fig2.sweep.toml's.
    let run2 = super::run_sweep(src, "black89/fig2.sweep.toml", quick, backend)?;
    table.seeds(run2.sweep.seeds.start, run2.sweep.seeds.count);
    // Runs per point: the sweep's seeds (the knee's sweep below takes as many).
    let runs = run2.sweep.seeds.count;
    let xs = run2.integers("workload.children");
    let points = sweep_points(&run2, &xs);
    let range = fig2.list("fit_over")?;
    let fit_pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.x >= range[0] && p.x <= range[1])
        .map(|p| (p.x as f64, p.mean_us))
        .collect();
    let fit = LinearFit::fit(&fit_pts).expect("points");
    let first = fig2.number("first_processor_us")?;
    let slope = fig2.number("slope_us_per_cpu")?;
    let tol = fig2.number("tolerance_pct")?;
    // The preset's four fixed and per-target costs were fitted to these
    // two sums: the line reads its calibration back.
    let fitted = table.fitted_inputs("Fig. 2");
    let fitted: Vec<&str> = fitted.iter().map(String::as_str).collect();
    table.push(
        ReproRow::numeric("Fig. 2", "first_processor", first, fit.at(1.0), tol)
            .unit("µs")
            .calibrated(&fitted)
            .with_note("fit over 1-12 at one processor (the paper's 430 µs)"),
    );
    table.push(
        ReproRow::numeric("Fig. 2", "slope", slope, fit.slope, tol)
            .unit("µs per processor")
            .calibrated(&fitted)
            .with_note("per additional processor"),
    );
    table.push(
        ReproRow::numeric("Fig. 2", "intercept", first - slope, fit.intercept, tol)
            .unit("µs")
            .calibrated(&fitted)
            .with_note("the line at 0 processors: 430 - 55 = 375 µs"),
    );
    table.push(
        ReproRow::plot_only("Fig. 2", "r2", None, fit.r2, "least-squares fit quality")
            .unit("ratio")
            .calibrated(&fitted),
    );
    for p in &points {
        let paper_line = first + slope * (p.x as f64 - 1.0);
        table.push(
            ReproRow::plot_only(
                "Fig. 2",
                "initiator_mean",
                Some(paper_line),
                p.mean_us,
                &format!(
                    "mean over {} runs, sd {:.1}; the paper value is its line",
                    p.n, p.sd_us
                ),
            )
            .unit("µs")
            .at("processors", p.x)
            .ci(p.ci_us.0, p.ci_us.1)
            .calibrated(&fitted),
        );
    }

    // Fig. 2's knee (§7.1): the same sweep with the shared-bus model on.
    progress("Fig. 2 knee: the tester with the shared-bus model on");
    let bus = fig2.number("knee_bus_contention_cycles")?;
    let knee = initiator_points(&fig2, &xs, runs, |k| {
        vec![
            format!("workload.children={k}"),
            format!("costs.bus_contention_cycles={bus}"),
        ]
    })?;
    let above = |p: &Point| (p.mean_us - fit.at(p.x as f64)) / fit.at(p.x as f64) * 100.0;
    let below12: f64 = knee
        .iter()
        .filter(|p| p.x <= 11)
        .map(|p| above(p).abs())
        .fold(0.0, f64::max);
    let at15 = knee.iter().find(|p| p.x == 15).map(above).unwrap_or(0.0);
    // Where the knee falls is an input: the bus model charges only beyond
    // `bus_free_users` = 12 (§7.1's "12 or more"), at an assumed cost.
    table.push(
        ReproRow::claim(
            "Fig. 2",
            "departure_from_line",
            Some(at15),
            below12 < 1.0 && at15 > 5.0,
            &format!(
                "with {:.0} µs per bus user beyond 11 (an assumption), points up to 11 stay on the line (max {:.1}%) and 13-15 rise above it, as the paper's do; the knee's place is the input bus_free_users = 12",
                Clock::new(fig2.spec(&[])?.costs.clock_hz).us_f64(bus),
                below12
            ),
        )
        .unit("%")
        .at("processors", 15)
        .at("bus_model", "on")
        .input(),
    );
    // Fig. 2's spread (§7.1: above 12 processors "the standard deviation
    // doubles"). Its sources are stated inputs: the preset's clock
    // interrupts (where the shootdown interrupt lands in a responder's
    // work) and the random wait of the state save's misses on the bus.
    let sd_mean = |ps: &[Point], lo: u64, hi: u64| {
        let v: Vec<f64> = ps
            .iter()
            .filter(|p| p.x >= lo && p.x <= hi)
            .map(|p| p.sd_us)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let spread_points = points.iter().filter(|p| p.sd_us > 0.0).count();
    table.push(
        ReproRow::claim(
            "Fig. 2",
            "run_to_run_spread",
            Some(sd_mean(&points, 1, 12)),
            runs > 1 && spread_points > 0,
            &format!(
                "{spread_points} of 15 points vary from run to run ({runs} runs each; mean sd over 1-12 {:.1} µs): the preset's clock interrupts hold off the shootdown interrupt on a responder that is in its handler",
                sd_mean(&points, 1, 12)
            ),
        )
        .unit("µs")
        .input(),
    );
    let (sd_lo, sd_hi) = (sd_mean(&knee, 1, 12), sd_mean(&knee, 13, 15));
    table.push(
        ReproRow::claim(
            "Fig. 2",
            "spread_above_12_over_below",
            Some(sd_hi / sd_lo.max(1e-9)),
            runs > 1 && sd_hi >= 2.0 * sd_lo,
            &format!(
                "with the shared-bus model on, the mean sd is {sd_lo:.1} µs over 1-12 and {sd_hi:.1} µs over 13-15 (the paper: it doubles); the bus wait is drawn at random, its mean and threshold are inputs"
            ),
        )
        .unit("ratio")
        .at("bus_model", "on")
        .input(),
    );
    for p in knee.iter().filter(|p| p.x >= 12) {
        table.push(
            ReproRow::plot_only(
                "Fig. 2",
                "initiator_mean",
                None,
                p.mean_us,
                &format!("{:+.1}% from the 1-12 line, sd {:.1}", above(p), p.sd_us),
            )
            .unit("µs")
            .at("processors", p.x)
            .at("bus_model", "on")
            .input(),
        );
    }

    // §8 extrapolation.
    progress("§8: the tester on 32-1024 CPUs");
    let ext = PaperSpec::load(src, "black89/sec8-extrapolation.toml")?;
    let mut cpus = ext.list("cpus")?;
    if quick {
        cpus.retain(|&c| c <= 128);
    }
    let ext_runs = ext.spec(&[])?.runs;
    let ext_points = initiator_points(&ext, &cpus, ext_runs, |c| {
        vec![
            format!("machine.cpus={c}"),
            format!("workload.children={}", c - 1),
        ]
    })?;
    let ext_fit = LinearFit::fit(
        &ext_points
            .iter()
            .map(|p| ((p.x - 1) as f64, p.mean_us))
            .collect::<Vec<_>>(),
    )
    .expect("points");
    // The same per-target costs as Fig. 2, extended: the paper's 6 ms is
    // its own line at 100 processors, so this row reads the calibration back.
    table.push(
        ReproRow::numeric(
            "§8",
            "initiator_time",
            ext.number("at_100_processors_us")?,
            ext_fit.at(100.0),
            ext.number("tolerance_pct")?,
        )
        .unit("µs")
        .at("processors", 100)
        .calibrated(&fitted)
        .with_note("line through the 32-1024 CPU runs at 100 responders: Fig. 2's fitted per-target cost extended"),
    );
    for p in &ext_points {
        table.push(
            ReproRow::plot_only(
                "§8",
                "initiator_mean",
                None,
                p.mean_us,
                "children = CPUs - 1",
            )
            .unit("µs")
            .at("cpus", p.x)
            .calibrated(&fitted),
        );
    }

    progress("Table 1: lazy evaluation (kernel-build and Parthenon stand-ins)");
    table1(src, quick, &mut table)?;
    progress("Tables 2-4: kernel and user distributions");
    tables2_4(src, quick, &mut table)?;

    if let Some(out) = out {
        std::fs::create_dir_all(out).map_err(|err| SpecError::Io {
            path: out.display().to_string(),
            err,
        })?;
        let mut plot = LinePlot::new(
            "black89 Fig. 2: basic cost of a shootdown (Mach, Multimax)",
            "processors",
            "initiator time (µs)",
        );
        plot.add(Series::with_ci(
            "mmulab (mean, 95% CI)",
            points.iter().map(|p| (p.x as f64, p.mean_us)).collect(),
            points.iter().map(|p| p.ci_us).collect(),
        ));
        plot.add(Series::line(
            "mmulab fit (1-12)",
            (1..=15).map(|x| (x as f64, fit.at(x as f64))).collect(),
        ));
        plot.add(Series::points(
            "mmulab, shared-bus model on",
            knee.iter().map(|p| (p.x as f64, p.mean_us)).collect(),
            vec![],
        ));
        plot.add(Series::paper(
            "paper: its line 430 + 55 (n - 1), fitted over 1-12",
            (1..=15)
                .map(|x| (x as f64, first + slope * (x as f64 - 1.0)))
                .collect(),
        ));
        plot.write_svg(&out.join("black89-fig2.svg"))
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
        let mut plot = LinePlot::new(
            "black89 §8: extrapolation",
            "processors",
            "initiator time (µs)",
        );
        plot.add(Series::with_ci(
            "mmulab",
            ext_points.iter().map(|p| (p.x as f64, p.mean_us)).collect(),
            ext_points.iter().map(|p| p.ci_us).collect(),
        ));
        plot.add(Series::line(
            "mmulab: line through the runs",
            ext_points
                .iter()
                .map(|p| (p.x as f64, ext_fit.at((p.x - 1) as f64)))
                .collect(),
        ));
        plot.add(Series::paper(
            "paper: ~6 ms at 100 processors",
            vec![(100.0, ext.number("at_100_processors_us")?)],
        ));
        plot.write_svg(&out.join("black89-fig2-extrapolation.svg"))
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
    }
    Ok(table)
}

/// §9's first hardware feature, "a software interrupt with priority above
/// that of device interrupts": Tables 2-4's two runs again with
/// `protocol_options.shootdown_level = "above-device"` (the preset's
/// sections still mask the device interrupts; only the shootdown code and
/// its pmap locks mask the shootdown interrupt). §9 states what this
/// "would" do: "reduce the time for kernel shootdowns to more closely
/// match user shootdowns, and eliminate the skew caused by long periods of
/// interrupt disablement". Both are judged as claims, on one kernel for
/// the kernel and the user run as Table 3's skew row is: the kernel median
/// over the user median falls below the measured kernel's ratio, and the
/// kernel initiators' skew (§8: "the additional skew in the kernel time
/// distributions is caused by the varying intervals for which interrupts
/// are disabled") is no longer above the user initiators'. The medians
/// are shown, unjudged (the paper measured no such kernel).
fn sec9(
    ps: &PaperSpec,
    camelot: &str,
    quick: bool,
    (ki, ui): (&mmulab_engine::Summary, &mmulab_engine::Summary),
    table: &mut ReproTable,
) -> Result<(), SpecError> {
    let above = "protocol_options.shootdown_level=\"above-device\"";
    let kernel = run_with(ps, &[above], quick)?;
    let user = run_with(ps, &[camelot, above], quick)?;
    let h = |r: &crate::Results, n: &str| r.histograms.get(n).copied().unwrap_or_default();
    let (ki9, kr9) = (
        h(&kernel, "shootdown.kernel.initiator_us"),
        h(&kernel, "shootdown.kernel.responder_us"),
    );
    let (ui9, ur9) = (
        h(&user, "shootdown.user.initiator_us"),
        h(&user, "shootdown.user.responder_us"),
    );
    let skew = |s: &mmulab_engine::Summary| (s.p90 - s.median) / s.median.max(1e-9);
    let ratio =
        |k: &mmulab_engine::Summary, u: &mmulab_engine::Summary| k.median / u.median.max(1e-9);
    let (r9, r) = (ratio(&ki9, &ui9), ratio(ki, ui));
    table.push(
        ReproRow::claim(
            "§9",
            "kernel_over_user_initiator_median",
            Some(r9),
            r9 < r,
            &format!(
                "a shootdown interrupt above the device interrupts \"would reduce the time for kernel shootdowns to more closely match user shootdowns\": kernel over user median {r9:.2} ({:.0} / {:.0} µs) against {r:.2} on the measured kernel",
                ki9.median, ui9.median
            ),
        )
        .unit("ratio")
        .at("shootdown_level", "above-device")
        .emergent(),
    );
    table.push(
        ReproRow::claim(
            "§9",
            "kernel_vs_user_initiator_skew",
            Some(skew(&ki9)),
            skew(&ki9) <= skew(&ui9),
            &format!(
                "\"and eliminate the skew caused by long periods of interrupt disablement\": (p90-median)/median kernel {:.2} vs user {:.2} (measured kernel: {:.2} vs {:.2})",
                skew(&ki9),
                skew(&ui9),
                skew(ki),
                skew(ui)
            ),
        )
        .unit("ratio")
        .at("shootdown_level", "above-device")
        .emergent(),
    );
    for (q, app, s) in [
        ("initiator_median", "Mach build", &ki9),
        ("initiator_median", "Camelot", &ui9),
        ("responder_median", "Mach build", &kr9),
        ("responder_median", "Camelot", &ur9),
    ] {
        table.push(
            ReproRow::plot_only(
                "§9",
                q,
                None,
                s.median,
                &format!(
                    "§9's design (not measured by the paper): mean {:.0}, p10 {:.0}, p90 {:.0} µs",
                    s.mean, s.p10, s.p90
                ),
            )
            .unit("µs")
            .at("application", app)
            .at("shootdown_level", "above-device")
            .emergent(),
        );
    }
    Ok(())
}

/// Runs a paper spec with overrides and returns its merged results.
fn run_with(ps: &PaperSpec, sets: &[&str], quick: bool) -> Result<crate::Results, SpecError> {
    let mut sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    if quick {
        sets.push("runs=1".into());
    }
    let spec = ps.spec(&sets)?;
    let r =
        crate::run::run_spec(&spec, |_, _| {}).map_err(|e| SpecError::Invalid(e.to_string()))?;
    assert_eq!(
        r.oracle.violations, 0,
        "{}: the oracle found violations",
        ps.origin
    );
    Ok(r)
}

fn per_run(r: &crate::Results, counter: &str) -> f64 {
    r.counters.get(counter) as f64 / r.runs as f64
}

fn mean_us(r: &crate::Results, hist: &str) -> Option<f64> {
    r.histograms.get(hist).filter(|s| s.n > 0).map(|s| s.mean)
}

/// Tolerance for times the stand-in workloads produce: 25 %, the bound the
/// responder medians of Table 4 are judged by, applied to every time of
/// Tables 1-4 alike (set before these rows were judged).
const STAND_IN_TOL_PCT: f64 = 25.0;

/// Table 1: lazy evaluation on and off, for both stand-ins.
pub fn table1(src: &Experiments, quick: bool, table: &mut ReproTable) -> Result<(), SpecError> {
    let kb = PaperSpec::load(src, "black89/table1-kbuild.toml")?;
    let off = run_with(&kb, &["protocol_options.lazy=false"], quick)?;
    let on = run_with(&kb, &["protocol_options.lazy=true"], quick)?;
    let (k_off, k_on) = (
        per_run(&off, "shootdown.kernel.events"),
        per_run(&on, "shootdown.kernel.events"),
    );
    let paper_ratio = kb.number("kernel_events_lazy_on")? / kb.number("kernel_events_lazy_off")?;
    // The stand-in touches pageable kernel memory with the workload's
    // kmem_touch_probability, which sets how many shootdowns lazy evaluation
    // skips: the paper gives no model of how the build touches kernel
    // memory, so the ratio reads that input back and the spec names it
    // fitted to this row.
    table.calibration.extend(kb.calibration()?);
    table.push(
        ReproRow::numeric(
            "Table 1",
            "kernel_events_lazy_on_over_off",
            paper_ratio,
            k_on / k_off,
            25.0,
        )
        .unit("ratio")
        .at("application", "Mach build")
        .calibrated(&["workload.kmem_touch_probability"])
        .with_note(&format!(
            "stand-in: {k_off:.0} events without lazy evaluation, {k_on:.0} with (per run); the ratio follows the stand-in's kmem_touch_probability"
        )),
    );
    table.push(
        ReproRow::claim(
            "Table 1",
            "user_events",
            Some(per_run(&on, "shootdown.user.events") + per_run(&off, "shootdown.user.events")),
            per_run(&on, "shootdown.user.events") == 0.0
                && per_run(&off, "shootdown.user.events") == 0.0,
            "no user-pmap shootdowns either way: the stand-in shares no memory between tasks, by construction",
        )
        .unit("events")
        .at("application", "Mach build")
        .input(),
    );
    for (lazy, r, key) in [
        ("off", &off, "kernel_avg_us_lazy_off"),
        ("on", &on, "kernel_avg_us_lazy_on"),
    ] {
        if let Some(m) = mean_us(r, "shootdown.kernel.initiator_us") {
            table.push(
                ReproRow::numeric(
                    "Table 1",
                    "kernel_avg_time",
                    kb.number(key)?,
                    m,
                    STAND_IN_TOL_PCT,
                )
                .unit("µs")
                .at("application", "Mach build")
                .at("lazy", lazy)
                .emergent()
                .with_note("the kernel-build stand-in"),
            );
        }
    }

    let pa = PaperSpec::load(src, "black89/table1-parthenon.toml")?;
    let off = run_with(&pa, &["protocol_options.lazy=false"], quick)?;
    let on = run_with(&pa, &["protocol_options.lazy=true"], quick)?;
    let u_off = per_run(&off, "shootdown.user.events");
    let u_on = per_run(&on, "shootdown.user.events");
    table.push(
        ReproRow::claim(
            "Table 1",
            "user_events_lazy_off_to_on",
            Some(u_on),
            u_off > 0.0 && u_on == 0.0,
            &format!("guard-page reprotects shoot without lazy evaluation ({u_off:.0}/run) and never with it (paper: 70 -> 0)"),
        )
        .unit("events")
        .at("application", "Parthenon")
        .emergent(),
    );
    let k_off = per_run(&off, "shootdown.kernel.events");
    let k_on = per_run(&on, "shootdown.kernel.events");
    table.push(
        ReproRow::claim(
            "Table 1",
            "kernel_events_lazy_on_over_off",
            Some(if k_off > 0.0 { k_on / k_off } else { 0.0 }),
            k_off > 0.0 && k_on / k_off < 0.1,
            &format!("lazy evaluation removes nearly all kernel shootdowns ({k_off:.0} -> {k_on:.0}; paper 107 -> 4)"),
        )
        .unit("ratio")
        .at("application", "Parthenon")
        .emergent(),
    );
    if let Some(m) = mean_us(&off, "shootdown.user.initiator_us") {
        table.push(
            ReproRow::numeric(
                "Table 1",
                "user_avg_time",
                pa.number("user_avg_us_lazy_off")?,
                m,
                STAND_IN_TOL_PCT,
            )
            .unit("µs")
            .at("application", "Parthenon")
            .at("lazy", "off")
            .emergent()
            .with_note("the Parthenon stand-in"),
        );
    }
    for (lazy, r, key) in [
        ("off", &off, "kernel_avg_us_lazy_off"),
        ("on", &on, "kernel_avg_us_lazy_on"),
    ] {
        match mean_us(r, "shootdown.kernel.initiator_us") {
            Some(m) => table.push(
                ReproRow::numeric(
                    "Table 1",
                    "kernel_avg_time",
                    pa.number(key)?,
                    m,
                    STAND_IN_TOL_PCT,
                )
                .unit("µs")
                .at("application", "Parthenon")
                .at("lazy", lazy)
                .emergent()
                .with_note("the Parthenon stand-in"),
            ),
            None => table.not_reproduced(
                &format!("Table 1 (Parthenon kernel time, lazy {lazy})"),
                &format!(
                    "the stand-in has no kernel shootdown with lazy evaluation {lazy} (the paper's 4 events in 20 minutes; paper {} µs)",
                    pa.number(key)?
                ),
            ),
        }
    }
    Ok(())
}

/// Tables 2-4: the kernel-build stand-in (kernel pmaps) and the Camelot
/// stand-in (user pmaps).
pub fn tables2_4(src: &Experiments, quick: bool, table: &mut ReproTable) -> Result<(), SpecError> {
    let ps = PaperSpec::load(src, "black89/tables2-4.toml")?;
    table.calibration.extend(ps.calibration()?);
    let kernel = run_with(&ps, &[], quick)?;
    // The user side replaces the whole workload table (kbuild's `jobs`
    // means nothing to Camelot).
    let camelot = format!(
        "workload={{kind=\"camelot\", threads={}, sleep_cycles={}}}",
        ps.number("camelot_threads")? as u64,
        ps.number("camelot_sleep_cycles")? as u64
    );
    // The same kernel as the kernel-build run (the preset's disabled
    // sections and clock): how often a Camelot responder is caught in the
    // kernel follows from what its threads do.
    let user = run_with(&ps, &[camelot.as_str()], quick)?;
    let h = |r: &crate::Results, n: &str| r.histograms.get(n).copied().unwrap_or_default();
    let ki = h(&kernel, "shootdown.kernel.initiator_us");
    let kr = h(&kernel, "shootdown.kernel.responder_us");
    let ui = h(&user, "shootdown.user.initiator_us");
    let ur = h(&user, "shootdown.user.responder_us");
    let skew = |s: &mmulab_engine::Summary| (s.p90 - s.median) / s.median.max(1e-9);
    table.push(
        ReproRow::claim(
            "Table 3",
            "kernel_over_user_initiator_median",
            Some(ki.median / ui.median.max(1e-9)),
            ki.median > ui.median,
            &format!(
                "kernel shootdowns take longer: median {:.0} vs {:.0} µs (paper 939 vs 573)",
                ki.median, ui.median
            ),
        )
        .unit("ratio")
        .emergent(),
    );
    // Both runs share one kernel: the difference in skew comes from how
    // often each workload's responders are in the kernel (§8).
    table.push(
        ReproRow::claim(
            "Table 3",
            "kernel_vs_user_initiator_skew",
            Some(skew(&ki)),
            skew(&ki) > skew(&ui),
            &format!(
                "kernel times are more skewed: (p90-median)/median {:.2} vs {:.2} (paper 0.58 vs 0.16); both runs on the same kernel",
                skew(&ki),
                skew(&ui)
            ),
        )
        .unit("ratio")
        .emergent(),
    );
    sec9(&ps, &camelot, quick, (&ki, &ui), table)?;
    table.push(
        ReproRow::claim(
            "Table 4",
            "initiator_over_responder_mean",
            Some(ki.mean / kr.mean.max(1e-9)),
            ki.mean > kr.mean && ui.mean > ur.mean,
            &format!(
                "initiators pay more than responders: kernel {:.0} vs {:.0}, user {:.0} vs {:.0} µs",
                ki.mean, kr.mean, ui.mean, ur.mean
            ),
        )
        .unit("ratio")
        .emergent(),
    );
    table.push(
        ReproRow::claim(
            "Table 2",
            "initiator_upper_over_lower_spread",
            Some((ki.p90 - ki.median) / (ki.median - ki.p10).max(1e-9)),
            ki.p90 - ki.median > ki.median - ki.p10,
            "distributions skewed towards low values (§7.3): p90 - median exceeds median - p10",
        )
        .unit("ratio")
        .at("application", "Mach build")
        .emergent(),
    );
    // §7.3 on every distribution: "Most of the time distributions are not
    // normal ... skewed towards high frequencies at low values" (p90 -
    // median above median - p10), except that "the Camelot responder
    // times are an exception; their distribution is nearly symmetric as
    // evidenced by the near agreement between mean and median" (judged as
    // mean within 10 % of the median; the paper's are 2 % apart, the Mach
    // build's responders 29 %).
    for (artefact, who, app, s, paper) in [
        (
            "Table 3",
            "initiator",
            "Camelot",
            &ui,
            "662 - 573 > 573 - 545",
        ),
        (
            "Table 4",
            "responder",
            "Mach build",
            &kr,
            "817 - 425 > 425 - 237",
        ),
    ] {
        table.push(
            ReproRow::claim(
                artefact,
                &format!("{who}_upper_over_lower_spread"),
                Some((s.p90 - s.median) / (s.median - s.p10).max(1e-9)),
                s.p90 - s.median > s.median - s.p10,
                &format!(
                    "skewed towards low values (§7.3): p90 - median {:.0} against median - p10 {:.0} µs (paper {paper})",
                    s.p90 - s.median,
                    s.median - s.p10
                ),
            )
            .unit("ratio")
            .at("application", app)
            .emergent(),
        );
    }
    let sym = (ur.mean - ur.median).abs() / ur.median.max(1e-9);
    table.push(
        ReproRow::claim(
            "Table 4",
            "responder_mean_near_median",
            Some(sym),
            sym < 0.10,
            &format!(
                "the Camelot responders' distribution is nearly symmetric (§7.3): mean {:.0} against median {:.0} µs (paper 325 vs 318)",
                ur.mean, ur.median
            ),
        )
        .unit("ratio")
        .at("application", "Camelot")
        .emergent(),
    );
    // The workload's shape: processors were fitted (the spec's
    // [paper.calibration]), pages follow the stand-ins' allocation and
    // reprotection sizes.
    let (kp, up) = (
        h(&kernel, "shootdown.kernel.processors"),
        h(&user, "shootdown.user.processors"),
    );
    let (kpg, upg) = (
        h(&kernel, "shootdown.kernel.pages"),
        h(&user, "shootdown.user.pages"),
    );
    for (artefact, app, key, s, fitted) in [
        (
            "Table 2",
            "Mach build",
            "kernel_processors",
            &kp,
            &["workload.jobs"][..],
        ),
        (
            "Table 3",
            "Camelot",
            "user_processors",
            &up,
            &["workload.threads", "workload.sleep_cycles"][..],
        ),
    ] {
        table.push(
            ReproRow::numeric(
                artefact,
                "processors",
                ps.number(key)?,
                s.mean,
                STAND_IN_TOL_PCT,
            )
            .unit("processors per shootdown")
            .at("application", app)
            .calibrated(fitted)
            .with_note(&format!(
                "the stand-in's concurrency was fitted to this column: {:.1} ± {:.1}",
                s.mean, s.sd
            )),
        );
    }
    for (artefact, app, key, mean) in [
        ("Table 2", "Mach build", "kernel_pages", kpg.mean),
        ("Table 3", "Camelot", "user_pages", upg.mean),
    ] {
        table.push(
            ReproRow::numeric(artefact, "pages", ps.number(key)?, mean, STAND_IN_TOL_PCT)
                .unit("pages per shootdown")
                .at("application", app)
                .input()
                .with_note("follows the stand-in's allocation and reprotection sizes"),
        );
    }
    for (artefact, q, app, paper_key, v) in [
        (
            "Table 2",
            "initiator_median",
            "Mach build",
            "kernel_initiator_median_us",
            ki.median,
        ),
        (
            "Table 2",
            "initiator_mean",
            "Mach build",
            "kernel_initiator_mean_us",
            ki.mean,
        ),
        (
            "Table 2",
            "initiator_p10",
            "Mach build",
            "kernel_initiator_p10_us",
            ki.p10,
        ),
        (
            "Table 2",
            "initiator_p90",
            "Mach build",
            "kernel_initiator_p90_us",
            ki.p90,
        ),
        (
            "Table 3",
            "initiator_median",
            "Camelot",
            "user_initiator_median_us",
            ui.median,
        ),
        (
            "Table 3",
            "initiator_mean",
            "Camelot",
            "user_initiator_mean_us",
            ui.mean,
        ),
        (
            "Table 3",
            "initiator_p10",
            "Camelot",
            "user_initiator_p10_us",
            ui.p10,
        ),
        (
            "Table 3",
            "initiator_p90",
            "Camelot",
            "user_initiator_p90_us",
            ui.p90,
        ),
        (
            "Table 4",
            "responder_median",
            "Mach build",
            "kernel_responder_median_us",
            kr.median,
        ),
        (
            "Table 4",
            "responder_mean",
            "Mach build",
            "kernel_responder_mean_us",
            kr.mean,
        ),
        (
            "Table 4",
            "responder_p10",
            "Mach build",
            "kernel_responder_p10_us",
            kr.p10,
        ),
        (
            "Table 4",
            "responder_p90",
            "Mach build",
            "kernel_responder_p90_us",
            kr.p90,
        ),
        (
            "Table 4",
            "responder_median",
            "Camelot",
            "user_responder_median_us",
            ur.median,
        ),
        (
            "Table 4",
            "responder_mean",
            "Camelot",
            "user_responder_mean_us",
            ur.mean,
        ),
        (
            "Table 4",
            "responder_p10",
            "Camelot",
            "user_responder_p10_us",
            ur.p10,
        ),
        (
            "Table 4",
            "responder_p90",
            "Camelot",
            "user_responder_p90_us",
            ur.p90,
        ),
    ] {
        table.push(
            ReproRow::numeric(artefact, q, ps.number(paper_key)?, v, STAND_IN_TOL_PCT)
                .unit("µs")
                .at("application", app)
                .emergent()
                .with_note("stand-in workload"),
        );
    }
    table.not_reproduced(
        "Tables 2-4 (Parthenon and Agora columns)",
        "no Agora workload; Parthenon's 4 kernel shootdowns are too few to compare",
    );
    table.not_reproduced(
        "Tables 2-4 (event counts)",
        "the stand-ins run for a simulated fraction of the paper's 7.5-60 minutes: event counts are not comparable",
    );
    Ok(())
}
