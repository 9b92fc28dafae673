//! The local backend: a shard's (or every) pending task on a pool of
//! `jobs` threads. Each task is one seed; which thread runs it changes
//! nothing in its record.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use crate::SweepError;
use crate::plan::{Sweep, Task, shard_range};
use crate::store::{Manifest, OutDir};
use crate::task::run_task;

#[derive(Clone, Copy, Debug)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

impl std::str::FromStr for Shard {
    type Err = String;
    /// `I/N`, 0 ≤ I < N.
    fn from_str(s: &str) -> Result<Shard, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("`{s}`: expected I/N (shard I of N, from 0)"))?;
        let index: u64 = i
            .trim()
            .parse()
            .map_err(|_| format!("`{s}`: `{i}` is not a shard number"))?;
        let count: u64 = n
            .trim()
            .parse()
            .map_err(|_| format!("`{s}`: `{n}` is not a shard count"))?;
        if count == 0 || index >= count {
            return Err(format!("`{s}`: shard I of N needs 0 <= I < N"));
        }
        Ok(Shard { index, count })
    }
}

#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Worker threads.
    pub jobs: usize,
    pub shard: Option<Shard>,
}

#[derive(Clone, Debug)]
pub struct LocalRun {
    /// Tasks this run was given (its shard, or all).
    pub tasks: usize,
    /// Of them, already done before it started.
    pub skipped: usize,
    pub ran: usize,
    /// Of `ran`, tasks that panicked.
    pub failed: usize,
    pub wall_s: f64,
    /// The tasks' own time, summed over threads.
    pub task_s: f64,
}

/// Runs the pending tasks of `opts.shard` (all tasks without one) into
/// `dir`, which `OutDir::prepare` made. `progress(done, of)` is called
/// from the worker threads after each task.
pub fn run_local(
    sweep: &Sweep,
    dir: &OutDir,
    manifest: &Manifest,
    opts: &LocalOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<LocalRun, SweepError> {
    run_local_until(sweep, dir, manifest, opts, progress, None)
}

/// [`run_local`], stopped when `stop` is raised (Ctrl-C): no further task
/// starts, those running finish and are recorded, so `--resume` goes on
/// from there. `ran` counts the tasks that ran.
pub fn run_local_until(
    sweep: &Sweep,
    dir: &OutDir,
    manifest: &Manifest,
    opts: &LocalOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
    stop: Option<&AtomicBool>,
) -> Result<LocalRun, SweepError> {
    assert_eq!(
        manifest.sweep_sha256, sweep.sha256,
        "prepare checked the plan"
    );
    let t0 = Instant::now();
    let range = match opts.shard {
        Some(s) => shard_range(sweep.task_count(), s.index, s.count),
        None => 0..sweep.task_count(),
    };
    let records = dir.records(manifest)?;
    let pending: Vec<Task> = range
        .clone()
        .filter(|i| !records.done.contains_key(i))
        .map(|i| sweep.task(i))
        .collect();
    let skipped = range.len() - pending.len();
    let mut run = LocalRun {
        tasks: range.len(),
        skipped,
        ran: 0,
        failed: 0,
        wall_s: 0.0,
        task_s: 0.0,
    };
    if pending.is_empty() {
        run.wall_s = t0.elapsed().as_secs_f64();
        return Ok(run);
    }
    let label = match opts.shard {
        Some(s) => format!("shard-{}-of-{}", s.index, s.count),
        None => "local".to_string(),
    };
    let writer = dir.part_writer(&label)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.jobs.max(1))
        .build()
        .map_err(|e| SweepError::Io {
            path: "a thread pool".into(),
            err: std::io::Error::other(e),
        })?;
    let done = AtomicUsize::new(0);
    let failed = AtomicUsize::new(0);
    let task_us = AtomicUsize::new(0);
    let total = pending.len();
    pool.install(|| {
        // One task per item (never a block of seeds per thread), so the
        // threads balance and the split cannot reach the records.
        pending.par_iter().with_max_len(1).try_for_each(|t| {
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return Ok(());
            }
            let r = run_task(sweep, *t);
            if r.failed.is_some() {
                failed.fetch_add(1, Ordering::Relaxed);
            }
            task_us.fetch_add((r.wall_s * 1e6) as usize, Ordering::Relaxed);
            writer.append(&r)?;
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
            Ok::<(), SweepError>(())
        })
    })?;
    run.ran = done.into_inner();
    run.failed = failed.into_inner();
    run.task_s = task_us.into_inner() as f64 / 1e6;
    run.wall_s = t0.elapsed().as_secs_f64();
    Ok(run)
}
