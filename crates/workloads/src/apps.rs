//! Stand-ins for black89's evaluation applications (§5.2), labelled as
//! such: the paper's programs cannot run here, so each keeps the memory
//! behaviour the paper says caused its shootdowns.
//!
//! * `kbuild` — "parallel build of the kernel from sources": a `make`
//!   process forks short-lived single-threaded compiler processes; each
//!   maps and touches memory and churns kernel allocations (pageable kernel
//!   memory of which only part is touched), then exits. Kernel-pmap
//!   shootdowns; no user ones (no memory shared between tasks, §5.2).
//! * `parthenon` — a 15-way parallel program whose threads are created
//!   with cthreads stacks: a large stack region, the first page used, the
//!   second reprotected to no access as a guard (§7.2). The guard page is
//!   never touched, so lazy evaluation skips its shootdown.
//! * `camelot` — an 8-way multi-threaded task sharing memory and
//!   reprotecting pages of it (user-pmap shootdowns among its threads).

use std::cell::RefCell;
use std::rc::Rc;

use mmulab_kernel::{Op, Program, Prot, RefKind, Refs, Sim, Syscall, ThreadCtx};
use serde::{Deserialize, Serialize};

use crate::{Demand, Workload, WorkloadReport, add, mul, verdict};

const PAGE: u64 = 4096;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KbuildSpec {
    /// Compiler processes run at once (make -j).
    #[serde(default = "KbuildSpec::default_jobs")]
    pub jobs: usize,
    /// Compiler processes in all.
    #[serde(default = "KbuildSpec::default_processes")]
    pub processes: usize,
    /// Kernel allocations each process makes and frees.
    #[serde(default = "KbuildSpec::default_kmem")]
    pub kmem_per_process: u64,
    /// Pages per kernel allocation.
    #[serde(default = "KbuildSpec::default_kmem_pages")]
    pub kmem_pages: u64,
    /// Probability that a process touches (and so maps) a kernel allocation.
    #[serde(default = "KbuildSpec::default_touch")]
    pub kmem_touch_probability: f64,
    /// User pages each process maps and touches.
    #[serde(default = "KbuildSpec::default_user_pages")]
    pub user_pages: u64,
    /// Compute between kernel calls (cycles).
    #[serde(default = "KbuildSpec::default_compute")]
    pub compute_cycles: u64,
}

impl KbuildSpec {
    fn default_jobs() -> usize {
        12
    }
    fn default_processes() -> usize {
        48
    }
    fn default_kmem() -> u64 {
        12
    }
    fn default_kmem_pages() -> u64 {
        2
    }
    fn default_touch() -> f64 {
        0.5
    }
    fn default_user_pages() -> u64 {
        16
    }
    fn default_compute() -> u64 {
        300_000
    }
    pub fn validate(&self, _cpus: usize) -> Result<(), String> {
        if self.jobs == 0 || self.processes == 0 {
            return Err("workload.jobs / workload.processes: must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.kmem_touch_probability) {
            return Err(format!(
                "workload.kmem_touch_probability: must be in [0, 1], got {}",
                self.kmem_touch_probability
            ));
        }
        if self.kmem_pages == 0 || self.user_pages == 0 {
            return Err("workload.kmem_pages / workload.user_pages: must be at least 1".into());
        }
        Ok(())
    }

    /// `jobs` compilers at once, each with its user pages and one kernel
    /// allocation at a time; each touches its user pages a line at a time.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let jobs = (self.jobs as u64).min(self.processes as u64);
        let per_process = add(&[self.user_pages, self.kmem_pages]);
        Demand {
            pages: mul(&[jobs, per_process]),
            pages_key: if self.user_pages >= self.kmem_pages {
                "user_pages"
            } else {
                "kmem_pages"
            },
            vpages: add(&[self.user_pages, 1]),
            vpages_key: "user_pages",
            threads: add(&[jobs, 1]),
            threads_key: "jobs",
            spawned: add(&[self.processes as u64, 1]),
            spawned_key: "processes",
            work: mul(&[
                self.processes as u64,
                add(&[
                    mul(&[self.user_pages, 64]),
                    mul(&[
                        self.kmem_per_process,
                        add(&[mul(&[self.kmem_pages, 16]), 4]),
                    ]),
                ]),
            ]),
            work_key: "processes",
        }
    }
}

#[derive(Default)]
struct BuildState {
    started: usize,
    running: usize,
    finished: usize,
}

pub struct Kbuild {
    spec: KbuildSpec,
    state: Rc<RefCell<BuildState>>,
}

impl Kbuild {
    pub fn new(spec: KbuildSpec) -> Kbuild {
        Kbuild {
            spec,
            state: Rc::default(),
        }
    }
}

impl Workload for Kbuild {
    fn start(&mut self, sim: &Sim) {
        let task = sim.create_task();
        sim.spawn_thread(
            task,
            Box::new(Make {
                spec: self.spec.clone(),
                state: self.state.clone(),
            }),
            None,
        );
    }
    fn report(&self) -> WorkloadReport {
        let s = self.state.borrow();
        let mut r = WorkloadReport {
            name: "kbuild".into(),
            verdict: verdict(s.finished == self.spec.processes),
            ..Default::default()
        };
        r.figures
            .insert("processes_finished".into(), s.finished as f64);
        r.notes
            .push("stand-in for black89's Mach kernel build (§5.2)".into());
        r
    }
}

struct Make {
    spec: KbuildSpec,
    state: Rc<RefCell<BuildState>>,
}

impl Program for Make {
    fn next(&mut self, _ctx: &mut ThreadCtx<'_>) -> Op {
        let mut s = self.state.borrow_mut();
        if s.finished == self.spec.processes {
            return Op::Exit;
        }
        if s.running < self.spec.jobs && s.started < self.spec.processes {
            s.started += 1;
            s.running += 1;
            let cc = Compiler {
                spec: self.spec.clone(),
                state: self.state.clone(),
                step: 0,
                user: 0,
                kmem: 0,
                done: 0,
            };
            return Op::Syscall(Syscall::Fork {
                child: Box::new(cc),
            });
        }
        Op::Sleep(20_000)
    }
}

struct Compiler {
    spec: KbuildSpec,
    state: Rc<RefCell<BuildState>>,
    step: u8,
    user: u64,
    kmem: u64,
    done: u64,
}

impl Program for Compiler {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        loop {
            match self.step {
                0 => {
                    self.step = 1;
                    return Op::Syscall(Syscall::Mmap {
                        pages: self.spec.user_pages,
                        prot: Prot::ReadWrite,
                    });
                }
                1 => {
                    self.user = ctx.ret;
                    self.step = 2;
                    let n = self.spec.user_pages * PAGE / 64;
                    return Op::Refs(Refs {
                        base: self.user,
                        start: 0,
                        stride: 64,
                        count: n,
                        wrap: 0,
                        kind: RefKind::Store(1),
                    });
                }
                2 if self.done < self.spec.kmem_per_process => {
                    self.step = 3;
                    return Op::Syscall(Syscall::KmemAlloc {
                        pages: self.spec.kmem_pages,
                        wired: false,
                    });
                }
                2 => {
                    self.state.borrow_mut().running -= 1;
                    self.state.borrow_mut().finished += 1;
                    return Op::Exit;
                }
                3 => {
                    self.kmem = ctx.ret;
                    self.step = 4;
                    if ctx.rng.chance(self.spec.kmem_touch_probability) {
                        let n = self.spec.kmem_pages * PAGE / 256;
                        return Op::Refs(Refs {
                            base: self.kmem,
                            start: 0,
                            stride: 256,
                            count: n,
                            wrap: 0,
                            kind: RefKind::Increment,
                        });
                    }
                }
                4 => {
                    self.step = 5;
                    let c = ctx.rng.exponential(self.spec.compute_cycles as f64) as u64;
                    return Op::Compute(c);
                }
                _ => {
                    self.step = 2;
                    self.done += 1;
                    return Op::Syscall(Syscall::KmemFree {
                        va: self.kmem,
                        pages: self.spec.kmem_pages,
                    });
                }
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParthenonSpec {
    /// Worker threads running at once (15-way parallel).
    #[serde(default = "ParthenonSpec::default_workers")]
    pub workers: usize,
    /// Threads created in all.
    #[serde(default = "ParthenonSpec::default_threads")]
    pub threads: usize,
    /// Pages in each thread's stack region.
    #[serde(default = "ParthenonSpec::default_stack")]
    pub stack_pages: u64,
    /// References each worker makes on the shared heap.
    #[serde(default = "ParthenonSpec::default_refs")]
    pub work_refs: u64,
    /// Pageable kernel allocations per thread (never touched by it).
    #[serde(default = "ParthenonSpec::default_kmem")]
    pub kmem_per_thread: u64,
}

impl ParthenonSpec {
    fn default_workers() -> usize {
        15
    }
    fn default_threads() -> usize {
        60
    }
    fn default_stack() -> u64 {
        16
    }
    fn default_refs() -> u64 {
        20_000
    }
    fn default_kmem() -> u64 {
        2
    }
    pub fn validate(&self, _cpus: usize) -> Result<(), String> {
        if self.workers == 0 || self.threads == 0 {
            return Err("workload.workers / workload.threads: must be at least 1".into());
        }
        if self.stack_pages < 2 {
            return Err(
                "workload.stack_pages: a cthreads stack needs at least 2 pages (data + guard)"
                    .into(),
            );
        }
        Ok(())
    }

    /// A 64-page heap; `workers` threads at once, each touching the first
    /// page of its stack and one kernel page at a time; the stacks are
    /// mapped (not freed) for all `threads`.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let threads = self.threads as u64;
        let workers = (self.workers as u64).min(threads);
        Demand {
            pages: add(&[64, mul(&[threads, 1]), mul(&[workers, 1])]),
            pages_key: "threads",
            vpages: add(&[65, mul(&[threads, add(&[self.stack_pages, 1])])]),
            vpages_key: "stack_pages",
            threads: add(&[workers, 1]),
            threads_key: "workers",
            spawned: add(&[threads, 1]),
            spawned_key: "threads",
            work: mul(&[
                threads,
                add(&[self.work_refs, mul(&[self.kmem_per_thread, 4]), 8]),
            ]),
            work_key: "work_refs",
        }
    }
}

#[derive(Default)]
struct ParthenonState {
    heap: u64,
    started: usize,
    running: usize,
    finished: usize,
}

pub struct Parthenon {
    spec: ParthenonSpec,
    state: Rc<RefCell<ParthenonState>>,
}

impl Parthenon {
    pub fn new(spec: ParthenonSpec) -> Parthenon {
        Parthenon {
            spec,
            state: Rc::default(),
        }
    }
}

impl Workload for Parthenon {
    fn start(&mut self, sim: &Sim) {
        let task = sim.create_task();
        let main = ParthenonMain {
            spec: self.spec.clone(),
            state: self.state.clone(),
            step: 0,
        };
        sim.spawn_thread(task, Box::new(main), None);
    }
    fn report(&self) -> WorkloadReport {
        let s = self.state.borrow();
        let mut r = WorkloadReport {
            name: "parthenon".into(),
            verdict: verdict(s.finished == self.spec.threads),
            ..Default::default()
        };
        r.figures
            .insert("threads_finished".into(), s.finished as f64);
        r.notes
            .push("stand-in for black89's Parthenon (§5.2, §7.2)".into());
        r
    }
}

struct ParthenonMain {
    spec: ParthenonSpec,
    state: Rc<RefCell<ParthenonState>>,
    step: u8,
}

impl Program for ParthenonMain {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        if self.step == 0 {
            self.step = 1;
            return Op::Syscall(Syscall::Mmap {
                pages: 64,
                prot: Prot::ReadWrite,
            });
        }
        if self.step == 1 {
            self.step = 2;
            self.state.borrow_mut().heap = ctx.ret;
        }
        let mut s = self.state.borrow_mut();
        if s.finished == self.spec.threads {
            return Op::Exit;
        }
        if s.running < self.spec.workers && s.started < self.spec.threads {
            s.started += 1;
            s.running += 1;
            let w = Worker {
                spec: self.spec.clone(),
                state: self.state.clone(),
                step: 0,
                stack: 0,
                kmem_done: 0,
            };
            return Op::Syscall(Syscall::ThreadCreate {
                program: Box::new(w),
                cpu: None,
            });
        }
        Op::Sleep(10_000)
    }
}

struct Worker {
    spec: ParthenonSpec,
    state: Rc<RefCell<ParthenonState>>,
    step: u8,
    stack: u64,
    kmem_done: u64,
}

impl Program for Worker {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        match self.step {
            // cthreads stack set-up: a stack region, the first page for
            // private data, the second reprotected to no access.
            0 => {
                self.step = 1;
                Op::Syscall(Syscall::Mmap {
                    pages: self.spec.stack_pages,
                    prot: Prot::ReadWrite,
                })
            }
            1 => {
                self.stack = ctx.ret;
                self.step = 2;
                Op::Refs(Refs::one(self.stack, RefKind::Store(1)))
            }
            2 => {
                self.step = 3;
                Op::Syscall(Syscall::Mprotect {
                    va: self.stack + PAGE,
                    pages: 1,
                    prot: Prot::None,
                })
            }
            3 if self.kmem_done < self.spec.kmem_per_thread => {
                self.kmem_done += 1;
                self.step = 4;
                Op::Syscall(Syscall::KmemAlloc {
                    pages: 1,
                    wired: false,
                })
            }
            4 => {
                self.step = 3;
                Op::Syscall(Syscall::KmemFree {
                    va: ctx.ret,
                    pages: 1,
                })
            }
            3 => {
                self.step = 5;
                let heap = self.state.borrow().heap;
                Op::Refs(Refs {
                    base: heap,
                    start: ctx.rng.below(64 * PAGE / 8) * 8,
                    stride: 72,
                    count: self.spec.work_refs,
                    wrap: 64 * PAGE,
                    kind: RefKind::Increment,
                })
            }
            _ => {
                let mut s = self.state.borrow_mut();
                s.running -= 1;
                s.finished += 1;
                Op::Exit
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CamelotSpec {
    #[serde(default = "CamelotSpec::default_threads")]
    pub threads: usize,
    #[serde(default = "CamelotSpec::default_shared")]
    pub shared_pages: u64,
    /// Reprotections each thread makes (read-only, then back).
    #[serde(default = "CamelotSpec::default_ops")]
    pub reprotects: u64,
    /// References between reprotections.
    #[serde(default = "CamelotSpec::default_refs")]
    pub refs_between: u64,
    /// Cycles each thread blocks after a reprotect pair (a transaction
    /// waiting on its log or a message): a blocked thread leaves its CPU,
    /// so fewer of the task's processors use the pmap at a shootdown.
    #[serde(default)]
    pub sleep_cycles: u64,
}

impl CamelotSpec {
    fn default_threads() -> usize {
        8
    }
    fn default_shared() -> u64 {
        32
    }
    fn default_ops() -> u64 {
        20
    }
    fn default_refs() -> u64 {
        4_000
    }
    pub fn validate(&self, _cpus: usize) -> Result<(), String> {
        if self.threads == 0 || self.shared_pages == 0 {
            return Err("workload.threads / workload.shared_pages: must be at least 1".into());
        }
        Ok(())
    }

    /// One shared region; each thread reprotects one or two of its pages
    /// and references it between reprotections.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let threads = self.threads as u64;
        Demand {
            pages: self.shared_pages,
            pages_key: "shared_pages",
            vpages: add(&[self.shared_pages, 1]),
            vpages_key: "shared_pages",
            threads: add(&[threads, 1]),
            threads_key: "threads",
            spawned: add(&[threads, 1]),
            spawned_key: "threads",
            work: mul(&[threads, self.reprotects, add(&[self.refs_between, 8])]),
            work_key: "reprotects",
        }
    }
}

#[derive(Default)]
struct CamelotState {
    region: u64,
    finished: usize,
}

pub struct Camelot {
    spec: CamelotSpec,
    state: Rc<RefCell<CamelotState>>,
}

impl Camelot {
    pub fn new(spec: CamelotSpec) -> Camelot {
        Camelot {
            spec,
            state: Rc::default(),
        }
    }
}

impl Workload for Camelot {
    fn start(&mut self, sim: &Sim) {
        let task = sim.create_task();
        for i in 0..self.spec.threads {
            let t = CamelotThread {
                spec: self.spec.clone(),
                state: self.state.clone(),
                index: i,
                done: 0,
                step: 0,
            };
            sim.spawn_thread(task, Box::new(t), None);
        }
    }
    fn report(&self) -> WorkloadReport {
        let s = self.state.borrow();
        let mut r = WorkloadReport {
            name: "camelot".into(),
            verdict: verdict(s.finished == self.spec.threads),
            ..Default::default()
        };
        r.notes.push("stand-in for black89's Camelot (§5.2)".into());
        r
    }
}

struct CamelotThread {
    spec: CamelotSpec,
    state: Rc<RefCell<CamelotState>>,
    index: usize,
    done: u64,
    step: u8,
}

impl Program for CamelotThread {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        ctx.fault = None;
        let region = self.state.borrow().region;
        if region == 0 {
            if self.index == 0 && self.step == 0 {
                self.step = 1;
                return Op::Syscall(Syscall::Mmap {
                    pages: self.spec.shared_pages,
                    prot: Prot::ReadWrite,
                });
            }
            if self.index == 0 {
                self.state.borrow_mut().region = ctx.ret;
                self.step = 0;
            } else {
                return Op::Compute(2_000);
            }
        }
        let page = region + ctx.rng.below(self.spec.shared_pages) * PAGE;
        match self.step {
            0 if self.done >= self.spec.reprotects => {
                self.state.borrow_mut().finished += 1;
                Op::Exit
            }
            0 => {
                self.step = 1;
                let wrap = self.spec.shared_pages * PAGE;
                Op::Refs(Refs {
                    base: region,
                    start: ctx.rng.below(wrap / 8) * 8,
                    stride: 520,
                    count: self.spec.refs_between,
                    wrap,
                    kind: RefKind::Increment,
                })
            }
            1 => {
                self.step = 2;
                self.done += 1;
                Op::Syscall(Syscall::Mprotect {
                    va: page,
                    pages: 1 + ctx.rng.below(2),
                    prot: Prot::Read,
                })
            }
            2 => {
                self.step = if self.spec.sleep_cycles > 0 { 3 } else { 0 };
                Op::Syscall(Syscall::Mprotect {
                    va: region,
                    pages: self.spec.shared_pages,
                    prot: Prot::ReadWrite,
                })
            }
            _ => {
                self.step = 0;
                Op::Sleep(self.spec.sleep_cycles)
            }
        }
    }
}
