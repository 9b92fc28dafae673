//! The Slurm backend: a job array whose task I runs shard I of the sweep
//! (`mmulab sweep DIR/sweep.toml --out DIR --shard I/K`), with the build
//! recorded in the manifest. Only `sbatch` and `squeue` are used (`sacct`
//! needs accounting, which small clusters often lack); completion is read
//! from the part files, which are the results.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::SweepError;
use crate::store::{Manifest, OutDir, SlurmJob};

#[derive(Clone, Debug, Default)]
pub struct SlurmOptions {
    /// At most this many array tasks at once (`--array=…%M`).
    pub max_running: Option<usize>,
    /// Options written as `#SBATCH` lines: `--partition=short`,
    /// `--time=00:30:00`, `--account=lab`.
    pub args: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Submitted {
    pub job_id: String,
    pub array: String,
    pub script: PathBuf,
    /// Array tasks submitted.
    pub shards: usize,
}

fn slurm_err(s: impl Into<String>) -> SweepError {
    SweepError::Slurm(s.into())
}

/// `0-3,5,7-9` from sorted indices.
fn ranges(ix: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ix.len() {
        let mut j = i;
        while j + 1 < ix.len() && ix[j + 1] == ix[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ix[i].to_string()
        } else {
            format!("{}-{}", ix[i], ix[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// A path as one single-quoted shell word.
fn sh_quote(p: &Path) -> Result<String, SweepError> {
    let s = p.to_str().ok_or_else(|| {
        SweepError::Invalid(format!(
            "{}: not valid UTF-8, cannot go in a job script",
            p.display()
        ))
    })?;
    if s.contains(['\n', '\0']) {
        return Err(SweepError::Invalid(format!(
            "{s:?}: a newline in a path cannot go in a job script"
        )));
    }
    Ok(format!("'{}'", s.replace('\'', "'\\''")))
}

/// The job script for the shards in `array`.
pub fn job_script(
    m: &Manifest,
    dir: &Path,
    array: &str,
    opts: &SlurmOptions,
) -> Result<String, SweepError> {
    for a in &opts.args {
        if !a.starts_with('-') || a.contains(['\n', '\r', '\0']) {
            return Err(SweepError::Invalid(format!(
                "--slurm-arg {a:?}: expected one sbatch option such as --partition=short"
            )));
        }
    }
    let logs = dir.join("slurm").join("logs");
    let mut s = String::new();
    s.push_str("#!/bin/sh\n");
    s.push_str(&format!(
        "# Written by `mmulab sweep --backend slurm`: array task I runs shard I of {} of\n# the sweep in {} (mmulab {} {}, binary sha256 {}).\n",
        m.shards,
        dir.display(),
        m.build.mmulab_version,
        m.build.git_commit,
        m.build.binary_sha256
    ));
    s.push_str("#SBATCH --job-name=mmulab-sweep\n");
    s.push_str(&format!("#SBATCH --array={array}\n"));
    s.push_str("#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=1\n");
    s.push_str(&format!(
        "#SBATCH --output={}\n",
        logs.join("%A_%a.out").display()
    ));
    for a in &opts.args {
        s.push_str(&format!("#SBATCH {a}\n"));
    }
    s.push_str(&format!(
        "exec {} sweep {} --out {} --shard \"$SLURM_ARRAY_TASK_ID/{}\" --jobs 1\n",
        sh_quote(Path::new(&m.build.binary))?,
        sh_quote(&dir.join("sweep.toml"))?,
        sh_quote(dir)?,
        m.shards
    ));
    Ok(s)
}

/// Submits an array of the shards that still have tasks to run; `None`
/// when every task is done. The job id goes into the manifest.
pub fn submit(
    dir: &OutDir,
    m: &mut Manifest,
    opts: &SlurmOptions,
) -> Result<Option<Submitted>, SweepError> {
    let records = dir.records(m)?;
    let pending: BTreeSet<u64> = m
        .tasks
        .iter()
        .enumerate()
        .filter(|(i, _)| !records.done.contains_key(i))
        .map(|(_, t)| t.shard)
        .collect();
    if pending.is_empty() {
        return Ok(None);
    }
    let abs = dir.path.canonicalize().map_err(|err| SweepError::Io {
        path: dir.path.display().to_string(),
        err,
    })?;
    let shards: Vec<u64> = pending.into_iter().collect();
    let mut array = ranges(&shards);
    if let Some(n) = opts.max_running {
        array.push_str(&format!("%{}", n.max(1)));
    }
    let script_text = job_script(m, &abs, &array, opts)?;
    let slurm_dir = abs.join("slurm");
    std::fs::create_dir_all(slurm_dir.join("logs")).map_err(|err| SweepError::Io {
        path: slurm_dir.display().to_string(),
        err,
    })?;
    let script = slurm_dir.join(format!("job-{}.sh", m.slurm_jobs.len()));
    std::fs::write(&script, &script_text).map_err(|err| SweepError::Io {
        path: script.display().to_string(),
        err,
    })?;
    let out = Command::new("sbatch")
        .arg("--parsable")
        .arg(&script)
        .current_dir(&abs)
        .output()
        .map_err(|e| {
            slurm_err(format!(
                "cannot run sbatch: {e} (is Slurm installed and on PATH?)"
            ))
        })?;
    if !out.status.success() {
        return Err(slurm_err(format!(
            "sbatch {} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    // `--parsable` prints `jobid` or `jobid;cluster`.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let job_id = stdout
        .lines()
        .next()
        .and_then(|l| l.split(';').next())
        .map(str::trim)
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()))
        .ok_or_else(|| slurm_err(format!("sbatch printed no job id: {stdout:?}")))?
        .to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    m.slurm_jobs.push(SlurmJob {
        job_id: job_id.clone(),
        array: array.clone(),
        script: script.display().to_string(),
        submitted_unix_s: now,
    });
    dir.write_manifest(m)?;
    Ok(Some(Submitted {
        job_id,
        array,
        script,
        shards: shards.len(),
    }))
}

/// The states of a job's array tasks still known to `squeue` (pending,
/// running, completing): state → count. Empty once the job has left
/// the queue.
pub fn job_states(job_id: &str) -> Result<BTreeMap<String, usize>, SweepError> {
    let out = Command::new("squeue")
        .args(["-h", "-r", "-j", job_id, "-o", "%T"])
        .output()
        .map_err(|e| slurm_err(format!("cannot run squeue: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // A job purged from the controller is no longer queued.
        if stderr.contains("Invalid job id") {
            return Ok(BTreeMap::new());
        }
        return Err(slurm_err(format!("squeue -j {job_id}: {}", stderr.trim())));
    }
    let mut states = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let l = l.trim();
        if !l.is_empty() {
            *states.entry(l.to_string()).or_insert(0) += 1;
        }
    }
    Ok(states)
}

/// Waits until the job has left the queue, calling `progress` with its
/// queued array tasks' states at each poll. Polls back off from 0.1 s
/// to 3 s, so a short job is noticed at once and a long one does not
/// load the controller.
pub fn wait(
    job_id: &str,
    progress: &mut dyn FnMut(&BTreeMap<String, usize>),
) -> Result<(), SweepError> {
    let mut pause = Duration::from_millis(100);
    loop {
        let states = job_states(job_id)?;
        if states.is_empty() {
            return Ok(());
        }
        progress(&states);
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_secs(3));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_ranges_compress_runs() {
        assert_eq!(ranges(&[0, 1, 2, 3]), "0-3");
        assert_eq!(ranges(&[0, 2, 3, 4, 7]), "0,2-4,7");
        assert_eq!(ranges(&[5]), "5");
    }

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(sh_quote(Path::new("/a b/c")).unwrap(), "'/a b/c'");
        assert_eq!(sh_quote(Path::new("/it's")).unwrap(), "'/it'\\''s'");
        assert!(sh_quote(Path::new("/a\nb")).is_err());
    }
}
