//! `mmulab reproduce PAPER|all`: runs a paper's reproduction, wraps its
//! rows in the report contract, writes JSON, CSV, figures and (for `all`)
//! one static index.html, and prints the table and the headline line.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::ValueEnum;
use mmulab_report::{Experiments, ReproReport, ReproTable, html};

/// The papers `reproduce` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Paper {
    Black89,
    Balan92,
    Uhlig94,
    Romanescu10,
    Fleisch89,
    /// The five papers, and DIR/index.html.
    All,
}

const PAPERS: [Paper; 5] = [
    Paper::Black89,
    Paper::Balan92,
    Paper::Uhlig94,
    Paper::Romanescu10,
    Paper::Fleisch89,
];

impl Paper {
    pub fn name(self) -> &'static str {
        match self {
            Paper::Black89 => "black89",
            Paper::Balan92 => "balan92",
            Paper::Uhlig94 => "uhlig94",
            Paper::Romanescu10 => "romanescu10",
            Paper::Fleisch89 => "fleisch89",
            Paper::All => "all",
        }
    }
}

pub struct Args {
    pub paper: Paper,
    pub out: Option<PathBuf>,
    pub quick: bool,
    pub experiments: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    /// Print the reports as JSON instead of the tables.
    pub json: bool,
    /// Where the sweep files' tasks run.
    pub backend: crate::sweep_cmd::Backend,
    /// slurm: sbatch options for every array task.
    pub slurm_args: Vec<String>,
}

fn provenance() -> mmulab_report::Provenance {
    mmulab_report::Provenance {
        mmulab_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: option_env!("MMULAB_GIT_COMMIT").unwrap_or("unknown").into(),
    }
}

/// A paper that Ctrl-C stopped: the steps it finished, and the one it was
/// in. Its rows are assembled only when every step has run, so none are
/// kept.
struct Stopped {
    paper: &'static str,
    done: Vec<String>,
    cut: Option<String>,
}

impl Stopped {
    fn note(&self) -> String {
        let done = if self.done.is_empty() {
            "none".to_string()
        } else {
            self.done.join("; ")
        };
        format!(
            "mmulab: {}: stopped by Ctrl-C in step `{}`; steps finished: {done}. A paper's rows are assembled from all its steps, so this paper has none (the papers before it are kept)",
            self.paper,
            self.cut.as_deref().unwrap_or("starting")
        )
    }
}

/// Runs one paper; its figures go to `out`. `Ok(Err(_))` when Ctrl-C
/// stopped it.
fn run_one(
    paper: Paper,
    src: &Experiments,
    quick: bool,
    out: Option<&Path>,
    backend: &dyn mmulab_experiment::reproduce::Backend,
) -> anyhow::Result<Result<(ReproReport, String), Stopped>> {
    use mmulab_experiment::reproduce as r;
    // On a terminal a spinner shows the step and the time so far;
    // elsewhere each step is a line on stderr (unless --quiet).
    let spin = crate::ui::Spinner::new(&format!("{}: starting", paper.name()));
    // The steps begun, for the note when Ctrl-C stops the paper.
    let steps = std::sync::Mutex::new(Vec::<String>::new());
    // Ctrl-C is seen at the next step and at the next seed (which also
    // stops inside its simulation): either unwinds with `Cancelled`, caught
    // below.
    let progress = |m: &str| {
        if crate::ui::stopped() {
            std::panic::resume_unwind(Box::new(mmulab_experiment::run::Cancelled));
        }
        steps.lock().expect("steps").push(m.to_string());
        spin.step(&format!("{}: {m}", paper.name()));
    };
    let mut epilogue = String::new();
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        anyhow::Ok(match paper {
            Paper::Black89 => r::black89::reproduce(src, quick, out, backend, &progress)?,
            Paper::Balan92 => r::balan92::reproduce(src, quick, out, backend, &progress)?,
            Paper::Uhlig94 => r::uhlig94::reproduce(src, quick, out, backend, &progress)?,
            Paper::Romanescu10 => r::romanescu10::reproduce(src, quick, out, backend, &progress)?,
            Paper::Fleisch89 => {
                let t = r::fleisch89::reproduce(src, quick, out, backend, &progress)?;
                epilogue = mmulab_mirage::cli::reproduce_epilogue();
                t
            }
            Paper::All => unreachable!("`all` is split into papers"),
        })
    }));
    spin.finish();
    let table: ReproTable = match ran {
        Ok(t) => t?,
        Err(payload) if payload.is::<mmulab_experiment::run::Cancelled>() => {
            let steps = steps.into_inner().expect("steps");
            let (done, cut) = match steps.split_last() {
                Some((last, done)) => (done.to_vec(), Some(last.clone())),
                None => (Vec::new(), None),
            };
            return Ok(Err(Stopped {
                paper: paper.name(),
                done,
                cut,
            }));
        }
        Err(payload) => std::panic::resume_unwind(payload),
    };

    let report = ReproReport::new(paper.name(), table, quick, &provenance())
        .context("a reproduction broke the row contract")?;
    Ok(Ok((report, epilogue)))
}

/// The figures a paper wrote to `dir`: `PAPER-fig*.svg`, sorted.
fn figures(dir: &Path, paper: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&format!("{paper}-fig")) && n.ends_with(".svg"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// What was written where: on stdout with the tables, on stderr (a note)
/// when stdout carries JSON.
fn say(json: bool, msg: String) {
    if json {
        crate::ui::note(msg);
    } else {
        println!("{msg}");
    }
}

/// Exit 0 when every judged emergent row holds, 1 otherwise.
pub fn run(args: Args) -> anyhow::Result<bool> {
    let src = match &args.experiments {
        Some(d) => Experiments::Dir(d.clone()),
        None => Experiments::Embedded,
    };
    let papers: Vec<Paper> = if args.paper == Paper::All {
        PAPERS.to_vec()
    } else {
        vec![args.paper]
    };
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    }
    let backend: Box<dyn mmulab_experiment::reproduce::Backend> = match args.backend {
        crate::sweep_cmd::Backend::Local => {
            if !args.slurm_args.is_empty() {
                anyhow::bail!("--slurm-arg goes with --backend slurm");
            }
            Box::new(mmulab_experiment::reproduce::Local)
        }
        crate::sweep_cmd::Backend::Slurm => {
            // Each sweep file's results folder: OUT/sweeps/PAPER/NAME, or
            // sweeps/reproduce/PAPER/NAME without --out.
            let root = match &args.out {
                Some(o) => o.join("sweeps"),
                None => PathBuf::from("sweeps/reproduce"),
            };
            Box::new(mmulab_sweep::repro::SlurmBackend {
                root,
                quick: args.quick,
                build: crate::sweep_cmd::build()?,
                opts: mmulab_sweep::slurm::SlurmOptions {
                    max_running: None,
                    args: args.slurm_args.clone(),
                },
                progress: Box::new(|m: &str| crate::ui::note(m.to_string())),
            })
        }
    };
    // Ctrl-C stops the paper in progress at its next seed or step (a seed
    // running stops inside its simulation): the papers done are printed
    // and written as usual, and the one stopped is named with the steps
    // it finished (no report is ever half a paper).
    let stop = crate::ui::stop_on_ctrl_c();
    mmulab_experiment::run::cancel_seeds_on(stop);
    let mut reports = Vec::new();
    for &p in &papers {
        if crate::ui::stopped() {
            break;
        }
        if args.backend == crate::sweep_cmd::Backend::Slurm {
            // Every paper has sweep files (experiments/PAPER/*.sweep.toml);
            // its other runs are not sweep files yet (docs/sweeps.md).
            crate::ui::note(format!(
                "{}: its sweep files run through Slurm; its other runs run in this process",
                p.name()
            ));
        }
        let (report, epilogue) =
            match run_one(p, &src, args.quick, args.out.as_deref(), backend.as_ref())? {
                Ok(r) => r,
                Err(stopped) => {
                    eprintln!("{}", stopped.note());
                    break;
                }
            };
        if !args.json {
            print!("{}", report.render());
            print!("{epilogue}");
        }
        if let Some(out) = &args.out {
            report
                .write(out)
                .with_context(|| format!("cannot write {}", out.display()))?;
        }
        reports.push(report);
    }
    if let Some(out) = &args.out {
        if args.paper == Paper::All && !crate::ui::stopped() {
            let pages: Vec<html::PaperPage<'_>> = reports
                .iter()
                .map(|r| html::PaperPage {
                    report: r,
                    figures: figures(out, &r.paper),
                })
                .collect();
            let title = format!(
                "mmulab reproductions{}",
                if args.quick { " (--quick)" } else { "" }
            );
            let path = out.join("index.html");
            std::fs::write(&path, html::index_page(&pages, &title))
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        let names: Vec<String> = reports
            .iter()
            .map(|r| format!("reproduce-{}.json and .csv", r.paper))
            .collect();
        let index = if args.paper == Paper::All {
            ", index.html"
        } else {
            ""
        };
        say(
            args.json,
            format!(
                "wrote {}: {}, figures (SVG and CSV){index}",
                out.display(),
                names.join(", ")
            ),
        );
    }
    if let Some(dir) = &args.markdown {
        let path = mmulab_report::markdown::write(dir, &reports, args.quick)
            .with_context(|| format!("cannot write Markdown in {}", dir.display()))?;
        say(args.json, format!("wrote {}", path.display()));
    }
    if args.json {
        let v: Vec<serde_json::Value> = reports
            .iter()
            .map(|r| serde_json::to_value(r).expect("a report serialises"))
            .collect();
        let out = if args.paper == Paper::All {
            serde_json::Value::Array(v)
        } else {
            v.into_iter().next().unwrap_or(serde_json::Value::Null)
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for r in &reports {
            println!("{}", r.headline_line());
        }
    }
    Ok(reports.iter().all(|r| r.headline.emergent_all_within()))
}
