//! A user slice's instruction fetch must not eat its quantum: with a tiny
//! inclusive L2 (swarm seed 12 of `check --protocol unitd`: 4 KB, 2-way),
//! the I-TLB entry of every fetch was gone by the next one (its PTE block
//! recalled from the L2), the refill walk and L1I miss outlasted the
//! 400-cycle quantum, and no slice had room left for a reference: the run
//! spun to its 2 G-cycle limit.

use mmulab_experiment::check::swarm_spec;
use mmulab_experiment::run::run_seed;

#[test]
fn fetch_stalls_leave_every_slice_room_to_progress() {
    let spec = swarm_spec("unitd", 12);
    let out = run_seed(&spec, 12);
    let c = &out.sim.counters;
    assert!(c.get("tlb.itlb_misses") > 0, "the seed fetches: {c:?}");
    assert!(!out.sim.timed_out, "ran to the limit: {c:?}");
    assert_eq!(out.sim.oracle.violations, 0);
}
