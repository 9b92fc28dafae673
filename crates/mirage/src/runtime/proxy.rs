//! `mmulab dsm proxy`: a TCP proxy that injects the faults of a bad
//! network between two sites (issue #23; the fault tests' proxy, made a
//! tool, because netem may be missing).
//!
//! ```text
//! mmulab dsm proxy --listen 127.0.0.1:7601 --to 127.0.0.1:7501 --delay 20 --drop 0.01 --cut-after 6000 --seed 7
//! ```
//!
//! Point a site's `addr` in the *dialling* sites' view at the proxy (or
//! give the site its own port and the others the proxy's). For each chunk
//! read from either side:
//! - `--delay MS`: it waits MS milliseconds before it is forwarded (in
//!   order: a slow link, not a reordering one);
//! - `--drop P`: it is discarded with probability P. TCP itself never
//!   loses bytes; this is a corrupting middlebox, and a site must notice
//!   (the next record fails its tag or the framing, and the connection is
//!   dropped by name);
//! - `--cut-after BYTES`: once BYTES bytes went one way on a connection
//!   (counted from the connection's start, or from the latest change of
//!   the faults), the rest of that chunk is thrown away and both
//!   directions are shut down: a cut in the middle of whatever frame was
//!   passing;
//! - `--seed S`: the loss stream's seed (ChaCha8, one stream per
//!   connection and direction, in accept order), printed at start.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The faults a proxy injects. Every default is written here: none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Faults {
    pub delay: Duration,
    /// Probability of discarding a chunk, in [0, 1].
    pub drop: f64,
    /// Cut a connection once this many bytes went one way.
    pub cut_after: Option<u64>,
    pub seed: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            delay: Duration::ZERO,
            drop: 0.0,
            cut_after: None,
            seed: 0,
        }
    }
}

impl Faults {
    /// Checks `drop` (the CLI's flags come through here).
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.drop) || self.drop.is_nan() {
            return Err(format!("--drop {}: a probability, in [0, 1]", self.drop));
        }
        Ok(())
    }
}

/// What a proxy did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    pub connections: u64,
    pub bytes: u64,
    pub dropped_chunks: u64,
    pub cuts: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    bytes: AtomicU64,
    dropped_chunks: AtomicU64,
    cuts: AtomicU64,
}

/// The faults now, and how many times they were changed (a change
/// restarts every connection's `cut_after` count).
struct State {
    faults: Faults,
    epoch: u64,
}

/// A running proxy; dropping it stops it (connections already open run on
/// until either side closes).
pub struct Proxy {
    addr: SocketAddr,
    to: SocketAddr,
    state: Arc<Mutex<State>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a loopback port chosen by the kernel (tests).
    pub fn start(to: SocketAddr) -> std::io::Result<Proxy> {
        Proxy::start_on(
            "127.0.0.1:0".parse().expect("an address"),
            to,
            Faults::default(),
        )
    }

    pub fn start_on(listen: SocketAddr, to: SocketAddr, faults: Faults) -> std::io::Result<Proxy> {
        faults
            .validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let l = TcpListener::bind(listen)?;
        let addr = l.local_addr()?;
        let state = Arc::new(Mutex::new(State { faults, epoch: 0 }));
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, c, sp) = (state.clone(), counters.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("dsm-proxy".into())
            .spawn(move || accept(l, to, st, c, sp))?;
        Ok(Proxy {
            addr,
            to,
            state,
            counters,
            stop,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// New faults from now on (every connection's cut count restarts).
    pub fn set(&self, faults: Faults) {
        let mut st = self.state.lock().expect("proxy");
        st.faults = faults;
        st.epoch += 1;
    }

    pub fn faults(&self) -> Faults {
        self.state.lock().expect("proxy").faults
    }

    pub fn stats(&self) -> ProxyStats {
        let c = &self.counters;
        ProxyStats {
            connections: c.connections.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            dropped_chunks: c.dropped_chunks.load(Ordering::Relaxed),
            cuts: c.cuts.load(Ordering::Relaxed),
        }
    }

    /// The start line: addresses, faults and the seed.
    pub fn describe(&self) -> String {
        let f = self.faults();
        format!(
            "proxy {} -> {}: delay {} ms, drop {}, cut after {}, seed {}",
            self.addr,
            self.to,
            f.delay.as_millis(),
            f.drop,
            f.cut_after
                .map_or("never".to_string(), |b| format!("{b} bytes")),
            f.seed
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept(
    l: TcpListener,
    to: SocketAddr,
    state: Arc<Mutex<State>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let mut index = 0u64;
    for conn in l.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(inbound) = conn else {
            // EMFILE and the like: a tool must not spin either.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let Ok(outbound) = TcpStream::connect(to) else {
            continue;
        };
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let _ = inbound.set_nodelay(true);
        let _ = outbound.set_nodelay(true);
        let (Ok(i2), Ok(o2)) = (inbound.try_clone(), outbound.try_clone()) else {
            continue;
        };
        for (dir, (src, dst)) in [(i2, o2), (outbound, inbound)].into_iter().enumerate() {
            let seed = state.lock().expect("proxy").faults.seed;
            // One loss stream per connection and direction.
            let rng = ChaCha8Rng::seed_from_u64(
                seed ^ (index << 1 | dir as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            let (st, c) = (state.clone(), counters.clone());
            let _ = std::thread::Builder::new()
                .name("dsm-proxy-pump".into())
                .spawn(move || pump(src, dst, st, c, rng));
        }
        index += 1;
    }
}

fn pump(
    mut src: TcpStream,
    mut dst: TcpStream,
    state: Arc<Mutex<State>>,
    counters: Arc<Counters>,
    mut rng: ChaCha8Rng,
) {
    let mut buf = vec![0u8; 256 * 1024];
    let (mut epoch, mut sent) = (u64::MAX, 0u64);
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let f = {
            let st = state.lock().expect("proxy");
            if st.epoch != epoch {
                (epoch, sent) = (st.epoch, 0);
            }
            st.faults
        };
        if !f.delay.is_zero() {
            std::thread::sleep(f.delay);
        }
        // A uniform draw in [0, 1) from 53 random bits.
        if f.drop > 0.0 && ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < f.drop {
            counters.dropped_chunks.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let mut take = n;
        let mut cut = false;
        if let Some(limit) = f.cut_after {
            let left = limit.saturating_sub(sent);
            if (n as u64) >= left {
                take = left as usize;
                cut = true;
            }
        }
        if take > 0 && dst.write_all(&buf[..take]).is_err() {
            break;
        }
        sent += take as u64;
        counters.bytes.fetch_add(take as u64, Ordering::Relaxed);
        if cut {
            counters.cuts.fetch_add(1, Ordering::Relaxed);
            break;
        }
    }
    let _ = src.shutdown(Shutdown::Both);
    let _ = dst.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind a proxy: bytes pass, a cut lands exactly at
    /// the byte count, and the same seed drops the same chunks.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming().take(8) {
                let Ok(mut c) = c else { return };
                std::thread::spawn(move || {
                    let mut b = [0u8; 4096];
                    while let Ok(n) = c.read(&mut b) {
                        if n == 0 || c.write_all(&b[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn forwards_and_cuts_after_the_byte_count() {
        let p = Proxy::start(echo()).unwrap();
        let mut s = TcpStream::connect(p.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");
        // A sink behind a second proxy: it receives exactly the bytes
        // before the cut.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let sink = l.local_addr().unwrap();
        let got = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut v = Vec::new();
            let _ = c.read_to_end(&mut v);
            v
        });
        let q = Proxy::start(sink).unwrap();
        let mut s = TcpStream::connect(q.addr()).unwrap();
        q.set(Faults {
            cut_after: Some(3),
            ..Faults::default()
        });
        s.write_all(b"abcdef").unwrap();
        assert_eq!(
            got.join().unwrap(),
            b"abc",
            "three bytes pass, then the cut"
        );
        let mut rest = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(
            s.read_to_end(&mut rest).unwrap_or(0),
            0,
            "the client side is cut too"
        );
        assert_eq!(q.stats().cuts, 1);
        assert_eq!(p.stats().cuts, 0);
    }

    #[test]
    fn drop_is_reproducible_from_the_seed_and_validated() {
        let run = |seed| {
            let p = Proxy::start_on(
                "127.0.0.1:0".parse().unwrap(),
                echo(),
                Faults {
                    drop: 0.5,
                    seed,
                    ..Faults::default()
                },
            )
            .unwrap();
            let mut s = TcpStream::connect(p.addr()).unwrap();
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(150)))
                .unwrap();
            let mut seen = Vec::new();
            for i in 0..16u8 {
                s.write_all(&[i]).unwrap();
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).is_ok() {
                    seen.push(b[0]);
                }
            }
            seen
        };
        let (a, b) = (run(7), run(7));
        assert_eq!(a, b, "same seed, same losses");
        assert!(a.len() < 16, "some chunks were dropped: {a:?}");
        assert!(
            Faults {
                drop: 1.5,
                ..Faults::default()
            }
            .validate()
            .is_err()
        );
    }
}
