//! Microbenchmark of the miss path (default Table 1 config, 16 cores,
//! directory, UNITD, Jetty and checker on): each core streams through its
//! own 1 MiB region, so almost every access misses its L1 and most miss the
//! 4 MiB L2 (the `unitd` bench workload's pattern). `cargo run --release
//! -p mmulab-memsys --example l1_miss`.

use mmulab_memsys::{AccessKind, MemConfig, MemSystem};
use std::hint::black_box;
use std::time::Instant;

/// This thread's user + system CPU time in seconds (Linux; 0 elsewhere),
/// steadier than wall time on a shared host.
fn cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/thread-self/stat") else {
        return 0.0;
    };
    // fields after the parenthesised command name; utime and stime are 14, 15
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn main() {
    let cfg = MemConfig::default();
    let mut m = MemSystem::new(&cfg, 1);
    let mut probes = Vec::with_capacity(64);
    let region = 1u64 << 20;
    for c in 0..16 {
        m.pcam_insert(c, 1, 0, 0x0100_0000 + c as u64 * 8);
    }
    let n = 20_000_000u64;
    for (name, store_every) in [("load misses", 0u64), ("75% load / 25% store misses", 4)] {
        let t = Instant::now();
        let c0 = cpu_s();
        let mut lat = 0;
        for i in 0..n {
            let c = (i & 15) as usize;
            let off = ((i >> 4) * 64) % region;
            let pa = c as u64 * region + off;
            let kind = if store_every != 0 && i % store_every == 0 {
                AccessKind::Store
            } else {
                AccessKind::Load
            };
            lat += m.access(c, black_box(pa), kind, &mut probes);
            probes.clear();
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        let cpu_ns = (cpu_s() - c0) * 1e9 / n as f64;
        let s = m.stats();
        println!(
            "{name}: {ns:.2} ns/access wall, {cpu_ns:.1} ns/access CPU (latency sum {lat}, L1D misses {}, L2 misses {}, violations {})",
            s.l1d_misses,
            s.l2_misses,
            m.checker_violations()
        );
    }
    assert_eq!(m.checker_violations(), 0);
}
