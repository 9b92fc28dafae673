//! A bounded, adaptive poll before the fault path's threads sleep
//! (issue #23, "Performance").
//!
//! A remote read fault crosses four sleeping threads: the userfaultfd
//! reader (the fault), the library's socket reader (the request), the
//! faulting site's socket reader (the page) and the faulter itself (the
//! wake). A loopback round trip crosses two. Each wake-up of a thread
//! asleep in `poll`/`read` costs a scheduler round, and on a virtual
//! machine whose vCPU halted, a hypervisor exit and an IPI: measured here
//! on an idle guest, 20-40 µs per hand-off, more than the work itself.
//!
//! So a thread that waits for the next fault or frame first polls for it,
//! without sleeping, for at most [`NodeOptions::spin`](super::node::NodeOptions::spin),
//! yielding the CPU between tries (any runnable thread on that CPU runs
//! first), and sleeps only after that. It polls only while its inputs
//! come close together: a wait that lasted longer than the window turns
//! polling off for that thread until a wait is short again (measured on
//! the sleeping path). An idle site never polls, and a connection that
//! carries only heartbeats never does. A thread that may run on one CPU
//! only (the bench's sweep sites are pinned) never polls: the thread it
//! waits for could not run meanwhile.
//!
//! Polling must never take a CPU from real work. It happens only while
//! the kernel reports that tasks seldom wait for a CPU (its pressure
//! stall information, [`IDLE_PRESSURE_PCT`]); and a yield that comes back
//! late (the CPU went to another thread, [`CONTENDED`]) ends the poll,
//! and the thread then sleeps without polling for [`COOL`]. So on a
//! loaded machine the path sleeps as before, save a probe now and then.
//!
//! The cost, stated: on an otherwise idle machine, while faults or frames
//! come less than a window apart, each such thread keeps up to one CPU
//! busy (polling and yielding) between them; at most one window of CPU
//! per wait otherwise, and none once its inputs stop.

use std::io;
use std::time::{Duration, Instant};

/// One thread's poll-before-sleep state.
pub(crate) struct Spin {
    window: Duration,
    /// The last wait was short enough that polling would have caught it.
    hot: bool,
    /// No polling before this: a yield gave the CPU away (other work
    /// wanted it), so polling would take CPU time from someone.
    cool_until: Option<Instant>,
}

/// A yield that came back later than this gave the CPU to another thread
/// (an uncontended `sched_yield` and a non-blocking read take a few µs).
/// [A] 50 µs: above a VM's syscall and a short hand-off, below a
/// scheduler slice.
const CONTENDED: Duration = Duration::from_micros(50);
/// How long a thread that found the CPU contended sleeps without polling.
/// [A] 20 ms: a probe costs at most one window, so under load polling
/// costs under 1 % of a CPU per thread.
const COOL: Duration = Duration::from_millis(20);

impl Spin {
    /// For the calling thread: no polling at all when `window` is zero or
    /// the thread may run on one CPU only.
    pub(crate) fn new(window: Duration) -> Spin {
        let window = if thread_cpus() >= 2 && env_mode() != EnvMode::Off {
            window
        } else {
            Duration::ZERO
        };
        Spin {
            window,
            hot: false,
            cool_until: None,
        }
    }

    /// Polls `try_once` (a non-blocking attempt) for up to the window
    /// when the thread is hot; `None`: nothing came, sleep now.
    pub(crate) fn poll<T>(
        &mut self,
        mut try_once: impl FnMut() -> io::Result<Option<T>>,
    ) -> io::Result<Option<T>> {
        if !self.hot || self.window.is_zero() {
            return Ok(None);
        }
        let start = Instant::now();
        let gated = env_mode() != EnvMode::Always;
        if self.cool_until.is_some_and(|t| start < t) || (gated && !cpus_idle()) {
            return Ok(None);
        }
        self.cool_until = None;
        loop {
            if let Some(x) = try_once()? {
                return Ok(Some(x));
            }
            let before = Instant::now();
            if before - start >= self.window {
                self.hot = false;
                return Ok(None);
            }
            std::thread::yield_now();
            let after = Instant::now();
            if after - before > CONTENDED {
                // Someone else wanted this CPU: stop taking it from them.
                self.cool_until = Some(after + COOL);
                return try_once();
            }
        }
    }

    /// A wait ended after `waited` (polled or slept): poll before the
    /// next one only if polling would have caught this one.
    pub(crate) fn waited(&mut self, waited: Duration) {
        self.hot = !self.window.is_zero() && waited <= self.window;
    }
}

/// `MMULAB_DSM_SPIN`, for measuring the polling itself with one build:
/// `off` never polls, `always` polls without the pressure gate (the other
/// gates stay); unset or anything else: as documented above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EnvMode {
    Gated,
    Off,
    Always,
}

fn env_mode() -> EnvMode {
    static MODE: std::sync::OnceLock<EnvMode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("MMULAB_DSM_SPIN").as_deref() {
        Ok("off") => EnvMode::Off,
        Ok("always") => EnvMode::Always,
        _ => EnvMode::Gated,
    })
}

/// Polling is allowed only while tasks seldom wait for a CPU: the
/// kernel's CPU pressure (`/proc/pressure/cpu`, "some avg10", the share
/// of the last 10 s in which some task was runnable but not running)
/// is under this, in percent. [A] 10 %: on this 2-core guest under the
/// other agents' load it reads 99 %; polling there made the bench's
/// p50 worse (issue #23's measurements, docs/dsm.md).
const IDLE_PRESSURE_PCT: f64 = 10.0;
/// How often the pressure is read again (one small file read).
const PRESSURE_EVERY: Duration = Duration::from_millis(100);

/// Whether the machine has CPU time to spare ([`IDLE_PRESSURE_PCT`]);
/// false where the kernel reports no CPU pressure (no PSI): then the
/// path sleeps as it always did.
fn cpus_idle() -> bool {
    use std::sync::Mutex;
    static LAST: Mutex<Option<(Instant, bool)>> = Mutex::new(None);
    let now = Instant::now();
    if let Ok(g) = LAST.lock()
        && let Some((at, idle)) = *g
        && now - at < PRESSURE_EVERY
    {
        return idle;
    }
    let idle = std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|t| some_avg10(&t))
        .is_some_and(|p| p < IDLE_PRESSURE_PCT);
    if let Ok(mut g) = LAST.lock() {
        *g = Some((now, idle));
    }
    idle
}

/// "some avg10=…" of a PSI file.
fn some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("avg10="))?
        .parse()
        .ok()
}

/// How many CPUs the calling thread may run on (1 when unreadable).
fn thread_cpus() -> usize {
    // SAFETY: sched_getaffinity(2) of the calling thread into a set of
    // its own size.
    unsafe {
        let mut set: nix::libc::cpu_set_t = std::mem::zeroed();
        if nix::libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) != 0 {
            return 1;
        }
        nix::libc::CPU_COUNT(&set) as usize
    }
}

/// A TCP stream read through a [`Spin`]: a read first polls the socket
/// (`MSG_DONTWAIT`), then blocks as the stream would (its read timeout
/// still applies to the sleep).
pub(crate) struct SpinRead<'a> {
    stream: &'a std::net::TcpStream,
    spin: Spin,
}

impl<'a> SpinRead<'a> {
    pub(crate) fn new(stream: &'a std::net::TcpStream, window: Duration) -> SpinRead<'a> {
        SpinRead {
            stream,
            spin: Spin::new(window),
        }
    }
}

impl io::Read for SpinRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let start = Instant::now();
        let fd = self.stream.as_raw_fd();
        let polled = self.spin.poll(|| {
            // SAFETY: recv(2) into `buf`, of its length, on our socket.
            let n = unsafe {
                nix::libc::recv(
                    fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    nix::libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            }
        })?;
        let n = match polled {
            Some(n) => n,
            None => io::Read::read(&mut &*self.stream, buf)?,
        };
        self.spin.waited(start.elapsed());
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn polls_only_after_a_short_wait_and_reads_every_byte() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let mut r = SpinRead::new(&s, Duration::from_millis(50));
        // Cold: the first read sleeps (nothing polled).
        assert!(!r.spin.hot);
        c.write_all(b"abc").unwrap();
        let mut buf = [0u8; 8];
        let n = r.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], &b"abc"[..n]);
        // Data that was already there: a short wait, so it polls next.
        let multi = thread_cpus() >= 2;
        assert_eq!(r.spin.hot, multi);
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            c.write_all(b"defg").unwrap();
            std::thread::sleep(Duration::from_millis(200));
            c.write_all(b"h").unwrap();
            c
        });
        let mut got = buf[..n].to_vec();
        while got.len() < 7 {
            let n = r.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(&got, b"abcdefg");
        // A wait past the window (200 ms against 50 ms) turns polling off.
        let n = r.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"h");
        assert!(!r.spin.hot);
        drop(w.join().unwrap());
        assert_eq!(r.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn reads_the_cpu_pressure() {
        let t = "some avg10=99.39 avg60=99.28 avg300=99.43 total=2247341068\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(some_avg10(t), Some(99.39));
        assert_eq!(some_avg10("full avg10=1.00\n"), None);
        assert_eq!(some_avg10("some avg10=x\n"), None);
    }

    #[test]
    fn a_zero_window_never_polls() {
        let mut s = Spin::new(Duration::ZERO);
        s.waited(Duration::ZERO);
        let mut tries = 0;
        let got: Option<()> = s
            .poll(|| {
                tries += 1;
                Ok(None)
            })
            .unwrap();
        assert!(got.is_none());
        assert_eq!(tries, 0);
    }
}
