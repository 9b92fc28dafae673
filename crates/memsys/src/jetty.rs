//! Include-Jetty filter (§5.4, §6.4; Moshovos et al.): per core, two arrays
//! of 16 counters indexed by PTE physical-address bits 19–16 and 15–12,
//! incremented on PCAM insert and decremented on PCAM removal. A coherence
//! lookup whose address finds either counter at zero cannot hit in the
//! core's PCAMs and is skipped.
//!
//! Counters saturate at zero on decrement so that the `jetty_misses_insert`
//! fault (a missed increment) cannot wrap them.

use crate::config::JETTY_LOW_BIT;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Jetty {
    low: [u32; 16],
    high: [u32; 16],
}

#[inline]
fn idx(pa: u64) -> (usize, usize) {
    let low = ((pa >> JETTY_LOW_BIT) & 0xf) as usize;
    let high = ((pa >> (JETTY_LOW_BIT + 4)) & 0xf) as usize;
    (low, high)
}

impl Jetty {
    pub fn new() -> Jetty {
        Jetty::default()
    }

    pub fn insert(&mut self, pa: u64) {
        let (l, h) = idx(pa);
        self.low[l] += 1;
        self.high[h] += 1;
    }

    pub fn remove(&mut self, pa: u64) {
        let (l, h) = idx(pa);
        self.low[l] = self.low[l].saturating_sub(1);
        self.high[h] = self.high[h].saturating_sub(1);
    }

    /// False means no PCAM entry of this core can hold `pa`'s block.
    #[inline]
    pub fn may_contain(&self, pa: u64) -> bool {
        let (l, h) = idx(pa);
        self.low[l] != 0 && self.high[h] != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_until_insert_and_after_remove() {
        let mut j = Jetty::new();
        let pa = 0x0003_5040;
        assert!(!j.may_contain(pa));
        j.insert(pa);
        assert!(j.may_contain(pa));
        assert!(j.may_contain(0x0013_5000), "bits above 19 are not indexed");
        assert!(!j.may_contain(0x0003_6000), "bits 15-12 differ");
        assert!(!j.may_contain(0x0004_5000), "bits 19-16 differ");
        j.insert(pa);
        j.remove(pa);
        assert!(j.may_contain(pa));
        j.remove(pa);
        assert!(!j.may_contain(pa));
        j.remove(pa);
        assert!(!j.may_contain(pa), "saturates at zero");
    }
}
