//! `global`: the simplest correct scheme. The initiator stops every other
//! online CPU with an interrupt, changes the table while they spin, and
//! every CPU flushes its whole TLB. Correct, and slow on purpose.

use std::cell::Cell;

use mmulab_engine::Cycles;
use mmulab_kernel::{Ipl, Irq, KFuture, Protocol, Sim, Update, Watch};
use mmulab_machine::CpuId;

use crate::ProtocolOptions;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    None,
    /// Only the initiator flushes; responders are stopped but keep their
    /// stale entries (the foundation's mutation test).
    InitiatorOnly,
}

pub struct Global {
    mutation: Mutation,
    /// The one lock serialising global shootdowns.
    lock: Cell<Option<usize>>,
    /// Round number and responders stopped in it.
    round: Cell<u64>,
    stopped: Cell<usize>,
    released: Cell<u64>,
    /// What the spinners watch: `stopped` (the initiator) and `released`
    /// (the responders); touched at every change.
    stopped_watch: Cell<Watch>,
    released_watch: Cell<Watch>,
}

impl Global {
    pub fn new(_o: &ProtocolOptions, mutation: Mutation) -> Global {
        Global {
            mutation,
            lock: Cell::new(None),
            round: Cell::new(0),
            stopped: Cell::new(0),
            released: Cell::new(0),
            stopped_watch: Cell::new(Watch::Any),
            released_watch: Cell::new(Watch::Any),
        }
    }
}

impl Protocol for Global {
    fn name(&self) -> &'static str {
        match self.mutation {
            Mutation::None => "global",
            Mutation::InitiatorOnly => "global-initiator-only",
        }
    }

    fn init(&self, sim: &Sim) {
        self.lock.set(Some(sim.new_lock()));
        self.stopped_watch.set(sim.new_watch());
        self.released_watch.set(sim.new_watch());
    }

    fn update<'a>(&'a self, sim: &'a Sim, cpu: CpuId, u: Update) -> KFuture<'a> {
        Box::pin(async move {
            let start = sim.now();
            let lock = self.lock.get().expect("initialised");
            // Take the lock with interrupts enabled so that a CPU waiting
            // for it still answers the holder's interrupt.
            sim.lock(cpu, lock).await;
            let saved = sim.set_ipl(cpu, Ipl::ALL);
            let others: Vec<CpuId> = {
                let w = sim.w();
                w.cpus
                    .iter()
                    .filter(|c| c.online && c.id != cpu)
                    .map(|c| c.id)
                    .collect()
            };
            self.round.set(self.round.get() + 1);
            self.stopped.set(0);
            sim.touch(self.stopped_watch.get());
            for &t in &others {
                sim.send_ipi(cpu, t, Irq::Shootdown).await;
            }
            let n = others.len();
            sim.spin_until_watching(
                cpu,
                "global: every CPU stopped",
                self.stopped_watch.get(),
                |_| self.stopped.get() == n,
            )
            .await;
            sim.record("shootdown.initiator_cycles", (sim.now() - start).0 as f64);
            sim.count("shootdown.count", 1);
            let edit = sim.w().pt_apply(cpu, &u);
            let c = sim.costs().pte_write_cycles * edit.changed;
            sim.delay(cpu, Cycles(c)).await;
            let f = sim.tlb_flush(cpu);
            sim.delay(cpu, f).await;
            self.released.set(self.round.get());
            sim.touch(self.released_watch.get());
            sim.set_ipl(cpu, saved);
            sim.unlock(cpu, lock).await;
        })
    }

    fn interrupt<'a>(&'a self, sim: &'a Sim, cpu: CpuId) -> KFuture<'a> {
        Box::pin(async move {
            let start = sim.now();
            let round = self.round.get();
            self.stopped.set(self.stopped.get() + 1);
            sim.touch(self.stopped_watch.get());
            sim.spin_until_watching(
                cpu,
                "global: initiator done",
                self.released_watch.get(),
                |_| self.released.get() >= round,
            )
            .await;
            if self.mutation == Mutation::None {
                let f = sim.tlb_flush(cpu);
                sim.delay(cpu, f).await;
            }
            sim.record("shootdown.responder_cycles", (sim.now() - start).0 as f64);
        })
    }
}
