//! Software-managed TLBs, after Uhlig et al., "Design Tradeoffs for Software-Managed TLBs"
//! (ACM TOCS 12(3), 1994; "uhlig94").
//!
//! * [`tlb`]: the MIPS R2000 TLB of §4.1 — 64 fully associative slots split by a partition
//!   point into a lower (software-filled, FIFO) and an upper (hardware Random register)
//!   partition — generalised to any partition point, size, upper-partition associativity
//!   (§5.4, fn. 1) and FIFO/random per partition (Fig. 10).
//! * [`pagetable`]: the page-table entry classes of Fig. 3 (L1U, L1K, L2, L3) and where
//!   each PTE lives, for the 3-level OSF/1 and Mach 3.0 tables and Ultrix's 2-level one.
//! * [`r2000`]: the R2000 itself (64 entries, 8 wired, the Random register counting down
//!   each cycle, 6-bit ASIDs with a flush on rollover) and the trap-driven run of one
//!   OS's reference stream on it (`mmulab trace sim --r2000`); it is also Tapeworm's
//!   real TLB in [`sim::simulate_trap`].
//! * [`layout`]: where each task's segments, the kernel's per-entry structures and mapped
//!   kernel data lie, and the L2 and L3 PTEs those addresses need (computed, not counted).
//! * [`costs`]: the miss types of Table III and the `decstation3100-1994` cost preset.
//! * [`os`]: the OS models of Table IV and §4.2 (what a system call touches).
//! * [`sim`]: the miss handler (`swtlb`), direct simulation of many configurations, the
//!   Tapeworm `trap` mode of §3.2, and dynamic partitioning (§5.2.2).
//! * [`workload`]: synthetic stand-ins for Table I and Fig. 9, and adapters from
//!   `mmulab-trace` page-reference streams.
//!
//! This crate is a dedicated model rather than an extension of `mmulab-machine`'s TLB: the
//! machine TLB is the oracle-checked multiprocessor structure (ASIDs, global entries, PTE
//! blocks, hint array), while uhlig94's questions need slot-numbered partitions, per-PTE-class
//! placement, a Random register over a movable range, and inclusion between a real and many
//! simulated TLBs — all on a hot path run once per configuration per reference.

pub mod costs;
pub mod layout;
pub mod os;
pub mod pagetable;
pub mod r2000;
pub mod sim;
pub mod tlb;
pub mod workload;

pub use costs::{CostPreset, MissType};
pub use os::{OsKind, OsParams};
pub use pagetable::{Key, PteClass};
pub use r2000::{R2000, R2000Config, R2000Outcome, simulate_r2000};
pub use sim::{
    DynamicPartition, Outcome, Placement, SimError, TlbSetup, simulate_direct, simulate_trap,
};
pub use tlb::{Repl, SwTlb};
pub use workload::{Event, SysClass, Workload};
