//! Streaming decoder of Valgrind lackey logs.
//!
//! Lackey (`valgrind --tool=lackey --trace-mem=yes`) writes one line per access
//! (`lk_main.c`: `"I  %08lx,%lu\n"`, `" L %08lx,%lu\n"`, `" S ..."`, `" M ..."`), and with
//! `--trace-syscalls=yes` Valgrind's core adds its syscall trace
//! (`syswrap-main.c`): `SYSCALL[pid,tid](nr) name ( args )` followed, on the same line or
//! on a continuation line `" --> [pre-success] Success(0x0) "`, by the result; an
//! asynchronous syscall finishes later with `SYSCALL[pid,tid](nr) ... [async] --> R`.
//! Valgrind's own messages start with `==PID==` (also `--PID--`, `--PID:`, `**PID**`) and
//! are skipped.
//! Anything else is refused with the file, line number, the line and what was expected.
//!
//! The parser is hand-written over bytes: the caller feeds chunks of any size, complete
//! lines are decoded in place and a cut line is carried to the next chunk.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::show_line;
use crate::{AccessKind, PageRef, Result, TraceError};

/// The four access line kinds of lackey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineKind {
    /// `I  addr,size`: an instruction fetch.
    Instr,
    /// ` L addr,size`: a data load.
    Load,
    /// ` S addr,size`: a data store.
    Store,
    /// ` M addr,size`: a modify (load then store to one address).
    Modify,
}

/// Which part of a syscall a trace line reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyscallPhase {
    /// `SYSCALL[pid,tid](nr) name ( args ) ...`: the call, with its result if it is on the
    /// same line.
    Call,
    /// `SYSCALL[pid,tid](nr) ... [async] --> R`: an asynchronous call finishing.
    Complete,
    /// ` --> R` on its own line: the result of the last call (after a message such as
    /// clone's, and at the top of a forked child's log).
    Result,
}

/// The result Valgrind printed for a syscall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyscallResult {
    Success(u64),
    Failure(u64),
}

/// Syscall number used when a result line cannot be tied to a call in the same log.
pub const UNKNOWN_SYSCALL: u32 = u32::MAX;

/// One syscall line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallEvent {
    pub pid: u32,
    pub tid: u32,
    /// The syscall number, or [`UNKNOWN_SYSCALL`].
    pub nr: u32,
    pub phase: SyscallPhase,
    /// The leading number of each argument, as printed (at most six; 0 where an argument
    /// does not start with a number).
    pub args: Vec<u64>,
    pub result: Option<SyscallResult>,
}

/// Receives what the decoder finds.
pub trait LackeySink {
    /// One access line. `size` is 1..=[`MAX_ACCESS_SIZE`].
    fn access(&mut self, kind: LineKind, addr: u64, size: u64);
    /// One syscall line.
    fn syscall(&mut self, event: &SyscallEvent) {
        let _ = event;
    }
}

/// The largest access size accepted (lackey's largest is a few KiB, for `xsave`).
pub const MAX_ACCESS_SIZE: u64 = 1 << 20;

/// Longest line kept while waiting for its newline.
const MAX_LINE: usize = 1 << 20;

const EXPECT_ACCESS: &str = "an access line `I  ADDR,SIZE` or ` L|S|M ADDR,SIZE` (hex address of 1-16 digits, \
     a comma, a decimal size from 1 to 1048576, a newline)";
const EXPECT_IN_RANGE: &str = "an access that ends at or below the top of the 64-bit address space \
     (ADDR + SIZE - 1 <= 0xffffffffffffffff)";
const EXPECT_RESULT: &str = "a result ` --> Success(N)`, ` --> Failure(N)` or ` --> NoWriteResult` \
     (optionally after `[pre-success]`, `[pre-fail]`, `[sync]` or `[async]`)";
const EXPECT_CALL_ARGS: &str = "a syscall call line whose arguments close: \
     `SYSCALL[PID,TID](NR) name ( args )`, then optionally ` --> RESULT` or ` --> [async] ...`";
const EXPECT_KIND: &str = "a lackey line: `I  ADDR,SIZE`, ` L ADDR,SIZE`, ` S ADDR,SIZE`, ` M ADDR,SIZE`, \
     `SYSCALL[PID,TID](NR) ...`, ` --> RESULT` or a Valgrind message `==PID== ...`";
const EXPECT_SYSCALL: &str =
    "a syscall line `SYSCALL[PID,TID](NR) ...` with decimal PID, TID and NR";
const EXPECT_MESSAGE: &str =
    "a Valgrind message line `==PID== ...` (also `--PID--`, `--PID:`, `**PID**`)";

static HEX: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// The value of 8 lowercase hex digits (the first in the lowest byte), or
/// None if any of the 8 bytes is not one of `0-9a-f`. The bytes are
/// checked and converted together (SWAR): for bytes below 0x80, adding
/// `0x80 - c` sets a byte's top bit exactly when the byte is at least `c`,
/// with no carry into the next byte.
#[inline]
fn hex8(x: u64) -> Option<u64> {
    const fn rep(b: u8) -> u64 {
        u64::from_le_bytes([b; 8])
    }
    const TOP: u64 = rep(0x80);
    if x & TOP != 0 {
        return None;
    }
    let at_least = |c: u8| x.wrapping_add(rep(0x80 - c));
    let digit = at_least(b'0') & !at_least(b'9' + 1) & TOP;
    let lower = at_least(b'a') & !at_least(b'f' + 1) & TOP;
    if digit | lower != TOP {
        return None;
    }
    // Each byte's nibble: '0'-'9' are 0x30-0x39, 'a'-'f' 0x61-0x66 (+ 9).
    let v = (x & rep(0x0f)) + (lower >> 7) * 9;
    // The first digit is the most significant: pack the nibbles big-endian.
    let v = v.swap_bytes();
    let v = (v | v >> 4) & 0x00ff_00ff_00ff_00ff;
    let v = (v | v >> 8) & 0x0000_ffff_0000_ffff;
    Some((v | v >> 16) & 0xffff_ffff)
}

/// Decodes a lackey log fed in chunks.
#[derive(Debug)]
pub struct LackeyDecoder {
    path: PathBuf,
    /// Lines fully decoded so far.
    line: u64,
    /// Access lines decoded so far.
    accesses: u64,
    /// A line cut at the end of the last chunk.
    carry: Vec<u8>,
    /// PID from the `==PID==` banner, for result lines with no call before them.
    banner_pid: u32,
    /// (pid, tid, nr) of the last syscall call line.
    last_call: Option<(u32, u32, u32)>,
    /// Skip malformed lines (counting them) instead of failing.
    lenient: bool,
    /// Lines skipped under `lenient`, and the first one's error.
    skipped: u64,
    first_skipped: Option<String>,
    /// Under `lenient`, an over-long line is being dropped up to its newline.
    discarding: bool,
}

impl LackeyDecoder {
    /// `path` is only used in error messages.
    pub fn new(path: impl Into<PathBuf>) -> LackeyDecoder {
        LackeyDecoder {
            path: path.into(),
            line: 0,
            accesses: 0,
            carry: Vec::new(),
            banner_pid: 0,
            last_call: None,
            lenient: false,
            skipped: 0,
            first_skipped: None,
            discarding: false,
        }
    }

    /// Skips malformed lines (and over-long ones) instead of failing;
    /// [`LackeyDecoder::skipped`] counts them.
    pub fn lenient(mut self, on: bool) -> LackeyDecoder {
        self.lenient = on;
        self
    }

    /// Lines skipped as malformed under `lenient`.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// What a lenient decode skipped, as a warning; None if nothing.
    pub fn skipped_warning(&self) -> Option<String> {
        (self.skipped > 0).then(|| {
            format!(
                "{}: skipped {} malformed line{} (--lenient); the first: {}",
                self.path.display(),
                self.skipped,
                if self.skipped == 1 { "" } else { "s" },
                self.first_skipped.as_deref().unwrap_or("?")
            )
        })
    }

    /// Counts a skipped line under `lenient`, or returns the error.
    fn skip_or_fail(&mut self, e: TraceError) -> Result<()> {
        if !self.lenient {
            return Err(e);
        }
        self.skipped += 1;
        if self.first_skipped.is_none() {
            self.first_skipped = Some(e.to_string());
        }
        Ok(())
    }

    /// Lines decoded so far.
    pub fn lines(&self) -> u64 {
        self.line
    }

    /// Access lines decoded so far.
    pub fn accesses(&self) -> u64 {
        self.accesses
    }

    /// The cut line waiting for its newline, if any.
    pub fn pending(&self) -> &[u8] {
        &self.carry
    }

    /// The file name given at construction.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Decodes every complete line of `data` (after any carried partial line) and keeps
    /// the cut tail for the next call.
    pub fn feed<S: LackeySink>(&mut self, mut data: &[u8], sink: &mut S) -> Result<()> {
        if self.discarding {
            match data.iter().position(|&b| b == b'\n') {
                None => return Ok(()),
                Some(i) => {
                    self.discarding = false;
                    self.line += 1;
                    data = &data[i + 1..];
                }
            }
        }
        if !self.carry.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                None => {
                    self.carry.extend_from_slice(data);
                    return self.check_carry();
                }
                Some(i) => {
                    let mut line = std::mem::take(&mut self.carry);
                    line.extend_from_slice(&data[..=i]);
                    self.decode_lines(&line, sink)?;
                    line.clear();
                    self.carry = line;
                    data = &data[i + 1..];
                }
            }
        }
        let end = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        self.decode_lines(&data[..end], sink)?;
        self.carry.extend_from_slice(&data[end..]);
        self.check_carry()
    }

    fn check_carry(&mut self) -> Result<()> {
        if self.carry.len() > MAX_LINE {
            let e = self.malformed(self.line + 1, &self.carry, "a line shorter than 1 MiB");
            self.skip_or_fail(e)?;
            // Lenient: drop the line up to its newline (counted then).
            self.carry.clear();
            self.discarding = true;
        }
        Ok(())
    }

    /// Ends the stream. A last line with no newline is a truncated trace: an error, or
    /// with `allow_truncated` a warning (returned) and the line is dropped.
    pub fn finish(&mut self, allow_truncated: bool) -> Result<Option<String>> {
        if self.discarding {
            // An over-long last line, already counted as skipped.
            self.discarding = false;
            self.line += 1;
            return Ok(None);
        }
        if self.carry.is_empty() {
            return Ok(None);
        }
        let line = self.line + 1;
        let text = show_line(&self.carry);
        self.carry.clear();
        if allow_truncated {
            Ok(Some(format!(
                "{}:{line}: trace is truncated: dropped the cut last line {text:?}; kept {} complete lines",
                self.path.display(),
                self.line
            )))
        } else {
            Err(TraceError::TruncatedText {
                path: self.path.clone(),
                line,
                text,
                kept_records: self.accesses,
            })
        }
    }

    fn malformed(&self, line: u64, text: &[u8], expected: &'static str) -> TraceError {
        let text = text.strip_suffix(b"\n").unwrap_or(text);
        TraceError::Malformed {
            path: self.path.clone(),
            line,
            text: show_line(text),
            expected,
        }
    }

    /// `buf` is empty or ends with a newline.
    fn decode_lines<S: LackeySink>(&mut self, buf: &[u8], sink: &mut S) -> Result<()> {
        let n = buf.len();
        let mut p = 0;
        let mut line = self.line;
        let mut accesses = self.accesses;
        while p < n {
            line += 1;
            // Fast path: an access line, parsed without first looking for its end.
            let kind = match (buf[p], buf.get(p + 1), buf.get(p + 2)) {
                (b'I', Some(b' '), Some(b' ')) => Some(LineKind::Instr),
                (b' ', Some(b'L'), Some(b' ')) => Some(LineKind::Load),
                (b' ', Some(b'S'), Some(b' ')) => Some(LineKind::Store),
                (b' ', Some(b'M'), Some(b' ')) => Some(LineKind::Modify),
                _ => None,
            };
            if let Some(kind) = kind {
                let mut q = p + 3;
                let start = q;
                let mut addr = 0u64;
                // Lackey prints at least 8 digits (`%08lx`): take 8 lowercase
                // ones at once where they are there; the loop below takes the
                // rest (and anything else, digit by digit, as before).
                if let Some(b) = buf.get(start..start + 8)
                    && let Some(v) = hex8(u64::from_le_bytes(b.try_into().expect("8 bytes")))
                {
                    addr = v;
                    q += 8;
                }
                // The buffer ends with '\n', which is neither hex nor decimal: no overrun.
                loop {
                    let d = HEX[buf[q] as usize];
                    if d > 15 {
                        break;
                    }
                    addr = addr << 4 | d as u64;
                    q += 1;
                }
                if !(1..=16).contains(&(q - start)) || buf[q] != b',' {
                    self.line = line;
                    self.accesses = accesses;
                    let text = line_at(buf, p);
                    let e = self.malformed(line, text, EXPECT_ACCESS);
                    self.skip_or_fail(e)?;
                    p += text.len();
                    continue;
                }
                q += 1;
                let dstart = q;
                let mut size = 0u64;
                while buf[q].is_ascii_digit() {
                    size = size.wrapping_mul(10).wrapping_add((buf[q] - b'0') as u64);
                    q += 1;
                }
                let ok = buf[q] == b'\n'
                    && (1..=7).contains(&(q - dstart))
                    && (1..=MAX_ACCESS_SIZE).contains(&size);
                // An access past 2^64 would be clipped where it is split
                // into pages (` M fffffffffffff000,8192` lost a page).
                let expected = if !ok {
                    Some(EXPECT_ACCESS)
                } else if addr.checked_add(size - 1).is_none() {
                    Some(EXPECT_IN_RANGE)
                } else {
                    None
                };
                if let Some(expected) = expected {
                    self.line = line;
                    self.accesses = accesses;
                    let text = line_at(buf, p);
                    let e = self.malformed(line, text, expected);
                    self.skip_or_fail(e)?;
                    p += text.len();
                    continue;
                }
                sink.access(kind, addr, size);
                accesses += 1;
                p = q + 1;
                continue;
            }
            let text = line_at(buf, p);
            p += text.len();
            self.line = line;
            self.accesses = accesses;
            if let Err(e) = self.decode_other(&text[..text.len() - 1], line, sink) {
                self.skip_or_fail(e)?;
            }
        }
        self.line = line;
        self.accesses = accesses;
        Ok(())
    }

    /// A line that is not an access line (without its newline).
    fn decode_other<S: LackeySink>(&mut self, text: &[u8], line: u64, sink: &mut S) -> Result<()> {
        if let Some(&open) = text.first()
            && matches!(open, b'=' | b'-' | b'*')
            && text.get(1) == Some(&open)
        {
            let digits = text[2..].iter().take_while(|b| b.is_ascii_digit()).count();
            let close = &text[2 + digits..];
            let closed = close.len() >= 2 && close[0] == open && close[1] == open;
            // Valgrind's debug log lines read `--PID:LEVEL:...`.
            let debug = open == b'-' && close.first() == Some(&b':');
            if digits == 0 || !(closed || debug) {
                return Err(self.malformed(line, text, EXPECT_MESSAGE));
            }
            if open == b'=' {
                self.banner_pid = parse_dec(&text[2..2 + digits]).unwrap_or(0) as u32;
            }
            return Ok(());
        }
        if let Some(rest) = text.strip_prefix(b"SYSCALL[") {
            let event = self
                .parse_syscall(rest)
                .map_err(|expected| self.malformed(line, text, expected))?;
            sink.syscall(&event);
            return Ok(());
        }
        if let Some(rest) = text.strip_prefix(b" --> ") {
            // ` --> Wat(zz)` was taken in as a result-less line.
            let result =
                parse_result(rest).ok_or_else(|| self.malformed(line, text, EXPECT_RESULT))?;
            let (pid, tid, nr) = self
                .last_call
                .unwrap_or((self.banner_pid, 0, UNKNOWN_SYSCALL));
            let event = SyscallEvent {
                pid,
                tid,
                nr,
                phase: SyscallPhase::Result,
                args: Vec::new(),
                result: Some(result),
            };
            sink.syscall(&event);
            return Ok(());
        }
        // A line that starts like an access line is a malformed access; else an unknown kind.
        let access_like = matches!(text, [b'I', ..] | [b' ', b'L' | b'S' | b'M', ..]);
        let expected = if access_like {
            EXPECT_ACCESS
        } else {
            EXPECT_KIND
        };
        Err(self.malformed(line, text, expected))
    }

    /// `rest` follows `SYSCALL[`; the error is what was expected.
    fn parse_syscall(&mut self, rest: &[u8]) -> std::result::Result<SyscallEvent, &'static str> {
        let head = || -> Option<(u32, u32, u32, &[u8])> {
            let (pid, rest) = take_dec(rest)?;
            let rest = rest.strip_prefix(b",")?;
            let (tid, rest) = take_dec(rest)?;
            let rest = rest.strip_prefix(b"](")?;
            let (nr, rest) = take_dec(rest)?;
            let rest = rest.strip_prefix(b")")?;
            Some((
                u32::try_from(pid).ok()?,
                u32::try_from(tid).ok()?,
                u32::try_from(nr).ok()?,
                rest,
            ))
        };
        let (pid, tid, nr, rest) = head().ok_or(EXPECT_SYSCALL)?;
        let body = trim_start(rest);
        if let Some(after) = body.strip_prefix(b"... [async] -->") {
            return Ok(SyscallEvent {
                pid,
                tid,
                nr,
                phase: SyscallPhase::Complete,
                args: Vec::new(),
                result: Some(parse_result(after).ok_or(EXPECT_RESULT)?),
            });
        }
        // An unclosed argument list (`SYSCALL[1,1](2) open ( 0x1`) was
        // taken in with the arguments it had.
        let args = parse_args(body).ok_or(EXPECT_CALL_ARGS)?;
        let result = match find(body, b"-->") {
            None => None,
            Some(i) => {
                let after = trim_start(&body[i + 3..]);
                if after.starts_with(b"[async]") {
                    None
                } else {
                    Some(parse_result(after).ok_or(EXPECT_RESULT)?)
                }
            }
        };
        self.last_call = Some((pid, tid, nr));
        Ok(SyscallEvent {
            pid,
            tid,
            nr,
            phase: SyscallPhase::Call,
            args,
            result,
        })
    }
}

/// The line starting at `p`, with its newline.
fn line_at(buf: &[u8], p: usize) -> &[u8] {
    let e = buf[p..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |i| p + i + 1);
    &buf[p..e]
}

fn parse_dec(s: &[u8]) -> Option<u64> {
    take_dec(s).filter(|(_, r)| r.is_empty()).map(|(v, _)| v)
}

fn take_dec(s: &[u8]) -> Option<(u64, &[u8])> {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 || n > 19 {
        return None;
    }
    let v = s[..n].iter().fold(0u64, |v, &b| v * 10 + (b - b'0') as u64);
    Some((v, &s[n..]))
}

/// A number as Valgrind prints arguments: `0x...` hex or decimal; None if neither.
fn take_number(s: &[u8]) -> Option<(u64, &[u8])> {
    if let Some(h) = s.strip_prefix(b"0x") {
        let n = h.iter().take_while(|&&b| HEX[b as usize] < 16).count();
        if n == 0 || n > 16 {
            return None;
        }
        let v = h[..n]
            .iter()
            .fold(0u64, |v, &b| v << 4 | HEX[b as usize] as u64);
        return Some((v, &h[n..]));
    }
    take_dec(s)
}

fn trim_start(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b' ').count();
    &s[n..]
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

/// `Success(0x..)` / `Failure(0x..)` anywhere after the arrow, or
/// `NoWriteResult` (syswrap-main.c prints it for a call completed by its
/// pre-handler without a result to write back, such as `rt_sigreturn`;
/// Valgrind's own status is then a bogus `Success(0)`, kept here).
fn parse_result(s: &[u8]) -> Option<SyscallResult> {
    if find(s, b"NoWriteResult").is_some() {
        return Some(SyscallResult::Success(0));
    }
    for (tag, ok) in [(&b"Success("[..], true), (&b"Failure("[..], false)] {
        if let Some(i) = find(s, tag) {
            let (v, _) = take_number(&s[i + tag.len()..])?;
            return Some(if ok {
                SyscallResult::Success(v)
            } else {
                SyscallResult::Failure(v)
            });
        }
    }
    None
}

/// The arguments between the first `(` of the body and its matching `)`;
/// None if that `(` never closes.
fn parse_args(body: &[u8]) -> Option<Vec<u64>> {
    let mut args = Vec::new();
    let Some(open) = body.iter().position(|&b| b == b'(') else {
        return Some(args);
    };
    let mut depth = 0usize;
    let mut token_start = open + 1;
    for (i, &b) in body.iter().enumerate().skip(open + 1) {
        match b {
            b'(' => depth += 1,
            b')' if depth > 0 => depth -= 1,
            b')' | b',' if depth == 0 => {
                let tok = trim_start(&body[token_start..i]);
                if !tok.is_empty() && args.len() < 6 {
                    args.push(take_number(tok).map_or(0, |(v, _)| v));
                }
                token_start = i + 1;
                if b == b')' {
                    return Some(args);
                }
            }
            _ => {}
        }
    }
    None
}

/// Turns accesses into the page references a TLB sees at one page size: a page-crossing
/// access becomes one reference per page, in address order (the second and later marked as
/// continuations); `M` becomes the load's pages then the store's pages. Syscalls are
/// ignored.
#[derive(Debug)]
pub struct PageSplitter {
    shift: u32,
    /// The page references produced so far (the caller drains it).
    pub out: Vec<PageRef>,
}

impl PageSplitter {
    pub fn new(page_shift: u32) -> PageSplitter {
        PageSplitter {
            shift: page_shift,
            out: Vec::new(),
        }
    }

    /// Appends the references of one access to `out`.
    #[inline]
    pub fn split_into(out: &mut Vec<PageRef>, shift: u32, kind: LineKind, addr: u64, size: u64) {
        let first = addr >> shift;
        let last = addr.saturating_add(size - 1) >> shift;
        match kind {
            LineKind::Instr => push_pages(out, first, last, AccessKind::Ifetch),
            LineKind::Load => push_pages(out, first, last, AccessKind::Load),
            LineKind::Store => push_pages(out, first, last, AccessKind::Store),
            LineKind::Modify => {
                push_pages(out, first, last, AccessKind::Load);
                push_pages(out, first, last, AccessKind::Store);
            }
        }
    }
}

#[inline]
fn push_pages(out: &mut Vec<PageRef>, first: u64, last: u64, kind: AccessKind) {
    out.push(PageRef::new(first, kind, false));
    if last != first {
        for vpn in first + 1..=last {
            out.push(PageRef::new(vpn, kind, true));
        }
    }
}

impl LackeySink for PageSplitter {
    #[inline]
    fn access(&mut self, kind: LineKind, addr: u64, size: u64) {
        PageSplitter::split_into(&mut self.out, self.shift, kind, addr, size);
    }
}

/// Decodes a whole text trace (a lackey log, or din/xdin; plain, gzip or
/// zstd) into `sink`. Returns the truncation warning, if `allow_truncated`
/// turned one into a warning.
pub fn decode_file<S: LackeySink>(
    path: &Path,
    sink: &mut S,
    allow_truncated: bool,
) -> Result<Option<String>> {
    let input = crate::input::open(path)?;
    let opts = crate::source::ReadOptions {
        allow_truncated,
        lenient: false,
    };
    let warnings = crate::source::decode_text(input, sink, &opts)?;
    Ok(warnings.into_iter().next())
}

#[cfg(test)]
mod hex8_tests {
    use super::hex8;

    /// Against the digit-by-digit reading, for every byte in every
    /// position and for some mixed words.
    #[test]
    fn hex8_agrees_with_digit_by_digit() {
        let slow = |b: [u8; 8]| -> Option<u64> {
            b.iter().try_fold(0u64, |a, &c| match c {
                b'0'..=b'9' => Some(a << 4 | (c - b'0') as u64),
                b'a'..=b'f' => Some(a << 4 | (c - b'a' + 10) as u64),
                _ => None,
            })
        };
        for pos in 0..8 {
            for c in 0..=255u8 {
                let mut b = *b"0123abcd";
                b[pos] = c;
                assert_eq!(hex8(u64::from_le_bytes(b)), slow(b), "{b:?}");
            }
        }
        let mut x = 0x1234_5678_9abc_def1u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let alphabet = b"0123456789abcdefABCDEFg,\n :/@`";
            let b: [u8; 8] =
                std::array::from_fn(|i| alphabet[(x >> (i * 5)) as usize % alphabet.len()]);
            assert_eq!(hex8(u64::from_le_bytes(b)), slow(b), "{b:?}");
        }
    }
}
