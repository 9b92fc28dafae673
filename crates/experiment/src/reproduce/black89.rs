//! `mmulab reproduce black89`: Fig. 2 (basic cost of a shootdown) and the
//! §8 extrapolation, on the `encore-multimax-1989` preset. The costs in the
//! preset are components; the line emerges from queueing, sending,
//! delivery and spinning in the model.

use std::path::Path;

use mmulab_engine::{Clock, LinearFit, stats::summarize};
use mmulab_report::{LinePlot, ReproRow, ReproTable, Series};
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
    pub n: usize,
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
            let s = summarize(&v);
            Point {
                x,
                mean_us: s.mean,
                sd_us: s.sd,
                n: v.len(),
            }
        })
        .collect())
}

pub fn reproduce(
    dir: &Path,
    quick: bool,
    out: Option<&Path>,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<ReproTable, SpecError> {
    let mut table = ReproTable::default();

    // Fig. 2.
    progress("Fig. 2: the tester with 1-15 children");
    let fig2 = PaperSpec::load(&dir.join("fig2.toml"))?;
    let runs = if quick { 3 } else { fig2.spec(&[])?.runs };
    let xs: Vec<u64> = (1..=15).collect();
    let points = initiator_points(&fig2, &xs, runs, |k| vec![format!("workload.children={k}")])?;
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
    table.push(
        ReproRow::numeric("Fig. 2", "first_processor_us", first, fit.at(1.0), tol)
            .with_note("fit over 1-12 at one processor (the paper's 430 µs)"),
    );
    table.push(
        ReproRow::numeric("Fig. 2", "slope_us_per_cpu", slope, fit.slope, tol)
            .with_note("per additional processor"),
    );
    table.push(
        ReproRow::numeric("Fig. 2", "intercept_us", first - slope, fit.intercept, tol)
            .with_note("the line at 0 processors: 430 - 55 = 375 µs"),
    );
    table.push(ReproRow::plot_only(
        "Fig. 2",
        "r2",
        None,
        fit.r2,
        "least-squares fit quality",
    ));
    for p in &points {
        let paper_line = first + slope * (p.x as f64 - 1.0);
        table.push(ReproRow::plot_only(
            "Fig. 2",
            &format!("initiator_us[{}]", p.x),
            Some(paper_line),
            p.mean_us,
            &format!(
                "mean ± {:.1} sd over {} runs; paper value is its line",
                p.sd_us, p.n
            ),
        ));
    }

    // §8 extrapolation.
    progress("§8: the tester on 32-1024 CPUs");
    let ext = PaperSpec::load(&dir.join("sec8-extrapolation.toml"))?;
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
    table.push(
        ReproRow::numeric(
            "§8",
            "initiator_us_at_100_processors",
            ext.number("at_100_processors_us")?,
            ext_fit.at(100.0),
            ext.number("tolerance_pct")?,
        )
        .with_note("line through the 32-1024 CPU runs, at 100 responders"),
    );
    for p in &ext_points {
        table.push(ReproRow::plot_only(
            "§8",
            &format!("initiator_us[{} cpus]", p.x),
            None,
            p.mean_us,
            "children = CPUs - 1",
        ));
    }

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
        plot.add(Series::points(
            "mmulab (mean ± sd)",
            points.iter().map(|p| (p.x as f64, p.mean_us)).collect(),
            points.iter().map(|p| p.sd_us).collect(),
        ));
        plot.add(Series::line(
            "mmulab fit (1-12)",
            (1..=15).map(|x| (x as f64, fit.at(x as f64))).collect(),
        ));
        plot.add(Series::line(
            "paper: 430 + 55 (n - 1)",
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
        plot.add(Series::points(
            "mmulab",
            ext_points.iter().map(|p| (p.x as f64, p.mean_us)).collect(),
            vec![],
        ));
        plot.add(Series::line(
            "paper: ~6 ms at 100",
            vec![(100.0, 6000.0), (100.0, 6000.0)],
        ));
        plot.write_svg(&out.join("black89-sec8.svg"))
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
        table
            .write_json(&out.join("reproduce-black89.json"))
            .map_err(|err| SpecError::Io {
                path: out.display().to_string(),
                err,
            })?;
    }
    Ok(table)
}
