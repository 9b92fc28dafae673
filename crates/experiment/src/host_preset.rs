//! A `host` timing preset from real measurements (`mmulab host preset`):
//! the simulator's clock is set to 1 GHz so a cycle is a nanosecond, the
//! measured line (baseline, fixed remote cost, per-responder slope) is
//! split into the model's components, and the simulator's tester then
//! predicts the measured latency at each thread count.
//!
//! The split (documented in the preset it writes):
//! * per responder (the slope): posting the interrupt (`ipi_send`) and
//!   queueing the action with its lock (`action_queue` + lock + unlock),
//!   half each;
//! * the fixed remote cost (intercept − baseline): delivery latency and
//!   dispatch, half each;
//! * the baseline (no responder): kernel entry and the VM work of the call,
//!   half each, after the small fixed costs below.

use rayon::prelude::*;

use crate::run::run_seed;
use crate::spec::{Spec, SpecError};

/// Costs below this are fixed small assumptions (ns), not fitted.
const LOCK_NS: f64 = 20.0;
const SPL_NS: f64 = 10.0;
const SPIN_NS: f64 = 20.0;
const PTE_NS: f64 = 20.0;
const FLUSH_ENTRY_NS: f64 = 100.0;

/// The measured line the preset is built from.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub baseline_ns: f64,
    pub intercept_ns: f64,
    pub slope_ns: f64,
    pub cores: usize,
}

/// The preset file text.
pub fn preset_text(m: &Measured, environment: &str) -> String {
    // Fixed small costs on the baseline path: the VM lock, spl, the pmap
    // lock, the lazy check, the local invalidation, the PTE write.
    let small = 2.0 * LOCK_NS + 2.0 * LOCK_NS + 2.0 * SPL_NS + FLUSH_ENTRY_NS + PTE_NS + 4.0;
    let base = (m.baseline_ns - small).max(20.0);
    let fixed = (m.intercept_ns - m.baseline_ns - SPIN_NS).max(20.0);
    let per = m.slope_ns.max(10.0);
    let r = |v: f64| v.round().max(1.0) as u64;
    format!(
        r#"# A `host` preset written by `mmulab host preset` from this machine's
# measurements: {environment}
# Measured (medians of mprotect latency, ns): baseline {b:.0}, line
# {i:.0} + {s:.0} per responder. Clock 1 GHz: one cycle is one ns.
# Split of the measured line into components (crates/experiment/src/host_preset.rs):
#   per responder = ipi_send + action_queue + lock + unlock (half / half)
#   fixed remote  = ipi_latency + ipi_dispatch (half / half)
#   baseline      = trap + syscall (half / half) after small fixed costs
# The model runs protocol `mach`; Linux's flush differs in detail but has the
# same structure (queue, interrupt, wait for every acknowledgement).
name = "host"
about = "this Linux host, fitted from mmulab host shootdown"
source = "mmulab host shootdown measurements (medians)"

[spec.machine]
cpus = {cpus}
page_table = "x86-64"
[spec.engine]
quantum_cycles = 20
[spec.costs]
clock_hz = 1e9
ref_cycles = 1
mem_cycles = 80
trap_cycles = {trap}
syscall_cycles = {trap}
lock_cycles = {lock}
unlock_cycles = {lock}
spl_cycles = {spl}
spin_iteration_cycles = {spin}
pte_write_cycles = {pte}
tlb_flush_entry_cycles = {flush}
tlb_flush_all_cycles = 200
lazy_check_cycles = 4
ipi_send_cycles = {send}
action_queue_cycles = {queue}
ipi_latency_cycles = {lat}
ipi_dispatch_cycles = {disp}
ipi_return_cycles = 100
action_process_cycles = 50
"#,
        b = m.baseline_ns,
        i = m.intercept_ns,
        s = m.slope_ns,
        cpus = m.cores.max(2),
        trap = r(base / 2.0),
        lock = r(LOCK_NS),
        spl = r(SPL_NS),
        spin = r(SPIN_NS),
        pte = r(PTE_NS),
        flush = r(FLUSH_ENTRY_NS),
        send = r(per / 2.0),
        queue = r((per / 2.0 - 2.0 * LOCK_NS).max(1.0)),
        lat = r(fixed / 2.0),
        disp = r(fixed / 2.0),
    )
}

/// The simulator's tester on `preset_path`: the main thread's mprotect
/// latency (ns) for each responder count.
pub fn predict(preset_path: &str, responders: &[usize]) -> Result<Vec<(usize, f64)>, SpecError> {
    let specs: Vec<(usize, Spec)> = responders
        .iter()
        .map(|&k| {
            let text = format!(
                "protocol = \"mach\"\npreset = \"{preset_path}\"\n[machine]\ncpus = {}\n[workload]\nkind = \"tester\"\nchildren = {k}\n",
                k + 1
            );
            Spec::parse(&text, &[], "host preset check").map(|s| (k, s))
        })
        .collect::<Result<_, _>>()?;
    Ok(specs
        .par_iter()
        .map(|(k, spec)| {
            let out = run_seed(spec, spec.seed);
            (
                *k,
                out.workload
                    .figures
                    .get("mprotect_cycles")
                    .copied()
                    .unwrap_or(f64::NAN),
            )
        })
        .collect())
}
