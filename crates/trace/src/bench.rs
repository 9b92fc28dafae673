//! The speed report behind `mmulab trace bench` and the criterion benches.
//!
//! Each rate is the median of several runs on one core, over a trace held in memory (the
//! lackey text for decoding; the binary trace is read from its file, normally in the page
//! cache), from both the wall clock and the thread's CPU time. The target workload is `gzip -c` of a generated text file traced by lackey at
//! bench time; without Valgrind a synthetic lackey log stands in (the report says which).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::binary::{self, BinaryReader};
use crate::lackey::{LackeyDecoder, PageSplitter};
use crate::mattson::{DEFAULT_MAX_ENTRIES, stack_pass, stack_sim};
use crate::sim::{Policy, SimOptions};
use crate::source::{ReadOptions, load_refs};
use crate::sweep::sweep_refs;
use crate::{PageRef, Result, TraceError};

/// Which trace to measure.
#[derive(Clone, Debug)]
pub enum Workload {
    /// Trace `gzip -c` of a generated text file of this many bytes under lackey.
    Gzip { input_bytes: usize },
    /// An existing lackey log.
    Lackey(PathBuf),
    /// A generated lackey log with this many access lines (no Valgrind needed).
    Synthetic { lines: usize },
}

/// Bench settings.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Default: gzip of 192 KiB of text (a ~250 MB lackey log, ~30 M page references).
    pub workload: Workload,
    /// Runs per measurement; the median is reported. Default 5.
    pub runs: usize,
    /// Where generated files go; default a fresh directory under the system temp dir.
    pub work_dir: Option<PathBuf>,
    /// Fall back to a synthetic trace when Valgrind or gzip cannot run. Default true.
    pub synthetic_fallback: bool,
}

impl Default for BenchOptions {
    fn default() -> BenchOptions {
        BenchOptions {
            workload: Workload::Gzip {
                input_bytes: 192 << 10,
            },
            runs: 5,
            work_dir: None,
            synthetic_fallback: true,
        }
    }
}

/// One measured rate, per run and as the median, from wall-clock time and from the
/// thread's CPU time (the time it actually ran on its core; on a machine shared with
/// other work the two differ by the time slices given to others).
#[derive(Clone, Debug, Serialize)]
pub struct Rate {
    /// Median of `runs` (wall clock).
    pub median: f64,
    pub runs: Vec<f64>,
    /// Median of `cpu_runs` (thread CPU time).
    pub median_cpu: f64,
    pub cpu_runs: Vec<f64>,
    pub unit: &'static str,
    pub target: f64,
    /// Whether `median_cpu` reaches the target: the target is a one-core rate.
    pub meets_target: bool,
}

/// What [`bench`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// What was traced, e.g. `gzip -c (196608-byte text) under valgrind lackey`.
    pub workload: String,
    pub lackey_path: PathBuf,
    pub lackey_bytes: u64,
    pub binary_bytes: u64,
    /// Page references at 4 KiB pages.
    pub refs: u64,
    /// Lackey decoding, accesses split into page references: MB/s of log text.
    pub decode: Rate,
    /// Binary trace reading: million page references per second.
    pub binary_read: Rate,
    /// One Mattson pass for every fully associative LRU size 1..=512: M refs/s.
    pub mattson: Rate,
    /// Lock-step direct simulation of `sweep_configs` configurations: M configuration-refs/s.
    pub sweep: Rate,
    /// For information: the Mattson pass streamed from the binary file (read + decode +
    /// pass on one core): M refs/s. The target applies to the pass itself.
    pub mattson_from_binary_file: Rate,
    pub sweep_configs: usize,
    /// Misses of the 64-entry fully associative LRU TLB (a sanity anchor).
    pub misses_64_full_lru: u64,
}

/// The set-associative configurations of a size × associativity sweep (uhlig94 Fig. 14:
/// 32 to 512 entries, direct-mapped to 8-way), under LRU, FIFO and random. Fully
/// associative LRU sizes come from one Mattson pass instead.
pub fn default_sweep_configs() -> Vec<SimOptions> {
    let mut v = Vec::new();
    for policy in [Policy::Lru, Policy::Fifo, Policy::Random] {
        for entries in [32u32, 64, 128, 256, 512] {
            for ways in [1u32, 2, 4, 8] {
                v.push(SimOptions {
                    entries,
                    ways: Some(ways),
                    policy,
                    page_size: 4096,
                    seed: 1,
                });
            }
        }
    }
    v
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// Work done per run; turned into rates per second.
struct Runs {
    work: f64,
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl Runs {
    fn new(work: f64) -> Runs {
        Runs {
            work,
            wall: Vec::new(),
            cpu: Vec::new(),
        }
    }

    fn time<F: FnMut()>(&mut self, mut f: F) {
        let c = thread_cpu_seconds();
        let t = Instant::now();
        f();
        self.wall.push(self.work / t.elapsed().as_secs_f64() / 1e6);
        self.cpu
            .push(self.work / (thread_cpu_seconds() - c).max(1e-9) / 1e6);
    }

    fn rate(self, unit: &'static str, target: f64) -> Rate {
        let median_cpu = median(&self.cpu);
        Rate {
            median: median(&self.wall),
            runs: self.wall,
            median_cpu,
            cpu_runs: self.cpu,
            unit,
            target,
            meets_target: median_cpu >= target,
        }
    }
}

#[cfg(target_os = "linux")]
fn thread_cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_seconds() -> f64 {
    // No per-thread clock: fall back to the wall clock since an arbitrary origin.
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Deterministic text for gzip to compress (about 4:1).
fn gzip_input(bytes: usize) -> Vec<u8> {
    let words = [
        "translation",
        "lookaside",
        "buffer",
        "shootdown",
        "page",
        "table",
        "entry",
        "miss",
        "the",
        "of",
    ];
    let mut out = Vec::with_capacity(bytes + 64);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut line = 0u64;
    while out.len() < bytes {
        line += 1;
        out.extend_from_slice(format!("{line:6} ").as_bytes());
        for _ in 0..8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(words[(x % words.len() as u64) as usize].as_bytes());
            out.push(b' ');
        }
        out.push(b'\n');
    }
    out.truncate(bytes);
    out
}

/// Traces `gzip -c` of a generated file under lackey; returns the log of the gzip process.
pub fn capture_gzip(dir: &Path, input_bytes: usize) -> Result<PathBuf> {
    let input = dir.join("gzip-input.txt");
    std::fs::write(&input, gzip_input(input_bytes)).map_err(|e| TraceError::io(&input, e))?;
    let log = dir.join("gzip.lackey.log");
    let status = std::process::Command::new("valgrind")
        .args(["--tool=lackey", "--trace-mem=yes", "--trace-syscalls=yes"])
        .arg(format!("--log-file={}", log.display()))
        .args(["--", "gzip", "-c"])
        .arg(&input)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| TraceError::Capture(format!("cannot run valgrind: {e}")))?;
    if !status.success() {
        return Err(TraceError::Capture(format!(
            "valgrind gzip exited with {status}"
        )));
    }
    Ok(log)
}

/// Writes a synthetic lackey log: a loop over a few code pages with stack and heap
/// accesses, shaped like a small compression program.
pub fn synthetic_lackey(path: &Path, lines: usize) -> Result<()> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(|e| TraceError::io(path, e))?;
    let mut w = std::io::BufWriter::new(file);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut pc = 0x0040_1000u64;
    let mut heap = 0x0480_0000u64;
    let io = |e| TraceError::io(path, e);
    writeln!(w, "==1== synthetic lackey log").map_err(io)?;
    for i in 0..lines {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x.is_multiple_of(16) {
            pc = 0x0040_1000 + (x >> 20) % 0x6000;
        }
        let size = 1 + x % 7;
        writeln!(w, "I  {pc:08x},{size}").map_err(io)?;
        pc += size;
        match (x >> 8) % 8 {
            0..=2 => writeln!(w, " L 1ffefff{:03x},8", (x >> 24) % 0xff8).map_err(io)?,
            3 => writeln!(w, " S 1ffefff{:03x},8", (x >> 24) % 0xff8).map_err(io)?,
            4 => {
                heap = 0x0480_0000 + (heap + 64 - 0x0480_0000) % (256 << 12);
                writeln!(w, " L {heap:08x},8").map_err(io)?;
            }
            5 if i.is_multiple_of(3) => {
                writeln!(w, " M {:08x},4", 0x0480_0000 + (x >> 30) % (600 << 12)).map_err(io)?
            }
            _ => {}
        }
    }
    w.flush().map_err(io)
}

/// Decodes `text` in 1 MiB chunks into page references; returns the number of them.
pub fn decode_pass(text: &[u8]) -> Result<u64> {
    let mut d = LackeyDecoder::new("<memory>");
    let mut s = PageSplitter::new(12);
    let mut n = 0u64;
    for chunk in text.chunks(1 << 20) {
        d.feed(chunk, &mut s)?;
        n += s.out.len() as u64;
        s.out.clear();
    }
    d.finish(false)?;
    Ok(n)
}

/// Reads a binary trace block by block; returns the number of page references.
pub fn binary_pass(path: &Path) -> Result<u64> {
    let mut r = BinaryReader::open(path, false)?;
    let mut refs = Vec::with_capacity(1 << 17);
    let mut n = 0u64;
    while r.next_block(&mut refs, None)? {
        n += refs.len() as u64;
        refs.clear();
    }
    Ok(n)
}

/// Measures every rate.
pub fn bench(opts: &BenchOptions) -> Result<BenchReport> {
    let dir = match &opts.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("mmulab-trace-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).map_err(|e| TraceError::io(&dir, e))?;
    let (workload, log) = match &opts.workload {
        Workload::Lackey(p) => (format!("lackey log {}", p.display()), p.clone()),
        Workload::Synthetic { lines } => {
            let p = dir.join("synthetic.lackey.log");
            synthetic_lackey(&p, *lines)?;
            (format!("synthetic lackey log ({lines} access lines)"), p)
        }
        Workload::Gzip { input_bytes } => match capture_gzip(&dir, *input_bytes) {
            Ok(p) => (
                format!("gzip -c ({input_bytes}-byte generated text) under valgrind lackey"),
                p,
            ),
            Err(e) if opts.synthetic_fallback => {
                let p = dir.join("synthetic.lackey.log");
                let lines = 16_000_000;
                synthetic_lackey(&p, lines)?;
                (
                    format!(
                        "synthetic lackey log ({lines} access lines; gzip capture failed: {e})"
                    ),
                    p,
                )
            }
            Err(e) => return Err(e),
        },
    };
    let runs = opts.runs.max(1);
    let text = std::fs::read(&log).map_err(|e| TraceError::io(&log, e))?;
    let bin = dir.join("trace.mmutrace");
    let (summary, _) = binary::convert_lackey(&log, &bin, 12, 0, false)?;
    let (refs, _): (Vec<PageRef>, _) = load_refs(&bin, 4096, &ReadOptions::default())?;
    let nrefs = refs.len() as u64;

    let mut decode = Runs::new(text.len() as f64);
    for _ in 0..runs {
        decode.time(|| assert_eq!(decode_pass(&text).expect("decoded once already"), nrefs));
    }
    let mut read = Runs::new(nrefs as f64);
    for _ in 0..runs {
        read.time(|| assert_eq!(binary_pass(&bin).expect("read once already"), nrefs));
    }
    let mut mattson = Runs::new(nrefs as f64);
    let mut misses_64 = 0;
    for _ in 0..runs {
        mattson.time(|| {
            misses_64 = stack_pass(&refs, DEFAULT_MAX_ENTRIES)
                .expect("valid depth")
                .misses_at(64)
        });
    }
    let mut streamed = Runs::new(nrefs as f64);
    for _ in 0..runs {
        streamed.time(|| {
            let r = stack_sim(&bin, 4096, DEFAULT_MAX_ENTRIES, &ReadOptions::default())
                .expect("read once already");
            assert_eq!(r.misses_at(64), misses_64);
        });
    }
    let configs = default_sweep_configs();
    let mut sweep = Runs::new(nrefs as f64 * configs.len() as f64);
    for _ in 0..runs {
        sweep.time(|| {
            sweep_refs(&refs, &configs).expect("valid configs");
        });
    }
    if opts.work_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(BenchReport {
        workload,
        lackey_path: log,
        lackey_bytes: text.len() as u64,
        binary_bytes: summary.bytes,
        refs: nrefs,
        decode: decode.rate("MB/s", 500.0),
        binary_read: read.rate("M refs/s", 300.0),
        mattson: mattson.rate("M refs/s", 200.0),
        sweep: sweep.rate("M configuration-refs/s", 200.0),
        mattson_from_binary_file: streamed.rate("M refs/s", 0.0),
        sweep_configs: configs.len(),
        misses_64_full_lru: misses_64,
    })
}
