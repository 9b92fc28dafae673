//! `svr42`: the SVR4.2 MP HAT layer of balan92 (Balan & Gollhardt, USENIX
//! 1992) for the i386 MMU, behind the pmap/HAT interface. The paper's
//! sections are unnumbered; § names a heading.
//!
//! * Kernel address space: lazy shootdowns (§Lazy Shutdowns, §Lazy
//!   Shutdown Algorithm). An unload edits the PTEs and returns; its
//!   completion is deferred to the reuse of the address (segkmem calls
//!   `hat_shutdown(cookie)` first; see `mmulab_kernel::segkmem`). Each CPU
//!   has a cookie, the `lbolt` read *before* its last full flush; a global
//!   least-recently-flushed cookie lets `hat_shutdown` return at once.
//! * User address spaces: immediate shootdowns (§Immediate Shutdown
//!   Algorithm): the as's CPUs are interrupted and spin on a counter while
//!   the initiator edits the level-2 PTEs, bumps the counter, flushes
//!   locally and unlocks without waiting.
//! * §Multiprocessor Interfaces: `hat_asload` joins the as's CPU set and
//!   flushes (the i386 context switch: asunload without flush, copy the
//!   U-area PTEs, flush); `hat_asunload` leaves the set without a flush.
//!
//! The i386 MMU flushes whole TLBs only (§TLB Shutdowns, footnote 7), and a
//! CR3 load flushes kernel entries too (the i386 has no global pages), so
//! every flush here is a full flush and restamps the CPU's cookie.
//!
//! Cookie comparison is strict: a CPU whose last flush was stamped in the
//! same tick as the free may have flushed *before* the free, so only a
//! stamp in a later tick proves the free's translations are gone.
//!
//! Negative controls (`Mutation`) break one rule each; `mmulab check` must
//! catch them.

use std::cell::{Cell, RefCell};

use mmulab_engine::Cycles;
use mmulab_kernel::pmap::KERNEL_PMAP;
use mmulab_kernel::{Change, Cookie, Ipl, Irq, KFuture, PmapId, Protocol, Sim, Update};
use mmulab_machine::{CpuId, PtFormat, Pte, Vpn};

use crate::ProtocolOptions;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    None,
    /// `hat_shutdown` always returns early, as if every cookie were older
    /// than the least recently flushed TLB.
    NoCookieCheck,
    /// "Older" compared non-strictly: a CPU flushed in the free's own tick
    /// counts as flushed after it.
    NonStrictTick,
    /// Immediate responders flush at once instead of spinning on the
    /// counter, and may reload the old PTE before the initiator edits it.
    NoSpin,
    /// segmap reuses a chunk for another identity without
    /// `hat_shutdown` (a broken segment driver; the HAT is intact). Set in
    /// the kernel's segmap state at `init`.
    SegmapNoShutdown,
    /// Local working-set aging clears R/M without seizing the process
    /// (a broken pageout; the HAT is intact). Set in the kernel's pageout
    /// state at `init`.
    PageoutNoSeize,
    /// `hat_pageunload` takes each mapping's HAT lock with a blocking
    /// acquisition while holding the page's spin lock (the inversion the
    /// paper leaves open): a lock-order violation, and a deadlock against
    /// a `hat_unload` that holds the HAT lock and wants the page.
    PageunloadBlocking,
}

/// What a CPU's pending shootdown interrupt asks of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    /// Lazy kernel shootdown: flush, nothing else.
    Lazy,
    /// Immediate user shootdown: spin until the counter reaches `release`,
    /// then flush (or invalidate `update`'s range, with single-entry
    /// flushes).
    Immediate { release: u64, update: Update },
}

/// How an immediate shootdown went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shot {
    /// Nothing mapped in the range: no shootdown.
    Skipped,
    /// No other CPU uses the as (the ablation without the lock).
    Alone,
    /// The algorithm ran, interrupting this many responders.
    Responders(usize),
}

/// PTEs per mapping chunk on the i386: "the size of a mapping chunk is
/// 1/32nd of page table size" (balan92 §Background, footnote 2), i.e. 32
/// of a table's 1024 entries.
const CHUNK_PTES: u64 = 32;

/// The lazy algorithm's single cookie words, priced as instructions at
/// the preset's `ref_cycles` (its clocks per instruction) plus `mem_cycles`
/// for a line another processor last wrote (the preset states the counts
/// with its costs). The early test of `hat_shutdown`: load the global
/// least-recently-flushed cookie (other initiators write it: a miss),
/// compare strictly, branch.
const EARLY_TEST: (u64, u64) = (3, 1);
/// Publishing the recomputed least-recently-flushed cookie: one store to
/// the line every early test reads (a bus access).
const PUBLISH_MIN: (u64, u64) = (1, 1);
/// A CPU's stamp of its own cookie at a full flush: load `lbolt`, store
/// it in its own engine's cookie (its own line: no bus access).
const STAMP: (u64, u64) = (2, 0);

/// The cycles of `(instructions, bus accesses)`.
fn words(costs: &mmulab_kernel::Costs, (instructions, misses): (u64, u64)) -> Cycles {
    Cycles(instructions * costs.ref_cycles + misses * costs.mem_cycles)
}

pub struct Svr42 {
    mutation: Mutation,
    /// §Other Architectures: single-entry flushes up to this many pages
    /// (None: the i386, whole TLBs only).
    single_entry_threshold: Option<u64>,
    /// Ranges of at least this many pages use the L1 trick (None: off).
    l1_trick_pages: Option<u64>,
    /// Range operations skip spans without a mapping chunk.
    mapping_chunks: bool,
    /// Take the shootdown lock even when no other CPU uses the as.
    lock_when_alone: bool,
    /// The global shootdown spin lock (§Lazy Shutdown Algorithm step 1;
    /// §Immediate step 1 takes the same one).
    shoot_lock: Cell<Option<usize>>,
    /// Per CPU: lbolt read before its last full TLB flush.
    cookies: RefCell<Vec<u64>>,
    /// The cookie of the least recently flushed online TLB.
    min_cookie: Cell<u64>,
    /// Per CPU: what its pending interrupt asks.
    requests: RefCell<Vec<Option<Request>>>,
    /// Per CPU: the last shootdown round whose handler it has begun.
    began: RefCell<Vec<u64>>,
    round: Cell<u64>,
    /// The counter immediate responders spin on (§Immediate step 4).
    counter: Cell<u64>,
    /// §Other Architectures, TLB entries tagged with a context number
    /// (the machine's `tlb.asid`): no flush on a context switch, user
    /// shootdowns flush only the address space's entries, and the kernel's
    /// entries leave a TLB only through `hat_shutdown`, which then flushes
    /// every online CPU: one cookie for all.
    asid_tlb: Cell<bool>,
    /// With tagged TLBs: per address space, the CPUs that may hold its
    /// entries from before an immediate shootdown they were not part of
    /// (not running it); they flush its entries on their next
    /// `hat_asload`.
    asid_stale: RefCell<std::collections::BTreeMap<u32, mmulab_kernel::pmap::CpuSet>>,
    /// Fork write-protects the parent's ranges one mapping chunk (32
    /// PTEs) at a time, dropping the HAT lock after each (§Analysis: "is
    /// being considered"); false: one HAT-lock hold per segment.
    fork_chunk_unlock: bool,
    /// The switch "HAT lock per page table" (§Locking Design: "Making the
    /// HAT lock finer grained by moving it to the page table level was
    /// considered"). See [`Svr42::hat_lock`].
    hat_lock_per_pt: bool,
    /// Per (address space, level-1 slot): the page table's HAT lock,
    /// allocated on first use.
    pt_locks: RefCell<std::collections::BTreeMap<(u32, usize), usize>>,
}

/// The HAT locks one operation holds (see [`Svr42::hat_lock`]).
#[derive(Debug, Default)]
struct HatHold {
    /// Page-table locks, in ascending level-1 slot order.
    pts: Vec<usize>,
    /// The address space's own lock.
    space: bool,
}

impl Svr42 {
    pub fn new(o: &ProtocolOptions, mutation: Mutation) -> Svr42 {
        Svr42 {
            mutation,
            single_entry_threshold: o.single_entry_flush.then_some(o.flush_threshold),
            l1_trick_pages: (o.l1_trick_pages > 0).then_some(o.l1_trick_pages),
            mapping_chunks: o.mapping_chunks,
            lock_when_alone: o.shoot_lock_when_alone,
            shoot_lock: Cell::new(None),
            cookies: RefCell::new(Vec::new()),
            min_cookie: Cell::new(0),
            requests: RefCell::new(Vec::new()),
            began: RefCell::new(Vec::new()),
            round: Cell::new(0),
            counter: Cell::new(0),
            asid_tlb: Cell::new(false),
            asid_stale: RefCell::new(std::collections::BTreeMap::new()),
            fork_chunk_unlock: o.fork_chunk_unlock,
            hat_lock_per_pt: o.hat_lock_per_pt,
            pt_locks: RefCell::new(std::collections::BTreeMap::new()),
        }
    }

    /// The last-level page tables a range covers, by number (vpn / the
    /// pages one table maps): on the i386 the level-1 slot.
    fn pt_slots(sim: &Sim, start: Vpn, pages: u64) -> std::ops::RangeInclusive<usize> {
        let fmt = sim.w().cfg.pt_format;
        let span = fmt.pages_per_entry(fmt.levels() - 2);
        let first = start.0 / span;
        let last = (start.0 + pages.max(1) - 1) / span;
        first as usize..=last as usize
    }

    /// A page table's HAT lock (switch on), allocated on first use with
    /// its order key (address space, slot).
    fn pt_lock(&self, sim: &Sim, pmap: PmapId, slot: usize) -> usize {
        if let Some(&l) = self.pt_locks.borrow().get(&(pmap.0, slot)) {
            return l;
        }
        let l = sim.new_lock();
        sim.set_hat_lock_key(l, pmap, slot as u64);
        self.pt_locks.borrow_mut().insert((pmap.0, slot), l);
        l
    }

    /// Takes the HAT lock(s) for an operation on [start, start + pages)
    /// of `pmap`; `space`: the operation reads or changes what the
    /// address space's lock guards besides PTEs.
    ///
    /// Switch off (the paper): the address space's one HAT spin lock,
    /// whatever `space` says. Switch on: the lock of every page table the
    /// range covers, in ascending level-1 slot order, then, if `space`,
    /// the address space's own lock, which now guards its CPU set (joined
    /// by `hat_asload`, read by the immediate shootdown's target selection
    /// and its "alone" test, which must stay stable until the PTEs are
    /// edited) and its level-1 directory (a new page table's entry, copied
    /// into every per-CPU directory; the L1 trick's clears). The order
    /// (page tables ascending, then the address space) is checked by the
    /// lock-order checker (`lockorder`: same-class HAT keys). The cost is
    /// the paper's objection: "extra locking round trips for HAT
    /// functions that cross page tables".
    async fn hat_lock(
        &self,
        sim: &Sim,
        me: CpuId,
        pmap: PmapId,
        start: Vpn,
        pages: u64,
        space: bool,
    ) -> HatHold {
        if !self.hat_lock_per_pt {
            sim.lock_pmap(me, pmap).await;
            return HatHold {
                pts: Vec::new(),
                space: true,
            };
        }
        let mut hold = HatHold::default();
        for slot in Self::pt_slots(sim, start, pages) {
            let l = self.pt_lock(sim, pmap, slot);
            sim.lock(me, l).await;
            hold.pts.push(l);
        }
        if space {
            sim.lock_pmap(me, pmap).await;
            hold.space = true;
        }
        sim.count("svr42.hat_pt_locks", hold.pts.len() as u64);
        hold
    }

    /// [`Svr42::hat_lock`] for one page, by try-locks (out of order,
    /// exempt: see `hat_pageunload`): None, holding nothing, when one is
    /// busy.
    async fn hat_try_lock(&self, sim: &Sim, me: CpuId, pmap: PmapId, vpn: Vpn) -> Option<HatHold> {
        if !self.hat_lock_per_pt {
            return sim.try_lock_pmap(me, pmap).await.then(|| HatHold {
                pts: Vec::new(),
                space: true,
            });
        }
        let l = self.pt_lock(sim, pmap, *Self::pt_slots(sim, vpn, 1).start());
        if !sim.try_lock(me, l).await {
            return None;
        }
        if !sim.try_lock_pmap(me, pmap).await {
            sim.unlock(me, l).await;
            return None;
        }
        Some(HatHold {
            pts: vec![l],
            space: true,
        })
    }

    /// Releases what [`Svr42::hat_lock`] took, in reverse order.
    async fn hat_unlock(&self, sim: &Sim, me: CpuId, pmap: PmapId, hold: HatHold) {
        if hold.space {
            sim.unlock_pmap(me, pmap).await;
        }
        for &l in hold.pts.iter().rev() {
            sim.unlock(me, l).await;
        }
    }

    /// The frames whose mapping chains an update's unloads edit.
    fn unloaded_pages(&self, sim: &Sim, u: &Update) -> Vec<u64> {
        if u.change != Change::Remove {
            return Vec::new();
        }
        let mut pfns = Vec::new();
        sim.w()
            .for_each_present(u.pmap, u.start, u.pages, |_, _, _, _, pte| {
                pfns.push(pte.pfn().0)
            });
        pfns
    }

    /// Takes each page's spin lock to unlink its mapping-chunk entry (the
    /// sim's pv lists were updated with the PTE; this is the lock and the
    /// edit's time, `pmap_change_page_cycles`: find the entry on the
    /// page's mapping chain, unlink it, harvest the PTE's modify and
    /// reference bits into the page). `held`: a page whose spin lock the
    /// caller already holds (`hat_pageunload`'s).
    async fn edit_chains(&self, sim: &Sim, me: CpuId, pfns: &[u64], held: Option<u64>) {
        let edit = Cycles(sim.costs().pmap_change_page_cycles);
        for &pfn in pfns {
            if Some(pfn) == held {
                sim.delay(me, edit).await;
                continue;
            }
            let (lock, _) = sim.page_locks(pfn);
            sim.lock(me, lock).await;
            sim.delay(me, edit).await;
            sim.unlock(me, lock).await;
        }
    }

    /// `hat_asload`'s copy of an address space's user level-1 entries into
    /// `cpu`'s directory (`Some`), or `hat_asunload`'s clear (`None`), and
    /// its cost: one write per present entry. Without per-CPU directories
    /// (non-i386 tables) the same count is charged against the address
    /// space's own directory, which the MMU then walks.
    fn l1_copy_cycles(&self, sim: &Sim, cpu: CpuId, pmap: PmapId, load: bool) -> Cycles {
        let mut w = sim.w();
        let pte_write = w.cfg.costs.pte_write_cycles;
        if w.percpu_l1.is_some() {
            let n = w.l1_load(cpu, load.then_some(pmap));
            return Cycles(pte_write * n);
        }
        let fmt = w.cfg.pt_format;
        let user_top = fmt.index(Vpn(mmulab_kernel::sim::KERNEL_BASE >> 12), 0);
        let root = w.pmaps[pmap.0 as usize].root;
        if !w.pmaps[pmap.0 as usize].alive {
            return Cycles(0);
        }
        let n = w.mem.table(root)[..user_top]
            .iter()
            .filter(|&&e| Pte(e).present())
            .count() as u64;
        Cycles(pte_write * n)
    }

    /// Flushes one address space's entries from `cpu`'s tagged TLB (no
    /// kernel entry leaves: no restamp).
    async fn asid_flush(&self, sim: &Sim, cpu: CpuId, pmap: PmapId) {
        let c = {
            let mut w = sim.w();
            let asid = w.pmaps[pmap.0 as usize].asid;
            w.cpus[cpu.index()].flush_tlbs_asid(asid);
            w.pcam_sync(cpu);
            w.counters.add("svr42.asid_flushes", 1);
            w.cfg.costs.tlb_flush_all_cycles
        };
        sim.delay(cpu, Cycles(c)).await;
    }

    /// With tagged TLBs, after an immediate shootdown on `pmap` that
    /// reached `reached`: every other CPU flushes its entries before it
    /// loads the address space again.
    fn mark_stale(&self, sim: &Sim, pmap: PmapId, reached: &[CpuId], me: CpuId) {
        if !self.asid_tlb.get() {
            return;
        }
        let n = sim.w().cpus.len();
        let mut stale = self.asid_stale.borrow_mut();
        let set = stale
            .entry(pmap.0)
            .or_insert_with(|| mmulab_kernel::pmap::CpuSet::new(n));
        for i in 0..n {
            let c = CpuId(i as u16);
            if c != me && !reached.contains(&c) {
                set.insert(c);
            }
        }
    }

    fn lock_id(&self) -> usize {
        self.shoot_lock.get().expect("initialised")
    }

    /// Does a CPU stamped `cpu_cookie` need flushing for a free stamped
    /// `cookie`? Strictly "older": a flush in the free's tick does not
    /// count (it may have come before the free).
    fn older(&self, cpu_cookie: u64, cookie: u64) -> bool {
        if self.mutation == Mutation::NonStrictTick {
            cpu_cookie < cookie
        } else {
            cpu_cookie <= cookie
        }
    }

    /// An immediate shootdown's flush on `cpu`: the range's entries when
    /// single-entry flushes are on and the range is small (§Other
    /// Architectures: "a point ... where flushing a whole TLB is cheaper");
    /// else a full flush. Only a full flush restamps the cookie.
    async fn range_flush(&self, sim: &Sim, cpu: CpuId, u: &Update) {
        match self.single_entry_threshold {
            Some(t) if u.pages <= t => {
                let c = sim.tlb_invalidate_range(cpu, u.pmap, u.start, u.pages, t);
                sim.delay(cpu, c).await;
            }
            _ if self.asid_tlb.get() => self.asid_flush(sim, cpu, u.pmap).await,
            _ => self.local_flush(sim, cpu).await,
        }
    }

    /// Entries a range operation examines (§Background): the level-1
    /// entry of each page table the range covers, then, both ways, nothing
    /// more in page tables that do not exist. With mapping chunks, one per
    /// 32 PTEs and present only while one of its PTEs is valid, each chunk
    /// slot is checked and only present chunks' PTEs are looked at; without
    /// them every PTE of the range is.
    fn entries_examined(&self, sim: &Sim, u: &Update) -> u64 {
        let mut w = sim.w();
        let fmt = w.cfg.pt_format;
        let span = fmt.pages_per_entry(fmt.levels() - 2);
        let end = u.start.0 + u.pages;
        let mut present_chunks = std::collections::BTreeSet::new();
        w.for_each_present(u.pmap, u.start, u.pages, |_, v, _, _, _| {
            present_chunks.insert(v.0 / CHUNK_PTES);
        });
        let root = w.pmaps[u.pmap.0 as usize].root;
        let mut l1_entries = 0;
        let mut slots = 0;
        let mut chunk_slots = 0;
        let mut v = u.start.0;
        while v < end {
            l1_entries += 1;
            let table_end = ((v / span + 1) * span).min(end);
            let wk = mmulab_machine::pagetable::walk(&w.mem, fmt, root, Vpn(v));
            if wk.leaf {
                slots += table_end - v;
                chunk_slots += (table_end - 1) / CHUNK_PTES - v / CHUNK_PTES + 1;
            }
            v = table_end;
        }
        drop(w);
        if self.mapping_chunks {
            let chunk_ptes: u64 = present_chunks
                .iter()
                .map(|&c| {
                    let lo = (c * CHUNK_PTES).max(u.start.0);
                    let hi = ((c + 1) * CHUNK_PTES).min(end);
                    hi - lo
                })
                .sum();
            l1_entries + chunk_slots + chunk_ptes
        } else {
            l1_entries + slots
        }
    }

    /// A full flush of `cpu`'s own TLB, with its cookie read before it.
    async fn local_flush(&self, sim: &Sim, cpu: CpuId) {
        let costs = sim.costs();
        self.cookies.borrow_mut()[cpu.index()] = sim.lbolt();
        let c = sim.tlb_flush(cpu);
        sim.delay(cpu, c + words(&costs, STAMP)).await;
    }

    /// Interrupts `targets` with `req` and waits until each has begun its
    /// handler (the lazy algorithm's step 4; the immediate algorithm's
    /// "after the responders are in a spinning state").
    async fn interrupt_and_wait(&self, sim: &Sim, me: CpuId, targets: &[CpuId], req: Request) {
        let round = self.round.get() + 1;
        self.round.set(round);
        for &t in targets {
            self.requests.borrow_mut()[t.index()] = Some(req);
            sim.send_ipi(me, t, Irq::Shootdown).await;
        }
        for &t in targets {
            sim.spin_until(me, &format!("svr42: {t} to begin the handler"), |_| {
                self.began.borrow()[t.index()] >= round
            })
            .await;
        }
    }

    /// §Lazy Shutdown Algorithm (and `HAT_NOCOOKIE`: every online CPU,
    /// without the cookie accounting).
    async fn shutdown(&self, sim: &Sim, me: CpuId, cookie: Cookie) {
        let costs = sim.costs();
        let start = sim.now();
        sim.count("hat.shutdown.calls", 1);
        if let Cookie::Age(c) = cookie {
            // The early return: every TLB has been flushed since the
            // cookie was taken.
            sim.delay(me, words(&costs, EARLY_TEST)).await;
            let all_flushed = match self.mutation {
                Mutation::NoCookieCheck => true,
                _ => !self.older(self.min_cookie.get(), c),
            };
            if all_flushed {
                sim.count("hat.shutdown.early_returns", 1);
                return;
            }
        }
        // Step 1, at splhi: a CPU spinning here still answers another
        // initiator's interrupt, which sits above splhi.
        let saved = sim.set_ipl(me, Ipl::HIGH);
        sim.delay(me, Cycles(costs.spl_cycles)).await;
        sim.lock(me, self.lock_id()).await;
        // Step 2: select the older online CPUs, restamp them, recompute the
        // least recently flushed cookie.
        let (targets, flush_me, new_min) = {
            let w = sim.w();
            let online: Vec<CpuId> = w.cpus.iter().filter(|c| c.online).map(|c| c.id).collect();
            drop(w);
            let now_tick = sim.lbolt();
            let mut cookies = self.cookies.borrow_mut();
            let mut targets = Vec::new();
            let mut flush_me = false;
            for &c in &online {
                // Tagged TLBs: one cookie; a shutdown that is needed at
                // all flushes every online CPU.
                let selected = match cookie {
                    Cookie::NoCookie => true,
                    Cookie::Age(_) if self.asid_tlb.get() => true,
                    Cookie::Age(k) => self.older(cookies[c.index()], k),
                };
                if selected {
                    cookies[c.index()] = now_tick;
                    if c == me {
                        flush_me = true;
                    } else {
                        targets.push(c);
                    }
                }
            }
            let new_min = matches!(cookie, Cookie::Age(_)).then(|| {
                online
                    .iter()
                    .map(|c| cookies[c.index()])
                    .min()
                    .unwrap_or(now_tick)
            });
            (targets, flush_me, new_min)
        };
        if let Cookie::Age(_) = cookie {
            // One pass of the engine loop per online CPU (`hat_cookie_cycles`:
            // load its cookie, compare, restamp it if selected, add it to
            // the interrupt mask, keep the minimum, loop control).
            let n = sim.w().cpus.iter().filter(|c| c.online).count() as u64;
            sim.delay(me, Cycles(costs.hat_cookie_cycles * n)).await;
        }
        // Step 3 (the initiator flushes its own TLB itself).
        if flush_me || cookie == Cookie::NoCookie {
            let c = sim.tlb_flush(me);
            sim.delay(me, c).await;
        }
        self.interrupt_and_wait(sim, me, &targets, Request::Lazy)
            .await;
        // The new least-recently-flushed cookie is published only now:
        // the early return reads it without the lock, and a CPU restamped
        // in step 2 is only safe to count as flushed once it has begun its
        // handler (it runs nothing else before its flush).
        if let Some(m) = new_min {
            self.min_cookie.set(self.min_cookie.get().max(m));
            sim.delay(me, words(&costs, PUBLISH_MIN)).await;
        }
        // Step 4: unlock once every responder has begun; do not wait for
        // their flushes.
        sim.unlock(me, self.lock_id()).await;
        sim.set_ipl(me, saved);
        sim.delay(me, Cycles(costs.spl_cycles)).await;
        if !targets.is_empty() || cookie == Cookie::NoCookie {
            sim.count("hat.shutdown.real", 1);
            let kind = if cookie == Cookie::NoCookie {
                "basic"
            } else {
                "lazy"
            };
            sim.record(
                &format!("hat.shutdown.{kind}.initiator_cycles"),
                (sim.now() - start).0 as f64,
            );
            sim.record(
                &format!("hat.shutdown.{kind}.processors"),
                targets.len() as f64,
            );
        }
    }

    /// §Immediate Shutdown Algorithm, for a user address space.
    async fn immediate(&self, sim: &Sim, me: CpuId, u: Update) {
        let costs = sim.costs();
        let start = sim.now();
        let saved = sim.set_ipl(me, Ipl::HIGH);
        sim.delay(me, Cycles(costs.spl_cycles)).await;
        // The as's HAT spin lock (§Locking Design: one per address space),
        // or with the switch on the range's page-table locks and the as's
        // lock (the CPU set the shootdown selects from).
        let hold = self.hat_lock(sim, me, u.pmap, u.start, u.pages, true).await;
        let shot = self.immediate_locked(sim, me, u, None).await;
        self.hat_unlock(sim, me, u.pmap, hold).await;
        sim.set_ipl(me, saved);
        if shot == Shot::Skipped {
            return;
        }
        sim.delay(me, Cycles(costs.spl_cycles)).await;
        self.record_shot(sim, start, shot);
    }

    fn record_shot(&self, sim: &Sim, start: Cycles, shot: Shot) {
        if let Shot::Responders(n) = shot
            && n > 0
        {
            sim.count("shootdown.user.events", 1);
            sim.record(
                "shootdown.user.initiator_cycles",
                (sim.now() - start).0 as f64,
            );
            sim.record("shootdown.user.processors", n as f64);
        }
    }

    /// The immediate algorithm with the as's HAT lock held (at splhi) by
    /// the caller, who releases it. `held`: a page whose spin lock the
    /// caller holds (`hat_pageunload`).
    async fn immediate_locked(&self, sim: &Sim, me: CpuId, u: Update, held: Option<u64>) -> Shot {
        let costs = sim.costs();
        // Range operations skip spans with nothing mapped (§Background:
        // no mapping chunk, no PTEs to look at); nothing mapped, no
        // shootdown at all.
        let examined = self.entries_examined(sim, &u);
        sim.count("svr42.entries_examined", examined);
        sim.delay(me, Cycles(costs.lazy_check_cycles * examined.max(1)))
            .await;
        if !sim.w().any_mapped(u.pmap, u.start, u.pages) {
            sim.count("svr42.user.skipped", 1);
            return Shot::Skipped;
        }
        // Ablation: with no other CPU in the as (stable: joining takes
        // the HAT lock we hold), skip the global lock and the interrupts.
        let alone = !self.lock_when_alone && {
            let w = sim.w();
            w.pmaps[u.pmap.0 as usize]
                .in_use
                .iter()
                .all(|c| c == me || !w.is_online(c))
        };
        if alone {
            self.mark_stale(sim, u.pmap, &[], me);
            let chains = self.unloaded_pages(sim, &u);
            let edit = sim.w().pt_apply(me, &u);
            sim.delay(me, Cycles(costs.pte_write_cycles * edit.changed))
                .await;
            self.range_flush(sim, me, &u).await;
            self.edit_chains(sim, me, &chains, held).await;
            sim.count("svr42.user.alone", 1);
            return Shot::Alone;
        }
        // Step 1.
        sim.lock(me, self.lock_id()).await;
        // Step 2: interrupt the CPUs sharing this as; they spin.
        let targets: Vec<CpuId> = {
            let w = sim.w();
            w.pmaps[u.pmap.0 as usize]
                .in_use
                .iter()
                .filter(|&c| c != me && w.is_online(c))
                .collect()
        };
        self.mark_stale(sim, u.pmap, &targets, me);
        let release = self.counter.get() + 1;
        self.interrupt_and_wait(sim, me, &targets, Request::Immediate { release, update: u })
            .await;
        let trick = self.l1_trick_pages.is_some_and(|t| u.pages >= t)
            && sim.w().cfg.pt_format == PtFormat::I386;
        if trick {
            self.l1_trick(sim, me, u, &targets, release, held).await;
            sim.count("svr42.l1_trick", 1);
            return Shot::Responders(targets.len());
        }
        // Step 3: edit the level-2 PTEs.
        let chains = self.unloaded_pages(sim, &u);
        let edit = sim.w().pt_apply(me, &u);
        sim.delay(me, Cycles(costs.pte_write_cycles * edit.changed))
            .await;
        // Step 4: release the responders.
        self.counter.set(release);
        sim.delay(me, Cycles(costs.pte_write_cycles)).await;
        // Step 5: flush locally.
        self.range_flush(sim, me, &u).await;
        // Step 6: unlock without waiting for the responders' flushes.
        sim.unlock(me, self.lock_id()).await;
        // Each unloaded PTE leaves its page's mapping chain under the
        // page's spin lock (§Examples of the Locking requirements,
        // hat_unload). The paper's order puts the page spin lock before
        // the shootdown lock (segment → page sleep → HAT → page spin →
        // shootdown) while its immediate algorithm edits in step 3 with
        // the shootdown lock held: the chain edits are done here, after
        // step 6, still under the HAT lock, which keeps the order.
        self.edit_chains(sim, me, &chains, held).await;
        Shot::Responders(targets.len())
    }

    /// §Immediate Shutdown Algorithm, the i386 optimisation for large
    /// ranges. Entered holding the as's HAT lock and the shootdown lock,
    /// with the responders spinning: clear only the level-1 entries of the
    /// affected page tables (every CPU's copy), release the responders,
    /// flush, unlock the shootdown lock, and only then edit the level-2
    /// PTEs. An LWP touching the range meanwhile takes a fault (no level-1
    /// entry) and blocks until the HAT lock is released (in this model the
    /// fault blocks on the task's map lock, which the caller holds for the
    /// whole operation). The level-2 edit's time is charged with the L1
    /// entries cleared, then each unloaded PTE's mapping chain is edited
    /// under its page's spin lock (taken for real, after the shootdown
    /// lock is released, still under the HAT lock: HAT → page spin →
    /// shootdown, as in the plain algorithm's step 6); the level-2 edit
    /// and the restore of the L1 entries then happen at one instant.
    /// `held`: a page whose spin lock the caller holds (`hat_pageunload`).
    async fn l1_trick(
        &self,
        sim: &Sim,
        me: CpuId,
        u: Update,
        targets: &[CpuId],
        release: u64,
        held: Option<u64>,
    ) {
        let costs = sim.costs();
        // Read before the level-1 entries are cleared (the walk starts
        // there).
        let chains = self.unloaded_pages(sim, &u);
        let (cleared, to_edit, copies_written) = {
            let mut w = sim.w();
            let mut to_edit = 0u64;
            w.for_each_present(u.pmap, u.start, u.pages, |_, _, _, _, _| to_edit += 1);
            let root = w.pmaps[u.pmap.0 as usize].root;
            let fmt = w.cfg.pt_format;
            let first = fmt.index(u.start, 0);
            let last = fmt.index(Vpn(u.start.0 + u.pages - 1), 0);
            let mut cleared = Vec::new();
            for i in first..=last {
                let e = w.mem.table(root)[i];
                if Pte(e).present() {
                    w.mem.table_mut(root)[i] = 0;
                    cleared.push((i, e));
                }
            }
            // Every CPU's copy: with per-CPU directories, each that holds
            // the as's entries is edited; without them (non-i386 runs are
            // excluded above) the copies are charged as if they existed.
            let copies = if w.percpu_l1.is_some() {
                w.l1_sync(u.pmap)
            } else {
                cleared.len() as u64 * (targets.len() as u64 + 1)
            };
            (cleared, to_edit, copies)
        };
        sim.delay(me, Cycles(costs.pte_write_cycles * copies_written))
            .await;
        self.counter.set(release);
        sim.delay(me, Cycles(costs.pte_write_cycles)).await;
        if self.asid_tlb.get() {
            self.asid_flush(sim, me, u.pmap).await;
        } else {
            self.local_flush(sim, me).await;
        }
        sim.unlock(me, self.lock_id()).await;
        // The level-1 restore, into every copy, is charged with the edit.
        sim.delay(
            me,
            Cycles(costs.pte_write_cycles * (to_edit + copies_written)),
        )
        .await;
        // The mapping-chain edits of an unload, each under its page's
        // spin lock (none for a protection change).
        self.edit_chains(sim, me, &chains, held).await;
        let mut w = sim.w();
        let root = w.pmaps[u.pmap.0 as usize].root;
        for &(i, e) in &cleared {
            assert_eq!(
                w.mem.table(root)[i],
                0,
                "L1 trick: a mapping entered while the level-1 entries were cleared"
            );
            w.mem.table_mut(root)[i] = e;
        }
        w.l1_sync(u.pmap);
        w.l1_assert_consistent();
        w.pt_apply(me, &u);
    }

    /// A kernel unload: edit the PTEs now, shoot at reuse (§Lazy
    /// Shutdowns). The operation completes when the reuse's
    /// `hat_shutdown` returns (segkmem tells the oracle).
    async fn kernel_unload(&self, sim: &Sim, me: CpuId, u: Update) {
        let costs = sim.costs();
        let saved = sim.set_ipl(me, Ipl::HIGH);
        // Lazy: no CPU set is read (the kas's is the online set, under
        // the shootdown lock); with the switch, the page tables' locks.
        let hold = self
            .hat_lock(sim, me, u.pmap, u.start, u.pages, false)
            .await;
        let edit = sim.w().pt_apply(me, &u);
        sim.delay(me, Cycles(costs.pte_write_cycles * edit.changed))
            .await;
        if edit.changed > 0 {
            sim.defer_completion(me);
            sim.count("svr42.kernel.deferred_unloads", 1);
        }
        self.hat_unlock(sim, me, u.pmap, hold).await;
        sim.set_ipl(me, saved);
    }
}

impl Protocol for Svr42 {
    fn name(&self) -> &'static str {
        match self.mutation {
            Mutation::None => "svr42",
            Mutation::NoCookieCheck => "svr42-no-cookie-check",
            Mutation::NonStrictTick => "svr42-nonstrict-tick",
            Mutation::NoSpin => "svr42-no-spin",
            Mutation::SegmapNoShutdown => "svr42-segmap-no-shutdown",
            Mutation::PageoutNoSeize => "svr42-pageout-no-seize",
            Mutation::PageunloadBlocking => "svr42-pageunload-blocking",
        }
    }

    /// `hat_online` for every CPU at boot: its TLB is empty (flushed) at
    /// lbolt 0.
    fn init(&self, sim: &Sim) {
        let lock = sim.new_lock();
        sim.set_lock_class(lock, mmulab_kernel::lockorder::LockClass::Shootdown);
        self.shoot_lock.set(Some(lock));
        let n = sim.w().cpus.len();
        *self.cookies.borrow_mut() = vec![0; n];
        *self.requests.borrow_mut() = vec![None; n];
        *self.began.borrow_mut() = vec![0; n];
        self.min_cookie.set(0);
        self.asid_tlb.set(sim.w().cpus[0].tlb.config().asid);
        // §Background: on the i386 each CPU has its own level-1 directory,
        // kernel entries shared, user entries copied in by hat_asload.
        sim.enable_percpu_l1();
        let mut w = sim.w();
        w.segmap.control_skip_shutdown = self.mutation == Mutation::SegmapNoShutdown;
        w.pageout.control_no_seize = self.mutation == Mutation::PageoutNoSeize;
    }

    /// The cross-processor interrupt sits above splhi (§Lazy Shutdown
    /// Algorithm): CPUs spinning at splhi answer it.
    fn interrupt_level(&self) -> Ipl {
        Ipl::ALL
    }

    fn update<'a>(&'a self, sim: &'a Sim, cpu: CpuId, u: Update) -> KFuture<'a> {
        Box::pin(async move {
            if u.pmap == KERNEL_PMAP {
                self.kernel_unload(sim, cpu, u).await;
            } else if self.fork_chunk_unlock && sim.current_op_is(cpu, "fork") {
                // One HAT-lock hold (and one shootdown) per mapping chunk.
                let mut v = u.start.0;
                let end = u.start.0 + u.pages;
                while v < end {
                    let next = ((v / CHUNK_PTES + 1) * CHUNK_PTES).min(end);
                    let part = Update {
                        start: Vpn(v),
                        pages: next - v,
                        ..u
                    };
                    sim.count("svr42.fork.chunk_holds", 1);
                    self.immediate(sim, cpu, part).await;
                    v = next;
                }
            } else {
                self.immediate(sim, cpu, u).await;
            }
        })
    }

    /// `hat_memload`: a rights increase, no shootdown, under the as's HAT
    /// lock; its caller may hold no spin lock (checked).
    fn enter<'a>(
        &'a self,
        sim: &'a Sim,
        cpu: CpuId,
        pmap: PmapId,
        vpn: Vpn,
        pfn: mmulab_machine::Pfn,
        writable: bool,
    ) -> KFuture<'a> {
        Box::pin(async move {
            sim.check_no_spin_lock(cpu, "hat_memload");
            // "Called with the reader/writer lock for the physical page
            // held" (the VM layer takes it: `rw_vm_locks`).
            let (_, sleep) = sim.page_locks(pfn.0);
            sim.check_holds(
                cpu,
                mmulab_kernel::lockorder::LockRef::Sleep(sleep),
                "hat_memload",
            );
            assert!(
                sim.holds_sleep_lock(cpu, sleep),
                "hat_memload of frame {} without its page sleep lock",
                pfn.0
            );
            // "In all these operations, the HAT resource lock is acquired
            // by the HAT layer" (§Examples of the Locking requirements).
            // With the switch on: the page table's lock; a load that
            // creates the page table (no level-1 entry yet) writes a new
            // level-1 entry into every per-CPU directory, so it takes the
            // as's lock too (a rights increase reads no CPU set).
            let saved = sim.set_ipl(cpu, Ipl::HIGH);
            let new_table = {
                let w = sim.w();
                let fmt = w.cfg.pt_format;
                let root = w.pmaps[pmap.0 as usize].root;
                !mmulab_machine::pagetable::walk(&w.mem, fmt, root, vpn).leaf
            };
            let hold = self.hat_lock(sim, cpu, pmap, vpn, 1, new_table).await;
            let creates = {
                let w = sim.w();
                let fmt = w.cfg.pt_format;
                let root = w.pmaps[pmap.0 as usize].root;
                !mmulab_machine::pagetable::walk(&w.mem, fmt, root, vpn).leaf
            };
            assert!(
                !creates || hold.space,
                "hat_memload creates a page table without the as's HAT lock"
            );
            sim.enter_or_stop(cpu, pmap, vpn, pfn, writable).await;
            self.hat_unlock(sim, cpu, pmap, hold).await;
            sim.set_ipl(cpu, saved);
        })
    }

    fn rw_vm_locks(&self) -> bool {
        true
    }

    /// `hat_pageunload`: entered holding the page's spin lock, which ranks
    /// after the HAT lock (segment → page sleep → HAT → page spin →
    /// shootdown), an inversion the paper leaves open. Resolved by
    /// try-locking each mapping's HAT lock: on failure, drop the page
    /// spin lock, wait (holding nothing of HAT rank or above) until that
    /// HAT lock is free, retake the page spin lock and re-read the mapping
    /// chain, which may have changed meanwhile (`svr42.pageunload.backoffs`
    /// counts these). A HAT-lock holder never waits for anything this CPU
    /// holds at the try (only the page spin lock, which it may want and
    /// which the back-off releases), so there is no deadlock; the paper's
    /// blocking acquisition is the control `svr42-pageunload-blocking`.
    fn page_unload<'a>(&'a self, sim: &'a Sim, me: CpuId, pfn: mmulab_machine::Pfn) -> KFuture<'a> {
        Box::pin(async move {
            let (spin, _) = sim.page_locks(pfn.0);
            assert_eq!(
                sim.w().locks[spin],
                Some(me),
                "hat_pageunload without the page spin lock"
            );
            loop {
                // The mapping chain, read under the page spin lock.
                let chain = sim.w().mappings_of(pfn);
                assert!(
                    chain.iter().all(|&(p, _)| p != KERNEL_PMAP),
                    "hat_pageunload of a kernel-mapped frame"
                );
                let Some(&(pmap, vpn)) = chain.first() else {
                    break;
                };
                let hold = if self.mutation == Mutation::PageunloadBlocking {
                    Some(self.hat_lock(sim, me, pmap, vpn, 1, true).await)
                } else {
                    self.hat_try_lock(sim, me, pmap, vpn).await
                };
                let Some(hold) = hold else {
                    sim.count("svr42.pageunload.backoffs", 1);
                    sim.unlock(me, spin).await;
                    let pt = self
                        .hat_lock_per_pt
                        .then(|| self.pt_lock(sim, pmap, *Self::pt_slots(sim, vpn, 1).start()));
                    sim.spin_until(me, "hat_pageunload back-off: a HAT lock", |w| {
                        w.pmaps[pmap.0 as usize].lock.is_none()
                            && pt.is_none_or(|l| w.locks[l].is_none())
                    })
                    .await;
                    sim.lock(me, spin).await;
                    continue;
                };
                // Re-validate: the chain entry may have gone while the HAT
                // lock was being taken (its holder edits PTEs, and the
                // pv list with them, before it takes the page spin lock).
                let still = sim.w().mappings_of(pfn).contains(&(pmap, vpn));
                if still {
                    let u = Update {
                        pmap,
                        start: vpn,
                        pages: 1,
                        change: Change::Remove,
                    };
                    let start = sim.now();
                    let shot = self.immediate_locked(sim, me, u, Some(pfn.0)).await;
                    self.record_shot(sim, start, shot);
                    sim.count("svr42.pageunload.mappings", 1);
                } else {
                    sim.count("svr42.pageunload.revalidated", 1);
                }
                self.hat_unlock(sim, me, pmap, hold).await;
            }
        })
    }

    fn interrupt<'a>(&'a self, sim: &'a Sim, me: CpuId) -> KFuture<'a> {
        Box::pin(async move {
            let start = sim.now();
            let req = self.requests.borrow_mut()[me.index()].take();
            self.began.borrow_mut()[me.index()] = self.round.get();
            match req {
                None => {}
                Some(Request::Lazy) => {
                    // The initiator already restamped our cookie; the
                    // handler only flushes.
                    let c = sim.tlb_flush(me);
                    sim.delay(me, c).await;
                    sim.record(
                        "shootdown.kernel.responder_cycles",
                        (sim.now() - start).0 as f64,
                    );
                }
                Some(Request::Immediate { release, update }) => {
                    if self.mutation != Mutation::NoSpin {
                        sim.spin_until(me, "svr42 responder: the counter", |_| {
                            self.counter.get() >= release
                        })
                        .await;
                    }
                    self.range_flush(sim, me, &update).await;
                    sim.record(
                        "shootdown.user.responder_cycles",
                        (sim.now() - start).0 as f64,
                    );
                }
            }
        })
    }

    /// `hat_asload(as)` on a context switch: join the as's CPU set under
    /// its HAT lock (so that no immediate shootdown selects its CPUs while
    /// a CPU joins), load the level-1 entries, and flush (the i386 context
    /// switch flushes after copying the new U-area PTEs, §Multiprocessor
    /// Interfaces footnote 4).
    fn activate<'a>(&'a self, sim: &'a Sim, cpu: CpuId, pmap: PmapId) -> KFuture<'a> {
        Box::pin(async move {
            let saved = sim.set_ipl(cpu, Ipl::HIGH);
            sim.lock_pmap(cpu, pmap).await;
            {
                let mut w = sim.w();
                w.pmaps[pmap.0 as usize].in_use.insert(cpu);
                w.cpus[cpu.index()].pmap = Some(pmap);
            }
            // "loads this address space into the MMU (just the level 1
            // page table entries on the i386)": the user entries are
            // copied into this CPU's own directory, under the HAT lock
            // (an L1 change of the as reaches every copy under it too).
            let c = self.l1_copy_cycles(sim, cpu, pmap, true);
            sim.w().l1_assert_consistent();
            sim.delay(cpu, c).await;
            sim.unlock_pmap(cpu, pmap).await;
            sim.set_ipl(cpu, saved);
            if self.asid_tlb.get() {
                // §Other Architectures: "It is unnecessary to flush the
                // TLB on context switches" -- unless a shootdown this CPU
                // was not part of left its entries stale.
                let stale = self
                    .asid_stale
                    .borrow_mut()
                    .get_mut(&pmap.0)
                    .is_some_and(|s| {
                        let had = s.contains(cpu);
                        s.remove(cpu);
                        had
                    });
                if stale {
                    self.asid_flush(sim, cpu, pmap).await;
                }
            } else {
                self.local_flush(sim, cpu).await;
            }
        })
    }

    /// `hat_asunload(as, no flush)`: leave the CPU set; the flush comes
    /// with the next `hat_asload`.
    fn deactivate<'a>(&'a self, sim: &'a Sim, cpu: CpuId, pmap: PmapId) -> KFuture<'a> {
        Box::pin(async move {
            sim.unload_pmap(cpu, pmap);
            // "unloads the MMU mappings for this process (again, just the
            // level 1 translations on the i386)": clear the user entries
            // of this CPU's directory.
            let c = self.l1_copy_cycles(sim, cpu, pmap, false);
            sim.delay(cpu, c).await;
        })
    }

    /// `hat_offline` (§Multiprocessor Interfaces): clear the CPU's bit in
    /// the kas set under the shootdown lock, which "disallows the active
    /// processor set of the system from changing underneath" a shootdown.
    /// An offline CPU is never interrupted; its TLB is flushed when it
    /// comes back.
    fn offline<'a>(&'a self, sim: &'a Sim, cpu: CpuId) -> KFuture<'a> {
        Box::pin(async move {
            let saved = sim.set_ipl(cpu, Ipl::HIGH);
            sim.lock(cpu, self.lock_id()).await;
            sim.w().cpus[cpu.index()].online = false;
            let min = {
                let w = sim.w();
                let cookies = self.cookies.borrow();
                w.cpus
                    .iter()
                    .filter(|c| c.online)
                    .map(|c| cookies[c.id.index()])
                    .min()
            };
            if let Some(m) = min {
                self.min_cookie.set(self.min_cookie.get().max(m));
            }
            sim.unlock(cpu, self.lock_id()).await;
            sim.set_ipl(cpu, saved);
        })
    }

    /// `hat_online`: join the kas set and flush the TLB (which restamps
    /// the cookie), under the shootdown lock.
    fn online<'a>(&'a self, sim: &'a Sim, cpu: CpuId) -> KFuture<'a> {
        Box::pin(async move {
            let saved = sim.set_ipl(cpu, Ipl::HIGH);
            sim.lock(cpu, self.lock_id()).await;
            sim.w().cpus[cpu.index()].online = true;
            self.local_flush(sim, cpu).await;
            sim.unlock(cpu, self.lock_id()).await;
            sim.set_ipl(cpu, saved);
        })
    }

    fn hat_getshootcookie(&self, sim: &Sim) -> Option<u64> {
        Some(sim.lbolt())
    }

    fn hat_shutdown<'a>(&'a self, sim: &'a Sim, cpu: CpuId, cookie: Cookie) -> KFuture<'a> {
        Box::pin(async move { self.shutdown(sim, cpu, cookie).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_is_strict_and_the_control_is_not() {
        let o = ProtocolOptions::default();
        let good = Svr42::new(&o, Mutation::None);
        // A flush stamped in the free's tick may precede the free.
        assert!(good.older(5, 5));
        assert!(good.older(4, 5));
        assert!(!good.older(6, 5));
        let bad = Svr42::new(&o, Mutation::NonStrictTick);
        assert!(!bad.older(5, 5));
        assert!(bad.older(4, 5));
    }
}
