//! Unit tests of the core: Table 1's four cases, the two optimizations,
//! Δ refusal and retry, §7.1's option, dynamic Δ, detach and destroy, the
//! request log, batched read grants, and the wire format.

use super::*;
use std::collections::VecDeque;

const TICK: u64 = 1_000_000;

/// A zero-delay FIFO network of sites, driven by hand.
struct Net {
    sites: Vec<Site>,
    now: u64,
    inflight: VecDeque<(SiteId, SiteId, Msg)>,
    /// Every network message delivered, in order.
    wire: Vec<(SiteId, SiteId, Msg)>,
    timers: Vec<(Nanos, SiteId, Timer)>,
    actions: Vec<(SiteId, Action)>,
    seg: SegmentId,
}

fn pid(site: u16) -> ProcessId {
    ProcessId(site as u32 * 10)
}

impl Net {
    /// `n` sites; site 0 creates a segment of `pages` pages with Δ = `window`
    /// ticks, and one process per site attaches.
    fn new(n: u16, pages: u32, window: u32, config: CoreConfig) -> Net {
        let peers: Vec<SiteId> = (0..n).map(SiteId).collect();
        let sites = peers
            .iter()
            .map(|&id| Site::new(id, peers.clone(), config.clone()))
            .collect();
        let mut net = Net {
            sites,
            now: 0,
            inflight: VecDeque::new(),
            wire: Vec::new(),
            timers: Vec::new(),
            actions: Vec::new(),
            seg: SegmentId {
                library: SiteId(0),
                serial: 0,
            },
        };
        let geometry = Geometry {
            name: "t".into(),
            pages,
            page_bytes: 16,
            window_ticks: window,
        };
        net.ev(
            0,
            Event::Create {
                geometry,
                process: pid(0),
            },
        );
        for s in 0..n {
            net.ev(
                s,
                Event::Attach {
                    segment: net.seg,
                    process: pid(s),
                },
            );
        }
        net.settle();
        net.wire.clear();
        net.actions.clear();
        net
    }

    fn ev(&mut self, site: u16, event: Event) {
        let acts = self.sites[site as usize].handle(Nanos(self.now), event);
        for a in acts {
            match &a {
                Action::Send { to, msg } => {
                    self.inflight.push_back((SiteId(site), *to, msg.clone()))
                }
                Action::SetTimer { at, timer } => self.timers.push((*at, SiteId(site), *timer)),
                _ => {}
            }
            self.actions.push((SiteId(site), a));
        }
    }

    fn settle(&mut self) {
        while let Some((from, to, msg)) = self.inflight.pop_front() {
            self.wire.push((from, to, msg.clone()));
            self.ev(to.0, Event::Received { from, msg });
        }
    }

    fn fault(&mut self, site: u16, page: u32, access: Access) {
        let event = Event::Fault {
            segment: self.seg,
            page: PageNo(page),
            process: pid(site),
            access,
        };
        self.ev(site, event);
        self.settle();
    }

    fn fire_timers(&mut self) {
        let timers = std::mem::take(&mut self.timers);
        for (at, site, timer) in timers {
            self.now = self.now.max(at.0);
            self.ev(site.0, Event::TimerFired(timer));
        }
        self.settle();
    }

    fn held(&self, site: u16, page: u32) -> Held {
        self.sites[site as usize]
            .page_view(self.seg, PageNo(page))
            .expect("attached")
            .held
    }

    fn clock(&self, site: u16) -> bool {
        self.sites[site as usize]
            .page_view(self.seg, PageNo(0))
            .expect("attached")
            .is_clock
    }

    fn kinds(&self) -> Vec<&'static str> {
        self.wire.iter().map(|(_, _, m)| m.kind()).collect()
    }

    fn reset_log(&mut self) {
        self.wire.clear();
        self.actions.clear();
    }

    fn woken(&self, site: u16) -> bool {
        self.actions.iter().any(|(s, a)| {
            *s == SiteId(site) && matches!(a, Action::Wake { process, .. } if *process == pid(site))
        })
    }
}

fn cfg() -> CoreConfig {
    CoreConfig {
        tick_ns: TICK,
        ..CoreConfig::default()
    }
}

#[test]
fn table1_readers_plus_reader_request_has_no_clock_check_and_tells_the_clock_site() {
    let mut net = Net::new(3, 1, 10, cfg());
    net.fault(1, 0, Access::Read);
    net.reset_log();
    net.fault(2, 0, Access::Read); // inside site 1's Δ: no refusal
    assert_eq!(
        net.kinds(),
        ["read-request", "recall-for-read", "page-ro", "done"]
    );
    assert_eq!((net.held(1, 0), net.held(2, 0)), (Held::Read, Held::Read));
    assert!(
        net.clock(1) && !net.clock(2),
        "the clock site stays fixed while readers join"
    );
    assert!(
        net.sites[1].segments[&net.seg].pages[0]
            .readers
            .contains_key(&SiteId(2)),
        "clock told of the reader"
    );
}

#[test]
fn table1_readers_plus_writer_request_invalidates_and_upgrades_in_place() {
    let mut net = Net::new(4, 1, 0, cfg());
    for s in 1..=3 {
        net.fault(s, 0, Access::Read);
    }
    net.reset_log();
    net.fault(2, 0, Access::Write);
    // Invalidation goes to the clock site (1) only; it invalidates site 3
    // and waits for the ack, then notifies site 2 without a page copy.
    assert_eq!(
        net.kinds(),
        [
            "write-request",
            "recall-for-write",
            "invalidate",
            "invalidate-ack",
            "upgrade",
            "done"
        ]
    );
    assert_eq!(
        (net.held(1, 0), net.held(2, 0), net.held(3, 0)),
        (Held::Nothing, Held::Write, Held::Nothing)
    );
    assert!(
        !net.wire.iter().any(|(_, _, m)| m.carries_page()),
        "optimization 1: no page copy"
    );
}

#[test]
fn table1_writer_plus_reader_request_downgrades_the_writer_which_keeps_read() {
    let mut net = Net::new(3, 1, 0, cfg());
    net.fault(1, 0, Access::Write);
    net.sites[1].write(net.seg, PageNo(0), 0, &[7]);
    net.reset_log();
    net.fault(2, 0, Access::Read);
    assert_eq!(
        net.kinds(),
        ["read-request", "recall-for-read", "page-ro", "done"]
    );
    assert_eq!(
        (net.held(1, 0), net.held(2, 0)),
        (Held::Read, Held::Read),
        "optimization 2"
    );
    assert!(net.clock(1), "the downgraded writer is the clock site");
    assert_eq!(net.sites[2].read(net.seg, PageNo(0), 0, 1), [7]);
}

#[test]
fn table1_writer_plus_writer_request_invalidates_and_moves_the_page() {
    let mut net = Net::new(3, 1, 0, cfg());
    net.fault(1, 0, Access::Write);
    net.sites[1].write(net.seg, PageNo(0), 0, &[9]);
    net.reset_log();
    net.fault(2, 0, Access::Write);
    assert_eq!(
        net.kinds(),
        ["write-request", "recall-for-write", "page-rw", "done"]
    );
    assert_eq!(
        (net.held(1, 0), net.held(2, 0)),
        (Held::Nothing, Held::Write)
    );
    assert_eq!(net.sites[2].read(net.seg, PageNo(0), 0, 1), [9]);
}

#[test]
fn downgrade_then_upgrade_costs_two_advisory_messages_and_no_page() {
    // The library is on the writer's site, so only the protocol's own
    // messages cross the network.
    let mut net = Net::new(2, 1, 0, cfg());
    net.fault(0, 0, Access::Write);
    net.fault(1, 0, Access::Read);
    net.reset_log();
    net.fault(0, 0, Access::Write);
    assert_eq!(net.kinds(), ["invalidate", "invalidate-ack"]);
    assert_eq!(
        (net.held(0, 0), net.held(1, 0)),
        (Held::Write, Held::Nothing)
    );
}

#[test]
fn a_sole_reader_upgrades_inside_its_own_window() {
    // Table 1's (Readers, Writer) row is clock-checked, but the check guards
    // an invalidation (§6.1), and a sole reader upgrading its own copy
    // invalidates nobody: it is upgraded at once, in place (no page), even
    // inside its own Δ (documented departure, core/holder.rs).
    let mut net = Net::new(2, 1, 3, cfg());
    net.fault(1, 0, Access::Read);
    assert!(net.clock(1), "the sole reader is the clock site");
    net.now = TICK + 10;
    net.reset_log();
    net.fault(1, 0, Access::Write);
    assert_eq!(
        net.kinds(),
        ["write-request", "recall-for-write", "done"],
        "not refused though one of three ticks is used"
    );
    assert!(net.timers.is_empty(), "the library does not sleep");
    assert_eq!(net.held(1, 0), Held::Write);
    assert!(net.woken(1));
}

#[test]
fn delta_refusal_reports_the_time_left_and_the_library_retries() {
    let mut net = Net::new(3, 1, 3, cfg());
    net.fault(1, 0, Access::Write);
    net.now = TICK + 10;
    net.reset_log();
    net.fault(2, 0, Access::Write);
    let refused = net.wire.iter().find_map(|(_, _, m)| match m {
        Msg::Refused { ticks_left, .. } => Some(*ticks_left),
        _ => None,
    });
    assert_eq!(refused, Some(2), "one of three ticks used: two left");
    assert_eq!(net.held(1, 0), Held::Write, "refused inside Δ");
    assert_eq!(net.timers.len(), 1);
    assert_eq!(
        net.timers[0].0,
        Nanos(TICK + 10 + 2 * TICK),
        "the library sleeps the time left"
    );
    net.fire_timers();
    assert_eq!(
        (net.held(1, 0), net.held(2, 0)),
        (Held::Nothing, Held::Write),
        "second attempt honoured"
    );
    assert!(net.woken(2));
}

#[test]
fn a_downgrade_grants_the_read_set_a_fresh_window() {
    // Site 1 writes; long after its Δ, site 2 reads: site 1 is downgraded
    // and heads the new read set {1, 2}, whose Δ starts at the downgrade.
    let mut net = Net::new(3, 1, 3, cfg());
    net.fault(1, 0, Access::Write);
    net.now = 10 * TICK;
    net.fault(2, 0, Access::Read);
    assert_eq!((net.held(1, 0), net.held(2, 0)), (Held::Read, Held::Read));
    assert!(net.clock(1), "the downgraded writer stays clock site");
    // A write request one tick later cuts the read set's window short:
    // refused with the two ticks left, not honoured on the writer's old
    // install time.
    net.now = 11 * TICK + 10;
    net.reset_log();
    net.fault(2, 0, Access::Write);
    let refused = net.wire.iter().find_map(|(_, _, m)| match m {
        Msg::Refused { ticks_left, .. } => Some(*ticks_left),
        _ => None,
    });
    assert_eq!(refused, Some(2), "the read set's Δ runs from the downgrade");
    assert_eq!(net.held(1, 0), Held::Read, "reader kept inside Δ");
    net.fire_timers();
    assert_eq!(
        (net.held(1, 0), net.held(2, 0)),
        (Held::Nothing, Held::Write),
        "upgraded in place once the read set's Δ is over"
    );
}

#[test]
fn section_7_1_option_queues_an_invalidation_with_less_than_a_round_trip_left() {
    let config = CoreConfig {
        honour_within_ns: Some(TICK + TICK / 2),
        ..cfg()
    };
    let mut net = Net::new(3, 1, 3, config);
    net.fault(1, 0, Access::Write);
    net.now = 2 * TICK + 10; // one tick left, less than 1.5 ticks
    net.reset_log();
    net.fault(2, 0, Access::Write);
    assert!(!net.kinds().contains(&"refused"), "queued, not refused");
    let (at, _, timer) = net.timers[0];
    assert!(matches!(timer, Timer::HonourRecall { .. }));
    assert_eq!(at, Nanos(3 * TICK), "honoured at Δ's expiry");
    net.fire_timers();
    assert_eq!(net.held(2, 0), Held::Write);
}

#[test]
fn section_7_1_option_still_refuses_with_more_than_a_round_trip_left() {
    let config = CoreConfig {
        honour_within_ns: Some(TICK / 2),
        ..cfg()
    };
    let mut net = Net::new(3, 1, 3, config);
    net.fault(1, 0, Access::Write);
    net.fault(2, 0, Access::Write);
    assert!(net.kinds().contains(&"refused"));
}

#[test]
fn dynamic_delta_changes_the_window_and_it_travels_with_the_page() {
    let config = CoreConfig {
        dynamic_delta: DynamicDelta::HalveOnRefusal { min_ticks: 1 },
        ..cfg()
    };
    let mut net = Net::new(3, 1, 8, config);
    net.fault(1, 0, Access::Write);
    net.fault(2, 0, Access::Write);
    assert!(net.kinds().contains(&"refused"));
    net.fire_timers();
    let v = net.sites[2].page_view(net.seg, PageNo(0)).unwrap();
    assert_eq!(
        (v.held, v.window_ticks),
        (Held::Write, 4),
        "halved Δ installed with the page"
    );
}

#[test]
fn dynamic_delta_is_off_by_default() {
    let mut net = Net::new(3, 1, 8, cfg());
    net.fault(1, 0, Access::Write);
    net.fault(2, 0, Access::Write);
    net.fire_timers();
    assert_eq!(
        net.sites[2]
            .page_view(net.seg, PageNo(0))
            .unwrap()
            .window_ticks,
        8
    );
}

#[test]
fn detach_checks_a_write_copy_back_in_and_the_library_serves_it() {
    let mut net = Net::new(3, 1, 5, cfg());
    net.fault(1, 0, Access::Write);
    net.sites[1].write(net.seg, PageNo(0), 0, &[42]);
    net.reset_log();
    net.ev(
        1,
        Event::Detach {
            segment: net.seg,
            process: pid(1),
        },
    );
    net.settle();
    assert_eq!(
        net.kinds(),
        ["detach", "recall-check-in", "checked-in", "detach-ok"],
        "no Δ wait on detach"
    );
    assert!(!net.sites[1].is_attached(net.seg));
    net.fault(2, 0, Access::Read);
    assert_eq!(
        net.sites[2].read(net.seg, PageNo(0), 0, 1),
        [42],
        "served checked-in by the library"
    );
}

#[test]
fn detach_of_a_plain_reader_updates_the_masks() {
    let mut net = Net::new(4, 1, 0, cfg());
    net.fault(1, 0, Access::Read);
    net.fault(2, 0, Access::Read);
    net.ev(
        2,
        Event::Detach {
            segment: net.seg,
            process: pid(2),
        },
    );
    net.settle();
    assert!(
        !net.sites[1].segments[&net.seg].pages[0]
            .readers
            .contains_key(&SiteId(2))
    );
    net.reset_log();
    net.fault(3, 0, Access::Write);
    assert!(
        !net.wire.iter().any(|(_, to, _)| *to == SiteId(2)),
        "the detached site is not invalidated"
    );
    assert_eq!(net.held(3, 0), Held::Write);
}

#[test]
fn the_last_detach_destroys_the_segment_and_every_site_is_told() {
    let mut net = Net::new(3, 2, 0, cfg());
    net.fault(1, 0, Access::Write);
    net.fault(2, 1, Access::Read);
    for s in [1, 2, 0] {
        net.ev(
            s,
            Event::Detach {
                segment: net.seg,
                process: pid(s),
            },
        );
        net.settle();
    }
    for s in 0..3 {
        assert!(
            net.actions
                .iter()
                .any(|(site, a)| *site == SiteId(s) && matches!(a, Action::Destroyed { .. })),
            "site {s}"
        );
    }
    assert!(net.sites[0].libraries.is_empty());
}

#[test]
fn the_request_log_skips_faults_on_sites_holding_a_valid_copy() {
    let mut net = Net::new(2, 1, 0, cfg());
    let other = ProcessId(11);
    net.ev(
        1,
        Event::Attach {
            segment: net.seg,
            process: other,
        },
    );
    net.fault(1, 0, Access::Read);
    net.reset_log();
    // A second process of the same site faults (its map was not yet
    // refreshed): the site's copy is valid, so no request and no log entry.
    net.ev(
        1,
        Event::Fault {
            segment: net.seg,
            page: PageNo(0),
            process: other,
            access: Access::Read,
        },
    );
    net.settle();
    assert!(net.wire.is_empty());
    assert!(
        net.actions
            .iter()
            .any(|(_, a)| matches!(a, Action::Wake { process, .. } if *process == other))
    );
    let log = net.sites[0].request_log(net.seg);
    assert_eq!(log.len(), 1);
    assert_eq!(
        (log[0].site, log[0].process, log[0].page),
        (SiteId(1), pid(1), PageNo(0))
    );
}

#[test]
fn read_requests_queued_behind_a_refusal_are_granted_together() {
    let mut net = Net::new(4, 1, 2, cfg());
    net.fault(1, 0, Access::Write);
    net.fault(2, 0, Access::Read); // refused: site 1's Δ
    net.fault(3, 0, Access::Read); // queued behind it
    net.reset_log();
    net.fire_timers();
    let recalls: Vec<&Want> = net
        .wire
        .iter()
        .filter_map(|(_, _, m)| match m {
            Msg::Recall { want, .. } => Some(want),
            _ => None,
        })
        .collect();
    assert_eq!(
        recalls,
        [&Want::Read(vec![SiteId(2), SiteId(3)])],
        "one batched recall"
    );
    assert_eq!((net.held(2, 0), net.held(3, 0)), (Held::Read, Held::Read));
}

#[test]
fn the_queue_is_per_page() {
    let mut net = Net::new(3, 2, 5, cfg());
    net.fault(1, 0, Access::Write);
    net.fault(2, 0, Access::Write); // page 0 waits out Δ
    net.fault(2, 1, Access::Write); // page 1 is not held up
    assert_eq!((net.held(1, 0), net.held(2, 1)), (Held::Write, Held::Write));
}

#[test]
fn messages_survive_the_wire_format() {
    let msg = Msg::Page {
        segment: SegmentId {
            library: SiteId(3),
            serial: 1,
        },
        page: PageNo(7),
        op: 9,
        epoch: 4,
        access: Access::Read,
        bytes: vec![1, 2, 3],
        window_ticks: 2,
        clock_of: Some(vec![Reader {
            site: SiteId(5),
            epoch: 4,
        }]),
    };
    let bytes = postcard::to_allocvec(&msg).expect("encode");
    assert_eq!(postcard::from_bytes::<Msg>(&bytes).expect("decode"), msg);
}

impl Net {
    /// Hands site `to` a message from `from` directly; returns its actions.
    fn inject(&mut self, from: u16, to: u16, msg: Msg) -> Vec<Action> {
        let event = Event::Received {
            from: SiteId(from),
            msg,
        };
        self.sites[to as usize].handle(Nanos(self.now), event)
    }

    /// Asserts that a message is refused, naming `from`, with no effect.
    fn refused(&mut self, from: u16, to: u16, msg: Msg, why: &str) {
        let before = self.sites[to as usize].state_digest();
        let acts = self.inject(from, to, msg);
        assert_eq!(self.sites[to as usize].state_digest(), before, "{why}");
        assert!(
            matches!(&acts[..], [Action::PeerError { site, reason }]
                if *site == SiteId(from) && reason.contains(why)),
            "{acts:?}"
        );
    }

    fn fails(&self, site: u16, page: u32) -> Option<SiteId> {
        self.actions.iter().find_map(|(s, a)| match a {
            Action::Fail {
                process,
                page: p,
                site: lost_at,
                ..
            } if *s == SiteId(site) && *process == pid(site) && p.0 == page => Some(*lost_at),
            _ => None,
        })
    }
}

#[test]
fn peer_messages_that_used_to_panic_are_refused_with_no_effect() {
    let mut net = Net::new(3, 2, 0, cfg());
    net.fault(1, 0, Access::Write);
    net.fault(2, 1, Access::Read);
    let seg = net.seg;
    let other = SegmentId {
        library: SiteId(0),
        serial: 77,
    };
    let request = |segment, page| Msg::Request {
        segment,
        page: PageNo(page),
        access: Access::Read,
        process: ProcessId(1),
    };
    net.refused(1, 0, request(other, 0), "unknown");
    net.refused(1, 0, request(seg, 9), "out of range");
    net.refused(1, 2, request(seg, 0), "library at site 0, not here");
    // An ack from a site that was not invalidated (no op in progress).
    let ack = Msg::InvalidateAck {
        segment: seg,
        page: PageNo(0),
        op: 1,
    };
    net.refused(2, 1, ack, "no invalidation op 1");
    // A grant older than (or as old as) the copy held, and one not asked for.
    let epoch = net.sites[1].page_view(seg, PageNo(0)).unwrap().epoch;
    let page = |epoch, access| Msg::Page {
        segment: seg,
        page: PageNo(0),
        op: 1,
        epoch,
        access,
        bytes: vec![9; 16],
        window_ticks: 0,
        clock_of: None,
    };
    net.refused(2, 1, page(epoch, Access::Write), "did not ask");
    net.refused(2, 2, page(epoch + 5, Access::Read), "did not ask");
    // Recalls only come from the library, and only to the clock site.
    let recall = Msg::Recall {
        segment: seg,
        page: PageNo(0),
        op: 99,
        want: Want::Write(SiteId(2)),
        epoch_min: 0,
        grant_epoch: 99,
        window_ticks: 0,
    };
    net.refused(2, 1, recall.clone(), "only the library");
    net.refused(0, 2, recall, "not the page's clock site");
    // A message kind unexpected for the role.
    net.refused(0, 1, Msg::DetachOk { segment: seg }, "did not ask");
    net.refused(
        2,
        0,
        Msg::Done {
            segment: seg,
            page: PageNo(0),
            op: 1,
        },
        "not in flight",
    );
    // Nothing moved: site 1 still writes page 0.
    assert_eq!(net.held(1, 0), Held::Write);
}

#[test]
fn a_process_may_detach_while_asleep_on_a_fault() {
    let mut net = Net::new(3, 1, 5, cfg());
    net.fault(1, 0, Access::Write);
    net.fault(2, 0, Access::Write); // refused: Δ; site 2 sleeps
    net.ev(
        2,
        Event::Detach {
            segment: net.seg,
            process: pid(2),
        },
    );
    net.settle();
    net.fire_timers(); // the grant comes, and is checked back in
    assert!(!net.sites[2].is_attached(net.seg));
    assert!(!net.woken(2), "a detached process is not woken");
    assert!(
        net.actions
            .iter()
            .any(|(s, a)| *s == SiteId(2) && matches!(a, Action::Detached { .. }))
    );
    net.fault(1, 0, Access::Read);
    assert_eq!(net.held(1, 0), Held::Read, "the page is served again");
}

#[test]
fn the_death_of_a_writer_loses_its_page_and_fails_requests_at_once() {
    let mut net = Net::new(3, 2, 0, cfg());
    net.fault(1, 0, Access::Write);
    net.fault(1, 1, Access::Read);
    net.fault(2, 1, Access::Read);
    // Site 2 asks for page 0; site 1 dies before answering the recall.
    net.ev(
        2,
        Event::Fault {
            segment: net.seg,
            page: PageNo(0),
            process: pid(2),
            access: Access::Read,
        },
    );
    // Deliver the request to the library only; the recall to site 1 is lost.
    let (from, to, msg) = net.inflight.pop_front().unwrap();
    net.ev(to.0, Event::Received { from, msg });
    net.inflight.clear();
    for s in [0, 2] {
        net.ev(s, Event::SiteDead { site: SiteId(1) });
    }
    net.settle();
    assert_eq!(net.fails(2, 0), Some(SiteId(1)), "the waiting fault fails");
    assert_eq!(
        net.sites[0].lost_pages(),
        [(net.seg, PageNo(0), SiteId(1))],
        "page 1 had another reader: not lost"
    );
    // Later requests fail too, at once; the read copy elsewhere stays.
    net.reset_log();
    net.fault(0, 0, Access::Write);
    assert_eq!(net.fails(0, 0), Some(SiteId(1)));
    assert_eq!(net.held(2, 1), Held::Read);
    assert!(!net.wire.iter().any(|(_, to, _)| *to == SiteId(1)));
}

#[test]
fn when_a_read_sets_clock_site_dies_the_lowest_surviving_reader_takes_over() {
    let mut net = Net::new(4, 1, 0, cfg());
    net.fault(1, 0, Access::Read); // served checked in: site 1 is clock
    net.fault(2, 0, Access::Read);
    net.fault(3, 0, Access::Read);
    assert!(net.clock(1));
    for s in [0, 2, 3] {
        net.ev(s, Event::SiteDead { site: SiteId(1) });
    }
    net.settle();
    assert!(net.clock(2), "lowest surviving reader");
    assert!(net.sites[0].lost_pages().is_empty());
    net.reset_log();
    net.fault(3, 0, Access::Write);
    assert_eq!(
        (net.held(2, 0), net.held(3, 0)),
        (Held::Nothing, Held::Write)
    );
    assert!(!net.wire.iter().any(|(_, to, _)| *to == SiteId(1)));
}

#[test]
fn an_invalidation_does_not_wait_for_a_dead_readers_ack() {
    let mut net = Net::new(4, 1, 0, cfg());
    net.fault(1, 0, Access::Read);
    net.fault(2, 0, Access::Read);
    net.ev(
        3,
        Event::Fault {
            segment: net.seg,
            page: PageNo(0),
            process: pid(3),
            access: Access::Write,
        },
    );
    // Run until site 1 (clock) has sent its invalidation to site 2, then
    // site 2 dies with the invalidation unanswered.
    while let Some((from, to, msg)) = net.inflight.pop_front() {
        if to == SiteId(2) {
            break;
        }
        net.ev(to.0, Event::Received { from, msg });
    }
    net.inflight
        .retain(|(f, t, _)| *f != SiteId(2) && *t != SiteId(2));
    for s in [0, 1, 3] {
        net.ev(s, Event::SiteDead { site: SiteId(2) });
    }
    net.settle();
    assert_eq!(net.held(3, 0), Held::Write);
    assert!(net.woken(3));
}
