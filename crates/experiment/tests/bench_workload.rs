//! The speed workload of `mmulab bench` makes the references it is asked
//! for: `refs_per_thread` per thread, whatever the `mprotect` period (a
//! period shorter than a batch once skipped every batch) and whether or
//! not the count is a whole number of batches.

use mmulab_experiment::Spec;
use mmulab_experiment::run::run_seed;

fn bench(protocol: &str, refs: u64, every: u64) -> Spec {
    let text = format!(
        r#"
protocol = "{protocol}"
seed = 1
[machine]
cpus = 4
memory_mb = 64
[workload]
kind = "bench"
threads = 4
private_pages = 8
shared_pages = 4
refs_per_thread = {refs}
mprotect_every = {every}
"#
    );
    Spec::parse(&text, &[], "test").expect("valid spec")
}

#[test]
fn every_thread_makes_its_references_whatever_the_mprotect_period() {
    for protocol in ["global", "mach"] {
        for (refs, every) in [
            (3000u64, 100u64),
            (3000, 1000),
            (5000, 2500),
            (4096, 100_000),
        ] {
            let r = run_seed(&bench(protocol, refs, every), 1);
            assert_eq!(r.sim.oracle.violations, 0);
            assert_eq!(
                r.sim.refs,
                4 * refs,
                "{protocol}, {refs} references per thread, an mprotect every {every}"
            );
            // Every system call takes the task's map lock: one mmap, then
            // the mprotect pairs.
            let calls = r.sim.counters.get("lock.segment.syscall.acquired");
            if every < refs {
                assert!(calls > 1, "{protocol}, every {every}: no mprotect made");
            } else {
                assert_eq!(calls, 1, "{protocol}, every {every}: the mmap only");
            }
        }
    }
}
