//! The lock-order checker and per-class lock contention (balan92 §Locking
//! Design, §Analysis of the Locking design). Every spin-lock acquisition
//! of the simulated kernel (`Sim::lock`, `Sim::lock_pmap`) goes through
//! [`Sim::lock_enter`]; it is always on, in every run and every test.
//!
//! Classes and the order balan92 fixes ("segment → page sleep → HAT →
//! page spin → shootdown"), lowest first:
//!
//! | rank | class     | locks of the model                                  |
//! |------|-----------|-----------------------------------------------------|
//! | 1    | segment   | each process's map lock (faults and memory calls), the kernel map's lock |
//! | 2    | driver    | segmap's lock (a segment driver's own state)        |
//! | 3    | hat       | one HAT spin lock per address space                 |
//! | 4    | page_spin | a physical page's spin lock (its mapping chain)     |
//! | 5    | shootdown | the global shootdown lock                           |
//! Acquiring a lock of a lower rank than one already held is an order
//! violation, counted as `lockorder.violations` (with the first one
//! described); acquiring two of the same rank is allowed only for the
//! segment class (the pageout daemon, holding its own process's map lock,
//! takes the map lock of each process it scans; no process ever takes the
//! daemon's).
//!
//! Contention: an acquisition that found the lock held counts in
//! `lock.<class>.contended`, and its wait in `lock.<class>.wait_cycles`.
//! Locks no class was given for (other protocols' own locks) are neither
//! checked nor counted.

use std::collections::BTreeMap;

use mmulab_engine::Cycles;
use mmulab_machine::CpuId;

use crate::pmap::PmapId;
use crate::sim::Sim;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockClass {
    Segment = 1,
    Driver = 2,
    Hat = 3,
    PageSpin = 4,
    Shootdown = 5,
}

impl LockClass {
    pub fn name(self) -> &'static str {
        match self {
            LockClass::Segment => "segment",
            LockClass::Driver => "driver",
            LockClass::Hat => "hat",
            LockClass::PageSpin => "page_spin",
            LockClass::Shootdown => "shootdown",
        }
    }
}

/// A lock as the checker names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockRef {
    /// An entry of `World::locks`.
    Named(usize),
    /// A pmap's (HAT's) spin lock.
    Pmap(PmapId),
}

#[derive(Clone, Debug, Default)]
pub struct LockOrder {
    /// Classes given to named locks (the segment class is found from the
    /// tasks and the kernel map).
    classes: BTreeMap<usize, LockClass>,
    /// Named locks known to have no class.
    unclassed: std::collections::BTreeSet<usize>,
    /// Per CPU: the classed locks it holds, in acquisition order.
    held: Vec<Vec<(LockRef, LockClass)>>,
    pub violations: u64,
    pub first: Option<String>,
}

impl LockOrder {
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

    fn class_of(&self, l: LockRef) -> Option<LockClass> {
        let mut w = self.w();
        match l {
            LockRef::Pmap(_) => Some(LockClass::Hat),
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
        let class = self.class_of(l)?;
        let mut w = self.w();
        let now = w.now();
        let busy = match l {
            LockRef::Named(i) => w.locks[i].is_some(),
            LockRef::Pmap(p) => w.pmaps[p.0 as usize].lock.is_some(),
        };
        let lo = &mut w.lockorder;
        if lo.held.len() <= cpu.index() {
            lo.held.resize(cpu.index() + 1, Vec::new());
        }
        let bad = lo.held[cpu.index()]
            .iter()
            .find(|&&(_, c)| c > class || (c == class && class != LockClass::Segment))
            .copied();
        if let Some((h, hc)) = bad {
            lo.violations += 1;
            if lo.first.is_none() {
                lo.first = Some(format!(
                    "{cpu} acquires {l:?} ({}) holding {h:?} ({}) at {now}",
                    class.name(),
                    hc.name()
                ));
            }
            w.counters.add("lockorder.violations", 1);
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
        w.lockorder.held[cpu.index()].push((l, class));
        if busy {
            let name = class.name();
            w.counters.add(&format!("lock.{name}.contended"), 1);
            w.counters
                .add(&format!("lock.{name}.wait_cycles"), (now - since).0);
        }
        w.counters
            .add(&format!("lock.{}.acquired", class.name()), 1);
    }

    /// balan92 §Examples of the Locking requirements, `hat_memload`: "The
    /// caller can not hold any spin locks" (it holds the page's sleep
    /// lock; the segment lock is a sleep lock too). Counts a violation when
    /// `cpu` holds a driver, HAT or shootdown lock.
    pub fn check_no_spin_lock(&self, cpu: CpuId, what: &str) {
        let mut w = self.w();
        let now = w.now();
        let held = w
            .lockorder
            .held
            .get(cpu.index())
            .and_then(|h| h.iter().find(|&&(_, c)| c > LockClass::Segment).copied());
        if let Some((h, c)) = held {
            w.lockorder.violations += 1;
            if w.lockorder.first.is_none() {
                w.lockorder.first = Some(format!(
                    "{cpu} calls {what} holding spin lock {h:?} ({}) at {now}",
                    c.name()
                ));
            }
            w.counters.add("lockorder.violations", 1);
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
        assert!(LockClass::Segment < LockClass::Driver);
        assert!(LockClass::Driver < LockClass::Hat);
        assert!(LockClass::Hat < LockClass::PageSpin);
        assert!(LockClass::PageSpin < LockClass::Shootdown);
    }
}
