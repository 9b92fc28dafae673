//! The System V API over a [`Node`] (issue #7, "API and shim"; issue #27,
//! "Unmodified programs see System V shared memory as Linux gives it"):
//! `shmget`, `shmat`, `shmdt`, `shmctl` and a call setting Δ, for the
//! Rust API and for programs under the shim (`local.rs`), each call
//! checked against its caller's credentials ([`Caller`]) as the kernel
//! checks it, with the kernel's errno.
//!
//! Each site keeps a shmid table as the kernel keeps one per IPC
//! namespace ([`super::sysv`]): ids allocated as Linux allocates them
//! (index and sequence number, `shm_next_id` honoured), the limits of
//! `/proc/sys/kernel/shm{max,all,mni}`, `shmid_ds` with owner, creator,
//! mode, times and pids. Segments and keys are the cluster's (the core and
//! the key directory); the table is this site's view:
//!
//! - `nattch` counts this site's attaches, and the times and pids are
//!   those of calls made on this site;
//! - a segment reached through its key from another site gets the
//!   owner, group and mode it was created with there (carried by the key
//!   directory); later `IPC_SET`s stay on the site that made them;
//! - `IPC_RMID` frees the key at once, cluster-wide, and tells the core;
//!   on this site the id is marked `SHM_DEST` (key 0) while attached here
//!   and freed at this site's last detach. The segment itself dies as
//!   [`Semantics`] says: under `sysv` once removed and detached on every
//!   site, under `mirage` (fleisch89 §2.2) at the last detach on any
//!   site, removed or not. Either way its id and key are free again.

use super::config::Semantics;
use super::creds::{CAP_IPC_LOCK, Caller};
use super::local::Client;
use super::node::{Api, AttachTarget, CopyAnswer, Node};
use super::sysv::{self, IdTable, Limits, Perm, SHM_DEST, SHM_LOCKED};
use crate::core::{Geometry, SegmentId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;

pub const IPC_PRIVATE: i32 = 0;
pub const IPC_CREAT: i32 = 0o1000;
pub const IPC_EXCL: i32 = 0o2000;
pub const SHM_RDONLY: i32 = 0o10000;
pub const SHM_EXEC: i32 = 0o100000;

/// `shmctl` commands (`linux/ipc.h`, `linux/shm.h`).
pub mod cmd {
    pub const IPC_RMID: i32 = 0;
    pub const IPC_SET: i32 = 1;
    pub const IPC_STAT: i32 = 2;
    pub const IPC_INFO: i32 = 3;
    pub const SHM_LOCK: i32 = 11;
    pub const SHM_UNLOCK: i32 = 12;
    pub const SHM_STAT: i32 = 13;
    pub const SHM_INFO: i32 = 14;
    pub const SHM_STAT_ANY: i32 = 15;
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShmError {
    #[error("no segment for this key (ENOENT)")]
    NotFound,
    #[error("the key exists (EEXIST)")]
    Exists,
    #[error("invalid argument (EINVAL)")]
    Invalid,
    #[error("permission denied (EACCES)")]
    Access,
    #[error("operation not permitted (EPERM)")]
    NotPermitted,
    #[error("no space: a limit of /proc/sys/kernel/shm* (ENOSPC)")]
    NoSpace,
    #[error("out of memory (ENOMEM)")]
    NoMemory,
    #[error("segment removed (EIDRM)")]
    Removed,
    #[error("no answer from the site daemon in time")]
    TimedOut,
    #[error("{0}")]
    Os(String),
}

impl ShmError {
    pub fn errno(&self) -> i32 {
        use nix::libc;
        match self {
            ShmError::NotFound => libc::ENOENT,
            ShmError::Exists => libc::EEXIST,
            ShmError::Invalid => libc::EINVAL,
            ShmError::Access => libc::EACCES,
            ShmError::NotPermitted => libc::EPERM,
            ShmError::NoSpace => libc::ENOSPC,
            ShmError::NoMemory => libc::ENOMEM,
            ShmError::Removed => libc::EIDRM,
            ShmError::TimedOut => libc::ETIMEDOUT,
            ShmError::Os(_) => libc::EIO,
        }
    }

    fn from_errno(e: i32) -> ShmError {
        use nix::libc;
        match e {
            libc::EINVAL => ShmError::Invalid,
            libc::EPERM => ShmError::NotPermitted,
            libc::ENOMEM => ShmError::NoMemory,
            libc::EACCES => ShmError::Access,
            _ => ShmError::Os(std::io::Error::from_raw_os_error(e).to_string()),
        }
    }
}

/// What the checked accessors ([`Dsm::read_at`], [`Dsm::write_at`])
/// return instead of the SIGBUS a raw access to a lost page gets.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DsmError {
    /// The page is lost: its only current copy was at `site` (declared
    /// dead), or, with `site` `None`, its request went unanswered in
    /// time. Coherence before availability: never an older copy.
    #[error("segment {segment} page {page}: lost ({reason})")]
    PageLost {
        segment: String,
        page: u32,
        site: Option<String>,
        reason: String,
    },
    #[error("{0}")]
    Shm(#[from] ShmError),
}

/// The Rust API's `shmctl` commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmCtl {
    Stat,
    /// `IPC_SET`: the mode's permission bits (owner and group unchanged).
    Set {
        mode: u32,
    },
    /// `IPC_RMID` (see the module's notes).
    Rmid,
    /// `SHM_LOCK`: pins this site's copy in memory.
    Lock,
    Unlock,
}

/// `shmid_ds`, as this site sees the segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmStat {
    /// The id (`SHM_STAT` returns it).
    pub id: i32,
    pub key: i32,
    pub size: usize,
    /// Permission bits plus `SHM_DEST` (0o1000) and `SHM_LOCKED` (0o2000).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub cuid: u32,
    pub cgid: u32,
    /// Seconds since the epoch (0: never).
    pub atime: i64,
    pub dtime: i64,
    pub ctime: i64,
    pub cpid: i32,
    pub lpid: i32,
    /// Attaches on this site.
    pub nattch: usize,
    pub segment: SegmentId,
}

/// `IPC_INFO`'s `shminfo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmInfo {
    pub shmmax: u64,
    pub shmmin: u64,
    pub shmmni: u64,
    pub shmseg: u64,
    pub shmall: u64,
}

/// `SHM_INFO`'s `shm_info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmUsage {
    pub used_ids: u64,
    /// Pages of all segments on this site.
    pub shm_tot: u64,
    /// Pages present in this site's copies.
    pub shm_rss: u64,
}

/// What a `shmctl` gives back: its return value and what it fills in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CtlOut {
    Done,
    Stat(ShmStat),
    /// `IPC_INFO`: the highest index in use (0 with none).
    Info(i32, ShmInfo),
    /// `SHM_INFO`: likewise.
    Usage(i32, ShmUsage),
}

impl CtlOut {
    /// The call's return value: 0, or the id (`SHM_STAT`), or the
    /// highest index in use (`IPC_INFO`, `SHM_INFO`).
    pub fn ret(&self, cmd: i32) -> i32 {
        match self {
            CtlOut::Stat(st) if cmd != self::cmd::IPC_STAT => st.id,
            CtlOut::Info(r, _) | CtlOut::Usage(r, _) => *r,
            _ => 0,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    perm: Perm,
    segment: SegmentId,
    size: usize,
    atime: i64,
    dtime: i64,
    ctime: i64,
    cpid: i32,
    lpid: i32,
    /// The uid whose lock budget a `SHM_LOCK` was counted against.
    locked_by: Option<u32>,
}

/// An attach on this site.
#[derive(Clone)]
struct Attach {
    id: i32,
    segment: SegmentId,
    size: usize,
    /// Its address in this process (the Rust API); 0 for a program's.
    base: usize,
    /// The program's connection (the shim's attaches).
    client: Option<Arc<Client>>,
}

/// The API: a [`Node`] plus this site's shmid table.
pub struct Dsm {
    node: Node,
    ids: Mutex<Ids>,
    /// `shmget` on this site, one at a time: a key's lookup and creation
    /// are one step here, as under the kernel's lock.
    get_lock: Mutex<()>,
}

#[derive(Default)]
struct Ids {
    table: IdTable<Entry>,
    /// Core process of an attach → the attach.
    attached: BTreeMap<u32, Attach>,
    /// `shm_next_id` values used while it could not be reset.
    next_id_used: Option<i32>,
    /// Segments the core destroyed lately, newest last (bounded): a key
    /// directory that has not heard of a destruction yet may still name
    /// one.
    dead: std::collections::VecDeque<SegmentId>,
}

/// How many destroyed segments [`Ids::dead`] remembers.
const DEAD_REMEMBERED: usize = 4096;

impl Ids {
    fn nattch(&self, id: i32) -> usize {
        self.attached.values().filter(|a| a.id == id).count()
    }

    fn id_of(&self, segment: SegmentId) -> Option<i32> {
        self.table
            .iter()
            .find(|(_, e)| e.segment == segment)
            .map(|(id, _)| id)
    }

    fn stat(&self, id: i32) -> Option<ShmStat> {
        let e = self.table.get(id)?;
        Some(ShmStat {
            id,
            key: e.perm.key,
            size: e.size,
            mode: e.perm.mode,
            uid: e.perm.uid,
            gid: e.perm.gid,
            cuid: e.perm.cuid,
            cgid: e.perm.cgid,
            atime: e.atime,
            dtime: e.dtime,
            ctime: e.ctime,
            cpid: e.cpid,
            lpid: e.lpid,
            nattch: self.nattch(id),
            segment: e.segment,
        })
    }

    fn total_pages(&self) -> u64 {
        let ps = super::page_size();
        self.table
            .iter()
            .map(|(_, e)| e.size.div_ceil(ps) as u64)
            .sum()
    }
}

/// Seconds since the epoch, as Linux stamps `shm_atime`, `shm_dtime` and
/// `shm_ctime` (`ktime_get_real_seconds`): the coarse real-time clock,
/// which is also what a program's `time(2)` reads. The fine clock of
/// `SystemTime::now()` runs up to a tick ahead of it, so just after a
/// second boundary a time stamped from it would lie in the program's
/// future (the conformance test caught a detach time one second ahead).
fn now_secs() -> i64 {
    rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse).tv_sec
}

pub use crate::wire::SegmentOrigin as Origin;

impl Dsm {
    pub fn new(node: Node) -> Dsm {
        Dsm {
            node,
            ids: Mutex::new(Ids::default()),
            get_lock: Mutex::new(()),
        }
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn semantics(&self) -> Semantics {
        self.node.config().semantics
    }

    pub fn stop(self) {
        self.node.stop();
    }

    /// Stops the daemon through a shared reference.
    pub fn shutdown(&self) {
        self.node.shutdown();
    }

    /// Detaches the attaches of programs that exited, before a call looks
    /// at the table: the kernel detaches at exit, before the parent's
    /// `waitpid` returns, while the daemon hears of an exit when it reads
    /// the end of that program's socket. A hung-up socket is as good.
    fn reap(&self) {
        let gone: Vec<(u32, Arc<Client>)> = {
            let ids = self.ids.lock().expect("ids");
            ids.attached
                .iter()
                .filter_map(|(&p, a)| a.client.as_ref().map(|c| (p, c.clone())))
                .filter(|(_, c)| c.hung_up())
                .collect()
        };
        for (process, client) in gone {
            client.processes.lock().expect("processes").remove(&process);
            let _ = self.shmdt_process(process, client.pid());
        }
    }

    /// Frees the ids of segments the core destroyed since the last look.
    fn sweep(&self, ids: &mut Ids) {
        for segment in self.node.take_destroyed() {
            if let Some(id) = ids.id_of(segment) {
                debug_assert_eq!(ids.nattch(id), 0, "destroyed while attached here");
                ids.table.remove(id);
            }
            if ids.dead.len() == DEAD_REMEMBERED {
                ids.dead.pop_front();
            }
            ids.dead.push_back(segment);
        }
    }

    fn create(&self, key: i32, size: usize) -> Result<SegmentId, ShmError> {
        let page = super::page_size();
        let geometry = Geometry {
            name: format!("key-{key}"),
            pages: size.div_ceil(page) as u32,
            page_bytes: page as u32,
            window_ticks: if key == IPC_PRIVATE {
                0
            } else {
                self.node.config().delta_ticks(key)
            },
        };
        self.node
            .call(|reply| Api::Create { geometry, reply })
            .ok_or(ShmError::TimedOut)
    }

    /// `shmget(key, size, shmflg)` as this process's calling thread.
    pub fn shmget(&self, key: i32, size: usize, shmflg: i32) -> Result<i32, ShmError> {
        self.shmget_as(&Caller::this_thread(), key, size, shmflg)
    }

    /// `shmget` for `caller`, in the kernel's order (`ipcget_public`): an
    /// existing key's `IPC_EXCL`, size and permission; a new segment's
    /// size, limits and `SHM_HUGETLB` (`newseg`).
    pub fn shmget_as(
        &self,
        caller: &Caller,
        key: i32,
        size: usize,
        shmflg: i32,
    ) -> Result<i32, ShmError> {
        let _one = self.get_lock.lock().expect("get lock");
        self.reap();
        if key == IPC_PRIVATE {
            return self.newseg(caller, key, size, shmflg, None);
        }
        // A key whose segment died a moment ago may still be in the
        // directory (its destruction crosses the lookup), and two sites
        // may create one key at once: bounded retries.
        for _ in 0..50 {
            let found = self
                .node
                .call(|reply| Api::Lookup { key, reply })
                .ok_or(ShmError::TimedOut)?;
            let mut ids = self.ids.lock().expect("ids");
            self.sweep(&mut ids);
            if let Some((segment, origin)) = found {
                let id = match ids.id_of(segment) {
                    Some(id) => id,
                    None if ids.dead.contains(&segment) => {
                        drop(ids);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        continue;
                    }
                    None => {
                        // Created on another site: its origin, as the
                        // directory recorded it.
                        let Some(origin) = origin else {
                            return Err(ShmError::Os(
                                "the key directory has no owner for this segment".into(),
                            ));
                        };
                        let entry = Entry {
                            perm: Perm {
                                key,
                                uid: origin.uid,
                                gid: origin.gid,
                                cuid: origin.uid,
                                cgid: origin.gid,
                                mode: origin.mode & 0o777,
                            },
                            segment,
                            size: origin.size as usize,
                            atime: 0,
                            dtime: 0,
                            ctime: now_secs(),
                            cpid: 0,
                            lpid: 0,
                            locked_by: None,
                        };
                        let limit = Limits::read().shmmni;
                        ids.table
                            .alloc(None, limit, entry)
                            .ok_or(ShmError::NoSpace)?
                    }
                };
                if shmflg & IPC_CREAT != 0 && shmflg & IPC_EXCL != 0 {
                    return Err(ShmError::Exists);
                }
                let e = ids.table.get(id).expect("just found");
                if e.size < size {
                    return Err(ShmError::Invalid);
                }
                if !sysv::ipcperms(caller, &e.perm, shmflg) {
                    return Err(ShmError::Access);
                }
                return Ok(id);
            }
            drop(ids);
            if shmflg & IPC_CREAT == 0 {
                return Err(ShmError::NotFound);
            }
            let origin = Origin {
                uid: caller.uid,
                gid: caller.egid,
                mode: (shmflg & 0o777) as u32,
                size: size as u64,
            };
            match self.newseg(caller, key, size, shmflg, Some(origin)) {
                // Another site registered the key first: look again.
                Err(ShmError::Exists) if shmflg & IPC_EXCL == 0 => continue,
                r => return r,
            }
        }
        Err(ShmError::TimedOut)
    }

    /// A new segment (`newseg`): checks, id, creation in the core, and for
    /// a key its registration in the directory.
    fn newseg(
        &self,
        caller: &Caller,
        key: i32,
        size: usize,
        shmflg: i32,
        origin: Option<Origin>,
    ) -> Result<i32, ShmError> {
        let limits = Limits::read();
        let ps = super::page_size() as u64;
        let size64 = size as u64;
        if size64 < sysv::SHMMIN || size64 > limits.shmmax {
            return Err(ShmError::Invalid);
        }
        let pages = size64.div_ceil(ps);
        {
            let mut ids = self.ids.lock().expect("ids");
            self.sweep(&mut ids);
            let tot = ids.total_pages();
            if tot.checked_add(pages).is_none_or(|t| t > limits.shmall) {
                return Err(ShmError::NoSpace);
            }
            if shmflg & sysv::SHM_HUGETLB != 0 {
                return Err(ShmError::from_errno(sysv::hugetlb_errno(
                    caller, size64, shmflg,
                )));
            }
            if ids.table.in_use() >= limits.shmmni as usize {
                return Err(ShmError::NoSpace);
            }
        }
        let mine = self.create(key, size)?;
        let segment = match origin {
            None => mine,
            Some(origin) => {
                let winner = self
                    .node
                    .call(|reply| Api::Register {
                        key,
                        segment: mine,
                        origin,
                        reply,
                    })
                    .ok_or(ShmError::TimedOut)?;
                if winner != mine {
                    // Another site created the key first: ours goes
                    // (never attached, it dies at once).
                    self.node
                        .shared
                        .send(super::node::Input::Api(Api::Remove { segment: mine }));
                    return Err(ShmError::Exists);
                }
                winner
            }
        };
        let mut ids = self.ids.lock().expect("ids");
        let next = sysv::read_next_id().filter(|&n| Some(n) != ids.next_id_used);
        let entry = Entry {
            perm: Perm {
                key,
                uid: caller.uid,
                gid: caller.egid,
                cuid: caller.uid,
                cgid: caller.egid,
                mode: (shmflg & 0o777) as u32,
            },
            segment,
            size,
            atime: 0,
            dtime: 0,
            ctime: now_secs(),
            cpid: caller.pid,
            lpid: 0,
            locked_by: None,
        };
        let Some(id) = ids.table.alloc(next, limits.shmmni, entry) else {
            drop(ids);
            self.forget(key, segment);
            return Err(ShmError::NoSpace);
        };
        if next.is_some() {
            ids.next_id_used = if sysv::consume_next_id() { None } else { next };
        }
        Ok(id)
    }

    /// A segment created in vain: its key and the segment go.
    fn forget(&self, key: i32, segment: SegmentId) {
        if key != IPC_PRIVATE {
            self.node
                .shared
                .send(super::node::Input::Api(Api::RemoveKey { key }));
        }
        self.node
            .shared
            .send(super::node::Input::Api(Api::Remove { segment }));
    }

    /// `shmat(shmid, addr, shmflg)` as this thread: the returned address
    /// is a live mapping whose pages fault into the protocol.
    pub fn shmat(&self, shmid: i32, addr: Option<usize>, shmflg: i32) -> Result<*mut u8, ShmError> {
        let readonly = shmflg & SHM_RDONLY != 0;
        let caller = Caller::this_thread();
        let (base, _) = self.attach(
            &caller,
            shmid,
            shmflg,
            AttachTarget::Local { addr, readonly },
        )?;
        Ok(base as *mut u8)
    }

    /// `shmat` for a program on this site (the shim): the core sends the
    /// program the memfd itself; returns the attach's process number.
    pub(crate) fn shmat_remote(
        &self,
        caller: &Caller,
        shmid: i32,
        shmflg: i32,
        uffd: bool,
        client: Arc<Client>,
        req: u64,
    ) -> Result<u32, ShmError> {
        let readonly = shmflg & SHM_RDONLY != 0;
        let target = AttachTarget::Remote {
            client,
            readonly,
            uffd,
            req,
        };
        Ok(self.attach(caller, shmid, shmflg, target)?.1)
    }

    /// `fork` in a program: the child's copy of attach `process`, with
    /// no permission or removal check (System V: a child inherits its
    /// parent's attaches, `shm_open` in the fork).
    pub(crate) fn clone_remote(
        &self,
        caller: &Caller,
        process: u32,
        readonly: bool,
        uffd: bool,
        client: Arc<Client>,
        req: u64,
    ) -> Result<u32, ShmError> {
        let id = self
            .ids
            .lock()
            .expect("ids")
            .attached
            .get(&process)
            .map(|a| a.id)
            .ok_or(ShmError::Invalid)?;
        let target = AttachTarget::Remote {
            client,
            readonly,
            uffd,
            req,
        };
        Ok(self.attach_checked(caller, id, 0, target, false)?.1)
    }

    fn attach(
        &self,
        caller: &Caller,
        shmid: i32,
        shmflg: i32,
        target: AttachTarget,
    ) -> Result<(usize, u32), ShmError> {
        self.attach_checked(caller, shmid, shmflg, target, true)
    }

    /// `do_shmat`'s checks (with `check`): the id, then the access the
    /// flags ask for. A segment marked `SHM_DEST` may still be attached,
    /// as on Linux.
    fn attach_checked(
        &self,
        caller: &Caller,
        shmid: i32,
        shmflg: i32,
        target: AttachTarget,
        check: bool,
    ) -> Result<(usize, u32), ShmError> {
        let (segment, size) = {
            let mut ids = self.ids.lock().expect("ids");
            self.sweep(&mut ids);
            let e = ids.table.get(shmid).ok_or(ShmError::Invalid)?;
            if check {
                let mut acc = if shmflg & SHM_RDONLY != 0 {
                    0o444
                } else {
                    0o666
                };
                if shmflg & SHM_EXEC != 0 {
                    acc |= 0o111;
                }
                if !sysv::ipcperms(caller, &e.perm, acc) {
                    return Err(ShmError::Access);
                }
            }
            (e.segment, e.size)
        };
        let client = match &target {
            AttachTarget::Remote { client, .. } => Some(client.clone()),
            AttachTarget::Local { .. } => None,
        };
        let (base, process, _geometry) = self
            .node
            .call(|reply| Api::Attach {
                segment,
                target,
                reply,
            })
            .ok_or(ShmError::TimedOut)??;
        let mut ids = self.ids.lock().expect("ids");
        ids.attached.insert(
            process,
            Attach {
                id: shmid,
                segment,
                size,
                base,
                client,
            },
        );
        if let Some(e) = ids.table.get_mut(shmid) {
            e.atime = now_secs();
            e.lpid = caller.pid;
        }
        Ok((base, process))
    }

    /// `shmdt(addr)`.
    pub fn shmdt(&self, addr: *mut u8) -> Result<(), ShmError> {
        let process = {
            let ids = self.ids.lock().expect("ids");
            ids.attached
                .iter()
                .find(|(_, a)| a.base != 0 && a.base == addr as usize)
                .map(|(&p, _)| p)
                .ok_or(ShmError::Invalid)?
        };
        self.shmdt_process(process, std::process::id() as i32)
    }

    /// Checked read: copies `buf.len()` bytes at `offset` of the segment
    /// attached at `base` into `buf`, through the protocol (a page not
    /// held here is asked for exactly as a fault would). A lost page is
    /// `Err(DsmError::PageLost)`, where a raw load from `base` gets
    /// SIGBUS (plus one stderr line), exactly as in C.
    pub fn read_at(&self, base: *mut u8, offset: usize, buf: &mut [u8]) -> Result<(), DsmError> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.access(base, offset + done, buf.len() - done, None)?;
            let got = n.len();
            buf[done..done + got].copy_from_slice(&n);
            done += got;
        }
        Ok(())
    }

    /// Checked write: the counterpart of [`Dsm::read_at`]; a raw store
    /// to a lost page gets SIGBUS.
    pub fn write_at(&self, base: *mut u8, offset: usize, data: &[u8]) -> Result<(), DsmError> {
        let mut done = 0;
        while done < data.len() {
            done += self
                .access(base, offset + done, data.len() - done, Some(&data[done..]))?
                .len();
        }
        Ok(())
    }

    /// One page's share of a checked access; returns the bytes read, or
    /// (for a write) as many bytes as were written, as a vector of that
    /// length.
    fn access(
        &self,
        base: *mut u8,
        offset: usize,
        want: usize,
        write: Option<&[u8]>,
    ) -> Result<Vec<u8>, DsmError> {
        let (process, size, segment) = {
            let ids = self.ids.lock().expect("ids");
            let (&process, a) = ids
                .attached
                .iter()
                .find(|(_, a)| a.base != 0 && a.base == base as usize)
                .ok_or(ShmError::Invalid)?;
            (process, a.size, a.segment)
        };
        if offset + want > size {
            return Err(ShmError::Invalid.into());
        }
        let ps = super::page_size();
        let (page, at) = ((offset / ps) as u32, offset % ps);
        let len = want.min(ps - at);
        loop {
            let data = write.map(|d| d[..len].to_vec());
            let answer = self
                .node
                .call(|reply| Api::Copy {
                    process,
                    page,
                    at,
                    len,
                    write: data,
                    reply,
                })
                .ok_or(ShmError::TimedOut)?;
            match answer {
                CopyAnswer::Done(_) if write.is_some() => return Ok(vec![0; len]),
                CopyAnswer::Done(bytes) => return Ok(bytes),
                CopyAnswer::Retry(rx) => {
                    // Served, failed or lost: ask again (bounded by the
                    // daemon's request timeout, which fails the fault).
                    let _ = rx.recv_timeout(self.node.options().request_timeout * 2);
                }
                CopyAnswer::Lost(site, reason) => {
                    return Err(DsmError::PageLost {
                        segment: super::node::seg_name(segment),
                        page,
                        site,
                        reason,
                    });
                }
                CopyAnswer::Error(e) => return Err(e.into()),
            }
        }
    }

    /// Detaches the attach with this core process number, for process
    /// `pid` (`shm_close`: `shm_dtim`, `shm_lprid`). A segment marked
    /// `SHM_DEST` leaves this site's table with its last attach here.
    pub(crate) fn shmdt_process(&self, process: u32, pid: i32) -> Result<(), ShmError> {
        {
            let mut ids = self.ids.lock().expect("ids");
            let a = ids.attached.remove(&process).ok_or(ShmError::Invalid)?;
            let left = ids.nattch(a.id);
            if let Some(e) = ids.table.get_mut(a.id) {
                e.dtime = now_secs();
                e.lpid = pid;
                if left == 0 && e.perm.mode & SHM_DEST != 0 {
                    ids.table.remove(a.id);
                }
            }
        }
        self.node
            .call(|reply| Api::Detach { process, reply })
            .ok_or(ShmError::TimedOut)
    }

    /// Whether attach `process` is the last on this site of a segment
    /// marked `SHM_DEST` (a `remap_file_pages` of it would destroy it, as
    /// the kernel's unmap-then-map does).
    pub(crate) fn last_attach_of_removed(&self, process: u32) -> Result<bool, ShmError> {
        let ids = self.ids.lock().expect("ids");
        let a = ids.attached.get(&process).ok_or(ShmError::Invalid)?;
        let dest = ids
            .table
            .get(a.id)
            .is_some_and(|e| e.perm.mode & SHM_DEST != 0);
        Ok(dest && ids.nattch(a.id) == 1)
    }

    /// `shmctl(shmid, cmd)` as this thread (the Rust API).
    pub fn shmctl(&self, shmid: i32, c: ShmCtl) -> Result<Option<ShmStat>, ShmError> {
        let caller = Caller::this_thread();
        let out = match c {
            ShmCtl::Stat => self.ctl(&caller, shmid, cmd::IPC_STAT, None)?,
            ShmCtl::Set { mode } => {
                let st = self.ctl(&caller, shmid, cmd::IPC_STAT, None)?;
                let CtlOut::Stat(st) = st else {
                    unreachable!("IPC_STAT answers a stat")
                };
                let set = SetArgs {
                    uid: st.uid,
                    gid: st.gid,
                    mode,
                };
                self.ctl(&caller, shmid, cmd::IPC_SET, Some(set))?
            }
            ShmCtl::Rmid => self.ctl(&caller, shmid, cmd::IPC_RMID, None)?,
            ShmCtl::Lock => self.ctl(&caller, shmid, cmd::SHM_LOCK, None)?,
            ShmCtl::Unlock => self.ctl(&caller, shmid, cmd::SHM_UNLOCK, None)?,
        };
        Ok(match out {
            CtlOut::Stat(st) => Some(st),
            _ => None,
        })
    }

    /// Every `shmctl` command for `caller`, in the kernel's order
    /// (`ksys_shmctl` and the functions it calls), with its errno.
    pub fn ctl(
        &self,
        caller: &Caller,
        shmid: i32,
        c: i32,
        set: Option<SetArgs>,
    ) -> Result<CtlOut, ShmError> {
        if c < 0 || shmid < 0 {
            return Err(ShmError::Invalid);
        }
        self.reap();
        let mut ids = self.ids.lock().expect("ids");
        self.sweep(&mut ids);
        match c {
            cmd::IPC_INFO => {
                let l = Limits::read();
                let info = ShmInfo {
                    shmmax: l.shmmax,
                    shmmin: sysv::SHMMIN,
                    shmmni: l.shmmni as u64,
                    shmseg: l.shmmni as u64,
                    shmall: l.shmall,
                };
                Ok(CtlOut::Info(ids.table.max_idx().max(0), info))
            }
            cmd::SHM_INFO => {
                let segments: Vec<SegmentId> = ids.table.iter().map(|(_, e)| e.segment).collect();
                let usage = ShmUsage {
                    used_ids: ids.table.in_use() as u64,
                    shm_tot: ids.total_pages(),
                    shm_rss: 0,
                };
                let max = ids.table.max_idx().max(0);
                drop(ids);
                let rss = self
                    .node
                    .call(|reply| Api::Resident { segments, reply })
                    .unwrap_or(0);
                Ok(CtlOut::Usage(
                    max,
                    ShmUsage {
                        shm_rss: rss,
                        ..usage
                    },
                ))
            }
            cmd::SHM_STAT | cmd::SHM_STAT_ANY => {
                let (id, e) = ids.table.by_index(shmid).ok_or(ShmError::Invalid)?;
                if c == cmd::SHM_STAT && !sysv::ipcperms(caller, &e.perm, 0o444) {
                    return Err(ShmError::Access);
                }
                Ok(CtlOut::Stat(ids.stat(id).expect("present")))
            }
            cmd::IPC_STAT => {
                let e = ids.table.get(shmid).ok_or(ShmError::Invalid)?;
                if !sysv::ipcperms(caller, &e.perm, 0o444) {
                    return Err(ShmError::Access);
                }
                Ok(CtlOut::Stat(ids.stat(shmid).expect("present")))
            }
            cmd::IPC_SET => {
                let set = set.ok_or(ShmError::Invalid)?;
                let e = ids.table.get_mut(shmid).ok_or(ShmError::Invalid)?;
                if !sysv::is_owner(caller, &e.perm) {
                    return Err(ShmError::NotPermitted);
                }
                // ipc_update_perm: ids that map to no user are invalid.
                if set.uid == u32::MAX || set.gid == u32::MAX {
                    return Err(ShmError::Invalid);
                }
                e.perm.uid = set.uid;
                e.perm.gid = set.gid;
                e.perm.mode = (e.perm.mode & !0o777) | (set.mode & 0o777);
                e.ctime = now_secs();
                Ok(CtlOut::Done)
            }
            cmd::IPC_RMID => {
                let e = ids.table.get(shmid).ok_or(ShmError::Invalid)?;
                if !sysv::is_owner(caller, &e.perm) {
                    return Err(ShmError::NotPermitted);
                }
                let (key, segment) = (e.perm.key, e.segment);
                if ids.nattch(shmid) > 0 {
                    let e = ids.table.get_mut(shmid).expect("present");
                    e.perm.mode |= SHM_DEST;
                    e.perm.key = IPC_PRIVATE;
                } else {
                    ids.table.remove(shmid);
                }
                drop(ids);
                // The key is free at once; the segment dies as the
                // semantics say (the core's lifetime rule).
                self.forget(key, segment);
                Ok(CtlOut::Done)
            }
            cmd::SHM_LOCK | cmd::SHM_UNLOCK => {
                let lock = c == cmd::SHM_LOCK;
                let e = ids.table.get(shmid).ok_or(ShmError::Invalid)?;
                if !caller.capable(CAP_IPC_LOCK) {
                    if caller.uid != e.perm.uid && caller.uid != e.perm.cuid {
                        return Err(ShmError::NotPermitted);
                    }
                    if lock && caller.memlock == Some(0) {
                        return Err(ShmError::NotPermitted);
                    }
                }
                let locked = e.perm.mode & SHM_LOCKED != 0;
                if lock == locked {
                    return Ok(CtlOut::Done);
                }
                let ps = super::page_size() as u64;
                if lock && !caller.capable(CAP_IPC_LOCK) {
                    // user_shm_lock: this user's locked segments count
                    // against RLIMIT_MEMLOCK.
                    let pages = |size: usize| (size as u64).div_ceil(ps);
                    let mine: u64 = ids
                        .table
                        .iter()
                        .filter(|(_, o)| o.locked_by == Some(caller.uid))
                        .map(|(_, o)| pages(o.size))
                        .sum();
                    if let Some(limit) = caller.memlock
                        && mine + pages(e.size) > limit / ps
                    {
                        return Err(ShmError::NoMemory);
                    }
                }
                let segment = e.segment;
                let pinned = self
                    .node
                    .call(|reply| Api::Lock {
                        segment,
                        on: lock,
                        reply,
                    })
                    .ok_or(ShmError::TimedOut)?;
                if let Err(err) = pinned {
                    return Err(ShmError::from_errno(err.raw_os_error().unwrap_or(0)));
                }
                let e = ids.table.get_mut(shmid).expect("present");
                if lock {
                    e.perm.mode |= SHM_LOCKED;
                    e.locked_by = Some(caller.uid);
                } else {
                    e.perm.mode &= !SHM_LOCKED;
                    e.locked_by = None;
                }
                Ok(CtlOut::Done)
            }
            _ => Err(ShmError::Invalid),
        }
    }

    /// `mmulab dsm status`: the core's view, then this site's shmids.
    pub fn status_text(&self) -> String {
        match self.status() {
            Ok(s) => s.render(),
            Err(e) => format!("{e}\n"),
        }
    }

    /// [`Dsm::status_text`] as data; Err when the core did not answer.
    pub fn status(&self) -> Result<super::status::SiteStatus, String> {
        let mut s = self
            .node
            .status()
            .ok_or_else(|| "no answer from the core in time".to_string())?;
        let mut ids = self.ids.lock().expect("ids");
        self.sweep(&mut ids);
        s.semantics = Some(
            match self.semantics() {
                Semantics::Sysv => "sysv",
                Semantics::Mirage => "mirage",
            }
            .into(),
        );
        for (id, e) in ids.table.iter() {
            s.shmids.push(super::status::ShmidStatus {
                shmid: id,
                key: e.perm.key,
                removed: e.perm.mode & SHM_DEST != 0,
                segment: super::node::seg_name(e.segment),
                bytes: e.size,
                uid: e.perm.uid,
                gid: e.perm.gid,
                mode: e.perm.mode & 0o777,
                nattch: ids.nattch(id),
            });
        }
        Ok(s)
    }

    /// Sets Δ (in ticks) for every page of a segment created on this site
    /// (Δ lives at the library, §8).
    pub fn set_delta(&self, shmid: i32, ticks: u32) -> Result<(), ShmError> {
        let segment = {
            let ids = self.ids.lock().expect("ids");
            ids.table.get(shmid).ok_or(ShmError::Invalid)?.segment
        };
        match self.node.call(|reply| Api::SetWindow {
            segment,
            ticks,
            reply,
        }) {
            Some(true) => Ok(()),
            Some(false) => Err(ShmError::Invalid),
            None => Err(ShmError::TimedOut),
        }
    }
}

/// `IPC_SET`'s arguments: `shm_perm.uid`, `.gid` and `.mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetArgs {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}
