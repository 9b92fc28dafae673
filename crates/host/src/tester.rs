//! black89 §5.1 on real threads (Linux only).
//!
//! The shape of one repetition, as in the paper:
//!
//! 1. The page(s) of counters are mapped read-write; the initiator touches
//!    every page so that each has a present PTE.
//! 2. The initiator publishes a round number; every responder — one thread
//!    pinned to its own core, incrementing its own counter in a tight loop,
//!    never sleeping — stores the round with its count and acknowledges.
//!    After every acknowledgement, each responder's TLB holds a writable
//!    entry for the page and its CPU is running this address space.
//! 3. The initiator (pinned to its own core) times the operation alone
//!    (`Instant`, i.e. `clock_gettime(CLOCK_MONOTONIC)`), bracketed by reads
//!    of /proc/interrupts.
//! 4. It checks that no stale entry was used after the call returned
//!    (`crate::check`), then restores the mapping (re-arm) for the next round.
//!
//! A sleeping responder would prove nothing: Linux sends no IPI to a CPU
//! that is idle or runs another address space (it is lazy, or not in the
//! mm's CPU mask) and flushes it when it switches back. So responders spin,
//! and the initiator waits for them by spinning, with bounds.
//!
//! Faults. After `mprotect(PROT_READ)` or `munmap` a responder's next store
//! faults. A process-wide SIGSEGV handler (installed once, chaining to the
//! previous handler for every other fault, e.g. std's stack-overflow guard)
//! recognises a responder's fault on the tester's pages, counts it, and
//! parks the thread in the handler — spinning, so the core stays busy —
//! until the initiator has restored access; returning then re-executes the
//! store, which now succeeds. No `siglongjmp`, no unwinding through a
//! signal frame. Should restoring fail (munmap: something else was mapped
//! into the hole), the parked responders are abandoned: they sleep in
//! `pause()` until the process exits, and their memory is leaked rather
//! than freed under them.
//!
//! Page accesses go through raw pointers with volatile loads and stores:
//! the test unmaps the memory under the threads' feet, so no Rust reference
//! to it may exist (aligned 8-byte accesses are single instructions on every
//! architecture Linux runs this on).

use crate::check::{self, tag};
use crate::error::HostError;
use crate::interrupts::{TlbCounts, read_tlb_counts};
use crate::options::{Hooks, Op};
use crate::report::RepOutcome;
use nix::libc;
use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu, sched_setaffinity};
use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags};
use nix::unistd::Pid;
use std::cell::Cell;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The CPUs this process may run on, ascending (sched_getaffinity).
pub fn usable_cpus() -> Result<Vec<usize>, HostError> {
    let set =
        sched_getaffinity(Pid::from_raw(0)).map_err(|e| HostError::sys("sched_getaffinity", e))?;
    Ok((0..CpuSet::count())
        .filter(|c| set.is_set(*c).unwrap_or(false))
        .collect())
}

fn pin_current_thread(cpu: usize) -> Result<(), String> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| e.to_string())?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| e.to_string())?;
    match sched_getcpu() {
        Ok(c) if c == cpu => Ok(()),
        Ok(c) => Err(format!("pinned, but running on CPU {c}")),
        Err(e) => Err(format!("sched_getcpu: {e}")),
    }
}

/// The round value that tells responders to leave their loop.
const STOP: u64 = u64::MAX;
const READY_PENDING: u64 = 0;
const READY_OK: u64 = 1;
const READY_FAILED: u64 = 2;

/// A responder's control words, one cache line each so that the initiator's
/// polling does not slow the others.
#[repr(C, align(64))]
#[derive(Default)]
struct ResponderControl {
    ready: AtomicU64,
    /// The last round this responder stored into its counter.
    ack: AtomicU64,
    /// Faults taken on the tester's pages (counted by the handler).
    faults: AtomicU64,
}

/// Shared between the initiator, the responders and the signal handler. It
/// lives in ordinary heap memory that no operation ever touches.
struct Control {
    round: AtomicU64,
    /// 0 while the pages are (being made) inaccessible: a faulting
    /// responder parks until this is 1 again.
    accessible: AtomicU64,
    /// 1 when the pages could not be restored: parked responders sleep.
    abandon: AtomicU64,
    region_start: usize,
    region_end: usize,
    responders: Box<[ResponderControl]>,
}

thread_local! {
    /// The control block and index of a responder thread; null elsewhere.
    /// Const-initialised and without a destructor, so reading it in the
    /// signal handler allocates nothing.
    static RESPONDER: Cell<(*const Control, usize)> = const { Cell::new((std::ptr::null(), 0)) };
}

static OLD_SEGV: OnceLock<libc::sigaction> = OnceLock::new();

/// Serialises testers in one process: there is one handler, one set of
/// cores, and two runs at once would shoot at each other.
static TESTER_LOCK: Mutex<()> = Mutex::new(());

extern "C" fn on_sigsegv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY (whole function): only atomics, a const thread-local and
    // async-signal-safe calls (pause, signal) are used. The control block
    // outlives every responder thread (each holds an Arc to it).
    let (ctl, index) = RESPONDER
        .try_with(|r| r.get())
        .unwrap_or((std::ptr::null(), 0));
    if !ctl.is_null() {
        let ctl = unsafe { &*ctl };
        let addr = unsafe { (*info).si_addr() } as usize;
        if (ctl.region_start..ctl.region_end).contains(&addr) {
            let me = &ctl.responders[index];
            me.faults.fetch_add(1, Ordering::AcqRel);
            loop {
                if ctl.abandon.load(Ordering::Acquire) == 1 {
                    loop {
                        unsafe { libc::pause() };
                    }
                }
                if ctl.accessible.load(Ordering::Acquire) == 1 {
                    // Returning re-executes the faulting store.
                    return;
                }
                std::hint::spin_loop();
            }
        }
    }
    chain(sig, info, ctx);
}

fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    match OLD_SEGV.get() {
        Some(old) if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN => {
            // SAFETY: the previous handler was installed with these
            // signatures (SA_SIGINFO says which).
            unsafe {
                if old.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(old.sa_sigaction);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(old.sa_sigaction);
                    f(sig);
                }
            }
        }
        _ => {
            // Not ours: restore the default action; the fault repeats on
            // return and kills the process as it would have without us.
            unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
        }
    }
}

fn install_handler() -> Result<(), HostError> {
    if OLD_SEGV.get().is_some() {
        return Ok(());
    }
    // SAFETY: plain sigaction calls with zero-initialised C structs.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGSEGV, std::ptr::null(), &mut old) != 0 {
            return Err(HostError::sys("sigaction", std::io::Error::last_os_error()));
        }
        let _ = OLD_SEGV.set(old);
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = on_sigsegv as *const () as usize;
        // SA_ONSTACK: std's stack-overflow handler, which we chain to, needs
        // the alternate stack it set up.
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut new.sa_mask);
        if libc::sigaction(libc::SIGSEGV, &new, std::ptr::null_mut()) != 0 {
            return Err(HostError::sys("sigaction", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// The memory the operation acts on.
struct Region {
    op: Op,
    page_bytes: usize,
    pages: usize,
    /// The mapping the operation acts on and the responders write.
    tester: NonNull<libc::c_void>,
    /// Where the initiator reads the counters: for munmap, a second mapping
    /// of the same shared-memory frames; otherwise `tester` itself.
    observer: NonNull<libc::c_void>,
    memfd: Option<OwnedFd>,
}

impl Region {
    fn len(&self) -> usize {
        self.page_bytes * self.pages
    }

    fn new(op: Op, pages: usize) -> Result<Region, HostError> {
        // SAFETY: sysconf has no preconditions.
        let page_bytes = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            p if p > 0 => p as usize,
            _ => 4096,
        };
        let len = NonZeroUsize::new(page_bytes * pages).expect("pages >= 1");
        let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        // SAFETY: fresh mappings chosen by the kernel; nothing else refers
        // to them.
        unsafe {
            match op {
                Op::Mprotect | Op::MadviseDontneed => {
                    let p = nix::sys::mman::mmap_anonymous(None, len, rw, MapFlags::MAP_PRIVATE)
                        .map_err(|e| HostError::sys("mmap", e))?;
                    Ok(Region {
                        op,
                        page_bytes,
                        pages,
                        tester: p,
                        observer: p,
                        memfd: None,
                    })
                }
                Op::Munmap => {
                    let fd = nix::sys::memfd::memfd_create(
                        c"mmulab-host",
                        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
                    )
                    .map_err(|e| HostError::sys("memfd_create", e))?;
                    nix::unistd::ftruncate(&fd, len.get() as i64)
                        .map_err(|e| HostError::sys("ftruncate", e))?;
                    let tester = nix::sys::mman::mmap(None, len, rw, MapFlags::MAP_SHARED, &fd, 0)
                        .map_err(|e| HostError::sys("mmap", e))?;
                    let observer =
                        nix::sys::mman::mmap(None, len, rw, MapFlags::MAP_SHARED, &fd, 0)
                            .map_err(|e| HostError::sys("mmap", e))?;
                    Ok(Region {
                        op,
                        page_bytes,
                        pages,
                        tester,
                        observer,
                        memfd: Some(fd),
                    })
                }
            }
        }
    }

    fn word(&self, base: NonNull<libc::c_void>, page: usize, word: usize) -> *mut u64 {
        debug_assert!(page < self.pages && word < self.page_bytes / 8);
        unsafe {
            base.as_ptr()
                .cast::<u8>()
                .add(page * self.page_bytes + word * 8)
                .cast()
        }
    }

    /// The operation under test.
    fn operate(&self) -> Result<(), HostError> {
        let len = self.len();
        // SAFETY: the region is ours; responders that touch it afterwards
        // fault and are parked by the handler.
        unsafe {
            match self.op {
                Op::Mprotect => nix::sys::mman::mprotect(self.tester, len, ProtFlags::PROT_READ)
                    .map_err(|e| HostError::sys("mprotect", e)),
                Op::Munmap => nix::sys::mman::munmap(self.tester, len)
                    .map_err(|e| HostError::sys("munmap", e)),
                Op::MadviseDontneed => {
                    nix::sys::mman::madvise(self.tester, len, MmapAdvise::MADV_DONTNEED)
                        .map_err(|e| HostError::sys("madvise", e))
                }
            }
        }
    }

    /// Restores read-write access at the same address.
    fn rearm(&self) -> Result<(), HostError> {
        let len = self.len();
        let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        let fail = |why: String| HostError::Rearm {
            op: self.op.name(),
            why,
        };
        // SAFETY: as for `operate`; MAP_FIXED_NOREPLACE never replaces a
        // mapping someone else made in the hole.
        unsafe {
            match self.op {
                Op::Mprotect => {
                    nix::sys::mman::mprotect(self.tester, len, rw).map_err(|e| fail(e.to_string()))
                }
                Op::Munmap => {
                    let fd = self.memfd.as_ref().expect("munmap region has a memfd");
                    let at = NonZeroUsize::new(self.tester.as_ptr() as usize);
                    let p = nix::sys::mman::mmap(
                        at,
                        NonZeroUsize::new(len).expect("len > 0"),
                        rw,
                        MapFlags::MAP_SHARED | MapFlags::MAP_FIXED_NOREPLACE,
                        fd,
                        0,
                    )
                    .map_err(|e| fail(format!("mmap(MAP_FIXED_NOREPLACE): {e}")))?;
                    if p != self.tester {
                        // A kernel older than 4.17 takes the address as a hint.
                        let _ = nix::sys::mman::munmap(p, len);
                        return Err(fail(
                            "the kernel mapped elsewhere (Linux older than 4.17?)".into(),
                        ));
                    }
                    Ok(())
                }
                Op::MadviseDontneed => Ok(()),
            }
        }
    }

    /// Gives the memory back. Only once no responder can touch it.
    fn release(&self) {
        // SAFETY: every responder has been joined (see `Tester::drop`).
        unsafe {
            let _ = nix::sys::mman::munmap(self.tester, self.len());
            if self.observer != self.tester {
                let _ = nix::sys::mman::munmap(self.observer, self.len());
            }
        }
    }
}

/// Counters: responder `i` writes word `i · stride` of page 0, one cache
/// line apart while they fit; the last word of every page is the
/// initiator's canary.
fn counter_stride_words(responders: usize, page_words: usize) -> Option<usize> {
    if responders * 8 < page_words {
        Some(8)
    } else if responders < page_words {
        Some(1)
    } else {
        None
    }
}

/// Tester settings; see `ShootdownOptions` for the meaning and defaults.
#[derive(Clone, Debug)]
pub struct TesterConfig {
    pub op: Op,
    pub pages: usize,
    /// The initiator's CPU first, then one CPU per responder.
    pub cpus: Vec<usize>,
    pub ack_timeout: Duration,
    pub fault_timeout: Duration,
    pub hooks: Hooks,
    /// Read /proc/interrupts around each operation.
    pub count_tlb_interrupts: bool,
}

/// One point of the tester: an initiator (the calling thread, pinned while
/// the tester lives) and its responders, ready to run repetitions.
pub struct Tester {
    cfg: TesterConfig,
    ctl: Arc<Control>,
    region: Region,
    stride: usize,
    children: Vec<std::thread::JoinHandle<()>>,
    next_round: u64,
    abandoned: bool,
    saved_affinity: Option<CpuSet>,
    _lock: MutexGuard<'static, ()>,
}

impl Tester {
    pub fn new(cfg: TesterConfig) -> Result<Tester, HostError> {
        assert!(!cfg.cpus.is_empty(), "the initiator needs a CPU");
        let lock = TESTER_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        install_handler()?;
        let responders = cfg.cpus.len() - 1;
        let region = Region::new(cfg.op, cfg.pages)?;
        let page_words = region.page_bytes / 8;
        let Some(stride) = counter_stride_words(responders, page_words - 1) else {
            region.release();
            return Err(HostError::InvalidOptions(format!(
                "{responders} responders do not fit one counter each in a {}-byte page",
                region.page_bytes
            )));
        };
        let start = region.tester.as_ptr() as usize;
        let ctl = Arc::new(Control {
            round: AtomicU64::new(0),
            accessible: AtomicU64::new(1),
            abandon: AtomicU64::new(0),
            region_start: start,
            region_end: start + region.len(),
            responders: (0..responders)
                .map(|_| ResponderControl::default())
                .collect(),
        });
        let saved_affinity = sched_getaffinity(Pid::from_raw(0)).ok();
        let mut t = Tester {
            cfg,
            ctl,
            region,
            stride,
            children: Vec::new(),
            next_round: 1,
            abandoned: false,
            saved_affinity,
            _lock: lock,
        };
        // Responders are spawned before the initiator pins itself: a new
        // thread inherits its parent's affinity, and a responder confined to
        // the initiator's core could not run (to move itself) while the
        // initiator spins there — for ever under SCHED_FIFO.
        for i in 0..responders {
            let ctl = Arc::clone(&t.ctl);
            let cpu = t.cfg.cpus[i + 1];
            let slot = t.region.word(t.region.tester, 0, i * stride) as usize;
            let h = std::thread::Builder::new()
                .name(format!("mmulab-responder-{i}"))
                .spawn(move || responder_main(ctl, i, cpu, slot as *mut u64))
                .map_err(|e| HostError::sys("spawn", e))?;
            t.children.push(h);
        }
        let deadline = Instant::now() + t.cfg.ack_timeout;
        for (i, r) in t.ctl.responders.iter().enumerate() {
            loop {
                match r.ready.load(Ordering::Acquire) {
                    READY_OK => break,
                    READY_FAILED => {
                        return Err(HostError::Pin {
                            child: i,
                            cpu: t.cfg.cpus[i + 1],
                            why: "sched_setaffinity refused or the thread runs elsewhere".into(),
                        });
                    }
                    _ if Instant::now() > deadline => {
                        return Err(HostError::ResponderStalled {
                            child: i,
                            cpu: t.cfg.cpus[i + 1],
                            what: "start",
                            waited: t.cfg.ack_timeout,
                        });
                    }
                    // Starting is not timed: yield, so that a responder that
                    // still shares this core gets it.
                    _ => std::thread::yield_now(),
                }
            }
        }
        let initiator_cpu = t.cfg.cpus[0];
        pin_current_thread(initiator_cpu).map_err(|why| HostError::Pin {
            child: usize::MAX,
            cpu: initiator_cpu,
            why,
        })?;
        Ok(t)
    }

    pub fn responders(&self) -> usize {
        self.ctl.responders.len()
    }

    fn read_page(&self, base: NonNull<libc::c_void>, page: usize, word: usize) -> u64 {
        // SAFETY: in-bounds, aligned, and mapped whenever it is read here.
        unsafe { std::ptr::read_volatile(self.region.word(base, page, word)) }
    }

    fn write_page(&self, base: NonNull<libc::c_void>, page: usize, word: usize, v: u64) {
        // SAFETY: as `read_page`; the page is writable when this is called.
        unsafe { std::ptr::write_volatile(self.region.word(base, page, word), v) }
    }

    fn counters(&self, base: NonNull<libc::c_void>) -> Vec<u64> {
        (0..self.responders())
            .map(|i| self.read_page(base, 0, i * self.stride))
            .collect()
    }

    fn canary_word(&self) -> usize {
        self.region.page_bytes / 8 - 1
    }

    /// Publishes `round` and spins until every responder has stored it.
    fn publish_and_wait(&self, round: u64) -> Result<(), HostError> {
        self.ctl.round.store(round, Ordering::Release);
        let deadline = Instant::now() + self.cfg.ack_timeout;
        for (i, r) in self.ctl.responders.iter().enumerate() {
            while r.ack.load(Ordering::Acquire) != round {
                if Instant::now() > deadline {
                    return Err(HostError::ResponderStalled {
                        child: i,
                        cpu: self.cfg.cpus[i + 1],
                        what: "acknowledge a new round",
                        waited: self.cfg.ack_timeout,
                    });
                }
                std::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// One repetition: arm, time the operation, check, re-arm.
    pub fn rep(&mut self) -> Result<RepOutcome, HostError> {
        assert!(
            !self.abandoned,
            "a tester whose responders were abandoned cannot run again"
        );
        let round = self.next_round;
        self.next_round += 1;
        let canary = self.canary_word();
        for p in 0..self.region.pages {
            self.write_page(self.region.tester, p, canary, 0xC0FF_EE00_0000_0000 | round);
        }
        self.publish_and_wait(round)?;
        let faults_before: Vec<u64> = self
            .ctl
            .responders
            .iter()
            .map(|r| r.faults.load(Ordering::Acquire))
            .collect();
        let faulting = matches!(self.cfg.op, Op::Mprotect | Op::Munmap);
        let skip = self.cfg.hooks.skip_operation;

        let tlb_before = self.tlb();
        if faulting {
            self.ctl.accessible.store(0, Ordering::Release);
        }
        let t0 = Instant::now();
        let op_result = if skip { Ok(()) } else { self.region.operate() };
        let latency = t0.elapsed();
        let after_op = faulting.then(|| self.counters(self.region.observer));
        let tlb_after = self.tlb();
        if let Err(e) = op_result {
            self.ctl.accessible.store(1, Ordering::Release);
            return Err(e);
        }
        let tlb = match (tlb_before, tlb_after) {
            (Some(b), Some(a)) => Some(a.since(&b)),
            _ => None,
        };

        let mut missed_faults = 0;
        let violation = if let Some(after_op) = after_op {
            // mprotect / munmap: wait for every responder's fault, then no
            // counter may have moved.
            let deadline = Instant::now() + self.cfg.fault_timeout;
            for (i, r) in self.ctl.responders.iter().enumerate() {
                while r.faults.load(Ordering::Acquire) == faults_before[i] {
                    if Instant::now() > deadline {
                        missed_faults += 1;
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            if self.cfg.hooks.write_after_operation && self.responders() > 0 {
                self.inject_store_after_operation(after_op[0])?;
            }
            let later = self.counters(self.region.observer);
            let v = check::check_frozen(&after_op, &later).err();
            if !skip && let Err(e) = self.region.rearm() {
                self.abandon();
                return Err(e);
            }
            self.ctl.accessible.store(1, Ordering::Release);
            v
        } else {
            // madvise: a new round after the call; every responder's store
            // of it must be visible in the (fresh) page the initiator sees.
            let probe = self.next_round;
            self.next_round += 1;
            self.publish_and_wait(probe)?;
            if self.cfg.hooks.write_after_operation && self.responders() > 0 {
                // As a store through a stale entry would leave it: the new
                // page does not hold responder 0's acknowledged store.
                self.write_page(self.region.tester, 0, 0, 0);
            }
            let slots = self.counters(self.region.tester);
            let canaries: Vec<u64> = (0..self.region.pages)
                .map(|p| self.read_page(self.region.tester, p, canary))
                .collect();
            check::check_fresh_page(&slots, probe, &canaries).err()
        };
        Ok(RepOutcome {
            latency,
            tlb,
            violation,
            missed_faults,
        })
    }

    /// The negative-control hook: a store into responder 0's counter after
    /// the operation returned, made while every responder is parked.
    fn inject_store_after_operation(&self, seen: u64) -> Result<(), HostError> {
        let bumped = seen.wrapping_add(1);
        match self.cfg.op {
            Op::Munmap => self.write_page(self.region.observer, 0, 0, bumped),
            _ => {
                // SAFETY: our own mapping; responders stay parked on
                // `accessible`, not on the page protection.
                unsafe {
                    let rw = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
                    if !self.cfg.hooks.skip_operation {
                        nix::sys::mman::mprotect(self.region.tester, self.region.len(), rw)
                            .map_err(|e| HostError::sys("mprotect", e))?;
                    }
                    self.write_page(self.region.tester, 0, 0, bumped);
                    if !self.cfg.hooks.skip_operation {
                        nix::sys::mman::mprotect(
                            self.region.tester,
                            self.region.len(),
                            ProtFlags::PROT_READ,
                        )
                        .map_err(|e| HostError::sys("mprotect", e))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The `TLB` line now; `None` when not counted or (rarely) unreadable,
    /// which costs this repetition its count rather than the run.
    fn tlb(&self) -> Option<TlbCounts> {
        if !self.cfg.count_tlb_interrupts {
            return None;
        }
        read_tlb_counts().ok().flatten()
    }

    fn abandon(&mut self) {
        self.abandoned = true;
        self.ctl.abandon.store(1, Ordering::Release);
        self.ctl.round.store(STOP, Ordering::Release);
    }
}

impl Drop for Tester {
    fn drop(&mut self) {
        if !self.abandoned {
            self.ctl.accessible.store(1, Ordering::Release);
            self.ctl.round.store(STOP, Ordering::Release);
            let deadline = Instant::now() + self.cfg.ack_timeout.max(Duration::from_secs(1));
            while self.children.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
                std::thread::yield_now();
            }
            if self.children.iter().all(|h| h.is_finished()) {
                for h in self.children.drain(..) {
                    let _ = h.join();
                }
            } else {
                self.abandon();
            }
        }
        if self.abandoned {
            // Responders may still be parked on these pages: leak them.
            self.children.clear();
        } else {
            self.region.release();
        }
        if let Some(set) = &self.saved_affinity {
            let _ = sched_setaffinity(Pid::from_raw(0), set);
        }
    }
}

fn responder_main(ctl: Arc<Control>, index: usize, cpu: usize, slot: *mut u64) {
    let me = &ctl.responders[index];
    debug_assert_eq!(me.ready.load(Ordering::Relaxed), READY_PENDING);
    if pin_current_thread(cpu).is_err() {
        me.ready.store(READY_FAILED, Ordering::Release);
        return;
    }
    RESPONDER.with(|r| r.set((Arc::as_ptr(&ctl), index)));
    me.ready.store(READY_OK, Ordering::Release);
    let mut count: u64 = 0;
    let mut acked = 0;
    // The tight loop of black89 §5.1: increment my own counter, forever,
    // never sleeping; a round change is only read, never waited for.
    loop {
        let round = ctl.round.load(Ordering::Acquire);
        if round == STOP {
            break;
        }
        count = count.wrapping_add(1);
        // SAFETY: `slot` is this responder's word in the tester mapping. If
        // the mapping is read-only or gone, the store faults and the handler
        // parks this thread until it is back; then the store re-executes.
        unsafe { std::ptr::write_volatile(slot, tag(round, count)) };
        if round != acked {
            me.ack.store(round, Ordering::Release);
            acked = round;
        }
    }
    RESPONDER.with(|r| r.set((std::ptr::null(), 0)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_spread_one_cache_line_apart_while_they_fit() {
        assert_eq!(counter_stride_words(1, 511), Some(8));
        assert_eq!(counter_stride_words(63, 511), Some(8));
        assert_eq!(counter_stride_words(64, 511), Some(1));
        assert_eq!(counter_stride_words(510, 511), Some(1));
        assert_eq!(counter_stride_words(511, 511), None);
    }
}
