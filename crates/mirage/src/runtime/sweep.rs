//! The Δ sweeps of `mmulab dsm bench` (issue #7, "Measurements"): the
//! ping-pong of fleisch89 §7.2 (Fig. 4, with and without `sched_yield`)
//! and the two conflicting read-writers of §8, **one process per site**.
//!
//! For each point the bench binds two loopback listeners and starts two
//! children (`mmulab dsm bench-site`, a hidden subcommand: the running
//! binary re-executed), each handed its listener as fd 3 and a job (the
//! cluster, its site, the key, Δ, the program). A child pins itself to
//! one CPU before it starts any thread — so its daemon threads and its
//! program thread share that core, as a VAX's kernel and process shared
//! its one processor — then starts its site's [`Node`], attaches the
//! segment through the Rust API and waits for `go` on stdin. Site `a`
//! (CPU 0) creates the segment (it is the library and, first, the clock
//! site) and sets Δ before site `b` (CPU 1) is started. After `go` each
//! child runs its program, prints one JSON line (counts, its window on
//! `CLOCK_MONOTONIC`, fault latencies, its frames) and keeps serving
//! until `stop`, so that the other site can still fetch pages from it.
//! Every child is killed and reaped if anything fails ([`Children`]'s
//! `Drop`); nothing is written to disk (the listeners come as fds, the
//! programs attach through the API, so no socket or config file exists).
//!
//! Fault latency is timed in the program around each access to the
//! shared page; an access counts as a fault when the site's fault counter
//! moved during it (only the program thread touches DSM memory in the
//! child, and the daemon counts a fault before serving it).

use super::config::ClusterConfig;
use super::node::{Node, NodeOptions};
use super::shm::{Dsm, IPC_CREAT, ShmError};
use crate::core::SiteId;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering, compiler_fence};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a child site runs once told `go`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub enum Program {
    /// Fig. 4: take turns through a word on the page for `run_ms`.
    PingPong { yield_: bool, run_ms: u64 },
    /// §8: count this site's own counter down from `count` to zero,
    /// testing it (a read) and decrementing it (a write) each iteration,
    /// then `work_ns` of local work off the page (see
    /// [`super::bench`]'s read-writers note).
    ReadWriter { count: u64, work_ns: u64 },
}

/// One child's job (passed as JSON on its command line).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SiteJob {
    pub config: ClusterConfig,
    pub site: u16,
    pub key: i32,
    pub delta_ticks: u32,
    /// The CPU this site's process is pinned to (`None`: not pinned).
    pub cpu: Option<usize>,
    /// Run the program thread under `SCHED_IDLE`, so that the daemon's
    /// threads preempt it as soon as a message wakes them, as Mirage's
    /// kernel-level protocol preempted the VAX process.
    pub program_idle: bool,
    pub program: Program,
}

/// One child's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SiteResult {
    pub site: u16,
    /// The CPUs the process was allowed on while it ran.
    pub cpus: Vec<usize>,
    /// `CLOCK_MONOTONIC` (ns) at `go` and when the program ended.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Ping-pong: this site's turns; read-writer: its decrements.
    pub ops: u64,
    pub stale_reads: u64,
    /// Faulting accesses, timed in the program (ns; the first 100,000).
    pub fault_ns: Vec<u64>,
    pub faults: u64,
    /// Protocol frames this site sent (`Frame::Core`; no heartbeats,
    /// hellos or directory frames) and protocol messages its core sent
    /// to itself (colocated library), during the program.
    pub wire_frames: u64,
    pub local_messages: u64,
}

fn monotonic_ns() -> u64 {
    let mut t = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to fill.
    unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn pin(cpu: usize) -> Result<(), String> {
    use nix::sched::{CpuSet, sched_setaffinity};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| format!("cpu {cpu}: {e}"))?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(|e| format!("pin to cpu {cpu}: {e}"))
}

/// The environment variable that hands a sweep child its cluster key.
pub const KEY_ENV: &str = "MMULAB_DSM_BENCH_KEY";

/// The child's side: `mmulab dsm bench-site --job JSON`, listener on fd 3.
pub fn site_main(job: &str) -> Result<(), String> {
    let mut job: SiteJob = serde_json::from_str(job).map_err(|e| format!("job: {e}"))?;
    if let Some(hex) = std::env::var_os(KEY_ENV) {
        let key = super::key::ClusterKey::from_hex(&hex.to_string_lossy())
            .ok_or_else(|| format!("{KEY_ENV}: not a cluster key"))?;
        job.config.cluster_key = Some(key);
        // SAFETY: no other thread exists yet (pinning and the daemon come
        // later); the key must not reach this process's own children.
        unsafe { std::env::remove_var(KEY_ENV) };
    }
    // Pinned before any thread exists: every thread started below (the
    // daemon's and the program's) inherits the one CPU.
    if let Some(cpu) = job.cpu {
        pin(cpu)?;
    }
    use std::os::fd::FromRawFd;
    // SAFETY: the parent dup2'ed this site's listener onto fd 3 for this
    // process and nothing else here owns fd 3.
    let listener = unsafe { TcpListener::from_raw_fd(3) };
    let node = Node::start_with_listener(
        job.config.clone(),
        SiteId(job.site),
        listener,
        NodeOptions::default(),
    )
    .map_err(|e| format!("site start: {e}"))?;
    let dsm = Dsm::new(node);
    let ps = super::page_size();
    let id = if job.site == 0 {
        let id = dsm
            .shmget(job.key, ps, IPC_CREAT | 0o600)
            .map_err(|e| format!("shmget: {e}"))?;
        dsm.set_delta(id, job.delta_ticks)
            .map_err(|e| format!("set Δ: {e}"))?;
        id
    } else {
        // Site a created the key before this process was started; the
        // directory may still be on its way.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match dsm.shmget(job.key, ps, 0o600) {
                Ok(id) => break id,
                Err(ShmError::NotFound) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => return Err(format!("shmget: {e}")),
            }
        }
    };
    let base = dsm.shmat(id, None, 0).map_err(|e| format!("shmat: {e}"))?;
    if job.program_idle {
        // This (main) thread runs the program; the daemon's threads were
        // started above with the normal policy and keep it.
        let param = nix::libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; a valid param.
        if unsafe { nix::libc::sched_setscheduler(0, nix::libc::SCHED_IDLE, &param) } != 0 {
            return Err(format!(
                "SCHED_IDLE for the program: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    let mut stdout = std::io::stdout().lock();
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    writeln!(stdout, "ready").map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    line.clear();
    stdin.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "go" {
        return Err(format!("expected `go`, got {:?}", line.trim()));
    }
    let c = dsm.node().counters();
    let (w0, l0, f0) = (
        c.core_frames_sent.load(Ordering::Relaxed),
        c.local_messages.load(Ordering::Relaxed),
        c.faults.load(Ordering::Relaxed),
    );
    let start_ns = monotonic_ns();
    let mut timer = FaultTimer {
        faults: &c.faults,
        samples: Vec::new(),
    };
    let (ops, stale_reads) = match job.program {
        Program::PingPong { yield_, run_ms } => {
            pingpong(base as usize, job.site as u64, yield_, run_ms, &mut timer)
        }
        Program::ReadWriter { count, work_ns } => {
            read_writer(base as usize, job.site as usize, count, work_ns, &mut timer)
        }
    };
    let end_ns = monotonic_ns();
    let result = SiteResult {
        site: job.site,
        cpus: allowed_cpus(),
        start_ns,
        end_ns,
        ops,
        stale_reads,
        fault_ns: timer.samples,
        faults: c.faults.load(Ordering::Relaxed) - f0,
        wire_frames: c.core_frames_sent.load(Ordering::Relaxed) - w0,
        local_messages: c.local_messages.load(Ordering::Relaxed) - l0,
    };
    writeln!(
        stdout,
        "{}",
        serde_json::to_string(&result).map_err(|e| e.to_string())?
    )
    .map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;
    // Keep serving the other site until told to stop (or the parent went).
    line.clear();
    let _ = stdin.read_line(&mut line);
    let _ = dsm.shmdt(base);
    dsm.shutdown();
    Ok(())
}

struct FaultTimer<'a> {
    faults: &'a AtomicU64,
    samples: Vec<u64>,
}

impl FaultTimer<'_> {
    const KEEP: usize = 100_000;

    /// Runs one access to DSM memory; if the site's fault counter moved
    /// meanwhile, the access faulted and its time is kept.
    #[inline(always)]
    fn access<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let f0 = self.faults.load(Ordering::Relaxed);
        let t = Instant::now();
        compiler_fence(Ordering::SeqCst);
        let v = f();
        compiler_fence(Ordering::SeqCst);
        let dt = t.elapsed().as_nanos() as u64;
        if self.faults.load(Ordering::Relaxed) != f0 && self.samples.len() < Self::KEEP {
            self.samples.push(dt);
        }
        v
    }
}

/// fleisch89 Fig. 4 between two sites: word 0 says whose turn it is;
/// each site writes its round into its own word and checks the other's
/// (the oracle). Returns (this site's turns, stale reads).
fn pingpong(base: usize, me: u64, yield_: bool, run_ms: u64, t: &mut FaultTimer) -> (u64, u64) {
    let turn = base as *mut u64;
    let slot = (base + 8 * (1 + me as usize)) as *mut u64;
    let other = (base + 8 * (2 - me as usize)) as *const u64;
    let deadline = Instant::now() + Duration::from_millis(run_ms);
    let (mut r, mut stale) = (0u64, 0u64);
    'outer: loop {
        let my_turn = 2 * r + me;
        // SAFETY (all accesses): a live attach mapping of a page-sized
        // segment, served by this process's site daemon.
        while t.access(|| unsafe { std::ptr::read_volatile(turn) }) != my_turn {
            if Instant::now() >= deadline {
                break 'outer;
            }
            if yield_ {
                std::thread::yield_now();
            }
        }
        if t.access(|| unsafe { std::ptr::read_volatile(other) }) != r + me {
            stale += 1;
        }
        t.access(|| unsafe { std::ptr::write_volatile(slot, r + 1) });
        t.access(|| unsafe { std::ptr::write_volatile(turn, my_turn + 1) });
        r += 1;
        if Instant::now() >= deadline {
            break;
        }
    }
    (r, stale)
}

/// fleisch89 §8 at one site: its own counter (a cache line of its own on
/// the shared page) from `count` down to zero; each iteration tests the
/// loop condition (a read), decrements (a write), then does `work_ns` of
/// local work off the page. Returns (decrements, stale reads).
fn read_writer(base: usize, me: usize, count: u64, work_ns: u64, t: &mut FaultTimer) -> (u64, u64) {
    let counter = (base + 64 * (me + 1)) as *mut u64;
    // SAFETY (all accesses): as in `pingpong`.
    t.access(|| unsafe { std::ptr::write_volatile(counter, count) });
    let (mut expect, mut n, mut stale) = (count, 0u64, 0u64);
    let mut local = 0u64;
    loop {
        let v = t.access(|| unsafe { std::ptr::read_volatile(counter) });
        if v != expect {
            stale += 1;
        }
        if v == 0 {
            break;
        }
        expect = v - 1;
        t.access(|| unsafe { std::ptr::write_volatile(counter, expect) });
        n += 1;
        if work_ns > 0 {
            let until = Instant::now() + Duration::from_nanos(work_ns);
            while Instant::now() < until {
                local =
                    std::hint::black_box(local.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
    }
    (n, stale)
}

/// The bench's children; every one still running is killed and reaped on
/// drop (an error anywhere leaves no process behind).
struct Children {
    procs: Vec<(Child, Option<ChildStdin>, mpsc::Receiver<String>)>,
    stderr: Vec<std::sync::Arc<std::sync::Mutex<String>>>,
}

impl Drop for Children {
    fn drop(&mut self) {
        for (c, stdin, _) in &mut self.procs {
            drop(stdin.take());
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

impl Children {
    fn spawn(
        &mut self,
        exe: &std::path::Path,
        job: &SiteJob,
        listener: TcpListener,
    ) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = listener.as_raw_fd();
        let mut cmd = Command::new(exe);
        // The cluster key goes by the environment (readable by this user
        // only), never on the command line (readable by everyone).
        if let Some(k) = &job.config.cluster_key {
            cmd.env(KEY_ENV, k.to_hex());
        }
        cmd.args(["dsm", "bench-site", "--job"])
            .arg(serde_json::to_string(job).map_err(|e| e.to_string())?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: dup2/fcntl are async-signal-safe; the closure only
        // moves this site's listener to fd 3 (without close-on-exec).
        unsafe {
            cmd.pre_exec(move || {
                if fd == 3 {
                    let flags = nix::libc::fcntl(3, nix::libc::F_GETFD);
                    if flags < 0
                        || nix::libc::fcntl(3, nix::libc::F_SETFD, flags & !nix::libc::FD_CLOEXEC)
                            < 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if nix::libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", exe.display()))?;
        drop(listener);
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let l2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = l2.lock().expect("log");
                if l.len() < 16_384 {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        self.procs.push((child, stdin, rx));
        self.stderr.push(log);
        Ok(())
    }

    fn line(&mut self, i: usize, within: Duration) -> Result<String, String> {
        match self.procs[i].2.recv_timeout(within) {
            Ok(l) => Ok(l),
            Err(e) => {
                // Give its stderr reader a moment to catch the last words.
                std::thread::sleep(Duration::from_millis(100));
                let status = self.procs[i].0.try_wait().ok().flatten();
                Err(format!(
                    "site {} child: no answer ({e}); exit: {status:?}; stderr: {}",
                    (b'a' + i as u8) as char,
                    self.stderr[i].lock().expect("log").trim()
                ))
            }
        }
    }

    fn say(&mut self, i: usize, what: &str) -> Result<(), String> {
        let stdin = self.procs[i].1.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{what}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("site {i} child: {e}"))
    }

    /// `stop` to each (b first: it checks its pages in at a, the library),
    /// then waits for each to exit (bounded; killed past it).
    fn finish(mut self) -> Result<(), String> {
        let mut err = None;
        for i in (0..self.procs.len()).rev() {
            let _ = self.say(i, "stop");
            drop(self.procs[i].1.take());
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                match self.procs[i].0.try_wait() {
                    Ok(Some(s)) => {
                        if !s.success() && err.is_none() {
                            err = Some(format!(
                                "site child {i} exited with {s}: {}",
                                self.stderr[i].lock().expect("log").trim()
                            ));
                        }
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => break, // killed by Drop
                }
            }
        }
        err.map_or(Ok(()), Err)
    }
}

/// One sweep point: Δ (in ticks of `tick_ns`) on `key`, and what the
/// two programs run.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub tick_ns: u64,
    pub key: i32,
    pub delta_ticks: u32,
    pub program: Program,
    pub program_idle: bool,
}

/// Runs one point: two site processes (site a on `cpus[0]`, site b on
/// `cpus[1]`), both running `point.program` on one page of its key.
pub fn run_point(
    exe: &std::path::Path,
    cpus: [Option<usize>; 2],
    point: Point,
    timeout: Duration,
) -> Result<[SiteResult; 2], String> {
    let listeners = [
        TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?,
        TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?,
    ];
    let addrs = [
        listeners[0].local_addr().map_err(|e| e.to_string())?,
        listeners[1].local_addr().map_err(|e| e.to_string())?,
    ];
    let cluster_id = (std::process::id() as u64) << 32 ^ monotonic_ns() & 0xffff_ffff;
    let mut config = ClusterConfig::loopback(cluster_id, &addrs);
    config.tick_ns = point.tick_ns;
    let mut kids = Children {
        procs: Vec::new(),
        stderr: Vec::new(),
    };
    for (site, listener) in listeners.into_iter().enumerate() {
        let job = SiteJob {
            config: config.clone(),
            site: site as u16,
            key: point.key,
            delta_ticks: point.delta_ticks,
            cpu: cpus[site],
            program_idle: point.program_idle,
            program: point.program,
        };
        kids.spawn(exe, &job, listener)?;
        // a creates the segment and sets Δ before b is started.
        let l = kids.line(site, Duration::from_secs(20))?;
        if l != "ready" {
            return Err(format!("site {site} child: {l}"));
        }
    }
    kids.say(0, "go")?;
    kids.say(1, "go")?;
    let mut out = Vec::new();
    for i in 0..2 {
        let l = kids.line(i, timeout)?;
        out.push(
            serde_json::from_str::<SiteResult>(&l)
                .map_err(|e| format!("site {i} child: {e}: {l}"))?,
        );
    }
    kids.finish()?;
    let b = out.pop().expect("two");
    let a = out.pop().expect("two");
    Ok([a, b])
}
