//! Direct simulation of one set-associative TLB: LRU, FIFO or random replacement.
//!
//! A unified TLB (instruction fetches and data alike), demand fetch, write-allocate (a
//! store that misses fills an entry like a load). `entries / ways` sets; the set index is
//! the low bits of the VPN (uhlig94 footnote 1: "certain bits of a mapping's virtual page
//! number ... restrict the slot (or set of slots) into which the mapping may be placed").
//!
//! Each set is a small array of VPNs. LRU keeps it most-recent first (a hit moves the entry
//! to the front); FIFO keeps it newest-inserted first (a hit changes nothing); random
//! fills empty slots in order, then replaces a slot drawn from a seeded xorshift64* stream.
//! A reference to the page referenced just before is a hit that changes no state under all
//! three policies, so it is counted without touching the sets.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{AccessKind, PageRef, Result, TraceError, page_shift};

/// Replacement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Lru,
    Fifo,
    Random,
}

impl FromStr for Policy {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Policy> {
        match s {
            "lru" => Ok(Policy::Lru),
            "fifo" => Ok(Policy::Fifo),
            "random" => Ok(Policy::Random),
            _ => Err(TraceError::InvalidOptions(format!(
                "policy {s:?}: expected lru, fifo or random"
            ))),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Lru => "lru",
            Policy::Fifo => "fifo",
            Policy::Random => "random",
        })
    }
}

/// One TLB configuration (`mmulab trace sim` options). Missing fields deserialize to
/// their defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SimOptions {
    /// Total entries. Default 64.
    pub entries: u32,
    /// Entries per set; `None` (or `Some(entries)`) is fully associative. Default `None`.
    pub ways: Option<u32>,
    /// Default LRU.
    pub policy: Policy,
    /// Bytes, a power of two. Default 4096.
    pub page_size: u64,
    /// Seed of the random policy's stream. Default 0.
    pub seed: u64,
}

impl Default for SimOptions {
    fn default() -> SimOptions {
        SimOptions {
            entries: 64,
            ways: None,
            policy: Policy::Lru,
            page_size: 4096,
            seed: 0,
        }
    }
}

impl SimOptions {
    /// The effective associativity.
    pub fn ways(&self) -> u32 {
        self.ways.unwrap_or(self.entries)
    }

    /// Checks that the options describe a TLB: entries ≥ 1, ways divides entries, the
    /// number of sets is a power of two, the page size a power of two ≥ 4.
    pub fn validate(&self) -> Result<()> {
        let ways = self.ways();
        if self.entries == 0 || self.entries > 1 << 20 {
            return Err(TraceError::InvalidOptions(format!(
                "entries {} must be between 1 and 2^20",
                self.entries
            )));
        }
        if ways == 0 || ways > self.entries || !self.entries.is_multiple_of(ways) {
            return Err(TraceError::InvalidOptions(format!(
                "ways {ways} must be between 1 and entries ({}) and divide it",
                self.entries
            )));
        }
        let sets = self.entries / ways;
        if !sets.is_power_of_two() {
            return Err(TraceError::InvalidOptions(format!(
                "entries / ways = {sets} sets; the set index is the low bits of the VPN, so it must be a power of two"
            )));
        }
        page_shift(self.page_size)?;
        Ok(())
    }
}

/// What one simulation counted. `refs` and `misses` are the contract; the rest is detail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimResult {
    pub entries: u32,
    pub ways: u32,
    pub sets: u32,
    pub policy: Policy,
    pub page_size: u64,
    pub seed: u64,
    /// Page references simulated (after splitting page-crossing accesses; `M` counts 2).
    pub refs: u64,
    pub misses: u64,
    pub miss_rate: f64,
    pub ifetch_refs: u64,
    pub ifetch_misses: u64,
    pub load_refs: u64,
    pub load_misses: u64,
    pub store_refs: u64,
    pub store_misses: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// A VPN no reference has (VPNs are at most [`crate::MAX_VPN`]).
const EMPTY: u64 = u64::MAX;

/// Sets at least this wide get the resident-page filter (narrower ones scan faster).
const FILTER_MIN_WAYS: usize = 16;
/// Slots of the resident-page filter (a power of two; the hash keeps the top 10 bits).
const FILTER_SLOTS: usize = 1024;

/// A set-associative TLB.
#[derive(Clone, Debug)]
pub struct Tlb {
    opts: SimOptions,
    policy: Policy,
    ways: usize,
    set_mask: u64,
    /// `sets * ways` VPNs, set by set.
    tags: Vec<u64>,
    /// Random: how many slots of each set are filled.
    filled: Vec<u32>,
    /// FIFO and random with wide sets: pages known to be resident (see `known_resident`).
    filter: Vec<u64>,
    rng: u64,
    last_vpn: u64,
    refs_by_kind: [u64; 4],
    misses_by_kind: [u64; 4],
}

/// Position of `v` in `s`, in chunks of eight (vectorized compare, early exit).
#[inline(always)]
pub(crate) fn find(s: &[u64], v: u64) -> Option<usize> {
    let mut chunks = s.chunks_exact(8);
    let mut base = 0;
    for c in &mut chunks {
        let mut m = 0u32;
        for (j, &t) in c.iter().enumerate() {
            m |= ((t == v) as u32) << j;
        }
        if m != 0 {
            return Some(base + m.trailing_zeros() as usize);
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&t| t == v)
        .map(|j| base + j)
}

impl Tlb {
    pub fn new(opts: &SimOptions) -> Result<Tlb> {
        opts.validate()?;
        let ways = opts.ways() as usize;
        let sets = (opts.entries / opts.ways()) as usize;
        // splitmix64 of the seed: xorshift64* needs a nonzero state.
        let mut z = opts.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Ok(Tlb {
            opts: opts.clone(),
            policy: opts.policy,
            ways,
            set_mask: sets as u64 - 1,
            tags: vec![EMPTY; sets * ways],
            filled: vec![0; sets],
            filter: if opts.policy != Policy::Lru && ways >= FILTER_MIN_WAYS {
                vec![EMPTY; FILTER_SLOTS]
            } else {
                Vec::new()
            },
            rng: z | 1,
            last_vpn: EMPTY,
            refs_by_kind: [0; 4],
            misses_by_kind: [0; 4],
        })
    }

    pub fn options(&self) -> &SimOptions {
        &self.opts
    }

    #[inline]
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// One reference; true on a hit.
    #[inline]
    pub fn access(&mut self, vpn: u64) -> bool {
        if vpn == self.last_vpn {
            return true;
        }
        self.last_vpn = vpn;
        let ways = self.ways;
        let set = (vpn & self.set_mask) as usize;
        let base = set * ways;
        match self.policy {
            Policy::Lru => {
                let s = &mut self.tags[base..base + ways];
                // The second most recent page of the set (where instruction
                // fetches and data alternate between two pages): the move
                // to the front is a swap. Tags in a set are distinct, so
                // this is the position `find` would give.
                if ways > 1 && s[1] == vpn {
                    s.swap(0, 1);
                    return true;
                }
                match find(s, vpn) {
                    Some(p) => {
                        // Move to the front.
                        let mut i = p;
                        while i > 0 {
                            s[i] = s[i - 1];
                            i -= 1;
                        }
                        s[0] = vpn;
                        true
                    }
                    None => {
                        s.copy_within(0..ways - 1, 1);
                        s[0] = vpn;
                        false
                    }
                }
            }
            Policy::Fifo => {
                if self.known_resident(vpn) {
                    return true;
                }
                let s = &mut self.tags[base..base + ways];
                if find(s, vpn).is_some() {
                    self.note_resident(vpn);
                    true
                } else {
                    let evicted = s[ways - 1];
                    s.copy_within(0..ways - 1, 1);
                    s[0] = vpn;
                    self.note_evicted(evicted);
                    false
                }
            }
            Policy::Random => {
                if self.known_resident(vpn) {
                    return true;
                }
                if find(&self.tags[base..base + ways], vpn).is_some() {
                    self.note_resident(vpn);
                    return true;
                }
                let f = self.filled[set] as usize;
                let slot = if f < ways {
                    self.filled[set] += 1;
                    f
                } else {
                    (self.next_random() % ways as u64) as usize
                };
                let evicted = std::mem::replace(&mut self.tags[base + slot], vpn);
                self.note_evicted(evicted);
                false
            }
        }
    }

    // Under FIFO and random a hit changes nothing, so residency changes only on a miss.
    // For wide sets a small direct-mapped table remembers pages known to be resident
    // (invariant: every page in it is in the TLB; an evicted page is removed from it), so
    // a hit on one of them skips the scan of the set.

    #[inline]
    fn filter_slot(&self, vpn: u64) -> usize {
        (vpn.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize & (self.filter.len() - 1)
    }

    #[inline]
    fn known_resident(&self, vpn: u64) -> bool {
        !self.filter.is_empty() && self.filter[self.filter_slot(vpn)] == vpn
    }

    #[inline]
    fn note_resident(&mut self, vpn: u64) {
        if !self.filter.is_empty() {
            let i = self.filter_slot(vpn);
            self.filter[i] = vpn;
        }
    }

    #[inline]
    fn note_evicted(&mut self, vpn: u64) {
        if !self.filter.is_empty() && vpn != EMPTY {
            let i = self.filter_slot(vpn);
            if self.filter[i] == vpn {
                self.filter[i] = EMPTY;
            }
        }
    }

    /// One page reference of `kind`, counted as [`Tlb::run`] counts it.
    #[inline]
    pub fn reference(&mut self, vpn: u64, kind: AccessKind) {
        let hit = self.access(vpn);
        let k = kind as usize;
        self.refs_by_kind[k] += 1;
        self.misses_by_kind[k] += !hit as u64;
    }

    /// Simulates a batch of references.
    #[inline]
    pub fn run(&mut self, refs: &[PageRef]) {
        for &r in refs {
            let hit = self.access(r.vpn());
            let k = (r.0 & 3) as usize;
            self.refs_by_kind[k] += 1;
            self.misses_by_kind[k] += !hit as u64;
        }
    }

    /// References and misses so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.refs_by_kind.iter().sum(),
            self.misses_by_kind.iter().sum(),
        )
    }

    /// The counts so far as a result.
    pub fn result(&self) -> SimResult {
        let (refs, misses) = self.counts();
        let k = |i: usize| (self.refs_by_kind[i], self.misses_by_kind[i]);
        SimResult {
            entries: self.opts.entries,
            ways: self.opts.ways(),
            sets: self.set_mask as u32 + 1,
            policy: self.policy,
            page_size: self.opts.page_size,
            seed: self.opts.seed,
            refs,
            misses,
            miss_rate: if refs == 0 {
                0.0
            } else {
                misses as f64 / refs as f64
            },
            ifetch_refs: k(2).0,
            ifetch_misses: k(2).1,
            load_refs: k(0).0,
            load_misses: k(0).1,
            store_refs: k(1).0,
            store_misses: k(1).1,
            warnings: Vec::new(),
        }
    }
}
