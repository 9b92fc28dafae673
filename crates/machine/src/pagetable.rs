//! Page-table formats stored in simulated physical frames, and the walker.
//!
//! Formats: `i386` (two levels of 1024 four-byte entries, balan92
//! §Background), `pae` (three levels, 4 + 512 + 512 eight-byte entries,
//! romanescu10 Fig. 4) and `x86-64` (four levels of 512 eight-byte
//! entries). All use 4 KB pages. The PTE encoding is mmulab's own (present,
//! writable, user, referenced, modified, global, frame number), the same for
//! every format; only the geometry differs.

use crate::ids::{Pfn, Vpn};
use crate::physmem::{OutOfMemory, PhysMem};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PtFormat {
    #[serde(rename = "i386")]
    I386,
    #[serde(rename = "pae")]
    Pae,
    #[serde(rename = "x86-64")]
    X86_64,
}

/// A page-table entry value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pte(pub u64);

impl Pte {
    pub const PRESENT: u64 = 1;
    pub const WRITABLE: u64 = 2;
    pub const USER: u64 = 4;
    pub const REFERENCED: u64 = 0x20;
    pub const MODIFIED: u64 = 0x40;
    pub const GLOBAL: u64 = 0x100;
    const FLAGS: u64 = 0xfff;

    pub fn new(pfn: Pfn, writable: bool, user: bool) -> Pte {
        let mut v = (pfn.0 << 12) | Self::PRESENT;
        if writable {
            v |= Self::WRITABLE;
        }
        if user {
            v |= Self::USER;
        }
        Pte(v)
    }
    pub fn present(self) -> bool {
        self.0 & Self::PRESENT != 0
    }
    pub fn writable(self) -> bool {
        self.0 & Self::WRITABLE != 0
    }
    pub fn user(self) -> bool {
        self.0 & Self::USER != 0
    }
    pub fn referenced(self) -> bool {
        self.0 & Self::REFERENCED != 0
    }
    pub fn modified(self) -> bool {
        self.0 & Self::MODIFIED != 0
    }
    pub fn global(self) -> bool {
        self.0 & Self::GLOBAL != 0
    }
    pub fn pfn(self) -> Pfn {
        Pfn(self.0 >> 12)
    }
    pub fn with(self, bits: u64) -> Pte {
        Pte(self.0 | bits)
    }
    pub fn without(self, bits: u64) -> Pte {
        Pte(self.0 & !bits)
    }
    pub fn flags(self) -> u64 {
        self.0 & Self::FLAGS
    }
}

impl PtFormat {
    /// Index bits per level, root first.
    pub fn level_bits(self) -> &'static [u32] {
        match self {
            PtFormat::I386 => &[10, 10],
            PtFormat::Pae => &[2, 9, 9],
            PtFormat::X86_64 => &[9, 9, 9, 9],
        }
    }
    pub fn levels(self) -> usize {
        self.level_bits().len()
    }
    pub fn pte_bytes(self) -> u64 {
        match self {
            PtFormat::I386 => 4,
            PtFormat::Pae | PtFormat::X86_64 => 8,
        }
    }
    pub fn page_shift(self) -> u32 {
        12
    }
    /// Physical memory a PTE of this format can address, in MiB: 32 bits
    /// on the i386, the 36 of the first PAE processors, 52 on x86-64.
    pub fn max_memory_mb(self) -> u64 {
        match self {
            PtFormat::I386 => 1 << (32 - 20),
            PtFormat::Pae => 1 << (36 - 20),
            PtFormat::X86_64 => 1 << (52 - 20),
        }
    }
    /// The name a spec gives the format.
    pub fn name(self) -> &'static str {
        match self {
            PtFormat::I386 => "i386",
            PtFormat::Pae => "pae",
            PtFormat::X86_64 => "x86-64",
        }
    }
    /// Entries in a table at `level` (0 = root).
    pub fn entries(self, level: usize) -> usize {
        1 << self.level_bits()[level]
    }
    /// Virtual pages addressable.
    pub fn vpn_bits(self) -> u32 {
        self.level_bits().iter().sum()
    }
    /// The index into the table at `level` for `vpn`.
    pub fn index(self, vpn: Vpn, level: usize) -> usize {
        let bits = self.level_bits();
        let below: u32 = bits[level + 1..].iter().sum();
        ((vpn.0 >> below) & ((1 << bits[level]) - 1)) as usize
    }
    /// Pages mapped by one entry at `level` (1 at the last level).
    pub fn pages_per_entry(self, level: usize) -> u64 {
        let below: u32 = self.level_bits()[level + 1..].iter().sum();
        1 << below
    }
    pub fn pte_pa(self, table: Pfn, index: usize) -> u64 {
        (table.0 << self.page_shift()) + index as u64 * self.pte_bytes()
    }
}

/// What a walk found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    /// The last-level PTE, or the first non-present upper entry.
    pub pte: Pte,
    /// Where that entry lives: (table frame, index).
    pub table: Pfn,
    pub index: usize,
    /// Physical address of that entry.
    pub pte_pa: u64,
    /// Table entries read (the walker's cost is per level read).
    pub levels_read: u32,
    /// True when the walk reached the last level.
    pub leaf: bool,
    /// Physical address of the entry read at each level (the first
    /// `levels_read` are meaningful): a walker that loads through the data
    /// cache reads these (romanescu10 §5.2).
    pub path: [u64; 4],
}

/// Walks the tables rooted at `root` for `vpn`, reading one entry per level.
/// Upper-level entries point at the next table; their only meaningful bit
/// is `PRESENT` (rights live in the last level).
pub fn walk(mem: &PhysMem, fmt: PtFormat, root: Pfn, vpn: Vpn) -> Walk {
    let mut table = root;
    let mut path = [0; 4];
    for level in 0..fmt.levels() {
        let index = fmt.index(vpn, level);
        let pte = Pte(mem.table(table)[index]);
        let last = level + 1 == fmt.levels();
        path[level] = fmt.pte_pa(table, index);
        if last || !pte.present() {
            return Walk {
                pte,
                table,
                index,
                pte_pa: path[level],
                levels_read: level as u32 + 1,
                leaf: last,
                path,
            };
        }
        table = pte.pfn();
    }
    unreachable!("the loop returns at the last level")
}

/// Finds (creating missing intermediate tables when `create`) the
/// last-level table and index for `vpn`. Returns None when a table is
/// missing and `create` is false. `new_tables` receives frames allocated.
pub fn leaf_slot(
    mem: &mut PhysMem,
    fmt: PtFormat,
    root: Pfn,
    vpn: Vpn,
    create: bool,
    new_tables: &mut Vec<Pfn>,
) -> Result<Option<(Pfn, usize)>, OutOfMemory> {
    let mut table = root;
    for level in 0..fmt.levels() - 1 {
        let index = fmt.index(vpn, level);
        let pte = Pte(mem.table(table)[index]);
        table = if pte.present() {
            pte.pfn()
        } else if create {
            let t = mem.alloc_table(fmt.entries(level + 1))?;
            new_tables.push(t);
            mem.table_mut(table)[index] = Pte::new(t, true, true).0;
            t
        } else {
            return Ok(None);
        };
    }
    Ok(Some((table, fmt.index(vpn, fmt.levels() - 1))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(fmt: PtFormat) -> (PhysMem, Pfn) {
        let mut m = PhysMem::new(4096, 1 << 16);
        let root = m.alloc_table(fmt.entries(0)).unwrap();
        (m, root)
    }

    #[test]
    fn walks_every_format() {
        for fmt in [PtFormat::I386, PtFormat::Pae, PtFormat::X86_64] {
            let (mut m, root) = setup(fmt);
            let vpn = Vpn((1 << (fmt.vpn_bits() - 1)) + 0x1234);
            let w = walk(&m, fmt, root, vpn);
            assert!(
                !w.pte.present() && !w.leaf && w.levels_read == 1,
                "{fmt:?}: empty root"
            );
            let mut tables = Vec::new();
            let (t, i) = leaf_slot(&mut m, fmt, root, vpn, true, &mut tables)
                .unwrap()
                .unwrap();
            assert_eq!(tables.len(), fmt.levels() - 1);
            let data = m.alloc_data().unwrap();
            m.table_mut(t)[i] = Pte::new(data, true, true).0;
            let w = walk(&m, fmt, root, vpn);
            assert!(w.leaf && w.pte.present() && w.pte.writable());
            assert_eq!(w.pte.pfn(), data);
            assert_eq!(w.levels_read as usize, fmt.levels());
            assert_eq!(w.pte_pa, (t.0 << 12) + i as u64 * fmt.pte_bytes());
            // A neighbouring page shares the last-level table.
            let w2 = walk(&m, fmt, root, Vpn(vpn.0 ^ 1));
            assert!(w2.leaf && !w2.pte.present());
            assert_eq!(w2.table, t);
        }
    }

    #[test]
    fn i386_geometry_is_1024_by_1024() {
        let f = PtFormat::I386;
        assert_eq!(f.entries(0), 1024);
        assert_eq!(f.entries(1), 1024);
        assert_eq!(f.pte_bytes(), 4);
        assert_eq!(f.pages_per_entry(0), 1024);
        assert_eq!(f.index(Vpn(0xfffff), 0), 1023);
    }

    #[test]
    fn pte_bits_round_trip() {
        let p = Pte::new(Pfn(77), false, true).with(Pte::REFERENCED | Pte::MODIFIED);
        assert!(p.present() && !p.writable() && p.user() && p.referenced() && p.modified());
        assert_eq!(p.pfn(), Pfn(77));
        assert!(!p.without(Pte::MODIFIED).modified());
    }
}
