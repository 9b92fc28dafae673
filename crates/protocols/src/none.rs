//! `none`: edits the page tables and never touches any TLB. The negative
//! control every correctness claim is measured against.

use mmulab_engine::Cycles;
use mmulab_kernel::{KFuture, Protocol, Sim, Update};
use mmulab_machine::CpuId;

pub struct NoShootdown;

impl Protocol for NoShootdown {
    fn name(&self) -> &'static str {
        "none"
    }

    fn update<'a>(&'a self, sim: &'a Sim, cpu: CpuId, u: Update) -> KFuture<'a> {
        Box::pin(async move {
            let edit = sim.w().pt_apply(cpu, &u);
            let c = sim.costs().pte_write_cycles * edit.changed;
            sim.delay(cpu, Cycles(c)).await;
        })
    }
}
