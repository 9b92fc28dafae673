//! The row format shared by every paper reproduction (the contract fixed by
//! the Mach issue): `artefact`, `quantity`, `paper`, `mmulab`,
//! `deviation_pct`, `tolerance_pct`, `within`.

use crate::table::Table;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One compared quantity. `paper` is `None` for "plot only" rows and for
/// shape claims, where `within` says whether the claim holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReproRow {
    pub artefact: String,
    pub quantity: String,
    pub paper: Option<f64>,
    pub mmulab: Option<f64>,
    pub deviation_pct: Option<f64>,
    pub tolerance_pct: Option<f64>,
    pub within: bool,
    /// Free text: the claim checked, or why a row has no number.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// `numeric` (judged by tolerance), `claim` (a shape claim: `within`
    /// says whether it holds) or `plot_only` (shown, never failing).
    #[serde(default)]
    pub kind: RowKind,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    #[default]
    Numeric,
    Claim,
    PlotOnly,
}

impl ReproRow {
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
            artefact: artefact.into(),
            quantity: quantity.into(),
            paper: Some(paper),
            mmulab: Some(mmulab),
            deviation_pct: Some(deviation_pct),
            tolerance_pct: Some(tolerance_pct),
            within: deviation_pct.abs() <= tolerance_pct,
            note: String::new(),
            kind: RowKind::Numeric,
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
            artefact: artefact.into(),
            quantity: quantity.into(),
            paper: None,
            mmulab,
            deviation_pct: None,
            tolerance_pct: None,
            within: holds,
            note: claim.into(),
            kind: RowKind::Claim,
        }
    }

    /// A value the paper only plots (or states without a number): reported
    /// for the record, never failing.
    pub fn plot_only(
        artefact: &str,
        quantity: &str,
        paper: Option<f64>,
        mmulab: f64,
        note: &str,
    ) -> ReproRow {
        ReproRow {
            artefact: artefact.into(),
            quantity: quantity.into(),
            paper,
            mmulab: Some(mmulab),
            deviation_pct: paper.map(|p| deviation_pct(p, mmulab)),
            tolerance_pct: None,
            within: true,
            note: note.into(),
            kind: RowKind::PlotOnly,
        }
    }

    pub fn with_note(mut self, note: &str) -> ReproRow {
        self.note = note.into();
        self
    }
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

/// The rows of one paper's reproduction.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReproTable {
    pub rows: Vec<ReproRow>,
}

impl ReproTable {
    pub fn push(&mut self, row: ReproRow) {
        self.rows.push(row);
    }

    pub fn all_within(&self) -> bool {
        self.rows.iter().all(|r| r.within)
    }

    /// Plain-text side-by-side table.
    pub fn render(&self) -> String {
        let mut t = Table::new(&[
            "artefact", "quantity", "paper", "mmulab", "dev %", "tol %", "ok", "note",
        ]);
        for r in &self.rows {
            t.row(vec![
                r.artefact.clone(),
                r.quantity.clone(),
                match (r.kind, r.paper) {
                    (RowKind::Claim, _) => "claim".into(),
                    (_, None) => "plot only".into(),
                    (_, Some(p)) => fmt_num(p),
                },
                r.mmulab.map_or("-".into(), fmt_num),
                r.deviation_pct.map_or("-".into(), |d| format!("{d:+.1}")),
                r.tolerance_pct.map_or("-".into(), |d| format!("{d:.0}")),
                if r.within { "yes".into() } else { "NO".into() },
                r.note.clone(),
            ]);
        }
        t.render()
    }

    /// Writes the rows as a JSON list (the `reproduce-PAPER.json` contract).
    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(&self.rows).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

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

    #[test]
    fn numeric_row_within_and_outside() {
        let r = ReproRow::numeric("Fig. 2", "intercept_us", 430.0, 450.0, 10.0);
        assert!(r.within);
        assert!((r.deviation_pct.unwrap() - 4.651).abs() < 0.01);
        let r = ReproRow::numeric("Fig. 2", "slope_us_per_cpu", 55.0, 70.0, 10.0);
        assert!(!r.within);
    }

    #[test]
    fn json_has_contract_keys() {
        let mut t = ReproTable::default();
        t.push(ReproRow::numeric(
            "Fig. 2",
            "intercept_us",
            430.0,
            431.0,
            10.0,
        ));
        let v: serde_json::Value = serde_json::to_value(&t.rows).unwrap();
        let row = &v[0];
        for k in [
            "artefact",
            "quantity",
            "paper",
            "mmulab",
            "deviation_pct",
            "tolerance_pct",
            "within",
        ] {
            assert!(row.get(k).is_some(), "missing {k}");
        }
    }
}
