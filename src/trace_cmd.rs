//! `mmulab trace …`: memory traces (crates/trace). Parse, call, print.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};
use mmulab_trace::bench::{BenchOptions, Workload, bench};
use mmulab_trace::export::{ExportFormat, export};
use mmulab_trace::{ReadOptions, simulate, stack_sim};

use crate::ui;

/// Replacement policy of `trace sim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    Lru,
    Fifo,
    Random,
}

/// `trace sim --r2000 --os`: uhlig94's operating systems.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OsArg {
    Ultrix,
    Osf1,
    Mach3,
    Afsin,
    Afsout,
}

impl OsArg {
    fn key(self) -> &'static str {
        match self {
            OsArg::Ultrix => "ultrix",
            OsArg::Osf1 => "osf1",
            OsArg::Mach3 => "mach3",
            OsArg::Afsin => "afsin",
            OsArg::Afsout => "afsout",
        }
    }
}

/// Dinero IV input format written by `trace export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// `r|w|i ADDR SIZE` (dineroIV -informat D).
    Xdin,
    /// `0|1|2 ADDR SIZE` (dineroIV -informat d).
    Din,
}

/// How every trace reader reads its input.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ReadArgs {
    /// Keep the complete records of a truncated trace (a cut last line, a
    /// binary trace whose writer stopped) and warn.
    #[arg(long)]
    allow_truncated: bool,
    /// Skip malformed lines of a text trace (each named in the error
    /// otherwise) and say how many were skipped.
    #[arg(long)]
    lenient: bool,
}

impl ReadArgs {
    fn options(self) -> ReadOptions {
        ReadOptions {
            allow_truncated: self.allow_truncated,
            lenient: self.lenient,
        }
    }
}

const TRACE_HELP: &str = "The trace: a Valgrind lackey log, a Dinero din or xdin trace, or an mmulab binary trace; each may be gzip- or zstd-compressed (told by content, not name)";

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Simulate a unified TLB over a trace. Lists (`--entries 16,32 --ways
    /// 1,full --policy lru,fifo`) simulate every combination in one pass
    /// over the trace, one row each (JSON: an array of the one-configuration
    /// objects).
    Sim {
        #[arg(help = TRACE_HELP)]
        trace: PathBuf,
        /// TLB entries, or a comma-separated list.
        #[arg(long, value_delimiter = ',', default_value = "64")]
        entries: Vec<u32>,
        /// Associativity: a number or `full`, or a list; the default (and
        /// a number equal to --entries) is fully associative.
        #[arg(long, value_delimiter = ',')]
        ways: Vec<String>,
        /// Replacement policy, or a list.
        #[arg(long, value_enum, value_delimiter = ',', default_value = "lru")]
        policy: Vec<PolicyArg>,
        /// Page size in bytes (a power of two, 8 to 2^40).
        #[arg(long, default_value_t = 4096)]
        page_size: u64,
        /// Seed of the random policy.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        read: ReadArgs,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// uhlig94's R2000 instead: 64 entries (8 wired), the Random register, ASIDs; the
        /// trace's system calls go through an OS model; misses and cycles per Table III type.
        #[arg(long)]
        r2000: bool,
        /// With --r2000: the OS whose miss handlers and system calls run.
        #[arg(long, value_enum, default_value_t = OsArg::Ultrix, requires = "r2000")]
        os: OsArg,
    },
    /// Misses of every fully associative LRU size 1..=MAX in one pass
    /// (Mattson stack simulation).
    Stack {
        #[arg(help = TRACE_HELP)]
        trace: PathBuf,
        /// The largest TLB size reported (1 to 65536).
        #[arg(long, default_value_t = 512)]
        max: usize,
        /// Page size in bytes (a power of two, 8 to 2^40).
        #[arg(long, default_value_t = 4096)]
        page_size: u64,
        #[command(flatten)]
        read: ReadArgs,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command under Valgrind lackey and write a compact binary trace
    /// (one per process: FILE, FILE.PID…), parsing the logs as they are written.
    Capture {
        /// The binary trace of the command's own process.
        #[arg(
            short = 'o',
            long = "output",
            value_name = "FILE",
            default_value = "trace.mmutrace"
        )]
        out: PathBuf,
        /// Print the capture's summary as JSON.
        #[arg(long)]
        json: bool,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Convert a text trace (lackey, din or xdin; plain, gzip or zstd) to
    /// mmulab's compact binary trace. The output is written beside FILE and
    /// renamed over it when complete: converting a file onto itself is
    /// safe, and a failed conversion leaves nothing behind.
    Convert {
        /// The text trace.
        log: PathBuf,
        /// The binary trace to write.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        out: PathBuf,
        /// The binary trace's base page size in bytes.
        #[arg(long, default_value_t = 4096)]
        page_size: u64,
        #[command(flatten)]
        read: ReadArgs,
        /// Print the binary trace's summary as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write exactly the references simulated (page-crossing accesses split,
    /// M as a load then a store) for Dinero IV.
    Export {
        #[arg(help = TRACE_HELP)]
        trace: PathBuf,
        /// The Dinero IV input format.
        #[arg(long, value_enum, default_value_t = FormatArg::Xdin)]
        format: FormatArg,
        /// Page size in bytes at which accesses are split.
        #[arg(long, default_value_t = 4096)]
        page_size: u64,
        /// Write to FILE (written beside it and renamed when complete)
        /// instead of stdout.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Decode, binary read, Mattson and sweep rates on this host.
    Bench {
        /// A lackey log to measure on (default: capture gzip under Valgrind,
        /// or a synthetic log when that fails).
        log: Option<PathBuf>,
        /// Print the report as JSON (every run, wall and CPU medians)
        /// instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// A trace error as an anyhow error; every one exits 2 (`main`).
fn err(e: mmulab_trace::TraceError) -> anyhow::Error {
    anyhow::Error::new(e)
}

fn warn_all(warnings: &[String]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// Runs a trace command.
pub fn run(cmd: TraceCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TraceCommand::Sim {
            trace,
            entries,
            ways,
            policy,
            page_size,
            seed,
            read,
            json,
            r2000,
            os,
        } => {
            if r2000 {
                return r2000_sim(&trace, os, seed, json);
            }
            let ways = if ways.is_empty() {
                vec![None]
            } else {
                ways.iter()
                    .map(|w| mmulab_trace::parse_ways(w))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(err)?
            };
            let policies = policy
                .iter()
                .map(|p| match p {
                    PolicyArg::Lru => mmulab_trace::Policy::Lru,
                    PolicyArg::Fifo => mmulab_trace::Policy::Fifo,
                    PolicyArg::Random => mmulab_trace::Policy::Random,
                })
                .collect::<Vec<_>>();
            let configs =
                mmulab_trace::grid(&entries, &ways, &policies, page_size, seed).map_err(err)?;
            let read = read.options();
            let spin = ui::Spinner::new(&format!("trace sim: reading {}", trace.display()));
            // One configuration keeps the one-configuration path and output.
            let rs = match configs.as_slice() {
                [o] => simulate(&trace, o, &read).map(|r| vec![r]),
                _ => mmulab_trace::sweep(&trace, &configs, &read),
            };
            spin.finish();
            let rs = rs.map_err(err)?;
            // Every configuration read the same records: warn once.
            warn_all(rs.first().map_or(&[][..], |r| &r.warnings[..]));
            if json {
                match rs.as_slice() {
                    [r] => println!("{}", serde_json::to_string(r)?),
                    _ => println!("{}", serde_json::to_string(&rs)?),
                }
            } else {
                for r in &rs {
                    println!(
                        "{} entries, {}-way, {}, {}-byte pages: {} refs, {} misses ({:.4}%)",
                        r.entries,
                        r.ways,
                        r.policy,
                        r.page_size,
                        r.refs,
                        r.misses,
                        100.0 * r.miss_rate
                    );
                }
            }
        }
        TraceCommand::Stack {
            trace,
            max,
            page_size,
            read,
            json,
        } => {
            let spin = ui::Spinner::new(&format!("trace stack: reading {}", trace.display()));
            let r = stack_sim(&trace, page_size, max, &read.options());
            spin.finish();
            let r = r.map_err(err)?;
            warn_all(&r.warnings);
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("entries\tmisses");
                for n in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
                    .into_iter()
                    .filter(|&n| n <= max)
                {
                    println!("{n}\t{}", r.misses_at(n));
                }
            }
        }
        TraceCommand::Capture { out, json, command } => {
            // Ctrl-C at a terminal reaches Valgrind too (one process
            // group): the command ends, and what it traced until then is
            // parsed and kept (exit 130), as after any exit of the command.
            ui::stop_on_ctrl_c();
            let spin = ui::Spinner::new(&format!("capturing {}", command.join(" ")));
            let s = mmulab_trace::capture::capture(&out, &command);
            spin.finish();
            let s = s.map_err(err)?;
            warn_all(&s.warnings);
            if ui::stopped() {
                eprintln!(
                    "mmulab: capture stopped by Ctrl-C: the traces cover the command until then"
                );
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!(
                    "{:?} exited with {:?} after {:.1} s",
                    s.command.join(" "),
                    s.exit_code,
                    s.wall_seconds
                );
                for p in &s.processes {
                    println!(
                        "pid {}: wrote {} ({} page references, {} syscalls, {} bytes)",
                        p.pid,
                        p.trace.display(),
                        p.page_refs,
                        p.syscalls,
                        p.trace_bytes
                    );
                }
            }
            if ui::stopped() {
                return Ok(ExitCode::from(130));
            }
        }
        TraceCommand::Convert {
            log,
            out,
            page_size,
            read,
            json,
        } => {
            let shift = mmulab_trace::page_shift(page_size).map_err(err)?;
            let spin = ui::Spinner::new(&format!("trace convert: reading {}", log.display()));
            let r = mmulab_trace::binary::convert(&log, &out, shift, 0, &read.options());
            spin.finish();
            let (summary, warnings) = r.map_err(err)?;
            warn_all(&warnings);
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                println!(
                    "wrote {}: {} page references, {} syscalls, {} bytes",
                    out.display(),
                    summary.header.access_count,
                    summary.header.syscall_count,
                    summary.bytes
                );
            }
        }
        TraceCommand::Export {
            trace,
            format,
            page_size,
            out,
            read,
        } => {
            let format = match format {
                FormatArg::Xdin => ExportFormat::Xdin,
                FormatArg::Din => ExportFormat::Din,
            };
            // A terminal's spinner on stderr; the references go to stdout
            // or -o.
            let spin = ui::Spinner::new(&format!("trace export: reading {}", trace.display()));
            let warnings = match &out {
                None => {
                    let stdout = std::io::stdout();
                    let mut w = std::io::BufWriter::new(stdout.lock());
                    export(&trace, page_size, format, &read.options(), &mut w)
                        .map_err(err)?
                        .1
                }
                Some(path) => {
                    let staged = mmulab_trace::binary::Staged::new(path);
                    let file = std::fs::File::create(staged.path())
                        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                    let mut w = std::io::BufWriter::new(file);
                    let (_, warnings) =
                        export(&trace, page_size, format, &read.options(), &mut w).map_err(err)?;
                    w.into_inner()
                        .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.error()))?;
                    staged.commit().map_err(err)?;
                    warnings
                }
            };
            spin.finish();
            warn_all(&warnings);
        }
        TraceCommand::Bench { log, json } => {
            let mut o = BenchOptions::default();
            if let Some(p) = log {
                o.workload = Workload::Lackey(p);
            }
            let spin = ui::Spinner::new("trace bench");
            let r = bench(&o);
            spin.finish();
            let r = r.map_err(err)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "trace bench: {}; {} page references ({} bytes of log, {} of binary trace)",
                    r.workload, r.refs, r.lackey_bytes, r.binary_bytes
                );
                let mut t = mmulab_report::Table::new(&[
                    "rate",
                    "median (wall)",
                    "median (CPU)",
                    "unit",
                    "target (CPU)",
                    "meets",
                ]);
                for (name, rate) in [
                    ("lackey decode", &r.decode),
                    ("binary read", &r.binary_read),
                    ("Mattson pass", &r.mattson),
                    ("sweep", &r.sweep),
                    ("Mattson from the binary file", &r.mattson_from_binary_file),
                ] {
                    t.row(vec![
                        name.to_string(),
                        format!("{:.1}", rate.median),
                        format!("{:.1}", rate.median_cpu),
                        rate.unit.to_string(),
                        format!("{:.1}", rate.target),
                        if rate.meets_target { "yes" } else { "no" }.to_string(),
                    ]);
                }
                print!("{}", t.render());
                println!(
                    "sweep: {} configurations; misses of a 64-entry fully associative LRU TLB: {}",
                    r.sweep_configs, r.misses_64_full_lru
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `trace sim --r2000`: uhlig94's trap-driven R2000 over the trace and its system calls.
fn r2000_sim(
    trace: &std::path::Path,
    os: OsArg,
    seed: u64,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use mmulab_swtlb::os::OsKind as R2000Os;
    use mmulab_swtlb::r2000;
    let os = R2000Os::from_key(os.key()).expect("every --os value is an OS");
    let spin = ui::Spinner::new(&format!("trace sim --r2000: reading {}", trace.display()));
    let o = r2000::simulate_trace(trace, os, &r2000::R2000Config::default(), seed);
    spin.finish();
    let o = o.map_err(|e| anyhow::anyhow!(e))?;
    if json {
        println!("{}", serde_json::to_string(&o)?);
    } else {
        print!("{}", r2000::report_text(&o));
    }
    Ok(ExitCode::SUCCESS)
}
