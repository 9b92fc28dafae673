//! The simulated driver: VAX/Locus sites running the sans-IO core, with a
//! scheduler (quantum, yield, busy-waiting that burns the quantum), an
//! interrupt level that preempts processes, per-site server processes, and
//! per-message costs. All costs come from a [`Preset`]; every result
//! (Table 3's total, cycles per second, Figs. 7 and 8) emerges from them.
//!
//! Work placement (from the paper's text):
//! - interrupt level, preempting processes: a fault (2.5 ms with a remote
//!   library, 1.5 ms with a local one, §7.2), short-message output and
//!   input (Table 3), page input (Table 3), and the 1.5 ms input interrupt
//!   that invalidates, downgrades or upgrades (§7.2);
//! - the site's server process, which must be scheduled like any process
//!   (a busy-waiting user process delays it to the end of its quantum):
//!   the library's request processing (1.5 + 2 ms, Table 3), page output
//!   (7.5 ms; Table 3's footnote: server processes copy the page), and the
//!   library's retry after a refusal (§6.1).

pub mod preset;
pub mod workload;

use crate::core::*;
use crate::oracle::DsmOracle;
use mmulab_engine::{Counters, Cycles, EventQueue};
pub use preset::Preset;
use std::collections::VecDeque;
use workload::Program;

pub type Pid = usize;

/// Events one run may take before it is declared stuck.
pub const EVENT_BOUND: u64 = 20_000_000;

/// One message on the wire, for the timeline (§7.2, Fig. 6).
#[derive(Clone, Debug, PartialEq)]
pub struct WireRecord {
    pub sent_ns: u64,
    pub arrived_ns: u64,
    pub from: SiteId,
    pub to: SiteId,
    pub kind: &'static str,
    pub page: bool,
}

#[derive(Clone, Debug)]
enum Ev {
    IntrDone { site: usize, work: IntrWork },
    ProcJobDone { site: usize, epoch: u64 },
    QuantumEnd { site: usize, epoch: u64 },
    Timer { site: usize, timer: Timer },
    Start { pid: Pid },
}

#[derive(Clone, Debug)]
enum IntrWork {
    /// A message's input reception (and its input interrupt) is done.
    Deliver {
        from: SiteId,
        msg: Msg,
    },
    /// A short message's output is done: it is on the wire.
    Output {
        to: SiteId,
        msg: Msg,
        sent_ns: u64,
    },
    /// A fault's handling is done: hand it to the core.
    Fault {
        pid: Pid,
        page: PageNo,
        access: Access,
    },
    /// A request's input reception is done: the library's server process
    /// takes it (Table 3).
    ToServer {
        from: SiteId,
        msg: Msg,
    },
    Timer(Timer),
}

#[derive(Clone, Debug)]
enum ServerJob {
    Request { from: SiteId, msg: Msg },
    SendPage { to: SiteId, msg: Msg },
}

#[derive(Clone, Debug, PartialEq)]
enum PState {
    Runnable,
    Running,
    /// Asleep on a fault (as on I/O, §6.1).
    Blocked,
    /// A busy-waiting or yield-polling user process: it holds the CPU
    /// until something it could see changes (its copy is revoked), its
    /// quantum ends with others runnable (busy) or anyone is runnable (yield).
    Polling {
        yields: bool,
    },
    /// Server process with nothing to do.
    Idle,
    Done,
}

struct SimProc {
    site: usize,
    pid_core: ProcessId,
    program: Option<Program>,
    state: PState,
    jobs: VecDeque<ServerJob>,
    /// Server process: the running job is a server job (not the switch).
    in_job: bool,
    /// User process: a compute chunk runs (iterations of §8's loop).
    computing: Option<workload::Chunk>,
}

struct Cpu {
    intr_free_at: u64,
    run_queue: VecDeque<Pid>,
    current: Option<Pid>,
    /// The current process-level job: its end time and a generation that
    /// invalidates stale completion events.
    job_end: Option<u64>,
    job_started: u64,
    stolen_ns: u64,
    epoch: u64,
    quantum_end: u64,
    server: Pid,
    busy_ns: u64,
}

pub struct Sim {
    pub preset: Preset,
    queue: EventQueue<Ev>,
    sites: Vec<Site>,
    cpus: Vec<Cpu>,
    procs: Vec<SimProc>,
    pub segment: Option<SegmentId>,
    segment_pages: u32,
    pub oracle: DsmOracle,
    pub counters: Counters,
    pub wire: Vec<WireRecord>,
    /// Completed fault latencies (fault to wake), ns, for Table 3.
    pub fault_latencies_ns: Vec<u64>,
    fault_started: Vec<Option<u64>>,
    /// CPU busy time of every site at each wake (Table 3's breakdown).
    pub busy_at_wake_ns: Vec<Vec<u64>>,
    /// Per-process marks (e.g. cycle completions), ns.
    pub marks: Vec<Vec<u64>>,
    /// Counters at each mark of the first process (per-cycle counts).
    pub mark_counters: Vec<Counters>,
    /// A timeline of protocol events, when enabled: (ns, site, text).
    pub trace: Option<Vec<(u64, usize, String)>>,
}

impl Sim {
    /// `sites` sites; the segment is created by site `library` with
    /// `pages` pages and Δ = `window_ticks`.
    pub fn new(preset: Preset, sites: usize, config: CoreConfig) -> Sim {
        let peers: Vec<SiteId> = (0..sites as u16).map(SiteId).collect();
        let mut sim = Sim {
            queue: EventQueue::new(),
            sites: peers
                .iter()
                .map(|&id| Site::new(id, peers.clone(), config.clone()))
                .collect(),
            cpus: Vec::new(),
            procs: Vec::new(),
            segment: None,
            segment_pages: 0,
            oracle: DsmOracle::new(),
            counters: Counters::default(),
            wire: Vec::new(),
            fault_latencies_ns: Vec::new(),
            fault_started: Vec::new(),
            busy_at_wake_ns: Vec::new(),
            marks: Vec::new(),
            mark_counters: Vec::new(),
            trace: None,
            preset,
        };
        for s in 0..sites {
            let server = sim.add_proc(s, None, PState::Idle);
            sim.cpus.push(Cpu {
                intr_free_at: 0,
                run_queue: VecDeque::new(),
                current: None,
                job_end: None,
                job_started: 0,
                stolen_ns: 0,
                epoch: 0,
                quantum_end: 0,
                server,
                busy_ns: 0,
            });
        }
        sim
    }

    /// The core configuration the preset implies.
    pub fn core_config(preset: &Preset) -> CoreConfig {
        CoreConfig {
            tick_ns: preset.tick_ns,
            honour_within_ns: preset
                .honour_within_round_trip
                .then_some(preset.round_trip_ns),
            ..CoreConfig::default()
        }
    }

    fn add_proc(&mut self, site: usize, program: Option<Program>, state: PState) -> Pid {
        let pid = self.procs.len();
        self.procs.push(SimProc {
            site,
            pid_core: ProcessId(pid as u32),
            program,
            state,
            jobs: VecDeque::new(),
            in_job: false,
            computing: None,
        });
        self.fault_started.push(None);
        self.marks.push(Vec::new());
        pid
    }

    /// Creates the segment at `library` (setup: takes no simulated time)
    /// and attaches it at every site that will run a program.
    pub fn create_segment(
        &mut self,
        library: usize,
        pages: u32,
        window_ticks: u32,
        attach_sites: &[usize],
    ) {
        let geometry = Geometry {
            name: "shm".into(),
            pages,
            page_bytes: self.preset.page_bytes,
            window_ticks,
        };
        let actions = self.sites[library].handle(
            Nanos(0),
            Event::Create {
                geometry,
                process: ProcessId(u32::MAX),
            },
        );
        for a in actions {
            if let Action::Created { segment, .. } = a {
                self.segment = Some(segment);
            }
        }
        self.segment_pages = pages;
        let segment = self.segment.expect("created");
        // Attaching is setup, done before time starts: messages are handed
        // over directly, without costs.
        for &s in attach_sites {
            let mut inbox: VecDeque<(usize, SiteId, Msg)> = VecDeque::new();
            let acts = self.sites[s].handle(
                Nanos(0),
                Event::Attach {
                    segment,
                    process: site_process(s),
                },
            );
            push_sends(&mut inbox, s, acts);
            while let Some((to, from, msg)) = inbox.pop_front() {
                let acts = self.sites[to].handle(Nanos(0), Event::Received { from, msg });
                push_sends(&mut inbox, to, acts);
            }
        }
    }

    /// Adds a user process running `program` at `site`, runnable at `start_ns`.
    pub fn spawn(&mut self, site: usize, program: Program, start_ns: u64) -> Pid {
        let pid = self.add_proc(site, Some(program), PState::Blocked);
        let segment = self.segment.expect("segment before processes");
        // The process attaches (setup, as above: the site is attached).
        let acts = self.sites[site].handle(
            Nanos(0),
            Event::Attach {
                segment,
                process: ProcessId(pid as u32),
            },
        );
        debug_assert!(
            acts.iter().all(|a| matches!(a, Action::Attached { .. })),
            "site attached before spawn"
        );
        self.queue.push(Cycles(start_ns), Ev::Start { pid });
        pid
    }

    pub fn now_ns(&self) -> u64 {
        self.queue.now().0
    }

    /// Runs until every user process is done or `limit_ns` passes. A run
    /// that exceeds [`EVENT_BOUND`] events is a liveness failure: it stops
    /// and says so (never a hang).
    pub fn run(&mut self, limit_ns: u64) -> Result<(), String> {
        let start = self.queue.scheduled();
        while let Some(t) = self.queue.peek_time() {
            if t.0 > limit_ns || self.all_done() {
                break;
            }
            if self.queue.scheduled() - start > EVENT_BOUND {
                return Err(format!(
                    "liveness bound of {EVENT_BOUND} events passed at {} ns",
                    t.0
                ));
            }
            let (_, ev) = self.queue.pop().expect("peeked");
            match ev {
                Ev::IntrDone { site, work } => self.intr_done(site, work),
                Ev::ProcJobDone { site, epoch } => self.job_done(site, epoch),
                Ev::QuantumEnd { site, epoch } => self.quantum_end(site, epoch),
                Ev::Timer { site, timer } => self.timer(site, timer),
                Ev::Start { pid } => self.make_runnable(pid),
            }
        }
        Ok(())
    }

    fn all_done(&self) -> bool {
        self.procs
            .iter()
            .all(|p| p.program.is_none() || p.state == PState::Done)
    }

    pub fn cpu_busy_ns(&self, site: usize) -> u64 {
        self.cpus[site].busy_ns
    }

    // ----- interrupt level -------------------------------------------------

    /// Queues interrupt-level work; it preempts (delays) the process level.
    fn intr(&mut self, site: usize, cost: u64, work: IntrWork) {
        let now = self.now_ns();
        let cpu = &mut self.cpus[site];
        let start = cpu.intr_free_at.max(now);
        let end = start + cost;
        cpu.intr_free_at = end;
        cpu.busy_ns += cost;
        if let Some(job_end) = cpu.job_end
            && cost > 0
        {
            // The running process is frozen while the interrupt runs.
            cpu.job_end = Some(job_end + cost);
            cpu.stolen_ns += cost;
            cpu.epoch += 1;
            let epoch = cpu.epoch;
            self.queue
                .push(Cycles(job_end + cost), Ev::ProcJobDone { site, epoch });
        }
        self.queue.push(Cycles(end), Ev::IntrDone { site, work });
    }

    fn intr_done(&mut self, site: usize, work: IntrWork) {
        match work {
            IntrWork::Deliver { from, msg } => self.core(site, Event::Received { from, msg }),
            IntrWork::Output { to, msg, sent_ns } => self.arrive(site, to, msg, sent_ns),
            IntrWork::Fault { pid, page, access } => {
                let (segment, process) = (self.segment.expect("segment"), self.procs[pid].pid_core);
                self.core(
                    site,
                    Event::Fault {
                        segment,
                        page,
                        process,
                        access,
                    },
                );
            }
            IntrWork::ToServer { from, msg } => {
                self.server_job(site, ServerJob::Request { from, msg })
            }
            IntrWork::Timer(timer) => self.core(site, Event::TimerFired(timer)),
        }
    }

    /// A message reaches its receiver: input reception, then either an
    /// input interrupt or the server process (a request at the library).
    fn arrive(&mut self, from_site: usize, to: SiteId, msg: Msg, sent_ns: u64) {
        let p = &self.preset;
        let from = SiteId(from_site as u16);
        let input = if msg.carries_page() {
            p.page_input_ns * self.transfers()
        } else {
            p.short_input_ns
        };
        let now = self.now_ns();
        let kind = msg.kind();
        self.note(from_site, || format!("send {kind} -> site {}", to.0));
        self.wire.push(WireRecord {
            sent_ns,
            arrived_ns: now + input,
            from,
            to,
            kind: msg.kind(),
            page: msg.carries_page(),
        });
        let advisory = matches!(
            msg,
            Msg::Recall { .. } | Msg::Invalidate { .. } | Msg::Upgrade { .. }
        );
        if advisory || msg.carries_page() {
            self.counters.add("input_interrupts", 1);
        }
        let site = to.0 as usize;
        if let Msg::Request { .. } = msg {
            self.counters.add("requests_received_by_library", 1);
            self.intr(site, input, IntrWork::ToServer { from, msg });
            return;
        }
        let cost = input
            + if advisory {
                self.preset.input_interrupt_ns
            } else {
                0
            };
        self.intr(site, cost, IntrWork::Deliver { from, msg });
    }

    fn transfers(&self) -> u64 {
        (self.preset.page_bytes as u64)
            .div_ceil(self.preset.transfer_bytes as u64)
            .max(1)
    }

    fn timer(&mut self, site: usize, timer: Timer) {
        match timer {
            // The library's sleep ends in a clock-interrupt callout (Unix
            // timeout()), so its retry is not delayed by a busy process.
            Timer::RetryRecall { .. } => self.intr(site, 0, IntrWork::Timer(timer)),
            Timer::HonourRecall { .. } => self.intr(site, 0, IntrWork::Timer(timer)),
        }
    }

    // ----- the core and its actions ---------------------------------------

    fn core(&mut self, site: usize, event: Event) {
        let now = Nanos(self.now_ns());
        let actions = self.sites[site].handle(now, event);
        for a in actions {
            self.carry_out(site, a);
        }
        if let Some(seg) = self.segment {
            self.oracle
                .check_swmr(&self.sites, seg, self.segment_pages, now);
            assert!(self.oracle.ok(), "oracle: {:?}", self.oracle.violations);
        }
    }

    /// An exiting process detaches; with the site's last process goes the
    /// site's own attachment (made by [`Sim::create_segment`]), so the
    /// site releases its copies.
    pub(crate) fn detach_process(&mut self, pid: Pid, segment: SegmentId) {
        let site = self.procs[pid].site;
        let process = self.procs[pid].pid_core;
        self.core(site, Event::Detach { segment, process });
        let last_here = self
            .procs
            .iter()
            .all(|p| p.site != site || p.program.is_none() || p.state == PState::Done);
        if last_here {
            self.note(site, || "detach (last process exited)".into());
            let process = site_process(site);
            self.core(site, Event::Detach { segment, process });
        }
    }

    pub(crate) fn note(&mut self, site: usize, text: impl FnOnce() -> String) {
        let now = self.now_ns();
        if let Some(t) = self.trace.as_mut() {
            t.push((now, site, text()));
        }
    }

    fn carry_out(&mut self, site: usize, action: Action) {
        let now = self.now_ns();
        match &action {
            Action::Install { access, bytes, .. } => {
                let what = if bytes.is_some() {
                    "install"
                } else {
                    "upgrade in place"
                };
                self.note(site, || format!("{what} {access:?}"));
            }
            Action::Invalidate { .. } => self.note(site, || "invalidate".into()),
            Action::Downgrade { .. } => self.note(site, || "downgrade to read".into()),
            Action::SetTimer { at, .. } => self.note(site, || {
                format!("library sleeps until {:.1} ms", at.0 as f64 / 1e6)
            }),
            _ => {}
        }
        match action {
            Action::Send { to, msg } => self.send(site, to, msg),
            Action::SetTimer { at, timer } => {
                if let Timer::RetryRecall { .. } = timer {
                    // §7.3 counts these: the library sleeps out a refused
                    // invalidation ("2.75 sleeps of 33 msecs" per cycle).
                    self.counters.add("delta_sleeps", 1);
                    self.counters
                        .add("delta_sleep_us", at.0.saturating_sub(now) / 1_000);
                }
                self.queue
                    .push(Cycles(at.0.max(now)), Ev::Timer { site, timer })
            }
            Action::Wake { process, .. } => self.wake(process.0 as Pid),
            Action::Invalidate { page, .. }
            | Action::Downgrade { page, .. }
            | Action::Install { page, .. } => self.page_changed(site, page),
            Action::Log(_) => self.counters.add("logged_requests", 1),
            // The simulated sites are honest and never die: any of these
            // is a protocol bug.
            Action::PeerError { site: from, reason } => {
                panic!("simulated site {site}: peer error from {from:?}: {reason}")
            }
            Action::Fail { process, page, .. } => {
                panic!("simulated site {site}: {process:?} failed on {page:?}")
            }
            _ => {}
        }
    }

    fn send(&mut self, site: usize, to: SiteId, msg: Msg) {
        let now = self.now_ns();
        if msg.carries_page() {
            self.counters.add("messages_page", 1);
            self.server_job(site, ServerJob::SendPage { to, msg });
        } else {
            self.counters.add("messages_short", 1);
            let cost = self.preset.short_output_ns;
            self.intr(
                site,
                cost,
                IntrWork::Output {
                    to,
                    msg,
                    sent_ns: now,
                },
            );
        }
    }

    // ----- process level ---------------------------------------------------

    fn server_job(&mut self, site: usize, job: ServerJob) {
        let server = self.cpus[site].server;
        self.procs[server].jobs.push_back(job);
        if self.procs[server].state == PState::Idle {
            self.procs[server].state = PState::Runnable;
            self.make_runnable(server);
        }
    }

    fn make_runnable(&mut self, pid: Pid) {
        let site = self.procs[pid].site;
        self.procs[pid].state = PState::Runnable;
        self.cpus[site].run_queue.push_back(pid);
        match self.cpus[site].current {
            None => self.dispatch(site),
            Some(cur) => {
                // A yield-polling process gives the CPU up at once (§7.2's
                // yield()); a busy-waiting one keeps it to its quantum's end.
                if self.procs[cur].state == (PState::Polling { yields: true }) {
                    self.switch_out(site, cur);
                }
            }
        }
    }

    /// The current process leaves the CPU (still runnable) and the next runs.
    fn switch_out(&mut self, site: usize, cur: Pid) {
        self.cpus[site].current = None;
        self.cpus[site].job_end = None;
        self.procs[cur].state = PState::Runnable;
        self.cpus[site].run_queue.push_back(cur);
        self.dispatch(site);
    }

    fn dispatch(&mut self, site: usize) {
        let Some(pid) = self.cpus[site].run_queue.pop_front() else {
            return;
        };
        let now = self.now_ns().max(self.cpus[site].intr_free_at);
        let shared = self.procs[pid].program.is_some();
        let p = &self.preset;
        // §6.2: every time a shared-memory process is scheduled, the system
        // remaps all its shared pages.
        // The kernel's server process switch is inside Table 3's measured
        // 1.5 ms server time; a user process pays the switch and the remap.
        let switch = if shared {
            p.context_switch_ns + p.remap_per_page_ns * self.segment_pages as u64
        } else {
            0
        };
        let cpu = &mut self.cpus[site];
        cpu.current = Some(pid);
        cpu.quantum_end = now + switch + self.preset.quantum_ns();
        self.procs[pid].state = PState::Running;
        self.start_job(site, now, switch);
        self.counters.add("context_switches", 1);
        let epoch = self.cpus[site].epoch;
        let q = self.cpus[site].quantum_end;
        self.queue.push(Cycles(q), Ev::QuantumEnd { site, epoch });
    }

    fn start_job(&mut self, site: usize, from: u64, duration: u64) {
        let cpu = &mut self.cpus[site];
        cpu.epoch += 1;
        cpu.job_started = from;
        cpu.stolen_ns = 0;
        cpu.job_end = Some(from + duration);
        cpu.busy_ns += duration;
        let epoch = cpu.epoch;
        self.queue
            .push(Cycles(from + duration), Ev::ProcJobDone { site, epoch });
    }

    fn job_done(&mut self, site: usize, epoch: u64) {
        let cpu = &mut self.cpus[site];
        if cpu.epoch != epoch || cpu.job_end != Some(self.queue.now().0) {
            return;
        }
        cpu.job_end = None;
        let pid = cpu.current.expect("a job runs in a process");
        if self.procs[pid].program.is_some() {
            self.finish_compute(pid);
            self.run_user(pid);
        } else {
            self.run_server(site, pid);
        }
    }

    fn quantum_end(&mut self, site: usize, _gen: u64) {
        let now = self.now_ns();
        let cpu = &self.cpus[site];
        let Some(cur) = cpu.current else { return };
        if cpu.quantum_end != now {
            return;
        }
        // Kernel (server) work is not preempted; a user process is, if
        // anyone else is runnable; else it gets a fresh quantum.
        if self.procs[cur].program.is_none() {
            return;
        }
        if self.cpus[site].run_queue.is_empty() {
            let q = now + self.preset.quantum_ns();
            self.cpus[site].quantum_end = q;
            let epoch = self.cpus[site].epoch;
            self.queue.push(Cycles(q), Ev::QuantumEnd { site, epoch });
            return;
        }
        self.counters.add("quantum_preemptions", 1);
        self.finish_compute(cur);
        self.switch_out(site, cur);
    }

    /// The server process finished its context switch or a job: apply the
    /// job's effect at its end, then start the next job or go idle.
    fn run_server(&mut self, site: usize, pid: Pid) {
        if std::mem::take(&mut self.procs[pid].in_job) {
            let done = self.procs[pid].jobs.pop_front().expect("the job that ran");
            self.server_effect(site, done);
        }
        let Some(next) = self.procs[pid].jobs.front() else {
            self.procs[pid].state = PState::Idle;
            self.cpus[site].current = None;
            return self.dispatch(site);
        };
        let cost = match next {
            ServerJob::Request { .. } => {
                self.preset.server_request_ns + self.preset.library_processing_ns
            }
            ServerJob::SendPage { .. } => self.preset.page_output_ns * self.transfers(),
        };
        self.procs[pid].in_job = true;
        let start = self.now_ns().max(self.cpus[site].intr_free_at);
        self.start_job(site, start, cost);
    }

    fn server_effect(&mut self, site: usize, job: ServerJob) {
        let now = self.now_ns();
        match job {
            ServerJob::Request { from, msg } => self.core(site, Event::Received { from, msg }),
            ServerJob::SendPage { to, msg } => self.arrive(site, to, msg, now),
        }
    }
}

/// The process id a site's setup attachment is made under.
fn site_process(site: usize) -> ProcessId {
    ProcessId(site as u32 + 1_000_000)
}

fn push_sends(inbox: &mut VecDeque<(usize, SiteId, Msg)>, from: usize, actions: Vec<Action>) {
    for a in actions {
        if let Action::Send { to, msg } = a {
            inbox.push_back((to.0 as usize, SiteId(from as u16), msg));
        }
    }
}
