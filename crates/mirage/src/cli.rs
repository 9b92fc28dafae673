//! A clap-free entry point for the `mmulab` binary: it returns text, the
//! binary prints it. `mmulab reproduce fleisch89 [--out DIR] [--quick]`.

/// What `mmulab reproduce fleisch89` prints after its table: the
/// ping-pong's per-cycle message timeline.
pub fn reproduce_epilogue() -> String {
    crate::reproduce::pingpong_timeline(0)
}
