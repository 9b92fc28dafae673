//! The OS models of uhlig94 Table IV and §4.2: which pages a system call, an IPC and a
//! page fault touch, and which of them are mapped.
//!
//! * Ultrix: kernel data mostly in a small unmapped pool (§4.2.1): few L1K references.
//! * OSF/1: kernel data mostly mapped (§4.2.1): many L1K references.
//! * Mach 3.0: some kernel data mapped (a small unmapped pool used up quickly, fn. 4);
//!   Unix system calls are IPC to a Unix-server task (§4.2.2), whose text, data and stack
//!   are user pages with their own three L2 PTEs.
//! * Mach3+AFSin: as Mach 3.0, with the AFS cache manager's work in the Unix server
//!   (mapped by the server's L2 PTEs, §5.2.1).
//! * Mach3+AFSout: file calls go on, by IPC, to a separate AFS task (three more L2 PTEs).
//! * Every system talks to an X-server task for display calls (Table IV's "X Server").
//!
//! Kernel text is unmapped on the R2000 (kseg0) and never reaches the TLB. On every kernel
//! entry the kernel touches its stack and u-area, in two 4 MB regions mapped like user
//! pages — fn. 7's "two L2 PTEs for kernel data structures". Every address (the tasks'
//! segments, these two, mapped kernel data in kseg2) comes from [`crate::layout`].
//!
//! Invalid and Modify events depend only on page state, never on the TLB (§5.3): they are
//! decided here, once, for the whole reference stream.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use mmulab_engine::SimRng;
use mmulab_trace::AccessKind;
use serde::{Deserialize, Serialize};

use crate::costs::CostColumn;
use crate::layout::{KERNEL_ENTRY_VPNS, LAYOUT, kernel_data_vpn};
use crate::pagetable::{Key, PteClass, TaskId, l1k};
use crate::tlb::KeyHasher;
use crate::workload::{Event, SysClass};

pub const KERNEL_TASK: TaskId = 0;
pub const UNIX_SERVER: TaskId = 2;
pub const AFS_TASK: TaskId = 3;
pub const X_SERVER: TaskId = 4;

/// The five systems of Table I.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OsKind {
    Ultrix,
    Osf1,
    Mach3,
    Mach3AfsIn,
    Mach3AfsOut,
}

impl OsKind {
    pub const ALL: [OsKind; 5] = [
        OsKind::Ultrix,
        OsKind::Osf1,
        OsKind::Mach3,
        OsKind::Mach3AfsIn,
        OsKind::Mach3AfsOut,
    ];
    pub fn name(self) -> &'static str {
        match self {
            OsKind::Ultrix => "Ultrix",
            OsKind::Osf1 => "OSF/1",
            OsKind::Mach3 => "Mach3",
            OsKind::Mach3AfsIn => "Mach3+AFSin",
            OsKind::Mach3AfsOut => "Mach3+AFSout",
        }
    }
    /// The spec key of the OS (`ultrix`, `osf1`, `mach3`, `afsin`, `afsout`).
    pub fn key(self) -> &'static str {
        match self {
            OsKind::Ultrix => "ultrix",
            OsKind::Osf1 => "osf1",
            OsKind::Mach3 => "mach3",
            OsKind::Mach3AfsIn => "afsin",
            OsKind::Mach3AfsOut => "afsout",
        }
    }
    pub fn from_key(k: &str) -> Option<OsKind> {
        OsKind::ALL.into_iter().find(|o| o.key() == k)
    }
    /// Ultrix's L2 table is unmapped: two levels, no L3 (Table III).
    pub fn three_level(self) -> bool {
        self != OsKind::Ultrix
    }
    pub fn is_mach(self) -> bool {
        matches!(
            self,
            OsKind::Mach3 | OsKind::Mach3AfsIn | OsKind::Mach3AfsOut
        )
    }
    pub fn cost_column(self) -> CostColumn {
        match self {
            OsKind::Ultrix => CostColumn::Ultrix,
            OsKind::Osf1 => CostColumn::Osf1,
            _ => CostColumn::Mach3,
        }
    }
}

/// One OS's model parameters. None of these numbers is in the paper; each default is a
/// round guess in the direction Table IV and §4.2 state, and every one is a spec key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OsParams {
    /// Kernel data pages a call may touch (mapped and unmapped together).
    pub kernel_data_pages: u64,
    /// Fraction of those pages that are mapped (Table IV "Mapped Kernel Data Structures":
    /// Ultrix few, OSF/1 many, Mach some).
    pub kernel_mapped_fraction: f64,
    /// Kernel data references per system call (file calls twice this).
    pub kernel_refs_per_call: u64,
    /// Kernel data references per page fault.
    pub kernel_refs_per_fault: u64,
    /// Kernel data references of one IPC message (Mach only).
    pub ipc_kernel_refs: u64,
    /// Unix-server references per call, and its text and data pages (Mach only).
    pub server_refs_per_call: u64,
    pub server_text_pages: u64,
    pub server_data_pages: u64,
    /// AFS cache-manager references per file call (AFSin: in the Unix server; AFSout: in
    /// the AFS task) and its data pages.
    pub afs_refs_per_file_call: u64,
    pub afs_data_pages: u64,
    /// X-server references per display call, and its pages.
    pub x_refs_per_display_call: u64,
    pub x_text_pages: u64,
    pub x_data_pages: u64,
    /// Server pages made copy-on-write per page of data passed by IPC (Mach's use of
    /// protection for copy-on-write sharing: its Modify misses, Table V).
    pub cow_pages_per_io_page: u64,
    /// Where these numbers come from.
    pub source: String,
}

impl OsParams {
    /// The defaults for `os` (mmulab guesses, stated as such).
    pub fn preset(os: OsKind) -> OsParams {
        let base = OsParams {
            kernel_data_pages: 96,
            kernel_mapped_fraction: 0.05,
            kernel_refs_per_call: 12,
            kernel_refs_per_fault: 6,
            ipc_kernel_refs: 0,
            server_refs_per_call: 0,
            server_text_pages: 24,
            server_data_pages: 48,
            afs_refs_per_file_call: 0,
            afs_data_pages: 16,
            x_refs_per_display_call: 40,
            x_text_pages: 16,
            x_data_pages: 32,
            cow_pages_per_io_page: 0,
            source: "mmulab guess in the direction of uhlig94 Table IV / §4.2".into(),
        };
        match os {
            OsKind::Ultrix => base,
            OsKind::Osf1 => OsParams {
                kernel_data_pages: 160,
                kernel_mapped_fraction: 0.9,
                ..base
            },
            OsKind::Mach3 | OsKind::Mach3AfsIn | OsKind::Mach3AfsOut => OsParams {
                kernel_data_pages: 120,
                kernel_mapped_fraction: 0.6,
                ipc_kernel_refs: 6,
                server_refs_per_call: 100,
                cow_pages_per_io_page: 1,
                afs_refs_per_file_call: if os == OsKind::Mach3 { 0 } else { 40 },
                ..base
            },
        }
    }

    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        let bad = |k: &str, why: &str| Err(format!("{prefix}.{k}: {why}"));
        if !(0.0..=1.0).contains(&self.kernel_mapped_fraction) {
            return bad("kernel_mapped_fraction", "must be between 0 and 1");
        }
        for (k, v) in [
            ("kernel_data_pages", self.kernel_data_pages),
            ("server_text_pages", self.server_text_pages),
            ("server_data_pages", self.server_data_pages),
            ("afs_data_pages", self.afs_data_pages),
            ("x_text_pages", self.x_text_pages),
            ("x_data_pages", self.x_data_pages),
        ] {
            if v == 0 || v > 1024 {
                return bad(k, "must be 1-1024 pages");
            }
        }
        Ok(())
    }
}

/// A reference that reaches the TLB: a user page (`L1U` key) or a mapped kernel page
/// (`L1K` key), with the page-state events it raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysRef {
    pub key: Key,
    /// [`INVALID`] and/or [`MODIFY`].
    pub flags: u8,
}

/// The first touch of a page: a page fault (an Invalid miss).
pub const INVALID: u8 = 1;
/// A store to a clean or copy-on-write page (a Modify miss).
pub const MODIFY: u8 = 2;

const UNTOUCHED: u8 = 0;
const CLEAN: u8 = 1;
const DIRTY: u8 = 2;

/// Builds the system-wide reference stream of one OS from an application's events.
pub struct OsModel {
    pub os: OsKind,
    pub p: OsParams,
    rng: SimRng,
    pages: HashMap<u64, u8, BuildHasherDefault<KeyHasher>>,
    out: Vec<SysRef>,
}

impl OsModel {
    pub fn new(os: OsKind, p: OsParams, seed: u64) -> OsModel {
        OsModel {
            os,
            p,
            rng: SimRng::new(seed, &format!("os/{}", os.key())),
            pages: HashMap::default(),
            out: Vec::new(),
        }
    }

    /// The system reference stream for `events`.
    pub fn expand(mut self, events: &[Event]) -> Vec<SysRef> {
        self.out.reserve(events.len() * 5 / 4);
        for e in events {
            match *e {
                Event::Ref { task, r } => self.user(task, r.vpn(), r.kind()),
                Event::Syscall { class, pages } => self.syscall(class, pages),
            }
        }
        self.out
    }

    fn user(&mut self, task: TaskId, vpn: u64, kind: AccessKind) {
        let key = Key::new(PteClass::L1U, task, vpn);
        let st = self.pages.entry(key.0).or_insert(UNTOUCHED);
        let mut flags = 0;
        match (*st, kind) {
            (UNTOUCHED, AccessKind::Store) => {
                // A fault on a store maps the page writable: no Modify after it.
                flags = INVALID;
                *st = DIRTY;
            }
            (UNTOUCHED, _) => {
                flags = INVALID;
                *st = CLEAN;
            }
            (CLEAN, AccessKind::Store) => {
                flags = MODIFY;
                *st = DIRTY;
            }
            _ => {}
        }
        self.out.push(SysRef { key, flags });
        if flags & INVALID != 0 && task != KERNEL_TASK {
            self.kernel_entry();
            self.kernel_data(self.p.kernel_refs_per_fault);
        }
    }

    /// The kernel's stack and u-area (fn. 7's two kernel L2 PTEs), touched on entry.
    fn kernel_entry(&mut self) {
        for v in KERNEL_ENTRY_VPNS {
            self.user(KERNEL_TASK, v, AccessKind::Store);
        }
    }

    /// `n` kernel data references, skewed towards the first (hottest) pages; pages
    /// below the unmapped share never reach the TLB.
    fn kernel_data(&mut self, n: u64) {
        let pool = self.p.kernel_data_pages;
        let unmapped = ((1.0 - self.p.kernel_mapped_fraction) * pool as f64).round() as u64;
        for _ in 0..n {
            let u = self.rng.unit();
            let idx = ((pool as f64) * u * u) as u64;
            if idx < unmapped {
                continue;
            }
            // Spread over two 4 MB regions of mapped kernel space (`layout.rs`).
            let kvpn = kernel_data_vpn(idx);
            self.out.push(SysRef {
                key: l1k(kvpn),
                flags: 0,
            });
        }
    }

    /// `n` references by a server task over its text, data and stack.
    fn server(&mut self, task: TaskId, n: u64, text: u64, data: u64, data_base: u64) {
        for i in 0..n {
            let (vpn, kind) = match i % 3 {
                0 => (LAYOUT.text_base + self.rng.below(text), AccessKind::Ifetch),
                1 => (
                    data_base + self.rng.below(data),
                    if self.rng.chance(0.3) {
                        AccessKind::Store
                    } else {
                        AccessKind::Load
                    },
                ),
                _ => (LAYOUT.stack_top - self.rng.below(2), AccessKind::Store),
            };
            self.user(task, vpn, kind);
        }
    }

    /// Pages passed by IPC become copy-on-write in the receiver: clean again.
    fn cow(&mut self, task: TaskId, pages: u64, data: u64) {
        for _ in 0..pages * self.p.cow_pages_per_io_page {
            let vpn = LAYOUT.data_base + self.rng.below(data);
            let key = Key::new(PteClass::L1U, task, vpn);
            if let Some(st) = self.pages.get_mut(&key.0)
                && *st == DIRTY
            {
                *st = CLEAN;
            }
        }
    }

    fn syscall(&mut self, class: SysClass, pages: u32) {
        let p = self.p.clone();
        self.kernel_entry();
        let file = class == SysClass::File;
        if class == SysClass::Ipc {
            self.kernel_data(p.ipc_kernel_refs.max(p.kernel_refs_per_call / 2));
            return;
        }
        if self.os.is_mach() {
            // A Unix call is a message to the Unix server and its reply (§4.2.2).
            self.kernel_data(2 * p.ipc_kernel_refs);
            let mut n = p.server_refs_per_call;
            if file && self.os == OsKind::Mach3AfsIn {
                n += p.afs_refs_per_file_call;
            }
            let data = p.server_data_pages
                + if self.os == OsKind::Mach3AfsIn {
                    p.afs_data_pages
                } else {
                    0
                };
            self.server(UNIX_SERVER, n, p.server_text_pages, data, LAYOUT.data_base);
            self.cow(UNIX_SERVER, pages as u64, data);
            if file && self.os == OsKind::Mach3AfsOut {
                // The cache manager is its own task: another round trip (§4.2.3).
                self.kernel_data(2 * p.ipc_kernel_refs);
                self.server(
                    AFS_TASK,
                    p.afs_refs_per_file_call,
                    p.server_text_pages / 2,
                    p.afs_data_pages,
                    LAYOUT.data_base,
                );
                self.cow(AFS_TASK, pages as u64, p.afs_data_pages);
            }
            self.kernel_data(p.kernel_refs_per_call / 2);
        } else {
            self.kernel_data(p.kernel_refs_per_call * if file { 2 } else { 1 });
        }
        if class == SysClass::Display {
            self.kernel_data(p.ipc_kernel_refs.max(2));
            self.server(
                X_SERVER,
                p.x_refs_per_display_call,
                p.x_text_pages,
                p.x_data_pages,
                LAYOUT.data_base,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    fn stream(os: OsKind) -> Vec<SysRef> {
        let mut w = Workload::named("t");
        w.refs = 50_000;
        w.file_fraction = 0.5;
        OsModel::new(os, OsParams::preset(os), 1).expand(&w.generate(1))
    }

    #[test]
    fn kernel_mapping_follows_table_iv() {
        let l1k = |os| {
            stream(os)
                .iter()
                .filter(|r| r.key.class() == PteClass::L1K)
                .count()
        };
        let (u, o, m) = (l1k(OsKind::Ultrix), l1k(OsKind::Osf1), l1k(OsKind::Mach3));
        assert!(u < m && m < o, "Ultrix {u} < Mach {m} < OSF/1 {o}");
    }

    #[test]
    fn mach_runs_a_unix_server_and_afsout_an_afs_task() {
        let tasks = |os| {
            let mut t: Vec<TaskId> = stream(os)
                .iter()
                .filter(|r| r.key.class() == PteClass::L1U)
                .map(|r| r.key.task())
                .collect();
            t.sort();
            t.dedup();
            t
        };
        assert_eq!(tasks(OsKind::Osf1), vec![0, 1]);
        assert_eq!(tasks(OsKind::Mach3), vec![0, 1, UNIX_SERVER]);
        assert_eq!(
            tasks(OsKind::Mach3AfsOut),
            vec![0, 1, UNIX_SERVER, AFS_TASK]
        );
    }

    #[test]
    fn each_page_faults_once() {
        let s = stream(OsKind::Mach3);
        let mut seen = std::collections::BTreeSet::new();
        for r in &s {
            if r.flags & INVALID != 0 {
                assert!(seen.insert(r.key), "{:?} faulted twice", r.key);
            }
        }
        assert!(!seen.is_empty());
        assert!(s.iter().any(|r| r.flags & MODIFY != 0));
    }
}
