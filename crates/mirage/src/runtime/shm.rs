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

use super::node::{Api, Node};
use crate::core::{Geometry, SegmentId};
use std::collections::BTreeMap;
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
    /// Attach address → (shmid, core process of the attach).
    attached: BTreeMap<usize, (i32, u32)>,
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
        let entry = {
            let ids = self.ids.lock().expect("ids");
            ids.by_id.get(&shmid).cloned().ok_or(ShmError::Invalid)?
        };
        if entry.removed {
            return Err(ShmError::Removed);
        }
        let readonly = shmflg & SHM_RDONLY != 0;
        if entry.mode & 0o400 == 0 || (!readonly && entry.mode & 0o200 == 0) {
            return Err(ShmError::Access);
        }
        let segment = entry.segment;
        let (base, process, _geometry) = self
            .node
            .call(|reply| Api::Attach {
                segment,
                addr,
                readonly,
                reply,
            })
            .ok_or(ShmError::TimedOut)??;
        self.ids
            .lock()
            .expect("ids")
            .attached
            .insert(base, (shmid, process));
        Ok(base as *mut u8)
    }

    /// `shmdt(addr)`.
    pub fn shmdt(&self, addr: *mut u8) -> Result<(), ShmError> {
        let (_, process) = self
            .ids
            .lock()
            .expect("ids")
            .attached
            .remove(&(addr as usize))
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
