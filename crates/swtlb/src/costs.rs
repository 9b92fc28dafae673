//! Miss types (uhlig94 Table III) and their handler costs.

use serde::{Deserialize, Serialize};

/// The six TLB miss types of Table III.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MissType {
    /// Miss on a level-1 user PTE; the only type taken at the fast uTLB vector.
    L1U,
    /// Miss on a level-1 kernel PTE.
    L1K,
    /// Miss on a level-2 PTE; only under an L1U miss.
    L2,
    /// Miss on a level-3 PTE; under an L2 or an L1K miss.
    L3,
    /// A store to a clean (or copy-on-write) page: a protection violation.
    Modify,
    /// An access to a page marked invalid: a page fault.
    Invalid,
}

impl MissType {
    pub const ALL: [MissType; 6] = [
        MissType::L1U,
        MissType::L1K,
        MissType::L2,
        MissType::L3,
        MissType::Modify,
        MissType::Invalid,
    ];
    pub fn name(self) -> &'static str {
        match self {
            MissType::L1U => "L1U",
            MissType::L1K => "L1K",
            MissType::L2 => "L2",
            MissType::L3 => "L3",
            MissType::Modify => "Modify",
            MissType::Invalid => "Invalid",
        }
    }
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Handler costs for one OS, in cycles per miss, indexed by [`MissType::index`].
/// `None` where the OS has no such miss (Ultrix has no L3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostPreset {
    pub name: String,
    /// Where the numbers come from.
    pub source: String,
    /// Nanoseconds per cycle (the DECstation 3100's R2000 at 16.67 MHz: 60 ns, Table III).
    pub ns_per_cycle: f64,
    pub cycles: [Option<f64>; 6],
    /// Extra cycles per L1U miss to keep the count dynamic partitioning needs (fn. 8:
    /// "anywhere from 4 to 10 cycles"); charged only when dynamic partitioning is on.
    pub dynamic_count_cycles_per_l1u: f64,
}

/// The operating systems whose costs Table III gives (the AFS variants are Mach 3.0
/// systems and use its costs: Table VI's Mach3+AFSin row is Table V × Mach 3.0's column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CostColumn {
    Ultrix,
    Osf1,
    Mach3,
}

impl CostPreset {
    /// `decstation3100-1994`: Table III's median cycles (Monster's 128K-entry histograms),
    /// 60 ns per cycle. L1U/L1K/L2/L3/Modify/Invalid: Ultrix 16/333/494/–/375/336, OSF/1
    /// 20/355/511/354/436/277, Mach 3.0 20/294/407/286/499/267.
    pub fn decstation3100_1994(column: CostColumn) -> CostPreset {
        let (name, c) = match column {
            CostColumn::Ultrix => ("Ultrix", [16.0, 333.0, 494.0, f64::NAN, 375.0, 336.0]),
            CostColumn::Osf1 => ("OSF/1", [20.0, 355.0, 511.0, 354.0, 436.0, 277.0]),
            CostColumn::Mach3 => ("Mach 3.0", [20.0, 294.0, 407.0, 286.0, 499.0, 267.0]),
        };
        CostPreset {
            name: format!("decstation3100-1994 ({name})"),
            source: format!(
                "uhlig94 Table III, {name} column (median cycles, Monster); 60 ns/cycle (Table III caption); fn. 8 for the counting overhead"
            ),
            ns_per_cycle: 60.0,
            cycles: c.map(|v| (!v.is_nan()).then_some(v)),
            dynamic_count_cycles_per_l1u: 7.0,
        }
    }

    /// §5.1's cheaper vectors: L1K misses taken at the uTLB vector (≈20 cycles) and a
    /// dedicated L2 vector (≈40 cycles).
    pub fn with_fast_vectors(mut self) -> CostPreset {
        self.cycles[MissType::L1K.index()] = Some(20.0);
        self.cycles[MissType::L2.index()] = Some(40.0);
        self.name.push_str(" + §5.1 vectors (L1K 20, L2 40)");
        self
    }

    pub fn cycles_of(&self, t: MissType) -> f64 {
        self.cycles[t.index()].unwrap_or(0.0)
    }

    /// Seconds spent on `counts` misses (indexed by [`MissType::index`]).
    pub fn seconds(&self, counts: &[u64; 6]) -> f64 {
        MissType::ALL
            .iter()
            .map(|t| counts[t.index()] as f64 * self.cycles_of(*t))
            .sum::<f64>()
            * self.ns_per_cycle
            * 1e-9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_vi_ultrix_cells_from_table_v_counts() {
        let p = CostPreset::decstation3100_1994(CostColumn::Ultrix);
        let counts = [9_021_420, 135_847, 3_828, 0, 115, 16_191];
        let secs = p.seconds(&counts);
        assert!((secs - 11.82).abs() < 0.01, "{secs}");
        assert_eq!(p.cycles[MissType::L3.index()], None);
    }

    #[test]
    fn fast_vectors_replace_l1k_and_l2() {
        let p = CostPreset::decstation3100_1994(CostColumn::Mach3).with_fast_vectors();
        assert_eq!(p.cycles_of(MissType::L1K), 20.0);
        assert_eq!(p.cycles_of(MissType::L2), 40.0);
        assert_eq!(p.cycles_of(MissType::L3), 286.0);
    }
}
