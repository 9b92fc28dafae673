//! The MIPS R2000 TLB as the hardware has it (uhlig94 §4.1; Kane and Heinrich 1992), and
//! the trap-driven R2000 mode that `mmulab trace sim --r2000` runs.
//!
//! * 64 fully associative entries; the lower 8 are *wired*: the Random register never
//!   points at them, so only software (`tlbwi` at an index it keeps) fills them. The
//!   baseline systems put L2 PTEs there with a software FIFO index (§5.2.1, policy A).
//! * `tlbwr` writes at the **Random register**, which decrements once per cycle and, after
//!   reaching the wired boundary (8), wraps back to 63 (it never returns 0-7). Which slot a
//!   fill replaces therefore depends on how many cycles passed since reset: on the
//!   references the program made and on the cycles the miss handlers took. It is not a
//!   uniform draw.
//! * Entries carry a 6-bit ASID (64 address spaces); kernel entries are global. A task that
//!   runs without an ASID of the current generation takes a free one; when none is free the
//!   kernel flushes the TLB's non-global entries and starts a new generation (the usual
//!   ASID-rollover scheme; the paper does not say how each OS recycles ASIDs).
//!
//! The run is trap-driven: every reference is looked up in this TLB, and only a miss traps
//! to the modelled OS handler (Table III's six types). The handler's own PTE loads (the
//! L1 page table for an L1U miss, the L2 table under OSF/1 and Mach) are references
//! through the same TLB, so nested L2 and L3 misses depend on what the TLB holds, and the
//! cycles each handler takes (Table III) move the Random register: the TLB's state feeds
//! back into the reference stream the handler issues and into where the next fill lands.
//!
//! Clock convention (stated so an independent model can be written against it): the clock
//! advances by `cycles_per_ref` before each reference's lookup; a trap adds its handler's
//! cycles when it is taken (before its nested loads and its fill); a fill reads the Random
//! register at the current clock. Modify (a store to a clean page) traps after the
//! translation is in the TLB; its cycles are added too.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use serde::{Deserialize, Serialize};

use crate::costs::{CostPreset, MissType};
use crate::os::{INVALID, KERNEL_TASK, MODIFY, OsKind, SysRef};
use crate::pagetable::{Key, PteClass, TaskId, l2_of_user, l3_of_l1k, l3_of_l2};
use crate::tlb::KeyHasher;

type Index = HashMap<u64, usize, BuildHasherDefault<KeyHasher>>;

/// The R2000's entries, wired entries and address-space identifiers.
pub const R2000_SLOTS: usize = 64;
pub const R2000_WIRED: usize = 8;
pub const R2000_ASIDS: u32 = 64;

/// The shape of the modelled R2000 (every field defaults to the hardware's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct R2000Config {
    pub slots: usize,
    pub wired: usize,
    pub asids: u32,
    /// Cycles per application or OS reference between misses. [A] 1: the R2000 issues
    /// about one instruction per cycle, and a reference stream of fetches and data
    /// accesses has about one reference per instruction; no paper number.
    pub cycles_per_ref: u64,
}

impl Default for R2000Config {
    fn default() -> Self {
        R2000Config {
            slots: R2000_SLOTS,
            wired: R2000_WIRED,
            asids: R2000_ASIDS,
            cycles_per_ref: 1,
        }
    }
}

impl R2000Config {
    pub fn validate(&self) -> Result<(), String> {
        if self.slots == 0 || self.wired >= self.slots {
            return Err(format!(
                "r2000: {} wired of {} slots leaves no slot for the Random register",
                self.wired, self.slots
            ));
        }
        if self.asids == 0 {
            return Err("r2000.asids: must be at least 1".into());
        }
        Ok(())
    }
}

/// The R2000 TLB: slots, the wired FIFO index, the Random register and the ASID table.
#[derive(Clone, Debug)]
pub struct R2000 {
    cfg: R2000Config,
    slots: Vec<Key>,
    index: Index,
    wired_next: usize,
    /// Cycles since reset: the Random register is derived from it.
    pub clock: u64,
    asid_of: HashMap<TaskId, u32>,
    /// ASID rollovers (each flushed every non-global entry).
    pub flushes: u64,
}

impl R2000 {
    pub fn new(cfg: R2000Config) -> R2000 {
        R2000 {
            slots: vec![Key::EMPTY; cfg.slots],
            index: Index::default(),
            wired_next: 0,
            clock: 0,
            asid_of: HashMap::new(),
            flushes: 0,
            cfg,
        }
    }

    pub fn config(&self) -> &R2000Config {
        &self.cfg
    }

    /// The Random register now: `slots-1` at reset, one lower per cycle, wrapping from
    /// `wired` back to `slots-1`.
    pub fn random(&self) -> usize {
        let span = (self.cfg.slots - self.cfg.wired) as u64;
        self.cfg.slots - 1 - (self.clock % span) as usize
    }

    pub fn contains(&self, key: Key) -> bool {
        self.index.contains_key(&key.0)
    }

    pub fn slot_of(&self, key: Key) -> Option<usize> {
        self.index.get(&key.0).copied()
    }

    /// Entries of task 0 (the kernel's own pages and PTEs) are global: no ASID.
    fn global(key: Key) -> bool {
        key.task() == KERNEL_TASK
    }

    /// `task` runs: give it an ASID of the current generation, flushing on rollover.
    pub fn run(&mut self, task: TaskId) {
        if task == KERNEL_TASK || self.asid_of.contains_key(&task) {
            return;
        }
        if self.asid_of.len() as u32 >= self.cfg.asids {
            self.flush_nonglobal();
            self.asid_of.clear();
            self.flushes += 1;
        }
        let a = self.asid_of.len() as u32;
        self.asid_of.insert(task, a);
    }

    fn flush_nonglobal(&mut self) {
        for s in 0..self.slots.len() {
            let k = self.slots[s];
            if k != Key::EMPTY && !Self::global(k) {
                self.index.remove(&k.0);
                self.slots[s] = Key::EMPTY;
            }
        }
    }

    fn write(&mut self, slot: usize, key: Key) -> Option<Key> {
        debug_assert!(!self.contains(key), "{key:?} written twice");
        let victim = std::mem::replace(&mut self.slots[slot], key);
        if victim != Key::EMPTY {
            self.index.remove(&victim.0);
        }
        self.index.insert(key.0, slot);
        (victim != Key::EMPTY).then_some(victim)
    }

    /// `tlbwr`: write at the Random register. Returns the victim.
    pub fn write_random(&mut self, key: Key) -> Option<Key> {
        let s = self.random();
        self.write(s, key)
    }

    /// `tlbwi` into the wired slots at the software FIFO index (with no wired slots, a
    /// `tlbwr`). Returns the victim.
    pub fn write_wired(&mut self, key: Key) -> Option<Key> {
        if self.cfg.wired == 0 {
            return self.write_random(key);
        }
        let s = self.wired_next;
        self.wired_next = (s + 1) % self.cfg.wired;
        self.write(s, key)
    }

    /// Removes `key` if present (Tapeworm's inclusion rule).
    pub fn remove(&mut self, key: Key) -> bool {
        match self.index.remove(&key.0) {
            Some(s) => {
                self.slots[s] = Key::EMPTY;
                true
            }
            None => false,
        }
    }
}

/// What one trap-driven R2000 run saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct R2000Outcome {
    pub os: String,
    pub refs: u64,
    /// Misses by [`MissType::index`] (L1U, L1K, L2, L3, Modify, Invalid).
    pub counts: [u64; 6],
    /// Handler cycles by miss type (Table III's median cycles × count).
    pub cycles: [f64; 6],
    pub ns_per_cycle: f64,
    /// Cycles since reset at the end (references and handlers).
    pub clock: u64,
    /// ASID rollovers, each a flush of every non-global entry.
    pub asid_flushes: u64,
    /// Distinct tasks (address spaces) seen.
    pub tasks: u64,
}

impl R2000Outcome {
    pub fn count(&self, t: MissType) -> u64 {
        self.counts[t.index()]
    }
    pub fn total_cycles(&self) -> f64 {
        self.cycles.iter().sum()
    }
    pub fn seconds(&self) -> f64 {
        self.total_cycles() * self.ns_per_cycle * 1e-9
    }
}

struct Handler<'a> {
    tlb: R2000,
    three_level: bool,
    costs: &'a CostPreset,
    out: R2000Outcome,
}

impl Handler<'_> {
    fn trap(&mut self, t: MissType) {
        let c = self.costs.cycles_of(t);
        self.out.counts[t.index()] += 1;
        self.out.cycles[t.index()] += c;
        self.tlb.clock += c.round() as u64;
    }

    /// The L2 handler's load of an L3-mapped PTE page (3-level systems).
    fn load_l3(&mut self, l3: Key) {
        if !self.tlb.contains(l3) {
            self.trap(MissType::L3);
            self.tlb.write_random(l3);
        }
    }

    fn reference(&mut self, r: SysRef) {
        self.out.refs += 1;
        self.tlb.clock += self.tlb.cfg.cycles_per_ref;
        let key = r.key;
        self.tlb.run(key.task());
        if !self.tlb.contains(key) {
            let class = key.class();
            let t = if r.flags & INVALID != 0 {
                MissType::Invalid
            } else if class == PteClass::L1U {
                MissType::L1U
            } else {
                MissType::L1K
            };
            self.trap(t);
            match class {
                PteClass::L1U => {
                    // The handler loads the L1U PTE from the task's mapped L1 table.
                    let l2 = l2_of_user(key.task(), key.page());
                    if !self.tlb.contains(l2) {
                        self.trap(MissType::L2);
                        if self.three_level {
                            self.load_l3(l3_of_l2(l2));
                        }
                        self.tlb.write_wired(l2);
                    }
                }
                PteClass::L1K => {
                    if self.three_level {
                        self.load_l3(l3_of_l1k(key.page()));
                    }
                }
                PteClass::L2 | PteClass::L3 => unreachable!("only L1U and L1K keys are referenced"),
            }
            self.tlb.write_random(key);
        }
        if r.flags & MODIFY != 0 {
            self.trap(MissType::Modify);
        }
    }
}

/// Runs `stream` (an OS model's system-wide references) on the R2000 in trap-driven mode.
pub fn simulate_r2000(
    stream: &[SysRef],
    os: OsKind,
    costs: &CostPreset,
    cfg: &R2000Config,
) -> Result<R2000Outcome, String> {
    cfg.validate()?;
    let mut h = Handler {
        tlb: R2000::new(cfg.clone()),
        three_level: os.three_level(),
        costs,
        out: R2000Outcome {
            os: os.name().into(),
            ns_per_cycle: costs.ns_per_cycle,
            ..R2000Outcome::default()
        },
    };
    let mut tasks = std::collections::BTreeSet::new();
    for r in stream {
        tasks.insert(r.key.task());
        h.reference(*r);
    }
    h.out.clock = h.tlb.clock;
    h.out.asid_flushes = h.tlb.flushes;
    h.out.tasks = tasks.len() as u64;
    Ok(h.out)
}

/// `mmulab trace sim --r2000`: a captured trace (binary or lackey log, user references
/// and system calls) as the application task of `os`'s model ([`crate::os::OsModel`] with
/// [`crate::os::OsParams::preset`], seed `seed` for the model's kernel-data draws), run
/// trap-driven on the R2000 with Table III's costs for `os`.
pub fn simulate_trace(
    path: &std::path::Path,
    os: OsKind,
    cfg: &R2000Config,
    seed: u64,
) -> Result<R2000Outcome, String> {
    let events = crate::workload::load_trace(path).map_err(|e| e.to_string())?;
    let stream = crate::os::OsModel::new(os, crate::os::OsParams::preset(os), seed).expand(&events);
    let costs = CostPreset::decstation3100_1994(os.cost_column());
    simulate_r2000(&stream, os, &costs, cfg)
}

/// The text `mmulab trace sim --r2000` prints: one line per miss type, then the totals.
pub fn report_text(o: &R2000Outcome) -> String {
    let mut s = format!(
        "R2000 ({} OS model): {} references, {} ASID flushes, {} tasks\ntype\tmisses\tcycles\n",
        o.os, o.refs, o.asid_flushes, o.tasks
    );
    for t in MissType::ALL {
        s += &format!("{}\t{}\t{:.0}\n", t.name(), o.count(t), o.cycles[t.index()]);
    }
    s += &format!(
        "total\t{}\t{:.0}\t({:.6} s at {} ns/cycle)\n",
        o.counts.iter().sum::<u64>(),
        o.total_cycles(),
        o.seconds(),
        o.ns_per_cycle
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(t: TaskId, p: u64) -> Key {
        Key::new(PteClass::L1U, t, p)
    }

    #[test]
    fn random_register_decrements_per_cycle_and_skips_wired() {
        let mut t = R2000::new(R2000Config::default());
        assert_eq!(t.random(), 63);
        t.clock = 1;
        assert_eq!(t.random(), 62);
        t.clock = 55;
        assert_eq!(t.random(), 8);
        t.clock = 56;
        assert_eq!(t.random(), 63, "wraps past the wired slots");
        for c in 0..10_000 {
            t.clock = c;
            assert!((8..64).contains(&t.random()));
        }
    }

    #[test]
    fn wired_fifo_and_asid_rollover_flush() {
        let cfg = R2000Config {
            asids: 2,
            ..R2000Config::default()
        };
        let mut t = R2000::new(cfg);
        for p in 0..9 {
            t.write_wired(Key::new(PteClass::L2, 1, p));
        }
        assert!(!t.contains(Key::new(PteClass::L2, 1, 0)));
        assert_eq!(t.slot_of(Key::new(PteClass::L2, 1, 8)), Some(0));
        t.run(1);
        t.run(2);
        t.write_random(k(1, 5));
        t.write_random(Key::new(PteClass::L1K, KERNEL_TASK, 7));
        assert_eq!(t.flushes, 0);
        t.run(3); // a third address space: the ASIDs have run out
        assert_eq!(t.flushes, 1);
        assert!(!t.contains(k(1, 5)), "non-global entries flushed");
        assert!(
            t.contains(Key::new(PteClass::L1K, KERNEL_TASK, 7)),
            "global kept"
        );
    }
}
