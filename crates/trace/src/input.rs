//! Opening a trace file: a gzip or zstd wrapper is undone (told by its
//! magic, not its name), then the content's format is told by its first
//! bytes: mmulab's binary trace (`MMUTRACE`), a Dinero din or xdin trace,
//! or a Valgrind lackey log. An empty file, or a compressed one that holds
//! nothing, is an error.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::binary::MAGIC;
use crate::dinero::{DineroFormat, sniff};
use crate::{Result, TraceError};

/// What wraps the trace's bytes on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    /// gzip (`1f 8b`); concatenated members are read as one stream.
    Gzip,
    /// zstd (`28 b5 2f fd`); concatenated frames are read as one stream.
    Zstd,
}

impl Compression {
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        }
    }
}

/// Which kind of trace a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// A Valgrind lackey log.
    Lackey,
    /// mmulab's binary trace (starts with `MMUTRACE`).
    Binary,
    /// Dinero IV's din or xdin.
    Dinero(DineroFormat),
}

impl TraceFormat {
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Lackey => "lackey",
            TraceFormat::Binary => "binary",
            TraceFormat::Dinero(f) => f.name(),
        }
    }
}

/// An opened trace: its decompressed bytes and what they are.
pub struct Input {
    pub path: PathBuf,
    pub compression: Compression,
    pub format: TraceFormat,
    pub reader: Box<dyn BufRead>,
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Errors of the decompressors, kept apart from the file's own I/O errors
/// so that [`TraceError::io`] can call them bad input.
#[derive(Debug)]
pub(crate) struct StreamError {
    pub format: &'static str,
    pub detail: String,
}
impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad {} stream: {}", self.format, self.detail)
    }
}
impl std::error::Error for StreamError {}

fn stream_error(format: &'static str, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        StreamError {
            format,
            detail: e.to_string(),
        },
    )
}

/// A gzip reader whose errors say they are the stream's.
struct Gzip<R: BufRead>(flate2::bufread::MultiGzDecoder<R>);
impl<R: BufRead> Read for Gzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf).map_err(|e| stream_error("gzip", e))
    }
}

/// zstd frames one after another; ruzstd's decoder reads one frame and
/// limits its window (128 MiB) before allocating it.
struct Zstd<R: BufRead> {
    frame: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}
impl<R: BufRead> Zstd<R> {
    fn new(src: R) -> std::io::Result<Zstd<R>> {
        let frame =
            ruzstd::decoding::StreamingDecoder::new(src).map_err(|e| stream_error("zstd", e))?;
        Ok(Zstd { frame: Some(frame) })
    }
}
impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(frame) = self.frame.as_mut() else {
                return Ok(0);
            };
            let n = frame.read(buf).map_err(|e| stream_error("zstd", e))?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This frame is done: another may follow.
            let mut src = self.frame.take().expect("frame").into_inner();
            if src.fill_buf()?.is_empty() {
                return Ok(0);
            }
            self.frame = Some(
                ruzstd::decoding::StreamingDecoder::new(src)
                    .map_err(|e| stream_error("zstd", e))?,
            );
        }
    }
}

/// Reads up to `want` first bytes of `r` and returns them with a reader
/// that gives them again, followed by the rest (a decompressor's first
/// read may be short, so the bytes are gathered, not peeked).
fn head_of(
    mut r: Box<dyn BufRead>,
    path: &Path,
    want: usize,
) -> Result<(Vec<u8>, Box<dyn BufRead>)> {
    let mut head = Vec::with_capacity(want);
    (&mut r)
        .take(want as u64)
        .read_to_end(&mut head)
        .map_err(|e| TraceError::io(path, e))?;
    let again = std::io::Cursor::new(head.clone()).chain(r);
    Ok((head, Box::new(again)))
}

/// Opens `path`, undoing its compression and telling its format.
pub fn open(path: &Path) -> Result<Input> {
    let file = File::open(path).map_err(|e| TraceError::io(path, e))?;
    let raw: Box<dyn BufRead> = Box::new(BufReader::with_capacity(1 << 20, file));
    let (magic, raw) = head_of(raw, path, 4)?;
    if magic.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
            detail: "the file is empty (0 bytes): a trace holds at least one memory reference"
                .into(),
        });
    }
    let (compression, reader): (Compression, Box<dyn BufRead>) = if magic.starts_with(GZIP_MAGIC) {
        let r = Gzip(flate2::bufread::MultiGzDecoder::new(raw));
        (
            Compression::Gzip,
            Box::new(BufReader::with_capacity(1 << 20, r)),
        )
    } else if magic.starts_with(ZSTD_MAGIC) {
        let r = Zstd::new(raw).map_err(|e| TraceError::io(path, e))?;
        (
            Compression::Zstd,
            Box::new(BufReader::with_capacity(1 << 20, r)),
        )
    } else {
        (Compression::None, Box::new(raw))
    };
    let (head, reader) = head_of(reader, path, 256)?;
    if head.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_path_buf(),
            detail: format!(
                "the {} stream holds no bytes: a trace holds at least one memory reference",
                compression.name()
            ),
        });
    }
    // A file cut inside the magic is a (truncated) binary trace.
    let format = if head.len() < MAGIC.len() && MAGIC.starts_with(&head) || head.starts_with(MAGIC)
    {
        TraceFormat::Binary
    } else if let Some(f) = sniff(&head) {
        TraceFormat::Dinero(f)
    } else {
        TraceFormat::Lackey
    };
    Ok(Input {
        path: path.to_path_buf(),
        compression,
        format,
        reader,
    })
}
