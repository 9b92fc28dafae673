//! balan92's measurement programs (§Shutdown Measurements):
//!
//! * `balan92-shootdown`: the kernel-level shootdown tests. One thread per
//!   CPU in one address space; the others spin in user mode while the
//!   first, on CPU 0, takes `samples` measurements of either
//!   `hat_shutdown(HAT_NOCOOKIE)` (Fig. 1, `basic`),
//!   `hat_shutdown(hat_getshootcookie())` with a cookie at least as new as
//!   every CPU's (Fig. 2, `lazy`), or the unmap of one previously mapped
//!   and touched page (Fig. 3, `immediate`: "the parent unmapped a
//!   previously mapped page ... the initiator touches only one page table
//!   entry").
//! * `kmem-churn`: "a kernel level test that allocates and frees kernel
//!   memory repeatedly in different sizes" (the segkmem measurement); with
//!   `threads > 1` the threads also touch each other's allocations, which
//!   is what `mmulab check` uses to exercise lazy kernel shootdowns.

use std::cell::RefCell;
use std::rc::Rc;

use mmulab_kernel::{Op, Program, Prot, RefKind, Refs, Sim, Syscall, ThreadCtx};
use mmulab_machine::CpuId;
use serde::{Deserialize, Serialize};

use crate::{Workload, WorkloadReport, verdict};

const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShootdownMode {
    /// `hat_shutdown(HAT_NOCOOKIE)`: balan92 Fig. 1.
    Basic,
    /// The lazy algorithm with a cookie newer than every CPU: Fig. 2.
    Lazy,
    /// The immediate algorithm, one PTE unmapped: Fig. 3.
    Immediate,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShootdownSpec {
    pub mode: ShootdownMode,
    /// Measurements taken (balan92: "Ten samples of each measurement").
    #[serde(default = "ShootdownSpec::default_samples")]
    pub samples: u64,
    /// Time for the spinning threads to start before the first sample.
    #[serde(default = "ShootdownSpec::default_warmup")]
    pub warmup_cycles: u64,
    /// Time between samples.
    #[serde(default = "ShootdownSpec::default_gap")]
    pub gap_cycles: u64,
    /// Pages mapped, touched and unmapped per sample (`immediate`; the
    /// paper's test unmaps one; larger ranges are the L1 trick's ablation).
    #[serde(default = "ShootdownSpec::default_pages")]
    pub pages: u64,
    /// Of those, the first this many are touched (a sparse range, for the
    /// mapping-chunk ablation); 0 = all.
    #[serde(default)]
    pub touch_pages: u64,
}

impl ShootdownSpec {
    fn default_samples() -> u64 {
        10
    }
    fn default_warmup() -> u64 {
        100_000
    }
    fn default_gap() -> u64 {
        20_000
    }
    fn default_pages() -> u64 {
        1
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if self.samples == 0 {
            return Err("workload.samples: must be at least 1".into());
        }
        if self.pages == 0 {
            return Err("workload.pages: must be at least 1".into());
        }
        if cpus < 2 {
            return Err(format!(
                "workload.mode: a shootdown needs at least 2 CPUs, machine.cpus is {cpus}"
            ));
        }
        Ok(())
    }
}

pub struct Shootdown {
    spec: ShootdownSpec,
    done: Rc<RefCell<bool>>,
    taken: Rc<RefCell<u64>>,
}

impl Shootdown {
    pub fn new(spec: ShootdownSpec) -> Shootdown {
        Shootdown {
            spec,
            done: Rc::default(),
            taken: Rc::default(),
        }
    }
}

impl Workload for Shootdown {
    fn start(&mut self, sim: &Sim) {
        let cpus = sim.w().cpus.len();
        let task = sim.create_task();
        let spec = self.spec.clone();
        let done = self.done.clone();
        let taken = self.taken.clone();
        let mut step = 0u64;
        let mut page = 0u64;
        let initiator = mmulab_kernel::program::FnProgram(move |ctx: &mut ThreadCtx<'_>| {
            step += 1;
            if step == 1 {
                return Op::Compute(spec.warmup_cycles);
            }
            let sample = *taken.borrow();
            if sample >= spec.samples {
                *done.borrow_mut() = true;
                return Op::Exit;
            }
            match spec.mode {
                ShootdownMode::Basic | ShootdownMode::Lazy => {
                    if step.is_multiple_of(2) {
                        *taken.borrow_mut() += 1;
                        Op::Syscall(Syscall::HatShutdown {
                            nocookie: spec.mode == ShootdownMode::Basic,
                        })
                    } else {
                        Op::Compute(spec.gap_cycles)
                    }
                }
                // map, touch, unmap, wait.
                ShootdownMode::Immediate => match step % 4 {
                    2 => Op::Syscall(Syscall::Mmap {
                        pages: spec.pages,
                        prot: Prot::ReadWrite,
                    }),
                    3 => {
                        page = ctx.ret;
                        Op::Refs(Refs {
                            base: page,
                            start: 0,
                            stride: PAGE,
                            count: if spec.touch_pages == 0 {
                                spec.pages
                            } else {
                                spec.touch_pages.min(spec.pages)
                            },
                            wrap: 0,
                            kind: RefKind::Store(1),
                        })
                    }
                    0 => {
                        *taken.borrow_mut() += 1;
                        Op::Syscall(Syscall::Munmap {
                            va: page,
                            pages: spec.pages,
                        })
                    }
                    _ => Op::Compute(spec.gap_cycles),
                },
            }
        });
        sim.spawn_thread(task, Box::new(initiator), Some(CpuId(0)));
        for c in 1..cpus {
            let done = self.done.clone();
            let spinner = mmulab_kernel::program::FnProgram(move |_: &mut ThreadCtx<'_>| {
                if *done.borrow() {
                    Op::Exit
                } else {
                    Op::Compute(1000)
                }
            });
            sim.spawn_thread(task, Box::new(spinner), Some(CpuId(c as u16)));
        }
    }

    fn report(&self) -> WorkloadReport {
        let mut r = WorkloadReport {
            name: "balan92-shootdown".into(),
            verdict: verdict(*self.taken.borrow() == self.spec.samples),
            ..Default::default()
        };
        r.figures
            .insert("samples".into(), *self.taken.borrow() as f64);
        r
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KmemChurnSpec {
    /// Threads, one bound to each of the first `threads` CPUs.
    #[serde(default = "KmemChurnSpec::default_threads")]
    pub threads: usize,
    /// Allocations each thread makes before it frees what it holds and
    /// exits.
    #[serde(default = "KmemChurnSpec::default_allocations")]
    pub allocations: u64,
    /// Largest allocation in pages; sizes are 1, 2, 4, ... pages with
    /// halving probability (mixed sizes, small ones most common).
    #[serde(default = "KmemChurnSpec::default_max_pages")]
    pub max_pages: u64,
    /// Allocations a thread holds at most.
    #[serde(default = "KmemChurnSpec::default_live")]
    pub live: usize,
    /// Threads touch allocations (their own and others').
    #[serde(default)]
    pub touch: bool,
}

impl KmemChurnSpec {
    fn default_threads() -> usize {
        1
    }
    fn default_allocations() -> u64 {
        2000
    }
    fn default_max_pages() -> u64 {
        4
    }
    fn default_live() -> usize {
        16
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if self.threads == 0 || self.threads > cpus {
            return Err(format!(
                "workload.threads: must be 1 to machine.cpus ({cpus}), got {}",
                self.threads
            ));
        }
        if self.max_pages == 0 {
            return Err("workload.max_pages: must be at least 1".into());
        }
        if self.live == 0 {
            return Err("workload.live: must be at least 1".into());
        }
        Ok(())
    }
}

#[derive(Default)]
struct ChurnShared {
    /// Live allocations anyone may touch: (va, pages).
    published: Vec<(u64, u64)>,
    finished: usize,
    allocations: u64,
}

pub struct KmemChurn {
    spec: KmemChurnSpec,
    shared: Rc<RefCell<ChurnShared>>,
}

impl KmemChurn {
    pub fn new(spec: KmemChurnSpec) -> KmemChurn {
        KmemChurn {
            spec,
            shared: Rc::default(),
        }
    }
}

struct ChurnThread {
    spec: KmemChurnSpec,
    shared: Rc<RefCell<ChurnShared>>,
    own: Vec<(u64, u64)>,
    made: u64,
    pending: Option<u64>,
}

impl ChurnThread {
    fn size(&self, ctx: &mut ThreadCtx<'_>) -> u64 {
        let mut pages = 1;
        while pages * 2 <= self.spec.max_pages && ctx.rng.chance(0.5) {
            pages *= 2;
        }
        pages
    }

    fn free_one(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        let i = ctx.rng.below(self.own.len() as u64) as usize;
        let (va, pages) = self.own.swap_remove(i);
        let mut s = self.shared.borrow_mut();
        if let Some(j) = s.published.iter().position(|&(v, _)| v == va) {
            s.published.swap_remove(j);
        }
        Op::Syscall(Syscall::KmemFree { va, pages })
    }
}

impl Program for ChurnThread {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        ctx.fault = None;
        if let Some(pages) = self.pending.take() {
            self.own.push((ctx.ret, pages));
            self.shared.borrow_mut().published.push((ctx.ret, pages));
        }
        if self.made >= self.spec.allocations {
            if self.own.is_empty() {
                self.shared.borrow_mut().finished += 1;
                return Op::Exit;
            }
            return self.free_one(ctx);
        }
        let roll = ctx.rng.below(100);
        if roll < 45 && self.own.len() < self.spec.live {
            let pages = self.size(ctx);
            self.made += 1;
            self.shared.borrow_mut().allocations += 1;
            self.pending = Some(pages);
            return Op::Syscall(Syscall::KmemAlloc { pages, wired: true });
        }
        if roll < 80 && !self.own.is_empty() {
            return self.free_one(ctx);
        }
        let pick = {
            let s = self.shared.borrow();
            (self.spec.touch && !s.published.is_empty()).then(|| *ctx.rng.pick(&s.published))
        };
        match pick {
            Some((va, pages)) => Op::Refs(Refs {
                base: va,
                start: ctx.rng.below(pages * PAGE / 8) * 8,
                stride: *ctx.rng.pick(&[8u64, 512, 4096]),
                count: 10 + ctx.rng.below(100),
                wrap: pages * PAGE,
                kind: if ctx.rng.chance(0.5) {
                    RefKind::Load
                } else {
                    RefKind::Increment
                },
            }),
            None => Op::Compute(100 + ctx.rng.below(1000)),
        }
    }
}

impl Workload for KmemChurn {
    fn start(&mut self, sim: &Sim) {
        let task = sim.create_task();
        for c in 0..self.spec.threads {
            let t = ChurnThread {
                spec: self.spec.clone(),
                shared: self.shared.clone(),
                own: Vec::new(),
                made: 0,
                pending: None,
            };
            sim.spawn_thread(task, Box::new(t), Some(CpuId(c as u16)));
        }
    }

    fn report(&self) -> WorkloadReport {
        let s = self.shared.borrow();
        let mut r = WorkloadReport {
            name: "kmem-churn".into(),
            verdict: verdict(s.finished == self.spec.threads),
            ..Default::default()
        };
        r.figures.insert("allocations".into(), s.allocations as f64);
        r
    }
}
