//! Typed page faults for the real runtime.
//!
//! Path in use: **mprotect + SIGSEGV**. At start-up [`probe`] also tries
//! `userfaultfd` (with and without `UFFD_USER_MODE_ONLY`) and reports what
//! the kernel offers; the uffd path is not wired yet (issue #7 lists it
//! first; this slice ships the fallback the issue requires anyway).
//!
//! The fault type is read from the signal context (fleisch89 §6.2 needs
//! typed faults): on x86-64 bit 1 of the page-fault error code
//! (`REG_ERR`) says "write". Elsewhere the type is `Unknown` and the daemon
//! resolves it read-then-upgrade: a fault on a page already readable here
//! must be a write.
//!
//! The handler runs on the faulting thread and only uses async-signal-safe
//! calls: it looks the address up in a fixed table of atomics, writes a
//! 24-byte record to the site's fault pipe (atomic: under `PIPE_BUF`) and
//! sleeps on a futex word on its own stack until the daemon sets it. It
//! then returns and the instruction is retried; if the page was taken away
//! again meanwhile, it simply faults again.

use nix::libc;
use std::sync::Once;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};

/// Attach mappings that may fault, process-wide (one table for every site
/// running in this process: tests run two).
const SLOTS: usize = 256;

struct Slot {
    base: AtomicUsize,
    len: AtomicUsize,
    id: AtomicU32,
    pipe: AtomicI32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    id: AtomicU32::new(0),
    pipe: AtomicI32::new(-1),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();

pub const ACCESS_READ: u32 = 0;
pub const ACCESS_WRITE: u32 = 1;
pub const ACCESS_UNKNOWN: u32 = 2;

/// Word values the daemon stores to release a sleeping faulter.
pub const WAKE_RETRY: u32 = 1;
pub const WAKE_FAIL: u32 = 2;
/// A write through a `SHM_RDONLY` attach: a plain segmentation fault.
pub const WAKE_SEGV: u32 = 3;

/// What the handler sends the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FaultRecord {
    /// The attach mapping's id (the core's process id of the attachment).
    pub id: u32,
    pub page: u32,
    pub access: u32,
    pub pad: u32,
    /// Address of the faulter's futex word.
    pub word: u64,
}

pub const RECORD_BYTES: usize = std::mem::size_of::<FaultRecord>();

impl FaultRecord {
    pub fn from_bytes(b: &[u8; RECORD_BYTES]) -> FaultRecord {
        // SAFETY: FaultRecord is plain old data of exactly this size.
        unsafe { std::ptr::read_unaligned(b.as_ptr() as *const FaultRecord) }
    }
}

/// Registers an attach mapping; returns its slot.
pub fn register(base: usize, len: usize, id: u32, pipe_fd: i32) -> usize {
    install_handler();
    for (i, s) in TABLE.iter().enumerate() {
        if s.base
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            s.len.store(len, Ordering::Release);
            s.id.store(id, Ordering::Release);
            s.pipe.store(pipe_fd, Ordering::Release);
            // Publishing the base last makes the slot visible whole.
            s.base.store(base, Ordering::Release);
            return i;
        }
    }
    panic!("more than {SLOTS} DSM attach mappings in one process");
}

pub fn unregister(slot: usize) {
    let s = &TABLE[slot];
    s.base.store(usize::MAX, Ordering::Release);
    s.pipe.store(-1, Ordering::Release);
    s.base.store(0, Ordering::Release);
}

fn install_handler() {
    INSTALL.call_once(|| {
        // SAFETY: a handler that only uses async-signal-safe calls.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut sa.sa_mask);
            let rc = libc::sigaction(libc::SIGSEGV, &sa, std::ptr::null_mut());
            assert_eq!(rc, 0, "sigaction(SIGSEGV)");
        }
    });
}

#[cfg(target_arch = "x86_64")]
unsafe fn access_of(ctx: *mut libc::c_void) -> u32 {
    // SAFETY: the kernel passes a ucontext_t to an SA_SIGINFO handler.
    let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
    if uc.uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0 {
        ACCESS_WRITE
    } else {
        ACCESS_READ
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn access_of(_ctx: *mut libc::c_void) -> u32 {
    ACCESS_UNKNOWN
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO guarantees info and ctx.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in TABLE.iter() {
        let base = s.base.load(Ordering::Acquire);
        if base == 0 || base == usize::MAX {
            continue;
        }
        let len = s.len.load(Ordering::Acquire);
        if addr < base || addr >= base + len {
            continue;
        }
        let pipe = s.pipe.load(Ordering::Acquire);
        let word = AtomicU32::new(0);
        let rec = FaultRecord {
            id: s.id.load(Ordering::Acquire),
            page: ((addr - base) / super::page_size()) as u32,
            // SAFETY: ctx is the kernel's ucontext.
            access: unsafe { access_of(ctx) },
            pad: 0,
            word: &word as *const AtomicU32 as u64,
        };
        // SAFETY: write(2) is async-signal-safe; the record is POD.
        let n = unsafe {
            libc::write(
                pipe,
                &rec as *const FaultRecord as *const libc::c_void,
                RECORD_BYTES,
            )
        };
        if n != RECORD_BYTES as isize {
            break;
        }
        loop {
            let v = word.load(Ordering::Acquire);
            if v == WAKE_RETRY {
                return;
            }
            if v == WAKE_SEGV {
                // SAFETY: async-signal-safe; the retried access crashes.
                unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
                return;
            }
            if v == WAKE_FAIL {
                // The page cannot be served coherently (coherence before
                // availability): SIGBUS at that address.
                let msg = b"mmulab dsm: page lost, raising SIGBUS\n";
                // SAFETY: async-signal-safe calls only.
                unsafe {
                    libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
                    libc::signal(libc::SIGBUS, libc::SIG_DFL);
                    libc::raise(libc::SIGBUS);
                }
                return;
            }
            let _ =
                rustix::thread::futex::wait(&word, rustix::thread::futex::Flags::PRIVATE, 0, None);
        }
    }
    // Not a DSM address: fall back to the default action and let the
    // instruction fault again, so a real crash stays a crash.
    // SAFETY: async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// Releases a faulter sleeping in the handler.
///
/// # Safety
/// `word` must be the address from a `FaultRecord` whose faulter has not
/// been released yet (it sleeps until this call, so the word is alive).
pub unsafe fn release(word: u64, value: u32) {
    // SAFETY: by the contract above.
    let w = unsafe { &*(word as *const AtomicU32) };
    w.store(value, Ordering::Release);
    let _ = rustix::thread::futex::wake(w, rustix::thread::futex::Flags::PRIVATE, 1);
}

/// What the kernel offers, probed at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub uffd: bool,
    pub uffd_user_mode_only: bool,
    /// The path this runtime uses.
    pub path: &'static str,
}

impl Probe {
    pub fn describe(&self) -> String {
        format!(
            "fault path: {} (userfaultfd: {}, UFFD_USER_MODE_ONLY: {})",
            self.path,
            if self.uffd { "available" } else { "refused" },
            if self.uffd_user_mode_only {
                "available"
            } else {
                "refused"
            }
        )
    }
}

pub fn probe() -> Probe {
    const UFFD_USER_MODE_ONLY: libc::c_long = 1;
    let try_uffd = |flags: libc::c_long| {
        // SAFETY: userfaultfd(2) with plain flags; the fd is closed at once.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_userfaultfd,
                flags | libc::O_CLOEXEC as libc::c_long,
            )
        };
        if fd >= 0 {
            // SAFETY: an fd we own.
            unsafe { libc::close(fd as i32) };
            true
        } else {
            false
        }
    };
    Probe {
        uffd: try_uffd(0),
        uffd_user_mode_only: try_uffd(UFFD_USER_MODE_ONLY),
        path: "mprotect+SIGSEGV",
    }
}
