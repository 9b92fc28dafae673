//! Under `linux` on a machine with caches, Fig. 1's victim list is a cache
//! line of kernel data (`flush_cpumask`, `flush_mm`, `flush_va`): the
//! initiator writes it, each victim reads it (a miss: the initiator's
//! copy is the owner) and clears its bit with a locked store, so what the
//! list costs comes from the coherence protocol. On flat memory it is
//! free, and a victim costs exactly its flush.

use mmulab_experiment::Spec;
use mmulab_experiment::run::run_seed;

fn spec(preset: bool) -> Spec {
    let text = format!(
        r#"
protocol = "linux"
{}
seed = 1
[machine]
cpus = 4
[workload]
kind = "unitd-micro"
op = "unmap"
multiple = false
file_pages = 256
shootdowns = 40
"#,
        if preset {
            r#"preset = "x86-simics-2010""#
        } else {
            ""
        }
    );
    Spec::parse(&text, &[], "test").expect("valid spec")
}

/// (victims' handler cycles, shootdowns, cache-to-cache transfers).
fn victims(s: &Spec) -> (Vec<f64>, u64, u64) {
    let r = run_seed(s, 1);
    assert_eq!(r.sim.oracle.violations, 0);
    let h = r
        .sim
        .hists
        .get("shootdown.user.responder_cycles")
        .expect("victims were interrupted")
        .samples()
        .to_vec();
    (
        h,
        r.sim.counters.get("shootdown.user.events"),
        r.sim.counters.get("mem.cache_to_cache"),
    )
}

#[test]
fn victims_pay_the_lists_coherence_misses_on_caches() {
    let s = spec(true);
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
    let s = spec(false);
    assert!(s.memory.is_none());
    let flush = s.costs.tlb_flush_all_cycles as f64;
    let (h, _, c2c) = victims(&s);
    assert!(!h.is_empty());
    assert!(h.iter().all(|&v| v == flush), "{h:?}");
    assert_eq!(c2c, 0);
}
