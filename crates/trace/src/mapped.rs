//! A read-only memory map of a whole regular file, so that a plain text
//! trace is decoded where it lies in the page cache instead of being
//! copied out by `read()` (that copy was about 13 % of `trace sim`'s time
//! on a lackey log). Anything that cannot be mapped (a pipe, `/dev/stdin`,
//! an empty file, a non-Linux system) gets `None`, and the caller reads it.
//!
//! The map is private and read-only. As with any file map, a file cut
//! short by another process while it is being decoded makes the reads past
//! its new end fault (SIGBUS); traces are not written while they are read.

use std::fs::File;
use std::path::Path;

/// Bytes handed to the decoder at a time; each piece is populated first.
pub const PIECE: usize = 4 << 20;

/// A mapped file; unmapped on drop.
pub struct Mapped {
    ptr: *mut std::ffi::c_void,
    len: usize,
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
        // SAFETY: advice on the mapping just made; a refusal changes nothing.
        let _ = unsafe { madvise(ptr, len, Advice::Sequential) };
        Some(Mapped { ptr, len })
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
        // SAFETY: the mapping made in `open`, unmapped once; no slice of it
        // outlives `self`.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr, self.len);
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
}
