//! segkmem, the kernel segment driver for permanently resident kernel
//! memory (balan92 §Lazy Shutdowns): "The virtual space managed by the
//! segkmem driver is represented as a bitmap and the bitmap itself is
//! divided into zones (the size of the zone is a tunable; the default value
//! is 16 bytes). Each zone has associated with it a cookie, which is set
//! when an address in the zone is freed. At the time of allocation, when it
//! is found that a page is allocated from a freed zone whose addresses have
//! still not been flushed from the TLBs, hat_shutdown() is called with the
//! cookie associated with the zone."
//!
//! This module is the bitmap and the zones only (no simulated time); the
//! VM layer (`vm.rs`, `KmemAlloc`/`KmemFree`) calls the HAT around it.
//!
//! Allocation is next-fit from a rotor (an assumption: the paper does not
//! say how a run of free bits is chosen; `kernel.segkmem_first_fit` is the
//! first-fit ablation). Next-fit delays the reuse of a
//! freed address until the rotor comes round, which is what lets most
//! cookies age past every CPU's last flush. A zone's cookie is consulted
//! only when the pages allocated include one freed since the zone was last
//! flushed ("a page is allocated from a freed zone whose addresses have
//! still not been flushed"): pages ahead of the rotor that nobody freed
//! need no shutdown even in a zone with a cookie.

use mmulab_machine::OpId;

/// One zone: the cookie of its frees still to be shot down, and the
/// operations (deferred kernel unloads) that complete once they are.
#[derive(Clone, Debug, Default)]
struct Zone {
    /// (cookie of the free, the free's deferred operation).
    pending: Vec<(u64, Option<OpId>)>,
}

impl Zone {
    /// The zone cookie: the newest free not yet known to be flushed.
    fn cookie(&self) -> Option<u64> {
        self.pending.iter().map(|&(c, _)| c).max()
    }
}

#[derive(Clone, Debug)]
pub struct Segkmem {
    /// First virtual page managed.
    pub base: u64,
    used: Vec<bool>,
    /// Per page: the cookie of its free, until a shutdown covers it.
    freed: Vec<Option<u64>>,
    zone_pages: u64,
    zones: Vec<Zone>,
    rotor: u64,
    /// First fit from the bottom instead of next fit from the rotor (an
    /// ablation: freed addresses are reused at once).
    pub first_fit: bool,
}

impl Segkmem {
    /// `pages` of kernel virtual space from `base`, zones of `zone_bytes`
    /// bytes of bitmap (8 pages per byte).
    pub fn new(base: u64, pages: u64, zone_bytes: u64) -> Segkmem {
        let zone_pages = (zone_bytes * 8).max(1);
        Segkmem {
            base,
            used: vec![false; pages as usize],
            freed: vec![None; pages as usize],
            zone_pages,
            zones: vec![Zone::default(); pages.div_ceil(zone_pages) as usize],
            rotor: 0,
            first_fit: false,
        }
    }

    /// First fit instead of next fit (the ablation).
    pub fn with_first_fit(mut self, first_fit: bool) -> Segkmem {
        self.first_fit = first_fit;
        self
    }

    pub fn pages(&self) -> u64 {
        self.used.len() as u64
    }

    pub fn zone_pages(&self) -> u64 {
        self.zone_pages
    }

    /// Allocates `pages` contiguous pages, next-fit from the rotor.
    /// Returns the first virtual page, or None when no run is free.
    pub fn alloc(&mut self, pages: u64) -> Option<u64> {
        let n = self.pages();
        if pages == 0 || pages > n {
            return None;
        }
        // Two passes: from the rotor to the end, then from 0 (first fit:
        // from 0 only).
        let starts: &[u64] = if self.first_fit {
            &[0]
        } else {
            &[self.rotor, 0]
        };
        for &start_from in starts {
            let mut run = 0;
            let mut i = start_from;
            while i < n {
                if self.used[i as usize] {
                    run = 0;
                } else {
                    run += 1;
                    if run == pages {
                        let first = i + 1 - pages;
                        for p in first..=i {
                            self.used[p as usize] = true;
                        }
                        self.rotor = (i + 1) % n;
                        return Some(self.base + first);
                    }
                }
                i += 1;
            }
        }
        None
    }

    fn zones_of(&self, vpn: u64, pages: u64) -> std::ops::RangeInclusive<usize> {
        let first = (vpn - self.base) / self.zone_pages;
        let last = (vpn - self.base + pages - 1) / self.zone_pages;
        first as usize..=last as usize
    }

    /// The zones whose freed, not yet flushed pages the range reuses, with
    /// the zone cookies: each needs a `hat_shutdown(cookie)` before the
    /// range is used.
    pub fn unflushed(&self, vpn: u64, pages: u64) -> Vec<(usize, u64)> {
        let off = vpn - self.base;
        let mut zones: Vec<usize> = (off..off + pages)
            .filter(|&p| self.freed[p as usize].is_some())
            .map(|p| (p / self.zone_pages) as usize)
            .collect();
        zones.dedup();
        zones
            .into_iter()
            .filter_map(|z| self.zones[z].cookie().map(|c| (z, c)))
            .collect()
    }

    /// Frees a range: clears its bits and sets the zone cookies. `op` is
    /// the unload whose completion was deferred to the reuse (None when the
    /// unload reduced nothing).
    pub fn free(&mut self, vpn: u64, pages: u64, cookie: u64, op: Option<OpId>) {
        for p in vpn - self.base..vpn - self.base + pages {
            assert!(
                self.used[p as usize],
                "segkmem: free of page {} not allocated",
                self.base + p
            );
            self.used[p as usize] = false;
            let f = &mut self.freed[p as usize];
            *f = Some(f.map_or(cookie, |old| old.max(cookie)));
        }
        for z in self.zones_of(vpn, pages) {
            self.zones[z].pending.push((cookie, op));
        }
    }

    /// `hat_shutdown(cookie)` returned for zone `z`: every free of the zone
    /// with a cookie no newer is now flushed from every TLB. Returns their
    /// operations (to complete); frees made meanwhile keep the zone
    /// cookie set.
    pub fn flushed(&mut self, z: usize, cookie: u64) -> Vec<OpId> {
        let first = z as u64 * self.zone_pages;
        let last = (first + self.zone_pages).min(self.pages());
        for f in &mut self.freed[first as usize..last as usize] {
            if f.is_some_and(|c| c <= cookie) {
                *f = None;
            }
        }
        let zone = &mut self.zones[z];
        let mut done = Vec::new();
        zone.pending.retain(|&(c, op)| {
            if c <= cookie {
                done.extend(op);
                false
            } else {
                true
            }
        });
        done
    }

    /// Zones with a cookie set (for tests and statistics).
    pub fn zones_with_cookie(&self) -> usize {
        self.zones.iter().filter(|z| z.cookie().is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_of_16_bytes_is_128_pages_and_cookie_is_set_by_free() {
        let mut s = Segkmem::new(1000, 512, 16);
        assert_eq!(s.zone_pages(), 128);
        let a = s.alloc(3).unwrap();
        assert_eq!(a, 1000);
        assert!(
            s.unflushed(a, 3).is_empty(),
            "a fresh zone needs no shutdown"
        );
        s.free(a, 3, 7, Some(OpId(4)));
        assert_eq!(s.unflushed(a, 3), vec![(0, 7)]);
        assert_eq!(s.zones_with_cookie(), 1);
        // A page ahead of the rotor was never freed: no shutdown for it,
        // although its zone has a cookie.
        let b = s.alloc(1).unwrap();
        assert_eq!(b, 1003);
        assert!(s.unflushed(b, 1).is_empty());
        // A free newer than the shutdown's cookie keeps the zone unflushed.
        s.free(b, 1, 9, None);
        assert_eq!(s.flushed(0, 7), vec![OpId(4)]);
        assert!(s.unflushed(a, 3).is_empty(), "covered by the shutdown");
        assert_eq!(s.unflushed(b, 1), vec![(0, 9)]);
        assert!(s.flushed(0, 9).is_empty());
        assert_eq!(s.zones_with_cookie(), 0);
    }

    #[test]
    fn next_fit_delays_reuse_until_the_rotor_wraps() {
        let mut s = Segkmem::new(0, 16, 1);
        assert_eq!(s.zone_pages(), 8);
        let a = s.alloc(4).unwrap();
        s.free(a, 4, 1, None);
        // The rotor moved past the freed run: the next allocations take
        // fresh pages first.
        assert_eq!(s.alloc(4), Some(4));
        assert_eq!(s.alloc(8), Some(8));
        // Then it wraps and reuses the freed run, whose zone has a cookie.
        assert_eq!(s.alloc(4), Some(0));
        assert_eq!(s.unflushed(0, 4), vec![(0, 1)]);
        assert_eq!(s.alloc(1), None, "full");
    }

    #[test]
    fn first_fit_reuses_a_freed_run_at_once() {
        let mut s = Segkmem::new(0, 16, 1);
        s.first_fit = true;
        let a = s.alloc(4).unwrap();
        s.free(a, 4, 1, None);
        assert_eq!(s.alloc(4), Some(0), "the freed run, not the rotor's");
        assert_eq!(s.unflushed(0, 4), vec![(0, 1)]);
    }

    #[test]
    fn a_range_across_zones_reports_each_unflushed_zone() {
        let mut s = Segkmem::new(0, 32, 1);
        let a = s.alloc(12).unwrap();
        s.free(a, 12, 3, Some(OpId(1)));
        assert_eq!(s.unflushed(6, 4), vec![(0, 3), (1, 3)]);
        assert_eq!(s.unflushed(9, 2), vec![(1, 3)]);
        // Completing the op through either zone is fine (completing twice
        // is allowed by the oracle).
        assert_eq!(s.flushed(0, 3), vec![OpId(1)]);
        assert_eq!(s.flushed(1, 3), vec![OpId(1)]);
    }
}
