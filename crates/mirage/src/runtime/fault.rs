//! Typed page faults for the real runtime.
//!
//! Two paths. **userfaultfd** (`super::uffd`), missing + write-protect
//! modes, when the kernel offers it ([`open_path`]; full, else
//! `UFFD_USER_MODE_ONLY`), and the fallback, **mprotect + SIGSEGV**,
//! below. [`probe`] reports what the kernel offers and the path in use.
//! This covers the daemon's own mappings (the Rust API). Programs under
//! the shim choose the same way in their own process (same kernel,
//! credentials and `MMULAB_DSM_FAULT_PATH`): on the userfaultfd path they
//! pass their own userfaultfd to the daemon, which serves it
//! (`node::remote_uffd_reader`); on the mprotect path their service
//! thread sets protections for the daemon (see `crates/mirage-shim`).
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
                let mut line = [0u8; 160];
                let head = b"mmulab dsm: ";
                line[..head.len()].copy_from_slice(head);
                let mut n = head.len();
                for r in REASON.iter() {
                    let c = r.load(Ordering::Acquire);
                    if c == 0 {
                        break;
                    }
                    line[n] = c;
                    n += 1;
                }
                for &c in b"; SIGBUS\n" {
                    line[n] = c;
                    n += 1;
                }
                // SAFETY: async-signal-safe calls only.
                unsafe {
                    libc::write(2, line.as_ptr() as *const libc::c_void, n);
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

/// Why the latest fault failed, for the handler's stderr line (one
/// buffer per process: failures are rare and the line is best effort).
static REASON: [std::sync::atomic::AtomicU8; 128] =
    [const { std::sync::atomic::AtomicU8::new(0) }; 128];

/// Records why the next `WAKE_FAIL` happens.
pub fn set_reason(why: &str) {
    let b = why.as_bytes();
    for (i, r) in REASON.iter().enumerate() {
        r.store(
            if i < b.len() && i < 127 { b[i] } else { 0 },
            Ordering::Release,
        );
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

/// Which fault path a site uses. Every default is written here: `Auto`
/// takes userfaultfd when the kernel offers it (full, else user-mode-only)
/// and falls back to mprotect + SIGSEGV. `MMULAB_DSM_FAULT_PATH`
/// (`mprotect`, `uffd`, `uffd-user`) overrides `Auto`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FaultPath {
    #[default]
    Auto,
    Mprotect,
    Uffd,
    UffdUserModeOnly,
}

/// What the kernel offers, probed at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub uffd: bool,
    pub uffd_user_mode_only: bool,
    /// The path this runtime uses.
    pub path: &'static str,
}

pub const PATH_MPROTECT: &str = "mprotect+SIGSEGV";
pub const PATH_UFFD: &str = "userfaultfd (missing + write-protect)";
pub const PATH_UFFD_USER: &str = "userfaultfd user-mode-only (missing + write-protect)";

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

/// Opens the userfaultfd the path wants, if any: `None` means mprotect.
pub fn open_path(choice: FaultPath) -> Option<super::uffd::Uffd> {
    use super::uffd::{Uffd, works};
    let choice = match (choice, std::env::var("MMULAB_DSM_FAULT_PATH").as_deref()) {
        (FaultPath::Auto, Ok("mprotect")) => FaultPath::Mprotect,
        (FaultPath::Auto, Ok("uffd")) => FaultPath::Uffd,
        (FaultPath::Auto, Ok("uffd-user")) => FaultPath::UffdUserModeOnly,
        (c, _) => c,
    };
    let full = || Uffd::open(false).ok().filter(works);
    let user = || Uffd::open(true).ok().filter(works);
    match choice {
        FaultPath::Mprotect => None,
        FaultPath::Uffd => full(),
        FaultPath::UffdUserModeOnly => user(),
        FaultPath::Auto => full().or_else(user),
    }
}

/// Probes the kernel and names the path `choice` leads to.
pub fn probe_for(choice: FaultPath) -> Probe {
    let path = match open_path(choice) {
        None => PATH_MPROTECT,
        Some(u) if u.user_mode_only => PATH_UFFD_USER,
        Some(_) => PATH_UFFD,
    };
    Probe {
        uffd: super::uffd::Uffd::open(false).is_ok(),
        uffd_user_mode_only: super::uffd::Uffd::open(true).is_ok(),
        path,
    }
}

/// The probe for the default path.
pub fn probe() -> Probe {
    probe_for(FaultPath::Auto)
}
