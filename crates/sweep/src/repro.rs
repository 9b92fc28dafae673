//! `mmulab reproduce PAPER --backend slurm`: a reproduction's sweep files
//! run as Slurm job arrays. Each sweep file gets its own results folder,
//! which is then a sweep like any other (`mmulab sweep status`, `merge`).

use std::path::PathBuf;

use mmulab_experiment::SpecError;
use mmulab_experiment::sweep::{Raw, Sweep};

use crate::SweepError;
use crate::slurm::SlurmOptions;
use crate::store::{Build, OutDir};

/// Runs a reproduction's sweeps as job arrays under `root`, waits for each
/// and reads the tasks' raw outcomes back from their records.
pub struct SlurmBackend {
    /// Each sweep file `PAPER/NAME.sweep.toml` runs in `root/PAPER/NAME`
    /// (`NAME-quick` under `--quick`).
    pub root: PathBuf,
    pub quick: bool,
    pub build: Build,
    pub opts: SlurmOptions,
    /// Told what was submitted and when it finished.
    pub progress: Box<dyn Fn(&str) + Sync>,
}

impl SlurmBackend {
    /// The results folder of the sweep file `rel`.
    pub fn folder(&self, rel: &str) -> PathBuf {
        let name = rel.strip_suffix(".sweep.toml").unwrap_or(rel);
        let q = if self.quick { "-quick" } else { "" };
        self.root.join(format!("{name}{q}"))
    }

    fn run_sweep(&self, rel: &str, sweep: &Sweep) -> Result<Vec<Raw>, SweepError> {
        let dir = OutDir::new(self.folder(rel));
        // A folder that already holds this plan, from this build, is
        // finished rather than started again.
        let mut m = dir.prepare(sweep, &self.build, true)?;
        let t0 = std::time::Instant::now();
        if let Some(s) = crate::slurm::submit(&dir, &mut m, &self.opts)? {
            (self.progress)(&format!(
                "{rel}: Slurm job {} ({} array task(s)) in {}",
                s.job_id,
                s.shards,
                dir.path.display()
            ));
            crate::slurm::wait(&s.job_id, &mut |_| {})?;
            (self.progress)(&format!(
                "{rel}: Slurm job {} left the queue after {:.1} s",
                s.job_id,
                t0.elapsed().as_secs_f64()
            ));
        }
        // The merge writes results.csv and summary.csv beside the records,
        // and refuses (naming the task and the logs) if any is missing.
        crate::merge(&dir).map_err(|e| match e {
            SweepError::Incomplete(s) => SweepError::Incomplete(format!(
                "{s}\n  the array tasks' logs: {}/slurm/logs/",
                dir.path.display()
            )),
            e => e,
        })?;
        let m = dir.manifest()?;
        let mut records = dir.records(&m)?;
        (0..sweep.task_count())
            .map(|i| {
                records.done.remove(&i).and_then(|r| r.raw).ok_or_else(|| {
                    SweepError::Incomplete(format!(
                        "{}: task {i} has no raw outcome",
                        dir.path.display()
                    ))
                })
            })
            .collect()
    }
}

impl mmulab_experiment::reproduce::Backend for SlurmBackend {
    fn run(&self, rel: &str, sweep: &Sweep) -> Result<Vec<Raw>, SpecError> {
        self.run_sweep(rel, sweep)
            .map_err(|e| SpecError::Invalid(format!("{rel} through Slurm: {e}")))
    }
}
