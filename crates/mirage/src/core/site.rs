//! The `Site`: one machine's share of the protocol. It plays two roles, as
//! in Mirage: the *library* of the segments it created (library.rs) and the
//! *holder* of page copies, possibly the clock site (holder.rs). It takes
//! an event and the current time and returns actions; it never blocks,
//! never reads a clock and never touches I/O.

use super::types::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One entry of the auxiliary page table (Table 2): reader mask, writer,
/// window ticks and install time, plus what the protocol needs to run.
/// There is one table per segment per site (§6.2).
#[derive(Clone, Debug, Default)]
pub struct AuxPte {
    pub held: Held,
    /// The page contents while a copy is held here.
    pub bytes: Vec<u8>,
    /// This site is the page's clock site (§6): the writer, or the chosen reader.
    pub is_clock: bool,
    /// Table 2's reader mask, kept by the clock site: the *other* readers.
    pub readers: BTreeMap<SiteId, u64>,
    /// Δ granted with the copy held here (Table 2's "window ticks").
    pub window_ticks: u32,
    /// Table 2's "install time". A downgrade resets it: the read set the
    /// downgraded writer heads is granted the page then, and its Δ runs
    /// from that grant (`holder.rs`, optimization 2).
    pub install_time: Nanos,
    /// Epoch of the grant that installed the copy (orders messages that
    /// travel on different virtual circuits).
    pub epoch: u64,
    /// A request of ours queued at the library, if any.
    pub(crate) pending: Option<Access>,
    /// Processes sleeping on this page, with what they need.
    pub(crate) waiters: Vec<(ProcessId, Access)>,
    /// Messages that overtook the grant they refer to.
    pub(crate) deferred: Vec<(SiteId, Msg)>,
    /// §7.1 option: an invalidation queued until Δ expires.
    pub(crate) honour: Option<Msg>,
    /// Invalidation acknowledgements the clock site still waits for.
    pub(crate) collecting: Option<Collecting>,
    /// The latest recall op this site accepted as clock site: a recall
    /// with an op not above it is a duplicate.
    pub(crate) last_op: u64,
    /// The page is lost (its only current copy was at this dead site):
    /// a fault needing more than what is held here fails.
    pub lost: Option<SiteId>,
}

#[derive(Clone, Debug)]
pub(crate) struct Collecting {
    pub op: u64,
    pub want: Want,
    pub grant_epoch: u64,
    pub window_ticks: u32,
    pub acks_left: BTreeSet<SiteId>,
    /// The readers before the invalidation (to decide upgrade vs page copy).
    pub old_readers: BTreeSet<SiteId>,
}

/// A segment as seen from one site.
#[derive(Clone, Debug)]
pub(crate) struct SiteSegment {
    pub geometry: Option<Geometry>,
    pub processes: BTreeSet<ProcessId>,
    pub attach_waiters: Vec<ProcessId>,
    pub detach_waiter: Option<ProcessId>,
    /// The last process detached while a request of this site was still
    /// unanswered: `Detach` leaves once every grant is in.
    pub detach_pending: bool,
    pub pages: Vec<AuxPte>,
}

/// Snapshot of one page's holder state, for drivers and checkers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageView {
    pub held: Held,
    pub is_clock: bool,
    pub install_time: Nanos,
    pub window_ticks: u32,
    pub epoch: u64,
}

pub struct Site {
    pub(crate) id: SiteId,
    pub(crate) peers: Vec<SiteId>,
    pub(crate) config: CoreConfig,
    pub(crate) now: Nanos,
    pub(crate) next_serial: u32,
    pub(crate) segments: BTreeMap<SegmentId, SiteSegment>,
    pub(crate) libraries: BTreeMap<SegmentId, super::library::LibrarySegment>,
    /// Messages addressed to this site itself (a colocated library).
    pub(crate) local: VecDeque<Msg>,
    /// How many messages went through `local` so far (a count only: the
    /// bench's messages per cycle, fleisch89 §7.2 counts them too).
    pub(crate) local_sent: u64,
    pub(crate) actions: Vec<Action>,
}

impl Site {
    /// `peers` lists every site of the network (destruction is announced
    /// to all of them, §2.2).
    pub fn new(id: SiteId, peers: Vec<SiteId>, config: CoreConfig) -> Site {
        Site {
            id,
            peers,
            config,
            now: Nanos(0),
            next_serial: 0,
            segments: BTreeMap::new(),
            libraries: BTreeMap::new(),
            local: VecDeque::new(),
            local_sent: 0,
            actions: Vec::new(),
        }
    }

    pub fn id(&self) -> SiteId {
        self.id
    }

    /// Messages this site sent to itself (a colocated library and
    /// holder), which never reach the wire.
    pub fn local_messages(&self) -> u64 {
        self.local_sent
    }

    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    /// Handles one event at time `now` and returns what to do.
    pub fn handle(&mut self, now: Nanos, event: Event) -> Vec<Action> {
        assert!(now >= self.now, "time went backwards at {:?}", self.id);
        self.now = now;
        match event {
            Event::Create { geometry, process } => self.create(geometry, process),
            Event::Attach { segment, process } => self.attach(segment, process),
            Event::Detach { segment, process } => self.detach(segment, process),
            Event::Fault {
                segment,
                page,
                process,
                access,
            } => self.fault(segment, page, process, access),
            Event::Received { from, msg } => self.receive(from, msg),
            Event::TimerFired(timer) => self.timer(timer),
            Event::SetWindow {
                segment,
                page,
                ticks,
            } => self.set_window(segment, page, ticks),
            Event::SiteDead { site } => self.site_dead(site),
            Event::Remove { segment } => self.send(segment.library, Msg::Remove { segment }),
        }
        // A colocated library and holder talk through the local queue, so
        // that the protocol is written once whatever the placement.
        while let Some(msg) = self.local.pop_front() {
            self.receive(self.id, msg);
        }
        std::mem::take(&mut self.actions)
    }

    pub(crate) fn send(&mut self, to: SiteId, msg: Msg) {
        if to == self.id {
            self.local_sent += 1;
            self.local.push_back(msg);
        } else {
            self.actions.push(Action::Send { to, msg });
        }
    }

    /// A message from a peer. Whatever the peer sends, the core never
    /// panics: a message it cannot accept is answered by
    /// `Action::PeerError` and has no other effect.
    fn receive(&mut self, from: SiteId, msg: Msg) {
        let kind = msg.kind();
        if let Err(reason) = self.receive_checked(from, msg) {
            self.peer_error(from, format!("{kind}: {reason}"));
        }
    }

    pub(crate) fn peer_error(&mut self, site: SiteId, reason: String) {
        self.actions.push(Action::PeerError { site, reason });
    }

    /// Whether `s` is a site of this network.
    pub(crate) fn known_site(&self, s: SiteId) -> bool {
        self.peers.contains(&s)
    }

    fn receive_checked(&mut self, from: SiteId, msg: Msg) -> Result<(), String> {
        match msg {
            Msg::Request {
                segment,
                page,
                access,
                process,
            } => self.lib_request(from, segment, page, access, process),
            Msg::Refused {
                segment,
                page,
                op,
                ticks_left,
            } => self.lib_refused(from, segment, page, op, ticks_left),
            Msg::Done { segment, page, op } => self.lib_done_msg(from, segment, page, op),
            Msg::CheckedIn {
                segment,
                page,
                op,
                bytes,
            } => self.lib_checked_in(from, segment, page, op, bytes),
            Msg::Attach { segment } => self.lib_attach(from, segment),
            Msg::Detach { segment } => self.lib_detach(from, segment),
            Msg::Remove { segment } => self.lib_remove(segment),
            other => self.holder_receive(from, other),
        }
    }

    /// The driver declared `site` dead. Never this site itself.
    fn site_dead(&mut self, site: SiteId) {
        if site == self.id || !self.known_site(site) {
            return;
        }
        self.lib_site_dead(site);
        self.holder_site_dead(site);
    }

    fn timer(&mut self, timer: Timer) {
        match timer {
            Timer::RetryRecall { segment, page, op } => self.lib_retry(segment, page, op),
            Timer::HonourRecall { segment, page, op } => self.holder_honour(segment, page, op),
        }
    }

    /// Holder view of a page, if the segment is known here.
    pub fn page_view(&self, segment: SegmentId, page: PageNo) -> Option<PageView> {
        let aux = self.segments.get(&segment)?.pages.get(page.0 as usize)?;
        Some(PageView {
            held: aux.held,
            is_clock: aux.is_clock,
            install_time: aux.install_time,
            window_ticks: aux.window_ticks,
            epoch: aux.epoch,
        })
    }

    /// The whole protocol state of this site, as text: equal digests,
    /// equal states (tests check that a refused message changed nothing).
    #[doc(hidden)]
    pub fn state_digest(&self) -> String {
        format!(
            "{:?} {:?} {:?} {:?}",
            self.segments, self.libraries, self.local, self.next_serial
        )
    }

    /// Pages this site knows to be lost, as library or holder, with the
    /// dead site that held their only current copy.
    pub fn lost_pages(&self) -> Vec<(SegmentId, PageNo, SiteId)> {
        let mut v: Vec<(SegmentId, PageNo, SiteId)> = self
            .libraries
            .iter()
            .flat_map(|(s, l)| l.lost_pages().map(move |(p, d)| (*s, p, d)))
            .collect();
        for (s, seg) in &self.segments {
            for (i, aux) in seg.pages.iter().enumerate() {
                if let Some(d) = aux.lost {
                    v.push((*s, PageNo(i as u32), d));
                }
            }
        }
        v.sort_unstable();
        v.dedup_by_key(|(s, p, _)| (*s, *p));
        v
    }

    /// Reads bytes of a page held here (the driver's memory access).
    pub fn read(&self, segment: SegmentId, page: PageNo, offset: usize, len: usize) -> &[u8] {
        let aux = &self.segments[&segment].pages[page.0 as usize];
        assert!(
            aux.held.allows(Access::Read),
            "{:?} reads {page:?} without a copy",
            self.id
        );
        &aux.bytes[offset..offset + len]
    }

    /// Writes bytes of a page held writable here.
    pub fn write(&mut self, segment: SegmentId, page: PageNo, offset: usize, data: &[u8]) {
        let id = self.id;
        let aux = &mut self
            .segments
            .get_mut(&segment)
            .expect("segment attached")
            .pages[page.0 as usize];
        assert!(
            aux.held == Held::Write,
            "{id:?} writes {page:?} without the write copy"
        );
        aux.bytes[offset..offset + data.len()].copy_from_slice(data);
    }

    /// Whether the segment is attached (by at least one process) here.
    pub fn is_attached(&self, segment: SegmentId) -> bool {
        self.segments
            .get(&segment)
            .is_some_and(|s| s.geometry.is_some() && !s.processes.is_empty())
    }

    /// The library's request log for a segment created here (§9).
    pub fn request_log(&self, segment: SegmentId) -> &[LogEntry] {
        self.libraries.get(&segment).map_or(&[], |l| &l.log)
    }

    /// The number of pages of a live segment whose library is this site
    /// (the real runtime checks a per-segment Δ change against it).
    pub fn library_pages(&self, segment: SegmentId) -> Option<u32> {
        self.libraries.get(&segment).map(|l| l.pages_len())
    }

    /// Whether every page of every library here is idle (no queued or
    /// in-flight request): the liveness checkers' quiescence test.
    pub fn library_idle(&self) -> bool {
        self.libraries.values().all(|l| l.idle())
    }
}
