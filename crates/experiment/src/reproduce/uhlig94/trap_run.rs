//! One trap-driven pass of the software-TLB simulator as a sweep task (`kind = "swtlb-trap"`).

use super::*;

/// The sweep file of Tables II, V and VI's runs: the seven stand-ins on
/// the five OS models, each a trap-driven pass of the R2000 as the systems
/// use it, three seeds (`kind = "swtlb-trap"`, base `paper-data/shape.toml`).
pub const SYSTEMS: &str = "uhlig94/systems.sweep.toml";

/// One trap-driven pass of `mmulab-swtlb` (the Tapeworm way: one pass
/// over a stand-in's references, every TLB configuration of the pass at
/// once): a task of a uhlig94 sweep file (`kind = "swtlb-trap"`). Its base
/// is `uhlig94/paper-data/shape.toml`, which gives the OS models'
/// parameters, the stand-ins and the real TLB's slots; a point sets `os`
/// and `workload`, and may set `lower`, the partition points of the pass
/// (default 8), and `placement`, the placement policies (`A`-`D`, default
/// A): one setup for each partition point and policy, in that order, as
/// the R2000 has it otherwise (64 slots).
#[derive(Clone, Debug)]
pub struct TrapRun {
    pub os: OsKind,
    pub(super) params: OsParams,
    pub(super) workload: Workload,
    pub(super) real_slots: usize,
    pub(super) setups: Vec<TlbSetup>,
    /// Each setup's metric prefix: empty for the one default setup,
    /// `lower{L}.` when the point sets `lower`.
    pub(super) prefixes: Vec<String>,
}

impl TrapRun {
    /// The keys a sweep point may set.
    pub const KEYS: [&'static str; 4] = ["lower", "os", "placement", "workload"];

    /// The pass of `base` (shape.toml's text; `origin` names it) with a
    /// point's `values`. Errors name the key.
    pub fn of(
        origin: &str,
        base: &str,
        values: &BTreeMap<String, toml::Value>,
    ) -> Result<TrapRun, SpecError> {
        let shape = Shape::parse(base, origin, false)?;
        let key = |k: &str| -> Result<&str, SpecError> {
            values
                .get(k)
                .ok_or_else(|| {
                    invalid(format!("{k}: missing (the sweep's grid or points set it)"))
                })?
                .as_str()
                .ok_or_else(|| invalid(format!("{k}: expected a string")))
        };
        if let Some(k) = values.keys().find(|k| !Self::KEYS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "{k}: not a key of a trap-driven pass (its keys: {})",
                Self::KEYS.join(", ")
            )));
        }
        let os_key = key("os")?;
        let os = OsKind::from_key(os_key).ok_or_else(|| {
            invalid(format!(
                "os: unknown OS `{os_key}` (ultrix, osf1, mach3, afsin, afsout)"
            ))
        })?;
        let w = key("workload")?;
        let workload = shape.workloads.get(w).cloned().ok_or_else(|| {
            invalid(format!(
                "workload: no stand-in `{w}` in the base (it has: {})",
                shape
                    .workloads
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let list = |k: &str| -> Vec<toml::Value> {
            match values.get(k) {
                None => Vec::new(),
                Some(toml::Value::Array(a)) => a.clone(),
                Some(v) => vec![v.clone()],
            }
        };
        let mut lowers = Vec::new();
        for x in list("lower") {
            match x.as_integer() {
                Some(l) if (0..64).contains(&l) && !lowers.contains(&(l as usize)) => {
                    lowers.push(l as usize)
                }
                _ => {
                    return Err(invalid(format!(
                        "lower: expected distinct partition points in 0..64 (or one), got {}",
                        values["lower"]
                    )));
                }
            }
        }
        let mut placements = Vec::new();
        for x in list("placement") {
            match x.as_str().and_then(Placement::from_name) {
                Some(p) if !placements.contains(&p) => placements.push(p),
                _ => {
                    return Err(invalid(format!(
                        "placement: expected distinct policies of A, B, C, D (or one), got {}",
                        values["placement"]
                    )));
                }
            }
        }
        for (k, empty) in [
            ("lower", lowers.is_empty()),
            ("placement", placements.is_empty()),
        ] {
            if empty && values.contains_key(k) {
                return Err(invalid(format!("{k}: an empty list")));
            }
        }
        // Metric prefixes name what the point sets: `lower8.`, `B.`,
        // `lower8.B.`; none for the one default setup.
        let (by_lower, by_placement) = (!lowers.is_empty(), !placements.is_empty());
        if !by_lower {
            lowers.push(TlbSetup::default().lower);
        }
        if !by_placement {
            placements.push(TlbSetup::default().placement);
        }
        let mut setups = Vec::new();
        let mut prefixes = Vec::new();
        for &l in &lowers {
            for &p in &placements {
                setups.push(setup_at(l, p));
                let mut prefix = String::new();
                if by_lower {
                    prefix.push_str(&format!("lower{l}."));
                }
                if by_placement {
                    prefix.push_str(&format!("{p:?}."));
                }
                prefixes.push(prefix);
            }
        }
        for (s, l) in setups.iter().zip(&prefixes) {
            s.validate(&format!("lower {l}"))
                .map_err(|e| invalid(format!("lower: {e}")))?;
        }
        Ok(TrapRun {
            os,
            params: shape.os[os.key()].clone(),
            workload,
            real_slots: shape.real_slots,
            setups,
            prefixes,
        })
    }

    /// The partition points of the pass, in order.
    pub fn lowers(&self) -> Vec<usize> {
        let mut l: Vec<usize> = Vec::new();
        for s in &self.setups {
            if !l.contains(&s.lower) {
                l.push(s.lower);
            }
        }
        l
    }

    /// Runs the pass with `seed` (the stand-in's references and the OS
    /// model's draws). Its raw outcome: each setup's misses by type as
    /// counters (`misses.L1U`, ...), and as figures its fn. 8 counting
    /// cycles (`extra_cycles`) and its seconds of miss handling under
    /// the OS's Table III column (`tlb_seconds`).
    pub fn run(&self, seed: u64) -> Result<crate::sweep::Raw, String> {
        let ev = self.workload.generate(seed);
        let stream = OsModel::new(self.os, self.params.clone(), seed).expand(&ev);
        let costs = CostPreset::decstation3100_1994(self.os.cost_column());
        let (outs, _) = simulate_trap(
            &stream,
            self.os,
            &self.setups,
            &costs,
            seed,
            self.real_slots,
        )
        .map_err(|e| e.to_string())?;
        let mut counters = mmulab_engine::Counters::default();
        let mut figures = BTreeMap::new();
        for (o, p) in outs.iter().zip(&self.prefixes) {
            for t in MissType::ALL {
                counters.add(&format!("{p}misses.{}", t.name()), o.count(t));
            }
            figures.insert(format!("{p}extra_cycles"), o.extra_cycles);
            figures.insert(format!("{p}tlb_seconds"), o.seconds(&costs));
        }
        Ok(crate::sweep::Raw {
            seed,
            end_cycles: 0,
            timed_out: false,
            violations: 0,
            counters,
            samples: BTreeMap::new(),
            figures,
            // No translation oracle here: the passes count misses (the
            // sweep's oracle column says `none`).
            verdict: "none".into(),
        })
    }
}

/// The outcome of a [`TrapRun`] setup (`prefix`) read back from its raw
/// outcome: the same counts and counting cycles, so the same bits.
pub(super) fn outcome_of(raw: &crate::sweep::Raw, prefix: &str) -> Result<Outcome, SpecError> {
    let mut o = Outcome::default();
    for t in MissType::ALL {
        o.counts[t.index()] = raw.counters.get(&format!("{prefix}misses.{}", t.name()));
    }
    o.extra_cycles = *raw
        .figures
        .get(&format!("{prefix}extra_cycles"))
        .ok_or_else(|| {
            invalid(format!(
                "seed {}: no {prefix}extra_cycles in the raw outcome",
                raw.seed
            ))
        })?;
    Ok(o)
}
