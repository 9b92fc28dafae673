//! The event loop and the executor: kernel coroutines (one per CPU, polled
//! only when that CPU's `Resume` event fires), interrupt arrival and the
//! interrupt-disabled windows. Moved out of `sim.rs` unchanged.

use super::*;

/// A future that is pending once: it arms its CPU's resume event and is
/// ready when that event fires.
pub(super) struct Wake {
    pub(super) armed: bool,
}
impl Future for Wake {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.armed {
            Poll::Ready(())
        } else {
            self.armed = true;
            Poll::Pending
        }
    }
}

impl Sim {
    // ----- the executor -------------------------------------------------

    /// Starts a kernel coroutine on `cpu` at time `at`.
    pub(crate) fn spawn(&self, cpu: CpuId, at: Cycles, fut: KFuture<'static>) {
        let mut roots = self.0.roots.borrow_mut();
        assert!(
            roots[cpu.index()].is_none(),
            "{cpu} already runs a kernel coroutine"
        );
        roots[cpu.index()] = Some(fut);
        drop(roots);
        let mut w = self.w();
        let c = &mut w.cpus[cpu.index()];
        c.mode = Mode::Kernel;
        c.resume_gen += 1;
        let generation = c.resume_gen;
        w.queue.push(at, Event::Resume { cpu, generation });
        // New kernel work from user mode (a trap or an interrupt taken on
        // the hot path) is the one kind of kernel event a spinner could not
        // foresee: wake any spinner sleeping past it at the first iteration
        // boundary after it, as if it had polled all along.
        w.rearm_spinners(at);
    }

    fn poll_cpu(&self, cpu: CpuId) {
        let fut = self.0.roots.borrow_mut()[cpu.index()].take();
        let Some(mut fut) = fut else { return };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if fut.as_mut().poll(&mut cx).is_pending() {
            self.0.roots.borrow_mut()[cpu.index()] = Some(fut);
        }
    }

    /// Spinners' wake-ups at `now`, done without polling their coroutines
    /// while they change nothing: for each wake-up in queue order (a run's
    /// rest left at `now` first, then the queue's entries at `now`), a
    /// stale one (its CPU's resume generation moved on) is dropped, and a
    /// spinner with no interrupt to take, its condition still false and its
    /// bound not passed does what its coroutine would (sleep to its next
    /// wake-up: the same state changes, the same wake-up). The coroutine
    /// stays suspended where it was; `spin_until`'s loop keeps no state
    /// between iterations, so when it is next polled it goes on as if it
    /// had made these iterations itself.
    ///
    /// A spinner whose condition watches named state that has not been
    /// touched since its last check (`Watch`) is not re-checked: the
    /// condition reads nothing else, so it is still false. A clean run
    /// (every member such a spinner, none with an interrupt arrived or its
    /// bound reached) moves to its next wake-up whole, without visiting
    /// its members: they share their iteration boundaries (all wake at
    /// `now`, iterations of one length), so each would sleep to the same
    /// first boundary at or after the next kernel event.
    ///
    /// Nothing here pushes a kernel event or changes what a condition or
    /// the next wake-up reads, so the wake-ups are pushed in the order the
    /// entries were taken, the consecutive ones at one time as one run.
    /// The first spinner that must be polled ends the drain: the pending
    /// run is pushed, the rest of the current one is kept at the front
    /// (`spin_front`, before anything pushed later), and its CPU is
    /// returned for the caller to poll, as the event loop polled it when
    /// each wake-up was an event of its own.
    fn spin_drain(&self) -> Option<CpuId> {
        let conds = self.0.spin_conds.borrow();
        let mut guard = self.w();
        let w = &mut *guard;
        let now = w.now;
        // The run being gathered (not queued yet) and its wake-up.
        let mut out: Option<(u32, Cycles)> = None;
        let mut poll = None;
        'entries: loop {
            let (id, mut pos) = if let Some(front) = w.spin_front.take() {
                front
            } else if w.spin_wakes.peek_time() == Some(now) && w.queue.peek_time() != Some(now) {
                (w.spin_wakes.pop().expect("peeked").1, 0)
            } else {
                break;
            };
            let run = &w.spin_runs[id as usize];
            if pos == 0
                && run.clean
                && now < run.min_bound
                && let Some(t) = w.queue.peek_time()
            {
                #[cfg(debug_assertions)]
                for &(cpu, generation) in &run.members {
                    if w.cpus[cpu.index()].resume_gen == generation
                        && let Some(sc) = conds[cpu.index()]
                    {
                        // SAFETY: as below.
                        let cond = unsafe { &*sc.cond };
                        debug_assert!(!cond(w), "{cpu}'s watched condition changed untouched");
                        debug_assert!(w.cpus[cpu.index()].takeable().is_none());
                    }
                }
                let step = run.step;
                let target = if t > now { t } else { now + Cycles(1) };
                let wake = now + Cycles((target - now).0.div_ceil(step) * step);
                match out {
                    Some((o, at)) if at == wake => out = Some((w.spin_merge(o, id), at)),
                    _ => {
                        if let Some((o, at)) = out {
                            w.spin_queue(o, at);
                        }
                        out = Some((id, wake));
                    }
                }
                continue;
            }
            while pos < w.spin_runs[id as usize].members.len() {
                let (cpu, generation) = w.spin_runs[id as usize].members[pos];
                pos += 1;
                let i = cpu.index();
                if w.cpus[i].resume_gen != generation {
                    continue;
                }
                let next = match (conds[i], w.spinners[i]) {
                    (Some(sc), Some(sp)) if w.cpus[i].takeable().is_none() => {
                        let unchanged = sp.watch != Watch::Any && !sp.dirty && now < sp.bound_at;
                        // SAFETY: set while the coroutine sleeps in
                        // `spin_until`, which holds the closure pinned (see
                        // there); it is asleep now, or its resume
                        // generation would not have matched.
                        let cond = unsafe { &*sc.cond };
                        if unchanged {
                            debug_assert!(!cond(w), "{cpu}'s watched condition changed untouched");
                        }
                        if !unchanged && cond(w) {
                            None
                        } else {
                            super::primitives::spin_next_wake(w, sp.since, sp.step, sc.bound)
                                .map(|wake| (wake, sp.watch))
                        }
                    }
                    _ => None,
                };
                let Some((wake, watch)) = next else {
                    if pos < w.spin_runs[id as usize].members.len() {
                        w.spin_front = Some((id, pos));
                    } else {
                        w.spin_recycle(id);
                    }
                    poll = Some(cpu);
                    break 'entries;
                };
                // Checked (or known) false: clean until `watch` changes.
                if let Some(sp) = &mut w.spinners[i] {
                    sp.dirty = false;
                }
                w.watch_list(cpu, watch);
                let c = &mut w.cpus[i];
                c.resume_gen += 1;
                let generation = c.resume_gen;
                let o = match out {
                    Some((o, at)) if at == wake => o,
                    _ => {
                        if let Some((o, at)) = out {
                            w.spin_queue(o, at);
                        }
                        let o = w.spin_new_run();
                        out = Some((o, wake));
                        o
                    }
                };
                w.spin_join(o, cpu, generation);
            }
            w.spin_recycle(id);
        }
        if let Some((o, at)) = out {
            w.spin_queue(o, at);
        }
        poll
    }

    /// An idle loop's poll that finds nothing, done without polling its
    /// coroutine: when `cpu` waits in the idle loop (`Sim::idle`) with no
    /// interrupt to take and no thread it may run, this does what the
    /// coroutine would (leave `idle_wait`, find nothing, wait again: its
    /// resume generation and the same push of its next poll; the waiting
    /// flag ends as it was) and returns true. The coroutine stays
    /// suspended in `idle_wait`, which keeps nothing between polls.
    /// Otherwise it changes nothing and returns false.
    fn idle_recheck(&self, cpu: CpuId) -> bool {
        let mut w = self.w();
        let Some(poll) = w.idle_polls[cpu.index()] else {
            return false;
        };
        // (`idle_waiting`: asleep in `idle_wait` itself, not in the
        // handler of an interrupt it took.)
        let c = &w.cpus[cpu.index()];
        if !c.idle_waiting || c.takeable().is_some() || w.stop || w.has_work(cpu) {
            return false;
        }
        let at = w.now + poll;
        let c = &mut w.cpus[cpu.index()];
        c.resume_gen += 1;
        let generation = c.resume_gen;
        // Every idle CPU polls the same period ahead: the queue's FIFO lane.
        w.queue.push_periodic(at, Event::Resume { cpu, generation });
        true
    }

    // ----- the event loop ------------------------------------------------

    /// Stops the run soon after `flag` is raised (it is read every 4,096
    /// events); the result says `interrupted`.
    pub fn set_interrupt(&self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        self.w().interrupt = Some(flag);
    }

    /// Runs until every thread has exited, a program ends the run, the
    /// watchdog fires or the time limit passes.
    pub fn run(&self) -> SimResult {
        let max = Cycles(self.w().cfg.max_cycles);
        self.start_windows();
        let mut polled = 0u32;
        loop {
            let ev = {
                let mut w = self.w();
                if w.stop {
                    break;
                }
                polled = polled.wrapping_add(1);
                if polled.is_multiple_of(4096)
                    && let Some(flag) = &w.interrupt
                    && flag.load(std::sync::atomic::Ordering::Relaxed)
                {
                    w.interrupted = true;
                    break;
                }
                // Kernel events, then spinners' wake-ups, then user slices
                // at the same cycle.
                let kernel = w.queue.peek_time();
                let spin = w.spin_peek();
                let slice = w.slices.peek_time();
                // (Plain `Option` minima: a flattened array iterator here
                // compiled to stack round trips on every event.)
                let Some(next) = earliest(earliest(kernel, spin), slice) else {
                    break;
                };
                if next > max {
                    w.timed_out = true;
                    break;
                }
                w.now = next;
                if kernel == Some(next) {
                    w.queue.pop().expect("peeked")
                } else if spin == Some(next) {
                    drop(w);
                    if let Some(cpu) = self.spin_drain() {
                        self.poll_cpu(cpu);
                    }
                    continue;
                } else {
                    let (t, (cpu, generation)) = w.slices.pop().expect("peeked");
                    (t, Event::UserSlice { cpu, generation })
                }
            };
            match ev.1 {
                Event::Resume { cpu, generation } => {
                    if self.w().cpus[cpu.index()].resume_gen == generation
                        && !self.idle_recheck(cpu)
                    {
                        self.poll_cpu(cpu);
                    }
                }
                Event::UserSlice { cpu, generation } => {
                    self.user_slices(cpu, generation, ev.0, max);
                }
                Event::Irq { cpu, irq } => self.irq_arrive(cpu, irq, ev.0),
                Event::WakeThread(t) => self.make_runnable(t),
                Event::DisabledWindow(cpu) => self.disabled_window(cpu, ev.0),
            }
        }
        // The conditions point into the roots, dropped below.
        self.0.spin_conds.borrow_mut().fill(None);
        self.w().spin_front = None;
        let w = self.w();
        let mut oracle = w.oracle.report();
        let result = SimResult {
            counters: {
                let mut c = w.counters.clone();
                if let Some(ms) = &w.memsys {
                    crate::memory::report(ms, &mut c, &mut oracle);
                }
                c.add("refs", w.refs);
                c.add("wild_accesses", w.wild_accesses);
                let (h, m) = w
                    .cpus
                    .iter()
                    .fold((0, 0), |(h, m), c| (h + c.tlb.hits, m + c.tlb.misses));
                c.add("tlb.hits", h);
                c.add("tlb.misses", m);
                // Only machines with an I-TLB report it (flat runs' counters
                // stay as they were).
                if w.has_itlb() {
                    let (h, m) = w
                        .cpus
                        .iter()
                        .filter_map(|c| c.itlb.as_ref())
                        .fold((0, 0), |(h, m), t| (h + t.hits, m + t.misses));
                    c.add("tlb.itlb_hits", h);
                    c.add("tlb.itlb_misses", m);
                }
                c
            },
            hists: w.hists.clone(),
            oracle,
            liveness: w.liveness.clone(),
            end: w.now(),
            refs: w.refs,
            events: w.queue.scheduled() + w.spin_wakes.scheduled() + w.slices.scheduled(),
            timed_out: w.timed_out,
            interrupted: w.interrupted,
        };
        drop(w);
        // Coroutines still suspended (idle loops, parked CPUs) hold clones
        // of this handle: drop them, or the world (caches included) leaks
        // through the cycle, run after run.
        let roots: Vec<_> = self
            .0
            .roots
            .borrow_mut()
            .iter_mut()
            .map(Option::take)
            .collect();
        drop(roots);
        result
    }

    fn irq_arrive(&self, cpu: CpuId, irq: Irq, t: Cycles) {
        let mut w = self.w();
        let c = &mut w.cpus[cpu.index()];
        if !c.online {
            return;
        }
        c.pending |= irq.bit();
        // A spinner with an interrupt to take is re-checked at its next
        // wake-up.
        if let Some(sp) = w.spinners[cpu.index()] {
            w.spin_runs[sp.run as usize].clean = false;
        }
        let c = &mut w.cpus[cpu.index()];
        match c.mode {
            Mode::User => {
                if c.takeable().is_some() {
                    // Leave the hot path: cancel the pending slice and take
                    // the interrupt at this CPU's own time.
                    c.slice_gen += 1;
                    // A computation run ahead in one stretch is cut at
                    // the arrival: the clock goes back, the rest is still
                    // to compute.
                    let (local, thread) = (c.local, c.thread);
                    if let Some(tid) = thread
                        && let Some(from) = w.threads[tid.0 as usize].compute_stretch_from
                        && t < local
                    {
                        let back = local - from.max(t);
                        w.threads[tid.0 as usize].compute_left += back.0;
                        w.threads[tid.0 as usize].compute_stretch_from = None;
                        w.cpus[cpu.index()].local = local - back;
                    }
                    let at = w.cpus[cpu.index()].local.max(t);
                    drop(w);
                    let sim = self.clone();
                    self.spawn(
                        cpu,
                        at,
                        Box::pin(async move {
                            sim.kernel_entry(cpu, crate::sched::Entry::Interrupt).await
                        }),
                    );
                }
            }
            Mode::Kernel => {
                if c.idle_waiting && c.takeable().is_some() {
                    c.idle_waiting = false;
                    c.resume_gen += 1;
                    let generation = c.resume_gen;
                    w.queue.push(t, Event::Resume { cpu, generation });
                }
            }
            Mode::Offline => {}
        }
    }

    fn start_windows(&self) {
        let mut w = self.w();
        let Some(dw) = w.cfg.disabled_windows.clone() else {
            return;
        };
        for i in 0..w.cpus.len() {
            let gap = w.cpus[i].rng.exponential(dw.mean_interval_cycles as f64) as u64;
            w.queue
                .push(Cycles(gap), Event::DisabledWindow(CpuId(i as u16)));
        }
    }

    fn disabled_window(&self, cpu: CpuId, t: Cycles) {
        let mut w = self.w();
        let dw = w.cfg.disabled_windows.clone().expect("windows configured");
        let c = &mut w.cpus[cpu.index()];
        let len = c.rng.exponential(dw.mean_length_cycles as f64) as u64;
        let gap = c.rng.exponential(dw.mean_interval_cycles as f64) as u64;
        let user = c.mode == Mode::User && c.online;
        let at = c.local.max(t);
        if user {
            c.slice_gen += 1;
        }
        // A CPU in the kernel gets the tick too, as an interrupt taken
        // where its level next lets it through (it used to be skipped: the
        // ticks reached user-mode CPUs only). An idle CPU's tick is not
        // simulated: its only effect would be to hold the CPU in the idle
        // loop for the rest of the handler, and at 1,024 CPUs these ticks
        // were most of the run's events (docs/papers/black89.md).
        let kernel = c.mode == Mode::Kernel && c.online;
        let (idle, in_kernel) = (kernel && c.idle, kernel && !c.idle);
        let tick = in_kernel && c.clock_len == 0;
        if tick {
            c.clock_len = len.max(1);
        }
        w.queue
            .push(t + Cycles(len + gap), Event::DisabledWindow(cpu));
        if tick {
            w.queue.push(
                t,
                Event::Irq {
                    cpu,
                    irq: Irq::Clock,
                },
            );
            w.counters.add("kernel.clock_ticks_in_kernel", 1);
        } else if in_kernel {
            // the last tick's handler has not run yet
            w.counters.add("kernel.clock_ticks_merged", 1);
        } else if idle {
            w.counters.add("kernel.clock_ticks_idle_skipped", 1);
        }
        if user {
            w.counters.add("kernel.disabled_windows", 1);
            drop(w);
            let sim = self.clone();
            self.spawn(
                cpu,
                at,
                Box::pin(async move {
                    sim.kernel_entry(cpu, crate::sched::Entry::DisabledWindow(Cycles(len)))
                        .await
                }),
            );
        }
    }
}

/// The earlier of two optional times.
#[inline]
fn earliest(a: Option<Cycles>, b: Option<Cycles>) -> Option<Cycles> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}
