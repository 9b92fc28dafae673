//! Mach's vm_map lock as a read/write lock (`Protocol::rw_map_lock`):
//! two threads of one `mach` task fault concurrently (both hold the map
//! lock shared, neither waits for the other), faults on one page are still
//! resolved once (the page locks stand for Mach's busy bit), and a memory
//! call holds the lock exclusive: a fault that arrives during an mprotect
//! waits for its end. The `global` protocol keeps the exclusive spin lock:
//! the same faults serialise there.

mod common;

use std::cell::Cell;
use std::rc::Rc;

use mmulab_kernel::program::FnProgram;
use mmulab_kernel::{Op, Prot, RefKind, Refs, Sim, SimResult, Syscall, ThreadCtx};
use mmulab_machine::CpuId;
use mmulab_protocols::{ProtocolOptions, find};

const PAGES: u64 = 64;

fn sim(protocol: &str, seed: u64) -> Sim {
    let cfg = common::small_config(2, seed);
    Sim::new(
        cfg,
        (find(protocol).unwrap().make)(&ProtocolOptions::default()),
    )
}

fn store(base: u64, start: u64, count: u64) -> Op {
    Op::Refs(Refs {
        base,
        start,
        stride: 4096,
        count,
        wrap: 0,
        kind: RefKind::Store(1),
    })
}

fn clean(r: &SimResult) {
    assert!(r.liveness.is_none(), "{:?}", r.liveness);
    assert!(!r.timed_out, "hung");
    assert_eq!(r.oracle.violations, 0);
    assert_eq!(r.counters.get("lockorder.violations"), 0);
}

/// Thread 0 maps PAGES pages and publishes the address; then both threads
/// store to pages of it, one page per fault: with `same`, both store to
/// every page (in opposite orders, so they meet); else each to its half.
fn two_faulters(protocol: &str, same: bool, seed: u64) -> SimResult {
    let s = sim(protocol, seed);
    let task = s.create_task();
    let va = Rc::new(Cell::new(0u64));
    let (v0, v1) = (va.clone(), va.clone());
    let mut step0 = 0u64;
    let t0 = FnProgram(move |ctx: &mut ThreadCtx<'_>| {
        step0 += 1;
        match step0 {
            1 => Op::Syscall(Syscall::Mmap {
                pages: PAGES,
                prot: Prot::ReadWrite,
            }),
            2 => {
                v0.set(ctx.ret);
                Op::Compute(10)
            }
            n if n - 3 < if same { PAGES } else { PAGES / 2 } => store(v0.get(), (n - 3) * 4096, 1),
            _ => Op::Exit,
        }
    });
    let mut i1 = 0u64;
    let t1 = FnProgram(move |_ctx: &mut ThreadCtx<'_>| {
        let base = v1.get();
        if base == 0 {
            return Op::Compute(10);
        }
        i1 += 1;
        let n = if same { PAGES } else { PAGES / 2 };
        if i1 > n {
            return Op::Exit;
        }
        let page = if same { PAGES - i1 } else { PAGES / 2 + i1 - 1 };
        store(base, page * 4096, 1)
    });
    s.spawn_thread(task, Box::new(t0), Some(CpuId(0)));
    s.spawn_thread(task, Box::new(t1), Some(CpuId(1)));
    s.boot();
    s.run()
}

#[test]
fn faults_on_one_mach_task_hold_the_map_lock_shared() {
    for seed in 1..4u64 {
        let r = two_faulters("mach", false, seed);
        clean(&r);
        assert_eq!(r.counters.get("vm.faults"), PAGES, "seed {seed}");
        // A fault was granted the map lock while the other thread's fault
        // held it, and no fault ever waited for the lock.
        let shared = r.counters.get("sleeplock.shared_grants");
        assert!(shared >= PAGES / 4, "seed {seed}: {shared} shared grants");
        assert_eq!(r.counters.get("sleeplock.blocked"), 0, "seed {seed}");
        // The exclusive map lock of `global` serialises the same faults.
        let g = two_faulters("global", false, seed);
        clean(&g);
        assert_eq!(g.counters.get("sleeplock.shared_grants"), 0);
        assert_eq!(r.counters.get("lock.segment.contended"), 0, "seed {seed}");
        let waits = g.counters.get("lock.segment.contended");
        assert!(waits > 0, "seed {seed}: global's faults never waited");
        assert!(r.end < g.end, "seed {seed}: {:?} vs {:?}", r.end, g.end);
    }
}

#[test]
fn concurrent_faults_on_one_page_fill_it_once() {
    for seed in 1..4u64 {
        let r = two_faulters("mach", true, seed);
        clean(&r);
        // Every page is zero-filled once, whoever faults on it first.
        assert_eq!(r.counters.get("vm.zero_fills"), PAGES, "seed {seed}");
        assert!(r.counters.get("sleeplock.shared_grants") > 0, "seed {seed}");
    }
}

/// Thread 1 maps and writes PAGES pages and a second region it leaves
/// untouched, then reprotects the first read-only (a long memory call: a
/// shootdown and PAGES PTE changes). Thread 0 faults on the second region
/// `delay` cycles after the mprotect began. Returns (mprotect's start and
/// end, the fault's start and end).
fn fault_during_mprotect(delay: u64, seed: u64) -> (SimResult, [u64; 4]) {
    let s = sim("mach", seed);
    let task = s.create_task();
    let times = Rc::new(Cell::new([0u64; 4]));
    let other = Rc::new(Cell::new(0u64));
    let (tm0, tm1, o0, o1) = (times.clone(), times.clone(), other.clone(), other.clone());
    let mut step1 = 0u64;
    let mut base = 0u64;
    let t1 = FnProgram(move |ctx: &mut ThreadCtx<'_>| {
        step1 += 1;
        match step1 {
            1 => Op::Syscall(Syscall::Mmap {
                pages: PAGES,
                prot: Prot::ReadWrite,
            }),
            2 => {
                base = ctx.ret;
                Op::Syscall(Syscall::Mmap {
                    pages: 1,
                    prot: Prot::ReadWrite,
                })
            }
            3 => {
                o1.set(ctx.ret);
                store(base, 0, PAGES)
            }
            4 => {
                let mut t = tm1.get();
                t[0] = ctx.now.0;
                tm1.set(t);
                Op::Syscall(Syscall::Mprotect {
                    va: base,
                    pages: PAGES,
                    prot: Prot::Read,
                })
            }
            5 => {
                let mut t = tm1.get();
                t[1] = ctx.now.0;
                tm1.set(t);
                Op::Exit
            }
            _ => Op::Exit,
        }
    });
    let mut step0 = 0u64;
    let t0 = FnProgram(move |ctx: &mut ThreadCtx<'_>| {
        let start = tm0.get()[0];
        if step0 == 0 {
            if start == 0 {
                return Op::Compute(10);
            }
            step0 = 1;
            return Op::Compute(delay);
        }
        step0 += 1;
        let mut t = tm0.get();
        match step0 {
            2 => {
                t[2] = ctx.now.0;
                tm0.set(t);
                store(o0.get(), 0, 1)
            }
            3 => {
                t[3] = ctx.now.0;
                tm0.set(t);
                Op::Exit
            }
            _ => Op::Exit,
        }
    });
    s.spawn_thread(task, Box::new(t0), Some(CpuId(0)));
    s.spawn_thread(task, Box::new(t1), Some(CpuId(1)));
    s.boot();
    let r = s.run();
    (r, times.get())
}

#[test]
fn a_memory_call_holds_faults_off() {
    for seed in 1..4u64 {
        let (r, [m0, m1, f0, f1]) = fault_during_mprotect(200, seed);
        clean(&r);
        assert!(
            m0 < f0 && f0 < m1,
            "seed {seed}: fault at {f0} outside mprotect {m0}..{m1}"
        );
        // The fault waited (asleep) for the mprotect's exclusive hold and
        // finished after it.
        assert!(f1 > m1, "seed {seed}: fault ended {f1}, mprotect {m1}");
        assert_eq!(r.counters.get("sleeplock.blocked"), 1, "seed {seed}");
        let w = r.hists.get("sleeplock.wait_cycles").expect("a wait");
        assert_eq!(w.summary().n, 1);
    }
}
