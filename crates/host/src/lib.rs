//! The real host (DESIGN.md, layer `host`): black89's TLB-consistency
//! tester (§5.1) run with real threads on the Linux machine mmulab runs on.
//!
//! - [`run_shootdown`] measures the initiator's latency of `mprotect`,
//!   `munmap` or `madvise(MADV_DONTNEED)` with 0 (the baseline) to N
//!   responder threads, each pinned to its own core and spinning on its own
//!   counter, counts the TLB-shootdown interrupts (/proc/interrupts), and
//!   checks that no stale translation is used after the call returns.
//! - [`fit_points`] fits `intercept + slope · responders` (black89 Fig. 2:
//!   430 µs + 55 µs per processor); [`preset_components`] turns a report
//!   into the numbers of a `host` timing preset.
//! - [`format_report`] prints the table; [`HostReport`] is the `--json`
//!   contract.
//!
//! Libraries never print: everything the user should read comes back in
//! the report (`notes`) or through the [`Progress`] callback. On a
//! non-Linux host the crate builds and `run_shootdown` answers
//! [`HostError::Unsupported`].

pub mod calibration;
pub mod check;
pub mod environment;
pub mod error;
pub mod interrupts;
pub mod options;
pub mod report;
pub mod run;
#[cfg(target_os = "linux")]
pub mod tester;

pub use calibration::{CalibrationFit, CalibrationPoint, HostCalibration, preset_components};
pub use check::Verdict;
pub use environment::{Environment, Fact, Known};
pub use error::HostError;
pub use interrupts::{TlbCounts, parse_tlb_line};
pub use options::{Hooks, Op, ShootdownOptions, parse_thread_list};
pub use report::{
    BLACK89_INTERCEPT_US, BLACK89_SLOPE_US, FitBasis, HostFit, HostReport, LatencyNs, Point,
    RepOutcome, fit_points, format_report,
};
pub use run::{Progress, run_shootdown, run_shootdown_until};

#[cfg(test)]
mod tests {
    #[test]
    fn unsupported_host_message_names_the_os() {
        let e = crate::HostError::Unsupported { os: "macos" };
        let m = e.to_string();
        assert!(m.contains("only on Linux") && m.contains("macos"), "{m}");
    }
}
