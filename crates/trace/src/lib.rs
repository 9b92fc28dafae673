//! Memory traces and fast TLB simulation.
//!
//! * [`lackey`]: a streaming decoder of Valgrind lackey logs (`--trace-mem=yes
//!   --trace-syscalls=yes`), and [`PageSplitter`], which turns each access into the page
//!   references a TLB sees (a page-crossing access touches every page in address order;
//!   `M` is a load then a store to one address).
//! * [`binary`]: mmulab's compact binary trace (see `FORMAT.md`).
//! * [`source`]: opens either kind of trace (auto-detected by magic) as a stream of
//!   [`PageRef`] batches at a chosen page size.
//! * [`sim`]: a set-associative TLB (LRU, FIFO, random), [`mattson`]: one-pass stack
//!   simulation of every fully associative LRU size, [`sweep`]: lock-step simulation of many
//!   configurations.
//! * [`capture`]: runs a command under lackey and writes binary traces; [`export`]: Dinero
//!   IV's `xdin` format of exactly the references simulated; [`bench`]: the speed report.
//!
//! Tapeworm (uhlig94 §3.2) simulated many TLB configurations from one stream of misses;
//! this crate does the trace-driven analogue: one pass over a trace, many configurations.
//! uhlig94 footnote 1: set-associativity is emulated by letting a mapping's VPN bits choose
//! its set; here the set index is the low bits of the VPN.

pub mod bench;
pub mod binary;
pub mod capture;
pub mod dinero;
mod error;
pub mod export;
pub mod input;
pub mod lackey;
mod mapped;
pub mod mattson;
pub mod sim;
pub mod source;
pub mod sweep;

pub use bench::{BenchOptions, BenchReport, bench};
pub use capture::{CaptureOptions, CaptureSummary, capture, capture_with};
pub use error::{Result, TraceError};
pub use export::{ExportFormat, export, export_xdin};
pub use lackey::{LackeyDecoder, LackeySink, LineKind, PageSplitter, SyscallEvent, SyscallPhase};
pub use mattson::{StackResult, StackSim, stack_pass, stack_sim};
pub use sim::{Policy, SimOptions, SimResult, Tlb};
pub use source::{ReadOptions, RefSource, load_refs, open_trace, simulate};
pub use sweep::{grid, parse_ways, sweep, sweep_refs};

use serde::{Deserialize, Serialize};

/// What a reference does, numbered as Dinero IV's `din` labels (0 read, 1 write, 2 ifetch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum AccessKind {
    Load = 0,
    Store = 1,
    Ifetch = 2,
}

impl AccessKind {
    /// From the low two bits of a [`PageRef`]; 3 is never produced.
    #[inline]
    pub fn from_bits(bits: u64) -> AccessKind {
        match bits & 3 {
            0 => AccessKind::Load,
            1 => AccessKind::Store,
            _ => AccessKind::Ifetch,
        }
    }
}

/// One page reference, packed in a `u64`: `vpn << 3 | continuation << 2 | kind`.
///
/// `continuation` marks the second and later pages of one page-crossing access: a
/// coarser page size may merge it into the piece before it (see [`PageRef::coarsen`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageRef(pub u64);

/// Largest virtual page number a [`PageRef`] can hold.
pub const MAX_VPN: u64 = (1 << 61) - 1;

impl PageRef {
    #[inline]
    pub fn new(vpn: u64, kind: AccessKind, continuation: bool) -> PageRef {
        debug_assert!(vpn <= MAX_VPN);
        PageRef(vpn << 3 | (continuation as u64) << 2 | kind as u64)
    }
    #[inline]
    pub fn vpn(self) -> u64 {
        self.0 >> 3
    }
    #[inline]
    pub fn kind(self) -> AccessKind {
        AccessKind::from_bits(self.0)
    }
    #[inline]
    pub fn is_continuation(self) -> bool {
        self.0 & 4 != 0
    }
}

impl std::fmt::Debug for PageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}@{:#x}{}",
            self.kind(),
            self.vpn(),
            if self.is_continuation() { "+" } else { "" }
        )
    }
}

/// log2 of a page size, which must be a power of two from 8 bytes to 2^40:
/// at 8 bytes or more every page of the 64-bit address space has a number
/// a [`PageRef`] holds (at 4, addresses from 2^63 up did not).
pub fn page_shift(page_size: u64) -> Result<u32> {
    if !page_size.is_power_of_two() || !(8..=1 << 40).contains(&page_size) {
        return Err(TraceError::InvalidOptions(format!(
            "--page-size {page_size}: must be a power of two between 8 and 2^40 bytes"
        )));
    }
    Ok(page_size.trailing_zeros())
}

/// The largest page number a trace split at `page_shift` may hold: every
/// page of the 64-bit address space, within what a [`PageRef`] packs.
pub fn max_vpn(page_shift: u32) -> u64 {
    (u64::MAX >> page_shift).min(MAX_VPN)
}
