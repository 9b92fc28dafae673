//! What the application does: synthetic stand-ins for uhlig94's Table I benchmarks and the
//! Fig. 9 multiserver emulator, and an adapter from `mmulab-trace` page references.
//!
//! A workload is a stream of [`Event`]s: page references by user tasks and system calls by
//! the application. The OS model ([`crate::os`]) turns system calls into the references of
//! the kernel and of its server tasks.

use mmulab_engine::SimRng;
use mmulab_trace::{AccessKind, PageRef};
use serde::{Deserialize, Serialize};

use crate::pagetable::TaskId;

/// The application's task number; servers are numbered by [`crate::os`].
pub const APP_TASK: TaskId = 1;
/// First task of the Fig. 9 emulator's servers.
pub const FIRST_TOKEN_SERVER: TaskId = 16;

/// What a system call asks of the OS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SysClass {
    /// File I/O (read, write): the Unix server, and the AFS cache manager where there is one.
    File,
    /// Talking to the X server (display workloads).
    Display,
    /// Any other Unix call (the Unix server under Mach).
    Other,
    /// A bare IPC between two tasks through the kernel (Fig. 9's token).
    Ipc,
}

/// One step of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A page reference by a user task.
    Ref { task: TaskId, r: PageRef },
    /// A system call by the application, moving `pages` pages of data.
    Syscall { class: SysClass, pages: u32 },
}

/// A user task's address-space layout: text, data and stack in three 4 MB regions, so a
/// task needs three L2 PTEs (uhlig94 fn. 7).
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub text_base: u64,
    pub data_base: u64,
    pub stack_top: u64,
}

/// The layout every synthetic task uses (vpns; 4 KB pages): text at 4 MB, data at
/// 256 MB, stack below 2 GB.
pub const LAYOUT: Layout = Layout {
    text_base: 0x400,
    data_base: 0x10000,
    stack_top: 0x7ffff,
};

/// A synthetic application (a labelled stand-in for one of Table I's benchmarks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// The benchmark it stands in for.
    pub name: String,
    /// Application references (instruction, data and stack) before the OS adds its own.
    #[serde(default = "Workload::default_refs")]
    pub refs: u64,
    /// Hot text pages.
    #[serde(default = "Workload::default_text_pages")]
    pub text_pages: u64,
    /// Data working set, pages (a phase draws from a window of it).
    #[serde(default = "Workload::default_data_pages")]
    pub data_pages: u64,
    /// Pages of the data window of one phase; the window moves every `phase_refs`.
    #[serde(default = "Workload::default_window_pages")]
    pub window_pages: u64,
    #[serde(default = "Workload::default_phase_refs")]
    pub phase_refs: u64,
    /// Fraction of data references that are stores.
    #[serde(default = "Workload::default_store_fraction")]
    pub store_fraction: f64,
    /// Mean application references between system calls (0: none).
    #[serde(default = "Workload::default_syscall_every")]
    pub syscall_every: u64,
    /// Shares of file and display calls among system calls; the rest are `other`.
    #[serde(default)]
    pub file_fraction: f64,
    #[serde(default)]
    pub display_fraction: f64,
    /// Data pages moved per file or display call.
    #[serde(default = "Workload::default_io_pages")]
    pub io_pages: u32,
    /// If above 0, data references instead walk this many buffers in lock step (input,
    /// output, table: compress's shape), `stream_stride_pages` apart, advancing one page
    /// every `stream_refs_per_page` data references.
    #[serde(default)]
    pub streams: u64,
    #[serde(default = "Workload::default_stream_stride_pages")]
    pub stream_stride_pages: u64,
    #[serde(default = "Workload::default_stream_refs_per_page")]
    pub stream_refs_per_page: u64,
}

impl Workload {
    fn default_refs() -> u64 {
        400_000
    }
    fn default_text_pages() -> u64 {
        24
    }
    fn default_data_pages() -> u64 {
        200
    }
    fn default_window_pages() -> u64 {
        40
    }
    fn default_phase_refs() -> u64 {
        20_000
    }
    fn default_store_fraction() -> f64 {
        0.3
    }
    fn default_syscall_every() -> u64 {
        2_000
    }
    fn default_io_pages() -> u32 {
        2
    }
    fn default_stream_stride_pages() -> u64 {
        256
    }
    fn default_stream_refs_per_page() -> u64 {
        64
    }

    /// A workload with every default and the given name.
    pub fn named(name: &str) -> Workload {
        Workload {
            name: name.into(),
            refs: Self::default_refs(),
            text_pages: Self::default_text_pages(),
            data_pages: Self::default_data_pages(),
            window_pages: Self::default_window_pages(),
            phase_refs: Self::default_phase_refs(),
            store_fraction: Self::default_store_fraction(),
            syscall_every: Self::default_syscall_every(),
            file_fraction: 0.0,
            display_fraction: 0.0,
            io_pages: Self::default_io_pages(),
            streams: 0,
            stream_stride_pages: Self::default_stream_stride_pages(),
            stream_refs_per_page: Self::default_stream_refs_per_page(),
        }
    }

    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        let bad = |k: &str, why: &str| Err(format!("{prefix}.{k}: {why}"));
        if self.refs == 0 {
            return bad("refs", "must be at least 1");
        }
        if self.text_pages == 0 || self.text_pages > 1024 {
            return bad("text_pages", "must be 1-1024 (one 4 MB region)");
        }
        if self.data_pages == 0 || self.data_pages > 1024 {
            return bad("data_pages", "must be 1-1024 (one 4 MB region)");
        }
        if self.window_pages == 0 || self.window_pages > self.data_pages {
            return bad("window_pages", "must be 1..=data_pages");
        }
        if self.phase_refs == 0 {
            return bad("phase_refs", "must be at least 1");
        }
        for (k, v) in [
            ("store_fraction", self.store_fraction),
            ("file_fraction", self.file_fraction),
            ("display_fraction", self.display_fraction),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(k, "must be between 0 and 1");
            }
        }
        if self.streams > 0 {
            if self.stream_stride_pages == 0
                || self.streams * self.stream_stride_pages > self.data_pages
            {
                return bad(
                    "stream_stride_pages",
                    "streams x stride must be 1..=data_pages",
                );
            }
            if self.stream_refs_per_page == 0 {
                return bad("stream_refs_per_page", "must be at least 1");
            }
        }
        if self.file_fraction + self.display_fraction > 1.0 {
            return bad("display_fraction", "file + display fractions exceed 1");
        }
        Ok(())
    }

    /// The event stream for `seed`.
    pub fn generate(&self, seed: u64) -> Vec<Event> {
        let mut rng = SimRng::new(seed, &format!("workload/{}", self.name));
        let mut out = Vec::with_capacity(self.refs as usize + self.refs as usize / 100);
        let mut window = 0u64;
        let mut next_syscall = self.next_gap(&mut rng);
        for i in 0..self.refs {
            if i % self.phase_refs == 0 && i > 0 {
                window = rng.below(self.data_pages - self.window_pages + 1);
            }
            // Three references in four are instruction fetches (a loop over hot text,
            // skewed towards its first pages), the rest data or stack.
            let r = match i % 4 {
                0..=2 => {
                    let u = rng.unit();
                    let p = (self.text_pages as f64 * u * u) as u64;
                    PageRef::new(LAYOUT.text_base + p, AccessKind::Ifetch, false)
                }
                _ => {
                    let kind = if rng.chance(self.store_fraction) {
                        AccessKind::Store
                    } else {
                        AccessKind::Load
                    };
                    if rng.chance(0.15) {
                        PageRef::new(LAYOUT.stack_top - rng.below(2), kind, false)
                    } else if self.streams > 0 {
                        let d = i / 4;
                        let s = d % self.streams;
                        let pos = (d / self.streams / self.stream_refs_per_page)
                            % self.stream_stride_pages;
                        PageRef::new(
                            LAYOUT.data_base + s * self.stream_stride_pages + pos,
                            kind,
                            false,
                        )
                    } else {
                        let p = window + rng.below(self.window_pages);
                        PageRef::new(LAYOUT.data_base + p, kind, false)
                    }
                }
            };
            out.push(Event::Ref { task: APP_TASK, r });
            if self.syscall_every > 0 && i == next_syscall {
                let u = rng.unit();
                let class = if u < self.file_fraction {
                    SysClass::File
                } else if u < self.file_fraction + self.display_fraction {
                    SysClass::Display
                } else {
                    SysClass::Other
                };
                let pages = if class == SysClass::Other {
                    0
                } else {
                    self.io_pages
                };
                out.push(Event::Syscall { class, pages });
                next_syscall = i + self.next_gap(&mut rng);
            }
        }
        out
    }

    fn next_gap(&self, rng: &mut SimRng) -> u64 {
        if self.syscall_every == 0 {
            u64::MAX
        } else {
            1 + rng.below(2 * self.syscall_every)
        }
    }
}

/// uhlig94 Fig. 9's emulator: `servers` user tasks pass a token round-robin; the holder
/// touches `pages` data pages (plus its text and stack) and passes the token by IPC.
pub fn token_ring(servers: u16, pages: u64, rounds: u64, seed: u64) -> Vec<Event> {
    let mut rng = SimRng::new(seed, "workload/token-ring");
    let mut out = Vec::new();
    for _ in 0..rounds {
        for s in 0..servers {
            let task = FIRST_TOKEN_SERVER + s;
            for p in 0..pages {
                out.push(Event::Ref {
                    task,
                    r: PageRef::new(LAYOUT.text_base + rng.below(4), AccessKind::Ifetch, false),
                });
                out.push(Event::Ref {
                    task,
                    r: PageRef::new(LAYOUT.data_base + p, AccessKind::Load, false),
                });
            }
            out.push(Event::Ref {
                task,
                r: PageRef::new(LAYOUT.stack_top, AccessKind::Store, false),
            });
            out.push(Event::Syscall {
                class: SysClass::Ipc,
                pages: 0,
            });
        }
    }
    out
}

/// Events from a captured trace (`mmulab-trace`): the references of one process, with its
/// system calls placed before the reference they preceded. Calls are classed by Linux
/// x86-64 number: read, write, pread64, pwrite64, readv, writev → file; everything else →
/// other (a trace does not say which descriptors lead to a display).
pub fn from_trace(refs: &[PageRef], syscalls: &[(u64, mmulab_trace::SyscallEvent)]) -> Vec<Event> {
    let mut out = Vec::with_capacity(refs.len() + syscalls.len());
    let mut next = syscalls.iter().peekable();
    for (i, r) in refs.iter().enumerate() {
        while let Some((at, e)) = next.peek() {
            if *at > i as u64 {
                break;
            }
            // One event per call: its `Call` line (completions and lone results are the
            // same call seen again).
            if e.phase == mmulab_trace::SyscallPhase::Call {
                let class = match e.nr {
                    0 | 1 | 17 | 18 | 19 | 20 => SysClass::File,
                    _ => SysClass::Other,
                };
                out.push(Event::Syscall { class, pages: 1 });
            }
            next.next();
        }
        out.push(Event::Ref {
            task: APP_TASK,
            r: *r,
        });
    }
    out
}

/// Loads a captured trace as events: a binary trace (`mmulab trace capture`) with its
/// system calls, or a lackey log (references only). uhlig94 fixes 4 KB pages, so a binary
/// trace must have a 4 KB base page; lackey logs are split at 4 KB.
pub fn load_trace(path: &std::path::Path) -> Result<Vec<Event>, mmulab_trace::TraceError> {
    use mmulab_trace::source::{TraceFormat, detect_format};
    match detect_format(path)? {
        TraceFormat::Binary => {
            let t = mmulab_trace::binary::read_all(path, false)?;
            if t.header.page_shift != 12 {
                return Err(mmulab_trace::TraceError::InvalidOptions(format!(
                    "{}: base page of {} bytes; uhlig94's model needs 4096-byte pages",
                    path.display(),
                    1u64 << t.header.page_shift
                )));
            }
            Ok(from_trace(&t.refs, &t.syscalls))
        }
        TraceFormat::Lackey => {
            let (refs, _warnings) =
                mmulab_trace::load_refs(path, 4096, &mmulab_trace::ReadOptions::default())?;
            Ok(from_trace(&refs, &[]))
        }
    }
}

/// Runs `cmd` under Valgrind lackey (`mmulab_trace::capture`) and returns the events of
/// its first process. The trace is written to `trace_path` and left there.
pub fn capture_events(
    trace_path: &std::path::Path,
    cmd: &[String],
) -> Result<Vec<Event>, mmulab_trace::TraceError> {
    let summary = mmulab_trace::capture(trace_path, cmd)?;
    if summary.exit_code != Some(0) {
        return Err(mmulab_trace::TraceError::InvalidOptions(format!(
            "captured command {cmd:?} exited with {:?}",
            summary.exit_code
        )));
    }
    load_trace(trace_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_traces_become_events_with_their_syscalls() {
        use mmulab_trace::binary::BinaryWriter;
        use mmulab_trace::{SyscallEvent, SyscallPhase};
        let path = std::env::temp_dir().join(format!("swtlb-{}.mmutrace", std::process::id()));
        let mut w = BinaryWriter::create(&path, 12, 7).unwrap();
        w.push_ref(PageRef::new(0x400, AccessKind::Ifetch, false))
            .unwrap();
        let call = |nr| SyscallEvent {
            pid: 7,
            tid: 7,
            nr,
            phase: SyscallPhase::Call,
            args: vec![],
            result: None,
        };
        w.push_syscall(&call(0)).unwrap();
        w.push_ref(PageRef::new(0x10000, AccessKind::Store, false))
            .unwrap();
        w.push_syscall(&call(39)).unwrap();
        w.push_ref(PageRef::new(0x10001, AccessKind::Load, false))
            .unwrap();
        w.finish().unwrap();
        let ev = load_trace(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let shape: Vec<String> = ev
            .iter()
            .map(|e| match e {
                Event::Ref { r, .. } => format!("{:#x}", r.vpn()),
                Event::Syscall { class, .. } => format!("{class:?}"),
            })
            .collect();
        assert_eq!(shape, ["0x400", "File", "0x10000", "Other", "0x10001"]);
    }

    #[test]
    fn generation_is_deterministic_and_has_syscalls() {
        let mut w = Workload::named("t");
        w.refs = 20_000;
        w.file_fraction = 0.5;
        let a = w.generate(3);
        assert_eq!(a, w.generate(3));
        assert_ne!(a, w.generate(4));
        let calls = a
            .iter()
            .filter(|e| matches!(e, Event::Syscall { .. }))
            .count();
        assert!((5..=20).contains(&calls), "{calls} calls");
    }

    #[test]
    fn bad_workload_names_the_key() {
        let mut w = Workload::named("t");
        w.window_pages = 10_000;
        let e = w.validate("workloads.compress").unwrap_err();
        assert!(e.starts_with("workloads.compress.window_pages"), "{e}");
    }
}
