//! balan92's segment drivers, pageout and §Other Architectures switches
//! end to end: the swarm (which mixes segmap file I/O and pageout into the
//! kmem churn) catches the broken drivers, tagged TLBs stay consistent
//! without context-switch flushes, single-entry flushes honour their
//! threshold, and bad kernel values name their key.

use mmulab_experiment::Spec;
use mmulab_experiment::check::{check, swarm_spec};
use mmulab_experiment::run::run_seed;

fn spec(text: &str, sets: &[&str]) -> Spec {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Spec::parse(text, &sets, "test").expect("valid spec")
}

#[test]
fn the_broken_drivers_are_caught_by_the_swarm() {
    for p in ["svr42-segmap-no-shutdown", "svr42-pageout-no-seize"] {
        let r = check(p, 1, 400, &|_| {});
        assert!(r.violations > 0, "{p} was not caught in 400 seeds");
        assert!(r.first_failing.expect("a failing seed").replay.contains(p));
    }
}

#[test]
fn the_swarm_keeps_balan92s_lock_order() {
    // The checker runs in every run; the svr42 swarm (kmem churn with
    // segmap and pageout, the tester, the random mix) never inverts the
    // order segment -> driver -> HAT -> shootdown.
    for seed in 1..=200 {
        let s = swarm_spec("svr42", seed);
        let out = run_seed(&s, seed);
        assert_eq!(
            out.sim.counters.get("lockorder.violations"),
            0,
            "seed {seed}"
        );
    }
}

#[test]
fn skipping_the_shootdown_lock_when_alone_stays_consistent() {
    let mut alone = 0;
    for seed in 1..=150 {
        let mut s = swarm_spec("svr42", seed);
        s.protocol_options.shoot_lock_when_alone = false;
        let out = run_seed(&s, seed);
        assert_eq!(
            out.sim.oracle.violations, 0,
            "seed {seed}: {:?}",
            out.sim.oracle.first
        );
        alone += out.sim.counters.get("svr42.user.alone");
    }
    assert!(alone > 0, "the ablation's path never ran");
}

#[test]
fn tagged_tlbs_stay_consistent_without_switch_flushes() {
    let mut asid_flushes = 0;
    for seed in 1..=150 {
        let mut s = swarm_spec("svr42", seed);
        s.machine.tlb.asid = true;
        let out = run_seed(&s, seed);
        assert_eq!(
            out.sim.oracle.violations, 0,
            "seed {seed}: {:?}",
            out.sim.oracle.first
        );
        assert!(out.sim.liveness.is_none(), "seed {seed}");
        asid_flushes += out.sim.counters.get("svr42.asid_flushes");
    }
    assert!(asid_flushes > 0, "no user shootdown flushed a context");
    // One cookie: with tags, a lazy shutdown that is needed at all
    // flushes every other online CPU (without tags it picks the older
    // ones).
    let churn = "protocol = \"svr42\"\npreset = \"sequent-symmetry-1992\"\n\
        [kernel]\nhz = 1000000\nsegkmem_pages = 384\nsegkmem_zone_bytes = 1\n\
        [workload]\nkind = \"kmem-churn\"\nthreads = 4\nallocations = 150\nlive = 3\ntouch = true\n";
    let procs = |asid: bool| {
        let out = run_seed(&spec(churn, &[&format!("machine.tlb.asid={asid}")]), 1);
        assert_eq!(out.sim.oracle.violations, 0);
        out.sim.hists["hat.shutdown.lazy.processors"]
            .samples()
            .to_vec()
    };
    assert!(procs(true).iter().all(|&n| n == 5.0));
    assert!(procs(false).iter().any(|&n| n < 5.0));
    // The same run flushes whole TLBs far less often with tags: no flush
    // on hat_asload.
    let base = "protocol = \"svr42\"\npreset = \"sequent-symmetry-1992\"\n\
        [workload]\nkind = \"pageout-aging\"\npasses = 4\n";
    let plain = run_seed(&spec(base, &[]), 1);
    let tagged = run_seed(&spec(base, &["machine.tlb.asid=true"]), 1);
    assert_eq!(tagged.sim.oracle.violations, 0);
    assert_eq!(tagged.sim.counters.get("pageout.asid_retired"), 4);
    assert!(
        tagged.sim.counters.get("tlb.full_flushes") < plain.sim.counters.get("tlb.full_flushes"),
        "tagged {} vs plain {}",
        tagged.sim.counters.get("tlb.full_flushes"),
        plain.sim.counters.get("tlb.full_flushes")
    );
}

#[test]
fn single_entry_flushes_up_to_the_threshold_then_whole_tlbs() {
    let run = |pages: u64| {
        let s = spec(
            "protocol = \"svr42\"\npreset = \"sequent-symmetry-1992\"\n\
             [workload]\nkind = \"balan92-shootdown\"\nmode = \"immediate\"\nsamples = 3\n",
            &[
                "protocol_options.single_entry_flush=true",
                "protocol_options.flush_threshold=8",
                "protocol_options.l1_trick_pages=0",
                &format!("workload.pages={pages}"),
            ],
        );
        let out = run_seed(&s, 1);
        assert_eq!(out.sim.oracle.violations, 0);
        out.sim.counters
    };
    let small = run(4);
    // 3 samples x 6 CPUs (initiator and 5 responders) x 4 pages.
    assert_eq!(small.get("tlb.entry_invalidations"), 3 * 6 * 4);
    let big = run(64);
    assert_eq!(big.get("tlb.entry_invalidations"), 0, "past the threshold");
}

#[test]
fn bad_driver_values_name_their_key() {
    let base =
        "protocol = \"svr42\"\n[machine]\npage_table = \"i386\"\n[workload]\nkind = \"file-io\"\n";
    for (set, key) in [
        (
            "kernel.segmap_chunk_bytes=5000",
            "kernel.segmap_chunk_bytes",
        ),
        ("kernel.segmap_chunk_bytes=0", "kernel.segmap_chunk_bytes"),
        ("kernel.segmap_pages=1", "kernel.segmap_pages"),
        ("kernel.segmap_pages=262000", "kernel.segmap_pages"),
        ("workload.threads=99", "workload.threads"),
        ("kernel.physmap=true", "kernel.physmap"),
        ("machine.memory_mb=8192", "machine.memory_mb"),
    ] {
        let e = Spec::parse(base, &[set.to_string()], "t")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(key), "{set}: {e}");
    }
    // physmap with the limit's memory is fine; the message says the limit.
    assert!(
        Spec::parse(
            base,
            &["kernel.physmap=true".into(), "machine.memory_mb=256".into()],
            "t"
        )
        .is_ok()
    );
    let e = Spec::parse(base, &["kernel.physmap=true".into()], "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("256 MB"), "{e}");
}

#[test]
fn segmap_and_pageout_measurements_are_deterministic_and_consistent() {
    let f = "protocol = \"svr42\"\npreset = \"sequent-symmetry-1992\"\n\
        [workload]\nkind = \"file-io\"\nops = 60\nfiles = 12\nfile_pages = 32\n";
    let a = run_seed(&spec(f, &[]), 2);
    let b = run_seed(&spec(f, &[]), 2);
    assert_eq!(a.sim.counters, b.sim.counters);
    assert_eq!(a.sim.oracle.violations, 0);
    assert_eq!(a.workload.verdict, "consistent");
    assert!(a.sim.counters.get("segmap.reclaims") > 0);
}
