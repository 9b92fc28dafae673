//! The MOSI / translation invariant checker (issue 10 "Correctness"),
//! O(1) per access. The memory system feeds it the facts; it judges them.
//!
//! 1. Single writer or multiple readers per block across all L1s: a block
//!    with a copy in M (or E) has no other L1 copy. §5.2's S/M mix (a TLB
//!    entry beside an M copy in the same core's L1D) is not an L1 pair and
//!    is covered by invariant 3 instead. The counts come from the L1 arrays
//!    themselves, not from the controller's sharer vectors, so a controller
//!    that acks without invalidating is caught.
//! 2. Loads see the last store: each block has a global version, bumped by
//!    every store; every L1 copy carries the version it was filled or
//!    written with; a read hit on an older version is a violation.
//! 3. No PCAM entry outlives a store to its block (UNITD on): after a store
//!    completes (§5.3.2: all invalidations, TLBs included, acked), no valid
//!    PCAM slot in any core holds the block. Likewise no PCAM entry or L1
//!    copy outlives the L2 line's recall (inclusion).

#[derive(Clone, Debug, Default)]
pub struct Checker {
    pub enabled: bool,
    violations: u64,
    first: Option<String>,
}

impl Checker {
    pub fn new(enabled: bool) -> Checker {
        Checker {
            enabled,
            violations: 0,
            first: None,
        }
    }

    #[cold]
    pub fn report(&mut self, msg: impl FnOnce() -> String) {
        self.violations += 1;
        if self.first.is_none() {
            self.first = Some(msg());
        }
    }

    /// Invariant 1 after a transaction on `block`.
    #[inline]
    pub fn swmr(&mut self, block: u64, copies: u32, writers: u32) {
        if writers > 1 || (writers == 1 && copies > 1) {
            self.report(|| {
                format!("SWMR: block {block:#x} has {writers} writable and {copies} L1 copies")
            });
        }
    }

    /// Invariant 2 on a read hit.
    #[inline]
    pub fn load(&mut self, core: usize, block: u64, seen: u64, last: u64) {
        if seen != last {
            self.report(|| {
                format!(
                    "stale load: core {core} read block {block:#x} at version {seen}, last store made {last}"
                )
            });
        }
    }

    /// Invariant 3 after a store by `core`.
    #[inline]
    pub fn store_pcams(&mut self, core: usize, block: u64, pcam_entries: u32) {
        if pcam_entries != 0 {
            self.report(|| {
                format!(
                    "stale TLB: {pcam_entries} PCAM entries for block {block:#x} survived a store by core {core}"
                )
            });
        }
    }

    /// Inclusion after an L2 recall.
    #[inline]
    pub fn recall(&mut self, block: u64, l1_copies: u32, pcam_entries: u32) {
        if l1_copies != 0 || pcam_entries != 0 {
            self.report(|| {
                format!(
                    "recall: block {block:#x} left the L2 with {l1_copies} L1 copies and {pcam_entries} PCAM entries"
                )
            });
        }
    }

    pub fn violations(&self) -> u64 {
        self.violations
    }

    pub fn first_violation(&self) -> Option<String> {
        self.first.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges() {
        let mut c = Checker::new(true);
        c.swmr(1, 3, 0);
        c.swmr(1, 1, 1);
        c.load(0, 1, 4, 4);
        c.store_pcams(0, 1, 0);
        c.recall(1, 0, 0);
        assert_eq!(c.violations(), 0);
        c.swmr(2, 2, 1);
        c.load(0, 1, 3, 4);
        c.store_pcams(0, 1, 2);
        c.recall(1, 1, 0);
        assert_eq!(c.violations(), 4);
        assert!(c.first_violation().unwrap().starts_with("SWMR: block 0x2"));
    }
}
