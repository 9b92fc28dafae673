//! Memory-system configuration, its defaults (romanescu10 Table 1) and
//! validation. Every error names the offending key, prefixed by the caller's
//! path (e.g. `memory.l1d.size_bytes: ...`).
//!
//! Values the paper does not state are marked "assumption" below.

use serde::{Deserialize, Serialize};

/// Size of one page-table entry in bytes (IA32 PAE, Fig. 4): the smallest
/// block that can hold a PTE and the granularity of the false-invalidation
/// statistic.
pub const PTE_BYTES: u64 = 8;

/// The Jetty filter indexes PA bits 19–16 and 15–12 (§6.4).
pub const JETTY_LOW_BIT: u32 = 12;
pub const JETTY_HIGH_BIT: u32 = 19;

/// One cache level's geometry. `sets = size_bytes / (ways × block_bytes)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    pub size_bytes: u64,
    pub ways: u64,
    pub block_bytes: u64,
    /// Hit latency in cycles.
    pub latency_cycles: u64,
}

impl CacheConfig {
    /// Table 1: L1I / L1D 128 KB, 4-way, 64 B blocks, 1-cycle hit.
    pub fn table1_l1() -> CacheConfig {
        CacheConfig {
            size_bytes: 128 * 1024,
            ways: 4,
            block_bytes: 64,
            latency_cycles: 1,
        }
    }

    /// Table 1: L2 4 MB, 4-way, 64 B blocks, 6-cycle hit.
    pub fn table1_l2() -> CacheConfig {
        CacheConfig {
            size_bytes: 4 * 1024 * 1024,
            ways: 4,
            block_bytes: 64,
            latency_cycles: 6,
        }
    }

    /// Number of sets (valid only after `validate`).
    pub fn sets(&self) -> u64 {
        self.size_bytes / (self.ways * self.block_bytes)
    }

    /// The largest cache level a spec may give: 1 GiB, above any cache
    /// built. Every line is allocated before the run (about 24 bytes of
    /// host memory per line, per core for the L1s).
    pub const MAX_SIZE_BYTES: u64 = 1 << 30;

    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        if self.ways == 0 {
            return Err(format!("{prefix}.ways: must be at least 1"));
        }
        if self.latency_cycles == 0 {
            // With the memory system, a reference costs its cache's
            // latency (`costs.ref_cycles` is 0): a 0-cycle hit would loop
            // without advancing time.
            return Err(format!("{prefix}.latency_cycles: must be at least 1"));
        }
        if self.size_bytes > Self::MAX_SIZE_BYTES {
            return Err(format!(
                "{prefix}.size_bytes: {} is above the 1 GiB ({}) a cache level may have",
                self.size_bytes,
                Self::MAX_SIZE_BYTES
            ));
        }
        if self.block_bytes == 0 || !self.block_bytes.is_power_of_two() {
            return Err(format!(
                "{prefix}.block_bytes: {} is not a power of two",
                self.block_bytes
            ));
        }
        if self.block_bytes < PTE_BYTES {
            return Err(format!(
                "{prefix}.block_bytes: {} is smaller than a {PTE_BYTES}-byte PTE",
                self.block_bytes
            ));
        }
        let way_bytes = self.ways * self.block_bytes;
        if self.size_bytes == 0 || !self.size_bytes.is_multiple_of(way_bytes) {
            return Err(format!(
                "{prefix}.size_bytes: {} is not sets × ways × block_bytes (ways {}, block_bytes {})",
                self.size_bytes, self.ways, self.block_bytes
            ));
        }
        let sets = self.sets();
        if !sets.is_power_of_two() {
            return Err(format!(
                "{prefix}.size_bytes: {} gives {sets} sets, not a power of two",
                self.size_bytes
            ));
        }
        Ok(())
    }
}

/// MOSI (Table 1) or MOESI (§5.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Mosi,
    Moesi,
}

/// Table 1's two networks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Interconnect {
    /// Ordered broadcast tree: every request reaches the root, which orders
    /// it, then every core's caches and PCAMs.
    Snooping {
        /// Cycles per tree level (assumption: 2).
        tree_hop_cycles: u64,
    },
    /// Full-map directory on a 2D mesh; homes are block-interleaved tiles.
    Directory {
        mesh_cols: u64,
        mesh_rows: u64,
        /// Cycles per mesh hop (assumption: 2).
        hop_cycles: u64,
        /// Directory lookup cycles (assumption: 6, the L2 bank's latency).
        dir_cycles: u64,
        /// Sharer pointers per entry; 0 = full map (the only organisation
        /// modelled). Values above `cores` are refused.
        #[serde(default)]
        sharers: u64,
    },
}

impl Interconnect {
    pub fn default_snooping() -> Interconnect {
        Interconnect::Snooping { tree_hop_cycles: 2 }
    }
    pub fn default_directory() -> Interconnect {
        Interconnect::Directory {
            mesh_cols: 4,
            mesh_rows: 4,
            hop_cycles: 2,
            dir_cycles: 6,
            sharers: 0,
        }
    }
}

/// Deliberate bugs for negative controls. All off by default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// PCAMs never match (coherence lookups and L2 recalls alike).
    pub pcam_disabled: bool,
    /// Remote ownership requests skip PCAMs; local self-snoops still work.
    pub snoop_skips_pcam: bool,
    /// Local stores do not self-snoop the local PCAMs (§5.2 Solution #2 broken).
    pub no_self_snoop: bool,
    /// The directory ignores the keep-sharer bit on writebacks (§5.3.1).
    pub directory_forgets_tlb_sharers: bool,
    /// Jetty counters are not incremented on PCAM insert.
    pub jetty_misses_insert: bool,
    /// The controller acks an invalidation but leaves a remote S copy valid.
    pub ack_before_invalidate: bool,
    /// Read by the core's pipeline (the kernel model), not the memory
    /// system: an access whose translation is invalidated during its miss
    /// performs with it instead of replaying its lookup (§5.1 broken).
    pub no_replay: bool,
    /// Read by the kernel model: a software TLB miss handler does not
    /// supply the PTE's address to the PCAM (§4.1's dedicated instruction
    /// left out).
    pub swtlb_no_pte_address: bool,
}

/// The whole memory system.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemConfig {
    /// Number of cores, 1..=64 (Table 1: 2, 4, 8, 16).
    pub cores: usize,
    pub l1i: CacheConfig,
    pub l1d: CacheConfig,
    pub l2: CacheConfig,
    /// Table 1: 160 cycles.
    pub memory_latency_cycles: u64,
    /// Each memory access adds a seeded uniform 0..=this (§6.1 perturbation,
    /// after Alameldeen et al.; size unstated, assumption: 4).
    pub mem_perturb_cycles: u64,
    pub protocol: Protocol,
    pub interconnect: Interconnect,
    /// TLBs take part in coherence through PCAMs (§4).
    pub unitd: bool,
    /// PCAMs per core, one per TLB (Table 1: an I-TLB and a D-TLB).
    pub tlbs_per_core: usize,
    /// Entries per PCAM; must equal the TLB's entries (§4.2).
    pub pcam_entries: usize,
    /// Include-Jetty filter before each core's PCAMs (§5.4, §6.4).
    pub jetty: bool,
    /// The MOSI/TLB invariant checker.
    pub checker: bool,
    /// Physical address width (32 in the evaluated x86 system).
    pub pa_bits: u32,
    pub faults: Faults,
}

impl Default for MemConfig {
    fn default() -> Self {
        MemConfig {
            cores: 16,
            l1i: CacheConfig::table1_l1(),
            l1d: CacheConfig::table1_l1(),
            l2: CacheConfig::table1_l2(),
            memory_latency_cycles: 160,
            mem_perturb_cycles: 4,
            protocol: Protocol::Mosi,
            interconnect: Interconnect::default_directory(),
            unitd: true,
            tlbs_per_core: 2,
            pcam_entries: 64,
            jetty: true,
            checker: true,
            pa_bits: 32,
            faults: Faults::default(),
        }
    }
}

impl MemConfig {
    /// Checks everything that does not depend on the TLB configuration.
    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        if self.cores == 0 || self.cores > 64 {
            return Err(format!("{prefix}.cores: {} is not in 1..=64", self.cores));
        }
        self.l1i.validate(&format!("{prefix}.l1i"))?;
        self.l1d.validate(&format!("{prefix}.l1d"))?;
        self.l2.validate(&format!("{prefix}.l2"))?;
        for (key, c) in [("l1i", &self.l1i), ("l1d", &self.l1d)] {
            if c.block_bytes != self.l2.block_bytes {
                return Err(format!(
                    "{prefix}.{key}.block_bytes: {} differs from l2.block_bytes {}",
                    c.block_bytes, self.l2.block_bytes
                ));
            }
        }
        if self.pa_bits < 12 || self.pa_bits > 63 {
            return Err(format!(
                "{prefix}.pa_bits: {} is not in 12..=63",
                self.pa_bits
            ));
        }
        if self.tlbs_per_core == 0 {
            return Err(format!("{prefix}.tlbs_per_core: must be at least 1"));
        }
        if self.pcam_entries == 0 {
            return Err(format!("{prefix}.pcam_entries: must be at least 1"));
        }
        if self.jetty {
            let block = self.l2.block_bytes;
            if (1u64 << JETTY_LOW_BIT) < block {
                return Err(format!(
                    "{prefix}.l2.block_bytes: {block} puts the Jetty index bits \
                     {JETTY_HIGH_BIT}-{JETTY_LOW_BIT} inside the block offset"
                ));
            }
            if self.pa_bits <= JETTY_HIGH_BIT {
                return Err(format!(
                    "{prefix}.pa_bits: {} is below the Jetty index bit {JETTY_HIGH_BIT}",
                    self.pa_bits
                ));
            }
        }
        match self.interconnect {
            Interconnect::Snooping { .. } => {}
            Interconnect::Directory {
                mesh_cols,
                mesh_rows,
                sharers,
                ..
            } => {
                if mesh_cols == 0 || mesh_rows == 0 {
                    return Err(format!(
                        "{prefix}.interconnect.mesh_cols: a {mesh_cols}x{mesh_rows} mesh is empty"
                    ));
                }
                if mesh_cols.saturating_mul(mesh_rows) < self.cores as u64 {
                    return Err(format!(
                        "{prefix}.interconnect.mesh_cols: a {mesh_cols}x{mesh_rows} mesh has \
                         fewer tiles than {} cores",
                        self.cores
                    ));
                }
                if sharers > self.cores as u64 {
                    return Err(format!(
                        "{prefix}.interconnect.sharers: {sharers} is above the {} cores",
                        self.cores
                    ));
                }
                if sharers != 0 && sharers != self.cores as u64 {
                    return Err(format!(
                        "{prefix}.interconnect.sharers: {sharers}: only a full-map directory \
                         (0 or {}) is modelled",
                        self.cores
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks the PCAM against the TLB it shadows (§4.2: same number of
    /// entries) and the TLB's own ways.
    pub fn validate_against_tlb(
        &self,
        prefix: &str,
        tlb_entries: usize,
        tlb_ways: usize,
    ) -> Result<(), String> {
        if tlb_ways > tlb_entries {
            return Err(format!(
                "{prefix}.tlb.ways: {tlb_ways} ways are above the TLB's {tlb_entries} entries"
            ));
        }
        if self.pcam_entries != tlb_entries {
            return Err(format!(
                "{prefix}.pcam_entries: {} is unlike the TLB's {tlb_entries} entries",
                self.pcam_entries
            ));
        }
        Ok(())
    }

    /// log2 of the block size (all levels share it after validation).
    pub fn block_shift(&self) -> u32 {
        self.l2.block_bytes.trailing_zeros()
    }
}

/// §6.5: PCAM tag bits (the PTE's block address) against TLB tag bits (the
/// virtual page number). 32-bit PA/VA, 64 B blocks, 4 KB pages → (26, 20);
/// a 44-bit PA → 38.
pub fn pcam_geometry(pa_bits: u32, block_bytes: u64, page_bytes: u64, va_bits: u32) -> (u32, u32) {
    let pcam = pa_bits - block_bytes.trailing_zeros();
    let tlb = va_bits - page_bytes.trailing_zeros();
    (pcam, tlb)
}

/// PCAM storage per core: every entry holds a tag and a valid bit.
pub fn pcam_bits_per_core(pa_bits: u32, block_bytes: u64, entries: usize, tlbs: usize) -> u64 {
    let tag = (pa_bits - block_bytes.trailing_zeros()) as u64;
    (tag + 1) * entries as u64 * tlbs as u64
}
