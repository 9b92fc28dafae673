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

/// The user layout lives in [`crate::layout`] (MIPS text, data and stack segments).
pub use crate::layout::{LAYOUT, Layout};

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

/// First task number given to the second and later processes of a multi-process capture
/// (`make` running `gcc`, `sh` running `dd`): each process is its own task, as each would
/// be its own address space under any of the OS models.
pub const FIRST_CHILD_TASK: TaskId = 32;

/// Largest number of pages one file call is taken to move (its byte count, rounded up).
pub const MAX_IO_PAGES: u32 = 256;

/// How a Linux x86-64 system call is classed for the OS models: read, write, pread64,
/// pwrite64, readv, writev, sendfile → file; everything else → other (a trace does not say
/// which descriptors lead to a display). A file call moves the pages of its byte count
/// (the third argument of read, write, pread64 and pwrite64; one page otherwise), at least
/// one and at most [`MAX_IO_PAGES`].
pub fn classify_syscall(e: &mmulab_trace::SyscallEvent) -> (SysClass, u32) {
    match e.nr {
        0 | 1 | 17 | 18 => {
            let bytes = e.args.get(2).copied().unwrap_or(0);
            let pages = bytes.div_ceil(4096).clamp(1, MAX_IO_PAGES as u64) as u32;
            (SysClass::File, pages)
        }
        19 | 20 | 40 => (SysClass::File, 1),
        _ => (SysClass::Other, 0),
    }
}

/// Events from a captured trace (`mmulab-trace`): the references of one process, as task
/// `task`, with its system calls placed before the reference they preceded. One event per
/// call (its `Call` record; asynchronous completions and lone results are the same call
/// seen again), classed by [`classify_syscall`]. The OS model then turns each call into
/// the kernel's, the Unix server's (Mach 3.0: an IPC round trip) and the AFS task's
/// references ([`crate::os`]).
pub fn from_trace_task(
    refs: &[PageRef],
    syscalls: &[(u64, mmulab_trace::SyscallEvent)],
    task: TaskId,
) -> Vec<Event> {
    let mut out = Vec::with_capacity(refs.len() + syscalls.len());
    let mut next = syscalls.iter().peekable();
    let mut place_calls = |upto: u64, out: &mut Vec<Event>| {
        while let Some((at, e)) = next.peek() {
            if *at > upto {
                break;
            }
            if e.phase == mmulab_trace::SyscallPhase::Call {
                let (class, pages) = classify_syscall(e);
                out.push(Event::Syscall { class, pages });
            }
            next.next();
        }
    };
    for (i, r) in refs.iter().enumerate() {
        place_calls(i as u64, &mut out);
        out.push(Event::Ref { task, r: *r });
    }
    // Calls after the last reference (exit_group, ...).
    place_calls(u64::MAX, &mut out);
    out
}

/// [`from_trace_task`] for the application task.
pub fn from_trace(refs: &[PageRef], syscalls: &[(u64, mmulab_trace::SyscallEvent)]) -> Vec<Event> {
    from_trace_task(refs, syscalls, APP_TASK)
}

/// A lackey sink keeping 4 KB page references and every system call with the number of
/// references before it.
#[derive(Default)]
struct LackeyEvents {
    refs: Vec<PageRef>,
    syscalls: Vec<(u64, mmulab_trace::SyscallEvent)>,
}

impl mmulab_trace::LackeySink for LackeyEvents {
    fn access(&mut self, kind: mmulab_trace::LineKind, addr: u64, size: u64) {
        mmulab_trace::PageSplitter::split_into(&mut self.refs, 12, kind, addr, size);
    }
    fn syscall(&mut self, event: &mmulab_trace::SyscallEvent) {
        self.syscalls.push((self.refs.len() as u64, event.clone()));
    }
}

/// Loads a captured trace as events of task `task`: a binary trace (`mmulab trace
/// capture`) or a lackey log, each with its system calls. uhlig94 fixes 4 KB pages, so a
/// binary trace must have a 4 KB base page; lackey logs are split at 4 KB.
pub fn load_trace_task(
    path: &std::path::Path,
    task: TaskId,
) -> Result<Vec<Event>, mmulab_trace::TraceError> {
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
            Ok(from_trace_task(&t.refs, &t.syscalls, task))
        }
        TraceFormat::Lackey | TraceFormat::Dinero(_) => {
            let mut sink = LackeyEvents::default();
            mmulab_trace::lackey::decode_file(path, &mut sink, false)?;
            Ok(from_trace_task(&sink.refs, &sink.syscalls, task))
        }
    }
}

/// [`load_trace_task`] for the application task.
pub fn load_trace(path: &std::path::Path) -> Result<Vec<Event>, mmulab_trace::TraceError> {
    load_trace_task(path, APP_TASK)
}

/// What [`capture_events`] traced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedEvents {
    pub events: Vec<Event>,
    /// Processes traced (the command's own first).
    pub processes: usize,
    pub refs: u64,
    pub syscalls: u64,
}

/// Runs `cmd` under Valgrind lackey (`mmulab_trace::capture`) and returns the events of
/// every process it ran: the command's own process as [`APP_TASK`], then each child (by
/// pid) as its own task from [`FIRST_CHILD_TASK`], one after the other (separate logs
/// carry no common clock, so processes are not interleaved). The traces are written to
/// `trace_path` (and `trace_path.PID`) and left there.
pub fn capture_events(
    trace_path: &std::path::Path,
    cmd: &[String],
) -> Result<CapturedEvents, mmulab_trace::TraceError> {
    let summary = mmulab_trace::capture(trace_path, cmd)?;
    if summary.exit_code != Some(0) {
        return Err(mmulab_trace::TraceError::InvalidOptions(format!(
            "captured command {cmd:?} exited with {:?}",
            summary.exit_code
        )));
    }
    let mut events = Vec::new();
    for (i, p) in summary.processes.iter().enumerate() {
        let task = if i == 0 {
            APP_TASK
        } else {
            FIRST_CHILD_TASK + (i as TaskId - 1).min(crate::pagetable::MAX_TASK - FIRST_CHILD_TASK)
        };
        events.extend(load_trace_task(&p.trace, task)?);
    }
    let refs = events
        .iter()
        .filter(|e| matches!(e, Event::Ref { .. }))
        .count() as u64;
    Ok(CapturedEvents {
        processes: summary.processes.len(),
        syscalls: events.len() as u64 - refs,
        refs,
        events,
    })
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

    /// A lackey log as `mmulab trace capture` sees it: accesses, synchronous and
    /// asynchronous calls, a Valgrind message.
    fn lackey_log(with_calls: bool) -> String {
        let mut s = String::from("==77== Lackey\n");
        for round in 0..50u64 {
            s += &format!("I  {:08x},4\n", 0x400000 + (round % 3) * 0x1000);
            s += &format!(" L {:08x},8\n", 0x10000000 + (round % 5) * 0x1000);
            if with_calls {
                s += "SYSCALL[77,1](1) sys_write ( 1, 0x10000000, 10000 ) --> [async] ... \n";
                s += "SYSCALL[77,1](1) ... [async] --> Success(0x2710) \n";
                s += "SYSCALL[77,1](39) sys_getpid ( )[sync] --> Success(0x4d) \n";
            }
            s += &format!(" S {:08x},8\n", 0x7fff0000u64);
        }
        s
    }

    #[test]
    fn lackey_syscalls_become_events_with_their_byte_counts() {
        let path = std::env::temp_dir().join(format!("swtlb-lk-{}.log", std::process::id()));
        std::fs::write(&path, lackey_log(true)).unwrap();
        let ev = load_trace(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let calls: Vec<(SysClass, u32)> = ev
            .iter()
            .filter_map(|e| match e {
                Event::Syscall { class, pages } => Some((*class, *pages)),
                _ => None,
            })
            .collect();
        // One event per call (the async completion is not a second call); write's 10,000
        // bytes are three pages.
        assert_eq!(calls.len(), 100);
        assert_eq!(calls[0], (SysClass::File, 3));
        assert_eq!(calls[1], (SysClass::Other, 0));
        // Each call sits after the load that preceded it.
        let first = ev
            .iter()
            .position(|e| matches!(e, Event::Syscall { .. }))
            .unwrap();
        assert_eq!(first, 2);
    }

    #[test]
    fn trace_syscalls_drive_the_os_models() {
        use crate::os::{OsKind, OsModel, OsParams, UNIX_SERVER};
        use crate::sim::{TlbSetup, simulate_direct};
        use crate::{CostPreset, MissType};
        let load = |with_calls| {
            let path = std::env::temp_dir()
                .join(format!("swtlb-os-{}-{with_calls}.log", std::process::id()));
            std::fs::write(&path, lackey_log(with_calls)).unwrap();
            let ev = load_trace(&path).unwrap();
            std::fs::remove_file(&path).ok();
            ev
        };
        let (with, without) = (load(true), load(false));
        let server_refs = |os: OsKind, ev: &[Event]| {
            OsModel::new(os, OsParams::preset(os), 1)
                .expand(ev)
                .iter()
                .filter(|r| r.key.task() == UNIX_SERVER)
                .count()
        };
        // Mach 3.0: every call is an IPC round trip to the Unix server task (§4.2.2).
        assert!(server_refs(OsKind::Mach3, &with) >= 100 * 50);
        assert_eq!(server_refs(OsKind::Mach3, &without), 0);
        // A monolithic kernel has no server task.
        assert_eq!(server_refs(OsKind::Osf1, &with), 0);
        // The calls cost TLB time, more under Mach than under Ultrix.
        let secs = |os: OsKind, ev: &[Event]| {
            let s = OsModel::new(os, OsParams::preset(os), 1).expand(ev);
            let c = CostPreset::decstation3100_1994(os.cost_column());
            let o = &simulate_direct(&s, os, &[TlbSetup::default()], &c, 1).unwrap()[0];
            (o.seconds(&c), o.count(MissType::L2))
        };
        let (m_with, m_l2) = secs(OsKind::Mach3, &with);
        let (m_without, _) = secs(OsKind::Mach3, &without);
        let (u_with, _) = secs(OsKind::Ultrix, &with);
        assert!(m_with > 2.0 * m_without, "{m_with} vs {m_without}");
        assert!(m_with > u_with, "{m_with} vs {u_with}");
        // The Unix server's own L2 PTEs were needed.
        assert!(m_l2 >= 8, "{m_l2}");
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
