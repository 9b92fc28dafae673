//! The core's side of romanescu10's UNITD.
//!
//! §5.1: an access whose translation a PCAM hit kills during its miss
//! replays its lookup. The same swarm seed, run with and without the
//! replay, shows that replays happen, keep the oracle clean, and that
//! performing instead is caught as a use of a translation whose PTE store
//! had already performed.
//!
//! §4.1: with a software-refilled TLB the miss handler supplies the PTE's
//! address to the PCAM; leaving that out is caught.

use mmulab_experiment::check::{check, swarm_spec};
use mmulab_experiment::run::run_seed;

#[test]
fn killed_in_flight_accesses_replay_and_skipping_the_replay_is_caught() {
    // Seed 1 of the swarm: a fork's COW write-protection stores PTEs while
    // other CPUs have accesses in flight through them.
    let good = run_seed(&swarm_spec("unitd", 1), 1);
    let replays = good.sim.counters.get("unitd.replays");
    assert!(replays > 0, "no access was killed in flight");
    assert_eq!(good.sim.oracle.violations, 0);

    let broken = run_seed(&swarm_spec("unitd-no-replay", 1), 1);
    assert!(broken.sim.counters.get("unitd.replays") > 0);
    assert!(
        broken.sim.oracle.violations > 0,
        "performing a killed access went unseen"
    );
}

#[test]
fn replays_keep_the_swarm_clean_and_the_broken_core_is_caught() {
    let r = check("unitd", 1, 150, &|_| {});
    assert!(r.passed(), "unitd: {:?}", r.first_failing);
    assert_eq!(r.timeouts, 0, "a replay livelocked");
    let broken = check("unitd-no-replay", 1, 150, &|_| {});
    assert!(broken.violations > 0, "unitd-no-replay was not caught");
}

#[test]
fn a_software_miss_handler_supplies_the_pte_address_and_forgetting_it_is_caught() {
    // The control's swarm seeds always refill the TLB in software; run the
    // same machine and workload under the working handler.
    let mut spec = swarm_spec("unitd-swtlb-no-pte-address", 2);
    let broken = run_seed(&spec, 2);
    spec.protocol = "unitd".into();
    let good = run_seed(&spec, 2);
    let c = &good.sim.counters;
    assert!(c.get("tlb.software_refills") > 0, "no software refill");
    // Every refill that fills an entry supplies its PTE's address; a
    // refill that finds no valid PTE faults instead.
    let supplied = c.get("unitd.pte_address_supplied");
    assert!(supplied > 0 && supplied <= c.get("tlb.software_refills"));
    assert_eq!(good.sim.oracle.violations, 0);
    assert_eq!(broken.sim.counters.get("unitd.pte_address_supplied"), 0);
    assert!(
        broken.sim.oracle.violations > 0,
        "PCAMs without PTE addresses went unseen"
    );
}
