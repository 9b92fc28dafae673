//! The workloads layer of DESIGN.md. A workload creates tasks and threads
//! on a booted simulation and, after the run, gives its own verdict and
//! figures.

pub mod apps;
pub mod balan92;
pub mod bench;
pub mod random;
pub mod romanescu10;
pub mod tester;

use std::collections::BTreeMap;

use mmulab_kernel::Sim;
use serde::{Deserialize, Serialize};

/// A workload's own end-to-end result.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WorkloadReport {
    pub name: String,
    /// "consistent" or "inconsistent" (the workload's own check).
    pub verdict: String,
    pub figures: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

pub trait Workload {
    fn start(&mut self, sim: &Sim);
    fn report(&self) -> WorkloadReport;
}

/// The `[workload]` table of a spec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum WorkloadSpec {
    /// black89 §5.1's consistency tester.
    Tester(tester::TesterSpec),
    /// The fixed speed workload of `mmulab bench`.
    Bench(bench::BenchSpec),
    /// The randomized correctness workload of `mmulab check`.
    Random(random::RandomSpec),
    /// black89 §5.2 stand-ins.
    Kbuild(apps::KbuildSpec),
    Parthenon(apps::ParthenonSpec),
    Camelot(apps::CamelotSpec),
    /// balan92 Figs. 1-3: shootdown cost measurements.
    Balan92Shootdown(balan92::ShootdownSpec),
    /// balan92 §Lazy Shutdowns: segkmem allocate/free churn.
    KmemChurn(balan92::KmemChurnSpec),
    /// balan92 §Lazy Shutdowns: file reads and writes through segmap.
    FileIo(balan92::FileIoSpec),
    /// balan92 §Pageout: working-set aging, local or global.
    PageoutAging(balan92::PageoutAgingSpec),
    /// balan92 Fig. 4: concurrent fork/exec/exit benchmark copies.
    ForkBench(balan92::ForkBenchSpec),
    /// balan92 §Analysis: concurrent page faults, across or within processes.
    FaultStorm(balan92::FaultStormSpec),
    /// romanescu10 Table 2: single/multiple cow/unmap.
    UnitdMicro(romanescu10::MicroSpec),
    /// romanescu10 §6.3's real benchmarks, as labelled stand-ins.
    UnitdApp(romanescu10::AppSpec),
}

impl WorkloadSpec {
    pub fn build(&self) -> Box<dyn Workload> {
        match self {
            WorkloadSpec::Tester(s) => Box::new(tester::Tester::new(s.clone())),
            WorkloadSpec::Bench(s) => Box::new(bench::Bench::new(s.clone())),
            WorkloadSpec::Random(s) => Box::new(random::Random::new(s.clone())),
            WorkloadSpec::Kbuild(s) => Box::new(apps::Kbuild::new(s.clone())),
            WorkloadSpec::Parthenon(s) => Box::new(apps::Parthenon::new(s.clone())),
            WorkloadSpec::Camelot(s) => Box::new(apps::Camelot::new(s.clone())),
            WorkloadSpec::Balan92Shootdown(s) => Box::new(balan92::Shootdown::new(s.clone())),
            WorkloadSpec::KmemChurn(s) => Box::new(balan92::KmemChurn::new(s.clone())),
            WorkloadSpec::FileIo(s) => Box::new(balan92::FileIo::new(s.clone())),
            WorkloadSpec::PageoutAging(s) => Box::new(balan92::PageoutAging::new(s.clone())),
            WorkloadSpec::ForkBench(s) => Box::new(balan92::ForkBench::new(s.clone())),
            WorkloadSpec::FaultStorm(s) => Box::new(balan92::FaultStorm::new(s.clone())),
            WorkloadSpec::UnitdMicro(s) => Box::new(romanescu10::Micro::new(s.clone())),
            WorkloadSpec::UnitdApp(s) => Box::new(romanescu10::AppWorkload::new(s.clone())),
        }
    }

    /// Checks values against the machine; errors name the key.
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        match self {
            WorkloadSpec::Tester(s) => s.validate(cpus),
            WorkloadSpec::Bench(s) => s.validate(cpus),
            WorkloadSpec::Random(s) => s.validate(cpus),
            WorkloadSpec::Kbuild(s) => s.validate(cpus),
            WorkloadSpec::Parthenon(s) => s.validate(cpus),
            WorkloadSpec::Camelot(s) => s.validate(cpus),
            WorkloadSpec::Balan92Shootdown(s) => s.validate(cpus),
            WorkloadSpec::KmemChurn(s) => s.validate(cpus),
            WorkloadSpec::FileIo(s) => s.validate(cpus),
            WorkloadSpec::PageoutAging(s) => s.validate(cpus),
            WorkloadSpec::ForkBench(s) => s.validate(cpus),
            WorkloadSpec::FaultStorm(s) => s.validate(cpus),
            WorkloadSpec::UnitdMicro(s) => s.validate(cpus),
            WorkloadSpec::UnitdApp(s) => s.validate(cpus),
        }
    }

    /// What the workload asks of the machine and the host (see [`Demand`]).
    pub fn demand(&self, cpus: usize) -> Demand {
        match self {
            WorkloadSpec::Tester(s) => s.demand(cpus),
            WorkloadSpec::Bench(s) => s.demand(cpus),
            WorkloadSpec::Random(s) => s.demand(cpus),
            WorkloadSpec::Kbuild(s) => s.demand(cpus),
            WorkloadSpec::Parthenon(s) => s.demand(cpus),
            WorkloadSpec::Camelot(s) => s.demand(cpus),
            WorkloadSpec::Balan92Shootdown(s) => s.demand(cpus),
            WorkloadSpec::KmemChurn(s) => s.demand(cpus),
            WorkloadSpec::FileIo(s) => s.demand(cpus),
            WorkloadSpec::PageoutAging(s) => s.demand(cpus),
            WorkloadSpec::ForkBench(s) => s.demand(cpus),
            WorkloadSpec::FaultStorm(s) => s.demand(cpus),
            WorkloadSpec::UnitdMicro(s) => s.demand(cpus),
            WorkloadSpec::UnitdApp(s) => s.demand(cpus),
        }
    }

    /// Checks the workload's sizes against the machine: the pages it may
    /// hold must fit physical memory (`memory_pages` frames of 4 KiB; a
    /// run that ran out panicked in the VM layer) and its threads must stay
    /// within [`MAX_THREADS`]. Errors name the workload's key.
    pub fn fits(&self, cpus: usize, memory_pages: u64) -> Result<(), String> {
        let d = self.demand(cpus);
        if d.pages > memory_pages {
            return Err(format!(
                "workload.{}: the workload may hold {} pages ({} MiB) of simulated memory, more than machine.memory_mb provides ({} pages, {} MiB)",
                d.pages_key,
                d.pages,
                d.pages / 256,
                memory_pages,
                memory_pages / 256
            ));
        }
        if d.vpages > mmulab_kernel::vm::USER_PAGES {
            return Err(format!(
                "workload.{}: one task's mappings take {} pages of address space over the run, more than the {} pages (3 GB) below the kernel",
                d.vpages_key,
                d.vpages,
                mmulab_kernel::vm::USER_PAGES
            ));
        }
        if d.threads > MAX_THREADS {
            return Err(format!(
                "workload.{}: the workload creates {} threads, more than the {MAX_THREADS} a run may have",
                d.threads_key, d.threads
            ));
        }
        Ok(())
    }

    pub fn names() -> &'static [(&'static str, &'static str)] {
        &[
            (
                "tester",
                "black89 §5.1: k children increment counters, the main thread reprotects their page read-only",
            ),
            (
                "bench",
                "speed: threads load and store over private and shared pages, an mprotect every N references",
            ),
            (
                "random",
                "correctness: random mmap/munmap/mprotect/fork/COW/migration/sleep/kmem churn on several tasks",
            ),
            (
                "balan92-shootdown",
                "balan92 Figs. 1-3: hat_shutdown (basic, lazy) or a one-page unmap (immediate) while the other CPUs spin",
            ),
            (
                "unitd-micro",
                "romanescu10 Table 2: parse a 50 MB mapped file, COW-store or unmap every N-th page (single or multiple initiators)",
            ),
            (
                "unitd-app",
                "romanescu10 §6.3 stand-ins: swaptions, pca, string_match, small wordcount (synthetic, labelled)",
            ),
            (
                "kmem-churn",
                "balan92 §Lazy Shutdowns: allocate and free kernel memory of mixed sizes (segkmem zones)",
            ),
            (
                "file-io",
                "balan92 §Lazy Shutdowns: file reads and writes through segmap chunks, with its aging daemon",
            ),
            (
                "pageout-aging",
                "balan92 §Pageout: LWPs store into their working sets while the pageout daemon ages the process",
            ),
            (
                "fork-bench",
                "balan92 Fig. 4: k concurrent copies of fork/exit, fork/exec/exit or fork/sbrk/exit over bss sizes",
            ),
            (
                "fault-storm",
                "balan92 §Analysis: concurrent zero-fill faults in different processes or among one process's LWPs",
            ),
        ]
    }
}

/// The most threads a workload may create in one run. Every thread is a
/// coroutine with its own state, and the scheduler's run queue and the
/// per-thread bookkeeping grow with them: 100,000 threads in one task ran
/// for minutes without finishing.
pub const MAX_THREADS: u64 = 16_384;

/// What a workload asks of the machine and of the host, for the checks made
/// before a run: its sizes against the machine (`WorkloadSpec::fits`) and
/// the run's estimate of host memory and work. Each figure is computed
/// from the workload's keys (an upper bound where the workload's draws
/// allow one, an estimate where it depends on timing) and comes with the
/// key that drives it, so a refusal can name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Demand {
    /// Pages of simulated memory the workload may hold at once (for the
    /// random workload, whose draws decide, the least that must fit).
    pub pages: u64,
    pub pages_key: &'static str,
    /// Pages of user address space one task's mappings take over the run
    /// (addresses are never reused), against the kernel's `USER_PAGES`;
    /// for the random workload, what its threads' largest regions need.
    pub vpages: u64,
    pub vpages_key: &'static str,
    /// Threads alive at once (a process counts as its threads).
    pub threads: u64,
    pub threads_key: &'static str,
    /// Threads created over one run: each keeps its bookkeeping (and a
    /// process its address space's) until the run ends.
    pub spawned: u64,
    pub spawned_key: &'static str,
    /// Operations of one run: memory references, system calls and the
    /// pages they walk, roughly what the simulator loops over.
    pub work: u64,
    pub work_key: &'static str,
}

/// Saturating products and sums for [`Demand`]: a spec's counts may be
/// anything a u64 holds, and an estimate that wrapped would pass a check.
pub(crate) fn mul(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x))
}
pub(crate) fn add(xs: &[u64]) -> u64 {
    xs.iter().fold(0u64, |a, &x| a.saturating_add(x))
}

pub fn verdict(ok: bool) -> String {
    if ok {
        "consistent".into()
    } else {
        "inconsistent".into()
    }
}
