//! `mmulab reproduce balan92`: §Shutdown Measurements on the
//! `sequent-symmetry-1992` preset. Fig. 1 (basic cost, plot only), Fig. 2
//! (lazy), Fig. 3 (immediate), the responders' costs, and the segkmem
//! measurement (calls to `hat_shutdown` per 100 allocations). The preset
//! holds component costs only; every number here emerges from the svr42
//! protocol's steps.

use std::path::Path;

use mmulab_engine::{Clock, LinearFit};
use mmulab_report::{LinePlot, ReproRow, ReproTable, Series};
use rayon::prelude::*;

use super::PaperSpec;
use crate::run::run_seed;
use crate::spec::SpecError;

/// Per CPU count: the initiator's mean (µs) over the run's samples, and the
/// responders' samples (µs).
#[derive(Clone, Debug)]
struct Point {
    cpus: u64,
    initiator_us: f64,
    responders_us: Vec<f64>,
    initiators_us: Vec<f64>,
}

fn sweep(ps: &PaperSpec, hist: &str, responder_hist: &str) -> Result<Vec<Point>, SpecError> {
    let cpus = ps.list("cpus")?;
    let specs: Vec<_> = cpus
        .iter()
        .map(|&n| ps.spec(&[format!("machine.cpus={n}")]).map(|s| (n, s)))
        .collect::<Result<_, _>>()?;
    let points = specs
        .par_iter()
        .map(|(n, spec)| {
            let out = run_seed(spec, spec.seed);
            assert_eq!(
                out.sim.oracle.violations, 0,
                "{} cpus={n}: the oracle found violations",
                ps.origin
            );
            let clock = Clock::new(spec.costs.clock_hz);
            let us = |name: &str| -> Vec<f64> {
                out.sim
                    .hists
                    .get(name)
                    .map(|h| h.samples().iter().map(|&c| clock.us_f64(c)).collect())
                    .unwrap_or_default()
            };
            let initiators_us = us(hist);
            assert!(
                !initiators_us.is_empty(),
                "{} cpus={n}: no `{hist}` samples",
                ps.origin
            );
            Point {
                cpus: *n,
                initiator_us: initiators_us.iter().sum::<f64>() / initiators_us.len() as f64,
                responders_us: us(responder_hist),
                initiators_us,
            }
        })
        .collect();
    Ok(points)
}

/// §Immediate Shutdown Algorithm: for a large range, clearing only the
/// level-1 entries while the responders spin "reduces the time processors
/// spin uselessly". The Fig. 3 test with larger unmaps, trick on and off.
fn l1_trick(fig3: &PaperSpec, quick: bool, table: &mut ReproTable) -> Result<(), SpecError> {
    let sizes: &[u64] = if quick {
        &[1, 1024]
    } else {
        &[1, 64, 256, 1024]
    };
    let mut spin = Vec::new();
    for &pages in sizes {
        for trick in [false, true] {
            let spec = fig3.spec(&[
                "machine.cpus=6".into(),
                format!("workload.pages={pages}"),
                format!("protocol_options.l1_trick_pages={}", u64::from(trick)),
            ])?;
            let out = run_seed(&spec, spec.seed);
            assert_eq!(out.sim.oracle.violations, 0, "L1 trick ablation");
            let clock = Clock::new(spec.costs.clock_hz);
            let mean = |name: &str| {
                let h = &out.sim.hists[name];
                clock.us_f64(h.summary().mean)
            };
            let resp = mean("shootdown.user.responder_cycles");
            let init = mean("shootdown.user.initiator_cycles");
            let on = if trick { "on" } else { "off" };
            table.push(ReproRow::plot_only(
                "L1 trick",
                &format!("responder_us[{pages} pages, {on}]"),
                None,
                resp,
                &format!("initiator {init:.1} us"),
            ));
            spin.push((pages, trick, resp));
        }
    }
    let at = |p: u64, t: bool| {
        spin.iter()
            .find(|&&(q, u, _)| q == p && u == t)
            .map(|x| x.2)
            .expect("measured")
    };
    let big = *sizes.last().expect("sizes");
    table.push(ReproRow::claim(
        "L1 trick",
        &format!("responder_spin_saved_us[{big} pages]"),
        Some(at(big, false) - at(big, true)),
        at(big, true) < at(big, false),
        "responders spin less when only the L1 entries are cleared",
    ));
    Ok(())
}

/// §Background: "When operating on a large address range, all the page
/// table chunks that does not have a corresponding mapping chunk are
/// skipped". A 1024-page unmap with one page touched, chunks on and off
/// (6 CPUs, the L1 trick off so that only the scan differs).
fn chunks(fig3: &PaperSpec, table: &mut ReproTable) -> Result<(), SpecError> {
    let mut t = Vec::new();
    for on in [true, false] {
        let spec = fig3.spec(&[
            "machine.cpus=6".into(),
            "workload.pages=1024".into(),
            "workload.touch_pages=1".into(),
            "protocol_options.l1_trick_pages=0".into(),
            format!("protocol_options.mapping_chunks={on}"),
        ])?;
        let out = run_seed(&spec, spec.seed);
        assert_eq!(out.sim.oracle.violations, 0, "chunk ablation");
        let clock = Clock::new(spec.costs.clock_hz);
        let init = clock.us_f64(
            out.sim.hists["shootdown.user.initiator_cycles"]
                .summary()
                .mean,
        );
        let label = if on { "on" } else { "off" };
        table.push(ReproRow::plot_only(
            "chunks",
            &format!("initiator_us[1024 pages, 1 touched, chunks {label}]"),
            None,
            init,
            &format!(
                "{} entries examined by the run's range operations",
                out.sim.counters.get("svr42.entries_examined")
            ),
        ));
        t.push(init);
    }
    table.push(ReproRow::claim(
        "chunks",
        "initiator_us_saved",
        Some(t[1] - t[0]),
        t[0] < t[1],
        "range operations skip spans with no mapping chunk",
    ));
    Ok(())
}

fn fit(points: &[Point]) -> LinearFit {
    LinearFit::fit(
        &points
            .iter()
            .map(|p| (p.cpus as f64, p.initiator_us))
            .collect::<Vec<_>>(),
    )
    .expect("at least two points")
}

/// Mean over the CPU counts of `a - b`.
fn mean_gap(a: &[Point], b: &[Point]) -> f64 {
    let gaps: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| {
            assert_eq!(x.cpus, y.cpus);
            x.initiator_us - y.initiator_us
        })
        .collect();
    gaps.iter().sum::<f64>() / gaps.len() as f64
}

pub fn reproduce(
    dir: &Path,
    quick: bool,
    out: Option<&Path>,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<ReproTable, SpecError> {
    let mut table = ReproTable::default();

    progress("Fig. 1: hat_shutdown(HAT_NOCOOKIE), 2-6 CPUs");
    let fig1 = PaperSpec::load(&dir.join("fig1-basic.toml"))?;
    let basic = sweep(
        &fig1,
        "hat.shutdown.basic.initiator_cycles",
        "shootdown.kernel.responder_cycles",
    )?;
    let basic_fit = fit(&basic);
    for p in &basic {
        table.push(ReproRow::plot_only(
            "Fig. 1",
            &format!("basic_us[{}]", p.cpus),
            None,
            p.initiator_us,
            "plot only: mean of 10 samples",
        ));
    }
    table.push(ReproRow::plot_only(
        "Fig. 1",
        "r2",
        None,
        basic_fit.r2,
        "linearity of the basic cost (paper: \"not exactly linear\")",
    ));

    progress("Fig. 2: the lazy algorithm, cookie newer than every CPU");
    let fig2 = PaperSpec::load(&dir.join("fig2-lazy.toml"))?;
    let lazy = sweep(
        &fig2,
        "hat.shutdown.lazy.initiator_cycles",
        "shootdown.kernel.responder_cycles",
    )?;
    let lazy_fit = fit(&lazy);
    let tol2 = fig2.number("tolerance_pct")?;
    table.push(
        ReproRow::numeric(
            "Fig. 2",
            "overhead_over_basic_us",
            fig2.number("overhead_over_basic_us")?,
            mean_gap(&lazy, &basic),
            tol2,
        )
        .with_note("mean over 2-6 CPUs of lazy - basic"),
    );
    table.push(
        ReproRow::numeric(
            "Fig. 2",
            "slope_us_per_cpu",
            fig2.number("slope_us_per_cpu")?,
            lazy_fit.slope,
            tol2,
        )
        .with_note("least-squares slope over 2-6 CPUs"),
    );
    let lazy_resp: Vec<f64> = lazy
        .iter()
        .flat_map(|p| p.responders_us.iter().copied())
        .collect();
    let (rmin, rmax) = lazy_resp
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    table.push(ReproRow::claim(
        "Fig. 2",
        "responder_us",
        Some(rmax),
        !lazy_resp.is_empty() && rmax - rmin < 1.0,
        "responders: a fixed time (one TLB flush), whatever the CPU count",
    ));

    progress("Fig. 3: the immediate algorithm, one page unmapped");
    let fig3 = PaperSpec::load(&dir.join("fig3-immediate.toml"))?;
    let imm = sweep(
        &fig3,
        "shootdown.user.initiator_cycles",
        "shootdown.user.responder_cycles",
    )?;
    let imm_fit = fit(&imm);
    let tol3 = fig3.number("tolerance_pct")?;
    table.push(
        ReproRow::numeric(
            "Fig. 3",
            "overhead_over_basic_us",
            fig3.number("overhead_over_basic_us")?,
            mean_gap(&imm, &basic),
            tol3,
        )
        .with_note("mean over 2-6 CPUs of immediate - basic"),
    );
    table.push(
        ReproRow::numeric(
            "Fig. 3",
            "slope_us_per_cpu",
            fig3.number("slope_us_per_cpu")?,
            imm_fit.slope,
            tol3,
        )
        .with_note("least-squares slope over 2-6 CPUs"),
    );
    table.push(
        ReproRow::numeric(
            "Fig. 2-3",
            "lazy_minus_immediate_us",
            fig3.number("lazy_minus_immediate_us")?,
            mean_gap(&lazy, &imm),
            tol3,
        )
        .with_note("mean over 2-6 CPUs"),
    );
    let bounded = imm.iter().all(|p| {
        let max_init = p.initiators_us.iter().copied().fold(f64::MIN, f64::max);
        p.responders_us.iter().all(|&r| r <= max_init)
    });
    let worst = imm
        .iter()
        .flat_map(|p| p.responders_us.iter().copied())
        .fold(0.0, f64::max);
    table.push(ReproRow::claim(
        "Fig. 3",
        "responder_us",
        Some(worst),
        bounded,
        "responders: upper bounded by the initiator's time",
    ));

    progress("Ablation: the L1 trick vs range size (6 CPUs)");
    l1_trick(&fig3, quick, &mut table)?;

    progress("Ablation: mapping chunks on a sparse range");
    chunks(&fig3, &mut table)?;

    // The fits extended to larger machines (the paper: "we should be able
    // to scale well in the range of tens of processors").
    let ext2 = fig2.number("extend_to_cpus")?;
    let ext3 = fig3.number("extend_to_cpus")?;
    table.push(ReproRow::plot_only(
        "Fig. 2",
        &format!("lazy_us[{ext2} cpus, fit]"),
        None,
        lazy_fit.at(ext2),
        "the 2-6 CPU line extended",
    ));
    table.push(ReproRow::plot_only(
        "Fig. 3",
        &format!("immediate_us[{ext3} cpus, fit]"),
        None,
        imm_fit.at(ext3),
        "the 2-6 CPU line extended",
    ));

    progress("segkmem: hat_shutdown calls per 100 allocations");
    let seg = PaperSpec::load(&dir.join("segkmem.toml"))?;
    let sets = if quick {
        vec!["workload.allocations=5000".to_string()]
    } else {
        vec![]
    };
    let spec = seg.spec(&sets)?;
    let r =
        crate::run::run_spec(&spec, |_, _| {}).map_err(|e| SpecError::Invalid(e.to_string()))?;
    assert_eq!(
        r.oracle.violations, 0,
        "{}: the oracle found violations",
        seg.origin
    );
    let allocs = r.counters.get("segkmem.allocs") as f64;
    let calls = r.counters.get("segkmem.hat_shutdown_calls") as f64;
    let real = r.counters.get("hat.shutdown.real") as f64;
    table.push(
        ReproRow::numeric(
            "segkmem",
            "hat_shutdown_calls_per_100_allocations",
            seg.number("hat_shutdown_calls_per_100_allocations")?,
            100.0 * calls / allocs.max(1.0),
            seg.number("tolerance_pct")?,
        )
        .with_note(&format!("{allocs} allocations, idle system")),
    );
    table.push(ReproRow::claim(
        "segkmem",
        "real_shootdowns_per_100_allocations",
        Some(100.0 * real / allocs.max(1.0)),
        real <= calls,
        "actual shootdowns are fewer than hat_shutdown calls",
    ));

    if let Some(out) = out {
        std::fs::create_dir_all(out).map_err(|err| SpecError::Io {
            path: out.display().to_string(),
            err,
        })?;
        let mut plot = LinePlot::new(
            "balan92 Figs. 1-3: shootdown cost (SVR4.2, Symmetry)",
            "processors",
            "initiator time (µs)",
        );
        for (name, pts) in [
            ("basic (Fig. 1)", &basic),
            ("lazy (Fig. 2)", &lazy),
            ("immediate (Fig. 3)", &imm),
        ] {
            plot.add(Series::points(
                name,
                pts.iter()
                    .map(|p| (p.cpus as f64, p.initiator_us))
                    .collect(),
                vec![],
            ));
        }
        plot.write_svg(&out.join("balan92-figs1-3.svg"))
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
        table
            .write_json(&out.join("reproduce-balan92.json"))
            .map_err(|err| SpecError::Io {
                path: out.display().to_string(),
                err,
            })?;
    }
    Ok(table)
}
