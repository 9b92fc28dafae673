//! black89 §4's fourth complication and §9's first hardware feature: the
//! level of the mach shootdown interrupt against the level of the kernel's
//! interrupt-disabled sections. A responder inside a section that masks
//! the device interrupts takes the shootdown interrupt late when it sits
//! with the device interrupts (the measured kernel) and at once when it
//! sits above them (§9's design); a section that masks every interrupt
//! holds it off either way.

use std::cell::Cell;
use std::rc::Rc;

use mmulab_kernel::program::FnProgram;
use mmulab_kernel::{Costs, Ipl, KernelParams, Op, Prot, RefKind, Refs, SimConfig, SimResult};
use mmulab_kernel::{Sim, Syscall};
use mmulab_machine::{CpuId, PtFormat, TlbConfig};
use mmulab_protocols::{ProtocolOptions, ShootdownLevel, find};

/// Mean length of the responder's sections: long against a shootdown's
/// own cost, so that waiting for one shows.
const SECTION: u64 = 200_000;
const REPROTECTS: u64 = 30;

/// CPU 0 reprotects a page of its task REPROTECTS times (a user-pmap
/// shootdown each, the page mapped again in between); CPU 1, in the same
/// task, makes system calls back to back, so it is mostly inside a trap's
/// disabled section (mean SECTION cycles) at `sections`.
fn run(level: ShootdownLevel, sections: Ipl, seed: u64) -> SimResult {
    simulate(config(seed, sections), level)
}

/// The two-CPU machine of `run`, its sections at `sections`.
fn config(seed: u64, sections: Ipl) -> SimConfig {
    SimConfig {
        cpus: 2,
        tlb: TlbConfig::default(),
        pt_format: PtFormat::X86_64,
        costs: Costs::default(),
        quantum_cycles: 50,
        memory_frames: 8192,
        seed,
        spin_bound: 10_000_000,
        max_cycles: 10_000_000_000,
        disabled_windows: None,
        trap_disabled_mean_cycles: SECTION,
        kernel: KernelParams {
            disabled_ipl: sections,
            ..KernelParams::default()
        },
        memory: None,
    }
}

/// `run`'s two threads on `cfg`, the mach shootdown interrupt at `level`.
fn simulate(cfg: SimConfig, level: ShootdownLevel) -> SimResult {
    let opts = ProtocolOptions {
        shootdown_level: level,
        ..ProtocolOptions::default()
    };
    let s = Sim::new(cfg, (find("mach").unwrap().make)(&opts));
    let task = s.create_task();
    let done = Rc::new(Cell::new(false));
    let d = done.clone();
    let mut step = 0u64;
    let mut page = 0u64;
    let initiator = FnProgram(move |ctx: &mut mmulab_kernel::ThreadCtx<'_>| {
        step += 1;
        if step == 1 {
            return Op::Compute(50_000);
        }
        if step == 2 {
            return Op::Syscall(Syscall::Mmap {
                pages: 1,
                prot: Prot::ReadWrite,
            });
        }
        if step == 3 {
            page = ctx.ret;
        }
        // Per reprotect: write the page (maps it writable), reduce it to
        // read-only (the shootdown), give the rights back.
        let i = step - 3;
        if i >= 3 * REPROTECTS {
            d.set(true);
            return Op::Exit;
        }
        match i % 3 {
            0 => Op::Refs(Refs {
                base: page,
                start: 0,
                stride: 8,
                count: 1,
                wrap: 0,
                kind: RefKind::Store(1),
            }),
            1 => Op::Syscall(Syscall::Mprotect {
                va: page,
                pages: 1,
                prot: Prot::Read,
            }),
            _ => Op::Syscall(Syscall::Mprotect {
                va: page,
                pages: 1,
                prot: Prot::ReadWrite,
            }),
        }
    });
    let mut calls = 0u64;
    let responder = FnProgram(move |_ctx: &mut mmulab_kernel::ThreadCtx<'_>| {
        calls += 1;
        if done.get() {
            Op::Exit
        } else if calls % 2 == 1 {
            // A call that changes nothing: rights are only raised, and
            // the range is its own (no shootdown from this CPU).
            Op::Syscall(Syscall::Mmap {
                pages: 1,
                prot: Prot::Read,
            })
        } else {
            Op::Compute(100)
        }
    });
    s.spawn_thread(task, Box::new(initiator), Some(CpuId(0)));
    s.spawn_thread(task, Box::new(responder), Some(CpuId(1)));
    s.boot();
    s.run()
}

/// (shootdowns, mean initiator cycles, longest initiator cycles).
fn initiators(r: &SimResult) -> (u64, f64, f64) {
    assert!(r.liveness.is_none(), "{:?}", r.liveness);
    assert!(!r.timed_out, "hung");
    assert_eq!(r.oracle.violations, 0);
    let h = r
        .hists
        .get("shootdown.user.initiator_cycles")
        .expect("user shootdowns were recorded");
    let s = h.summary();
    (s.n, s.mean, s.max)
}

#[test]
fn above_device_level_preempts_a_device_masked_section_and_device_level_waits() {
    for seed in 1..4u64 {
        let (n_dev, mean_dev, max_dev) = initiators(&run(ShootdownLevel::Device, Ipl::HIGH, seed));
        let (n_above, mean_above, max_above) =
            initiators(&run(ShootdownLevel::AboveDevice, Ipl::HIGH, seed));
        let (n_all, mean_all, _) = initiators(&run(ShootdownLevel::AboveDevice, Ipl::ALL, seed));
        for n in [n_dev, n_above, n_all] {
            assert!(n >= REPROTECTS / 2, "seed {seed}: only {n} shootdowns");
        }
        // §9's design: the responder takes the interrupt inside its
        // section at once, so no shootdown waits anywhere near a section.
        assert!(
            max_above < (SECTION / 10) as f64,
            "seed {seed}: above-device, a shootdown took {max_above} cycles"
        );
        // The measured level: the responder is mostly in a section and
        // answers where it ends, SECTION cycles on average.
        assert!(
            mean_dev > mean_above + (SECTION / 4) as f64 && max_dev > SECTION as f64 / 2.0,
            "seed {seed}: device {mean_dev:.0} (max {max_dev}) vs above-device {mean_above:.0}"
        );
        // A section that masks every interrupt holds off even §9's level.
        assert!(
            mean_all > mean_above + (SECTION / 4) as f64,
            "seed {seed}: sections masking all {mean_all:.0} vs high {mean_above:.0}"
        );
    }
}

/// The measured kernel's own runs are unchanged by giving sections a
/// level: with the shootdown at the device level, sections at splhigh hold
/// it off exactly as sections masking everything did (same events, same
/// times).
#[test]
fn device_level_with_high_sections_runs_as_sections_that_mask_everything() {
    for seed in 1..3u64 {
        let a = run(ShootdownLevel::Device, Ipl::HIGH, seed);
        let b = run(ShootdownLevel::Device, Ipl::ALL, seed);
        assert_eq!(a.end, b.end, "seed {seed}");
        assert_eq!(a.events, b.events, "seed {seed}");
        assert_eq!(initiators(&a), initiators(&b), "seed {seed}");
    }
}

/// Mean length of a clock tick's handler in `run_ticks`, and the mean
/// interval between ticks: the responder is in a handler about a third of
/// the time.
const TICK_HANDLER: u64 = 10_000;
const TICK_INTERVAL: u64 = 20_000;

/// As `run`, with no trap sections: CPU 1's thread makes system calls back
/// to back, so it is in the kernel most of the time, and the clock ticks
/// (`disabled_windows`, handlers at `sections`) are what holds off a
/// shootdown; `ticks` false turns the clock off.
fn run_ticks(level: ShootdownLevel, ticks: bool, seed: u64) -> SimResult {
    let mut cfg = config(seed, Ipl::HIGH);
    cfg.trap_disabled_mean_cycles = 0;
    cfg.disabled_windows = ticks.then_some(mmulab_kernel::sim::DisabledWindows {
        mean_interval_cycles: TICK_INTERVAL,
        mean_length_cycles: TICK_HANDLER,
    });
    simulate(cfg, level)
}

/// The clock tick reaches a CPU in the kernel, not only one in user mode:
/// most of the responder's ticks come while it is in a system call, and
/// at the measured (device) level a shootdown that finds it in a handler
/// waits for the handler's end, while §9's level preempts the handler,
/// even when the shootdown arrived during the handler's dispatch. Pooled
/// over seeds: a given seed's 30 shootdowns find the responder in a
/// handler only now and then.
#[test]
fn clock_ticks_reach_a_cpu_in_the_kernel_and_hold_off_device_level_shootdowns() {
    let (mut dev, mut off, mut above) = (0.0, 0.0, 0.0);
    let seeds = 1..9u64;
    for seed in seeds.clone() {
        let r = run_ticks(ShootdownLevel::Device, true, seed);
        let (in_kernel, in_user, taken) = (
            r.counters.get("kernel.clock_ticks_in_kernel"),
            r.counters.get("kernel.disabled_windows"),
            r.counters.get("interrupts.clock"),
        );
        assert!(
            in_kernel > in_user && in_kernel > 10,
            "seed {seed}: ticks in the kernel {in_kernel}, in user mode {in_user}"
        );
        // Every tick in the kernel is taken (one may still wait at the end).
        assert!(
            taken <= in_kernel && taken + 1 >= in_kernel,
            "seed {seed}: {taken} handlers for {in_kernel} ticks"
        );
        dev += initiators(&r).1;
        off += initiators(&run_ticks(ShootdownLevel::Device, false, seed)).1;
        above += initiators(&run_ticks(ShootdownLevel::AboveDevice, true, seed)).1;
    }
    let n = seeds.count() as f64;
    let (dev, off, above) = (dev / n, off / n, above / n);
    assert!(
        dev > off + (TICK_HANDLER / 20) as f64,
        "device level: with ticks {dev:.0} cycles, without {off:.0}"
    );
    assert!(
        above < off + (TICK_HANDLER / 200) as f64,
        "above-device level: with ticks {above:.0} cycles, without {off:.0}"
    );
}
