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
    /// fleisch89 Fig. 4's ping-pong across the two site processes, per Δ
    /// (with and without yield).
    pub pingpong: Vec<PingPongPoint>,
    /// fleisch89 §8's two conflicting read-writers, per Δ.
    pub read_writers: Vec<ReadWritersPoint>,
    /// How the sweeps ran: processes, CPUs, tick, work.
    pub sweep_setup: String,
    /// Each site process's CPUs (site a, site b), as the children saw them.
    pub site_cpus: Vec<Vec<usize>>,
    /// The shape verdicts (issue #7), from the points above.
    pub shapes: Shapes,
    pub wall_ms: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReadWritersPoint {
    pub delta_ticks: u32,
    pub tick_ns: u64,
    /// Decrements of both sites (the fixed work: `2 × count`) over the
    /// run, from the first `go` to the last site's end.
    pub decrements_per_s: f64,
    pub decrements: u64,
    pub elapsed_ms: f64,
    /// Protocol messages (wire frames `Frame::Core` of both sites, plus
    /// messages a core sent to itself, its colocated library), total and
    /// per 1000 decrements. Heartbeats are never counted.
    pub messages: u64,
    pub messages_per_kdec: f64,
    /// Latency of faulting accesses, timed in the programs (both sites).
    pub fault_ns: Option<Percentiles>,
    pub faults: u64,
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
    pub cycles: u64,
    /// Protocol messages per cycle: `wire_frames_per_cycle` (`Frame::Core`
    /// sent by both sites; no heartbeats, hellos or directory frames) plus
    /// `local_messages_per_cycle` (sent by site a's core to itself, the
    /// colocated library). fleisch89 §7.2 counts 9 per cycle.
    pub messages_per_cycle: f64,
    pub wire_frames_per_cycle: f64,
    pub local_messages_per_cycle: f64,
    pub faults_per_cycle: f64,
    /// Latency of faulting accesses, timed in the programs (both sites).
    pub fault_ns: Option<Percentiles>,
    pub stale_reads: u64,
}

/// The shape verdicts, computed from the measured points only.
#[derive(Clone, Debug, Serialize)]
pub struct Shapes {
    /// Ping-pong with yield: the best cycles/s is at Δ = 0.
    pub pingpong_yield_best_at_zero: bool,
    /// Read-writers: the Δ (ticks) of the highest throughput.
    pub rw_optimum_delta_ticks: u32,
    /// Throughput rises from Δ = 0 to the optimum (Δ = 0 at most 80 % of it).
    pub rw_contention_side: bool,
    /// Throughput falls past the optimum (the last point at most 80 % of it).
    pub rw_retention_side: bool,
    /// Relative slopes, per ms of Δ: (max − first)/max/(Δopt − Δ0) and
    /// (max − last)/max/(Δlast − Δopt).
    pub rw_contention_slope_per_ms: f64,
    pub rw_retention_slope_per_ms: f64,
    /// Both sides, and the retention side the gentler.
    pub rw_paper_shape: bool,
    pub lines: Vec<String>,
}

impl Shapes {
    fn of(pp: &[PingPongPoint], rw: &[ReadWritersPoint]) -> Shapes {
        let mut lines = Vec::new();
        let yields: Vec<&PingPongPoint> = pp.iter().filter(|p| p.yield_).collect();
        let best = yields
            .iter()
            .max_by(|x, y| x.cycles_per_s.total_cmp(&y.cycles_per_s));
        let at_zero = yields.iter().find(|p| p.delta_ticks == 0);
        let pingpong_yield_best_at_zero = matches!((best, at_zero), (Some(b), Some(z)) if b.delta_ticks == 0 && z.cycles_per_s > 0.0);
        if let (Some(b), Some(z)) = (best, at_zero) {
            lines.push(format!(
                "verdict ping-pong: yield best at Δ=0: {} (Δ=0: {:.0} cycles/s; best: {:.0} cycles/s at Δ={})",
                if pingpong_yield_best_at_zero { "yes" } else { "no" },
                z.cycles_per_s,
                b.cycles_per_s,
                b.delta_ticks
            ));
        }
        let ms = |p: &ReadWritersPoint| p.delta_ticks as f64 * p.tick_ns as f64 / 1e6;
        let (mut opt, mut c_slope, mut r_slope) = (0usize, 0.0, 0.0);
        let (mut contention, mut retention) = (false, false);
        if !rw.is_empty() {
            opt = (0..rw.len())
                .max_by(|&x, &y| rw[x].decrements_per_s.total_cmp(&rw[y].decrements_per_s))
                .expect("points");
            let max = rw[opt].decrements_per_s;
            let (first, last) = (&rw[0], &rw[rw.len() - 1]);
            contention = opt > 0 && first.decrements_per_s <= 0.8 * max;
            retention = opt + 1 < rw.len() && last.decrements_per_s <= 0.8 * max;
            if opt > 0 {
                c_slope =
                    (max - first.decrements_per_s) / max / (ms(&rw[opt]) - ms(first)).max(1e-9);
            }
            if opt + 1 < rw.len() {
                r_slope = (max - last.decrements_per_s) / max / (ms(last) - ms(&rw[opt])).max(1e-9);
            }
        }
        let rw_paper_shape = contention && retention && r_slope < c_slope;
        if !rw.is_empty() {
            let yn = |b: bool| if b { "yes" } else { "no" };
            lines.push(format!(
                "verdict read-writers: optimum at Δ={} ({:.1} ms); contention side: {} (slope {:.3}/ms); retention side: {} (slope {:.3}/ms); retention gentler: {}; paper's shape: {}",
                rw[opt].delta_ticks,
                ms(&rw[opt]),
                yn(contention),
                c_slope,
                yn(retention),
                r_slope,
                yn(retention && r_slope < c_slope),
                yn(rw_paper_shape)
            ));
        }
        Shapes {
            pingpong_yield_best_at_zero,
            rw_optimum_delta_ticks: rw.get(opt).map_or(0, |p| p.delta_ticks),
            rw_contention_side: contention,
            rw_retention_side: retention,
            rw_contention_slope_per_ms: c_slope,
            rw_retention_slope_per_ms: r_slope,
            rw_paper_shape,
            lines,
        }
    }
}

impl BenchReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serializes")
    }

    pub fn render(&self) -> String {
        let mut pp = self.sweep_setup.clone() + "\n";
        let lat = |f: &Option<Percentiles>| {
            f.as_ref().map_or("no faults".to_string(), |f| {
                format!(
                    "fault p50 {:>7} p90 {:>7} p99 {:>8} ns",
                    f.p50, f.p90, f.p99
                )
            })
        };
        for p in &self.pingpong {
            pp.push_str(&format!(
                "ping-pong Δ={:>3} ticks of {} µs, {}: {:>8.1} cycles/s, {:>5.2} messages/cycle ({:.2} wire + {:.2} local; paper: 9), {:.2} faults/cycle, {}, stale reads {}\n",
                p.delta_ticks,
                p.tick_ns / 1000,
                if p.yield_ { "yield   " } else { "no yield" },
                p.cycles_per_s,
                p.messages_per_cycle,
                p.wire_frames_per_cycle,
                p.local_messages_per_cycle,
                p.faults_per_cycle,
                lat(&p.fault_ns),
                p.stale_reads
            ));
        }
        for p in &self.read_writers {
            pp.push_str(&format!(
                "read-writers Δ={:>4} ticks of {} µs: {:>10.0} decrements/s ({} in {:.0} ms), {:>6.1} messages/1000 decrements, {} faults, {}, stale reads {}\n",
                p.delta_ticks,
                p.tick_ns / 1000,
                p.decrements_per_s,
                p.decrements,
                p.elapsed_ms,
                p.messages_per_kdec,
                p.faults,
                lat(&p.fault_ns),
                p.stale_reads
            ));
        }
        for l in &self.shapes.lines {
            pp.push_str(l);
            pp.push('\n');
        }
        pp + &format!(
            "remote fault (read, page held for writing by the other site), {} faults\n\
             \x20 p50 {:>9} ns   p90 {:>9} ns   p99 {:>9} ns\n\
             limit: loopback round trip p50 {} ns + 4 KiB copy p50 {} ns = {} ns\n\
             ratio p50/limit: {:.2} (aim: 2 or less, issue #23; authenticated: every frame sealed)\n\
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
    /// Ctrl-C before the first remote fault was timed: nothing to report.
    #[error("stopped by Ctrl-C before a remote fault was timed")]
    Interrupted,
}

/// Starts two loopback sites in this process (ports chosen by the kernel).
pub fn two_sites(options: NodeOptions) -> std::io::Result<(Dsm, Dsm)> {
    two_sites_with(options, super::config::Semantics::default())
}

/// [`two_sites`] under the given lifetime rule.
pub fn two_sites_with(
    options: NodeOptions,
    semantics: super::config::Semantics,
) -> std::io::Result<(Dsm, Dsm)> {
    let la = TcpListener::bind("127.0.0.1:0")?;
    let lb = TcpListener::bind("127.0.0.1:0")?;
    let cluster_id = std::process::id() as u64 ^ 0x6d6972616765;
    let mut config = ClusterConfig::loopback(cluster_id, &[la.local_addr()?, lb.local_addr()?]);
    config.semantics = semantics;
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
    run_until(quick, None)
}

/// [`run`], stopped when `stop` is raised (Ctrl-C): the remote-fault loop
/// ends at its next fault and keeps the faults timed; the sweeps start no
/// further point (a point whose site processes the Ctrl-C also stopped is
/// dropped). The report covers what was measured.
pub fn run_until(
    quick: bool,
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Result<BenchReport, BenchError> {
    let stopped = || stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
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
    let mut cycles = 0u64;
    for i in 0..(n + warmup) as u64 {
        if stopped() {
            break;
        }
        cycles += 1;
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
    if samples.is_empty() {
        return Err(BenchError::Interrupted);
    }
    let timed = samples.len();
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
    let sweeps = sweeps(quick, &stopped)?;
    if quick && started.elapsed() > Duration::from_secs(60) {
        return Err(BenchError::Failed("bench ran past a minute".into()));
    }
    Ok(BenchReport {
        shapes: Shapes::of(&sweeps.pingpong, &sweeps.read_writers),
        pingpong: sweeps.pingpong,
        read_writers: sweeps.read_writers,
        sweep_setup: sweeps.setup,
        site_cpus: sweeps.site_cpus,
        ratio: remote.p50 as f64 / limit_ns as f64,
        remote_fault_ns: remote,
        breakdown_ns,
        limit_ns,
        loopback_rtt_ns: rtt,
        copy_4k_ns: copy,
        faults_timed: timed,
        stale_reads: stale,
        fault_path: probe.describe(),
        frames_per_cycle: (frames_after - frames_before) as f64 / cycles as f64,
        wall_ms: started.elapsed().as_millis() as u64,
    })
}

/// The sweeps' Δ tick: 100 µs (a VAX's Δ ran in clock ticks of tens of
/// ms against 27.5 ms remote faults; here a remote fault takes tens of
/// µs, so the tick shrinks with it).
pub const SWEEP_TICK_NS: u64 = 100_000;

/// Read-writers: each site's program thread runs under `SCHED_IDLE` on
/// its core, its daemon's threads under the normal policy: a message wakes the daemon
/// and it preempts the program at once, as Mirage's protocol ran in the
/// VAX kernel at interrupt level and preempted the process. Without it a
/// program spinning on its core (the read-writers' loop, the ping-pong
/// without yield) keeps the core until the scheduler's slice ends (ms),
/// and that slice, not Δ, decides how long a site keeps a page (measured
/// here: Δ = 0 then ran as fast as Δ = 0.5 ms, no contention side). The
/// ping-pong keeps the normal policy for its program: its busy-waiting
/// with and without yield is what it compares (§7.2). `SCHED_IDLE` has
/// a cost on a shared machine: any other runnable task on that core
/// starves the program, so read-writer times are load-sensitive.
pub const PROGRAM_IDLE: bool = true;

/// Read-writers: each site counts its own counter down from this.
pub const RW_COUNT: u64 = 20_000;
/// Read-writers: local work per iteration, off the page (ns).
pub const RW_WORK_NS: u64 = 5_000;

struct Sweeps {
    pingpong: Vec<PingPongPoint>,
    read_writers: Vec<ReadWritersPoint>,
    setup: String,
    site_cpus: Vec<Vec<usize>>,
}

fn percentiles_of(v: Vec<u64>) -> Option<Percentiles> {
    (!v.is_empty()).then(|| Percentiles::of(v))
}

/// The ping-pong and read-writer sweeps, one process per site
/// ([`super::sweep`]), site a pinned to the first allowed CPU and site b
/// to the second (both to the one if there is only one).
///
/// Read-writers (fleisch89 §8): each site counts its own counter (on the
/// one shared page) down from [`RW_COUNT`] to zero, testing it (a read)
/// and decrementing it (a write) each iteration: fixed work, so the
/// throughput is total decrements over the elapsed time of both. Each
/// iteration also does [`RW_WORK_NS`] of local work off the page: the
/// VAX's loop ran at ~10^5 iterations/s against 27.5 ms page moves; a
/// bare loop here runs ~10^7/s against ~0.1 ms page moves, and at Δ = 0
/// the fixed work would take minutes. Retention arises as §8 describes,
/// "one of the processes retains the page for longer than it needs":
/// with a large Δ a site that holds the page keeps it for all of Δ, and
/// the site that finishes its count first still holds the page (nothing
/// of its program needs it any more) while the other waits out the rest
/// of Δ. Nothing else is added; if the curve shows no such side here,
/// the verdict says so.
fn sweeps(quick: bool, stopped: &dyn Fn() -> bool) -> Result<Sweeps, BenchError> {
    let exe = std::env::current_exe()?;
    let allowed = super::sweep::allowed_cpus();
    let cpus = match allowed.as_slice() {
        [] => [None, None],
        [one] => [Some(*one), Some(*one)],
        [x, y, ..] => [Some(*x), Some(*y)],
    };
    let pin_text = match cpus {
        [Some(x), Some(y)] if x == y => format!(
            "one CPU only: sites a and b both pinned to CPU {x} (each site's daemon and program share it, and so do the two sites)"
        ),
        [Some(x), Some(y)] => format!("site a pinned to CPU {x}, site b to CPU {y}"),
        _ => "not pinned (affinity unreadable)".to_string(),
    };
    let (pp_deltas, pp_ms, rw_deltas): (&[u32], u64, &[u32]) = if quick {
        (&[0, 2, 10], 300, &[0, 5, 100, 1000, 4000])
    } else {
        (
            &[0, 1, 2, 5, 10, 20],
            700,
            &[0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000],
        )
    };
    let setup = format!(
        "sweeps: one process per site (its daemon and program share its core; read-writer programs under SCHED_IDLE: {PROGRAM_IDLE}), two sites over loopback; {pin_text}; Δ tick {} µs; ping-pong {} ms per point; read-writers: {} decrements per site, {} µs local work per iteration",
        SWEEP_TICK_NS / 1000,
        pp_ms,
        RW_COUNT,
        RW_WORK_NS / 1000
    );
    let fail = BenchError::Failed;
    let mut site_cpus = Vec::new();
    let mut pingpong = Vec::new();
    'pp: for yield_ in [true, false] {
        for &delta_ticks in pp_deltas {
            if stopped() {
                break 'pp;
            }
            let point = super::sweep::run_point(
                &exe,
                cpus,
                super::sweep::Point {
                    tick_ns: SWEEP_TICK_NS,
                    key: 0x5050,
                    delta_ticks,
                    program: super::sweep::Program::PingPong {
                        yield_,
                        run_ms: pp_ms,
                    },
                    program_idle: false,
                },
                Duration::from_millis(pp_ms) + Duration::from_secs(30),
            );
            let [a, b] = match point {
                Err(_) if stopped() => break 'pp,
                p => p.map_err(fail)?,
            };
            if site_cpus.is_empty() {
                site_cpus = vec![a.cpus.clone(), b.cpus.clone()];
            }
            let cycles = a.ops.min(b.ops);
            let secs = (a.end_ns.max(b.end_ns) - a.start_ns.min(b.start_ns)) as f64 / 1e9;
            let per = |x: u64| x as f64 / cycles.max(1) as f64;
            let wire = a.wire_frames + b.wire_frames;
            let local = a.local_messages + b.local_messages;
            pingpong.push(PingPongPoint {
                delta_ticks,
                tick_ns: SWEEP_TICK_NS,
                yield_,
                cycles_per_s: cycles as f64 / secs,
                cycles,
                messages_per_cycle: per(wire + local),
                wire_frames_per_cycle: per(wire),
                local_messages_per_cycle: per(local),
                faults_per_cycle: per(a.faults + b.faults),
                fault_ns: percentiles_of([a.fault_ns, b.fault_ns].concat()),
                stale_reads: a.stale_reads + b.stale_reads,
            });
        }
    }
    let mut read_writers = Vec::new();
    for &delta_ticks in rw_deltas {
        if stopped() {
            break;
        }
        let point = super::sweep::run_point(
            &exe,
            cpus,
            super::sweep::Point {
                tick_ns: SWEEP_TICK_NS,
                key: 0x5257,
                delta_ticks,
                program: super::sweep::Program::ReadWriter {
                    count: RW_COUNT,
                    work_ns: RW_WORK_NS,
                },
                program_idle: PROGRAM_IDLE,
            },
            Duration::from_secs(120),
        );
        let [a, b] = match point {
            Err(_) if stopped() => break,
            p => p.map_err(fail)?,
        };
        let n = a.ops + b.ops;
        let ns = a.end_ns.max(b.end_ns) - a.start_ns.min(b.start_ns);
        let messages = a.wire_frames + b.wire_frames + a.local_messages + b.local_messages;
        read_writers.push(ReadWritersPoint {
            delta_ticks,
            tick_ns: SWEEP_TICK_NS,
            decrements_per_s: n as f64 / (ns as f64 / 1e9),
            decrements: n,
            elapsed_ms: ns as f64 / 1e6,
            messages,
            messages_per_kdec: messages as f64 * 1000.0 / n.max(1) as f64,
            fault_ns: percentiles_of([a.fault_ns, b.fault_ns].concat()),
            faults: a.faults + b.faults,
            stale_reads: a.stale_reads + b.stale_reads,
        });
    }
    Ok(Sweeps {
        pingpong,
        read_writers,
        setup,
        site_cpus,
    })
}
