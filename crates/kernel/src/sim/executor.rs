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
        let mut out: Vec<(CpuId, u64)> = Vec::new();
        let mut out_at = Cycles::ZERO;
        let mut poll = None;
        'entries: loop {
            let (members, mut pos) = if let Some(front) = w.spin_front.take() {
                front
            } else if w.spin_wakes.peek_time() == Some(now) && w.queue.peek_time() != Some(now) {
                match w.spin_wakes.pop().expect("peeked").1 {
                    SpinWake::One(cpu, generation) => {
                        let mut v = w.spin_pool.pop().unwrap_or_default();
                        v.push((cpu, generation));
                        (v, 0)
                    }
                    SpinWake::Run(v) => (v, 0),
                }
            } else {
                break;
            };
            while pos < members.len() {
                let (cpu, generation) = members[pos];
                pos += 1;
                let i = cpu.index();
                if w.cpus[i].resume_gen != generation {
                    continue;
                }
                let wake = match (conds[i], w.spinners[i]) {
                    (Some(sc), Some((_, since, step))) if w.cpus[i].takeable().is_none() => {
                        // SAFETY: set while the coroutine sleeps in
                        // `spin_until`, which holds the closure pinned (see
                        // there); it is asleep now, or its resume
                        // generation would not have matched.
                        let cond = unsafe { &*sc.cond };
                        if cond(w) {
                            None
                        } else {
                            super::primitives::spin_next_wake(w, since, step, sc.bound)
                                .map(|wake| (wake, since, step))
                        }
                    }
                    _ => None,
                };
                let Some((wake, since, step)) = wake else {
                    if pos < members.len() {
                        w.spin_front = Some((members, pos));
                    } else {
                        Self::spin_recycle(w, members);
                    }
                    poll = Some(cpu);
                    break 'entries;
                };
                w.spinners[i] = Some((wake, since, step));
                let c = &mut w.cpus[i];
                c.resume_gen += 1;
                let generation = c.resume_gen;
                if !out.is_empty() && out_at != wake {
                    Self::spin_push(w, out_at, std::mem::take(&mut out));
                }
                if out.is_empty() {
                    out = w.spin_pool.pop().unwrap_or_default();
                    out_at = wake;
                }
                out.push((cpu, generation));
            }
            Self::spin_recycle(w, members);
        }
        if !out.is_empty() {
            Self::spin_push(w, out_at, out);
        }
        poll
    }

    /// Pushes a run of wake-ups at `at` (one alone as such).
    fn spin_push(w: &mut World, at: Cycles, mut run: Vec<(CpuId, u64)>) {
        if let [(cpu, generation)] = run[..] {
            run.clear();
            w.spin_pool.push(run);
            w.spin_wakes.push(at, SpinWake::One(cpu, generation));
        } else {
            w.spin_wakes.push(at, SpinWake::Run(run));
        }
    }

    fn spin_recycle(w: &mut World, mut run: Vec<(CpuId, u64)>) {
        run.clear();
        w.spin_pool.push(run);
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
                    if self.w().cpus[cpu.index()].resume_gen == generation {
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
        w.queue
            .push(t + Cycles(len + gap), Event::DisabledWindow(cpu));
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
