//! `mach`: the Mach TLB shootdown algorithm of black89 §4, Fig. 1, with
//! every refinement the paper describes:
//!
//! * the four phases (initiator queues actions and interrupts; responders
//!   leave the active set and spin while the kernel pmap or their user pmap
//!   is locked; the initiator changes the pmap; responders invalidate and
//!   rejoin);
//! * a responder that stops using the pmap before its interrupt arrives
//!   releases the initiator (the initiator waits for "inactive *or* not
//!   using the pmap");
//! * deadlock avoidance between initiators on different pmaps: initiators
//!   disable shootdown interrupts and leave the active set;
//! * the idle set: idle CPUs get actions queued but no interrupt, and
//!   process them before becoming active;
//! * a small per-CPU action queue whose overflow makes the responder flush
//!   its whole TLB, and a threshold between per-entry invalidation and a
//!   full flush (§4, details 1-2);
//! * no second interrupt to a CPU that already has one pending (detail 3);
//! * lazy evaluation: no shootdown for pages not mapped in the pmap.

use std::cell::RefCell;

use mmulab_engine::Cycles;
use mmulab_kernel::pmap::KERNEL_PMAP;
use mmulab_kernel::{Ipl, Irq, KFuture, PmapId, Protocol, Sim, Update};
use mmulab_machine::{CpuId, Vpn};

use crate::{InterruptSend, ProtocolOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    None,
    /// The initiator does not wait for responders (negative control).
    NoWait,
    /// Responders invalidate as soon as they are interrupted and go back
    /// to what they were doing without stalling for the unlock (their
    /// acknowledgement stands). Negative control for black89 §3: the
    /// hardware walker reloads the old entry before the change.
    FlushBeforeUnlock,
}

#[derive(Clone, Copy, Debug)]
struct Action {
    pmap: PmapId,
    start: Vpn,
    pages: u64,
}

#[derive(Default)]
struct PerCpu {
    active: bool,
    idle: bool,
    action_needed: bool,
    interrupt_pending: bool,
    queue: Vec<Action>,
    /// The queue overflowed: flush the whole TLB.
    overflow: bool,
}

pub struct Mach {
    opts: ProtocolOptions,
    mutation: Mutation,
    cpus: RefCell<Vec<PerCpu>>,
    /// One spin lock per CPU's action structure.
    action_locks: RefCell<Vec<usize>>,
}

impl Mach {
    pub fn new(opts: &ProtocolOptions, mutation: Mutation) -> Mach {
        Mach {
            opts: opts.clone(),
            mutation,
            cpus: RefCell::new(Vec::new()),
            action_locks: RefCell::new(Vec::new()),
        }
    }

    fn action_lock(&self, c: CpuId) -> usize {
        self.action_locks.borrow()[c.index()]
    }

    /// Phase 2 and 4 of a responder, shared by the interrupt handler and by
    /// an idle CPU about to become active. Only the interrupt handler's time
    /// is a responder sample: black89 §6 timed "the elapsed time in the
    /// interrupt service routine", which an idle CPU's catch-up is not.
    /// `start` is when the sample's clock started (the routine's first
    /// instruction, see `interrupt`).
    async fn respond(&self, sim: &Sim, me: CpuId, in_interrupt: bool, start: Cycles) {
        let costs = sim.costs();
        let mut kernel = false;
        let mut processed = 0;
        // Fig. 1's `while (action_needed[mycpu])`: each test reads shared
        // shootdown state, a cache miss (§7.1) before the acknowledgement.
        sim.delay(me, Cycles(costs.mem_cycles)).await;
        while self.cpus.borrow()[me.index()].action_needed {
            processed += 1;
            self.cpus.borrow_mut()[me.index()].active = false;
            if self.mutation == Mutation::FlushBeforeUnlock {
                kernel |= self.process_actions(sim, me).await;
                continue;
            }
            let user = sim.w().cpus[me.index()].pmap;
            sim.spin_until(me, "mach responder: pmaps unlocked", |w| {
                w.pmaps[KERNEL_PMAP.0 as usize].lock.is_none()
                    && user.is_none_or(|p| w.pmaps[p.0 as usize].lock.is_none())
            })
            .await;
            kernel |= self.process_actions(sim, me).await;
            self.cpus.borrow_mut()[me.index()].active = true;
            sim.delay(me, Cycles(costs.mem_cycles)).await;
        }
        // The clock stops here: after the last test of `action_needed`,
        // before `restore_interrupt_state` and the return (§6: the sample
        // "ignores the interrupt dispatch and return times").
        if processed > 0 {
            let kind = if kernel { "kernel" } else { "user" };
            let what = if in_interrupt {
                "responder"
            } else {
                "idle_responder"
            };
            sim.record(
                &format!("shootdown.{kind}.{what}_cycles"),
                (sim.now() - start).0 as f64,
            );
        }
    }

    /// black89 §9: "TLBs that support remote invalidation of entries can
    /// eliminate shootdown interrupts entirely if the reference/modify bit
    /// writeback problem is successfully addressed. The initiator can shoot
    /// the entries directly out of the responders' TLBs without involving
    /// the responders." The model's hardware sets the modify bit with an
    /// interlocked update that re-checks the PTE (fn. 6), so that problem
    /// is addressed: the initiator makes its change first (a reload after
    /// it finds the new PTE), then invalidates `users`' TLBs one by one,
    /// with the pmap locked. A use of a stale entry before its
    /// invalidation is one the operation allows while it is in progress.
    /// The initiator's sample is its consistency work (§6's sample less
    /// Phase 3, which here comes before the invalidations): the change's
    /// own cycles are left out.
    async fn change_and_invalidate_remotely(
        &self,
        sim: &Sim,
        me: CpuId,
        u: &Update,
        users: &[CpuId],
        kind: &str,
        start: Cycles,
    ) {
        let change = self.change_pmap(sim, me, u).await;
        for &c in users {
            let cost =
                sim.tlb_invalidate_remote(c, u.pmap, u.start, u.pages, self.opts.flush_threshold);
            sim.delay(me, cost).await;
        }
        if !users.is_empty() {
            sim.count(&format!("shootdown.{kind}.events"), 1);
            let spent = sim.now() - start - change;
            sim.record(
                &format!("shootdown.{kind}.initiator_cycles"),
                spent.0 as f64,
            );
            sim.record(&format!("shootdown.{kind}.processors"), users.len() as f64);
            sim.record(&format!("shootdown.{kind}.pages"), u.pages as f64);
        }
    }

    /// Phase 3: applies `u` to the page tables and charges the pmap
    /// bookkeeping; returns its cycles.
    async fn change_pmap(&self, sim: &Sim, me: CpuId, u: &Update) -> Cycles {
        let costs = sim.costs();
        let edit = sim.w().pt_apply(me, u);
        let c = Cycles((costs.pte_write_cycles + costs.pmap_change_page_cycles) * edit.changed);
        sim.delay(me, c).await;
        c
    }

    /// Phase 1's interrupts to `shoot`, the responders that have none
    /// pending, as `protocol_options.interrupt_send` says: one by one (Fig.
    /// 1), or in one multicast or broadcast send (§9).
    async fn send_interrupts(&self, sim: &Sim, me: CpuId, shoot: &[CpuId]) {
        if shoot.is_empty() {
            return;
        }
        match self.opts.interrupt_send {
            InterruptSend::Each => {
                for &c in shoot {
                    self.cpus.borrow_mut()[c.index()].interrupt_pending = true;
                    sim.send_ipi(me, c, Irq::Shootdown).await;
                }
            }
            InterruptSend::Multicast => {
                for &c in shoot {
                    self.cpus.borrow_mut()[c.index()].interrupt_pending = true;
                }
                sim.count("mach.multicast_sends", 1);
                sim.send_ipi_multicast(me, shoot, Irq::Shootdown).await;
            }
            InterruptSend::Broadcast => {
                // Every other online processor, in processor order, the
                // responders among them; the rest are interrupted for
                // nothing (§9's "interrupt too many processors").
                let all: Vec<CpuId> = {
                    let w = sim.w();
                    (0..w.cpus.len())
                        .map(|i| CpuId(i as u16))
                        .filter(|&c| c != me && w.is_online(c))
                        .collect()
                };
                for &c in &all {
                    self.cpus.borrow_mut()[c.index()].interrupt_pending = true;
                }
                sim.count("mach.broadcast_sends", 1);
                sim.count(
                    "mach.broadcast_extra_interrupts",
                    (all.len() - shoot.len()) as u64,
                );
                sim.send_ipi_multicast(me, &all, Irq::Shootdown).await;
            }
        }
    }

    /// Processes the queued actions; returns whether any was on the kernel
    /// pmap.
    async fn process_actions(&self, sim: &Sim, me: CpuId) -> bool {
        let lock = self.action_lock(me);
        sim.lock(me, lock).await;
        let (actions, overflow) = {
            let mut cpus = self.cpus.borrow_mut();
            let pc = &mut cpus[me.index()];
            pc.action_needed = false;
            (
                std::mem::take(&mut pc.queue),
                std::mem::take(&mut pc.overflow),
            )
        };
        let costs = sim.costs();
        let mut cost = Cycles(costs.action_process_cycles * actions.len() as u64);
        if overflow {
            cost += sim.tlb_flush(me);
            sim.count("mach.queue_overflow_flushes", 1);
        } else {
            for a in &actions {
                cost += sim.tlb_invalidate_range(
                    me,
                    a.pmap,
                    a.start,
                    a.pages,
                    self.opts.flush_threshold,
                );
            }
        }
        sim.unlock(me, lock).await;
        sim.delay(me, cost).await;
        overflow || actions.iter().any(|a| a.pmap == KERNEL_PMAP)
    }
}

impl Protocol for Mach {
    fn name(&self) -> &'static str {
        match self.mutation {
            Mutation::None => "mach",
            Mutation::NoWait => "mach-no-wait",
            Mutation::FlushBeforeUnlock => "mach-flush-before-unlock",
        }
    }

    /// Mach's vm_map lock is a read/write complex lock: a fault holds it
    /// shared (`vm_map_lookup`'s `vm_map_lock_read`, held to
    /// `vm_map_lookup_done` without MACH_XP's map versions), memory calls
    /// exclusive (map changes take `vm_map_lock`; for `vm_map_protect`
    /// that is [A], see there);
    /// see `Protocol::rw_map_lock`. The same for the negative-control
    /// mutations, which must differ from `mach` only in the mutation.
    fn rw_map_lock(&self) -> bool {
        true
    }

    fn init(&self, sim: &Sim) {
        let n = sim.w().cpus.len();
        *self.cpus.borrow_mut() = (0..n)
            .map(|_| PerCpu {
                active: true,
                ..Default::default()
            })
            .collect();
        *self.action_locks.borrow_mut() = (0..n).map(|_| sim.new_lock()).collect();
        // Mach pmaps allocate the kernel pmap's second-level tables at
        // bootstrap, for kernel virtual space as large as physical memory
        // [A]: the kernel's own wired data shares those tables with its
        // pageable allocations. So `lazy = false`'s level-2 skip (§7.2)
        // never skips a kernel range, only unpopulated user ones.
        let mut w = sim.w();
        let top = 1u64 << w.cfg.pt_format.vpn_bits();
        let start = w.kmem_next;
        let pages = w.cfg.memory_frames.min(top.saturating_sub(start));
        w.preallocate_tables(KERNEL_PMAP, Vpn(start), pages)
            .expect("physical memory for the kernel's page tables");
    }

    /// `protocol_options.shootdown_level`: with the device interrupts (the
    /// measured kernel, held off by every section that masks them) or
    /// above them (black89 §9's recommendation: held off only by code that
    /// masks every interrupt, the shootdown code and its pmap locks).
    fn interrupt_level(&self) -> Ipl {
        self.opts.shootdown_level.ipl()
    }

    fn update<'a>(&'a self, sim: &'a Sim, me: CpuId, u: Update) -> KFuture<'a> {
        Box::pin(async move {
            let costs = sim.costs();
            let start = sim.now();
            // Initiator, Fig. 1.
            let saved = sim.set_ipl(me, Ipl::ALL);
            sim.delay(me, Cycles(costs.spl_cycles)).await;
            self.cpus.borrow_mut()[me.index()].active = false;
            sim.lock_pmap(me, u.pmap).await;
            sim.delay(me, Cycles(costs.lazy_check_cycles)).await;
            // Lazy evaluation asks whether any page is mapped. Without it
            // the Multimax pmap still skips a range whose second-level
            // table is missing (black89 §7.2: "The remaining lazy
            // evaluation comes from internal pmap module knowledge about
            // the structure of Multimax page tables").
            let may_be_inconsistent = if self.opts.lazy {
                sim.w().any_mapped(u.pmap, u.start, u.pages)
            } else {
                sim.w().any_leaf_table(u.pmap, u.start, u.pages)
            };
            let kind = if u.pmap == KERNEL_PMAP {
                "kernel"
            } else {
                "user"
            };
            if may_be_inconsistent {
                let in_use_here = sim.w().pmaps[u.pmap.0 as usize].in_use.contains(me);
                if in_use_here {
                    let c = sim.tlb_invalidate_range(
                        me,
                        u.pmap,
                        u.start,
                        u.pages,
                        self.opts.flush_threshold,
                    );
                    sim.delay(me, c).await;
                }
                // Phase 1.
                let users: Vec<CpuId> = {
                    let w = sim.w();
                    w.pmaps[u.pmap.0 as usize]
                        .in_use
                        .iter()
                        .filter(|&c| c != me && w.is_online(c))
                        .collect()
                };
                if self.opts.remote_invalidate {
                    self.change_and_invalidate_remotely(sim, me, &u, &users, kind, start)
                        .await;
                    sim.unlock_pmap(me, u.pmap).await;
                    self.cpus.borrow_mut()[me.index()].active = true;
                    sim.restore_ipl(me, saved).await;
                    return;
                }
                let mut wait_for = Vec::new();
                let mut shoot = Vec::new();
                for &c in &users {
                    let lock = self.action_lock(c);
                    sim.lock(me, lock).await;
                    {
                        let mut cpus = self.cpus.borrow_mut();
                        let pc = &mut cpus[c.index()];
                        if pc.queue.len() >= self.opts.action_queue {
                            pc.overflow = true;
                        } else {
                            pc.queue.push(Action {
                                pmap: u.pmap,
                                start: u.start,
                                pages: u.pages,
                            });
                        }
                        pc.action_needed = true;
                    }
                    sim.delay(me, Cycles(costs.action_queue_cycles)).await;
                    sim.unlock(me, lock).await;
                    let (idle, pending) = {
                        let cpus = self.cpus.borrow();
                        (cpus[c.index()].idle, cpus[c.index()].interrupt_pending)
                    };
                    if !idle {
                        wait_for.push(c);
                        if pending {
                            sim.count("mach.interrupts_already_pending", 1);
                        } else {
                            shoot.push(c);
                        }
                    } else {
                        sim.count("mach.idle_skipped", 1);
                    }
                }
                self.send_interrupts(sim, me, &shoot).await;
                if self.mutation != Mutation::NoWait {
                    for &c in &wait_for {
                        let pmap = u.pmap;
                        sim.spin_until(me, &format!("mach initiator: {c} to respond"), |w| {
                            !self.cpus.borrow()[c.index()].active
                                || !w.pmaps[pmap.0 as usize].in_use.contains(c)
                        })
                        .await;
                    }
                }
                // An event is a shootdown that involved another processor
                // (black89 §6 records each initiator with a processor count).
                if !users.is_empty() {
                    sim.count(&format!("shootdown.{kind}.events"), 1);
                    sim.record(
                        &format!("shootdown.{kind}.initiator_cycles"),
                        (sim.now() - start).0 as f64,
                    );
                    sim.record(
                        &format!("shootdown.{kind}.processors"),
                        wait_for.len() as f64,
                    );
                    sim.record(&format!("shootdown.{kind}.pages"), u.pages as f64);
                }
            } else {
                sim.count(&format!("mach.{kind}.lazy_skips"), 1);
            }
            // Phase 3: the responders spin through it; the initiator's timer
            // (§6: until it "can begin making its changes") has stopped.
            self.change_pmap(sim, me, &u).await;
            sim.unlock_pmap(me, u.pmap).await;
            self.cpus.borrow_mut()[me.index()].active = true;
            sim.restore_ipl(me, saved).await;
        })
    }

    /// The interrupt service routine. The kernel has already paid the
    /// dispatch (state save and vectoring, `costs.ipi_dispatch_cycles`);
    /// black89 §6 times "the elapsed time in the interrupt service routine"
    /// and says this "ignores the interrupt dispatch and return times", so
    /// the responder's clock starts at the routine's first instruction,
    /// Fig. 1's `s = disable_interrupts()`, and stops after its loop.
    fn interrupt<'a>(&'a self, sim: &'a Sim, me: CpuId) -> KFuture<'a> {
        Box::pin(async move {
            let start = sim.now();
            self.cpus.borrow_mut()[me.index()].interrupt_pending = false;
            let saved = sim.set_ipl(me, Ipl::ALL);
            sim.delay(me, Cycles(sim.costs().spl_cycles)).await;
            self.respond(sim, me, true, start).await;
            sim.set_ipl(me, saved);
        })
    }

    /// Joining a pmap's users takes its lock, so that a CPU never starts
    /// using a pmap in the middle of a change that did not include it. The
    /// lock is held with every interrupt masked, as the initiator holds it
    /// (Fig. 1; §4: a lock is held at its interrupt level or higher), so
    /// that no interrupt handler (a clock tick) runs while the lock is
    /// held and an initiator waits for it; the wait for the lock takes
    /// interrupts as any spin does.
    fn activate<'a>(&'a self, sim: &'a Sim, cpu: CpuId, pmap: PmapId) -> KFuture<'a> {
        Box::pin(async move {
            let saved = sim.lock_pmap_at(cpu, pmap, Ipl::ALL).await;
            let c = sim.load_pmap(cpu, pmap);
            sim.unlock_pmap(cpu, pmap).await;
            sim.restore_ipl(cpu, saved).await;
            sim.delay(cpu, c).await;
        })
    }

    fn idle_enter<'a>(&'a self, _sim: &'a Sim, me: CpuId) -> KFuture<'a> {
        Box::pin(async move {
            let mut cpus = self.cpus.borrow_mut();
            cpus[me.index()].idle = true;
            cpus[me.index()].active = false;
        })
    }

    /// Leaving the idle set: clear the idle flag first, then process what
    /// was queued, so that an initiator either sees us idle-with-actions or
    /// not idle (and interrupts us).
    fn idle_exit<'a>(&'a self, sim: &'a Sim, me: CpuId) -> KFuture<'a> {
        Box::pin(async move {
            self.cpus.borrow_mut()[me.index()].idle = false;
            let saved = sim.set_ipl(me, Ipl::ALL);
            if self.cpus.borrow()[me.index()].action_needed {
                sim.count("mach.idle_actions_processed", 1);
                let start = sim.now();
                self.respond(sim, me, false, start).await;
            }
            self.cpus.borrow_mut()[me.index()].active = true;
            sim.restore_ipl(me, saved).await;
        })
    }
}
