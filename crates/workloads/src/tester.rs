//! black89 §5.1, the consistency tester:
//!
//! 1. allocate a page of read-write memory;
//! 2. start k child threads, each incrementing its own counter in that
//!    page in a tight loop;
//! 3. once all are running, the main thread reprotects the page read-only
//!    and immediately saves a copy of the counters;
//! 4. the children take unrecoverable write faults;
//! 5. afterwards the counters are compared with the saved copy: a
//!    difference means some TLB kept granting write access.
//!
//! With k < n processors it causes exactly one user-pmap shootdown
//! involving k processors, which is what Fig. 2 times.

use std::cell::RefCell;
use std::rc::Rc;

use mmulab_kernel::{Op, Program, Prot, RefKind, Refs, Sim, Syscall, ThreadCtx};
use mmulab_machine::CpuId;
use serde::{Deserialize, Serialize};

use crate::{Demand, Workload, WorkloadReport, add, mul, verdict};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TesterSpec {
    /// Child threads (each on its own CPU when there are enough).
    pub children: usize,
    /// Cycles the children run after all have started, before the
    /// reprotect.
    #[serde(default = "TesterSpec::default_warmup")]
    pub warmup_cycles: u64,
    /// How long the main thread waits for the children's faults before it
    /// compares (a broken protocol may let them run forever).
    #[serde(default = "TesterSpec::default_settle")]
    pub settle_cycles: u64,
    /// Poll period of the main thread's waits.
    #[serde(default = "TesterSpec::default_poll")]
    pub poll_cycles: u64,
}

impl TesterSpec {
    fn default_warmup() -> u64 {
        20_000
    }
    fn default_settle() -> u64 {
        2_000_000
    }
    fn default_poll() -> u64 {
        500
    }
    pub fn validate(&self, cpus: usize) -> Result<(), String> {
        if self.children == 0 {
            return Err("workload.children: the tester needs at least one child".into());
        }
        if self.children > 511 * 8 {
            return Err(
                "workload.children: the counters must fit in one page (at most 4088 children)"
                    .into(),
            );
        }
        if self.children >= cpus {
            return Err(format!(
                "workload.children: {} children need {} CPUs (one each plus the main thread), machine.cpus is {cpus}",
                self.children,
                self.children + 1
            ));
        }
        if self.poll_cycles == 0 {
            return Err("workload.poll_cycles: must be at least 1".into());
        }
        Ok(())
    }

    /// One page of counters; each child increments (a reference per
    /// cycle at most) through the warm-up and, under a broken protocol,
    /// the whole settle time.
    pub fn demand(&self, _cpus: usize) -> Demand {
        let children = self.children as u64;
        Demand {
            pages: 1,
            pages_key: "children",
            vpages: 1,
            vpages_key: "children",
            threads: children.saturating_add(1),
            threads_key: "children",
            spawned: children.saturating_add(1),
            spawned_key: "children",
            work: mul(&[children, add(&[self.warmup_cycles, self.settle_cycles])]),
            work_key: "settle_cycles",
        }
    }
}

#[derive(Default)]
struct Shared {
    started: usize,
    faulted: usize,
    saved: Vec<u64>,
    after: Vec<u64>,
    mprotect_cycles: Option<u64>,
    done: bool,
}

pub struct Tester {
    spec: TesterSpec,
    shared: Rc<RefCell<Shared>>,
}

impl Tester {
    pub fn new(spec: TesterSpec) -> Tester {
        Tester {
            spec,
            shared: Rc::default(),
        }
    }
}

impl Workload for Tester {
    fn start(&mut self, sim: &Sim) {
        let task = sim.create_task();
        let main = Main {
            spec: self.spec.clone(),
            shared: self.shared.clone(),
            step: Step::Map,
            page: 0,
            t0: 0,
            i: 0,
        };
        sim.spawn_thread(task, Box::new(main), Some(CpuId(0)));
    }

    fn report(&self) -> WorkloadReport {
        let s = self.shared.borrow();
        let changed = s.saved.iter().zip(&s.after).filter(|(a, b)| a != b).count();
        let mut r = WorkloadReport {
            name: "tester".into(),
            verdict: verdict(changed == 0 && s.done),
            ..Default::default()
        };
        r.figures
            .insert("children".into(), self.spec.children as f64);
        r.figures
            .insert("children_faulted".into(), s.faulted as f64);
        r.figures
            .insert("counters_changed_after_reprotect".into(), changed as f64);
        if let Some(c) = s.mprotect_cycles {
            r.figures.insert("mprotect_cycles".into(), c as f64);
        }
        if !s.done {
            r.notes
                .push("the tester did not finish (time limit or liveness failure)".into());
        }
        if changed > 0 {
            r.notes.push(format!(
                "{changed} counter(s) kept changing after the page became read-only"
            ));
        }
        r
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Map,
    Touch,
    Spawn,
    WaitStarted,
    Warmup,
    Reprotect,
    Save,
    WaitFaults,
    Compare,
    Finish,
}

struct Main {
    spec: TesterSpec,
    shared: Rc<RefCell<Shared>>,
    step: Step,
    page: u64,
    t0: u64,
    i: usize,
}

impl Program for Main {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        let k = self.spec.children;
        loop {
            match self.step {
                Step::Map => {
                    self.step = Step::Touch;
                    return Op::Syscall(Syscall::Mmap {
                        pages: counter_pages(k),
                        prot: Prot::ReadWrite,
                    });
                }
                Step::Touch => {
                    self.page = ctx.ret;
                    self.step = Step::Spawn;
                    return Op::Refs(Refs::one(self.page, RefKind::Store(0)));
                }
                Step::Spawn => {
                    if self.i == k {
                        self.step = Step::WaitStarted;
                        continue;
                    }
                    let child = Child {
                        va: self.page + 8 * self.i as u64,
                        shared: self.shared.clone(),
                        started: false,
                    };
                    self.i += 1;
                    return Op::Syscall(Syscall::ThreadCreate {
                        program: Box::new(child),
                        cpu: Some(CpuId(self.i as u16)),
                    });
                }
                Step::WaitStarted => {
                    if self.shared.borrow().started < k {
                        return Op::Compute(self.spec.poll_cycles);
                    }
                    self.step = Step::Warmup;
                    return Op::Compute(self.spec.warmup_cycles);
                }
                Step::Warmup => {
                    self.step = Step::Reprotect;
                    self.t0 = ctx.now.0;
                    return Op::Syscall(Syscall::Mprotect {
                        va: self.page,
                        pages: counter_pages(k),
                        prot: Prot::Read,
                    });
                }
                Step::Reprotect => {
                    self.shared.borrow_mut().mprotect_cycles = Some(ctx.now.0 - self.t0);
                    self.step = Step::Save;
                    self.i = 0;
                    return Op::Refs(Refs::one(self.page, RefKind::Load));
                }
                Step::Save => {
                    self.shared.borrow_mut().saved.push(ctx.last_load);
                    self.i += 1;
                    if self.i < k {
                        return Op::Refs(Refs::one(self.page + 8 * self.i as u64, RefKind::Load));
                    }
                    self.step = Step::WaitFaults;
                    self.t0 = ctx.now.0;
                }
                Step::WaitFaults => {
                    let waited = ctx.now.0 - self.t0;
                    if self.shared.borrow().faulted < k && waited < self.spec.settle_cycles {
                        return Op::Compute(self.spec.poll_cycles);
                    }
                    self.step = Step::Compare;
                    self.i = 0;
                    return Op::Refs(Refs::one(self.page, RefKind::Load));
                }
                Step::Compare => {
                    self.shared.borrow_mut().after.push(ctx.last_load);
                    self.i += 1;
                    if self.i < k {
                        return Op::Refs(Refs::one(self.page + 8 * self.i as u64, RefKind::Load));
                    }
                    self.step = Step::Finish;
                }
                Step::Finish => {
                    self.shared.borrow_mut().done = true;
                    ctx.end_run = true;
                    return Op::Exit;
                }
            }
        }
    }
}

/// Counters are 8-byte words, 512 to a page: the paper's one page holds
/// up to 512 children; larger machines (the §8 extrapolation) get as many
/// pages as they need, reprotected by one call.
fn counter_pages(children: usize) -> u64 {
    children.div_ceil(512) as u64
}

struct Child {
    va: u64,
    shared: Rc<RefCell<Shared>>,
    started: bool,
}

impl Program for Child {
    fn next(&mut self, ctx: &mut ThreadCtx<'_>) -> Op {
        if ctx.fault.is_some() {
            // Step 4: the unrecoverable write fault ends the child.
            self.shared.borrow_mut().faulted += 1;
            return Op::Exit;
        }
        if !self.started && ctx.last_load > 0 {
            self.started = true;
            self.shared.borrow_mut().started += 1;
        }
        let count = if self.started { u64::MAX / 2 } else { 1 };
        Op::Refs(Refs {
            base: self.va,
            start: 0,
            stride: 0,
            count,
            wrap: 0,
            kind: RefKind::Increment,
        })
    }
}
