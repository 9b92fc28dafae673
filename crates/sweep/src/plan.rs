//! Sweep files and their plan live in `mmulab_experiment::sweep`, where
//! the paper reproductions load their own sweep files too.

pub use mmulab_experiment::sweep::*;
