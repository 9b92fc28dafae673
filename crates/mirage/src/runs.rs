//! The paper's experiments as simulation runs. Each returns what it
//! measured; nothing here knows the paper's numbers.

use crate::sim::workload::Program;
use crate::sim::{Preset, Sim};
use mmulab_engine::{Counters, SimRng};

/// Where the library sits in a ping-pong run (§7.2, §7.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Both processes on one site (§7.2's single-site gauge).
    SingleSite,
    /// Two sites, the library on process 1's site (as measured).
    TwoSites,
    /// Two user sites and the library on a third (§7.3's variant).
    ThirdSiteLibrary,
}

#[derive(Clone, Debug)]
pub struct Table3Result {
    pub using_site_ms: f64,
    pub library_site_ms: f64,
    pub total_ms: f64,
}

/// Table 3: a process obtains a checked-in page from a remote library.
pub fn table3(preset: &Preset) -> Result<Table3Result, String> {
    let mut sim = Sim::new(preset.clone(), 2, Sim::core_config(preset));
    sim.create_segment(0, 1, 0, &[1]);
    // A one-shot reader: await the initial zero (it faults once).
    sim.spawn(
        1,
        Program::Ring {
            index: 0,
            n: 1,
            round: 0,
            rounds: 1,
            writing: false,
            yields: true,
        },
        0,
    );
    sim.run(u64::MAX / 4)?;
    let busy = &sim.busy_at_wake_ns[0];
    // The using site's first dispatch of the process precedes the fault.
    let first_switch = preset.context_switch_ns + preset.remap_per_page_ns;
    Ok(Table3Result {
        using_site_ms: (busy[1] - first_switch) as f64 / 1e6,
        library_site_ms: busy[0] as f64 / 1e6,
        total_ms: sim.fault_latencies_ns.first().copied().unwrap_or(0) as f64 / 1e6,
    })
}

#[derive(Clone, Debug)]
pub struct PingPongResult {
    pub cycles_per_s: f64,
    /// Mean per-cycle counts in the steady state (whole numbers, rounded
    /// down; [`PingPongResult::mean_per_cycle`] keeps the fraction).
    pub per_cycle: Counters,
    /// The counts over the whole steady span.
    pub steady_totals: Counters,
    pub steady_cycles: u64,
    /// The steady span, in seconds.
    pub steady_s: f64,
    /// The message timeline of one steady-state cycle (§7.2, Fig. 6).
    pub timeline: Vec<(u64, usize, String)>,
}

/// The worst-case ping-pong of Fig. 4 at Δ = `delta_ticks`.
pub fn ping_pong(
    preset: &Preset,
    layout: Layout,
    delta_ticks: u32,
    yields: bool,
    trials: u64,
    seed: u64,
) -> Result<PingPongResult, String> {
    let (n_sites, library, p1_site, p2_site) = match layout {
        Layout::SingleSite => (1, 0, 0, 0),
        Layout::TwoSites => (2, 0, 0, 1),
        Layout::ThirdSiteLibrary => (3, 2, 0, 1),
    };
    let mut sim = Sim::new(preset.clone(), n_sites, Sim::core_config(preset));
    sim.trace = Some(Vec::new());
    let mut attach: Vec<usize> = vec![p1_site, p2_site];
    attach.dedup();
    sim.create_segment(library, preset.pingpong_segment_pages, delta_ticks, &attach);
    // The seed only draws the processes' start phases against the clock
    // ticks and the quantum: the model itself has no randomness.
    let mut rng = SimRng::new(seed, "pingpong-phase");
    let tick = preset.tick_ns;
    let page = preset.page_bytes;
    sim.spawn(
        p1_site,
        Program::ping_pong(true, trials, yields, page),
        rng.below(tick),
    );
    sim.spawn(
        p2_site,
        Program::ping_pong(false, trials, yields, page),
        rng.below(tick),
    );
    sim.run(u64::MAX / 4)?;
    steady_state(&sim, trials)
}

/// Rates and per-cycle counts over the middle of the run (the first
/// quarter is warm-up).
fn steady_state(sim: &Sim, trials: u64) -> Result<PingPongResult, String> {
    let marks = &sim
        .marks
        .iter()
        .find(|m| !m.is_empty())
        .cloned()
        .unwrap_or_default();
    let cycles = marks.len().saturating_sub(1);
    if cycles < 5 {
        return Err(format!("too few cycles ({cycles}) of {trials}"));
    }
    // The last cycle is left out too: the partner process exits in it, and
    // its site's detach (check-in messages) is shutdown, not the steady state.
    let (a, b) = (cycles / 4, cycles - 2);
    let span_s = (marks[b] - marks[a]) as f64 / 1e9;
    let steady_cycles = (b - a) as u64;
    let mut per_cycle = Counters::default();
    let mut steady_totals = Counters::default();
    let (ca, cb) = (&sim.mark_counters[a], &sim.mark_counters[b]);
    for (k, v) in &cb.0 {
        per_cycle.add(k, (v - ca.get(k)) / steady_cycles.max(1));
        steady_totals.add(k, v - ca.get(k));
    }
    let (t0, t1) = (marks[b - 1], marks[b]);
    let timeline = sim
        .trace
        .as_ref()
        .map(|t| {
            t.iter()
                .filter(|(ns, _, _)| *ns >= t0 && *ns <= t1)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    Ok(PingPongResult {
        cycles_per_s: steady_cycles as f64 / span_s,
        per_cycle,
        steady_totals,
        steady_cycles,
        steady_s: span_s,
        timeline,
    })
}

impl PingPongResult {
    /// The mean count of `key` per steady-state cycle.
    pub fn mean_per_cycle(&self, key: &str) -> f64 {
        self.steady_totals.get(key) as f64 / self.steady_cycles.max(1) as f64
    }

    /// The fraction of the steady span the sites' CPUs were busy (protocol
    /// interrupts, server processes, context switches, user work), summed
    /// over the sites: what the run leaves to other processes is the rest.
    pub fn cpu_busy_fraction(&self) -> f64 {
        self.steady_totals.get("cpu_busy_us") as f64 / 1e6 / self.steady_s
    }
}

/// Mean cycles per second over seeds.
pub fn ping_pong_rate(
    preset: &Preset,
    layout: Layout,
    delta: u32,
    yields: bool,
    trials: u64,
    seeds: u64,
) -> Result<f64, String> {
    let mut total = 0.0;
    for seed in 0..seeds {
        total += ping_pong(preset, layout, delta, yields, trials, seed)?.cycles_per_s;
    }
    Ok(total / seeds as f64)
}

/// The N-site extension: a token passed around N sites through one word.
pub fn ring(
    preset: &Preset,
    n: u64,
    delta_ticks: u32,
    rounds: u64,
    seed: u64,
) -> Result<PingPongResult, String> {
    let mut sim = Sim::new(preset.clone(), n as usize, Sim::core_config(preset));
    let sites: Vec<usize> = (0..n as usize).collect();
    sim.create_segment(0, preset.pingpong_segment_pages, delta_ticks, &sites);
    let mut rng = SimRng::new(seed, "ring-phase");
    for i in 0..n {
        sim.spawn(
            i as usize,
            Program::ring(i, n, rounds, true),
            rng.below(preset.tick_ns),
        );
    }
    sim.run(u64::MAX / 4)?;
    steady_state(&sim, rounds)
}

/// §8: two conflicting read-writers decrement separate counters of one
/// page for `loop_s` seconds of work each; read-write instructions per
/// second over the whole run.
pub fn read_writers(
    preset: &Preset,
    delta_ticks: u32,
    loop_s: f64,
    setup: &ReadWritersSetup,
    seed: u64,
) -> Result<f64, String> {
    read_writers_run(preset, delta_ticks, loop_s, setup, seed).map(|r| r.instr_per_s)
}

/// What one run of §8's read-writers measured.
#[derive(Clone, Debug)]
pub struct ReadWritersResult {
    /// Read-write instructions per second over the whole run.
    pub instr_per_s: f64,
    /// When the last process finished its loop, simulated ns.
    pub end_ns: u64,
    /// The run's counters (messages, faults, interrupts, Δ sleeps).
    pub counters: Counters,
}

/// [`read_writers`], with the run's end and counters.
pub fn read_writers_run(
    preset: &Preset,
    delta_ticks: u32,
    loop_s: f64,
    setup: &ReadWritersSetup,
    seed: u64,
) -> Result<ReadWritersResult, String> {
    let (n_sites, library) = if setup.third_site_library {
        (3, 2)
    } else {
        (2, 0)
    };
    let mut sim = Sim::new(preset.clone(), n_sites, Sim::core_config(preset));
    sim.create_segment(library, 1, delta_ticks, &[0, 1]);
    let iterations = (loop_s * 1e9 / preset.loop_iteration_ns as f64) as u64;
    let mut rng = SimRng::new(seed, "readwriters-phase");
    let stagger = (setup.stagger_s * 1e9) as u64;
    sim.spawn(
        0,
        Program::counter(0, iterations),
        rng.below(preset.tick_ns),
    );
    sim.spawn(
        1,
        Program::counter(1, iterations),
        stagger + rng.below(preset.tick_ns),
    );
    sim.run(u64::MAX / 4)?;
    let end = sim
        .marks
        .iter()
        .filter_map(|m| m.last())
        .max()
        .copied()
        .unwrap_or(1);
    Ok(ReadWritersResult {
        instr_per_s: (2 * iterations) as f64 / (end as f64 / 1e9),
        end_ns: end,
        counters: sim.counters.clone(),
    })
}

/// §8's unstated setup, as stated assumptions in the spec.
#[derive(Clone, Debug, Default)]
pub struct ReadWritersSetup {
    /// The library on a third site rather than with process 1.
    pub third_site_library: bool,
    /// Process 2 starts this much after process 1.
    pub stagger_s: f64,
}
