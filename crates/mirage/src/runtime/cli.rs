//! Clap-free entry points for `mmulab dsm site`, `run`, `status`, `bench`,
//! `keygen` and `proxy`.
//! They return text or reports; the binary prints.

use super::bench::{self, BenchError, BenchReport};
use super::config::ClusterConfig;
use super::local::LocalServer;
use super::node::{Node, NodeOptions};
use super::shm::Dsm;
use crate::core::SiteId;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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
    #[error("{0}")]
    Usage(String),
}

fn load(config: &Path) -> Result<ClusterConfig, CliError> {
    let text = std::fs::read_to_string(config).map_err(|e| CliError::Config {
        path: config.display().to_string(),
        message: e.to_string(),
    })?;
    ClusterConfig::parse(&text).map_err(|e| CliError::Config {
        path: config.display().to_string(),
        message: e.to_string(),
    })
}

/// The site `name`, or the first site of the configuration.
fn pick_site(
    cluster: &ClusterConfig,
    config: &Path,
    name: Option<&str>,
) -> Result<SiteId, CliError> {
    match name {
        None => Ok(SiteId(0)),
        Some(n) => cluster.site_id(n).ok_or_else(|| CliError::Config {
            path: config.display().to_string(),
            message: format!("no site `{n}`"),
        }),
    }
}

/// Set by SIGINT/SIGTERM once `run_site` installed its handler.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: nix::libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
}

fn catch_stop_signals() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        let mut sa: nix::libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_stop_signal as *const () as usize;
        nix::libc::sigemptyset(&mut sa.sa_mask);
        for sig in [nix::libc::SIGINT, nix::libc::SIGTERM] {
            nix::libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// `mmulab dsm site --config F --name N`: runs the site daemon until
/// `stop` becomes true or SIGINT/SIGTERM arrives. `log` receives the
/// start-up lines (the fault path in use, the address, the local socket).
pub fn run_site(
    config: &Path,
    name: &str,
    stop: &AtomicBool,
    log: &mut dyn FnMut(&str),
) -> Result<(), CliError> {
    // The key file too (parse alone does not read it).
    let cluster = ClusterConfig::load(config).map_err(|e| CliError::Config {
        path: config.display().to_string(),
        message: e.to_string(),
    })?;
    let me = pick_site(&cluster, config, Some(name))?;
    let socket = cluster.socket_path(me);
    catch_stop_signals();
    if cluster.insecure {
        log(&format!(
            "warning: {}: insecure = true: no authentication; anyone who can reach {} can read and write this cluster's shared memory (make a key: mmulab dsm keygen -o cluster.key, then key_file = \"cluster.key\")",
            config.display(),
            cluster.sites[me.0 as usize].addr
        ));
    }
    log(&super::fault::probe().describe());
    let node = Node::start(cluster, name, NodeOptions::default())?;
    log(&format!(
        "site {name} ({:?}) listening on {}",
        node.site(),
        node.local_addr()
    ));
    let dsm = Arc::new(Dsm::new(node));
    let server = LocalServer::start(dsm.clone(), &socket)?;
    log(&format!("programs: {}", server.path().display()));
    while !stop.load(Ordering::SeqCst) && !SIGNALLED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop();
    dsm.shutdown();
    log(&format!("site {name} stopped"));
    Ok(())
}

/// `mmulab dsm keygen -o FILE`: a new cluster key (256 random bits, mode
/// 0600; an existing file is never overwritten). Returns the line to print.
pub fn keygen(out: &Path) -> Result<String, CliError> {
    super::key::ClusterKey::generate(out).map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(format!(
        "wrote a new cluster key to {} (mode 0600); name it in cluster.toml: key_file = \"{}\", and copy it to every site over a channel you trust",
        out.display(),
        out.file_name().map_or(out.display().to_string(), |f| f
            .to_string_lossy()
            .into_owned())
    ))
}

/// `mmulab dsm proxy --listen ADDR --to ADDR [--delay MS] [--drop P]
/// [--cut-after BYTES] [--seed S]`: runs the fault-injecting proxy until
/// `stop` (or SIGINT/SIGTERM). `log` gets the start line, with the seed.
pub fn run_proxy(
    listen: std::net::SocketAddr,
    to: std::net::SocketAddr,
    faults: super::proxy::Faults,
    stop: &AtomicBool,
    log: &mut dyn FnMut(&str),
) -> Result<(), CliError> {
    catch_stop_signals();
    let proxy = super::proxy::Proxy::start_on(listen, to, faults)?;
    log(&proxy.describe());
    while !stop.load(Ordering::SeqCst) && !SIGNALLED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = proxy.stats();
    log(&format!(
        "proxy stopped: {} connections, {} bytes forwarded, {} chunks dropped, {} connections cut",
        stats.connections, stats.bytes, stats.dropped_chunks, stats.cuts
    ));
    Ok(())
}

/// Where `libmmulab_shm.so` is: `$MMULAB_SHM_LIB`, else beside the
/// running binary, in its `deps/` (a cargo build), or in `../lib/`.
pub fn find_shim() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MMULAB_SHM_LIB") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join("libmmulab_shm.so"),
        dir.join("deps").join("libmmulab_shm.so"),
        dir.join("../lib").join("libmmulab_shm.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Whether `path` is an ELF executable without an interpreter (statically
/// linked): LD_PRELOAD cannot reach it. `None` if unreadable or not ELF.
pub fn is_static_elf(path: &Path) -> Option<bool> {
    let b = std::fs::read(path).ok()?;
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[32..40].try_into().ok()?) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    let mut interp = false;
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        if o + 4 > b.len() {
            return None;
        }
        if u32::from_le_bytes(b[o..o + 4].try_into().ok()?) == 3 {
            interp = true; // PT_INTERP
        }
    }
    Some(!interp)
}

fn resolve_program(prog: &str) -> Option<PathBuf> {
    if prog.contains('/') {
        return Some(PathBuf::from(prog));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
    })
}

/// `mmulab dsm run [--config F] [--site NAME] -- PROG ARGS`: runs an
/// unmodified program with `libmmulab_shm.so` preloaded and
/// `MMULAB_DSM_SOCKET` naming the site's daemon; returns its exit code
/// (128 + the signal if a signal ended it).
pub fn run_program(
    config: &Path,
    site: Option<&str>,
    argv: &[String],
    log: &mut dyn FnMut(&str),
) -> Result<i32, CliError> {
    let cluster = load(config)?;
    let me = pick_site(&cluster, config, site)?;
    let socket = cluster.socket_path(me);
    let Some(prog) = argv.first() else {
        return Err(CliError::Usage(
            "no program to run (mmulab dsm run -- PROG ARGS)".into(),
        ));
    };
    if !socket.exists() {
        return Err(CliError::Usage(format!(
            "no site daemon at {} (start it: mmulab dsm site --config {} --name {})",
            socket.display(),
            config.display(),
            cluster.name(me)
        )));
    }
    let shim = find_shim().ok_or_else(|| {
        CliError::Usage(
            "libmmulab_shm.so not found beside mmulab (set MMULAB_SHM_LIB, or build the workspace)"
                .into(),
        )
    })?;
    if let Some(path) = resolve_program(prog)
        && is_static_elf(&path) == Some(true)
    {
        log(&format!(
            "warning: {} is statically linked: LD_PRELOAD cannot reach it, so its shmget/shmat use the kernel's own System V segments, not the DSM",
            path.display()
        ));
    }
    // The shim chooses the same way at the program's start-up (same
    // kernel, credentials and `MMULAB_DSM_FAULT_PATH`); with
    // `MMULAB_DSM_VERBOSE` set it prints its own choice too.
    let path = super::fault::probe().path;
    log(&format!(
        "mmulab dsm run: site {}; fault path: {path}",
        cluster.name(me)
    ));
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", shim.display()),
        _ => shim.display().to_string(),
    };
    let status = std::process::Command::new(prog)
        .args(&argv[1..])
        .env("LD_PRELOAD", preload)
        .env(super::local::proto::SOCKET_ENV, &socket)
        .status()
        .map_err(|e| CliError::Usage(format!("{prog}: {e}")))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

/// `mmulab dsm status [--config F] [--site NAME]`: the daemon's view of
/// the sites, its segments and shmids (print it with
/// [`super::status::SiteStatus::render`], or as JSON).
pub fn status(config: &Path, site: Option<&str>) -> Result<super::status::SiteStatus, CliError> {
    let cluster = load(config)?;
    let me = pick_site(&cluster, config, site)?;
    let socket = cluster.socket_path(me);
    super::local::status(&socket, Duration::from_secs(10)).map_err(|e| {
        CliError::Usage(format!(
            "site {} at {}: {e}",
            cluster.name(me),
            socket.display()
        ))
    })
}

/// `mmulab dsm bench [--quick] [--json]`: with `json`, print
/// `report.to_json()` (one object with `remote_fault_ns` {p50, p99},
/// `limit_ns`, `ratio`); otherwise `report.render()`.
pub fn run_bench(quick: bool) -> Result<BenchReport, CliError> {
    Ok(bench::run(quick)?)
}

/// [`run_bench`], stopped early when `stop` is raised (Ctrl-C): see
/// [`bench::run_until`].
pub fn run_bench_until(
    quick: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<BenchReport, bench::BenchError> {
    bench::run_until(quick, Some(stop))
}
