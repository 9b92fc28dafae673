//! Issue 24's commands that work (the corpus in tests/bad-inputs/ holds the
//! ones that must fail): every trace format read, an in-place convert,
//! Ctrl-C keeping what ran, a memory that runs out named, list's width and
//! JSON, completions, quiet, and the budget's estimates against real runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn mmulab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mmulab"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mmulab-inputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const LOG: &str = "crates/trace/tests/fixtures/fork-child.lackey.log";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(LOG)
}

/// `trace sim --json` on a path: (refs, misses).
fn sim(path: &Path, page_size: &str) -> (u64, u64) {
    let o = mmulab(&[
        "trace",
        "sim",
        path.to_str().unwrap(),
        "--page-size",
        page_size,
        "--json",
    ]);
    assert!(o.status.success(), "{}: {}", path.display(), stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    (r["refs"].as_u64().unwrap(), r["misses"].as_u64().unwrap())
}

/// A gzip- or zstd-compressed log reads as the plain one does (told by
/// content: the names carry no suffix).
#[test]
fn compressed_logs_read_like_the_plain_one() {
    let d = tmp("compressed");
    let plain = sim(&fixture(), "4096");
    let text = std::fs::read(fixture()).unwrap();
    let gz = d.join("log-a");
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut e, &text).unwrap();
    std::fs::write(&gz, e.finish().unwrap()).unwrap();
    assert_eq!(sim(&gz, "4096"), plain);
    // Two gzip members one after the other are one stream.
    let half = text.len() / 2;
    let cut = text[..half].iter().rposition(|&b| b == b'\n').unwrap() + 1;
    let mut two = Vec::new();
    for part in [&text[..cut], &text[cut..]] {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, part).unwrap();
        two.extend(e.finish().unwrap());
    }
    let gz2 = d.join("log-b");
    std::fs::write(&gz2, two).unwrap();
    assert_eq!(sim(&gz2, "4096"), plain);
    // zstd, made by the zstd tool when the machine has it.
    let zst = d.join("log-c");
    let made = Command::new("zstd")
        .args([
            "-q",
            "-f",
            "-o",
            zst.to_str().unwrap(),
            fixture().to_str().unwrap(),
        ])
        .status();
    if made.is_ok_and(|s| s.success()) {
        assert_eq!(sim(&zst, "4096"), plain);
    } else {
        eprintln!("zstd not installed: the zstd read is covered by the fuzz tests only");
    }
}

/// din and xdin, as `trace export` writes them, read back with the same
/// misses at the page size they were split at.
#[test]
fn exported_din_and_xdin_read_back() {
    let d = tmp("dinero");
    let plain = sim(&fixture(), "4096");
    for format in ["din", "xdin"] {
        let out = d.join(format!("trace.{format}"));
        let o = mmulab(&[
            "trace",
            "export",
            LOG,
            "--format",
            format,
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let (refs, misses) = sim(&out, "4096");
        // An `M` is exported as a read and a write, each piece a line: the
        // same references, and so the same misses.
        assert_eq!(misses, plain.1, "{format}");
        assert_eq!(refs, plain.0, "{format}");
    }
}

/// issue 24: `trace convert X -o X` truncated its input before reading it
/// and wrote an empty trace with exit 0.
#[test]
fn convert_in_place_keeps_every_reference() {
    let d = tmp("inplace");
    let x = d.join("x.log");
    std::fs::copy(fixture(), &x).unwrap();
    let before = sim(&x, "4096");
    let o = mmulab(&[
        "trace",
        "convert",
        x.to_str().unwrap(),
        "-o",
        x.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read(&x).unwrap().starts_with(b"MMUTRACE"));
    assert_eq!(sim(&x, "4096"), before);
    // Nothing else is left in the folder (the staged file was renamed).
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
}

/// A lenient read names how many lines it skipped and the first one.
/// issue 24: `trace capture -o FILE` wrote FILE in place, so a capture
/// that failed halfway left a partial trace there. A Valgrind stand-in
/// (first on PATH) writes a log whose third line is malformed: the capture
/// fails with exit 2 naming the line, and the folder is left as it was,
/// with neither the trace nor a temporary file; a good log is renamed into
/// place.
#[test]
fn a_failed_capture_leaves_nothing_behind() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmp("capture");
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = bin.join("valgrind");
    std::fs::write(
        &fake,
        "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in --log-file=*) f=\"${a#--log-file=}\";; esac; done\n\
         f=$(printf '%s' \"$f\" | sed \"s/%p/$$/\")\n\
         printf '==1== Command: x\\nI  00401000,4\\n%s\\n' \"$LINE\" > \"$f\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out_dir = d.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("t.mmutrace");
    let capture = |line: &str| {
        Command::new(env!("CARGO_BIN_EXE_mmulab"))
            .args([
                "trace",
                "capture",
                "-o",
                out.to_str().unwrap(),
                "--",
                "true",
            ])
            .env("PATH", &path)
            .env("LINE", line)
            .output()
            .unwrap()
    };
    let o = capture(" L zzzz,8");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(":3"), "names the line: {}", stderr(&o));
    let left: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "a failed capture left {left:?}");

    let o = capture(" L 1fff0000,8");
    assert!(o.status.success(), "{}", stderr(&o));
    let left: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("t.mmutrace")]);
    let (refs, _) = sim(&out, "4096");
    assert_eq!(refs, 2);
}

#[test]
fn lenient_reads_say_what_they_skipped() {
    let d = tmp("lenient");
    let p = d.join("t.log");
    std::fs::write(&p, " L 1000,4\n Q junk\n S 2000,8\n L 3000,0\n").unwrap();
    let o = mmulab(&["trace", "sim", p.to_str().unwrap(), "--lenient", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("skipped 2 malformed lines") && e.contains("t.log:2:"),
        "{e}"
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["refs"], 2);
}

/// Sends SIGINT to a child and waits for it (bounded).
fn interrupt_after(
    mut child: std::process::Child,
    after: Duration,
) -> (Option<i32>, String, String) {
    std::thread::sleep(after);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no stop 30 s after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    (o.status.code(), stdout(&o), stderr(&o))
}

fn spawn(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_mmulab"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Ctrl-C stops a long run cleanly: exit 130, the runs done written and
/// marked `interrupted`; a single long seed stops inside the simulation.
#[test]
fn ctrl_c_stops_a_run_and_keeps_what_ran() {
    let d = tmp("ctrlc");
    let out = d.join("many");
    let child = spawn(&[
        "run",
        "experiments/tester.toml",
        "--set",
        "runs=1000000",
        "--max-work",
        "1e15",
        "--out",
        out.to_str().unwrap(),
    ]);
    let (code, text, err) = interrupt_after(child, Duration::from_millis(1500));
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("stopped by Ctrl-C"), "{err}");
    assert!(text.contains("run(s)"), "the summary of what ran: {text}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(r["interrupted"], true);
    let runs = r["runs"].as_u64().unwrap();
    assert!((1..1_000_000).contains(&runs), "{runs}");

    // One seed of about 10 minutes: stopped from inside the event loop.
    let one = d.join("one");
    let child = spawn(&[
        "run",
        "experiments/tester.toml",
        "--set",
        "workload={kind=\"bench\", refs_per_thread=1000000000}",
        "--set",
        "preset=\"generic\"",
        "--out",
        one.to_str().unwrap(),
    ]);
    let t0 = Instant::now();
    let (code, _, err) = interrupt_after(child, Duration::from_millis(1500));
    assert_eq!(code, Some(130), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(one.join("results.json")).unwrap()).unwrap();
    assert_eq!(r["interrupted"], true);
    assert!(r["counters"]["refs"].as_u64().unwrap() > 0);
}

#[test]
fn ctrl_c_stops_a_check_sweep_with_the_seeds_done() {
    let child = spawn(&[
        "check",
        "--protocol",
        "mach",
        "--seeds",
        "1000000",
        "--json",
    ]);
    let (code, text, err) = interrupt_after(child, Duration::from_millis(1500));
    assert_eq!(code, Some(130), "{err}");
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["interrupted"], true);
    assert_eq!(r["violations"], 0);
    assert!(r["seeds"].as_u64().unwrap() < 1_000_000);
}

/// Ctrl-C in a local sweep: no further task starts, the tasks done are
/// kept in --out (exit 130, a line that says how to go on), and `--resume`
/// goes on from them (it says how many were done before).
#[test]
fn ctrl_c_stops_a_sweep_and_resume_goes_on() {
    let d = tmp("ctrlc-sweep");
    let file = d.join("many.toml");
    std::fs::write(
        &file,
        "base = \"experiments/tester.toml\"\nseeds = { start = 1, count = 100000 }\n[grid]\nprotocol = [\"mach\"]\n",
    )
    .unwrap();
    let out = d.join("out");
    let args = |resume: bool| {
        let mut a = vec![
            "sweep".to_string(),
            file.to_str().unwrap().to_string(),
            "--out".into(),
            out.to_str().unwrap().to_string(),
            "--jobs".into(),
            "1".into(),
        ];
        if resume {
            a.push("--resume".into());
        }
        a
    };
    let spawn_args = |resume: bool| {
        let a = args(resume);
        spawn(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (code, text, err) = interrupt_after(spawn_args(false), Duration::from_millis(2500));
    assert_eq!(code, Some(130), "{text}{err}");
    assert!(
        text.contains("stopped by Ctrl-C after") && text.contains("--resume"),
        "{text}"
    );
    let st = mmulab(&["sweep", "status", out.to_str().unwrap()]);
    let st = stdout(&st);
    let done: u64 = st
        .split("done ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{st}"));
    assert!((1..100_000).contains(&done), "{st}");

    let (code, text, err) = interrupt_after(spawn_args(true), Duration::from_millis(2500));
    assert_eq!(code, Some(130), "{text}{err}");
    assert!(text.contains(&format!("({done} done before)")), "{text}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Ctrl-C in `reproduce`: the paper in progress stops at its next seed or
/// step (not at its end), exit 130, and the note names where it stopped;
/// no half report is written.
#[test]
fn ctrl_c_stops_a_reproduction_within_the_paper() {
    let d = tmp("ctrlc-repro");
    // romanescu10 --quick runs for minutes; its first step alone is long.
    let child = spawn(&[
        "reproduce",
        "romanescu10",
        "--quick",
        "--out",
        d.to_str().unwrap(),
    ]);
    let t0 = Instant::now();
    let (code, text, err) = interrupt_after(child, Duration::from_millis(3000));
    assert_eq!(code, Some(130), "{text}{err}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert!(
        err.contains("romanescu10: stopped by Ctrl-C in step `Fig. 7: single_unmap, directory"),
        "{err}"
    );
    assert!(!d.join("reproduce-romanescu10.json").exists());
    let _ = std::fs::remove_dir_all(&d);
}

/// Ctrl-C in `host shootdown`: the point in progress is dropped and the
/// points measured are printed (exit 130). Skipped where the tester
/// cannot run (one core, no affinity).
#[test]
fn ctrl_c_stops_host_shootdown_with_what_was_measured() {
    let probe = mmulab(&[
        "host",
        "shootdown",
        "--threads",
        "1",
        "--reps",
        "300",
        "--json",
    ]);
    if !probe.status.success() {
        eprintln!(
            "skipped: host shootdown cannot run here: {}",
            stderr(&probe)
        );
        return;
    }
    // A whole run's points, to tell a cut run from a finished one.
    let full: serde_json::Value =
        serde_json::from_str(&String::from_utf8_lossy(&probe.stdout)).expect("the probe's JSON");
    let all_points = full["points"].as_array().map_or(0, Vec::len);
    // Reps for a baseline of about 1.5 s, from the probe's own mean
    // baseline repetition (the process's start-up is not in it); a
    // responder's repetition takes several times longer, so a signal at
    // 2 s falls in the responder point, or on a loaded machine still in
    // the baseline: either way before the run ends.
    let mean_ns = |v: &serde_json::Value| v["latency_ns"]["mean"].as_f64().unwrap_or(0.0);
    let per_rep = mean_ns(&full["baseline"]).max(100.0) * 1e-9;
    // (At most `--reps`'s own limit, 1,000,000: a fast machine's probe
    // asked for more and the run was refused.)
    let reps = ((1.5 / per_rep) as u64).clamp(1000, 1_000_000).to_string();
    let child = spawn(&[
        "host",
        "shootdown",
        "--threads",
        "1",
        "--reps",
        &reps,
        "--json",
    ]);
    let (code, text, err) = interrupt_after(child, Duration::from_millis(2000));
    assert_eq!(code, Some(130), "{text}{err}");
    if text.trim().is_empty() {
        // Stopped inside the baseline: nothing measured, and it says so.
        assert!(err.contains("before the baseline"), "{err}");
    } else {
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(r["baseline"].is_object(), "{r}");
        // The cut point is dropped: never more points than a whole run
        // (all of them when the signal came after the last), each whole.
        let points = r["points"].as_array().unwrap();
        assert!(points.len() <= all_points, "{r}");
        for p in points {
            assert!(p["latency_ns"]["median"].is_number(), "{p}");
        }
        assert!(err.contains("stopped by Ctrl-C"), "{err}");
    }
}

/// Ctrl-C in `dsm bench`: it stops at the next sweep point and prints what
/// it measured (exit 130). Skipped where the bench cannot run.
#[test]
fn ctrl_c_stops_dsm_bench_with_what_was_measured() {
    let child = spawn(&["dsm", "bench", "--quick", "--json"]);
    let (code, text, err) = interrupt_after(child, Duration::from_millis(4000));
    if code == Some(2) {
        eprintln!("skipped: dsm bench cannot run here: {err}");
        return;
    }
    assert_eq!(code, Some(130), "{text}{err}");
    if text.trim().is_empty() {
        assert!(err.contains("before a remote fault was timed"), "{err}");
        return;
    }
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(r["faults_timed"].as_u64().unwrap() > 0, "{r}");
    let points =
        r["pingpong"].as_array().unwrap().len() + r["read_writers"].as_array().unwrap().len();
    assert!(points < 6 + 5, "every point ran: {r}");
    assert!(err.contains("dsm bench stopped by Ctrl-C"), "{err}");
}

/// Ctrl-C during `trace capture`, at a terminal: the whole process group
/// (mmulab, Valgrind, the command) gets it; the command's trace until then
/// is kept at -o (exit 130). Skipped without Valgrind.
#[test]
fn ctrl_c_stops_a_capture_and_keeps_the_trace() {
    use std::os::unix::process::CommandExt;
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("skipped: valgrind is not installed");
        return;
    }
    let d = tmp("ctrlc-capture");
    let out = d.join("t.mmutrace");
    let child = Command::new(env!("CARGO_BIN_EXE_mmulab"))
        .args([
            "trace",
            "capture",
            "-o",
            out.to_str().unwrap(),
            "--",
            "sleep",
            "60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    std::thread::sleep(Duration::from_millis(4000));
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let t0 = Instant::now();
    let o = child.wait_with_output().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("capture stopped by Ctrl-C"),
        "{}",
        stderr(&o)
    );
    let (refs, _) = sim(&out, "4096");
    assert!(refs > 0);
    let left: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("t.mmutrace")],
        "no temporary file left"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A simulated memory that runs out stops the run with a named failure
/// (it panicked at vm.rs:429), and the verdict is negative: exit 1.
#[test]
fn memory_running_out_is_a_named_failure_not_a_panic() {
    let o = mmulab(&[
        "run",
        "experiments/tester.toml",
        "--set",
        "workload={kind=\"random\", steps=3000}",
        "--set",
        "preset=\"generic\"",
        "--set",
        "machine.cpus=4",
        "--set",
        "machine.memory_mb=2",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let why = r["liveness"][0]["waiting_for"].as_str().unwrap();
    assert!(
        why.contains("simulated memory is exhausted") && why.contains("machine.memory_mb"),
        "{why}"
    );
}

/// `list` fits 100 columns off a terminal (its lines were 378 long) and
/// has a JSON form.
#[test]
fn list_wraps_to_100_columns_and_has_json() {
    let o = mmulab(&["list"]);
    assert!(o.status.success());
    let text = stdout(&o);
    let widest = text.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(widest <= 100, "a line of {widest} characters");
    for name in ["encore-multimax-1989", "mach", "none", "tester", "random"] {
        assert!(text.contains(name), "{name}");
    }
    let o = mmulab(&["list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["presets"].as_array().unwrap().len() >= 4);
    assert!(
        v["protocols"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "none" && p["negative_control"] == true)
    );
    assert!(
        v["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["name"] == "tester")
    );
}

#[test]
fn completions_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = mmulab(&["completions", shell]);
        assert!(o.status.success(), "{shell}");
        let s = stdout(&o);
        assert!(s.contains("mmulab") && s.contains("reproduce"), "{shell}");
    }
}

/// `--help` lists the choices of a closed set.
#[test]
fn help_lists_the_choices() {
    let o = mmulab(&["trace", "sim", "--help"]);
    let s = stdout(&o);
    assert!(
        s.contains("lru") && s.contains("fifo") && s.contains("random"),
        "{s}"
    );
    let o = mmulab(&["check", "--help"]);
    assert!(stdout(&o).contains("mach-no-wait"));
}

/// `--json` prints the reports on stdout and nothing else; `-q` silences
/// the progress lines stderr carries off a terminal.
#[test]
fn reproduce_json_and_quiet() {
    let o = mmulab(&["reproduce", "black89", "--quick", "--json", "-q"]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    assert_eq!(r["paper"], "black89");
    assert!(r["rows"].as_array().unwrap().len() > 5);
    assert!(stderr(&o).is_empty(), "quiet: {}", stderr(&o));
    // Without -q, off a terminal, each step is a line.
    let o = mmulab(&["reproduce", "black89", "--quick"]);
    assert!(stderr(&o).lines().any(|l| l.starts_with("black89: ")));
}

/// Runs mmulab and returns its output and its own peak RSS in KiB
/// (wait4's rusage of that child alone: other tests run children too).
/// The child is reaped by wait4 itself.
#[allow(clippy::zombie_processes)]
fn run_measured(args: &[&str]) -> (Option<i32>, String, i64) {
    use std::io::Read;
    let mut child = spawn(args);
    let mut err = child.stderr.take().unwrap();
    let mut out = child.stdout.take().unwrap();
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let o = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for this child,
    // which is not waited for anywhere else.
    let mut usage: nix::libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { nix::libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    o.join().unwrap();
    let code = nix::libc::WIFEXITED(status).then(|| nix::libc::WEXITSTATUS(status));
    (code, e.join().unwrap(), usage.ru_maxrss)
}

/// The estimate a run is refused with, in MiB.
fn estimate_mib(args: &[&str]) -> f64 {
    let mut probe = args.to_vec();
    probe.extend(["--max-memory", "1K"]);
    let o = mmulab(&probe);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    let mut it = e
        .split("needs about ")
        .nth(1)
        .unwrap_or_else(|| panic!("{e}"))
        .split(' ');
    let n: f64 = it.next().unwrap().parse().unwrap();
    match it.next().unwrap() {
        "GiB" => n * 1024.0,
        "TiB" => n * 1024.0 * 1024.0,
        _ => n,
    }
}

/// The budget's estimate covers what real runs take: the peak RSS of a
/// run whose memory is mostly its workload's pages (bench, 64 MiB of
/// private pages) and of one that is mostly TLBs (2^20 entries on 4 CPUs)
/// is below the estimate, and not far below it (within 4x).
#[test]
fn budget_estimates_cover_measured_peaks() {
    for (sets, label) in [
        (
            vec![
                "workload={kind=\"bench\", threads=4, private_pages=16384, refs_per_thread=40000, stride_bytes=4096}",
                "preset=\"generic\"",
                "machine.memory_mb=1024",
            ],
            "pages",
        ),
        (
            vec![
                "preset=\"generic\"",
                "machine.cpus=4",
                "workload.children=2",
                "machine.tlb.entries=1048576",
                "machine.tlb.ways=1048576",
                "workload.warmup_cycles=2000",
            ],
            "tlb",
        ),
    ] {
        let mut args = vec!["run", "experiments/tester.toml"];
        for s in &sets {
            args.push("--set");
            args.push(s);
        }
        let est = estimate_mib(&args);
        let (code, err, rss_kb) = run_measured(&args);
        assert!(matches!(code, Some(0 | 1)), "{label}: {err}");
        let peak = rss_kb as f64 / 1024.0;
        eprintln!("{label}: estimate {est:.0} MiB, peak RSS {peak:.0} MiB");
        assert!(
            peak <= est,
            "{label}: peak {peak:.0} MiB above the estimate {est:.0} MiB"
        );
        assert!(
            est <= 4.0 * peak,
            "{label}: estimate {est:.0} MiB, peak {peak:.0} MiB"
        );
    }
}
