//! The pmap/HAT interface: the one narrow interface between the
//! machine-independent VM layer and every coherence mechanism (Mach's pmap
//! module, SVR4's HAT). The VM layer calls a [`Protocol`]; protocols use
//! the page-table editing and TLB helpers on [`Sim`] that they share, and
//! decide *when* TLBs are made consistent.
//!
//! Adding a protocol: implement [`Protocol`] (only `name` and `update` are
//! required), and register it in the experiment crate's protocol table.
//! The VM layer never changes.

use mmulab_engine::Cycles;
use mmulab_machine::pagetable::{leaf_slot, walk};
use mmulab_machine::{Asid, CpuId, Pfn, Pte, Rights, Vpn};

use crate::cpu::Ipl;
use crate::sim::{KFuture, Sim, World};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PmapId(pub u32);

/// The kernel pmap: in use on every online CPU.
pub const KERNEL_PMAP: PmapId = PmapId(0);

/// A set of CPUs (up to 1024), as a bit vector.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuSet(Vec<u64>);

impl CpuSet {
    pub fn new(cpus: usize) -> CpuSet {
        CpuSet(vec![0; cpus.div_ceil(64)])
    }
    pub fn insert(&mut self, c: CpuId) {
        self.0[c.index() / 64] |= 1 << (c.index() % 64);
    }
    pub fn remove(&mut self, c: CpuId) {
        self.0[c.index() / 64] &= !(1 << (c.index() % 64));
    }
    pub fn contains(&self, c: CpuId) -> bool {
        self.0[c.index() / 64] & (1 << (c.index() % 64)) != 0
    }
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }
    pub fn iter(&self) -> impl Iterator<Item = CpuId> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            (0..64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| CpuId((i * 64 + b) as u16))
        })
    }
}

/// A physical map: one address space's page tables.
pub struct Pmap {
    pub id: PmapId,
    pub root: Pfn,
    pub kernel: bool,
    pub asid: Asid,
    /// CPUs using this pmap (black89's `pmap->in_use`).
    pub in_use: CpuSet,
    /// The pmap's spin lock holder.
    pub lock: Option<CpuId>,
    /// Page-table frames (root included), freed when the pmap dies.
    pub tables: Vec<Pfn>,
    pub alive: bool,
}

/// Per-CPU level-1 directories (balan92 §Background, §Multiprocessor
/// Interfaces, on the i386): each CPU's MMU walks its own directory frame.
/// Its kernel entries are shared: identical in every CPU's directory,
/// written into every copy when the kernel maps a new level-2 table. Its
/// user entries are those of the address space the CPU runs, copied in by
/// `hat_asload` and cleared by `hat_asunload`. The per-address-space root
/// (`Pmap::root`) stays the HAT's master copy; every change to a master's
/// level-1 entries reaches each directory holding a copy
/// ([`World::l1_sync`]). A protocol turns this on in `init`
/// ([`Sim::enable_percpu_l1`]); otherwise every CPU walks the address
/// space's own root.
#[derive(Clone, Debug)]
pub struct PerCpuL1 {
    /// Per CPU: its directory frame.
    pub dirs: Vec<Pfn>,
    /// Per CPU: the user address space whose level-1 entries its directory
    /// holds.
    pub loaded: Vec<Option<PmapId>>,
    /// The first level-1 index of the kernel's part.
    pub kernel_first: usize,
}

/// What an update does to each mapped page of its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Invalidate the mappings (pmap_remove / hat_unload).
    Remove,
    /// Take away write access (pmap_protect to read-only).
    ReadOnly,
    /// Clear the modify bit (pageout; a reduction, see the oracle).
    ClearModify,
}

/// A rights reduction on a virtual range of one pmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Update {
    pub pmap: PmapId,
    pub start: Vpn,
    pub pages: u64,
    pub change: Change,
}

/// What editing the page tables did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PtEdit {
    /// PTEs whose value changed.
    pub changed: u64,
    /// Latency of those PTE stores through the cache hierarchy (0 on flat
    /// memory, where protocols charge `pte_write_cycles` per change).
    pub mem_cycles: Cycles,
}

/// A translation-coherence mechanism behind the pmap/HAT interface.
///
/// Every method runs on `cpu` in kernel mode as part of the VM operation
/// that CPU is carrying out; the VM layer declares the operation complete
/// when the returned future finishes, unless the protocol deferred it
/// ([`Sim::defer_completion`]) or completed it earlier itself.
pub trait Protocol {
    fn name(&self) -> &'static str;

    /// Called once before the run: set up per-CPU state.
    fn init(&self, _sim: &Sim) {}

    /// The TLB-coherence hardware this protocol assumes: software
    /// shootdowns (the default), UNITD, or ideal invalidation
    /// (romanescu10). Anything but `Software` needs a `[memory]` hierarchy.
    fn tlb_hardware(&self) -> crate::memory::TlbHardware {
        crate::memory::TlbHardware::Software
    }

    /// The level of this protocol's consistency interrupt.
    fn interrupt_level(&self) -> Ipl {
        Ipl::ALL
    }

    /// Reduce rights on a range (pmap_remove, pmap_protect, clearing M):
    /// edit the PTEs and make every TLB consistent.
    fn update<'a>(&'a self, sim: &'a Sim, cpu: CpuId, u: Update) -> KFuture<'a>;

    /// Enter a mapping (pmap_enter). Increases rights only, so by default
    /// no other TLB is touched (black89 §3, technique 3).
    fn enter<'a>(
        &'a self,
        sim: &'a Sim,
        cpu: CpuId,
        pmap: PmapId,
        vpn: Vpn,
        pfn: Pfn,
        writable: bool,
    ) -> KFuture<'a> {
        Box::pin(async move {
            sim.enter_or_stop(cpu, pmap, vpn, pfn, writable).await;
        })
    }

    /// Reader/writer sleep locks in the VM layer, first built for balan92
    /// §Locking Design: the VM layer takes SVR4.2's page-layer
    /// locks around HAT calls (`hat_memload` with the page's sleep lock
    /// held in reader mode, `hat_pageunload` with its sleep lock in writer
    /// mode and its spin lock) and fork takes the anon and swap
    /// reservation locks. Off by default (other protocols keep the
    /// lock-free VM layer and their timings). romanescu10's protocols
    /// (`linux`, `unitd`, `ideal`) turn it on too: the segment lock is
    /// then Linux's `mmap_sem` (faults read, memory calls write, waiters
    /// sleep) and the page locks stand for `lock_page` and the PTE lock's
    /// re-check.
    fn rw_vm_locks(&self) -> bool {
        false
    }

    /// A reader/writer address-map lock without the rest of SVR4.2's VM
    /// locking: Mach's vm_map lock, a complex lock (`lock_t`, kern/lock.c)
    /// that `vm_map_lookup` takes with `vm_map_lock_read` for a fault and
    /// map changes take with `vm_map_lock` (read in the sources for
    /// `vm_map_machine_attribute`; that `vm_map_protect`, `vm_map_enter`
    /// and `vm_map_delete` do the same is [A], from that pattern, not read),
    /// initialised `lock_init(&map->lock, TRUE)`
    /// (a waiter spins `lock_wait_time` loop iterations, then sleeps).
    /// Faults take the task's map lock shared, memory calls exclusive;
    /// waiters sleep ([`Sim::sleep_lock`]). Concurrent faults on one task
    /// are then serialised per page as Mach's busy bit and object lock do
    /// (the page layer's page sleep locks and page-hash lock, shared with
    /// `rw_vm_locks`); fork takes no anon or swap reservation locks.
    /// Off by default (every other protocol keeps its map lock and its
    /// outputs).
    ///
    /// Waiters sleep at once [A]: Mach's waiter first spins
    /// `lock_wait_time` loop iterations (100 with NCPUS > 1, kern/lock.c),
    /// then `thread_sleep`s. At a few instructions an iteration that spin
    /// is ~100-150 µs on the Multimax [A], shorter than the holds a
    /// waiter meets (a memory call through its shootdown, ~600 µs and
    /// more), so the model leaves it out and charges the switch back in
    /// (`context_switch_cycles`) on every wait. Model limit (the kernel's
    /// one kernel context per CPU): the sleeper's CPU runs nothing else
    /// and keeps the task's address space loaded, so it is still shot at
    /// and answers as an active CPU; Mach would run another thread there
    /// or go idle. Readers queue behind a waiting writer, FIFO
    /// (`sleeplock`), as Mach's `lock_read` waits while `want_write` is
    /// set. Mach's fault takes the map lock again (`vm_map_verify`) only
    /// with MACH_XP's map versions; the model holds it shared for the
    /// whole fault (`vm_map_lookup` to `vm_map_lookup_done`) [A].
    fn rw_map_lock(&self) -> bool {
        false
    }

    /// Linux's lazy TLB mode: a CPU that goes idle keeps the address space
    /// of the thread it last ran loaded (still in its user set, Linux's
    /// `cpu_vm_mask`) instead of unloading it, so a thread of the same
    /// task that runs there next needs no CR3 load; the protocol's
    /// shootdown handler makes it leave (`Sim::leave_mm_lazily`). Off by
    /// default: the other kernels unload at once.
    fn lazy_tlb(&self) -> bool {
        false
    }

    /// `hat_pageunload(pp)`: unload every translation of physical page
    /// `pfn`. With [`Protocol::rw_vm_locks`] it is entered holding the
    /// page's spin lock (`Sim::page_locks`) and must return holding it.
    /// Default: one `Remove` update per mapping.
    fn page_unload<'a>(&'a self, sim: &'a Sim, cpu: CpuId, pfn: Pfn) -> KFuture<'a> {
        Box::pin(async move {
            let chain = sim.w().mappings_of(pfn);
            for (pmap, vpn) in chain {
                let u = Update {
                    pmap,
                    start: vpn,
                    pages: 1,
                    change: Change::Remove,
                };
                self.update(sim, cpu, u).await;
            }
        })
    }

    /// Start using `pmap` on `cpu` (context switch in).
    fn activate<'a>(&'a self, sim: &'a Sim, cpu: CpuId, pmap: PmapId) -> KFuture<'a> {
        Box::pin(async move {
            let c = sim.load_pmap(cpu, pmap);
            sim.delay(cpu, c).await;
        })
    }

    /// Stop using `pmap` on `cpu` (context switch out).
    fn deactivate<'a>(&'a self, sim: &'a Sim, cpu: CpuId, pmap: PmapId) -> KFuture<'a> {
        Box::pin(async move {
            sim.unload_pmap(cpu, pmap);
        })
    }

    /// The protocol's consistency interrupt handler.
    fn interrupt<'a>(&'a self, _sim: &'a Sim, _cpu: CpuId) -> KFuture<'a> {
        Box::pin(async {})
    }

    /// The CPU enters the idle loop.
    fn idle_enter<'a>(&'a self, _sim: &'a Sim, _cpu: CpuId) -> KFuture<'a> {
        Box::pin(async {})
    }

    /// The CPU leaves the idle loop to run a thread.
    fn idle_exit<'a>(&'a self, _sim: &'a Sim, _cpu: CpuId) -> KFuture<'a> {
        Box::pin(async {})
    }

    /// A CPU comes online (SVR4.2 hat_online) or goes offline.
    fn online<'a>(&'a self, _sim: &'a Sim, _cpu: CpuId) -> KFuture<'a> {
        Box::pin(async {})
    }
    fn offline<'a>(&'a self, _sim: &'a Sim, _cpu: CpuId) -> KFuture<'a> {
        Box::pin(async {})
    }

    /// balan92 §Multiprocessor Interfaces, `hat_getshootcookie()`: an
    /// opaque age of the TLBs, for lazy kernel shootdowns. `None` (the
    /// default): the protocol has no lazy kernel shootdown; the VM layer
    /// then never reuses a freed kernel address and completes every kernel
    /// unload when the pmap call returns.
    fn hat_getshootcookie(&self, _sim: &Sim) -> Option<u64> {
        None
    }

    /// balan92 `hat_shutdown(cookie, flag)`: flush every online CPU whose
    /// TLB is older than the cookie (all of them for
    /// [`Cookie::NoCookie`]). Only called when `hat_getshootcookie` gives
    /// cookies, or by the measurement system call.
    fn hat_shutdown<'a>(&'a self, _sim: &'a Sim, _cpu: CpuId, _cookie: Cookie) -> KFuture<'a> {
        Box::pin(async {})
    }
}

/// The argument of `hat_shutdown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cookie {
    /// A value from `hat_getshootcookie`.
    Age(u64),
    /// `HAT_NOCOOKIE`: flush every online CPU (balan92 Fig. 1's basic cost).
    NoCookie,
}

pub fn rights_of(pte: Pte) -> Rights {
    if pte.present() {
        Rights {
            present: true,
            writable: pte.writable(),
            modified: pte.modified(),
            pfn: pte.pfn(),
        }
    } else {
        Rights::NONE
    }
}

impl World {
    /// The level-1 table `cpu`'s MMU walks for an address of `pmap`: its
    /// own directory with per-CPU directories, else the pmap's root.
    #[inline]
    pub fn walk_root(&self, cpu: CpuId, pmap: PmapId) -> Pfn {
        match &self.percpu_l1 {
            Some(l1) => l1.dirs[cpu.index()],
            None => self.pmaps[pmap.0 as usize].root,
        }
    }

    /// Copies `pmap`'s (the master's) level-1 entries into every per-CPU
    /// directory holding a copy: every directory for the kernel, those
    /// that loaded it for a user address space. Returns the entries
    /// written (for costing); 0 without per-CPU directories.
    pub fn l1_sync(&mut self, pmap: PmapId) -> u64 {
        let Some(l1) = &self.percpu_l1 else {
            return 0;
        };
        let kf = l1.kernel_first;
        let root = self.pmaps[pmap.0 as usize].root;
        let kernel = self.pmaps[pmap.0 as usize].kernel;
        let targets: Vec<Pfn> = l1
            .dirs
            .iter()
            .zip(&l1.loaded)
            .filter(|&(_, &ld)| kernel || ld == Some(pmap))
            .map(|(&d, _)| d)
            .collect();
        let range = if kernel {
            kf..self.mem.table(root).len()
        } else {
            0..kf
        };
        let master: Vec<u64> = self.mem.table(root)[range.clone()].to_vec();
        let mut written = 0;
        for d in targets {
            let dir = &mut self.mem.table_mut(d)[range.clone()];
            for (e, &m) in dir.iter_mut().zip(&master) {
                if *e != m {
                    *e = m;
                    written += 1;
                }
            }
        }
        written
    }

    /// `hat_asload`'s copy-in (`Some`) or `hat_asunload`'s clear (`None`)
    /// of the user level-1 entries of `cpu`'s directory. Returns the
    /// entries written; 0 without per-CPU directories.
    pub fn l1_load(&mut self, cpu: CpuId, pmap: Option<PmapId>) -> u64 {
        let Some(l1) = &mut self.percpu_l1 else {
            return 0;
        };
        let kf = l1.kernel_first;
        let d = l1.dirs[cpu.index()];
        l1.loaded[cpu.index()] = pmap;
        let master: Vec<u64> = match pmap {
            Some(p) if self.pmaps[p.0 as usize].alive => {
                let root = self.pmaps[p.0 as usize].root;
                self.mem.table(root)[..kf].to_vec()
            }
            _ => vec![0; kf],
        };
        let mut written = 0;
        for (e, &m) in self.mem.table_mut(d)[..kf].iter_mut().zip(&master) {
            if *e != 0 || m != 0 {
                written += 1;
            }
            *e = m;
        }
        written
    }

    /// Checks the per-CPU directories against their masters (an
    /// invariant: a stale copy would let an MMU walk a table the HAT has
    /// detached). Panics naming the CPU and entry.
    pub fn l1_assert_consistent(&self) {
        let Some(l1) = &self.percpu_l1 else { return };
        let kf = l1.kernel_first;
        let kroot = self.pmaps[KERNEL_PMAP.0 as usize].root;
        for (i, (&d, &ld)) in l1.dirs.iter().zip(&l1.loaded).enumerate() {
            let dir = self.mem.table(d);
            assert_eq!(
                &dir[kf..],
                &self.mem.table(kroot)[kf..],
                "cpu{i}'s directory: kernel entries differ from the kernel's"
            );
            match ld {
                Some(p) if self.pmaps[p.0 as usize].alive => {
                    let root = self.pmaps[p.0 as usize].root;
                    assert_eq!(
                        &dir[..kf],
                        &self.mem.table(root)[..kf],
                        "cpu{i}'s directory: user entries differ from pmap {}'s",
                        p.0
                    );
                }
                _ => assert!(
                    dir[..kf].iter().all(|&e| e == 0),
                    "cpu{i}'s directory holds user entries of no loaded address space"
                ),
            }
        }
    }

    /// Walks a range one leaf table's span at a time: `f(world, first,
    /// end, slot)` gets each span's vpns `first..end` and, when its leaf
    /// table exists, the table and the index of `first` in it. `f`
    /// returns false to stop. Missing tables cost one lookup for a whole
    /// span (black89 §7.2: a missing second-level table means a whole
    /// page of entries is missing).
    fn walk_leaf_spans(
        &mut self,
        pmap: PmapId,
        start: Vpn,
        pages: u64,
        mut f: impl FnMut(&mut World, u64, u64, Option<(Pfn, usize)>) -> bool,
    ) {
        let fmt = self.cfg.pt_format;
        let root = self.pmaps[pmap.0 as usize].root;
        let span = fmt.pages_per_entry(fmt.levels() - 2);
        let end = start.0 + pages;
        let mut v = start.0;
        let mut none = Vec::new();
        while v < end {
            let slot = leaf_slot(&mut self.mem, fmt, root, Vpn(v), false, &mut none)
                .expect("no allocation");
            let span_end = ((v / span + 1) * span).min(end);
            if !f(self, v, span_end, slot) {
                return;
            }
            v = span_end;
        }
    }

    /// Visits the present last-level PTEs of a range, skipping whole
    /// missing tables.
    pub fn for_each_present(
        &mut self,
        pmap: PmapId,
        start: Vpn,
        pages: u64,
        mut f: impl FnMut(&mut World, Vpn, Pfn, usize, Pte),
    ) {
        self.walk_leaf_spans(pmap, start, pages, |w, first, end, slot| {
            if let Some((table, index)) = slot {
                for (i, v) in (first..end).enumerate() {
                    let pte = Pte(w.mem.table(table)[index + i]);
                    if pte.present() {
                        f(w, Vpn(v), table, index + i, pte);
                    }
                }
            }
            true
        });
    }

    /// True when any page of the range is mapped (lazy evaluation check).
    pub fn any_mapped(&mut self, pmap: PmapId, start: Vpn, pages: u64) -> bool {
        let mut found = false;
        self.for_each_present(pmap, start, pages, |_, _, _, _, _| found = true);
        found
    }

    /// True when any level-2 (leaf) table of the range exists. black89
    /// §7.2: with the valid-mapping check off, the Multimax pmap still
    /// skips a range whose second-level table is missing (it "knows that
    /// an entire page of second level entries is missing").
    pub fn any_leaf_table(&mut self, pmap: PmapId, start: Vpn, pages: u64) -> bool {
        let mut found = false;
        self.walk_leaf_spans(pmap, start, pages, |_, _, _, slot| {
            found = slot.is_some();
            !found
        });
        found
    }

    /// Creates the level-2 tables covering `pages` pages from `start` in
    /// `pmap` (no page is mapped): a pmap that allocates the kernel's page
    /// tables at bootstrap, as Mach pmaps do, calls it at boot. Returns
    /// the tables made, or an error when physical memory runs out.
    pub fn preallocate_tables(
        &mut self,
        pmap: PmapId,
        start: Vpn,
        pages: u64,
    ) -> Result<usize, mmulab_machine::physmem::OutOfMemory> {
        let fmt = self.cfg.pt_format;
        let root = self.pmaps[pmap.0 as usize].root;
        let span = fmt.pages_per_entry(fmt.levels() - 2);
        let end = start.0 + pages;
        let mut v = start.0;
        let mut made = Vec::new();
        while v < end {
            let r = leaf_slot(&mut self.mem, fmt, root, Vpn(v), true, &mut made);
            if let Err(e) = r {
                self.pmaps[pmap.0 as usize].tables.extend(made);
                return Err(e);
            }
            v = (v / span + 1) * span;
        }
        let n = made.len();
        self.pmaps[pmap.0 as usize].tables.extend(made);
        if n > 0 {
            self.l1_sync(pmap);
        }
        Ok(n)
    }

    /// Applies an update to the page tables, recording each change with the
    /// oracle under the operation `cpu` is carrying out.
    pub fn pt_apply(&mut self, cpu: CpuId, u: &Update) -> PtEdit {
        let op = self.cpus[cpu.index()].op;
        let space = u.pmap.0;
        let mut changed = 0;
        let mut mem_cycles = Cycles(0);
        let fmt = self.cfg.pt_format;
        self.for_each_present(u.pmap, u.start, u.pages, |w, vpn, table, index, pte| {
            let new = match u.change {
                Change::Remove => Pte(0),
                Change::ReadOnly => pte.without(Pte::WRITABLE),
                Change::ClearModify => pte.without(Pte::MODIFIED),
            };
            if new != pte {
                w.mem.table_mut(table)[index] = new.0;
                // With caches the edit is a store: under UNITD it performs
                // only once every TLB copy is invalidated (§5.3.2).
                mem_cycles += w.pte_store(cpu, fmt.pte_pa(table, index));
                let slot = w.oracle.slot(space, vpn);
                w.oracle.record_pte(slot, rights_of(new), op);
                w.reduction_stored(slot);
                if !new.present() {
                    w.pv_remove(pte.pfn(), u.pmap, vpn);
                }
                changed += 1;
            }
        });
        PtEdit {
            changed,
            mem_cycles,
        }
    }

    /// Removes the whole last-level tables inside `u`'s range by clearing
    /// the upper-level entry that points at each (a range unmap the way a
    /// kernel frees page-table pages), and returns what it did. romanescu10
    /// §4.1: a translation is tagged with its *last-level* PTE, so a change
    /// to an upper-level entry must reach the PTEs under it: with
    /// `push_down` every present PTE is cleared by a store first (under
    /// UNITD each store invalidates the TLB copies) and the emptied table is
    /// freed. Without it only the upper entry changes (a negative control:
    /// the stale entries survive). Partial tables at the ends of the range
    /// are left to [`World::pt_apply`]; the returned ranges are those.
    pub fn pt_remove_tables(
        &mut self,
        cpu: CpuId,
        u: &Update,
        push_down: bool,
    ) -> (PtEdit, Vec<(Vpn, u64)>) {
        debug_assert_eq!(u.change, Change::Remove);
        let fmt = self.cfg.pt_format;
        let upper = fmt.levels() - 2;
        let span = fmt.pages_per_entry(upper);
        let op = self.cpus[cpu.index()].op;
        let root = self.pmaps[u.pmap.0 as usize].root;
        let (start, end) = (u.start.0, u.start.0 + u.pages);
        let first = start.div_ceil(span) * span;
        let mut edit = PtEdit::default();
        let mut rest = Vec::new();
        if first >= end || end - first < span {
            rest.push((u.start, u.pages));
            return (edit, rest);
        }
        let last = end / span * span;
        if first > start {
            rest.push((u.start, first - start));
        }
        if last < end {
            rest.push((Vpn(last), end - last));
        }
        let mut cleared = Vec::new();
        let mut v = first;
        while v < last {
            let wk = walk(&self.mem, fmt, root, Vpn(v));
            if (wk.levels_read as usize) < fmt.levels() {
                // No last-level table here.
                v += span;
                continue;
            }
            let pde_pa = wk.path[upper];
            let pde_table = Pfn(pde_pa >> fmt.page_shift());
            let pde_index = ((pde_pa & ((1 << fmt.page_shift()) - 1)) / fmt.pte_bytes()) as usize;
            let pde = Pte(self.mem.table(pde_table)[pde_index]);
            if pde.present() {
                let leaf = pde.pfn();
                for i in 0..fmt.entries(fmt.levels() - 1) {
                    let pte = Pte(self.mem.table(leaf)[i]);
                    if !pte.present() {
                        continue;
                    }
                    let vpn = Vpn(v + i as u64);
                    if push_down {
                        self.mem.table_mut(leaf)[i] = 0;
                        edit.mem_cycles += self.pte_store(cpu, fmt.pte_pa(leaf, i));
                    }
                    let slot = self.oracle.slot(u.pmap.0, vpn);
                    self.oracle.record_pte(slot, Rights::NONE, op);
                    if push_down {
                        self.reduction_stored(slot);
                    } else {
                        cleared.push(slot);
                    }
                    self.pv_remove(pte.pfn(), u.pmap, vpn);
                    edit.changed += 1;
                }
                self.mem.table_mut(pde_table)[pde_index] = 0;
                edit.mem_cycles += self.pte_store(cpu, pde_pa);
                // Without the push-down only this store was made: the
                // PTEs under it count as changed by it.
                for slot in cleared.drain(..) {
                    self.reduction_stored(slot);
                }
                edit.changed += 1;
                if push_down {
                    // Emptied by the stores above: free it now.
                    let tables = &mut self.pmaps[u.pmap.0 as usize].tables;
                    let at = tables
                        .iter()
                        .position(|&t| t == leaf)
                        .expect("the pmap's table");
                    tables.swap_remove(at);
                    self.mem.free(leaf);
                }
                self.counters.add("pmap.tables_removed", 1);
            }
            v += span;
        }
        self.l1_sync(u.pmap);
        (edit, rest)
    }

    fn pv_remove(&mut self, pfn: Pfn, pmap: PmapId, vpn: Vpn) {
        if let Some(list) = self.pv.get_mut(&pfn.0) {
            if let Some(i) = list.iter().position(|&(p, v)| p == pmap && v == vpn) {
                list.swap_remove(i);
            }
            if list.is_empty() {
                self.pv.remove(&pfn.0);
            }
        }
    }

    /// The mappings of a physical page (its pv list), in a stable order.
    pub fn mappings_of(&self, pfn: Pfn) -> Vec<(PmapId, Vpn)> {
        let mut v = self.pv.get(&pfn.0).cloned().unwrap_or_default();
        v.sort();
        v
    }

    /// The current PTE of a page, if its tables exist.
    pub fn pte(&self, pmap: PmapId, vpn: Vpn) -> Pte {
        let fmt = self.cfg.pt_format;
        walk(&self.mem, fmt, self.pmaps[pmap.0 as usize].root, vpn).pte
    }
}

impl Sim {
    /// Turns on per-CPU level-1 directories ([`PerCpuL1`]); a protocol
    /// calls it from `init`, before any mapping exists beyond the
    /// kernel's. Only for two-level i386 tables, where the user/kernel
    /// split falls on a level-1 boundary; returns whether it is on.
    pub fn enable_percpu_l1(&self) -> bool {
        let mut w = self.w();
        let fmt = w.cfg.pt_format;
        if fmt != mmulab_machine::PtFormat::I386 {
            return false;
        }
        let kernel_first = fmt.index(Vpn(crate::sim::KERNEL_BASE >> crate::sim::PAGE_SHIFT), 0);
        let n = w.cpus.len();
        let mut dirs = Vec::with_capacity(n);
        for _ in 0..n {
            let d = w
                .mem
                .alloc_table(fmt.entries(0))
                .expect("memory for the per-CPU directories");
            dirs.push(d);
        }
        w.percpu_l1 = Some(PerCpuL1 {
            dirs,
            loaded: vec![None; n],
            kernel_first,
        });
        w.l1_sync(KERNEL_PMAP);
        true
    }

    /// Enters a mapping in the page tables (no TLB action). Returns the
    /// cost, or the size of a physical memory too full for a new page
    /// table (the mapping is not entered; [`Sim::enter_or_stop`] then ends
    /// the run).
    pub fn pt_enter(
        &self,
        cpu: CpuId,
        pmap: PmapId,
        vpn: Vpn,
        pfn: Pfn,
        writable: bool,
    ) -> Result<Cycles, mmulab_machine::physmem::OutOfMemory> {
        let mut w = self.w();
        let fmt = w.cfg.pt_format;
        let costs = w.cfg.costs.clone();
        let op = w.cpus[cpu.index()].op;
        let p = &w.pmaps[pmap.0 as usize];
        let (root, kernel) = (p.root, p.kernel);
        let mut new_tables = Vec::new();
        let (table, index) = match leaf_slot(&mut w.mem, fmt, root, vpn, true, &mut new_tables) {
            Ok(slot) => slot.expect("created"),
            Err(e) => {
                // Tables made before the one that failed are linked in:
                // keep them accounted to the pmap.
                w.pmaps[pmap.0 as usize].tables.extend(new_tables);
                return Err(e);
            }
        };
        let n_new = new_tables.len() as u64;
        w.pmaps[pmap.0 as usize].tables.extend(new_tables);
        // A new level-2 table is a new level-1 entry: into every per-CPU
        // directory holding a copy (the kernel's: every CPU's).
        let copies = if n_new > 0 { w.l1_sync(pmap) } else { 0 };
        let old = Pte(w.mem.table(table)[index]);
        assert!(
            !old.present() || old.pfn() == pfn,
            "pmap_enter over a live mapping of another frame ({vpn} in pmap {}): the VM layer must remove it first",
            pmap.0
        );
        let mut new = Pte::new(pfn, writable, !kernel);
        if kernel {
            new = new.with(Pte::GLOBAL);
        }
        if old.present() {
            new = new.with(old.0 & (Pte::REFERENCED | Pte::MODIFIED));
        }
        w.mem.table_mut(table)[index] = new.0;
        let store = w.pte_store(cpu, fmt.pte_pa(table, index));
        let slot = w.oracle.slot(pmap.0, vpn);
        w.oracle.record_pte(slot, rights_of(new), op);
        w.reduction_stored(slot);
        if !old.present() {
            w.pv.entry(pfn.0).or_default().push((pmap, vpn));
        }
        Ok(
            Cycles(costs.pte_write_cycles * (1 + n_new + copies) + costs.mem_cycles * n_new)
                + store,
        )
    }

    /// [`Sim::pt_enter`] and its cost; a memory too full for a page table
    /// ends the run (see [`Sim::exhausted`]).
    pub async fn enter_or_stop(
        &self,
        cpu: CpuId,
        pmap: PmapId,
        vpn: Vpn,
        pfn: Pfn,
        writable: bool,
    ) {
        match self.pt_enter(cpu, pmap, vpn, pfn, writable) {
            Ok(c) => self.delay(cpu, c).await,
            Err(e) => {
                self.exhausted(cpu, crate::sim::out_of_frames(e.frames))
                    .await
            }
        }
    }

    /// Loads `pmap` on `cpu` (CR3 load): marks it in use and, without
    /// ASIDs, flushes the non-global TLB entries. Returns the cost.
    pub fn load_pmap(&self, cpu: CpuId, pmap: PmapId) -> Cycles {
        let mut w = self.w();
        let flush = w.cfg.costs.tlb_flush_all_cycles;
        w.pmaps[pmap.0 as usize].in_use.insert(cpu);
        let c = &mut w.cpus[cpu.index()];
        c.pmap = Some(pmap);
        if c.tlb.config().asid {
            Cycles(0)
        } else {
            c.flush_tlbs_non_global();
            w.pcam_sync(cpu);
            Cycles(flush)
        }
    }

    /// True while `cpu`'s thread is blocked on a sleep lock (its CPU idle,
    /// in Linux's lazy TLB mode).
    pub fn lock_sleeping(&self, cpu: CpuId) -> bool {
        self.w().cpus[cpu.index()].lock_sleeping
    }

    /// True while `cpu` runs the idle task: its thread sleeps on a lock,
    /// or it has no thread (the idle loop). Under a `lazy_tlb` protocol
    /// it may still hold a user address space, lazily.
    pub fn runs_idle_task(&self, cpu: CpuId) -> bool {
        let c = &self.w().cpus[cpu.index()];
        c.lock_sleeping || c.idle
    }

    /// Linux's `leave_mm` for a CPU in lazy TLB mode: it leaves `pmap`'s
    /// user set (no later shootdown of `pmap` interrupts it) and loads the
    /// kernel's tables, flushing the user entries. A sleeping thread loads
    /// `pmap` again when it is switched back in; an idle CPU loads whatever
    /// it runs next. Returns the flush's cost.
    pub fn leave_mm_lazily(&self, cpu: CpuId, pmap: PmapId) -> Cycles {
        assert!(
            self.runs_idle_task(cpu),
            "{cpu} leaves an address space lazily while a thread runs there"
        );
        let c = self.tlb_flush_user(cpu);
        self.unload_pmap(cpu, pmap);
        if self.lock_sleeping(cpu) {
            self.w().cpus[cpu.index()].lazy_left = Some(pmap);
        }
        c
    }

    pub fn unload_pmap(&self, cpu: CpuId, pmap: PmapId) {
        let mut w = self.w();
        w.pmaps[pmap.0 as usize].in_use.remove(cpu);
        let c = &mut w.cpus[cpu.index()];
        if c.pmap == Some(pmap) {
            c.pmap = None;
        }
    }

    /// Invalidates a range from `cpu`'s own TLB: per entry up to
    /// `threshold` pages, a full flush beyond (black89 §4, detail 1).
    /// Returns the cost.
    pub fn tlb_invalidate_range(
        &self,
        cpu: CpuId,
        pmap: PmapId,
        start: Vpn,
        pages: u64,
        threshold: u64,
    ) -> Cycles {
        let mut w = self.w();
        let costs = w.cfg.costs.clone();
        let asid = w.pmaps[pmap.0 as usize].asid;
        let c = &mut w.cpus[cpu.index()];
        if pages > threshold {
            c.flush_tlbs();
            w.counters.add("tlb.full_flushes", 1);
            w.pcam_sync(cpu);
            Cycles(costs.tlb_flush_all_cycles)
        } else {
            for v in start.0..start.0 + pages {
                c.invalidate_page_tlbs(Vpn(v), Some(asid));
            }
            w.counters.add("tlb.entry_invalidations", pages);
            w.pcam_sync(cpu);
            Cycles(costs.tlb_flush_entry_cycles * pages)
        }
    }

    /// black89 §9's remote invalidation: the hardware shoots `pages` of
    /// `pmap` out of `target`'s TLBs (per entry up to `threshold` pages, a
    /// full flush beyond) without interrupting it. No access of `target`
    /// can be in flight: accesses are parked in flight only on UNITD
    /// hardware (romanescu10 §5.1), whose protocols never invalidate
    /// another CPU's TLB in software. Returns the sender's
    /// cost: [A] one message per target, priced as an interrupt send
    /// (both are one bus write to another processor); the remote TLB's
    /// own work is the hardware's and costs no processor time.
    pub fn tlb_invalidate_remote(
        &self,
        target: CpuId,
        pmap: PmapId,
        start: Vpn,
        pages: u64,
        threshold: u64,
    ) -> Cycles {
        let _ = self.tlb_invalidate_range(target, pmap, start, pages, threshold);
        let mut w = self.w();
        assert!(
            w.cpus[target.index()].inflight.is_none(),
            "a remote invalidation met an access in flight on {target}"
        );
        w.counters.add("tlb.remote_invalidations", 1);
        Cycles(w.cfg.costs.ipi_send_cycles)
    }

    /// Flushes `cpu`'s non-global TLB entries (an x86 CR3 reload with
    /// global pages kept). Returns the cost.
    pub fn tlb_flush_user(&self, cpu: CpuId) -> Cycles {
        let mut w = self.w();
        let c = w.cfg.costs.tlb_flush_all_cycles;
        w.cpus[cpu.index()].flush_tlbs_non_global();
        w.counters.add("tlb.full_flushes", 1);
        w.pcam_sync(cpu);
        Cycles(c)
    }

    /// True when `cpu`'s current VM operation is the one named `what`
    /// (protocols that flush differently per event, like Linux's
    /// `flush_tlb_page` for a copy-on-write break).
    pub fn current_op_is(&self, cpu: CpuId, what: &str) -> bool {
        let w = self.w();
        w.cpus[cpu.index()]
            .op
            .is_some_and(|op| w.oracle.op(op).what == what)
    }

    /// Flushes `cpu`'s whole TLBs (I and D). Returns the cost.
    pub fn tlb_flush(&self, cpu: CpuId) -> Cycles {
        let mut w = self.w();
        let c = w.cfg.costs.tlb_flush_all_cycles;
        w.cpus[cpu.index()].flush_tlbs();
        w.counters.add("tlb.full_flushes", 1);
        w.pcam_sync(cpu);
        Cycles(c)
    }
}
