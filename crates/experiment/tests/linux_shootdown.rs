//! Linux 2.6.15's shootdown (romanescu10 Fig. 1) as the `linux` protocol
//! runs it.
//!
//! The interrupt controller mode is picked at boot: flat logical mode on
//! machines of up to 8 CPUs, where one ICR write interrupts every victim
//! of a shootdown, and bigsmp above, one write per victim
//! (`kernel.apic_flat_max_cpus`; romanescu10's preset sets 8).
//!
//! On a machine with caches the victim list is a cache line of kernel
//! data (`flush_cpumask`, `flush_mm`, `flush_va`): the initiator writes
//! it, each victim reads it (a miss: the initiator's copy is the owner)
//! and clears its bit with a locked store, so what the list costs comes
//! from the coherence protocol. On flat memory it is free, and a victim
//! costs exactly its flush.

use mmulab_experiment::Spec;
use mmulab_experiment::run::run_seed;

/// A single_unmap microbenchmark of 40 shootdowns under `linux`, on
/// romanescu10's machine (snooping) or, without the preset, flat memory.
fn micro(cpus: u64, preset: bool, flat_max: u64) -> Spec {
    let machine = if preset {
        format!(
            "preset = \"x86-simics-2010\"\n[kernel]\napic_flat_max_cpus = {flat_max}\n\
             [memory.interconnect]\nkind = \"snooping\"\ntree_hop_cycles = 2\n"
        )
    } else {
        String::new()
    };
    let text = format!(
        r#"
protocol = "linux"
seed = 1
{machine}
[machine]
cpus = {cpus}
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

/// Runs `s` (seed 1), which must stay clean; returns the samples of
/// histogram `hist` and the values of `counters`.
fn run(s: &Spec, hist: &str, counters: &[&str]) -> (Vec<f64>, Vec<u64>) {
    let r = run_seed(s, 1);
    assert_eq!(r.sim.oracle.violations, 0);
    let h = r.sim.hists.get(hist).expect("shootdowns were made");
    let c = counters.iter().map(|n| r.sim.counters.get(n)).collect();
    (h.samples().to_vec(), c)
}

/// (mean initiator cycles per shootdown, IPIs sent, ICR write cost, flat
/// sends, shootdowns).
fn shootdowns(cpus: u64, flat_max: u64) -> (f64, u64, f64, u64, u64) {
    let s = micro(cpus, true, flat_max);
    let (h, c) = run(
        &s,
        "shootdown.user.initiator_cycles",
        &["ipi.sent", "ipi.flat_sends", "shootdown.user.events"],
    );
    let mean = h.iter().sum::<f64>() / h.len() as f64;
    (mean, c[0], s.costs.ipi_send_cycles as f64, c[1], c[2])
}

#[test]
fn flat_mode_interrupts_every_victim_with_one_icr_write() {
    let (big4, _, write, none4, _) = shootdowns(4, 0);
    let (big8, sent_big, _, none8, _) = shootdowns(8, 0);
    let (flat4, _, _, _, _) = shootdowns(4, 8);
    let (flat8, sent_flat, _, one_each, events) = shootdowns(8, 8);
    assert!(write > 0.0);
    // The same victims are interrupted either way.
    assert_eq!(sent_flat, sent_big);
    // flat: one write per shootdown whatever the victims; bigsmp: none
    // of those.
    assert_eq!(one_each, events);
    assert_eq!((none4, none8), (0, 0));
    // Four more victims cost the initiator their acknowledgements on the
    // list's line in either mode; bigsmp adds their four writes.
    let per_victim = ((big8 - big4) - (flat8 - flat4)) / 4.0;
    assert!(
        (per_victim - write).abs() < 0.25 * write,
        "bigsmp adds {per_victim:.1} cycles per victim beyond flat mode, the write costs {write}"
    );
    assert!(big8 > flat8 + 5.0 * write, "{big8:.0} vs {flat8:.0}");
}

#[test]
fn machines_above_the_limit_boot_bigsmp() {
    let (a, ..) = shootdowns(16, 8);
    let (b, ..) = shootdowns(16, 0);
    assert_eq!(a, b);
}

/// (victims' handler cycles, shootdowns, cache-to-cache transfers).
fn victims(s: &Spec) -> (Vec<f64>, u64, u64) {
    let (h, c) = run(
        s,
        "shootdown.user.responder_cycles",
        &["shootdown.user.events", "mem.cache_to_cache"],
    );
    (h, c[0], c[1])
}

#[test]
fn victims_pay_the_lists_coherence_misses_on_caches() {
    let s = micro(4, true, 8);
    let flush = s.costs.tlb_flush_all_cycles as f64;
    let l2 = s
        .memory
        .as_ref()
        .expect("the preset has caches")
        .l2
        .latency_cycles as f64;
    let (h, events, c2c) = victims(&s);
    assert!(events >= 40, "{events} shootdowns");
    // Each victim misses on its read of the line (another core wrote it)
    // and again on its locked clear (other victims share it): at least
    // two trips past its L1 beyond the flush itself.
    for &v in &h {
        assert!(
            v >= flush + 2.0 * l2,
            "a victim took {v} cycles (flush {flush})"
        );
    }
    // The first reader of each shootdown finds the line owned by another
    // core's L1 and gets it from there.
    assert!(
        c2c >= events,
        "{c2c} cache-to-cache transfers for {events} shootdowns"
    );
}

#[test]
fn on_flat_memory_a_victim_costs_its_flush_alone() {
    let s = micro(4, false, 0);
    assert!(s.memory.is_none());
    let flush = s.costs.tlb_flush_all_cycles as f64;
    let (h, _, c2c) = victims(&s);
    assert!(!h.is_empty());
    assert!(h.iter().all(|&v| v == flush), "{h:?}");
    assert_eq!(c2c, 0);
}

/// The microbenchmark's computations run in one stretch each
/// (`Program::long_computes`); a victim interrupted in the middle of one
/// takes the interrupt at its arrival, not at the stretch's end, and
/// finishes the computation afterwards.
#[test]
fn victims_in_a_long_computation_take_the_interrupt_at_its_arrival() {
    let mean = |s: &Spec| {
        let (h, _) = run(s, "shootdown.user.initiator_cycles", &[]);
        h.iter().sum::<f64>() / h.len() as f64
    };
    let short = mean(&micro(4, true, 8));
    // Workers computing 50 M cycles between passes: every shootdown finds
    // them in the middle of a stretch.
    let base = micro(4, true, 8);
    let text = "preset = \"x86-simics-2010\"\nprotocol = \"linux\"\nseed = 1\n\
         [machine]\ncpus = 4\n[workload]\nkind = \"unitd-micro\"\nop = \"unmap\"\n\
         file_pages = 256\nshootdowns = 40\nworker_compute_cycles = 50000000\n";
    let long_spec = Spec::parse(text, &[], "test").expect("valid spec");
    assert_eq!(long_spec.machine.cpus, base.machine.cpus);
    let long = mean(&long_spec);
    assert!(
        long < 2.0 * short + 1000.0,
        "initiators waited {long:.0} cycles per shootdown (workers' short computations: {short:.0})"
    );
}
