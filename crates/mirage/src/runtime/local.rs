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

pub use super::local_proto as proto;
use super::shm::{Dsm, ShmCtl, ShmError};
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
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
    pub pid: i32,
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
    pub fn name(&self) -> String {
        format!("program pid {}", self.pid)
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
        if self.pid > 0 {
            // SAFETY: kill(2) on the peer's pid from SO_PEERCRED.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
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
    listener: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LocalServer {
    /// Binds `path` (a stale socket file is replaced) and serves programs.
    pub fn start(dsm: Arc<Dsm>, path: &Path) -> std::io::Result<LocalServer> {
        let _ = std::fs::remove_file(path);
        let listener = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        rustix::net::bind(&listener, &SocketAddrUnix::new(path)?)?;
        rustix::net::listen(&listener, 64)?;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (listener.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("dsm-local".into())
            .spawn(move || accept_loop(dsm, l, s))?;
        Ok(LocalServer {
            path: path.to_path_buf(),
            listener,
            stop,
            thread: Some(thread),
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
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(dsm: Arc<Dsm>, listener: Arc<OwnedFd>, stop: Arc<AtomicBool>) {
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
        let pid = rustix::net::sockopt::socket_peercred(&sock)
            .map_or(0, |c| c.pid.as_raw_nonzero().get());
        // A program that stops reading cannot stall the daemon forever.
        let _ = rustix::net::sockopt::set_socket_timeout(
            &sock,
            rustix::net::sockopt::Timeout::Send,
            Some(Duration::from_secs(5)),
        );
        let options = dsm.node().options();
        let client = Arc::new(Client {
            sock,
            pid,
            seq: AtomicU64::new(0),
            acks: Mutex::new(AckState::default()),
            cv: Condvar::new(),
            processes: Mutex::new(BTreeSet::new()),
            ack_timeout: options.program_ack_timeout,
            site: dsm.node().config().name(dsm.node().site()).to_string(),
            uffd: Mutex::new(None),
        });
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

/// The reader: acknowledgements at once, everything else (with a file
/// descriptor that came along: a `REGISTER`'s userfaultfd) to the worker.
fn read_program(c: Arc<Client>, tx: mpsc::Sender<(LocalMsg, Option<OwnedFd>)>) {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
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
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for f in fds {
                    // The first one; any other is closed.
                    fd.get_or_insert(f);
                }
            }
        }
        let Some(m) = LocalMsg::from_bytes(&buf[..n]) else {
            continue;
        };
        if m.kind == kind::ACK {
            let mut st = c.acks.lock().expect("acks");
            st.acked = st.acked.max(m.id);
            c.cv.notify_all();
        } else if tx.send((m, fd)).is_err() {
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

/// The worker: one program's requests and faults, in order.
fn serve_program(dsm: Arc<Dsm>, c: Arc<Client>, rx: mpsc::Receiver<(LocalMsg, Option<OwnedFd>)>) {
    for (m, fd) in rx {
        match m.kind {
            kind::FAULT => dsm.node().remote_fault(&c, &m),
            kind::GET => {
                let r = dsm.shmget(m.a as u32 as i32, m.b as usize, m.c as u32 as i32);
                reply(&c, &m, r.map(|id| [id as u64, 0, 0, 0]));
            }
            kind::ATTACH => {
                // On success the core already sent ATTACH_OK with the memfd.
                let uffd = m.c == proto::mode::UFFD;
                if let Err(e) =
                    dsm.shmat_remote(m.a as u32 as i32, m.b as i32, uffd, c.clone(), m.id)
                {
                    reply(&c, &m, Err(e));
                }
            }
            kind::CLONE => {
                // fork: the child's copy of a mapping, attached before
                // fork returns; ATTACH_OK comes from the core.
                let readonly = m.b as i32 & super::shm::SHM_RDONLY != 0;
                let uffd = m.c == proto::mode::UFFD;
                if let Err(e) = dsm.clone_remote(m.a as u32, readonly, uffd, c.clone(), m.id) {
                    reply(&c, &m, Err(e));
                }
            }
            kind::REGISTER => {
                let r = dsm.node().register_remote(&c, &m, fd);
                reply(&c, &m, r.map(|_| [0; 4]));
            }
            kind::DETACH => {
                let r = dsm.shmdt_process(m.a as u32);
                c.processes.lock().expect("processes").remove(&(m.a as u32));
                if m.id != 0 {
                    reply(&c, &m, r.map(|_| [0; 4]));
                }
            }
            kind::CTL => {
                let cmd = match m.b as i32 {
                    0 => Some(ShmCtl::Rmid),
                    1 => Some(ShmCtl::Set {
                        mode: m.c as u32 & 0o777,
                    }),
                    2 => Some(ShmCtl::Stat),
                    _ => None,
                };
                let r = match cmd {
                    None => Err(ShmError::Invalid),
                    Some(cmd) => dsm.shmctl(m.a as u32 as i32, cmd).map(|st| match st {
                        Some(st) => [
                            st.key as u32 as u64,
                            st.size as u64,
                            st.mode as u64,
                            st.nattch as u64,
                        ],
                        None => [0; 4],
                    }),
                };
                reply(&c, &m, r);
            }
            kind::SET_DELTA => {
                let r = dsm.set_delta(m.a as u32 as i32, m.b as u32);
                reply(&c, &m, r.map(|_| [0; 4]));
            }
            kind::STATUS => {
                let text = dsm.status_text();
                let mut head = LocalMsg::new(kind::STATUS_TEXT);
                head.id = m.id;
                let mut out = head.as_bytes().to_vec();
                let room = MAX_MESSAGE_BYTES - MSG_BYTES;
                out.extend_from_slice(&text.as_bytes()[..text.len().min(room)]);
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
        let _ = dsm.shmdt_process(p);
    }
}

/// `mmulab dsm status`: asks the daemon at `path` for its status text.
pub fn status(path: &Path, timeout: Duration) -> std::io::Result<String> {
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
    let n = rustix::net::recv(&sock, &mut buf, RecvFlags::empty())?.0;
    if n < MSG_BYTES {
        return Err(std::io::Error::other("short status reply"));
    }
    Ok(String::from_utf8_lossy(&buf[MSG_BYTES..n]).into_owned())
}
