//! The holder's role: faults, installs, and — at the clock site — the
//! clock check and the invalidations of §6.1 and Table 1.
//!
//! Clock-site rule (documented design decision): the writer is the clock
//! site; when readers are added to a writer's page the downgraded writer
//! stays clock site; a read set served from a checked-in page makes its
//! earliest requester the clock site. The clock site never moves while
//! readers join (§6.1).

use super::library::page_msg;
use super::site::{AuxPte, Collecting, Site, SiteSegment};
use super::types::*;
use std::collections::{BTreeMap, BTreeSet};

impl Site {
    pub(crate) fn attach(&mut self, segment: SegmentId, process: ProcessId) {
        let seg = self.segments.entry(segment).or_insert_with(|| SiteSegment {
            geometry: None,
            processes: BTreeSet::new(),
            attach_waiters: Vec::new(),
            detach_waiter: None,
            detach_pending: false,
            pages: Vec::new(),
        });
        if let Some(geometry) = seg.geometry.clone().filter(|_| seg.detach_waiter.is_none()) {
            seg.processes.insert(process);
            self.actions.push(Action::Attached {
                segment,
                process,
                geometry,
            });
            return;
        }
        seg.attach_waiters.push(process);
        let first_waiter = seg.attach_waiters.len() == 1 && seg.detach_waiter.is_none();
        if first_waiter {
            // The creating site registers with its own library too (a local
            // message), so that the last detach is seen wherever it is.
            self.send(segment.library, Msg::Attach { segment });
        }
    }

    pub(crate) fn detach(&mut self, segment: SegmentId, process: ProcessId) {
        let seg = self
            .segments
            .get_mut(&segment)
            .expect("detach of an attached segment");
        assert!(
            seg.processes.remove(&process),
            "{process:?} detaches without being attached"
        );
        // A process may detach while asleep on a fault (its driver gave up
        // waiting): it is no longer woken. The site's request stays
        // queued at the library; its answer is installed and then given
        // back like any other copy.
        for aux in &mut seg.pages {
            aux.waiters.retain(|(p, _)| *p != process);
        }
        if !seg.processes.is_empty() {
            self.actions.push(Action::Detached { segment, process });
            return;
        }
        seg.detach_waiter = Some(process);
        if seg.pages.iter().any(|p| p.pending.is_some()) {
            // `Detach` leaves once every grant is in, so that no grant
            // reaches a site that has finished detaching.
            seg.detach_pending = true;
            return;
        }
        self.send_detach(segment);
    }

    /// The detaching site's last request was answered: detach now.
    fn maybe_finish_detach(&mut self, segment: SegmentId) {
        let Some(seg) = self.segments.get_mut(&segment) else {
            return;
        };
        if seg.detach_pending && seg.pages.iter().all(|p| p.pending.is_none()) {
            seg.detach_pending = false;
            self.send_detach(segment);
        }
    }

    fn send_detach(&mut self, segment: SegmentId) {
        let seg = self.segments.get_mut(&segment).expect("detaching");
        // Plain read copies are dropped now (no process can read them); the
        // library updates its mask when it processes the release. Clock and
        // write copies stay until the library recalls them in order.
        for p in 0..seg.pages.len() {
            let aux = &mut seg.pages[p];
            if aux.held == Held::Read && !aux.is_clock {
                aux.held = Held::Nothing;
                self.actions.push(Action::Invalidate {
                    segment,
                    page: PageNo(p as u32),
                });
            }
        }
        self.send(segment.library, Msg::Detach { segment });
    }

    pub(crate) fn fault(
        &mut self,
        segment: SegmentId,
        page: PageNo,
        process: ProcessId,
        access: Access,
    ) {
        let seg = self
            .segments
            .get_mut(&segment)
            .expect("fault on an attached segment");
        assert!(
            seg.processes.contains(&process),
            "{process:?} faults on a segment it has not attached"
        );
        let aux = &mut seg.pages[page.0 as usize];
        if let Some(site) = aux.lost.filter(|_| !aux.held.allows(access)) {
            // Coherence before availability: a lost page fails at once.
            self.actions.push(Action::Fail {
                process,
                segment,
                page,
                site,
            });
            return;
        }
        if aux.held.allows(access) {
            // The page is valid here (another process of this site brought
            // it in): remap and run. Not a request, so not logged (§9).
            self.actions.push(Action::Wake {
                process,
                segment,
                page,
            });
            return;
        }
        aux.waiters.push((process, access));
        let covered = match aux.pending {
            Some(Access::Write) => true,
            Some(Access::Read) => access == Access::Read,
            None => false,
        };
        if covered {
            return;
        }
        // A site has at most one request per page at the library; a write
        // needed behind a pending read is asked for when the read arrives.
        if aux.pending.is_none() {
            aux.pending = Some(access);
            self.send(
                segment.library,
                Msg::Request {
                    segment,
                    page,
                    access,
                    process,
                },
            );
        }
    }

    pub(crate) fn holder_receive(&mut self, from: SiteId, msg: Msg) -> Result<(), String> {
        // The page it names must exist here (an invalidation of a copy
        // already dropped with its segment is acknowledged).
        if let Some((segment, page)) = msg_page(&msg) {
            match self.segments.get(&segment).filter(|s| s.geometry.is_some()) {
                None if matches!(msg, Msg::Invalidate { .. }) => {}
                None => {
                    return Err(format!(
                        "segment {}.{} is not attached here",
                        segment.library.0, segment.serial
                    ));
                }
                Some(seg) if page.0 as usize >= seg.pages.len() => {
                    return Err(format!(
                        "page {} out of range (segment {}.{} has {} pages)",
                        page.0,
                        segment.library.0,
                        segment.serial,
                        seg.pages.len()
                    ));
                }
                Some(_) => {}
            }
        }
        if let Some(segment) = library_only(&msg)
            && from != segment.library
        {
            return Err(format!(
                "only the library site {} of segment {}.{} sends this",
                segment.library.0, segment.library.0, segment.serial
            ));
        }
        if self.must_defer(&msg) {
            let (segment, page) = msg_page(&msg).expect("deferred messages name a page");
            let aux = self.aux_mut(segment, page);
            if aux.deferred.len() >= MAX_DEFERRED {
                return Err(format!(
                    "more than {MAX_DEFERRED} messages ahead of the grant they need"
                ));
            }
            aux.deferred.push((from, msg));
            return Ok(());
        }
        match msg {
            Msg::Recall {
                segment,
                page,
                op,
                want,
                grant_epoch,
                window_ticks,
                ..
            } => self.clock_recall(segment, page, op, want, grant_epoch, window_ticks),
            Msg::Invalidate {
                segment, page, op, ..
            } => self.reader_invalidate(from, segment, page, op),
            Msg::InvalidateAck { segment, page, op } => self.clock_ack(from, segment, page, op),
            Msg::Page {
                segment,
                page,
                op,
                epoch,
                access,
                bytes,
                window_ticks,
                clock_of,
            } => self.install(
                from,
                segment,
                page,
                op,
                epoch,
                access,
                Some(bytes),
                window_ticks,
                clock_of,
            ),
            Msg::Upgrade {
                segment,
                page,
                op,
                epoch,
                window_ticks,
            } => self.install(
                from,
                segment,
                page,
                op,
                epoch,
                Access::Write,
                None,
                window_ticks,
                None,
            ),
            Msg::ForgetReader {
                segment,
                page,
                site,
                reader_epoch,
                ..
            } => {
                if !self.known_site(site) {
                    return Err(format!("names site {}, not in the network", site.0));
                }
                let aux = self.aux_mut(segment, page);
                if !aux.is_clock {
                    return Err("this site is not the page's clock site".into());
                }
                if aux.readers.get(&site).is_some_and(|e| *e > reader_epoch) {
                    return Err(format!(
                        "forgets site {}'s grant of epoch {reader_epoch}, granted again since",
                        site.0
                    ));
                }
                aux.readers.remove(&site);
                self.clock_forget(segment, page, site);
                Ok(())
            }
            Msg::ClockMoved {
                segment,
                page,
                readers,
                ..
            } => {
                let me = self.id;
                if let Some(r) = readers
                    .iter()
                    .find(|r| !self.known_site(r.site) || r.site == me)
                {
                    return Err(format!("names reader site {}", r.site.0));
                }
                let aux = self.aux_mut(segment, page);
                if aux.held != Held::Read || aux.is_clock {
                    return Err("this site holds no plain read copy".into());
                }
                aux.is_clock = true;
                aux.readers = readers.into_iter().map(|r| (r.site, r.epoch)).collect();
                Ok(())
            }
            Msg::Lost {
                segment,
                page,
                site,
            } => self.holder_lost(segment, page, site),
            Msg::AttachOk { segment, geometry } => self.attach_ok(segment, geometry),
            Msg::DetachOk { segment } => self.detach_ok(segment),
            Msg::Destroyed { segment } => self.destroyed(segment),
            other => Err(format!("a {} is not for a holder", other.kind())),
        }
    }

    /// A reader left the clock site's mask (detach or death): an
    /// invalidation waiting for its acknowledgement need not wait.
    fn clock_forget(&mut self, segment: SegmentId, page: PageNo, site: SiteId) {
        let aux = self.aux_mut(segment, page);
        let done = aux
            .collecting
            .as_mut()
            .is_some_and(|c| c.acks_left.remove(&site) && c.acks_left.is_empty());
        if done {
            self.clock_finish(segment, page);
        }
    }

    /// The library says the page is lost: every process asleep on it fails.
    fn holder_lost(
        &mut self,
        segment: SegmentId,
        page: PageNo,
        site: SiteId,
    ) -> Result<(), String> {
        if !self.known_site(site) {
            return Err(format!("names site {}, not in the network", site.0));
        }
        let aux = self.aux_mut(segment, page);
        if aux.pending.is_none() {
            return Err("a loss notice for a page this site did not ask for".into());
        }
        aux.pending = None;
        aux.lost = Some(site);
        let waiters = std::mem::take(&mut aux.waiters);
        for (process, _) in waiters {
            self.actions.push(Action::Fail {
                process,
                segment,
                page,
                site,
            });
        }
        self.maybe_finish_detach(segment);
        Ok(())
    }

    /// A site was declared dead (holder role): it leaves the reader
    /// masks this site keeps as clock site (an invalidation no longer
    /// waits for its acknowledgement), messages it sent that wait for a
    /// grant are dropped, and when it was a segment's library, every
    /// fault needing more than what is held here fails from now on.
    pub(crate) fn holder_site_dead(&mut self, d: SiteId) {
        let segs: Vec<SegmentId> = self.segments.keys().copied().collect();
        for segment in segs {
            let lib_dead = segment.library == d;
            let seg = self.segments.get_mut(&segment).expect("segment");
            let mut finish = Vec::new();
            let mut fails = Vec::new();
            for (i, aux) in seg.pages.iter_mut().enumerate() {
                let page = PageNo(i as u32);
                aux.deferred.retain(|(f, _)| *f != d);
                if aux.is_clock {
                    aux.readers.remove(&d);
                    if aux
                        .collecting
                        .as_mut()
                        .is_some_and(|c| c.acks_left.remove(&d) && c.acks_left.is_empty())
                    {
                        finish.push(page);
                    }
                }
                if lib_dead {
                    if aux.held != Held::Write && aux.lost.is_none() {
                        aux.lost = Some(d);
                    }
                    if aux.pending.take().is_some() {
                        for (process, _) in aux.waiters.drain(..) {
                            fails.push(Action::Fail {
                                process,
                                segment,
                                page,
                                site: d,
                            });
                        }
                    }
                }
            }
            self.actions.extend(fails);
            if lib_dead {
                // No library will answer: a detach or attach in progress
                // completes here, the segment gone.
                let seg = self.segments.get(&segment).expect("segment");
                if seg.detach_waiter.is_some() || seg.geometry.is_none() {
                    let seg = self.segments.remove(&segment).expect("segment");
                    self.invalidate_held(segment, &seg);
                    if let Some(process) = seg.detach_waiter {
                        self.actions.push(Action::Detached { segment, process });
                    }
                    self.actions.push(Action::Destroyed { segment });
                    continue;
                }
            }
            for page in finish {
                self.clock_finish(segment, page);
            }
        }
    }

    /// A message that names a grant this site has not installed yet
    /// overtook it on another virtual circuit: hold it until the grant.
    fn must_defer(&self, msg: &Msg) -> bool {
        let epoch_min = match msg {
            Msg::Recall { epoch_min, .. }
            | Msg::Invalidate { epoch_min, .. }
            | Msg::ForgetReader { epoch_min, .. }
            | Msg::ClockMoved { epoch_min, .. } => *epoch_min,
            _ => return false,
        };
        let (segment, page) = msg_page(msg).expect("names a page");
        self.segments
            .get(&segment)
            .and_then(|s| s.pages.get(page.0 as usize))
            .is_some_and(|aux| aux.epoch < epoch_min)
    }

    pub(crate) fn aux_mut(&mut self, segment: SegmentId, page: PageNo) -> &mut AuxPte {
        &mut self
            .segments
            .get_mut(&segment)
            .expect("segment known here")
            .pages[page.0 as usize]
    }

    fn attach_ok(&mut self, segment: SegmentId, geometry: Geometry) -> Result<(), String> {
        let Some(seg) = self.segments.get_mut(&segment) else {
            return Err("an attach this site did not ask for".into());
        };
        let bytes = geometry.pages as u64 * geometry.page_bytes as u64;
        if geometry.pages == 0 || geometry.page_bytes == 0 || bytes > MAX_SEGMENT_BYTES {
            return Err(format!(
                "a geometry of {} pages of {} bytes",
                geometry.pages, geometry.page_bytes
            ));
        }
        if seg.geometry.as_ref().is_some_and(|g| *g != geometry) {
            return Err("a geometry other than the one known here".into());
        }
        if seg.geometry.is_none() {
            let page = AuxPte {
                bytes: vec![0; geometry.page_bytes as usize],
                ..AuxPte::default()
            };
            seg.pages = vec![page; geometry.pages as usize];
            seg.geometry = Some(geometry.clone());
        }
        for process in std::mem::take(&mut seg.attach_waiters) {
            seg.processes.insert(process);
            self.actions.push(Action::Attached {
                segment,
                process,
                geometry: geometry.clone(),
            });
        }
        Ok(())
    }

    fn detach_ok(&mut self, segment: SegmentId) -> Result<(), String> {
        let asked = self
            .segments
            .get(&segment)
            .is_some_and(|s| s.detach_waiter.is_some() && !s.detach_pending);
        if !asked {
            return Err("a detach this site did not ask for".into());
        }
        let seg = self.segments.remove(&segment).expect("checked");
        // Copies of lost pages were not recalled: they go now.
        self.invalidate_held(segment, &seg);
        let process = seg.detach_waiter.expect("checked");
        self.actions.push(Action::Detached { segment, process });
        if !seg.attach_waiters.is_empty() {
            // Processes attached while the site was detaching: start again.
            let waiters = seg.attach_waiters;
            for p in waiters {
                self.attach(segment, p);
            }
        }
        Ok(())
    }

    fn destroyed(&mut self, segment: SegmentId) -> Result<(), String> {
        if self
            .segments
            .get(&segment)
            .is_some_and(|s| !s.processes.is_empty() || s.detach_waiter.is_some())
        {
            return Err("destroyed while attached here".into());
        }
        self.segments.remove(&segment);
        self.actions.push(Action::Destroyed { segment });
        Ok(())
    }

    /// A grant arrives: a page copy, or an upgrade notification.
    #[allow(clippy::too_many_arguments)]
    fn install(
        &mut self,
        from: SiteId,
        segment: SegmentId,
        page: PageNo,
        op: u64,
        epoch: u64,
        access: Access,
        bytes: Option<Vec<u8>>,
        window_ticks: u32,
        clock_of: Option<Vec<Reader>>,
    ) -> Result<(), String> {
        let now = self.now;
        let me = self.id;
        if let Some(r) = clock_of
            .iter()
            .flatten()
            .find(|r| !self.known_site(r.site) || r.site == me)
        {
            return Err(format!("names reader site {}", r.site.0));
        }
        if clock_of.is_some() && access == Access::Write {
            return Err("a write grant with a reader mask".into());
        }
        let aux = self.aux_mut(segment, page);
        if aux.pending != Some(access) {
            return Err(format!(
                "a grant this site did not ask for (from site {})",
                from.0
            ));
        }
        if epoch <= aux.epoch {
            return Err(format!(
                "a grant of epoch {epoch}, not newer than the copy held (epoch {})",
                aux.epoch
            ));
        }
        match &bytes {
            Some(b) if b.len() != aux.bytes.len() => {
                return Err(format!(
                    "{} bytes for a page of {}",
                    b.len(),
                    aux.bytes.len()
                ));
            }
            Some(b) => aux.bytes.clone_from(b),
            // Optimization 1 (§6.1): a reader upgraded keeps its bytes.
            None if aux.held != Held::Read => {
                return Err("an upgrade without a read copy in place".into());
            }
            None => {}
        }
        aux.held = if access == Access::Write {
            Held::Write
        } else {
            Held::Read
        };
        aux.is_clock = access == Access::Write || clock_of.is_some();
        aux.readers = clock_of
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.site, r.epoch))
            .collect();
        aux.window_ticks = window_ticks;
        aux.install_time = now;
        aux.epoch = epoch;
        aux.pending = None;
        self.actions.push(Action::Install {
            segment,
            page,
            access,
            bytes,
        });
        if self.id == segment.library {
            // At the library site the grant doubles as `Done`.
            self.lib_done(segment, page, op);
        }
        self.wake_waiters(segment, page);
        self.replay_deferred(segment, page);
        self.maybe_finish_detach(segment);
        Ok(())
    }

    /// Unmaps every page of a segment (just removed from this site) that
    /// still held a copy.
    fn invalidate_held(&mut self, segment: SegmentId, seg: &SiteSegment) {
        for (i, aux) in seg.pages.iter().enumerate() {
            if aux.held != Held::Nothing {
                self.actions.push(Action::Invalidate {
                    segment,
                    page: PageNo(i as u32),
                });
            }
        }
    }

    fn wake_waiters(&mut self, segment: SegmentId, page: PageNo) {
        let aux = self.aux_mut(segment, page);
        let held = aux.held;
        let (ready, still): (Vec<_>, Vec<_>) =
            aux.waiters.drain(..).partition(|(_, a)| held.allows(*a));
        aux.waiters = still;
        let next_write = aux.waiters.first().map(|&(p, _)| p);
        for (process, _) in ready {
            self.actions.push(Action::Wake {
                process,
                segment,
                page,
            });
        }
        if let Some(process) = next_write {
            // Writers that slept behind a read grant now ask for the write.
            self.aux_mut(segment, page).pending = Some(Access::Write);
            self.send(
                segment.library,
                Msg::Request {
                    segment,
                    page,
                    access: Access::Write,
                    process,
                },
            );
        }
    }

    fn replay_deferred(&mut self, segment: SegmentId, page: PageNo) {
        let deferred = std::mem::take(&mut self.aux_mut(segment, page).deferred);
        for (from, msg) in deferred {
            let kind = msg.kind();
            if let Err(reason) = self.holder_receive(from, msg) {
                self.peer_error(from, format!("{kind}: {reason}"));
            }
        }
    }

    /// The clock site receives the library's request (§6.1, Table 1).
    fn clock_recall(
        &mut self,
        segment: SegmentId,
        page: PageNo,
        op: u64,
        want: Want,
        grant_epoch: u64,
        window_ticks: u32,
    ) -> Result<(), String> {
        let (mutation, honour_within) = (self.config.mutation, self.config.honour_within_ns);
        let now = self.now;
        let tick_ns = self.config.tick_ns;
        let me = self.id;
        let bad_site = match &want {
            Want::Read(sites) => sites
                .iter()
                .copied()
                .find(|s| !self.known_site(*s) || *s == me),
            Want::Write(w) => Some(*w).filter(|w| !self.known_site(*w)),
            Want::CheckIn => None,
        };
        if let Some(s) = bad_site {
            return Err(format!("wants a copy for site {}", s.0));
        }
        let aux = self.aux_mut(segment, page);
        if !aux.is_clock || aux.held == Held::Nothing {
            return Err("this site is not the page's clock site".into());
        }
        if aux.collecting.is_some() || aux.honour.is_some() {
            return Err("a recall while another one is being served".into());
        }
        if op <= aux.last_op {
            return Err(format!(
                "op {op} was already served (latest {})",
                aux.last_op
            ));
        }
        match &want {
            Want::Read(sites)
                if sites.is_empty() || sites.iter().any(|s| aux.readers.contains_key(s)) =>
            {
                return Err("wants read copies for no site or for a reader".into());
            }
            Want::Write(w) if *w == me && aux.held != Held::Read => {
                return Err("wants the write copy for its own writer".into());
            }
            _ => {}
        }
        let readers_join_readers = aux.held == Held::Read && matches!(want, Want::Read(_));
        // Table 1: only readers + reader request skips the clock check; a
        // detaching clock site gives up its rights without one.
        // A sole reader upgrading its own copy is not checked either, though
        // Table 1's row (Readers, Writer) says "Yes": the check guards an
        // invalidation (§6.1: "When the clock site gets the invalidation
        // message, it checks to see if the page's Δ has expired"), and Δ is
        // the window in which holders are "guaranteed to uninterruptably
        // possess the page"; here nobody is invalidated and nobody loses the
        // page. Read literally, the row makes a site wait out its own read
        // window before its first write: every loop of §8 would then wait a
        // whole Δ at its start (docs/papers/fleisch89.md).
        let sole_reader_upgrades =
            aux.held == Held::Read && aux.readers.is_empty() && want == Want::Write(me);
        let skip_check = readers_join_readers
            || sole_reader_upgrades
            || want == Want::CheckIn
            || (mutation == Mutation::SkipDeltaCheckOnWrite && matches!(want, Want::Write(_)));
        if !skip_check {
            // Whole ticks of real time since the install (§9: Δ is real
            // time). Under a tick, a window of two has two ticks left: the
            // "sleeps of 33 msecs" at Δ=2 of §7.3.
            let elapsed = (now.0 - aux.install_time.0) / tick_ns;
            if elapsed < aux.window_ticks as u64 {
                let ticks_left = (aux.window_ticks as u64 - elapsed) as u32;
                let expiry = Nanos(aux.install_time.0 + aux.window_ticks as u64 * tick_ns);
                if honour_within.is_some_and(|h| expiry.0 - now.0 < h) {
                    // §7.1 option: less than a round trip left, so queue the
                    // invalidation here and honour it at expiry.
                    aux.honour = Some(recall_msg(
                        segment,
                        page,
                        op,
                        want,
                        grant_epoch,
                        window_ticks,
                    ));
                    let timer = Timer::HonourRecall { segment, page, op };
                    self.actions.push(Action::SetTimer { at: expiry, timer });
                } else {
                    self.send(
                        segment.library,
                        Msg::Refused {
                            segment,
                            page,
                            op,
                            ticks_left,
                        },
                    );
                }
                return Ok(());
            }
        }
        self.clock_accept(segment, page, op, want, grant_epoch, window_ticks);
        Ok(())
    }

    /// The §7.1 queued invalidation's timer: Δ has expired, honour it.
    pub(crate) fn holder_honour(&mut self, segment: SegmentId, page: PageNo, op: u64) {
        let Some(aux) = self
            .segments
            .get_mut(&segment)
            .and_then(|s| s.pages.get_mut(page.0 as usize))
        else {
            return;
        };
        let queued = aux.honour.take();
        if let Some(Msg::Recall {
            op: queued_op,
            want,
            grant_epoch,
            window_ticks,
            ..
        }) = queued
        {
            assert_eq!(queued_op, op, "one queued invalidation per page");
            self.clock_accept(segment, page, op, want, grant_epoch, window_ticks);
        }
    }

    /// The invalidation is honoured: invalidate the other readers one
    /// point-to-point message each (§7.1, no multicast), then grant.
    fn clock_accept(
        &mut self,
        segment: SegmentId,
        page: PageNo,
        op: u64,
        want: Want,
        grant_epoch: u64,
        window_ticks: u32,
    ) {
        let mutation = self.config.mutation;
        let me = self.id;
        let aux = self.aux_mut(segment, page);
        aux.last_op = aux.last_op.max(op);
        let old_readers: BTreeSet<SiteId> = aux.readers.keys().copied().collect();
        let targets: BTreeMap<SiteId, u64> = match &want {
            // Readers + readers, or writer + readers: nobody is invalidated.
            Want::Read(_) => BTreeMap::new(),
            Want::Write(new_writer) => aux
                .readers
                .iter()
                .filter(|(s, _)| *s != new_writer)
                .map(|(s, e)| (*s, *e))
                .collect(),
            Want::CheckIn => aux.readers.clone(),
        };
        let acks_left: BTreeSet<SiteId> = targets.keys().copied().collect();
        aux.collecting = Some(Collecting {
            op,
            want,
            grant_epoch,
            window_ticks,
            acks_left,
            old_readers,
        });
        for (site, epoch_min) in targets {
            debug_assert_ne!(site, me);
            self.send(
                site,
                Msg::Invalidate {
                    segment,
                    page,
                    op,
                    epoch_min,
                },
            );
        }
        let aux = self.aux_mut(segment, page);
        let all_acked = aux
            .collecting
            .as_ref()
            .is_some_and(|c| c.acks_left.is_empty());
        if all_acked || mutation == Mutation::AcksNotAwaited {
            self.clock_finish(segment, page);
        }
    }

    fn clock_ack(
        &mut self,
        from: SiteId,
        segment: SegmentId,
        page: PageNo,
        op: u64,
    ) -> Result<(), String> {
        let mutation = self.config.mutation;
        let aux = self.aux_mut(segment, page);
        let Some(c) = aux.collecting.as_mut().filter(|c| c.op == op) else {
            // The broken variant finishes before every ack is in.
            if mutation == Mutation::AcksNotAwaited {
                return Ok(());
            }
            return Err(format!("no invalidation op {op} in progress here"));
        };
        if !c.acks_left.remove(&from) {
            return Err("an ack from a site not invalidated".into());
        }
        if c.acks_left.is_empty() {
            self.clock_finish(segment, page);
        }
        Ok(())
    }

    /// All acknowledgements are in: apply Table 1 and the optimizations,
    /// sending the page directly to the requester(s) (§6).
    fn clock_finish(&mut self, segment: SegmentId, page: PageNo) {
        let me = self.id;
        let now = self.now;
        let aux = self.aux_mut(segment, page);
        let c = aux.collecting.take().expect("an invalidation in progress");
        let mut recipients: Vec<SiteId> = Vec::new();
        match c.want {
            Want::Read(sites) => {
                if aux.held == Held::Write {
                    // Optimization 2: the downgraded writer keeps read access
                    // and stays clock site. The read set it now heads is
                    // granted the page here, so its Δ starts now (§6.1:
                    // the readers are "guaranteed to uninterruptably possess
                    // the page" for Δ; the writer's old install time would
                    // let a new reader lose its copy at once).
                    aux.held = Held::Read;
                    aux.install_time = now;
                    self.actions.push(Action::Downgrade { segment, page });
                }
                let aux = self.aux_mut(segment, page);
                let (bytes, window) = (aux.bytes.clone(), aux.window_ticks);
                for &s in &sites {
                    aux.readers.insert(s, c.grant_epoch);
                }
                for &s in &sites {
                    let msg = page_msg(
                        segment,
                        page,
                        c.op,
                        c.grant_epoch,
                        Access::Read,
                        bytes.clone(),
                        window,
                        None,
                    );
                    self.send(s, msg);
                }
                recipients = sites;
            }
            Want::Write(w) if w == me => {
                // The clock site itself becomes writer: upgrade in place.
                aux.readers.clear();
                aux.held = Held::Write;
                aux.window_ticks = c.window_ticks;
                aux.install_time = now;
                aux.epoch = c.grant_epoch;
                aux.pending = None;
                self.actions.push(Action::Install {
                    segment,
                    page,
                    access: Access::Write,
                    bytes: None,
                });
                self.wake_waiters(segment, page);
                self.maybe_finish_detach(segment);
                recipients.push(me);
            }
            Want::Write(w) => {
                let bytes = self.clock_give_up(segment, page);
                let msg = if c.old_readers.contains(&w) {
                    // Optimization 1: a notification, not a page copy.
                    Msg::Upgrade {
                        segment,
                        page,
                        op: c.op,
                        epoch: c.grant_epoch,
                        window_ticks: c.window_ticks,
                    }
                } else {
                    page_msg(
                        segment,
                        page,
                        c.op,
                        c.grant_epoch,
                        Access::Write,
                        bytes,
                        c.window_ticks,
                        None,
                    )
                };
                self.send(w, msg);
                recipients.push(w);
            }
            Want::CheckIn => {
                let bytes = self.clock_give_up(segment, page);
                self.send(
                    segment.library,
                    Msg::CheckedIn {
                        segment,
                        page,
                        op: c.op,
                        bytes,
                    },
                );
                return;
            }
        }
        // The library learns the op is complete; a grant to the library
        // site itself already tells it.
        if !recipients.contains(&segment.library) {
            self.send(
                segment.library,
                Msg::Done {
                    segment,
                    page,
                    op: c.op,
                },
            );
        } else if me == segment.library {
            self.lib_done(segment, page, c.op);
        }
    }

    /// The clock site invalidates its own copy and returns its bytes.
    fn clock_give_up(&mut self, segment: SegmentId, page: PageNo) -> Vec<u8> {
        let aux = self.aux_mut(segment, page);
        aux.held = Held::Nothing;
        aux.is_clock = false;
        aux.readers.clear();
        let bytes = aux.bytes.clone();
        self.actions.push(Action::Invalidate { segment, page });
        bytes
    }

    /// A non-clock reader drops its copy and acknowledges (§6.1).
    fn reader_invalidate(
        &mut self,
        from: SiteId,
        segment: SegmentId,
        page: PageNo,
        op: u64,
    ) -> Result<(), String> {
        if self
            .segments
            .get(&segment)
            .is_some_and(|s| s.geometry.is_some())
        {
            let aux = self.aux_mut(segment, page);
            if aux.is_clock {
                return Err("the clock site is never invalidated by a peer".into());
            }
            if aux.held != Held::Nothing {
                aux.held = Held::Nothing;
                self.actions.push(Action::Invalidate { segment, page });
            }
        }
        self.send(from, Msg::InvalidateAck { segment, page, op });
        Ok(())
    }
}

fn recall_msg(
    segment: SegmentId,
    page: PageNo,
    op: u64,
    want: Want,
    grant_epoch: u64,
    window_ticks: u32,
) -> Msg {
    Msg::Recall {
        segment,
        page,
        op,
        want,
        epoch_min: 0,
        grant_epoch,
        window_ticks,
    }
}

fn msg_page(msg: &Msg) -> Option<(SegmentId, PageNo)> {
    match msg {
        Msg::Recall { segment, page, .. }
        | Msg::Invalidate { segment, page, .. }
        | Msg::InvalidateAck { segment, page, .. }
        | Msg::ForgetReader { segment, page, .. }
        | Msg::Page { segment, page, .. }
        | Msg::Upgrade { segment, page, .. }
        | Msg::Lost { segment, page, .. }
        | Msg::ClockMoved { segment, page, .. } => Some((*segment, *page)),
        _ => None,
    }
}

/// The segment of a message only its library site may send.
fn library_only(msg: &Msg) -> Option<SegmentId> {
    match msg {
        Msg::Recall { segment, .. }
        | Msg::ForgetReader { segment, .. }
        | Msg::AttachOk { segment, .. }
        | Msg::DetachOk { segment }
        | Msg::Destroyed { segment }
        | Msg::Lost { segment, .. }
        | Msg::ClockMoved { segment, .. } => Some(*segment),
        _ => None,
    }
}

/// Messages a site keeps for one page until the grant they need.
const MAX_DEFERRED: usize = 64;

/// The largest segment a peer's geometry may describe.
const MAX_SEGMENT_BYTES: u64 = 1 << 32;
