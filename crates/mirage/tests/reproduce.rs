//! The reproduction: it runs, it is deterministic, and its specs reject
//! unknown keys and impossible values by name.

use mmulab_mirage::sim::Preset;
use mmulab_mirage::spec::{self, Fig7Spec, NSiteSpec, Table3Spec};
use mmulab_mirage::{Error, reproduce};
use mmulab_report::{Basis, Experiments, Provenance, ReproReport, RowKind};

#[test]
fn quick_reproduction_writes_json_and_svgs_and_is_deterministic() {
    let dir = std::env::temp_dir().join(format!("mirage-repro-{}", std::process::id()));
    let mut lines = Vec::new();
    let src = Experiments::Embedded;
    let table =
        reproduce(&src, true, Some(&dir), &mut |l| lines.push(l.to_string())).expect("reproduce");
    assert!(!lines.is_empty());
    assert!(dir.join("fleisch89-fig7.svg").exists() && dir.join("fleisch89-fig8.svg").exists());
    // Each figure draws the paper's points as a series of their own.
    for fig in ["fleisch89-fig7.csv", "fleisch89-fig8.csv"] {
        let csv = std::fs::read_to_string(dir.join(fig)).expect("a CSV beside the SVG");
        assert!(csv.lines().any(|l| l.contains(",paper,")), "{fig}: {csv}");
    }
    let again = reproduce(&src, true, Some(&dir), &mut |_| {}).expect("reproduce again");
    assert_eq!(
        serde_json::to_string(&table).unwrap(),
        serde_json::to_string(&again).unwrap(),
        "same specs, same rows"
    );
    if std::env::var_os("MIRAGE_PRINT").is_some() {
        for r in &table.rows {
            eprintln!("{r:?}");
        }
        eprintln!("{}", mmulab_mirage::reproduce::pingpong_timeline(0));
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The contract: every row has a basis, the calibration is the preset's
    // table, and no row of a fitted artefact is emergent.
    assert_eq!(table.calibration, Preset::vax_locus_1989().calibration());
    let prov = Provenance {
        mmulab_version: "test".into(),
        git_commit: "test".into(),
    };
    let report = ReproReport::new("fleisch89", table, true, &prov).expect("the row contract");
    let basis = |artefact: &str, quantity: &str| {
        report
            .rows
            .iter()
            .find(|r| r.artefact == artefact && r.quantity == quantity)
            .unwrap_or_else(|| panic!("no row {artefact} / {quantity}"))
            .basis
    };
    assert_eq!(basis("Table 3", "using site total"), Basis::Input);
    assert_eq!(basis("§7.2 single site", "cycle rate"), Basis::Calibrated);
    assert_eq!(basis("Fig. 7", "Δ where the curves cross"), Basis::Input);
    assert_eq!(basis("Fig. 8", "peak throughput"), Basis::Calibrated);
    assert_eq!(basis("§7.2", "messages per cycle"), Basis::Emergent);
    assert!(
        report
            .rows
            .iter()
            .filter(|r| r.kind != RowKind::PlotOnly)
            .all(|r| !r.unit.is_empty()),
        "every judged row has a unit"
    );
    assert!(!report.not_reproduced.is_empty());
}

#[test]
fn unknown_key_is_named() {
    let text = Experiments::Embedded
        .read("fleisch89/paper-data/table3.toml")
        .unwrap();
    let err =
        spec::parse::<Table3Spec>("table3.toml", &format!("{text}\nbogus_knob = 3\n")).unwrap_err();
    assert!(err.to_string().contains("bogus_knob"), "{err}");
}

#[test]
fn impossible_values_are_named() {
    let text = Experiments::Embedded
        .read("fleisch89/paper-data/fig7.toml")
        .unwrap();
    let s: Fig7Spec = spec::parse("fig7.toml", &text.replace("trials = 60", "trials = 2")).unwrap();
    let err = s.validate("fig7.toml").unwrap_err();
    assert!(
        matches!(&err, Error::Invalid { key, .. } if key == "trials"),
        "{err}"
    );
    let text = Experiments::Embedded
        .read("fleisch89/paper-data/nsite.toml")
        .unwrap();
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
