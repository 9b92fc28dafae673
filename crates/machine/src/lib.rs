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

// (Re-exported: the kernel's hot path reaches them through this crate.)
pub use mmulab_engine::{prefetch, prefetch_ptr};
