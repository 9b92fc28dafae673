//! Property tests that feed the trace readers random bytes and mutated real
//! traces (issue 24): the lackey decoder, the din/xdin decoder, the binary
//! block decoder and the binary reader, and the compressed-input opener.
//! Nothing may panic, and memory stays bounded: a counting allocator
//! fails the test if any input makes a reader ask for more than
//! `MAX_ALLOCATION` at once or hold more than `MAX_LIVE` in all.
//! `FUZZ_CASES` cases each (10,000; `MMULAB_FUZZ_CASES` overrides).

use std::io::Cursor;
use std::path::{Path, PathBuf};

use mmulab_trace::dinero::{DineroDecoder, DineroFormat};
use mmulab_trace::input::{Compression, Input, TraceFormat};
use mmulab_trace::lackey::{LackeyDecoder, LackeySink, LineKind, SyscallEvent};
use mmulab_trace::{PageRef, TraceError};
use proptest::prelude::*;

// ---------------------------------------------------------------- memory bound

#[global_allocator]
static ALLOC: mmulab_testkit::Counting = mmulab_testkit::Counting;

/// The largest single allocation any input may cause: the readers' own
/// buffers are 4 MiB; a length field believed would ask for gigabytes.
const MAX_ALLOCATION: usize = 64 << 20;
/// All the tests of this binary together, running in parallel.
const MAX_LIVE: usize = 1 << 30;

fn memory_bounded() {
    mmulab_testkit::assert_memory_bounded(MAX_ALLOCATION, MAX_LIVE);
}

fn cases() -> u32 {
    mmulab_testkit::fuzz_cases()
}

// ---------------------------------------------------------------- inputs

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The first lines of the real logs: accesses, syscalls, messages.
fn real_lackey() -> Vec<u8> {
    let mut v = Vec::new();
    for f in ["fork-parent-excerpt.lackey.log", "fork-child.lackey.log"] {
        let text = std::fs::read(fixture(f)).unwrap();
        let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').take(120).collect();
        v.extend(lines.join(&b'\n'));
        v.push(b'\n');
    }
    v
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), 0usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (
            any::<usize>(),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..32),
                // Text that looks like a trace, to reach the deeper paths.
                "[ ILSM0-9a-fA-Fx,\\-\\->()\\[\\]=\\n]{0,40}".prop_map(String::into_bytes),
            ]
        )
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 0usize..200).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(mut v: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let n = v.len().max(1);
        match m {
            Mutation::Flip(i, b) => {
                if !v.is_empty() {
                    let i = i % n;
                    v[i] ^= b | 1;
                }
            }
            Mutation::Delete(i, k) => {
                let i = i % n;
                let end = (i + k).min(v.len());
                if i < end {
                    v.drain(i..end);
                }
            }
            Mutation::Insert(i, bytes) => {
                let i = i % (v.len() + 1);
                v.splice(i..i, bytes.iter().copied());
            }
            Mutation::Duplicate(i, k) => {
                let i = i % n;
                let end = (i + k).min(v.len());
                if i < end {
                    let piece = v[i..end].to_vec();
                    v.splice(i..i, piece);
                }
            }
            Mutation::Truncate(i) => v.truncate(i % n),
        }
    }
    v
}

// ---------------------------------------------------------------- text decoders

#[derive(Default, Debug, PartialEq)]
struct Seen {
    accesses: Vec<(LineKind, u64, u64)>,
    syscalls: usize,
}

impl LackeySink for Seen {
    fn access(&mut self, kind: LineKind, addr: u64, size: u64) {
        // Every access the decoders pass on fits the address space.
        assert!(size >= 1 && addr.checked_add(size - 1).is_some());
        self.accesses.push((kind, addr, size));
    }
    fn syscall(&mut self, _: &SyscallEvent) {
        self.syscalls += 1;
    }
}

/// What decoding `data` in `chunk`-sized pieces gives: the accesses and the
/// error (its text), and lines skipped under `lenient`.
fn lackey(data: &[u8], chunk: usize, lenient: bool) -> (Seen, Option<String>, u64) {
    let mut d = LackeyDecoder::new("fuzz.log").lenient(lenient);
    let mut seen = Seen::default();
    for c in data.chunks(chunk.max(1)) {
        if let Err(e) = d.feed(c, &mut seen) {
            return (seen, Some(e.to_string()), d.skipped());
        }
    }
    let r = d.finish(false).err().map(|e| e.to_string());
    (seen, r, d.skipped())
}

fn dinero(data: &[u8], chunk: usize, format: DineroFormat) -> (Seen, Option<String>) {
    let mut d = DineroDecoder::new("fuzz.din", format);
    let mut seen = Seen::default();
    for c in data.chunks(chunk.max(1)) {
        if let Err(e) = d.feed(c, &mut seen) {
            return (seen, Some(e.to_string()));
        }
    }
    let r = d.finish(&mut seen).err().map(|e| e.to_string());
    (seen, r)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Random bytes: no panic; the result does not depend on how the bytes
    /// are cut into chunks; a lenient decode of input the strict one
    /// accepts skips nothing.
    #[test]
    fn lackey_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..600), chunk in 1usize..700) {
        let (whole, e1, _) = lackey(&data, data.len().max(1), false);
        let (cut, e2, _) = lackey(&data, chunk, false);
        prop_assert_eq!(&e1, &e2);
        if e1.is_none() {
            prop_assert_eq!(&whole, &cut);
            let (lenient, e3, skipped) = lackey(&data, chunk, true);
            prop_assert_eq!(e3, None);
            prop_assert_eq!(skipped, 0);
            prop_assert_eq!(&lenient, &whole);
        }
        memory_bounded();
    }

    /// Real logs, mutated: as above, and a lenient decode never fails on
    /// a malformed line (only on a cut last one).
    #[test]
    fn lackey_mutated_logs(muts in proptest::collection::vec(mutation(), 1..6), chunk in 1usize..5000) {
        let data = apply(real_lackey(), &muts);
        let (whole, e1, _) = lackey(&data, data.len().max(1), false);
        let (cut, e2, _) = lackey(&data, chunk, false);
        prop_assert_eq!(&e1, &e2);
        if e1.is_none() {
            prop_assert_eq!(&whole, &cut);
        }
        let (_, e3, _) = lackey(&data, chunk, true);
        if let Some(e) = e3 {
            prop_assert!(e.contains("truncated"), "lenient failed: {}", e);
        }
        memory_bounded();
    }

    #[test]
    fn din_and_xdin_random_and_mutated(
        data in proptest::collection::vec(any::<u8>(), 0..400),
        muts in proptest::collection::vec(mutation(), 0..6),
        chunk in 1usize..500,
        xdin in any::<bool>(),
    ) {
        let format = if xdin { DineroFormat::Xdin } else { DineroFormat::Din };
        let base: &[u8] = if xdin {
            b"r 1000 4\nw 0x2000 8\ni 400000 3\nm 7fff0000 10\n"
        } else {
            b"0 1000\n1 0x2000 trailing\n2 400000\n"
        };
        for input in [data.clone(), apply(base.to_vec(), &muts)] {
            let (whole, e1) = dinero(&input, input.len().max(1), format);
            let (cut, e2) = dinero(&input, chunk, format);
            prop_assert_eq!(&e1, &e2);
            if e1.is_none() {
                prop_assert_eq!(&whole, &cut);
            }
        }
        memory_bounded();
    }
}

// ---------------------------------------------------------------- binary

/// A real binary trace (the fixture converted), as bytes.
fn real_binary() -> Vec<u8> {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("mmulab-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let out = dir.join("fixture.bin");
            mmulab_trace::binary::convert_lackey(
                &fixture("fork-parent-excerpt.lackey.log"),
                &out,
                12,
                1,
                false,
            )
            .unwrap();
            let bytes = std::fs::read(&out).unwrap();
            let _ = std::fs::remove_dir_all(&dir);
            bytes
        })
        .clone()
}

/// Reads a whole binary trace from memory; the error's text if it fails.
fn read_binary(bytes: Vec<u8>, allow_truncated: bool) -> Result<usize, TraceError> {
    let input = Input {
        path: PathBuf::from("fuzz.bin"),
        compression: Compression::None,
        format: TraceFormat::Binary,
        reader: Box::new(Cursor::new(bytes)),
    };
    let mut r = mmulab_trace::binary::BinaryReader::from_input(input, allow_truncated)?;
    let mut refs: Vec<PageRef> = Vec::new();
    let mut syscalls = Vec::new();
    while r.next_block(&mut refs, Some(&mut syscalls))? {
        refs.clear();
    }
    Ok(syscalls.len())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// One block's payload: random bytes decode or fail with an offset in
    /// the block, never panic, never yield a page outside the address
    /// space.
    #[test]
    fn binary_payload_random(payload in proptest::collection::vec(any::<u8>(), 0..300), shift in 3u32..=40) {
        let max_vpn = mmulab_trace::max_vpn(shift);
        let mut refs = Vec::new();
        let mut sys = Vec::new();
        match mmulab_trace::binary::decode_payload(&payload, &mut refs, Some(&mut sys), 0, max_vpn) {
            Ok(records) => {
                prop_assert!(refs.len() as u64 <= records && records as usize <= payload.len());
                prop_assert!(refs.iter().all(|r| r.vpn() <= max_vpn));
            }
            Err((at, _)) => prop_assert!(at < payload.len().max(1)),
        }
        memory_bounded();
    }

    /// A real binary trace, mutated (checksums and all): read to the end
    /// strictly and with allow_truncated, never a panic.
    #[test]
    fn binary_reader_mutated(muts in proptest::collection::vec(mutation(), 1..5), allow in any::<bool>()) {
        let bytes = apply(real_binary(), &muts);
        let _ = read_binary(bytes, allow);
        memory_bounded();
    }
}

/// The unmutated trace reads back: the mutated test above is not just
/// failing early on every input.
#[test]
fn binary_reader_reads_the_real_trace() {
    assert!(read_binary(real_binary(), false).unwrap() > 0);
}

// ---------------------------------------------------------------- compressed input

proptest! {
    // Each case writes a file: fewer cases (2,000).
    #![proptest_config(ProptestConfig { cases: cases() / 5, failure_persistence: None, ..ProptestConfig::default() })]

    /// A file with a gzip or zstd magic and random (or cut, or flipped)
    /// contents: opened and read to the end as a trace, never a panic.
    #[test]
    fn compressed_streams_random(
        zstd in any::<bool>(),
        tail in proptest::collection::vec(any::<u8>(), 0..200),
        muts in proptest::collection::vec(mutation(), 0..3),
    ) {
        let dir = std::env::temp_dir().join(format!("mmulab-fuzz-z-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.bin", std::thread::current().name().unwrap_or("t").replace("::", "_")));
        let mut bytes = if zstd { vec![0x28, 0xb5, 0x2f, 0xfd] } else { vec![0x1f, 0x8b] };
        if muts.is_empty() {
            bytes.extend(tail);
        } else {
            // A valid stream of a real log, mutated.
            bytes = apply(if zstd { zstd_log() } else { gzip_log() }, &muts);
        }
        std::fs::write(&path, &bytes).unwrap();
        let _ = mmulab_trace::load_refs(&path, 4096, &mmulab_trace::ReadOptions::default());
        memory_bounded();
    }
}

fn gzip_log() -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(&real_lackey()).unwrap();
    e.finish().unwrap()
}

/// A zstd frame of a real log, made by the `zstd` tool when present
/// (ruzstd here only decodes), else a stored copy of the header alone.
fn zstd_log() -> Vec<u8> {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES
        .get_or_init(|| {
            let out = std::process::Command::new("zstd")
                .args(["-q", "-c"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut c| {
                    use std::io::Write;
                    c.stdin.take().unwrap().write_all(&real_lackey())?;
                    c.wait_with_output()
                });
            match out {
                Ok(o) if o.status.success() => o.stdout,
                _ => vec![0x28, 0xb5, 0x2f, 0xfd, 0x00],
            }
        })
        .clone()
}
