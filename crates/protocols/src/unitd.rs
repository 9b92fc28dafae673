//! romanescu10's UNITD and its ideal-invalidation bound, behind the pmap
//! interface. Both run "the same kernel recompiled without TLB shootdown
//! procedures" (§6.1): a reduction takes the page-table lock, stores the
//! PTEs and releases the lock — no IPI, no flush. Under `unitd` each PTE
//! store is an ownership request that the PCAMs snoop (§4.2), and the store
//! performs only once every TLB copy is invalidated (§5.3.2), so the
//! operation is complete when the stores are. Under `ideal` (§6.3) the
//! hardware instead checks every TLB hit against its PTE for free.
//!
//! The broken variants switch off one piece of the hardware each; the
//! oracle (or the memory system's checker) must catch every one.

use mmulab_engine::Cycles;
use mmulab_kernel::memory::TlbHardware;
use mmulab_kernel::pmap::PtEdit;
use mmulab_kernel::{Change, KFuture, Protocol, Sim, Update};
use mmulab_machine::CpuId;
use mmulab_memsys::Faults;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Unitd,
    Ideal,
    /// Negative controls: UNITD with one mechanism broken.
    NoPcam,
    SnoopSkipsPcam,
    NoSelfSnoop,
    DirectoryForgetsTlbSharers,
    JettyMissesInsert,
    /// A cache controller acks an invalidation before performing it: the
    /// memory system's checker must catch it (not a TLB bug).
    AckBeforeInvalidate,
    /// Unmapping a whole page-table page changes only the upper-level
    /// entry: the last-level PTEs the TLBs are tagged with never see a
    /// store (§4.1's rule broken).
    UpperLevelOnly,
    /// A core performs an access whose translation a PCAM hit killed
    /// during its miss, instead of replaying its lookup (§5.1 broken).
    NoReplay,
    /// A software TLB miss handler never supplies the PTE's address to
    /// the PCAM (§4.1's dedicated instruction left out).
    SwtlbNoPteAddress,
}

pub struct Unitd {
    variant: Variant,
}

impl Unitd {
    pub fn new(variant: Variant) -> Unitd {
        Unitd { variant }
    }
}

impl Protocol for Unitd {
    fn name(&self) -> &'static str {
        match self.variant {
            Variant::Unitd => "unitd",
            Variant::Ideal => "ideal",
            Variant::NoPcam => "unitd-no-pcam",
            Variant::SnoopSkipsPcam => "unitd-snoop-skips-pcam",
            Variant::NoSelfSnoop => "unitd-no-self-snoop",
            Variant::DirectoryForgetsTlbSharers => "unitd-directory-forgets-tlb",
            Variant::JettyMissesInsert => "unitd-jetty-misses-insert",
            Variant::AckBeforeInvalidate => "unitd-ack-before-invalidate",
            Variant::UpperLevelOnly => "unitd-upper-level-only",
            Variant::NoReplay => "unitd-no-replay",
            Variant::SwtlbNoPteAddress => "unitd-swtlb-no-pte-address",
        }
    }

    /// The same Linux kernel as `linux` (§6.1): `mmap_sem`'s
    /// reader/writer discipline (see `linux`).
    fn rw_vm_locks(&self) -> bool {
        true
    }

    /// The same kernel's lazy TLB mode: an idle CPU keeps the last
    /// address space loaded (no shootdown ever makes it leave: the
    /// hardware keeps its TLB coherent), so the next thread of that task
    /// there needs no CR3 load.
    fn lazy_tlb(&self) -> bool {
        true
    }

    fn tlb_hardware(&self) -> TlbHardware {
        let mut f = Faults::default();
        match self.variant {
            Variant::Ideal => return TlbHardware::Ideal,
            Variant::Unitd => {}
            Variant::NoPcam => f.pcam_disabled = true,
            Variant::SnoopSkipsPcam => f.snoop_skips_pcam = true,
            Variant::NoSelfSnoop => f.no_self_snoop = true,
            Variant::DirectoryForgetsTlbSharers => f.directory_forgets_tlb_sharers = true,
            Variant::JettyMissesInsert => f.jetty_misses_insert = true,
            Variant::AckBeforeInvalidate => f.ack_before_invalidate = true,
            Variant::UpperLevelOnly => {}
            Variant::NoReplay => f.no_replay = true,
            Variant::SwtlbNoPteAddress => f.swtlb_no_pte_address = true,
        }
        TlbHardware::Unitd(f)
    }

    fn update<'a>(&'a self, sim: &'a Sim, cpu: CpuId, u: Update) -> KFuture<'a> {
        Box::pin(async move {
            let costs = sim.costs();
            // The page-table lock remains (§6.1); preemption is never on in
            // the model's kernel.
            sim.lock_pmap(cpu, u.pmap).await;
            let mut edit = PtEdit::default();
            let mut rest = vec![(u.start, u.pages)];
            if u.change == Change::Remove {
                // Whole page-table pages go by their upper-level entry,
                // with the change pushed down to the last level (§4.1).
                let push_down = self.variant != Variant::UpperLevelOnly;
                (edit, rest) = sim.w().pt_remove_tables(cpu, &u, push_down);
            }
            for (start, pages) in rest {
                let part = Update { start, pages, ..u };
                let e = sim.w().pt_apply(cpu, &part);
                edit.changed += e.changed;
                edit.mem_cycles += e.mem_cycles;
            }
            let c = Cycles(costs.pte_write_cycles * edit.changed) + edit.mem_cycles;
            sim.delay(cpu, c).await;
            sim.count("unitd.pte_stores", edit.changed);
            sim.unlock_pmap(cpu, u.pmap).await;
        })
    }
}
