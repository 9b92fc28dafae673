//! The VM layer through the pmap interface: reference and modify bits set
//! by the walker, copy-on-write after fork, and the tester's race under
//! Mach with two initiators on different pmaps (kernel and user).

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use mmulab_engine::Cycles;
use mmulab_kernel::program::FnProgram;
use mmulab_kernel::{Op, Prot, RefKind, Refs, Sim, SimConfig, Syscall};
use mmulab_machine::{PtFormat, Vpn};
use mmulab_protocols::{ProtocolOptions, find};

fn sim(protocol: &str, cpus: usize) -> Sim {
    let cfg = SimConfig {
        pt_format: PtFormat::X86_64,
        ..common::small_config(cpus, 7)
    };
    Sim::new(
        cfg,
        (find(protocol).unwrap().make)(&ProtocolOptions::default()),
    )
}

/// Runs a list of operations as one thread's program, recording the value
/// of every load.
fn script(
    ops: Vec<Box<dyn Fn(u64) -> Op>>,
    log: Rc<RefCell<Vec<u64>>>,
) -> Box<dyn mmulab_kernel::Program> {
    let mut i = 0;
    let mut base = 0;
    Box::new(FnProgram(move |ctx: &mut mmulab_kernel::ThreadCtx<'_>| {
        if i == 1 {
            base = ctx.ret;
        }
        if i > 0 {
            log.borrow_mut().push(ctx.last_load);
        }
        let op = if i < ops.len() {
            (ops[i])(base)
        } else {
            Op::Exit
        };
        i += 1;
        op
    }))
}

#[test]
fn walker_sets_reference_and_modify_bits() {
    let s = sim("global", 1);
    let task = s.create_task();
    let log = Rc::new(RefCell::new(Vec::new()));
    let ops: Vec<Box<dyn Fn(u64) -> Op>> = vec![
        Box::new(|_| {
            Op::Syscall(Syscall::Mmap {
                pages: 2,
                prot: Prot::ReadWrite,
            })
        }),
        Box::new(|b| Op::Refs(Refs::one(b, RefKind::Load))),
        Box::new(|b| Op::Refs(Refs::one(b + 4096, RefKind::Store(5)))),
    ];
    s.spawn_thread(task, script(ops, log), None);
    s.boot();
    let r = s.run();
    assert_eq!(r.oracle.violations, 0);
    let w = s.w();
    let pmap = w.tasks[task.0 as usize].pmap;
    let read = w.pte(pmap, Vpn(0x10000));
    let written = w.pte(pmap, Vpn(0x10001));
    assert!(
        read.present() && read.referenced() && !read.modified(),
        "{read:?}"
    );
    assert!(
        written.present() && written.referenced() && written.modified(),
        "{written:?}"
    );
}

#[test]
fn fork_is_copy_on_write_for_both_sides() {
    let s = sim("mach", 2);
    let task = s.create_task();
    let parent_log = Rc::new(RefCell::new(Vec::new()));
    let child_log = Rc::new(RefCell::new(Vec::new()));
    let child_log2 = child_log.clone();
    let ops: Vec<Box<dyn Fn(u64) -> Op>> = vec![
        Box::new(|_| {
            Op::Syscall(Syscall::Mmap {
                pages: 1,
                prot: Prot::ReadWrite,
            })
        }),
        Box::new(|b| Op::Refs(Refs::one(b, RefKind::Store(11)))),
        Box::new(move |b| {
            // The child reads, sleeps while the parent writes, reads again.
            let child_ops: Vec<Box<dyn Fn(u64) -> Op>> = vec![
                Box::new(|_| Op::Compute(1)),
                Box::new(move |_| Op::Refs(Refs::one(b, RefKind::Load))),
                Box::new(|_| Op::Sleep(200_000)),
                Box::new(move |_| Op::Refs(Refs::one(b, RefKind::Load))),
                Box::new(move |_| Op::Refs(Refs::one(b, RefKind::Store(33)))),
            ];
            Op::Syscall(Syscall::Fork {
                child: script(child_ops, child_log2.clone()),
            })
        }),
        Box::new(|b| Op::Refs(Refs::one(b, RefKind::Store(22)))),
        Box::new(|b| Op::Refs(Refs::one(b, RefKind::Load))),
        Box::new(|_| Op::Sleep(400_000)),
        Box::new(|b| Op::Refs(Refs::one(b, RefKind::Load))),
    ];
    s.spawn_thread(task, script(ops, parent_log.clone()), None);
    s.boot();
    let r = s.run();
    assert_eq!(r.oracle.violations, 0);
    assert!(
        r.counters.get("vm.cow_copies") >= 2,
        "both sides copied: {:?}",
        r.counters
    );
    let p = parent_log.borrow();
    assert_eq!(p[4], 22, "parent sees its own write");
    assert_eq!(p[6], 22, "parent does not see the child's write: {p:?}");
    let c = child_log.borrow();
    assert_eq!(c[1], 11, "child sees the value at fork: {c:?}");
    assert_eq!(
        c[3], 11,
        "child does not see the parent's later write: {c:?}"
    );
}

/// black89 §4: two initiators on different pmaps (kernel and user) must not
/// deadlock. Each run has one thread freeing kernel memory (a kernel-pmap
/// shootdown) while another reprotects user memory (a user-pmap shootdown)
/// at the same moment, with the other CPUs using both pmaps.
#[test]
fn concurrent_kernel_and_user_initiators_do_not_deadlock() {
    for seed in 0..300u64 {
        let cfg_cpus = 4;
        let s = sim("mach", cfg_cpus);
        let task = s.create_task();
        let kbuf = Rc::new(RefCell::new(0u64));
        let user = Rc::new(RefCell::new(0u64));
        let skew = seed % 97;
        // Thread 0: maps user memory and kernel memory, then frees the
        // kernel memory while thread 1 reprotects the user memory.
        let (kb, us) = (kbuf.clone(), user.clone());
        let mut step = 0;
        let t0 = FnProgram(move |ctx: &mut mmulab_kernel::ThreadCtx<'_>| {
            step += 1;
            match step {
                1 => Op::Syscall(Syscall::Mmap {
                    pages: 4,
                    prot: Prot::ReadWrite,
                }),
                2 => {
                    *us.borrow_mut() = ctx.ret;
                    Op::Syscall(Syscall::KmemAlloc {
                        pages: 2,
                        wired: true,
                    })
                }
                3 => {
                    *kb.borrow_mut() = ctx.ret;
                    Op::Compute(20_000)
                }
                4 => Op::Compute(skew),
                5 => Op::Syscall(Syscall::KmemFree {
                    va: *kb.borrow(),
                    pages: 2,
                }),
                _ => Op::Exit,
            }
        });
        let (kb, us) = (kbuf.clone(), user.clone());
        let mut step = 0;
        let t1 = FnProgram(move |_ctx: &mut mmulab_kernel::ThreadCtx<'_>| {
            step += 1;
            let (k, u) = (*kb.borrow(), *us.borrow());
            match step {
                1 => Op::Compute(5_000),
                2 if k == 0 || u == 0 => {
                    step = 1;
                    Op::Compute(500)
                }
                2 => Op::Refs(Refs {
                    base: u,
                    start: 0,
                    stride: 4096,
                    count: 4,
                    wrap: 0,
                    kind: RefKind::Store(1),
                }),
                3 => Op::Refs(Refs {
                    base: k,
                    start: 0,
                    stride: 4096,
                    count: 2,
                    wrap: 0,
                    kind: RefKind::Load,
                }),
                4 => Op::Compute(20_000 - 5_000),
                5 => Op::Syscall(Syscall::Mprotect {
                    va: u,
                    pages: 4,
                    prot: Prot::Read,
                }),
                _ => Op::Exit,
            }
        });
        s.spawn_thread(task, Box::new(t0), Some(mmulab_machine::CpuId(0)));
        s.spawn_thread(task, Box::new(t1), Some(mmulab_machine::CpuId(1)));
        s.boot();
        let r = s.run();
        assert!(r.liveness.is_none(), "seed {seed}: {:?}", r.liveness);
        assert!(!r.timed_out, "seed {seed} hung");
        assert_eq!(r.oracle.violations, 0, "seed {seed}");
        assert!(r.end > Cycles(20_000));
    }
}
