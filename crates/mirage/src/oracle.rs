//! The DSM oracle (DESIGN.md: "Mirage's claim is coherence: a read returns
//! the last value written; the DSM oracle checks it per page version").
//!
//! It is a checker separate from the protocol: it sees only what processes
//! read and write and what each site holds, never the protocol's messages.
//! Three claims are checked:
//! - coherence (§5): every read returns the last value written to the word;
//! - single writer / multiple readers (§6): at every instant, a page has at
//!   most one site holding it writable, and then no other site holds it;
//! - the Δ guarantee (§6.1): the clock site gives up or downgrades its copy
//!   only after Δ ticks since its install time (except on detach).

use crate::core::{Held, Nanos, PageNo, SegmentId, Site, SiteId};
use std::collections::BTreeMap;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    StaleRead {
        site: SiteId,
        page: PageNo,
        word: usize,
        got: u64,
        expected: u64,
        time: Nanos,
    },
    TwoWriters {
        page: PageNo,
        sites: Vec<SiteId>,
        time: Nanos,
    },
    ReaderBesideWriter {
        page: PageNo,
        writer: SiteId,
        reader: SiteId,
        time: Nanos,
    },
    DeltaBroken {
        site: SiteId,
        page: PageNo,
        elapsed_ticks: u64,
        window_ticks: u32,
        time: Nanos,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Per page: its version (number of writes) and the value of each word.
#[derive(Clone, Debug, Default)]
struct PageTruth {
    version: u64,
    words: BTreeMap<usize, u64>,
}

#[derive(Clone, Debug, Default)]
pub struct DsmOracle {
    pages: BTreeMap<(SegmentId, PageNo), PageTruth>,
    pub violations: Vec<Violation>,
    pub reads_checked: u64,
    pub writes_seen: u64,
}

impl DsmOracle {
    pub fn new() -> DsmOracle {
        DsmOracle::default()
    }

    /// Records a write; returns the page's new version.
    pub fn wrote(&mut self, segment: SegmentId, page: PageNo, word: usize, value: u64) -> u64 {
        let truth = self.pages.entry((segment, page)).or_default();
        truth.version += 1;
        truth.words.insert(word, value);
        self.writes_seen += 1;
        truth.version
    }

    /// Checks a read against the last value written (0 if never written).
    pub fn read(
        &mut self,
        site: SiteId,
        segment: SegmentId,
        page: PageNo,
        word: usize,
        got: u64,
        time: Nanos,
    ) {
        self.reads_checked += 1;
        let expected = self
            .pages
            .get(&(segment, page))
            .and_then(|t| t.words.get(&word))
            .copied()
            .unwrap_or(0);
        if got != expected {
            self.violations.push(Violation::StaleRead {
                site,
                page,
                word,
                got,
                expected,
                time,
            });
        }
    }

    pub fn version(&self, segment: SegmentId, page: PageNo) -> u64 {
        self.pages.get(&(segment, page)).map_or(0, |t| t.version)
    }

    /// Single writer / multiple readers over every site's holder state.
    pub fn check_swmr(&mut self, sites: &[Site], segment: SegmentId, pages: u32, time: Nanos) {
        for p in 0..pages {
            let page = PageNo(p);
            let held: Vec<(SiteId, Held)> = sites
                .iter()
                .filter_map(|s| s.page_view(segment, page).map(|v| (s.id(), v.held)))
                .filter(|(_, h)| *h != Held::Nothing)
                .collect();
            let writers: Vec<SiteId> = held
                .iter()
                .filter(|(_, h)| *h == Held::Write)
                .map(|(s, _)| *s)
                .collect();
            if writers.len() > 1 {
                self.violations.push(Violation::TwoWriters {
                    page,
                    sites: writers.clone(),
                    time,
                });
            }
            if let Some(&writer) = writers.first()
                && let Some(&(reader, _)) = held.iter().find(|(s, _)| *s != writer)
            {
                self.violations.push(Violation::ReaderBesideWriter {
                    page,
                    writer,
                    reader,
                    time,
                });
            }
        }
    }

    /// The Δ guarantee, checked when a clock copy is revoked or downgraded.
    pub fn check_revoke(
        &mut self,
        site: SiteId,
        page: PageNo,
        install_time: Nanos,
        window_ticks: u32,
        tick_ns: u64,
        time: Nanos,
    ) {
        let elapsed_ticks = (time.0 - install_time.0) / tick_ns;
        if elapsed_ticks < window_ticks as u64 {
            self.violations.push(Violation::DeltaBroken {
                site,
                page,
                elapsed_ticks,
                window_ticks,
                time,
            });
        }
    }

    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}
