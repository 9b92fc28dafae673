//! Issue #27: unmodified programs see System V shared memory as Linux
//! gives it; issue #23, finding 7: the local socket is the daemon's to
//! protect.
//!
//! `tests/c/sysv_conformance.c` prints one line per observation. Each
//! test here runs it natively on this machine's kernel and under
//! `libmmulab_shm.so` on a two-site cluster, as root (with steps as
//! `nobody` in forked children) and as `nobody` from its first call, and
//! compares the two outputs line by line: every line must agree, and the
//! count is printed. Negative controls show the comparison catches a
//! shim that lets raw system calls through and fleisch89's lifetime rule.
//!
//! These tests switch users and write `/proc/sys/kernel/shm*`, so they
//! need root; without it (or without a C compiler) they say why and pass.
//! One at a time (a lock): the kernel's limits are global. Every wait is
//! bounded.

use mmulab_mirage::core::SiteId;
use mmulab_mirage::runtime::config::{ClusterConfig, FileMode, Semantics};
use mmulab_mirage::runtime::local::{CallerChecks, LocalServer, proto};
use mmulab_mirage::runtime::node::{Node, NodeOptions};
use mmulab_mirage::runtime::shm::Dsm;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const SOURCE: &str = include_str!("c/sysv_conformance.c");

/// One test at a time: native runs change the kernel's global limits.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { nix::libc::geteuid() == 0 }
}

/// A directory every user can read and enter (the programs run as
/// `nobody` too).
fn tmp(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = std::env::temp_dir().join(format!("mirage-sysv-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// The conformance program, compiled into `dir` (None: no compiler).
fn compile(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("sysv_conformance.c");
    std::fs::write(&src, SOURCE).unwrap();
    let out = dir.join("sysv_conformance");
    match Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .output()
    {
        Err(e) => {
            eprintln!("skipped: no C compiler (cc: {e})");
            None
        }
        Ok(o) if !o.status.success() => panic!("cc: {}", String::from_utf8_lossy(&o.stderr)),
        Ok(_) => Some(out),
    }
}

/// Restores `/proc/sys/kernel/shm{max,all,mni}` however a run ends.
struct Sysctls(Vec<(PathBuf, String)>);

impl Sysctls {
    fn save() -> Sysctls {
        Sysctls(
            ["shmmax", "shmall", "shmmni"]
                .iter()
                .map(|f| {
                    let p = Path::new("/proc/sys/kernel").join(f);
                    let v = std::fs::read_to_string(&p).unwrap_or_default();
                    (p, v)
                })
                .collect(),
        )
    }
}

impl Drop for Sysctls {
    fn drop(&mut self) {
        for (p, v) in &self.0 {
            if !v.is_empty() {
                let _ = std::fs::write(p, v);
            }
        }
    }
}

/// Two sites on loopback, each with its local socket (mode 0666, so
/// that `nobody` may connect; each call is still checked).
struct Cluster {
    sites: Vec<Arc<Dsm>>,
    servers: Vec<Option<LocalServer>>,
    shim: PathBuf,
}

impl Cluster {
    fn start(dir: &Path, semantics: Semantics, socket_mode: Option<u32>) -> Cluster {
        Cluster::start_checked(dir, semantics, socket_mode, CallerChecks::PerCall)
    }

    fn start_checked(
        dir: &Path,
        semantics: Semantics,
        socket_mode: Option<u32>,
        checks: CallerChecks,
    ) -> Cluster {
        let la = TcpListener::bind("127.0.0.1:0").unwrap();
        let lb = TcpListener::bind("127.0.0.1:0").unwrap();
        let id = std::process::id() as u64 ^ 0x5359_5356;
        let mut config =
            ClusterConfig::loopback(id, &[la.local_addr().unwrap(), lb.local_addr().unwrap()]);
        config.semantics = semantics;
        config.socket_mode = socket_mode.map(FileMode);
        let mut sites = Vec::new();
        let mut servers = Vec::new();
        for (i, l) in [la, lb].into_iter().enumerate() {
            let node = Node::start_with_listener(
                config.clone(),
                SiteId(i as u16),
                l,
                NodeOptions::default(),
            )
            .unwrap();
            let dsm = Arc::new(Dsm::new(node));
            let sock = dir.join(format!("{}.sock", (b'a' + i as u8) as char));
            servers.push(Some(
                LocalServer::start_with(dsm.clone(), &sock, checks).unwrap(),
            ));
            sites.push(dsm);
        }
        let shim = mmulab_mirage::runtime::cli::find_shim()
            .expect("libmmulab_shm.so is built beside the test binary (deps/)");
        Cluster {
            sites,
            servers,
            shim,
        }
    }

    fn socket(&self, site: usize) -> &Path {
        self.servers[site].as_ref().unwrap().path()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            drop(s.take());
        }
        for d in &self.sites {
            d.shutdown();
        }
    }
}

/// Runs `cmd`, killing it past `limit`.
fn run(mut cmd: Command, limit: Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{what} did not finish in {limit:?} (a hang); stdout: {}; stderr: {}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A key base no other run uses at the same time.
fn key_base(salt: u32) -> String {
    ((std::process::id() % 20_000) * 50 + salt * 1000 + 100_000).to_string()
}

/// Where the program runs.
#[derive(Clone, Copy)]
enum Under<'a> {
    Kernel,
    /// The shim, on a site, with extra environment.
    Shim(&'a Cluster, usize, &'a [(&'a str, &'a str)]),
}

fn conformance(
    prog: &Path,
    who: &str,
    keys: &str,
    case: Option<&str>,
    under: Under,
) -> Vec<String> {
    let mut cmd = Command::new(prog);
    cmd.arg(who).arg(keys).args(case);
    if let Under::Shim(c, site, env) = under {
        cmd.env("LD_PRELOAD", &c.shim)
            .env(proto::SOCKET_ENV, c.socket(site));
        for (k, v) in env {
            cmd.env(k, v);
        }
    }
    let what = match under {
        Under::Kernel => format!("sysv_conformance {who} on the kernel"),
        Under::Shim(_, site, env) => {
            format!("sysv_conformance {who} under the shim, site {site}, {env:?}")
        }
    };
    let o = run(cmd, Duration::from_secs(180), &what);
    assert!(
        o.status.success(),
        "{what}: {}; stdout: {}; stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let out: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        out.last().map(String::as_str),
        Some("done"),
        "{what}: {out:?}"
    );
    out
}

/// Lines of `a` and `b` that agree, position by position, and the
/// differences.
fn agreement(a: &[String], b: &[String]) -> (usize, usize, Vec<String>) {
    let total = a.len().max(b.len());
    let mut diffs = Vec::new();
    let mut agree = 0;
    for i in 0..total {
        match (a.get(i), b.get(i)) {
            (Some(x), Some(y)) if x == y => agree += 1,
            (x, y) => diffs.push(format!("kernel {x:?} / shim {y:?}")),
        }
    }
    (agree, total, diffs)
}

fn compare_all(who: &str, site: usize, env: &[(&str, &str)], salt: u32) {
    if !is_root() {
        eprintln!("skipped: needs root (switches to nobody, writes /proc/sys/kernel/shm*)");
        return;
    }
    let _one = serial();
    let _restore = Sysctls::save();
    let dir = tmp(&format!("{who}-{site}-{salt}"));
    let Some(prog) = compile(&dir) else {
        return;
    };
    let keys = key_base(salt);
    let mut native = conformance(&prog, who, &keys, None, Under::Kernel);
    let cluster = Cluster::start(&dir, Semantics::Sysv, Some(0o666));
    let shim = conformance(&prog, who, &keys, None, Under::Shim(&cluster, site, env));
    let (mut agree, mut total, mut diffs) = agreement(&native, &shim);
    if !diffs.is_empty() {
        // The kernel's counters (ids in use, pages) are shared with every
        // process on this machine: one more native run, in case another
        // created a segment meanwhile. The shim's run is not repeated.
        eprintln!(
            "first native run differs ({} lines); once more",
            diffs.len()
        );
        native = conformance(&prog, who, &keys, None, Under::Kernel);
        (agree, total, diffs) = agreement(&native, &shim);
    }
    eprintln!(
        "conformance as {who} on site {site} {env:?}: {agree} of {total} comparisons agree with the kernel"
    );
    assert!(
        diffs.is_empty(),
        "{} differ:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every observation as root (with `nobody` steps in forked children),
/// on the library and key-directory site, on the best fault path.
#[test]
fn as_root_every_observation_matches_the_kernel() {
    compare_all("root", 0, &[], 1);
}

/// The same from the other site (keys through the remote directory), on
/// the mprotect + SIGSEGV fault path.
#[test]
fn as_root_on_the_second_site_and_the_mprotect_path_every_observation_matches_the_kernel() {
    compare_all("root", 1, &[(proto::FAULT_PATH_ENV, "mprotect")], 2);
}

/// Every observation as `nobody`, from its first System V call.
#[test]
fn as_nobody_every_observation_matches_the_kernel() {
    compare_all("user", 0, &[], 3);
}

#[test]
fn as_nobody_on_the_mprotect_path_every_observation_matches_the_kernel() {
    compare_all("user", 1, &[(proto::FAULT_PATH_ENV, "mprotect")], 4);
}

/// Negative controls: the comparison catches raw system calls that reach
/// the kernel (the seccomp trap switched off), calls checked against the
/// connector's credentials instead of the caller's at the time of the
/// call (as before issue #27), and fleisch89's rule, in which the last
/// detach destroys a segment (`semantics = "mirage"`).
#[test]
fn the_comparison_catches_untrapped_raw_calls_and_fleischs_lifetime_rule() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let _one = serial();
    let _restore = Sysctls::save();
    let dir = tmp("negative");
    let Some(prog) = compile(&dir) else {
        return;
    };
    let keys = key_base(5);
    let native = conformance(&prog, "root", &keys, Some("raw"), Under::Kernel);
    {
        let sysv = Cluster::start(&dir, Semantics::Sysv, Some(0o666));
        let off = [("MMULAB_DSM_SECCOMP", "off")];
        let shim = conformance(
            &prog,
            "root",
            &keys,
            Some("raw"),
            Under::Shim(&sysv, 0, &off),
        );
        let (_, _, diffs) = agreement(&native, &shim);
        assert!(
            diffs.iter().any(|d| d.contains("libc-stat-of-raw")),
            "raw calls that reach the kernel go unnoticed: {diffs:?}"
        );
    }
    let native = conformance(&prog, "root", &keys, Some("creds"), Under::Kernel);
    {
        let broken = Cluster::start_checked(
            &dir,
            Semantics::Sysv,
            Some(0o666),
            CallerChecks::ConnectorOnly,
        );
        let shim = conformance(
            &prog,
            "root",
            &keys,
            Some("creds"),
            Under::Shim(&broken, 0, &[]),
        );
        let (_, _, diffs) = agreement(&native, &shim);
        for line in ["creds-child/shmat-as-nobody", "creds/shmat-as-euid-nobody"] {
            assert!(
                diffs.iter().any(|d| d.contains(line)),
                "{line}: connection-time credentials went unnoticed: {diffs:?}"
            );
        }
    }
    let native = conformance(&prog, "root", &keys, Some("ids"), Under::Kernel);
    let mirage = Cluster::start(&dir, Semantics::Mirage, Some(0o666));
    let shim = conformance(
        &prog,
        "root",
        &keys,
        Some("ids"),
        Under::Shim(&mirage, 0, &[]),
    );
    let (_, _, diffs) = agreement(&native, &shim);
    let lifetime = [
        "stat-live-unattached",
        "get-live-by-key",
        "reattach-live",
        "kept",
    ];
    assert!(
        diffs.iter().any(|d| lifetime.iter().any(|l| d.contains(l))),
        "fleisch89's rule went unnoticed: {diffs:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

const MIRAGE_C: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <sys/shm.h>
#include <unistd.h>
int main(void) {
    int id = shmget(IPC_PRIVATE, 4096, 0600);
    int *p = shmat(id, NULL, 0);
    p[0] = 42;
    shmdt(p);
    struct shmid_ds ds;
    /* Under fleisch89's rule the destruction is a message to the
     * library: wait for it (bounded). */
    int r = 0;
    for (int i = 0; i < 200; i++) {
        errno = 0;
        r = shmctl(id, IPC_STAT, &ds);
        if (r != 0) break;
        usleep(10000);
    }
    printf("stat after the last detach: %d errno %d\n", r, errno);
    p = shmat(id, NULL, 0);
    printf("reattach: %s\n", p == (void *)-1 ? "failed" : (p[0] == 42 ? "kept" : "lost"));
    return 0;
}
"#;

/// The two semantics side by side: under `sysv` the last detach keeps a
/// segment that was not removed (and its data); under `mirage`
/// (fleisch89 §2.2) it destroys it, and the id is free again.
#[test]
fn sysv_keeps_a_detached_segment_and_mirage_destroys_it_at_the_last_detach() {
    let _one = serial();
    let dir = tmp("semantics");
    let src = dir.join("m.c");
    std::fs::write(&src, MIRAGE_C).unwrap();
    let prog = dir.join("m");
    match Command::new("cc").arg("-o").arg(&prog).arg(&src).output() {
        Err(e) => {
            eprintln!("skipped: no C compiler ({e})");
            return;
        }
        Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
    }
    for (semantics, want) in [
        (
            Semantics::Sysv,
            ["stat after the last detach: 0 errno 0", "reattach: kept"],
        ),
        (
            Semantics::Mirage,
            [
                "stat after the last detach: -1 errno 22",
                "reattach: failed",
            ],
        ),
    ] {
        let c = Cluster::start(&dir, semantics, None);
        let mut cmd = Command::new(&prog);
        cmd.env("LD_PRELOAD", &c.shim)
            .env(proto::SOCKET_ENV, c.socket(1));
        let o = run(cmd, Duration::from_secs(30), "semantics");
        let out = String::from_utf8_lossy(&o.stdout);
        for w in want {
            assert!(out.contains(w), "{semantics:?}: want {w:?}; got {out}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// Issue #23, finding 7: the local socket is the daemon's to protect.

const GET_C: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/shm.h>
int main(void) {
    int id = shmget(IPC_PRIVATE, 4096, 0600);
    if (id < 0) { printf("shmget: %s\n", strerror(errno)); return 1; }
    printf("shmget: ok\n");
    shmctl(id, IPC_RMID, NULL);
    return 0;
}
"#;

fn compile_get(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("get.c");
    std::fs::write(&src, GET_C).unwrap();
    let prog = dir.join("get");
    match Command::new("cc").arg("-o").arg(&prog).arg(&src).output() {
        Err(e) => {
            eprintln!("skipped: no C compiler ({e})");
            None
        }
        Ok(o) => {
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            Some(prog)
        }
    }
}

/// Runs `prog` under the shim on site 0 as `nobody` (uid and gid 65534).
fn get_as_nobody(c: &Cluster, prog: &Path) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(prog);
    cmd.env("LD_PRELOAD", &c.shim)
        .env(proto::SOCKET_ENV, c.socket(0))
        .uid(65534)
        .gid(65534);
    run(cmd, Duration::from_secs(60), "get as nobody")
}

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The socket is 0600 by default, whatever the umask (finding 7 was
/// reproduced under umask 000): another user cannot reach the daemon.
/// With `socket_mode = 0666` it can, and each call is still checked
/// (the conformance tests run as nobody that way).
#[test]
fn the_socket_is_0600_whatever_the_umask_and_0666_admits_every_user() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let _one = serial();
    let dir = tmp("umask");
    let Some(prog) = compile_get(&dir) else {
        return;
    };
    // SAFETY: umask is process-wide; the serial lock keeps this binary's
    // other tests out meanwhile, and it is restored below.
    let old = unsafe { nix::libc::umask(0) };
    let c = Cluster::start(&dir, Semantics::Sysv, None);
    // SAFETY: as above.
    unsafe { nix::libc::umask(old) };
    assert_eq!(mode_of(c.socket(0)), 0o600);
    let o = get_as_nobody(&c, &prog);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "nobody reached a 0600 socket");
    assert!(err.contains("Permission denied"), "{err}");
    drop(c);
    let c = Cluster::start(&dir, Semantics::Sysv, Some(0o666));
    assert_eq!(mode_of(c.socket(0)), 0o666);
    let o = get_as_nobody(&c, &prog);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `group`: the socket is 0660 and in that group, and a member may
/// connect; a peer the mode does not admit (the file was made 0666
/// behind the daemon's back) is closed at once, unserved.
#[test]
fn a_group_socket_admits_its_members_and_a_peer_the_mode_refuses_is_closed() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let _one = serial();
    let dir = tmp("group");
    let Some(prog) = compile_get(&dir) else {
        return;
    };
    let la = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config = ClusterConfig::loopback(
        std::process::id() as u64 ^ 0x4752,
        &[la.local_addr().unwrap()],
    );
    config.group = Some("65534".into());
    let node = Node::start_with_listener(config, SiteId(0), la, NodeOptions::default()).unwrap();
    let dsm = Arc::new(Dsm::new(node));
    let path = dir.join("g.sock");
    let server = LocalServer::start(dsm.clone(), &path).unwrap();
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(&path).unwrap();
    assert_eq!((mode_of(&path), m.gid()), (0o660, 65534));
    let c = Cluster {
        sites: vec![dsm.clone()],
        servers: vec![Some(server)],
        shim: mmulab_mirage::runtime::cli::find_shim().unwrap(),
    };
    let o = get_as_nobody(&c, &prog);
    assert!(
        o.status.success(),
        "a member of the socket's group: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    drop(c);
    // Default 0600, then opened up behind the daemon's back.
    let c = Cluster::start(&dir, Semantics::Sysv, None);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(c.socket(0), std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = get_as_nobody(&c, &prog);
    assert!(
        !o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("shmget: ok"),
        "a peer socket_mode does not admit was served"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file at the socket path that is not a socket stops the start and is
/// left as it was (finding 7: it was deleted); a socket no daemon
/// listens on is replaced; a live one is refused.
#[test]
fn the_daemon_never_deletes_a_file_at_its_socket_path() {
    let _one = serial();
    let dir = tmp("path");
    let path = dir.join("x.sock");
    std::fs::write(&path, "precious\n").unwrap();
    let la = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ClusterConfig::loopback(
        std::process::id() as u64 ^ 0x5041,
        &[la.local_addr().unwrap()],
    );
    let node = Node::start_with_listener(config, SiteId(0), la, NodeOptions::default()).unwrap();
    let dsm = Arc::new(Dsm::new(node));
    let e = LocalServer::start(dsm.clone(), &path)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("is not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious\n");
    // A socket left by a crash (nothing listens): replaced.
    std::fs::remove_file(&path).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let server = LocalServer::start(dsm.clone(), &path).unwrap();
    // A live one: refused, and left alone.
    let e = LocalServer::start(dsm.clone(), &path)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("another site daemon"), "{e}");
    assert!(path.exists());
    drop(server);
    assert!(
        !path.exists(),
        "the daemon removes its own socket at its stop"
    );
    // What replaced its socket meanwhile is not its own: it stays.
    let server = LocalServer::start(dsm.clone(), &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, "mine\n").unwrap();
    drop(server);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "mine\n");
    dsm.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
