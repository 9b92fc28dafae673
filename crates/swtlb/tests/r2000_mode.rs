//! `mmulab trace sim --r2000` (uhlig94 §3.2, §4.1): the trap-driven R2000 run over a
//! trace with system calls, checked against an independent small model of the R2000
//! written here from the hardware description (linear search over 64 slots, the Random
//! register computed from the clock, wired FIFO, ASID list), on a generated binary trace.

use mmulab_swtlb::costs::{CostPreset, MissType};
use mmulab_swtlb::os::{INVALID, MODIFY, OsKind, OsModel, OsParams, SysRef};
use mmulab_swtlb::r2000::{R2000Config, simulate_r2000, simulate_trace};
use mmulab_swtlb::workload::load_trace;
use mmulab_swtlb::{PteClass, Workload};
use mmulab_trace::binary::BinaryWriter;
use mmulab_trace::{AccessKind, PageRef, SyscallEvent, SyscallPhase};

/// (level 0 = user/kernel page, 2 = L2 PTE, 3 = L3 PTE; kernel data flag; task; page)
type Tag = (u8, bool, u16, u64);

struct Small {
    slots: Vec<Option<Tag>>,
    wired: usize,
    next_wired: usize,
    clock: u64,
    asids: usize,
    live: Vec<u16>,
    flushes: u64,
    three: bool,
    cost: [f64; 6],
    counts: [u64; 6],
    cycles: [f64; 6],
}

impl Small {
    fn find(&self, t: Tag) -> bool {
        self.slots.contains(&Some(t))
    }
    fn put(&mut self, t: Tag, wired: bool) {
        let i = if wired {
            let i = self.next_wired;
            self.next_wired = (i + 1) % self.wired;
            i
        } else {
            // Random: 63 at reset, down one per cycle, never below the wired slots.
            let n = self.slots.len() as u64;
            (n - 1 - self.clock % (n - self.wired as u64)) as usize
        };
        self.slots[i] = Some(t);
    }
    fn take(&mut self, ty: usize) {
        self.counts[ty] += 1;
        self.cycles[ty] += self.cost[ty];
        self.clock += self.cost[ty].round() as u64;
    }
    fn step(&mut self, r: SysRef) {
        self.clock += 1;
        let (task, page) = (r.key.task(), r.key.page());
        if task != 0 && !self.live.contains(&task) {
            if self.live.len() == self.asids {
                for s in self.slots.iter_mut() {
                    if matches!(s, Some(t) if t.2 != 0) {
                        *s = None;
                    }
                }
                self.live.clear();
                self.flushes += 1;
            }
            self.live.push(task);
        }
        let kernel_data = r.key.class() == PteClass::L1K;
        let me: Tag = (0, kernel_data, task, page);
        if !self.find(me) {
            let ty = if r.flags & INVALID != 0 {
                5
            } else if kernel_data {
                1
            } else {
                0
            };
            self.take(ty);
            if kernel_data {
                // The L1K PTE sits in an L2-table page: 1,024 PTEs per page.
                let l3: Tag = (3, true, 0, page / 1024);
                if self.three && !self.find(l3) {
                    self.take(3);
                    self.put(l3, false);
                }
            } else {
                let l2: Tag = (2, false, task, page / 1024);
                if !self.find(l2) {
                    self.take(2);
                    let l3: Tag = (3, false, task, page / 1024 / 1024);
                    if self.three && !self.find(l3) {
                        self.take(3);
                        self.put(l3, false);
                    }
                    self.put(l2, true);
                }
            }
            self.put(me, false);
        }
        if r.flags & MODIFY != 0 {
            self.take(4);
        }
    }
}

fn small_model(stream: &[SysRef], os: OsKind, asids: usize) -> ([u64; 6], [f64; 6], u64) {
    let c = CostPreset::decstation3100_1994(os.cost_column());
    let mut m = Small {
        slots: vec![None; 64],
        wired: 8,
        next_wired: 0,
        clock: 0,
        asids,
        live: Vec::new(),
        flushes: 0,
        three: os != OsKind::Ultrix,
        cost: MissType::ALL.map(|t| c.cycles_of(t)),
        counts: [0; 6],
        cycles: [0.0; 6],
    };
    for r in stream {
        m.step(*r);
    }
    (m.counts, m.cycles, m.flushes)
}

/// A generated trace: text, a data set spread over eleven 4 MB regions (more L2 PTEs than
/// the 8 wired slots hold), a stack, and read / write / getpid calls.
fn write_trace(path: &std::path::Path) {
    let mut w = BinaryWriter::create(path, 12, 42).unwrap();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..120_000u64 {
        let r = next();
        let (vpn, kind) = match i % 4 {
            0 | 1 => (0x400 + r % 40, AccessKind::Ifetch),
            2 => {
                let region = (r >> 8) % 11;
                let kind = if r % 3 == 0 {
                    AccessKind::Store
                } else {
                    AccessKind::Load
                };
                (0x10000 + region * 1024 + (r >> 16) % 30, kind)
            }
            _ => (0x7ffff - r % 3, AccessKind::Store),
        };
        w.push_ref(PageRef::new(vpn, kind, false)).unwrap();
        if r % 500 == 0 {
            let nr = [0u32, 1, 39][(r >> 20) as usize % 3];
            w.push_syscall(&SyscallEvent {
                pid: 42,
                tid: 42,
                nr,
                phase: SyscallPhase::Call,
                args: vec![3, 0x1000_0000, 8192],
                result: None,
            })
            .unwrap();
        }
    }
    w.finish().unwrap();
}

#[test]
fn r2000_mode_counts_match_an_independent_model_on_a_generated_trace() {
    let path = std::env::temp_dir().join(format!("swtlb-r2000-{}.mmutrace", std::process::id()));
    write_trace(&path);
    let events = load_trace(&path).unwrap();
    for os in OsKind::ALL {
        let got = simulate_trace(&path, os, &R2000Config::default(), 1).unwrap();
        let stream = OsModel::new(os, OsParams::preset(os), 1).expand(&events);
        let (counts, cycles, flushes) = small_model(&stream, os, 64);
        assert_eq!(got.counts, counts, "{os:?}");
        assert_eq!(got.cycles, cycles, "{os:?}");
        assert_eq!(got.asid_flushes, flushes);
        assert!(
            got.count(MissType::L2) > 100,
            "{os:?}: 11 data regions thrash 8 wired slots"
        );
        assert!(got.count(MissType::L1U) > 0 && got.count(MissType::Invalid) > 0);
        assert_eq!(got.count(MissType::L3) == 0, os == OsKind::Ultrix, "{os:?}");
        if os.is_mach() {
            assert!(got.count(MissType::Modify) > 0 && got.count(MissType::L1K) > 0);
        }
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn asids_that_run_out_flush_and_both_models_agree() {
    let mut w = Workload::named("asid");
    w.refs = 40_000;
    w.syscall_every = 200;
    w.file_fraction = 0.5;
    let os = OsKind::Mach3AfsOut;
    let stream = OsModel::new(os, OsParams::preset(os), 3).expand(&w.generate(3));
    let c = CostPreset::decstation3100_1994(os.cost_column());
    for asids in [1usize, 2, 64] {
        let cfg = R2000Config {
            asids: asids as u32,
            ..R2000Config::default()
        };
        let got = simulate_r2000(&stream, os, &c, &cfg).unwrap();
        let (counts, _, flushes) = small_model(&stream, os, asids);
        assert_eq!(
            (got.counts, got.asid_flushes),
            (counts, flushes),
            "{asids} ASIDs"
        );
        assert_eq!(
            flushes > 0,
            asids < 3,
            "application, Unix server and AFS task: 3 ASIDs"
        );
    }
    // Fewer ASIDs, more flushes, more misses.
    let few = simulate_r2000(
        &stream,
        os,
        &c,
        &R2000Config {
            asids: 1,
            ..R2000Config::default()
        },
    )
    .unwrap();
    let all = simulate_r2000(&stream, os, &c, &R2000Config::default()).unwrap();
    assert!(few.count(MissType::L1U) > all.count(MissType::L1U));
}

#[test]
fn random_register_is_not_a_uniform_draw() {
    // The same stream with one more cycle per reference lands fills in other slots:
    // the Random register follows the clock, so the miss counts move.
    let mut w = Workload::named("clock");
    w.refs = 60_000;
    let os = OsKind::Osf1;
    let stream = OsModel::new(os, OsParams::preset(os), 1).expand(&w.generate(1));
    let c = CostPreset::decstation3100_1994(os.cost_column());
    let a = simulate_r2000(&stream, os, &c, &R2000Config::default()).unwrap();
    let b = simulate_r2000(
        &stream,
        os,
        &c,
        &R2000Config {
            cycles_per_ref: 2,
            ..R2000Config::default()
        },
    )
    .unwrap();
    assert_eq!(
        a,
        simulate_r2000(&stream, os, &c, &R2000Config::default()).unwrap()
    );
    assert_ne!(a.counts, b.counts);
}
