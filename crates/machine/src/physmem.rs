//! Physical memory: frames that hold either data words or a page table.
//!
//! Data is kept as 64-bit words (page_size / 8 per frame), allocated when a
//! frame is first given out. Page-table frames hold one entry per slot of
//! their format (1024 four-byte entries on i386, 512 eight-byte on x86-64);
//! the entry's physical address is `frame * page_size + index * pte_bytes`.
//! Freed frames are reused last-in first-out, which makes a stale
//! translation to a freed frame as visible as possible.

use crate::ids::Pfn;

/// Eight words of a data frame, aligned like a host cache line, so that a
/// simulated 64-byte block is one host line (one miss, one prefetch).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct Line([u64; 8]);

#[derive(Debug)]
enum Frame {
    Free,
    Data(Box<[Line]>),
    Table(Box<[u64]>),
}

/// The words of one data frame, resolved once: the user hot path takes a
/// page's frame once per run of references to it instead of looking the
/// frame up again for every word (`PhysMem::data_frame_mut`).
pub struct DataFrame<'a>(&'a mut [Line]);

impl DataFrame<'_> {
    /// The word at byte `offset` (a multiple of 8, inside the page).
    #[inline(always)]
    pub fn load(&self, offset: u64) -> u64 {
        let i = (offset / 8) as usize;
        self.0[i / 8].0[i % 8]
    }

    #[inline(always)]
    pub fn store(&mut self, offset: u64, value: u64) {
        let i = (offset / 8) as usize;
        self.0[i / 8].0[i % 8] = value;
    }

    /// Host-only hint, as `PhysMem::prefetch`.
    #[inline(always)]
    pub fn prefetch(&self, offset: u64) {
        if let Some(w) = self.0.get((offset / 64) as usize) {
            crate::prefetch(w);
        }
    }
}

#[derive(Debug)]
pub struct PhysMem {
    page_size: u64,
    frames: Vec<Frame>,
    free: Vec<Pfn>,
    limit: u64,
    /// Frames ever allocated, for statistics.
    pub allocations: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    pub frames: u64,
}

impl PhysMem {
    /// `limit` is the number of frames physical memory has.
    pub fn new(page_size: u64, limit: u64) -> PhysMem {
        assert!(
            page_size.is_power_of_two() && page_size >= 512,
            "page size {page_size}"
        );
        // Frame 0 is never handed out so that a zero PTE can never name a
        // valid frame by accident.
        PhysMem {
            page_size,
            frames: vec![Frame::Free],
            free: Vec::new(),
            limit,
            allocations: 0,
        }
    }

    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    pub fn frames_in_use(&self) -> u64 {
        (self.frames.len() as u64 - 1) - self.free.len() as u64
    }

    fn take_frame(&mut self) -> Result<Pfn, OutOfMemory> {
        self.allocations += 1;
        if let Some(pfn) = self.free.pop() {
            return Ok(pfn);
        }
        if self.frames.len() as u64 > self.limit {
            return Err(OutOfMemory { frames: self.limit });
        }
        self.frames.push(Frame::Free);
        Ok(Pfn(self.frames.len() as u64 - 1))
    }

    /// A zero-filled data frame.
    pub fn alloc_data(&mut self) -> Result<Pfn, OutOfMemory> {
        let pfn = self.take_frame()?;
        let lines = (self.page_size / 64) as usize;
        self.frames[pfn.0 as usize] = Frame::Data(vec![Line([0; 8]); lines].into_boxed_slice());
        Ok(pfn)
    }

    /// A zero-filled page-table frame with `entries` slots.
    pub fn alloc_table(&mut self, entries: usize) -> Result<Pfn, OutOfMemory> {
        let pfn = self.take_frame()?;
        self.frames[pfn.0 as usize] = Frame::Table(vec![0; entries].into_boxed_slice());
        Ok(pfn)
    }

    pub fn free(&mut self, pfn: Pfn) {
        let f = &mut self.frames[pfn.0 as usize];
        assert!(!matches!(f, Frame::Free), "double free of {pfn}");
        *f = Frame::Free;
        self.free.push(pfn);
    }

    #[inline]
    pub fn is_data(&self, pfn: Pfn) -> bool {
        matches!(self.frames.get(pfn.0 as usize), Some(Frame::Data(_)))
    }

    /// Data frame `pfn`'s words, or `None` when `pfn` is no data frame
    /// (a user access there is a wild access).
    #[inline]
    pub fn data_frame_mut(&mut self, pfn: Pfn) -> Option<DataFrame<'_>> {
        match self.frames.get_mut(pfn.0 as usize) {
            Some(Frame::Data(d)) => Some(DataFrame(d)),
            _ => None,
        }
    }

    #[inline]
    fn data(&self, pfn: Pfn) -> &[Line] {
        match &self.frames[pfn.0 as usize] {
            Frame::Data(d) => d,
            other => panic!("{pfn} is not a data frame: {other:?}"),
        }
    }

    #[inline]
    fn data_mut(&mut self, pfn: Pfn) -> &mut [Line] {
        match &mut self.frames[pfn.0 as usize] {
            Frame::Data(d) => d,
            Frame::Free => panic!("{pfn} is free"),
            Frame::Table(_) => panic!("{pfn} is a page table"),
        }
    }

    pub fn table(&self, pfn: Pfn) -> &[u64] {
        match &self.frames[pfn.0 as usize] {
            Frame::Table(t) => t,
            other => panic!("{pfn} is not a page table: {other:?}"),
        }
    }

    pub fn table_mut(&mut self, pfn: Pfn) -> &mut [u64] {
        match &mut self.frames[pfn.0 as usize] {
            Frame::Table(t) => t,
            _ => panic!("{pfn} is not a page table"),
        }
    }

    /// Copies a data frame (copy-on-write).
    pub fn copy_data(&mut self, from: Pfn, to: Pfn) {
        let src = self.data(from).to_vec();
        self.data_mut(to).copy_from_slice(&src);
    }

    /// A 64-bit word load; `offset` is the byte offset within the frame.
    #[inline]
    pub fn load(&self, pfn: Pfn, offset: u64) -> u64 {
        let i = (offset / 8) as usize;
        self.data(pfn)[i / 8].0[i % 8]
    }

    /// Hints the host to fetch the word at `offset` of data frame `pfn`
    /// (a sequential sweep's next reference); no effect on the simulation.
    #[inline]
    pub fn prefetch(&self, pfn: Pfn, offset: u64) {
        if let Some(Frame::Data(d)) = self.frames.get(pfn.0 as usize)
            && let Some(w) = d.get((offset / 64) as usize)
        {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch never faults and reads nothing the program
            // sees; SSE is part of the x86-64 baseline.
            unsafe {
                use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                _mm_prefetch::<_MM_HINT_T0>((w as *const Line).cast());
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = w;
        }
    }

    #[inline]
    pub fn store(&mut self, pfn: Pfn, offset: u64, value: u64) {
        let i = (offset / 8) as usize;
        self.data_mut(pfn)[i / 8].0[i % 8] = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_zeroed_and_reused_lifo() {
        let mut m = PhysMem::new(4096, 100);
        let a = m.alloc_data().unwrap();
        m.store(a, 8, 42);
        assert_eq!(m.load(a, 8), 42);
        let b = m.alloc_data().unwrap();
        m.free(a);
        let c = m.alloc_data().unwrap();
        assert_eq!(c, a, "last freed is first reused");
        assert_eq!(m.load(c, 8), 0, "reused frame is zero-filled");
        assert_ne!(b, a);
        assert_ne!(a, Pfn(0));
    }

    #[test]
    fn memory_limit_is_enforced() {
        let mut m = PhysMem::new(4096, 2);
        m.alloc_data().unwrap();
        m.alloc_data().unwrap();
        assert!(m.alloc_data().is_err());
    }
}
