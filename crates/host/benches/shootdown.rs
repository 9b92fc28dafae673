//! One `mprotect` shootdown with one responder (or the baseline alone on a
//! one-core machine), timed by the initiator exactly as `mmulab host
//! shootdown` does: criterion is handed the time inside the operation only,
//! not the arming and checking around it.

use criterion::{Criterion, criterion_group, criterion_main};

#[cfg(target_os = "linux")]
fn bench(c: &mut Criterion) {
    use mmulab_host::Op;
    use mmulab_host::tester::{Tester, TesterConfig, usable_cpus};
    use std::time::Duration;

    let cpus = usable_cpus().expect("sched_getaffinity");
    let responders = usize::from(cpus.len() >= 2);
    let mut group = c.benchmark_group("host_shootdown");
    for op in [Op::Mprotect, Op::Munmap, Op::MadviseDontneed] {
        for k in 0..=responders {
            let mut tester = Tester::new(TesterConfig {
                op,
                pages: 1,
                cpus: cpus[..=k].to_vec(),
                ack_timeout: Duration::from_secs(10),
                fault_timeout: Duration::from_secs(1),
                hooks: Default::default(),
                count_tlb_interrupts: false,
            })
            .expect("tester");
            group.bench_function(format!("{op}/1page/{k}responder"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let o = tester.rep().expect("rep");
                        assert!(o.violation.is_none(), "inconsistent: {:?}", o.violation);
                        total += o.latency;
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

#[cfg(not(target_os = "linux"))]
fn bench(_c: &mut Criterion) {}

criterion_group!(benches, bench);
criterion_main!(benches);
