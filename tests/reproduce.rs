//! The reproduction contract, end to end through the real binary: every
//! paper's rows carry a basis, the presets' calibration sets are honoured,
//! the JSON, CSV, figures and index.html are written, the page renders in
//! a headless browser, and the docs' `--quick` tables are what a fresh run
//! prints.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PAPERS: [&str; 5] = ["black89", "balan92", "uhlig94", "romanescu10", "fleisch89"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the binary in `cwd` (never the repository: specs are embedded).
fn mmulab_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mmulab"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("runs")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mmulab-repro-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

/// Each TOML preset's `[calibration]` table, and the papers whose specs
/// name the preset: read from the files, independently of the binary.
fn preset_calibrations() -> Vec<(String, BTreeMap<String, String>, BTreeSet<String>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(repo().join("presets")).unwrap() {
        let path = e.unwrap().path();
        let t: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
        let name = t["name"].as_str().unwrap().to_string();
        let cal = t
            .get("calibration")
            .and_then(|v| v.as_table())
            .unwrap_or_else(|| panic!("{}: no [calibration] table", path.display()));
        let cal: BTreeMap<String, String> = cal
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().expect("artefact name").to_string()))
            .collect();
        let needle = format!("preset = \"{name}\"");
        let users: BTreeSet<String> = PAPERS
            .iter()
            .filter(|p| {
                walk(&repo().join("experiments").join(p))
                    .iter()
                    .any(|f| std::fs::read_to_string(f).unwrap().contains(&needle))
            })
            .map(|p| p.to_string())
            .collect();
        out.push((name, cal, users));
    }
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            v.extend(walk(&p));
        } else {
            v.push(p);
        }
    }
    v
}

/// The rules every row of every paper obeys.
fn check_contract(paper: &str, r: &serde_json::Value) {
    for k in [
        "schema_version",
        "paper",
        "mmulab_version",
        "git_commit",
        "quick",
        "seeds",
        "rows",
        "not_reproduced",
        "headline",
    ] {
        assert!(r.get(k).is_some(), "{paper}: the report lacks {k}");
    }
    // A calibration target is an artefact, or `artefact / quantity`.
    let fitted: BTreeSet<&str> = r["calibration"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap())
        .collect();
    let rows = r["rows"].as_array().unwrap();
    assert!(!rows.is_empty(), "{paper}: no rows");
    let (mut judged, mut within) = (0, 0);
    let (mut inconsistent, mut inconsistent_within) = (0, 0);
    for row in rows {
        let basis = row["basis"].as_str().unwrap();
        assert!(
            ["input", "calibrated", "arithmetic", "emergent"].contains(&basis),
            "{paper}: {row}"
        );
        let artefact = row["artefact"].as_str().unwrap();
        if basis == "emergent" {
            assert!(
                !fitted.contains(artefact),
                "{paper}: emergent row of a calibrated artefact: {row}"
            );
        }
        if basis == "calibrated" {
            assert!(
                !row["calibrates"].as_array().unwrap().is_empty(),
                "{paper}: {row}"
            );
        }
        assert!(
            !row["quantity"].as_str().unwrap().contains('['),
            "{paper}: {row}"
        );
        match row["kind"].as_str().unwrap() {
            "plot_only" => assert!(row["within"].is_null(), "{paper}: {row}"),
            "numeric" | "claim" => {
                assert!(row["within"].is_boolean(), "{paper}: {row}");
                if basis == "emergent" {
                    judged += 1;
                    within += usize::from(row["within"] == true);
                    if let Some(why) = row.get("paper_inconsistent") {
                        assert!(why.as_str().is_some_and(|w| w.contains("docs/papers/")));
                        inconsistent += 1;
                        inconsistent_within += usize::from(row["within"] == true);
                    }
                }
            }
            k => panic!("{paper}: kind {k}"),
        }
    }
    assert_eq!(r["headline"]["emergent_judged"], judged, "{paper}");
    assert_eq!(r["headline"]["emergent_within"], within, "{paper}");
    let h = &r["headline"];
    assert_eq!(h["emergent_paper_inconsistent"], inconsistent, "{paper}");
    assert_eq!(
        h["emergent_paper_inconsistent_within"], inconsistent_within,
        "{paper}"
    );
    for n in r["not_reproduced"].as_array().unwrap() {
        assert!(!n["reason"].as_str().unwrap().is_empty(), "{paper}: {n}");
    }
}

#[test]
fn reproduce_black89_quick_works_from_any_folder() {
    let d = tmp("black89");
    let o = mmulab_in(&d, &["reproduce", "black89", "--quick", "--out", "o"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let r = json(&d.join("o/reproduce-black89.json"));
    check_contract("black89", &r);
    // The exit code follows the emergent rows alone.
    let ok = r["headline"]["emergent_within"] == r["headline"]["emergent_judged"];
    assert_eq!(o.status.code(), Some(if ok { 0 } else { 1 }), "{stdout}");
    let h = &r["headline"];
    let line = format!(
        "black89: emergent {} of {} within tolerance; {} calibrated, {} arithmetic, {} input; {} of {} artefacts reproduced",
        h["emergent_within"],
        h["emergent_judged"],
        h["calibrated"],
        h["arithmetic"],
        h["input"],
        h["artefacts_reproduced"],
        h["artefacts"]
    );
    assert_eq!(stdout.lines().last(), Some(line.as_str()), "{stdout}");
    // Fig. 2's line is what the preset was fitted to: never emergent.
    let slope = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["artefact"] == "Fig. 2" && row["quantity"] == "slope")
        .expect("a Fig. 2 slope row");
    assert_eq!(slope["basis"], "calibrated");
    // The CSV: the same rows, the conditions as columns.
    let mut rd = csv::Reader::from_path(d.join("o/reproduce-black89.csv")).unwrap();
    let header: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
    assert!(header.contains(&"processors".to_string()), "{header:?}");
    assert_eq!(rd.records().count(), r["rows"].as_array().unwrap().len());
    for f in [
        "black89-fig2.svg",
        "black89-fig2.csv",
        "black89-fig2-extrapolation.svg",
    ] {
        assert!(d.join("o").join(f).exists(), "{f}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Headless Chromium: the page loads, every figure loads, no console error.
/// Skipped (and saying so) only outside CI when Chromium is absent; CI
/// installs it, and there a missing browser fails.
fn check_in_chromium(index: &Path) {
    let Some(browser) = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have Chromium (.ci/run installs Debian's chromium)"
        );
        eprintln!("SKIPPED: the index.html check in headless Chromium (no chromium here)");
        return;
    };
    let o = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", index.display()))
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&o.stdout);
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        dom.contains("data-figures=\"ok\""),
        "figures did not all load:\n{}\n{log}",
        &dom[..dom.len().min(600)]
    );
    let console_errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") && (l.contains("ERROR") || l.contains("error")))
        .collect();
    assert!(console_errors.is_empty(), "{console_errors:#?}");
}

/// The README's generated block `name`.
fn readme_block<'a>(readme: &'a str, name: &str) -> &'a str {
    let start = readme
        .find(&format!("<!-- {name}:start"))
        .unwrap_or_else(|| panic!("README has no {name} block"));
    let start = start + readme[start..].find("-->\n").unwrap() + 4;
    let end = readme
        .find(&format!("<!-- {name}:end -->"))
        .expect("block end");
    &readme[start..end]
}

/// A run's summary with its wall time elided, as scripts/update-docs.sh
/// writes it into the README.
fn elide_wall(text: &str) -> String {
    text.lines()
        .map(|l| match (l.find(" in "), l.find(" s wall (")) {
            (Some(a), Some(_)) if l.starts_with("simulated ") => {
                format!("{} in … s wall (… M refs/s)", &l[..a])
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The README's worked example and its negative control are what the
/// binary prints now (the wall time elided).
#[test]
fn readme_worked_example_is_what_the_run_prints() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let o = mmulab_in(&repo(), &["run", "experiments/tester.toml"]);
    assert_eq!(o.status.code(), Some(0));
    let expect = format!(
        "```\n$ mmulab run experiments/tester.toml\n{}```\n",
        elide_wall(&String::from_utf8_lossy(&o.stdout))
    );
    assert_eq!(
        readme_block(&readme, "example"),
        expect,
        "stale: run scripts/update-docs.sh"
    );
    let o = mmulab_in(
        &repo(),
        &["run", "experiments/tester.toml", "--set", "protocol=none"],
    );
    assert_eq!(o.status.code(), Some(1), "the negative control exits 1");
    let out = elide_wall(&String::from_utf8_lossy(&o.stdout));
    let lines: Vec<&str> = out.lines().collect();
    let tail = &lines[lines.len().saturating_sub(5)..];
    let expect = format!(
        "```\n$ mmulab run experiments/tester.toml --set protocol=none; echo \"exit $?\"\n...\n{}\nexit 1\n```\n",
        tail.join("\n")
    );
    assert_eq!(
        readme_block(&readme, "control"),
        expect,
        "stale: run scripts/update-docs.sh"
    );
}

#[test]
fn reproduce_all_quick_writes_every_paper_the_page_and_the_docs_tables() {
    let d = tmp("all");
    let o = mmulab_in(
        &d,
        &[
            "reproduce",
            "all",
            "--quick",
            "--out",
            "o",
            "--markdown",
            "md",
        ],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut any_outside = false;
    let reports: BTreeMap<&str, serde_json::Value> = PAPERS
        .iter()
        .map(|p| (*p, json(&d.join(format!("o/reproduce-{p}.json")))))
        .collect();
    for (p, r) in &reports {
        check_contract(p, r);
        assert!(d.join(format!("o/reproduce-{p}.csv")).exists());
        any_outside |= r["headline"]["emergent_within"] != r["headline"]["emergent_judged"];
    }
    assert_eq!(o.status.code(), Some(if any_outside { 1 } else { 0 }));
    // Every TOML preset's calibration set reaches the papers that run it.
    for (name, cal, users) in preset_calibrations() {
        for p in users {
            for (k, a) in &cal {
                assert_eq!(
                    reports[p.as_str()]["calibration"][k].as_str(),
                    Some(a.as_str()),
                    "{p} runs preset {name}, whose [calibration] names {k}"
                );
            }
        }
    }
    // The page and its figures.
    let index = d.join("o/index.html");
    let page = std::fs::read_to_string(&index).unwrap();
    for p in PAPERS {
        assert!(
            page.contains(&format!("id=\"{p}\"")),
            "{p} missing from index.html"
        );
    }
    let figures: Vec<String> = std::fs::read_dir(d.join("o"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    for f in &figures {
        let paper = f.split('-').next().unwrap();
        assert!(
            PAPERS.contains(&paper) && f.starts_with(&format!("{paper}-fig")),
            "{f}: not PAPER-figN[-part].svg"
        );
        assert!(
            d.join("o").join(f.replace(".svg", ".csv")).exists(),
            "{f} has no CSV"
        );
        assert!(
            page.contains(&format!("src=\"{f}\"")),
            "{f} not on the page"
        );
    }
    check_in_chromium(&index);
    // The docs show what a fresh --quick run prints.
    let fresh = std::fs::read_to_string(d.join("md/reproduce-quick.md")).unwrap();
    let committed =
        std::fs::read_to_string(repo().join("docs/reproduce-quick.md")).unwrap_or_default();
    assert!(
        fresh == committed,
        "docs/reproduce-quick.md is stale: run `scripts/update-docs.sh` (diff against {})",
        d.join("md/reproduce-quick.md").display()
    );
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let headline = std::fs::read_to_string(d.join("md/headline-quick.md")).unwrap();
    assert_eq!(
        readme_block(&readme, "headline"),
        headline,
        "README's headline table is stale: run scripts/update-docs.sh"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Every spec under experiments/ is a spec `mmulab run` accepts, except
/// those under a `paper-data/` folder (the reproductions' own numbers and
/// settings, which say so by their place).
#[test]
fn every_experiment_outside_paper_data_is_a_runnable_spec() {
    let mut checked = 0;
    for path in walk(&repo().join("experiments")) {
        if path.extension().is_none_or(|x| x != "toml")
            || path.components().any(|c| c.as_os_str() == "paper-data")
        {
            continue;
        }
        // A reproduction's sweep file: a sweep whose every point, full
        // and --quick, is a valid spec.
        if path.to_string_lossy().ends_with(".sweep.toml") {
            for quick in [false, true] {
                if let Err(e) = mmulab_experiment::sweep::Sweep::load_quick(&path, quick) {
                    panic!("{} (quick: {quick}): {e}", path.display());
                }
            }
            continue;
        }
        if let Err(e) = mmulab_experiment::Spec::load(&path, &[]) {
            panic!("{}: {e}", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} specs found");
}
