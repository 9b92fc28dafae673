//! Integration tests: run the real `mmulab` binary (ripgrep's tests/util.rs
//! style) on small specs the tests write themselves.

use std::path::PathBuf;
use std::process::{Command, Output};

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
    let d = std::env::temp_dir().join(format!("mmulab-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn results(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap()
}

#[test]
fn tester_under_global_is_consistent_by_oracle_and_by_its_own_check() {
    let d = tmp("global");
    let o = mmulab(&[
        "run",
        "experiments/tester.toml",
        "--out",
        d.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = results(&d);
    for key in [
        "spec",
        "seed",
        "version",
        "counters",
        "histograms",
        "fits",
        "oracle",
        "workload",
        "host",
    ] {
        assert!(r.get(key).is_some(), "results.json lacks {key}");
    }
    assert_eq!(r["oracle"]["violations"], 0);
    assert_eq!(r["oracle"]["verdict"], "consistent");
    assert_eq!(r["workload"]["verdict"], "consistent");
    assert!(r["host"]["refs_per_second"].as_f64().unwrap() > 0.0);
    assert!(d.join("results.csv").exists());
    assert!(
        stdout(&o).contains("oracle    consistent"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn tester_under_none_is_caught_by_both_checks() {
    let d = tmp("none");
    let o = mmulab(&[
        "run",
        "experiments/tester.toml",
        "--set",
        "protocol=none",
        "--out",
        d.to_str().unwrap(),
    ]);
    // Ran, but the verdict is negative: exit 1 (2 is for bad input).
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let r = results(&d);
    assert!(r["oracle"]["violations"].as_u64().unwrap() > 0);
    assert_eq!(r["oracle"]["verdict"], "inconsistent");
    assert_eq!(r["workload"]["verdict"], "inconsistent");
    let first = &r["oracle"]["first"][0];
    for key in ["cpu", "thread", "va", "time", "op"] {
        assert!(first.get(key).is_some(), "violation report lacks {key}");
    }
}

#[test]
fn broken_protocol_flushing_only_the_initiator_is_caught() {
    let o = mmulab(&[
        "run",
        "experiments/tester.toml",
        "--set",
        "protocol=global-initiator-only",
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["oracle"]["violations"].as_u64().unwrap() > 0);
    assert_eq!(r["workload"]["verdict"], "inconsistent");
}

#[test]
fn same_spec_and_seed_give_identical_results_but_host() {
    let a = tmp("det-a");
    let b = tmp("det-b");
    for d in [&a, &b] {
        let o = mmulab(&[
            "run",
            "experiments/tester.toml",
            "--set",
            "protocol=mach",
            "--set",
            "runs=2",
            "--out",
            d.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let strip = |d: &PathBuf| {
        let mut v = results(d);
        v.as_object_mut().unwrap().remove("host");
        serde_json::to_string(&v).unwrap()
    };
    assert_eq!(strip(&a), strip(&b));
    assert_eq!(
        std::fs::read(a.join("results.csv")).unwrap(),
        std::fs::read(b.join("results.csv")).unwrap()
    );
}

#[test]
fn spec_errors_exit_2_and_name_the_key() {
    for (set, key) in [
        ("machine.cpus=0", "machine.cpus"),
        ("machine.tlb.ways=128", "machine.tlb.ways"),
        ("preset=\"atari-1985\"", "preset"),
        ("machine.colour=3", "colour"),
        ("protocol=\"magic\"", "protocol"),
    ] {
        let o = mmulab(&["run", "experiments/tester.toml", "--set", set]);
        assert_eq!(o.status.code(), Some(2), "{set}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(key),
            "{set}: error does not name {key}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn check_passes_for_mach_and_catches_none_with_a_replay_command() {
    let o = mmulab(&["check", "--protocol", "mach", "--seeds", "40", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["violations"], 0);
    assert_eq!(r["seeds"], 40);

    let o = mmulab(&["check", "--protocol", "none", "--seeds", "20", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        r["seeds_with_violations"].as_u64().unwrap() >= 15,
        "none should be caught on nearly every seed: {r}"
    );
    let replay = r["first_failing"]["replay"].as_str().unwrap().to_string();
    assert!(replay.starts_with("mmulab check --protocol none --start "));
    // The replay command reproduces the failure.
    let args: Vec<&str> = replay.split_whitespace().skip(1).collect();
    let o = mmulab(&args);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn broken_mach_variants_are_caught() {
    for p in ["mach-no-wait", "mach-flush-before-unlock"] {
        let o = mmulab(&["check", "--protocol", p, "--seeds", "60", "--json"]);
        assert_eq!(o.status.code(), Some(1), "{p} was not caught");
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(r["violations"].as_u64().unwrap() > 0, "{p}: {r}");
    }
}

#[test]
fn list_names_presets_protocols_and_workloads() {
    let o = mmulab(&["list"]);
    let s = stdout(&o);
    for name in [
        "encore-multimax-1989",
        "black89",
        "none",
        "global",
        "mach",
        "tester",
        "bench",
        "random",
    ] {
        assert!(s.contains(name), "list lacks {name}");
    }
}

/// Both benches report refs/s; the unitd one also the memory behaviour
/// behind it: a word-stride sweep starts a new cache line every eighth
/// reference, a line-stride one nearly every reference (on romanescu10's
/// machine, nearly all misses to memory).
#[test]
fn bench_json_reports_refs_per_second() {
    for (workload, stride) in [("foundation", "8"), ("unitd", "8"), ("unitd", "64")] {
        let o = mmulab(&[
            "bench",
            "--workload",
            workload,
            "--stride",
            stride,
            "--json",
            "--runs",
            "1",
            "--refs-per-thread",
            "20000",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(r["refs_per_second"].as_f64().unwrap() > 0.0);
        assert_eq!(r["stride_bytes"].to_string(), stride);
        let about = r["workload"].as_str().unwrap();
        assert!(about.contains(&format!("{stride}-byte stride")), "{about}");
        let m = &r["memory"];
        if workload == "foundation" {
            assert!(about.contains("16 threads"));
            assert!(m.is_null(), "flat memory has no hit rates: {m}");
            continue;
        }
        let l1 = m["l1d_hit_pct"].as_f64().unwrap();
        let cyc = m["simulated_cycles_per_ref"].as_f64().unwrap();
        if stride == "8" {
            assert!(
                (80.0..90.0).contains(&l1),
                "7 of 8 words hit their line: {l1}%"
            );
            assert!(cyc < 40.0, "one miss in eight: {cyc} cycles per reference");
        } else {
            assert!(l1 < 20.0, "a line-stepping sweep mostly misses L1D: {l1}%");
            assert!(cyc > 100.0, "a directory miss costs over 100 cycles: {cyc}");
        }
        let l2 = m["l2_hit_pct"].as_f64().unwrap();
        assert!((0.0..=100.0).contains(&l2), "{l2}");
    }
}

/// `bench --compare` prints the ratio to a saved result (JSON `compare`),
/// and refuses a saved result of another stride, naming the key, before
/// it runs anything.
#[test]
fn bench_compare_prints_the_ratio_and_refuses_another_stride() {
    let d = tmp("bench-compare");
    let small = ["--runs", "1", "--refs-per-thread", "20000"];
    let o = mmulab(&[&["bench", "--json"][..], &small].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = d.join("ref.json");
    std::fs::write(&saved, &o.stdout).unwrap();
    let saved_rate =
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["refs_per_second"]
            .as_f64()
            .unwrap();
    let reference = saved.to_str().unwrap();
    let o = mmulab(&[&["bench", "--json", "--compare", reference][..], &small].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &r["compare"];
    assert_eq!(c["refs_per_second"].as_f64(), Some(saved_rate));
    let expect = r["refs_per_second"].as_f64().unwrap() / saved_rate;
    assert!((c["ratio"].as_f64().unwrap() - expect).abs() < 1e-12, "{c}");
    let o = mmulab(&[&["bench", "--compare", reference][..], &small].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("x {reference}")),
        "{}",
        stdout(&o)
    );
    let o = mmulab(
        &[
            &["bench", "--stride", "64", "--compare", reference][..],
            &small,
        ]
        .concat(),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`stride_bytes`"), "{}", stderr(&o));
}

/// A stride that is not a whole number of words is refused, naming the key.
#[test]
fn bench_refuses_a_stride_off_word_boundaries() {
    for stride in ["0", "12", "8192"] {
        let o = mmulab(&["bench", "--stride", stride, "--runs", "1"]);
        assert_eq!(o.status.code(), Some(2), "--stride {stride}");
        assert!(
            stderr(&o).contains("workload.stride_bytes"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn watchdog_reports_a_spin_past_its_bound_with_the_seed() {
    let o = mmulab(&[
        "run",
        "experiments/tester.toml",
        "--set",
        "protocol=mach",
        "--set",
        "engine.spin_bound=2",
        "--json",
    ]);
    // A liveness failure is a negative verdict: exit 1.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let l = &r["liveness"][0];
    assert_eq!(l["seed"], 1);
    assert!(
        l["waiting_for"]
            .as_str()
            .unwrap()
            .contains("mach initiator"),
        "{l}"
    );
    assert_eq!(
        r["workload"]["verdict"], "inconsistent",
        "an unfinished tester is not a pass"
    );
}

#[test]
fn tester_with_more_children_than_counters_per_page_finishes() {
    let o = mmulab(&[
        "run",
        "experiments/tester.toml",
        "--set",
        "protocol=mach",
        "--set",
        "preset=\"generic\"",
        "--set",
        "machine.cpus=520",
        "--set",
        "workload.children=519",
        "--set",
        "workload.warmup_cycles=2000",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["workload"]["verdict"], "consistent", "{}", r["workload"]);
    assert_eq!(r["workload"]["figures"]["children_faulted"], 519.0);
    assert_eq!(r["oracle"]["violations"], 0);
}

#[test]
fn trace_sim_json_and_malformed_lines() {
    let o = mmulab(&[
        "trace",
        "sim",
        "crates/trace/tests/fixtures/fork-child.lackey.log",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["refs"].as_u64().unwrap() > 0);
    assert!(r["misses"].as_u64().unwrap() > 0);
    let d = tmp("badtrace");
    let bad = d.join("bad.log");
    std::fs::write(&bad, " L 1000,4\n Q junk\n").unwrap();
    let o = mmulab(&["trace", "sim", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("bad.log:2") && e.contains("Q junk"), "{e}");
}

/// `trace sim` with lists prints one row per configuration (entries, then
/// ways, then policy), each equal to a separate run of that configuration.
#[test]
fn trace_sim_lists_equal_separate_runs() {
    let trace = "crates/trace/tests/fixtures/synthetic.lackey.log";
    let o = mmulab(&[
        "trace",
        "sim",
        trace,
        "--entries",
        "16,64",
        "--ways",
        "1,full",
        "--policy",
        "lru,fifo",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows.len(), 8);
    let mut i = 0;
    for entries in ["16", "64"] {
        for ways in ["1", "full"] {
            for policy in ["lru", "fifo"] {
                let mut args = vec!["trace", "sim", trace, "--entries", entries];
                if ways != "full" {
                    args.extend(["--ways", ways]);
                }
                args.extend(["--policy", policy, "--json"]);
                let o = mmulab(&args);
                assert!(o.status.success(), "{}", stderr(&o));
                let alone: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                assert_eq!(rows[i], alone, "{entries} {ways} {policy}");
                i += 1;
            }
        }
    }
    let o = mmulab(&[
        "trace",
        "sim",
        trace,
        "--entries",
        "16,64",
        "--ways",
        "1,full",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 4, "{}", stdout(&o));
}

#[test]
fn dsm_bench_quick_json_has_the_contract_keys() {
    let o = mmulab(&["dsm", "bench", "--quick", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["remote_fault_ns"]["p50"].as_f64().unwrap() > 0.0);
    assert!(r["remote_fault_ns"]["p99"].as_f64().unwrap() > 0.0);
    assert!(r["limit_ns"].as_f64().unwrap() > 0.0);
    assert!(r["ratio"].as_f64().unwrap() > 0.0);
    assert_eq!(r["stale_reads"], 0);
}

/// `mmulab dsm bench --quick` (about 10 s; one process per site, so the
/// real binary): the ping-pong and read-writer sweeps have rows with real
/// numbers and the verdict lines are there, in text and JSON. A shape
/// check of the output, not of the measurement: the verdicts may say no.
#[test]
fn dsm_bench_quick_prints_sweep_rows_and_verdicts() {
    let o = mmulab(&["dsm", "bench", "--quick"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(text.matches("ping-pong Δ=").count(), 6, "{text}");
    assert_eq!(text.matches("read-writers Δ=").count(), 5, "{text}");
    assert!(
        text.contains("verdict ping-pong: yield best at Δ=0: "),
        "{text}"
    );
    assert!(
        text.contains("verdict read-writers: optimum at Δ="),
        "{text}"
    );
    assert!(
        text.contains("site a pinned to CPU") || text.contains("one CPU only"),
        "{text}"
    );
    for line in text
        .lines()
        .filter(|l| l.contains(" Δ=") && !l.starts_with("verdict"))
    {
        assert!(line.contains("stale reads 0"), "{line}");
        assert!(!line.contains(":        0.0 "), "{line}");
    }
    let o = mmulab(&["dsm", "bench", "--quick", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pp = r["pingpong"].as_array().unwrap();
    assert_eq!(pp.len(), 6);
    assert!(pp.iter().all(|p| p["cycles_per_s"].as_f64().unwrap() > 0.0
        && p["messages_per_cycle"].as_f64().unwrap() > 0.0
        && p["fault_ns"]["p90"].as_u64().is_some()));
    let rw = r["read_writers"].as_array().unwrap();
    assert_eq!(rw.len(), 5);
    assert!(rw.iter().all(
        |p| p["decrements"] == 2 * mmulab_mirage::runtime::bench::RW_COUNT && p["stale_reads"] == 0
    ));
    assert!(r["shapes"]["pingpong_yield_best_at_zero"].is_boolean());
    assert!(r["shapes"]["rw_paper_shape"].is_boolean());
}

/// Site daemons started by a test; killed if the test fails before
/// stopping them.
struct DsmSites(Vec<std::process::Child>);

impl Drop for DsmSites {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes a two-site `cluster.toml` (sockets in `dir`), starts both
/// daemons and waits (bounded) for their local sockets.
fn dsm_cluster(dir: &std::path::Path) -> (PathBuf, DsmSites) {
    let config = dir.join("cluster.toml");
    let key = mmulab(&[
        "dsm",
        "keygen",
        "-o",
        dir.join("cluster.key").to_str().unwrap(),
    ]);
    assert!(key.status.success(), "{}", stderr(&key));
    let mut text = format!(
        "cluster_id = {}\nkey_file = \"cluster.key\"\n",
        std::process::id()
    );
    for name in ["a", "b"] {
        text.push_str(&format!(
            "[[site]]\nname = \"{name}\"\naddr = \"127.0.0.1:{}\"\nsocket = \"{}\"\n",
            free_port(),
            dir.join(format!("{name}.sock")).display()
        ));
    }
    std::fs::write(&config, text).unwrap();
    let mut sites = DsmSites(Vec::new());
    for name in ["a", "b"] {
        sites.0.push(
            Command::new(env!("CARGO_BIN_EXE_mmulab"))
                .args(["dsm", "site", "--config"])
                .arg(&config)
                .args(["--name", name])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !(dir.join("a.sock").exists() && dir.join("b.sock").exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "site sockets never appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (config, sites)
}

/// A child's output, killing it (and failing) past 60 s.
fn bounded_output(mut child: std::process::Child) -> Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("no exit in 60 s: {} {}", stdout(&o), stderr(&o));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// fleisch89 Fig. 4's ping-pong in C (examples/c/pingpong.c), unmodified
/// System V calls, one process on each of two sites, started with
/// `mmulab dsm run`; `mmulab dsm status` lists both sites; SIGTERM stops a
/// daemon cleanly, and its peer logs nothing about it.
#[test]
fn dsm_run_pingpong_in_c_on_two_sites() {
    let dir = tmp("dsm-pingpong");
    let prog = dir.join("pingpong");
    let built = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&prog)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/c/pingpong.c"))
        .output();
    match built {
        Err(e) => {
            eprintln!("skipped: no C compiler (cc: {e})");
            return;
        }
        Ok(o) => assert!(o.status.success(), "cc: {}", stderr(&o)),
    }
    let (config, mut sites) = dsm_cluster(&dir);
    let cfg = config.to_str().unwrap();
    let run = |site: &str, role: &str| {
        Command::new(env!("CARGO_BIN_EXE_mmulab"))
            .args(["dsm", "run", "--config", cfg, "--site", site, "--"])
            .arg(&prog)
            .args([role, "100"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (p1, p2) = (run("a", "1"), run("b", "2"));
    let (o1, o2) = (bounded_output(p1), bounded_output(p2));
    assert!(o1.status.success(), "{} {}", stdout(&o1), stderr(&o1));
    assert!(o2.status.success(), "{} {}", stdout(&o2), stderr(&o2));
    assert!(stdout(&o1).contains("100 cycles") && stdout(&o1).contains("0 bad pairs"));
    assert!(stdout(&o2).contains("100 cycles") && stdout(&o2).contains("0 bad pairs"));
    let st = mmulab(&["dsm", "status", "--config", cfg, "--site", "b"]);
    assert!(st.status.success(), "{}", stderr(&st));
    let text = stdout(&st);
    assert!(
        text.contains("site b (id 1)") && text.contains("sites:"),
        "{text}"
    );
    // --json: the same status as named fields (it wrapped the text's
    // lines before).
    let st = mmulab(&["dsm", "status", "--config", cfg, "--site", "b", "--json"]);
    assert!(st.status.success(), "{}", stderr(&st));
    let j: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(j["site"], "b", "{j}");
    assert_eq!(j["id"], 1);
    let peers = j["sites"].as_array().unwrap();
    assert_eq!(peers.len(), 2);
    assert_eq!(
        (peers[0]["name"].as_str(), peers[0]["state"].as_str()),
        (Some("a"), Some("alive")),
        "{j}"
    );
    assert!(peers[0]["heard_ms_ago"].is_u64() && peers[0]["addr"].is_string());
    assert_eq!(peers[1]["state"], "this site");
    assert_eq!(j["semantics"], "sysv");
    assert!(j["segments"].is_array() && j["shmids"].is_array() && j["lost_pages"].is_array());
    // A clean stop on SIGTERM.
    let a = sites.0.remove(0);
    let killed = Command::new("kill")
        .args(["-TERM", &a.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = bounded_output(a);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("site a stopped"), "{}", stderr(&out));
    // A clean stop is not an event worth a line per connection: a said
    // goodbye on each of its connections, so b (stopped in turn) logged
    // nothing about them. Before the goodbye frame, b printed "site a
    // (...): connection ended: connection closed" for each.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let b = sites.0.remove(0);
    let killed = Command::new("kill")
        .args(["-TERM", &b.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = bounded_output(b);
    let err_b = stderr(&out);
    assert!(err_b.contains("site b stopped"), "{err_b}");
    let about_a: Vec<&str> = err_b
        .lines()
        .filter(|l| {
            l.contains("site a") && (l.contains("connection ended") || l.contains("dropped"))
        })
        .collect();
    assert!(about_a.is_empty(), "b logged a's clean stop: {about_a:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// romanescu10: a small single_unmap on the x86-simics-2010 machine.
fn unitd_spec(dir: &std::path::Path, protocol: &str) -> PathBuf {
    let p = dir.join("unitd.toml");
    std::fs::write(
        &p,
        format!(
            "protocol = \"{protocol}\"\npreset = \"x86-simics-2010\"\n\
             [machine]\ncpus = 4\n\
             [memory.interconnect]\nkind = \"directory\"\nmesh_cols = 2\nmesh_rows = 2\nhop_cycles = 2\ndir_cycles = 6\n\
             [workload]\nkind = \"unitd-micro\"\nop = \"unmap\"\nfile_pages = 400\nshootdowns = 100\n"
        ),
    )
    .unwrap();
    p
}

#[test]
fn unitd_runs_consistent_deterministic_and_faster_than_linux() {
    let d = tmp("unitd");
    let mut runtime = std::collections::BTreeMap::new();
    for protocol in ["linux", "unitd", "ideal"] {
        let spec = unitd_spec(&d, protocol);
        let mut outs = Vec::new();
        for _ in 0..2 {
            let o = mmulab(&["run", spec.to_str().unwrap(), "--json"]);
            assert!(o.status.success(), "{protocol}: {}", stderr(&o));
            let mut r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(r["oracle"]["verdict"], "consistent", "{protocol}: {r}");
            assert_eq!(r["workload"]["verdict"], "consistent", "{protocol}");
            assert_eq!(r["counters"]["mem.checker_violations"], 0, "{protocol}");
            r.as_object_mut().unwrap().remove("host");
            outs.push(r);
        }
        assert_eq!(outs[0], outs[1], "{protocol}: same spec and seed differ");
        runtime.insert(
            protocol,
            outs[0]["workload"]["figures"]["runtime_cycles"]
                .as_f64()
                .unwrap(),
        );
        let c = &outs[0]["counters"];
        match protocol {
            "linux" => assert_eq!(c["shootdown.user.events"], 100),
            "unitd" => {
                assert!(
                    c.get("shootdown.user.events").is_none(),
                    "unitd shoots down"
                );
                assert!(c["mem.pcam_hits"].as_u64().unwrap() > 0, "no PCAM hit: {c}");
                assert!(c["mem.jetty_filtered"].as_u64().unwrap() > 0, "Jetty idle");
            }
            _ => {}
        }
    }
    assert!(
        runtime["unitd"] < runtime["linux"],
        "UNITD should beat the shootdown baseline: {runtime:?}"
    );
}

#[test]
fn unitd_check_passes_and_every_broken_variant_is_caught() {
    for p in ["unitd", "ideal", "linux"] {
        let o = mmulab(&["check", "--protocol", p, "--seeds", "60", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{p}: {}", stdout(&o));
    }
    for p in [
        "unitd-no-pcam",
        "unitd-snoop-skips-pcam",
        "unitd-no-self-snoop",
        "unitd-directory-forgets-tlb",
        "unitd-jetty-misses-insert",
        "unitd-ack-before-invalidate",
        "unitd-upper-level-only",
        "unitd-no-replay",
        "unitd-swtlb-no-pte-address",
        "linux-lazy-skips-flush",
    ] {
        let o = mmulab(&["check", "--protocol", p, "--seeds", "60", "--json"]);
        assert_eq!(o.status.code(), Some(1), "{p} was not caught");
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(r["violations"].as_u64().unwrap() > 0, "{p}: {r}");
    }
}

#[test]
fn unitd_spec_errors_exit_2_and_name_the_key() {
    let d = tmp("unitd-bad");
    let spec = unitd_spec(&d, "unitd");
    let s = spec.to_str().unwrap();
    // unitd on flat memory (no [memory] table, no preset giving one).
    let flat = d.join("flat.toml");
    std::fs::write(
        &flat,
        "protocol = \"unitd\"\n[workload]\nkind = \"unitd-micro\"\nop = \"unmap\"\nfile_pages = 400\n",
    )
    .unwrap();
    let o = mmulab(&["run", flat.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("protocol"), "{}", stderr(&o));
    let cases: &[(&[&str], &str)] = &[
        (&["memory.l1d.size_bytes=100000"], "memory.l1d"),
        (&["memory.l2.block_bytes=128"], "memory.l"),
        (&["memory.pcam_entries=32"], "memory.pcam_entries"),
        (&["memory.tlbs_per_core=1"], "memory.tlbs_per_core"),
        (&["machine.tlb.refill=bogus"], "machine.tlb.refill"),
        (&["machine.cpus=8"], "memory.interconnect"),
        (&["workload.shootdowns=401"], "workload.shootdowns"),
        (&["memory.bogus=1"], "bogus"),
    ];
    for (sets, key) in cases {
        let mut args = vec!["run", s];
        for set in *sets {
            args.push("--set");
            args.push(set);
        }
        let o = mmulab(&args);
        assert_eq!(o.status.code(), Some(2), "{sets:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(key), "{sets:?}: {}", stderr(&o));
    }
}

/// `--experiments` names where every paper's specs live, fleisch89's too.
#[test]
fn reproduce_fleisch89_reads_its_specs_from_experiments() {
    let out = mmulab(&[
        "reproduce",
        "fleisch89",
        "--experiments",
        "/nonexistent-mmulab-specs",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent-mmulab-specs/fleisch89/"),
        "{err}"
    );
}

/// Output into a pipe whose reader is gone (`mmulab list | head -1`): the
/// command ends as Unix tools do (SIGPIPE), not with a panic on EPIPE.
#[test]
fn a_closed_output_pipe_ends_the_command_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    // The read end is closed before the child starts: closing it after the
    // spawn raced the child, whose small output could fit the pipe's buffer
    // first and end with status 0.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_mmulab"))
        .arg("list")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.signal(), Some(13), "{:?}; {err}", out.status);
}
