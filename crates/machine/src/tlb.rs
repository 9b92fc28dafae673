//! A translation lookaside buffer.
//!
//! `entries` slots split into `entries / ways` sets; the set index is the
//! low bits of the virtual page number (uhlig94 fn. 1). `ways == entries` is
//! fully associative. Replacement within a set is FIFO (insertion order),
//! LRU (last use) or random (a seeded stream). With ASIDs, entries are
//! tagged and a context switch need not flush; without, the ASID field is
//! ignored (always 0). Global entries (kernel mappings) survive non-global
//! flushes.
//!
//! Fully associative lookups would scan every slot; a direct-mapped hint
//! array (vpn → last slot seen) makes the common case one compare. The hint
//! is only a guess: a lookup always verifies the slot it names.

use crate::ids::{Asid, Pfn, Vpn};
use mmulab_engine::SimRng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Fifo,
    Lru,
    Random,
}

/// Who fills the TLB on a miss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Refill {
    /// A hardware page-table walker (x86).
    #[default]
    Hardware,
    /// A trap to a software miss handler that walks the table and writes
    /// the entry (MIPS R2000, uhlig94).
    Software,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlbConfig {
    /// Number of entries (slots).
    #[serde(default = "TlbConfig::default_entries")]
    pub entries: usize,
    /// Associativity; equal to `entries` for fully associative.
    #[serde(default = "TlbConfig::default_entries")]
    pub ways: usize,
    #[serde(default = "TlbConfig::default_policy")]
    pub policy: Policy,
    /// Entries carry an ASID tag; context switches do not flush.
    #[serde(default)]
    pub asid: bool,
    #[serde(default)]
    pub refill: Refill,
}

impl Default for TlbConfig {
    fn default() -> Self {
        TlbConfig {
            entries: 64,
            ways: 64,
            policy: Policy::Lru,
            asid: false,
            refill: Refill::Hardware,
        }
    }
}

impl TlbConfig {
    fn default_entries() -> usize {
        64
    }
    fn default_policy() -> Policy {
        Policy::Lru
    }

    /// The most entries a TLB may have: 2^20, far above any TLB built (the
    /// papers' largest is 512) and the limit `mmulab trace sim` keeps. Each
    /// CPU's TLB is allocated whole before the run (about 100 bytes an
    /// entry), so 10^8 entries aborted on allocation.
    pub const MAX_ENTRIES: usize = 1 << 20;

    /// Checks the geometry; the error names the offending key.
    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        if self.entries == 0 || self.entries > Self::MAX_ENTRIES {
            return Err(format!(
                "{prefix}.entries: must be 1 to {} (2^20), got {}",
                Self::MAX_ENTRIES,
                self.entries
            ));
        }
        if self.ways == 0 {
            return Err(format!("{prefix}.ways: must be at least 1"));
        }
        if self.ways > self.entries {
            return Err(format!(
                "{prefix}.ways: a TLB cannot have more ways ({}) than entries ({})",
                self.ways, self.entries
            ));
        }
        if !self.entries.is_multiple_of(self.ways) {
            return Err(format!(
                "{prefix}.ways: {} entries do not divide into {}-way sets",
                self.entries, self.ways
            ));
        }
        let sets = self.entries / self.ways;
        if !sets.is_power_of_two() {
            return Err(format!(
                "{prefix}.entries: entries / ways = {sets} sets, which is not a power of two"
            ));
        }
        Ok(())
    }
}

/// One cached translation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlbEntry {
    pub valid: bool,
    pub vpn: Vpn,
    pub asid: Asid,
    pub global: bool,
    pub pfn: Pfn,
    pub writable: bool,
    pub user: bool,
    /// The modify bit as cached: a store through a clean entry must first
    /// set the PTE's modify bit (and re-check the PTE, black89 fn. 6).
    pub dirty: bool,
    /// The oracle's shadow slot for (address space, vpn).
    pub oracle_slot: u32,
    /// The oracle epoch of that slot when the entry was filled.
    pub fill_epoch: u32,
    /// Physical address of the last-level PTE (UNITD's PCAM key, §4.1).
    pub pte_pa: u64,
}

#[derive(Debug, Clone)]
pub struct Tlb {
    cfg: TlbConfig,
    set_mask: u64,
    ways: usize,
    slots: Vec<TlbEntry>,
    /// Per slot: last use (LRU) or insertion time (FIFO).
    stamp: Vec<u64>,
    clock: u64,
    hint: Vec<u32>,
    hint_mask: u64,
    rng: SimRng,
    pub hits: u64,
    pub misses: u64,
}

impl Tlb {
    pub fn new(cfg: &TlbConfig, rng: SimRng) -> Tlb {
        cfg.validate("tlb").expect("validated before construction");
        let sets = cfg.entries / cfg.ways;
        let hint_len = (cfg.entries * 2).next_power_of_two();
        Tlb {
            cfg: cfg.clone(),
            set_mask: sets as u64 - 1,
            ways: cfg.ways,
            slots: vec![TlbEntry::default(); cfg.entries],
            stamp: vec![0; cfg.entries],
            clock: 0,
            hint: vec![0; hint_len],
            hint_mask: hint_len as u64 - 1,
            rng,
            hits: 0,
            misses: 0,
        }
    }

    pub fn config(&self) -> &TlbConfig {
        &self.cfg
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn tag_asid(&self, asid: Asid) -> Asid {
        if self.cfg.asid { asid } else { Asid(0) }
    }

    #[inline]
    fn matches(e: &TlbEntry, vpn: Vpn, asid: Asid) -> bool {
        e.valid && e.vpn == vpn && (e.global || e.asid == asid)
    }

    /// Finds the slot holding `vpn` for `asid` and records the use.
    #[inline]
    pub fn lookup(&mut self, vpn: Vpn, asid: Asid) -> Option<usize> {
        let asid = self.tag_asid(asid);
        let h = (vpn.0 & self.hint_mask) as usize;
        let guess = self.hint[h] as usize;
        let set_base = ((vpn.0 & self.set_mask) as usize) * self.ways;
        let found = if guess >= set_base
            && guess < set_base + self.ways
            && Self::matches(&self.slots[guess], vpn, asid)
        {
            Some(guess)
        } else {
            let f = (set_base..set_base + self.ways)
                .find(|&i| Self::matches(&self.slots[i], vpn, asid));
            if let Some(i) = f {
                self.hint[h] = i as u32;
            }
            f
        };
        match found {
            Some(i) => {
                self.hits += 1;
                if self.cfg.policy == Policy::Lru {
                    self.clock += 1;
                    self.stamp[i] = self.clock;
                }
            }
            None => self.misses += 1,
        }
        found
    }

    /// Records `n` more uses of `slot`, which `lookup` found for the same
    /// page with nothing in this TLB changed since: the hit count and LRU
    /// stamp that `n` more `lookup`s one after the other would leave (the
    /// last stamp is the only one that stays), without searching again.
    /// The hint is host-only state and stays as that `lookup` left it.
    /// Callers check the precondition with `probe` in debug builds.
    #[inline(always)]
    pub fn hits_again(&mut self, slot: usize, n: u64) {
        if n == 0 {
            return;
        }
        self.hits += n;
        if self.cfg.policy == Policy::Lru {
            self.clock += n;
            self.stamp[slot] = self.clock;
        }
    }

    /// Host-only hint: brings the TLB's own fields (sizes, masks, where
    /// its arrays are) closer, ahead of a `prefetch` or a lookup.
    #[inline]
    pub fn prefetch_header(&self) {
        crate::prefetch(&self.hint);
        crate::prefetch(&self.slots);
        crate::prefetch(&self.set_mask);
        crate::prefetch(&self.clock);
    }

    /// Host-only hint: brings what a lookup of `vpn` reads (its hint, its
    /// set's entries and stamps) closer. No effect on the TLB.
    #[inline]
    pub fn prefetch(&self, vpn: Vpn) {
        // (Addresses only, in bounds by construction: see `prefetch_ptr`.)
        let h = (vpn.0 & self.hint_mask) as usize;
        crate::prefetch_ptr(self.hint.as_ptr().wrapping_add(h));
        let set_base = ((vpn.0 & self.set_mask) as usize) * self.ways;
        crate::prefetch_ptr(self.stamp.as_ptr().wrapping_add(set_base));
        // every line the set's entries span
        let set = self.slots.as_ptr().wrapping_add(set_base).cast::<u8>();
        let bytes = self.ways * std::mem::size_of::<TlbEntry>();
        let mut off = 0;
        while off < bytes {
            crate::prefetch_ptr(set.wrapping_add(off));
            off += 64;
        }
        crate::prefetch_ptr(set.wrapping_add(bytes - 1));
    }

    /// Looks without counting or touching replacement state.
    pub fn probe(&self, vpn: Vpn, asid: Asid) -> Option<usize> {
        let asid = self.tag_asid(asid);
        let set_base = ((vpn.0 & self.set_mask) as usize) * self.ways;
        (set_base..set_base + self.ways).find(|&i| Self::matches(&self.slots[i], vpn, asid))
    }

    pub fn entry(&self, slot: usize) -> &TlbEntry {
        &self.slots[slot]
    }

    pub fn entry_mut(&mut self, slot: usize) -> &mut TlbEntry {
        &mut self.slots[slot]
    }

    pub fn entries(&self) -> &[TlbEntry] {
        &self.slots
    }

    /// Inserts a translation, returning its slot and the valid entry it
    /// displaced, if any. An existing entry for the same page is replaced
    /// in place (a refill after a modify-bit walk, say).
    pub fn insert(&mut self, mut e: TlbEntry) -> (usize, Option<TlbEntry>) {
        e.valid = true;
        e.asid = self.tag_asid(e.asid);
        let set_base = ((e.vpn.0 & self.set_mask) as usize) * self.ways;
        // One pass over the set: a slot already holding the page wins, then
        // the first invalid slot, then the replacement policy's victim
        // (oldest stamp, lowest index on ties).
        let mut same = None;
        let mut free = None;
        let mut oldest = (u64::MAX, set_base);
        for i in set_base..set_base + self.ways {
            let s = &self.slots[i];
            if !s.valid {
                free = free.or(Some(i));
            } else if Self::matches(s, e.vpn, e.asid) {
                same = Some(i);
                break;
            } else if self.stamp[i] < oldest.0 {
                oldest = (self.stamp[i], i);
            }
        }
        let slot = match (same, free) {
            (Some(i), _) | (None, Some(i)) => i,
            (None, None) => match self.cfg.policy {
                Policy::Random => set_base + self.rng.below(self.ways as u64) as usize,
                Policy::Fifo | Policy::Lru => oldest.1,
            },
        };
        let old = self.slots[slot];
        let victim = if old.valid && !(old.vpn == e.vpn && old.asid == e.asid) {
            Some(old)
        } else {
            None
        };
        self.slots[slot] = e;
        self.clock += 1;
        self.stamp[slot] = self.clock;
        self.hint[(e.vpn.0 & self.hint_mask) as usize] = slot as u32;
        (slot, victim)
    }

    /// Invalidates the entry for one page (all ASIDs when `asid` is None).
    /// Returns the number of entries invalidated.
    pub fn invalidate_page(&mut self, vpn: Vpn, asid: Option<Asid>) -> usize {
        let set_base = ((vpn.0 & self.set_mask) as usize) * self.ways;
        let asid = asid.map(|a| self.tag_asid(a));
        let mut n = 0;
        for i in set_base..set_base + self.ways {
            let s = &mut self.slots[i];
            if s.valid && s.vpn == vpn && (asid.is_none() || s.global || Some(s.asid) == asid) {
                s.valid = false;
                n += 1;
            }
        }
        n
    }

    /// Invalidates every entry. Returns how many were valid.
    pub fn flush_all(&mut self) -> usize {
        let mut n = 0;
        for s in &mut self.slots {
            n += s.valid as usize;
            s.valid = false;
        }
        n
    }

    /// Invalidates every non-global entry (a CR3 load on x86).
    pub fn flush_non_global(&mut self) -> usize {
        let mut n = 0;
        for s in &mut self.slots {
            if s.valid && !s.global {
                s.valid = false;
                n += 1;
            }
        }
        n
    }

    /// Invalidates the non-global entries of one ASID.
    pub fn flush_asid(&mut self, asid: Asid) -> usize {
        let asid = self.tag_asid(asid);
        let mut n = 0;
        for s in &mut self.slots {
            if s.valid && !s.global && s.asid == asid {
                s.valid = false;
                n += 1;
            }
        }
        n
    }

    /// Invalidates entries whose last-level PTE lies in the given physical
    /// block (UNITD's PCAM match, §4.2). Returns how many.
    pub fn invalidate_pte_block(&mut self, block_pa: u64, block_bytes: u64) -> usize {
        let mut n = 0;
        for s in &mut self.slots {
            if s.valid && s.pte_pa / block_bytes == block_pa / block_bytes {
                s.valid = false;
                n += 1;
            }
        }
        n
    }

    pub fn valid_count(&self) -> usize {
        self.slots.iter().filter(|s| s.valid).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn tlb(entries: usize, ways: usize, policy: Policy) -> Tlb {
        Tlb::new(
            &TlbConfig {
                entries,
                ways,
                policy,
                asid: false,
                refill: Refill::Hardware,
            },
            SimRng::new(1, "tlb"),
        )
    }

    fn fill(t: &mut Tlb, vpn: u64) {
        t.insert(TlbEntry {
            vpn: Vpn(vpn),
            pfn: Pfn(vpn + 100),
            ..Default::default()
        });
    }

    /// Reference model of one set: a list ordered by replacement priority.
    fn reference_misses(refs: &[u64], entries: usize, ways: usize, policy: Policy) -> u64 {
        let sets = entries / ways;
        let mut model: Vec<VecDeque<u64>> = vec![VecDeque::new(); sets];
        let mut misses = 0;
        for &v in refs {
            let s = &mut model[(v as usize) % sets];
            if let Some(pos) = s.iter().position(|&x| x == v) {
                if policy == Policy::Lru {
                    s.remove(pos);
                    s.push_back(v);
                }
            } else {
                misses += 1;
                if s.len() == ways {
                    s.pop_front();
                }
                s.push_back(v);
            }
        }
        misses
    }

    fn run(refs: &[u64], entries: usize, ways: usize, policy: Policy) -> u64 {
        let mut t = tlb(entries, ways, policy);
        for &v in refs {
            if t.lookup(Vpn(v), Asid(0)).is_none() {
                fill(&mut t, v);
            }
        }
        t.misses
    }

    proptest! {
        #[test]
        fn lru_matches_reference(refs in proptest::collection::vec(0u64..40, 0..400), ways_log in 0u32..4) {
            let ways = 1usize << ways_log;
            prop_assert_eq!(run(&refs, 16, ways, Policy::Lru), reference_misses(&refs, 16, ways, Policy::Lru));
        }

        #[test]
        fn fifo_matches_reference(refs in proptest::collection::vec(0u64..40, 0..400), ways_log in 0u32..4) {
            let ways = 1usize << ways_log;
            prop_assert_eq!(run(&refs, 16, ways, Policy::Fifo), reference_misses(&refs, 16, ways, Policy::Fifo));
        }

        #[test]
        fn random_never_holds_more_than_capacity_and_hits_resident(refs in proptest::collection::vec(0u64..40, 1..400)) {
            let mut t = tlb(8, 8, Policy::Random);
            for &v in &refs {
                if t.lookup(Vpn(v), Asid(0)).is_none() {
                    fill(&mut t, v);
                }
                prop_assert!(t.valid_count() <= 8);
                prop_assert!(t.probe(Vpn(v), Asid(0)).is_some(), "just-used page is resident");
            }
        }
    }

    #[test]
    fn fifo_evicts_oldest_even_if_recently_used() {
        let mut t = tlb(2, 2, Policy::Fifo);
        fill(&mut t, 1);
        fill(&mut t, 2);
        assert!(t.lookup(Vpn(1), Asid(0)).is_some());
        let (_, victim) = t.insert(TlbEntry {
            vpn: Vpn(3),
            ..Default::default()
        });
        assert_eq!(victim.unwrap().vpn, Vpn(1));
    }

    #[test]
    fn lru_evicts_least_recently_used() {
        let mut t = tlb(2, 2, Policy::Lru);
        fill(&mut t, 1);
        fill(&mut t, 2);
        assert!(t.lookup(Vpn(1), Asid(0)).is_some());
        let (_, victim) = t.insert(TlbEntry {
            vpn: Vpn(3),
            ..Default::default()
        });
        assert_eq!(victim.unwrap().vpn, Vpn(2));
    }

    #[test]
    fn asid_tags_separate_spaces_and_globals_match_all() {
        let mut t = Tlb::new(
            &TlbConfig {
                entries: 8,
                ways: 8,
                policy: Policy::Lru,
                asid: true,
                refill: Refill::Hardware,
            },
            SimRng::new(1, "t"),
        );
        t.insert(TlbEntry {
            vpn: Vpn(5),
            asid: Asid(1),
            ..Default::default()
        });
        t.insert(TlbEntry {
            vpn: Vpn(9),
            asid: Asid(1),
            global: true,
            ..Default::default()
        });
        assert!(t.lookup(Vpn(5), Asid(2)).is_none());
        assert!(t.lookup(Vpn(5), Asid(1)).is_some());
        assert!(t.lookup(Vpn(9), Asid(2)).is_some());
        assert_eq!(t.flush_asid(Asid(1)), 1);
        assert!(t.lookup(Vpn(9), Asid(3)).is_some(), "global survives");
        assert_eq!(t.flush_non_global(), 0);
        assert_eq!(t.flush_all(), 1);
    }

    #[test]
    fn invalidate_page_and_pte_block() {
        let mut t = tlb(8, 2, Policy::Lru);
        t.insert(TlbEntry {
            vpn: Vpn(1),
            pte_pa: 0x1008,
            ..Default::default()
        });
        t.insert(TlbEntry {
            vpn: Vpn(2),
            pte_pa: 0x1010,
            ..Default::default()
        });
        t.insert(TlbEntry {
            vpn: Vpn(3),
            pte_pa: 0x2000,
            ..Default::default()
        });
        assert_eq!(t.invalidate_page(Vpn(3), None), 1);
        assert_eq!(
            t.invalidate_pte_block(0x1000, 64),
            2,
            "one block holds both PTEs"
        );
        assert_eq!(t.valid_count(), 0);
    }

    #[test]
    fn geometry_errors_name_the_key() {
        let c = TlbConfig {
            entries: 4,
            ways: 8,
            ..Default::default()
        };
        assert!(
            c.validate("machine.tlb")
                .unwrap_err()
                .starts_with("machine.tlb.ways")
        );
        let c = TlbConfig {
            entries: 12,
            ways: 4,
            ..Default::default()
        };
        assert!(
            c.validate("machine.tlb")
                .unwrap_err()
                .starts_with("machine.tlb.entries")
        );
    }
}
