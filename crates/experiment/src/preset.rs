//! Timing presets. A preset is a TOML file with a name, what it models,
//! the paper table its inputs come from, and a partial spec (`[spec]`)
//! merged under the user's spec. Built-in presets live in `presets/` and
//! are compiled in; a path to a file (e.g. one written by
//! `mmulab host preset`) works too.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::spec::SpecError;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    pub name: String,
    pub about: String,
    /// The paper table (or measurement) its inputs come from.
    pub source: String,
    #[serde(default)]
    pub spec: toml::Table,
    /// Each input fitted to a paper artefact (`"costs.ipi_send_cycles" =
    /// "Fig. 2"`): rows of those artefacts are never emergent. Required,
    /// and empty when nothing was fitted.
    pub calibration: BTreeMap<String, String>,
}

/// (name, file text) of every built-in preset.
pub const BUILTIN: &[(&str, &str)] = &[
    ("generic", include_str!("../../../presets/generic.toml")),
    (
        "encore-multimax-1989",
        include_str!("../../../presets/encore-multimax-1989.toml"),
    ),
    (
        "sequent-symmetry-1992",
        include_str!("../../../presets/sequent-symmetry-1992.toml"),
    ),
    (
        "x86-simics-2010",
        include_str!("../../../presets/x86-simics-2010.toml"),
    ),
];

fn parse(text: &str, origin: &str) -> Result<Preset, SpecError> {
    toml::from_str(text)
        .map_err(|e| SpecError::Invalid(format!("preset {origin}: {}", e.to_string().trim())))
}

pub fn load(name: &str) -> Result<Preset, SpecError> {
    if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name) {
        return parse(text, name);
    }
    if name.ends_with(".toml") {
        let text = crate::spec::read_bounded(std::path::Path::new(name), "a preset file")?;
        return parse(&text, name);
    }
    Err(SpecError::Invalid(format!(
        "preset: unknown preset `{name}` (built-in: {}; or give a path ending in .toml)",
        BUILTIN
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

pub fn all() -> Vec<Preset> {
    BUILTIN
        .iter()
        .map(|(n, t)| parse(t, n).expect("built-in presets parse"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn builtins_parse_and_name_themselves() {
        for p in super::all() {
            assert!(
                super::BUILTIN.iter().any(|(n, _)| *n == p.name),
                "{} misnamed",
                p.name
            );
            assert!(!p.source.is_empty());
            // Every fitted input is a key the preset sets.
            for key in p.calibration.keys() {
                let mut t = &p.spec;
                let parts: Vec<&str> = key.split('.').collect();
                for part in &parts[..parts.len() - 1] {
                    t = t.get(*part).and_then(|v| v.as_table()).unwrap_or_else(|| {
                        panic!("{}: calibration names `{key}`, not set", p.name)
                    });
                }
                assert!(
                    t.contains_key(*parts.last().unwrap()),
                    "{}: calibration names `{key}`, which the preset does not set",
                    p.name
                );
            }
        }
    }
}
