//! The site daemon's local socket: programs on this site (through
//! `libmmulab_shm.so`, crate `mmulab-shm`) reach the DSM here.
//!
//! One `SOCK_SEQPACKET` Unix socket per site (`socket` in `cluster.toml`,
//! default [`default_socket_path`]); the records are those of
//! `crates/mirage-shim/src/proto.rs`, shared with the shim verbatim.
//!
//! Per connected program, two threads:
//! - a **reader** that never takes the core's lock: it records `ACK`s at
//!   once (the core may be waiting for one, holding its lock) and queues
//!   everything else;
//! - a **worker** that serves the queue in order: API calls through
//!   [`Dsm`], faults through the core (`Node::remote_fault`).
//!
//! When a program's connection closes (exit, crash, kill), its attaches are
//! detached, as System V does at exit.
//!
//! Who may connect, and what each may do (issue #23, finding 7; issue
//! #27): the socket is created with `socket_mode` (default 0600: the
//! daemon's own user; 0660 with `group`; 0666: every local user) before
//! it listens, and a peer the mode does not admit (by `SO_PEERCRED`) is
//! closed at once. Every request is then checked against its caller's
//! credentials ([`super::creds`]) and the segment's owner, creator and
//! mode, as the kernel checks it. A file at the socket path that is not a
//! socket stops the start and is left alone; a socket file no daemon
//! listens on any more is replaced.

use super::creds::Caller;
pub use super::local_proto as proto;
use super::shm::{CtlOut, Dsm, SetArgs, ShmError, cmd};
use nix::libc;
use proto::{LocalMsg, MAX_MESSAGE_BYTES, MSG_BYTES, kind};
use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketType,
};
use std::collections::BTreeSet;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where a site's socket lives unless `cluster.toml` says otherwise.
pub fn default_socket_path(cluster_id: u64, site: &str) -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("mmulab-dsm-{cluster_id}-{site}.sock"))
}

/// A connected program, as the daemon sees it.
pub struct Client {
    sock: OwnedFd,
    /// The process using the connection: its connector, then whoever
    /// sent the latest record (a fork's child takes over the connection
    /// its parent prepared, and says so with `IDENT`).
    pid: AtomicI32,
    /// `SO_PEERCRED` of the connector.
    peer_uid: u32,
    peer_gid: u32,
    checks: CallerChecks,
    seq: AtomicU64,
    acks: Mutex<AckState>,
    cv: Condvar,
    /// The core's process numbers of this program's attaches.
    pub(crate) processes: Mutex<BTreeSet<u32>>,
    ack_timeout: Duration,
    site: String,
    /// The program's userfaultfd (the first one it passed), when it
    /// catches faults that way; a thread of the daemon serves it.
    pub(crate) uffd: Mutex<Option<Arc<super::uffd::Uffd>>>,
}

#[derive(Default)]
struct AckState {
    acked: u64,
    gone: bool,
}

impl Client {
    pub fn pid(&self) -> i32 {
        self.pid.load(Ordering::Relaxed)
    }

    pub fn name(&self) -> String {
        format!("program pid {}", self.pid())
    }

    /// Whether the program closed its end (it exited): the kernel says
    /// so at once, before this daemon reads the socket's end.
    pub(crate) fn hung_up(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.sock, PollFlags::RDHUP)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
            && fds[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP)
    }

    pub(crate) fn gone(&self) -> bool {
        self.acks.lock().expect("acks").gone
    }

    pub fn send(&self, m: &LocalMsg) -> bool {
        rustix::net::send(&self.sock, m.as_bytes(), SendFlags::NOSIGNAL).is_ok()
    }

    fn send_bytes(&self, b: &[u8]) -> bool {
        rustix::net::send(&self.sock, b, SendFlags::NOSIGNAL).is_ok()
    }

    /// Sends a record with a file descriptor (`SCM_RIGHTS`).
    pub fn send_fd(&self, m: &LocalMsg, fd: BorrowedFd<'_>) -> bool {
        let fds = [fd];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return false;
        }
        rustix::net::sendmsg(
            &self.sock,
            &[std::io::IoSlice::new(m.as_bytes())],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .is_ok()
    }

    /// Asks the program's service thread to set pages' protection;
    /// returns the sequence number to wait for when `ack` (else 0).
    pub fn protect(&self, process: u32, first: u64, count: u64, prot: u64, ack: bool) -> u64 {
        let mut m = LocalMsg::new(kind::PROTECT);
        m.id = if ack {
            self.seq.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            0
        };
        m.a = process as u64;
        m.b = first;
        m.c = count;
        m.d = prot;
        if !self.send(&m) {
            // The program is gone or not reading: it must not keep a right
            // the site gives away.
            self.kill("its socket refused a protection change");
        }
        m.id
    }

    /// Waits until the program has carried out protection change `seq`.
    /// A program that does not answer in time is killed: its mapping
    /// would otherwise keep a right the site gives away.
    pub fn wait_ack(&self, seq: u64) {
        let deadline = Instant::now() + self.ack_timeout;
        let mut st = self.acks.lock().expect("acks");
        let mut killed = false;
        while st.acked < seq && !st.gone {
            let now = Instant::now();
            if now >= deadline {
                if killed {
                    // Bounded: SIGKILL was sent; a process that cannot run
                    // its user code cannot touch the page either.
                    return;
                }
                drop(st);
                self.kill("no acknowledgement of a protection change in time");
                killed = true;
                st = self.acks.lock().expect("acks");
                continue;
            }
            st = self.cv.wait_timeout(st, deadline - now).expect("acks").0;
        }
    }

    pub(crate) fn kill(&self, why: &str) {
        if self.gone() {
            return;
        }
        eprintln!(
            "mmulab dsm site {}: {}: killed: {why}",
            self.site,
            self.name()
        );
        let pid = self.pid();
        if pid > 0 {
            // SAFETY: kill(2) on the pid the kernel gave with the peer's
            // latest record (SO_PEERCRED, SCM_CREDENTIALS).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = rustix::net::shutdown(&self.sock, rustix::net::Shutdown::Both);
    }

    /// The userfaultfd path: the page at `page_addr` (in the program)
    /// cannot be served; the program's service thread makes the faulter's
    /// retry a SIGBUS there and wakes it. `false` if the program is gone.
    pub fn lost(&self, page_addr: usize, reason: &str) -> bool {
        let mut m = LocalMsg::new(kind::LOST);
        m.a = page_addr as u64;
        m.set_text(reason);
        self.send(&m)
    }

    /// `ALIVE`, without waiting: a program that does not read its socket
    /// (stopped, or its buffer full) misses one, nobody else waits.
    fn alive(&self, every: Duration, timeout: Duration) {
        let mut m = LocalMsg::new(kind::ALIVE);
        m.a = every.as_millis() as u64;
        m.b = timeout.as_millis() as u64;
        let _ = rustix::net::send(
            &self.sock,
            m.as_bytes(),
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        );
    }

    /// Releases a faulter sleeping in the program's signal handler.
    pub fn wake(&self, slot: u64, value: u32, reason: &str) {
        let mut m = LocalMsg::new(kind::WAKE);
        m.a = slot;
        m.b = value as u64;
        m.set_text(reason);
        self.send(&m);
    }
}

/// The running local socket.
pub struct LocalServer {
    path: PathBuf,
    /// The socket file's identity (device, inode): only it is removed at
    /// the stop.
    file: (u64, u64),
    listener: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The thread that tells every program the daemon still runs
    /// ([`keep_alive`]).
    alive: Option<JoinHandle<()>>,
}

/// Who the socket admits: its mode, group and owner.
#[derive(Clone, Copy, Debug)]
struct Admission {
    mode: u32,
    gid: Option<u32>,
    owner: u32,
    checks: CallerChecks,
}

/// Whose credentials a call is checked against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CallerChecks {
    /// The calling thread's, at the time of the call (see
    /// [`super::creds`]).
    #[default]
    PerCall,
    /// A deliberately broken variant, for a negative control only: the
    /// connector's (`SO_PEERCRED`), as before issue #27 — a process that
    /// switches users keeps the first one's rights.
    ConnectorOnly,
}

impl Admission {
    /// Whether a peer with these credentials could have opened the socket
    /// file for writing (connect's check), root aside.
    fn admits(&self, uid: u32, gid: u32, pid: i32) -> bool {
        if uid == 0 || uid == self.owner {
            return uid == 0 || self.mode & 0o200 != 0;
        }
        let group = self.gid.is_some_and(|g| {
            g == gid || Caller::from_proc(pid, pid).is_some_and(|c| c.uid == uid && c.in_group(g))
        });
        if group {
            return self.mode & 0o020 != 0;
        }
        self.mode & 0o002 != 0
    }
}

/// Why the local socket could not be set up.
fn path_error(path: &Path, what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("{}: {what}", path.display()),
    )
}

/// Clears the way for a new socket at `path`: nothing there, or a socket
/// file no daemon listens on (left by a crash). Anything else stays.
fn clear_socket_path(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) => m,
    };
    if !meta.file_type().is_socket() {
        return Err(path_error(
            path,
            "exists and is not a socket; the site daemon will not remove it (choose another `socket =` in cluster.toml, or remove it yourself)",
        ));
    }
    let probe = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    match rustix::net::connect(&probe, &SocketAddrUnix::new(path)?) {
        Ok(()) => Err(path_error(path, "another site daemon listens here")),
        Err(rustix::io::Errno::CONNREFUSED) => std::fs::remove_file(path),
        Err(e) => Err(path_error(
            path,
            &format!("a socket that cannot be probed ({e}); not removed"),
        )),
    }
}

impl LocalServer {
    /// Binds `path` with the configured mode and group (see the module's
    /// notes) and serves programs.
    pub fn start(dsm: Arc<Dsm>, path: &Path) -> std::io::Result<LocalServer> {
        LocalServer::start_with(dsm, path, CallerChecks::PerCall)
    }

    /// [`LocalServer::start`] with a choice of credential checks (a
    /// negative control for the tests).
    #[doc(hidden)]
    pub fn start_with(
        dsm: Arc<Dsm>,
        path: &Path,
        checks: CallerChecks,
    ) -> std::io::Result<LocalServer> {
        let config = dsm.node().config();
        let mode = config.effective_socket_mode();
        let gid = config
            .socket_gid()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        clear_socket_path(path)?;
        let listener = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        // Every record carries its sender's pid, which the kernel vouches
        // for (accepted sockets inherit it).
        rustix::net::sockopt::set_socket_passcred(&listener, true)?;
        rustix::net::bind(&listener, &SocketAddrUnix::new(path)?)?;
        // Mode and group are set before `listen`: until then no one can
        // connect, whatever the umask made of the file.
        let set_up = (|| -> std::io::Result<(u64, u64)> {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            if let Some(g) = gid {
                std::os::unix::fs::chown(path, None, Some(g))?;
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            let m = std::fs::symlink_metadata(path)?;
            Ok((m.dev(), m.ino()))
        })();
        let file = match set_up {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: mode {mode:o}, group {gid:?}: {e}", path.display()),
                ));
            }
        };
        rustix::net::listen(&listener, 64)?;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (listener.clone(), stop.clone());
        let admission = Admission {
            mode,
            gid,
            // SAFETY: no preconditions.
            owner: unsafe { libc::geteuid() },
            checks,
        };
        let clients = Arc::new(Mutex::new(Vec::new()));
        let options = dsm.node().options();
        let (every, timeout) = (options.heartbeat, options.peer_timeout);
        let (s2, c2) = (stop.clone(), clients.clone());
        let alive = std::thread::Builder::new()
            .name("dsm-local-alive".into())
            .spawn(move || keep_alive(c2, s2, every, timeout))?;
        let thread = std::thread::Builder::new()
            .name("dsm-local".into())
            .spawn(move || accept_loop(dsm, l, s, admission, clients))?;
        Ok(LocalServer {
            path: path.to_path_buf(),
            file,
            listener,
            stop,
            thread: Some(thread),
            alive: Some(alive),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting; connected programs are left to the daemon's stop.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.alive.take() {
            let _ = t.join();
        }
        // Our socket file only: whatever replaced it stays.
        use std::os::unix::fs::MetadataExt;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Issue #23, finding 6: a program cannot tell a stopped daemon (SIGSTOP,
/// or a hung one) from a quiet one by its socket, which stays open. So
/// every `every` each connected program gets an `ALIVE`; a program that
/// hears nothing for `timeout` (the peers' timeout) takes the daemon for
/// gone, as its peers do, and fails its faults with SIGBUS. This thread
/// never waits on the core or on a program, so only a stopped (or
/// starved) daemon goes silent.
fn keep_alive(
    clients: Arc<Mutex<Vec<Weak<Client>>>>,
    stop: Arc<AtomicBool>,
    every: Duration,
    timeout: Duration,
) {
    // A stop is noticed within 50 ms whatever the interval.
    let tick = every.min(Duration::from_millis(50));
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next {
            next = Instant::now() + every;
            let now: Vec<Arc<Client>> = {
                let mut list = clients.lock().expect("clients");
                list.retain(|w| w.upgrade().is_some_and(|c| !c.gone()));
                list.iter().filter_map(Weak::upgrade).collect()
            };
            for c in now {
                c.alive(every, timeout);
            }
        }
        std::thread::sleep(tick);
    }
}

fn accept_loop(
    dsm: Arc<Dsm>,
    listener: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    admission: Admission,
    clients: Arc<Mutex<Vec<Weak<Client>>>>,
) {
    let site = dsm.node().config().name(dsm.node().site()).to_string();
    let mut refused = 0u64;
    // Issue #23, finding 5: an accept error (EMFILE) ended this loop for
    // good while peers still saw the site alive. Errors back off and are
    // retried; only a stop ends the loop.
    let mut backoff = super::listener::ACCEPT_BACKOFF_MIN;
    while !stop.load(Ordering::SeqCst) {
        let sock = match rustix::net::accept_with(&*listener, rustix::net::SocketFlags::CLOEXEC) {
            Ok(s) => s,
            Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => continue,
            Err(_) if stop.load(Ordering::SeqCst) => break,
            Err(_) => {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(super::listener::ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        backoff = super::listener::ACCEPT_BACKOFF_MIN;
        let Ok(cred) = rustix::net::sockopt::socket_peercred(&sock) else {
            continue;
        };
        let pid = cred.pid.as_raw_nonzero().get();
        let (uid, gid) = (cred.uid.as_raw(), cred.gid.as_raw());
        if !admission.admits(uid, gid, pid) {
            // The file's mode should have kept it out (a chmod since, or
            // a descriptor passed on): closed at once, nothing served.
            refused += 1;
            if refused <= 10 || refused.is_power_of_two() {
                eprintln!(
                    "mmulab dsm site {site}: local socket: refused pid {pid} (uid {uid}, gid {gid}): socket_mode {:o} does not admit it ({refused} refused so far)",
                    admission.mode
                );
            }
            continue;
        }
        // A program that stops reading cannot stall the daemon forever.
        let _ = rustix::net::sockopt::set_socket_timeout(
            &sock,
            rustix::net::sockopt::Timeout::Send,
            Some(Duration::from_secs(5)),
        );
        let options = dsm.node().options();
        let client = Arc::new(Client {
            sock,
            pid: AtomicI32::new(pid),
            peer_uid: uid,
            peer_gid: gid,
            checks: admission.checks,
            seq: AtomicU64::new(0),
            acks: Mutex::new(AckState::default()),
            cv: Condvar::new(),
            processes: Mutex::new(BTreeSet::new()),
            ack_timeout: options.program_ack_timeout,
            site: dsm.node().config().name(dsm.node().site()).to_string(),
            uffd: Mutex::new(None),
        });
        // The first `ALIVE` before anything else: the program knows the
        // silence limit from its first request on.
        client.alive(options.heartbeat, options.peer_timeout);
        clients
            .lock()
            .expect("clients")
            .push(Arc::downgrade(&client));
        let (tx, rx) = mpsc::channel();
        let c = client.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("dsm-prog-{pid}"))
            .spawn(move || read_program(c, tx));
        if spawned.is_err() {
            continue;
        }
        let d = dsm.clone();
        let _ = std::thread::Builder::new()
            .name(format!("dsm-work-{pid}"))
            .spawn(move || serve_program(d, client, rx));
    }
}

/// A record as the worker gets it: with the file descriptor that came
/// along (a `REGISTER`'s userfaultfd) and the sender's kernel credentials.
struct Received {
    msg: LocalMsg,
    fd: Option<OwnedFd>,
    /// `SCM_CREDENTIALS`: pid, uid, gid (None: none came).
    scm: Option<(i32, u32, u32)>,
}

/// The reader: acknowledgements at once, everything else to the worker.
fn read_program(c: Arc<Client>, tx: mpsc::Sender<Received>) {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1), ScmCredentials(1))];
    loop {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let n = match rustix::net::recvmsg(
            &c.sock,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) if r.bytes > 0 => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => continue,
            _ => break,
        };
        let mut fd = None;
        let mut scm = None;
        for msg in control.drain() {
            match msg {
                RecvAncillaryMessage::ScmRights(fds) => {
                    for f in fds {
                        // The first one; any other is closed.
                        fd.get_or_insert(f);
                    }
                }
                RecvAncillaryMessage::ScmCredentials(u) => {
                    scm = Some((u.pid.as_raw_nonzero().get(), u.uid.as_raw(), u.gid.as_raw()));
                }
                _ => {}
            }
        }
        let Some(m) = LocalMsg::from_bytes(&buf[..n]) else {
            continue;
        };
        if let Some((pid, _, _)) = scm {
            c.pid.store(pid, Ordering::Relaxed);
        }
        if m.kind == kind::ACK {
            let mut st = c.acks.lock().expect("acks");
            st.acked = st.acked.max(m.id);
            c.cv.notify_all();
        } else if tx.send(Received { msg: m, fd, scm }).is_err() {
            break;
        }
    }
    c.acks.lock().expect("acks").gone = true;
    c.cv.notify_all();
}

fn reply(c: &Client, req: &LocalMsg, result: Result<[u64; 4], ShmError>) {
    let mut m = LocalMsg::new(kind::REPLY);
    m.id = req.id;
    match result {
        Ok([a, b, cc, d]) => {
            (m.a, m.b, m.c, m.d) = (a, b, cc, d);
        }
        Err(e) => m.err = e.errno(),
    }
    c.send(&m);
}

/// The caller of a request: the thread it names, within the process the
/// kernel names (see [`super::creds`]).
fn caller_of(c: &Client, r: &Received) -> Caller {
    if c.checks == CallerChecks::ConnectorOnly {
        let pid = c.pid();
        return Caller::from_proc(pid, pid)
            .filter(|p| p.uid == c.peer_uid)
            .unwrap_or_else(|| Caller::from_scm(pid, c.peer_uid, c.peer_gid));
    }
    let (pid, uid, gid) = r.scm.unwrap_or((c.pid(), c.peer_uid, c.peer_gid));
    Caller::from_proc(pid, r.msg.tid as i32).unwrap_or_else(|| Caller::from_scm(pid, uid, gid))
}

/// `shmid_ds` as the words of a `CTL` answer ([`proto::STAT_WORDS`]).
fn stat_words(st: &super::shm::ShmStat) -> [u64; 14] {
    [
        st.key as u32 as u64,
        st.uid as u64,
        st.gid as u64,
        st.cuid as u64,
        st.cgid as u64,
        st.mode as u64,
        (st.id as u32 >> super::sysv::IPCMNI_SHIFT) as u64,
        st.size as u64,
        st.atime as u64,
        st.dtime as u64,
        st.ctime as u64,
        st.cpid as u32 as u64,
        st.lpid as u32 as u64,
        st.nattch as u64,
    ]
}

fn ctl_reply(c: &Client, req: &LocalMsg, result: Result<CtlOut, ShmError>) {
    let mut m = LocalMsg::new(kind::REPLY);
    m.id = req.id;
    match result {
        Err(e) => m.err = e.errno(),
        Ok(out) => {
            m.a = out.ret(req.b as i32) as u32 as u64;
            match out {
                CtlOut::Done => {}
                CtlOut::Stat(st) => m.set_words(&stat_words(&st)),
                CtlOut::Info(_, i) => {
                    m.set_words(&[i.shmmax, i.shmmin, i.shmmni, i.shmseg, i.shmall])
                }
                CtlOut::Usage(_, u) => m.set_words(&[u.used_ids, u.shm_tot, u.shm_rss]),
            }
        }
    }
    c.send(&m);
}

/// The worker: one program's requests and faults, in order.
fn serve_program(dsm: Arc<Dsm>, c: Arc<Client>, rx: mpsc::Receiver<Received>) {
    for r in rx {
        let m = r.msg;
        match m.kind {
            kind::FAULT => dsm.node().remote_fault(&c, &m),
            kind::IDENT => {}
            kind::GET => {
                let caller = caller_of(&c, &r);
                let res =
                    dsm.shmget_as(&caller, m.a as u32 as i32, m.b as usize, m.c as u32 as i32);
                reply(&c, &m, res.map(|id| [id as u64, 0, 0, 0]));
            }
            kind::ATTACH => {
                // On success the core already sent ATTACH_OK with the memfd.
                let caller = caller_of(&c, &r);
                let uffd = m.c == proto::mode::UFFD;
                if let Err(e) = dsm.shmat_remote(
                    &caller,
                    m.a as u32 as i32,
                    m.b as i32,
                    uffd,
                    c.clone(),
                    m.id,
                ) {
                    reply(&c, &m, Err(e));
                }
            }
            kind::CLONE => {
                // fork: the child's copy of a mapping, attached before
                // fork returns; ATTACH_OK comes from the core.
                let caller = caller_of(&c, &r);
                let readonly = m.b as i32 & super::shm::SHM_RDONLY != 0;
                let uffd = m.c == proto::mode::UFFD;
                if let Err(e) =
                    dsm.clone_remote(&caller, m.a as u32, readonly, uffd, c.clone(), m.id)
                {
                    reply(&c, &m, Err(e));
                }
            }
            kind::REGISTER => {
                let res = dsm.node().register_remote(&c, &m, r.fd);
                reply(&c, &m, res.map(|_| [0; 4]));
            }
            kind::DETACH => {
                let res = dsm.shmdt_process(m.a as u32, c.pid());
                c.processes.lock().expect("processes").remove(&(m.a as u32));
                if m.id != 0 {
                    reply(&c, &m, res.map(|_| [0; 4]));
                }
            }
            kind::REMAP => {
                // The kernel's remap_file_pages unmaps, then maps the
                // segment again: the unmap of the last attach of a removed
                // segment destroys it, and the map then fails.
                let process = m.a as u32;
                let res = match dsm.last_attach_of_removed(process) {
                    Ok(true) if m.b == 1 => {
                        let d = dsm.shmdt_process(process, c.pid());
                        c.processes.lock().expect("processes").remove(&process);
                        d.map(|_| [0, 0, 1, 0])
                    }
                    Ok(_) => Ok([0; 4]),
                    Err(e) => Err(e),
                };
                reply(&c, &m, res);
            }
            kind::CTL => {
                let caller = caller_of(&c, &r);
                let set = (m.b as i32 == cmd::IPC_SET).then_some(SetArgs {
                    uid: m.d as u32,
                    gid: m.e as u32,
                    mode: m.c as u32,
                });
                let res = dsm.ctl(&caller, m.a as u32 as i32, m.b as u32 as i32, set);
                ctl_reply(&c, &m, res);
            }
            kind::SET_DELTA => {
                let res = dsm.set_delta(m.a as u32 as i32, m.b as u32);
                reply(&c, &m, res.map(|_| [0; 4]));
            }
            kind::STATUS => {
                // The status as JSON (`runtime::status`), cut to one
                // message; a core that does not answer is an error text.
                let room = MAX_MESSAGE_BYTES - MSG_BYTES;
                let body = match dsm.status() {
                    Ok(s) => s.to_json_within(room),
                    Err(e) => serde_json::json!({ "error": e }).to_string(),
                };
                let mut head = LocalMsg::new(kind::STATUS_TEXT);
                head.id = m.id;
                let mut out = head.as_bytes().to_vec();
                out.extend_from_slice(&body.as_bytes()[..body.len().min(room)]);
                c.send_bytes(&out);
            }
            _ => {}
        }
    }
    // The program is gone: System V detaches at exit.
    let processes: Vec<u32> = std::mem::take(&mut *c.processes.lock().expect("processes"))
        .into_iter()
        .collect();
    for p in processes {
        let _ = dsm.shmdt_process(p, c.pid());
    }
}

/// `mmulab dsm status`: asks the daemon at `path` for its status.
pub fn status(path: &Path, timeout: Duration) -> std::io::Result<super::status::SiteStatus> {
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::connect(&sock, &SocketAddrUnix::new(path)?)?;
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(timeout),
    )?;
    let mut m = LocalMsg::new(kind::STATUS);
    m.id = 1;
    rustix::net::send(&sock, m.as_bytes(), SendFlags::NOSIGNAL)?;
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    // The daemon's `ALIVE`s (one at once on connection) come before it.
    let n = loop {
        let n = rustix::net::recv(&sock, &mut buf, RecvFlags::empty())?.0;
        if n < MSG_BYTES {
            return Err(std::io::Error::other("short status reply"));
        }
        if LocalMsg::from_bytes(&buf[..n]).is_none_or(|m| m.kind != kind::ALIVE) {
            break n;
        }
    };
    let body = &buf[MSG_BYTES..n];
    if let Ok(s) = serde_json::from_slice::<super::status::SiteStatus>(body) {
        return Ok(s);
    }
    let why = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(String::from))
        .unwrap_or_else(|| {
            format!(
                "a status reply that is not a status (a daemon of another mmulab version?): {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )
        });
    Err(std::io::Error::other(why))
}
