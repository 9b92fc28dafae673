//! balan92 §Locking Design under `svr42`: `hat_pageunload`, entered
//! holding the page spin lock, against a `hat_unload` that holds the HAT
//! lock and wants the page spin lock. The try-lock and back-off resolve
//! the inversion (no deadlock, no oracle or lock-order violation, and the
//! back-off path is taken); the blocking acquisition of the control
//! `svr42-pageunload-blocking` is flagged by the lock-order checker.
//! Also: per-CPU level-1 directories and the fork-chunk switch.

mod common;

use std::cell::Cell;
use std::rc::Rc;

use mmulab_kernel::pageout::PageoutCall;
use mmulab_kernel::program::FnProgram;
use mmulab_kernel::{Op, Prot, RefKind, Refs, Sim, SimConfig, SimResult, Syscall, ThreadCtx};
use mmulab_machine::CpuId;
use mmulab_protocols::{ProtocolOptions, find};

const PAGES: u64 = 32;

type Step = Box<dyn FnMut(&mut ThreadCtx<'_>) -> Op>;

fn script(steps: Vec<Step>) -> Box<dyn mmulab_kernel::Program> {
    let mut steps = steps.into_iter();
    Box::new(FnProgram(move |ctx: &mut ThreadCtx<'_>| {
        steps.next().map_or(Op::Exit, |mut f| f(ctx))
    }))
}

fn sim(protocol: &str, seed: u64, opts: &ProtocolOptions) -> Sim {
    let cfg = SimConfig {
        spin_bound: 200_000,
        ..common::small_config(2, seed)
    };
    Sim::new(cfg, (find(protocol).unwrap().make)(opts))
}

/// CPU 0: a parent maps and dirties `PAGES` pages, forks, waits, then
/// calls `hat_pageunload` on each page (every page is mapped in both
/// address spaces). CPU 1: the child reads every page (its own mappings of
/// the same frames), computes, then unmaps them all (the parent waits
/// `delay` cycles after the fork, which moves the two against each other):
/// `hat_unload` holds the child's HAT lock while it takes each page's spin
/// lock to edit the mapping chains.
fn race(protocol: &str, delay: u64, seed: u64) -> SimResult {
    let s = sim(protocol, seed, &ProtocolOptions::default());
    let task = s.create_task();
    let va = Rc::new(Cell::new(0u64));
    let mut steps: Vec<Step> = Vec::new();
    steps.push(Box::new(|_| {
        Op::Syscall(Syscall::Mmap {
            pages: PAGES,
            prot: Prot::ReadWrite,
        })
    }));
    let v = va.clone();
    steps.push(Box::new(move |ctx| {
        v.set(ctx.ret);
        Op::Refs(Refs {
            base: ctx.ret,
            start: 0,
            stride: 4096,
            count: PAGES,
            wrap: 0,
            kind: RefKind::Store(1),
        })
    }));
    let v = va.clone();
    steps.push(Box::new(move |_| {
        let base = v.get();
        let child: Vec<Step> = vec![
            Box::new(move |_| {
                Op::Refs(Refs {
                    base,
                    start: 0,
                    stride: 4096,
                    count: PAGES,
                    wrap: 0,
                    kind: RefKind::Load,
                })
            }),
            Box::new(move |_| Op::Compute(20_000)),
            Box::new(move |_| {
                Op::Syscall(Syscall::Munmap {
                    va: base,
                    pages: PAGES,
                })
            }),
        ];
        Op::Syscall(Syscall::Fork {
            child: script(child),
        })
    }));
    steps.push(Box::new(move |_| Op::Compute(1 + delay)));
    for i in 0..PAGES {
        let v = va.clone();
        steps.push(Box::new(move |_| {
            Op::Syscall(Syscall::Pageout(PageoutCall::PageUnload {
                va: v.get() + i * 4096,
            }))
        }));
    }
    s.spawn_thread(task, script(steps), Some(CpuId(0)));
    s.boot();
    s.run()
}

#[test]
fn pageunload_backs_off_from_a_hat_unload_without_deadlock() {
    let mut backoffs = 0;
    let mut unloads = 0;
    for delay in (0..30).map(|k| k * 2000) {
        let r = race("svr42", delay, 11);
        assert!(r.liveness.is_none(), "delay {delay}: {:?}", r.liveness);
        assert!(!r.timed_out, "delay {delay}: timed out");
        assert_eq!(r.oracle.violations, 0, "delay {delay}");
        assert_eq!(r.counters.get("lockorder.violations"), 0, "delay {delay}");
        backoffs += r.counters.get("svr42.pageunload.backoffs");
        unloads += r.counters.get("svr42.pageunload.mappings");
        assert!(r.counters.get("pageout.page_unloads") > 0, "delay {delay}");
    }
    assert!(unloads > 0, "hat_pageunload never unloaded a mapping");
    assert!(backoffs > 0, "the back-off path was never taken");
}

#[test]
fn a_blocking_hat_lock_in_pageunload_is_flagged() {
    let mut flagged = 0;
    for delay in (0..30).map(|k| k * 2000) {
        let r = race("svr42-pageunload-blocking", delay, 11);
        flagged += r.counters.get("lockorder.violations");
    }
    assert!(
        flagged > 0,
        "the checker never flagged the blocking acquisition"
    );
}

#[test]
fn pageunload_race_is_deterministic() {
    let a = race("svr42", 30_000, 3);
    let b = race("svr42", 30_000, 3);
    assert_eq!(a.counters, b.counters);
    assert_eq!(a.end, b.end);
}

/// A parent with a dirty 64-page region forks while a second LWP keeps
/// using it on the other CPU.
fn fork_run(fork_chunk_unlock: bool) -> SimResult {
    let opts = ProtocolOptions {
        fork_chunk_unlock,
        ..ProtocolOptions::default()
    };
    let s = sim("svr42", 5, &opts);
    let task = s.create_task();
    let va = Rc::new(Cell::new(0u64));
    let v = va.clone();
    let steps: Vec<Step> = vec![
        Box::new(|_| {
            Op::Syscall(Syscall::Mmap {
                pages: 64,
                prot: Prot::ReadWrite,
            })
        }),
        Box::new(move |ctx| {
            v.set(ctx.ret);
            Op::Refs(Refs {
                base: ctx.ret,
                start: 0,
                stride: 4096,
                count: 64,
                wrap: 0,
                kind: RefKind::Store(2),
            })
        }),
        Box::new(|_| {
            Op::Syscall(Syscall::Fork {
                child: script(vec![Box::new(|_| Op::Compute(100))]),
            })
        }),
    ];
    s.spawn_thread(task, script(steps), Some(CpuId(0)));
    s.boot();
    s.run()
}

#[test]
fn fork_drops_the_hat_lock_after_each_chunk_when_switched_on() {
    let on = fork_run(true);
    let off = fork_run(false);
    for r in [&on, &off] {
        assert_eq!(r.oracle.violations, 0);
        assert_eq!(r.counters.get("lockorder.violations"), 0);
        assert!(r.liveness.is_none());
    }
    // 64 pages = 2 mapping chunks: two HAT-lock holds, not one.
    assert_eq!(on.counters.get("svr42.fork.chunk_holds"), 2);
    assert_eq!(off.counters.get("svr42.fork.chunk_holds"), 0);
    assert!(on.counters.get("lock.hat.acquired") > off.counters.get("lock.hat.acquired"));
}

/// The page-hash lock is a leaf of the lock order (balan92 §Locking
/// Design, "a global spin lock in the page layer for protecting the page
/// hash chains"): held, any lock that can wait taken under it is a
/// violation; a new page's sleep lock (it cannot wait) is exempt and
/// counted; and any lock may be held when it is taken.
#[test]
fn the_page_hash_lock_is_a_leaf() {
    use mmulab_kernel::lockorder::{LockClass, LockRef};
    let s = sim("svr42", 1, &ProtocolOptions::default());
    let cpu = CpuId(0);
    let take = |l: LockRef| {
        let e = s.lock_enter(cpu, l);
        s.lock_acquired(cpu, l, e);
    };
    let hash = s.new_lock();
    s.set_lock_class(hash, LockClass::PageHash);
    let (spin, sleep) = s.page_locks(7);
    // Under a page sleep lock and a page spin lock: in order.
    take(LockRef::Sleep(sleep));
    take(LockRef::Named(spin));
    take(LockRef::Named(hash));
    assert_eq!(s.w().lockorder.violations, 0);
    s.lock_released(cpu, LockRef::Named(spin));
    s.lock_released(cpu, LockRef::Sleep(sleep));
    // A new page's sleep lock under it: exempt, counted.
    let (_, new_sleep) = s.page_locks(8);
    let e = s.try_lock_enter(cpu, LockRef::Sleep(new_sleep));
    s.lock_acquired(cpu, LockRef::Sleep(new_sleep), e);
    s.lock_released(cpu, LockRef::Sleep(new_sleep));
    assert_eq!(s.w().lockorder.violations, 0);
    assert_eq!(s.w().counters.get("lockorder.new_page_under_page_hash"), 1);
    // A blocking acquisition of any other class under it: a violation.
    take(LockRef::Named(spin));
    assert_eq!(s.w().lockorder.violations, 1);
    let first = s.w().lockorder.first.clone().unwrap();
    assert!(first.contains("page_hash"), "{first}");
}
