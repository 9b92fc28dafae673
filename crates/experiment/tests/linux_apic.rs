//! Linux 2.6.15 picks its interrupt controller mode at boot: flat logical
//! mode on machines of up to 8 CPUs, where one ICR write interrupts every
//! victim of a shootdown, and bigsmp above, one write per victim
//! (`kernel.apic_flat_max_cpus`; romanescu10's preset sets 8).

use mmulab_experiment::Spec;
use mmulab_experiment::run::run_seed;

fn spec(cpus: u64, flat_max: u64) -> Spec {
    let text = format!(
        r#"
protocol = "linux"
preset = "x86-simics-2010"
seed = 1
[machine]
cpus = {cpus}
[kernel]
apic_flat_max_cpus = {flat_max}
[memory.interconnect]
kind = "snooping"
tree_hop_cycles = 2
[workload]
kind = "unitd-micro"
op = "unmap"
multiple = false
file_pages = 256
shootdowns = 40
"#
    );
    Spec::parse(&text, &[], "test").expect("valid spec")
}

/// (mean initiator cycles per shootdown, IPIs sent, ICR write cost).
fn shootdowns(cpus: u64, flat_max: u64) -> (f64, u64, f64) {
    let s = spec(cpus, flat_max);
    let r = run_seed(&s, 1);
    assert_eq!(r.sim.oracle.violations, 0);
    let h = r
        .sim
        .hists
        .get("shootdown.user.initiator_cycles")
        .expect("shootdowns were made")
        .samples();
    let mean = h.iter().sum::<f64>() / h.len() as f64;
    (
        mean,
        r.sim.counters.get("ipi.sent"),
        s.costs.ipi_send_cycles as f64,
    )
}

#[test]
fn flat_mode_interrupts_every_victim_with_one_icr_write() {
    let (big4, _, write) = shootdowns(4, 0);
    let (big8, sent_big, _) = shootdowns(8, 0);
    let (flat4, _, _) = shootdowns(4, 8);
    let (flat8, sent_flat, _) = shootdowns(8, 8);
    assert!(write > 0.0);
    // The same victims are interrupted either way.
    assert_eq!(sent_flat, sent_big);
    // bigsmp: four more victims, four more writes.
    let per_victim = (big8 - big4) / 4.0;
    assert!(
        (per_victim - write).abs() < 0.25 * write,
        "bigsmp adds {per_victim:.0} cycles per victim, the write costs {write}"
    );
    // flat: one write whatever the victims; each still acknowledges.
    assert!(
        flat8 - flat4 < 0.25 * 4.0 * write,
        "flat mode grew by {:.0} cycles for four more victims",
        flat8 - flat4
    );
    assert!(big8 - flat8 > 5.0 * write, "{big8:.0} vs {flat8:.0}");
}

#[test]
fn machines_above_the_limit_boot_bigsmp() {
    let (a, _, _) = shootdowns(16, 8);
    let (b, _, _) = shootdowns(16, 0);
    assert_eq!(a, b);
}
