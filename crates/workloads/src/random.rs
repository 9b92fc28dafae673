//! The randomized correctness workload of `mmulab check`: several tasks,
//! each with several threads sharing its address space, doing random
//! references, mmap/munmap, mprotect down and back up, fork with
//! copy-on-write, migrations, sleeps (idle CPUs), and kernel memory
//! allocation and frees (kernel-pmap shootdowns) while other threads touch
//! the same kernel buffers. Every draw comes from the thread's own seeded
//! stream. Faults on memory another thread just unmapped or protected are
//! expected and ignored; the oracle is the judge.

use std::cell::RefCell;
use std::rc::Rc;

use mmulab_kernel::{Op, Program, Prot, RefKind, Refs, Sim, Syscall, ThreadCtx};
use mmulab_machine::CpuId;
use serde::{Deserialize, Serialize};

use crate::{Demand, Workload, WorkloadReport, add, mul, verdict};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomSpec {
    #[serde(default = "RandomSpec::default_tasks")]
    pub tasks: usize,
    #[serde(default = "RandomSpec::default_threads")]
    pub threads_per_task: usize,
    /// Operations each thread performs before it exits.
    #[serde(default = "RandomSpec::default_steps")]
    pub steps: u64,
    /// Largest region mapped at once, in pages.
    #[serde(default = "RandomSpec::default_pages")]
    pub max_region_pages: u64,
    #[serde(default = "yes")]
    pub fork: bool,
    #[serde(default = "yes")]
    pub kmem: bool,
    #[serde(default = "yes")]
    pub migrate: bool,
    #[serde(default = "yes")]
    pub sleep: bool,
    /// Threads take their CPU offline now and then and bring it back
    /// (balan92 hat_offline/hat_online); default false.
    #[serde(default)]
    pub hotplug: bool,
    /// Threads now and then unload every translation of one of their
    /// pages (page stealing's `hat_pageunload`); default false.
    #[serde(default)]
    pub page_unload: bool,
}

fn yes() -> bool {
    true
}

impl Default for RandomSpec {
    fn default() -> Self {
        RandomSpec {
            tasks: 3,
            threads_per_task: 3,
            steps: 80,
            max_region_pages: 8,
            fork: true,
            kmem: true,
            migrate: true,
            sleep: true,
            hotplug: false,
            page_unload: false,
        }
    }
}

impl RandomSpec {
    fn default_tasks() -> usize {
        3
    }
    fn default_threads() -> usize {
        3
    }
    fn default_steps() -> u64 {
        80
    }
    fn default_pages() -> u64 {
        8
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if self.hotplug && cpus < 2 {
            // balan92 hat_offline: the last online CPU never goes offline,
            // so on one CPU every offline would be the last one's.
            return Err(format!(
                "workload.hotplug: offlining the last CPU is refused, and this machine has {cpus} CPU; hotplug needs at least 2 (machine.cpus)"
            ));
        }
        if self.tasks == 0 {
            return Err("workload.tasks: must be at least 1".into());
        }
        if self.threads_per_task == 0 {
            return Err("workload.threads_per_task: must be at least 1".into());
        }
        if self.max_region_pages == 0 {
            return Err("workload.max_region_pages: must be at least 1".into());
        }
        Ok(())
    }

    /// Every step may map a region of up to `max_region_pages` and touch
    /// at most 320 of its pages (a reference run is 20 to 319 references).
    /// What a thread holds depends on its draws (regions are unmapped
    /// too): the bound `steps` × 320 pages would refuse `mmulab check`'s
    /// own specs, so the pages counted are those every thread's largest
    /// region needs, the least that must fit; a run whose draws do exhaust
    /// memory stops with a named failure. The kernel walks a region page
    /// by page when it maps, protects or unmaps it, so a step's work
    /// counts its region's pages, and a fork's child runs 10 more steps.
    pub fn demand(&self, _cpus: usize) -> Demand {
        const TOUCHED_PER_STEP: u64 = 320;
        let threads = mul(&[self.tasks as u64, self.threads_per_task as u64]);
        let per_step = self.max_region_pages.min(TOUCHED_PER_STEP);
        let forks = if self.fork { 2 } else { 1 };
        let pages = mul(&[threads, per_step]);
        // The key furthest above its default drives the size.
        let d = RandomSpec::default();
        let ratio = |v: u64, dflt: u64| v as f64 / dflt as f64;
        let pages_key = [
            ("tasks", ratio(self.tasks as u64, d.tasks as u64)),
            (
                "threads_per_task",
                ratio(self.threads_per_task as u64, d.threads_per_task as u64),
            ),
            ("steps", ratio(self.steps, d.steps)),
            (
                "max_region_pages",
                ratio(self.max_region_pages, d.max_region_pages),
            ),
        ]
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _)| k)
        .expect("keys");
        Demand {
            pages,
            pages_key,
            // A task's threads map into one address space: one region
            // each at least.
            vpages: mul(&[
                self.threads_per_task as u64,
                add(&[self.max_region_pages, 1]),
            ]),
            vpages_key: "max_region_pages",
            threads,
            threads_key: "threads_per_task",
            // A fork is drawn on 4 % of the steps.
            spawned: add(&[threads, mul(&[threads, self.steps]) / 25]),
            spawned_key: pages_key,
            work: mul(&[
                threads,
                self.steps,
                add(&[TOUCHED_PER_STEP, self.max_region_pages]),
                forks,
            ]),
            work_key: pages_key,
        }
    }
}

#[derive(Default)]
struct Global {
    /// CPUs of the machine (migration targets).
    cpus: u64,
    kmem: Vec<(u64, u64)>,
    finished: u64,
    started: u64,
    segv: u64,
}

type Regions = Rc<RefCell<Vec<(u64, u64)>>>;

pub struct Random {
    spec: RandomSpec,
    global: Rc<RefCell<Global>>,
}

impl Random {
    pub fn new(spec: RandomSpec) -> Random {
        Random {
            spec,
            global: Rc::default(),
        }
    }
}

impl Workload for Random {
    fn start(&mut self, sim: &Sim) {
        self.global.borrow_mut().cpus = sim.w().cpus.len() as u64;
        for _ in 0..self.spec.tasks {
            let task = sim.create_task();
            let regions: Regions = Rc::default();
            for i in 0..self.spec.threads_per_task {
                let t = Thread::new(&self.spec, &self.global, regions.clone(), i == 0);
                sim.spawn_thread(task, Box::new(t), None);
            }
        }
    }

    fn report(&self) -> WorkloadReport {
        let g = self.global.borrow();
        let mut r = WorkloadReport {
            name: "random".into(),
            // The workload's own check is liveness: every thread it started
            // ran all its steps. Consistency is the oracle's verdict.
            verdict: verdict(g.finished == g.started),
            ..Default::default()
        };
        r.figures.insert("threads_started".into(), g.started as f64);
        r.figures
            .insert("threads_finished".into(), g.finished as f64);
        r.figures.insert("segv_ignored".into(), g.segv as f64);
        r
    }
}

enum Pending {
    None,
    Mapped(u64),
    KmemAllocated(u64),
}

struct Thread {
    spec: RandomSpec,
    global: Rc<RefCell<Global>>,
    regions: Regions,
    may_fork: bool,
    steps: u64,
    pending: Pending,
    restore: Option<(u64, u64)>,
    hotplug: Option<Hotplug>,
}

/// A CPU offline/online cycle in progress.
#[derive(Clone, Copy)]
enum Hotplug {
    /// `CpuOffline` was issued; its return value says which CPU.
    Offlined,
    /// Bring this CPU back.
    Online(u64),
}

impl Thread {
    fn new(
        spec: &RandomSpec,
        global: &Rc<RefCell<Global>>,
        regions: Regions,
        may_fork: bool,
    ) -> Thread {
        global.borrow_mut().started += 1;
        Thread {
            spec: spec.clone(),
            global: global.clone(),
            regions,
            may_fork,
            steps: 0,
            pending: Pending::None,
            restore: None,
            hotplug: None,
        }
    }

    fn pick(&self, ctx: &mut ThreadCtx<'_>, kernel: bool) -> Option<(u64, u64)> {
        let list = if kernel {
            self.global.borrow().kmem.clone()
        } else {
            self.regions.borrow().clone()
        };
        if list.is_empty() {
            return None;
        }
        Some(*ctx.rng.pick(&list))
    }
}

const PAGE: u64 = 4096;

impl Program for Thread {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        if ctx.fault.take().is_some() {
            self.global.borrow_mut().segv += 1;
        }
        match std::mem::replace(&mut self.pending, Pending::None) {
            Pending::Mapped(pages) => self.regions.borrow_mut().push((ctx.ret, pages)),
            Pending::KmemAllocated(pages) => self.global.borrow_mut().kmem.push((ctx.ret, pages)),
            Pending::None => {}
        }
        if let Some((va, pages)) = self.restore.take() {
            return Op::Syscall(Syscall::Mprotect {
                va,
                pages,
                prot: Prot::ReadWrite,
            });
        }
        match self.hotplug.take() {
            Some(Hotplug::Offlined) if ctx.ret != u64::MAX => {
                self.hotplug = Some(Hotplug::Online(ctx.ret));
                return Op::Compute(1000 + ctx.rng.below(20_000));
            }
            Some(Hotplug::Online(cpu)) => {
                return Op::Syscall(Syscall::CpuOnline {
                    cpu: CpuId(cpu as u16),
                });
            }
            _ => {}
        }
        if self.steps >= self.spec.steps {
            self.global.borrow_mut().finished += 1;
            return Op::Exit;
        }
        self.steps += 1;
        let roll = ctx.rng.below(100);
        match roll {
            0..=44 => {
                let kernel = self.spec.kmem && ctx.rng.chance(0.25);
                let Some((va, pages)) = self.pick(ctx, kernel) else {
                    let pages = 1 + ctx.rng.below(self.spec.max_region_pages);
                    self.pending = Pending::Mapped(pages);
                    return Op::Syscall(Syscall::Mmap {
                        pages,
                        prot: Prot::ReadWrite,
                    });
                };
                let stride = *ctx.rng.pick(&[8u64, 64, 512, 4096]);
                let kind = match ctx.rng.below(3) {
                    0 => RefKind::Load,
                    1 => RefKind::Store(ctx.thread.0 as u64),
                    _ => RefKind::Increment,
                };
                let start = ctx.rng.below(pages * PAGE / 8) * 8;
                let count = 20 + ctx.rng.below(300);
                Op::Refs(Refs {
                    base: va,
                    start,
                    stride,
                    count,
                    wrap: pages * PAGE,
                    kind,
                })
            }
            45..=54 => {
                let pages = 1 + ctx.rng.below(self.spec.max_region_pages);
                self.pending = Pending::Mapped(pages);
                Op::Syscall(Syscall::Mmap {
                    pages,
                    prot: Prot::ReadWrite,
                })
            }
            55..=61 => {
                let mut regions = self.regions.borrow_mut();
                if regions.is_empty() {
                    return Op::Compute(100);
                }
                let i = ctx.rng.below(regions.len() as u64) as usize;
                let (va, pages) = regions.swap_remove(i);
                Op::Syscall(Syscall::Munmap { va, pages })
            }
            62..=73 => {
                let Some((va, pages)) = self.pick(ctx, false) else {
                    return Op::Compute(100);
                };
                let first = ctx.rng.below(pages);
                let n = 1 + ctx.rng.below(pages - first);
                let prot = if ctx.rng.chance(0.7) {
                    Prot::Read
                } else {
                    Prot::None
                };
                self.restore = Some((va + first * PAGE, n));
                Op::Syscall(Syscall::Mprotect {
                    va: va + first * PAGE,
                    pages: n,
                    prot,
                })
            }
            74..=77 if self.spec.fork && self.may_fork => {
                let child_regions: Regions = Rc::new(RefCell::new(self.regions.borrow().clone()));
                let mut child = Thread::new(&self.spec, &self.global, child_regions, false);
                child.steps = self.spec.steps.saturating_sub(10);
                child.spec.kmem = false;
                Op::Syscall(Syscall::Fork {
                    child: Box::new(child),
                })
            }
            78..=82 if self.spec.migrate => {
                // Any CPU, or one drawn from the machine's.
                let cpus = self.global.borrow().cpus.max(1);
                let cpu = if ctx.rng.chance(0.5) {
                    None
                } else {
                    Some(CpuId(ctx.rng.below(cpus) as u16))
                };
                Op::Syscall(Syscall::Migrate { cpu })
            }
            83..=87 if self.spec.sleep => Op::Sleep(500 + ctx.rng.below(20_000)),
            96..=99 if self.spec.hotplug => {
                self.hotplug = Some(Hotplug::Offlined);
                Op::Syscall(Syscall::CpuOffline)
            }
            88..=95 if self.spec.page_unload && ctx.rng.chance(0.5) => {
                let Some((va, pages)) = self.pick(ctx, false) else {
                    return Op::Compute(100);
                };
                let va = va + ctx.rng.below(pages) * PAGE;
                Op::Syscall(Syscall::Pageout(
                    mmulab_kernel::pageout::PageoutCall::PageUnload { va },
                ))
            }
            88..=95 if self.spec.kmem => {
                let free = ctx.rng.chance(0.5);
                let mut g = self.global.borrow_mut();
                if free && !g.kmem.is_empty() {
                    let i = ctx.rng.below(g.kmem.len() as u64) as usize;
                    let (va, pages) = g.kmem.swap_remove(i);
                    Op::Syscall(Syscall::KmemFree { va, pages })
                } else {
                    let pages = 1 + ctx.rng.below(4);
                    self.pending = Pending::KmemAllocated(pages);
                    Op::Syscall(Syscall::KmemAlloc {
                        pages,
                        wired: ctx.rng.chance(0.5),
                    })
                }
            }
            _ => Op::Compute(50 + ctx.rng.below(2000)),
        }
    }
}
