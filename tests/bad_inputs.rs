//! The corpus of bad inputs (tests/bad-inputs/, see its README.md): every
//! case runs the real `mmulab` under a time limit and must exit with its
//! status and print its error text. The summary counts the cases that
//! panic (or die of a signal), hang (past the limit) or pass silently
//! (exit 0 where an error was due), and every count must be 0.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A case that runs longer than this hangs.
const LIMIT: Duration = Duration::from_secs(60);
/// The most memory any case may take (peak RSS): a 50 MB spec peaked at
/// 1.3 GB before.
const MAX_RSS_KB: i64 = 512 * 1024;

struct Case {
    name: String,
    args: Vec<String>,
    exit: i32,
    stderr: Vec<String>,
    once: Vec<String>,
    stderr_max: Option<usize>,
    absent: Vec<String>,
    make: Option<(String, String, usize, String)>,
    /// `tree: REL`: the input goes to `{tmp}/experiments/REL`, in a copy
    /// of REL's top folder of experiments/ (for `reproduce --experiments`).
    tree: Option<String>,
}

fn unescape(s: &str) -> String {
    s.replace("\\n", "\n").replace("\\t", "\t")
}

fn parse(name: &str, text: &str) -> Case {
    let mut c = Case {
        name: name.to_string(),
        args: Vec::new(),
        exit: -1,
        stderr: Vec::new(),
        once: Vec::new(),
        stderr_max: None,
        absent: Vec::new(),
        make: None,
        tree: None,
    };
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once(": ")
            .or_else(|| line.split_once(':'))
            .unwrap_or_else(|| panic!("{name}: bad line {line:?}"));
        match key {
            // One argument per `arg:` line (values may hold spaces).
            "arg" => c.args.push(value.to_string()),
            "args" => c.args.extend(value.split_whitespace().map(String::from)),
            "exit" => c.exit = value.parse().expect("exit status"),
            "stderr" => c.stderr.push(value.to_string()),
            "once" => c.once.push(value.to_string()),
            "stderr-max-bytes" => c.stderr_max = Some(value.parse().expect("bytes")),
            "absent" => c.absent.push(value.to_string()),
            "tree" => c.tree = Some(value.to_string()),
            "make" => {
                let parts: Vec<&str> = value.split('|').collect();
                assert_eq!(parts.len(), 4, "{name}: make: PREFIX|UNIT|COUNT|SUFFIX");
                c.make = Some((
                    unescape(parts[0]),
                    unescape(parts[1]),
                    parts[2].parse().expect("count"),
                    unescape(parts[3]),
                ));
            }
            other => panic!("{name}: unknown field {other:?}"),
        }
    }
    assert!(!c.args.is_empty(), "{name}: no args");
    assert!(c.exit >= 0, "{name}: no exit");
    c
}

enum Outcome {
    Pass,
    Panic(String),
    Hang,
    Silent,
    Wrong(String),
}

fn run(c: &Case, dir: &Path, tmp: &Path) -> Outcome {
    // `{}` is the case's input file (NAME.* beside NAME.expect, or the
    // file `make` wrote); `{tmp}` a scratch folder of its own.
    let input = match &c.make {
        Some((prefix, unit, count, suffix)) => {
            let p = tmp.join("made-input.toml");
            let mut v = Vec::with_capacity(prefix.len() + unit.len() * count + suffix.len());
            v.extend(prefix.as_bytes());
            for _ in 0..*count {
                v.extend(unit.as_bytes());
            }
            v.extend(suffix.as_bytes());
            std::fs::write(&p, v).unwrap();
            p
        }
        None => std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                let n = p.file_name().and_then(|s| s.to_str()).unwrap_or("");
                n.starts_with(&format!("{}.", c.name)) && !n.ends_with(".expect")
            })
            .unwrap_or_else(|| dir.join(format!("{}.missing", c.name))),
    };
    if let Some(rel) = &c.tree {
        fn copy(from: &Path, to: &Path) {
            std::fs::create_dir_all(to).unwrap();
            for e in std::fs::read_dir(from).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    copy(&p, &to.join(e.file_name()));
                } else {
                    std::fs::copy(&p, to.join(e.file_name())).unwrap();
                }
            }
        }
        let top = rel.split('/').next().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
        copy(&root.join(top), &tmp.join("experiments").join(top));
        // The input's `KEY = VALUE` lines replace the shipped file's lines
        // of those keys (or go before its first table).
        let target = tmp.join("experiments").join(rel);
        let mut lines: Vec<String> = std::fs::read_to_string(&target)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        let key = |l: &str| l.split_once('=').map(|(k, _)| k.trim().to_string());
        for set in std::fs::read_to_string(&input).unwrap().lines() {
            let Some(k) = key(set).filter(|_| !set.starts_with('#')) else {
                continue;
            };
            let first_table = lines
                .iter()
                .position(|l| l.starts_with('['))
                .unwrap_or(lines.len());
            match lines[..first_table]
                .iter()
                .position(|l| !l.starts_with('#') && key(l).as_deref() == Some(&k))
            {
                Some(i) => lines[i] = set.to_string(),
                None => lines.insert(first_table, set.to_string()),
            }
        }
        std::fs::write(&target, lines.join("\n")).unwrap();
    }
    let subst = |s: &str| {
        s.replace("{tmp}", &tmp.display().to_string())
            .replace("{}", &input.display().to_string())
    };
    let args: Vec<String> = c.args.iter().map(|a| subst(a)).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mmulab"))
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    // Read stderr on a thread so that a full pipe never stalls the child.
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    let Some(status) = status else {
        return Outcome::Hang;
    };
    let short = |s: &str| s.chars().take(600).collect::<String>();
    if stderr.contains("panicked at") || stderr.contains("overflowed its stack") {
        return Outcome::Panic(short(&stderr));
    }
    let Some(code) = status.code() else {
        return Outcome::Panic(format!(
            "killed by a signal: {status:?}; {}",
            short(&stderr)
        ));
    };
    if code == 0 && c.exit != 0 {
        return Outcome::Silent;
    }
    if code != c.exit {
        return Outcome::Wrong(format!(
            "exit {code}, expected {}: {}",
            c.exit,
            short(&stderr)
        ));
    }
    for want in &c.stderr {
        let want = subst(want);
        if !stderr.contains(&want) {
            return Outcome::Wrong(format!("stderr lacks {want:?}: {}", short(&stderr)));
        }
    }
    for want in &c.once {
        let n = stderr.matches(want.as_str()).count();
        if n != 1 {
            return Outcome::Wrong(format!("{want:?} printed {n} times: {}", short(&stderr)));
        }
    }
    if let Some(max) = c.stderr_max
        && stderr.len() > max
    {
        return Outcome::Wrong(format!("{} bytes of stderr, at most {max}", stderr.len()));
    }
    for p in &c.absent {
        let p = subst(p);
        if Path::new(&p).exists() {
            return Outcome::Wrong(format!("{p} was left behind"));
        }
    }
    Outcome::Pass
}

/// Peak RSS of the children waited for so far, in KiB.
fn children_max_rss_kb() -> i64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| u.max_rss())
        .unwrap_or(0)
}

#[test]
fn bad_inputs_corpus_gives_its_errors_and_no_panic_hang_or_silent_pass() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/bad-inputs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "expect").then(|| p.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    names.sort();
    assert!(names.len() >= 50, "only {} cases", names.len());
    let scratch = std::env::temp_dir().join(format!("mmulab-bad-inputs-{}", std::process::id()));
    let (mut panics, mut hangs, mut silent, mut wrong) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for name in &names {
        let case = parse(
            name,
            &std::fs::read_to_string(dir.join(format!("{name}.expect"))).unwrap(),
        );
        let tmp = scratch.join(name);
        std::fs::create_dir_all(&tmp).unwrap();
        match run(&case, &dir, &tmp) {
            Outcome::Pass => {}
            Outcome::Panic(e) => panics.push(format!("{name}: {e}")),
            Outcome::Hang => hangs.push(name.clone()),
            Outcome::Silent => silent.push(name.clone()),
            Outcome::Wrong(e) => wrong.push(format!("{name}: {e}")),
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let rss = children_max_rss_kb();
    eprintln!(
        "bad-inputs corpus: {} cases; panic {}, hang {}, pass silently {}, wrong error {}; largest peak RSS {} MiB",
        names.len(),
        panics.len(),
        hangs.len(),
        silent.len(),
        wrong.len(),
        rss / 1024
    );
    assert!(
        panics.is_empty() && hangs.is_empty() && silent.is_empty() && wrong.is_empty(),
        "panic: {panics:#?}\nhang: {hangs:#?}\npass silently: {silent:#?}\nwrong: {wrong:#?}"
    );
    assert!(rss <= MAX_RSS_KB, "a case peaked at {} MiB", rss / 1024);
}
