//! The library site's role (§6, §6.1): it queues every request, processes
//! them in order, records which sites store each page, and sends
//! invalidations to the clock site only.
//!
//! Queue granularity (documented design decision): the queue is **per
//! page**. While the library waits out a page's Δ (a refused invalidation,
//! §6.1), requests for the segment's other pages proceed; requests for the
//! same page wait behind the refused one, in arrival order. The paper says
//! requests are "queued, and sequentially processed" without saying at
//! which granularity; per page keeps one hot page from stalling a segment.

use super::site::Site;
use super::types::*;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Who holds a page, as the library records it (§6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Holders {
    /// No site holds it; the library serves it from its own copy.
    CheckedIn,
    /// Read copies; `mask` includes the clock site, with grant epochs.
    Readers {
        mask: BTreeMap<SiteId, u64>,
        clock: SiteId,
    },
    Writer(SiteId),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Queued {
    Access {
        site: SiteId,
        access: Access,
        process: ProcessId,
    },
    /// A detaching site gives up whatever it holds of the page.
    Release { site: SiteId },
}

#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    op: u64,
    clock: SiteId,
    msg: Msg,
    want: Want,
    grant_epoch: u64,
    refused: bool,
    release_of: Option<SiteId>,
}

#[derive(Clone, Debug)]
pub(crate) struct LibPage {
    holders: Holders,
    /// Per-page Δ (Table 2), uniform per segment unless changed.
    window_ticks: u32,
    queue: VecDeque<Queued>,
    inflight: Option<InFlight>,
    /// Epoch of the latest grant, and of the clock site's copy.
    epoch: u64,
    clock_epoch: u64,
    /// The checked-in copy.
    bytes: Vec<u8>,
}

#[derive(Clone, Debug)]
pub(crate) struct LibrarySegment {
    geometry: Geometry,
    attached_sites: BTreeSet<SiteId>,
    /// Detaching sites and how many pages each still has to release.
    releasing: BTreeMap<SiteId, u32>,
    pages: Vec<LibPage>,
    next_op: u64,
    pub(crate) log: Vec<LogEntry>,
}

impl LibrarySegment {
    pub(crate) fn pages_len(&self) -> u32 {
        self.pages.len() as u32
    }

    pub(crate) fn idle(&self) -> bool {
        self.pages
            .iter()
            .all(|p| p.inflight.is_none() && p.queue.is_empty())
    }
}

impl Site {
    pub(crate) fn create(&mut self, geometry: Geometry, process: ProcessId) {
        assert!(
            geometry.pages > 0 && geometry.page_bytes > 0,
            "empty segment {geometry:?}"
        );
        let segment = SegmentId {
            library: self.id,
            serial: self.next_serial,
        };
        self.next_serial += 1;
        let page = LibPage {
            holders: Holders::CheckedIn,
            window_ticks: geometry.window_ticks,
            queue: VecDeque::new(),
            inflight: None,
            epoch: 0,
            clock_epoch: 0,
            bytes: vec![0; geometry.page_bytes as usize],
        };
        let lib = LibrarySegment {
            pages: vec![page; geometry.pages as usize],
            geometry,
            attached_sites: BTreeSet::new(),
            releasing: BTreeMap::new(),
            next_op: 1,
            log: Vec::new(),
        };
        self.libraries.insert(segment, lib);
        self.actions.push(Action::Created { segment, process });
    }

    pub(crate) fn set_window(&mut self, segment: SegmentId, page: PageNo, ticks: u32) {
        let lib = self
            .libraries
            .get_mut(&segment)
            .expect("SetWindow at the library site only");
        lib.pages[page.0 as usize].window_ticks = ticks;
    }

    pub(crate) fn lib_attach(&mut self, from: SiteId, segment: SegmentId) {
        let Some(lib) = self.libraries.get_mut(&segment) else {
            // Attaching a destroyed segment: tell the site it is gone.
            self.send(from, Msg::Destroyed { segment });
            return;
        };
        lib.attached_sites.insert(from);
        let geometry = lib.geometry.clone();
        self.send(from, Msg::AttachOk { segment, geometry });
    }

    /// A site's last process detached (§2.2). Its copies are given up page
    /// by page through the page queues, so that no release races an
    /// in-flight grant.
    pub(crate) fn lib_detach(&mut self, from: SiteId, segment: SegmentId) {
        let lib = self
            .libraries
            .get_mut(&segment)
            .expect("detach of a segment created here");
        assert!(
            lib.attached_sites.remove(&from),
            "{from:?} detaches without being attached"
        );
        lib.releasing.insert(from, lib.geometry.pages);
        for p in 0..lib.geometry.pages {
            lib.pages[p as usize]
                .queue
                .push_back(Queued::Release { site: from });
        }
        for p in 0..lib.geometry.pages {
            self.lib_step(segment, PageNo(p));
        }
    }

    pub(crate) fn lib_request(
        &mut self,
        from: SiteId,
        segment: SegmentId,
        page: PageNo,
        access: Access,
        process: ProcessId,
    ) {
        let now = self.now;
        let lib = self
            .libraries
            .get_mut(&segment)
            .expect("request for a segment created here");
        // §9: every request reaching the library is logged; faults on sites
        // that hold a valid copy never get here (the holder wakes them).
        let entry = LogEntry {
            segment,
            page,
            time: now,
            site: from,
            process,
            access,
        };
        lib.log.push(entry.clone());
        self.actions.push(Action::Log(entry));
        lib.pages[page.0 as usize].queue.push_back(Queued::Access {
            site: from,
            access,
            process,
        });
        self.lib_step(segment, page);
    }

    /// Processes the page's queue until a request needs the clock site.
    fn lib_step(&mut self, segment: SegmentId, page: PageNo) {
        loop {
            let Some(lib) = self.libraries.get_mut(&segment) else {
                return;
            };
            let lp = &mut lib.pages[page.0 as usize];
            if lp.inflight.is_some() {
                return;
            }
            let Some(head) = lp.queue.pop_front() else {
                return;
            };
            match head {
                Queued::Release { site } => self.lib_release(segment, page, site),
                Queued::Access {
                    site,
                    access: Access::Write,
                    ..
                } => self.lib_grant(segment, page, Want::Write(site)),
                Queued::Access {
                    site,
                    access: Access::Read,
                    ..
                } => {
                    let batch = take_read_batch(&mut lp.queue, site);
                    self.lib_grant(segment, page, Want::Read(batch));
                }
            }
        }
    }

    /// Table 1, seen from the library: a checked-in page is served here;
    /// otherwise the request goes to the clock site only (§6.1).
    fn lib_grant(&mut self, segment: SegmentId, page: PageNo, want: Want) {
        let lib = self.libraries.get_mut(&segment).expect("library");
        let op = lib.next_op;
        lib.next_op += 1;
        let lp = &mut lib.pages[page.0 as usize];
        lp.epoch += 1;
        let (grant_epoch, window_ticks) = (lp.epoch, lp.window_ticks);
        match (&lp.holders, &want) {
            (Holders::CheckedIn, Want::Write(site)) => {
                let site = *site;
                lp.holders = Holders::Writer(site);
                lp.clock_epoch = grant_epoch;
                let bytes = lp.bytes.clone();
                let msg = page_msg(
                    segment,
                    page,
                    op,
                    grant_epoch,
                    Access::Write,
                    bytes,
                    window_ticks,
                    None,
                );
                self.send(site, msg);
                return;
            }
            (Holders::CheckedIn, Want::Read(sites)) => {
                let sites = sites.clone();
                self.lib_serve_readers(segment, page, op, sites);
                return;
            }
            (Holders::Writer(w), Want::Write(site)) => {
                assert_ne!(w, site, "the writer cannot fault for write")
            }
            (Holders::Writer(w), Want::Read(sites)) => {
                assert!(!sites.contains(w), "the writer cannot fault for read")
            }
            (Holders::Readers { mask, .. }, Want::Read(sites)) => {
                assert!(
                    sites.iter().all(|s| !mask.contains_key(s)),
                    "a reader cannot fault for read"
                );
            }
            _ => {}
        }
        let clock = lp.holders.clock();
        let msg = Msg::Recall {
            segment,
            page,
            op,
            want: want.clone(),
            epoch_min: lp.clock_epoch,
            grant_epoch,
            window_ticks,
        };
        lp.inflight = Some(InFlight {
            op,
            clock,
            msg: msg.clone(),
            want,
            grant_epoch,
            refused: false,
            release_of: None,
        });
        self.send(clock, msg);
    }

    /// A checked-in page is served by the library (§6.1). The first reader
    /// of the batch becomes the clock site (documented rule: the earliest
    /// request), told of the others.
    fn lib_serve_readers(&mut self, segment: SegmentId, page: PageNo, op: u64, sites: Vec<SiteId>) {
        let lp = &mut self.libraries.get_mut(&segment).expect("library").pages[page.0 as usize];
        let epoch = lp.epoch;
        let mask: BTreeMap<SiteId, u64> = sites.iter().map(|s| (*s, epoch)).collect();
        let clock = sites[0];
        lp.holders = Holders::Readers { mask, clock };
        lp.clock_epoch = epoch;
        let others: Vec<Reader> = sites[1..]
            .iter()
            .map(|&site| Reader { site, epoch })
            .collect();
        let (bytes, window) = (lp.bytes.clone(), lp.window_ticks);
        for (i, site) in sites.into_iter().enumerate() {
            let clock_of = (i == 0).then(|| others.clone());
            self.send(
                site,
                page_msg(
                    segment,
                    page,
                    op,
                    epoch,
                    Access::Read,
                    bytes.clone(),
                    window,
                    clock_of,
                ),
            );
        }
    }

    /// A detaching site gives up the page: a write copy (or the clock copy
    /// of a read set) is checked back in; a plain read copy is dropped and
    /// the masks updated (documented detach semantics).
    fn lib_release(&mut self, segment: SegmentId, page: PageNo, site: SiteId) {
        let lib = self.libraries.get_mut(&segment).expect("library");
        let lp = &mut lib.pages[page.0 as usize];
        let is_clock = match &mut lp.holders {
            Holders::Writer(w) => *w == site,
            Holders::Readers { clock, .. } if *clock == site => true,
            Holders::Readers { mask, clock } => {
                if mask.remove(&site).is_some() {
                    let (clock, epoch_min) = (*clock, lp.clock_epoch);
                    self.send(
                        clock,
                        Msg::ForgetReader {
                            segment,
                            page,
                            site,
                            epoch_min,
                        },
                    );
                }
                false
            }
            Holders::CheckedIn => false,
        };
        if !is_clock {
            self.lib_released_one(segment, site);
            return;
        }
        let lib = self.libraries.get_mut(&segment).expect("library");
        let op = lib.next_op;
        lib.next_op += 1;
        let lp = &mut lib.pages[page.0 as usize];
        let msg = Msg::Recall {
            segment,
            page,
            op,
            want: Want::CheckIn,
            epoch_min: lp.clock_epoch,
            grant_epoch: lp.epoch,
            window_ticks: lp.window_ticks,
        };
        let grant_epoch = lp.epoch;
        lp.inflight = Some(InFlight {
            op,
            clock: site,
            msg: msg.clone(),
            want: Want::CheckIn,
            grant_epoch,
            refused: false,
            release_of: Some(site),
        });
        self.send(site, msg);
    }

    fn lib_released_one(&mut self, segment: SegmentId, site: SiteId) {
        let lib = self.libraries.get_mut(&segment).expect("library");
        let left = lib.releasing.get_mut(&site).expect("site is releasing");
        *left -= 1;
        if *left > 0 {
            return;
        }
        lib.releasing.remove(&site);
        self.send(site, Msg::DetachOk { segment });
        let lib = &self.libraries[&segment];
        if lib.attached_sites.is_empty() && lib.releasing.is_empty() {
            self.lib_destroy(segment);
        }
    }

    /// The last detach destroys the segment (§2.2); every site is told.
    fn lib_destroy(&mut self, segment: SegmentId) {
        let lib = self.libraries.remove(&segment).expect("library");
        debug_assert!(
            lib.pages.iter().all(|p| p.holders == Holders::CheckedIn),
            "destroyed with pages out"
        );
        for peer in self.peers.clone() {
            self.send(peer, Msg::Destroyed { segment });
        }
    }

    pub(crate) fn lib_done(&mut self, segment: SegmentId, page: PageNo, op: u64) {
        let Some(lib) = self.libraries.get_mut(&segment) else {
            return;
        };
        let lp = &mut lib.pages[page.0 as usize];
        // A grant installed at the library site reports itself here too
        // (it doubles as `Done`); only the in-flight op counts.
        let Some(inflight) = lp.inflight.take_if(|f| f.op == op) else {
            return;
        };
        match &inflight.want {
            Want::Write(site) => {
                lp.holders = Holders::Writer(*site);
                lp.clock_epoch = inflight.grant_epoch;
            }
            Want::Read(sites) => lp.add_readers(sites, inflight.grant_epoch),
            Want::CheckIn => unreachable!("a check-in completes with CheckedIn"),
        }
        self.lib_after_op(segment, page, inflight.refused);
    }

    pub(crate) fn lib_checked_in(
        &mut self,
        segment: SegmentId,
        page: PageNo,
        op: u64,
        bytes: Vec<u8>,
    ) {
        let lib = self.libraries.get_mut(&segment).expect("library");
        let lp = &mut lib.pages[page.0 as usize];
        let inflight = lp
            .inflight
            .take_if(|f| f.op == op)
            .expect("check-in answers the in-flight op");
        lp.holders = Holders::CheckedIn;
        lp.bytes = bytes;
        self.lib_released_one(segment, inflight.release_of.expect("check-in is a release"));
        self.lib_step(segment, page);
    }

    fn lib_after_op(&mut self, segment: SegmentId, page: PageNo, was_refused: bool) {
        if let DynamicDelta::HalveOnRefusal { .. } = self.config.dynamic_delta
            && !was_refused
        {
            let lib = self.libraries.get_mut(&segment).expect("library");
            let base = lib.geometry.window_ticks;
            lib.pages[page.0 as usize].window_ticks = base;
        }
        self.lib_step(segment, page);
    }

    /// The clock site refused: Δ has not expired (§6.1). The library sleeps
    /// for the time left, then re-requests (§7.1: "it
    /// may require two attempts").
    pub(crate) fn lib_refused(
        &mut self,
        segment: SegmentId,
        page: PageNo,
        op: u64,
        ticks_left: u32,
    ) {
        assert!(ticks_left > 0, "a refusal with no time left");
        let tick_ns = self.config.tick_ns;
        let dynamic = self.config.dynamic_delta;
        let lib = self.libraries.get_mut(&segment).expect("library");
        let lp = &mut lib.pages[page.0 as usize];
        let inflight = lp
            .inflight
            .as_mut()
            .filter(|f| f.op == op)
            .expect("refusal of the in-flight op");
        inflight.refused = true;
        if let DynamicDelta::HalveOnRefusal { min_ticks } = dynamic {
            // §8: the new Δ travels with the page on the retried invalidation.
            lp.window_ticks = (lp.window_ticks / 2).max(min_ticks);
        }
        // The library sleeps the whole time left, in ticks, from now: §7.3
        // reports the sleeps at Δ=2 as "sleeps of 33 msecs" (two full ticks).
        let at = Nanos(self.now.0 + ticks_left as u64 * tick_ns);
        self.actions.push(Action::SetTimer {
            at,
            timer: Timer::RetryRecall { segment, page, op },
        });
    }

    pub(crate) fn lib_retry(&mut self, segment: SegmentId, page: PageNo, op: u64) {
        let Some(lib) = self.libraries.get_mut(&segment) else {
            return;
        };
        let lp = &mut lib.pages[page.0 as usize];
        let window = lp.window_ticks;
        let Some(inflight) = lp.inflight.as_mut().filter(|f| f.op == op) else {
            return;
        };
        // Readers that queued while the library waited out Δ join the
        // batch: they are granted together with it (§6.1).
        if let Want::Read(batch) = &mut inflight.want {
            let first = batch[0];
            let joined = take_read_batch(&mut lp.queue, first);
            for site in joined.into_iter().skip(1) {
                if !batch.contains(&site) {
                    batch.push(site);
                }
            }
        }
        if let Msg::Recall {
            window_ticks, want, ..
        } = &mut inflight.msg
        {
            *window_ticks = window;
            *want = inflight.want.clone();
        }
        let (clock, msg) = (inflight.clock, inflight.msg.clone());
        self.send(clock, msg);
    }
}

impl Holders {
    fn clock(&self) -> SiteId {
        match self {
            Holders::Readers { clock, .. } => *clock,
            Holders::Writer(w) => *w,
            Holders::CheckedIn => unreachable!("a checked-in page has no clock site"),
        }
    }
}

impl LibPage {
    /// Readers joining a read set, or a writer downgraded among readers.
    /// The clock site stays fixed (§6.1): the existing clock, or the
    /// downgraded writer.
    fn add_readers(&mut self, sites: &[SiteId], epoch: u64) {
        let (mut mask, clock) = match std::mem::replace(&mut self.holders, Holders::CheckedIn) {
            Holders::Readers { mask, clock } => (mask, clock),
            Holders::Writer(w) => (BTreeMap::from([(w, self.clock_epoch)]), w),
            Holders::CheckedIn => unreachable!("readers join a held page"),
        };
        for s in sites {
            mask.insert(*s, epoch);
        }
        self.holders = Holders::Readers { mask, clock };
    }
}

/// §6.1: "Read requests for the same page are batched together and granted
/// to all the readers at one time". The batch is the run of read requests
/// at the head of the page's queue (so a queued write is never overtaken).
fn take_read_batch(queue: &mut VecDeque<Queued>, first: SiteId) -> Vec<SiteId> {
    let mut batch = vec![first];
    while let Some(Queued::Access {
        site,
        access: Access::Read,
        ..
    }) = queue.front()
    {
        if !batch.contains(site) {
            batch.push(*site);
        }
        queue.pop_front();
    }
    batch
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn page_msg(
    segment: SegmentId,
    page: PageNo,
    op: u64,
    epoch: u64,
    access: Access,
    bytes: Vec<u8>,
    window_ticks: u32,
    clock_of: Option<Vec<Reader>>,
) -> Msg {
    Msg::Page {
        segment,
        page,
        op,
        epoch,
        access,
        bytes,
        window_ticks,
        clock_of,
    }
}
