//! Specs the checks accept run without a panic (issue 24: "nothing may
//! panic"). Apart from fuzz_spec.rs, whose counting allocator would count
//! these runs' memory too.

use std::sync::atomic::Ordering;

use mmulab_experiment::{Budget, Spec};
use proptest::prelude::*;

const TESTER: &str = include_str!("../../../experiments/tester.toml");

fn cases() -> u32 {
    mmulab_testkit::fuzz_cases()
}

/// Specs the checks accept run without a panic: the tester with random
/// in-range overrides of the machine, engine, costs, kernel, protocol and
/// workload, each run cut at 3 million cycles. (A third of the draws at
/// least must be accepted, or this tests nothing.)
#[test]
fn accepted_specs_run_without_a_panic() {
    use proptest::test_runner::{Config, TestRunner};
    let accepted = std::sync::atomic::AtomicU32::new(0);
    let cases = (cases() / 30).max(50);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&proptest::collection::vec(set(), 1..6), |mut sets| {
            sets.push("engine.max_cycles=3000000".into());
            if let Ok(spec) = Spec::parse(TESTER, &sets, "fuzz") {
                let small = Budget {
                    max_memory_bytes: 1 << 30,
                    max_work: 100_000_000,
                };
                if spec.check_budget(&small).is_ok() {
                    accepted.fetch_add(1, Ordering::Relaxed);
                    let _ = mmulab_experiment::run_spec(&spec, |_, _| {});
                }
            }
            Ok(())
        })
        .unwrap();
    let n = accepted.load(Ordering::Relaxed);
    assert!(
        n * 3 >= cases,
        "only {n} of {cases} drawn specs were accepted"
    );
}

/// One in-range override of the tester spec.
fn set() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u64..40).prop_map(|v| format!("machine.cpus={v}")),
        (1u64..64).prop_map(|v| format!("machine.memory_mb={v}")),
        prop_oneof![Just("i386"), Just("pae"), Just("x86-64")].prop_map(|v| format!("machine.page_table=\"{v}\"")),
        (0u32..6).prop_map(|e| format!("machine.tlb.entries={}", 1u64 << e)),
        (0u32..6).prop_map(|e| format!("machine.tlb.ways={}", 1u64 << e)),
        prop_oneof![Just("lru"), Just("fifo"), Just("random")].prop_map(|v| format!("machine.tlb.policy=\"{v}\"")),
        any::<bool>().prop_map(|v| format!("machine.tlb.asid={v}")),
        (1u64..2000).prop_map(|v| format!("engine.quantum_cycles={v}")),
        (1u64..100).prop_map(|v| format!("engine.spin_bound={v}")),
        (1u64..20).prop_map(|v| format!("protocol_options.action_queue={v}")),
        (0u64..20).prop_map(|v| format!("protocol_options.flush_threshold={v}")),
        any::<bool>().prop_map(|v| format!("protocol_options.lazy={v}")),
        prop_oneof![Just("device"), Just("above-device")].prop_map(|v| format!("protocol_options.shootdown_level=\"{v}\"")),
        prop_oneof![Just("each"), Just("multicast"), Just("broadcast")].prop_map(|v| format!("protocol_options.interrupt_send=\"{v}\"")),
        any::<bool>().prop_map(|v| format!("protocol_options.remote_invalidate={v}")),
        prop_oneof![Just("all"), Just("high")].prop_map(|v| format!("kernel.disabled_level=\"{v}\"")),
        (0u64..5000).prop_map(|v| format!("costs.ipi_latency_cycles={v}")),
        (0u64..5000).prop_map(|v| format!("costs.trap_cycles={v}")),
        (1u64..5000).prop_map(|v| format!("costs.spin_iteration_cycles={v}")),
        (1u64..5000).prop_map(|v| format!("costs.idle_poll_cycles={v}")),
        (1u64..10).prop_map(|v| format!("costs.ref_cycles={v}")),
        (1u64..10000).prop_map(|v| format!("kernel.hz={v}")),
        (1u64..5000).prop_map(|v| format!("kernel.trap_disabled_mean_cycles={v}")),
        ((1u64..50000), (1u64..50000)).prop_map(|(a,b)| format!("kernel.disabled_windows={{mean_interval_cycles={a}, mean_length_cycles={b}}}")),
        prop_oneof![Just("none"), Just("global"), Just("mach"), Just("svr42"), Just("mach-no-wait")].prop_map(|v| format!("protocol=\"{v}\"")),
        ((1u64..4),(1u64..4),(1u64..60),(1u64..40)).prop_map(|(t,h,s,r)| format!("workload={{kind=\"random\", tasks={t}, threads_per_task={h}, steps={s}, max_region_pages={r}}}")),
        ((1u64..8),(1u64..64),(1u64..40000)).prop_map(|(t,p,r)| format!("workload={{kind=\"bench\", threads={t}, private_pages={p}, shared_pages={p}, refs_per_thread={r}, mprotect_every=1000}}")),
        (1u64..8).prop_map(|c| format!("workload.children={c}")),
    ]
}
