//! The machine-independent VM layer: tasks (address spaces) with regions
//! backed by VM objects, page faults that fill the pmap lazily (zero-fill,
//! copy-on-write through shadow objects, as in Mach), and the memory system
//! calls. It reaches the hardware only through the [`Protocol`] interface
//! and the page-table helpers protocols share.

use std::collections::BTreeMap;

use mmulab_engine::{Cycles, SimRng};
use mmulab_machine::{CpuId, Pfn, Vpn};

use crate::pmap::{Change, CpuSet, KERNEL_PMAP, Pmap, PmapId, Update};
use crate::program::{Program, Prot, Syscall};
use crate::sim::{KERNEL_BASE, PAGE_SHIFT, Sim, Trap};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub u32);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ThreadId(pub u32);

/// First user virtual page handed out by mmap.
const USER_BASE_VPN: u64 = 0x10000;

/// Pages of user address space a task's mappings may take over its life:
/// from the first mmap address up to the kernel at `KERNEL_BASE` (3 GB;
/// addresses are never reused, so this bounds every mmap a task makes).
/// Workload specs are checked against it before a run.
pub const USER_PAGES: u64 = (KERNEL_BASE >> PAGE_SHIFT) - USER_BASE_VPN;

/// The text segment, on machines with an I-TLB: one read-only page at
/// i386's traditional 0x08048000, below every mmap, holding the code the
/// user threads fetch (`Sim::fetch_instruction`).
pub const TEXT_BASE_VPN: u64 = 0x8048;
pub const TEXT_PAGES: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadState {
    Runnable,
    Running,
    Sleeping,
    Dead,
}

pub struct Thread {
    pub id: ThreadId,
    pub task: TaskId,
    pub state: ThreadState,
    pub program: Option<Box<dyn Program>>,
    pub batch: Option<crate::program::Batch>,
    /// Cycles of a `Compute` op still to run.
    pub compute_left: u64,
    /// Where the computation this thread's last slice ran in one stretch
    /// began (`Program::long_computes`): an interrupt arriving after it,
    /// but before the CPU's clock, rewinds the clock to its arrival and
    /// gives the rest back to `compute_left`. None once the slice after
    /// it starts.
    pub compute_stretch_from: Option<Cycles>,
    pub last_load: u64,
    pub ret: u64,
    pub fault: Option<u64>,
    pub(crate) trap: Option<Trap>,
    pub affinity: Option<CpuId>,
    pub rng: SimRng,
}

#[derive(Clone, Debug)]
pub struct Region {
    pub start: u64,
    pub pages: u64,
    pub prot: Prot,
    pub object: u32,
    /// Object page index of the region's first page.
    pub offset: u64,
}

pub struct Task {
    pub id: TaskId,
    pub pmap: PmapId,
    pub regions: BTreeMap<u64, Region>,
    pub threads: u32,
    pub alive: bool,
    pub next_vpn: u64,
    /// The address map's exclusive spin lock, for protocols without a
    /// reader/writer map lock (`Sim::page_layer_locks` false): faults and
    /// memory calls on one task are serialised, so that two threads
    /// faulting on one page cannot both install it.
    pub vm_lock: usize,
    /// With the reader/writer VM locks (`Protocol::rw_vm_locks`: SVR4.2's,
    /// or Linux's `mmap_sem`; or `Protocol::rw_map_lock`: Mach's vm_map
    /// lock, read-locked by a fault's `vm_map_lookup`, write-locked by
    /// map changes, waiters sleeping): the segment layer's reader/writer sleep lock (balan92 §Locking Design: "A
    /// reader/writer lock per segment. This lock is acquired in writer
    /// mode when changing the attributes of a segment ... and in reader
    /// mode when the attributes of the segment are to remain valid for
    /// the duration of operation"; "A per segment spin lock which guards
    /// the sleep lock": the sleep lock's own guard, `sleeplock`). Faults
    /// take it as reader, memory calls (mmap, munmap, mprotect, fork,
    /// exit and the other system calls) as writer; it replaces
    /// `vm_lock`, which stays unused. Model limit: one per address space,
    /// not one per segment: faults are readers, so faults on different
    /// segments never contend, as with the paper's; what differs is that
    /// a memory call on one segment also holds off faults on the others.
    pub seg_lock: Option<usize>,
    /// First page of the text segment (machines with an I-TLB only).
    pub text: Option<u64>,
}

impl Task {
    /// The address of the code line user threads fetch: the text
    /// segment's first line.
    pub fn text_va(&self) -> Option<u64> {
        self.text.map(|vpn| vpn << PAGE_SHIFT)
    }
}

/// Anonymous memory: resident pages by index, and the object it shadows
/// (copy-on-write after fork).
#[derive(Default)]
pub struct VmObject {
    pub pages: BTreeMap<u64, Pfn>,
    pub backing: Option<u32>,
    pub refs: u32,
}

fn prot_rank(p: Prot) -> u8 {
    match p {
        Prot::None => 0,
        Prot::Read => 1,
        Prot::ReadWrite => 2,
    }
}

impl Sim {
    /// A new task: an empty address space, plus a text segment on a
    /// machine with an I-TLB.
    /// Tasks are created before the run starts, when memory holds only
    /// the kernel's tables; a spec is checked to leave room for them.
    pub fn create_task(&self) -> TaskId {
        let task = self.create_empty_task().unwrap_or_else(|e| {
            panic!(
                "no frame for a new task's page-table root before the run: {}",
                crate::sim::out_of_frames(e.frames)
            )
        });
        if self.w().has_itlb() {
            // The program's code: an object of its own, mapped read-only
            // and faulted in on the first fetch like any other page.
            let obj = self.new_object(None);
            let mut w = self.w();
            let t = &mut w.tasks[task.0 as usize];
            t.text = Some(TEXT_BASE_VPN);
            t.regions.insert(
                TEXT_BASE_VPN,
                Region {
                    start: TEXT_BASE_VPN,
                    pages: TEXT_PAGES,
                    prot: Prot::Read,
                    object: obj,
                    offset: 0,
                },
            );
            debug_assert!(TEXT_BASE_VPN + TEXT_PAGES < t.next_vpn, "text below mmap");
        }
        task
    }

    /// A new task with an empty address space (a fork's child, which
    /// takes its regions, text included, from the parent).
    fn create_empty_task(&self) -> Result<TaskId, mmulab_machine::physmem::OutOfMemory> {
        let seg_lock = self
            .page_layer_locks()
            .then(|| self.new_sleep_lock(Some(crate::lockorder::LockClass::Segment)));
        let mut w = self.w();
        let fmt = w.cfg.pt_format;
        let root = w.mem.alloc_table(fmt.entries(0))?;
        let id = PmapId(w.pmaps.len() as u32);
        let n = w.cpus.len();
        // Without ASID tags the ASID is unused; with them, one per pmap
        // (wrapping is not modelled: at most 65535 address spaces).
        let asid = mmulab_machine::Asid(id.0 as u16);
        w.pmaps.push(Pmap {
            id,
            root,
            kernel: false,
            asid,
            in_use: CpuSet::new(n),
            lock: None,
            tables: vec![root],
            alive: true,
        });
        let tid = TaskId(w.tasks.len() as u32);
        w.locks.push(None);
        let vm_lock = w.locks.len() - 1;
        w.tasks.push(Task {
            id: tid,
            pmap: id,
            regions: BTreeMap::new(),
            threads: 0,
            alive: true,
            next_vpn: USER_BASE_VPN,
            vm_lock,
            seg_lock,
            text: None,
        });
        Ok(tid)
    }

    pub fn task_pmap(&self, t: TaskId) -> PmapId {
        self.w().tasks[t.0 as usize].pmap
    }

    /// A new runnable thread in `task`.
    pub fn spawn_thread(
        &self,
        task: TaskId,
        program: Box<dyn Program>,
        affinity: Option<CpuId>,
    ) -> ThreadId {
        let id = {
            let mut w = self.w();
            let id = ThreadId(w.threads.len() as u32);
            let seed = w.cfg.seed;
            w.threads.push(Thread {
                id,
                task,
                state: ThreadState::Sleeping,
                program: Some(program),
                batch: None,
                compute_left: 0,
                compute_stretch_from: None,
                last_load: 0,
                ret: 0,
                fault: None,
                trap: None,
                affinity,
                rng: SimRng::derive(seed, "thread", id.0 as u64),
            });
            w.tasks[task.0 as usize].threads += 1;
            w.live_threads += 1;
            id
        };
        self.make_runnable(id);
        id
    }

    fn new_object(&self, backing: Option<u32>) -> u32 {
        let mut w = self.w();
        w.objects.push(VmObject {
            pages: BTreeMap::new(),
            backing,
            refs: 1,
        });
        w.objects.len() as u32 - 1
    }

    /// True when dropping a reference to `obj` (after freeing its pages in
    /// `unshared` = (offset, pages) if no one else references it) removes
    /// pages from the page hash: the caller then holds the page-hash lock
    /// around the removal (SVR4.2), one hold per object.
    fn removes_pages(&self, obj: u32, unshared: Option<(u64, u64)>) -> bool {
        let w = self.w();
        let top = &w.objects[obj as usize];
        if let Some((offset, pages)) = unshared
            && top.refs == 1
            && top.pages.range(offset..offset + pages).next().is_some()
        {
            return true;
        }
        let mut o = Some(obj);
        while let Some(id) = o {
            let ob = &w.objects[id as usize];
            if ob.refs > 1 {
                return false;
            }
            if !ob.pages.is_empty() {
                return true;
            }
            o = ob.backing;
        }
        false
    }

    /// Drops a reference to an object, freeing its frames when it was the
    /// last one.
    fn release_object(&self, obj: u32) {
        let mut w = self.w();
        let mut next = Some(obj);
        while let Some(o) = next {
            let ob = &mut w.objects[o as usize];
            ob.refs -= 1;
            if ob.refs > 0 {
                break;
            }
            let pages = std::mem::take(&mut ob.pages);
            next = ob.backing.take();
            for (_, pfn) in pages {
                w.mem.free(pfn);
            }
        }
    }

    /// Finds the page `idx` of `obj` along the shadow chain: (frame, found
    /// in the top object).
    fn lookup_page(&self, obj: u32, idx: u64) -> Option<(Pfn, bool)> {
        let w = self.w();
        let mut o = Some(obj);
        let mut top = true;
        while let Some(id) = o {
            let ob = &w.objects[id as usize];
            if let Some(&pfn) = ob.pages.get(&idx) {
                return Some((pfn, top));
            }
            o = ob.backing;
            top = false;
        }
        None
    }

    fn region_of(&self, task: TaskId, vpn: u64) -> Option<Region> {
        let w = self.w();
        let t = &w.tasks[task.0 as usize];
        t.regions
            .range(..=vpn)
            .next_back()
            .map(|(_, r)| r.clone())
            .filter(|r| vpn < r.start + r.pages)
    }

    /// The page-fault handler: resolves the fault or marks the thread with
    /// an unrecoverable fault (SIGSEGV).
    pub(crate) async fn vm_fault(&self, cpu: CpuId, tid: ThreadId, va: u64, store: bool) {
        let task = self.w().threads[tid.0 as usize].task;
        self.seg_lock(cpu, task, false).await;
        self.vm_fault_locked(cpu, tid, va, store).await;
        self.seg_unlock(cpu, task).await;
    }

    /// Takes a task's address-map lock: with the SVR4.2 VM locks or Mach's
    /// read/write map lock its reader/writer sleep lock, as writer
    /// (`write`) or reader; else the exclusive map lock, whatever `write`
    /// says.
    pub(crate) async fn seg_lock(&self, cpu: CpuId, task: TaskId, write: bool) {
        let (seg, lock) = {
            let w = self.w();
            let t = &w.tasks[task.0 as usize];
            (t.seg_lock, t.vm_lock)
        };
        match seg {
            Some(id) => self.sleep_lock(cpu, id, write).await,
            None => self.lock(cpu, lock).await,
        }
    }

    pub(crate) async fn seg_unlock(&self, cpu: CpuId, task: TaskId) {
        let (seg, lock) = {
            let w = self.w();
            let t = &w.tasks[task.0 as usize];
            (t.seg_lock, t.vm_lock)
        };
        match seg {
            Some(id) => self.sleep_unlock(cpu, id).await,
            None => self.unlock(cpu, lock).await,
        }
    }

    /// True when `cpu` holds the task's address-map lock (either mode).
    pub(crate) fn holds_seg_lock(&self, cpu: CpuId, task: TaskId) -> bool {
        let (seg, lock) = {
            let w = self.w();
            let t = &w.tasks[task.0 as usize];
            (t.seg_lock, t.vm_lock)
        };
        match seg {
            Some(id) => self.holds_sleep_lock(cpu, id),
            None => self.w().locks[lock] == Some(cpu),
        }
    }

    async fn vm_fault_locked(&self, cpu: CpuId, tid: ThreadId, va: u64, store: bool) {
        let costs = self.costs();
        self.delay(cpu, Cycles(costs.fault_cycles)).await;
        self.count("vm.faults", 1);
        let vpn = va >> PAGE_SHIFT;
        let (task, pmap) = {
            let w = self.w();
            let task = w.threads[tid.0 as usize].task;
            (task, w.tasks[task.0 as usize].pmap)
        };
        // A fault through a stale read-only entry whose PTE is now writable
        // must refill: drop the local entry first (x86 invlpg on a spurious
        // fault).
        {
            let mut w = self.w();
            let asid = w.pmaps[pmap.0 as usize].asid;
            w.cpus[cpu.index()].invalidate_page_tlbs(Vpn(vpn), Some(asid));
            w.pcam_sync(cpu);
        }
        if va >= KERNEL_BASE {
            return self.kernel_fault(cpu, tid, vpn).await;
        }
        let region = self.region_of(task, vpn);
        let Some(region) = region.filter(|r| prot_rank(r.prot) >= if store { 2 } else { 1 }) else {
            self.count("vm.segv", 1);
            let mut w = self.w();
            let th = &mut w.threads[tid.0 as usize];
            th.fault = Some(va);
            th.batch = None;
            return;
        };
        let idx = region.offset + (vpn - region.start);
        // With the SVR4.2 VM locks, faults on one process run in parallel
        // (readers of its segment lock): two may resolve the same page at
        // once. Pages are then handled under their sleep locks (balan92
        // §Locking Design: "acquired in reader mode to ensure that the page
        // state, identity and data are valid and remain so and acquired in
        // writer mode if modifying any of the above"):
        // * a new page (zero fill, copy-on-write copy) is locked as writer
        //   at the instant it enters the object, before anyone can find
        //   it, and stays locked until it is filled and mapped;
        // * a copy-on-write break takes the old page's lock as writer and
        //   re-checks that the object still resolves to it;
        // * a load takes the page's lock as reader and re-checks the same.
        // A changed identity restarts the fault (`vm.fault_retries`).
        let rw_locks = self.page_layer_locks();
        let writable_for = |top: bool| region.prot == Prot::ReadWrite && top;
        //
        // The lookup by identity, and the insert of a new page, are made
        // under the page-hash lock (SVR4.2; a leaf, `lockorder`), in one
        // hold when the lookup misses. The re-checks under a page's sleep
        // lock compare the identity that lock guards ("to ensure that the
        // page state, identity and data are valid"): no hash lock.
        loop {
            let hash = self.page_hash_enter(cpu).await;
            let (pfn, top) = match self.lookup_page(region.object, idx) {
                Some(found) => {
                    self.page_hash_exit(cpu, hash).await;
                    found
                }
                None => {
                    // Looked up, inserted and (SVR4.2) locked in one hold
                    // of the page-hash lock: two faulters cannot both fill
                    // the slot, and no one maps the page before it is
                    // filled.
                    let pfn = self.alloc_data_or_stop(cpu).await;
                    self.w().objects[region.object as usize]
                        .pages
                        .insert(idx, pfn);
                    let held = rw_locks.then(|| self.sleep_lock_new_page(cpu, pfn));
                    self.page_hash_exit(cpu, hash).await;
                    self.count("vm.zero_fills", 1);
                    self.delay(cpu, Cycles(costs.zero_fill_cycles)).await;
                    if let Some(l) = held {
                        self.sleep_lock_guard_cost(cpu).await;
                        self.protocol()
                            .enter(self, cpu, pmap, Vpn(vpn), pfn, writable_for(true))
                            .await;
                        self.sleep_unlock(cpu, l).await;
                        return;
                    }
                    (pfn, true)
                }
            };
            let (pfn, top) = if store && !top {
                let old_lock = rw_locks.then(|| self.page_locks(pfn.0).1);
                if let Some(l) = old_lock {
                    self.sleep_lock(cpu, l, true).await;
                    if self.lookup_page(region.object, idx) != Some((pfn, top)) {
                        self.sleep_unlock(cpu, l).await;
                        self.count("vm.fault_retries", 1);
                        continue;
                    }
                }
                // Copy-on-write: copy into the top object, then replace the
                // read-only mapping of the old frame (a reduction: the frame
                // changes), then enter the copy. The copy enters the hash,
                // locked, under the page-hash lock.
                let hash = self.page_hash_enter(cpu).await;
                let new = self.alloc_data_or_stop(cpu).await;
                {
                    let mut w = self.w();
                    w.mem.copy_data(pfn, new);
                    w.objects[region.object as usize].pages.insert(idx, new);
                }
                let new_lock = rw_locks.then(|| self.sleep_lock_new_page(cpu, new));
                self.page_hash_exit(cpu, hash).await;
                if new_lock.is_some() {
                    self.sleep_lock_guard_cost(cpu).await;
                }
                self.count("vm.cow_copies", 1);
                self.delay(cpu, Cycles(costs.copy_page_cycles)).await;
                // A concurrent fault's copy-on-write break may be in the
                // L1 trick on this page table (its level-1 entry cleared,
                // the PTE still there): the mapping chain tells too.
                let mapped = {
                    let w = self.w();
                    w.pte(pmap, Vpn(vpn)).present()
                        || (rw_locks && w.mappings_of(pfn).contains(&(pmap, Vpn(vpn))))
                };
                if mapped {
                    self.reduce(
                        cpu,
                        "cow break",
                        &[Update {
                            pmap,
                            start: Vpn(vpn),
                            pages: 1,
                            change: Change::Remove,
                        }],
                    )
                    .await;
                }
                if let (Some(old), Some(new_l)) = (old_lock, new_lock) {
                    self.sleep_unlock(cpu, old).await;
                    self.protocol()
                        .enter(self, cpu, pmap, Vpn(vpn), new, writable_for(true))
                        .await;
                    self.sleep_unlock(cpu, new_l).await;
                    return;
                }
                (new, true)
            } else {
                (pfn, top)
            };
            let expect = (region.object, idx, pfn, top);
            if self
                .hat_memload_checked(cpu, pmap, Vpn(vpn), pfn, writable_for(top), Some(expect))
                .await
            {
                return;
            }
            self.count("vm.fault_retries", 1);
        }
    }

    /// The anon and swap layers' reservation locks (allocated on first use).
    fn resv_locks(&self) -> (usize, usize) {
        if let Some(l) = self.w().resv_locks {
            return l;
        }
        let anon = self.new_lock();
        self.set_lock_class(anon, crate::lockorder::LockClass::AnonResv);
        let swap = self.new_lock();
        self.set_lock_class(swap, crate::lockorder::LockClass::SwapResv);
        self.w().resv_locks = Some((anon, swap));
        (anon, swap)
    }

    /// `hat_memload` as the VM layer calls it (balan92 §Examples of the
    /// Locking requirements: "Called with the reader/writer lock for the
    /// physical page held. The caller can not hold any spin locks"): with
    /// the SVR4.2 VM locks, the page's sleep lock is taken in reader mode
    /// around the call.
    pub(crate) async fn hat_memload(
        &self,
        cpu: CpuId,
        pmap: PmapId,
        vpn: Vpn,
        pfn: Pfn,
        writable: bool,
    ) {
        let loaded = self
            .hat_memload_checked(cpu, pmap, vpn, pfn, writable, None)
            .await;
        assert!(loaded, "an unchecked hat_memload always loads");
    }

    /// [`Sim::hat_memload`] for a fault: with the SVR4.2 VM locks, once
    /// the page's sleep lock is held, `expect` (object, index, frame, top)
    /// must still be what the object resolves to; false (nothing loaded)
    /// when it is not.
    async fn hat_memload_checked(
        &self,
        cpu: CpuId,
        pmap: PmapId,
        vpn: Vpn,
        pfn: Pfn,
        writable: bool,
        expect: Option<(u32, u64, Pfn, bool)>,
    ) -> bool {
        let p = self.protocol();
        if self.page_layer_locks() {
            let (_, sleep) = self.page_locks(pfn.0);
            self.sleep_lock(cpu, sleep, false).await;
            if let Some((obj, idx, pfn, top)) = expect
                && self.lookup_page(obj, idx) != Some((pfn, top))
            {
                self.sleep_unlock(cpu, sleep).await;
                return false;
            }
            p.enter(self, cpu, pmap, vpn, pfn, writable).await;
            self.sleep_unlock(cpu, sleep).await;
        } else {
            p.enter(self, cpu, pmap, vpn, pfn, writable).await;
        }
        true
    }

    /// A fault on pageable kernel memory: zero-fill and map it in the kernel
    /// pmap, under the kernel map's lock (two tasks may touch one kernel
    /// page at once). Outside any kernel allocation it is a bad address.
    async fn kernel_fault(&self, cpu: CpuId, tid: ThreadId, vpn: u64) {
        let lock = self.w().kernel_vm_lock;
        self.lock(cpu, lock).await;
        let inside = {
            let w = self.w();
            w.kernel_regions
                .range(..=vpn)
                .next_back()
                .is_some_and(|(&s, &n)| vpn < s + n)
        };
        let mapped = self.w().pte(KERNEL_PMAP, Vpn(vpn)).present();
        if !inside {
            self.count("vm.segv", 1);
            let mut w = self.w();
            let th = &mut w.threads[tid.0 as usize];
            th.fault = Some(vpn << PAGE_SHIFT);
            th.batch = None;
        } else if !mapped {
            let pfn = self.alloc_data_or_stop(cpu).await;
            self.count("vm.kernel_zero_fills", 1);
            let c = self.costs().zero_fill_cycles;
            self.delay(cpu, Cycles(c)).await;
            self.hat_memload(cpu, KERNEL_PMAP, Vpn(vpn), pfn, true)
                .await;
        }
        self.unlock(cpu, lock).await;
    }

    /// One VM operation that reduces rights: the oracle sees it begin, the
    /// protocol carries out each update, and it ends (complete at once
    /// unless a lazy scheme deferred it).
    async fn reduce(&self, cpu: CpuId, what: &str, updates: &[Update]) {
        self.begin_op(cpu, what);
        let p = self.protocol();
        for &u in updates {
            p.update(self, cpu, u).await;
        }
        self.end_op(cpu);
    }

    /// Splits the region containing `at` so that a region starts there.
    fn split_at(&self, task: TaskId, at: u64) {
        let mut w = self.w();
        let t = &mut w.tasks[task.0 as usize];
        let Some(r) = t.regions.range(..at).next_back().map(|(_, r)| r.clone()) else {
            return;
        };
        if r.start < at && at < r.start + r.pages {
            let first = r.pages - (r.start + r.pages - at);
            t.regions.get_mut(&r.start).expect("present").pages = first;
            let second = Region {
                start: at,
                pages: r.pages - first,
                prot: r.prot,
                object: r.object,
                offset: r.offset + first,
            };
            t.regions.insert(at, second);
            w.objects[r.object as usize].refs += 1;
        }
    }

    /// The regions fully inside [start, start + pages), after splitting.
    fn regions_in(&self, task: TaskId, start: u64, pages: u64) -> Vec<Region> {
        self.split_at(task, start);
        self.split_at(task, start + pages);
        let w = self.w();
        w.tasks[task.0 as usize]
            .regions
            .range(start..start + pages)
            .map(|(_, r)| r.clone())
            .collect()
    }

    pub(crate) async fn syscall(&self, cpu: CpuId, tid: ThreadId, s: Syscall) {
        let task = self.w().threads[tid.0 as usize].task;
        self.seg_lock(cpu, task, true).await;
        self.syscall_locked(cpu, tid, s).await;
        self.seg_unlock(cpu, task).await;
    }

    async fn syscall_locked(&self, cpu: CpuId, tid: ThreadId, s: Syscall) {
        let costs = self.costs();
        self.delay(cpu, Cycles(costs.syscall_cycles)).await;
        let task = self.w().threads[tid.0 as usize].task;
        let pmap = self.task_pmap(task);
        let ret = match s {
            Syscall::Mmap { pages, prot } => {
                assert!(pages > 0, "mmap of zero pages");
                // Addresses are never reused: a task that has mapped its
                // 3 GB (specs are checked for what they must map at
                // least) ends the run, named, rather than alias the
                // kernel's addresses.
                let start = self.w().tasks[task.0 as usize].next_vpn;
                let top = KERNEL_BASE >> PAGE_SHIFT;
                if pages >= top || start + pages >= top {
                    return self
                        .exhausted(
                            cpu,
                            format!(
                                "{pages} pages of user address space: the task has mapped up to vpn {start:#x} of the {USER_PAGES} pages below the kernel (addresses are not reused); shrink the workload's regions or steps"
                            ),
                        )
                        .await;
                }
                let obj = self.new_object(None);
                let mut w = self.w();
                let t = &mut w.tasks[task.0 as usize];
                t.next_vpn += pages + 1; // a guard page between mappings
                t.regions.insert(
                    start,
                    Region {
                        start,
                        pages,
                        prot,
                        object: obj,
                        offset: 0,
                    },
                );
                start << PAGE_SHIFT
            }
            Syscall::Munmap { va, pages } => {
                let start = va >> PAGE_SHIFT;
                let regions = self.regions_in(task, start, pages);
                self.reduce(
                    cpu,
                    "munmap",
                    &[Update {
                        pmap,
                        start: Vpn(start),
                        pages,
                        change: Change::Remove,
                    }],
                )
                .await;
                for r in regions {
                    self.w().tasks[task.0 as usize].regions.remove(&r.start);
                    let hash = if self.removes_pages(r.object, Some((r.offset, r.pages))) {
                        self.page_hash_enter(cpu).await
                    } else {
                        None
                    };
                    self.free_unshared(r.object, r.offset, r.pages);
                    self.release_object(r.object);
                    self.page_hash_exit(cpu, hash).await;
                }
                0
            }
            Syscall::Mprotect { va, pages, prot } => {
                let start = va >> PAGE_SHIFT;
                let regions = self.regions_in(task, start, pages);
                let reduces = regions.iter().any(|r| prot_rank(prot) < prot_rank(r.prot));
                {
                    let mut w = self.w();
                    for r in &regions {
                        w.tasks[task.0 as usize]
                            .regions
                            .get_mut(&r.start)
                            .expect("present")
                            .prot = prot;
                    }
                }
                if reduces {
                    let change = if prot == Prot::None {
                        Change::Remove
                    } else {
                        Change::ReadOnly
                    };
                    let updates: Vec<Update> = regions
                        .iter()
                        .filter(|r| prot_rank(prot) < prot_rank(r.prot))
                        .map(|r| Update {
                            pmap,
                            start: Vpn(r.start),
                            pages: r.pages,
                            change,
                        })
                        .collect();
                    self.reduce(cpu, "mprotect", &updates).await;
                }
                0
            }
            Syscall::Fork { child } => {
                let child_task = match self.create_empty_task() {
                    Ok(t) => t,
                    Err(e) => {
                        return self
                            .exhausted(cpu, crate::sim::out_of_frames(e.frames))
                            .await;
                    }
                };
                let text = self.w().tasks[task.0 as usize].text;
                self.w().tasks[child_task.0 as usize].text = text;
                let parent_regions: Vec<Region> = self.w().tasks[task.0 as usize]
                    .regions
                    .values()
                    .cloned()
                    .collect();
                let resv = self.protocol().rw_vm_locks().then(|| self.resv_locks());
                for r in &parent_regions {
                    if let Some((anon, swap)) = resv {
                        // balan92 §Analysis: reserving anon pages and swap
                        // space for the child, each under its layer's
                        // reservation lock (short holds; leaves).
                        self.lock(cpu, anon).await;
                        self.lock(cpu, swap).await;
                        self.unlock(cpu, swap).await;
                        self.unlock(cpu, anon).await;
                    }
                    if text == Some(r.start) {
                        // Text is shared, not copied: it is never written,
                        // so parent and child map the same object (and
                        // the same frames).
                        let mut w = self.w();
                        w.objects[r.object as usize].refs += 1;
                        w.tasks[child_task.0 as usize]
                            .regions
                            .insert(r.start, r.clone());
                        continue;
                    }
                    let orig = r.object;
                    let p_obj = self.new_object(Some(orig));
                    let c_obj = self.new_object(Some(orig));
                    let mut w = self.w();
                    w.objects[orig as usize].refs += 1;
                    w.tasks[task.0 as usize]
                        .regions
                        .get_mut(&r.start)
                        .expect("present")
                        .object = p_obj;
                    w.tasks[child_task.0 as usize].regions.insert(
                        r.start,
                        Region {
                            object: c_obj,
                            ..r.clone()
                        },
                    );
                }
                let next = self.w().tasks[task.0 as usize].next_vpn;
                self.w().tasks[child_task.0 as usize].next_vpn = next;
                // Write access to every private page is taken away: the next
                // write faults and copies.
                let updates: Vec<Update> = parent_regions
                    .iter()
                    .filter(|r| r.prot == Prot::ReadWrite)
                    .map(|r| Update {
                        pmap,
                        start: Vpn(r.start),
                        pages: r.pages,
                        change: Change::ReadOnly,
                    })
                    .collect();
                self.reduce(cpu, "fork", &updates).await;
                self.count("vm.forks", 1);
                self.spawn_thread(child_task, child, None);
                child_task.0 as u64
            }
            Syscall::KmemAlloc { pages, wired } => {
                let p = self.protocol();
                if p.hat_getshootcookie(self).is_some() {
                    self.kmem_alloc_segkmem(cpu, pages, wired).await
                } else {
                    let start = {
                        let mut w = self.w();
                        let s = w.kmem_next;
                        w.kmem_next += pages + 1;
                        w.kernel_regions.insert(s, pages);
                        s
                    };
                    for i in (0..pages).filter(|_| wired) {
                        let pfn = self.alloc_data_or_stop(cpu).await;
                        self.hat_memload(cpu, KERNEL_PMAP, Vpn(start + i), pfn, true)
                            .await;
                    }
                    self.count("vm.kmem_allocs", 1);
                    start << PAGE_SHIFT
                }
            }
            Syscall::KmemFree { va, pages } => {
                let start = va >> PAGE_SHIFT;
                let lazy_kernel = self.protocol().hat_getshootcookie(self).is_some();
                if lazy_kernel {
                    // The address will be reused: retire the region under
                    // the kernel map's lock first, so that a concurrent
                    // kernel fault either maps before the unload (and is
                    // unloaded with it) or finds a bad address.
                    let lock = self.w().kernel_vm_lock;
                    self.lock(cpu, lock).await;
                    self.w().kernel_regions.remove(&start);
                    self.unlock(cpu, lock).await;
                }
                let frames: Vec<Pfn> = {
                    let w = self.w();
                    (start..start + pages)
                        .map(|v| w.pte(KERNEL_PMAP, Vpn(v)))
                        .filter(|p| p.present())
                        .map(|p| p.pfn())
                        .collect()
                };
                let deferred = self.kernel_unload(cpu, "kmem free", start, pages).await;
                let p = self.protocol();
                // balan92 §Lazy Shutdowns: the free sets the zone cookie,
                // read after the translations were unloaded.
                let cookie = p.hat_getshootcookie(self);
                let mut w = self.w();
                w.kernel_regions.remove(&start);
                for f in frames {
                    w.mem.free(f);
                }
                if let Some(c) = cookie {
                    w.segkmem.free(start, pages, c, deferred);
                }
                0
            }
            Syscall::CpuOffline => {
                // Reserve the offline at once: two CPUs going offline
                // concurrently must not both pass the last-CPU check.
                let reserved = {
                    let mut w = self.w();
                    let online = w.cpus.iter().filter(|c| c.online).count();
                    let ok = online > 1 + w.cpus_going_offline;
                    if ok {
                        w.cpus_going_offline += 1;
                    }
                    ok
                };
                if !reserved {
                    self.count("cpu.offline_refused", 1);
                    u64::MAX
                } else {
                    // The thread moves off this CPU, the CPU leaves its
                    // address space and the protocol's CPU sets
                    // (balan92 hat_offline), then stops (the dispatcher
                    // parks it until it is onlined).
                    {
                        let mut w = self.w();
                        let th = &mut w.threads[tid.0 as usize];
                        th.affinity = None;
                        th.state = ThreadState::Runnable;
                        w.cpus[cpu.index()].thread = None;
                    }
                    let p = self.protocol();
                    let loaded = self.w().cpus[cpu.index()].pmap;
                    if let Some(o) = loaded {
                        p.deactivate(self, cpu, o).await;
                    }
                    p.offline(self, cpu).await;
                    {
                        let mut w = self.w();
                        w.cpus[cpu.index()].online = false;
                        w.cpus_going_offline -= 1;
                    }
                    self.count("cpu.offlines", 1);
                    self.make_runnable(tid);
                    cpu.0 as u64
                }
            }
            Syscall::CpuOnline { cpu: target } => {
                let offline = self.w().cpus.get(target.index()).is_some_and(|c| !c.online);
                if offline {
                    // The CPU runs `hat_online` itself when it wakes.
                    self.w().cpus[target.index()].online = true;
                    self.post_irq(target, crate::cpu::Irq::Reschedule, Cycles(0));
                    self.count("cpu.onlines", 1);
                    0
                } else {
                    u64::MAX
                }
            }
            Syscall::HatShutdown { nocookie } => {
                let p = self.protocol();
                let cookie = match (nocookie, p.hat_getshootcookie(self)) {
                    (false, Some(c)) => crate::pmap::Cookie::Age(c),
                    _ => crate::pmap::Cookie::NoCookie,
                };
                p.hat_shutdown(self, cpu, cookie).await;
                0
            }
            Syscall::Segmap(c) => self.segmap_call(cpu, c).await,
            Syscall::Pageout(c) => self.pageout_call(cpu, tid, c).await,
            Syscall::ThreadCreate { program, cpu: on } => {
                self.spawn_thread(task, program, on).0 as u64
            }
            Syscall::Migrate { cpu: to } => {
                {
                    let mut w = self.w();
                    let th = &mut w.threads[tid.0 as usize];
                    th.affinity = to;
                    th.state = ThreadState::Runnable;
                    w.cpus[cpu.index()].thread = None;
                }
                self.count("sched.migrations", 1);
                self.make_runnable(tid);
                0
            }
        };
        self.w().threads[tid.0 as usize].ret = ret;
    }

    /// balan92 §Lazy Shutdowns: allocate from segkmem's bitmap; a zone
    /// freed since its addresses were last flushed costs a
    /// `hat_shutdown(zone cookie)` before the pages are used, and when it
    /// returns the frees it covers are complete (the oracle's lazy
    /// completion point). Wired pages are mapped before the range becomes a
    /// kernel region, so that a stale toucher faults (bad address) rather
    /// than racing the mapping.
    async fn kmem_alloc_segkmem(&self, cpu: CpuId, pages: u64, wired: bool) -> u64 {
        let lock = self.w().kernel_vm_lock;
        self.lock(cpu, lock).await;
        let got = {
            let mut w = self.w();
            match w.segkmem.alloc(pages) {
                Some(start) => {
                    let unflushed = w.segkmem.unflushed(start, pages);
                    if !wired {
                        w.kernel_regions.insert(start, pages);
                    }
                    Ok((start, unflushed))
                }
                None => Err(format!(
                    "{pages} pages of kernel virtual space: segkmem is exhausted ({} pages); raise kernel.segkmem_pages",
                    w.segkmem.pages()
                )),
            }
        };
        let (start, unflushed) = match got {
            Ok(s) => s,
            Err(what) => return self.exhausted(cpu, what).await,
        };
        self.unlock(cpu, lock).await;
        let p = self.protocol();
        for (zone, cookie) in unflushed {
            self.count("segkmem.hat_shutdown_calls", 1);
            p.hat_shutdown(self, cpu, crate::pmap::Cookie::Age(cookie))
                .await;
            let done = self.w().segkmem.flushed(zone, cookie);
            for op in done {
                self.complete_op(op);
            }
        }
        if wired {
            for i in 0..pages {
                let pfn = self.alloc_data_or_stop(cpu).await;
                self.hat_memload(cpu, KERNEL_PMAP, Vpn(start + i), pfn, true)
                    .await;
            }
            self.w().kernel_regions.insert(start, pages);
        }
        self.count("vm.kmem_allocs", 1);
        self.count("segkmem.allocs", 1);
        start << PAGE_SHIFT
    }

    /// Frees the pages [offset, offset + pages) of an object no one else
    /// references (its frames can be reused at once: stale translations to
    /// them are what the oracle must catch).
    fn free_unshared(&self, obj: u32, offset: u64, pages: u64) {
        let mut w = self.w();
        if w.objects[obj as usize].refs != 1 {
            return;
        }
        let idxs: Vec<u64> = w.objects[obj as usize]
            .pages
            .range(offset..offset + pages)
            .map(|(&i, _)| i)
            .collect();
        for i in idxs {
            let pfn = w.objects[obj as usize].pages.remove(&i).expect("present");
            w.mem.free(pfn);
        }
    }

    /// The thread exits; the last thread of a task tears it down.
    pub(crate) async fn thread_exit(&self, cpu: CpuId, tid: ThreadId) {
        let task = {
            let mut w = self.w();
            let th = &mut w.threads[tid.0 as usize];
            th.state = ThreadState::Dead;
            th.program = None;
            let task = th.task;
            w.cpus[cpu.index()].thread = None;
            w.live_threads -= 1;
            if w.live_threads == 0 {
                w.stop = true;
            }
            let t = &mut w.tasks[task.0 as usize];
            t.threads -= 1;
            if t.threads > 0 {
                return;
            }
            t.alive = false;
            task
        };
        self.seg_lock(cpu, task, true).await;
        self.teardown(cpu, task).await;
        self.seg_unlock(cpu, task).await;
    }

    /// Destroys a task's address space: every mapping removed through the
    /// protocol, objects released, page tables freed.
    async fn teardown(&self, cpu: CpuId, task: TaskId) {
        let pmap = self.task_pmap(task);
        let loaded = self.w().cpus[cpu.index()].pmap == Some(pmap);
        let p = self.protocol();
        if loaded {
            p.deactivate(self, cpu, pmap).await;
        }
        let regions: Vec<Region> = std::mem::take(&mut self.w().tasks[task.0 as usize].regions)
            .into_values()
            .collect();
        let updates: Vec<Update> = regions
            .iter()
            .map(|r| Update {
                pmap,
                start: Vpn(r.start),
                pages: r.pages,
                change: Change::Remove,
            })
            .collect();
        self.reduce(cpu, "task exit", &updates).await;
        for r in regions {
            let hash = if self.removes_pages(r.object, None) {
                self.page_hash_enter(cpu).await
            } else {
                None
            };
            self.release_object(r.object);
            self.page_hash_exit(cpu, hash).await;
        }
        let clear = {
            let mut w = self.w();
            let tables = std::mem::take(&mut w.pmaps[pmap.0 as usize].tables);
            w.pmaps[pmap.0 as usize].alive = false;
            // No per-CPU directory may keep entries of freed tables.
            let holders: Vec<CpuId> = w.percpu_l1.as_ref().map_or(Vec::new(), |l1| {
                (0..l1.loaded.len())
                    .filter(|&i| l1.loaded[i] == Some(pmap))
                    .map(|i| CpuId(i as u16))
                    .collect()
            });
            for c in holders {
                w.l1_load(c, None);
            }
            let mut clear = Cycles(0);
            for t in tables {
                clear += w.clear_table_frame(cpu, t);
                w.mem.free(t);
            }
            clear
        };
        if clear > Cycles(0) {
            self.delay(cpu, clear).await;
        }
    }
}
