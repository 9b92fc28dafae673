//! The running simulation: the world state and its configuration. The
//! event loop and executor live in `sim/executor.rs`, the kernel
//! primitives in `sim/primitives.rs`, the user-mode hot path in
//! `sim/user.rs`.
//!
//! Execution model. Each CPU is in user mode (its thread's references run
//! on the hot path in slices of at most `quantum_cycles`, without touching
//! the event queue per reference), or in kernel mode (one coroutine per
//! CPU, resumed only by that CPU's `Resume` event). Kernel code advances
//! time with `delay`; at the end of every delay it takes the interrupts its
//! priority level lets through, so an interrupt is only ever taken at an
//! enabled point. A CPU in user mode may run ahead of the global event
//! frontier by at most one quantum; an interrupt aimed at it is taken at
//! the end of its slice, so `quantum_cycles` bounds the extra interrupt
//! latency (presets that time shootdowns set it small).
//!
//! Determinism: events are ordered by (time, sequence); every random draw
//! comes from a named stream of the run seed; no hash map is iterated.

use std::cell::{RefCell, RefMut};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use mmulab_engine::{Counters, Cycles, EventQueue, Histogram, SimRng, SmallQueue};
use mmulab_machine::oracle::{OracleReport, UseCtx};
use mmulab_machine::pagetable::{Walk, walk};
use mmulab_memsys::AccessKind;

use crate::memory::TlbHardware;
use mmulab_machine::{
    CpuId, OpId, Oracle, Pfn, PhysMem, PtFormat, Pte, Tlb, TlbConfig, TlbEntry, Vpn,
};
use serde::{Deserialize, Serialize};

use crate::costs::Costs;
use crate::cpu::{Cpu, Ipl, Irq, Mode};
use crate::pmap::{CpuSet, KERNEL_PMAP, Pmap, PmapId, Protocol, rights_of};
use crate::program::{Op, RefKind};
use crate::vm::{Task, Thread, ThreadId, VmObject};

// The event loop and the coroutine executor; the kernel primitives
// coroutines call (delay, spin, locks, IPIs, operations); the user-mode
// hot path. Each is an `impl Sim` block (and free functions) of its own.
mod executor;
mod primitives;
mod user;

pub use user::Trap;
pub(crate) use user::retire_inflight;

/// A kernel coroutine.
pub type KFuture<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Virtual addresses at or above this are kernel addresses, translated
/// through the kernel pmap (global entries).
pub const KERNEL_BASE: u64 = 0xc000_0000;
pub const PAGE_SHIFT: u32 = 12;
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;

/// Interrupt-disabled kernel windows (black89 §8): every CPU running user
/// code enters the kernel at exponential intervals and keeps interrupts
/// masked for a duration drawn from an exponential distribution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisabledWindows {
    pub mean_interval_cycles: u64,
    pub mean_length_cycles: u64,
}

impl DisabledWindows {
    /// Both means must be at least a cycle and within the run's time limit:
    /// a window of `i64::MAX` cycles overflowed the draw and silently turned
    /// the feature off.
    pub fn validate(&self, prefix: &str, max_cycles: u64) -> Result<(), String> {
        for (key, v) in [
            ("mean_interval_cycles", self.mean_interval_cycles),
            ("mean_length_cycles", self.mean_length_cycles),
        ] {
            if v == 0 || v > max_cycles {
                return Err(format!(
                    "{prefix}.{key}: must be 1 to the run's time limit (engine.max_cycles = {max_cycles}), got {v}"
                ));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub cpus: usize,
    pub tlb: TlbConfig,
    pub pt_format: PtFormat,
    pub costs: Costs,
    /// Bound on how far a user-mode CPU runs ahead of the event frontier.
    pub quantum_cycles: u64,
    pub memory_frames: u64,
    pub seed: u64,
    /// Spin loops longer than this many iterations are liveness failures.
    pub spin_bound: u64,
    /// The run stops at this simulated time.
    pub max_cycles: u64,
    pub disabled_windows: Option<DisabledWindows>,
    /// Mean length (cycles, exponential) of the interrupt-disabled section
    /// in every system call and fault; 0 = none (black89 §8: "the kernel
    /// disables shootdown (and other) interrupts in many places").
    pub trap_disabled_mean_cycles: u64,
    /// Kernel parameters: the clock tick and the kernel segment drivers.
    pub kernel: KernelParams,
    /// The cache hierarchy behind the walker and the hot path
    /// (romanescu10 Table 1); None = flat memory.
    pub memory: Option<mmulab_memsys::MemConfig>,
}

/// Kernel parameters beyond timing (balan92's tunables).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelParams {
    /// Clock interrupts per second: `lbolt` (ticks since boot) is
    /// `now / (clock_hz / hz)`, derived rather than simulated, so that it
    /// costs no events and is deterministic.
    pub hz: u64,
    /// Pages of kernel virtual space managed by segkmem (balan92 §Lazy
    /// Shutdowns), used when the protocol has lazy kernel shootdowns.
    pub segkmem_pages: u64,
    /// Bytes of segkmem bitmap per zone (balan92: "the default value is 16
    /// bytes", i.e. 128 pages per zone).
    pub segkmem_zone_bytes: u64,
    /// Pages of kernel virtual space managed by segmap (balan92 §Lazy
    /// Shutdowns; see `segmap`).
    pub segmap_pages: u64,
    /// segmap chunk size in pages (balan92: 8 KB, 2 pages).
    pub segmap_chunk_pages: u64,
    /// segmap ablation: unload and shoot at every last release (no reuse).
    pub segmap_eager: bool,
    /// balan92 §Pageout: SVR4's global daemon instead of local aging.
    pub pageout_global: bool,
    /// segkmem allocates first fit instead of next fit (an ablation).
    pub segkmem_first_fit: bool,
    /// Linux's interrupt controller mode, chosen at boot (2.6.15
    /// `mach-generic`): a machine with at most this many CPUs runs the
    /// flat logical APIC mode, where one ICR write interrupts every target
    /// (`send_IPI_mask_bitmask`); a larger one runs bigsmp, one write per
    /// target (`send_IPI_mask_sequence`). 0: one write per target always.
    pub apic_flat_max_cpus: u64,
    /// The level the kernel's interrupt-disabled sections raise to (the
    /// section of every system call and fault, `trap_disabled_mean_cycles`,
    /// and the windows of `disabled_windows`): `Ipl::ALL` (the default)
    /// masks every interrupt; `Ipl::HIGH` masks every device interrupt and
    /// lets through a cross-processor interrupt above them (black89 §9:
    /// "A software interrupt with priority above that of device interrupts
    /// would allow us to disable device interrupts without blocking
    /// shootdowns"). Either way an interrupt the level lets through is
    /// taken at once and the section's work goes on after it.
    pub disabled_ipl: crate::cpu::Ipl,
}

impl Default for KernelParams {
    fn default() -> Self {
        KernelParams {
            hz: 100,
            segkmem_pages: 4096,
            segkmem_zone_bytes: 16,
            segmap_pages: 16,
            segmap_chunk_pages: 2,
            segmap_eager: false,
            pageout_global: false,
            segkmem_first_fit: false,
            apic_flat_max_cpus: 0,
            disabled_ipl: crate::cpu::Ipl::ALL,
        }
    }
}

#[derive(Debug)]
pub(crate) enum Event {
    Resume { cpu: CpuId, generation: u64 },
    UserSlice { cpu: CpuId, generation: u64 },
    Irq { cpu: CpuId, irq: Irq },
    WakeThread(ThreadId),
    DisabledWindow(CpuId),
}

/// What a run that ran out of physical frames reports.
pub fn out_of_frames(frames: u64) -> String {
    format!(
        "a free physical frame: simulated memory is exhausted ({frames} frames, machine.memory_mb = {}); raise machine.memory_mb or shrink the workload",
        frames / 256
    )
}

/// A liveness failure found by the watchdog.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Liveness {
    pub cpu: CpuId,
    pub waiting_for: String,
    pub since: Cycles,
    pub at: Cycles,
}

/// Everything the simulation mutates.
pub struct World {
    pub cfg: SimConfig,
    /// Kernel events: resumes, interrupts, wake-ups, windows.
    pub(crate) queue: EventQueue<Event>,
    /// User slices, kept apart: they never change kernel state, so a
    /// spinning CPU need not wake for them (see `Sim::spin_until`).
    pub(crate) slices: SmallQueue<(CpuId, u64)>,
    /// Spinners' wake-ups, kept apart too: a spinner re-checking its
    /// condition changes nothing, so other spinners sleep past it to the
    /// next *kernel* event (see `Sim::spin_until`) instead of waking each
    /// other every iteration.
    /// Entries are runs (`spin_runs`): the wake-ups of one or more
    /// spinners at one time, in push order.
    pub(crate) spin_wakes: EventQueue<u32>,
    /// The runs, by index; `spin_free` lists the unused ones.
    pub(crate) spin_runs: Vec<SpinRun>,
    pub(crate) spin_free: Vec<u32>,
    /// What is left of a run at `now` when one of its spinners had to be
    /// polled (the run, and its first member left): it comes before every
    /// entry still in `spin_wakes` (see `Sim::spin_drain`).
    pub(crate) spin_front: Option<(u32, usize)>,
    /// The time of the event being processed.
    pub(crate) now: Cycles,
    /// Per CPU, while it spins.
    pub(crate) spinners: Vec<Option<Spinner>>,
    /// Per CPU, while its idle loop waits for its next poll: the poll
    /// interval (see `Sim::idle_recheck`).
    pub(crate) idle_polls: Vec<Option<Cycles>>,
    /// How many of `spinners` are set.
    pub(crate) spinning: usize,
    /// Counts the changes to what `rearm_spinners` reads: a wake-up
    /// queued (`spin_queue`), a spinner joining a run, runs merged.
    spin_epoch: u64,
    /// The time and `spin_epoch` of the last `rearm_spinners` call that
    /// re-queued nobody.
    rearm_quiet: Option<(Cycles, u64)>,
    /// Per watched state, the CPUs whose spinners have found their
    /// condition false since it last changed (see `World::touch`); and per
    /// CPU, the list it is on.
    pub(crate) watchers: HashMap<Watch, Vec<CpuId>>,
    pub(crate) watch_listed: Vec<Option<Watch>>,
    /// Keys handed out by `Sim::new_watch`.
    pub(crate) next_watch: u32,
    pub mem: PhysMem,
    pub oracle: Oracle,
    pub cpus: Vec<Cpu>,
    pub pmaps: Vec<Pmap>,
    pub tasks: Vec<Task>,
    pub threads: Vec<Thread>,
    pub objects: Vec<VmObject>,
    pub run_queue: VecDeque<ThreadId>,
    pub counters: Counters,
    pub hists: BTreeMap<String, Histogram>,
    pub rng: SimRng,
    /// Physical page → its mappings (pv lists). Looked up, never iterated.
    pub pv: HashMap<
        u64,
        Vec<(PmapId, Vpn)>,
        std::hash::BuildHasherDefault<mmulab_machine::oracle::FixedHasher>,
    >,
    pub refs: u64,
    pub stop: bool,
    pub liveness: Option<Liveness>,
    pub live_threads: u64,
    pub timed_out: bool,
    /// Raised from outside (another thread, a signal handler's flag) to
    /// stop the run at its next check; see `Sim::set_interrupt`.
    pub interrupt: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    pub interrupted: bool,
    /// Named spin locks other than pmap locks (protocols allocate them).
    pub locks: Vec<Option<CpuId>>,
    /// Sleep locks (`sleeplock`).
    pub sleep_locks: Vec<crate::sleeplock::SleepLock>,
    /// The page layer's per-page spin and sleep locks (`sleeplock`).
    pub page_locks: crate::sleeplock::PageLocks,
    /// The anon and swap layers' reservation spin locks, once used.
    pub resv_locks: Option<(usize, usize)>,
    /// The page layer's global page-hash spin lock, once used.
    pub page_hash_lock: Option<usize>,
    /// Per-CPU level-1 directories (balan92 §Background, i386): when the
    /// protocol turns them on, each CPU's walker starts at its own
    /// directory frame (see `Sim::enable_percpu_l1`).
    pub percpu_l1: Option<crate::pmap::PerCpuL1>,
    /// Wild accesses: a stale translation to a frame that is no longer
    /// data (freed or reused as a page table).
    pub wild_accesses: u64,
    /// Next kernel virtual page for kmem allocations.
    pub kmem_next: u64,
    /// Live kernel allocations: first page → pages.
    pub kernel_regions: BTreeMap<u64, u64>,
    /// The kernel map's lock.
    pub kernel_vm_lock: usize,
    /// segkmem's bitmap and zone cookies (used by protocols with lazy
    /// kernel shootdowns).
    pub segkmem: crate::segkmem::Segkmem,
    /// segmap's chunks and page cache (balan92; `segmap`).
    pub segmap: crate::segmap::Segmap,
    /// Pageout's switches (balan92 §Pageout; `pageout`).
    pub pageout: crate::pageout::Pageout,
    /// The lock-order checker and lock contention (`lockorder`).
    pub lockorder: crate::lockorder::LockOrder,
    /// CPUs between passing the last-online-CPU check of `CpuOffline` and
    /// going offline.
    pub cpus_going_offline: usize,
    /// Caches and coherence behind the walker and the hot path, when the
    /// spec has a `[memory]` table (see [`crate::memory`]).
    pub memsys: Option<Box<mmulab_memsys::MemSystem>>,
    /// Scratch for the PCAM hits of one access.
    pub(crate) probes: Vec<mmulab_memsys::TlbProbe>,
    /// The TLB-coherence hardware the protocol assumes.
    pub tlb_hw: crate::memory::TlbHardware,
    /// A user access whose miss outlives its slice stays in flight until
    /// the CPU's next event (romanescu10 §5.1; only UNITD hardware can
    /// invalidate a translation behind a CPU's back).
    pub(crate) park_inflight: bool,
    /// The `unitd-no-replay` control: a killed in-flight access performs.
    pub(crate) no_replay: bool,
    /// The L1D hit latency (an access slower than this missed).
    pub(crate) l1_hit: Cycles,
    /// TLB misses trap to a software handler (`machine.tlb.refill`).
    pub(crate) software_refill: bool,
    /// The software handler gives the PCAM its PTE's address (romanescu10
    /// §4.1's dedicated instruction); false for the negative control.
    pub(crate) handler_supplies_pte: bool,
}

impl World {
    pub fn now(&self) -> Cycles {
        self.now
    }

    /// The time of the next spinner's wake-up: a run's rest left at `now`
    /// comes first.
    #[inline]
    pub(crate) fn spin_peek(&self) -> Option<Cycles> {
        if self.spin_front.is_some() {
            Some(self.now)
        } else {
            self.spin_wakes.peek_time()
        }
    }

    /// Wakes every spinner sleeping past `at` at its first iteration
    /// boundary at or after `at`.
    fn rearm_spinners(&mut self, at: Cycles) {
        if self.spinning == 0 {
            return;
        }
        // A call that re-queued nobody, at this time, with no wake-up
        // queued or moved between runs since: this one would re-queue
        // nobody either (each spinner's choice reads its own state, its
        // run's wake-up and `at`). When a 1,024-CPU shootdown ends, a
        // thousand spinners leave at one time and each calls this.
        if self.rearm_quiet == Some((at, self.spin_epoch)) {
            debug_assert!(!self.rearm_would_push(at), "a skipped rearm had work");
            return;
        }
        let epoch = self.spin_epoch;
        for s in 0..self.spinners.len() {
            if let Some(sp) = self.spinners[s] {
                let wake = self.spin_runs[sp.run as usize].wake;
                if wake > at {
                    let rearm = sp.since + Cycles((at - sp.since).0.div_ceil(sp.step) * sp.step);
                    if rearm < wake {
                        // The old entry goes stale: its run is gone through
                        // member by member.
                        self.spin_runs[sp.run as usize].clean = false;
                        let c = &mut self.cpus[s];
                        c.resume_gen += 1;
                        let generation = c.resume_gen;
                        self.spin_push_one(rearm, CpuId(s as u16), generation);
                    }
                }
            }
        }
        // (A re-queue moved the epoch on.)
        if self.spin_epoch == epoch {
            self.rearm_quiet = Some((at, epoch));
        }
    }

    /// Whether `rearm_spinners(at)` would re-queue a spinner (debug
    /// builds check each call it skips).
    fn rearm_would_push(&self, at: Cycles) -> bool {
        self.spinners.iter().flatten().any(|sp| {
            let wake = self.spin_runs[sp.run as usize].wake;
            wake > at && sp.since + Cycles((at - sp.since).0.div_ceil(sp.step) * sp.step) < wake
        })
    }

    /// A new, empty run (not queued).
    pub(crate) fn spin_new_run(&mut self) -> u32 {
        let id = match self.spin_free.pop() {
            Some(id) => id,
            None => {
                self.spin_runs.push(SpinRun {
                    members: Vec::new(),
                    wake: Cycles::ZERO,
                    step: 1,
                    min_bound: Cycles::ZERO,
                    clean: true,
                });
                (self.spin_runs.len() - 1) as u32
            }
        };
        let r = &mut self.spin_runs[id as usize];
        r.members.clear();
        r.min_bound = Cycles(u64::MAX);
        r.clean = true;
        id
    }

    /// Adds a spinner (its state in `spinners`) with its resume generation
    /// at the end of run `id`.
    pub(crate) fn spin_join(&mut self, id: u32, cpu: CpuId, generation: u64) {
        self.spin_epoch += 1;
        let sp = self.spinners[cpu.index()]
            .as_mut()
            .expect("a queued spinner spins");
        sp.run = id;
        let (clean, bound, step) = (sp.watch != Watch::Any && !sp.dirty, sp.bound_at, sp.step);
        let r = &mut self.spin_runs[id as usize];
        r.members.push((cpu, generation));
        r.clean &= clean;
        r.min_bound = r.min_bound.min(bound);
        r.step = step;
    }

    /// Appends run `from`'s members to run `to`'s, in that order, and
    /// frees one of the two: returns the merged run's id. The run with
    /// more members is kept, so that its members' `run` stays as it is: a
    /// run of a thousand spinners was merged into a run of one, member by
    /// member, at each of a 1,024-CPU shootdown's IPIs.
    pub(crate) fn spin_merge(&mut self, to: u32, from: u32) -> u32 {
        self.spin_epoch += 1;
        let longer = |r: u32| self.spin_runs[r as usize].members.len();
        let (keep, gone) = if longer(from) > longer(to) {
            (from, to)
        } else {
            (to, from)
        };
        let mut moving = std::mem::take(&mut self.spin_runs[gone as usize].members);
        for &(cpu, _) in &moving {
            if let Some(sp) = &mut self.spinners[cpu.index()]
                && sp.run == gone
            {
                sp.run = keep;
            }
        }
        let (clean, bound) = {
            let g = &self.spin_runs[gone as usize];
            (g.clean, g.min_bound)
        };
        let r = &mut self.spin_runs[keep as usize];
        if keep == to {
            r.members.extend_from_slice(&moving);
        } else {
            r.members.splice(0..0, moving.iter().copied());
        }
        r.clean &= clean;
        r.min_bound = r.min_bound.min(bound);
        moving.clear();
        self.spin_runs[gone as usize].members = moving;
        self.spin_free.push(gone);
        keep
    }

    /// Queues run `id` to wake at `at`.
    pub(crate) fn spin_queue(&mut self, id: u32, at: Cycles) {
        self.spin_epoch += 1;
        self.spin_runs[id as usize].wake = at;
        self.spin_wakes.push(at, id);
    }

    /// Queues one spinner's wake-up (a run of one).
    pub(crate) fn spin_push_one(&mut self, at: Cycles, cpu: CpuId, generation: u64) {
        let id = self.spin_new_run();
        self.spin_join(id, cpu, generation);
        self.spin_queue(id, at);
    }

    /// Frees a run taken off the queue.
    pub(crate) fn spin_recycle(&mut self, id: u32) {
        self.spin_runs[id as usize].members.clear();
        self.spin_free.push(id);
    }

    /// State that spinners watch (`watch`) changed: each spinner that
    /// found its condition false since the last change re-checks it at its
    /// next wake-up. Everything that changes watched state calls this
    /// before it lets another coroutine run.
    pub fn touch(&mut self, watch: Watch) {
        let Some(list) = self.watchers.get_mut(&watch) else {
            return;
        };
        let list = std::mem::take(list);
        for &cpu in &list {
            if self.watch_listed[cpu.index()] == Some(watch) {
                self.watch_listed[cpu.index()] = None;
            }
            if let Some(sp) = &mut self.spinners[cpu.index()]
                && sp.watch == watch
            {
                sp.dirty = true;
                self.spin_runs[sp.run as usize].clean = false;
            }
        }
        let mut list = list;
        list.clear();
        if let Some(l) = self.watchers.get_mut(&watch) {
            *l = list;
        }
    }

    /// `cpu`'s spinner found its condition (which reads `watch`) false:
    /// it needs no re-check until `watch` is touched.
    pub(crate) fn watch_list(&mut self, cpu: CpuId, watch: Watch) {
        if watch != Watch::Any && self.watch_listed[cpu.index()] != Some(watch) {
            self.watchers.entry(watch).or_default().push(cpu);
            self.watch_listed[cpu.index()] = Some(watch);
        }
    }

    pub fn record(&mut self, hist: &str, v: f64) {
        self.hists.entry(hist.to_string()).or_default().record(v);
    }
    pub fn is_online(&self, c: CpuId) -> bool {
        self.cpus[c.index()].online
    }
    /// Cycles per clock tick (at least one).
    pub fn tick_cycles(&self) -> u64 {
        ((self.cfg.costs.clock_hz / self.cfg.kernel.hz.max(1) as f64).round() as u64).max(1)
    }
}

struct Inner {
    world: RefCell<World>,
    protocol: Rc<dyn Protocol>,
    roots: RefCell<Vec<Option<KFuture<'static>>>>,
    /// Per CPU, while its coroutine sleeps inside `spin_until`: that
    /// call's condition and bound, so that the event loop can re-check a
    /// spinner without polling its coroutine (see `Sim::spin_drain`).
    spin_conds: RefCell<Vec<Option<SpinCond>>>,
}

/// What a spinner's condition reads, so that its wake-ups need not
/// re-check it while none of that changed (see `Sim::spin_until_watching`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Watch {
    /// Anything: re-checked at every wake-up.
    Any,
    /// A named spin lock (`Sim::lock`).
    Lock(usize),
    /// A pmap's spin lock.
    Pmap(PmapId),
    /// State a protocol names (`Sim::new_watch`) and touches whenever it
    /// changes it (`Sim::touch`).
    Key(u32),
}

/// A spinning CPU's state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spinner {
    pub(crate) since: Cycles,
    pub(crate) step: u64,
    /// The first iteration boundary past the spin bound.
    pub(crate) bound_at: Cycles,
    pub(crate) watch: Watch,
    /// What it watches changed since it last checked its condition.
    pub(crate) dirty: bool,
    /// The run holding its live wake-up.
    pub(crate) run: u32,
}

/// Spinners' wake-ups at one time, in the order they were pushed. A run
/// stands for its members' entries pushed one after the other at the
/// moment the run is pushed: nothing else is pushed to the queue between
/// them, so the order of wake-ups is that of one entry per spinner (see
/// `Sim::spin_drain`).
#[derive(Debug)]
pub(crate) struct SpinRun {
    /// (CPU, resume generation): a member whose generation moved on has a
    /// newer entry elsewhere and is skipped.
    pub(crate) members: Vec<(CpuId, u64)>,
    pub(crate) wake: Cycles,
    /// The members' iteration (one configuration value).
    pub(crate) step: u64,
    /// The earliest `bound_at` among the members.
    pub(crate) min_bound: Cycles,
    /// Every member watches named state and none has seen it change, none
    /// has an interrupt arrived and none has gone stale: the run's
    /// conditions are still false.
    pub(crate) clean: bool,
}

/// A spinner's condition, borrowed from its suspended `spin_until` future.
#[derive(Clone, Copy)]
pub(crate) struct SpinCond {
    /// Points into the coroutine's pinned, boxed future; valid while the
    /// entry is set (see `Sim::spin_until`).
    pub(crate) cond: *const (dyn Fn(&World) -> bool + 'static),
    pub(crate) bound: u64,
}

/// A handle on the simulation, cloned into every kernel coroutine.
#[derive(Clone)]
pub struct Sim(Rc<Inner>);

/// What a finished run hands to the results layer.
pub struct SimResult {
    pub counters: Counters,
    pub hists: BTreeMap<String, Histogram>,
    pub oracle: OracleReport,
    pub liveness: Option<Liveness>,
    pub end: Cycles,
    pub refs: u64,
    pub events: u64,
    pub timed_out: bool,
    /// The run was stopped from outside (`Sim::set_interrupt`, Ctrl-C)
    /// before it ended: everything above covers the time up to `end`.
    pub interrupted: bool,
}

impl Sim {
    pub fn new(cfg: SimConfig, protocol: Rc<dyn Protocol>) -> Sim {
        assert!((1..=1024).contains(&cfg.cpus), "cpus out of range");
        let mut mem = PhysMem::new(PAGE_SIZE, cfg.memory_frames);
        // romanescu10 Table 1: an I-TLB beside the D-TLB, of the same
        // geometry, when the hierarchy declares one (its own random stream,
        // so the D-TLB's replacement draws are unchanged).
        if let Some(m) = &cfg.memory {
            assert_eq!(
                m.tlbs_per_core, 2,
                "each core has an I-TLB (PCAM 0) and a D-TLB (PCAM 1)"
            );
        }
        let itlb = cfg.memory.is_some();
        let cpus = (0..cfg.cpus)
            .map(|i| {
                let tlb = Tlb::new(&cfg.tlb, SimRng::derive(cfg.seed, "tlb", i as u64));
                let itlb =
                    itlb.then(|| Tlb::new(&cfg.tlb, SimRng::derive(cfg.seed, "itlb", i as u64)));
                Cpu::new(
                    CpuId(i as u16),
                    tlb,
                    itlb,
                    SimRng::derive(cfg.seed, "cpu", i as u64),
                )
            })
            .collect();
        let root = mem
            .alloc_table(cfg.pt_format.entries(0))
            .expect("memory for the kernel pmap");
        let mut in_use = CpuSet::new(cfg.cpus);
        for i in 0..cfg.cpus {
            in_use.insert(CpuId(i as u16));
        }
        let kernel = Pmap {
            id: KERNEL_PMAP,
            root,
            kernel: true,
            asid: mmulab_machine::Asid(0),
            in_use,
            lock: None,
            tables: vec![root],
            alive: true,
        };
        let rng = SimRng::new(cfg.seed, "kernel");
        let tlb_hw = protocol.tlb_hardware();
        let memsys = cfg.memory.as_ref().map(|m| {
            let mut m = m.clone();
            m.cores = cfg.cpus;
            m.unitd = matches!(tlb_hw, crate::memory::TlbHardware::Unitd(_));
            // A broken variant's fault joins any the spec asked for.
            if let crate::memory::TlbHardware::Unitd(f) = &tlb_hw {
                let o = &mut m.faults;
                o.pcam_disabled |= f.pcam_disabled;
                o.snoop_skips_pcam |= f.snoop_skips_pcam;
                o.no_self_snoop |= f.no_self_snoop;
                o.directory_forgets_tlb_sharers |= f.directory_forgets_tlb_sharers;
                o.jetty_misses_insert |= f.jetty_misses_insert;
                o.ack_before_invalidate |= f.ack_before_invalidate;
            }
            Box::new(mmulab_memsys::MemSystem::new(&m, cfg.seed))
        });
        assert!(
            tlb_hw == crate::memory::TlbHardware::Software || memsys.is_some(),
            "protocol {} needs a memory system ([memory])",
            protocol.name()
        );
        let (park_inflight, no_replay) = match &tlb_hw {
            crate::memory::TlbHardware::Unitd(f) => (memsys.is_some(), f.no_replay),
            _ => (false, false),
        };
        let l1_hit = Cycles(memsys.as_ref().map_or(0, |m| m.config().l1d.latency_cycles));
        let software_refill = cfg.tlb.refill == mmulab_machine::Refill::Software;
        let handler_supplies_pte =
            !matches!(&tlb_hw, crate::memory::TlbHardware::Unitd(f) if f.swtlb_no_pte_address);
        let world = World {
            software_refill,
            handler_supplies_pte,
            l1_hit,
            park_inflight,
            no_replay,
            cpus_going_offline: 0,
            memsys,
            probes: Vec::new(),
            tlb_hw,
            queue: EventQueue::new(),
            slices: SmallQueue::new(),
            spin_wakes: EventQueue::new(),
            spin_runs: Vec::new(),
            spin_free: Vec::new(),
            spin_front: None,
            now: Cycles::ZERO,
            spinners: vec![None; cfg.cpus],
            spinning: 0,
            spin_epoch: 0,
            rearm_quiet: None,
            idle_polls: vec![None; cfg.cpus],
            watchers: HashMap::new(),
            watch_listed: vec![None; cfg.cpus],
            next_watch: 0,
            mem,
            oracle: Oracle::new(),
            cpus,
            pmaps: vec![kernel],
            tasks: Vec::new(),
            threads: Vec::new(),
            objects: Vec::new(),
            run_queue: VecDeque::new(),
            counters: Counters::default(),
            hists: BTreeMap::new(),
            rng,
            pv: Default::default(),
            refs: 0,
            stop: false,
            liveness: None,
            live_threads: 0,
            timed_out: false,
            interrupt: None,
            interrupted: false,
            wild_accesses: 0,
            kmem_next: (KERNEL_BASE >> PAGE_SHIFT) + 0x100,
            kernel_regions: BTreeMap::new(),
            kernel_vm_lock: 0,
            locks: vec![None],
            sleep_locks: Vec::new(),
            page_locks: Default::default(),
            resv_locks: None,
            page_hash_lock: None,
            percpu_l1: None,
            segkmem: crate::segkmem::Segkmem::new(
                (KERNEL_BASE >> PAGE_SHIFT) + 0x100,
                cfg.kernel.segkmem_pages,
                cfg.kernel.segkmem_zone_bytes,
            )
            .with_first_fit(cfg.kernel.segkmem_first_fit),
            segmap: crate::segmap::Segmap::new(
                cfg.kernel.segmap_pages,
                cfg.kernel.segmap_chunk_pages,
                cfg.kernel.segmap_eager,
            ),
            pageout: crate::pageout::Pageout {
                global: cfg.kernel.pageout_global,
                control_no_seize: false,
                next_asid: 0,
            },
            lockorder: crate::lockorder::LockOrder::new(cfg.cpus),
            cfg,
        };
        let n = world.cpus.len();
        let sim = Sim(Rc::new(Inner {
            world: RefCell::new(world),
            protocol,
            roots: RefCell::new((0..n).map(|_| None).collect()),
            spin_conds: RefCell::new(vec![None; n]),
        }));
        let level = sim.protocol().interrupt_level();
        for c in &mut sim.w().cpus {
            c.shootdown_level = level;
        }
        sim.protocol().init(&sim);
        sim
    }

    /// Mutable access to the world. Never hold it across an `.await`.
    pub fn w(&self) -> RefMut<'_, World> {
        self.0.world.borrow_mut()
    }

    pub fn protocol(&self) -> Rc<dyn Protocol> {
        self.0.protocol.clone()
    }

    pub fn now(&self) -> Cycles {
        self.w().now
    }

    pub fn costs(&self) -> Costs {
        self.w().cfg.costs.clone()
    }

    /// Clock ticks since boot (SVR4's `lbolt`), derived from simulated
    /// time and `hz`.
    pub fn lbolt(&self) -> u64 {
        let w = self.w();
        w.now().0 / w.tick_cycles()
    }

    pub fn count(&self, name: &str, n: u64) {
        self.w().counters.add(name, n);
    }

    pub fn record(&self, hist: &str, v: f64) {
        self.w().record(hist, v);
    }

    pub fn into_world_report(&self) -> OracleReport {
        self.w().oracle.report()
    }
}
