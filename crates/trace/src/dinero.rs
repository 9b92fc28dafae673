//! Reading Dinero IV's text input formats, the ones [`crate::export`] writes:
//!
//! * `din`, the traditional format (`-informat d`, `d4-7/dinfmt.c`): a hex
//!   label and a hex address per line, the rest of the line ignored. Labels
//!   0 read, 1 write, 2 instruction fetch; Dinero reads the address as a
//!   4-byte word (`address & ~3`, size 4), and so does this reader.
//! * `xdin`, the extended format (`-informat D`, `d4-7/xdinfmt.c`): an
//!   access type, a hex address and a hex size, the rest ignored. Types
//!   `r` read, `w` write, `i` instruction fetch, `m` miscellaneous (a read
//!   that starts no prefetch: a load here).
//!
//! Addresses and sizes may carry `0x`. Anything else is refused with the
//! file, the line number and the line: din's escape labels 3 and 4 and
//! xdin's `c` (copy-back) and `v` (invalidate) are cache commands, not
//! memory references, and an access past 2^64 is out of range. Under
//! `lenient` such lines are skipped and counted instead.

use std::path::{Path, PathBuf};

use crate::error::show_line;
use crate::lackey::{LackeySink, LineKind, MAX_ACCESS_SIZE};
use crate::{Result, TraceError};

/// Which of Dinero's text formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DineroFormat {
    /// `LABEL ADDRESS ...`
    Din,
    /// `TYPE ADDRESS SIZE ...`
    Xdin,
}

impl DineroFormat {
    pub fn name(self) -> &'static str {
        match self {
            DineroFormat::Din => "din",
            DineroFormat::Xdin => "xdin",
        }
    }

    fn expected(self) -> &'static str {
        match self {
            DineroFormat::Din => {
                "a din line `LABEL ADDRESS` (label 0 read, 1 write or 2 instruction fetch, \
                 a hex address of at most 16 digits)"
            }
            DineroFormat::Xdin => {
                "an xdin line `TYPE ADDRESS SIZE` (type r, w, i or m; hex address of at most \
                 16 digits; hex size from 1 to 0x100000)"
            }
        }
    }
}

/// Longest line kept while waiting for its newline.
const MAX_LINE: usize = 1 << 16;

const EXPECT_IN_RANGE: &str = "an access that ends at or below the top of the 64-bit address space";

/// Decodes a din or xdin trace fed in chunks of any size.
#[derive(Debug)]
pub struct DineroDecoder {
    path: PathBuf,
    format: DineroFormat,
    line: u64,
    accesses: u64,
    carry: Vec<u8>,
    lenient: bool,
    skipped: u64,
    first_skipped: Option<String>,
    discarding: bool,
}

impl DineroDecoder {
    /// `path` is only used in messages.
    pub fn new(path: impl Into<PathBuf>, format: DineroFormat) -> DineroDecoder {
        DineroDecoder {
            path: path.into(),
            format,
            line: 0,
            accesses: 0,
            carry: Vec::new(),
            lenient: false,
            skipped: 0,
            first_skipped: None,
            discarding: false,
        }
    }

    /// Skips malformed lines (counting them) instead of failing.
    pub fn lenient(mut self, on: bool) -> DineroDecoder {
        self.lenient = on;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Access lines decoded so far.
    pub fn accesses(&self) -> u64 {
        self.accesses
    }

    /// Lines skipped under `lenient`.
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

    fn fail(&mut self, line: u64, text: &[u8], expected: &'static str) -> Result<()> {
        let text = text.strip_suffix(b"\n").unwrap_or(text);
        let e = TraceError::Malformed {
            path: self.path.clone(),
            line,
            text: show_line(text),
            expected,
        };
        if !self.lenient {
            return Err(e);
        }
        self.skipped += 1;
        if self.first_skipped.is_none() {
            self.first_skipped = Some(e.to_string());
        }
        Ok(())
    }

    /// Decodes every complete line of `data` (after a carried partial one).
    pub fn feed<S: LackeySink>(&mut self, mut data: &[u8], sink: &mut S) -> Result<()> {
        while !data.is_empty() {
            let nl = data.iter().position(|&b| b == b'\n');
            if self.discarding {
                match nl {
                    None => return Ok(()),
                    Some(i) => {
                        self.discarding = false;
                        self.line += 1;
                        data = &data[i + 1..];
                        continue;
                    }
                }
            }
            match nl {
                None => {
                    self.carry.extend_from_slice(data);
                    if self.carry.len() > MAX_LINE {
                        let carry = std::mem::take(&mut self.carry);
                        self.fail(self.line + 1, &carry, "a line shorter than 64 KiB")?;
                        self.discarding = true;
                    }
                    return Ok(());
                }
                Some(i) => {
                    self.line += 1;
                    if self.carry.is_empty() {
                        self.decode_line(&data[..i], sink)?;
                    } else {
                        let mut line = std::mem::take(&mut self.carry);
                        line.extend_from_slice(&data[..i]);
                        self.decode_line(&line, sink)?;
                        line.clear();
                        self.carry = line;
                    }
                    data = &data[i + 1..];
                }
            }
        }
        Ok(())
    }

    /// Ends the stream; a last line without its newline is decoded like
    /// any other (Dinero reads to end of file).
    pub fn finish<S: LackeySink>(&mut self, sink: &mut S) -> Result<()> {
        if self.discarding {
            self.discarding = false;
            self.line += 1;
        } else if !self.carry.is_empty() {
            self.line += 1;
            let line = std::mem::take(&mut self.carry);
            self.decode_line(&line, sink)?;
        }
        Ok(())
    }

    /// One line, without its newline.
    fn decode_line<S: LackeySink>(&mut self, text: &[u8], sink: &mut S) -> Result<()> {
        let line = self.line;
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let mut fields = text
            .split(|&b| b == b' ' || b == b'\t')
            .filter(|f| !f.is_empty());
        let Some(label) = fields.next() else {
            // Dinero calls an empty line a "short line": an error.
            return self.fail(line, text, self.format.expected());
        };
        let access = match self.format {
            DineroFormat::Din => {
                let kind = match hex(label) {
                    Some(0) => Some(LineKind::Load),
                    Some(1) => Some(LineKind::Store),
                    Some(2) => Some(LineKind::Instr),
                    _ => None,
                };
                let addr = fields.next().and_then(hex);
                match (kind, addr) {
                    // dinfmt.c: "dineroIII is pretty much word-oriented".
                    (Some(k), Some(a)) => Some((k, a & !3, 4)),
                    _ => None,
                }
            }
            DineroFormat::Xdin => {
                let kind = match label {
                    b"r" | b"m" => Some(LineKind::Load),
                    b"w" => Some(LineKind::Store),
                    b"i" => Some(LineKind::Instr),
                    _ => None,
                };
                let addr = fields.next().and_then(hex);
                let size = fields.next().and_then(hex);
                match (kind, addr, size) {
                    (Some(k), Some(a), Some(s)) if (1..=MAX_ACCESS_SIZE).contains(&s) => {
                        Some((k, a, s))
                    }
                    _ => None,
                }
            }
        };
        let Some((kind, addr, size)) = access else {
            return self.fail(line, text, self.format.expected());
        };
        if addr.checked_add(size - 1).is_none() {
            return self.fail(line, text, EXPECT_IN_RANGE);
        }
        sink.access(kind, addr, size);
        self.accesses += 1;
        Ok(())
    }
}

/// A hex number of 1 to 16 digits, with an optional `0x`/`0X`.
fn hex(s: &[u8]) -> Option<u64> {
    let d = s
        .strip_prefix(b"0x")
        .or_else(|| s.strip_prefix(b"0X"))
        .unwrap_or(s);
    if d.is_empty() || d.len() > 16 {
        return None;
    }
    d.iter().try_fold(0u64, |v, &b| {
        let x = (b as char).to_digit(16)?;
        Some(v << 4 | x as u64)
    })
}

/// The Dinero format a text trace's first line is in, if it is one: din
/// starts with a hex label, xdin with an access type and a blank; a
/// lackey log starts with a Valgrind banner, an access line (`I  `,
/// ` L `...) or a syscall line, none of which these can.
pub fn sniff(head: &[u8]) -> Option<DineroFormat> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or(head);
    let lackey = [
        &b"I  "[..],
        b" L ",
        b" S ",
        b" M ",
        b"==",
        b"--",
        b"**",
        b"SYSCALL[",
        b" --> ",
    ];
    if lackey.iter().any(|p| line.starts_with(p)) {
        return None;
    }
    let t = &line[line
        .iter()
        .take_while(|&&b| b == b' ' || b == b'\t')
        .count()..];
    match t {
        [b'r' | b'w' | b'i' | b'm' | b'c' | b'v', b' ' | b'\t', ..] => Some(DineroFormat::Xdin),
        [c, ..] if c.is_ascii_hexdigit() => Some(DineroFormat::Din),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Got(Vec<(LineKind, u64, u64)>);
    impl LackeySink for Got {
        fn access(&mut self, kind: LineKind, addr: u64, size: u64) {
            self.0.push((kind, addr, size));
        }
    }

    fn decode(format: DineroFormat, text: &str) -> Result<Vec<(LineKind, u64, u64)>> {
        let mut d = DineroDecoder::new("t", format);
        let mut got = Got::default();
        // Fed a byte at a time: lines cut anywhere decode the same.
        for b in text.as_bytes() {
            d.feed(std::slice::from_ref(b), &mut got)?;
        }
        d.finish(&mut got)?;
        Ok(got.0)
    }

    #[test]
    fn din_reads_words_as_dinero_does() {
        let got = decode(DineroFormat::Din, "0 1003\n1 0x2000 junk\n2\t3000").unwrap();
        assert_eq!(
            got,
            vec![
                (LineKind::Load, 0x1000, 4),
                (LineKind::Store, 0x2000, 4),
                (LineKind::Instr, 0x3000, 4)
            ]
        );
    }

    #[test]
    fn xdin_reads_type_address_size() {
        let got = decode(
            DineroFormat::Xdin,
            "r 1000 8\nw 0x2000 0x10\ni 3000 4\nm 40 1\n",
        )
        .unwrap();
        assert_eq!(got[1], (LineKind::Store, 0x2000, 16));
        assert_eq!(got[3], (LineKind::Load, 0x40, 1));
    }

    #[test]
    fn malformed_lines_name_their_number() {
        for (format, text, line) in [
            (DineroFormat::Din, "0 1000\n4 1000\n", 2),
            (DineroFormat::Din, "0 1000\n\n", 2),
            (DineroFormat::Din, "0 zz\n", 1),
            (DineroFormat::Xdin, "r 1000 4\nv 1000 4\n", 2),
            (DineroFormat::Xdin, "r 1000\n", 1),
            (DineroFormat::Xdin, "r 1000 0\n", 1),
            (DineroFormat::Xdin, "w fffffffffffff000 2000\n", 1),
            (DineroFormat::Xdin, "r 11112222333344445 4\n", 1),
        ] {
            let e = decode(format, text).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("t:{line}: malformed")),
                "{text:?}: {e}"
            );
        }
    }

    #[test]
    fn lenient_skips_and_counts() {
        let mut d = DineroDecoder::new("t", DineroFormat::Xdin).lenient(true);
        let mut got = Got::default();
        d.feed(b"r 1000 4\nq 1 1\nw 2000 4\nv 0 4\n", &mut got)
            .unwrap();
        d.finish(&mut got).unwrap();
        assert_eq!(got.0.len(), 2);
        assert_eq!(d.skipped(), 2);
        assert!(d.skipped_warning().unwrap().contains("t:2:"));
    }

    #[test]
    fn sniffing_tells_the_formats_apart() {
        assert_eq!(sniff(b"0 1000\n"), Some(DineroFormat::Din));
        assert_eq!(sniff(b"r 1000 4\n"), Some(DineroFormat::Xdin));
        assert_eq!(sniff(b"==123== Lackey\n"), None);
        assert_eq!(sniff(b"I  0400d7d4,8\n"), None);
        assert_eq!(sniff(b" L 1000,4\n"), None);
    }
}
