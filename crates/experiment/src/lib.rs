//! Experiments: a spec (TOML, a preset under it, `--set` overrides on top)
//! is validated, run for `runs` seeds and turned into results. The same
//! spec and seed give byte-identical results (all but `host`).

pub mod bench;
pub mod budget;
pub mod check;
pub mod host_preset;
pub mod preset;
pub mod reproduce;
pub mod results;
pub mod run;
pub mod spec;
pub mod sweep;

pub use budget::{Budget, Estimate};
pub use results::Results;
pub use run::{RunError, run_spec};
pub use spec::{Spec, SpecError};
