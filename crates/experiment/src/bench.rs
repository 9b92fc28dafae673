//! The fixed speed workloads of `mmulab bench` and `cargo bench -p
//! mmulab-experiment`: the foundation's (flat memory, protocol `global`)
//! and the same workload on romanescu10's machine (caches, directory,
//! PCAMs, Jetty and the MOSI checker, protocol `unitd`). The sweep's
//! stride is the workload's `stride_bytes` (default one word).

/// What both share: the foundation issue's "Speed" workload.
const WORKLOAD: &str = r#"seed = 1
[machine]
cpus = 16
memory_mb = 256
[workload]
kind = "bench"
threads = 16
private_pages = 256
shared_pages = 64
mprotect_every = 100000
"#;

/// The foundation issue's workload, as a spec: flat memory, `global`.
pub fn foundation_spec() -> String {
    format!("protocol = \"global\"\n{WORKLOAD}")
}

/// The romanescu10 issue's "Speed" workload: the foundation's on preset
/// `x86-simics-2010`, protocol `unitd`.
pub fn unitd_spec() -> String {
    format!("protocol = \"unitd\"\npreset = \"x86-simics-2010\"\n{WORKLOAD}")
}
