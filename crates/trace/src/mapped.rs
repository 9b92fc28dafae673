//! A read-only memory map of a whole regular file, so that a plain text
//! trace is decoded where it lies in the page cache instead of being
//! copied out by `read()` (that copy was about 13 % of `trace sim`'s time
//! on a lackey log). Anything that cannot be mapped (a pipe, `/dev/stdin`,
//! an empty file, a non-Linux system) gets `None`, and the caller reads it.
//!
//! The map is private and read-only. A file cut short by another process
//! while it is being decoded (a capture rerun to the same path truncates
//! it) makes the reads past its new end fault with SIGBUS, which would
//! kill the process. A SIGBUS handler, installed with the first map, puts
//! a zero page over a faulting page of a live map and marks the map cut;
//! the decoder then fails with [`crate::TraceError::CutWhileRead`] instead
//! of dying. A fault anywhere else gets the signal's earlier disposition.

use std::fs::File;
use std::path::Path;

/// Bytes handed to the decoder at a time; each piece is populated first.
pub const PIECE: usize = 4 << 20;

/// A mapped file; unmapped on drop.
pub struct Mapped {
    ptr: *mut std::ffi::c_void,
    len: usize,
    /// Its entry in the SIGBUS handler's table.
    #[cfg(target_os = "linux")]
    slot: usize,
    #[cfg(target_os = "linux")]
    file: File,
}

impl Mapped {
    /// Maps the regular file at `path`, or None.
    #[cfg(target_os = "linux")]
    pub fn open(path: &Path) -> Option<Mapped> {
        use rustix::mm::{Advice, MapFlags, ProtFlags, madvise, mmap};
        let file = File::open(path).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() == 0 {
            return None;
        }
        let len = usize::try_from(meta.len()).ok()?;
        // SAFETY: a fresh mapping of `len` bytes of an open file, chosen by
        // the kernel (no address given), read-only and private; it is only
        // read through `bytes` while `self` lives, and unmapped once on drop.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::PRIVATE,
                &file,
                0,
            )
        }
        .ok()?;
        let Some(slot) = guard::register(ptr as usize, len) else {
            // (every slot taken: read the file instead)
            // SAFETY: the mapping just made, never handed out.
            let _ = unsafe { rustix::mm::munmap(ptr, len) };
            return None;
        };
        // SAFETY: advice on the mapping just made; a refusal changes nothing.
        let _ = unsafe { madvise(ptr, len, Advice::Sequential) };
        Some(Mapped {
            ptr,
            len,
            slot,
            file,
        })
    }

    /// Whether the file was cut short under the map (a read faulted, or it
    /// is shorter now), and its length now. Bytes read since may be
    /// zeros: the kernel zeroes the tail of the page the cut falls in.
    pub fn cut(&self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        {
            let now = self.file.metadata().map_or(0, |m| m.len());
            if guard::was_cut(self.slot) || now < self.len as u64 {
                return Some(now);
            }
        }
        None
    }

    /// The length mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    #[cfg(not(target_os = "linux"))]
    pub fn open(_path: &Path) -> Option<Mapped> {
        let _ = File::open;
        None
    }

    /// Asks the kernel to map `range`'s pages in one call instead of one
    /// fault at a time (Linux 5.14 and later; elsewhere it is a no-op).
    pub fn populate(&self, start: usize, end: usize) {
        #[cfg(target_os = "linux")]
        {
            let page = 4096;
            let s = start / page * page;
            let end = end.min(self.len);
            if s < end {
                // SAFETY: `s..end` lies inside the mapping (s is rounded
                // down to a page boundary, the mapping starts on one).
                let _ = unsafe {
                    rustix::mm::madvise(
                        self.ptr.cast::<u8>().add(s).cast(),
                        end - s,
                        rustix::mm::Advice::LinuxPopulateRead,
                    )
                };
            }
        }
        let _ = (start, end);
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping made in `open`, unmapped once (after the
        // handler forgets it); no slice of it outlives `self`.
        unsafe {
            guard::unregister(self.slot);
            let _ = rustix::mm::munmap(self.ptr, self.len);
        }
    }
}

/// The SIGBUS handler and its table of live maps.
#[cfg(target_os = "linux")]
mod guard {
    use nix::libc;
    use std::sync::Once;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    struct Slot {
        /// 0: free; `usize::MAX`: being filled.
        base: AtomicUsize,
        len: AtomicUsize,
        cut: AtomicBool,
    }

    pub(super) const SLOTS: usize = 64;
    static TABLE: [Slot; SLOTS] = [const {
        Slot {
            base: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            cut: AtomicBool::new(false),
        }
    }; SLOTS];
    static INSTALL: Once = Once::new();
    /// The system's page size, read at install (the handler rounds to it).
    static PAGE: AtomicUsize = AtomicUsize::new(4096);
    /// The disposition before ours, put back for a fault outside every map.
    static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();

    /// Enters `base..base + len` in the table; None when it is full.
    pub fn register(base: usize, len: usize) -> Option<usize> {
        install();
        for (i, s) in TABLE.iter().enumerate() {
            if s.base
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                s.len.store(len, Ordering::Release);
                s.cut.store(false, Ordering::Release);
                // Publishing the base last makes the slot visible whole.
                s.base.store(base, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    pub fn unregister(slot: usize) {
        TABLE[slot].base.store(0, Ordering::Release);
    }

    pub fn was_cut(slot: usize) -> bool {
        TABLE[slot].cut.load(Ordering::Acquire)
    }

    fn install() {
        INSTALL.call_once(|| {
            // SAFETY: the handler only uses async-signal-safe calls (mmap,
            // sigaction) and atomics; PREVIOUS is written once, here,
            // before the handler can run.
            unsafe {
                let page = libc::sysconf(libc::_SC_PAGESIZE);
                if page > 0 {
                    PAGE.store(page as usize, Ordering::Release);
                }
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO;
                libc::sigemptyset(&mut sa.sa_mask);
                let previous = (&raw mut PREVIOUS).cast::<libc::sigaction>();
                let rc = libc::sigaction(libc::SIGBUS, &sa, previous);
                assert_eq!(rc, 0, "sigaction(SIGBUS)");
            }
        });
    }

    extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        // SAFETY: SA_SIGINFO guarantees info.
        let addr = unsafe { (*info).si_addr() } as usize;
        for s in TABLE.iter() {
            let base = s.base.load(Ordering::Acquire);
            if base == 0 || base == usize::MAX {
                continue;
            }
            let len = s.len.load(Ordering::Acquire);
            if addr < base || addr >= base + len {
                continue;
            }
            let size = PAGE.load(Ordering::Acquire);
            let page = addr & !(size - 1);
            // SAFETY: `page` lies in a live map of this process (the map's
            // owner unregisters it before unmapping); a zero page replaces
            // the part of the file that is gone, and the read is retried.
            let p = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    size,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                s.cut.store(true, Ordering::Release);
                return;
            }
            break;
        }
        // Not ours (or no zero page): the earlier disposition; a fault is
        // taken again under it, a sent signal is sent again.
        // SAFETY: PREVIOUS was filled by `install` before this handler
        // was installed; sigaction and raise are async-signal-safe.
        unsafe {
            libc::sigaction(
                libc::SIGBUS,
                (&raw const PREVIOUS).cast::<libc::sigaction>(),
                std::ptr::null_mut(),
            );
            if (*info).si_code <= 0 {
                libc::raise(libc::SIGBUS);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use crate::TraceError;
    use crate::lackey::{LackeySink, LineKind};
    use crate::source::{ReadOptions, decode_text};

    struct Count(u64, u64);
    impl LackeySink for Count {
        fn access(&mut self, _kind: LineKind, addr: u64, size: u64) {
            self.0 += 1;
            self.1 = self.1.wrapping_add(addr ^ size);
        }
    }

    /// A mapped plain file and the same trace read through gzip decode
    /// alike: the same accesses, and the same error naming the same line
    /// when the bad line lies past the first piece and a line is cut
    /// between pieces.
    #[test]
    fn mapped_and_read_decode_alike() {
        let dir = std::env::temp_dir().join(format!("mmulab-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 14-byte lines: 4 MiB is not a multiple of 14, so a line is cut.
        let mut text = Vec::new();
        let lines = super::PIECE / 14 + 1000;
        for i in 0..lines {
            writeln!(text, " L {:08x},4", 0x4000_0000 + i * 8).unwrap();
        }
        let good = text.clone();
        text.extend_from_slice(b" L 1234,x\n");
        let cases = [(good, None), (text, Some(lines as u64 + 1))];
        for (bytes, bad_line) in cases {
            let plain = dir.join("t.log");
            std::fs::write(&plain, &bytes).unwrap();
            let gz = dir.join("t.log.gz");
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&bytes).unwrap();
            std::fs::write(&gz, enc.finish().unwrap()).unwrap();
            assert!(super::Mapped::open(&plain).is_some() || !cfg!(target_os = "linux"));
            let mut got = Vec::new();
            for p in [&plain, &gz] {
                let mut c = Count(0, 0);
                let input = crate::input::open(p).unwrap();
                let r = decode_text(input, &mut c, &ReadOptions::default());
                let line = match r {
                    Ok(_) => None,
                    Err(TraceError::Malformed { line, .. }) => Some(line),
                    Err(e) => panic!("{e}"),
                };
                got.push((c.0, c.1, line));
            }
            assert_eq!(got[0], got[1]);
            assert_eq!(got[0].2, bad_line);
            if bad_line.is_none() {
                assert_eq!(got[0].0, lines as u64);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A sink that cuts the trace file short at its first access, as a
    /// capture rerun to the same path would.
    struct Cutter(std::path::PathBuf, u64);
    impl LackeySink for Cutter {
        fn access(&mut self, _kind: LineKind, _addr: u64, _size: u64) {
            if self.1 == 0 {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&self.0)
                    .unwrap()
                    .set_len(100)
                    .unwrap();
            }
            self.1 += 1;
        }
    }

    /// The file cut short under the map: an error that says so, not a
    /// SIGBUS, and the handler's table is free again afterwards.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_trace_cut_short_while_read_is_an_error() {
        let dir = std::env::temp_dir().join(format!("mmulab-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.log");
        let mut text = Vec::new();
        for i in 0..20_000u64 {
            writeln!(text, " L {:08x},4", 0x4000_0000 + i * 8).unwrap();
        }
        // Read directly: the page past the new end faults, the handler
        // puts a zero page there and marks the map.
        std::fs::write(&path, &text).unwrap();
        let map = super::Mapped::open(&path).unwrap();
        assert_eq!(map.cut(), None);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(8192)
            .unwrap();
        let past = std::hint::black_box(map.bytes())[3 * 4096 + 5];
        assert_eq!(past, 0);
        assert!(super::guard::was_cut(map.slot), "the handler ran");
        assert_eq!(map.cut(), Some(8192));
        assert_eq!(
            map.bytes()[4096],
            text[4096],
            "the part kept reads as before"
        );
        drop(map);
        for round in 0..3 {
            std::fs::write(&path, &text).unwrap();
            let mut c = Cutter(path.clone(), 0);
            let input = crate::input::open(&path).unwrap();
            let r = decode_text(input, &mut c, &ReadOptions::default());
            match r {
                Err(TraceError::CutWhileRead { was, now, .. }) => {
                    assert_eq!((was, now), (text.len() as u64, 100), "round {round}");
                }
                other => panic!("round {round}: expected the cut, got {other:?}"),
            }
            // The accesses decoded are the ones before the cut page.
            assert!(c.1 < 20_000, "round {round}: {}", c.1);
        }
        // Every slot was given back.
        let maps: Vec<_> = (0..super::guard::SLOTS)
            .map(|_| super::Mapped::open(&path).expect("a free slot"))
            .collect();
        drop(maps);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
