//! One memfd per segment (issue #7: "local processes share the site's one
//! copy"). The daemon reads and writes page bytes through its own service
//! mapping, which is always read-write and never handed to a program, so
//! no thread that serves faults ever touches a mapping that can fault.
//! Programs see attach mappings whose per-page protection mirrors what the
//! core says this site holds: set by the daemon itself through the
//! program's userfaultfd (write protection; a page held nowhere here is a
//! hole in the memfd, which takes it from every mapping at once), or by
//! the program's service thread on the mprotect path ([`RemoteFaults`]).

use super::local::{Client, proto};
use super::uffd::{self, Uffd};
use crate::core::{Held, PageNo};
use nix::libc;
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};
use std::ffi::c_void;
use std::io;
use std::sync::Arc;

pub struct SegmentMemory {
    fd: OwnedFd,
    pub page_bytes: usize,
    pub pages: usize,
    service: *mut u8,
    /// Attach mappings, all of length `len()`.
    attaches: Vec<Mapping>,
    /// What every attach mapping currently allows, per page (so that a
    /// protection already in place costs no syscall and no shootdown).
    prot: Vec<std::cell::Cell<Held>>,
    /// A clean stop is checking the pages in: no mapping gets a right back.
    frozen: bool,
    /// The userfaultfd path (None: mprotect) for this process's mappings.
    uffd: Option<Arc<Uffd>>,
}

/// An attach mapping: in this process (the Rust API), or in a program's
/// process (the shim), whose protections that program's service thread
/// sets on the daemon's behalf.
enum Mapping {
    Local {
        base: usize,
        readonly: bool,
    },
    Remote {
        client: Arc<Client>,
        process: u32,
        readonly: bool,
        faults: RemoteFaults,
    },
}

/// How a program's mapping catches faults (`local_proto::mode`).
pub enum RemoteFaults {
    /// mprotect + SIGSEGV: its service thread sets protections
    /// (`PROTECT`, acknowledged when a right is reduced).
    Mprotect,
    /// userfaultfd, not registered yet: the program write-protects the
    /// whole mapping before it touches it (a fork's child: before fork
    /// returns), so until its `REGISTER` it has no more than read rights
    /// on present pages; a page taken away is a hole (punched).
    UffdPending,
    /// userfaultfd, registered at `base` in the program: the daemon sets
    /// write protection through the program's fd itself (synchronous, no
    /// acknowledgement), a hole takes a page away, and the daemon's
    /// thread reads the faults.
    Uffd { uffd: Arc<Uffd>, base: usize },
}

/// Write protection on a program's mapping through its userfaultfd. The
/// program being gone (ESRCH) or the range unmapped by its `shmdt`
/// (ENOENT) leaves no right to take; any other failure kills it, as a
/// program that does not acknowledge a `PROTECT` is killed (coherence
/// before availability).
fn remote_write_protect(client: &Client, uffd: &Uffd, addr: usize, len: usize, on: bool) {
    match uffd.write_protect(addr, len, on) {
        Ok(()) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::ESRCH) | Some(libc::ENOENT)) => {}
        Err(e) => client.kill(&format!(
            "write protection through its userfaultfd failed: {e}"
        )),
    }
}

fn mprotect_flags(held: Held, readonly: bool) -> MprotectFlags {
    match held {
        Held::Nothing => MprotectFlags::empty(),
        Held::Read => MprotectFlags::READ,
        Held::Write if readonly => MprotectFlags::READ,
        Held::Write => MprotectFlags::READ | MprotectFlags::WRITE,
    }
}

fn prot_value(held: Held, readonly: bool) -> u64 {
    match held {
        Held::Nothing => proto::prot::NONE,
        Held::Read => proto::prot::READ,
        Held::Write if readonly => proto::prot::READ,
        Held::Write => proto::prot::READ_WRITE,
    }
}

// SAFETY: the raw pointers are mappings owned by this value; the daemon
// moves it between threads but only ever uses it from one at a time.
unsafe impl Send for SegmentMemory {}

impl SegmentMemory {
    pub fn new(
        name: &str,
        pages: usize,
        page_bytes: usize,
        uffd: Option<Arc<Uffd>>,
    ) -> io::Result<SegmentMemory> {
        assert_eq!(
            page_bytes,
            super::page_size(),
            "DSM pages are MMU pages (§6)"
        );
        let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
        // The daemon's own: a program handed a read-only descriptor (a
        // `SHM_RDONLY` attach) cannot reopen it for writing through
        // `/proc/self/fd` (a memfd starts with mode 0777).
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(0o600))?;
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
            frozen: false,
            uffd,
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
        // Under userfaultfd the mapping keeps its protection and the
        // kernel asks the daemon (holes, write protection); otherwise it
        // starts inaccessible.
        let prot = match (&self.uffd, readonly) {
            (None, _) => ProtFlags::empty(),
            (Some(_), true) => ProtFlags::READ,
            (Some(_), false) => ProtFlags::READ | ProtFlags::WRITE,
        };
        // SAFETY: FIXED_NOREPLACE never clobbers an existing mapping.
        let base = unsafe { rustix::mm::mmap(hint, self.len(), prot, flags, &self.fd, 0)? };
        if let Some(a) = addr
            && base as usize != a
        {
            // SAFETY: the mapping was just made and is ours.
            let _ = unsafe { rustix::mm::munmap(base, self.len()) };
            return Err(io::Error::from_raw_os_error(
                rustix::io::Errno::EXIST.raw_os_error(),
            ));
        }
        self.attaches.push(Mapping::Local {
            base: base as usize,
            readonly,
        });
        if let Some(u) = &self.uffd {
            if let Err(e) = u.register(base as usize, self.len(), readonly) {
                self.attaches.pop();
                // SAFETY: the mapping just made.
                let _ = unsafe { rustix::mm::munmap(base, self.len()) };
                return Err(e);
            }
            // Absent pages are holes already; present ones held for
            // reading are write-protected.
            for p in 0..self.pages {
                if self.prot[p].get() == Held::Read && !readonly {
                    let addr = base as usize + p * self.page_bytes;
                    u.write_protect(addr, self.page_bytes, true)?;
                }
            }
            return Ok(base as usize);
        }
        // The new mapping starts inaccessible: give it what the others have.
        for p in 0..self.pages {
            let held = self.prot[p].get();
            if held != Held::Nothing {
                let flags = mprotect_flags(held, readonly);
                let addr = base as usize + p * self.page_bytes;
                // SAFETY: a page of the mapping just made.
                unsafe { rustix::mm::mprotect(addr as *mut c_void, self.page_bytes, flags) }?;
            }
        }
        Ok(base as usize)
    }

    /// Takes every right away from every mapping, for good (a clean stop).
    pub fn freeze(&mut self) {
        for p in 0..self.pages {
            self.protect(PageNo(p as u32), Held::Nothing);
        }
        self.frozen = true;
    }

    /// The segment's memfd (the daemon's own descriptor).
    pub fn memfd(&self) -> rustix::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A descriptor of the memfd for a program's attach: read-only for a
    /// `SHM_RDONLY` attach (a writable shared mapping of it then fails,
    /// as `mprotect(PROT_WRITE)` on it does), else a duplicate.
    pub fn share(&self, readonly: bool) -> io::Result<OwnedFd> {
        if !readonly {
            return Ok(rustix::io::fcntl_dupfd_cloexec(&self.fd, 0)?);
        }
        let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        Ok(rustix::fs::open(
            path.as_str(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?)
    }

    /// Adds a program's mapping (the shim's). The caller sends the attach
    /// answer with [`SegmentMemory::memfd`], then (mprotect path)
    /// [`SegmentMemory::send_protections`], on the program's socket.
    pub fn attach_remote(
        &mut self,
        client: Arc<Client>,
        process: u32,
        readonly: bool,
        faults: RemoteFaults,
    ) -> io::Result<()> {
        if !matches!(faults, RemoteFaults::Mprotect) && !self.holes() {
            // From now on a page held nowhere here is a hole (a missing
            // fault for a userfaultfd mapping): punch those not yet.
            for p in 0..self.pages {
                if self.prot[p].get() == Held::Nothing {
                    uffd::punch(self.fd.as_fd(), p * self.page_bytes, self.page_bytes)?;
                }
            }
        }
        self.attaches.push(Mapping::Remote {
            client,
            process,
            readonly,
            faults,
        });
        Ok(())
    }

    /// Whether a page held nowhere here must be a hole in the memfd: some
    /// mapping catches faults through userfaultfd.
    fn holes(&self) -> bool {
        self.uffd.is_some()
            || self.attaches.iter().any(|m| {
                matches!(
                    m,
                    Mapping::Remote {
                        faults: RemoteFaults::UffdPending | RemoteFaults::Uffd { .. },
                        ..
                    }
                )
            })
    }

    /// A program's `REGISTER` of a pending userfaultfd mapping: `Some`:
    /// registered at `base`, served through `uffd` from now on (the
    /// daemon write-protects it whole again, then lifts the protection of
    /// the pages held for writing); `None`: the program fell back to
    /// mprotect (the mapping is inaccessible; the present protections are
    /// sent). `false` if `process` has no pending mapping here.
    pub fn register_remote(&mut self, process: u32, uffd: Option<(Arc<Uffd>, usize)>) -> bool {
        let len = self.len();
        let (ps, pages) = (self.page_bytes, self.pages);
        let prot: Vec<Held> = self.prot.iter().map(|c| c.get()).collect();
        let Some(Mapping::Remote {
            client,
            readonly,
            faults,
            ..
        }) = self.attaches.iter_mut().find(|m| {
            matches!(m, Mapping::Remote { process: p, faults: RemoteFaults::UffdPending, .. } if *p == process)
        })
        else {
            return false;
        };
        let readonly = *readonly;
        let client = client.clone();
        match uffd {
            Some((u, base)) => {
                if !readonly {
                    remote_write_protect(&client, &u, base, len, true);
                    for (p, held) in prot.iter().enumerate().take(pages) {
                        if *held == Held::Write {
                            remote_write_protect(&client, &u, base + p * ps, ps, false);
                        }
                    }
                }
                *faults = RemoteFaults::Uffd { uffd: u, base };
            }
            None => {
                *faults = RemoteFaults::Mprotect;
                self.send_protections(&client, process, readonly);
            }
        }
        true
    }

    /// The page of program attach `process` (registered with userfaultfd)
    /// containing `addr`.
    pub fn remote_uffd_page(&self, process: u32, addr: usize) -> Option<PageNo> {
        self.attaches.iter().find_map(|m| match m {
            Mapping::Remote {
                process: p,
                faults: RemoteFaults::Uffd { base, .. },
                ..
            } if *p == process && addr >= *base && addr < base + self.len() => {
                Some(PageNo(((addr - base) / self.page_bytes) as u32))
            }
            _ => None,
        })
    }

    /// Whether this site's mappings already allow the access (a fault
    /// that raced a grant).
    pub fn allows(&self, page: PageNo, write: bool) -> bool {
        match self.prot[page.0 as usize].get() {
            Held::Nothing => false,
            Held::Read => !write,
            Held::Write => true,
        }
    }

    /// Sets one program mapping's write protection of `page` to what the
    /// site holds (before waking a fault that raced a grant).
    pub fn refresh_remote(&self, process: u32, page: PageNo) {
        let held = self.prot[page.0 as usize].get();
        for m in &self.attaches {
            if let Mapping::Remote {
                client,
                process: p,
                readonly: false,
                faults: RemoteFaults::Uffd { uffd, base },
            } = m
                && *p == process
                && held != Held::Nothing
            {
                let addr = base + page.0 as usize * self.page_bytes;
                remote_write_protect(client, uffd, addr, self.page_bytes, held == Held::Read);
            }
        }
    }

    /// Tells a new program mapping what every page allows now (runs of
    /// equal protection; grants need no acknowledgement).
    pub fn send_protections(&self, client: &Client, process: u32, readonly: bool) {
        let mut p = 0;
        while p < self.pages {
            let held = self.prot[p].get();
            let mut end = p + 1;
            while end < self.pages && self.prot[end].get() == held {
                end += 1;
            }
            if held != Held::Nothing {
                client.protect(
                    process,
                    p as u64,
                    (end - p) as u64,
                    prot_value(held, readonly),
                    false,
                );
            }
            p = end;
        }
    }

    pub fn detach_remote(&mut self, process: u32) {
        self.attaches
            .retain(|m| !matches!(m, Mapping::Remote { process: p, .. } if *p == process));
    }

    pub fn detach(&mut self, base: usize) -> io::Result<()> {
        let i = self
            .attaches
            .iter()
            .position(|m| matches!(m, Mapping::Local { base: b, .. } if *b == base))
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
    /// A program's mapping that loses a right acknowledges it first; one
    /// that does not in time is killed (coherence before availability).
    pub fn protect(&self, page: PageNo, held: Held) {
        let held = if self.frozen { Held::Nothing } else { held };
        let cached = &self.prot[page.0 as usize];
        let before = cached.get();
        if before == held {
            return;
        }
        cached.set(held);
        let reducing = held < before;
        let mut acks = Vec::new();
        for m in &self.attaches {
            match m {
                Mapping::Local { base, readonly } if self.uffd.is_some() => {
                    // Nothing: the hole punched below takes the page from
                    // every mapping at once.
                    if held != Held::Nothing && !*readonly {
                        let addr = base + page.0 as usize * self.page_bytes;
                        let u = self.uffd.as_ref().expect("uffd path");
                        u.write_protect(addr, self.page_bytes, held == Held::Read)
                            .expect("write-protect an attach mapping");
                    }
                }
                Mapping::Local { base, readonly } => {
                    let addr = base + page.0 as usize * self.page_bytes;
                    // SAFETY: a page inside one of our attach mappings.
                    unsafe {
                        rustix::mm::mprotect(
                            addr as *mut c_void,
                            self.page_bytes,
                            mprotect_flags(held, *readonly),
                        )
                    }
                    .expect("mprotect of an attach mapping");
                }
                Mapping::Remote {
                    client,
                    readonly,
                    faults: RemoteFaults::Uffd { uffd, base },
                    ..
                } => {
                    // Nothing: the hole punched below.
                    if held != Held::Nothing && !*readonly {
                        let addr = base + page.0 as usize * self.page_bytes;
                        remote_write_protect(
                            client,
                            uffd,
                            addr,
                            self.page_bytes,
                            held == Held::Read,
                        );
                    }
                }
                Mapping::Remote {
                    faults: RemoteFaults::UffdPending,
                    ..
                } => {
                    // Write-protected whole by the program until it
                    // registers; Nothing: the hole punched below.
                }
                Mapping::Remote {
                    client,
                    process,
                    readonly,
                    faults: RemoteFaults::Mprotect,
                } => {
                    let seq = client.protect(
                        *process,
                        page.0 as u64,
                        1,
                        prot_value(held, *readonly),
                        reducing,
                    );
                    if reducing {
                        acks.push((client, seq));
                    }
                }
            }
        }
        // Sent to every program first, then awaited: the programs
        // mprotect in parallel.
        for (client, seq) in acks {
            client.wait_ack(seq);
        }
        if held == Held::Nothing && self.holes() {
            // After every program acknowledged: the bytes go, so the next
            // local access is a missing fault.
            uffd::punch(
                self.fd.as_fd(),
                page.0 as usize * self.page_bytes,
                self.page_bytes,
            )
            .expect("punch a page out of a segment");
        }
    }

    /// Before an installed page's bytes are written (userfaultfd path):
    /// write-protect it in every local mapping, so that no thread can
    /// write it between the copy and the grant.
    pub fn prepare_install(&self, page: PageNo) {
        for m in &self.attaches {
            match m {
                Mapping::Local {
                    base,
                    readonly: false,
                } => {
                    if let Some(u) = &self.uffd {
                        let addr = base + page.0 as usize * self.page_bytes;
                        let _ = u.write_protect(addr, self.page_bytes, true);
                    }
                }
                Mapping::Remote {
                    client,
                    readonly: false,
                    faults: RemoteFaults::Uffd { uffd, base },
                    ..
                } => {
                    let addr = base + page.0 as usize * self.page_bytes;
                    remote_write_protect(client, uffd, addr, self.page_bytes, true);
                }
                _ => {}
            }
        }
    }

    /// Pages present in the memfd (this site's copy; a hole is none).
    pub fn resident_pages(&self) -> u64 {
        rustix::fs::fstat(&self.fd)
            .map_or(0, |st| st.st_blocks as u64 * 512 / self.page_bytes as u64)
    }

    /// `SHM_LOCK`: pins this site's copy in memory. `MLOCK_ONFAULT`: a
    /// page is locked once present, and none is brought in by the lock,
    /// because a page held nowhere here must stay a hole (the
    /// userfaultfd path takes rights away by punching pages out).
    pub fn set_locked(&self, on: bool) -> io::Result<()> {
        // SAFETY: the service mapping, owned by this value, whole.
        let rc = unsafe {
            if on {
                libc::mlock2(
                    self.service as *const c_void,
                    self.len(),
                    libc::MLOCK_ONFAULT,
                )
            } else {
                libc::munlock(self.service as *const c_void, self.len())
            }
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// The local attach mapping containing `addr`: (base, page).
    pub fn local_page_of(&self, addr: usize) -> Option<(usize, PageNo)> {
        self.attaches.iter().find_map(|m| match m {
            Mapping::Local { base, .. } if addr >= *base && addr < base + self.len() => {
                Some((*base, PageNo(((addr - base) / self.page_bytes) as u32)))
            }
            _ => None,
        })
    }

    /// The page's bytes through the service mapping.
    pub fn page(&self, page: PageNo) -> &[u8] {
        let off = page.0 as usize * self.page_bytes;
        assert!(off + self.page_bytes <= self.len());
        // SAFETY: in bounds of the service mapping, which lives as long as self.
        unsafe { std::slice::from_raw_parts(self.service.add(off), self.page_bytes) }
    }

    /// Writes part of a page through the service mapping (the Rust API's
    /// checked write, on a page held writable here).
    pub fn write_at(&self, page: PageNo, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.page_bytes, "inside one page");
        let off = page.0 as usize * self.page_bytes + at;
        assert!(off + bytes.len() <= self.len());
        // SAFETY: in bounds of the service mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.service.add(off), bytes.len())
        };
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
            for m in &self.attaches {
                if let Mapping::Local { base, .. } = m {
                    let _ = rustix::mm::munmap(*base as *mut c_void, self.len());
                }
            }
            let _ = rustix::mm::munmap(self.service as *mut c_void, self.len());
        }
    }
}
