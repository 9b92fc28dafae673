//! The userfaultfd fault path (issue #7, "Faults"), through raw syscalls
//! and the kernel's own constants (`linux-raw-sys`; the `userfaultfd`
//! crate needs libclang).
//!
//! A segment's memfd is registered in *missing* and *write-protect* modes
//! in every attach mapping of this process:
//! - **Nothing** held: the page is a hole in the memfd (punched with
//!   `fallocate`, which takes it from every mapping at once); an access is
//!   a *missing* fault, typed by `UFFD_PAGEFAULT_FLAG_WRITE`.
//! - **Read** held: the page is present and write-protected; a write is a
//!   *write-protect* fault.
//! - **Write** held: present, not write-protected.
//!
//! The faulting thread sleeps in the kernel until the daemon wakes the
//! range (`UFFDIO_WAKE`, or clearing write protection). A fault that
//! cannot be served maps an empty memfd over the page before the wake, so
//! that the retried access takes a genuine SIGBUS there.
//!
//! This file is also compiled into the shim (`libmmulab_shm.so`, through
//! `#[path]`): a program under the shim opens its own userfaultfd (it is
//! per address space), registers its attach mappings and passes the fd to
//! its site daemon, whose thread serves the faults and sets write
//! protection through it.
//!
//! `UFFD_USER_MODE_ONLY` is used when the kernel refuses a full
//! userfaultfd (`vm.unprivileged_userfaultfd = 0` and no privilege): then
//! a system call touching a missing page fails with EFAULT instead of
//! waiting, as on the mprotect path.

use linux_raw_sys::general as g;
use linux_raw_sys::ioctl as ioc;
use nix::libc;
use rustix::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::io;

/// `UFFDIO_WRITEPROTECT_MODE_WP` (linux/userfaultfd.h: `1 << 0`).
const WRITEPROTECT_MODE_WP: u64 = 1;

/// Features the path needs from `UFFDIO_API`.
const NEEDED: u64 = (g::UFFD_FEATURE_MISSING_SHMEM
    | g::UFFD_FEATURE_WP_HUGETLBFS_SHMEM
    | g::UFFD_FEATURE_PAGEFAULT_FLAG_WP) as u64;

/// One userfaultfd of this process.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    pub user_mode_only: bool,
    pub features: u64,
}

fn ioctl<T>(fd: i32, req: u32, arg: &mut T) -> io::Result<()> {
    // SAFETY: a userfaultfd ioctl with its matching argument structure.
    let rc = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Uffd {
    /// Opens a userfaultfd (`user_mode_only`: with `UFFD_USER_MODE_ONLY`)
    /// and checks that it offers missing and write-protect faults on shmem.
    pub fn open(user_mode_only: bool) -> io::Result<Uffd> {
        // Non-blocking: a fault resolved before its message is read
        // leaves poll ready and read empty (EAGAIN, not a hang).
        let mut flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as libc::c_long;
        if user_mode_only {
            flags |= g::UFFD_USER_MODE_ONLY as libc::c_long;
        }
        // SAFETY: userfaultfd(2) with plain flags.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut api = g::uffdio_api {
            api: g::UFFD_API as u64,
            features: NEEDED,
            ioctls: 0,
        };
        ioctl(fd.as_raw_fd(), ioc::UFFDIO_API, &mut api)?;
        if api.features & NEEDED != NEEDED {
            return Err(io::Error::other("no missing/write-protect faults on shmem"));
        }
        Ok(Uffd {
            fd,
            user_mode_only,
            features: api.features,
        })
    }

    /// A userfaultfd another process opened and passed here (the shim's,
    /// over the local socket): its ioctls act on that process's memory.
    pub fn from_fd(fd: OwnedFd) -> Uffd {
        Uffd {
            fd,
            user_mode_only: false,
            features: 0,
        }
    }

    /// The descriptor, to pass to the site daemon.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use rustix::fd::AsFd;
        self.fd.as_fd()
    }

    pub fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Registers a mapping for missing and (unless read-only)
    /// write-protect faults.
    pub fn register(&self, base: usize, len: usize, readonly: bool) -> io::Result<()> {
        let mut r = g::uffdio_register {
            range: g::uffdio_range {
                start: base as u64,
                len: len as u64,
            },
            mode: if readonly {
                g::UFFDIO_REGISTER_MODE_MISSING as u64
            } else {
                (g::UFFDIO_REGISTER_MODE_MISSING | g::UFFDIO_REGISTER_MODE_WP) as u64
            },
            ioctls: 0,
        };
        ioctl(self.raw(), ioc::UFFDIO_REGISTER, &mut r)
    }

    /// Sets or clears write protection (clearing wakes the waiters).
    pub fn write_protect(&self, addr: usize, len: usize, on: bool) -> io::Result<()> {
        let mut w = g::uffdio_writeprotect {
            range: g::uffdio_range {
                start: addr as u64,
                len: len as u64,
            },
            mode: if on { WRITEPROTECT_MODE_WP } else { 0 },
        };
        // EAGAIN: the address space is changing under the call (bounded
        // retries).
        let mut tries = 0;
        loop {
            match ioctl(self.raw(), ioc::UFFDIO_WRITEPROTECT, &mut w) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < 1000 => {
                    tries += 1;
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    /// Wakes the threads waiting on a range.
    pub fn wake(&self, addr: usize, len: usize) {
        let mut r = g::uffdio_range {
            start: addr as u64,
            len: len as u64,
        };
        let _ = ioctl(self.raw(), ioc::UFFDIO_WAKE, &mut r);
    }

    /// Waits up to `timeout_ms` for one page-fault event: (address, write).
    pub fn next_fault(&self, timeout_ms: i32) -> io::Result<Option<(usize, bool)>> {
        let mut pfd = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one fd we own.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if n <= 0 {
            return Ok(None);
        }
        self.try_fault()
    }

    /// One page-fault event if one is queued now (never sleeps).
    pub fn try_fault(&self) -> io::Result<Option<(usize, bool)>> {
        let mut msg = std::mem::MaybeUninit::<g::uffd_msg>::zeroed();
        let size = std::mem::size_of::<g::uffd_msg>();
        // SAFETY: reading one uffd_msg into a buffer of its size.
        let got = unsafe { libc::read(self.raw(), msg.as_mut_ptr().cast(), size) };
        if got != size as isize {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EAGAIN) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        // SAFETY: the kernel filled the whole message.
        let msg = unsafe { msg.assume_init() };
        if msg.event as u32 != g::UFFD_EVENT_PAGEFAULT {
            return Ok(None);
        }
        // SAFETY: a page-fault message's union member.
        let pf = unsafe { msg.arg.pagefault };
        let write =
            pf.flags & (g::UFFD_PAGEFAULT_FLAG_WRITE | g::UFFD_PAGEFAULT_FLAG_WP) as u64 != 0;
        Ok(Some((pf.address as usize, write)))
    }
}

/// Takes a page from the memfd and from every mapping of it.
pub fn punch(fd: BorrowedFd<'_>, offset: usize, len: usize) -> io::Result<()> {
    // SAFETY: fallocate(2) on our own memfd.
    let rc = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Maps an empty memfd over one page of this process: the next access
/// there takes a SIGBUS (the page is lost; no zeros, no stale copy).
pub fn poison(page_addr: usize, page_bytes: usize) {
    // SAFETY: memfd_create, mmap over a page of one of our own attach
    // mappings, close.
    unsafe {
        let fd = libc::memfd_create(c"mmulab-dsm-lost".as_ptr(), libc::MFD_CLOEXEC);
        if fd >= 0 {
            libc::mmap(
                page_addr as *mut libc::c_void,
                page_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            );
            libc::close(fd);
        }
    }
}

/// Whether the full path works here: a memfd mapping registered in both
/// modes and write-protected.
pub fn works(uffd: &Uffd) -> bool {
    let uffd = match Uffd::open(uffd.user_mode_only) {
        Ok(u) => u,
        Err(_) => return false,
    };
    let Ok(fd) = rustix::fs::memfd_create("mmulab-uffd-probe", rustix::fs::MemfdFlags::CLOEXEC)
    else {
        return false;
    };
    let ps = super::page_size();
    if rustix::fs::ftruncate(&fd, ps as u64).is_err() {
        return false;
    }
    // SAFETY: a fresh shared mapping of our own memfd, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ps,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    let ok = uffd.register(p as usize, ps, false).is_ok()
        && uffd.write_protect(p as usize, ps, true).is_ok();
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, ps) };
    ok
}
