//! The site daemon: std threads and TCP (`TCP_NODELAY`) around the sans-IO core.
//!
//! The runtime by concern (issue #23's split, each finding's fix in the
//! file whose name says so):
//! - [`super::listener`] — accepts peers, bounded (pending connections,
//!   a connection registry that forgets every closed one, accept errors
//!   such as EMFILE backed off and retried): findings 4 and 5;
//! - [`super::handshake`] — the Noise handshake under the cluster key, the
//!   hellos inside it, one total deadline: findings 1, 2 and 3;
//! - [`super::peer`] — per-peer I/O: one **reader** per authenticated
//!   inbound connection (idle past the peer timeout: closed), and per
//!   outgoing connection a non-blocking sender with one **drain** thread;
//! - [`super::core_loop`] — the core thread and the dispatch of every
//!   input (frames, API calls, timers) to the sans-IO core;
//! - [`super::fault_paths`] — page faults in (signal pipe, userfaultfd,
//!   programs' userfaultfds) and failures out: lost pages, dead peers,
//!   SIGBUS with one line (finding 6's daemon side);
//! - [`super::directory`] — the System V key directory on the first site.
//!
//! Threads (none of them ever touches an attach mapping, so none can fault
//! on DSM memory): readers and the fault threads take the core's lock and
//! handle their input on their own thread (no hand-off, which halved the
//! remote-fault time's thread wake-ups); the core thread serves the API
//! and fires timers. Their number is bounded: the listener, at most
//! `max_peers_pending` handshakes, one reader and one drain per peer
//! site, the fault threads and the core thread. Sends never block a
//! thread that holds the core (the socket is non-blocking): two readers
//! each blocked on a write to the other would deadlock.
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
use super::core_loop::{CoreLoop, core_thread};
use super::fault::{self, FaultRecord, RECORD_BYTES};
use super::fault_paths::{Waiter, fault_reader, remote_uffd_reader, uffd_reader};
use super::handshake::Credentials;
use super::listener::{Connections, listen};
use super::local::{Client, proto};
use super::shm::ShmError;
use crate::core::{
    Action, CoreConfig, Event, Geometry, Msg, Nanos, PageNo, SegmentId, Site, SiteId,
};
use crate::wire::{self, Handshake, Hello, Limits, SegmentOrigin};
use nix::libc;
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
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
    /// How often a site sends a heartbeat on each outgoing connection.
    pub heartbeat: Duration,
    /// A peer silent this long (no frame, no heartbeat), or whose
    /// connection closed, is declared dead: logged by name, requests that
    /// need it fail. Never a reason to regrant a page: coherence first.
    pub peer_timeout: Duration,
    /// A fault not served in this time fails (SIGBUS in a program, with
    /// one stderr line naming segment, page and sites); the page is then
    /// reported lost at this site until a copy arrives.
    pub request_timeout: Duration,
    /// How long a clean stop waits for this site's pages to be checked in.
    pub checkin_timeout: Duration,
    /// How long a program (the shim) may take to acknowledge that it
    /// removed a right from its mapping before the daemon kills it.
    pub program_ack_timeout: Duration,
    /// The whole handshake of a connection (key exchange and hellos), at
    /// most: a peer that has not finished by then is closed.
    pub handshake_timeout: Duration,
    /// userfaultfd or mprotect + SIGSEGV for this process's mappings.
    pub fault_path: fault::FaultPath,
    /// How long a fault-path thread (a userfaultfd reader, a peer's
    /// socket reader) polls for its next input before it sleeps, while
    /// its inputs come at most this far apart ([`super::spin`]); zero:
    /// never. [A] 200 µs: above a remote fault's whole cycle on this
    /// machine (~40-100 µs), so that a thread on a busy fault path stays
    /// awake from one fault to the next, and short enough that a thread
    /// whose inputs stop burns at most that once.
    pub spin: Duration,
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
            program_ack_timeout: Duration::from_secs(5),
            heartbeat: Duration::from_millis(250),
            peer_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            checkin_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(5),
            fault_path: fault::FaultPath::Auto,
            spin: Duration::from_micros(200),
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
    /// Of `faults`, those read from programs' userfaultfds (the shim's
    /// userfaultfd path).
    pub program_uffd_faults: AtomicU64,
    pub frames_sent: AtomicU64,
    /// Of `frames_sent`, the protocol's own messages (`Frame::Core`:
    /// requests, invalidations, pages, refusals, acknowledgements):
    /// no heartbeats (never counted), hellos, goodbyes or directory frames.
    pub core_frames_sent: AtomicU64,
    /// Protocol messages this site's core sent to itself (a colocated
    /// library and holder): fleisch89 §7.2's 9 messages count them.
    pub local_messages: AtomicU64,
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
        reply: Sender<Option<(SegmentId, Option<SegmentOrigin>)>>,
    },
    Register {
        key: i32,
        segment: SegmentId,
        origin: SegmentOrigin,
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
        target: AttachTarget,
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
    /// `mmulab dsm status`: sites and segments.
    Status {
        reply: Sender<super::status::SiteStatus>,
    },
    /// A clean stop: every attach of this site detaches, so that the core
    /// checks its pages back in. The replies come with each `Detached`.
    CheckIn {
        reply: Sender<Vec<Receiver<()>>>,
    },
    /// `IPC_RMID` under System V's lifetime: the core tells the library.
    Remove {
        segment: SegmentId,
    },
    /// `SHM_LOCK` (`on`) or `SHM_UNLOCK`: pins this site's copy of the
    /// segment in memory (`mlock` of the daemon's mapping of its memfd).
    Lock {
        segment: SegmentId,
        on: bool,
        reply: Sender<std::io::Result<()>>,
    },
    /// `SHM_INFO`'s `shm_rss`: pages present in this site's copies of
    /// these segments.
    Resident {
        segments: Vec<SegmentId>,
        reply: Sender<u64>,
    },
    /// The Rust API's checked access: copy `len` bytes at `at` of `page`
    /// of attach `process` out (`write: None`) or in, under the core's
    /// lock, if the page is held here with that right.
    Copy {
        process: u32,
        page: u32,
        at: usize,
        len: usize,
        write: Option<Vec<u8>>,
        reply: Sender<CopyAnswer>,
    },
}

/// The answer to [`Api::Copy`].
pub(crate) enum CopyAnswer {
    /// Copied (the bytes read; empty for a write).
    Done(Vec<u8>),
    /// Not held: a fault went to the protocol; ask again once this fires.
    Retry(Receiver<()>),
    /// The page is lost here: the dead site holding its only current
    /// copy, when known (None: a request timed out), and why.
    Lost(Option<String>, String),
    Error(ShmError),
}

/// Where an attach maps the segment.
#[derive(Clone)]
pub(crate) enum AttachTarget {
    /// In this process (the Rust API).
    Local { addr: Option<usize>, readonly: bool },
    /// In a program's process (the shim): the core sends `ATTACH_OK`
    /// with the memfd, answering request `req`, and the program maps it.
    /// `uffd`: the program catches faults through its own userfaultfd
    /// and completes the attach with `REGISTER`.
    Remote {
        client: Arc<Client>,
        readonly: bool,
        uffd: bool,
        req: u64,
    },
}

impl AttachTarget {
    pub(crate) fn readonly(&self) -> bool {
        match self {
            AttachTarget::Local { readonly, .. } | AttachTarget::Remote { readonly, .. } => {
                *readonly
            }
        }
    }
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
    /// The latest peers dropped, by name and reason (also printed to
    /// stderr), at most [`DROPPED_KEPT`]: a flood of strangers must not
    /// grow the daemon.
    pub dropped: Mutex<VecDeque<String>>,
    /// Drop lines printed in the current second, and those held back.
    log_budget: Mutex<(Instant, u32, u64)>,
    /// Every open inbound connection, until its thread ends.
    pub conns: Connections,
    pub counters: Counters,
    /// Liveness of each site (index = site id), updated by the readers
    /// without the core's lock.
    pub peers: Mutex<Vec<PeerState>>,
    /// Set once a clean stop began checking pages in: faults fail.
    pub checking_in: AtomicBool,
    /// The userfaultfd path, when in use (None: mprotect + SIGSEGV).
    pub uffd: Option<Arc<super::uffd::Uffd>>,
    /// Segments destroyed since the shmid table last looked
    /// ([`Node::take_destroyed`]): their ids and keys are free again.
    pub destroyed: Mutex<Vec<SegmentId>>,
    /// The core and everything it drives. Readers and the fault thread
    /// take it and handle their input on their own thread (no hand-off);
    /// the core thread serves the API and the timers. `None` once stopped.
    pub(crate) core: Mutex<Option<Box<CoreLoop>>>,
}

impl Shared {
    pub(crate) fn send(&self, input: Input) {
        let _ = self.tx.lock().expect("tx").send(input);
    }

    /// Runs `f` on the core, unless the site has stopped.
    pub(crate) fn with_core(&self, f: impl FnOnce(&mut CoreLoop)) {
        let mut g = self.core.lock().expect("core");
        if let Some(c) = g.as_mut() {
            f(c);
        }
    }

    /// A frame from `site` arrived (with its incarnation on a hello).
    pub(crate) fn heard(&self, site: SiteId, incarnation: Option<u64>) {
        let mut peers = self.peers.lock().expect("peers");
        if let Some(p) = peers.get_mut(site.0 as usize) {
            p.last_heard = Some(Instant::now());
            if let Some(i) = incarnation {
                if p.dead.is_some() {
                    eprintln!(
                        "mmulab dsm site {}: site {} is back (incarnation {i})",
                        self.config.name(self.me),
                        self.config.name(site)
                    );
                }
                p.incarnation = Some(i);
                p.dead = None;
            }
        }
    }

    /// Logs a dropped peer or connection. Printing is limited to
    /// [`DROP_LINES_PER_S`] lines a second (a port scan must not flood the
    /// log); the lines held back are counted in the next one printed.
    pub(crate) fn log_drop(&self, line: String) {
        let held_back = {
            let mut b = self.log_budget.lock().expect("log budget");
            if b.0.elapsed() >= Duration::from_secs(1) {
                *b = (Instant::now(), 0, b.2);
            }
            b.1 += 1;
            if b.1 <= DROP_LINES_PER_S {
                Some(std::mem::take(&mut b.2))
            } else {
                b.2 += 1;
                None
            }
        };
        match held_back {
            Some(0) => eprintln!("mmulab dsm site {}: {line}", self.config.name(self.me)),
            Some(n) => eprintln!(
                "mmulab dsm site {}: {line} (and {n} more dropped before, not shown)",
                self.config.name(self.me)
            ),
            None => {}
        }
        let mut d = self.dropped.lock().expect("dropped");
        if d.len() == DROPPED_KEPT {
            d.pop_front();
        }
        d.push_back(line);
    }

    /// The handshake's inputs: the key (None: insecure), our hello.
    pub(crate) fn credentials(&self) -> Credentials<'_> {
        Credentials {
            key: self.config.cluster_key.as_ref(),
            ours: self.hello(),
            seen: &self.handshake,
            limits: self.options.limits,
            timeout: self.options.handshake_timeout,
        }
    }

    pub(crate) fn hello(&self) -> Hello {
        Hello {
            version: wire::PROTOCOL_VERSION,
            cluster_id: self.config.cluster_id,
            site: self.me,
            name: self.config.name(self.me).to_string(),
            incarnation: self.incarnation,
        }
    }
}

/// Dropped-peer lines kept for [`Node::dropped_peers`].
pub const DROPPED_KEPT: usize = 1024;
/// Dropped-peer lines printed per second, at most.
pub const DROP_LINES_PER_S: u32 = 20;

/// What a site knows of a peer's liveness.
#[derive(Clone, Debug, Default)]
pub struct PeerState {
    /// The last frame (or heartbeat) from it.
    pub last_heard: Option<Instant>,
    /// Its incarnation, from its latest hello.
    pub incarnation: Option<u64>,
    /// Why it was declared dead (None while alive).
    pub dead: Option<String>,
}

/// A running site daemon.
pub struct Node {
    pub(crate) shared: Arc<Shared>,
    addr: SocketAddr,
    threads: Mutex<Vec<JoinHandle<()>>>,
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
        if config.cluster_key.is_none() && !config.insecure {
            // A key_file named but never read: ClusterConfig::load reads it.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the cluster key was not loaded (read cluster.toml with ClusterConfig::load)",
            ));
        }
        let addr = listener.local_addr()?;
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let (tx, rx) = mpsc::channel();
        let sites = config.sites.len() as u16;
        let fault_path = options.fault_path;
        let shared = Arc::new(Shared {
            handshake: Mutex::new(Handshake::new(config.cluster_id, sites)),
            config,
            me,
            incarnation,
            options,
            tx: Mutex::new(tx),
            stopping: AtomicBool::new(false),
            dropped: Mutex::new(VecDeque::new()),
            log_budget: Mutex::new((Instant::now(), 0, 0)),
            conns: Connections::default(),
            counters: Counters::default(),
            peers: Mutex::new(vec![PeerState::default(); sites as usize]),
            checking_in: AtomicBool::new(false),
            uffd: fault::open_path(fault_path).map(Arc::new),
            destroyed: Mutex::new(Vec::new()),
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
        if let Some(u) = shared.uffd.clone() {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("dsm-uffd-{}", me.0))
                    .spawn(move || uffd_reader(s, u))?,
            );
        }
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("dsm-core-{}", me.0))
                .spawn(move || core_thread(s, rx))?,
        );
        Ok(Node {
            shared,
            addr,
            threads: Mutex::new(threads),
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
        self.shared
            .dropped
            .lock()
            .expect("dropped")
            .iter()
            .cloned()
            .collect()
    }

    /// Inbound connections this site holds now: open, and of them those
    /// still in their handshake (bounded by `max_peers_pending`).
    pub fn connection_count(&self) -> super::listener::ConnectionCount {
        self.shared.conns.count()
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    pub fn options(&self) -> &NodeOptions {
        &self.shared.options
    }

    /// A page fault in a program on this site (the shim's `FAULT`).
    pub(crate) fn remote_fault(&self, client: &Arc<Client>, m: &proto::LocalMsg) {
        self.shared.counters.faults.fetch_add(1, Ordering::Relaxed);
        let access = match m.c {
            proto::ACCESS_READ => fault::ACCESS_READ,
            proto::ACCESS_WRITE => fault::ACCESS_WRITE,
            _ => fault::ACCESS_UNKNOWN,
        };
        let (process, page, slot) = (m.a as u32, m.b as u32, m.d);
        let c = client.clone();
        let mut served = false;
        self.shared.with_core(|core| {
            served = true;
            core.fault_from(process, page, access, Waiter::Remote(c, slot));
        });
        if !served {
            client.wake(slot, proto::wake::FAIL, "the site daemon is stopping");
        }
    }

    /// A program's `REGISTER` (the userfaultfd path): with `fd` (its
    /// userfaultfd, the first time), the daemon keeps it and starts the
    /// thread that serves its faults.
    pub(crate) fn register_remote(
        &self,
        client: &Arc<Client>,
        m: &proto::LocalMsg,
        fd: Option<OwnedFd>,
    ) -> Result<(), ShmError> {
        let (process, base) = (m.a as u32, m.b as usize);
        let uffd = if m.c == proto::mode::UFFD {
            let mut slot = client.uffd.lock().expect("uffd");
            if slot.is_none()
                && let Some(fd) = fd
            {
                let u = Arc::new(super::uffd::Uffd::from_fd(fd));
                let (s, c, u2) = (self.shared.clone(), client.clone(), u.clone());
                std::thread::Builder::new()
                    .name(format!("dsm-uffd-pid-{}", client.pid()))
                    .spawn(move || remote_uffd_reader(s, c, u2))
                    .map_err(|e| ShmError::Os(format!("a fault thread: {e}")))?;
                *slot = Some(u);
            }
            let u = slot
                .clone()
                .ok_or_else(|| ShmError::Os("REGISTER without the program's userfaultfd".into()))?;
            Some((u, base))
        } else {
            None
        };
        let mut done = false;
        self.shared.with_core(|core| {
            done = core.register_remote(client, process, uffd);
        });
        if done { Ok(()) } else { Err(ShmError::Invalid) }
    }

    /// Segments destroyed since the last call (System V: their ids and
    /// keys are free again).
    pub(crate) fn take_destroyed(&self) -> Vec<SegmentId> {
        std::mem::take(&mut *self.shared.destroyed.lock().expect("destroyed"))
    }

    /// Sites and segments, as `mmulab dsm status` prints them.
    pub fn status_text(&self) -> String {
        match self.status() {
            Some(s) => s.render_core(),
            None => "no answer from the core in time\n".into(),
        }
    }

    /// Sites and segments; None when the core did not answer in time.
    pub fn status(&self) -> Option<super::status::SiteStatus> {
        self.call(|reply| Api::Status { reply })
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
    pub fn stop(self) {
        self.shutdown();
    }

    /// [`Node::stop`] through a shared reference (the daemon's API is
    /// shared with the local socket's threads).
    pub fn shutdown(&self) {
        if self.shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        // A clean stop checks this site's pages back in (bounded): only a
        // crash loses pages.
        if !self.shared.checking_in.swap(true, Ordering::SeqCst) {
            let deadline = Instant::now() + self.shared.options.checkin_timeout;
            if let Some(waits) = self.call(|reply| Api::CheckIn { reply }) {
                for w in waits {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let _ = w.recv_timeout(left);
                }
            }
        }
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
        self.shared.conns.close_all();
        let threads = std::mem::take(&mut *self.threads.lock().expect("threads"));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A segment's name in logs: library site and serial.
pub(crate) fn seg_name(s: SegmentId) -> String {
    format!("{}.{}", s.library.0, s.serial)
}

pub(crate) fn msg_page(msg: &Msg) -> Option<(SegmentId, PageNo)> {
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

pub(crate) fn msg_segment(msg: &Msg) -> Option<SegmentId> {
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
    core: CoreConfig,
    trace: &[TraceEntry],
) -> Result<usize, String> {
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
