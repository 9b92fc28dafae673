//! Criterion benches: lackey decoding, binary reading, the Mattson pass and the lock-step
//! sweep, over a trace made at bench time: `gzip -c` of generated text under Valgrind
//! lackey when Valgrind is installed, else a synthetic lackey log (printed first).
//! `MMULAB_BENCH_LACKEY=path` uses an existing lackey log instead.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mmulab_trace::bench::{
    binary_pass, capture_gzip, decode_pass, default_sweep_configs, synthetic_lackey,
};
use mmulab_trace::mattson::stack_pass;
use mmulab_trace::sweep::sweep_refs;
use mmulab_trace::{ReadOptions, binary, load_refs};

fn workload() -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join("mmulab-trace-criterion");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let log = match std::env::var_os("MMULAB_BENCH_LACKEY") {
        Some(p) => PathBuf::from(p),
        None => match capture_gzip(&dir, 64 << 10) {
            Ok(p) => {
                eprintln!(
                    "workload: gzip -c of 64 KiB of text under valgrind lackey ({})",
                    p.display()
                );
                p
            }
            Err(e) => {
                let p = dir.join("synthetic.lackey.log");
                synthetic_lackey(&p, 4_000_000).expect("write synthetic trace");
                eprintln!(
                    "workload: synthetic lackey log, 4 M access lines (gzip capture failed: {e})"
                );
                p
            }
        },
    };
    let bin = dir.join("trace.mmutrace");
    binary::convert_lackey(&log, &bin, 12, 0, false).expect("convert");
    (log, bin)
}

fn benches(c: &mut Criterion) {
    let (log, bin) = workload();
    let text = std::fs::read(&log).expect("read log");
    let (refs, _) = load_refs(&bin, 4096, &ReadOptions::default()).expect("load refs");
    let mut g = c.benchmark_group("trace");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("lackey_decode", |b| {
        b.iter(|| decode_pass(black_box(&text)).expect("decode"))
    });
    g.throughput(Throughput::Elements(refs.len() as u64));
    g.bench_function("binary_read", |b| {
        b.iter(|| binary_pass(black_box(&bin)).expect("read"))
    });
    g.bench_function("mattson_1_to_512", |b| {
        b.iter(|| stack_pass(black_box(&refs), 512).expect("pass"))
    });
    let configs = default_sweep_configs();
    g.throughput(Throughput::Elements(
        refs.len() as u64 * configs.len() as u64,
    ));
    g.bench_function("lockstep_sweep_60_configs", |b| {
        b.iter(|| sweep_refs(black_box(&refs), &configs).expect("sweep"))
    });
    g.finish();
}

criterion_group!(trace, benches);
criterion_main!(trace);
