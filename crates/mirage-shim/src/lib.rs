//! `libmmulab_shm.so`: the Mirage DSM for C programs (issue #7, "API and
//! shim").
//!
//! - The C API of `mmulab_dsm.h`: `mmulab_shmget`, `mmulab_shmat`,
//!   `mmulab_shmdt`, `mmulab_shmctl` (System V semantics) and
//!   `mmulab_set_delta` (Δ per segment, in ticks, fleisch89 §8).
//! - Under `LD_PRELOAD` it also defines `shmget`, `shmat`, `shmdt` and
//!   `shmctl`, so an unmodified program shares memory through the site
//!   daemon named by `MMULAB_DSM_SOCKET` (`mmulab dsm run` sets both). With
//!   that variable unset, the four calls go to the C library as usual.
//!
//! How a program and its site daemon share a segment: the daemon owns one
//! memfd per segment (the site's one copy, shared by every local process)
//! and sends it with the attach. Faults are caught one of two ways, chosen
//! once per process at its first connection (`MMULAB_DSM_FAULT_PATH` =
//! `mprotect`, `uffd` or `uffd-user`; unset: the best the kernel offers;
//! `MMULAB_DSM_VERBOSE` set: the choice is printed on stderr, once):
//!
//! - **userfaultfd** (design (a) of issue #7): userfaultfd is per address
//!   space, so the program opens its own (full, else
//!   `UFFD_USER_MODE_ONLY`), maps the memfd with its access, registers
//!   the mapping in missing + write-protect modes, write-protects it whole
//!   and passes the fd to the daemon over the local socket (`REGISTER`,
//!   `SCM_RIGHTS`). The attach completes with the daemon's answer, once it
//!   lifted the protection of the pages held for writing. From then on the
//!   daemon's thread reads the program's faults from that fd and wakes
//!   them; it takes a write right away with `UFFDIO_WRITEPROTECT` through
//!   the same fd (synchronous: when the ioctl returns, the program's
//!   mapping has lost the right) and every right by punching the page out
//!   of the memfd (a later access is a missing fault). No thread of the
//!   daemon or of this library touches DSM memory through a mapping that
//!   can fault. A page that cannot be served (`LOST`) is replaced here by
//!   a mapping past the end of an empty memfd before the faulter is
//!   woken: SIGBUS at that address. Under `UFFD_USER_MODE_ONLY` a system
//!   call touching a page not held (`read(fd, shm, n)`) gets EFAULT, as
//!   on the mprotect path; with a full userfaultfd the daemon serves it.
//! - **mprotect + SIGSEGV**: the program maps the memfd with no access and
//!   the daemon sets each page's protection through this library's service
//!   thread (`PROTECT`), which acknowledges a reduction only after its
//!   `mprotect` returned: a page leaves the site only after every local
//!   mapping has lost the right. A fault (SIGSEGV on a DSM address, typed
//!   from the x86-64 error code) sends one record to the daemon and
//!   sleeps on a futex until the daemon's `WAKE`.
//!
//! System V as Linux gives it (issue #27): every request names its calling
//! thread, and the daemon checks it against that thread's credentials as
//! the kernel would (the kernel vouches for the pid); every `shmctl`
//! command is carried, with `shmctl`'s buffer read and written here as
//! the kernel copies it (a bad address is EFAULT). Raw `shmget`, `shmat`,
//! `shmdt`, `shmctl` and `remap_file_pages` system calls are trapped by a
//! seccomp filter installed when the library loads ([`trap`]), and
//! `remap_file_pages` of a DSM mapping never maps the segment around the
//! protocol ([`remap_dsm`]). A `SHM_RDONLY` attach gets a read-only
//! descriptor, which userfaultfd cannot register: such an attach is on
//! the mprotect path whatever the process's path.
//!
//! Limits: a statically linked program never loads this library and uses
//! the kernel's own System V segments (`mmulab dsm run` warns); a program
//! that installs its own SIGSEGV handler after attaching takes the faults
//! away from the DSM. A child of `fork` is re-armed before `fork`
//! returns (`pthread_atfork`, below): on the userfaultfd path its
//! inherited mappings lose their registration in the fork (an
//! unregistered shared mapping would zero-fill a missing page into the
//! site's copy), so the child opens its own userfaultfd, registers and
//! write-protects them and waits for the daemon's answer. A raw `clone`
//! or `vfork` is not re-armed.

mod daemon_gone;
pub mod proto;

// The daemon's userfaultfd wrapper, one definition for both.
#[allow(dead_code)]
#[path = "../../mirage/src/runtime/uffd.rs"]
mod uffd;

use nix::libc;
use proto::{LocalMsg, MAX_MESSAGE_BYTES, MSG_BYTES, WaitSlot, kind, mode, wake};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketType,
};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Condvar, Mutex, Once};
use std::time::{Duration, Instant};

/// How long an API call waits for the daemon.
const API_TIMEOUT: Duration = Duration::from_secs(60);

const IPC_SET: i32 = 1;
const IPC_STAT: i32 = 2;
const IPC_INFO: i32 = 3;
const SHM_STAT: i32 = 13;
const SHM_INFO: i32 = 14;
const SHM_STAT_ANY: i32 = 15;
const SHM_RDONLY: i32 = 0o10000;
const SHM_RND: i32 = 0o20000;
const SHM_REMAP: i32 = 0o40000;
const SHM_EXEC: i32 = 0o100000;
/// `SHMLBA` on x86-64 (and the other architectures this shim builds for
/// without `__ARCH_FORCE_SHMLBA`): the page size.
fn shmlba() -> usize {
    page_size()
}

fn gettid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() as u32 }
}

fn page_size() -> usize {
    // SAFETY: no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

fn set_errno(e: i32) {
    // SAFETY: the thread's errno.
    unsafe { *libc::__errno_location() = e };
}

// ---------------------------------------------------------------------------
// The connection to the site daemon.

struct Client {
    sock: OwnedFd,
    /// Whether this connection's daemon has the userfaultfd already.
    uffd_sent: AtomicBool,
    next_id: AtomicU64,
    pending: Mutex<BTreeMap<u64, Pending>>,
    cv: Condvar,
    /// Attach mappings by the daemon's process number: (base, len).
    maps: Mutex<BTreeMap<u32, Mapping>>,
}

#[derive(Clone, Copy)]
struct Mapping {
    base: usize,
    len: usize,
    slot: usize,
    readonly: bool,
    /// `SHM_EXEC`: granted pages are executable too.
    exec: bool,
}

enum Pending {
    /// An attach asks for this address (0: anywhere), with its `shmat`
    /// flags.
    Waiting {
        addr: usize,
        flags: i32,
    },
    /// The userfaultfd path: mapped and registered at `base`, waiting
    /// for the daemon's answer to `REGISTER`.
    Registering {
        base: usize,
        process: u32,
    },
    Done {
        reply: LocalMsg,
        base: usize,
    },
}

/// Set when the daemon's connection is gone: sleeping faulters fail.
static DEAD: AtomicBool = AtomicBool::new(false);
/// The socket, for the signal handler.
static SOCK_FD: AtomicI32 = AtomicI32::new(-1);

/// The connection in use (a fork's child gets its own).
static CURRENT: AtomicPtr<Client> = AtomicPtr::new(std::ptr::null_mut());
static CONNECTING: Mutex<()> = Mutex::new(());

fn client() -> Option<&'static Client> {
    let p = CURRENT.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: clients are leaked, never freed.
        return Some(unsafe { &*p });
    }
    let path = socket_path()?;
    let _g = CONNECTING.lock().unwrap_or_else(|e| e.into_inner());
    let p = CURRENT.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as above.
        return Some(unsafe { &*p });
    }
    choose_fault_path();
    match open_socket(path) {
        Ok(sock) => Some(adopt(sock, BTreeMap::new())),
        Err(e) => {
            eprintln!(
                "mmulab dsm: cannot reach the site daemon at {}: {e}",
                std::path::Path::new(&path).display()
            );
            None
        }
    }
}

fn open_socket(path: &std::ffi::OsStr) -> std::io::Result<OwnedFd> {
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::connect(&sock, &SocketAddrUnix::new(path)?)?;
    Ok(sock)
}

/// Makes `sock` the connection in use, with its service thread.
fn adopt(sock: OwnedFd, maps: BTreeMap<u32, Mapping>) -> &'static Client {
    SOCK_FD.store(sock.as_raw_fd(), Ordering::Release);
    DEAD.store(false, Ordering::Release);
    let c: &'static Client = Box::leak(Box::new(Client {
        sock,
        uffd_sent: AtomicBool::new(false),
        next_id: AtomicU64::new(1),
        pending: Mutex::new(BTreeMap::new()),
        cv: Condvar::new(),
        maps: Mutex::new(maps),
    }));
    CURRENT.store(c as *const Client as *mut Client, Ordering::Release);
    ATFORK.call_once(|| {
        // SAFETY: registers plain extern "C" handlers.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
    let _ = std::thread::Builder::new()
        .name("mmulab-dsm-service".into())
        .spawn(move || service(c));
    c
}

/// Sends one record, with a file descriptor as `SCM_RIGHTS` when given.
fn send_with_fd(sock: &OwnedFd, m: &LocalMsg, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    let Some(fd) = fd else {
        rustix::net::send(sock, m.as_bytes(), SendFlags::NOSIGNAL)?;
        return Ok(());
    };
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("no room for SCM_RIGHTS"));
    }
    rustix::net::sendmsg(
        sock,
        &[std::io::IoSlice::new(m.as_bytes())],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------
// The fault path, chosen once per process at its first connection: the
// program's own userfaultfd (it is per address space, so the shim opens
// it), registered in missing + write-protect modes on every attach
// mapping and passed to the site daemon, whose thread serves the faults
// and sets write protection through it; else mprotect + SIGSEGV with this
// library's service thread and signal handler. `MMULAB_DSM_FAULT_PATH`
// (`mprotect`, `uffd`, `uffd-user`) chooses; unset, the best the kernel
// offers: a full userfaultfd, else `UFFD_USER_MODE_ONLY`, else mprotect.

/// This process's userfaultfd (null: the mprotect path). Leaked, never
/// freed; a fork's child opens its own.
static UFFD: AtomicPtr<uffd::Uffd> = AtomicPtr::new(std::ptr::null_mut());
static FAULT_PATH: Once = Once::new();

const PATH_MPROTECT: &str = "mprotect+SIGSEGV";
const PATH_UFFD: &str = "userfaultfd (missing + write-protect)";
const PATH_UFFD_USER: &str = "userfaultfd user-mode-only (missing + write-protect)";

fn current_uffd() -> Option<&'static uffd::Uffd> {
    let p = UFFD.load(Ordering::Acquire);
    // SAFETY: userfaultfds are leaked, never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn path_name(u: Option<&uffd::Uffd>) -> &'static str {
    match u {
        None => PATH_MPROTECT,
        Some(u) if u.user_mode_only => PATH_UFFD_USER,
        Some(_) => PATH_UFFD,
    }
}

fn choose_fault_path() {
    FAULT_PATH.call_once(|| {
        let full = || uffd::Uffd::open(false).ok().filter(uffd::works);
        let user = || uffd::Uffd::open(true).ok().filter(uffd::works);
        let want = std::env::var(proto::FAULT_PATH_ENV).unwrap_or_default();
        let (u, note) = match want.as_str() {
            "mprotect" => (None, ""),
            "uffd" => (full(), " (MMULAB_DSM_FAULT_PATH=uffd is not offered here)"),
            "uffd-user" => (
                user(),
                " (MMULAB_DSM_FAULT_PATH=uffd-user is not offered here)",
            ),
            _ => (full().or_else(user), ""),
        };
        let note = if u.is_none() { note } else { "" };
        if let Some(u) = u {
            UFFD.store(Box::into_raw(Box::new(u)), Ordering::Release);
        }
        if std::env::var_os(proto::VERBOSE_ENV).is_some() || !note.is_empty() {
            eprintln!(
                "mmulab dsm: pid {}: fault path: {}{note}",
                std::process::id(),
                path_name(current_uffd())
            );
        }
    });
}

// ---------------------------------------------------------------------------
// fork: the child's mappings are under the daemon's control before fork
// returns. In the parent, before the fork, a second connection asks the
// daemon to attach a copy of every mapping for the child (with the
// protections in force); the child adopts that connection. A protection
// change the daemon makes meanwhile is carried out on the parent's mapping
// (the child inherits it) or, after the fork, by the child's own service
// thread before it acknowledges.

static ATFORK: Once = Once::new();

struct ForkPrep {
    sock: OwnedFd,
    /// The child's attaches: new process number → the inherited mapping.
    maps: BTreeMap<u32, Mapping>,
}

static PREP: Mutex<Option<ForkPrep>> = Mutex::new(None);

extern "C" fn fork_prepare() {
    // A negative control for the tests only: a child left unarmed.
    if std::env::var_os("MMULAB_DSM_NO_FORK_REARM").is_some() {
        return;
    }
    let p = CURRENT.load(Ordering::Acquire);
    if p.is_null() {
        return;
    }
    // SAFETY: clients are leaked, never freed.
    let c = unsafe { &*p };
    let maps: Vec<(u32, Mapping)> = c
        .maps
        .lock()
        .expect("maps")
        .iter()
        .map(|(&k, &m)| (k, m))
        .collect();
    if maps.is_empty() {
        return;
    }
    let Some(path) = socket_path() else {
        return;
    };
    let prep = clone_for_child(path, &maps);
    match prep {
        Ok(prep) => *PREP.lock().unwrap_or_else(|e| e.into_inner()) = Some(prep),
        Err(e) => eprintln!("mmulab dsm: fork: the child's mappings are not re-armed: {e}"),
    }
}

fn clone_for_child(path: &std::ffi::OsStr, maps: &[(u32, Mapping)]) -> std::io::Result<ForkPrep> {
    let sock = open_socket(path)?;
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(10)),
    )?;
    for (i, (process, m)) in maps.iter().enumerate() {
        let mut r = LocalMsg::new(kind::CLONE);
        r.id = i as u64 + 1;
        r.tid = gettid();
        r.a = *process as u64;
        r.b = if m.readonly { SHM_RDONLY as u64 } else { 0 };
        // A read-only attach is always on the mprotect path (see
        // `mmulab_shmat`).
        r.c = if current_uffd().is_some() && !m.readonly {
            mode::UFFD
        } else {
            mode::MPROTECT
        };
        rustix::net::send(&sock, r.as_bytes(), SendFlags::NOSIGNAL)?;
    }
    let mut child: BTreeMap<u32, Mapping> = BTreeMap::new();
    let mut answered = 0;
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    while answered < maps.len() {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &sock,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        // The memfd is closed at once: the child has the mapping already.
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                fds.for_each(drop);
            }
        }
        let Some(m) = LocalMsg::from_bytes(&buf[..got.bytes]) else {
            return Err(std::io::Error::other("the daemon hung up"));
        };
        match m.kind {
            kind::ATTACH_OK => {
                let (_, parent_map) = maps[(m.id - 1) as usize];
                child.insert(m.a as u32, parent_map);
                answered += 1;
            }
            kind::REPLY => {
                return Err(std::io::Error::from_raw_os_error(m.err.max(1)));
            }
            kind::PROTECT => {
                // For the child's copy; the mapping is still the
                // parent's, which the child inherits.
                if let Some(map) = child.get(&(m.a as u32)) {
                    protect_range(map, &m);
                }
                if m.id != 0 {
                    let mut ack = LocalMsg::new(kind::ACK);
                    ack.id = m.id;
                    rustix::net::send(&sock, ack.as_bytes(), SendFlags::NOSIGNAL)?;
                }
            }
            _ => {}
        }
    }
    rustix::net::sockopt::set_socket_timeout(&sock, rustix::net::sockopt::Timeout::Recv, None)?;
    Ok(ForkPrep { sock, maps: child })
}

extern "C" fn fork_parent() {
    // The parent's copy of the child's connection goes (if the fork
    // failed, that ends the clones).
    drop(PREP.lock().unwrap_or_else(|e| e.into_inner()).take());
}

extern "C" fn fork_child() {
    // The parent's userfaultfd serves the parent's address space: the
    // child closes its copy and opens its own (same kind).
    let parent = UFFD.swap(std::ptr::null_mut(), Ordering::AcqRel);
    let mut own: Option<std::io::Result<uffd::Uffd>> = None;
    if !parent.is_null() {
        // SAFETY: the leaked parent's userfaultfd; only its fd is closed
        // (the struct is never dropped).
        let user_mode_only = unsafe {
            libc::close((*parent).raw());
            (*parent).user_mode_only
        };
        own = Some(uffd::Uffd::open(user_mode_only));
    }
    // The parent's connection is the parent's: the child's copy goes, so
    // that the daemon sees the parent's exit when it happens (a socket
    // still open in a child would hide it).
    let old = CURRENT.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: the leaked parent's client; only this process's copy of
        // its fd is closed (the struct is never dropped or used again).
        unsafe { libc::close((*old).sock.as_raw_fd()) };
    }
    SOCK_FD.store(-1, Ordering::Release);
    let prep = PREP.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(prep) = prep else {
        // No DSM mappings (or re-arming switched off): the child connects
        // afresh when it needs to.
        if let Some(Ok(u)) = own {
            UFFD.store(Box::into_raw(Box::new(u)), Ordering::Release);
        }
        CURRENT.store(std::ptr::null_mut(), Ordering::Release);
        return;
    };
    for (&process, m) in &prep.maps {
        TABLE[m.slot].process.store(process, Ordering::Release);
    }
    if let Some(own) = own {
        // The inherited mappings lost their userfaultfd registration in
        // the fork (no UFFD_FEATURE_EVENT_FORK): an access now would
        // bypass the DSM (a missing page would be zero-filled into the
        // site's copy). Re-arm before fork returns.
        let u = match own {
            Ok(u) => Some(u),
            Err(e) => {
                eprintln!(
                    "mmulab dsm: fork: no userfaultfd in the child ({e}); its mappings fall back to mprotect+SIGSEGV"
                );
                None
            }
        };
        if let Err(e) = rearm_child(&prep, u.as_ref()) {
            // Nothing left to serve the mappings: they must not be used.
            for m in prep.maps.values() {
                // SAFETY: the child's own copies of its attach mappings.
                unsafe { libc::mprotect(m.base as *mut c_void, m.len, libc::PROT_NONE) };
            }
            eprintln!("mmulab dsm: fork: the child's mappings are not re-armed: {e}");
        }
        if let Some(u) = u {
            UFFD.store(Box::into_raw(Box::new(u)), Ordering::Release);
        }
    }
    let c = adopt(prep.sock, prep.maps);
    // The connection was opened by the parent: the daemon learns that
    // this process (the kernel gives its pid) uses it now.
    let mut ident = LocalMsg::new(kind::IDENT);
    ident.tid = gettid();
    c.send(&ident);
}

/// The child of a fork on the userfaultfd path: registers every inherited
/// mapping with the child's own userfaultfd `u` and write-protects it
/// whole (or, without one, makes it inaccessible), tells the daemon
/// (`REGISTER`, the fd with the first) and waits for its answers, which
/// set the present protections.
fn rearm_child(prep: &ForkPrep, u: Option<&uffd::Uffd>) -> std::io::Result<()> {
    // Read-only attaches were cloned on the mprotect path, their present
    // protections already set on the inherited mapping: nothing to do.
    let armed: BTreeMap<u32, Mapping> = prep
        .maps
        .iter()
        .filter(|(_, m)| !m.readonly)
        .map(|(&p, &m)| (p, m))
        .collect();
    for m in armed.values() {
        match u {
            Some(u) => {
                u.register(m.base, m.len, m.readonly)?;
                if !m.readonly {
                    u.write_protect(m.base, m.len, true)?;
                }
            }
            None => {
                // SAFETY: the child's own copy of an attach mapping.
                if unsafe { libc::mprotect(m.base as *mut c_void, m.len, libc::PROT_NONE) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
    }
    rustix::net::sockopt::set_socket_timeout(
        &prep.sock,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(10)),
    )?;
    let mut first = true;
    for (i, (&process, m)) in armed.iter().enumerate() {
        let mut r = LocalMsg::new(kind::REGISTER);
        r.id = i as u64 + 1;
        r.a = process as u64;
        r.b = m.base as u64;
        r.c = if u.is_some() {
            mode::UFFD
        } else {
            mode::MPROTECT
        };
        let fd = u.filter(|_| first).map(|u| u.fd());
        send_with_fd(&prep.sock, &r, fd)?;
        first = false;
    }
    let mut answered = 0;
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    while answered < armed.len() {
        let n = rustix::net::recv(&prep.sock, &mut buf, RecvFlags::empty())?.0;
        let Some(m) = LocalMsg::from_bytes(&buf[..n]) else {
            return Err(std::io::Error::other("the daemon hung up"));
        };
        match m.kind {
            kind::REPLY if m.err != 0 => return Err(std::io::Error::from_raw_os_error(m.err)),
            kind::REPLY => answered += 1,
            kind::PROTECT => {
                // The mprotect fallback's present protections, or a change
                // to a read-only (mprotect) attach meanwhile.
                if let Some(map) = prep.maps.get(&(m.a as u32)) {
                    protect_range(map, &m);
                }
                if m.id != 0 {
                    let mut ack = LocalMsg::new(kind::ACK);
                    ack.id = m.id;
                    rustix::net::send(&prep.sock, ack.as_bytes(), SendFlags::NOSIGNAL)?;
                }
            }
            _ => {}
        }
    }
    rustix::net::sockopt::set_socket_timeout(
        &prep.sock,
        rustix::net::sockopt::Timeout::Recv,
        None,
    )?;
    Ok(())
}

fn protect_range(map: &Mapping, m: &LocalMsg) {
    let ps = page_size();
    let x = if map.exec { libc::PROT_EXEC } else { 0 };
    let prot = match m.d {
        proto::prot::READ => libc::PROT_READ | x,
        proto::prot::READ_WRITE => libc::PROT_READ | libc::PROT_WRITE | x,
        _ => libc::PROT_NONE,
    };
    let off = m.b as usize * ps;
    let len = (m.c as usize * ps).min(map.len.saturating_sub(off));
    // SAFETY: pages inside our own attach mapping.
    let rc = unsafe { libc::mprotect((map.base + off) as *mut c_void, len, prot) };
    assert_eq!(rc, 0, "mprotect of a DSM mapping");
}

impl Client {
    fn send(&self, m: &LocalMsg) -> bool {
        rustix::net::send(&self.sock, m.as_bytes(), SendFlags::NOSIGNAL).is_ok()
    }

    /// Sends a request and waits for its answer. The daemon checks it
    /// against the credentials of this thread (`tid`).
    fn call(&self, m: LocalMsg, addr: usize) -> Result<(LocalMsg, usize), i32> {
        self.call_flags(m, addr, 0)
    }

    fn call_flags(
        &self,
        mut m: LocalMsg,
        addr: usize,
        flags: i32,
    ) -> Result<(LocalMsg, usize), i32> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        m.id = id;
        m.tid = gettid();
        self.pending
            .lock()
            .expect("pending")
            .insert(id, Pending::Waiting { addr, flags });
        if !self.send(&m) {
            self.pending.lock().expect("pending").remove(&id);
            return Err(libc::EIO);
        }
        let deadline = Instant::now() + API_TIMEOUT;
        let mut p = self.pending.lock().expect("pending");
        loop {
            if let Some(Pending::Done { .. }) = p.get(&id) {
                let Some(Pending::Done { reply, base }) = p.remove(&id) else {
                    unreachable!()
                };
                return if reply.err != 0 {
                    Err(reply.err)
                } else {
                    Ok((reply, base))
                };
            }
            let now = Instant::now();
            if DEAD.load(Ordering::Acquire) || now >= deadline {
                p.remove(&id);
                return Err(if DEAD.load(Ordering::Acquire) {
                    libc::EIO
                } else {
                    libc::ETIMEDOUT
                });
            }
            p = self.cv.wait_timeout(p, deadline - now).expect("pending").0;
        }
    }

    fn finish(&self, id: u64, reply: LocalMsg, base: usize) {
        let mut p = self.pending.lock().expect("pending");
        match p.get(&id) {
            None => {}
            Some(&Pending::Registering { base, process }) => {
                // The answer to a REGISTER completes the attach.
                let base = if reply.err == 0 {
                    base
                } else {
                    self.undo_attach(process);
                    0
                };
                p.insert(id, Pending::Done { reply, base });
            }
            Some(_) => {
                p.insert(id, Pending::Done { reply, base });
            }
        }
        self.cv.notify_all();
    }

    /// Gives back an attach that could not be completed.
    fn undo_attach(&self, process: u32) {
        if let Some(map) = self.maps.lock().expect("maps").remove(&process) {
            unregister(map.slot);
            // SAFETY: our own attach mapping, never handed to the program.
            unsafe { libc::munmap(map.base as *mut c_void, map.len) };
        }
        let mut d = LocalMsg::new(kind::DETACH);
        d.a = process as u64;
        self.send(&d);
    }

    /// `REGISTER` of a mapping registered with this process's userfaultfd
    /// (`u`; `None`: made inaccessible instead, the mprotect fallback).
    /// The fd goes along the first time on this connection.
    fn send_register(&self, id: u64, process: u32, base: usize, u: Option<&uffd::Uffd>) -> bool {
        let mut r = LocalMsg::new(kind::REGISTER);
        r.id = id;
        r.a = process as u64;
        r.b = base as u64;
        r.c = if u.is_some() {
            mode::UFFD
        } else {
            mode::MPROTECT
        };
        let fd = u.filter(|_| !self.uffd_sent.load(Ordering::Acquire));
        let ok = send_with_fd(&self.sock, &r, fd.map(|u| u.fd())).is_ok();
        if ok && fd.is_some() {
            self.uffd_sent.store(true, Ordering::Release);
        }
        ok
    }
}

/// The service thread: carries out the daemon's `PROTECT`s and `WAKE`s and
/// hands answers to callers. It never touches DSM memory.
fn service(c: &'static Client) {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    // The daemon's silence limit, from its first `ALIVE` (a daemon that
    // sends none is only taken for gone when its socket closes).
    let mut silence_limit: Option<std::time::Duration> = None;
    let mut heard = std::time::Instant::now();
    loop {
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &c.sock,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        );
        let n = match got {
            Ok(r) if r.bytes > 0 => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            // The receive timeout set at the first `ALIVE`.
            Err(rustix::io::Errno::AGAIN) => match silence_limit {
                Some(limit) if heard.elapsed() > limit => {
                    // Stopped or hung: gone, as its peers see it. The
                    // socket is shut so that a daemon that resumes sees
                    // this program leave (and detaches it) instead of
                    // serving its faults beside the code below.
                    let _ = rustix::net::shutdown(&c.sock, rustix::net::Shutdown::Both);
                    break;
                }
                _ => continue,
            },
            _ => break,
        };
        heard = std::time::Instant::now();
        let mut fd: Option<OwnedFd> = None;
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(mut fds) = m {
                fd = fds.next();
            }
        }
        let Some(m) = LocalMsg::from_bytes(&buf[..n]) else {
            continue;
        };
        match m.kind {
            kind::ALIVE if silence_limit.is_none() && m.b > 0 => {
                silence_limit = Some(std::time::Duration::from_millis(m.b));
                // Wake up at least once per interval to look at the
                // silence (10 ms at the least, 1 s at the most).
                let every = std::time::Duration::from_millis(m.a.clamp(10, 1000));
                let _ = rustix::net::sockopt::set_socket_timeout(
                    &c.sock,
                    rustix::net::sockopt::Timeout::Recv,
                    Some(every),
                );
            }
            kind::REPLY | kind::STATUS_TEXT => c.finish(m.id, m, 0),
            kind::ATTACH_OK => attach_ok(c, m, fd),
            kind::PROTECT => {
                let maps = c.maps.lock().expect("maps");
                if let Some(map) = maps.get(&(m.a as u32)) {
                    protect_range(map, &m);
                }
                drop(maps);
                if m.id != 0 {
                    let mut ack = LocalMsg::new(kind::ACK);
                    ack.id = m.id;
                    c.send(&ack);
                }
            }
            kind::LOST => {
                // The userfaultfd path: coherence before availability, no
                // stale copy, no zeros. The page is replaced by a mapping
                // past the end of an empty memfd, then the faulter is
                // woken: its retried access takes a SIGBUS there.
                let ps = page_size();
                let page = m.a as usize & !(ps - 1);
                eprintln!("mmulab dsm: {}; SIGBUS", m.text_str());
                if let Some(u) = current_uffd() {
                    if c.maps
                        .lock()
                        .expect("maps")
                        .values()
                        .any(|map| page >= map.base && page < map.base + map.len)
                    {
                        uffd::poison(page, ps);
                    }
                    u.wake(page, ps);
                }
            }
            kind::WAKE => {
                // SAFETY: the faulter sleeps on this slot until woken.
                let slot = unsafe { &*(m.a as *const WaitSlot) };
                if m.b as u32 != wake::RETRY {
                    // SAFETY: only the faulter reads the text, after the store below.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            m.text.as_ptr(),
                            slot.text.as_ptr() as *mut u8,
                            proto::TEXT_BYTES,
                        )
                    };
                }
                slot.word.store(m.b as u32, Ordering::Release);
                let _ = rustix::thread::futex::wake(
                    &slot.word,
                    rustix::thread::futex::Flags::PRIVATE,
                    1,
                );
            }
            _ => {}
        }
    }
    // The daemon is gone: callers and sleeping faulters fail.
    DEAD.store(true, Ordering::Release);
    c.cv.notify_all();
    // On the userfaultfd path nobody else will read this process's faults.
    if let Some(u) = current_uffd() {
        daemon_gone::serve_faults(u, || {
            c.maps
                .lock()
                .expect("maps")
                .values()
                .map(|m| (m.base, m.len))
                .collect()
        });
    }
}

fn attach_ok(c: &Client, m: LocalMsg, fd: Option<OwnedFd>) {
    let process = m.a as u32;
    let len = m.b as usize;
    let (want, shmflg) = match c.pending.lock().expect("pending").get(&m.id) {
        Some(Pending::Waiting { addr, flags }) => (*addr, *flags),
        _ => (0, 0),
    };
    let readonly = m.c != 0;
    let exec = shmflg & SHM_EXEC != 0;
    // A read-only attach maps a read-only descriptor, which userfaultfd
    // cannot register (no VM_MAYWRITE): it is on the mprotect path.
    let u = current_uffd().filter(|_| !readonly);
    // On the userfaultfd path the mapping keeps its access and the kernel
    // asks the daemon (holes, write protection); on the mprotect path it
    // starts inaccessible.
    let x = if exec { libc::PROT_EXEC } else { 0 };
    let prot = match (u, readonly) {
        (None, _) => libc::PROT_NONE,
        (Some(_), true) => libc::PROT_READ | x,
        (Some(_), false) => libc::PROT_READ | libc::PROT_WRITE | x,
    };
    if want != 0 && shmflg & SHM_REMAP != 0 {
        // SHM_REMAP replaces what is mapped there: a DSM attach in the
        // way is detached, as the kernel's unmap detaches it.
        let gone: Vec<(u32, Mapping)> = c
            .maps
            .lock()
            .expect("maps")
            .iter()
            .filter(|(_, map)| map.base < want + m.b as usize && want < map.base + map.len)
            .map(|(&p, &map)| (p, map))
            .collect();
        for (p, map) in gone {
            c.maps.lock().expect("maps").remove(&p);
            unregister(map.slot);
            let mut d = LocalMsg::new(kind::DETACH);
            d.a = p as u64;
            c.send(&d);
        }
    }
    let mapped = fd.ok_or(libc::EIO).and_then(|fd| {
        let flags = if want != 0 && shmflg & SHM_REMAP != 0 {
            libc::MAP_SHARED | libc::MAP_FIXED
        } else if want != 0 {
            libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE
        } else {
            libc::MAP_SHARED
        };
        // SAFETY: a fresh shared mapping of the segment's memfd, not handed
        // to the program yet; FIXED_NOREPLACE never clobbers a mapping.
        let p = unsafe {
            libc::mmap(
                want as *mut c_void,
                len,
                prot,
                flags,
                fd.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL));
        }
        if want != 0 && p as usize != want {
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(p, len) };
            return Err(libc::EINVAL);
        }
        if let Some(u) = u {
            // Registered and write-protected whole before the program
            // can touch it; the daemon lifts what the site holds.
            let armed = u.register(p as usize, len, readonly).and_then(|_| {
                if readonly {
                    Ok(())
                } else {
                    u.write_protect(p as usize, len, true)
                }
            });
            if let Err(e) = armed {
                // SAFETY: the mapping just made.
                unsafe { libc::munmap(p, len) };
                return Err(e.raw_os_error().unwrap_or(libc::EIO));
            }
        }
        Ok(p as usize)
    });
    match mapped {
        Ok(base) => {
            // The SIGSEGV table also serves the userfaultfd path: a write
            // through SHM_RDONLY is a SIGSEGV there too.
            let slot = register(base, len, process);
            c.maps.lock().expect("maps").insert(
                process,
                Mapping {
                    base,
                    len,
                    slot,
                    readonly,
                    exec,
                },
            );
            if u.is_some() {
                // The attach completes with the daemon's answer.
                let mut p = c.pending.lock().expect("pending");
                if p.contains_key(&m.id) {
                    p.insert(m.id, Pending::Registering { base, process });
                }
                drop(p);
                if !c.send_register(m.id, process, base, u) {
                    let mut r = m;
                    r.err = libc::EIO;
                    c.finish(m.id, r, 0);
                }
            } else {
                c.finish(m.id, m, base);
            }
        }
        Err(e) => {
            // Give the attach back, then fail the call.
            let mut d = LocalMsg::new(kind::DETACH);
            d.a = process as u64;
            c.send(&d);
            let mut r = m;
            r.err = if e == libc::EEXIST { libc::EINVAL } else { e };
            c.finish(m.id, r, 0);
        }
    }
}

// ---------------------------------------------------------------------------
// Faults: SIGSEGV on a DSM address.

const SLOTS: usize = 256;

struct Slot {
    base: AtomicUsize,
    len: AtomicUsize,
    process: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    base: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    process: AtomicU32::new(0),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
/// The action that was in place before ours, for addresses not ours.
static mut OLD_SEGV: MaybeUninit<libc::sigaction> = MaybeUninit::zeroed();

fn register(base: usize, len: usize, process: u32) -> usize {
    INSTALL.call_once(|| {
        // SAFETY: installs a handler that only makes async-signal-safe calls.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut sa.sa_mask);
            let old = &raw mut OLD_SEGV;
            let rc = libc::sigaction(libc::SIGSEGV, &sa, (*old).as_mut_ptr());
            assert_eq!(rc, 0, "sigaction(SIGSEGV)");
        }
    });
    for (i, s) in TABLE.iter().enumerate() {
        if s.base
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            s.len.store(len, Ordering::Release);
            s.process.store(process, Ordering::Release);
            s.base.store(base, Ordering::Release);
            return i;
        }
    }
    panic!("more than {SLOTS} DSM attach mappings in one process");
}

fn unregister(slot: usize) {
    let s = &TABLE[slot];
    s.base.store(usize::MAX, Ordering::Release);
    s.base.store(0, Ordering::Release);
}

#[cfg(target_arch = "x86_64")]
unsafe fn access_of(ctx: *mut c_void) -> u64 {
    // SAFETY: the kernel passes a ucontext_t to an SA_SIGINFO handler.
    let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
    if uc.uc_mcontext.gregs[libc::REG_ERR as usize] & 2 != 0 {
        proto::ACCESS_WRITE
    } else {
        proto::ACCESS_READ
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn access_of(_ctx: *mut c_void) -> u64 {
    proto::ACCESS_UNKNOWN
}

fn write_stderr(b: &[u8]) {
    // SAFETY: write(2) is async-signal-safe.
    unsafe { libc::write(2, b.as_ptr() as *const c_void, b.len()) };
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: SA_SIGINFO guarantees info and ctx.
    let addr = unsafe { (*info).si_addr() } as usize;
    let ps = page_size();
    for s in TABLE.iter() {
        let base = s.base.load(Ordering::Acquire);
        if base == 0 || base == usize::MAX {
            continue;
        }
        let len = s.len.load(Ordering::Acquire);
        if addr < base || addr >= base + len {
            continue;
        }
        let slot = WaitSlot {
            word: AtomicU32::new(0),
            text: [0; proto::TEXT_BYTES],
        };
        let mut m = LocalMsg::new(kind::FAULT);
        m.a = s.process.load(Ordering::Acquire) as u64;
        m.b = ((addr - base) / ps) as u64;
        // SAFETY: ctx is the kernel's ucontext.
        m.c = unsafe { access_of(ctx) };
        m.d = &slot as *const WaitSlot as u64;
        let fd = SOCK_FD.load(Ordering::Acquire);
        // SAFETY: send(2) is async-signal-safe; SEQPACKET keeps the record whole.
        let n = unsafe {
            libc::send(
                fd,
                m.as_bytes().as_ptr() as *const c_void,
                MSG_BYTES,
                libc::MSG_NOSIGNAL,
            )
        };
        let v = if n == MSG_BYTES as isize {
            wait(&slot.word)
        } else {
            wake::FAIL
        };
        match v {
            wake::RETRY => {}
            wake::SEGV => {
                // SAFETY: async-signal-safe; the retried access crashes.
                unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
            }
            _ => {
                // Coherence before availability: no stale copy, no zeros.
                // The page is replaced by a mapping past the end of an
                // empty memfd, so the retried access takes a genuine
                // SIGBUS at this very address.
                write_stderr(b"mmulab dsm: ");
                let n = slot.text.iter().position(|&c| c == 0).unwrap_or(0);
                if n == 0 {
                    write_stderr(b"the site daemon is gone");
                } else {
                    write_stderr(&slot.text[..n]);
                }
                write_stderr(b"; SIGBUS\n");
                let page = addr & !(ps - 1);
                // SAFETY: memfd_create, mmap and close are plain syscalls;
                // the page is inside our own DSM mapping.
                unsafe {
                    let fd = libc::memfd_create(c"mmulab-dsm-lost".as_ptr(), libc::MFD_CLOEXEC);
                    if fd >= 0 {
                        libc::mmap(
                            page as *mut c_void,
                            ps,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_SHARED | libc::MAP_FIXED,
                            fd,
                            0,
                        );
                        libc::close(fd);
                    } else {
                        libc::signal(libc::SIGBUS, libc::SIG_DFL);
                        libc::raise(libc::SIGBUS);
                    }
                }
            }
        }
        return;
    }
    // Not a DSM address: put the previous action back and let the
    // instruction fault again, so a real crash stays a crash.
    // SAFETY: async-signal-safe; OLD_SEGV was filled at install.
    unsafe {
        let old = &raw const OLD_SEGV;
        if libc::sigaction(sig, (*old).as_ptr(), std::ptr::null_mut()) != 0 {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// Sleeps until the daemon stores a value (bounded polls of `DEAD`).
fn wait(word: &AtomicU32) -> u32 {
    loop {
        let v = word.load(Ordering::Acquire);
        if v != 0 {
            return v;
        }
        if DEAD.load(Ordering::Acquire) {
            return wake::FAIL;
        }
        let t = rustix::thread::futex::Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        let _ =
            rustix::thread::futex::wait(word, rustix::thread::futex::Flags::PRIVATE, 0, Some(&t));
    }
}

// ---------------------------------------------------------------------------
// The C API (mmulab_dsm.h).

fn fail<T>(e: i32, v: T) -> T {
    set_errno(e);
    v
}

/// `shmget(2)` on the DSM.
///
/// # Safety
/// Callable from C; no pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmulab_shmget(key: libc::key_t, size: libc::size_t, shmflg: i32) -> i32 {
    let Some(c) = client() else {
        return fail(libc::ENOSYS, -1);
    };
    let mut m = LocalMsg::new(kind::GET);
    m.a = key as u32 as u64;
    m.b = size as u64;
    m.c = shmflg as u32 as u64;
    match c.call(m, 0) {
        Ok((r, _)) => r.a as i32,
        Err(e) => fail(e, -1),
    }
}

/// `shmat(2)` on the DSM, with `do_shmat`'s address checks here and the
/// id and permission checks at the daemon.
///
/// # Safety
/// `addr` is null or an address the caller wants the segment at.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmulab_shmat(shmid: i32, addr: *const c_void, shmflg: i32) -> *mut c_void {
    let failed = usize::MAX as *mut c_void;
    let Some(c) = client() else {
        return fail(libc::ENOSYS, failed);
    };
    if shmid < 0 {
        return fail(libc::EINVAL, failed);
    }
    let mut want = addr as usize;
    if want != 0 {
        if want & (shmlba() - 1) != 0 {
            if shmflg & SHM_RND == 0 {
                return fail(libc::EINVAL, failed);
            }
            want &= !(shmlba() - 1);
            if want == 0 && shmflg & SHM_REMAP != 0 {
                return fail(libc::EINVAL, failed);
            }
        }
    } else if shmflg & SHM_REMAP != 0 {
        return fail(libc::EINVAL, failed);
    }
    let mut m = LocalMsg::new(kind::ATTACH);
    m.a = shmid as u32 as u64;
    m.b = shmflg as u32 as u64;
    // A read-only attach gets a read-only descriptor (it cannot be made
    // writable), which userfaultfd cannot register: the mprotect path.
    m.c = if current_uffd().is_some() && shmflg & SHM_RDONLY == 0 {
        mode::UFFD
    } else {
        mode::MPROTECT
    };
    match c.call_flags(m, want, shmflg) {
        Ok((_, base)) => base as *mut c_void,
        Err(e) => fail(e, failed),
    }
}

/// `shmdt(2)` on the DSM.
///
/// # Safety
/// `addr` is an address `mmulab_shmat` returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmulab_shmdt(addr: *const c_void) -> i32 {
    let Some(c) = client() else {
        return fail(libc::ENOSYS, -1);
    };
    let found = {
        let mut maps = c.maps.lock().expect("maps");
        let p = maps
            .iter()
            .find(|(_, m)| m.base == addr as usize)
            .map(|(&p, _)| p);
        p.and_then(|p| maps.remove(&p).map(|m| (p, m)))
    };
    let Some((process, map)) = found else {
        return fail(libc::EINVAL, -1);
    };
    // The mapping goes first: after shmdt nothing may fault on it.
    unregister(map.slot);
    // SAFETY: our own attach mapping, given up by the program.
    unsafe { libc::munmap(map.base as *mut c_void, map.len) };
    let mut m = LocalMsg::new(kind::DETACH);
    m.a = process as u64;
    match c.call(m, 0) {
        Ok(_) => 0,
        Err(e) => fail(e, -1),
    }
}

/// The kernel's `shmid64_ds` on x86-64 (what `shmctl` copies; glibc's
/// `struct shmid_ds` has this layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ShmidDs {
    key: i32,
    uid: u32,
    gid: u32,
    cuid: u32,
    cgid: u32,
    mode: u32,
    seq: u16,
    pad2: u16,
    pad3: u32,
    unused1: u64,
    unused2: u64,
    segsz: u64,
    atime: i64,
    dtime: i64,
    ctime: i64,
    cpid: i32,
    lpid: i32,
    nattch: u64,
    unused4: u64,
    unused5: u64,
}
const _: () = assert!(std::mem::size_of::<ShmidDs>() == 112);

/// `struct shminfo` (`IPC_INFO`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ShmInfoC {
    shmmax: u64,
    shmmin: u64,
    shmmni: u64,
    shmseg: u64,
    shmall: u64,
    unused: [u64; 4],
}

/// `struct shm_info` (`SHM_INFO`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ShmUsageC {
    used_ids: i32,
    shm_tot: u64,
    shm_rss: u64,
    shm_swp: u64,
    swap_attempts: u64,
    swap_successes: u64,
}

/// Copies `value` to the caller's `dst` as the kernel's `copy_to_user`
/// would: a bad address is EFAULT, not a crash (through
/// `process_vm_writev` on this very process).
fn copy_out<T: Copy>(dst: *mut c_void, value: &T) -> Result<(), i32> {
    let n = std::mem::size_of::<T>();
    let local = libc::iovec {
        iov_base: value as *const T as *mut c_void,
        iov_len: n,
    };
    let remote = libc::iovec {
        iov_base: dst,
        iov_len: n,
    };
    // SAFETY: both iovecs describe memory of this process; the kernel
    // checks the remote one.
    let got = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    if got == n as isize {
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}

/// `copy_from_user` likewise.
fn copy_in<T: Copy + Default>(src: *const c_void) -> Result<T, i32> {
    let mut v = T::default();
    let n = std::mem::size_of::<T>();
    let local = libc::iovec {
        iov_base: &mut v as *mut T as *mut c_void,
        iov_len: n,
    };
    let remote = libc::iovec {
        iov_base: src as *mut c_void,
        iov_len: n,
    };
    // SAFETY: as in copy_out.
    let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if got == n as isize {
        Ok(v)
    } else {
        Err(libc::EFAULT)
    }
}

/// `shmctl(2)` on the DSM: every command of Linux's (`IPC_STAT`,
/// `IPC_SET`, `IPC_RMID`, `IPC_INFO`, `SHM_INFO`, `SHM_STAT`,
/// `SHM_STAT_ANY`, `SHM_LOCK`, `SHM_UNLOCK`), checked at the daemon; the
/// buffer is read before (`IPC_SET`) and written after the check, as the
/// kernel does, and a bad one is EFAULT.
///
/// # Safety
/// `buf` is what `shmctl(2)` takes for `cmd`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmulab_shmctl(shmid: i32, cmd: i32, buf: *mut libc::shmid_ds) -> i32 {
    let Some(c) = client() else {
        return fail(libc::ENOSYS, -1);
    };
    if cmd < 0 || shmid < 0 {
        return fail(libc::EINVAL, -1);
    }
    let buf = buf as *mut c_void;
    let mut m = LocalMsg::new(kind::CTL);
    m.a = shmid as u32 as u64;
    m.b = cmd as u32 as u64;
    if cmd == IPC_SET {
        let ds: ShmidDs = match copy_in(buf) {
            Ok(d) => d,
            Err(e) => return fail(e, -1),
        };
        m.c = ds.mode as u64 & 0o777;
        m.d = ds.uid as u64;
        m.e = ds.gid as u64;
    }
    let r = match c.call(m, 0) {
        Ok((r, _)) => r,
        Err(e) => return fail(e, -1),
    };
    let w = r.words();
    let written = match cmd {
        IPC_STAT | SHM_STAT | SHM_STAT_ANY => {
            let ds = ShmidDs {
                key: w[0] as u32 as i32,
                uid: w[1] as u32,
                gid: w[2] as u32,
                cuid: w[3] as u32,
                cgid: w[4] as u32,
                mode: w[5] as u32,
                seq: w[6] as u16,
                segsz: w[7],
                atime: w[8] as i64,
                dtime: w[9] as i64,
                ctime: w[10] as i64,
                cpid: w[11] as u32 as i32,
                lpid: w[12] as u32 as i32,
                nattch: w[13],
                ..ShmidDs::default()
            };
            copy_out(buf, &ds)
        }
        IPC_INFO => copy_out(
            buf,
            &ShmInfoC {
                shmmax: w[0],
                shmmin: w[1],
                shmmni: w[2],
                shmseg: w[3],
                shmall: w[4],
                unused: [0; 4],
            },
        ),
        SHM_INFO => copy_out(
            buf,
            &ShmUsageC {
                used_ids: w[0] as i32,
                shm_tot: w[1],
                shm_rss: w[2],
                ..ShmUsageC::default()
            },
        ),
        _ => Ok(()),
    };
    match written {
        Ok(()) => r.a as u32 as i32,
        Err(e) => fail(e, -1),
    }
}

/// `remap_file_pages(2)` on a DSM mapping: the kernel's checks, then what
/// its unmap-then-map does to a System V segment. The mapping stays the
/// DSM's (no call ever maps the segment's memory around the protocol):
/// a linear remap is a success that changes nothing, unless it covers the
/// last attach of a removed segment, whose unmap destroys it: then the
/// mapping is gone and the call fails with EINVAL, as on Linux. A
/// non-linear one fails with EINVAL (documented: DSM mappings stay
/// linear). `None`: not a DSM mapping.
fn remap_dsm(start: usize, size: usize, prot: i32, pgoff: usize) -> Option<Result<(), i32>> {
    let c = client_if_connected()?;
    let ps = page_size();
    let (process, map) = {
        let maps = c.maps.lock().expect("maps");
        maps.iter()
            .find(|(_, m)| start >= m.base && start < m.base + m.len)
            .map(|(&p, &m)| (p, m))?
    };
    if prot != 0 {
        return Some(Err(libc::EINVAL));
    }
    let start = start & !(ps - 1);
    let size = size & !(ps - 1);
    let end = start.checked_add(size).filter(|&e| e > start);
    let Some(end) = end else {
        return Some(Err(libc::EINVAL));
    };
    if pgoff.checked_add(size / ps).is_none() || end > map.base + map.len {
        return Some(Err(libc::EINVAL));
    }
    if pgoff != (start - map.base) / ps {
        return Some(Err(libc::EINVAL));
    }
    let mut m = LocalMsg::new(kind::REMAP);
    m.a = process as u64;
    m.b = (start == map.base && end == map.base + map.len) as u64;
    Some(match c.call(m, 0) {
        Err(e) => Err(e),
        Ok((r, _)) if r.c == 1 => {
            // Detached by the daemon: the range is unmapped, as the
            // kernel's failed remap leaves it.
            c.maps.lock().expect("maps").remove(&process);
            unregister(map.slot);
            // SAFETY: our own attach mapping, given up.
            unsafe { libc::munmap(map.base as *mut c_void, map.len) };
            Err(libc::EINVAL)
        }
        Ok(_) => Ok(()),
    })
}

/// The connection, if this process made one (a DSM mapping needs one).
fn client_if_connected() -> Option<&'static Client> {
    let p = CURRENT.load(Ordering::Acquire);
    // SAFETY: clients are leaked, never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Sets Δ (in the cluster's ticks) for every page of a segment created on
/// this site (Δ lives at the library, fleisch89 §8).
///
/// # Safety
/// Callable from C; no pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmulab_set_delta(shmid: i32, ticks: u32) -> i32 {
    let Some(c) = client() else {
        return fail(libc::ENOSYS, -1);
    };
    let mut m = LocalMsg::new(kind::SET_DELTA);
    m.a = shmid as u32 as u64;
    m.b = ticks as u64;
    match c.call(m, 0) {
        Ok(_) => 0,
        Err(e) => fail(e, -1),
    }
}

// ---------------------------------------------------------------------------
// LD_PRELOAD: the System V calls themselves.

/// The daemon's socket, as `MMULAB_DSM_SOCKET` named it when this library
/// was loaded (a program that clears its environment stays on the DSM).
fn socket_path() -> Option<&'static std::ffi::OsStr> {
    static PATH: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();
    PATH.get_or_init(|| std::env::var_os(proto::SOCKET_ENV))
        .as_deref()
}

fn dsm_enabled() -> bool {
    socket_path().is_some()
}

/// `remap_file_pages(2)`: on a DSM mapping, [`remap_dsm`]; elsewhere the
/// kernel's.
///
/// # Safety
/// As `remap_file_pages(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remap_file_pages(
    addr: *mut c_void,
    size: libc::size_t,
    prot: i32,
    pgoff: libc::size_t,
    flags: i32,
) -> i32 {
    if dsm_enabled()
        && let Some(r) = remap_dsm(addr as usize, size, prot, pgoff)
    {
        return match r {
            Ok(()) => 0,
            Err(e) => fail(e, -1),
        };
    }
    let r = trap::passthrough_remap(addr as usize, size, prot as usize, pgoff, flags as usize);
    if r < 0 { fail(-r as i32, -1) } else { r as i32 }
}

/// Raw `shmget`/`shmat`/`shmdt`/`shmctl` (and `remap_file_pages`) system
/// calls: a seccomp filter, installed when this library loads under the
/// DSM, traps them (`SECCOMP_RET_TRAP`), and the SIGSYS handler gives
/// them to the functions above, so `syscall(__NR_shmctl, …)` never hands
/// a DSM id to the kernel. The library's own `remap_file_pages` of a
/// mapping that is not the DSM's passes the filter with a cookie in the
/// sixth argument, which the kernel ignores. Without root the filter
/// needs `no_new_privs` (set here): an `exec` of a set-user-ID program
/// then gains no privilege. `MMULAB_DSM_SECCOMP=off` installs nothing.
mod trap {
    use super::*;

    const NR_SHMGET: i64 = 29;
    const NR_SHMAT: i64 = 30;
    const NR_SHMCTL: i64 = 31;
    const NR_SHMDT: i64 = 67;
    const NR_REMAP_FILE_PAGES: i64 = 216;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    /// The sixth argument that lets this library's own
    /// `remap_file_pages` through.
    const COOKIE: u64 = 0x6d6d_756c_6162_7273;

    /// Set once the filter is in place.
    pub static INSTALLED: AtomicBool = AtomicBool::new(false);

    /// The kernel's `remap_file_pages`, past the filter.
    pub fn passthrough_remap(
        addr: usize,
        size: usize,
        prot: usize,
        pgoff: usize,
        flags: usize,
    ) -> isize {
        // SAFETY: a raw system call; the kernel checks every argument.
        let r = unsafe {
            libc::syscall(
                libc::SYS_remap_file_pages,
                addr,
                size,
                prot,
                pgoff,
                flags,
                COOKIE,
            )
        };
        if r < 0 {
            -(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL) as isize)
        } else {
            r as isize
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub fn install() {
        if std::env::var("MMULAB_DSM_SECCOMP").is_ok_and(|v| v == "off" || v == "0") {
            return;
        }
        // SAFETY: installs a handler, then a filter; both plain syscalls.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigsys as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
                return;
            }
            let lo = COOKIE as u32;
            let hi = (COOKIE >> 32) as u32;
            // seccomp_data: nr at 0, arch at 4, ip at 8, args at 16 (8 each).
            let arg5 = 16 + 5 * 8;
            let ld = |off: u32| libc::sock_filter {
                code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
                jt: 0,
                jf: 0,
                k: off,
            };
            let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
                code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
                jt,
                jf,
                k,
            };
            let ret = |k: u32| libc::sock_filter {
                code: (libc::BPF_RET | libc::BPF_K) as u16,
                jt: 0,
                jf: 0,
                k,
            };
            let prog = [
                /* 0 */ ld(4),
                /* 1 */ jeq(AUDIT_ARCH_X86_64, 0, 8), // other ABI: allow
                /* 2 */ ld(0),
                /* 3 */ jeq(NR_SHMGET as u32, 11, 0),
                /* 4 */ jeq(NR_SHMAT as u32, 10, 0),
                /* 5 */ jeq(NR_SHMCTL as u32, 9, 0),
                /* 6 */ jeq(NR_SHMDT as u32, 8, 0),
                /* 7 */ jeq(NR_REMAP_FILE_PAGES as u32, 2, 0),
                /* 8 */ jeq(u32::MAX, 0, 0), // no-op, keeps offsets readable
                /* 9 */ ret(libc::SECCOMP_RET_ALLOW),
                /* 10 */ ld(arg5),
                /* 11 */ jeq(lo, 0, 3),
                /* 12 */ ld(arg5 + 4),
                /* 13 */ jeq(hi, 0, 1),
                /* 14 */ ret(libc::SECCOMP_RET_ALLOW),
                /* 15 */ ret(libc::SECCOMP_RET_TRAP),
            ];
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut _,
            };
            if libc::geteuid() != 0 {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            }
            let rc = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_TSYNC,
                &fprog as *const libc::sock_fprog,
            );
            if rc == 0 {
                INSTALLED.store(true, Ordering::Release);
            } else {
                eprintln!(
                    "mmulab dsm: raw shm system calls are not caught (seccomp: {}); they reach the kernel's own segments",
                    std::io::Error::last_os_error()
                );
            }
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn install() {}

    /// A trapped system call: its number in RAX (rolled back by the
    /// kernel), its arguments in RDI, RSI, RDX, R10, R8; the result goes
    /// back in RAX, as the kernel would return it (-errno on failure).
    #[cfg(target_arch = "x86_64")]
    extern "C" fn on_sigsys(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut c_void) {
        // SAFETY: SA_SIGINFO gives the kernel's ucontext.
        let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
        let g = &mut uc.uc_mcontext.gregs;
        let (nr, a0, a1, a2, a3, a4) = (
            g[libc::REG_RAX as usize],
            g[libc::REG_RDI as usize],
            g[libc::REG_RSI as usize],
            g[libc::REG_RDX as usize],
            g[libc::REG_R10 as usize],
            g[libc::REG_R8 as usize],
        );
        // SAFETY: the thread's errno, saved around the calls below.
        let saved = unsafe { *libc::__errno_location() };
        set_errno(0);
        let err = || {
            -(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOSYS) as i64)
        };
        // SAFETY: the program's own arguments, as it would have passed
        // them to the kernel; each function checks them as the kernel does.
        let ret: i64 = unsafe {
            match nr {
                NR_SHMGET => {
                    let r = mmulab_shmget(a0 as libc::key_t, a1 as usize, a2 as i32);
                    if r < 0 { err() } else { r as i64 }
                }
                NR_SHMAT => {
                    let r = mmulab_shmat(a0 as i32, a1 as *const c_void, a2 as i32);
                    if r as usize == usize::MAX {
                        err()
                    } else {
                        r as i64
                    }
                }
                NR_SHMCTL => {
                    let r = mmulab_shmctl(a0 as i32, a1 as i32, a2 as *mut libc::shmid_ds);
                    if r < 0 { err() } else { r as i64 }
                }
                NR_SHMDT => {
                    if mmulab_shmdt(a0 as *const c_void) < 0 {
                        err()
                    } else {
                        0
                    }
                }
                NR_REMAP_FILE_PAGES => {
                    let r = remap_file_pages(
                        a0 as *mut c_void,
                        a1 as usize,
                        a2 as i32,
                        a3 as usize,
                        a4 as i32,
                    );
                    if r < 0 { err() } else { 0 }
                }
                _ => -(libc::ENOSYS as i64),
            }
        };
        set_errno(saved);
        g[libc::REG_RAX as usize] = ret;
    }
}

/// Runs when the library is loaded: under the DSM, the filter for raw
/// system calls goes in before the program's first instruction.
extern "C" fn on_load() {
    if dsm_enabled() {
        trap::install();
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;

/// The C library's own function (the next definition after ours).
fn next(name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// # Safety
/// As `shmget(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmget(key: libc::key_t, size: libc::size_t, shmflg: i32) -> i32 {
    if dsm_enabled() {
        // SAFETY: same contract.
        return unsafe { mmulab_shmget(key, size, shmflg) };
    }
    let f = next(c"shmget");
    if f.is_null() {
        return fail(libc::ENOSYS, -1);
    }
    // SAFETY: the C library's shmget.
    unsafe {
        let f: extern "C" fn(libc::key_t, libc::size_t, i32) -> i32 = std::mem::transmute(f);
        f(key, size, shmflg)
    }
}

/// # Safety
/// As `shmat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmat(shmid: i32, addr: *const c_void, shmflg: i32) -> *mut c_void {
    if dsm_enabled() {
        // SAFETY: same contract.
        return unsafe { mmulab_shmat(shmid, addr, shmflg) };
    }
    let f = next(c"shmat");
    if f.is_null() {
        return fail(libc::ENOSYS, usize::MAX as *mut c_void);
    }
    // SAFETY: the C library's shmat.
    unsafe {
        let f: extern "C" fn(i32, *const c_void, i32) -> *mut c_void = std::mem::transmute(f);
        f(shmid, addr, shmflg)
    }
}

/// # Safety
/// As `shmdt(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmdt(addr: *const c_void) -> i32 {
    if dsm_enabled() {
        // SAFETY: same contract.
        return unsafe { mmulab_shmdt(addr) };
    }
    let f = next(c"shmdt");
    if f.is_null() {
        return fail(libc::ENOSYS, -1);
    }
    // SAFETY: the C library's shmdt.
    unsafe {
        let f: extern "C" fn(*const c_void) -> i32 = std::mem::transmute(f);
        f(addr)
    }
}

/// # Safety
/// As `shmctl(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmctl(shmid: i32, cmd: i32, buf: *mut libc::shmid_ds) -> i32 {
    if dsm_enabled() {
        // SAFETY: same contract.
        return unsafe { mmulab_shmctl(shmid, cmd, buf) };
    }
    let f = next(c"shmctl");
    if f.is_null() {
        return fail(libc::ENOSYS, -1);
    }
    // SAFETY: the C library's shmctl.
    unsafe {
        let f: extern "C" fn(i32, i32, *mut libc::shmid_ds) -> i32 = std::mem::transmute(f);
        f(shmid, cmd, buf)
    }
}
