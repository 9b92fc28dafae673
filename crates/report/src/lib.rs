//! The report layer: the comparison rows every `mmulab reproduce PAPER`
//! writes, plain-text tables, and SVG line plots. Nothing here runs a
//! simulation; a results file alone reproduces its table.

pub mod plot;
pub mod repro;
pub mod table;

pub use plot::{LinePlot, Series};
pub use repro::{ReproRow, ReproTable, RowKind};
pub use table::Table;
