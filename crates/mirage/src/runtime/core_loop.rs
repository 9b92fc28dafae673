//! The core loop: every input of a site — a peer's frame, an API call, a
//! timer, a fault — handed to the sans-IO core under one lock, and the
//! core's actions carried out (issue #7; split out of `node.rs` by issue
//! #23).
//!
//! Every input is serialized by the core's lock, so messages to a peer
//! leave in the core's order.
//!
//! Page bytes (the one place where memory and the core meet): the core
//! keeps a copy of each held page and ships that copy. Before an event
//! that names a page this site holds for writing, the runtime
//! write-protects the page in every local mapping, then copies the page
//! into the core (`Site::write`). Rights are then *reduced* as the core's
//! actions say, in order, but *granted* only from the core's final state
//! after the whole batch, and faulters are woken last. So a page is sent,
//! downgraded or reported invalidated only after every local mapping lost
//! the right, and its bytes are read after that (issue #7).

use super::directory::DirWait;
use super::fault;
use super::fault_paths::Waiter;
use super::local::{Client, proto};
use super::mem::{RemoteFaults, SegmentMemory};
use super::node::{
    Api, AttachTarget, CopyAnswer, Input, RuntimeMutation, Shared, TraceEntry, msg_page,
    msg_segment, seg_name, stamp,
};
use super::peer::Outbound;
use super::shm::ShmError;
use crate::core::{
    Access, Action, Event, Geometry, Held, Msg, Nanos, PageNo, ProcessId, SegmentId, Site, SiteId,
    Timer,
};
use crate::wire::{self, Frame, SegmentOrigin};
use nix::libc;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// The core thread: the API and the timers.
pub(crate) fn core_thread(shared: Arc<Shared>, rx: Receiver<Input>) {
    let mut wait = Duration::from_millis(500);
    loop {
        match rx.recv_timeout(wait) {
            Ok(Input::Stop) | Err(RecvTimeoutError::Disconnected) => break,
            Ok(Input::Api(api)) => shared.with_core(|c| c.api(api)),
            Ok(Input::Nudge) | Err(RecvTimeoutError::Timeout) => {}
        }
        let mut next = Duration::from_millis(500);
        shared.with_core(|c| {
            next = c.fire_timers();
            c.liveness();
        });
        wait = next.min(shared.options.heartbeat);
    }
    let core = shared.core.lock().expect("core").take();
    if let Some(mut c) = core {
        c.finish();
    }
}

pub(crate) struct AttachInfo {
    pub(crate) segment: SegmentId,
    /// (base, fault-table slot) of a mapping in this process.
    pub(crate) local: Option<(usize, usize)>,
    /// The program holding the mapping, for one made by the shim.
    pub(crate) client: Option<Arc<Client>>,
    pub(crate) readonly: bool,
}

pub(crate) type PendingAttach = (
    SegmentId,
    AttachTarget,
    Sender<Result<(usize, u32, Geometry), ShmError>>,
);

/// The core thread's state.
pub(crate) struct CoreLoop {
    pub(crate) shared: Arc<Shared>,
    pub(crate) site: Site,
    pub(crate) start: Instant,
    pub(crate) timers: BTreeMap<(Nanos, u64), Timer>,
    pub(crate) timer_seq: u64,
    pub(crate) out: Vec<Option<Outbound>>,
    pub(crate) segs: BTreeMap<SegmentId, SegmentMemory>,
    pub(crate) attaches: BTreeMap<u32, AttachInfo>,
    /// Sleeping faulters by (attach, page), each with when it faulted.
    pub(crate) waiters: BTreeMap<(u32, u32), Vec<(Instant, Waiter)>>,
    /// Pages this site cannot obtain (their holder or library is dead, or
    /// a request timed out), with the reason. Cleared when a copy arrives.
    pub(crate) lost: BTreeMap<(SegmentId, PageNo), String>,
    /// Segments whose library died: nothing about them is ever sent to a
    /// restarted site under the same name, and they cannot be attached.
    pub(crate) dead_segments: std::collections::BTreeSet<SegmentId>,
    /// (site, segment): the site died while the segment existed; whatever
    /// it (restarted) says about the segment is ignored, and nothing
    /// about it is sent to it.
    pub(crate) fenced: std::collections::BTreeSet<(SiteId, SegmentId)>,
    /// Segments created here (the library's), for fencing.
    pub(crate) created: std::collections::BTreeSet<SegmentId>,
    /// Segments under `SHM_LOCK`: this site's copy is pinned in memory.
    pub(crate) locked: std::collections::BTreeSet<SegmentId>,
    pub(crate) last_ping: Instant,
    /// Peers that sent a message the core refused while it handled the
    /// current frame (their connection is dropped).
    pub(crate) refused_from: Vec<SiteId>,
    /// When each dead peer was last redialled.
    pub(crate) redialled: Vec<Option<Instant>>,
    /// Whether each peer was ever reached (later dials are quick).
    pub(crate) dialled_once: Vec<bool>,
    /// When a dial of each peer last failed its handshake (no redial for
    /// a second: dials run under the core's lock).
    pub(crate) dial_failed: Vec<Option<Instant>>,
    pub(crate) pending_create: BTreeMap<u32, Sender<SegmentId>>,
    pub(crate) pending_attach: BTreeMap<u32, PendingAttach>,
    pub(crate) pending_detach: BTreeMap<u32, Sender<()>>,
    /// The key directory (first site only).
    pub(crate) dir: BTreeMap<i32, (SegmentId, SegmentOrigin)>,
    pub(crate) dir_waits: BTreeMap<u64, DirWait>,
    pub(crate) next_req: u64,
    pub(crate) next_process: u32,
    pub(crate) fault_pipe_w: Arc<OwnedFd>,
    pub(crate) trace: Option<Vec<TraceEntry>>,
}

impl CoreLoop {
    pub(crate) fn new(shared: Arc<Shared>, fault_pipe_w: Arc<OwnedFd>) -> CoreLoop {
        let n = shared.config.sites.len();
        let peers = (0..n as u16).map(SiteId).collect();
        let core = shared.config.core_config();
        let trace = shared.options.record_trace.then(Vec::new);
        CoreLoop {
            site: Site::new(shared.me, peers, core),
            start: Instant::now(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            out: (0..n).map(|_| None).collect(),
            segs: BTreeMap::new(),
            attaches: BTreeMap::new(),
            waiters: BTreeMap::new(),
            lost: BTreeMap::new(),
            dead_segments: std::collections::BTreeSet::new(),
            fenced: std::collections::BTreeSet::new(),
            created: std::collections::BTreeSet::new(),
            locked: std::collections::BTreeSet::new(),
            last_ping: Instant::now(),
            refused_from: Vec::new(),
            redialled: vec![None; n],
            dialled_once: vec![false; n],
            dial_failed: vec![None; n],
            pending_create: BTreeMap::new(),
            pending_attach: BTreeMap::new(),
            pending_detach: BTreeMap::new(),
            dir: BTreeMap::new(),
            dir_waits: BTreeMap::new(),
            next_req: 1,
            next_process: 1,
            fault_pipe_w,
            trace,
            shared,
        }
    }

    pub(crate) fn now(&self) -> Nanos {
        Nanos(self.start.elapsed().as_nanos() as u64)
    }

    /// Hands the core a detach (the core accepts one while the process
    /// is asleep on a fault: its request is answered and given back).
    pub(crate) fn detach_core(&mut self, segment: SegmentId, process: u32) {
        self.feed(Event::Detach {
            segment,
            process: ProcessId(process),
        });
    }

    /// Heartbeats out, silent peers declared dead, overdue faults failed.
    pub(crate) fn liveness(&mut self) {
        let opts = self.shared.options.clone();
        if self.last_ping.elapsed() >= opts.heartbeat {
            self.last_ping = Instant::now();
            let ping = wire::encode(Frame::Ping);
            for i in 0..self.out.len() {
                match &self.out[i] {
                    Some(o) if !o.is_broken() => o.send(ping.clone()),
                    // A cut connection is redialled (once) for the
                    // heartbeat, so that a live peer stays heard.
                    Some(_) => self.send_frame(SiteId(i as u16), Frame::Ping),
                    None => {}
                }
            }
        }
        let silent: Vec<(SiteId, Duration)> = {
            let peers = self.shared.peers.lock().expect("peers");
            peers
                .iter()
                .enumerate()
                .filter(|(_, p)| p.dead.is_none())
                .filter_map(|(i, p)| {
                    let t = p.last_heard?.elapsed();
                    (t > opts.peer_timeout).then_some((SiteId(i as u16), t))
                })
                .collect()
        };
        for (site, t) in silent {
            self.peer_dead(site, &format!("silent for {:.1} s", t.as_secs_f64()));
        }
        let overdue: Vec<(u32, u32)> = self
            .waiters
            .iter()
            .filter(|(_, ws)| {
                ws.iter()
                    .any(|(since, _)| since.elapsed() > opts.request_timeout)
            })
            .map(|(&k, _)| k)
            .collect();
        for (process, page) in overdue {
            let Some(segment) = self.attaches.get(&process).map(|a| a.segment) else {
                continue;
            };
            let why = format!(
                "segment {} page {page}: no answer within {:.1} s (library site {}{})",
                seg_name(segment),
                opts.request_timeout.as_secs_f64(),
                self.shared.config.name(segment.library),
                self.dead_list()
            );
            self.lose(segment, PageNo(page), why);
        }
    }

    /// A clean stop: every mapping loses access (programs acknowledge),
    /// sleeping faulters fail, every attach detaches so that the core
    /// checks this site's pages back in. Returns one receiver per detach
    /// whose library is alive.
    pub(crate) fn check_in(&mut self) -> Vec<Receiver<()>> {
        // Every write-held page's bytes go into the core first (after
        // every mapping lost the right to write), then every mapping
        // loses every right for good.
        let segs: Vec<SegmentId> = self.segs.keys().copied().collect();
        for segment in segs {
            let pages = self.segs[&segment].pages as u32;
            for p in 0..pages {
                let page = PageNo(p);
                let write_held = self
                    .site
                    .page_view(segment, page)
                    .is_some_and(|v| v.held == Held::Write);
                if write_held {
                    let mem = &self.segs[&segment];
                    mem.protect(page, Held::Read);
                    let bytes = mem.page(page).to_vec();
                    self.site.write(segment, page, 0, &bytes);
                    if let Some(t) = &mut self.trace {
                        t.push(TraceEntry::Sync {
                            segment,
                            page,
                            bytes,
                        });
                    }
                }
            }
            if let Some(mem) = self.segs.get_mut(&segment) {
                mem.freeze();
            }
        }
        // Faulters already asleep stay so: their requests are in flight
        // and the core detaches a process only once it is awake; served,
        // they retry on a frozen mapping and fail.
        let processes: Vec<u32> = self.attaches.keys().copied().collect();
        let mut waits = Vec::new();
        for process in processes {
            let Some(a) = self.attaches.remove(&process) else {
                continue;
            };
            if let Some(mem) = self.segs.get_mut(&a.segment) {
                match a.local {
                    Some((base, slot)) => {
                        fault::unregister(slot);
                        let _ = mem.detach(base);
                    }
                    None => mem.detach_remote(process),
                }
            }
            let (tx, rx) = mpsc::channel();
            self.pending_detach.insert(process, tx);
            if !self.dead_segments.contains(&a.segment) {
                waits.push(rx);
            }
            self.detach_core(a.segment, process);
        }
        waits
    }

    /// Fires due timers; returns how long until the next one.
    pub(crate) fn fire_timers(&mut self) -> Duration {
        loop {
            let now = self.now();
            let Some((&(at, seq), &timer)) = self.timers.first_key_value() else {
                return Duration::from_millis(500);
            };
            if at > now {
                return Duration::from_nanos(at.0 - now.0);
            }
            self.timers.remove(&(at, seq));
            self.feed(Event::TimerFired(timer));
        }
    }

    /// At stop: release anyone still asleep in the handler (they retry
    /// and, with the mapping gone, crash as on any unmapped address).
    pub(crate) fn finish(&mut self) {
        let me = self.shared.config.name(self.shared.me).to_string();
        for ((process, page), words) in std::mem::take(&mut self.waiters) {
            let segment = self
                .attaches
                .get(&process)
                .map_or("?".to_string(), |a| seg_name(a.segment));
            let why = format!("segment {segment} page {page}: site {me} stopped");
            for (_, w) in words {
                w.release(fault::WAKE_FAIL, &why);
            }
        }
        for (_, a) in std::mem::take(&mut self.attaches) {
            if let Some((_, slot)) = a.local {
                fault::unregister(slot);
            }
        }
        // A clean stop: each peer hears a goodbye before the close, so
        // that it logs nothing about it (an unexpected close is logged).
        for q in self.out.iter().flatten() {
            q.goodbye();
        }
    }

    /// Why a peer's message cannot be handed to the core (it names a
    /// segment or page the core does not know in the role the message
    /// needs, or one fenced off when its sender died): the core trusts
    /// its peers, the runtime must not.
    /// Why a peer's message is not handed to the core: it names a segment
    /// fenced off when its sender died (a restarted site never speaks for
    /// its former life). Everything else the core checks itself.
    pub(crate) fn unexpected(&self, from: SiteId, msg: &Msg) -> Option<&'static str> {
        if let Some(seg) = msg_segment(msg)
            && self.fenced.contains(&(from, seg))
        {
            return Some("a segment from before the sender's restart");
        }
        None
    }

    /// Hands a frame to the core. Returns false when the sender must be
    /// dropped: the core refused its message (logged by name, with the
    /// reason, as the core's `PeerError`).
    pub(crate) fn net(&mut self, from: SiteId, frame: Frame) -> bool {
        self.refused_from.clear();
        self.net_inner(from, frame);
        !self.refused_from.contains(&from)
    }

    pub(crate) fn net_inner(&mut self, from: SiteId, frame: Frame) {
        match frame {
            Frame::Core(msg) => {
                if let Some(why) = self.unexpected(from, &msg) {
                    eprintln!(
                        "mmulab dsm site {}: ignored a {} from site {}: {why}",
                        self.shared.config.name(self.shared.me),
                        msg.kind(),
                        self.shared.config.name(from)
                    );
                    return;
                }
                let (is_request, is_page) = (
                    matches!(msg, Msg::Request { .. }),
                    matches!(msg, Msg::Page { .. }),
                );
                let shared = self.shared.clone();
                let st = &shared.counters.stamps;
                if is_request {
                    st.request_received.store(stamp(), Ordering::Relaxed);
                } else if is_page {
                    st.page_received.store(stamp(), Ordering::Relaxed);
                }
                self.feed(Event::Received { from, msg });
                if is_request {
                    st.page_sent.store(stamp(), Ordering::Relaxed);
                } else if is_page {
                    st.woken.store(stamp(), Ordering::Relaxed);
                }
            }
            Frame::Dir(d) => self.directory(from, d),
            Frame::Hello(_) | Frame::Ping | Frame::Bye => {}
        }
    }

    pub(crate) fn api(&mut self, api: Api) {
        match api {
            Api::Lookup { .. } | Api::Register { .. } | Api::RemoveKey { .. } => self.dir_api(api),
            Api::Create { geometry, reply } => {
                let process = self.new_process();
                self.pending_create.insert(process, reply);
                self.feed(Event::Create {
                    geometry,
                    process: ProcessId(process),
                });
            }
            Api::Attach {
                segment,
                target,
                reply,
            } => {
                if self.dead_segments.contains(&segment) {
                    let _ = reply.send(Err(ShmError::Removed));
                    return;
                }
                let process = self.new_process();
                self.pending_attach
                    .insert(process, (segment, target, reply));
                self.feed(Event::Attach {
                    segment,
                    process: ProcessId(process),
                });
            }
            Api::Detach { process, reply } => {
                let Some(a) = self.attaches.remove(&process) else {
                    let _ = reply.send(());
                    return;
                };
                // The mapping goes first: after shmdt nothing may fault on it
                // (a program unmapped its own before asking).
                if let Some(mem) = self.segs.get_mut(&a.segment) {
                    match a.local {
                        Some((base, slot)) => {
                            fault::unregister(slot);
                            let _ = mem.detach(base);
                        }
                        None => mem.detach_remote(process),
                    }
                }
                // Faulters of a detached mapping retry and find no slot
                // (the core drops their wait with the detach).
                let stale: Vec<(u32, u32)> = self
                    .waiters
                    .range((process, 0)..=(process, u32::MAX))
                    .map(|(&k, _)| k)
                    .collect();
                for k in stale {
                    for (_, w) in self.waiters.remove(&k).unwrap_or_default() {
                        w.release(fault::WAKE_RETRY, "");
                    }
                }
                self.pending_detach.insert(process, reply);
                self.detach_core(a.segment, process);
            }
            Api::SetWindow {
                segment,
                ticks,
                reply,
            } => {
                let Some(lib_pages) = self.site.library_pages(segment) else {
                    let _ = reply.send(false);
                    return;
                };
                for p in 0..lib_pages {
                    self.feed(Event::SetWindow {
                        segment,
                        page: PageNo(p),
                        ticks,
                    });
                }
                let _ = reply.send(true);
            }
            Api::Remove { segment } => self.feed(Event::Remove { segment }),
            Api::Lock { segment, on, reply } => {
                if on {
                    self.locked.insert(segment);
                } else {
                    self.locked.remove(&segment);
                }
                let r = self.segs.get(&segment).map_or(Ok(()), |m| m.set_locked(on));
                let _ = reply.send(r);
            }
            Api::Resident { segments, reply } => {
                let n = segments
                    .iter()
                    .filter_map(|s| self.segs.get(s))
                    .map(|m| m.resident_pages())
                    .sum();
                let _ = reply.send(n);
            }
            Api::TakeTrace { reply } => {
                let t = self.trace.as_mut().map(std::mem::take).unwrap_or_default();
                let _ = reply.send(t);
            }
            Api::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Api::CheckIn { reply } => {
                let _ = reply.send(self.check_in());
            }
            Api::Copy {
                process,
                page,
                at,
                len,
                write,
                reply,
            } => {
                let _ = reply.send(self.copy(process, page, at, len, write));
            }
        }
    }

    /// [`Api::Copy`]: never touches an attach mapping, so it never faults;
    /// a lost page is an error, not a SIGBUS.
    pub(crate) fn copy(
        &mut self,
        process: u32,
        page: u32,
        at: usize,
        len: usize,
        write: Option<Vec<u8>>,
    ) -> CopyAnswer {
        if self.shared.checking_in.load(Ordering::SeqCst) {
            return CopyAnswer::Error(ShmError::Os("the site daemon is stopping".into()));
        }
        let Some(a) = self.attaches.get(&process) else {
            return CopyAnswer::Error(ShmError::Invalid);
        };
        let (segment, readonly) = (a.segment, a.readonly);
        if write.is_some() && readonly {
            return CopyAnswer::Error(ShmError::Access);
        }
        let Some(mem) = self.segs.get(&segment) else {
            return CopyAnswer::Error(ShmError::Invalid);
        };
        if page as usize >= mem.pages || at + len > mem.page_bytes {
            return CopyAnswer::Error(ShmError::Invalid);
        }
        let pg = PageNo(page);
        let access = if write.is_some() {
            Access::Write
        } else {
            Access::Read
        };
        let held = self
            .site
            .page_view(segment, pg)
            .map_or(Held::Nothing, |v| v.held);
        if held.allows(access) && !mem.is_frozen() {
            return match write {
                Some(data) => {
                    mem.write_at(pg, at, &data);
                    CopyAnswer::Done(Vec::new())
                }
                None => CopyAnswer::Done(mem.page(pg)[at..at + len].to_vec()),
            };
        }
        let dead = self
            .site
            .lost_pages()
            .into_iter()
            .find(|(s, p, _)| *s == segment && *p == pg)
            .map(|(_, _, d)| d);
        if let Some(why) = self.lost.get(&(segment, pg)).cloned() {
            let site = dead.map(|d| self.shared.config.name(d).to_string());
            return CopyAnswer::Lost(site, why);
        }
        let (tx, rx) = mpsc::channel();
        self.fault_from(
            process,
            page,
            if write.is_some() {
                fault::ACCESS_WRITE
            } else {
                fault::ACCESS_READ
            },
            Waiter::Api(tx),
        );
        CopyAnswer::Retry(rx)
    }

    /// The core's view of this site, as text (`mmulab dsm status`).
    pub(crate) fn status(&self) -> super::status::SiteStatus {
        use super::status::{PeerStatus, SegmentStatus, SiteStatus};
        let cfg = &self.shared.config;
        let me = self.shared.me;
        let peers = self.shared.peers.lock().expect("peers").clone();
        let mut sites = Vec::new();
        for (i, sc) in cfg.sites.iter().enumerate() {
            let p = &peers[i];
            let mut st = PeerStatus {
                name: sc.name.clone(),
                addr: sc.addr.to_string(),
                ..Default::default()
            };
            if i == me.0 as usize {
                st.state = "this site".into();
            } else if let Some(why) = &p.dead {
                st.state = "dead".into();
                st.dead_reason = Some(why.clone());
            } else {
                st.connection = Some(
                    match &self.out[i] {
                        Some(o) if !o.is_broken() => "connected",
                        Some(_) => "connection broken",
                        None => "not dialled",
                    }
                    .into(),
                );
                match p.last_heard {
                    Some(t) => {
                        st.state = "alive".into();
                        st.heard_ms_ago = Some(t.elapsed().as_millis() as u64);
                        st.incarnation = Some(p.incarnation.unwrap_or(0));
                    }
                    None => st.state = "not heard from".into(),
                }
            }
            sites.push(st);
        }
        let mut segments = Vec::new();
        for (seg, mem) in &self.segs {
            let mut held = [0usize; 3];
            for p in 0..mem.pages as u32 {
                let h = self
                    .site
                    .page_view(*seg, PageNo(p))
                    .map_or(Held::Nothing, |v| v.held);
                held[h as usize] += 1;
            }
            let mut programs: Vec<String> = self
                .attaches
                .values()
                .filter(|a| a.segment == *seg)
                .map(|a| match &a.client {
                    Some(c) => format!("pid {}", c.pid()),
                    None => "daemon".to_string(),
                })
                .collect();
            programs.sort();
            programs.dedup();
            segments.push(SegmentStatus {
                segment: seg_name(*seg),
                library: cfg.name(seg.library).to_string(),
                pages: mem.pages,
                held_write: held[2],
                held_read: held[1],
                held_none: held[0],
                attaches: self.attaches.values().filter(|a| a.segment == *seg).count(),
                programs,
            });
        }
        // Pages the core knows lost (as library: their only current copy
        // was at a dead site; as holder: their library died), and pages
        // whose request timed out here.
        let mut lost = self.lost.clone();
        for (segment, page, site) in self.site.lost_pages() {
            lost.entry((segment, page))
                .or_insert_with(|| self.lost_reason(segment, page, site));
        }
        SiteStatus {
            site: cfg.name(me).to_string(),
            id: me.0,
            cluster: cfg.cluster_id,
            incarnation: self.shared.incarnation,
            sites,
            segments,
            lost_pages: lost.into_values().collect(),
            ..Default::default()
        }
    }

    pub(crate) fn new_process(&mut self) -> u32 {
        let p = self.next_process;
        self.next_process += 1;
        p
    }

    /// Pages an event may ship from this site's write copy.
    pub(crate) fn scope(&self, event: &Event) -> Vec<(SegmentId, PageNo)> {
        let seg_pages = |segment: SegmentId| -> Vec<(SegmentId, PageNo)> {
            let n = self.segs.get(&segment).map_or(0, |m| m.pages as u32);
            (0..n).map(|p| (segment, PageNo(p))).collect()
        };
        match event {
            Event::Fault { segment, page, .. } => vec![(*segment, *page)],
            Event::TimerFired(Timer::RetryRecall { segment, page, .. })
            | Event::TimerFired(Timer::HonourRecall { segment, page, .. }) => {
                vec![(*segment, *page)]
            }
            Event::Detach { segment, .. } => seg_pages(*segment),
            Event::Received { msg, .. } => match msg_page(msg) {
                Some(sp) => vec![sp],
                None => match msg_segment(msg) {
                    Some(s) => seg_pages(s),
                    None => Vec::new(),
                },
            },
            // A dead reader may complete an invalidation, which ships.
            Event::SiteDead { .. } => {
                let segs: Vec<SegmentId> = self.segs.keys().copied().collect();
                segs.into_iter().flat_map(seg_pages).collect()
            }
            Event::Create { .. }
            | Event::Attach { .. }
            | Event::SetWindow { .. }
            | Event::Remove { .. } => Vec::new(),
        }
    }

    /// Hands one event to the core and carries out its actions.
    pub(crate) fn feed(&mut self, event: Event) {
        let mut synced = Vec::new();
        let scope = match self.shared.options.mutation {
            RuntimeMutation::None => self.scope(&event),
            RuntimeMutation::ShipWithoutSync => Vec::new(),
        };
        for (segment, page) in scope {
            let write_held = self
                .site
                .page_view(segment, page)
                .is_some_and(|v| v.held == Held::Write);
            let Some(mem) = self.segs.get(&segment) else {
                continue;
            };
            // A frozen segment's bytes were copied into the core when the
            // clean stop began (its memory may be holes now).
            if !write_held || mem.is_frozen() {
                continue;
            }
            // Every local mapping loses the right to write, then the bytes
            // are read (issue #7).
            mem.protect(page, Held::Read);
            let bytes = mem.page(page).to_vec();
            self.site.write(segment, page, 0, &bytes);
            if let Some(t) = &mut self.trace {
                t.push(TraceEntry::Sync {
                    segment,
                    page,
                    bytes,
                });
            }
            synced.push((segment, page));
        }
        let now = self.now();
        let recorded = self.trace.is_some().then(|| event.clone());
        let actions = self.site.handle(now, event);
        self.shared
            .counters
            .local_messages
            .store(self.site.local_messages(), Ordering::Relaxed);
        if let (Some(t), Some(event)) = (&mut self.trace, recorded) {
            t.push(TraceEntry::Event {
                now,
                event,
                actions: actions.clone(),
            });
        }
        // Rights are *reduced* at once, in the core's order (so an ack or
        // a page leaves only after every local mapping lost the right),
        // but *granted* only once the whole batch is done, from the core's
        // final state, and sleepers are woken last. Granting at each
        // `Install` would let a thread write a page that a later action of
        // the same batch ships (an install that replays a deferred recall):
        // that write would be lost (caught by the concurrent test).
        let mut touched = synced;
        let mut wakes = Vec::new();
        for a in actions {
            match a {
                Action::Install {
                    segment,
                    page,
                    bytes,
                    ..
                } => {
                    let mem = self
                        .segs
                        .get_mut(&segment)
                        .expect("installed page of a mapped segment");
                    if let Some(b) = bytes {
                        mem.prepare_install(page);
                        mem.write_page(page, &b);
                    }
                    // A late answer: the page is here after all.
                    self.lost.remove(&(segment, page));
                    touched.push((segment, page));
                }
                Action::Wake { process, page, .. } => wakes.push((process.0, page.0)),
                other => self.carry_out(other),
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for (segment, page) in touched {
            let held = self
                .site
                .page_view(segment, page)
                .map_or(Held::Nothing, |v| v.held);
            if let Some(mem) = self.segs.get(&segment) {
                mem.protect(page, held);
            }
        }
        for key in wakes {
            if let Some(words) = self.waiters.remove(&key) {
                for (_, w) in words {
                    w.release(fault::WAKE_RETRY, "");
                }
            }
        }
    }

    pub(crate) fn carry_out(&mut self, action: Action) {
        match action {
            Action::Send { to, msg } => self.send_frame(to, Frame::Core(msg)),
            Action::Install { .. } | Action::Wake { .. } => {
                unreachable!("installs and wakes are carried out by feed")
            }
            Action::Invalidate { segment, page } => {
                if let Some(mem) = self.segs.get(&segment) {
                    mem.protect(page, Held::Nothing);
                }
            }
            Action::Downgrade { segment, page } => {
                if let Some(mem) = self.segs.get(&segment) {
                    mem.protect(page, Held::Read);
                }
            }
            Action::SetTimer { at, timer } => {
                self.timer_seq += 1;
                self.timers.insert((at, self.timer_seq), timer);
                self.shared.send(Input::Nudge);
            }
            Action::Log(_) => {}
            Action::Fail {
                process,
                segment,
                page,
                site,
            } => {
                let why = self.lost_reason(segment, page, site);
                eprintln!(
                    "mmulab dsm site {}: lost: {why}",
                    self.shared.config.name(self.shared.me)
                );
                for (_, w) in self
                    .waiters
                    .remove(&(process.0, page.0))
                    .unwrap_or_default()
                {
                    w.release(fault::WAKE_FAIL, &why);
                }
                self.lost.insert((segment, page), why);
            }
            Action::PeerError { site, reason } => {
                self.shared.log_drop(format!(
                    "site {}: dropped: protocol: {reason}",
                    self.shared.config.name(site)
                ));
                self.refused_from.push(site);
            }
            Action::Created { segment, process } => {
                self.created.insert(segment);
                if let Some(r) = self.pending_create.remove(&process.0) {
                    let _ = r.send(segment);
                }
            }
            Action::Attached {
                segment,
                process,
                geometry,
            } => self.attached(segment, process.0, geometry),
            Action::Detached { process, .. } => {
                if let Some(r) = self.pending_detach.remove(&process.0) {
                    let _ = r.send(());
                }
            }
            Action::Destroyed { segment } => {
                // Its key is free again, and so is its id on this site.
                self.dir.retain(|_, (s, _)| *s != segment);
                self.locked.remove(&segment);
                self.shared
                    .destroyed
                    .lock()
                    .expect("destroyed")
                    .push(segment);
                // An attach that raced the last detach finds no segment
                // (Mirage: the last detach destroys it, §2.2).
                let gone: Vec<u32> = self
                    .pending_attach
                    .iter()
                    .filter(|(_, p)| p.0 == segment)
                    .map(|(&k, _)| k)
                    .collect();
                for k in gone {
                    if let Some(p) = self.pending_attach.remove(&k) {
                        let _ = p.2.send(Err(ShmError::Removed));
                    }
                }
                if self
                    .segs
                    .get(&segment)
                    .is_some_and(|m| m.attach_count() == 0)
                {
                    self.segs.remove(&segment);
                }
            }
        }
    }

    pub(crate) fn attached(&mut self, segment: SegmentId, process: u32, geometry: Geometry) {
        let Some((_, target, reply)) = self.pending_attach.remove(&process) else {
            return;
        };
        let readonly = target.readonly();
        let result = (|| -> Result<(usize, u32, Geometry), ShmError> {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.segs.entry(segment) {
                let name = format!("mmulab-dsm-{}-{}", segment.library.0, segment.serial);
                let mem = SegmentMemory::new(
                    &name,
                    geometry.pages as usize,
                    geometry.page_bytes as usize,
                    self.shared.uffd.clone(),
                )
                .map_err(|e| ShmError::Os(format!("memfd: {e}")))?;
                if self.locked.contains(&segment) {
                    mem.set_locked(true)
                        .map_err(|e| ShmError::Os(format!("SHM_LOCK: mlock: {e}")))?;
                }
                slot.insert(mem);
            }
            let mem = self.segs.get_mut(&segment).expect("just made");
            let addr = match &target {
                AttachTarget::Local { addr, .. } => *addr,
                AttachTarget::Remote {
                    client, req, uffd, ..
                } => {
                    // The answer and the memfd first, then the present
                    // protections: the program's service thread maps the
                    // segment before it reads them.
                    let mut m = proto::LocalMsg::new(proto::kind::ATTACH_OK);
                    m.id = *req;
                    m.a = process as u64;
                    m.b = mem.len() as u64;
                    m.c = readonly as u64;
                    let fd = mem
                        .share(readonly)
                        .map_err(|e| ShmError::Os(format!("memfd: {e}")))?;
                    if !client.send_fd(&m, rustix::fd::AsFd::as_fd(&fd)) {
                        return Err(ShmError::Os("the program's socket is closed".into()));
                    }
                    let faults = if *uffd {
                        RemoteFaults::UffdPending
                    } else {
                        RemoteFaults::Mprotect
                    };
                    mem.attach_remote(client.clone(), process, readonly, faults)
                        .map_err(|e| ShmError::Os(format!("punch: {e}")))?;
                    if !*uffd {
                        mem.send_protections(client, process, readonly);
                    }
                    client.processes.lock().expect("processes").insert(process);
                    self.attaches.insert(
                        process,
                        AttachInfo {
                            segment,
                            local: None,
                            client: Some(client.clone()),
                            readonly,
                        },
                    );
                    return Ok((0, process, geometry));
                }
            };
            let base = mem.attach(addr, readonly).map_err(|e| {
                if e.raw_os_error() == Some(libc::EEXIST) {
                    ShmError::Invalid
                } else {
                    ShmError::Os(format!("mmap: {e}"))
                }
            })?;
            let len = mem.len();
            // `attach` gave the new mapping the protections of the others,
            // which follow the core's view of every page.
            // The SIGSEGV table serves the mprotect path (on the
            // userfaultfd path the kernel never raises SIGSEGV there).
            let slot = fault::register(base, len, process, self.fault_pipe_w.as_raw_fd());
            self.attaches.insert(
                process,
                AttachInfo {
                    segment,
                    local: Some((base, slot)),
                    client: None,
                    readonly,
                },
            );
            Ok((base, process, geometry))
        })();
        if result.is_err() {
            // Undo the core's attach so that its books stay right.
            self.pending_detach.insert(process, mpsc::channel().0);
            self.feed(Event::Detach {
                segment,
                process: ProcessId(process),
            });
        }
        let _ = reply.send(result);
    }
}
