//! The user-mode hot path: user slices, batches of references, the TLB
//! lookup, the page walk and fill, and the oracle's check of every
//! translation use. Speed work on the simulator happens here. Moved out of
//! `sim.rs` unchanged.

use super::*;
use mmulab_machine::physmem::DataFrame;

impl Sim {
    /// Schedules the next user slice of `cpu` at `at`.
    pub(crate) fn resume_user(&self, cpu: CpuId, at: Cycles) {
        let mut w = self.w();
        let c = &mut w.cpus[cpu.index()];
        c.mode = Mode::User;
        c.fetch_due = true;
        c.slice_gen += 1;
        c.local = at;
        let generation = c.slice_gen;
        w.slices.push(at, (cpu, generation));
    }

    // ----- the hot path --------------------------------------------------

    /// Runs the user slice `(cpu, generation)` popped at `t`, then, under
    /// the same borrow of the world, every following event for as long as
    /// it is a user slice, picked as the main loop would pick it: kernel
    /// events and spinners' wake-ups win ties, nothing runs after a stop
    /// or past `max`. Almost every simulated reference ends its slice, so
    /// this is the loop a run spends its time in.
    pub(super) fn user_slices(
        &self,
        mut cpu: CpuId,
        mut generation: u64,
        mut t: Cycles,
        max: Cycles,
    ) {
        let mut wb = self.w();
        loop {
            let w = &mut *wb;
            // Host-only hints for the slices to come (see prefetch_slice).
            if let Some(&(after, _)) = w.slices.peek_nth(1) {
                prefetch_cpu(w, after);
            }
            if let Some(&(next, _)) = w.slices.peek_nth(0) {
                prefetch_slice(w, next);
            }
            // A stale slice (cancelled by an interrupt or a window) is
            // dropped.
            if w.cpus[cpu.index()].slice_gen == generation
                && let Some(trap) = user_slice(w, cpu, t)
            {
                let ci = cpu.index();
                let tid = w.cpus[ci].thread.expect("user mode without a thread");
                let at = w.cpus[ci].local;
                w.cpus[ci].slice_gen += 1;
                w.threads[tid.0 as usize].trap = Some(trap);
                drop(wb);
                let sim = self.clone();
                self.spawn(
                    cpu,
                    at,
                    Box::pin(async move { sim.kernel_entry(cpu, crate::sched::Entry::Trap).await }),
                );
                return;
            }
            if w.stop {
                return;
            }
            let Some(next) = w.slices.peek_time() else {
                return;
            };
            if next > max
                || w.queue.peek_time().is_some_and(|k| k <= next)
                || w.spin_peek().is_some_and(|s| s <= next)
            {
                return;
            }
            w.now = next;
            (t, (cpu, generation)) = w.slices.pop().expect("peeked");
        }
    }
}

/// Host-only hints, given while other slices run, in two steps so that no
/// hint waits on a miss: two slices ahead, `prefetch_cpu` brings the CPU's
/// own fields closer; one slice ahead, `prefetch_slice` reads them and
/// brings closer what the slice reads first. The memory system's work since
/// a CPU's last slice has usually evicted all of it from the host's
/// caches. Neither has any effect on the simulation.
#[inline]
fn prefetch_cpu(w: &World, cpu: CpuId) {
    if let Some(c) = w.cpus.get(cpu.index()) {
        mmulab_machine::prefetch(&c.local);
        mmulab_machine::prefetch(&c.slice_gen);
        mmulab_machine::prefetch(&c.inflight);
        mmulab_machine::prefetch(&c.thread);
        mmulab_machine::prefetch(&c.pmap);
        mmulab_machine::prefetch(&c.fetch_due);
        c.tlb.prefetch_header();
    }
}

/// See `prefetch_cpu`: the access in flight's oracle entry and data,
/// the thread's batch, and the TLB set of the in-flight page
/// (where the batch's next reference usually is).
#[inline]
fn prefetch_slice(w: &World, cpu: CpuId) {
    let Some(c) = w.cpus.get(cpu.index()) else {
        return;
    };
    if let Some(f) = &c.inflight {
        w.oracle.prefetch(f.oracle_slot);
        // (its data word: the frame record is read to find it)
        w.mem.prefetch(f.pfn, (f.va & (PAGE_SIZE - 1)) & !7);
        c.tlb.prefetch(Vpn(f.va >> PAGE_SHIFT));
    }
    if let Some(th) = c.thread.and_then(|t| w.threads.get(t.0 as usize)) {
        mmulab_machine::prefetch(&th.batch);
        mmulab_machine::prefetch(&th.last_load);
    }
}

/// One user slice of `cpu` starting at `t`: the thread runs its
/// references and computations until the quantum ends (the next slice is
/// queued) or it traps (returned; the caller enters the kernel).
fn user_slice(w: &mut World, cpu: CpuId, t: Cycles) -> Option<Trap> {
    let ci = cpu.index();
    let quantum = w.cfg.quantum_cycles.max(1);
    let tid = w.cpus[ci].thread.expect("user mode without a thread");
    let local = w.cpus[ci].local.max(t);
    w.cpus[ci].local = local;
    w.cpus[ci].slice_start = local;
    // An access in flight from the last slice performs (or replays)
    // first (romanescu10 §5.1).
    retire_inflight(w, cpu);
    // Back from the kernel, the thread fetches its loop's code again
    // (I-TLB, L1I). The stall does not eat the quantum, like a
    // reference's that starts before the end.
    let mut fetch_fault = if std::mem::take(&mut w.cpus[ci].fetch_due) {
        fetch_instruction(w, cpu, tid)
    } else {
        None
    };
    let end = w.cpus[ci].local + Cycles(quantum);
    // Every interrupt before this slice has arrived: a stretch run ahead
    // in the last slice is past.
    w.threads[tid.0 as usize].compute_stretch_from = None;
    let trap = loop {
        if fetch_fault.is_some() {
            break fetch_fault.take();
        }
        let left = w.threads[tid.0 as usize].compute_left;
        if left > 0
            && w.threads[tid.0 as usize]
                .program
                .as_ref()
                .is_some_and(|p| p.long_computes())
        {
            // The whole computation in one stretch; the slice ends with
            // it, so that an interrupt arriving during it can rewind the
            // clock to its arrival (`irq_arrive`).
            let th = &mut w.threads[tid.0 as usize];
            th.compute_stretch_from = Some(w.cpus[ci].local);
            th.compute_left = 0;
            w.cpus[ci].local += Cycles(left);
            break None;
        }
        if left > 0 {
            let room = (end.0.saturating_sub(w.cpus[ci].local.0)).min(left);
            w.cpus[ci].local += Cycles(room);
            w.threads[tid.0 as usize].compute_left -= room;
            if w.threads[tid.0 as usize].compute_left > 0 {
                break None;
            }
        }
        let trapped = if w.memsys.is_some() {
            run_batch::<true>(w, cpu, tid, end)
        } else {
            run_batch::<false>(w, cpu, tid, end)
        };
        if let Some(t) = trapped {
            break Some(t);
        }
        if w.cpus[ci].local >= end {
            break None;
        }
        let th = &mut w.threads[tid.0 as usize];
        // (Borrowed in place, not taken out and put back every slice.)
        let program = th.program.as_mut().expect("thread without a program");
        let mut ctx = crate::program::ThreadCtx {
            thread: tid,
            cpu,
            now: w.cpus[ci].local,
            last_load: th.last_load,
            ret: th.ret,
            fault: th.fault.take(),
            rng: &mut th.rng,
            end_run: false,
        };
        let op = program.next(&mut ctx);
        if ctx.end_run {
            w.stop = true;
        }
        match op {
            Op::Refs(r) => {
                if r.count > 0 {
                    th.batch = Some(crate::program::Batch::new(r));
                }
            }
            // Computation is consumed slice by slice like references,
            // so an interrupt never waits for a whole computation.
            Op::Compute(c) => th.compute_left = c,
            other => break Some(Trap::Op(other)),
        }
        // A new loop: its code is fetched (a fault on the text page
        // traps; the loop runs after the fault is handled).
        fetch_fault = fetch_instruction(w, cpu, tid);
        if w.stop {
            break None;
        }
    };
    if trap.is_none() {
        let c = &mut w.cpus[ci];
        c.slice_gen += 1;
        let (at, generation) = (c.local, c.slice_gen);
        w.slices.push(at, (cpu, generation));
    }
    trap
}

/// Why a thread left user mode.
pub enum Trap {
    /// A page fault at `va` (store or load) that the TLB and walker could not
    /// satisfy.
    Fault { va: u64, store: bool },
    /// A system call, sleep or exit.
    Op(Op),
}

/// Runs the thread's current batch of references until it ends, the slice
/// ends or a reference traps. The batch lives in locals for the loop and is
/// written back once. `MEM`: a cache hierarchy is behind the references and
/// the walker (compiled separately so that flat runs pay nothing for it).
/// Each reference whose page differs from the last one's (or whose entry
/// the last reference's access invalidated) is translated the full way
/// here; it and the references after it on its page are run by `page_run`.
fn run_batch<const MEM: bool>(
    w: &mut World,
    cpu: CpuId,
    tid: ThreadId,
    end: Cycles,
) -> Option<Trap> {
    let ci = cpu.index();
    let mut b = w.threads[tid.0 as usize].batch?;
    let mut last_load = w.threads[tid.0 as usize].last_load;
    let mut trap = None;
    let store = !matches!(b.refs.kind, RefKind::Load);
    let mut more = b.pos < b.refs.count;
    while more && w.cpus[ci].local < end {
        let va = b.va;
        match translate::<MEM>(w, cpu, tid, va, store) {
            Ok((pfn, slot)) => {
                let run = PageRun {
                    cpu,
                    tid,
                    end,
                    pfn,
                    slot,
                };
                match page_run::<MEM>(w, &run, &mut b, &mut last_load) {
                    RunEnd::Next(m) => more = m,
                    RunEnd::Parked => break,
                }
            }
            Err(()) => {
                trap = Some(Trap::Fault { va, store });
                break;
            }
        }
    }
    let th = &mut w.threads[tid.0 as usize];
    th.last_load = last_load;
    // Only the position changes while the batch lasts.
    match &mut th.batch {
        Some(tb) if more => (tb.pos, tb.va) = (b.pos, b.va),
        tb => *tb = None,
    }
    trap
}

/// A run of a batch's references on one page: the first was translated
/// through `slot` to `pfn`.
struct PageRun {
    cpu: CpuId,
    tid: ThreadId,
    end: Cycles,
    pfn: mmulab_machine::Pfn,
    slot: usize,
}

/// How a run of references on one page ended.
enum RunEnd {
    /// A reference needs the full translation (another page, or its entry
    /// is no longer usable), or the batch or the slice ended: whether the
    /// batch has more.
    Next(bool),
    /// The last reference's miss outlives the slice: it is in flight
    /// (romanescu10 §5.1) and stays next in the batch.
    Parked,
}

/// Performs the reference `run` translated and then every next one of the
/// batch on the same page, for as long as the slice lasts and the TLB
/// entry in `slot` stays usable.
///
/// Each next reference is translated again through `slot`, without a
/// lookup: between two references only this CPU ran, and only this loop
/// touched the world, through references that neither write page tables
/// (a user store to a table frame is a wild access and changes nothing)
/// nor touch the TLB beyond the hit bookkeeping. With a cache hierarchy
/// the access may also have invalidated TLB entries (PCAM hits and
/// recalls under UNITD: they clear `valid` and insert nothing). So a still
/// valid entry in `slot` is the one a lookup would find, and it is used as
/// `translate` would use it: the hit recorded, the oracle checking the use
/// (the count of checked uses is unchanged). An invalidated entry, or a
/// store through an entry that is not yet writable and dirty, goes back to
/// `translate`, which walks and may trap. Nothing here frees or remaps
/// the frame either, so the world's parts are borrowed once for the run
/// and the frame's words resolved once. Not under romanescu10 §6.3's
/// ideal invalidation, whose every hit checks its PTE: there each
/// reference is translated the full way.
#[inline(always)]
fn page_run<const MEM: bool>(
    w: &mut World,
    run: &PageRun,
    b: &mut crate::program::Batch,
    last_load: &mut u64,
) -> RunEnd {
    let (ci, slot, pfn, end) = (run.cpu.index(), run.slot, run.pfn, run.end);
    let refs = b.refs;
    let store = !matches!(refs.kind, RefKind::Load);
    let ref_cycles = Cycles(w.cfg.costs.ref_cycles);
    let park_inflight = MEM && w.park_inflight;
    let l1_hit = w.l1_hit;
    let reuse = !MEM || !matches!(w.tlb_hw, TlbHardware::Ideal);
    let vpn = Vpn(b.va >> PAGE_SHIFT);
    let World {
        cpus,
        oracle,
        memsys,
        probes,
        counters,
        mem,
        refs: refs_done,
        wild_accesses,
        pmaps,
        ..
    } = w;
    let mut ms = if MEM { memsys.as_deref_mut() } else { None };
    let mut frame = mem.data_frame_mut(pfn);
    // The CPU's clock, kept here for the run and stored at each way out
    // (and after each access through the caches, for the park check): a
    // chain of read-modify-writes through the CPU's state cost its host
    // latency on every reference. Nothing else in the run reads it (the
    // memory system never reads a CPU's clock).
    let mut local = cpus[ci].local;
    // Hits through `slot` not yet recorded in the TLB, for the same
    // reason: recorded (`Tlb::hits_again`, the state the hits one by one
    // would leave) before each access through the caches, whose probes
    // may invalidate the entry, and at each way out.
    let mut hits = 0u64;
    // The entry in `slot`: without caches nothing in the run writes a TLB,
    // so it is the one read here for the whole run; with caches each
    // access may invalidate it, and it is read again after each.
    let mut e = *cpus[ci].tlb.entry(slot);
    loop {
        let va = b.va;
        let off = (va & (PAGE_SIZE - 1)) & !7;
        let next = off + refs.stride;
        if MEM
            && next < PAGE_SIZE
            && (next ^ off) >= 64
            && let Some(f) = &frame
        {
            // the next reference of a sweep, while the caches work, when
            // it starts a new 64-byte block (the host line with this
            // one's is already here)
            f.prefetch(next);
        }
        if let Some(ms) = ms.as_deref_mut() {
            if hits != 0 {
                cpus[ci].tlb.hits_again(slot, std::mem::take(&mut hits));
            }
            // The access goes through the caches (and, being a store,
            // self-snoops the PCAMs: romanescu10 §5.2), each access's
            // probes applied before the next (`World::mem_access`).
            let pa = (pfn.0 << PAGE_SHIFT) | off;
            let mut access = |kind| mem_access_in(ms, ci, pa, kind, probes, cpus, counters);
            let lat = match refs.kind {
                RefKind::Load => access(Some(AccessKind::Load)),
                RefKind::Store(_) => access(None),
                RefKind::Increment => {
                    access(Some(AccessKind::Load)) + access(Some(AccessKind::Store))
                }
            };
            // (The memory system never reads a CPU's clock, so the
            // reference's own cycles are added with its latency.)
            let c = &mut cpus[ci];
            local += ref_cycles + lat;
            c.local = local;
            // A miss that outlives the slice: the access performs (or
            // replays) when this CPU next runs. An L1 hit performs at
            // once (there is no miss to die during), and so does an
            // access whose own miss recalled its translation (an L2
            // eviction of the PTE's block: the PTE is unchanged at this
            // instant). Both keep a replayed access from being killed
            // forever in tiny caches.
            // A replay is retried in one step: cores storing to blocks
            // that hold each other's PTEs would otherwise kill each
            // other's retries forever (the paper does not say how UNITD
            // guarantees progress there).
            let retry = std::mem::take(&mut c.replaying);
            // (Read after the access, which may have invalidated it.)
            let entry = c.tlb.entry(slot);
            if park_inflight && c.local >= end && lat > l1_hit && entry.valid && !retry {
                debug_assert_eq!(entry.pfn, pfn, "the entry translated this access");
                c.inflight = Some(crate::cpu::InFlight {
                    slot,
                    pfn: entry.pfn,
                    oracle_slot: entry.oracle_slot,
                    fill_epoch: entry.fill_epoch,
                    dirty: entry.dirty,
                    va,
                    killed: false,
                });
                // its data, for when it performs
                if let Some(f) = &frame {
                    f.prefetch(off);
                }
                return RunEnd::Parked;
            }
        } else {
            local += ref_cycles;
        }
        if let Some(v) = perform_in(frame.as_mut(), off, refs.kind, wild_accesses, refs_done) {
            *last_load = v;
        }
        let more = b.advance();
        // The next reference, translated again through `slot` while the
        // batch stays on the page.
        let c = &mut cpus[ci];
        if !more || local >= end || !reuse || Vpn(b.va >> PAGE_SHIFT) != vpn {
            c.local = local;
            c.tlb.hits_again(slot, hits);
            return RunEnd::Next(more);
        }
        if MEM {
            e = *c.tlb.entry(slot);
        }
        debug_assert_eq!(e, *c.tlb.entry(slot), "no TLB write in the run");
        if !e.valid || (store && !(e.writable && e.dirty)) {
            c.local = local;
            c.tlb.hits_again(slot, hits);
            return RunEnd::Next(true);
        }
        debug_assert!(
            {
                let pmap = if b.va >= KERNEL_BASE {
                    Some(KERNEL_PMAP)
                } else {
                    c.pmap
                };
                pmap.is_some_and(|p| c.tlb.probe(e.vpn, pmaps[p.0 as usize].asid) == Some(slot))
            },
            "a lookup would find the same slot"
        );
        hits += 1;
        let ctx = UseCtx {
            cpu: run.cpu,
            thread: run.tid.0,
            va: b.va,
            time: local,
        };
        oracle.check_use(e.oracle_slot, e.fill_epoch, e.pfn, e.dirty, store, ctx);
    }
}

/// `World::mem_access` on the world's parts (`None`: a store, by
/// `MemSystem::store`), inlined into `page_run` so that an L1 hit costs no
/// call: the access, then the TLB invalidations its PCAM probes found.
#[inline(always)]
fn mem_access_in(
    ms: &mut mmulab_memsys::MemSystem,
    core: usize,
    pa: u64,
    kind: Option<AccessKind>,
    probes: &mut Vec<mmulab_memsys::TlbProbe>,
    cpus: &mut [crate::cpu::Cpu],
    counters: &mut Counters,
) -> Cycles {
    let lat = match kind {
        Some(k) => ms.access(core, pa, k, probes),
        None => ms.store(core, pa, probes),
    };
    if !probes.is_empty() {
        crate::memory::apply_probes(cpus, counters, probes);
    }
    Cycles(lat)
}

/// The data side of one reference at `off` in `pfn`, once it performs;
/// returns the value a load read.
#[inline(always)]
fn perform(w: &mut World, pfn: mmulab_machine::Pfn, off: u64, kind: RefKind) -> Option<u64> {
    let mut frame = w.mem.data_frame_mut(pfn);
    perform_in(frame.as_mut(), off, kind, &mut w.wild_accesses, &mut w.refs)
}

/// `perform` on a frame already resolved (`None`: no data frame, a wild
/// access) and the world's two counters.
#[inline(always)]
fn perform_in(
    frame: Option<&mut DataFrame<'_>>,
    off: u64,
    kind: RefKind,
    wild_accesses: &mut u64,
    refs: &mut u64,
) -> Option<u64> {
    let mut loaded = None;
    match frame {
        Some(f) => match kind {
            RefKind::Load => loaded = Some(f.load(off)),
            RefKind::Store(v) => f.store(off, v),
            RefKind::Increment => {
                let v = f.load(off);
                loaded = Some(v);
                f.store(off, v.wrapping_add(1));
            }
        },
        None => *wild_accesses += 1,
    }
    *refs += 1 + matches!(kind, RefKind::Increment) as u64;
    loaded
}

/// Retires `cpu`'s access in flight, if any (romanescu10 §5.1): if a PCAM
/// hit invalidated its translation meanwhile, the access replays — its
/// reference stays next in the batch and is looked up again — else it
/// performs now, its translation checked again by the oracle. Called when
/// the CPU next runs: its next slice, or before it takes an interrupt.
/// Always inlined: once per slice, and the call (register saves, the CPU
/// looked up again) cost as much as its common path.
#[inline(always)]
pub(crate) fn retire_inflight(w: &mut World, cpu: CpuId) {
    let ci = cpu.index();
    let Some(f) = w.cpus[ci].inflight.take() else {
        return;
    };
    let tid = w.cpus[ci]
        .thread
        .expect("an access in flight without a thread");
    if f.killed {
        w.counters.add("unitd.replays", 1);
        if !w.no_replay {
            w.cpus[ci].replaying = true;
            return;
        }
    }
    let kind = match &w.threads[tid.0 as usize].batch {
        Some(b) => {
            debug_assert_eq!(b.va, f.va, "the in-flight access is the batch's next");
            b.refs.kind
        }
        None => panic!("an access in flight outside a batch"),
    };
    let store = !matches!(kind, RefKind::Load);
    let ctx = UseCtx {
        cpu,
        thread: tid.0,
        va: f.va,
        time: w.cpus[ci].local,
    };
    w.oracle
        .recheck_use(f.oracle_slot, f.fill_epoch, f.pfn, f.dirty, store, ctx);
    let off = (f.va & (PAGE_SIZE - 1)) & !7;
    let loaded = perform(w, f.pfn, off, kind);
    let th = &mut w.threads[tid.0 as usize];
    if let Some(v) = loaded {
        th.last_load = v;
    }
    let b = th.batch.as_mut().expect("checked above");
    if !b.advance() {
        th.batch = None;
    }
}

/// A software-refilled TLB's miss (or modify) trap: the handler's cost
/// beyond its page-table loads. Nothing with a hardware walker.
#[inline]
fn refill_trap(w: &mut World) -> Cycles {
    if !w.software_refill {
        return Cycles(0);
    }
    w.counters.add("tlb.software_refills", 1);
    Cycles(w.cfg.costs.tlb_refill_trap_cycles)
}

/// Writes the PCAM beside a TLB fill at `slot`. The hardware walker knows
/// the last-level PTE's address; a software handler must supply it with a
/// dedicated instruction (romanescu10 §4.1), one more instruction per
/// refill.
#[inline]
fn fill_pcam(w: &mut World, cpu: CpuId, tlb: usize, slot: usize, pte_pa: u64) {
    if w.software_refill && matches!(w.tlb_hw, TlbHardware::Unitd(_)) {
        if !w.handler_supplies_pte {
            return;
        }
        w.counters.add("unitd.pte_address_supplied", 1);
        let c = Cycles(w.cfg.costs.ref_cycles);
        w.cpus[cpu.index()].local += c;
    }
    w.pcam_fill_tlb(cpu, tlb, slot, pte_pa);
}

/// The walker's reads of `wk`'s entries: flat memory costs a memory read
/// per level; with caches each level loads through L1D (romanescu10 §5.2).
#[inline]
fn walk_cost<const MEM: bool>(w: &mut World, cpu: CpuId, wk: &Walk) -> Cycles {
    let costs = &w.cfg.costs;
    if MEM {
        let per_level = costs.walk_level_cycles;
        let mut c = Cycles(per_level * wk.levels_read as u64);
        for &pa in &wk.path[..wk.levels_read as usize] {
            c += w.mem_access(cpu, pa, AccessKind::WalkLoad);
        }
        c
    } else {
        Cycles((costs.mem_cycles + costs.walk_level_cycles) * wk.levels_read as u64)
    }
}

/// Translates `va` on `cpu`: a TLB hit checked by the oracle, or a walk
/// that fills the TLB. `Err` is a page fault.
#[inline]
fn translate<const MEM: bool>(
    w: &mut World,
    cpu: CpuId,
    tid: ThreadId,
    va: u64,
    store: bool,
) -> Result<(mmulab_machine::Pfn, usize), ()> {
    let ci = cpu.index();
    let vpn = Vpn(va >> PAGE_SHIFT);
    let kernel = va >= KERNEL_BASE;
    let pmap = if kernel {
        KERNEL_PMAP
    } else {
        w.cpus[ci].pmap.ok_or(())?
    };
    let asid = w.pmaps[pmap.0 as usize].asid;
    let c = &mut w.cpus[ci];
    if let Some(slot) = c.tlb.lookup(vpn, asid) {
        let e = *c.tlb.entry(slot);
        // romanescu10 §6.3's ideal invalidation: the hit is checked against
        // its PTE for free; a stale entry is dropped and re-walked at full
        // cost below. Stale: the PTE no longer allows what the entry does,
        // or it was changed since the fill and changed back (the entry's
        // fill epoch is behind its PTE's).
        let stale =
            MEM && matches!(w.tlb_hw, TlbHardware::Ideal) && ideal_stale(w, cpu, pmap, vpn, &e);
        if stale {
            w.cpus[ci].tlb.entry_mut(slot).valid = false;
            w.counters.add("ideal.stale_drops", 1);
        } else {
            if store && !e.writable {
                return Err(());
            }
            check_hit(w, cpu, tid, va, &e, store);
            if store && !e.dirty {
                // The hardware sets the modify bit with an interlocked
                // read-modify-write that re-checks the PTE (black89 fn. 6).
                let root = w.walk_root(cpu, pmap);
                let wk = walk(&w.mem, w.cfg.pt_format, root, vpn);
                let cost = walk_cost::<MEM>(w, cpu, &wk) + refill_trap(w);
                w.cpus[ci].local += cost;
                if !(wk.leaf && wk.pte.present() && wk.pte.writable() && wk.pte.pfn() == e.pfn) {
                    w.cpus[ci].tlb.entry_mut(slot).valid = false;
                    return Err(());
                }
                let new = wk.pte.with(Pte::MODIFIED | Pte::REFERENCED);
                w.mem.table_mut(wk.table)[wk.index] = new.0;
                if MEM {
                    // The update is a store (romanescu10 §6.1); under UNITD
                    // its self-snoop invalidates this very entry, which the
                    // walker then re-inserts with the new value.
                    let lat = w.pte_store(cpu, wk.pte_pa);
                    w.cpus[ci].local += lat;
                    fill_pcam(w, cpu, crate::memory::DTLB, slot, wk.pte_pa);
                }
                w.oracle.record_pte(e.oracle_slot, rights_of(new), None);
                let ent = w.cpus[ci].tlb.entry_mut(slot);
                ent.valid = true;
                ent.dirty = true;
                ent.fill_epoch = w.oracle.epoch(e.oracle_slot);
            }
            return Ok((e.pfn, slot));
        }
    }
    let entry = walk_for_fill::<MEM>(w, cpu, pmap, vpn, store, kernel)?;
    let (tslot, _victim) = w.cpus[ci].tlb.insert(entry);
    if MEM {
        fill_pcam(w, cpu, crate::memory::DTLB, tslot, entry.pte_pa);
    }
    Ok((entry.pfn, tslot))
}

/// A user thread's instruction fetch: the code line of its loop, through
/// the I-TLB and the L1I, each time the program starts an operation (a
/// loop of references or a computation) and on every return to user mode
/// (after a trap or an interrupt). The simulated programs' loops fit one
/// line, which the core's fetch buffer holds while the loop runs, so one
/// fetch per loop stands for them; slices, a simulator artefact, fetch
/// nothing. A fetch that hits in the I-TLB and the L1I overlaps execution;
/// an I-TLB miss stalls for its walk, an L1I miss for the latency beyond
/// a hit. `None` without an I-TLB or a text segment; `Some` is a page
/// fault on the text page, taken through the ordinary fault path.
fn fetch_instruction(w: &mut World, cpu: CpuId, tid: ThreadId) -> Option<Trap> {
    let ci = cpu.index();
    // Without an I-TLB (flat memory) nothing is fetched.
    w.cpus[ci].itlb.as_ref()?;
    let task = w.threads[tid.0 as usize].task;
    let va = w.tasks[task.0 as usize].text_va()?;
    // A user thread runs with its task's pmap loaded (`sched`).
    let pmap = w.cpus[ci].pmap?;
    match itlb_translate(w, cpu, tid, pmap, va) {
        Ok(pfn) => {
            let pa = (pfn.0 << PAGE_SHIFT) | (va & (PAGE_SIZE - 1));
            let lat = w.mem_access(cpu, pa, AccessKind::IFetch);
            let hit = w
                .memsys
                .as_ref()
                .map_or(0, |m| m.config().l1i.latency_cycles);
            w.cpus[ci].local += Cycles(lat.0.saturating_sub(hit));
            None
        }
        Err(()) => Some(Trap::Fault { va, store: false }),
    }
}

/// Translates the user code address `va` through `cpu`'s I-TLB: a hit
/// checked by the oracle (and, under §6.3's ideal invalidation, against
/// its PTE), or a walk that fills the I-TLB and its PCAM. `Err` is a page
/// fault. Mirrors `translate`'s load path for the D-TLB.
fn itlb_translate(
    w: &mut World,
    cpu: CpuId,
    tid: ThreadId,
    pmap: PmapId,
    va: u64,
) -> Result<mmulab_machine::Pfn, ()> {
    debug_assert!(va < KERNEL_BASE, "only user code is fetched");
    let ci = cpu.index();
    let vpn = Vpn(va >> PAGE_SHIFT);
    let asid = w.pmaps[pmap.0 as usize].asid;
    let itlb = w.cpus[ci].itlb.as_mut().expect("fetch without an I-TLB");
    if let Some(slot) = itlb.lookup(vpn, asid) {
        let e = *itlb.entry(slot);
        if matches!(w.tlb_hw, TlbHardware::Ideal) && ideal_stale(w, cpu, pmap, vpn, &e) {
            w.cpus[ci]
                .itlb
                .as_mut()
                .expect("present")
                .entry_mut(slot)
                .valid = false;
            w.counters.add("ideal.stale_drops", 1);
        } else {
            check_hit(w, cpu, tid, va, &e, false);
            return Ok(e.pfn);
        }
    }
    let entry = walk_for_fill::<true>(w, cpu, pmap, vpn, false, false)?;
    let itlb = w.cpus[ci].itlb.as_mut().expect("present");
    let (slot, _victim) = itlb.insert(entry);
    fill_pcam(w, cpu, crate::memory::ITLB, slot, entry.pte_pa);
    Ok(entry.pfn)
}

/// The oracle's check of a TLB hit used by `tid` at `va`.
#[inline(always)]
fn check_hit(w: &mut World, cpu: CpuId, tid: ThreadId, va: u64, e: &TlbEntry, store: bool) {
    let ctx = UseCtx {
        cpu,
        thread: tid.0,
        va,
        time: w.cpus[cpu.index()].local,
    };
    w.oracle
        .check_use(e.oracle_slot, e.fill_epoch, e.pfn, e.dirty, store, ctx);
}

/// romanescu10 §6.3's check of a TLB hit against its PTE (see
/// `translate`): true when the entry is stale.
fn ideal_stale(w: &World, cpu: CpuId, pmap: PmapId, vpn: Vpn, e: &TlbEntry) -> bool {
    let root = w.walk_root(cpu, pmap);
    let wk = walk(&w.mem, w.cfg.pt_format, root, vpn);
    !(wk.leaf
        && wk.pte.present()
        && wk.pte.pfn() == e.pfn
        && (!e.writable || wk.pte.writable())
        && w.oracle.epoch(e.oracle_slot) == e.fill_epoch)
}

/// A TLB miss, for either TLB: the hardware walker (or, with a
/// software-refilled TLB, the miss handler) reads one entry per level from
/// the directory this CPU's MMU uses (through L1D with caches, §5.2), sets
/// the referenced (and, for a store, modified) bit with a store made before
/// the fill so that its self-snoop cannot hit the new entry (§6.1), and
/// returns the entry to insert, tagged with its PTE's address (§4.1).
/// `Err` is a page fault.
fn walk_for_fill<const MEM: bool>(
    w: &mut World,
    cpu: CpuId,
    pmap: PmapId,
    vpn: Vpn,
    store: bool,
    kernel: bool,
) -> Result<TlbEntry, ()> {
    let ci = cpu.index();
    let root = w.walk_root(cpu, pmap);
    let wk = walk(&w.mem, w.cfg.pt_format, root, vpn);
    let cost = walk_cost::<MEM>(w, cpu, &wk) + refill_trap(w);
    w.cpus[ci].local += cost;
    let pte = wk.pte;
    if !(wk.leaf && pte.present() && (!store || pte.writable()) && (kernel || pte.user())) {
        return Err(());
    }
    let mut new = pte.with(Pte::REFERENCED);
    if store {
        new = new.with(Pte::MODIFIED);
    }
    if new != pte {
        w.mem.table_mut(wk.table)[wk.index] = new.0;
        if MEM {
            let lat = w.pte_store(cpu, wk.pte_pa);
            w.cpus[ci].local += lat;
        }
    }
    let slot = w.oracle.slot(pmap.0, vpn);
    if store && !pte.modified() {
        w.oracle.record_pte(slot, rights_of(new), None);
    }
    Ok(TlbEntry {
        valid: true,
        vpn,
        asid: w.pmaps[pmap.0 as usize].asid,
        global: new.global(),
        pfn: new.pfn(),
        writable: new.writable(),
        user: new.user(),
        dirty: new.modified(),
        oracle_slot: slot,
        fill_epoch: w.oracle.epoch(slot),
        pte_pa: wk.pte_pa,
    })
}
