//! The one error type of the crate. Every variant that comes from bad input says where:
//! the file, and a line number (text) or a byte offset and block (binary).

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, TraceError>;

/// Everything that can go wrong reading, writing, capturing or simulating a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A text line that is not what Valgrind lackey writes.
    #[error("{}:{line}: malformed trace line {text:?}: expected {expected}", path.display())]
    Malformed {
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// The offending line (cut to 200 bytes, lossy UTF-8).
        text: String,
        /// What a valid line at that point looks like.
        expected: &'static str,
    },
    /// The text trace ends in the middle of a line.
    #[error(
        "{}:{line}: trace is truncated: the last line {text:?} has no newline \
         (allow_truncated keeps the {kept_records} complete records before it)",
        path.display()
    )]
    TruncatedText {
        path: PathBuf,
        line: u64,
        text: String,
        kept_records: u64,
    },
    /// A binary trace shorter than its header says, or never finalized.
    #[error(
        "{}: binary trace is truncated at byte {offset} (block {block}): {detail} \
         (allow_truncated keeps the {kept_records} records of the complete blocks)",
        path.display()
    )]
    TruncatedBinary {
        path: PathBuf,
        offset: u64,
        block: u64,
        detail: String,
        kept_records: u64,
    },
    /// A block (or the header) whose checksum does not match its bytes.
    #[error(
        "{}: checksum mismatch in {what} at byte {offset}: stored {stored:#018x}, computed {computed:#018x}",
        path.display()
    )]
    Checksum {
        path: PathBuf,
        what: String,
        offset: u64,
        stored: u64,
        computed: u64,
    },
    /// A binary trace whose header or records cannot be decoded.
    #[error("{}: bad binary trace at byte {offset}: {detail}", path.display())]
    BadBinary {
        path: PathBuf,
        offset: u64,
        detail: String,
    },
    /// A plain text trace cut short by another process while it was
    /// decoded from its memory map (see `mapped`).
    #[error(
        "{}: the file was cut short while it was being read ({was} bytes when opened, {now} now; \
         another process truncated or rewrote it): no result from it; rerun once it is complete",
        path.display()
    )]
    CutWhileRead { path: PathBuf, was: u64, now: u64 },
    /// An operating-system error on a file. The OS error is part of the
    /// message and not a `source`, so a chain printer does not say it twice
    /// ("No such file or directory (os error 2)" came out twice).
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    /// A trace with no memory references: an empty file, or one whose
    /// lines are all messages, syscalls or (under `--lenient`) skipped.
    #[error("{}: {detail}", path.display())]
    Empty { path: PathBuf, detail: String },
    /// A compressed trace whose stream cannot be decoded.
    #[error("{}: bad {format} stream: {detail}", path.display())]
    BadCompressed {
        path: PathBuf,
        format: &'static str,
        detail: String,
    },
    /// Options that do not describe a TLB or a trace we can handle.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// Running Valgrind failed.
    #[error("capture failed: {0}")]
    Capture(String),
}

impl TraceError {
    /// True for errors caused by the trace's contents (the CLI exits 2 on these).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            TraceError::Malformed { .. }
                | TraceError::TruncatedText { .. }
                | TraceError::TruncatedBinary { .. }
                | TraceError::Checksum { .. }
                | TraceError::BadBinary { .. }
                | TraceError::Empty { .. }
                | TraceError::BadCompressed { .. }
        )
    }

    /// An I/O error on `path`; one a decompressor raised is the stream's
    /// fault, bad input.
    pub(crate) fn io(path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        let path = path.into();
        let ours = err
            .get_ref()
            .is_some_and(|e| e.is::<crate::input::StreamError>());
        if ours {
            let s = err
                .into_inner()
                .expect("checked")
                .downcast::<crate::input::StreamError>()
                .expect("checked");
            return TraceError::BadCompressed {
                path,
                format: s.format,
                detail: s.detail,
            };
        }
        TraceError::Io { path, err }
    }
}

/// Lossy, length-capped rendering of a line for error messages.
pub(crate) fn show_line(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(200)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if bytes.len() > 200 {
        s.push('…');
    }
    s
}
