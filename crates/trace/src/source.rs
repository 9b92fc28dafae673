//! Opening a trace of any kind as a stream of page references at one page
//! size: a lackey log, a Dinero din or xdin trace or a binary trace, each
//! possibly gzip- or zstd-compressed (see [`crate::input`]).

use std::io::Read;
use std::path::Path;

use crate::binary::BinaryReader;
use crate::dinero::DineroDecoder;
use crate::input::{Compression, Input};
use crate::lackey::{LackeyDecoder, LackeySink, LineKind, PageSplitter};
use crate::mapped::{Mapped, PIECE};
use crate::sim::{SimOptions, SimResult, Tlb};
use crate::{AccessKind, PageRef, Result, TraceError, page_shift};

pub use crate::input::TraceFormat;

/// How to read a trace.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// Keep the complete records of a truncated trace and warn, instead of failing.
    /// Default: false.
    pub allow_truncated: bool,
    /// Skip malformed lines of a text trace (a line that does not parse,
    /// an access past 2^64, an unknown record), count them and warn,
    /// instead of failing on the first. Default: false.
    pub lenient: bool,
}

/// A stream of page references.
pub trait RefSource {
    /// Clears `out` and fills it with the next references; false once the trace is done.
    fn next_batch(&mut self, out: &mut Vec<PageRef>) -> Result<bool>;
    /// Warnings so far (truncation kept under `allow_truncated`, lines
    /// skipped under `lenient`).
    fn warnings(&self) -> Vec<String>;
    /// log2 of the page size of the references.
    fn page_shift(&self) -> u32;
}

/// The format of the trace at `path`, under any compression.
pub fn detect_format(path: &Path) -> Result<TraceFormat> {
    Ok(crate::input::open(path)?.format)
}

/// Opens a trace (any format, by its bytes) as references at `page_size`.
/// A binary trace can be read at its base page size or any larger power of two.
pub fn open_trace(path: &Path, page_size: u64, opts: &ReadOptions) -> Result<Box<dyn RefSource>> {
    let shift = page_shift(page_size)?;
    let input = crate::input::open(path)?;
    Ok(match input.format {
        TraceFormat::Binary => Box::new(BinarySource::open(input, shift, opts)?),
        _ => Box::new(TextSource::open(input, shift, opts)),
    })
}

/// Refs per batch (a batch stays in L2).
const BATCH: usize = 1 << 16;

/// A text trace's decoder: lackey or Dinero.
#[derive(Debug)]
pub enum TextDecoder {
    Lackey(LackeyDecoder),
    Dinero(DineroDecoder),
}

impl TextDecoder {
    /// A decoder for `format` (not binary).
    pub fn new(path: &Path, format: TraceFormat, lenient: bool) -> TextDecoder {
        match format {
            TraceFormat::Dinero(f) => {
                TextDecoder::Dinero(DineroDecoder::new(path, f).lenient(lenient))
            }
            TraceFormat::Lackey | TraceFormat::Binary => {
                TextDecoder::Lackey(LackeyDecoder::new(path).lenient(lenient))
            }
        }
    }

    pub fn feed<S: LackeySink>(&mut self, data: &[u8], sink: &mut S) -> Result<()> {
        match self {
            TextDecoder::Lackey(d) => d.feed(data, sink),
            TextDecoder::Dinero(d) => d.feed(data, sink),
        }
    }

    /// Ends the stream; returns its warnings (a cut last line kept under
    /// `allow_truncated`, lines skipped under `lenient`). A trace without
    /// a single memory reference is an error.
    pub fn finish<S: LackeySink>(
        &mut self,
        allow_truncated: bool,
        sink: &mut S,
    ) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        let (path, accesses, skipped) = match self {
            TextDecoder::Lackey(d) => {
                warnings.extend(d.finish(allow_truncated)?);
                warnings.extend(d.skipped_warning());
                (d.path().to_path_buf(), d.accesses(), d.skipped())
            }
            TextDecoder::Dinero(d) => {
                d.finish(sink)?;
                warnings.extend(d.skipped_warning());
                (d.path().to_path_buf(), d.accesses(), d.skipped())
            }
        };
        if accesses == 0 {
            return Err(TraceError::Empty {
                path,
                detail: if skipped > 0 {
                    format!("no memory reference is left after skipping {skipped} malformed lines")
                } else {
                    "the trace holds no memory reference".into()
                },
            });
        }
        Ok(warnings)
    }
}

/// Decodes a whole text trace into `sink`, reading it in 4 MiB chunks;
/// returns its warnings.
pub fn decode_text<S: LackeySink>(
    mut input: Input,
    sink: &mut S,
    opts: &ReadOptions,
) -> Result<Vec<String>> {
    if input.format == TraceFormat::Binary {
        return Err(TraceError::InvalidOptions(format!(
            "{}: is a binary trace; this reads text traces (lackey, din, xdin)",
            input.path.display()
        )));
    }
    let mut decoder = TextDecoder::new(&input.path, input.format, opts.lenient);
    // A plain regular file is decoded where it lies (see `mapped`), in
    // pieces of the read buffer's size; anything else is read.
    if input.compression == Compression::None
        && let Some(map) = Mapped::open(&input.path)
    {
        let bytes = map.bytes();
        // A file cut short under the map reads as zeros past its new end
        // (see `mapped`): whatever the decoder made of them, the error is
        // the cut.
        let cut = |map: &Mapped| {
            map.cut().map(|now| TraceError::CutWhileRead {
                path: input.path.clone(),
                was: map.len() as u64,
                now,
            })
        };
        let mut at = 0;
        while at < bytes.len() {
            let end = (at + PIECE).min(bytes.len());
            map.populate(at, end);
            let fed = decoder.feed(&bytes[at..end], sink);
            if let Some(e) = cut(&map) {
                return Err(e);
            }
            fed?;
            at = end;
        }
        return decoder.finish(opts.allow_truncated, sink);
    }
    let mut buf = vec![0u8; PIECE];
    loop {
        let n = input
            .reader
            .read(&mut buf)
            .map_err(|e| TraceError::io(&input.path, e))?;
        if n == 0 {
            break;
        }
        decoder.feed(&buf[..n], sink)?;
    }
    decoder.finish(opts.allow_truncated, sink)
}

/// Decodes a text trace (lackey, din or xdin) on the fly.
pub struct TextSource {
    input: Input,
    decoder: TextDecoder,
    splitter: PageSplitter,
    buf: Vec<u8>,
    shift: u32,
    allow_truncated: bool,
    done: bool,
    warnings: Vec<String>,
}

impl TextSource {
    pub fn open(input: Input, shift: u32, opts: &ReadOptions) -> TextSource {
        TextSource {
            decoder: TextDecoder::new(&input.path, input.format, opts.lenient),
            input,
            splitter: PageSplitter::new(shift),
            buf: vec![0u8; 1 << 20],
            shift,
            allow_truncated: opts.allow_truncated,
            done: false,
            warnings: Vec::new(),
        }
    }
}

/// The lackey-log source of earlier versions.
pub type LackeySource = TextSource;

impl RefSource for TextSource {
    fn next_batch(&mut self, out: &mut Vec<PageRef>) -> Result<bool> {
        while !self.done && self.splitter.out.len() < BATCH {
            let n = self
                .input
                .reader
                .read(&mut self.buf)
                .map_err(|e| TraceError::io(&self.input.path, e))?;
            if n == 0 {
                self.done = true;
                let w = self
                    .decoder
                    .finish(self.allow_truncated, &mut self.splitter)?;
                self.warnings.extend(w);
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
    pub fn open(input: Input, shift: u32, opts: &ReadOptions) -> Result<BinarySource> {
        let path = input.path.clone();
        let reader = BinaryReader::from_input(input, opts.allow_truncated)?;
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

/// Feeds a text trace's accesses straight into one TLB, page by page, in
/// the order [`PageSplitter`] would list them (no batch of [`PageRef`]s).
struct TlbSink<'a> {
    tlb: &'a mut Tlb,
    shift: u32,
}

impl TlbSink<'_> {
    #[inline]
    fn pages(&mut self, first: u64, last: u64, kind: AccessKind) {
        self.tlb.reference(first, kind);
        if last != first {
            for vpn in first + 1..=last {
                self.tlb.reference(vpn, kind);
            }
        }
    }
}

impl LackeySink for TlbSink<'_> {
    #[inline]
    fn access(&mut self, kind: LineKind, addr: u64, size: u64) {
        let first = addr >> self.shift;
        let last = addr.saturating_add(size - 1) >> self.shift;
        match kind {
            LineKind::Instr => self.pages(first, last, AccessKind::Ifetch),
            LineKind::Load => self.pages(first, last, AccessKind::Load),
            LineKind::Store => self.pages(first, last, AccessKind::Store),
            LineKind::Modify => {
                self.pages(first, last, AccessKind::Load);
                self.pages(first, last, AccessKind::Store);
            }
        }
    }
}

/// `mmulab trace sim`: simulates one TLB over the trace at `path`.
/// A text trace is decoded straight into the TLB; a binary one is read in
/// batches.
pub fn simulate(path: &Path, opts: &SimOptions, read: &ReadOptions) -> Result<SimResult> {
    let mut tlb = Tlb::new(opts)?;
    let shift = page_shift(opts.page_size)?;
    let input = crate::input::open(path)?;
    if input.format != TraceFormat::Binary {
        let mut sink = TlbSink {
            tlb: &mut tlb,
            shift,
        };
        let warnings = decode_text(input, &mut sink, read)?;
        let mut result = tlb.result();
        result.warnings = warnings;
        return Ok(result);
    }
    let mut src = BinarySource::open(input, shift, read)?;
    let mut batch = Vec::new();
    while src.next_batch(&mut batch)? {
        tlb.run(&batch);
    }
    let mut result = tlb.result();
    result.warnings = src.warnings();
    Ok(result)
}
