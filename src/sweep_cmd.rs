//! `mmulab sweep`: parse the flags, call the sweep engine
//! (`mmulab-sweep`), print what it did.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use mmulab_sweep::slurm::SlurmOptions;
use mmulab_sweep::{Build, Kind, LocalOptions, Merged, OutDir, Shard, Sweep, SweepError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Threads on this machine.
    Local,
    /// A Slurm job array (sbatch), one shard per array task.
    Slurm,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SweepArgs {
    #[command(subcommand)]
    action: Option<SweepAction>,
    /// The sweep file: `base`, `seeds = { start, count }`, `[grid]` and/or
    /// `[[point]]` (docs/sweeps.md).
    #[arg(required = true)]
    sweep: Option<PathBuf>,
    /// The results folder (default: sweeps/NAME, NAME the sweep file's
    /// name without .toml).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// local: worker threads (default: every core). slurm: at most this
    /// many array tasks at once (default: no limit).
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Where the tasks run.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    backend: Backend,
    /// Run only shard I of N (from 0) of the tasks; shards share --out and
    /// `mmulab sweep merge DIR` joins them.
    #[arg(long, value_name = "I/N")]
    shard: Option<Shard>,
    /// Finish a sweep already started in --out: skip the tasks done.
    #[arg(long)]
    resume: bool,
    /// Apply the sweep file's `[quick]` table (fewer seeds or points: what
    /// `mmulab reproduce --quick` runs).
    #[arg(long)]
    quick: bool,
    /// slurm: wait for the job array, merge, and exit as a local run does.
    #[arg(long)]
    wait: bool,
    /// slurm: an sbatch option for every array task, written into the job
    /// script (repeat it): --slurm-arg=--partition=short
    /// --slurm-arg=--time=00:30:00 --slurm-arg=--account=lab
    #[arg(long = "slurm-arg", value_name = "OPTION", allow_hyphen_values = true)]
    slurm_args: Vec<String>,
    /// Print the merged sweep as JSON on stdout (progress goes to stderr):
    /// its files and row counts, the oracle's verdict and, for a check
    /// sweep, `mmulab check --json`'s report per protocol.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum SweepAction {
    /// Where a sweep's tasks stand (and its Slurm jobs, from squeue).
    Status {
        /// The sweep's results folder.
        dir: PathBuf,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Merge a results folder whose every task is done: results.csv and
    /// summary.csv.
    Merge {
        /// The sweep's results folder.
        dir: PathBuf,
        /// Print what was merged as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Progress lines go to stdout, or to stderr when stdout carries JSON.
macro_rules! say {
    ($json:expr, $($t:tt)*) => {
        if $json { eprintln!($($t)*) } else { println!($($t)*) }
    };
}

pub fn build() -> Result<Build, SweepError> {
    Build::current(
        env!("CARGO_PKG_VERSION"),
        option_env!("MMULAB_GIT_COMMIT").unwrap_or("unknown"),
    )
}

fn bad(msg: String) -> anyhow::Error {
    SweepError::Invalid(msg).into()
}

pub fn run(a: SweepArgs) -> anyhow::Result<ExitCode> {
    match a.action {
        Some(SweepAction::Status { dir, json }) => return status(&OutDir::new(dir), json),
        Some(SweepAction::Merge { dir, json }) => {
            let dir = OutDir::new(dir);
            let merged = mmulab_sweep::merge(&dir)?;
            return Ok(report(&dir, &merged, json));
        }
        None => {}
    }
    let path = a.sweep.expect("clap requires SWEEP without a subcommand");
    let sweep = Sweep::load_quick(&path, a.quick).map_err(SweepError::from)?;
    let out = a.out.unwrap_or_else(|| {
        let stem = path.file_stem().map_or("sweep".into(), |s| s.to_owned());
        Path::new("sweeps").join(stem)
    });
    let opts = Opts {
        jobs: a.jobs,
        backend: a.backend,
        shard: a.shard,
        resume: a.resume,
        wait: a.wait,
        slurm_args: a.slurm_args,
        json: a.json,
    };
    execute(&sweep, &path.display().to_string(), out, opts)
}

/// How to run a loaded sweep.
pub struct Opts {
    pub jobs: Option<usize>,
    pub backend: Backend,
    pub shard: Option<Shard>,
    pub resume: bool,
    pub wait: bool,
    pub slurm_args: Vec<String>,
    /// JSON on stdout: a check sweep's reports as `mmulab check --json`
    /// prints them, or a run sweep's merge summary.
    pub json: bool,
}

/// `mmulab check --backend slurm`: the check's seeds as a check sweep of
/// one protocol, chunked into array tasks of at least 1,000 seeds.
pub fn check(
    protocol: &str,
    start: u64,
    seeds: u64,
    out: Option<PathBuf>,
    opts: Opts,
) -> anyhow::Result<ExitCode> {
    // The caller checked that the protocol is a registered name (plain
    // ASCII words), so it needs no escaping in a TOML string.
    let text = format!(
        "kind = \"check\"\nseeds = {{ start = {start}, count = {seeds} }}\n[grid]\nprotocol = [\"{protocol}\"]\n"
    );
    let sweep = Sweep::parse(&text, "mmulab check", Path::new(".")).map_err(SweepError::from)?;
    let out = out
        .unwrap_or_else(|| Path::new("sweeps").join(format!("check-{protocol}-{start}-{seeds}")));
    execute(&sweep, "mmulab check", out, opts)
}

fn execute(sweep: &Sweep, label: &str, out: PathBuf, a: Opts) -> anyhow::Result<ExitCode> {
    let path = label;
    if a.jobs == Some(0) {
        return Err(bad("--jobs: must be at least 1".into()));
    }
    if a.backend == Backend::Slurm && a.shard.is_some() {
        return Err(bad(
            "--shard: the Slurm backend makes the shards itself (one per array task)".into(),
        ));
    }
    if a.backend == Backend::Local && (a.wait || !a.slurm_args.is_empty()) {
        return Err(bad("--wait and --slurm-arg go with --backend slurm".into()));
    }
    let dir = OutDir::new(out);
    let mut manifest = dir.prepare(sweep, &build()?, a.resume || a.shard.is_some())?;
    let what = format!(
        "{} points x {} seeds = {} tasks",
        sweep.points.len(),
        sweep.seeds.count,
        sweep.task_count()
    );
    match a.backend {
        Backend::Local => {
            let jobs = a
                .jobs
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let pb = crate::bar(0, "sweep");
            let opts = LocalOptions {
                jobs,
                shard: a.shard,
            };
            // Ctrl-C: no further task starts; those running finish and
            // are recorded, so `--resume` goes on from there.
            let stop = crate::ui::stop_on_ctrl_c();
            let r = mmulab_sweep::run_local_until(
                sweep,
                &dir,
                &manifest,
                &opts,
                &|done, of| {
                    pb.set_length(of as u64);
                    pb.set_position(done as u64);
                },
                Some(&stop),
            )?;
            pb.finish_and_clear();
            let left = r.tasks - r.skipped - r.ran;
            if crate::ui::stopped() && left > 0 {
                say!(
                    a.json,
                    "sweep {}: {what}; stopped by Ctrl-C after {} task(s) ({} done before), {left} not run; they are kept in {}: go on with `mmulab sweep {} --out {}{} --resume`",
                    path,
                    r.ran,
                    r.skipped,
                    dir.path.display(),
                    path,
                    dir.path.display(),
                    a.shard
                        .map(|s| format!(" --shard {}/{}", s.index, s.count))
                        .unwrap_or_default()
                );
                return Ok(ExitCode::from(130));
            }
            let scope = match a.shard {
                Some(s) => format!("shard {}/{}: {} of the tasks", s.index, s.count, r.tasks),
                None => "every task".to_string(),
            };
            say!(
                a.json,
                "sweep {}: {what}; {scope}: ran {} ({} already done) on {jobs} thread(s) in {:.2} s wall, {:.2} s of task time",
                path,
                r.ran,
                r.skipped,
                r.wall_s,
                r.task_s
            );
            if a.shard.is_some() {
                if r.failed > 0 {
                    say!(
                        a.json,
                        "{} task(s) panicked (see `mmulab sweep merge`)",
                        r.failed
                    );
                    return Ok(ExitCode::from(1));
                }
                say!(
                    a.json,
                    "when every shard is done: mmulab sweep merge {}",
                    dir.path.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
        }
        Backend::Slurm => {
            let opts = SlurmOptions {
                max_running: a.jobs,
                args: a.slurm_args,
            };
            let t0 = std::time::Instant::now();
            match mmulab_sweep::slurm::submit(&dir, &mut manifest, &opts)? {
                None => say!(a.json, "sweep {}: {what}, all done already", path),
                Some(s) => {
                    say!(
                        a.json,
                        "sweep {}: {what}; submitted Slurm job {} (array {}: {} array task(s)), script {}",
                        path,
                        s.job_id,
                        s.array,
                        s.shards,
                        s.script.display()
                    );
                    if !a.wait {
                        say!(
                            a.json,
                            "follow it with `mmulab sweep status {0}`; when it is done: `mmulab sweep merge {0}`",
                            dir.path.display()
                        );
                        return Ok(ExitCode::SUCCESS);
                    }
                    let pb = crate::bar(s.shards as u64, "slurm array tasks done");
                    mmulab_sweep::slurm::wait(&s.job_id, &mut |states| {
                        let queued: usize = states.values().sum();
                        pb.set_position(s.shards.saturating_sub(queued) as u64);
                    })?;
                    pb.finish_and_clear();
                    say!(
                        a.json,
                        "Slurm job {} left the queue after {:.2} s wall",
                        s.job_id,
                        t0.elapsed().as_secs_f64()
                    );
                }
            }
        }
    }
    let merged = match mmulab_sweep::merge(&dir) {
        Ok(m) => m,
        Err(e @ SweepError::Incomplete(_)) if a.backend == Backend::Slurm => {
            anyhow::bail!(
                "{e}\n  the array tasks' logs: {}/slurm/logs/",
                dir.path.display()
            )
        }
        Err(e) => return Err(e.into()),
    };
    Ok(report(&dir, &merged, a.json))
}

/// Prints a merge's outcome; exit 1 when a task's oracle found an
/// inconsistency or a watchdog a liveness failure (as `run` and `check`).
fn report(dir: &OutDir, m: &Merged, json: bool) -> ExitCode {
    let d = dir.path.display();
    if json {
        // A check sweep prints what `mmulab check --json` prints; a run
        // sweep its files, row counts and verdict.
        let v = if m.check.is_empty() {
            serde_json::json!({
                "dir": d.to_string(),
                "tasks": m.tasks,
                "points": m.points,
                "results_csv": format!("{d}/results.csv"),
                "results_rows": m.results_rows,
                "summary_csv": format!("{d}/summary.csv"),
                "summary_rows": m.summary_rows,
                "manifest": format!("{d}/manifest.json"),
                "inconsistent_tasks": m.inconsistent,
                "unchecked_tasks": m.unchecked,
                "liveness_failures": m.liveness_failures,
                "first_inconsistent": m.first_inconsistent.as_ref().map(|(id, note)| {
                    serde_json::json!({ "task": id, "violation": note })
                }),
            })
        } else {
            serde_json::to_value(&m.check).expect("reports serialise")
        };
        println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
        return if m.inconsistent == 0 && m.liveness_failures == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    }
    println!(
        "merged {} tasks of {} points: {d}/results.csv ({} rows), {d}/summary.csv ({} rows), {d}/manifest.json",
        m.tasks, m.points, m.results_rows, m.summary_rows
    );
    for c in &m.check {
        println!(
            "check {}: {} seeds ({}..{}), {} translation uses checked, {} shootdown interrupts; violations: {} (in {} seeds; {} lock-order); liveness failures: {}; time limit: {}",
            c.protocol,
            c.seeds,
            c.start,
            c.start + c.seeds - 1,
            c.checked_uses,
            c.shootdowns,
            c.violations,
            c.seeds_with_violations,
            c.lock_order_violations,
            c.liveness_failures,
            c.timeouts
        );
        if let Some(f) = &c.first_failing {
            println!("  first failing seed {}: replay: {}", f.seed, f.replay);
        }
    }
    if m.inconsistent == 0 && m.liveness_failures == 0 && m.unchecked == m.tasks {
        println!("oracle: none (this simulator checks no translations: `none` in every task)");
        ExitCode::SUCCESS
    } else if m.inconsistent == 0 && m.liveness_failures == 0 {
        println!("oracle: consistent in every task");
        ExitCode::SUCCESS
    } else {
        println!(
            "oracle: {} of {} tasks inconsistent; liveness failures in {}",
            m.inconsistent, m.tasks, m.liveness_failures
        );
        if let Some((id, note)) = &m.first_inconsistent {
            println!("  first: {id}: {note}");
        }
        ExitCode::from(1)
    }
}

fn status(dir: &OutDir, json: bool) -> anyhow::Result<ExitCode> {
    let s = mmulab_sweep::status(dir)?;
    let m = &s.manifest;
    if json {
        let slurm: Vec<serde_json::Value> = s
            .slurm
            .iter()
            .map(|(job, states)| match states {
                Ok(st) => serde_json::json!({
                    "job": job,
                    "in_queue": st.iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
                }),
                Err(e) => serde_json::json!({ "job": job, "error": e }),
            })
            .collect();
        let v = serde_json::json!({
            "dir": dir.path.display().to_string(),
            "kind": m.kind.name(),
            "base": m.base.as_ref().map(|b| b.origin.clone()),
            "points": m.points.len(),
            "seeds": m.seeds.count,
            "tasks": s.tasks,
            "shards": m.shards,
            "done": s.done,
            "failed": s.failed,
            "pending": s.tasks - s.done - s.failed,
            "shards_done": s.shards_done,
            "task_seconds": s.task_s,
            "merged": s.merged,
            "mmulab_version": m.build.mmulab_version,
            "git_commit": m.build.git_commit,
            "slurm_jobs": slurm,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
        return Ok(ExitCode::SUCCESS);
    }
    let kind = match m.kind {
        Kind::Check => "check sweep".to_string(),
        k => format!(
            "{} sweep of {}",
            k.name(),
            m.base.as_ref().map_or("?", |b| b.origin.as_str())
        ),
    };
    println!(
        "{}: {kind}, {} points x {} seeds = {} tasks in {} shard(s); mmulab {} {}",
        dir.path.display(),
        m.points.len(),
        m.seeds.count,
        s.tasks,
        m.shards,
        m.build.mmulab_version,
        m.build.git_commit
    );
    println!(
        "done {} of {} tasks ({} failed, {} pending); shards complete: {} of {}; task time {:.1} s; merged: {}",
        s.done,
        s.tasks,
        s.failed,
        s.tasks - s.done - s.failed,
        s.shards_done,
        m.shards,
        s.task_s,
        if s.merged { "yes" } else { "no" }
    );
    for (job, states) in &s.slurm {
        match states {
            Ok(st) if st.is_empty() => println!("slurm job {job}: not in the queue"),
            Ok(st) => println!(
                "slurm job {job}: {}",
                st.iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(e) => println!("slurm job {job}: {e}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
