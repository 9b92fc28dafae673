//! The lock-order checker and per-class lock contention (balan92 §Locking
//! Design, §Analysis of the Locking design). Every acquisition of the
//! simulated kernel (`Sim::lock`, `Sim::lock_pmap`, `Sim::sleep_lock`,
//! the try-locks) goes through [`Sim::lock_enter`] or
//! [`Sim::try_lock_enter`]; it is always on, in every run and every test.
//!
//! Classes and the order balan92 fixes ("segment → page sleep → HAT →
//! page spin → shootdown"), lowest first:
//!
//! | rank | class      | kind  | locks of the model                                  |
//! |------|------------|-------|-----------------------------------------------------|
//! | 1    | segment    | sleep | each process's map lock (svr42: its segment r/w sleep lock, faults as readers), the kernel map's lock |
//! | 2    | page_sleep | sleep | a physical page's reader/writer sleep lock (`sleeplock`) |
//! | 3    | driver     | spin  | segmap's lock (a segment driver's own state)        |
//! | 4    | hat        | spin  | one HAT spin lock per address space                 |
//! | 5    | page_spin  | spin  | a physical page's spin lock (its mapping chain)     |
//! | 6    | shootdown  | spin  | the global shootdown lock                           |
//! | 7    | anon       | spin  | the anon layer's reservation lock                   |
//! | 8    | swap       | spin  | the swap layer's reservation lock                   |
//! | 9    | page_hash  | spin  | the page layer's global page-hash lock (a leaf)     |
//!
//! Where the paper gives no rank. The driver lock is a segment-layer spin
//! lock: below HAT (segmap's lock is never held into the HAT), above the
//! page sleep lock (no one sleeps holding a spin lock). The anon and swap
//! reservation locks (§Analysis: "locks at the anon layer ... and at the
//! swap layer for reserving anon pages and swap space for the child
//! processes", "the lock hold times during the reservation operation
//! would be very small") are taken by fork while it copies a segment and
//! nothing is acquired under them: leaves, ranked above everything, anon
//! before swap (an anon reservation is backed by a swap reservation).
//!
//! The page-hash lock (§Locking Design: "A global spin lock in the page
//! layer for protecting the page hash chains"; §Analysis: "the lock hold
//! time for this lock is very low") guards finding a page by identity
//! (object and offset, a file page by file and offset) and inserting or
//! removing one. It is a leaf: nothing that can wait is taken under it,
//! and it ranks above every class, so that any lock may be held when it
//! is taken (a fault holds its segment lock, a copy-on-write break the old
//! page's sleep lock) and a blocking acquisition under it is a
//! violation. The one acquisition made under it is a new page's sleep
//! lock at the instant the page enters the hash (`Sim::sleep_lock_new_page`,
//! SVR4's page created locked), which cannot wait; it is exempt like a
//! try-lock (below) and counted in `lockorder.new_page_under_page_hash`.
//! One global lock, as the paper has, not hash buckets: the §Analysis
//! claim is about that one lock's contention across address spaces.
//!
//! Acquiring a lock of a lower rank than one already held is an order
//! violation, counted as `lockorder.violations` (with the first one
//! described); acquiring two of the same rank is allowed only for the
//! segment class (the pageout daemon, holding its own process's map lock,
//! takes the map lock of each process it scans; no process ever takes the
//! daemon's) and for HAT locks of one address space in ascending key
//! order (below).
//!
//! Two HAT locks. With the svr42 switch "HAT lock per page table"
//! (§Locking Design: "Making the HAT lock finer grained by moving it to
//! the page table level was considered"), an address space has one HAT
//! spin lock per level-2 page table plus its own lock (`LockRef::Pmap`),
//! which then guards the CPU set and the level-1 directory. Each carries a
//! key (address space, index): a page table's index is its level-1 slot,
//! the address space's own lock has index `u64::MAX`. Holding HAT locks
//! of one address space, another may be taken only with a greater key:
//! page tables in ascending order, the address space's lock last. HAT
//! locks of two address spaces are never nested (except by try-locks).
//!
//! Try-locks. A try-lock that does not wait is exempt from the order: it
//! either takes a free lock at once or fails and returns, so the acquirer
//! never waits on a holder and cannot close a wait-for cycle, which is
//! what an order violation could cause (a deadlock needs every member of
//! the cycle to wait). Such an out-of-order acquisition is counted in
//! `lockorder.trylock_out_of_order`; the lock then counts as held, so
//! acquisitions made under it are checked as usual. A *blocking*
//! acquisition in the same order is still a violation (`hat_pageunload`,
//! entered holding the page spin lock, try-locks each HAT lock and backs
//! off; see the svr42 protocol).
//!
//! A page's sleep lock taken as writer at the instant the page is
//! created (`Sim::sleep_lock_new_page`: no one can hold or wait for it
//! yet) is exempt in the same way, and counted the same way when out of
//! order (a copy-on-write break holds the old page's sleep lock).
//!
//! Contention: an acquisition that found the lock held counts in
//! `lock.<class>.contended`, and its wait in `lock.<class>.wait_cycles`
//! (a sleep lock: only an acquisition that had to wait; readers granted
//! beside readers count in `sleeplock.shared_grants`). Each acquisition is
//! counted again as `lock.<class>.<path>.*` for the kernel path the CPU's
//! thread is in (`fault`, `fork`, `exit`, `syscall`: `Cpu::lock_path`).
//! Locks no class was given for (other protocols' own locks) are neither
//! checked nor counted.

use std::collections::BTreeMap;

use mmulab_engine::{Counters, Cycles};
use mmulab_machine::CpuId;

use crate::pmap::PmapId;
use crate::sim::Sim;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockClass {
    Segment = 1,
    PageSleep = 2,
    Driver = 3,
    Hat = 4,
    PageSpin = 5,
    Shootdown = 6,
    AnonResv = 7,
    SwapResv = 8,
    PageHash = 9,
}

impl LockClass {
    pub fn name(self) -> &'static str {
        match self {
            LockClass::Segment => "segment",
            LockClass::PageSleep => "page_sleep",
            LockClass::Driver => "driver",
            LockClass::Hat => "hat",
            LockClass::PageSpin => "page_spin",
            LockClass::Shootdown => "shootdown",
            LockClass::AnonResv => "anon",
            LockClass::SwapResv => "swap",
            LockClass::PageHash => "page_hash",
        }
    }

    /// Sleep-lock classes (held while the holder may block); the others
    /// are spin locks.
    pub fn sleeps(self) -> bool {
        matches!(self, LockClass::Segment | LockClass::PageSleep)
    }
}

/// A lock as the checker names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockRef {
    /// An entry of `World::locks`.
    Named(usize),
    /// A pmap's (HAT's) spin lock.
    Pmap(PmapId),
    /// An entry of `World::sleep_locks`.
    Sleep(usize),
}

#[derive(Clone, Debug, Default)]
pub struct LockOrder {
    /// Classes given to named locks (the segment class is found from the
    /// tasks and the kernel map).
    classes: BTreeMap<usize, LockClass>,
    /// Same-class order keys of named HAT locks: (address space, index).
    keys: BTreeMap<usize, (u32, u64)>,
    /// Named locks known to have no class.
    unclassed: std::collections::BTreeSet<usize>,
    /// Per CPU: the classed locks it holds, in acquisition order.
    held: Vec<Vec<(LockRef, LockClass)>>,
    pub violations: u64,
    pub first: Option<String>,
    /// The counter names of each class (and kernel path) seen, made once:
    /// locks are taken on every fault and system call, and formatting the
    /// names there cost more than the counting.
    names: BTreeMap<(LockClass, Option<&'static str>), CounterNames>,
}

/// `lock.CLASS[.PATH].{contended,wait_cycles,acquired}`.
#[derive(Clone, Debug)]
struct CounterNames {
    contended: String,
    wait_cycles: String,
    acquired: String,
}

impl CounterNames {
    fn new(class: LockClass, path: Option<&str>) -> CounterNames {
        let stem = match path {
            Some(p) => format!("lock.{}.{p}", class.name()),
            None => format!("lock.{}", class.name()),
        };
        CounterNames {
            contended: format!("{stem}.contended"),
            wait_cycles: format!("{stem}.wait_cycles"),
            acquired: format!("{stem}.acquired"),
        }
    }

    /// Counts one acquisition: `wait` cycles spent waiting when it was
    /// contended.
    fn count(&self, counters: &mut Counters, wait: Option<u64>) {
        if let Some(cycles) = wait {
            counters.add(&self.contended, 1);
            counters.add(&self.wait_cycles, cycles);
        }
        counters.add(&self.acquired, 1);
    }
}

impl LockOrder {
    /// Counts one violation; the first is kept, described.
    fn violation(&mut self, counters: &mut Counters, describe: impl FnOnce() -> String) {
        self.violations += 1;
        if self.first.is_none() {
            self.first = Some(describe());
        }
        counters.add("lockorder.violations", 1);
    }

    pub fn new(cpus: usize) -> LockOrder {
        LockOrder {
            held: vec![Vec::new(); cpus],
            ..Default::default()
        }
    }
}

impl Sim {
    /// Gives a named lock its class (protocols and drivers call this for
    /// the locks they allocate).
    pub fn set_lock_class(&self, lock: usize, class: LockClass) {
        let mut w = self.w();
        w.lockorder.unclassed.remove(&lock);
        w.lockorder.classes.insert(lock, class);
    }

    /// Gives a named lock the HAT class and its same-class order key
    /// (`pmap`, `index`); see the module documentation.
    pub fn set_hat_lock_key(&self, lock: usize, pmap: PmapId, index: u64) {
        assert!(
            index < u64::MAX,
            "index u64::MAX is the address space's own lock"
        );
        let mut w = self.w();
        w.lockorder.unclassed.remove(&lock);
        w.lockorder.classes.insert(lock, LockClass::Hat);
        w.lockorder.keys.insert(lock, (pmap.0, index));
    }

    fn class_of(&self, l: LockRef) -> Option<LockClass> {
        let mut w = self.w();
        match l {
            LockRef::Pmap(_) => Some(LockClass::Hat),
            LockRef::Sleep(i) => w.sleep_locks[i].class,
            LockRef::Named(i) => {
                if let Some(&c) = w.lockorder.classes.get(&i) {
                    return Some(c);
                }
                if w.lockorder.unclassed.contains(&i) {
                    return None;
                }
                // Looked up once per lock: a process's map lock exists
                // before anyone takes it; other locks never become one.
                let segment = i == w.kernel_vm_lock || w.tasks.iter().any(|t| t.vm_lock == i);
                if segment {
                    w.lockorder.classes.insert(i, LockClass::Segment);
                    Some(LockClass::Segment)
                } else {
                    w.lockorder.unclassed.insert(i);
                    None
                }
            }
        }
    }

    /// Before acquiring `l` on `cpu`: checks the order; returns what
    /// [`Sim::lock_acquired`] needs.
    pub fn lock_enter(&self, cpu: CpuId, l: LockRef) -> Option<(LockClass, bool, Cycles)> {
        self.enter_checked(cpu, l, false)
    }

    /// Before a try-lock of `l` on `cpu` (one that does not wait): exempt
    /// from the order (see the module documentation), counted when out of
    /// order. Returns what [`Sim::lock_acquired`] needs if it succeeds.
    pub fn try_lock_enter(&self, cpu: CpuId, l: LockRef) -> Option<(LockClass, bool, Cycles)> {
        self.enter_checked(cpu, l, true)
    }

    fn enter_checked(
        &self,
        cpu: CpuId,
        l: LockRef,
        try_lock: bool,
    ) -> Option<(LockClass, bool, Cycles)> {
        let class = self.class_of(l)?;
        let mut w = self.w();
        let now = w.now();
        let busy = match l {
            LockRef::Named(i) => w.locks[i].is_some(),
            LockRef::Pmap(p) => w.pmaps[p.0 as usize].lock.is_some(),
            LockRef::Sleep(i) => {
                let s = &w.sleep_locks[i];
                s.writer.is_some() || !s.readers.is_empty()
            }
        };
        let w = &mut *w;
        let lo = &mut w.lockorder;
        if lo.held.len() <= cpu.index() {
            lo.held.resize(cpu.index() + 1, Vec::new());
        }
        let key = |r: LockRef| match r {
            LockRef::Pmap(p) => Some((p.0, u64::MAX)),
            LockRef::Named(i) => lo.keys.get(&i).copied(),
            LockRef::Sleep(_) => None,
        };
        let new_key = key(l);
        let same_class_ok = |h: LockRef| match class {
            LockClass::Segment => true,
            LockClass::Hat => match (key(h), new_key) {
                (Some((ph, ih)), Some((pn, in_))) => ph == pn && ih < in_,
                _ => false,
            },
            _ => false,
        };
        let bad = lo.held[cpu.index()]
            .iter()
            .find(|&&(h, c)| c > class || (c == class && !same_class_ok(h)))
            .copied();
        if bad.is_some() && try_lock {
            let under_hash = lo.held[cpu.index()]
                .iter()
                .any(|&(_, c)| c == LockClass::PageHash);
            if under_hash && matches!(l, LockRef::Sleep(_)) {
                w.counters.add("lockorder.new_page_under_page_hash", 1);
            }
            w.counters.add("lockorder.trylock_out_of_order", 1);
        } else if let Some((h, hc)) = bad {
            lo.violation(&mut w.counters, || {
                format!(
                    "{cpu} acquires {l:?} ({}) holding {h:?} ({}) at {now}",
                    class.name(),
                    hc.name()
                )
            });
        }
        Some((class, busy, now))
    }

    /// After acquiring: records the hold and the contention.
    pub fn lock_acquired(
        &self,
        cpu: CpuId,
        l: LockRef,
        entered: Option<(LockClass, bool, Cycles)>,
    ) {
        let Some((class, busy, since)) = entered else {
            return;
        };
        let mut w = self.w();
        let now = w.now();
        let w = &mut *w;
        w.lockorder.held[cpu.index()].push((l, class));
        let path = w.cpus[cpu.index()].lock_path;
        let wait = busy.then(|| (now - since).0);
        // The class's counters, then the same per kernel path of the
        // acquiring thread (`Cpu::lock_path`).
        for key in [Some((class, None)), path.map(|p| (class, Some(p)))]
            .into_iter()
            .flatten()
        {
            w.lockorder
                .names
                .entry(key)
                .or_insert_with(|| CounterNames::new(key.0, key.1))
                .count(&mut w.counters, wait);
        }
    }

    /// balan92 §Examples of the Locking requirements, `hat_memload`: "The
    /// caller can not hold any spin locks" (it holds the page's sleep
    /// lock; the segment lock is a sleep lock too). Counts a violation when
    /// `cpu` holds a lock of a spin class.
    pub fn check_no_spin_lock(&self, cpu: CpuId, what: &str) {
        let mut w = self.w();
        let now = w.now();
        let held = w
            .lockorder
            .held
            .get(cpu.index())
            .and_then(|h| h.iter().find(|&&(_, c)| !c.sleeps()).copied());
        if let Some((h, c)) = held {
            let w = &mut *w;
            w.lockorder.violation(&mut w.counters, || {
                format!(
                    "{cpu} calls {what} holding spin lock {h:?} ({}) at {now}",
                    c.name()
                )
            });
        }
    }

    /// Counts a violation unless `cpu` holds `l` (a locking requirement
    /// of an interface, like `hat_memload`'s page sleep lock).
    pub fn check_holds(&self, cpu: CpuId, l: LockRef, what: &str) {
        let mut w = self.w();
        let now = w.now();
        let held = w
            .lockorder
            .held
            .get(cpu.index())
            .is_some_and(|h| h.iter().any(|&(x, _)| x == l));
        if !held {
            let w = &mut *w;
            w.lockorder.violation(&mut w.counters, || {
                format!("{cpu} calls {what} without holding {l:?} at {now}")
            });
        }
    }

    /// On release.
    pub fn lock_released(&self, cpu: CpuId, l: LockRef) {
        let mut w = self.w();
        if let Some(held) = w.lockorder.held.get_mut(cpu.index())
            && let Some(i) = held.iter().rposition(|&(h, _)| h == l)
        {
            held.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_the_papers_order() {
        assert!(LockClass::Segment < LockClass::PageSleep);
        assert!(LockClass::PageSleep < LockClass::Driver);
        assert!(LockClass::Driver < LockClass::Hat);
        assert!(LockClass::Hat < LockClass::PageSpin);
        assert!(LockClass::PageSpin < LockClass::Shootdown);
        assert!(LockClass::Shootdown < LockClass::AnonResv);
        assert!(LockClass::AnonResv < LockClass::SwapResv);
        // The page-hash lock is a leaf: it ranks above every other class.
        assert!(LockClass::SwapResv < LockClass::PageHash);
        assert!(!LockClass::PageHash.sleeps());
        assert!(LockClass::Segment.sleeps() && LockClass::PageSleep.sleeps());
        assert!(!LockClass::Hat.sleeps() && !LockClass::PageSpin.sleeps());
    }
}
