//! Clap-free entry points for `mmulab dsm site` and `mmulab dsm bench`.
//! They return text or reports; the binary prints.

use super::bench::{self, BenchError, BenchReport};
use super::config::ClusterConfig;
use super::node::{Node, NodeOptions};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{path}: {message}")]
    Config { path: String, message: String },
    #[error("site: {0}")]
    Io(#[from] std::io::Error),
    #[error("bench: {0}")]
    Bench(#[from] BenchError),
}

/// `mmulab dsm site --config F --name N`: runs the site daemon until
/// `stop` becomes true (the binary sets it on SIGINT/SIGTERM, or never).
/// `log` receives the start-up lines (the fault path in use, the address).
pub fn run_site(
    config: &Path,
    name: &str,
    stop: &AtomicBool,
    log: &mut dyn FnMut(&str),
) -> Result<(), CliError> {
    let text = std::fs::read_to_string(config).map_err(|e| CliError::Config {
        path: config.display().to_string(),
        message: e.to_string(),
    })?;
    let cluster = ClusterConfig::parse(&text).map_err(|e| CliError::Config {
        path: config.display().to_string(),
        message: e.to_string(),
    })?;
    log(&super::fault::probe().describe());
    let node = Node::start(cluster, name, NodeOptions::default())?;
    log(&format!(
        "site {name} ({:?}) listening on {}",
        node.site(),
        node.local_addr()
    ));
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
    node.stop();
    Ok(())
}

/// `mmulab dsm bench [--quick] [--json]`: with `json`, print
/// `report.to_json()` (one object with `remote_fault_ns` {p50, p99},
/// `limit_ns`, `ratio`); otherwise `report.render()`.
pub fn run_bench(quick: bool) -> Result<BenchReport, CliError> {
    Ok(bench::run(quick)?)
}
