//! The report layer: the comparison rows every `mmulab reproduce PAPER`
//! writes, plain-text tables, SVG line plots and the static HTML page of
//! `reproduce all`. Nothing here runs a simulation; a results file alone
//! reproduces its table.

pub mod experiments;
pub mod html;
pub mod markdown;
pub mod plot;
pub mod repro;
pub mod table;

pub use experiments::{ExperimentError, Experiments};
pub use plot::{LinePlot, Series, Style};
pub use repro::{
    Basis, ContractError, Headline, NotReproduced, Provenance, ReproReport, ReproRow, ReproTable,
    RowCells, RowKind, Seeds,
};
pub use table::Table;
