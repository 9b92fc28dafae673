//! Fault injection through a test-owned TCP proxy (netem may be missing):
//! every connection between the two sites passes through a proxy that
//! can delay or cut it. Programs are C (`examples/c/`) under the shim, so
//! that a failed fault is a SIGBUS in their process, not in the test's.
//!
//! The oracle is the data: every value written is a version, and a read
//! may return the latest version or fail, never an older one (zeros
//! included). Every error must arrive in bounded time.

use mmulab_mirage::core::SiteId;
use mmulab_mirage::runtime::local::{LocalServer, proto};
use mmulab_mirage::runtime::node::NodeOptions;
use mmulab_mirage::runtime::shm::Dsm;
use mmulab_mirage::runtime::{ClusterConfig, Node};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Pass,
    /// Each chunk waits this long before it is forwarded.
    Delay(Duration),
    /// The next chunk of at least this many bytes (a page frame) is
    /// forwarded by half, then the connection is cut (once).
    CutLarge(usize),
}

/// A TCP proxy in front of one site's listener.
struct Proxy {
    addr: std::net::SocketAddr,
    mode: Arc<Mutex<Mode>>,
    cuts: Arc<Mutex<usize>>,
}

impl Proxy {
    fn start(target: std::net::SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let cuts = Arc::new(Mutex::new(0));
        let (m, c) = (mode.clone(), cuts.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(inbound) = conn else { break };
                let Ok(outbound) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                for (src, dst) in [
                    (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                    (outbound, inbound),
                ] {
                    let (m, c) = (m.clone(), c.clone());
                    std::thread::spawn(move || pump(src, dst, m, c));
                }
            }
        });
        Proxy { addr, mode, cuts }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
}

fn pump(mut src: TcpStream, mut dst: TcpStream, mode: Arc<Mutex<Mode>>, cuts: Arc<Mutex<usize>>) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let m = *mode.lock().unwrap();
        match m {
            Mode::Pass => {}
            Mode::Delay(d) => std::thread::sleep(d),
            Mode::CutLarge(min) if n >= min => {
                *mode.lock().unwrap() = Mode::Pass;
                *cuts.lock().unwrap() += 1;
                let _ = dst.write_all(&buf[..n / 2]);
                break;
            }
            Mode::CutLarge(_) => {}
        }
        if dst.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = src.shutdown(Shutdown::Both);
    let _ = dst.shutdown(Shutdown::Both);
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Net {
    dir: PathBuf,
    a: Arc<Dsm>,
    b: Arc<Dsm>,
    servers: Vec<LocalServer>,
    /// In front of a, in front of b.
    proxies: [Proxy; 2],
    tool: PathBuf,
    pingpong: PathBuf,
    shim: PathBuf,
    children: Vec<Child>,
}

fn cc(dir: &Path, name: &str) -> Option<PathBuf> {
    let out = dir.join(name);
    match Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&out)
        .arg(repo().join(format!("examples/c/{name}.c")))
        .output()
    {
        Err(e) => {
            eprintln!("skipped: no C compiler (cc: {e})");
            None
        }
        Ok(o) => {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            Some(out)
        }
    }
}

impl Net {
    fn start(name: &str, options: NodeOptions, delta_ticks: u32) -> Option<Net> {
        let dir = std::env::temp_dir().join(format!("mirage-faults-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tool = cc(&dir, "dsmtool")?;
        let pingpong = cc(&dir, "pingpong")?;
        let la = TcpListener::bind("127.0.0.1:0").unwrap();
        let lb = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxies = [
            Proxy::start(la.local_addr().unwrap()),
            Proxy::start(lb.local_addr().unwrap()),
        ];
        let mut config = ClusterConfig::loopback(
            std::process::id() as u64 ^ 0xfa17,
            &[proxies[0].addr, proxies[1].addr],
        );
        config.keys.push(mmulab_mirage::runtime::config::KeyConfig {
            key: 0x4d495247,
            delta_ticks,
        });
        let a = Node::start_with_listener(config.clone(), SiteId(0), la, options.clone()).unwrap();
        let b = Node::start_with_listener(config, SiteId(1), lb, options).unwrap();
        let (a, b) = (Arc::new(Dsm::new(a)), Arc::new(Dsm::new(b)));
        let servers = vec![
            LocalServer::start(a.clone(), &dir.join("a.sock")).unwrap(),
            LocalServer::start(b.clone(), &dir.join("b.sock")).unwrap(),
        ];
        let shim = mmulab_mirage::runtime::cli::find_shim().unwrap();
        Some(Net {
            dir,
            a,
            b,
            servers,
            proxies,
            tool,
            pingpong,
            shim,
            children: Vec::new(),
        })
    }

    fn spawn(&mut self, site: &str, prog: &Path, args: &[&str]) -> usize {
        let child = Command::new(prog)
            .args(args)
            .env("LD_PRELOAD", &self.shim)
            .env(proto::SOCKET_ENV, self.dir.join(format!("{site}.sock")))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.children.push(child);
        self.children.len() - 1
    }

    fn tool(&mut self, site: &str, args: &[&str]) -> usize {
        let t = self.tool.clone();
        self.spawn(site, &t, args)
    }

    /// Waits (bounded) for a line on a child's stdout; keeps draining.
    fn expect_line(&mut self, i: usize, line: &str) {
        use std::io::BufRead;
        let out = self.children[i].stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                let _ = tx.send(l);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l == line => return,
                Ok(_) => {}
                Err(_) => panic!("no `{line}` in time"),
            }
        }
    }

    fn finish(&mut self, i: usize, within: Duration) -> Output {
        let mut child =
            std::mem::replace(&mut self.children[i], Command::new("true").spawn().unwrap());
        let deadline = Instant::now() + within;
        loop {
            if child.try_wait().unwrap().is_some() {
                return child.wait_with_output().unwrap();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let o = child.wait_with_output().unwrap();
                panic!("did not finish in {within:?}: {}", text(&o));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.servers.clear();
        for p in &self.proxies {
            p.set(Mode::Pass);
        }
        self.a.shutdown();
        self.b.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {}; stdout: {}; stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every message delayed 20 ms, far past Δ (5 ticks of 1 ms): the
/// ping-pong still sees every pair whole on both sites.
#[test]
fn a_delay_past_delta_keeps_coherence() {
    let Some(mut n) = Net::start("delta", NodeOptions::default(), 5) else {
        return;
    };
    for p in &n.proxies {
        p.set(Mode::Delay(Duration::from_millis(20)));
    }
    let pp = n.pingpong.clone();
    let p1 = n.spawn("a", &pp, &["1", "20"]);
    let p2 = n.spawn("b", &pp, &["2", "20"]);
    let o1 = n.finish(p1, Duration::from_secs(60));
    let o2 = n.finish(p2, Duration::from_secs(60));
    assert!(o1.status.success(), "{}", text(&o1));
    assert!(o2.status.success(), "{}", text(&o2));
    assert!(
        String::from_utf8_lossy(&o2.stdout).contains("20 cycles, 0 bad pairs")
            || String::from_utf8_lossy(&o2.stdout).contains("0 bad pairs")
    );
}

/// A peer slower than the request timeout is not declared dead (its
/// heartbeats arrive, late), but the fault fails in bounded time with
/// SIGBUS and the reason; no read ever returns an older version.
#[test]
fn a_delay_past_the_request_timeout_fails_the_fault_in_bounded_time() {
    let options = NodeOptions {
        request_timeout: Duration::from_secs(1),
        peer_timeout: Duration::from_secs(30),
        ..NodeOptions::default()
    };
    let Some(mut n) = Net::start("slow", options, 0) else {
        return;
    };
    let a1 = n.tool(
        "a",
        &[
            "0x6161", "c", "1", "w", "0", "1", "p", "ready", "s", "600000",
        ],
    );
    n.expect_line(a1, "ready");
    let b1 = n.tool(
        "b",
        &[
            "0x6161", "g", "p", "attached", "s", "300", "r", "0", "p", "served",
        ],
    );
    n.expect_line(b1, "attached");
    for p in &n.proxies {
        p.set(Mode::Delay(Duration::from_secs(3)));
    }
    let t = Instant::now();
    let o = n.finish(b1, Duration::from_secs(20));
    assert_eq!(o.status.signal(), Some(nix::libc::SIGBUS), "{}", text(&o));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("segment 0.0 page 0: no answer within 1.0 s"),
        "{err}"
    );
    assert!(n.b.status_text().contains("no answer within"));
    assert!(
        !n.b.status_text().contains("DEAD"),
        "a slow peer is not a dead one"
    );
    for p in &n.proxies {
        p.set(Mode::Pass);
    }
    // Later reads return the version written, or fail; never an older one.
    let b2 = n.tool("b", &["0x6161", "g", "r", "0"]);
    let o = n.finish(b2, Duration::from_secs(30));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("r 0 0"), "stale read: {}", text(&o));
    assert!(
        out.contains("r 0 1") || o.status.signal() == Some(nix::libc::SIGBUS),
        "{}",
        text(&o)
    );
}

/// A connection cut in the middle of a page frame: the receiver logs the
/// sender by name and the reason, never writes the half page, and the
/// fault fails in bounded time instead of reading zeros.
#[test]
fn a_connection_cut_mid_page_never_installs_half_a_page() {
    let options = NodeOptions {
        request_timeout: Duration::from_secs(1),
        ..NodeOptions::default()
    };
    let Some(mut n) = Net::start("cut", options, 0) else {
        return;
    };
    let a1 = n.tool(
        "a",
        &[
            "0x6262", "c", "1", "w", "0", "9", "p", "ready", "s", "600000",
        ],
    );
    n.expect_line(a1, "ready");
    let b1 = n.tool(
        "b",
        &[
            "0x6262", "g", "p", "attached", "s", "300", "r", "0", "p", "served",
        ],
    );
    n.expect_line(b1, "attached");
    // a → b traffic goes through the proxy in front of b.
    n.proxies[1].set(Mode::CutLarge(1024));
    let t = Instant::now();
    let o = n.finish(b1, Duration::from_secs(20));
    assert_eq!(
        *n.proxies[1].cuts.lock().unwrap(),
        1,
        "the page frame was cut"
    );
    assert_eq!(o.status.signal(), Some(nix::libc::SIGBUS), "{}", text(&o));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(!String::from_utf8_lossy(&o.stdout).contains("r 0"));
    let dropped = n.b.node().dropped_peers();
    assert!(
        dropped
            .iter()
            .any(|l| l.contains("site a") && l.contains("truncated")),
        "{dropped:?}"
    );
    // The writer's own copy is untouched.
    let a2 = n.tool("a", &["0x6262", "g", "r", "0"]);
    let o = n.finish(a2, Duration::from_secs(20));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("r 0 9"),
        "{}",
        text(&o)
    );
}
