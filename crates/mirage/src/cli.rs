//! A clap-free entry point for the `mmulab` binary: it returns text, the
//! binary prints it. `mmulab reproduce fleisch89 [--out DIR] [--quick]`.

use crate::Error;
use std::path::Path;

/// What `mmulab reproduce fleisch89` prints: the paper-vs-mmulab table,
/// the ping-pong's per-cycle message timeline, and a closing verdict.
pub struct ReproduceReport {
    pub table: mmulab_report::ReproTable,
    pub text: String,
    pub all_within: bool,
}

/// `dir` holds the specs (`experiments/fleisch89`, or `--experiments`).
pub fn run_reproduce(
    dir: &Path,
    out: Option<&Path>,
    quick: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<ReproduceReport, Error> {
    let table = crate::reproduce::reproduce_from(dir, quick, out, progress)?;
    let mut text = table.render();
    text.push('\n');
    text.push_str(&crate::reproduce::pingpong_timeline(0));
    let within = table.rows.iter().filter(|r| r.within).count();
    text.push_str(&format!(
        "\n{within} of {} rows within tolerance\n",
        table.rows.len()
    ));
    Ok(ReproduceReport {
        all_within: table.all_within(),
        table,
        text,
    })
}
