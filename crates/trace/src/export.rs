//! Export to Dinero IV's input formats, one line per reference the simulator sees: one per
//! page piece of a page-crossing access, in address order; `M` as a read then a write of
//! the same bytes.
//!
//! * [`ExportFormat::Xdin`], Dinero IV's extended din (`-informat D`, the default,
//!   `d4-7/xdinfmt.c`): `r|w|i ADDRESS SIZE`, hex.
//! * [`ExportFormat::Din`], the traditional din (`-informat d`, `d4-7/dinfmt.c`):
//!   `LABEL ADDRESS SIZE` with label 0 read, 1 write, 2 instruction fetch; Dinero reads the
//!   label and the address and ignores the rest of the line.
//!
//! From a lackey log each piece has its real address and length. A binary trace keeps only
//! page numbers, so each piece is written as its page's first byte with size 1: the same
//! page, so Dinero IV with block size = page size counts the same hits and misses.

use std::io::{Read, Write};
use std::path::Path;
use std::str::FromStr;

use crate::lackey::{LackeySink, LineKind};
use crate::source::{ReadOptions, TextDecoder, TraceFormat, open_trace};
use crate::{AccessKind, Result, TraceError, page_shift};

/// Which Dinero IV input format to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// `r|w|i ADDRESS SIZE` (Dinero IV `-informat D`).
    Xdin,
    /// `0|1|2 ADDRESS SIZE` (Dinero IV `-informat d`).
    Din,
}

impl FromStr for ExportFormat {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<ExportFormat> {
        match s {
            "xdin" => Ok(ExportFormat::Xdin),
            "din" => Ok(ExportFormat::Din),
            _ => Err(TraceError::InvalidOptions(format!(
                "export format {s:?}: expected xdin or din"
            ))),
        }
    }
}

impl ExportFormat {
    fn label(self, kind: AccessKind) -> char {
        match (self, kind) {
            (ExportFormat::Xdin, AccessKind::Load) => 'r',
            (ExportFormat::Xdin, AccessKind::Store) => 'w',
            (ExportFormat::Xdin, AccessKind::Ifetch) => 'i',
            (ExportFormat::Din, AccessKind::Load) => '0',
            (ExportFormat::Din, AccessKind::Store) => '1',
            (ExportFormat::Din, AccessKind::Ifetch) => '2',
        }
    }

    /// Dinero IV's `-informat` letter for this format.
    pub fn dinero_informat(self) -> &'static str {
        match self {
            ExportFormat::Xdin => "D",
            ExportFormat::Din => "d",
        }
    }
}

struct Pieces {
    format: ExportFormat,
    shift: u32,
    buf: Vec<u8>,
    lines: u64,
}

impl Pieces {
    fn pieces(&mut self, kind: AccessKind, addr: u64, size: u64) {
        let label = self.format.label(kind);
        // The decoders refuse an access past 2^64, so this cannot wrap.
        let end = addr + (size - 1);
        let mut a = addr;
        loop {
            let page_end = (a | ((1u64 << self.shift) - 1)).min(end);
            let _ = writeln!(self.buf, "{label} {a:x} {:x}", page_end - a + 1);
            self.lines += 1;
            if page_end == end {
                break;
            }
            a = page_end + 1;
        }
    }
}

impl LackeySink for Pieces {
    fn access(&mut self, kind: LineKind, addr: u64, size: u64) {
        match kind {
            LineKind::Instr => self.pieces(AccessKind::Ifetch, addr, size),
            LineKind::Load => self.pieces(AccessKind::Load, addr, size),
            LineKind::Store => self.pieces(AccessKind::Store, addr, size),
            LineKind::Modify => {
                self.pieces(AccessKind::Load, addr, size);
                self.pieces(AccessKind::Store, addr, size);
            }
        }
    }
}

/// `mmulab trace export --format xdin`: see [`export`].
pub fn export_xdin<W: Write>(
    path: &Path,
    page_size: u64,
    read: &ReadOptions,
    out: &mut W,
) -> Result<(u64, Vec<String>)> {
    export(path, page_size, ExportFormat::Xdin, read, out)
}

/// Writes the references of the trace at `path` (lackey or binary), split at `page_size`,
/// to `out`. Returns the number of lines and any truncation warnings.
pub fn export<W: Write>(
    path: &Path,
    page_size: u64,
    format: ExportFormat,
    read: &ReadOptions,
    out: &mut W,
) -> Result<(u64, Vec<String>)> {
    let shift = page_shift(page_size)?;
    let werr = |e| TraceError::io("<export output>", e);
    let mut sink = Pieces {
        format,
        shift,
        buf: Vec::with_capacity(1 << 21),
        lines: 0,
    };
    let mut input = crate::input::open(path)?;
    match input.format {
        TraceFormat::Lackey | TraceFormat::Dinero(_) => {
            let mut decoder = TextDecoder::new(path, input.format, read.lenient);
            let mut chunk = vec![0u8; 1 << 20];
            loop {
                let n = input
                    .reader
                    .read(&mut chunk)
                    .map_err(|e| TraceError::io(path, e))?;
                if n == 0 {
                    break;
                }
                decoder.feed(&chunk[..n], &mut sink)?;
                out.write_all(&sink.buf).map_err(werr)?;
                sink.buf.clear();
            }
            let warnings = decoder.finish(read.allow_truncated, &mut sink)?;
            out.write_all(&sink.buf).map_err(werr)?;
            out.flush().map_err(werr)?;
            Ok((sink.lines, warnings))
        }
        TraceFormat::Binary => {
            drop(input);
            let mut src = open_trace(path, page_size, read)?;
            let mut batch = Vec::new();
            while src.next_batch(&mut batch)? {
                for r in &batch {
                    let _ = writeln!(
                        sink.buf,
                        "{} {:x} 1",
                        format.label(r.kind()),
                        r.vpn() << shift
                    );
                }
                sink.lines += batch.len() as u64;
                out.write_all(&sink.buf).map_err(werr)?;
                sink.buf.clear();
            }
            out.flush().map_err(werr)?;
            Ok((sink.lines, src.warnings()))
        }
    }
}
