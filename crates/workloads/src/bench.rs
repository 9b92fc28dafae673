//! The speed workload of `mmulab bench` (foundation issue, "Speed"): N
//! threads of one task, each on its own CPU, sweep loads and stores over
//! their own private pages and a shared region; one `mprotect` of a shared
//! page (read-only, then back) every `mprotect_every` references overall.
//! References step `stride_bytes`: one word (8, the default) sweeps an
//! array as a loop over it does, so on a cache hierarchy one reference in
//! eight starts a new line; one cache line (64) makes nearly every
//! reference a miss there, a worst case for the memory system's miss path,
//! and costs a TLB miss every 64 references once the working set exceeds
//! the TLB (flat memory's worst case).

use std::cell::RefCell;
use std::rc::Rc;

use mmulab_kernel::{Op, Program, Prot, RefKind, Refs, Sim, Syscall, ThreadCtx};
use mmulab_machine::CpuId;
use serde::{Deserialize, Serialize};

use crate::{Demand, Workload, WorkloadReport, add, mul, verdict};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchSpec {
    #[serde(default = "BenchSpec::default_threads")]
    pub threads: usize,
    #[serde(default = "BenchSpec::default_private")]
    pub private_pages: u64,
    #[serde(default = "BenchSpec::default_shared")]
    pub shared_pages: u64,
    #[serde(default = "BenchSpec::default_every")]
    pub mprotect_every: u64,
    /// References each thread makes before it exits.
    #[serde(default = "BenchSpec::default_refs")]
    pub refs_per_thread: u64,
    /// Bytes between consecutive references of a sweep.
    #[serde(default = "BenchSpec::default_stride")]
    pub stride_bytes: u64,
}

impl BenchSpec {
    fn default_threads() -> usize {
        16
    }
    fn default_private() -> u64 {
        256
    }
    fn default_shared() -> u64 {
        64
    }
    fn default_every() -> u64 {
        100_000
    }
    fn default_refs() -> u64 {
        2_000_000
    }
    fn default_stride() -> u64 {
        8
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if self.threads == 0 || self.threads > cpus {
            return Err(format!(
                "workload.threads: must be 1..={cpus} (one per CPU), got {}",
                self.threads
            ));
        }
        if self.private_pages == 0 || self.shared_pages == 0 {
            return Err(
                "workload.private_pages / workload.shared_pages: must be at least 1".into(),
            );
        }
        if self.mprotect_every == 0 {
            return Err("workload.mprotect_every: must be at least 1".into());
        }
        if self.stride_bytes == 0
            || !self.stride_bytes.is_multiple_of(8)
            || self.stride_bytes > PAGE
        {
            return Err(format!(
                "workload.stride_bytes: must be a multiple of 8 (a word) from 8 to {PAGE}, got {}",
                self.stride_bytes
            ));
        }
        Ok(())
    }

    /// Each thread's private pages plus the shared region; every thread
    /// makes its `refs_per_thread` references.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let threads = self.threads as u64;
        Demand {
            pages: add(&[mul(&[threads, self.private_pages]), self.shared_pages]),
            pages_key: if mul(&[threads, self.private_pages]) >= self.shared_pages {
                "private_pages"
            } else {
                "shared_pages"
            },
            vpages: add(&[
                mul(&[threads, add(&[self.private_pages, 1])]),
                self.shared_pages,
            ]),
            vpages_key: "private_pages",
            threads,
            threads_key: "threads",
            spawned: threads,
            spawned_key: "threads",
            work: mul(&[threads, self.refs_per_thread]),
            work_key: "refs_per_thread",
        }
    }
}

#[derive(Default)]
struct Shared {
    region: u64,
    ready: bool,
    finished: usize,
    faults: u64,
}

pub struct Bench {
    spec: BenchSpec,
    shared: Rc<RefCell<Shared>>,
}

impl Bench {
    pub fn new(spec: BenchSpec) -> Bench {
        Bench {
            spec,
            shared: Rc::default(),
        }
    }
}

const PAGE: u64 = 4096;

impl Workload for Bench {
    fn start(&mut self, sim: &Sim) {
        let task = sim.create_task();
        for t in 0..self.spec.threads {
            let p = Sweeper {
                spec: self.spec.clone(),
                shared: self.shared.clone(),
                index: t as u64,
                done: 0,
                phase: 0,
            };
            sim.spawn_thread(task, Box::new(p), Some(CpuId(t as u16)));
        }
    }

    fn report(&self) -> WorkloadReport {
        let s = self.shared.borrow();
        let mut r = WorkloadReport {
            name: "bench".into(),
            verdict: verdict(s.finished == self.spec.threads),
            ..Default::default()
        };
        r.figures
            .insert("threads_finished".into(), s.finished as f64);
        r.figures
            .insert("write_faults_on_shared".into(), s.faults as f64);
        r
    }
}

/// References per batch; the kinds alternate batch by batch.
const CHUNK: u64 = 1024;

struct Sweeper {
    spec: BenchSpec,
    shared: Rc<RefCell<Shared>>,
    index: u64,
    done: u64,
    phase: u8,
}

impl Sweeper {
    fn private_base(&self, region: u64) -> u64 {
        region + (self.spec.shared_pages + self.index * self.spec.private_pages) * PAGE
    }
}

impl Program for Sweeper {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        if ctx.fault.is_some() {
            self.shared.borrow_mut().faults += 1;
        }
        let sh = self.shared.clone();
        if !sh.borrow().ready {
            if self.index == 0 {
                if self.phase == 0 {
                    self.phase = 1;
                    let pages =
                        self.spec.shared_pages + self.spec.threads as u64 * self.spec.private_pages;
                    return Op::Syscall(Syscall::Mmap {
                        pages,
                        prot: Prot::ReadWrite,
                    });
                }
                let mut s = sh.borrow_mut();
                s.region = ctx.ret;
                s.ready = true;
            } else {
                return Op::Compute(200);
            }
        }
        let region = sh.borrow().region;
        if self.done >= self.spec.refs_per_thread {
            sh.borrow_mut().finished += 1;
            return Op::Exit;
        }
        // One mprotect every `mprotect_every` references machine-wide: the
        // threads make references at the same rate, so each takes its turn
        // every `mprotect_every × threads` machine-wide references, that is
        // every `mprotect_every` of its own, staggered by its index.
        let period = self.spec.mprotect_every;
        let turn = self.index * self.spec.mprotect_every / self.spec.threads as u64;
        let shared_page = region + ((self.done / period) % self.spec.shared_pages) * PAGE;
        match self.phase {
            2 => {
                self.phase = 3;
                return Op::Syscall(Syscall::Mprotect {
                    va: shared_page,
                    pages: 1,
                    prot: Prot::ReadWrite,
                });
            }
            // The pair is done: the chunk that was due when it began runs
            // now (it is not skipped, so every thread makes exactly
            // `refs_per_thread` references, however small the period).
            3 => self.phase = 4,
            _ => {}
        }
        let chunk = CHUNK.min(self.spec.refs_per_thread - self.done);
        let before = self.done;
        let after = before + chunk;
        if self.phase != 4
            && (before + period - turn) / period != (after + period - turn) / period
            && after > turn
        {
            self.phase = 2;
            return Op::Syscall(Syscall::Mprotect {
                va: shared_page,
                pages: 1,
                prot: Prot::Read,
            });
        }
        self.phase = 1;
        self.done = after;
        // Alternate private stores, private loads and shared loads.
        let pos = before / CHUNK;
        let (base, pages, kind) = match pos % 4 {
            0 => (
                self.private_base(region),
                self.spec.private_pages,
                RefKind::Store(self.index),
            ),
            1 | 2 => (
                self.private_base(region),
                self.spec.private_pages,
                RefKind::Load,
            ),
            _ => (region, self.spec.shared_pages, RefKind::Load),
        };
        let wrap = pages * PAGE;
        let stride = self.spec.stride_bytes;
        Op::Refs(Refs {
            base,
            start: (before * stride) % wrap,
            stride,
            count: chunk,
            wrap,
            kind,
        })
    }
}
