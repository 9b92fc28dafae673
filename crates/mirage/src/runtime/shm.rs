//! The System V-style Rust API over a [`Node`] (issue #7, "API and shim"):
//! `shmget`, `shmat`, `shmdt`, `shmctl` and a call setting Δ.
//!
//! Mirage's rule, kept by the core: the last detach of a segment, on
//! any site, destroys it (§2.2), `IPC_RMID` or not; a later `shmat` of its
//! id fails with `EIDRM`.
//!
//! Limits of this slice: `IPC_STAT`'s `nattch` counts this site's
//! attaches only; `shmget` of an existing key does not check its size;
//! a segment created by the losing side of two simultaneous `IPC_CREAT`s
//! of one key is left unattached (the key names the winner's).

use super::local::Client;
use super::node::{Api, AttachTarget, CopyAnswer, Node};
use crate::core::{Geometry, SegmentId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;

pub const IPC_PRIVATE: i32 = 0;
pub const IPC_CREAT: i32 = 0o1000;
pub const IPC_EXCL: i32 = 0o2000;
pub const SHM_RDONLY: i32 = 0o10000;

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
            ShmError::Removed => libc::EIDRM,
            ShmError::TimedOut => libc::ETIMEDOUT,
            ShmError::Os(_) => libc::EIO,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmCtl {
    Stat,
    /// `IPC_SET`: the mode's permission bits.
    Set {
        mode: u32,
    },
    /// `IPC_RMID`: the key disappears at once; the segment dies at the
    /// last detach on any site (the core's rule, §2.2).
    Rmid,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmStat {
    pub key: i32,
    pub size: usize,
    pub mode: u32,
    /// Attaches on this site.
    pub nattch: usize,
    pub segment: SegmentId,
}

#[derive(Clone, Debug)]
struct Entry {
    key: i32,
    segment: SegmentId,
    size: usize,
    mode: u32,
    removed: bool,
}

/// The API: a [`Node`] plus this site's shmid table.
pub struct Dsm {
    node: Node,
    ids: Mutex<Ids>,
}

#[derive(Default)]
struct Ids {
    next: i32,
    by_id: BTreeMap<i32, Entry>,
    /// Core process of an attach → (shmid, address in this process; 0
    /// for a program's attach through the shim).
    attached: BTreeMap<u32, (i32, usize)>,
}

impl Dsm {
    pub fn new(node: Node) -> Dsm {
        Dsm {
            node,
            ids: Mutex::new(Ids {
                next: 1,
                ..Ids::default()
            }),
        }
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn stop(self) {
        self.node.stop();
    }

    /// Stops the daemon through a shared reference.
    pub fn shutdown(&self) {
        self.node.shutdown();
    }

    fn remember(&self, key: i32, segment: SegmentId, size: usize, mode: u32) -> i32 {
        let mut ids = self.ids.lock().expect("ids");
        if let Some((&id, _)) = ids
            .by_id
            .iter()
            .find(|(_, e)| e.segment == segment && !e.removed)
        {
            return id;
        }
        let id = ids.next;
        ids.next += 1;
        ids.by_id.insert(
            id,
            Entry {
                key,
                segment,
                size,
                mode,
                removed: false,
            },
        );
        id
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

    /// `shmget(key, size, shmflg)`.
    pub fn shmget(&self, key: i32, size: usize, shmflg: i32) -> Result<i32, ShmError> {
        let mode = (shmflg & 0o777) as u32;
        if key == IPC_PRIVATE {
            if size == 0 {
                return Err(ShmError::Invalid);
            }
            let segment = self.create(key, size)?;
            return Ok(self.remember(key, segment, size, mode));
        }
        let found = self
            .node
            .call(|reply| Api::Lookup { key, reply })
            .ok_or(ShmError::TimedOut)?;
        if let Some(segment) = found {
            if shmflg & IPC_CREAT != 0 && shmflg & IPC_EXCL != 0 {
                return Err(ShmError::Exists);
            }
            return Ok(self.remember(key, segment, size, mode));
        }
        if shmflg & IPC_CREAT == 0 {
            return Err(ShmError::NotFound);
        }
        if size == 0 {
            return Err(ShmError::Invalid);
        }
        let mine = self.create(key, size)?;
        let winner = self
            .node
            .call(|reply| Api::Register {
                key,
                segment: mine,
                reply,
            })
            .ok_or(ShmError::TimedOut)?;
        if winner != mine && shmflg & IPC_EXCL != 0 {
            return Err(ShmError::Exists);
        }
        Ok(self.remember(key, winner, size, mode))
    }

    /// `shmat(shmid, addr, shmflg)`: the returned address is a live
    /// mapping whose pages fault into the protocol.
    pub fn shmat(&self, shmid: i32, addr: Option<usize>, shmflg: i32) -> Result<*mut u8, ShmError> {
        let readonly = shmflg & SHM_RDONLY != 0;
        let (base, _) = self.attach(shmid, readonly, AttachTarget::Local { addr, readonly })?;
        Ok(base as *mut u8)
    }

    /// `shmat` for a program on this site (the shim): the core sends the
    /// program the memfd itself; returns the attach's process number.
    pub(crate) fn shmat_remote(
        &self,
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
        Ok(self.attach(shmid, readonly, target)?.1)
    }

    /// `fork` in a program: the child's copy of attach `process`, with
    /// no permission or removal check (System V: a child inherits its
    /// parent's attaches).
    pub(crate) fn clone_remote(
        &self,
        process: u32,
        readonly: bool,
        uffd: bool,
        client: Arc<Client>,
        req: u64,
    ) -> Result<u32, ShmError> {
        let shmid = self
            .ids
            .lock()
            .expect("ids")
            .attached
            .get(&process)
            .map(|&(id, _)| id)
            .ok_or(ShmError::Invalid)?;
        let target = AttachTarget::Remote {
            client,
            readonly,
            uffd,
            req,
        };
        Ok(self.attach_checked(shmid, readonly, target, false)?.1)
    }

    fn attach(
        &self,
        shmid: i32,
        readonly: bool,
        target: AttachTarget,
    ) -> Result<(usize, u32), ShmError> {
        self.attach_checked(shmid, readonly, target, true)
    }

    fn attach_checked(
        &self,
        shmid: i32,
        readonly: bool,
        target: AttachTarget,
        check: bool,
    ) -> Result<(usize, u32), ShmError> {
        let entry = {
            let ids = self.ids.lock().expect("ids");
            ids.by_id.get(&shmid).cloned().ok_or(ShmError::Invalid)?
        };
        if check && entry.removed {
            return Err(ShmError::Removed);
        }
        if check && (entry.mode & 0o400 == 0 || (!readonly && entry.mode & 0o200 == 0)) {
            return Err(ShmError::Access);
        }
        let segment = entry.segment;
        let (base, process, _geometry) = self
            .node
            .call(|reply| Api::Attach {
                segment,
                target,
                reply,
            })
            .ok_or(ShmError::TimedOut)??;
        self.ids
            .lock()
            .expect("ids")
            .attached
            .insert(process, (shmid, base));
        Ok((base, process))
    }

    /// `shmdt(addr)`.
    pub fn shmdt(&self, addr: *mut u8) -> Result<(), ShmError> {
        let process = {
            let ids = self.ids.lock().expect("ids");
            ids.attached
                .iter()
                .find(|(_, (_, base))| *base != 0 && *base == addr as usize)
                .map(|(&p, _)| p)
                .ok_or(ShmError::Invalid)?
        };
        self.shmdt_process(process)
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
            let (&process, &(shmid, _)) = ids
                .attached
                .iter()
                .find(|(_, (_, b))| *b != 0 && *b == base as usize)
                .ok_or(ShmError::Invalid)?;
            let e = ids.by_id.get(&shmid).ok_or(ShmError::Invalid)?;
            (process, e.size, e.segment)
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

    /// Detaches the attach with this core process number.
    pub(crate) fn shmdt_process(&self, process: u32) -> Result<(), ShmError> {
        self.ids
            .lock()
            .expect("ids")
            .attached
            .remove(&process)
            .ok_or(ShmError::Invalid)?;
        self.node
            .call(|reply| Api::Detach { process, reply })
            .ok_or(ShmError::TimedOut)
    }

    /// `shmctl(shmid, cmd)`.
    pub fn shmctl(&self, shmid: i32, cmd: ShmCtl) -> Result<Option<ShmStat>, ShmError> {
        let mut ids = self.ids.lock().expect("ids");
        let nattch = ids.attached.values().filter(|(id, _)| *id == shmid).count();
        let entry = ids.by_id.get_mut(&shmid).ok_or(ShmError::Invalid)?;
        match cmd {
            ShmCtl::Stat => Ok(Some(ShmStat {
                key: if entry.removed {
                    IPC_PRIVATE
                } else {
                    entry.key
                },
                size: entry.size,
                mode: entry.mode,
                nattch,
                segment: entry.segment,
            })),
            ShmCtl::Set { mode } => {
                entry.mode = mode & 0o777;
                Ok(None)
            }
            ShmCtl::Rmid => {
                entry.removed = true;
                let key = entry.key;
                drop(ids);
                if key != IPC_PRIVATE {
                    self.node
                        .shared
                        .send(super::node::Input::Api(Api::RemoveKey { key }));
                }
                Ok(None)
            }
        }
    }

    /// `mmulab dsm status`: the core's view, then this site's shmids.
    pub fn status_text(&self) -> String {
        use std::fmt::Write as _;
        let mut t = self.node.status_text();
        let ids = self.ids.lock().expect("ids");
        let _ = writeln!(t, "shmids on this site:");
        if ids.by_id.is_empty() {
            let _ = writeln!(t, "  none");
        }
        for (id, e) in &ids.by_id {
            let nattch = ids.attached.values().filter(|(i, _)| i == id).count();
            let _ = writeln!(
                t,
                "  shmid {id}: key {}{}, segment {}, {} bytes, mode {:o}, nattch {nattch}",
                e.key,
                if e.removed { " (removed)" } else { "" },
                super::node::seg_name(e.segment),
                e.size,
                e.mode
            );
        }
        t
    }

    /// Sets Δ (in ticks) for every page of a segment created on this site
    /// (Δ lives at the library, §8).
    pub fn set_delta(&self, shmid: i32, ticks: u32) -> Result<(), ShmError> {
        let segment = {
            let ids = self.ids.lock().expect("ids");
            ids.by_id.get(&shmid).ok_or(ShmError::Invalid)?.segment
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
