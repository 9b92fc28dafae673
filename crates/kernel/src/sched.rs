//! The scheduler: kernel entry, dispatch, context switches and the idle
//! loop. One global run queue; a thread may be bound to a CPU.

use mmulab_engine::Cycles;
use mmulab_machine::CpuId;

use crate::cpu::{Irq, Mode};
use crate::program::Op;
use crate::sim::{Sim, Trap, World};
use crate::vm::{ThreadId, ThreadState};

/// Why a CPU entered the kernel.
pub enum Entry {
    /// Boot: start in the dispatcher.
    Boot,
    /// The current thread trapped (fault, system call, sleep, exit).
    Trap,
    /// An interrupt arrived in user mode.
    Interrupt,
    /// Kernel code with interrupts masked (up to `KernelParams::
    /// disabled_ipl`) for this long (black89 §8).
    DisabledWindow(Cycles),
}

impl Sim {
    /// Starts every online CPU in the dispatcher at time 0.
    pub fn boot(&self) {
        let n = self.w().cpus.len();
        for i in 0..n {
            let cpu = CpuId(i as u16);
            if self.w().cpus[i].online {
                let sim = self.clone();
                self.spawn(
                    cpu,
                    Cycles(0),
                    Box::pin(async move { sim.kernel_entry(cpu, Entry::Boot).await }),
                );
            } else {
                self.w().cpus[i].mode = Mode::Offline;
            }
        }
    }

    pub(crate) async fn kernel_entry(&self, cpu: CpuId, entry: Entry) {
        // Interrupts are precise: an access in flight retires (performs or
        // replays) before the kernel runs.
        crate::sim::retire_inflight(&mut self.w(), cpu);
        match entry {
            Entry::Boot => {}
            Entry::Trap => {
                let trap_cycles = self.costs().trap_cycles;
                self.delay(cpu, Cycles(trap_cycles)).await;
                let mean = self.w().cfg.trap_disabled_mean_cycles;
                if mean > 0 {
                    // Part of the kernel path runs with interrupts masked
                    // up to the kernel's section level (every interrupt by
                    // default), delaying any shootdown aimed at this CPU
                    // that the level holds off.
                    let len = self.w().cpus[cpu.index()].rng.exponential(mean as f64) as u64;
                    let level = self.w().cfg.kernel.disabled_ipl;
                    let saved = self.set_ipl(cpu, level);
                    self.preemptible_delay(cpu, Cycles(len)).await;
                    self.restore_ipl(cpu, saved).await;
                }
                self.handle_trap(cpu).await;
            }
            Entry::Interrupt => self.take_interrupts(cpu).await,
            Entry::DisabledWindow(len) => {
                let level = self.w().cfg.kernel.disabled_ipl;
                let saved = self.set_ipl(cpu, level);
                self.preemptible_delay(cpu, len).await;
                self.restore_ipl(cpu, saved).await;
            }
        }
        self.dispatch(cpu).await;
    }

    async fn handle_trap(&self, cpu: CpuId) {
        let tid = self.w().cpus[cpu.index()]
            .thread
            .expect("trap without a thread");
        let trap = self.w().threads[tid.0 as usize]
            .trap
            .take()
            .expect("trap recorded");
        let path = match &trap {
            Trap::Fault { .. } => "fault",
            Trap::Op(Op::Syscall(crate::program::Syscall::Fork { .. })) => "fork",
            Trap::Op(Op::Syscall(_)) => "syscall",
            Trap::Op(Op::Exit) => "exit",
            Trap::Op(_) => "other",
        };
        self.w().cpus[cpu.index()].lock_path = Some(path);
        self.run_trap(cpu, tid, trap).await;
        self.w().cpus[cpu.index()].lock_path = None;
    }

    async fn run_trap(&self, cpu: CpuId, tid: ThreadId, trap: Trap) {
        match trap {
            Trap::Fault { va, store } => self.vm_fault(cpu, tid, va, store).await,
            Trap::Op(Op::Syscall(s)) => self.syscall(cpu, tid, s).await,
            Trap::Op(Op::Sleep(c)) => {
                let mut w = self.w();
                w.threads[tid.0 as usize].state = ThreadState::Sleeping;
                w.cpus[cpu.index()].thread = None;
                let at = w.now() + Cycles(c);
                w.queue.push(at, crate::sim::Event::WakeThread(tid));
            }
            Trap::Op(Op::Exit) => self.thread_exit(cpu, tid).await,
            Trap::Op(Op::Refs(_) | Op::Compute(_)) => unreachable!("handled on the hot path"),
        }
    }

    /// Picks what `cpu` runs next: its thread, another runnable one, or the
    /// idle loop.
    async fn dispatch(&self, cpu: CpuId) {
        let mut from_idle = false;
        loop {
            if !self.w().cpus[cpu.index()].online {
                self.parked(cpu).await;
            }
            let cur = self.w().cpus[cpu.index()].thread;
            if let Some(t) = cur {
                let now = self.now();
                let running = self.w().threads[t.0 as usize].state == ThreadState::Running;
                if running {
                    self.resume_user(cpu, now);
                    return;
                }
                self.w().cpus[cpu.index()].thread = None;
            }
            if let Some(t) = self.pick(cpu) {
                self.switch_to(cpu, t, from_idle).await;
                from_idle = false;
                continue;
            }
            self.idle(cpu).await;
            from_idle = true;
        }
    }

    /// An offline CPU waits, executing nothing and taking no interrupt,
    /// until it is onlined; then it runs the protocol's `online` (balan92
    /// `hat_online`: join the kernel's CPU set, flush the TLB).
    async fn parked(&self, cpu: CpuId) {
        let poll = Cycles(self.costs().idle_poll_cycles.max(1));
        while !self.w().cpus[cpu.index()].online {
            if self.w().stop {
                std::future::pending::<()>().await;
            }
            self.idle_wait(cpu, poll).await;
        }
        let p = self.protocol();
        p.online(self, cpu).await;
    }

    fn pick(&self, cpu: CpuId) -> Option<ThreadId> {
        let mut w = self.w();
        let pos = w
            .run_queue
            .iter()
            .position(|&t| w.threads[t.0 as usize].affinity.is_none_or(|a| a == cpu))?;
        w.run_queue.remove(pos)
    }

    fn has_work(&self, cpu: CpuId) -> bool {
        self.w().has_work(cpu)
    }

    /// Runs `t` on `cpu`, loading its address space unless it is the one
    /// loaded (`from_idle`: the CPU leaves the idle loop, where a
    /// `lazy_tlb` kernel kept it).
    async fn switch_to(&self, cpu: CpuId, t: ThreadId, from_idle: bool) {
        let (old, new) = {
            let w = self.w();
            let task = w.threads[t.0 as usize].task;
            (w.cpus[cpu.index()].pmap, w.tasks[task.0 as usize].pmap)
        };
        let p = self.protocol();
        let cs = self.costs().context_switch_cycles;
        if old != Some(new) {
            if let Some(o) = old {
                p.deactivate(self, cpu, o).await;
            }
            self.delay(cpu, Cycles(cs)).await;
            p.activate(self, cpu, new).await;
        } else {
            if from_idle {
                // Lazy TLB mode paid off: no CR3 load, the TLB kept.
                self.count("sched.lazy_tlb_kept", 1);
            }
            self.delay(cpu, Cycles(cs)).await;
        }
        let mut w = self.w();
        w.threads[t.0 as usize].state = ThreadState::Running;
        w.cpus[cpu.index()].thread = Some(t);
        w.counters.add("sched.context_switches", 1);
    }

    async fn idle(&self, cpu: CpuId) {
        let p = self.protocol();
        let old = self.w().cpus[cpu.index()].pmap;
        let lazy = p.lazy_tlb();
        if let Some(o) = old
            && !lazy
        {
            p.deactivate(self, cpu, o).await;
        }
        self.w().cpus[cpu.index()].idle = true;
        p.idle_enter(self, cpu).await;
        let poll = Cycles(self.costs().idle_poll_cycles.max(1));
        while !self.has_work(cpu) {
            if self.w().stop {
                std::future::pending::<()>().await;
            }
            self.idle_poll(cpu, poll).await;
        }
        p.idle_exit(self, cpu).await;
        self.w().cpus[cpu.index()].idle = false;
    }

    /// Queues a thread and wakes an idle CPU that may run it.
    pub(crate) fn make_runnable(&self, t: ThreadId) {
        let target = {
            let mut w = self.w();
            let th = &mut w.threads[t.0 as usize];
            if th.state == ThreadState::Dead {
                return;
            }
            th.state = ThreadState::Runnable;
            let aff = th.affinity;
            w.run_queue.push_back(t);
            match aff {
                Some(c) => w.cpus[c.index()].idle.then_some(c),
                None => w.cpus.iter().find(|c| c.idle && c.online).map(|c| c.id),
            }
        };
        if let Some(c) = target {
            let lat = Cycles(self.costs().ipi_latency_cycles);
            self.post_irq(c, Irq::Reschedule, lat);
        }
    }
}

impl World {
    /// A thread in the run queue may run on `cpu`.
    pub(crate) fn has_work(&self, cpu: CpuId) -> bool {
        self.run_queue
            .iter()
            .any(|&t| self.threads[t.0 as usize].affinity.is_none_or(|a| a == cpu))
    }
}
