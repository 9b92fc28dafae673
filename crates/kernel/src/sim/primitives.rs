//! The kernel primitives coroutines call: sleeping and blocking, `delay`,
//! interrupt priority, `spin_until`, pmap and simple locks, IPIs and the
//! oracle's operation bracket. Moved out of `sim.rs` unchanged.

use super::executor::Wake;
use super::*;

/// A spinner's next wake-up: the first iteration boundary at or after the
/// next kernel event, or `None` past the bound.
#[inline]
pub(super) fn spin_next_wake(w: &World, since: Cycles, step: u64, bound: u64) -> Option<Cycles> {
    let now = w.now();
    let done = (now - since).0 / step;
    if done > bound {
        None
    } else {
        let target = match w.queue.peek_time() {
            Some(t) if t > now => t,
            Some(_) => now + Cycles(1),
            None => since + Cycles((bound + 1) * step),
        };
        let k = (target - since).0.div_ceil(step).max(done + 1);
        Some(since + Cycles(k * step))
    }
}

impl Sim {
    /// Suspends a spinning coroutine until `at` (its wake-up goes to the
    /// spinners' own queue).
    async fn spin_sleep_until(&self, cpu: CpuId, at: Cycles) {
        {
            let mut w = self.w();
            let c = &mut w.cpus[cpu.index()];
            c.resume_gen += 1;
            let generation = c.resume_gen;
            w.spin_push_one(at, cpu, generation);
        }
        Wake { armed: false }.await;
    }

    /// Suspends the calling coroutine until `at` (no interrupt check).
    async fn sleep_until(&self, cpu: CpuId, at: Cycles) {
        {
            let mut w = self.w();
            let c = &mut w.cpus[cpu.index()];
            c.resume_gen += 1;
            let generation = c.resume_gen;
            w.queue.push(at, Event::Resume { cpu, generation });
        }
        Wake { armed: false }.await;
    }

    /// Blocks `cpu` (no spinning) until `at`, an interrupt its level lets
    /// through, or a wake-up another CPU posts (a new `Resume` while
    /// `idle_waiting`), whichever is first.
    pub(crate) async fn block_until(&self, cpu: CpuId, at: Cycles) {
        self.w().cpus[cpu.index()].idle_waiting = true;
        self.sleep_until(cpu, at).await;
        self.w().cpus[cpu.index()].idle_waiting = false;
    }

    /// Kernel code on `cpu` runs for `c` cycles, then takes any interrupt
    /// its level lets through.
    pub async fn delay(&self, cpu: CpuId, c: Cycles) {
        let at = self.now() + c;
        self.sleep_until(cpu, at).await;
        if self.w().cpus[cpu.index()].takeable().is_some() {
            self.take_interrupts(cpu).await;
        }
    }

    /// Kernel code on `cpu` runs for `c` cycles at its current level and
    /// takes an interrupt that level lets through as soon as it arrives,
    /// not where the code ends (as `delay` does, which is right for the
    /// short steps between interrupt checks but not for a long section a
    /// higher-level interrupt preempts, black89 §9); the rest of the work
    /// goes on after the handler. At a level that masks everything this
    /// is `delay`, event for event.
    pub async fn preemptible_delay(&self, cpu: CpuId, c: Cycles) {
        // An interrupt that arrived before the section began (during the
        // entry or the dispatch before it, when nothing was waiting to be
        // woken) is taken first, not after the whole section.
        if self.w().cpus[cpu.index()].takeable().is_some() {
            self.take_interrupts(cpu).await;
        }
        let mut left = c.0;
        loop {
            let from = self.now();
            self.w().cpus[cpu.index()].idle_waiting = true;
            self.sleep_until(cpu, from + Cycles(left)).await;
            self.w().cpus[cpu.index()].idle_waiting = false;
            left = left.saturating_sub((self.now() - from).0);
            if self.w().cpus[cpu.index()].takeable().is_some() {
                self.take_interrupts(cpu).await;
            }
            if left == 0 {
                break;
            }
        }
    }

    /// Sets the interrupt priority level, returning the old one. Lowering
    /// it takes what is pending at the next delay.
    pub fn set_ipl(&self, cpu: CpuId, ipl: Ipl) -> Ipl {
        let mut w = self.w();
        std::mem::replace(&mut w.cpus[cpu.index()].ipl, ipl)
    }

    /// Restores a level and takes any interrupt it now lets through.
    pub async fn restore_ipl(&self, cpu: CpuId, ipl: Ipl) {
        let spl = self.costs().spl_cycles;
        self.set_ipl(cpu, ipl);
        self.delay(cpu, Cycles(spl)).await;
    }

    /// Takes pending interrupts the level allows, highest priority first.
    pub fn take_interrupts(&self, cpu: CpuId) -> KFuture<'_> {
        Box::pin(async move {
            loop {
                let (irq, level, saved) = {
                    let mut w = self.w();
                    let c = &mut w.cpus[cpu.index()];
                    let Some(irq) = c.takeable() else { break };
                    c.pending &= !irq.bit();
                    let level = c.level_of(irq);
                    let saved = std::mem::replace(&mut c.ipl, level);
                    (irq, level, saved)
                };
                let _ = level;
                let costs = self.costs();
                let bus = Self::bus_penalty(&mut self.w(), &costs);
                self.sleep_for(cpu, Cycles(costs.ipi_dispatch_cycles) + bus)
                    .await;
                match irq {
                    Irq::Shootdown => {
                        self.count("interrupts.shootdown", 1);
                        let p = self.protocol();
                        p.interrupt(self, cpu).await;
                    }
                    Irq::Clock => {
                        // The tick's handler, masked as a user-mode tick's
                        // is (`Entry::DisabledWindow`): at the kernel's
                        // section level, and preempted only by what that
                        // level lets through.
                        let len = {
                            let mut w = self.w();
                            let len = std::mem::take(&mut w.cpus[cpu.index()].clock_len);
                            let section = w.cfg.kernel.disabled_ipl;
                            let c = &mut w.cpus[cpu.index()];
                            c.ipl = c.ipl.max(section);
                            len
                        };
                        debug_assert!(len > 0, "a clock interrupt without its tick");
                        self.count("interrupts.clock", 1);
                        self.preemptible_delay(cpu, Cycles(len)).await;
                    }
                    Irq::Reschedule => {}
                }
                self.sleep_for(cpu, Cycles(costs.ipi_return_cycles)).await;
                self.set_ipl(cpu, saved);
            }
        })
    }

    /// Ends the run because a resource the spec sizes ran out (physical
    /// frames: `machine.memory_mb`; kernel virtual space:
    /// `kernel.segkmem_pages`). The thread that needed it can never go on,
    /// so this is reported the way the watchdog reports a spin past its
    /// bound, naming what ran out and the key; the coroutine never resumes.
    /// (It used to be a panic, `out of memory: 131072 frames`.)
    pub async fn exhausted<T>(&self, cpu: CpuId, what: String) -> T {
        {
            let mut w = self.w();
            let at = w.now();
            w.liveness.get_or_insert(Liveness {
                cpu,
                waiting_for: what,
                since: at,
                at,
            });
            w.stop = true;
        }
        std::future::pending::<T>().await
    }

    /// A free physical frame, or the run ends (see [`Sim::exhausted`]).
    pub async fn alloc_data_or_stop(&self, cpu: CpuId) -> Pfn {
        let got = self.w().mem.alloc_data();
        match got {
            Ok(pfn) => pfn,
            Err(e) => self.exhausted(cpu, out_of_frames(e.frames)).await,
        }
    }

    async fn sleep_for(&self, cpu: CpuId, c: Cycles) {
        let at = self.now() + c;
        self.sleep_until(cpu, at).await;
    }

    /// Spins (one shared read per iteration) until `cond` holds. A spin past
    /// the configured bound is a liveness failure: the run stops and the
    /// watchdog reports who waited for what.
    ///
    /// The condition reads kernel and protocol state, which only kernel
    /// coroutines change, and they run only when an event fires. So instead
    /// of one event per iteration, the spinner sleeps to the first
    /// iteration boundary at or after the next queued event: the same
    /// iteration times, counts and interrupt points, far fewer events.
    pub async fn spin_until(&self, cpu: CpuId, what: &str, cond: impl Fn(&World) -> bool) {
        self.spin_until_watching(cpu, what, Watch::Any, cond).await
    }

    /// [`Sim::spin_until`] for a condition that reads nothing but `watch`
    /// (a lock, a pmap's lock, or state a protocol names with
    /// [`Sim::new_watch`] and [`Sim::touch`]es whenever it changes it): its
    /// wake-ups re-check it only after `watch` was touched, and while
    /// nothing it reads changes the spinner costs no work at all. Every
    /// iteration time, count and result is that of `spin_until`.
    pub async fn spin_until_watching(
        &self,
        cpu: CpuId,
        what: &str,
        watch: Watch,
        cond: impl Fn(&World) -> bool,
    ) {
        let (step, bound) = {
            let w = self.w();
            (w.cfg.costs.spin_iteration_cycles.max(1), w.cfg.spin_bound)
        };
        let since = self.now();
        loop {
            if cond(&self.w()) {
                break;
            }
            // The next kernel event is the first time the condition can
            // change (user slices never change kernel state; kernel work a
            // slice starts re-arms this spinner in `spawn`).
            let wake = spin_next_wake(&self.w(), since, step, bound);
            let Some(wake) = wake else {
                {
                    let mut w = self.w();
                    let at = w.now();
                    w.liveness.get_or_insert(Liveness {
                        cpu,
                        waiting_for: what.to_string(),
                        since,
                        at,
                    });
                    w.stop = true;
                }
                std::future::pending::<()>().await;
                return;
            };
            {
                let mut w = self.w();
                w.spinning += 1;
                w.spinners[cpu.index()] = Some(Spinner {
                    since,
                    step,
                    bound_at: since + Cycles((bound + 1) * step),
                    watch,
                    dirty: false,
                    run: u32::MAX,
                });
                w.watch_list(cpu, watch);
            }
            {
                let c: &(dyn Fn(&World) -> bool + '_) = &cond;
                // SAFETY: only the lifetime is erased. `cond` lives in this
                // future, which is boxed and pinned in its CPU's root while
                // it sleeps below; the entry is cleared as soon as the
                // sleep returns, before `cond` can move or drop, and the
                // event loop reads it only while the sleep is pending (and
                // `run` clears them all before the roots are dropped).
                let c: *const (dyn Fn(&World) -> bool + 'static) =
                    unsafe { std::mem::transmute(c as *const (dyn Fn(&World) -> bool + '_)) };
                self.0.spin_conds.borrow_mut()[cpu.index()] = Some(SpinCond { cond: c, bound });
            }
            self.spin_sleep_until(cpu, wake).await;
            self.0.spin_conds.borrow_mut()[cpu.index()] = None;
            {
                let mut w = self.w();
                w.spinners[cpu.index()] = None;
                w.spinning -= 1;
            }
            if self.w().cpus[cpu.index()].takeable().is_some() {
                // The handler changes kernel state outside any event the
                // other spinners foresaw (spinner wake-ups are not kernel
                // events): they re-check at their next iteration.
                {
                    let mut w = self.w();
                    let now = w.now();
                    w.rearm_spinners(now);
                }
                self.take_interrupts(cpu).await;
            }
        }
        // A spinner that stops spinning goes on to change kernel state
        // without a kernel event the others could have foreseen: they
        // re-check at their next iteration, as if they had polled.
        {
            let mut w = self.w();
            let now = w.now();
            w.rearm_spinners(now);
        }
        let n = (self.now() - since).0 / step;
        if n > 0 {
            self.count("spin.iterations", n);
        }
    }

    /// Acquires a pmap's spin lock.
    pub async fn lock_pmap(&self, cpu: CpuId, pmap: PmapId) {
        self.lock_pmap_raising(cpu, pmap, None).await;
    }

    /// `lock_pmap`, waiting at the current level (taking interrupts, so
    /// that a waiter never blocks a shootdown its lock's holder waits for)
    /// and raising the level to `ipl` the moment the lock is taken (black89
    /// §4: a lock is held at its interrupt level or higher). Returns the
    /// level to restore after the unlock.
    pub async fn lock_pmap_at(&self, cpu: CpuId, pmap: PmapId, ipl: Ipl) -> Ipl {
        self.lock_pmap_raising(cpu, pmap, Some(ipl))
            .await
            .expect("a level was given")
    }

    async fn lock_pmap_raising(&self, cpu: CpuId, pmap: PmapId, ipl: Option<Ipl>) -> Option<Ipl> {
        let costs = self.costs();
        let order = self.lock_enter(cpu, crate::lockorder::LockRef::Pmap(pmap));
        let saved;
        loop {
            {
                let mut w = self.w();
                let p = &mut w.pmaps[pmap.0 as usize];
                assert_ne!(p.lock, Some(cpu), "{cpu} relocks pmap {}", pmap.0);
                if p.lock.is_none() {
                    p.lock = Some(cpu);
                    w.touch(Watch::Pmap(pmap));
                    let c = &mut w.cpus[cpu.index()];
                    saved = ipl.map(|l| {
                        let old = c.ipl;
                        c.ipl = old.max(l);
                        old
                    });
                    break;
                }
            }
            self.spin_until_watching(
                cpu,
                &format!("pmap {} lock", pmap.0),
                Watch::Pmap(pmap),
                |w| w.pmaps[pmap.0 as usize].lock.is_none(),
            )
            .await;
        }
        self.lock_acquired(cpu, crate::lockorder::LockRef::Pmap(pmap), order);
        self.delay(cpu, Cycles(costs.lock_cycles)).await;
        saved
    }

    /// Tries a pmap's spin lock once, without waiting: true when taken.
    /// Exempt from the lock order (a try-lock cannot deadlock; see
    /// `lockorder`). Costs one lock attempt either way.
    pub async fn try_lock_pmap(&self, cpu: CpuId, pmap: PmapId) -> bool {
        let costs = self.costs();
        let order = self.try_lock_enter(cpu, crate::lockorder::LockRef::Pmap(pmap));
        let taken = {
            let mut w = self.w();
            let p = &mut w.pmaps[pmap.0 as usize];
            assert_ne!(p.lock, Some(cpu), "{cpu} relocks pmap {}", pmap.0);
            if p.lock.is_none() {
                p.lock = Some(cpu);
                w.touch(Watch::Pmap(pmap));
                true
            } else {
                false
            }
        };
        if taken {
            self.lock_acquired(cpu, crate::lockorder::LockRef::Pmap(pmap), order);
        }
        self.delay(cpu, Cycles(costs.lock_cycles)).await;
        taken
    }

    pub async fn unlock_pmap(&self, cpu: CpuId, pmap: PmapId) {
        let c = self.costs().unlock_cycles;
        {
            let mut w = self.w();
            let p = &mut w.pmaps[pmap.0 as usize];
            assert_eq!(
                p.lock,
                Some(cpu),
                "{cpu} unlocks pmap {} it does not hold",
                pmap.0
            );
            p.lock = None;
            w.touch(Watch::Pmap(pmap));
        }
        self.lock_released(cpu, crate::lockorder::LockRef::Pmap(pmap));
        self.delay(cpu, Cycles(c)).await;
    }

    /// A key for state a protocol's spin conditions read (see
    /// [`Sim::spin_until_watching`]).
    pub fn new_watch(&self) -> Watch {
        let mut w = self.w();
        w.next_watch += 1;
        Watch::Key(w.next_watch - 1)
    }

    /// The state `watch` names changed (call it before the next await).
    pub fn touch(&self, watch: Watch) {
        self.w().touch(watch);
    }

    /// Allocates a named spin lock for a protocol.
    pub fn new_lock(&self) -> usize {
        let mut w = self.w();
        w.locks.push(None);
        w.locks.len() - 1
    }

    pub async fn lock(&self, cpu: CpuId, lock: usize) {
        let order = self.lock_enter(cpu, crate::lockorder::LockRef::Named(lock));
        loop {
            {
                let mut w = self.w();
                if w.locks[lock].is_none() {
                    w.locks[lock] = Some(cpu);
                    w.touch(Watch::Lock(lock));
                    break;
                }
            }
            self.spin_until_watching(cpu, &format!("lock {lock}"), Watch::Lock(lock), |w| {
                w.locks[lock].is_none()
            })
            .await;
        }
        self.lock_acquired(cpu, crate::lockorder::LockRef::Named(lock), order);
        let c = self.costs().lock_cycles;
        self.delay(cpu, Cycles(c)).await;
    }

    /// Tries a named spin lock once, without waiting: true when taken.
    /// Exempt from the lock order like [`Sim::try_lock_pmap`]. Costs one
    /// lock attempt either way.
    pub async fn try_lock(&self, cpu: CpuId, lock: usize) -> bool {
        let order = self.try_lock_enter(cpu, crate::lockorder::LockRef::Named(lock));
        let taken = {
            let mut w = self.w();
            assert_ne!(w.locks[lock], Some(cpu), "{cpu} relocks lock {lock}");
            if w.locks[lock].is_none() {
                w.locks[lock] = Some(cpu);
                w.touch(Watch::Lock(lock));
                true
            } else {
                false
            }
        };
        if taken {
            self.lock_acquired(cpu, crate::lockorder::LockRef::Named(lock), order);
        }
        let c = self.costs().lock_cycles;
        self.delay(cpu, Cycles(c)).await;
        taken
    }

    pub async fn unlock(&self, cpu: CpuId, lock: usize) {
        {
            let mut w = self.w();
            assert_eq!(
                w.locks[lock],
                Some(cpu),
                "{cpu} unlocks lock {lock} it does not hold"
            );
            w.locks[lock] = None;
            w.touch(Watch::Lock(lock));
        }
        self.lock_released(cpu, crate::lockorder::LockRef::Named(lock));
        let c = self.costs().unlock_cycles;
        self.delay(cpu, Cycles(c)).await;
    }

    /// Posts an interprocessor interrupt: the sender pays the send cost, the
    /// interrupt arrives after the delivery latency.
    pub async fn send_ipi(&self, cpu: CpuId, target: CpuId, irq: Irq) {
        let costs = self.costs();
        self.delay(cpu, Cycles(costs.ipi_send_cycles)).await;
        self.post_ipi(cpu, target, irq, &costs);
    }

    /// Linux's `send_IPI_mask`: in flat APIC mode (a machine of at most
    /// `kernel.apic_flat_max_cpus` CPUs) one ICR write reaches every
    /// target; otherwise (bigsmp) one `send_ipi` per target, in order.
    pub async fn send_ipi_mask(&self, cpu: CpuId, targets: &[CpuId], irq: Irq) {
        let flat = {
            let w = self.w();
            w.cpus.len() as u64 <= w.cfg.kernel.apic_flat_max_cpus
        };
        if !flat {
            for &t in targets {
                self.send_ipi(cpu, t, irq).await;
            }
            return;
        }
        self.send_ipi_multicast(cpu, targets, irq).await;
        self.count("ipi.flat_sends", 1);
    }

    /// One send that reaches every CPU of `targets` (a multicast or
    /// broadcast interrupt, black89 §9; Linux's flat APIC mode): the sender
    /// pays one send, and each interrupt arrives after its own delivery
    /// latency, drawn in `targets`' order.
    pub async fn send_ipi_multicast(&self, cpu: CpuId, targets: &[CpuId], irq: Irq) {
        let costs = self.costs();
        self.delay(cpu, Cycles(costs.ipi_send_cycles)).await;
        for &t in targets {
            self.post_ipi(cpu, t, irq, &costs);
        }
    }

    /// Queues `irq`'s arrival at `target`, sent now by `cpu`.
    fn post_ipi(&self, cpu: CpuId, target: CpuId, irq: Irq, costs: &Costs) {
        let mut w = self.w();
        let jitter = if costs.ipi_jitter_cycles > 0 {
            w.cpus[cpu.index()].rng.below(costs.ipi_jitter_cycles + 1)
        } else {
            0
        };
        let at =
            w.now() + Cycles(costs.ipi_latency_cycles + jitter) + Self::bus_penalty(&mut w, costs);
        w.queue.push(at, Event::Irq { cpu: target, irq });
        w.counters.add("ipi.sent", 1);
    }

    /// Shared-bus contention (black89 §7.1: on the Multimax "these effects
    /// become significant ... when 12 or more processors are actively using
    /// the bus"; the interrupt's state save and the responders' accesses to
    /// shootdown state miss in cache). CPUs running user code in a tight
    /// loop on write-through caches use the bus on every store; once
    /// `bus_free_users` or more do, each further one adds
    /// `bus_contention_cycles` on average to every interrupt delivery and
    /// dispatch. The wait is drawn uniformly from 0 to twice that mean
    /// (from the kernel's random stream): each cache miss of the state save
    /// waits for however many bus users happen to be ahead of it, so the
    /// spread of a shootdown's time grows with the contention (black89
    /// §7.1: beyond 12 processors "the standard deviation doubles").
    /// Off (0) unless a spec turns it on; no draw is made then.
    pub fn bus_penalty(w: &mut World, costs: &Costs) -> Cycles {
        if costs.bus_contention_cycles == 0 {
            return Cycles(0);
        }
        let users = w.cpus.iter().filter(|c| c.mode == Mode::User).count() as u64;
        let over = (users + 1).saturating_sub(costs.bus_free_users);
        if over == 0 {
            return Cycles(0);
        }
        let mean = over * costs.bus_contention_cycles;
        Cycles(w.rng.below(2 * mean + 1))
    }

    /// Posts an interrupt without a sender (device, or the scheduler).
    pub(crate) fn post_irq(&self, target: CpuId, irq: Irq, after: Cycles) {
        let mut w = self.w();
        let at = w.now() + after;
        w.queue.push(at, Event::Irq { cpu: target, irq });
    }

    /// The idle loop's wait for its next poll: `idle_wait`, during whose
    /// sleep a poll that would find nothing is done by the event loop
    /// (`Sim::idle_recheck`).
    pub(crate) async fn idle_poll(&self, cpu: CpuId, c: Cycles) {
        {
            let mut w = self.w();
            w.cpus[cpu.index()].idle_waiting = true;
            w.idle_polls[cpu.index()] = Some(c);
        }
        let at = self.now() + c;
        self.sleep_until(cpu, at).await;
        {
            let mut w = self.w();
            w.cpus[cpu.index()].idle_waiting = false;
            w.idle_polls[cpu.index()] = None;
        }
        if self.w().cpus[cpu.index()].takeable().is_some() {
            self.take_interrupts(cpu).await;
        }
    }

    /// The idle loop's wait: cut short by any interrupt.
    pub(crate) async fn idle_wait(&self, cpu: CpuId, c: Cycles) {
        self.w().cpus[cpu.index()].idle_waiting = true;
        let at = self.now() + c;
        self.sleep_until(cpu, at).await;
        self.w().cpus[cpu.index()].idle_waiting = false;
        if self.w().cpus[cpu.index()].takeable().is_some() {
            self.take_interrupts(cpu).await;
        }
    }

    // ----- operations (for the oracle) ----------------------------------

    /// Starts a VM operation on `cpu`; PTE changes are attributed to it.
    pub fn begin_op(&self, cpu: CpuId, what: &str) -> OpId {
        let mut w = self.w();
        let now = w.now();
        assert!(
            w.cpus[cpu.index()].op.is_none(),
            "{cpu} starts {what} inside another operation"
        );
        let op = w.oracle.begin_op(what, cpu, now);
        w.cpus[cpu.index()].op = Some(op);
        op
    }

    /// Ends the operation: complete now, unless a lazy scheme deferred it.
    pub fn end_op(&self, cpu: CpuId) {
        let mut w = self.w();
        let now = w.now();
        let op = w.cpus[cpu.index()]
            .op
            .take()
            .expect("end_op without begin_op");
        if !w.oracle.op(op).lazy {
            w.oracle.complete(op, now);
        }
    }

    /// A lazy scheme takes over the completion of `cpu`'s current
    /// operation; it calls [`Sim::complete_op`] when it is done.
    pub fn defer_completion(&self, cpu: CpuId) -> OpId {
        let mut w = self.w();
        let op = w.cpus[cpu.index()].op.expect("no operation to defer");
        w.oracle.set_lazy(op);
        op
    }

    pub fn complete_op(&self, op: OpId) {
        let mut w = self.w();
        let now = w.now();
        w.oracle.complete(op, now);
    }
}
