//! romanescu10 §5.3.3: synonyms (two virtual pages mapping one physical
//! page) are defined by different PTEs, so changing one translation leaves
//! the other alone — and a store to the shared data page itself is no PTE
//! store at all.

use mmulab_memsys::{AccessKind, MemConfig, MemSystem};

const DTLB: usize = 1;

#[test]
fn changing_one_synonym_leaves_the_other_translation_valid() {
    let cfg = MemConfig {
        cores: 2,
        ..MemConfig::default()
    };
    let mut m = MemSystem::new(&cfg, 7);
    let mut probes = Vec::new();
    // Two PTEs in different blocks (and pages) both map data frame 0x9000.
    let (pte_a, pte_b, data) = (0x1000u64, 0x2040u64, 0x9000u64);
    for (i, pte) in [pte_a, pte_b].into_iter().enumerate() {
        m.access(0, pte, AccessKind::WalkLoad, &mut probes);
        m.pcam_insert(0, DTLB, i, pte);
    }
    assert!(probes.is_empty());
    // Core 1 writes the shared data page through its own mapping.
    m.access(1, data, AccessKind::Store, &mut probes);
    assert!(probes.is_empty(), "a data store hit a PCAM: {probes:?}");
    // Core 1 changes synonym A's PTE: only A's translation dies.
    m.access(1, pte_a, AccessKind::Store, &mut probes);
    assert_eq!(probes.len(), 1, "{probes:?}");
    assert_eq!(
        (probes[0].core, probes[0].tlb, probes[0].index),
        (0, DTLB, 0)
    );
    assert_eq!(m.pcam_entry(0, DTLB, 1), Some(pte_b));
    assert_eq!(m.checker_violations(), 0);
}
