//! The kernel layer of DESIGN.md.
//!
//! * [`sim`] — the simulated machine running: an event loop over the
//!   engine's queue, one coroutine per CPU in kernel mode (a tiny
//!   deterministic executor: a coroutine runs only when its CPU's `Resume`
//!   event fires), and the user-mode hot path, which executes a thread's
//!   references in a tight loop without touching the queue.
//! * [`cpu`] — per-CPU state: TLB, interrupt priority level, pending
//!   interrupts.
//! * [`pmap`] — the pmap/HAT interface ([`pmap::Protocol`]) and the
//!   page-table editing every protocol shares.
//! * [`vm`] — the machine-independent VM layer: tasks, regions, objects,
//!   faults, copy-on-write, fork, mmap/munmap/mprotect.
//! * [`sched`] — threads, the run queue, context switches, the idle loop.
//! * [`program`] — what a simulated thread runs.
//! * [`segkmem`] — balan92's kernel memory segment driver: a bitmap in
//!   zones, each with the cookie of its last free.
//! * [`segmap`] — balan92's transient file-mapping driver: 8 KB chunks
//!   kept mapped after release, aged without shootdown, shot at reuse.
//! * [`pageout`] — balan92 §Pageout: local working-set aging (seize, no
//!   shootdown) or SVR4's global daemon (a shootdown per clear).
//! * [`sleeplock`] — reader/writer sleep locks (a wait queue, no
//!   spinning) and the page layer's per-page spin and sleep locks.
//! * [`lockorder`] — balan92 §Locking Design: lock classes, the order
//!   checker (always on) and per-class contention counts.
//! * [`memory`] — the cache hierarchy (romanescu10) behind the walker and
//!   the hot path when a spec asks for one; flat memory otherwise.
//! * [`costs`] — every cost the model charges, in cycles (a preset's input).

pub mod costs;
pub mod cpu;
pub mod lockorder;
pub mod memory;
pub mod pageout;
pub mod pmap;
pub mod program;
pub mod sched;
pub mod segkmem;
pub mod segmap;
pub mod sim;
pub mod sleeplock;
pub mod vm;

pub use costs::Costs;
pub use cpu::{Ipl, Irq};
pub use pmap::{Change, Cookie, PmapId, Protocol, Update};
pub use program::{Op, Program, Prot, RefKind, Refs, Syscall, ThreadCtx};
pub use sim::{KFuture, KernelParams, Sim, SimConfig, SimResult, Watch};
pub use vm::{TaskId, ThreadId};
