//! Identifiers, time values, configuration and the wire messages of the
//! Mirage protocol. Everything here is plain data: serializable (postcard
//! over TCP in the real runtime) and free of simulation concepts.

use serde::{Deserialize, Serialize};

/// A network site (a machine). Sites, not processes, are the protocol's
/// unit: processes on one site share that site's copy of a page (§6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SiteId(pub u16);

/// A process on a site; only used to wake it and to log its requests (§9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProcessId(pub u32);

/// A page index inside a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PageNo(pub u32);

/// A segment names its library site (the creating site, §6), so any site
/// that holds the id knows where to send requests without a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SegmentId {
    pub library: SiteId,
    pub serial: u32,
}

/// A point in real (wall-clock) time, in nanoseconds, passed in by the
/// driver. Δ is measured in real time, not process time (§9).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Nanos(pub u64);

/// What a fault or a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Access {
    Read,
    Write,
}

/// What a site currently holds of a page.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum Held {
    #[default]
    Nothing,
    Read,
    Write,
}

impl Held {
    pub fn allows(self, access: Access) -> bool {
        matches!(
            (self, access),
            (Held::Write, _) | (Held::Read, Access::Read)
        )
    }
}

/// Deliberately broken variants, for negative controls only. The default,
/// `None`, is the protocol of the paper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    #[default]
    None,
    /// The clock site grants a write before the other readers have
    /// acknowledged their invalidation (breaks single-writer, §6.1).
    AcksNotAwaited,
    /// The clock site skips the Δ check when the incoming request is a
    /// write (breaks the Δ guarantee of §6.1).
    SkipDeltaCheckOnWrite,
}

/// Dynamic Δ (§8, last paragraph): the library changes a page's Δ with the
/// invalidation and the new value travels with the page. Mirage shipped
/// with it disabled, so `Off` is the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DynamicDelta {
    #[default]
    Off,
    /// Halve the page's Δ (not below `min_ticks`) each time an invalidation
    /// is refused — contention — and restore the segment's Δ when one is
    /// honoured at the first attempt.
    HalveOnRefusal { min_ticks: u32 },
}

/// When a segment dies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lifetime {
    /// fleisch89 §2.2: "the last detach of a segment destroys it", on any
    /// site, whether or not it was removed. The simulator's reproduction
    /// keeps this rule.
    #[default]
    LastDetach,
    /// System V as Linux gives it: a segment lives until it was removed
    /// (`IPC_RMID`, [`Event::Remove`]) *and* no site has it attached; with
    /// nothing attached it keeps its pages at the library.
    RemovedAndDetached,
}

/// Per-site protocol configuration. Every default is written here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoreConfig {
    /// Length of one clock tick. Δ is counted in ticks; the VAX preset uses
    /// 1/60 s (an inference, see `sim::preset`).
    pub tick_ns: u64,
    /// §7.1's improvement: when less than this is left of Δ, the clock site
    /// queues the invalidation and honours it at expiry instead of refusing.
    /// `None` (off) in the VAX preset: the paper measured without it.
    pub honour_within_ns: Option<u64>,
    pub dynamic_delta: DynamicDelta,
    pub mutation: Mutation,
    /// When a segment dies: fleisch89's last detach by default.
    #[serde(default)]
    pub lifetime: Lifetime,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            tick_ns: 1_000_000_000 / 60,
            honour_within_ns: None,
            dynamic_delta: DynamicDelta::Off,
            mutation: Mutation::None,
            lifetime: Lifetime::LastDetach,
        }
    }
}

/// The geometry of a segment, fixed at creation (§2.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub name: String,
    pub pages: u32,
    pub page_bytes: u32,
    /// Δ, uniform per segment by default (§8); per-page values live in the
    /// library's table and travel with each grant.
    pub window_ticks: u32,
}

/// What the library asks of the clock site (§6.1, Table 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Want {
    /// Grant read copies to these sites.
    Read(Vec<SiteId>),
    /// Grant the single write copy to this site.
    Write(SiteId),
    /// Return the page to the library (the clock site is detaching).
    CheckIn,
}

/// A timer the core asked the driver to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Timer {
    /// The library retries a refused invalidation (§6.1).
    RetryRecall {
        segment: SegmentId,
        page: PageNo,
        op: u64,
    },
    /// The clock site honours a queued invalidation at Δ's expiry (§7.1 option).
    HonourRecall {
        segment: SegmentId,
        page: PageNo,
        op: u64,
    },
}

/// One entry of the library's request log (§9).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub segment: SegmentId,
    pub page: PageNo,
    pub time: Nanos,
    pub site: SiteId,
    pub process: ProcessId,
    pub access: Access,
}

/// A reader in a clock site's mask, with the epoch of its grant (so that an
/// invalidation that overtakes the grant on another virtual circuit waits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Reader {
    pub site: SiteId,
    pub epoch: u64,
}

/// The protocol's messages. Each is self-contained: page bytes travel as
/// `Vec<u8>`. `epoch_min` fields make a receiver defer a message that
/// overtook the grant it refers to (messages are FIFO per pair of sites,
/// as on Locus's virtual circuits, §7.1, but not across pairs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Msg {
    /// A faulting site asks the library for a page (§6.1).
    Request {
        segment: SegmentId,
        page: PageNo,
        access: Access,
        process: ProcessId,
    },
    /// Library to clock site: invalidate, downgrade or add readers (§6.1).
    /// `grant_epoch` is the epoch the resulting grant carries; `window_ticks`
    /// the Δ it carries (dynamic Δ changes it here, §8).
    Recall {
        segment: SegmentId,
        page: PageNo,
        op: u64,
        want: Want,
        epoch_min: u64,
        grant_epoch: u64,
        window_ticks: u32,
    },
    /// Clock site to library: Δ has not expired, retry after this many ticks.
    Refused {
        segment: SegmentId,
        page: PageNo,
        op: u64,
        ticks_left: u32,
    },
    /// Clock site to library: the recall is complete.
    Done {
        segment: SegmentId,
        page: PageNo,
        op: u64,
    },
    /// Clock site to another reader: drop your copy (point to point, §7.1).
    Invalidate {
        segment: SegmentId,
        page: PageNo,
        op: u64,
        epoch_min: u64,
    },
    /// Reader to clock site.
    InvalidateAck {
        segment: SegmentId,
        page: PageNo,
        op: u64,
    },
    /// A page copy, sent directly to the requester (§6).
    Page {
        segment: SegmentId,
        page: PageNo,
        op: u64,
        epoch: u64,
        access: Access,
        bytes: Vec<u8>,
        window_ticks: u32,
        /// `Some` when the receiver becomes the clock site of a read set.
        clock_of: Option<Vec<Reader>>,
    },
    /// Optimization 1 (§6.1): a reader becomes writer without a page copy.
    Upgrade {
        segment: SegmentId,
        page: PageNo,
        op: u64,
        epoch: u64,
        window_ticks: u32,
    },
    /// The clock site returns the page to the library (detach).
    CheckedIn {
        segment: SegmentId,
        page: PageNo,
        op: u64,
        bytes: Vec<u8>,
    },
    /// Library to clock site: a non-clock reader left (detach, death).
    /// `reader_epoch` is the epoch of the reader's grant: a reader granted
    /// again since is not forgotten.
    ForgetReader {
        segment: SegmentId,
        page: PageNo,
        site: SiteId,
        reader_epoch: u64,
        epoch_min: u64,
    },
    Attach {
        segment: SegmentId,
    },
    AttachOk {
        segment: SegmentId,
        geometry: Geometry,
    },
    Detach {
        segment: SegmentId,
    },
    DetachOk {
        segment: SegmentId,
    },
    /// The last detach destroyed the segment (§2.2); sent to every site.
    Destroyed {
        segment: SegmentId,
    },
    /// A site to the library: the segment was removed (`IPC_RMID`); under
    /// [`Lifetime::RemovedAndDetached`] it dies once no site has it
    /// attached. Not part of fleisch89 (its segments die at the last
    /// detach); appended last so that earlier encodings are unchanged.
    Remove {
        segment: SegmentId,
    },
    /// Library to a requester: the page is lost, its only current copy
    /// was at `site`, declared dead (coherence before availability).
    Lost {
        segment: SegmentId,
        page: PageNo,
        site: SiteId,
    },
    /// Library to a surviving reader: the clock site died, this reader is
    /// the page's clock site now, with these other readers.
    ClockMoved {
        segment: SegmentId,
        page: PageNo,
        readers: Vec<Reader>,
        epoch_min: u64,
    },
}

impl Msg {
    /// Whether the message carries a page (the paper's "large" messages).
    pub fn carries_page(&self) -> bool {
        matches!(self, Msg::Page { .. } | Msg::CheckedIn { .. })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Msg::Request {
                access: Access::Read,
                ..
            } => "read-request",
            Msg::Request {
                access: Access::Write,
                ..
            } => "write-request",
            Msg::Recall {
                want: Want::Read(_),
                ..
            } => "recall-for-read",
            Msg::Recall {
                want: Want::Write(_),
                ..
            } => "recall-for-write",
            Msg::Recall {
                want: Want::CheckIn,
                ..
            } => "recall-check-in",
            Msg::Refused { .. } => "refused",
            Msg::Done { .. } => "done",
            Msg::Invalidate { .. } => "invalidate",
            Msg::InvalidateAck { .. } => "invalidate-ack",
            Msg::Page {
                access: Access::Read,
                ..
            } => "page-ro",
            Msg::Page {
                access: Access::Write,
                ..
            } => "page-rw",
            Msg::Upgrade { .. } => "upgrade",
            Msg::CheckedIn { .. } => "checked-in",
            Msg::ForgetReader { .. } => "forget-reader",
            Msg::Attach { .. } => "attach",
            Msg::AttachOk { .. } => "attach-ok",
            Msg::Detach { .. } => "detach",
            Msg::DetachOk { .. } => "detach-ok",
            Msg::Destroyed { .. } => "destroyed",
            Msg::Lost { .. } => "lost",
            Msg::ClockMoved { .. } => "clock-moved",
            Msg::Remove { .. } => "remove",
        }
    }
}

/// What drives the core.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// Create a segment; this site becomes its library (§6).
    Create {
        geometry: Geometry,
        process: ProcessId,
    },
    /// A process attaches (the driver resolved the name to the id).
    Attach {
        segment: SegmentId,
        process: ProcessId,
    },
    Detach {
        segment: SegmentId,
        process: ProcessId,
    },
    /// A typed page fault (§6.2: the fault type is read from the hardware).
    Fault {
        segment: SegmentId,
        page: PageNo,
        process: ProcessId,
        access: Access,
    },
    Received {
        from: SiteId,
        msg: Msg,
    },
    TimerFired(Timer),
    /// Change one page's Δ at the library (per-page Δ, §8).
    SetWindow {
        segment: SegmentId,
        page: PageNo,
        ticks: u32,
    },
    /// The driver declared a peer dead (heartbeat silence, connection
    /// loss). Pages whose only current copy was there are lost at once.
    SiteDead {
        site: SiteId,
    },
    /// `IPC_RMID`: the segment dies once no site has it attached (under
    /// [`Lifetime::RemovedAndDetached`]; under fleisch89's rule the last
    /// detach destroys it anyway and this changes nothing).
    Remove {
        segment: SegmentId,
    },
}

/// What the driver must carry out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Send {
        to: SiteId,
        msg: Msg,
    },
    /// Map the page read-only or read-write; `bytes` is `None` for an
    /// upgrade in place (the page is already there).
    Install {
        segment: SegmentId,
        page: PageNo,
        access: Access,
        bytes: Option<Vec<u8>>,
    },
    /// Unmap and discard the page for all processes of this site.
    Invalidate {
        segment: SegmentId,
        page: PageNo,
    },
    /// Write-protect the page, keeping read access (optimization 2).
    Downgrade {
        segment: SegmentId,
        page: PageNo,
    },
    /// The faulting process may run again (it slept as on I/O, §6.1).
    Wake {
        process: ProcessId,
        segment: SegmentId,
        page: PageNo,
    },
    SetTimer {
        at: Nanos,
        timer: Timer,
    },
    Log(LogEntry),
    Created {
        segment: SegmentId,
        process: ProcessId,
    },
    Attached {
        segment: SegmentId,
        process: ProcessId,
        geometry: Geometry,
    },
    Detached {
        segment: SegmentId,
        process: ProcessId,
    },
    /// The segment no longer exists at this site.
    Destroyed {
        segment: SegmentId,
    },
    /// A sleeping faulter's page is lost: its only current copy was at
    /// `site`, declared dead. The fault fails (SIGBUS, or an error from
    /// the Rust API); it is never answered with an older copy.
    Fail {
        process: ProcessId,
        segment: SegmentId,
        page: PageNo,
        site: SiteId,
    },
    /// A peer sent a message this site cannot accept (unknown segment or
    /// page, a kind unexpected for the role, a stale or duplicate answer).
    /// The message had no effect: the driver logs the peer and drops it.
    PeerError {
        site: SiteId,
        reason: String,
    },
}
