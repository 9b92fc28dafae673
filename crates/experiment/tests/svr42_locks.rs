//! balan92 §Locking Design switches and locks under `svr42`, end to end:
//! the HAT lock per page table (less HAT-lock contention among one
//! process's LWPs faulting in different page tables), the segment
//! reader/writer sleep lock (faults share it), with no oracle or
//! lock-order violation over several seeds each.

use mmulab_engine::Counters;
use mmulab_experiment::Spec;
use mmulab_experiment::run::run_seed;

/// §Analysis, "concurrent page faults generated within a process among
/// its LWPs": one process, 4 LWPs on 4 CPUs, each mapping 1024 + 16 pages
/// and touching the top 16, so each LWP faults in a page table of its own.
fn faults_one_process(protocol: &str, per_pt: bool, spread: u64, seed: u64) -> Counters {
    faults_one_process_with(protocol, per_pt, spread, seed, &[])
}

fn faults_one_process_with(
    protocol: &str,
    per_pt: bool,
    spread: u64,
    seed: u64,
    sets: &[String],
) -> Counters {
    let text = format!(
        "protocol = \"{protocol}\"\npreset = \"sequent-symmetry-1992\"\n\
         [machine]\ncpus = 4\npage_table = \"i386\"\n\
         [protocol_options]\nhat_lock_per_pt = {per_pt}\n\
         [workload]\nkind = \"fault-storm\"\nprocesses = 1\nthreads = 4\npages = 16\nrounds = 6\n\
         spread_pages = {spread}\n"
    );
    let spec = Spec::parse(&text, sets, "test").expect("valid spec");
    let out = run_seed(&spec, seed);
    let c = out.sim.counters;
    assert_eq!(
        out.sim.oracle.violations, 0,
        "{protocol} per_pt={per_pt} seed {seed}"
    );
    assert_eq!(
        c.get("lockorder.violations"),
        0,
        "{protocol} per_pt={per_pt} seed {seed}"
    );
    assert!(out.sim.liveness.is_none(), "{:?}", out.sim.liveness);
    assert_eq!(out.workload.verdict, "consistent");
    c
}

#[test]
fn hat_lock_per_page_table_cuts_hat_contention_among_one_process_lwps() {
    let (mut on_wait, mut off_wait, mut on_cont, mut off_cont) = (0, 0, 0, 0);
    // Loads of translations collide at the HAT lock only when faults are
    // short next to its hold (balan92: "the lock hold time during loading
    // of a translation will again be very small"): the zero fill and most
    // of the trap are left out here so that the LWPs' loads overlap. The
    // global page-hash lock, taken just before, staggers the faults by its
    // hold (one lock_cycles): the loads overlap only when the HAT lock is
    // held longer than that, so the PTE write is made long here (a load's
    // hold with the preset, 104 cycles, is about the hash lock's).
    let sets = [
        "costs.zero_fill_cycles=0".to_string(),
        "costs.fault_cycles=100".to_string(),
        "costs.pte_write_cycles=200".to_string(),
    ];
    for seed in 1..=6 {
        let on = faults_one_process_with("svr42", true, 1024, seed, &sets);
        let off = faults_one_process_with("svr42", false, 1024, seed, &sets);
        assert!(
            on.get("svr42.hat_pt_locks") > 0,
            "the switch took no page-table lock"
        );
        assert_eq!(off.get("svr42.hat_pt_locks"), 0);
        // Same work either way: 4 LWPs x 7 touches (the first, then one
        // after each of the 6 rounds' munmap and mmap) x 16 zero fills.
        assert_eq!(on.get("vm.zero_fills"), 4 * 7 * 16);
        assert_eq!(off.get("vm.zero_fills"), 4 * 7 * 16);
        on_cont += on.get("lock.hat.contended");
        off_cont += off.get("lock.hat.contended");
        on_wait += on.get("lock.hat.wait_cycles");
        off_wait += off.get("lock.hat.wait_cycles");
    }
    assert!(
        off_cont > 0,
        "the one-lock-per-as baseline shows no HAT contention"
    );
    assert!(
        on_cont < off_cont && on_wait < off_wait,
        "per page table: {on_cont} contended, {on_wait} cycles waited; \
         per address space: {off_cont}, {off_wait}"
    );
}

#[test]
fn per_page_table_locks_change_nothing_within_one_page_table() {
    // Every LWP's pages in one page table (no spread): the page-table lock
    // is as contended as the as's lock was (balan92: "most UNIX processes
    // fit in one page table").
    let on = faults_one_process("svr42", true, 0, 2);
    let off = faults_one_process("svr42", false, 0, 2);
    assert!(on.get("lock.hat.contended") > 0 && off.get("lock.hat.contended") > 0);
}

#[test]
fn faults_share_the_segment_lock_as_readers() {
    let mut shared = 0;
    let mut mach_shared = 0;
    for seed in 1..=3 {
        let svr42 = faults_one_process("svr42", false, 0, seed);
        let global = faults_one_process("global", false, 0, seed);
        let mach = faults_one_process("mach", false, 0, seed);
        shared += svr42.get("sleeplock.shared_grants");
        mach_shared += mach.get("sleeplock.shared_grants");
        let pct = |c: &Counters| {
            c.get("lock.segment.contended") as f64 / c.get("lock.segment.acquired").max(1) as f64
        };
        // The lock-free VM layer (`global`) serialises one task's faults
        // on its exclusive map lock; svr42's faults are readers of the
        // segment lock, and so are mach's of Mach's read/write map lock.
        assert!(
            pct(&svr42) < pct(&global),
            "seed {seed}: svr42 {} vs global {}",
            pct(&svr42),
            pct(&global)
        );
        assert!(
            pct(&mach) < pct(&global),
            "seed {seed}: mach {} vs global {}",
            pct(&mach),
            pct(&global)
        );
        assert_eq!(global.get("sleeplock.shared_grants"), 0);
    }
    assert!(shared > 0, "no fault ever shared the segment lock");
    assert!(mach_shared > 0, "no mach fault ever shared the map lock");
}

#[test]
fn hat_lock_per_page_table_is_deterministic() {
    let a = faults_one_process("svr42", true, 1024, 7);
    let b = faults_one_process("svr42", true, 1024, 7);
    assert_eq!(a, b);
}

#[test]
fn bad_hat_lock_per_pt_value_names_its_key() {
    let text = "protocol = \"svr42\"\n[protocol_options]\nhat_lock_per_pt = 3\n\
                [workload]\nkind = \"fault-storm\"\nprocesses = 1\nthreads = 1\n";
    let e = Spec::parse(text, &[], "t").expect_err("a number is not a bool");
    assert!(e.to_string().contains("hat_lock_per_pt"), "{e}");
}

/// The page-hash lock (balan92 §Locking Design) is taken, with the SVR4.2
/// VM locks only, around every fault's lookup by identity; nothing but a
/// new page's sleep lock (which cannot wait) is ever taken under it; and
/// faults in different address spaces contend on it while their segment
/// and HAT locks are never contended (§Analysis).
#[test]
fn the_page_hash_lock_is_taken_by_faults_and_is_a_leaf() {
    let spec = |protocol: &str| {
        let text = format!(
            "protocol = \"{protocol}\"\npreset = \"sequent-symmetry-1992\"\n\
             [machine]\ncpus = 4\n\
             [workload]\nkind = \"fault-storm\"\nprocesses = 4\nthreads = 1\npages = 16\nrounds = 6\n"
        );
        Spec::parse(&text, &[], "test").expect("valid spec")
    };
    let mut contended = 0;
    for seed in 1..=3 {
        let out = run_seed(&spec("svr42"), seed);
        assert_eq!(out.sim.oracle.violations, 0);
        let c = &out.sim.counters;
        assert_eq!(c.get("lockorder.violations"), 0, "seed {seed}");
        assert!(
            c.get("lock.page_hash.acquired") >= c.get("vm.faults"),
            "seed {seed}: {} page-hash acquisitions, {} faults",
            c.get("lock.page_hash.acquired"),
            c.get("vm.faults")
        );
        // A leaf: the only acquisitions under it are new pages' sleep
        // locks, one per page created (zero fill or copy).
        assert_eq!(
            c.get("lockorder.new_page_under_page_hash"),
            c.get("vm.zero_fills") + c.get("vm.cow_copies"),
            "seed {seed}"
        );
        assert_eq!(c.get("lock.segment.contended"), 0, "seed {seed}");
        assert_eq!(c.get("lock.hat.contended"), 0, "seed {seed}");
        contended += c.get("lock.page_hash.contended");
        // The lock-free VM layer takes no page-hash lock.
        let global = run_seed(&spec("global"), seed);
        assert_eq!(global.sim.counters.get("lock.page_hash.acquired"), 0);
    }
    assert!(
        contended > 0,
        "the global page-hash lock was never contended"
    );
}
