//! Pageout's aging of reference and modify bits (balan92 §Pageout):
//!
//! > "The implementation of local working set aging for pageout in SVR4.2
//! > also prevents shutdowns when compared to the global pageout policy in
//! > SVR4. The global pageout daemon scans all the physical pages in the
//! > system and clears the modify bit if the bit is set for a page (after
//! > calling VOP_PUTPAGE() on the page) or clears the reference bit if it
//! > is set. Both of these actions would require shutdowns (since these
//! > bits are in the page table entry). But with the working set aging,
//! > the process to be aged is seized; i.e. all the LWPs in the process
//! > except the current context are brought to a quiescent state. Thus,
//! > there is no need to shutdown when modifying the page table entries.
//! > The i386 context switch code flushes the TLBs when switching back in
//! > these LWPs."
//!
//! * Local (SVR4.2, the default): [`Sim::seize`] parks every other LWP of
//!   the process (a running one is sent a reschedule interrupt and
//!   switched out, which takes its CPU out of the address space's CPU set;
//!   a runnable one is taken off the run queue) until, under the address
//!   space's HAT lock, no CPU has it loaded. R and M are then cleared with
//!   no shootdown; a CPU that loads the address space again flushes
//!   (`hat_asload`), and the HAT lock keeps any from loading it meanwhile.
//!   If the caller itself belongs to the process it flushes its own TLB.
//! * Global (SVR4, `kernel.pageout_global = true`): every present user PTE
//!   of every process is examined; a set M is cleared, a set R otherwise,
//!   each through the HAT, which shoots the TLBs of the CPUs using that
//!   address space. (R is cleared in the PTE and the page is then shot
//!   with a modify-bit update, which changes nothing in a clean PTE: the
//!   pmap interface has no reference-bit update, and the shootdown is what
//!   the i386 needs, a cached entry never setting R again.) The
//!   `VOP_PUTPAGE` I/O is not modelled: only the shootdowns are compared.
//!
//! On TLBs tagged with a context number (balan92 §Other Architectures)
//! the context switch does not flush, so local aging retires the
//! process's context number after the clears instead.
//!
//! Clearing M is a reduction for the oracle: a stale dirty entry would
//! write without setting M. The negative control `svr42-pageout-no-seize`
//! ages locally without seizing.

use mmulab_engine::Cycles;
use mmulab_machine::{CpuId, Pte, Vpn};

use crate::cpu::{Ipl, Irq, Mode};
use crate::pmap::{Change, PmapId, Update};
use crate::sim::Sim;
use crate::vm::{TaskId, ThreadId, ThreadState};

/// A pageout request from the pageout daemon (a kernel thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageoutCall {
    /// Age the working set of `task` (local aging), or, with the global
    /// daemon, scan every process. Returns the PTEs whose R or M was
    /// cleared.
    Age { task: u32 },
    /// Page stealing's first step: unload every translation of the page
    /// the caller's task maps at `va` (`hat_pageunload`), leaving the page
    /// in its object (a later fault maps it again). Returns the mappings
    /// unloaded; 0 when nothing is mapped there or the page is also mapped
    /// in the kernel.
    PageUnload { va: u64 },
}

/// Pageout's switches.
#[derive(Clone, Debug, Default)]
pub struct Pageout {
    /// SVR4's global daemon instead of SVR4.2's local aging.
    pub global: bool,
    /// Negative control only (set by the `svr42-pageout-no-seize`
    /// protocol): local aging without seizing the process.
    pub control_no_seize: bool,
    /// Last context number handed out by local aging on tagged TLBs.
    pub next_asid: u16,
}

impl Sim {
    pub(crate) async fn pageout_call(&self, cpu: CpuId, tid: ThreadId, call: PageoutCall) -> u64 {
        let task = match call {
            PageoutCall::Age { task } => task,
            PageoutCall::PageUnload { va } => return self.page_unload_call(cpu, tid, va).await,
        };
        let global = self.w().pageout.global;
        self.count("pageout.passes", 1);
        let start = self.now();
        let n = if global {
            self.pageout_global(cpu).await
        } else {
            self.pageout_local(cpu, tid, TaskId(task)).await
        };
        self.record("pageout.pass_cycles", (self.now() - start).0 as f64);
        n
    }

    /// `PageoutCall::PageUnload`, in the caller's task (whose map lock the
    /// system call holds). With the SVR4.2 VM locks: the page's sleep lock
    /// in writer mode (its identity is about to change for every mapper),
    /// then its spin lock at splhi, then `hat_pageunload`.
    async fn page_unload_call(&self, cpu: CpuId, tid: ThreadId, va: u64) -> u64 {
        if va >= crate::sim::KERNEL_BASE {
            return 0;
        }
        let pmap = {
            let w = self.w();
            let task = w.threads[tid.0 as usize].task;
            w.tasks[task.0 as usize].pmap
        };
        let pte = self.w().pte(pmap, Vpn(va >> crate::sim::PAGE_SHIFT));
        if !pte.present() {
            return 0;
        }
        let pfn = pte.pfn();
        let before = self.w().mappings_of(pfn);
        if before.iter().any(|&(p, _)| p == crate::pmap::KERNEL_PMAP) {
            return 0;
        }
        let p = self.protocol();
        self.count("pageout.page_unloads", 1);
        self.begin_op(cpu, "hat_pageunload");
        if self.page_layer_locks() {
            let (spin, sleep) = self.page_locks(pfn.0);
            self.sleep_lock(cpu, sleep, true).await;
            let saved = self.set_ipl(cpu, Ipl::HIGH);
            self.lock(cpu, spin).await;
            p.page_unload(self, cpu, pfn).await;
            assert_eq!(
                self.w().locks[spin],
                Some(cpu),
                "hat_pageunload must return holding the page's spin lock"
            );
            self.unlock(cpu, spin).await;
            self.set_ipl(cpu, saved);
            // Every mapper needs the sleep lock we hold to map the page
            // again: none may be left.
            let left = self.w().mappings_of(pfn);
            assert!(
                left.is_empty(),
                "hat_pageunload left mappings of frame {}: {left:?}",
                pfn.0
            );
            self.sleep_unlock(cpu, sleep).await;
        } else {
            p.page_unload(self, cpu, pfn).await;
        }
        self.end_op(cpu);
        before.len() as u64
    }

    /// One step of a seize: park every LWP of `task` other than `me` that
    /// runs in user mode or waits on the run queue.
    fn seize_step(&self, task: TaskId, me: ThreadId, parked: &mut Vec<ThreadId>) {
        let mut nudge = Vec::new();
        {
            let mut w = self.w();
            let n = w.threads.len();
            for t in 0..n {
                let th = &w.threads[t];
                if th.task != task || th.id == me {
                    continue;
                }
                match th.state {
                    ThreadState::Runnable => {
                        if let Some(i) = w.run_queue.iter().position(|&x| x.0 as usize == t) {
                            w.run_queue.remove(i);
                            w.threads[t].state = ThreadState::Sleeping;
                            parked.push(ThreadId(t as u32));
                        }
                    }
                    ThreadState::Running => {
                        // Only a thread in user mode is switched out here;
                        // one in the kernel is left to finish (its trap may
                        // itself change its state) and parked on a later
                        // step.
                        let on = w.cpus.iter().position(|c| {
                            c.thread == Some(ThreadId(t as u32)) && c.mode == Mode::User
                        });
                        if let Some(c) = on {
                            w.threads[t].state = ThreadState::Sleeping;
                            parked.push(ThreadId(t as u32));
                            nudge.push(CpuId(c as u16));
                        }
                    }
                    ThreadState::Sleeping | ThreadState::Dead => {}
                }
            }
        }
        for c in nudge {
            // At once: the CPU is in user mode with no trap pending, so the
            // interrupt switches the parked thread out before it runs on.
            self.post_irq(c, Irq::Reschedule, Cycles(0));
        }
    }

    /// Seizes `task` for `me`: returns with the address space's HAT lock
    /// held (at splhi, the level returned) once no CPU other than `cpu`
    /// has it loaded, and the parked LWPs; None when the task died.
    pub async fn seize(
        &self,
        cpu: CpuId,
        me: ThreadId,
        task: TaskId,
        parked: &mut Vec<ThreadId>,
    ) -> Option<Ipl> {
        let pmap = self.task_pmap(task);
        let no_seize = self.w().pageout.control_no_seize;
        let poll = Cycles(self.costs().idle_poll_cycles.max(1));
        loop {
            if !no_seize {
                self.seize_step(task, me, parked);
            }
            let saved = self.set_ipl(cpu, Ipl::HIGH);
            self.lock_pmap(cpu, pmap).await;
            let (alive, quiet) = {
                let w = self.w();
                let p = &w.pmaps[pmap.0 as usize];
                (
                    w.tasks[task.0 as usize].alive && p.alive,
                    p.in_use.iter().all(|c| c == cpu),
                )
            };
            if !alive {
                self.unlock_pmap(cpu, pmap).await;
                self.set_ipl(cpu, saved);
                return None;
            }
            if quiet || no_seize {
                return Some(saved);
            }
            self.unlock_pmap(cpu, pmap).await;
            self.set_ipl(cpu, saved);
            self.count("pageout.seize_waits", 1);
            self.delay(cpu, poll).await;
        }
    }

    /// Lets the parked LWPs run again (their CPUs flush on `hat_asload`).
    pub fn unseize(&self, parked: Vec<ThreadId>) {
        for t in parked {
            self.make_runnable(t);
        }
    }

    /// The present PTEs of a task's regions: (vpn, pte).
    fn task_ptes(&self, task: TaskId, pmap: PmapId) -> Vec<(Vpn, Pte)> {
        let mut w = self.w();
        let ranges: Vec<(u64, u64)> = w.tasks[task.0 as usize]
            .regions
            .values()
            .map(|r| (r.start, r.pages))
            .collect();
        let mut out = Vec::new();
        for (start, pages) in ranges {
            w.for_each_present(pmap, Vpn(start), pages, |_, v, _, _, pte| {
                out.push((v, pte))
            });
        }
        out
    }

    /// SVR4.2 local working-set aging of one process.
    async fn pageout_local(&self, cpu: CpuId, me: ThreadId, task: TaskId) -> u64 {
        let costs = self.costs();
        if !self.w().tasks.get(task.0 as usize).is_some_and(|t| t.alive) {
            return 0;
        }
        let pmap = self.task_pmap(task);
        let mut parked = Vec::new();
        let Some(saved) = self.seize(cpu, me, task, &mut parked).await else {
            self.unseize(parked);
            return 0;
        };
        self.count("pageout.seizes", 1);
        let ptes = self.task_ptes(task, pmap);
        self.begin_op(cpu, "pageout: local aging");
        let mut changed = 0u64;
        {
            let mut w = self.w();
            for &(v, _) in &ptes {
                // Clear M (a reduction, recorded), then R.
                let e = w.pt_apply(
                    cpu,
                    &Update {
                        pmap,
                        start: v,
                        pages: 1,
                        change: Change::ClearModify,
                    },
                );
                changed += e.changed;
                let cur = w.pte(pmap, v);
                if cur.referenced() {
                    clear_referenced(&mut w, pmap, v);
                    changed += 1;
                }
            }
            w.counters.add("pageout.ptes_cleared", changed);
        }
        self.delay(
            cpu,
            Cycles(costs.mem_cycles * ptes.len() as u64 + costs.pte_write_cycles * changed),
        )
        .await;
        self.end_op(cpu);
        let tagged = self.w().cpus[cpu.index()].tlb.config().asid;
        if tagged {
            // Tagged TLBs do not flush on a context switch: the seized
            // LWPs' CPUs may still hold the process's entries. Retire its
            // context number instead (the usual lazy flush of a tagged
            // TLB): the old entries can no longer match.
            let mut w = self.w();
            w.pageout.next_asid = w.pageout.next_asid.max(0x8000) + 1;
            let asid = mmulab_machine::Asid(w.pageout.next_asid);
            w.pmaps[pmap.0 as usize].asid = asid;
            w.counters.add("pageout.asid_retired", 1);
        }
        // The caller's own LWP, if it is one of the process's, flushes.
        let own = !tagged && self.w().pmaps[pmap.0 as usize].in_use.contains(cpu);
        if own {
            let c = self.tlb_flush(cpu);
            self.delay(cpu, c).await;
        }
        self.unlock_pmap(cpu, pmap).await;
        self.set_ipl(cpu, saved);
        self.delay(cpu, Cycles(costs.spl_cycles)).await;
        self.unseize(parked);
        changed
    }

    /// SVR4's global daemon: every process, every present PTE; each clear
    /// goes through the HAT and shoots.
    async fn pageout_global(&self, cpu: CpuId) -> u64 {
        let costs = self.costs();
        let tasks: Vec<TaskId> = {
            let w = self.w();
            w.tasks.iter().filter(|t| t.alive).map(|t| t.id).collect()
        };
        let mut cleared = 0;
        for task in tasks {
            let pmap = self.task_pmap(task);
            if self.holds_seg_lock(cpu, task) {
                continue; // the daemon's own process
            }
            // The scanned process's segments must stay valid: its map
            // lock (with the SVR4.2 locks, its segment lock as reader).
            self.seg_lock(cpu, task, false).await;
            if !self.w().tasks[task.0 as usize].alive {
                self.seg_unlock(cpu, task).await;
                continue;
            }
            let ptes = self.task_ptes(task, pmap);
            self.delay(cpu, Cycles(costs.mem_cycles * ptes.len().max(1) as u64))
                .await;
            for (v, _) in ptes {
                let cur = self.w().pte(pmap, v);
                if !cur.present() || !(cur.modified() || cur.referenced()) {
                    continue;
                }
                if cur.modified() {
                    // After VOP_PUTPAGE: clear M through the HAT.
                    self.count("pageout.global.clear_modify", 1);
                } else {
                    clear_referenced(&mut self.w(), pmap, v);
                    self.count("pageout.global.clear_reference", 1);
                }
                self.begin_op(cpu, "pageout: global daemon");
                let p = self.protocol();
                p.update(
                    self,
                    cpu,
                    Update {
                        pmap,
                        start: v,
                        pages: 1,
                        change: Change::ClearModify,
                    },
                )
                .await;
                self.end_op(cpu);
                self.count("pageout.global.hat_updates", 1);
                cleared += 1;
            }
            self.seg_unlock(cpu, task).await;
        }
        cleared
    }
}

/// Clears a PTE's reference bit (not a reduction: no oracle record).
fn clear_referenced(w: &mut crate::sim::World, pmap: PmapId, v: Vpn) {
    let fmt = w.cfg.pt_format;
    let root = w.pmaps[pmap.0 as usize].root;
    let wk = mmulab_machine::pagetable::walk(&w.mem, fmt, root, v);
    if wk.leaf && wk.pte.present() {
        w.mem.table_mut(wk.table)[wk.index] = wk.pte.without(Pte::REFERENCED).0;
    }
}
