//! The real runtime (issue #7): the same sans-IO core as the simulator,
//! driven by std threads, blocking TCP and real page faults.
//!
//! - [`config`] — the `cluster.toml` file.
//! - [`node`] — the site daemon: start, stop, its options and counters.
//! - [`key`] — the cluster key (`mmulab dsm keygen`, the key file's checks).
//! - [`listener`] — accepting peers, bounded (issue #23, findings 4, 5).
//! - [`handshake`] — Noise under the cluster key, then the hellos
//!   (issue #23, findings 1-3).
//! - [`peer`] — per-peer I/O: inbound readers, outgoing senders.
//! - [`core_loop`] — the core thread and the dispatch of every input.
//! - [`fault_paths`] — faults in, failures out (lost pages, dead peers).
//! - [`directory`] — the System V key directory on the first site.
//! - [`proxy`] — `mmulab dsm proxy`: delay, loss and cuts between sites.
//! - [`history`] — per-page sequential consistency of a fault test's history.
//! - [`mem`] — one memfd per segment, a service mapping and attach mappings.
//! - [`fault`] — typed faults by mprotect + SIGSEGV; the path choice and probe.
//! - [`uffd`] — typed faults by userfaultfd (missing + write-protect).
//! - [`local`] — the local socket for programs using `libmmulab_shm.so`.
//! - [`shm`] — the System V API (`shmget`/`shmat`/`shmdt`/`shmctl`), per caller.
//! - [`sysv`] — Linux's rules it follows: ids, permissions, limits, `SHM_HUGETLB`.
//! - [`creds`] — who is calling: a request's credentials, as the kernel checks them.
//! - [`bench`](mod@bench) — remote-fault latency beside the loopback limit.
//! - [`spin`] — the fault path's threads poll briefly before they sleep.
//! - [`sweep`] — the bench's Δ sweeps, one process per site, each pinned to a core.
//! - [`cli`] — clap-free entry points for `mmulab dsm site` and `mmulab dsm bench`.
//!
//! The wire format lives in [`crate::wire`].

pub mod bench;
pub mod cli;
pub mod config;
pub(crate) mod core_loop;
pub mod creds;
pub(crate) mod directory;
pub mod fault;
pub(crate) mod fault_paths;
pub mod handshake;
pub mod history;
pub mod key;
pub mod listener;
pub mod local;
/// The shim's local protocol, one file shared with `crates/mirage-shim`.
#[path = "../../../mirage-shim/src/proto.rs"]
pub mod local_proto;
pub mod mem;
pub mod node;
pub(crate) mod peer;
pub mod proxy;
pub mod shm;
pub(crate) mod spin;
pub mod status;
pub mod sweep;
pub mod sysv;
pub mod uffd;

pub use config::ClusterConfig;
pub use node::{Node, NodeOptions, TraceEntry};
pub use shm::{ShmCtl, ShmError, ShmStat};

/// The MMU page size: DSM pages are hardware pages (§6).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { nix::libc::sysconf(nix::libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}
