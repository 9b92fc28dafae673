//! The real runtime: two sites on loopback in this test process, real
//! page faults (mprotect + SIGSEGV), real TCP. The DSM oracle here is the
//! data itself: every write stores a version, and every read checks that
//! the version it sees is the latest one written (no stale read).
//!
//! Every loop is bounded; a test that cannot make progress fails with a
//! message instead of hanging.

use mmulab_mirage::core::SiteId;
use mmulab_mirage::runtime::bench::two_sites;
use mmulab_mirage::runtime::fault::{self, FaultPath};
use mmulab_mirage::runtime::node::{NodeOptions, RuntimeMutation, replay};
use mmulab_mirage::runtime::shm::{IPC_CREAT, IPC_EXCL, SHM_RDONLY};
use mmulab_mirage::runtime::{ShmCtl, ShmError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn page() -> usize {
    mmulab_mirage::runtime::page_size()
}

/// Two sites alternate writes and reads of versioned data on one page;
/// every read must see the version just written by the other site.
#[test]
fn alternating_writes_across_sites_never_read_stale() {
    let (a, b) = two_sites(NodeOptions::default()).unwrap();
    let ida = a.shmget(4242, page(), IPC_CREAT | 0o600).unwrap();
    let idb = b.shmget(4242, page(), 0o600).unwrap();
    let pa = a.shmat(ida, None, 0).unwrap() as *mut u64;
    let pb = b.shmat(idb, None, 0).unwrap() as *mut u64;
    for v in 1..=200u64 {
        // SAFETY: live attach mappings of a one-page segment; faults are
        // served by the sites' daemons.
        unsafe {
            if v % 2 == 1 {
                std::ptr::write_volatile(pa.add(1), v);
                assert_eq!(std::ptr::read_volatile(pb.add(1)), v, "stale read at b");
            } else {
                std::ptr::write_volatile(pb.add(1), v);
                assert_eq!(std::ptr::read_volatile(pa.add(1)), v, "stale read at a");
            }
        }
    }
    a.shmdt(pa as *mut u8).unwrap();
    b.shmdt(pb as *mut u8).unwrap();
    assert!(
        a.node().dropped_peers().is_empty(),
        "{:?}",
        a.node().dropped_peers()
    );
    a.stop();
    b.stop();
}

/// With Δ > 0 the clock site refuses recalls and the library retries on a
/// timer (§6.1); coherence holds and every refusal ends.
#[test]
fn alternating_writes_with_delta_wait_out_the_window() {
    let (a, b) = two_sites(NodeOptions::default()).unwrap();
    let ida = a.shmget(4244, page(), IPC_CREAT | 0o600).unwrap();
    a.set_delta(ida, 3).unwrap();
    let idb = b.shmget(4244, page(), 0o600).unwrap();
    assert_eq!(
        b.set_delta(idb, 3),
        Err(ShmError::Invalid),
        "Δ is set at the library"
    );
    let pa = a.shmat(ida, None, 0).unwrap() as *mut u64;
    let pb = b.shmat(idb, None, 0).unwrap() as *mut u64;
    for v in 1..=30u64 {
        // SAFETY: live attach mappings.
        unsafe {
            let (w, r) = if v % 2 == 1 { (pa, pb) } else { (pb, pa) };
            std::ptr::write_volatile(w, v);
            assert_eq!(std::ptr::read_volatile(r), v, "stale read under Δ");
        }
    }
    a.shmdt(pa as *mut u8).unwrap();
    b.shmdt(pb as *mut u8).unwrap();
}

/// Negative control: a runtime that ships the core's copy without first
/// write-protecting the page and copying memory into it must be caught by
/// the same oracle (versions read back at the other site).
#[test]
fn the_oracle_catches_a_runtime_that_ships_without_syncing() {
    let options = NodeOptions {
        mutation: RuntimeMutation::ShipWithoutSync,
        ..NodeOptions::default()
    };
    let (a, b) = two_sites(options).unwrap();
    let ida = a.shmget(4243, page(), IPC_CREAT | 0o600).unwrap();
    let idb = b.shmget(4243, page(), 0o600).unwrap();
    let pa = a.shmat(ida, None, 0).unwrap() as *mut u64;
    let pb = b.shmat(idb, None, 0).unwrap() as *mut u64;
    let mut stale = 0;
    for v in 1..=20u64 {
        // SAFETY: live attach mappings.
        unsafe {
            let (w, r) = if v % 2 == 1 { (pa, pb) } else { (pb, pa) };
            std::ptr::write_volatile(w, v);
            if std::ptr::read_volatile(r) != v {
                stale += 1;
            }
        }
    }
    assert!(stale > 0, "the oracle missed a broken runtime");
}

/// fleisch89 Fig. 4's ping-pong, one thread per site, with the oracle:
/// each side writes the next version of its slot only after reading the
/// other side's latest, so any stale read shows as a version that went
/// backwards or skipped.
#[test]
fn ping_pong_threads_on_two_sites_see_every_version_in_order() {
    let (a, b) = two_sites(NodeOptions::default()).unwrap();
    let ida = a.shmget(77, 2 * page(), IPC_CREAT | 0o600).unwrap();
    let idb = b.shmget(77, 2 * page(), 0o600).unwrap();
    let pa = a.shmat(ida, None, 0).unwrap() as usize;
    let pb = b.shmat(idb, None, 0).unwrap() as usize;
    const ROUNDS: u64 = 150;
    let deadline = Instant::now() + Duration::from_secs(60);
    let start = Arc::new(Barrier::new(2));
    let side = |base: usize, me: u64, start: Arc<Barrier>| {
        move || {
            let turn = base as *mut u64; // whose turn: an ever-growing counter
            let slot = (base + 8 * (1 + me as usize)) as *mut u64;
            let other = (base + 8 * (2 - me as usize)) as *const u64;
            start.wait();
            let mut last_other = 0;
            for r in 0..ROUNDS {
                let my_turn = 2 * r + me;
                loop {
                    // SAFETY: a live attach mapping; faults are served.
                    let t = unsafe { std::ptr::read_volatile(turn) };
                    assert!(t <= my_turn, "turn ran ahead: {t} > {my_turn}");
                    if t == my_turn {
                        break;
                    }
                    assert!(Instant::now() < deadline, "no progress at turn {my_turn}");
                    std::thread::yield_now();
                }
                // SAFETY: as above.
                unsafe {
                    let o = std::ptr::read_volatile(other);
                    assert!(o >= last_other, "stale read: version went back");
                    // At turn 2r, b has written r versions; at 2r+1, a has written r+1.
                    assert_eq!(o, r + me, "stale read of the other site's version");
                    last_other = o;
                    std::ptr::write_volatile(slot, r + 1);
                    std::ptr::write_volatile(turn, my_turn + 1);
                }
            }
        }
    };
    let ta = std::thread::spawn(side(pa, 0, start.clone()));
    let tb = std::thread::spawn(side(pb, 1, start));
    ta.join().expect("site a's program");
    tb.join().expect("site b's program");
    a.shmdt(pa as *mut u8).unwrap();
    b.shmdt(pb as *mut u8).unwrap();
    a.stop();
    b.stop();
}

/// Polls `f` until it holds (bounded): a destruction reaches a site as a
/// message.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The calls every semantics shares: create/exclusive, ENOENT, a key
/// reached from the other site, IPC_STAT, IPC_SET, EACCES, IPC_RMID
/// (the key goes at once, attached memory stays), a given address.
fn get_attach_and_control_common(
    a: &mmulab_mirage::runtime::shm::Dsm,
    b: &mmulab_mirage::runtime::shm::Dsm,
) -> (i32, i32, *mut u32, *const u32) {
    assert_eq!(b.shmget(9, page(), 0o600), Err(ShmError::NotFound));
    let id = a.shmget(9, page(), IPC_CREAT | IPC_EXCL | 0o600).unwrap();
    assert_eq!(
        b.shmget(9, page(), IPC_CREAT | IPC_EXCL | 0o600),
        Err(ShmError::Exists)
    );
    // A larger size than the segment's is EINVAL, as on Linux.
    assert_eq!(b.shmget(9, 2 * page(), 0o600), Err(ShmError::Invalid));
    let idb = b.shmget(9, page(), IPC_CREAT | 0o600).unwrap();
    let w = a.shmat(id, None, 0).unwrap() as *mut u32;
    let r = b.shmat(idb, None, SHM_RDONLY).unwrap() as *const u32;
    // SAFETY: live attach mappings.
    unsafe {
        std::ptr::write_volatile(w, 0xfeed);
        assert_eq!(std::ptr::read_volatile(r), 0xfeed);
    }
    let st = b.shmctl(idb, ShmCtl::Stat).unwrap().unwrap();
    assert_eq!((st.key, st.nattch, st.mode), (9, 1, 0o600));
    // The owner came from the creating site, through the key directory.
    let me = unsafe { nix::libc::geteuid() };
    assert_eq!((st.uid, st.cuid), (me, me));
    b.shmctl(idb, ShmCtl::Set { mode: 0o400 }).unwrap();
    // As the kernel checks it: CAP_IPC_OWNER (root's) overrides the mode.
    use mmulab_mirage::runtime::creds::{CAP_IPC_OWNER, Caller};
    if Caller::this_thread().capable(CAP_IPC_OWNER) {
        let p = b.shmat(idb, None, 0).unwrap();
        b.shmdt(p).unwrap();
    } else {
        assert_eq!(b.shmat(idb, None, 0), Err(ShmError::Access));
    }
    // IPC_RMID: the key disappears at once; attached memory stays usable,
    // and the id may still be attached (Linux allows it).
    a.shmctl(id, ShmCtl::Rmid).unwrap();
    let st = a.shmctl(id, ShmCtl::Stat).unwrap().unwrap();
    assert_eq!((st.key, st.mode & 0o1000), (0, 0o1000), "SHM_DEST");
    let again = a.shmat(id, None, 0).unwrap();
    a.shmdt(again).unwrap();
    eventually("the key outlived IPC_RMID", || {
        b.shmget(9, page(), 0o600) == Err(ShmError::NotFound)
    });
    // SAFETY: still attached.
    unsafe { assert_eq!(std::ptr::read_volatile(r), 0xfeed) };
    (id, idb, w, r)
}

#[test]
fn system_v_semantics_of_get_attach_and_control() {
    let (a, b) = two_sites(NodeOptions::default()).unwrap();
    let (id, idb, w, r) = get_attach_and_control_common(&a, &b);
    // A given address is honoured.
    let priv_id = b.shmget(0, page(), 0o600).unwrap();
    let keep = b.shmat(priv_id, None, 0).unwrap();
    let free = b.shmat(priv_id, None, 0).unwrap();
    b.shmdt(free).unwrap();
    let at = b.shmat(priv_id, Some(free as usize), 0).unwrap();
    assert_eq!(at, free);
    assert_eq!(
        b.shmat(priv_id, Some(keep as usize), 0),
        Err(ShmError::Invalid)
    );
    // SAFETY: a live attach mapping.
    unsafe { std::ptr::write_volatile(at as *mut u32, 77) };
    b.shmdt(at).unwrap();
    b.shmdt(keep).unwrap();
    // System V: the last detach of a segment not removed keeps it, data
    // and all.
    let back = b.shmat(priv_id, None, 0).unwrap();
    // SAFETY: a live attach mapping.
    unsafe { assert_eq!(std::ptr::read_volatile(back as *const u32), 77) };
    b.shmdt(back).unwrap();
    b.shmctl(priv_id, ShmCtl::Rmid).unwrap();
    // Removed with no attach: its id is gone at once.
    assert_eq!(b.shmat(priv_id, None, 0), Err(ShmError::Invalid));
    assert_eq!(b.shmctl(priv_id, ShmCtl::Stat), Err(ShmError::Invalid));
    // The removed key's segment dies with its last detach, on any site:
    // then b's id for it is gone too.
    a.shmdt(w as *mut u8).unwrap();
    assert_eq!(a.shmctl(id, ShmCtl::Stat), Err(ShmError::Invalid));
    assert!(
        b.shmctl(idb, ShmCtl::Stat).is_ok(),
        "b still has it attached"
    );
    b.shmdt(r as *mut u8).unwrap();
    assert_eq!(b.shmdt(r as *mut u8), Err(ShmError::Invalid));
    eventually("b's id outlived the segment", || {
        b.shmctl(idb, ShmCtl::Stat) == Err(ShmError::Invalid)
    });
    a.stop();
    b.stop();
}

/// fleisch89 §2.2 (`semantics = "mirage"`): the last detach, on any
/// site, destroys a segment, removed or not; its id is gone then (EINVAL,
/// or EIDRM while the destruction is on its way).
#[test]
fn mirage_semantics_destroy_a_segment_at_its_last_detach() {
    use mmulab_mirage::runtime::bench::two_sites_with;
    use mmulab_mirage::runtime::config::Semantics;
    let (a, b) = two_sites_with(NodeOptions::default(), Semantics::Mirage).unwrap();
    let (_, idb, w, r) = get_attach_and_control_common(&a, &b);
    let priv_id = b.shmget(0, page(), 0o600).unwrap();
    let keep = b.shmat(priv_id, None, 0).unwrap();
    b.shmdt(keep).unwrap();
    eventually("the last detach did not destroy it", || {
        matches!(
            b.shmat(priv_id, None, 0),
            Err(ShmError::Invalid | ShmError::Removed)
        )
    });
    a.shmdt(w as *mut u8).unwrap();
    b.shmdt(r as *mut u8).unwrap();
    eventually("b's id outlived the segment", || {
        b.shmctl(idb, ShmCtl::Stat) == Err(ShmError::Invalid)
    });
    a.stop();
    b.stop();
}

/// Two sites `IPC_CREAT` one key at once: both get the same segment.
#[test]
fn simultaneous_creates_of_one_key_yield_one_segment() {
    let (a, b) = two_sites(NodeOptions::default()).unwrap();
    let (a, b) = (Arc::new(a), Arc::new(b));
    let go = Arc::new(Barrier::new(2));
    let run = |d: Arc<mmulab_mirage::runtime::shm::Dsm>, go: Arc<Barrier>| {
        std::thread::spawn(move || {
            go.wait();
            let id = d.shmget(31337, page(), IPC_CREAT | 0o600).unwrap();
            d.shmctl(id, ShmCtl::Stat).unwrap().unwrap().segment
        })
    };
    let ta = run(a.clone(), go.clone());
    let tb = run(b.clone(), go);
    assert_eq!(ta.join().unwrap(), tb.join().unwrap());
}

/// The runtime holds no protocol decision: a trace recorded from a real
/// run, replayed through the core alone, yields the same actions.
#[test]
fn a_recorded_trace_replays_through_the_core_alone() {
    let options = NodeOptions {
        record_trace: true,
        ..NodeOptions::default()
    };
    let (a, b) = two_sites(options).unwrap();
    let ida = a.shmget(5, 2 * page(), IPC_CREAT | 0o600).unwrap();
    let idb = b.shmget(5, 2 * page(), 0o600).unwrap();
    let pa = a.shmat(ida, None, 0).unwrap() as *mut u64;
    let pb = b.shmat(idb, None, 0).unwrap() as *mut u64;
    for v in 1..=20u64 {
        // SAFETY: live attach mappings.
        unsafe {
            std::ptr::write_volatile(pa, v);
            assert_eq!(std::ptr::read_volatile(pb), v);
            std::ptr::write_volatile(pb.add(page() / 8), v);
            assert_eq!(std::ptr::read_volatile(pa.add(page() / 8)), v);
        }
    }
    a.shmdt(pa as *mut u8).unwrap();
    b.shmdt(pb as *mut u8).unwrap();
    let core = a.node().config().core_config();
    for (site, d) in [(SiteId(0), &a), (SiteId(1), &b)] {
        let trace = d.node().take_trace();
        let events = replay(site, 2, core.clone(), &trace).expect("replay matches");
        assert!(events > 20, "{site:?}: only {events} events");
    }
}

/// A peer that sends garbage is logged by name with the reason and
/// dropped; the site keeps serving.
#[test]
fn a_garbage_peer_is_dropped_with_its_reason() {
    use std::io::Write;
    let (a, b) = two_sites(NodeOptions::default()).unwrap();
    let mut s = std::net::TcpStream::connect(a.node().local_addr()).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.node().dropped_peers().is_empty() {
        assert!(Instant::now() < deadline, "garbage peer not dropped");
        std::thread::sleep(Duration::from_millis(5));
    }
    let line = a.node().dropped_peers().remove(0);
    assert!(line.contains("bad-magic"), "{line}");
    // The cluster still works.
    let id = b.shmget(0x77, page(), IPC_CREAT | 0o600).unwrap();
    let p = b.shmat(id, None, 0).unwrap();
    // SAFETY: a live attach mapping.
    unsafe {
        std::ptr::write_volatile(p, 1);
        assert_eq!(std::ptr::read_volatile(p), 1);
    }
    b.shmdt(p).unwrap();
}

/// Many threads of both sites hammer two pages with versioned writes;
/// each page's version only ever grows as seen by every reader, and no
/// increment is lost. This caught the runtime granting rights at each
/// `Install` of a batch whose later action shipped the page (an install
/// replaying a deferred recall): a write in between was lost.
#[test]
fn concurrent_readers_and_writers_never_see_a_version_go_back() {
    const ROUNDS: u64 = 200;
    let (a, b) = two_sites(NodeOptions::default()).unwrap();
    let ida = a.shmget(606, 2 * page(), IPC_CREAT | 0o600).unwrap();
    let idb = b.shmget(606, 2 * page(), 0o600).unwrap();
    let bases = [
        a.shmat(ida, None, 0).unwrap() as usize,
        b.shmat(idb, None, 0).unwrap() as usize,
    ];
    let written = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut threads = Vec::new();
    for (t, &base) in [bases[0], bases[1], bases[0], bases[1]].iter().enumerate() {
        let written = written.clone();
        threads.push(std::thread::spawn(move || {
            let mut seen = [0u64; 2];
            for i in 0..ROUNDS {
                assert!(Instant::now() < deadline, "no progress");
                let pg = ((i + t as u64) % 2) as usize;
                let word = (base + pg * page()) as *mut AtomicU64;
                // SAFETY: a live attach mapping; the atomic is in shared memory.
                let cell = unsafe { &*word };
                if (i + t as u64).is_multiple_of(3) {
                    let v = cell.fetch_add(1, Ordering::SeqCst) + 1;
                    written.fetch_max(v, Ordering::SeqCst);
                    assert!(v > seen[pg], "write saw an old version");
                    seen[pg] = v;
                } else {
                    let v = cell.load(Ordering::SeqCst);
                    assert!(v >= seen[pg], "stale read: {v} < {}", seen[pg]);
                    seen[pg] = v;
                }
            }
        }));
    }
    for t in threads {
        t.join().expect("program thread");
    }
    // Total increments land exactly: no write was lost across sites.
    // SAFETY: live mappings.
    let total: u64 = (0..2)
        .map(|pg| unsafe { std::ptr::read_volatile((bases[0] + pg * page()) as *const u64) })
        .sum();
    let expected: u64 = (0..4u64)
        .map(|t| (0..ROUNDS).filter(|i| (i + t).is_multiple_of(3)).count() as u64)
        .sum();
    assert_eq!(total, expected, "lost writes");
    a.shmdt(bases[0] as *mut u8).unwrap();
    b.shmdt(bases[1] as *mut u8).unwrap();
}

/// `mmulab dsm site --config F --name N`'s entry point starts from a
/// `cluster.toml`, says which fault path it uses, and stops when told.
#[test]
fn run_site_starts_from_a_config_file_and_stops() {
    use std::sync::atomic::AtomicBool;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = std::env::temp_dir().join(format!("mirage-site-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cluster.toml");
    let _ = std::fs::remove_file(dir.join("cluster.key"));
    mmulab_mirage::runtime::key::ClusterKey::generate(&dir.join("cluster.key")).unwrap();
    std::fs::write(
        &path,
        format!(
            "cluster_id = 11\nkey_file = \"cluster.key\"\n[[site]]\nname = \"a\"\naddr = \"127.0.0.1:{port}\"\n\
             [[key]]\nkey = 1\ndelta_ticks = 2\n"
        ),
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (s2, p2) = (stop.clone(), path.clone());
    let site = std::thread::spawn(move || {
        let mut lines = Vec::new();
        mmulab_mirage::runtime::cli::run_site(&p2, "a", &s2, &mut |l| lines.push(l.to_string()))
            .map(|_| lines)
    });
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    let lines = site.join().unwrap().unwrap();
    let path = mmulab_mirage::runtime::fault::probe().path;
    assert!(
        lines[0].starts_with(&format!("fault path: {path} (")),
        "{lines:?}"
    );
    assert!(lines[1].contains(&port.to_string()), "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child half of `two_processes_share_a_segment_coherently`: a no-op
/// unless the parent started this binary with `MIRAGE_CHILD_CONFIG`.
#[test]
fn child_site_b() {
    let Ok(path) = std::env::var("MIRAGE_CHILD_CONFIG") else {
        return;
    };
    let config = mmulab_mirage::runtime::ClusterConfig::load(std::path::Path::new(&path)).unwrap();
    let node = mmulab_mirage::runtime::Node::start(config, "b", NodeOptions::default()).unwrap();
    let b = mmulab_mirage::runtime::shm::Dsm::new(node);
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        match b.shmget(2024, page(), 0o600) {
            Ok(id) => break id,
            Err(ShmError::NotFound) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("child shmget: {e}"),
        }
    };
    let base = b.shmat(id, None, 0).unwrap() as usize;
    play_side(base, 1, deadline);
    b.shmdt(base as *mut u8).unwrap();
    b.stop();
}

const PROCESS_ROUNDS: u64 = 100;

/// One side of fleisch89 Fig. 4's ping-pong with the version oracle.
fn play_side(base: usize, me: u64, deadline: Instant) {
    let turn = base as *mut u64;
    let slot = (base + 8 * (1 + me as usize)) as *mut u64;
    let other = (base + 8 * (2 - me as usize)) as *const u64;
    for r in 0..PROCESS_ROUNDS {
        let my_turn = 2 * r + me;
        // SAFETY: a live attach mapping; faults are served by the daemon.
        while unsafe { std::ptr::read_volatile(turn) } != my_turn {
            assert!(Instant::now() < deadline, "no progress at turn {my_turn}");
            std::thread::yield_now();
        }
        // SAFETY: as above.
        unsafe {
            assert_eq!(std::ptr::read_volatile(other), r + me, "stale read");
            std::ptr::write_volatile(slot, r + 1);
            std::ptr::write_volatile(turn, my_turn + 1);
        }
    }
}

/// Two sites in two processes (this binary re-run as the child): the
/// ping-pong with the version oracle, over loopback TCP.
#[test]
fn two_processes_share_a_segment_coherently() {
    if std::env::var("MIRAGE_CHILD_CONFIG").is_ok() {
        return;
    }
    let la = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port_b = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = std::env::temp_dir().join(format!("mirage-2proc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cluster.toml");
    let _ = std::fs::remove_file(dir.join("cluster.key"));
    mmulab_mirage::runtime::key::ClusterKey::generate(&dir.join("cluster.key")).unwrap();
    std::fs::write(
        &path,
        format!(
            "cluster_id = 12\nkey_file = \"cluster.key\"\n[[site]]\nname = \"a\"\naddr = \"{}\"\n\
             [[site]]\nname = \"b\"\naddr = \"127.0.0.1:{port_b}\"\n",
            la.local_addr().unwrap()
        ),
    )
    .unwrap();
    let config = mmulab_mirage::runtime::ClusterConfig::load(&path).unwrap();
    let node = mmulab_mirage::runtime::Node::start_with_listener(
        config,
        SiteId(0),
        la,
        NodeOptions::default(),
    )
    .unwrap();
    let a = mmulab_mirage::runtime::shm::Dsm::new(node);
    let id = a.shmget(2024, page(), IPC_CREAT | 0o600).unwrap();
    let base = a.shmat(id, None, 0).unwrap() as usize;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["child_site_b", "--exact", "--nocapture", "--test-threads=1"])
        .env("MIRAGE_CHILD_CONFIG", &path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    play_side(base, 0, deadline);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child site did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "child site failed: {status}");
    // SAFETY: still attached; the child's last write is visible here.
    unsafe {
        assert_eq!(
            std::ptr::read_volatile((base + 16) as *const u64),
            PROCESS_ROUNDS
        );
    }
    a.shmdt(base as *mut u8).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Peers with a wrong cluster id, a stale incarnation, or that vanish
/// mid-frame are logged by name with the reason and dropped; the core
/// never sees the partial page. These peers hold the cluster key (a
/// member misbehaving); strangers without it are refused earlier
/// (`tests/findings.rs`).
#[test]
fn bad_handshakes_and_truncated_frames_are_dropped_by_name() {
    use mmulab_mirage::core::{Access, Msg, PageNo, SegmentId};
    use mmulab_mirage::runtime::handshake::MemberConn;
    use mmulab_mirage::wire::{self, Frame, Hello};
    let (a, _b) = two_sites(NodeOptions::default()).unwrap();
    let addr = a.node().local_addr();
    let config = a.node().config().clone();
    let key = config.cluster_key.as_ref();
    let cluster_id = config.cluster_id;
    let hello = |cluster_id: u64, incarnation: u64| Hello {
        version: wire::PROTOCOL_VERSION,
        cluster_id,
        site: SiteId(1),
        name: "b".into(),
        incarnation,
    };
    let wait_for = |reason: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let d = a.node().dropped_peers();
            if let Some(line) = d.iter().find(|l| l.contains(reason)) {
                return line.clone();
            }
            assert!(Instant::now() < deadline, "no `{reason}` drop in {d:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // Wrong cluster.
    assert!(MemberConn::dial(addr, key, hello(cluster_id ^ 1, u64::MAX - 1), 2).is_err());
    wait_for("wrong-cluster");
    // A newer incarnation of b, then an older one: stale.
    let mut s = MemberConn::dial(addr, key, hello(cluster_id, u64::MAX - 1), 2).unwrap();
    assert_eq!(s.answer.site, SiteId(0));
    assert!(MemberConn::dial(addr, key, hello(cluster_id, 1), 2).is_err());
    wait_for("stale-incarnation");
    // Half a page frame, then the peer vanishes.
    let page = Msg::Page {
        segment: SegmentId {
            library: SiteId(0),
            serial: 0,
        },
        page: PageNo(0),
        op: 1,
        epoch: 1,
        access: Access::Write,
        bytes: vec![0xee; 4096],
        window_ticks: 0,
        clock_of: None,
    };
    let bytes = wire::encode(Frame::Core(page));
    s.send_plain(&bytes[..bytes.len() / 2]).unwrap();
    drop(s);
    let line = wait_for("truncated");
    assert!(line.contains("site b"), "{line}");
}

/// Runs `read(fd, shm, 8)` into a page not held here on the given fault
/// path; returns what `read` returned the first time, and checks that
/// touching the page first always works. `None`: the path is not offered.
fn syscall_into_a_page_not_held(path: FaultPath) -> Option<isize> {
    use nix::libc;
    if path != FaultPath::Mprotect && fault::open_path(path).is_none() {
        eprintln!("skipped: {path:?} is not offered by this kernel");
        return None;
    }
    let options = NodeOptions {
        fault_path: path,
        ..NodeOptions::default()
    };
    let (a, b) = two_sites(options).unwrap();
    let ida = a.shmget(515, page(), IPC_CREAT | 0o600).unwrap();
    let idb = b.shmget(515, page(), 0o600).unwrap();
    let pa = a.shmat(ida, None, 0).unwrap();
    let pb = b.shmat(idb, None, 0).unwrap();
    // SAFETY: a live attach mapping.
    unsafe { std::ptr::write_volatile(pa, 1) }; // a holds the page
    let mut fds = [0i32; 2];
    // SAFETY: plain pipe(2) and read/write(2) on our own fds; the
    // destination is a live attach mapping (not held at b).
    let first = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        assert_eq!(libc::write(fds[1], b"12345678".as_ptr().cast(), 8), 8);
        let n = libc::read(fds[0], pb.cast(), 8);
        if n == -1 {
            assert_eq!(*libc::__errno_location(), libc::EFAULT);
            std::ptr::write_volatile(pb, 0); // fault the write copy in
            assert_eq!(libc::read(fds[0], pb.cast(), 8), 8);
        }
        assert_eq!(std::ptr::read_volatile(pa.add(7)), b'8');
        libc::close(fds[0]);
        libc::close(fds[1]);
        n
    };
    a.shmdt(pa).unwrap();
    b.shmdt(pb).unwrap();
    Some(first)
}

/// A limit, documented: the kernel raises no SIGSEGV for a system call's
/// access to user memory, so on the mprotect path `read(fd, shm, n)` into
/// a page not held for writing here fails with EFAULT. Touching the page
/// first makes it work.
#[test]
fn a_syscall_into_a_page_not_held_gets_efault() {
    assert_eq!(syscall_into_a_page_not_held(FaultPath::Mprotect), Some(-1));
}

/// The same limit under userfaultfd's user-mode-only mode (what an
/// unprivileged process gets with `vm.unprivileged_userfaultfd = 0`):
/// kernel-mode faults are not delivered, the syscall gets EFAULT.
#[test]
fn under_user_mode_only_a_syscall_into_a_missing_page_gets_efault() {
    if let Some(n) = syscall_into_a_page_not_held(FaultPath::UffdUserModeOnly) {
        assert_eq!(n, -1);
    }
}

/// With a full userfaultfd (privileged), the kernel's own access is a
/// fault the daemon serves: the limit is lifted.
#[test]
fn under_full_userfaultfd_a_syscall_into_a_missing_page_is_served() {
    if let Some(n) = syscall_into_a_page_not_held(FaultPath::Uffd) {
        assert_eq!(n, 8);
    }
}

/// The coherence oracle (alternating versioned writes, ping-pong threads,
/// concurrent readers and writers) on the mprotect path too, whichever
/// path `Auto` picks on this machine.
#[test]
fn the_mprotect_fallback_keeps_coherence() {
    let options = NodeOptions {
        fault_path: FaultPath::Mprotect,
        ..NodeOptions::default()
    };
    let (a, b) = two_sites(options).unwrap();
    let ida = a.shmget(4245, page(), IPC_CREAT | 0o600).unwrap();
    let idb = b.shmget(4245, page(), 0o600).unwrap();
    let pa = a.shmat(ida, None, 0).unwrap() as *mut u64;
    let pb = b.shmat(idb, None, 0).unwrap() as *mut u64;
    for v in 1..=200u64 {
        // SAFETY: live attach mappings.
        unsafe {
            let (w, r) = if v % 2 == 1 { (pa, pb) } else { (pb, pa) };
            std::ptr::write_volatile(w.add(3), v);
            assert_eq!(std::ptr::read_volatile(r.add(3)), v, "stale read");
        }
    }
    a.shmdt(pa as *mut u8).unwrap();
    b.shmdt(pb as *mut u8).unwrap();
}

/// A peer with another cluster key is logged with its address and closed;
/// nothing changes at the site (issue #23).
#[test]
fn a_peer_with_another_key_is_logged_with_its_address_and_changes_nothing() {
    use mmulab_mirage::runtime::handshake::MemberConn;
    use mmulab_mirage::runtime::key::ClusterKey;
    use mmulab_mirage::wire::{self, Hello};
    let (a, b) = two_sites(NodeOptions::default()).unwrap();
    let id = a.shmget(0x5151, page(), IPC_CREAT | 0o600).unwrap();
    let p = a.shmat(id, None, 0).unwrap();
    // SAFETY: a live attach mapping.
    unsafe { std::ptr::write_volatile(p as *mut u64, 77) };
    let before = a.node().status_text();
    let other = ClusterKey::random().unwrap();
    let hello = Hello {
        version: wire::PROTOCOL_VERSION,
        cluster_id: a.node().config().cluster_id,
        site: SiteId(1),
        name: "b".into(),
        incarnation: u64::MAX,
    };
    let e = MemberConn::dial(a.node().local_addr(), Some(&other), hello, 2)
        .err()
        .expect("another key is refused");
    assert_eq!(e.reason(), "unauthenticated", "{e}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let line = loop {
        let d = a.node().dropped_peers();
        if let Some(l) = d.iter().find(|l| l.contains("unauthenticated")) {
            break l.clone();
        }
        assert!(Instant::now() < deadline, "no drop line: {d:?}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(line.starts_with("peer 127.0.0.1:"), "{line}");
    // Nothing changed: same sites' view, the page still here, b still in.
    let strip = |s: &str| -> String {
        s.lines()
            .filter(|l| !l.contains("heard"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&a.node().status_text()), strip(&before));
    // SAFETY: as above.
    assert_eq!(unsafe { std::ptr::read_volatile(p as *const u64) }, 77);
    let idb = b.shmget(0x5151, page(), 0o600).unwrap();
    let pb = b.shmat(idb, None, 0).unwrap();
    // SAFETY: a live attach mapping.
    assert_eq!(unsafe { std::ptr::read_volatile(pb as *const u64) }, 77);
    a.shmdt(p).unwrap();
    b.shmdt(pb).unwrap();
}

/// An authenticated peer that goes silent (not even a heartbeat) past
/// the peer timeout has its connection closed (issue #23, finding 4).
#[test]
fn an_idle_authenticated_peer_is_closed_after_the_peer_timeout() {
    use mmulab_mirage::runtime::handshake::MemberConn;
    use mmulab_mirage::runtime::{ClusterConfig, Node};
    use mmulab_mirage::wire::{self, Hello};
    use std::io::Read;
    let la = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let absent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ClusterConfig::loopback(
        std::process::id() as u64 ^ 0x1d1e,
        &[la.local_addr().unwrap(), absent.local_addr().unwrap()],
    );
    let options = NodeOptions {
        peer_timeout: Duration::from_millis(800),
        ..NodeOptions::default()
    };
    let key = config.cluster_key.clone();
    let cluster_id = config.cluster_id;
    let a = Node::start_with_listener(config, SiteId(0), la, options).unwrap();
    let hello = Hello {
        version: wire::PROTOCOL_VERSION,
        cluster_id,
        site: SiteId(1),
        name: "b".into(),
        incarnation: 1,
    };
    let conn = MemberConn::dial(a.local_addr(), key.as_ref(), hello, 2).unwrap();
    assert_eq!(a.connection_count().open, 1);
    let t = Instant::now();
    let mut s = conn.stream();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "still open");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert!(
        a.dropped_peers()
            .iter()
            .any(|l| l.contains("site b") && l.contains("idle")),
        "{:?}",
        a.dropped_peers()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.connection_count().open != 0 {
        assert!(Instant::now() < deadline, "the connection is still held");
        std::thread::sleep(Duration::from_millis(10));
    }
    a.stop();
}

/// `mmulab dsm site` warns at every start under `insecure = true`, and
/// refuses a key file that group or others may read, naming it.
#[test]
fn run_site_warns_when_insecure_and_refuses_an_open_key_file() {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::AtomicBool;
    let dir = std::env::temp_dir().join(format!("mirage-insecure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let site = format!(
        "[[site]]\nname = \"a\"\naddr = \"127.0.0.1:{port}\"\nsocket = \"{}\"\n",
        dir.join("a.sock").display()
    );
    let path = dir.join("cluster.toml");
    std::fs::write(&path, format!("cluster_id = 13\ninsecure = true\n{site}")).unwrap();
    let stop = AtomicBool::new(true);
    let mut lines = Vec::new();
    mmulab_mirage::runtime::cli::run_site(&path, "a", &stop, &mut |l| lines.push(l.to_string()))
        .unwrap();
    assert!(
        lines[0].starts_with("warning: ") && lines[0].contains("insecure = true"),
        "{lines:?}"
    );
    mmulab_mirage::runtime::key::ClusterKey::generate(&dir.join("cluster.key")).unwrap();
    std::fs::set_permissions(
        dir.join("cluster.key"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::write(
        &path,
        format!("cluster_id = 13\nkey_file = \"cluster.key\"\n{site}"),
    )
    .unwrap();
    let e = mmulab_mirage::runtime::cli::run_site(&path, "a", &stop, &mut |_| {}).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("cluster.key") && e.contains("0640"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
