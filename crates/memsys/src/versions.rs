//! The checker's memory versions: the global version of every block that
//! left the L2 after being written (0 for a block never written).
//!
//! A two-level table indexed by block number: a directory of pages grown
//! on demand, each page a fixed array of versions allocated on first write
//! to one of its blocks, so memory stays proportional to the physical
//! pages actually touched (plus 8 bytes of directory per page below the
//! highest one touched). Block numbers beyond the dense range (an address
//! space far larger than any simulated memory) fall back to a map. Looked
//! up on every L2 fill and written on every L2 eviction of a written block,
//! with no hashing on the common path.

use std::collections::HashMap;

/// Blocks per page of versions (a 4 KiB page of 64-byte blocks).
const PAGE_BITS: u32 = 6;
const PAGE: usize = 1 << PAGE_BITS;
/// Pages the directory may cover (64 GiB of 64-byte blocks); beyond, the map.
const DENSE_PAGES: u64 = 1 << 24;

#[derive(Clone, Debug, Default)]
pub struct Versions {
    pages: Vec<Option<Box<[u64; PAGE]>>>,
    sparse: HashMap<u64, u64>,
}

impl Versions {
    /// The last version stored for `block`, 0 if none.
    #[inline]
    pub fn get(&self, block: u64) -> u64 {
        let p = block >> PAGE_BITS;
        if p < DENSE_PAGES {
            match self.pages.get(p as usize) {
                Some(Some(page)) => page[(block as usize) & (PAGE - 1)],
                _ => 0,
            }
        } else {
            self.sparse.get(&block).copied().unwrap_or(0)
        }
    }

    /// Hints the host to fetch `block`'s entry (see `cache::prefetch`).
    #[inline]
    pub fn prefetch(&self, block: u64) {
        let p = block >> PAGE_BITS;
        if p < DENSE_PAGES
            && let Some(Some(page)) = self.pages.get(p as usize)
        {
            mmulab_engine::prefetch(&page[(block as usize) & (PAGE - 1)]);
        }
    }

    /// Records `version` (non-zero) for `block`.
    #[inline]
    pub fn set(&mut self, block: u64, version: u64) {
        let p = block >> PAGE_BITS;
        if let Some(Some(page)) = self.pages.get_mut(p as usize) {
            page[(block as usize) & (PAGE - 1)] = version;
        } else {
            self.set_slow(block, version);
        }
    }

    /// `set` for a block whose page is not allocated yet, or beyond the
    /// dense range (out of line: once per page).
    #[cold]
    #[inline(never)]
    fn set_slow(&mut self, block: u64, version: u64) {
        let p = block >> PAGE_BITS;
        if p < DENSE_PAGES {
            let p = p as usize;
            if p >= self.pages.len() {
                self.pages.resize(p + 1, None);
            }
            let page = self.pages[p].get_or_insert_with(|| Box::new([0; PAGE]));
            page[(block as usize) & (PAGE - 1)] = version;
        } else {
            self.sparse.insert(block, version);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse() {
        let mut v = Versions::default();
        assert_eq!(v.get(5), 0);
        v.set(5, 3);
        v.set(1000, 7);
        assert_eq!(v.get(5), 3);
        assert_eq!(v.get(6), 0);
        assert_eq!(v.get(1000), 7);
        assert_eq!(v.pages.iter().flatten().count(), 2);
        let far = DENSE_PAGES << PAGE_BITS | 9;
        assert_eq!(v.get(far), 0);
        v.set(far, 11);
        assert_eq!(v.get(far), 11);
        assert_eq!(v.get(u64::MAX - 1), 0);
        v.set(5, 4);
        assert_eq!(v.get(5), 4);
    }
}
