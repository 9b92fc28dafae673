//! The running simulation: the world state, the event loop, the executor
//! for kernel coroutines and the user-mode hot path.
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
use mmulab_machine::{CpuId, OpId, Oracle, PhysMem, PtFormat, Pte, Tlb, TlbConfig, TlbEntry, Vpn};
use serde::{Deserialize, Serialize};

use crate::costs::Costs;
use crate::cpu::{Cpu, Ipl, Irq, Mode};
use crate::pmap::{CpuSet, KERNEL_PMAP, Pmap, PmapId, Protocol, rights_of};
use crate::program::{Op, RefKind};
use crate::vm::{Task, Thread, ThreadId, VmObject};

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
    pub(crate) spin_wakes: EventQueue<(CpuId, u64)>,
    /// The time of the event being processed.
    pub(crate) now: Cycles,
    /// Per CPU, while it spins: (wake time, spin start, iteration).
    pub(crate) spinners: Vec<Option<(Cycles, Cycles, u64)>>,
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

    /// Wakes every spinner sleeping past `at` at its first iteration
    /// boundary at or after `at`.
    fn rearm_spinners(&mut self, at: Cycles) {
        for s in 0..self.spinners.len() {
            if let Some((wake, since, step)) = self.spinners[s]
                && wake > at
            {
                let rearm = since + Cycles((at - since).0.div_ceil(step) * step);
                if rearm < wake {
                    self.spinners[s] = Some((rearm, since, step));
                    let c = &mut self.cpus[s];
                    c.resume_gen += 1;
                    let generation = c.resume_gen;
                    self.spin_wakes.push(rearm, (CpuId(s as u16), generation));
                }
            }
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
}

/// A future that is pending once: it arms its CPU's resume event and is
/// ready when that event fires.
struct Wake {
    armed: bool,
}
impl Future for Wake {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.armed {
            Poll::Ready(())
        } else {
            self.armed = true;
            Poll::Pending
        }
    }
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
            now: Cycles::ZERO,
            spinners: vec![None; cfg.cpus],
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

    // ----- the executor -------------------------------------------------

    /// Starts a kernel coroutine on `cpu` at time `at`.
    pub(crate) fn spawn(&self, cpu: CpuId, at: Cycles, fut: KFuture<'static>) {
        let mut roots = self.0.roots.borrow_mut();
        assert!(
            roots[cpu.index()].is_none(),
            "{cpu} already runs a kernel coroutine"
        );
        roots[cpu.index()] = Some(fut);
        drop(roots);
        let mut w = self.w();
        let c = &mut w.cpus[cpu.index()];
        c.mode = Mode::Kernel;
        c.resume_gen += 1;
        let generation = c.resume_gen;
        w.queue.push(at, Event::Resume { cpu, generation });
        // New kernel work from user mode (a trap or an interrupt taken on
        // the hot path) is the one kind of kernel event a spinner could not
        // foresee: wake any spinner sleeping past it at the first iteration
        // boundary after it, as if it had polled all along.
        w.rearm_spinners(at);
    }

    fn poll_cpu(&self, cpu: CpuId) {
        let fut = self.0.roots.borrow_mut()[cpu.index()].take();
        let Some(mut fut) = fut else { return };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if fut.as_mut().poll(&mut cx).is_pending() {
            self.0.roots.borrow_mut()[cpu.index()] = Some(fut);
        }
    }

    /// Suspends a spinning coroutine until `at` (its wake-up goes to the
    /// spinners' own queue).
    async fn spin_sleep_until(&self, cpu: CpuId, at: Cycles) {
        {
            let mut w = self.w();
            let c = &mut w.cpus[cpu.index()];
            c.resume_gen += 1;
            let generation = c.resume_gen;
            w.spin_wakes.push(at, (cpu, generation));
        }
        Wake { armed: false }.await;
    }

    /// Suspends the calling coroutine until `at` (no interrupt check).
    async fn sleep_until(&self, cpu: CpuId, at: Cycles) {
        {
            let mut w = self.w();
            let c = &mut w.cpus[cpu.index()];
            c.resume_gen += 1;
            let generation = c.resume_gen;
            w.queue.push(at, Event::Resume { cpu, generation });
        }
        Wake { armed: false }.await;
    }

    /// Blocks `cpu` (no spinning) until `at`, an interrupt its level lets
    /// through, or a wake-up another CPU posts (a new `Resume` while
    /// `idle_waiting`), whichever is first.
    pub(crate) async fn block_until(&self, cpu: CpuId, at: Cycles) {
        self.w().cpus[cpu.index()].idle_waiting = true;
        self.sleep_until(cpu, at).await;
        self.w().cpus[cpu.index()].idle_waiting = false;
    }

    /// Kernel code on `cpu` runs for `c` cycles, then takes any interrupt
    /// its level lets through.
    pub async fn delay(&self, cpu: CpuId, c: Cycles) {
        let at = self.now() + c;
        self.sleep_until(cpu, at).await;
        if self.w().cpus[cpu.index()].takeable().is_some() {
            self.take_interrupts(cpu).await;
        }
    }

    /// Sets the interrupt priority level, returning the old one. Lowering
    /// it takes what is pending at the next delay.
    pub fn set_ipl(&self, cpu: CpuId, ipl: Ipl) -> Ipl {
        let mut w = self.w();
        std::mem::replace(&mut w.cpus[cpu.index()].ipl, ipl)
    }

    /// Restores a level and takes any interrupt it now lets through.
    pub async fn restore_ipl(&self, cpu: CpuId, ipl: Ipl) {
        let spl = self.costs().spl_cycles;
        self.set_ipl(cpu, ipl);
        self.delay(cpu, Cycles(spl)).await;
    }

    /// Takes pending interrupts the level allows, highest priority first.
    pub fn take_interrupts(&self, cpu: CpuId) -> KFuture<'_> {
        Box::pin(async move {
            loop {
                let (irq, level, saved) = {
                    let mut w = self.w();
                    let c = &mut w.cpus[cpu.index()];
                    let Some(irq) = c.takeable() else { break };
                    c.pending &= !irq.bit();
                    let level = c.level_of(irq);
                    let saved = std::mem::replace(&mut c.ipl, level);
                    (irq, level, saved)
                };
                let _ = level;
                let costs = self.costs();
                let bus = Self::bus_penalty(&self.w(), &costs);
                self.sleep_for(cpu, Cycles(costs.ipi_dispatch_cycles) + bus)
                    .await;
                if irq == Irq::Shootdown {
                    self.count("interrupts.shootdown", 1);
                    let p = self.protocol();
                    p.interrupt(self, cpu).await;
                }
                self.sleep_for(cpu, Cycles(costs.ipi_return_cycles)).await;
                self.set_ipl(cpu, saved);
            }
        })
    }

    async fn sleep_for(&self, cpu: CpuId, c: Cycles) {
        let at = self.now() + c;
        self.sleep_until(cpu, at).await;
    }

    /// Spins (one shared read per iteration) until `cond` holds. A spin past
    /// the configured bound is a liveness failure: the run stops and the
    /// watchdog reports who waited for what.
    ///
    /// The condition reads kernel and protocol state, which only kernel
    /// coroutines change, and they run only when an event fires. So instead
    /// of one event per iteration, the spinner sleeps to the first
    /// iteration boundary at or after the next queued event: the same
    /// iteration times, counts and interrupt points, far fewer events.
    pub async fn spin_until(&self, cpu: CpuId, what: &str, cond: impl Fn(&World) -> bool) {
        let (step, bound) = {
            let w = self.w();
            (w.cfg.costs.spin_iteration_cycles.max(1), w.cfg.spin_bound)
        };
        let since = self.now();
        loop {
            if cond(&self.w()) {
                break;
            }
            // The next kernel event is the first time the condition can
            // change (user slices never change kernel state; kernel work a
            // slice starts re-arms this spinner in `spawn`).
            let wake = {
                let w = self.w();
                let now = w.now();
                let done = (now - since).0 / step;
                if done > bound {
                    None
                } else {
                    let target = match w.queue.peek_time() {
                        Some(t) if t > now => t,
                        Some(_) => now + Cycles(1),
                        None => since + Cycles((bound + 1) * step),
                    };
                    let k = (target - since).0.div_ceil(step).max(done + 1);
                    Some(since + Cycles(k * step))
                }
            };
            let Some(wake) = wake else {
                {
                    let mut w = self.w();
                    let at = w.now();
                    w.liveness.get_or_insert(Liveness {
                        cpu,
                        waiting_for: what.to_string(),
                        since,
                        at,
                    });
                    w.stop = true;
                }
                std::future::pending::<()>().await;
                return;
            };
            self.w().spinners[cpu.index()] = Some((wake, since, step));
            self.spin_sleep_until(cpu, wake).await;
            self.w().spinners[cpu.index()] = None;
            if self.w().cpus[cpu.index()].takeable().is_some() {
                // The handler changes kernel state outside any event the
                // other spinners foresaw (spinner wake-ups are not kernel
                // events): they re-check at their next iteration.
                {
                    let mut w = self.w();
                    let now = w.now();
                    w.rearm_spinners(now);
                }
                self.take_interrupts(cpu).await;
            }
        }
        // A spinner that stops spinning goes on to change kernel state
        // without a kernel event the others could have foreseen: they
        // re-check at their next iteration, as if they had polled.
        {
            let mut w = self.w();
            let now = w.now();
            w.rearm_spinners(now);
        }
        let n = (self.now() - since).0 / step;
        if n > 0 {
            self.count("spin.iterations", n);
        }
    }

    /// Acquires a pmap's spin lock.
    pub async fn lock_pmap(&self, cpu: CpuId, pmap: PmapId) {
        let costs = self.costs();
        let order = self.lock_enter(cpu, crate::lockorder::LockRef::Pmap(pmap));
        loop {
            {
                let mut w = self.w();
                let p = &mut w.pmaps[pmap.0 as usize];
                assert_ne!(p.lock, Some(cpu), "{cpu} relocks pmap {}", pmap.0);
                if p.lock.is_none() {
                    p.lock = Some(cpu);
                    break;
                }
            }
            self.spin_until(cpu, &format!("pmap {} lock", pmap.0), |w| {
                w.pmaps[pmap.0 as usize].lock.is_none()
            })
            .await;
        }
        self.lock_acquired(cpu, crate::lockorder::LockRef::Pmap(pmap), order);
        self.delay(cpu, Cycles(costs.lock_cycles)).await;
    }

    /// Tries a pmap's spin lock once, without waiting: true when taken.
    /// Exempt from the lock order (a try-lock cannot deadlock; see
    /// `lockorder`). Costs one lock attempt either way.
    pub async fn try_lock_pmap(&self, cpu: CpuId, pmap: PmapId) -> bool {
        let costs = self.costs();
        let order = self.try_lock_enter(cpu, crate::lockorder::LockRef::Pmap(pmap));
        let taken = {
            let mut w = self.w();
            let p = &mut w.pmaps[pmap.0 as usize];
            assert_ne!(p.lock, Some(cpu), "{cpu} relocks pmap {}", pmap.0);
            if p.lock.is_none() {
                p.lock = Some(cpu);
                true
            } else {
                false
            }
        };
        if taken {
            self.lock_acquired(cpu, crate::lockorder::LockRef::Pmap(pmap), order);
        }
        self.delay(cpu, Cycles(costs.lock_cycles)).await;
        taken
    }

    pub async fn unlock_pmap(&self, cpu: CpuId, pmap: PmapId) {
        let c = self.costs().unlock_cycles;
        {
            let mut w = self.w();
            let p = &mut w.pmaps[pmap.0 as usize];
            assert_eq!(
                p.lock,
                Some(cpu),
                "{cpu} unlocks pmap {} it does not hold",
                pmap.0
            );
            p.lock = None;
        }
        self.lock_released(cpu, crate::lockorder::LockRef::Pmap(pmap));
        self.delay(cpu, Cycles(c)).await;
    }

    /// Allocates a named spin lock for a protocol.
    pub fn new_lock(&self) -> usize {
        let mut w = self.w();
        w.locks.push(None);
        w.locks.len() - 1
    }

    pub async fn lock(&self, cpu: CpuId, lock: usize) {
        let order = self.lock_enter(cpu, crate::lockorder::LockRef::Named(lock));
        loop {
            {
                let mut w = self.w();
                if w.locks[lock].is_none() {
                    w.locks[lock] = Some(cpu);
                    break;
                }
            }
            self.spin_until(cpu, &format!("lock {lock}"), |w| w.locks[lock].is_none())
                .await;
        }
        self.lock_acquired(cpu, crate::lockorder::LockRef::Named(lock), order);
        let c = self.costs().lock_cycles;
        self.delay(cpu, Cycles(c)).await;
    }

    /// Tries a named spin lock once, without waiting: true when taken.
    /// Exempt from the lock order like [`Sim::try_lock_pmap`]. Costs one
    /// lock attempt either way.
    pub async fn try_lock(&self, cpu: CpuId, lock: usize) -> bool {
        let order = self.try_lock_enter(cpu, crate::lockorder::LockRef::Named(lock));
        let taken = {
            let mut w = self.w();
            assert_ne!(w.locks[lock], Some(cpu), "{cpu} relocks lock {lock}");
            if w.locks[lock].is_none() {
                w.locks[lock] = Some(cpu);
                true
            } else {
                false
            }
        };
        if taken {
            self.lock_acquired(cpu, crate::lockorder::LockRef::Named(lock), order);
        }
        let c = self.costs().lock_cycles;
        self.delay(cpu, Cycles(c)).await;
        taken
    }

    pub async fn unlock(&self, cpu: CpuId, lock: usize) {
        {
            let mut w = self.w();
            assert_eq!(
                w.locks[lock],
                Some(cpu),
                "{cpu} unlocks lock {lock} it does not hold"
            );
            w.locks[lock] = None;
        }
        self.lock_released(cpu, crate::lockorder::LockRef::Named(lock));
        let c = self.costs().unlock_cycles;
        self.delay(cpu, Cycles(c)).await;
    }

    /// Posts an interprocessor interrupt: the sender pays the send cost, the
    /// interrupt arrives after the delivery latency.
    pub async fn send_ipi(&self, cpu: CpuId, target: CpuId, irq: Irq) {
        let costs = self.costs();
        self.delay(cpu, Cycles(costs.ipi_send_cycles)).await;
        self.post_ipi(cpu, target, irq, &costs);
    }

    /// Linux's `send_IPI_mask`: in flat APIC mode (a machine of at most
    /// `kernel.apic_flat_max_cpus` CPUs) one ICR write reaches every
    /// target; otherwise (bigsmp) one `send_ipi` per target, in order.
    pub async fn send_ipi_mask(&self, cpu: CpuId, targets: &[CpuId], irq: Irq) {
        let flat = {
            let w = self.w();
            w.cpus.len() as u64 <= w.cfg.kernel.apic_flat_max_cpus
        };
        if !flat {
            for &t in targets {
                self.send_ipi(cpu, t, irq).await;
            }
            return;
        }
        let costs = self.costs();
        self.delay(cpu, Cycles(costs.ipi_send_cycles)).await;
        for &t in targets {
            self.post_ipi(cpu, t, irq, &costs);
        }
        self.count("ipi.flat_sends", 1);
    }

    /// Queues `irq`'s arrival at `target`, sent now by `cpu`.
    fn post_ipi(&self, cpu: CpuId, target: CpuId, irq: Irq, costs: &Costs) {
        let mut w = self.w();
        let jitter = if costs.ipi_jitter_cycles > 0 {
            w.cpus[cpu.index()].rng.below(costs.ipi_jitter_cycles + 1)
        } else {
            0
        };
        let at = w.now() + Cycles(costs.ipi_latency_cycles + jitter) + Self::bus_penalty(&w, costs);
        w.queue.push(at, Event::Irq { cpu: target, irq });
        w.counters.add("ipi.sent", 1);
    }

    /// Shared-bus contention (black89 §7.1: on the Multimax "these effects
    /// become significant ... when 12 or more processors are actively using
    /// the bus"; the interrupt's state save and the responders' accesses to
    /// shootdown state miss in cache). CPUs running user code in a tight
    /// loop on write-through caches use the bus on every store; once
    /// `bus_free_users` or more do, each further one adds
    /// `bus_contention_cycles` to every interrupt delivery and dispatch.
    /// Off (0) unless a spec turns it on.
    pub fn bus_penalty(w: &World, costs: &Costs) -> Cycles {
        if costs.bus_contention_cycles == 0 {
            return Cycles(0);
        }
        let users = w.cpus.iter().filter(|c| c.mode == Mode::User).count() as u64;
        let over = (users + 1).saturating_sub(costs.bus_free_users);
        Cycles(over * costs.bus_contention_cycles)
    }

    /// Posts an interrupt without a sender (device, or the scheduler).
    pub(crate) fn post_irq(&self, target: CpuId, irq: Irq, after: Cycles) {
        let mut w = self.w();
        let at = w.now() + after;
        w.queue.push(at, Event::Irq { cpu: target, irq });
    }

    /// The idle loop's wait: cut short by any interrupt.
    pub(crate) async fn idle_wait(&self, cpu: CpuId, c: Cycles) {
        self.w().cpus[cpu.index()].idle_waiting = true;
        let at = self.now() + c;
        self.sleep_until(cpu, at).await;
        self.w().cpus[cpu.index()].idle_waiting = false;
        if self.w().cpus[cpu.index()].takeable().is_some() {
            self.take_interrupts(cpu).await;
        }
    }

    // ----- operations (for the oracle) ----------------------------------

    /// Starts a VM operation on `cpu`; PTE changes are attributed to it.
    pub fn begin_op(&self, cpu: CpuId, what: &str) -> OpId {
        let mut w = self.w();
        let now = w.now();
        assert!(
            w.cpus[cpu.index()].op.is_none(),
            "{cpu} starts {what} inside another operation"
        );
        let op = w.oracle.begin_op(what, cpu, now);
        w.cpus[cpu.index()].op = Some(op);
        op
    }

    /// Ends the operation: complete now, unless a lazy scheme deferred it.
    pub fn end_op(&self, cpu: CpuId) {
        let mut w = self.w();
        let now = w.now();
        let op = w.cpus[cpu.index()]
            .op
            .take()
            .expect("end_op without begin_op");
        if !w.oracle.op(op).lazy {
            w.oracle.complete(op, now);
        }
    }

    /// A lazy scheme takes over the completion of `cpu`'s current
    /// operation; it calls [`Sim::complete_op`] when it is done.
    pub fn defer_completion(&self, cpu: CpuId) -> OpId {
        let mut w = self.w();
        let op = w.cpus[cpu.index()].op.expect("no operation to defer");
        w.oracle.set_lazy(op);
        op
    }

    pub fn complete_op(&self, op: OpId) {
        let mut w = self.w();
        let now = w.now();
        w.oracle.complete(op, now);
    }

    // ----- the event loop ------------------------------------------------

    /// Runs until every thread has exited, a program ends the run, the
    /// watchdog fires or the time limit passes.
    pub fn run(&self) -> SimResult {
        let max = Cycles(self.w().cfg.max_cycles);
        self.start_windows();
        loop {
            let ev = {
                let mut w = self.w();
                if w.stop {
                    break;
                }
                // Kernel events, then spinners' wake-ups, then user slices
                // at the same cycle.
                let kernel = w.queue.peek_time();
                let spin = w.spin_wakes.peek_time();
                let slice = w.slices.peek_time();
                // (Plain `Option` minima: a flattened array iterator here
                // compiled to stack round trips on every event.)
                let Some(next) = earliest(earliest(kernel, spin), slice) else {
                    break;
                };
                if next > max {
                    w.timed_out = true;
                    break;
                }
                w.now = next;
                if kernel == Some(next) {
                    w.queue.pop().expect("peeked")
                } else if spin == Some(next) {
                    let (t, (cpu, generation)) = w.spin_wakes.pop().expect("peeked");
                    (t, Event::Resume { cpu, generation })
                } else {
                    let (t, (cpu, generation)) = w.slices.pop().expect("peeked");
                    (t, Event::UserSlice { cpu, generation })
                }
            };
            match ev.1 {
                Event::Resume { cpu, generation } => {
                    if self.w().cpus[cpu.index()].resume_gen == generation {
                        self.poll_cpu(cpu);
                    }
                }
                Event::UserSlice { cpu, generation } => {
                    self.user_slices(cpu, generation, ev.0, max);
                }
                Event::Irq { cpu, irq } => self.irq_arrive(cpu, irq, ev.0),
                Event::WakeThread(t) => self.make_runnable(t),
                Event::DisabledWindow(cpu) => self.disabled_window(cpu, ev.0),
            }
        }
        let w = self.w();
        let mut oracle = w.oracle.report();
        let result = SimResult {
            counters: {
                let mut c = w.counters.clone();
                if let Some(ms) = &w.memsys {
                    crate::memory::report(ms, &mut c, &mut oracle);
                }
                c.add("refs", w.refs);
                c.add("wild_accesses", w.wild_accesses);
                let (h, m) = w
                    .cpus
                    .iter()
                    .fold((0, 0), |(h, m), c| (h + c.tlb.hits, m + c.tlb.misses));
                c.add("tlb.hits", h);
                c.add("tlb.misses", m);
                // Only machines with an I-TLB report it (flat runs' counters
                // stay as they were).
                if w.has_itlb() {
                    let (h, m) = w
                        .cpus
                        .iter()
                        .filter_map(|c| c.itlb.as_ref())
                        .fold((0, 0), |(h, m), t| (h + t.hits, m + t.misses));
                    c.add("tlb.itlb_hits", h);
                    c.add("tlb.itlb_misses", m);
                }
                c
            },
            hists: w.hists.clone(),
            oracle,
            liveness: w.liveness.clone(),
            end: w.now(),
            refs: w.refs,
            events: w.queue.scheduled() + w.spin_wakes.scheduled() + w.slices.scheduled(),
            timed_out: w.timed_out,
        };
        drop(w);
        // Coroutines still suspended (idle loops, parked CPUs) hold clones
        // of this handle: drop them, or the world (caches included) leaks
        // through the cycle, run after run.
        let roots: Vec<_> = self
            .0
            .roots
            .borrow_mut()
            .iter_mut()
            .map(Option::take)
            .collect();
        drop(roots);
        result
    }

    fn irq_arrive(&self, cpu: CpuId, irq: Irq, t: Cycles) {
        let mut w = self.w();
        let c = &mut w.cpus[cpu.index()];
        if !c.online {
            return;
        }
        c.pending |= irq.bit();
        match c.mode {
            Mode::User => {
                if c.takeable().is_some() {
                    // Leave the hot path: cancel the pending slice and take
                    // the interrupt at this CPU's own time.
                    c.slice_gen += 1;
                    // A computation run ahead in one stretch is cut at
                    // the arrival: the clock goes back, the rest is still
                    // to compute.
                    let (local, thread) = (c.local, c.thread);
                    if let Some(tid) = thread
                        && let Some(from) = w.threads[tid.0 as usize].compute_stretch_from
                        && t < local
                    {
                        let back = local - from.max(t);
                        w.threads[tid.0 as usize].compute_left += back.0;
                        w.threads[tid.0 as usize].compute_stretch_from = None;
                        w.cpus[cpu.index()].local = local - back;
                    }
                    let at = w.cpus[cpu.index()].local.max(t);
                    drop(w);
                    let sim = self.clone();
                    self.spawn(
                        cpu,
                        at,
                        Box::pin(async move {
                            sim.kernel_entry(cpu, crate::sched::Entry::Interrupt).await
                        }),
                    );
                }
            }
            Mode::Kernel => {
                if c.idle_waiting && c.takeable().is_some() {
                    c.idle_waiting = false;
                    c.resume_gen += 1;
                    let generation = c.resume_gen;
                    w.queue.push(t, Event::Resume { cpu, generation });
                }
            }
            Mode::Offline => {}
        }
    }

    fn start_windows(&self) {
        let mut w = self.w();
        let Some(dw) = w.cfg.disabled_windows.clone() else {
            return;
        };
        for i in 0..w.cpus.len() {
            let gap = w.cpus[i].rng.exponential(dw.mean_interval_cycles as f64) as u64;
            w.queue
                .push(Cycles(gap), Event::DisabledWindow(CpuId(i as u16)));
        }
    }

    fn disabled_window(&self, cpu: CpuId, t: Cycles) {
        let mut w = self.w();
        let dw = w.cfg.disabled_windows.clone().expect("windows configured");
        let c = &mut w.cpus[cpu.index()];
        let len = c.rng.exponential(dw.mean_length_cycles as f64) as u64;
        let gap = c.rng.exponential(dw.mean_interval_cycles as f64) as u64;
        let user = c.mode == Mode::User && c.online;
        let at = c.local.max(t);
        if user {
            c.slice_gen += 1;
        }
        w.queue
            .push(t + Cycles(len + gap), Event::DisabledWindow(cpu));
        if user {
            w.counters.add("kernel.disabled_windows", 1);
            drop(w);
            let sim = self.clone();
            self.spawn(
                cpu,
                at,
                Box::pin(async move {
                    sim.kernel_entry(cpu, crate::sched::Entry::DisabledWindow(Cycles(len)))
                        .await
                }),
            );
        }
    }

    /// Schedules the next user slice of `cpu` at `at`.
    pub(crate) fn resume_user(&self, cpu: CpuId, at: Cycles) {
        let mut w = self.w();
        let c = &mut w.cpus[cpu.index()];
        c.mode = Mode::User;
        c.fetch_due = true;
        c.slice_gen += 1;
        c.local = at;
        let generation = c.slice_gen;
        w.slices.push(at, (cpu, generation));
    }

    // ----- the hot path --------------------------------------------------

    /// Runs the user slice `(cpu, generation)` popped at `t`, then, under
    /// the same borrow of the world, every following event for as long as
    /// it is a user slice, picked as the main loop would pick it: kernel
    /// events and spinners' wake-ups win ties, nothing runs after a stop
    /// or past `max`. Almost every simulated reference ends its slice, so
    /// this is the loop a run spends its time in.
    fn user_slices(&self, mut cpu: CpuId, mut generation: u64, mut t: Cycles, max: Cycles) {
        let mut wb = self.w();
        loop {
            let w = &mut *wb;
            // Host-only hints for the slices to come (see prefetch_slice).
            if let Some(&(after, _)) = w.slices.peek_nth(1) {
                prefetch_cpu(w, after);
            }
            if let Some(&(next, _)) = w.slices.peek_nth(0) {
                prefetch_slice(w, next);
            }
            // A stale slice (cancelled by an interrupt or a window) is
            // dropped.
            if w.cpus[cpu.index()].slice_gen == generation
                && let Some(trap) = user_slice(w, cpu, t)
            {
                let ci = cpu.index();
                let tid = w.cpus[ci].thread.expect("user mode without a thread");
                let at = w.cpus[ci].local;
                w.cpus[ci].slice_gen += 1;
                w.threads[tid.0 as usize].trap = Some(trap);
                drop(wb);
                let sim = self.clone();
                self.spawn(
                    cpu,
                    at,
                    Box::pin(async move { sim.kernel_entry(cpu, crate::sched::Entry::Trap).await }),
                );
                return;
            }
            if w.stop {
                return;
            }
            let Some(next) = w.slices.peek_time() else {
                return;
            };
            if next > max
                || w.queue.peek_time().is_some_and(|k| k <= next)
                || w.spin_wakes.peek_time().is_some_and(|s| s <= next)
            {
                return;
            }
            w.now = next;
            (t, (cpu, generation)) = w.slices.pop().expect("peeked");
        }
    }

    pub fn into_world_report(&self) -> OracleReport {
        self.w().oracle.report()
    }
}

/// Host-only hints, given while other slices run, in two steps so that no
/// hint waits on a miss: two slices ahead, `prefetch_cpu` brings the CPU's
/// own fields closer; one slice ahead, `prefetch_slice` reads them and
/// brings closer what the slice reads first. The memory system's work since
/// a CPU's last slice has usually evicted all of it from the host's
/// caches. Neither has any effect on the simulation.
#[inline]
fn prefetch_cpu(w: &World, cpu: CpuId) {
    if let Some(c) = w.cpus.get(cpu.index()) {
        mmulab_machine::prefetch(&c.local);
        mmulab_machine::prefetch(&c.slice_gen);
        mmulab_machine::prefetch(&c.inflight);
        mmulab_machine::prefetch(&c.thread);
        mmulab_machine::prefetch(&c.pmap);
        mmulab_machine::prefetch(&c.fetch_due);
        c.tlb.prefetch_header();
    }
}

/// See `prefetch_cpu`: the access in flight's oracle entry and data,
/// the thread's batch, and the TLB set of the in-flight page
/// (where the batch's next reference usually is).
#[inline]
fn prefetch_slice(w: &World, cpu: CpuId) {
    let Some(c) = w.cpus.get(cpu.index()) else {
        return;
    };
    if let Some(f) = &c.inflight {
        w.oracle.prefetch(f.oracle_slot);
        // (its data word: the frame record is read to find it)
        w.mem.prefetch(f.pfn, (f.va & (PAGE_SIZE - 1)) & !7);
        c.tlb.prefetch(Vpn(f.va >> PAGE_SHIFT));
    }
    if let Some(th) = c.thread.and_then(|t| w.threads.get(t.0 as usize)) {
        mmulab_machine::prefetch(&th.batch);
        mmulab_machine::prefetch(&th.last_load);
    }
}

/// One user slice of `cpu` starting at `t`: the thread runs its
/// references and computations until the quantum ends (the next slice is
/// queued) or it traps (returned; the caller enters the kernel).
fn user_slice(w: &mut World, cpu: CpuId, t: Cycles) -> Option<Trap> {
    let ci = cpu.index();
    let quantum = w.cfg.quantum_cycles.max(1);
    let tid = w.cpus[ci].thread.expect("user mode without a thread");
    let local = w.cpus[ci].local.max(t);
    w.cpus[ci].local = local;
    w.cpus[ci].slice_start = local;
    // An access in flight from the last slice performs (or replays)
    // first (romanescu10 §5.1).
    retire_inflight(w, cpu);
    // Back from the kernel, the thread fetches its loop's code again
    // (I-TLB, L1I). The stall does not eat the quantum, like a
    // reference's that starts before the end.
    let mut fetch_fault = if std::mem::take(&mut w.cpus[ci].fetch_due) {
        fetch_instruction(w, cpu, tid)
    } else {
        None
    };
    let end = w.cpus[ci].local + Cycles(quantum);
    // Every interrupt before this slice has arrived: a stretch run ahead
    // in the last slice is past.
    w.threads[tid.0 as usize].compute_stretch_from = None;
    let trap = loop {
        if fetch_fault.is_some() {
            break fetch_fault.take();
        }
        let left = w.threads[tid.0 as usize].compute_left;
        if left > 0
            && w.threads[tid.0 as usize]
                .program
                .as_ref()
                .is_some_and(|p| p.long_computes())
        {
            // The whole computation in one stretch; the slice ends with
            // it, so that an interrupt arriving during it can rewind the
            // clock to its arrival (`irq_arrive`).
            let th = &mut w.threads[tid.0 as usize];
            th.compute_stretch_from = Some(w.cpus[ci].local);
            th.compute_left = 0;
            w.cpus[ci].local += Cycles(left);
            break None;
        }
        if left > 0 {
            let room = (end.0.saturating_sub(w.cpus[ci].local.0)).min(left);
            w.cpus[ci].local += Cycles(room);
            w.threads[tid.0 as usize].compute_left -= room;
            if w.threads[tid.0 as usize].compute_left > 0 {
                break None;
            }
        }
        let trapped = if w.memsys.is_some() {
            run_batch::<true>(w, cpu, tid, end)
        } else {
            run_batch::<false>(w, cpu, tid, end)
        };
        if let Some(t) = trapped {
            break Some(t);
        }
        if w.cpus[ci].local >= end {
            break None;
        }
        let th = &mut w.threads[tid.0 as usize];
        // (Borrowed in place, not taken out and put back every slice.)
        let program = th.program.as_mut().expect("thread without a program");
        let mut ctx = crate::program::ThreadCtx {
            thread: tid,
            cpu,
            now: w.cpus[ci].local,
            last_load: th.last_load,
            ret: th.ret,
            fault: th.fault.take(),
            rng: &mut th.rng,
            end_run: false,
        };
        let op = program.next(&mut ctx);
        if ctx.end_run {
            w.stop = true;
        }
        match op {
            Op::Refs(r) => {
                if r.count > 0 {
                    th.batch = Some(crate::program::Batch::new(r));
                }
            }
            // Computation is consumed slice by slice like references,
            // so an interrupt never waits for a whole computation.
            Op::Compute(c) => th.compute_left = c,
            other => break Some(Trap::Op(other)),
        }
        // A new loop: its code is fetched (a fault on the text page
        // traps; the loop runs after the fault is handled).
        fetch_fault = fetch_instruction(w, cpu, tid);
        if w.stop {
            break None;
        }
    };
    if trap.is_none() {
        let c = &mut w.cpus[ci];
        c.slice_gen += 1;
        let (at, generation) = (c.local, c.slice_gen);
        w.slices.push(at, (cpu, generation));
    }
    trap
}

/// The earlier of two optional times.
#[inline]
fn earliest(a: Option<Cycles>, b: Option<Cycles>) -> Option<Cycles> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Why a thread left user mode.
pub enum Trap {
    /// A page fault at `va` (store or load) that the TLB and walker could not
    /// satisfy.
    Fault { va: u64, store: bool },
    /// A system call, sleep or exit.
    Op(Op),
}

/// Runs the thread's current batch of references until it ends, the slice
/// ends or a reference traps. The batch lives in locals for the loop and is
/// written back once. `MEM`: a cache hierarchy is behind the references and
/// the walker (compiled separately so that flat runs pay nothing for it).
fn run_batch<const MEM: bool>(
    w: &mut World,
    cpu: CpuId,
    tid: ThreadId,
    end: Cycles,
) -> Option<Trap> {
    let ci = cpu.index();
    let ref_cycles = Cycles(w.cfg.costs.ref_cycles);
    let mut b = w.threads[tid.0 as usize].batch?;
    let refs = b.refs;
    let mut last_load = w.threads[tid.0 as usize].last_load;
    let mut trap = None;
    let store = !matches!(refs.kind, RefKind::Load);
    let park_inflight = MEM && w.park_inflight;
    let l1_hit = w.l1_hit;
    let mut more = b.pos < refs.count;
    while more && w.cpus[ci].local < end {
        let va = b.va;
        match translate::<MEM>(w, cpu, tid, va, store) {
            Ok((pfn, slot)) => {
                let off = (va & (PAGE_SIZE - 1)) & !7;
                if MEM && off + refs.stride < PAGE_SIZE {
                    // the next reference of a sweep, while the caches work
                    w.mem.prefetch(pfn, off + refs.stride);
                }
                if MEM {
                    // The access goes through the caches (and, being a
                    // store, self-snoops the PCAMs: romanescu10 §5.2).
                    let pa = (pfn.0 << PAGE_SHIFT) | off;
                    let lat = match refs.kind {
                        RefKind::Load => w.mem_access(cpu, pa, AccessKind::Load),
                        RefKind::Store(_) => w.mem_access(cpu, pa, AccessKind::Store),
                        RefKind::Increment => {
                            w.mem_access(cpu, pa, AccessKind::Load)
                                + w.mem_access(cpu, pa, AccessKind::Store)
                        }
                    };
                    // (The memory system never reads a CPU's clock, so the
                    // reference's own cycles are added with its latency.)
                    let c = &mut w.cpus[ci];
                    c.local += ref_cycles + lat;
                    // A miss that outlives the slice: the access performs
                    // (or replays) when this CPU next runs. An L1 hit
                    // performs at once (there is no miss to die during),
                    // and so does an access whose own miss recalled its
                    // translation (an L2 eviction of the PTE's block: the
                    // PTE is unchanged at this instant). Both keep a
                    // replayed access from being killed forever in tiny
                    // caches.
                    // A replay is retried in one step: cores storing to
                    // blocks that hold each other's PTEs would otherwise
                    // kill each other's retries forever (the paper does not
                    // say how UNITD guarantees progress there).
                    let retry = std::mem::take(&mut c.replaying);
                    // (Read after the access, which may have invalidated it.)
                    let entry = c.tlb.entry(slot);
                    if park_inflight && c.local >= end && lat > l1_hit && entry.valid && !retry {
                        debug_assert_eq!(entry.pfn, pfn, "the entry translated this access");
                        c.inflight = Some(crate::cpu::InFlight {
                            slot,
                            pfn: entry.pfn,
                            oracle_slot: entry.oracle_slot,
                            fill_epoch: entry.fill_epoch,
                            dirty: entry.dirty,
                            va,
                            killed: false,
                        });
                        // its data, for when it performs
                        w.mem.prefetch(pfn, off);
                        break;
                    }
                } else {
                    w.cpus[ci].local += ref_cycles;
                }
                last_load = perform(w, pfn, off, refs.kind).unwrap_or(last_load);
                more = b.advance();
            }
            Err(()) => {
                trap = Some(Trap::Fault { va, store });
                break;
            }
        }
    }
    let th = &mut w.threads[tid.0 as usize];
    th.last_load = last_load;
    // Only the position changes while the batch lasts.
    match &mut th.batch {
        Some(tb) if more => (tb.pos, tb.va) = (b.pos, b.va),
        tb => *tb = None,
    }
    trap
}

/// The data side of one reference at `off` in `pfn`, once it performs;
/// returns the value a load read.
#[inline(always)]
fn perform(w: &mut World, pfn: mmulab_machine::Pfn, off: u64, kind: RefKind) -> Option<u64> {
    let mut loaded = None;
    if w.mem.is_data(pfn) {
        match kind {
            RefKind::Load => loaded = Some(w.mem.load(pfn, off)),
            RefKind::Store(v) => w.mem.store(pfn, off, v),
            RefKind::Increment => {
                let v = w.mem.load(pfn, off);
                loaded = Some(v);
                w.mem.store(pfn, off, v.wrapping_add(1));
            }
        }
    } else {
        w.wild_accesses += 1;
    }
    w.refs += 1 + matches!(kind, RefKind::Increment) as u64;
    loaded
}

/// Retires `cpu`'s access in flight, if any (romanescu10 §5.1): if a PCAM
/// hit invalidated its translation meanwhile, the access replays — its
/// reference stays next in the batch and is looked up again — else it
/// performs now, its translation checked again by the oracle. Called when
/// the CPU next runs: its next slice, or before it takes an interrupt.
/// Always inlined: once per slice, and the call (register saves, the CPU
/// looked up again) cost as much as its common path.
#[inline(always)]
pub(crate) fn retire_inflight(w: &mut World, cpu: CpuId) {
    let ci = cpu.index();
    let Some(f) = w.cpus[ci].inflight.take() else {
        return;
    };
    let tid = w.cpus[ci]
        .thread
        .expect("an access in flight without a thread");
    if f.killed {
        w.counters.add("unitd.replays", 1);
        if !w.no_replay {
            w.cpus[ci].replaying = true;
            return;
        }
    }
    let kind = match &w.threads[tid.0 as usize].batch {
        Some(b) => {
            debug_assert_eq!(b.va, f.va, "the in-flight access is the batch's next");
            b.refs.kind
        }
        None => panic!("an access in flight outside a batch"),
    };
    let store = !matches!(kind, RefKind::Load);
    let ctx = UseCtx {
        cpu,
        thread: tid.0,
        va: f.va,
        time: w.cpus[ci].local,
    };
    w.oracle
        .recheck_use(f.oracle_slot, f.fill_epoch, f.pfn, f.dirty, store, ctx);
    let off = (f.va & (PAGE_SIZE - 1)) & !7;
    let loaded = perform(w, f.pfn, off, kind);
    let th = &mut w.threads[tid.0 as usize];
    if let Some(v) = loaded {
        th.last_load = v;
    }
    let b = th.batch.as_mut().expect("checked above");
    if !b.advance() {
        th.batch = None;
    }
}

/// A software-refilled TLB's miss (or modify) trap: the handler's cost
/// beyond its page-table loads. Nothing with a hardware walker.
#[inline]
fn refill_trap(w: &mut World) -> Cycles {
    if !w.software_refill {
        return Cycles(0);
    }
    w.counters.add("tlb.software_refills", 1);
    Cycles(w.cfg.costs.tlb_refill_trap_cycles)
}

/// Writes the PCAM beside a TLB fill at `slot`. The hardware walker knows
/// the last-level PTE's address; a software handler must supply it with a
/// dedicated instruction (romanescu10 §4.1), one more instruction per
/// refill.
#[inline]
fn fill_pcam(w: &mut World, cpu: CpuId, tlb: usize, slot: usize, pte_pa: u64) {
    if w.software_refill && matches!(w.tlb_hw, TlbHardware::Unitd(_)) {
        if !w.handler_supplies_pte {
            return;
        }
        w.counters.add("unitd.pte_address_supplied", 1);
        let c = Cycles(w.cfg.costs.ref_cycles);
        w.cpus[cpu.index()].local += c;
    }
    w.pcam_fill_tlb(cpu, tlb, slot, pte_pa);
}

/// The walker's reads of `wk`'s entries: flat memory costs a memory read
/// per level; with caches each level loads through L1D (romanescu10 §5.2).
#[inline]
fn walk_cost<const MEM: bool>(w: &mut World, cpu: CpuId, wk: &Walk) -> Cycles {
    let costs = &w.cfg.costs;
    if MEM {
        let per_level = costs.walk_level_cycles;
        let mut c = Cycles(per_level * wk.levels_read as u64);
        for &pa in &wk.path[..wk.levels_read as usize] {
            c += w.mem_access(cpu, pa, AccessKind::WalkLoad);
        }
        c
    } else {
        Cycles((costs.mem_cycles + costs.walk_level_cycles) * wk.levels_read as u64)
    }
}

/// Translates `va` on `cpu`: a TLB hit checked by the oracle, or a walk
/// that fills the TLB. `Err` is a page fault.
#[inline]
fn translate<const MEM: bool>(
    w: &mut World,
    cpu: CpuId,
    tid: ThreadId,
    va: u64,
    store: bool,
) -> Result<(mmulab_machine::Pfn, usize), ()> {
    let ci = cpu.index();
    let vpn = Vpn(va >> PAGE_SHIFT);
    let kernel = va >= KERNEL_BASE;
    let pmap = if kernel {
        KERNEL_PMAP
    } else {
        w.cpus[ci].pmap.ok_or(())?
    };
    let asid = w.pmaps[pmap.0 as usize].asid;
    let c = &mut w.cpus[ci];
    if let Some(slot) = c.tlb.lookup(vpn, asid) {
        let e = *c.tlb.entry(slot);
        // romanescu10 §6.3's ideal invalidation: the hit is checked against
        // its PTE for free; a stale entry is dropped and re-walked at full
        // cost below. Stale: the PTE no longer allows what the entry does,
        // or it was changed since the fill and changed back (the entry's
        // fill epoch is behind its PTE's).
        let stale =
            MEM && matches!(w.tlb_hw, TlbHardware::Ideal) && ideal_stale(w, cpu, pmap, vpn, &e);
        if stale {
            w.cpus[ci].tlb.entry_mut(slot).valid = false;
            w.counters.add("ideal.stale_drops", 1);
        } else {
            if store && !e.writable {
                return Err(());
            }
            check_hit(w, cpu, tid, va, &e, store);
            if store && !e.dirty {
                // The hardware sets the modify bit with an interlocked
                // read-modify-write that re-checks the PTE (black89 fn. 6).
                let root = w.walk_root(cpu, pmap);
                let wk = walk(&w.mem, w.cfg.pt_format, root, vpn);
                let cost = walk_cost::<MEM>(w, cpu, &wk) + refill_trap(w);
                w.cpus[ci].local += cost;
                if !(wk.leaf && wk.pte.present() && wk.pte.writable() && wk.pte.pfn() == e.pfn) {
                    w.cpus[ci].tlb.entry_mut(slot).valid = false;
                    return Err(());
                }
                let new = wk.pte.with(Pte::MODIFIED | Pte::REFERENCED);
                w.mem.table_mut(wk.table)[wk.index] = new.0;
                if MEM {
                    // The update is a store (romanescu10 §6.1); under UNITD
                    // its self-snoop invalidates this very entry, which the
                    // walker then re-inserts with the new value.
                    let lat = w.pte_store(cpu, wk.pte_pa);
                    w.cpus[ci].local += lat;
                    fill_pcam(w, cpu, crate::memory::DTLB, slot, wk.pte_pa);
                }
                w.oracle.record_pte(e.oracle_slot, rights_of(new), None);
                let ent = w.cpus[ci].tlb.entry_mut(slot);
                ent.valid = true;
                ent.dirty = true;
                ent.fill_epoch = w.oracle.epoch(e.oracle_slot);
            }
            return Ok((e.pfn, slot));
        }
    }
    let entry = walk_for_fill::<MEM>(w, cpu, pmap, vpn, store, kernel)?;
    let (tslot, _victim) = w.cpus[ci].tlb.insert(entry);
    if MEM {
        fill_pcam(w, cpu, crate::memory::DTLB, tslot, entry.pte_pa);
    }
    Ok((entry.pfn, tslot))
}

/// A user thread's instruction fetch: the code line of its loop, through
/// the I-TLB and the L1I, each time the program starts an operation (a
/// loop of references or a computation) and on every return to user mode
/// (after a trap or an interrupt). The simulated programs' loops fit one
/// line, which the core's fetch buffer holds while the loop runs, so one
/// fetch per loop stands for them; slices, a simulator artefact, fetch
/// nothing. A fetch that hits in the I-TLB and the L1I overlaps execution;
/// an I-TLB miss stalls for its walk, an L1I miss for the latency beyond
/// a hit. `None` without an I-TLB or a text segment; `Some` is a page
/// fault on the text page, taken through the ordinary fault path.
fn fetch_instruction(w: &mut World, cpu: CpuId, tid: ThreadId) -> Option<Trap> {
    let ci = cpu.index();
    // Without an I-TLB (flat memory) nothing is fetched.
    w.cpus[ci].itlb.as_ref()?;
    let task = w.threads[tid.0 as usize].task;
    let va = w.tasks[task.0 as usize].text_va()?;
    // A user thread runs with its task's pmap loaded (`sched`).
    let pmap = w.cpus[ci].pmap?;
    match itlb_translate(w, cpu, tid, pmap, va) {
        Ok(pfn) => {
            let pa = (pfn.0 << PAGE_SHIFT) | (va & (PAGE_SIZE - 1));
            let lat = w.mem_access(cpu, pa, AccessKind::IFetch);
            let hit = w
                .memsys
                .as_ref()
                .map_or(0, |m| m.config().l1i.latency_cycles);
            w.cpus[ci].local += Cycles(lat.0.saturating_sub(hit));
            None
        }
        Err(()) => Some(Trap::Fault { va, store: false }),
    }
}

/// Translates the user code address `va` through `cpu`'s I-TLB: a hit
/// checked by the oracle (and, under §6.3's ideal invalidation, against
/// its PTE), or a walk that fills the I-TLB and its PCAM. `Err` is a page
/// fault. Mirrors `translate`'s load path for the D-TLB.
fn itlb_translate(
    w: &mut World,
    cpu: CpuId,
    tid: ThreadId,
    pmap: PmapId,
    va: u64,
) -> Result<mmulab_machine::Pfn, ()> {
    debug_assert!(va < KERNEL_BASE, "only user code is fetched");
    let ci = cpu.index();
    let vpn = Vpn(va >> PAGE_SHIFT);
    let asid = w.pmaps[pmap.0 as usize].asid;
    let itlb = w.cpus[ci].itlb.as_mut().expect("fetch without an I-TLB");
    if let Some(slot) = itlb.lookup(vpn, asid) {
        let e = *itlb.entry(slot);
        if matches!(w.tlb_hw, TlbHardware::Ideal) && ideal_stale(w, cpu, pmap, vpn, &e) {
            w.cpus[ci]
                .itlb
                .as_mut()
                .expect("present")
                .entry_mut(slot)
                .valid = false;
            w.counters.add("ideal.stale_drops", 1);
        } else {
            check_hit(w, cpu, tid, va, &e, false);
            return Ok(e.pfn);
        }
    }
    let entry = walk_for_fill::<true>(w, cpu, pmap, vpn, false, false)?;
    let itlb = w.cpus[ci].itlb.as_mut().expect("present");
    let (slot, _victim) = itlb.insert(entry);
    fill_pcam(w, cpu, crate::memory::ITLB, slot, entry.pte_pa);
    Ok(entry.pfn)
}

/// The oracle's check of a TLB hit used by `tid` at `va`.
#[inline(always)]
fn check_hit(w: &mut World, cpu: CpuId, tid: ThreadId, va: u64, e: &TlbEntry, store: bool) {
    let ctx = UseCtx {
        cpu,
        thread: tid.0,
        va,
        time: w.cpus[cpu.index()].local,
    };
    w.oracle
        .check_use(e.oracle_slot, e.fill_epoch, e.pfn, e.dirty, store, ctx);
}

/// romanescu10 §6.3's check of a TLB hit against its PTE (see
/// `translate`): true when the entry is stale.
fn ideal_stale(w: &World, cpu: CpuId, pmap: PmapId, vpn: Vpn, e: &TlbEntry) -> bool {
    let root = w.walk_root(cpu, pmap);
    let wk = walk(&w.mem, w.cfg.pt_format, root, vpn);
    !(wk.leaf
        && wk.pte.present()
        && wk.pte.pfn() == e.pfn
        && (!e.writable || wk.pte.writable())
        && w.oracle.epoch(e.oracle_slot) == e.fill_epoch)
}

/// A TLB miss, for either TLB: the hardware walker (or, with a
/// software-refilled TLB, the miss handler) reads one entry per level from
/// the directory this CPU's MMU uses (through L1D with caches, §5.2), sets
/// the referenced (and, for a store, modified) bit with a store made before
/// the fill so that its self-snoop cannot hit the new entry (§6.1), and
/// returns the entry to insert, tagged with its PTE's address (§4.1).
/// `Err` is a page fault.
fn walk_for_fill<const MEM: bool>(
    w: &mut World,
    cpu: CpuId,
    pmap: PmapId,
    vpn: Vpn,
    store: bool,
    kernel: bool,
) -> Result<TlbEntry, ()> {
    let ci = cpu.index();
    let root = w.walk_root(cpu, pmap);
    let wk = walk(&w.mem, w.cfg.pt_format, root, vpn);
    let cost = walk_cost::<MEM>(w, cpu, &wk) + refill_trap(w);
    w.cpus[ci].local += cost;
    let pte = wk.pte;
    if !(wk.leaf && pte.present() && (!store || pte.writable()) && (kernel || pte.user())) {
        return Err(());
    }
    let mut new = pte.with(Pte::REFERENCED);
    if store {
        new = new.with(Pte::MODIFIED);
    }
    if new != pte {
        w.mem.table_mut(wk.table)[wk.index] = new.0;
        if MEM {
            let lat = w.pte_store(cpu, wk.pte_pa);
            w.cpus[ci].local += lat;
        }
    }
    let slot = w.oracle.slot(pmap.0, vpn);
    if store && !pte.modified() {
        w.oracle.record_pte(slot, rights_of(new), None);
    }
    Ok(TlbEntry {
        valid: true,
        vpn,
        asid: w.pmaps[pmap.0 as usize].asid,
        global: new.global(),
        pfn: new.pfn(),
        writable: new.writable(),
        user: new.user(),
        dirty: new.modified(),
        oracle_slot: slot,
        fill_epoch: w.oracle.epoch(slot),
        pte_pa: wk.pte_pa,
    })
}
