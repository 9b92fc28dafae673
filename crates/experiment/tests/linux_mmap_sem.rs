//! romanescu10's kernel is Linux 2.6.15: its `mmap_sem` is a reader/writer
//! semaphore (page faults read, munmap writes, waiters sleep), and a CPU
//! whose thread sleeps runs the idle task in lazy TLB mode, so the first
//! shootdown that reaches it makes it leave the address space
//! (`leave_mm`) and later ones pass it by; the thread loads the address
//! space again when it is switched back in. An idle CPU is in lazy TLB
//! mode too: it keeps the last address space until a shootdown makes it
//! leave, and a thread of that task runs there next without a CR3 load.
//! A handler that acknowledges in lazy mode without leaving is caught.

use mmulab_experiment::Spec;
use mmulab_experiment::check::{check, swarm_spec};
use mmulab_experiment::run::run_seed;

fn micro(protocol: &str, op: &str, cores: u64, shootdowns: u64) -> Spec {
    let text = format!(
        r#"
protocol = "{protocol}"
preset = "x86-simics-2010"
seed = 1
[machine]
cpus = {cores}
[memory.interconnect]
kind = "directory"
mesh_cols = {cores}
mesh_rows = 1
[workload]
kind = "unitd-micro"
op = "{op}"
multiple = true
file_pages = 256
shootdowns = {shootdowns}
"#
    );
    Spec::parse(&text, &[], "test").expect("valid spec")
}

#[test]
fn munmap_waiters_sleep_in_lazy_tlb_mode_and_leave_the_address_space() {
    let (cores, n) = (4, 200);
    let r = run_seed(&micro("linux", "unmap", cores, n), 1);
    let c = &r.sim.counters;
    assert_eq!(r.sim.oracle.violations, 0);
    // An unmap shoots down only while another core uses the address
    // space (the last parser running alone does not).
    let events = c.get("shootdown.user.events");
    assert!(events > n / 2 && events <= n, "{events} shootdowns");
    let blocked = c.get("sleeplock.blocked");
    let left = c.get("linux.lazy_leave_mm");
    assert!(blocked > 0, "no munmap waited for mmap_sem");
    assert!(left > 0, "no sleeping CPU left the address space");
    // At most once per sleep: a CPU that left is no longer a victim.
    assert!(left <= blocked, "{left} leaves in {blocked} sleeps");
    // Every thread that left loaded its address space again on waking.
    assert_eq!(c.get("sched.lazy_tlb_rejoins"), left);
    // So shootdowns interrupt fewer than all the other cores.
    let victims = r
        .sim
        .hists
        .get("shootdown.user.processors")
        .expect("shootdowns were made")
        .samples();
    let mean = victims.iter().sum::<f64>() / victims.len() as f64;
    assert!(
        mean < (cores - 1) as f64,
        "every shootdown interrupted all {} other cores",
        cores - 1
    );
}

#[test]
fn copy_on_write_faults_share_mmap_sem_as_readers() {
    // Faults of different threads hold the lock together.
    let r = run_seed(&micro("unitd", "cow", 4, 200), 1);
    let c = &r.sim.counters;
    assert_eq!(r.sim.oracle.violations, 0);
    assert!(
        c.get("sleeplock.shared_grants") > 0,
        "faults never overlapped"
    );
}

#[test]
fn a_lazy_cpu_that_acknowledges_without_leaving_is_caught() {
    // Its thread wakes up with translations the shootdown removed.
    let broken = check("linux-lazy-skips-flush", 1, 60, &|_| {});
    assert!(
        broken.violations > 0,
        "linux-lazy-skips-flush was not caught"
    );
    let good = check("linux", 1, 60, &|_| {});
    assert!(good.passed(), "linux: {:?}", good.first_failing);
}

/// Totals of some counters over swarm seeds of `protocol`, every seed
/// clean by the oracle.
fn swarm_totals(protocol: &str, seeds: u64, keys: &[&str]) -> Vec<u64> {
    let mut tot = vec![0; keys.len()];
    for seed in 1..=seeds {
        let r = run_seed(&swarm_spec(protocol, seed), seed);
        assert_eq!(r.sim.oracle.violations, 0, "{protocol} seed {seed}");
        for (t, k) in tot.iter_mut().zip(keys) {
            *t += r.sim.counters.get(k);
        }
    }
    tot
}

#[test]
fn idle_cpus_keep_the_address_space_lazily() {
    let keys = ["linux.idle_leave_mm", "sched.lazy_tlb_kept"];
    // linux: idle CPUs are shot down once and leave; others run the same
    // task again with their TLBs kept.
    let [left, kept] = swarm_totals("linux", 60, &keys)[..] else {
        unreachable!()
    };
    assert!(left > 0, "no idle CPU left an address space");
    assert!(
        kept > 0,
        "no idle CPU resumed its address space without a CR3 load"
    );
    // unitd runs the same kernel: idle CPUs keep it, and nothing makes
    // them leave (no shootdowns).
    let [left, kept] = swarm_totals("unitd", 30, &keys)[..] else {
        unreachable!()
    };
    assert_eq!(left, 0);
    assert!(kept > 0);
    // mach unloads the address space when a CPU goes idle.
    let [left, kept] = swarm_totals("mach", 30, &keys)[..] else {
        unreachable!()
    };
    assert_eq!((left, kept), (0, 0));
}
