//! `linux`: romanescu10's baseline, the TLB shootdown of Linux 2.6.15 on
//! i386 (its Fig. 1; `arch/i386/kernel/smp.c`).
//!
//! Initiator, with preemption off and the page-table lock held: edit the
//! PTEs, flush locally, list the victims (the other CPUs whose
//! `cpu_vm_mask` holds the address space: here, the pmap's `in_use`),
//! interrupt them under the global `tlbstate_lock`, and spin until the
//! victim list empties. A victim invalidates, removes itself from the list
//! and resumes (Rosenburg's early acknowledgement).
//!
//! Which events flush whole TLBs (§3), from 2.6.15: `flush_tlb_range` on
//! i386 *is* `flush_tlb_mm`, a full (non-global) flush on initiator and
//! victims, and munmap (`tlb_finish_mmu`), mprotect, fork and exit use it;
//! only a copy-on-write break (`ptep_clear_flush` → `flush_tlb_page`)
//! invalidates the one page (`invlpg`). Kernel unmaps (`vfree`) use
//! `flush_tlb_all`, which flushes global entries as well. The IPIs go out
//! through `send_IPI_mask`: one ICR write for all victims in flat APIC
//! mode, one per victim under bigsmp (`kernel.apic_flat_max_cpus`).
//!
//! On a machine with a memory system, the shootdown's shared state is a
//! cache line of kernel data (`flush_cpumask`, `flush_mm`, `flush_va`, one
//! line of `smp.c`'s .bss): the initiator's stores to it and its last read
//! of the emptied list, and each victim's reads and its locked
//! `cpu_clear`, go through the caches and the coherence protocol, so what
//! the list costs emerges from Table 1's hierarchy rather than a step
//! cost. A victim leaves the list when its clear performs. On flat memory
//! the list is free (the preset's step costs only).
//!
//! On such a machine the rest of the shootdown's kernel memory goes
//! through the caches too, so that its misses and the lines it evicts
//! (cache pollution) emerge rather than being step costs. The victim's
//! interrupt reads its IDT and GDT entries, saves its state on its
//! interrupt stack (the hardware frame and `SAVE_ALL`: two lines), reads
//! its `cpu_tlbstate`, and restores its state from the stack on the way
//! out; it fetches the code of the interrupt stub, `SAVE_ALL`,
//! `smp_invalidate_interrupt` and `ret_from_intr` ([`VICTIM_TEXT`] lines
//! of kernel text through its L1I). The initiator reads the mm's
//! `cpu_vm_mask` and fetches `flush_tlb_mm`, `flush_tlb_others` and the
//! IPI send ([`INITIATOR_TEXT`] lines). Kernel text and data sit in
//! 2.6.15's global large-page mapping of low memory, which a CR3 reload
//! keeps, so they cost no walks (the preset's 2/4 MB TLBs are not
//! modelled). The instructions themselves are the preset's step costs
//! (`ipi_send_cycles` per ICR write, `ipi_dispatch_cycles` and
//! `ipi_return_cycles` around the handler), one cycle each on the
//! paper's in-order Simics cores.
//!
//! `mmap_sem` is a reader/writer semaphore whose waiters sleep (the
//! kernel's reader/writer VM locks, `rw_vm_locks`). A CPU that runs the
//! idle task (its thread sleeps on a lock, or it has none) is in lazy TLB
//! mode (`lazy_tlb`): it keeps the last address space loaded, and a
//! shootdown that reaches it makes it leave instead of flushing
//! (`leave_mm`: out of `cpu_vm_mask`, CR3 loaded with the kernel's
//! tables), so later shootdowns pass it by; `switch_mm` loads the address
//! space again when a thread of it is switched in, and does nothing if
//! the CPU never left.

use std::cell::{Cell, RefCell};

use mmulab_engine::Cycles;
use mmulab_kernel::pmap::{CpuSet, KERNEL_PMAP};
use mmulab_kernel::{Irq, KFuture, PmapId, Protocol, Sim, Update};
use mmulab_machine::{CpuId, Vpn};
use mmulab_memsys::AccessKind::{self, IFetch, Load, Store};

/// Offsets in the shootdown line: `flush_cpumask`, `flush_mm`, `flush_va`.
const MASK: u64 = 0;
const MM: u64 = 8;
const VA: u64 = 16;

const LINE: u64 = 64;
/// Lines of kernel text a victim fetches: the interrupt stub with
/// `SAVE_ALL` (1), `smp_invalidate_interrupt` with its inlined
/// `leave_mm`, `ack_APIC_irq` and `cpu_clear` (3), `ret_from_intr` to
/// `iret` (2). An assumption [A] from the size of 2.6.15's i386 code
/// (about 350 bytes on that path).
pub const VICTIM_TEXT: u64 = 6;
/// Lines of kernel text the initiator fetches beyond munmap's own code:
/// `flush_tlb_mm` (1), `flush_tlb_others` (2), `send_IPI_mask` (1). [A],
/// as above.
pub const INITIATOR_TEXT: u64 = 4;
/// Per-CPU kernel lines: the interrupt stack's two lines of saved state,
/// `cpu_tlbstate`, and the CPU's GDT entries.
const PER_CPU_LINES: u64 = 4;

/// Where the shootdown's kernel memory lives (physical addresses, on a
/// machine with caches): after the victim list's line, in its frame, the
/// code lines, the IDT's line and the mm's line; then [`PER_CPU_LINES`]
/// lines per CPU.
#[derive(Clone, Debug, Default)]
struct Layout {
    /// First line of kernel text (victim's code, then initiator's).
    text: u64,
    idt: u64,
    /// The address space's `cpu_vm_mask` (read by the initiator).
    mm: u64,
    /// Each CPU's first per-CPU line.
    per_cpu: Vec<u64>,
}

/// What the victims are asked to flush (`flush_mm`, `flush_va`).
#[derive(Clone, Copy, Debug)]
struct Request {
    pmap: PmapId,
    /// Some(page): `flush_tlb_page`; None: `FLUSH_ALL`.
    page: Option<Vpn>,
}

pub struct Linux {
    /// `tlbstate_lock`: one shootdown at a time, machine-wide.
    lock: Cell<Option<usize>>,
    /// `flush_cpumask`: victims yet to acknowledge.
    mask: RefCell<CpuSet>,
    request: Cell<Option<Request>>,
    /// Physical address of the line holding `flush_cpumask`, `flush_mm`
    /// and `flush_va` (None on flat memory).
    line: Cell<Option<u64>>,
    /// The rest of the shootdown's kernel memory (empty on flat memory).
    layout: RefCell<Layout>,
    /// Negative control: a CPU in lazy TLB mode acknowledges without
    /// flushing or leaving the address space, so its thread wakes up
    /// with the translations the shootdown removed.
    lazy_skips_flush: bool,
}

impl Linux {
    pub fn new() -> Linux {
        Linux {
            lock: Cell::new(None),
            mask: RefCell::new(CpuSet::new(0)),
            request: Cell::new(None),
            line: Cell::new(None),
            layout: RefCell::new(Layout::default()),
            lazy_skips_flush: false,
        }
    }

    /// The broken handler (`linux-lazy-skips-flush`).
    pub fn lazy_skips_flush() -> Linux {
        Linux {
            lazy_skips_flush: true,
            ..Linux::new()
        }
    }

    /// `cpu`'s accesses to the shootdown line, in order; returns their
    /// latency (none on flat memory).
    fn touch_line(&self, sim: &Sim, cpu: CpuId, accesses: &[(u64, AccessKind)]) -> Cycles {
        let Some(pa) = self.line.get() else {
            return Cycles(0);
        };
        let mut w = sim.w();
        accesses.iter().fold(Cycles(0), |c, &(off, kind)| {
            c + w.mem_access(cpu, pa + off, kind)
        })
    }

    /// `cpu`'s accesses to kernel memory at physical addresses `pas`, in
    /// order; returns their latency (none on flat memory).
    fn touch(&self, sim: &Sim, cpu: CpuId, pas: &[(u64, AccessKind)]) -> Cycles {
        if self.line.get().is_none() {
            return Cycles(0);
        }
        let mut w = sim.w();
        pas.iter()
            .fold(Cycles(0), |c, &(pa, kind)| c + w.mem_access(cpu, pa, kind))
    }

    /// The victim's interrupt entry: IDT and GDT reads, the state save on
    /// its interrupt stack, the stub's and handler's code, its
    /// `cpu_tlbstate`.
    fn victim_entry(&self, sim: &Sim, cpu: CpuId) -> Cycles {
        let l = self.layout.borrow();
        let Some(&pc) = l.per_cpu.get(cpu.index()) else {
            return Cycles(0);
        };
        let mut v = vec![
            (l.idt, Load),
            (pc + 3 * LINE, Load),
            (pc, Store),
            (pc + LINE, Store),
        ];
        v.extend((0..4).map(|i| (l.text + i * LINE, IFetch)));
        v.push((pc + 2 * LINE, Load));
        drop(l);
        self.touch(sim, cpu, &v)
    }

    /// The victim's way out: `ret_from_intr`'s code and the state restored
    /// from the stack.
    fn victim_exit(&self, sim: &Sim, cpu: CpuId) -> Cycles {
        let l = self.layout.borrow();
        let Some(&pc) = l.per_cpu.get(cpu.index()) else {
            return Cycles(0);
        };
        let v = [
            (l.text + 4 * LINE, IFetch),
            (l.text + 5 * LINE, IFetch),
            (pc, Load),
            (pc + LINE, Load),
        ];
        drop(l);
        self.touch(sim, cpu, &v)
    }

    /// The initiator's code beyond munmap's and its read of `cpu_vm_mask`.
    fn initiator_code(&self, sim: &Sim, cpu: CpuId) -> Cycles {
        let l = self.layout.borrow();
        if l.per_cpu.is_empty() {
            return Cycles(0);
        }
        let mut v: Vec<(u64, AccessKind)> = (0..INITIATOR_TEXT)
            .map(|i| (l.text + (VICTIM_TEXT + i) * LINE, IFetch))
            .collect();
        v.push((l.mm, Load));
        drop(l);
        self.touch(sim, cpu, &v)
    }

    /// Flushes `cpu`'s TLB as the request says; returns the cost.
    fn flush(sim: &Sim, cpu: CpuId, r: Request) -> Cycles {
        match r.page {
            Some(vpn) => sim.tlb_invalidate_range(cpu, r.pmap, vpn, 1, 1),
            // Kernel mappings are global: `flush_tlb_all` (vfree and the
            // like) flushes them too.
            None if r.pmap == KERNEL_PMAP => sim.tlb_flush(cpu),
            None => sim.tlb_flush_user(cpu),
        }
    }
}

impl Default for Linux {
    fn default() -> Self {
        Linux::new()
    }
}

impl Protocol for Linux {
    fn name(&self) -> &'static str {
        if self.lazy_skips_flush {
            "linux-lazy-skips-flush"
        } else {
            "linux"
        }
    }

    /// Linux 2.6.15's `mmap_sem` is a reader/writer semaphore: page faults
    /// take it as readers (in parallel), munmap, mprotect, mmap and fork as
    /// writers, and waiters sleep. Faults on one page are then serialised
    /// by the page (`lock_page`, the PTE lock's re-check). The kernel's
    /// reader/writer VM locks (shared with SVR4.2) are that discipline.
    fn rw_vm_locks(&self) -> bool {
        true
    }

    /// 2.6.15's `enter_lazy_tlb`: the idle task borrows the last address
    /// space (`active_mm`), and `smp_invalidate_interrupt` makes a lazy
    /// CPU `leave_mm`.
    fn lazy_tlb(&self) -> bool {
        true
    }

    fn init(&self, sim: &Sim) {
        self.lock.set(Some(sim.new_lock()));
        *self.mask.borrow_mut() = CpuSet::new(sim.w().cpus.len());
        let line = sim.w().alloc_kernel_data();
        self.line.set(line);
        if let Some(list) = line {
            // In the list's frame: the code, the IDT's line, the mm's line.
            let text = list + LINE;
            let idt = text + (VICTIM_TEXT + INITIATOR_TEXT) * LINE;
            let mm = idt + LINE;
            let cpus = sim.w().cpus.len();
            let per_frame = (mmulab_kernel::sim::PAGE_SIZE / (PER_CPU_LINES * LINE)) as usize;
            let mut per_cpu = Vec::with_capacity(cpus);
            let mut frame = 0;
            for i in 0..cpus {
                if i % per_frame == 0 {
                    frame = sim
                        .w()
                        .alloc_kernel_data()
                        .expect("a machine with caches has kernel data frames");
                }
                per_cpu.push(frame + ((i % per_frame) as u64) * PER_CPU_LINES * LINE);
            }
            *self.layout.borrow_mut() = Layout {
                text,
                idt,
                mm,
                per_cpu,
            };
        }
    }

    fn update<'a>(&'a self, sim: &'a Sim, me: CpuId, u: Update) -> KFuture<'a> {
        Box::pin(async move {
            let costs = sim.costs();
            let start = sim.now();
            sim.lock_pmap(me, u.pmap).await;
            let edit = sim.w().pt_apply(me, &u);
            let c = Cycles(costs.pte_write_cycles * edit.changed) + edit.mem_cycles;
            sim.delay(me, c).await;
            let cow = sim.current_op_is(me, "cow break");
            let r = Request {
                pmap: u.pmap,
                page: (cow && u.pages == 1).then_some(u.start),
            };
            let (here, victims) = {
                let w = sim.w();
                let in_use = &w.pmaps[u.pmap.0 as usize].in_use;
                let victims: Vec<CpuId> = in_use
                    .iter()
                    .filter(|&c| c != me && w.is_online(c))
                    .collect();
                (in_use.contains(me), victims)
            };
            if here {
                let f = Linux::flush(sim, me, r);
                sim.delay(me, f).await;
            }
            if !victims.is_empty() && edit.changed > 0 {
                let c = self.initiator_code(sim, me);
                sim.delay(me, c).await;
                let lock = self.lock.get().expect("initialised");
                sim.lock(me, lock).await;
                // flush_mm = mm; flush_va = va; atomic_set_mask(cpumask,
                // &flush_cpumask) (a locked or)
                let c = self.touch_line(
                    sim,
                    me,
                    &[(MM, Store), (VA, Store), (MASK, Load), (MASK, Store)],
                );
                sim.delay(me, c).await;
                self.request.set(Some(r));
                {
                    let mut m = self.mask.borrow_mut();
                    for &v in &victims {
                        m.insert(v);
                    }
                }
                sim.send_ipi_mask(me, &victims, Irq::Shootdown).await;
                sim.spin_until(me, "linux initiator: victim list empty", |_| {
                    self.mask.borrow().is_empty()
                })
                .await;
                // the read that finds the list empty (the last victim's
                // clear took the line), then flush_mm = NULL; flush_va = 0
                let c = self.touch_line(sim, me, &[(MASK, Load), (MM, Store), (VA, Store)]);
                sim.delay(me, c).await;
                self.request.set(None);
                sim.unlock(me, lock).await;
                sim.count("shootdown.user.events", 1);
                sim.record(
                    "shootdown.user.initiator_cycles",
                    (sim.now() - start).0 as f64,
                );
                sim.record("shootdown.user.processors", victims.len() as f64);
            }
            sim.unlock_pmap(me, u.pmap).await;
        })
    }

    /// `smp_invalidate_interrupt`: invalidate, leave the list, resume.
    fn interrupt<'a>(&'a self, sim: &'a Sim, me: CpuId) -> KFuture<'a> {
        Box::pin(async move {
            let start = sim.now();
            let c = self.victim_entry(sim, me);
            sim.delay(me, c).await;
            self.handle(sim, me, start).await;
            let c = self.victim_exit(sim, me);
            sim.delay(me, c).await;
        })
    }
}

impl Linux {
    /// `smp_invalidate_interrupt` itself, between the entry and the exit.
    async fn handle(&self, sim: &Sim, me: CpuId, start: Cycles) {
        {
            // cpu_isset(cpu, flush_cpumask), then flush_mm and flush_va
            let c = self.touch_line(sim, me, &[(MASK, Load), (MM, Load), (VA, Load)]);
            sim.delay(me, c).await;
            // (read after the loads: what they found)
            let Some(r) = self.request.get() else {
                return;
            };
            if !self.mask.borrow().contains(me) {
                return;
            }
            let loaded = sim.w().pmaps[r.pmap.0 as usize].in_use.contains(me);
            if loaded && r.pmap != KERNEL_PMAP && sim.runs_idle_task(me) {
                // Lazy TLB mode (the CPU runs the idle task: its thread
                // sleeps on a lock, or it has none): `leave_mm` instead
                // of the flush, so that later shootdowns of this address
                // space pass it by.
                if self.lazy_skips_flush {
                    sim.count("linux.lazy_skipped_flush", 1);
                } else {
                    let sleeping = sim.lock_sleeping(me);
                    let f = sim.leave_mm_lazily(me, r.pmap);
                    sim.count(
                        if sleeping {
                            "linux.lazy_leave_mm"
                        } else {
                            "linux.idle_leave_mm"
                        },
                        1,
                    );
                    sim.delay(me, f).await;
                }
            } else if loaded {
                let f = Linux::flush(sim, me, r);
                sim.delay(me, f).await;
            }
            // cpu_clear(cpu, flush_cpumask): a locked bit clear, seen by
            // the initiator once it performs
            let c = self.touch_line(sim, me, &[(MASK, Load), (MASK, Store)]);
            sim.delay(me, c).await;
            self.mask.borrow_mut().remove(me);
            sim.record(
                "shootdown.user.responder_cycles",
                (sim.now() - start).0 as f64,
            );
        }
    }
}
