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
        if !seg.processes.is_empty() {
            self.actions.push(Action::Detached { segment, process });
            return;
        }
        assert!(
            seg.pages.iter().all(|p| p.waiters.is_empty()),
            "a process detached while asleep on a fault"
        );
        seg.detach_waiter = Some(process);
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

    pub(crate) fn holder_receive(&mut self, from: SiteId, msg: Msg) {
        if self.must_defer(&msg) {
            let (segment, page) = msg_page(&msg).expect("deferred messages name a page");
            self.aux_mut(segment, page).deferred.push((from, msg));
            return;
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
                ..
            } => {
                let aux = self.aux_mut(segment, page);
                assert!(aux.is_clock, "only the clock site keeps the reader mask");
                aux.readers.remove(&site);
            }
            Msg::AttachOk { segment, geometry } => self.attach_ok(segment, geometry),
            Msg::DetachOk { segment } => self.detach_ok(segment),
            Msg::Destroyed { segment } => self.destroyed(segment),
            other => unreachable!("{} is not for a holder", other.kind()),
        }
    }

    /// A message that names a grant this site has not installed yet
    /// overtook it on another virtual circuit: hold it until the grant.
    fn must_defer(&self, msg: &Msg) -> bool {
        let epoch_min = match msg {
            Msg::Recall { epoch_min, .. }
            | Msg::Invalidate { epoch_min, .. }
            | Msg::ForgetReader { epoch_min, .. } => *epoch_min,
            _ => return false,
        };
        let (segment, page) = msg_page(msg).expect("names a page");
        self.segments
            .get(&segment)
            .is_some_and(|s| s.pages[page.0 as usize].epoch < epoch_min)
    }

    pub(crate) fn aux_mut(&mut self, segment: SegmentId, page: PageNo) -> &mut AuxPte {
        &mut self
            .segments
            .get_mut(&segment)
            .expect("segment known here")
            .pages[page.0 as usize]
    }

    fn attach_ok(&mut self, segment: SegmentId, geometry: Geometry) {
        let seg = self.segments.get_mut(&segment).expect("attach was asked");
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
    }

    fn detach_ok(&mut self, segment: SegmentId) {
        let seg = self.segments.remove(&segment).expect("detach was asked");
        debug_assert!(
            seg.pages.iter().all(|p| p.held == Held::Nothing),
            "pages left after release"
        );
        let process = seg.detach_waiter.expect("a detaching process");
        self.actions.push(Action::Detached { segment, process });
        if !seg.attach_waiters.is_empty() {
            // Processes attached while the site was detaching: start again.
            let waiters = seg.attach_waiters;
            for p in waiters {
                self.attach(segment, p);
            }
        }
    }

    fn destroyed(&mut self, segment: SegmentId) {
        if let Some(seg) = self.segments.remove(&segment) {
            debug_assert!(seg.processes.is_empty(), "destroyed while attached");
        }
        self.actions.push(Action::Destroyed { segment });
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
    ) {
        let now = self.now;
        let aux = self.aux_mut(segment, page);
        assert_eq!(
            aux.pending,
            Some(access),
            "a grant this site did not ask for (from {from:?})"
        );
        assert!(epoch > aux.epoch, "a grant older than the copy held");
        match &bytes {
            Some(b) => aux.bytes.clone_from(b),
            // Optimization 1 (§6.1): a reader upgraded keeps its bytes.
            None => assert_eq!(
                aux.held,
                Held::Read,
                "an upgrade needs a read copy in place"
            ),
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
            self.holder_receive(from, msg);
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
    ) {
        let (mutation, honour_within) = (self.config.mutation, self.config.honour_within_ns);
        let now = self.now;
        let tick_ns = self.config.tick_ns;
        let me = self.id;
        let aux = self.aux_mut(segment, page);
        assert!(
            aux.is_clock && aux.held != Held::Nothing,
            "recall sent to a site that is not the clock site"
        );
        let readers_join_readers = aux.held == Held::Read && matches!(want, Want::Read(_));
        // Table 1: only readers + reader request skips the clock check; a
        // detaching clock site gives up its rights without one.
        // Design decision: a sole reader upgrading its own copy cuts no
        // one's Δ short (nobody is invalidated), so it is not checked.
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
                return;
            }
        }
        self.clock_accept(segment, page, op, want, grant_epoch, window_ticks);
    }

    /// The §7.1 queued invalidation's timer: Δ has expired, honour it.
    pub(crate) fn holder_honour(&mut self, segment: SegmentId, page: PageNo, op: u64) {
        let queued = self.aux_mut(segment, page).honour.take();
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

    fn clock_ack(&mut self, from: SiteId, segment: SegmentId, page: PageNo, op: u64) {
        let aux = self.aux_mut(segment, page);
        let Some(c) = aux.collecting.as_mut().filter(|c| c.op == op) else {
            // Only the broken variant finishes before every ack is in.
            assert_eq!(
                self.config.mutation,
                Mutation::AcksNotAwaited,
                "stray invalidation ack"
            );
            return;
        };
        assert!(c.acks_left.remove(&from), "ack from a site not invalidated");
        if c.acks_left.is_empty() {
            self.clock_finish(segment, page);
        }
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
    fn reader_invalidate(&mut self, from: SiteId, segment: SegmentId, page: PageNo, op: u64) {
        if self
            .segments
            .get(&segment)
            .is_some_and(|s| s.geometry.is_some())
        {
            let aux = self.aux_mut(segment, page);
            assert!(
                !aux.is_clock,
                "the clock site is never invalidated by a peer"
            );
            if aux.held != Held::Nothing {
                aux.held = Held::Nothing;
                self.actions.push(Action::Invalidate { segment, page });
            }
        }
        self.send(from, Msg::InvalidateAck { segment, page, op });
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
        | Msg::ForgetReader { segment, page, .. }
        | Msg::Page { segment, page, .. }
        | Msg::Upgrade { segment, page, .. } => Some((*segment, *page)),
        _ => None,
    }
}
