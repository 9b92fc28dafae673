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

pub fn verdict(ok: bool) -> String {
    if ok {
        "consistent".into()
    } else {
        "inconsistent".into()
    }
}
