//! A set-associative cache of block addresses with LRU replacement, used for
//! the private L1I/L1D and the shared L2 (Table 1). It stores tags and a
//! per-line payload (`M`): coherence state for an L1, directory and sharer
//! bookkeeping for the L2. It holds no data; data values are modelled by
//! version numbers (see `checker`).
//!
//! The set index is the low bits of the block address. Tags are whole block
//! addresses; `INVALID` marks an empty way, so a lookup is a compare per way.
//!
//! Host layout: each line's tag and LRU stamp are a pair of words, line
//! after line, held in host-line-sized records (`Rec`, four pairs,
//! aligned to 64 bytes). A four-way set (every preset) is one record,
//! found by its set number alone, so a lookup and the victim choice that
//! may follow read one host cache line.
//! Payloads are a separate array indexed by line (`set × ways + way`).

use crate::config::CacheConfig;
use mmulab_engine::prefetch_ptr;

pub const INVALID: u64 = u64::MAX;

/// Four (tag, stamp) pairs: one host cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Rec([u64; 8]);

#[derive(Clone, Debug)]
pub struct Cache<M> {
    ways: usize,
    set_mask: u64,
    /// Line `l`'s (tag, stamp) pair is words `2l` and `2l + 1` of the
    /// records taken as one array (the last record may be part unused).
    recs: Vec<Rec>,
    pub meta: Vec<M>,
    clock: u64,
    pub latency: u64,
}

impl<M: Clone + Default> Cache<M> {
    /// `cfg` must have been validated.
    pub fn new(cfg: &CacheConfig) -> Cache<M> {
        let sets = cfg.sets() as usize;
        let ways = cfg.ways as usize;
        // Empty ways: tag INVALID, stamp 0 (see `victim4`).
        let empty = Rec([INVALID, 0, INVALID, 0, INVALID, 0, INVALID, 0]);
        Cache {
            ways,
            set_mask: sets as u64 - 1,
            recs: vec![empty; (sets * ways).div_ceil(4)],
            meta: vec![M::default(); sets * ways],
            clock: 0,
            latency: cfg.latency_cycles,
        }
    }
}

impl<M> Cache<M> {
    /// `block`'s set.
    #[inline]
    fn set(&self, block: u64) -> usize {
        (block & self.set_mask) as usize
    }

    /// Way `w`'s (tag, stamp) pair in `set`.
    #[inline]
    fn pair(&self, set: usize, w: usize) -> (u64, u64) {
        let i = 2 * (set * self.ways + w);
        (self.word(i), self.word(i + 1))
    }

    /// The first way of `set` whose tag is `x`, any number of ways.
    #[inline]
    fn position_any(&self, set: usize, x: u64) -> Option<usize> {
        (0..self.ways).position(|w| self.pair(set, w).0 == x)
    }

    /// The four-way set record of `set`, when sets have four ways.
    #[inline(always)]
    fn record4(&self, set: usize) -> Option<&[u64; 8]> {
        (self.ways == 4).then(|| &self.recs[set].0)
    }

    /// Index, in the records taken as one array, of `line`'s tag (its
    /// stamp is the next word).
    #[inline(always)]
    fn tag_word(&self, line: usize) -> usize {
        2 * line
    }

    #[inline(always)]
    fn word(&self, i: usize) -> u64 {
        self.recs[i / 8].0[i % 8]
    }

    /// `line`'s (tag, stamp) pair, found with one bounds check: words
    /// `2l` and `2l + 1` both lie in record `l / 4`.
    #[inline(always)]
    fn pair_in(recs: &mut [Rec], line: usize) -> &mut [u64; 2] {
        let r = &mut recs[line / 4].0;
        let k = 2 * (line % 4);
        (&mut r[k..k + 2])
            .try_into()
            .expect("a pair lies in one record")
    }

    /// The line holding `block`, if any.
    #[inline]
    pub fn lookup(&self, block: u64) -> Option<usize> {
        let set = self.set(block);
        let way = match self.record4(set) {
            Some(r) => position4(r, block),
            None => self.position_any(set, block),
        };
        way.map(|w| set * self.ways + w)
    }

    /// `lookup`, else `victim`, the set found once: `Ok` with the line
    /// holding `block`, or `Err` with the line it would replace.
    #[inline(always)]
    pub fn lookup_or_victim(&self, block: u64) -> Result<usize, usize> {
        let set = self.set(block);
        let base = set * self.ways;
        if let Some(r) = self.record4(set) {
            return match position4(r, block) {
                Some(w) => Ok(base + w),
                None => Err(base + victim4(r)),
            };
        }
        match self.position_any(set, block) {
            Some(w) => Ok(base + w),
            None => Err(self.victim(block)),
        }
    }

    /// Marks `line` most recently used.
    #[inline]
    pub fn touch(&mut self, line: usize) {
        self.clock += 1;
        let i = self.tag_word(line) + 1;
        self.recs[i / 8].0[i % 8] = self.clock;
    }

    #[inline]
    pub fn tag(&self, line: usize) -> u64 {
        // the index of `pair_in`, so that a later write reuses its check
        self.recs[line / 4].0[2 * (line % 4)]
    }

    /// The line `block` would replace: an empty way, else the LRU one
    /// among those `usable` accepts (falling back to plain LRU).
    #[inline]
    pub fn victim_where(&self, block: u64, usable: impl Fn(&M) -> bool) -> usize {
        let set = self.set(block);
        let base = set * self.ways;
        if let Some(w) = self.position_any(set, INVALID) {
            return base + w;
        }
        // The first least recent way among the usable ones, else overall
        // (stamps are distinct: every valid line was touched when filled).
        let mut best: Option<(u64, usize)> = None;
        let mut any = (u64::MAX, 0);
        for w in 0..self.ways {
            let stamp = self.pair(set, w).1;
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
        let set = self.set(block);
        let base = set * self.ways;
        if let Some(r) = self.record4(set) {
            return base + victim4(r);
        }
        // Empty ways have stamp 0 and the stamps of valid lines are
        // distinct and positive: the first least stamp is the first empty
        // way, else the LRU one.
        let mut any = (u64::MAX, 0);
        for w in 0..self.ways {
            let stamp = self.pair(set, w).1;
            if stamp < any.0 {
                any = (stamp, w);
            }
        }
        base + any.1
    }

    /// `victim` and that line's tag, from the one set record.
    #[inline(always)]
    pub fn victim_tag(&self, block: u64) -> (usize, u64) {
        let set = self.set(block);
        if let Some(r) = self.record4(set) {
            let w = victim4(r);
            return (set * self.ways + w, r[2 * w]);
        }
        let v = self.victim(block);
        (v, self.tag(v))
    }

    /// Installs `block` in `line` (the caller has dealt with the old content).
    #[inline]
    pub fn fill(&mut self, line: usize, block: u64, meta: M) {
        self.clock += 1;
        let clock = self.clock;
        // both places found before either is written (a write would make
        // the compiler check the other's bounds again)
        let (pair, m) = (Self::pair_in(&mut self.recs, line), &mut self.meta[line]);
        *pair = [block, clock];
        *m = meta;
    }

    /// Hints the host to fetch `block`'s set record and its lines'
    /// payloads (what a lookup, then a hit or a replacement, reads).
    /// Unchecked addresses (`prefetch_ptr`): the set is in range by
    /// construction, and a hint never faults.
    #[inline]
    pub fn prefetch_set(&self, block: u64) {
        self.prefetch_record(block);
        let base = self.set(block) * self.ways;
        let metas = self.meta.as_ptr().wrapping_add(base);
        if size_of::<M>() * self.ways <= 64 {
            // Small payloads (L1 lines): a set spanning at most 64 bytes
            // lies in one or two host lines, fetched by its ends rather
            // than once per way.
            prefetch_ptr(metas);
            prefetch_ptr(metas.wrapping_add(self.ways - 1));
        } else if self.ways == 4 {
            // the L2 of every preset: four lines, without a loop
            for w in 0..4 {
                prefetch_ptr(metas.wrapping_add(w));
            }
        } else {
            for w in 0..self.ways {
                prefetch_ptr(metas.wrapping_add(w));
            }
        }
    }

    /// Hints the host to fetch `block`'s set record only (tags and
    /// stamps; see `prefetch_set`).
    #[inline]
    pub fn prefetch_record(&self, block: u64) {
        let base = self.set(block) * self.ways;
        prefetch_ptr(self.recs.as_ptr().wrapping_add(base / 4));
    }

    /// Hints the host to fetch `line`'s payload.
    #[inline]
    pub fn prefetch_meta(&self, line: usize) {
        prefetch_ptr(self.meta.as_ptr().wrapping_add(line));
    }

    pub fn lines(&self) -> usize {
        self.meta.len()
    }
}

impl<M: Default> Cache<M> {
    /// Empties `line`.
    #[inline]
    pub fn clear(&mut self, line: usize) {
        // as in `fill`, both places found first
        let (pair, m) = (Self::pair_in(&mut self.recs, line), &mut self.meta[line]);
        *pair = [INVALID, 0];
        *m = M::default();
    }
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

/// `position` in a four-way set record (every preset): all four compared
/// at once, without a branch per way.
#[inline(always)]
fn position4(t: &[u64; 8], x: u64) -> Option<usize> {
    let m = (t[0] == x) as u32
        | ((t[2] == x) as u32) << 1
        | ((t[4] == x) as u32) << 2
        | ((t[6] == x) as u32) << 3;
    (m != 0).then(|| m.trailing_zeros() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The way of a full set record (tag, stamp pairs) with the least stamp,
    /// the first one on a tie (the two-step rule `victim4` is checked against).
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

    /// The first way of a set record (tag, stamp pairs) whose tag is `x`.
    #[inline]
    fn position(rec: &[u64], x: u64) -> Option<usize> {
        if let Ok(t) = <&[u64; 8]>::try_from(rec) {
            return position4(t, x);
        }
        rec.chunks_exact(2).position(|p| p[0] == x)
    }

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
        assert_eq!((c.recs.as_ptr() as usize) % 64, 0);
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
        assert_eq!((d.recs.as_ptr() as usize) % 64, 0);
        for b in [0, 8, 16, 24] {
            assert_eq!(d.lookup(b), c.lookup(b));
            assert_eq!(d.meta[d.lookup(b).unwrap()], b as u8);
        }
        assert_eq!(d.victim(32), v);
        assert_eq!(c.lookup(9), None, "other sets stay empty");
    }
    #[test]
    fn any_ways_match_a_reference() {
        // one or several records per set, padded or not: lookups and
        // victims against a plain model of tags and stamps per way
        for ways in [1usize, 2, 3, 4, 5, 6, 8] {
            let sets = 4;
            let mut c: Cache<u8> = Cache::new(&CacheConfig {
                size_bytes: (sets * ways * 64) as u64,
                ways: ways as u64,
                block_bytes: 64,
                latency_cycles: 1,
            });
            let mut model = vec![vec![None::<(u64, u64)>; ways]; sets];
            let mut clock = 0;
            let mut x = 12345u64;
            for _ in 0..3000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let b = (x >> 33) % 40;
                let s = (b % sets as u64) as usize;
                let r = &mut model[s];
                let want = r.iter().position(|e| e.is_some_and(|(t, _)| t == b));
                assert_eq!(c.lookup(b), want.map(|w| s * ways + w), "{ways} ways");
                assert_eq!(c.lookup_or_victim(b), c.lookup(b).ok_or(c.victim(b)));
                match want {
                    Some(w) if (x >> 20) & 7 == 0 => {
                        c.clear(s * ways + w);
                        r[w] = None;
                    }
                    Some(w) => {
                        c.touch(s * ways + w);
                        clock += 1;
                        r[w] = Some((b, clock));
                    }
                    None => {
                        let v = r.iter().position(|e| e.is_none()).unwrap_or_else(|| {
                            (0..ways).min_by_key(|&w| r[w].map(|e| e.1)).unwrap()
                        });
                        assert_eq!(c.victim(b), s * ways + v, "{ways} ways");
                        let t = r[v].map_or(INVALID, |e| e.0);
                        assert_eq!(c.victim_tag(b), (s * ways + v, t), "{ways} ways");
                        assert_eq!(c.victim_where(b, |_| true), s * ways + v);
                        c.fill(s * ways + v, b, 0);
                        clock += 1;
                        r[v] = Some((b, clock));
                    }
                }
                for (w, e) in r.iter().enumerate() {
                    assert_eq!(c.tag(s * ways + w), e.map_or(INVALID, |e| e.0));
                }
            }
        }
    }
}
