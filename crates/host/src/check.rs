//! The consistency check of black89 §5.1, per operation, as pure functions
//! on what the initiator read, so that they are tested without threads.
//!
//! The claim checked is the paper's: *any inconsistent TLB entry caused by
//! an operation is not used after the operation completes*. What a use
//! looks like depends on the operation:
//!
//! - **mprotect (read-write → read-only)** and **munmap**: after the call
//!   returns, no responder may store to the page any more; each one faults
//!   on its next store (SIGSEGV, parked by the tester's handler). The
//!   initiator snapshots the counters right after the call, waits until
//!   every responder has faulted, and reads them again: *no counter may
//!   change* ([`check_frozen`]). For munmap the counters are read through a
//!   second mapping of the same shared-memory frame, which the responders
//!   never touch, so a store through a stale entry of the unmapped address
//!   still shows.
//! - **madvise(MADV_DONTNEED)** on private anonymous memory: the call
//!   drops the frame; the next touch maps a fresh zero-filled one, and the
//!   responders legitimately go on counting there (a minor fault, no
//!   signal). So counters may change; what may not happen is a store that
//!   lands in the old frame. After the call returns the initiator publishes
//!   a new round number; each responder stores it, tagged, in its counter
//!   and then acknowledges. Every acknowledged store must be visible through
//!   the initiator's own (fresh) translation, and the canary words the
//!   initiator wrote before the call must read zero ([`check_fresh_page`]).
//!   A responder still using its stale entry would have written the old
//!   frame: its slot in the new page would not hold the new round.

use serde::{Deserialize, Serialize};

/// The verdict of a point: every repetition consistent, or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Consistent,
    Inconsistent,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Consistent => "consistent",
            Verdict::Inconsistent => "inconsistent",
        }
    }
}

/// A responder's counter word: the round number in the high bits, its own
/// count in the low bits. The round lets the madvise check tell a store made
/// after the operation from one made before.
pub const COUNT_BITS: u32 = 40;

pub fn tag(round: u64, count: u64) -> u64 {
    (round << COUNT_BITS) | (count & ((1 << COUNT_BITS) - 1))
}

pub fn round_of(word: u64) -> u64 {
    word >> COUNT_BITS
}

/// One failed check, in words a user can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub responder: usize,
    pub what: String,
}

/// mprotect/munmap: `after_op` was read right after the call returned,
/// `later` once every responder had faulted (or the fault bound expired).
/// Any difference is a store after the operation completed.
pub fn check_frozen(after_op: &[u64], later: &[u64]) -> Result<(), Violation> {
    assert_eq!(after_op.len(), later.len(), "snapshots of different sizes");
    match after_op.iter().zip(later).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(Violation {
            responder: i,
            what: format!(
                "counter of responder {i} changed from {:#x} to {:#x} after the operation returned",
                after_op[i], later[i]
            ),
        }),
    }
}

/// madvise: `slots` read through the initiator's translation after every
/// responder acknowledged `round` (published after the call returned);
/// `canaries` are the words the initiator set non-zero before the call.
pub fn check_fresh_page(slots: &[u64], round: u64, canaries: &[u64]) -> Result<(), Violation> {
    if let Some(i) = slots.iter().position(|w| round_of(*w) != round) {
        return Err(Violation {
            responder: i,
            what: format!(
                "responder {i} acknowledged round {round} but the page the initiator sees holds {:#x} (round {}): its store went to another frame, through a stale TLB entry",
                slots[i],
                round_of(slots[i])
            ),
        });
    }
    if let Some(p) = canaries.iter().position(|w| *w != 0) {
        return Err(Violation {
            responder: usize::MAX,
            what: format!(
                "page {p} still holds the canary {:#x}: MADV_DONTNEED did not discard it (the page must be zero-filled on the next touch)",
                canaries[p]
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_counters_pass() {
        assert!(check_frozen(&[1, 2, 3], &[1, 2, 3]).is_ok());
        assert!(check_frozen(&[], &[]).is_ok());
    }

    #[test]
    fn a_counter_that_moves_after_the_operation_fires() {
        let v = check_frozen(&[tag(4, 100), tag(4, 7)], &[tag(4, 100), tag(4, 9)]).unwrap_err();
        assert_eq!(v.responder, 1);
        assert!(v.what.contains("responder 1 changed"), "{}", v.what);
    }

    #[test]
    fn fresh_page_with_every_store_visible_passes() {
        let slots = [tag(7, 1), tag(7, 99)];
        assert!(check_fresh_page(&slots, 7, &[0, 0]).is_ok());
    }

    #[test]
    fn a_store_into_the_old_frame_fires() {
        // Responder 1 acknowledged round 7, but the new page shows zero in
        // its slot: it wrote through a stale entry into the dropped frame.
        let v = check_fresh_page(&[tag(7, 1), 0], 7, &[0]).unwrap_err();
        assert_eq!(v.responder, 1);
        assert!(v.what.contains("stale TLB entry"));
        // A pre-operation round in the slot fires too.
        assert!(check_fresh_page(&[tag(6, 5)], 7, &[0]).is_err());
    }

    #[test]
    fn a_page_that_was_not_discarded_fires() {
        let v = check_fresh_page(&[tag(3, 1)], 3, &[0, 0xdead]).unwrap_err();
        assert!(v.what.contains("canary"), "{}", v.what);
    }

    #[test]
    fn tags_round_trip() {
        let w = tag(12345, (1 << COUNT_BITS) + 17);
        assert_eq!(round_of(w), 12345);
        assert_eq!(w & ((1 << COUNT_BITS) - 1), 17);
        assert_eq!(
            serde_json::to_string(&Verdict::Inconsistent).unwrap(),
            "\"inconsistent\""
        );
    }
}
