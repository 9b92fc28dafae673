//! Host prefetch hints, shared by every layer's hot path (TLBs, the
//! oracle, physical memory, the caches). A hint changes nothing the
//! simulation can observe, so results stay byte-identical with or
//! without it.

/// Asks the host to bring `r`'s cache line closer: a hint only, it changes
/// nothing the program can observe.
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    prefetch_ptr(r as *const T);
}

/// As [`prefetch`], for an address that need not be valid (a prefetch
/// never faults), so that callers skip bounds checks: the hint is
/// wasted, never wrong, if the address is off.
#[inline(always)]
pub fn prefetch_ptr<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees;
    // SSE is part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
