//! The paper specs of `experiments/`: compiled into the binary, or read
//! from a folder the user points at (`--experiments DIR`, an edited copy).

use std::path::PathBuf;

mod bundle {
    include!(concat!(env!("OUT_DIR"), "/experiments.rs"));
}

/// Where a reproduction reads its specs.
#[derive(Clone, Debug, Default)]
pub enum Experiments {
    /// The copy compiled into this build.
    #[default]
    Embedded,
    /// A folder laid out as `experiments/` is (`PAPER/NAME.toml`).
    Dir(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: no such spec in this build's experiments (use --experiments DIR for others)")]
    Missing { path: String },
}

impl Experiments {
    /// The text of `rel` (e.g. `black89/fig2.toml`).
    pub fn read(&self, rel: &str) -> Result<String, ExperimentError> {
        match self {
            Experiments::Embedded => bundle::EMBEDDED
                .iter()
                .find(|(p, _)| *p == rel)
                .map(|(_, t)| t.to_string())
                .ok_or_else(|| ExperimentError::Missing {
                    path: self.origin(rel),
                }),
            Experiments::Dir(d) => {
                let path = d.join(rel);
                std::fs::read_to_string(&path).map_err(|source| ExperimentError::Io {
                    path: path.display().to_string(),
                    source,
                })
            }
        }
    }

    /// How errors name the file: `experiments/black89/fig2.toml` for the
    /// embedded copy, the real path otherwise.
    pub fn origin(&self, rel: &str) -> String {
        match self {
            Experiments::Embedded => format!("experiments/{rel}"),
            Experiments::Dir(d) => d.join(rel).display().to_string(),
        }
    }

    /// Every embedded spec's relative path, sorted.
    pub fn embedded_paths() -> Vec<&'static str> {
        bundle::EMBEDDED.iter().map(|(p, _)| *p).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_copy_matches_the_folder() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
        let paths = Experiments::embedded_paths();
        assert!(paths.contains(&"black89/fig2.toml"), "{paths:?}");
        for p in paths {
            assert_eq!(
                Experiments::Embedded.read(p).unwrap(),
                Experiments::Dir(root.clone()).read(p).unwrap(),
                "{p}"
            );
        }
        let e = Experiments::Embedded.read("black89/none.toml").unwrap_err();
        assert!(
            e.to_string().contains("experiments/black89/none.toml"),
            "{e}"
        );
    }
}
