//! One memfd per segment (issue #7: "local processes share the site's one
//! copy"). The daemon reads and writes page bytes through its own service
//! mapping, which is always read-write and never handed to a program, so
//! no thread that serves faults ever touches a mapping that can fault.
//! Programs see attach mappings whose per-page protection mirrors what the
//! core says this site holds.

use crate::core::{Held, PageNo};
use rustix::fd::OwnedFd;
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};
use std::ffi::c_void;
use std::io;

pub struct SegmentMemory {
    fd: OwnedFd,
    pub page_bytes: usize,
    pub pages: usize,
    service: *mut u8,
    /// Attach mappings (base address, read-only), all of length `len()`.
    attaches: Vec<(usize, bool)>,
    /// What every attach mapping currently allows, per page (so that a
    /// protection already in place costs no syscall and no shootdown).
    prot: Vec<std::cell::Cell<Held>>,
}

// SAFETY: the raw pointers are mappings owned by this value; the daemon
// moves it between threads but only ever uses it from one at a time.
unsafe impl Send for SegmentMemory {}

impl SegmentMemory {
    pub fn new(name: &str, pages: usize, page_bytes: usize) -> io::Result<SegmentMemory> {
        assert_eq!(
            page_bytes,
            super::page_size(),
            "DSM pages are MMU pages (§6)"
        );
        let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
        let len = pages * page_bytes;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // SAFETY: a fresh shared mapping of our own memfd.
        let service = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        } as *mut u8;
        Ok(SegmentMemory {
            fd,
            page_bytes,
            pages,
            service,
            attaches: Vec::new(),
            prot: vec![std::cell::Cell::new(Held::Nothing); pages],
        })
    }

    pub fn len(&self) -> usize {
        self.pages * self.page_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// Maps the segment for a program, every page inaccessible; at `addr`
    /// when given (never replacing an existing mapping).
    pub fn attach(&mut self, addr: Option<usize>, readonly: bool) -> io::Result<usize> {
        let (hint, flags) = match addr {
            Some(a) => (
                a as *mut c_void,
                MapFlags::SHARED | MapFlags::FIXED_NOREPLACE,
            ),
            None => (std::ptr::null_mut(), MapFlags::SHARED),
        };
        // SAFETY: FIXED_NOREPLACE never clobbers an existing mapping.
        let base =
            unsafe { rustix::mm::mmap(hint, self.len(), ProtFlags::empty(), flags, &self.fd, 0)? };
        if let Some(a) = addr
            && base as usize != a
        {
            // SAFETY: the mapping was just made and is ours.
            let _ = unsafe { rustix::mm::munmap(base, self.len()) };
            return Err(io::Error::from_raw_os_error(
                rustix::io::Errno::EXIST.raw_os_error(),
            ));
        }
        self.attaches.push((base as usize, readonly));
        // The new mapping starts inaccessible: give it what the others have.
        for p in 0..self.pages {
            let held = self.prot[p].get();
            if held != Held::Nothing {
                let flags = match held {
                    Held::Read => MprotectFlags::READ,
                    _ if readonly => MprotectFlags::READ,
                    _ => MprotectFlags::READ | MprotectFlags::WRITE,
                };
                let addr = base as usize + p * self.page_bytes;
                // SAFETY: a page of the mapping just made.
                unsafe { rustix::mm::mprotect(addr as *mut c_void, self.page_bytes, flags) }?;
            }
        }
        Ok(base as usize)
    }

    pub fn detach(&mut self, base: usize) -> io::Result<()> {
        let i = self
            .attaches
            .iter()
            .position(|&(b, _)| b == base)
            .ok_or_else(|| io::Error::from_raw_os_error(rustix::io::Errno::INVAL.raw_os_error()))?;
        self.attaches.swap_remove(i);
        // SAFETY: an attach mapping of this segment; the program gave it up.
        unsafe { rustix::mm::munmap(base as *mut c_void, self.len()) }?;
        Ok(())
    }

    pub fn attach_count(&self) -> usize {
        self.attaches.len()
    }

    /// Sets one page's protection in every attach mapping of this site:
    /// after this returns, no local mapping has more than `held` allows.
    pub fn protect(&self, page: PageNo, held: Held) {
        let cached = &self.prot[page.0 as usize];
        if cached.get() == held {
            return;
        }
        cached.set(held);
        for &(base, readonly) in &self.attaches {
            let flags = match held {
                Held::Nothing => MprotectFlags::empty(),
                Held::Read => MprotectFlags::READ,
                Held::Write if readonly => MprotectFlags::READ,
                Held::Write => MprotectFlags::READ | MprotectFlags::WRITE,
            };
            let addr = base + page.0 as usize * self.page_bytes;
            // SAFETY: a page inside one of our attach mappings.
            unsafe { rustix::mm::mprotect(addr as *mut c_void, self.page_bytes, flags) }
                .expect("mprotect of an attach mapping");
        }
    }

    /// The page's bytes through the service mapping.
    pub fn page(&self, page: PageNo) -> &[u8] {
        let off = page.0 as usize * self.page_bytes;
        assert!(off + self.page_bytes <= self.len());
        // SAFETY: in bounds of the service mapping, which lives as long as self.
        unsafe { std::slice::from_raw_parts(self.service.add(off), self.page_bytes) }
    }

    pub fn write_page(&mut self, page: PageNo, bytes: &[u8]) {
        assert_eq!(bytes.len(), self.page_bytes, "a whole page");
        let off = page.0 as usize * self.page_bytes;
        assert!(off + self.page_bytes <= self.len());
        // SAFETY: in bounds of the service mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.service.add(off), bytes.len())
        };
    }
}

impl Drop for SegmentMemory {
    fn drop(&mut self) {
        // SAFETY: mappings created by this value.
        unsafe {
            for &(b, _) in &self.attaches {
                let _ = rustix::mm::munmap(b as *mut c_void, self.len());
            }
            let _ = rustix::mm::munmap(self.service as *mut c_void, self.len());
        }
    }
}
