//! `mmulab reproduce fleisch89`: runs the specs of `experiments/fleisch89/`
//! and compares with the paper's numbers. Runs are deterministic: the same
//! specs give the same rows, byte for byte.

use crate::Error;
use crate::runs::{self, Layout};
use crate::sim::Preset;
use crate::spec::{self, Fig7Spec, Fig8Spec, NSiteSpec, Table3Spec, WorstCaseSpec};
use mmulab_report::{Experiments, LinePlot, ReproRow, ReproTable, Series};
use std::fmt::Write as _;
use std::path::Path;

/// Runs every spec of `fleisch89/` in `src`. With `out`, writes the SVGs
/// of Figs. 7 and 8 there. `quick` runs fewer seeds and trials.
pub fn reproduce(
    src: &Experiments,
    quick: bool,
    out: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<ReproTable, Error> {
    let mut table = ReproTable::default();
    progress("fleisch89: Table 3");
    table3(src, &mut table)?;
    progress("fleisch89: §7.2 worst case");
    worst_case(src, quick, &mut table)?;
    progress("fleisch89: Fig. 7");
    let fig7 = fig7(src, quick, &mut table)?;
    progress("fleisch89: Fig. 8");
    let fig8 = fig8(src, quick, &mut table)?;
    progress("fleisch89: extension, N-site ping-pong");
    nsite(src, quick, &mut table)?;
    if let Some(out) = out {
        std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
        for (plot, name) in [(fig7, "fleisch89-fig7.svg"), (fig8, "fleisch89-fig8.svg")] {
            plot.write_svg(&out.join(name))
                .map_err(|e| Error::Plot(e.to_string()))?;
        }
    }
    Ok(table)
}

fn stuck(message: String) -> Error {
    Error::Liveness(message)
}

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}

fn preset(name: &str) -> Preset {
    Preset::by_name(name).expect("validated preset")
}

fn table3(src: &Experiments, t: &mut ReproTable) -> Result<(), Error> {
    let s: Table3Spec = spec::load(src, "table3.toml")?;
    s.validate("table3.toml")?;
    let r = runs::table3(&preset(&s.preset)).map_err(stuck)?;
    let a = s.artefact.as_str();
    t.push(ReproRow::numeric(
        a,
        "using site total (ms)",
        s.paper.using_site_ms,
        r.using_site_ms,
        s.tolerance_pct,
    ));
    t.push(ReproRow::numeric(
        a,
        "library site total (ms)",
        s.paper.library_site_ms,
        r.library_site_ms,
        s.tolerance_pct,
    ));
    t.push(
        ReproRow::numeric(
            a,
            "total elapsed, fault to install (ms)",
            s.paper.total_ms,
            r.total_ms,
            s.tolerance_pct,
        )
        .with_note("emerges from the component inputs"),
    );
    Ok(())
}

/// §7.2's budget method applied to per-cycle counts and the preset's costs.
fn budget_ms(p: &Preset, pages: f64, shorts: f64, requests: f64, inputs: f64, locals: f64) -> f64 {
    let page = (p.page_output_ns + p.page_input_ns) as f64;
    let short = (p.short_output_ns + p.short_input_ns) as f64;
    let ns = pages * page
        + shorts * short
        + requests * p.request_fault_ns as f64
        + inputs * p.input_interrupt_ns as f64
        + locals * p.local_fault_ns as f64;
    ns / 1e6
}

fn worst_case(src: &Experiments, quick: bool, t: &mut ReproTable) -> Result<(), Error> {
    let s: WorstCaseSpec = spec::load(src, "worst-case.toml")?;
    s.validate("worst-case.toml")?;
    let p = preset(&s.preset);
    let (trials, seeds) = if quick {
        (s.quick_trials, s.quick_seeds)
    } else {
        (s.trials, s.seeds)
    };
    let r = runs::ping_pong(&p, Layout::TwoSites, 0, true, trials, 0).map_err(stuck)?;
    let c = &r.per_cycle;
    let (pages, shorts) = (c.get("messages_page"), c.get("messages_short"));
    let (requests, inputs, locals) = (
        c.get("request_faults"),
        c.get("input_interrupts"),
        c.get("local_faults"),
    );
    let a = s.artefact.as_str();
    let ct = s.count_tolerance_pct;
    let pp = &s.paper;
    let count = |q: &str, paper: u64, v: u64| ReproRow::numeric(a, q, paper as f64, v as f64, ct);
    t.push(count(
        "messages per cycle",
        pp.messages_per_cycle,
        pages + shorts,
    ));
    t.push(count(
        "page messages per cycle",
        pp.page_messages_per_cycle,
        pages,
    ));
    t.push(count(
        "short messages per cycle",
        pp.short_messages_per_cycle,
        shorts,
    ));
    t.push(
        count(
            "request interrupts per cycle",
            pp.request_interrupts_per_cycle,
            requests,
        )
        .with_note("mmulab counts faults that send a request to a remote library"),
    );
    t.push(count(
        "input interrupts per cycle",
        pp.input_interrupts_per_cycle,
        inputs,
    ));
    t.push(count(
        "local faults per cycle",
        pp.local_faults_per_cycle,
        locals,
    ));
    let paper_counts = budget_ms(
        &p,
        pp.page_messages_per_cycle as f64,
        pp.short_messages_per_cycle as f64,
        pp.request_interrupts_per_cycle as f64,
        pp.input_interrupts_per_cycle as f64,
        pp.local_faults_per_cycle as f64,
    );
    t.push(
        ReproRow::numeric(
            a,
            "budget ms/cycle, paper's counts x preset costs",
            pp.budget_ms_per_cycle,
            paper_counts,
            5.0,
        )
        .with_note("checks the preset against the paper's own arithmetic"),
    );
    let model = budget_ms(
        &p,
        pages as f64,
        shorts as f64,
        requests as f64,
        inputs as f64,
        locals as f64,
    );
    let rt = s.rate_tolerance_pct;
    t.push(ReproRow::numeric(
        a,
        "budget ms/cycle, mmulab's counts",
        pp.budget_ms_per_cycle,
        model,
        rt,
    ));
    t.push(ReproRow::numeric(
        a,
        "bound cycles/s (1000 / budget)",
        pp.bound_cycles_per_s,
        1000.0 / model,
        rt,
    ));
    let rate =
        |layout, yields| runs::ping_pong_rate(&p, layout, 0, yields, trials, seeds).map_err(stuck);
    let single_busy = rate(Layout::SingleSite, false)?;
    let single_yield = rate(Layout::SingleSite, true)?;
    t.push(ReproRow::numeric(
        a,
        "single site, busy-wait (cycles/s)",
        pp.single_site_no_yield_cycles_per_s,
        single_busy,
        rt,
    ));
    t.push(
        ReproRow::numeric(
            a,
            "single site, yield (cycles/s)",
            pp.single_site_yield_cycles_per_s,
            single_yield,
            rt,
        )
        .with_note("calibration: context switch cost is a stated assumption"),
    );
    let colocated = rate(Layout::TwoSites, true)?;
    let third = rate(Layout::ThirdSiteLibrary, true)?;
    t.push(ReproRow::claim(
        a,
        "library on a third site (cycles/s, yield, Δ=0)",
        Some(third),
        third < colocated,
        &format!("slower than colocated ({colocated:.2}/s), as §7.3 argues"),
    ));
    Ok(())
}

struct Curve {
    deltas: Vec<u32>,
    with_yield: Vec<f64>,
    busy_wait: Vec<f64>,
}

fn at(c: &Curve, v: &[f64], delta: u32) -> Option<f64> {
    c.deltas.iter().position(|d| *d == delta).map(|i| v[i])
}

fn fig7(src: &Experiments, quick: bool, t: &mut ReproTable) -> Result<LinePlot, Error> {
    let s: Fig7Spec = spec::load(src, "fig7.toml")?;
    s.validate("fig7.toml")?;
    let p = preset(&s.preset);
    let (deltas, trials, seeds) = if quick {
        (&s.quick_deltas, s.quick_trials, s.quick_seeds)
    } else {
        (&s.deltas, s.trials, s.seeds)
    };
    let rate = |d: u32, y: bool| {
        runs::ping_pong_rate(&p, Layout::TwoSites, d, y, trials, seeds).map_err(stuck)
    };
    let curve = Curve {
        deltas: deltas.clone(),
        with_yield: deltas
            .iter()
            .map(|&d| rate(d, true))
            .collect::<Result<_, _>>()?,
        busy_wait: deltas
            .iter()
            .map(|&d| rate(d, false))
            .collect::<Result<_, _>>()?,
    };
    let a = s.artefact.as_str();
    let (pp, tol) = (&s.paper, s.rate_tolerance_pct);
    let y2 = at(&curve, &curve.with_yield, 2).map_or_else(|| rate(2, true), Ok)?;
    let b2 = at(&curve, &curve.busy_wait, 2).map_or_else(|| rate(2, false), Ok)?;
    let y0 = at(&curve, &curve.with_yield, 0).map_or_else(|| rate(0, true), Ok)?;
    t.push(ReproRow::numeric(
        a,
        "yield, Δ=2 (cycles/s)",
        pp.yield_at_delta2_cycles_per_s,
        y2,
        tol,
    ));
    t.push(ReproRow::numeric(
        a,
        "yield, Δ=2 (ms per cycle)",
        pp.ms_per_cycle_at_delta2,
        1000.0 / y2,
        tol,
    ));
    t.push(ReproRow::claim(
        a,
        "yield, Δ=2, at most the 5 cycles/s bound",
        Some(y2),
        y2 <= pp.max_at_delta2_cycles_per_s * 1.05,
        "paper: 5 cycles/s is the maximum at Δ=2",
    ));
    let gain = (y2 / b2 - 1.0) * 100.0;
    let busy_paper = pp.yield_at_delta2_cycles_per_s / (1.0 + pp.yield_gain_at_delta2_pct / 100.0);
    t.push(
        ReproRow::numeric(a, "busy-wait, Δ=2 (cycles/s)", busy_paper, b2, tol)
            .with_note("paper value derived: 4.5 / 1.5"),
    );
    t.push(ReproRow::numeric(
        a,
        "yield gain over busy-wait, Δ=2 (%)",
        pp.yield_gain_at_delta2_pct,
        gain,
        tol,
    ));
    t.push(ReproRow::numeric(
        a,
        "yield, Δ=0 (cycles/s)",
        pp.expected_at_delta0_cycles_per_s,
        y0,
        tol,
    ));
    t.push(crossing_row(
        a,
        &curve,
        pp.crossing_delta,
        s.crossing_tolerance_ticks,
    ));
    for (i, d) in curve.deltas.iter().enumerate() {
        let note = "plotted";
        t.push(ReproRow::plot_only(
            a,
            &format!("yield, Δ={d} (cycles/s)"),
            None,
            curve.with_yield[i],
            note,
        ));
        t.push(ReproRow::plot_only(
            a,
            &format!("busy-wait, Δ={d} (cycles/s)"),
            None,
            curve.busy_wait[i],
            note,
        ));
    }
    Ok(fig7_plot(&curve, pp))
}

/// The smallest Δ from which busy-waiting is within 5% of yield.
fn crossing_row(a: &str, c: &Curve, paper: u32, tol_ticks: u32) -> ReproRow {
    let crossing = c
        .deltas
        .iter()
        .enumerate()
        .find(|(i, _)| c.busy_wait[*i] >= 0.95 * c.with_yield[*i])
        .map(|(_, d)| *d);
    let q = "curves cross at Δ (ticks)";
    match crossing {
        Some(d) => {
            let tol = tol_ticks as f64 / paper as f64 * 100.0;
            ReproRow::numeric(a, q, paper as f64, d as f64, tol)
                .with_note("busy-wait within 5% of yield")
        }
        None => ReproRow::claim(
            a,
            q,
            None,
            false,
            &format!("paper: Δ={paper}; no crossing in the swept range"),
        ),
    }
}

fn fig7_plot(c: &Curve, pp: &spec::Fig7Paper) -> LinePlot {
    let mut plot = LinePlot::new(
        "fleisch89 Fig. 7: worst case, two remote processes",
        "Δ (ticks of 1/60 s)",
        "cycles/s",
    );
    let xs: Vec<f64> = c.deltas.iter().map(|d| *d as f64).collect();
    plot.add(Series::points(
        "mmulab, yield()",
        xs.iter()
            .copied()
            .zip(c.with_yield.iter().copied())
            .collect(),
        vec![],
    ));
    plot.add(Series::points(
        "mmulab, busy-wait",
        xs.iter()
            .copied()
            .zip(c.busy_wait.iter().copied())
            .collect(),
        vec![],
    ));
    let paper = vec![
        (0.0, pp.expected_at_delta0_cycles_per_s),
        (2.0, pp.yield_at_delta2_cycles_per_s),
    ];
    plot.add(Series::line("paper, yield() (stated values)", paper));
    plot
}

fn fig8(src: &Experiments, quick: bool, t: &mut ReproTable) -> Result<LinePlot, Error> {
    let s: Fig8Spec = spec::load(src, "fig8.toml")?;
    s.validate("fig8.toml")?;
    let p = preset(&s.preset);
    let (deltas, loop_s, seeds) = if quick {
        (&s.quick_deltas, s.quick_loop_s, s.quick_seeds)
    } else {
        (&s.deltas, s.loop_s, s.seeds)
    };
    let setup = runs::ReadWritersSetup {
        third_site_library: s.third_site_library,
        stagger_s: s.stagger_s,
    };
    let rate = |d: u32| -> Result<f64, Error> {
        let mut total = 0.0;
        for seed in 0..seeds {
            total += runs::read_writers(&p, d, loop_s, &setup, seed).map_err(stuck)?;
        }
        Ok(total / seeds as f64)
    };
    let points = deltas
        .iter()
        .map(|&d| Ok((d as f64, rate(d)?)))
        .collect::<Result<Vec<(f64, f64)>, Error>>()?;
    let a = s.artefact.as_str();
    let pp = &s.paper;
    let (peak_delta, peak) = points
        .iter()
        .copied()
        .fold((0.0, f64::MIN), |m, p| if p.1 > m.1 { p } else { m });
    t.push(ReproRow::numeric(
        a,
        "peak throughput (read-write instr/s)",
        pp.peak_per_s,
        peak,
        s.rate_tolerance_pct,
    ));
    t.push(ReproRow::claim(
        a,
        "Δ of the peak (ticks)",
        Some(peak_delta),
        (pp.contention_below_delta as f64..=pp.peak_delta as f64).contains(&peak_delta),
        &format!(
            "paper: peak at Δ={} within the good range 120..=600",
            pp.peak_delta
        ),
    ));
    let lowest = points.first().map_or(0.0, |p| p.1);
    t.push(ReproRow::claim(
        a,
        &format!("contention side, Δ={} (instr/s)", points[0].0),
        Some(lowest),
        lowest < 0.5 * peak,
        "paper: low throughput below Δ=120 (mmulab: below half the peak?)",
    ));
    t.push(retention_row(a, &points, peak_delta, peak));
    for (d, v) in &points {
        t.push(ReproRow::plot_only(
            a,
            &format!("Δ={d} (instr/s)"),
            None,
            *v,
            "plotted",
        ));
    }
    let mut plot = LinePlot::new(
        "fleisch89 Fig. 8: two conflicting read-writers",
        "Δ (ticks of 1/60 s)",
        "read-write instructions/s",
    );
    plot.add(Series::points("mmulab", points, vec![]));
    plot.add(Series::line(
        "paper: peak",
        vec![
            (pp.peak_delta as f64 - 1.0, pp.peak_per_s),
            (pp.peak_delta as f64 + 1.0, pp.peak_per_s),
        ],
    ));
    Ok(plot)
}

/// The retention side falls more gently than the contention side rises:
/// compare the mean slopes (instr/s per tick) on both sides of the peak.
fn retention_row(a: &str, points: &[(f64, f64)], peak_delta: f64, peak: f64) -> ReproRow {
    let first = points.first().copied().unwrap_or((0.0, 0.0));
    let last = points.last().copied().unwrap_or((0.0, 0.0));
    let rising = if peak_delta > first.0 {
        (peak - first.1) / (peak_delta - first.0)
    } else {
        0.0
    };
    let falling = if last.0 > peak_delta {
        (peak - last.1) / (last.0 - peak_delta)
    } else {
        0.0
    };
    ReproRow::claim(
        a,
        "retention slope / contention slope",
        Some(if rising > 0.0 {
            falling / rising
        } else {
            f64::INFINITY
        }),
        falling < rising,
        "paper: the decrease after the peak is more gradual",
    )
}

fn nsite(src: &Experiments, quick: bool, t: &mut ReproTable) -> Result<(), Error> {
    let s: NSiteSpec = spec::load(src, "nsite.toml")?;
    s.validate("nsite.toml")?;
    let p = preset(&s.preset);
    let (sites, rounds) = if quick {
        (&s.quick_sites, s.quick_rounds)
    } else {
        (&s.sites, s.rounds)
    };
    let a = s.artefact.as_str();
    for &n in sites {
        let r = runs::ring(&p, n, s.delta_ticks, rounds, 0).map_err(stuck)?;
        let per_pass_ms = 1000.0 / r.cycles_per_s / n as f64;
        let msgs = r.per_cycle.get("messages_short") + r.per_cycle.get("messages_page");
        let note = format!("extension, no paper value; Δ={}", s.delta_ticks);
        t.push(ReproRow::plot_only(
            a,
            &format!("N={n}: ms per token pass"),
            None,
            per_pass_ms,
            &note,
        ));
        t.push(ReproRow::plot_only(
            a,
            &format!("N={n}: messages per pass"),
            None,
            msgs as f64 / n as f64,
            &note,
        ));
    }
    Ok(())
}

/// The per-cycle message timeline of the two-site ping-pong at Δ=0 with
/// yield() (the paper's Fig. 6 is not in the text), with its counts beside
/// §7.2's stated ones.
pub fn pingpong_timeline(delta_ticks: u32) -> String {
    let p = Preset::vax_locus_1989();
    let mut out = String::new();
    let r = match runs::ping_pong(&p, Layout::TwoSites, delta_ticks, true, 40, 0) {
        Ok(r) => r,
        Err(e) => return format!("ping-pong timeline: {e}\n"),
    };
    let _ = writeln!(
        out,
        "Ping-pong, two sites (library on site 0 with process 1), Δ={delta_ticks}, yield():"
    );
    let t0 = r.timeline.first().map_or(0, |e| e.0);
    for (ns, site, text) in &r.timeline {
        let _ = writeln!(
            out,
            "  {:8.2} ms  site {site}  {text}",
            (ns - t0) as f64 / 1e6
        );
    }
    let c = &r.per_cycle;
    let _ = writeln!(
        out,
        "per cycle: {} messages ({} page, {} short), {} remote-request faults, {} input interrupts, {} local faults",
        c.get("messages_page") + c.get("messages_short"),
        c.get("messages_page"),
        c.get("messages_short"),
        c.get("request_faults"),
        c.get("input_interrupts"),
        c.get("local_faults"),
    );
    let _ = writeln!(
        out,
        "paper (§7.2): 9 messages (3 page, 6 short), 5 request interrupts, 6 input interrupts, 2 local faults"
    );
    out
}
