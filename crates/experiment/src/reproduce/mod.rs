//! Paper reproductions: `mmulab reproduce PAPER`. Each reads its specs from
//! `experiments/PAPER/`, where the paper's numbers sit in a `[paper]`
//! table beside the spec, runs them, and returns the shared rows.

pub mod balan92;
pub mod black89;
pub mod romanescu10;
pub mod uhlig94;

use std::collections::BTreeMap;

use mmulab_report::Experiments;

use crate::spec::{Spec, SpecError};

/// A spec file with its `[paper]` table split off.
pub struct PaperSpec {
    pub text: String,
    pub paper: toml::Table,
    pub origin: String,
}

impl PaperSpec {
    /// Loads `rel` (e.g. `black89/fig2.toml`) from the experiments.
    pub fn load(src: &Experiments, rel: &str) -> Result<PaperSpec, SpecError> {
        let origin = src.origin(rel);
        let text = src
            .read(rel)
            .map_err(|e| SpecError::Invalid(e.to_string()))?;
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| SpecError::Invalid(format!("{origin}: {e}")))?;
        let paper = match table.remove("paper") {
            Some(toml::Value::Table(t)) => t,
            _ => {
                return Err(SpecError::Invalid(format!(
                    "{origin}: paper: missing table of the paper's numbers"
                )));
            }
        };
        Ok(PaperSpec {
            text: toml::to_string(&table).expect("serialise"),
            paper,
            origin,
        })
    }

    /// The spec's own fitted inputs: `[paper.calibration]`, each spec key
    /// (e.g. `workload.jobs`) to the artefact (or `artefact / quantity`)
    /// it was fitted to. Empty when the spec fitted nothing.
    pub fn calibration(&self) -> Result<BTreeMap<String, String>, SpecError> {
        let Some(v) = self.paper.get("calibration") else {
            return Ok(BTreeMap::new());
        };
        let t = v.as_table().ok_or_else(|| {
            SpecError::Invalid(format!(
                "{}: paper.calibration: expected a table",
                self.origin
            ))
        })?;
        t.iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|a| (k.clone(), a.to_string()))
                    .ok_or_else(|| {
                        SpecError::Invalid(format!(
                            "{}: paper.calibration.{k}: expected an artefact name",
                            self.origin
                        ))
                    })
            })
            .collect()
    }

    pub fn spec(&self, sets: &[String]) -> Result<Spec, SpecError> {
        Spec::parse(&self.text, sets, &self.origin)
    }

    pub fn number(&self, key: &str) -> Result<f64, SpecError> {
        match self.paper.get(key) {
            Some(toml::Value::Float(f)) => Ok(*f),
            Some(toml::Value::Integer(i)) => Ok(*i as f64),
            _ => Err(SpecError::Invalid(format!(
                "{}: paper.{key}: expected a number",
                self.origin
            ))),
        }
    }

    pub fn list(&self, key: &str) -> Result<Vec<u64>, SpecError> {
        match self.paper.get(key) {
            Some(toml::Value::Array(a)) => a
                .iter()
                .map(|v| v.as_integer().map(|i| i as u64))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    SpecError::Invalid(format!("{}: paper.{key}: expected integers", self.origin))
                }),
            _ => Err(SpecError::Invalid(format!(
                "{}: paper.{key}: expected a list",
                self.origin
            ))),
        }
    }
}
