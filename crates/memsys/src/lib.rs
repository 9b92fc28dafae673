//! The memory system of romanescu10 (UNITD): per-core private L1I and L1D,
//! one shared inclusive L2, flat memory (Table 1), MOSI or MOESI coherence
//! over an ordered snooping tree or a full-map directory on a 2D mesh, and
//! UNITD's TLB coherence: per-TLB PCAMs (§4.2) probed by ownership requests
//! and by local stores (§5.2 Solution #2), optionally behind include-Jetty
//! filters (§5.4, §6.4). A checker verifies SWMR, load values and "no TLB
//! entry outlives a store to its PTE block" as accesses perform.
//!
//! The library is pure and deterministic: the only randomness is the
//! memory-latency perturbation (§6.1), drawn from a stream of the run seed.
//!
//! Modelling decisions (not in the paper):
//! - Transactions are atomic and performed in call order (the kernel calls
//!   in simulated-time order); latency is returned, not scheduled.
//! - The L2 is inclusive of the L1s *and of the PCAMs*: an L2 eviction
//!   recalls the block from every L1 and invalidates every PCAM entry
//!   holding it, returning those as `TlbProbe`s. Not in the paper;
//!   documented in issue 10.
//! - The L2 keeps, per line, which L1s hold the block (a precise presence
//!   vector used for recalls and cache-to-cache supply); the directory's
//!   sharer list is separate and core-granular, updated only by requests,
//!   PCAM inserts (the walk that preceded them made the core a sharer),
//!   invalidations and writebacks (clean evictions are silent, so it may
//!   name cores that no longer hold the block, which only costs messages).
//! - Instruction caches hold S only. An instruction fetch of a block the
//!   own L1D owns is forwarded to it like any GetS; a store invalidates the
//!   own L1I (the self-snoop x86 already has for self-modifying code, §5.2).
//! - A PCAM insert of a block not in the L2 (the walker's `WalkLoad` just
//!   fetched it, so only a caller skipping the walk sees this) brings the
//!   block into the L2 at no latency; the victim is chosen among lines
//!   without PCAM entries when possible, and any TLB invalidations it causes
//!   are handed over with the next `access`'s probes.
//! - PCAM lookups are off the critical path (§4.2, §6.5) and in parallel
//!   with cache snoops (§5.3.2): they add no latency of their own; a
//!   directory sharer that holds the block only in a PCAM still costs its
//!   invalidation and ack.

pub mod cache;
pub mod checker;
pub mod coherence;
pub mod config;
pub mod directory;
pub mod interconnect;
pub mod jetty;
pub mod mesh;
pub mod pcam;
pub mod versions;

pub use coherence::{Action, Event, State, Transition};
pub use config::{
    CacheConfig, Faults, Interconnect, MemConfig, Protocol, pcam_bits_per_core, pcam_geometry,
};
pub use pcam::TlbProbe;

use cache::{Cache, INVALID};
use checker::Checker;
use interconnect::{DataSource, Network, Txn};
use mesh::Mesh;
use mmulab_engine::{SimRng, UniformInclusive};
use pcam::PcamBank;
use serde::{Deserialize, Serialize};
use versions::Versions;

/// What the core asks of its L1s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AccessKind {
    /// Instruction fetch, through the L1I.
    IFetch,
    Load,
    /// Any store, PTE stores included (§4: nothing distinguishes them).
    Store,
    /// A page-table walker load, through the L1D (§5.2). A walk hitting an
    /// M block leaves it M (Solution #2).
    WalkLoad,
}

/// Counters, all monotone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemStats {
    pub l1i_hits: u64,
    pub l1i_misses: u64,
    pub l1d_hits: u64,
    pub l1d_misses: u64,
    pub l2_hits: u64,
    pub l2_misses: u64,
    pub memory_reads: u64,
    pub memory_writebacks: u64,
    /// Dirty/owned L1D copies written back to the L2 on replacement.
    pub l1_writebacks: u64,
    /// Of those, writebacks carrying the keep-sharer bit (§5.3.1).
    pub keep_sharer_writebacks: u64,
    pub stores: u64,
    pub walk_loads: u64,
    /// Ownership requests from a readable copy (S or O).
    pub upgrades: u64,
    pub exclusive_grants: u64,
    pub cache_to_cache: u64,
    /// Cores sent an invalidation by ownership requests (directory: the
    /// sharers; snooping: every other core, the broadcast reaching all).
    pub invalidations_sent: u64,
    /// L1 copies invalidated by ownership requests.
    pub invalidations: u64,
    /// L1 copies recalled by L2 evictions.
    pub recalls: u64,
    pub pcam_inserts: u64,
    /// Per-core PCAM coherence lookups performed (all of a core's PCAMs are
    /// searched in parallel: one lookup). Filtered lookups are not counted
    /// here; Fig. 10's fraction is `jetty_filtered / (jetty_filtered +
    /// pcam_lookups)`.
    pub pcam_lookups: u64,
    /// PCAM entries invalidated by coherence lookups.
    pub pcam_hits: u64,
    /// Of those, entries whose own PTE was not the stored one (same block,
    /// another PTE: the cost of block granularity, §4.2).
    pub pcam_false_invalidations: u64,
    /// PCAM entries invalidated by L2 recalls (not coherence lookups).
    pub pcam_recall_invalidations: u64,
    pub jetty_filtered: u64,
    pub directory_messages: u64,
    pub snoop_broadcasts: u64,
}

const NO_OWNER: u8 = u8::MAX;

#[derive(Clone, Copy, Debug)]
struct L1Line {
    state: State,
    /// Version of the data this copy holds (checker).
    version: u64,
    /// The L2 line of the same block (inclusion).
    l2: u32,
}

impl Default for L1Line {
    fn default() -> Self {
        L1Line {
            state: State::I,
            version: 0,
            l2: 0,
        }
    }
}

/// One L2 line's payload, a host cache line of its own: what an L2 fill,
/// eviction or L1 copy removal touches comes in one memory access.
#[derive(Clone, Debug)]
#[repr(align(64))]
struct L2Line {
    /// The block (`INVALID` when empty; mirrors the tag) and its global
    /// version, bumped by every store (checker).
    block: u64,
    version: u64,
    /// Cores whose L1I / L1D hold the block (L2 presence vectors).
    i_mask: u64,
    d_mask: u64,
    /// Core whose L1D holds the block in M, O or E.
    owner: u8,
    /// Directory sharer list (cores), directory protocol only.
    dir: u64,
    /// The L2 copy is newer than memory.
    dirty: bool,
    /// Valid PCAM slots holding the block, all cores.
    pcam: u32,
    /// L1 copies (valid lines in the arrays) and exclusive (M/E) ones.
    copies: u32,
    writers: u32,
}

impl Default for L2Line {
    fn default() -> Self {
        L2Line {
            block: INVALID,
            version: 0,
            i_mask: 0,
            d_mask: 0,
            owner: NO_OWNER,
            dir: 0,
            dirty: false,
            pcam: 0,
            copies: 0,
            writers: 0,
        }
    }
}

#[inline]
fn bits(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let b = m.trailing_zeros() as usize;
            m &= m - 1;
            b
        })
    })
}

/// Set bits of a core mask. Masks hold zero or one core almost always:
/// those skip the population count (a long sequence without `popcnt`).
#[inline]
pub(crate) fn ones(m: u64) -> u64 {
    if m & m.wrapping_sub(1) == 0 {
        (m != 0) as u64
    } else {
        m.count_ones() as u64
    }
}

fn dec_pcam(l2: &mut Cache<L2Line>, block: u64) {
    if let Some(i) = l2.lookup(block) {
        l2.meta[i].pcam = l2.meta[i].pcam.saturating_sub(1);
    }
}

/// Removes an L1 array line, keeping the checker's copy counts. Inlined:
/// it is a handful of instructions. (`evict_l1` does the same steps with
/// the L2 line it reads anyway.)
#[inline(always)]
fn l1_remove(l1: &mut Cache<L1Line>, l2: &mut Cache<L2Line>, line: usize) {
    let block = l1.tag(line);
    if block == INVALID {
        return;
    }
    let m = l1.meta[line];
    let i = m.l2 as usize;
    if l2.meta[i].block == block {
        // saturating: under `ack_before_invalidate` a stale copy may
        // outlive its L2 line and meet a refilled one
        let l = &mut l2.meta[i];
        l.copies = l.copies.saturating_sub(1);
        if m.state.exclusive() {
            l.writers = l.writers.saturating_sub(1);
        }
    }
    l1.clear(line);
}

/// Index in `MemSystem::l1` of core `c`'s L1I (`icache`) or L1D.
#[inline(always)]
fn l1x(c: usize, icache: bool) -> usize {
    2 * c + icache as usize
}

#[derive(Clone)]
pub struct MemSystem {
    cfg: MemConfig,
    shift: u32,
    table: &'static [[Option<Transition>; 6]; 5],
    /// Per state: whether a load hits (`table`'s Load entry is a Hit).
    read_hits: [bool; 5],
    /// Core `c`'s L1D at `2c`, its L1I at `2c + 1` (`l1x`): one index
    /// per access, without a branch on the kind.
    l1: Vec<Cache<L1Line>>,
    l2: Cache<L2Line>,
    pcams: Vec<PcamBank>,
    net: Network,
    all_cores: u64,
    rng: SimRng,
    /// The memory-latency perturbation's range (None: no perturbation).
    jitter: Option<UniformInclusive>,
    mem_versions: Versions,
    stats: MemStats,
    checker: Checker,
    deferred: Vec<TlbProbe>,
    /// Per L1 (indexed as `l1`), the block after its last miss: host
    /// bookkeeping for prefetches only, never read by the model.
    streams: Vec<u64>,
}

impl MemSystem {
    /// Panics on an invalid configuration: validate it first.
    pub fn new(cfg: &MemConfig, seed: u64) -> MemSystem {
        if let Err(e) = cfg.validate("memory") {
            panic!("invalid memory configuration: {e}");
        }
        let net = match cfg.interconnect {
            Interconnect::Snooping { tree_hop_cycles } => {
                Network::snooping(cfg.cores, tree_hop_cycles)
            }
            Interconnect::Directory {
                mesh_cols,
                mesh_rows,
                hop_cycles,
                dir_cycles,
                ..
            } => Network::Directory {
                mesh: Mesh::new(mesh_cols, mesh_rows),
                hop: hop_cycles,
                dir: dir_cycles,
            },
        };
        let all_cores = if cfg.cores == 64 {
            u64::MAX
        } else {
            (1u64 << cfg.cores) - 1
        };
        MemSystem {
            shift: cfg.block_shift(),
            table: coherence::table(cfg.protocol),
            read_hits: State::ALL.map(|st| {
                coherence::table(cfg.protocol)[st as usize][Event::Load as usize]
                    .is_some_and(|t| t.action == Action::Hit)
            }),
            l1: {
                // allocated as before (every L1I, then every L1D), interleaved
                let l1i: Vec<_> = (0..cfg.cores).map(|_| Cache::new(&cfg.l1i)).collect();
                let l1d: Vec<_> = (0..cfg.cores).map(|_| Cache::new(&cfg.l1d)).collect();
                l1d.into_iter().zip(l1i).flat_map(|(d, i)| [d, i]).collect()
            },
            l2: Cache::new(&cfg.l2),
            pcams: (0..cfg.cores)
                .map(|_| PcamBank::new(cfg.tlbs_per_core, cfg.pcam_entries))
                .collect(),
            net,
            all_cores,
            rng: SimRng::new(seed, "memsys.memory"),
            jitter: (cfg.mem_perturb_cycles != 0)
                .then(|| UniformInclusive::new(0, cfg.mem_perturb_cycles)),
            mem_versions: Versions::default(),
            stats: MemStats::default(),
            checker: Checker::new(cfg.checker),
            deferred: Vec::new(),
            streams: vec![INVALID; 2 * cfg.cores],
            cfg: cfg.clone(),
        }
    }

    pub fn config(&self) -> &MemConfig {
        &self.cfg
    }

    pub fn stats(&self) -> MemStats {
        self.stats.clone()
    }

    /// Zeroes the counters (e.g. after a warm-up); state is kept.
    pub fn reset_stats(&mut self) {
        self.stats = MemStats::default();
    }

    pub fn checker_violations(&self) -> u64 {
        self.checker.violations()
    }

    pub fn first_violation(&self) -> Option<String> {
        self.checker.first_violation()
    }

    /// One access by `core` to physical address `pa`; returns its latency
    /// in cycles. TLB entries to invalidate (PCAM matches, L2 recalls) are
    /// appended to `probes`.
    ///
    /// A read with no probes to hand over is taken here: a hit inlined
    /// into the caller, a miss by `miss` as `access_full` would call it.
    /// Stores, and any access while a `pcam_insert` has left probes, go
    /// out of line to `access_full`, which takes a read hit exactly as
    /// `read_hit` does.
    #[inline(always)]
    pub fn access(
        &mut self,
        core: usize,
        pa: u64,
        kind: AccessKind,
        probes: &mut Vec<TlbProbe>,
    ) -> u64 {
        if kind != AccessKind::Store && self.deferred.is_empty() {
            let block = pa >> self.shift;
            return match self.read_hit(core, block, kind) {
                Ok(lat) => lat,
                // what `access_full` does for a read that does not hit
                Err(found) => self.miss(core, block, pa, kind, found, probes),
            };
        }
        self.access_full(core, pa, kind, probes)
    }

    /// `access` of a store, for a caller that knows it stores: a hit is
    /// taken here (`store_hit`), a miss by `miss` as `access_full` would
    /// call it. (Apart from `access`, whose read path inlined into its
    /// callers stays as small.)
    #[inline(always)]
    pub fn store(&mut self, core: usize, pa: u64, probes: &mut Vec<TlbProbe>) -> u64 {
        if self.deferred.is_empty() {
            let block = pa >> self.shift;
            return match self.store_hit(core, block, pa, probes) {
                Ok(lat) => lat,
                Err(found) => self.miss(core, block, pa, AccessKind::Store, found, probes),
            };
        }
        self.access_full(core, pa, AccessKind::Store, probes)
    }

    /// A store of `block` (at `pa`) by `core` that hits its L1D in a
    /// writable state, taken as `access_full` takes it: recorded, the
    /// versions bumped, the self-snoop made, priced. Otherwise nothing is
    /// done and the error is the line holding the block, if any.
    #[inline(always)]
    fn store_hit(
        &mut self,
        core: usize,
        block: u64,
        pa: u64,
        probes: &mut Vec<TlbProbe>,
    ) -> Result<u64, Option<usize>> {
        let cache = &mut self.l1[l1x(core, false)];
        let line = cache.lookup(block).ok_or(None)?;
        let m = cache.meta[line];
        let t = match self.table[m.state as usize][Event::Store as usize] {
            Some(t) if t.action == Action::Hit => t,
            _ => return Err(Some(line)),
        };
        cache.touch(line);
        let lat = cache.latency;
        self.stats.l1d_hits += 1;
        self.stats.stores += 1;
        // E → M is silent; both are exclusive, counts hold.
        let l1 = &mut cache.meta[line];
        l1.state = t.next;
        let l2i = m.l2 as usize;
        let g = &mut self.l2.meta[l2i];
        if g.block == block {
            g.version += 1;
            l1.version = g.version;
        }
        self.after_store(core, block, pa, l2i, probes);
        Ok(lat)
    }

    /// A read (`kind` not a store) of `block` by `core` that hits its L1
    /// in a readable state: recorded, checked and priced. Otherwise
    /// nothing is done and the error is the line holding the block, if
    /// any.
    #[inline(always)]
    fn read_hit(
        &mut self,
        core: usize,
        block: u64,
        kind: AccessKind,
    ) -> Result<u64, Option<usize>> {
        debug_assert_ne!(kind, AccessKind::Store);
        let cache = &mut self.l1[l1x(core, kind == AccessKind::IFetch)];
        let line = cache.lookup(block).ok_or(None)?;
        let m = cache.meta[line];
        if !self.read_hits[m.state as usize] {
            return Err(Some(line));
        }
        cache.touch(line);
        let lat = cache.latency;
        let g = &self.l2.meta[m.l2 as usize];
        let (l2_ok, gver) = (g.block == block, g.version);
        match kind {
            AccessKind::IFetch => self.stats.l1i_hits += 1,
            AccessKind::WalkLoad => {
                self.stats.l1d_hits += 1;
                self.stats.walk_loads += 1;
            }
            _ => self.stats.l1d_hits += 1,
        }
        if self.checker.enabled {
            if l2_ok {
                self.checker.load(core, block, m.version, gver);
            } else {
                self.checker.report(|| {
                    format!("inclusion: core {core} hit block {block:#x} absent from the L2")
                });
            }
        }
        Ok(lat)
    }

    /// `access`'s whole path: stores, misses, and probes left by a
    /// `pcam_insert` handed over first.
    #[inline(never)]
    fn access_full(
        &mut self,
        core: usize,
        pa: u64,
        kind: AccessKind,
        probes: &mut Vec<TlbProbe>,
    ) -> u64 {
        if !self.deferred.is_empty() {
            probes.append(&mut self.deferred);
        }
        let block = pa >> self.shift;
        let is_store = kind == AccessKind::Store;
        let ev = if is_store { Event::Store } else { Event::Load };
        let cache = &mut self.l1[l1x(core, kind == AccessKind::IFetch)];
        let found = cache.lookup(block);
        if let Some(line) = found {
            let m = cache.meta[line];
            if let Some(t) = self.table[m.state as usize][ev as usize]
                && t.action == Action::Hit
            {
                cache.touch(line);
                let lat = cache.latency;
                let l2i = m.l2 as usize;
                let g = &self.l2.meta[l2i];
                let (l2_ok, gver) = (g.block == block, g.version);
                match kind {
                    AccessKind::IFetch => self.stats.l1i_hits += 1,
                    AccessKind::Load => self.stats.l1d_hits += 1,
                    AccessKind::WalkLoad => {
                        self.stats.l1d_hits += 1;
                        self.stats.walk_loads += 1;
                    }
                    AccessKind::Store => {
                        self.stats.l1d_hits += 1;
                        self.stats.stores += 1;
                        // E → M is silent; both are exclusive, counts hold.
                        cache.meta[line].state = t.next;
                        if l2_ok {
                            self.l2.meta[l2i].version = gver + 1;
                            cache.meta[line].version = gver + 1;
                        }
                        self.after_store(core, block, pa, l2i, probes);
                        return lat;
                    }
                }
                if self.checker.enabled {
                    if l2_ok {
                        self.checker.load(core, block, m.version, gver);
                    } else {
                        self.checker.report(|| {
                            format!(
                                "inclusion: core {core} hit block {block:#x} absent from the L2"
                            )
                        });
                    }
                }
                return lat;
            }
        }
        self.miss(core, block, pa, kind, found, probes)
    }

    /// §5.2 Solution #2: every local store self-snoops the local PCAMs;
    /// then the checker's store invariant. The usual case (the Jetty stops
    /// the snoop, the check passes) calls nothing, so that it needs no
    /// stack frame: the PCAM lookup (`probe_core`'s, past its filter) and
    /// a violation's report are out of line.
    fn after_store(
        &mut self,
        core: usize,
        block: u64,
        pa: u64,
        l2i: usize,
        probes: &mut Vec<TlbProbe>,
    ) {
        if !self.cfg.unitd {
            return;
        }
        if !self.cfg.faults.no_self_snoop {
            if self.cfg.jetty && !self.pcams[core].jetty.may_contain(block << self.shift) {
                self.stats.jetty_filtered += 1;
            } else {
                return self.snoop_then_check(core, block, pa, l2i, probes);
            }
        }
        self.check_store(core, block, l2i);
    }

    /// `after_store` past the Jetty: the PCAM lookup, then the check.
    #[inline(never)]
    fn snoop_then_check(
        &mut self,
        core: usize,
        block: u64,
        pa: u64,
        l2i: usize,
        probes: &mut Vec<TlbProbe>,
    ) {
        self.lookup_pcams(core, block, pa, l2i, probes);
        self.check_store(core, block, l2i);
    }

    /// The checker's invariant 3 after a store by `core`.
    #[inline(always)]
    fn check_store(&mut self, core: usize, block: u64, l2i: usize) {
        if self.checker.enabled {
            let g = &self.l2.meta[l2i];
            if g.block == block && g.pcam != 0 {
                self.stale_tlb(core, block, g.pcam);
            }
        }
    }

    /// `check_store`'s report (out of line: a violation).
    #[cold]
    #[inline(never)]
    fn stale_tlb(&mut self, core: usize, block: u64, pcam: u32) {
        self.checker.store_pcams(core, block, pcam);
    }

    /// One core's PCAM coherence lookup (§4.2), behind its Jetty (§6.4).
    /// The filter is inlined: it stops most of a store's self-snoops.
    #[inline]
    fn probe_core(
        &mut self,
        core: usize,
        block: u64,
        pa: u64,
        l2i: usize,
        probes: &mut Vec<TlbProbe>,
    ) {
        if self.cfg.jetty && !self.pcams[core].jetty.may_contain(block << self.shift) {
            self.stats.jetty_filtered += 1;
            return;
        }
        self.lookup_pcams(core, block, pa, l2i, probes);
    }

    /// `probe_core` past the Jetty.
    #[inline(never)]
    fn lookup_pcams(
        &mut self,
        core: usize,
        block: u64,
        pa: u64,
        l2i: usize,
        probes: &mut Vec<TlbProbe>,
    ) {
        let bank = &mut self.pcams[core];
        self.stats.pcam_lookups += 1;
        if self.cfg.faults.pcam_disabled {
            return;
        }
        let r = bank.invalidate(core, block, Some(pa), probes);
        if r.hits != 0 {
            self.stats.pcam_hits += r.hits;
            self.stats.pcam_false_invalidations += r.false_hits;
            if self.l2.meta[l2i].block == block {
                let m = &mut self.l2.meta[l2i];
                m.pcam = m.pcam.saturating_sub(r.hits as u32);
            }
        }
    }

    fn mem_latency(&mut self) -> u64 {
        let jitter = match &self.jitter {
            Some(u) => u.sample(&mut self.rng),
            None => 0,
        };
        self.cfg.memory_latency_cycles + jitter
    }

    /// Finds or allocates the L2 line of `block`; returns (line, memory
    /// cycles spent). Always inlined (a plain hint was not taken): once
    /// per miss, and its call and return cost as much as its hit path.
    #[inline(always)]
    fn l2_get(&mut self, block: u64, probes: &mut Vec<TlbProbe>) -> (usize, u64) {
        let v = match self.l2.lookup_or_victim(block) {
            Ok(i) => {
                self.stats.l2_hits += 1;
                self.l2.touch(i);
                return (i, 0);
            }
            Err(v) => v,
        };
        self.stats.l2_misses += 1;
        let mem = self.mem_latency();
        self.l2_install(v, block, probes);
        (v, mem)
    }

    /// Inlined into `l2_get` (a call and a frame less per L2 miss); also
    /// called by `pcam_insert`.
    #[inline]
    fn l2_install(&mut self, v: usize, block: u64, probes: &mut Vec<TlbProbe>) {
        self.evict_l2(v, probes);
        self.stats.memory_reads += 1;
        let version = self.mem_versions.get(block);
        self.l2.fill(
            v,
            block,
            L2Line {
                block,
                version,
                ..L2Line::default()
            },
        );
    }

    /// L2 replacement: recall from every L1 and every PCAM (inclusion; not
    /// in the paper), write back if dirty. Leaves the line's tag and
    /// payload for `l2_install`, its only caller, to overwrite.
    #[inline(always)]
    fn evict_l2(&mut self, v: usize, probes: &mut Vec<TlbProbe>) {
        // The line read once; the recalls (rare) change its copy and PCAM
        // counts, read again after them.
        let m = &self.l2.meta[v];
        let vb = m.block;
        if vb == INVALID {
            return;
        }
        let (i_mask, d_mask, version) = (m.i_mask, m.d_mask, m.version);
        let (mut dirty, mut copies, mut pcam) = (m.dirty, m.copies, m.pcam);
        if i_mask | d_mask != 0 {
            dirty |= self.recall_l1s(vb, i_mask, d_mask);
            copies = self.l2.meta[v].copies;
        }
        if self.cfg.unitd && pcam != 0 && !self.cfg.faults.pcam_disabled {
            self.recall_pcams(v, vb, probes);
            pcam = self.l2.meta[v].pcam;
        }
        if self.checker.enabled {
            self.checker.recall(vb, copies, pcam);
        }
        if version != 0 {
            self.mem_versions.set(vb, version);
        }
        if dirty {
            self.stats.memory_writebacks += 1;
        }
        if self.net.is_directory() {
            self.stats.directory_messages += 2 * ones(i_mask | d_mask);
        }
    }

    /// Recalls `vb` from the L1s in the masks; returns whether a recalled
    /// copy was dirty. Out of line: most L2 victims are in no L1.
    #[inline(never)]
    fn recall_l1s(&mut self, vb: u64, i_mask: u64, d_mask: u64) -> bool {
        let mut dirty = false;
        for t in bits(i_mask) {
            if let Some(l) = self.l1[l1x(t, true)].lookup(vb) {
                l1_remove(&mut self.l1[l1x(t, true)], &mut self.l2, l);
                self.stats.recalls += 1;
            }
        }
        for t in bits(d_mask) {
            if let Some(l) = self.l1[l1x(t, false)].lookup(vb) {
                dirty |= self.l1[l1x(t, false)].meta[l].state.dirty();
                l1_remove(&mut self.l1[l1x(t, false)], &mut self.l2, l);
                self.stats.recalls += 1;
            }
        }
        dirty
    }

    /// Invalidates every PCAM entry of L2 line `v`'s block `vb` (rare).
    #[cold]
    #[inline(never)]
    fn recall_pcams(&mut self, v: usize, vb: u64, probes: &mut Vec<TlbProbe>) {
        for t in 0..self.cfg.cores {
            let r = self.pcams[t].invalidate(t, vb, None, probes);
            self.stats.pcam_recall_invalidations += r.hits;
            let m = &mut self.l2.meta[v];
            m.pcam = m.pcam.saturating_sub(r.hits as u32);
        }
    }

    /// L1 replacement of `line`, holding `vb` (its tag), in `core`'s L1I
    /// or L1D.
    fn evict_l1(&mut self, core: usize, icache: bool, line: usize, vb: u64) {
        let cache = &mut self.l1[l1x(core, icache)];
        debug_assert_eq!(vb, cache.tag(line));
        if vb == INVALID {
            return;
        }
        let m = cache.meta[line];
        let l2i = m.l2 as usize;
        // `l1_remove`, its L2 line looked up once for the removal and
        // for what follows
        cache.clear(line);
        let l2m = &mut self.l2.meta[l2i];
        if l2m.block != vb {
            return; // a copy the controller had lost track of (fault)
        }
        l2m.copies = l2m.copies.saturating_sub(1);
        if m.state.exclusive() {
            l2m.writers = l2m.writers.saturating_sub(1);
        }
        let bit = 1u64 << core;
        let t = self.table[m.state as usize][Event::Evict as usize].expect("state of the protocol");
        let is_dir = self.net.is_directory();
        if icache {
            l2m.i_mask &= !bit;
            return; // clean, silent
        }
        l2m.d_mask &= !bit;
        if l2m.owner as usize == core {
            l2m.owner = NO_OWNER;
        }
        if t.action == Action::Writeback {
            l2m.dirty = true;
            self.stats.l1_writebacks += 1;
            if is_dir {
                self.stats.directory_messages += 1;
                // §5.3.1: still in the L1I or a PCAM → keep-sharer bit.
                let keep = l2m.i_mask & bit != 0 || self.pcams[core].contains(vb);
                if keep {
                    self.stats.keep_sharer_writebacks += 1;
                }
                let forget = self.cfg.faults.directory_forgets_tlb_sharers;
                let m = &mut self.l2.meta[l2i];
                m.dir = directory::after_writeback(m.dir, core, keep, forget);
            } else {
                self.stats.snoop_broadcasts += 1;
            }
        }
    }

    #[inline(never)]
    fn miss(
        &mut self,
        c: usize,
        block: u64,
        pa: u64,
        kind: AccessKind,
        cur: Option<usize>,
        probes: &mut Vec<TlbProbe>,
    ) -> u64 {
        let icache = kind == AccessKind::IFetch;
        let is_store = kind == AccessKind::Store;
        match kind {
            AccessKind::IFetch => self.stats.l1i_misses += 1,
            AccessKind::Load => self.stats.l1d_misses += 1,
            AccessKind::WalkLoad => {
                self.stats.l1d_misses += 1;
                self.stats.walk_loads += 1;
            }
            AccessKind::Store => {
                self.stats.l1d_misses += 1;
                self.stats.stores += 1;
            }
        }
        // Host prefetches, before the dependent work: the block's L2 set and
        // memory version, and the L2 line of the L1 line a fill would
        // replace (a guess: a recall may yet empty a way of the set).
        // Skipped when this L1's previous miss was the block before: its
        // `prefetch_next` fetched all of these already.
        // this L1's index, in `l1` and `streams`
        let s = l1x(c, icache);
        let streamed = self.streams[s] == block;
        self.streams[s] = block + 1;
        if !streamed {
            self.l2.prefetch_set(block);
        }
        if cur.is_none() && !streamed {
            self.mem_versions.prefetch(block);
            let l1 = &self.l1[s];
            let (v, tag) = l1.victim_tag(block);
            if tag != INVALID {
                self.l2.prefetch_meta(l1.meta[v].l2 as usize);
                // a dirty victim asks its core's PCAMs for the keep bit
                self.pcams[c].prefetch(tag);
            }
        }
        let bit = 1u64 << c;
        let cur_state = cur.map_or(State::I, |l| self.l1[s].meta[l].state);
        let (l2i, mem_cycles) = if cur_state == State::I {
            self.l2_get(block, probes)
        } else {
            // an upgrade: inclusion puts the block in the L2
            match self.l2.lookup(block) {
                Some(i) => (i, 0),
                None => self.l2_get(block, probes),
            }
        };
        // What a read asks of the L2 line, read once.
        let g = &self.l2.meta[l2i];
        let (owner, unshared) = (g.owner, g.i_mask | g.d_mask == 0 && g.pcam == 0);
        let ev = if is_store {
            Event::Store
        } else if !icache && self.cfg.protocol == Protocol::Moesi && unshared {
            // §5.3.1: E only if no cache and no PCAM holds the block.
            Event::LoadExclusive
        } else {
            Event::Load
        };
        let tr = self.table[cur_state as usize][ev as usize].expect("state of the protocol");
        let mut data = DataSource::L2 { mem_cycles };
        let mut invalidated = 0u64;
        match tr.action {
            Action::GetS => {
                if owner != NO_OWNER {
                    self.forward_gets(owner as usize, block, l2i, &mut data);
                }
                if tr.next == State::E {
                    self.stats.exclusive_grants += 1;
                }
            }
            Action::GetM | Action::Upgrade => {
                if tr.action == Action::Upgrade {
                    self.stats.upgrades += 1;
                    data = DataSource::None;
                }
                invalidated = self.invalidate_others(c, block, pa, l2i, &mut data, probes);
                // the own L1I (self-modifying-code snoop)
                if self.l2.meta[l2i].i_mask & bit != 0 {
                    self.snoop_own_l1i(c, block, l2i);
                }
            }
            a => unreachable!("miss with action {a:?}"),
        }
        // Install or update the requester's copy.
        let line = match cur {
            Some(l) => l,
            None => {
                let (v, vb) = self.l1[s].victim_tag(block);
                self.evict_l1(c, icache, v, vb);
                v
            }
        };
        let m = &mut self.l2.meta[l2i];
        if is_store {
            m.version += 1;
        }
        if cur.is_none() {
            m.copies += 1;
        }
        if tr.next.exclusive() && !cur_state.exclusive() {
            m.writers += 1;
        }
        if icache {
            m.i_mask |= bit;
        } else {
            m.d_mask |= bit;
        }
        if tr.next.owner() {
            m.owner = c as u8;
        }
        m.dir |= bit;
        let new = L1Line {
            state: tr.next,
            version: m.version,
            l2: l2i as u32,
        };
        let (copies, writers) = (m.copies, m.writers);
        let cache = &mut self.l1[s];
        if cur.is_some() {
            cache.meta[line] = new;
            cache.touch(line);
        } else {
            cache.fill(line, block, new);
        }
        let l1_lat = cache.latency;
        // Price it.
        let txn = Txn {
            requester: c,
            block,
            data,
            invalidated,
        };
        let msgs = self.net.messages(&txn);
        if self.net.is_directory() {
            self.stats.directory_messages += msgs;
        } else {
            self.stats.snoop_broadcasts += 1;
        }
        let lat = l1_lat + self.net.latency(&txn, l1_lat, self.l2.latency);
        if self.checker.enabled {
            self.checker.swmr(block, copies, writers);
        }
        if is_store {
            self.after_store(c, block, pa, l2i, probes);
        }
        self.prefetch_next(c, icache, block);
        lat
    }

    /// A store by `c` invalidates `c`'s own L1I copy (out of line: rare).
    #[inline(never)]
    fn snoop_own_l1i(&mut self, c: usize, block: u64, l2i: usize) {
        if let Some(l) = self.l1[l1x(c, true)].lookup(block) {
            l1_remove(&mut self.l1[l1x(c, true)], &mut self.l2, l);
            self.stats.invalidations += 1;
        }
        self.l2.meta[l2i].i_mask &= !(1u64 << c);
    }

    /// A GetS meets an owner L1D: forwarded to it (out of line: a miss
    /// usually finds no owner).
    #[inline(never)]
    fn forward_gets(&mut self, o: usize, block: u64, l2i: usize, data: &mut DataSource) {
        if let Some(ol) = self.l1[l1x(o, false)].lookup(block) {
            let os = self.l1[l1x(o, false)].meta[ol].state;
            let ot =
                self.table[os as usize][Event::FwdGetS as usize].expect("state of the protocol");
            self.l1[l1x(o, false)].meta[ol].state = ot.next;
            let m = &mut self.l2.meta[l2i];
            if os.exclusive() && !ot.next.exclusive() {
                m.writers = m.writers.saturating_sub(1);
            }
            if !ot.next.owner() {
                m.owner = NO_OWNER;
            }
            if ot.action == Action::Supply {
                *data = DataSource::Owner(o);
                self.stats.cache_to_cache += 1;
            }
        } else {
            self.l2.meta[l2i].owner = NO_OWNER;
        }
    }

    /// Host prefetches for the blocks a sequential stream touches next
    /// (hints only): by the time this core asks for them, their L1 and L2
    /// sets, their memory versions and the L2 line of the L1 line the next
    /// fill would replace are close at hand. Two blocks ahead for what is
    /// found by address (one ahead was two ahead on the previous call),
    /// except the L2 set's payloads; one ahead for the L2 line the block
    /// will find or replace (one of its set's four: the whole set was
    /// four host lines per miss, three of them unused) and for the
    /// replaced L1 line's L2 line, each read from the set record the
    /// previous call fetched.
    #[inline]
    fn prefetch_next(&self, c: usize, icache: bool, block: u64) {
        let l1 = &self.l1[l1x(c, icache)];
        let next = block + 2;
        l1.prefetch_set(next);
        self.l2.prefetch_record(next);
        self.mem_versions.prefetch(next);
        // Of the next block's L2 set, fetched by the previous call, only
        // the line a lookup would find or replace now (others' accesses
        // may yet change it: a guess).
        let (Ok(l) | Err(l)) = self.l2.lookup_or_victim(block + 1);
        self.l2.prefetch_meta(l);
        let (v, tag) = l1.victim_tag(block + 1);
        if tag != INVALID {
            self.l2.prefetch_meta(l1.meta[v].l2 as usize);
            self.pcams[c].prefetch(tag);
        }
    }

    /// An ownership request by `c`: snooping reaches every other core's
    /// caches and PCAMs; the directory its sharers (§5.3.1), each probing
    /// caches and PCAMs before acking. Returns the cores sent an
    /// invalidation.
    fn invalidate_others(
        &mut self,
        c: usize,
        block: u64,
        pa: u64,
        l2i: usize,
        data: &mut DataSource,
        probes: &mut Vec<TlbProbe>,
    ) -> u64 {
        let m = &self.l2.meta[l2i];
        let owner = m.owner;
        let targets = if self.net.is_directory() {
            let o = (owner != NO_OWNER).then_some(owner as usize);
            directory::invalidation_targets(m.dir, o, c)
        } else {
            self.all_cores & !(1u64 << c)
        };
        if owner != NO_OWNER && owner as usize != c {
            // the owner supplies the data (a write miss) and invalidates
            if *data != DataSource::None {
                *data = DataSource::Owner(owner as usize);
                self.stats.cache_to_cache += 1;
            }
            self.l2.meta[l2i].owner = NO_OWNER;
        }
        if targets != 0 {
            self.invalidate_targets(targets, block, pa, l2i, probes);
        }
        self.l2.meta[l2i].dir &= !targets;
        self.stats.invalidations_sent += ones(targets);
        targets
    }

    /// `invalidate_others`' visits, out of line: a store miss to a block
    /// just brought into the L2 usually has no one to invalidate.
    #[inline(never)]
    fn invalidate_targets(
        &mut self,
        targets: u64,
        block: u64,
        pa: u64,
        l2i: usize,
        probes: &mut Vec<TlbProbe>,
    ) {
        let ack_fault = self.cfg.faults.ack_before_invalidate;
        let probe_pcams = self.cfg.unitd && !self.cfg.faults.snoop_skips_pcam;
        for t in bits(targets) {
            let tb = 1u64 << t;
            if self.l2.meta[l2i].d_mask & tb != 0 {
                if let Some(l) = self.l1[l1x(t, false)].lookup(block) {
                    let st = self.l1[l1x(t, false)].meta[l].state;
                    if ack_fault && st == State::S {
                        // acked, but the S copy stays (the fault)
                    } else {
                        l1_remove(&mut self.l1[l1x(t, false)], &mut self.l2, l);
                    }
                    self.stats.invalidations += 1;
                }
                self.l2.meta[l2i].d_mask &= !tb;
            }
            if self.l2.meta[l2i].i_mask & tb != 0 {
                if let Some(l) = self.l1[l1x(t, true)].lookup(block) {
                    if !ack_fault {
                        l1_remove(&mut self.l1[l1x(t, true)], &mut self.l2, l);
                    }
                    self.stats.invalidations += 1;
                }
                self.l2.meta[l2i].i_mask &= !tb;
            }
            if probe_pcams {
                self.probe_core(t, block, pa, l2i, probes);
            }
        }
    }

    /// Fig. 6a: a TLB insertion at `index` of TLB `tlb` writes the PTE's
    /// block address into the PCAM at the same index, replacing what the
    /// TLB replaced. No-op with UNITD off.
    pub fn pcam_insert(&mut self, core: usize, tlb: usize, index: usize, pte_pa: u64) {
        if !self.cfg.unitd {
            return;
        }
        let block = pte_pa >> self.shift;
        let l2i = match self.l2.lookup(block) {
            Some(i) => i,
            None => {
                let v = self.l2.victim_where(block, |m| m.pcam == 0);
                let mut d = std::mem::take(&mut self.deferred);
                self.l2_install(v, block, &mut d);
                self.deferred = d;
                v
            }
        };
        self.l2.meta[l2i].pcam += 1;
        self.l2.meta[l2i].dir |= 1 << core;
        self.stats.pcam_inserts += 1;
        let jetty_inc = !self.cfg.faults.jetty_misses_insert;
        if let Some(old) = self.pcams[core].insert(tlb, index, block, pte_pa, jetty_inc) {
            dec_pcam(&mut self.l2, old);
        }
    }

    /// A TLB replacement or single-entry flush clears the PCAM slot.
    pub fn pcam_clear(&mut self, core: usize, tlb: usize, index: usize) {
        if !self.cfg.unitd {
            return;
        }
        if let Some(b) = self.pcams[core].clear(tlb, index) {
            dec_pcam(&mut self.l2, b);
        }
    }

    /// A full TLB flush clears its whole PCAM.
    pub fn pcam_clear_all(&mut self, core: usize, tlb: usize) {
        if !self.cfg.unitd {
            return;
        }
        let l2 = &mut self.l2;
        self.pcams[core].clear_all(tlb, |b| dec_pcam(l2, b));
    }

    /// The exact PTE address in a PCAM slot, if valid.
    pub fn pcam_entry(&self, core: usize, tlb: usize, index: usize) -> Option<u64> {
        self.pcams[core].get(tlb, index).map(|(_, pa)| pa)
    }

    /// TLB invalidations caused by a `pcam_insert`'s L2 fill, if any; they
    /// are also handed over by the next `access`.
    pub fn take_deferred_probes(&mut self, probes: &mut Vec<TlbProbe>) {
        probes.append(&mut self.deferred);
    }

    /// Coherence state of `pa`'s block in a core's L1I or L1D.
    pub fn l1_state(&self, core: usize, pa: u64, icache: bool) -> State {
        let c = &self.l1[l1x(core, icache)];
        c.lookup(pa >> self.shift)
            .map_or(State::I, |l| c.meta[l].state)
    }

    /// The directory's sharer list for `pa`'s block (a core bit mask), if
    /// the block is in the L2.
    pub fn directory_sharers(&self, pa: u64) -> Option<u64> {
        self.l2
            .lookup(pa >> self.shift)
            .map(|i| self.l2.meta[i].dir)
    }

    /// Whether `core`'s Jetty lets a coherence lookup for `pa` reach its
    /// PCAMs (always true with the filter off).
    pub fn jetty_admits(&self, core: usize, pa: u64) -> bool {
        !self.cfg.jetty || self.pcams[core].jetty.may_contain(pa)
    }

    /// Whether `pa`'s block is in the L2.
    pub fn in_l2(&self, pa: u64) -> bool {
        self.l2.lookup(pa >> self.shift).is_some()
    }
}
