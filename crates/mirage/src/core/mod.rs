//! The Mirage protocol as a sans-IO, deterministic state machine
//! (quinn-proto style): `Site::handle(now, event) -> Vec<Action>`.
//! The simulator (`crate::sim`) and the real TCP runtime drive the same code.

mod holder;
mod library;
mod site;
mod types;

pub use site::{AuxPte, PageView, Site};
pub use types::*;

#[cfg(test)]
mod tests;
