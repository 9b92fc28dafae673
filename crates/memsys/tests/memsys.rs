//! Behavioural tests of the UNITD memory system (issue 10's list).

use mmulab_memsys::coherence::{self, Action, Event, State};
use mmulab_memsys::{
    AccessKind::{self, IFetch, Load, Store, WalkLoad},
    CacheConfig, Faults, Interconnect, MemConfig, MemSystem, Protocol, TlbProbe,
    pcam_bits_per_core, pcam_geometry,
};
use proptest::prelude::*;

const DTLB: usize = 1;
const ITLB: usize = 0;

fn dir_cfg() -> MemConfig {
    MemConfig::default()
}

fn snoop_cfg() -> MemConfig {
    MemConfig {
        interconnect: Interconnect::default_snooping(),
        ..MemConfig::default()
    }
}

/// 4 cores, 8-set 2-way L1s, 32-set 2-way L2: evictions and recalls happen.
fn tiny(ic: Interconnect, protocol: Protocol) -> MemConfig {
    let l1 = CacheConfig {
        size_bytes: 1024,
        ways: 2,
        block_bytes: 64,
        latency_cycles: 1,
    };
    MemConfig {
        cores: 4,
        l1i: l1.clone(),
        l1d: l1,
        l2: CacheConfig {
            size_bytes: 4096,
            ways: 2,
            block_bytes: 64,
            latency_cycles: 6,
        },
        protocol,
        interconnect: match ic {
            Interconnect::Directory { .. } => Interconnect::Directory {
                mesh_cols: 2,
                mesh_rows: 2,
                hop_cycles: 2,
                dir_cycles: 6,
                sharers: 0,
            },
            s => s,
        },
        pcam_entries: 8,
        ..MemConfig::default()
    }
}

fn with_faults(mut cfg: MemConfig, f: impl FnOnce(&mut Faults)) -> MemConfig {
    f(&mut cfg.faults);
    cfg
}

struct Sys {
    m: MemSystem,
    probes: Vec<TlbProbe>,
}

impl Sys {
    fn new(cfg: &MemConfig) -> Sys {
        Sys {
            m: MemSystem::new(cfg, 7),
            probes: Vec::new(),
        }
    }
    fn go(&mut self, core: usize, pa: u64, kind: AccessKind) -> u64 {
        self.m.access(core, pa, kind, &mut self.probes)
    }
    /// The walker loads the PTE through the L1D, then the TLB fill writes
    /// the PCAM (§4.1, §5.2).
    fn walk_insert(&mut self, core: usize, tlb: usize, index: usize, pte: u64) {
        self.go(core, pte, WalkLoad);
        self.m.pcam_insert(core, tlb, index, pte);
    }
    fn take(&mut self) -> Vec<TlbProbe> {
        let mut p = std::mem::take(&mut self.probes);
        p.sort();
        p
    }
}

fn probe(core: usize, tlb: usize, index: usize) -> TlbProbe {
    TlbProbe { core, tlb, index }
}

const PTE: u64 = 0x0012_3440; // a PTE in block 0x48d1 (64 B blocks)

#[test]
fn fig6_insert_and_double_hit() {
    for cfg in [dir_cfg(), snoop_cfg()] {
        let mut s = Sys::new(&cfg);
        // Fig. 6a: two translations whose PTEs share one block.
        s.walk_insert(0, DTLB, 3, PTE);
        s.walk_insert(0, DTLB, 9, PTE + 8);
        assert_eq!(s.m.pcam_entry(0, DTLB, 3), Some(PTE));
        assert_eq!(s.m.pcam_entry(0, DTLB, 9), Some(PTE + 8));
        assert!(s.take().is_empty(), "reads never probe PCAMs");
        // Fig. 6b: one store by another core invalidates both.
        s.go(1, PTE, Store);
        assert_eq!(s.take(), vec![probe(0, DTLB, 3), probe(0, DTLB, 9)]);
        assert_eq!(s.m.pcam_entry(0, DTLB, 3), None);
        assert_eq!(s.m.pcam_entry(0, DTLB, 9), None);
        let st = s.m.stats();
        assert_eq!(st.pcam_hits, 2);
        assert_eq!(st.pcam_false_invalidations, 1);
        assert_eq!(s.m.checker_violations(), 0, "{:?}", s.m.first_violation());
    }
}

fn reference(protocol: Protocol, s: State, e: Event) -> Option<(State, Action)> {
    use Action as A;
    use State::*;
    let moesi = protocol == Protocol::Moesi;
    if s == E && !moesi {
        return None;
    }
    Some(match (s, e) {
        (I, Event::Load) => (S, A::GetS),
        (I, Event::LoadExclusive) => (if moesi { E } else { S }, A::GetS),
        (I, Event::Store) => (M, A::GetM),
        (I, _) => (I, A::None),
        (S, Event::Load | Event::LoadExclusive) => (S, A::Hit),
        (S, Event::Store) => (M, A::Upgrade),
        (S, Event::FwdGetS) => (S, A::None),
        (S, Event::FwdGetM) => (I, A::Ack),
        (S, Event::Evict) => (I, A::None),
        (E, Event::Load | Event::LoadExclusive) => (E, A::Hit),
        (E, Event::Store) => (M, A::Hit),
        (E, Event::FwdGetS) => (S, A::Supply),
        (E, Event::FwdGetM) => (I, A::Supply),
        (E, Event::Evict) => (I, A::None),
        (O, Event::Load | Event::LoadExclusive) => (O, A::Hit),
        (O, Event::Store) => (M, A::Upgrade),
        (O, Event::FwdGetS) => (O, A::Supply),
        (O, Event::FwdGetM) => (I, A::Supply),
        (O, Event::Evict) => (I, A::Writeback),
        (M, Event::Load | Event::LoadExclusive | Event::Store) => (M, A::Hit),
        (M, Event::FwdGetS) => (O, A::Supply),
        (M, Event::FwdGetM) => (I, A::Supply),
        (M, Event::Evict) => (I, A::Writeback),
    })
}

#[test]
fn mosi_and_moesi_tables_match_reference() {
    let mut n = 0;
    for p in [Protocol::Mosi, Protocol::Moesi] {
        for s in State::ALL {
            for e in Event::ALL {
                let got = coherence::transition(p, s, e).map(|t| (t.next, t.action));
                assert_eq!(got, reference(p, s, e), "{p:?} {s:?} {e:?}");
                n += 1;
            }
        }
    }
    assert_eq!(n, 60);
}

#[test]
fn mosi_transitions_in_the_system() {
    for cfg in [dir_cfg(), snoop_cfg()] {
        let mut s = Sys::new(&cfg);
        let a = 0x4000;
        s.go(0, a, Load);
        assert_eq!(s.m.l1_state(0, a, false), State::S, "MOSI has no E");
        s.go(1, a, Load);
        assert_eq!(s.m.l1_state(1, a, false), State::S);
        s.go(0, a, Store); // upgrade
        assert_eq!(s.m.l1_state(0, a, false), State::M);
        assert_eq!(s.m.l1_state(1, a, false), State::I);
        s.go(1, a, Load); // FwdGetS: M → O
        assert_eq!(s.m.l1_state(0, a, false), State::O);
        assert_eq!(s.m.l1_state(1, a, false), State::S);
        s.go(0, a, IFetch); // own L1D owner supplies the L1I
        assert_eq!(s.m.l1_state(0, a, true), State::S);
        s.go(2, a, Store); // FwdGetM: O → I, S → I
        for c in 0..2 {
            assert_eq!(s.m.l1_state(c, a, false), State::I);
        }
        assert_eq!(s.m.l1_state(0, a, true), State::I);
        assert_eq!(s.m.l1_state(2, a, false), State::M);
        s.go(2, a, IFetch); // own L1D M → O
        assert_eq!(s.m.l1_state(2, a, false), State::O);
        s.go(2, a, Store); // upgrade invalidates the own L1I
        assert_eq!(s.m.l1_state(2, a, true), State::I);
        let st = s.m.stats();
        assert_eq!(st.upgrades, 2);
        assert!(st.cache_to_cache >= 3);
        assert_eq!(s.m.checker_violations(), 0, "{:?}", s.m.first_violation());
    }
}

#[test]
fn moesi_grants_e_only_without_caches_or_pcams() {
    let cfg = MemConfig {
        protocol: Protocol::Moesi,
        ..dir_cfg()
    };
    let mut s = Sys::new(&cfg);
    s.go(0, 0x8000, Load);
    assert_eq!(s.m.l1_state(0, 0x8000, false), State::E);
    s.go(0, 0x8000, Store); // silent E → M
    assert_eq!(s.m.l1_state(0, 0x8000, false), State::M);
    assert_eq!(s.m.stats().upgrades, 0);
    // §5.3.1: a PCAM holding the block answers shared.
    let mut t = Sys::new(&cfg);
    t.m.pcam_insert(1, DTLB, 0, PTE);
    t.go(0, PTE, Load);
    assert_eq!(t.m.l1_state(0, PTE, false), State::S);
    t.m.pcam_clear(1, DTLB, 0);
    t.go(0, 0x9000, Load);
    assert_eq!(t.m.l1_state(0, 0x9000, false), State::E);
    assert_eq!(t.m.stats().exclusive_grants, 1);
    assert_eq!(s.m.checker_violations() + t.m.checker_violations(), 0);
}

#[test]
fn s_m_case_self_snoop_invalidates() {
    for cfg in [dir_cfg(), snoop_cfg()] {
        let mut s = Sys::new(&cfg);
        s.go(0, PTE, Store);
        assert_eq!(s.m.l1_state(0, PTE, false), State::M);
        // §5.2 Solution #2: the walk hits M and leaves it M.
        s.walk_insert(0, DTLB, 5, PTE);
        assert_eq!(s.m.l1_state(0, PTE, false), State::M);
        assert_eq!(s.m.stats().l1d_hits, 1);
        // a local store hitting M self-snoops the TLB's S copy.
        s.go(0, PTE + 8, Store);
        assert_eq!(s.take(), vec![probe(0, DTLB, 5)]);
        assert_eq!(s.m.pcam_entry(0, DTLB, 5), None);
        assert_eq!(s.m.checker_violations(), 0);
        // the same without self-snoop leaves a stale TLB entry: caught.
        let bad = with_faults(cfg.clone(), |f| f.no_self_snoop = true);
        let mut b = Sys::new(&bad);
        b.go(0, PTE, Store);
        b.walk_insert(0, DTLB, 5, PTE);
        b.go(0, PTE + 8, Store);
        assert!(b.take().is_empty());
        assert_eq!(b.m.pcam_entry(0, DTLB, 5), Some(PTE));
        assert_eq!(b.m.checker_violations(), 1);
        assert!(b.m.first_violation().unwrap().contains("stale TLB"));
    }
}

/// Core 0 holds PTE's block M in its L1D and in its D-TLB; four conflicting
/// loads evict the L1D copy (a writeback); then core 1 stores to it.
fn keep_bit_scenario(cfg: &MemConfig) -> Sys {
    let mut s = Sys::new(cfg);
    s.go(0, PTE, Store);
    s.walk_insert(0, DTLB, 2, PTE);
    let l1_stride = cfg.l1d.size_bytes / cfg.l1d.ways; // same L1 set
    for k in 1..=4 {
        s.go(0, PTE + k * l1_stride, Load);
    }
    assert_eq!(s.m.l1_state(0, PTE, false), State::I);
    assert_eq!(s.m.stats().l1_writebacks, 1);
    s
}

#[test]
fn keep_bit_keeps_tlb_sharer() {
    let cfg = dir_cfg();
    let mut s = keep_bit_scenario(&cfg);
    assert_eq!(s.m.stats().keep_sharer_writebacks, 1);
    assert_eq!(s.m.directory_sharers(PTE).unwrap() & 1, 1, "core 0 kept");
    s.go(1, PTE, Store);
    assert_eq!(s.take(), vec![probe(0, DTLB, 2)]);
    assert_eq!(s.m.checker_violations(), 0);

    // Without the keep bit the directory forgets core 0's TLB.
    let bad = with_faults(cfg, |f| f.directory_forgets_tlb_sharers = true);
    let mut b = keep_bit_scenario(&bad);
    assert_eq!(b.m.directory_sharers(PTE).unwrap() & 1, 0, "core 0 dropped");
    b.go(1, PTE, Store);
    assert!(b.take().is_empty(), "the probe is missed");
    assert_eq!(b.m.pcam_entry(0, DTLB, 2), Some(PTE));
    assert!(b.m.checker_violations() >= 1);
    assert!(b.m.first_violation().unwrap().contains("stale TLB"));
}

#[test]
fn keep_bit_without_tlb_drops_sharer() {
    let mut s = Sys::new(&dir_cfg());
    s.go(0, PTE, Store);
    for k in 1..=4 {
        s.go(0, PTE + k * 32 * 1024, Load);
    }
    assert_eq!(s.m.stats().keep_sharer_writebacks, 0);
    assert_eq!(s.m.directory_sharers(PTE).unwrap() & 1, 0);
}

#[test]
fn l2_recall_invalidates_pcam_entries() {
    for ic in [
        Interconnect::default_directory(),
        Interconnect::default_snooping(),
    ] {
        let cfg = tiny(ic, Protocol::Mosi);
        let mut s = Sys::new(&cfg);
        s.walk_insert(1, ITLB, 6, PTE);
        s.walk_insert(2, DTLB, 1, PTE + 16);
        let l2_stride = cfg.l2.size_bytes / cfg.l2.ways;
        for k in 1..=2 {
            s.go(0, PTE + k * l2_stride, Load);
        }
        assert!(!s.m.in_l2(PTE));
        assert_eq!(s.take(), vec![probe(1, ITLB, 6), probe(2, DTLB, 1)]);
        assert_eq!(s.m.pcam_entry(1, ITLB, 6), None);
        let st = s.m.stats();
        assert_eq!(st.pcam_recall_invalidations, 2);
        assert_eq!(st.recalls, 2, "both walkers' L1D copies");
        assert_eq!(s.m.checker_violations(), 0);
    }
}

#[test]
fn pcam_disabled_is_caught() {
    for cfg in [dir_cfg(), snoop_cfg()] {
        let mut s = Sys::new(&with_faults(cfg, |f| f.pcam_disabled = true));
        s.walk_insert(0, DTLB, 0, PTE);
        s.go(1, PTE, Store);
        assert!(s.take().is_empty());
        assert_eq!(s.m.checker_violations(), 1);
    }
}

#[test]
fn snoop_skipping_pcam_is_caught_but_self_snoop_works() {
    for cfg in [dir_cfg(), snoop_cfg()] {
        let mut s = Sys::new(&with_faults(cfg, |f| f.snoop_skips_pcam = true));
        s.walk_insert(0, DTLB, 0, PTE);
        s.go(0, PTE, Store);
        assert_eq!(s.take(), vec![probe(0, DTLB, 0)], "self-snoop still works");
        assert_eq!(s.m.checker_violations(), 0);
        s.walk_insert(0, DTLB, 0, PTE);
        s.go(1, PTE, Store);
        assert!(s.take().is_empty());
        assert_eq!(s.m.checker_violations(), 1);
    }
}

#[test]
fn jetty_missing_insert_is_caught() {
    for cfg in [dir_cfg(), snoop_cfg()] {
        let mut s = Sys::new(&with_faults(cfg, |f| f.jetty_misses_insert = true));
        s.walk_insert(0, DTLB, 0, PTE);
        assert!(!s.m.jetty_admits(0, PTE), "the filter lies");
        s.go(1, PTE, Store);
        assert!(s.take().is_empty());
        assert!(s.m.stats().jetty_filtered >= 1);
        assert_eq!(s.m.checker_violations(), 1);
    }
}

#[test]
fn ack_before_invalidate_is_caught() {
    for cfg in [dir_cfg(), snoop_cfg()] {
        let mut s = Sys::new(&with_faults(cfg.clone(), |f| {
            f.ack_before_invalidate = true
        }));
        let a = 0x7000;
        s.go(0, a, Load);
        s.go(1, a, Load);
        s.go(1, a, Store);
        assert_eq!(s.m.l1_state(0, a, false), State::S, "stale copy left");
        assert!(s.m.first_violation().unwrap().starts_with("SWMR"));
        let before = s.m.checker_violations();
        s.go(0, a, Load); // hits the stale copy
        assert!(s.m.checker_violations() > before, "stale load caught");
        // and the correct controller is clean
        let mut g = Sys::new(&cfg);
        g.go(0, a, Load);
        g.go(1, a, Load);
        g.go(1, a, Store);
        g.go(0, a, Load);
        assert_eq!(g.m.checker_violations(), 0);
    }
}

#[test]
fn jetty_filters_and_counts() {
    let mut s = Sys::new(&dir_cfg());
    s.walk_insert(0, DTLB, 0, PTE);
    s.go(0, 0x0050_0000, Store); // bits 19-12 differ: filtered locally
    let st = s.m.stats();
    assert_eq!(st.jetty_filtered, 1);
    assert_eq!(st.pcam_lookups, 0);
    s.go(1, PTE, Store);
    let st = s.m.stats();
    // the directory sends core 0 (a sharer) a probe its Jetty admits;
    // core 1's own self-snoop is filtered.
    assert_eq!(st.pcam_lookups, 1);
    assert_eq!(st.jetty_filtered, 2);
    assert_eq!(st.pcam_hits, 1);
}

fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

/// Random traffic with PCAM inserts and clears; returns (stats, probes,
/// total latency, violations).
fn soak(cfg: &MemConfig, seed: u64, n: usize) -> (String, Vec<TlbProbe>, u64, u64) {
    let mut m = MemSystem::new(cfg, seed);
    let mut probes = Vec::new();
    let mut x = 12345u64;
    let mut total = 0;
    let entries = cfg.pcam_entries as u64;
    for _ in 0..n {
        let r = lcg(&mut x);
        let core = (r % cfg.cores as u64) as usize;
        let pa = (lcg(&mut x) % 96) * 64 * 7 + (lcg(&mut x) % 8) * 8;
        match r / 16 % 10 {
            0 => {
                total += m.access(core, pa, WalkLoad, &mut probes);
                m.pcam_insert(
                    core,
                    (r / 256 % 2) as usize,
                    (lcg(&mut x) % entries) as usize,
                    pa,
                );
            }
            1 => m.pcam_clear(
                core,
                (r / 256 % 2) as usize,
                (lcg(&mut x) % entries) as usize,
            ),
            2 if r.is_multiple_of(97) => m.pcam_clear_all(core, (r / 256 % 2) as usize),
            3 | 4 => total += m.access(core, pa, Store, &mut probes),
            5 => total += m.access(core, pa, IFetch, &mut probes),
            _ => total += m.access(core, pa, Load, &mut probes),
        }
    }
    let stats = serde_json::to_string(&m.stats()).unwrap();
    (stats, probes, total, m.checker_violations())
}

#[test]
fn random_traffic_is_clean_in_every_configuration() {
    for ic in [
        Interconnect::default_directory(),
        Interconnect::default_snooping(),
    ] {
        for p in [Protocol::Mosi, Protocol::Moesi] {
            for jetty in [false, true] {
                let cfg = MemConfig {
                    jetty,
                    ..tiny(ic.clone(), p)
                };
                let (stats, probes, _, v) = soak(&cfg, 1, 20_000);
                assert_eq!(v, 0, "{ic:?} {p:?} jetty {jetty}: {stats}");
                assert!(!probes.is_empty());
                let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
                for key in [
                    "pcam_hits",
                    "pcam_false_invalidations",
                    "pcam_recall_invalidations",
                    "recalls",
                    "l1_writebacks",
                    "upgrades",
                    "cache_to_cache",
                    "invalidations",
                ] {
                    assert!(v[key].as_u64().unwrap() > 0, "{key} never exercised");
                }
            }
        }
    }
}

#[test]
fn faults_are_caught_under_random_traffic() {
    type Set = fn(&mut Faults);
    let faults: [(&str, Set); 6] = [
        ("pcam_disabled", |f| f.pcam_disabled = true),
        ("snoop_skips_pcam", |f| f.snoop_skips_pcam = true),
        ("no_self_snoop", |f| f.no_self_snoop = true),
        ("jetty_misses_insert", |f| f.jetty_misses_insert = true),
        ("ack_before_invalidate", |f| f.ack_before_invalidate = true),
        ("directory_forgets_tlb_sharers", |f| {
            f.directory_forgets_tlb_sharers = true
        }),
    ];
    for ic in [
        Interconnect::default_directory(),
        Interconnect::default_snooping(),
    ] {
        for (name, set) in faults {
            if name == "directory_forgets_tlb_sharers" && ic == Interconnect::default_snooping() {
                continue; // snooping has no sharer list to forget
            }
            let cfg = with_faults(tiny(ic.clone(), Protocol::Mosi), set);
            let (_, _, _, v) = soak(&cfg, 1, 20_000);
            assert!(v > 0, "{name} not caught on {ic:?}");
        }
    }
}

#[test]
fn determinism() {
    let cfg = tiny(Interconnect::default_directory(), Protocol::Moesi);
    let a = soak(&cfg, 42, 10_000);
    let b = soak(&cfg, 42, 10_000);
    assert_eq!(a, b);
    let c = soak(&cfg, 43, 10_000);
    assert_ne!(a.2, c.2, "another seed perturbs memory latency differently");
    let fixed = MemConfig {
        mem_perturb_cycles: 0,
        ..cfg
    };
    assert_eq!(soak(&fixed, 42, 5_000).2, soak(&fixed, 43, 5_000).2);
}

#[test]
fn latencies_follow_table1() {
    let cfg = MemConfig {
        mem_perturb_cycles: 0,
        ..snoop_cfg()
    };
    let mut s = Sys::new(&cfg);
    // miss to memory: L1 1 + tree order 2·4·2 + L2 6 + memory 160 + 4·2
    assert_eq!(s.go(0, 0x1000, Load), 1 + 16 + 6 + 160 + 8);
    assert_eq!(s.go(0, 0x1000, Load), 1, "L1D hit");
    assert_eq!(s.go(1, 0x1000, Load), 1 + 16 + 6 + 8, "L2 hit");
    let mut d = Sys::new(&MemConfig {
        mem_perturb_cycles: 0,
        ..dir_cfg()
    });
    // block 0x40 homes on tile 0 = core 0's tile
    assert_eq!(d.go(0, 0x40 * 64, Load), 1 + 6 + 6 + 160);
    let perturbed = Sys::new(&dir_cfg()).go(0, 0x40 * 64, Load);
    assert!((173..=177).contains(&perturbed));
}

#[test]
fn validation_names_keys() {
    let ok = MemConfig::default();
    assert_eq!(ok.validate("memory"), Ok(()));
    let err = |f: &dyn Fn(&mut MemConfig)| {
        let mut c = MemConfig::default();
        f(&mut c);
        c.validate("memory").unwrap_err()
    };
    let e = err(&|c| c.l1d.size_bytes = 100_000);
    assert!(
        e.starts_with("memory.l1d.size_bytes: 100000 is not sets × ways × block_bytes"),
        "{e}"
    );
    let e = err(&|c| c.l2.size_bytes = 3 * 4 * 64 * 1024);
    assert!(
        e.starts_with("memory.l2.size_bytes:") && e.contains("not a power of two"),
        "{e}"
    );
    let e = err(&|c| c.l1i.block_bytes = 48);
    assert!(
        e.starts_with("memory.l1i.block_bytes: 48 is not a power of two"),
        "{e}"
    );
    let e = err(&|c| {
        c.l1i.block_bytes = 4;
        c.l2.block_bytes = 4;
        c.l1d.block_bytes = 4;
    });
    assert!(
        e.contains("block_bytes: 4 is smaller than a 8-byte PTE"),
        "{e}"
    );
    let e = err(&|c| {
        c.l1d.block_bytes = 32;
        c.l1d.size_bytes = 64 * 1024;
    });
    assert!(
        e.starts_with("memory.l1d.block_bytes: 32 differs from l2.block_bytes"),
        "{e}"
    );
    let e = err(&|c| {
        for cc in [&mut c.l1i, &mut c.l1d, &mut c.l2] {
            cc.block_bytes = 8192;
            cc.size_bytes = 8192 * 4 * 4;
        }
    });
    assert!(
        e.starts_with("memory.l2.block_bytes: 8192 puts the Jetty index bits"),
        "{e}"
    );
    let e = err(&|c| c.pa_bits = 18);
    assert!(
        e.starts_with("memory.pa_bits: 18 is below the Jetty index bit 19"),
        "{e}"
    );
    let e = err(&|c| c.cores = 0);
    assert!(e.starts_with("memory.cores:"), "{e}");
    let e = err(&|c| c.cores = 65);
    assert!(e.starts_with("memory.cores: 65"), "{e}");
    let e = err(&|c| c.cores = 17);
    assert!(
        e.starts_with("memory.interconnect.mesh_cols: a 4x4 mesh has fewer tiles than 17"),
        "{e}"
    );
    let e = err(&|c| {
        c.interconnect = Interconnect::Directory {
            mesh_cols: 4,
            mesh_rows: 4,
            hop_cycles: 2,
            dir_cycles: 6,
            sharers: 17,
        }
    });
    assert!(
        e.starts_with("memory.interconnect.sharers: 17 is above the 16 cores"),
        "{e}"
    );
    assert_eq!(ok.validate_against_tlb("memory", 64, 4), Ok(()));
    let e = ok.validate_against_tlb("memory", 32, 4).unwrap_err();
    assert!(
        e.starts_with("memory.pcam_entries: 64 is unlike the TLB's 32 entries"),
        "{e}"
    );
    let e = ok.validate_against_tlb("memory", 64, 128).unwrap_err();
    assert!(e.contains("tlb.ways: 128 ways are above"), "{e}");
}

#[test]
fn config_deserializes_with_defaults_and_refuses_unknown_keys() {
    let c: MemConfig = serde_json::from_str(
        r#"{"cores": 4, "interconnect": {"kind": "snooping", "tree_hop_cycles": 3}}"#,
    )
    .unwrap();
    assert_eq!(c.cores, 4);
    assert_eq!(c.l2, CacheConfig::table1_l2());
    assert_eq!(
        c.interconnect,
        Interconnect::Snooping { tree_hop_cycles: 3 }
    );
    assert!(serde_json::from_str::<MemConfig>(r#"{"coress": 4}"#).is_err());
    assert!(serde_json::from_str::<MemConfig>(r#"{"faults": {"pcam_disable": true}}"#).is_err());
    let d = MemConfig::default();
    assert_eq!(
        (
            d.l1d.size_bytes,
            d.l1d.ways,
            d.l1d.block_bytes,
            d.l1d.latency_cycles
        ),
        (131072, 4, 64, 1)
    );
    assert_eq!(
        (
            d.l2.size_bytes,
            d.l2.latency_cycles,
            d.memory_latency_cycles
        ),
        (4 << 20, 6, 160)
    );
}

#[test]
fn geometry_26_20_38() {
    assert_eq!(pcam_geometry(32, 64, 4096, 32), (26, 20));
    assert_eq!(pcam_geometry(44, 64, 4096, 32).0, 38);
    assert_eq!(pcam_bits_per_core(32, 64, 64, 2), 27 * 64 * 2);
}

#[test]
fn unitd_off_ignores_pcams() {
    let cfg = MemConfig {
        unitd: false,
        ..dir_cfg()
    };
    let mut s = Sys::new(&cfg);
    s.walk_insert(0, DTLB, 0, PTE);
    assert_eq!(s.m.pcam_entry(0, DTLB, 0), None);
    s.go(1, PTE, Store);
    assert!(s.take().is_empty());
    assert_eq!(s.m.stats().pcam_lookups + s.m.stats().jetty_filtered, 0);
    assert_eq!(s.m.checker_violations(), 0);
}

#[derive(Clone, Debug)]
enum Op {
    Insert(usize, usize, usize, u64),
    Clear(usize, usize, usize),
    ClearAll(usize, usize),
    Access(usize, u64, u8),
}

fn op() -> impl Strategy<Value = Op> {
    let pa = (0u64..1 << 22).prop_map(|x| x & !7);
    prop_oneof![
        (0usize..4, 0usize..2, 0usize..8, pa.clone())
            .prop_map(|(c, t, i, p)| Op::Insert(c, t, i, p)),
        (0usize..4, 0usize..2, 0usize..8).prop_map(|(c, t, i)| Op::Clear(c, t, i)),
        (0usize..4, 0usize..2).prop_map(|(c, t)| Op::ClearAll(c, t)),
        (0usize..4, pa, 0u8..4).prop_map(|(c, p, k)| Op::Access(c, p, k)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// §6.4: an include-Jetty may pass absent blocks but never filters a
    /// block present in a PCAM.
    #[test]
    fn jetty_never_filters_a_present_block(ops in proptest::collection::vec(op(), 1..200), snoop in any::<bool>()) {
        let ic = if snoop { Interconnect::default_snooping() } else { Interconnect::default_directory() };
        let cfg = tiny(ic, Protocol::Mosi);
        let mut m = MemSystem::new(&cfg, 3);
        let mut probes = Vec::new();
        for o in ops {
            match o {
                Op::Insert(c, t, i, p) => m.pcam_insert(c, t, i, p),
                Op::Clear(c, t, i) => m.pcam_clear(c, t, i),
                Op::ClearAll(c, t) => m.pcam_clear_all(c, t),
                Op::Access(c, p, k) => {
                    let kind = [Load, Store, IFetch, WalkLoad][k as usize];
                    m.access(c, p, kind, &mut probes);
                }
            }
            for c in 0..4 {
                for t in 0..2 {
                    for i in 0..8 {
                        if let Some(p) = m.pcam_entry(c, t, i) {
                            prop_assert!(m.jetty_admits(c, p), "core {c} filters present {p:#x}");
                        }
                    }
                }
            }
        }
        prop_assert_eq!(m.checker_violations(), 0, "{:?}", m.first_violation());
    }
}

#[test]
fn pcam_insert_outside_l2_avoids_pcam_victims_and_defers_probes() {
    let cfg = tiny(Interconnect::default_directory(), Protocol::Mosi);
    let stride = cfg.l2.size_bytes / cfg.l2.ways; // same L2 set
    let a = 0x10_0000;
    let mut s = Sys::new(&cfg);
    s.m.pcam_insert(0, ITLB, 0, a); // brings a into the L2
    assert!(s.m.in_l2(a));
    s.go(1, a + stride, Load); // b: no PCAM entry, most recent
    s.m.pcam_insert(2, DTLB, 3, a + 2 * stride); // evicts b, not LRU a
    assert!(s.m.in_l2(a) && !s.m.in_l2(a + stride));
    assert_eq!(s.m.stats().recalls, 1);
    // every way now holds PCAM entries: LRU a goes, its probe deferred
    s.m.pcam_insert(3, DTLB, 4, a + 3 * stride);
    assert!(!s.m.in_l2(a));
    let mut d = Vec::new();
    s.m.take_deferred_probes(&mut d);
    assert_eq!(d, vec![probe(0, ITLB, 0)]);
    s.m.pcam_insert(1, DTLB, 5, a + 4 * stride); // evicts a + 2·stride
    s.go(0, 0x40, Load);
    assert_eq!(
        s.take(),
        vec![probe(2, DTLB, 3)],
        "handed over by the next access"
    );
    assert_eq!(s.m.checker_violations(), 0);
}

#[test]
fn directory_store_waits_for_the_farthest_sharer() {
    let cfg = MemConfig {
        mem_perturb_cycles: 0,
        ..dir_cfg()
    };
    let mut s = Sys::new(&cfg);
    let a = 5 * 64; // block 5: home tile 5 = (1, 1) on the 4x4 mesh
    // core 0 at (0,0): request 2 hops + dir 6; L2 6 + memory 160 + 2 hops back
    assert_eq!(s.go(0, a, Load), 1 + (4 + 6) + (6 + 160 + 4));
    // core 15 at (3,3): 4 hops each way, L2 hit
    assert_eq!(s.go(15, a, Load), 1 + (8 + 6) + (6 + 8));
    // core 1 at (1,0) stores: request 1 hop + dir; data 6 + 1 hop; the
    // invalidation of core 15 (home→15 4 hops, probe 1, 15→1 5 hops) is
    // the longest path.
    assert_eq!(s.go(1, a, Store), 1 + (2 + 6) + (8 + 1 + 10));
    let st = s.m.stats();
    assert_eq!(st.invalidations_sent, 2);
    assert_eq!(st.invalidations, 2);
    assert_eq!(s.m.directory_sharers(a), Some(1 << 1));
}

#[test]
fn interconnect_refuses_unknown_keys() {
    let bad = r#"{"interconnect": {"kind": "snooping", "tree_hop_cycles": 3, "hop_cycles": 1}}"#;
    assert!(serde_json::from_str::<MemConfig>(bad).is_err());
    let dir = r#"{"interconnect": {"kind": "directory", "mesh_cols": 8, "mesh_rows": 8, "hop_cycles": 1, "dir_cycles": 4}}"#;
    let c: MemConfig = serde_json::from_str(dir).unwrap();
    assert_eq!(c.validate("memory"), Ok(()));
}
