//! `libmmulab_shm.so` under real, unmodified C programs: two sites in this
//! test process (each with its local socket), the programs in their own
//! processes with the shim preloaded, as `mmulab dsm run` starts them.
//!
//! Every test compiles its C program with `cc`; without a C compiler it
//! prints why and passes. Every wait is bounded.

use mmulab_mirage::runtime::bench::two_sites;
use mmulab_mirage::runtime::local::{LocalServer, proto};
use mmulab_mirage::runtime::node::NodeOptions;
use mmulab_mirage::runtime::shm::Dsm;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mirage-shim-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles `examples/c/<src>` (or C text) into `dir`; `None` (with the
/// reason printed) when there is no C compiler.
fn cc(dir: &Path, name: &str, source: &str, extra: &[&str]) -> Option<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let include = repo().join("examples/c");
    match Command::new("cc")
        .arg("-O1")
        .arg("-I")
        .arg(&include)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(extra)
        .output()
    {
        Err(e) => {
            eprintln!("skipped: no C compiler (cc: {e})");
            None
        }
        Ok(o) if !o.status.success() => {
            panic!("cc failed: {}", String::from_utf8_lossy(&o.stderr))
        }
        Ok(_) => Some(out),
    }
}

struct Cluster {
    a: Arc<Dsm>,
    b: Arc<Dsm>,
    sa: Option<LocalServer>,
    sb: Option<LocalServer>,
    shim: PathBuf,
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        let (a, b) = two_sites(NodeOptions::default()).unwrap();
        let (a, b) = (Arc::new(a), Arc::new(b));
        let sa = LocalServer::start(a.clone(), &dir.join("a.sock")).unwrap();
        let sb = LocalServer::start(b.clone(), &dir.join("b.sock")).unwrap();
        let shim = mmulab_mirage::runtime::cli::find_shim()
            .expect("libmmulab_shm.so is built beside the test binary (deps/)");
        Cluster {
            a,
            b,
            sa: Some(sa),
            sb: Some(sb),
            shim,
        }
    }

    /// Starts `prog args` on a site as `mmulab dsm run` does, the shim
    /// on fault path `path` (reported on its stderr).
    fn spawn(&self, site: &str, prog: &Path, args: &[&str], path: ShimPath) -> Child {
        let server = if site == "a" { &self.sa } else { &self.sb };
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .env("LD_PRELOAD", &self.shim)
            .env(proto::SOCKET_ENV, server.as_ref().unwrap().path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        path.set(&mut cmd);
        cmd.spawn().unwrap()
    }

    /// Faults the daemons read from programs' userfaultfds.
    fn program_uffd_faults(&self) -> u64 {
        [&self.a, &self.b]
            .iter()
            .map(|d| {
                d.node()
                    .counters()
                    .program_uffd_faults
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .sum()
    }
}

/// The fault path a program under the shim is started with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ShimPath {
    /// `MMULAB_DSM_FAULT_PATH` unset: the best the kernel offers.
    Best,
    /// `MMULAB_DSM_FAULT_PATH=mprotect`.
    Mprotect,
    /// `MMULAB_DSM_FAULT_PATH=uffd-user` (`UFFD_USER_MODE_ONLY`, what an
    /// unprivileged process gets with `vm.unprivileged_userfaultfd = 0`).
    UffdUser,
}

impl ShimPath {
    fn set(self, cmd: &mut Command) {
        cmd.env(proto::VERBOSE_ENV, "1");
        match self {
            ShimPath::Best => cmd.env_remove(proto::FAULT_PATH_ENV),
            ShimPath::Mprotect => cmd.env(proto::FAULT_PATH_ENV, "mprotect"),
            ShimPath::UffdUser => cmd.env(proto::FAULT_PATH_ENV, "uffd-user"),
        };
    }

    /// The path the shim must report: what this kernel offers this test
    /// process (a child of it has the same credentials).
    fn expected(self) -> &'static str {
        use mmulab_mirage::runtime::fault::{
            FaultPath, PATH_MPROTECT, PATH_UFFD, PATH_UFFD_USER, open_path,
        };
        let user = || open_path(FaultPath::UffdUserModeOnly).is_some();
        match self {
            ShimPath::Mprotect => PATH_MPROTECT,
            ShimPath::UffdUser if user() => PATH_UFFD_USER,
            ShimPath::UffdUser => PATH_MPROTECT,
            ShimPath::Best if open_path(FaultPath::Uffd).is_some() => PATH_UFFD,
            ShimPath::Best if user() => PATH_UFFD_USER,
            ShimPath::Best => PATH_MPROTECT,
        }
    }

    fn is_uffd(self) -> bool {
        self.expected() != mmulab_mirage::runtime::fault::PATH_MPROTECT
    }

    /// Checks that a program reported exactly this path, once.
    fn check(self, o: &Output) {
        let err = String::from_utf8_lossy(&o.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("fault path: ")).collect();
        let want = format!("fault path: {}", self.expected());
        assert!(
            lines.len() == 1 && lines[0].ends_with(&want),
            "want one `{want}` line; stderr: {err}"
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        drop(self.sa.take());
        drop(self.sb.take());
        self.a.shutdown();
        self.b.shutdown();
    }
}

/// Waits for a child, killing it past the deadline.
fn finish(mut child: Child, deadline: Instant, what: &str) -> Output {
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{what} did not finish in time; stdout {} stderr {}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {}; stdout: {}; stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// fleisch89 Fig. 4 in C, unmodified System V calls, two processes on two
/// sites: every pair is seen whole on both sides (no stale read), and
/// both finish.
fn fig4_ping_pong(path: ShimPath) {
    let dir = tmp(&format!("fig4-{path:?}"));
    let source = std::fs::read_to_string(repo().join("examples/c/pingpong.c")).unwrap();
    let Some(prog) = cc(&dir, "pingpong", &source, &[]) else {
        return;
    };
    let cluster = Cluster::start(&dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    let p1 = cluster.spawn("a", &prog, &["1", "150"], path);
    let p2 = cluster.spawn("b", &prog, &["2", "150"], path);
    let o1 = finish(p1, deadline, "site 1's program");
    let o2 = finish(p2, deadline, "site 2's program");
    assert!(o1.status.success(), "{}", text(&o1));
    assert!(o2.status.success(), "{}", text(&o2));
    path.check(&o1);
    path.check(&o2);
    // The faults came through the path reported.
    let through_uffd = cluster.program_uffd_faults();
    if path.is_uffd() {
        assert!(through_uffd > 100, "{through_uffd} faults via userfaultfd");
    } else {
        assert_eq!(through_uffd, 0);
    }
    let out1 = String::from_utf8_lossy(&o1.stdout);
    assert!(
        out1.contains("150 cycles") && out1.contains("0 bad pairs"),
        "{out1}"
    );
    let out2 = String::from_utf8_lossy(&o2.stdout);
    assert!(
        out2.contains("150 cycles") && out2.contains("0 bad pairs"),
        "{out2}"
    );
    // Faults went through both daemons (the page moved between sites).
    assert!(
        cluster
            .a
            .node()
            .counters()
            .faults
            .load(std::sync::atomic::Ordering::Relaxed)
            > 100
    );
    assert!(
        cluster
            .b
            .node()
            .counters()
            .faults
            .load(std::sync::atomic::Ordering::Relaxed)
            > 100
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// fleisch89 Fig. 4 with the programs' faults caught by their own
/// userfaultfd, served by the daemons (when the kernel offers it; the
/// path reported is checked either way).
#[test]
fn fig4_ping_pong_in_c_through_the_shim_on_the_best_path() {
    fig4_ping_pong(ShimPath::Best);
}

/// The same on the mprotect + SIGSEGV fallback.
#[test]
fn fig4_ping_pong_in_c_through_the_shim_on_the_mprotect_path() {
    fig4_ping_pong(ShimPath::Mprotect);
}

const SEMANTICS_C: &str = r#"
#include "mmulab_dsm.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL line %d: %s (errno %d)\n", __LINE__, #c, errno); return 1; } } while (0)
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "rdonly-write") == 0) {
        int id = shmget(777, 4096, IPC_CREAT | 0600);
        CHECK(id >= 0);
        volatile int *p = shmat(id, NULL, SHM_RDONLY);
        CHECK(p != (void *)-1);
        printf("read %d\n", p[0]);
        fflush(stdout);
        p[0] = 1; /* a write through SHM_RDONLY: SIGSEGV */
        printf("wrote\n");
        return 0;
    }
    int id = shmget(4711, 8192, IPC_CREAT | IPC_EXCL | 0600);
    CHECK(id >= 0);
    CHECK(shmget(4711, 8192, IPC_CREAT | IPC_EXCL | 0600) == -1 && errno == EEXIST);
    CHECK(shmget(4712, 4096, 0600) == -1 && errno == ENOENT);
    volatile int *p = shmat(id, NULL, 0);
    CHECK(p != (void *)-1);
    p[0] = 42;
    p[1024] = 43;
    volatile int *q = shmat(id, NULL, 0);
    CHECK(q != (void *)-1 && q != p);
    CHECK(q[0] == 42 && q[1024] == 43);
    struct shmid_ds ds;
    CHECK(shmctl(id, IPC_STAT, &ds) == 0);
    CHECK(ds.shm_nattch == 2 && ds.shm_segsz == 8192);
    CHECK((ds.shm_perm.mode & 0777) == 0600 && ds.shm_perm.__key == 4711);
    ds.shm_perm.mode = 0400;
    CHECK(shmctl(id, IPC_SET, &ds) == 0);
    if (geteuid() == 0) {
        /* CAP_IPC_OWNER overrides the mode, as on Linux. */
        void *w = shmat(id, NULL, 0);
        CHECK(w != (void *)-1 && shmdt(w) == 0);
    } else {
        CHECK(shmat(id, NULL, 0) == (void *)-1 && errno == EACCES);
    }
    volatile int *r = shmat(id, NULL, SHM_RDONLY);
    CHECK(r != (void *)-1 && r[1024] == 43);
    CHECK(mmulab_set_delta(id, 2) == 0);
    /* A given address is honoured. */
    CHECK(shmdt((const void *)q) == 0);
    volatile int *g = shmat(id, (const void *)q, SHM_RDONLY);
    CHECK(g == q && g[0] == 42);
    /* IPC_RMID: the key goes at once, attached memory stays. */
    CHECK(shmctl(id, IPC_RMID, NULL) == 0);
    CHECK(shmget(4711, 4096, 0600) == -1 && errno == ENOENT);
    CHECK(p[0] == 42);
    p[1] = 7;
    CHECK(g[1] == 7 && r[1] == 7);
    CHECK(shmdt((const void *)p) == 0 && shmdt((const void *)r) == 0 && shmdt((const void *)g) == 0);
    CHECK(shmdt((const void *)g) == -1 && errno == EINVAL);
    /* Removed, then detached everywhere: the id is gone (System V). */
    CHECK(shmat(id, NULL, 0) == (void *)-1 && errno == EINVAL);
    int priv = shmget(IPC_PRIVATE, 100, 0600);
    CHECK(priv >= 0 && priv != id);
    volatile char *c = shmat(priv, NULL, 0);
    CHECK(c != (void *)-1);
    c[99] = 'x';
    CHECK(c[99] == 'x' && c[0] == 0);
    CHECK(shmdt((const void *)c) == 0);
    printf("semantics ok\n");
    return 0;
}
"#;

fn shim_dir(c: &Cluster) -> String {
    c.shim.parent().unwrap().display().to_string()
}

/// System V semantics from C, through the shim and the explicit C API of
/// `mmulab_dsm.h` (`mmulab_set_delta`): create/exclusive, ENOENT, two
/// attaches sharing one copy, IPC_STAT's nattch/size/mode/key, IPC_SET,
/// EACCES (or root's CAP_IPC_OWNER), SHM_RDONLY, a given address,
/// IPC_RMID, EINVAL once removed and detached, IPC_PRIVATE.
fn system_v_semantics(path: ShimPath) {
    let dir = tmp(&format!("semantics-{path:?}"));
    let (cluster, prog);
    {
        let c = Cluster::start(&dir);
        let lib = shim_dir(&c);
        let Some(p) = cc(
            &dir,
            "semantics",
            SEMANTICS_C,
            &[
                &format!("-L{lib}"),
                &format!("-Wl,-rpath,{lib}"),
                "-lmmulab_shm",
            ],
        ) else {
            return;
        };
        (cluster, prog) = (c, p);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let o = finish(cluster.spawn("b", &prog, &[], path), deadline, "semantics");
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("semantics ok"));
    path.check(&o);
    assert_eq!(cluster.program_uffd_faults() > 0, path.is_uffd());
    // A write through SHM_RDONLY is a plain segmentation fault.
    let o = finish(
        cluster.spawn("a", &prog, &["rdonly-write"], path),
        deadline,
        "rdonly-write",
    );
    path.check(&o);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(11), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("read 0") && !out.contains("wrote"), "{out}");
    // The killed program's attach was detached by its daemon.
    let status = cluster.a.status_text();
    assert!(status.contains("nattch 0"), "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn system_v_semantics_from_c_through_the_shim_on_the_best_path() {
    system_v_semantics(ShimPath::Best);
}

#[test]
fn system_v_semantics_from_c_through_the_shim_on_the_mprotect_path() {
    system_v_semantics(ShimPath::Mprotect);
}

const SYSCALL_C: &str = r#"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/shm.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int id = shmget(argc > 1 ? atoi(argv[1]) : 0x6161, 4096, IPC_CREAT | IPC_EXCL | 0600);
    char *p = shmat(id, NULL, 0);
    if (id < 0 || p == (void *)-1) { perror("shm"); return 1; }
    int fds[2];
    if (pipe(fds) != 0 || write(fds[1], "1234567812345678", 16) != 16) return 1;
    /* The page is held nowhere here yet: the kernel's own access. */
    ssize_t n = read(fds[0], p, 8);
    printf("read %zd %s\n", n, n < 0 && errno == EFAULT ? "EFAULT" : "");
    if (n < 0) {
        p[0] = 0; /* a user access faults the page in */
        n = read(fds[0], p, 8);
        printf("again %zd\n", n);
    }
    printf("value %.8s\n", p);
    return 0;
}
"#;

/// A limit, per path, from C: a system call (`read(fd, shm, n)`) into a
/// page not held here gets EFAULT on the mprotect path (the kernel raises
/// no SIGSEGV for its own access) and under `UFFD_USER_MODE_ONLY` (kernel
/// faults are not delivered); touching the page first makes it work. With
/// a full userfaultfd the kernel's access is a fault the daemon serves.
#[test]
fn a_syscall_into_a_page_not_held_per_shim_path() {
    let dir = tmp("syscall");
    let Some(prog) = cc(&dir, "syscall", SYSCALL_C, &[]) else {
        return;
    };
    let cluster = Cluster::start(&dir);
    for (key, path) in [
        ("7001", ShimPath::Mprotect),
        ("7002", ShimPath::UffdUser),
        ("7003", ShimPath::Best),
    ] {
        let deadline = Instant::now() + Duration::from_secs(30);
        let o = finish(cluster.spawn("a", &prog, &[key], path), deadline, "syscall");
        assert!(o.status.success(), "{}", text(&o));
        path.check(&o);
        let out = String::from_utf8_lossy(&o.stdout);
        use mmulab_mirage::runtime::fault::PATH_UFFD;
        if path.expected() == PATH_UFFD {
            assert!(out.contains("read 8 \n"), "{path:?}: {out}");
        } else {
            assert!(
                out.contains("read -1 EFAULT") && out.contains("again 8"),
                "{path:?}: {out}"
            );
        }
        assert!(out.contains("value 12345678"), "{path:?}: {out}");
        eprintln!(
            "{path:?} ({}): {}",
            path.expected(),
            out.replace('\n', "; ")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A limit, documented: a statically linked program never loads the shim;
/// its shmget reaches the kernel's own System V segments, and
/// `mmulab dsm run` detects and warns about it.
#[test]
fn static_binaries_escape_the_shim() {
    let dir = tmp("static");
    let src = r#"
#include <stdio.h>
#include <sys/ipc.h>
#include <sys/shm.h>
int main(void) {
    int id = shmget(IPC_PRIVATE, 4096, 0600);
    if (id < 0) { perror("shmget"); return 1; }
    printf("kernel shmid %d\n", id);
    shmctl(id, IPC_RMID, NULL);
    return 0;
}
"#;
    let out = dir.join("static-prog");
    std::fs::write(dir.join("s.c"), src).unwrap();
    let built = Command::new("cc")
        .args(["-static", "-o"])
        .arg(&out)
        .arg(dir.join("s.c"))
        .output();
    match built {
        Err(e) => {
            eprintln!("skipped: no C compiler (cc: {e})");
            return;
        }
        Ok(o) if !o.status.success() => {
            eprintln!(
                "skipped: no static C library ({})",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
            );
            return;
        }
        Ok(_) => {}
    }
    assert_eq!(mmulab_mirage::runtime::cli::is_static_elf(&out), Some(true));
    let Some(dynamic) = cc(&dir, "dynamic", "int main(void) { return 0; }", &[]) else {
        return;
    };
    assert_eq!(
        mmulab_mirage::runtime::cli::is_static_elf(&dynamic),
        Some(false)
    );
    let cluster = Cluster::start(&dir);
    let deadline = Instant::now() + Duration::from_secs(30);
    let o = finish(
        cluster.spawn("a", &out, &[], ShimPath::Best),
        deadline,
        "static program",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("kernel shmid"));
    // The daemon never heard of it.
    let status = cluster.a.status_text();
    assert!(status.contains("shmids on this site:\n  none"), "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// When a site dies: site `a` in this process, site `b` in a child process
// (this binary re-run as `site_child`), programs under the shim.

/// The child half: runs `mmulab dsm site`'s entry point for the site
/// named in `MIRAGE_SITE_CHILD` ("CONFIG|NAME"); a no-op otherwise.
#[test]
fn site_child() {
    let Ok(spec) = std::env::var("MIRAGE_SITE_CHILD") else {
        return;
    };
    let (config, name) = spec.split_once('|').unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    mmulab_mirage::runtime::cli::run_site(Path::new(config), name, &stop, &mut |l| {
        eprintln!("{l}")
    })
    .unwrap();
}

struct Deaths {
    dir: PathBuf,
    config: PathBuf,
    a: Arc<Dsm>,
    server: Option<LocalServer>,
    tool: PathBuf,
    shim: PathBuf,
    children: Vec<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Deaths {
    /// `None` without a C compiler.
    fn start(name: &str) -> Option<Deaths> {
        let dir = tmp(name);
        let source = std::fs::read_to_string(repo().join("examples/c/dsmtool.c")).unwrap();
        let tool = cc(&dir, "dsmtool", &source, &[])?;
        let config = dir.join("cluster.toml");
        let mut text = format!("cluster_id = {}\ninsecure = true\n", std::process::id());
        for s in ["a", "b"] {
            text.push_str(&format!(
                "[[site]]\nname = \"{s}\"\naddr = \"127.0.0.1:{}\"\nsocket = \"{}\"\n",
                free_port(),
                dir.join(format!("{s}.sock")).display()
            ));
        }
        std::fs::write(&config, text).unwrap();
        let cluster = mmulab_mirage::runtime::ClusterConfig::parse(
            &std::fs::read_to_string(&config).unwrap(),
        )
        .unwrap();
        let options = NodeOptions {
            request_timeout: Duration::from_secs(2),
            peer_timeout: Duration::from_secs(2),
            ..NodeOptions::default()
        };
        let node = mmulab_mirage::runtime::Node::start(cluster, "a", options).unwrap();
        let a = Arc::new(Dsm::new(node));
        let server = LocalServer::start(a.clone(), &dir.join("a.sock")).unwrap();
        let shim = mmulab_mirage::runtime::cli::find_shim().unwrap();
        let mut d = Deaths {
            dir,
            config,
            a,
            server: Some(server),
            tool,
            shim,
            children: Vec::new(),
        };
        d.start_b();
        Some(d)
    }

    /// Starts site b in a child process; waits for its socket. Returns
    /// its index in `children`.
    fn start_b(&mut self) -> usize {
        let _ = std::fs::remove_file(self.dir.join("b.sock"));
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["site_child", "--exact", "--nocapture", "--test-threads=1"])
            .env("MIRAGE_SITE_CHILD", format!("{}|b", self.config.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.dir.join("b.sock").exists() {
            assert!(Instant::now() < deadline, "site b never came up");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.children.len() - 1
    }

    /// Runs dsmtool on a site.
    fn tool(&mut self, site: &str, args: &[&str]) -> usize {
        let child = Command::new(&self.tool)
            .args(args)
            .env("LD_PRELOAD", &self.shim)
            .env(proto::SOCKET_ENV, self.dir.join(format!("{site}.sock")))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.children.push(child);
        self.children.len() - 1
    }

    /// Waits (bounded) for a line on a child's stdout.
    fn expect_line(&mut self, i: usize, line: &str) {
        use std::io::BufRead;
        let out = self.children[i].stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let want = line.to_string();
        std::thread::spawn(move || {
            // Drains to the end: a program writing to a closed pipe
            // would die of SIGPIPE.
            let mut done = false;
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if !done {
                    done = l == want;
                    let _ = tx.send(l);
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l == line => return,
                Ok(l) => seen.push(l),
                Err(_) => panic!("no `{line}` in time; saw {seen:?}"),
            }
        }
    }

    fn take(&mut self, i: usize) -> Child {
        let c = Command::new("true").spawn().unwrap();
        std::mem::replace(&mut self.children[i], c)
    }
}

impl Drop for Deaths {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        drop(self.server.take());
        self.a.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// kill -9 of the site holding a page's only current copy: a program on a
/// surviving site that touches that page gets SIGBUS within the request
/// timeout, with one stderr line naming segment, page and the dead site;
/// a page of which it held a read copy stays readable (and current); the
/// daemon logs the vanished peer by name and `status` lists the lost page.
#[test]
fn killing_the_only_holder_of_a_page_gives_sigbus_not_zeros() {
    let Some(mut d) = Deaths::start("kill9") else {
        return;
    };
    let a1 = d.tool(
        "a",
        &[
            "0x5151", "c", "2", "w", "0", "1", "w", "1", "1", "p", "ready", "s", "600000",
        ],
    );
    d.expect_line(a1, "ready");
    let b1 = d.tool(
        "b",
        &[
            "0x5151", "g", "w", "0", "42", "r", "1", "p", "ready", "s", "600000",
        ],
    );
    d.expect_line(b1, "ready");
    // The only current copy of page 0 is at b; both sites read page 1.
    let site_b = d.take(0);
    let pid = site_b.id() as i32;
    // SAFETY: kill(2) of our own child.
    unsafe { nix::libc::kill(pid, nix::libc::SIGKILL) };
    let mut site_b = site_b;
    let _ = site_b.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.a.status_text().contains("DEAD") {
        assert!(Instant::now() < deadline, "b's death went unnoticed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        d.a.node()
            .dropped_peers()
            .iter()
            .any(|l| l.contains("site b: vanished")),
        "{:?}",
        d.a.node().dropped_peers()
    );
    let started = Instant::now();
    let a2 = d.tool(
        "a",
        &["0x5151", "g", "r", "1", "r", "0", "p", "unreachable"],
    );
    let o = finish(d.take(a2), Instant::now() + Duration::from_secs(30), "a2");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.status.signal(), Some(nix::libc::SIGBUS), "{}", text(&o));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "error not in bounded time"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("r 1 1") && !out.contains("r 0"), "{out}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("segment 0.0 page 0")
            && err.contains("only current copy was at site b, which is dead")
            && err.contains("SIGBUS"),
        "{err}"
    );
    eprint!("{err}");
    let status = d.a.status_text();
    eprint!("{status}");
    assert!(
        status.contains("lost pages:\n  segment 0.0 page 0"),
        "{status}"
    );
}

/// A site that stops cleanly (SIGTERM) checks its pages back in: the page
/// it alone held is read, current, on the other site afterwards.
#[test]
fn a_clean_stop_checks_pages_in_and_loses_nothing() {
    let Some(mut d) = Deaths::start("clean") else {
        return;
    };
    let a1 = d.tool(
        "a",
        &[
            "0x5252", "c", "1", "w", "0", "1", "p", "ready", "s", "600000",
        ],
    );
    d.expect_line(a1, "ready");
    let b1 = d.tool(
        "b",
        &["0x5252", "g", "w", "0", "42", "p", "ready", "s", "600000"],
    );
    d.expect_line(b1, "ready");
    let mut site_b = d.take(0);
    // SAFETY: kill(2) of our own child.
    unsafe { nix::libc::kill(site_b.id() as i32, nix::libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = site_b.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "site b did not stop in time");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    use std::io::Read;
    site_b
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("site b stopped"), "{err}");
    let a2 = d.tool("a", &["0x5252", "g", "r", "0"]);
    let o = finish(d.take(a2), Instant::now() + Duration::from_secs(30), "a2");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("r 0 42"),
        "{}",
        text(&o)
    );
    let status = d.a.status_text();
    assert!(status.contains("lost pages:\n  none"), "{status}");
}

/// A site killed and restarted under the same name (a newer incarnation)
/// rejoins: new segments work across both sites; its former life's
/// segments stay fenced off.
#[test]
fn a_site_restarted_under_its_name_rejoins() {
    let Some(mut d) = Deaths::start("restart") else {
        return;
    };
    let a1 = d.tool(
        "a",
        &[
            "0x5353", "c", "1", "w", "0", "5", "p", "ready", "s", "600000",
        ],
    );
    d.expect_line(a1, "ready");
    let b1 = d.tool("b", &["0x5353", "g", "r", "0", "p", "ready"]);
    d.expect_line(b1, "ready");
    let mut site_b = d.take(0);
    let _ = site_b.kill();
    let _ = site_b.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.a.status_text().contains("DEAD") {
        assert!(Instant::now() < deadline, "b's death went unnoticed");
        std::thread::sleep(Duration::from_millis(10));
    }
    d.start_b();
    // A new segment created on the restarted b, used from a.
    let b2 = d.tool(
        "b",
        &[
            "0x5454", "c", "1", "w", "0", "7", "p", "ready", "W", "0", "8", "r", "0",
        ],
    );
    d.expect_line(b2, "ready");
    let a2 = d.tool("a", &["0x5454", "g", "r", "0", "w", "0", "8"]);
    let o = finish(d.take(a2), Instant::now() + Duration::from_secs(30), "a2");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("r 0 7"),
        "{}",
        text(&o)
    );
    // b2 saw a's write (W 0 8) and read it back (its stdout went to
    // `expect_line`): exit 0, else 3 (torn) or 4 (timeout).
    let o = finish(d.take(b2), Instant::now() + Duration::from_secs(30), "b2");
    assert!(o.status.success(), "{}", text(&o));
    // The page a wrote before b's death is still a's (b only read it).
    let a3 = d.tool("a", &["0x5353", "g", "r", "0"]);
    let o = finish(d.take(a3), Instant::now() + Duration::from_secs(30), "a3");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("r 0 5"),
        "{}",
        text(&o)
    );
    let status = d.a.status_text();
    assert!(status.contains("alive"), "{status}");
}

/// fork (a limit of the issue): the child's mappings are re-armed before
/// fork returns, so when another site takes the page the child faults and
/// reads the new version. The negative control (re-arming switched off)
/// reads an old copy or zeros, and is caught. Both fault paths: on the
/// userfaultfd path the child's inherited mappings lose their
/// registration in the fork (an unregistered shared mapping would
/// zero-fill a missing page), and the child registers them with its own
/// userfaultfd before fork returns.
#[test]
fn a_forked_child_is_re_armed_before_fork_returns() {
    for (path, rearm) in [
        (ShimPath::Best, true),
        (ShimPath::Best, false),
        (ShimPath::Mprotect, true),
        (ShimPath::Mprotect, false),
    ] {
        let name = format!("fork-{path:?}-{}", if rearm { "on" } else { "off" });
        let Some(mut d) = Deaths::start(&name) else {
            return;
        };
        let tool = d.tool.clone();
        let mut cmd = Command::new(&tool);
        cmd.args([
            "0x5555", "c", "1", "w", "0", "1", "f", "p", "forked", "s", "1500", "r", "0",
        ])
        .env("LD_PRELOAD", &d.shim)
        .env(proto::SOCKET_ENV, d.dir.join("a.sock"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        path.set(&mut cmd);
        if !rearm {
            cmd.env("MMULAB_DSM_NO_FORK_REARM", "1");
        }
        d.children.push(cmd.spawn().unwrap());
        let a1 = d.children.len() - 1;
        let (tx, rx) = std::sync::mpsc::channel();
        let out = d.children[a1].stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                let _ = tx.send(l);
            }
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(20)).unwrap(), "forked");
        let b1 = d.tool("b", &["0x5555", "g", "w", "0", "2"]);
        let o = finish(d.take(b1), Instant::now() + Duration::from_secs(20), "b1");
        assert!(o.status.success(), "{}", text(&o));
        let o = finish(d.take(a1), Instant::now() + Duration::from_secs(20), "a1");
        let read = rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("fault path: {}", path.expected())),
            "{err}"
        );
        if rearm {
            assert!(o.status.success(), "{}", text(&o));
            assert_eq!(read, "r 0 2", "{path:?}: the child read a stale copy");
        } else {
            assert_ne!(
                read, "r 0 2",
                "{path:?}: the negative control was not caught"
            );
            eprintln!("{path:?}: negative control (no re-arm) read: {read:?}");
        }
    }
}

/// The Rust API's checked accessors on a lost page: kill -9 of the site
/// holding page 0's only current copy; `read_at` and `write_at` on page 0
/// return `DsmError::PageLost` naming segment, page and the dead site (a
/// raw access would get SIGBUS, as in C), in bounded time; page 1, of
/// which this site holds a read copy, still reads the current value.
#[test]
fn the_rust_api_returns_page_lost_instead_of_sigbus() {
    use mmulab_mirage::runtime::shm::DsmError;
    let Some(mut d) = Deaths::start("rustlost") else {
        return;
    };
    let a1 = d.tool(
        "a",
        &[
            "0x5252", "c", "2", "w", "1", "7", "p", "ready", "s", "600000",
        ],
    );
    d.expect_line(a1, "ready");
    let b1 = d.tool(
        "b",
        &[
            "0x5252", "g", "w", "0", "42", "r", "1", "p", "ready", "s", "600000",
        ],
    );
    d.expect_line(b1, "ready");
    let shmid = d.a.shmget(0x5252, 2 * 4096, 0).unwrap();
    let base = d.a.shmat(shmid, None, 0).unwrap();
    let mut word = [0u8; 8];
    // Before the kill: the checked read brings page 0 from b.
    d.a.read_at(base, 0, &mut word).unwrap();
    assert_eq!(i64::from_ne_bytes(word), 42);
    // b writes page 0 again, so that its only current copy is at b.
    let b2 = d.tool("b", &["0x5252", "g", "w", "0", "43", "p", "again"]);
    d.expect_line(b2, "again");
    let site_b = d.take(0);
    // SAFETY: kill(2) of our own child.
    unsafe { nix::libc::kill(site_b.id() as i32, nix::libc::SIGKILL) };
    let mut site_b = site_b;
    let _ = site_b.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.a.status_text().contains("DEAD") {
        assert!(Instant::now() < deadline, "b's death went unnoticed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = Instant::now();
    let err = d.a.read_at(base, 0, &mut word).unwrap_err();
    match &err {
        DsmError::PageLost {
            segment,
            page,
            site,
            reason,
        } => {
            assert_eq!((segment.as_str(), *page), ("0.0", 0), "{err}");
            assert_eq!(site.as_deref(), Some("b"), "{err}");
            assert!(reason.contains("only current copy was at site b"), "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(matches!(
        d.a.write_at(base, 8, &[1; 8]),
        Err(DsmError::PageLost { page: 0, .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(5), "not bounded");
    // Page 1's read copy here is current and stays readable.
    d.a.read_at(base, 4096, &mut word).unwrap();
    assert_eq!(i64::from_ne_bytes(word), 7);
    let status = d.a.status_text();
    assert!(status.contains("segment 0.0 page 0: lost"), "{status}");
    d.a.shmdt(base).unwrap();
}
