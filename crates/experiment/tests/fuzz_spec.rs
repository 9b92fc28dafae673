//! Property tests of the spec parser with `--set` (issue 24): random text,
//! and the shipped tester spec with random overrides of its real keys (and
//! of keys that do not exist, too deep, empty) set to values from the
//! extremes of every type. Nothing may panic; a spec that parses has an
//! estimate and a budget check that do not panic either, and survives a
//! round trip through its own JSON; memory stays bounded (a counting
//! allocator). `MMULAB_FUZZ_CASES` cases each (default 10,000).

use mmulab_experiment::{Budget, Spec, SpecError};
use proptest::prelude::*;

#[global_allocator]
static ALLOC: mmulab_testkit::Counting = mmulab_testkit::Counting;

/// No spec, however wrong, makes the parser or the checks ask for more
/// than this at once (nothing is allocated from a spec's sizes before the
/// run) or hold more in all.
const MAX_ALLOCATION: usize = 16 << 20;
const MAX_LIVE: usize = 512 << 20;

fn memory_bounded() {
    mmulab_testkit::assert_memory_bounded(MAX_ALLOCATION, MAX_LIVE);
}

fn cases() -> u32 {
    mmulab_testkit::fuzz_cases()
}

const TESTER: &str = include_str!("../../../experiments/tester.toml");

/// Every dotted key of the tester spec, as parsed (costs, machine, engine,
/// kernel, protocol options, workload).
fn real_keys() -> &'static [String] {
    static KEYS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        fn walk(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
            if let serde_json::Value::Object(m) = v {
                for (k, x) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(x, &key, out);
                    out.push(key);
                }
            }
        }
        let spec = Spec::parse(TESTER, &[], "tester").unwrap();
        let mut keys = Vec::new();
        walk(&spec.to_json(), "", &mut keys);
        // Keys of tables the tester leaves out.
        keys.extend(
            [
                "kernel.disabled_windows",
                "kernel.disabled_windows.mean_interval_cycles",
                "kernel.disabled_windows.mean_length_cycles",
                "memory",
                "memory.l2.size_bytes",
                "memory.interconnect.kind",
                "workload.steps",
                "workload.private_pages",
                "workload.threads_per_task",
                "workload.max_region_pages",
                "workload.file_pages",
                "workload.sizes_kb",
            ]
            .map(String::from),
        );
        keys
    })
}

/// A `--set` key: a real one, or one that is wrong in a way a user (or an
/// attacker) would try.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0..real_keys().len()).prop_map(|i| real_keys()[i].clone()),
        1 => "[a-z_]{1,12}(\\.[a-z_]{1,12}){0,3}",
        1 => (1usize..40).prop_map(|n| vec!["a"; n].join(".")),
        1 => Just("".to_string()),
        1 => Just("machine..cpus".to_string()),
        1 => "[ -~]{0,20}",
    ]
}

/// A `--set` value: extremes of every TOML type, and text that is not TOML.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        prop_oneof![
            Just("0"),
            Just("1"),
            Just("-1"),
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
            Just("[1,1,1]"),
            Just("[64,64]"),
            Just("{}"),
            Just("{kind=\"bench\", threads=4, private_pages=100000000}"),
            Just("{kind=\"random\", steps=1000000000000}"),
            Just("{kind=\"random\", threads_per_task=100000}"),
            Just("{kind=\"unitd-micro\", op=\"cow\", file_pages=1000000000000}"),
            Just("{kind=\"fork-bench\", test=\"fork-exit\", sizes_kb=[18446744073709551615]}"),
            Just("{mean_interval_cycles=1, mean_length_cycles=9223372036854775807}"),
            Just("\"x86-simics-2010\""),
            Just("\"none\""),
        ]
        .prop_map(String::from),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        "[ -~]{0,30}",
        (1usize..5000).prop_map(|n| format!("\"{}\"", "x".repeat(n))),
    ]
}

/// Parses and, if it parsed, exercises everything a run does before it
/// allocates.
fn check(text: &str, sets: &[String]) -> Result<(), String> {
    match Spec::parse(text, sets, "fuzz.toml") {
        Ok(spec) => {
            let e = spec.estimate();
            assert!(e.memory_bytes > 0 && e.work > 0);
            let _ = spec.check_budget(&Budget {
                max_memory_bytes: 1 << 30,
                max_work: 1_000_000_000,
            });
            // What a run writes beside its results reads back as the
            // same spec.
            let back: Spec = serde_json::from_value(spec.to_json()).expect("round trip");
            assert_eq!(back, spec);
            assert!(spec.validate().is_ok(), "validate is stable");
            Ok(())
        }
        Err(SpecError::Invalid(m)) => {
            // Every message is short, whatever it echoes.
            let shown = SpecError::Invalid(m).to_string();
            assert!(shown.len() < 8 * 1024, "{} bytes of error", shown.len());
            Err(shown)
        }
        Err(e) => Err(e.to_string()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_text(text in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = check(&String::from_utf8_lossy(&text), &[]);
        memory_bounded();
    }

    #[test]
    fn tester_with_random_overrides(
        sets in proptest::collection::vec((key(), value()), 1..5),
        raw in proptest::option::of("[ -~]{0,40}"),
    ) {
        let mut sets: Vec<String> = sets.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        if let Some(r) = raw {
            // A --set without '=' or with anything at all.
            sets.push(r);
        }
        let _ = check(TESTER, &sets);
        memory_bounded();
    }

    /// Lines of the spec text itself deleted, duplicated or swapped.
    #[test]
    fn tester_text_mutated(ops in proptest::collection::vec((0usize..64, 0u8..3, 0usize..64), 1..6)) {
        let mut lines: Vec<&str> = TESTER.lines().collect();
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
        let _ = check(&lines.join("\n"), &[]);
        memory_bounded();
    }
}

/// The overrides above reach past the parser: most real keys with sane
/// values give specs that parse (not everything is refused early).
#[test]
fn the_fuzzed_keys_are_real() {
    let ok = real_keys()
        .iter()
        .filter(|k| k.starts_with("costs.") && k.ends_with("_cycles"))
        .filter(|k| check(TESTER, &[format!("{k}=3")]).is_ok())
        .count();
    assert!(ok > 20, "only {ok} cost keys took a sane value");
}

/// `mmulab check` draws its specs from the seed; every protocol's draws
/// pass the checks made before a run (a swarm spec refused would panic the
/// sweep: `swarm specs are valid`), and their estimates fit the defaults.
#[test]
fn every_swarm_spec_passes_the_checks_before_a_run() {
    let budget = Budget {
        max_memory_bytes: 1 << 30,
        max_work: mmulab_experiment::budget::DEFAULT_MAX_WORK,
    };
    for protocol in mmulab_protocols::names() {
        for seed in 1..=150 {
            let spec = mmulab_experiment::check::swarm_spec(protocol, seed);
            if let Err(e) = spec.check_budget(&budget) {
                panic!("{protocol} seed {seed}: {e}");
            }
        }
    }
}
