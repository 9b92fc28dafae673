//! `mmulab sweep`: the real binary on small sweeps the tests write. The
//! merged results must be the same bytes however the tasks ran: one
//! thread, two threads, two shards, a killed run resumed, or a Slurm
//! job array on the one-node cluster of scripts/slurm-local.sh.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn mmulab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mmulab"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("runs")
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mmulab-sweep-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A 2x2 grid x 4 seeds over the tester: 16 tasks. Disabled-interrupt
/// windows drawn from the seed make the seeds differ.
const GRID: &str = r#"base = "experiments/tester.toml"
seeds = { start = 1, count = 4 }
[grid]
protocol = ["mach", "global"]
"machine.cpus" = [12, 16]
"kernel.trap_disabled_mean_cycles" = [3000]
"#;

fn write_sweep(dir: &Path, text: &str) -> String {
    let p = dir.join("grid.toml");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn sweep(args: &[&str]) -> Output {
    let mut a = vec!["sweep"];
    a.extend_from_slice(args);
    mmulab(&a)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The merged results whose bytes must not depend on how tasks ran.
fn merged(dir: &Path) -> (String, String) {
    (
        read(&dir.join("results.csv")),
        read(&dir.join("summary.csv")),
    )
}

fn assert_same(a: &Path, b: &Path) {
    let (ra, sa) = merged(a);
    let (rb, sb) = merged(b);
    assert!(
        ra == rb,
        "results.csv of {} and {} differ",
        a.display(),
        b.display()
    );
    assert!(
        sa == sb,
        "summary.csv of {} and {} differ",
        a.display(),
        b.display()
    );
}

#[test]
fn jobs_1_jobs_2_and_two_merged_shards_give_the_same_bytes() {
    let t = tmp("identical");
    let s = write_sweep(&t, GRID);
    let one = t.join("jobs1");
    let two = t.join("jobs2");
    let shards = t.join("shards");
    let o = sweep(&[&s, "--out", one.to_str().unwrap(), "--jobs", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = sweep(&[&s, "--out", two.to_str().unwrap(), "--jobs", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    for shard in ["1/2", "0/2"] {
        let o = sweep(&[&s, "--out", shards.to_str().unwrap(), "--shard", shard]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(!shards.join("results.csv").exists(), "a shard merged");
    }
    let o = sweep(&["merge", shards.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_same(&one, &two);
    assert_same(&one, &shards);

    // The tidy contract: key columns, then seed, metric, value, unit,
    // oracle; every task's metrics; seeds that differ.
    let (results, summary) = merged(&one);
    let mut rows = csv::Reader::from_reader(results.as_bytes());
    let header: Vec<String> = rows.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(
        header,
        [
            "kernel.trap_disabled_mean_cycles",
            "machine.cpus",
            "protocol",
            "seed",
            "metric",
            "value",
            "unit",
            "oracle"
        ]
    );
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    let cycles: Vec<(&str, &str, &str, f64)> = rows
        .iter()
        .filter(|r| &r[4] == "simulated_cycles")
        .map(|r| (&r[1], &r[2], &r[3], r[5].parse().unwrap()))
        .collect();
    assert_eq!(cycles.len(), 16, "one simulated_cycles row per task");
    assert!(rows.iter().all(|r| &r[7] == "consistent"));
    let mach12: Vec<f64> = cycles
        .iter()
        .filter(|c| c.0 == "12" && c.1 == "mach")
        .map(|c| c.3)
        .collect();
    assert_eq!(mach12.len(), 4);
    assert!(
        mach12.iter().any(|c| *c != mach12[0]),
        "the seeds should differ: {mach12:?}"
    );
    // summary.csv: the mean of those four, and a CI around it.
    let mut sum = csv::Reader::from_reader(summary.as_bytes());
    let h: Vec<String> = sum.headers().unwrap().iter().map(String::from).collect();
    for col in [
        "metric",
        "unit",
        "n",
        "mean",
        "sd",
        "ci95_low",
        "ci95_high",
        "median",
        "p5",
        "p95",
        "oracle",
    ] {
        assert!(h.iter().any(|c| c == col), "summary.csv lacks {col}: {h:?}");
    }
    let at = |name: &str| h.iter().position(|c| c == name).unwrap();
    let row = sum
        .records()
        .map(Result::unwrap)
        .find(|r| &r[1] == "12" && &r[2] == "mach" && &r[at("metric")] == "simulated_cycles")
        .expect("a summary row");
    let mean: f64 = row[at("mean")].parse().unwrap();
    let want = mach12.iter().sum::<f64>() / 4.0;
    assert!((mean - want).abs() < 1e-6 * want, "{mean} vs {want}");
    let (lo, hi): (f64, f64) = (
        row[at("ci95_low")].parse().unwrap(),
        row[at("ci95_high")].parse().unwrap(),
    );
    assert!(lo < mean && mean < hi, "{lo} {mean} {hi}");
    assert_eq!(&row[at("n")], "4");

    // manifest.json: the build, the plan, and every task done.
    let m: serde_json::Value = serde_json::from_str(&read(&one.join("manifest.json"))).unwrap();
    for key in [
        "schema_version",
        "mmulab_version",
        "git_commit",
        "binary",
        "binary_sha256",
        "sweep_sha256",
        "base",
        "tasks",
        "points",
        "columns",
    ] {
        assert!(m.get(key).is_some(), "manifest.json lacks {key}");
    }
    assert_eq!(m["base"]["sha256"].as_str().unwrap().len(), 64);
    let tasks = m["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 16);
    assert!(tasks.iter().all(|t| t["status"] == "done"), "{tasks:?}");
    assert_eq!(tasks[5]["id"], "p1-s2");

    let o = sweep(&["status", shards.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("done 16 of 16 tasks"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn a_killed_sweep_resumes_and_reruns_only_the_torn_task() {
    let t = tmp("resume");
    let s = write_sweep(&t, GRID);
    let full = t.join("full");
    let o = sweep(&[&s, "--out", full.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));

    // Half the tasks, then a torn last line: the process was killed while
    // writing its eighth record.
    let d = t.join("killed");
    let o = sweep(&[&s, "--out", d.to_str().unwrap(), "--shard", "0/2"]);
    assert!(o.status.success(), "{}", text(&o));
    let part = std::fs::read_dir(d.join("parts"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    let body = read(&part);
    assert_eq!(body.lines().count(), 8);
    std::fs::write(&part, &body[..body.len() - 20]).unwrap();

    let o = sweep(&["merge", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("9 of 16 tasks are not done"),
        "{}",
        text(&o)
    );
    let o = sweep(&[&s, "--out", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "without --resume: {}", text(&o));
    assert!(text(&o).contains("pass --resume"), "{}", text(&o));

    let o = sweep(&[&s, "--out", d.to_str().unwrap(), "--resume"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("ran 9 (7 already done)"), "{}", text(&o));
    assert_same(&full, &d);
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn bad_sweep_input_exits_2_naming_it_before_any_task_runs() {
    let t = tmp("bad");
    let out = t.join("out");
    let cases = [
        (
            GRID.replace("\"machine.cpus\"", "\"machine.cpuz\""),
            "machine.cpuz",
        ),
        (
            GRID.replace("[12, 16]", "[12, 0]"),
            "point 2 (kernel.trap_disabled_mean_cycles=3000, machine.cpus=0, protocol=\"mach\"): machine.cpus: must be 1 to 1024",
        ),
        (
            GRID.replace("protocol = [", "seed = [1]\nprotocol = ["),
            "`seed` cannot be swept",
        ),
        (GRID.replace("count = 4", "count = 0"), "seeds.count"),
        (
            GRID.replace("experiments/tester.toml", "no/such.toml"),
            "no spec `no/such.toml`",
        ),
        (GRID.replace("[grid]", "gird = 1\n[grid]"), "gird"),
    ];
    for (sweep_text, named) in cases {
        let s = write_sweep(&t, &sweep_text);
        let o = sweep(&[&s, "--out", out.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{named}: {}", text(&o));
        assert!(
            text(&o).contains(named),
            "expected `{named}` in: {}",
            text(&o)
        );
        assert!(
            !out.exists(),
            "{named}: the folder was made before validation"
        );
    }
    let s = write_sweep(&t, GRID);
    let o = sweep(&[&s, "--out", out.to_str().unwrap(), "--shard", "2/2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // A folder of another sweep is never added to, even with --resume.
    let o = sweep(&[&s, "--out", out.to_str().unwrap(), "--shard", "0/4"]);
    assert!(o.status.success(), "{}", text(&o));
    let other = write_sweep(&t, &GRID.replace("count = 4", "count = 5"));
    let o = sweep(&[&other, "--out", out.to_str().unwrap(), "--resume"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("holds another sweep"), "{}", text(&o));
    // Nor is a folder that holds something else.
    let o = sweep(&[&s, "--out", t.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("holds no sweep"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn a_check_sweep_agrees_with_mmulab_check_and_catches_the_negative_control() {
    let t = tmp("check");
    let s = write_sweep(
        &t,
        "kind = \"check\"\nseeds = { start = 1, count = 40 }\n[grid]\nprotocol = [\"mach\", \"none\"]\n",
    );
    let d = t.join("out");
    let o = sweep(&[&s, "--out", d.to_str().unwrap(), "--jobs", "2"]);
    // `none` never shoots: the oracle catches it, and the sweep exits 1.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = |p: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("check {p}:")))
            .unwrap_or_else(|| panic!("no check line for {p}: {out}"))
            .to_string()
    };
    let c = mmulab(&["check", "--protocol", "mach", "--seeds", "40", "--json"]);
    assert!(c.status.success(), "{}", text(&c));
    let r: serde_json::Value = serde_json::from_slice(&c.stdout).unwrap();
    let mach = line("mach");
    assert!(
        mach.contains(&format!(
            "{} translation uses checked, {} shootdown interrupts; violations: 0",
            r["checked_uses"], r["shootdowns"]
        )),
        "sweep: {mach}\ncheck: {r}"
    );
    let none = line("none");
    assert!(!none.contains("violations: 0 "), "{none}");
    assert!(
        out.contains("replay: mmulab check --protocol none --start"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&t);
}

/// Whether the one-node cluster answers; starts it (as root, when Slurm
/// is installed) with scripts/slurm-local.sh when it does not.
fn slurm_ready() -> Result<(), String> {
    let idle = || -> Result<(), String> {
        let o = Command::new("sinfo")
            .args(["-h", "-o", "%T"])
            .output()
            .map_err(|e| format!("sinfo: {e}"))?;
        let states = String::from_utf8_lossy(&o.stdout).into_owned();
        if o.status.success()
            && states.lines().any(|s| {
                ["idle", "mixed", "allocated"]
                    .iter()
                    .any(|k| s.starts_with(k))
            })
        {
            Ok(())
        } else {
            Err(format!(
                "sinfo: {} {}",
                states.trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    };
    let Err(first) = idle() else {
        return Ok(());
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-local.sh");
    let o = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("{first}; cannot run bash {}: {e}", script.display()))?;
    if !o.status.success() {
        return Err(format!(
            "{first}; scripts/slurm-local.sh failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    idle()
}

#[test]
fn a_slurm_job_array_gives_the_same_bytes_as_local() {
    if let Err(why) = slurm_ready() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set, so this test may not be skipped: Slurm cannot start: {why}"
        );
        // Straight to the process's stderr: the harness swallows
        // eprintln! of a passing test, and a skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED a_slurm_job_array_gives_the_same_bytes_as_local: Slurm cannot start here ({why}); scripts/slurm-local.sh sets it up as root"
        );
        return;
    }
    let t = tmp("slurm");
    // chunk = 4: four array tasks of one point (4 seeds) each.
    let s = write_sweep(&t, &format!("chunk = 4\n{GRID}"));
    let local = t.join("local");
    let slurm = t.join("slurm");
    let o = sweep(&[&s, "--out", local.to_str().unwrap(), "--jobs", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = sweep(&[
        &s,
        "--out",
        slurm.to_str().unwrap(),
        "--backend",
        "slurm",
        "--wait",
        "--slurm-arg=--time=00:05:00",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("array 0-3: 4 array task(s)"),
        "{}",
        text(&o)
    );
    assert_same(&local, &slurm);
    let m: serde_json::Value = serde_json::from_str(&read(&slurm.join("manifest.json"))).unwrap();
    let jobs = m["slurm_jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{m}");
    assert!(jobs[0]["job_id"].as_str().unwrap().parse::<u64>().is_ok());
    let script = read(&slurm.join("slurm/job-0.sh"));
    assert!(script.contains("#SBATCH --time=00:05:00"), "{script}");
    assert!(
        script.contains("--shard \"$SLURM_ARRAY_TASK_ID/4\""),
        "{script}"
    );
    // Four array tasks, each its own part file.
    assert_eq!(std::fs::read_dir(slurm.join("parts")).unwrap().count(), 4);
    // Submitting again finds nothing to do.
    let o = sweep(&[
        &s,
        "--out",
        slurm.to_str().unwrap(),
        "--backend",
        "slurm",
        "--resume",
        "--wait",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("all done already"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&t);
}

/// `mmulab reproduce balan92 --quick --json` on this machine's cores, run
/// once for the tests that compare with it.
fn balan92_local() -> &'static serde_json::Value {
    static R: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        let o = mmulab(&["reproduce", "balan92", "--quick", "--json"]);
        assert!(o.status.code().is_some_and(|c| c <= 1), "{}", text(&o));
        serde_json::from_slice(&o.stdout).expect("JSON")
    })
}

/// The reproduction's row `quantity` of `artefact` at `conditions`.
fn row(report: &serde_json::Value, artefact: &str, quantity: &str, at: serde_json::Value) -> f64 {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["artefact"] == artefact && r["quantity"] == quantity && r["conditions"] == at)
        .unwrap_or_else(|| panic!("no row {artefact} {quantity} at {at}"))["mmulab"]
        .as_f64()
        .unwrap()
}

/// results.csv's `metric` for the tasks whose key columns hold `at`.
fn metric(results: &str, metric: &str, at: &[(&str, &str)]) -> Vec<String> {
    let mut r = csv::Reader::from_reader(results.as_bytes());
    let h = r.headers().unwrap().clone();
    let col = |n: &str| {
        h.iter()
            .position(|x| x == n)
            .unwrap_or_else(|| panic!("no column {n}"))
    };
    let (m, v) = (col("metric"), col("value"));
    let keys: Vec<(usize, &str)> = at.iter().map(|(k, x)| (col(k), *x)).collect();
    r.records()
        .map(|x| x.unwrap())
        .filter(|x| x[m] == *metric && keys.iter().all(|(c, val)| &x[*c] == *val))
        .map(|x| x[v].to_string())
        .collect()
}

/// A reproduction's sweep file run by hand (`mmulab sweep FILE --quick`)
/// gives the numbers the reproduction's rows show: Fig. 4's speedups from
/// the tasks' simulated cycles, Fig. 1's means from the initiator's
/// histogram.
#[test]
fn balan92s_sweep_files_run_by_hand_give_the_reproductions_numbers() {
    let rep = balan92_local();
    let d = tmp("balan92-by-hand");
    let f4 = d.join("fig4");
    let o = sweep(&[
        "experiments/balan92/fig4-fork.sweep.toml",
        "--quick",
        "--out",
        f4.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let results = read(&f4.join("results.csv"));
    let mut compared = 0;
    for test in ["fork-exit", "fork-exec-exit", "fork-sbrk-exit"] {
        let t = |k: u64| -> f64 {
            let ks = k.to_string();
            let v = metric(
                &results,
                "simulated_cycles",
                &[
                    ("workload.test", test),
                    ("workload.copies", &ks),
                    ("workload.repeats", "3"),
                ],
            );
            assert_eq!(v.len(), 1, "{test} x{k}: {v:?}");
            v[0].parse().unwrap()
        };
        for k in 1..=4u64 {
            let by_hand = k as f64 * t(1) / t(k);
            let shown = row(
                rep,
                "Fig. 4",
                "speedup",
                serde_json::json!({"copies": k, "cpus": 4, "test": test}),
            );
            // The same arithmetic on the same cycles; the only slack is
            // serde_json's float parser, which may land one ulp off the
            // shortest text the report printed.
            assert!(
                (by_hand - shown).abs() <= 2.0 * f64::EPSILON * shown.abs(),
                "Fig. 4 {test} x{k}: by hand {by_hand}, reproduction {shown}"
            );
            compared += 1;
        }
    }
    let f1 = d.join("fig1");
    let o = sweep(&[
        "experiments/balan92/fig1-basic.sweep.toml",
        "--quick",
        "--out",
        f1.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let results = read(&f1.join("results.csv"));
    for n in 2..=6u64 {
        let ns = n.to_string();
        let v = metric(
            &results,
            "hat.shutdown.basic.initiator_us.mean",
            &[("machine.cpus", &ns)],
        );
        assert_eq!(v.len(), 1, "cpus={n}: {v:?}");
        let by_hand: f64 = v[0].parse().unwrap();
        let shown = row(
            rep,
            "Fig. 1",
            "basic_initiator_time",
            serde_json::json!({ "cpus": n }),
        );
        // The sweep converts the mean of the cycles to µs, the row takes
        // the mean of the samples in µs: the same number to rounding.
        assert!(
            (by_hand - shown).abs() <= 1e-9 * shown.abs(),
            "Fig. 1 cpus={n}: by hand {by_hand}, reproduction {shown}"
        );
        compared += 1;
    }
    assert_eq!(compared, 17);
    let _ = std::fs::remove_dir_all(&d);
}

/// `mmulab reproduce balan92 --quick --backend slurm` (and fleisch89's):
/// its sweep files run as job arrays, and the report is the local one
/// (but its provenance).
#[test]
fn reproduce_through_slurm_gives_the_local_rows() {
    if let Err(why) = slurm_ready() {
        assert!(
            std::env::var_os("CI").is_none(),
            "Slurm must run in CI: {why}"
        );
        eprintln!("SKIPPED: reproduce through Slurm: Slurm cannot start here: {why}");
        return;
    }
    let d = tmp("reproduce-slurm");
    let o = mmulab(&[
        "reproduce",
        "balan92",
        "--quick",
        "--json",
        "--backend",
        "slurm",
        "--out",
        d.to_str().unwrap(),
    ]);
    assert!(o.status.code().is_some_and(|c| c <= 1), "{}", text(&o));
    let slurm: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let local = balan92_local();
    for k in [
        "rows",
        "headline",
        "seeds",
        "calibration",
        "not_reproduced",
        "quick",
    ] {
        assert_eq!(slurm[k], local[k], "`{k}` differs between Slurm and local");
    }
    // Each sweep file ran as its own sweep folder, merged.
    for name in [
        "fig1-basic-quick",
        "fig2-lazy-quick",
        "fig3-immediate-quick",
        "fig4-fork-quick",
    ] {
        let f = d.join("sweeps/balan92").join(name);
        assert!(f.join("results.csv").is_file(), "{}", f.display());
        let m = read(&f.join("manifest.json"));
        assert!(m.contains("\"slurm_jobs\""), "{m}");
    }
    // fleisch89's Fig. 8 runs on the Mirage simulator
    // (`kind = "mirage-read-writers"`): through Slurm too, with the local
    // rows.
    let run = |backend: &[&str]| -> serde_json::Value {
        let mut a = vec!["reproduce", "fleisch89", "--quick", "--json"];
        a.extend_from_slice(backend);
        let o = mmulab(&a);
        assert!(o.status.code().is_some_and(|c| c <= 1), "{}", text(&o));
        serde_json::from_slice(&o.stdout).expect("JSON")
    };
    let local = run(&[]);
    let slurm = run(&["--backend", "slurm", "--out", d.to_str().unwrap()]);
    for k in ["rows", "headline", "seeds", "calibration", "not_reproduced"] {
        assert_eq!(
            slurm[k], local[k],
            "fleisch89: `{k}` differs between Slurm and local"
        );
    }
    let f = d.join("sweeps/fleisch89/fig8-quick");
    assert!(read(&f.join("manifest.json")).contains("\"slurm_jobs\""));
    let _ = std::fs::remove_dir_all(&d);
}

/// `--json` on `sweep`, `sweep status` and `sweep merge`: the files, the
/// counts and the verdict as fields (progress on stderr, stdout one JSON
/// document), agreeing with each other and with the folder.
#[test]
fn sweep_status_and_merge_print_json() {
    let dir = tmp("json");
    let file = write_sweep(&dir, GRID);
    let out = dir.join("out");
    let o = sweep(&[&file, "--out", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let run: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(run["tasks"], 16, "{run}");
    assert_eq!(run["points"], 4, "{run}");
    assert_eq!(run["inconsistent_tasks"], 0, "{run}");
    let rows = read(&out.join("results.csv")).lines().count() - 1;
    assert_eq!(run["results_rows"], rows, "{run}");

    let o = sweep(&["status", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let st: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(st["kind"], "run", "{st}");
    assert_eq!(st["tasks"], 16, "{st}");
    assert_eq!(st["done"], 16, "{st}");
    assert_eq!(st["pending"], 0, "{st}");
    assert_eq!(st["merged"], true, "{st}");

    let o = sweep(&["merge", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let m: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    assert_eq!(m["results_rows"], run["results_rows"], "{m}");
    assert_eq!(m["summary_rows"], run["summary_rows"], "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `file` (a reproduction's sweep file, `--quick`) on one thread, on
/// two, and as two shards merged, and checks the three give the same
/// bytes; returns the one-thread folder.
fn three_ways_alike(t: &Path, file: &str) -> PathBuf {
    let one = t.join("jobs1");
    let two = t.join("jobs2");
    let shards = t.join("shards");
    for (out, jobs) in [(&one, "1"), (&two, "2")] {
        let o = sweep(&[
            file,
            "--quick",
            "--out",
            out.to_str().unwrap(),
            "--jobs",
            jobs,
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    for shard in ["1/2", "0/2"] {
        let o = sweep(&[
            file,
            "--quick",
            "--out",
            shards.to_str().unwrap(),
            "--shard",
            shard,
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = sweep(&["merge", shards.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_same(&one, &two);
    assert_same(&one, &shards);
    one
}

/// fleisch89 Fig. 8's sweep file runs on the Mirage simulator
/// (`kind = "mirage-read-writers"`) alike on one thread, two and two
/// shards, and its throughputs are the reproduction's Fig. 8 rows; its
/// bad keys and values exit 2, naming them, before any task runs.
#[test]
fn fleisch89s_fig8_sweep_file_runs_alike_and_gives_the_reproductions_rates() {
    let t = tmp("fleisch89-fig8");
    let file = "experiments/fleisch89/fig8.sweep.toml";
    let one = three_ways_alike(&t, file);
    let results = read(&one.join("results.csv"));
    let mut r = csv::Reader::from_reader(results.as_bytes());
    let header: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(
        header,
        ["delta_ticks", "seed", "metric", "value", "unit", "oracle"]
    );
    assert!(
        r.records().all(|x| &x.unwrap()[5] == "consistent"),
        "{results}"
    );
    let o = mmulab(&["reproduce", "fleisch89", "--quick", "--json"]);
    assert!(o.status.code().is_some_and(|c| c <= 1), "{}", text(&o));
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let deltas = [1u32, 10, 60, 120, 240, 480, 600, 720, 1200];
    for d in deltas {
        let ds = d.to_string();
        let v = metric(&results, "read_write_instr_per_s", &[("delta_ticks", &ds)]);
        assert_eq!(v.len(), 1, "Δ={d}: one seed under --quick: {v:?}");
        let by_hand: f64 = v[0].parse().unwrap();
        let shown = row(
            &rep,
            "Fig. 8",
            "throughput",
            serde_json::json!({ "delta_ticks": d }),
        );
        // The same run's number; serde_json's parser may land one ulp off
        // the shortest text the report printed.
        assert!(
            (by_hand - shown).abs() <= 2.0 * f64::EPSILON * shown.abs(),
            "Δ={d}: sweep {by_hand}, reproduction {shown}"
        );
        assert_eq!(
            metric(&results, "simulated_s", &[("delta_ticks", &ds)]).len(),
            1
        );
    }
    let o = sweep(&["status", one.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["kind"], "mirage-read-writers", "{st}");
    assert_eq!(st["tasks"], deltas.len(), "{st}");

    // Bad keys and values, named before any task runs.
    let shipped = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(file));
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("experiments/fleisch89/paper-data/fig8.toml")
        .display()
        .to_string();
    let shipped = shipped.replace("paper-data/fig8.toml", &base);
    let out = t.join("bad-out");
    let cases = [
        (
            shipped.replace("delta_ticks = [1, 2,", "deltas = [1, 2,"),
            "point 0 (deltas=1): ",
        ),
        (
            shipped.replace("delta_ticks = [1, 2,", "delta_ticks = [-1, 2,"),
            "key `delta_ticks`: expected a whole number of ticks",
        ),
        (
            shipped.replace("[grid]", "[grid]\nloop_s = [5000.0]"),
            "key `loop_s`: must be at most 3600",
        ),
        (
            shipped.replace("[grid]", "[grid]\npreset = [\"vax\"]"),
            "key `preset`: unknown preset",
        ),
        (
            shipped.replace("count = 3 }", "count = 100000 }"),
            "simulated operations (14 points x 100000 seeds",
        ),
        (
            // Without its kind, the base is read as a `mmulab run` spec.
            shipped.replace("kind = \"mirage-read-writers\"\n", ""),
            "point 0 (delta_ticks=1): preset: unknown preset `vax-locus-1989`",
        ),
    ];
    each_bad_sweep_exits_2_naming_it(&t, &out, &cases);
    let _ = std::fs::remove_dir_all(&t);
}

/// uhlig94's systems sweep file runs trap-driven passes of the
/// software-TLB simulator (`kind = "swtlb-trap"`) alike on one thread,
/// two and two shards; Table II's ratios are its TLB seconds summed over
/// the stand-ins; its bad keys and values exit 2, naming them, before any
/// task runs.
#[test]
fn uhlig94s_systems_sweep_file_runs_alike_and_gives_table_iis_ratios() {
    let t = tmp("uhlig94-systems");
    let file = "experiments/uhlig94/systems.sweep.toml";
    let one = three_ways_alike(&t, file);
    let results = read(&one.join("results.csv"));
    let mut r = csv::Reader::from_reader(results.as_bytes());
    let header: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(
        header,
        [
            "os", "workload", "seed", "metric", "value", "unit", "oracle"
        ]
    );
    // The software-TLB simulator checks no translations: `none`, never a
    // claim of consistency.
    assert!(r.records().all(|x| &x.unwrap()[6] == "none"), "{results}");
    let o = mmulab(&["reproduce", "uhlig94", "--quick", "--json"]);
    assert!(o.status.code().is_some_and(|c| c <= 1), "{}", text(&o));
    let rep: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let suite = [
        "compress",
        "IOzone",
        "jpeg_play",
        "mab",
        "mpeg_play",
        "ousterhout",
        "video_play",
    ];
    let seconds = |os: &str| -> f64 {
        suite.iter().fold(0.0, |s, w| {
            let v = metric(&results, "tlb_seconds", &[("os", os), ("workload", w)]);
            assert_eq!(v.len(), 1, "{os} {w}: one seed under --quick: {v:?}");
            s + v[0].parse::<f64>().unwrap()
        })
    };
    let ultrix = seconds("ultrix");
    for (key, name) in [
        ("osf1", "OSF/1"),
        ("mach3", "Mach3"),
        ("afsin", "Mach3+AFSin"),
        ("afsout", "Mach3+AFSout"),
    ] {
        let by_hand = seconds(key) / ultrix;
        let shown = row(
            &rep,
            "Table II",
            "time ratio to Ultrix",
            serde_json::json!({ "os": name, "workload": "all seven (stand-ins)" }),
        );
        assert!(
            (by_hand - shown).abs() <= 4.0 * f64::EPSILON * shown.abs(),
            "{name}: sweep {by_hand}, reproduction {shown}"
        );
    }

    let shipped = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(file));
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("experiments/uhlig94/paper-data/shape.toml")
        .display()
        .to_string();
    let shipped = shipped.replace("paper-data/shape.toml", &base);
    let out = t.join("bad-out");
    let cases = [
        (
            shipped.replace("os = [\"ultrix\",", "os = [\"vms\","),
            "point 0 (os=\"vms\", workload=\"compress\"): os: unknown OS `vms`",
        ),
        (
            shipped.replace("\"IOzone\"", "\"iozone\""),
            "workload: no stand-in `iozone`",
        ),
        (
            shipped.replace("[grid]", "[grid]\nslots = [128]"),
            "slots: not a key of a trap-driven pass",
        ),
        (
            shipped.replace("[grid]", "[grid]\nlower = [[8, 64]]"),
            "lower: expected distinct partition points in 0..64",
        ),
    ];
    each_bad_sweep_exits_2_naming_it(&t, &out, &cases);
    let _ = std::fs::remove_dir_all(&t);
}

/// uhlig94's partition sweep files (Figs. 5 and 7: one trap-driven pass
/// over a list of partition points per task; Table VIII and Fig. 8: over
/// placements too) run alike on one thread, two and two shards, with each
/// setup's metrics under its partition point (and placement).
#[test]
fn uhlig94s_partition_sweep_files_run_alike() {
    let t = tmp("uhlig94-fig8");
    let one = three_ways_alike(&t, "experiments/uhlig94/fig8.sweep.toml");
    let results = read(&one.join("results.csv"));
    for (placement, tasks) in [("A", 2), ("B", 2), ("C", 2), ("D", 1)] {
        let v = metric(&results, &format!("lower8.{placement}.tlb_seconds"), &[]);
        assert_eq!(v.len(), tasks, "policy {placement}: {v:?}");
    }
    assert_eq!(metric(&results, "lower32.C.misses.L2", &[]).len(), 1);
    let _ = std::fs::remove_dir_all(&t);
    for (name, tasks, lowers) in [("fig5", 3, 13), ("fig7", 6, 14)] {
        let t = tmp(&format!("uhlig94-{name}"));
        let file = format!("experiments/uhlig94/{name}.sweep.toml");
        let one = three_ways_alike(&t, &file);
        let results = read(&one.join("results.csv"));
        let rows = metric(&results, "lower8.tlb_seconds", &[]);
        assert_eq!(rows.len(), tasks, "{name}: {results}");
        let per_task = metric(&results, "misses.L2", &[]).len()
            + (4..=30)
                .filter(|l| !metric(&results, &format!("lower{l}.misses.L2"), &[]).is_empty())
                .count();
        assert_eq!(per_task, lowers, "{name}: a setup per partition point");
        let _ = std::fs::remove_dir_all(&t);
    }
}

/// Each (sweep text, what its error must name) exits 2 naming it, before
/// any task runs (no `out` folder made).
fn each_bad_sweep_exits_2_naming_it(t: &Path, out: &Path, cases: &[(String, &str)]) {
    for (text_of, named) in cases {
        let s = write_sweep(t, text_of);
        let o = sweep(&[&s, "--out", out.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{named}: {}", text(&o));
        assert!(
            text(&o).contains(named),
            "expected `{named}` in: {}",
            text(&o)
        );
        assert!(
            !out.exists(),
            "{named}: the folder was made before validation"
        );
    }
}
