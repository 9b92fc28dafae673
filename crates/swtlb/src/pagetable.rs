//! Page-table entry classes and the address spaces they live in (uhlig94 §4.1, Fig. 3).
//!
//! OSF/1 and Mach 3.0 use linear tables: each task's level-1 (L1) table lies in mapped
//! kernel space; its pages are mapped by L2 PTEs; the L2 tables hold both L2 PTEs and the
//! L1K PTEs of kernel data, and are themselves mapped by L3 PTEs; the L3 table is unmapped
//! (the anchor). Ultrix has two levels: its L2 table is unmapped, so there is no L3.
//!
//! PTEs are 4 bytes and pages 4 KB, so one page-table page holds 1,024 PTEs
//! ([`PTES_PER_PAGE`]): one L1 page maps 4 MB of a task, one L2 page maps 4 MB of kernel
//! data or (through L2 PTEs) 4 GB of user L1 tables.

/// PTEs per page-table page: 4 KB pages / 4-byte PTEs (§4.1).
pub const PTES_PER_PAGE: u64 = 1024;
const PTE_SHIFT: u32 = PTES_PER_PAGE.trailing_zeros();

/// What a TLB entry maps (which level of Fig. 3 the cached PTE comes from).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum PteClass {
    /// A user page, mapped by a level-1 user PTE.
    L1U = 0,
    /// A mapped kernel data page, mapped by a level-1 kernel PTE (stored in an L2 table).
    L1K = 1,
    /// A page of some task's L1 table, mapped by a level-2 PTE.
    L2 = 2,
    /// A page of the L2 table, mapped by a level-3 PTE (from the unmapped L3 table).
    L3 = 3,
}

impl PteClass {
    pub const ALL: [PteClass; 4] = [PteClass::L1U, PteClass::L1K, PteClass::L2, PteClass::L3];
    pub fn name(self) -> &'static str {
        match self {
            PteClass::L1U => "L1U",
            PteClass::L1K => "L1K",
            PteClass::L2 => "L2",
            PteClass::L3 => "L3",
        }
    }
}

/// A task (address space) number. Task 0 is the kernel's own space in [`Key`]s of kernel
/// classes; user tasks are numbered from 1 by the OS models.
pub type TaskId = u16;

/// The identity of a TLB entry: class, task and page number, packed in a `u64`
/// (`class << 61 | task << 45 | page`). Entries of different tasks never match, as if the
/// R2000's ASIDs never ran out (the paper does not study ASID reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(pub u64);

/// Largest page field of a [`Key`] (45 bits: a 57-bit virtual address space of 4 KB pages).
pub const MAX_PAGE: u64 = (1 << 45) - 1;

impl Key {
    /// The marker for an empty slot; no real key has all bits set (class 3, task 0xffff is
    /// never built because tasks are below [`MAX_TASK`]).
    pub const EMPTY: Key = Key(u64::MAX);

    #[inline]
    pub fn new(class: PteClass, task: TaskId, page: u64) -> Key {
        debug_assert!(task <= MAX_TASK);
        Key((class as u64) << 61 | (task as u64) << 45 | (page & MAX_PAGE))
    }
    #[inline]
    pub fn class(self) -> PteClass {
        match self.0 >> 61 {
            0 => PteClass::L1U,
            1 => PteClass::L1K,
            2 => PteClass::L2,
            _ => PteClass::L3,
        }
    }
    #[inline]
    pub fn task(self) -> TaskId {
        (self.0 >> 45 & 0xffff) as TaskId
    }
    #[inline]
    pub fn page(self) -> u64 {
        self.0 & MAX_PAGE
    }
}

/// Largest task number (16 bits less the bits of [`Key::EMPTY`]'s pattern).
pub const MAX_TASK: TaskId = 0xfff0;

/// The L2 PTE mapping the L1-table page that holds `vpn`'s L1U PTE (Fig. 3).
#[inline]
pub fn l2_of_user(task: TaskId, vpn: u64) -> Key {
    Key::new(PteClass::L2, task, vpn >> PTE_SHIFT)
}

/// The L3 PTE mapping the L2-table page that holds the L2 PTE `l2` (3-level systems).
/// A task's L1 table of 4 MB needs 1,024 L2 PTEs: one L2 page per 4 GB of its space.
#[inline]
pub fn l3_of_l2(l2: Key) -> Key {
    debug_assert_eq!(l2.class(), PteClass::L2);
    Key::new(PteClass::L3, l2.task(), l2.page() >> PTE_SHIFT)
}

/// The L1K PTE of kernel data page `kvpn`.
#[inline]
pub fn l1k(kvpn: u64) -> Key {
    Key::new(PteClass::L1K, 0, kvpn)
}

/// The L3 PTE mapping the L2-table page that holds `kvpn`'s L1K PTE. Kernel L2 pages are
/// told apart from the task-0 L2 pages of [`l3_of_l2`] by a high page bit.
#[inline]
pub fn l3_of_l1k(kvpn: u64) -> Key {
    Key::new(PteClass::L3, 0, 1 << 44 | kvpn >> PTE_SHIFT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_nest() {
        let k = Key::new(PteClass::L1U, 7, 0x12345);
        assert_eq!((k.class(), k.task(), k.page()), (PteClass::L1U, 7, 0x12345));
        let l2 = l2_of_user(7, 0x12345);
        assert_eq!((l2.class(), l2.task(), l2.page()), (PteClass::L2, 7, 0x48));
        let l3 = l3_of_l2(l2);
        assert_eq!((l3.class(), l3.page()), (PteClass::L3, 0));
        // 1,024 L1U PTEs per L1 page: vpns 0..1023 share one L2 PTE.
        assert_eq!(l2_of_user(1, 0), l2_of_user(1, 1023));
        assert_ne!(l2_of_user(1, 0), l2_of_user(1, 1024));
        assert_ne!(l2_of_user(1, 0), l2_of_user(2, 0));
        assert_ne!(l3_of_l1k(5), l3_of_l2(l2_of_user(0, 5)));
        assert_ne!(Key::new(PteClass::L3, MAX_TASK, MAX_PAGE), Key::EMPTY);
    }
}
