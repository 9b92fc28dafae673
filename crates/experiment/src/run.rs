//! Runs a spec: builds the machine, the protocol and the workload for each
//! seed, runs the simulation and merges the results.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use mmulab_engine::Histogram;
use mmulab_kernel::{Sim, SimConfig};
use mmulab_machine::oracle::OracleReport;
use mmulab_protocols::ProtocolOptions;
use mmulab_workloads::WorkloadReport;

use crate::results::{HostInfo, LivenessReport, Results};
use crate::spec::Spec;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Spec(#[from] crate::spec::SpecError),
}

/// One seed's raw outcome.
pub struct SeedOutcome {
    pub seed: u64,
    pub sim: mmulab_kernel::SimResult,
    pub workload: WorkloadReport,
}

fn sim_config(spec: &Spec, seed: u64) -> SimConfig {
    SimConfig {
        cpus: spec.machine.cpus,
        tlb: spec.machine.tlb.clone(),
        pt_format: spec.machine.page_table,
        costs: spec.costs.clone(),
        quantum_cycles: spec.engine.quantum_cycles,
        memory_frames: spec.machine.memory_mb * 256,
        seed,
        spin_bound: spec.engine.spin_bound,
        max_cycles: spec.engine.max_cycles,
        disabled_windows: spec.kernel.disabled_windows.clone(),
        trap_disabled_mean_cycles: spec.kernel.trap_disabled_mean_cycles,
        kernel: mmulab_kernel::KernelParams {
            hz: spec.kernel.hz,
            segkmem_pages: spec.kernel.segkmem_pages,
            segkmem_zone_bytes: spec.kernel.segkmem_zone_bytes,
            segmap_pages: spec.kernel.segmap_pages,
            segmap_chunk_pages: spec.kernel.segmap_chunk_bytes / 4096,
            segmap_eager: spec.kernel.segmap_eager,
            pageout_global: spec.kernel.pageout_global,
            segkmem_first_fit: spec.kernel.segkmem_first_fit,
            apic_flat_max_cpus: spec.kernel.apic_flat_max_cpus,
            disabled_ipl: crate::spec::kernel_disabled_ipl(&spec.kernel.disabled_level)
                .expect("validated kernel.disabled_level"),
        },
        memory: spec.memory.clone(),
    }
}

/// Runs one seed of a (validated) spec. Once [`cancel_seeds_on`]'s flag is
/// raised, it unwinds with [`Cancelled`] instead of returning (at its
/// start, or from inside the simulation), so that code built on seeds
/// (the reproductions) stops without ever seeing a seed cut short.
pub fn run_seed(spec: &Spec, seed: u64) -> SeedOutcome {
    let cancel = CANCEL.get();
    let raised = || cancel.is_some_and(|f| f.load(Ordering::Relaxed));
    if raised() {
        std::panic::resume_unwind(Box::new(Cancelled));
    }
    let out = run_seed_until(spec, seed, cancel);
    if out.sim.interrupted && raised() {
        std::panic::resume_unwind(Box::new(Cancelled));
    }
    out
}

/// The flag that cancels [`run_seed`] (set once, by the binary's Ctrl-C
/// handling for `reproduce`).
static CANCEL: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

/// Makes every [`run_seed`] watch `flag`: raised, a seed unwinds with a
/// [`Cancelled`] payload (through `resume_unwind`: no panic message), for
/// the caller to catch with `std::panic::catch_unwind`. Only the first
/// call counts.
pub fn cancel_seeds_on(flag: Arc<AtomicBool>) {
    let _ = CANCEL.set(flag);
}

/// The payload [`run_seed`] unwinds with once cancelled.
#[derive(Debug)]
pub struct Cancelled;

/// [`run_seed`], stopped early when `stop` is raised (the outcome's
/// `sim.interrupted` says so).
pub fn run_seed_until(spec: &Spec, seed: u64, stop: Option<&Arc<AtomicBool>>) -> SeedOutcome {
    let entry = mmulab_protocols::find(&spec.protocol).expect("validated protocol");
    let o = &spec.protocol_options;
    let opts = ProtocolOptions {
        lazy: o.lazy,
        flush_threshold: o.flush_threshold,
        action_queue: o.action_queue,
        single_entry_flush: o.single_entry_flush,
        l1_trick_pages: o.l1_trick_pages,
        mapping_chunks: o.mapping_chunks,
        shoot_lock_when_alone: o.shoot_lock_when_alone,
        fork_chunk_unlock: o.fork_chunk_unlock,
        hat_lock_per_pt: o.hat_lock_per_pt,
        shootdown_level: mmulab_protocols::ShootdownLevel::parse(&o.shootdown_level)
            .expect("validated protocol_options.shootdown_level"),
        interrupt_send: mmulab_protocols::InterruptSend::parse(&o.interrupt_send)
            .expect("validated protocol_options.interrupt_send"),
        remote_invalidate: o.remote_invalidate,
    };
    let protocol = (entry.make)(&opts);
    let sim = Sim::new(
        sim_config(spec, seed),
        protocol as Rc<dyn mmulab_kernel::Protocol>,
    );
    if let Some(flag) = stop {
        sim.set_interrupt(flag.clone());
    }
    let mut workload = spec.workload.build();
    workload.start(&sim);
    sim.boot();
    let result = sim.run();
    SeedOutcome {
        seed,
        sim: result,
        workload: workload.report(),
    }
}

/// Runs every seed of a spec and merges them into one result.
pub fn run_spec(spec: &Spec, progress: impl FnMut(u64, u64)) -> Result<Results, RunError> {
    run_spec_until(spec, progress, None)
}

/// [`run_spec`], stopped when `stop` is raised: the seed running then ends
/// early, no further seed starts, and the results keep what ran, marked
/// `interrupted`.
pub fn run_spec_until(
    spec: &Spec,
    mut progress: impl FnMut(u64, u64),
    stop: Option<&Arc<AtomicBool>>,
) -> Result<Results, RunError> {
    let start = Instant::now();
    let mut outcomes = Vec::new();
    let mut interrupted = false;
    for r in 0..spec.runs {
        let out = run_seed_until(spec, spec.seed.wrapping_add(r), stop);
        interrupted = out.sim.interrupted;
        outcomes.push(out);
        progress(r + 1, spec.runs);
        if interrupted || stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            interrupted = true;
            break;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let mut results = merge(spec, outcomes, wall);
    results.interrupted = interrupted;
    Ok(results)
}

pub fn machine_description() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    format!("{model}, {cpus} cores, {}", std::env::consts::OS)
}

pub fn merge(spec: &Spec, outcomes: Vec<SeedOutcome>, wall_s: f64) -> Results {
    let clock = mmulab_engine::Clock::new(spec.costs.clock_hz);
    let mut counters = mmulab_engine::Counters::default();
    let mut hists: BTreeMap<String, Histogram> = BTreeMap::new();
    let mut oracle: Option<OracleReport> = None;
    let mut workload: Option<WorkloadReport> = None;
    let mut liveness = Vec::new();
    let mut cycles = 0;
    let mut refs = 0;
    for o in &outcomes {
        counters.merge(&o.sim.counters);
        if o.sim.timed_out {
            counters.add("runs.timed_out", 1);
        }
        for (k, h) in &o.sim.hists {
            hists.entry(k.clone()).or_default().extend(h);
        }
        match &mut oracle {
            None => oracle = Some(o.sim.oracle.clone()),
            Some(r) => r.merge(&o.sim.oracle),
        }
        match &mut workload {
            None => workload = Some(o.workload.clone()),
            Some(w) => {
                if o.workload.verdict != "consistent" {
                    w.verdict = o.workload.verdict.clone();
                }
                for (k, v) in &o.workload.figures {
                    *w.figures.entry(k.clone()).or_default() += v;
                }
                w.notes.extend(o.workload.notes.iter().cloned());
            }
        }
        if let Some(l) = &o.sim.liveness {
            liveness.push(LivenessReport {
                seed: o.seed,
                failure: l.clone(),
            });
        }
        cycles += o.sim.end.0;
        refs += o.sim.refs;
    }
    let mut histograms = BTreeMap::new();
    for (k, h) in &hists {
        let s = h.summary();
        histograms.insert(k.clone(), s);
        if let Some(base) = k.strip_suffix("_cycles") {
            let us = |v: f64| clock.us_f64(v);
            let mut u = s;
            (u.mean, u.sd, u.median, u.p10, u.p90, u.min, u.max) = (
                us(s.mean),
                us(s.sd),
                us(s.median),
                us(s.p10),
                us(s.p90),
                us(s.min),
                us(s.max),
            );
            histograms.insert(format!("{base}_us"), u);
        }
    }
    Results {
        spec: spec.to_json(),
        seed: spec.seed,
        version: env!("CARGO_PKG_VERSION").to_string(),
        runs: outcomes.len() as u64,
        simulated_cycles: cycles,
        counters,
        histograms,
        fits: BTreeMap::new(),
        oracle: oracle.expect("at least one run"),
        workload: workload.expect("at least one run"),
        liveness,
        interrupted: false,
        host: HostInfo {
            wall_s,
            refs_per_second: if wall_s > 0.0 {
                refs as f64 / wall_s
            } else {
                0.0
            },
            machine: machine_description(),
            profile: if cfg!(debug_assertions) {
                "debug".into()
            } else {
                "release".into()
            },
        },
    }
}
