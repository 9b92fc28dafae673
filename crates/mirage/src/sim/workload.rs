//! The paper's programs as simulated user processes, and how a process
//! executes them on a simulated site.
//!
//! - `PingPong` is Fig. 4 (§7.2): process 1 writes a word and waits for
//!   process 2's write to the adjacent word, then moves to the next pair.
//! - `Ring` is the N-site extension: N processes pass a token through one
//!   word, all others polling it (each write invalidates N-2 readers).
//! - `Counter` is §8's read-writer: it decrements its own counter on the
//!   shared page, testing it each iteration (read faults and write faults).

use super::{PState, Pid, Sim};
use crate::core::{Access, Held, PageNo};

/// What a program wants to do next.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Write {
        page: PageNo,
        word: u32,
        value: u64,
    },
    /// Read `word` until it holds `value`; `yields` calls yield() between
    /// reads (§7.2), otherwise the process busy-waits.
    Await {
        page: PageNo,
        word: u32,
        value: u64,
        yields: bool,
    },
    /// Decrement-and-test iterations on `word` (§8).
    Count {
        page: PageNo,
        word: u32,
        remaining: u64,
    },
    Done,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Program {
    PingPong {
        first: bool,
        trial: u64,
        trials: u64,
        writing: bool,
        yields: bool,
        pairs: u32,
    },
    Ring {
        index: u64,
        n: u64,
        round: u64,
        rounds: u64,
        writing: bool,
        yields: bool,
    },
    Counter {
        word: u32,
        remaining: u64,
    },
}

const PAGE: PageNo = PageNo(0);

impl Program {
    /// Fig. 4's process 1 (`first`) or process 2.
    pub fn ping_pong(first: bool, trials: u64, yields: bool, page_bytes: u32) -> Program {
        Program::PingPong {
            first,
            trial: 0,
            trials,
            writing: first,
            yields,
            pairs: page_bytes / 16,
        }
    }

    pub fn ring(index: u64, n: u64, rounds: u64, yields: bool) -> Program {
        Program::Ring {
            index,
            n,
            round: 0,
            rounds,
            writing: false,
            yields,
        }
    }

    pub fn counter(word: u32, iterations: u64) -> Program {
        Program::Counter {
            word,
            remaining: iterations,
        }
    }

    pub fn current(&self) -> Op {
        match *self {
            Program::PingPong { trial, trials, .. } if trial == trials => Op::Done,
            Program::PingPong {
                first,
                trial,
                writing,
                yields,
                pairs,
                ..
            } => {
                // Distinct values per trial, so that a wrapped pair of
                // words never shows an old value as the awaited one.
                let pair = (trial % pairs as u64) as u32;
                let (mine, theirs) = if first {
                    (2 * pair, 2 * pair + 1)
                } else {
                    (2 * pair + 1, 2 * pair)
                };
                let (my_value, their_value) = if first {
                    (2 * trial + 1, 2 * trial + 2)
                } else {
                    (2 * trial + 2, 2 * trial + 1)
                };
                if writing {
                    Op::Write {
                        page: PAGE,
                        word: mine,
                        value: my_value,
                    }
                } else {
                    Op::Await {
                        page: PAGE,
                        word: theirs,
                        value: their_value,
                        yields,
                    }
                }
            }
            Program::Ring { round, rounds, .. } if round == rounds => Op::Done,
            Program::Ring {
                index,
                n,
                round,
                writing,
                yields,
                ..
            } => {
                let token = round * n + index;
                if writing {
                    Op::Write {
                        page: PAGE,
                        word: 0,
                        value: token + 1,
                    }
                } else {
                    Op::Await {
                        page: PAGE,
                        word: 0,
                        value: token,
                        yields,
                    }
                }
            }
            Program::Counter { remaining: 0, .. } => Op::Done,
            Program::Counter { word, remaining } => Op::Count {
                page: PAGE,
                word,
                remaining,
            },
        }
    }

    /// The current op completed; returns whether a cycle ended (the
    /// paper's cycle: until process 1 is about to write again, §7.2).
    pub fn advance(&mut self) -> bool {
        match self {
            Program::PingPong {
                first,
                trial,
                writing,
                ..
            } => {
                let ends_cycle = *first && !*writing;
                let ends_trial = *first != *writing;
                *writing = !*writing;
                if ends_trial {
                    *trial += 1;
                }
                ends_cycle
            }
            Program::Ring {
                index,
                round,
                writing,
                ..
            } => {
                let ends_cycle = *index == 0 && *writing;
                if *writing {
                    *round += 1;
                }
                *writing = !*writing;
                ends_cycle
            }
            Program::Counter { .. } => false,
        }
    }
}

/// A running compute chunk of `Count` iterations.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk {
    pub start: u64,
    pub iterations: u64,
}

impl Sim {
    fn held(&self, pid: Pid, page: PageNo) -> Held {
        let site = self.procs[pid].site;
        self.sites[site]
            .page_view(self.segment.expect("segment"), page)
            .map_or(Held::Nothing, |v| v.held)
    }

    /// Runs the user process's program from its current op, until it
    /// blocks, polls, computes or finishes.
    pub(crate) fn run_user(&mut self, pid: Pid) {
        loop {
            let op = self.procs[pid]
                .program
                .as_ref()
                .expect("user process")
                .current();
            match op {
                Op::Done => return self.user_done(pid),
                Op::Write { page, word, value } => {
                    if !self.held(pid, page).allows(Access::Write) {
                        return self.user_fault(pid, page, Access::Write);
                    }
                    self.user_write(pid, page, word, value);
                    self.advance(pid);
                }
                Op::Await {
                    page,
                    word,
                    value,
                    yields,
                } => {
                    if !self.held(pid, page).allows(Access::Read) {
                        return self.user_fault(pid, page, Access::Read);
                    }
                    if self.user_read(pid, page, word) == value {
                        self.advance(pid);
                        continue;
                    }
                    return self.poll(pid, yields);
                }
                Op::Count {
                    page,
                    word,
                    remaining,
                } => match self.held(pid, page) {
                    Held::Nothing => return self.user_fault(pid, page, Access::Read),
                    Held::Read => {
                        // The loop's test reads, then its decrement writes.
                        self.user_read(pid, page, word);
                        return self.user_fault(pid, page, Access::Write);
                    }
                    Held::Write => return self.compute(pid, remaining),
                },
            }
        }
    }

    fn advance(&mut self, pid: Pid) {
        if self.procs[pid].program.as_mut().expect("user").advance() {
            let now = self.now_ns();
            self.marks[pid].push(now);
            if self.marks.iter().position(|m| !m.is_empty()) == Some(pid) {
                let mut c = self.counters.clone();
                let busy: u64 = self.cpus.iter().map(|c| c.busy_ns).sum();
                c.add("cpu_busy_us", busy / 1_000);
                self.mark_counters.push(c);
            }
            self.note(self.procs[pid].site, || {
                "---- cycle ends (process 1 about to write) ----".into()
            });
        }
    }

    fn user_read(&mut self, pid: Pid, page: PageNo, word: u32) -> u64 {
        let (site, seg) = (self.procs[pid].site, self.segment.expect("segment"));
        let bytes = self.sites[site].read(seg, page, word as usize * 8, 8);
        let got = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        let now = crate::core::Nanos(self.now_ns());
        self.oracle.read(
            crate::core::SiteId(site as u16),
            seg,
            page,
            word as usize,
            got,
            now,
        );
        got
    }

    fn user_write(&mut self, pid: Pid, page: PageNo, word: u32, value: u64) {
        let (site, seg) = (self.procs[pid].site, self.segment.expect("segment"));
        self.sites[site].write(seg, page, word as usize * 8, &value.to_le_bytes());
        self.oracle.wrote(seg, page, word as usize, value);
    }

    /// The awaited value is not there yet: yield() if anyone else can run,
    /// else keep the CPU (busy-waiting burns the quantum, §7.2).
    fn poll(&mut self, pid: Pid, yields: bool) {
        let site = self.procs[pid].site;
        if yields && !self.cpus[site].run_queue.is_empty() {
            self.counters.add("yields", 1);
            return self.switch_out(site, pid);
        }
        self.procs[pid].state = PState::Polling { yields };
    }

    fn compute(&mut self, pid: Pid, iterations: u64) {
        let site = self.procs[pid].site;
        let start = self.now_ns().max(self.cpus[site].intr_free_at);
        self.procs[pid].computing = Some(Chunk { start, iterations });
        let duration = iterations * self.preset.loop_iteration_ns;
        self.start_job(site, start, duration);
    }

    /// Books the iterations a chunk completed (all of them at its end;
    /// those done so far when it is cut short).
    pub(crate) fn finish_compute(&mut self, pid: Pid) {
        let Some(chunk) = self.procs[pid].computing.take() else {
            return;
        };
        let site = self.procs[pid].site;
        let ran = self
            .now_ns()
            .saturating_sub(chunk.start)
            .saturating_sub(self.cpus[site].stolen_ns);
        let done = (ran / self.preset.loop_iteration_ns).min(chunk.iterations);
        self.cpus[site].job_end = None;
        self.cpus[site].epoch += 1;
        self.counters.add("loop_iterations", done);
        if let Some(crate::sim::Program::Counter { remaining, .. }) =
            self.procs[pid].program.as_mut()
        {
            *remaining -= done;
        }
    }

    fn user_fault(&mut self, pid: Pid, page: PageNo, access: Access) {
        let site = self.procs[pid].site;
        let local = self.segment.expect("segment").library.0 as usize == site;
        let (cost, name) = if local {
            (self.preset.local_fault_ns, "local_faults")
        } else {
            (self.preset.request_fault_ns, "request_faults")
        };
        self.counters.add(name, 1);
        self.note(site, || {
            format!(
                "{} {access:?} fault (process {pid})",
                if local { "local" } else { "remote-request" }
            )
        });
        self.fault_started[pid] = Some(self.now_ns());
        self.procs[pid].state = PState::Blocked;
        self.cpus[site].current = None;
        self.cpus[site].job_end = None;
        self.cpus[site].epoch += 1;
        self.intr(site, cost, super::IntrWork::Fault { pid, page, access });
        self.dispatch(site);
    }

    fn user_done(&mut self, pid: Pid) {
        let site = self.procs[pid].site;
        self.procs[pid].state = PState::Done;
        let now = self.now_ns();
        self.marks[pid].push(now);
        self.cpus[site].current = None;
        // A process that exits detaches its segments (System V: exit
        // detaches); the site's attachment goes with its last process, so
        // a write copy is checked back in rather than kept for nobody.
        if let Some(segment) = self.segment {
            self.detach_process(pid, segment);
        }
        self.dispatch(site);
    }

    /// The core woke a process: its fault is satisfied.
    pub(crate) fn wake(&mut self, pid: Pid) {
        if let Some(t0) = self.fault_started[pid].take() {
            let now = self.now_ns();
            self.fault_latencies_ns.push(now - t0);
            let busy = self.cpus.iter().map(|c| c.busy_ns).collect();
            self.busy_at_wake_ns.push(busy);
        }
        if self.procs[pid].state == PState::Blocked {
            self.make_runnable(pid);
        }
    }

    /// The site's copy of `page` changed: a process polling it or computing
    /// on it notices at once (its next read or write).
    pub(crate) fn page_changed(&mut self, site: usize, _page: PageNo) {
        let Some(cur) = self.cpus[site].current else {
            return;
        };
        let polling = matches!(self.procs[cur].state, PState::Polling { .. });
        let computing = self.procs[cur].computing.is_some();
        if !(polling || computing) {
            return;
        }
        if computing {
            self.finish_compute(cur);
        }
        self.procs[cur].state = PState::Running;
        self.run_user(cur);
    }
}
