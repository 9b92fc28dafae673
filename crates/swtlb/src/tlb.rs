//! The MIPS R2000 TLB (uhlig94 §4.1), generalised.
//!
//! `slots` entries, numbered. Slots `0..lower` are the lower partition, filled by software
//! at an index it chooses (FIFO in the baseline systems, §5.2.1); slots `lower..slots` are
//! the upper partition, filled at the index of the Random register, which on the R2000
//! returns 8..63 (so `lower` = 8). Either partition may use FIFO or random replacement
//! (Fig. 10). The upper partition may be set-associative (§5.4): `upper_ways` slots per set,
//! the set chosen by the low bits of the mapping's page number (fn. 1). A lookup searches
//! every slot (the R2000 is fully associative); only placement is restricted.
//!
//! Slots are found by an index from key to slot (lookups only, never iterated, so results
//! do not depend on hashing).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use mmulab_engine::SimRng;

use crate::pagetable::Key;

/// Replacement within one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Repl {
    /// Round-robin over the partition's slots (software FIFO index).
    Fifo,
    /// A uniformly random slot of the partition (the R2000 Random register).
    Random,
    /// Least recently used. Software cannot see TLB hits, so no R2000 handler can do
    /// this (§5.2.1); direct simulation offers it for comparison, `trap` mode refuses it.
    Lru,
}

/// Which partition a fill goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Lower,
    Upper,
}

/// A fixed multiplicative hasher: deterministic and fast for `u64` keys.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ v >> 29).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Index = HashMap<u64, u32, BuildHasherDefault<KeyHasher>>;

/// A partitioned, software-filled TLB.
#[derive(Clone, Debug)]
pub struct SwTlb {
    slots: Vec<Key>,
    index: Index,
    lower: usize,
    /// 0: the upper partition is fully associative.
    upper_ways: usize,
    lower_repl: Repl,
    upper_repl: Repl,
    lower_next: usize,
    /// FIFO pointer per upper set (one entry when fully associative).
    upper_next: Vec<usize>,
    /// Last use of each slot (LRU only; a counter, not time).
    stamp: Vec<u64>,
    clock: u64,
    rng: SimRng,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyHasher")
    }
}

impl SwTlb {
    /// `slots` entries, the lower partition `0..lower`, an upper partition of `upper_ways`
    /// ways per set (0 = fully associative). Panics on an inconsistent shape; callers
    /// validate their inputs first ([`crate::sim::TlbSetup::validate`]).
    pub fn new(
        slots: usize,
        lower: usize,
        upper_ways: usize,
        lower_repl: Repl,
        upper_repl: Repl,
        rng: SimRng,
    ) -> SwTlb {
        assert!(slots > 0 && lower < slots, "{lower} lower slots of {slots}");
        let upper = slots - lower;
        let sets = if upper_ways == 0 {
            1
        } else {
            assert!(
                upper.is_multiple_of(upper_ways) && (upper / upper_ways).is_power_of_two(),
                "{upper} upper slots in sets of {upper_ways}"
            );
            upper / upper_ways
        };
        SwTlb {
            slots: vec![Key::EMPTY; slots],
            index: Index::with_capacity_and_hasher(slots * 2, Default::default()),
            lower,
            upper_ways,
            lower_repl,
            upper_repl,
            lower_next: 0,
            upper_next: vec![0; sets],
            stamp: vec![0; slots],
            clock: 0,
            rng,
        }
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }
    pub fn lower(&self) -> usize {
        self.lower
    }

    /// Is `key` cached? (A hit changes no state: FIFO and random ignore hits.)
    #[inline]
    pub fn contains(&self, key: Key) -> bool {
        self.index.contains_key(&key.0)
    }

    /// Records a use of `key` for LRU (a no-op for absent keys).
    #[inline]
    pub fn touch(&mut self, key: Key) {
        if let Some(&s) = self.index.get(&key.0) {
            self.clock += 1;
            self.stamp[s as usize] = self.clock;
        }
    }

    /// The least recently used slot of `base..base + n` (an empty one first).
    fn lru_in(&self, base: usize, n: usize) -> usize {
        (base..base + n)
            .min_by_key(|&s| {
                if self.slots[s] == Key::EMPTY {
                    0
                } else {
                    self.stamp[s]
                }
            })
            .expect("a non-empty range")
    }

    /// The slot holding `key`, if any.
    pub fn slot_of(&self, key: Key) -> Option<usize> {
        self.index.get(&key.0).map(|&s| s as usize)
    }

    /// The key in slot `s` (`Key::EMPTY` if none).
    pub fn key_at(&self, s: usize) -> Key {
        self.slots[s]
    }

    /// Number of valid entries.
    pub fn len(&self) -> usize {
        self.index.len()
    }
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Moves the partition point (dynamic partitioning, §5.2.2). Entries stay where they
    /// are, as on the R2000, where the partition only bounds the Random register and the
    /// software FIFO index. Only for a fully associative upper partition.
    pub fn set_lower(&mut self, lower: usize) {
        assert!(lower < self.slots.len() && self.upper_ways == 0);
        self.lower = lower;
        if self.lower_next >= lower {
            self.lower_next = 0;
        }
    }

    /// Fills `key` (not present) into partition `part`; returns the victim, if a valid
    /// entry was replaced. With an empty lower partition, lower fills go to the upper one.
    pub fn insert(&mut self, key: Key, part: Part) -> Option<Key> {
        debug_assert!(!self.contains(key), "{key:?} filled twice");
        let slot = match part {
            Part::Lower if self.lower > 0 => match self.lower_repl {
                Repl::Fifo => {
                    let s = self.lower_next;
                    self.lower_next = (s + 1) % self.lower;
                    s
                }
                Repl::Random => self.rng.below(self.lower as u64) as usize,
                Repl::Lru => self.lru_in(0, self.lower),
            },
            _ => {
                let upper = self.slots.len() - self.lower;
                let (base, ways, set) = if self.upper_ways == 0 {
                    (self.lower, upper, 0)
                } else {
                    let sets = self.upper_next.len();
                    let set = (key.page() as usize) & (sets - 1);
                    (self.lower + set * self.upper_ways, self.upper_ways, set)
                };
                let off = match self.upper_repl {
                    Repl::Fifo => {
                        let o = self.upper_next[set] % ways;
                        self.upper_next[set] = (o + 1) % ways;
                        o
                    }
                    Repl::Random => self.rng.below(ways as u64) as usize,
                    Repl::Lru => self.lru_in(base, ways) - base,
                };
                base + off
            }
        };
        let victim = std::mem::replace(&mut self.slots[slot], key);
        if victim != Key::EMPTY {
            let removed = self.index.remove(&victim.0);
            debug_assert_eq!(removed, Some(slot as u32));
        }
        self.index.insert(key.0, slot as u32);
        self.clock += 1;
        self.stamp[slot] = self.clock;
        (victim != Key::EMPTY).then_some(victim)
    }

    /// Removes `key` if present (a shoot-out, e.g. by Tapeworm's inclusion rule).
    pub fn remove(&mut self, key: Key) -> bool {
        match self.index.remove(&key.0) {
            Some(s) => {
                self.slots[s as usize] = Key::EMPTY;
                true
            }
            None => false,
        }
    }

    /// Checks the index against the slots (tests and debug assertions).
    pub fn check(&self) {
        let valid = self.slots.iter().filter(|k| **k != Key::EMPTY).count();
        assert_eq!(valid, self.index.len());
        for (s, k) in self.slots.iter().enumerate() {
            if *k != Key::EMPTY {
                assert_eq!(self.index.get(&k.0), Some(&(s as u32)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagetable::PteClass;

    fn k(p: u64) -> Key {
        Key::new(PteClass::L1U, 1, p)
    }

    #[test]
    fn lower_fifo_stays_in_lower_slots() {
        let mut t = SwTlb::new(64, 8, 0, Repl::Fifo, Repl::Random, SimRng::new(1, "t"));
        for p in 0..20 {
            t.insert(Key::new(PteClass::L2, 1, p), Part::Lower);
        }
        // FIFO over 8 slots keeps the last 8.
        for p in 0..12 {
            assert!(!t.contains(Key::new(PteClass::L2, 1, p)));
        }
        for p in 12..20 {
            let s = t.slot_of(Key::new(PteClass::L2, 1, p)).unwrap();
            assert!(s < 8);
        }
        t.check();
    }

    #[test]
    fn random_register_range_is_the_upper_partition() {
        let mut t = SwTlb::new(64, 8, 0, Repl::Fifo, Repl::Random, SimRng::new(2, "t"));
        for p in 0..1000 {
            if let Some(s) = t.slot_of(k(p)) {
                panic!("{p} present in {s}");
            }
            t.insert(k(p), Part::Upper);
            let s = t.slot_of(k(p)).unwrap();
            assert!((8..64).contains(&s), "slot {s}");
        }
        assert!(t.len() <= 56);
        t.check();
    }

    #[test]
    fn set_associative_upper_places_by_low_page_bits() {
        // 32 upper slots, 4-way: 8 sets; pages p and p+8 share a set.
        let mut t = SwTlb::new(48, 16, 4, Repl::Fifo, Repl::Fifo, SimRng::new(3, "t"));
        for i in 0..5 {
            t.insert(k(3 + 8 * i), Part::Upper);
        }
        assert!(
            !t.contains(k(3)),
            "the fifth fill of a 4-way set evicts the first"
        );
        for i in 1..5 {
            let s = t.slot_of(k(3 + 8 * i)).unwrap();
            assert_eq!((s - 16) / 4, 3);
        }
        t.check();
    }

    #[test]
    fn moving_the_partition_keeps_entries() {
        let mut t = SwTlb::new(64, 8, 0, Repl::Fifo, Repl::Random, SimRng::new(4, "t"));
        for p in 0..8 {
            t.insert(Key::new(PteClass::L2, 1, p), Part::Lower);
        }
        t.set_lower(4);
        assert_eq!(t.len(), 8);
        t.insert(Key::new(PteClass::L2, 1, 99), Part::Lower);
        assert!(t.slot_of(Key::new(PteClass::L2, 1, 99)).unwrap() < 4);
    }
}
