//! uhlig94's printed numbers: `paper-data/tables.toml` read with the file and key named on error, and the tables recomputed from them (the `arithmetic` rows).

use super::*;

pub(super) fn invalid(s: impl Into<String>) -> SpecError {
    SpecError::Invalid(s.into())
}

/// The paper's printed numbers (reproduce-only: not a runnable spec).
pub(super) const TABLES: &str = "uhlig94/paper-data/tables.toml";
/// The simulated sweeps' settings (reproduce-only: not a runnable spec).
pub(super) const SHAPE: &str = "uhlig94/paper-data/shape.toml";

pub(super) fn load_toml(src: &Experiments, rel: &str) -> Result<toml::Table, SpecError> {
    let text = src
        .read(rel)
        .map_err(|e| SpecError::Invalid(e.to_string()))?;
    text.parse()
        .map_err(|e: toml::de::Error| invalid(format!("{}: {e}", src.origin(rel))))
}

/// Typed access to a TOML table that names the file and key on error.
pub(super) struct Keys<'a> {
    pub(super) t: &'a toml::Table,
    pub(super) origin: String,
}

impl<'a> Keys<'a> {
    pub(super) fn get(&self, key: &str) -> Result<&'a toml::Value, SpecError> {
        self.t
            .get(key)
            .ok_or_else(|| invalid(format!("{}: {key}: missing", self.origin)))
    }
    pub(super) fn num(&self, key: &str) -> Result<f64, SpecError> {
        as_num(self.get(key)?)
            .ok_or_else(|| invalid(format!("{}: {key}: expected a number", self.origin)))
    }
    pub(super) fn nums(&self, key: &str) -> Result<Vec<f64>, SpecError> {
        match self.get(key)? {
            toml::Value::Array(a) => a.iter().map(as_num).collect::<Option<Vec<_>>>(),
            _ => None,
        }
        .ok_or_else(|| {
            invalid(format!(
                "{}: {key}: expected a list of numbers",
                self.origin
            ))
        })
    }
    pub(super) fn strs(&self, key: &str) -> Result<Vec<String>, SpecError> {
        match self.get(key)? {
            toml::Value::Array(a) => a
                .iter()
                .map(|v| v.as_str().map(String::from))
                .collect::<Option<Vec<_>>>(),
            _ => None,
        }
        .ok_or_else(|| {
            invalid(format!(
                "{}: {key}: expected a list of strings",
                self.origin
            ))
        })
    }
    pub(super) fn sub(&self, key: &str) -> Result<Keys<'a>, SpecError> {
        match self.get(key)? {
            toml::Value::Table(t) => Ok(Keys {
                t,
                origin: format!("{}: {key}", self.origin),
            }),
            _ => Err(invalid(format!("{}: {key}: expected a table", self.origin))),
        }
    }
    /// A list of exactly `n` numbers; -1 means "no value" (Ultrix's L3).
    pub(super) fn row(&self, key: &str, n: usize) -> Result<Vec<Option<f64>>, SpecError> {
        let v = self.nums(key)?;
        if v.len() != n {
            return Err(invalid(format!(
                "{}: {key}: expected {n} numbers, found {}",
                self.origin,
                v.len()
            )));
        }
        Ok(v.into_iter().map(|x| (x >= 0.0).then_some(x)).collect())
    }
}

pub(super) fn as_num(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Float(f) => Some(*f),
        toml::Value::Integer(i) => Some(*i as f64),
        _ => None,
    }
}

/// An `arithmetic` row that must match the printed value to its last digit: `decimals`
/// printed digits.
pub(super) fn exact(
    artefact: &str,
    quantity: &str,
    unit: &str,
    paper: f64,
    computed: f64,
    decimals: i32,
    how: &str,
) -> ReproRow {
    let step = 10f64.powi(-decimals);
    let rounded = (computed / step).round() * step;
    let tol = if paper == 0.0 {
        0.0
    } else {
        0.5 * step / paper.abs() * 100.0
    };
    let mut r = ReproRow::numeric(artefact, quantity, paper, rounded, tol);
    r.within = Some((rounded - paper).abs() < step * 0.01);
    r.unit(unit)
        .arithmetic()
        .with_note(&format!("{how} = {computed:.4}; to the printed digit"))
}

pub(super) const TYPES: [&str; 6] = ["L1U", "L1K", "L2", "L3", "Invalid", "Modify"];

/// The rows computed from the paper's own tables: all `arithmetic`.
pub fn exact_rows(src: &Experiments, rel: &str, table: &mut ReproTable) -> Result<(), SpecError> {
    let doc = load_toml(src, rel)?;
    let top = Keys {
        t: &doc,
        origin: src.origin(rel),
    };
    let p = top.sub("paper")?;
    let systems = p.strs("systems")?;
    let n = systems.len();
    let ns = p.num("ns_per_cycle")?;
    let cyc = p.sub("table3_cycles")?;
    let columns = p.strs("table3_column")?;
    let counts_t = p.sub("table5_counts")?;
    let secs_t = p.sub("table6_seconds")?;
    let run_time = p.nums("table5_run_time_s")?;
    let totals = p.nums("table5_total")?;
    let t6_total = p.nums("table6_total_s")?;
    let t6_pct = p.nums("table6_pct_run_time")?;
    let ratio = p.nums("table2_ratio")?;
    for (k, v) in [
        ("table3_column", columns.len()),
        ("table5_run_time_s", run_time.len()),
        ("table5_total", totals.len()),
        ("table6_total_s", t6_total.len()),
        ("table6_pct_run_time", t6_pct.len()),
        ("table2_ratio", ratio.len()),
    ] {
        if v != n {
            return Err(invalid(format!(
                "{}: paper.{k}: {v} values for {n} systems",
                src.origin(rel)
            )));
        }
    }
    let mut computed_total = vec![0.0; n];
    let mut cells: Vec<Vec<Option<f64>>> = Vec::new();
    let mut counts_all: Vec<Vec<Option<f64>>> = Vec::new();
    for (i, sys) in systems.iter().enumerate() {
        let key = ROW_KEYS
            .get(i)
            .ok_or_else(|| invalid("more than five systems"))?;
        let counts = counts_t.row(key, 6)?;
        let cycles = cyc.row(&columns[i], 6)?;
        let printed = secs_t.row(key, 6)?;
        let mut row = Vec::new();
        for t in 0..6 {
            let v = match (counts[t], cycles[t]) {
                (Some(c), Some(k)) => Some(c * k * ns * 1e-9),
                _ => None,
            };
            match (v, printed[t]) {
                (Some(v), Some(pv)) => {
                    computed_total[i] += v;
                    table.push(
                        exact(
                            "Table VI",
                            &format!("{} miss time", TYPES[t]),
                            "s",
                            pv,
                            v,
                            2,
                            &format!(
                                "{} x {} cycles x {ns} ns",
                                counts[t].unwrap_or(0.0),
                                cycles[t].unwrap_or(0.0)
                            ),
                        )
                        .at("os", sys.as_str()),
                    );
                }
                (None, None) => {}
                _ => {
                    return Err(invalid(format!(
                        "{}: paper.table6_seconds.{key}: cell {} has a value where Table V/III has none, or none where they have one",
                        src.origin(rel),
                        TYPES[t]
                    )));
                }
            }
            row.push(v);
        }
        cells.push(row);
        counts_all.push(counts);
        table.push(
            exact(
                "Table VI",
                "TLB service time",
                "s",
                t6_total[i],
                computed_total[i],
                2,
                "sum of the computed cells",
            )
            .at("os", sys.as_str()),
        );
        table.push(
            exact(
                "Table VI",
                "share of run time",
                "%",
                t6_pct[i],
                computed_total[i] / run_time[i] * 100.0,
                2,
                &format!(
                    "computed total / {} s (Table V run time) x 100",
                    run_time[i]
                ),
            )
            .at("os", sys.as_str()),
        );
        // Table V's sums, printed both ways.
        let sum: f64 = counts_all[i].iter().flatten().sum();
        let mut r = ReproRow::numeric("Table V", "total misses", totals[i], sum, 0.0)
            .unit("misses")
            .at("os", sys.as_str())
            .arithmetic();
        if sum != totals[i] {
            r = r.with_note(&format!(
                "the printed row sums to {sum:.0}, {:+.0} from the printed total {:.0}: both shown; a transcription slip in the paper",
                sum - totals[i],
                totals[i]
            ));
            r.within = Some((sum - totals[i]).abs() <= 1.0);
            r.kind = RowKind::Claim;
            r.paper = Some(totals[i]);
        } else {
            r = r.with_note("sum of the row's six cells");
        }
        table.push(r);
    }
    // Table II: ratios to Ultrix of the printed service times, and of the computed ones.
    for i in 0..n {
        table.push(
            exact(
                "Table II",
                "time ratio to Ultrix",
                "ratio",
                ratio[i],
                t6_total[i] / t6_total[0],
                2,
                &format!("{} s / {} s (printed totals)", t6_total[i], t6_total[0]),
            )
            .at("os", systems[i].as_str())
            .at("totals", "printed"),
        );
        table.push(
            exact(
                "Table II",
                "time ratio to Ultrix",
                "ratio",
                ratio[i],
                computed_total[i] / computed_total[0],
                2,
                "from the recomputed Table VI totals",
            )
            .at("os", systems[i].as_str())
            .at("totals", "recomputed"),
        );
    }
    // Table VII: Mach3+AFSin with the section 5.1 vectors.
    let afsin = 3;
    let c = &counts_all[afsin];
    let new_l1k = c[1].unwrap_or(0.0) * p.num("table7_new_l1k_cycles")? * ns * 1e-9;
    let new_l2 = c[2].unwrap_or(0.0) * p.num("table7_new_l2_cycles")? * ns * 1e-9;
    let old = &cells[afsin];
    let old_l1k = old[1].unwrap_or(0.0);
    let old_l2 = old[2].unwrap_or(0.0);
    // The paper does Table VII's arithmetic on Table VI's printed (rounded) cells: the
    // saved seconds are printed cell - new cell, the new total the sum of printed cells.
    let printed = secs_t.row("AFSin", 6)?;
    let pc = |i: usize| printed[i].unwrap_or(0.0);
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    let saved_l1k = pc(1) - r2(new_l1k);
    let saved_l2 = pc(2) - r2(new_l2);
    let new_total = (0..6).map(pc).sum::<f64>() - pc(1) - pc(2) + r2(new_l1k) + r2(new_l2);
    let unrounded = computed_total[afsin] - old_l1k - old_l2 + new_l1k + new_l2;
    let note =
        "the printed table swaps the L1K/L2 cost cells; its seconds use L1K 294->20, L2 407->40";
    let afsin_name = systems[afsin].as_str();
    let t7 = [
        exact(
            "Table VII",
            "new L1K miss time",
            "s",
            p.num("table7_new_l1k_s")?,
            new_l1k,
            2,
            "2,493,283 x 20 cycles x 60 ns",
        ),
        exact(
            "Table VII",
            "new L2 miss time",
            "s",
            p.num("table7_new_l2_s")?,
            new_l2,
            2,
            "330,803 x 40 cycles x 60 ns",
        ),
        exact(
            "Table VII",
            "L1K time saved",
            "s",
            p.num("table7_saved_l1k_s")?,
            saved_l1k,
            2,
            &format!(
                "printed 43.98 - new 2.99 (unrounded {:.4})",
                old_l1k - new_l1k
            ),
        ),
        exact(
            "Table VII",
            "L2 time saved",
            "s",
            p.num("table7_saved_l2_s")?,
            saved_l2,
            2,
            &format!("printed 8.08 - new 0.79 (unrounded {:.4})", old_l2 - new_l2),
        ),
        exact(
            "Table VII",
            "new TLB service time",
            "s",
            p.num("table7_new_total_s")?,
            new_total,
            2,
            "printed cells with the two replaced",
        )
        .with_note(&format!(
            "sum of printed cells with L1K, L2 replaced = {new_total:.2} (unrounded {unrounded:.4}); {note}"
        )),
        exact(
            "Table VII",
            "time saved",
            "s",
            p.num("table7_saved_total_s")?,
            saved_l1k + saved_l2,
            2,
            &format!(
                "40.99 + 7.29 (unrounded {:.4})",
                computed_total[afsin] - unrounded
            ),
        ),
        exact(
            "Table VII",
            "L1K time drop",
            "%",
            p.num("table7_l1k_drop_pct")?,
            (1.0 - new_l1k / old_l1k) * 100.0,
            0,
            "1 - new/old",
        ),
        exact(
            "Table VII",
            "L2 time drop",
            "%",
            p.num("table7_l2_drop_pct")?,
            (1.0 - new_l2 / old_l2) * 100.0,
            0,
            "1 - new/old",
        ),
    ];
    for r in t7 {
        table.push(r.at("os", afsin_name));
    }
    // Section 4.2's L1K shares and other quoted derived numbers.
    for (i, key) in [
        (1, "sec42_l1k_share_pct_osf1"),
        (2, "sec42_l1k_share_pct_mach3"),
    ] {
        table.push(
            exact(
                "§4.2.1",
                "L1K share of TLB time",
                "%",
                p.num(key)?,
                cells[i][1].unwrap_or(0.0) / computed_total[i] * 100.0,
                0,
                "L1K s / total s",
            )
            .at("os", systems[i].as_str()),
        );
    }
    let ultrix_sum: f64 = counts_all[0].iter().flatten().sum();
    table.push(
        exact(
            "§5",
            "L1U share of misses",
            "%",
            p.num("sec5_ultrix_l1u_share_pct")?,
            counts_all[0][0].unwrap_or(0.0) / ultrix_sum * 100.0,
            1,
            "L1U / all misses (Table V)",
        )
        .at("os", systems[0].as_str()),
    );
    table.push(
        exact(
            "§4.2.2",
            "L1U miss ratio",
            "ratio",
            p.num("sec422_l1u_ratio")?,
            counts_all[2][0].unwrap_or(0.0) / counts_all[1][0].unwrap_or(1.0),
            1,
            "Table V",
        )
        .at("os", systems[2].as_str())
        .at("over", systems[1].as_str()),
    );
    table.push(
        exact(
            "§4.2.4",
            "L1U time added by AFS",
            "s",
            p.num("sec424_afsin_l1u_added_s")?,
            t6_l(&secs_t, "AFSin", 0)? - t6_l(&secs_t, "Mach3", 0)?,
            2,
            "printed Table VI cells",
        )
        .at("os", afsin_name)
        .at("over", systems[2].as_str()),
    );
    table.push(
        exact(
            "§4.2.4",
            "L1K time added by AFS",
            "s",
            p.num("sec424_afsin_l1k_added_s")?,
            t6_l(&secs_t, "AFSin", 1)? - t6_l(&secs_t, "Mach3", 1)?,
            1,
            "printed Table VI cells",
        )
        .at("os", afsin_name)
        .at("over", systems[2].as_str()),
    );
    let quoted = p.num("sec4_text_afsout_total")?;
    table.push(
        ReproRow::claim(
            "§4 text",
            "AFSout total misses as quoted",
            Some(totals[4]),
            true,
            &format!("the text quotes {quoted:.0}; Tables II and V print {:.0} (a typo in the text; the tables are used)", totals[4]),
        )
        .unit("misses")
        .at("os", systems[4].as_str())
        .arithmetic(),
    );
    Ok(())
}

/// tables.toml's keys of the five systems, in its order.
pub(super) const ROW_KEYS: [&str; 5] = ["Ultrix", "OSF1", "Mach3", "AFSin", "AFSout"];

pub(super) fn t6_l(secs: &Keys, key: &str, i: usize) -> Result<f64, SpecError> {
    secs.row(key, 6)?[i].ok_or_else(|| invalid(format!("{}: {key}: cell {i} missing", secs.origin)))
}

/// The paper's own numbers the simulated rows are compared with.
pub(super) struct PaperNumbers {
    /// Table V's misses per system (Ultrix, OSF/1, Mach3, AFSin, AFSout), indexed by
    /// [`MissType::index`] (tables.toml lists Invalid before Modify).
    pub(super) counts: Vec<[Option<f64>; 6]>,
    /// Table II's ratios of TLB service time to Ultrix's.
    pub(super) ratio: Vec<f64>,
    /// Table VI's total seconds.
    pub(super) total_s: Vec<f64>,
    /// §4.2.1's L1K shares of TLB time (%), OSF/1 and Mach 3.0.
    pub(super) l1k_share_pct: [f64; 2],
}

impl PaperNumbers {
    pub(super) fn load(src: &Experiments, rel: &str) -> Result<PaperNumbers, SpecError> {
        let doc = load_toml(src, rel)?;
        let p = Keys {
            t: &doc,
            origin: src.origin(rel),
        }
        .sub("paper")?;
        let counts_t = p.sub("table5_counts")?;
        let mut counts = Vec::new();
        for key in ROW_KEYS {
            let c = counts_t.row(key, 6)?;
            // tables.toml: L1U, L1K, L2, L3, Invalid, Modify.
            let mut by_type = [None; 6];
            for (i, t) in [
                MissType::L1U,
                MissType::L1K,
                MissType::L2,
                MissType::L3,
                MissType::Invalid,
                MissType::Modify,
            ]
            .iter()
            .enumerate()
            {
                by_type[t.index()] = c[i];
            }
            counts.push(by_type);
        }
        Ok(PaperNumbers {
            counts,
            ratio: p.nums("table2_ratio")?,
            total_s: p.nums("table6_total_s")?,
            l1k_share_pct: [
                p.num("sec42_l1k_share_pct_osf1")?,
                p.num("sec42_l1k_share_pct_mach3")?,
            ],
        })
    }
}
