//! A stand-in for the `mmulab trace` subcommands, for trying the library before the CLI
//! wires it (`cargo run --release -p mmulab-trace --example trace_tool -- ...`):
//!
//! ```text
//! trace_tool sim TRACE [--entries N] [--ways W] [--policy lru|fifo|random] [--page-size B]
//!                      [--seed S] [--allow-truncated] [--json]
//! trace_tool stack TRACE [--max N] [--page-size B]          # Mattson: misses for 1..=N
//! trace_tool capture [-o FILE] -- CMD...
//! trace_tool convert LACKEY_LOG -o FILE                     # lackey -> binary
//! trace_tool export TRACE [--format xdin|din] [--page-size B]
//! trace_tool bench [LACKEY_LOG | --synthetic LINES]
//! ```
//! Bad input exits 2, like the real CLI.

use std::path::PathBuf;
use std::process::exit;

use mmulab_trace::bench::{BenchOptions, Workload, bench};
use mmulab_trace::export::{ExportFormat, export};
use mmulab_trace::{ReadOptions, SimOptions, TraceError, simulate, stack_sim};

fn fail(e: TraceError) -> ! {
    eprintln!("error: {e}");
    exit(if e.is_bad_input() { 2 } else { 1 })
}

fn value(args: &[String], flag: &str) -> Option<String> {
    args.iter().position(|a| a == flag).map(|i| {
        args.get(i + 1)
            .cloned()
            .unwrap_or_else(|| panic!("{flag} needs a value"))
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sub = args.first().map(String::as_str).unwrap_or("");
    let read = ReadOptions {
        allow_truncated: args.iter().any(|a| a == "--allow-truncated"),
    };
    let page_size = value(&args, "--page-size").map_or(4096, |v| v.parse().expect("a page size"));
    match sub {
        "sim" => {
            let mut o = SimOptions {
                page_size,
                ..SimOptions::default()
            };
            if let Some(v) = value(&args, "--entries") {
                o.entries = v.parse().expect("entries");
            }
            o.ways = value(&args, "--ways").map(|v| v.parse().expect("ways"));
            if let Some(v) = value(&args, "--policy") {
                o.policy = v.parse().unwrap_or_else(|e| fail(e));
            }
            if let Some(v) = value(&args, "--seed") {
                o.seed = v.parse().expect("seed");
            }
            let r = simulate(&PathBuf::from(&args[1]), &o, &read).unwrap_or_else(|e| fail(e));
            for w in &r.warnings {
                eprintln!("warning: {w}");
            }
            if args.iter().any(|a| a == "--json") {
                println!("{}", serde_json::to_string(&r).expect("serializable"));
            } else {
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
        "stack" => {
            let max = value(&args, "--max").map_or(512, |v| v.parse().expect("max"));
            let r = stack_sim(&PathBuf::from(&args[1]), page_size, max, &read)
                .unwrap_or_else(|e| fail(e));
            for w in &r.warnings {
                eprintln!("warning: {w}");
            }
            println!("entries\tmisses");
            for n in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
                .into_iter()
                .filter(|&n| n <= max)
            {
                println!("{n}\t{}", r.misses_at(n));
            }
        }
        "capture" => {
            let out = value(&args, "-o").unwrap_or_else(|| "trace.mmutrace".into());
            let dash = args.iter().position(|a| a == "--").expect("-- CMD");
            let s = mmulab_trace::capture::capture(&PathBuf::from(out), &args[dash + 1..])
                .unwrap_or_else(|e| fail(e));
            for w in &s.warnings {
                eprintln!("warning: {w}");
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&s).expect("serializable")
            );
        }
        "convert" => {
            let out = value(&args, "-o").expect("-o FILE");
            let shift = mmulab_trace::page_shift(page_size).unwrap_or_else(|e| fail(e));
            let (s, w) = mmulab_trace::binary::convert_lackey(
                &PathBuf::from(&args[1]),
                &PathBuf::from(out),
                shift,
                0,
                read.allow_truncated,
            )
            .unwrap_or_else(|e| fail(e));
            if let Some(w) = w {
                eprintln!("warning: {w}");
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&s).expect("serializable")
            );
        }
        "export" => {
            let format: ExportFormat = value(&args, "--format")
                .map_or(Ok(ExportFormat::Xdin), |v| v.parse())
                .unwrap_or_else(|e| fail(e));
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let (_, warnings) =
                export(&PathBuf::from(&args[1]), page_size, format, &read, &mut out)
                    .unwrap_or_else(|e| fail(e));
            for w in warnings {
                eprintln!("warning: {w}");
            }
        }
        "bench" => {
            let mut o = BenchOptions::default();
            match &args[1..] {
                [] => {}
                [flag, n] if flag == "--synthetic" => {
                    o.workload = Workload::Synthetic {
                        lines: n.parse().expect("lines"),
                    }
                }
                [path] => o.workload = Workload::Lackey(path.into()),
                _ => panic!("bench [LACKEY_LOG | --synthetic LINES]"),
            }
            let r = bench(&o).unwrap_or_else(|e| fail(e));
            println!(
                "{}",
                serde_json::to_string_pretty(&r).expect("serializable")
            );
        }
        _ => {
            eprintln!(
                "usage: trace_tool sim|stack|capture|convert|export|bench ... (see the source)"
            );
            exit(2);
        }
    }
}
