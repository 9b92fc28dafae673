//! What a simulated thread runs: a program hands the CPU one operation at
//! a time; batches of references run on the hot path.

use mmulab_engine::{Cycles, SimRng};
use mmulab_machine::CpuId;

use crate::vm::ThreadId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefKind {
    Load,
    Store(u64),
    /// Load, add one, store (a counter increment).
    Increment,
}

/// `count` references, `stride` bytes apart, the first at `base + start`;
/// with `wrap > 0` the offset wraps within `base .. base + wrap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refs {
    pub base: u64,
    pub start: u64,
    pub stride: u64,
    pub count: u64,
    pub wrap: u64,
    pub kind: RefKind,
}

impl Refs {
    pub fn one(va: u64, kind: RefKind) -> Refs {
        Refs {
            base: va,
            start: 0,
            stride: 0,
            count: 1,
            wrap: 0,
            kind,
        }
    }
    pub fn va(&self, i: u64) -> u64 {
        let off = self.start.wrapping_add(i.wrapping_mul(self.stride));
        if self.wrap > 0 {
            self.base + off % self.wrap
        } else {
            self.base + off
        }
    }
}

/// A batch of references under way: `pos` references done, the next at
/// `va`. The address is kept rather than recomputed from `pos` so that
/// resuming a batch, once per slice, costs no division.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    pub refs: Refs,
    pub pos: u64,
    pub va: u64,
}

impl Batch {
    pub fn new(refs: Refs) -> Batch {
        Batch {
            refs,
            pos: 0,
            va: refs.va(0),
        }
    }

    /// Steps to the next reference; false when the batch is done.
    #[inline]
    pub fn advance(&mut self) -> bool {
        let r = &self.refs;
        self.pos += 1;
        if r.wrap == 0 || r.stride < r.wrap {
            // incremental: at most one wrap per step
            self.va = self.va.wrapping_add(r.stride);
            if r.wrap > 0 && self.va >= r.base + r.wrap {
                self.va -= r.wrap;
            }
        } else {
            self.va = r.va(self.pos);
        }
        debug_assert_eq!(self.va, r.va(self.pos));
        self.pos < r.count
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prot {
    None,
    Read,
    ReadWrite,
}

pub enum Syscall {
    /// Map `pages` of zero-filled anonymous memory; returns the address.
    Mmap {
        pages: u64,
        prot: Prot,
    },
    Munmap {
        va: u64,
        pages: u64,
    },
    Mprotect {
        va: u64,
        pages: u64,
        prot: Prot,
    },
    /// A new task with a copy-on-write copy of this one's memory, running
    /// `child`. Returns the child's task id.
    Fork {
        child: Box<dyn Program>,
    },
    /// A new thread in this task, optionally bound to a CPU.
    ThreadCreate {
        program: Box<dyn Program>,
        cpu: Option<CpuId>,
    },
    /// Move to another CPU (or any, when None): the thread is rescheduled.
    Migrate {
        cpu: Option<CpuId>,
    },
    /// Allocate kernel memory; returns its kernel address. Wired memory is
    /// mapped in the kernel pmap at once; pageable memory is mapped lazily
    /// on first touch (so a free of untouched pages needs no shootdown
    /// under lazy evaluation). Threads may reference it directly, as kernel
    /// code on their behalf would.
    KmemAlloc {
        pages: u64,
        wired: bool,
    },
    /// Free kernel memory: a kernel-pmap shootdown, then the frames are
    /// reused.
    KmemFree {
        va: u64,
        pages: u64,
    },
    /// A kernel-level measurement call (balan92 §Shutdown Measurements):
    /// `hat_shutdown(HAT_NOCOOKIE)` when `nocookie`, else
    /// `hat_shutdown(hat_getshootcookie())`, a cookie at least as new as
    /// every CPU's.
    HatShutdown {
        nocookie: bool,
    },
    /// Take the CPU this thread runs on offline (the thread moves to
    /// another CPU). Returns the CPU's number, or `u64::MAX` when it is the
    /// last online CPU (refused).
    CpuOffline,
    /// Bring an offline CPU back online. Returns 0, or `u64::MAX` when it
    /// was not offline.
    CpuOnline {
        cpu: CpuId,
    },
    /// balan92 segmap (file read/write mappings): see `segmap`.
    Segmap(crate::segmap::SegmapCall),
    /// balan92 §Pageout (the pageout daemon's aging): see `pageout`.
    Pageout(crate::pageout::PageoutCall),
}

pub enum Op {
    Refs(Refs),
    /// Burn cycles in user mode.
    Compute(u64),
    Syscall(Syscall),
    /// Block for a while (the CPU may go idle).
    Sleep(u64),
    Exit,
}

/// What the program sees of the last operation.
pub struct ThreadCtx<'a> {
    pub thread: ThreadId,
    pub cpu: CpuId,
    pub now: Cycles,
    /// The value of the last load (or increment's load).
    pub last_load: u64,
    /// The return value of the last system call.
    pub ret: u64,
    /// Set when the last reference took an unrecoverable fault (SIGSEGV)
    /// at this address; the rest of its batch was dropped.
    pub fault: Option<u64>,
    pub rng: &'a mut SimRng,
    /// Set by a program to end the whole run after this operation.
    pub end_run: bool,
}

pub trait Program {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op;

    /// True when this program's `Compute` operations run in one stretch
    /// rather than quantum by quantum: the CPU runs ahead to the end of
    /// the computation in one slice, and an interrupt that arrives before
    /// then is taken at its arrival (the computation's rest resumes after
    /// it). Long computations then cost one event instead of one per
    /// quantum, and their interrupts no latency from slicing. A
    /// computation touches no memory, so running ahead changes nothing
    /// else. Default: false (the quantum slices every computation).
    fn long_computes(&self) -> bool {
        false
    }
}

/// A program from a closure, for tests and small workloads.
pub struct FnProgram<F>(pub F);
impl<F: FnMut(&mut ThreadCtx<'_>) -> Op> Program for FnProgram<F> {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        (self.0)(ctx)
    }
}
