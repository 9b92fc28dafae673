//! The full-map directory's sharer list (§5.3.1, Table 1), core-granular.
//!
//! A core is a sharer while the block may be in its L1I, its L1D or any of
//! its PCAMs: TLBs are sharers exactly like instruction caches (§5.3.1).
//! The list lives in the block's L2 line (the home tile's L2 bank and
//! directory slice). Clean evictions and PCAM replacements are silent, so
//! the list is a superset of the true holders; only ownership requests and
//! writebacks shrink it.

/// Cores an ownership request by `requester` must invalidate: every sharer
/// and the owner, the requester excepted.
#[inline]
pub fn invalidation_targets(sharers: u64, owner: Option<usize>, requester: usize) -> u64 {
    let owner = owner.map_or(0, |o| 1u64 << o);
    (sharers | owner) & !(1u64 << requester)
}

/// §5.3.1: a core writing back a dirty/owned L1D block that is still in
/// its L1I or a PCAM sets the keep-sharer bit, and the directory keeps it
/// as a sharer. `forget` models the `directory_forgets_tlb_sharers` fault
/// (the bit ignored). Returns the new sharer list.
#[inline]
pub fn after_writeback(sharers: u64, core: usize, keep_bit: bool, forget: bool) -> u64 {
    if keep_bit && !forget {
        sharers
    } else {
        sharers & !(1u64 << core)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_exclude_requester_include_owner() {
        assert_eq!(invalidation_targets(0b1011, None, 1), 0b1001);
        assert_eq!(invalidation_targets(0b0001, Some(5), 0), 1 << 5);
        assert_eq!(invalidation_targets(0b0001, Some(0), 0), 0);
    }

    #[test]
    fn keep_bit() {
        assert_eq!(after_writeback(0b110, 1, true, false), 0b110);
        assert_eq!(after_writeback(0b110, 1, false, false), 0b100);
        assert_eq!(after_writeback(0b110, 1, true, true), 0b100, "the fault");
    }
}
