//! The `mmulab` command: parse, build, run, print. Nothing else lives here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use mmulab_experiment::{Results, Spec};
use mmulab_report::Table;

mod reproduce_cmd;
mod sweep_cmd;
mod trace_cmd;

#[derive(Parser)]
#[command(
    name = "mmulab",
    version,
    about = "Translation coherence toolkit: TLB shootdown, HAT layers, UNITD, software-managed TLBs, Mirage DSM"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an experiment spec and print its summary.
    Run {
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
    },
    /// Randomized correctness sweep: many seeds of a random workload under a
    /// protocol, every translation checked by the oracle.
    Check {
        #[arg(long)]
        protocol: String,
        #[arg(long, default_value_t = 1000)]
        seeds: u64,
        /// First seed.
        #[arg(long, default_value_t = 1)]
        start: u64,
        #[arg(long)]
        json: bool,
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
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// References per thread (the fixed workload uses 2,000,000).
        #[arg(long, default_value_t = 2_000_000)]
        refs_per_thread: u64,
        /// `foundation`: flat memory, protocol global; `unitd`: the same
        /// workload on preset x86-simics-2010 (caches, directory, MOSI
        /// checker), protocol unitd.
        #[arg(long, default_value = "foundation")]
        workload: String,
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
    List,
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
    /// routes its shmget/shmat/shmdt/shmctl to the site's daemon.
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
        #[arg(long, default_value = "cluster.toml")]
        config: PathBuf,
        /// The site to ask (default: the first).
        #[arg(long)]
        site: Option<String>,
    },
    /// Remote-fault latency against the loopback limit (two sites in this
    /// process), ping-pong and read-writer Δ sweeps (one process per site,
    /// each pinned to a core).
    Bench {
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write a new cluster key (256 random bits, mode 0600) for
    /// cluster.toml's `key_file`; never overwrites a file.
    Keygen {
        #[arg(short = 'o', long = "out", value_name = "FILE")]
        out: PathBuf,
    },
    /// A TCP proxy that injects faults between sites (delay, loss, cuts),
    /// for testing a cluster under a bad network.
    Proxy {
        #[arg(long, value_name = "ADDR")]
        listen: std::net::SocketAddr,
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
        /// mprotect (read-write to read-only), munmap or madvise (MADV_DONTNEED).
        #[arg(long, default_value = "mprotect")]
        op: String,
        /// Pages per operation.
        #[arg(long, default_value_t = 1)]
        pages: usize,
        /// Timed repetitions per point.
        #[arg(long, default_value_t = 100)]
        reps: usize,
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
        #[arg(long)]
        threads: Option<String>,
        #[arg(long, default_value_t = 300)]
        reps: usize,
        /// Where to write the preset (use it with `--set preset=FILE`).
        #[arg(long, default_value = "host.toml")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mmulab: {e:#}");
            if e.downcast_ref::<mmulab_experiment::SpecError>().is_some()
                || e.downcast_ref::<trace_cmd::BadInput>().is_some()
                || e.downcast_ref::<mmulab_sweep::SweepError>()
                    .is_some_and(|e| e.is_bad_input())
            {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    // Only runs longer than a second show it; indicatif hides it when
    // stderr is not a terminal.
    pb.enable_steady_tick(std::time::Duration::from_millis(250));
    pb
}

fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Run {
            spec,
            sets,
            out,
            json,
        } => {
            let spec = Spec::load(&spec, &sets)?;
            let pb = bar(spec.runs, "running");
            let results = mmulab_experiment::run_spec(&spec, |i, _| pb.set_position(i))?;
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
            Ok(if consistent {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Check {
            protocol,
            seeds,
            start,
            json,
            backend,
            out,
            wait,
            resume,
            slurm_args,
        } => {
            if mmulab_protocols::find(&protocol).is_none() {
                return Err(mmulab_experiment::SpecError::Invalid(format!(
                    "--protocol: unknown protocol `{protocol}` (known: {})",
                    mmulab_protocols::names().join(", ")
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
            let pb = bar(seeds, &format!("check {protocol}"));
            let report =
                mmulab_experiment::check::check(&protocol, start, seeds, &|n| pb.set_position(n));
            pb.finish_and_clear();
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "protocol {}: {} seeds ({}..{}), {} translation uses checked, {} shootdown interrupts, {:.1} s",
                    report.protocol,
                    report.seeds,
                    report.start,
                    report.start + report.seeds - 1,
                    report.checked_uses,
                    report.shootdowns,
                    report.wall_s
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
            Ok(if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Bench {
            runs,
            refs_per_thread,
            workload,
            stride,
            json,
            compare,
        } => {
            let sets = vec![
                format!("workload.refs_per_thread={refs_per_thread}"),
                format!("workload.stride_bytes={stride}"),
            ];
            let (text, about) = match workload.as_str() {
                "foundation" => (
                    mmulab_experiment::bench::foundation_spec(),
                    "bench: 16 CPUs, 16 threads of one task, 256 private + 64 shared pages each, mprotect every 100,000 refs, protocol global, oracle on",
                ),
                "unitd" => (
                    mmulab_experiment::bench::unitd_spec(),
                    "bench on x86-simics-2010: 16 cores, L1/L2 MOSI directory, PCAMs and Jetty, MOSI checker and oracle on, protocol unitd, mprotect every 100,000 refs",
                ),
                other => anyhow::bail!(
                    "bench --workload: unknown workload `{other}` (foundation, unitd)"
                ),
            };
            let spec = Spec::parse(&text, &sets, "bench")?;
            let about = format!("{about}, {stride}-byte stride");
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
            let mut rates = Vec::new();
            let mut memory = None;
            let pb = bar(runs as u64, "bench");
            for i in 0..runs {
                let r = mmulab_experiment::run_spec(&spec, |_, _| {})?;
                anyhow::ensure!(
                    r.oracle.violations == 0,
                    "bench run {i} reported oracle violations"
                );
                rates.push(r.host.refs_per_second);
                memory = bench_memory(&r, spec.machine.cpus);
                pb.set_position(i as u64 + 1);
            }
            pb.finish_and_clear();
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
                "runs": runs,
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
                println!(
                    "{:.1} M simulated references per second (median of {runs} run{}, {stride}-byte stride)",
                    median / 1e6,
                    if runs == 1 { "" } else { "s" }
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
            Ok(ExitCode::SUCCESS)
        }
        Command::Reproduce {
            paper,
            out,
            quick,
            experiments,
            markdown,
        } => {
            let ok = reproduce_cmd::run(reproduce_cmd::Args {
                paper,
                out,
                quick,
                experiments,
                markdown,
            })?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
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
            opts.op = op
                .parse()
                .map_err(|e| mmulab_experiment::SpecError::Invalid(format!("--op: {e}")))?;
            anyhow::ensure!(
                pages > 0 && reps > 0,
                "--pages and --reps must be at least 1"
            );
            opts.pages = pages;
            opts.reps = reps;
            let pb = bar(1, "host shootdown");
            let report = mmulab_host::run_shootdown(&opts, &mut |p| match p {
                mmulab_host::Progress::Plan { total_reps, .. } => pb.set_length(total_reps),
                mmulab_host::Progress::Rep { done, .. } => pb.set_position(done),
                mmulab_host::Progress::Point { threads, op, .. } => {
                    pb.set_message(format!("{op}, {threads} responder(s)"))
                }
                mmulab_host::Progress::Note(n) if json => pb.println(format!("note: {n}")),
                _ => {}
            })?;
            pb.finish_and_clear();
            if let Some(path) = &calibration_out {
                std::fs::write(path, mmulab_host::preset_components(&report).to_toml())
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", mmulab_host::format_report(&report));
            }
            Ok(if report.consistent() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Host(HostCommand::Preset { threads, reps, out }) => {
            let mut opts = mmulab_host::ShootdownOptions::default();
            if let Some(t) = threads {
                opts.threads = mmulab_host::parse_thread_list(&t).map_err(|e| {
                    mmulab_experiment::SpecError::Invalid(format!("--threads: {e}"))
                })?;
            }
            opts.reps = reps.max(1);
            let pb = bar(1, "host preset: measuring");
            let report = mmulab_host::run_shootdown(&opts, &mut |p| match p {
                mmulab_host::Progress::Plan { total_reps, .. } => pb.set_length(total_reps),
                mmulab_host::Progress::Rep { done, .. } => pb.set_position(done),
                _ => {}
            })?;
            pb.finish_and_clear();
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
            println!(
                "wrote {} (use it with --set preset={})",
                out.display(),
                out.display()
            );
            let mut t = Table::new(&[
                "responders",
                "measured median ns",
                "simulated ns",
                "error %",
            ]);
            let mut worst: f64 = 0.0;
            for ((k, meas), (_, sim)) in measured.iter().zip(&predicted) {
                let err = (sim - meas) / meas * 100.0;
                worst = worst.max(err.abs());
                t.row(vec![
                    k.to_string(),
                    format!("{meas:.0}"),
                    format!("{sim:.0}"),
                    format!("{err:+.1}"),
                ]);
            }
            print!("{}", t.render());
            println!("largest prediction error {worst:.1}% (target: within 20%)");
            if measured.len() < 2 {
                println!(
                    "note: one responder count only, so the preset was fitted from the very point it predicts; run on a machine with more cores for a real test of the line"
                );
            }
            Ok(if worst <= 20.0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
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
        Command::Dsm(DsmCommand::Status { config, site }) => {
            let text = mmulab_mirage::runtime::cli::status(&config, site.as_deref())
                .map_err(|e| mmulab_experiment::SpecError::Invalid(e.to_string()))?;
            print!("{text}");
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
                    Ok(ExitCode::from(1))
                }
            }
        }
        Command::Dsm(DsmCommand::Bench { quick, json }) => {
            let report = mmulab_mirage::runtime::cli::run_bench(quick)?;
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::List => {
            let mut t = Table::new(&["preset", "models", "inputs from"]);
            for p in mmulab_experiment::preset::all() {
                t.row(vec![p.name, p.about, p.source]);
            }
            for (name, about, source) in mmulab_experiment::reproduce::uhlig94::presets() {
                t.row(vec![name, about, source]);
            }
            print!("{}", t.render());
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
            print!("{}", t.render());
            println!();
            let mut t = Table::new(&["workload", "what it runs"]);
            for (n, a) in mmulab_workloads::WorkloadSpec::names() {
                t.row(vec![n.to_string(), a.to_string()]);
            }
            print!("{}", t.render());
            Ok(ExitCode::SUCCESS)
        }
    }
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
