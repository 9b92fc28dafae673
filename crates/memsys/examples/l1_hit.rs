//! Microbenchmark of the hit fast path (default Table 1 config, 16 cores,
//! directory, UNITD, Jetty and checker on). `cargo run --release -p
//! mmulab-memsys --example l1_hit`.

use mmulab_memsys::{AccessKind, MemConfig, MemSystem};
use std::hint::black_box;
use std::time::Instant;

fn main() {
    for checker in [true, false] {
        run(MemConfig {
            checker,
            ..MemConfig::default()
        });
    }
}

fn run(cfg: MemConfig) {
    println!("checker {}", cfg.checker);
    let mut m = MemSystem::new(&cfg, 1);
    let mut probes = Vec::with_capacity(64);
    let blocks = 256u64;
    for c in 0..16 {
        for b in 0..blocks {
            m.access(
                c,
                (c as u64 * blocks + b) * 64,
                AccessKind::Store,
                &mut probes,
            );
        }
        m.pcam_insert(c, 1, 0, 0x0100_0000 + c as u64 * 8);
    }
    let n = 50_000_000u64;
    for (name, store_every) in [("load hits", 0u64), ("75% load / 25% store hits", 4)] {
        let t = Instant::now();
        let mut lat = 0;
        for i in 0..n {
            let c = (i & 15) as usize;
            let pa = (c as u64 * blocks + (i >> 4) % blocks) * 64 + (i & 7) * 8;
            let kind = if store_every != 0 && i % store_every == 0 {
                AccessKind::Store
            } else {
                AccessKind::Load
            };
            lat += m.access(c, black_box(pa), kind, &mut probes);
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!(
            "{name}: {ns:.2} ns/access (latency sum {lat}, violations {})",
            m.checker_violations()
        );
    }
    assert_eq!(m.checker_violations(), 0);
}
