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
use super::local::{Client, proto};
use super::mem::{RemoteFaults, SegmentMemory};
use super::shm::ShmError;
use crate::core::{
    Access, Action, CoreConfig, Event, Geometry, Held, Msg, Nanos, PageNo, ProcessId, SegmentId,
    Site, SiteId, Timer,
};
use crate::wire::{self, DirMsg, Frame, Handshake, Hello, Limits, SegmentOrigin, WireError};
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
    /// userfaultfd or mprotect + SIGSEGV for this process's mappings.
    pub fault_path: fault::FaultPath,
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
            fault_path: fault::FaultPath::Auto,
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
    /// `mmulab dsm status`: sites and segments, as text.
    Status {
        reply: Sender<String>,
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
    fn readonly(&self) -> bool {
        match self {
            AttachTarget::Local { readonly, .. } | AttachTarget::Remote { readonly, .. } => {
                *readonly
            }
        }
    }
}

/// A faulter asleep until its page is served.
enum Waiter {
    /// In this process: the futex word on its stack.
    Local(u64),
    /// In a program: its wait slot, released through its socket.
    Remote(Arc<Client>, u64),
    /// In this process, asleep in the kernel on a userfaultfd page.
    Uffd(Arc<super::uffd::Uffd>, usize),
    /// In a program, asleep in the kernel on a page of its attach
    /// `process`, registered with its userfaultfd (`uffd`, passed to the
    /// daemon): (client, uffd, page address in the program).
    RemoteUffd(Arc<Client>, Arc<super::uffd::Uffd>, usize),
    /// A checked access of the Rust API: it asks again when released.
    Api(Sender<()>),
}

impl Waiter {
    fn release(self, value: u32, reason: &str) {
        match self {
            Waiter::Local(w) => {
                if value == fault::WAKE_FAIL {
                    fault::set_reason(reason);
                }
                // SAFETY: each word's faulter sleeps until released.
                unsafe { fault::release(w, value) }
            }
            Waiter::Uffd(u, page_addr) => {
                let ps = super::page_size();
                if value != fault::WAKE_RETRY {
                    // The retried access takes a genuine SIGBUS there.
                    eprintln!("mmulab dsm: {reason}; SIGBUS");
                    super::uffd::poison(page_addr, ps);
                }
                u.wake(page_addr, ps);
            }
            Waiter::RemoteUffd(c, u, page_addr) => {
                // A failure: the program's service thread maps an empty
                // memfd over the page (in its own address space) and
                // wakes the faulter, whose retry takes a SIGBUS there.
                if value == fault::WAKE_RETRY || !c.lost(page_addr, reason) {
                    u.wake(page_addr, super::page_size());
                }
            }
            Waiter::Api(tx) => {
                let _ = tx.send(());
            }
            Waiter::Remote(c, slot) => {
                let v = match value {
                    fault::WAKE_RETRY => proto::wake::RETRY,
                    fault::WAKE_SEGV => proto::wake::SEGV,
                    _ => proto::wake::FAIL,
                };
                c.wake(slot, v, reason);
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
    /// Peers dropped, by name and reason (also printed to stderr).
    pub dropped: Mutex<Vec<String>>,
    pub inbound: Mutex<Vec<TcpStream>>,
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

    /// A frame from `site` arrived (with its incarnation on a hello).
    fn heard(&self, site: SiteId, incarnation: Option<u64>) {
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
            dropped: Mutex::new(Vec::new()),
            inbound: Mutex::new(Vec::new()),
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
        self.shared.dropped.lock().expect("dropped").clone()
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
        self.call(|reply| Api::Status { reply })
            .unwrap_or_else(|| "no answer from the core in time\n".into())
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
        for s in self.shared.inbound.lock().expect("inbound").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
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
                Ok(Frame::Ping) => Err(WireError::NotHello("ping")),
                // A peer stopping before it said hello: nothing to log.
                Ok(Frame::Bye) => return,
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
    let site = hello.site;
    shared.heard(site, Some(hello.incarnation));
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, &stream);
    let why = loop {
        match wire::read_frame(&mut reader, &limits) {
            Ok(Frame::Hello(_)) => {
                let e = WireError::HelloAgain;
                shared.log_drop(format!("{name}: dropped: {}: {e}", e.reason()));
                break e.reason().to_string();
            }
            Ok(Frame::Ping) => shared.heard(site, None),
            // A clean stop of the peer: its close is expected, no line.
            Ok(Frame::Bye) => return,
            Ok(frame) => {
                shared.heard(site, None);
                shared
                    .counters
                    .frames_received
                    .fetch_add(1, Ordering::Relaxed);
                let mut keep = true;
                shared.with_core(|c| keep = c.net(hello.site, frame));
                if !keep {
                    // Logged by the core loop, with the core's reason.
                    break "a message the protocol refused".to_string();
                }
            }
            Err(WireError::Closed) => break "connection closed".to_string(),
            Err(_) if shared.stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                shared.log_drop(format!("{name}: dropped: {}: {e}", e.reason()));
                break format!("{}: {e}", e.reason());
            }
        }
    };
    // A closed or broken connection is not yet a dead peer (it may be
    // cut and redialled): silence past `peer_timeout` is.
    if !shared.stopping.load(Ordering::SeqCst) {
        eprintln!(
            "mmulab dsm site {}: {name}: connection ended: {why}",
            shared.config.name(shared.me)
        );
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
        shared.with_core(|c| {
            next = c.fire_timers();
            c.liveness();
        });
        wait = next.min(shared.options.heartbeat);
    }
    let core = shared.core.lock().expect("core").take();
    if let Some(mut c) = core {
        c.finish();
    }
}

/// The userfaultfd path's fault thread: events to the core, as records.
fn uffd_reader(shared: Arc<Shared>, uffd: Arc<super::uffd::Uffd>) {
    let ps = super::page_size();
    while !shared.stopping.load(Ordering::SeqCst) {
        let (addr, write) = match uffd.next_fault(200) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(_) => break,
        };
        shared.counters.faults.fetch_add(1, Ordering::Relaxed);
        let page_addr = addr & !(ps - 1);
        let mut served = false;
        shared.with_core(|c| {
            served = true;
            c.fault_uffd(page_addr, write, uffd.clone());
        });
        if !served {
            super::uffd::poison(page_addr, ps);
            uffd.wake(page_addr, ps);
        }
    }
}

/// The fault thread of one program's userfaultfd (the shim's, passed over
/// the local socket): the kernel queues the program's faults on it, this
/// thread hands them to the core. It never touches the program's memory.
fn remote_uffd_reader(shared: Arc<Shared>, client: Arc<Client>, uffd: Arc<super::uffd::Uffd>) {
    let ps = super::page_size();
    while !shared.stopping.load(Ordering::SeqCst) && !client.gone() {
        let (addr, write) = match uffd.next_fault(200) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(_) => break,
        };
        shared.counters.faults.fetch_add(1, Ordering::Relaxed);
        shared
            .counters
            .program_uffd_faults
            .fetch_add(1, Ordering::Relaxed);
        let page_addr = addr & !(ps - 1);
        let mut served = false;
        shared.with_core(|c| {
            served = true;
            c.fault_remote_uffd(&client, &uffd, page_addr, write);
        });
        if !served {
            // The daemon is stopping: the program's lost-page line and
            // SIGBUS, as for a fault that cannot be served.
            let _ = client.lost(page_addr, "the site daemon is stopping");
            uffd.wake(page_addr, ps);
        }
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
    /// (base, fault-table slot) of a mapping in this process.
    local: Option<(usize, usize)>,
    /// The program holding the mapping, for one made by the shim.
    client: Option<Arc<Client>>,
    readonly: bool,
}

/// A segment's name in logs: library site and serial.
pub(crate) fn seg_name(s: SegmentId) -> String {
    format!("{}.{}", s.library.0, s.serial)
}

type PendingAttach = (
    SegmentId,
    AttachTarget,
    Sender<Result<(usize, u32, Geometry), ShmError>>,
);

enum DirWait {
    Lookup(Sender<Option<(SegmentId, Option<SegmentOrigin>)>>),
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
    /// Sleeping faulters by (attach, page), each with when it faulted.
    waiters: BTreeMap<(u32, u32), Vec<(Instant, Waiter)>>,
    /// Pages this site cannot obtain (their holder or library is dead, or
    /// a request timed out), with the reason. Cleared when a copy arrives.
    lost: BTreeMap<(SegmentId, PageNo), String>,
    /// Segments whose library died: nothing about them is ever sent to a
    /// restarted site under the same name, and they cannot be attached.
    dead_segments: std::collections::BTreeSet<SegmentId>,
    /// (site, segment): the site died while the segment existed; whatever
    /// it (restarted) says about the segment is ignored, and nothing
    /// about it is sent to it.
    fenced: std::collections::BTreeSet<(SiteId, SegmentId)>,
    /// Segments created here (the library's), for fencing.
    created: std::collections::BTreeSet<SegmentId>,
    /// Segments under `SHM_LOCK`: this site's copy is pinned in memory.
    locked: std::collections::BTreeSet<SegmentId>,
    last_ping: Instant,
    /// Peers that sent a message the core refused while it handled the
    /// current frame (their connection is dropped).
    refused_from: Vec<SiteId>,
    /// When each dead peer was last redialled.
    redialled: Vec<Option<Instant>>,
    /// Whether each peer was ever reached (later dials are quick).
    dialled_once: Vec<bool>,
    pending_create: BTreeMap<u32, Sender<SegmentId>>,
    pending_attach: BTreeMap<u32, PendingAttach>,
    pending_detach: BTreeMap<u32, Sender<()>>,
    /// The key directory (first site only).
    dir: BTreeMap<i32, (SegmentId, SegmentOrigin)>,
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
        let core = shared.config.core_config();
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
            lost: BTreeMap::new(),
            dead_segments: std::collections::BTreeSet::new(),
            fenced: std::collections::BTreeSet::new(),
            created: std::collections::BTreeSet::new(),
            locked: std::collections::BTreeSet::new(),
            last_ping: Instant::now(),
            refused_from: Vec::new(),
            redialled: vec![None; n],
            dialled_once: vec![false; n],
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

    /// Hands the core a detach (the core accepts one while the process
    /// is asleep on a fault: its request is answered and given back).
    fn detach_core(&mut self, segment: SegmentId, process: u32) {
        self.feed(Event::Detach {
            segment,
            process: ProcessId(process),
        });
    }

    /// Heartbeats out, silent peers declared dead, overdue faults failed.
    fn liveness(&mut self) {
        let opts = self.shared.options.clone();
        if self.last_ping.elapsed() >= opts.heartbeat {
            self.last_ping = Instant::now();
            let ping = wire::encode(Frame::Ping);
            for i in 0..self.out.len() {
                match &self.out[i] {
                    Some(o) if !o.is_broken() => o.send(ping.clone()),
                    // A cut connection is redialled (once) for the
                    // heartbeat, so that a live peer stays heard.
                    Some(_) => self.send_frame(SiteId(i as u16), Frame::Ping),
                    None => {}
                }
            }
        }
        let silent: Vec<(SiteId, Duration)> = {
            let peers = self.shared.peers.lock().expect("peers");
            peers
                .iter()
                .enumerate()
                .filter(|(_, p)| p.dead.is_none())
                .filter_map(|(i, p)| {
                    let t = p.last_heard?.elapsed();
                    (t > opts.peer_timeout).then_some((SiteId(i as u16), t))
                })
                .collect()
        };
        for (site, t) in silent {
            self.peer_dead(site, &format!("silent for {:.1} s", t.as_secs_f64()));
        }
        let overdue: Vec<(u32, u32)> = self
            .waiters
            .iter()
            .filter(|(_, ws)| {
                ws.iter()
                    .any(|(since, _)| since.elapsed() > opts.request_timeout)
            })
            .map(|(&k, _)| k)
            .collect();
        for (process, page) in overdue {
            let Some(segment) = self.attaches.get(&process).map(|a| a.segment) else {
                continue;
            };
            let why = format!(
                "segment {} page {page}: no answer within {:.1} s (library site {}{})",
                seg_name(segment),
                opts.request_timeout.as_secs_f64(),
                self.shared.config.name(segment.library),
                self.dead_list()
            );
            self.lose(segment, PageNo(page), why);
        }
    }

    /// "; dead: b, c" or "".
    fn dead_list(&self) -> String {
        let peers = self.shared.peers.lock().expect("peers");
        let dead: Vec<&str> = peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.dead.is_some())
            .map(|(i, _)| self.shared.config.name(SiteId(i as u16)))
            .collect();
        if dead.is_empty() {
            String::new()
        } else {
            format!("; dead: {}", dead.join(", "))
        }
    }

    /// Marks a page lost here and fails everyone waiting for it.
    fn lose(&mut self, segment: SegmentId, page: PageNo, why: String) {
        eprintln!(
            "mmulab dsm site {}: lost: {why}",
            self.shared.config.name(self.shared.me)
        );
        let keys: Vec<(u32, u32)> = self
            .waiters
            .keys()
            .filter(|(p, pg)| {
                *pg == page.0 && self.attaches.get(p).is_some_and(|a| a.segment == segment)
            })
            .copied()
            .collect();
        for k in keys {
            for (_, w) in self.waiters.remove(&k).unwrap_or_default() {
                w.release(fault::WAKE_FAIL, &why);
            }
        }
        self.lost.insert((segment, page), why);
    }

    /// Why a page is lost with the dead site `site`, as logs print it.
    fn lost_reason(&self, segment: SegmentId, page: PageNo, site: SiteId) -> String {
        let why = self.shared.peers.lock().expect("peers")[site.0 as usize]
            .dead
            .clone()
            .unwrap_or_else(|| "declared dead".into());
        format!(
            "segment {} page {}: lost: its only current copy was at site {}, which is dead ({why})",
            seg_name(segment),
            page.0,
            self.shared.config.name(site)
        )
    }

    /// A peer vanished: logged by name; the segments it was the library
    /// of are dead, and their pages not held here are lost.
    fn peer_dead(&mut self, site: SiteId, reason: &str) {
        if site == self.shared.me || self.shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        {
            let mut peers = self.shared.peers.lock().expect("peers");
            let p = &mut peers[site.0 as usize];
            if p.dead.is_some() {
                return;
            }
            p.dead = Some(reason.to_string());
        }
        let name = self.shared.config.name(site).to_string();
        self.shared
            .log_drop(format!("site {name}: vanished: {reason}"));
        if let Some(o) = self.out[site.0 as usize].take() {
            o.close();
        }
        let known: Vec<SegmentId> = self
            .created
            .iter()
            .chain(self.segs.keys())
            .chain(self.attaches.values().map(|a| &a.segment))
            .copied()
            .collect();
        for segment in known {
            self.fenced.insert((site, segment));
        }
        let orphaned: Vec<SegmentId> = self
            .segs
            .keys()
            .chain(self.attaches.values().map(|a| &a.segment))
            .filter(|s| s.library == site)
            .copied()
            .collect();
        for segment in orphaned {
            self.dead_segments.insert(segment);
        }
        // The core decides what is lost: pages whose only current copy
        // was there (as library), faults that need the dead library (as
        // holder); read copies elsewhere stay readable.
        self.feed(Event::SiteDead { site });
    }

    /// A clean stop: every mapping loses access (programs acknowledge),
    /// sleeping faulters fail, every attach detaches so that the core
    /// checks this site's pages back in. Returns one receiver per detach
    /// whose library is alive.
    fn check_in(&mut self) -> Vec<Receiver<()>> {
        // Every write-held page's bytes go into the core first (after
        // every mapping lost the right to write), then every mapping
        // loses every right for good.
        let segs: Vec<SegmentId> = self.segs.keys().copied().collect();
        for segment in segs {
            let pages = self.segs[&segment].pages as u32;
            for p in 0..pages {
                let page = PageNo(p);
                let write_held = self
                    .site
                    .page_view(segment, page)
                    .is_some_and(|v| v.held == Held::Write);
                if write_held {
                    let mem = &self.segs[&segment];
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
                }
            }
            if let Some(mem) = self.segs.get_mut(&segment) {
                mem.freeze();
            }
        }
        // Faulters already asleep stay so: their requests are in flight
        // and the core detaches a process only once it is awake; served,
        // they retry on a frozen mapping and fail.
        let processes: Vec<u32> = self.attaches.keys().copied().collect();
        let mut waits = Vec::new();
        for process in processes {
            let Some(a) = self.attaches.remove(&process) else {
                continue;
            };
            if let Some(mem) = self.segs.get_mut(&a.segment) {
                match a.local {
                    Some((base, slot)) => {
                        fault::unregister(slot);
                        let _ = mem.detach(base);
                    }
                    None => mem.detach_remote(process),
                }
            }
            let (tx, rx) = mpsc::channel();
            self.pending_detach.insert(process, tx);
            if !self.dead_segments.contains(&a.segment) {
                waits.push(rx);
            }
            self.detach_core(a.segment, process);
        }
        waits
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
        let me = self.shared.config.name(self.shared.me).to_string();
        for ((process, page), words) in std::mem::take(&mut self.waiters) {
            let segment = self
                .attaches
                .get(&process)
                .map_or("?".to_string(), |a| seg_name(a.segment));
            let why = format!("segment {segment} page {page}: site {me} stopped");
            for (_, w) in words {
                w.release(fault::WAKE_FAIL, &why);
            }
        }
        for (_, a) in std::mem::take(&mut self.attaches) {
            if let Some((_, slot)) = a.local {
                fault::unregister(slot);
            }
        }
        // A clean stop: each peer hears a goodbye before the close, so
        // that it logs nothing about it (an unexpected close is logged).
        for q in self.out.iter().flatten() {
            q.goodbye();
        }
    }

    /// Why a peer's message cannot be handed to the core (it names a
    /// segment or page the core does not know in the role the message
    /// needs, or one fenced off when its sender died): the core trusts
    /// its peers, the runtime must not.
    /// Why a peer's message is not handed to the core: it names a segment
    /// fenced off when its sender died (a restarted site never speaks for
    /// its former life). Everything else the core checks itself.
    fn unexpected(&self, from: SiteId, msg: &Msg) -> Option<&'static str> {
        if let Some(seg) = msg_segment(msg)
            && self.fenced.contains(&(from, seg))
        {
            return Some("a segment from before the sender's restart");
        }
        None
    }

    /// Hands a frame to the core. Returns false when the sender must be
    /// dropped: the core refused its message (logged by name, with the
    /// reason, as the core's `PeerError`).
    fn net(&mut self, from: SiteId, frame: Frame) -> bool {
        self.refused_from.clear();
        self.net_inner(from, frame);
        !self.refused_from.contains(&from)
    }

    fn net_inner(&mut self, from: SiteId, frame: Frame) {
        match frame {
            Frame::Core(msg) => {
                if let Some(why) = self.unexpected(from, &msg) {
                    eprintln!(
                        "mmulab dsm site {}: ignored a {} from site {}: {why}",
                        self.shared.config.name(self.shared.me),
                        msg.kind(),
                        self.shared.config.name(from)
                    );
                    return;
                }
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
            Frame::Hello(_) | Frame::Ping | Frame::Bye => {}
        }
    }

    fn directory(&mut self, from: SiteId, msg: DirMsg) {
        match msg {
            DirMsg::Lookup { req, key } => {
                let found = self.dir.get(&key).copied();
                let (segment, origin) = (found.map(|f| f.0), found.map(|f| f.1));
                let reply = DirMsg::Found {
                    req,
                    key,
                    segment,
                    origin,
                };
                self.send_frame(from, Frame::Dir(reply));
            }
            DirMsg::Register {
                req,
                key,
                segment,
                origin,
            } => {
                let winner = self.dir.entry(key).or_insert((segment, origin)).0;
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
            DirMsg::Found {
                req,
                segment,
                origin,
                ..
            } => {
                if let Some(DirWait::Lookup(r)) = self.dir_waits.remove(&req) {
                    let _ = r.send(segment.map(|s| (s, origin)));
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
                    let _ = reply.send(self.dir.get(&key).map(|&(s, o)| (s, Some(o))));
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
                origin,
                reply,
            } => {
                if me == self.dir_site() {
                    let _ = reply.send(self.dir.entry(key).or_insert((segment, origin)).0);
                } else {
                    let req = self.next_req;
                    self.next_req += 1;
                    self.dir_waits.insert(req, DirWait::Register(reply));
                    let msg = DirMsg::Register {
                        req,
                        key,
                        segment,
                        origin,
                    };
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
                target,
                reply,
            } => {
                if self.dead_segments.contains(&segment) {
                    let _ = reply.send(Err(ShmError::Removed));
                    return;
                }
                let process = self.new_process();
                self.pending_attach
                    .insert(process, (segment, target, reply));
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
                // The mapping goes first: after shmdt nothing may fault on it
                // (a program unmapped its own before asking).
                if let Some(mem) = self.segs.get_mut(&a.segment) {
                    match a.local {
                        Some((base, slot)) => {
                            fault::unregister(slot);
                            let _ = mem.detach(base);
                        }
                        None => mem.detach_remote(process),
                    }
                }
                // Faulters of a detached mapping retry and find no slot
                // (the core drops their wait with the detach).
                let stale: Vec<(u32, u32)> = self
                    .waiters
                    .range((process, 0)..=(process, u32::MAX))
                    .map(|(&k, _)| k)
                    .collect();
                for k in stale {
                    for (_, w) in self.waiters.remove(&k).unwrap_or_default() {
                        w.release(fault::WAKE_RETRY, "");
                    }
                }
                self.pending_detach.insert(process, reply);
                self.detach_core(a.segment, process);
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
            Api::Remove { segment } => self.feed(Event::Remove { segment }),
            Api::Lock { segment, on, reply } => {
                if on {
                    self.locked.insert(segment);
                } else {
                    self.locked.remove(&segment);
                }
                let r = self.segs.get(&segment).map_or(Ok(()), |m| m.set_locked(on));
                let _ = reply.send(r);
            }
            Api::Resident { segments, reply } => {
                let n = segments
                    .iter()
                    .filter_map(|s| self.segs.get(s))
                    .map(|m| m.resident_pages())
                    .sum();
                let _ = reply.send(n);
            }
            Api::TakeTrace { reply } => {
                let t = self.trace.as_mut().map(std::mem::take).unwrap_or_default();
                let _ = reply.send(t);
            }
            Api::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Api::CheckIn { reply } => {
                let _ = reply.send(self.check_in());
            }
            Api::Copy {
                process,
                page,
                at,
                len,
                write,
                reply,
            } => {
                let _ = reply.send(self.copy(process, page, at, len, write));
            }
        }
    }

    /// [`Api::Copy`]: never touches an attach mapping, so it never faults;
    /// a lost page is an error, not a SIGBUS.
    fn copy(
        &mut self,
        process: u32,
        page: u32,
        at: usize,
        len: usize,
        write: Option<Vec<u8>>,
    ) -> CopyAnswer {
        if self.shared.checking_in.load(Ordering::SeqCst) {
            return CopyAnswer::Error(ShmError::Os("the site daemon is stopping".into()));
        }
        let Some(a) = self.attaches.get(&process) else {
            return CopyAnswer::Error(ShmError::Invalid);
        };
        let (segment, readonly) = (a.segment, a.readonly);
        if write.is_some() && readonly {
            return CopyAnswer::Error(ShmError::Access);
        }
        let Some(mem) = self.segs.get(&segment) else {
            return CopyAnswer::Error(ShmError::Invalid);
        };
        if page as usize >= mem.pages || at + len > mem.page_bytes {
            return CopyAnswer::Error(ShmError::Invalid);
        }
        let pg = PageNo(page);
        let access = if write.is_some() {
            Access::Write
        } else {
            Access::Read
        };
        let held = self
            .site
            .page_view(segment, pg)
            .map_or(Held::Nothing, |v| v.held);
        if held.allows(access) && !mem.is_frozen() {
            return match write {
                Some(data) => {
                    mem.write_at(pg, at, &data);
                    CopyAnswer::Done(Vec::new())
                }
                None => CopyAnswer::Done(mem.page(pg)[at..at + len].to_vec()),
            };
        }
        let dead = self
            .site
            .lost_pages()
            .into_iter()
            .find(|(s, p, _)| *s == segment && *p == pg)
            .map(|(_, _, d)| d);
        if let Some(why) = self.lost.get(&(segment, pg)).cloned() {
            let site = dead.map(|d| self.shared.config.name(d).to_string());
            return CopyAnswer::Lost(site, why);
        }
        let (tx, rx) = mpsc::channel();
        self.fault_from(
            process,
            page,
            if write.is_some() {
                fault::ACCESS_WRITE
            } else {
                fault::ACCESS_READ
            },
            Waiter::Api(tx),
        );
        CopyAnswer::Retry(rx)
    }

    /// The core's view of this site, as text (`mmulab dsm status`).
    fn status(&self) -> String {
        use std::fmt::Write as _;
        let cfg = &self.shared.config;
        let me = self.shared.me;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "site {} (id {}), cluster {}, incarnation {}",
            cfg.name(me),
            me.0,
            cfg.cluster_id,
            self.shared.incarnation
        );
        let _ = writeln!(t, "sites:");
        let peers = self.shared.peers.lock().expect("peers").clone();
        for (i, sc) in cfg.sites.iter().enumerate() {
            let p = &peers[i];
            let state = if i == me.0 as usize {
                "this site".to_string()
            } else if let Some(why) = &p.dead {
                format!("DEAD: {why}")
            } else {
                let out = match &self.out[i] {
                    Some(o) if !o.is_broken() => "connected",
                    Some(_) => "connection broken",
                    None => "not dialled",
                };
                match p.last_heard {
                    Some(t) => format!(
                        "alive ({out}; heard {} ms ago, incarnation {})",
                        t.elapsed().as_millis(),
                        p.incarnation.unwrap_or(0)
                    ),
                    None => format!("not heard from yet ({out})"),
                }
            };
            let _ = writeln!(t, "  {:<8} {:<22} {state}", sc.name, sc.addr.to_string());
        }
        let _ = writeln!(t, "segments mapped here:");
        if self.segs.is_empty() {
            let _ = writeln!(t, "  none");
        }
        for (seg, mem) in &self.segs {
            let mut held = [0usize; 3];
            for p in 0..mem.pages as u32 {
                let h = self
                    .site
                    .page_view(*seg, PageNo(p))
                    .map_or(Held::Nothing, |v| v.held);
                held[h as usize] += 1;
            }
            let mut programs: Vec<String> = self
                .attaches
                .values()
                .filter(|a| a.segment == *seg)
                .map(|a| match &a.client {
                    Some(c) => format!("pid {}", c.pid()),
                    None => "daemon".to_string(),
                })
                .collect();
            programs.sort();
            programs.dedup();
            let _ = writeln!(
                t,
                "  segment {} (library {}): {} pages; held here: {} write, {} read, {} none; attaches {} ({})",
                seg_name(*seg),
                cfg.name(seg.library),
                mem.pages,
                held[2],
                held[1],
                held[0],
                self.attaches.values().filter(|a| a.segment == *seg).count(),
                programs.join(", ")
            );
        }
        // Pages the core knows lost (as library: their only current copy
        // was at a dead site; as holder: their library died), and pages
        // whose request timed out here.
        let mut lost = self.lost.clone();
        for (segment, page, site) in self.site.lost_pages() {
            lost.entry((segment, page))
                .or_insert_with(|| self.lost_reason(segment, page, site));
        }
        let _ = writeln!(t, "lost pages:");
        if lost.is_empty() {
            let _ = writeln!(t, "  none");
        }
        for why in lost.values() {
            let _ = writeln!(t, "  {why}");
        }
        t
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

    /// A userfaultfd event on one of this process's mappings.
    fn fault_uffd(&mut self, page_addr: usize, write: bool, uffd: Arc<super::uffd::Uffd>) {
        let found = self.attaches.iter().find_map(|(&id, a)| {
            let (base, _) = a.local?;
            let mem = self.segs.get(&a.segment)?;
            let (b, page) = mem.local_page_of(page_addr)?;
            (b == base).then_some((id, page))
        });
        let waiter = Waiter::Uffd(uffd.clone(), page_addr);
        let Some((id, page)) = found else {
            // Not (or no longer) ours: let it retry.
            uffd.wake(page_addr, super::page_size());
            return;
        };
        self.fault_stamped(id, page.0, write, waiter);
    }

    /// A typed userfaultfd fault handed to the core, with the bench's
    /// delivery and request stamps around it.
    fn fault_stamped(&mut self, id: u32, page: u32, write: bool, waiter: Waiter) {
        let access = if write {
            fault::ACCESS_WRITE
        } else {
            fault::ACCESS_READ
        };
        let st = &self.shared.counters.stamps;
        st.fault_delivered.store(stamp(), Ordering::Relaxed);
        self.fault_from(id, page, access, waiter);
        let st = &self.shared.counters.stamps;
        st.request_sent.store(stamp(), Ordering::Relaxed);
    }

    /// A userfaultfd event in a program (its attach mapping registered
    /// with the fd it passed).
    fn fault_remote_uffd(
        &mut self,
        client: &Arc<Client>,
        uffd: &Arc<super::uffd::Uffd>,
        page_addr: usize,
        write: bool,
    ) {
        let ps = super::page_size();
        let found = self.attaches.iter().find_map(|(&id, a)| {
            let c = a.client.as_ref()?;
            if !Arc::ptr_eq(c, client) {
                return None;
            }
            let mem = self.segs.get(&a.segment)?;
            Some((id, a.segment, mem.remote_uffd_page(id, page_addr)?))
        });
        let Some((id, segment, page)) = found else {
            // Not (or no longer) a DSM mapping: let it retry.
            uffd.wake(page_addr, ps);
            return;
        };
        if let Some(mem) = self.segs.get(&segment)
            && mem.allows(page, write)
        {
            // The fault raced a grant: make sure this mapping has it too.
            mem.refresh_remote(id, page);
            uffd.wake(page_addr, ps);
            return;
        }
        let waiter = Waiter::RemoteUffd(client.clone(), uffd.clone(), page_addr);
        self.fault_stamped(id, page.0, write, waiter);
    }

    /// A program's `REGISTER` of its pending userfaultfd mapping
    /// (`uffd` = None: it fell back to mprotect).
    fn register_remote(
        &mut self,
        client: &Arc<Client>,
        process: u32,
        uffd: Option<(Arc<super::uffd::Uffd>, usize)>,
    ) -> bool {
        let Some(a) = self.attaches.get(&process) else {
            return false;
        };
        if !a.client.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            return false;
        }
        self.segs
            .get_mut(&a.segment)
            .is_some_and(|mem| mem.register_remote(process, uffd))
    }

    fn fault_inner(&mut self, rec: FaultRecord) {
        self.fault_from(rec.id, rec.page, rec.access, Waiter::Local(rec.word));
    }

    /// A fault of attach `id` on `page`; `waiter` sleeps until served.
    fn fault_from(&mut self, id: u32, page: u32, access: u32, waiter: Waiter) {
        if self.shared.checking_in.load(Ordering::SeqCst) {
            let why = format!(
                "page {page}: site {} is stopping",
                self.shared.config.name(self.shared.me)
            );
            waiter.release(fault::WAKE_FAIL, &why);
            return;
        }
        let Some(a) = self.attaches.get(&id) else {
            // The mapping was detached meanwhile: the retry finds no slot
            // and crashes as on any unmapped address.
            waiter.release(fault::WAKE_RETRY, "");
            return;
        };
        let segment = a.segment;
        let readonly = a.readonly;
        let rec_page = page;
        let page = PageNo(page);
        let held = self
            .site
            .page_view(segment, page)
            .map_or(Held::Nothing, |v| v.held);
        let access = match access {
            fault::ACCESS_READ => Access::Read,
            fault::ACCESS_WRITE => Access::Write,
            // Read-then-upgrade: a fault on a readable page is a write.
            _ if held.allows(Access::Read) => Access::Write,
            _ => Access::Read,
        };
        if access == Access::Write && readonly {
            waiter.release(fault::WAKE_SEGV, "");
            return;
        }
        if (held == Held::Nothing || access == Access::Write)
            && let Some(why) = self.lost.get(&(segment, page)).cloned()
        {
            // Coherence before availability: fail, never guess.
            waiter.release(fault::WAKE_FAIL, &why);
            return;
        }
        self.waiters
            .entry((id, rec_page))
            .or_default()
            .push((Instant::now(), waiter));
        self.feed(Event::Fault {
            segment,
            page,
            process: ProcessId(id),
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
            // A dead reader may complete an invalidation, which ships.
            Event::SiteDead { .. } => {
                let segs: Vec<SegmentId> = self.segs.keys().copied().collect();
                segs.into_iter().flat_map(seg_pages).collect()
            }
            Event::Create { .. }
            | Event::Attach { .. }
            | Event::SetWindow { .. }
            | Event::Remove { .. } => Vec::new(),
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
            // A frozen segment's bytes were copied into the core when the
            // clean stop began (its memory may be holes now).
            if !write_held || mem.is_frozen() {
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
        self.shared
            .counters
            .local_messages
            .store(self.site.local_messages(), Ordering::Relaxed);
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
                        mem.prepare_install(page);
                        mem.write_page(page, &b);
                    }
                    // A late answer: the page is here after all.
                    self.lost.remove(&(segment, page));
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
                for (_, w) in words {
                    w.release(fault::WAKE_RETRY, "");
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
            Action::Fail {
                process,
                segment,
                page,
                site,
            } => {
                let why = self.lost_reason(segment, page, site);
                eprintln!(
                    "mmulab dsm site {}: lost: {why}",
                    self.shared.config.name(self.shared.me)
                );
                for (_, w) in self
                    .waiters
                    .remove(&(process.0, page.0))
                    .unwrap_or_default()
                {
                    w.release(fault::WAKE_FAIL, &why);
                }
                self.lost.insert((segment, page), why);
            }
            Action::PeerError { site, reason } => {
                self.shared.log_drop(format!(
                    "site {}: dropped: protocol: {reason}",
                    self.shared.config.name(site)
                ));
                self.refused_from.push(site);
            }
            Action::Created { segment, process } => {
                self.created.insert(segment);
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
                // Its key is free again, and so is its id on this site.
                self.dir.retain(|_, (s, _)| *s != segment);
                self.locked.remove(&segment);
                self.shared
                    .destroyed
                    .lock()
                    .expect("destroyed")
                    .push(segment);
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
                        let _ = p.2.send(Err(ShmError::Removed));
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
        let Some((_, target, reply)) = self.pending_attach.remove(&process) else {
            return;
        };
        let readonly = target.readonly();
        let result = (|| -> Result<(usize, u32, Geometry), ShmError> {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.segs.entry(segment) {
                let name = format!("mmulab-dsm-{}-{}", segment.library.0, segment.serial);
                let mem = SegmentMemory::new(
                    &name,
                    geometry.pages as usize,
                    geometry.page_bytes as usize,
                    self.shared.uffd.clone(),
                )
                .map_err(|e| ShmError::Os(format!("memfd: {e}")))?;
                if self.locked.contains(&segment) {
                    mem.set_locked(true)
                        .map_err(|e| ShmError::Os(format!("SHM_LOCK: mlock: {e}")))?;
                }
                slot.insert(mem);
            }
            let mem = self.segs.get_mut(&segment).expect("just made");
            let addr = match &target {
                AttachTarget::Local { addr, .. } => *addr,
                AttachTarget::Remote {
                    client, req, uffd, ..
                } => {
                    // The answer and the memfd first, then the present
                    // protections: the program's service thread maps the
                    // segment before it reads them.
                    let mut m = proto::LocalMsg::new(proto::kind::ATTACH_OK);
                    m.id = *req;
                    m.a = process as u64;
                    m.b = mem.len() as u64;
                    m.c = readonly as u64;
                    let fd = mem
                        .share(readonly)
                        .map_err(|e| ShmError::Os(format!("memfd: {e}")))?;
                    if !client.send_fd(&m, rustix::fd::AsFd::as_fd(&fd)) {
                        return Err(ShmError::Os("the program's socket is closed".into()));
                    }
                    let faults = if *uffd {
                        RemoteFaults::UffdPending
                    } else {
                        RemoteFaults::Mprotect
                    };
                    mem.attach_remote(client.clone(), process, readonly, faults)
                        .map_err(|e| ShmError::Os(format!("punch: {e}")))?;
                    if !*uffd {
                        mem.send_protections(client, process, readonly);
                    }
                    client.processes.lock().expect("processes").insert(process);
                    self.attaches.insert(
                        process,
                        AttachInfo {
                            segment,
                            local: None,
                            client: Some(client.clone()),
                            readonly,
                        },
                    );
                    return Ok((0, process, geometry));
                }
            };
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
            // The SIGSEGV table serves the mprotect path (on the
            // userfaultfd path the kernel never raises SIGSEGV there).
            let slot = fault::register(base, len, process, self.fault_pipe_w.as_raw_fd());
            self.attaches.insert(
                process,
                AttachInfo {
                    segment,
                    local: Some((base, slot)),
                    client: None,
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
        if self.shared.peers.lock().expect("peers")[i].dead.is_some() {
            // A dead peer gets one quick dial a second at most (it may
            // have restarted under its name); otherwise the message is
            // dropped and what it would have answered times out at the
            // requester. No long dialling under the core's lock.
            let due = self.redialled[i].is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
            if !due {
                return;
            }
            self.redialled[i] = Some(Instant::now());
            match self.dial(to, false) {
                Some(s) => {
                    if let Some(o) = self.out[i].take() {
                        o.close();
                    }
                    self.out[i] = Some(Outbound::new(s, self.shared.clone(), to));
                }
                None => return,
            }
        }
        if let Frame::Core(m) = &frame
            && msg_segment(m)
                .is_some_and(|s| self.dead_segments.contains(&s) || self.fenced.contains(&(to, s)))
        {
            // A restarted site never hears of its former life's segments.
            return;
        }
        if self.out[i].as_ref().is_none_or(|o| o.is_broken()) {
            // Patient only for the first connection (a peer not up yet).
            let patient = !self.dialled_once[i];
            if let Some(o) = self.out[i].take() {
                o.close();
            }
            self.out[i] = self
                .dial(to, patient)
                .map(|s| Outbound::new(s, self.shared.clone(), to));
        }
        let Some(out) = self.out[i].as_ref() else {
            self.shared.log_drop(format!(
                "site {}: unreachable: message lost",
                self.shared.config.name(to)
            ));
            return;
        };
        let core = matches!(frame, Frame::Core(_));
        out.send(wire::encode(frame));
        let counters = &self.shared.counters;
        counters.frames_sent.fetch_add(1, Ordering::Relaxed);
        if core {
            counters.core_frames_sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Dials a peer and exchanges hellos: with retries for `dial_for`
    /// when `patient` (a peer not up yet), else once.
    fn dial(&mut self, to: SiteId, patient: bool) -> Option<TcpStream> {
        let addr = self.shared.config.sites[to.0 as usize].addr;
        let deadline = Instant::now()
            + if patient {
                self.shared.options.dial_for
            } else {
                Duration::ZERO
            };
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
                            self.dialled_once[to.0 as usize] = true;
                            self.shared.heard(to, Some(h.incarnation));
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

    /// Sends `Bye`, lets the writer flush what is queued (bounded), then
    /// closes.
    fn goodbye(&self) {
        self.send(wire::encode(Frame::Bye));
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            {
                let st = self.queue.state.lock().expect("out");
                if st.broken || (st.backlog.is_empty() && !st.busy) {
                    break;
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.close();
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
