//! A diagnostic of fleisch89's Fig. 8 model (docs/papers/fleisch89.md,
//! "Fig. 8's range 120..=600"); not part of the reproduction and judges
//! nothing. It runs §8's two 10 s read-writers with the reproduction's
//! setup (library beside process 1, process 2 started 0.5 s later, seed 0).
//!
//! `sweep [Δ ...]`: throughput and run length at each Δ (default: every 30
//! ticks from 60 to 900). `trace Δ`: the protocol events of one run.

use mmulab_mirage::runs::{ReadWritersSetup, read_writers};
use mmulab_mirage::sim::{Preset, Sim, workload::Program};

const LOOP_S: f64 = 10.0;
const STAGGER_S: f64 = 0.5;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let p = Preset::vax_locus_1989();
    let delta = |s: &String| s.parse::<u32>().map_err(|e| format!("Δ {s:?}: {e}"));
    match args.first().map(String::as_str) {
        Some("trace") => {
            let d = delta(args.get(1).ok_or("trace needs a Δ")?)?;
            trace(&p, d)
        }
        Some("sweep") | None => {
            let deltas = if args.len() > 1 {
                args[1..].iter().map(delta).collect::<Result<Vec<_>, _>>()?
            } else {
                (60..=900).step_by(30).collect()
            };
            let setup = ReadWritersSetup {
                third_site_library: false,
                stagger_s: STAGGER_S,
            };
            let instructions = 2.0 * (LOOP_S * 1e9 / p.loop_iteration_ns as f64).floor();
            println!("delta_ticks,instr_per_s,run_s");
            for d in deltas {
                let r = read_writers(&p, d, LOOP_S, &setup, 0)?;
                println!("{d},{r:.0},{:.2}", instructions / r);
            }
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}: sweep or trace")),
    }
}

fn trace(p: &Preset, d: u32) -> Result<(), String> {
    let mut sim = Sim::new(p.clone(), 2, Sim::core_config(p));
    sim.trace = Some(Vec::new());
    sim.create_segment(0, 1, d, &[0, 1]);
    let iterations = (LOOP_S * 1e9 / p.loop_iteration_ns as f64) as u64;
    sim.spawn(0, Program::counter(0, iterations), 0);
    sim.spawn(1, Program::counter(1, iterations), (STAGGER_S * 1e9) as u64);
    sim.run(u64::MAX / 4)?;
    let shown = [
        "fault",
        "sleeps",
        "install",
        "downgrade",
        "invalidate",
        "upgrade",
        "detach",
    ];
    for (ns, site, text) in sim.trace.as_deref().unwrap_or_default() {
        if shown.iter().any(|k| text.contains(k)) {
            println!("{:9.3} s  site {site}  {text}", *ns as f64 / 1e9);
        }
    }
    Ok(())
}
