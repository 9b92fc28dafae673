//! The results of a run: the schema of `results.json` and `results.csv`.
//! Everything but `host` depends only on the spec and seed.

use std::collections::BTreeMap;
use std::path::Path;

use mmulab_engine::{Counters, LinearFit, Summary};
use mmulab_kernel::sim::Liveness;
use mmulab_machine::oracle::OracleReport;
use mmulab_workloads::WorkloadReport;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostInfo {
    pub wall_s: f64,
    pub refs_per_second: f64,
    pub machine: String,
    pub profile: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub spec: serde_json::Value,
    pub seed: u64,
    pub version: String,
    pub runs: u64,
    /// Simulated time of all runs together, cycles.
    pub simulated_cycles: u64,
    pub counters: Counters,
    /// Name → summary. `*_cycles` histograms have a `*_us` twin.
    pub histograms: BTreeMap<String, Summary>,
    pub fits: BTreeMap<String, LinearFit>,
    pub oracle: OracleReport,
    pub workload: WorkloadReport,
    /// Watchdog reports (a CPU spinning past its bound), with the seed.
    pub liveness: Vec<LivenessReport>,
    /// The run was stopped (Ctrl-C) before it ended: `runs` counts the
    /// runs begun, the last of them cut short. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    pub host: HostInfo,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LivenessReport {
    pub seed: u64,
    #[serde(flatten)]
    pub failure: Liveness,
}

impl Results {
    /// The results without `host`, as bytes: what determinism compares.
    pub fn deterministic_json(&self) -> String {
        let mut v = serde_json::to_value(self).expect("results serialise");
        v.as_object_mut().expect("object").remove("host");
        serde_json::to_string_pretty(&v).expect("serialise")
    }

    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("results.json"), json + "\n")?;
        let mut w =
            csv::Writer::from_path(dir.join("results.csv")).map_err(std::io::Error::other)?;
        w.write_record(["kind", "name", "stat", "value"])
            .map_err(std::io::Error::other)?;
        let mut row = |k: &str, n: &str, s: &str, v: String| {
            w.write_record([k, n, s, &v]).map_err(std::io::Error::other)
        };
        for (n, v) in &self.counters.0 {
            row("counter", n, "count", v.to_string())?;
        }
        for (n, s) in &self.histograms {
            for (stat, v) in [
                ("n", s.n as f64),
                ("mean", s.mean),
                ("sd", s.sd),
                ("median", s.median),
                ("p10", s.p10),
                ("p90", s.p90),
            ] {
                row("histogram", n, stat, format!("{v}"))?;
            }
        }
        for (n, f) in &self.fits {
            row("fit", n, "intercept", f.intercept.to_string())?;
            row("fit", n, "slope", f.slope.to_string())?;
            row("fit", n, "r2", f.r2.to_string())?;
        }
        row(
            "oracle",
            "violations",
            "count",
            self.oracle.violations.to_string(),
        )?;
        row("oracle", "verdict", "text", self.oracle.verdict.clone())?;
        row("workload", "verdict", "text", self.workload.verdict.clone())?;
        w.flush()
    }
}
