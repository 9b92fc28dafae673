//! `mmulab dsm bench`: remote-fault latency beside the physical limit
//! measured in the same run (issue #7, "Measurements"). Never run from
//! unit tests.
//!
//! Two sites run in this process on loopback, each with its own daemon
//! threads. One program thread alternates: it writes page 0 through site
//! `a` (the library, so the page is checked out for writing there), then
//! reads it through site `b` — a read fault on a page whose only current
//! copy is held by another site: request to the library, recall to the
//! clock site (downgrade, optimization 2), the page sent directly to `b`,
//! install, wake (fleisch89 §6.1, Fig. 2). The read's latency is timed
//! around the faulting load. Every read is checked against the value
//! just written (the DSM oracle: no stale read).
//!
//! The limit is what any remote fault must pay on this machine: a small-
//! message TCP round trip over loopback (median) plus a 4 KiB copy
//! (median), measured in the same run.

use super::config::ClusterConfig;
use super::node::{Node, NodeOptions, stamp};
use super::shm::{Dsm, IPC_CREAT};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
}

impl Percentiles {
    fn of(mut v: Vec<u64>) -> Percentiles {
        assert!(!v.is_empty(), "no samples");
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Breakdown {
    pub fault_delivery: u64,
    pub request: u64,
    pub library: u64,
    pub transfer: u64,
    pub install: u64,
    pub wake: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub remote_fault_ns: Percentiles,
    /// Small-message loopback round trip (p50) plus a 4 KiB copy (p50).
    pub limit_ns: u64,
    /// `remote_fault_ns.p50 / limit_ns`.
    pub ratio: f64,
    pub loopback_rtt_ns: Percentiles,
    pub copy_4k_ns: Percentiles,
    /// Table 3-style breakdown of the remote fault (medians, ns): fault
    /// delivery (load → b's core thread has the record), request (b's
    /// core → a's core: TCP and a thread hand-off), library (a: queue,
    /// clock check, downgrade, page out), transfer (a's core → b's core),
    /// install (copy, protection, release), wake (release → the load
    /// returns).
    pub breakdown_ns: Breakdown,
    pub faults_timed: usize,
    pub stale_reads: usize,
    pub fault_path: String,
    /// Frames sent by both sites per timed cycle (write at a + read at b).
    pub frames_per_cycle: f64,
    /// fleisch89 Fig. 4's ping-pong across the two sites, per Δ (three
    /// Δ values of 200 ms each with `--quick`).
    pub pingpong: Vec<PingPongPoint>,
    /// fleisch89 §8's two conflicting read-writers, per Δ (three Δ values
    /// with `--quick`).
    pub read_writers: Vec<ReadWritersPoint>,
    pub wall_ms: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReadWritersPoint {
    pub delta_ticks: u32,
    pub tick_ns: u64,
    /// Read-test-then-decrement iterations per second, both sites together.
    pub decrements_per_s: f64,
    pub frames_per_s: f64,
    /// Decrements that found a value other than the one this site wrote
    /// last (the oracle: each counter has one writer).
    pub stale_reads: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PingPongPoint {
    pub delta_ticks: u32,
    pub tick_ns: u64,
    pub yield_: bool,
    pub cycles_per_s: f64,
    /// Frames on the wire per cycle (fleisch89 §7.2 counts 9 messages,
    /// some of them local to the library's site).
    pub frames_per_cycle: f64,
    pub stale_reads: u64,
}

impl BenchReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serializes")
    }

    pub fn render(&self) -> String {
        let mut pp = String::new();
        for p in &self.pingpong {
            pp.push_str(&format!(
                "ping-pong Δ={:>2} ticks of {} µs, {}: {:>8.1} cycles/s, {:.2} frames/cycle, stale reads {}\n",
                p.delta_ticks,
                p.tick_ns / 1000,
                if p.yield_ { "yield   " } else { "no yield" },
                p.cycles_per_s,
                p.frames_per_cycle,
                p.stale_reads
            ));
        }
        for p in &self.read_writers {
            pp.push_str(&format!(
                "read-writers Δ={:>2} ticks of {} µs: {:>12.0} decrements/s, {:>8.0} frames/s, stale reads {}\n",
                p.delta_ticks,
                p.tick_ns / 1000,
                p.decrements_per_s,
                p.frames_per_s,
                p.stale_reads
            ));
        }
        pp + &format!(
            "remote fault (read, page held for writing by the other site), {} faults\n\
             \x20 p50 {:>9} ns   p90 {:>9} ns   p99 {:>9} ns\n\
             limit: loopback round trip p50 {} ns + 4 KiB copy p50 {} ns = {} ns\n\
             ratio p50/limit: {:.2} (aim: under 3)\n\
             breakdown (p50, ns): delivery {} | request {} | library {} | transfer {} | install {} | wake {}\n\
             frames per write+read cycle: {:.2}; stale reads: {}\n{}\n",
            self.faults_timed,
            self.remote_fault_ns.p50,
            self.remote_fault_ns.p90,
            self.remote_fault_ns.p99,
            self.loopback_rtt_ns.p50,
            self.copy_4k_ns.p50,
            self.limit_ns,
            self.ratio,
            self.breakdown_ns.fault_delivery,
            self.breakdown_ns.request,
            self.breakdown_ns.library,
            self.breakdown_ns.transfer,
            self.breakdown_ns.install,
            self.breakdown_ns.wake,
            self.frames_per_cycle,
            self.stale_reads,
            self.fault_path,
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("dsm: {0}")]
    Shm(#[from] super::shm::ShmError),
    #[error("{0}")]
    Failed(String),
}

/// Starts two loopback sites in this process (ports chosen by the kernel).
pub fn two_sites(options: NodeOptions) -> std::io::Result<(Dsm, Dsm)> {
    let la = TcpListener::bind("127.0.0.1:0")?;
    let lb = TcpListener::bind("127.0.0.1:0")?;
    let cluster_id = std::process::id() as u64 ^ 0x6d6972616765;
    let config = ClusterConfig::loopback(cluster_id, &[la.local_addr()?, lb.local_addr()?]);
    let a = Node::start_with_listener(config.clone(), crate::core::SiteId(0), la, options.clone())?;
    let b = Node::start_with_listener(config, crate::core::SiteId(1), lb, options)?;
    Ok((Dsm::new(a), Dsm::new(b)))
}

fn loopback_rtt(n: usize) -> std::io::Result<Vec<u64>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 32];
        for _ in 0..n {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        Ok(())
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let mut buf = [7u8; 32];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.write_all(&buf)?;
        c.read_exact(&mut buf)?;
        v.push(t.elapsed().as_nanos() as u64);
    }
    echo.join().expect("echo thread")?;
    Ok(v)
}

fn copy_4k(n: usize) -> Vec<u64> {
    let src = vec![0x5au8; 4096];
    let mut dst = vec![0u8; 4096];
    (0..n)
        .map(|i| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst)[i % 4096] ^= 1;
            t.elapsed().as_nanos() as u64
        })
        .collect()
}

/// Runs the remote-fault measurement. `quick`: 300 timed faults (a few
/// seconds); otherwise 3000.
pub fn run(quick: bool) -> Result<BenchReport, BenchError> {
    let started = Instant::now();
    let n = if quick { 300 } else { 3000 };
    let warmup = 20;
    let probe = super::fault::probe();
    let (a, b) = two_sites(NodeOptions::default())?;
    let key = 0x4d49;
    let ida = a.shmget(key, 4096, IPC_CREAT | 0o600)?;
    let idb = b.shmget(key, 4096, 0o600)?;
    let pa = a.shmat(ida, None, 0)? as *mut u64;
    let pb = b.shmat(idb, None, 0)? as *const u64;
    let mut samples = Vec::with_capacity(n);
    let mut steps: [Vec<u64>; 6] = Default::default();
    let (sa, sb) = (&a.node().counters().stamps, &b.node().counters().stamps);
    let ld = |x: &std::sync::atomic::AtomicU64| x.load(std::sync::atomic::Ordering::Relaxed);
    let mut stale = 0;
    let frames_before = a
        .node()
        .counters()
        .frames_sent
        .load(std::sync::atomic::Ordering::Relaxed)
        + b.node()
            .counters()
            .frames_sent
            .load(std::sync::atomic::Ordering::Relaxed);
    for i in 0..(n + warmup) as u64 {
        // SAFETY: pa/pb are live attach mappings of one 4 KiB segment;
        // their faults are served by the two daemons.
        unsafe { std::ptr::write_volatile(pa, i + 1) };
        let t0 = stamp();
        let t = Instant::now();
        let v = unsafe { std::ptr::read_volatile(pb) };
        let dt = t.elapsed().as_nanos() as u64;
        let t1 = stamp();
        let marks = [
            t0,
            ld(&sb.fault_delivered),
            ld(&sb.request_sent),
            ld(&sa.request_received),
            ld(&sa.page_sent),
            ld(&sb.page_received),
            ld(&sb.woken),
            t1,
        ];
        // Steps: delivery, request, library, transfer, install, wake (the
        // core's own time at b, from delivery to request sent, is tiny and
        // counted in "request").
        let spans = [
            (marks[0], marks[1]),
            (marks[1], marks[3]),
            (marks[3], marks[4]),
            (marks[4], marks[5]),
            (marks[5], marks[6]),
            (marks[6], marks[7]),
        ];
        // `request_sent` is stamped after the fault's whole batch, which
        // may end after the library got the request: leave it out.
        let ordered = [0, 1, 3, 4, 5, 6, 7]
            .windows(2)
            .all(|w| marks[w[0]] <= marks[w[1]]);
        if i >= warmup as u64 && ordered {
            for (k, (from, to)) in spans.iter().enumerate() {
                steps[k].push(to - from);
            }
        }
        if v != i + 1 {
            stale += 1;
        }
        if i >= warmup as u64 {
            samples.push(dt);
        }
    }
    let frames_after = a
        .node()
        .counters()
        .frames_sent
        .load(std::sync::atomic::Ordering::Relaxed)
        + b.node()
            .counters()
            .frames_sent
            .load(std::sync::atomic::Ordering::Relaxed);
    a.shmdt(pa as *mut u8)?;
    b.shmdt(pb as *mut u8)?;
    a.stop();
    b.stop();
    let rtt = Percentiles::of(loopback_rtt(n.max(1000))?);
    let copy = Percentiles::of(copy_4k(n.max(1000)));
    let limit_ns = (rtt.p50 + copy.p50).max(1);
    let remote = Percentiles::of(samples);
    let med = |v: &Vec<u64>| {
        if v.is_empty() {
            0
        } else {
            Percentiles::of(v.clone()).p50
        }
    };
    let breakdown_ns = Breakdown {
        fault_delivery: med(&steps[0]),
        request: med(&steps[1]),
        library: med(&steps[2]),
        transfer: med(&steps[3]),
        install: med(&steps[4]),
        wake: med(&steps[5]),
    };
    if quick && started.elapsed() > Duration::from_secs(60) {
        return Err(BenchError::Failed("bench ran past a minute".into()));
    }
    // `--quick`: a small sweep (three Δ values, short runs), enough to
    // see the shapes' direction in a few seconds; the full sweep otherwise.
    let (pp_deltas, pp_for, rw_deltas, rw_for): (&[u32], u64, &[u32], u64) = if quick {
        (&[0, 2, 10], 200, &[0, 5, 50], 200)
    } else {
        (&[0, 1, 2, 5, 10], 700, &[0, 1, 2, 5, 10, 20, 50], 500)
    };
    let mut pingpong_points = Vec::new();
    for yield_ in [true, false] {
        for &delta_ticks in pp_deltas {
            pingpong_points.push(pingpong(
                delta_ticks,
                yield_,
                Duration::from_millis(pp_for),
            )?);
        }
    }
    let pingpong = pingpong_points;
    let mut read_writers_points = Vec::new();
    for &delta_ticks in rw_deltas {
        read_writers_points.push(read_writers(delta_ticks, Duration::from_millis(rw_for))?);
    }
    let read_writers = read_writers_points;
    if quick && started.elapsed() > Duration::from_secs(60) {
        return Err(BenchError::Failed("bench ran past a minute".into()));
    }
    Ok(BenchReport {
        pingpong,
        read_writers,
        ratio: remote.p50 as f64 / limit_ns as f64,
        remote_fault_ns: remote,
        breakdown_ns,
        limit_ns,
        loopback_rtt_ns: rtt,
        copy_4k_ns: copy,
        faults_timed: n,
        stale_reads: stale,
        fault_path: probe.describe(),
        frames_per_cycle: (frames_after - frames_before) as f64 / (n + warmup) as f64,
        wall_ms: started.elapsed().as_millis() as u64,
    })
}

/// One point of the ping-pong (fleisch89 Fig. 4): two program threads,
/// one per site, take turns through a counter on one page; each checks
/// the other's latest version (the oracle). Runs for `run_for`.
pub fn pingpong(
    delta_ticks: u32,
    yield_: bool,
    run_for: Duration,
) -> Result<PingPongPoint, BenchError> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (a, b) = two_sites(NodeOptions::default())?;
    let tick_ns = a.node().config().tick_ns;
    let key = 0x5050;
    let ida = a.shmget(key, 4096, IPC_CREAT | 0o600)?;
    a.set_delta(ida, delta_ticks)?;
    let idb = b.shmget(key, 4096, 0o600)?;
    let bases = [
        a.shmat(ida, None, 0)? as usize,
        b.shmat(idb, None, 0)? as usize,
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let stale = Arc::new(AtomicU64::new(0));
    let cycles = Arc::new(AtomicU64::new(0));
    let frames = |x: &Dsm| x.node().counters().frames_sent.load(Ordering::Relaxed);
    let f0 = frames(&a) + frames(&b);
    let started = Instant::now();
    let threads: Vec<_> = (0..2u64)
        .map(|me| {
            let (base, stop, stale, cycles) = (
                bases[me as usize],
                stop.clone(),
                stale.clone(),
                cycles.clone(),
            );
            std::thread::spawn(move || {
                let turn = base as *mut u64;
                let slot = (base + 8 * (1 + me as usize)) as *mut u64;
                let other = (base + 8 * (2 - me as usize)) as *const u64;
                let mut r = 0u64;
                'outer: loop {
                    let my_turn = 2 * r + me;
                    // SAFETY: a live attach mapping served by the daemons.
                    while unsafe { std::ptr::read_volatile(turn) } != my_turn {
                        if stop.load(Ordering::Relaxed) {
                            break 'outer;
                        }
                        if yield_ {
                            std::thread::yield_now();
                        }
                    }
                    // SAFETY: as above.
                    unsafe {
                        if std::ptr::read_volatile(other) != r + me {
                            stale.fetch_add(1, Ordering::Relaxed);
                        }
                        std::ptr::write_volatile(slot, r + 1);
                        std::ptr::write_volatile(turn, my_turn + 1);
                    }
                    if me == 1 {
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                    r += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(run_for);
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let n = cycles.load(Ordering::Relaxed);
    let f1 = frames(&a) + frames(&b);
    for t in threads {
        t.join()
            .map_err(|_| BenchError::Failed("ping-pong thread panicked".into()))?;
    }
    a.shmdt(bases[0] as *mut u8)?;
    b.shmdt(bases[1] as *mut u8)?;
    a.stop();
    b.stop();
    Ok(PingPongPoint {
        delta_ticks,
        tick_ns,
        yield_,
        cycles_per_s: n as f64 / elapsed.as_secs_f64(),
        frames_per_cycle: (f1 - f0) as f64 / n.max(1) as f64,
        stale_reads: stale.load(Ordering::Relaxed),
    })
}

/// One point of fleisch89 §8: two program threads, one per site, each
/// decrementing its own counter on one shared page, testing the loop
/// condition (a read) before each decrement (a write). Runs for `run_for`.
pub fn read_writers(delta_ticks: u32, run_for: Duration) -> Result<ReadWritersPoint, BenchError> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (a, b) = two_sites(NodeOptions::default())?;
    let tick_ns = a.node().config().tick_ns;
    let key = 0x5257;
    let ida = a.shmget(key, 4096, IPC_CREAT | 0o600)?;
    a.set_delta(ida, delta_ticks)?;
    let idb = b.shmget(key, 4096, 0o600)?;
    let bases = [
        a.shmat(ida, None, 0)? as usize,
        b.shmat(idb, None, 0)? as usize,
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let stale = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let frames = |x: &Dsm| x.node().counters().frames_sent.load(Ordering::Relaxed);
    let f0 = frames(&a) + frames(&b);
    let started = Instant::now();
    let threads: Vec<_> = (0..2usize)
        .map(|me| {
            let (base, stop, stale, done) = (bases[me], stop.clone(), stale.clone(), done.clone());
            std::thread::spawn(move || {
                let counter = (base + 64 * (me + 1)) as *mut u64;
                let mut expect = u64::MAX;
                // SAFETY: a live attach mapping served by the daemons.
                unsafe { std::ptr::write_volatile(counter, expect) };
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: as above.
                    unsafe {
                        let v = std::ptr::read_volatile(counter);
                        if v != expect {
                            stale.fetch_add(1, Ordering::Relaxed);
                        }
                        if v == 0 {
                            break;
                        }
                        expect = v - 1;
                        std::ptr::write_volatile(counter, expect);
                    }
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(run_for);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| BenchError::Failed("read-writer thread panicked".into()))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let f1 = frames(&a) + frames(&b);
    a.shmdt(bases[0] as *mut u8)?;
    b.shmdt(bases[1] as *mut u8)?;
    a.stop();
    b.stop();
    Ok(ReadWritersPoint {
        delta_ticks,
        tick_ns,
        decrements_per_s: done.load(Ordering::Relaxed) as f64 / elapsed,
        frames_per_s: (f1 - f0) as f64 / elapsed,
        stale_reads: stale.load(Ordering::Relaxed),
    })
}
