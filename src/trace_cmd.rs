//! `mmulab trace …`: memory traces (crates/trace). Parse, call, print.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use mmulab_trace::bench::{BenchOptions, Workload, bench};
use mmulab_trace::export::{ExportFormat, export};
use mmulab_trace::{ReadOptions, simulate, stack_sim};

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Simulate a unified TLB over a trace (Valgrind lackey log or mmulab
    /// binary trace). Lists (`--entries 16,32 --ways 1,full --policy
    /// lru,fifo`) simulate every combination in one pass over the trace,
    /// one row each (JSON: an array of the one-configuration objects).
    Sim {
        trace: PathBuf,
        /// Entries, or a comma-separated list.
        #[arg(long, value_delimiter = ',', default_value = "64")]
        entries: Vec<u32>,
        /// Associativity: a number or `full`, or a list; the default (and
        /// a number equal to --entries) is fully associative.
        #[arg(long, value_delimiter = ',')]
        ways: Vec<String>,
        /// lru, fifo or random, or a list.
        #[arg(long, value_delimiter = ',', default_value = "lru")]
        policy: Vec<String>,
        #[arg(long, default_value_t = 4096)]
        page_size: u64,
        /// Seed of the random policy.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Keep the complete records of a truncated trace and warn.
        #[arg(long)]
        allow_truncated: bool,
        #[arg(long)]
        json: bool,
        /// uhlig94's R2000 instead: 64 entries (8 wired), the Random register, ASIDs; the
        /// trace's system calls go through an OS model; misses and cycles per Table III type.
        #[arg(long)]
        r2000: bool,
        /// With --r2000: ultrix, osf1, mach3, afsin or afsout.
        #[arg(long, default_value = "ultrix", requires = "r2000")]
        os: String,
    },
    /// Misses of every fully associative LRU size 1..=MAX in one pass
    /// (Mattson stack simulation).
    Stack {
        trace: PathBuf,
        #[arg(long, default_value_t = 512)]
        max: usize,
        #[arg(long, default_value_t = 4096)]
        page_size: u64,
        #[arg(long)]
        allow_truncated: bool,
        #[arg(long)]
        json: bool,
    },
    /// Run a command under Valgrind lackey and write a compact binary trace
    /// (one per process: F, F.PID…), parsing the logs as they are written.
    Capture {
        #[arg(short = 'o', default_value = "trace.mmutrace")]
        out: PathBuf,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Convert a lackey log to mmulab's compact binary trace.
    Convert {
        log: PathBuf,
        #[arg(short = 'o')]
        out: PathBuf,
        #[arg(long, default_value_t = 4096)]
        page_size: u64,
        #[arg(long)]
        allow_truncated: bool,
    },
    /// Write exactly the references simulated (page-crossing accesses split,
    /// M as a load then a store) for Dinero IV.
    Export {
        trace: PathBuf,
        /// xdin (r|w|i ADDR SIZE; dineroIV -informat D) or din (0|1|2 ADDR SIZE).
        #[arg(long, default_value = "xdin")]
        format: String,
        #[arg(long, default_value_t = 4096)]
        page_size: u64,
        #[arg(long)]
        allow_truncated: bool,
    },
    /// Decode, binary read, Mattson and sweep rates on this host.
    Bench {
        /// A lackey log to measure on (default: capture gzip under Valgrind,
        /// or a synthetic log when that fails).
        log: Option<PathBuf>,
    },
}

/// Runs a trace command; `Err` carries the exit code for bad input (2).
pub fn run(cmd: TraceCommand) -> anyhow::Result<ExitCode> {
    let code = |e: mmulab_trace::TraceError| -> anyhow::Error {
        if e.is_bad_input() {
            anyhow::Error::new(BadInput(e.to_string()))
        } else {
            anyhow::Error::new(e)
        }
    };
    match cmd {
        TraceCommand::Sim {
            trace,
            entries,
            ways,
            policy,
            page_size,
            seed,
            allow_truncated,
            json,
            r2000,
            os,
        } => {
            if r2000 {
                return r2000_sim(&trace, &os, seed, json);
            }
            let ways = if ways.is_empty() {
                vec![None]
            } else {
                ways.iter()
                    .map(|w| mmulab_trace::parse_ways(w))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(code)?
            };
            let policies = policy
                .iter()
                .map(|p| p.trim().parse())
                .collect::<Result<Vec<_>, _>>()
                .map_err(code)?;
            let configs =
                mmulab_trace::grid(&entries, &ways, &policies, page_size, seed).map_err(code)?;
            let read = ReadOptions { allow_truncated };
            // One configuration keeps the one-configuration path and output.
            let rs = match configs.as_slice() {
                [o] => vec![simulate(&trace, o, &read).map_err(code)?],
                _ => mmulab_trace::sweep(&trace, &configs, &read).map_err(code)?,
            };
            for w in rs.first().map_or(&[][..], |r| &r.warnings[..]) {
                eprintln!("warning: {w}");
            }
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
            allow_truncated,
            json,
        } => {
            let r = stack_sim(&trace, page_size, max, &ReadOptions { allow_truncated })
                .map_err(code)?;
            for w in &r.warnings {
                eprintln!("warning: {w}");
            }
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
        TraceCommand::Capture { out, command } => {
            let s = mmulab_trace::capture::capture(&out, &command).map_err(code)?;
            for w in &s.warnings {
                eprintln!("warning: {w}");
            }
            println!("{}", serde_json::to_string_pretty(&s)?);
        }
        TraceCommand::Convert {
            log,
            out,
            page_size,
            allow_truncated,
        } => {
            let shift = mmulab_trace::page_shift(page_size).map_err(code)?;
            let (summary, warning) =
                mmulab_trace::binary::convert_lackey(&log, &out, shift, 0, allow_truncated)
                    .map_err(code)?;
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            println!("{}", serde_json::to_string_pretty(&summary)?);
        }
        TraceCommand::Export {
            trace,
            format,
            page_size,
            allow_truncated,
        } => {
            let format: ExportFormat = format.parse().map_err(code)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let (_, warnings) = export(
                &trace,
                page_size,
                format,
                &ReadOptions { allow_truncated },
                &mut out,
            )
            .map_err(code)?;
            for w in warnings {
                eprintln!("warning: {w}");
            }
        }
        TraceCommand::Bench { log } => {
            let mut o = BenchOptions::default();
            if let Some(p) = log {
                o.workload = Workload::Lackey(p);
            }
            let r = bench(&o).map_err(code)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `trace sim --r2000`: uhlig94's trap-driven R2000 over the trace and its system calls.
fn r2000_sim(trace: &std::path::Path, os: &str, seed: u64, json: bool) -> anyhow::Result<ExitCode> {
    use mmulab_swtlb::os::OsKind as R2000Os;
    use mmulab_swtlb::r2000;
    let os = R2000Os::from_key(os).ok_or_else(|| {
        BadInput(format!(
            "--os {os}: expected ultrix, osf1, mach3, afsin or afsout"
        ))
    })?;
    let o =
        r2000::simulate_trace(trace, os, &r2000::R2000Config::default(), seed).map_err(BadInput)?;
    if json {
        println!("{}", serde_json::to_string(&o)?);
    } else {
        print!("{}", r2000::report_text(&o));
    }
    Ok(ExitCode::SUCCESS)
}

/// A trace the user gave is malformed or truncated: exit status 2.
#[derive(Debug)]
pub struct BadInput(pub String);
impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for BadInput {}
