//! The miss handler `swtlb`, direct simulation, Tapeworm's `trap` mode (uhlig94 §3.2) and
//! dynamic partitioning (§5.2.2).
//!
//! A reference to a user page that misses is an L1U miss (uTLB vector). The handler loads
//! the L1U PTE from the task's L1 table, which lies in mapped space: if the L2 PTE mapping
//! that L1 page is absent, an L2 miss; in a 3-level system the L2 handler loads the L2 PTE
//! from the mapped L2 table: if the L3 PTE mapping that L2 page is absent, an L3 miss (the
//! L3 table is unmapped, so the walk ends). A miss on mapped kernel data is an L1K miss;
//! its PTE lies in the L2 table, so it may raise an L3 miss. The handlers' PTE loads go
//! through the simulated TLB, so nested misses depend on its configuration. Invalid and
//! Modify come from page state ([`crate::os`]) and are the same for every configuration.

use mmulab_engine::SimRng;
use serde::{Deserialize, Serialize};

use crate::costs::{CostPreset, MissType};
use crate::os::{INVALID, MODIFY, OsKind, SysRef};
use crate::pagetable::{Key, PteClass, l2_of_user, l3_of_l1k, l3_of_l2};
use crate::r2000::{R2000, R2000_WIRED, R2000Config};
use crate::tlb::{Part, Repl, SwTlb};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SimError {
    #[error("{0}")]
    Invalid(String),
    #[error(
        "configuration {0}: LRU replacement cannot be simulated in trap mode (TLB hits are invisible to the miss handler, uhlig94 §5.2.1); use direct mode"
    )]
    LruInTrap(usize),
}

/// Where each class of PTE is placed (uhlig94 Table VIII).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Placement {
    /// L2 PTEs in the lower partition, all others upper (the baseline systems).
    A,
    /// L2 and L3 PTEs lower; L1U and L1K upper.
    B,
    /// Everything lower except L1U.
    C,
    /// No partitioning at all.
    D,
}

impl Placement {
    #[inline]
    pub fn part(self, class: PteClass) -> Part {
        use PteClass::*;
        let lower = match self {
            Placement::A => class == L2,
            Placement::B => matches!(class, L2 | L3),
            Placement::C => class != L1U,
            Placement::D => false,
        };
        if lower { Part::Lower } else { Part::Upper }
    }
    pub fn from_name(s: &str) -> Option<Placement> {
        match s {
            "A" | "a" => Some(Placement::A),
            "B" | "b" => Some(Placement::B),
            "C" | "c" => Some(Placement::C),
            "D" | "d" => Some(Placement::D),
            _ => None,
        }
    }
}

/// §5.2.2's hill-climbing partitioner: every `window_misses` misses, compare the cost per
/// reference of the last window with the one before; a change larger than `threshold`
/// (a fraction) keeps moving the partition the same way if it helped and turns back if it
/// hurt; a smaller change leaves it where it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicPartition {
    pub window_misses: u64,
    pub threshold: f64,
    pub step: usize,
    pub min_lower: usize,
    pub max_lower: usize,
}

impl Default for DynamicPartition {
    fn default() -> Self {
        DynamicPartition {
            window_misses: 2_000,
            threshold: 0.05,
            step: 1,
            min_lower: 1,
            max_lower: 48,
        }
    }
}

/// One simulated TLB configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlbSetup {
    /// Total slots (R2000: 64).
    pub slots: usize,
    /// The partition point: slots `0..lower` are the lower partition (R2000: 8). Ignored
    /// (taken as 0) under placement D.
    pub lower: usize,
    /// Ways per set of the upper partition; 0 = fully associative (R2000).
    pub upper_ways: usize,
    pub placement: Placement,
    pub lower_repl: Repl,
    pub upper_repl: Repl,
    pub dynamic: Option<DynamicPartition>,
}

impl Default for TlbSetup {
    /// The R2000 as the baseline systems use it: 64 slots, 8 lower (FIFO), 56 upper
    /// (random), placement A.
    fn default() -> Self {
        TlbSetup {
            slots: 64,
            lower: 8,
            upper_ways: 0,
            placement: Placement::A,
            lower_repl: Repl::Fifo,
            upper_repl: Repl::Random,
            dynamic: None,
        }
    }
}

impl TlbSetup {
    pub fn lower_effective(&self) -> usize {
        if self.placement == Placement::D {
            0
        } else {
            self.lower
        }
    }

    pub fn validate(&self, prefix: &str) -> Result<(), SimError> {
        let bad = |k: &str, why: String| Err(SimError::Invalid(format!("{prefix}.{k}: {why}")));
        if !(2..=8192).contains(&self.slots) {
            return bad("slots", format!("{} must be 2-8192", self.slots));
        }
        let lower = self.lower_effective();
        if lower >= self.slots {
            return bad(
                "lower",
                format!("{lower} leaves no upper slot of {}", self.slots),
            );
        }
        if self.placement != Placement::D && lower == 0 {
            return bad(
                "lower",
                "placements A-C need at least 1 lower slot (use placement D for none)".into(),
            );
        }
        let upper = self.slots - lower;
        if self.upper_ways != 0
            && (!upper.is_multiple_of(self.upper_ways)
                || !(upper / self.upper_ways).is_power_of_two())
        {
            return bad(
                "upper_ways",
                format!(
                    "{} upper slots do not divide into a power-of-two number of {}-way sets",
                    upper, self.upper_ways
                ),
            );
        }
        if let Some(d) = &self.dynamic {
            if self.upper_ways != 0 {
                return bad(
                    "dynamic",
                    "dynamic partitioning needs a fully associative upper partition".into(),
                );
            }
            if self.placement == Placement::D {
                return bad("dynamic", "placement D has no partition to move".into());
            }
            if d.window_misses == 0 || d.step == 0 {
                return bad(
                    "dynamic.window_misses",
                    "window_misses and step must be positive".into(),
                );
            }
            if d.min_lower == 0 || d.min_lower > d.max_lower || d.max_lower >= self.slots {
                return bad(
                    "dynamic.max_lower",
                    format!(
                        "need 1 <= min_lower <= max_lower < slots ({}..={} of {})",
                        d.min_lower, d.max_lower, self.slots
                    ),
                );
            }
            if !(0.0..1.0).contains(&d.threshold) {
                return bad("dynamic.threshold", "must be in [0, 1)".into());
            }
        }
        Ok(())
    }
}

/// What one configuration saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Misses by [`MissType::index`].
    pub counts: [u64; 6],
    /// Extra cycles (fn. 8's counting overhead under dynamic partitioning).
    pub extra_cycles: f64,
    /// (reference index, lower slots) at the start and at every move of the partition.
    pub partition_trace: Vec<(u64, usize)>,
}

impl Outcome {
    pub fn count(&self, t: MissType) -> u64 {
        self.counts[t.index()]
    }
    pub fn total_misses(&self) -> u64 {
        self.counts.iter().sum()
    }
    /// Seconds of miss handling under `costs`.
    pub fn seconds(&self, costs: &CostPreset) -> f64 {
        costs.seconds(&self.counts) + self.extra_cycles * costs.ns_per_cycle * 1e-9
    }
    /// Seconds spent on one miss type.
    pub fn seconds_of(&self, t: MissType, costs: &CostPreset) -> f64 {
        self.count(t) as f64 * costs.cycles_of(t) * costs.ns_per_cycle * 1e-9
    }
}

struct DynState {
    cfg: DynamicPartition,
    misses: u64,
    cycles: f64,
    since: u64,
    prev_cost: Option<f64>,
    dir: isize,
}

/// One simulated configuration and its miss handler.
struct Machine {
    tlb: SwTlb,
    placement: Placement,
    three_level: bool,
    lru: bool,
    out: Outcome,
    victims: Vec<Key>,
    dynamic: Option<DynState>,
    costs: CostPreset,
}

impl Machine {
    fn new(setup: &TlbSetup, os: OsKind, costs: &CostPreset, seed: u64, index: usize) -> Machine {
        let lower = setup.lower_effective();
        let tlb = SwTlb::new(
            setup.slots,
            lower,
            setup.upper_ways,
            setup.lower_repl,
            setup.upper_repl,
            SimRng::derive(seed, "swtlb/config", index as u64),
        );
        Machine {
            tlb,
            placement: setup.placement,
            three_level: os.three_level(),
            lru: setup.lower_repl == Repl::Lru || setup.upper_repl == Repl::Lru,
            out: Outcome {
                partition_trace: vec![(0, lower)],
                ..Outcome::default()
            },
            victims: Vec::new(),
            dynamic: setup.dynamic.clone().map(|cfg| DynState {
                cfg,
                misses: 0,
                cycles: 0.0,
                since: 0,
                prev_cost: None,
                dir: 1,
            }),
            costs: costs.clone(),
        }
    }

    #[inline]
    fn fill(&mut self, key: Key) {
        if let Some(v) = self.tlb.insert(key, self.placement.part(key.class())) {
            self.victims.push(v);
        }
    }

    #[inline]
    fn miss(&mut self, t: MissType, now: u64) {
        self.out.counts[t.index()] += 1;
        if let Some(d) = &mut self.dynamic {
            d.misses += 1;
            d.cycles += self.costs.cycles_of(t);
            if t == MissType::L1U {
                self.out.extra_cycles += self.costs.dynamic_count_cycles_per_l1u;
            }
        }
        let _ = now;
    }

    /// The hill-climbing step of §5.2.2, run when a window of misses is complete.
    fn maybe_repartition(&mut self, now: u64) {
        let Some(d) = &mut self.dynamic else { return };
        if d.misses < d.cfg.window_misses {
            return;
        }
        let refs = (now + 1 - d.since).max(1) as f64;
        let cost = d.cycles / refs;
        let lower = self.tlb.lower() as isize;
        let target = match d.prev_cost {
            None => lower + d.dir * d.cfg.step as isize,
            Some(prev) if cost > prev * (1.0 + d.cfg.threshold) => {
                d.dir = -d.dir;
                lower + d.dir * d.cfg.step as isize
            }
            Some(prev) if cost < prev * (1.0 - d.cfg.threshold) => {
                lower + d.dir * d.cfg.step as isize
            }
            Some(_) => lower,
        };
        let target = target.clamp(d.cfg.min_lower as isize, d.cfg.max_lower as isize) as usize;
        d.prev_cost = Some(cost);
        d.misses = 0;
        d.cycles = 0.0;
        d.since = now + 1;
        if target != self.tlb.lower() {
            self.tlb.set_lower(target);
            self.out.partition_trace.push((now + 1, target));
        }
    }

    /// One reference through the TLB and, on a miss, the handler. Returns true on a hit.
    #[inline]
    fn reference(&mut self, r: SysRef, now: u64) -> bool {
        if r.flags & MODIFY != 0 {
            self.out.counts[MissType::Modify.index()] += 1;
        }
        let key = r.key;
        if self.tlb.contains(key) {
            debug_assert!(
                r.flags & INVALID == 0,
                "{key:?} cached before its first use"
            );
            if self.lru {
                self.tlb.touch(key);
            }
            return true;
        }
        let class = key.class();
        let t = if r.flags & INVALID != 0 {
            MissType::Invalid
        } else if class == PteClass::L1U {
            MissType::L1U
        } else {
            MissType::L1K
        };
        self.miss(t, now);
        match class {
            PteClass::L1U => {
                let l2 = l2_of_user(key.task(), key.page());
                if self.tlb.contains(l2) {
                    if self.lru {
                        self.tlb.touch(l2);
                    }
                } else {
                    self.miss(MissType::L2, now);
                    if self.three_level {
                        let l3 = l3_of_l2(l2);
                        self.walk_l3(l3, now);
                    }
                    self.fill(l2);
                }
            }
            PteClass::L1K => {
                if self.three_level {
                    self.walk_l3(l3_of_l1k(key.page()), now);
                }
            }
            PteClass::L2 | PteClass::L3 => unreachable!("only L1U and L1K keys are referenced"),
        }
        self.fill(key);
        self.maybe_repartition(now);
        false
    }

    #[inline]
    fn walk_l3(&mut self, l3: Key, now: u64) {
        if self.tlb.contains(l3) {
            if self.lru {
                self.tlb.touch(l3);
            }
        } else {
            self.miss(MissType::L3, now);
            self.fill(l3);
        }
    }
}

fn check_setups(setups: &[TlbSetup]) -> Result<(), SimError> {
    for (i, s) in setups.iter().enumerate() {
        s.validate(&format!("tlb[{i}]"))?;
    }
    Ok(())
}

/// Runs every configuration over the whole stream, one after the other.
pub fn simulate_direct(
    stream: &[SysRef],
    os: OsKind,
    setups: &[TlbSetup],
    costs: &CostPreset,
    seed: u64,
) -> Result<Vec<Outcome>, SimError> {
    check_setups(setups)?;
    Ok(setups
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut m = Machine::new(s, os, costs, seed, i);
            for (n, r) in stream.iter().enumerate() {
                m.reference(*r, n as u64);
                m.victims.clear();
            }
            m.out
        })
        .collect())
}

/// What the modelled real TLB of `trap` mode did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrapStats {
    pub refs: u64,
    /// References the real TLB hit: no simulated configuration was consulted.
    pub real_hits: u64,
    /// Real misses: every configuration ran its handler.
    pub real_misses: u64,
    /// Entries shot out of the real TLB because some configuration evicted them.
    pub shootouts: u64,
    /// Real-TLB entries replaced at the Random register.
    pub real_evictions: u64,
    /// ASID rollovers of the real R2000 (each a flush of its non-global entries).
    pub asid_flushes: u64,
}

/// Tapeworm's `trap` mode (uhlig94 §3.2): the host's R2000 ([`R2000`]: `real_slots`
/// entries, 8 of them wired when there are more than 8, fills at the Random register that
/// counts down each cycle, ASIDs that run out and flush) sees every reference; a miss on it
/// traps, and only then do the simulated configurations run their miss handlers, whose
/// evictions feed back into what the host TLB may hold. The real TLB holds
/// only entries that every configuration holds (a victim in any configuration is shot out
/// of it; it is refilled only with what all hold), so a real hit is a hit everywhere, and
/// since FIFO and random replacement ignore hits the result equals [`simulate_direct`]'s.
/// LRU is refused: it would need the hits Tapeworm cannot see.
pub fn simulate_trap(
    stream: &[SysRef],
    os: OsKind,
    setups: &[TlbSetup],
    costs: &CostPreset,
    seed: u64,
    real_slots: usize,
) -> Result<(Vec<Outcome>, TrapStats), SimError> {
    check_setups(setups)?;
    if let Some(i) = setups
        .iter()
        .position(|s| s.lower_repl == Repl::Lru || s.upper_repl == Repl::Lru)
    {
        return Err(SimError::LruInTrap(i));
    }
    if real_slots == 0 {
        return Err(SimError::Invalid("real_slots: must be at least 1".into()));
    }
    let mut machines: Vec<Machine> = setups
        .iter()
        .enumerate()
        .map(|(i, s)| Machine::new(s, os, costs, seed, i))
        .collect();
    // The host's R2000 (§3.2): its wired slots hold the host kernel's own L2 PTEs, so
    // simulated entries go in at the Random register only; its ASIDs run out like any
    // R2000's (a flush only drops entries, which keeps inclusion).
    let mut real = R2000::new(R2000Config {
        slots: real_slots,
        wired: if real_slots > R2000_WIRED {
            R2000_WIRED
        } else {
            0
        },
        ..R2000Config::default()
    });
    // [A] a Tapeworm trap takes the uTLB path's cycles on the host's clock (the paper
    // does not time Tapeworm's own trap); only the Random register sees it.
    let trap_cycles = costs.cycles_of(MissType::L1U).round() as u64;
    let mut st = TrapStats::default();
    for (n, r) in stream.iter().enumerate() {
        st.refs += 1;
        real.clock += 1;
        real.run(r.key.task());
        if real.contains(r.key) {
            st.real_hits += 1;
            if r.flags & MODIFY != 0 {
                for m in &mut machines {
                    m.out.counts[MissType::Modify.index()] += 1;
                }
            }
            continue;
        }
        // The trap: every simulated configuration runs its own miss handler.
        st.real_misses += 1;
        real.clock += trap_cycles;
        let mut all_hold = true;
        for m in &mut machines {
            m.reference(*r, n as u64);
            for v in m.victims.drain(..) {
                if real.remove(v) {
                    st.shootouts += 1;
                }
            }
            all_hold &= m.tlb.contains(r.key);
        }
        if all_hold && real.write_random(r.key).is_some() {
            st.real_evictions += 1;
        }
        debug_assert!(
            machines.iter().all(|m| m.tlb.contains(r.key) || !all_hold),
            "inclusion"
        );
    }
    st.asid_flushes = real.flushes;
    Ok((machines.into_iter().map(|m| m.out).collect(), st))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::{OsModel, OsParams};
    use crate::workload::{Workload, token_ring};

    fn stream(os: OsKind, seed: u64) -> Vec<SysRef> {
        let mut w = Workload::named("t");
        w.refs = 60_000;
        w.file_fraction = 0.4;
        w.display_fraction = 0.2;
        w.syscall_every = 300;
        OsModel::new(os, OsParams::preset(os), seed).expand(&w.generate(seed))
    }

    fn costs(os: OsKind) -> CostPreset {
        CostPreset::decstation3100_1994(os.cost_column())
    }

    fn variety() -> Vec<TlbSetup> {
        let mut v = Vec::new();
        for (lower, placement) in [
            (8, Placement::A),
            (4, Placement::A),
            (16, Placement::B),
            (12, Placement::C),
            (0, Placement::D),
        ] {
            for (lr, ur) in [
                (Repl::Fifo, Repl::Random),
                (Repl::Random, Repl::Fifo),
                (Repl::Fifo, Repl::Fifo),
                (Repl::Random, Repl::Random),
            ] {
                v.push(TlbSetup {
                    lower,
                    placement,
                    lower_repl: lr,
                    upper_repl: ur,
                    ..TlbSetup::default()
                });
            }
        }
        v.push(TlbSetup {
            slots: 144,
            lower: 16,
            upper_ways: 4,
            ..TlbSetup::default()
        });
        v.push(TlbSetup {
            slots: 48,
            lower: 16,
            upper_ways: 2,
            upper_repl: Repl::Fifo,
            ..TlbSetup::default()
        });
        v.push(TlbSetup {
            dynamic: Some(DynamicPartition {
                window_misses: 200,
                ..DynamicPartition::default()
            }),
            ..TlbSetup::default()
        });
        v
    }

    #[test]
    fn trap_equals_direct_for_fifo_random_partitioned() {
        for os in [OsKind::Ultrix, OsKind::Osf1, OsKind::Mach3AfsOut] {
            let s = stream(os, 5);
            let setups = variety();
            let direct = simulate_direct(&s, os, &setups, &costs(os), 9).unwrap();
            for real in [8, 64, 256] {
                let (trap, st) = simulate_trap(&s, os, &setups, &costs(os), 9, real).unwrap();
                assert_eq!(trap, direct, "{os:?}, real TLB of {real}");
                assert!(st.real_hits > 0 && st.real_misses > 0);
            }
        }
    }

    #[test]
    fn same_seed_same_results_other_seed_differs() {
        let os = OsKind::Mach3;
        let s = stream(os, 6);
        let setups = variety();
        let a = simulate_direct(&s, os, &setups, &costs(os), 1).unwrap();
        assert_eq!(a, simulate_direct(&s, os, &setups, &costs(os), 1).unwrap());
        let b = simulate_direct(&s, os, &setups, &costs(os), 2).unwrap();
        // Random replacement draws from the seed; FIFO-only setups do not.
        assert_ne!(a[0], b[0]);
        assert_eq!(a[2], b[2]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Seed swarm: every shape drawn from the seed; trap mode must equal direct mode.
        #[test]
        fn trap_equals_direct_swarm(seed in 0u64..1_000_000) {
            let mut rng = SimRng::new(seed, "swarm");
            let os = *rng.pick(&OsKind::ALL);
            let mut w = Workload::named("swarm");
            w.refs = 5_000 + rng.below(20_000);
            w.data_pages = 10 + rng.below(500);
            w.window_pages = 1 + rng.below(w.data_pages);
            w.text_pages = 1 + rng.below(64);
            w.syscall_every = rng.below(500);
            w.file_fraction = rng.unit() * 0.5;
            w.display_fraction = rng.unit() * 0.5;
            let s = OsModel::new(os, OsParams::preset(os), seed).expand(&w.generate(seed));
            let repl = [Repl::Fifo, Repl::Random];
            let setups: Vec<TlbSetup> = (0..4)
                .map(|_| {
                    let slots = 16 << rng.below(4);
                    let placement = *rng.pick(&[Placement::A, Placement::B, Placement::C, Placement::D]);
                    let lower = 1 + rng.below(slots as u64 / 2) as usize;
                    TlbSetup {
                        slots: slots + lower,
                        lower,
                        upper_ways: *rng.pick(&[0usize, 1, 2, 4]),
                        placement,
                        lower_repl: *rng.pick(&repl),
                        upper_repl: *rng.pick(&repl),
                        dynamic: None,
                    }
                })
                .filter(|s| s.validate("t").is_ok())
                .collect();
            let real = 1 + rng.below(128) as usize;
            let direct = simulate_direct(&s, os, &setups, &costs(os), seed).unwrap();
            let (trap, _) = simulate_trap(&s, os, &setups, &costs(os), seed, real).unwrap();
            proptest::prop_assert_eq!(trap, direct);
        }
    }

    /// Why Table VIII's D cannot be arbitrarily worse than A: beyond its first miss, an
    /// L2 PTE misses under D only after a random fill evicted it, which a fill does with
    /// probability (live L2 PTEs)/64.
    #[test]
    fn placement_d_extra_l2_misses_are_bounded_by_random_eviction() {
        use crate::pagetable::l2_of_user;
        for os in [OsKind::Mach3, OsKind::Mach3AfsOut] {
            let s = stream(os, 7);
            let mut l2s: Vec<Key> = s
                .iter()
                .filter(|r| r.key.class() == PteClass::L1U)
                .map(|r| l2_of_user(r.key.task(), r.key.page()))
                .collect();
            l2s.sort();
            l2s.dedup();
            let k = l2s.len() as f64;
            let d = TlbSetup {
                lower: 0,
                placement: Placement::D,
                ..TlbSetup::default()
            };
            let o = &simulate_direct(&s, os, &[d], &costs(os), 7).unwrap()[0];
            let fills: u64 = [
                MissType::L1U,
                MissType::L1K,
                MissType::L2,
                MissType::L3,
                MissType::Invalid,
            ]
            .iter()
            .map(|t| o.count(*t))
            .sum();
            let extra = o.count(MissType::L2) as f64 - k;
            let bound = fills as f64 * k / 64.0;
            assert!(
                extra > 0.0 && extra <= bound,
                "{os:?}: {extra} extra L2 misses, bound {bound} (k = {k})"
            );
        }
    }

    #[test]
    fn trap_refuses_lru() {
        let s = stream(OsKind::Mach3, 1);
        let setups = vec![
            TlbSetup::default(),
            TlbSetup {
                upper_repl: Repl::Lru,
                ..TlbSetup::default()
            },
        ];
        let e = simulate_trap(&s, OsKind::Mach3, &setups, &costs(OsKind::Mach3), 1, 64);
        assert_eq!(e.unwrap_err(), SimError::LruInTrap(1));
        // Direct mode runs it.
        assert!(simulate_direct(&s, OsKind::Mach3, &setups, &costs(OsKind::Mach3), 1).is_ok());
    }

    #[test]
    fn modify_and_invalid_do_not_vary_with_the_tlb() {
        let os = OsKind::Mach3;
        let s = stream(os, 2);
        let outs = simulate_direct(&s, os, &variety(), &costs(os), 3).unwrap();
        let first = &outs[0];
        for o in &outs {
            assert_eq!(o.count(MissType::Modify), first.count(MissType::Modify));
            assert_eq!(o.count(MissType::Invalid), first.count(MissType::Invalid));
        }
        assert!(first.count(MissType::Modify) > 0 && first.count(MissType::Invalid) > 0);
    }

    #[test]
    fn ultrix_has_no_l3_and_l2_needs_an_l1u_miss() {
        let s = stream(OsKind::Ultrix, 4);
        let o = &simulate_direct(
            &s,
            OsKind::Ultrix,
            &[TlbSetup::default()],
            &costs(OsKind::Ultrix),
            1,
        )
        .unwrap()[0];
        assert_eq!(o.count(MissType::L3), 0);
        assert!(o.count(MissType::L2) <= o.count(MissType::L1U) + o.count(MissType::Invalid));
        let s = stream(OsKind::Osf1, 4);
        let o = &simulate_direct(
            &s,
            OsKind::Osf1,
            &[TlbSetup::default()],
            &costs(OsKind::Osf1),
            1,
        )
        .unwrap()[0];
        assert!(o.count(MissType::L3) > 0);
        assert!(
            o.count(MissType::L3) <= o.count(MissType::L2) + o.count(MissType::L1K),
            "L3 only under L2 or L1K"
        );
    }

    #[test]
    fn lower_slots_cure_l2_misses_and_more_servers_need_more() {
        // Fig. 9 in miniature: the L2 misses of a token ring vanish once the lower
        // partition holds every server's three L2 PTEs (plus the kernel's two).
        let os = OsKind::Mach3;
        let l2_at = |servers: u16, lower: usize| {
            let ev = token_ring(servers, 40, 100, 1);
            let s = OsModel::new(os, OsParams::preset(os), 1).expand(&ev);
            let setup = TlbSetup {
                lower,
                ..TlbSetup::default()
            };
            simulate_direct(&s, os, &[setup], &costs(os), 1).unwrap()[0].count(MissType::L2)
        };
        let v = [l2_at(2, 4), l2_at(2, 12), l2_at(4, 12), l2_at(4, 20)];
        assert!(v[0] > 20 * v[1].max(1), "{v:?}");
        assert!(v[2] > 20 * v[3].max(1), "{v:?}");
    }

    #[test]
    fn dynamic_partitioning_moves_and_is_logged() {
        let ev = token_ring(4, 40, 200, 2);
        let os = OsKind::Mach3;
        let s = OsModel::new(os, OsParams::preset(os), 2).expand(&ev);
        let setup = TlbSetup {
            lower: 4,
            dynamic: Some(DynamicPartition {
                window_misses: 100,
                ..DynamicPartition::default()
            }),
            ..TlbSetup::default()
        };
        let o = &simulate_direct(&s, os, &[setup], &costs(os), 2).unwrap()[0];
        assert!(o.partition_trace.len() > 1);
        let last = o.partition_trace.last().unwrap().1;
        assert!(last > 4, "moved up from 4 to {last}");
        assert!(o.extra_cycles > 0.0);
    }

    #[test]
    fn bad_setups_name_the_key() {
        let s = TlbSetup {
            slots: 64,
            lower: 8,
            upper_ways: 3,
            ..TlbSetup::default()
        };
        let e = s.validate("tlb").unwrap_err().to_string();
        assert!(e.starts_with("tlb.upper_ways"), "{e}");
        let s = TlbSetup {
            lower: 64,
            ..TlbSetup::default()
        };
        assert!(
            s.validate("tlb")
                .unwrap_err()
                .to_string()
                .starts_with("tlb.lower")
        );
    }
}
