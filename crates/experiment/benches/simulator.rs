//! Criterion benches of the simulator's speed: `mmulab bench`'s two fixed
//! workloads (`mmulab_experiment::bench`), shortened to 500,000 references
//! per thread (8 M in all; setting up the machine is timed too), at a word
//! stride (the default) and a cache-line stride (the memory system's worst
//! case). Throughput is in simulated references; every run must keep the
//! oracle clean. Run with `cargo bench -p mmulab-experiment`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mmulab_experiment::bench::{foundation_spec, unitd_spec};
use mmulab_experiment::{Spec, run_spec};

const REFS_PER_THREAD: u64 = 500_000;

fn simulator(c: &mut Criterion) {
    let mut g = c.benchmark_group("simulator");
    g.sample_size(10);
    for (name, text) in [
        ("global-flat", foundation_spec()),
        ("unitd-caches", unitd_spec()),
    ] {
        for stride in [8u64, 64] {
            let sets = [
                format!("workload.refs_per_thread={REFS_PER_THREAD}"),
                format!("workload.stride_bytes={stride}"),
            ];
            let spec = Spec::parse(&text, &sets, "bench").expect("the bench spec is valid");
            let refs = run_spec(&spec, |_, _| {})
                .expect("bench run")
                .counters
                .get("refs");
            g.throughput(Throughput::Elements(refs));
            g.bench_function(format!("{name}/stride-{stride}"), |b| {
                b.iter(|| {
                    let r = run_spec(&spec, |_, _| {}).expect("bench run");
                    assert_eq!(r.oracle.violations, 0, "the oracle must stay clean");
                    r.counters.get("refs")
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, simulator);
criterion_main!(benches);
