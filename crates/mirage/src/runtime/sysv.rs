//! Linux's System V shared-memory rules, without I/O to the cluster: the
//! id allocator, the permission check, the limits and the `SHM_HUGETLB`
//! checks, each written after the kernel's own (`ipc/util.c`,
//! `ipc/shm.c`, `fs/hugetlbfs/inode.c`; cited per function). The shmid
//! table of a site ([`super::shm::Dsm`]) is built on them.

use super::creds::{CAP_IPC_LOCK, CAP_IPC_OWNER, Caller};
use std::collections::BTreeMap;
use std::path::Path;

/// `IPCMNI_SHIFT`: an id is `seq << 15 | index` (without `ipcmni_extend`).
pub const IPCMNI_SHIFT: u32 = 15;
pub const IPCMNI: u32 = 1 << IPCMNI_SHIFT;
const IDX_MASK: i32 = (IPCMNI - 1) as i32;
/// `ipcid_seq_max()`.
const SEQ_MAX: u32 = (i32::MAX as u32) >> IPCMNI_SHIFT;
/// `ipc_min_cycle` (`RADIX_TREE_MAP_SIZE`): the cyclic allocator's
/// smallest window.
const MIN_CYCLE: u32 = 64;
/// `SHMMIN`.
pub const SHMMIN: u64 = 1;
/// Mode bits the kernel shows in `shm_perm.mode`.
pub const SHM_DEST: u32 = 0o1000;
pub const SHM_LOCKED: u32 = 0o2000;
/// `shmget` flags.
pub const SHM_HUGETLB: i32 = 0o4000;
pub const SHM_NORESERVE: i32 = 0o10000;
const SHM_HUGE_SHIFT: i32 = 26;
const SHM_HUGE_MASK: i32 = 0x3f;

/// The limits of `/proc/sys/kernel/shm{max,all,mni}`, read at each
/// `shmget` as the kernel reads its sysctls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest segment, bytes.
    pub shmmax: u64,
    /// All segments together, pages.
    pub shmall: u64,
    /// Most segments (never above [`IPCMNI`]).
    pub shmmni: u32,
}

impl Default for Limits {
    /// The kernel's defaults (`include/uapi/linux/shm.h`).
    fn default() -> Limits {
        let max = u64::MAX - (1 << 24);
        Limits {
            shmmax: max,
            shmall: max,
            shmmni: 4096,
        }
    }
}

impl Limits {
    pub fn read() -> Limits {
        Limits::read_from(Path::new("/proc/sys/kernel"))
    }

    fn read_from(dir: &Path) -> Limits {
        let d = Limits::default();
        let num = |f: &str| -> Option<u64> {
            std::fs::read_to_string(dir.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Limits {
            shmmax: num("shmmax").unwrap_or(d.shmmax),
            shmall: num("shmall").unwrap_or(d.shmall),
            shmmni: num("shmmni").map_or(d.shmmni, |v| v.min(IPCMNI as u64) as u32),
        }
    }
}

/// `/proc/sys/kernel/shm_next_id`: the id the next new segment gets
/// (checkpoint/restore), or `None` (-1, or the file is absent).
pub fn read_next_id() -> Option<i32> {
    let v: i64 = std::fs::read_to_string("/proc/sys/kernel/shm_next_id")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (0..=i32::MAX as i64).contains(&v).then_some(v as i32)
}

/// Consumes `shm_next_id`, so that it reads -1 again and no other segment
/// gets that id: the file takes no -1 from user space, so a throwaway
/// kernel segment takes the id (the kernel resets the file) and is
/// removed at once. `false` if that failed.
pub fn consume_next_id() -> bool {
    use nix::libc;
    // SAFETY: plain system calls on a private segment of our own.
    unsafe {
        let id = libc::shmget(libc::IPC_PRIVATE, 1, 0o600);
        if id < 0 {
            return false;
        }
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) == 0
    }
}

/// A segment's `ipc_perm`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Perm {
    pub key: i32,
    pub uid: u32,
    pub gid: u32,
    pub cuid: u32,
    pub cgid: u32,
    /// Permission bits plus [`SHM_DEST`] and [`SHM_LOCKED`].
    pub mode: u32,
}

/// `ipcperms()` (`ipc/util.c`): whether `caller` has every access `flag`
/// asks for (its low nine bits, folded as the kernel folds them).
pub fn ipcperms(caller: &Caller, perm: &Perm, flag: i32) -> bool {
    let requested = ((flag >> 6) | (flag >> 3) | flag) as u32 & 0o7;
    let mut granted = perm.mode;
    if caller.uid == perm.cuid || caller.uid == perm.uid {
        granted >>= 6;
    } else if caller.in_group(perm.cgid) || caller.in_group(perm.gid) {
        granted >>= 3;
    }
    requested & !granted & 0o7 == 0 || caller.capable(CAP_IPC_OWNER)
}

/// Whether `caller` may change or remove the segment (`IPC_SET`,
/// `IPC_RMID`: `ipcctl_obtain_check`, creator or owner or
/// `CAP_SYS_ADMIN`).
pub fn is_owner(caller: &Caller, perm: &Perm) -> bool {
    caller.uid == perm.cuid || caller.uid == perm.uid || caller.capable(super::creds::CAP_SYS_ADMIN)
}

/// The ids in use on a site, allocated as `ipc_idr_alloc` does: a cyclic
/// index below `max(in_use * 3 / 2, 64)`, a sequence number that grows
/// each time the index wraps, or `shm_next_id` when set.
#[derive(Debug)]
pub struct IdTable<T> {
    slots: BTreeMap<u32, (i32, T)>,
    seq: u32,
    /// The last index the cyclic allocator gave (-1: none yet).
    last_idx: i64,
}

impl<T> Default for IdTable<T> {
    fn default() -> IdTable<T> {
        IdTable {
            slots: BTreeMap::new(),
            seq: 0,
            last_idx: -1,
        }
    }
}

impl<T> IdTable<T> {
    pub fn in_use(&self) -> usize {
        self.slots.len()
    }

    /// The highest index in use, -1 with none (`ipc_get_maxidx`).
    pub fn max_idx(&self) -> i32 {
        self.slots.keys().next_back().map_or(-1, |&i| i as i32)
    }

    /// A new id for `value`, `None` when the table is full (`ENOSPC`).
    /// `limit` is `shmmni`; `next_id` is `shm_next_id` when set.
    pub fn alloc(&mut self, next_id: Option<i32>, limit: u32, value: T) -> Option<i32> {
        if self.slots.len() >= limit.min(IPCMNI) as usize {
            return None;
        }
        let (idx, seq) = match next_id {
            Some(n) => {
                // idr_alloc(start = the index): the lowest free one above.
                let start = (n & IDX_MASK) as u32;
                let idx = (start..IPCMNI).find(|i| !self.slots.contains_key(i))?;
                (idx, (n as u32) >> IPCMNI_SHIFT)
            }
            None => {
                let max = (self.slots.len() as u32 * 3 / 2).clamp(MIN_CYCLE, IPCMNI);
                let from = (self.last_idx + 1) as u32;
                let idx = (from..max)
                    .chain(0..from.min(max))
                    .find(|i| !self.slots.contains_key(i))?;
                if idx as i64 <= self.last_idx {
                    self.seq += 1;
                    if self.seq >= SEQ_MAX {
                        self.seq = 0;
                    }
                }
                self.last_idx = idx as i64;
                (idx, self.seq)
            }
        };
        let id = ((seq << IPCMNI_SHIFT) | idx) as i32;
        debug_assert!(id >= 0, "ids are never negative");
        self.slots.insert(idx, (id, value));
        Some(id)
    }

    /// The entry of a full id, its sequence number checked
    /// (`ipc_obtain_object_check`).
    pub fn get(&self, id: i32) -> Option<&T> {
        if id < 0 {
            return None;
        }
        self.slots
            .get(&((id & IDX_MASK) as u32))
            .filter(|(full, _)| *full == id)
            .map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, id: i32) -> Option<&mut T> {
        if id < 0 {
            return None;
        }
        self.slots
            .get_mut(&((id & IDX_MASK) as u32))
            .filter(|(full, _)| *full == id)
            .map(|(_, v)| v)
    }

    /// The entry at an index (`SHM_STAT`: `ipc_obtain_object_idr`, which
    /// masks the argument), with its full id.
    pub fn by_index(&self, index: i32) -> Option<(i32, &T)> {
        if index < 0 {
            return None;
        }
        self.slots
            .get(&((index & IDX_MASK) as u32))
            .map(|(id, v)| (*id, v))
    }

    pub fn remove(&mut self, id: i32) -> Option<T> {
        self.get(id)?;
        self.slots.remove(&((id & IDX_MASK) as u32)).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (i32, &T)> {
        self.slots.values().map(|(id, v)| (*id, v))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (i32, &mut T)> {
        self.slots.values_mut().map(|(id, v)| (*id, v))
    }

    /// The ids whose entries match `f`.
    pub fn ids_where(&self, f: impl Fn(&T) -> bool) -> Vec<i32> {
        self.iter()
            .filter(|(_, v)| f(v))
            .map(|(id, _)| id)
            .collect()
    }
}

/// Why `shmget(SHM_HUGETLB)` fails, as `newseg` and `hugetlb_file_setup`
/// decide, for the sizes and credentials given; `EINVAL` where the kernel
/// would create the segment: the DSM's pages are base pages (§6: DSM
/// pages are MMU pages), so it never backs one with huge pages.
pub fn hugetlb_errno(caller: &Caller, size: u64, shmflg: i32) -> i32 {
    hugetlb_errno_in(Path::new("/sys/kernel/mm/hugepages"), caller, size, shmflg)
}

fn hugetlb_errno_in(sys: &Path, caller: &Caller, size: u64, shmflg: i32) -> i32 {
    use nix::libc::{EINVAL, ENOMEM, EPERM};
    let log = (shmflg >> SHM_HUGE_SHIFT) & SHM_HUGE_MASK;
    let read = |p: &Path| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let page_kb = if log == 0 {
        default_huge_kb()
    } else if (10..64).contains(&log) {
        Some(1u64 << (log - 10))
    } else {
        None
    };
    // newseg: no such huge page size.
    let Some(page_kb) = page_kb else {
        return EINVAL;
    };
    let dir = sys.join(format!("hugepages-{page_kb}kB"));
    if !dir.is_dir() {
        return EINVAL;
    }
    // can_do_hugetlb_shm(): CAP_IPC_LOCK or the hugetlb_shm_group.
    let group = read(Path::new("/proc/sys/vm/hugetlb_shm_group")).unwrap_or(0) as u32;
    if !caller.capable(CAP_IPC_LOCK) && !caller.in_group(group) {
        return EPERM;
    }
    // hugetlb_reserve_pages(), unless SHM_NORESERVE.
    if shmflg & SHM_NORESERVE == 0 {
        let page = page_kb * 1024;
        let need = size.div_ceil(page);
        let v = |f: &str| read(&dir.join(f)).unwrap_or(0);
        let avail = (v("free_hugepages").saturating_sub(v("resv_hugepages")))
            + v("nr_overcommit_hugepages").saturating_sub(v("surplus_hugepages"));
        if need > avail {
            return ENOMEM;
        }
    }
    EINVAL
}

/// `Hugepagesize:` of `/proc/meminfo`, in KiB.
fn default_huge_kb() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("Hugepagesize:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, gid: u32, caps: u64) -> Caller {
        Caller {
            pid: 1,
            uid,
            gid,
            egid: gid,
            groups: vec![],
            caps,
            memlock: Some(0),
        }
    }

    fn perm(mode: u32) -> Perm {
        Perm {
            key: 1,
            uid: 0,
            gid: 0,
            cuid: 0,
            cgid: 0,
            mode,
        }
    }

    #[test]
    fn ipcperms_checks_owner_then_group_then_others_and_cap_ipc_owner() {
        let root_owned = perm(0o640);
        let nobody = caller(65534, 65534, 0);
        assert!(ipcperms(&nobody, &root_owned, 0));
        assert!(!ipcperms(&nobody, &root_owned, 0o400));
        let member = caller(1000, 0, 0);
        assert!(ipcperms(&member, &root_owned, 0o400));
        assert!(!ipcperms(&member, &root_owned, 0o600));
        // The owner gets the owner bits only, even when others have more.
        let owner_less = perm(0o066);
        assert!(!ipcperms(&caller(0, 0, 0), &owner_less, 0o400));
        assert!(ipcperms(
            &caller(0, 0, 1 << CAP_IPC_OWNER),
            &owner_less,
            0o600
        ));
        // IPC_CREAT and IPC_EXCL fold to nothing.
        assert!(ipcperms(&nobody, &root_owned, 0o3000));
    }

    #[test]
    fn ids_grow_cyclically_and_the_sequence_wraps_with_the_index() {
        let mut t: IdTable<()> = IdTable::default();
        assert_eq!(t.max_idx(), -1);
        let a = t.alloc(None, 4096, ()).unwrap();
        let b = t.alloc(None, 4096, ()).unwrap();
        assert_eq!((a, b), (0, 1));
        t.remove(a).unwrap();
        t.remove(b).unwrap();
        // Removed ids are not reused at once.
        assert_eq!(t.alloc(None, 4096, ()), Some(2));
        for _ in 3..64 {
            t.alloc(None, 4096, ()).unwrap();
        }
        for id in 2..64 {
            t.remove(id).unwrap();
        }
        // The window of 64 wrapped: index 0 with the next sequence.
        assert_eq!(t.alloc(None, 4096, ()), Some(1 << IPCMNI_SHIFT));
        assert!(t.get(0).is_none(), "the old id of index 0 is gone");
        assert!(t.get(1 << IPCMNI_SHIFT).is_some());
        assert_eq!(t.by_index(0).map(|(id, _)| id), Some(1 << IPCMNI_SHIFT));
    }

    #[test]
    fn shm_next_id_sets_the_index_and_sequence_and_shmmni_bounds_the_table() {
        let mut t: IdTable<u8> = IdTable::default();
        let want = (3 << IPCMNI_SHIFT) | 77;
        assert_eq!(t.alloc(Some(want), 4096, 0), Some(want));
        // Taken: the next free index above it, same sequence.
        assert_eq!(t.alloc(Some(want), 4096, 1), Some(want + 1));
        assert_eq!(t.alloc(None, 2, 2), None, "shmmni = 2");
        assert!(
            t.get(want + (1 << IPCMNI_SHIFT)).is_none(),
            "wrong sequence"
        );
        assert_eq!(t.max_idx(), 78);
    }

    #[test]
    fn limits_fall_back_to_the_kernels_defaults() {
        let d = tempdir();
        std::fs::write(d.join("shmmax"), "8192\n").unwrap();
        std::fs::write(d.join("shmmni"), "99999999\n").unwrap();
        let l = Limits::read_from(&d);
        assert_eq!(l.shmmax, 8192);
        assert_eq!(l.shmmni, IPCMNI);
        assert_eq!(l.shmall, Limits::default().shmall);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn hugetlb_errors_follow_permission_then_reservation_else_einval() {
        let d = tempdir();
        let kb = default_huge_kb().unwrap_or(2048);
        let h = d.join(format!("hugepages-{kb}kB"));
        std::fs::create_dir_all(&h).unwrap();
        for (f, v) in [
            ("free_hugepages", "1"),
            ("resv_hugepages", "0"),
            ("nr_overcommit_hugepages", "0"),
            ("surplus_hugepages", "0"),
        ] {
            std::fs::write(h.join(f), v).unwrap();
        }
        let flag = SHM_HUGETLB | 0o600;
        let page = kb * 1024;
        let lock = caller(1000, 1000, 1 << CAP_IPC_LOCK);
        let plain = caller(1000, 1000, 0);
        use nix::libc::{EINVAL, ENOMEM, EPERM};
        assert_eq!(hugetlb_errno_in(&d, &plain, page, flag), EPERM);
        assert_eq!(hugetlb_errno_in(&d, &lock, 2 * page, flag), ENOMEM);
        assert_eq!(
            hugetlb_errno_in(&d, &lock, 2 * page, flag | SHM_NORESERVE),
            EINVAL
        );
        assert_eq!(hugetlb_errno_in(&d, &lock, page, flag), EINVAL);
        // A huge page size this machine lacks (2^40 bytes).
        assert_eq!(hugetlb_errno_in(&d, &lock, page, flag | (40 << 26)), EINVAL);
        let _ = std::fs::remove_dir_all(&d);
    }

    fn tempdir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "mmulab-sysv-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
