//! `mmulab check`: the randomized correctness sweep. Every parameter of a
//! run (machine size, TLB geometry and policy, quantum, queue size,
//! threshold, lazy evaluation, interrupt-disabled windows and, for mach,
//! the shootdown interrupt's level and the sections', the workload's
//! shape) is drawn from the seed (a seed swarm), so one seed number
//! replays one exact run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use mmulab_engine::SimRng;
use mmulab_protocols::InterruptSend;
use rayon::prelude::*;
use serde::Serialize;

use crate::run::run_seed;
use crate::spec::Spec;

/// The spec a check seed runs.
pub fn swarm_spec(protocol: &str, seed: u64) -> Spec {
    let mut r = SimRng::new(seed, "swarm");
    let cpus = *r.pick(&[2usize, 3, 4, 5, 8]);
    let entries = *r.pick(&[4usize, 8, 16, 64]);
    let ways = *r.pick(&[1usize, 2, entries]);
    let policy = *r.pick(&["lru", "fifo", "random"]);
    let quantum = *r.pick(&[1u64, 10, 100, 400]);
    let queue = r.range_inclusive(1, 4);
    let threshold = r.range_inclusive(1, 8);
    let lazy = r.chance(0.8);
    let windows = r.chance(0.5);
    let tasks = r.range_inclusive(1, 3);
    let threads = r.range_inclusive(1, 4);
    let steps = r.range_inclusive(30, 90);
    let page_table = *r.pick(&["x86-64", "i386"]);
    let mut text = format!(
        "protocol = \"{protocol}\"\nseed = {seed}\n\
         [machine]\ncpus = {cpus}\nmemory_mb = 64\npage_table = \"{page_table}\"\n\
         [machine.tlb]\nentries = {entries}\nways = {ways}\npolicy = \"{policy}\"\n\
         [engine]\nquantum_cycles = {quantum}\nspin_bound = 200000\nmax_cycles = 2000000000\n\
         [protocol_options]\nlazy = {lazy}\nflush_threshold = {threshold}\naction_queue = {queue}\n\
         [workload]\nkind = \"random\"\ntasks = {tasks}\nthreads_per_task = {threads}\nsteps = {steps}\n"
    );
    if r.chance(0.5) {
        text.push_str("[kernel]\ntrap_disabled_mean_cycles = 2000\n");
        if windows {
            text.push_str("[kernel.disabled_windows]\nmean_interval_cycles = 20000\nmean_length_cycles = 3000\n");
        }
    } else if windows {
        text.push_str(
            "[kernel.disabled_windows]\nmean_interval_cycles = 20000\nmean_length_cycles = 3000\n",
        );
    }
    if protocol.starts_with("svr42") {
        // balan92's lazy kernel shootdowns depend on the clock tick and on
        // how soon segkmem reuses a freed address: draw a tick from very
        // short (many flushes and frees per tick, where a non-strict
        // compare or a late stamp shows) to the real 100 Hz, and a segkmem
        // small enough to wrap. Drawn after every other parameter, so the
        // swarm of the other protocols is unchanged.
        let hz = *r.pick(&[100u64, 10_000, 200_000, 1_000_000, 5_000_000]);
        let pages = *r.pick(&[384u64, 512, 1024]);
        let zone = *r.pick(&[1u64, 2, 16]);
        if r.chance(0.3) {
            text = text.replace(
                "[protocol_options]\n",
                "[protocol_options]\nsingle_entry_flush = true\n",
            );
        }
        let l1 = *r.pick(&[0u64, 1, 4, 64]);
        let chunks = r.chance(0.8);
        text = text.replace(
            "[protocol_options]\n",
            &format!("[protocol_options]\nl1_trick_pages = {l1}\nmapping_chunks = {chunks}\n"),
        );
        // A quarter of the seeds run black89's tester, half run kmem churn
        // (one thread per CPU allocating, freeing and touching each
        // other's kernel memory: the lazy kernel path under load), a
        // quarter keep the random mix.
        // hat_pageunload against hat_unload and faults (its back-off).
        text = text.replace(
            "kind = \"random\"\n",
            "kind = \"random\"\npage_unload = true\n",
        );
        let kind = r.below(4);
        if kind == 0 {
            // black89's tester: every CPU increments one page while its
            // protection is reduced, the immediate path under load.
            let start = text.find("[workload]").expect("workload table");
            let end = text[start + 1..]
                .find("\n[")
                .map_or(text.len(), |i| start + 1 + i + 1);
            text.replace_range(
                start..end,
                &format!(
                    "[workload]\nkind = \"tester\"\nchildren = {}\nsettle_cycles = 200000\n",
                    cpus - 1
                ),
            );
        } else if kind == 3 && r.chance(0.5) {
            // The random mix with CPUs going offline and online.
            text = text.replace("kind = \"random\"\n", "kind = \"random\"\nhotplug = true\n");
        } else if kind < 3 {
            let start = text.find("[workload]").expect("workload table");
            let end = text[start + 1..]
                .find("\n[")
                .map_or(text.len(), |i| start + 1 + i + 1);
            let threads = r.range_inclusive(1, cpus as u64);
            let allocations = r.range_inclusive(20, 120);
            let live = r.range_inclusive(1, 4);
            text.replace_range(
                start..end,
                &format!(
                    "[workload]\nkind = \"kmem-churn\"\nthreads = {threads}\nallocations = {allocations}\nlive = {live}\nmax_pages = 4\ntouch = true\n"
                ),
            );
        }
        // The switch "HAT lock per page table" (balan92 §Locking Design),
        // drawn last so that the draws above are unchanged.
        if r.chance(0.5) {
            text = text.replace(
                "[protocol_options]\n",
                "[protocol_options]\nhat_lock_per_pt = true\n",
            );
        }
        if !text.contains("[kernel]\n") {
            text.push_str("[kernel]\n");
            text.push_str(&format!(
                "hz = {hz}\nsegkmem_pages = {pages}\nsegkmem_zone_bytes = {zone}\n"
            ));
        } else {
            text = text.replace(
                "[kernel]\n",
                &format!(
                    "[kernel]\nhz = {hz}\nsegkmem_pages = {pages}\nsegkmem_zone_bytes = {zone}\n"
                ),
            );
        }
    }
    if uses_memory(protocol) && (!protocol.starts_with("linux") || r.chance(0.5)) {
        // romanescu10: a cache hierarchy drawn from the seed, from tiny
        // (constant writebacks, L2 recalls of PTE blocks held by TLBs) to
        // roomy, over snooping or a directory, MOSI or MOESI, with the
        // Jetty filter on or off; sometimes the 3-level PAE walk.
        // Drawn after every other parameter, so the swarm of the other
        // protocols is unchanged.
        let l1_sets = *r.pick(&[2u64, 4, 16, 64]);
        let l1_ways = *r.pick(&[1u64, 2, 4]);
        let l2_sets = l1_sets * *r.pick(&[1u64, 4, 16]);
        let l2_ways = *r.pick(&[2u64, 4, 8]);
        let proto = *r.pick(&["mosi", "moesi"]);
        let jetty = r.chance(0.5);
        let net = if r.chance(0.5) {
            "kind = \"snooping\"\ntree_hop_cycles = 2\n".to_string()
        } else {
            format!(
                "kind = \"directory\"\nmesh_cols = {cpus}\nmesh_rows = 1\nhop_cycles = 2\ndir_cycles = 6\n"
            )
        };
        if r.chance(0.3) {
            text = text.replace(
                &format!("page_table = \"{page_table}\""),
                "page_table = \"pae\"",
            );
        }
        // Regions large enough to hold whole page-table pages, so that
        // unmaps remove tables by their upper-level entry (§4.1).
        if r.chance(0.5) {
            text = text.replace(
                "kind = \"random\"\n",
                "kind = \"random\"\nmax_region_pages = 1100\n",
            );
        }
        text.push_str(&format!(
            "[memory]\nprotocol = \"{proto}\"\njetty = {jetty}\npcam_entries = {entries}\n\
             [memory.l1i]\nsize_bytes = {}\nways = {l1_ways}\nblock_bytes = 64\nlatency_cycles = 1\n\
             [memory.l1d]\nsize_bytes = {}\nways = {l1_ways}\nblock_bytes = 64\nlatency_cycles = 1\n\
             [memory.l2]\nsize_bytes = {}\nways = {l2_ways}\nblock_bytes = 64\nlatency_cycles = 6\n\
             [memory.interconnect]\n{net}",
            l1_sets * l1_ways * 64,
            l1_sets * l1_ways * 64,
            l2_sets * l2_ways * 64,
        ));
        // A software-refilled TLB (its handler supplies the PCAM's PTE
        // address, §4.1), drawn last; always for the control that breaks
        // exactly that.
        if r.chance(0.3) || protocol == "unitd-swtlb-no-pte-address" {
            text = text.replace("[machine.tlb]\n", "[machine.tlb]\nrefill = \"software\"\n");
        }
    }
    if protocol.starts_with("linux") && r.chance(0.5) {
        // 2.6.15's flat APIC mode (one ICR write interrupts every victim at
        // once) on half the seeds, bigsmp on the rest; drawn last.
        let flat = "apic_flat_max_cpus = 64\n";
        if text.contains("[kernel]\n") {
            text = text.replace("[kernel]\n", &format!("[kernel]\n{flat}"));
        } else {
            text.push_str(&format!("[kernel]\n{flat}"));
        }
    }
    if protocol.starts_with("mach") {
        // black89 §4's fourth complication and §9: the shootdown interrupt
        // with the device interrupts (the measured kernel) or above them
        // (§9's design), and the kernel's sections masking every interrupt
        // or the device interrupts only (where §9's level preempts them).
        // Drawn last, so that the draws above are unchanged.
        let level = *r.pick(&["device", "above-device"]);
        let sections = *r.pick(&["all", "high"]);
        text = text.replace(
            "[protocol_options]\n",
            &format!("[protocol_options]\nshootdown_level = \"{level}\"\n"),
        );
        let line = format!("disabled_level = \"{sections}\"\n");
        if text.contains("[kernel]\n") {
            text = text.replace("[kernel]\n", &format!("[kernel]\n{line}"));
        } else {
            text.push_str(&format!("[kernel]\n{line}"));
        }
        // §9's multicast and broadcast interrupts beside Fig. 1's loop;
        // drawn after the levels, so that their draws are unchanged.
        let send = *r.pick(&InterruptSend::NAMES);
        text = text.replace(
            "[protocol_options]\n",
            &format!("[protocol_options]\ninterrupt_send = \"{send}\"\n"),
        );
        // §9's remotely invalidated TLBs on a quarter of the seeds (not
        // under the negative controls, whose mutations are of Fig. 1's
        // responders).
        if r.chance(0.25) && protocol == "mach" {
            text = text.replace(
                "[protocol_options]\n",
                "[protocol_options]\nremote_invalidate = true\n",
            );
        }
    }
    Spec::parse(&text, &[], "check swarm").expect("swarm specs are valid")
}

/// Protocols of romanescu10, whose swarm draws a cache hierarchy.
fn uses_memory(protocol: &str) -> bool {
    protocol.starts_with("linux") || protocol == "ideal" || protocol.starts_with("unitd")
}

#[derive(Clone, Debug, Serialize)]
pub struct FailingSeed {
    pub seed: u64,
    pub violations: u64,
    pub liveness: Option<String>,
    pub first_violation: Option<String>,
    pub replay: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub protocol: String,
    pub seeds: u64,
    pub start: u64,
    /// Oracle violations plus lock-order violations.
    pub violations: u64,
    /// Of `violations`: the lock-order checker's (`lockorder`).
    pub lock_order_violations: u64,
    pub seeds_with_violations: u64,
    pub liveness_failures: u64,
    pub timeouts: u64,
    pub checked_uses: u64,
    pub shootdowns: u64,
    pub first_failing: Option<FailingSeed>,
    pub wall_s: f64,
    /// Stopped by Ctrl-C: `seeds` counts the seeds checked, not all asked
    /// for. Absent when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.violations == 0 && self.liveness_failures == 0
    }
}

/// What one check seed found.
pub struct SeedResult {
    pub seed: u64,
    /// Oracle violations plus lock-order violations.
    pub violations: u64,
    pub lock_order: u64,
    pub liveness: Option<String>,
    /// The first violation, in words.
    pub first: Option<String>,
    pub timed_out: bool,
    pub checked: u64,
    pub shootdowns: u64,
}

/// Runs check seed `seed` of `protocol` (its spec drawn by [`swarm_spec`]).
pub fn check_one(protocol: &str, seed: u64) -> SeedResult {
    let spec = swarm_spec(protocol, seed);
    let out = run_seed(&spec, seed);
    let c = &out.sim.counters;
    let lock_order = c.get("lockorder.violations");
    SeedResult {
        seed,
        violations: out.sim.oracle.violations + lock_order,
        lock_order,
        liveness: out.sim.liveness.as_ref().map(|l| format!("{} spun from {} to {} waiting for {}", l.cpu, l.since, l.at, l.waiting_for)),
        first: out.sim.oracle.first.first().map(|v| {
            let when = match v.op_completed {
                Some(t) => format!("completed at {t}"),
                // Coherent TLB hardware completes a reduction with its store.
                None => "had stored the PTE (the operation still running)".to_string(),
            };
            format!(
                "{} thread {} used a stale translation of {:#x} (space {}) at {} after `{}` by {} {when}",
                v.cpu, v.thread, v.va, v.space, v.time, v.op, v.op_cpu
            )
        }).or_else(|| (lock_order > 0).then(|| format!("{lock_order} lock-order violations (see lockorder.violations)"))),
        timed_out: out.sim.timed_out,
        checked: out.sim.oracle.checked_uses,
        shootdowns: c.get("interrupts.shootdown"),
    }
}

/// Runs `seeds` seeds from `start` in parallel (one seed per task, so the
/// result does not depend on the thread count).
pub fn check(
    protocol: &str,
    start: u64,
    seeds: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> CheckReport {
    check_until(protocol, start, seeds, progress, None)
}

/// [`check`], stopped when `stop` is raised: seeds not yet begun are
/// skipped, and those running finish (a seed is short), so the report
/// covers whole seeds only; `seeds` counts those checked and
/// `interrupted` says the sweep was cut short. `start + seeds` must not
/// overflow (the CLI checks it).
pub fn check_until(
    protocol: &str,
    start: u64,
    seeds: u64,
    progress: &(dyn Fn(u64) + Sync),
    stop: Option<&AtomicBool>,
) -> CheckReport {
    let t0 = Instant::now();
    let done = AtomicU64::new(0);
    let end = start.checked_add(seeds).expect("start + seeds fits a u64");
    let stopped = || stop.is_some_and(|s| s.load(Ordering::Relaxed));
    let results: Vec<SeedResult> = (start..end)
        .into_par_iter()
        .filter_map(|s| {
            if stopped() {
                return None;
            }
            let r = check_one(protocol, s);
            progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            Some(r)
        })
        .collect();
    let interrupted = stopped() && (results.len() as u64) < seeds;
    let first = results
        .iter()
        .find(|r| r.violations > 0 || r.liveness.is_some())
        .map(|r| FailingSeed {
            seed: r.seed,
            violations: r.violations,
            liveness: r.liveness.clone(),
            first_violation: r.first.clone(),
            replay: format!(
                "mmulab check --protocol {protocol} --start {} --seeds 1",
                r.seed
            ),
        });
    CheckReport {
        protocol: protocol.to_string(),
        seeds: results.len() as u64,
        start,
        interrupted,
        violations: results.iter().map(|r| r.violations).sum(),
        lock_order_violations: results.iter().map(|r| r.lock_order).sum(),
        seeds_with_violations: results.iter().filter(|r| r.violations > 0).count() as u64,
        liveness_failures: results.iter().filter(|r| r.liveness.is_some()).count() as u64,
        timeouts: results.iter().filter(|r| r.timed_out).count() as u64,
        checked_uses: results.iter().map(|r| r.checked).sum(),
        shootdowns: results.iter().map(|r| r.shootdowns).sum(),
        first_failing: first,
        wall_s: t0.elapsed().as_secs_f64(),
    }
}
