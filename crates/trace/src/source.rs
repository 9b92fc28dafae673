//! Opening a trace of either kind as a stream of page references at one page size.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::binary::{BinaryReader, MAGIC};
use crate::lackey::{LackeyDecoder, PageSplitter};
use crate::sim::{SimOptions, SimResult, Tlb};
use crate::{PageRef, Result, TraceError, page_shift};

/// How to read a trace.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// Keep the complete records of a truncated trace and warn, instead of failing.
    /// Default: false.
    pub allow_truncated: bool,
}

/// A stream of page references.
pub trait RefSource {
    /// Clears `out` and fills it with the next references; false once the trace is done.
    fn next_batch(&mut self, out: &mut Vec<PageRef>) -> Result<bool>;
    /// Warnings so far (truncation kept under `allow_truncated`).
    fn warnings(&self) -> Vec<String>;
    /// log2 of the page size of the references.
    fn page_shift(&self) -> u32;
}

/// Which kind of trace a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// A Valgrind lackey log.
    Lackey,
    /// mmulab's binary trace (starts with `MMUTRACE`).
    Binary,
}

/// Looks at the first bytes of `path`.
pub fn detect_format(path: &Path) -> Result<TraceFormat> {
    let mut f = File::open(path).map_err(|e| TraceError::io(path, e))?;
    let mut head = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        let n = f
            .read(&mut head[got..])
            .map_err(|e| TraceError::io(path, e))?;
        if n == 0 {
            break;
        }
        got += n;
    }
    // A file cut inside the magic is a (truncated) binary trace, not a lackey log.
    Ok(if got > 0 && head[..got] == MAGIC[..got] {
        TraceFormat::Binary
    } else {
        TraceFormat::Lackey
    })
}

/// Opens a lackey log or a binary trace (by magic) as references at `page_size`.
/// A binary trace can be read at its base page size or any larger power of two.
pub fn open_trace(path: &Path, page_size: u64, opts: &ReadOptions) -> Result<Box<dyn RefSource>> {
    let shift = page_shift(page_size)?;
    Ok(match detect_format(path)? {
        TraceFormat::Lackey => Box::new(LackeySource::open(path, shift, opts)?),
        TraceFormat::Binary => Box::new(BinarySource::open(path, shift, opts)?),
    })
}

/// Refs per batch (a batch stays in L2).
const BATCH: usize = 1 << 16;

/// Decodes a lackey log on the fly.
pub struct LackeySource {
    path: PathBuf,
    file: File,
    decoder: LackeyDecoder,
    splitter: PageSplitter,
    buf: Vec<u8>,
    shift: u32,
    allow_truncated: bool,
    done: bool,
    warnings: Vec<String>,
}

impl LackeySource {
    pub fn open(path: &Path, shift: u32, opts: &ReadOptions) -> Result<LackeySource> {
        Ok(LackeySource {
            path: path.to_path_buf(),
            file: File::open(path).map_err(|e| TraceError::io(path, e))?,
            decoder: LackeyDecoder::new(path),
            splitter: PageSplitter::new(shift),
            buf: vec![0u8; 1 << 20],
            shift,
            allow_truncated: opts.allow_truncated,
            done: false,
            warnings: Vec::new(),
        })
    }
}

impl RefSource for LackeySource {
    fn next_batch(&mut self, out: &mut Vec<PageRef>) -> Result<bool> {
        while !self.done && self.splitter.out.len() < BATCH {
            let n = self
                .file
                .read(&mut self.buf)
                .map_err(|e| TraceError::io(&self.path, e))?;
            if n == 0 {
                self.done = true;
                if let Some(w) = self.decoder.finish(self.allow_truncated)? {
                    self.warnings.push(w);
                }
            } else {
                self.decoder.feed(&self.buf[..n], &mut self.splitter)?;
            }
        }
        out.clear();
        std::mem::swap(out, &mut self.splitter.out);
        Ok(!out.is_empty())
    }
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
    fn page_shift(&self) -> u32 {
        self.shift
    }
}

/// Reads a binary trace, coarsening its pages to the requested size: each page number
/// is shifted, and a continuation piece that lands in the same page as the piece before
/// it is dropped (the access no longer crosses a page boundary at this size).
pub struct BinarySource {
    reader: BinaryReader,
    shift: u32,
    extra: u32,
    last_vpn: u64,
}

impl BinarySource {
    pub fn open(path: &Path, shift: u32, opts: &ReadOptions) -> Result<BinarySource> {
        let reader = BinaryReader::open(path, opts.allow_truncated)?;
        let base = reader.header().page_shift;
        if shift < base {
            return Err(TraceError::InvalidOptions(format!(
                "{}: this binary trace was split at {}-byte pages; it cannot be simulated with {}-byte pages \
                 (use the lackey log, or a page size of at least {})",
                path.display(),
                1u64 << base,
                1u64 << shift,
                1u64 << base
            )));
        }
        Ok(BinarySource {
            reader,
            shift,
            extra: shift - base,
            last_vpn: u64::MAX,
        })
    }

    pub fn reader(&self) -> &BinaryReader {
        &self.reader
    }
}

/// Coarsens references in place by `extra` bits (see [`BinarySource`]); `last_vpn` carries
/// the previous reference's coarse page across calls.
pub fn coarsen(refs: &mut Vec<PageRef>, extra: u32, last_vpn: &mut u64) {
    if extra == 0 {
        return;
    }
    let mut w = 0;
    let mut last = *last_vpn;
    for i in 0..refs.len() {
        let r = refs[i];
        let vpn = r.vpn() >> extra;
        if r.is_continuation() && vpn == last {
            continue;
        }
        last = vpn;
        refs[w] = PageRef(vpn << 3 | (r.0 & 7));
        w += 1;
    }
    refs.truncate(w);
    *last_vpn = last;
}

impl RefSource for BinarySource {
    fn next_batch(&mut self, out: &mut Vec<PageRef>) -> Result<bool> {
        out.clear();
        while out.len() < BATCH {
            if !self.reader.next_block(out, None)? {
                break;
            }
        }
        coarsen(out, self.extra, &mut self.last_vpn);
        Ok(!out.is_empty())
    }
    fn warnings(&self) -> Vec<String> {
        self.reader.warnings().to_vec()
    }
    fn page_shift(&self) -> u32 {
        self.shift
    }
}

/// Reads a whole trace into memory at `page_size`; returns its references and warnings.
pub fn load_refs(
    path: &Path,
    page_size: u64,
    opts: &ReadOptions,
) -> Result<(Vec<PageRef>, Vec<String>)> {
    let mut src = open_trace(path, page_size, opts)?;
    let mut all = Vec::new();
    let mut batch = Vec::new();
    while src.next_batch(&mut batch)? {
        all.extend_from_slice(&batch);
    }
    Ok((all, src.warnings()))
}

/// `mmulab trace sim`: simulates one TLB over the trace at `path`.
pub fn simulate(path: &Path, opts: &SimOptions, read: &ReadOptions) -> Result<SimResult> {
    let mut tlb = Tlb::new(opts)?;
    let mut src = open_trace(path, opts.page_size, read)?;
    let mut batch = Vec::new();
    while src.next_batch(&mut batch)? {
        tlb.run(&batch);
    }
    let mut result = tlb.result();
    result.warnings = src.warnings();
    Ok(result)
}
