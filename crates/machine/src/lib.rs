//! The machine layer of DESIGN.md: the hardware a protocol runs on.
//!
//! * [`tlb`] — set-associative or fully associative TLBs with FIFO, random
//!   or LRU replacement, optional ASID tags, per-entry and full flushes.
//! * [`pagetable`] — page-table formats (i386 two-level, x86-64 four-level,
//!   PAE three-level) stored in simulated physical frames, so every PTE has a
//!   physical address; the hardware walker sets reference/modify bits.
//! * [`physmem`] — physical frames holding data words or page tables.
//! * [`oracle`] — the translation oracle: every TLB entry used is checked,
//!   in O(1), against the current PTE and the completion of the last rights
//!   reduction (black89's correctness claim).

pub mod ids;
pub mod oracle;
pub mod pagetable;
pub mod physmem;
pub mod tlb;

pub use ids::{Asid, CpuId, Pfn, Vpn};
pub use oracle::{OpId, Oracle, Rights, UseCheck};
pub use pagetable::{PtFormat, Pte};
pub use physmem::PhysMem;
pub use tlb::{Policy, Refill, Tlb, TlbConfig, TlbEntry};

/// Asks the host to bring `r`'s cache line closer: a hint only, it changes
/// nothing the program can observe.
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    prefetch_ptr(r as *const T);
}

/// As [`prefetch`], for an address that need not be valid (a prefetch
/// never faults), so that callers skip bounds checks: the hint is
/// wasted, never wrong, if the address is off.
#[inline(always)]
pub fn prefetch_ptr<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees;
    // SSE is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
