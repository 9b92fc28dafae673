//! Page Table Entry CAMs (§4.2, Figs. 5–6).
//!
//! One PCAM per TLB, with as many entries as the TLB, fully associative.
//! Entry `i` holds the block address of the PTE behind TLB entry `i`
//! (§4.2: block granularity, so several entries may hold the same block and
//! one lookup may invalidate several translations, Fig. 6b). The exact PTE
//! address is kept beside it only for the false-invalidation statistic.
//!
//! A `PcamBank` is one core's PCAMs plus its Jetty filter (§6.4). It also
//! keeps an exact per-bucket count of its valid entries: a simulation
//! shortcut that lets a lookup that cannot match skip the scan. It never
//! changes a result (the count is exact), only the host's time.

use crate::cache::INVALID;
use crate::jetty::Jetty;

const BUCKETS: usize = 4096;

#[inline]
fn bucket(block: u64) -> usize {
    (block.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize
}

/// A match returned to the caller, who clears the TLB entry's Valid bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct TlbProbe {
    pub core: usize,
    /// 0 = I-TLB, 1 = D-TLB (with the default two TLBs per core).
    pub tlb: usize,
    pub index: usize,
}

/// The outcome of one PCAM lookup in one core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeResult {
    /// Entries invalidated.
    pub hits: u64,
    /// Of those, entries whose exact PTE differs from the stored one.
    pub false_hits: u64,
}

#[derive(Clone, Debug)]
pub struct PcamBank {
    entries: usize,
    blocks: Vec<u64>,
    pte_pa: Vec<u64>,
    counts: Vec<u16>,
    valid: usize,
    pub jetty: Jetty,
}

impl PcamBank {
    pub fn new(tlbs: usize, entries: usize) -> PcamBank {
        PcamBank {
            entries,
            blocks: vec![INVALID; tlbs * entries],
            pte_pa: vec![0; tlbs * entries],
            counts: vec![0; BUCKETS],
            valid: 0,
            jetty: Jetty::new(),
        }
    }

    fn slot(&self, tlb: usize, index: usize) -> usize {
        assert!(
            index < self.entries && tlb * self.entries < self.blocks.len(),
            "PCAM slot ({tlb}, {index}) out of range"
        );
        tlb * self.entries + index
    }

    /// The (block, exact PTE address) in a slot, if valid.
    pub fn get(&self, tlb: usize, index: usize) -> Option<(u64, u64)> {
        let s = self.slot(tlb, index);
        (self.blocks[s] != INVALID).then(|| (self.blocks[s], self.pte_pa[s]))
    }

    /// Valid entries in this core.
    pub fn len(&self) -> usize {
        self.valid
    }

    pub fn is_empty(&self) -> bool {
        self.valid == 0
    }

    fn remove_slot(&mut self, s: usize) -> u64 {
        let block = self.blocks[s];
        debug_assert_ne!(block, INVALID);
        self.blocks[s] = INVALID;
        self.counts[bucket(block)] -= 1;
        self.valid -= 1;
        self.jetty.remove(self.pte_pa[s]);
        block
    }

    /// Fig. 6a: writes `block` at the TLB entry's index, replacing what was
    /// there (a TLB replacement). Returns the replaced block, if any.
    /// `jetty_inc` false models the `jetty_misses_insert` fault.
    pub fn insert(
        &mut self,
        tlb: usize,
        index: usize,
        block: u64,
        pte_pa: u64,
        jetty_inc: bool,
    ) -> Option<u64> {
        let s = self.slot(tlb, index);
        let old = (self.blocks[s] != INVALID).then(|| self.remove_slot(s));
        self.blocks[s] = block;
        self.pte_pa[s] = pte_pa;
        self.counts[bucket(block)] += 1;
        self.valid += 1;
        if jetty_inc {
            self.jetty.insert(pte_pa);
        }
        old
    }

    /// Clears one slot (TLB replacement or flush of that entry).
    pub fn clear(&mut self, tlb: usize, index: usize) -> Option<u64> {
        let s = self.slot(tlb, index);
        (self.blocks[s] != INVALID).then(|| self.remove_slot(s))
    }

    /// Clears every slot of one PCAM (a TLB flush); `removed` gets each block.
    pub fn clear_all(&mut self, tlb: usize, mut removed: impl FnMut(u64)) {
        let base = self.slot(tlb, 0);
        for s in base..base + self.entries {
            if self.blocks[s] != INVALID {
                removed(self.remove_slot(s));
            }
        }
    }

    /// Exact: some valid entry holds `block`.
    #[inline]
    pub fn contains(&self, block: u64) -> bool {
        self.counts[bucket(block)] != 0 && self.blocks.contains(&block)
    }

    /// Hints the host to fetch what `contains(block)` reads first (see
    /// `cache::prefetch`).
    #[inline]
    pub fn prefetch(&self, block: u64) {
        // unchecked: `bucket` is below BUCKETS, and a hint never faults
        mmulab_engine::prefetch_ptr(self.counts.as_ptr().wrapping_add(bucket(block)));
    }

    /// Fig. 6b: invalidates every entry holding `block`, pushing a probe for
    /// each. `store_pa` is the stored address (None for an L2 recall), used
    /// to count false invalidations at PTE granularity.
    pub fn invalidate(
        &mut self,
        core: usize,
        block: u64,
        store_pa: Option<u64>,
        probes: &mut Vec<TlbProbe>,
    ) -> ProbeResult {
        let mut r = ProbeResult::default();
        if self.counts[bucket(block)] == 0 {
            return r;
        }
        for s in 0..self.blocks.len() {
            if self.blocks[s] == block {
                let pte = self.pte_pa[s];
                self.remove_slot(s);
                probes.push(TlbProbe {
                    core,
                    tlb: s / self.entries,
                    index: s % self.entries,
                });
                r.hits += 1;
                if let Some(pa) = store_pa
                    && pte / crate::config::PTE_BYTES != pa / crate::config::PTE_BYTES
                {
                    r.false_hits += 1;
                }
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fig6_insert_and_double_hit() {
        // Fig. 6a: two translations whose PTEs share block 12.
        let mut p = PcamBank::new(2, 4);
        assert_eq!(p.insert(1, 0, 12, 12 * 64, true), None);
        assert_eq!(p.insert(1, 2, 12, 12 * 64 + 8, true), None);
        assert_eq!(p.insert(1, 1, 13, 13 * 64, true), None);
        assert!(p.contains(12));
        let mut probes = Vec::new();
        // Fig. 6b: one invalidation of block 12 hits both.
        let r = p.invalidate(3, 12, Some(12 * 64), &mut probes);
        assert_eq!(r.hits, 2);
        assert_eq!(r.false_hits, 1, "the entry at +8 is another PTE");
        assert_eq!(
            probes,
            vec![
                TlbProbe {
                    core: 3,
                    tlb: 1,
                    index: 0
                },
                TlbProbe {
                    core: 3,
                    tlb: 1,
                    index: 2
                }
            ]
        );
        assert!(!p.contains(12));
        assert_eq!(p.get(1, 1), Some((13, 13 * 64)));
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn insert_overwrites_slot() {
        let mut p = PcamBank::new(1, 2);
        p.insert(0, 0, 5, 5 * 64, true);
        assert_eq!(p.insert(0, 0, 6, 6 * 64, true), Some(5));
        assert!(!p.contains(5));
        assert!(p.contains(6));
        assert_eq!(p.clear(0, 0), Some(6));
        assert_eq!(p.clear(0, 0), None);
        assert!(p.is_empty());
    }
}
