//! Mirage DSM (fleisch89, Fleisch & Popek, UCLA CSD-890020, 1989).
//!
//! - [`core`]: the coherence protocol, written once as a sans-IO state machine.
//! - [`oracle`]: the DSM oracle (page versions, single writer / multiple readers, Δ).
//! - [`sim`]: the simulated driver (scheduler, interrupts, network costs) and
//!   the `vax-locus-1989` preset.
//! - [`reproduce`]: the paper's Table 3, §7.2, Figs. 7 and 8, from the specs in
//!   `experiments/fleisch89/`.
//! - [`cli`]: a clap-free entry point for the `mmulab` binary.
//! - [`swarm`]: the seed-swarm driver of the property tests (random
//!   interleavings, per-pair message delays, the oracle after every event).
//! - [`wire`]: the real runtime's frames and handshake (issue #7).
//! - [`runtime`]: the real runtime: site daemon over blocking TCP, memfd
//!   segments, typed faults by mprotect + SIGSEGV, the System V-style API,
//!   the remote-fault bench and the clap-free `mmulab dsm` entry points.
//!
//! # Design decisions the issue asked to document
//!
//! - **Queue granularity**: per page. While the library waits out one
//!   page's Δ, requests for other pages of the segment proceed; requests for
//!   the same page wait in arrival order. Reads at the head of a page's
//!   queue are granted as one batch, and reads that queue while a read
//!   recall waits out Δ join that batch (`core/library.rs`).
//! - **Clock site**: the writer; when readers are added to a written page,
//!   the downgraded writer; for a read set served from a checked-in page,
//!   the earliest requester. It never moves while readers join, and is told
//!   of each new reader (`core/holder.rs`). The read set's Δ runs from the
//!   clock site's install time, and a downgrade restarts it: the read set
//!   the downgraded writer now heads is granted the page then, and §6.1
//!   guarantees its readers the page for Δ (docs/papers/fleisch89.md,
//!   "rule 1"). A sole reader upgrading its own copy is not clock-checked:
//!   nobody's Δ is cut short.
//! - **Ticks**: Δ and the quantum are counted in 1/60 s ticks, an inference
//!   that fits every number of the paper (`sim/preset.rs`). The clock check
//!   counts whole ticks of real time since the install; a refusal carries
//!   the ticks left and the library sleeps that long (so at Δ=2 a refusal
//!   within the first tick sleeps two ticks, §7.3's "sleeps of 33 msecs").
//! - **Detach**: a site's last process detaching drops its plain read
//!   copies at once; the library then releases the site page by page
//!   through the page queues: a write copy, or the clock copy of a read set
//!   (whose other readers the clock site invalidates), is checked back in
//!   without a Δ check; a plain reader is taken out of the masks (library
//!   and clock site). The last detach of the segment destroys it, and every
//!   site of the network is told.
//! - **Page bytes**: the core keeps each held page's bytes (`Site::read`,
//!   `Site::write`). A real runtime maps that buffer, or copies its memory
//!   into it before handing the core an event that may ship the page. The
//!   runtime (`runtime::node`) does the latter: before any event naming a
//!   page held for writing here, it write-protects the page in every local
//!   mapping and copies it into the core; the core needed no change for it
//!   (one read-only accessor, `Site::library_pages`, was added).

pub mod cli;
pub mod core;
pub mod oracle;
pub mod reproduce;
pub mod runs;
pub mod runtime;
pub mod sim;
pub mod spec;
pub mod swarm;
pub mod wire;

pub use reproduce::reproduce;

/// Errors of spec loading and reproduction.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{file}: {message}")]
    Spec { file: String, message: String },
    #[error("{file}: key `{key}`: {message}")]
    Invalid {
        file: String,
        key: String,
        message: String,
    },
    #[error("{path}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// A simulated run passed its event bound (a protocol livelock).
    #[error("liveness: {0}")]
    Liveness(String),
    #[error("plot: {0}")]
    Plot(String),
}
