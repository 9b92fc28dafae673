//! The reproduction: it runs, it is deterministic, and its specs reject
//! unknown keys and impossible values by name.

use mmulab_mirage::spec::{self, Fig7Spec, NSiteSpec, Table3Spec};
use mmulab_mirage::{Error, reproduce};

#[test]
fn quick_reproduction_writes_json_and_svgs_and_is_deterministic() {
    let dir = std::env::temp_dir().join(format!("mirage-repro-{}", std::process::id()));
    let mut lines = Vec::new();
    let table = reproduce(true, Some(&dir), &mut |l| lines.push(l.to_string())).expect("reproduce");
    assert!(!lines.is_empty());
    let first = std::fs::read(dir.join("reproduce-fleisch89.json")).expect("json");
    assert!(dir.join("fleisch89-fig7.svg").exists() && dir.join("fleisch89-fig8.svg").exists());
    let again = reproduce(true, Some(&dir), &mut |_| {}).expect("reproduce again");
    let second = std::fs::read(dir.join("reproduce-fleisch89.json")).expect("json");
    assert_eq!(first, second, "same specs, same bytes");
    assert_eq!(table.rows.len(), again.rows.len());
    let value: serde_json::Value = serde_json::from_slice(&first).expect("valid json");
    for key in [
        "artefact",
        "quantity",
        "paper",
        "mmulab",
        "deviation_pct",
        "tolerance_pct",
        "within",
    ] {
        assert!(value[0].get(key).is_some(), "row lacks {key}");
    }
    if std::env::var_os("MIRAGE_PRINT").is_some() {
        eprintln!("{}", table.render());
        eprintln!("{}", mmulab_mirage::reproduce::pingpong_timeline(0));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_key_is_named() {
    let text =
        std::fs::read_to_string(mmulab_mirage::reproduce::spec_dir().join("table3.toml")).unwrap();
    let err =
        spec::parse::<Table3Spec>("table3.toml", &format!("{text}\nbogus_knob = 3\n")).unwrap_err();
    assert!(err.to_string().contains("bogus_knob"), "{err}");
}

#[test]
fn impossible_values_are_named() {
    let text =
        std::fs::read_to_string(mmulab_mirage::reproduce::spec_dir().join("fig7.toml")).unwrap();
    let s: Fig7Spec = spec::parse("fig7.toml", &text.replace("trials = 60", "trials = 2")).unwrap();
    let err = s.validate("fig7.toml").unwrap_err();
    assert!(
        matches!(&err, Error::Invalid { key, .. } if key == "trials"),
        "{err}"
    );
    let text =
        std::fs::read_to_string(mmulab_mirage::reproduce::spec_dir().join("nsite.toml")).unwrap();
    let s: NSiteSpec = spec::parse(
        "nsite.toml",
        &text.replace("delta_ticks = 12", "delta_ticks = 0"),
    )
    .unwrap();
    let err = s.validate("nsite.toml").unwrap_err();
    assert!(err.to_string().contains("delta_ticks"), "{err}");
    let bad_type = spec::parse::<Table3Spec>("table3.toml", "artefact = 3").unwrap_err();
    assert!(bad_type.to_string().contains("artefact"), "{bad_type}");
}
