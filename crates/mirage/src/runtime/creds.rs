//! Who is calling: the credentials a System V call is checked against.
//!
//! The kernel checks `shmget`/`shmat`/`shmctl` against the calling
//! thread's credentials at the time of the call (effective uid, fs gid
//! and supplementary groups, capabilities), not against those it had when
//! it first touched System V. A program may switch users between two
//! calls on one connection (`seteuid`), and a fork's child inherits its
//! parent's connection. So the daemon checks every request anew:
//!
//! - The socket has `SO_PASSCRED`, so the kernel attaches to every record
//!   the sender's pid (its thread group), which the sender cannot forge
//!   (`SCM_CREDENTIALS` without `CAP_SYS_ADMIN` may only name itself).
//! - The record names the sending thread (`tid`); the daemon reads that
//!   thread's credentials from `/proc/<pid>/task/<tid>/status` (a thread
//!   outside the kernel-given pid does not resolve there). A thread of
//!   one's own process is no privilege: the caller can run code in it.
//! - Unreadable `/proc` (the process exited, `hidepid`): the kernel's own
//!   `SCM_CREDENTIALS` uid and gid (the real ones), no supplementary group
//!   and no capability: never more than the kernel gave.
//!
//! A pid reused between the send and the read of `/proc` would be read in
//! its place: the sender must have exited by then, and its request's
//! answer goes to a closed socket.

use std::path::Path;

/// Capabilities the checks use (`linux/capability.h`).
pub const CAP_IPC_LOCK: u32 = 14;
pub const CAP_IPC_OWNER: u32 = 15;
pub const CAP_SYS_ADMIN: u32 = 21;

/// A caller's credentials, as the kernel would check them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The process (thread group) id.
    pub pid: i32,
    /// Effective uid (`current_euid()`).
    pub uid: u32,
    /// The gid group checks use (`in_group_p` reads the fs gid, which is
    /// the effective gid unless `setfsgid` changed it).
    pub gid: u32,
    /// The effective gid, recorded as a new segment's group.
    pub egid: u32,
    pub groups: Vec<u32>,
    /// Effective capability set, one bit per capability.
    pub caps: u64,
    /// `RLIMIT_MEMLOCK` (soft), bytes; `None`: unlimited (`SHM_LOCK`).
    pub memlock: Option<u64>,
}

impl Caller {
    /// The daemon's own thread (the Rust API's calls).
    pub fn this_thread() -> Caller {
        // SAFETY: no preconditions.
        let tid = unsafe { nix::libc::gettid() };
        let pid = std::process::id() as i32;
        Caller::from_proc(pid, tid).unwrap_or_else(|| {
            // SAFETY: no preconditions.
            let (uid, gid) = unsafe { (nix::libc::geteuid(), nix::libc::getegid()) };
            Caller {
                pid,
                uid,
                gid,
                egid: gid,
                groups: Vec::new(),
                caps: 0,
                memlock: Some(0),
            }
        })
    }

    /// The credentials of thread `tid` of process `pid`, from `/proc`.
    pub fn from_proc(pid: i32, tid: i32) -> Option<Caller> {
        if pid <= 0 || tid <= 0 {
            return None;
        }
        let dir = Path::new("/proc").join(pid.to_string());
        let status =
            std::fs::read_to_string(dir.join("task").join(tid.to_string()).join("status")).ok()?;
        let mut c = parse_status(pid, &status)?;
        c.memlock = std::fs::read_to_string(dir.join("limits"))
            .ok()
            .and_then(|l| parse_memlock(&l))
            .unwrap_or(Some(0));
        Some(c)
    }

    /// What the kernel alone vouches for (`SCM_CREDENTIALS`: real uid and
    /// gid), with no group and no capability.
    pub fn from_scm(pid: i32, uid: u32, gid: u32) -> Caller {
        Caller {
            pid,
            uid,
            gid,
            egid: gid,
            groups: Vec::new(),
            caps: 0,
            memlock: Some(0),
        }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    pub fn capable(&self, cap: u32) -> bool {
        self.caps & (1u64 << cap) != 0
    }
}

/// `Uid:`, `Gid:`, `Groups:` and `CapEff:` of a `/proc/.../status` text.
fn parse_status(pid: i32, text: &str) -> Option<Caller> {
    let mut uid = None;
    let mut gid = None;
    let mut egid = None;
    let mut groups = Vec::new();
    let mut caps = None;
    for line in text.lines() {
        let (name, rest) = line.split_once(':')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        match name {
            // real, effective, saved, filesystem
            "Uid" => uid = fields.get(1).and_then(|v| v.parse().ok()),
            "Gid" => {
                egid = fields.get(1).and_then(|v| v.parse().ok());
                gid = fields.get(3).and_then(|v| v.parse().ok());
            }
            "Groups" => groups = fields.iter().filter_map(|v| v.parse().ok()).collect(),
            "CapEff" => caps = fields.first().and_then(|v| u64::from_str_radix(v, 16).ok()),
            _ => {}
        }
    }
    Some(Caller {
        pid,
        uid: uid?,
        gid: gid?,
        egid: egid?,
        groups,
        caps: caps?,
        memlock: None,
    })
}

/// The soft `Max locked memory` of a `/proc/<pid>/limits` text: `Some(None)`
/// when unlimited.
fn parse_memlock(text: &str) -> Option<Option<u64>> {
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        Some(None)
    } else {
        soft.parse().ok().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gives_the_effective_uid_the_fs_gid_groups_and_capabilities() {
        let text = "Name:\tx\nUid:\t0\t65534\t0\t65534\nGid:\t0\t65534\t0\t100\n\
                    Groups:\t4 24 \nCapEff:\t000001ffffffffff\n";
        let c = parse_status(7, text).unwrap();
        assert_eq!((c.pid, c.uid, c.gid, c.egid), (7, 65534, 100, 65534));
        assert_eq!(c.groups, vec![4, 24]);
        assert!(c.capable(CAP_IPC_OWNER) && c.in_group(24) && !c.in_group(5));
        let none = "Uid:\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\nGroups:\nCapEff:\t0000000000000000\n";
        assert!(!parse_status(1, none).unwrap().capable(CAP_IPC_OWNER));
        assert!(parse_status(1, "Uid:\t1\t1\t1\t1\n").is_none());
    }

    #[test]
    fn memlock_limits_parse_numbers_and_unlimited() {
        let t = "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max locked memory         8388608              8388608              bytes     \n";
        assert_eq!(parse_memlock(t), Some(Some(8388608)));
        let u = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(parse_memlock(u), Some(None));
    }

    #[test]
    fn this_thread_reads_its_own_credentials() {
        let c = Caller::this_thread();
        // SAFETY: no preconditions.
        assert_eq!(c.uid, unsafe { nix::libc::geteuid() });
        assert_eq!(c.pid, std::process::id() as i32);
    }
}
