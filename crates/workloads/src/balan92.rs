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

use mmulab_kernel::pageout::PageoutCall;
use mmulab_kernel::segmap::SegmapCall;
use mmulab_kernel::{Op, Program, Prot, RefKind, Refs, Sim, Syscall, ThreadCtx};
use mmulab_machine::CpuId;
use serde::{Deserialize, Serialize};

use crate::{Demand, Workload, WorkloadReport, add, mul, verdict};

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

    /// One range mapped at a time (a fresh one per sample), while every
    /// other CPU computes in 1,000-cycle steps until the last sample.
    pub fn demand(&self, cpus: usize) -> Demand {
        let cpus = cpus as u64;
        let span = add(&[self.warmup_cycles, mul(&[self.samples, self.gap_cycles])]);
        Demand {
            pages: self.pages,
            pages_key: "pages",
            vpages: mul(&[self.samples, add(&[self.pages, 1])]),
            vpages_key: "pages",
            threads: cpus,
            threads_key: "mode",
            spawned: cpus,
            spawned_key: "mode",
            work: add(&[
                mul(&[self.samples, add(&[self.pages, 8])]),
                mul(&[cpus, span / 1000]),
            ]),
            work_key: "samples",
        }
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
    /// Files read and written through segmap (balan92 §Lazy Shutdowns);
    /// 0 = no file I/O. With the default `kernel.segmap_pages` (8 chunks)
    /// the default 4 files of 8 pages (16 chunk identities) make segmap
    /// reuse chunks for other pages often.
    #[serde(default = "KmemChurnSpec::default_files")]
    pub files: u32,
    #[serde(default = "KmemChurnSpec::default_file_pages")]
    pub file_pages: u64,
    /// Pages of private user memory each thread maps and stores into (what
    /// pageout ages); 0 = none.
    #[serde(default = "KmemChurnSpec::default_user_pages")]
    pub user_pages: u64,
    /// A pageout daemon (its own process) ages the churn process every
    /// `daemon_interval_cycles` (balan92 §Pageout), and, with files, runs
    /// segmap's aging pass.
    #[serde(default = "KmemChurnSpec::default_pageout")]
    pub pageout: bool,
    #[serde(default = "KmemChurnSpec::default_daemon_interval")]
    pub daemon_interval_cycles: u64,
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
    fn default_files() -> u32 {
        4
    }
    fn default_file_pages() -> u64 {
        8
    }
    fn default_user_pages() -> u64 {
        4
    }
    fn default_pageout() -> bool {
        true
    }
    fn default_daemon_interval() -> u64 {
        20_000
    }
    /// File I/O, user memory or the daemon: the extra mix is drawn.
    fn extras(&self) -> bool {
        self.files > 0 || self.user_pages > 0 || self.pageout
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if self.files > 0 && self.file_pages == 0 {
            return Err("workload.file_pages: must be at least 1 with files".into());
        }
        if self.pageout && self.daemon_interval_cycles == 0 {
            return Err("workload.daemon_interval_cycles: must be at least 1".into());
        }
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

    /// Each thread holds up to `live` allocations of up to `max_pages`
    /// and its user pages; the files' pages sit in the page cache.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let threads = self.threads as u64;
        let kmem = mul(&[threads, self.live as u64, self.max_pages]);
        let user = mul(&[threads, self.user_pages]);
        let files = mul(&[self.files as u64, self.file_pages]);
        let pages = add(&[kmem, user, files]);
        let pages_key = if kmem >= user && kmem >= files {
            "max_pages"
        } else if user >= files {
            "user_pages"
        } else {
            "file_pages"
        };
        Demand {
            pages,
            pages_key,
            vpages: mul(&[threads, add(&[self.user_pages, 1])]),
            vpages_key: "user_pages",
            threads: add(&[threads, 1]),
            threads_key: "threads",
            spawned: add(&[threads, 1]),
            spawned_key: "threads",
            work: mul(&[
                threads,
                self.allocations,
                add(&[
                    if self.touch {
                        mul(&[self.max_pages, 8])
                    } else {
                        1
                    },
                    16,
                ]),
            ]),
            work_key: "allocations",
        }
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
    io: Option<IoStep>,
    /// Private user memory: requested, then (va, pages).
    user: Option<Option<(u64, u64)>>,
}

/// A read or write through segmap in progress.
#[derive(Clone, Copy)]
enum IoStep {
    /// `getmap` issued; its return is the page's kernel address.
    Mapped { store: bool },
    /// The copy was done; release the chunk.
    Copied(u64),
}

/// One file read or write: map, copy, release (the copy is references to
/// the page's kernel address, as the kernel's copy on the caller's behalf).
fn file_io_step(io: &mut Option<IoStep>, ctx: &mut ThreadCtx<'_>) -> Option<Op> {
    match io.take()? {
        IoStep::Mapped { store } => {
            let va = ctx.ret;
            *io = Some(IoStep::Copied(va));
            Some(Op::Refs(Refs {
                base: va,
                start: ctx.rng.below(PAGE / 8) * 8,
                stride: *ctx.rng.pick(&[8u64, 64, 512]),
                count: 16 + ctx.rng.below(112),
                wrap: PAGE,
                kind: if store {
                    RefKind::Increment
                } else {
                    RefKind::Load
                },
            }))
        }
        IoStep::Copied(va) => Some(Op::Syscall(Syscall::Segmap(SegmapCall::Release { va }))),
    }
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
        if let Some(op) = file_io_step(&mut self.io, ctx) {
            return op;
        }
        if self.spec.user_pages > 0 {
            match self.user {
                None => {
                    self.user = Some(None);
                    return Op::Syscall(Syscall::Mmap {
                        pages: self.spec.user_pages,
                        prot: Prot::ReadWrite,
                    });
                }
                Some(None) => self.user = Some(Some((ctx.ret, self.spec.user_pages))),
                Some(Some(_)) => {}
            }
        }
        if self.made < self.spec.allocations && self.spec.extras() && ctx.rng.chance(0.4) {
            let r = ctx.rng.below(10);
            if r < 6 && self.spec.files > 0 {
                let file = ctx.rng.below(self.spec.files as u64) as u32;
                let page = ctx.rng.below(self.spec.file_pages);
                self.io = Some(IoStep::Mapped {
                    store: ctx.rng.chance(0.5),
                });
                return Op::Syscall(Syscall::Segmap(SegmapCall::Getmap { file, page }));
            }
            if r < 8
                && let Some(Some((va, pages))) = self.user
            {
                return Op::Refs(Refs {
                    base: va,
                    start: ctx.rng.below(pages * PAGE / 8) * 8,
                    stride: *ctx.rng.pick(&[8u64, 512, 4096]),
                    count: 10 + ctx.rng.below(100),
                    wrap: pages * PAGE,
                    kind: if ctx.rng.chance(0.3) {
                        RefKind::Load
                    } else {
                        RefKind::Increment
                    },
                });
            }
            if self.spec.pageout {
                // Let the daemon have a CPU now and then.
                return Op::Sleep(1000 + ctx.rng.below(4000));
            }
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
                io: None,
                user: None,
            };
            sim.spawn_thread(task, Box::new(t), Some(CpuId(c as u16)));
        }
        if self.spec.pageout {
            let daemon_task = sim.create_task();
            let shared = self.shared.clone();
            let spec = self.spec.clone();
            let mut step = 0u64;
            let daemon = mmulab_kernel::program::FnProgram(move |_: &mut ThreadCtx<'_>| {
                step += 1;
                if shared.borrow().finished == spec.threads {
                    return Op::Exit;
                }
                match step % 3 {
                    0 => Op::Sleep(spec.daemon_interval_cycles),
                    1 if spec.files > 0 => Op::Syscall(Syscall::Segmap(SegmapCall::Age)),
                    2 => Op::Syscall(Syscall::Pageout(PageoutCall::Age { task: task.0 })),
                    _ => Op::Compute(10),
                }
            });
            sim.spawn_thread(daemon_task, Box::new(daemon), None);
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileIoSpec {
    /// Threads, one bound to each of the first `threads` CPUs.
    #[serde(default = "FileIoSpec::default_threads")]
    pub threads: usize,
    /// Page reads or writes each thread makes.
    #[serde(default = "FileIoSpec::default_ops")]
    pub ops: u64,
    #[serde(default = "FileIoSpec::default_files")]
    pub files: u32,
    #[serde(default = "FileIoSpec::default_file_pages")]
    pub file_pages: u64,
    /// Percent of the page operations that write.
    #[serde(default = "FileIoSpec::default_write_pct")]
    pub write_pct: u64,
    /// References per page copied (8-byte words).
    #[serde(default = "FileIoSpec::default_copy_refs")]
    pub copy_refs: u64,
    /// Period of segmap's aging daemon; 0 = no daemon.
    #[serde(default = "FileIoSpec::default_interval")]
    pub daemon_interval_cycles: u64,
}

impl FileIoSpec {
    fn default_threads() -> usize {
        4
    }
    fn default_ops() -> u64 {
        500
    }
    fn default_files() -> u32 {
        8
    }
    fn default_file_pages() -> u64 {
        16
    }
    fn default_write_pct() -> u64 {
        30
    }
    fn default_copy_refs() -> u64 {
        128
    }
    fn default_interval() -> u64 {
        200_000
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if self.threads == 0 || self.threads > cpus {
            return Err(format!(
                "workload.threads: must be 1 to machine.cpus ({cpus}), got {}",
                self.threads
            ));
        }
        if self.files == 0 || self.file_pages == 0 {
            return Err("workload.files: files and file_pages must be at least 1".into());
        }
        if self.daemon_interval_cycles > 0 && self.threads >= cpus {
            // Threads never yield their CPU: the aging daemon needs one.
            return Err(format!(
                "workload.threads: at most machine.cpus - 1 ({}) with the aging daemon, got {}",
                cpus - 1,
                self.threads
            ));
        }
        if self.write_pct > 100 {
            return Err("workload.write_pct: must be 0 to 100".into());
        }
        Ok(())
    }

    /// Every page of every file may sit in the page cache; each operation
    /// copies `copy_refs` words.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let threads = self.threads as u64;
        Demand {
            pages: mul(&[self.files as u64, self.file_pages]),
            pages_key: "file_pages",
            vpages: 1,
            vpages_key: "file_pages",
            threads: add(&[threads, 1]),
            threads_key: "threads",
            spawned: add(&[threads, 1]),
            spawned_key: "threads",
            work: mul(&[threads, self.ops, add(&[self.copy_refs, 8])]),
            work_key: "ops",
        }
    }
}

/// Reads and writes files through segmap: each thread picks a file and
/// goes through its pages in order (`getmap`, copy, `release` per page),
/// then picks another; a daemon thread runs segmap's aging pass
/// periodically. Two pages of one 8 KB chunk, and a file read again before
/// the daemon ages it, reuse a chunk with the same identity.
pub struct FileIo {
    spec: FileIoSpec,
    finished: Rc<RefCell<usize>>,
}

impl FileIo {
    pub fn new(spec: FileIoSpec) -> FileIo {
        FileIo {
            spec,
            finished: Rc::default(),
        }
    }
}

impl Workload for FileIo {
    fn start(&mut self, sim: &Sim) {
        let task = sim.create_task();
        for c in 0..self.spec.threads {
            let spec = self.spec.clone();
            let finished = self.finished.clone();
            let mut done = 0u64;
            let mut cursor: Option<(u32, u64)> = None;
            let mut io: Option<IoStep> = None;
            let t = mmulab_kernel::program::FnProgram(move |ctx: &mut ThreadCtx<'_>| {
                if let Some(op) = file_io_step(&mut io, ctx) {
                    // The copy: `copy_refs` words from the page's start.
                    return match op {
                        Op::Refs(r) => Op::Refs(Refs {
                            count: spec.copy_refs,
                            stride: 8,
                            start: 0,
                            ..r
                        }),
                        other => other,
                    };
                }
                if done >= spec.ops {
                    *finished.borrow_mut() += 1;
                    return Op::Exit;
                }
                done += 1;
                let (file, page) = match cursor {
                    Some((f, p)) if p + 1 < spec.file_pages => (f, p + 1),
                    _ => (ctx.rng.below(spec.files as u64) as u32, 0),
                };
                cursor = Some((file, page));
                io = Some(IoStep::Mapped {
                    store: ctx.rng.below(100) < spec.write_pct,
                });
                Op::Syscall(Syscall::Segmap(SegmapCall::Getmap { file, page }))
            });
            sim.spawn_thread(task, Box::new(t), Some(CpuId(c as u16)));
        }
        if self.spec.daemon_interval_cycles > 0 {
            let daemon_task = sim.create_task();
            let finished = self.finished.clone();
            let spec = self.spec.clone();
            let mut step = 0u64;
            let daemon = mmulab_kernel::program::FnProgram(move |_: &mut ThreadCtx<'_>| {
                step += 1;
                if *finished.borrow() == spec.threads {
                    return Op::Exit;
                }
                if step % 2 == 1 {
                    Op::Sleep(spec.daemon_interval_cycles)
                } else {
                    Op::Syscall(Syscall::Segmap(SegmapCall::Age))
                }
            });
            sim.spawn_thread(daemon_task, Box::new(daemon), None);
        }
    }

    fn report(&self) -> WorkloadReport {
        WorkloadReport {
            name: "file-io".into(),
            verdict: verdict(*self.finished.borrow() == self.spec.threads),
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageoutAgingSpec {
    /// LWPs of the aged process, bound to CPUs 1..=threads (the daemon
    /// runs on CPU 0); default: every other CPU.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Working-set pages each LWP stores into.
    #[serde(default = "PageoutAgingSpec::default_pages")]
    pub pages: u64,
    /// Aging passes the daemon makes.
    #[serde(default = "PageoutAgingSpec::default_passes")]
    pub passes: u64,
    /// Time between passes.
    #[serde(default = "PageoutAgingSpec::default_interval")]
    pub interval_cycles: u64,
}

impl PageoutAgingSpec {
    fn default_pages() -> u64 {
        16
    }
    fn default_passes() -> u64 {
        10
    }
    fn default_interval() -> u64 {
        100_000
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if cpus < 2 {
            return Err(format!(
                "workload.threads: pageout aging needs at least 2 CPUs, machine.cpus is {cpus}"
            ));
        }
        if let Some(t) = self.threads
            && (t == 0 || t >= cpus)
        {
            return Err(format!(
                "workload.threads: must be 1 to machine.cpus - 1 ({}), got {t}",
                cpus - 1
            ));
        }
        if self.pages == 0 || self.passes == 0 {
            return Err("workload.pages: pages and passes must be at least 1".into());
        }
        Ok(())
    }

    /// Each LWP's working set; the LWPs store into it (a reference per
    /// cycle at most) until the daemon's last pass.
    pub fn demand(&self, cpus: usize) -> Demand {
        let lwps = self.threads.unwrap_or(cpus.saturating_sub(1)) as u64;
        Demand {
            pages: mul(&[lwps, self.pages]),
            pages_key: "pages",
            vpages: mul(&[lwps, add(&[self.pages, 1])]),
            vpages_key: "pages",
            threads: add(&[lwps, 1]),
            threads_key: "threads",
            spawned: add(&[lwps, 1]),
            spawned_key: "threads",
            work: mul(&[lwps, self.passes, add(&[self.interval_cycles, self.pages])]),
            work_key: "passes",
        }
    }
}

/// balan92 §Pageout: a process whose LWPs keep storing into their working
/// sets (setting R and M) while the pageout daemon, a kernel process bound
/// to CPU 0, ages it `passes` times: locally (seize, no shootdown) or, with
/// `kernel.pageout_global`, by SVR4's global scan (a shootdown per clear).
pub struct PageoutAging {
    spec: PageoutAgingSpec,
    done: Rc<RefCell<bool>>,
    passes: Rc<RefCell<u64>>,
}

impl PageoutAging {
    pub fn new(spec: PageoutAgingSpec) -> PageoutAging {
        PageoutAging {
            spec,
            done: Rc::default(),
            passes: Rc::default(),
        }
    }
}

impl Workload for PageoutAging {
    fn start(&mut self, sim: &Sim) {
        let cpus = sim.w().cpus.len();
        let lwps = self.spec.threads.unwrap_or(cpus - 1);
        let task = sim.create_task();
        for c in 1..=lwps {
            let done = self.done.clone();
            let pages = self.spec.pages;
            let mut region: Option<u64> = None;
            let mut asked = false;
            let t = mmulab_kernel::program::FnProgram(move |ctx: &mut ThreadCtx<'_>| {
                if *done.borrow() {
                    return Op::Exit;
                }
                if !asked {
                    asked = true;
                    return Op::Syscall(Syscall::Mmap {
                        pages,
                        prot: Prot::ReadWrite,
                    });
                }
                let base = *region.get_or_insert(ctx.ret);
                Op::Refs(Refs {
                    base,
                    start: 0,
                    stride: PAGE,
                    count: pages,
                    wrap: pages * PAGE,
                    kind: RefKind::Increment,
                })
            });
            sim.spawn_thread(task, Box::new(t), Some(CpuId(c as u16)));
        }
        let daemon_task = sim.create_task();
        let spec = self.spec.clone();
        let done = self.done.clone();
        let passes = self.passes.clone();
        let mut step = 0u64;
        let daemon = mmulab_kernel::program::FnProgram(move |_: &mut ThreadCtx<'_>| {
            step += 1;
            if *passes.borrow() >= spec.passes {
                *done.borrow_mut() = true;
                return Op::Exit;
            }
            if step % 2 == 1 {
                Op::Compute(spec.interval_cycles)
            } else {
                *passes.borrow_mut() += 1;
                Op::Syscall(Syscall::Pageout(PageoutCall::Age { task: task.0 }))
            }
        });
        sim.spawn_thread(daemon_task, Box::new(daemon), Some(CpuId(0)));
    }

    fn report(&self) -> WorkloadReport {
        let mut r = WorkloadReport {
            name: "pageout-aging".into(),
            verdict: verdict(*self.passes.borrow() == self.spec.passes),
            ..Default::default()
        };
        r.figures
            .insert("passes".into(), *self.passes.borrow() as f64);
        r
    }
}

/// One test of balan92 Fig. 4's benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForkTest {
    /// fork(), the child exits at once.
    ForkExit,
    /// fork(), the child execs (its inherited image is unmapped and a new
    /// bss of the size mapped and touched), then exits.
    ForkExecExit,
    /// fork(), the child grows its break by the size (touched), then
    /// exits.
    ForkSbrkExit,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkBenchSpec {
    pub test: ForkTest,
    /// Concurrent copies of the benchmark (balan92: 1 to 4 on 4 CPUs).
    #[serde(default = "ForkBenchSpec::default_copies")]
    pub copies: usize,
    /// bss (or sbrk) sizes in KB, each run `repeats` times.
    pub sizes_kb: Vec<u64>,
    /// balan92: "Each of the above test was repeated for 10 times".
    #[serde(default = "ForkBenchSpec::default_repeats")]
    pub repeats: u64,
    /// The parent's poll period while it waits for its child.
    #[serde(default = "ForkBenchSpec::default_poll")]
    pub poll_cycles: u64,
    /// The copies are LWPs of one process (balan92 §Analysis: "intra-
    /// process concurrent fork()/exit()") instead of processes.
    #[serde(default)]
    pub same_process: bool,
}

impl ForkBenchSpec {
    fn default_copies() -> usize {
        1
    }
    fn default_repeats() -> u64 {
        10
    }
    fn default_poll() -> u64 {
        200
    }
    pub fn validate(&self, _cpus: usize) -> Result<(), String> {
        if self.copies == 0 {
            return Err("workload.copies: must be at least 1".into());
        }
        if self.sizes_kb.is_empty() {
            return Err("workload.sizes_kb: at least one size".into());
        }
        if self.repeats == 0 || self.poll_cycles == 0 {
            return Err("workload.repeats: repeats and poll_cycles must be at least 1".into());
        }
        Ok(())
    }

    /// Each copy holds its bss and its child's (an exec maps a new one);
    /// every fork copies the bss's mappings and the child touches its own.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let copies = self.copies as u64;
        let largest = self
            .sizes_kb
            .iter()
            .map(|k| k.div_ceil(4))
            .max()
            .unwrap_or(0);
        let all = add(&self
            .sizes_kb
            .iter()
            .map(|k| k.div_ceil(4))
            .collect::<Vec<_>>());
        let tasks = if self.same_process { 1 } else { copies };
        Demand {
            pages: mul(&[copies, 2, largest]),
            pages_key: "sizes_kb",
            // A copy's bss regions (one per size) share its task's space.
            vpages: mul(&[copies / tasks, add(&[all, self.sizes_kb.len() as u64])]),
            vpages_key: "sizes_kb",
            threads: mul(&[copies, 2]),
            threads_key: "copies",
            spawned: add(&[
                copies,
                mul(&[copies, self.sizes_kb.len() as u64, self.repeats]),
            ]),
            spawned_key: "repeats",
            work: mul(&[copies, self.repeats, add(&[mul(&[all, 3]), 16])]),
            work_key: "repeats",
        }
    }
}

/// balan92 Fig. 4 (§Concurrent fork()/exec()/exit() measurements): each
/// copy is a process that, for every size, maps and touches a bss of that
/// size and forks `repeats` children running the test, waiting for each
/// (polling with a sleep: there is no wait call). The elapsed time of `k`
/// concurrent copies against one gives the speedup `k T1 / Tk`.
pub struct ForkBench {
    spec: ForkBenchSpec,
    finished: Rc<RefCell<usize>>,
    forks: Rc<RefCell<u64>>,
}

impl ForkBench {
    pub fn new(spec: ForkBenchSpec) -> ForkBench {
        ForkBench {
            spec,
            finished: Rc::default(),
            forks: Rc::default(),
        }
    }
}

fn touch_pages(va: u64, pages: u64) -> Op {
    Op::Refs(Refs {
        base: va,
        start: 0,
        stride: PAGE,
        count: pages,
        wrap: 0,
        kind: RefKind::Store(1),
    })
}

/// The child of one fork: runs the test and raises `done` as it exits.
fn fork_child(
    test: ForkTest,
    bss: Option<(u64, u64)>,
    pages: u64,
    done: Rc<RefCell<bool>>,
) -> Box<dyn Program> {
    let mut step = 0u32;
    Box::new(mmulab_kernel::program::FnProgram(
        move |ctx: &mut ThreadCtx<'_>| {
            step += 1;
            let exit = |done: &Rc<RefCell<bool>>| {
                *done.borrow_mut() = true;
                Op::Exit
            };
            match (test, step) {
                (ForkTest::ForkExit, _) => exit(&done),
                (ForkTest::ForkExecExit, 1) => match bss {
                    Some((va, n)) => Op::Syscall(Syscall::Munmap { va, pages: n }),
                    None => Op::Compute(1),
                },
                (ForkTest::ForkExecExit | ForkTest::ForkSbrkExit, 2) if pages > 0 => {
                    Op::Syscall(Syscall::Mmap {
                        pages,
                        prot: Prot::ReadWrite,
                    })
                }
                (ForkTest::ForkSbrkExit, 1) => Op::Compute(1),
                (_, 3) if pages > 0 => touch_pages(ctx.ret, pages),
                _ => exit(&done),
            }
        },
    ))
}

impl Workload for ForkBench {
    fn start(&mut self, sim: &Sim) {
        let shared = self.spec.same_process.then(|| sim.create_task());
        for _ in 0..self.spec.copies {
            let task = shared.unwrap_or_else(|| sim.create_task());
            let spec = self.spec.clone();
            let finished = self.finished.clone();
            let forks = self.forks.clone();
            let mut size_i = 0usize;
            let mut rep = 0u64;
            // Per size: None = map the bss next, Some(None) = touch it,
            // Some(Some(region)) = fork.
            let mut bss: Option<Option<(u64, u64)>> = None;
            let mut mapped_pending = false;
            let mut child: Option<Rc<RefCell<bool>>> = None;
            let t = mmulab_kernel::program::FnProgram(move |ctx: &mut ThreadCtx<'_>| {
                if let Some(d) = &child {
                    if !*d.borrow() {
                        return Op::Sleep(spec.poll_cycles);
                    }
                    child = None;
                }
                if size_i >= spec.sizes_kb.len() {
                    *finished.borrow_mut() += 1;
                    return Op::Exit;
                }
                let pages = spec.sizes_kb[size_i].div_ceil(4);
                if mapped_pending {
                    mapped_pending = false;
                    bss = Some(Some((ctx.ret, pages)));
                    return touch_pages(ctx.ret, pages);
                }
                if bss.is_none() {
                    if pages > 0 && spec.test != ForkTest::ForkSbrkExit {
                        mapped_pending = true;
                        return Op::Syscall(Syscall::Mmap {
                            pages,
                            prot: Prot::ReadWrite,
                        });
                    }
                    bss = Some(None);
                }
                if rep >= spec.repeats {
                    rep = 0;
                    size_i += 1;
                    let old = bss.take().flatten();
                    if let Some((va, n)) = old {
                        return Op::Syscall(Syscall::Munmap { va, pages: n });
                    }
                    return Op::Compute(1);
                }
                rep += 1;
                *forks.borrow_mut() += 1;
                let done = Rc::new(RefCell::new(false));
                child = Some(done.clone());
                let region = bss.flatten();
                Op::Syscall(Syscall::Fork {
                    child: fork_child(spec.test, region, pages, done),
                })
            });
            sim.spawn_thread(task, Box::new(t), None);
        }
    }

    fn report(&self) -> WorkloadReport {
        let mut r = WorkloadReport {
            name: "fork-bench".into(),
            verdict: verdict(*self.finished.borrow() == self.spec.copies),
            ..Default::default()
        };
        r.figures
            .insert("forks".into(), *self.forks.borrow() as f64);
        r
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultStormSpec {
    /// Processes, each with `threads` LWPs; LWP i runs on CPU i mod cpus.
    pub processes: usize,
    pub threads: usize,
    /// Pages each LWP maps, touches (a zero-fill fault each) and unmaps
    /// per round.
    #[serde(default = "FaultStormSpec::default_pages")]
    pub pages: u64,
    #[serde(default = "FaultStormSpec::default_rounds")]
    pub rounds: u64,
    /// Pages each LWP's mapping has below the `pages` it touches (never
    /// touched: no page table, no mapping chunk); 1024 or more puts each
    /// LWP's touched pages in a page table of its own on the i386, the
    /// case the switch "HAT lock per page table" is for. Default 0.
    #[serde(default)]
    pub spread_pages: u64,
}

impl FaultStormSpec {
    fn default_pages() -> u64 {
        16
    }
    fn default_rounds() -> u64 {
        10
    }
    pub fn validate(&self, _cpus: usize) -> Result<(), String> {
        if self.processes == 0 || self.threads == 0 {
            return Err("workload.processes: processes and threads must be at least 1".into());
        }
        if self.pages == 0 || self.rounds == 0 {
            return Err("workload.pages: pages and rounds must be at least 1".into());
        }
        Ok(())
    }

    /// Every LWP maps its spread and pages each round and touches the
    /// pages; mappings are unmapped, but their addresses are not reused.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let lwps = mul(&[self.processes as u64, self.threads as u64]);
        let span = add(&[self.spread_pages, self.pages]);
        Demand {
            pages: mul(&[lwps, self.pages]),
            pages_key: "pages",
            vpages: mul(&[self.threads as u64, add(&[self.rounds, 1]), add(&[span, 1])]),
            vpages_key: if self.spread_pages > self.pages {
                "spread_pages"
            } else {
                "pages"
            },
            threads: lwps,
            threads_key: "threads",
            spawned: lwps,
            spawned_key: "threads",
            work: mul(&[lwps, add(&[self.rounds, 1]), add(&[span, self.pages])]),
            work_key: "rounds",
        }
    }
}

/// balan92 §Analysis of the Locking design, the page-fault scenarios:
/// concurrent faults in different address spaces (`processes` > 1,
/// `threads` = 1) or among the LWPs of one process (`processes` = 1).
pub struct FaultStorm {
    spec: FaultStormSpec,
    finished: Rc<RefCell<usize>>,
}

impl FaultStorm {
    pub fn new(spec: FaultStormSpec) -> FaultStorm {
        FaultStorm {
            spec,
            finished: Rc::default(),
        }
    }
}

impl Workload for FaultStorm {
    fn start(&mut self, sim: &Sim) {
        let cpus = sim.w().cpus.len();
        let mut lwp = 0;
        for _ in 0..self.spec.processes {
            let task = sim.create_task();
            for _ in 0..self.spec.threads {
                let spec = self.spec.clone();
                let finished = self.finished.clone();
                let mut round = 0u64;
                let mut step = 0u32;
                let mut va = 0u64;
                let t = mmulab_kernel::program::FnProgram(move |ctx: &mut ThreadCtx<'_>| {
                    step += 1;
                    match step {
                        1 => Op::Syscall(Syscall::Mmap {
                            pages: spec.spread_pages + spec.pages,
                            prot: Prot::ReadWrite,
                        }),
                        2 => {
                            va = ctx.ret;
                            touch_pages(va + spec.spread_pages * PAGE, spec.pages)
                        }
                        _ => {
                            step = 0;
                            round += 1;
                            if round > spec.rounds {
                                *finished.borrow_mut() += 1;
                                return Op::Exit;
                            }
                            Op::Syscall(Syscall::Munmap {
                                va,
                                pages: spec.spread_pages + spec.pages,
                            })
                        }
                    }
                });
                sim.spawn_thread(task, Box::new(t), Some(CpuId((lwp % cpus) as u16)));
                lwp += 1;
            }
        }
    }

    fn report(&self) -> WorkloadReport {
        WorkloadReport {
            name: "fault-storm".into(),
            verdict: verdict(*self.finished.borrow() == self.spec.processes * self.spec.threads),
            ..Default::default()
        }
    }
}
