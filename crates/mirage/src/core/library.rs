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
    /// A refusal was received and its retry timer is set: a second
    /// refusal of the same op is a duplicate.
    retry_pending: bool,
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
    /// Lost with this dead site: every request fails from now on.
    lost: Option<SiteId>,
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
    /// Sites declared dead while the segment existed.
    dead: BTreeSet<SiteId>,
    /// `IPC_RMID` reached the library (see [`Lifetime`]).
    removed: bool,
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

    pub(crate) fn lost_pages(&self) -> impl Iterator<Item = (PageNo, SiteId)> + '_ {
        self.pages
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.lost.map(|d| (PageNo(i as u32), d)))
    }
}

/// The library's page, or why a peer's message cannot name it.
fn lib_page_mut(
    libraries: &mut BTreeMap<SegmentId, LibrarySegment>,
    me: SiteId,
    segment: SegmentId,
    page: PageNo,
) -> Result<(&mut LibrarySegment, usize), String> {
    let lib = lib_seg_mut(libraries, me, segment)?;
    let n = lib.pages.len();
    if page.0 as usize >= n {
        return Err(format!(
            "page {} out of range (segment {}.{} has {n} pages)",
            page.0, segment.library.0, segment.serial
        ));
    }
    Ok((lib, page.0 as usize))
}

fn lib_seg_mut(
    libraries: &mut BTreeMap<SegmentId, LibrarySegment>,
    me: SiteId,
    segment: SegmentId,
) -> Result<&mut LibrarySegment, String> {
    if segment.library != me {
        return Err(format!(
            "segment {}.{} has its library at site {}, not here",
            segment.library.0, segment.serial, segment.library.0
        ));
    }
    libraries.get_mut(&segment).ok_or_else(|| {
        format!(
            "segment {}.{} is unknown (never created or destroyed)",
            segment.library.0, segment.serial
        )
    })
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
            lost: None,
        };
        let lib = LibrarySegment {
            pages: vec![page; geometry.pages as usize],
            geometry,
            attached_sites: BTreeSet::new(),
            releasing: BTreeMap::new(),
            next_op: 1,
            log: Vec::new(),
            dead: BTreeSet::new(),
            removed: false,
        };
        self.libraries.insert(segment, lib);
        self.actions.push(Action::Created { segment, process });
    }

    /// Per-page Δ at the library; ignored for a segment or page not
    /// (or no longer) in this library.
    pub(crate) fn set_window(&mut self, segment: SegmentId, page: PageNo, ticks: u32) {
        if let Some(lp) = self
            .libraries
            .get_mut(&segment)
            .and_then(|l| l.pages.get_mut(page.0 as usize))
        {
            lp.window_ticks = ticks;
        }
    }

    pub(crate) fn lib_attach(&mut self, from: SiteId, segment: SegmentId) -> Result<(), String> {
        if segment.library != self.id {
            return Err(format!(
                "segment {}.{} has its library at site {}, not here",
                segment.library.0, segment.serial, segment.library.0
            ));
        }
        let Some(lib) = self.libraries.get_mut(&segment) else {
            // Attaching a destroyed segment: tell the site it is gone.
            self.send(from, Msg::Destroyed { segment });
            return Ok(());
        };
        if lib.dead.contains(&from) {
            return Err("the site was declared dead while the segment existed".into());
        }
        lib.attached_sites.insert(from);
        let geometry = lib.geometry.clone();
        self.send(from, Msg::AttachOk { segment, geometry });
        Ok(())
    }

    /// A site's last process detached (§2.2). Its copies are given up page
    /// by page through the page queues, so that no release races an
    /// in-flight grant.
    pub(crate) fn lib_detach(&mut self, from: SiteId, segment: SegmentId) -> Result<(), String> {
        let lib = lib_seg_mut(&mut self.libraries, self.id, segment)?;
        if !lib.attached_sites.remove(&from) {
            return Err("a detach from a site not attached".into());
        }
        lib.releasing.insert(from, lib.geometry.pages);
        for p in 0..lib.geometry.pages {
            lib.pages[p as usize]
                .queue
                .push_back(Queued::Release { site: from });
        }
        for p in 0..lib.geometry.pages {
            self.lib_step(segment, PageNo(p));
        }
        Ok(())
    }

    pub(crate) fn lib_request(
        &mut self,
        from: SiteId,
        segment: SegmentId,
        page: PageNo,
        access: Access,
        process: ProcessId,
    ) -> Result<(), String> {
        let now = self.now;
        let (lib, p) = lib_page_mut(&mut self.libraries, self.id, segment, page)?;
        if !lib.attached_sites.contains(&from) {
            return Err("a request from a site not attached".into());
        }
        // A site has at most one unanswered request per page; the one
        // before it left the queue when it was granted.
        let queued = lib.pages[p]
            .queue
            .iter()
            .any(|q| matches!(q, Queued::Access { site, .. } if *site == from));
        if queued {
            return Err("a second request while one is queued".into());
        }
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
        lib.pages[p].queue.push_back(Queued::Access {
            site: from,
            access,
            process,
        });
        self.lib_step(segment, page);
        Ok(())
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
            if let (Some(dead), Queued::Access { site, .. }) = (lp.lost, &head) {
                // Coherence before availability: a lost page fails.
                let site = *site;
                let msg = Msg::Lost {
                    segment,
                    page,
                    site: dead,
                };
                self.send(site, msg);
                continue;
            }
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
    fn lib_grant(&mut self, segment: SegmentId, page: PageNo, mut want: Want) {
        // A request for what the site already holds (a duplicate, seen
        // only once the earlier grant completed) is dropped here: no op,
        // no message, a peer error.
        let lib = self.libraries.get_mut(&segment).expect("library");
        let lp = &lib.pages[page.0 as usize];
        let redundant: Vec<SiteId> = match (&lp.holders, &mut want) {
            (Holders::Writer(w), Want::Write(site)) if w == site => vec![*site],
            (Holders::Writer(w), Want::Read(sites)) => {
                let r = sites.iter().copied().filter(|s| s == w).collect();
                sites.retain(|s| s != w);
                r
            }
            (Holders::Readers { mask, .. }, Want::Read(sites)) => {
                let r = sites
                    .iter()
                    .copied()
                    .filter(|s| mask.contains_key(s))
                    .collect();
                sites.retain(|s| !mask.contains_key(s));
                r
            }
            _ => Vec::new(),
        };
        let empty = match &want {
            Want::Write(site) => redundant.contains(site),
            Want::Read(sites) => sites.is_empty(),
            Want::CheckIn => false,
        };
        for site in redundant {
            self.peer_error(
                site,
                format!(
                    "request: segment {}.{} page {}: asks for a copy it already holds",
                    segment.library.0, segment.serial, page.0
                ),
            );
        }
        if empty {
            return;
        }
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
            retry_pending: false,
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
        if lp.lost.is_some() {
            // Nothing to check in: the site drops what it holds of a lost
            // page when its detach completes.
            self.lib_released_one(segment, site);
            return;
        }
        let is_clock = match &mut lp.holders {
            Holders::Writer(w) => *w == site,
            Holders::Readers { clock, .. } if *clock == site => true,
            Holders::Readers { mask, clock } => {
                if let Some(reader_epoch) = mask.remove(&site) {
                    let (clock, epoch_min) = (*clock, lp.clock_epoch);
                    self.send(
                        clock,
                        Msg::ForgetReader {
                            segment,
                            page,
                            site,
                            reader_epoch,
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
            retry_pending: false,
            release_of: Some(site),
        });
        self.send(site, msg);
    }

    fn lib_released_one(&mut self, segment: SegmentId, site: SiteId) {
        let lib = self.libraries.get_mut(&segment).expect("library");
        let Some(left) = lib.releasing.get_mut(&site) else {
            // The site was declared dead while it released.
            return;
        };
        *left -= 1;
        if *left > 0 {
            return;
        }
        lib.releasing.remove(&site);
        self.send(site, Msg::DetachOk { segment });
        self.lib_maybe_destroy(segment);
    }

    /// A site removed the segment (`IPC_RMID`). A segment already
    /// destroyed is no error: a removal may cross the last detach.
    pub(crate) fn lib_remove(&mut self, segment: SegmentId) -> Result<(), String> {
        if segment.library != self.id {
            return Err(format!(
                "segment {}.{} has its library at site {}, not here",
                segment.library.0, segment.serial, segment.library.0
            ));
        }
        if let Some(lib) = self.libraries.get_mut(&segment) {
            lib.removed = true;
            self.lib_maybe_destroy(segment);
        }
        Ok(())
    }

    fn lib_maybe_destroy(&mut self, segment: SegmentId) {
        let Some(lib) = self.libraries.get(&segment) else {
            return;
        };
        let unused = lib.attached_sites.is_empty() && lib.releasing.is_empty();
        let dies = match self.config.lifetime {
            Lifetime::LastDetach => unused,
            Lifetime::RemovedAndDetached => unused && lib.removed,
        };
        if dies {
            self.lib_destroy(segment);
        }
    }

    /// The last detach destroys the segment (§2.2), or under System V's
    /// rule the last detach of a removed one; every site is told.
    fn lib_destroy(&mut self, segment: SegmentId) {
        let lib = self.libraries.remove(&segment).expect("library");
        debug_assert!(
            lib.pages.iter().all(|p| p.holders == Holders::CheckedIn
                || p.lost.is_some()
                || !lib.dead.is_empty()),
            "destroyed with pages out"
        );
        for peer in self.peers.clone() {
            self.send(peer, Msg::Destroyed { segment });
        }
    }

    /// `Done` from a peer: it must answer the in-flight op, from the
    /// site the recall went to.
    pub(crate) fn lib_done_msg(
        &mut self,
        from: SiteId,
        segment: SegmentId,
        page: PageNo,
        op: u64,
    ) -> Result<(), String> {
        let (lib, p) = lib_page_mut(&mut self.libraries, self.id, segment, page)?;
        match &lib.pages[p].inflight {
            Some(f) if f.op == op && f.clock == from && f.want != Want::CheckIn => {}
            Some(f) if f.op == op && f.clock != from => {
                return Err(format!("op {op} was sent to site {}", f.clock.0));
            }
            _ => return Err(format!("op {op} is not in flight")),
        }
        self.lib_done(segment, page, op);
        Ok(())
    }

    pub(crate) fn lib_done(&mut self, segment: SegmentId, page: PageNo, op: u64) {
        let Some(lib) = self.libraries.get_mut(&segment) else {
            return;
        };
        let dead = lib.dead.clone();
        let lp = &mut lib.pages[page.0 as usize];
        // A grant installed at the library site reports itself here too
        // (it doubles as `Done`); only the in-flight op counts.
        let Some(inflight) = lp
            .inflight
            .take_if(|f| f.op == op && f.want != Want::CheckIn)
        else {
            return;
        };
        match &inflight.want {
            Want::Write(site) => {
                lp.holders = Holders::Writer(*site);
                lp.clock_epoch = inflight.grant_epoch;
                if dead.contains(site) {
                    // The page went to a site declared dead meanwhile.
                    lp.lost = Some(*site);
                }
            }
            Want::Read(sites) => {
                let live: Vec<SiteId> = sites
                    .iter()
                    .copied()
                    .filter(|s| !dead.contains(s))
                    .collect();
                lp.add_readers(&live, inflight.grant_epoch);
            }
            Want::CheckIn => {}
        }
        self.lib_after_op(segment, page, inflight.refused);
    }

    pub(crate) fn lib_checked_in(
        &mut self,
        from: SiteId,
        segment: SegmentId,
        page: PageNo,
        op: u64,
        bytes: Vec<u8>,
    ) -> Result<(), String> {
        let page_bytes = self
            .libraries
            .get(&segment)
            .map_or(0, |l| l.geometry.page_bytes as usize);
        let (lib, p) = lib_page_mut(&mut self.libraries, self.id, segment, page)?;
        let lp = &mut lib.pages[p];
        match &lp.inflight {
            Some(f) if f.op == op && f.clock == from && f.want == Want::CheckIn => {}
            _ => return Err(format!("op {op} is no check-in in flight from this site")),
        }
        if bytes.len() != page_bytes {
            return Err(format!("{} bytes for a page of {page_bytes}", bytes.len()));
        }
        let inflight = lp.inflight.take().expect("checked above");
        lp.holders = Holders::CheckedIn;
        lp.bytes = bytes;
        if let Some(site) = inflight.release_of {
            self.lib_released_one(segment, site);
        }
        self.lib_step(segment, page);
        Ok(())
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
        from: SiteId,
        segment: SegmentId,
        page: PageNo,
        op: u64,
        ticks_left: u32,
    ) -> Result<(), String> {
        if ticks_left == 0 {
            return Err("a refusal with no time left".into());
        }
        let tick_ns = self.config.tick_ns;
        let dynamic = self.config.dynamic_delta;
        let (lib, p) = lib_page_mut(&mut self.libraries, self.id, segment, page)?;
        let lp = &mut lib.pages[p];
        let Some(inflight) = lp.inflight.as_mut().filter(|f| {
            f.op == op && f.clock == from && f.want != Want::CheckIn && !f.retry_pending
        }) else {
            return Err(format!("op {op} is not awaiting an answer from this site"));
        };
        inflight.refused = true;
        inflight.retry_pending = true;
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
        Ok(())
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
        inflight.retry_pending = false;
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

impl Site {
    /// A site was declared dead (library role): pages whose only current
    /// copy was there are lost at once, and so are pages whose recall was
    /// in flight at the dead site (the library cannot know what it did
    /// before dying, and never regrants without the holder's answer).
    /// The dead site leaves every reader mask; when it was a read set's
    /// clock site, the surviving reader with the lowest site id becomes
    /// clock site (documented rule: read copies are identical, so any
    /// reader holds the most recent copy; the lowest id is deterministic).
    pub(crate) fn lib_site_dead(&mut self, d: SiteId) {
        let segs: Vec<SegmentId> = self.libraries.keys().copied().collect();
        for segment in segs {
            let lib = self.libraries.get_mut(&segment).expect("library");
            if !lib.dead.insert(d) {
                continue;
            }
            lib.attached_sites.remove(&d);
            lib.releasing.remove(&d);
            let mut sends: Vec<(SiteId, Msg)> = Vec::new();
            for (i, lp) in lib.pages.iter_mut().enumerate() {
                let page = PageNo(i as u32);
                lp.queue.retain(|q| match q {
                    Queued::Access { site, .. } | Queued::Release { site } => *site != d,
                });
                if lp.lost.is_some() {
                    continue;
                }
                if let Some(f) = lp.inflight.take_if(|f| f.clock == d) {
                    lp.lost = Some(d);
                    let requesters = match f.want {
                        Want::Write(s) => vec![s],
                        Want::Read(v) => v,
                        Want::CheckIn => Vec::new(),
                    };
                    for s in requesters.into_iter().filter(|s| *s != d) {
                        sends.push((
                            s,
                            Msg::Lost {
                                segment,
                                page,
                                site: d,
                            },
                        ));
                    }
                    continue;
                }
                match &mut lp.holders {
                    Holders::Writer(w) if *w == d => lp.lost = Some(d),
                    Holders::Readers { mask, clock } => {
                        let Some(reader_epoch) = mask.remove(&d) else {
                            continue;
                        };
                        if let Some((&new, &epoch)) = mask.iter().next()
                            && *clock == d
                        {
                            *clock = new;
                            lp.clock_epoch = epoch;
                            let readers = mask
                                .iter()
                                .filter(|(s, _)| **s != new)
                                .map(|(&site, &epoch)| Reader { site, epoch })
                                .collect();
                            sends.push((
                                new,
                                Msg::ClockMoved {
                                    segment,
                                    page,
                                    readers,
                                    epoch_min: epoch,
                                },
                            ));
                        } else if mask.is_empty() {
                            lp.lost = Some(d);
                        } else {
                            sends.push((
                                *clock,
                                Msg::ForgetReader {
                                    segment,
                                    page,
                                    site: d,
                                    reader_epoch,
                                    epoch_min: lp.clock_epoch,
                                },
                            ));
                        }
                    }
                    _ => {}
                }
            }
            let pages = lib.geometry.pages;
            for (to, msg) in sends {
                self.send(to, msg);
            }
            for p in 0..pages {
                self.lib_step(segment, PageNo(p));
            }
            self.lib_maybe_destroy(segment);
        }
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
