//! Fault injection: through `mmulab dsm proxy`'s proxy (netem may be
//! missing) every connection between two sites can be delayed or cut; a
//! site in its own process can be killed (-9), stopped (SIGSTOP) past the
//! peer timeout, or restarted under its name. Programs are C
//! (`examples/c/`) under the shim, so that a failed fault is a SIGBUS in
//! their process, not in the test's.
//!
//! The oracle is the data: every value written is a version, and each
//! page's history (process, read or write, value, real-time interval) must
//! be sequentially consistent ([`history`]); otherwise the test fails,
//! naming the page and the values. Every error must arrive in bounded
//! time.

use mmulab_mirage::core::SiteId;
use mmulab_mirage::runtime::history::{self, Op};
use mmulab_mirage::runtime::local::{LocalServer, proto};
use mmulab_mirage::runtime::node::NodeOptions;
use mmulab_mirage::runtime::proxy::{Faults, Proxy};
use mmulab_mirage::runtime::shm::Dsm;
use mmulab_mirage::runtime::{ClusterConfig, Node};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn delay(ms: u64) -> Faults {
    Faults {
        delay: Duration::from_millis(ms),
        ..Faults::default()
    }
}

/// Cut each connection once `bytes` more went one way: in front of b,
/// a little past the pings, in the middle of the next page frame.
fn cut(bytes: u64) -> Faults {
    Faults {
        cut_after: Some(bytes),
        ..Faults::default()
    }
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
            Proxy::start(la.local_addr().unwrap()).unwrap(),
            Proxy::start(lb.local_addr().unwrap()).unwrap(),
        ];
        let mut config = ClusterConfig::loopback(
            std::process::id() as u64 ^ 0xfa17,
            &[proxies[0].addr(), proxies[1].addr()],
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
            p.set(Faults::default());
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
        p.set(delay(20));
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
        p.set(delay(3000));
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
        p.set(Faults::default());
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
    n.proxies[1].set(cut(2000));
    let t = Instant::now();
    let o = n.finish(b1, Duration::from_secs(20));
    assert_eq!(n.proxies[1].stats().cuts, 1, "the page frame was cut");
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

// ---------------------------------------------------------------------
// Histories: every fault case below records each program's timed reads
// and writes of page 0 and checks them for sequential consistency.

/// A program's timed workload: `rounds` times, write the next version
/// (`base + i`) of page 0, then read it back, `gap_ms` apart. The
/// creator then stays attached for a while (the last detach destroys the
/// segment, §2.2).
fn timed_script(key: &str, create: bool, base: u64, rounds: u64, gap_ms: u64) -> Vec<String> {
    let mut v = vec![key.to_string()];
    if create {
        v.extend(["c".into(), "1".into()]);
    } else {
        v.push("g".into());
    }
    v.extend(["p".into(), "attached".into()]);
    for i in 0..rounds {
        v.extend(["T".into(), "0".into(), (base + i).to_string()]);
        v.extend(["s".into(), gap_ms.to_string()]);
        v.extend(["R".into(), "0".into()]);
        v.extend(["s".into(), gap_ms.to_string()]);
    }
    v.extend(["p".into(), "done".into()]);
    if create {
        v.extend(["s".into(), "4000".into()]);
    }
    v
}

/// Reads only: `rounds` timed reads of page 0.
fn read_script(key: &str, rounds: u64, gap_ms: u64) -> Vec<String> {
    let mut v = vec![key.to_string(), "g".into(), "p".into(), "attached".into()];
    for _ in 0..rounds {
        v.extend(["R".into(), "0".into(), "s".into(), gap_ms.to_string()]);
    }
    v
}

/// One program's part of a history: its output, and the versions its
/// script writes (to name the write in flight when it died).
struct Run {
    name: String,
    out: Output,
    writes: Vec<u64>,
}

fn writes_of(script: &[String]) -> Vec<u64> {
    script
        .windows(3)
        .filter(|w| w[0] == "T")
        .filter_map(|w| w[2].parse().ok())
        .collect()
}

/// Checks page 0's history over every run; panics naming the page and
/// the values. Returns the number of operations checked.
fn check_history(what: &str, runs: &[Run]) -> usize {
    let mut pages: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
    for r in runs {
        let stdout = String::from_utf8_lossy(&r.out.stdout);
        assert!(
            !stdout.contains("torn page"),
            "{what}: {} read a torn page: {stdout}",
            r.name
        );
        let done: Vec<u64> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("T 0 "))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        // A program that ended early (SIGBUS) may have stored the write
        // it was at: that write is pending.
        let pending = (!stdout.contains("done"))
            .then(|| r.writes.iter().find(|v| !done.contains(v)).copied())
            .flatten()
            .map(|v| (0u32, v, 0u64));
        for (page, ops) in history::parse_dsmtool(&r.name, &stdout, pending) {
            pages.entry(page).or_default().extend(ops);
        }
    }
    let mut n = 0;
    for (page, ops) in &pages {
        n += ops.len();
        if let Err(e) = history::check_sequential(&format!("{page}"), ops, 0) {
            panic!("{what}: {e}");
        }
    }
    eprintln!("{what}: {n} operations, sequentially consistent");
    n
}

impl Net {
    fn spawn_script(&mut self, site: &str, script: &[String]) -> usize {
        let args: Vec<&str> = script.iter().map(String::as_str).collect();
        self.tool(site, &args)
    }

    /// Waits for the program to end, keeping its output.
    fn run_of(&mut self, i: usize, name: &str, script: &[String], within: Duration) -> Run {
        Run {
            name: name.into(),
            out: self.finish_any(i, within),
            writes: writes_of(script),
        }
    }

    /// Like `finish`, but the stdout read so far by `expect_line` is
    /// gone: callers use `expect_attached` instead.
    fn finish_any(&mut self, i: usize, within: Duration) -> Output {
        let mut child =
            std::mem::replace(&mut self.children[i], Command::new("true").spawn().unwrap());
        let deadline = Instant::now() + within;
        let mut out = child.stdout.take().map(|o| {
            std::thread::spawn(move || {
                let mut s = Vec::new();
                let _ = std::io::Read::read_to_end(&mut std::io::BufReader::new(o), &mut s);
                s
            })
        });
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let o = child.wait_with_output().unwrap();
                panic!("did not finish in {within:?}: {}", text(&o));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut o = child.wait_with_output().unwrap();
        if let Some(t) = out.take() {
            o.stdout = t.join().unwrap();
        }
        o
    }
}

/// Every message delayed 20 ms, far past Δ (5 ticks of 1 ms), while two
/// programs write and read one page: the history is sequentially
/// consistent and both finish.
#[test]
fn a_delay_past_delta_keeps_each_pages_history_consistent() {
    let Some(mut n) = Net::start("delta-h", NodeOptions::default(), 5) else {
        return;
    };
    for p in &n.proxies {
        p.set(delay(20));
    }
    let sa = timed_script("0x7001", true, 1, 12, 5);
    let sb = timed_script("0x7001", false, 1001, 12, 5);
    let pa = n.spawn_script("a", &sa);
    std::thread::sleep(Duration::from_millis(300));
    let pb = n.spawn_script("b", &sb);
    let ra = n.run_of(pa, "a", &sa, Duration::from_secs(60));
    let rb = n.run_of(pb, "b", &sb, Duration::from_secs(60));
    assert!(ra.out.status.success(), "{}", text(&ra.out));
    assert!(rb.out.status.success(), "{}", text(&rb.out));
    assert!(check_history("delay past Δ", &[ra, rb]) >= 48);
}

/// A cut in the middle of a page frame while two programs write and read
/// one page: whatever fails, fails by SIGBUS in bounded time, and the
/// history is sequentially consistent.
#[test]
fn a_cut_mid_page_keeps_each_pages_history_consistent() {
    let options = NodeOptions {
        request_timeout: Duration::from_secs(1),
        ..NodeOptions::default()
    };
    let Some(mut n) = Net::start("cut-h", options, 0) else {
        return;
    };
    let sa = timed_script("0x7002", true, 1, 30, 10);
    let sb = timed_script("0x7002", false, 1001, 30, 10);
    let pa = n.spawn_script("a", &sa);
    std::thread::sleep(Duration::from_millis(300));
    let pb = n.spawn_script("b", &sb);
    std::thread::sleep(Duration::from_millis(200));
    n.proxies[1].set(cut(2000));
    let ra = n.run_of(pa, "a", &sa, Duration::from_secs(60));
    let rb = n.run_of(pb, "b", &sb, Duration::from_secs(60));
    assert!(n.proxies[1].stats().cuts >= 1, "no cut happened");
    check_history("cut mid-page", &[ra, rb]);
}

/// Site b in its own process (this binary re-run), with its local socket:
/// killed, stopped or restarted under its name by the tests below.
struct Split {
    dir: PathBuf,
    config: PathBuf,
    a: Arc<Dsm>,
    _server: LocalServer,
    b: Option<Child>,
    tool: PathBuf,
    shim: PathBuf,
    programs: Vec<Child>,
}

fn split_options() -> NodeOptions {
    NodeOptions {
        peer_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        heartbeat: Duration::from_millis(100),
        ..NodeOptions::default()
    }
}

/// The child half of `Split`: site b, until its stdin closes.
#[test]
fn fault_site_b() {
    let Some(path) = std::env::var_os("MIRAGE_FAULT_SITE_CONFIG") else {
        return;
    };
    let config = ClusterConfig::load(Path::new(&path)).unwrap();
    let sock = config.socket_path(SiteId(1));
    let node = Node::start(config, "b", split_options()).unwrap();
    let b = Arc::new(Dsm::new(node));
    let server = LocalServer::start(b.clone(), &sock).unwrap();
    println!("ready");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(server);
    b.shutdown();
}

impl Split {
    fn start(name: &str) -> Option<Split> {
        let dir = std::env::temp_dir().join(format!("mirage-split-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tool = cc(&dir, "dsmtool")?;
        mmulab_mirage::runtime::key::ClusterKey::generate(&dir.join("cluster.key")).unwrap();
        let la = TcpListener::bind("127.0.0.1:0").unwrap();
        let port_b = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("cluster.toml");
        std::fs::write(
            &config,
            format!(
                "cluster_id = {}\nkey_file = \"cluster.key\"\n\
                 [[site]]\nname = \"a\"\naddr = \"{}\"\nsocket = \"{}\"\n\
                 [[site]]\nname = \"b\"\naddr = \"127.0.0.1:{port_b}\"\nsocket = \"{}\"\n",
                std::process::id() ^ 0x5917,
                la.local_addr().unwrap(),
                dir.join("a.sock").display(),
                dir.join("b.sock").display()
            ),
        )
        .unwrap();
        let cluster = ClusterConfig::load(&config).unwrap();
        let a = Node::start_with_listener(cluster, SiteId(0), la, split_options()).unwrap();
        let a = Arc::new(Dsm::new(a));
        let server = LocalServer::start(a.clone(), &dir.join("a.sock")).unwrap();
        let mut s = Split {
            dir,
            config,
            a,
            _server: server,
            b: None,
            tool,
            shim: mmulab_mirage::runtime::cli::find_shim().unwrap(),
            programs: Vec::new(),
        };
        s.start_b();
        Some(s)
    }

    fn start_b(&mut self) {
        use std::io::BufRead;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["fault_site_b", "--exact", "--nocapture", "--test-threads=1"])
            .env("MIRAGE_FAULT_SITE_CONFIG", &self.config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        // The harness's "test NAME ... " precedes the line, unterminated.
        while !line.trim().ends_with("ready") {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = child.kill();
                panic!("site b never said ready");
            }
        }
        self.b = Some(child);
    }

    fn signal_b(&self, sig: i32) {
        let pid = self.b.as_ref().expect("b runs").id() as i32;
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { nix::libc::kill(pid, sig) }, 0);
    }

    fn kill_b(&mut self) {
        if let Some(mut b) = self.b.take() {
            let _ = b.kill();
            let _ = b.wait();
        }
    }

    fn spawn(&mut self, site: &str, script: &[String]) -> usize {
        let child = Command::new(&self.tool)
            .args(script)
            .env("LD_PRELOAD", &self.shim)
            .env(proto::SOCKET_ENV, self.dir.join(format!("{site}.sock")))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.programs.push(child);
        self.programs.len() - 1
    }

    fn run_of(&mut self, i: usize, name: &str, script: &[String], within: Duration) -> Run {
        let mut child =
            std::mem::replace(&mut self.programs[i], Command::new("true").spawn().unwrap());
        let deadline = Instant::now() + within;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let o = child.wait_with_output().unwrap();
                panic!("{name} did not finish in {within:?}: {}", text(&o));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Run {
            name: name.into(),
            out: child.wait_with_output().unwrap(),
            writes: writes_of(script),
        }
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        for c in &mut self.programs {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.b.is_some() {
            self.signal_b(nix::libc::SIGCONT);
        }
        self.kill_b();
        self.a.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// kill -9 of site b's daemon while programs on both sites write and read
/// one page: each ends (done or SIGBUS) in bounded time, and the page's
/// history is sequentially consistent.
#[test]
fn kill_9_of_a_site_keeps_each_pages_history_consistent() {
    let Some(mut s) = Split::start("kill") else {
        return;
    };
    let sa = timed_script("0x7003", true, 1, 40, 10);
    let sb = timed_script("0x7003", false, 1001, 40, 10);
    let pa = s.spawn("a", &sa);
    std::thread::sleep(Duration::from_millis(300));
    let pb = s.spawn("b", &sb);
    std::thread::sleep(Duration::from_millis(400));
    s.kill_b();
    let ra = s.run_of(pa, "a", &sa, Duration::from_secs(30));
    let rb = s.run_of(pb, "b", &sb, Duration::from_secs(30));
    // Each program ends: done (it held the page it needed), or SIGBUS
    // (its daemon is gone, or the page's only current copy died with b).
    for r in [&ra, &rb] {
        assert!(
            r.out.status.success() || r.out.status.signal() == Some(nix::libc::SIGBUS),
            "{}: {}",
            r.name,
            text(&r.out)
        );
    }
    assert!(
        [&ra, &rb]
            .iter()
            .any(|r| r.out.status.signal() == Some(nix::libc::SIGBUS)),
        "nobody noticed that b died: {} / {}",
        text(&ra.out),
        text(&rb.out)
    );
    check_history("kill -9 of site b", &[ra, rb]);
}

/// SIGSTOP of site b's daemon past the peer timeout (1 s), then SIGCONT:
/// a declares b dead meanwhile; the page's history stays sequentially
/// consistent (b's program may keep reading its read copy, never a value
/// going back).
#[test]
fn sigstop_past_the_timeout_keeps_each_pages_history_consistent() {
    let Some(mut s) = Split::start("stop") else {
        return;
    };
    let sa = timed_script("0x7004", true, 1, 40, 10);
    let sb = timed_script("0x7004", false, 1001, 40, 10);
    let pa = s.spawn("a", &sa);
    std::thread::sleep(Duration::from_millis(300));
    let pb = s.spawn("b", &sb);
    std::thread::sleep(Duration::from_millis(400));
    s.signal_b(nix::libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    s.signal_b(nix::libc::SIGCONT);
    let ra = s.run_of(pa, "a", &sa, Duration::from_secs(30));
    let rb = s.run_of(pb, "b", &sb, Duration::from_secs(30));
    assert!(
        s.a.node()
            .dropped_peers()
            .iter()
            .any(|l| l.contains("site b: vanished")),
        "a never declared the stopped b dead: {:?}",
        s.a.node().dropped_peers()
    );
    check_history("SIGSTOP of site b past the timeout", &[ra, rb]);
}

/// Site b killed mid-run and restarted under its name. Its former
/// life's segment stays fenced off from it (a program on the new b cannot
/// attach it, and so reads nothing from it); a new segment is shared by
/// programs on a and the new b. Both pages' histories are sequentially
/// consistent.
#[test]
fn a_restart_under_the_same_name_keeps_each_pages_history_consistent() {
    let Some(mut s) = Split::start("restart") else {
        return;
    };
    let sa = timed_script("0x7005", true, 1, 60, 10);
    let sb = timed_script("0x7005", false, 1001, 40, 10);
    let pa = s.spawn("a", &sa);
    std::thread::sleep(Duration::from_millis(300));
    let pb = s.spawn("b", &sb);
    std::thread::sleep(Duration::from_millis(400));
    s.kill_b();
    let rb = s.run_of(pb, "b", &sb, Duration::from_secs(30));
    s.start_b();
    let sr = read_script("0x7005", 5, 10);
    let pr = s.spawn("b", &sr);
    let rr = s.run_of(pr, "b-restarted", &sr, Duration::from_secs(30));
    let old_reads = String::from_utf8_lossy(&rr.out.stdout)
        .lines()
        .filter(|l| l.starts_with("R 0 "))
        .count();
    assert_eq!(
        old_reads,
        0,
        "the restarted b read its former life's segment: {}",
        text(&rr.out)
    );
    let ra = s.run_of(pa, "a", &sa, Duration::from_secs(30));
    check_history(
        "restart of site b under its name (old segment)",
        &[ra, rb, rr],
    );
    // A new segment between a and the new b.
    let na = timed_script("0x7006", true, 1, 20, 10);
    let nb = timed_script("0x7006", false, 1001, 20, 10);
    let pa = s.spawn("a", &na);
    std::thread::sleep(Duration::from_millis(300));
    let pb = s.spawn("b", &nb);
    let rb = s.run_of(pb, "b-restarted", &nb, Duration::from_secs(30));
    let ra = s.run_of(pa, "a", &na, Duration::from_secs(30));
    assert!(ra.out.status.success(), "{}", text(&ra.out));
    assert!(rb.out.status.success(), "{}", text(&rb.out));
    assert!(check_history("restart of site b under its name (new segment)", &[ra, rb]) >= 80);
}
