//! mmulab's binary trace format (specified in `crates/trace/FORMAT.md`).
//!
//! A 64-byte header (magic, version, base page size, pid, record counts, a checksum over
//! the block checksums, a header checksum) and then blocks of at most 64 KiB, each with
//! its own length, record count and checksum, so that damage is reported with its block
//! and byte offset and `allow_truncated` can keep every complete block before it.
//! Records are page references at the base page size, delta-encoded against the previous
//! page of the same class (instruction or data): one byte for a delta in -16..=15.

use std::fs::File;
use std::io::{BufRead, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::lackey::{
    LackeySink, LineKind, PageSplitter, SyscallEvent, SyscallPhase, SyscallResult,
};
use crate::{AccessKind, PageRef, Result, TraceError};

/// The first eight bytes of every binary trace.
pub const MAGIC: &[u8; 8] = b"MMUTRACE";
/// The format version this code writes and reads.
pub const VERSION: u16 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 64;
/// Block header length in bytes.
pub const BLOCK_HEADER_LEN: usize = 16;
/// A block is closed when its payload reaches this many bytes.
pub const BLOCK_PAYLOAD_TARGET: usize = 64 * 1024 - 64;
const FLAG_FINALIZED: u8 = 1;

const OP_LONG: u8 = 0xC0;
const OP_SYSCALL: u8 = 0xE0;

/// The header of a binary trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BinaryHeader {
    pub version: u16,
    /// log2 of the page size the references were split at.
    pub page_shift: u32,
    /// False while the writer is running (or if it stopped before finishing).
    pub finalized: bool,
    /// The traced process (0 if unknown).
    pub pid: u32,
    pub record_count: u64,
    pub access_count: u64,
    pub syscall_count: u64,
    pub block_count: u64,
    pub blocks_checksum: u64,
}

/// The checksum of the format: a 64-bit multiply-rotate hash over little-endian words
/// (the last one zero-padded), seeded with the length, finished with murmur3's fmix64.
pub fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = [
        K ^ bytes.len() as u64,
        K.rotate_left(17),
        K.rotate_left(31),
        K.rotate_left(47),
    ];
    let mut stripes = bytes.chunks_exact(32);
    for s in &mut stripes {
        for (lane, w) in s.chunks_exact(8).enumerate() {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            h[lane] = (h[lane] ^ w)
                .wrapping_mul(0xff51_afd7_ed55_8ccd)
                .rotate_left(31);
        }
    }
    let mut tail = [0u8; 32];
    let rem = stripes.remainder();
    tail[..rem.len()].copy_from_slice(rem);
    if !rem.is_empty() {
        for (lane, w) in tail.chunks_exact(8).enumerate() {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            h[lane] = (h[lane] ^ w)
                .wrapping_mul(0xff51_afd7_ed55_8ccd)
                .rotate_left(31);
        }
    }
    let mut x = h[0] ^ h[1].rotate_left(7) ^ h[2].rotate_left(13) ^ h[3].rotate_left(29);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn chain(h: u64, block_checksum: u64) -> u64 {
    checksum(&[h.to_le_bytes(), block_checksum.to_le_bytes()].concat())
}

impl BinaryHeader {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10] = self.page_shift as u8;
        b[11] = if self.finalized { FLAG_FINALIZED } else { 0 };
        b[12..16].copy_from_slice(&self.pid.to_le_bytes());
        b[16..24].copy_from_slice(&self.record_count.to_le_bytes());
        b[24..32].copy_from_slice(&self.access_count.to_le_bytes());
        b[32..40].copy_from_slice(&self.syscall_count.to_le_bytes());
        b[40..48].copy_from_slice(&self.block_count.to_le_bytes());
        b[48..56].copy_from_slice(&self.blocks_checksum.to_le_bytes());
        let c = checksum(&b[0..56]);
        b[56..64].copy_from_slice(&c.to_le_bytes());
        b
    }

    fn decode(path: &Path, b: &[u8; HEADER_LEN]) -> Result<BinaryHeader> {
        let bad = |offset: u64, detail: String| TraceError::BadBinary {
            path: path.to_path_buf(),
            offset,
            detail,
        };
        if &b[0..8] != MAGIC {
            return Err(bad(
                0,
                format!(
                    "magic is {:?}, expected {:?}",
                    String::from_utf8_lossy(&b[0..8]),
                    "MMUTRACE"
                ),
            ));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let stored = u64_at(56);
        let computed = checksum(&b[0..56]);
        if stored != computed {
            return Err(TraceError::Checksum {
                path: path.to_path_buf(),
                what: "the header".into(),
                offset: 56,
                stored,
                computed,
            });
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != VERSION {
            return Err(bad(
                8,
                format!("version {version}; this build reads version {VERSION}"),
            ));
        }
        let page_shift = b[10] as u32;
        if !(2..=40).contains(&page_shift) {
            return Err(bad(
                10,
                format!("page shift {page_shift} is outside 2..=40"),
            ));
        }
        Ok(BinaryHeader {
            version,
            page_shift,
            finalized: b[11] & FLAG_FINALIZED != 0,
            pid: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
            record_count: u64_at(16),
            access_count: u64_at(24),
            syscall_count: u64_at(32),
            block_count: u64_at(40),
            blocks_checksum: u64_at(48),
        })
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(buf: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*i)?;
        *i += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// What [`BinaryWriter::finish`] wrote.
#[derive(Clone, Debug, Serialize)]
pub struct BinarySummary {
    pub path: PathBuf,
    pub header: BinaryHeader,
    pub bytes: u64,
}

/// Writes a binary trace. The header is written first as "not finalized" and rewritten
/// with the counts and checksums by [`finish`](BinaryWriter::finish).
pub struct BinaryWriter {
    path: PathBuf,
    out: BufWriter<File>,
    header: BinaryHeader,
    block: Vec<u8>,
    block_records: u32,
    prev: [u64; 2],
    bytes: u64,
    scratch: Vec<PageRef>,
}

impl BinaryWriter {
    /// Creates (truncates) `path`. `page_shift` is the base page size's log2.
    pub fn create(path: &Path, page_shift: u32, pid: u32) -> Result<BinaryWriter> {
        if !(2..=40).contains(&page_shift) {
            return Err(TraceError::InvalidOptions(format!(
                "page shift {page_shift} is outside 2..=40"
            )));
        }
        let file = File::create(path).map_err(|e| TraceError::io(path, e))?;
        let header = BinaryHeader {
            version: VERSION,
            page_shift,
            finalized: false,
            pid,
            record_count: 0,
            access_count: 0,
            syscall_count: 0,
            block_count: 0,
            blocks_checksum: 0,
        };
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&header.encode())
            .map_err(|e| TraceError::io(path, e))?;
        Ok(BinaryWriter {
            path: path.to_path_buf(),
            out,
            header,
            block: Vec::with_capacity(BLOCK_PAYLOAD_TARGET + 256),
            block_records: 0,
            prev: [0; 2],
            bytes: HEADER_LEN as u64,
            scratch: Vec::new(),
        })
    }

    /// The base page shift.
    pub fn page_shift(&self) -> u32 {
        self.header.page_shift
    }

    /// Appends one page reference (at the base page size).
    #[inline]
    pub fn push_ref(&mut self, r: PageRef) -> Result<()> {
        let kind = r.kind() as u8;
        let class = (kind >> 1) as usize;
        let vpn = r.vpn();
        let delta = vpn.wrapping_sub(self.prev[class]) as i64;
        self.prev[class] = vpn;
        let cont = r.is_continuation() as u8;
        if (-16..=15).contains(&delta) {
            self.block
                .push(kind << 6 | cont << 5 | (delta as u8 & 0x1f));
        } else {
            self.block.push(OP_LONG | kind << 3 | cont << 2);
            put_varint(&mut self.block, ((delta << 1) ^ (delta >> 63)) as u64);
        }
        self.header.access_count += 1;
        self.end_record()
    }

    /// Appends one syscall record.
    pub fn push_syscall(&mut self, e: &SyscallEvent) -> Result<()> {
        self.block.push(OP_SYSCALL);
        put_varint(&mut self.block, e.pid as u64);
        put_varint(&mut self.block, e.tid as u64);
        put_varint(&mut self.block, e.nr as u64);
        put_varint(
            &mut self.block,
            match e.phase {
                SyscallPhase::Call => 0,
                SyscallPhase::Complete => 1,
                SyscallPhase::Result => 2,
            },
        );
        put_varint(&mut self.block, e.args.len().min(6) as u64);
        for &a in e.args.iter().take(6) {
            put_varint(&mut self.block, a);
        }
        match e.result {
            None => self.block.push(0),
            Some(SyscallResult::Success(v)) => {
                self.block.push(1);
                put_varint(&mut self.block, v);
            }
            Some(SyscallResult::Failure(v)) => {
                self.block.push(2);
                put_varint(&mut self.block, v);
            }
        }
        self.header.syscall_count += 1;
        self.end_record()
    }

    #[inline]
    fn end_record(&mut self) -> Result<()> {
        self.block_records += 1;
        self.header.record_count += 1;
        if self.block.len() >= BLOCK_PAYLOAD_TARGET {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> Result<()> {
        if self.block_records == 0 {
            return Ok(());
        }
        let sum = checksum(&self.block);
        let mut h = [0u8; BLOCK_HEADER_LEN];
        h[0..4].copy_from_slice(&(self.block.len() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&self.block_records.to_le_bytes());
        h[8..16].copy_from_slice(&sum.to_le_bytes());
        self.out
            .write_all(&h)
            .map_err(|e| TraceError::io(&self.path, e))?;
        self.out
            .write_all(&self.block)
            .map_err(|e| TraceError::io(&self.path, e))?;
        self.bytes += (BLOCK_HEADER_LEN + self.block.len()) as u64;
        self.header.blocks_checksum = chain(self.header.blocks_checksum, sum);
        self.header.block_count += 1;
        self.block.clear();
        self.block_records = 0;
        self.prev = [0; 2];
        Ok(())
    }

    /// Writes the last block and the final header.
    pub fn finish(mut self) -> Result<BinarySummary> {
        self.flush_block()?;
        self.header.finalized = true;
        let path = self.path.clone();
        let io = |e| TraceError::io(&path, e);
        self.out.flush().map_err(io)?;
        let mut file = self
            .out
            .into_inner()
            .map_err(|e| TraceError::io(&path, e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&self.header.encode()).map_err(io)?;
        file.sync_data().map_err(io)?;
        Ok(BinarySummary {
            path: self.path,
            header: self.header,
            bytes: self.bytes,
        })
    }
}

/// Writes lackey accesses and syscalls straight into a binary trace.
pub struct LackeyToBinary {
    pub writer: BinaryWriter,
    pub error: Option<TraceError>,
}

impl LackeySink for LackeyToBinary {
    #[inline]
    fn access(&mut self, kind: LineKind, addr: u64, size: u64) {
        let shift = self.writer.page_shift();
        let mut scratch = std::mem::take(&mut self.writer.scratch);
        scratch.clear();
        PageSplitter::split_into(&mut scratch, shift, kind, addr, size);
        for &r in &scratch {
            if let Err(e) = self.writer.push_ref(r) {
                self.error.get_or_insert(e);
            }
        }
        self.writer.scratch = scratch;
    }
    fn syscall(&mut self, event: &SyscallEvent) {
        if let Err(e) = self.writer.push_syscall(event) {
            self.error.get_or_insert(e);
        }
    }
}

/// Converts a lackey log to a binary trace at `page_shift` (see [`convert`]).
pub fn convert_lackey(
    input: &Path,
    output: &Path,
    page_shift: u32,
    pid: u32,
    allow_truncated: bool,
) -> Result<(BinarySummary, Option<String>)> {
    let opts = crate::source::ReadOptions {
        allow_truncated,
        lenient: false,
    };
    let (summary, warnings) = convert(input, output, page_shift, pid, &opts)?;
    Ok((summary, warnings.into_iter().next()))
}

/// A file written beside its target and renamed over it once complete, so
/// that the target is never half-written and an input that is also the
/// target (`convert X -o X`) is read whole before it is replaced. Dropped
/// before [`Staged::commit`], it removes itself.
pub struct Staged {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl Staged {
    /// A temporary name in `target`'s directory (a rename stays on one
    /// file system).
    pub fn new(target: &Path) -> Staged {
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "trace".into());
        let tmp = target.with_file_name(format!(".{name}.mmulab-tmp-{}", std::process::id()));
        Staged {
            tmp,
            target: target.to_path_buf(),
            committed: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Renames the temporary file over the target.
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.tmp, &self.target).map_err(|e| TraceError::io(&self.target, e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Converts a text trace (lackey, din or xdin, plain or compressed) to a
/// binary trace at `page_shift`. The output is written to a temporary
/// file and renamed over `output` at the end: converting a file onto
/// itself is safe, and a failed conversion leaves nothing behind (it used
/// to truncate its own input, or leave a 64-byte stub). Returns the
/// summary and the warnings.
pub fn convert(
    input: &Path,
    output: &Path,
    page_shift: u32,
    pid: u32,
    opts: &crate::source::ReadOptions,
) -> Result<(BinarySummary, Vec<String>)> {
    let source = crate::input::open(input)?;
    if source.format == crate::input::TraceFormat::Binary {
        return Err(TraceError::InvalidOptions(format!(
            "{}: is already a binary trace (convert reads lackey, din and xdin)",
            input.display()
        )));
    }
    let staged = Staged::new(output);
    let mut sink = LackeyToBinary {
        writer: BinaryWriter::create(staged.path(), page_shift, pid)?,
        error: None,
    };
    let warnings = crate::source::decode_text(source, &mut sink, opts)?;
    if let Some(e) = sink.error {
        return Err(e);
    }
    let mut summary = sink.writer.finish()?;
    staged.commit()?;
    summary.path = output.to_path_buf();
    Ok((summary, warnings))
}

/// A syscall and the number of page references before it in the trace.
pub type PlacedSyscall = (u64, SyscallEvent);

/// Reads a binary trace block by block.
pub struct BinaryReader {
    path: PathBuf,
    file: Box<dyn BufRead>,
    /// The largest page number the header's page size allows.
    max_vpn: u64,
    header: BinaryHeader,
    allow_truncated: bool,
    offset: u64,
    block: u64,
    records: u64,
    accesses: u64,
    blocks_checksum: u64,
    payload: Vec<u8>,
    done: bool,
    warnings: Vec<String>,
}

impl BinaryReader {
    /// Opens `path` (plain, gzip or zstd) and checks its header.
    pub fn open(path: &Path, allow_truncated: bool) -> Result<BinaryReader> {
        let input = crate::input::open(path)?;
        if input.format != crate::input::TraceFormat::Binary {
            return Err(TraceError::BadBinary {
                path: path.to_path_buf(),
                offset: 0,
                detail: format!(
                    "not a binary trace (no MMUTRACE magic; it reads as {})",
                    input.format.name()
                ),
            });
        }
        BinaryReader::from_input(input, allow_truncated)
    }

    /// Reads an opened binary trace and checks its header.
    pub fn from_input(input: crate::input::Input, allow_truncated: bool) -> Result<BinaryReader> {
        let path = input.path.as_path();
        let mut file = input.reader;
        let mut h = [0u8; HEADER_LEN];
        let got = read_full(&mut file, &mut h).map_err(|e| TraceError::io(path, e))?;
        if got < HEADER_LEN {
            return Err(TraceError::TruncatedBinary {
                path: path.to_path_buf(),
                offset: got as u64,
                block: 0,
                detail: format!(
                    "the file has {got} bytes, shorter than the {HEADER_LEN}-byte header"
                ),
                kept_records: 0,
            });
        }
        let header = BinaryHeader::decode(path, &h)?;
        Ok(BinaryReader {
            path: path.to_path_buf(),
            file,
            max_vpn: crate::max_vpn(header.page_shift),
            header,
            allow_truncated,
            offset: HEADER_LEN as u64,
            block: 0,
            records: 0,
            accesses: 0,
            blocks_checksum: 0,
            payload: Vec::with_capacity(BLOCK_PAYLOAD_TARGET + 1024),
            done: false,
            warnings: Vec::new(),
        })
    }

    pub fn header(&self) -> &BinaryHeader {
        &self.header
    }

    /// Warnings raised so far (a truncation kept under `allow_truncated`).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    fn truncated(&mut self, detail: String) -> Result<bool> {
        if self.allow_truncated {
            self.warnings.push(format!(
                "{}: binary trace is truncated at byte {} (block {}): {detail}; kept {} records",
                self.path.display(),
                self.offset,
                self.block,
                self.records
            ));
            self.done = true;
            Ok(false)
        } else {
            Err(TraceError::TruncatedBinary {
                path: self.path.clone(),
                offset: self.offset,
                block: self.block,
                detail,
                kept_records: self.records,
            })
        }
    }

    /// Appends the next block's page references to `refs` (and its syscalls, with their
    /// positions, to `syscalls` if given). Returns false at the end of the trace.
    pub fn next_block(
        &mut self,
        refs: &mut Vec<PageRef>,
        syscalls: Option<&mut Vec<PlacedSyscall>>,
    ) -> Result<bool> {
        if self.done {
            return Ok(false);
        }
        let h = &self.header;
        if h.finalized && self.block == h.block_count {
            self.done = true;
            if h.access_count == 0 {
                return Err(TraceError::Empty {
                    path: self.path.clone(),
                    detail: "the binary trace holds no memory reference".into(),
                });
            }
            let mut probe = [0u8; 1];
            let extra =
                read_full(&mut self.file, &mut probe).map_err(|e| TraceError::io(&self.path, e))?;
            if extra != 0 {
                return Err(TraceError::BadBinary {
                    path: self.path.clone(),
                    offset: self.offset,
                    detail: format!(
                        "bytes after the last of the header's {} blocks",
                        h.block_count
                    ),
                });
            }
            if self.blocks_checksum != h.blocks_checksum {
                return Err(TraceError::Checksum {
                    path: self.path.clone(),
                    what: "the chain of block checksums (header)".into(),
                    offset: 48,
                    stored: h.blocks_checksum,
                    computed: self.blocks_checksum,
                });
            }
            if self.records != h.record_count {
                return Err(TraceError::BadBinary {
                    path: self.path.clone(),
                    offset: self.offset,
                    detail: format!(
                        "the blocks hold {} records, the header says {}",
                        self.records, h.record_count
                    ),
                });
            }
            return Ok(false);
        }
        let mut bh = [0u8; BLOCK_HEADER_LEN];
        let got = read_full(&mut self.file, &mut bh).map_err(|e| TraceError::io(&self.path, e))?;
        if got == 0 && !self.header.finalized {
            return self.truncated(format!(
                "the header was never finalized (the writer stopped) and the file ends after {} complete blocks",
                self.block
            ));
        }
        if got < BLOCK_HEADER_LEN {
            let promised = if self.header.finalized {
                format!(
                    "the header promises {} records in {} blocks",
                    self.header.record_count, self.header.block_count
                )
            } else {
                "the header was never finalized".to_string()
            };
            return self.truncated(format!("the file ends inside a block header; {promised}"));
        }
        let len = u32::from_le_bytes(bh[0..4].try_into().expect("4 bytes")) as usize;
        let count = u32::from_le_bytes(bh[4..8].try_into().expect("4 bytes"));
        let stored = u64::from_le_bytes(bh[8..16].try_into().expect("8 bytes"));
        if len > 16 * BLOCK_PAYLOAD_TARGET {
            return Err(TraceError::BadBinary {
                path: self.path.clone(),
                offset: self.offset,
                detail: format!("block {} claims {len} payload bytes", self.block),
            });
        }
        self.payload.resize(len, 0);
        let got = read_full(&mut self.file, &mut self.payload)
            .map_err(|e| TraceError::io(&self.path, e))?;
        if got < len {
            let promised = if self.header.finalized {
                format!("the header promises {} records", self.header.record_count)
            } else {
                "the header was never finalized".to_string()
            };
            return self.truncated(format!(
                "the block needs {len} payload bytes, the file has {got}; {promised}"
            ));
        }
        let computed = checksum(&self.payload);
        if computed != stored {
            if self.allow_truncated {
                return self.truncated(format!(
                    "block checksum mismatch (stored {stored:#018x}, computed {computed:#018x})"
                ));
            }
            return Err(TraceError::Checksum {
                path: self.path.clone(),
                what: format!(
                    "block {} ({} records from record {})",
                    self.block, count, self.records
                ),
                offset: self.offset,
                stored,
                computed,
            });
        }
        let before = refs.len();
        let decoded = decode_payload(&self.payload, refs, syscalls, self.accesses, self.max_vpn);
        match decoded {
            Ok(n) if n == count as u64 => {}
            Ok(n) => {
                refs.truncate(before);
                return Err(TraceError::BadBinary {
                    path: self.path.clone(),
                    offset: self.offset,
                    detail: format!(
                        "block {} decodes to {n} records, its header says {count}",
                        self.block
                    ),
                });
            }
            Err((at, what)) => {
                refs.truncate(before);
                return Err(TraceError::BadBinary {
                    path: self.path.clone(),
                    offset: self.offset + (BLOCK_HEADER_LEN + at) as u64,
                    detail: format!("block {}: {what}", self.block),
                });
            }
        }
        self.accesses += (refs.len() - before) as u64;
        self.records += count as u64;
        self.blocks_checksum = chain(self.blocks_checksum, stored);
        self.offset += (BLOCK_HEADER_LEN + len) as u64;
        self.block += 1;
        Ok(true)
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Decodes one block's payload; returns the number of records or (offset,
/// problem). A page delta that takes a page number below 0 or above
/// `max_vpn` is refused (a negative delta from page 0 used to wrap around).
pub fn decode_payload(
    payload: &[u8],
    refs: &mut Vec<PageRef>,
    mut syscalls: Option<&mut Vec<PlacedSyscall>>,
    accesses_before: u64,
    max_vpn: u64,
) -> std::result::Result<u64, (usize, String)> {
    // (What makes the short records' one-compare range check exact.)
    assert!(max_vpn <= u64::MAX >> 1, "page numbers fit a PageRef");
    let mut prev = [0u64; 2];
    let mut i = 0;
    let mut records = 0u64;
    let start = refs.len();
    let n = payload.len();
    // Every record is at least one byte, so the block has at most `n` references: size the
    // output once and write by index.
    refs.resize(start + n, PageRef(0));
    let mut w = start;
    while i < n {
        // The common case, one byte per reference, in a tight loop: the previous page of
        // each class lives in a register, chosen by a select rather than by memory.
        let (mut data, mut instr) = (prev[0], prev[1]);
        let out = &mut refs[w..start + n];
        let mut k = 0;
        while i < n && k < out.len() {
            let b = payload[i];
            if b >= OP_LONG {
                break;
            }
            // kind in bits 7..6, continuation in bit 5, signed delta in bits 4..0.
            let kind = (b >> 6) as u64;
            let is_instr = kind == AccessKind::Ifetch as u64;
            let delta = (((b << 3) as i8) >> 3) as i64;
            // One compare covers both ways out: `from` is at most `max_vpn`, far below
            // `u64::MAX` (asserted above), so a step of at most 16 below page 0 wraps
            // above `max_vpn`, and one above `max_vpn` cannot wrap.
            let from = if is_instr { instr } else { data };
            let vpn = from.wrapping_add_signed(delta);
            if vpn > max_vpn {
                return Err((i, out_of_range(from, delta, max_vpn)));
            }
            if is_instr {
                instr = vpn;
            } else {
                data = vpn;
            }
            out[k] = PageRef(vpn << 3 | ((b as u64 >> 5) & 1) << 2 | kind);
            k += 1;
            i += 1;
        }
        prev = [data, instr];
        w += k;
        records += k as u64;
        if i >= n {
            break;
        }
        let b = payload[i];
        if b < OP_LONG {
            unreachable!("the loop above consumes short records");
        } else if b < OP_SYSCALL {
            let kind = ((b >> 3) & 3) as u64;
            if kind == 3 || b & 3 != 0 {
                return Err((i, format!("bad record byte {b:#04x}")));
            }
            let cont = ((b >> 2) & 1) as u64;
            let at = i;
            i += 1;
            let z = get_varint(payload, &mut i).ok_or_else(|| (at, "cut varint".to_string()))?;
            let delta = ((z >> 1) ^ (z & 1).wrapping_neg()) as i64;
            let class = (kind >> 1) as usize;
            let Some(vpn) = prev[class]
                .checked_add_signed(delta)
                .filter(|&v| v <= max_vpn)
            else {
                return Err((at, out_of_range(prev[class], delta, max_vpn)));
            };
            prev[class] = vpn;
            refs[w] = PageRef(vpn << 3 | cont << 2 | kind);
            w += 1;
        } else if b == OP_SYSCALL {
            let at = i;
            i += 1;
            let cut = || (at, "cut syscall record".to_string());
            let mut v = || get_varint(payload, &mut i);
            let pid = v().ok_or_else(cut)? as u32;
            let tid = v().ok_or_else(cut)? as u32;
            let nr = v().ok_or_else(cut)? as u32;
            let phase = match v().ok_or_else(cut)? {
                0 => SyscallPhase::Call,
                1 => SyscallPhase::Complete,
                2 => SyscallPhase::Result,
                p => return Err((at, format!("bad syscall phase {p}"))),
            };
            let nargs = v().ok_or_else(cut)?;
            if nargs > 6 {
                return Err((at, format!("{nargs} syscall arguments (at most 6)")));
            }
            let mut args = Vec::with_capacity(nargs as usize);
            for _ in 0..nargs {
                args.push(v().ok_or_else(cut)?);
            }
            let tag = *payload.get(i).ok_or_else(cut)?;
            i += 1;
            let result = match tag {
                0 => None,
                1 => Some(SyscallResult::Success(
                    get_varint(payload, &mut i).ok_or_else(cut)?,
                )),
                2 => Some(SyscallResult::Failure(
                    get_varint(payload, &mut i).ok_or_else(cut)?,
                )),
                t => return Err((at, format!("bad syscall result tag {t}"))),
            };
            if let Some(out) = syscalls.as_deref_mut() {
                let pos = accesses_before + (w - start) as u64;
                out.push((
                    pos,
                    SyscallEvent {
                        pid,
                        tid,
                        nr,
                        phase,
                        args,
                        result,
                    },
                ));
            }
        } else {
            return Err((i, format!("bad record byte {b:#04x}")));
        }
        records += 1;
    }
    refs.truncate(w);
    Ok(records)
}

fn out_of_range(prev: u64, delta: i64, max_vpn: u64) -> String {
    format!(
        "page delta {delta} from page {prev:#x} leaves the pages 0..={max_vpn:#x} of the address space"
    )
}

/// A whole binary trace in memory.
#[derive(Clone, Debug)]
pub struct BinaryTrace {
    pub header: BinaryHeader,
    /// Page references at the base page size.
    pub refs: Vec<PageRef>,
    /// Syscalls, each with the number of references before it.
    pub syscalls: Vec<PlacedSyscall>,
    pub warnings: Vec<String>,
}

/// Reads a whole binary trace into memory (at its base page size).
pub fn read_all(path: &Path, allow_truncated: bool) -> Result<BinaryTrace> {
    let mut r = BinaryReader::open(path, allow_truncated)?;
    let mut refs = Vec::new();
    let mut syscalls = Vec::new();
    while r.next_block(&mut refs, Some(&mut syscalls))? {}
    Ok(BinaryTrace {
        header: r.header.clone(),
        refs,
        syscalls,
        warnings: r.warnings.clone(),
    })
}

// FORMAT.md fixes the kind codes; AccessKind's discriminants must agree.
const _: () = assert!(
    AccessKind::Load as u8 == 0 && AccessKind::Store as u8 == 1 && AccessKind::Ifetch as u8 == 2
);
