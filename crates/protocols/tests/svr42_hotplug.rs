//! balan92 hat_offline/hat_online through the kernel's CPU offline and
//! online calls: the last online CPU is never taken offline, and a CPU
//! brought back runs again.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use mmulab_kernel::program::FnProgram;
use mmulab_kernel::{Op, Sim, Syscall};
use mmulab_machine::CpuId;
use mmulab_protocols::{ProtocolOptions, find};

fn sim(cpus: usize) -> Sim {
    let cfg = common::small_config(cpus, 7);
    Sim::new(
        cfg,
        (find("svr42").unwrap().make)(&ProtocolOptions::default()),
    )
}

/// Offlines its CPU, records the answer, brings the CPU back if it went.
fn hotplug(log: Rc<RefCell<Vec<u64>>>) -> Box<dyn mmulab_kernel::Program> {
    let mut step = 0;
    Box::new(FnProgram(move |ctx: &mut mmulab_kernel::ThreadCtx<'_>| {
        step += 1;
        match step {
            1 => Op::Syscall(Syscall::CpuOffline),
            2 => {
                log.borrow_mut().push(ctx.ret);
                log.borrow_mut().push(ctx.cpu.0 as u64);
                if ctx.ret == u64::MAX {
                    Op::Exit
                } else {
                    Op::Syscall(Syscall::CpuOnline {
                        cpu: CpuId(ctx.ret as u16),
                    })
                }
            }
            3 => {
                log.borrow_mut().push(ctx.ret);
                Op::Syscall(Syscall::Migrate {
                    cpu: Some(CpuId(1)),
                })
            }
            _ => {
                log.borrow_mut().push(ctx.cpu.0 as u64);
                Op::Exit
            }
        }
    }))
}

#[test]
fn the_last_online_cpu_is_never_taken_offline() {
    let s = sim(1);
    let task = s.create_task();
    let log = Rc::new(RefCell::new(Vec::new()));
    s.spawn_thread(task, hotplug(log.clone()), None);
    s.boot();
    let r = s.run();
    assert_eq!(*log.borrow(), vec![u64::MAX, 0]);
    assert_eq!(r.counters.get("cpu.offline_refused"), 1);
    assert!(s.w().cpus[0].online);
}

#[test]
fn an_offlined_cpu_comes_back_and_runs_threads() {
    let s = sim(2);
    let task = s.create_task();
    let log = Rc::new(RefCell::new(Vec::new()));
    s.spawn_thread(task, hotplug(log.clone()), Some(CpuId(1)));
    s.boot();
    let r = s.run();
    // Offlined CPU 1, continued on CPU 0, onlined CPU 1, ran there again.
    assert_eq!(*log.borrow(), vec![1, 0, 0, 1]);
    assert_eq!(r.counters.get("cpu.offlines"), 1);
    assert_eq!(r.counters.get("cpu.onlines"), 1);
    assert_eq!(r.oracle.violations, 0);
    assert!(r.liveness.is_none());
}
