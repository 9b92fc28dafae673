//! Property tests of the fleisch89 spec parser (issue 24), as
//! `crates/experiment/tests/fuzz_spec.rs` does for the run specs: random
//! text, and each shipped `experiments/fleisch89/paper-data/*.toml` with
//! random keys (real ones, of its `[paper]` table too, and made-up ones)
//! set to values from the extremes of every type, and with its lines
//! deleted, duplicated or swapped. Each text goes to every spec type's
//! parser and, if it parses, to its range and budget checks. Nothing may
//! panic; an error is short whatever it echoes; memory stays bounded (a
//! counting allocator). `MMULAB_FUZZ_CASES` cases each (default 10,000).

use mmulab_mirage::spec::{self, Fig7Spec, Fig8Spec, NSiteSpec, Table3Spec, WorstCaseSpec};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: mmulab_testkit::Counting = mmulab_testkit::Counting;

/// No spec makes the parser or the checks ask for more than this at once,
/// or hold more in all.
const MAX_ALLOCATION: usize = 16 << 20;
const MAX_LIVE: usize = 512 << 20;

fn memory_bounded() {
    mmulab_testkit::assert_memory_bounded(MAX_ALLOCATION, MAX_LIVE);
}

fn cases() -> u32 {
    mmulab_testkit::fuzz_cases()
}

const SHIPPED: [(&str, &str); 5] = [
    (
        "table3.toml",
        include_str!("../../../experiments/fleisch89/paper-data/table3.toml"),
    ),
    (
        "worst-case.toml",
        include_str!("../../../experiments/fleisch89/paper-data/worst-case.toml"),
    ),
    (
        "fig7.toml",
        include_str!("../../../experiments/fleisch89/paper-data/fig7.toml"),
    ),
    (
        "fig8.toml",
        include_str!("../../../experiments/fleisch89/paper-data/fig8.toml"),
    ),
    (
        "nsite.toml",
        include_str!("../../../experiments/fleisch89/paper-data/nsite.toml"),
    ),
];

/// Whatever an error echoes, it stays short.
fn short(e: mmulab_mirage::Error) -> String {
    let m = e.to_string();
    assert!(m.len() < 8 * 1024, "{} bytes of error", m.len());
    m
}

/// Parses `text` as each spec type and checks what parses, as `reproduce
/// fleisch89` does before it runs anything. Err: the messages.
fn check(text: &str) -> Result<(), Vec<String>> {
    fn one<T: for<'de> serde::Deserialize<'de>>(
        text: &str,
        validate: impl Fn(&T) -> Result<(), mmulab_mirage::Error>,
    ) -> Result<(), String> {
        let s: T = spec::parse("fuzz.toml", text).map_err(short)?;
        validate(&s).map_err(short)
    }
    let r = [
        one::<Table3Spec>(text, |s| s.validate("fuzz.toml")),
        one::<WorstCaseSpec>(text, |s| s.validate("fuzz.toml")),
        one::<Fig7Spec>(text, |s| s.validate("fuzz.toml")),
        one::<Fig8Spec>(text, |s| s.validate("fuzz.toml")),
        one::<NSiteSpec>(text, |s| s.validate("fuzz.toml")),
    ];
    if r.iter().any(|r| r.is_ok()) {
        Ok(())
    } else {
        Err(r.into_iter().filter_map(|r| r.err()).collect())
    }
}

/// The keys a spec sets, `paper.` before those of its `[paper]` table.
fn keys_of(text: &str) -> Vec<String> {
    let mut table = "";
    let mut keys = Vec::new();
    for l in text.lines() {
        let l = l.trim();
        if l.starts_with('[') {
            table = if l == "[paper]" { "paper." } else { "?" };
        } else if let Some((k, _)) = l.split_once('=')
            && !l.starts_with('#')
        {
            keys.push(format!("{table}{}", k.trim()));
        }
    }
    keys
}

/// `text` with `key` set to `value`: its line replaced (as written, so
/// the value need not be TOML), or added at the end of its table.
fn set(text: &str, key: &str, value: &str) -> String {
    let (in_paper, k) = match key.strip_prefix("paper.") {
        Some(k) => (true, k),
        None => (false, key),
    };
    let mut out = Vec::new();
    let mut paper = false;
    let mut done = false;
    for l in text.lines() {
        if l.trim().starts_with('[') {
            if !done && !in_paper {
                out.push(format!("{k} = {value}"));
                done = true;
            }
            paper = l.trim() == "[paper]";
        }
        let ours = paper == in_paper && l.split_once('=').is_some_and(|(lk, _)| lk.trim() == k);
        if ours && !done {
            out.push(format!("{k} = {value}"));
            done = true;
        } else {
            out.push(l.to_string());
        }
    }
    if !done {
        if in_paper && !paper {
            out.push("[paper]".into());
        }
        out.push(format!("{k} = {value}"));
    }
    out.join("\n")
}

/// A value: extremes of every TOML type, and text that is not TOML.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        prop_oneof![
            Just("0"),
            Just("1"),
            Just("-1"),
            Just("4294967295"),
            Just("9223372036854775807"),
            Just("18446744073709551615"),
            Just("1e-300"),
            Just("1e308"),
            Just("nan"),
            Just("inf"),
            Just("-inf"),
            Just("true"),
            Just("\"\""),
            Just("[]"),
            Just("[0]"),
            Just("[4294967295]"),
            Just("[1, 1, 1]"),
            Just("[2, 64, 65]"),
            Just("{}"),
            Just("\"vax-locus-1989\""),
            Just("\"none\""),
        ]
        .prop_map(String::from),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        "[ -~]{0,30}",
        (1usize..5000).prop_map(|n| format!("\"{}\"", "x".repeat(n))),
        (1usize..3000).prop_map(|n| format!("[{}]", vec!["7"; n].join(","))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_text(text in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = check(&String::from_utf8_lossy(&text));
        memory_bounded();
    }

    #[test]
    fn shipped_specs_with_random_keys(
        which in 0usize..5,
        sets in proptest::collection::vec((0usize..64, "[a-z_]{1,12}", any::<bool>(), value()), 1..5),
    ) {
        let mut text = SHIPPED[which].1.to_string();
        let keys = keys_of(&text);
        for (i, made_up, real, v) in sets {
            let key = if real { keys[i % keys.len()].clone() } else { made_up };
            text = set(&text, &key, &v);
        }
        let _ = check(&text);
        memory_bounded();
    }

    /// Lines of a spec deleted, duplicated or swapped.
    #[test]
    fn shipped_text_mutated(
        which in 0usize..5,
        ops in proptest::collection::vec((0usize..64, 0u8..3, 0usize..64), 1..6),
    ) {
        let mut lines: Vec<&str> = SHIPPED[which].1.lines().collect();
        for (i, op, j) in ops {
            if lines.is_empty() {
                break;
            }
            let (i, j) = (i % lines.len(), j % lines.len());
            match op {
                0 => {
                    lines.remove(i);
                }
                1 => lines.insert(j, lines[i]),
                _ => lines.swap(i, j),
            }
        }
        let _ = check(&lines.join("\n"));
        memory_bounded();
    }
}

/// The shipped specs pass (the fuzzing above starts from specs that
/// parse), and a key set past its range or the budget is refused naming
/// the key, before anything runs.
#[test]
fn shipped_specs_pass_and_extremes_name_their_key() {
    for (name, text) in SHIPPED {
        assert!(check(text).is_ok(), "{name}: {:?}", check(text));
        assert!(!keys_of(text).is_empty());
    }
    let refused = |file: usize, sets: &[(&str, &str)], want: &str| {
        let mut text = SHIPPED[file].1.to_string();
        for (k, v) in sets {
            text = set(&text, k, v);
        }
        let key = sets[0].0;
        let errs = check(&text).expect_err(&format!("{sets:?} was taken"));
        assert!(
            errs.iter()
                .any(|e| e.contains(&format!("key `{key}`")) && e.contains(want)),
            "{sets:?}: {errs:?}"
        );
    };
    // worst-case.toml: trials x seeds past the work budget; seeds past
    // their range.
    refused(
        1,
        &[("trials", "1000000"), ("seeds", "1000000")],
        "simulated operations",
    );
    refused(1, &[("seeds", "1000001")], "at most 1000000");
    // fig7.toml: a Δ past a simulated day; trials x seeds past the budget.
    refused(2, &[("deltas", "[2, 4294967295]")], "at most 5184000");
    refused(
        2,
        &[("trials", "1000000"), ("seeds", "1000000")],
        "simulated operations",
    );
    // fig8.toml: the loop past an hour (one run is then within the
    // budget; the sweep of its runs, fig8.sweep.toml, checks the total).
    refused(3, &[("loop_s", "1e300")], "at most 3600");
    refused(3, &[("stagger_s", "1e12")], "at most 3600");
    // nsite.toml: rounds past the range; Δ past a day.
    refused(4, &[("rounds", "1000000000000")], "at most 1000000");
    refused(4, &[("delta_ticks", "4294967295")], "at most 5184000");
}
