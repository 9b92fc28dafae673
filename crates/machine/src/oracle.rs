//! The translation oracle (DESIGN.md "The oracle").
//!
//! Correctness claim checked (black89 §4): *any inconsistent TLB entry
//! caused by an operation is not used after the operation completes.*
//!
//! The oracle keeps a shadow slot for every (address space, virtual page)
//! ever mapped: the rights its PTE grants now, an epoch bumped by every
//! rights reduction, and the highest epoch whose reducing operation has
//! completed. A TLB entry records the slot and the epoch it was filled at.
//! A use is then checked in O(1):
//!
//! * filled at the current epoch → fine (no reduction since the fill);
//! * the use needs more than the PTE grants now (the page is gone, the frame
//!   changed, a store to a read-only or clean page through a dirty entry)
//!   and the entry predates a *completed* reduction → **violation**;
//! * the same but the reduction has not completed → a stale use inside the
//!   operation's window, allowed; counted, and for operations whose
//!   completion is deferred by a lazy scheme (SVR4.2's kernel frees) counted
//!   as *use after free* instead, a separate class.
//!
//! Clearing the modify bit is a reduction: a cached dirty entry would write
//! without setting it again.
//!
//! The layer that owns an operation says when it completes (the VM layer
//! when the pmap call returns; a lazy scheme at reuse; UNITD when the PTE
//! store performs). The oracle cannot be switched off.

use crate::ids::{CpuId, Pfn, Vpn};
use mmulab_engine::Cycles;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A fixed, seedless hasher: the index is only looked up, never iterated,
/// but a fixed hasher also keeps memory layout identical between runs.
#[derive(Default)]
pub struct FixedHasher(u64);
impl Hasher for FixedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64)
    }
}
pub type FixedMap<K, V> = HashMap<K, V, BuildHasherDefault<FixedHasher>>;

/// What a PTE grants, as far as the oracle cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rights {
    pub present: bool,
    pub writable: bool,
    pub modified: bool,
    pub pfn: Pfn,
}

impl Rights {
    pub const NONE: Rights = Rights {
        present: false,
        writable: false,
        modified: false,
        pfn: Pfn(0),
    };

    /// True when `new` takes away something `self` granted.
    pub fn reduced_by(&self, new: &Rights) -> bool {
        self.present
            && (!new.present
                || new.pfn != self.pfn
                || (self.writable && !new.writable)
                || (self.modified && !new.modified))
    }
}

/// An operation that may reduce rights (an mprotect, an unmap, a COW break,
/// a kernel free…), identified for reports.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct OpId(pub u32);

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpRecord {
    pub what: String,
    pub cpu: CpuId,
    pub started: Cycles,
    pub completed: Option<Cycles>,
    /// Completion deferred by a lazy scheme (stale uses before it are use
    /// after free, not TLB-consistency violations).
    pub lazy: bool,
    #[serde(skip)]
    reduced: Vec<(u32, u32)>,
}

#[derive(Clone, Debug)]
struct Slot {
    space: u32,
    vpn: Vpn,
    rights: Rights,
    epoch: u32,
    completed_epoch: u32,
    /// The op of the latest reduction, for reports.
    last_op: OpId,
}

/// One reported violation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Violation {
    pub cpu: CpuId,
    pub thread: u32,
    pub space: u32,
    pub va: u64,
    pub time: Cycles,
    pub store: bool,
    pub op: String,
    pub op_cpu: CpuId,
    pub op_completed: Option<Cycles>,
}

/// The outcome of one checked use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UseCheck {
    Ok,
    /// Stale, inside a reduction's window: allowed.
    StalePending,
    /// Stale, before a lazily deferred completion: use after free.
    UseAfterFree,
    Violation,
}

/// Who used a translation, for the report.
#[derive(Clone, Copy, Debug)]
pub struct UseCtx {
    pub cpu: CpuId,
    pub thread: u32,
    pub va: u64,
    pub time: Cycles,
}

const REPORT_FIRST: usize = 8;

#[derive(Default)]
pub struct Oracle {
    index: FixedMap<(u32, u64), u32>,
    slots: Vec<Slot>,
    ops: Vec<OpRecord>,
    pub checked_uses: u64,
    pub violations: u64,
    pub stale_pending: u64,
    pub use_after_free: u64,
    first: Vec<Violation>,
}

impl Oracle {
    pub fn new() -> Oracle {
        Oracle::default()
    }

    /// The shadow slot of (space, vpn), created on first use.
    pub fn slot(&mut self, space: u32, vpn: Vpn) -> u32 {
        let n = self.slots.len() as u32;
        *self.index.entry((space, vpn.0)).or_insert_with(|| {
            self.slots.push(Slot {
                space,
                vpn,
                rights: Rights::NONE,
                epoch: 0,
                completed_epoch: 0,
                last_op: OpId(u32::MAX),
            });
            n
        })
    }

    /// Host-only hint: brings `slot`'s shadow entry closer before a use
    /// is checked against it.
    #[inline]
    pub fn prefetch(&self, slot: u32) {
        crate::prefetch_ptr(self.slots.as_ptr().wrapping_add(slot as usize));
    }

    pub fn epoch(&self, slot: u32) -> u32 {
        self.slots[slot as usize].epoch
    }

    pub fn rights(&self, slot: u32) -> Rights {
        self.slots[slot as usize].rights
    }

    pub fn begin_op(&mut self, what: impl Into<String>, cpu: CpuId, now: Cycles) -> OpId {
        self.ops.push(OpRecord {
            what: what.into(),
            cpu,
            started: now,
            completed: None,
            lazy: false,
            reduced: Vec::new(),
        });
        OpId(self.ops.len() as u32 - 1)
    }

    pub fn op(&self, op: OpId) -> &OpRecord {
        &self.ops[op.0 as usize]
    }

    /// Marks an operation's completion as deferred by a lazy scheme.
    pub fn set_lazy(&mut self, op: OpId) {
        self.ops[op.0 as usize].lazy = true;
    }

    /// Records that the PTE of `slot` now grants `new`, changed by `op`.
    /// Every reduction must belong to an operation.
    pub fn record_pte(&mut self, slot: u32, new: Rights, op: Option<OpId>) {
        let s = &mut self.slots[slot as usize];
        if s.rights.reduced_by(&new) {
            let op = op.unwrap_or_else(|| {
                panic!(
                    "rights of {} in space {} reduced outside any operation",
                    s.vpn, s.space
                )
            });
            let rec = &mut self.ops[op.0 as usize];
            assert!(
                rec.completed.is_none(),
                "operation {:?} ({}) reduced rights after it completed",
                op,
                rec.what
            );
            s.epoch += 1;
            s.last_op = op;
            rec.reduced.push((slot, s.epoch));
        }
        s.rights = new;
    }

    /// The operation has completed: its reductions now bind every TLB.
    /// Completing twice is allowed (the first time counts), so that a layer
    /// that completes early (UNITD) and the VM layer can both say so.
    pub fn complete(&mut self, op: OpId, now: Cycles) {
        let rec = &mut self.ops[op.0 as usize];
        if rec.completed.is_some() {
            return;
        }
        rec.completed = Some(now);
        for &(slot, epoch) in &rec.reduced {
            let s = &mut self.slots[slot as usize];
            s.completed_epoch = s.completed_epoch.max(epoch);
        }
    }

    /// The reductions of `slot`'s PTE made so far bind every TLB now,
    /// whatever operation they belong to: under romanescu10's UNITD a PTE
    /// store performs only once every TLB copy is invalidated (§5.3.2), so
    /// each reduction completes with its own store, before the operation
    /// that made it ends.
    pub fn complete_slot(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.completed_epoch = s.completed_epoch.max(s.epoch);
    }

    pub fn is_complete(&self, op: OpId) -> bool {
        self.ops[op.0 as usize].completed.is_some()
    }

    /// Checks one use of a TLB entry (hot path: one slot read when nothing
    /// was reduced since the fill).
    #[inline(always)]
    pub fn check_use(
        &mut self,
        slot: u32,
        fill_epoch: u32,
        pfn: Pfn,
        dirty: bool,
        store: bool,
        ctx: UseCtx,
    ) -> UseCheck {
        self.checked_uses += 1;
        self.recheck_use(slot, fill_epoch, pfn, dirty, store, ctx)
    }

    /// Checks a translation again when the access that used it performs
    /// later than its lookup (an access in flight across other CPUs'
    /// events, romanescu10 §5.1); not counted as a new use.
    #[inline(always)]
    pub fn recheck_use(
        &mut self,
        slot: u32,
        fill_epoch: u32,
        pfn: Pfn,
        dirty: bool,
        store: bool,
        ctx: UseCtx,
    ) -> UseCheck {
        let s = &self.slots[slot as usize];
        if fill_epoch >= s.epoch {
            return UseCheck::Ok;
        }
        let now = s.rights;
        let exceeds = !now.present
            || now.pfn != pfn
            || (store && !now.writable)
            || (store && dirty && !now.modified);
        if !exceeds {
            return UseCheck::Ok;
        }
        if fill_epoch < s.completed_epoch {
            self.violations += 1;
            if self.first.len() < REPORT_FIRST {
                let op = self.ops.get(s.last_op.0 as usize);
                self.first.push(Violation {
                    cpu: ctx.cpu,
                    thread: ctx.thread,
                    space: s.space,
                    va: ctx.va,
                    time: ctx.time,
                    store,
                    op: op.map_or("?".into(), |o| o.what.clone()),
                    op_cpu: op.map_or(CpuId(0), |o| o.cpu),
                    op_completed: op.and_then(|o| o.completed),
                });
            }
            UseCheck::Violation
        } else if self.ops.get(s.last_op.0 as usize).is_some_and(|o| o.lazy) {
            self.use_after_free += 1;
            UseCheck::UseAfterFree
        } else {
            self.stale_pending += 1;
            UseCheck::StalePending
        }
    }

    pub fn first_violations(&self) -> &[Violation] {
        &self.first
    }

    pub fn ops_count(&self) -> usize {
        self.ops.len()
    }

    pub fn report(&self) -> OracleReport {
        OracleReport {
            violations: self.violations,
            verdict: if self.violations == 0 {
                "consistent".into()
            } else {
                "inconsistent".into()
            },
            checked_uses: self.checked_uses,
            stale_uses_in_window: self.stale_pending,
            use_after_free: self.use_after_free,
            operations: self.ops.len() as u64,
            first: self.first.clone(),
            memory_checker_first: None,
        }
    }
}

/// The oracle's part of every result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OracleReport {
    pub violations: u64,
    pub verdict: String,
    pub checked_uses: u64,
    pub stale_uses_in_window: u64,
    pub use_after_free: u64,
    pub operations: u64,
    pub first: Vec<Violation>,
    /// The memory system's checker (romanescu10 runs with a `[memory]`
    /// hierarchy): its first violation; its count is in `violations`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_checker_first: Option<String>,
}

impl OracleReport {
    pub fn merge(&mut self, o: &OracleReport) {
        self.violations += o.violations;
        self.checked_uses += o.checked_uses;
        self.stale_uses_in_window += o.stale_uses_in_window;
        self.use_after_free += o.use_after_free;
        self.operations += o.operations;
        for v in &o.first {
            if self.first.len() < REPORT_FIRST {
                self.first.push(v.clone());
            }
        }
        if self.memory_checker_first.is_none() {
            self.memory_checker_first = o.memory_checker_first.clone();
        }
        self.verdict = if self.violations == 0 {
            "consistent".into()
        } else {
            "inconsistent".into()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(pfn: u64) -> Rights {
        Rights {
            present: true,
            writable: true,
            modified: true,
            pfn: Pfn(pfn),
        }
    }
    fn ctx(t: u64) -> UseCtx {
        UseCtx {
            cpu: CpuId(1),
            thread: 2,
            va: 0x1000,
            time: Cycles(t),
        }
    }

    #[test]
    fn stale_write_after_completion_is_a_violation() {
        let mut o = Oracle::new();
        let s = o.slot(1, Vpn(1));
        o.record_pte(s, rw(5), None);
        let fill = o.epoch(s);
        let op = o.begin_op("mprotect", CpuId(0), Cycles(10));
        o.record_pte(
            s,
            Rights {
                writable: false,
                ..rw(5)
            },
            Some(op),
        );
        assert_eq!(
            o.check_use(s, fill, Pfn(5), true, true, ctx(11)),
            UseCheck::StalePending
        );
        assert_eq!(
            o.check_use(s, fill, Pfn(5), true, false, ctx(11)),
            UseCheck::Ok,
            "loads stay legal"
        );
        o.complete(op, Cycles(20));
        assert_eq!(
            o.check_use(s, fill, Pfn(5), true, true, ctx(21)),
            UseCheck::Violation
        );
        assert_eq!(o.violations, 1);
        let v = &o.first_violations()[0];
        assert_eq!(
            (v.op.as_str(), v.time, v.store),
            ("mprotect", Cycles(21), true)
        );
        // A refill after the reduction is current.
        let fresh = o.epoch(s);
        assert_eq!(
            o.check_use(s, fresh, Pfn(5), false, false, ctx(22)),
            UseCheck::Ok
        );
    }

    #[test]
    fn rights_increase_is_not_a_reduction() {
        let mut o = Oracle::new();
        let s = o.slot(1, Vpn(1));
        o.record_pte(
            s,
            Rights {
                writable: false,
                ..rw(5)
            },
            None,
        );
        o.record_pte(s, rw(5), None);
        assert_eq!(o.epoch(s), 0);
    }

    #[test]
    #[should_panic(expected = "outside any operation")]
    fn reduction_needs_an_operation() {
        let mut o = Oracle::new();
        let s = o.slot(1, Vpn(1));
        o.record_pte(s, rw(5), None);
        o.record_pte(s, Rights::NONE, None);
    }

    #[test]
    fn clearing_modify_is_a_reduction_for_stores_through_dirty_entries() {
        let mut o = Oracle::new();
        let s = o.slot(1, Vpn(1));
        o.record_pte(s, rw(5), None);
        let fill = o.epoch(s);
        let op = o.begin_op("clear modify", CpuId(0), Cycles(1));
        o.record_pte(
            s,
            Rights {
                modified: false,
                ..rw(5)
            },
            Some(op),
        );
        o.complete(op, Cycles(2));
        assert_eq!(
            o.check_use(s, fill, Pfn(5), false, true, ctx(3)),
            UseCheck::Ok,
            "clean entry re-walks"
        );
        assert_eq!(
            o.check_use(s, fill, Pfn(5), true, true, ctx(3)),
            UseCheck::Violation
        );
    }

    #[test]
    fn frame_reuse_is_caught_and_lazy_ops_count_use_after_free() {
        let mut o = Oracle::new();
        let s = o.slot(0, Vpn(9));
        o.record_pte(s, rw(5), None);
        let fill = o.epoch(s);
        let op = o.begin_op("kmem free", CpuId(0), Cycles(1));
        o.set_lazy(op);
        o.record_pte(s, Rights::NONE, Some(op));
        assert_eq!(
            o.check_use(s, fill, Pfn(5), false, false, ctx(2)),
            UseCheck::UseAfterFree
        );
        o.complete(op, Cycles(3));
        assert_eq!(
            o.check_use(s, fill, Pfn(5), false, false, ctx(4)),
            UseCheck::Violation
        );
        assert_eq!(o.use_after_free, 1);
    }

    #[test]
    fn a_later_pending_reduction_does_not_hide_a_completed_one() {
        let mut o = Oracle::new();
        let s = o.slot(1, Vpn(1));
        o.record_pte(s, rw(5), None);
        let fill = o.epoch(s);
        let a = o.begin_op("mprotect", CpuId(0), Cycles(1));
        o.record_pte(
            s,
            Rights {
                writable: false,
                ..rw(5)
            },
            Some(a),
        );
        o.complete(a, Cycles(2));
        let b = o.begin_op("munmap", CpuId(0), Cycles(3));
        o.record_pte(s, Rights::NONE, Some(b));
        assert_eq!(
            o.check_use(s, fill, Pfn(5), false, true, ctx(4)),
            UseCheck::Violation
        );
    }
}
