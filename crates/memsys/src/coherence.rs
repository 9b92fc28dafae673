//! MOSI (Table 1) and MOESI (§5.3.1) stable-state protocols, as data.
//!
//! UNITD leaves the cache protocol unchanged (§5.3.1): the tables below are
//! the ordinary L1 controller's. TLBs are not rows here: a TLB entry is only
//! S or I, kept in its Valid bit (§4), and is handled by the PCAM.
//!
//! Transactions are atomic (the memory system serialises them), so there are
//! no transient states.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[repr(u8)]
pub enum State {
    I = 0,
    S = 1,
    E = 2,
    O = 3,
    M = 4,
}

impl State {
    pub const ALL: [State; 5] = [State::I, State::S, State::E, State::O, State::M];

    /// The copy may be written without a request (M, or E silently).
    pub fn exclusive(self) -> bool {
        matches!(self, State::M | State::E)
    }
    /// The copy is newer than the L2 (must be written back on eviction).
    pub fn dirty(self) -> bool {
        matches!(self, State::M | State::O)
    }
    /// The copy supplies data to other caches.
    pub fn owner(self) -> bool {
        matches!(self, State::M | State::O | State::E)
    }
}

/// What a cache sees: its own core's accesses and forwarded requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[repr(u8)]
pub enum Event {
    /// Load, instruction fetch or page-walk load (§5.2: a walk is a load).
    Load = 0,
    /// A load miss answered "no other copy" (MOESI only; §5.3.1: a PCAM
    /// holding the block answers shared, so no E then).
    LoadExclusive = 1,
    Store = 2,
    /// Another cache's read request (GetS) forwarded here.
    FwdGetS = 3,
    /// Another cache's ownership request (GetM / upgrade) forwarded here.
    FwdGetM = 4,
    /// Replacement or L2 recall.
    Evict = 5,
}

impl Event {
    pub const ALL: [Event; 6] = [
        Event::Load,
        Event::LoadExclusive,
        Event::Store,
        Event::FwdGetS,
        Event::FwdGetM,
        Event::Evict,
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Action {
    /// Served locally.
    Hit,
    /// Read miss: issue GetS.
    GetS,
    /// Write miss: issue GetM (data and ownership).
    GetM,
    /// Write to a readable copy: issue an ownership request, no data needed.
    Upgrade,
    /// Forwarded request: send the data (and keep or drop the copy).
    Supply,
    /// Forwarded invalidation of a clean copy: acknowledge.
    Ack,
    /// Eviction of a dirty/owned copy: write it back.
    Writeback,
    /// Nothing to do (silent clean eviction, request for an absent copy, …).
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Transition {
    pub next: State,
    pub action: Action,
}

const fn t(next: State, action: Action) -> Option<Transition> {
    Some(Transition { next, action })
}

use Action as A;
use State as St;

/// MOSI: rows I, S, E (absent), O, M; columns as `Event`.
/// `LoadExclusive` behaves as `Load` (MOSI has no E).
pub const MOSI: [[Option<Transition>; 6]; 5] = [
    // I
    [
        t(St::S, A::GetS),
        t(St::S, A::GetS),
        t(St::M, A::GetM),
        t(St::I, A::None),
        t(St::I, A::None),
        t(St::I, A::None),
    ],
    // S
    [
        t(St::S, A::Hit),
        t(St::S, A::Hit),
        t(St::M, A::Upgrade),
        t(St::S, A::None),
        t(St::I, A::Ack),
        t(St::I, A::None),
    ],
    // E: not a MOSI state
    [None, None, None, None, None, None],
    // O
    [
        t(St::O, A::Hit),
        t(St::O, A::Hit),
        t(St::M, A::Upgrade),
        t(St::O, A::Supply),
        t(St::I, A::Supply),
        t(St::I, A::Writeback),
    ],
    // M
    [
        t(St::M, A::Hit),
        t(St::M, A::Hit),
        t(St::M, A::Hit),
        t(St::O, A::Supply),
        t(St::I, A::Supply),
        t(St::I, A::Writeback),
    ],
];

/// MOESI: MOSI plus E, granted on a load miss with no other copy anywhere,
/// caches or PCAMs (§5.3.1). E → M on a store is silent; E is clean.
pub const MOESI: [[Option<Transition>; 6]; 5] = [
    // I
    [
        t(St::S, A::GetS),
        t(St::E, A::GetS),
        t(St::M, A::GetM),
        t(St::I, A::None),
        t(St::I, A::None),
        t(St::I, A::None),
    ],
    // S
    MOSI[1],
    // E
    [
        t(St::E, A::Hit),
        t(St::E, A::Hit),
        t(St::M, A::Hit),
        t(St::S, A::Supply),
        t(St::I, A::Supply),
        t(St::I, A::None),
    ],
    // O
    MOSI[3],
    // M
    MOSI[4],
];

/// The table for `protocol`.
pub fn table(protocol: crate::config::Protocol) -> &'static [[Option<Transition>; 6]; 5] {
    match protocol {
        crate::config::Protocol::Mosi => &MOSI,
        crate::config::Protocol::Moesi => &MOESI,
    }
}

/// One lookup; `None` for a state the protocol does not have.
#[inline]
pub fn transition(
    protocol: crate::config::Protocol,
    state: State,
    event: Event,
) -> Option<Transition> {
    table(protocol)[state as usize][event as usize]
}
