//! Mattson stack simulation: one pass gives the misses of every fully associative LRU TLB
//! from 1 to `max_entries` entries.
//!
//! LRU has the inclusion property (Mattson et al. 1970): an LRU TLB of n entries holds
//! exactly the n most recently used pages, so a reference hits in every TLB larger than
//! its *stack distance* (its page's depth in the recency stack). The stack is kept only
//! `max_entries` deep: a page below that misses in every size we report, so its exact
//! depth is not needed. The stack is an array, most recent first; a reference is found by
//! a vectorized scan that stops at its depth, which for real traces is almost always a
//! handful of entries, and a repeat of the top page costs one compare.

use serde::{Deserialize, Serialize};

use std::path::Path;

use crate::sim::find;
use crate::source::{ReadOptions, open_trace};
use crate::{PageRef, Result, TraceError};

/// Sizes reported by default (uhlig94 §5.3 simulates 32 to 512 slots).
pub const DEFAULT_MAX_ENTRIES: usize = 512;

/// The one-pass simulator.
#[derive(Clone, Debug)]
pub struct StackSim {
    /// Most recent first: `len` pages, then [`EMPTY`] padding (at least four slots, so
    /// the top four can always be read).
    stack: Vec<u64>,
    len: usize,
    max: usize,
    /// `hist[d]`: references at stack depth d+1 (hits in every size > d).
    hist: Vec<u64>,
    refs: u64,
}

/// A VPN no reference has.
const EMPTY: u64 = u64::MAX;

/// Misses of every fully associative LRU size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackResult {
    pub refs: u64,
    pub max_entries: usize,
    /// `misses[n - 1]`: misses of an n-entry TLB, n = 1..=max_entries.
    pub misses: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl StackResult {
    /// Misses of an `entries`-entry TLB (1..=max_entries).
    pub fn misses_at(&self, entries: usize) -> u64 {
        self.misses[entries - 1]
    }
}

impl StackSim {
    pub fn new(max_entries: usize) -> Result<StackSim> {
        if max_entries == 0 || max_entries > 1 << 16 {
            return Err(TraceError::InvalidOptions(format!(
                "stack depth {max_entries} must be between 1 and 65536"
            )));
        }
        Ok(StackSim {
            stack: vec![EMPTY; max_entries.max(4)],
            len: 0,
            max: max_entries,
            hist: vec![0; max_entries.max(4)],
            refs: 0,
        })
    }

    /// One reference.
    #[inline]
    pub fn access(&mut self, vpn: u64) {
        self.refs += 1;
        let s = &mut self.stack[..];
        // Nearly every reference is within the top four: find it with four compares and
        // move it to the front with selects, so the only branch is the well-predicted
        // "in the top four" (a mispredicted branch per reference would cost more than
        // all the rest).
        let (a, b, c, d) = (s[0], s[1], s[2], s[3]);
        let m = (a == vpn) as u32
            | ((b == vpn) as u32) << 1
            | ((c == vpn) as u32) << 2
            | ((d == vpn) as u32) << 3;
        if m != 0 {
            let k = m.trailing_zeros() as usize;
            self.hist[k] += 1;
            s[3] = if k >= 3 { c } else { d };
            s[2] = if k >= 2 { b } else { c };
            s[1] = if k >= 1 { a } else { b };
            s[0] = vpn;
            return;
        }
        self.access_deep(vpn);
    }

    #[inline(never)]
    fn access_deep(&mut self, vpn: u64) {
        let len = self.len;
        let s = &mut self.stack[..];
        let at = if len > 4 {
            find(&s[4..len], vpn).map(|d| d + 4)
        } else {
            None
        };
        let end = match at {
            Some(d) => {
                self.hist[d] += 1;
                d
            }
            None => {
                // A miss: the bottom page falls off once the stack is full.
                if self.len < self.max {
                    self.len += 1;
                }
                self.len - 1
            }
        };
        s.copy_within(0..end, 1);
        s[0] = vpn;
    }

    /// A batch of references. The same as [`access`](StackSim::access) on each, with the
    /// top four pages and their hit counts kept in registers between references.
    pub fn run(&mut self, refs: &[PageRef]) {
        self.refs += refs.len() as u64;
        let [mut a, mut b, mut c, mut d] =
            [self.stack[0], self.stack[1], self.stack[2], self.stack[3]];
        let mut hits = [0u64; 4];
        for &r in refs {
            let vpn = r.vpn();
            let (h0, h1, h2, h3) = (a == vpn, b == vpn, c == vpn, d == vpn);
            if h0 | h1 | h2 | h3 {
                // Counters by compare, not by index: no store-to-load chain.
                hits[0] += h0 as u64;
                hits[1] += h1 as u64;
                hits[2] += h2 as u64;
                hits[3] += h3 as u64;
                let ge1 = !h0;
                let ge2 = !(h0 | h1);
                let ge3 = h3;
                d = if ge3 { c } else { d };
                c = if ge2 { b } else { c };
                b = if ge1 { a } else { b };
                a = vpn;
            } else {
                self.stack[..4].copy_from_slice(&[a, b, c, d]);
                self.access_deep(vpn);
                [a, b, c, d] = [self.stack[0], self.stack[1], self.stack[2], self.stack[3]];
            }
        }
        self.stack[..4].copy_from_slice(&[a, b, c, d]);
        for (h, n) in self.hist.iter_mut().zip(hits) {
            *h += n;
        }
    }

    /// Misses of every size so far.
    pub fn result(&self) -> StackResult {
        let mut misses = Vec::with_capacity(self.max);
        let mut hits = 0u64;
        for &h in &self.hist[..self.max] {
            hits += h;
            misses.push(self.refs - hits);
        }
        StackResult {
            refs: self.refs,
            max_entries: self.max,
            misses,
            warnings: Vec::new(),
        }
    }
}

/// One pass over an in-memory trace.
pub fn stack_pass(refs: &[PageRef], max_entries: usize) -> Result<StackResult> {
    let mut sim = StackSim::new(max_entries)?;
    sim.run(refs);
    Ok(sim.result())
}

/// One pass over the trace at `path` (lackey or binary, streamed) at `page_size`: misses
/// of every fully associative LRU size 1..=`max_entries`.
pub fn stack_sim(
    path: &Path,
    page_size: u64,
    max_entries: usize,
    read: &ReadOptions,
) -> Result<StackResult> {
    let mut sim = StackSim::new(max_entries)?;
    let mut src = open_trace(path, page_size, read)?;
    let mut batch = Vec::new();
    while src.next_batch(&mut batch)? {
        sim.run(&batch);
    }
    let mut r = sim.result();
    r.warnings = src.warnings();
    Ok(r)
}
