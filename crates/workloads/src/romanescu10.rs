//! romanescu10 §6.2's workloads.
//!
//! * `unitd-micro` — Table 2's microbenchmarks, "modeled after the map
//!   phase of the wordcount benchmark": one or several threads parse a
//!   50 MB memory-mapped file (12,800 pages), reading every cache line,
//!   and every `file_pages / shootdowns` pages either store to the page
//!   just parsed (`cow`: the file is mapped copy-on-write, so the store
//!   breaks COW and the baseline shoots the old translation down) or unmap
//!   it (`unmap`). `multiple` splits the file evenly over one thread per
//!   core, each an initiator.
//!
//!   The paper leaves single_*'s other cores unstated. Here they run
//!   compute-bound worker threads of the same process (a stand-in for the
//!   rest of the application), so they use the address space and are the
//!   baseline's shootdown victims; each touches one line of every page of
//!   a private 16-page buffer between computations of
//!   `worker_compute_cycles`. The file is faulted in (mapped) before the
//!   measured phase, as a file in the page cache would be.
//!
//!   Each parser's working set besides the file (what a full TLB flush
//!   makes it walk again, romanescu10 §3 and Fig. 9): the code page of its
//!   loop (the task's text, fetched through the I-TLB at every operation),
//!   `private_pages` pages of stack, globals and C-library data, and its
//!   table of `table_pages` pages, each stored to once per page parsed.
//!   The parse's own work, `parse_compute_cycles_per_line` per line, runs
//!   as one computation per page (`Program::long_computes`: an interrupt
//!   is taken at its arrival, and a run of billions of cycles costs one
//!   event per page rather than one per quantum).
//!
//! * `unitd-app` — labelled stand-ins for swaptions (PARSEC), pca,
//!   string_match and a small-input wordcount (Phoenix): compute-heavy
//!   threads over private working sets, with wordcount's few mapping
//!   changes. They are synthetic, not the real programs.

use std::cell::RefCell;
use std::rc::Rc;

use mmulab_kernel::{Op, Program, Prot, RefKind, Refs, Sim, Syscall, ThreadCtx};
use mmulab_machine::CpuId;
use serde::{Deserialize, Serialize};

use crate::{Demand, Workload, WorkloadReport, add, mul, verdict};

const LINE: u64 = 64;
const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MicroOp {
    Cow,
    Unmap,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MicroSpec {
    /// `cow` or `unmap` (Table 2's columns).
    pub op: MicroOp,
    /// false: single_* (one initiator); true: multiple_*.
    #[serde(default)]
    pub multiple: bool,
    /// The file's pages (50 MB = 12,800 pages, §6.2).
    #[serde(default = "MicroSpec::default_file_pages")]
    pub file_pages: u64,
    /// COW breaks or unmaps in the measured phase: the baseline's
    /// shootdown count (§6.2's parameter, 0 to 12,000).
    #[serde(default)]
    pub shootdowns: u64,
    /// Cycles a single_* worker computes between passes over its buffer.
    /// The workers are victims only: the parser's runtime does not depend
    /// on this, which sets how many references the simulator runs for
    /// them.
    #[serde(default = "MicroSpec::default_worker_compute")]
    pub worker_compute_cycles: u64,
    /// Cycles of parsing work per cache line read (beyond the load).
    #[serde(default = "MicroSpec::default_parse_compute")]
    pub parse_compute_cycles_per_line: u64,
    /// Pages of each parser's table (the map phase's word counts), stored
    /// to once per page parsed. A full TLB flush makes the parser walk
    /// them all again (romanescu10 Fig. 9's explanation). The paper gives
    /// no size; 0 leaves them out.
    #[serde(default = "MicroSpec::default_table_pages")]
    pub table_pages: u64,
    /// Pages of each parser's stack, globals and C-library data, touched
    /// (one store each) once per page parsed beside the table: the rest
    /// of the working set a flushed TLB refills. The paper gives no size:
    /// 3 is an assumption (one page each of stack, program data and
    /// libc's data such as its character-class table).
    #[serde(default = "MicroSpec::default_private_pages")]
    pub private_pages: u64,
}

impl MicroSpec {
    fn default_file_pages() -> u64 {
        12_800
    }
    fn default_worker_compute() -> u64 {
        1_000_000
    }
    fn default_parse_compute() -> u64 {
        0
    }
    fn default_table_pages() -> u64 {
        8
    }
    fn default_private_pages() -> u64 {
        3
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if self.file_pages == 0 {
            return Err("workload.file_pages: must be at least 1".into());
        }
        if self.shootdowns > self.file_pages {
            return Err(format!(
                "workload.shootdowns: {} is above the file's {} pages (one shootdown per page at most)",
                self.shootdowns, self.file_pages
            ));
        }
        if self.multiple && self.file_pages < cpus as u64 {
            return Err(format!(
                "workload.file_pages: {} cannot be split over {cpus} threads",
                self.file_pages
            ));
        }
        Ok(())
    }

    /// The file (a copy-on-write break copies a page), each parser's table
    /// and each worker's 16-page buffer; every cache line of the file is
    /// read.
    pub fn demand(&self, cpus: usize) -> Demand {
        let cpus = cpus as u64;
        let parsers = if self.multiple { cpus } else { 1 };
        Demand {
            pages: add(&[
                self.file_pages,
                self.shootdowns,
                mul(&[parsers, self.table_pages]),
                mul(&[cpus, 16]),
            ]),
            pages_key: "file_pages",
            vpages: add(&[
                self.file_pages,
                mul(&[parsers, add(&[self.table_pages, 1])]),
                mul(&[cpus, 17]),
            ]),
            vpages_key: "file_pages",
            threads: cpus,
            threads_key: "multiple",
            spawned: cpus,
            spawned_key: "multiple",
            work: add(&[
                mul(&[self.file_pages, (PAGE / LINE) * 2]),
                mul(&[self.shootdowns, 16]),
            ]),
            work_key: "file_pages",
        }
    }
}

#[derive(Default)]
struct MicroShared {
    file: u64,
    ready: bool,
    parse_start: u64,
    parsers_done: usize,
    parse_end: u64,
    ops: u64,
    faults: u64,
}

pub struct Micro {
    spec: MicroSpec,
    shared: Rc<RefCell<MicroShared>>,
    cpus: usize,
}

impl Micro {
    pub fn new(spec: MicroSpec) -> Micro {
        Micro {
            spec,
            shared: Rc::default(),
            cpus: 0,
        }
    }
}

impl Workload for Micro {
    fn start(&mut self, sim: &Sim) {
        self.cpus = sim.w().cpus.len();
        let task = sim.create_task();
        let main = Parser {
            spec: self.spec.clone(),
            shared: self.shared.clone(),
            index: 0,
            parsers: if self.spec.multiple { self.cpus } else { 1 },
            cpus: self.cpus,
            phase: Phase::Setup(0),
            page: 0,
            compute_due: false,
            table_due: false,
        };
        sim.spawn_thread(task, Box::new(main), Some(CpuId(0)));
    }

    fn report(&self) -> WorkloadReport {
        let s = self.shared.borrow();
        let parsers = if self.spec.multiple { self.cpus } else { 1 };
        let mut r = WorkloadReport {
            name: format!(
                "{}_{}",
                if self.spec.multiple {
                    "multiple"
                } else {
                    "single"
                },
                match self.spec.op {
                    MicroOp::Cow => "cow",
                    MicroOp::Unmap => "unmap",
                }
            ),
            // Every parser finished, and no access faulted for good.
            verdict: verdict(s.parsers_done == parsers && s.faults == 0),
            ..Default::default()
        };
        r.figures.insert(
            "runtime_cycles".into(),
            s.parse_end.saturating_sub(s.parse_start) as f64,
        );
        r.figures.insert(
            "runtime_cycles_per_thread".into(),
            s.parse_end.saturating_sub(s.parse_start) as f64,
        );
        r.figures.insert("operations".into(), s.ops as f64);
        r.figures.insert("parsers".into(), parsers as f64);
        r
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Setup steps of the main thread (map, fault in, fork, spawn).
    Setup(u8),
    /// Parse page `page`: the loads over its lines.
    Parse,
    /// The page's operation (store or unmap) is due.
    Operate,
    Done,
}

struct Parser {
    spec: MicroSpec,
    shared: Rc<RefCell<MicroShared>>,
    index: usize,
    parsers: usize,
    cpus: usize,
    phase: Phase,
    /// Next page of this parser's slice (relative to the slice start).
    page: u64,
    /// The parsing work of the lines just read is still to do.
    compute_due: bool,
    /// The counts of the page just parsed are still to store.
    table_due: bool,
}

impl Parser {
    /// Pages of this parser's own working set besides the file: its
    /// table, then its stack, globals and libc data.
    fn own_pages(&self) -> u64 {
        self.spec.table_pages + self.spec.private_pages
    }

    fn slice(&self) -> (u64, u64) {
        let n = self.parsers as u64;
        let per = self.spec.file_pages / n;
        let start = self.index as u64 * per;
        let len = if self.index + 1 == self.parsers {
            self.spec.file_pages - start
        } else {
            per
        };
        (start, len)
    }

    /// This parser's share of the operations.
    fn ops_here(&self) -> u64 {
        let n = self.parsers as u64;
        let base = self.spec.shootdowns / n;
        base + u64::from((self.index as u64) < self.spec.shootdowns % n)
    }

    /// True when the page at `i` of the slice carries an operation: the
    /// operations are spread evenly over the slice.
    fn operates_on(&self, i: u64) -> bool {
        let k = self.ops_here();
        let (_, len) = self.slice();
        k > 0 && (i * k) / len != ((i + 1) * k) / len
    }

    fn spawn_others(&self) -> Vec<(Box<dyn Program>, CpuId)> {
        let mut v: Vec<(Box<dyn Program>, CpuId)> = Vec::new();
        for c in 1..self.cpus {
            if self.spec.multiple {
                v.push((
                    Box::new(Parser {
                        spec: self.spec.clone(),
                        shared: self.shared.clone(),
                        index: c,
                        parsers: self.parsers,
                        cpus: self.cpus,
                        phase: Phase::Parse,
                        page: 0,
                        compute_due: false,
                        table_due: false,
                    }),
                    CpuId(c as u16),
                ));
            } else {
                v.push((
                    Box::new(Worker {
                        shared: self.shared.clone(),
                        compute: self.spec.worker_compute_cycles,
                        file_pages: self.spec.file_pages,
                        buffer: 0,
                        step: 0,
                        index: c as u64,
                    }),
                    CpuId(c as u16),
                ));
            }
        }
        v
    }
}

impl Program for Parser {
    /// A page's parse is one computation of ~10^5 cycles or more.
    fn long_computes(&self) -> bool {
        true
    }

    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        if ctx.fault.is_some() {
            self.shared.borrow_mut().faults += 1;
        }
        let pages = self.spec.file_pages;
        match self.phase {
            Phase::Setup(step) => {
                self.phase = Phase::Setup(step + 1);
                match step {
                    // Map the file (plus the workers' buffers after it).
                    // The parsers' tables follow. They fault in (zero fill)
                    // at first use, after any fork, so that no COW break
                    // of theirs adds a shootdown.
                    0 => Op::Syscall(Syscall::Mmap {
                        pages: pages + (16 + self.own_pages()) * self.cpus as u64,
                        prot: Prot::ReadWrite,
                    }),
                    // Fault the file in: one store per page (the page
                    // cache filling it).
                    1 => {
                        self.shared.borrow_mut().file = ctx.ret;
                        Op::Refs(Refs {
                            base: ctx.ret,
                            start: 0,
                            stride: PAGE,
                            count: pages,
                            wrap: 0,
                            kind: RefKind::Store(1),
                        })
                    }
                    // COW: a child shares the pages copy-on-write and
                    // sleeps through the run.
                    2 if self.spec.op == MicroOp::Cow => Op::Syscall(Syscall::Fork {
                        child: Box::new(mmulab_kernel::program::FnProgram(
                            |_: &mut ThreadCtx<'_>| Op::Sleep(u64::MAX / 4),
                        )),
                    }),
                    2 => Op::Compute(1),
                    s if (s as usize) < 3 + self.cpus - 1 => {
                        let mut others = self.spawn_others();
                        let i = s as usize - 3;
                        let (program, cpu) = others.swap_remove(i);
                        Op::Syscall(Syscall::ThreadCreate {
                            program,
                            cpu: Some(cpu),
                        })
                    }
                    _ => {
                        let mut s = self.shared.borrow_mut();
                        s.ready = true;
                        s.parse_start = ctx.now.0;
                        drop(s);
                        self.phase = Phase::Parse;
                        Op::Compute(1)
                    }
                }
            }
            Phase::Parse | Phase::Operate if self.compute_due => {
                self.compute_due = false;
                Op::Compute(self.spec.parse_compute_cycles_per_line * (PAGE / LINE))
            }
            Phase::Parse | Phase::Operate if self.table_due => {
                // One store into every page of the table and of the
                // stack, globals and libc data, at a line that moves with
                // the page parsed.
                self.table_due = false;
                let n = self.own_pages();
                let table = self.shared.borrow().file
                    + (pages + 16 * self.cpus as u64 + self.index as u64 * n) * PAGE;
                Op::Refs(Refs {
                    base: table,
                    start: (self.page % (PAGE / LINE)) * LINE,
                    stride: PAGE,
                    count: n,
                    wrap: 0,
                    kind: RefKind::Store(self.page),
                })
            }
            Phase::Parse => {
                if !self.shared.borrow().ready {
                    return Op::Compute(100);
                }
                let (start, len) = self.slice();
                if self.page >= len {
                    self.phase = Phase::Done;
                    let mut s = self.shared.borrow_mut();
                    s.parsers_done += 1;
                    if s.parsers_done == self.parsers {
                        s.parse_end = ctx.now.0;
                        ctx.end_run = true;
                    }
                    return Op::Exit;
                }
                if self.operates_on(self.page) {
                    self.phase = Phase::Operate;
                } else {
                    self.page += 1;
                }
                let file = self.shared.borrow().file;
                let va =
                    file + (start + self.page - u64::from(self.phase != Phase::Operate)) * PAGE;
                self.compute_due = self.spec.parse_compute_cycles_per_line > 0;
                self.table_due = self.own_pages() > 0;
                Op::Refs(Refs {
                    base: va,
                    start: 0,
                    stride: LINE,
                    count: PAGE / LINE,
                    wrap: 0,
                    kind: RefKind::Load,
                })
            }
            Phase::Operate => {
                let (start, _) = self.slice();
                let va = self.shared.borrow().file + (start + self.page) * PAGE;
                self.page += 1;
                self.phase = Phase::Parse;
                self.shared.borrow_mut().ops += 1;
                match self.spec.op {
                    MicroOp::Cow => Op::Refs(Refs::one(va, RefKind::Store(2))),
                    MicroOp::Unmap => Op::Syscall(Syscall::Munmap { va, pages: 1 }),
                }
            }
            Phase::Done => Op::Exit,
        }
    }
}

/// A single_* worker on another core: computes, touching its own buffer.
struct Worker {
    shared: Rc<RefCell<MicroShared>>,
    compute: u64,
    file_pages: u64,
    buffer: u64,
    step: u64,
    index: u64,
}

impl Program for Worker {
    fn long_computes(&self) -> bool {
        true
    }

    fn next(&mut self, _ctx: &mut ThreadCtx<'_>) -> Op {
        let s = self.shared.borrow();
        if s.parse_end > 0 {
            return Op::Exit;
        }
        if self.buffer == 0 {
            if !s.ready {
                return Op::Compute(100);
            }
            // The workers' buffers follow the file in the same mapping.
            self.buffer = s.file + (self.file_pages + self.index * 16) * PAGE;
        }
        drop(s);
        self.step += 1;
        if self.step % 2 == 1 {
            Op::Compute(self.compute)
        } else {
            // One line of each of the 16 pages, a line further each pass.
            Op::Refs(Refs {
                base: self.buffer,
                start: (self.step / 2 % (PAGE / LINE)) * LINE,
                stride: PAGE,
                count: 16,
                wrap: 0,
                kind: RefKind::Store(self.index),
            })
        }
    }
}

/// The labelled stand-ins of §6.3's "Real Benchmarks".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum App {
    /// PARSEC swaptions: compute-bound, small per-thread working sets.
    Swaptions,
    /// Phoenix pca: streams over a shared matrix.
    Pca,
    /// Phoenix string_match: scans a shared input, few writes.
    StringMatch,
    /// Phoenix wordcount with a small input: a scan, then a handful of
    /// buffer unmaps (so "a negligible number of shootdowns").
    Wordcount,
}

impl App {
    /// (working-set pages per thread, shared pages, compute cycles per
    /// line read, unmaps per thread): stated assumptions, not measured.
    fn shape(self) -> (u64, u64, u64, u64) {
        match self {
            App::Swaptions => (16, 0, 400, 0),
            App::Pca => (8, 512, 40, 0),
            App::StringMatch => (4, 1024, 20, 0),
            App::Wordcount => (8, 1024, 30, 2),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSpec {
    pub app: App,
    /// Cache lines each thread reads before it exits.
    #[serde(default = "AppSpec::default_lines")]
    pub lines_per_thread: u64,
}

impl AppSpec {
    fn default_lines() -> u64 {
        200_000
    }
    pub fn validate(&self, _cpus: usize) -> Result<(), String> {
        if self.lines_per_thread == 0 {
            return Err("workload.lines_per_thread: must be at least 1".into());
        }
        Ok(())
    }

    /// One thread per CPU over its working set and the shared input.
    pub fn demand(&self, cpus: usize) -> Demand {
        let cpus = cpus as u64;
        let (private, shared, _, unmaps) = self.app.shape();
        let pages = add(&[shared, mul(&[cpus, add(&[private, unmaps])])]);
        Demand {
            pages,
            pages_key: "app",
            vpages: add(&[pages, 1]),
            vpages_key: "app",
            threads: cpus,
            threads_key: "app",
            spawned: cpus,
            spawned_key: "app",
            work: mul(&[cpus, self.lines_per_thread]),
            work_key: "lines_per_thread",
        }
    }
}

#[derive(Default)]
struct AppShared {
    region: u64,
    ready: bool,
    start: u64,
    done: usize,
    end: u64,
    unmaps: u64,
    faults: u64,
}

pub struct AppWorkload {
    spec: AppSpec,
    shared: Rc<RefCell<AppShared>>,
    threads: usize,
}

impl AppWorkload {
    pub fn new(spec: AppSpec) -> AppWorkload {
        AppWorkload {
            spec,
            shared: Rc::default(),
            threads: 0,
        }
    }
}

impl Workload for AppWorkload {
    fn start(&mut self, sim: &Sim) {
        self.threads = sim.w().cpus.len();
        let task = sim.create_task();
        for t in 0..self.threads {
            let p = AppThread {
                spec: self.spec.clone(),
                shared: self.shared.clone(),
                index: t as u64,
                threads: self.threads as u64,
                read: 0,
                step: 0,
                unmapped: 0,
            };
            sim.spawn_thread(task, Box::new(p), Some(CpuId(t as u16)));
        }
    }

    fn report(&self) -> WorkloadReport {
        let s = self.shared.borrow();
        let name = match self.spec.app {
            App::Swaptions => "swaptions (stand-in)",
            App::Pca => "pca (stand-in)",
            App::StringMatch => "string_match (stand-in)",
            App::Wordcount => "wordcount, small input (stand-in)",
        };
        let mut r = WorkloadReport {
            name: name.into(),
            verdict: verdict(s.done == self.threads && s.faults == 0),
            ..Default::default()
        };
        r.figures.insert(
            "runtime_cycles".into(),
            s.end.saturating_sub(s.start) as f64,
        );
        r.figures.insert("unmaps".into(), s.unmaps as f64);
        r
    }
}

struct AppThread {
    spec: AppSpec,
    shared: Rc<RefCell<AppShared>>,
    index: u64,
    threads: u64,
    read: u64,
    step: u64,
    unmapped: u64,
}

impl Program for AppThread {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        if ctx.fault.is_some() {
            self.shared.borrow_mut().faults += 1;
        }
        let (private, shared_pages, compute, unmaps) = self.spec.app.shape();
        // Per thread: its private pages, then one spare page per unmap.
        let per_thread = private + unmaps;
        let sh = self.shared.clone();
        if !sh.borrow().ready {
            if self.index == 0 {
                if self.step == 0 {
                    self.step = 1;
                    return Op::Syscall(Syscall::Mmap {
                        pages: shared_pages + per_thread * self.threads,
                        prot: Prot::ReadWrite,
                    });
                }
                let mut s = sh.borrow_mut();
                s.region = ctx.ret;
                s.ready = true;
                s.start = ctx.now.0;
            } else {
                return Op::Compute(100);
            }
        }
        let region = sh.borrow().region;
        let mine = region + (shared_pages + self.index * per_thread) * PAGE;
        if self.read >= self.spec.lines_per_thread {
            // Wordcount frees its intermediate buffers at the end.
            if self.unmapped < unmaps {
                let va = mine + (private + self.unmapped) * PAGE;
                self.unmapped += 1;
                sh.borrow_mut().unmaps += 1;
                return Op::Syscall(Syscall::Munmap { va, pages: 1 });
            }
            let mut s = sh.borrow_mut();
            s.done += 1;
            if s.done as u64 == self.threads {
                s.end = ctx.now.0;
            }
            return Op::Exit;
        }
        self.step += 1;
        if self.step.is_multiple_of(2) {
            return Op::Compute(compute * 64);
        }
        let chunk = 64;
        let before = self.read;
        self.read += chunk;
        // Alternate private stores and loads of the shared input.
        let (base, pages, kind) = if shared_pages == 0 || (before / chunk).is_multiple_of(2) {
            (mine, private + unmaps, RefKind::Store(self.index))
        } else {
            (region, shared_pages, RefKind::Load)
        };
        let wrap = pages * PAGE;
        Op::Refs(Refs {
            base,
            start: ((before + self.index * 4096) * LINE) % wrap,
            stride: LINE,
            count: chunk,
            wrap,
            kind,
        })
    }
}
