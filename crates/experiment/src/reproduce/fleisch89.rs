//! `mmulab reproduce fleisch89`: the Mirage reproduction
//! (`mmulab_mirage::reproduce`), with Fig. 8's sweep read from
//! `experiments/fleisch89/fig8.sweep.toml` and run by a [`Backend`] (this
//! machine's cores, or a Slurm job array), as the other papers' sweeps
//! are. Each task is one run of §8's two read-writers
//! (`kind = "mirage-read-writers"`); the rows are the same whichever
//! backend ran them.

use std::path::Path;

use mmulab_mirage::Error;
use mmulab_mirage::reproduce::Fig8Points;
use mmulab_report::{Experiments, ReproTable};

use super::Backend;

/// Fig. 8's sweep file, under the experiments.
pub const FIG8: &str = "fleisch89/fig8.sweep.toml";

fn spec_error(e: crate::SpecError) -> Error {
    // The message names the file (and the point and key) already.
    Error::Spec {
        file: "Fig. 8's sweep".into(),
        message: e.to_string(),
    }
}

/// Runs the reproduction; `quick` applies the sweep file's `[quick]` and
/// the specs' quick settings. Every spec and the sweep file are checked
/// before the first stage runs.
pub fn reproduce(
    src: &Experiments,
    quick: bool,
    out: Option<&Path>,
    backend: &dyn Backend,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<ReproTable, Error> {
    mmulab_mirage::spec::check_all(src)?;
    // Loaded (and every point validated) now, run at the Fig. 8 stage.
    let sweep = super::load_sweep(src, FIG8, quick).map_err(spec_error)?;
    if sweep.kind != crate::sweep::Kind::MirageReadWriters || sweep.columns != ["delta_ticks"] {
        return Err(Error::Spec {
            file: src.origin(FIG8),
            message: format!(
                "Fig. 8's sweep runs `kind = \"mirage-read-writers\"` over `delta_ticks` alone (its other keys come from its base); this one is `{:?}` over {:?}",
                sweep.kind, sweep.columns
            ),
        });
    }
    let mut fig8 = || -> Result<Fig8Points, Error> {
        let run = super::run_sweep(src, FIG8, quick, backend).map_err(spec_error)?;
        fig8_points(&run)
    };
    mmulab_mirage::reproduce(src, quick, out, &mut |m| progress(m), &mut fig8)
}

/// The sweep's points: the Δ in the order the points first take them,
/// each Δ's throughputs in seed order.
fn fig8_points(run: &super::SweepRun) -> Result<Fig8Points, Error> {
    let key = "delta_ticks";
    let mut deltas = Vec::new();
    let mut rates = Vec::new();
    for d in run.integers(key) {
        let at = [(key, toml::Value::Integer(d as i64))];
        let i = run.point(&at).ok_or_else(|| Error::Invalid {
            file: FIG8.into(),
            key: key.into(),
            message: format!("no point at {d}"),
        })?;
        let per_seed = run
            .of_point(i)
            .iter()
            .map(|r| {
                r.figures
                    .get("read_write_instr_per_s")
                    .copied()
                    .ok_or_else(|| Error::Spec {
                        file: FIG8.into(),
                        message: format!(
                            "point {i}, seed {}: no read_write_instr_per_s in its outcome",
                            r.seed
                        ),
                    })
            })
            .collect::<Result<Vec<f64>, Error>>()?;
        deltas.push(d as u32);
        rates.push(per_seed);
    }
    Ok(Fig8Points {
        deltas,
        first_seed: run.sweep.seeds.start,
        rates,
    })
}
