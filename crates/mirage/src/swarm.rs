//! A seed-swarm driver for the core (TigerBeetle's VOPR in miniature):
//! every parameter — sites, pages, Δ, options, per-pair message delays,
//! the processes' reads and writes — is drawn from the seed. It checks the
//! oracle after every event, and liveness (every request eventually
//! granted) by a bound on events. Messages are FIFO per pair of sites (a
//! Locus virtual circuit, §7.1) and delivered exactly once.

use crate::core::*;
use crate::oracle::DsmOracle;
use mmulab_engine::{Cycles, EventQueue, SimRng};
use std::collections::BTreeMap;

/// The parameters drawn from a seed (printed first on failure).
#[derive(Clone, Debug)]
pub struct SwarmParams {
    pub seed: u64,
    pub sites: u16,
    pub library: u16,
    pub pages: u32,
    pub window_ticks: u32,
    pub processes_per_site: u32,
    pub ops_per_process: u32,
    pub config: CoreConfig,
    /// Mean one-way delay per ordered pair of sites, in ns.
    pub pair_delay_ns: BTreeMap<(u16, u16), u64>,
}

impl SwarmParams {
    pub fn draw(seed: u64, mutation: Mutation) -> SwarmParams {
        let mut rng = SimRng::new(seed, "swarm-params");
        let sites = rng.range_inclusive(2, 5) as u16;
        let tick_ns = 1_000_000;
        let mut pair_delay_ns = BTreeMap::new();
        for a in 0..sites {
            for b in 0..sites {
                pair_delay_ns.insert((a, b), rng.range_inclusive(50_000, 4_000_000));
            }
        }
        let honour = rng.chance(0.3).then_some(tick_ns / 2);
        let dynamic = if rng.chance(0.2) {
            DynamicDelta::HalveOnRefusal { min_ticks: 0 }
        } else {
            DynamicDelta::Off
        };
        SwarmParams {
            seed,
            sites,
            library: rng.below(sites as u64) as u16,
            pages: rng.range_inclusive(1, 3) as u32,
            window_ticks: *rng.pick(&[0, 0, 1, 2, 5]),
            processes_per_site: rng.range_inclusive(1, 2) as u32,
            ops_per_process: rng.range_inclusive(5, 40) as u32,
            config: CoreConfig {
                tick_ns,
                honour_within_ns: honour,
                dynamic_delta: dynamic,
                mutation,
                // fleisch89's rule, as the simulator keeps it.
                lifetime: crate::core::Lifetime::LastDetach,
            },
            pair_delay_ns,
        }
    }
}

/// What one swarm run found.
#[derive(Clone, Debug)]
pub struct SwarmOutcome {
    pub params: SwarmParams,
    pub oracle: DsmOracle,
    /// A liveness or protocol failure (a panic in the core is not caught).
    pub stuck: Option<String>,
    pub messages: u64,
    pub events: u64,
    pub destroyed_at_all_sites: bool,
    /// `Action::PeerError`s and `Action::Fail`s: none in an honest run
    /// (no site dies, no message is wrong).
    pub peer_errors: Vec<String>,
}

impl SwarmOutcome {
    pub fn ok(&self) -> bool {
        self.oracle.ok()
            && self.stuck.is_none()
            && self.destroyed_at_all_sites
            && self.peer_errors.is_empty()
    }

    pub fn replay_hint(&self) -> String {
        format!("seed {} params {:?}", self.params.seed, self.params)
    }
}

#[derive(Clone, Debug)]
enum Ev {
    Deliver {
        from: SiteId,
        to: SiteId,
        msg: Msg,
    },
    Timer {
        site: SiteId,
        timer: Timer,
    },
    /// A process takes its next step (attach, an access, or detach).
    Step {
        proc_index: usize,
    },
}

#[derive(Clone, Debug)]
struct Proc {
    id: ProcessId,
    site: SiteId,
    ops_left: u32,
    attached: bool,
    detached: bool,
    /// The access it faulted on and sleeps for.
    asleep_on: Option<(PageNo, Access, usize)>,
    /// An access to try again: woken, it found the copy gone already.
    retry: Option<(PageNo, Access, usize)>,
    detach_sent: bool,
}

struct Swarm {
    p: SwarmParams,
    rng: SimRng,
    sites: Vec<Site>,
    queue: EventQueue<Ev>,
    last_delivery: BTreeMap<(u16, u16), u64>,
    procs: Vec<Proc>,
    segment: Option<SegmentId>,
    oracle: DsmOracle,
    next_value: u64,
    messages: u64,
    destroyed: Vec<bool>,
    peer_errors: Vec<String>,
    chaos: Option<Chaos>,
    /// A separate stream, so that honest runs draw exactly as before.
    chaos_rng: SimRng,
}

/// Runs one seed to completion (or to the liveness bound).
pub fn run_seed(seed: u64, mutation: Mutation) -> SwarmOutcome {
    run_inner(seed, mutation, None)
}

/// What a chaos run (`run_seed_chaos`) found besides the honest outcome.
#[derive(Clone, Debug, Default)]
pub struct Chaos {
    /// Wrong messages injected; each must be refused with no effect.
    pub injected: u64,
    /// Real messages delivered a second time, out of order.
    pub duplicated: u64,
    /// A wrong message that was not refused, or that changed state.
    pub accepted: Vec<String>,
}

/// A seed run with a hostile network: besides the honest traffic, wrong
/// messages (unknown segment, page out of range, a library's message
/// from a site that is not the library, a library message to a site
/// that is not the library) from random peers, and duplicates of real
/// messages delivered late. Checked: no panic, the oracle (every read
/// the last value written, one writer), every wrong message refused with
/// no effect on the receiving site's state. Liveness is not required
/// (a duplicate request may stall a page; it never corrupts one).
pub fn run_seed_chaos(seed: u64) -> (SwarmOutcome, Chaos) {
    let mut chaos = Chaos::default();
    let out = run_inner(seed, Mutation::None, Some(&mut chaos));
    (out, chaos)
}

fn run_inner(seed: u64, mutation: Mutation, chaos: Option<&mut Chaos>) -> SwarmOutcome {
    let p = SwarmParams::draw(seed, mutation);
    let peers: Vec<SiteId> = (0..p.sites).map(SiteId).collect();
    let sites = peers
        .iter()
        .map(|&id| Site::new(id, peers.clone(), p.config.clone()))
        .collect();
    let mut procs = Vec::new();
    for s in 0..p.sites {
        for i in 0..p.processes_per_site {
            let id = ProcessId(s as u32 * 100 + i);
            procs.push(Proc {
                id,
                site: SiteId(s),
                ops_left: p.ops_per_process,
                attached: false,
                detached: false,
                asleep_on: None,
                retry: None,
                detach_sent: false,
            });
        }
    }
    let mut w = Swarm {
        rng: SimRng::new(seed, "swarm-run"),
        sites,
        queue: EventQueue::new(),
        last_delivery: BTreeMap::new(),
        procs,
        segment: None,
        oracle: DsmOracle::new(),
        next_value: 1,
        messages: 0,
        destroyed: vec![false; p.sites as usize],
        peer_errors: Vec::new(),
        chaos: chaos.is_some().then(Chaos::default),
        chaos_rng: SimRng::new(seed, "swarm-chaos"),
        p,
    };
    let stuck = w.run();
    if let (Some(c), Some(found)) = (chaos, w.chaos.take()) {
        *c = found;
    }
    let destroyed_at_all_sites = w.destroyed.iter().all(|d| *d);
    SwarmOutcome {
        events: w.queue.scheduled(),
        params: w.p,
        oracle: w.oracle,
        stuck,
        messages: w.messages,
        destroyed_at_all_sites,
        peer_errors: w.peer_errors,
    }
}

const EVENT_BOUND: u64 = 2_000_000;

impl Swarm {
    fn run(&mut self) -> Option<String> {
        let lib = SiteId(self.p.library);
        let geometry = Geometry {
            name: "swarm".into(),
            pages: self.p.pages,
            page_bytes: 64,
            window_ticks: self.p.window_ticks,
        };
        let creator = ProcessId(u32::MAX);
        self.apply(
            lib,
            Event::Create {
                geometry,
                process: creator,
            },
        );
        let segment = self.segment.expect("created");
        for i in 0..self.procs.len() {
            let at = self.rng.below(3_000_000);
            self.queue.push(Cycles(at), Ev::Step { proc_index: i });
        }
        while let Some((t, ev)) = self.queue.pop() {
            if self.queue.scheduled() > EVENT_BOUND {
                return Some(format!(
                    "liveness bound of {EVENT_BOUND} events passed at t={t}"
                ));
            }
            match ev {
                Ev::Deliver { from, to, msg } => {
                    if self.chaos.is_some() {
                        self.inject(from, to, &msg, segment);
                    }
                    self.apply(to, Event::Received { from, msg })
                }
                Ev::Timer { site, timer } => self.apply(site, Event::TimerFired(timer)),
                Ev::Step { proc_index, .. } => self.step(proc_index, segment),
            }
            let now = Nanos(self.queue.now().0);
            self.oracle
                .check_swmr(&self.sites, segment, self.p.pages, now);
            if !self.oracle.ok() {
                return None;
            }
        }
        let unfinished: Vec<_> = self
            .procs
            .iter()
            .filter(|p| !p.detached)
            .map(|p| p.id)
            .collect();
        if !unfinished.is_empty() {
            return Some(format!(
                "quiescent with processes not finished: {unfinished:?}"
            ));
        }
        None
    }

    fn now(&self) -> Nanos {
        Nanos(self.queue.now().0)
    }

    /// Chaos: maybe a wrong variant of `msg` to a chosen site (it must be
    /// refused, changing nothing), and maybe a late duplicate of `msg`.
    fn inject(&mut self, from: SiteId, to: SiteId, msg: &Msg, segment: SegmentId) {
        let n = self.p.sites;
        if self.chaos_rng.chance(0.1) {
            let at = self.queue.now().0 + self.chaos_rng.below(20_000_000);
            let ev = Ev::Deliver {
                from,
                to,
                msg: msg.clone(),
            };
            self.queue.push(Cycles(at), ev);
            self.chaos.as_mut().expect("chaos").duplicated += 1;
        }
        if !self.chaos_rng.chance(0.2) {
            return;
        }
        let lib = segment.library;
        let attached = |w: &Swarm, s: SiteId| {
            w.sites[s.0 as usize]
                .page_view(segment, PageNo(0))
                .is_some()
        };
        let mut m = msg.clone();
        let library_role = matches!(
            m,
            Msg::Request { .. }
                | Msg::Refused { .. }
                | Msg::Done { .. }
                | Msg::CheckedIn { .. }
                | Msg::Attach { .. }
                | Msg::Detach { .. }
        );
        let library_only = matches!(
            m,
            Msg::Recall { .. }
                | Msg::ForgetReader { .. }
                | Msg::AttachOk { .. }
                | Msg::DetachOk { .. }
                | Msg::Destroyed { .. }
                | Msg::Lost { .. }
                | Msg::ClockMoved { .. }
        );
        let (mut sender, mut target) = (from, to);
        let pick = self.chaos_rng.below(4);
        let how = match pick {
            // A page out of range, to a site that knows the segment.
            0 if page_mut(&mut m).is_some() => {
                let extra = self.chaos_rng.range_inclusive(0, 1000) as u32;
                *page_mut(&mut m).expect("a page") = PageNo(self.p.pages + extra);
                target = if library_role {
                    lib
                } else {
                    SiteId(self.chaos_rng.below(n as u64) as u16)
                };
                if !library_role && !attached(self, target) {
                    return;
                }
                "page out of range"
            }
            // An unknown segment (a destroyed one is announced to all:
            // its announcement and an invalidation of it are legitimate).
            1 if !matches!(
                m,
                Msg::Destroyed { .. } | Msg::Invalidate { .. } | Msg::Attach { .. }
            ) =>
            {
                *segment_mut(&mut m) = SegmentId {
                    library: lib,
                    serial: 1000 + self.chaos_rng.below(1000) as u32,
                };
                "unknown segment"
            }
            // A library's message from a site that is not its library.
            2 if library_only && n > 1 => {
                sender = SiteId((lib.0 + 1 + self.chaos_rng.below(n as u64 - 1) as u16) % n);
                "library message from another site"
            }
            // A library-role message to a site that is not the library.
            3 if library_role && n > 1 => {
                target = SiteId((lib.0 + 1 + self.chaos_rng.below(n as u64 - 1) as u16) % n);
                "library message to another site"
            }
            _ => return,
        };
        let before = self.sites[target.0 as usize].state_digest();
        let now = self.now();
        let desc = format!("{how}: {m:?} from {sender:?} to {target:?}");
        let actions = self.sites[target.0 as usize].handle(
            now,
            Event::Received {
                from: sender,
                msg: m,
            },
        );
        let after = self.sites[target.0 as usize].state_digest();
        let c = self.chaos.as_mut().expect("chaos");
        c.injected += 1;
        let refused = !actions.is_empty()
            && actions
                .iter()
                .all(|a| matches!(a, Action::PeerError { site, .. } if *site == sender));
        if !refused || before != after {
            c.accepted.push(format!(
                "{desc}: actions {actions:?}, state changed: {}",
                before != after
            ));
        }
    }

    /// Hands an event to a site and carries out its actions.
    fn apply(&mut self, site: SiteId, event: Event) {
        let now = self.now();
        // Detach gives up rights before Δ expires, by design: the site's
        // last process detached, or the library recalls a clock copy.
        let site_detaching = self
            .procs
            .iter()
            .filter(|p| p.site == site)
            .all(|p| p.detach_sent);
        let exempt = site_detaching
            || matches!(
                &event,
                Event::Received {
                    msg: Msg::Recall {
                        want: Want::CheckIn,
                        ..
                    },
                    ..
                }
            );
        let before: Vec<Option<PageView>> = match self.segment {
            Some(seg) => (0..self.p.pages)
                .map(|p| self.sites[site.0 as usize].page_view(seg, PageNo(p)))
                .collect(),
            None => Vec::new(),
        };
        if std::env::var_os("SWARM_TRACE").is_some() {
            eprintln!("{} {:?} <- {:?}", now.0, site, event);
        }
        let actions = self.sites[site.0 as usize].handle(now, event);
        if std::env::var_os("SWARM_TRACE").is_some() {
            for a in &actions {
                eprintln!("      -> {a:?}");
            }
        }
        for action in actions {
            self.carry_out(site, action, &before, exempt);
        }
    }

    fn carry_out(
        &mut self,
        site: SiteId,
        action: Action,
        before: &[Option<PageView>],
        exempt: bool,
    ) {
        let now = self.now();
        match action {
            Action::Send { to, msg } => self.send(site, to, msg),
            Action::SetTimer { at, timer } => self
                .queue
                .push(Cycles(at.0.max(now.0)), Ev::Timer { site, timer }),
            Action::Wake { process, page, .. } => self.wake(process, page),
            Action::Created { segment, .. } => self.segment = Some(segment),
            Action::Attached { process, .. } => {
                let i = self.proc_index(process);
                self.procs[i].attached = true;
                self.schedule_step(i);
            }
            Action::Detached { process, .. } => {
                let i = self.proc_index(process);
                self.procs[i].detached = true;
            }
            Action::Destroyed { .. } => self.destroyed[site.0 as usize] = true,
            Action::Invalidate { page, .. } | Action::Downgrade { page, .. } => {
                if let Some(Some(v)) = before.get(page.0 as usize)
                    && v.is_clock
                    && !exempt
                {
                    let tick = self.p.config.tick_ns;
                    self.oracle
                        .check_revoke(site, page, v.install_time, v.window_ticks, tick, now);
                }
            }
            Action::PeerError { site: from, reason } => self.peer_errors.push(format!(
                "at site {}: from site {}: {reason}",
                site.0, from.0
            )),
            Action::Fail { process, page, .. } => self.peer_errors.push(format!(
                "at site {}: {process:?} failed on {page:?}",
                site.0
            )),
            Action::Install { .. } | Action::Log(_) => {}
        }
    }

    /// FIFO per ordered pair, with a random delay around the pair's mean.
    fn send(&mut self, from: SiteId, to: SiteId, msg: Msg) {
        self.messages += 1;
        let mean = self.p.pair_delay_ns[&(from.0, to.0)];
        let delay = self.rng.range_inclusive(mean / 2, mean * 2);
        let key = (from.0, to.0);
        let at =
            (self.queue.now().0 + delay).max(self.last_delivery.get(&key).copied().unwrap_or(0));
        self.last_delivery.insert(key, at);
        self.queue.push(Cycles(at), Ev::Deliver { from, to, msg });
    }

    fn proc_index(&self, id: ProcessId) -> usize {
        self.procs
            .iter()
            .position(|p| p.id == id)
            .expect("known process")
    }

    fn schedule_step(&mut self, i: usize) {
        let at = self.queue.now().0 + self.rng.below(2_000_000);
        self.queue.push(Cycles(at), Ev::Step { proc_index: i });
    }

    fn wake(&mut self, process: ProcessId, page: PageNo) {
        let i = self.proc_index(process);
        let (p, access, word) = self.procs[i]
            .asleep_on
            .take()
            .expect("woken process was asleep");
        assert_eq!(p, page, "woken for another page");
        let segment = self.segment.expect("segment");
        let held = self.sites[self.procs[i].site.0 as usize]
            .page_view(segment, page)
            .expect("attached")
            .held;
        if held.allows(access) {
            return self.access(i, page, access, word);
        }
        // The grant was honoured, but a later request in the same handling
        // (Δ = 0) already took the copy away: the process runs later and
        // faults again, as a real one would.
        self.procs[i].retry = Some((page, access, word));
        self.schedule_step(i);
    }

    fn step(&mut self, i: usize, segment: SegmentId) {
        let site = self.procs[i].site;
        let process = self.procs[i].id;
        if !self.procs[i].attached {
            return self.apply(site, Event::Attach { segment, process });
        }
        if self.procs[i].ops_left == 0 {
            // A barrier: nobody detaches before all have attached, else the
            // segment may be destroyed under a late attacher (§2.2).
            if self.procs.iter().all(|p| p.attached) {
                self.procs[i].detach_sent = true;
                return self.apply(site, Event::Detach { segment, process });
            }
            return self.schedule_step(i);
        }
        if let Some((page, access, word)) = self.procs[i].retry.take() {
            return self.access(i, page, access, word);
        }
        let page = PageNo(self.rng.below(self.p.pages as u64) as u32);
        let access = if self.rng.chance(0.5) {
            Access::Write
        } else {
            Access::Read
        };
        let word = self.rng.below(8) as usize;
        self.access(i, page, access, word);
    }

    fn access(&mut self, i: usize, page: PageNo, access: Access, word: usize) {
        let segment = self.segment.expect("segment");
        let (site, process) = (self.procs[i].site, self.procs[i].id);
        let now = self.now();
        let s = &mut self.sites[site.0 as usize];
        let held = s.page_view(segment, page).expect("attached").held;
        if !held.allows(access) {
            self.procs[i].asleep_on = Some((page, access, word));
            return self.apply(
                site,
                Event::Fault {
                    segment,
                    page,
                    process,
                    access,
                },
            );
        }
        match access {
            Access::Read => {
                let got = u64::from_le_bytes(
                    s.read(segment, page, word * 8, 8)
                        .try_into()
                        .expect("8 bytes"),
                );
                self.oracle.read(site, segment, page, word, got, now);
            }
            Access::Write => {
                let value = self.next_value;
                self.next_value += 1;
                s.write(segment, page, word * 8, &value.to_le_bytes());
                self.oracle.wrote(segment, page, word, value);
            }
        }
        self.procs[i].ops_left -= 1;
        self.schedule_step(i);
    }
}

fn page_mut(m: &mut Msg) -> Option<&mut PageNo> {
    match m {
        Msg::Request { page, .. }
        | Msg::Recall { page, .. }
        | Msg::Refused { page, .. }
        | Msg::Done { page, .. }
        | Msg::Invalidate { page, .. }
        | Msg::InvalidateAck { page, .. }
        | Msg::Page { page, .. }
        | Msg::Upgrade { page, .. }
        | Msg::CheckedIn { page, .. }
        | Msg::ForgetReader { page, .. }
        | Msg::Lost { page, .. }
        | Msg::ClockMoved { page, .. } => Some(page),
        _ => None,
    }
}

fn segment_mut(m: &mut Msg) -> &mut SegmentId {
    match m {
        Msg::Request { segment, .. }
        | Msg::Recall { segment, .. }
        | Msg::Refused { segment, .. }
        | Msg::Done { segment, .. }
        | Msg::Invalidate { segment, .. }
        | Msg::InvalidateAck { segment, .. }
        | Msg::Page { segment, .. }
        | Msg::Upgrade { segment, .. }
        | Msg::CheckedIn { segment, .. }
        | Msg::ForgetReader { segment, .. }
        | Msg::Lost { segment, .. }
        | Msg::ClockMoved { segment, .. }
        | Msg::Attach { segment }
        | Msg::AttachOk { segment, .. }
        | Msg::Detach { segment }
        | Msg::DetachOk { segment }
        | Msg::Destroyed { segment }
        | Msg::Remove { segment } => segment,
    }
}
