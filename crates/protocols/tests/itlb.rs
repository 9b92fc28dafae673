//! romanescu10 Table 1's I-TLB: with a cache hierarchy that declares one,
//! user threads fetch their text page through it, its fills write PCAM 0,
//! UNITD's snooping and the software flushes reach it, and the oracle
//! checks its uses (a negative control leaves it stale on purpose).

use mmulab_kernel::memory::{DTLB, ITLB};
use mmulab_kernel::program::FnProgram;
use mmulab_kernel::vm::TEXT_BASE_VPN;
use mmulab_kernel::{Costs, Op, Prot, RefKind, Refs, Sim, SimConfig, SimResult, Syscall};
use mmulab_machine::pagetable::walk;
use mmulab_machine::{CpuId, PtFormat, TlbConfig, Vpn};
use mmulab_memsys::MemConfig;
use mmulab_protocols::{ProtocolOptions, find};

const TEXT_VA: u64 = TEXT_BASE_VPN << 12;

fn sim(protocol: &str, cpus: usize, max_cycles: u64) -> Sim {
    Sim::new(
        config(cpus, max_cycles),
        (find(protocol).unwrap().make)(&ProtocolOptions::default()),
    )
}

/// A small machine with romanescu10 Table 1's hierarchy (two TLBs a core).
fn config(cpus: usize, max_cycles: u64) -> SimConfig {
    SimConfig {
        cpus,
        tlb: TlbConfig {
            entries: 64,
            ways: 4,
            ..TlbConfig::default()
        },
        pt_format: PtFormat::X86_64,
        costs: Costs::default(),
        quantum_cycles: 50,
        memory_frames: 4096,
        seed: 3,
        spin_bound: 1_000_000,
        max_cycles,
        disabled_windows: None,
        trap_disabled_mean_cycles: 0,
        kernel: mmulab_kernel::KernelParams::default(),
        memory: Some(MemConfig::default()),
    }
}

/// A program running `ops` in order, then exiting.
fn script(ops: Vec<Op>) -> Box<dyn mmulab_kernel::Program> {
    let mut ops = ops.into_iter();
    Box::new(FnProgram(move |_: &mut mmulab_kernel::ThreadCtx<'_>| {
        ops.next().unwrap_or(Op::Exit)
    }))
}

/// `cpu`'s valid I-TLB entry for the text page: (slot, its PTE address).
fn itlb_text_entry(s: &Sim, cpu: usize) -> Option<(usize, u64)> {
    let w = s.w();
    let itlb = w.cpus[cpu].itlb.as_ref().expect("an I-TLB");
    itlb.entries()
        .iter()
        .position(|e| e.valid && e.vpn == Vpn(TEXT_BASE_VPN))
        .map(|i| (i, itlb.entry(i).pte_pa))
}

/// The address of the text page's PTE in `task`'s tables.
fn text_pte_pa(s: &Sim, task: mmulab_kernel::TaskId) -> u64 {
    let w = s.w();
    let pmap = w.tasks[task.0 as usize].pmap;
    let root = w.pmaps[pmap.0 as usize].root;
    walk(&w.mem, w.cfg.pt_format, root, Vpn(TEXT_BASE_VPN)).pte_pa
}

#[test]
fn flat_memory_has_no_itlb_and_no_text() {
    let cfg = SimConfig {
        memory: None,
        ..config(1, 1)
    };
    let s = Sim::new(
        cfg,
        (find("linux").unwrap().make)(&ProtocolOptions::default()),
    );
    let task = s.create_task();
    let w = s.w();
    assert!(w.cpus[0].itlb.is_none());
    assert_eq!(w.tasks[task.0 as usize].text, None);
    assert!(w.tasks[task.0 as usize].regions.is_empty());
}

#[test]
fn an_itlb_fill_writes_pcam_0() {
    // One thread fetches (and faults in) its text, then sleeps past the
    // end of the run, leaving its I-TLB entry in place.
    let s = sim("unitd", 1, 2_000_000);
    let task = s.create_task();
    s.spawn_thread(
        task,
        script(vec![Op::Compute(500), Op::Sleep(1_000_000_000)]),
        None,
    );
    s.boot();
    let r = s.run();
    assert_eq!(r.oracle.violations, 0);
    assert!(r.counters.get("tlb.itlb_misses") >= 1, "{:?}", r.counters);
    assert!(r.counters.get("tlb.itlb_hits") >= 1, "{:?}", r.counters);
    assert!(r.counters.get("mem.l1i_hits") + r.counters.get("mem.l1i_misses") >= 1);
    let pte_pa = text_pte_pa(&s, task);
    let (slot, pa) = itlb_text_entry(&s, 0).expect("the text page is in the I-TLB");
    assert_eq!(pa, pte_pa, "the entry is tagged with the text PTE");
    let w = s.w();
    let ms = w.memsys.as_ref().unwrap();
    assert_eq!(
        ms.pcam_entry(0, ITLB, slot),
        Some(pte_pa),
        "PCAM 0 holds it"
    );
    assert_ne!(
        ms.pcam_entry(0, DTLB, slot),
        Some(pte_pa),
        "the D-TLB's PCAM does not"
    );
}

/// Thread A (CPU 0) fetches its text and sleeps; thread B (CPU 1) then
/// mprotects the text page away and back: one reduction, whose PTE store
/// is what UNITD snoops.
fn text_reduced_while_a_sleeps(protocol: &str) -> (Sim, SimResult) {
    let s = sim(protocol, 2, 3_000_000);
    let task = s.create_task();
    s.spawn_thread(
        task,
        script(vec![Op::Compute(500), Op::Sleep(1_000_000_000)]),
        Some(CpuId(0)),
    );
    let b = vec![
        Op::Compute(200_000),
        Op::Syscall(Syscall::Mprotect {
            va: TEXT_VA,
            pages: 1,
            prot: Prot::None,
        }),
        Op::Syscall(Syscall::Mprotect {
            va: TEXT_VA,
            pages: 1,
            prot: Prot::Read,
        }),
        Op::Sleep(1_000_000_000),
    ];
    s.spawn_thread(task, script(b), Some(CpuId(1)));
    s.boot();
    let r = s.run();
    (s, r)
}

#[test]
fn unitd_a_store_to_the_text_pte_invalidates_the_itlb_entry() {
    let (s, r) = text_reduced_while_a_sleeps("unitd");
    assert_eq!(r.oracle.violations, 0);
    assert!(r.counters.get("unitd.tlb_invalidations") >= 1);
    // CPU 0 never ran again after its fetch: only the PCAM snoop of B's
    // PTE store can have removed its entry, and its PCAM 0 slot with it.
    assert_eq!(itlb_text_entry(&s, 0), None, "CPU 0's I-TLB entry survived");
    let w = s.w();
    let ms = w.memsys.as_ref().unwrap();
    let itlb = w.cpus[0].itlb.as_ref().unwrap();
    for i in 0..itlb.len() {
        if !itlb.entry(i).valid {
            assert_eq!(ms.pcam_entry(0, ITLB, i), None, "PCAM 0 slot {i} kept");
        }
    }
}

#[test]
fn linux_full_flush_empties_both_tlbs_and_refills_the_itlb() {
    // Each munmap is a full flush under linux (flush_tlb_mm): the next
    // fetch walks again.
    let s = sim("linux", 1, 50_000_000);
    let task = s.create_task();
    let mut ops = Vec::new();
    for _ in 0..4 {
        ops.push(Op::Syscall(Syscall::Mmap {
            pages: 1,
            prot: Prot::ReadWrite,
        }));
    }
    // mmap hands out consecutive regions with a guard page between.
    let va = |i: u64| (0x10000 + 2 * i) << 12;
    for i in 0..3 {
        ops.push(Op::Refs(Refs::one(va(i), RefKind::Load)));
        ops.push(Op::Syscall(Syscall::Munmap {
            va: va(i),
            pages: 1,
        }));
    }
    ops.push(Op::Refs(Refs::one(va(3), RefKind::Load)));
    ops.push(Op::Sleep(1_000_000_000));
    s.spawn_thread(task, script(ops), None);
    s.boot();
    let r = s.run();
    assert_eq!(r.oracle.violations, 0);
    let flushes = r.counters.get("tlb.full_flushes");
    assert!(flushes >= 3, "{:?}", r.counters);
    // The first fetch misses; so does the first after every flush that
    // found the text entry in place.
    assert!(
        r.counters.get("tlb.itlb_misses") > flushes,
        "misses {} after {flushes} full flushes",
        r.counters.get("tlb.itlb_misses")
    );
    // And the flush itself: both TLBs hold entries, then none.
    assert!(itlb_text_entry(&s, 0).is_some());
    assert!(s.w().cpus[0].tlb.valid_count() > 0);
    let _ = s.tlb_flush_user(CpuId(0));
    let w = s.w();
    assert_eq!(w.cpus[0].tlb.valid_count(), 0, "D-TLB not emptied");
    assert_eq!(
        w.cpus[0].itlb.as_ref().unwrap().valid_count(),
        0,
        "I-TLB not emptied"
    );
}

/// Negative control: thread A (CPU 0) keeps fetching while thread B
/// (CPU 1) takes the text page away and gives it back. With the I-TLB
/// left out of every flush and PCAM invalidation, A's fetches use the
/// stale entry and the oracle must say so; with it, nothing.
fn fetching_while_text_reduced(protocol: &str, broken: bool) -> SimResult {
    let s = sim(protocol, 2, 5_000_000);
    if broken {
        for c in &mut s.w().cpus {
            c.control_itlb_unflushed = true;
        }
    }
    let task = s.create_task();
    s.spawn_thread(task, script(vec![Op::Compute(1_000_000)]), Some(CpuId(0)));
    let b = vec![
        Op::Compute(100_000),
        Op::Syscall(Syscall::Mprotect {
            va: TEXT_VA,
            pages: 1,
            prot: Prot::None,
        }),
        Op::Compute(50_000),
        Op::Syscall(Syscall::Mprotect {
            va: TEXT_VA,
            pages: 1,
            prot: Prot::Read,
        }),
    ];
    s.spawn_thread(task, script(b), Some(CpuId(1)));
    s.boot();
    s.run()
}

#[test]
fn an_unflushed_itlb_is_caught_by_the_oracle() {
    for protocol in ["linux", "unitd"] {
        let ok = fetching_while_text_reduced(protocol, false);
        assert_eq!(ok.oracle.violations, 0, "{protocol}: {:?}", ok.oracle);
        let broken = fetching_while_text_reduced(protocol, true);
        assert!(
            broken.oracle.violations > 0,
            "{protocol}: a stale I-TLB went unnoticed: {:?}",
            broken.counters
        );
    }
}
