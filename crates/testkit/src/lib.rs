//! Test support shared by mmulab's property tests (a dev-dependency only).
//!
//! The fuzzers must show that no input makes a decoder or a parser ask
//! for unbounded memory, so each test binary installs [`Counting`] as its
//! global allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: mmulab_testkit::Counting = mmulab_testkit::Counting;
//! ```
//!
//! and asserts [`assert_memory_bounded`] after each case. The counts are
//! process-wide: every test of that binary, in parallel, adds to them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes live, their peak and the
/// largest single request.
pub struct Counting;

// SAFETY: every call is forwarded unchanged to `System`; only counters
// are updated beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > l.size() {
            let live = LIVE.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
        }
        LARGEST.fetch_max(new, Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(p, l, new) }
    }
}

/// The largest single allocation so far (0 unless [`Counting`] is the
/// global allocator).
pub fn largest_allocation() -> usize {
    LARGEST.load(Ordering::Relaxed)
}

/// The most bytes live at once so far.
pub fn peak_live() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Fails the test if any allocation so far asked for more than
/// `max_allocation` bytes, or more than `max_live` were live at once.
#[track_caller]
pub fn assert_memory_bounded(max_allocation: usize, max_live: usize) {
    let largest = largest_allocation();
    let peak = peak_live();
    // A bound that counts nothing cannot fail: the binary must install
    // the allocator (any test that parses something allocates).
    assert!(
        largest > 0,
        "no allocation counted: install mmulab_testkit::Counting as the #[global_allocator]"
    );
    assert!(
        largest <= max_allocation,
        "an allocation of {largest} bytes (cap {max_allocation})"
    );
    assert!(
        peak <= max_live,
        "{peak} bytes live at once (cap {max_live})"
    );
}

/// Cases per property: `MMULAB_FUZZ_CASES`, or 10,000 (CI's count).
pub fn fuzz_cases() -> u32 {
    std::env::var("MMULAB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}
