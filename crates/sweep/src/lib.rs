//! Sweeps: a base spec, a grid of `--set` keys and a range of seeds.
//! Each (point, seed) is one deterministic task; tasks run on local
//! threads or as the shards of a Slurm job array, and the merge turns
//! their records into tidy CSV whose bytes do not depend on where, or
//! in how many pieces, the tasks ran.

pub mod local;
pub mod merge;
pub mod plan;
pub mod repro;
pub mod slurm;
pub mod store;
pub mod task;

pub use local::{LocalOptions, LocalRun, Shard, run_local, run_local_until};
pub use merge::{Merged, merge};
pub use plan::{Kind, Sweep};
pub use store::{Build, Manifest, OutDir};

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// Bad input: a sweep file, a flag, or a folder that is not this
    /// sweep's (exit status 2; nothing ran).
    #[error("{0}")]
    Invalid(String),
    #[error("cannot read or write {path}: {err}")]
    Io { path: String, err: std::io::Error },
    /// Some tasks have no result yet.
    #[error("{0}")]
    Incomplete(String),
    /// Some tasks panicked.
    #[error("{0}")]
    TasksFailed(String),
    #[error("slurm: {0}")]
    Slurm(String),
}

impl From<plan::PlanError> for SweepError {
    fn from(e: plan::PlanError) -> SweepError {
        match e {
            plan::PlanError::Invalid(s) => SweepError::Invalid(s),
            plan::PlanError::Io { path, err } => SweepError::Io { path, err },
        }
    }
}

impl SweepError {
    /// Whether the error is the user's input (exit 2) rather than a run
    /// that went wrong (exit 1).
    pub fn is_bad_input(&self) -> bool {
        matches!(self, SweepError::Invalid(_))
    }
}

/// Array tasks in the queue by state (`PENDING`, `RUNNING`, …).
pub type QueueStates = std::collections::BTreeMap<String, usize>;

/// Where a sweep's tasks stand.
#[derive(Debug)]
pub struct Status {
    pub tasks: usize,
    pub done: usize,
    pub failed: usize,
    /// Shards (array tasks) with every task done, of `manifest.shards`.
    pub shards_done: u64,
    /// The finished tasks' own time, summed.
    pub task_s: f64,
    /// Whether results.csv is there.
    pub merged: bool,
    /// Each Slurm job's array tasks still in the queue, by state (or why
    /// `squeue` could not say).
    pub slurm: Vec<(String, Result<QueueStates, String>)>,
    pub manifest: Manifest,
}

/// Reads a folder's status (and asks `squeue` about its jobs).
pub fn status(dir: &OutDir) -> Result<Status, SweepError> {
    let m = dir.manifest()?;
    let r = dir.records(&m)?;
    let mut per_shard = vec![(0usize, 0usize); m.shards as usize];
    for (i, t) in m.tasks.iter().enumerate() {
        let e = &mut per_shard[t.shard as usize];
        e.1 += 1;
        if r.done.contains_key(&i) {
            e.0 += 1;
        }
    }
    let slurm = m
        .slurm_jobs
        .iter()
        .map(|j| {
            (
                j.job_id.clone(),
                slurm::job_states(&j.job_id).map_err(|e| e.to_string()),
            )
        })
        .collect();
    Ok(Status {
        tasks: m.tasks.len(),
        done: r.done.len(),
        failed: r.failed.len(),
        shards_done: per_shard.iter().filter(|(d, n)| d == n).count() as u64,
        task_s: r.done.values().map(|x| x.wall_s).sum(),
        merged: dir.path.join("results.csv").exists(),
        slurm,
        manifest: m,
    })
}
