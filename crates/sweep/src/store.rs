//! A sweep's results folder:
//!
//! ```text
//! DIR/manifest.json   the plan, the build, per-task status, Slurm job ids
//! DIR/sweep.toml      the sweep, expanded (what shards read)
//! DIR/base.toml       the base spec's text
//! DIR/parts/*.jsonl   one line per finished task, one file per process
//! DIR/results.csv     merged: one row per task and metric
//! DIR/summary.csv     merged: per point and metric, statistics over seeds
//! DIR/slurm/          job scripts and the array tasks' logs
//! ```
//!
//! Processes never share a file: each appends to its own part file, and
//! only the merge writes the results. A killed process leaves at most a
//! torn last line, which the reader skips (that task runs again).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::SweepError;
use crate::plan::{Kind, Seeds, Sweep, sha256_hex, shard_range};
use crate::task::TaskRecord;

/// Bumped when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// The build that runs a sweep. Every process that adds tasks to a
/// folder must be this build (its binary's hash), so a sweep's results
/// never mix two simulators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Build {
    pub mmulab_version: String,
    pub git_commit: String,
    /// The binary that ran (and that Slurm array tasks run).
    pub binary: String,
    pub binary_sha256: String,
}

impl Build {
    /// This process's build: its executable, hashed.
    pub fn current(version: &str, git_commit: &str) -> Result<Build, SweepError> {
        let exe = std::env::current_exe().map_err(|err| SweepError::Io {
            path: "the running executable".into(),
            err,
        })?;
        let bytes = std::fs::read(&exe).map_err(|err| SweepError::Io {
            path: exe.display().to_string(),
            err,
        })?;
        Ok(Build {
            mmulab_version: version.to_string(),
            git_commit: git_commit.to_string(),
            binary: exe.display().to_string(),
            binary_sha256: sha256_hex(&bytes),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BaseInfo {
    pub origin: String,
    pub sha256: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PointEntry {
    pub index: usize,
    /// Column → value, as results.csv shows it.
    pub values: BTreeMap<String, String>,
    /// The same as `--set` arguments.
    pub set: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    Pending,
    Done,
    Failed,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskEntry {
    pub id: String,
    pub point: usize,
    pub seed: u64,
    /// The Slurm array task (shard of `shards`) that runs it.
    pub shard: u64,
    pub status: TaskStatus,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SlurmJob {
    pub job_id: String,
    /// The `--array` it was submitted with.
    pub array: String,
    pub script: String,
    pub submitted_unix_s: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(flatten)]
    pub build: Build,
    pub kind: Kind,
    /// The expanded plan's hash (see `Sweep::sha256`).
    pub sweep_sha256: String,
    pub base: Option<BaseInfo>,
    pub columns: Vec<String>,
    pub seeds: Seeds,
    pub chunk: u64,
    /// Slurm array tasks: shard i of `shards` runs the tasks with that
    /// `shard`.
    pub shards: u64,
    pub points: Vec<PointEntry>,
    pub tasks: Vec<TaskEntry>,
    #[serde(default)]
    pub slurm_jobs: Vec<SlurmJob>,
}

impl Manifest {
    pub fn new(sweep: &Sweep, build: &Build) -> Manifest {
        let shards = sweep.shard_count();
        let mut tasks = Vec::with_capacity(sweep.task_count());
        for s in 0..shards {
            for i in shard_range(sweep.task_count(), s, shards) {
                let t = sweep.task(i);
                tasks.push(TaskEntry {
                    id: t.id(),
                    point: t.point,
                    seed: t.seed,
                    shard: s,
                    status: TaskStatus::Pending,
                });
            }
        }
        debug_assert_eq!(tasks.len(), sweep.task_count());
        Manifest {
            schema_version: SCHEMA_VERSION,
            build: build.clone(),
            kind: sweep.kind,
            sweep_sha256: sweep.sha256.clone(),
            base: sweep.base.as_ref().map(|b| BaseInfo {
                origin: b.origin.clone(),
                sha256: b.sha256.clone(),
            }),
            columns: sweep.columns.clone(),
            seeds: sweep.seeds,
            chunk: sweep.chunk,
            shards,
            points: sweep
                .points
                .iter()
                .enumerate()
                .map(|(index, p)| PointEntry {
                    index,
                    values: sweep
                        .columns
                        .iter()
                        .map(|c| (c.clone(), p.column(c)))
                        .collect(),
                    set: p.sets(),
                })
                .collect(),
            tasks,
            slurm_jobs: Vec::new(),
        }
    }
}

/// Every finished task found in a folder's part files.
#[derive(Default)]
pub struct Records {
    /// Task index → its result (the same from every process that ran it).
    pub done: BTreeMap<usize, TaskRecord>,
    /// Task index → its latest failure, for tasks with no result.
    pub failed: BTreeMap<usize, TaskRecord>,
}

/// A results folder.
#[derive(Clone, Debug)]
pub struct OutDir {
    pub path: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SweepError + '_ {
    move |err| SweepError::Io {
        path: path.display().to_string(),
        err,
    }
}

/// Writes `path` whole or not at all (a reader never sees half a file).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SweepError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

impl OutDir {
    pub fn new(path: impl Into<PathBuf>) -> OutDir {
        OutDir { path: path.into() }
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.path.join("manifest.json")
    }

    pub fn parts(&self) -> PathBuf {
        self.path.join("parts")
    }

    pub fn read_manifest(&self) -> Result<Option<Manifest>, SweepError> {
        let p = self.manifest_path();
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(io(&p)(err)),
        };
        let m: Manifest = serde_json::from_str(&text)
            .map_err(|e| SweepError::Invalid(format!("{}: {e}", p.display())))?;
        if m.schema_version != SCHEMA_VERSION {
            return Err(SweepError::Invalid(format!(
                "{}: schema_version {} (this build reads {SCHEMA_VERSION})",
                p.display(),
                m.schema_version
            )));
        }
        Ok(Some(m))
    }

    /// The manifest of a folder that must hold one.
    pub fn manifest(&self) -> Result<Manifest, SweepError> {
        self.read_manifest()?.ok_or_else(|| {
            SweepError::Invalid(format!(
                "{}: no manifest.json (not a sweep's results folder)",
                self.path.display()
            ))
        })
    }

    pub fn write_manifest(&self, m: &Manifest) -> Result<(), SweepError> {
        let json = serde_json::to_string_pretty(m).expect("a manifest serialises");
        write_atomic(&self.manifest_path(), (json + "\n").as_bytes())
    }

    /// Makes this folder `sweep`'s, or checks that it already is.
    /// `reuse`: whether a folder that already holds this sweep may be
    /// added to (`--resume`, `--shard`); a folder holding another sweep,
    /// or written by another build, is always refused.
    pub fn prepare(
        &self,
        sweep: &Sweep,
        build: &Build,
        reuse: bool,
    ) -> Result<Manifest, SweepError> {
        if let Some(m) = self.read_manifest()? {
            return self.check_same(m, sweep, build, reuse);
        }
        if self.path.exists() {
            let empty = std::fs::read_dir(&self.path)
                .map_err(io(&self.path))?
                .next()
                .is_none();
            if !empty {
                return Err(SweepError::Invalid(format!(
                    "--out {}: the folder exists and holds no sweep (no manifest.json); choose a new or empty folder",
                    self.path.display()
                )));
            }
        }
        // Build the folder aside and rename it into place: shards started
        // together race here, and exactly one rename wins.
        let parent = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(io(&parent))?;
        let name = self
            .path
            .file_name()
            .ok_or_else(|| {
                SweepError::Invalid(format!("--out {}: not a folder name", self.path.display()))
            })?
            .to_string_lossy()
            .into_owned();
        let tmp = parent.join(format!(".{name}.new-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("parts")).map_err(io(&tmp))?;
        std::fs::write(tmp.join("sweep.toml"), sweep.to_toml("base.toml")).map_err(io(&tmp))?;
        if let Some(b) = &sweep.base {
            std::fs::write(tmp.join("base.toml"), &b.text).map_err(io(&tmp))?;
        }
        let m = Manifest::new(sweep, build);
        OutDir::new(&tmp).write_manifest(&m)?;
        match std::fs::rename(&tmp, &self.path) {
            Ok(()) => Ok(m),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                match self.read_manifest()? {
                    // Another shard made it first.
                    Some(m) => self.check_same(m, sweep, build, true),
                    None => Err(io(&self.path)(e)),
                }
            }
        }
    }

    fn check_same(
        &self,
        m: Manifest,
        sweep: &Sweep,
        build: &Build,
        reuse: bool,
    ) -> Result<Manifest, SweepError> {
        let dir = self.path.display();
        if m.sweep_sha256 != sweep.sha256 {
            return Err(SweepError::Invalid(format!(
                "--out {dir}: the folder holds another sweep (plan sha256 {}, this one {}); choose another --out",
                m.sweep_sha256, sweep.sha256
            )));
        }
        if m.build.binary_sha256 != build.binary_sha256 {
            return Err(SweepError::Invalid(format!(
                "--out {dir}: the folder was started by another build of mmulab ({} at {}, sha256 {}; this is sha256 {}); one sweep never mixes two builds' results: choose another --out",
                m.build.git_commit, m.build.binary, m.build.binary_sha256, build.binary_sha256
            )));
        }
        if !reuse {
            return Err(SweepError::Invalid(format!(
                "--out {dir}: the folder already holds this sweep; pass --resume to finish it, or choose another --out"
            )));
        }
        Ok(m)
    }

    /// Reads every part file. A torn last line (a process killed while
    /// writing it) is skipped; anything else malformed is an error.
    pub fn records(&self, m: &Manifest) -> Result<Records, SweepError> {
        let mut out = Records::default();
        let dir = self.parts();
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(io(&dir)(err)),
        };
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(io(&f))?;
            let complete = text.rfind('\n').map_or(0, |i| i + 1);
            for (n, line) in text[..complete].lines().enumerate() {
                let bad =
                    |why: String| SweepError::Invalid(format!("{}:{}: {why}", f.display(), n + 1));
                let r: TaskRecord = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
                let entry = m.tasks.get(r.task).ok_or_else(|| {
                    bad(format!(
                        "task {} is not in this sweep's {} tasks",
                        r.task,
                        m.tasks.len()
                    ))
                })?;
                if entry.id != r.id {
                    return Err(bad(format!(
                        "task {} is `{}` in the manifest, `{}` here",
                        r.task, entry.id, r.id
                    )));
                }
                if r.failed.is_some() {
                    if !out.done.contains_key(&r.task) {
                        out.failed.insert(r.task, r);
                    }
                    continue;
                }
                out.failed.remove(&r.task);
                if let Some(prev) = out.done.get(&r.task) {
                    // Determinism, checked: two runs of one task by one
                    // build must agree.
                    if !prev.same_result(&r) {
                        return Err(bad(format!(
                            "task {} has two different results; the folder's results cannot be trusted",
                            r.id
                        )));
                    }
                    continue;
                }
                out.done.insert(r.task, r);
            }
        }
        Ok(out)
    }

    /// A new part file for this process (never one another process has).
    pub fn part_writer(&self, label: &str) -> Result<PartWriter, SweepError> {
        let dir = self.parts();
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let host: String = host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!(
            "{label}-{host}-{}-{nanos}.jsonl",
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(&path))?;
        Ok(PartWriter {
            path,
            file: Mutex::new(file),
        })
    }
}

/// Appends records, one whole line per write, shared by a process's
/// worker threads.
pub struct PartWriter {
    pub path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl PartWriter {
    pub fn append(&self, r: &TaskRecord) -> Result<(), SweepError> {
        let mut line = serde_json::to_string(r).expect("a record serialises");
        debug_assert!(!line.contains('\n'));
        line.push('\n');
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(line.as_bytes()).map_err(io(&self.path))
    }
}
