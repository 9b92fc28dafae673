//! What the tester is asked to do: the operation, the responder counts, the
//! page count and the repetitions. Every default is written here, where the
//! option is defined.

use crate::error::HostError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The operation the initiator performs on the page(s) of counters. Each one
/// reduces the rights of the mapping, so Linux must shoot down every TLB that
/// may cache it before the call returns (black89 §5.1 uses the first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Op {
    /// `mprotect(PROT_READ)` on a read-write private anonymous mapping: the
    /// paper's "reprotect the page of counters to be read-only".
    #[serde(rename = "mprotect")]
    Mprotect,
    /// `munmap` of a shared-memory mapping (a memfd, so that the frames
    /// survive and the initiator can still read the counters through a second
    /// mapping that the responders never touch).
    #[serde(rename = "munmap")]
    Munmap,
    /// `madvise(MADV_DONTNEED)` on a private anonymous mapping: the old
    /// frames are dropped and the next touch maps a fresh zero-filled page.
    #[serde(rename = "madvise")]
    MadviseDontneed,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::Mprotect, Op::Munmap, Op::MadviseDontneed];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Op::Mprotect => "mprotect",
            Op::Munmap => "munmap",
            Op::MadviseDontneed => "madvise",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = HostError;
    fn from_str(s: &str) -> Result<Op, HostError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mprotect" => Ok(Op::Mprotect),
            "munmap" => Ok(Op::Munmap),
            "madvise" | "madvise-dontneed" | "madv_dontneed" | "dontneed" => {
                Ok(Op::MadviseDontneed)
            }
            other => Err(HostError::InvalidOptions(format!(
                "unknown operation {other:?}: expected mprotect, munmap or madvise"
            ))),
        }
    }
}

/// Test hooks: deliberately broken runs, so that the consistency check can
/// be shown to fire (a negative control, as for the simulator's `none`
/// protocol). Never set by the command line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hooks {
    /// Skip the operation itself (and the matching re-arm): nothing is
    /// reprotected, unmapped or discarded, so the responders keep writing and
    /// the verdict must be `inconsistent`.
    pub skip_operation: bool,
    /// After the operation and the first snapshot, the initiator itself
    /// writes into the first responder's counter through the observer view,
    /// as a stale TLB entry would. The verdict must be `inconsistent`.
    pub write_after_operation: bool,
}

/// The options of one `mmulab host shootdown` run.
#[derive(Clone, Debug, PartialEq)]
pub struct ShootdownOptions {
    /// Responder thread counts, one point each. Default: every count that
    /// fits, `1..=usable_cores - 1` (see [`ShootdownOptions::default_threads`]).
    /// The baseline (0 responders) is always measured in addition.
    pub threads: Vec<usize>,
    /// Default: `Op::Mprotect`, the paper's operation.
    pub op: Op,
    /// Pages covered by each operation. Default 1 (the paper: one page).
    /// Linux flushes page by page up to `tlb_single_page_flush_ceiling`
    /// (33 on x86) and the whole TLB beyond.
    pub pages: usize,
    /// Timed repetitions per point. Default 100 (the paper ran each case 10
    /// times).
    pub reps: usize,
    /// Untimed repetitions before each point, to warm caches, page tables
    /// and the responders' TLBs. Default 5.
    pub warmup: usize,
    /// Bound on waiting for a responder to run (start, acknowledge a new
    /// round). Past it the run stops with `HostError::ResponderStalled`:
    /// a bounded spin, never a hang. Default 2 s.
    pub ack_timeout: Duration,
    /// Bound on waiting, after `mprotect`/`munmap`, for every responder to
    /// take its fault. A responder that did not fault in time was not
    /// running; the verdict still rests on the counters, and the miss is
    /// counted. Default 1 s.
    pub fault_timeout: Duration,
    /// Deliberate breakage for tests. Default: none.
    pub hooks: Hooks,
}

impl Default for ShootdownOptions {
    fn default() -> Self {
        ShootdownOptions {
            threads: Vec::new(),
            op: Op::Mprotect,
            pages: 1,
            reps: 100,
            warmup: 5,
            ack_timeout: Duration::from_secs(2),
            fault_timeout: Duration::from_secs(1),
            hooks: Hooks::default(),
        }
    }
}

impl ShootdownOptions {
    /// The default responder counts for a machine with `usable_cores` cores
    /// the process may run on: one core for the initiator, one per responder.
    pub fn default_threads(usable_cores: usize) -> Vec<usize> {
        (1..usable_cores).collect()
    }

    /// The most pages one operation may cover: 65,536 (256 MiB at 4 KiB),
    /// far past Linux's full-flush ceiling of 33, and memory each
    /// responder's mapping really takes.
    pub const MAX_PAGES: usize = 1 << 16;
    /// The most timed repetitions per point: 10^6 (at tens of µs each,
    /// minutes per point).
    pub const MAX_REPS: usize = 1_000_000;

    /// Checks what can be checked without touching the machine.
    pub fn validate(&self) -> Result<(), HostError> {
        if !(1..=Self::MAX_PAGES).contains(&self.pages) {
            return Err(HostError::InvalidOptions(format!(
                "--pages: must be 1 to {}, got {}",
                Self::MAX_PAGES,
                self.pages
            )));
        }
        if !(1..=Self::MAX_REPS).contains(&self.reps) {
            return Err(HostError::InvalidOptions(format!(
                "--reps: must be 1 to {}, got {}",
                Self::MAX_REPS,
                self.reps
            )));
        }
        if self.threads.contains(&0) {
            return Err(HostError::InvalidOptions(
                "0 responder threads is the baseline, which is always measured; list 1 or more"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// Parses a responder-count list: `"1-15"`, `"1,2,4"`, or a mix such as
/// `"1-3,8,12-15"`. The result is sorted and without duplicates. 0 is refused
/// (the baseline is always measured).
pub fn parse_thread_list(s: &str) -> Result<Vec<usize>, HostError> {
    let bad = |why: String| HostError::InvalidOptions(format!("bad thread list {s:?}: {why}"));
    let mut out = Vec::new();
    if s.trim().is_empty() {
        return Err(bad("empty".into()));
    }
    for part in s.split(',') {
        let part = part.trim();
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| bad(format!("{t:?} is not a number")))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(part)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(bad(format!("range {part:?} runs backwards")));
        }
        if lo == 0 {
            return Err(bad(
                "0 responders is the baseline, which is always measured".into(),
            ));
        }
        if hi - lo > 4096 {
            return Err(bad(format!("range {part:?} is too long")));
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_lists() {
        assert_eq!(
            parse_thread_list("1-15").unwrap(),
            (1..=15).collect::<Vec<_>>()
        );
        assert_eq!(parse_thread_list("1,2,4").unwrap(), vec![1, 2, 4]);
        assert_eq!(parse_thread_list(" 4, 1-3 ,2").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(parse_thread_list("7").unwrap(), vec![7]);
    }

    #[test]
    fn bad_lists_are_refused_with_the_reason() {
        for (s, why) in [
            ("", "empty"),
            ("0", "baseline"),
            ("0-3", "baseline"),
            ("3-1", "backwards"),
            ("a", "not a number"),
            ("1,,2", "not a number"),
            ("1-", "not a number"),
        ] {
            let e = parse_thread_list(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s:?} gave {e:?}");
        }
    }

    #[test]
    fn op_names_round_trip() {
        for op in Op::ALL {
            assert_eq!(op.name().parse::<Op>().unwrap(), op);
            assert_eq!(
                serde_json::to_string(&op).unwrap(),
                format!("\"{}\"", op.name())
            );
        }
        assert!("mmap".parse::<Op>().is_err());
    }

    #[test]
    fn defaults_fit_the_machine() {
        assert_eq!(ShootdownOptions::default_threads(2), vec![1]);
        assert!(ShootdownOptions::default_threads(1).is_empty());
        assert_eq!(
            ShootdownOptions::default_threads(16),
            (1..=15).collect::<Vec<_>>()
        );
        let o = ShootdownOptions::default();
        assert_eq!((o.op, o.pages, o.reps), (Op::Mprotect, 1, 100));
        o.validate().unwrap();
    }
}
