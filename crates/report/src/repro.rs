//! The rows every paper reproduction writes, and the report around them
//! (`reproduce-PAPER.json`, `reproduce-PAPER.csv`, the console headline).
//!
//! A reproduction is a prediction. Every row says its `basis`:
//! - `input`: a preset or spec value read back;
//! - `calibrated`: an output the preset was fitted to (`calibrates` names
//!   the fitted inputs);
//! - `arithmetic`: the paper's own numbers combined, no simulation;
//! - `emergent`: simulated from inputs that include neither this number nor
//!   anything derived from it.
//!
//! Only judged emergent rows count toward a paper's headline, and only they
//! decide the exit code.

use crate::table::Table;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The version of `reproduce-PAPER.json`'s layout.
pub const SCHEMA_VERSION: u32 = 2;

/// One compared quantity.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReproRow {
    /// The paper's table, figure or section ("Fig. 2", "Table 4", "§8").
    pub artefact: String,
    /// What is compared, without conditions ("initiator_median").
    pub quantity: String,
    /// The unit of `paper`, `mmulab` and the CI ("µs", "ratio", "%").
    pub unit: String,
    /// The point the row is taken at: `{"cpus": 8, "shootdowns": 4000}`.
    pub conditions: BTreeMap<String, Value>,
    pub paper: Option<f64>,
    pub mmulab: Option<f64>,
    /// The 95 % confidence interval of `mmulab` where runs repeat.
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    pub deviation_pct: Option<f64>,
    pub tolerance_pct: Option<f64>,
    /// Whether the row holds; `null` for `plot_only` rows, which are never
    /// judged.
    pub within: Option<bool>,
    pub kind: RowKind,
    pub basis: Basis,
    /// For `calibrated` rows: the preset inputs fitted to this artefact.
    #[serde(default)]
    pub calibrates: Vec<String>,
    /// The claim checked, or why a row is what it is.
    #[serde(default)]
    pub note: String,
    /// Set when the paper's own figures contradict this row's paper value
    /// (no reading of the paper's stated protocol yields it): where the
    /// arithmetic and the test showing that are. Decided from the paper,
    /// never from the model's value; the row stays judged and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paper_inconsistent: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    /// Judged by tolerance.
    Numeric,
    /// A shape claim; `within` says whether it holds.
    Claim,
    /// Shown for the record, never judged.
    PlotOnly,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    Input,
    Calibrated,
    Arithmetic,
    Emergent,
    /// Not yet classified: a row left so is a bug, refused when the report
    /// is built (and never serialised).
    #[serde(skip)]
    Unset,
}

impl Basis {
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Input => "input",
            Basis::Calibrated => "calibrated",
            Basis::Arithmetic => "arithmetic",
            Basis::Emergent => "emergent",
            Basis::Unset => "unset",
        }
    }
}

impl RowKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RowKind::Numeric => "numeric",
            RowKind::Claim => "claim",
            RowKind::PlotOnly => "plot_only",
        }
    }
}

impl ReproRow {
    fn base(artefact: &str, quantity: &str, kind: RowKind) -> ReproRow {
        ReproRow {
            artefact: artefact.into(),
            quantity: quantity.into(),
            unit: String::new(),
            conditions: BTreeMap::new(),
            paper: None,
            mmulab: None,
            ci_low: None,
            ci_high: None,
            deviation_pct: None,
            tolerance_pct: None,
            within: None,
            kind,
            basis: Basis::Unset,
            calibrates: Vec::new(),
            note: String::new(),
            paper_inconsistent: None,
        }
    }

    /// A numeric comparison: within when |deviation| <= tolerance.
    pub fn numeric(
        artefact: &str,
        quantity: &str,
        paper: f64,
        mmulab: f64,
        tolerance_pct: f64,
    ) -> ReproRow {
        let deviation_pct = deviation_pct(paper, mmulab);
        ReproRow {
            paper: Some(paper),
            mmulab: Some(mmulab),
            deviation_pct: Some(deviation_pct),
            tolerance_pct: Some(tolerance_pct),
            within: Some(deviation_pct.abs() <= tolerance_pct),
            ..ReproRow::base(artefact, quantity, RowKind::Numeric)
        }
    }

    /// A shape claim ("kernel shootdowns are longer than user ones"): the
    /// measured value is shown, `within` is whether the claim holds.
    pub fn claim(
        artefact: &str,
        quantity: &str,
        mmulab: Option<f64>,
        holds: bool,
        claim: &str,
    ) -> ReproRow {
        ReproRow {
            mmulab,
            within: Some(holds),
            note: claim.into(),
            ..ReproRow::base(artefact, quantity, RowKind::Claim)
        }
    }

    /// A value the paper only plots (or states without a number): reported
    /// for the record, never judged.
    pub fn plot_only(
        artefact: &str,
        quantity: &str,
        paper: Option<f64>,
        mmulab: f64,
        note: &str,
    ) -> ReproRow {
        ReproRow {
            paper,
            mmulab: Some(mmulab),
            deviation_pct: paper.map(|p| deviation_pct(p, mmulab)),
            note: note.into(),
            ..ReproRow::base(artefact, quantity, RowKind::PlotOnly)
        }
    }

    pub fn with_note(mut self, note: &str) -> ReproRow {
        self.note = note.into();
        self
    }

    /// Marks the row's paper value as one the paper's own figures
    /// contradict; `why` names where the arithmetic and its test are.
    pub fn paper_inconsistent(mut self, why: &str) -> ReproRow {
        self.paper_inconsistent = Some(why.into());
        self
    }

    pub fn unit(mut self, unit: &str) -> ReproRow {
        self.unit = unit.into();
        self
    }

    /// One condition of the row: `.at("cpus", 8)`.
    pub fn at(mut self, key: &str, value: impl Into<Value>) -> ReproRow {
        self.conditions.insert(key.into(), value.into());
        self
    }

    /// The 95 % confidence interval of `mmulab`.
    pub fn ci(mut self, low: f64, high: f64) -> ReproRow {
        debug_assert!(low <= high, "CI [{low}, {high}] is reversed");
        self.ci_low = Some(low);
        self.ci_high = Some(high);
        self
    }

    /// Simulated from inputs that do not include this number.
    pub fn emergent(mut self) -> ReproRow {
        self.basis = Basis::Emergent;
        self
    }

    /// A preset or spec value read back.
    pub fn input(mut self) -> ReproRow {
        self.basis = Basis::Input;
        self
    }

    /// The paper's own numbers combined, with no simulation.
    pub fn arithmetic(mut self) -> ReproRow {
        self.basis = Basis::Arithmetic;
        self
    }

    /// An output the preset was fitted to; `inputs` are the fitted keys.
    pub fn calibrated(mut self, inputs: &[&str]) -> ReproRow {
        self.basis = Basis::Calibrated;
        self.calibrates = inputs.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The conditions as `k=v, k=v`, for the console.
    pub fn conditions_text(&self) -> String {
        self.conditions
            .iter()
            .map(|(k, v)| format!("{k}={}", value_text(v)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The row's numbers as every view prints them (console, Markdown,
    /// HTML): paper (or "claim"), mmulab, the CI, deviation, tolerance and
    /// the verdict word.
    pub fn cells(&self) -> RowCells {
        let num = |v: Option<f64>| v.map_or("-".to_string(), fmt_num);
        RowCells {
            paper: if self.kind == RowKind::Claim {
                "claim".into()
            } else {
                num(self.paper)
            },
            mmulab: num(self.mmulab),
            ci: match (self.ci_low, self.ci_high) {
                (Some(l), Some(h)) => format!("{}–{}", fmt_num(l), fmt_num(h)),
                _ => "-".into(),
            },
            deviation: self
                .deviation_pct
                .map_or("-".into(), |d| format!("{d:+.1}")),
            tolerance: self.tolerance_pct.map_or("-".into(), |d| format!("{d:.0}")),
            ok: match self.within {
                None => "plot",
                Some(true) => "yes",
                Some(false) => "NO",
            },
        }
    }

    /// Judged: numeric or a claim (plot-only rows never are).
    pub fn judged(&self) -> bool {
        self.kind != RowKind::PlotOnly
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A row's numbers, formatted once for every view.
pub struct RowCells {
    pub paper: String,
    pub mmulab: String,
    pub ci: String,
    pub deviation: String,
    pub tolerance: String,
    pub ok: &'static str,
}

/// Signed deviation of `mmulab` from `paper` in percent of `paper`.
pub fn deviation_pct(paper: f64, mmulab: f64) -> f64 {
    if paper == 0.0 {
        if mmulab == 0.0 {
            0.0
        } else {
            f64::INFINITY.copysign(mmulab)
        }
    } else {
        (mmulab - paper) / paper.abs() * 100.0
    }
}

/// A quantitative artefact of the paper with no row, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NotReproduced {
    pub artefact: String,
    pub reason: String,
}

/// The seeds a reproduction ran: the first, and the runs per point.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Seeds {
    pub first: u64,
    pub runs_per_point: u64,
}

/// What a paper's reproduction returns: its rows, what it leaves out, the
/// seeds it ran. The CLI wraps it in a [`ReproReport`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReproTable {
    pub rows: Vec<ReproRow>,
    pub not_reproduced: Vec<NotReproduced>,
    pub seeds: Seeds,
    /// The `[calibration]` tables of the presets the reproduction ran: each
    /// fitted input and the paper artefact it was fitted to.
    pub calibration: BTreeMap<String, String>,
}

impl ReproTable {
    pub fn push(&mut self, row: ReproRow) {
        self.rows.push(row);
    }

    pub fn not_reproduced(&mut self, artefact: &str, reason: &str) {
        self.not_reproduced.push(NotReproduced {
            artefact: artefact.into(),
            reason: reason.into(),
        });
    }

    /// The calibration map's inputs fitted to `artefact` (the keys whose
    /// target is exactly that artefact), for a `calibrated` row's list.
    pub fn fitted_inputs(&self, artefact: &str) -> Vec<String> {
        self.calibration
            .iter()
            .filter(|(_, a)| *a == artefact)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Records the seeds; a paper whose artefacts differ records the most
    /// runs any point has.
    pub fn seeds(&mut self, first: u64, runs_per_point: u64) {
        self.seeds.first = first;
        self.seeds.runs_per_point = self.seeds.runs_per_point.max(runs_per_point);
    }
}

/// The counts a paper's headline line gives.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Headline {
    /// Judged rows (numeric or claim) whose basis is `emergent`.
    pub emergent_judged: usize,
    pub emergent_within: usize,
    /// Judged rows of the other bases.
    pub calibrated: usize,
    pub arithmetic: usize,
    pub input: usize,
    /// Rows shown and never judged, whatever their basis.
    pub plot_only: usize,
    pub not_reproduced: usize,
    /// Every quantitative artefact: those with a judged row, those with only
    /// plot rows, and those not reproduced.
    pub artefacts: usize,
    /// Artefacts with at least one judged row.
    pub artefacts_reproduced: usize,
    /// Of the judged emergent rows, those whose paper value the paper's own
    /// figures contradict (`paper_inconsistent`), and how many of them hold:
    /// the headline also says what the rows a consistent model could reach
    /// give. They stay in `emergent_judged` and `emergent_within`.
    #[serde(default)]
    pub emergent_paper_inconsistent: usize,
    #[serde(default)]
    pub emergent_paper_inconsistent_within: usize,
}

impl Headline {
    pub fn of(rows: &[ReproRow], not_reproduced: &[NotReproduced]) -> Headline {
        let mut h = Headline::default();
        let mut all = BTreeSet::new();
        let mut reproduced = BTreeSet::new();
        for r in rows {
            all.insert(r.artefact.as_str());
            if !r.judged() {
                h.plot_only += 1;
                continue;
            }
            reproduced.insert(r.artefact.as_str());
            match r.basis {
                Basis::Emergent => {
                    let within = usize::from(r.within == Some(true));
                    h.emergent_judged += 1;
                    h.emergent_within += within;
                    if r.paper_inconsistent.is_some() {
                        h.emergent_paper_inconsistent += 1;
                        h.emergent_paper_inconsistent_within += within;
                    }
                }
                Basis::Calibrated => h.calibrated += 1,
                Basis::Arithmetic => h.arithmetic += 1,
                Basis::Input => h.input += 1,
                Basis::Unset => unreachable!("rows are checked before the headline"),
            }
        }
        for n in not_reproduced {
            all.insert(n.artefact.as_str());
        }
        h.not_reproduced = not_reproduced.len();
        h.artefacts = all.len();
        h.artefacts_reproduced = reproduced.len();
        h
    }

    /// The console's closing line. Where some judged rows carry paper
    /// values the paper contradicts, a last clause gives the count over the
    /// others; the first count always covers every judged emergent row.
    pub fn line(&self, paper: &str) -> String {
        let mut line = format!(
            "{paper}: emergent {} of {} within tolerance; {} calibrated, {} arithmetic, {} input; {} of {} artefacts reproduced",
            self.emergent_within,
            self.emergent_judged,
            self.calibrated,
            self.arithmetic,
            self.input,
            self.artefacts_reproduced,
            self.artefacts
        );
        if let Some(consistent) = self.consistent_text() {
            line.push_str("; ");
            line.push_str(&consistent);
        }
        line
    }

    /// "13 of 17 outside the 6 rows the paper's own figures contradict",
    /// or `None` when no judged row is so marked.
    pub fn consistent_text(&self) -> Option<String> {
        (self.emergent_paper_inconsistent > 0).then(|| {
            format!(
                "{} of {} outside the {} rows the paper's own figures contradict",
                self.emergent_within - self.emergent_paper_inconsistent_within,
                self.emergent_judged - self.emergent_paper_inconsistent,
                self.emergent_paper_inconsistent
            )
        })
    }

    /// True when every judged emergent row holds (exit code 0).
    pub fn emergent_all_within(&self) -> bool {
        self.emergent_within == self.emergent_judged
    }
}

/// A row that breaks the contract.
#[derive(Debug, thiserror::Error)]
#[error("{paper}: {artefact} / {quantity}: {problem}")]
pub struct ContractError {
    pub paper: String,
    pub artefact: String,
    pub quantity: String,
    pub problem: String,
}

/// Whether a calibration target covers `row`: a target is an artefact
/// (`Fig. 2`: every row of it) or one quantity of an artefact
/// (`Table 3 / processors`: a workload characteristic the paper tabulates
/// beside the times it reports, which stay predictions).
pub fn fitted_to(target: &str, row: &ReproRow) -> bool {
    match target.split_once(" / ") {
        Some((artefact, quantity)) => artefact == row.artefact && quantity == row.quantity,
        None => target == row.artefact,
    }
}

/// `reproduce-PAPER.json`: one object.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReproReport {
    pub schema_version: u32,
    pub paper: String,
    pub mmulab_version: String,
    pub git_commit: String,
    pub quick: bool,
    pub seeds: Seeds,
    /// Every fitted input of the presets run, and the artefact it was
    /// fitted to: rows of those artefacts are never `emergent`.
    pub calibration: BTreeMap<String, String>,
    pub rows: Vec<ReproRow>,
    pub not_reproduced: Vec<NotReproduced>,
    pub headline: Headline,
}

/// Where the report was made: version and commit of the build.
#[derive(Clone, Debug)]
pub struct Provenance {
    pub mmulab_version: String,
    pub git_commit: String,
}

impl ReproReport {
    /// Checks every row against the contract and the paper's calibration
    /// set (artefact names the presets were fitted to: a row of such an
    /// artefact cannot be emergent), then counts the headline.
    pub fn new(
        paper: &str,
        table: ReproTable,
        quick: bool,
        provenance: &Provenance,
    ) -> Result<ReproReport, ContractError> {
        let calibration = &table.calibration;
        for r in &table.rows {
            let fail = |problem: String| ContractError {
                paper: paper.into(),
                artefact: r.artefact.clone(),
                quantity: r.quantity.clone(),
                problem,
            };
            if r.basis == Basis::Unset {
                return Err(fail("no basis".into()));
            }
            let fitted: Vec<&str> = calibration
                .iter()
                .filter(|(_, target)| fitted_to(target, r))
                .map(|(k, _)| k.as_str())
                .collect();
            if r.basis == Basis::Emergent && !fitted.is_empty() {
                return Err(fail(format!(
                    "emergent, but the preset was fitted to it ({})",
                    fitted.join(", ")
                )));
            }
            if r.basis == Basis::Calibrated {
                if r.calibrates.is_empty() {
                    return Err(fail("calibrated, but names no fitted input".into()));
                }
                if let Some(k) = r.calibrates.iter().find(|k| !calibration.contains_key(*k)) {
                    return Err(fail(format!(
                        "calibrates `{k}`, which no preset's [calibration] table names"
                    )));
                }
            }
            if r.kind == RowKind::PlotOnly && r.within.is_some() {
                return Err(fail("plot_only rows are never judged".into()));
            }
            if r.kind != RowKind::PlotOnly && r.within.is_none() {
                return Err(fail("a judged row without a verdict".into()));
            }
            if let Some(why) = &r.paper_inconsistent
                && (r.basis != Basis::Emergent || !r.judged() || why.trim().is_empty())
            {
                return Err(fail(
                    "paper_inconsistent is for judged emergent rows, with where the arithmetic is"
                        .into(),
                ));
            }
            if r.quantity.contains('[') {
                return Err(fail(
                    "conditions belong in `conditions`, not `[...]`".into(),
                ));
            }
        }
        let headline = Headline::of(&table.rows, &table.not_reproduced);
        let calibration = calibration.clone();
        Ok(ReproReport {
            schema_version: SCHEMA_VERSION,
            paper: paper.into(),
            mmulab_version: provenance.mmulab_version.clone(),
            git_commit: provenance.git_commit.clone(),
            quick,
            seeds: table.seeds,
            calibration,
            rows: table.rows,
            not_reproduced: table.not_reproduced,
            headline,
        })
    }

    pub fn headline_line(&self) -> String {
        self.headline.line(&self.paper)
    }

    /// Plain-text side-by-side table, then the not-reproduced list.
    pub fn render(&self) -> String {
        let mut t = Table::new(&[
            "artefact",
            "quantity",
            "conditions",
            "paper",
            "mmulab",
            "95% CI",
            "unit",
            "dev %",
            "tol %",
            "ok",
            "basis",
            "note",
        ]);
        for r in &self.rows {
            let c = r.cells();
            t.row(vec![
                r.artefact.clone(),
                r.quantity.clone(),
                r.conditions_text(),
                c.paper,
                c.mmulab,
                c.ci,
                r.unit.clone(),
                c.deviation,
                c.tolerance,
                c.ok.into(),
                r.basis.as_str().into(),
                r.note.clone(),
            ]);
        }
        let mut out = t.render();
        if !self.not_reproduced.is_empty() {
            out.push_str("\nnot reproduced:\n");
            for n in &self.not_reproduced {
                out.push_str(&format!("  {}: {}\n", n.artefact, n.reason));
            }
        }
        out
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serialises") + "\n"
    }

    /// The condition keys of every row, sorted: the CSV's middle columns.
    pub fn condition_keys(&self) -> Vec<String> {
        let keys: BTreeSet<&String> = self.rows.iter().flat_map(|r| r.conditions.keys()).collect();
        keys.into_iter().cloned().collect()
    }

    /// The rows as CSV: one per line, the conditions as columns.
    pub fn to_csv(&self) -> String {
        let conds = self.condition_keys();
        let mut w = csv::Writer::from_writer(Vec::new());
        let mut header: Vec<String> = vec![
            "paper_id".into(),
            "artefact".into(),
            "quantity".into(),
            "unit".into(),
        ];
        for c in &conds {
            assert!(
                !CSV_FIXED.contains(&c.as_str()),
                "condition `{c}` clashes with a fixed CSV column"
            );
            header.push(c.clone());
        }
        header.extend(CSV_FIXED[4..].iter().map(|s| s.to_string()));
        w.write_record(&header).expect("in-memory CSV");
        let num = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
        for r in &self.rows {
            let mut rec = vec![
                self.paper.clone(),
                r.artefact.clone(),
                r.quantity.clone(),
                r.unit.clone(),
            ];
            for c in &conds {
                rec.push(r.conditions.get(c).map_or(String::new(), value_text));
            }
            rec.extend([
                num(r.paper),
                num(r.mmulab),
                num(r.ci_low),
                num(r.ci_high),
                num(r.deviation_pct),
                num(r.tolerance_pct),
                r.within.map_or(String::new(), |b| b.to_string()),
                r.kind.as_str().into(),
                r.basis.as_str().into(),
                r.calibrates.join(";"),
                r.note.clone(),
                r.paper_inconsistent.clone().unwrap_or_default(),
            ]);
            w.write_record(&rec).expect("in-memory CSV");
        }
        String::from_utf8(w.into_inner().expect("in-memory CSV")).expect("UTF-8 fields")
    }

    /// Writes `DIR/reproduce-PAPER.json` and `DIR/reproduce-PAPER.csv`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join(format!("reproduce-{}.json", self.paper)),
            self.to_json(),
        )?;
        std::fs::write(
            dir.join(format!("reproduce-{}.csv", self.paper)),
            self.to_csv(),
        )
    }
}

/// The CSV's fixed columns; the condition columns go after the first four.
const CSV_FIXED: &[&str] = &[
    "paper_id",
    "artefact",
    "quantity",
    "unit",
    "paper",
    "mmulab",
    "ci_low",
    "ci_high",
    "deviation_pct",
    "tolerance_pct",
    "within",
    "kind",
    "basis",
    "calibrates",
    "note",
    "paper_inconsistent",
];

/// Numbers in tables: three significant figures for small values, no
/// exponent notation.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a >= 1000.0 || v == v.trunc() && a < 1e15 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prov() -> Provenance {
        Provenance {
            mmulab_version: "0.0.0".into(),
            git_commit: "abc".into(),
        }
    }

    fn calib() -> BTreeMap<String, String> {
        BTreeMap::from([("costs.ipi_send_cycles".to_string(), "Fig. 2".to_string())])
    }

    fn table() -> ReproTable {
        ReproTable {
            calibration: calib(),
            ..ReproTable::default()
        }
    }

    #[test]
    fn numeric_row_within_and_outside() {
        let r = ReproRow::numeric("Fig. 2", "intercept_us", 430.0, 450.0, 10.0);
        assert_eq!(r.within, Some(true));
        assert!((r.deviation_pct.unwrap() - 4.651).abs() < 0.01);
        let r = ReproRow::numeric("Fig. 2", "slope_us_per_cpu", 55.0, 70.0, 10.0);
        assert_eq!(r.within, Some(false));
    }

    #[test]
    fn a_row_without_basis_is_refused() {
        let mut t = table();
        t.push(ReproRow::numeric("Table 4", "median", 1.0, 1.0, 5.0));
        let e = ReproReport::new("p", t, true, &prov()).unwrap_err();
        assert!(e.to_string().contains("no basis"), "{e}");
    }

    #[test]
    fn an_emergent_row_of_a_calibrated_artefact_is_refused() {
        let mut t = table();
        t.push(ReproRow::numeric("Fig. 2", "slope", 55.0, 55.0, 5.0).emergent());
        let e = ReproReport::new("p", t, true, &prov()).unwrap_err();
        assert!(e.to_string().contains("costs.ipi_send_cycles"), "{e}");
        // A target naming one quantity blocks that quantity only.
        let mut t = table();
        t.calibration
            .insert("workload.jobs".into(), "Table 2 / processors".into());
        t.push(ReproRow::numeric("Table 2", "median", 939.0, 900.0, 25.0).emergent());
        assert!(ReproReport::new("p", t.clone(), true, &prov()).is_ok());
        t.push(ReproRow::numeric("Table 2", "processors", 6.3, 6.3, 25.0).emergent());
        let e = ReproReport::new("p", t, true, &prov()).unwrap_err();
        assert!(e.to_string().contains("workload.jobs"), "{e}");
        let mut t = table();
        t.push(ReproRow::numeric("Fig. 2", "slope", 55.0, 55.0, 5.0).calibrated(&["costs.nope"]));
        let e = ReproReport::new("p", t, true, &prov()).unwrap_err();
        assert!(e.to_string().contains("costs.nope"), "{e}");
    }

    #[test]
    fn headline_counts_only_judged_emergent_rows() {
        let mut t = table();
        t.push(
            ReproRow::numeric("Fig. 2", "slope", 55.0, 56.0, 5.0)
                .calibrated(&["costs.ipi_send_cycles"]),
        );
        t.push(ReproRow::numeric("Table 4", "median", 425.0, 157.0, 25.0).emergent());
        t.push(ReproRow::numeric("Table 4", "mean", 425.0, 420.0, 25.0).emergent());
        t.push(ReproRow::claim("Table 2", "skew", Some(1.0), true, "x").emergent());
        t.push(ReproRow::plot_only("Fig. 3", "y", None, 1.0, "").emergent());
        t.push(ReproRow::numeric("Table V", "cycles", 1.0, 1.0, 0.0).arithmetic());
        t.not_reproduced("Table 9", "needs Camelot's workload");
        let r = ReproReport::new("black89", t, true, &prov()).unwrap();
        let h = r.headline;
        assert_eq!((h.emergent_judged, h.emergent_within), (3, 2));
        assert_eq!(
            (h.calibrated, h.arithmetic, h.input, h.plot_only),
            (1, 1, 0, 1)
        );
        // Fig. 2, Table 4, Table 2, Table V judged; Fig. 3 plot only;
        // Table 9 not reproduced.
        assert_eq!((h.artefacts_reproduced, h.artefacts), (4, 6));
        assert!(!h.emergent_all_within());
        assert_eq!(
            r.headline_line(),
            "black89: emergent 2 of 3 within tolerance; 1 calibrated, 1 arithmetic, 0 input; 4 of 6 artefacts reproduced"
        );
    }

    #[test]
    fn rows_the_paper_contradicts_stay_counted_and_get_a_clause_of_their_own() {
        let mut t = table();
        let why = "docs/papers/x.md: no reading gives it";
        t.push(
            ReproRow::numeric("§7.2", "pages", 3.0, 2.0, 0.0)
                .emergent()
                .paper_inconsistent(why),
        );
        t.push(
            ReproRow::numeric("§7.2", "shorts", 6.0, 6.0, 0.0)
                .emergent()
                .paper_inconsistent(why),
        );
        t.push(ReproRow::numeric("§7.3", "rate", 5.0, 5.1, 10.0).emergent());
        t.push(ReproRow::numeric("§7.3", "sleeps", 2.75, 4.0, 10.0).emergent());
        let r = ReproReport::new("fleisch89", t, true, &prov()).unwrap();
        let h = r.headline;
        assert_eq!((h.emergent_judged, h.emergent_within), (4, 2));
        assert_eq!(
            (
                h.emergent_paper_inconsistent,
                h.emergent_paper_inconsistent_within
            ),
            (2, 1)
        );
        assert_eq!(
            r.headline_line(),
            "fleisch89: emergent 2 of 4 within tolerance; 0 calibrated, 0 arithmetic, 0 input; \
             2 of 2 artefacts reproduced; 1 of 2 outside the 2 rows the paper's own figures contradict"
        );
        assert!(r.to_csv().lines().nth(1).unwrap().ends_with(why));
        assert!(
            r.to_json()
                .contains("\"paper_inconsistent\": \"docs/papers/x.md")
        );
        // Rows without the mark serialise as before: no key, no clause.
        let mut t = table();
        t.push(ReproRow::numeric("§7.3", "rate", 5.0, 5.1, 10.0).emergent());
        let r = ReproReport::new("fleisch89", t, true, &prov()).unwrap();
        assert!(!r.to_json().contains("\"paper_inconsistent\":"));
        assert!(!r.headline_line().contains("contradict"));
    }

    #[test]
    fn only_judged_emergent_rows_may_be_marked_inconsistent_and_only_with_a_reason() {
        for row in [
            ReproRow::numeric("§7.2", "pages", 3.0, 3.0, 5.0)
                .arithmetic()
                .paper_inconsistent("why"),
            ReproRow::plot_only("§7.2", "pages", Some(3.0), 2.0, "")
                .emergent()
                .paper_inconsistent("why"),
            ReproRow::numeric("§7.2", "pages", 3.0, 2.0, 5.0)
                .emergent()
                .paper_inconsistent(" "),
        ] {
            let mut t = table();
            t.push(row);
            let e = ReproReport::new("fleisch89", t, true, &prov()).unwrap_err();
            assert!(e.problem.contains("paper_inconsistent"), "{e}");
        }
    }

    #[test]
    fn json_and_csv_carry_the_contract() {
        let mut t = table();
        t.seeds(1, 10);
        t.push(
            ReproRow::numeric("Fig. 7", "speedup", 68.0, 60.0, 20.0)
                .unit("%")
                .at("cpus", 16)
                .at("shootdowns", 4000)
                .ci(58.0, 62.0)
                .emergent()
                .with_note("a, \"quoted\" note"),
        );
        t.push(
            ReproRow::plot_only("Fig. 8", "speedup", None, 3.0, "")
                .at("cpus", 2)
                .input(),
        );
        let r = ReproReport::new("romanescu10", t, false, &prov()).unwrap();
        let v: Value = serde_json::from_str(&r.to_json()).unwrap();
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
            assert!(v.get(k).is_some(), "missing {k}");
        }
        let row = &v["rows"][0];
        for k in [
            "artefact",
            "quantity",
            "unit",
            "conditions",
            "paper",
            "mmulab",
            "ci_low",
            "ci_high",
            "deviation_pct",
            "tolerance_pct",
            "within",
            "kind",
            "basis",
            "note",
        ] {
            assert!(row.get(k).is_some(), "row lacks {k}");
        }
        assert_eq!(row["conditions"]["shootdowns"], 4000);
        assert_eq!(v["rows"][1]["within"], Value::Null);
        let csv = r.to_csv();
        let mut rd = csv::Reader::from_reader(csv.as_bytes());
        let header: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
        assert_eq!(&header[4..6], ["cpus", "shootdowns"]);
        let recs: Vec<csv::StringRecord> = rd.records().map(Result::unwrap).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(&recs[0][5], "4000");
        assert_eq!(&recs[1][5], "");
        assert_eq!(
            recs[0]
                .get(header.iter().position(|h| h == "note").unwrap())
                .unwrap(),
            "a, \"quoted\" note"
        );
    }
}
