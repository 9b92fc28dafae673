//! The site daemon: std threads and TCP (`TCP_NODELAY`) around the sans-IO core.
//!
//! Threads (none of them ever touches an attach mapping, so none can fault
//! on DSM memory):
//! - one **reader** per inbound connection checks the handshake, reads
//!   whole, validated frames and hands each to the core on its own thread
//!   (under the core's lock: no hand-off, which halved the remote-fault
//!   time's thread wake-ups);
//! - the **fault thread** reads fault records from the signal handler's
//!   pipe and hands them to the core the same way;
//! - the **core thread** serves the API and fires timers;
//! - the **listener** accepts peers; one **drain** thread per outgoing
//!   connection writes what did not fit in the socket at once. Sends never
//!   block a thread that holds the core (the socket is non-blocking):
//!   two readers each blocked on a write to the other would deadlock.
//!
//! Every input is serialized by the core's lock, so messages to a peer
//! leave in the core's order.
//!
//! Connections are one-way: a site sends on the connection it dialled and
//! receives on the ones it accepted, so messages between a pair of sites
//! are FIFO (the core's assumption, Locus's virtual circuits, §7.1).
//!
//! Page bytes (the one place where memory and the core meet): the core
//! keeps a copy of each held page and ships that copy. Before an event
//! that names a page this site holds for writing, the runtime
//! write-protects the page in every local mapping, then copies the page
//! into the core (`Site::write`). Rights are then *reduced* as the core's
//! actions say, in order, but *granted* only from the core's final state
//! after the whole batch, and faulters are woken last. So a page is sent,
//! downgraded or reported invalidated only after every local mapping lost
//! the right, and its bytes are read after that (issue #7).

use super::config::ClusterConfig;
use super::fault::{self, FaultRecord, RECORD_BYTES};
use super::mem::SegmentMemory;
use super::shm::ShmError;
use crate::core::{
    Access, Action, CoreConfig, Event, Geometry, Held, Msg, Nanos, PageNo, ProcessId, SegmentId,
    Site, SiteId, Timer,
};
use crate::wire::{self, DirMsg, Frame, Handshake, Hello, Limits, WireError};
use nix::libc;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bounds of the runtime. Every default is written here.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// How long a site keeps dialling a peer that is not up yet.
    pub dial_for: Duration,
    /// How long an API call waits for the core's answer.
    pub api_timeout: Duration,
    /// Record every core event and action (for replay through the core).
    pub record_trace: bool,
    pub limits: Limits,
    /// A deliberately broken runtime, for negative controls only.
    pub mutation: RuntimeMutation,
}

/// Deliberately broken variants of the runtime; the default is correct.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RuntimeMutation {
    #[default]
    None,
    /// Skip the write-protect-and-copy before an event that may ship a
    /// write-held page: the core then ships its stale copy.
    ShipWithoutSync,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            dial_for: Duration::from_secs(10),
            api_timeout: Duration::from_secs(20),
            record_trace: false,
            limits: Limits::default(),
            mutation: RuntimeMutation::None,
        }
    }
}

/// One step of a recorded run: replayed through a fresh `Site`, the
/// `Event` entries yield the recorded actions.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TraceEntry {
    /// The runtime copied a write-held page from memory into the core.
    Sync {
        segment: SegmentId,
        page: PageNo,
        bytes: Vec<u8>,
    },
    Event {
        now: Nanos,
        event: Event,
        actions: Vec<Action>,
    },
}

/// Counters, for tests and the bench.
#[derive(Debug, Default)]
pub struct Counters {
    pub faults: AtomicU64,
    pub frames_sent: AtomicU64,
    pub frames_received: AtomicU64,
    /// Time stamps ([`stamp`]) of the latest remote fault's steps, for
    /// the bench's Table 3-style breakdown.
    pub stamps: Stamps,
}

/// Steps of the latest fault, request and page seen by a site.
#[derive(Debug, Default)]
pub struct Stamps {
    /// The core thread got the fault record from the handler.
    pub fault_delivered: AtomicU64,
    /// The request left for the library.
    pub request_sent: AtomicU64,
    /// A request reached this site's core thread (as library).
    pub request_received: AtomicU64,
    /// The page left (library and clock site at work in between).
    pub page_sent: AtomicU64,
    /// A page reached this site's core thread.
    pub page_received: AtomicU64,
    /// Installed, and the faulter released.
    pub woken: AtomicU64,
}

/// Nanoseconds since a process-wide epoch (comparable across the sites
/// of one process, as in the bench).
pub fn stamp() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

pub(crate) enum Api {
    Lookup {
        key: i32,
        reply: Sender<Option<SegmentId>>,
    },
    Register {
        key: i32,
        segment: SegmentId,
        reply: Sender<SegmentId>,
    },
    RemoveKey {
        key: i32,
    },
    Create {
        geometry: Geometry,
        reply: Sender<SegmentId>,
    },
    Attach {
        segment: SegmentId,
        addr: Option<usize>,
        readonly: bool,
        reply: Sender<Result<(usize, u32, Geometry), ShmError>>,
    },
    Detach {
        process: u32,
        reply: Sender<()>,
    },
    SetWindow {
        segment: SegmentId,
        ticks: u32,
        reply: Sender<bool>,
    },
    TakeTrace {
        reply: Sender<Vec<TraceEntry>>,
    },
}

pub(crate) enum Input {
    Api(Api),
    /// A timer was set off the core thread: recompute the sleep.
    Nudge,
    Stop,
}

pub(crate) struct Shared {
    pub config: ClusterConfig,
    pub me: SiteId,
    pub incarnation: u64,
    pub options: NodeOptions,
    pub tx: Mutex<Sender<Input>>,
    pub stopping: AtomicBool,
    pub handshake: Mutex<Handshake>,
    /// Peers dropped, by name and reason (also printed to stderr).
    pub dropped: Mutex<Vec<String>>,
    pub inbound: Mutex<Vec<TcpStream>>,
    pub counters: Counters,
    /// The core and everything it drives. Readers and the fault thread
    /// take it and handle their input on their own thread (no hand-off);
    /// the core thread serves the API and the timers. `None` once stopped.
    core: Mutex<Option<Box<CoreLoop>>>,
}

impl Shared {
    pub(crate) fn send(&self, input: Input) {
        let _ = self.tx.lock().expect("tx").send(input);
    }

    /// Runs `f` on the core, unless the site has stopped.
    fn with_core(&self, f: impl FnOnce(&mut CoreLoop)) {
        let mut g = self.core.lock().expect("core");
        if let Some(c) = g.as_mut() {
            f(c);
        }
    }

    fn log_drop(&self, line: String) {
        eprintln!("mmulab dsm site {}: {line}", self.config.name(self.me));
        self.dropped.lock().expect("dropped").push(line);
    }

    fn hello(&self) -> Hello {
        Hello {
            version: wire::PROTOCOL_VERSION,
            cluster_id: self.config.cluster_id,
            site: self.me,
            name: self.config.name(self.me).to_string(),
            incarnation: self.incarnation,
        }
    }
}

/// A running site daemon.
pub struct Node {
    pub(crate) shared: Arc<Shared>,
    addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    fault_pipe_w: Arc<OwnedFd>,
}

impl Node {
    /// Starts the site `name`, listening on its configured address.
    pub fn start(config: ClusterConfig, name: &str, options: NodeOptions) -> std::io::Result<Node> {
        let me = config.site_id(name).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, format!("no site `{name}`"))
        })?;
        let listener = TcpListener::bind(config.sites[me.0 as usize].addr)?;
        Node::start_with_listener(config, me, listener, options)
    }

    /// Starts a site on a listener bound by the caller (tests bind port 0
    /// first and write the ports into the configuration).
    pub fn start_with_listener(
        config: ClusterConfig,
        me: SiteId,
        listener: TcpListener,
        options: NodeOptions,
    ) -> std::io::Result<Node> {
        config
            .validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let addr = listener.local_addr()?;
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let (tx, rx) = mpsc::channel();
        let sites = config.sites.len() as u16;
        let shared = Arc::new(Shared {
            handshake: Mutex::new(Handshake::new(config.cluster_id, sites)),
            config,
            me,
            incarnation,
            options,
            tx: Mutex::new(tx),
            stopping: AtomicBool::new(false),
            dropped: Mutex::new(Vec::new()),
            inbound: Mutex::new(Vec::new()),
            counters: Counters::default(),
            core: Mutex::new(None),
        });
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 fills two fds we then own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh fds from pipe2.
        let (pipe_r, pipe_w) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let pipe_w = Arc::new(pipe_w);
        let mut threads = Vec::new();
        *shared.core.lock().expect("core") =
            Some(Box::new(CoreLoop::new(shared.clone(), pipe_w.clone())));
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("dsm-listen-{}", me.0))
                .spawn(move || listen(s, listener))?,
        );
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("dsm-fault-{}", me.0))
                .spawn(move || fault_reader(s, pipe_r))?,
        );
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("dsm-core-{}", me.0))
                .spawn(move || core_thread(s, rx))?,
        );
        Ok(Node {
            shared,
            addr,
            threads,
            fault_pipe_w: pipe_w,
        })
    }

    pub fn site(&self) -> SiteId {
        self.shared.me
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.shared.config
    }

    /// Peers dropped so far, each "site NAME: dropped: REASON".
    pub fn dropped_peers(&self) -> Vec<String> {
        self.shared.dropped.lock().expect("dropped").clone()
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    pub(crate) fn call<T>(&self, make: impl FnOnce(Sender<T>) -> Api) -> Option<T> {
        let (tx, rx) = mpsc::channel();
        self.shared.send(Input::Api(make(tx)));
        rx.recv_timeout(self.shared.options.api_timeout).ok()
    }

    /// The recorded trace so far (empty unless `record_trace`).
    pub fn take_trace(&self) -> Vec<TraceEntry> {
        self.call(|reply| Api::TakeTrace { reply })
            .unwrap_or_default()
    }

    /// Stops the daemon: closes its connections and joins its threads.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        self.shared.send(Input::Stop);
        // Unblock accept() and the fault pipe's read().
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        let sentinel = FaultRecord {
            id: u32::MAX,
            page: 0,
            access: 0,
            pad: 0,
            word: 0,
        };
        // SAFETY: writing a POD record to our own pipe.
        unsafe {
            libc::write(
                self.fault_pipe_w.as_raw_fd(),
                &sentinel as *const FaultRecord as *const libc::c_void,
                RECORD_BYTES,
            )
        };
        for s in self.shared.inbound.lock().expect("inbound").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn listen(shared: Arc<Shared>, listener: TcpListener) {
    let mut readers = Vec::new();
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = conn else { continue };
        if let Ok(clone) = stream.try_clone() {
            shared.inbound.lock().expect("inbound").push(clone);
        }
        let s = shared.clone();
        readers.push(std::thread::spawn(move || serve_peer(s, stream)));
    }
    for s in shared.inbound.lock().expect("inbound").drain(..) {
        let _ = s.shutdown(Shutdown::Both);
    }
    for r in readers {
        let _ = r.join();
    }
}

/// One inbound connection: the handshake, then whole frames to the core.
fn serve_peer(shared: Arc<Shared>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let peer_addr = stream
        .peer_addr()
        .map_or("?".to_string(), |a| a.to_string());
    let limits = shared.options.limits;
    // A peer that never says hello is dropped after a bound.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let hello = {
        let result = {
            let mut reader = &stream;
            let frame = wire::read_frame(&mut reader, &limits);
            match frame {
                Ok(Frame::Hello(h)) => shared.handshake.lock().expect("hs").accept(&h).map(|_| h),
                Ok(Frame::Core(m)) => Err(WireError::NotHello(m.kind())),
                Ok(Frame::Dir(_)) => Err(WireError::NotHello("directory")),
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(h) => h,
            Err(WireError::Closed) if shared.stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                shared.log_drop(format!("peer {peer_addr}: dropped: {}: {e}", e.reason()));
                return;
            }
        }
    };
    let _ = stream.set_read_timeout(None);
    if wire::write_frame(&mut stream, Frame::Hello(shared.hello())).is_err() {
        return;
    }
    let name = format!("site {} ({})", hello.name, peer_addr);
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, &stream);
    loop {
        match wire::read_frame(&mut reader, &limits) {
            Ok(Frame::Hello(_)) => {
                let e = WireError::HelloAgain;
                shared.log_drop(format!("{name}: dropped: {}: {e}", e.reason()));
                return;
            }
            Ok(frame) => {
                shared
                    .counters
                    .frames_received
                    .fetch_add(1, Ordering::Relaxed);
                shared.with_core(|c| c.net(hello.site, frame));
            }
            Err(WireError::Closed) => return,
            Err(_) if shared.stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                shared.log_drop(format!("{name}: dropped: {}: {e}", e.reason()));
                return;
            }
        }
    }
}

/// The core thread: the API and the timers.
fn core_thread(shared: Arc<Shared>, rx: Receiver<Input>) {
    let mut wait = Duration::from_millis(500);
    loop {
        match rx.recv_timeout(wait) {
            Ok(Input::Stop) | Err(RecvTimeoutError::Disconnected) => break,
            Ok(Input::Api(api)) => shared.with_core(|c| c.api(api)),
            Ok(Input::Nudge) | Err(RecvTimeoutError::Timeout) => {}
        }
        let mut next = Duration::from_millis(500);
        shared.with_core(|c| next = c.fire_timers());
        wait = next;
    }
    let core = shared.core.lock().expect("core").take();
    if let Some(mut c) = core {
        c.finish();
    }
}

fn fault_reader(shared: Arc<Shared>, pipe: OwnedFd) {
    let mut file = std::fs::File::from(pipe);
    let mut buf = [0u8; RECORD_BYTES];
    while file.read_exact(&mut buf).is_ok() {
        let rec = FaultRecord::from_bytes(&buf);
        if rec.id == u32::MAX {
            return;
        }
        shared.counters.faults.fetch_add(1, Ordering::Relaxed);
        shared.with_core(|c| c.fault(rec));
    }
}

struct AttachInfo {
    segment: SegmentId,
    base: usize,
    slot: usize,
    readonly: bool,
}

type PendingAttach = (
    SegmentId,
    Option<usize>,
    bool,
    Sender<Result<(usize, u32, Geometry), ShmError>>,
);

enum DirWait {
    Lookup(Sender<Option<SegmentId>>),
    Register(Sender<SegmentId>),
}

/// The core thread's state.
struct CoreLoop {
    shared: Arc<Shared>,
    site: Site,
    start: Instant,
    timers: BTreeMap<(Nanos, u64), Timer>,
    timer_seq: u64,
    out: Vec<Option<Outbound>>,
    segs: BTreeMap<SegmentId, SegmentMemory>,
    attaches: BTreeMap<u32, AttachInfo>,
    waiters: BTreeMap<(u32, u32), Vec<u64>>,
    pending_create: BTreeMap<u32, Sender<SegmentId>>,
    pending_attach: BTreeMap<u32, PendingAttach>,
    pending_detach: BTreeMap<u32, Sender<()>>,
    /// The key directory (first site only).
    dir: BTreeMap<i32, SegmentId>,
    dir_waits: BTreeMap<u64, DirWait>,
    next_req: u64,
    next_process: u32,
    fault_pipe_w: Arc<OwnedFd>,
    trace: Option<Vec<TraceEntry>>,
}

impl CoreLoop {
    fn new(shared: Arc<Shared>, fault_pipe_w: Arc<OwnedFd>) -> CoreLoop {
        let n = shared.config.sites.len();
        let peers = (0..n as u16).map(SiteId).collect();
        let core = CoreConfig {
            tick_ns: shared.config.tick_ns,
            ..CoreConfig::default()
        };
        let trace = shared.options.record_trace.then(Vec::new);
        CoreLoop {
            site: Site::new(shared.me, peers, core),
            start: Instant::now(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            out: (0..n).map(|_| None).collect(),
            segs: BTreeMap::new(),
            attaches: BTreeMap::new(),
            waiters: BTreeMap::new(),
            pending_create: BTreeMap::new(),
            pending_attach: BTreeMap::new(),
            pending_detach: BTreeMap::new(),
            dir: BTreeMap::new(),
            dir_waits: BTreeMap::new(),
            next_req: 1,
            next_process: 1,
            fault_pipe_w,
            trace,
            shared,
        }
    }

    fn now(&self) -> Nanos {
        Nanos(self.start.elapsed().as_nanos() as u64)
    }

    /// Fires due timers; returns how long until the next one.
    fn fire_timers(&mut self) -> Duration {
        loop {
            let now = self.now();
            let Some((&(at, seq), &timer)) = self.timers.first_key_value() else {
                return Duration::from_millis(500);
            };
            if at > now {
                return Duration::from_nanos(at.0 - now.0);
            }
            self.timers.remove(&(at, seq));
            self.feed(Event::TimerFired(timer));
        }
    }

    /// At stop: release anyone still asleep in the handler (they retry
    /// and, with the mapping gone, crash as on any unmapped address).
    fn finish(&mut self) {
        for (_, words) in std::mem::take(&mut self.waiters) {
            for w in words {
                // SAFETY: each word's faulter sleeps until released.
                unsafe { fault::release(w, fault::WAKE_FAIL) };
            }
        }
        for (_, a) in std::mem::take(&mut self.attaches) {
            fault::unregister(a.slot);
        }
        for q in self.out.iter().flatten() {
            q.close();
        }
    }

    fn net(&mut self, from: SiteId, frame: Frame) {
        match frame {
            Frame::Core(msg) => {
                let (is_request, is_page) = (
                    matches!(msg, Msg::Request { .. }),
                    matches!(msg, Msg::Page { .. }),
                );
                let shared = self.shared.clone();
                let st = &shared.counters.stamps;
                if is_request {
                    st.request_received.store(stamp(), Ordering::Relaxed);
                } else if is_page {
                    st.page_received.store(stamp(), Ordering::Relaxed);
                }
                self.feed(Event::Received { from, msg });
                if is_request {
                    st.page_sent.store(stamp(), Ordering::Relaxed);
                } else if is_page {
                    st.woken.store(stamp(), Ordering::Relaxed);
                }
            }
            Frame::Dir(d) => self.directory(from, d),
            Frame::Hello(_) => {}
        }
    }

    fn directory(&mut self, from: SiteId, msg: DirMsg) {
        match msg {
            DirMsg::Lookup { req, key } => {
                let segment = self.dir.get(&key).copied();
                self.send_frame(from, Frame::Dir(DirMsg::Found { req, key, segment }));
            }
            DirMsg::Register { req, key, segment } => {
                let winner = *self.dir.entry(key).or_insert(segment);
                let reply = DirMsg::Registered {
                    req,
                    key,
                    segment: winner,
                };
                self.send_frame(from, Frame::Dir(reply));
            }
            DirMsg::Remove { key } => {
                self.dir.remove(&key);
            }
            DirMsg::Found { req, segment, .. } => {
                if let Some(DirWait::Lookup(r)) = self.dir_waits.remove(&req) {
                    let _ = r.send(segment);
                }
            }
            DirMsg::Registered { req, segment, .. } => {
                if let Some(DirWait::Register(r)) = self.dir_waits.remove(&req) {
                    let _ = r.send(segment);
                }
            }
        }
    }

    fn dir_site(&self) -> SiteId {
        SiteId(0)
    }

    fn api(&mut self, api: Api) {
        let me = self.shared.me;
        match api {
            Api::Lookup { key, reply } => {
                if me == self.dir_site() {
                    let _ = reply.send(self.dir.get(&key).copied());
                } else {
                    let req = self.next_req;
                    self.next_req += 1;
                    self.dir_waits.insert(req, DirWait::Lookup(reply));
                    self.send_frame(self.dir_site(), Frame::Dir(DirMsg::Lookup { req, key }));
                }
            }
            Api::Register {
                key,
                segment,
                reply,
            } => {
                if me == self.dir_site() {
                    let _ = reply.send(*self.dir.entry(key).or_insert(segment));
                } else {
                    let req = self.next_req;
                    self.next_req += 1;
                    self.dir_waits.insert(req, DirWait::Register(reply));
                    let msg = DirMsg::Register { req, key, segment };
                    self.send_frame(self.dir_site(), Frame::Dir(msg));
                }
            }
            Api::RemoveKey { key } => {
                if me == self.dir_site() {
                    self.dir.remove(&key);
                } else {
                    self.send_frame(self.dir_site(), Frame::Dir(DirMsg::Remove { key }));
                }
            }
            Api::Create { geometry, reply } => {
                let process = self.new_process();
                self.pending_create.insert(process, reply);
                self.feed(Event::Create {
                    geometry,
                    process: ProcessId(process),
                });
            }
            Api::Attach {
                segment,
                addr,
                readonly,
                reply,
            } => {
                let process = self.new_process();
                self.pending_attach
                    .insert(process, (segment, addr, readonly, reply));
                self.feed(Event::Attach {
                    segment,
                    process: ProcessId(process),
                });
            }
            Api::Detach { process, reply } => {
                let Some(a) = self.attaches.remove(&process) else {
                    let _ = reply.send(());
                    return;
                };
                // The mapping goes first: after shmdt nothing may fault on it.
                fault::unregister(a.slot);
                if let Some(mem) = self.segs.get_mut(&a.segment) {
                    let _ = mem.detach(a.base);
                }
                self.pending_detach.insert(process, reply);
                self.feed(Event::Detach {
                    segment: a.segment,
                    process: ProcessId(process),
                });
            }
            Api::SetWindow {
                segment,
                ticks,
                reply,
            } => {
                let Some(lib_pages) = self.site.library_pages(segment) else {
                    let _ = reply.send(false);
                    return;
                };
                for p in 0..lib_pages {
                    self.feed(Event::SetWindow {
                        segment,
                        page: PageNo(p),
                        ticks,
                    });
                }
                let _ = reply.send(true);
            }
            Api::TakeTrace { reply } => {
                let t = self.trace.as_mut().map(std::mem::take).unwrap_or_default();
                let _ = reply.send(t);
            }
        }
    }

    fn new_process(&mut self) -> u32 {
        let p = self.next_process;
        self.next_process += 1;
        p
    }

    fn fault(&mut self, rec: FaultRecord) {
        let st = &self.shared.counters.stamps;
        st.fault_delivered.store(stamp(), Ordering::Relaxed);
        self.fault_inner(rec);
        let st = &self.shared.counters.stamps;
        st.request_sent.store(stamp(), Ordering::Relaxed);
    }

    fn fault_inner(&mut self, rec: FaultRecord) {
        let Some(a) = self.attaches.get(&rec.id) else {
            // The mapping was detached meanwhile: the retry finds no slot
            // and crashes as on any unmapped address.
            // SAFETY: the faulter sleeps until released.
            unsafe { fault::release(rec.word, fault::WAKE_RETRY) };
            return;
        };
        let segment = a.segment;
        let readonly = a.readonly;
        let page = PageNo(rec.page);
        let held = self
            .site
            .page_view(segment, page)
            .map_or(Held::Nothing, |v| v.held);
        let access = match rec.access {
            fault::ACCESS_READ => Access::Read,
            fault::ACCESS_WRITE => Access::Write,
            // Read-then-upgrade: a fault on a readable page is a write.
            _ if held.allows(Access::Read) => Access::Write,
            _ => Access::Read,
        };
        if access == Access::Write && readonly {
            // SAFETY: the faulter sleeps until released.
            unsafe { fault::release(rec.word, fault::WAKE_SEGV) };
            return;
        }
        self.waiters
            .entry((rec.id, rec.page))
            .or_default()
            .push(rec.word);
        self.feed(Event::Fault {
            segment,
            page,
            process: ProcessId(rec.id),
            access,
        });
    }

    /// Pages an event may ship from this site's write copy.
    fn scope(&self, event: &Event) -> Vec<(SegmentId, PageNo)> {
        let seg_pages = |segment: SegmentId| -> Vec<(SegmentId, PageNo)> {
            let n = self.segs.get(&segment).map_or(0, |m| m.pages as u32);
            (0..n).map(|p| (segment, PageNo(p))).collect()
        };
        match event {
            Event::Fault { segment, page, .. } => vec![(*segment, *page)],
            Event::TimerFired(Timer::RetryRecall { segment, page, .. })
            | Event::TimerFired(Timer::HonourRecall { segment, page, .. }) => {
                vec![(*segment, *page)]
            }
            Event::Detach { segment, .. } => seg_pages(*segment),
            Event::Received { msg, .. } => match msg_page(msg) {
                Some(sp) => vec![sp],
                None => match msg_segment(msg) {
                    Some(s) => seg_pages(s),
                    None => Vec::new(),
                },
            },
            Event::Create { .. } | Event::Attach { .. } | Event::SetWindow { .. } => Vec::new(),
        }
    }

    /// Hands one event to the core and carries out its actions.
    fn feed(&mut self, event: Event) {
        let mut synced = Vec::new();
        let scope = match self.shared.options.mutation {
            RuntimeMutation::None => self.scope(&event),
            RuntimeMutation::ShipWithoutSync => Vec::new(),
        };
        for (segment, page) in scope {
            let write_held = self
                .site
                .page_view(segment, page)
                .is_some_and(|v| v.held == Held::Write);
            let Some(mem) = self.segs.get(&segment) else {
                continue;
            };
            if !write_held {
                continue;
            }
            // Every local mapping loses the right to write, then the bytes
            // are read (issue #7).
            mem.protect(page, Held::Read);
            let bytes = mem.page(page).to_vec();
            self.site.write(segment, page, 0, &bytes);
            if let Some(t) = &mut self.trace {
                t.push(TraceEntry::Sync {
                    segment,
                    page,
                    bytes,
                });
            }
            synced.push((segment, page));
        }
        let now = self.now();
        let recorded = self.trace.is_some().then(|| event.clone());
        let actions = self.site.handle(now, event);
        if let (Some(t), Some(event)) = (&mut self.trace, recorded) {
            t.push(TraceEntry::Event {
                now,
                event,
                actions: actions.clone(),
            });
        }
        // Rights are *reduced* at once, in the core's order (so an ack or
        // a page leaves only after every local mapping lost the right),
        // but *granted* only once the whole batch is done, from the core's
        // final state, and sleepers are woken last. Granting at each
        // `Install` would let a thread write a page that a later action of
        // the same batch ships (an install that replays a deferred recall):
        // that write would be lost (caught by the concurrent test).
        let mut touched = synced;
        let mut wakes = Vec::new();
        for a in actions {
            match a {
                Action::Install {
                    segment,
                    page,
                    bytes,
                    ..
                } => {
                    let mem = self
                        .segs
                        .get_mut(&segment)
                        .expect("installed page of a mapped segment");
                    if let Some(b) = bytes {
                        mem.write_page(page, &b);
                    }
                    touched.push((segment, page));
                }
                Action::Wake { process, page, .. } => wakes.push((process.0, page.0)),
                other => self.carry_out(other),
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for (segment, page) in touched {
            let held = self
                .site
                .page_view(segment, page)
                .map_or(Held::Nothing, |v| v.held);
            if let Some(mem) = self.segs.get(&segment) {
                mem.protect(page, held);
            }
        }
        for key in wakes {
            if let Some(words) = self.waiters.remove(&key) {
                for w in words {
                    // SAFETY: each word's faulter sleeps until released.
                    unsafe { fault::release(w, fault::WAKE_RETRY) };
                }
            }
        }
    }

    fn carry_out(&mut self, action: Action) {
        match action {
            Action::Send { to, msg } => self.send_frame(to, Frame::Core(msg)),
            Action::Install { .. } | Action::Wake { .. } => {
                unreachable!("installs and wakes are carried out by feed")
            }
            Action::Invalidate { segment, page } => {
                if let Some(mem) = self.segs.get(&segment) {
                    mem.protect(page, Held::Nothing);
                }
            }
            Action::Downgrade { segment, page } => {
                if let Some(mem) = self.segs.get(&segment) {
                    mem.protect(page, Held::Read);
                }
            }
            Action::SetTimer { at, timer } => {
                self.timer_seq += 1;
                self.timers.insert((at, self.timer_seq), timer);
                self.shared.send(Input::Nudge);
            }
            Action::Log(_) => {}
            Action::Created { segment, process } => {
                if let Some(r) = self.pending_create.remove(&process.0) {
                    let _ = r.send(segment);
                }
            }
            Action::Attached {
                segment,
                process,
                geometry,
            } => self.attached(segment, process.0, geometry),
            Action::Detached { process, .. } => {
                if let Some(r) = self.pending_detach.remove(&process.0) {
                    let _ = r.send(());
                }
            }
            Action::Destroyed { segment } => {
                // An attach that raced the last detach finds no segment
                // (Mirage: the last detach destroys it, §2.2).
                let gone: Vec<u32> = self
                    .pending_attach
                    .iter()
                    .filter(|(_, p)| p.0 == segment)
                    .map(|(&k, _)| k)
                    .collect();
                for k in gone {
                    if let Some(p) = self.pending_attach.remove(&k) {
                        let _ = p.3.send(Err(ShmError::Removed));
                    }
                }
                if self
                    .segs
                    .get(&segment)
                    .is_some_and(|m| m.attach_count() == 0)
                {
                    self.segs.remove(&segment);
                }
            }
        }
    }

    fn attached(&mut self, segment: SegmentId, process: u32, geometry: Geometry) {
        let Some((_, addr, readonly, reply)) = self.pending_attach.remove(&process) else {
            return;
        };
        let result = (|| -> Result<(usize, u32, Geometry), ShmError> {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.segs.entry(segment) {
                let name = format!("mmulab-dsm-{}-{}", segment.library.0, segment.serial);
                let mem = SegmentMemory::new(
                    &name,
                    geometry.pages as usize,
                    geometry.page_bytes as usize,
                )
                .map_err(|e| ShmError::Os(format!("memfd: {e}")))?;
                slot.insert(mem);
            }
            let mem = self.segs.get_mut(&segment).expect("just made");
            let base = mem.attach(addr, readonly).map_err(|e| {
                if e.raw_os_error() == Some(libc::EEXIST) {
                    ShmError::Invalid
                } else {
                    ShmError::Os(format!("mmap: {e}"))
                }
            })?;
            let len = mem.len();
            // `attach` gave the new mapping the protections of the others,
            // which follow the core's view of every page.
            let slot = fault::register(base, len, process, self.fault_pipe_w.as_raw_fd());
            self.attaches.insert(
                process,
                AttachInfo {
                    segment,
                    base,
                    slot,
                    readonly,
                },
            );
            Ok((base, process, geometry))
        })();
        if result.is_err() {
            // Undo the core's attach so that its books stay right.
            self.pending_detach.insert(process, mpsc::channel().0);
            self.feed(Event::Detach {
                segment,
                process: ProcessId(process),
            });
        }
        let _ = reply.send(result);
    }

    fn send_frame(&mut self, to: SiteId, frame: Frame) {
        let i = to.0 as usize;
        if self.out[i].as_ref().is_none_or(|o| o.is_broken()) {
            if let Some(o) = self.out[i].take() {
                o.close();
            }
            self.out[i] = self
                .dial(to)
                .map(|s| Outbound::new(s, self.shared.clone(), to));
        }
        let Some(out) = self.out[i].as_ref() else {
            self.shared.log_drop(format!(
                "site {}: unreachable: message lost",
                self.shared.config.name(to)
            ));
            return;
        };
        out.send(wire::encode(frame));
        self.shared
            .counters
            .frames_sent
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Dials a peer (bounded retries) and exchanges hellos.
    fn dial(&mut self, to: SiteId) -> Option<TcpStream> {
        let addr = self.shared.config.sites[to.0 as usize].addr;
        let deadline = Instant::now() + self.shared.options.dial_for;
        loop {
            if self.shared.stopping.load(Ordering::SeqCst) {
                return None;
            }
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(mut s) => {
                    let _ = s.set_nodelay(true);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    if wire::write_frame(&mut s, Frame::Hello(self.shared.hello())).is_err() {
                        return None;
                    }
                    let limits = self.shared.options.limits;
                    let answer = self
                        .shared
                        .handshake
                        .lock()
                        .expect("hs")
                        .read_hello(&mut s, &limits);
                    return match answer {
                        Ok(h) if h.site == to => {
                            let _ = s.set_read_timeout(None);
                            Some(s)
                        }
                        Ok(h) => {
                            self.shared.log_drop(format!(
                                "site {}: dropped: wrong-site: answered as {}",
                                self.shared.config.name(to),
                                h.name
                            ));
                            None
                        }
                        Err(e) => {
                            self.shared.log_drop(format!(
                                "site {}: dropped: {}: {e}",
                                self.shared.config.name(to),
                                e.reason()
                            ));
                            None
                        }
                    };
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => return None,
            }
        }
    }
}

/// One outgoing connection. Sends never block the caller (readers handle
/// frames on their own thread, and a reader blocked on a write while its
/// peer's reader is blocked on one back would deadlock): the socket is
/// non-blocking, and what does not fit at once goes to a backlog that a
/// writer thread drains, in order.
struct Outbound {
    stream: TcpStream,
    queue: Arc<OutQueue>,
}

#[derive(Default)]
struct OutQueue {
    state: Mutex<OutState>,
    cv: std::sync::Condvar,
}

#[derive(Default)]
struct OutState {
    backlog: Vec<u8>,
    /// The writer thread holds bytes taken from the backlog.
    busy: bool,
    closed: bool,
    broken: bool,
}

impl Outbound {
    fn new(stream: TcpStream, shared: Arc<Shared>, to: SiteId) -> Outbound {
        let _ = stream.set_nonblocking(true);
        let queue = Arc::new(OutQueue::default());
        let (q, s) = (queue.clone(), stream.try_clone().ok());
        if let Some(s) = s {
            std::thread::spawn(move || drain(q, s, shared, to));
        }
        Outbound { stream, queue }
    }

    fn is_broken(&self) -> bool {
        self.queue.state.lock().expect("out").broken
    }

    fn send(&self, bytes: Vec<u8>) {
        let mut st = self.queue.state.lock().expect("out");
        if st.broken || st.closed {
            return;
        }
        if st.busy || !st.backlog.is_empty() {
            st.backlog.extend_from_slice(&bytes);
            self.queue.cv.notify_one();
            return;
        }
        let mut done = 0;
        while done < bytes.len() {
            match (&self.stream).write(&bytes[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    st.broken = true;
                    return;
                }
            }
        }
        if done < bytes.len() {
            st.backlog.extend_from_slice(&bytes[done..]);
            self.queue.cv.notify_one();
        }
    }

    fn close(&self) {
        self.queue.state.lock().expect("out").closed = true;
        self.queue.cv.notify_one();
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

fn drain(q: Arc<OutQueue>, stream: TcpStream, shared: Arc<Shared>, to: SiteId) {
    loop {
        let chunk = {
            let mut st = q.state.lock().expect("out");
            st.busy = false;
            while st.backlog.is_empty() && !st.closed {
                st = q.cv.wait(st).expect("out");
            }
            if st.closed {
                return;
            }
            st.busy = true;
            std::mem::take(&mut st.backlog)
        };
        let mut done = 0;
        while done < chunk.len() {
            match (&stream).write(&chunk[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let mut fds = [rustix::event::PollFd::new(
                        &stream,
                        rustix::event::PollFlags::OUT,
                    )];
                    let t = rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: 100_000_000,
                    };
                    let _ = rustix::event::poll(&mut fds, Some(&t));
                    if q.state.lock().expect("out").closed {
                        return;
                    }
                }
                Err(e) => {
                    shared.log_drop(format!("site {}: dropped: io: {e}", shared.config.name(to)));
                    let mut st = q.state.lock().expect("out");
                    st.broken = true;
                    st.busy = false;
                    return;
                }
            }
        }
    }
}

fn msg_page(msg: &Msg) -> Option<(SegmentId, PageNo)> {
    match msg {
        Msg::Request { segment, page, .. }
        | Msg::Recall { segment, page, .. }
        | Msg::Refused { segment, page, .. }
        | Msg::Done { segment, page, .. }
        | Msg::Invalidate { segment, page, .. }
        | Msg::InvalidateAck { segment, page, .. }
        | Msg::Page { segment, page, .. }
        | Msg::Upgrade { segment, page, .. }
        | Msg::CheckedIn { segment, page, .. }
        | Msg::ForgetReader { segment, page, .. } => Some((*segment, *page)),
        _ => None,
    }
}

fn msg_segment(msg: &Msg) -> Option<SegmentId> {
    match msg {
        Msg::Attach { segment }
        | Msg::AttachOk { segment, .. }
        | Msg::Detach { segment }
        | Msg::DetachOk { segment }
        | Msg::Destroyed { segment } => Some(*segment),
        _ => msg_page(msg).map(|(s, _)| s),
    }
}

/// Replays a recorded trace through a fresh core and checks that every
/// event yields the recorded actions. Returns the number of events.
pub fn replay(
    site: SiteId,
    sites: u16,
    tick_ns: u64,
    trace: &[TraceEntry],
) -> Result<usize, String> {
    let core = CoreConfig {
        tick_ns,
        ..CoreConfig::default()
    };
    let mut s = Site::new(site, (0..sites).map(SiteId).collect(), core);
    let mut events = 0;
    for (i, t) in trace.iter().enumerate() {
        match t {
            TraceEntry::Sync {
                segment,
                page,
                bytes,
            } => s.write(*segment, *page, 0, bytes),
            TraceEntry::Event {
                now,
                event,
                actions,
            } => {
                let got = s.handle(*now, event.clone());
                if &got != actions {
                    return Err(format!(
                        "entry {i}: {event:?} yields {got:?}, recorded {actions:?}"
                    ));
                }
                events += 1;
            }
        }
    }
    Ok(events)
}
