//! A set-associative cache of block addresses with LRU replacement, used for
//! the private L1I/L1D and the shared L2 (Table 1). It stores tags and a
//! per-line payload (`M`): coherence state for an L1, directory and sharer
//! bookkeeping for the L2. It holds no data; data values are modelled by
//! version numbers (see `checker`).
//!
//! The set index is the low bits of the block address. Tags are whole block
//! addresses; `INVALID` marks an empty way, so a lookup is a compare per way.

use crate::config::CacheConfig;

pub const INVALID: u64 = u64::MAX;

#[derive(Clone, Debug)]
pub struct Cache<M> {
    ways: usize,
    set_mask: u64,
    tags: Vec<u64>,
    lru: Vec<u64>,
    pub meta: Vec<M>,
    clock: u64,
    pub latency: u64,
}

impl<M: Clone + Default> Cache<M> {
    /// `cfg` must have been validated.
    pub fn new(cfg: &CacheConfig) -> Cache<M> {
        let sets = cfg.sets() as usize;
        let n = sets * cfg.ways as usize;
        Cache {
            ways: cfg.ways as usize,
            set_mask: sets as u64 - 1,
            tags: vec![INVALID; n],
            lru: vec![0; n],
            meta: vec![M::default(); n],
            clock: 0,
            latency: cfg.latency_cycles,
        }
    }

    #[inline]
    fn set_base(&self, block: u64) -> usize {
        (block & self.set_mask) as usize * self.ways
    }

    /// The line holding `block`, if any.
    #[inline]
    pub fn lookup(&self, block: u64) -> Option<usize> {
        let base = self.set_base(block);
        let set = &self.tags[base..base + self.ways];
        set.iter().position(|&t| t == block).map(|w| base + w)
    }

    /// Marks `line` most recently used.
    #[inline]
    pub fn touch(&mut self, line: usize) {
        self.clock += 1;
        self.lru[line] = self.clock;
    }

    #[inline]
    pub fn tag(&self, line: usize) -> u64 {
        self.tags[line]
    }

    /// The line `block` would replace: an empty way, else the LRU one
    /// among those `usable` accepts (falling back to plain LRU).
    #[inline]
    pub fn victim_where(&self, block: u64, usable: impl Fn(&M) -> bool) -> usize {
        let base = self.set_base(block);
        let tags = &self.tags[base..base + self.ways];
        if let Some(w) = tags.iter().position(|&t| t == INVALID) {
            return base + w;
        }
        // The first least recent way among the usable ones, else overall
        // (stamps are distinct: every valid line was touched when filled).
        let lru = &self.lru[base..base + self.ways];
        let mut best: Option<(u64, usize)> = None;
        let mut any = (u64::MAX, 0);
        for (w, &stamp) in lru.iter().enumerate() {
            if stamp < any.0 {
                any = (stamp, w);
            }
            if best.is_none_or(|(b, _)| stamp < b) && usable(&self.meta[base + w]) {
                best = Some((stamp, w));
            }
        }
        base + best.unwrap_or(any).1
    }

    /// The line `block` would replace: an empty way, else the LRU one.
    #[inline]
    pub fn victim(&self, block: u64) -> usize {
        let base = self.set_base(block);
        let tags = &self.tags[base..base + self.ways];
        let lru = &self.lru[base..base + self.ways];
        let mut any = (u64::MAX, 0);
        for (w, (&t, &stamp)) in tags.iter().zip(lru).enumerate() {
            if t == INVALID {
                return base + w;
            }
            if stamp < any.0 {
                any = (stamp, w);
            }
        }
        base + any.1
    }

    /// Installs `block` in `line` (the caller has dealt with the old content).
    #[inline]
    pub fn fill(&mut self, line: usize, block: u64, meta: M) {
        self.tags[line] = block;
        self.meta[line] = meta;
        self.touch(line);
    }

    /// Empties `line`.
    #[inline]
    pub fn clear(&mut self, line: usize) {
        self.tags[line] = INVALID;
        self.meta[line] = M::default();
    }

    pub fn lines(&self) -> usize {
        self.tags.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Cache<u8> {
        Cache::new(&CacheConfig {
            size_bytes: 4 * 2 * 64,
            ways: 2,
            block_bytes: 64,
            latency_cycles: 1,
        })
    }

    #[test]
    fn lru_replaces_least_recent() {
        let mut c = tiny();
        // blocks 0, 4, 8 map to set 0 of 4 sets
        let l0 = c.victim(0);
        c.fill(l0, 0, 1);
        let l4 = c.victim(4);
        c.fill(l4, 4, 2);
        assert_ne!(l0, l4);
        c.touch(l0);
        assert_eq!(c.victim(8), l4, "block 4 is LRU");
        assert_eq!(c.lookup(4), Some(l4));
        c.clear(l4);
        assert_eq!(c.lookup(4), None);
        assert_eq!(c.victim(8), l4, "empty way first");
    }

    #[test]
    fn victim_where_prefers_usable() {
        let mut c = tiny();
        let a = c.victim(0);
        c.fill(a, 0, 7);
        let b = c.victim(4);
        c.fill(b, 4, 0);
        c.touch(b);
        // a is LRU but not usable
        assert_eq!(c.victim_where(8, |m| *m == 0), b);
        assert_eq!(c.victim_where(8, |m| *m == 9), a, "falls back to LRU");
    }
}
