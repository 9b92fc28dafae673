//! The `mmulab` command: parse, build, run, print. Nothing else lives here.
//!
//! Exit status, the same for every command:
//! * 0: it ran and every verdict is positive (consistent, within tolerance);
//! * 1: it ran, but a verdict is negative (the oracle or a workload's check
//!   found an inconsistency, a judged row is outside its tolerance, a check
//!   found violations, a sweep's tasks are incomplete or failed);
//! * 2: it could not run: bad usage or bad input (the message names the
//!   argument, key or line), or something it needs is missing;
//! * 130: stopped by Ctrl-C; what ran is kept and printed.
//!
//! `dsm run` is the exception: it exits with its program's status.
//!
//! Output flags: `--out DIR` writes a folder of results, `-o FILE` one
//! file, `--json` prints JSON on stdout instead of tables.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use mmulab_experiment::{Budget, Results, Spec};
use mmulab_report::Table;

mod reproduce_cmd;
mod sweep_cmd;
mod trace_cmd;
mod ui;

/// The progress bar every command uses (sweep_cmd calls it `crate::bar`).
use ui::bar;

#[derive(Parser)]
#[command(
    name = "mmulab",
    version,
    about = "Translation coherence toolkit: TLB shootdown, HAT layers, UNITD, software-managed TLBs, Mirage DSM",
    after_help = "Exit status: 0 success; 1 ran, but a verdict is negative (inconsistent, out of tolerance); 2 bad usage or bad input; 130 stopped by Ctrl-C (partial results kept).\nOutput: --out DIR writes a folder, -o FILE one file, --json prints JSON on stdout."
)]
struct Cli {
    /// No progress bars and no notes on stderr (results, warnings and
    /// errors still print).
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

/// Ceilings a run is checked against before anything is allocated.
#[derive(clap::Args, Clone, Copy)]
struct BudgetArgs {
    /// Refuse a run whose estimated host memory is above SIZE (bytes, or
    /// with a K/M/G/T suffix). Default: this machine's available memory.
    #[arg(long, value_name = "SIZE", value_parser = mmulab_experiment::budget::parse_size)]
    max_memory: Option<u64>,
    /// Refuse a run whose estimated simulated operations (references,
    /// system calls) are above N.
    #[arg(long, value_name = "N", default_value_t = mmulab_experiment::budget::DEFAULT_MAX_WORK, value_parser = mmulab_experiment::budget::parse_count)]
    max_work: u64,
}

impl BudgetArgs {
    fn budget(self) -> Budget {
        let host = Budget::for_this_host();
        Budget {
            max_memory_bytes: self.max_memory.unwrap_or(host.max_memory_bytes),
            max_work: self.max_work,
        }
    }
}

/// `mmulab bench`'s workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BenchWorkload {
    /// Flat memory, protocol global.
    Foundation,
    /// The same workload on preset x86-simics-2010 (caches, directory,
    /// MOSI checker), protocol unitd.
    Unitd,
}

/// `mmulab host shootdown --op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum HostOp {
    /// mprotect from read-write to read-only.
    Mprotect,
    /// munmap of a shared mapping.
    Munmap,
    /// madvise(MADV_DONTNEED).
    Madvise,
}

impl HostOp {
    fn op(self) -> mmulab_host::Op {
        match self {
            HostOp::Mprotect => mmulab_host::Op::Mprotect,
            HostOp::Munmap => mmulab_host::Op::Munmap,
            HostOp::Madvise => mmulab_host::Op::MadviseDontneed,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run an experiment spec and print its summary.
    Run {
        /// The spec: a TOML file, or a shipped spec by name
        /// (`experiments/tester.toml`, `black89/fig2`).
        spec: PathBuf,
        /// Override any spec field: KEY=VALUE (dotted keys, TOML values).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Write DIR/results.json and DIR/results.csv.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Print results.json to stdout instead of the table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// Randomized correctness sweep: many seeds of a random workload under a
    /// protocol, every translation checked by the oracle.
    Check {
        /// The protocol to check (`mmulab list`).
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(mmulab_protocols::names()))]
        protocol: String,
        /// How many seeds to run.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        seeds: u64,
        /// First seed.
        #[arg(long, default_value_t = 1)]
        start: u64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Refuse a sweep whose estimated simulated operations are above N.
        #[arg(long, value_name = "N", default_value_t = mmulab_experiment::budget::DEFAULT_MAX_WORK, value_parser = mmulab_experiment::budget::parse_count)]
        max_work: u64,
        /// `slurm`: run the seeds as a Slurm job array (arrays of 1,000
        /// seeds or more) through the sweep engine, into --out.
        #[arg(long, value_enum, default_value_t = sweep_cmd::Backend::Local)]
        backend: sweep_cmd::Backend,
        /// slurm: the results folder (default: sweeps/check-PROTOCOL-START-SEEDS).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// slurm: wait for the array, merge, and report as a local check does.
        #[arg(long)]
        wait: bool,
        /// slurm: finish a check already started in --out.
        #[arg(long)]
        resume: bool,
        /// slurm: an sbatch option for every array task (repeat it).
        #[arg(long = "slurm-arg", value_name = "OPTION", allow_hyphen_values = true)]
        slurm_args: Vec<String>,
    },
    /// Measure simulated memory references per second on this host.
    Bench {
        /// Runs; the median is reported.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        runs: u64,
        /// References per thread (the fixed workload uses 2,000,000).
        #[arg(long, default_value_t = 2_000_000)]
        refs_per_thread: u64,
        /// The workload measured.
        #[arg(long, value_enum, default_value_t = BenchWorkload::Foundation)]
        workload: BenchWorkload,
        /// Bytes between a thread's consecutive references: 8 (a word)
        /// sweeps its pages as a loop over an array does; 64 (a cache line)
        /// makes nearly every reference an L1 miss on `unitd`, the memory
        /// system's worst case.
        #[arg(long, default_value_t = 8)]
        stride: u64,
        /// Print JSON: refs_per_second (the median), samples, runs,
        /// workload, workload_kind, stride_bytes, machine, profile, memory
        /// (hit rates; null on flat memory) and compare (null without
        /// --compare).
        #[arg(long)]
        json: bool,
        /// A saved `mmulab bench --json` result of the same workload and
        /// stride: print this run's ratio to it (JSON: `compare`). Never
        /// fails on the ratio, only on a file it cannot compare with.
        #[arg(long, value_name = "REF.json")]
        compare: Option<String>,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// Reproduce a paper's evaluation: paper vs mmulab, side by side, each
    /// row with its basis (input, calibrated, arithmetic, emergent). Exits
    /// 1 when a judged emergent row is outside its tolerance.
    Reproduce {
        /// The paper, or `all` for the five and DIR/index.html.
        #[arg(value_enum)]
        paper: reproduce_cmd::Paper,
        /// Write DIR/reproduce-PAPER.json and .csv, the figures (SVG, with
        /// their data as CSV) and, for `all`, DIR/index.html.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Fewer seeds and smaller sweeps (for CI and the docs' tables).
        #[arg(long)]
        quick: bool,
        /// An edited copy of experiments/ (default: the specs compiled into
        /// this build).
        #[arg(long, value_name = "DIR")]
        experiments: Option<PathBuf>,
        /// Write DIR/headline-MODE.md and DIR/reproduce-MODE.md (MODE: quick
        /// or full), the tables the docs show.
        #[arg(long, value_name = "DIR")]
        markdown: Option<PathBuf>,
        /// Print the reports (reproduce-PAPER.json's object; for `all`, an
        /// array of them) on stdout instead of the tables.
        #[arg(long)]
        json: bool,
        /// Where the sweep files' tasks run (experiments/PAPER/*.sweep.toml:
        /// balan92 and romanescu10): this machine's cores, or a Slurm job
        /// array per sweep file (folders under OUT/sweeps, or
        /// sweeps/reproduce without --out; the same rows either way).
        #[arg(long, value_enum, default_value_t = sweep_cmd::Backend::Local)]
        backend: sweep_cmd::Backend,
        /// slurm: an sbatch option for every array task (repeat it), as
        /// `mmulab sweep --slurm-arg`.
        #[arg(long = "slurm-arg", value_name = "OPTION", allow_hyphen_values = true)]
        slurm_args: Vec<String>,
    },
    /// Run a grid of specs and seeds (a sweep file) on this machine's cores
    /// or as a Slurm job array, into tidy results.csv and summary.csv.
    Sweep(sweep_cmd::SweepArgs),
    /// Memory traces: capture, simulate, export, benchmark.
    #[command(subcommand)]
    Trace(trace_cmd::TraceCommand),
    /// Mirage DSM for real: site daemons over TCP, and their benchmark.
    #[command(subcommand)]
    Dsm(DsmCommand),
    /// Real measurements on this Linux host.
    #[command(subcommand)]
    Host(HostCommand),
    /// Name the presets, protocols and workloads.
    List {
        /// Print them as JSON: {presets, protocols, workloads}.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (e.g. `mmulab completions bash >
    /// /etc/bash_completion.d/mmulab`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum DsmCommand {
    /// Run one site's daemon (until killed).
    Site {
        /// The cluster: sites and their addresses, Δ per key.
        #[arg(long)]
        config: PathBuf,
        /// This site's name in the config.
        #[arg(long)]
        name: String,
    },
    /// Run an unmodified program on a site: LD_PRELOAD=libmmulab_shm.so
    /// routes its shmget/shmat/shmdt/shmctl to the site's daemon. Exits
    /// with the program's status.
    Run {
        /// The cluster file.
        #[arg(long, default_value = "cluster.toml")]
        config: PathBuf,
        /// The site whose daemon serves the program (default: the first).
        #[arg(long)]
        site: Option<String>,
        /// The program and its arguments (after `--`).
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// A site daemon's view: sites, segments mapped there, shmids.
    Status {
        /// The cluster file.
        #[arg(long, default_value = "cluster.toml")]
        config: PathBuf,
        /// The site to ask (default: the first).
        #[arg(long)]
        site: Option<String>,
        /// Print the status as JSON: {site, id, cluster, incarnation,
        /// sites: [{name, addr, state, dead_reason, connection,
        /// heard_ms_ago, incarnation}], segments: [{segment, library,
        /// pages, held_write, held_read, held_none, attaches, programs}],
        /// lost_pages, semantics, shmids: [{shmid, key, removed, segment,
        /// bytes, uid, gid, mode, nattch}], truncated}.
        #[arg(long)]
        json: bool,
    },
    /// Remote-fault latency against the loopback limit (two sites in this
    /// process), ping-pong and read-writer Δ sweeps (one process per site,
    /// each pinned to a core).
    Bench {
        /// Fewer trials and a shorter sweep.
        #[arg(long)]
        quick: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a new cluster key (256 random bits, mode 0600) for
    /// cluster.toml's `key_file`; never overwrites a file.
    Keygen {
        /// The key file to create (refused if it exists).
        /// `--out` is the old name of this flag.
        #[arg(short = 'o', long = "output", alias = "out", value_name = "FILE")]
        out: PathBuf,
    },
    /// A TCP proxy that injects faults between sites (delay, loss, cuts),
    /// for testing a cluster under a bad network.
    Proxy {
        /// The address the proxy listens on (what a site dials instead).
        #[arg(long, value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// The site every accepted connection is forwarded to.
        #[arg(long, value_name = "ADDR")]
        to: std::net::SocketAddr,
        /// Delay each chunk by this many milliseconds.
        #[arg(long, value_name = "MS", default_value_t = 0)]
        delay: u64,
        /// Discard each chunk with this probability.
        #[arg(long, value_name = "P", default_value_t = 0.0)]
        drop: f64,
        /// Cut a connection once this many bytes went one way.
        #[arg(long, value_name = "BYTES")]
        cut_after: Option<u64>,
        /// Seed of the loss stream.
        #[arg(long, value_name = "S", default_value_t = 0)]
        seed: u64,
    },
    /// One site of a bench sweep point (started by `dsm bench` itself:
    /// its listener on fd 3, its job as JSON, `go`/`stop` on stdin).
    #[command(hide = true)]
    BenchSite {
        /// The job, as JSON.
        #[arg(long)]
        job: String,
    },
}

#[derive(Subcommand)]
enum HostCommand {
    /// black89's consistency tester on real threads: the initiator's latency
    /// for an operation with 0..N responders spinning on their counters, the
    /// TLB-shootdown interrupts taken, and the consistency verdict.
    Shootdown {
        /// Responder thread counts: a list (1,2,4) or a range (1-15).
        /// Default: every count that fits on this machine's cores.
        #[arg(long)]
        threads: Option<String>,
        /// The operation that reduces the page's rights.
        #[arg(long, value_enum, default_value_t = HostOp::Mprotect)]
        op: HostOp,
        /// Pages per operation.
        #[arg(long, default_value_t = 1)]
        pages: usize,
        /// Timed repetitions per point.
        #[arg(long, default_value_t = 100)]
        reps: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Also write the calibration (fitted costs) of a `host` preset here.
        #[arg(long, value_name = "FILE")]
        calibration_out: Option<PathBuf>,
    },
    /// Measure (as `host shootdown` with mprotect), write a `host` timing
    /// preset from the fit, and check that the simulator's tester on it
    /// predicts the measured latency at every thread count.
    Preset {
        /// Responder thread counts: a list (1,2,4) or a range (1-15).
        #[arg(long)]
        threads: Option<String>,
        /// Timed repetitions per point.
        #[arg(long, default_value_t = 300)]
        reps: usize,
        /// Where to write the preset (use it with `--set preset=FILE`).
        /// `--out` is the old name of this flag.
        #[arg(
            short = 'o',
            long = "output",
            alias = "out",
            value_name = "FILE",
            default_value = "host.toml"
        )]
        out: PathBuf,
        /// Print {preset, points: [{responders, measured_ns, simulated_ns,
        /// error_pct}], worst_error_pct} as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// An error means the input was bad or the command could not run: exit 2
/// (see the exit statuses at the top).
fn main() -> ExitCode {
    let cli = Cli::parse();
    ui::set_quiet(cli.quiet);
    // Output piped into `head` and closed: end quietly, as Unix tools do,
    // instead of panicking on EPIPE. Not for the DSM and the host
    // benchmarks, whose sockets and children must see EPIPE as an error.
    if !matches!(cli.command, Command::Dsm(_) | Command::Host(_)) {
        // SAFETY: restores the default action before any thread starts.
        unsafe { nix::libc::signal(nix::libc::SIGPIPE, nix::libc::SIG_DFL) };
    }
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "mmulab: {}",
                mmulab_experiment::spec::clip_message(&format!("{e:#}"))
            );
            // A sweep that ran but whose tasks are incomplete or failed
            // has a negative outcome (mmulab_sweep::SweepError); every
            // other error means the command could not run.
            let ran = e
                .downcast_ref::<mmulab_sweep::SweepError>()
                .is_some_and(|e| !e.is_bad_input());
            ExitCode::from(if ran { 1 } else { 2 })
        }
    }
}

/// A host measurement stopped by Ctrl-C before its baseline has nothing to
/// print: exit 130 at once. Other errors pass.
fn host_stopped(
    r: Result<mmulab_host::HostReport, mmulab_host::HostError>,
) -> anyhow::Result<mmulab_host::HostReport> {
    match r {
        Err(mmulab_host::HostError::Interrupted) => {
            eprintln!(
                "mmulab: stopped by Ctrl-C before the baseline was measured; nothing to report"
            );
            std::process::exit(130)
        }
        r => Ok(r?),
    }
}

/// Exit status for a command that ran: 130 if Ctrl-C stopped it, else 0
/// or 1 by its verdict.
fn verdict(ok: bool) -> ExitCode {
    if ui::stopped() {
        ui::note("mmulab: stopped by Ctrl-C; the results above cover what ran");
        ExitCode::from(130)
    } else if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Run {
            spec,
            sets,
            out,
            json,
            budget,
        } => {
            let spec = Spec::load(&spec, &sets)?;
            spec.check_budget(&budget.budget())?;
            let stop = ui::stop_on_ctrl_c();
            let pb = ui::bar(spec.runs, "running");
            let results = mmulab_experiment::run::run_spec_until(
                &spec,
                |i, _| pb.set_position(i),
                Some(&stop),
            )?;
            pb.finish_and_clear();
            if let Some(dir) = &out {
                results
                    .write(dir)
                    .with_context(|| format!("writing results to {}", dir.display()))?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&results)?);
            } else {
                print!("{}", summary(&spec, &results));
                if let Some(dir) = &out {
                    println!(
                        "results written to {}/results.json and results.csv",
                        dir.display()
                    );
                }
            }
            // A run whose oracle or workload check found an inconsistency,
            // or whose watchdog reported a spin past its bound, ran, but
            // its verdict is negative: exit 1.
            let consistent = results.oracle.violations == 0
                && results.oracle.verdict == "consistent"
                && results.workload.verdict != "inconsistent"
                && results.liveness.is_empty();
            Ok(verdict(consistent))
        }
        Command::Check {
            protocol,
            seeds,
            start,
            json,
            max_work,
            backend,
            out,
            wait,
            resume,
            slurm_args,
        } => {
            if start.checked_add(seeds).is_none() {
                return Err(mmulab_experiment::SpecError::Invalid(format!(
                    "--start: {start} + --seeds {seeds} passes the last seed, {}",
                    u64::MAX
                ))
                .into());
            }
            // Every seed draws its own machine and workload; the first
            // seed's estimate stands for them all.
            let first = mmulab_experiment::check::swarm_spec(&protocol, start);
            let per_seed = first.estimate().work_per_run;
            if per_seed.saturating_mul(seeds) > max_work {
                return Err(mmulab_experiment::SpecError::Invalid(format!(
                    "--seeds: {seeds} seeds of about {per_seed:.1e} simulated operations each are above --max-work ({max_work:.1e})"
                ))
                .into());
            }
            if backend == sweep_cmd::Backend::Slurm {
                let opts = sweep_cmd::Opts {
                    jobs: None,
                    backend,
                    shard: None,
                    resume,
                    wait,
                    slurm_args,
                    json,
                };
                return sweep_cmd::check(&protocol, start, seeds, out, opts);
            }
            anyhow::ensure!(
                out.is_none() && !wait && !resume && slurm_args.is_empty(),
                "--out, --wait, --resume and --slurm-arg go with --backend slurm"
            );
            let stop = ui::stop_on_ctrl_c();
            let pb = ui::bar(seeds, &format!("check {protocol}"));
            let report = mmulab_experiment::check::check_until(
                &protocol,
                start,
                seeds,
                &|n| pb.set_position(n),
                Some(&stop),
            );
            pb.finish_and_clear();
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "protocol {}: {} seeds ({}..{}), {} translation uses checked, {} shootdown interrupts, {:.1} s{}",
                    report.protocol,
                    report.seeds,
                    report.start,
                    report.start + seeds - 1,
                    report.checked_uses,
                    report.shootdowns,
                    report.wall_s,
                    if report.interrupted {
                        " (stopped by Ctrl-C)"
                    } else {
                        ""
                    }
                );
                println!(
                    "violations: {} (in {} seeds; {} of them lock-order); liveness failures: {}; runs that hit the time limit: {}",
                    report.violations,
                    report.seeds_with_violations,
                    report.lock_order_violations,
                    report.liveness_failures,
                    report.timeouts
                );
                if let Some(f) = &report.first_failing {
                    println!("first failing seed: {}", f.seed);
                    if let Some(v) = &f.first_violation {
                        println!("  {v}");
                    }
                    if let Some(l) = &f.liveness {
                        println!("  liveness: {l}");
                    }
                    println!("  replay: {}", f.replay);
                }
            }
            Ok(verdict(report.passed()))
        }
        Command::Bench {
            runs,
            refs_per_thread,
            workload,
            stride,
            json,
            compare,
            budget,
        } => {
            let sets = vec![
                format!("workload.refs_per_thread={refs_per_thread}"),
                format!("workload.stride_bytes={stride}"),
                format!("runs={runs}"),
            ];
            let (text, about) = match workload {
                BenchWorkload::Foundation => (
                    mmulab_experiment::bench::foundation_spec(),
                    "bench: 16 CPUs, 16 threads of one task, 256 private + 64 shared pages each, mprotect every 100,000 refs, protocol global, oracle on",
                ),
                BenchWorkload::Unitd => (
                    mmulab_experiment::bench::unitd_spec(),
                    "bench on x86-simics-2010: 16 cores, L1/L2 MOSI directory, PCAMs and Jetty, MOSI checker and oracle on, protocol unitd, mprotect every 100,000 refs",
                ),
            };
            let mut spec = Spec::parse(&text, &sets, "bench")?;
            // The budget covers all runs; each run below is one seed.
            spec.check_budget(&budget.budget())?;
            spec.runs = 1;
            let about = format!("{about}, {stride}-byte stride");
            // The name `--workload` takes, as `--json` and `--compare` files
            // spell it.
            let workload = workload
                .to_possible_value()
                .expect("every BenchWorkload has a name")
                .get_name()
                .to_string();
            // Read before the runs, so that a bad file costs no time.
            let reference = match &compare {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("bench --compare {path}"))?;
                    Some(mmulab_experiment::bench::read_reference(
                        path, &text, &workload, stride,
                    )?)
                }
                None => None,
            };
            let stop = ui::stop_on_ctrl_c();
            let mut rates = Vec::new();
            let mut memory = None;
            let pb = ui::bar(runs, "bench");
            for i in 0..runs {
                let r = mmulab_experiment::run::run_spec_until(&spec, |_, _| {}, Some(&stop))?;
                if r.interrupted {
                    break;
                }
                if r.oracle.violations != 0 {
                    pb.finish_and_clear();
                    eprintln!("mmulab: bench run {i} reported oracle violations");
                    return Ok(ExitCode::from(1));
                }
                rates.push(r.host.refs_per_second);
                memory = bench_memory(&r, spec.machine.cpus);
                pb.set_position(i + 1);
            }
            pb.finish_and_clear();
            if rates.is_empty() {
                return Ok(verdict(false));
            }
            let median = mmulab_engine::stats::summarize(&rates).median;
            let compared = match (&compare, &reference) {
                (Some(path), Some(r)) => serde_json::json!({
                    "file": path,
                    "refs_per_second": r.refs_per_second,
                    "ratio": median / r.refs_per_second,
                }),
                _ => serde_json::Value::Null,
            };
            let out = serde_json::json!({
                "refs_per_second": median,
                "samples": rates,
                "runs": rates.len(),
                "workload": about,
                "workload_kind": workload,
                "stride_bytes": stride,
                "machine": mmulab_experiment::run::machine_description(),
                "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
                "memory": memory,
                "compare": compared,
            });
            if json {
                println!("{out}");
            } else {
                let n = rates.len();
                println!(
                    "{:.1} M simulated references per second (median of {n} run{}, {stride}-byte stride)",
                    median / 1e6,
                    if n == 1 { "" } else { "s" }
                );
                if let (Some(path), Some(r)) = (&compare, &reference) {
                    println!(
                        "{:.2}x {path} ({:.1} M/s there; above 1 is faster)",
                        median / r.refs_per_second,
                        r.refs_per_second / 1e6
                    );
                }
                if let Some(m) = &memory {
                    println!(
                        "references: {:.1}% hit L1D, {:.1}% of L2 lookups hit, {:.0} simulated cycles each",
                        m["l1d_hit_pct"].as_f64().unwrap_or(0.0),
                        m["l2_hit_pct"].as_f64().unwrap_or(0.0),
                        m["simulated_cycles_per_ref"].as_f64().unwrap_or(0.0),
                    );
                }
            }
            Ok(verdict(true))
        }
        Command::Reproduce {
            paper,
            out,
            quick,
            experiments,
            markdown,
            json,
            backend,
            slurm_args,
        } => {
            let ok = reproduce_cmd::run(reproduce_cmd::Args {
                paper,
                out,
                quick,
                experiments,
                markdown,
                json,
                backend,
                slurm_args,
            })?;
            Ok(verdict(ok))
        }
        Command::Host(HostCommand::Shootdown {
            threads,
            op,
            pages,
            reps,
            json,
            calibration_out,
        }) => {
            let mut opts = mmulab_host::ShootdownOptions::default();
            if let Some(t) = threads {
                opts.threads = mmulab_host::parse_thread_list(&t).map_err(|e| {
                    mmulab_experiment::SpecError::Invalid(format!("--threads: {e}"))
                })?;
            }
            opts.op = op.op();
            opts.pages = pages;
            opts.reps = reps;
            opts.validate()?;
            let stop = ui::stop_on_ctrl_c();
            let pb = ui::bar(1, "host shootdown");
            let report = mmulab_host::run_shootdown_until(
                &opts,
                &mut |p| match p {
                    mmulab_host::Progress::Plan { total_reps, .. } => pb.set_length(total_reps),
                    mmulab_host::Progress::Rep { done, .. } => pb.set_position(done),
                    mmulab_host::Progress::Point { threads, op, .. } => {
                        pb.set_message(format!("{op}, {threads} responder(s)"))
                    }
                    mmulab_host::Progress::Note(n) if json && !ui::quiet() => {
                        pb.println(format!("note: {n}"))
                    }
                    _ => {}
                },
                Some(&stop),
            );
            pb.finish_and_clear();
            let report = host_stopped(report)?;
            // A report cut short by Ctrl-C is printed, but no calibration
            // is written from it.
            if let Some(path) = calibration_out.as_ref().filter(|_| !ui::stopped()) {
                std::fs::write(path, mmulab_host::preset_components(&report).to_toml())
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", mmulab_host::format_report(&report));
            }
            Ok(verdict(report.consistent()))
        }
        Command::Host(HostCommand::Preset {
            threads,
            reps,
            out,
            json,
        }) => {
            let mut opts = mmulab_host::ShootdownOptions::default();
            if let Some(t) = threads {
                opts.threads = mmulab_host::parse_thread_list(&t).map_err(|e| {
                    mmulab_experiment::SpecError::Invalid(format!("--threads: {e}"))
                })?;
            }
            opts.reps = reps;
            opts.validate()?;
            let stop = ui::stop_on_ctrl_c();
            let pb = ui::bar(1, "host preset: measuring");
            let report = mmulab_host::run_shootdown_until(
                &opts,
                &mut |p| match p {
                    mmulab_host::Progress::Plan { total_reps, .. } => pb.set_length(total_reps),
                    mmulab_host::Progress::Rep { done, .. } => pb.set_position(done),
                    _ => {}
                },
                Some(&stop),
            );
            pb.finish_and_clear();
            let report = host_stopped(report)?;
            if ui::stopped() {
                // No preset from a measurement cut short: the points
                // measured are printed, and nothing is written.
                if json {
                    println!("{}", report.to_json());
                } else {
                    print!("{}", mmulab_host::format_report(&report));
                }
                ui::note(format!("mmulab: {} was not written", out.display()));
                return Ok(verdict(true));
            }
            let cal = mmulab_host::preset_components(&report);
            let fit = cal.fit.ok_or_else(|| {
                anyhow::anyhow!(
                    "no responder count could be measured: the host needs at least two usable cores"
                )
            })?;
            let cores = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2);
            let m = mmulab_experiment::host_preset::Measured {
                baseline_ns: cal.baseline_ns,
                intercept_ns: fit.intercept_ns,
                slope_ns: fit.slope_ns,
                cores,
            };
            let env = mmulab_host::format_report(&report)
                .lines()
                .find(|l| l.starts_with("environment:"))
                .unwrap_or("")
                .to_string();
            std::fs::write(&out, mmulab_experiment::host_preset::preset_text(&m, &env))
                .with_context(|| format!("writing {}", out.display()))?;
            let measured: Vec<(usize, f64)> = cal
                .points
                .iter()
                .filter(|p| p.responders > 0)
                .map(|p| (p.responders, p.median_ns))
                .collect();
            let ks: Vec<usize> = measured.iter().map(|p| p.0).collect();
            let predicted =
                mmulab_experiment::host_preset::predict(&out.display().to_string(), &ks)?;
            let mut worst: f64 = 0.0;
            let mut points = Vec::new();
            let mut t = Table::new(&[
                "responders",
                "measured median ns",
                "simulated ns",
                "error %",
            ]);
            for ((k, meas), (_, sim)) in measured.iter().zip(&predicted) {
                let err = (sim - meas) / meas * 100.0;
                worst = worst.max(err.abs());
                t.row(vec![
                    k.to_string(),
                    format!("{meas:.0}"),
                    format!("{sim:.0}"),
                    format!("{err:+.1}"),
                ]);
                points.push(serde_json::json!({
                    "responders": k,
                    "measured_ns": meas,
                    "simulated_ns": sim,
                    "error_pct": err,
                }));
            }
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "preset": out.display().to_string(),
                        "points": points,
                        "worst_error_pct": worst,
                        "target_pct": 20.0,
                    })
                );
            } else {
                println!(
                    "wrote {} (use it with --set preset={})",
                    out.display(),
                    out.display()
                );
                print!("{}", t.render());
                println!("largest prediction error {worst:.1}% (target: within 20%)");
                if measured.len() < 2 {
                    println!(
                        "note: one responder count only, so the preset was fitted from the very point it predicts; run on a machine with more cores for a real test of the line"
                    );
                }
            }
            Ok(verdict(worst <= 20.0))
        }
        Command::Sweep(a) => sweep_cmd::run(a),
        Command::Trace(t) => trace_cmd::run(t),
        Command::Dsm(DsmCommand::Run { config, site, argv }) => {
            let code = mmulab_mirage::runtime::cli::run_program(
                &config,
                site.as_deref(),
                &argv,
                &mut |m| eprintln!("{m}"),
            )
            .map_err(|e| mmulab_experiment::SpecError::Invalid(e.to_string()))?;
            Ok(ExitCode::from(code.clamp(0, 255) as u8))
        }
        Command::Dsm(DsmCommand::Status { config, site, json }) => {
            let status = mmulab_mirage::runtime::cli::status(&config, site.as_deref())
                .map_err(|e| mmulab_experiment::SpecError::Invalid(e.to_string()))?;
            if json {
                // The daemon's status as it sent it: named fields
                // (runtime::status::SiteStatus).
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", status.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Dsm(DsmCommand::Site { config, name }) => {
            // The daemon runs until SIGINT/SIGTERM (caught by run_site).
            static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            mmulab_mirage::runtime::cli::run_site(&config, &name, &STOP, &mut |m| eprintln!("{m}"))
                .map_err(|e| mmulab_experiment::SpecError::Invalid(e.to_string()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Dsm(DsmCommand::Keygen { out }) => {
            let line = mmulab_mirage::runtime::cli::keygen(&out)
                .map_err(|e| mmulab_experiment::SpecError::Invalid(e.to_string()))?;
            eprintln!("{line}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Dsm(DsmCommand::Proxy {
            listen,
            to,
            delay,
            drop,
            cut_after,
            seed,
        }) => {
            let faults = mmulab_mirage::runtime::proxy::Faults {
                delay: std::time::Duration::from_millis(delay),
                drop,
                cut_after,
                seed,
            };
            static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            mmulab_mirage::runtime::cli::run_proxy(listen, to, faults, &STOP, &mut |m| {
                eprintln!("{m}")
            })
            .map_err(|e| mmulab_experiment::SpecError::Invalid(e.to_string()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Dsm(DsmCommand::BenchSite { job }) => {
            match mmulab_mirage::runtime::sweep::site_main(&job) {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) => {
                    eprintln!("dsm bench-site: {e}");
                    Ok(ExitCode::from(2))
                }
            }
        }
        Command::Dsm(DsmCommand::Bench { quick, json }) => {
            // The sweep reports no steps: a spinner with the time so far.
            let spin = ui::Spinner::new("dsm bench: remote faults and Δ sweeps");
            // Ctrl-C: the bench stops at its next fault or sweep point and
            // reports what it measured (exit 130).
            let stop = ui::stop_on_ctrl_c();
            let report = mmulab_mirage::runtime::cli::run_bench_until(quick, &stop);
            spin.finish();
            let report = match report {
                Err(mmulab_mirage::runtime::bench::BenchError::Interrupted) => {
                    eprintln!(
                        "mmulab: stopped by Ctrl-C before a remote fault was timed; nothing to report"
                    );
                    return Ok(ExitCode::from(130));
                }
                r => r?,
            };
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.render());
            }
            if ui::stopped() {
                eprintln!(
                    "mmulab: dsm bench stopped by Ctrl-C: {} remote faults timed, {} ping-pong and {} read-writer points measured (the shapes judge only these)",
                    report.faults_timed,
                    report.pingpong.len(),
                    report.read_writers.len()
                );
                return Ok(ExitCode::from(130));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::List { json } => {
            list(json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "mmulab", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `mmulab list`: tables wrapped to the terminal (100 columns off one), or
/// JSON.
fn list(json: bool) {
    let mut presets = Vec::new();
    for p in mmulab_experiment::preset::all() {
        presets.push((p.name, p.about, p.source));
    }
    for (name, about, source) in mmulab_experiment::reproduce::uhlig94::presets() {
        presets.push((name, about, source));
    }
    if json {
        let v = serde_json::json!({
            "presets": presets
                .iter()
                .map(|(n, a, s)| serde_json::json!({"name": n, "models": a, "inputs_from": s}))
                .collect::<Vec<_>>(),
            "protocols": mmulab_protocols::REGISTRY
                .iter()
                .map(|e| serde_json::json!({
                    "name": e.name,
                    "about": e.about,
                    "negative_control": e.negative_control,
                }))
                .collect::<Vec<_>>(),
            "workloads": mmulab_workloads::WorkloadSpec::names()
                .iter()
                .map(|(n, a)| serde_json::json!({"name": n, "about": a}))
                .collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return;
    }
    let width = ui::width();
    let mut t = Table::new(&["preset", "models", "inputs from"]);
    for (n, a, s) in presets {
        t.row(vec![n, a, s]);
    }
    print!("{}", t.render_width(width));
    println!();
    let mut t = Table::new(&["protocol", "what it is"]);
    for e in mmulab_protocols::REGISTRY {
        let about = if e.negative_control {
            format!("{} [negative control]", e.about)
        } else {
            e.about.to_string()
        };
        t.row(vec![e.name.to_string(), about]);
    }
    print!("{}", t.render_width(width));
    println!();
    let mut t = Table::new(&["workload", "what it runs"]);
    for (n, a) in mmulab_workloads::WorkloadSpec::names() {
        t.row(vec![n.to_string(), a.to_string()]);
    }
    print!("{}", t.render_width(width));
}

/// What the memory system did in a bench run (None on flat memory): a
/// refs/s figure means little without the hit rates behind it.
fn bench_memory(r: &Results, cpus: usize) -> Option<serde_json::Value> {
    let c = &r.counters;
    let (l1h, l1m) = (c.get("mem.l1d_hits"), c.get("mem.l1d_misses"));
    if l1h + l1m == 0 {
        return None;
    }
    let (l2h, l2m) = (c.get("mem.l2_hits"), c.get("mem.l2_misses"));
    let pct = |a: u64, b: u64| 100.0 * a as f64 / (a + b).max(1) as f64;
    Some(serde_json::json!({
        "l1d_hit_pct": pct(l1h, l1m),
        "l2_hit_pct": pct(l2h, l2m),
        // each CPU's share of the run per reference it made
        "simulated_cycles_per_ref": (r.simulated_cycles * cpus as u64) as f64 / c.get("refs").max(1) as f64,
    }))
}

fn summary(spec: &Spec, r: &Results) -> String {
    let clock = mmulab_engine::Clock::new(spec.costs.clock_hz);
    let mut out = String::new();
    out.push_str(&format!(
        "mmulab run: protocol {}, preset {}, {} CPUs, workload {}, seed {}, {} run(s)\n",
        spec.protocol, spec.preset, spec.machine.cpus, r.workload.name, r.seed, r.runs
    ));
    out.push_str(&format!(
        "simulated {:.1} µs ({} cycles at {:.1} MHz); {} references in {:.3} s wall ({:.1} M refs/s)\n\n",
        clock.to_us(mmulab_engine::Cycles(r.simulated_cycles)),
        r.simulated_cycles,
        spec.costs.clock_hz / 1e6,
        r.counters.get("refs"),
        r.host.wall_s,
        r.host.refs_per_second / 1e6
    ));
    let mut t = Table::new(&["histogram", "n", "mean ± sd", "median", "p10", "p90"]);
    for (name, s) in r.histograms.iter().filter(|(n, _)| n.ends_with("_us")) {
        t.row(vec![
            name.clone(),
            s.n.to_string(),
            format!("{:.1} ± {:.1}", s.mean, s.sd),
            format!("{:.1}", s.median),
            format!("{:.1}", s.p10),
            format!("{:.1}", s.p90),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let mut t = Table::new(&["counter", "value"]);
    for (k, v) in &r.counters.0 {
        t.row(vec![k.clone(), v.to_string()]);
    }
    out.push_str(&t.render());
    out.push('\n');
    let mut t = Table::new(&["check", "verdict", "detail"]);
    t.row(vec![
        "oracle".into(),
        r.oracle.verdict.clone(),
        format!(
            "{} violations in {} checked translation uses",
            r.oracle.violations, r.oracle.checked_uses
        ),
    ]);
    t.row(vec![
        "workload".into(),
        r.workload.verdict.clone(),
        r.workload.notes.join("; "),
    ]);
    if !r.liveness.is_empty() {
        let l = &r.liveness[0];
        t.row(vec![
            "watchdog".into(),
            "liveness failure".into(),
            format!(
                "seed {}: {} waiting for {}",
                l.seed, l.failure.cpu, l.failure.waiting_for
            ),
        ]);
    }
    out.push_str(&t.render());
    for v in r.oracle.first.iter().take(3) {
        out.push_str(&format!(
            "  violation: {} thread {} {} {:#x} at {} after `{}` by {} completed at {:?}\n",
            v.cpu,
            v.thread,
            if v.store { "stored to" } else { "loaded" },
            v.va,
            v.time,
            v.op,
            v.op_cpu,
            v.op_completed
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument of every command says what it is (SPEC, --protocol,
    /// --seeds, --entries, --page-size, -o and --max had no help text).
    #[test]
    fn every_argument_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.trim().is_empty() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {} (the command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "mmulab", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    /// One output-flag convention (docs/cli.md): `--out DIR` writes a
    /// folder, `-o/--output FILE` one file, on every command (`dsm keygen
    /// --out FILE`, `trace capture -o` without a long name, and `host
    /// preset -o/--output` disagreed).
    #[test]
    fn output_flags_follow_one_convention() {
        fn walk(cmd: &clap::Command, path: &str, wrong: &mut Vec<String>, files: &mut usize) {
            for a in cmd.get_arguments() {
                let long = a.get_long();
                let names: Vec<String> = a
                    .get_value_names()
                    .unwrap_or_default()
                    .iter()
                    .map(|n| n.to_string())
                    .collect();
                let id = a.get_id().as_str();
                if a.get_short() == Some('o') || long == Some("output") {
                    *files += 1;
                    if a.get_short() != Some('o') || long != Some("output") || names != ["FILE"] {
                        wrong.push(format!("{path} {id}: -o/--output FILE"));
                    }
                }
                if long == Some("out") && names != ["DIR"] {
                    wrong.push(format!("{path} {id}: --out takes a DIR, not {names:?}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), wrong, files);
            }
        }
        let (mut wrong, mut files) = (Vec::new(), 0);
        walk(&Cli::command(), "mmulab", &mut wrong, &mut files);
        assert!(wrong.is_empty(), "{wrong:#?}");
        assert_eq!(files, 5, "capture, convert, export, keygen, host preset");
    }

    /// Closed sets are clap value enums: their choices are listed and a
    /// wrong one is a usage error (exit 2), not a runtime one.
    #[test]
    fn closed_sets_list_their_choices() {
        let cli = Cli::command();
        for (path, arg) in [
            (&["bench"][..], "workload"),
            (&["check"], "protocol"),
            (&["reproduce"], "paper"),
            (&["host", "shootdown"], "op"),
            (&["trace", "sim"], "policy"),
            (&["trace", "export"], "format"),
            (&["completions"], "shell"),
        ] {
            let mut cmd = &cli;
            for p in path {
                cmd = cmd.find_subcommand(p).expect("command");
            }
            let a = cmd
                .get_arguments()
                .find(|a| a.get_id() == arg)
                .expect("argument");
            assert!(
                a.get_possible_values().len() >= 2,
                "{path:?} --{arg} lists no choices"
            );
        }
        Cli::command().debug_assert();
    }
}
