//! The errors of the host tester. Each message says what happened and what
//! to do about it; conditions the run can work around (more threads than
//! cores, no `TLB` line in /proc/interrupts) are notes in the report instead.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The tester needs Linux: its TLB shootdowns, /proc/interrupts and
    /// sched_setaffinity.
    #[error(
        "`mmulab host` measures Linux TLB shootdowns and runs only on Linux; this host is {os:?}"
    )]
    Unsupported { os: &'static str },

    #[error("invalid options: {0}")]
    InvalidOptions(String),

    /// Ctrl-C stopped the run before its baseline was measured: there is
    /// nothing to report.
    #[error("stopped by Ctrl-C before the baseline (0 responders) was measured")]
    Interrupted,

    /// A system call failed.
    #[error("{call} failed: {source}")]
    Sys {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// A responder did not run within the bound: its core is busy with other
    /// work, or (under a hypervisor) its vCPU is not being scheduled.
    #[error(
        "responder {child} on CPU {cpu} did not {what} within {waited:?}: is that core busy with other work, or its vCPU preempted? Try fewer threads or a quieter machine"
    )]
    ResponderStalled {
        child: usize,
        cpu: usize,
        what: &'static str,
        waited: Duration,
    },

    /// A responder could not be pinned to its core.
    #[error("could not pin responder {child} to CPU {cpu}: {why}")]
    Pin {
        child: usize,
        cpu: usize,
        why: String,
    },

    /// The memory of the tester could not be restored after an operation
    /// (for munmap: something else was mapped into the hole). The parked
    /// responders are abandoned (they sleep until the process exits).
    #[error("could not restore the tester's mapping after {op}: {why}")]
    Rearm { op: &'static str, why: String },
}

impl HostError {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn sys(call: &'static str, e: impl Into<std::io::Error>) -> HostError {
        HostError::Sys {
            call,
            source: e.into(),
        }
    }
}
