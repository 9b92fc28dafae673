//! A stand-in for `mmulab host shootdown` until the binary wires it in:
//!
//! ```text
//! cargo run --release -p mmulab-host --example host_shootdown -- \
//!     [--threads LIST|RANGE] [--op mprotect|munmap|madvise] [--pages N] [--reps N] [--json] [--calibration]
//! ```
//!
//! Progress goes to stderr; the table (or the JSON object) to stdout.

use mmulab_host::{
    Op, Progress, ShootdownOptions, format_report, parse_thread_list, preset_components,
    run_shootdown,
};

fn main() {
    let mut opts = ShootdownOptions::default();
    let (mut json, mut calibration) = (false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--threads" => {
                opts.threads = parse_thread_list(&value()).unwrap_or_else(|e| fail(&e.to_string()))
            }
            "--op" => {
                opts.op = value()
                    .parse::<Op>()
                    .unwrap_or_else(|e| fail(&e.to_string()))
            }
            "--pages" => {
                opts.pages = value()
                    .parse()
                    .unwrap_or_else(|_| fail("--pages needs a number"))
            }
            "--reps" => {
                opts.reps = value()
                    .parse()
                    .unwrap_or_else(|_| fail("--reps needs a number"))
            }
            "--json" => json = true,
            "--calibration" => calibration = true,
            other => fail(&format!("unknown argument {other:?}")),
        }
    }
    let report = run_shootdown(&opts, &mut |p| match p {
        // The table prints the notes itself; JSON keeps them in `notes`.
        Progress::Note(n) if json => eprintln!("note: {n}"),
        Progress::Point { threads, op, reps } => {
            eprintln!("measuring {op} with {threads} responder(s), {reps} reps")
        }
        _ => {}
    })
    .unwrap_or_else(|e| fail(&e.to_string()));
    if calibration {
        print!("{}", preset_components(&report).to_toml());
    } else if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", format_report(&report));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(2)
}
