//! A set-associative cache of block addresses with LRU replacement, used for
//! the private L1I/L1D and the shared L2 (Table 1). It stores tags and a
//! per-line payload (`M`): coherence state for an L1, directory and sharer
//! bookkeeping for the L2. It holds no data; data values are modelled by
//! version numbers (see `checker`).
//!
//! The set index is the low bits of the block address. Tags are whole block
//! addresses; `INVALID` marks an empty way, so a lookup is a compare per way.
//!
//! Host layout: each line's tag and LRU stamp are a pair of words, and a
//! set's pairs are contiguous and aligned to 64 bytes, so a lookup and the
//! victim choice that may follow read one host cache line (4 ways).
//! Payloads are a separate array indexed by line (`set × ways + way`).

use crate::config::CacheConfig;
use mmulab_engine::prefetch;

pub const INVALID: u64 = u64::MAX;

/// Host cache line, in u64 words.
const HOST_LINE_WORDS: usize = 8;

#[derive(Debug)]
pub struct Cache<M> {
    ways: usize,
    set_mask: u64,
    /// Per line: (tag, LRU stamp), from `words[off..]`.
    words: Vec<u64>,
    /// Offset (in words) aligning the first set record to 64 bytes.
    off: usize,
    pub meta: Vec<M>,
    clock: u64,
    pub latency: u64,
}

/// The word offset that puts `v[off]` on a 64-byte boundary.
fn align_off(v: &[u64]) -> usize {
    let addr = v.as_ptr() as usize;
    (64 - addr % 64) % 64 / 8
}

impl<M: Clone> Clone for Cache<M> {
    fn clone(&self) -> Self {
        // The clone's allocation has its own alignment: recompute the offset.
        let n = self.meta.len() * 2;
        let mut words = vec![0; n + HOST_LINE_WORDS - 1];
        let off = align_off(&words);
        words[off..off + n].copy_from_slice(&self.words[self.off..self.off + n]);
        Cache {
            ways: self.ways,
            set_mask: self.set_mask,
            words,
            off,
            meta: self.meta.clone(),
            clock: self.clock,
            latency: self.latency,
        }
    }
}

impl<M: Clone + Default> Cache<M> {
    /// `cfg` must have been validated.
    pub fn new(cfg: &CacheConfig) -> Cache<M> {
        let sets = cfg.sets() as usize;
        let ways = cfg.ways as usize;
        let n = sets * ways;
        let mut words = vec![0; 2 * n + HOST_LINE_WORDS - 1];
        let off = align_off(&words);
        for line in 0..n {
            words[off + 2 * line] = INVALID;
        }
        Cache {
            ways,
            set_mask: sets as u64 - 1,
            words,
            off,
            meta: vec![M::default(); n],
            clock: 0,
            latency: cfg.latency_cycles,
        }
    }
}

impl<M> Cache<M> {
    /// First line of `block`'s set.
    #[inline]
    fn set_base(&self, block: u64) -> usize {
        (block & self.set_mask) as usize * self.ways
    }

    /// The (tag, stamp) pairs of the set whose first line is `base`.
    #[inline]
    fn record(&self, base: usize) -> &[u64] {
        let r = self.off + 2 * base;
        &self.words[r..r + 2 * self.ways]
    }

    /// Word index of `line`'s tag (its stamp is the next word).
    #[inline]
    fn tag_word(&self, line: usize) -> usize {
        self.off + 2 * line
    }

    /// The line holding `block`, if any.
    #[inline]
    pub fn lookup(&self, block: u64) -> Option<usize> {
        let base = self.set_base(block);
        position(self.record(base), block).map(|w| base + w)
    }

    /// Marks `line` most recently used.
    #[inline]
    pub fn touch(&mut self, line: usize) {
        self.clock += 1;
        let i = self.tag_word(line) + 1;
        self.words[i] = self.clock;
    }

    #[inline]
    pub fn tag(&self, line: usize) -> u64 {
        self.words[self.tag_word(line)]
    }

    /// The line `block` would replace: an empty way, else the LRU one
    /// among those `usable` accepts (falling back to plain LRU).
    #[inline]
    pub fn victim_where(&self, block: u64, usable: impl Fn(&M) -> bool) -> usize {
        let base = self.set_base(block);
        let rec = self.record(base);
        if let Some(w) = position(rec, INVALID) {
            return base + w;
        }
        // The first least recent way among the usable ones, else overall
        // (stamps are distinct: every valid line was touched when filled).
        let mut best: Option<(u64, usize)> = None;
        let mut any = (u64::MAX, 0);
        for (w, &stamp) in rec.chunks_exact(2).map(|p| &p[1]).enumerate() {
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
    /// Always inlined: three calls per miss, each a handful of compares.
    #[inline(always)]
    pub fn victim(&self, block: u64) -> usize {
        let base = self.set_base(block);
        let rec = self.record(base);
        if let Ok(r) = <&[u64; 8]>::try_from(rec) {
            return base + victim4(r);
        }
        if let Some(w) = position(rec, INVALID) {
            return base + w;
        }
        // Stamps of valid lines are distinct, so the minimum is unique.
        base + lru_way(rec)
    }

    /// Installs `block` in `line` (the caller has dealt with the old content).
    #[inline]
    pub fn fill(&mut self, line: usize, block: u64, meta: M) {
        let i = self.tag_word(line);
        self.words[i] = block;
        self.meta[line] = meta;
        self.touch(line);
    }

    /// Hints the host to fetch `block`'s set record and its lines'
    /// payloads (what a lookup, then a hit or a replacement, reads).
    #[inline]
    pub fn prefetch_set(&self, block: u64) {
        let base = self.set_base(block);
        prefetch(&self.words[self.off + 2 * base]);
        let metas = &self.meta[base..base + self.ways];
        match (metas.first(), metas.last()) {
            // Small payloads (L1 lines): a set spanning at most 64 bytes
            // lies in one or two host lines, fetched by its ends rather
            // than once per way.
            (Some(first), Some(last)) if size_of_val(metas) <= 64 => {
                prefetch(first);
                prefetch(last);
            }
            _ => {
                for m in metas {
                    prefetch(m);
                }
            }
        }
    }

    /// Hints the host to fetch `line`'s payload.
    #[inline]
    pub fn prefetch_meta(&self, line: usize) {
        if let Some(m) = self.meta.get(line) {
            prefetch(m);
        }
    }

    pub fn lines(&self) -> usize {
        self.meta.len()
    }
}

impl<M: Default> Cache<M> {
    /// Empties `line`.
    #[inline]
    pub fn clear(&mut self, line: usize) {
        let i = self.tag_word(line);
        self.words[i] = INVALID;
        self.words[i + 1] = 0;
        self.meta[line] = M::default();
    }
}

/// The way of a full set record (tag, stamp pairs) with the least stamp,
/// the first one on a tie (four ways go through `victim4` instead).
#[inline]
fn lru_way(rec: &[u64]) -> usize {
    let mut any = (u64::MAX, 0);
    for (w, p) in rec.chunks_exact(2).enumerate() {
        if p[1] < any.0 {
            any = (p[1], w);
        }
    }
    any.1
}

/// `victim`'s choice in a four-way set record in one pass: each way's key
/// is its stamp, 0 if empty (`clear` and `new` zero it) and at least 1
/// once filled (`fill` touches, and the clock counts from 1); the least
/// key wins, the first on a tie. That is the first empty way, else the
/// least recently used one, without a branch per way.
#[inline(always)]
fn victim4(r: &[u64; 8]) -> usize {
    debug_assert!((0..4).all(|w| (r[2 * w] == INVALID) == (r[2 * w + 1] == 0)));
    let key = |w: usize| r[2 * w + 1];
    // A tournament (0 v 1, 2 v 3, then the winners), the lower way
    // winning ties at each step: the sequential scan's answer with half
    // its dependency chain.
    let pick = |(a, ka): (usize, u64), (b, kb): (usize, u64)| {
        if kb < ka { (b, kb) } else { (a, ka) }
    };
    let lo = pick((0, key(0)), (1, key(1)));
    let hi = pick((2, key(2)), (3, key(3)));
    pick(lo, hi).0
}

/// The first way of a set record (tag, stamp pairs) whose tag is `x`.
/// Four ways (every preset) compare all at once, without a branch per way.
#[inline]
fn position(rec: &[u64], x: u64) -> Option<usize> {
    if let Ok(t) = <&[u64; 8]>::try_from(rec) {
        let m = (t[0] == x) as u32
            | ((t[2] == x) as u32) << 1
            | ((t[4] == x) as u32) << 2
            | ((t[6] == x) as u32) << 3;
        return (m != 0).then(|| m.trailing_zeros() as usize);
    }
    rec.chunks_exact(2).position(|p| p[0] == x)
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

    #[test]
    fn victim4_is_first_empty_else_lru() {
        // the two-step rule (first empty way, else least stamp, first on a
        // tie) against the one-pass keys, over small tags and stamps
        for n in 0..4u64.pow(8) {
            let mut r = [0u64; 8];
            for w in 0..4 {
                let d = (n >> (4 * w)) & 15;
                // an empty way has stamp 0, a filled one a stamp from 1
                let empty = d & 3 == 0;
                r[2 * w] = if empty { INVALID } else { d & 3 };
                r[2 * w + 1] = if empty { 0 } else { (d >> 2) + 1 };
            }
            let want = position(&r, INVALID).unwrap_or_else(|| lru_way(&r));
            assert_eq!(victim4(&r), want, "{r:?}");
        }
    }

    #[test]
    fn four_ways_aligned_and_cloned() {
        let mut c: Cache<u8> = Cache::new(&CacheConfig {
            size_bytes: 8 * 4 * 64,
            ways: 4,
            block_bytes: 64,
            latency_cycles: 1,
        });
        assert_eq!((c.words[c.off..].as_ptr() as usize) % 64, 0);
        // blocks 0, 8, 16, 24, 32 map to set 0 of 8 sets
        for b in [0, 8, 16, 24] {
            let l = c.victim(b);
            assert_eq!(c.tag(l), INVALID);
            c.fill(l, b, b as u8);
        }
        assert_eq!(c.lookup(3), None);
        c.touch(c.lookup(0).unwrap());
        let v = c.victim(32);
        assert_eq!(c.tag(v), 8, "block 8 is LRU");
        let d = c.clone();
        assert_eq!((d.words[d.off..].as_ptr() as usize) % 64, 0);
        for b in [0, 8, 16, 24] {
            assert_eq!(d.lookup(b), c.lookup(b));
            assert_eq!(d.meta[d.lookup(b).unwrap()], b as u8);
        }
        assert_eq!(d.victim(32), v);
        assert_eq!(c.lookup(9), None, "other sets stay empty");
    }
}
