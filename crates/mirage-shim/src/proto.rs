//! The local protocol between a program (the shim, `libmmulab_shm.so`)
//! and its site daemon: fixed-size records on a `SOCK_SEQPACKET` Unix
//! socket, so that every message arrives whole and alone (a signal
//! handler's `send` of one record is atomic). A status reply carries text
//! after the record. The memfd of a segment travels with `ATTACH_OK` as
//! `SCM_RIGHTS`.
//!
//! This file is shared verbatim by the daemon (`mmulab-mirage`,
//! `runtime::local`, through `#[path]`) and the shim: one definition.

/// Request and message kinds.
pub mod kind {
    // Program → daemon.
    /// `a` = key (as i32), `b` = size, `c` = shmflg → `REPLY` `a` = shmid.
    ///
    /// Every request names its calling thread in `tid`: the daemon checks
    /// it against that thread's credentials (the kernel gives the pid).
    pub const GET: u32 = 1;
    /// `a` = shmid, `b` = shmflg, `c` = a [`mode`] value → `ATTACH_OK`
    /// (+ memfd; then, on the mprotect path, `PROTECT`s) or `REPLY` error.
    /// On the userfaultfd path the attach is complete only after the
    /// program's `REGISTER`.
    pub const ATTACH: u32 = 2;
    /// `a` = the attach's process number → `REPLY`.
    pub const DETACH: u32 = 3;
    /// `a` = shmid, `b` = cmd (any `shmctl` command), for `IPC_SET` `c` =
    /// mode, `d` = uid, `e` = gid → `REPLY` `a` = the call's return value,
    /// and what it fills in as words of `text` ([`LocalMsg::words`]):
    /// [`STAT_WORDS`], [`INFO_WORDS`] or [`USAGE_WORDS`] by command.
    pub const CTL: u32 = 4;
    /// `a` = shmid, `b` = Δ in ticks → `REPLY`.
    pub const SET_DELTA: u32 = 5;
    /// A page fault: `a` = process, `b` = page, `c` = access, `d` = the
    /// address of the faulter's [`WaitSlot`] → eventually `WAKE`.
    pub const FAULT: u32 = 6;
    /// `id` = the sequence number of the `PROTECT` carried out.
    pub const ACK: u32 = 7;
    /// → `STATUS_TEXT`.
    pub const STATUS: u32 = 8;
    /// Before `fork` returns, on a new connection for the child: `a` = the
    /// parent's attach (process number), `b` = `SHM_RDONLY` or 0 → an
    /// `ATTACH_OK` for the child's copy of that mapping (already mapped);
    /// `c` = a [`mode`] value.
    pub const CLONE: u32 = 9;
    /// The userfaultfd path: the program registered attach `a` (at base
    /// `b`, `c` = [`mode`]`::UFFD`) with its userfaultfd and
    /// write-protected all of it; the userfaultfd itself rides along as
    /// `SCM_RIGHTS` (the daemon keeps the first one of a connection and
    /// serves its faults). `c` = [`mode`]`::MPROTECT`: the program could
    /// not (a fork's child without a userfaultfd) and made the mapping
    /// inaccessible instead; the daemon then drives it with `PROTECT`s.
    /// → `REPLY` (with the `id` of the request being completed).
    pub const REGISTER: u32 = 10;
    /// A fork's child, first thing on the connection it inherited: the
    /// daemon learns its pid (from the kernel's credentials). No answer.
    pub const IDENT: u32 = 11;
    /// `remap_file_pages` on attach `a`'s mapping; `b` = 1 when it covers
    /// the whole mapping → `REPLY` `c` = 1 when the kernel's unmap-then-map
    /// would have destroyed a removed segment: the daemon detached the
    /// attach, and the program unmaps it and fails the call (EINVAL).
    pub const REMAP: u32 = 12;
    // Daemon → program.
    pub const REPLY: u32 = 100;
    /// `id` = the request, `a` = process, `b` = length, `c` = read-only.
    pub const ATTACH_OK: u32 = 101;
    /// `id` = sequence number (0: no acknowledgement wanted), `a` =
    /// process, `b` = first page, `c` = page count, `d` = [`prot`] value.
    pub const PROTECT: u32 = 102;
    /// `a` = the [`WaitSlot`] address, `b` = a [`wake`] value; `text` =
    /// the reason when the fault failed.
    pub const WAKE: u32 = 103;
    /// `id` = the request; UTF-8 text follows the record.
    pub const STATUS_TEXT: u32 = 104;
    /// The userfaultfd path: a fault on the page at address `a` (in the
    /// program) cannot be served coherently (`text` = why). The program's service thread
    /// prints the line, maps an empty memfd over the page and wakes the
    /// faulter, whose retried access takes a SIGBUS there.
    pub const LOST: u32 = 105;
    /// Every `a` ms while the daemon runs, from a thread the core never
    /// blocks: `b` = how long (ms) a program may hear nothing at all
    /// before it takes its daemon for gone (the peers' timeout: a site
    /// stopped that long is dead to its peers, and so to its programs).
    /// No answer.
    pub const ALIVE: u32 = 106;
}

/// Page protection values of `PROTECT`.
pub mod prot {
    pub const NONE: u64 = 0;
    pub const READ: u64 = 1;
    pub const READ_WRITE: u64 = 2;
}

/// How a program catches faults on an attach (`ATTACH`, `CLONE`,
/// `REGISTER`: field `c`).
pub mod mode {
    /// mprotect + SIGSEGV: the program's service thread sets protections
    /// (`PROTECT`) and its signal handler sends `FAULT`s.
    pub const MPROTECT: u64 = 0;
    /// userfaultfd, registered by the program (missing + write-protect),
    /// served by the daemon through the fd the program passed it.
    pub const UFFD: u64 = 1;
}

/// Values a `WAKE` stores in the faulter's slot.
pub mod wake {
    /// Retry the access (it may fault again).
    pub const RETRY: u32 = 1;
    /// The page cannot be served coherently: SIGBUS at that address.
    pub const FAIL: u32 = 2;
    /// A write through a `SHM_RDONLY` attach: a plain segmentation fault.
    pub const SEGV: u32 = 3;
}

/// Fault access types.
pub const ACCESS_READ: u64 = 0;
pub const ACCESS_WRITE: u64 = 1;
pub const ACCESS_UNKNOWN: u64 = 2;

/// Bytes of text a record carries (`WAKE`'s reason).
pub const TEXT_BYTES: usize = 112;
/// Words a record carries in its text (`CTL`'s answers).
pub const WORDS: usize = TEXT_BYTES / 8;

/// `IPC_STAT`, `SHM_STAT`, `SHM_STAT_ANY`: `shmid_ds`'s fields, in this
/// order, as words.
pub const STAT_WORDS: [&str; 14] = [
    "key", "uid", "gid", "cuid", "cgid", "mode", "seq", "segsz", "atime", "dtime", "ctime", "cpid",
    "lpid", "nattch",
];
/// `IPC_INFO`: `shminfo`'s fields.
pub const INFO_WORDS: [&str; 5] = ["shmmax", "shmmin", "shmmni", "shmseg", "shmall"];
/// `SHM_INFO`: `shm_info`'s fields.
pub const USAGE_WORDS: [&str; 3] = ["used_ids", "shm_tot", "shm_rss"];

/// One record. Every field is plain data of fixed size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LocalMsg {
    pub kind: u32,
    /// 0 or a positive errno.
    pub err: i32,
    pub id: u64,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub text: [u8; TEXT_BYTES],
    pub e: u64,
    /// The calling thread (requests); 0 elsewhere.
    pub tid: u32,
    pub pad: u32,
}

pub const MSG_BYTES: usize = std::mem::size_of::<LocalMsg>();
/// The largest message (a status text); receive buffers are this large.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

impl LocalMsg {
    pub const fn new(kind: u32) -> LocalMsg {
        LocalMsg {
            kind,
            err: 0,
            id: 0,
            a: 0,
            b: 0,
            c: 0,
            d: 0,
            text: [0; TEXT_BYTES],
            e: 0,
            tid: 0,
            pad: 0,
        }
    }

    /// Stores words in `text` (at most [`WORDS`]).
    pub fn set_words(&mut self, w: &[u64]) {
        assert!(w.len() <= WORDS, "{} words do not fit a record", w.len());
        self.text = [0; TEXT_BYTES];
        for (i, v) in w.iter().enumerate() {
            self.text[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
    }

    pub fn words(&self) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        for (i, v) in w.iter_mut().enumerate() {
            *v = u64::from_le_bytes(self.text[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        }
        w
    }

    pub fn as_bytes(&self) -> &[u8; MSG_BYTES] {
        // SAFETY: LocalMsg is repr(C) plain data without padding
        // (u32, i32, u64s, 112 bytes, a u64, two u32s).
        unsafe { &*(self as *const LocalMsg as *const [u8; MSG_BYTES]) }
    }

    /// Decodes the record at the start of a message; `None` if short.
    pub fn from_bytes(b: &[u8]) -> Option<LocalMsg> {
        if b.len() < MSG_BYTES {
            return None;
        }
        // SAFETY: at least MSG_BYTES bytes; every bit pattern is valid.
        Some(unsafe { std::ptr::read_unaligned(b.as_ptr() as *const LocalMsg) })
    }

    /// Stores `s` in `text`, cut at a character boundary.
    pub fn set_text(&mut self, s: &str) {
        let mut n = s.len().min(TEXT_BYTES);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.text = [0; TEXT_BYTES];
        self.text[..n].copy_from_slice(&s.as_bytes()[..n]);
    }

    pub fn text_str(&self) -> &str {
        let n = self.text.iter().position(|&c| c == 0).unwrap_or(TEXT_BYTES);
        std::str::from_utf8(&self.text[..n]).unwrap_or("?")
    }
}

/// What a faulting thread sleeps on (on its own stack): the daemon's
/// `WAKE` stores the value, and the reason when it failed.
#[repr(C)]
pub struct WaitSlot {
    pub word: std::sync::atomic::AtomicU32,
    pub text: [u8; TEXT_BYTES],
}

/// The environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "MMULAB_DSM_SOCKET";
/// The fault path (`mprotect`, `uffd`, `uffd-user`; unset: the best the
/// kernel offers), for the daemon and for programs under the shim.
pub const FAULT_PATH_ENV: &str = "MMULAB_DSM_FAULT_PATH";
/// Set: the shim reports its fault path on stderr once.
pub const VERBOSE_ENV: &str = "MMULAB_DSM_VERBOSE";

const _: () = assert!(
    MSG_BYTES == 4 + 4 + 5 * 8 + TEXT_BYTES + 8 + 4 + 4,
    "no padding"
);
