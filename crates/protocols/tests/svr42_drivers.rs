//! balan92's segment drivers and pageout under `svr42`, on scripted
//! threads: segmap keeps a released chunk's translations, reclaims it with
//! no shootdown, ages it with none and shoots at reuse; local working-set
//! aging seizes the process and shoots nothing, SVR4's global daemon
//! shoots; and the broken variants of each are caught by the oracle.

mod common;

use std::cell::Cell;
use std::rc::Rc;

use mmulab_kernel::pageout::PageoutCall;
use mmulab_kernel::program::FnProgram;
use mmulab_kernel::segmap::SegmapCall;
use mmulab_kernel::{
    KernelParams, Op, Prot, RefKind, Refs, Sim, SimConfig, SimResult, Syscall, ThreadCtx,
};
use mmulab_machine::CpuId;
use mmulab_protocols::{ProtocolOptions, find};

fn sim(protocol: &str, cpus: usize, kernel: KernelParams) -> Sim {
    let cfg = SimConfig {
        kernel,
        ..common::small_config(cpus, 7)
    };
    Sim::new(
        cfg,
        (find(protocol).unwrap().make)(&ProtocolOptions::default()),
    )
}

fn getmap(file: u32, page: u64) -> Op {
    Op::Syscall(Syscall::Segmap(SegmapCall::Getmap { file, page }))
}

fn release(va: u64) -> Op {
    Op::Syscall(Syscall::Segmap(SegmapCall::Release { va }))
}

fn touch(va: u64, kind: RefKind) -> Op {
    Op::Refs(Refs::one(va, kind))
}

/// One thread runs `script` steps in order; each sees the last return.
fn script(steps: Vec<Step>) -> Box<dyn mmulab_kernel::Program> {
    let mut steps = steps.into_iter();
    Box::new(FnProgram(move |ctx: &mut ThreadCtx<'_>| {
        steps.next().map_or(Op::Exit, |mut f| f(ctx))
    }))
}

type Step = Box<dyn FnMut(&mut ThreadCtx<'_>) -> Op>;

fn run_one(protocol: &str, kernel: KernelParams, steps: Vec<Step>) -> SimResult {
    let s = sim(protocol, 2, kernel);
    let task = s.create_task();
    s.spawn_thread(task, script(steps), Some(CpuId(0)));
    s.boot();
    s.run()
}

fn one_chunk() -> KernelParams {
    KernelParams {
        segmap_pages: 2,
        segmap_chunk_pages: 2,
        ..KernelParams::default()
    }
}

#[test]
fn segmap_reuse_with_the_same_pages_before_aging_needs_no_shutdown() {
    let va = Rc::new(Cell::new(0u64));
    let (a, b, c, d) = (va.clone(), va.clone(), va.clone(), va.clone());
    let r = run_one(
        "svr42",
        one_chunk(),
        vec![
            Box::new(|_| getmap(3, 1)),
            Box::new(move |ctx| {
                a.set(ctx.ret);
                touch(ctx.ret, RefKind::Store(5))
            }),
            Box::new(move |_| release(b.get())),
            // The other page of the same 8 KB chunk: same identity.
            Box::new(|_| getmap(3, 0)),
            Box::new(move |ctx| {
                assert_eq!(ctx.ret + 4096, c.get(), "same chunk, page 0");
                release(ctx.ret)
            }),
            Box::new(|_| getmap(3, 1)),
            Box::new(move |ctx| {
                assert_eq!(ctx.ret, d.get());
                touch(ctx.ret, RefKind::Load)
            }),
            Box::new(|ctx| {
                assert_eq!(ctx.last_load, 5, "the page cache kept the write");
                Op::Exit
            }),
        ],
    );
    assert_eq!(r.oracle.violations, 0);
    assert_eq!(r.counters.get("segmap.misses"), 1);
    assert_eq!(r.counters.get("segmap.reclaims"), 2);
    assert_eq!(r.counters.get("segmap.hat_shutdown_calls"), 0);
    assert_eq!(r.counters.get("segmap.unloads"), 0, "translations kept");
}

#[test]
fn segmap_aging_then_reuse_for_other_pages() {
    let va = Rc::new(Cell::new(0u64));
    let (a, b) = (va.clone(), va.clone());
    let r = run_one(
        "svr42",
        one_chunk(),
        vec![
            Box::new(|_| getmap(1, 0)),
            Box::new(move |ctx| {
                a.set(ctx.ret);
                touch(ctx.ret, RefKind::Load)
            }),
            Box::new(move |_| release(b.get())),
            Box::new(|_| Op::Syscall(Syscall::Segmap(SegmapCall::Age))),
            Box::new(|ctx| {
                assert_eq!(ctx.ret, 1, "one chunk aged");
                getmap(2, 0)
            }),
            Box::new(|ctx| touch(ctx.ret, RefKind::Store(1))),
        ],
    );
    assert_eq!(r.oracle.violations, 0);
    let c = &r.counters;
    assert_eq!(c.get("segmap.aged"), 1);
    assert_eq!(c.get("segmap.unloads"), 1, "aging unloads");
    assert_eq!(
        c.get("svr42.kernel.deferred_unloads"),
        1,
        "without a shootdown"
    );
    assert_eq!(c.get("segmap.hat_shutdown_calls"), 1, "the reuse shoots");
    assert_eq!(c.get("segmap.misses"), 2);
}

/// CPU 1 reads file 0 through the only chunk and releases it; CPU 0 then
/// maps file 1 (the chunk is reused) and writes; CPU 1 maps file 1 and
/// reads: without the reuse's shutdown it reads file 0's frame through its
/// stale entry.
fn stale_reader(protocol: &str) -> SimResult {
    let s = sim(protocol, 2, one_chunk());
    let task = s.create_task();
    let phase = Rc::new(Cell::new(0u32));
    let (p1, p2, p3) = (phase.clone(), phase.clone(), phase.clone());
    let mut t1 = 0u32;
    let mut va1 = 0u64;
    let reader = FnProgram(move |ctx: &mut ThreadCtx<'_>| {
        t1 += 1;
        match t1 {
            1 => getmap(0, 0),
            2 => {
                va1 = ctx.ret;
                touch(va1, RefKind::Load)
            }
            3 => release(va1),
            4 => {
                p1.set(1);
                Op::Compute(10)
            }
            5 if p1.get() < 2 => {
                t1 = 4;
                Op::Compute(1000)
            }
            5 => getmap(1, 0),
            6 => {
                assert_eq!(ctx.ret, va1, "the reused chunk");
                touch(va1, RefKind::Load)
            }
            7 => {
                p1.set(3);
                release(va1)
            }
            _ => Op::Exit,
        }
    });
    let mut t0 = 0u32;
    let mut va0 = 0u64;
    let writer = FnProgram(move |ctx: &mut ThreadCtx<'_>| {
        if p2.get() < 1 {
            return Op::Compute(1000);
        }
        t0 += 1;
        match t0 {
            1 => getmap(1, 0),
            2 => {
                va0 = ctx.ret;
                touch(va0, RefKind::Store(9))
            }
            3 => release(va0),
            4 => {
                p3.set(2);
                Op::Compute(10)
            }
            _ if p3.get() < 3 => Op::Compute(1000),
            _ => Op::Exit,
        }
    });
    s.spawn_thread(task, Box::new(reader), Some(CpuId(1)));
    s.spawn_thread(task, Box::new(writer), Some(CpuId(0)));
    s.boot();
    s.run()
}

#[test]
fn a_segmap_reuse_without_shutdown_is_caught() {
    let good = stale_reader("svr42");
    assert_eq!(good.oracle.violations, 0);
    assert!(good.liveness.is_none());
    assert_eq!(good.counters.get("segmap.hat_shutdown_calls"), 1);
    assert_eq!(good.counters.get("hat.shutdown.real"), 1, "CPU 1 was shot");
    let bad = stale_reader("svr42-segmap-no-shutdown");
    assert!(bad.oracle.violations > 0, "the stale read went unnoticed");
}

/// Three LWPs store into their pages on CPUs 1-3 while a daemon process on
/// CPU 0 ages them `passes` times.
fn aging(protocol: &str, global: bool, passes: u64) -> SimResult {
    let s = sim(
        protocol,
        4,
        KernelParams {
            pageout_global: global,
            ..KernelParams::default()
        },
    );
    let task = s.create_task();
    let done = Rc::new(Cell::new(false));
    for c in 1..4u16 {
        let done = done.clone();
        let mut base = None;
        s.spawn_thread(
            task,
            Box::new(FnProgram(move |ctx: &mut ThreadCtx<'_>| {
                if done.get() {
                    return Op::Exit;
                }
                let Some(b) = base else {
                    base = Some(0);
                    return Op::Syscall(Syscall::Mmap {
                        pages: 8,
                        prot: Prot::ReadWrite,
                    });
                };
                let b = if b == 0 {
                    base = Some(ctx.ret);
                    ctx.ret
                } else {
                    b
                };
                Op::Refs(Refs {
                    base: b,
                    start: 0,
                    stride: 4096,
                    count: 64,
                    wrap: 8 * 4096,
                    kind: RefKind::Increment,
                })
            })),
            Some(CpuId(c)),
        );
    }
    let daemon = s.create_task();
    let mut step = 0;
    let d2 = done.clone();
    s.spawn_thread(
        daemon,
        Box::new(FnProgram(move |_: &mut ThreadCtx<'_>| {
            step += 1;
            if step > 2 * passes {
                d2.set(true);
                return Op::Exit;
            }
            if step % 2 == 1 {
                Op::Compute(50_000)
            } else {
                Op::Syscall(Syscall::Pageout(PageoutCall::Age { task: task.0 }))
            }
        })),
        Some(CpuId(0)),
    );
    s.boot();
    s.run()
}

#[test]
fn local_aging_seizes_and_shoots_nothing() {
    let r = aging("svr42", false, 5);
    assert_eq!(r.oracle.violations, 0);
    assert!(r.liveness.is_none());
    let c = &r.counters;
    assert_eq!(c.get("pageout.seizes"), 5);
    assert!(c.get("pageout.ptes_cleared") > 0);
    assert_eq!(c.get("ipi.sent"), 0, "no shootdown");
    assert!(r.oracle.checked_uses > 1000, "the LWPs ran on");
}

#[test]
fn the_global_daemon_shoots_for_each_clear() {
    let r = aging("svr42", true, 5);
    assert_eq!(r.oracle.violations, 0);
    let c = &r.counters;
    assert!(c.get("pageout.global.hat_updates") > 0);
    assert!(c.get("ipi.sent") > 0);
    assert_eq!(c.get("pageout.seizes"), 0);
}

#[test]
fn aging_without_seizing_is_caught() {
    let r = aging("svr42-pageout-no-seize", false, 5);
    assert!(r.oracle.violations > 0);
}

#[test]
fn the_lock_order_checker_flags_an_inversion_and_none_in_the_drivers() {
    use mmulab_kernel::lockorder::LockRef;
    let s = sim("svr42", 2, KernelParams::default());
    let task = s.create_task();
    let pmap = s.task_pmap(task);
    let vm_lock = s.w().tasks[task.0 as usize].vm_lock;
    // Holding the HAT lock, then the process's map lock: segment after
    // HAT inverts balan92's order.
    let e = s.lock_enter(CpuId(0), LockRef::Pmap(pmap));
    s.lock_acquired(CpuId(0), LockRef::Pmap(pmap), e);
    assert_eq!(s.w().lockorder.violations, 0);
    let e = s.lock_enter(CpuId(0), LockRef::Named(vm_lock));
    assert!(e.is_some());
    assert_eq!(s.w().lockorder.violations, 1);
    assert!(s.w().lockorder.first.as_ref().unwrap().contains("segment"));
    s.lock_released(CpuId(0), LockRef::Pmap(pmap));
    // The right order is fine.
    let e = s.lock_enter(CpuId(1), LockRef::Named(vm_lock));
    s.lock_acquired(CpuId(1), LockRef::Named(vm_lock), e);
    let e = s.lock_enter(CpuId(1), LockRef::Pmap(pmap));
    s.lock_acquired(CpuId(1), LockRef::Pmap(pmap), e);
    assert_eq!(s.w().lockorder.violations, 1);
    // hat_memload with a spin lock (the HAT lock) held is flagged too.
    s.check_no_spin_lock(CpuId(1), "hat_memload");
    assert_eq!(s.w().lockorder.violations, 2);
    // The drivers' runs above keep the order.
    for r in [
        stale_reader("svr42"),
        aging("svr42", false, 3),
        aging("svr42", true, 3),
    ] {
        assert_eq!(r.counters.get("lockorder.violations"), 0);
        assert!(r.counters.get("lock.hat.acquired") > 0);
    }
}
