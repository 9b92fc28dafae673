//! Per-CPU state: its TLBs, interrupt priority level and pending interrupts.

use mmulab_engine::{Cycles, SimRng};
use mmulab_machine::{Asid, CpuId, Tlb, Vpn};

use crate::pmap::PmapId;
use crate::vm::ThreadId;

/// Interrupt priority levels. An interrupt of level L is taken only at a
/// point where the CPU's level is below L. The cross-processor level sits
/// above `HIGH` (splhi), as balan92 puts its shootdown interrupt and
/// black89 §9 asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ipl(pub u8);

impl Ipl {
    /// Everything enabled (user mode, ordinary kernel code).
    pub const NONE: Ipl = Ipl(0);
    /// Device interrupts masked.
    pub const DEVICE: Ipl = Ipl(1);
    /// splhi: every device interrupt masked.
    pub const HIGH: Ipl = Ipl(2);
    /// Everything masked, cross-processor interrupts included.
    pub const ALL: Ipl = Ipl(3);
}

/// Interrupt sources (bits of `Cpu::pending`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Irq {
    /// The protocol's consistency interrupt (shootdown).
    Shootdown = 0,
    /// Wake an idle CPU to run a thread.
    Reschedule = 1,
    /// The clock tick (`kernel.disabled_windows`) arriving while the CPU
    /// runs kernel code (an idle CPU's tick is not simulated); its
    /// handler's length is `Cpu::clock_len`.
    /// (A tick in user mode enters the kernel directly, `Entry::
    /// DisabledWindow`.)
    Clock = 2,
}

impl Irq {
    pub fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Running a thread's user code on the hot path.
    User,
    /// Running a kernel coroutine (system call, fault, interrupt, idle).
    Kernel,
    /// Not executing (offline).
    Offline,
}

pub struct Cpu {
    pub id: CpuId,
    pub mode: Mode,
    pub online: bool,
    /// The D-TLB (the only TLB on flat memory).
    pub tlb: Tlb,
    /// The I-TLB (romanescu10 Table 1), present when the memory system
    /// declares one (`tlbs_per_core = 2`): user threads fetch their code
    /// through it (see `Sim::fetch_instruction`).
    pub itlb: Option<Tlb>,
    /// Negative control (tests only): software flushes and invalidations
    /// miss the I-TLB, as if the kernel forgot it; the oracle must catch
    /// the stale fetches that follow.
    pub control_itlb_unflushed: bool,
    pub ipl: Ipl,
    pub pending: u32,
    /// The handler length of the clock tick on its way or pending (0:
    /// none).
    pub clock_len: u64,
    /// The level each pending interrupt arrives at.
    pub shootdown_level: Ipl,
    /// The thread on this CPU (None when idle).
    pub thread: Option<ThreadId>,
    /// The user pmap whose tables the MMU walks (the loaded CR3).
    pub pmap: Option<PmapId>,
    /// Local time of the user-mode hot path (may run ahead of the queue by
    /// at most the quantum).
    pub local: Cycles,
    pub resume_gen: u64,
    pub slice_gen: u64,
    /// True while the idle loop waits: an interrupt cuts the wait short.
    pub idle_waiting: bool,
    /// True while in the idle loop (black89's idle set is kept by the
    /// protocol; this is the kernel's own view).
    pub idle: bool,
    /// True while the thread on this CPU is blocked on a sleep lock: in
    /// Linux the CPU then runs the idle task in lazy TLB mode.
    pub lock_sleeping: bool,
    /// The user pmap this CPU left while its thread slept (Linux's
    /// `leave_mm` in lazy TLB mode): loaded again when the thread is
    /// switched back in.
    pub lazy_left: Option<PmapId>,
    /// The operation this CPU's kernel code is carrying out, to which PTE
    /// changes are attributed.
    pub op: Option<mmulab_machine::OpId>,
    /// The kernel path the CPU's thread is in ("fault", "fork", "exit",
    /// "syscall"), set around each trap: lock acquisitions on it are also
    /// counted per path (`lock.<class>.<path>.*`, balan92 §Analysis).
    pub lock_path: Option<&'static str>,
    /// Time the current kernel-disabled window ends (for statistics).
    pub rng: SimRng,
    /// Last time a user slice started (interrupt latency accounting).
    pub slice_start: Cycles,
    /// A user access whose miss outlived its slice (romanescu10 §5.1).
    pub inflight: Option<InFlight>,
    /// The next access is the replay of a killed one.
    pub replaying: bool,
    /// Back in user mode: the thread's next slice fetches its code first.
    pub fetch_due: bool,
}

/// A user access looked up and sent to the memory system in one slice,
/// performing at the start of the next one (or before an interrupt is
/// taken: interrupts are precise). Between the two, other CPUs' events
/// run; under UNITD one of their PTE stores may invalidate the TLB entry
/// the access was translated by, and then the access replays its lookup
/// (§5.1) instead of performing.
#[derive(Clone, Copy, Debug)]
pub struct InFlight {
    /// The D-TLB slot of the translation.
    pub slot: usize,
    /// What the access needs of that entry as it was used: its frame, and
    /// what the oracle checks again when the access performs (the whole
    /// entry is not copied: this is written once per simulated miss).
    pub pfn: mmulab_machine::Pfn,
    pub oracle_slot: u32,
    pub fill_epoch: u32,
    pub dirty: bool,
    pub va: u64,
    /// Set when a PCAM hit invalidated `slot` while the access was in
    /// flight.
    pub killed: bool,
}

impl Cpu {
    pub fn new(id: CpuId, tlb: Tlb, itlb: Option<Tlb>, rng: SimRng) -> Cpu {
        Cpu {
            id,
            mode: Mode::Kernel,
            online: true,
            tlb,
            itlb,
            control_itlb_unflushed: false,
            ipl: Ipl::NONE,
            pending: 0,
            clock_len: 0,
            shootdown_level: Ipl::ALL,
            thread: None,
            pmap: None,
            local: Cycles::ZERO,
            resume_gen: 0,
            slice_gen: 0,
            idle_waiting: false,
            idle: false,
            lock_sleeping: false,
            lazy_left: None,
            op: None,
            lock_path: None,
            rng,
            slice_start: Cycles::ZERO,
            inflight: None,
            replaying: false,
            fetch_due: false,
        }
    }

    /// The level an interrupt arrives at.
    pub fn level_of(&self, irq: Irq) -> Ipl {
        match irq {
            Irq::Shootdown => self.shootdown_level,
            Irq::Reschedule => Ipl::DEVICE,
            // A device interrupt: splhigh (`Ipl::HIGH`) masks it.
            Irq::Clock => Ipl::HIGH,
        }
    }

    /// The highest-priority pending interrupt that the current level lets
    /// through.
    pub fn takeable(&self) -> Option<Irq> {
        [Irq::Shootdown, Irq::Reschedule, Irq::Clock]
            .into_iter()
            .find(|&irq| self.pending & irq.bit() != 0 && self.level_of(irq) > self.ipl)
    }

    // Every software flush reaches both TLBs: x86's CR3 load and invlpg
    // invalidate the I-TLB and the D-TLB alike, so the kernel never names
    // one of them. The returned counts are the D-TLB's (what callers
    // counted before the I-TLB existed).

    /// Invalidates every entry of both TLBs.
    pub fn flush_tlbs(&mut self) -> usize {
        if !self.control_itlb_unflushed
            && let Some(i) = &mut self.itlb
        {
            i.flush_all();
        }
        self.tlb.flush_all()
    }

    /// Invalidates the non-global entries of both TLBs (a CR3 load).
    pub fn flush_tlbs_non_global(&mut self) -> usize {
        if !self.control_itlb_unflushed
            && let Some(i) = &mut self.itlb
        {
            i.flush_non_global();
        }
        self.tlb.flush_non_global()
    }

    /// Invalidates one page in both TLBs (invlpg; all ASIDs when None).
    pub fn invalidate_page_tlbs(&mut self, vpn: Vpn, asid: Option<Asid>) -> usize {
        if !self.control_itlb_unflushed
            && let Some(i) = &mut self.itlb
        {
            i.invalidate_page(vpn, asid);
        }
        self.tlb.invalidate_page(vpn, asid)
    }

    /// Invalidates one ASID's non-global entries in both TLBs.
    pub fn flush_tlbs_asid(&mut self, asid: Asid) -> usize {
        if !self.control_itlb_unflushed
            && let Some(i) = &mut self.itlb
        {
            i.flush_asid(asid);
        }
        self.tlb.flush_asid(asid)
    }
}
