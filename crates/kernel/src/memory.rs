//! The memory system behind the walker and the user hot path.
//!
//! Flat by default: every reference costs the preset's `ref_cycles` and a
//! walk `mem_cycles + walk_level_cycles` per level. A spec with a
//! `[memory]` table puts romanescu10's Table 1 hierarchy (private L1I/L1D,
//! shared L2, MOSI over snooping or a directory) behind both, through
//! `mmulab-memsys`: references and walker loads take the caches' latency,
//! PTE stores are ordinary stores, and — when the protocol declares UNITD
//! hardware — every ownership request and local store probes the PCAMs,
//! whose hits invalidate TLB entries here.
//!
//! With a hierarchy that declares an I-TLB (`tlbs_per_core = 2`, as
//! Table 1 does), each core has one beside its D-TLB, and every task a
//! read-only text segment: a user thread fetches its loop's code line
//! through the I-TLB and the L1I when its program starts an operation and
//! on every return to user mode (`Sim::fetch_instruction`). I-TLB misses
//! walk like data misses and fill the I-TLB's PCAM (index [`ITLB`]); every
//! software flush reaches both TLBs.

use mmulab_engine::Cycles;
use mmulab_machine::CpuId;
use mmulab_memsys::{AccessKind, Faults, MemSystem};

use crate::sim::World;

/// The TLB-coherence hardware a protocol assumes (declared by
/// [`crate::Protocol::tlb_hardware`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TlbHardware {
    /// TLBs are not coherent: software shoots down (every classic
    /// protocol).
    #[default]
    Software,
    /// romanescu10 UNITD: PCAMs snoop ownership requests and local stores;
    /// `faults` break it on purpose for negative controls.
    Unitd(Faults),
    /// romanescu10 §6.3's ideal invalidation: every TLB hit is checked
    /// against its PTE for free; a stale entry is dropped and re-walked.
    Ideal,
}

/// Which TLB of a core a PCAM shadows (`mmulab_memsys`'s PCAM index):
/// the I-TLB, present with a memory system (`tlbs_per_core = 2`) and filled by user threads' instruction fetches (one fetch of the
/// running loop's code line per operation and return to user mode, see
/// `Sim::fetch_instruction`) ...
pub const ITLB: usize = 0;
/// ... and the D-TLB, filled by data references.
pub const DTLB: usize = 1;

impl World {
    /// True when a cache hierarchy sits behind the walker and the hot path.
    #[inline]
    pub fn has_memsys(&self) -> bool {
        self.memsys.is_some()
    }

    /// True when every core has an I-TLB beside its D-TLB (a hierarchy
    /// with `tlbs_per_core = 2`): tasks then get a text segment and user
    /// threads fetch through it.
    #[inline]
    pub fn has_itlb(&self) -> bool {
        self.cpus.first().is_some_and(|c| c.itlb.is_some())
    }

    /// One access by `cpu` through the memory system; applies the TLB
    /// invalidations its PCAM probes found. Returns its latency.
    #[inline]
    pub fn mem_access(&mut self, cpu: CpuId, pa: u64, kind: AccessKind) -> Cycles {
        let Some(ms) = self.memsys.as_mut() else {
            return Cycles(0);
        };
        let lat = ms.access(cpu.index(), pa, kind, &mut self.probes);
        if !self.probes.is_empty() {
            self.apply_probes();
        }
        Cycles(lat)
    }

    /// Invalidates the TLB entries whose PCAM entries matched. An access
    /// in flight whose translation is invalidated is killed: it must
    /// replay (§5.1). That includes a recall of the PTE's block from the
    /// L2: the PCAM entry is gone, so a later store to the PTE would go
    /// unseen.
    #[inline(never)]
    fn apply_probes(&mut self) {
        apply_probes(&mut self.cpus, &mut self.counters, &mut self.probes);
    }

    /// The reductions recorded for `slot` took effect with a PTE store
    /// just made. Coherent TLB hardware (UNITD, ideal) invalidates every
    /// copy before the store performs (romanescu10 §5.3.2), so for the
    /// oracle they complete now, not when the VM operation ends; software
    /// shootdowns complete them later.
    pub(crate) fn reduction_stored(&mut self, slot: u32) {
        if self.memsys.is_some() && !matches!(self.tlb_hw, TlbHardware::Software) {
            self.oracle.complete_slot(slot);
        }
    }

    /// A frame of kernel data that lives in the memory system, for a
    /// protocol whose shared state (a shootdown's victim list) is read and
    /// written by its CPUs' caches; returns its physical address. None on
    /// flat memory, where kernel data costs only the protocol's step costs
    /// (and no frame is taken, so flat runs keep their frame numbers).
    pub fn alloc_kernel_data(&mut self) -> Option<u64> {
        self.memsys.as_ref()?;
        let pfn = self
            .mem
            .alloc_data()
            .expect("memory for the kernel's data at boot");
        Some(pfn.0 * self.mem.page_size())
    }

    /// A PTE store by `cpu` (kernel page-table edit or walker A/D update).
    /// Flat memory: free here (protocols charge `pte_write_cycles`).
    pub fn pte_store(&mut self, cpu: CpuId, pte_pa: u64) -> Cycles {
        self.mem_access(cpu, pte_pa, AccessKind::Store)
    }

    /// Records a fill of TLB `tlb` ([`ITLB`] or [`DTLB`]) at `slot`.
    #[inline]
    pub fn pcam_fill_tlb(&mut self, cpu: CpuId, tlb: usize, slot: usize, pte_pa: u64) {
        if !matches!(self.tlb_hw, TlbHardware::Software)
            && let Some(ms) = self.memsys.as_mut()
        {
            ms.pcam_insert(cpu.index(), tlb, slot, pte_pa);
        }
    }

    /// After a flush or invalidation of `cpu`'s TLBs: PCAM entries of
    /// invalid slots are cleared, in the I-TLB's PCAM and the D-TLB's
    /// (they are "removed as a result of the replacement", §4.2, and a
    /// flush empties the TLB).
    pub fn pcam_sync(&mut self, cpu: CpuId) {
        let Some(ms) = self.memsys.as_mut() else {
            return;
        };
        if matches!(self.tlb_hw, TlbHardware::Software) {
            return;
        }
        let ci = cpu.index();
        let c = &self.cpus[ci];
        let tlbs = c.itlb.iter().map(|t| (ITLB, t)).chain([(DTLB, &c.tlb)]);
        for (which, tlb) in tlbs {
            for (i, e) in tlb.entries().iter().enumerate() {
                if !e.valid {
                    ms.pcam_clear(ci, which, i);
                }
            }
        }
    }

    /// Clears a freed page-table frame with stores before it can be reused
    /// (romanescu10 §4.1: "a freed table page cleared before reuse"), so
    /// that a TLB entry whose PTE lived there is invalidated. Returns the
    /// cost; nothing to do on flat memory.
    pub fn clear_table_frame(&mut self, cpu: CpuId, pfn: mmulab_machine::Pfn) -> Cycles {
        let Some(ms) = self.memsys.as_ref() else {
            return Cycles(0);
        };
        let block = ms.config().l2.block_bytes;
        let base = pfn.0 << crate::sim::PAGE_SHIFT;
        let mut c = Cycles(0);
        let mut off = 0;
        while off < crate::sim::PAGE_SIZE {
            c += self.mem_access(cpu, base + off, AccessKind::Store);
            off += block;
        }
        c
    }
}

/// `World::apply_probes` on the world's parts, for a caller that holds
/// other parts of it (the user hot path's run of references to one page):
/// invalidates the TLB entries whose PCAM entries matched, and kills an
/// access in flight whose translation that was.
#[inline(never)]
pub(crate) fn apply_probes(
    cpus: &mut [crate::cpu::Cpu],
    counters: &mut mmulab_engine::Counters,
    probes: &mut Vec<mmulab_memsys::TlbProbe>,
) {
    for p in probes.drain(..) {
        let c = &mut cpus[p.core];
        let e = match p.tlb {
            DTLB => c.tlb.entry_mut(p.index),
            ITLB if c.control_itlb_unflushed => continue,
            ITLB => c
                .itlb
                .as_mut()
                .expect("an I-TLB PCAM hit on a core without an I-TLB")
                .entry_mut(p.index),
            t => unreachable!("PCAM {t}: a core has an I-TLB and a D-TLB only"),
        };
        if e.valid {
            e.valid = false;
            counters.add("unitd.tlb_invalidations", 1);
            if let Some(f) = c.inflight.as_mut()
                && p.tlb == DTLB
                && f.slot == p.index
            {
                f.killed = true;
            }
        }
    }
}

/// The memory system's counters as `mem.*` result counters, and its
/// checker's verdict folded into the oracle report (one verdict per run).
pub(crate) fn report(
    ms: &MemSystem,
    counters: &mut mmulab_engine::Counters,
    oracle: &mut mmulab_machine::oracle::OracleReport,
) {
    let s = ms.stats();
    let fields: [(&str, u64); 25] = [
        ("mem.l1i_hits", s.l1i_hits),
        ("mem.l1i_misses", s.l1i_misses),
        ("mem.l1d_hits", s.l1d_hits),
        ("mem.l1d_misses", s.l1d_misses),
        ("mem.l2_hits", s.l2_hits),
        ("mem.l2_misses", s.l2_misses),
        ("mem.memory_reads", s.memory_reads),
        ("mem.memory_writebacks", s.memory_writebacks),
        ("mem.l1_writebacks", s.l1_writebacks),
        ("mem.keep_sharer_writebacks", s.keep_sharer_writebacks),
        ("mem.stores", s.stores),
        ("mem.walk_loads", s.walk_loads),
        ("mem.upgrades", s.upgrades),
        ("mem.exclusive_grants", s.exclusive_grants),
        ("mem.cache_to_cache", s.cache_to_cache),
        ("mem.invalidations", s.invalidations),
        ("mem.recalls", s.recalls),
        ("mem.pcam_inserts", s.pcam_inserts),
        ("mem.pcam_lookups", s.pcam_lookups),
        ("mem.pcam_hits", s.pcam_hits),
        ("mem.pcam_false_invalidations", s.pcam_false_invalidations),
        ("mem.pcam_recall_invalidations", s.pcam_recall_invalidations),
        ("mem.jetty_filtered", s.jetty_filtered),
        ("mem.directory_messages", s.directory_messages),
        ("mem.snoop_broadcasts", s.snoop_broadcasts),
    ];
    for (k, v) in fields {
        counters.add(k, v);
    }
    let v = ms.checker_violations();
    counters.add("mem.checker_violations", v);
    if v > 0 {
        oracle.violations += v;
        oracle.verdict = "inconsistent".into();
        oracle.memory_checker_first = ms.first_violation();
    }
}
